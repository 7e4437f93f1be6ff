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
//!
//! **Pipelining.** Against a store whose appends take a round trip (JetStream:
//! [`EventStore::pipelines_appends`]), [`EventWriter::pipelined`] starts a per-writer appender
//! task, and [`EventWriter::submit`] hands an event over without waiting for its
//! acknowledgement: the event gets its sequence and time here, at once, and joins a bounded
//! queue ([`QUEUE_MAX_EVENTS`] events or [`QUEUE_MAX_BYTES`] bytes; `submit` waits while it is
//! full). The appender sends what is queued as one run ([`EventStore::append_run_as`], at
//! most [`RUN_MAX_EVENTS`] events and [`RUN_MAX_BYTES`] bytes); events submitted while that run
//! is in flight go in the next one. Nothing lingers: a run leaves as soon as the previous one
//! is acknowledged, so a lone event is sent at once. A failed run (after the same retries as
//! [`EventWriter::append`]) stops the pipeline: the queue is dropped, the error is sticky
//! (every later `submit`, `append` or `flush` returns it, and [`EventWriter::failure`] fires
//! for a caller waiting on something else), and only [`EventWriter::recover`] resumes the
//! writer, from the last event the store acknowledged, so the caller can close the log.
//!
//! **Unknown outcomes.** A run (or an inline event) whose append gave up on a transient failure
//! (`Unavailable`, `Closed`: a lost acknowledgement, a partition) may still land later: a
//! JetStream publish stuck behind a partition is stored when it heals, after the writer gave up.
//! The writer keeps such events as *unconfirmed*, and before it appends anything new it sends
//! them again, exactly as before, as the same writer ([`EventWriter::settle`]; every append
//! does it first). The store recognises a write of its own writer that landed (the
//! `append_run_as` contract: JetStream by the message id `{execution}:{first}-{last}:{writer}`
//! and the message's content), so the writer continues after its own late write instead of
//! taking it for another writer's and stopping as fenced, which left the log open until its
//! deadline. The one decision: a writer never sends a different event under a sequence whose
//! outcome it does not know, so a message id of its own always means exactly the events it
//! holds. If the unconfirmed events held the terminal event, the log is closed by this writer
//! ([`EventWriter::closed`]) and every later append returns [`WriteError::Closed`].
//! [`EventWriter::append`] and [`EventWriter::flush`] return once everything submitted so far
//! is acknowledged: a caller that needs an event durable (a route selection before the
//! provider call, the terminal event before the job is acknowledged) waits for it there.
//!
//! **Pacing** ([`EventWriter::paced`], a [`Pace`]; the worker paces adaptively unless told
//! otherwise). A token stream whose deltas come further apart than an append's round trip gets
//! one message per delta. A paced writer sends a run holding output no sooner than the pace's
//! current hold after the previous run holding output was sent, so what the provider emits
//! meanwhile goes in one message: fewer messages for the store to write and republish and for
//! every reader to decode (BENCHMARKS.md, "Fixed pace" and "Adaptive pace"). Each acknowledged
//! run's time is
//! reported to the pace ([`Pace::observe`]), which an adaptive pace turns into its hold.
//! Nothing else waits: the first output after routing leaves at once (the run before it holds
//! none), and a queued terminal event or a caller waiting in [`EventWriter::flush`] (or
//! [`EventWriter::append`]) sends everything queued at once. Readers see the same events
//! either way; only the moment a held delta becomes visible moves, by less than the hold.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use protocol::event::EventBody;
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant, Timestamp};
use tokio::sync::Notify;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::error::StoreError;
use crate::event_store::{EventRecord, EventStore, LogHead, WriterId};
use crate::pace::Pace;

mod pipeline;

pub use pipeline::WriteFailure;
use pipeline::{
    Flushing, PipeState, Pipeline, Shared, append_run_with, retry_or_fail, run_appender,
};

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
    /// The log is already closed by this writer: a terminal event of its own whose outcome was
    /// unknown turned out stored ([`EventWriter::settle`]). Nothing more may be appended.
    #[error("log already closed by this writer")]
    Closed,
}

impl WriteError {
    /// Whether the write may have landed although it was not acknowledged: a transient store
    /// failure (a lost acknowledgement, a partition) leaves the outcome unknown.
    fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            WriteError::Store(StoreError::Unavailable(_) | StoreError::Closed)
        )
    }
}

