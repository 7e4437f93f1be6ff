//! The in-memory event store: per execution a `Vec` of shared records plus a notifier.
//!
//! Readers keep an index into the vector and pull, so a slow reader never makes the store buffer
//! anything for it, and no event is ever dropped for a reader. An evicted execution's readers
//! keep their `Arc` and finish normally.
//!
//! While a log is open each event is held as its record (the event and its JSON, shared by
//! every reader). The logs that ended last stay so, within [`MemoryLimits::recent_whole_bytes`]
//! of their JSON: their readers are the likeliest still to come (a client that asks for the
//! events of an execution that ended before its request arrived), and a whole log is read
//! without decoding it. Older ended logs keep only the JSON of their events ([`Held`]), but for
//! the terminal event itself, which live readers are about to read (it is small): a retained
//! execution then costs about the size of its events, and a read of it decodes them again, as a
//! read from NATS does.
//!
//! A [`TerminalHook`] learns of every terminal event right after it is stored (embedded mode
//! releases the execution's quota slot with it); it runs outside the store's locks and cannot
//! change what was stored. A [`StoredHook`] likewise learns of every stored event with its
//! owner (embedded mode feeds webhook deliveries with it).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::{Mutex, RwLock};
use protocol::materialize::Materializer;
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant};
use tokio::sync::Notify;

use crate::error::StoreError;
use crate::event_store::{EventRecord, EventStore, LogHead, ReadResult, SubscribeResult, WriterId};

/// Bounds of the memory store. Memory use is bounded by
/// `max_executions × max_execution_bytes` and `max_total_bytes`, whichever is smaller.
#[derive(Debug, Clone)]
pub struct MemoryLimits {
    /// Retained executions (active + terminal). Oldest terminal ones are evicted beyond this.
    pub max_executions: usize,
    /// Executions that may be non-terminal at once (admission).
    pub max_active: usize,
    /// Bytes of event JSON across all retained executions.
    pub max_total_bytes: usize,
    /// Bytes of event JSON in one execution (non-terminal events).
    pub max_execution_bytes: usize,
    /// Non-terminal events in one execution.
    pub max_events: usize,
    /// How long a terminal execution is retained.
    pub retention: Duration,
    /// Bytes of event JSON of the most recently ended logs that stay whole (see the module
    /// docs); the whole form costs about twice as much again. Older ended logs keep their
    /// JSON alone, and a log larger than this does at once.
    pub recent_whole_bytes: usize,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            max_executions: 10_000,
            max_active: 1024,
            max_total_bytes: 256 * 1024 * 1024,
            max_execution_bytes: 4 * 1024 * 1024,
            max_events: 4096,
            retention: Duration::from_secs(24 * 3600),
            recent_whole_bytes: 1024 * 1024,
        }
    }
}

/// One stored event (see the module docs).
enum Held {
    /// The log is open: the record readers share.
    Record(Arc<EventRecord>),
    /// The log is terminal: its JSON alone, decoded when read.
    Json(Bytes),
}

impl Held {
    fn json(&self) -> &Bytes {
        match self {
            Self::Record(record) => &record.json,
            Self::Json(json) => json,
        }
    }

    fn record(&self) -> Result<Arc<EventRecord>, StoreError> {
        match self {
            Self::Record(record) => Ok(Arc::clone(record)),
            Self::Json(json) => EventRecord::decode(json.clone())
                .map(Arc::new)
                .ok_or_else(|| {
                    StoreError::Misconfigured("a stored event no longer decodes".into())
                }),
        }
    }

    /// Keeps the JSON alone, in an allocation of its own size (the encoder's may be larger).
    fn compact(&mut self) {
        if let Self::Record(record) = self {
            *self = Self::Json(Bytes::copy_from_slice(&record.json));
        }
    }
}

struct EntryState {
    records: Vec<Held>,
    /// The writer of the log's last events and the index of the first of them: a retry of
    /// one of those by the same writer, unchanged, is recognised as landed (the
    /// `append_as` contract; see [`EntryState::landed`]).
    tail_writer: Option<(WriterId, usize)>,
    materializer: Materializer,
    bytes: usize,
}

struct Entry {
    owner: Tenant,
    state: Mutex<EntryState>,
    notify: Notify,
}

