//! The submission flow, independent of HTTP: validate limits and capabilities, bind the
//! idempotency key, admit the execution within its tenant's quotas ([`crate::quota`]), create
//! the log with `execution.accepted`, publish the job.
//!
//! Order matters for the invariants: nothing is published for a request that is rejected, the
//! execution id is minted before the key is bound (so a retry after a crash between the steps
//! heals to the same execution), and the key is released when creation fails so a retry can
//! create it [R 14].
//!
//! A keyed submission binds its key concurrently with creating the log and publishing the job
//! (one round trip to Redis and one to each stream, all at once), except for a tenant with
//! quotas, a key this gateway saw bound lately, and while Redis is out of reach (see
//! [`claim_and_create`]). The job carries the key's
//! binding ([`runtime::KeyClaim`]) and the worker that takes it reads the binding, and makes the
//! same claim when it finds the key free, before it claims the log (`worker::key_guard`), so an
//! execution whose key turns out to be another's never runs, whichever claim lands first. Then:
//! - the key was free, or bound to this execution by the worker: the submission is answered
//!   as if unkeyed (202, or the failure of a failed step, which releases the key when nothing
//!   will run);
//! - the key is bound to another execution (a retry): the new execution is discarded in the
//!   background (its log closed, its job withdrawn) and the
//!   submission is answered with the other execution (a replay, or 422 for another request);
//! - the claim failed (Redis out of reach), so whether the key is bound is unknown: the log is
//!   closed unless a worker claimed the execution first (it bound the key to it, so the
//!   answer is 202), as for a failed publish below; a worker that bound the key meanwhile
//!   frees it again when it finds the log closed unrun.
//!
//! Creating the log and publishing the job run concurrently (one round trip to each stream, at
//! the same time; before, the publish waited for the create's acknowledgement). That is safe
//! because a worker can only run an execution by appending `route.selected` to its log with
//! compare-and-set: a job whose log does not exist cannot run. A worker that receives a job
//! before its log waits for the log a bounded time, then drops the job; when the log appears
//! after such a wait, it first checks that the job was not withdrawn (`worker::runner`).
//!
//! What a failed step means ("outcome unknown" included). A JetStream publish whose
//! acknowledgement timed out (a leader election) may have been stored. The rule kept here: a
//! 503 is answered only once nothing of the execution can run; a 202 only once the execution
//! is queued. So when either step fails, the submission settles the other before answering:
//! - the create failed (refused, or outcome unknown): if its outcome is unknown, the log is
//!   closed first: created already closed, in one write (`execution.accepted` and the unqueued
//!   failure: no worker ever finds it open), or, when the create landed after all, closed by
//!   compare-and-set on `execution.accepted`. Then the job is withdrawn from the queue
//!   (`JobQueue::withdraw`: found by its msg id, deleted). The closed log is what stops every
//!   worker (a worker drops a job whose log is terminal); the withdrawal frees the queue and
//!   is all a refused create needs;
//! - the publish failed with its outcome unknown: the log is closed with the unqueued failure
//!   by compare-and-set on `execution.accepted`. A stored job then finds the log terminal and is
//!   dropped. If a worker claimed the execution first, the close loses, the job was stored
//!   and runs: the submission is answered 202 after all;
//! - the queue refused the job (admission limit): the log is closed; 429.
//!
//! A closed log settles the outcome (nothing will run) even while the job cannot be withdrawn
//! yet: the answer is then a settled 503 and the withdrawal finishes in the background.
//!
//! Settling is bounded so every submit is answered within 2 s ([`SETTLE_BOUND`]). When the
//! outcome is still unknown then (a stream still unreachable), the answer is 503, a background
//! task keeps settling, and the idempotency key stays bound while the outcome is unknown: a
//! keyed retry meanwhile replays the same execution rather than creating a second one, so one
//! key still means at most one execution run (invariant 3). Once it is settled unrun (closed
//! with the unqueued failure right after `execution.accepted`: nothing of it ran or can run),
//! a keyed retry frees the key from it and creates the execution, as the 503's retry hint
//! promised ([`replay`]); an execution that ran is replayed. The alternative, answering 202 and
//! republishing the job in the background until acknowledged, was rejected: a gateway that
//! dies before the republish lands leaves a 202 execution no job will ever run, and no scan
//! covers logs without jobs (the deadline sweeper follows the queue).
//!
//! Known residual window: a write of the submission stored although its acknowledgement was
//! lost (the log's creation, or the job's publish), a worker handed the job that claims the
//! log before this gateway's close lands, and an event store that stays unreachable for this
//! gateway until [`SETTLE_BOUND`]: the submission is answered 503 and the execution runs,
//! once (logged as "an execution answered 503 was claimed by a worker"). Each of the three is
//! needed: when the gateway cannot reach the event store in time, it cannot know whether a
//! worker will write after `execution.accepted` first. A create refused outright (no
//! responders) is not in it: the log is then created closed, and no worker can claim it.
//!
//! Store errors stay typed here until the flow has decided what they mean: `AlreadyExists` while
//! healing a crash window is the one expected outcome (a concurrent retry healed it first);
//! every other store error is a failure and converts to its one [`ApiError`]. Events are written
//! through [`runtime::EventWriter`], which assigns their sequences and times.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::event::EventBody;
use protocol::fingerprint::{request_fingerprint, sha256_hex};
use protocol::snapshot::ExecutionSubmission;
use protocol::{
    ExecutionId, ExecutionRequest, ExecutionStatus, RuntimeError, Sequence, Tenant, Timestamp,
};
use runtime::backoff::Backoff;
use runtime::{EventWriter, IdempotencyRecord, Job, KeyClaim, StoreError};

