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
//! [`keys::claim_and_create`]). The job carries the key's
//! binding ([`runtime::KeyClaim`]) and the worker that takes it reads the binding, and makes the
//! same claim when it finds the key free, before it claims the log (the worker's key guard), so an
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
//! after such a wait, it first checks that the job was not withdrawn (the worker's runner).
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
//! Settling is bounded so every submit is answered within 2 s ([`settle::SETTLE_BOUND`]). When the
//! outcome is still unknown then (a stream still unreachable), the answer is 503, a background
//! task keeps settling, and the idempotency key stays bound while the outcome is unknown: a
//! keyed retry meanwhile replays the same execution rather than creating a second one, so one
//! key still means at most one execution run (invariant 3). Once it is settled unrun (closed
//! with the unqueued failure right after `execution.accepted`: nothing of it ran or can run),
//! a keyed retry frees the key from it and creates the execution, as the 503's retry hint
//! promised ([`keys::replay`]); an execution that ran is replayed. The alternative, answering 202 and
//! republishing the job in the background until acknowledged, was rejected: a gateway that
//! dies before the republish lands leaves a 202 execution no job will ever run, and no scan
//! covers logs without jobs (the deadline sweeper follows the queue).
//!
//! Known residual window: a write of the submission stored although its acknowledgement was
//! lost or came after [`settle::STEP_BOUND`] (the log's creation, or the job's publish), a worker handed the job that claims the
//! log before this gateway's close lands, and an event store that stays unreachable for this
//! gateway until [`settle::SETTLE_BOUND`]: the submission is answered 503 and a worker runs the
//! execution (logged as "an execution answered 503 was claimed by a worker"). Each of the three
//! is needed: when the gateway cannot reach the event store in time, it cannot know whether a
//! worker will write after `execution.accepted` first. A create refused outright (no
//! responders) is not in it: the log is then created closed, and no worker can claim it. The
//! background settle that finds the claim cancels an unkeyed execution (its submitter cannot
//! know it, and may submit it again: the provider call is stopped, the execution ends
//! `cancelled`); a keyed one runs on, once, for a retry with its key to replay. Each is counted
//! (`mrt_submissions_run_after_503_total{keyed}`). Overload opens the window too (store round
//! trips past the bounds), for many submissions at once (BENCHMARKS.md, "Overload on two cores").
//!
//! A retry whose key is bound to an execution without a log waits for the log while the
//! binding is younger than the replay wait (its first submission may still be creating it),
//! within the submit bound (a 503 past it). Older, the first submission has answered and never
//! with an acceptance: it died between binding the key and creating the log (a crash window),
//! or answered 503 and is settling. The retry then closes that execution unrun, created closed
//! exactly as its settling would, and binds the key to a fresh execution ([`keys::replay`]).
//!
//! Every step's store request ends by [`settle::STEP_BOUND`] after the submission started
//! ([`settle::within_bound`]), unanswered counting as outcome unknown: a JetStream publish alone
//! may take twice the request timeout, so the backend's own timeouts do not bound a submit.
//! The submission starts once its request is parsed and fingerprinted: the bound is the
//! store's, and that CPU work, tenths of a second for a 1 MiB body in a debug build, would
//! otherwise leave a large request's steps no time (every retry answered 503 on a busy
//! machine, each one spending the bound on its own fingerprint again).
//!
//! Store errors stay typed here until the flow has decided what they mean: `AlreadyExists` while
//! closing a missing log is the one expected outcome (the log was created meanwhile); every
//! other store error is a failure and converts to its one [`ApiError`]. Events are written
//! through [`runtime::EventWriter`], which assigns their sequences and times.
//!
//! Files: this one has the flow's entry points ([`submit`], [`cancel`]) and builds the job
//! ([`new_job`]); [`keys`] binds and frees the idempotency key and replays retries;
//! [`create`] creates the log and publishes the job within the tenant's quotas; [`settle`]
//! settles a failed step before the answer.

use std::sync::Arc;
use std::time::Instant;

use protocol::event::EventBody;
use protocol::fingerprint::request_fingerprint;
use protocol::snapshot::ExecutionSubmission;
use protocol::{
    ExecutionId, ExecutionRequest, ExecutionStatus, RuntimeError, Sequence, Tenant, Timestamp,
};
use runtime::{EventWriter, IdempotencyRecord, Job, KeyClaim, StoreError};

use crate::error::ApiError;
use crate::quota;
use crate::state::AppState;

mod create;
mod keys;
mod settle;

use create::create_fresh;
use keys::{Bound, claim_and_create, release_key, replay};
use settle::{Settle, settle};

pub use keys::idempotency_key_hash;

