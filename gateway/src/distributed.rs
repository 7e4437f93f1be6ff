//! Distributed mode wiring: JetStream for jobs, events and cancellation, Redis for idempotency
//! keys and tenant quotas, connected with the settings the worker uses too
//! (`startup::backend`). The gateway holds no execution state, so any number of gateways serve any execution.

use std::sync::Arc;
use std::time::Duration;

use config::{CommonArgs, DeploymentConfig};
use runtime::nats::{NatsBackend, NatsServices};
use runtime::{EventStore, StoreError};

use crate::state::Backend;

/// How long startup waits for NATS and Redis before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Bytes of a job or event message beyond the request body: the job envelope (ids, times,
/// traceparent), message headers, and JSON re-serialization of the request.
pub const ENVELOPE_MARGIN: usize = 16 * 1024;

/// The body limit the job queue and event store accept: the configured limit, clamped to the
/// server's `max_payload` minus [`ENVELOPE_MARGIN`] (logged when it clamps), so an oversized
/// body is a 413 and never a failed publish (503).
pub fn effective_body_limit(configured: usize, max_payload: usize) -> usize {
    if max_payload == 0 {
        return configured;
    }
    let fits = max_payload.saturating_sub(ENVELOPE_MARGIN).max(1);
    if configured > fits {
        tracing::warn!(
            configured,
            effective = fits,
            max_payload,
            "limits.max_body_bytes exceeds what NATS accepts (max_payload); clamped"
        );
        fits
    } else {
        configured
    }
}

/// Connects every distributed backend (bounded by [`CONNECT_TIMEOUT`] each).
pub async fn connect<P>(
    args: &CommonArgs,
    deployment: &DeploymentConfig<P>,
) -> Result<(Backend, NatsBackend), StoreError> {
    let mut settings = startup::backend::nats_connect_settings(args, deployment, CONNECT_TIMEOUT)?;
    // Every event stream this gateway serves receives its execution's stored events: with
    // several partitions they arrive on one readers' connection per lane, not all on one.
    settings.layout.reader_lanes = true;
    let nats = NatsServices::connect(&settings).await?;
    let idempotency = startup::backend::redis_keys(args, deployment, CONNECT_TIMEOUT).await?;
    let store: Arc<dyn EventStore> = Arc::new(nats.store);
    let quotas =
        crate::quota::distributed_gate(deployment, &idempotency, &args.namespace, store.clone())
            .await?;
    let backend = Backend {
        store,
        queue: Arc::new(nats.queue),
        idempotency: Arc::new(idempotency),
        cancel: Arc::new(nats.cancel),
        quotas: Arc::new(quotas),
        heal_missing: true,
    };
    Ok((backend, nats.connection))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_limit_fits_the_server_payload() {
        let mib = 1024 * 1024;
        assert_eq!(effective_body_limit(mib, mib), mib - ENVELOPE_MARGIN);
        assert_eq!(effective_body_limit(2048, mib), 2048);
        assert_eq!(
            effective_body_limit(8 * mib, 8 * mib + ENVELOPE_MARGIN),
            8 * mib
        );
        assert_eq!(effective_body_limit(mib, 0), mib, "unknown payload limit");
        assert_eq!(effective_body_limit(mib, 100), 1);
    }
}
