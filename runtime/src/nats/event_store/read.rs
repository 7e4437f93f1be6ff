//! The read path: whole logs and subscriptions.
//!
//! Short logs (up to 64 messages, the common case) are read in one batched direct get
//! ([`super::direct`]), which also brings the owner from the first message's headers.
//! Subscriptions to them subscribe to the stream's republish of the execution
//! (`{ns}.stored.{id}`) first, then read that batch and merge by sequence, re-reading the
//! stream on a gap (up to the message that showed it), after a reconnect of the readers'
//! connection, or after a quiet spell (50 ms doubling to a second until the first live message,
//! then a second, doubling up to 8 s while the stream stays silent): no consumer state on the
//! server per reader. No read chases the end of a log being written. Longer logs
//! use an ordered consumer, which batches deliveries. (An ordered consumer for every reader
//! cost the server most of a core at ~800 executions/s; see BENCHMARKS.md.)
//!
//! Readers never follow the write subject `{ns}.events.{id}`: core NATS delivers every publish
//! there, including appends the stream refuses (a fenced writer's failed compare-and-set) or
//! never stores (its leader was lost), so a reader would show events the log does not hold.
//! The server republishes a message only once it is stored, so everything a reader sees comes
//! from the log.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, DeliverPolicy};
use bytes::Bytes;
use futures_util::StreamExt;
use protocol::{ExecutionId, Sequence, Tenant};
use tokio::time::Instant;

use super::format::{decode_message, undecodable};
use super::{Edge, Fetched, NatsEventStore, owner_of};
use crate::error::StoreError;
use crate::event_store::{EventRecord, EventStream};
use crate::lazy_timer::LazyTimer;
use crate::nats::direct::Batch;
use crate::nats::{Readers, connects, unavailable};

/// Logs up to this many messages are read by one batched direct get and followed with a plain
/// subscription; longer ones by an ordered consumer, which batches deliveries.
pub(super) const DIRECT_READ_MAX: usize = 64;

/// How long the live path may stay quiet before the stream is re-read, once a message has
/// arrived on it.
const LIVE_RECHECK: Duration = Duration::from_secs(1);

/// The longest quiet spell between two re-reads of a live read that receives nothing: from
/// [`LIVE_RECHECK`], each re-read that finds nothing new doubles the spell, up to this; a
/// message on the live path, a re-read that finds one, or a reconnect brings it back.
///
/// Execution logs stay silent for as long as a provider is (a model call that streams nothing
/// for 10 s, an image generation): a re-read every quiet second cost each open stream a read a
/// second, about a third of the gateway's CPU per execution for 10-s executions at 200 exec/s
/// on 2 cores (BENCHMARKS.md, "A read per quiet second"). What the live path can miss is a
/// message published while the readers' connection was away (core NATS is at most once), which
/// a reconnect announces, or one dropped for a slow consumer, which the next message shows as a
/// gap; so the quiet re-read is a backstop, and the connection's reconnects are checked at each
/// quiet [`LIVE_RECHECK`] to re-read at once.
const QUIET_MAX: Duration = Duration::from_secs(8);

/// The first quiet wait before any message has arrived on the live path; each quiet re-read
/// doubles it, up to [`LIVE_RECHECK`].
///
/// Until a message arrives, the path may not be in place yet: on a cluster the subscription's
/// interest reaches the server that republishes a stored message a little after this server
/// took it, and the history may come from a replica a little behind the leader, so a message
/// stored in between reaches neither. On a 3-node R3 cluster at c=64 that was about 0.8% of
/// executions, whose last events then waited for the quiet second (first-delta p99.9 1.04 s;
/// BENCHMARKS.md, "Quiet re-reads"). A message that arrives shows the path works.
///
/// A server outside any cluster republishes and answers the read itself, after taking the
/// subscription (one connection's requests are taken in order): nothing can fall in between,
/// so there the first wait is [`LIVE_RECHECK`]. Under load, when executions wait in the queue
/// longer than these waits, each early re-read is one more read on the readers' connection
/// for nothing (BENCHMARKS.md, "Quiet re-reads on one server").
const FIRST_RECHECK: Duration = Duration::from_millis(50);

/// How long a live read keeps re-reading a stream whose re-reads fail (`Unavailable`: a request
/// timed out on a loaded server, a leader election, the connection away or moving off a server
/// cut off from its cluster) before it ends with the error. Past headers, an error can only end
/// the client's stream, which then sees a truncation and must resume (contract section 4): on
/// two saturated cores, 4,096 token streams through 4 workers had 1,003 streams cut in 30 s that
/// way (BENCHMARKS.md, "Overload on two cores"), each by one read that timed out. Meanwhile
/// the subscription keeps what arrives, and a message that follows one it missed is read again
/// with the rest; the client's stream only waits, with its keep-alives.
const REREAD_PATIENCE: Duration = Duration::from_secs(10);

