//! Distributed mode wiring: JetStream for jobs, events and cancellation, Redis for idempotency
//! keys. The gateway holds no execution state, so any number of gateways serve any execution.

use std::sync::Arc;
use std::time::Duration;

use config::{CommonArgs, DeploymentConfig};
use runtime::StoreError;
use runtime::nats::{NatsBackend, NatsConnectSettings, NatsServices, NatsSettings};
use runtime::redis_idempotency::RedisIdempotencyStore;

use crate::state::Backend;

/// How long startup waits for NATS and Redis before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The JetStream layout settings for this deployment.
pub fn nats_settings<P>(args: &CommonArgs, deployment: &DeploymentConfig<P>) -> NatsSettings {
    NatsSettings {
        retention: deployment.retention,
        max_jobs: i64::try_from(deployment.max_active_executions).unwrap_or(i64::MAX),
        ack_wait: args.ack_wait(),
        ..NatsSettings::new(args.namespace.clone())
    }
}

/// Connects every distributed backend (bounded by [`CONNECT_TIMEOUT`] each).
pub async fn connect<P>(
    args: &CommonArgs,
    deployment: &DeploymentConfig<P>,
) -> Result<(Backend, NatsBackend), StoreError> {
    let nats = NatsServices::connect(&NatsConnectSettings {
        url: args.nats_url.clone(),
        layout: nats_settings(args, deployment),
        max_events: deployment.event_store.max_events as u64,
        connect_timeout: CONNECT_TIMEOUT,
    })
    .await?;
    let idempotency = RedisIdempotencyStore::connect(
        &args.redis_url,
        &args.namespace,
        deployment.retention,
        CONNECT_TIMEOUT,
    )
    .await?;
    let backend = Backend {
        store: Arc::new(nats.store),
        queue: Arc::new(nats.queue),
        idempotency: Arc::new(idempotency),
        cancel: Arc::new(nats.cancel),
        heal_missing: true,
    };
    Ok((backend, nats.connection))
}
