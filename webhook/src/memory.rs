//! Webhook deliveries in embedded mode (memory backend): the same attempts and schedule as in
//! `nats` mode, fed by the memory event store's [`runtime::memory::StoredHook`], so a delivery
//! is owed exactly when its event is stored.
//!
//! The one decision a reader must know: the guarantee is at least once *within the process*.
//! Everything lives in memory, like the executions themselves: a stopped process loses its
//! executions and the deliveries it still owed. Each endpoint has its own queue and its own
//! slots, so a dead endpoint never delays another; a retry waits for its pause outside any
//! slot. Each endpoint's backlog is bounded ([`MAX_PENDING_PER_ENDPOINT`]); a delivery beyond
//! it is abandoned at once (counted and logged), so a dead endpoint cannot exhaust memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use protocol::Tenant;
use runtime::memory::MemoryEventStore;
use runtime::{EventRecord, EventStore};
use telemetry::metric::{self, webhook_outcome};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::attempt::{Delivery, Next, Sender};
use crate::endpoint::{Endpoint, Endpoints};
use crate::notification::{notification, webhook_event};

/// Attempts in flight per endpoint.
const SLOTS_PER_ENDPOINT: usize = 16;
/// Deliveries one endpoint may owe at once (queued, in flight or waiting for a retry).
pub const MAX_PENDING_PER_ENDPOINT: usize = 100_000;

/// A delivery and the number of its next attempt.
type Queued = (Delivery, u64);

/// The running embedded webhook pipeline.
#[derive(Debug)]
pub struct MemoryWebhooks {
    pending: Arc<AtomicUsize>,
}

impl MemoryWebhooks {
    /// Hooks into `store` and starts one delivery task per endpoint, until `stopping`.
    pub fn start(
        store: &MemoryEventStore,
        endpoints: Arc<Endpoints>,
        sender: Sender,
        stopping: CancellationToken,
    ) -> Self {
        let pending = Arc::new(AtomicUsize::new(0));
        let mut queues = HashMap::new();
        for endpoint in endpoints.all() {
            let (tx, rx) = mpsc::unbounded_channel();
            let owed = Arc::new(AtomicUsize::new(0));
            queues.insert(endpoint.key.clone(), (tx.clone(), Arc::clone(&owed)));
            tokio::spawn(deliver(
                Arc::clone(endpoint),
                sender.clone(),
                rx,
                tx,
                Arc::clone(&pending),
                owed,
                stopping.clone(),
            ));
        }
        // Stored events go through a channel: the hook runs inside an append and must not
        // wait, and a terminal event's usage is read from the log afterwards.
        let (fed, mut feed) = mpsc::unbounded_channel::<(Arc<EventRecord>, Tenant)>();
        let hook_endpoints = Arc::clone(&endpoints);
        store.on_stored(Arc::new(move |record, owner| {
            let wanted = webhook_event(&record.event)
                .is_some_and(|kind| hook_endpoints.for_event(owner, kind).next().is_some());
            if wanted {
                let _ = fed.send((Arc::clone(record), owner.clone()));
            }
        }));
        let reader = store.clone();
        let counter = Arc::clone(&pending);
        tokio::spawn(async move {
            while let Some((record, owner)) = next_until_stopped(&mut feed, &stopping).await {
                let event = &record.event;
                let usage = if event.is_terminal() {
                    match reader.state(event.execution_id).await {
                        Ok(Some(state)) => state.snapshot().usage,
                        _ => Vec::new(),
                    }
                } else {
                    Vec::new()
                };
                let (Some(kind), Some(notification)) =
                    (webhook_event(event), notification(event, &usage))
                else {
                    continue;
                };
                for endpoint in endpoints.for_event(&owner, kind) {
                    let Some((queue, owed)) = queues.get(&endpoint.key) else {
                        continue;
                    };
                    let delivery = Delivery {
                        execution_id: notification.execution_id,
                        webhook_id: notification.webhook_id.clone(),
                        body: notification.body.clone(),
                        retry_within: None,
                    };
                    if owed.fetch_add(1, Ordering::Relaxed) >= MAX_PENDING_PER_ENDPOINT {
                        owed.fetch_sub(1, Ordering::Relaxed);
                        overflow(endpoint, &delivery);
                        continue;
                    }
                    set_pending(&counter, 1);
                    let _ = queue.send((delivery, 1));
                }
            }
        });
        Self { pending }
    }

    /// Deliveries owed now (queued, in flight or waiting for a retry).
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

fn set_pending(pending: &AtomicUsize, delta: isize) {
    let now = if delta >= 0 {
        pending.fetch_add(delta.unsigned_abs(), Ordering::Relaxed) + delta.unsigned_abs()
    } else {
        pending
            .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed)
            .saturating_sub(delta.unsigned_abs())
    };
    metrics::gauge!(metric::WEBHOOK_PENDING).set(now as f64);
}

fn overflow(endpoint: &Endpoint, delivery: &Delivery) {
    metrics::counter!(
        metric::WEBHOOK_DELIVERIES_TOTAL,
        "tenant" => endpoint.tenant.as_str().to_owned(),
        "endpoint" => endpoint.id.clone(),
        "outcome" => webhook_outcome::ABANDONED
    )
    .increment(1);
    tracing::warn!(execution_id = %delivery.execution_id, tenant = %endpoint.tenant,
        endpoint = %endpoint.id, webhook_id = %delivery.webhook_id,
        "webhook delivery abandoned: the endpoint owes too many deliveries");
}

/// The channel's next item; `None` once it is closed or the runtime is stopping.
async fn next_until_stopped<T>(
    channel: &mut mpsc::UnboundedReceiver<T>,
    stopping: &CancellationToken,
) -> Option<T> {
    tokio::select! {
        next = channel.recv() => next,
        () = stopping.cancelled() => None,
    }
}

async fn deliver(
    endpoint: Arc<Endpoint>,
    sender: Sender,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    requeue: mpsc::UnboundedSender<Queued>,
    pending: Arc<AtomicUsize>,
    owed: Arc<AtomicUsize>,
    stopping: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(SLOTS_PER_ENDPOINT));
    while let Some((delivery, number)) = next_until_stopped(&mut queue, &stopping).await {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let endpoint = Arc::clone(&endpoint);
        let sender = sender.clone();
        let requeue = requeue.clone();
        let pending = Arc::clone(&pending);
        let owed = Arc::clone(&owed);
        let stopping = stopping.clone();
        tokio::spawn(async move {
            let next = sender.attempt(&endpoint, &delivery, number).await;
            drop(permit);
            match next {
                Next::Done => {
                    owed.fetch_sub(1, Ordering::Relaxed);
                    set_pending(&pending, -1);
                }
                Next::Retry(pause) => {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = stopping.cancelled() => return,
                    }
                    let _ = requeue.send((delivery, number + 1));
                }
            }
        });
    }
}
