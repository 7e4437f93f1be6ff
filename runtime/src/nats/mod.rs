//! NATS JetStream implementations of the event store, job queue and cancel bus.
//!
//! Layout (every name under the deployment's namespace `ns`, uppercased for streams):
//! - the events streams, `{NS}_EVENTS` and, with more than one shard, `{NS}_EVENTS_{k}`: an
//!   execution's log is one subject in one of them (`{ns}.events.{id}` or `{ns}.events.{k}.{id}`;
//!   see `shards`, which also says how the namespace's processes agree on the count). Each has
//!   Limits retention with `max_age` = retention, file storage, direct get allowed. Appends are
//!   compare-and-set with `Nats-Expected-Last-Subject-Sequence` and carry `Mrt-Msg-Id =
//!   {execution_id}:{sequence}:{writer}` (`{execution_id}:{first}-{last}:{writer}` for a message
//!   holding a run of events, header `Mrt-Format: 2`), by which a writer recognises its own
//!   write after a lost acknowledgement (not `Nats-Msg-Id`: no server-side duplicate state; see
//!   `event_store::format`). Each republishes every stored message on `{ns}.stored.{id}`,
//!   which live readers follow (never the write subject, which also carries appends the stream
//!   refuses).
//! - the jobs streams, `{NS}_JOBS` and `{NS}_JOBS_{k}`, one per partition beside its events
//!   stream (`shards`): subject `{ns}.jobs` (`{ns}.jobs.{k}`), one subject per tenant lane
//!   under it, WorkQueue retention, file storage; `Nats-Msg-Id` = the execution id, so a
//!   republish within the duplicate window is absorbed. One durable pull consumer per lane
//!   (`{ns}_workers`, `{ns}_workers_t{j}`, …) shared by every worker, explicit acks, `ack_wait`
//!   with progress heartbeats while an execution runs.
//! - `{NS}_CANCEL`: a KV bucket holding durable cancel marks, plus core subjects
//!   `{ns}.cancel.{id}` for prompt delivery.
//!
//! Streams, the consumers and the bucket are created or reconciled with the process's settings at
//! startup (see `reconcile`); several processes may start at once. On a cluster, workers keep
//! each partition's leaders on a node of its own (`placement`).
//! [`NatsServices::connect`] is the one way a process connects all three.

mod access;
mod cancel;
mod direct;
mod event_store;
mod job_queue;
mod placement;
pub mod quorum;
mod reconcile;
mod replies;
mod services;
mod shards;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

pub use access::{NatsAccess, ResolvedAccess};
pub use cancel::NatsCancelBus;
pub use event_store::{NatsEventStore, OWNER_HEADER, stored_events};
pub use job_queue::NatsJobQueue;
pub use placement::{misplaced_leaders, spawn_leader_placement};
// For other crates' streams and consumers in the namespace (webhook deliveries).
pub use reconcile::{pull_consumer as reconcile_pull_consumer, stream as reconcile_stream};
pub use services::{NatsConnectSettings, NatsServices};
pub use shards::{
    DEFAULT_EVENT_SHARDS, DEFAULT_TENANT_LANES, EventShards, LANES_METADATA_KEY, MAX_EVENT_SHARDS,
    MAX_TENANT_LANES, SHARDS_METADATA_KEY,
};

use crate::error::StoreError;

/// Pause between startup connection attempts.
const CONNECT_RETRY: Duration = Duration::from_millis(250);

/// How long a re-sent job or event is recognised as a duplicate (capped at the retention).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Settings of the JetStream layout.
#[derive(Debug, Clone)]
pub struct NatsSettings {
    /// Prefix of every stream, consumer and subject.
    pub namespace: String,
    /// How long events (and cancel marks) are kept.
    pub retention: Duration,
    /// Lease of a job delivery; heartbeats extend it while the execution runs.
    pub ack_wait: Duration,
    /// Jobs waiting or running cluster-wide before submits get `queue_full`, shared evenly by
    /// the partitions (`partition_max_jobs`).
    pub max_jobs: i64,
    /// Bound of every request to the server, so an outage is answered promptly.
    pub request_timeout: Duration,
    /// Largest accepted event, in bytes.
    pub max_event_bytes: i32,
    /// Replicas of every stream and of the cancel bucket (1-5; 3 on a 3-node cluster survives
    /// the loss of any one node).
    pub replicas: usize,
    /// Shards of the events stream a new namespace gets (`None`: [`DEFAULT_EVENT_SHARDS`]);
    /// an existing namespace keeps its own, and a different explicit count is a startup error
    /// (see `shards`).
    pub event_shards: Option<u16>,
    /// Tenant lanes per partition a new namespace gets (`None`: [`DEFAULT_TENANT_LANES`]); an
    /// existing namespace keeps its own, and a different explicit count is a startup error.
    pub tenant_lanes: Option<u16>,
    /// Whether this process reads event logs on one readers' connection per lane (see
    /// `NatsBackend::readers_of`) rather than on one for all: set by the gateway, whose event
    /// streams receive every stored event of their executions; a worker reads logs only now
    /// and then and keeps one.
    pub reader_lanes: bool,
}

