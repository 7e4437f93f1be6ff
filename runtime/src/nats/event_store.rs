//! The JetStream event store: one subject per execution in `{NS}_EVENTS`.
//!
//! Appends are compare-and-set on the subject's last stream sequence, which this process caches
//! per open execution (and re-reads with a direct get when it does not know it), so a stale or
//! duplicate writer in any process is refused by the server itself. `Nats-Msg-Id =
//! {execution_id}:{sequence}` makes a retried append idempotent: when the server reports a
//! wrong last sequence, the last message is re-read, and if it carries our id, our write landed.
//!
//! Reads of short logs (up to 64 events, the common case) use direct gets, and subscriptions
//! to them subscribe to the stream's republish of the execution (`{ns}.stored.{id}`) first,
//! then read the history and merge by sequence, re-reading the stream on a gap or after a quiet
//! second: no consumer state on the server per reader. Longer logs use an ordered consumer,
//! which batches deliveries. (An ordered consumer for every reader cost the server most of a
//! core at ~800 executions/s; see BENCHMARKS.md.)
//!
//! The owner of an execution travels in the [`OWNER_HEADER`] header of its first message
//! (`execution.accepted`); a first message without it (stored before executions had owners)
//! belongs to the default tenant. Reading a whole short log reads that message anyway, so
//! `owned_state` costs nothing extra; `owner` alone is one direct get of the subject's first
//! message.
//!
//! Readers never follow the write subject `{ns}.events.{id}`: core NATS delivers every publish
//! there, including appends the stream refuses (a fenced writer's failed compare-and-set) or
//! never stores (its leader was lost), so a reader would show events the log does not hold.
//! The server republishes a message only once it is stored, so everything a reader sees comes
//! from the log.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::consumer::{self, DeliverPolicy};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;
use protocol::materialize::{Materializer, check_event};
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant};

use super::{NatsBackend, unavailable};
use crate::error::StoreError;
use crate::event_store::{EventRecord, EventStore, EventStream, LogHead, WriterId};

/// What this process knows about the end of a log.
#[derive(Debug, Clone, Copy)]
struct Head {
    sequence: Sequence,
    stream_sequence: u64,
    terminal: bool,
    time: protocol::Timestamp,
}

/// The last message of a subject as read from the server.
struct Fetched {
    head: Head,
    msg_id: Option<String>,
}

/// Logs up to this many events are read by direct gets and followed with a plain subscription;
/// longer ones by an ordered consumer, which batches deliveries.
const DIRECT_READ_MAX: u64 = 64;

/// How long the live path may stay quiet before the stream is re-read.
const LIVE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// State of a merged history + live subscription.
struct LiveMerge {
    store: NatsEventStore,
    id: ExecutionId,
    subscriber: async_nats::Subscriber,
    /// The next execution sequence to deliver.
    expected: Sequence,
    /// Stream sequence of the last record read from the stream.
    last_stream_sequence: u64,
    ready: std::collections::VecDeque<Arc<EventRecord>>,
    finished: bool,
}

impl LiveMerge {
    /// Queues the records that continue the log; skips ones already delivered.
    fn accept(&mut self, record: EventRecord) {
        if record.sequence() == self.expected && !self.finished {
            self.expected = self.expected.next();
            self.finished = record.event.is_terminal();
            self.ready.push_back(Arc::new(record));
        }
    }

    fn absorb(&mut self, records: Vec<(u64, EventRecord)>) -> Result<(), StoreError> {
        for (stream_sequence, record) in records {
            self.last_stream_sequence = self.last_stream_sequence.max(stream_sequence);
            if record.sequence() > self.expected {
                return Err(StoreError::Unavailable("gap in event log".into()));
            }
            self.accept(record);
        }
        Ok(())
    }

    async fn reread(&mut self) -> Result<(), StoreError> {
        let records = self
            .store
            .history_from(self.id, self.last_stream_sequence + 1, None)
            .await?;
        self.absorb(records)
    }

