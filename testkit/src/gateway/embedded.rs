//! A real gateway in embedded mode (memory backend, in-process workers) served on a loopback
//! port through `gateway::server::serve`, so graceful shutdown is the production path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use providers::DeploymentConfig;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Api, default_deployment};

/// A running embedded gateway, sent the shutdown signal when dropped. Dereferences to its
/// [`Api`].
#[derive(Debug)]
pub struct Embedded {
    pub api: Api,
    pub addr: SocketAddr,
    pub state: gateway::AppState,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
}

/// The name tests use.
pub type Gateway = Embedded;

/// The providers of `providers::deployment::standalone()` (one default mock), as a gateway
/// checks requests against them.
pub fn standalone_capabilities() -> providers::Capabilities {
    providers::Capabilities::of(&providers::deployment::standalone().providers)
}

/// Memory backends as an embedded gateway has them (keys kept a minute, no quotas), for a test
/// to swap its own parts into: `gateway::Backend { store, ..memory_backend() }`.
pub fn memory_backend() -> gateway::Backend {
    use runtime::memory::{
        MemoryCancelBus, MemoryEventStore, MemoryIdempotencyStore, MemoryJobQueue, MemoryLimits,
    };
    gateway::Backend {
        store: Arc::new(MemoryEventStore::new(MemoryLimits::default())),
        queue: Arc::new(MemoryJobQueue::new()),
        idempotency: Arc::new(MemoryIdempotencyStore::new(Duration::from_secs(60))),
        cancel: Arc::new(MemoryCancelBus::new()),
        quotas: Arc::new(runtime::QuotaGate::unlimited()),
        heal_missing: false,
    }
}

impl std::ops::Deref for Embedded {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.signal_shutdown();
    }
}

impl Embedded {
    /// One default mock (three chunks, no delay), four workers.
    pub async fn start_default() -> Self {
        Self::start(default_deployment(json!({}))).await
    }

    /// The deployment `config` (JSON, as in a deployment file) with four workers.
    pub async fn start(config: Value) -> Self {
        Self::start_with(config, 4, Duration::from_secs(10)).await
    }

    /// The deployment `config` with `workers` runner slots and a shutdown `grace`.
    pub async fn start_with(config: Value, workers: usize, grace: Duration) -> Self {
        let config =
            providers::deployment::parse(&config.to_string()).expect("valid deployment file");
        Self::from_config(&config, workers, grace).await
    }

    /// One mock streaming `chunks` (a log too large to write as a file: up to 64 MiB per
    /// execution), two workers and a 10 s shutdown grace.
    pub async fn with_long_log(chunks: Vec<String>) -> Self {
        let mut config = providers::deployment::standalone();
        config.providers = vec![
            providers::mock::MockConfig {
                chunks,
                ..providers::mock::MockConfig::default()
            }
            .into(),
        ];
        config.event_store.max_execution_bytes = 64 * 1024 * 1024;
        Self::from_config(&config, 2, Duration::from_secs(10)).await
    }

    /// A typed deployment (for providers too large to write as a file).
    pub async fn from_config(config: &DeploymentConfig, workers: usize, grace: Duration) -> Self {
        let registry =
            Arc::new(worker::deployment::build_registry(config).expect("buildable registry"));
        let embedded = gateway::Embedded::start(config, registry, workers);
        let state = embedded.state.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(gateway::server::serve(
            listener,
            embedded,
            async move {
                let _ = rx.await;
            },
            grace,
        ));
        Self::new(addr, state, Some(tx), served)
    }

    /// Serves a hand-built state with the plain router (no workers, no shutdown path).
    pub async fn from_state(state: gateway::AppState) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let app = gateway::router(state.clone());
        let served = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self::new(addr, state, None, served)
    }

    fn new(
        addr: SocketAddr,
        state: gateway::AppState,
        stop: Option<oneshot::Sender<()>>,
        served: JoinHandle<()>,
    ) -> Self {
        Self {
            api: Api::new(format!("http://{addr}")),
            addr,
            state,
            stop,
            served: Some(served),
        }
    }

    /// Sends the shutdown signal to `serve`.
    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// Waits (up to `limit`) for `serve` to return; panics if it does not.
    pub async fn join(&mut self, limit: Duration) {
        let served = self.served.take().expect("served once");
        tokio::time::timeout(limit, served)
            .await
            .expect("serve returned within the limit")
            .expect("serve did not panic");
    }

    /// Accepted submissions, read from the state (works after the server stopped).
    pub fn accepted_count_offline(&self) -> u64 {
        self.state.metrics().accepted()
    }

    /// Event streams open right now.
    pub fn open_streams(&self) -> i64 {
        self.state.metrics().active_streams()
    }
}
