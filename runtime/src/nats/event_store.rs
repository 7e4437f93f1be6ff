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
//! Stored format. A message without the `Mrt-Format` header is format 1: its body is one event's
//! JSON (every log written before runs existed stays readable). `Mrt-Format: 2`: the body is a
//! JSON array holding a contiguous run of events, each element exactly the event's JSON, with
//! `Nats-Msg-Id = {execution_id}:{first}-{last}:{writer}`. [`EventStore::append_run_as`] packs a
//! run into as few messages as the stream's message size allows (a run of one is written in
//! format 1, as before), each still compare-and-set on the subject's last stream sequence; a
//! retried identical run is absorbed by deduplication (or recognised by its msg id on a wrong
//! last sequence), while another writer's run of the same sequences has another id and is
//! fenced. Every reader expands a message into its events and skips those at or before its
//! cursor, so a cursor may fall inside a run; the head of a log is the last event of its last
//! message. A message is stored (and republished) as a unit, so gap detection on the live
//! path works per message: a message whose first event is past the next expected one means a
//! message was missed, and the stream is re-read.
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

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{self, DeliverPolicy};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use parking_lot::Mutex;
use protocol::materialize::{Materializer, check_event};
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant};

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

/// The last message of a subject as read from the server.
struct Fetched {
    head: Head,
    msg_id: Option<String>,
}

/// The header naming a message's stored format (see the module docs); absent means format 1.
const FORMAT_HEADER: &str = "Mrt-Format";
/// Format 2: a JSON array holding a contiguous run of events.
const FORMAT_RUN: &str = "2";

/// Room left in a message for its headers when packing a run (msg id, expected sequence,
/// format, and what the server adds), so a run never exceeds the stream's message size.
const HEADER_ALLOWANCE: usize = 1024;

/// The events of one stored message, or `None` when it is not a message of a format this
/// process reads.
fn decode_message(headers: Option<&HeaderMap>, payload: Bytes) -> Option<Vec<EventRecord>> {
    match headers
        .and_then(|h| h.get(FORMAT_HEADER))
        .map(|v| v.as_str())
    {
        None => Some(vec![EventRecord::decode(payload)?]),
        Some(FORMAT_RUN) => {
            let raws: Vec<&serde_json::value::RawValue> = serde_json::from_slice(&payload).ok()?;
            let mut records = Vec::with_capacity(raws.len());
            for raw in raws {
                // Each record keeps exactly its element's bytes, shared with the payload.
                let json = payload.slice_ref(raw.get().as_bytes());
                let record = EventRecord::decode(json)?;
                if let Some(previous) = records.last().map(EventRecord::sequence)
                    && record.sequence() != previous.next()
                {
                    return None;
                }
                records.push(record);
            }
            (!records.is_empty()).then_some(records)
        }
        Some(_) => None,
    }
}

fn undecodable() -> StoreError {
    StoreError::Unavailable("undecodable message in the events stream".into())
}

/// The body of a format-2 message: the events' JSON as one array.
fn encode_run(run: &[EventRecord]) -> Bytes {
    let size = run.iter().map(|r| r.json.len() + 1).sum::<usize>() + 1;
    let mut body = BytesMut::with_capacity(size);
    body.put_u8(b'[');
    for (i, record) in run.iter().enumerate() {
        if i > 0 {
            body.put_u8(b',');
        }
        body.put_slice(&record.json);
    }
    body.put_u8(b']');
    body.freeze()
}

