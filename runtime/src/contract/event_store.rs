//! The event store's contract ([`EventStore`]), and the builders backend tests stage logs with.

use std::sync::Arc;

use futures_util::StreamExt;
use protocol::event::{EventBody, Target};
use protocol::{
    ExecutionId, ExecutionStatus, RuntimeError, RuntimeEvent, Sequence, Tenant, Timestamp,
};

use super::{PROMPT, spawn_each};
use crate::error::StoreError;
use crate::event_store::EventStore;

/// Event `seq` of execution `id`, stamped now. The builders below are public so backend tests
/// can stage logs like the suites do.
pub fn event(id: ExecutionId, seq: u64, body: EventBody) -> RuntimeEvent {
    RuntimeEvent::new(id, Sequence(seq), Timestamp::now(), body)
}

/// The target the staged events name.
pub fn target() -> Target {
    Target {
        provider: "provider-mock".into(),
        model: "model-alpha".into(),
    }
}

/// An `output.delta` of output 0.
pub fn delta(text: &str) -> EventBody {
    EventBody::OutputDelta {
        output_index: 0,
        delta: text.into(),
    }
}

/// The first `route.selected`, of [`target`].
pub fn route_selected() -> EventBody {
    EventBody::RouteSelected {
        target: target(),
        attempt: 1,
    }
}

/// A `usage.reported` of `tokens` output tokens the runtime counted.
pub fn output_usage(tokens: f64) -> EventBody {
    EventBody::UsageReported {
        facts: vec![
            protocol::UsageFact::new(
                protocol::UsageUnit::output_token(),
                tokens,
                protocol::UsageSource::Runtime,
            )
            .expect("a finite, non-negative token count"),
        ],
    }
}

/// The `completed` event of [`target`].
pub fn completed() -> EventBody {
    EventBody::Completed { target: target() }
}

/// A new execution whose log holds `accepted` (1).
pub async fn accepted(store: &dyn EventStore) -> ExecutionId {
    let id = ExecutionId::new_random();
    store
        .create(event(id, 1, EventBody::Accepted))
        .await
        .unwrap();
    id
}

/// A new execution whose log holds `accepted` (1) and `route_selected` (2).
pub async fn routed(store: &dyn EventStore) -> ExecutionId {
    let id = accepted(store).await;
    store.append(event(id, 2, route_selected())).await.unwrap();
    id
}

/// Runs every event-store check.
pub async fn event_store_suite(store: Arc<dyn EventStore>) {
    create_and_append_in_order(&*store).await;
    compare_and_set_fences_writers(Arc::clone(&store)).await;
    subscription_replays_then_follows_then_ends(Arc::clone(&store)).await;
    readers_see_only_stored_events(Arc::clone(&store)).await;
    cursors_at_or_past_terminal_are_empty(&*store).await;
    a_cursor_past_an_open_log_ends_when_the_log_closes(&*store).await;
    unknown_executions_are_none(&*store).await;
    rule_violations_change_nothing(&*store).await;
    runs_read_like_events_appended_one_by_one(Arc::clone(&store)).await;
    runs_are_fenced_like_events(Arc::clone(&store)).await;
    bad_runs_change_nothing(&*store).await;
    executions_belong_to_their_creator(&*store).await;
    logs_created_closed_read_closed(&*store).await;
    a_retry_of_a_landed_write_is_recognised_only_for_its_writer(&*store).await;
    heads_answer_like_head(&*store).await;
}

