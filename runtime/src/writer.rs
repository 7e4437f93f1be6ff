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
use crate::event_store::{EventRecord, EventStore, LogHead, RunError, WriterId};
use crate::pace::Pace;

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

/// What the writer and its appender task share.
struct Shared {
    state: Mutex<PipeState>,
    /// Wakes the appender when events are queued or the writer is dropped.
    wake_appender: Notify,
    /// Wakes waiters (room in the queue, acknowledgements, failure).
    progress: Notify,
}

struct PipeState {
    queue: VecDeque<EventRecord>,
    queued_bytes: usize,
    /// The last event the store acknowledged, and its time.
    stored: Sequence,
    stored_time: Timestamp,
    /// Why the pipeline stopped; sticky until [`EventWriter::recover`].
    failure: Option<WriteError>,
    /// The events of the failed run whose outcome is unknown (see the module docs), handed to
    /// the writer by [`EventWriter::recover`].
    unconfirmed: Vec<EventRecord>,
    /// A caller waits in [`EventWriter::flush`]: nothing queued is held back by the pace.
    flushing: bool,
}

impl PipeState {
    /// Whether what is queued must leave now even while paced: a caller waits for it, or it
    /// ends the log.
    fn urgent(&self) -> bool {
        self.flushing || self.queue.back().is_some_and(|r| r.event.is_terminal())
    }
}

impl Shared {
    /// Waits until `ready` returns `Some`, re-checking after every progress notification.
    async fn wait_for<T>(&self, mut ready: impl FnMut(&mut PipeState) -> Option<T>) -> T {
        loop {
            // Register interest before looking, so progress between the look and the wait
            // cannot be missed.
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(value) = ready(&mut self.state.lock()) {
                return value;
            }
            notified.await;
        }
    }
}

/// Marks a pipeline flushed (see [`PipeState::flushing`]) while it lives.
struct Flushing<'a>(&'a Shared);

impl<'a> Flushing<'a> {
    fn start(shared: &'a Shared) -> Self {
        shared.state.lock().flushing = true;
        shared.wake_appender.notify_one();
        Self(shared)
    }
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        self.0.state.lock().flushing = false;
    }
}

struct Pipeline {
    shared: Arc<Shared>,
    appender: tokio::task::JoinHandle<()>,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // A dropped writer writes nothing more (its caller has stopped or was fenced).
        self.appender.abort();
    }
}

/// Fires when a pipelined writer's appender fails (never for an inline writer), so a caller
/// waiting on something else (a provider) learns promptly that it must stop.
#[derive(Clone)]
pub struct WriteFailure {
    shared: Option<Arc<Shared>>,
}

impl std::fmt::Debug for WriteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteFailure").finish_non_exhaustive()
    }
}

impl WriteFailure {
    /// The pipeline's error, once there is one (pending forever otherwise).
    pub async fn failed(&self) -> WriteError {
        match &self.shared {
            Some(shared) => shared.wait_for(|state| state.failure.clone()).await,
            None => std::future::pending().await,
        }
    }
}

/// The appender task of a pipelined writer: sends what is queued as runs, one at a time, a
/// run holding output no sooner than the pace's hold after the previous one (see the module
/// docs).
async fn run_appender(
    shared: Arc<Shared>,
    store: Arc<dyn EventStore>,
    writer_id: WriterId,
    append_duration: metrics::Histogram,
    pace: Pace,
) {
    // Until when queued events wait (unless urgent): the hold after the last run holding output.
    let mut held_until: Option<tokio::time::Instant> = None;
    loop {
        let run = loop {
            let woken = shared.wake_appender.notified();
            let hold = {
                let mut state = shared.state.lock();
                if state.failure.is_some() || state.queue.is_empty() {
                    None
                } else {
                    match held_until {
                        Some(until) if !state.urgent() && tokio::time::Instant::now() < until => {
                            Some(until)
                        }
                        _ => break take_run(&mut state),
                    }
                }
            };
            match hold {
                Some(until) => {
                    tokio::select! {
                        () = woken => {}
                        () = tokio::time::sleep_until(until) => held_until = None,
                    }
                }
                None => woken.await,
            }
        };
        let hold = pace.hold();
        held_until = (!hold.is_zero() && run.iter().any(|r| r.event.body.exposes_output()))
            .then(|| tokio::time::Instant::now() + hold);
        let result = append_run(&*store, &run, writer_id, &append_duration, &pace).await;
        {
            let mut state = shared.state.lock();
            let stored = match &result {
                Ok(()) => run.len(),
                Err((stored, _)) => *stored,
            };
            if let Some(last) = run[..stored].last() {
                state.stored = last.sequence();
                state.stored_time = last.event.time;
            }
            if let Err((stored, error)) = result {
                if error.outcome_unknown() {
                    state.unconfirmed = run[stored..].to_vec();
                }
                state.failure = Some(error);
                state.queue.clear();
                state.queued_bytes = 0;
            }
        }
        shared.progress.notify_waiters();
    }
}