impl NatsSettings {
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            retention: Duration::from_secs(24 * 3600),
            ack_wait: Duration::from_secs(30),
            max_jobs: 100_000,
            request_timeout: Duration::from_millis(1500),
            max_event_bytes: 1024 * 1024 + 4096,
            replicas: 1,
            event_shards: None,
            tenant_lanes: None,
            reader_lanes: false,
        }
    }

    fn upper(&self) -> String {
        self.namespace.to_ascii_uppercase()
    }

    /// The first events stream, which records the namespace's shard count (see `shards`).
    pub fn events_stream(&self) -> String {
        format!("{}_EVENTS", self.upper())
    }

    /// Partition 0's jobs stream (names: `shards`).
    pub fn jobs_stream(&self) -> String {
        EventShards::first_of(self.namespace.clone()).jobs_stream(0)
    }

    pub fn cancel_bucket(&self) -> String {
        format!("{}_CANCEL", self.upper())
    }

    /// Where the events stream republishes an execution's events once stored (live readers).
    pub fn stored_events_subject(&self, id: &protocol::ExecutionId) -> String {
        format!("{}.stored.{id}", self.namespace)
    }

    /// Partition 0's jobs subject.
    pub fn jobs_subject(&self) -> String {
        EventShards::first_of(self.namespace.clone()).jobs_subject(0)
    }

    pub fn cancel_subject(&self, id: &protocol::ExecutionId) -> String {
        format!("{}.cancel.{id}", self.namespace)
    }

    /// Partition 0's workers' consumer.
    pub fn workers_consumer(&self) -> String {
        EventShards::first_of(self.namespace.clone()).jobs_consumer(0)
    }
}

/// A connection to NATS with the namespace's streams verified.
#[derive(Clone, derive_more::Debug)]
pub struct NatsBackend {
    #[debug(skip)]
    pub client: async_nats::Client,
    /// The connections for reading event logs (see [`Readers`]), apart from the writes: under
    /// load a gateway receives every stored event of its streams, and on connections of their
    /// own that flow never queues ahead of the replies to its submissions' publishes
    /// (BENCHMARKS.md, "Batched reads and the readers' connection"). One per lane with
    /// [`NatsSettings::reader_lanes`] (partition `k` reads on `readers[k % len]`), so no one
    /// socket or client task carries every live read of a gateway; else one.
    #[debug(skip)]
    readers: Arc<[Readers]>,
    #[debug(skip)]
    pub jetstream: jetstream::Context,
    /// One JetStream context per connection that carries partitions' jobs and appends:
    /// `lanes[0]` is `jetstream`; with more than one partition the process holds up to
    /// [`MAX_LANES`] connections and partition `k` uses lane `k % lanes.len()`, so no one
    /// socket (and no one client task) carries every partition's traffic.
    #[debug(skip)]
    lanes: std::sync::Arc<[Lane]>,
    pub settings: NatsSettings,
    /// Where each execution's job and log live (its partition), as the namespace records it.
    pub events: EventShards,
    /// The quorum watches of every connection, stopped with the last clone (`quorum`).
    #[debug(skip)]
    _quorum: Arc<[quorum::Watch]>,
}

/// A connection for reading event logs: the subscriptions to stored events and the batched
/// reads that start them (which must share a connection, so that the server takes the
/// subscription before the read), with the multiplexer of those reads' replies (one wildcard
/// subscription, `replies`).
#[derive(Clone)]
pub(crate) struct Readers {
    pub(crate) client: async_nats::Client,
    pub(crate) replies: replies::Replies,
    /// Whether the server connected to belongs to a cluster (its INFO names one), read once
    /// at connect: the servers of one `NATS_URL` are all of one kind. Live reads start
    /// differently on a cluster (`event_store::read`).
    pub(crate) clustered: bool,
}

