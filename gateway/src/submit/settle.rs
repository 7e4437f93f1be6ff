//! Settling a failed submission before answering: closing the log unless a worker claimed
//! the execution, withdrawing the job, within [`SETTLE_BOUND`], then in the background
//! (see the module docs of `submit`).
use std::future::Future;
use std::time::{Duration, Instant};

use protocol::event::EventBody;
use protocol::{RuntimeError, Sequence, Tenant};
use runtime::backoff::Backoff;
use runtime::{EventWriter, Job, StoreError};

use super::create::{Creation, Failed};
use crate::state::AppState;

/// How long after its start a submission may spend learning what became of a failed step:
/// every submit is answered within 2 s (contract section 8), and the steps themselves end by
/// [`STEP_BOUND`], so this leaves the settling its share of the bound and the answer its
/// margin.
pub(super) const SETTLE_BOUND: Duration = Duration::from_millis(1750);

/// How long after its start a submission waits for the answers of its store requests before
/// the settling: one request timeout of the `nats` backend, counted from the start, so that at
/// least [`SETTLE_BOUND`] less this is left to settle a write that did not answer.
pub(super) const STEP_BOUND: Duration = Duration::from_millis(1500);

/// Runs `step`, a store request of the submission that started at `started`, until
/// [`STEP_BOUND`] after that: one still unanswered then is `Unavailable`, its outcome unknown,
/// like a request that timed out. A JetStream publish alone may take twice the request timeout
/// (handing the message to a connection that is reconnecting, then waiting for its
/// acknowledgement), and an idempotent replay may wait for a log, so only this bound keeps
/// every submit answered within 2 s.
pub(super) async fn within_bound<T>(
    started: Instant,
    what: &'static str,
    step: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let deadline = tokio::time::Instant::from_std(started + STEP_BOUND);
    match tokio::time::timeout_at(deadline, step).await {
        Ok(answer) => answer,
        Err(_) => Err(StoreError::Unavailable(format!(
            "{what}: no answer within the submission's bound"
        ))),
    }
}

/// How long a background task keeps settling a submission answered 503 whose outcome was
/// unknown (a JetStream election lasts seconds; the duplicate window, which `withdraw` relies
/// on, is two minutes).
pub(super) const BACKGROUND_SETTLE: Duration = Duration::from_secs(60);

/// The longest pause between two background settling attempts. Short: when the streams come
/// back after an election, a worker may be handed the job at once, and the first of the two
/// to write after `execution.accepted` decides whether the execution runs.
pub(super) const BACKGROUND_RETRY_CAP: Duration = Duration::from_millis(500);

/// What is left to do to settle a failed submission.
pub(super) struct Settle {
    /// The job may be queued and must be withdrawn (after the log is closed, see
    /// [`Settle::step`]).
    pub(super) withdraw: bool,
    /// The writer of the log (kept across retries, so a close that landed unacknowledged is
    /// recognised as this writer's own).
    pub(super) writer: Option<EventWriter>,
    /// Whether the log may exist (or appear) and must be closed.
    pub(super) close_log: bool,
    /// Whether this settle closed the log: nothing of the execution can run any more, so a
    /// withdrawal still to do is cleanup (a worker drops a job whose log is terminal).
    pub(super) log_closed: bool,
    /// Why the last withdrawal failed behind a closed log, for the warning should it never
    /// succeed.
    pub(super) withdraw_error: Option<StoreError>,
    /// The tenant the log belongs to, should settling have to create it.
    pub(super) owner: Tenant,
}

/// What settling found.
pub(super) enum Settled {
    /// Nothing of the execution will run: its log is closed with the unqueued failure (its job
    /// withdrawn, or still to withdraw), or it never existed and its job is withdrawn (or was
    /// never queued).
    Closed,
    /// A worker appended to the log first: the job was queued and the execution is running
    /// (or done). The submission is accepted.
    Claimed,
}

impl Settle {
    /// What is left when nothing is done yet: withdraw the job if `withdraw`, close the log
    /// (with `writer` when this gateway created it) if `close_log`.
    pub(super) fn new(
        withdraw: bool,
        writer: Option<EventWriter>,
        close_log: bool,
        owner: &Tenant,
    ) -> Self {
        Self {
            withdraw,
            writer,
            close_log,
            log_closed: false,
            withdraw_error: None,
            owner: owner.clone(),
        }
    }

    /// The log this gateway created must be closed; the job was not queued, or a worker that
    /// is handed it finds the log closed.
    pub(super) fn closing(writer: EventWriter, owner: &Tenant) -> Self {
        Self::new(false, Some(writer), true, owner)
    }