    async fn next(&mut self) -> Option<Result<Arc<EventRecord>, StoreError>> {
        loop {
            if let Some(record) = self.ready.pop_front() {
                return Some(Ok(record));
            }
            if self.finished {
                return None;
            }
            let message = match tokio::time::timeout(LIVE_RECHECK, self.subscriber.next()).await {
                Ok(Some(message)) => Some(message),
                Ok(None) => {
                    return Some(Err(StoreError::Unavailable("subscription closed".into())));
                }
                Err(_) => None,
            };
            let in_order = message
                .and_then(|m| Some((stored_sequence(&m), EventRecord::decode(m.payload)?)))
                .filter(|(_, r)| r.sequence() <= self.expected);
            match in_order {
                Some((stream_sequence, record)) => {
                    // Everything of this execution up to here has been delivered, so a re-read
                    // may start after it.
                    if let Some(s) = stream_sequence {
                        self.last_stream_sequence = self.last_stream_sequence.max(s);
                    }
                    self.accept(record);
                }
                // A gap, an undecodable message or a quiet second: read what the stream has.
                None => {
                    if let Err(e) = self.reread().await {
                        self.finished = true;
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}

/// The materialized state of a whole log.
fn materialize(records: &[Arc<EventRecord>]) -> Result<Option<Materializer>, StoreError> {
    Materializer::from_events(records.iter().map(|r| &r.event))
        .map_err(|e| StoreError::Unavailable(format!("event log violates its rules: {e}")))
}

/// The stream sequence the server stamped on a republished (stored) message.
fn stored_sequence(message: &async_nats::Message) -> Option<u64> {
    message
        .headers
        .as_ref()?
        .get_last("Nats-Sequence")?
        .as_str()
        .parse()
        .ok()
}

/// The header of an execution's first message naming its owner.
pub const OWNER_HEADER: &str = "Mrt-Tenant";

/// The owner named by the headers of an execution's first message.
fn owner_of(headers: &async_nats::HeaderMap) -> Result<Tenant, StoreError> {
    match headers.get(OWNER_HEADER) {
        None => Ok(Tenant::default()),
        Some(value) => value.as_str().parse().map_err(|_| {
            StoreError::Unavailable("invalid owner header in the events stream".into())
        }),
    }
}

/// Most heads cached; beyond this the cache is cleared (it only saves a round trip).
const MAX_CACHED_HEADS: usize = 65_536;

/// See the module docs.
#[derive(Clone)]
pub struct NatsEventStore {
    backend: NatsBackend,
    stream: Stream,
    heads: Arc<Mutex<HashMap<ExecutionId, Head>>>,
    max_events: u64,
}

impl std::fmt::Debug for NatsEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsEventStore")
            .field("settings", &self.backend.settings)
            .finish_non_exhaustive()
    }
}

/// `{execution_id}:{sequence}:{writer}`: the writer part keeps two writers of the same
/// sequence apart even when their events serialize identically (two duplicate deliveries
/// selecting the same route in the same millisecond), so deduplication only ever absorbs a
/// writer's own retry and compare-and-set decides between writers.
fn msg_id(id: ExecutionId, sequence: Sequence, writer: WriterId) -> String {
    format!("{id}:{sequence}:{writer}")
}

impl NatsEventStore {
    /// `max_events`: non-terminal events allowed per execution [R 84].
    pub async fn new(backend: NatsBackend, max_events: u64) -> Result<Self, StoreError> {
        let stream = backend
            .jetstream
            .get_stream(backend.settings.events_stream())
            .await
            .map_err(|e| unavailable("events stream", e))?;
        Ok(Self {
            backend,
            stream,
            heads: Arc::new(Mutex::new(HashMap::new())),
            max_events,
        })
    }

    fn subject(&self, id: ExecutionId) -> String {
        self.backend.settings.events_subject(&id)
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

    /// Reads the last message of the execution's subject from the server.
    async fn fetch_head(&self, id: ExecutionId) -> Result<Option<Fetched>, StoreError> {
        self.backend.check_connected()?;
        match self
            .stream
            .direct_get_last_for_subject(self.subject(id))
            .await
        {
            Ok(message) => {
                let msg_id = message
                    .headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.as_str().to_owned());
                let payload = message.payload;
                let record = EventRecord::decode(payload).ok_or_else(|| {
                    StoreError::Unavailable("undecodable event in the events stream".into())
                })?;
                let head = Head {
                    sequence: record.sequence(),
                    stream_sequence: message.sequence,
                    terminal: record.event.is_terminal(),
                    time: record.event.time,
                };
                Ok(Some(Fetched { head, msg_id }))
            }
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable("direct get", e)),
        }
    }

    /// Publishes `record` expecting the subject's last stream sequence to be `expected`.
    async fn publish(
        &self,
        record: &EventRecord,
        expected: u64,
        writer: WriterId,
        owner: Option<&Tenant>,
    ) -> Result<Result<u64, PublishErrorKind>, StoreError> {
        self.backend.check_connected()?;
        let event = &record.event;
        let mut message = PublishMessage::build()
            .payload(record.json.clone())
            .message_id(msg_id(event.execution_id, event.sequence, writer))
            .expected_last_subject_sequence(expected);
        if let Some(owner) = owner {
            message = message.header(OWNER_HEADER, owner.as_str());
        }
        let ack = match self
            .backend
            .jetstream
            .send_publish(self.subject(event.execution_id), message)
            .await
        {
            Ok(ack) => ack,
            Err(e) => return Err(unavailable("publish", e)),
        };
        match ack.await {
            // A duplicate is this writer's own earlier attempt (the msg id names the writer).
            Ok(ack) => Ok(Ok(ack.sequence)),
            Err(e) => match e.kind() {
                kind @ PublishErrorKind::WrongLastSequence => Ok(Err(kind)),
                _ => Err(unavailable("publish ack", e)),
            },
        }
    }

    /// Reads every event of the execution after `after`, in order (`None`: unknown execution),
    /// and its owner when the first message was read on the way (short logs).
    async fn read_all(
        &self,
        id: ExecutionId,
        after: Sequence,
        limit: usize,
    ) -> Result<Option<(Vec<Arc<EventRecord>>, Option<Tenant>)>, StoreError> {
        let Some(Fetched { head, .. }) = self.fetch_head(id).await? else {
            return Ok(None);
        };
        if head.sequence <= after || limit == 0 {
            return Ok(Some((Vec::new(), None)));
        }
        let wanted_last = head
            .sequence
            .min(Sequence(after.get().saturating_add(limit as u64)));
        if head.sequence.get() <= DIRECT_READ_MAX {
            let mut owner = None;
            let records = self
                .history_from_owned(id, 1, Some(wanted_last), Some(&mut owner))
                .await?;
            let records = records
                .into_iter()
                .map(|(_, r)| r)
                .filter(|r| r.sequence() > after && r.sequence() <= wanted_last)
                .map(Arc::new)
                .collect();
            return Ok(Some((records, owner)));
        }
        let mut stream = self.ordered(id).await?;
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            let record = item?;
            if record.sequence() > after {
                let done = record.sequence() >= wanted_last;
                out.push(record);
                if done {
                    break;
                }
            }
        }
        Ok(Some((out, None)))
    }

    /// Records of the execution's subject from stream sequence `from` on, by direct get (one
    /// round trip each), stopping after execution sequence `stop_after` if given.
    async fn history_from(
        &self,
        id: ExecutionId,
        from: u64,
        stop_after: Option<Sequence>,
    ) -> Result<Vec<(u64, EventRecord)>, StoreError> {
        self.history_from_owned(id, from, stop_after, None).await
    }

    /// [`Self::history_from`], also setting `owner` from the first message's headers if it is
    /// among those read.
    async fn history_from_owned(
        &self,
        id: ExecutionId,
        mut from: u64,
        stop_after: Option<Sequence>,
        mut owner: Option<&mut Option<Tenant>>,
    ) -> Result<Vec<(u64, EventRecord)>, StoreError> {
        self.backend.check_connected()?;
        let subject = self.subject(id);
        let mut out = Vec::new();
        loop {
            match self
                .stream
                .direct_get_next_for_subject(subject.clone(), Some(from))
                .await
            {
                Ok(message) => {
                    let stream_sequence = message.sequence;
                    let record = EventRecord::decode(message.payload)
                        .ok_or_else(|| StoreError::Unavailable("undecodable event".into()))?;
                    if let Some(owner) = owner.as_deref_mut()
                        && record.sequence() == Sequence(1)
                    {
                        *owner = Some(owner_of(&message.headers)?);
                    }
                    let done = stop_after.is_some_and(|s| record.sequence() >= s);
                    from = stream_sequence + 1;
                    out.push((stream_sequence, record));
                    if done {
                        return Ok(out);
                    }
                }
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(unavailable("direct get", e)),
            }
        }
    }

    /// Short logs: subscribe to the stream's republish of the execution first (stored events
    /// only), then read the history by direct get, and merge by sequence. No server-side
    /// consumer is created, so streams cost the server one subscription each. A gap on the
    /// live path (republish is at most once), or a quiet second, triggers a re-read from the
    /// stream, so a message missed on the live path is still delivered.
    async fn live(&self, id: ExecutionId, after: Sequence) -> Result<EventStream, StoreError> {
        let subscriber = self
            .backend
            .client
            .subscribe(self.backend.settings.stored_events_subject(&id))
            .await
            .map_err(|e| unavailable("subscribe", e))?;
        // Read to the end of the stream, not just to the head seen before subscribing: events
        // appended in between reached neither the subscription nor that head.
        let history = self.history_from(id, 1, None).await?;
        let mut merge = LiveMerge {
            store: self.clone(),
            id,
            subscriber,
            expected: after.next(),
            last_stream_sequence: 0,
            ready: std::collections::VecDeque::new(),
            finished: false,
        };
        merge.absorb(history)?;
        let stream = futures_util::stream::unfold(merge, |mut merge| async move {
            let item = merge.next().await?;
            Some((item, merge))
        });
        Ok(stream.boxed())
    }

    /// Every event of the execution from the start, live, in order; ends after the terminal.
    async fn ordered(&self, id: ExecutionId) -> Result<EventStream, StoreError> {
        self.backend.check_connected()?;
        let consumer = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: self.subject(id),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("create ordered consumer", e))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| unavailable("consume", e))?;
        let stream = futures_util::stream::unfold(
            (messages, Sequence::ZERO, false),
            |(mut messages, last, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let message = match messages.next().await? {
                        Ok(m) => m,
                        Err(e) => {
                            return Some((
                                Err(unavailable("ordered consumer", e)),
                                (messages, last, true),
                            ));
                        }
                    };
                    let payload: Bytes = message.message.payload.clone();
                    let Some(record) = EventRecord::decode(payload) else {
                        return Some((
                            Err(StoreError::Unavailable("undecodable event".into())),
                            (messages, last, true),
                        ));
                    };
                    let seq = record.sequence();
                    if seq <= last {
                        continue; // redelivered after a consumer reset
                    }
                    if seq != last.next() {
                        return Some((
                            Err(StoreError::Unavailable("gap in event log".into())),
                            (messages, last, true),
                        ));
                    }
                    let terminal = record.event.is_terminal();
                    return Some((Ok(Arc::new(record)), (messages, seq, terminal)));
                }
            },
        );
        Ok(stream.boxed())
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
            .publish(&record, 0, WriterId::random(), Some(owner))
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

    async fn append_as(&self, event: RuntimeEvent, writer: WriterId) -> Result<(), StoreError> {
        check_event(&event)?;
        let id = event.execution_id;
        let terminal = event.is_terminal();
        if !terminal && event.sequence.get() > self.max_events {
            return Err(StoreError::ExecutionLimit);
        }
        let cached = self.heads.lock().get(&id).copied();
        let head = match cached {
            Some(h) if h.sequence.next() == event.sequence => h,
            _ => match self.fetch_head(id).await? {
                Some(f) => f.head,
                None => return Err(StoreError::NotFound),
            },
        };
        if head.terminal || head.sequence.next() != event.sequence {
            self.remember(id, head);
            return Err(StoreError::Conflict {
                last: head.sequence,
                terminal: head.terminal,
            });
        }
        let time = event.time;
        let sequence = event.sequence;
        let record = EventRecord::new(event);
        match self
            .publish(&record, head.stream_sequence, writer, None)
            .await?
        {
            Ok(stream_sequence) => {
                self.remember(
                    id,
                    Head {
                        sequence,
                        stream_sequence,
                        terminal,
                        time,
                    },
                );
                Ok(())
            }
            Err(_) => {
                self.heads.lock().remove(&id);
                match self.fetch_head(id).await? {
                    Some(f)
                        if f.msg_id.as_deref() == Some(msg_id(id, sequence, writer).as_str()) =>
                    {
                        // Our write landed earlier (a retry after a lost ack).
                        self.remember(id, f.head);
                        Ok(())
                    }
                    Some(Fetched { head: h, .. }) => Err(StoreError::Conflict {
                        last: h.sequence,
                        terminal: h.terminal,
                    }),
                    None => Err(StoreError::NotFound),
                }
            }
        }
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Ok(self.fetch_head(id).await?.map(|Fetched { head: h, .. }| {
            self.remember(id, h);
            LogHead {
                last_sequence: h.sequence,
                terminal: h.terminal,
                last_time: h.time,
            }
        }))
    }

    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError> {
        let Some((records, _)) = self.read_all(id, Sequence::ZERO, usize::MAX).await? else {
            return Ok(None);
        };
        materialize(&records)
    }

    async fn owner(&self, id: ExecutionId) -> Result<Option<Tenant>, StoreError> {
        self.backend.check_connected()?;
        match self
            .stream
            .direct_get_next_for_subject(self.subject(id), Some(1))
            .await
        {
            Ok(message) => owner_of(&message.headers).map(Some),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable("direct get", e)),
        }
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
        // Long logs are read by an ordered consumer, which does not keep headers here.
        let owner = match owner {
            Some(owner) => owner,
            None => match self.owner(id).await? {
                Some(owner) => owner,
                None => return Ok(None),
            },
        };
        Ok(Some((materializer, owner)))
    }

    async fn read(
        &self,
        id: ExecutionId,
        after: Sequence,
        limit: usize,
    ) -> Result<Option<Vec<Arc<EventRecord>>>, StoreError> {
        Ok(self
            .read_all(id, after, limit)
            .await?
            .map(|(records, _)| records))
    }

    async fn subscribe(
        &self,
        id: ExecutionId,
        after: Sequence,
    ) -> Result<Option<EventStream>, StoreError> {
        let Some(Fetched { head, .. }) = self.fetch_head(id).await? else {
            return Ok(None);
        };
        if head.terminal && head.sequence <= after {
            return Ok(Some(futures_util::stream::empty().boxed()));
        }
        if head.sequence.get() <= DIRECT_READ_MAX {
            return Ok(Some(self.live(id, after).await?.fuse().boxed()));
        }
        let stream = self.ordered(id).await?;
        let filtered = stream.filter(move |item| {
            let keep = match item {
                Ok(record) => record.sequence() > after,
                Err(_) => true,
            };
            std::future::ready(keep)
        });
        Ok(Some(filtered.fuse().boxed()))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.backend.check_connected()
    }
}
