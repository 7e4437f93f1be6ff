//! The submission's idempotency key: binding it while the execution is created
//! ([`claim_and_create`], concurrently or first), freeing it when nothing will run, and
//! answering a retry whose key is bound already ([`replay`]).
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::fingerprint::sha256_hex;
use protocol::snapshot::ExecutionSubmission;
use protocol::{ExecutionId, ExecutionStatus, RuntimeError, Sequence, Tenant, Timestamp};
use runtime::{EventWriter, IdempotencyRecord, Job, KeyClaim, StoreError};

use super::create::{Failed, create_fresh};
use super::settle::{STEP_BOUND, discard, unqueued_failure, within_bound};
use crate::error::ApiError;
use crate::quota;
use crate::state::AppState;

use super::Submitted;

/// Whom a claimed idempotency key is bound to.
pub(super) enum Bound {
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
/// takes it binds the key too before it runs anything (the worker's key guard), so the answer
/// costs no round trip for the key. The key is claimed first, and nothing is created unless it
/// is this execution's, for a tenant with quotas (a replay takes no token and no slot), for a
/// key this gateway saw bound lately (most likely a retry, `crate::recent_keys`), and after a
/// claim failed (Redis out of reach): while Redis stays down, keyed submits publish nothing.
/// The first claim that succeeds again restores the concurrent order.
pub(super) async fn claim_and_create(
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

/// The answer to a retry whose key's execution has no readable log yet (retryable).
const STILL_BEING_CREATED: ApiError =
    ApiError::Unavailable("The execution of this idempotency key is still being created");

/// How often a replay looks again for the log of a key bound a moment ago.
const REPLAY_POLL: Duration = Duration::from_millis(5);

/// Whether `existing` was bound less than `replay_wait` ago (by the acceptance time it
/// records), so its first submission may still be creating the log. Older, a missing log
/// means its submitter died before creating it, or answered 503 and is settling it (creating
/// it closed, as the heal in [`replay`] does).
fn bound_lately(existing: &IdempotencyRecord, replay_wait: Duration) -> bool {
    let age_ms = Timestamp::now()
        .unix_millis()
        .saturating_sub(existing.created_at.unix_millis());
    u128::try_from(age_ms).unwrap_or(0) < replay_wait.as_millis()
}

/// Frees `key_hash` if it is bound to `id`, an execution of which nothing will run, so that a
/// retry can create the execution [R 14].
pub(super) async fn release_key(state: &AppState, key_hash: &str, id: ExecutionId) {
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

/// Whether a log is `execution.accepted` closed at once with the unqueued failure: its
/// submission gave it up (answered 503 or 429) and nothing of it ran or ever will (no worker
/// appends after a terminal event).
pub(super) fn closed_unrun(state: &protocol::materialize::Materializer) -> bool {
    state.last_sequence() == Sequence(2)
        && state.snapshot().error.as_ref() == Some(&RuntimeError::unqueued())
}

/// The key is bound to an execution with the same request: answer with its current status,
/// unless that execution was closed unrun ([`closed_unrun`]): a client that followed the
/// 503's retry hint gets its execution created rather than a replay of a failure it was
/// told to retry (the key is then freed from it and bound anew by [`submit`]; invariant 3
/// holds: the unrun execution never runs).
pub(super) async fn replay(
    state: &AppState,
    tenant: &Tenant,
    existing: IdempotencyRecord,
    key_hash: String,
    job: Job,
    started: Instant,
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
    let store = &inner.backend.store;
    let mut closed_here = false;
    let status = loop {
        match within_bound(started, "reading the key's execution", store.state(id)).await? {
            Some(m) if closed_unrun(&m) => return Ok(Submitted::KeyOfUnrun(Box::new(job))),
            Some(m) => break m.status(),
            None if bound_lately(&existing, inner.limits.replay_wait) => {
                // A concurrent first submission bound the key and is creating the log, or
                // settling a failed creation. Waited for within the submission's bound; a 503
                // past it (nothing was created here), and a retry heals once the binding is
                // older than the replay wait.
                if started.elapsed() + REPLAY_POLL >= STEP_BOUND {
                    return Err(STILL_BEING_CREATED);
                }
                tokio::time::sleep(REPLAY_POLL).await;
            }
            None if inner.backend.heal_missing && !closed_here => {
                // Bound long enough ago that its submission has answered, and still no log:
                // the submitter died before creating it, or answered 503 and is settling it.
                // Either way the execution was never answered as accepted: close it unrun
                // (created closed, as its settling would, so the two never race to different
                // outcomes; its job, if queued, is dropped by the worker handed it), then the
                // key is bound anew to a fresh execution ([`submit`]). A store error other than
                // `AlreadyExists` (a `Conflict` or `Violation` included) is a failure.
                let closed = within_bound(
                    started,
                    "closing the key's missing log",
                    EventWriter::create_closed(
                        store.clone(),
                        id,
                        existing.created_at,
                        tenant,
                        unqueued_failure(),
                    ),
                )
                .await;
                match closed {
                    Ok(()) => {
                        tracing::info!(execution_id = %id, "closed the missing log of an idempotency key's execution unrun");
                        quota::release(state, tenant, id).await;
                        return Ok(Submitted::KeyOfUnrun(Box::new(job)));
                    }
                    // Created meanwhile (by its submission, its settling, or a concurrent
                    // retry): answer with what it says now.
                    Err(StoreError::AlreadyExists) => closed_here = true,
                    Err(e) => return Err(e.into()),
                }
            }
            None if closed_here => {
                // Created, but not readable yet.
                return Err(STILL_BEING_CREATED);
            }
            None if !inner.backend.heal_missing => {
                // The memory store evicted the execution (only ended ones are evicted): the
                // key goes with it, as the reference's does [R 13], and is bound anew to a new
                // execution ([`submit`]). Answering "no longer retained" (retryable) instead
                // kept a client that followed the hint retrying for the key's whole retention.
                return Ok(Submitted::KeyOfGone(Box::new(job)));
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
        within_bound(
            started,
            "republishing the job",
            inner.backend.queue.publish(&job),
        )
        .await?;
    }
    Ok(Submitted::Answered(replayed(status)))
}
