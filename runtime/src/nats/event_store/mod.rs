//! The JetStream event store: one subject per execution in one of the namespace's events
//! streams (its shard: see `nats::shards`).
//!
//! Appends are compare-and-set on the subject's last stream sequence, which this process caches
//! per open execution (and re-reads with a direct get when it does not know it), so a stale or
//! duplicate writer in any process is refused by the server itself. A msg id naming the events
//! and the writer (`Mrt-Msg-Id`, [`format`]) makes a retried append idempotent: when the server
//! reports a wrong last sequence, the last message is re-read, and if it carries our id, our
//! write landed.
//!
//! The owner of an execution travels in the [`OWNER_HEADER`] header of its first message
//! (`execution.accepted`); a first message without it (stored before executions had owners)
//! belongs to the default tenant. Reading a whole short log reads that message anyway, so
//! `owned_state` costs nothing extra; `owner` alone is one direct get of the subject's first
//! message.
//!
//! By concern:
//! - this module: [`NatsEventStore`], its cache of log heads (the last message of a subject,
//!   read by direct get and confirmed by the leader on a miss), and the [`EventStore`] impl;
//! - [`format`]: the stored format (one event per message, or a run of events in one message)
//!   and the message ids that make retries idempotent;
//! - [`append`]: publishing a run, compare-and-set on the subject's last stream sequence;
//! - [`read`]: reading a log (direct gets for short logs, an ordered consumer for long ones)
//!   and following it live.

mod append;
mod direct;
mod format;
mod read;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_trait::async_trait;
use futures_util::StreamExt;
use parking_lot::Mutex;
use protocol::materialize::{Materializer, check_event};
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant};

use self::format::{decode_message, pack, undecodable, written_id};
use self::read::Opened;
use super::{NatsBackend, unavailable};
use crate::error::StoreError;
use crate::event_store::{
    EventRecord, EventStore, EventStream, LogHead, ReadResult, RunError, SubscribeResult, WriterId,
    check_run,
};

/// What this process knows about the end of a log.
#[derive(Debug, Clone, Copy)]
struct Head {
    sequence: Sequence,
    stream_sequence: u64,
    terminal: bool,
    time: protocol::Timestamp,
}

impl From<Head> for LogHead {
    fn from(head: Head) -> Self {
        Self {
            last_sequence: head.sequence,
            terminal: head.terminal,
            last_time: head.time,
        }
    }
}

/// The last message of a subject as read from the server.
struct Fetched {
    head: Head,
    msg_id: Option<String>,
    /// The message's events.
    records: Vec<EventRecord>,
}

impl Fetched {
    /// The last message of a log as a get answered it (direct or from the leader).
    fn of_message(
        message: async_nats::jetstream::message::StreamMessage,
    ) -> Result<Self, StoreError> {
        Self::decode(&message.headers, message.payload, message.sequence)
    }

    /// The last message of a log, stored at `stream_sequence`.
    fn decode(
        headers: &async_nats::HeaderMap,
        payload: bytes::Bytes,
        stream_sequence: u64,
    ) -> Result<Self, StoreError> {
        let msg_id = written_id(headers);
        let records = decode_message(Some(headers), payload).ok_or_else(undecodable)?;
        // The head of the log is the last event of its last message.
        let record = records.last().ok_or_else(undecodable)?;
        let head = Head {
            sequence: record.sequence(),
            stream_sequence,
            terminal: record.event.is_terminal(),
            time: record.event.time,
        };
        Ok(Self {
            head,
            msg_id,
            records,
        })
    }

    /// Whether this message is `run` as written by `writer`: its msg id and its events. The
    /// events are compared too, so a msg id of ours over other events (which a writer never
    /// sends: see `writer`'s unknown outcomes) is never taken for our write.
    fn is(&self, run: &[EventRecord], writer: WriterId) -> bool {
        self.msg_id.as_deref() == Some(format::msg_id(run, writer).as_str())
            && self.records.len() == run.len()
            && self.records.iter().zip(run).all(|(a, b)| a.json == b.json)
    }
}

/// Whether a head read as `read` (`None`: no message) must be stale, given that the event
/// `known` is stored: a log never loses events, so only a replica behind the leader shows less.
fn stale_read(read: Option<Sequence>, known: Sequence) -> bool {
    read.unwrap_or(Sequence::ZERO) < known
}

/// Which message of an execution's subject a leader read confirms.
#[derive(Debug, Clone, Copy)]
enum Edge {
    First,
    Last,
}

/// The header of an execution's first message naming its owner.
pub const OWNER_HEADER: &str = "Mrt-Tenant";

