//! The pipelined writer's appender: the task that sends queued events in runs, the state it
//! shares with its [`EventWriter`](super::EventWriter) (queue, acknowledged sequence,
//! failure), and how a failed run is retried or ends the pipeline.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use protocol::{Sequence, Timestamp};
use tokio::sync::Notify;

use crate::backoff::Backoff;
use crate::error::StoreError;
use crate::event_store::{EventRecord, EventStore, RunError, WriterId};
use crate::lazy_timer::LazyTimer;
use crate::pace::Pace;

use super::{RUN_MAX_BYTES, RUN_MAX_EVENTS, WriteError, append_backoff};

/// What the writer and its appender task share.
pub(super) struct Shared {
    pub(super) state: Mutex<PipeState>,
    /// Wakes the appender when events are queued or the writer is dropped.
    pub(super) wake_appender: Notify,
    /// Wakes waiters (room in the queue, acknowledgements, failure).
    pub(super) progress: Notify,
}

pub(super) struct PipeState {
    pub(super) queue: VecDeque<EventRecord>,
    pub(super) queued_bytes: usize,
    /// The last event the store acknowledged, and its time.
    pub(super) stored: Sequence,
    pub(super) stored_time: Timestamp,
    /// Why the pipeline stopped; sticky until [`EventWriter::recover`].
    pub(super) failure: Option<WriteError>,
    /// The events of the failed run whose outcome is unknown (see the module docs), handed to
    /// the writer by [`EventWriter::recover`].
    pub(super) unconfirmed: Vec<EventRecord>,
    /// A caller waits in [`EventWriter::flush`]: nothing queued is held back by the pace.
    pub(super) flushing: bool,
}

impl PipeState {
    /// Whether what is queued must leave now even while paced: a caller waits for it, or it
    /// ends the log.
    pub(super) fn urgent(&self) -> bool {
        self.flushing || self.queue.back().is_some_and(|r| r.event.is_terminal())
    }
}

impl Shared {
    /// Waits until `ready` returns `Some`, re-checking after every progress notification.
    pub(super) async fn wait_for<T>(
        &self,
        mut ready: impl FnMut(&mut PipeState) -> Option<T>,
    ) -> T {
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
pub(super) struct Flushing<'a>(&'a Shared);

impl<'a> Flushing<'a> {
    pub(super) fn start(shared: &'a Shared) -> Self {
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

pub(super) struct Pipeline {
    pub(super) shared: Arc<Shared>,
    pub(super) appender: tokio::task::JoinHandle<()>,
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
    pub(super) shared: Option<Arc<Shared>>,
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
pub(super) async fn run_appender(
    shared: Arc<Shared>,
    store: Arc<dyn EventStore>,
    writer_id: WriterId,
    append_duration: metrics::Histogram,
    pace: Pace,
) {
    // Until when queued events wait (unless urgent): the hold after the last run holding output.
    let mut held_until: Option<tokio::time::Instant> = None;
    // One timer for every hold (a `sleep` made per hold took the runtime's timer lock twice per
    // run: `crate::lazy_timer`).
    let mut hold_timer = LazyTimer::at(tokio::time::Instant::now());
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
                    hold_timer.set(until);
                    tokio::select! {
                        () = woken => {}
                        () = hold_timer.elapsed() => held_until = None,
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
pub(super) fn take_run(state: &mut PipeState) -> Vec<EventRecord> {
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
pub(super) fn retry_or_fail(
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
pub(super) async fn append_run(
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
pub(super) async fn append_run_with(
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
