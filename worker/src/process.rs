//! The `worker` process: connects to NATS JetStream and to Redis (where it binds the
//! idempotency keys of keyed jobs before running them, `crate::key_guard`), pulls jobs and runs
//! them until SIGTERM or SIGINT, then stops taking jobs, lets running executions finish within
//! the grace period and cancels the rest. Jobs it never took stay in the queue for other
//! workers.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use runtime::Pace;
use runtime::nats::{NatsServices, until_settled};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use config::{BackendKind, CommonArgs};

use crate::runner::{Runner, RunnerSettings};
use crate::{PoolConfig, WorkerPool};

/// `worker` command line.
#[derive(Debug, Parser)]
#[command(
    name = "worker",
    version,
    about = "Runs model executions pulled from NATS JetStream"
)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Address of the admin endpoint (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, env = "MODEL_RUNTIME_ADMIN_HOST", default_value = "127.0.0.1")]
    pub admin_host: std::net::IpAddr,
    /// Port of the admin endpoint; `0` picks a free port and prints
    /// `admin listening on http://HOST:PORT`.
    #[arg(long, env = "MODEL_RUNTIME_ADMIN_PORT", default_value_t = 4321)]
    pub admin_port: u16,
    /// How an execution's output is paced between appends: `auto` (the default) holds it only
    /// while the event store is slow to acknowledge (an average over 1 ms, or over four times
    /// the fastest acknowledgement if that is more), forty times the excess, at most 100 ms
    /// (`runtime::pace`); `0` never holds it; `N` (1-1000) holds it at least N ms. Deltas the provider emits meanwhile go in one message, so a busy deployment
    /// writes, stores and reads far fewer messages, at the cost of showing some deltas that
    /// much later. The first output and the terminal event are never held.
    #[arg(long, env = "MODEL_RUNTIME_APPEND_PACE_MS", default_value = "auto",
          value_parser = parse_append_pace)]
    pub append_pace_ms: AppendPace,
    /// On a NATS cluster, how often (milliseconds) the worker checks that each partition's
    /// streams and consumers are led from the node of its own (partition k from the k-th by
    /// name, `runtime::nats::spawn_leader_placement`) and moves a leader that stayed away
    /// from it; `0` never moves one. Nothing happens with one partition or one replica.
    #[arg(long, env = "MODEL_RUNTIME_LEADER_PLACEMENT_MS", default_value_t = 30_000,
          value_parser = parse_leader_placement)]
    pub leader_placement_ms: u64,
}

/// The worker's `--leader-placement-ms`: 0 (off) or 500 ms to one hour.
fn parse_leader_placement(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(ms) if ms == 0 || (500..=3_600_000).contains(&ms) => Ok(ms),
        _ => Err("expected 0 (off) or a number of milliseconds from 500 to 3600000".into()),
    }
}

/// The worker's `--append-pace-ms` (see [`runtime::pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendPace {
    /// Held only while the store is slow ([`runtime::Pace::Adaptive`]).
    Auto,
    /// Held at least this many milliseconds; 0 never ([`runtime::Pace::Fixed`]).
    Millis(u16),
}

impl AppendPace {
    /// The pace every runner of this process shares.
    pub fn pace(self) -> Pace {
        match self {
            Self::Auto => Pace::adaptive(),
            Self::Millis(0) => Pace::Off,
            Self::Millis(ms) => Pace::Fixed(Duration::from_millis(u64::from(ms))),
        }
    }
}

fn parse_append_pace(value: &str) -> Result<AppendPace, String> {
    if value.eq_ignore_ascii_case("auto") {
        return Ok(AppendPace::Auto);
    }
    match value.parse::<u16>() {
        Ok(ms) if ms <= 1000 => Ok(AppendPace::Millis(ms)),
        _ => Err("expected `auto` or a number of milliseconds from 0 to 1000".into()),
    }
}

fn startup_error(message: &str, code: u8) -> ExitCode {
    eprintln!("worker: {message}");
    ExitCode::from(code)
}

/// The exit of a start that could not connect to `backend` (set by `flag`). Refused
/// credentials, a failed TLS handshake or a setting JetStream refuses are named as such, since
/// retrying will not help; the message never holds a credential.
fn backend_failure(backend: &str, flag: &str, error: &runtime::StoreError) -> ExitCode {
    if let runtime::StoreError::Misconfigured(detail) = error {
        tracing::error!(error = %detail, "cannot start with {backend}");
        return startup_error(&format!("cannot start with {backend}: {detail}"), 1);
    }
    tracing::error!(error = %error, "backend connection failed");
    startup_error(
        &format!("cannot start with {backend} ({error}); check {flag}"),
        1,
    )
}