/// `heads` answers for many logs at once exactly as `head` does for each, in the order asked:
/// open, closed and unknown logs, one asked twice, and more than one request's worth per
/// shard of a sharded store; `latest_head` answers as `head` where nothing lags.
async fn heads_answer_like_head(store: &dyn EventStore) {
    let open = routed(store).await;
    let closed = accepted(store).await;
    store.append(event(closed, 2, completed())).await.unwrap();
    let unknown = ExecutionId::new_random();
    let mut ids = vec![open, closed, unknown, open];
    for _ in 0..800 {
        ids.push(accepted(store).await);
    }
    let heads = store.heads(&ids).await.unwrap();
    assert_eq!(heads.len(), ids.len());
    let summary = |h: &Option<crate::LogHead>| h.map(|h| (h.last_sequence.get(), h.terminal));
    assert_eq!(summary(&heads[0]), Some((2, false)));
    assert_eq!(summary(&heads[1]), Some((2, true)));
    assert_eq!(heads[2], None);
    assert_eq!(heads[3], heads[0]);
    for (id, head) in ids.iter().zip(&heads) {
        assert_eq!(*head, store.head(*id).await.unwrap(), "{id}");
    }
    for id in [open, closed, unknown] {
        assert_eq!(
            store.latest_head(id).await.unwrap(),
            store.head(id).await.unwrap(),
            "{id}"
        );
    }
    assert!(store.heads(&[]).await.unwrap().is_empty());
}

/// A writer's retry of a run (or event) that landed although its outcome looked unknown
/// succeeds and changes nothing, also when the run closed the log; the same sequences from
/// another writer, or other events under the same writer, are a `Conflict`.
async fn a_retry_of_a_landed_write_is_recognised_only_for_its_writer(store: &dyn EventStore) {
    for closing in [false, true] {
        let id = routed(store).await;
        let writer = crate::WriterId::random();
        let last = if closing { completed() } else { delta("b") };
        let run = records(vec![event(id, 3, delta("a")), event(id, 4, last)]);
        store.append_run_as(&run, writer).await.unwrap();
        store.append_run_as(&run, writer).await.unwrap();
        let other = store
            .append_run_as(&run, crate::WriterId::random())
            .await
            .unwrap_err();
        assert!(
            matches!(other.error, StoreError::Conflict { .. }),
            "{other:?}"
        );
        let changed = records(vec![event(id, 3, delta("a")), event(id, 4, delta("c"))]);
        let changed = store.append_run_as(&changed, writer).await.unwrap_err();
        assert!(
            matches!(changed.error, StoreError::Conflict { .. }),
            "{changed:?}"
        );
        let events = store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
        assert_eq!(sequences(&events), [1, 2, 3, 4], "closing: {closing}");
        assert_eq!(events[3].json, run[1].json);
        // One event alone, the same way.
        if !closing {
            let single = event(id, 5, delta("d"));
            store.append_as(single.clone(), writer).await.unwrap();
            store.append_as(single.clone(), writer).await.unwrap();
            let other = store.append_as(single, crate::WriterId::random()).await;
            assert!(
                matches!(other, Err(StoreError::Conflict { .. })),
                "{other:?}"
            );
        }
    }
}

/// Runs and the per-execution limit, for a store built to hold 5 non-terminal events per
/// execution: a run crossing the limit stores what fits and stops with `ExecutionLimit`, and a
/// terminal event is still admitted, alone or at the end of a run.
pub async fn run_limit_suite(store: Arc<dyn EventStore>) {
    let id = routed(store.as_ref()).await;
    let writer = crate::WriterId::random();
    let run = records((3..=7).map(|s| event(id, s, delta("x"))).collect());
    let stopped = store.append_run_as(&run, writer).await.unwrap_err();
    assert!(
        matches!(stopped.error, StoreError::ExecutionLimit),
        "{stopped:?}"
    );
    assert_eq!(stopped.stored, 3, "the events within the limit are stored");
    assert_eq!(
        store.head(id).await.unwrap().unwrap().last_sequence,
        Sequence(5)
    );
    let closing = records(vec![event(id, 6, delta("y")), event(id, 7, completed())]);
    let stopped = store.append_run_as(&closing, writer).await.unwrap_err();
    assert!(matches!(stopped.error, StoreError::ExecutionLimit));
    assert_eq!(stopped.stored, 0);
    let terminal = records(vec![event(
        id,
        6,
        EventBody::Failed {
            error: RuntimeError::internal(),
        },
    )]);
    store.append_run_as(&terminal, writer).await.unwrap();
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!((head.last_sequence, head.terminal), (Sequence(6), true));
    // A run of non-terminal events that ends in the terminal event, all within the limit.
    let id = routed(store.as_ref()).await;
    let run = records(vec![
        event(id, 3, delta("a")),
        event(id, 4, delta("b")),
        event(id, 5, completed()),
    ]);
    store.append_run_as(&run, writer).await.unwrap();
    assert!(store.head(id).await.unwrap().unwrap().terminal);
}

