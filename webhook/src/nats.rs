//! Durable webhook deliveries in `nats` mode, derived from the events streams themselves.
//!
//! A delivery is owed once its event is *stored*, so it is derived from what the events
//! streams hold, never from a writer's memory (a writer may die right after its append). Two
//! stages, each a JetStream consumer shared by every delivering process (every worker):
//!
//! 1. **Feed**: a durable pull consumer `{ns}_webhook_feed` on each events stream (shard, see
//!    `runtime::nats::EventShards`) reads every stored message once. For each event some
//!    endpoint of the execution's tenant wants, it publishes one delivery message per endpoint
//!    into the WorkQueue stream `{NS}_WEBHOOKS` (subject `{ns}.webhooks.{endpoint key}`), with
//!    `Nats-Msg-Id = {endpoint key}:{webhook-id}` so a message fed twice (a feeder that died
//!    before its ack) is absorbed by the server; then it acks the events message. A feeder
//!    that dies mid-way leaves the events message unacknowledged, and it is fed again.
//! 2. **Delivery**: one durable pull consumer per endpoint (`{ns}_webhook_{key}`, filtered on
//!    the endpoint's subject). A process pulls only as many deliveries as it has free slots
//!    for that endpoint, attempts each ([`crate::attempt`]), acks on success, abandonment or
//!    410, and otherwise naks with the schedule's pause (`AckKind::Nak(Some(pause))`): the
//!    server holds the delivery and hands it out again after the pause, to any process. The
//!    attempt number is the server's delivery count, so a delivery in flight on a process that
//!    died counts as attempted and is retried by another after the consumer's ack wait.
//!
//! Why one consumer per endpoint rather than one for all: a consumer's unacknowledged
//! deliveries (naked ones waiting for their pause included) count against its
//! `max_ack_pending`, and a process's slots are taken by attempts that may each wait 15 s for
//! a dead receiver. Per endpoint, both are that endpoint's own: a dead endpoint fills only its
//! own consumer and slots, and never delays another endpoint.
//!
//! The feed consumers start at the first stored message after their creation
//! (`DeliverPolicy::New`): [`ensure_layout`] is called at startup by every process that has
//! webhooks configured, gateways included, so deliveries are owed from the first such start
//! of a namespace and not for events stored before webhooks were configured. The cost: the
//! feed reads every stored message of the namespace once (deltas too: the type is in the
//! body), looking up the owner only of events someone wants.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, AckKind, stream};
use futures_util::StreamExt;
use protocol::{ExecutionId, Sequence, Tenant};
use runtime::nats::{
    NatsBackend, OWNER_HEADER, reconcile_pull_consumer, reconcile_stream, stored_events,
};
use runtime::{EventStore, StoreError};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::attempt::{Delivery, Next, RetrySchedule, Sender};
use crate::endpoint::{Endpoint, Endpoints};
use crate::notification::{Notification, notification, webhook_event};

/// Header of a delivery message carrying its `webhook-id`.
const WEBHOOK_ID_HEADER: &str = "Mrt-Webhook-Id";
/// Header of a delivery message naming its execution (for logs).
const EXECUTION_HEADER: &str = "Mrt-Execution-Id";

/// Lease of a fed events message and of a delivery attempt: longer than an attempt's 15 s.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// How long one pull request waits for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(5);
/// Events messages fetched per pull, and fed at once.
const FEED_BATCH: usize = 256;
const FEED_CONCURRENCY: usize = 32;
/// Attempts in flight per endpoint in one process.
const SLOTS_PER_ENDPOINT: usize = 16;
/// Deliveries of one endpoint held by the server (waiting for a retry or in flight) before it
/// hands out no more of them (the rest wait in the stream).
const MAX_PENDING_PER_ENDPOINT: i64 = 100_000;
/// Pause before an events message that could not be fed is fed again.
const FEED_RETRY: Duration = Duration::from_secs(1);
/// How often the pending gauge is read from the server.
const PENDING_PERIOD: Duration = Duration::from_secs(5);
/// Time a retry needs before the deliveries stream's maximum age: its lease and more.
const EXPIRY_MARGIN: Duration = Duration::from_secs(300);
/// How long a delivery message fed twice is recognised as a duplicate.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The deliveries stream of a namespace.
pub fn deliveries_stream(namespace: &str) -> String {
    format!("{}_WEBHOOKS", namespace.to_ascii_uppercase())
}

fn deliveries_subject(namespace: &str, key: &str) -> String {
    format!("{namespace}.webhooks.{key}")
}

fn feed_consumer(namespace: &str) -> String {
    format!("{namespace}_webhook_feed")
}

fn endpoint_consumer(namespace: &str, key: &str) -> String {
    format!("{namespace}_webhook_{key}")
}

