//! The JetStream event store: one subject per execution in `{NS}_EVENTS`.
//!
//! Appends are compare-and-set on the subject's last stream sequence, which this process caches
//! per open execution (and re-reads with a direct get when it does not know it), so a stale or
//! duplicate writer in any process is refused by the server itself. `Nats-Msg-Id =
//! {execution_id}:{sequence}` makes a retried append idempotent: when the server reports a
//! wrong last sequence, the last message is re-read, and if it carries our id, our write landed.
//!
//! Reads use an ordered consumer filtered on the execution's subject: it delivers every message
//! exactly once and in order, re-creating itself after a gap or reconnect. That costs one
//! ephemeral consumer per reader on the server (see BENCHMARKS.md for the measured cost).

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
use protocol::{ExecutionId, RuntimeEvent, Sequence};

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
    ) -> Result<Result<u64, PublishErrorKind>, StoreError> {
        self.backend.check_connected()?;
        let event = &record.event;
        let message = PublishMessage::build()
            .payload(record.json.clone())
            .message_id(msg_id(event.execution_id, event.sequence, writer))
            .expected_last_subject_sequence(expected);
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

    /// Reads every event of the execution after `after`, in order (`None`: unknown execution).
    async fn read_all(
        &self,
        id: ExecutionId,
        after: Sequence,
        limit: usize,
    ) -> Result<Option<Vec<Arc<EventRecord>>>, StoreError> {
        let Some(Fetched { head, .. }) = self.fetch_head(id).await? else {
            return Ok(None);
        };
        if head.sequence <= after || limit == 0 {
            return Ok(Some(Vec::new()));
        }
        let wanted_last = head
            .sequence
            .min(Sequence(after.get().saturating_add(limit as u64)));
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
        Ok(Some(out))
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
    async fn create(&self, accepted: RuntimeEvent) -> Result<(), StoreError> {
        check_event(&accepted)?;
        let id = accepted.execution_id;
        let time = accepted.time;
        let record = EventRecord::new(accepted);
        match self.publish(&record, 0, WriterId::random()).await? {
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
        match self.publish(&record, head.stream_sequence, writer).await? {
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
        let Some(records) = self.read_all(id, Sequence::ZERO, usize::MAX).await? else {
            return Ok(None);
        };
        let materializer = Materializer::from_events(records.iter().map(|r| &r.event))
            .map_err(|e| StoreError::Unavailable(format!("event log violates its rules: {e}")))?;
        Ok(materializer)
    }

    async fn read(
        &self,
        id: ExecutionId,
        after: Sequence,
        limit: usize,
    ) -> Result<Option<Vec<Arc<EventRecord>>>, StoreError> {
        self.read_all(id, after, limit).await
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
