//! Process entry points: `run` parses settings, builds the runtime and serves until a signal.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use config::{BackendKind, CommonArgs};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::router;
use crate::connections::ConnectionLimits;
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
    // First of all, so a signal at any later instant is a graceful stop.
    let stop = CancellationToken::new();
    let signal = startup::install_shutdown_signal();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        signal.await;
        on_signal.cancel();
    });
    let _tracing = telemetry::trace::init(
        "gateway",
        telemetry::LogFormat::json_if(args.common.json_logs()),
    );
    let open_files = crate::connections::raise_open_file_limit();
    let deployment = match providers::deployment::open(args.common.config.as_deref()) {
        Ok(deployment) => deployment,
        Err(e) => return startup_error(&e.to_string()),
    };
    if let Err(e) = crate::quota::tenant_limits(&deployment) {
        return startup_error(&e.to_string());
    }
    let grace = args.common.shutdown_grace();
    let limits = ConnectionLimits::new(&deployment.limits, open_files);
    // Embedded mode delivers webhooks itself: its secrets are read now (contract §11).
    let webhooks = match args.common.backend {
        BackendKind::Memory => match webhook::setup(&deployment.webhooks) {
            Ok(webhooks) => webhooks,
            Err(e) => return startup_error(&e.to_string()),
        },
        BackendKind::Nats => None,
    };
    let _webhooks;
    let runtime = match args.common.backend {
        BackendKind::Memory => {
            let embedded = match Embedded::open(&deployment, args.common.workers_cap()) {
                Ok(embedded) => embedded,
                Err(e) => return startup_error(&e.to_string()),
            };
            _webhooks = webhooks.map(|(endpoints, sender)| {
                embedded.start_webhooks(endpoints, sender, stop.clone())
            });
            Runtime::Embedded(embedded)
        }
        BackendKind::Nats => match tokio::select! {
            connected = crate::distributed::connect(&args.common, &deployment) => connected,
            // Waiting for the backends can take a while; a signal meanwhile stops right there.
            () = stop.cancelled() => {
                tracing::info!("signal during startup; nothing was served");
                return ExitCode::SUCCESS;
            }
        } {
            Ok((backend, nats)) => {
                // Workers deliver; the gateway only makes deliveries owed from its start on
                // (`webhook::nats`).
                if !deployment.webhooks.is_empty() {
                    let schedule = webhook::RetrySchedule::of(&deployment.webhooks);
                    if let Err(e) = webhook::nats::ensure_layout(&nats, &schedule).await {
                        tracing::error!(error = %e, "cannot create the webhook streams");
                        return startup_error(&format!("cannot start: {e}"));
                    }
                }
                // Closes executions past their deadline that no worker runs (contract §8).
                // Gateways alone run one: workers do not (`worker::process`).
                runtime::DeadlineSweeper::new(
                    Arc::clone(&backend.store),
                    Arc::clone(&backend.queue),
                    runtime::SweeperSettings::default(),
                )
                .spawn(stop.clone());
                let mut limits = crate::embedded::api_limits(&deployment);
                limits.max_body_bytes = crate::distributed::effective_body_limit(
                    limits.max_body_bytes,
                    nats.client.server_info().max_payload,
                );
                let auth = crate::auth::Authenticator::from_config(deployment.auth.as_ref());
                let capabilities = providers::Capabilities::of(&deployment.providers);
                Runtime::Distributed(AppState::with_auth(backend, capabilities, limits, auth))
            }
            // Refused credentials, a failed TLS handshake, or a setting JetStream refuses to
            // change: the detail names what failed (never a credential or an address). Say it,
            // since retrying will not help.
            Err(runtime::StoreError::Misconfigured(detail)) => {
                tracing::error!(error = %detail, "cannot start with the backends");
                return startup_error(&format!("cannot start: {detail}"));
            }
            Err(e) => {
                tracing::error!(error = %e, "backend connection failed");
                return startup_error(
                    "cannot reach NATS or Redis; check --nats-url and --redis-url",
                );
            }
        },
    };
    let addr = format!("{}:{}", args.host, args.port);
    let listener = match crate::connections::bind(&addr).await {
        Ok(l) => l,
        Err(e) => return startup_error(&format!("cannot listen on {addr}: {}", e.kind())),
    };
    let local: SocketAddr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return startup_error(&format!("cannot read the listen address: {}", e.kind())),
    };
    println!("listening on http://{local}");
    if deployment.auth.is_none() && !local.ip().is_loopback() {
        tracing::warn!(
            %local,
            "no auth section in the deployment file: anyone who can reach this address may \
             submit, read and cancel executions"
        );
    }
    tracing::info!(
        %local,
        backend = ?args.common.backend,
        max_connections = limits.max_connections,
        open_files,
        "gateway started"
    );
    let state = match &runtime {
        Runtime::Embedded(embedded) => &embedded.state,
        Runtime::Distributed(state) => state,
    };
    state.set_provider_types(deployment.providers.iter().map(|p| (p.id(), p.type_name())));
    match runtime {
        Runtime::Embedded(embedded) => {
            serve_embedded(listener, embedded, stop.cancelled_owned(), grace, limits).await;
        }
        Runtime::Distributed(state) => {
            let hook_state = state.clone();
            let hook = async move {
                // Executions live on in the workers; open streams end cleanly and clients resume
                // on another gateway.
                hook_state.begin_shutdown();
                hook_state.close_streams();
            };
            serve_with(listener, state, limits, stop.cancelled_owned(), hook, grace).await;
        }
    }
    ExitCode::SUCCESS
}