/// `events` as records, the form runs are appended in.
pub fn records(events: Vec<RuntimeEvent>) -> Vec<crate::EventRecord> {
    events.into_iter().map(crate::EventRecord::new).collect()
}

fn sequences(records: &[Arc<crate::EventRecord>]) -> Vec<u64> {
    records.iter().map(|r| r.sequence().get()).collect()
}

/// Up to `limit` events of the known execution `id` after sequence `after`.
pub async fn read(
    store: &dyn EventStore,
    id: ExecutionId,
    after: u64,
    limit: usize,
) -> Vec<Arc<crate::EventRecord>> {
    store
        .read(id, Sequence(after), limit)
        .await
        .unwrap()
        .unwrap()
}

/// Everything a subscription yields until it ends.
pub async fn drain(mut stream: crate::EventStream) -> Vec<Arc<crate::EventRecord>> {
    let mut out = Vec::new();
    while let Some(item) = tokio::time::timeout(PROMPT, stream.next()).await.unwrap() {
        out.push(item.unwrap());
    }
    out
}

/// Writer `w` of a race: appends sequences 3 to `last` of `id` (`completed` at `last`, deltas
/// before it) as one writer, yielding after each, and shrugs off losing a sequence
/// (`Conflict`); any other error panics.
pub async fn race_to(store: &dyn EventStore, id: ExecutionId, w: usize, last: u64) {
    let writer = crate::event_store::WriterId::random();
    for seq in 3..=last {
        let body = if seq == last {
            completed()
        } else {
            delta(&format!("writer {w} at {seq}"))
        };
        match store.append_as(event(id, seq, body), writer).await {
            Ok(()) | Err(StoreError::Conflict { .. }) => {}
            Err(e) => panic!("unexpected error {e:?}"),
        }
        tokio::task::yield_now().await;
    }
}

/// A run appended in one go reads, replays, follows live and materializes exactly like the
/// same events appended one by one, and cursors may fall inside a run.
async fn runs_read_like_events_appended_one_by_one(store: Arc<dyn EventStore>) {
    let id = routed(store.as_ref()).await;
    let writer = crate::WriterId::random();
    let live_from_zero = store.subscribe(id, Sequence(0)).await.unwrap().unwrap();
    let live_inside = store.subscribe(id, Sequence(4)).await.unwrap().unwrap();
    let run = records(
        (3..=6)
            .map(|s| event(id, s, delta(&format!("d{s}"))))
            .collect(),
    );
    store.append_run_as(&run, writer).await.unwrap();
    let all = read(&*store, id, 0, 100).await;
    assert_eq!(sequences(&all), [1, 2, 3, 4, 5, 6]);
    for (stored, appended) in all[2..].iter().zip(&run) {
        assert_eq!(
            stored.json, appended.json,
            "a run's events are stored as they are"
        );
    }
    // Cursors and limits inside the run.
    assert_eq!(sequences(&read(&*store, id, 4, 100).await), [5, 6]);
    assert_eq!(sequences(&read(&*store, id, 3, 2).await), [4, 5]);
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!(
        head.last_sequence,
        Sequence(6),
        "the head is the run's last event"
    );
    assert!(!head.terminal);
    let replay_inside = store.subscribe(id, Sequence(5)).await.unwrap().unwrap();
    // A second run ends the log with its terminal event.
    let end = records(vec![event(id, 7, delta("d7")), event(id, 8, completed())]);
    store.append_run_as(&end, writer).await.unwrap();
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!(head.last_sequence, Sequence(8));
    assert!(head.terminal);
    let state = store.state(id).await.unwrap().unwrap();
    assert_eq!(state.status(), ExecutionStatus::Succeeded);
    assert_eq!(state.last_sequence(), Sequence(8));
    assert_eq!(
        sequences(&drain(live_from_zero).await),
        (1..=8).collect::<Vec<_>>()
    );
    assert_eq!(sequences(&drain(live_inside).await), [5, 6, 7, 8]);
    assert_eq!(sequences(&drain(replay_inside).await), [6, 7, 8]);
    let after_terminal_run = store.subscribe(id, Sequence(7)).await.unwrap().unwrap();
    assert_eq!(sequences(&drain(after_terminal_run).await), [8]);
    // Nothing after the terminal event, as a run either.
    let late = records(vec![
        event(id, 9, delta("late")),
        event(id, 10, delta("late")),
    ]);
    let refused = store.append_run_as(&late, writer).await.unwrap_err();
    assert!(
        matches!(refused.error, StoreError::Conflict { terminal: true, .. }),
        "{refused:?}"
    );
    assert_eq!(refused.stored, 0);
}