impl Readers {
    async fn new(client: async_nats::Client) -> Result<Self, StoreError> {
        Ok(Self {
            replies: replies::Replies::new(&client).await?,
            clustered: client.server_info().cluster.is_some(),
            client,
        })
    }
}

/// One connection carrying partitions' jobs and appends, with the outcomes of the event writes
/// on it that its quorum watch reads.
#[derive(Clone)]
pub(crate) struct Lane {
    pub(crate) context: jetstream::Context,
    /// The context's connection, kept to be used without a clone (`Context::client` clones
    /// it: `connected` asks every lane before every append, and a log's head is read on it).
    pub(crate) client: async_nats::Client,
    pub(crate) writes: quorum::Writes,
}

/// Most connections a process holds for partitions' jobs and appends (see `NatsBackend`).
pub const MAX_LANES: u16 = 8;

/// The oldest nats-server (major, minor) this backend works with: 2.12, whose JetStream fixes
/// (of what Jepsen found) the design relies on (`../shared/docs/architecture.md`); batched
/// direct gets (ADR-31), which every event stream starts with, came in 2.11.
const MIN_SERVER_VERSION: (u64, u64) = (2, 12);

/// Refuses a server older than [`MIN_SERVER_VERSION`] at startup, with its version, rather than
/// failing every event stream later.
fn check_server_version(version: &str) -> Result<(), StoreError> {
    let mut parts = version.split(['.', '-']).map(str::parse::<u64>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= MIN_SERVER_VERSION => Ok(()),
        _ => Err(StoreError::Misconfigured(format!(
            "nats-server {version} is not supported: {}.{} or newer is required",
            MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1
        ))),
    }
}

/// Runs `attempt` again while it fails with `Unavailable`, until `deadline`: a cluster still
/// electing its JetStream leaders (all nodes starting together), or placing the replicated
/// streams and consumers of several processes starting at once, times API requests out for a
/// while. A setting the server refuses (`Misconfigured`) ends it at once; at the deadline the
/// last error does.
pub async fn until_settled<T, F, Fut>(
    deadline: tokio::time::Instant,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    loop {
        match attempt().await {
            Err(StoreError::Unavailable(e))
                if tokio::time::Instant::now() + CONNECT_RETRY < deadline =>
            {
                tracing::info!(error = %e, "JetStream not ready; retrying");
                tokio::time::sleep(CONNECT_RETRY).await;
            }
            done => return done,
        }
    }
}

