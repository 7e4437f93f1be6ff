//! Unit tests of the writer: sequences and times, the pipeline, pacing, failures.

use super::*;
use crate::contract::{delta, output_usage};
use crate::event_store::RunError;
use crate::memory::{MemoryEventStore, MemoryLimits};
use futures_util::FutureExt;
use tokio::sync::Semaphore;

/// A memory store whose run appends wait for a permit of `gate` each (when gated), and
/// which records the length of every run it stores.
struct GatedStore {
    inner: MemoryEventStore,
    gate: Option<Arc<Semaphore>>,
    entered: Notify,
    runs: parking_lot::Mutex<Vec<usize>>,
    /// How long each run takes to be acknowledged (once through the gate).
    delay: Duration,
}

impl GatedStore {
    fn new(limits: MemoryLimits, gate: Option<Arc<Semaphore>>) -> Arc<Self> {
        Self::with(limits, gate, Duration::ZERO)
    }

    /// An ungated store whose every run takes `delay` to be acknowledged.
    fn slow(delay: Duration) -> Arc<Self> {
        Self::with(MemoryLimits::default(), None, delay)
    }

    fn with(limits: MemoryLimits, gate: Option<Arc<Semaphore>>, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryEventStore::new(limits),
            gate,
            entered: Notify::new(),
            runs: parking_lot::Mutex::new(Vec::new()),
            delay,
        })
    }
}