/// Writers racing with runs over the same sequences: exactly one run wins whole, the others
/// are fenced and store nothing; a stale run is refused.
async fn runs_are_fenced_like_events(store: Arc<dyn EventStore>) {
    let id = routed(store.as_ref()).await;
    let tasks = spawn_each(&store, 8, |w, store| async move {
        let run = records(
            (3..=6)
                .map(|s| event(id, s, delta(&format!("writer {w} at {s}"))))
                .collect(),
        );
        (
            w,
            store.append_run_as(&run, crate::WriterId::random()).await,
        )
    });
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (w, Ok(())) => winners.push(w),
            (_, Err(e)) => {
                assert!(
                    matches!(e.error, StoreError::Conflict { .. }),
                    "unexpected {e:?}"
                );
                assert_eq!(e.stored, 0, "a fenced run stores nothing");
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one run wins");
    let log = read(&*store, id, 0, 100).await;
    assert_eq!(sequences(&log), [1, 2, 3, 4, 5, 6]);
    let winner = format!("writer {} at", winners[0]);
    assert!(
        log[2..]
            .iter()
            .all(|r| String::from_utf8_lossy(&r.json).contains(&winner)),
        "the winning run is stored whole, nothing of the others"
    );
    // A run that starts at a sequence the log already has is refused (another writer won).
    let stale = records(vec![event(id, 6, delta("x")), event(id, 7, delta("y"))]);
    let refused = store
        .append_run_as(&stale, crate::WriterId::random())
        .await
        .unwrap_err();
    assert!(
        matches!(refused.error, StoreError::Conflict { last, terminal: false } if last == Sequence(6)),
        "{refused:?}"
    );
}

/// A run that is not contiguous, mixes executions or continues after its own terminal event is
/// refused whole.
async fn bad_runs_change_nothing(store: &dyn EventStore) {
    let id = routed(store).await;
    let other = ExecutionId::new_random();
    let bad = [
        vec![event(id, 3, delta("a")), event(id, 5, delta("b"))],
        vec![event(id, 3, delta("a")), event(other, 4, delta("b"))],
        vec![event(id, 3, completed()), event(id, 4, delta("b"))],
    ];
    for run in bad {
        let refused = store
            .append_run_as(&records(run), crate::WriterId::random())
            .await
            .unwrap_err();
        assert!(
            matches!(refused.error, StoreError::Violation(_)),
            "{refused:?}"
        );
        assert_eq!(refused.stored, 0);
    }
    assert_eq!(
        store.head(id).await.unwrap().unwrap().last_sequence,
        Sequence(2)
    );
}

async fn executions_belong_to_their_creator(store: &dyn EventStore) {
    let acme: Tenant = "acme".parse().unwrap();
    let other: Tenant = "other".parse().unwrap();
    let id = ExecutionId::new_random();
    store
        .create_owned(event(id, 1, EventBody::Accepted), &acme)
        .await
        .unwrap();
    assert_eq!(store.owner(id).await.unwrap(), Some(acme.clone()));
    // A second creator, of any tenant, changes nothing.
    assert!(matches!(
        store
            .create_owned(event(id, 1, EventBody::Accepted), &other)
            .await,
        Err(StoreError::AlreadyExists)
    ));
    store.append(event(id, 2, route_selected())).await.unwrap();
    let (state, owner) = store.owned_state(id).await.unwrap().unwrap();
    assert_eq!((state.last_sequence(), owner), (Sequence(2), acme.clone()));
    assert_eq!(store.owner(id).await.unwrap(), Some(acme.clone()));
    assert_eq!(
        owned_subscribe(store, id, 0, 2).await,
        (acme.clone(), vec![1, 2])
    );
    // Past the length where backends switch read strategies, the owner is still known.
    for seq in 3..=70 {
        store.append(event(id, seq, delta("x"))).await.unwrap();
    }
    let (state, owner) = store.owned_state(id).await.unwrap().unwrap();
    assert_eq!((state.last_sequence(), owner), (Sequence(70), acme.clone()));
    assert_eq!(
        owned_subscribe(store, id, 67, 3).await,
        (acme, vec![68, 69, 70])
    );
    // `create` is the default tenant's.
    let anonymous = accepted(store).await;
    assert_eq!(
        store.owner(anonymous).await.unwrap(),
        Some(Tenant::default())
    );
    let (_, owner) = store.owned_state(anonymous).await.unwrap().unwrap();
    assert!(owner.is_default());
    assert_eq!(
        owned_subscribe(store, anonymous, 0, 1).await,
        (Tenant::default(), vec![1])
    );
    let unknown = ExecutionId::new_random();
    assert_eq!(store.owner(unknown).await.unwrap(), None);
    assert!(store.owned_state(unknown).await.unwrap().is_none());
    assert!(
        store
            .owned_subscribe(unknown, Sequence(0))
            .await
            .unwrap()
            .is_none()
    );
}

/// `create_closed`: the log holds `execution.accepted` and the terminal event, belongs to its
/// creator, reads terminal from its first read on, and admits nothing after it; an existing log
/// is `AlreadyExists` and unchanged.
async fn logs_created_closed_read_closed(store: &dyn EventStore) {
    let acme: Tenant = "acme".parse().unwrap();
    let failed = || EventBody::Failed {
        error: RuntimeError::internal(),
    };
    let id = ExecutionId::new_random();
    store
        .create_closed(
            event(id, 1, EventBody::Accepted),
            event(id, 2, failed()),
            &acme,
        )
        .await
        .unwrap();
    let head = store.head(id).await.unwrap().unwrap();
    assert_eq!((head.last_sequence, head.terminal), (Sequence(2), true));
    let sequences: Vec<u64> = read(store, id, 0, 10)
        .await
        .iter()
        .map(|r| r.sequence().get())
        .collect();
    assert_eq!(sequences, [1, 2]);
    let subscribed: Vec<u64> = drain(store.subscribe(id, Sequence(0)).await.unwrap().unwrap())
        .await
        .iter()
        .map(|r| r.sequence().get())
        .collect();
    assert_eq!(subscribed, [1, 2], "a subscription replays both and ends");
    let (state, owner) = store.owned_state(id).await.unwrap().unwrap();
    assert_eq!(
        (state.status(), state.last_sequence(), owner),
        (ExecutionStatus::Failed, Sequence(2), acme.clone())
    );
    assert!(matches!(
        store.append(event(id, 3, delta("x"))).await,
        Err(StoreError::Conflict { terminal: true, .. })
    ));
    // On an existing log: refused, nothing written.
    let open = accepted(store).await;
    assert!(matches!(
        store
            .create_closed(
                event(open, 1, EventBody::Accepted),
                event(open, 2, failed()),
                &acme,
            )
            .await,
        Err(StoreError::AlreadyExists)
    ));
    let head = store.head(open).await.unwrap().unwrap();
    assert_eq!((head.last_sequence, head.terminal), (Sequence(1), false));
    assert_eq!(store.owner(open).await.unwrap(), Some(Tenant::default()));
}

/// The owner `owned_subscribe` reports for the known execution `id`, and the sequences of the
/// first `n` events its subscription after `after` yields.
async fn owned_subscribe(
    store: &dyn EventStore,
    id: ExecutionId,
    after: u64,
    n: usize,
) -> (Tenant, Vec<u64>) {
    let (owner, mut stream) = store
        .owned_subscribe(id, Sequence(after))
        .await
        .unwrap()
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < n {
        let record = tokio::time::timeout(PROMPT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(record.sequence().get());
    }
    (owner, seen)
}

async fn create_and_append_in_order(store: &dyn EventStore) {
    let id = accepted(store).await;
    assert!(matches!(
        store.create(event(id, 1, EventBody::Accepted)).await,
        Err(StoreError::AlreadyExists)
    ));
    store.append(event(id, 2, route_selected())).await.unwrap();
    store.append(event(id, 3, delta("a"))).await.unwrap();
    let state = store.state(id).await.unwrap().unwrap();
    assert_eq!(state.last_sequence(), Sequence(3));
    assert_eq!(state.status(), ExecutionStatus::Running);
    let all = read(store, id, 0, 100).await;
    assert_eq!(
        all.iter().map(|r| r.sequence().get()).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let tail = read(store, id, 1, 1).await;
    assert_eq!(
        tail.iter().map(|r| r.sequence().get()).collect::<Vec<_>>(),
        vec![2]
    );
    assert!(read(store, id, 3, 100).await.is_empty());
    // JSON on the record is the event's wire form.
    let parsed: RuntimeEvent = serde_json::from_slice(&all[2].json).unwrap();
    assert_eq!(parsed, all[2].event);
    store.append(event(id, 4, completed())).await.unwrap();
    match store.append(event(id, 5, delta("late"))).await {
        Err(StoreError::Conflict { last, terminal }) => {
            assert_eq!(last, Sequence(4));
            assert!(terminal);
        }
        other => panic!("append after terminal must conflict, got {other:?}"),
    }
    assert_eq!(
        store.state(id).await.unwrap().unwrap().status(),
        ExecutionStatus::Succeeded
    );
}

async fn compare_and_set_fences_writers(store: Arc<dyn EventStore>) {
    let id = accepted(store.as_ref()).await;
    // Many writers race for sequence 2 with different events: exactly one wins.
    let tasks = spawn_each(&store, 16, |i, store| async move {
        let body = if i % 2 == 0 {
            route_selected()
        } else {
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            }
        };
        store.append(event(id, 2, body)).await
    });
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => wins += 1,
            Err(StoreError::Conflict { last, .. }) => assert_eq!(last, Sequence(2)),
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
    assert_eq!(wins, 1);
    // A stale writer with an old sequence is refused.
    assert!(matches!(
        store.append(event(id, 2, delta("x"))).await,
        Err(StoreError::Conflict { .. })
    ));
    // A gap is refused too.
    assert!(store.append(event(id, 4, delta("x"))).await.is_err());
    assert_eq!(read(&*store, id, 0, 100).await.len(), 2);
}

async fn subscription_replays_then_follows_then_ends(store: Arc<dyn EventStore>) {
    let id = routed(store.as_ref()).await;
    let mut from_zero = store.subscribe(id, Sequence(0)).await.unwrap().unwrap();
    let mut from_one = store.subscribe(id, Sequence(1)).await.unwrap().unwrap();
    // Replay.
    for expected in [1, 2] {
        let r = tokio::time::timeout(PROMPT, from_zero.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.sequence().get(), expected);
    }
    // Live: appends from another task while we wait.
    let writer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for seq in 3..=40u64 {
                store
                    .append(event(id, seq, delta(&seq.to_string())))
                    .await
                    .unwrap();
                if seq % 8 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            store.append(event(id, 41, completed())).await.unwrap();
        })
    };
    for (stream, first) in [(&mut from_zero, 3u64), (&mut from_one, 2)] {
        let mut expected = first;
        while let Some(item) = tokio::time::timeout(PROMPT, stream.next()).await.unwrap() {
            let record = item.unwrap();
            assert_eq!(record.sequence().get(), expected, "no gap, no duplicate");
            expected += 1;
        }
        assert_eq!(
            expected, 42,
            "the stream ends right after the terminal event"
        );
    }
    writer.await.unwrap();
}

