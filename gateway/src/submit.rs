//! The submission flow, independent of HTTP: validate limits and capabilities, bind the
//! idempotency key, admit the execution within its tenant's quotas ([`crate::quota`]), create
//! the log with `execution.accepted`, publish the job.
//!
//! Order matters for the invariants: nothing is published for a request that is rejected, the
//! execution id is minted before the key is bound (so a retry after a crash between the steps
//! heals to the same execution), and the key is released when creation fails so a retry can
//! create it [R 14].
//!
//! Store errors stay typed here until the flow has decided what they mean: `AlreadyExists` while
//! healing a crash window is the one expected outcome (a concurrent retry healed it first);
//! every other store error is a failure and converts to its one [`ApiError`]. Events are written
//! through [`runtime::EventWriter`], which assigns their sequences and times.

use std::time::{Duration, Instant};

use protocol::event::EventBody;
use protocol::fingerprint::{request_fingerprint, sha256_hex};
use protocol::snapshot::ExecutionSubmission;
use protocol::{
    ErrorCode, ExecutionId, ExecutionRequest, ExecutionStatus, RuntimeError, Sequence, Tenant,
    Timestamp,
};
use runtime::{EventWriter, IdempotencyRecord, Job, StoreError};

use crate::error::ApiError;
use crate::metrics::Metrics;
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
    let result = submit_inner(state, tenant, request, idempotency_key, traceparent).await;
    match &result {
        Ok(s) if s.idempotent_replay => Metrics::inc(&inner.metrics.submissions_replayed),
        Ok(_) => Metrics::inc(&inner.metrics.submissions_accepted),
        Err(_) => Metrics::inc(&inner.metrics.submissions_rejected),
    }
    result
}