/// The `worker` binary.
pub async fn run(args: WorkerArgs, shutdown: impl std::future::Future<Output = ()>) -> ExitCode {
    let common = &args.common;
    let _tracing =
        telemetry::trace::init("worker", telemetry::LogFormat::json_if(common.json_logs()));
    let exporter = telemetry::MetricsExporter::install();
    if common.backend == BackendKind::Memory {
        return startup_error(
            "the worker needs --backend nats (MODEL_RUNTIME_BACKEND=nats); with the memory backend the gateway runs executions itself",
            2,
        );
    }
    let (deployment, registry) = match crate::deployment::open(common.config.as_deref()) {
        Ok((deployment, registry)) => (deployment, Arc::new(registry)),
        Err(e) => return startup_error(&e.to_string(), 1),
    };
    let concurrency = crate::capacity::concurrency(
        &registry,
        deployment.max_active_executions,
        common.workers_cap(),
    );
    // Checked before anything connects (the NATS settings below repeat it).
    if let Err(e) = common.partitions() {
        return startup_error(&e, 1);
    }
    // Secrets are read now, so a missing one stops the start before anything connects.
    let webhooks = match webhook::setup(&deployment.webhooks) {
        Ok(webhooks) => webhooks,
        Err(e) => return startup_error(&e.to_string(), 1),
    };
    let connected = async {
        let settings = startup::backend::nats_connect_settings(common, &deployment, CONNECT)?;
        let deadline = tokio::time::Instant::now() + settings.connect_timeout;
        let nats = NatsServices::connect(&settings).await?;
        // The consumers are reconciled now, so a setting JetStream refuses stops the start.
        until_settled(deadline, || nats.queue.reconcile_consumer()).await?;
        Ok::<_, runtime::StoreError>(nats)
    };
    let nats = match connected.await {
        Ok(nats) => nats,
        Err(e) => return backend_failure("NATS", "--nats-url", &e),
    };
    // Keyed jobs are claimed here too before they run (`crate::key_guard`).
    let keys = startup::backend::redis_keys(common, &deployment, CONNECT);
    let keys: Arc<dyn runtime::IdempotencyStore> = match keys.await {
        Ok(keys) => Arc::new(keys),
        Err(e) => return backend_failure("Redis", "--redis-url", &e),
    };
    let admin = match TcpListener::bind((args.admin_host, args.admin_port)).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(error = %e, "cannot bind the admin port");
            return startup_error("cannot bind the admin endpoint; check --admin-port", 1);
        }
    };
    if let Ok(addr) = admin.local_addr() {
        println!("admin listening on http://{addr}");
    }
    for manifest in registry.manifests() {
        for model in &manifest.models {
            telemetry::metric::register_model(&manifest.provider, &model.model);
        }
    }
    let stopping = CancellationToken::new();
    let ready: crate::admin::Readiness = {
        let connection = nats.connection.clone();
        let stopping = stopping.clone();
        Arc::new(move || connection.connected() && !stopping.is_cancelled())
    };
    // One pace for every runner, so they share one view of the store's load.
    let pace = args.append_pace_ms.pace();
    let sample: crate::admin::Sampler = {
        let pace = pace.clone();
        Arc::new(move || crate::instrument::append_pace_hold(&pace))
    };
    let admin_task = tokio::spawn(crate::admin::serve(
        admin,
        exporter,
        ready,
        sample,
        stopping.clone(),
    ));
    // Queue depth for `mrt_jobs_pending`: read from the server every few seconds, never per
    // scrape, so scrapes stay cheap and the server sees one request per worker per period.
    let queue = Arc::new(nats.queue);
    let depth = {
        let queue = Arc::clone(&queue);
        let stopping = stopping.clone();
        tokio::spawn(async move {
            loop {
                match queue.backlog().await {
                    Ok(n) => metrics::gauge!(telemetry::metric::JOBS_PENDING).set(n as f64),
                    Err(e) => tracing::debug!(error = %e, "cannot read the queue depth"),
                }
                tokio::select! {
                    () = stopping.cancelled() => break,
                    () = tokio::time::sleep(JOBS_PENDING_PERIOD) => {}
                }
            }
        })
    };
    let store: Arc<dyn runtime::EventStore> = Arc::new(nats.store);
    // Every worker feeds and delivers the namespace's webhooks (contract §11).
    if let Some((endpoints, sender)) = webhooks {
        let started = webhook::NatsWebhooks::start(
            nats.connection.clone(),
            Arc::clone(&store),
            endpoints,
            sender,
            stopping.clone(),
        );
        if let Err(e) = started.await {
            return backend_failure("NATS", "--nats-url", &e);
        }
    }
    // Executions past their deadline that no worker runs (a dead worker's, or still queued)
    // are closed by the gateways' deadline sweepers (contract §8), not here: a sweeper reads
    // every job of the namespace, so one per worker would make each added worker cost every
    // execution a read (docs/scaling.md, "What one execution costs").
    if args.leader_placement_ms > 0 {
        runtime::nats::spawn_leader_placement(
            &nats.connection,
            Duration::from_millis(args.leader_placement_ms),
            stopping.clone(),
        );
    }
    let runner = Arc::new(Runner::new(
        registry,
        store,
        Arc::new(nats.cancel),
        keys,
        RunnerSettings {
            append_pace: pace,
            ..RunnerSettings::default()
        },
    ));
    // Deliveries heartbeat at a third of the lease the server holds (see `NatsJobQueue`).
    let heartbeat = queue.lease().unwrap_or_else(|| common.ack_wait()) / 3;
    let pool = WorkerPool::spawn(
        queue,
        runner,
        PoolConfig {
            concurrency,
            heartbeat,
        },
    );
    println!("worker started");
    tracing::info!(namespace = %common.namespace, concurrency, "worker started");
    shutdown.await;
    tracing::info!("shutting down");
    stopping.cancel();
    if !pool.shutdown(common.shutdown_grace()).await {
        tracing::warn!("grace period expired; remaining executions were cancelled");
    }
    depth.abort();
    // Job acks are not confirmed (`runtime::nats::job_queue`): send what the client still
    // buffers, so an orderly stop leaves no finished job to be redelivered.
    match tokio::time::timeout(SHUTDOWN_FLUSH, nats.connection.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot flush the NATS connection at shutdown"),
        Err(_) => tracing::warn!("the NATS connection did not flush in time at shutdown"),
    }
    let _ = admin_task.await;
    ExitCode::SUCCESS
}

