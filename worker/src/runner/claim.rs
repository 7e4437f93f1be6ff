//! Before a delivery is claimed: waiting for its log (a job can arrive a few milliseconds
//! before it) and, for a redelivery, for its previous holder to be gone
//! ([`crate::holder`]); a job its submitter withdrew while its log is still missing is dropped
//! without waiting for the log any longer.
//!
//! A read that fails here (the store slow or unreachable) is retried like a missing log, within
//! [`super::RunnerSettings::log_wait`]; a delivery that stops before its claim (those retries
//! spent, or the worker shutting down) ran nothing, so it hands its job back
//! ([`RunOutcome::Unclaimed`]) for the next delivery to come at once, not when its lease
//! lapses.

use std::time::Duration;

use protocol::Timestamp;
use runtime::{DeliveryHandle, Job, LogHead};
use tokio::time::Instant;

use crate::holder;

use super::{DEADLINE_GRACE_MS, RunOutcome, Runner};

impl Runner {
    /// Waits, for a redelivered job whose log is open past `execution.accepted`, while its
    /// previous holder may still be alive (see [`crate::holder`]); returns the log's head
    /// once it is not, or the outcome when the log was closed meanwhile. The polls read the
    /// head cheaply; the head it decides on is the store's latest
    /// ([`runtime::EventStore::latest_head`]).
    pub(super) async fn await_holder(
        &self,
        job: &Job,
        head: LogHead,
        held: Option<&dyn DeliveryHandle>,
    ) -> Result<LogHead, RunOutcome> {
        let id = job.execution_id;
        let lease = held.and_then(DeliveryHandle::lease);
        let mut head = head;
        let mut announced = false;
        loop {
            let here = self.holders.is_running(id);
            let past_deadline =
                Timestamp::now().unix_millis() >= job.deadline_at.unix_millis() + DEADLINE_GRACE_MS;
            let writing = !self.holders.gave_up_unreachable(id)
                && lease.is_some_and(|lease| holder::written_within(&head, lease));
            if past_deadline || !(here || writing) {
                // The head read may have come from a replica behind the leader: an older head
                // than the holder wrote reads as silence, and closing the log there would lose
                // its compare-and-set to the holder's writes, leaving a log whose holder really
                // is gone to its deadline. Close only on the latest head.
                match self.store.latest_head(id).await {
                    Ok(Some(latest)) if latest.terminal => return Err(RunOutcome::Dropped),
                    Ok(None) => return Err(RunOutcome::Dropped),
                    Ok(Some(latest)) if latest.last_sequence > head.last_sequence => {
                        head = latest;
                        continue;
                    }
                    Ok(Some(latest)) => return Ok(latest),
                    // Its compare-and-set still guards the closing append.
                    Err(_) if past_deadline => return Ok(head),
                    Err(e) => {
                        tracing::debug!(execution_id = %id, error = %e, "cannot read the log's latest head");
                    }
                }
            }
            if (here || writing) && !announced {
                announced = true;
                if here {
                    tracing::info!(execution_id = %id, "lease of an execution running here lapsed (its heartbeats did not reach the job queue: a consumer leader election or a partition); it keeps running");
                } else {
                    tracing::info!(execution_id = %id, "redelivered while its previous holder still writes (its lease was lost, not its life); waiting for it");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(holder::POLL) => {}
                () = self.abort_all.cancelled() => return Err(RunOutcome::Unclaimed),
            }
            match self.store.head(id).await {
                Ok(Some(read)) if read.terminal => return Err(RunOutcome::Dropped),
                Ok(Some(read)) if read.last_sequence > head.last_sequence => head = read,
                // Nothing newer, or a replica behind what was read before: the decision above
                // asks for the latest head.
                Ok(_) => {}
                // The holder's writes face the same store: keep waiting (this delivery is
                // heartbeated meanwhile), bounded by the deadline.
                Err(e) => {
                    tracing::debug!(execution_id = %id, error = %e, "cannot read the log's head")
                }
            }
        }
    }

    /// The end of the execution's log, waiting up to [`RunnerSettings::log_wait`] for a log
    /// that does not exist yet (see the module docs). Only the end of the log matters here,
    /// which every store reads cheaply.
    ///
    /// A log found, open or closed, is returned without asking the queue about the job: a
    /// submitter that withdraws a job closes its log first (or never created it), and a claim
    /// is a compare-and-set on the log, which a closed log refuses, also where this read came
    /// from a replica that had not applied the close. (Asking cost every job that came before
    /// its log one more round trip, to the jobs stream's leader with replicas; and a leader
    /// that had not applied the job yet, although a follower's consumer had delivered it,
    /// answered "no such message": a live job was dropped, its execution left to its deadline.)
    pub(super) async fn await_log(
        &self,
        id: protocol::ExecutionId,
        held: Option<&dyn DeliveryHandle>,
    ) -> Result<LogHead, RunOutcome> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(1);
        let mut polls = 0u32;
        // Reads that failed: the first is logged, the count once the wait ends in one.
        let mut failed = 0u32;
        loop {
            let error = match self.store.head(id).await {
                Ok(Some(head)) => {
                    if polls > 0 || failed > 0 {
                        tracing::debug!(execution_id = %id, last_sequence = head.last_sequence.get(), "log found");
                    }
                    return Ok(head);
                }
                Ok(None) if started.elapsed() < self.settings.log_wait => {
                    polls += 1;
                    // A withdrawn job's log may never come: once the quick polls are spent,
                    // stop waiting as soon as the job is found withdrawn.
                    if polls > QUICK_POLLS
                        && let Some(held) = held
                        && let Ok(true) = withdrawn(id, held).await
                    {
                        return Err(RunOutcome::Dropped);
                    }
                    self.pause(&mut delay, polls >= QUICK_POLLS).await?;
                    continue;
                }
                Ok(None) => {
                    tracing::info!(execution_id = %id, "job without a log; dropped");
                    return Err(RunOutcome::Dropped);
                }
                Err(e) => e,
            };
            failed += 1;
            if started.elapsed() >= self.settings.log_wait {
                tracing::warn!(execution_id = %id, failed, %error, "cannot read execution state; handing the job back");
                return Err(RunOutcome::Unclaimed);
            }
            if failed == 1 {
                tracing::warn!(execution_id = %id, %error, "cannot read execution state; retrying");
            }
            delay = delay.max(FAILED_READ_PAUSE);
            self.pause(&mut delay, true).await?;
        }
    }

