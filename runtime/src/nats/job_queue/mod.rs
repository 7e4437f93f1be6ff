//! The JetStream job queue: per partition of the namespace (see `shards`), a WorkQueue stream
//! with, per tenant lane, a subject and one durable pull consumer shared by all workers; a job
//! goes to its execution's partition and its tenant's lane, and a worker pulls from every
//! lane of every partition (a *source*: `receive_from`, `take_from`). `receive_up_to(n)` asks the partitions
//! for at most `n` jobs together (a worker asks for as many as it has free slots, so a worker
//! never holds jobs it has no free slot for): with one partition in one request, with several
//! in one request each, sent at once and merged, `n` spread evenly over them, the partitions
//! taking turns when `n` is below their count. A request stays open until it has brought its `n` jobs or
//! [`PULL_EXPIRES`] passed: under load one round trip brings several jobs at once, and jobs
//! that arrive one at a time (a lightly loaded deployment) come through one request, not a
//! request each (each also cost the server's "no messages" answer). Requests answer to one
//! standing inbox per source, not to a fresh subscription each (see `pull`).
//! The jobs a request brings are taken as they arrive and decoded side by side (large ones on
//! the blocking pool, [`crate::apart`]), and each delivery keeps when it was received
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
//! `scan` reads held jobs with batched direct gets (`next_by_subj` from a sequence, up to the
//! scan's limit in one request, `nats::direct`; the message-get API, a request per job, where a
//! stream does not allow direct gets): a WorkQueue stream admits no second consumer
//! overlapping the workers' one, and a get neither takes nor delays a delivery. Acknowledged
//! jobs are gone from the stream, so a scan reads only jobs waiting or running (at most
//! `max_jobs`), and `held_span` is the stream's first sequence and message count (its info,
//! from the leader).
//!
//! `withdraw` (a submission that failed after its job may have been stored) publishes the job
//! again under the same `Nats-Msg-Id`: inside the duplicate window the server answers with the
//! stored original's sequence (or stores it now if the first publish never landed), and that
//! sequence is then deleted. Deleting a job a worker holds makes its ack a no-op; the worker
//! learns of it through `withdrawn`, a get of its delivery's sequence from the server that
//! applied the delete (a direct get with one replica, else the stream leader's message get).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, RawMessageErrorKind, Stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

mod delivery;
mod pull;

use self::delivery::{Lease, delivery};
use super::{NatsBackend, direct, unavailable};
use crate::error::StoreError;
use crate::job::{Deliveries, Delivery, HeldSpan, Job, JobQueue, QueuedJob};

/// How long one pull request stays open for the jobs it asked for (see the module docs).
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// The same with several partitions: a request to a partition that has no job holds the
/// worker's slots it asked with until it expires, while another partition may have jobs
/// waiting, so it expires sooner.
const PARTITIONED_PULL_EXPIRES: Duration = Duration::from_secs(1);

/// The same when a worker has fewer free slots than there are partitions, so the partitions
/// are asked in turn: a job waits for its partition's turn at most this long per partition.
/// (Such a worker is nearly full; under load every partition has jobs and a request is
/// answered at once, so short turns cost requests only when the deployment is idle.)
const TURN_PULL_EXPIRES: Duration = Duration::from_millis(100);

/// Pauses before a job refused by a full queue is offered again, 0.5 s in all. An execution
/// stops counting against the limit no later than its terminal event is visible to clients:
/// its job is acknowledged right after the terminal append, but that acknowledgement lands a
/// round trip after readers could see the terminal (more on a busy worker), and a client
/// reading it may submit again in between. A submit that would be refused anyway waits this
/// long before its 429.
const FULL_QUEUE_RECHECKS: [Duration; 6] = [
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(150),
    Duration::from_millis(175),
];

/// The W3C trace context header of a job message.
const TRACEPARENT: &str = "traceparent";

/// The messages one pull request brings, until it ends (see [`NatsJobQueue::pull`]).
type Pulled = futures_util::stream::BoxStream<
    'static,
    Result<async_nats::jetstream::Message, async_nats::Error>,
>;

/// See the module docs.
pub struct NatsJobQueue {
    backend: NatsBackend,
    /// Every partition's lanes: source `partition * lanes + lane`.
    sources: Box<[Source]>,
    lanes: usize,
    /// The partition a request for fewer jobs than there are partitions starts at.
    next: AtomicUsize,
    closed: CancellationToken,
}

