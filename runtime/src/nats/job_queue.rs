//! The JetStream job queue: a WorkQueue stream with one durable pull consumer shared by all
//! workers. Each `receive` is one pull request for one job, and `receive_up_to(n)` one for at
//! most `n` (a worker asks for as many as it has free slots, so a worker never holds jobs it
//! has no free slot for). A request stays open until it has brought its `n` jobs or
//! [`PULL_EXPIRES`] passed: under load one round trip brings several jobs at once, and jobs
//! that arrive one at a time (a lightly loaded deployment) come through one request, not a
//! request each (each also cost an inbox subscription and the server's "no messages" answer).
//! The jobs a request brings are taken as they arrive and decoded side by side (large ones on
//! the blocking pool, [`DECODE_APART`]), and each delivery keeps when it was received
//! (`DeliveryHandle::received_at`): its lease runs from about then, so the worker times its
//! first heartbeat from then, not from when the job starts.
//! Unacknowledged jobs are redelivered after `ack_wait` (worker loss), and running executions
//! extend their lease with progress acks. Acks go unconfirmed (see `NatsDelivery::ack`).
//!
//! The lease is the consumer's `ack_wait` as the server holds it, read back when the consumer is
//! created or updated and re-read while deliveries heartbeat: another worker started with a
//! different `--ack-wait-ms` changes it for everyone, and heartbeating at a third of a stale
//! local value would let the server redeliver healthy executions. The re-read runs in the
//! background, so no beat waits for it. (A delivery already waiting for its next beat when the
//! lease shrinks keeps that one wait, as does the beat that started the re-read: shrinking the
//! lease below a third of the old one while executions run may still cost them a
//! redelivery.)
//!
//! `scan` reads held jobs with the stream's message-get API (`next_by_subj` from a sequence),
//! one request per job: a WorkQueue stream admits no second consumer overlapping the workers'
//! one, and a get neither takes nor delays a delivery. Acknowledged jobs are gone from the
//! stream, so a scan reads only jobs waiting or running (at most `max_jobs`).
//!
//! `withdraw` (a submission that failed after its job may have been stored) publishes the job
//! again under the same `Nats-Msg-Id`: inside the duplicate window the server answers with the
//! stored original's sequence (or stores it now if the first publish never landed), and that
//! sequence is then deleted. Deleting a job a worker holds makes its ack a no-op; the worker
//! learns of it through `withdrawn`, a get of its delivery's sequence from the stream leader.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::AckKind;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::{self, PullConsumer};
use async_nats::jetstream::message::{Acker, PublishMessage};
use async_nats::jetstream::stream::{DeleteMessageErrorKind, RawMessageErrorKind, Stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::{NatsBackend, unavailable};
use crate::error::StoreError;
use crate::job::{Deliveries, Delivery, DeliveryHandle, Job, JobQueue, QueuedJob};

/// How long one pull request stays open for the jobs it asked for (see the module docs).
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// How often a process re-reads the consumer's `ack_wait` while it holds deliveries.
const LEASE_REFRESH: Duration = Duration::from_secs(5);

/// The lease in force on the server, shared by the queue and its deliveries.
struct Lease {
    consumer: PullConsumer,
    ack_wait_ms: AtomicU64,
    read_at: parking_lot::Mutex<Instant>,
}

impl Lease {
    fn new(consumer: PullConsumer) -> Self {
        let ack_wait = consumer.cached_info().config.ack_wait;
        Self {
            consumer,
            ack_wait_ms: AtomicU64::new(millis(ack_wait)),
            read_at: parking_lot::Mutex::new(Instant::now()),
        }
    }

    fn get(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms.load(Ordering::Relaxed))
    }

    /// Re-reads `ack_wait` from the server, in the background, when the last read is older
    /// than [`LEASE_REFRESH`]. Neither a heartbeat nor a pull waits for the read: on a busy
    /// server a JetStream API round trip can take longer than a short lease leaves between
    /// two beats, and the beat that waited would come too late.
    fn refresh(self: &Arc<Self>) {
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

/// The W3C trace context header of a job message.
const TRACEPARENT: &str = "traceparent";

/// See the module docs.
pub struct NatsJobQueue {
    backend: NatsBackend,
    lease: OnceCell<Arc<Lease>>,
    /// The jobs stream, looked up on the first scan.
    jobs_stream: OnceCell<async_nats::jetstream::stream::Stream>,
    closed: CancellationToken,
}

impl std::fmt::Debug for NatsJobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsJobQueue").finish_non_exhaustive()
    }
}

impl NatsJobQueue {
    pub fn new(backend: NatsBackend) -> Self {
        Self {
            backend,
            lease: OnceCell::new(),
            jobs_stream: OnceCell::new(),
            closed: CancellationToken::new(),
        }
    }

    /// Creates the workers' consumer or updates it to this process's settings (`ack_wait`,
    /// `max_ack_pending`), and returns the lease the server then holds. Workers call it at
    /// startup so a setting JetStream refuses stops the start; otherwise the first `receive`
    /// does it. Publishers (gateways) never touch the consumer.
    pub async fn reconcile_consumer(&self) -> Result<Duration, StoreError> {
        Ok(self.shared_lease().await?.get())
    }

