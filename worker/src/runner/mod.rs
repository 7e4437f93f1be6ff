//! One execution from job to terminal event.
//!
//! The runner claims the log, routes to candidates in order, runs attempts through each
//! provider's gate, and appends exactly one terminal event. Decisions made here and nowhere
//! else:
//! - routing [R 25-34]: attempts = 1 without fallback, else `min(max_attempts, candidates)`;
//!   fallback only after a retryable error, never once output was exposed, and not when the
//!   retry budget (measured from routing start) is spent;
//! - the deadline is one timer over the whole execution from acceptance, queueing included;
//!   exhaustion is terminal `deadline_exceeded`, never retried [R 40];
//! - cancellation [R 41] and worker loss (architecture invariant 4): a redelivered job whose log
//!   shows a started attempt fails with `internal_error` "remote outcome is unknown" instead of
//!   calling the provider again. Failure messages name the cause: a worker that stopped
//!   heartbeating, or an event store that was unreachable;
//! - a job whose log does not exist yet: the gateway creates the log and publishes the job
//!   concurrently, so a job can arrive first. The runner waits for the log (polling its head 1 ms
//!   apart a few times, then with backoff up to 500 ms, heartbeating the delivery meanwhile) for
//!   at most [`RunnerSettings::log_wait`], then drops the job: a log that has not appeared by
//!   then was never created (the gateway answered 503 and withdrew the job). A read that fails
//!   meanwhile is retried within the same bound; a delivery that gives up before its claim (or
//!   stops for a shutdown) hands its job back at once ([`RunOutcome::Unclaimed`]). When the log
//!   does appear after a wait, the runner first asks the queue whether the job was withdrawn (the
//!   gateway withdraws the job of a submission whose create failed or whose outcome it could not
//!   learn) and never claims a withdrawn job (it also asks on every poll past the first quick
//!   ones, so a withdrawn job does not hold a slot). A job whose log is there at the first look
//!   is claimed at once: no extra round trip on the common path.
//! - a job carrying an idempotency key ([`runtime::KeyClaim`]): the runner reads the key's
//!   binding while it reads the log's head and, unless the key was found bound already, binds
//!   it too before the log is claimed ([`crate::key_guard`]); when it is bound to another
//!   execution the log is closed with the unqueued failure and the job dropped, never run.
//!
//! Events are written through a pipelined [`EventWriter`] where the store's appends take a round
//! trip (JetStream): provider output is handed over without waiting for each acknowledgement
//! (events queued behind an append in flight go in the next one, as one run), while a route
//! selection is acknowledged before its provider is called and the terminal event before the
//! job is acknowledged. A write failure (fenced, limit, store down) stops the attempt as soon as
//! the appender reports it, even while the provider is quiet; the log is then closed from the
//! last acknowledged event.
//!
//! Files: this one has the runner, its settings and outcomes, claiming the log and appending
//! the terminal event; `claim.rs` waits for a job's log and for a redelivery's previous
//! holder; `attempt.rs` routes over the candidates and turns adapter events into runtime
//! events.

use std::sync::Arc;
use std::time::Duration;

use protocol::event::EventBody;
use protocol::{ErrorCode, RuntimeError, Target, Timestamp};
use runtime::{
    CancelBus, DeliveryHandle, EventStore, EventWriter, IdempotencyStore, Job, Pace, WriteError,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::holder;
use crate::instrument::{self};
use crate::key_guard::{self, KeyHolder};
use crate::registry::ProviderRegistry;

mod attempt;
mod claim;

/// What the job loop should do with the delivery afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The log is terminal: acknowledge.
    Finished,
    /// Nothing to do (already terminal, a duplicate of a live attempt, or gone): acknowledge.
    Dropped,
    /// The store could not take the terminal event: do not acknowledge, so the job is
    /// redelivered and the next holder closes the log.
    Abandoned,
    /// This delivery stopped before it claimed the log (its reads kept failing, or the worker
    /// is shutting down): nothing ran here, so hand the job back for the next delivery to
    /// come at once rather than when the lease lapses (a lapse costs the execution the whole
    /// lease, 30 s by default).
    Unclaimed,
}

