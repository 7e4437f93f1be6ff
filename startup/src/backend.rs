//! The distributed backends' settings as both binaries take them: NATS access (credentials,
//! TLS) and the JetStream layout from the command line and the deployment, and the Redis
//! idempotency key store. The gateway and the worker connect with the same settings, so they
//! always agree on the namespace's layout.

use std::time::Duration;

use config::{CommonArgs, DeploymentConfig, NatsAccessArgs};
use runtime::StoreError;
use runtime::nats::{NatsAccess, NatsConnectSettings, NatsSettings};
use runtime::redis_idempotency::RedisIdempotencyStore;

/// The NATS credentials and TLS settings of the command line and environment.
pub fn nats_access(args: &NatsAccessArgs) -> NatsAccess {
    NatsAccess {
        user: args.nats_user.clone(),
        password: args.nats_password.as_ref().map(|s| s.expose().to_owned()),
        token: args.nats_token.as_ref().map(|s| s.expose().to_owned()),
        creds_file: args.nats_creds.clone(),
        nkey_file: args.nats_nkey.clone(),
        ca_file: args.nats_ca.clone(),
        cert_file: args.nats_cert.clone(),
        key_file: args.nats_key.clone(),
    }
}

/// The JetStream layout settings for this deployment; `Misconfigured` when the partition
/// flags disagree.
pub fn nats_settings<P>(
    args: &CommonArgs,
    deployment: &DeploymentConfig<P>,
) -> Result<NatsSettings, StoreError> {
    Ok(NatsSettings {
        retention: deployment.retention,
        max_jobs: i64::try_from(deployment.max_active_executions).unwrap_or(i64::MAX),
        ack_wait: args.ack_wait(),
        replicas: usize::from(args.replicas),
        event_shards: args.partitions().map_err(StoreError::Misconfigured)?,
        tenant_lanes: args.tenant_lanes,
        ..NatsSettings::new(args.namespace.clone())
    })
}

/// Everything `runtime::nats::NatsServices::connect` needs: the URL, access and layout of
/// the command line and deployment, each connection attempt bounded by `connect_timeout`.
pub fn nats_connect_settings<P>(
    args: &CommonArgs,
    deployment: &DeploymentConfig<P>,
    connect_timeout: Duration,
) -> Result<NatsConnectSettings, StoreError> {
    Ok(NatsConnectSettings {
        url: args.nats_url.clone(),
        access: nats_access(&args.nats_access),
        layout: nats_settings(args, deployment)?,
        max_events: deployment.event_store.max_events as u64,
        connect_timeout,
    })
}

/// Connects the namespace's idempotency key store in Redis (`--redis-url`, `--redis-ca`),
/// keys kept the deployment's retention.
pub async fn redis_keys<P>(
    args: &CommonArgs,
    deployment: &DeploymentConfig<P>,
    connect_timeout: Duration,
) -> Result<RedisIdempotencyStore, StoreError> {
    RedisIdempotencyStore::connect_with(
        &args.redis_url,
        args.redis_ca.as_deref(),
        &args.namespace,
        deployment.retention,
        connect_timeout,
    )
    .await
}