/// Writers race for every sequence (the losers are fenced by compare-and-set) while readers
/// follow: each reader shows exactly the stored log, never a loser's event. (Backend tests add
/// the cases only a backend can stage, such as appends its server refuses or never stores.)
async fn readers_see_only_stored_events(store: Arc<dyn EventStore>) {
    let id = routed(store.as_ref()).await;
    let mut readers = Vec::new();
    for after in [0, 2] {
        let stream = store.subscribe(id, Sequence(after)).await.unwrap().unwrap();
        readers.push(tokio::spawn(async move {
            let seen = drain(stream).await;
            seen.iter().map(|r| r.json.clone()).collect::<Vec<_>>()
        }));
    }
    let writers = spawn_each(&store, 4, |w, store| async move {
        race_to(store.as_ref(), id, w, 20).await;
    });
    for w in writers {
        w.await.unwrap();
    }
    let log: Vec<_> = store
        .read(id, Sequence(0), usize::MAX)
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|r| r.json.clone())
        .collect();
    assert_eq!(log.len(), 20);
    let from_zero = readers.remove(0).await.unwrap();
    assert_eq!(
        from_zero, log,
        "a reader showed an event the log does not hold"
    );
    let from_two = readers.remove(0).await.unwrap();
    assert_eq!(from_two, log[2..].to_vec());
}