impl Entry {
    /// Keeps the JSON alone of an ended log's events but its terminal one: readers that
    /// follow the log live have read what came before, and the terminal event they are about
    /// to read stays whole (it is small).
    fn compact(&self) {
        let mut state = self.state.lock();
        if let Some((_, earlier)) = state.records.split_last_mut() {
            earlier.iter_mut().for_each(Held::compact);
        }
    }
}

#[derive(Default)]
struct Registry {
    /// Terminal executions in order of termination.
    terminal: VecDeque<(ExecutionId, Instant)>,
    active: usize,
    /// The ended logs still whole, in order of termination, with their bytes (an evicted one
    /// is gone already and needs no compacting).
    whole: VecDeque<(Weak<Entry>, usize)>,
    /// The sum of `whole`'s bytes.
    whole_bytes: usize,
}

impl Registry {
    /// Adds a log that just ended to the whole ones; returns those that no longer fit, oldest
    /// first, to compact once the registry is unlocked.
    fn ended_whole(&mut self, entry: &Arc<Entry>, bytes: usize, budget: usize) -> Vec<Weak<Entry>> {
        self.whole.push_back((Arc::downgrade(entry), bytes));
        self.whole_bytes += bytes;
        let mut over = Vec::new();
        while self.whole_bytes > budget {
            let Some((entry, bytes)) = self.whole.pop_front() else {
                break;
            };
            self.whole_bytes -= bytes;
            over.push(entry);
        }
        over
    }
}

/// Called with an execution's id once its terminal event is stored; must not block.
pub type TerminalHook = Arc<dyn Fn(ExecutionId) + Send + Sync>;

/// Called with every event right after it is stored, and the execution's owner (embedded
/// mode's webhook feed); must not block.
pub type StoredHook = Arc<dyn Fn(&Arc<EventRecord>, &Tenant) + Send + Sync>;

#[derive(derive_more::Debug)]
struct Inner {
    limits: MemoryLimits,
    #[debug(skip)]
    on_terminal: RwLock<Option<TerminalHook>>,
    #[debug(skip)]
    on_stored: RwLock<Option<StoredHook>>,
    #[debug(skip)]
    executions: RwLock<HashMap<ExecutionId, Arc<Entry>>>,
    #[debug(skip)]
    registry: Mutex<Registry>,
    total_bytes: AtomicUsize,
}

/// See the module docs.
#[derive(Clone, Debug)]
pub struct MemoryEventStore {
    inner: Arc<Inner>,
}

impl MemoryEventStore {
    pub fn new(limits: MemoryLimits) -> Self {
        Self {
            inner: Arc::new(Inner {
                limits,
                on_terminal: RwLock::new(None),
                on_stored: RwLock::new(None),
                executions: RwLock::new(HashMap::new()),
                registry: Mutex::new(Registry::default()),
                total_bytes: AtomicUsize::new(0),
            }),
        }
    }

    /// Sets the hook told of every terminal event stored from now on (replacing any earlier).
    pub fn on_terminal(&self, hook: TerminalHook) {
        *self.inner.on_terminal.write() = Some(hook);
    }

    /// Sets the hook told of every event stored from now on (replacing any earlier).
    pub fn on_stored(&self, hook: StoredHook) {
        *self.inner.on_stored.write() = Some(hook);
    }

    fn stored(&self, record: &Arc<EventRecord>, owner: &Tenant) {
        let hook = self.inner.on_stored.read().clone();
        if let Some(hook) = hook {
            hook(record, owner);
        }
    }

    /// Retained executions (for metrics and tests).
    pub fn retained(&self) -> usize {
        self.inner.executions.read().len()
    }

    /// Non-terminal executions (for metrics and tests).
    pub fn active(&self) -> usize {
        self.inner.registry.lock().active
    }

    fn entry(&self, id: ExecutionId) -> Option<Arc<Entry>> {
        self.inner.executions.read().get(&id).cloned()
    }

