//! The gateway side of per-tenant quotas (contract.md section 7; the mechanism is
//! `runtime::quota`): each tenant's limits from the deployment file, and the one step of the
//! submission flow that creates an execution only within an admission.
//!
//! Where the check sits, and why: after the idempotency key is bound (for a tenant with limits a
//! keyed submission binds its key before anything else, not concurrently), around the creation
//! of an execution, so before its log is created and its job published. An idempotent replay
//! of an existing execution creates nothing, so it takes no token and no slot, and a client
//! retrying its own submit at its limit gets its execution back instead of a 429. A refused
//! submit releases its key like any failed creation, so the retry after `Retry-After` can
//! create the execution. A retry that heals a crash window closes the recorded execution unrun
//! and gives back its slot (if the crashed submitter had been admitted); the fresh execution it
//! creates instead is admitted like any other (a token is taken again, the price of a crash
//! window).

use std::sync::Arc;

use config::DeploymentConfig;
use protocol::{ExecutionId, Tenant};
use runtime::memory::MemoryEventStore;
use runtime::quota::{GateSettings, InvalidQuota, MemoryQuotaStore, RedisQuotaStore};
use runtime::redis_idempotency::RedisIdempotencyStore;
use runtime::{Admission, EventStore, Job, QuotaGate, QuotaLimits, StoreError};

use telemetry::metric::{QUOTA_REJECTIONS_TOTAL, quota_reason};

use crate::error::ApiError;
use crate::state::AppState;

/// A tenant whose quota settings cannot work (the config parser already refuses them; this is
/// the check of the type that enforces them).
#[derive(Debug, thiserror::Error)]
#[error("auth.tenants.{tenant}: {problem}")]
pub struct QuotaConfigError {
    tenant: String,
    problem: String,
}

/// Every tenant's limits from the deployment's `auth` section (none without one).
pub fn tenant_limits<P>(
    deployment: &DeploymentConfig<P>,
) -> Result<Vec<(Tenant, QuotaLimits)>, QuotaConfigError> {
    let Some(auth) = &deployment.auth else {
        return Ok(Vec::new());
    };
    auth.tenants
        .iter()
        .map(|(name, quota)| {
            let error = |problem: String| QuotaConfigError {
                tenant: name.clone(),
                problem,
            };
            let tenant: Tenant = name.parse().map_err(|e| error(format!("{e}")))?;
            let limits = QuotaLimits::new(
                quota.max_active_executions,
                quota.submits_per_second,
                quota.burst,
            )
            .map_err(|e: InvalidQuota| error(e.to_string()))?;
            Ok((tenant, limits))
        })
        .collect()
}

/// Admits `job`'s execution within `tenant`'s quotas, before anything of it is created; a
/// refusal is the 429 to answer. A creation that then fails with nothing left running gives the
/// slot back with [`release`]; one whose outcome is unknown keeps it (the execution may run, and
/// the slot ends by reconciliation or expiry).
pub(crate) async fn admit(state: &AppState, tenant: &Tenant, job: &Job) -> Result<(), ApiError> {
    match state
        .inner
        .backend
        .quotas
        .admit(tenant, job.execution_id, job.deadline_at)
        .await?
    {
        Admission::Admitted => Ok(()),
        Admission::RateLimited { retry_after } => {
            count_refusal(tenant, quota_reason::RATE_LIMITED);
            Err(ApiError::RateLimited { retry_after })
        }
        Admission::ActiveLimit { retry_after } => {
            count_refusal(tenant, quota_reason::ACTIVE_LIMIT);
            Err(ApiError::TenantActiveLimit { retry_after })
        }
    }
}

/// One more refusal of `tenant` (a tenant with limits: bounded by the deployment) for `reason`.
fn count_refusal(tenant: &Tenant, reason: &'static str) {
    metrics::counter!(QUOTA_REJECTIONS_TOTAL, "tenant" => tenant.to_string(), "reason" => reason)
        .increment(1);
}

/// Gives back the slot [`admit`] took for execution `id`, whose creation failed.
pub(crate) async fn release(state: &AppState, tenant: &Tenant, id: ExecutionId) {
    state.inner.backend.quotas.release(tenant, id).await;
}

/// Frees the slot of execution `id`, which ended: this gateway ended it itself (cancel of a
/// queued execution), or is about to show its end to a client. The owner is read from the
/// log, and only when some tenant has a cap.
pub(crate) async fn release_ended(state: &AppState, id: ExecutionId) {
    let backend = &state.inner.backend;
    if !backend.quotas.has_caps() {
        return;
    }
    match backend.store.owner(id).await {
        Ok(Some(owner)) => backend.quotas.release(&owner, id).await,
        Ok(None) => {}
        Err(e) => {
            tracing::debug!(execution_id = %id, error = %e, "owner unreadable; the slot ends by reconciliation or expiry");
        }
    }
}

/// [`tenant_limits`] where startup already checked them ([`crate::server::run`] refuses a
/// deployment they fail for, and so does the config parser): a failure here is logged and its
/// tenant left without limits.
/// Each tenant with limits gets its `mrt_quota_rejections_total` series at 0.
fn checked_limits<P>(deployment: &DeploymentConfig<P>) -> Vec<(Tenant, QuotaLimits)> {
    let limits = tenant_limits(deployment).unwrap_or_else(|e| {
        tracing::error!(error = %e, "quota settings refused; no tenant has quotas");
        Vec::new()
    });
    // The process registry (installed once, also by the state) must exist before series are
    // registered, and the gate is built before the state.
    let _registry = telemetry::MetricsExporter::install();
    for (tenant, limits) in &limits {
        if !limits.is_unlimited() {
            telemetry::metric::register_tenant_quota(tenant.as_str());
        }
    }
    limits
}

/// Embedded mode: quotas in memory, each slot released exactly when the memory event store
/// stores its execution's terminal event.
pub fn embedded_gate<P>(
    deployment: &DeploymentConfig<P>,
    store: &Arc<MemoryEventStore>,
) -> QuotaGate {
    let limits = checked_limits(deployment);
    if limits.iter().all(|(_, l)| l.is_unlimited()) {
        return QuotaGate::unlimited();
    }
    let quotas = Arc::new(MemoryQuotaStore::new());
    let hook = Arc::clone(&quotas);
    store.on_terminal(Arc::new(move |id| hook.release_execution(id)));
    QuotaGate::new(quotas, store.clone(), limits, GateSettings::default())
}

/// Distributed mode: quotas in Redis over the idempotency store's connection, shared by every
/// gateway of the namespace, reconciled against `events`. Without any limit, Redis is never
/// asked (not even to load the script).
pub async fn distributed_gate<P>(
    deployment: &DeploymentConfig<P>,
    redis: &RedisIdempotencyStore,
    namespace: &str,
    events: Arc<dyn EventStore>,
) -> Result<QuotaGate, StoreError> {
    let limits = checked_limits(deployment);
    if limits.iter().all(|(_, l)| l.is_unlimited()) {
        return Ok(QuotaGate::unlimited());
    }
    let quotas = RedisQuotaStore::new(redis.connection(), namespace).await?;
    Ok(QuotaGate::new(
        Arc::new(quotas),
        events,
        limits,
        GateSettings::default(),
    ))
}
