//! The per-execution event writer: the only place sequences and event times are assigned.
//!
//! Every event of every log goes through an [`EventWriter`]: the worker's runner (routing,
//! output, the terminal event) and the gateway's submission flow (`execution.accepted`, the
//! failure that closes an execution whose job could not be queued, the cancellation of a queued
//! execution). Sequences are the last one plus one; event times are the wall clock but never
//! earlier than the previous event's, so a log's times never go backwards even if the clock
//! does. The one time a writer does not pick is the acceptance time: the submission chooses it
//! once, because the job and the idempotency record carry it too (and a healed log must repeat
//! it).
//!
//! Appends are compare-and-set on the sequence, so a writer that lost its claim (a zombie
//! worker, or a gateway cancel that won the race for sequence 2) is fenced and stops. Transient
//! store failures are retried with bounded backoff by [`EventWriter::append`]; a retried append
//! is safe because stores de-duplicate on `{execution_id}:{sequence}`. Request paths that must
//! answer promptly use [`EventWriter::append_once`] and get the store's error as it is.

use std::sync::Arc;
use std::time::Duration;

use protocol::event::EventBody;
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant, Timestamp};

use crate::error::StoreError;
use crate::event_store::{EventStore, WriterId};

/// The acceptance time of a new execution: the time of its `execution.accepted` event. The
/// submission takes it before the log exists because the job and the idempotency record carry
/// it too; it is then passed to [`EventWriter::create`].
pub fn acceptance_time() -> Timestamp {
    Timestamp::now()
}

/// Why an append did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// Another writer appended first; this writer must stop without writing more.
    #[error("fenced by another writer")]
    Fenced,
    /// The execution reached its per-execution event or byte limit [R 84].
    #[error("execution log limit reached")]
    Limit,
    /// The store failed (after retries) or refused the event.
    #[error("store failed: {0}")]
    Store(StoreError),
}

/// Attempts for a transiently failing append, with exponential backoff from 50 ms (about 25 s
/// in all), so a short backend blip does not fail executions.
const MAX_TRIES: u32 = 10;

