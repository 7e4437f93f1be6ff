//! A job delivered by JetStream: the lease it runs under (the consumer's `ack_wait` as the
//! server holds it, re-read in the background) and its acknowledgements (see the parent
//! module's docs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind, Stream};
use async_trait::async_trait;
use bytes::Bytes;

use super::TRACEPARENT;
use crate::error::StoreError;
use crate::job::{Delivery, DeliveryHandle, Job};
use crate::nats::unavailable;

/// How often a process re-reads the consumer's `ack_wait` while it holds deliveries.
const LEASE_REFRESH: Duration = Duration::from_secs(5);

/// The lease in force on the server, shared by the queue and its deliveries.
pub(super) struct Lease {
    pub(super) consumer: PullConsumer,
    ack_wait_ms: AtomicU64,
    pub(super) read_at: parking_lot::Mutex<Instant>,
}

impl Lease {
    pub(super) fn new(consumer: PullConsumer) -> Self {
        let ack_wait = consumer.cached_info().config.ack_wait;
        Self {
            consumer,
            ack_wait_ms: AtomicU64::new(millis(ack_wait)),
            read_at: parking_lot::Mutex::new(Instant::now()),
        }
    }

    pub(super) fn get(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms.load(Ordering::Relaxed))
    }

    /// Re-reads `ack_wait` from the server, in the background, when the last read is older
    /// than [`LEASE_REFRESH`]. Neither a heartbeat nor a pull waits for the read: on a busy
    /// server a JetStream API round trip can take longer than a short lease leaves between
    /// two beats, and the beat that waited would come too late.
    pub(super) fn refresh(self: &Arc<Self>) {
        {
            let mut read_at = self.read_at.lock();
            if read_at.elapsed() < LEASE_REFRESH {
                return;
            }
            *read_at = Instant::now();
        }
        let lease = Arc::clone(self);
        tokio::spawn(async move {
            match lease.consumer.get_info().await {
                Ok(info) => {
                    let ms = millis(info.config.ack_wait);
                    if lease.ack_wait_ms.swap(ms, Ordering::Relaxed) != ms {
                        tracing::info!(ack_wait_ms = ms, "job lease changed on the server");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not re-read the job lease"),
            }
        });
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Decodes a job's payload, on the blocking pool when it is large ([`crate::apart`]: a 1 MiB
/// job of the costliest JSON shapes takes 3-12 ms to decode in a release build, time the
/// executions running on that thread would otherwise wait); `None` when the decoding could not
/// finish (the runtime is shutting down).
async fn decode(payload: Bytes) -> Option<Result<Job, serde_json::Error>> {
    crate::apart::apart(payload.len(), move || serde_json::from_slice(&payload)).await
}

/// The delivery a pulled message carries, received at `received_at`. An undecodable job is
/// terminated (never redelivered) and yields `None`, as does one whose decoding could not
/// finish (left to a redelivery).
pub(super) async fn delivery(
    message: async_nats::jetstream::Message,
    received_at: tokio::time::Instant,
    lease: &Arc<Lease>,
    stream: &Arc<Stream>,
) -> Option<Delivery> {
    let (delivered, stream_sequence, pending) = message
        .info()
        .map(|i| (i.delivered, i.stream_sequence, Some(i.pending)))
        .unwrap_or((1, 0, None));
    let (message, acker) = message.split();
    match decode(message.payload.clone()).await? {
        Ok(mut job) => {
            tracing::debug!(execution_id = %job.execution_id, stream_sequence, delivered, "job delivered");
            job.traceparent = message
                .headers
                .as_ref()
                .and_then(|h| h.get(TRACEPARENT))
                .map(|v| v.as_str().to_owned());
            Some(Delivery {
                job,
                delivered: u32::try_from(delivered).unwrap_or(u32::MAX),
                handle: Box::new(NatsDelivery {
                    acker,
                    lease: Arc::clone(lease),
                    stream: Arc::clone(stream),
                    stream_sequence,
                    received_at,
                    pending,
                }),
            })
        }
        Err(e) => {
            tracing::error!(error = %e, "undecodable job; terminating it");
            let _ = acker.ack_with(AckKind::Term).await;
            None
        }
    }
}

struct NatsDelivery {
    acker: Acker,
    lease: Arc<Lease>,
    /// The jobs stream and the job's sequence in it (for `withdrawn`).
    stream: Arc<Stream>,
    stream_sequence: u64,
    received_at: tokio::time::Instant,
    /// Jobs the consumer had left to hand out after this one (the delivery's metadata).
    pending: Option<u64>,
}

#[async_trait]
impl DeliveryHandle for NatsDelivery {
    /// Not confirmed by the server: a confirmation costs a message per job and would tell
    /// only what a lost ack shows anyway, a redelivery after the lease, which finds the log
    /// terminal and is acknowledged again. The worker flushes its connection when it stops,
    /// so an orderly stop loses none.
    async fn ack(&self) -> Result<(), StoreError> {
        self.acker.ack().await.map_err(|e| unavailable("ack", e))
    }

    async fn in_progress(&self) -> Result<(), StoreError> {
        self.acker
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| unavailable("progress ack", e))?;
        self.lease.refresh();
        Ok(())
    }

    fn lease(&self) -> Option<Duration> {
        Some(self.lease.get())
    }

    fn received_at(&self) -> Option<tokio::time::Instant> {
        Some(self.received_at)
    }

    fn pending(&self) -> Option<u64> {
        self.pending
    }

    async fn release(&self) -> Result<(), StoreError> {
        self.acker
            .ack_with(AckKind::Nak(None))
            .await
            .map_err(|e| unavailable("release", e))
    }

    /// Asked of the server that applied the delete, if any: with one replica a direct get,
    /// answered by that server as it reads the request; with replicas, where any of them may
    /// answer a direct get (one that has not applied the delete yet too), the stream's
    /// message-get API, answered by its leader. The API's requests wait in the server's one
    /// JetStream API queue, which under load backs up and drops what it holds (every API
    /// request of every client then times out), so the direct get is taken wherever it is
    /// exact. A worker asks this only while a job's log is still missing after its quick
    /// polls (`worker::runner::claim`).
    async fn withdrawn(&self) -> Result<bool, StoreError> {
        let config = &self.stream.cached_info().config;
        if config.allow_direct && config.num_replicas <= 1 {
            return match self.stream.direct_get(self.stream_sequence).await {
                Ok(_) => Ok(false),
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(true),
                Err(e) => Err(unavailable("job lookup", e)),
            };
        }
        match self.stream.get_raw_message(self.stream_sequence).await {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => {
                // Deleted (withdrawn, or acknowledged by an earlier delivery), or not applied
                // by the leader yet: a consumer led from a follower delivers a message as soon
                // as that follower applied it, which can be before the leader did. Only a
                // sequence the stream has reached can have been deleted.
                let info = self
                    .stream
                    .get_info()
                    .await
                    .map_err(|e| unavailable("job stream info", e))?;
                Ok(self.stream_sequence <= info.state.last_sequence)
            }
            Err(e) => Err(unavailable("job lookup", e)),
        }
    }
}