/// The events of one message of an events stream, as stored, for readers of the streams
/// themselves (the webhook feed reads every stored message with a consumer of its own); `None`
/// for a message of a format this version does not read.
pub fn stored_events(
    headers: Option<&async_nats::HeaderMap>,
    payload: bytes::Bytes,
) -> Option<Vec<EventRecord>> {
    decode_message(headers, payload)
}

/// The owner named by the headers of an execution's first message.
fn owner_of(headers: &async_nats::HeaderMap) -> Result<Tenant, StoreError> {
    match headers.get(OWNER_HEADER) {
        None => Ok(Tenant::default()),
        Some(value) => value.as_str().parse().map_err(|_| {
            StoreError::Unavailable("invalid owner header in the events stream".into())
        }),
    }
}

/// The materialized state of a whole log.
fn materialize(records: &[Arc<EventRecord>]) -> Result<Option<Materializer>, StoreError> {
    Materializer::from_events(records.iter().map(|r| &r.event))
        .map_err(|e| StoreError::Unavailable(format!("event log violates its rules: {e}")))
}

/// Most heads cached; beyond this the cache is cleared (it only saves a round trip).
const MAX_CACHED_HEADS: usize = 65_536;

/// One events stream (shard) of the namespace.
struct Shard {
    /// The connection carrying the partition's appends and gets (`NatsBackend::lane`), with
    /// the outcomes of its writes (`nats::quorum`).
    lane: crate::nats::Lane,
    /// The connection the partition's logs are read on (`NatsBackend::readers_of`).
    readers: crate::nats::Readers,
    stream: Stream,
    /// The stream's direct-get API subject (batched reads and heads, [`direct`]).
    direct_get_subject: async_nats::Subject,
}

/// See the module docs.
#[derive(Clone, derive_more::Debug)]
pub struct NatsEventStore {
    backend: NatsBackend,
    /// Indexed by shard number.
    #[debug(skip)]
    shards: Arc<[Shard]>,
    #[debug(skip)]
    heads: Arc<Mutex<HashMap<ExecutionId, Head>>>,
    max_events: u64,
}

impl NatsEventStore {
    /// `max_events`: non-terminal events allowed per execution [R 84].
    pub async fn new(backend: NatsBackend, max_events: u64) -> Result<Self, StoreError> {
        let mut shards = Vec::with_capacity(usize::from(backend.events.count()));
        for (shard, name) in backend.events.streams().enumerate() {
            let partition = u16::try_from(shard).unwrap_or(u16::MAX);
            let lane = backend.lane_of(partition).clone();
            let readers = backend.readers_of(partition).clone();
            let stream = lane
                .context
                .get_stream(&name)
                .await
                .map_err(|e| unavailable("events stream", e))?;
            let direct_get_subject =
                async_nats::Subject::from(format!("$JS.API.DIRECT.GET.{name}"));
            shards.push(Shard {
                lane,
                readers,
                stream,
                direct_get_subject,
            });
        }
        Ok(Self {
            backend,
            shards: shards.into(),
            heads: Arc::new(Mutex::new(HashMap::new())),
            max_events,
        })
    }

    fn subject(&self, id: ExecutionId) -> String {
        self.backend.events.subject(&id)
    }

    /// The events stream holding the execution's log.
    fn shard(&self, id: ExecutionId) -> &Shard {
        &self.shards[usize::from(self.backend.events.shard_of(&id))]
    }

    fn remember(&self, id: ExecutionId, head: Head) {
        let mut heads = self.heads.lock();
        if head.terminal {
            heads.remove(&id);
            return;
        }
        if heads.len() >= MAX_CACHED_HEADS {
            heads.clear();
        }
        heads.insert(id, head);
    }

    /// Reads the last message of the execution's subject from the server, at least as recent
    /// as `known`: an event the caller knows is stored (it was acknowledged), `Sequence::ZERO`
    /// when it knows none. With replicas, any of them may answer a direct get, including one
    /// that has not applied the latest appends: one cut off from the others, whose clients
    /// still read from it, or one catching up after a partition healed. So a miss, or a head
    /// older than `known`, counts only once the leader confirms it ([`Self::leader_read`]). (A
    /// stale head, taken for another writer's, fenced a live writer, whose execution was then
    /// failed by its own redelivery as if its worker had stopped.)
    async fn fetch_head(
        &self,
        id: ExecutionId,
        known: Sequence,
    ) -> Result<Option<Fetched>, StoreError> {
        let fetched = self
            .direct_last(id)
            .await?
            .map(Fetched::of_message)
            .transpose()?;
        let read = fetched.as_ref().map(|f| f.head.sequence);
        if (fetched.is_some() && !stale_read(read, known)) || self.backend.settings.replicas <= 1 {
            return Ok(fetched);
        }
        self.leader_last(id).await
    }

