//! The `worker` process: connects to NATS JetStream, pulls jobs and runs them until SIGTERM or
//! SIGINT, then stops taking jobs, lets running executions finish within the grace period and
//! cancels the rest. Jobs it never took stay in the queue for other workers.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use runtime::nats::{NatsConnectSettings, NatsServices, NatsSettings};

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
}

fn startup_error(message: &str, code: u8) -> ExitCode {
    eprintln!("worker: {message}");
    ExitCode::from(code)
}

/// The `worker` binary.
pub async fn run(args: WorkerArgs, shutdown: impl std::future::Future<Output = ()>) -> ExitCode {
    let common = &args.common;
    common.init_tracing();
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
    let settings = NatsConnectSettings {
        url: common.nats_url.clone(),
        layout: NatsSettings {
            retention: deployment.retention,
            max_jobs: i64::try_from(deployment.max_active_executions).unwrap_or(i64::MAX),
            ack_wait: common.ack_wait(),
            replicas: usize::from(common.replicas),
            ..NatsSettings::new(common.namespace.clone())
        },
        max_events: deployment.event_store.max_events as u64,
        connect_timeout: Duration::from_secs(15),
    };
    let connected = async {
        let nats = NatsServices::connect(&settings).await?;
        // The consumer is reconciled now, so a setting JetStream refuses stops the start.
        nats.queue.reconcile_consumer().await?;
        Ok::<_, runtime::StoreError>(nats)
    };
    let nats = match connected.await {
        Ok(nats) => nats,
        Err(e) => {
            tracing::error!(error = %e, "backend connection failed");
            return startup_error(
                &format!("cannot start with NATS ({e}); check --nats-url"),
                1,
            );
        }
    };
    let nats_lease = nats.queue.lease();
    let store: Arc<dyn runtime::EventStore> = Arc::new(nats.store);
    let queue: Arc<dyn runtime::JobQueue> = Arc::new(nats.queue);
    // Deliveries heartbeat at a third of the lease the server holds (see `NatsJobQueue`).
    let heartbeat = nats_lease.unwrap_or_else(|| common.ack_wait()) / 3;
    // Closes executions past their deadline that no worker runs, e.g. a dead worker's
    // (contract §8); gateways run one too.
    let sweeper_stop = tokio_util::sync::CancellationToken::new();
    runtime::DeadlineSweeper::new(
        Arc::clone(&store),
        Arc::clone(&queue),
        runtime::SweeperSettings::default(),
    )
    .spawn(sweeper_stop.clone());
    let runner = Arc::new(Runner::new(
        registry,
        store,
        Arc::new(nats.cancel),
        RunnerSettings::default(),
    ));
    let pool = WorkerPool::spawn(
        queue,
        runner,
        PoolConfig {
            concurrency: common.workers(),
            heartbeat,
        },
    );
    println!("worker started");
    tracing::info!(namespace = %common.namespace, workers = common.workers(), "worker started");
    shutdown.await;
    tracing::info!("shutting down");
    sweeper_stop.cancel();
    if !pool.shutdown(common.shutdown_grace()).await {
        tracing::warn!("grace period expired; remaining executions were cancelled");
    }
    ExitCode::SUCCESS
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
