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
        let json = Bytes::from(event.to_json_vec());
        Self { event, json }
    }

    /// Decodes a stored record; `None` when the bytes are not an event.
    ///
    /// The bytes are checked as UTF-8 once, then read as text: read as bytes, serde_json
    /// checks each string apart (an event's type, status, id, time and text), which took a
    /// third of a token delta's decoding. Bytes that are not UTF-8 are refused either way.
    pub fn decode(json: Bytes) -> Option<Self> {
        let event = serde_json::from_str(std::str::from_utf8(&json).ok()?).ok()?;
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

impl LogHead {
    /// The head of the log `state` was materialized from.
    pub fn of(state: &Materializer) -> Self {
        Self {
            last_sequence: state.last_sequence(),
            terminal: state.is_terminal(),
            last_time: state.snapshot().updated_at,
        }
    }
}

/// Why [`EventStore::append_run_as`] stopped: the error, and how many leading events of the run
/// were stored (acknowledged) before it. An event whose outcome is unknown (a lost
/// acknowledgement) is not counted: retrying the rest with the same writer is safe.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error} ({stored} events of the run stored)")]
pub struct RunError {
    pub stored: usize,
    pub error: StoreError,
}

/// Checks that `run` can be appended as one run on its own terms (whatever the log holds): one
/// execution, consecutive sequences, each event valid, a terminal event only at the end.
pub fn check_run(run: &[EventRecord]) -> Result<(), protocol::materialize::LogViolation> {
    use protocol::materialize::LogViolation;
    let Some(first) = run.first() else {
        return Ok(());
    };
    for (i, record) in run.iter().enumerate() {
        let event = &record.event;
        if event.execution_id != first.event.execution_id {
            return Err(LogViolation::WrongExecution);
        }
        let expected = Sequence(first.sequence().get().saturating_add(i as u64));
        if event.sequence != expected {
            return Err(LogViolation::OutOfOrder {
                expected,
                got: event.sequence,
            });
        }
        if i > 0 && run[i - 1].event.is_terminal() {
            return Err(LogViolation::AfterTerminal);
        }
        protocol::materialize::check_event(event)?;
    }
    Ok(())
}

/// [`EventStore::append_run_as`] the default way: checks `run`, then hands its events to
/// `append` one by one, in order, stopping at the first error (with how many were stored).
pub(crate) async fn append_one_by_one<F, Fut>(
    run: &[EventRecord],
    mut append: F,
) -> Result<(), RunError>
where
    F: FnMut(RuntimeEvent) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>>,
{
    check_run(run).map_err(|e| RunError {
        stored: 0,
        error: e.into(),
    })?;
    for (stored, record) in run.iter().enumerate() {
        append(record.event.clone())
            .await
            .map_err(|error| RunError { stored, error })?;
    }
    Ok(())
}

/// Events of one execution with sequence greater than a cursor: replay, then live, ending right
/// after the terminal event. An `Err` item ends the stream.
pub type EventStream = BoxStream<'static, Result<Arc<EventRecord>, StoreError>>;

/// What [`EventStore::read`] returns: the records, or `None` for an unknown execution.
pub type ReadResult = Result<Option<Vec<Arc<EventRecord>>>, StoreError>;

/// What [`EventStore::subscribe`] returns: the stream, or `None` for an unknown execution.
pub type SubscribeResult = Result<Option<EventStream>, StoreError>;

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
/// - `append_run_as` appends a contiguous run (`run[0]` at the log's last sequence + 1, each
///   event the next) with the same rules as appending its events one by one, in order, as one
///   writer: on `Err`, exactly the events `run[..stored]` were stored (a store may store a run
///   as one unit; JetStream does, one message per run up to its message size), so the writer
///   continues from there. Retrying the unstored rest with the same writer after an unknown
///   outcome succeeds if it had landed; a run of another writer gets `Conflict`. Limits apply
///   per event: the run stops at the first event beyond them (`ExecutionLimit`), and a
///   terminal event is always admitted. Readers see the events of a run exactly as if they had
///   been appended one by one (cursors may fall inside a run).
/// - `read` returns events with sequence > `after`, in order, at most `limit` of them.
/// - `subscribe` streams every event with sequence > `after` exactly once and in order, then
///   follows live appends, and ends after the terminal event. A cursor at or past the terminal
///   event yields an empty stream. A consumer that stops polling never makes the store buffer
///   more on its behalf (readers pull from the log).
/// - `owner` returns the tenant the log was created for; a log stored without an owner (before
///   executions had owners) belongs to the default tenant. `owned_state` is `state` together
///   with `owner`, and `owned_subscribe` is `subscribe` together with `owner`, each in one read
///   where the backend can.
/// - `head` answers the log's last event; on a replicated store it may come from a replica
///   behind the leader (older than an acknowledged append, or `None` for a log just created).
///   `latest_head` never does.
/// - `state`/`read`/`subscribe`/`owner`/`owned_state`/`owned_subscribe` return `Ok(None)` for
///   an unknown execution.
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

    /// Creates the log already closed: `accepted` (sequence 1) and the terminal event
    /// `terminal` (sequence 2), owned by `owner`. Stores whose writes can have an unknown
    /// outcome (JetStream) write both as one unit, so no reader or writer ever finds this log
    /// open (a worker holding the execution's job finds it terminal and drops the job).
    /// `AlreadyExists` when the log has events. The default creates, then appends: two writes,
    /// enough for stores whose writes always answer (the memory store).
    async fn create_closed(
        &self,
        accepted: RuntimeEvent,
        terminal: RuntimeEvent,
        owner: &Tenant,
    ) -> Result<(), StoreError> {
        self.create_owned(accepted, owner).await?;
        self.append(terminal).await
    }

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

    /// Appends the contiguous run `run` for `writer` (see the contract above). The default
    /// appends the events one by one with [`EventStore::append_as`]: a run is then not one
    /// unit, but with a single writer nothing can come between its events, and `stored` says
    /// exactly where it stopped. Stores with a cheaper way (one message for the run) override
    /// it.
    async fn append_run_as(&self, run: &[EventRecord], writer: WriterId) -> Result<(), RunError> {
        append_one_by_one(run, |event| self.append_as(event, writer)).await
    }

    /// Whether appends take a round trip worth overlapping: the [`crate::EventWriter`] then
    /// pipelines (events handed in while an append is in flight go in the next run). Stores
    /// whose appends complete at once (memory) say no, and the writer appends inline.
    fn pipelines_appends(&self) -> bool {
        false
    }

    /// The materialized state of an execution.
    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError>;

    /// The last event's sequence, terminality and time, or `None` for an unknown execution.
    /// Implementations with a cheaper way than materializing override it.
    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Ok(self.state(id).await?.as_ref().map(LogHead::of))
    }

    /// [`EventStore::head`] as of the latest acknowledged append: never older than an append
    /// acknowledged before the call, also where `head` may answer from a copy of the log that
    /// is behind (a replica that has not applied the leader's latest appends, which a
    /// replicated store's cheap read may reach). For a decision that an older head would turn
    /// wrong, such as taking a log's silence for its writer's end. The default is `head`
    /// (stores with one copy); replicated stores ask the copy that acknowledges appends.
    async fn latest_head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        self.head(id).await
    }

    /// [`EventStore::head`] of each of `ids`, in the same order: one answer for many logs
    /// (the deadline sweeper checks executions by the hundred). An error means none was
    /// answered. The default asks [`EventStore::head`] for each in turn; stores that can read
    /// many heads in one round trip override it.
    async fn heads(&self, ids: &[ExecutionId]) -> Result<Vec<Option<LogHead>>, StoreError> {
        let mut heads = Vec::with_capacity(ids.len());
        for &id in ids {
            heads.push(self.head(id).await?);
        }
        Ok(heads)
    }

    /// Up to `limit` events after `after`.
    async fn read(&self, id: ExecutionId, after: Sequence, limit: usize) -> ReadResult;

    /// Replay after `after`, then live, ending after the terminal event.
    async fn subscribe(&self, id: ExecutionId, after: Sequence) -> SubscribeResult;

    /// [`EventStore::subscribe`] and [`EventStore::owner`] together (`None`: unknown
    /// execution). The default makes two reads; implementations that see the owner while
    /// reading the log override it. The subscription exists before the caller checks the
    /// owner: a caller that refuses it drops it, which changes nothing.
    async fn owned_subscribe(
        &self,
        id: ExecutionId,
        after: Sequence,
    ) -> Result<Option<(Tenant, EventStream)>, StoreError> {
        let Some(owner) = self.owner(id).await? else {
            return Ok(None);
        };
        Ok(self
            .subscribe(id, after)
            .await?
            .map(|stream| (owner, stream)))
    }

    /// Whether the backend is reachable and writable.
    async fn ready(&self) -> Result<(), StoreError>;
}