    fn remove(&self, id: ExecutionId) {
        if let Some(entry) = self.inner.executions.write().remove(&id) {
            let bytes = entry.state.lock().bytes;
            self.inner.total_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Drops expired terminal executions, then evicts the oldest terminal ones until one more
    /// execution of `incoming` bytes fits. Called with the registry locked.
    fn make_room(&self, registry: &mut Registry, incoming: usize) -> Result<(), StoreError> {
        let limits = &self.inner.limits;
        let now = Instant::now();
        while let Some(&(id, at)) = registry.terminal.front() {
            if now.duration_since(at) < limits.retention {
                break;
            }
            registry.terminal.pop_front();
            self.remove(id);
        }
        loop {
            let count = self.inner.executions.read().len();
            let bytes = self.inner.total_bytes.load(Ordering::Relaxed);
            if count < limits.max_executions && bytes + incoming <= limits.max_total_bytes {
                return Ok(());
            }
            let Some((id, _)) = registry.terminal.pop_front() else {
                return Err(StoreError::CapacityExhausted);
            };
            self.remove(id);
        }
    }
}

impl EntryState {
    /// Whether `event` is already stored, unchanged, by `writer`, with nothing of another
    /// writer after it: a retry after an unknown outcome (a test store can lose an
    /// acknowledgement) that must succeed.
    fn landed(&self, event: &RuntimeEvent, writer: WriterId) -> bool {
        let Some((tail_writer, from)) = self.tail_writer else {
            return false;
        };
        let Some(index) = usize::try_from(event.sequence.get())
            .ok()
            .and_then(|s| s.checked_sub(1))
        else {
            return false;
        };
        tail_writer == writer
            && index >= from
            && self
                .records
                .get(index)
                .is_some_and(|stored| *stored.json() == EventRecord::new(event.clone()).json)
    }
}

/// The record at `index`, waiting for it if the log is still open; `None` once the log is
/// terminal and fully read.
async fn next_record(entry: &Entry, index: usize) -> Option<Result<Arc<EventRecord>, StoreError>> {
    loop {
        // Register interest before looking, so an append between the look and the wait
        // cannot be missed.
        let notified = entry.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let state = entry.state.lock();
            if let Some(held) = state.records.get(index) {
                return Some(held.record());
            }
            if state.materializer.is_terminal() {
                return None;
            }
        }
        notified.await;
    }
}

#[async_trait]
impl EventStore for MemoryEventStore {
    async fn create_owned(&self, accepted: RuntimeEvent, owner: &Tenant) -> Result<(), StoreError> {
        // The log rules only: the records hold the output, and a snapshot is folded from them
        // when asked (`full_state`), so no output is held twice.
        let materializer = Materializer::start(&accepted)?.checking_only();
        let id = accepted.execution_id;
        let record = Arc::new(EventRecord::new(accepted));
        let bytes = record.json.len();
        let mut registry = self.inner.registry.lock();
        if self.inner.executions.read().contains_key(&id) {
            return Err(StoreError::AlreadyExists);
        }
        if registry.active >= self.inner.limits.max_active {
            return Err(StoreError::AdmissionFull);
        }
        self.make_room(&mut registry, bytes)?;
        let entry = Arc::new(Entry {
            owner: owner.clone(),
            state: Mutex::new(EntryState {
                records: vec![Held::Record(Arc::clone(&record))],
                tail_writer: None,
                materializer,
                bytes,
            }),
            notify: Notify::new(),
        });
        self.inner.executions.write().insert(id, entry);
        self.inner.total_bytes.fetch_add(bytes, Ordering::Relaxed);
        registry.active += 1;
        drop(registry);
        self.stored(&record, owner);
        Ok(())
    }

