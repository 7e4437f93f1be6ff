//! Process entry points: `run` parses settings, builds the runtime and serves until a signal.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use clap::Parser;
use config::{BackendKind, CommonArgs};
use tokio::net::TcpListener;

use crate::api::router;
use crate::embedded::Embedded;
use crate::state::AppState;

/// `gateway` command line.
#[derive(Debug, Parser)]
#[command(name = "gateway", version, about = "HTTP+SSE API of the model runtime")]
pub struct GatewayArgs {
    /// Listen address.
    #[arg(long, env = "MODEL_RUNTIME_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Listen port; 0 picks a free port (printed on stdout).
    #[arg(long, env = "MODEL_RUNTIME_PORT", default_value_t = 4320)]
    pub port: u16,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Prints one sanitized startup error line and returns the failure exit code.
fn startup_error(message: &str) -> ExitCode {
    eprintln!("gateway: {message}");
    ExitCode::from(1)
}

/// The `gateway` binary.
pub async fn run(args: GatewayArgs) -> ExitCode {
    args.common.init_tracing();
    let (deployment, registry) = match worker::deployment::open(args.common.config.as_deref()) {
        Ok((deployment, registry)) => (deployment, Arc::new(registry)),
        Err(e) => return startup_error(&e.to_string()),
    };
    let grace = args.common.shutdown_grace();
    let runtime = match args.common.backend {
        BackendKind::Memory => Runtime::Embedded(Embedded::start(
            &deployment,
            registry,
            args.common.workers(),
        )),
        BackendKind::Nats => match crate::distributed::connect(&args.common, &deployment).await {
            Ok((backend, _)) => Runtime::Distributed(AppState::new(
                backend,
                registry,
                crate::embedded::api_limits(&deployment),
            )),
            Err(e) => {
                tracing::error!(error = %e, "backend connection failed");
                return startup_error(
                    "cannot reach NATS or Redis; check --nats-url and --redis-url",
                );
            }
        },
    };
    let addr = format!("{}:{}", args.host, args.port);
    let listener = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => return startup_error(&format!("cannot listen on {addr}: {}", e.kind())),
    };
    let local: SocketAddr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return startup_error(&format!("cannot read the listen address: {}", e.kind())),
    };
    println!("listening on http://{local}");
    tracing::info!(%local, backend = ?args.common.backend, "gateway started");
    match runtime {
        Runtime::Embedded(embedded) => serve(listener, embedded, shutdown_signal(), grace).await,
        Runtime::Distributed(state) => {
            let hook_state = state.clone();
            let hook = async move {
                // Executions live on in the workers; open streams end cleanly and clients resume
                // on another gateway.
                hook_state.begin_shutdown();
                hook_state.close_streams();
            };
            serve_with(listener, state, shutdown_signal(), hook).await;
        }
    }
    ExitCode::SUCCESS
}

/// What this gateway process runs.
enum Runtime {
    Embedded(Embedded),
    Distributed(AppState),
}

/// Serves until `signal` resolves, then shuts down gracefully.
pub async fn serve(
    listener: TcpListener,
    embedded: Embedded,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) {
    let state = embedded.state.clone();
    let hook = async move {
        if !embedded.shutdown(grace).await {
            tracing::warn!("grace period expired; remaining executions were cancelled");
        }
    };
    serve_with(listener, state, signal, hook).await;
}

/// Serves `state` until `signal` resolves, runs `shutdown` (which must stop new work and end
/// open streams), then waits briefly for connections to close.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let app = router(state);
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        // Small SSE frames must leave at once: without TCP_NODELAY, Nagle's algorithm and
        // delayed ACKs hold them back for ~40 ms.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        });
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped_rx.await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "server error");
        }
    });
    signal.await;
    tracing::info!("shutting down");
    shutdown.await;
    let _ = stopped_tx.send(());
    let abort = server.abort_handle();
    if tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .is_err()
    {
        // A client that stopped reading keeps its connection busy; close it by force.
        tracing::warn!("connections still open after shutdown; closing");
        abort.abort();
    }
}

pub use worker::process::shutdown_signal;