/// One tenant lane of one partition: its subject of the partition's jobs stream and its
/// workers' consumer, on the partition's connection.
struct Source {
    number: u16,
    /// The connection carrying this partition (`NatsBackend::lane`).
    lane: async_nats::jetstream::Context,
    stream_name: String,
    subject: String,
    /// The consumer's filter: the lane's subject; none with one lane (the layout before lanes).
    filter: Option<String>,
    consumer_name: String,
    lease: OnceCell<Arc<Lease>>,
    /// The standing inbox its pull requests answer to, subscribed on first use (workers only).
    inbox: OnceCell<pull::Inbox>,
    /// The partition's jobs stream, looked up on first use (shared by its lanes), behind an
    /// `Arc`: every delivery keeps it, and a `Stream` clone copies the stream's whole info.
    stream: Arc<OnceCell<Arc<Stream>>>,
}

impl std::fmt::Debug for NatsJobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsJobQueue")
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

impl NatsJobQueue {
    pub fn new(backend: NatsBackend) -> Self {
        let layout = &backend.events;
        let lanes = layout.lanes();
        let sources = (0..layout.count())
            .flat_map(|number| {
                let connection = backend.lane(number).clone();
                // The partition's stream, looked up once for all its lanes.
                let stream = Arc::new(OnceCell::new());
                (0..lanes).map(move |lane| {
                    let subject = layout.jobs_lane_subject(number, lane);
                    Source {
                        number,
                        lane: connection.clone(),
                        stream_name: layout.jobs_stream(number),
                        filter: (lanes > 1).then(|| subject.clone()),
                        subject,
                        consumer_name: layout.jobs_lane_consumer(number, lane),
                        lease: OnceCell::new(),
                        inbox: OnceCell::new(),
                        stream: Arc::clone(&stream),
                    }
                })
            })
            .collect();
        Self {
            backend,
            sources,
            lanes: usize::from(lanes),
            next: AtomicUsize::new(0),
            closed: CancellationToken::new(),
        }
    }

    /// Creates every source's workers' consumer or updates it to this process's settings
    /// (`ack_wait`, `max_ack_pending`), and returns the lease the server then holds. Workers
    /// call it at startup so a setting JetStream refuses stops the start; otherwise the first
    /// `receive` does it. Publishers (gateways) never touch the consumers.
    pub async fn reconcile_consumer(&self) -> Result<Duration, StoreError> {
        let mut lease = None;
        for source in self.sources.iter() {
            let held = self.shared_lease(source).await?.get();
            lease.get_or_insert(held);
        }
        lease.ok_or_else(|| StoreError::Misconfigured("the namespace has no partition".into()))
    }

    /// The lease (`ack_wait`) of a delivery as last read from the server; `None` until the
    /// consumer was reconciled.
    pub fn lease(&self) -> Option<Duration> {
        // Each source's consumer is read on its own; the latest read is the freshest.
        self.sources
            .iter()
            .filter_map(|source| source.lease.get())
            .max_by_key(|lease| *lease.read_at.lock())
            .map(|lease| lease.get())
    }

    /// Jobs waiting plus jobs delivered and not yet acknowledged, as the server counts them for
    /// the workers' consumers (one request per source; callers poll it periodically, never
    /// per scrape).
    pub async fn backlog(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        for source in self.sources.iter() {
            let lease = self.shared_lease(source).await?;
            let info = lease
                .consumer
                .get_info()
                .await
                .map_err(|e| unavailable("consumer info", e))?;
            total = total
                .saturating_add(info.num_pending)
                .saturating_add(u64::try_from(info.num_ack_pending).unwrap_or(0));
        }
        Ok(total)
    }