/// The next run from the front of the queue: at least one event, then as many as the run
/// bounds allow.
fn take_run(state: &mut PipeState) -> Vec<EventRecord> {
    let mut run = Vec::new();
    let mut bytes = 0;
    while let Some(next) = state.queue.front() {
        let size = next.json.len();
        if !run.is_empty() && (run.len() >= RUN_MAX_EVENTS || bytes + size > RUN_MAX_BYTES) {
            break;
        }
        bytes += size;
        state.queued_bytes -= size;
        if let Some(record) = state.queue.pop_front() {
            run.push(record);
        }
    }
    run
}

/// What a failed append means: a transient failure within the retry budget is tried again
/// after the returned pause (the failure comes back for the caller's warning); anything else
/// ends the append with its [`WriteError`].
fn retry_or_fail(
    error: StoreError,
    backoff: &mut Backoff,
) -> Result<(Duration, StoreError), WriteError> {
    match error {
        StoreError::Conflict { .. } => Err(WriteError::Fenced),
        StoreError::ExecutionLimit => Err(WriteError::Limit),
        e @ (StoreError::Unavailable(_) | StoreError::Closed) => match backoff.next_pause() {
            Some(pause) => Ok((pause, e)),
            None => Err(WriteError::Store(e)),
        },
        e => Err(WriteError::Store(e)),
    }
}

/// Appends `run`, retrying transient store failures like [`EventWriter::append`]. On failure,
/// how many leading events were stored and why it stopped.
async fn append_run(
    store: &dyn EventStore,
    run: &[EventRecord],
    writer_id: WriterId,
    append_duration: &metrics::Histogram,
    pace: &Pace,
) -> Result<(), (usize, WriteError)> {
    append_run_with(
        store,
        run,
        writer_id,
        append_duration,
        pace,
        append_backoff(),
    )
    .await
}