    /// One attempt; a store error means "not known yet, try again". The log is closed before
    /// the job is withdrawn: the closed log is what keeps every worker from running the
    /// execution (a worker drops a job whose log is terminal), whatever became of the job;
    /// withdrawing it only frees the queue. So once the log is closed the answer is `Closed`
    /// even while the withdrawal still fails (`withdraw` stays set for the caller to finish in
    /// the background).
    pub(super) async fn step(
        &mut self,
        state: &AppState,
        job: &Job,
    ) -> Result<Settled, StoreError> {
        if self.close_log {
            if let Settled::Claimed = self.close(state, job).await? {
                return Ok(Settled::Claimed);
            }
            self.close_log = false;
            self.log_closed = true;
        }
        if self.withdraw {
            match state.inner.backend.queue.withdraw(job).await {
                Ok(()) => self.withdraw = false,
                // The outcome is known: closed. The withdrawal finishes in the background.
                Err(e) if self.log_closed => {
                    tracing::debug!(execution_id = %job.execution_id, error = %e, "job not withdrawn yet; its log is closed");
                    self.withdraw_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Settled::Closed)
    }

    /// Closes the log with the unqueued failure unless a worker claimed the execution first.
    pub(super) async fn close(
        &mut self,
        state: &AppState,
        job: &Job,
    ) -> Result<Settled, StoreError> {
        let store = &state.inner.backend.store;
        let writer = match &mut self.writer {
            Some(writer) => writer,
            None => {
                // Created closed, in one write: a worker holding the job never finds this log
                // open. When the create landed after all, its `execution.accepted` is there and
                // the failure follows it by compare-and-set.
                match EventWriter::create_closed(
                    store.clone(),
                    job.execution_id,
                    job.accepted_at,
                    &self.owner,
                    unqueued_failure(),
                )
                .await
                {
                    Ok(()) => {
                        tracing::info!(execution_id = %job.execution_id, "closed the log of an unqueued execution");
                        return Ok(Settled::Closed);
                    }
                    Err(StoreError::AlreadyExists) => {}
                    Err(e) => return Err(e),
                }
                let Some(head) = store.head(job.execution_id).await? else {
                    return Err(StoreError::Unavailable("log not readable yet".into()));
                };
                if let Some(settled) = Settled::from_head(head.last_sequence, head.terminal) {
                    return Ok(settled);
                }
                self.writer.insert(EventWriter::from_head(
                    store.clone(),
                    job.execution_id,
                    head,
                ))
            }
        };
        match writer.append_once(unqueued_failure()).await {
            Ok(()) => {
                tracing::info!(execution_id = %job.execution_id, "closed the log of an unqueued execution");
                Ok(Settled::Closed)
            }
            Err(StoreError::Conflict { last, terminal }) => {
                Ok(Settled::from_head(last, terminal).unwrap_or(Settled::Claimed))
            }
            Err(e) => Err(e),
        }
    }
}

impl Settled {
    /// What a log that ends at `last` says, or `None` while it holds only `execution.accepted`.
    /// A log closed right after `execution.accepted` never ran (closed by an earlier attempt
    /// whose acknowledgement was lost, a cancellation, or the deadline): nothing will run.
    /// Anything else after it is a worker's claim.
    pub(super) fn from_head(last: Sequence, terminal: bool) -> Option<Self> {
        match (last, terminal) {
            (Sequence(1), false) => None,
            (Sequence(2), true) => Some(Settled::Closed),
            _ => Some(Settled::Claimed),
        }
    }
}

/// Settles a failed submission within [`SETTLE_BOUND`] of `started` and answers it: `Claimed`
/// is an acceptance, `Closed` the failure `error`. When the outcome cannot be learnt in time
/// the submission fails unsettled (the key stays bound) and a background task finishes.
pub(super) async fn settle(
    state: &AppState,
    job: &Job,
    mut attempt: Settle,
    error: StoreError,
    started: Instant,
) -> Result<Creation, Failed> {
    let deadline = started + SETTLE_BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match tokio::time::timeout(left, attempt.step(state, job)).await {
            Ok(Ok(Settled::Closed)) => {
                if attempt.withdraw {
                    spawn_settle(state, job, attempt);
                }
                return Err(Failed::settled(error));
            }
            Ok(Ok(Settled::Claimed)) => {
                tracing::info!(execution_id = %job.execution_id, "a worker claimed the execution while its submission failed; accepted");
                return Ok(Creation::Created);
            }
            Ok(Err(e)) => {
                tracing::debug!(execution_id = %job.execution_id, error = %e, "settling a failed submission");
                tokio::time::sleep(Duration::from_millis(20).min(left)).await;
            }
            Err(_) => break,
        }
    }
    tracing::warn!(execution_id = %job.execution_id, "submission outcome unknown; answered 503, settling in the background");
    spawn_settle(state, job, attempt);
    Err(Failed {
        error: error.into(),
        settled: false,
    })
}

/// Finishes settling in the background, retrying with backoff for [`BACKGROUND_SETTLE`].
///
/// A worker's claim found here is the residual window (module docs of `submit`): the
/// submission was answered 503 and its execution runs. Without an idempotency key its
/// submitter cannot know it (the 503 names no execution) and, told that nothing was published,
/// may well submit it again: so the execution is cancelled, which stops its provider call at
/// the worker's next cancellation check and ends it `cancelled`. A keyed one runs on: a retry
/// with its key replays it ([`super::keys::replay`]), and that retry is what the 503 asked for.
pub(super) fn spawn_settle(state: &AppState, job: &Job, attempt: Settle) {
    let state = state.clone();
    let job = job.clone();
    tokio::spawn(async move {
        if let Some(Settled::Claimed) = settle_in_background(&state, &job, attempt).await {
            state.inner.metrics.run_after_503(job.key.is_some());
            if job.key.is_some() {
                tracing::warn!(execution_id = %job.execution_id, "an execution answered 503 was claimed by a worker; it runs on for a retry with its key to replay");
            } else {
                tracing::warn!(execution_id = %job.execution_id, "an execution answered 503 was claimed by a worker; cancelling it, as its submitter cannot know it");
                cancel_unanswered(&state, &job).await;
            }
        }
    });
}

/// Cancels the execution of `job`, answered 503 without a key and run by a worker after all
/// (see [`spawn_settle`]), retrying with backoff for [`BACKGROUND_SETTLE`].
async fn cancel_unanswered(state: &AppState, job: &Job) {
    let mut backoff = background_backoff();
    loop {
        let Err(e) = super::stop(state, job.execution_id).await else {
            return;
        };
        let Some(pause) = backoff.next_pause() else {
            tracing::error!(execution_id = %job.execution_id, error = ?e, "could not cancel an execution answered 503; it runs");
            return;
        };
        tracing::debug!(execution_id = %job.execution_id, error = ?e, "cancelling an execution answered 503");
        tokio::time::sleep(pause).await;
    }
}

/// The pauses of the work a submission leaves to the background: from 50 ms, doubling up to
/// [`BACKGROUND_RETRY_CAP`], for [`BACKGROUND_SETTLE`] in all.
fn background_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), BACKGROUND_RETRY_CAP).with_budget(BACKGROUND_SETTLE)
}

