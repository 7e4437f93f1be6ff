//! The event store: one append-only, fenced log per execution.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use protocol::materialize::Materializer;
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant};

use crate::error::StoreError;

/// An event together with its JSON encoding, serialized once and shared by every reader.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub event: RuntimeEvent,
    pub json: Bytes,
}

impl EventRecord {
    /// Serializes `event`.
    pub fn new(event: RuntimeEvent) -> Self {
        let json = Bytes::from(event.to_json());
        Self { event, json }
    }

    /// Decodes a stored record; `None` when the bytes are not an event.
    pub fn decode(json: Bytes) -> Option<Self> {
        let event = serde_json::from_slice(&json).ok()?;
        Some(Self { event, json })
    }

    pub fn sequence(&self) -> Sequence {
        self.event.sequence
    }
}

/// Identifies one writer of a log, so that a store can tell a writer's own retried append
/// (which must succeed) from another writer's append of the same sequence (which must fence
/// it), even when both events serialize to identical bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriterId(pub u64);

impl WriterId {
    /// A fresh random writer id.
    pub fn random() -> Self {
        let (high, low) = uuid::Uuid::new_v4().as_u64_pair();
        Self(high ^ low)
    }
}

impl std::fmt::Display for WriterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The last event of a log: what a writer needs to continue it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHead {
    pub last_sequence: Sequence,
    pub terminal: bool,
    pub last_time: protocol::Timestamp,
}

/// Events of one execution with sequence greater than a cursor: replay, then live, ending right
/// after the terminal event. An `Err` item ends the stream.
pub type EventStream = BoxStream<'static, Result<Arc<EventRecord>, StoreError>>;

/// Append-only per-execution logs.
///
/// Contract (checked by `contract::event_store_suite`):
/// - `create_owned` stores `execution.accepted` (sequence 1) as the first event of a new log,
///   owned by a tenant; it fails with `AlreadyExists` if the log exists (and never changes the
///   existing log's owner). `create` is `create_owned` for the default tenant. Admission and capacity limits apply here only:
///   `AdmissionFull` when too many executions are active, `CapacityExhausted` when nothing can
///   be evicted.
/// - `append` is compare-and-set: it succeeds only if `event.sequence` is exactly the log's last
///   sequence + 1 and the event obeys the log rules; otherwise `Conflict` (another writer won:
///   re-read and re-evaluate) or `Violation`. Once `append` returns `Ok`, every later read and
///   subscription sees the event (acknowledged appends are never lost while retained).
///   Non-terminal appends beyond the per-execution limits fail with `ExecutionLimit`; the
///   terminal event is always admitted so the writer can close the log.
/// - `read` returns events with sequence > `after`, in order, at most `limit` of them.
/// - `subscribe` streams every event with sequence > `after` exactly once and in order, then
///   follows live appends, and ends after the terminal event. A cursor at or past the terminal
///   event yields an empty stream. A consumer that stops polling never makes the store buffer
///   more on its behalf (readers pull from the log).
/// - `owner` returns the tenant the log was created for; a log stored without an owner (before
///   executions had owners) belongs to the default tenant. `owned_state` is `state` together
///   with `owner`, in one read where the backend can.
/// - `state`/`read`/`subscribe`/`owner`/`owned_state` return `Ok(None)` for an unknown
///   execution.
/// - Retention: a terminal execution may be dropped after the retention period or evicted
///   (oldest terminal first) when capacity is needed; active executions are never evicted.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Creates the log with its `execution.accepted` event, owned by the default tenant.
    async fn create(&self, accepted: RuntimeEvent) -> Result<(), StoreError> {
        self.create_owned(accepted, &Tenant::default()).await
    }

    /// Creates the log with its `execution.accepted` event, owned by `owner`.
    async fn create_owned(&self, accepted: RuntimeEvent, owner: &Tenant) -> Result<(), StoreError>;

    /// The tenant that owns the execution, or `None` for an unknown execution.
    async fn owner(&self, id: ExecutionId) -> Result<Option<Tenant>, StoreError>;

    /// [`EventStore::state`] and [`EventStore::owner`] together. The default makes two reads;
    /// implementations that see the owner while reading the log override it.
    async fn owned_state(
        &self,
        id: ExecutionId,
    ) -> Result<Option<(Materializer, Tenant)>, StoreError> {
        let Some(state) = self.state(id).await? else {
            return Ok(None);
        };
        Ok(self.owner(id).await?.map(|owner| (state, owner)))
    }

    /// Appends the next event, fenced on its sequence, as a one-off writer.
    async fn append(&self, event: RuntimeEvent) -> Result<(), StoreError> {
        self.append_as(event, WriterId::random()).await
    }

    /// Appends the next event for `writer`. Retrying the same event with the same writer after
    /// an unknown outcome (a lost acknowledgement) succeeds if the first attempt landed; any
    /// other writer of that sequence gets `Conflict`.
    async fn append_as(&self, event: RuntimeEvent, writer: WriterId) -> Result<(), StoreError>;

    /// The materialized state of an execution.
    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError>;

    /// The last event's sequence, terminality and time, or `None` for an unknown execution.
    /// Implementations with a cheaper way than materializing override it.
    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Ok(self.state(id).await?.map(|m| LogHead {
            last_sequence: m.last_sequence(),
            terminal: m.is_terminal(),
            last_time: m.snapshot().updated_at,
        }))
    }

    /// Up to `limit` events after `after`.
    async fn read(
        &self,
        id: ExecutionId,
        after: Sequence,
        limit: usize,
    ) -> Result<Option<Vec<Arc<EventRecord>>>, StoreError>;

    /// Replay after `after`, then live, ending after the terminal event.
    async fn subscribe(
        &self,
        id: ExecutionId,
        after: Sequence,
    ) -> Result<Option<EventStream>, StoreError>;

    /// Whether the backend is reachable and writable.
    async fn ready(&self) -> Result<(), StoreError>;
}