    async fn append_as(&self, event: RuntimeEvent, writer: WriterId) -> Result<(), StoreError> {
        // The log lock makes compare-and-set exact; the writer id only recognises a retry.
        let id = event.execution_id;
        let entry = self.entry(id).ok_or(StoreError::NotFound)?;
        let terminal = event.is_terminal();
        let (stored, bytes) = {
            let mut state = entry.state.lock();
            let m = &state.materializer;
            if event.sequence != m.last_sequence().next() || m.is_terminal() {
                if state.landed(&event, writer) {
                    return Ok(());
                }
                let m = &state.materializer;
                return Err(StoreError::Conflict {
                    last: m.last_sequence(),
                    terminal: m.is_terminal(),
                });
            }
            m.check(&event)?;
            let record = Arc::new(EventRecord::new(event));
            let size = record.json.len();
            let limits = &self.inner.limits;
            if !terminal
                && (state.records.len() >= limits.max_events
                    || state.bytes + size > limits.max_execution_bytes)
            {
                return Err(StoreError::ExecutionLimit);
            }
            state.materializer.apply(&record.event)?;
            if !state.tail_writer.is_some_and(|(w, _)| w == writer) {
                state.tail_writer = Some((writer, state.records.len()));
            }
            state.records.push(Held::Record(Arc::clone(&record)));
            state.bytes += size;
            self.inner.total_bytes.fetch_add(size, Ordering::Relaxed);
            (record, state.bytes)
        };
        entry.notify.notify_waiters();
        self.stored(&stored, &entry.owner);
        if terminal {
            let mut registry = self.inner.registry.lock();
            registry.active = registry.active.saturating_sub(1);
            registry.terminal.push_back((id, Instant::now()));
            let over = registry.ended_whole(&entry, bytes, self.inner.limits.recent_whole_bytes);
            drop(registry);
            over.iter()
                .filter_map(Weak::upgrade)
                .for_each(|e| e.compact());
            let hook = self.inner.on_terminal.read().clone();
            if let Some(hook) = hook {
                hook(id);
            }
        }
        Ok(())
    }

    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError> {
        self.entry(id).map(|e| full_state(&e)).transpose()
    }

    async fn owner(&self, id: ExecutionId) -> Result<Option<Tenant>, StoreError> {
        Ok(self.entry(id).map(|e| e.owner.clone()))
    }

    async fn owned_state(
        &self,
        id: ExecutionId,
    ) -> Result<Option<(Materializer, Tenant)>, StoreError> {
        self.entry(id)
            .map(|e| Ok((full_state(&e)?, e.owner.clone())))
            .transpose()
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        let Some(entry) = self.entry(id) else {
            return Ok(None);
        };
        let last = entry.state.lock().records.last().map(Held::record);
        last.transpose().map(|last| {
            last.map(|last| LogHead {
                last_sequence: last.sequence(),
                terminal: last.event.is_terminal(),
                last_time: last.event.time,
            })
        })
    }