#[async_trait::async_trait]
impl crate::intercept::Intercept for GatedStore {
    fn inner(&self) -> &dyn EventStore {
        &self.inner
    }
    async fn append_run_as(&self, run: &[EventRecord], writer: WriterId) -> Result<(), RunError> {
        self.entered.notify_one();
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.runs.lock().push(run.len());
        self.inner.append_run_as(run, writer).await
    }
    fn pipelines_appends(&self) -> bool {
        true
    }
    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

async fn pipelined_writer(store: &Arc<GatedStore>) -> (ExecutionId, EventWriter) {
    let id = ExecutionId::new_random();
    let store: Arc<dyn EventStore> = Arc::clone(store) as Arc<dyn EventStore>;
    let writer = EventWriter::create(store, id, Timestamp::now(), &Tenant::default())
        .await
        .unwrap()
        .pipelined();
    assert!(writer.is_pipelined());
    (id, writer)
}

/// A pipelined writer over a store gated shut, whose first run (the one event `first`)
/// is in flight, waiting at the gate.
async fn held_at_the_gate(
    first: &str,
) -> (Arc<Semaphore>, Arc<GatedStore>, ExecutionId, EventWriter) {
    let gate = Arc::new(Semaphore::new(0));
    let store = GatedStore::new(MemoryLimits::default(), Some(Arc::clone(&gate)));
    let (id, mut writer) = pipelined_writer(&store).await;
    writer.submit(delta(first)).await.unwrap();
    store.entered.notified().await;
    (gate, store, id, writer)
}

#[tokio::test]
async fn events_handed_in_during_an_append_go_in_the_next_one_as_one_run() {
    // The appender takes the first event at once (nothing in flight: no waiting for more).
    let (gate, store, id, mut writer) = held_at_the_gate("a").await;
    for text in ["b", "c", "d"] {
        writer.submit(delta(text)).await.unwrap();
    }
    assert_eq!(
        writer.last_sequence(),
        Sequence(5),
        "sequences are assigned at once"
    );
    gate.add_permits(2);
    writer.flush().await.unwrap();
    assert_eq!(*store.runs.lock(), [1, 3]);
    let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
    let texts: Vec<_> = events
        .iter()
        .skip(1)
        .map(|r| match &r.event.body {
            EventBody::OutputDelta { delta, .. } => delta.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(texts, ["a", "b", "c", "d"]);
}

#[tokio::test]
async fn runs_are_bounded_and_a_full_queue_holds_the_caller_back() {
    let (gate, store, _, mut writer) = held_at_the_gate("first").await;
    for i in 0..QUEUE_MAX_EVENTS {
        writer.submit(delta(&i.to_string())).await.unwrap();
    }
    // The queue is full: the next submission waits for room.
    let mut blocked = Box::pin(writer.submit(delta("blocked")));
    for _ in 0..10 {
        tokio::task::yield_now().await;
        assert!(
            (&mut blocked).now_or_never().is_none(),
            "the queue is bounded"
        );
    }
    gate.add_permits(usize::MAX >> 4);
    blocked.await.unwrap();
    writer.flush().await.unwrap();
    let runs = store.runs.lock().clone();
    assert_eq!(runs.iter().sum::<usize>(), QUEUE_MAX_EVENTS + 2);
    assert!(runs.iter().all(|&n| n <= RUN_MAX_EVENTS), "{runs:?}");
    assert_eq!(runs[1], RUN_MAX_EVENTS, "{runs:?}");
}

#[tokio::test]
async fn a_failed_pipeline_is_sticky_until_recovered_from_the_stored_head() {
    let limits = MemoryLimits {
        max_events: 3,
        ..MemoryLimits::default()
    };
    let store = GatedStore::new(limits, None);
    let (id, mut writer) = pipelined_writer(&store).await;
    let failure = writer.failure();
    for text in ["a", "b", "c", "d"] {
        // Errors surface on a later submission at the earliest, never lose an event silently.
        if writer.submit(delta(text)).await.is_err() {
            break;
        }
    }
    assert!(matches!(writer.flush().await, Err(WriteError::Limit)));
    assert!(matches!(failure.failed().await, WriteError::Limit));
    assert!(
        matches!(writer.submit(delta("e")).await, Err(WriteError::Limit)),
        "sticky"
    );
    assert!(matches!(writer.recover(), Some(WriteError::Limit)));
    assert_eq!(writer.last_sequence(), Sequence(3), "the last stored event");
    assert!(writer.recover().is_none());
    writer
        .append(EventBody::Failed {
            error: protocol::RuntimeError::internal(),
        })
        .await
        .unwrap();
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!((head.last_sequence, head.terminal), (Sequence(4), true));
}

#[tokio::test]
async fn a_fenced_pipeline_reports_it_to_a_waiting_caller() {
    let store = GatedStore::new(MemoryLimits::default(), None);
    let (id, mut writer) = pipelined_writer(&store).await;
    let failure = writer.failure();
    // Another writer takes sequence 2 first.
    let mut other = EventWriter::resume(
        Arc::clone(&store) as Arc<dyn EventStore>,
        id,
        Sequence(1),
        Timestamp::now(),
    );
    other.append(delta("other")).await.unwrap();
    writer.submit(delta("mine")).await.unwrap();
    assert!(matches!(failure.failed().await, WriteError::Fenced));
    assert!(matches!(writer.flush().await, Err(WriteError::Fenced)));
}

/// A pipelined writer paced by 40 ms whose log already holds a stored non-output event
/// (as after routing), over a store that records its runs (its tests pause time).
async fn paced_writer() -> (Arc<GatedStore>, ExecutionId, EventWriter) {
    writer_paced_by(Pace::Fixed(Duration::from_millis(40))).await
}

/// Yields until the stored log ends at `sequence` (time does not move meanwhile: this task
/// stays runnable, so a paused clock is not advanced).
async fn stored_up_to(store: &GatedStore, id: ExecutionId, sequence: u64) {
    for _ in 0..1000 {
        if store.head(id).await.unwrap().unwrap().last_sequence == Sequence(sequence) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the log never reached sequence {sequence}");
}

#[tokio::test(start_paused = true)]
async fn paced_output_leaves_at_most_once_per_pace_in_one_run() {
    let (store, id, mut writer) = paced_writer().await;
    // The first output after routing is not held.
    writer.submit(delta("a")).await.unwrap();
    stored_up_to(&store, id, 3).await;
    for text in ["b", "c", "d"] {
        writer.submit(delta(text)).await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(39)).await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!(head.last_sequence, Sequence(3), "held for the pace");
    tokio::time::advance(Duration::from_millis(1)).await;
    stored_up_to(&store, id, 6).await;
    assert_eq!(*store.runs.lock(), [1, 1, 3], "one run per pace");
    let texts: Vec<_> = store
        .read(id, Sequence(2), 10)
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|r| match &r.event.body {
            EventBody::OutputDelta { delta, .. } => delta.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(texts, ["a", "b", "c", "d"]);
}

#[tokio::test(start_paused = true)]
async fn a_terminal_event_or_a_waiting_caller_is_never_held_by_the_pace() {
    let (store, id, mut writer) = paced_writer().await;
    writer.submit(delta("a")).await.unwrap();
    stored_up_to(&store, id, 3).await;
    let start = tokio::time::Instant::now();
    // A caller waiting for durability: a held appender would let the paused clock jump.
    writer.submit(delta("b")).await.unwrap();
    writer.flush().await.unwrap();
    assert_eq!(
        store.head(id).await.unwrap().unwrap().last_sequence,
        Sequence(4)
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "a flush is not paced");
    // A terminal event queued behind output sends it all at once, without a flush.
    writer.submit(delta("c")).await.unwrap();
    writer
        .submit(EventBody::Failed {
            error: protocol::RuntimeError::internal(),
        })
        .await
        .unwrap();
    stored_up_to(&store, id, 6).await;
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a terminal event is not paced"
    );
    assert_eq!(*store.runs.lock(), [1, 1, 1, 2]);
}

/// A pipelined writer with `pace` whose log already holds a stored non-output event (as
/// after routing), over a store that records its runs.
async fn writer_paced_by(pace: Pace) -> (Arc<GatedStore>, ExecutionId, EventWriter) {
    let store = GatedStore::new(MemoryLimits::default(), None);
    let id = ExecutionId::new_random();
    let dyn_store: Arc<dyn EventStore> = Arc::clone(&store) as Arc<dyn EventStore>;
    let mut writer = EventWriter::create(dyn_store, id, Timestamp::now(), &Tenant::default())
        .await
        .unwrap()
        .paced(pace)
        .pipelined();
    writer.append(progress()).await.unwrap();
    (store, id, writer)
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_pace_holds_output_only_while_its_store_is_slow() {
    let pressure = Arc::new(crate::pace::AppendPressure::default());
    let settle = |took: Duration| {
        for _ in 0..400 {
            pressure.observe(took);
        }
    };
    settle(Duration::from_millis(1));
    let (store, id, mut writer) = writer_paced_by(Pace::Adaptive(Arc::clone(&pressure))).await;
    let start = tokio::time::Instant::now();
    for (i, text) in ["a", "b", "c"].into_iter().enumerate() {
        writer.submit(delta(text)).await.unwrap();
        stored_up_to(&store, id, 3 + i as u64).await;
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a store that keeps up holds nothing"
    );
    // The store turns slow (the writers sharing the pressure saw 3 ms acknowledgements):
    // output after the next run waits forty times the 2 ms over the threshold.
    settle(Duration::from_millis(3));
    let hold = pressure.hold();
    assert!(hold > Duration::from_millis(79) && hold <= Duration::from_millis(80));
    writer.submit(delta("d")).await.unwrap();
    stored_up_to(&store, id, 6).await;
    writer.submit(delta("e")).await.unwrap();
    writer.submit(delta("f")).await.unwrap();
    tokio::time::advance(hold - Duration::from_millis(1)).await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!(
        head.last_sequence,
        Sequence(6),
        "held while the store is slow"
    );
    // (Tokio's timers fire on whole milliseconds.)
    tokio::time::advance(Duration::from_millis(2)).await;
    stored_up_to(&store, id, 8).await;
    assert_eq!(
        *store.runs.lock(),
        [1, 1, 1, 1, 1, 2],
        "routing, a to d alone, e and f"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pipelined_writer_reports_how_long_its_appends_take_to_its_pace() {
    let store: Arc<dyn EventStore> = GatedStore::slow(Duration::from_millis(25));
    let pace = Pace::adaptive();
    let id = ExecutionId::new_random();
    let mut writer = EventWriter::create(store, id, Timestamp::now(), &Tenant::default())
        .await
        .unwrap()
        .paced(pace.clone())
        .pipelined();
    assert_eq!(pace.hold(), Duration::ZERO);
    for _ in 0..60 {
        writer.append(progress()).await.unwrap();
    }
    let Pace::Adaptive(pressure) = &pace else {
        unreachable!()
    };
    let average = pressure.average();
    assert!(
        average > Duration::from_millis(20) && average <= Duration::from_millis(25),
        "{average:?}"
    );
    // Every acknowledgement took 25 ms: that is this store's round trip, not a queue.
    assert_eq!(pressure.threshold(), Duration::from_millis(100));
    assert_eq!(pace.hold(), Duration::ZERO);
}

fn store() -> Arc<dyn EventStore> {
    Arc::new(MemoryEventStore::new(MemoryLimits::default()))
}

/// A memory store out of reach (every operation `Unavailable`, like a stream without a
/// leader) from when `outage` is called until the given time.
struct OutageStore {
    inner: MemoryEventStore,
    until: parking_lot::Mutex<Option<tokio::time::Instant>>,
    pipelined: bool,
}

impl OutageStore {
    fn new(pipelined: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryEventStore::new(MemoryLimits::default()),
            until: parking_lot::Mutex::new(None),
            pipelined,
        })
    }

    fn outage(&self, until: tokio::time::Instant) {
        *self.until.lock() = Some(until);
    }
}

#[async_trait::async_trait]
impl crate::intercept::Intercept for OutageStore {
    fn inner(&self) -> &dyn EventStore {
        &self.inner
    }
    fn available(&self) -> Result<(), StoreError> {
        match *self.until.lock() {
            Some(until) if tokio::time::Instant::now() < until => {
                Err(StoreError::Unavailable("no responders".into()))
            }
            _ => Ok(()),
        }
    }
    fn pipelines_appends(&self) -> bool {
        self.pipelined
    }
}

/// A writer (inline or pipelined) whose store goes out of reach for `outage` right after
/// the log was created; what its next append returned and how long it took.
async fn append_through_an_outage(
    pipelined: bool,
    outage: Duration,
) -> (Result<(), WriteError>, Duration) {
    let store = OutageStore::new(pipelined);
    let dyn_store: Arc<dyn EventStore> = Arc::clone(&store) as Arc<dyn EventStore>;
    let id = ExecutionId::new_random();
    let mut writer = EventWriter::create(dyn_store, id, Timestamp::now(), &Tenant::default())
        .await
        .unwrap();
    if pipelined {
        writer = writer.pipelined();
    }
    let start = tokio::time::Instant::now();
    store.outage(start + outage);
    let result = writer.append(progress()).await;
    (result, start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn an_append_resumes_within_a_second_of_an_outage_ending() {
    // An outage as long as a slow JetStream leader election: the append lands within a
    // second of its end (pauses capped at 1 s), inline and pipelined alike.
    for pipelined in [false, true] {
        let outage = Duration::from_millis(7_300);
        let (result, took) = append_through_an_outage(pipelined, outage).await;
        assert!(result.is_ok(), "pipelined {pipelined}: {result:?}");
        assert!(
            took >= outage && took <= outage + Duration::from_secs(1),
            "pipelined {pipelined}: appended {took:?} after an outage of {outage:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_append_gives_up_once_the_retry_budget_is_spent() {
    for pipelined in [false, true] {
        let (result, took) = append_through_an_outage(pipelined, Duration::from_secs(60)).await;
        assert!(
            matches!(result, Err(WriteError::Store(StoreError::Unavailable(_)))),
            "pipelined {pipelined}: {result:?}"
        );
        assert!(
            took >= Duration::from_secs(24) && took <= Duration::from_secs(25),
            "pipelined {pipelined}: gave up after {took:?}"
        );
    }
}

/// A memory store behind a cut link, as a worker partitioned from JetStream sees it: while
/// cut, a run is not stored and its append fails `Unavailable` after a while (a publish
/// whose acknowledgement timed out), but the last such run is still on its way; `heal`
/// stores it (late, after the writer gave up, as JetStream did once the partition healed)
/// and lets appends through again.
struct LateStore {
    inner: MemoryEventStore,
    cut: parking_lot::Mutex<bool>,
    in_flight: parking_lot::Mutex<Option<(Vec<EventRecord>, WriterId)>>,
}

impl LateStore {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryEventStore::new(MemoryLimits::default()),
            cut: parking_lot::Mutex::new(false),
            in_flight: parking_lot::Mutex::new(None),
        })
    }

    fn cut(&self) {
        *self.cut.lock() = true;
    }

    /// Ends the cut; the run last sent meanwhile lands now (when `lands`).
    async fn heal(&self, lands: bool) {
        *self.cut.lock() = false;
        let in_flight = self.in_flight.lock().take();
        if let Some((run, writer)) = in_flight
            && lands
        {
            self.inner.append_run_as(&run, writer).await.unwrap();
        }
    }
}

#[async_trait::async_trait]
impl crate::intercept::Intercept for LateStore {
    fn inner(&self) -> &dyn EventStore {
        &self.inner
    }
    async fn append_run_as(&self, run: &[EventRecord], writer: WriterId) -> Result<(), RunError> {
        if *self.cut.lock() {
            *self.in_flight.lock() = Some((run.to_vec(), writer));
            tokio::time::sleep(Duration::from_secs(5)).await;
            return Err(RunError {
                stored: 0,
                error: StoreError::Unavailable("publish ack: timed out".into()),
            });
        }
        self.inner.append_run_as(run, writer).await
    }
    fn pipelines_appends(&self) -> bool {
        true
    }
}

/// A pipelined writer whose log holds `accepted` and a delta; the link is then cut and
/// `bodies` are submitted: the pipeline fails once the retry budget is spent. The link
/// heals (the run in flight landing late when `lands`) and the writer recovers.
async fn cut_off_while_writing(
    bodies: Vec<EventBody>,
    lands: bool,
) -> (Arc<LateStore>, ExecutionId, EventWriter) {
    let store = LateStore::new();
    let id = ExecutionId::new_random();
    let dyn_store: Arc<dyn EventStore> = Arc::clone(&store) as Arc<dyn EventStore>;
    let mut writer = EventWriter::create(dyn_store, id, Timestamp::now(), &Tenant::default())
        .await
        .unwrap()
        .pipelined();
    writer.append(delta("stored")).await.unwrap();
    store.cut();
    for body in bodies {
        writer.submit(body).await.unwrap();
    }
    let failed = writer.flush().await;
    assert!(
        matches!(failed, Err(WriteError::Store(StoreError::Unavailable(_)))),
        "{failed:?}"
    );
    store.heal(lands).await;
    assert!(writer.recover().is_some());
    assert_eq!(
        writer.last_sequence(),
        Sequence(2),
        "the last acknowledged event"
    );
    (store, id, writer)
}

fn types(events: &[Arc<EventRecord>]) -> Vec<&'static str> {
    events.iter().map(|r| r.event.type_name()).collect()
}

fn internal_failure() -> EventBody {
    EventBody::Failed {
        error: protocol::RuntimeError::internal(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_that_lands_after_the_writer_gave_up_is_recognised_as_its_own() {
    // The stuck executions: `usage.reported` landed 0.9 s after the worker gave
    // up; its terminal append then met its own write, was taken for fenced, and the log
    // stayed open until the deadline.
    let usage = output_usage(3.0);
    for lands in [true, false] {
        let (store, id, mut writer) =
            cut_off_while_writing(vec![delta("late"), usage.clone()], lands).await;
        // The log is closed after what may have landed, whether it had or not.
        writer.append(internal_failure()).await.unwrap();
        let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
        assert_eq!(
            types(&events),
            [
                "execution.accepted",
                "output.delta",
                "output.delta",
                "usage.reported",
                "execution.failed"
            ],
            "landed late: {lands}"
        );
        let sequences: Vec<u64> = events.iter().map(|r| r.sequence().get()).collect();
        assert_eq!(sequences, [1, 2, 3, 4, 5]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_terminal_event_that_landed_late_closes_the_log_for_its_writer() {
    let completed = EventBody::Completed {
        target: crate::contract::target(),
    };
    let (store, id, mut writer) = cut_off_while_writing(vec![delta("late"), completed], true).await;
    writer.settle().await.unwrap();
    assert!(writer.closed(), "its own terminal event is stored");
    assert!(matches!(
        writer.append(internal_failure()).await,
        Err(WriteError::Closed)
    ));
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!((head.last_sequence, head.terminal), (Sequence(4), true));
}

#[tokio::test(start_paused = true)]
async fn another_writer_after_the_last_acknowledged_event_still_fences() {
    let (store, id, mut writer) = cut_off_while_writing(vec![delta("late")], false).await;
    // A deadline sweeper closed the log meanwhile.
    let mut other = EventWriter::resume(
        Arc::clone(&store) as Arc<dyn EventStore>,
        id,
        Sequence(2),
        Timestamp::now(),
    );
    other.append(internal_failure()).await.unwrap();
    assert!(matches!(
        writer.append(internal_failure()).await,
        Err(WriteError::Fenced)
    ));
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!((head.last_sequence, head.terminal), (Sequence(3), true));
}

fn progress() -> EventBody {
    EventBody::Progress {
        phase: protocol::event::ProgressPhase::Processing,
        progress: None,
    }
}

#[tokio::test]
async fn create_writes_accepted_as_sequence_one_at_the_acceptance_time() {
    let store = store();
    let id = ExecutionId::new_random();
    let accepted_at = Timestamp::from_unix_millis(1_767_225_600_000);
    let writer = EventWriter::create(Arc::clone(&store), id, accepted_at, &Tenant::default())
        .await
        .unwrap();
    assert_eq!(writer.last_sequence(), Sequence(1));
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!(head.last_sequence, Sequence(1));
    assert_eq!(head.last_time, accepted_at);
    let again = EventWriter::create(store, id, accepted_at, &Tenant::default()).await;
    assert!(matches!(again, Err(StoreError::AlreadyExists)), "{again:?}");
}

#[tokio::test]
async fn appends_take_the_next_sequence_and_never_go_back_in_time() {
    let store = store();
    let id = ExecutionId::new_random();
    // An acceptance time in the future: later events must not be earlier than it.
    let future = Timestamp::from_unix_millis(Timestamp::now().unix_millis() + 3_600_000);
    let mut writer = EventWriter::create(Arc::clone(&store), id, future, &Tenant::default())
        .await
        .unwrap();
    writer.append(progress()).await.unwrap();
    writer.append_once(progress()).await.unwrap();
    assert_eq!(writer.last_sequence(), Sequence(3));
    let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
    let sequences: Vec<u64> = events.iter().map(|e| e.sequence().get()).collect();
    assert_eq!(sequences, [1, 2, 3]);
    assert!(events.iter().all(|e| e.event.time == future));
}

#[tokio::test]
async fn a_writer_that_lost_the_race_is_fenced() {
    let store = store();
    let id = ExecutionId::new_random();
    let accepted_at = Timestamp::now();
    let mut first = EventWriter::create(Arc::clone(&store), id, accepted_at, &Tenant::default())
        .await
        .unwrap();
    let mut second = EventWriter::resume(Arc::clone(&store), id, Sequence(1), accepted_at);
    first.append(progress()).await.unwrap();
    let once = second.append_once(progress()).await;
    assert!(
        matches!(
            once,
            Err(StoreError::Conflict {
                terminal: false,
                ..
            })
        ),
        "{once:?}"
    );
    assert!(matches!(
        second.append(progress()).await,
        Err(WriteError::Fenced)
    ));
    assert_eq!(second.last_sequence(), Sequence(1), "nothing was written");
}
