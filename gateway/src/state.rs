//! Shared state of the HTTP layer: backends, providers, limits, lifecycle and metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use providers::Capabilities;
use runtime::{CancelBus, EventStore, IdempotencyStore, JobQueue, QuotaGate};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::metrics::Metrics;

/// The storage and messaging implementations behind the API.
#[derive(Clone, derive_more::Debug)]
pub struct Backend {
    #[debug(skip)]
    pub store: Arc<dyn EventStore>,
    #[debug(skip)]
    pub queue: Arc<dyn JobQueue>,
    #[debug(skip)]
    pub idempotency: Arc<dyn IdempotencyStore>,
    #[debug(skip)]
    pub cancel: Arc<dyn CancelBus>,
    /// Per-tenant quotas (`QuotaGate::unlimited()` when no tenant has limits).
    #[debug(skip)]
    pub quotas: Arc<QuotaGate>,
    /// Whether an idempotency record without a log is a crash window to heal, by closing that
    /// execution unrun and binding the key anew (distributed mode: the key is written before
    /// the log), rather than an evicted execution (memory).
    pub heal_missing: bool,
}

/// Request limits of the HTTP layer.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    pub max_body_bytes: usize,
    pub max_deadline_ms: u64,
    pub default_deadline_ms: u64,
    pub max_sse_streams: usize,
    /// Comment line interval on idle SSE streams.
    pub keep_alive: Duration,
    /// How long after a key was bound (by the acceptance time its record holds) its log may
    /// still be missing because the first submission is creating it: a replay waits for it
    /// (within the submit bound). Longer than any submission takes to answer, so once it has
    /// passed a missing log is a crash window.
    pub replay_wait: Duration,
}

impl ApiLimits {
    /// The deployment file's `limits`, with the fixed keep-alive and replay timings.
    pub fn new(limits: &config::Limits) -> Self {
        Self {
            max_body_bytes: limits.max_body_bytes,
            max_deadline_ms: limits.max_deadline_ms,
            default_deadline_ms: limits.default_deadline_ms,
            max_sse_streams: limits.max_sse_streams,
            keep_alive: Duration::from_secs(15),
            replay_wait: Duration::from_secs(2),
        }
    }
}

impl Default for ApiLimits {
    /// The limits of a deployment file that sets none.
    fn default() -> Self {
        Self::new(&config::Limits::default())
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub backend: Backend,
    pub auth: Authenticator,
    /// What the configured providers can serve (`/v1/providers`, the submit check).
    pub capabilities: Capabilities,
    pub limits: ApiLimits,
    pub metrics: Metrics,
    pub exporter: telemetry::MetricsExporter,
    pub streams: Arc<Semaphore>,
    pub stopping: AtomicBool,
    /// Whether the last idempotency key claim got an answer: keyed submits then bind their
    /// key while the execution is created, else first (`crate::submit`).
    pub keys_reachable: AtomicBool,
    /// Keys seen bound lately: their submits claim first (`crate::recent_keys`).
    pub recent_keys: crate::recent_keys::RecentKeys,
    /// Ends every open SSE stream (cleanly, at a frame boundary) at shutdown.
    pub close_streams: CancellationToken,
    /// Each provider's deployment `type`, for the OpenAI-compatible routes (`crate::openai`).
    pub provider_types: std::sync::OnceLock<std::collections::HashMap<String, &'static str>>,
}

/// Cheaply cloneable handle given to every handler.
#[derive(Clone, Debug)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

impl AppState {
    /// Anonymous: every request is tenant `default` (see [`AppState::with_auth`]).
    pub fn new(backend: Backend, capabilities: Capabilities, limits: ApiLimits) -> Self {
        Self::with_auth(backend, capabilities, limits, Authenticator::anonymous())
    }

    /// With the API keys of the deployment's `auth` section.
    pub fn with_auth(
        backend: Backend,
        capabilities: Capabilities,
        limits: ApiLimits,
        auth: Authenticator,
    ) -> Self {
        let streams = Arc::new(Semaphore::new(limits.max_sse_streams.max(1)));
        let exporter = telemetry::MetricsExporter::install();
        Self {
            inner: Arc::new(Inner {
                backend,
                auth,
                capabilities,
                limits,
                metrics: Metrics::new(&exporter),
                exporter,
                streams,
                stopping: AtomicBool::new(false),
                keys_reachable: AtomicBool::new(true),
                recent_keys: crate::recent_keys::RecentKeys::default(),
                close_streams: CancellationToken::new(),
                provider_types: std::sync::OnceLock::new(),
            }),
        }
    }

    /// New submits get 503 and `/v1/runtime` reports `stopping` from now on.
    pub fn begin_shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.metrics.set_stopping(true);
    }

    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Ends open SSE streams at the next frame boundary.
    pub fn close_streams(&self) {
        self.inner.close_streams.cancel();
    }

    /// Whether requests need no API key.
    pub fn is_anonymous(&self) -> bool {
        self.inner.auth.is_anonymous()
    }

    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// The process-wide metrics registry.
    pub fn exporter(&self) -> &telemetry::MetricsExporter {
        &self.inner.exporter
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}