    async fn read(&self, id: ExecutionId, after: Sequence, limit: usize) -> ReadResult {
        let Some(entry) = self.entry(id) else {
            return Ok(None);
        };
        let state = entry.state.lock();
        let start = usize::try_from(after.get())
            .unwrap_or(usize::MAX)
            .min(state.records.len());
        state.records[start..]
            .iter()
            .take(limit)
            .map(Held::record)
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    async fn subscribe(&self, id: ExecutionId, after: Sequence) -> SubscribeResult {
        let Some(entry) = self.entry(id) else {
            return Ok(None);
        };
        let start = usize::try_from(after.get()).unwrap_or(usize::MAX);
        let stream = futures_util::stream::unfold((entry, start), |(entry, index)| async move {
            let next = next_record(&entry, index).await?;
            Some((next, (entry, index + 1)))
        });
        Ok(Some(stream.fuse().boxed()))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The execution's full snapshot, folded from its records (the entry keeps the log rules
/// only, see `create_owned`).
fn full_state(entry: &Entry) -> Result<Materializer, StoreError> {
    let records = entry
        .state
        .lock()
        .records
        .iter()
        .map(Held::record)
        .collect::<Result<Vec<_>, _>>()?;
    Materializer::from_events(records.iter().map(|r| &r.event))?
        .ok_or_else(|| StoreError::Misconfigured("an execution without events".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{completed, delta, drain, event, routed};

    /// Which of the execution's events are held as JSON alone.
    fn json_alone(store: &MemoryEventStore, id: ExecutionId) -> Vec<bool> {
        let entry = store.entry(id).unwrap();
        let state = entry.state.lock();
        state
            .records
            .iter()
            .map(|h| matches!(h, Held::Json(_)))
            .collect()
    }

    /// Every record of the execution's log.
    async fn read_all(store: &MemoryEventStore, id: ExecutionId) -> Vec<Arc<EventRecord>> {
        store.read(id, Sequence::ZERO, 100).await.unwrap().unwrap()
    }

    /// An execution with two deltas, ended; returns its id and its records read while open.
    async fn ended(store: &MemoryEventStore) -> (ExecutionId, Vec<Arc<EventRecord>>) {
        let id = routed(store).await;
        for (seq, text) in [(3, "one "), (4, "two")] {
            store.append(event(id, seq, delta(text))).await.unwrap();
        }
        let open = read_all(store, id).await;
        store.append(event(id, 5, completed())).await.unwrap();
        (id, open)
    }

    /// A terminal log keeps the JSON alone of each event but its terminal one, and reads,
    /// subscriptions, the head and the snapshot see exactly what they saw while it was open.
    #[tokio::test]
    async fn a_terminal_log_keeps_its_json_alone_and_reads_back_the_same() {
        let store = MemoryEventStore::new(MemoryLimits {
            recent_whole_bytes: 0,
            ..MemoryLimits::default()
        });
        let (id, open) = ended(&store).await;
        assert_eq!(
            json_alone(&store, id),
            [true, true, true, true, false],
            "a terminal log holds only JSON but for its terminal event"
        );
        let closed = read_all(&store, id).await;
        assert_eq!(closed.len(), 5);
        assert_eq!(
            closed[..4].iter().map(|r| &**r).collect::<Vec<_>>(),
            open.iter().map(|r| &**r).collect::<Vec<_>>()
        );
        let subscribed = drain(store.subscribe(id, Sequence::ZERO).await.unwrap().unwrap()).await;
        assert_eq!(subscribed, closed);
        let head = store.head(id).await.unwrap().unwrap();
        assert!(head.terminal);
        assert_eq!(head.last_sequence.get(), 5);
        let snapshot = store.state(id).await.unwrap().unwrap();
        assert!(snapshot.is_terminal());
        let result = serde_json::to_value(snapshot.result_response().unwrap()).unwrap();
        assert!(result.to_string().contains("one two"), "{result}");
    }

    /// The logs that ended last stay whole within their budget, oldest compacted first, and
    /// an evicted one is skipped; what a read returns never changes.
    #[tokio::test]
    async fn the_logs_that_ended_last_stay_whole_within_their_budget() {
        let probe = MemoryEventStore::new(MemoryLimits::default());
        let (probe_id, _) = ended(&probe).await;
        let one_log = probe.entry(probe_id).unwrap().state.lock().bytes;
        let store = MemoryEventStore::new(MemoryLimits {
            recent_whole_bytes: 2 * one_log + one_log / 2,
            ..MemoryLimits::default()
        });

        let (first, first_open) = ended(&store).await;
        let (second, _) = ended(&store).await;
        let whole = [false; 5];
        assert_eq!(json_alone(&store, first), whole, "two logs fit the budget");
        assert_eq!(json_alone(&store, second), whole);
        let first_whole = read_all(&store, first).await;
        assert!(
            first_whole[..4]
                .iter()
                .zip(&first_open)
                .all(|(a, b)| Arc::ptr_eq(a, b)),
            "a whole log is read as the records its readers share"
        );

        let (third, _) = ended(&store).await;
        assert_eq!(
            json_alone(&store, first),
            [true, true, true, true, false],
            "the oldest log no longer fits"
        );
        assert_eq!(json_alone(&store, second), whole);
        assert_eq!(json_alone(&store, third), whole);
        let first_closed = read_all(&store, first).await;
        assert_eq!(
            first_closed.iter().map(|r| &**r).collect::<Vec<_>>(),
            first_whole.iter().map(|r| &**r).collect::<Vec<_>>()
        );

        store.remove(second);
        let (fourth, _) = ended(&store).await;
        assert!(store.entry(second).is_none());
        assert_eq!(
            json_alone(&store, third),
            whole,
            "the evicted log left the budget first"
        );
        assert_eq!(json_alone(&store, fourth), whole);
        let (fifth, _) = ended(&store).await;
        assert!(
            json_alone(&store, third)[0],
            "the oldest whole log no longer fits"
        );
        assert_eq!(json_alone(&store, fourth), whole);
        assert_eq!(json_alone(&store, fifth), whole);

        let big = MemoryEventStore::new(MemoryLimits {
            recent_whole_bytes: one_log - 1,
            ..MemoryLimits::default()
        });
        let (alone, _) = ended(&big).await;
        assert_eq!(
            json_alone(&big, alone)[..4],
            [true; 4],
            "a log above the budget"
        );
    }
}