/// The pauses between tries of a transiently failing append: from 50 ms, doubling, at most a
/// second apart (so an append resumes within a second of a JetStream leader election ending),
/// for up to 25 s after the first failure (an election round of up to 9 s, a second round, and
/// the reconnects around them), so a backend blip does not fail executions.
fn append_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
        .with_budget(Duration::from_secs(25))
}

/// One try, no retry (request paths that answer at once).
fn no_retries() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_millis(50)).with_budget(Duration::ZERO)
}

/// Most events waiting in a pipelined writer's queue (submitted, not yet sent).
pub const QUEUE_MAX_EVENTS: usize = 256;
/// Most bytes of event JSON waiting in a pipelined writer's queue; a larger single event is
/// still admitted into an empty queue.
pub const QUEUE_MAX_BYTES: usize = 1024 * 1024;
/// Most events in one run sent by the appender.
pub const RUN_MAX_EVENTS: usize = 64;
/// Most bytes of event JSON in one run sent by the appender (well under NATS's default
/// `max_payload` of 1 MiB); a larger single event goes alone.
pub const RUN_MAX_BYTES: usize = 256 * 1024;

/// See the module docs.
#[derive(derive_more::Debug)]
pub struct EventWriter {
    #[debug(skip)]
    store: Arc<dyn EventStore>,
    /// Identifies this writer's appends, so its own retries are recognised after a lost ack.
    #[debug(skip)]
    writer_id: WriterId,
    id: ExecutionId,
    last: Sequence,
    #[debug(skip)]
    last_time: Timestamp,
    #[debug(skip)]
    output_exposed: bool,
    /// `mrt_event_append_duration_seconds`, resolved once per writer (a registry lookup per
    /// append would cost more than a memory append).
    #[debug(skip)]
    append_duration: metrics::Histogram,
    /// The appender of a pipelined writer.
    #[debug(skip)]
    pipeline: Option<Pipeline>,
    /// See [`EventWriter::paced`].
    #[debug(skip)]
    pace: Pace,
    /// Events after `last` whose append gave up with an unknown outcome: sent again, as they
    /// are, before anything new (see the module docs).
    #[debug(skip)]
    unconfirmed: Vec<EventRecord>,
    /// The last event this writer holds as stored is terminal.
    closed: bool,
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