/// How many times `client` has connected (its first connection counts; each reconnect adds
/// one): a reader of core messages compares two readings to learn that it may have missed
/// some in between.
pub(crate) fn connects(client: &async_nats::Client) -> u64 {
    client
        .statistics()
        .connects
        .load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn unavailable(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{what}: {e}"))
}

/// One more connection with options the servers just accepted: one attempt within `deadline`
/// (the first connection's retries already waited for the servers).
async fn connect_accepted(
    options: async_nats::ConnectOptions,
    servers: &[async_nats::ServerAddr],
    deadline: tokio::time::Instant,
) -> Result<async_nats::Client, StoreError> {
    let unreachable = || StoreError::Unavailable("NATS is unreachable".into());
    tokio::time::timeout_at(deadline, async {
        let client = options
            .connect(servers.to_vec())
            .await
            .map_err(|_| unreachable())?;
        client.flush().await.map_err(|_| unreachable())?;
        Ok(client)
    })
    .await
    .map_err(|_| unreachable())?
}

impl NatsBackend {
    /// Connects without credentials beyond those in `url`; see [`NatsBackend::connect_with`].
    pub async fn connect(
        url: &str,
        settings: NatsSettings,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::connect_with(url, &NatsAccess::default(), settings, connect_timeout).await
    }

    /// Connects (retrying an unreachable server for up to `connect_timeout`) with `access`'s
    /// credentials and TLS, and creates or verifies the streams. Refused credentials and TLS
    /// failures end at once with `Misconfigured`. After this, the client reconnects by itself
    /// forever.
    pub async fn connect_with(
        url: &str,
        access: &NatsAccess,
        settings: NatsSettings,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        // The client logs server addresses, so credentials travel in the options only.
        let (url, credentials) = crate::nats_url::split_credentials(url);
        // A comma-separated list names several servers of one cluster; the client picks one and
        // fails over to the others (and to servers the cluster gossips).
        let servers = url
            .split(',')
            .map(|server| server.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| StoreError::Unavailable("NATS_URL is not a list of NATS URLs".into()))?;
        let tls_url = servers.iter().any(async_nats::ServerAddr::tls_required);
        let access = access.resolve(credentials, tls_url)?;
        let deadline = tokio::time::Instant::now() + connect_timeout;
        let unreachable = || StoreError::Unavailable("NATS is unreachable".into());
        // Each connection picks its servers through a selector, so its quorum watch can move
        // it away from a server cut off from the cluster (`quorum`).
        let (selector, readers_selector) =
            (quorum::Selector::default(), quorum::Selector::default());
        let options = |role: &str, selector: &quorum::Selector| {
            access.apply(
                selector.install(
                    async_nats::ConnectOptions::new()
                        .name(format!("model-runtime-{}{role}", settings.namespace))
                        .connection_timeout(Duration::from_secs(2))
                        .request_timeout(Some(settings.request_timeout)),
                ),
            )
        };
        let mut attempt = 0u32;
        // Attempts are made here rather than by the client's own retry, which would retry
        // refused credentials forever.
        let client = loop {
            attempt += 1;
            let options = options("", &selector)?;
            let connected = tokio::time::timeout_at(deadline, async {
                let client = options.connect(servers.clone()).await?;
                client.flush().await.map_err(|e| {
                    async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::Io, e)
                })?;
                Ok::<_, async_nats::ConnectError>(client)
            })
            .await
            .map_err(|_| unreachable())?;
            match connected {
                Ok(client) => break client,
                Err(e) => match access::classify(&e) {
                    access::AttemptFailure::Fatal(message) => {
                        return Err(StoreError::Misconfigured(message));
                    }
                    access::AttemptFailure::Transient => {
                        if attempt == 1 {
                            tracing::info!(error = %e, "NATS not reachable yet; retrying");
                        } else {
                            tracing::debug!(error = %e, attempt, "NATS not reachable yet");
                        }
                        if tokio::time::Instant::now() + CONNECT_RETRY >= deadline {
                            return Err(unreachable());
                        }
                        tokio::time::sleep(CONNECT_RETRY).await;
                    }
                },
            }
        };
        check_server_version(&client.server_info().version)?;
        // The same servers just accepted these credentials: one attempt within the bound.
        let readers =
            connect_accepted(options("-readers", &readers_selector)?, &servers, deadline).await?;
        let mut reading = vec![Readers::new(readers.clone()).await?];
        let mut js = jetstream::new(client.clone());
        js.set_timeout(settings.request_timeout);
        let events = until_settled(deadline, || ensure_streams(&js, &settings)).await?;
        let writes = quorum::Writes::default();
        let mut watches = vec![
            quorum::watch(client.clone(), selector, writes.clone(), "main"),
            quorum::watch(
                readers.clone(),
                readers_selector,
                quorum::Writes::default(),
                "readers",
            ),
        ];
        // More connections for the partitions' jobs and appends (see `lanes`) and, with
        // `reader_lanes`, their reads (see `readers`), made with the options the servers just
        // accepted: one attempt each within the bound, each with a quorum watch of its own.
        let watched = async |suffix: String, role: &'static str, writes: quorum::Writes| {
            let selector = quorum::Selector::default();
            let client = connect_accepted(options(&suffix, &selector)?, &servers, deadline).await?;
            let watch = quorum::watch(client.clone(), selector, writes, role);
            Ok::<_, StoreError>((client, watch))
        };
        let mut lanes = vec![Lane {
            context: js.clone(),
            client: client.clone(),
            writes: writes.clone(),
        }];
        for lane in 1..events.count().min(MAX_LANES) {
            let lane_writes = quorum::Writes::default();
            let (extra, watch) =
                watched(format!("-lane{lane}"), "lane", lane_writes.clone()).await?;
            watches.push(watch);
            let mut context = jetstream::new(extra.clone());
            context.set_timeout(settings.request_timeout);
            lanes.push(Lane {
                context,
                client: extra,
                writes: lane_writes,
            });
            if settings.reader_lanes {
                let (extra, watch) = watched(
                    format!("-readers{lane}"),
                    "readers",
                    quorum::Writes::default(),
                )
                .await?;
                watches.push(watch);
                reading.push(Readers::new(extra).await?);
            }
        }
        Ok(Self {
            client,
            readers: reading.into(),
            jetstream: js,
            lanes: lanes.into(),
            settings,
            events,
            _quorum: watches.into(),
        })
    }

    /// The JetStream context (connection) that carries partition `partition`'s jobs and
    /// appends.
    pub fn lane(&self, partition: u16) -> &jetstream::Context {
        &self.lane_of(partition).context
    }

    /// The connection of partition `partition`, with its write outcomes.
    pub(crate) fn lane_of(&self, partition: u16) -> &Lane {
        &self.lanes[usize::from(partition) % self.lanes.len()]
    }

    /// The connection partition `partition`'s event logs are read on.
    pub(crate) fn readers_of(&self, partition: u16) -> &Readers {
        &self.readers[usize::from(partition) % self.readers.len()]
    }

    /// Sends what every connection still buffers (unconfirmed job acks, say) and waits for
    /// the servers to have it; a stopping process calls it so an orderly stop loses none.
    pub async fn flush(&self) -> Result<(), StoreError> {
        for lane in self.lanes.iter() {
            lane.context
                .client()
                .flush()
                .await
                .map_err(|e| unavailable("flush", e))?;
        }
        Ok(())
    }

    /// Whether the client is connected now (cheap; no round trip).
    pub fn connected(&self) -> bool {
        use async_nats::connection::State;
        self.readers
            .iter()
            .all(|readers| readers.client.connection_state() == State::Connected)
            && self
                .lanes
                .iter()
                .all(|lane| lane.client.connection_state() == State::Connected)
    }

    pub(crate) fn check_connected(&self) -> Result<(), StoreError> {
        if self.connected() {
            Ok(())
        } else {
            Err(StoreError::Unavailable("NATS is disconnected".into()))
        }
    }
}

