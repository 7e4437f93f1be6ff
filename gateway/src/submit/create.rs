//! Creating an execution: its log with `execution.accepted` and its job, within the tenant's
//! quotas, concurrently ([`create_and_publish`]); a failure says whether its outcome is
//! settled (nothing of the execution can run), which decides whether the key may be freed.
use std::future::Future;
use std::time::Instant;

use protocol::Tenant;
use runtime::{EventWriter, Job, StoreError};

use super::settle::{Settle, settle, spawn_settle, unqueued_failure, within_bound};
use crate::error::ApiError;
use crate::quota;
use crate::state::AppState;

/// What creating an execution's log found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Creation {
    /// The log was created and the job published (or a worker already claimed the execution
    /// while the submission was learning the outcome of a failed step).
    Created,
    /// The log already existed; a concurrent healer created it and publishes its job.
    AlreadyExists,
}

/// A submission that did not create its execution.
#[derive(Debug)]
pub(super) struct Failed {
    pub(super) error: ApiError,
    /// `true`: nothing of the execution will ever run (its job is not queued and its log, if
    /// any, is closed or will be), so the idempotency key may be released. `false`: the outcome
    /// could not be learnt within [`SETTLE_BOUND`]; a background task keeps settling it, and
    /// the key stays bound so that a keyed retry replays this execution instead of creating a
    /// second one (invariant 3).
    pub(super) settled: bool,
}

impl Failed {
    pub(super) fn settled(error: impl Into<ApiError>) -> Self {
        Self {
            error: error.into(),
            settled: true,
        }
    }
}

/// Creates the log of an execution whose id was just minted, within its tenant's quotas
/// ([`crate::quota`]): an existing log is a failure.
pub(super) async fn create_fresh(
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
pub(super) async fn within_quota<T>(
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
pub(super) async fn create_unique(
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
/// the worker waits for the log a bounded time (see the worker's runner).
///
/// When either step fails, the submission learns what became of the other before it answers
/// ([`settle`]): a 503 means nothing will run, a 202 that the execution is queued or already
/// claimed by a worker. A step still unanswered [`super::settle::STEP_BOUND`] after the
/// submission started ([`within_bound`]) counts as failed with its outcome unknown.
pub(super) async fn create_and_publish(
    state: &AppState,
    tenant: &Tenant,
    job: &Job,
    started: Instant,
) -> Result<Creation, Failed> {
    let backend = &state.inner.backend;
    let (created, published) = tokio::join!(
        within_bound(
            started,
            "log creation",
            EventWriter::create(
                backend.store.clone(),
                job.execution_id,
                job.accepted_at,
                tenant,
            )
        ),
        within_bound(started, "job publish", backend.queue.publish(job)),
    );
    match (created, published) {
        (Ok(_), Ok(())) => Ok(Creation::Created),
        // Only while healing: a concurrent retry created the log; our publish, if stored, is
        // the same job under the same msg id.
        (Err(StoreError::AlreadyExists), _) => Ok(Creation::AlreadyExists),
        (Ok(mut writer), Err(e @ StoreError::AdmissionFull)) => {
            // Refused by the queue's limit: certainly not queued. Close the log.
            let closed = within_bound(
                started,
                "closing an unqueued log",
                writer.append_once(unqueued_failure()),
            )
            .await;
            if let Err(close) = closed {
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