use crate::error::ApiError;
use crate::quota;
use crate::state::AppState;

/// Runs the flow for a parsed request.
pub async fn submit(
    state: &AppState,
    tenant: &Tenant,
    request: ExecutionRequest,
    idempotency_key: Option<&str>,
    traceparent: Option<String>,
) -> Result<ExecutionSubmission, ApiError> {
    let inner = &state.inner;
    let started = Instant::now();
    let deadline_ms = request
        .deadline_ms
        .unwrap_or(inner.limits.default_deadline_ms);
    if deadline_ms > inner.limits.max_deadline_ms {
        return Err(ApiError::InvalidRequest(
            "Request deadline exceeds the configured maximum",
        ));
    }
    if !inner.capabilities.can_serve(&request) {
        return Err(ApiError::CapabilityUnavailable);
    }
    let mut request = request;
    let mut rebinds = 0;
    loop {
        match submit_once(
            state,
            tenant,
            request,
            idempotency_key,
            traceparent.clone(),
            started,
            deadline_ms,
        )
        .await?
        {
            Submitted::Answered(submission) => return Ok(submission),
            Submitted::KeyOfUnrun(unrun) if rebinds < MAX_REBINDS => {
                // The key's execution never ran and never will (closed unqueued after the
                // submission was answered 503): free the key and submit again.
                if let Some(claim) = &unrun.key {
                    release_key(state, &claim.key_hash, unrun.execution_id).await;
                }
                tracing::info!(execution_id = %unrun.execution_id, "idempotency key bound to an execution closed unrun; binding it anew");
                rebinds += 1;
                request = unrun.request.clone();
            }
            Submitted::KeyOfUnrun(unrun) => {
                return Ok(ExecutionSubmission {
                    execution_id: unrun.execution_id,
                    status: ExecutionStatus::Failed,
                    created_at: unrun.accepted_at,
                    idempotent_replay: true,
                });
            }
        }
    }
}

/// How many times one keyed submission frees its key from an execution closed unrun and binds
/// it anew (each time a concurrent retry may have bound it to another one of those).
const MAX_REBINDS: u8 = 2;

/// What one pass of [`submit`] came to.
enum Submitted {
    Answered(ExecutionSubmission),
    /// The key is bound to an execution of the same request that was closed unqueued right
    /// after `execution.accepted` (its submission was answered 503, or 429): the job as that
    /// submission built it (its id, its key binding), so the key can be freed from it.
    KeyOfUnrun(Box<Job>),
}