    /// The lease (`ack_wait`) of a delivery as last read from the server; `None` until the
    /// consumer was reconciled.
    pub fn lease(&self) -> Option<Duration> {
        self.lease.get().map(|l| l.get())
    }

    /// Jobs waiting plus jobs delivered and not yet acknowledged, as the server counts them for
    /// the workers' consumer (one request; callers poll it periodically, never per scrape).
    pub async fn backlog(&self) -> Result<u64, StoreError> {
        let lease = self.shared_lease().await?;
        let info = lease
            .consumer
            .get_info()
            .await
            .map_err(|e| unavailable("consumer info", e))?;
        Ok(info.num_pending + u64::try_from(info.num_ack_pending).unwrap_or(0))
    }

    /// The shared durable consumer and its lease, reconciled on first use (workers only).
    async fn shared_lease(&self) -> Result<&Arc<Lease>, StoreError> {
        self.lease
            .get_or_try_init(|| async {
                let s = &self.backend.settings;
                let stream = self
                    .backend
                    .jetstream
                    .get_stream(s.jobs_stream())
                    .await
                    .map_err(|e| unavailable("jobs stream", e))?;
                let config = consumer::pull::Config {
                    durable_name: Some(s.workers_consumer()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: s.ack_wait,
                    max_ack_pending: s.max_jobs,
                    max_deliver: -1,
                    ..Default::default()
                };
                let consumer = super::reconcile::pull_consumer(&stream, config).await?;
                Ok(Arc::new(Lease::new(consumer)))
            })
            .await
    }
}

impl NatsJobQueue {
    /// The jobs stream, looked up once.
    async fn stream(&self) -> Result<&async_nats::jetstream::stream::Stream, StoreError> {
        self.jobs_stream
            .get_or_try_init(|| async {
                self.backend
                    .jetstream
                    .get_stream(self.backend.settings.jobs_stream())
                    .await
                    .map_err(|e| unavailable("jobs stream", e))
            })
            .await
    }

    /// Publishes `job` (or finds it stored: the execution id is its `Nats-Msg-Id`) and returns
    /// its stream sequence.
    async fn publish_at(&self, job: &Job) -> Result<u64, StoreError> {
        self.backend.check_connected()?;
        let payload = serde_json::to_vec(job)
            .map_err(|e| StoreError::Unavailable(format!("encode job: {e}")))?;
        let mut message = PublishMessage::build()
            .payload(Bytes::from(payload))
            .message_id(job.execution_id.to_string());
        if let Some(traceparent) = &job.traceparent {
            message = message.header(TRACEPARENT, traceparent.as_str());
        }
        let ack = self
            .backend
            .jetstream
            .send_publish(self.backend.settings.jobs_subject(), message)
            .await
            .map_err(|e| unavailable("publish job", e))?;
        match ack.await {
            // A duplicate carries the sequence of the stored original.
            Ok(ack) => Ok(ack.sequence),
            // `discard: new` on the jobs stream is the cluster-wide admission limit.
            Err(e) if e.to_string().contains("maximum messages") => Err(StoreError::AdmissionFull),
            Err(e) => Err(unavailable("publish job ack", e)),
        }
    }

    /// Sends one pull request for up to `max` jobs (at least one; they come as they arrive, and
    /// the request ends once `max` came or after [`PULL_EXPIRES`]), with what their deliveries
    /// need.
    /// `None`: the queue was closed.
    async fn pull(
        &self,
        max: usize,
    ) -> Result<Option<(consumer::pull::Batch, Arc<Lease>, Stream)>, StoreError> {
        if self.closed.is_cancelled() {
            return Ok(None);
        }
        let lease = self.shared_lease().await?;
        lease.refresh();
        // Looked up before pulling, so a lookup failure never strands a delivered job.
        let stream = self.stream().await?.clone();
        let request = lease
            .consumer
            .batch()
            .max_messages(max.max(1))
            .expires(PULL_EXPIRES)
            .messages();
        tokio::select! {
            batch = request => Ok(Some((batch.map_err(|e| unavailable("pull jobs", e))?, Arc::clone(lease), stream))),
            () = self.closed.cancelled() => Ok(None),
        }
    }
}

/// Jobs at least this large are decoded on the blocking pool, not on the runtime's threads: a
/// 1 MiB job of the costliest JSON shapes takes 3-12 ms to decode in a release build, time
/// the executions running on that thread would otherwise wait.
const DECODE_APART: usize = 64 * 1024;

/// Decodes a job's payload; `None` when the decoding could not finish (the runtime is shutting
/// down).
async fn decode(payload: Bytes) -> Option<Result<Job, serde_json::Error>> {
    if payload.len() < DECODE_APART {
        return Some(serde_json::from_slice(&payload));
    }
    tokio::task::spawn_blocking(move || serde_json::from_slice(&payload))
        .await
        .ok()
}

/// The delivery a pulled message carries, received at `received_at`. An undecodable job is
/// terminated (never redelivered) and yields `None`, as does one whose decoding could not
/// finish (left to a redelivery).
async fn delivery(
    message: async_nats::jetstream::Message,
    received_at: tokio::time::Instant,
    lease: &Arc<Lease>,
    stream: &Stream,
) -> Option<Delivery> {
    let (delivered, stream_sequence) = message
        .info()
        .map(|i| (i.delivered, i.stream_sequence))
        .unwrap_or((1, 0));
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
                    stream: stream.clone(),
                    stream_sequence,
                    received_at,
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
    stream: Stream,
    stream_sequence: u64,
    received_at: tokio::time::Instant,
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

    async fn withdrawn(&self) -> Result<bool, StoreError> {
        // A plain (not direct) get is answered by the stream leader, which applied the delete.
        match self.stream.get_raw_message(self.stream_sequence).await {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(true),
            Err(e) => Err(unavailable("job lookup", e)),
        }
    }
}

#[async_trait]
impl JobQueue for NatsJobQueue {
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        self.publish_at(job).await.map(|_| ())
    }