/// The end of the first message of `run[start..end]`: as many events as fit in `budget` bytes
/// of body, at least one.
fn pack(run: &[EventRecord], start: usize, end: usize, budget: usize) -> usize {
    let mut size = 1 + run[start].json.len() + 1;
    let mut next = start + 1;
    while next < end {
        size += run[next].json.len() + 1;
        if size > budget {
            break;
        }
        next += 1;
    }
    next
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
            // A message is stored as a unit: it continues what was delivered when its first
            // event is not past the next expected one (earlier events are skipped).
            let in_order = message
                .and_then(|m| {
                    let records = decode_message(m.headers.as_ref(), m.payload.clone())?;
                    Some((stored_sequence(&m), records))
                })
                .filter(|(_, records)| records[0].sequence() <= self.expected);
            match in_order {
                Some((stream_sequence, records)) => {
                    // Everything of this execution up to here has been delivered, so a re-read
                    // may start after it.
                    if let Some(s) = stream_sequence {
                        self.last_stream_sequence = self.last_stream_sequence.max(s);
                    }
                    for record in records {
                        self.accept(record);
                    }
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

/// The `Nats-Msg-Id` of a message holding `run`: `{execution_id}:{sequence}:{writer}` for one
/// event (format 1, as ever), `{execution_id}:{first}-{last}:{writer}` for a run. The writer
/// part keeps two writers of the same sequences apart even when their events serialize
/// identically (two duplicate deliveries selecting the same route in the same millisecond), so
/// deduplication only ever absorbs a writer's own retry and compare-and-set decides between
/// writers.
fn msg_id(run: &[EventRecord], writer: WriterId) -> String {
    let (first, last) = (&run[0].event, &run[run.len() - 1].event);
    let id = first.execution_id;
    if run.len() == 1 {
        format!("{id}:{}:{writer}", first.sequence)
    } else {
        format!("{id}:{}-{}:{writer}", first.sequence, last.sequence)
    }
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
        let found = match self
            .stream
            .direct_get_last_for_subject(self.subject(id))
            .await
        {
            Ok(message) => Some(message),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                self.confirm_missing(id, Edge::Last).await?
            }
            Err(e) => return Err(unavailable("direct get", e)),
        };
        match found {
            Some(message) => {
                let msg_id = message
                    .headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.as_str().to_owned());
                let records = decode_message(Some(&message.headers), message.payload)
                    .ok_or_else(undecodable)?;
                // The head of the log is the last event of its last message.
                let record = records.last().ok_or_else(undecodable)?;
                let head = Head {
                    sequence: record.sequence(),
                    stream_sequence: message.sequence,
                    terminal: record.event.is_terminal(),
                    time: record.event.time,
                };
                Ok(Some(Fetched { head, msg_id }))
            }
            None => Ok(None),
        }
    }

    /// A direct get found no message for the execution. With replicas, any of them may answer a
    /// direct get, and a follower may not have applied a message the leader has acknowledged
    /// (a log created a moment ago would read as unknown: a 404 right after its 202). So a miss
    /// is confirmed by the leader (the stream's message-get API) before it counts: one more
    /// round trip, only for a miss and only with replicas.
    async fn confirm_missing(
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
                self.stream
                    .get_first_raw_message_by_subject(&subject, 1)
                    .await
            }
            Edge::Last => self.stream.get_last_raw_message_by_subject(&subject).await,
        };
        match got {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("message get", e)),
        }
    }

    /// Publishes `run` as one message (format 1 for one event, else format 2) expecting the
    /// subject's last stream sequence to be `expected`.
    async fn publish(
        &self,
        run: &[EventRecord],
        expected: u64,
        writer: WriterId,
        owner: Option<&Tenant>,
    ) -> Result<Result<u64, PublishErrorKind>, StoreError> {
        self.backend.check_connected()?;
        let id = run[0].event.execution_id;
        let mut message = if run.len() == 1 {
            PublishMessage::build().payload(run[0].json.clone())
        } else {
            PublishMessage::build()
                .payload(encode_run(run))
                .header(FORMAT_HEADER, FORMAT_RUN)
        };
        message = message
            .message_id(msg_id(run, writer))
            .expected_last_subject_sequence(expected);
        if let Some(owner) = owner {
            message = message.header(OWNER_HEADER, owner.as_str());
        }
        let ack = match self
            .backend
            .jetstream
            .send_publish(self.subject(id), message)
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

    /// The largest body a message of a run may have: the stream's message size and the
    /// server's payload limit, less room for headers.
    fn message_budget(&self) -> usize {
        let max_message = usize::try_from(self.backend.settings.max_event_bytes).unwrap_or(0);
        let max_payload = self.backend.client.server_info().max_payload;
        let limit = if max_payload == 0 {
            max_message
        } else {
            max_message.min(max_payload)
        };
        limit.saturating_sub(HEADER_ALLOWANCE)
    }

    /// Appends `run` (checked, contiguous, non-empty) as one message, compare-and-set on the
    /// subject's last stream sequence.
    async fn append_message(
        &self,
        run: &[EventRecord],
        writer: WriterId,
    ) -> Result<(), StoreError> {
        let first = &run[0].event;
        let last = &run[run.len() - 1].event;
        let id = first.execution_id;
        let cached = self.heads.lock().get(&id).copied();
        let (head, last_msg_id) = match cached {
            Some(h) if h.sequence.next() == first.sequence => (h, None),
            _ => match self.fetch_head(id).await? {
                Some(f) => (f.head, f.msg_id),
                None => return Err(StoreError::NotFound),
            },
        };
        if head.terminal || head.sequence.next() != first.sequence {
            self.remember(id, head);
            if last_msg_id.as_deref() == Some(msg_id(run, writer).as_str()) {
                // Our write is the last one: a retry after a lost ack.
                return Ok(());
            }
            return Err(StoreError::Conflict {
                last: head.sequence,
                terminal: head.terminal,
            });
        }
        let appended = |stream_sequence| Head {
            sequence: last.sequence,
            stream_sequence,
            terminal: last.is_terminal(),
            time: last.time,
        };
        match self
            .publish(run, head.stream_sequence, writer, None)
            .await?
        {
            Ok(stream_sequence) => {
                self.remember(id, appended(stream_sequence));
                Ok(())
            }
            Err(_) => {
                self.heads.lock().remove(&id);
                match self.fetch_head(id).await? {
                    Some(f) if f.msg_id.as_deref() == Some(msg_id(run, writer).as_str()) => {
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
                    let records = decode_message(Some(&message.headers), message.payload)
                        .ok_or_else(undecodable)?;
                    if let Some(owner) = owner.as_deref_mut()
                        && records.first().is_some_and(|r| r.sequence() == Sequence(1))
                    {
                        *owner = Some(owner_of(&message.headers)?);
                    }
                    let done = records
                        .last()
                        .is_some_and(|r| stop_after.is_some_and(|s| r.sequence() >= s));
                    from = stream_sequence + 1;
                    out.extend(records.into_iter().map(|r| (stream_sequence, r)));
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
        let state = Ordered {
            messages,
            pending: std::collections::VecDeque::new(),
            last: Sequence::ZERO,
            done: false,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        });
        Ok(stream.boxed())
    }
}

/// State of an ordered-consumer read: the messages, the events of the current message not yet
/// yielded, the last sequence yielded.
struct Ordered {
    messages: consumer::pull::Ordered,
    pending: std::collections::VecDeque<EventRecord>,
    last: Sequence,
    done: bool,
}

impl Ordered {
    async fn next(&mut self) -> Option<Result<Arc<EventRecord>, StoreError>> {
        loop {
            if self.done {
                return None;
            }
            let Some(record) = self.pending.pop_front() else {
                let message = match self.messages.next().await? {
                    Ok(m) => m,
                    Err(e) => {
                        self.done = true;
                        return Some(Err(unavailable("ordered consumer", e)));
                    }
                };
                let payload: Bytes = message.message.payload.clone();
                match decode_message(message.message.headers.as_ref(), payload) {
                    Some(records) => self.pending.extend(records),
                    None => {
                        self.done = true;
                        return Some(Err(undecodable()));
                    }
                }
                continue;
            };
            let seq = record.sequence();
            if seq <= self.last {
                continue; // redelivered after a consumer reset
            }
            if seq != self.last.next() {
                self.done = true;
                return Some(Err(StoreError::Unavailable("gap in event log".into())));
            }
            self.last = seq;
            self.done = record.event.is_terminal();
            return Some(Ok(Arc::new(record)));
        }
    }
}

/// Which message of an execution's subject a leader read confirms.
#[derive(Debug, Clone, Copy)]
enum Edge {
    First,
    Last,
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
        let first = match self
            .stream
            .direct_get_next_for_subject(self.subject(id), Some(1))
            .await
        {
            Ok(message) => Some(message),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                self.confirm_missing(id, Edge::First).await?
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

    async fn read(&self, id: ExecutionId, after: Sequence, limit: usize) -> ReadResult {
        Ok(self
            .read_all(id, after, limit)
            .await?
            .map(|(records, _)| records))
    }

    async fn subscribe(&self, id: ExecutionId, after: Sequence) -> SubscribeResult {
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