/// The pause after a failed re-read of a live read before the next.
const REREAD_RETRY: Duration = Duration::from_millis(250);

/// A whole-log read by an ordered consumer fails once no event has come for this many request
/// timeouts (see [`read_through`]).
const READ_IDLE_FACTOR: u32 = 2;

/// The events of `stream` after `after`, up to `last`: what a whole-log read returns (a
/// snapshot, a result). `Unavailable` once no event has come for `idle`: an ordered consumer
/// whose stream leader moved or was cut off recreates itself for as long as it takes, and a
/// status read answered nothing meanwhile (a client saw its request time out after a
/// partition healed, instead of a 503 it could retry).
async fn read_through(
    stream: &mut EventStream,
    after: Sequence,
    last: Sequence,
    idle: Duration,
) -> Result<Vec<Arc<EventRecord>>, StoreError> {
    let mut out = Vec::new();
    // One timer for the read, its deadline moved by each event (`crate::lazy_timer`).
    let mut timer = LazyTimer::at(Instant::now() + idle);
    loop {
        timer.set(Instant::now() + idle);
        let item = tokio::select! {
            biased;
            item = stream.next() => item,
            () = timer.elapsed() => {
                return Err(StoreError::Unavailable(
                    "log read: no event within the read's bound".into(),
                ));
            }
        };
        let Some(item) = item else {
            return Ok(out);
        };
        let record = item?;
        if record.sequence() > after {
            let done = record.sequence() >= last;
            out.push(record);
            if done {
                return Ok(out);
            }
        }
    }
}