async fn submit_inner(
    state: &AppState,
    tenant: &Tenant,
    request: ExecutionRequest,
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
    if !inner.registry.can_serve(&request) {
        return Err(ApiError::CapabilityUnavailable);
    }
    let id = ExecutionId::new_random();
    let created_at = runtime::writer::acceptance_time();
    let job = Job {
        execution_id: id,
        request,
        accepted_at: created_at,
        deadline_at: Timestamp::from_unix_millis(
            created_at
                .unix_millis()
                .saturating_add(i64::try_from(deadline_ms).unwrap_or(i64::MAX)),
        ),
        traceparent,
    };
    let Some(key) = idempotency_key else {
        create_fresh(state, tenant, &job).await?;
        return Ok(accepted(id, created_at));
    };
    let key_hash = idempotency_key_hash(tenant, key);
    let record = IdempotencyRecord {
        fingerprint: request_fingerprint(&job.request),
        execution_id: id,
        created_at,
    };
    let claimed = inner.backend.idempotency.claim(&key_hash, &record).await?;
    match claimed {
        None => {
            if let Err(e) = create_fresh(state, tenant, &job).await {
                if let Err(release) = inner.backend.idempotency.release(&key_hash, id).await {
                    tracing::warn!(error = %release, "could not release idempotency key after a failed submit");
                }
                return Err(e);
            }
            Ok(accepted(id, created_at))
        }
        Some(existing) if existing.fingerprint != record.fingerprint => {
            Err(ApiError::IdempotencyConflict)
        }
        Some(existing) => replay(state, tenant, existing, job).await,
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
    /// The log was created and the job published.
    Created,
    /// The log already existed; nothing was written or published.
    AlreadyExists,
}

/// Creates the log of an execution whose id was just minted, within the tenant's quotas: an
/// existing log is a failure.
async fn create_fresh(state: &AppState, tenant: &Tenant, job: &Job) -> Result<(), ApiError> {
    quota::within(state, tenant, job, async {
        match create_and_publish(state, tenant, job).await? {
            Creation::Created => Ok(()),
            Creation::AlreadyExists => Err(ApiError::Internal(format!(
                "freshly minted execution id {} already has a log",
                job.execution_id
            ))),
        }
    })
    .await
}

/// Creates the log, owned by `tenant`, and publishes the job. If publishing fails, the log is closed with a
/// failure so nothing is left waiting for a job that will never come.
async fn create_and_publish(
    state: &AppState,
    tenant: &Tenant,
    job: &Job,
) -> Result<Creation, StoreError> {
    let backend = &state.inner.backend;
    let created = EventWriter::create(
        backend.store.clone(),
        job.execution_id,
        job.accepted_at,
        tenant,
    )
    .await;
    let mut writer = match created {
        Ok(writer) => writer,
        Err(StoreError::AlreadyExists) => return Ok(Creation::AlreadyExists),
        Err(e) => {
            // A create that timed out may still have been stored (the ack was lost, e.g. in a
            // leader election): the submit is answered 503 and no job is published, so such
            // a log would stay open forever. Close it if it exists.
            close_unqueued_later(state, job);
            return Err(e);
        }
    };
    if let Err(e) = backend.queue.publish(job).await {
        tracing::warn!(execution_id = %job.execution_id, error = %e, "job publish failed");
        if let Err(close) = writer.append_once(unqueued_failure()).await {
            tracing::warn!(execution_id = %job.execution_id, error = %close, "could not close unqueued execution; retrying in the background");
            close_unqueued_later(state, job);
        }
        return Err(e);
    }
    Ok(Creation::Created)
}

/// The terminal event of an execution whose job could not be queued.
fn unqueued_failure() -> EventBody {
    EventBody::Failed {
        error: RuntimeError::new(
            ErrorCode::InternalError,
            "Execution could not be queued",
            false,
        ),
    }
}

/// Closes the log of a submit answered 503 in the background, if the log exists and is still
/// open: its `execution.accepted` may be stored even though the store reported a failure, and
/// no job will run it. Retries while the store is unavailable (bounded by the writer's retry
/// limit); a missing log or one another writer extended (a job that was queued after all and
/// is running) ends the attempt. Fenced by compare-and-set like every append.
fn close_unqueued_later(state: &AppState, job: &Job) {
    let store = state.inner.backend.store.clone();
    let (id, accepted_at) = (job.execution_id, job.accepted_at);
    tokio::spawn(async move {
        let mut writer = EventWriter::resume(store, id, Sequence(1), accepted_at);
        match writer.append(unqueued_failure()).await {
            Ok(()) => tracing::info!(execution_id = %id, "closed the log of an unqueued execution"),
            Err(runtime::WriteError::Store(StoreError::NotFound) | runtime::WriteError::Fenced) => {
            }
            Err(e) => {
                tracing::warn!(execution_id = %id, error = %e, "could not close unqueued execution")
            }
        }
    });
}

/// The key is bound to an execution with the same request: answer with its current status.
async fn replay(
    state: &AppState,
    tenant: &Tenant,
    existing: IdempotencyRecord,
    job: Job,
) -> Result<ExecutionSubmission, ApiError> {
    let inner = &state.inner;
    let id = existing.execution_id;
    let replayed = |status| ExecutionSubmission {
        execution_id: id,
        status,
        created_at: existing.created_at,
        idempotent_replay: true,
    };
    // The job as the first submitter built it: same id, same acceptance time, same deadline.
    let span = job.deadline_at.unix_millis() - job.accepted_at.unix_millis();
    let job = Job {
        execution_id: id,
        accepted_at: existing.created_at,
        deadline_at: Timestamp::from_unix_millis(
            existing.created_at.unix_millis().saturating_add(span),
        ),
        ..job
    };
    let waited = Instant::now();
    let status = loop {
        match inner.backend.store.state(id).await? {
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
                let heal = async { Ok(create_and_publish(state, tenant, &job).await?) };
                match quota::within(state, tenant, &job, heal).await? {
                    Creation::Created | Creation::AlreadyExists => {
                        return Ok(replayed(ExecutionStatus::Accepted));
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
    Ok(replayed(status))
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
        let mut writer = EventWriter::resume(
            backend.store.clone(),
            id,
            head.last_sequence,
            head.last_time,
        );
        let cancelled = EventBody::Failed {
            error: RuntimeError::cancelled(),
        };
        match writer.append_once(cancelled).await {
            Ok(()) => {
                Metrics::inc(&state.inner.metrics.cancellations);
                quota::release_ended(state, id).await;
                return Ok(true);
            }
            Err(StoreError::Conflict { terminal: true, .. }) => return Ok(false),
            Err(StoreError::Conflict { .. }) => {} // a runner claimed it: signal the runner
            Err(e) => return Err(e.into()),
        }
    }
    backend.cancel.request(id).await?;
    Metrics::inc(&state.inner.metrics.cancellations);
    Ok(true)
}