/// Runs the flow for a parsed request, `request_bytes` the size of the JSON it was parsed from
/// (which decides whether its fingerprint is computed on the blocking pool, [`runtime::apart`]).
pub async fn submit(
    state: &AppState,
    tenant: &Tenant,
    request: ExecutionRequest,
    request_bytes: usize,
    idempotency_key: Option<&str>,
    traceparent: Option<String>,
) -> Result<ExecutionSubmission, ApiError> {
    let inner = &state.inner;
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
    // A keyed request's fingerprint, computed once (a rebound key's execution has the same
    // request) and, like the parse, before the submission's clock starts: the bounds that
    // clock sets are for the store's answers, and a large request's fingerprint takes
    // milliseconds of CPU (tenths of a second in a debug build).
    let (mut request, fingerprint) = match idempotency_key {
        Some(_) => {
            let (request, fingerprint) = crate::api::apart(request_bytes, move || {
                let fingerprint = request_fingerprint(&request);
                (request, fingerprint)
            })
            .await?;
            (request, Some(fingerprint))
        }
        None => (request, None),
    };
    let keyed = idempotency_key.zip(fingerprint.as_deref());
    let started = Instant::now();
    let mut rebinds = 0;
    loop {
        match submit_once(
            state,
            tenant,
            request,
            keyed,
            traceparent.clone(),
            started,
            deadline_ms,
        )
        .await?
        {
            Submitted::Answered(submission) => return Ok(submission),
            // The key's execution never ran and never will (closed unqueued after the
            // submission was answered 503), or is gone: free the key and submit again.
            Submitted::KeyOfUnrun(stale) | Submitted::KeyOfGone(stale) if rebinds < MAX_REBINDS => {
                if let Some(claim) = &stale.key {
                    release_key(state, &claim.key_hash, stale.execution_id).await;
                }
                tracing::info!(execution_id = %stale.execution_id, "idempotency key bound to an execution closed unrun or no longer retained; binding it anew");
                rebinds += 1;
                request = stale.request.clone();
            }
            Submitted::KeyOfGone(_) => {
                return Err(ApiError::QueueFull(
                    "Idempotent execution is no longer retained",
                ));
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
    /// The key is bound to an execution the store no longer holds (the memory store evicted
    /// it, ended): the job as that submission built it, so the key can be freed from it.
    KeyOfGone(Box<Job>),
}

/// One pass of [`submit`]: a fresh execution id, its key bound, its log created and its job
/// published. `keyed` is the idempotency key and the request's fingerprint.
async fn submit_once(
    state: &AppState,
    tenant: &Tenant,
    request: ExecutionRequest,
    keyed: Option<(&str, &str)>,
    traceparent: Option<String>,
    started: Instant,
    deadline_ms: u64,
) -> Result<Submitted, ApiError> {
    let id = ExecutionId::new_random();
    let created_at = runtime::writer::acceptance_time();
    let mut job = new_job(id, tenant, request, created_at, deadline_ms, traceparent);
    let Some((key, fingerprint)) = keyed else {
        create_fresh(state, tenant, &job, started)
            .await
            .map_err(|f| f.error)?;
        return Ok(Submitted::Answered(accepted(id, created_at)));
    };
    let key_hash = idempotency_key_hash(tenant, key);
    let record = IdempotencyRecord {
        fingerprint: fingerprint.to_owned(),
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
            replay(
                state,
                tenant,
                existing,
                key_hash,
                Arc::unwrap_or_clone(job),
                started,
            )
            .await
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

fn accepted(execution_id: ExecutionId, created_at: Timestamp) -> ExecutionSubmission {
    ExecutionSubmission {
        execution_id,
        status: ExecutionStatus::Accepted,
        created_at,
        idempotent_replay: false,
    }
}

/// The job of a new execution `id` of `tenant` accepted at `accepted_at`, due `deadline_ms`
/// later, not yet bound to an idempotency key. (A replay rebuilds the first submitter's job
/// from this one: `keys::replay`.)
fn new_job(
    id: ExecutionId,
    tenant: &Tenant,
    request: ExecutionRequest,
    accepted_at: Timestamp,
    deadline_ms: u64,
    traceparent: Option<String>,
) -> Job {
    Job {
        execution_id: id,
        request,
        accepted_at,
        deadline_at: Timestamp::from_unix_millis(
            accepted_at
                .unix_millis()
                .saturating_add(i64::try_from(deadline_ms).unwrap_or(i64::MAX)),
        ),
        traceparent,
        key: None,
        // The default tenant's jobs read as before (no member).
        tenant: (!tenant.is_default()).then(|| tenant.clone()),
    }
}

/// Cancels an execution [R 21, 41]. Returns `false` when it is unknown or already terminal.
pub async fn cancel(state: &AppState, id: ExecutionId) -> Result<bool, ApiError> {
    let cancelled = stop(state, id).await?;
    if cancelled {
        state.inner.metrics.cancellation();
    }
    Ok(cancelled)
}

/// Stops an execution (a cancel request's work, counted by [`cancel`]; the gateway's own
/// cancels, [`settle`]'s and those of an embedded gateway's shutdown, are not requests).
/// Returns `false` when it is unknown or already terminal.
pub(crate) async fn stop(state: &AppState, id: ExecutionId) -> Result<bool, ApiError> {
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
                runtime::ended::record(id, &cancelled);
                quota::release_ended(state, id).await;
                return Ok(true);
            }
            Err(StoreError::Conflict { terminal: true, .. }) => return Ok(false),
            Err(StoreError::Conflict { .. }) => {} // a runner claimed it: signal the runner
            Err(e) => return Err(e.into()),
        }
    }
    backend.cancel.request(id).await?;
    Ok(true)
}