/// Stops an execution created for a submission whose idempotency key turned out to be bound
/// to another execution (run in the background): its log is closed (unless the worker handed
/// its job closed it first) and its job withdrawn. Its id was never answered. (Such executions
/// belong to tenants without quotas: no slot to give back.)
pub(super) async fn discard(state: &AppState, tenant: &Tenant, job: &Job) {
    let attempt = Settle::new(true, None, true, tenant);
    if let Some(Settled::Claimed) = settle_in_background(state, job, attempt).await {
        // Only a worker that does not claim keys (an older version) runs such a job.
        tracing::error!(execution_id = %job.execution_id, "an execution whose idempotency key is another's was claimed by a worker");
    }
}

/// Settles with backoff for [`BACKGROUND_SETTLE`]; `None` when that was not enough.
pub(super) async fn settle_in_background(
    state: &AppState,
    job: &Job,
    mut attempt: Settle,
) -> Option<Settled> {
    let mut backoff = background_backoff();
    loop {
        let step = match attempt.step(state, job).await {
            Ok(Settled::Closed) if attempt.withdraw => Err(attempt
                .withdraw_error
                .take()
                .unwrap_or_else(|| StoreError::Unavailable("job not withdrawn yet".into()))),
            step => step,
        };
        match step {
            Ok(settled) => return Some(settled),
            Err(e) => {
                if let Some(pause) = backoff.next_pause() {
                    tracing::debug!(execution_id = %job.execution_id, error = %e, "settling in the background");
                    tokio::time::sleep(pause).await;
                    continue;
                }
                if attempt.log_closed {
                    // Nothing runs: a worker handed the job drops it (its log is closed).
                    tracing::warn!(execution_id = %job.execution_id, error = %e, "could not withdraw the job of a failed submission; its log is closed");
                    return Some(Settled::Closed);
                }
                tracing::error!(execution_id = %job.execution_id, error = %e, "could not settle a failed submission");
                return None;
            }
        }
    }
}

/// The terminal event of an execution whose job could not be queued.
pub(super) fn unqueued_failure() -> EventBody {
    EventBody::Failed {
        error: RuntimeError::unqueued(),
    }
}
