//! Cancellation across processes: a durable mark in the `{NS}_CANCEL` KV bucket plus a core
//! message on `{ns}.cancel.{id}`. Every process subscribes to `{ns}.cancel.*`, the prompt path,
//! and also follows the bucket with one watch (an ordered consumer of its stream), the reliable
//! path: each mark reaches each process once, as soon as it is stored, and cancels the
//! execution's token where it is watched, even when its core message was lost (in a disconnect,
//! or by a process that died between the two). A watch is started again from the revision after
//! the last mark it brought when it fails and when the connection reconnects.
//!
//! Nothing is read per running execution: an earlier version re-read the mark of every
//! execution it ran every 2 s, a KV get per 2 s of each execution's life (30 for a 60-s model
//! call), to catch a lost core message. The prompt path stays because a watch whose consumer
//! was on a server that died while this process stayed connected to another is noticed only
//! after two missed heartbeats (10 s).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use futures_util::StreamExt;
use protocol::ExecutionId;
use tokio_util::sync::CancellationToken;

use super::{NatsBackend, unavailable};
use crate::backoff::Backoff;
use crate::cancel::{CancelBus, Watches};
use crate::error::StoreError;

/// The first pause before a failed watch is started again; it doubles up to [`REWATCH_MAX`].
const REWATCH_FIRST: Duration = Duration::from_millis(100);
const REWATCH_MAX: Duration = Duration::from_secs(2);

/// How often the connection's reconnects are checked (see [`follow`]).
const RECONNECT_CHECK: Duration = Duration::from_secs(1);

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
    /// Creates the bucket or reconciles its age limit, and starts following its marks.
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
        // Marks from the bucket's next revision on: the watch exists before `new` returns,
        // so every watch of an execution begun after it sees every later mark.
        let next = kv
            .status()
            .await
            .map_err(|e| unavailable("cancel bucket status", e))?
            .info
            .state
            .last_sequence
            + 1;
        let watch = kv
            .watch_all_from_revision(next)
            .await
            .map_err(|e| unavailable("cancel watch", e))?;
        let subscriber = backend
            .client
            .subscribe(format!("{}.cancel.*", s.namespace))
            .await
            .map_err(|e| unavailable("subscribe cancel", e))?;
        let tokens: Tokens = Arc::default();
        let stop = CancellationToken::new();
        tokio::spawn(listen(subscriber, Arc::clone(&tokens), stop.clone()));
        tokio::spawn(follow(
            kv.clone(),
            backend.client.clone(),
            watch,
            next,
            Arc::clone(&tokens),
            stop.clone(),
        ));
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

/// Cancels the watched token of every execution marked from revision `next` on, following
/// the bucket with `watch`. The watch is started again from the revision after the last mark
/// it brought when it fails, and when the connection reconnected (checked every
/// [`RECONNECT_CHECK`]): its consumer may be gone with the server it was on, and would be
/// noticed missing only after two missed heartbeats, 10 s.
async fn follow(
    kv: kv::Store,
    client: async_nats::Client,
    mut watch: kv::Watch,
    mut next: u64,
    tokens: Tokens,
    stop: CancellationToken,
) {
    let mut connects = super::connects(&client);
    let mut check = tokio::time::interval(RECONNECT_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let restart = tokio::select! {
            item = watch.next() => match item {
                Some(Ok(entry)) => {
                    next = entry.revision + 1;
                    if entry.operation == kv::Operation::Put
                        && let Ok(id) = entry.key.parse::<ExecutionId>()
                    {
                        tokens.cancel(id);
                    }
                    false
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "cancel watch failed; starting it again");
                    true
                }
                None => true,
            },
            _ = check.tick() => {
                let now = super::connects(&client);
                std::mem::replace(&mut connects, now) != now
            }
            () = stop.cancelled() => return,
        };
        if restart {
            match rewatch(&kv, next, &stop).await {
                Some(again) => watch = again,
                None => return,
            }
        }
    }
}

/// A watch of the bucket from revision `next`, retried until it starts; `None` once `stop`.
async fn rewatch(kv: &kv::Store, next: u64, stop: &CancellationToken) -> Option<kv::Watch> {
    let mut backoff = Backoff::new(REWATCH_FIRST, REWATCH_MAX);
    loop {
        match kv.watch_all_from_revision(next).await {
            Ok(watch) => return Some(watch),
            Err(e) => tracing::warn!(error = %e, "cannot watch the cancel marks; retrying"),
        }
        // Without a budget there is always a next pause.
        let pause = backoff.next_pause().unwrap_or(REWATCH_MAX);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return None,
        }
    }
}

#[async_trait]
impl CancelBus for NatsCancelBus {
    /// A cancel requested before a watch began does not reach it (the trait's contract: the
    /// runner watches before it claims, and a gateway requests only once the log is claimed).
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