/// The event shards of `namespace` as the server records them (`None`: the namespace has no
/// events stream yet). For tools that read the streams themselves (benchmarks, audits).
pub async fn recorded_event_shards(
    js: &jetstream::Context,
    namespace: &str,
) -> Result<Option<EventShards>, StoreError> {
    let (events, exists) = agreed_shards(js, &NatsSettings::new(namespace)).await?;
    Ok(exists.then_some(events))
}

/// The shards `{NS}_EVENTS` records (see `shards::RecordedCount`), checked against what `s` asks for,
/// and whether that stream exists yet.
async fn agreed_shards(
    js: &jetstream::Context,
    s: &NatsSettings,
) -> Result<(EventShards, bool), StoreError> {
    let recorded = reconcile::stream_metadata(js, &s.events_stream()).await?;
    let agree = |count: shards::RecordedCount, wanted| {
        let record = recorded
            .as_ref()
            .map(|m| m.get(count.key).map(String::as_str));
        count.agree(&s.namespace, record, wanted)
    };
    let count = agree(shards::SHARD_COUNT, s.event_shards)?;
    let lanes = agree(shards::LANE_COUNT, s.tenant_lanes)?;
    Ok((
        EventShards::new(s.namespace.clone(), count)?.with_lanes(lanes)?,
        recorded.is_some(),
    ))
}