    /// Creates the log of an execution that must not run, already closed: `execution.accepted`
    /// at `accepted_at` and `terminal` after it, in one write where the store allows
    /// ([`EventStore::create_closed`]). `AlreadyExists` when the log exists.
    pub async fn create_closed(
        store: Arc<dyn EventStore>,
        id: ExecutionId,
        accepted_at: Timestamp,
        owner: &Tenant,
        terminal: EventBody,
    ) -> Result<(), StoreError> {
        let accepted = RuntimeEvent::new(id, Sequence(1), accepted_at, EventBody::Accepted);
        // Event times never go backwards (as in `next_event`).
        let terminal =
            RuntimeEvent::new(id, Sequence(2), Timestamp::now().max(accepted_at), terminal);
        store.create_closed(accepted, terminal, owner).await
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
            pipeline: None,
            pace: Pace::Off,
            unconfirmed: Vec::new(),
            closed: false,
        }
    }

    /// A writer continuing the log whose last event `head` describes.
    pub fn from_head(store: Arc<dyn EventStore>, id: ExecutionId, head: LogHead) -> Self {
        Self::resume(store, id, head.last_sequence, head.last_time)
    }

    /// This writer, pipelined if its store's appends are worth overlapping
    /// ([`EventStore::pipelines_appends`]; see the module docs); unchanged otherwise.
    pub fn pipelined(self) -> Self {
        if self.store.pipelines_appends() {
            self.start_pipeline()
        } else {
            self
        }
    }

    /// This writer with its output paced by `pace` once pipelined (see the module docs and
    /// [`crate::pace`]); a new writer is [`Pace::Off`]. Call it before
    /// [`EventWriter::pipelined`]: a running pipeline keeps the pace it started with.
    pub fn paced(mut self, pace: Pace) -> Self {
        self.pace = pace;
        self
    }

    /// This writer, pipelined whatever the store.
    fn start_pipeline(mut self) -> Self {
        if self.pipeline.is_some() {
            return self;
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(PipeState {
                queue: VecDeque::new(),
                queued_bytes: 0,
                stored: self.last,
                stored_time: self.last_time,
                failure: None,
                unconfirmed: Vec::new(),
                flushing: false,
            }),
            wake_appender: Notify::new(),
            progress: Notify::new(),
        });
        // In the span the writer was started in (the worker's `execution` span): the
        // appender's lines carry the execution's trace id too.
        let appender = tokio::spawn(
            run_appender(
                Arc::clone(&shared),
                Arc::clone(&self.store),
                self.writer_id,
                self.append_duration.clone(),
                self.pace.clone(),
            )
            .instrument(tracing::Span::current()),
        );
        self.pipeline = Some(Pipeline { shared, appender });
        self
    }

    /// Whether appends go through the appender task.
    pub fn is_pipelined(&self) -> bool {
        self.pipeline.is_some()
    }

    /// A handle that fires when the pipeline fails (never for an inline writer).
    pub fn failure(&self) -> WriteFailure {
        WriteFailure {
            shared: self.pipeline.as_ref().map(|p| Arc::clone(&p.shared)),
        }
    }

    /// Hands `body` to the log as the next event. Pipelined: returns once it is queued
    /// (waiting while the queue is full), before the store acknowledges it; a failure of the
    /// pipeline is returned here (and by every later call) until [`EventWriter::recover`].
    /// Inline: the same as [`EventWriter::append`].
    pub async fn submit(&mut self, body: EventBody) -> Result<(), WriteError> {
        self.settle().await?;
        let Some(pipeline) = &self.pipeline else {
            return self.append_inline(body).await;
        };
        let shared = Arc::clone(&pipeline.shared);
        shared
            .wait_for(|state| match &state.failure {
                Some(e) => Some(Err(e.clone())),
                None if state.queue.is_empty()
                    || (state.queue.len() < QUEUE_MAX_EVENTS
                        && state.queued_bytes < QUEUE_MAX_BYTES) =>
                {
                    Some(Ok(()))
                }
                None => None,
            })
            .await?;
        let event = self.next_event(body);
        let (sequence, time, exposes) = (event.sequence, event.time, event.body.exposes_output());
        let record = EventRecord::new(event);
        {
            let mut state = shared.state.lock();
            if let Some(e) = &state.failure {
                return Err(e.clone());
            }
            state.queued_bytes += record.json.len();
            state.queue.push_back(record);
        }
        self.last = sequence;
        self.last_time = time;
        self.output_exposed |= exposes;
        shared.wake_appender.notify_one();
        Ok(())
    }

    /// Waits until every event submitted so far is acknowledged by the store, or returns the
    /// pipeline's failure. Immediate for an inline writer.
    pub async fn flush(&mut self) -> Result<(), WriteError> {
        let Some(pipeline) = &self.pipeline else {
            return Ok(());
        };
        let last = self.last;
        let shared = &*pipeline.shared;
        // Nothing is held back by the pace while a caller waits for it.
        let _flushing = Flushing::start(shared);
        shared
            .wait_for(|state| match &state.failure {
                Some(e) => Some(Err(e.clone())),
                None if state.stored >= last => Some(Ok(())),
                None => None,
            })
            .await
    }

    /// Takes the pipeline's failure, if any, and resumes the writer from the last event the
    /// store acknowledged (what was queued behind the failure is dropped), so the caller can
    /// append the event that closes the log. Events of the failed run whose outcome is unknown
    /// stay with the writer and are sent again before anything new (see the module docs and
    /// [`EventWriter::settle`]). `None` (and no change) without a failure.
    pub fn recover(&mut self) -> Option<WriteError> {
        let pipeline = self.pipeline.as_ref()?;
        let mut state = pipeline.shared.state.lock();
        let failure = state.failure.take()?;
        state.queue.clear();
        state.queued_bytes = 0;
        self.last = state.stored;
        self.last_time = state.stored_time;
        self.unconfirmed = std::mem::take(&mut state.unconfirmed);
        Some(failure)
    }

    /// Sends the unconfirmed events (see the module docs) again, as they are and as this
    /// writer, retrying transient failures like [`EventWriter::append`]; every append does it
    /// first, so a caller only calls it to learn early whether the log was closed meanwhile.
    /// `Ok` once none are left: each landed, earlier (the store recognised this writer's own
    /// write) or now. If they held the terminal event the writer is then
    /// [`EventWriter::closed`]. `Fenced` when another writer appended after the last
    /// acknowledged event. A transient failure keeps the rest unconfirmed.
    pub async fn settle(&mut self) -> Result<(), WriteError> {
        self.settle_with(append_backoff()).await
    }

    /// [`EventWriter::settle`] with the given retry pauses (none: one attempt).
    async fn settle_with(&mut self, backoff: Backoff) -> Result<(), WriteError> {
        if self.closed {
            return Err(WriteError::Closed);
        }
        if self.unconfirmed.is_empty() {
            return Ok(());
        }
        // Nothing is in flight beside this direct append: unconfirmed events come from a
        // recovery (which emptied the queue) or an inline append, and every submission settles
        // them before it queues anything.
        let run = std::mem::take(&mut self.unconfirmed);
        let result = append_run_with(
            &*self.store,
            &run,
            self.writer_id,
            &self.append_duration,
            &self.pace,
            backoff,
        )
        .await;
        let stored = match &result {
            Ok(()) => run.len(),
            Err((stored, _)) => *stored,
        };
        if let Some(last) = run[..stored].last() {
            self.appended(&last.event.clone());
            if let Some(pipeline) = &self.pipeline {
                let mut state = pipeline.shared.state.lock();
                state.stored = self.last;
                state.stored_time = self.last_time;
            }
            for record in &run[..stored] {
                self.output_exposed |= record.event.body.exposes_output();
            }
        }
        match result {
            Ok(()) => {
                tracing::info!(
                    execution_id = %self.id,
                    last_sequence = self.last.get(),
                    "events whose append had an unknown outcome are stored"
                );
                Ok(())
            }
            Err((stored, error)) => {
                if error.outcome_unknown() {
                    self.unconfirmed = run[stored..].to_vec();
                }
                Err(error)
            }
        }
    }

    /// Whether the log is closed by this writer's own terminal event (see
    /// [`EventWriter::settle`]).
    pub fn closed(&self) -> bool {
        self.closed
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

    /// Records `event` as this writer's last (pipelined: handed over, not yet acknowledged).
    fn appended(&mut self, event: &RuntimeEvent) {
        self.last = event.sequence;
        self.last_time = event.time;
        self.output_exposed |= event.body.exposes_output();
        self.closed |= event.is_terminal();
    }

    /// Appends `body` as the next event in one attempt, for request paths that answer at once.
    /// The store's error is returned unchanged (`Conflict` when another writer appended first).
    pub async fn append_once(&mut self, body: EventBody) -> Result<(), StoreError> {
        let as_store_error = |e: WriteError, last: Sequence| match e {
            WriteError::Store(e) => e,
            WriteError::Fenced => StoreError::Conflict {
                last,
                terminal: false,
            },
            WriteError::Closed => StoreError::Conflict {
                last,
                terminal: true,
            },
            WriteError::Limit => StoreError::ExecutionLimit,
        };
        if self.pipeline.is_some() {
            // Nothing may be in flight beside a direct append.
            self.flush()
                .await
                .map_err(|e| as_store_error(e, self.last))?;
        }
        self.settle_with(no_retries())
            .await
            .map_err(|e| as_store_error(e, self.last))?;
        let event = self.next_event(body);
        if let Err(e) = self.store.append_as(event.clone(), self.writer_id).await {
            if matches!(e, StoreError::Unavailable(_) | StoreError::Closed) {
                self.unconfirmed = vec![EventRecord::new(event)];
            }
            return Err(e);
        }
        self.appended(&event);
        Ok(())
    }

    /// Appends `body` as the next event, retrying transient store failures. Pipelined: submits
    /// it and waits until it (and everything before it) is acknowledged.
    pub async fn append(&mut self, body: EventBody) -> Result<(), WriteError> {
        if self.pipeline.is_some() {
            self.submit(body).await?;
            return self.flush().await;
        }
        self.settle().await?;
        self.append_inline(body).await
    }

    /// [`EventWriter::append`] of an inline writer (settled already).
    async fn append_inline(&mut self, body: EventBody) -> Result<(), WriteError> {
        let event = self.next_event(body);
        let mut backoff = append_backoff();
        loop {
            let started = std::time::Instant::now();
            match self.store.append_as(event.clone(), self.writer_id).await {
                Ok(()) => {
                    self.append_duration.record(started.elapsed().as_secs_f64());
                    break;
                }
                Err(error) => match retry_or_fail(error, &mut backoff) {
                    Ok((pause, e)) => {
                        tracing::warn!(execution_id = %self.id, error = %e, "append failed; retrying");
                        tokio::time::sleep(pause).await;
                    }
                    Err(e) => {
                        if e.outcome_unknown() {
                            self.unconfirmed = vec![EventRecord::new(event)];
                        }
                        return Err(e);
                    }
                },
            }
        }
        self.appended(&event);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