/// Runner settings.
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    /// How long an interrupted attempt may run its adapter cleanup (fal's cancel PUT has its own
    /// 5 s bound) before it is dropped.
    pub cleanup_grace: Duration,
    /// How long a job whose log does not exist is kept waiting for it before it is dropped
    /// (see the module docs): well beyond a submission's 2 s bound and a JetStream election.
    pub log_wait: Duration,
    /// How long an execution's output is held between two appends ([`EventWriter::paced`],
    /// [`runtime::pace`]). Off by default here (output leaves as soon as the previous append
    /// is acknowledged); the `worker` binary paces adaptively unless told otherwise.
    pub append_pace: Pace,
}

impl Default for RunnerSettings {
    fn default() -> Self {
        Self {
            cleanup_grace: Duration::from_secs(6),
            log_wait: Duration::from_secs(10),
            append_pace: Pace::Off,
        }
    }
}

/// See the module docs.
#[derive(derive_more::Debug)]
pub struct Runner {
    #[debug(skip)]
    registry: Arc<ProviderRegistry>,
    #[debug(skip)]
    store: Arc<dyn EventStore>,
    #[debug(skip)]
    cancel_bus: Arc<dyn CancelBus>,
    /// Where idempotency keys are bound ([`crate::key_guard`]).
    #[debug(skip)]
    keys: Arc<dyn IdempotencyStore>,
    settings: RunnerSettings,
    /// Cancels every running execution (shutdown after the grace period).
    #[debug(skip)]
    abort_all: CancellationToken,
    /// Which executions run here, and which this process gave up ([`crate::holder`]).
    #[debug(skip)]
    holders: holder::Holders,
}

/// How long after its deadline a redelivered execution whose holder still writes is left to
/// that holder (which closes it at the deadline itself) before this delivery closes it.
const DEADLINE_GRACE_MS: i64 = 2_000;

/// Why routing stopped without success.
enum Stop {
    /// The execution fails with this error.
    Failed(RuntimeError),
    /// Writing failed; the runner decides what that means.
    Write(WriteError),
}

impl From<WriteError> for Stop {
    fn from(e: WriteError) -> Self {
        Stop::Write(e)
    }
}

/// The failure of a redelivered job whose previous holder had started: its lease lapsed, so
/// that worker stopped heartbeating (it died, or lost its connection to NATS).
pub fn interrupted_error() -> RuntimeError {
    RuntimeError::new(
        ErrorCode::InternalError,
        "Execution was interrupted: its worker stopped heartbeating; remote outcome is unknown",
        false,
    )
}

/// The failure of an execution whose events the store would not take even after retries.
/// `provider_may_have_run`: an attempt was routed, so a provider may have accepted the call.
pub fn store_unreachable_error(provider_may_have_run: bool) -> RuntimeError {
    let message = if provider_may_have_run {
        "Execution event store was unreachable; remote outcome is unknown"
    } else {
        "Execution event store was unreachable"
    };
    RuntimeError::new(ErrorCode::InternalError, message, false)
}

fn limit_error() -> RuntimeError {
    RuntimeError::new(
        ErrorCode::QueueFull,
        "Execution event log limit was reached",
        false,
    )
}

struct Guard<'a> {
    bus: &'a dyn CancelBus,
    id: protocol::ExecutionId,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.bus.unwatch(self.id);
    }
}

impl Runner {
    pub fn new(
        registry: Arc<ProviderRegistry>,
        store: Arc<dyn EventStore>,
        cancel_bus: Arc<dyn CancelBus>,
        keys: Arc<dyn IdempotencyStore>,
        settings: RunnerSettings,
    ) -> Self {
        Self {
            registry,
            store,
            cancel_bus,
            keys,
            settings,
            abort_all: CancellationToken::new(),
            holders: holder::Holders::default(),
        }
    }

    /// Cancels every running execution (used when the shutdown grace period expires): the
    /// token every execution checks before it starts and the claim's waits select on, then
    /// each running execution's own token, which is all a running execution waits on.
    pub fn abort_all(&self) {
        self.abort_all.cancel();
        self.holders.cancel_all();
    }

    /// Runs `job` without a queue delivery (a withdrawal cannot be checked). `delivered` is 1
    /// on first delivery.
    pub async fn run(&self, job: &Job, delivered: u32) -> RunOutcome {
        self.run_delivery(job, delivered, None).await
    }