/// The settings of shard `shard`'s events stream; `record` adds the shard and lane counts to
/// the metadata (shard 0 of a namespace being created).
fn events_stream_config(
    s: &NatsSettings,
    events: &EventShards,
    shard: u16,
    record: bool,
) -> stream::Config {
    let subjects = events.subjects(shard);
    let mut metadata = std::collections::HashMap::new();
    if record {
        metadata.insert(SHARDS_METADATA_KEY.to_owned(), events.count().to_string());
        metadata.insert(LANES_METADATA_KEY.to_owned(), events.lanes().to_string());
    }
    stream::Config {
        name: events.stream(shard),
        subjects: vec![subjects.clone()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: s.retention,
        max_message_size: s.max_event_bytes,
        allow_direct: true,
        // Appends of this version send no `Nats-Msg-Id` (see `event_store::format`), so the
        // window holds nothing of theirs; it stays for writers of earlier versions during an
        // upgrade.
        duplicate_window: reconcile::duplicate_window(DUPLICATE_WINDOW, s.retention),
        num_replicas: s.replicas,
        // Live readers follow this copy: the server sends it only once the event is stored, so
        // a rejected or lost append never reaches a reader. Every shard republishes on the same
        // subjects (the execution id is the last token of each).
        republish: Some(stream::Republish {
            source: subjects,
            destination: format!("{}.stored.{{{{wildcard(1)}}}}", s.namespace),
            headers_only: false,
        }),
        metadata,
        ..Default::default()
    }
}

/// Jobs a partition holds before submits get `queue_full`: the namespace's `max_jobs` shared
/// evenly, rounded up (executions spread evenly over partitions by their random ids).
pub(crate) fn partition_max_jobs(max_jobs: i64, partitions: u16) -> i64 {
    let n = i64::from(partitions.max(1));
    max_jobs.saturating_add(n - 1) / n
}

/// The settings of partition `partition`'s jobs stream: one subject per tenant lane.
fn jobs_stream_config(s: &NatsSettings, events: &EventShards, partition: u16) -> stream::Config {
    stream::Config {
        name: events.jobs_stream(partition),
        subjects: events.jobs_subjects(partition),
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        max_messages: partition_max_jobs(s.max_jobs, events.count()),
        discard: stream::DiscardPolicy::New,
        max_age: s.retention,
        // Deadline sweepers' scans, and a worker's question whether a job it holds was
        // withdrawn where one replica makes that exact, are direct gets (`job_queue`), kept
        // out of the server's JetStream API queue.
        allow_direct: true,
        duplicate_window: reconcile::duplicate_window(DUPLICATE_WINDOW, s.retention),
        num_replicas: s.replicas,
        ..Default::default()
    }
}

/// Creates the streams or reconciles them with these settings (see [`reconcile`]), and returns
/// the namespace's event shards as recorded in `{NS}_EVENTS` (see `shards`).
async fn ensure_streams(
    js: &jetstream::Context,
    s: &NatsSettings,
) -> Result<EventShards, StoreError> {
    let (proposed, exists) = agreed_shards(js, s).await?;
    reconcile::stream(js, events_stream_config(s, &proposed, 0, !exists)).await?;
    // A namespace that did not exist may have been created by another process between the read
    // and the create, with a count of its own: what the stream records then decides. An
    // existing record never changes, so it is read once.
    let events = if exists {
        proposed
    } else {
        agreed_shards(js, s).await?.0
    };
    for shard in 1..events.count() {
        reconcile::stream(js, events_stream_config(s, &events, shard, false)).await?;
    }
    for partition in 0..events.count() {
        reconcile::stream(js, jobs_stream_config(s, &events, partition)).await?;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_settling_cluster_is_asked_again_until_the_deadline_and_a_refusal_ends_at_once() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let tries = AtomicU32::new(0);
        let settled = until_settled(deadline, || async {
            match tries.fetch_add(1, Ordering::Relaxed) {
                0..=2 => Err(StoreError::Unavailable("timed out".into())),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(settled.unwrap(), 3);

        let tries = AtomicU32::new(0);
        let refused: Result<(), _> = until_settled(deadline, || async {
            tries.fetch_add(1, Ordering::Relaxed);
            Err(StoreError::Misconfigured("refused".into()))
        })
        .await;
        assert!(matches!(refused, Err(StoreError::Misconfigured(_))));
        assert_eq!(tries.load(Ordering::Relaxed), 1);

        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_secs(2);
        let never: Result<(), _> = until_settled(deadline, || async {
            Err(StoreError::Unavailable("timed out".into()))
        })
        .await;
        assert!(matches!(never, Err(StoreError::Unavailable(_))));
        assert!(tokio::time::Instant::now() <= deadline);
        assert!(tokio::time::Instant::now() + CONNECT_RETRY >= deadline);
    }

    #[test]
    fn servers_older_than_2_12_are_refused_by_version() {
        for supported in ["2.12.0", "2.12.8", "2.12.0-beta.1", "2.15.1", "3.0.0"] {
            assert!(check_server_version(supported).is_ok(), "{supported}");
        }
        for refused in ["2.11.9", "2.9.20", "2.10.24", "1.4.1", "", "unknown"] {
            let Err(StoreError::Misconfigured(message)) = check_server_version(refused) else {
                panic!("{refused} accepted");
            };
            assert!(message.contains("2.12 or newer"), "{message}");
        }
    }
}