/// One pass of [`submit`]: a fresh execution id, its key bound, its log created and its job
/// published.
async fn submit_once(
    state: &AppState,
    tenant: &Tenant,
    request: ExecutionRequest,
    idempotency_key: Option<&str>,
    traceparent: Option<String>,
    started: Instant,
    deadline_ms: u64,
) -> Result<Submitted, ApiError> {
    let id = ExecutionId::new_random();
    let created_at = runtime::writer::acceptance_time();
    let mut job = Job {
        execution_id: id,
        request,
        accepted_at: created_at,
        deadline_at: Timestamp::from_unix_millis(
            created_at
                .unix_millis()
                .saturating_add(i64::try_from(deadline_ms).unwrap_or(i64::MAX)),
        ),
        traceparent,
        key: None,
    };
    let Some(key) = idempotency_key else {
        create_fresh(state, tenant, &job, started)
            .await
            .map_err(|f| f.error)?;
        return Ok(Submitted::Answered(accepted(id, created_at)));
    };
    let key_hash = idempotency_key_hash(tenant, key);
    let record = IdempotencyRecord {
        fingerprint: request_fingerprint(&job.request),
        execution_id: id,
        created_at,
    };
    let key = KeyClaim {
        key_hash: key_hash.clone(),
        record: record.clone(),
    };
    job.key = Some(key.clone());
    let job = Arc::new(job);
    let claimed = claim_and_create(state, tenant, &job, &key, started).await;
    match claimed {
        (Ok(Bound::This), created) => {
            if let Some(Err(failed)) = created {
                if failed.settled {
                    release_key(state, &key_hash, id).await;
                }
                return Err(failed.error);
            }
            Ok(Submitted::Answered(accepted(id, created_at)))
        }
        (Ok(Bound::Another(existing)), _) => {
            // A retry: an execution created for it is discarded by `claim_and_create`.
            if existing.fingerprint != record.fingerprint {
                return Err(ApiError::IdempotencyConflict);
            }
            replay(state, tenant, existing, key_hash, Arc::unwrap_or_clone(job)).await
        }
        (Err(unbound), created) => {
            // Whether the key was bound is unknown, and a worker may bind it and run the
            // execution: close the log first, unless a worker claimed it already.
            let failed = match created {
                None => return Err(unbound.into()),
                Some(Ok(())) => {
                    // Only the concurrent order creates before the claim is known, and only for
                    // tenants without quotas: no slot to give back.
                    let attempt = Settle::new(true, None, true, tenant);
                    match settle(state, &job, attempt, unbound, started).await {
                        Ok(_) => return Ok(Submitted::Answered(accepted(id, created_at))),
                        Err(failed) => failed,
                    }
                }
                Some(Err(failed)) => failed,
            };
            if failed.settled {
                release_key(state, &key_hash, id).await;
            }
            Err(failed.error)
        }
    }
}

/// Whom a claimed idempotency key is bound to.
enum Bound {
    /// The execution of this submission: the key was free, or a worker that took the job first
    /// bound it.
    This,
    /// Another execution: this submission is a retry of it.
    Another(IdempotencyRecord),
}

/// Binds `key`, which `job` carries, and creates the execution ([`create_fresh`]); the creation's
/// outcome is `None` when it was not attempted, or when the key is another's (an execution
/// created for it is then discarded in the background, see [`discard`]).
///
/// While the key store answers, both run at once: the job carries its key and the worker that
/// takes it binds the key too before it runs anything (`worker::key_guard`), so the answer
/// costs no round trip for the key. The key is claimed first, and nothing is created unless it
/// is this execution's, for a tenant with quotas (a replay takes no token and no slot), for a
/// key this gateway saw bound lately (most likely a retry, `crate::recent_keys`), and after a
/// claim failed (Redis out of reach): while Redis stays down, keyed submits publish nothing.
/// The first claim that succeeds again restores the concurrent order.
async fn claim_and_create(
    state: &AppState,
    tenant: &Tenant,
    job: &Arc<Job>,
    key: &KeyClaim,
    started: Instant,
) -> (Result<Bound, StoreError>, Option<Result<(), Failed>>) {
    let inner = &state.inner;
    let bound = |claimed: Result<Option<IdempotencyRecord>, StoreError>| {
        claimed.map(|existing| match existing {
            Some(existing) if existing.execution_id != job.execution_id => Bound::Another(existing),
            _ => Bound::This,
        })
    };
    // A tenant with quotas claims first too: a replay must take no token and no slot
    // (`crate::quota`), and its admission costs a round trip of its own anyway. So does a key
    // seen bound lately: most likely a retry, whose execution would only be discarded.
    let concurrent = inner.keys_reachable.load(Ordering::Relaxed)
        && inner.backend.quotas.limits(tenant).is_none()
        && !inner.recent_keys.contains(&key.key_hash);
    let (claimed, created) = if concurrent {
        // Owned, so that a retry's answer need not wait for the creation of its discarded
        // execution (which may take up to the settle bound while a stream is failing).
        let mut creating = Box::pin({
            let (state, tenant, job) = (state.clone(), tenant.clone(), Arc::clone(job));
            async move { create_fresh(&state, &tenant, &job, started).await }
        });
        let claim = inner.backend.idempotency.claim(&key.key_hash, &key.record);
        tokio::pin!(claim);
        let (claimed, created) = tokio::select! {
            claimed = &mut claim => (bound(claimed), None),
            created = &mut creating => (bound(claim.await), Some(created)),
        };
        if let Ok(Bound::Another(_)) = claimed {
            // A retry: answered at once; its execution is discarded once it exists.
            let (state, tenant, job) = (state.clone(), tenant.clone(), Arc::clone(job));
            tokio::spawn(async move {
                let created = match created {
                    Some(created) => created,
                    None => creating.await,
                };
                if created.is_ok() {
                    discard(&state, &tenant, &job).await;
                }
            });
            (claimed, None)
        } else {
            let created = match created {
                Some(created) => created,
                None => creating.await,
            };
            (claimed, Some(created))
        }
    } else {
        let claimed = bound(
            inner
                .backend
                .idempotency
                .claim(&key.key_hash, &key.record)
                .await,
        );
        let created = match claimed {
            Ok(Bound::This) => Some(create_fresh(state, tenant, job, started).await),
            _ => None,
        };
        (claimed, created)
    };
    inner
        .keys_reachable
        .store(claimed.is_ok(), Ordering::Relaxed);
    if claimed.is_ok() {
        inner.recent_keys.insert(&key.key_hash);
    }
    (claimed, created)
}