/// The first quiet wait of a live read on `readers` (see [`FIRST_RECHECK`]).
fn first_recheck(readers: &Readers) -> Duration {
    if readers.clustered {
        FIRST_RECHECK
    } else {
        LIVE_RECHECK
    }
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

/// The records of a batch with the stream sequence of the message each came in, and the owner
/// if the batch holds the log's first message.
type Decoded = (Vec<(u64, EventRecord)>, Option<Tenant>);

fn decode_batch(batch: Batch) -> Result<Decoded, StoreError> {
    let mut owner = None;
    let mut out = Vec::new();
    for message in batch.messages {
        let records =
            decode_message(Some(&message.headers), message.payload).ok_or_else(undecodable)?;
        if records.first().is_some_and(|r| r.sequence() == Sequence(1)) {
            owner = Some(owner_of(&message.headers)?);
        }
        out.extend(records.into_iter().map(|r| (message.stream_sequence, r)));
    }
    Ok((out, owner))
}

/// How a log opened for reading is read.
pub(super) enum Opened {
    /// A short log, whole as the server saw it, with its owner.
    Short(Decoded),
    /// A long log (more than [`DIRECT_READ_MAX`] messages), or one a lagging replica did not
    /// have yet: read by an ordered consumer, which the stream leader serves.
    Long,
}

impl NatsEventStore {
    /// Reads the start of the execution's log in one request: a short log whole, with its
    /// owner (`None`: unknown execution).
    pub(super) async fn open(&self, id: ExecutionId) -> Result<Option<Opened>, StoreError> {
        let batch = self.direct_batch(id, 1, DIRECT_READ_MAX).await?;
        if batch.messages.is_empty() {
            // A follower may not have applied a log the leader acknowledged: the leader decides.
            return Ok(self
                .leader_read(id, Edge::First)
                .await?
                .map(|_| Opened::Long));
        }
        if batch.more {
            return Ok(Some(Opened::Long));
        }
        Ok(Some(Opened::Short(decode_batch(batch)?)))
    }

    /// Reads every event of the execution after `after`, in order (`None`: unknown execution),
    /// and its owner when the first message was read on the way (short logs).
    pub(super) async fn read_all(
        &self,
        id: ExecutionId,
        after: Sequence,
        limit: usize,
    ) -> Result<Option<(Vec<Arc<EventRecord>>, Option<Tenant>)>, StoreError> {
        let Some(opened) = self.open(id).await? else {
            return Ok(None);
        };
        let wanted_last = Sequence(after.get().saturating_add(limit as u64));
        let (last, owner) = match opened {
            Opened::Short((records, owner)) => {
                let behind = match records.last() {
                    Some((_, r)) => {
                        self.behind_leader(id, r.sequence(), r.event.is_terminal())
                            .await
                    }
                    None => None,
                };
                let Some(last) = behind else {
                    let records = records
                        .into_iter()
                        .map(|(_, r)| r)
                        .filter(|r| r.sequence() > after && r.sequence() <= wanted_last)
                        .map(Arc::new)
                        .collect();
                    return Ok(Some((records, owner)));
                };
                (last, owner)
            }
            // A long log: its head, read now, bounds the read (the ordered consumer follows it
            // live); a replica's head, as a short log's last event, may be behind the leader's.
            Opened::Long => {
                let replica = self.direct_last(id).await?.map(Fetched::of_message);
                let last = match replica.transpose()? {
                    Some(Fetched { head, .. }) => self
                        .behind_leader(id, head.sequence, head.terminal)
                        .await
                        .unwrap_or(head.sequence),
                    // The replica has none of it yet (the leader had its first message): the
                    // leader's head, in one read.
                    None => match self.leader_last(id).await? {
                        Some(Fetched { head, .. }) => head.sequence,
                        None => return Ok(None),
                    },
                };
                (last, None)
            }
        };
        let wanted_last = last.min(wanted_last);
        if last <= after || limit == 0 {
            return Ok(Some((Vec::new(), owner)));
        }
        let mut stream = self.ordered(id).await?;
        let idle = self.backend.settings.request_timeout * READ_IDLE_FACTOR;
        let out = read_through(&mut stream, after, wanted_last, idle).await?;
        Ok(Some((out, owner)))
    }

    /// For a log read from a replica of a replicated stream: the leader's last event when the
    /// replica had not applied it yet (`read` and `terminal`: the last event the replica gave,
    /// a short log's last record or a long log's head). A follower
    /// applies the leader's appends a moment after they are acknowledged (longer on a busy
    /// server), so a client that had read the terminal event from its event stream could get
    /// "running" from a status read and 409 from a result read. One leader read settles it (the
    /// stream's message-get API), made only where it can matter: with replicas, and while the
    /// log read is open (a terminal event is the end of the log wherever it is read). When the
    /// leader cannot be asked (a partition), the replica's read stands.
    async fn behind_leader(
        &self,
        id: ExecutionId,
        read: Sequence,
        terminal: bool,
    ) -> Option<Sequence> {
        if terminal {
            return None;
        }
        let Fetched { head, .. } = match self.leader_last(id).await {
            Ok(leader) => leader?,
            Err(e) => {
                tracing::debug!(execution_id = %id, error = %e, "cannot ask the stream leader for the log's end; answering the replica's read");
                return None;
            }
        };
        (head.sequence > read).then_some(head.sequence)
    }

    /// Records of the execution's subject from stream sequence `from` on, in batches of
    /// [`DIRECT_READ_MAX`] messages, until the end of the subject or, given `stop_after`, until
    /// the batch holding that event (a bound: a re-read never chases the end of a log being
    /// written).
    async fn history_from(
        &self,
        id: ExecutionId,
        mut from: u64,
        stop_after: Option<Sequence>,
    ) -> Result<Vec<(u64, EventRecord)>, StoreError> {
        let mut out = Vec::new();
        loop {
            let batch = self.direct_batch(id, from, DIRECT_READ_MAX).await?;
            let more = batch.more;
            let (records, _) = decode_batch(batch)?;
            let Some((last_stream_sequence, last)) = records.last() else {
                return Ok(out);
            };
            from = last_stream_sequence + 1;
            let reached = stop_after.is_some_and(|s| last.sequence() >= s);
            out.extend(records);
            if reached || !more {
                return Ok(out);
            }
        }
    }

    /// Short logs: the subscription to the stream's republish of the execution (stored events
    /// only) is made first, then the log is read in one batched direct get (`history`, see
    /// [`Self::open`]), and both are merged by sequence. No server-side consumer is created, so
    /// streams cost the server one subscription each. A gap on the live path (republish is at
    /// most once), a reconnect of the readers' connection, or a quiet spell ([`FIRST_RECHECK`]
    /// doubling until the first live message, then [`LIVE_RECHECK`] doubling up to
    /// [`QUIET_MAX`] while nothing comes) triggers a re-read from the stream, so a message
    /// missed on the live path is still delivered.
    ///
    /// Every message stored once the subscription is in place reaches it (the server takes this
    /// connection's requests in order), so the history is what one batch read after subscribing
    /// returned: one bounded request, which never chases the end of a log being written (a log
    /// moves on faster than one-by-one reads keep up with under load), and never misses what was
    /// appended before the subscription. A batch from a lagging replica only shortens the
    /// history: the live path's gap check reads the rest.
    pub(super) fn live(
        &self,
        id: ExecutionId,
        after: Sequence,
        subscriber: async_nats::Subscriber,
        history: Vec<(u64, EventRecord)>,
    ) -> Result<EventStream, StoreError> {
        let mut merge = LiveMerge {
            store: self.clone(),
            id,
            subscriber,
            expected: after.next(),
            last_stream_sequence: 0,
            ready: std::collections::VecDeque::new(),
            finished: false,
            quiet: first_recheck(&self.shard(id).readers),
            idle: LIVE_RECHECK,
            quiet_for: Duration::ZERO,
            connects: connects(&self.shard(id).readers.client),
            quiet_timer: LazyTimer::at(Instant::now()),
        };
        merge.absorb(history)?;
        let stream = futures_util::stream::unfold(merge, |mut merge| async move {
            let item = merge.next().await?;
            Some((item, merge))
        });
        Ok(stream.boxed())
    }

    /// Every event of the execution from the start, live, in order; ends after the terminal.
    pub(super) async fn ordered(&self, id: ExecutionId) -> Result<EventStream, StoreError> {
        self.backend.check_connected()?;
        let consumer = self
            .shard(id)
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
    /// How long the live path may stay quiet before the next re-read: [`FIRST_RECHECK`],
    /// doubling, until a message arrives on it (and again after a re-read that came short);
    /// then [`LIVE_RECHECK`], the period at which a quiet read checks for reconnects.
    quiet: Duration,
    /// Once `quiet` is [`LIVE_RECHECK`]: how long the live path may stay quiet before the
    /// stream is re-read, [`LIVE_RECHECK`] doubling up to [`QUIET_MAX`] (see there).
    idle: Duration,
    /// Quiet time since the stream was last read or a message arrived.
    quiet_for: Duration,
    /// The readers' connection's connects when the stream was last read.
    connects: u64,
    /// Ends the wait for the next live message after `quiet`: one timer for the whole read,
    /// its deadline moved for each wait (a timeout made per message took the runtime's timer
    /// lock twice per message: `crate::lazy_timer`).
    quiet_timer: LazyTimer,
}

impl LiveMerge {
    /// Queues the records that continue the log; skips ones already delivered. A terminal
    /// event at or before the cursor ends the stream too: the log ended where the reader
    /// already is (a cursor past the end of a log that was open when the stream was opened, or
    /// read open on a replica behind the one that stored the terminal event).
    fn accept(&mut self, record: EventRecord) {
        if self.finished {
            return;
        }
        if record.sequence() == self.expected {
            self.expected = self.expected.next();
            self.finished = record.event.is_terminal();
            self.ready.push_back(Arc::new(record));
        } else if record.sequence() < self.expected && record.event.is_terminal() {
            self.finished = true;
        }
    }

    fn absorb(&mut self, records: Vec<(u64, EventRecord)>) -> Result<(), StoreError> {
        for (stream_sequence, record) in records {
            if record.sequence() > self.expected {
                // Not counted as read: a read again starts at this message.
                return Err(StoreError::Unavailable("gap in event log".into()));
            }
            self.last_stream_sequence = self.last_stream_sequence.max(stream_sequence);
            self.accept(record);
        }
        Ok(())
    }

    /// Reads the stream after the last message delivered, up to the end of the log or, given
    /// `stop_after`, up to the message holding that event (a bound, so a re-read never chases
    /// the end of a log still being written). A read that fails `Unavailable` is tried again
    /// every [`REREAD_RETRY`] for [`REREAD_PATIENCE`]; only then does the error end the read.
    async fn reread(&mut self, stop_after: Option<Sequence>) -> Result<(), StoreError> {
        let give_up = Instant::now() + REREAD_PATIENCE;
        loop {
            let read = self
                .store
                .history_from(self.id, self.last_stream_sequence + 1, stop_after)
                .await
                .and_then(|records| self.absorb(records));
            match read {
                Err(StoreError::Unavailable(e)) if Instant::now() + REREAD_RETRY < give_up => {
                    tracing::debug!(execution_id = %self.id, error = %e, "re-reading a followed log failed; trying again");
                    tokio::time::sleep(REREAD_RETRY).await;
                }
                read => return read,
            }
        }
    }

    async fn next(&mut self) -> Option<Result<Arc<EventRecord>, StoreError>> {
        loop {
            if let Some(record) = self.ready.pop_front() {
                return Some(Ok(record));
            }
            if self.finished {
                return None;
            }
            self.quiet_timer.set(Instant::now() + self.quiet);
            let waited = tokio::select! {
                biased;
                message = self.subscriber.next() => Ok(message),
                () = self.quiet_timer.elapsed() => Err(()),
            };
            let message = match waited {
                Ok(Some(message)) => {
                    self.quiet = LIVE_RECHECK;
                    self.idle = LIVE_RECHECK;
                    self.quiet_for = Duration::ZERO;
                    Some(message)
                }
                Ok(None) => {
                    return Some(Err(StoreError::Unavailable("subscription closed".into())));
                }
                Err(()) if self.quiet < LIVE_RECHECK => {
                    self.quiet = (self.quiet * 2).min(LIVE_RECHECK);
                    None
                }
                Err(()) => {
                    self.quiet_for += self.quiet;
                    let reconnected =
                        connects(&self.store.shard(self.id).readers.client) != self.connects;
                    if self.quiet_for < self.idle && !reconnected {
                        continue;
                    }
                    None
                }
            };
            let decoded = message.and_then(|m| {
                let records = decode_message(m.headers.as_ref(), m.payload.clone())?;
                Some((stored_sequence(&m), records))
            });
            // An undecodable message, a quiet spell or a reconnect: read what the stream has.
            let Some((stream_sequence, records)) = decoded else {
                let before = self.expected;
                self.connects = connects(&self.store.shard(self.id).readers.client);
                if let Err(e) = self.reread(None).await {
                    self.finished = true;
                    return Some(Err(e));
                }
                self.quiet_for = Duration::ZERO;
                self.idle = if self.expected == before {
                    (self.idle * 2).min(QUIET_MAX)
                } else {
                    LIVE_RECHECK
                };
                continue;
            };
            // A message is stored as a unit: it continues what was delivered when its first
            // event is not past the next expected one (earlier events are skipped). Past it, a
            // message was missed on the live path: the stream is read up to this one.
            let first = records[0].sequence();
            if first > self.expected
                && let Err(e) = self.reread(Some(Sequence(first.get() - 1))).await
            {
                self.finished = true;
                return Some(Err(e));
            }
            if first <= self.expected {
                // Everything of this execution up to here has been delivered, so a re-read
                // may start after it.
                if let Some(s) = stream_sequence {
                    self.last_stream_sequence = self.last_stream_sequence.max(s);
                }
                for record in records {
                    self.accept(record);
                }
            } else {
                // The re-read came short (a replica behind the leader answered): the next
                // message, or a quiet spell as short as at the start, reads again.
                self.quiet = FIRST_RECHECK;
            }
        }
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

#[cfg(test)]
mod tests {
    use protocol::event::{EventBody, ProgressPhase};
    use protocol::{RuntimeEvent, Timestamp};

    use super::*;

    fn record(sequence: u64) -> Result<Arc<EventRecord>, StoreError> {
        let event = RuntimeEvent::new(
            ExecutionId::new_random(),
            Sequence(sequence),
            Timestamp::now(),
            EventBody::Progress {
                phase: ProgressPhase::Processing,
                progress: None,
            },
        );
        Ok(Arc::new(EventRecord::new(event)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_log_read_that_stalls_fails_instead_of_waiting_forever() {
        let idle = Duration::from_secs(3);
        // Two events, then nothing (a consumer recreating itself without end).
        let mut stalled: EventStream = futures_util::stream::iter([record(1), record(2)])
            .chain(futures_util::stream::pending())
            .boxed();
        let started = Instant::now();
        let read = read_through(&mut stalled, Sequence::ZERO, Sequence(5), idle).await;
        assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");
        assert_eq!(
            Instant::now() - started,
            idle,
            "after the bound, not before"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_log_read_that_keeps_coming_is_not_cut_off() {
        let idle = Duration::from_secs(3);
        // Each event 2 s after the last: 10 s in all, never 3 s without one.
        let mut slow: EventStream = futures_util::stream::iter(1..=5)
            .then(|s| async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                record(s)
            })
            .boxed();
        let read = read_through(&mut slow, Sequence(1), Sequence(4), idle)
            .await
            .unwrap();
        let sequences: Vec<u64> = read.iter().map(|r| r.sequence().get()).collect();
        assert_eq!(
            sequences,
            [2, 3, 4],
            "after the cursor, up to the last wanted"
        );
    }
}