    /// Runs one delivery of `job`; `held` is the delivery's handle, asked whether the job was
    /// withdrawn when its log had to be waited for. `delivered` is 1 on first delivery.
    pub async fn run_delivery(
        &self,
        job: &Job,
        delivered: u32,
        held: Option<&dyn DeliveryHandle>,
    ) -> RunOutcome {
        let id = job.execution_id;
        // A keyed job's binding is read beside the log's head (see `key_guard`).
        let peeked = async {
            match &job.key {
                Some(claim) => key_guard::peek(&*self.keys, claim).await,
                None => None,
            }
        };
        let (head, peeked) = tokio::join!(self.await_log(id, held), peeked);
        let head = match head {
            Ok(head) => head,
            Err(outcome) => return outcome,
        };
        // A redelivery that reads its log as never started confirms it on the latest head: a
        // replica behind the leader can hide the previous holder's `route.selected`, and this
        // delivery would then lose its claim to it and be dropped (acknowledged), leaving a
        // log whose holder is gone open until its deadline. One more read, for redeliveries.
        let head = if delivered > 1 && !head.terminal && head.last_sequence.get() <= 1 {
            match self.store.latest_head(id).await {
                Ok(Some(latest)) => latest,
                // The claim's compare-and-set still guards what this read could not.
                Ok(None) | Err(_) => head,
            }
        } else {
            head
        };
        if head.terminal {
            return RunOutcome::Dropped;
        }
        if delivered > 1 {
            instrument::redelivered();
        }
        if head.last_sequence.get() > 1 {
            if delivered <= 1 {
                // A duplicate job while another attempt owns the log.
                return RunOutcome::Dropped;
            }
            // The lease of a started execution lapsed. Its holder may still be alive (its
            // heartbeats were lost to a consumer leader election or a partition): wait for it
            // while it is running here or still writing (see `holder`).
            let head = match self.await_holder(job, head, held).await {
                Ok(head) => head,
                Err(outcome) => return outcome,
            };
            // The previous holder is gone mid-execution: the provider may have accepted the
            // call. Past the deadline, the deadline is what ended it (contract: no worker ran
            // it). A holder in this process that gave the job up because the event store was
            // unreachable is named as such.
            let error = if job.deadline_at.unix_millis() <= Timestamp::now().unix_millis() {
                RuntimeError::deadline_exceeded()
            } else if self.holders.gave_up_unreachable(id) {
                store_unreachable_error(true)
            } else {
                interrupted_error()
            };
            let mut writer = EventWriter::from_head(Arc::clone(&self.store), id, head)
                .paced(self.settings.append_pace.clone())
                .pipelined();
            return self
                .finish(&mut writer, job.accepted_at, EventBody::Failed { error })
                .await;
        }
        let mut writer = EventWriter::from_head(Arc::clone(&self.store), id, head)
            .paced(self.settings.append_pace.clone())
            .pipelined();
        let Some(claim) = &job.key else {
            return self.run_claimable(job, writer).await;
        };
        // The gateway binds the key while this job travels: unless it was found bound already,
        // bind it here too before the log is claimed, and never run an execution whose key is
        // another's.
        let claimed = match peeked {
            Some(holder) => Ok(holder),
            None => key_guard::claim(&*self.keys, &*self.store, claim, &self.abort_all).await,
        };
        instrument::key_claim(&claimed);
        match claimed {
            Ok(KeyHolder::This { bound_here }) => {
                let outcome = self.run_claimable(job, writer).await;
                if bound_here && outcome == RunOutcome::Dropped {
                    key_guard::release_if_unqueued(&*self.keys, &*self.store, claim).await;
                }
                outcome
            }
            Ok(KeyHolder::Closed) => RunOutcome::Dropped,
            Ok(KeyHolder::Another) => {
                tracing::info!(execution_id = %id, "idempotency key bound to another execution; not run");
                // Whoever closes the log first (this worker or the gateway) wins; the other's
                // compare-and-set loses, which is fine.
                let unqueued = EventBody::Failed {
                    error: RuntimeError::unqueued(),
                };
                if let Err(e) = writer.append(unqueued).await
                    && !matches!(e, WriteError::Fenced)
                {
                    tracing::warn!(execution_id = %id, error = %e, "cannot close the log of an execution whose key is another's");
                    return RunOutcome::Abandoned;
                }
                RunOutcome::Dropped
            }
            Err(e) => {
                tracing::warn!(execution_id = %id, error = %e, "cannot claim the idempotency key; handing the job back");
                RunOutcome::Unclaimed
            }
        }
    }