    /// Sleeps `delay` (doubled after, up to 500 ms, when `backing_off`), or hands the job back
    /// when the worker shuts down meanwhile (leaving it to another worker).
    async fn pause(&self, delay: &mut Duration, backing_off: bool) -> Result<(), RunOutcome> {
        tokio::select! {
            () = tokio::time::sleep(*delay) => {}
            () = self.abort_all.cancelled() => return Err(RunOutcome::Unclaimed),
        }
        if backing_off {
            *delay = (*delay * 2).min(Duration::from_millis(500));
        }
        Ok(())
    }
}

/// The first pause after a failed read: a store that timed out is busy, not a millisecond
/// from answering.
const FAILED_READ_PAUSE: Duration = Duration::from_millis(50);

/// Polls of a missing log 1 ms apart, without asking the queue about the job, before the
/// backoff starts: a job usually reaches the worker only a few milliseconds before its log
/// (the gateway publishes both at once, and the jobs stream answers faster under load), and
/// each of these polls is one direct get. Past them, every poll of a log still missing also
/// asks whether the job was withdrawn.
const QUICK_POLLS: u32 = 8;

/// Whether the submitter of the job `held` delivers withdrew it (logged as a drop when it did).
async fn withdrawn(
    id: protocol::ExecutionId,
    held: &dyn DeliveryHandle,
) -> Result<bool, runtime::StoreError> {
    let withdrawn = held.withdrawn().await?;
    if withdrawn {
        tracing::info!(execution_id = %id, "job withdrawn by its submitter; dropped");
    }
    Ok(withdrawn)
}
