//! The submission flow, independent of HTTP: validate limits and capabilities, bind the
//! idempotency key, create the log with `execution.accepted`, publish the job.
//!
//! Order matters for the invariants: nothing is published for a request that is rejected, the
//! execution id is minted before the key is bound (so a retry after a crash between the steps
//! heals to the same execution), and the key is released when creation fails so a retry can
//! create it [R 14].

use std::time::{Duration, Instant};

use protocol::event::EventBody;
use protocol::fingerprint::{request_fingerprint, sha256_hex};
use protocol::snapshot::ExecutionSubmission;
use protocol::{
    ErrorCode, ExecutionId, ExecutionRequest, ExecutionStatus, RuntimeError, RuntimeEvent,
    Sequence, Timestamp,
};
use runtime::{IdempotencyRecord, Job, StoreError};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::AppState;

/// Validates an `Idempotency-Key` value: 1-256 visible ASCII characters.
pub fn valid_idempotency_key(key: &[u8]) -> bool {
    (1..=256).contains(&key.len()) && key.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// Runs the flow for a parsed request.
pub async fn submit(
    state: &AppState,
    request: ExecutionRequest,
    idempotency_key: Option<&str>,
    traceparent: Option<String>,
) -> Result<ExecutionSubmission, ApiError> {
    let inner = &state.inner;
    let result = submit_inner(state, request, idempotency_key, traceparent).await;
    match &result {
        Ok(s) if s.idempotent_replay => Metrics::inc(&inner.metrics.submissions_replayed),
        Ok(_) => Metrics::inc(&inner.metrics.submissions_accepted),
        Err(_) => Metrics::inc(&inner.metrics.submissions_rejected),
    }
    result
}

async fn submit_inner(
    state: &AppState,
    request: ExecutionRequest,
    idempotency_key: Option<&str>,
    traceparent: Option<String>,
) -> Result<ExecutionSubmission, ApiError> {
    let inner = &state.inner;
    if state.is_stopping() {
        return Err(ApiError::Unavailable("Runtime is shutting down"));
    }
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
    let created_at = Timestamp::now();
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
        create_and_publish(state, &job).await?;
        return Ok(accepted(id, created_at));
    };
    let key_hash = sha256_hex(format!("\u{0}{key}").as_bytes());
    let record = IdempotencyRecord {
        fingerprint: request_fingerprint(&job.request),
        execution_id: id,
        created_at,
    };
    let claimed = inner
        .backend
        .idempotency
        .claim(&key_hash, &record)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    match claimed {
        None => {
            if let Err(e) = create_and_publish(state, &job).await {
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
        Some(existing) => replay(state, existing, job).await,
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

/// Creates the log and publishes the job. If publishing fails, the log is closed with a
/// failure so nothing is left waiting for a job that will never come.
async fn create_and_publish(state: &AppState, job: &Job) -> Result<(), ApiError> {
    let backend = &state.inner.backend;
    let accepted = RuntimeEvent::new(
        job.execution_id,
        Sequence(1),
        job.accepted_at,
        EventBody::Accepted,
    );
    backend
        .store
        .create(accepted)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    if let Err(e) = backend.queue.publish(job).await {
        tracing::warn!(execution_id = %job.execution_id, error = %e, "job publish failed");
        let failed = RuntimeEvent::new(
            job.execution_id,
            Sequence(2),
            Timestamp::now().max(job.accepted_at),
            EventBody::Failed {
                error: RuntimeError::new(
                    ErrorCode::InternalError,
                    "Execution could not be queued",
                    false,
                ),
            },
        );
        if let Err(close) = backend.store.append(failed).await {
            tracing::warn!(execution_id = %job.execution_id, error = %close, "could not close unqueued execution");
        }
        return Err(ApiError::from_store(&e));
    }
    Ok(())
}

/// The key is bound to an execution with the same request: answer with its current status.
async fn replay(
    state: &AppState,
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
        match inner
            .backend
            .store
            .state(id)
            .await
            .map_err(|e| ApiError::from_store(&e))?
        {
            Some(m) => break m.status(),
            None if waited.elapsed() < inner.limits.replay_wait => {
                // A concurrent first submission bound the key and is creating the log.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            None if inner.backend.heal_missing => {
                // The first submitter died between binding the key and creating the log:
                // create it now, under the recorded id and time.
                match create_and_publish(state, &job).await {
                    // `Internal` here is AlreadyExists: a concurrent retry healed it first.
                    Ok(()) | Err(ApiError::Internal(_)) => {
                        return Ok(replayed(ExecutionStatus::Accepted));
                    }
                    Err(e) => return Err(e),
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
        if let Err(e) = inner.backend.queue.publish(&job).await {
            return Err(ApiError::from_store(&e));
        }
    }
    Ok(replayed(status))
}

/// Cancels an execution [R 21, 41]. Returns `false` when it is unknown or already terminal.
pub async fn cancel(state: &AppState, id: ExecutionId) -> Result<bool, ApiError> {
    let backend = &state.inner.backend;
    let Some(head) = backend
        .store
        .head(id)
        .await
        .map_err(|e| ApiError::from_store(&e))?
    else {
        return Ok(false);
    };
    if head.terminal {
        return Ok(false);
    }
    if head.last_sequence == Sequence(1) {
        // Still queued: close the log ourselves; the worker that later takes the job finds it
        // terminal and drops it.
        let event = RuntimeEvent::new(
            id,
            Sequence(2),
            Timestamp::now().max(head.last_time),
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        );
        match backend.store.append(event).await {
            Ok(()) => {
                Metrics::inc(&state.inner.metrics.cancellations);
                return Ok(true);
            }
            Err(StoreError::Conflict { terminal: true, .. }) => return Ok(false),
            Err(StoreError::Conflict { .. }) => {} // a runner claimed it: signal the runner
            Err(e) => return Err(ApiError::from_store(&e)),
        }
    }
    backend
        .cancel
        .request(id)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    Metrics::inc(&state.inner.metrics.cancellations);
    Ok(true)
}