    /// Runs `job` from its log's `execution.accepted` (the end `writer` starts from), once
    /// nothing forbids claiming it: its deadline, a cancellation, then routing and attempts.
    async fn run_claimable(&self, job: &Job, writer: EventWriter) -> RunOutcome {
        let id = job.execution_id;
        instrument::queue_wait(job.accepted_at);
        // Watch only once this delivery may claim the log (still before the claim itself): a
        // dropped duplicate must not unwatch, and so disarm, the live attempt's cancel token.
        let cancel = self.cancel_bus.watch(id);
        let _guard = Guard {
            bus: &*self.cancel_bus,
            id,
        };
        let _running = self.holders.running(id, &cancel);
        let outcome = self.run_claimed(job, writer, cancel).await;
        if outcome == RunOutcome::Abandoned {
            self.holders.gave_up(id);
        }
        outcome
    }

    /// [`Runner::run_claimable`] once the execution is watched for cancellation and known to
    /// run here.
    async fn run_claimed(
        &self,
        job: &Job,
        mut writer: EventWriter,
        cancel: CancellationToken,
    ) -> RunOutcome {
        let deadline_in = Duration::from_millis(
            u64::try_from(job.deadline_at.unix_millis() - Timestamp::now().unix_millis())
                .unwrap_or(0),
        );
        if deadline_in.is_zero() {
            return self
                .finish(
                    &mut writer,
                    job.accepted_at,
                    EventBody::Failed {
                        error: RuntimeError::deadline_exceeded(),
                    },
                )
                .await;
        }
        // An `abort_all` after this execution was marked running cancelled `cancel`; one
        // before shows here.
        if cancel.is_cancelled() || self.abort_all.is_cancelled() {
            return self
                .finish(
                    &mut writer,
                    job.accepted_at,
                    EventBody::Failed {
                        error: RuntimeError::cancelled(),
                    },
                )
                .await;
        }
        let deadline = Instant::now() + deadline_in;
        let attempt_cancel = CancellationToken::new();
        let write_failure = writer.failure();
        let ending = {
            let route = self.route(&mut writer, job, attempt_cancel.clone());
            tokio::pin!(route);
            let mut cancelled = runtime::own_wakes::cancelled(&cancel);
            let mut write_failed = runtime::own_wakes::own_wakes(write_failure.failed());
            // Interrupts are polled first: once one has fired, the attempt must not make more
            // progress (such as taking a freed gate slot and calling the provider) before it is
            // told to stop. `abort_all` reaches a running execution through `cancel`
            // ([`holder::Holders::cancel_all`]): every branch here is polled on every wake-up,
            // and a token shared by the process would be a lock all its executions contend for.
            // The execution's own token, and the writer's failure (a wait woken by each of its
            // appends), are polled only once woken (`OwnWakes`), not for each delta the
            // route's provider sends.
            let ending = tokio::select! {
                biased;
                () = &mut cancelled => Ending::Interrupted(RuntimeError::cancelled()),
                () = tokio::time::sleep_until(deadline) => Ending::Interrupted(RuntimeError::deadline_exceeded()),
                e = &mut write_failed => Ending::WriteFailed(e),
                result = &mut route => Ending::Routed(result),
            };
            if matches!(ending, Ending::Interrupted(_) | Ending::WriteFailed(_)) {
                attempt_cancel.cancel();
                // Let the adapter run its bounded cleanup, then drop the attempt.
                let _ = tokio::time::timeout(self.settings.cleanup_grace, &mut route).await;
            }
            ending
        };
        let terminal = match ending {
            Ending::Routed(Ok(target)) => EventBody::Completed { target },
            Ending::Routed(Err(Stop::Failed(error))) | Ending::Interrupted(error) => {
                EventBody::Failed { error }
            }
            Ending::Routed(Err(Stop::Write(WriteError::Closed)))
            | Ending::WriteFailed(WriteError::Closed) => return RunOutcome::Finished,
            Ending::Routed(Err(Stop::Write(e))) | Ending::WriteFailed(e) => {
                // Continue from the last acknowledged event; what may have landed after it is
                // sent again first (`EventWriter::settle`), so a write of this worker's that
                // landed late is continued after, not taken for another writer's.
                writer.recover();
                match write_failure_terminal(&writer, e) {
                    Some(terminal) => terminal,
                    None => return RunOutcome::Dropped,
                }
            }
        };
        self.finish(&mut writer, job.accepted_at, terminal).await
    }