    /// A source's durable consumer and its lease, reconciled on first use (workers only).
    async fn shared_lease<'a>(&self, source: &'a Source) -> Result<&'a Arc<Lease>, StoreError> {
        source
            .lease
            .get_or_try_init(|| async {
                let s = &self.backend.settings;
                let stream = self.stream(source).await?;
                let config = consumer::pull::Config {
                    durable_name: Some(source.consumer_name.clone()),
                    filter_subject: source.filter.clone().unwrap_or_default(),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: s.ack_wait,
                    max_ack_pending: super::partition_max_jobs(
                        s.max_jobs,
                        self.backend.events.count(),
                    ),
                    max_deliver: -1,
                    ..Default::default()
                };
                let consumer = super::reconcile::pull_consumer(stream, config).await?;
                Ok(Arc::new(Lease::new(consumer)))
            })
            .await
    }

    /// A source's jobs stream (its partition's), looked up once.
    async fn stream<'a>(&self, source: &'a Source) -> Result<&'a Arc<Stream>, StoreError> {
        source
            .stream
            .get_or_try_init(|| async {
                source
                    .lane
                    .get_stream(&source.stream_name)
                    .await
                    .map(Arc::new)
                    .map_err(|e| unavailable("jobs stream", e))
            })
            .await
    }

    /// The source of the execution's job: its partition's lane of its tenant.
    fn source_of(&self, job: &Job) -> &Source {
        let layout = &self.backend.events;
        let partition = usize::from(layout.shard_of(&job.execution_id));
        let lane = usize::from(layout.lane_of(job.tenant_name()));
        // The layout and the sources come from the same counts.
        &self.sources[(partition * self.lanes + lane).min(self.sources.len() - 1)]
    }

    /// The source that lists partition `partition`'s jobs (its lane 0: every lane shares the
    /// partition's stream).
    fn partition(&self, partition: usize) -> Option<&Source> {
        self.sources.get(partition.checked_mul(self.lanes)?)
    }

    /// Publishes `job` (or finds it stored: the execution id is its `Nats-Msg-Id`) and returns
    /// its source and stream sequence.
    async fn publish_at(&self, job: &Job) -> Result<(&Source, u64), StoreError> {
        self.backend.check_connected()?;
        let source = self.source_of(job);
        let payload = serde_json::to_vec(job)
            .map_err(|e| StoreError::Unavailable(format!("encode job: {e}")))?;
        let mut message = PublishMessage::build()
            .payload(Bytes::from(payload))
            .message_id(job.execution_id.to_string());
        if let Some(traceparent) = &job.traceparent {
            message = message.header(TRACEPARENT, traceparent.as_str());
        }
        let mut pauses = FULL_QUEUE_RECHECKS.iter();
        loop {
            let ack = source
                .lane
                .send_publish(source.subject.clone(), message.clone())
                .await
                .map_err(|e| unavailable("publish job", e))?;
            match ack.await {
                // A duplicate carries the sequence of the stored original.
                Ok(ack) => return Ok((source, ack.sequence)),
                // `discard: new` on the jobs stream is the cluster-wide admission limit. A
                // job whose execution just ended leaves it when its worker's acknowledgement
                // lands, a moment after the terminal event became visible: a queue full only
                // for that moment is not full (see `FULL_QUEUE_RECHECKS`).
                Err(e) if e.to_string().contains("maximum messages") => match pauses.next() {
                    Some(pause) => tokio::time::sleep(*pause).await,
                    None => return Err(StoreError::AdmissionFull),
                },
                Err(e) => return Err(unavailable("publish job ack", e)),
            }
        }
    }

    /// Sends one pull request to `source` for up to `max` jobs (at least one; they come as
    /// they arrive, and the request ends once `max` came or after `expires`; with `expires`
    /// `None` it ends at once with the jobs the source holds now), with what their deliveries
    /// need. `None`: the queue was closed. The request goes through the source's standing
    /// inbox, in its turn (see `pull`), and also ends on the client should the server's end
    /// be lost: without that a request lost in a reconnect held its caller for good, and a
    /// worker stopped taking that source's jobs.
    async fn pull(
        &self,
        source: &Source,
        max: usize,
        expires: Option<Duration>,
    ) -> Result<Option<(Pulled, Arc<Lease>, Arc<Stream>)>, StoreError> {
        if self.closed.is_cancelled() {
            return Ok(None);
        }
        let lease = self.shared_lease(source).await?;
        lease.refresh();
        // Looked up before pulling, so a lookup failure never strands a delivered job.
        let stream = Arc::clone(self.stream(source).await?);
        let inbox = source
            .inbox
            .get_or_try_init(|| pull::Inbox::new(&source.lane))
            .await?;
        let quiet = self.backend.settings.request_timeout;
        let request = inbox.request(&lease.consumer, max, expires, quiet);
        tokio::select! {
            batch = request => Ok(Some((batch?, Arc::clone(lease), stream))),
            () = self.closed.cancelled() => Ok(None),
        }
    }

    /// The deliveries of `requests` (pull requests sent together for at most `max` jobs in
    /// all), merged as they arrive.
    fn deliveries(
        &self,
        requests: Vec<(Pulled, Arc<Lease>, Arc<Stream>)>,
        max: usize,
    ) -> Deliveries {
        let closed = self.closed.clone();
        // Each message is taken (and its reception timed) as soon as it arrives, and the
        // large ones are decoded side by side, so no job waits for the decoding of a large one
        // before it.
        let merged =
            futures_util::stream::select_all(requests.into_iter().map(|(batch, lease, stream)| {
                batch
                    .map(move |message| (message, Arc::clone(&lease), Arc::clone(&stream)))
                    .boxed()
            }));
        merged
            .take_until(closed.cancelled_owned())
            .map(move |(message, lease, stream)| {
                let received_at = tokio::time::Instant::now();
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
            .filter_map(std::future::ready)
            .boxed()
    }

    /// One request to source `source` (see [`Self::pull`]), its deliveries as they arrive.
    async fn pull_source(
        &self,
        source: usize,
        max: usize,
        expires: Option<Duration>,
    ) -> Result<Option<Deliveries>, StoreError> {
        let Some(found) = self.sources.get(source) else {
            return Err(StoreError::Misconfigured(format!(
                "no job source {source} in a namespace of {}",
                self.sources.len()
            )));
        };
        let Some(request) = self.pull(found, max.max(1), expires).await? else {
            return Ok(None);
        };
        Ok(Some(self.deliveries(vec![request], max)))
    }

    /// The jobs the sources hold now, up to `max`, the sources asked one after another from
    /// the next in turn, each for what is still missing (a source that fails is skipped).
    async fn sweep(&self, max: usize) -> Result<Vec<Delivery>, StoreError> {
        let count = self.sources.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let mut held = Vec::new();
        for i in 0..count {
            let missing = max.max(1) - held.len();
            if missing == 0 {
                break;
            }
            let source = &self.sources[(start + i) % count];
            let Some((batch, lease, stream)) = (match self.pull(source, missing, None).await {
                Ok(pulled) => pulled,
                Err(e) => {
                    tracing::debug!(partition = source.number, error = %e, "pull request failed");
                    continue;
                }
            }) else {
                return Ok(held);
            };
            let mut batch = std::pin::pin!(batch);
            while let Some(message) = batch.next().await {
                let Ok(message) = message else { break };
                let received_at = tokio::time::Instant::now();
                held.extend(delivery(message, received_at, &lease, &stream).await);
            }
        }
        Ok(held)
    }

    /// How many jobs each source is asked for when a worker has `max` free slots (see
    /// [`plan`]); successive small requests start at successive sources.
    fn plan(&self, max: usize) -> Vec<(usize, usize)> {
        let count = self.sources.len();
        let start = if count > 1 {
            self.next.fetch_add(max.max(1), Ordering::Relaxed) % count
        } else {
            0
        };
        plan(count, start, max)
    }
}

/// `(partition, jobs)` asked of `count` partitions by a worker with `max` free slots, the
/// turn starting at `start`: all of them from a single partition, else spread evenly, the
/// remainder (or, with fewer slots than partitions, the single jobs) going to the partitions
/// next in turn, so every partition is asked in turn even by a worker with few slots.
fn plan(count: usize, start: usize, max: usize) -> Vec<(usize, usize)> {
    let max = max.max(1);
    if count <= 1 {
        return vec![(0, max)];
    }
    (0..count.min(max))
        .map(|i| {
            (
                (start + i) % count,
                max / count + usize::from(i < max % count),
            )
        })
        .filter(|&(_, n)| n > 0)
        .collect()
}

#[async_trait]
impl JobQueue for NatsJobQueue {
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        self.publish_at(job).await.map(|_| ())
    }

    async fn withdraw(&self, job: &Job) -> Result<(), StoreError> {
        let (source, sequence) = match self.publish_at(job).await {
            Ok(found) => found,
            // The server checks the msg id before the stream's limits: a full queue that
            // refuses the republish holds no copy of the job.
            Err(StoreError::AdmissionFull) => return Ok(()),
            Err(e) => return Err(e),
        };
        let stream = self.stream(source).await?;
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
            let Some(mut deliveries) = self.receive_up_to(1).await? else {
                return Ok(None);
            };
            let next = tokio::select! {
                next = deliveries.next() => next,
                () = self.closed.cancelled() => return Ok(None),
            };
            match next {
                Some(delivery) => return delivery.map(Some),
                // That request expired empty (or its job was undecodable): ask again.
                None => continue,
            }
        }
    }

    /// One pull request per source asked (see `plan`), all sent at once; their deliveries
    /// come merged as they arrive, and the whole ends when every request has. A source whose
    /// request fails (its stream's leader being elected, say) is left out of this round, so
    /// the others keep flowing; only when every request fails is it an error.
    ///
    /// With tenant lanes, the sources are first asked in turn for the jobs they hold now (so a
    /// job in any lane is found at once, whichever lanes the plan would ask), and only when
    /// none holds any does the round of waiting requests go out.
    async fn receive_up_to(&self, max: usize) -> Result<Option<Deliveries>, StoreError> {
        if self.lanes > 1 {
            let held = self.sweep(max).await?;
            if !held.is_empty() {
                return Ok(Some(
                    futures_util::stream::iter(held.into_iter().map(Ok)).boxed(),
                ));
            }
        }
        let plan = self.plan(max);
        let expires = if self.sources.len() == 1 {
            PULL_EXPIRES
        } else if plan.len() < self.sources.len() {
            TURN_PULL_EXPIRES
        } else {
            PARTITIONED_PULL_EXPIRES
        };
        let pulls = plan.iter().map(|&(source, n)| {
            let source = &self.sources[source];
            async move { (source.number, self.pull(source, n, Some(expires)).await) }
        });
        let mut requests = Vec::with_capacity(plan.len());
        let mut failure = None;
        for (number, pulled) in futures_util::future::join_all(pulls).await {
            match pulled {
                Ok(Some(request)) => requests.push(request),
                Ok(None) => return Ok(None),
                Err(e) => {
                    tracing::debug!(partition = number, error = %e, "pull request failed");
                    failure = Some(e);
                }
            }
        }
        if requests.is_empty()
            && let Some(e) = failure
        {
            return Err(e);
        }
        Ok(Some(self.deliveries(requests, max)))
    }

    fn sources(&self) -> usize {
        self.sources.len()
    }

    async fn receive_from(
        &self,
        source: usize,
        max: usize,
    ) -> Result<Option<Deliveries>, StoreError> {
        let expires = if self.sources.len() == 1 {
            PULL_EXPIRES
        } else {
            PARTITIONED_PULL_EXPIRES
        };
        self.pull_source(source, max, Some(expires)).await
    }

    async fn take_from(&self, source: usize, max: usize) -> Result<Option<Deliveries>, StoreError> {
        self.pull_source(source, max, None).await
    }

    fn close(&self) {
        self.closed.cancel();
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.backend.check_connected()
    }

    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<QueuedJob>, StoreError> {
        self.scan_partition(0, after, limit).await
    }

    fn partitions(&self) -> usize {
        self.sources.len() / self.lanes.max(1)
    }

    async fn scan_partition(
        &self,
        partition: usize,
        after: u64,
        limit: usize,
    ) -> Result<Vec<QueuedJob>, StoreError> {
        self.backend.check_connected()?;
        let Some(source) = self.partition(partition) else {
            return Ok(Vec::new());
        };
        let stream = self.stream(source).await?;
        // Every lane of the partition: the stream holds its subjects alone.
        let subjects = if self.lanes > 1 {
            ">".to_owned()
        } else {
            source.subject.clone()
        };
        // Direct gets where the stream allows them: answered by the server as it reads the
        // request, not through its one JetStream API queue, which every gateway's sweeper would
        // otherwise fill. Any replica may answer one: one behind its leader ends this scan
        // early (the next sweep goes on from the cursor) or returns a job already acknowledged
        // (indexed, then found done): neither loses a deadline.
        if stream.cached_info().config.allow_direct {
            return self.scan_direct(source, &subjects, after, limit).await;
        }
        let mut out = Vec::new();
        let mut next = after.saturating_add(1);
        while out.len() < limit {
            let message = match stream
                .raw_message_builder()
                .sequence(next)
                .next_by_subject(subjects.clone())
                .send()
                .await
            {
                Ok(message) => message,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(e) => return Err(unavailable("scan jobs", e)),
            };
            next = message.sequence.saturating_add(1);
            out.extend(queued(message.sequence, &message.payload));
        }
        Ok(out)
    }

    async fn held_span(&self, partition: usize) -> Result<HeldSpan, StoreError> {
        self.backend.check_connected()?;
        let Some(source) = self.partition(partition) else {
            return Ok(HeldSpan::default());
        };
        // The stream's info comes from its leader, so its first sequence never runs ahead of
        // the acknowledgements it has applied. An empty stream's first sequence is one past
        // its last.
        let stream = source
            .lane
            .get_stream(&source.stream_name)
            .await
            .map_err(|e| unavailable("jobs stream", e))?;
        let state = &stream.cached_info().state;
        Ok(HeldSpan {
            first: state.first_sequence,
            jobs: Some(state.messages),
        })
    }
}