/// Frees `key_hash` if it is bound to `id`, an execution of which nothing will run, so that a
/// retry can create the execution [R 14].
async fn release_key(state: &AppState, key_hash: &str, id: ExecutionId) {
    if let Err(e) = state.inner.backend.idempotency.release(key_hash, id).await {
        tracing::warn!(execution_id = %id, error = %e, "could not release idempotency key after a failed submit");
    }
}

/// The stored name of an idempotency key: scoped by tenant, so the same key from two tenants
/// names two executions. The default tenant keeps the hash keys had before tenants existed
/// (`sha256("\0" + key)`), so an upgrade keeps anonymous deployments' keys; other tenants hash
/// `tenant + "\0" + key`. Tenant names and keys never contain NUL and tenant names are never
/// empty, so no two (tenant, key) pairs share an input.
pub fn idempotency_key_hash(tenant: &Tenant, key: &str) -> String {
    if tenant.is_default() {
        sha256_hex(format!("\u{0}{key}").as_bytes())
    } else {
        sha256_hex(format!("{tenant}\u{0}{key}").as_bytes())
    }
}

fn accepted(execution_id: ExecutionId, created_at: Timestamp) -> ExecutionSubmission {
    ExecutionSubmission {
        execution_id,
        status: ExecutionStatus::Accepted,
        created_at,
        idempotent_replay: false,
    }
}

/// What creating an execution's log found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creation {
    /// The log was created and the job published (or a worker already claimed the execution
    /// while the submission was learning the outcome of a failed step).
    Created,
    /// The log already existed; a concurrent healer created it and publishes its job.
    AlreadyExists,
}

/// A submission that did not create its execution.
#[derive(Debug)]
struct Failed {
    error: ApiError,
    /// `true`: nothing of the execution will ever run (its job is not queued and its log, if
    /// any, is closed or will be), so the idempotency key may be released. `false`: the outcome
    /// could not be learnt within [`SETTLE_BOUND`]; a background task keeps settling it, and
    /// the key stays bound so that a keyed retry replays this execution instead of creating a
    /// second one (invariant 3).
    settled: bool,
}

impl Failed {
    fn settled(error: impl Into<ApiError>) -> Self {
        Self {
            error: error.into(),
            settled: true,
        }
    }
}

/// How long after its start a submission may spend learning what became of a failed step:
/// every submit is answered within 2 s (contract section 8), and each store request is bounded
/// by the backend's request timeout (1.5 s in `nats` mode), so this leaves the last step
/// its share of the bound.
const SETTLE_BOUND: Duration = Duration::from_millis(1750);