    /// Appends the terminal event, after everything submitted before it. If an earlier event
    /// failed (the terminal was then not written), the log is closed with the failure that
    /// write error means instead. Events whose append had an unknown outcome are settled first
    /// (`EventWriter::settle`): if that stores everything before the terminal event, the
    /// terminal event itself is appended again; if it was among them, the log is closed.
    async fn finish(
        &self,
        writer: &mut EventWriter,
        accepted_at: Timestamp,
        terminal: EventBody,
    ) -> RunOutcome {
        let terminal_sequence = writer.last_sequence().next();
        let metered = terminal.clone();
        let error = match writer.append(terminal.clone()).await {
            Ok(()) => {
                instrument::terminal(&metered, accepted_at);
                runtime::ended::record(writer.execution_id(), &metered);
                return RunOutcome::Finished;
            }
            Err(WriteError::Fenced) => return RunOutcome::Dropped,
            // A terminal event of this writer whose outcome was unknown had landed.
            Err(WriteError::Closed) => return RunOutcome::Finished,
            Err(e) => e,
        };
        writer.recover();
        // What may have landed of the failed run (the terminal event included) is settled
        // before anything else is decided.
        match writer.settle().await {
            Ok(()) if writer.closed() => return RunOutcome::Finished,
            Ok(()) => {}
            Err(WriteError::Fenced) => return RunOutcome::Dropped,
            Err(WriteError::Closed) => return RunOutcome::Finished,
            Err(e) => {
                tracing::error!(execution_id = %writer.execution_id(), error = %e, "cannot append terminal event");
                return RunOutcome::Abandoned;
            }
        }
        // Everything before the terminal event is stored now (settled, or acknowledged): the
        // terminal event itself was not sent (it was queued behind the failed run) or was
        // refused; it is tried once more. Otherwise the failure the write error means closes
        // the log.
        let closing = if writer.last_sequence().next() == terminal_sequence
            && !matches!(error, WriteError::Fenced)
        {
            Some(terminal)
        } else {
            write_failure_terminal(writer, error.clone())
        };
        if let Some(fallback) = closing {
            let metered = fallback.clone();
            return match writer.append(fallback).await {
                Ok(()) => {
                    instrument::terminal(&metered, accepted_at);
                    runtime::ended::record(writer.execution_id(), &metered);
                    RunOutcome::Finished
                }
                Err(WriteError::Fenced) => RunOutcome::Dropped,
                Err(WriteError::Closed) => RunOutcome::Finished,
                Err(e) => {
                    tracing::error!(execution_id = %writer.execution_id(), error = %e, "cannot append terminal event");
                    RunOutcome::Abandoned
                }
            };
        }
        if matches!(error, WriteError::Fenced) {
            return RunOutcome::Dropped;
        }
        tracing::error!(execution_id = %writer.execution_id(), error = %error, "cannot append terminal event");
        RunOutcome::Abandoned
    }
}

enum Ending {
    Routed(Result<Target, Stop>),
    Interrupted(RuntimeError),
    /// The writer's pipeline failed while the attempt ran.
    WriteFailed(WriteError),
}

/// The terminal event that closes a log whose write failed with `error`; `None` when the
/// writer was fenced (another writer owns the log: write nothing).
fn write_failure_terminal(writer: &EventWriter, error: WriteError) -> Option<EventBody> {
    let id = writer.execution_id();
    let error = match error {
        WriteError::Fenced | WriteError::Closed => return None,
        WriteError::Limit => limit_error(),
        WriteError::Store(
            e @ (runtime::StoreError::Unavailable(_) | runtime::StoreError::Closed),
        ) => {
            tracing::error!(execution_id = %id, error = %e, "event store unreachable");
            // Past sequence 1 a route was selected (acknowledged before its provider was
            // called): the provider may have been called.
            store_unreachable_error(writer.last_sequence().get() > 1)
        }
        WriteError::Store(e) => {
            tracing::error!(execution_id = %id, error = %e, "event storage failed");
            RuntimeError::new(
                ErrorCode::InternalError,
                "Execution event storage failed",
                false,
            )
        }
    };
    Some(EventBody::Failed { error })
}
