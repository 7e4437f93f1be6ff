//! One constructor for a process's JetStream backends: the gateway and the worker connect the
//! same way, so they always agree on the layout and the per-execution limits.

use std::time::Duration;

use super::{
    NatsAccess, NatsBackend, NatsCancelBus, NatsEventStore, NatsJobQueue, NatsSettings,
    until_settled,
};
use crate::error::StoreError;

/// Where and how a process connects to NATS. Built by each binary from its own command line and
/// deployment file, so this crate does not depend on either.
#[derive(Debug, Clone)]
pub struct NatsConnectSettings {
    /// Server URL (`nats://host:4222`, `tls://host:4222`), credentials allowed (they are split
    /// off before the client sees the address).
    pub url: String,
    /// Credentials and TLS beyond the URL (contract §7).
    pub access: NatsAccess,
    /// The JetStream layout (namespace, retention, job lease, queue bound).
    pub layout: NatsSettings,
    /// Events per execution before non-terminal appends fail with `ExecutionLimit` [R 84].
    pub max_events: u64,
    /// How long startup retries an unreachable server before giving up.
    pub connect_timeout: Duration,
}

impl NatsConnectSettings {
    /// Settings for `url` with the layout of `namespace` and default limits.
    pub fn new(url: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            access: NatsAccess::default(),
            layout: NatsSettings::new(namespace),
            max_events: 4096,
            connect_timeout: Duration::from_secs(15),
        }
    }
}

/// The event store, job queue and cancel bus of one connection.
#[derive(Debug)]
pub struct NatsServices {
    /// The shared connection, for callers that need more than the three services.
    pub connection: NatsBackend,
    pub store: NatsEventStore,
    pub queue: NatsJobQueue,
    pub cancel: NatsCancelBus,
}

impl NatsServices {
    /// Connects (bounded by `connect_timeout`, within which requests a settling cluster times
    /// out are tried again: [`until_settled`]), creates or verifies the streams and buckets,
    /// and builds the three services on the one connection.
    pub async fn connect(settings: &NatsConnectSettings) -> Result<Self, StoreError> {
        let deadline = tokio::time::Instant::now() + settings.connect_timeout;
        let connection = NatsBackend::connect_with(
            &settings.url,
            &settings.access,
            settings.layout.clone(),
            settings.connect_timeout,
        )
        .await?;
        let store = until_settled(deadline, || {
            NatsEventStore::new(connection.clone(), settings.max_events)
        })
        .await?;
        let cancel = until_settled(deadline, || NatsCancelBus::new(connection.clone())).await?;
        let queue = NatsJobQueue::new(connection.clone());
        Ok(Self {
            connection,
            store,
            queue,
            cancel,
        })
    }
}