/// [`append_run`] with the given retry pauses.
async fn append_run_with(
    store: &dyn EventStore,
    run: &[EventRecord],
    writer_id: WriterId,
    append_duration: &metrics::Histogram,
    pace: &Pace,
    mut backoff: Backoff,
) -> Result<(), (usize, WriteError)> {
    let mut done = 0;
    loop {
        // Tokio's clock, so tests with a paused clock see the store's delays.
        let started = tokio::time::Instant::now();
        match store.append_run_as(&run[done..], writer_id).await {
            Ok(()) => {
                let took = started.elapsed();
                append_duration.record(took.as_secs_f64());
                pace.observe(took);
                return Ok(());
            }
            Err(RunError { stored, error }) => {
                done += stored;
                let (pause, e) = retry_or_fail(error, &mut backoff).map_err(|e| (done, e))?;
                // A run holds events of one execution: the appender task runs outside the
                // execution's span, so the line names it itself.
                if let Some(first) = run.first() {
                    tracing::warn!(execution_id = %first.event.execution_id, error = %e, "append failed; retrying");
                }
                tokio::time::sleep(pause).await;
            }
        }
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
mod tests {
    use super::*;
    use crate::contract::delta;
    use crate::memory::{MemoryEventStore, MemoryLimits};
    use futures_util::FutureExt;
    use tokio::sync::Semaphore;

    /// A memory store whose run appends wait for a permit of `gate` each (when gated), and
    /// which records the length of every run it stores.
    struct GatedStore {
        inner: MemoryEventStore,
        gate: Option<Arc<Semaphore>>,
        entered: Notify,
        runs: parking_lot::Mutex<Vec<usize>>,
        /// How long each run takes to be acknowledged (once through the gate).
        delay: Duration,
    }

    impl GatedStore {
        fn new(limits: MemoryLimits, gate: Option<Arc<Semaphore>>) -> Arc<Self> {
            Self::with(limits, gate, Duration::ZERO)
        }

        /// An ungated store whose every run takes `delay` to be acknowledged.
        fn slow(delay: Duration) -> Arc<Self> {
            Self::with(MemoryLimits::default(), None, delay)
        }

        fn with(limits: MemoryLimits, gate: Option<Arc<Semaphore>>, delay: Duration) -> Arc<Self> {
            Arc::new(Self {
                inner: MemoryEventStore::new(limits),
                gate,
                entered: Notify::new(),
                runs: parking_lot::Mutex::new(Vec::new()),
                delay,
            })
        }
    }

    #[async_trait::async_trait]
    impl crate::intercept::Intercept for GatedStore {
        fn inner(&self) -> &dyn EventStore {
            &self.inner
        }
        async fn append_run_as(
            &self,
            run: &[EventRecord],
            writer: WriterId,
        ) -> Result<(), RunError> {
            self.entered.notify_one();
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            self.runs.lock().push(run.len());
            self.inner.append_run_as(run, writer).await
        }
        fn pipelines_appends(&self) -> bool {
            true
        }
        async fn ready(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    async fn pipelined_writer(store: &Arc<GatedStore>) -> (ExecutionId, EventWriter) {
        let id = ExecutionId::new_random();
        let store: Arc<dyn EventStore> = Arc::clone(store) as Arc<dyn EventStore>;
        let writer = EventWriter::create(store, id, Timestamp::now(), &Tenant::default())
            .await
            .unwrap()
            .pipelined();
        assert!(writer.is_pipelined());
        (id, writer)
    }

    /// A pipelined writer over a store gated shut, whose first run (the one event `first`)
    /// is in flight, waiting at the gate.
    async fn held_at_the_gate(
        first: &str,
    ) -> (Arc<Semaphore>, Arc<GatedStore>, ExecutionId, EventWriter) {
        let gate = Arc::new(Semaphore::new(0));
        let store = GatedStore::new(MemoryLimits::default(), Some(Arc::clone(&gate)));
        let (id, mut writer) = pipelined_writer(&store).await;
        writer.submit(delta(first)).await.unwrap();
        store.entered.notified().await;
        (gate, store, id, writer)
    }

    #[tokio::test]
    async fn events_handed_in_during_an_append_go_in_the_next_one_as_one_run() {
        // The appender takes the first event at once (nothing in flight: no waiting for more).
        let (gate, store, id, mut writer) = held_at_the_gate("a").await;
        for text in ["b", "c", "d"] {
            writer.submit(delta(text)).await.unwrap();
        }
        assert_eq!(
            writer.last_sequence(),
            Sequence(5),
            "sequences are assigned at once"
        );
        gate.add_permits(2);
        writer.flush().await.unwrap();
        assert_eq!(*store.runs.lock(), [1, 3]);
        let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
        let texts: Vec<_> = events
            .iter()
            .skip(1)
            .map(|r| match &r.event.body {
                EventBody::OutputDelta { delta, .. } => delta.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(texts, ["a", "b", "c", "d"]);
    }

    #[tokio::test]
    async fn runs_are_bounded_and_a_full_queue_holds_the_caller_back() {
        let (gate, store, _, mut writer) = held_at_the_gate("first").await;
        for i in 0..QUEUE_MAX_EVENTS {
            writer.submit(delta(&i.to_string())).await.unwrap();
        }
        // The queue is full: the next submission waits for room.
        let mut blocked = Box::pin(writer.submit(delta("blocked")));
        for _ in 0..10 {
            tokio::task::yield_now().await;
            assert!(
                (&mut blocked).now_or_never().is_none(),
                "the queue is bounded"
            );
        }
        gate.add_permits(usize::MAX >> 4);
        blocked.await.unwrap();
        writer.flush().await.unwrap();
        let runs = store.runs.lock().clone();
        assert_eq!(runs.iter().sum::<usize>(), QUEUE_MAX_EVENTS + 2);
        assert!(runs.iter().all(|&n| n <= RUN_MAX_EVENTS), "{runs:?}");
        assert_eq!(runs[1], RUN_MAX_EVENTS, "{runs:?}");
    }

    #[tokio::test]
    async fn a_failed_pipeline_is_sticky_until_recovered_from_the_stored_head() {
        let limits = MemoryLimits {
            max_events: 3,
            ..MemoryLimits::default()
        };
        let store = GatedStore::new(limits, None);
        let (id, mut writer) = pipelined_writer(&store).await;
        let failure = writer.failure();
        for text in ["a", "b", "c", "d"] {
            // Errors surface on a later submission at the earliest, never lose an event silently.
            if writer.submit(delta(text)).await.is_err() {
                break;
            }
        }
        assert!(matches!(writer.flush().await, Err(WriteError::Limit)));
        assert!(matches!(failure.failed().await, WriteError::Limit));
        assert!(
            matches!(writer.submit(delta("e")).await, Err(WriteError::Limit)),
            "sticky"
        );
        assert!(matches!(writer.recover(), Some(WriteError::Limit)));
        assert_eq!(writer.last_sequence(), Sequence(3), "the last stored event");
        assert!(writer.recover().is_none());
        writer
            .append(EventBody::Failed {
                error: protocol::RuntimeError::internal(),
            })
            .await
            .unwrap();
        let head = store.head(id).await.unwrap().unwrap();
        assert_eq!((head.last_sequence, head.terminal), (Sequence(4), true));
    }

    #[tokio::test]
    async fn a_fenced_pipeline_reports_it_to_a_waiting_caller() {
        let store = GatedStore::new(MemoryLimits::default(), None);
        let (id, mut writer) = pipelined_writer(&store).await;
        let failure = writer.failure();
        // Another writer takes sequence 2 first.
        let mut other = EventWriter::resume(
            Arc::clone(&store) as Arc<dyn EventStore>,
            id,
            Sequence(1),
            Timestamp::now(),
        );
        other.append(delta("other")).await.unwrap();
        writer.submit(delta("mine")).await.unwrap();
        assert!(matches!(failure.failed().await, WriteError::Fenced));
        assert!(matches!(writer.flush().await, Err(WriteError::Fenced)));
    }

    /// A pipelined writer paced by 40 ms whose log already holds a stored non-output event
    /// (as after routing), over a store that records its runs (its tests pause time).
    async fn paced_writer() -> (Arc<GatedStore>, ExecutionId, EventWriter) {
        writer_paced_by(Pace::Fixed(Duration::from_millis(40))).await
    }

    /// Yields until the stored log ends at `sequence` (time does not move meanwhile: this task
    /// stays runnable, so a paused clock is not advanced).
    async fn stored_up_to(store: &GatedStore, id: ExecutionId, sequence: u64) {
        for _ in 0..1000 {
            if store.head(id).await.unwrap().unwrap().last_sequence == Sequence(sequence) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the log never reached sequence {sequence}");
    }

    #[tokio::test(start_paused = true)]
    async fn paced_output_leaves_at_most_once_per_pace_in_one_run() {
        let (store, id, mut writer) = paced_writer().await;
        // The first output after routing is not held.
        writer.submit(delta("a")).await.unwrap();
        stored_up_to(&store, id, 3).await;
        for text in ["b", "c", "d"] {
            writer.submit(delta(text)).await.unwrap();
        }
        tokio::time::advance(Duration::from_millis(39)).await;
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        let head = store.head(id).await.unwrap().unwrap();
        assert_eq!(head.last_sequence, Sequence(3), "held for the pace");
        tokio::time::advance(Duration::from_millis(1)).await;
        stored_up_to(&store, id, 6).await;
        assert_eq!(*store.runs.lock(), [1, 1, 3], "one run per pace");
        let texts: Vec<_> = store
            .read(id, Sequence(2), 10)
            .await
            .unwrap()
            .unwrap()
            .iter()
            .map(|r| match &r.event.body {
                EventBody::OutputDelta { delta, .. } => delta.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(texts, ["a", "b", "c", "d"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminal_event_or_a_waiting_caller_is_never_held_by_the_pace() {
        let (store, id, mut writer) = paced_writer().await;
        writer.submit(delta("a")).await.unwrap();
        stored_up_to(&store, id, 3).await;
        let start = tokio::time::Instant::now();
        // A caller waiting for durability: a held appender would let the paused clock jump.
        writer.submit(delta("b")).await.unwrap();
        writer.flush().await.unwrap();
        assert_eq!(
            store.head(id).await.unwrap().unwrap().last_sequence,
            Sequence(4)
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "a flush is not paced");
        // A terminal event queued behind output sends it all at once, without a flush.
        writer.submit(delta("c")).await.unwrap();
        writer
            .submit(EventBody::Failed {
                error: protocol::RuntimeError::internal(),
            })
            .await
            .unwrap();
        stored_up_to(&store, id, 6).await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a terminal event is not paced"
        );
        assert_eq!(*store.runs.lock(), [1, 1, 1, 2]);
    }

    /// A pipelined writer with `pace` whose log already holds a stored non-output event (as
    /// after routing), over a store that records its runs.
    async fn writer_paced_by(pace: Pace) -> (Arc<GatedStore>, ExecutionId, EventWriter) {
        let store = GatedStore::new(MemoryLimits::default(), None);
        let id = ExecutionId::new_random();
        let dyn_store: Arc<dyn EventStore> = Arc::clone(&store) as Arc<dyn EventStore>;
        let mut writer = EventWriter::create(dyn_store, id, Timestamp::now(), &Tenant::default())
            .await
            .unwrap()
            .paced(pace)
            .pipelined();
        writer.append(progress()).await.unwrap();
        (store, id, writer)
    }

    #[tokio::test(start_paused = true)]
    async fn an_adaptive_pace_holds_output_only_while_its_store_is_slow() {
        let pressure = Arc::new(crate::pace::AppendPressure::default());
        let settle = |took: Duration| {
            for _ in 0..400 {
                pressure.observe(took);
            }
        };
        settle(Duration::from_millis(1));
        let (store, id, mut writer) = writer_paced_by(Pace::Adaptive(Arc::clone(&pressure))).await;
        let start = tokio::time::Instant::now();
        for (i, text) in ["a", "b", "c"].into_iter().enumerate() {
            writer.submit(delta(text)).await.unwrap();
            stored_up_to(&store, id, 3 + i as u64).await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a store that keeps up holds nothing"
        );
        // The store turns slow (the writers sharing the pressure saw 3 ms acknowledgements):
        // output after the next run waits forty times the 2 ms over the threshold.
        settle(Duration::from_millis(3));
        let hold = pressure.hold();
        assert!(hold > Duration::from_millis(79) && hold <= Duration::from_millis(80));
        writer.submit(delta("d")).await.unwrap();
        stored_up_to(&store, id, 6).await;
        writer.submit(delta("e")).await.unwrap();
        writer.submit(delta("f")).await.unwrap();
        tokio::time::advance(hold - Duration::from_millis(1)).await;
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        let head = store.head(id).await.unwrap().unwrap();
        assert_eq!(
            head.last_sequence,
            Sequence(6),
            "held while the store is slow"
        );
        // (Tokio's timers fire on whole milliseconds.)
        tokio::time::advance(Duration::from_millis(2)).await;
        stored_up_to(&store, id, 8).await;
        assert_eq!(
            *store.runs.lock(),
            [1, 1, 1, 1, 1, 2],
            "routing, a to d alone, e and f"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pipelined_writer_reports_how_long_its_appends_take_to_its_pace() {
        let store: Arc<dyn EventStore> = GatedStore::slow(Duration::from_millis(25));
        let pace = Pace::adaptive();
        let id = ExecutionId::new_random();
        let mut writer = EventWriter::create(store, id, Timestamp::now(), &Tenant::default())
            .await
            .unwrap()
            .paced(pace.clone())
            .pipelined();
        assert_eq!(pace.hold(), Duration::ZERO);
        for _ in 0..60 {
            writer.append(progress()).await.unwrap();
        }
        let Pace::Adaptive(pressure) = &pace else {
            unreachable!()
        };
        let average = pressure.average();
        assert!(
            average > Duration::from_millis(20) && average <= Duration::from_millis(25),
            "{average:?}"
        );
        // Every acknowledgement took 25 ms: that is this store's round trip, not a queue.
        assert_eq!(pressure.threshold(), Duration::from_millis(100));
        assert_eq!(pace.hold(), Duration::ZERO);
    }

    fn store() -> Arc<dyn EventStore> {
        Arc::new(MemoryEventStore::new(MemoryLimits::default()))
    }

    /// A memory store out of reach (every operation `Unavailable`, like a stream without a
    /// leader) from when `outage` is called until the given time.
    struct OutageStore {
        inner: MemoryEventStore,
        until: parking_lot::Mutex<Option<tokio::time::Instant>>,
        pipelined: bool,
    }

    impl OutageStore {
        fn new(pipelined: bool) -> Arc<Self> {
            Arc::new(Self {
                inner: MemoryEventStore::new(MemoryLimits::default()),
                until: parking_lot::Mutex::new(None),
                pipelined,
            })
        }

        fn outage(&self, until: tokio::time::Instant) {
            *self.until.lock() = Some(until);
        }
    }

    #[async_trait::async_trait]
    impl crate::intercept::Intercept for OutageStore {
        fn inner(&self) -> &dyn EventStore {
            &self.inner
        }
        fn available(&self) -> Result<(), StoreError> {
            match *self.until.lock() {
                Some(until) if tokio::time::Instant::now() < until => {
                    Err(StoreError::Unavailable("no responders".into()))
                }
                _ => Ok(()),
            }
        }
        fn pipelines_appends(&self) -> bool {
            self.pipelined
        }
    }

    /// A writer (inline or pipelined) whose store goes out of reach for `outage` right after
    /// the log was created; what its next append returned and how long it took.
    async fn append_through_an_outage(
        pipelined: bool,
        outage: Duration,
    ) -> (Result<(), WriteError>, Duration) {
        let store = OutageStore::new(pipelined);
        let dyn_store: Arc<dyn EventStore> = Arc::clone(&store) as Arc<dyn EventStore>;
        let id = ExecutionId::new_random();
        let mut writer = EventWriter::create(dyn_store, id, Timestamp::now(), &Tenant::default())
            .await
            .unwrap();
        if pipelined {
            writer = writer.pipelined();
        }
        let start = tokio::time::Instant::now();
        store.outage(start + outage);
        let result = writer.append(progress()).await;
        (result, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_resumes_within_a_second_of_an_outage_ending() {
        // An outage as long as a slow JetStream leader election: the append lands within a
        // second of its end (pauses capped at 1 s), inline and pipelined alike.
        for pipelined in [false, true] {
            let outage = Duration::from_millis(7_300);
            let (result, took) = append_through_an_outage(pipelined, outage).await;
            assert!(result.is_ok(), "pipelined {pipelined}: {result:?}");
            assert!(
                took >= outage && took <= outage + Duration::from_secs(1),
                "pipelined {pipelined}: appended {took:?} after an outage of {outage:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_gives_up_once_the_retry_budget_is_spent() {
        for pipelined in [false, true] {
            let (result, took) = append_through_an_outage(pipelined, Duration::from_secs(60)).await;
            assert!(
                matches!(result, Err(WriteError::Store(StoreError::Unavailable(_)))),
                "pipelined {pipelined}: {result:?}"
            );
            assert!(
                took >= Duration::from_secs(24) && took <= Duration::from_secs(25),
                "pipelined {pipelined}: gave up after {took:?}"
            );
        }
    }

    /// A memory store behind a cut link, as a worker partitioned from JetStream sees it: while
    /// cut, a run is not stored and its append fails `Unavailable` after a while (a publish
    /// whose acknowledgement timed out), but the last such run is still on its way; `heal`
    /// stores it (late, after the writer gave up, as JetStream did once the partition healed)
    /// and lets appends through again.
    struct LateStore {
        inner: MemoryEventStore,
        cut: parking_lot::Mutex<bool>,
        in_flight: parking_lot::Mutex<Option<(Vec<EventRecord>, WriterId)>>,
    }

    impl LateStore {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                inner: MemoryEventStore::new(MemoryLimits::default()),
                cut: parking_lot::Mutex::new(false),
                in_flight: parking_lot::Mutex::new(None),
            })
        }

        fn cut(&self) {
            *self.cut.lock() = true;
        }

        /// Ends the cut; the run last sent meanwhile lands now (when `lands`).
        async fn heal(&self, lands: bool) {
            *self.cut.lock() = false;
            let in_flight = self.in_flight.lock().take();
            if let Some((run, writer)) = in_flight
                && lands
            {
                self.inner.append_run_as(&run, writer).await.unwrap();
            }
        }
    }

    #[async_trait::async_trait]
    impl crate::intercept::Intercept for LateStore {
        fn inner(&self) -> &dyn EventStore {
            &self.inner
        }
        async fn append_run_as(
            &self,
            run: &[EventRecord],
            writer: WriterId,
        ) -> Result<(), RunError> {
            if *self.cut.lock() {
                *self.in_flight.lock() = Some((run.to_vec(), writer));
                tokio::time::sleep(Duration::from_secs(5)).await;
                return Err(RunError {
                    stored: 0,
                    error: StoreError::Unavailable("publish ack: timed out".into()),
                });
            }
            self.inner.append_run_as(run, writer).await
        }
        fn pipelines_appends(&self) -> bool {
            true
        }
    }

    /// A pipelined writer whose log holds `accepted` and a delta; the link is then cut and
    /// `bodies` are submitted: the pipeline fails once the retry budget is spent. The link
    /// heals (the run in flight landing late when `lands`) and the writer recovers.
    async fn cut_off_while_writing(
        bodies: Vec<EventBody>,
        lands: bool,
    ) -> (Arc<LateStore>, ExecutionId, EventWriter) {
        let store = LateStore::new();
        let id = ExecutionId::new_random();
        let dyn_store: Arc<dyn EventStore> = Arc::clone(&store) as Arc<dyn EventStore>;
        let mut writer = EventWriter::create(dyn_store, id, Timestamp::now(), &Tenant::default())
            .await
            .unwrap()
            .pipelined();
        writer.append(delta("stored")).await.unwrap();
        store.cut();
        for body in bodies {
            writer.submit(body).await.unwrap();
        }
        let failed = writer.flush().await;
        assert!(
            matches!(failed, Err(WriteError::Store(StoreError::Unavailable(_)))),
            "{failed:?}"
        );
        store.heal(lands).await;
        assert!(writer.recover().is_some());
        assert_eq!(
            writer.last_sequence(),
            Sequence(2),
            "the last acknowledged event"
        );
        (store, id, writer)
    }

    fn types(events: &[Arc<EventRecord>]) -> Vec<&'static str> {
        events.iter().map(|r| r.event.type_name()).collect()
    }

    fn internal_failure() -> EventBody {
        EventBody::Failed {
            error: protocol::RuntimeError::internal(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_lands_after_the_writer_gave_up_is_recognised_as_its_own() {
        // The stuck executions: `usage.reported` landed 0.9 s after the worker gave
        // up; its terminal append then met its own write, was taken for fenced, and the log
        // stayed open until the deadline.
        let usage = EventBody::UsageReported {
            facts: vec![
                protocol::UsageFact::new(
                    protocol::UsageUnit::output_token(),
                    3.0,
                    protocol::UsageSource::Runtime,
                )
                .unwrap(),
            ],
        };
        for lands in [true, false] {
            let (store, id, mut writer) =
                cut_off_while_writing(vec![delta("late"), usage.clone()], lands).await;
            // The log is closed after what may have landed, whether it had or not.
            writer.append(internal_failure()).await.unwrap();
            let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
            assert_eq!(
                types(&events),
                [
                    "execution.accepted",
                    "output.delta",
                    "output.delta",
                    "usage.reported",
                    "execution.failed"
                ],
                "landed late: {lands}"
            );
            let sequences: Vec<u64> = events.iter().map(|r| r.sequence().get()).collect();
            assert_eq!(sequences, [1, 2, 3, 4, 5]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminal_event_that_landed_late_closes_the_log_for_its_writer() {
        let completed = EventBody::Completed {
            target: crate::contract::target(),
        };
        let (store, id, mut writer) =
            cut_off_while_writing(vec![delta("late"), completed], true).await;
        writer.settle().await.unwrap();
        assert!(writer.closed(), "its own terminal event is stored");
        assert!(matches!(
            writer.append(internal_failure()).await,
            Err(WriteError::Closed)
        ));
        let head = store.head(id).await.unwrap().unwrap();
        assert_eq!((head.last_sequence, head.terminal), (Sequence(4), true));
    }

    #[tokio::test(start_paused = true)]
    async fn another_writer_after_the_last_acknowledged_event_still_fences() {
        let (store, id, mut writer) = cut_off_while_writing(vec![delta("late")], false).await;
        // A deadline sweeper closed the log meanwhile.
        let mut other = EventWriter::resume(
            Arc::clone(&store) as Arc<dyn EventStore>,
            id,
            Sequence(2),
            Timestamp::now(),
        );
        other.append(internal_failure()).await.unwrap();
        assert!(matches!(
            writer.append(internal_failure()).await,
            Err(WriteError::Fenced)
        ));
        let head = store.head(id).await.unwrap().unwrap();
        assert_eq!((head.last_sequence, head.terminal), (Sequence(3), true));
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