    /// The log's last message as the leader has it ([`Self::leader_read`]), decoded; `None`
    /// without replicas.
    async fn leader_last(&self, id: ExecutionId) -> Result<Option<Fetched>, StoreError> {
        self.leader_read(id, Edge::Last)
            .await?
            .map(Fetched::of_message)
            .transpose()
    }

    /// The first or last message of the execution's subject as the leader has it (the
    /// stream's message-get API), for a direct get whose answer may come from a follower that
    /// has not applied what the leader acknowledged: a miss (a log created a moment ago would
    /// read as unknown: a 404 right after its 202) or a head older than its reader knows.
    /// One more round trip, only then and only with replicas (`None` without).
    async fn leader_read(
        &self,
        id: ExecutionId,
        edge: Edge,
    ) -> Result<Option<async_nats::jetstream::message::StreamMessage>, StoreError> {
        if self.backend.settings.replicas <= 1 {
            return Ok(None);
        }
        let subject = self.subject(id);
        let got = match edge {
            Edge::First => {
                self.shard(id)
                    .stream
                    .get_first_raw_message_by_subject(&subject, 1)
                    .await
            }
            Edge::Last => {
                self.shard(id)
                    .stream
                    .get_last_raw_message_by_subject(&subject)
                    .await
            }
        };
        match got {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("message get", e)),
        }
    }

    /// The owner a read brought, or else (a long log, read by an ordered consumer, which does
    /// not keep headers here) one more read of the log's first message.
    async fn owner_unless_read(
        &self,
        id: ExecutionId,
        read: Option<Tenant>,
    ) -> Result<Option<Tenant>, StoreError> {
        match read {
            Some(owner) => Ok(Some(owner)),
            None => self.owner(id).await,
        }
    }

    /// A subscription to the log after `after`, and the owner when the read brought it (short
    /// logs). Subscribed before the log is read, so that one read bounds a short log's history
    /// (see `read::live`); dropped again (unsubscribed) on every other path.
    async fn open_stream(
        &self,
        id: ExecutionId,
        after: Sequence,
    ) -> Result<Option<(EventStream, Option<Tenant>)>, StoreError> {
        let subscriber = self
            .shard(id)
            .readers
            .client
            .subscribe(self.backend.settings.stored_events_subject(&id))
            .await
            .map_err(|e| unavailable("subscribe", e))?;
        let Some(opened) = self.open(id).await? else {
            return Ok(None);
        };
        if let Opened::Short((history, owner)) = opened {
            let ended = history
                .last()
                .is_some_and(|(_, r)| r.event.is_terminal() && r.sequence() <= after);
            let stream = if ended {
                futures_util::stream::empty().boxed()
            } else {
                self.live(id, after, subscriber, history)?.fuse().boxed()
            };
            return Ok(Some((stream, owner)));
        }
        drop(subscriber);
        let Some(Fetched { head, .. }) = self.fetch_head(id, Sequence::ZERO).await? else {
            return Ok(None);
        };
        if head.terminal && head.sequence <= after {
            return Ok(Some((futures_util::stream::empty().boxed(), None)));
        }
        let stream = self.ordered(id).await?;
        let filtered = stream.filter(move |item| {
            let keep = match item {
                Ok(record) => record.sequence() > after,
                Err(_) => true,
            };
            std::future::ready(keep)
        });
        Ok(Some((filtered.fuse().boxed(), None)))
    }
}

#[async_trait]
impl EventStore for NatsEventStore {
    async fn create_owned(&self, accepted: RuntimeEvent, owner: &Tenant) -> Result<(), StoreError> {
        check_event(&accepted)?;
        let id = accepted.execution_id;
        let time = accepted.time;
        let record = EventRecord::new(accepted);
        match self
            .publish(
                std::slice::from_ref(&record),
                0,
                WriterId::random(),
                Some(owner),
            )
            .await?
        {
            Ok(stream_sequence) => {
                self.remember(
                    id,
                    Head {
                        sequence: Sequence(1),
                        stream_sequence,
                        terminal: false,
                        time,
                    },
                );
                Ok(())
            }
            // The subject already has events (another creator of this id won).
            Err(_) => Err(StoreError::AlreadyExists),
        }
    }

    async fn create_closed(
        &self,
        accepted: RuntimeEvent,
        terminal: RuntimeEvent,
        owner: &Tenant,
    ) -> Result<(), StoreError> {
        // One message (a run of two) on an empty subject: the log is never seen open.
        let run = [EventRecord::new(accepted), EventRecord::new(terminal)];
        check_run(&run)?;
        let id = run[0].event.execution_id;
        let time = run[1].event.time;
        match self
            .publish(&run, 0, WriterId::random(), Some(owner))
            .await?
        {
            Ok(stream_sequence) => {
                self.remember(
                    id,
                    Head {
                        sequence: Sequence(2),
                        stream_sequence,
                        terminal: true,
                        time,
                    },
                );
                Ok(())
            }
            Err(_) => Err(StoreError::AlreadyExists),
        }
    }

