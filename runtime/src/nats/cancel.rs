//! Cancellation across processes: a durable mark in the `{NS}_CANCEL` KV bucket plus a core
//! message on `{ns}.cancel.{id}` for prompt delivery. A worker subscribes to `{ns}.cancel.*`
//! and also re-checks the marks of the executions it runs every [`RECHECK`], so a core message
//! lost during a disconnect still cancels within seconds.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use futures_util::StreamExt;
use protocol::ExecutionId;
use tokio_util::sync::CancellationToken;

use super::{NatsBackend, unavailable};
use crate::cancel::{CancelBus, Watches};
use crate::error::StoreError;

/// Interval of the durable-mark re-check for watched executions.
pub const RECHECK: Duration = Duration::from_secs(2);

/// Marks kept per execution: only whether one exists matters.
const CANCEL_HISTORY: i64 = 1;

type Tokens = Arc<Watches>;

/// See the module docs.
pub struct NatsCancelBus {
    backend: NatsBackend,
    kv: kv::Store,
    tokens: Tokens,
    stop: CancellationToken,
}

impl std::fmt::Debug for NatsCancelBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsCancelBus").finish_non_exhaustive()
    }
}

impl Drop for NatsCancelBus {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl NatsCancelBus {
    /// Creates the bucket or reconciles its age limit, and starts listening for cancel messages.
    pub async fn new(backend: NatsBackend) -> Result<Self, StoreError> {
        let s = &backend.settings;
        let kv = match backend.jetstream.get_key_value(s.cancel_bucket()).await {
            Ok(kv) => {
                // An existing bucket keeps marks as long as this process's retention says.
                super::reconcile::kv_bucket(
                    &backend.jetstream,
                    &s.cancel_bucket(),
                    s.retention,
                    CANCEL_HISTORY,
                    s.replicas,
                )
                .await?;
                kv
            }
            Err(_) => match backend
                .jetstream
                .create_key_value(kv::Config {
                    bucket: s.cancel_bucket(),
                    history: CANCEL_HISTORY,
                    max_age: s.retention,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    num_replicas: s.replicas,
                    ..Default::default()
                })
                .await
            {
                Ok(kv) => kv,
                // Created concurrently by another process.
                Err(_) => backend
                    .jetstream
                    .get_key_value(s.cancel_bucket())
                    .await
                    .map_err(|e| unavailable("cancel bucket", e))?,
            },
        };
        let subscriber = backend
            .client
            .subscribe(format!("{}.cancel.*", s.namespace))
            .await
            .map_err(|e| unavailable("subscribe cancel", e))?;
        let tokens: Tokens = Arc::default();
        let stop = CancellationToken::new();
        tokio::spawn(listen(subscriber, Arc::clone(&tokens), stop.clone()));
        tokio::spawn(recheck(kv.clone(), Arc::clone(&tokens), stop.clone()));
        Ok(Self {
            backend,
            kv,
            tokens,
            stop,
        })
    }

    /// Executions watched by this process (for tests).
    pub fn watched(&self) -> usize {
        self.tokens.len()
    }
}

async fn listen(mut subscriber: async_nats::Subscriber, tokens: Tokens, stop: CancellationToken) {
    loop {
        let message = tokio::select! {
            m = subscriber.next() => m,
            () = stop.cancelled() => return,
        };
        let Some(message) = message else { return };
        let id = message
            .subject
            .rsplit('.')
            .next()
            .and_then(|s| s.parse::<ExecutionId>().ok());
        if let Some(id) = id {
            tokens.cancel(id);
        }
    }
}

async fn recheck(kv: kv::Store, tokens: Tokens, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(RECHECK) => {}
            () = stop.cancelled() => return,
        }
        let watched = tokens.pending();
        for (id, token) in watched {
            if let Ok(Some(_)) = kv.get(id.to_string()).await {
                token.cancel();
            }
        }
    }
}

#[async_trait]
impl CancelBus for NatsCancelBus {
    /// A cancel requested before a watch began is caught by the next re-check.
    fn watches(&self) -> &Watches {
        &self.tokens
    }

    async fn request(&self, id: ExecutionId) -> Result<(), StoreError> {
        self.backend.check_connected()?;
        self.kv
            .put(id.to_string(), bytes::Bytes::from_static(b"1"))
            .await
            .map_err(|e| unavailable("cancel mark", e))?;
        self.backend
            .client
            .publish(
                self.backend.settings.cancel_subject(&id),
                bytes::Bytes::new(),
            )
            .await
            .map_err(|e| unavailable("cancel publish", e))?;
        // Also cancel locally without a round trip, in case the runner is in this process.
        self.tokens.cancel(id);
        Ok(())
    }
}