/// How long startup waits for NATS and Redis, each.
const CONNECT: Duration = Duration::from_secs(15);

/// How often the worker reads the queue depth from the server.
const JOBS_PENDING_PERIOD: Duration = Duration::from_secs(5);

/// How long a stopping worker waits for its NATS connection to send what it buffers.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn pace_of(args: &[&str]) -> Result<AppendPace, clap::Error> {
        let argv = ["worker", "--backend", "nats"].iter().chain(args);
        WorkerArgs::try_parse_from(argv).map(|a| a.append_pace_ms)
    }

    #[test]
    fn leader_placement_runs_every_30_s_unless_told_another_period_or_0() {
        let placement = |args: &[&str]| {
            let argv = ["worker", "--backend", "nats"].iter().chain(args);
            WorkerArgs::try_parse_from(argv).map(|a| a.leader_placement_ms)
        };
        assert_eq!(placement(&[]).unwrap(), 30_000);
        assert_eq!(placement(&["--leader-placement-ms", "0"]).unwrap(), 0);
        assert_eq!(placement(&["--leader-placement-ms", "500"]).unwrap(), 500);
        for bad in ["1", "499", "3600001", "-1", "often"] {
            let arg = format!("--leader-placement-ms={bad}");
            let error = placement(&[arg.as_str()]).unwrap_err().to_string();
            assert!(error.contains("--leader-placement-ms"), "{error}");
            assert!(error.contains("0 (off)"), "{error}");
        }
    }

    #[test]
    fn the_append_pace_is_adaptive_unless_a_number_of_milliseconds_is_given() {
        assert_eq!(pace_of(&[]).unwrap(), AppendPace::Auto);
        assert!(matches!(AppendPace::Auto.pace(), Pace::Adaptive(_)));
        assert_eq!(
            pace_of(&["--append-pace-ms", "AUTO"]).unwrap(),
            AppendPace::Auto
        );
        assert!(matches!(
            pace_of(&["--append-pace-ms", "0"]).unwrap().pace(),
            Pace::Off
        ));
        assert!(matches!(
            pace_of(&["--append-pace-ms", "40"]).unwrap().pace(),
            Pace::Fixed(d) if d == Duration::from_millis(40)
        ));
        for bad in ["1001", "-1", "fast", ""] {
            let arg = format!("--append-pace-ms={bad}");
            let error = pace_of(&[arg.as_str()]).unwrap_err().to_string();
            assert!(
                error.contains("expected `auto` or a number of milliseconds from 0 to 1000"),
                "{bad}: {error}"
            );
        }
    }
}