    async fn withdraw(&self, job: &Job) -> Result<(), StoreError> {
        let sequence = match self.publish_at(job).await {
            Ok(sequence) => sequence,
            // The server checks the msg id before the stream's limits: a full queue that
            // refuses the republish holds no copy of the job.
            Err(StoreError::AdmissionFull) => return Ok(()),
            Err(e) => return Err(e),
        };
        let stream = self.stream().await?;
        tracing::debug!(execution_id = %job.execution_id, sequence, "withdrawing job");
        match stream.delete_message(sequence).await {
            Ok(_) => Ok(()),
            // Gone already: acknowledged (a worker ran or dropped it) or deleted before.
            Err(e)
                if matches!(e.kind(), DeleteMessageErrorKind::JetStream(j)
                    if j.error_code() == ErrorCode::NO_MESSAGE_FOUND
                        || (j.error_code() == ErrorCode::STREAM_MESSAGE_DELETE_FAILED
                            && j.to_string().contains("no message found"))) =>
            {
                Ok(())
            }
            Err(e) => Err(unavailable("withdraw job", e)),
        }
    }

    async fn receive(&self) -> Result<Option<Delivery>, StoreError> {
        loop {
            let Some((mut batch, lease, stream)) = self.pull(1).await? else {
                return Ok(None);
            };
            let message = tokio::select! {
                m = batch.next() => m.transpose().map_err(|e| unavailable("pulled job", e))?,
                () = self.closed.cancelled() => return Ok(None),
            };
            if let Some(message) = message
                && let Some(delivery) =
                    delivery(message, tokio::time::Instant::now(), &lease, &stream).await
            {
                return Ok(Some(delivery));
            }
        }
    }

    async fn receive_up_to(&self, max: usize) -> Result<Option<Deliveries>, StoreError> {
        let Some((batch, lease, stream)) = self.pull(max).await? else {
            return Ok(None);
        };
        let closed = self.closed.clone();
        // Each message is taken (and its reception timed) as soon as it arrives, and the
        // large ones are decoded side by side, so no job waits for the decoding of a large one
        // before it.
        let deliveries = batch
            .take_until(closed.cancelled_owned())
            .map(move |message| {
                let received_at = tokio::time::Instant::now();
                let (lease, stream) = (Arc::clone(&lease), stream.clone());
                async move {
                    match message {
                        Ok(message) => delivery(message, received_at, &lease, &stream)
                            .await
                            .map(Ok),
                        Err(e) => Some(Err(unavailable("pulled job", e))),
                    }
                }
            })
            .buffer_unordered(max.max(1))
            .filter_map(std::future::ready);
        Ok(Some(deliveries.boxed()))
    }

    fn close(&self) {
        self.closed.cancel();
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.backend.check_connected()
    }

    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<QueuedJob>, StoreError> {
        self.backend.check_connected()?;
        let stream = self.stream().await?;
        let subject = self.backend.settings.jobs_subject();
        let mut out = Vec::new();
        let mut next = after.saturating_add(1);
        while out.len() < limit {
            let message = match stream
                .raw_message_builder()
                .sequence(next)
                .next_by_subject(subject.clone())
                .send()
                .await
            {
                Ok(message) => message,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(e) => return Err(unavailable("scan jobs", e)),
            };
            next = message.sequence.saturating_add(1);
            // Only the two fields a scan needs: the request is skipped, never built.
            match serde_json::from_slice::<JobHeader>(&message.payload) {
                Ok(job) => out.push(QueuedJob {
                    position: message.sequence,
                    execution_id: job.execution_id,
                    deadline_at: job.deadline_at,
                }),
                // `receive` terminates undecodable jobs; a scan just skips them.
                Err(_) => continue,
            }
        }
        Ok(out)
    }
}

/// The fields of a queued job a deadline scan reads.
#[derive(serde::Deserialize)]
struct JobHeader {
    execution_id: protocol::ExecutionId,
    deadline_at: protocol::Timestamp,
}