async fn cursors_at_or_past_terminal_are_empty(store: &dyn EventStore) {
    let id = accepted(store).await;
    store
        .append(event(
            id,
            2,
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        ))
        .await
        .unwrap();
    for cursor in [2, 3, 1000] {
        let mut s = store
            .subscribe(id, Sequence(cursor))
            .await
            .unwrap()
            .unwrap();
        assert!(
            tokio::time::timeout(PROMPT, s.next())
                .await
                .unwrap()
                .is_none()
        );
    }
    let mut s = store.subscribe(id, Sequence(1)).await.unwrap().unwrap();
    let only = tokio::time::timeout(PROMPT, s.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(only.event.status, ExecutionStatus::Cancelled);
    assert!(
        tokio::time::timeout(PROMPT, s.next())
            .await
            .unwrap()
            .is_none()
    );
}

/// A reader whose cursor is past the end of a log still open (a `Last-Event-ID` from a longer
/// log, or a head read on a replica behind the terminal event) gets nothing, and its stream
/// ends once the log closes at or before the cursor: it never waits for events that cannot
/// come.
async fn a_cursor_past_an_open_log_ends_when_the_log_closes(store: &dyn EventStore) {
    for (cursor, closing_at) in [(20, 3), (3, 3)] {
        let id = routed(store).await;
        let mut s = store
            .subscribe(id, Sequence(cursor))
            .await
            .unwrap()
            .unwrap();
        for n in 3..closing_at {
            store.append(event(id, n, delta("x"))).await.unwrap();
        }
        store
            .append(event(id, closing_at, completed()))
            .await
            .unwrap();
        let next = tokio::time::timeout(PROMPT, s.next()).await;
        assert!(
            matches!(next, Ok(None)),
            "cursor {cursor}, closed at {closing_at}: {next:?}"
        );
    }
}

async fn unknown_executions_are_none(store: &dyn EventStore) {
    let id = ExecutionId::new_random();
    assert!(store.state(id).await.unwrap().is_none());
    assert!(store.read(id, Sequence(0), 10).await.unwrap().is_none());
    assert!(store.subscribe(id, Sequence(0)).await.unwrap().is_none());
    assert!(store.append(event(id, 2, delta("x"))).await.is_err());
}

async fn rule_violations_change_nothing(store: &dyn EventStore) {
    let id = accepted(store).await;
    let mut wrong = event(id, 2, route_selected());
    wrong.status = ExecutionStatus::Running;
    assert!(matches!(
        store.append(wrong).await,
        Err(StoreError::Violation(_))
    ));
    assert!(
        store
            .append(event(id, 2, EventBody::Accepted))
            .await
            .is_err()
    );
    assert_eq!(
        store.state(id).await.unwrap().unwrap().last_sequence(),
        Sequence(1)
    );
    // A bad first event is refused at create.
    let other = ExecutionId::new_random();
    assert!(store.create(event(other, 1, delta("x"))).await.is_err());
    assert!(store.state(other).await.unwrap().is_none());
}