/// See the module docs.
pub struct EventWriter {
    store: Arc<dyn EventStore>,
    /// Identifies this writer's appends, so its own retries are recognised after a lost ack.
    writer_id: WriterId,
    id: ExecutionId,
    last: Sequence,
    last_time: Timestamp,
    output_exposed: bool,
    /// `mrt_event_append_duration_seconds`, resolved once per writer (a registry lookup per
    /// append would cost more than a memory append).
    append_duration: metrics::Histogram,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("id", &self.id)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl EventWriter {
    /// Creates the log of a new execution, owned by `owner`, with `execution.accepted`
    /// (sequence 1) at `accepted_at`, and returns the writer that continues it. Store errors are returned as
    /// they are (`AlreadyExists` when the log exists): creation is never retried here, the
    /// submitter decides.
    pub async fn create(
        store: Arc<dyn EventStore>,
        id: ExecutionId,
        accepted_at: Timestamp,
        owner: &Tenant,
    ) -> Result<Self, StoreError> {
        let accepted = RuntimeEvent::new(id, Sequence(1), accepted_at, EventBody::Accepted);
        store.create_owned(accepted, owner).await?;
        Ok(Self::resume(store, id, Sequence(1), accepted_at))
    }

    /// A writer continuing a log whose last event is `last`.
    pub fn resume(
        store: Arc<dyn EventStore>,
        id: ExecutionId,
        last: Sequence,
        last_time: Timestamp,
    ) -> Self {
        Self {
            store,
            writer_id: WriterId::random(),
            id,
            last,
            last_time,
            output_exposed: false,
            append_duration: metrics::histogram!(telemetry::metric::EVENT_APPEND_DURATION_SECONDS),
        }
    }

    pub fn execution_id(&self) -> ExecutionId {
        self.id
    }

    pub fn last_sequence(&self) -> Sequence {
        self.last
    }

    /// Whether an output event was written by this writer [R 31].
    pub fn output_exposed(&self) -> bool {
        self.output_exposed
    }

    /// The next event: sequence and time are assigned here and nowhere else.
    fn next_event(&self, body: EventBody) -> RuntimeEvent {
        // Event times never go backwards, even if the wall clock does.
        let now = Timestamp::now().max(self.last_time);
        RuntimeEvent::new(self.id, self.last.next(), now, body)
    }

    fn appended(&mut self, event: &RuntimeEvent) {
        self.last = event.sequence;
        self.last_time = event.time;
        self.output_exposed |= event.body.exposes_output();
    }

    /// Appends `body` as the next event in one attempt, for request paths that answer at once.
    /// The store's error is returned unchanged (`Conflict` when another writer appended first).
    pub async fn append_once(&mut self, body: EventBody) -> Result<(), StoreError> {
        let event = self.next_event(body);
        self.store.append_as(event.clone(), self.writer_id).await?;
        self.appended(&event);
        Ok(())
    }

    /// Appends `body` as the next event, retrying transient store failures.
    pub async fn append(&mut self, body: EventBody) -> Result<(), WriteError> {
        let event = self.next_event(body);
        let mut delay = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            tries += 1;
            let started = std::time::Instant::now();
            match self.store.append_as(event.clone(), self.writer_id).await {
                Ok(()) => {
                    self.append_duration.record(started.elapsed().as_secs_f64());
                    break;
                }
                Err(StoreError::Conflict { .. }) => return Err(WriteError::Fenced),
                Err(StoreError::ExecutionLimit) => return Err(WriteError::Limit),
                Err(e @ (StoreError::Unavailable(_) | StoreError::Closed)) if tries < MAX_TRIES => {
                    tracing::warn!(execution_id = %self.id, error = %e, "append failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(WriteError::Store(e)),
            }
        }
        self.appended(&event);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MemoryEventStore, MemoryLimits};

    fn store() -> Arc<dyn EventStore> {
        Arc::new(MemoryEventStore::new(MemoryLimits::default()))
    }

    fn progress() -> EventBody {
        EventBody::Progress {
            phase: protocol::event::ProgressPhase::Processing,
            progress: None,
        }
    }

    #[tokio::test]
    async fn create_writes_accepted_as_sequence_one_at_the_acceptance_time() {
        let store = store();
        let id = ExecutionId::new_random();
        let accepted_at = Timestamp::from_unix_millis(1_767_225_600_000);
        let writer = EventWriter::create(Arc::clone(&store), id, accepted_at, &Tenant::default())
            .await
            .unwrap();
        assert_eq!(writer.last_sequence(), Sequence(1));
        let head = store.head(id).await.unwrap().unwrap();
        assert_eq!(head.last_sequence, Sequence(1));
        assert_eq!(head.last_time, accepted_at);
        let again = EventWriter::create(store, id, accepted_at, &Tenant::default()).await;
        assert!(matches!(again, Err(StoreError::AlreadyExists)), "{again:?}");
    }

    #[tokio::test]
    async fn appends_take_the_next_sequence_and_never_go_back_in_time() {
        let store = store();
        let id = ExecutionId::new_random();
        // An acceptance time in the future: later events must not be earlier than it.
        let future = Timestamp::from_unix_millis(Timestamp::now().unix_millis() + 3_600_000);
        let mut writer = EventWriter::create(Arc::clone(&store), id, future, &Tenant::default())
            .await
            .unwrap();
        writer.append(progress()).await.unwrap();
        writer.append_once(progress()).await.unwrap();
        assert_eq!(writer.last_sequence(), Sequence(3));
        let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
        let sequences: Vec<u64> = events.iter().map(|e| e.sequence().get()).collect();
        assert_eq!(sequences, [1, 2, 3]);
        assert!(events.iter().all(|e| e.event.time == future));
    }

    #[tokio::test]
    async fn a_writer_that_lost_the_race_is_fenced() {
        let store = store();
        let id = ExecutionId::new_random();
        let accepted_at = Timestamp::now();
        let mut first =
            EventWriter::create(Arc::clone(&store), id, accepted_at, &Tenant::default())
                .await
                .unwrap();
        let mut second = EventWriter::resume(Arc::clone(&store), id, Sequence(1), accepted_at);
        first.append(progress()).await.unwrap();
        let once = second.append_once(progress()).await;
        assert!(
            matches!(
                once,
                Err(StoreError::Conflict {
                    terminal: false,
                    ..
                })
            ),
            "{once:?}"
        );
        assert!(matches!(
            second.append(progress()).await,
            Err(WriteError::Fenced)
        ));
        assert_eq!(second.last_sequence(), Sequence(1), "nothing was written");
    }
}