/// How long a background task keeps settling a submission answered 503 whose outcome was
/// unknown (a JetStream election lasts seconds; the duplicate window, which `withdraw` relies
/// on, is two minutes).
const BACKGROUND_SETTLE: Duration = Duration::from_secs(60);

/// The longest pause between two background settling attempts. Short: when the streams come
/// back after an election, a worker may be handed the job at once, and the first of the two
/// to write after `execution.accepted` decides whether the execution runs.
const BACKGROUND_RETRY_CAP: Duration = Duration::from_millis(500);

/// Creates the log of an execution whose id was just minted, within its tenant's quotas
/// ([`crate::quota`]): an existing log is a failure.
async fn create_fresh(
    state: &AppState,
    tenant: &Tenant,
    job: &Job,
    started: Instant,
) -> Result<(), Failed> {
    within_quota(
        state,
        tenant,
        job,
        create_unique(state, tenant, job, started),
    )
    .await
}

/// Runs `create` (the creation of `job`'s execution) once `tenant`'s quotas admit it, and gives
/// the slot back when the creation failed with nothing of it left to run; a creation whose
/// outcome is unknown keeps its slot (the execution may still run).
async fn within_quota<T>(
    state: &AppState,
    tenant: &Tenant,
    job: &Job,
    create: impl Future<Output = Result<T, Failed>>,
) -> Result<T, Failed> {
    quota::admit(state, tenant, job)
        .await
        .map_err(Failed::settled)?;
    let created = create.await;
    if let Err(failed) = &created
        && failed.settled
    {
        quota::release(state, tenant, job.execution_id).await;
    }
    created
}

/// [`create_fresh`] once admitted.
async fn create_unique(
    state: &AppState,
    tenant: &Tenant,
    job: &Job,
    started: Instant,
) -> Result<(), Failed> {
    match create_and_publish(state, tenant, job, started).await? {
        Creation::Created => Ok(()),
        Creation::AlreadyExists => {
            // Impossible for a random id; the job published beside it must not run.
            let queue = state.inner.backend.queue.clone();
            let stray = job.clone();
            tokio::spawn(async move {
                if let Err(e) = queue.withdraw(&stray).await {
                    tracing::error!(execution_id = %stray.execution_id, error = %e, "could not withdraw a job");
                }
            });
            Err(Failed::settled(StoreError::Misconfigured(format!(
                "freshly minted execution id {} already has a log",
                job.execution_id
            ))))
        }
    }
}

/// Creates the log and publishes the job concurrently: one round trip to each stream at the
/// same time instead of one after the other. Safe because a worker claims an execution only by
/// appending to its log with compare-and-set: a job whose log does not exist cannot run, and
/// the worker waits for the log a bounded time (see `worker::runner`).
///
/// When either step fails, the submission learns what became of the other before it answers
/// ([`settle`]): a 503 means nothing will run, a 202 that the execution is queued or already
/// claimed by a worker.
async fn create_and_publish(
    state: &AppState,
    tenant: &Tenant,
    job: &Job,
    started: Instant,
) -> Result<Creation, Failed> {
    let backend = &state.inner.backend;
    let (created, published) = tokio::join!(
        EventWriter::create(
            backend.store.clone(),
            job.execution_id,
            job.accepted_at,
            tenant,
        ),
        backend.queue.publish(job),
    );
    match (created, published) {
        (Ok(_), Ok(())) => Ok(Creation::Created),
        // Only while healing: a concurrent retry created the log; our publish, if stored, is
        // the same job under the same msg id.
        (Err(StoreError::AlreadyExists), _) => Ok(Creation::AlreadyExists),
        (Ok(mut writer), Err(e @ StoreError::AdmissionFull)) => {
            // Refused by the queue's limit: certainly not queued. Close the log.
            if let Err(close) = writer.append_once(unqueued_failure()).await {
                tracing::warn!(execution_id = %job.execution_id, error = %close, "could not close unqueued execution; retrying in the background");
                spawn_settle(state, job, Settle::closing(writer, tenant));
            }
            Err(Failed::settled(e))
        }
        (Ok(writer), Err(e)) => {
            // The job may or may not be stored (a lost acknowledgement): close the log first.
            // Whoever appends sequence 2 decides: this gateway's failure (a stored job then
            // finds the log terminal and is dropped) or a worker's claim (the job was stored
            // and runs: the submission is accepted after all).
            tracing::warn!(execution_id = %job.execution_id, error = %e, "job publish failed; settling");
            settle(state, job, Settle::closing(writer, tenant), e, started).await
        }
        (Err(e), published) => {
            tracing::warn!(execution_id = %job.execution_id, error = %e, "log creation failed; settling");
            let withdraw = !matches!(published, Err(StoreError::AdmissionFull));
            if !matches!(e, StoreError::Unavailable(_) | StoreError::Closed) {
                // A refusal: nothing was stored. Only the job must go.
                let attempt = Settle::new(withdraw, None, false, tenant);
                return settle(state, job, attempt, e, started).await;
            }
            // The create's outcome is unknown (a timeout may hide a stored event): create the
            // log closed, or find it and close it, so a create that lands late finds the
            // subject taken (compare-and-set on an empty subject); then withdraw the job.
            let attempt = Settle::new(withdraw, None, true, tenant);
            settle(state, job, attempt, e, started).await
        }
    }
}