impl NatsJobQueue {
    /// [`JobQueue::scan_partition`] with batched direct gets, on the partition's readers'
    /// connection: up to `limit` jobs in one request (a further one where the jobs' bytes
    /// exceed a batch's).
    async fn scan_direct(
        &self,
        source: &Source,
        subjects: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<QueuedJob>, StoreError> {
        let readers = self.backend.readers_of(source.number);
        let direct_get_subject =
            async_nats::Subject::from(format!("$JS.API.DIRECT.GET.{}", source.stream_name));
        let mut out = Vec::new();
        let mut next = after.saturating_add(1);
        while out.len() < limit {
            let request = direct::body(&direct::NextBatch {
                seq: next,
                next_by_subj: subjects,
                batch: limit - out.len(),
                max_bytes: direct::BATCH_MAX_BYTES,
            })?;
            let batch = direct::batch(
                readers,
                direct_get_subject.clone(),
                request,
                self.backend.settings.request_timeout,
            )
            .await
            .map_err(|e| match e {
                StoreError::Unavailable(what) => {
                    StoreError::Unavailable(format!("scan jobs: {what}"))
                }
                other => other,
            })?;
            let Some(last) = batch.messages.last() else {
                break;
            };
            next = last.stream_sequence.saturating_add(1);
            for message in &batch.messages {
                out.extend(queued(message.stream_sequence, &message.payload));
            }
            if !batch.more {
                break;
            }
        }
        Ok(out)
    }
}

/// The job stored at `position` as a scan lists it; `None` for an undecodable one (`receive`
/// terminates those; a scan just skips them).
fn queued(position: u64, payload: &[u8]) -> Option<QueuedJob> {
    // Only the two fields a scan needs: the request is skipped, never built.
    let job = serde_json::from_slice::<JobHeader>(payload).ok()?;
    Some(QueuedJob {
        position,
        execution_id: job.execution_id,
        deadline_at: job.deadline_at,
    })
}

/// The fields of a queued job a deadline scan reads.
#[derive(serde::Deserialize)]
struct JobHeader {
    execution_id: protocol::ExecutionId,
    deadline_at: protocol::Timestamp,
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn a_request_asks_every_partition_its_share_and_never_more_than_the_free_slots() {
        assert_eq!(plan(1, 0, 64), [(0, 64)]);
        assert_eq!(plan(4, 0, 10), [(0, 3), (1, 3), (2, 2), (3, 2)]);
        assert_eq!(plan(4, 2, 10), [(2, 3), (3, 3), (0, 2), (1, 2)]);
        // Fewer slots than partitions: one job each from the partitions next in turn.
        assert_eq!(plan(8, 6, 3), [(6, 1), (7, 1), (0, 1)]);
        assert_eq!(plan(8, 0, 0), [(0, 1)]);
        for count in 1..=9 {
            for max in 1..=70 {
                let asked: usize = plan(count, 5 % count, max).iter().map(|&(_, n)| n).sum();
                assert_eq!(asked, max, "{count} partitions, {max} slots");
            }
        }
    }
}