    async fn append_as(&self, event: RuntimeEvent, writer: WriterId) -> Result<(), StoreError> {
        self.append_run_as(&[EventRecord::new(event)], writer)
            .await
            .map_err(|e| e.error)
    }

    async fn append_run_as(&self, run: &[EventRecord], writer: WriterId) -> Result<(), RunError> {
        check_run(run).map_err(|e| RunError {
            stored: 0,
            error: e.into(),
        })?;
        // Limits apply per event: the run stops before the first non-terminal event beyond
        // them; the terminal event is always admitted.
        let admitted = run
            .iter()
            .position(|r| !r.event.is_terminal() && r.sequence().get() > self.max_events)
            .unwrap_or(run.len());
        let mut stored = 0;
        while stored < admitted {
            let end = pack(run, stored, admitted, self.message_budget());
            self.append_message(&run[stored..end], writer)
                .await
                .map_err(|error| RunError { stored, error })?;
            stored = end;
        }
        if stored < run.len() {
            return Err(RunError {
                stored,
                error: StoreError::ExecutionLimit,
            });
        }
        Ok(())
    }

    fn pipelines_appends(&self) -> bool {
        true
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Ok(self
            .fetch_head(id, Sequence::ZERO)
            .await?
            .map(|Fetched { head, .. }| {
                self.remember(id, head);
                head.into()
            }))
    }

    /// The leader's last message of the log (the stream's message-get API): one round trip
    /// more than [`Self::head`]'s direct get, which any replica may answer. With one replica
    /// the direct get is the leader's word.
    async fn latest_head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        if self.backend.settings.replicas <= 1 {
            return self.head(id).await;
        }
        Ok(self.leader_last(id).await?.map(|Fetched { head, .. }| {
            self.remember(id, head);
            head.into()
        }))
    }

    /// One multi-subject get per partition for up to 256 logs; a log it does not answer for
    /// (no message on the server that answered, or past the batch's size) is read by
    /// [`Self::head`], which confirms a miss with the leader.
    async fn heads(&self, ids: &[ExecutionId]) -> Result<Vec<Option<LogHead>>, StoreError> {
        let mut found = HashMap::with_capacity(ids.len());
        for (id, message) in self.direct_lasts(ids).await? {
            let Fetched { head, .. } =
                Fetched::decode(&message.headers, message.payload, message.stream_sequence)?;
            self.remember(id, head);
            found.insert(id, LogHead::from(head));
        }
        let mut heads = Vec::with_capacity(ids.len());
        for &id in ids {
            heads.push(match found.get(&id) {
                Some(&head) => Some(head),
                None => self.head(id).await?,
            });
        }
        Ok(heads)
    }

    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError> {
        let Some((records, _)) = self.read_all(id, Sequence::ZERO, usize::MAX).await? else {
            return Ok(None);
        };
        materialize(&records)
    }

    async fn owner(&self, id: ExecutionId) -> Result<Option<Tenant>, StoreError> {
        self.backend.check_connected()?;
        let first = match self
            .shard(id)
            .stream
            .direct_get_next_for_subject(self.subject(id), Some(1))
            .await
        {
            Ok(message) => Some(message),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                self.leader_read(id, Edge::First).await?
            }
            Err(e) => return Err(unavailable("direct get", e)),
        };
        first.map(|message| owner_of(&message.headers)).transpose()
    }

    async fn owned_state(
        &self,
        id: ExecutionId,
    ) -> Result<Option<(Materializer, Tenant)>, StoreError> {
        let Some((records, owner)) = self.read_all(id, Sequence::ZERO, usize::MAX).await? else {
            return Ok(None);
        };
        let Some(materializer) = materialize(&records)? else {
            return Ok(None);
        };
        Ok(self
            .owner_unless_read(id, owner)
            .await?
            .map(|owner| (materializer, owner)))
    }

    async fn read(&self, id: ExecutionId, after: Sequence, limit: usize) -> ReadResult {
        Ok(self
            .read_all(id, after, limit)
            .await?
            .map(|(records, _)| records))
    }

    async fn subscribe(&self, id: ExecutionId, after: Sequence) -> SubscribeResult {
        Ok(self.open_stream(id, after).await?.map(|(stream, _)| stream))
    }

    async fn owned_subscribe(
        &self,
        id: ExecutionId,
        after: Sequence,
    ) -> Result<Option<(Tenant, EventStream)>, StoreError> {
        let Some((stream, owner)) = self.open_stream(id, after).await? else {
            return Ok(None);
        };
        Ok(self
            .owner_unless_read(id, owner)
            .await?
            .map(|owner| (owner, stream)))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.backend.check_connected()
    }
}
