//! Embedded mode: every backend in memory and the worker pool in this process, so one command
//! runs the whole system with no services.
//!
//! The one decision a reader must know: this is the only module of the gateway that names
//! the `worker` crate, because only here does the gateway run executions itself (adapters,
//! runner, pool, and how many at once). Everything else reads providers through
//! `providers::Capabilities`, as a distributed gateway does.

use std::sync::Arc;
use std::time::Duration;

use config::DeploymentConfig;
use runtime::memory::{
    MemoryCancelBus, MemoryEventStore, MemoryIdempotencyStore, MemoryJobQueue, MemoryLimits,
};
use runtime::{CancelBus, EventStore, IdempotencyStore, JobQueue};
use worker::deployment::BuildError;
use worker::runner::{Runner, RunnerSettings};
use worker::{PoolConfig, ProviderRegistry, WorkerPool};

use crate::auth::Authenticator;
use crate::state::{ApiLimits, AppState, Backend};
use crate::submit;

/// A running embedded runtime.
pub struct Embedded {
    pub state: AppState,
    pool: WorkerPool,
    queue: Arc<MemoryJobQueue>,
    store: Arc<MemoryEventStore>,
    /// Stops the deadline sweeper when this runtime is dropped (or shut down).
    _sweeper: tokio_util::sync::DropGuard,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").finish_non_exhaustive()
    }
}

/// API limits from the deployment file.
pub fn api_limits<P>(config: &DeploymentConfig<P>) -> ApiLimits {
    ApiLimits::new(&config.limits)
}

/// Time open streams get to deliver the terminal events written when the grace ran out.
const STREAM_FLUSH: Duration = Duration::from_millis(250);

/// `concurrency` runner slots taking jobs from `queue` and running them with `registry`'s
/// providers over `store`, `cancel` and `keys`, with the default runner settings: the embedded
/// runtime's workers, which the gateway's tests also start over backends of their own.
pub fn spawn_pool(
    registry: Arc<ProviderRegistry>,
    store: Arc<dyn EventStore>,
    queue: Arc<dyn JobQueue>,
    cancel: Arc<dyn CancelBus>,
    keys: Arc<dyn IdempotencyStore>,
    concurrency: usize,
) -> WorkerPool {
    let runner = Runner::new(registry, store, cancel, keys, RunnerSettings::default());
    let config = PoolConfig {
        concurrency,
        ..PoolConfig::default()
    };
    WorkerPool::spawn(queue, Arc::new(runner), config)
}

impl Embedded {
    /// Starts the deployment's providers (their adapters) with as many runner slots as they
    /// can run at once, at most the operator's `cap` (`worker::capacity`).
    pub fn open(
        deployment: &providers::DeploymentConfig,
        cap: Option<usize>,
    ) -> Result<Self, BuildError> {
        let registry = Arc::new(worker::deployment::build_registry(deployment)?);
        let concurrency =
            worker::capacity::concurrency(&registry, deployment.max_active_executions, cap);
        tracing::info!(concurrency, "running executions in this process");
        Ok(Self::start(deployment, registry, concurrency))
    }

    /// Builds the memory backends and starts `workers` runner slots.
    pub fn start<P>(
        config: &DeploymentConfig<P>,
        registry: Arc<ProviderRegistry>,
        workers: usize,
    ) -> Self {
        let limits = MemoryLimits {
            max_executions: config.event_store.max_executions,
            max_active: config.max_active_executions,
            max_total_bytes: config.event_store.max_bytes,
            max_execution_bytes: config.event_store.max_execution_bytes,
            max_events: config.event_store.max_events,
            retention: config.retention,
            ..MemoryLimits::default()
        };
        let store = Arc::new(MemoryEventStore::new(limits));
        let queue = Arc::new(MemoryJobQueue::new());
        let cancel = Arc::new(MemoryCancelBus::new());
        let keys: Arc<dyn IdempotencyStore> =
            Arc::new(MemoryIdempotencyStore::new(config.retention));
        let backend = Backend {
            store: store.clone(),
            queue: queue.clone(),
            idempotency: keys.clone(),
            cancel: cancel.clone(),
            quotas: Arc::new(crate::quota::embedded_gate(config, &store)),
            heal_missing: false,
        };
        // Every provider's series from startup, at 0, as a worker process has them (the
        // process registry must exist before they are registered).
        let _registry = telemetry::MetricsExporter::install();
        for manifest in registry.manifests() {
            for model in &manifest.models {
                telemetry::metric::register_model(&manifest.provider, &model.model);
            }
        }
        let capabilities = registry.capabilities();
        let pool = spawn_pool(
            registry,
            store.clone(),
            queue.clone(),
            cancel,
            keys,
            workers,
        );
        // Closes executions whose deadline passes while they wait in the queue (every runner
        // slot busy) within the contract's 2 s (§8), as a distributed gateway's sweeper does;
        // a runner enforces the deadline of what it runs itself.
        let sweeping = tokio_util::sync::CancellationToken::new();
        runtime::DeadlineSweeper::new(
            store.clone(),
            queue.clone(),
            runtime::SweeperSettings::default(),
        )
        .spawn(sweeping.clone());
        let auth = Authenticator::from_config(config.auth.as_ref());
        let state = AppState::with_auth(backend, capabilities, api_limits(config), auth);
        Self {
            state,
            pool,
            queue,
            store,
            _sweeper: sweeping.drop_guard(),
        }
    }

    /// Starts webhook deliveries fed by this runtime's event store (contract §11); they run
    /// until `stopping` is cancelled or the process ends.
    pub fn start_webhooks(
        &self,
        endpoints: Arc<webhook::Endpoints>,
        sender: webhook::Sender,
        stopping: tokio_util::sync::CancellationToken,
    ) -> webhook::MemoryWebhooks {
        webhook::MemoryWebhooks::start(&self.store, endpoints, sender, stopping)
    }

    /// Executions retained in memory now.
    pub fn retained(&self) -> usize {
        self.store.retained()
    }

    /// Graceful stop: refuse new submits, let running executions finish within `grace` (then
    /// cancel them), cancel executions that never started, and end open event streams once
    /// their terminal events are out. Returns whether everything finished within the grace.
    pub async fn shutdown(self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        self.state.begin_shutdown();
        let in_time = self.pool.shutdown(grace).await;
        self.queue.close();
        for job in self.queue.take_pending() {
            // The gateway's own cancel, not a request: `mrt_cancellations_total` leaves it out.
            if let Err(e) = submit::stop(&self.state, job.execution_id).await {
                tracing::warn!(execution_id = %job.execution_id, error = ?e, "could not cancel a queued execution at shutdown");
            }
        }
        // Let streams deliver the terminal events just written, then end the rest.
        let drained = async {
            while self.state.metrics().active_streams() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        // Within what is left of the grace (the process must stop when it ends), but long
        // enough for the terminal events of executions cancelled at its end.
        let now = tokio::time::Instant::now();
        let until = deadline
            .max(now + STREAM_FLUSH)
            .min(now + Duration::from_secs(2));
        let _ = tokio::time::timeout_at(until, drained).await;
        self.state.close_streams();
        in_time
    }
}