/// Creates (or reconciles) the deliveries stream and the feed consumer of every events
/// stream. Called at startup by every process with webhooks configured (see the module docs).
pub async fn ensure_layout(
    backend: &NatsBackend,
    schedule: &RetrySchedule,
) -> Result<(), StoreError> {
    let s = &backend.settings;
    let max_age = deliveries_max_age(s.retention, schedule);
    reconcile_stream(
        &backend.jetstream,
        stream::Config {
            name: deliveries_stream(&s.namespace),
            subjects: vec![format!("{}.webhooks.*", s.namespace)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            max_age,
            duplicate_window: DUPLICATE_WINDOW.min(max_age),
            num_replicas: s.replicas,
            ..Default::default()
        },
    )
    .await?;
    for name in backend.events.streams() {
        let stream = get_stream(&backend.jetstream, &name).await?;
        reconcile_pull_consumer(
            &stream,
            consumer::pull::Config {
                durable_name: Some(feed_consumer(&s.namespace)),
                description: Some("webhook feed: every stored event, once".into()),
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_deliver: -1,
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await?;
    }
    Ok(())
}

/// How long the deliveries stream keeps a delivery: the whole schedule plus a day (workers all
/// stopped, or an endpoint's backlog waiting behind [`MAX_PENDING_PER_ENDPOINT`]), or the
/// deployment's retention when longer. A retry that would come later is abandoned, counted and
/// logged (`Delivery::retry_within`), rather than dropped unseen by the server.
fn deliveries_max_age(retention: Duration, schedule: &RetrySchedule) -> Duration {
    retention.max(schedule.total() + Duration::from_secs(24 * 3600))
}

/// The longest pause a retry of a delivery published `age` ago may have in a stream that keeps
/// messages `max_age` (0: for ever), leaving [`EXPIRY_MARGIN`] for it to be handed out and
/// attempted.
fn retry_within(max_age: Duration, age: Duration) -> Option<Duration> {
    (!max_age.is_zero()).then(|| max_age.saturating_sub(age).saturating_sub(EXPIRY_MARGIN))
}

async fn get_stream(js: &jetstream::Context, name: &str) -> Result<stream::Stream, StoreError> {
    js.get_stream(name)
        .await
        .map_err(|e| StoreError::Unavailable(format!("stream {name}: {e}")))
}

/// The feed and delivery tasks of this process (see the module docs).
#[derive(Debug)]
pub struct NatsWebhooks {
    tasks: Vec<JoinHandle<()>>,
}

impl NatsWebhooks {
    /// Ensures the layout and starts feeding every events stream and delivering to every
    /// endpoint, until `stopping` is cancelled. `store` looks up executions' owners and usage.
    pub async fn start(
        backend: NatsBackend,
        store: Arc<dyn EventStore>,
        endpoints: Arc<Endpoints>,
        sender: Sender,
        stopping: CancellationToken,
    ) -> Result<Self, StoreError> {
        ensure_layout(&backend, sender.schedule()).await?;
        let namespace = backend.settings.namespace.clone();
        let mut tasks = Vec::new();
        let feed = Arc::new(Feed {
            backend: backend.clone(),
            store,
            endpoints: Arc::clone(&endpoints),
        });
        for name in backend.events.streams() {
            let stream = get_stream(&backend.jetstream, &name).await?;
            let consumer: PullConsumer = stream
                .get_consumer(&feed_consumer(&namespace))
                .await
                .map_err(|e| StoreError::Unavailable(format!("webhook feed consumer: {e}")))?;
            tasks.push(tokio::spawn(
                Arc::clone(&feed).run(consumer, stopping.clone()),
            ));
        }
        let mut deliveries = get_stream(&backend.jetstream, &deliveries_stream(&namespace)).await?;
        // As the server has it (a process with another schedule may have set it since).
        let max_age = deliveries
            .info()
            .await
            .map_err(|e| StoreError::Unavailable(format!("webhook deliveries stream: {e}")))?
            .config
            .max_age;
        for endpoint in endpoints.all() {
            let consumer = reconcile_pull_consumer(
                &deliveries,
                consumer::pull::Config {
                    durable_name: Some(endpoint_consumer(&namespace, &endpoint.key)),
                    description: Some(format!(
                        "webhook deliveries to {}/{}",
                        endpoint.tenant, endpoint.id
                    )),
                    filter_subject: deliveries_subject(&namespace, &endpoint.key),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    max_deliver: -1,
                    max_ack_pending: MAX_PENDING_PER_ENDPOINT,
                    ..Default::default()
                },
            )
            .await?;
            tasks.push(tokio::spawn(deliver(
                Arc::clone(endpoint),
                consumer,
                sender.clone(),
                max_age,
                stopping.clone(),
            )));
        }
        tasks.push(tokio::spawn(pending(deliveries, stopping)));
        Ok(Self { tasks })
    }

    /// Stops every task now (in-flight deliveries are unacknowledged and handed out again).
    pub fn abort(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Stage 1 (see the module docs).
struct Feed {
    backend: NatsBackend,
    store: Arc<dyn EventStore>,
    endpoints: Arc<Endpoints>,
}

impl Feed {
    async fn run(self: Arc<Self>, consumer: PullConsumer, stopping: CancellationToken) {
        while !stopping.is_cancelled() {
            let batch = consumer
                .fetch()
                .max_messages(FEED_BATCH)
                .expires(PULL_EXPIRES)
                .messages();
            let batch = tokio::select! {
                batch = batch => batch,
                () = stopping.cancelled() => return,
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot pull the webhook feed");
                    tokio::time::sleep(FEED_RETRY).await;
                    continue;
                }
            };
            let failed = std::sync::atomic::AtomicBool::new(false);
            batch
                .for_each_concurrent(FEED_CONCURRENCY, |message| async {
                    match message {
                        Ok(message) => self.feed(message).await,
                        Err(e) => {
                            tracing::debug!(error = %e, "webhook feed pull ended");
                            failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
                .await;
            // A pull that failed (its consumer gone, the server away) is not repeated at once.
            if failed.into_inner() {
                tokio::time::sleep(FEED_RETRY).await;
            }
        }
    }

    /// Enqueues the deliveries of one events message, then acks it; on failure naks it so it
    /// is fed again.
    async fn feed(&self, message: jetstream::Message) {
        match self.enqueue(&message).await {
            Ok(()) => {
                if let Err(e) = message.ack().await {
                    tracing::debug!(error = %e, "cannot ack a fed events message");
                }
            }
            Err(e) => {
                // Never dropped (a delivery is owed); a message that keeps failing is retried
                // less and less often, up to every 30 s.
                let tries = message.info().map_or(1, |info| info.delivered.clamp(1, 30));
                let pause = FEED_RETRY * u32::try_from(tries).unwrap_or(30);
                tracing::warn!(error = %e, tries, "cannot enqueue webhook deliveries; retrying");
                if let Err(e) = message.ack_with(AckKind::Nak(Some(pause))).await {
                    tracing::debug!(error = %e, "cannot nak an events message");
                }
            }
        }
    }

    async fn enqueue(&self, message: &jetstream::Message) -> Result<(), StoreError> {
        let Some(records) = stored_events(message.headers.as_ref(), message.payload.clone()) else {
            tracing::warn!("webhook feed skips an events message it cannot read");
            return Ok(());
        };
        for record in records {
            let event = &record.event;
            let Some(kind) = webhook_event(event) else {
                continue;
            };
            if !self.endpoints.anyone_wants(kind) {
                continue;
            }
            let id = event.execution_id;
            // Terminal events carry the log's usage: read the whole (closed) log. The first
            // event's message names the owner itself (no header: the default tenant).
            let found = if event.sequence == Sequence(1) && !event.is_terminal() {
                let header = message.headers.as_ref().and_then(|h| h.get(OWNER_HEADER));
                let owner = match header {
                    None => Tenant::default(),
                    Some(value) => value.as_str().parse().map_err(|_| {
                        StoreError::Unavailable("invalid owner header in the events stream".into())
                    })?,
                };
                Some((owner, Vec::new()))
            } else if event.is_terminal() {
                self.store
                    .owned_state(id)
                    .await?
                    .map(|(state, owner)| (owner, state.snapshot().usage))
            } else {
                self.store.owner(id).await?.map(|owner| (owner, Vec::new()))
            };
            let Some((owner, usage)) = found else {
                tracing::debug!(execution_id = %id, "log gone before its webhook was fed");
                continue;
            };
            let targets: Vec<&Arc<Endpoint>> = self.endpoints.for_event(&owner, kind).collect();
            if targets.is_empty() {
                continue;
            }
            let Some(notification) = notification(event, &usage) else {
                continue;
            };
            for endpoint in targets {
                self.publish(endpoint, &notification).await?;
            }
        }
        Ok(())
    }

    async fn publish(
        &self,
        endpoint: &Endpoint,
        notification: &Notification,
    ) -> Result<(), StoreError> {
        let namespace = &self.backend.settings.namespace;
        let message = PublishMessage::build()
            .payload(notification.body.clone())
            .message_id(format!("{}:{}", endpoint.key, notification.webhook_id))
            .header(WEBHOOK_ID_HEADER, notification.webhook_id.as_str())
            .header(
                EXECUTION_HEADER,
                notification.execution_id.to_string().as_str(),
            );
        let unavailable = |e: &dyn std::fmt::Display| {
            StoreError::Unavailable(format!("publish webhook delivery: {e}"))
        };
        let ack = self
            .backend
            .jetstream
            .send_publish(deliveries_subject(namespace, &endpoint.key), message)
            .await
            .map_err(|e| unavailable(&e))?;
        ack.await.map_err(|e| unavailable(&e))?;
        Ok(())
    }
}

/// Stage 2 for one endpoint (see the module docs).
async fn deliver(
    endpoint: Arc<Endpoint>,
    consumer: PullConsumer,
    sender: Sender,
    max_age: Duration,
    stopping: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(SLOTS_PER_ENDPOINT));
    while !stopping.is_cancelled() {
        // Pull only as many deliveries as there are free slots, so none waits here while its
        // lease runs out.
        let free = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => {
                drop(permit);
                slots.available_permits()
            }
            () = stopping.cancelled() => return,
        };
        let batch = consumer
            .fetch()
            .max_messages(free.max(1))
            .expires(PULL_EXPIRES)
            .messages();
        let mut batch = tokio::select! {
            batch = batch => match batch {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::debug!(error = %e, endpoint = %endpoint.id, "cannot pull webhook deliveries");
                    tokio::time::sleep(FEED_RETRY).await;
                    continue;
                }
            },
            () = stopping.cancelled() => return,
        };
        while let Some(message) = batch.next().await {
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    // Not pulled again at once (its consumer gone, the server away).
                    tracing::debug!(error = %e, "webhook delivery pull ended");
                    tokio::time::sleep(FEED_RETRY).await;
                    break;
                }
            };
            let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let endpoint = Arc::clone(&endpoint);
            let sender = sender.clone();
            tokio::spawn(async move {
                attempt(&endpoint, &sender, max_age, message).await;
                drop(permit);
            });
        }
    }
}

async fn attempt(
    endpoint: &Endpoint,
    sender: &Sender,
    max_age: Duration,
    message: jetstream::Message,
) {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    let (Some(webhook_id), Some(execution_id), Ok(info)) = (
        header(WEBHOOK_ID_HEADER),
        header(EXECUTION_HEADER).and_then(|id| id.parse::<ExecutionId>().ok()),
        message.info(),
    ) else {
        tracing::warn!("dropping a webhook delivery message without its headers");
        let _ = message.ack().await;
        return;
    };
    let number = u64::try_from(info.delivered).unwrap_or(1).max(1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let age = u128::try_from(info.published.unix_timestamp_nanos())
        .map_or(0, |published| now.saturating_sub(published));
    let delivery = Delivery {
        execution_id,
        webhook_id,
        body: message.payload.clone(),
        retry_within: retry_within(
            max_age,
            Duration::from_nanos(u64::try_from(age).unwrap_or(u64::MAX)),
        ),
    };
    let acked = match sender.attempt(endpoint, &delivery, number).await {
        Next::Done => message.ack().await,
        Next::Retry(pause) if pause.is_zero() => message.ack_with(AckKind::Nak(None)).await,
        Next::Retry(pause) => message.ack_with(AckKind::Nak(Some(pause))).await,
    };
    if let Err(e) = acked {
        // The lease runs out and the delivery is handed out again: at least once.
        tracing::debug!(error = %e, execution_id = %execution_id, "cannot acknowledge a webhook delivery");
    }
}

/// Reads `mrt_webhook_pending` (deliveries in the stream: waiting, in flight or waiting for a
/// retry) from the server every few seconds, never per scrape.
async fn pending(mut deliveries: stream::Stream, stopping: CancellationToken) {
    loop {
        match deliveries.info().await {
            Ok(info) => {
                metrics::gauge!(telemetry::metric::WEBHOOK_PENDING).set(info.state.messages as f64)
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the webhook deliveries stream"),
        }
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(PENDING_PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_namespace_and_the_endpoint_key() {
        assert_eq!(deliveries_stream("mrt"), "MRT_WEBHOOKS");
        assert_eq!(deliveries_subject("mrt", "00ff"), "mrt.webhooks.00ff");
        assert_eq!(feed_consumer("mrt"), "mrt_webhook_feed");
        assert_eq!(endpoint_consumer("mrt", "00ff"), "mrt_webhook_00ff");
    }

    #[test]
    fn a_delivery_is_kept_a_day_past_its_schedule_and_retried_only_within_it() {
        let hour = Duration::from_secs(3600);
        let schedule = RetrySchedule::new(vec![hour, 2 * hour]);
        assert_eq!(deliveries_max_age(hour, &schedule), 27 * hour);
        assert_eq!(deliveries_max_age(100 * hour, &schedule), 100 * hour);
        let max_age = 27 * hour;
        assert_eq!(retry_within(max_age, hour), Some(26 * hour - EXPIRY_MARGIN));
        assert_eq!(retry_within(max_age, 30 * hour), Some(Duration::ZERO));
        assert_eq!(retry_within(Duration::ZERO, 30 * hour), None);
    }
}