/// What is left to do to settle a failed submission.
struct Settle {
    /// The job may be queued and must be withdrawn (after the log is closed, see
    /// [`Settle::step`]).
    withdraw: bool,
    /// The writer of the log (kept across retries, so a close that landed unacknowledged is
    /// recognised as this writer's own).
    writer: Option<EventWriter>,
    /// Whether the log may exist (or appear) and must be closed.
    close_log: bool,
    /// Whether this settle closed the log: nothing of the execution can run any more, so a
    /// withdrawal still to do is cleanup (a worker drops a job whose log is terminal).
    log_closed: bool,
    /// Why the last withdrawal failed behind a closed log, for the warning should it never
    /// succeed.
    withdraw_error: Option<StoreError>,
    /// The tenant the log belongs to, should settling have to create it.
    owner: Tenant,
}

/// What settling found.
enum Settled {
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
    fn new(withdraw: bool, writer: Option<EventWriter>, close_log: bool, owner: &Tenant) -> Self {
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
    fn closing(writer: EventWriter, owner: &Tenant) -> Self {
        Self::new(false, Some(writer), true, owner)
    }

    /// One attempt; a store error means "not known yet, try again". The log is closed before
    /// the job is withdrawn: the closed log is what keeps every worker from running the
    /// execution (a worker drops a job whose log is terminal), whatever became of the job;
    /// withdrawing it only frees the queue. So once the log is closed the answer is `Closed`
    /// even while the withdrawal still fails (`withdraw` stays set for the caller to finish in
    /// the background).
    async fn step(&mut self, state: &AppState, job: &Job) -> Result<Settled, StoreError> {
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
    async fn close(&mut self, state: &AppState, job: &Job) -> Result<Settled, StoreError> {
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
    fn from_head(last: Sequence, terminal: bool) -> Option<Self> {
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
async fn settle(
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
fn spawn_settle(state: &AppState, job: &Job, attempt: Settle) {
    let state = state.clone();
    let job = job.clone();
    tokio::spawn(async move {
        if let Some(Settled::Claimed) = settle_in_background(&state, &job, attempt).await {
            tracing::warn!(execution_id = %job.execution_id, "an execution answered 503 was claimed by a worker");
        }
    });
}

/// Stops an execution created for a submission whose idempotency key turned out to be bound
/// to another execution (run in the background): its log is closed (unless the worker handed
/// its job closed it first) and its job withdrawn. Its id was never answered. (Such executions
/// belong to tenants without quotas: no slot to give back.)
async fn discard(state: &AppState, tenant: &Tenant, job: &Job) {
    let attempt = Settle::new(true, None, true, tenant);
    if let Some(Settled::Claimed) = settle_in_background(state, job, attempt).await {
        // Only a worker that does not claim keys (an older version) runs such a job.
        tracing::error!(execution_id = %job.execution_id, "an execution whose idempotency key is another's was claimed by a worker");
    }
}

/// Settles with backoff for [`BACKGROUND_SETTLE`]; `None` when that was not enough.
async fn settle_in_background(state: &AppState, job: &Job, mut attempt: Settle) -> Option<Settled> {
    let mut backoff = Backoff::new(Duration::from_millis(50), BACKGROUND_RETRY_CAP)
        .with_budget(BACKGROUND_SETTLE);
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
fn unqueued_failure() -> EventBody {
    EventBody::Failed {
        error: RuntimeError::unqueued(),
    }
}

/// Whether a log is `execution.accepted` closed at once with the unqueued failure: its
/// submission gave it up (answered 503 or 429) and nothing of it ran or ever will (no worker
/// appends after a terminal event).
fn closed_unrun(state: &protocol::materialize::Materializer) -> bool {
    state.last_sequence() == Sequence(2)
        && state.snapshot().error.as_ref() == Some(&RuntimeError::unqueued())
}

/// The key is bound to an execution with the same request: answer with its current status,
/// unless that execution was closed unrun ([`closed_unrun`]): a client that followed the
/// 503's retry hint gets its execution created rather than a replay of a failure it was
/// told to retry (the key is then freed from it and bound anew by [`submit`]; invariant 3
/// holds: the unrun execution never runs).
async fn replay(
    state: &AppState,
    tenant: &Tenant,
    existing: IdempotencyRecord,
    key_hash: String,
    job: Job,
) -> Result<Submitted, ApiError> {
    let inner = &state.inner;
    let id = existing.execution_id;
    let replayed = |status| ExecutionSubmission {
        execution_id: id,
        status,
        created_at: existing.created_at,
        idempotent_replay: true,
    };
    // The job as the first submitter built it: same id, same acceptance time, same deadline,
    // same key binding.
    let span = job.deadline_at.unix_millis() - job.accepted_at.unix_millis();
    let job = Job {
        execution_id: id,
        accepted_at: existing.created_at,
        deadline_at: Timestamp::from_unix_millis(
            existing.created_at.unix_millis().saturating_add(span),
        ),
        key: Some(KeyClaim {
            key_hash,
            record: existing.clone(),
        }),
        ..job
    };
    let waited = Instant::now();
    let status = loop {
        match inner.backend.store.state(id).await? {
            Some(m) if closed_unrun(&m) => return Ok(Submitted::KeyOfUnrun(Box::new(job))),
            Some(m) => break m.status(),
            None if waited.elapsed() < inner.limits.replay_wait => {
                // A concurrent first submission bound the key and is creating the log.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            None if inner.backend.heal_missing => {
                // The first submitter died between binding the key and creating the log:
                // create it now, under the recorded id and time.
                // `AlreadyExists`: a concurrent retry healed it first. Any other store error
                // (a `Conflict` or `Violation` included) is a failure, never a replay.
                let heal = create_and_publish(state, tenant, &job, Instant::now());
                match within_quota(state, tenant, &job, heal)
                    .await
                    .map_err(|f| f.error)?
                {
                    Creation::Created | Creation::AlreadyExists => {
                        return Ok(Submitted::Answered(replayed(ExecutionStatus::Accepted)));
                    }
                }
            }
            None => {
                return Err(ApiError::QueueFull(
                    "Idempotent execution is no longer retained",
                ));
            }
        }
    };
    if status == ExecutionStatus::Accepted && inner.backend.heal_missing {
        // The first submitter may have died after creating the log but before publishing the
        // job; the queue absorbs the duplicate if it did publish.
        inner.backend.queue.publish(&job).await?;
    }
    Ok(Submitted::Answered(replayed(status)))
}

/// Cancels an execution [R 21, 41]. Returns `false` when it is unknown or already terminal.
pub async fn cancel(state: &AppState, id: ExecutionId) -> Result<bool, ApiError> {
    let backend = &state.inner.backend;
    let Some(head) = backend.store.head(id).await? else {
        return Ok(false);
    };
    if head.terminal {
        return Ok(false);
    }
    if head.last_sequence == Sequence(1) {
        // Still queued: close the log ourselves; the worker that later takes the job finds it
        // terminal and drops it.
        let mut writer = EventWriter::from_head(backend.store.clone(), id, head);
        let cancelled = EventBody::Failed {
            error: RuntimeError::cancelled(),
        };
        match writer.append_once(cancelled.clone()).await {
            Ok(()) => {
                runtime::ended::log(id, &cancelled);
                state.inner.metrics.cancellation();
                quota::release_ended(state, id).await;
                return Ok(true);
            }
            Err(StoreError::Conflict { terminal: true, .. }) => return Ok(false),
            Err(StoreError::Conflict { .. }) => {} // a runner claimed it: signal the runner
            Err(e) => return Err(e.into()),
        }
    }
    backend.cancel.request(id).await?;
    state.inner.metrics.cancellation();
    Ok(true)
}
