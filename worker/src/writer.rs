//! The per-execution event writer: the only place sequences and timestamps are assigned.
//!
//! Appends are compare-and-set on the sequence, so a writer that lost its claim (a zombie
//! worker, or a gateway cancel that won the race for sequence 2) is fenced and stops. Transient
//! store failures are retried with bounded backoff; a retried append is safe because stores
//! de-duplicate on `{execution_id}:{sequence}`.

use std::sync::Arc;
use std::time::Duration;

use protocol::event::EventBody;
use protocol::{ExecutionId, RuntimeEvent, Sequence, Timestamp};
use runtime::{EventStore, StoreError, WriterId};

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

    /// Appends `body` as the next event.
    pub async fn append(&mut self, body: EventBody) -> Result<(), WriteError> {
        // Event times never go backwards, even if the wall clock does.
        let now = Timestamp::now().max(self.last_time);
        let exposes = body.exposes_output();
        let event = RuntimeEvent::new(self.id, self.last.next(), now, body);
        let mut delay = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.store.append_as(event.clone(), self.writer_id).await {
                Ok(()) => break,
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
        self.last = event.sequence;
        self.last_time = now;
        self.output_exposed |= exposes;
        Ok(())
    }
}