/// What this gateway process runs.
enum Runtime {
    Embedded(Embedded),
    Distributed(AppState),
}

/// Serves until `signal` resolves, then shuts down gracefully within `grace`, with the
/// default connection limits.
pub async fn serve(
    listener: TcpListener,
    embedded: Embedded,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) {
    serve_embedded(
        listener,
        embedded,
        signal,
        grace,
        ConnectionLimits::default(),
    )
    .await;
}

/// [`serve`] with explicit connection limits.
pub async fn serve_embedded(
    listener: TcpListener,
    embedded: Embedded,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
    limits: ConnectionLimits,
) {
    let state = embedded.state.clone();
    let hook = async move {
        if !embedded.shutdown(grace).await {
            tracing::warn!("grace period expired; remaining executions were cancelled");
        }
    };
    serve_with(listener, state, limits, signal, hook, grace).await;
}

/// Serves `state` until `signal` resolves. Then it runs `shutdown` (which must stop new work
/// and end open streams, bounded by `grace` itself; requests are still served meanwhile),
/// stops accepting and asks every connection to close after its current request. Connections
/// still open when the grace is over are closed by force.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    limits: ConnectionLimits,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let app = router(state);
    let drain = CancellationToken::new();
    let force = CancellationToken::new();
    let tracker = TaskTracker::new();
    let accepting = tokio::spawn(crate::connections::accept_loop(
        listener,
        app,
        limits,
        drain.clone(),
        force.clone(),
        tracker.clone(),
    ));
    signal.await;
    let deadline = tokio::time::Instant::now() + grace;
    tracing::info!("shutting down");
    shutdown.await;
    drain.cancel();
    if let Err(e) = accepting.await {
        tracing::error!(error = %e, "accept loop failed");
    }
    tracker.close();
    // Streams the hook ended at the close of the grace still get their last frames out.
    let until = deadline.max(tokio::time::Instant::now() + CLOSE_FLUSH);
    if tokio::time::timeout_at(until, tracker.wait())
        .await
        .is_err()
    {
        // A request still running, an incomplete request body, or a client that stopped
        // reading keeps its connection busy; the grace is over, so it is closed.
        tracing::warn!("connections still open after the grace period; closing");
        force.cancel();
        tracker.wait().await;
    }
}

/// Time for connections to write their last frames once the shutdown hook has ended the
/// streams after the grace period.
const CLOSE_FLUSH: Duration = Duration::from_millis(100);
