//! The JetStream layout against a private nats-server: live readers see stored events only, a
//! process started with other settings reconciles the streams, the workers' consumer and the
//! cancel bucket instead of keeping the first process's values, and a worker's pull request
//! stays open for the jobs it asked for.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use protocol::event::EventBody;
use protocol::{ExecutionId, Sequence};
use runtime::contract::{
    accepted, completed, delta, drain, event as ev, job, output_usage, race_to, read,
    route_selected as route, routed,
};
use runtime::nats::{NatsBackend, NatsCancelBus, NatsEventStore, NatsJobQueue, NatsSettings};
use runtime::{
    Deliveries, Delivery, EventRecord, EventStore, EventStream, JobQueue, StoreError, WriterId,
};
use testkit::jetstream::stream_state;
use testkit::{NatsServer, unique_namespace};

const PROMPT: Duration = Duration::from_secs(20);

mod support;
use support::{connect, event_store, fresh_settings, node, node_with, node_with_small_messages};

fn json_of(records: &[Arc<EventRecord>]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.json.to_vec()).unwrap())
        .collect()
}

/// The log as stored, for comparison with what readers saw.
async fn stored(store: &NatsEventStore, id: ExecutionId) -> Vec<String> {
    json_of(&read(store, id, 0, usize::MAX).await)
}

/// Two live readers of one execution: from the start and from after sequence 2.
struct Readers {
    from_start: EventStream,
    from_two: EventStream,
}

impl Readers {
    async fn subscribe(store: &NatsEventStore, id: ExecutionId) -> Self {
        Self {
            from_start: store.subscribe(id, Sequence(0)).await.unwrap().unwrap(),
            from_two: store.subscribe(id, Sequence(2)).await.unwrap().unwrap(),
        }
    }

    /// Reads both to the end: each must show exactly `log` from where it started.
    async fn assert_saw(self, log: &[String]) {
        assert_eq!(json_of(&drain(self.from_start).await), log);
        assert_eq!(json_of(&drain(self.from_two).await), log[2..]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_appends_the_stream_refused_or_never_stored() {
    let (server, settings, backend, store) = node_with_small_messages().await;
    let id = routed(&store).await;
    // Readers on their own connection (another gateway), subscribed before the ghosts.
    let reader_side = event_store(&server, settings.clone()).await;
    let readers = Readers::subscribe(&reader_side, id).await;
    let subject = backend.events.subject(&id);
    let ghost = |text: &str| EventRecord::new(ev(id, 3, delta(text))).json;

    // A fenced writer: its compare-and-set names a stream sequence that is no longer the last
    // of the subject, so the stream refuses the append.
    let refused = publish_raw(
        &backend.jetstream,
        subject.clone(),
        jetstream::message::PublishMessage::build()
            .payload(ghost("fenced"))
            .expected_last_subject_sequence(1),
    )
    .await;
    assert!(
        refused.is_err(),
        "the stream must refuse a stale compare-and-set"
    );
    // An append the stream never stores: over its message size limit (as good as a publish
    // whose leader was lost: core subscribers of the write subject still receive it).
    let big = EventRecord::new(ev(id, 3, delta(&"x".repeat(8192)))).json;
    let unstored = publish_raw(
        &backend.jetstream,
        subject.clone(),
        jetstream::message::PublishMessage::build().payload(big),
    )
    .await;
    assert!(
        unstored.is_err(),
        "the stream must refuse an oversized event"
    );
    // A bare core publish on the write subject with a failing compare-and-set header.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Last-Subject-Sequence", "999999");
    backend
        .client
        .publish_with_headers(subject.clone(), headers, ghost("core"))
        .await
        .unwrap();
    backend.client.flush().await.unwrap();

    // The real writer continues the log.
    store.append(ev(id, 3, delta("real"))).await.unwrap();
    store.append(ev(id, 4, completed())).await.unwrap();

    let log = stored(&store, id).await;
    assert_eq!(log.len(), 4);
    assert!(log[2].contains("real"), "{}", log[2]);
    readers.assert_saw(&log).await;
}

/// The configuration of the events stream holding `id`'s log.
async fn events_stream_config(backend: &NatsBackend, id: ExecutionId) -> stream::Config {
    backend
        .jetstream
        .get_stream(backend.events.stream_of(&id))
        .await
        .unwrap()
        .cached_info()
        .config
        .clone()
}

/// Turns the republish of the events stream `on` describes off or back on, as a reader's live path sees
/// it when a stored message does not reach it (the subscription's interest not yet on the
/// server that republishes, a slow consumer's dropped message).
async fn republish(backend: &NatsBackend, on: &stream::Config, enabled: bool) {
    let mut config = on.clone();
    if !enabled {
        config.republish = None;
    }
    backend.jetstream.update_stream(config).await.unwrap();
}

/// A live reader of `id` (a log at `route.selected`, [`routed`]) that has read its two events.
async fn reading_past_its_route(store: &NatsEventStore, id: ExecutionId) -> EventStream {
    let mut reader = store.subscribe(id, Sequence(0)).await.unwrap().unwrap();
    for want in [1, 2] {
        let record = tokio::time::timeout(PROMPT, reader.next()).await.unwrap();
        assert_eq!(record.unwrap().unwrap().sequence(), Sequence(want));
    }
    reader
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_gets_the_events_its_live_path_missed_from_the_stream() {
    let (_server, _settings, backend, store) = node().await;
    let id = routed(&store).await;
    let mut reader = reading_past_its_route(&store, id).await;
    let on = events_stream_config(&backend, id).await;
    assert!(on.republish.is_some());
    // Event 3 never reaches the live path; event 4 does, and shows the gap.
    republish(&backend, &on, false).await;
    store.append(ev(id, 3, delta("missed"))).await.unwrap();
    republish(&backend, &on, true).await;
    store
        .append(ev(id, 4, delta("shows the gap")))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in [3, 4] {
        let record = tokio::time::timeout(PROMPT, reader.next()).await.unwrap();
        seen.push(record.unwrap().unwrap());
    }
    // The terminal event never reaches it and nothing follows: only a quiet re-read finds it.
    republish(&backend, &on, false).await;
    store.append(ev(id, 5, completed())).await.unwrap();
    seen.extend(tokio::time::timeout(PROMPT, drain(reader)).await.unwrap());
    let log = stored(&store, id).await;
    assert_eq!(log.len(), 5);
    assert_eq!(json_of(&seen), log[2..]);
}

/// A reader that has waited a long while without news re-reads the stream less often, but
/// still gets the end of its log when the live path misses it: here a server restart (every
/// connection reconnects) with the terminal event stored while republish is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_silent_reader_gets_an_end_its_live_path_missed_across_a_reconnect() {
    let (mut server, _settings, backend, store) = node().await;
    let id = routed(&store).await;
    let reader = reading_past_its_route(&store, id).await;
    // Silent long enough for its quiet re-reads to have backed off past a second.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let on = events_stream_config(&backend, id).await;
    republish(&backend, &on, false).await;
    server.restart();
    let deadline = Instant::now() + PROMPT;
    while let Err(e) = store.append(ev(id, 3, completed())).await {
        assert!(Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rest = tokio::time::timeout(PROMPT, drain(reader)).await.unwrap();
    assert_eq!(json_of(&rest), stored(&store, id).await[2..]);
}

/// A live reader rides out a server outage shorter than its patience: its quiet re-read comes
/// while the server is away and fails, and it reads again until the connection is back rather
/// than ending the stream (which its client would see as a truncation), then delivers the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_reader_rides_out_a_short_server_outage() {
    let (mut server, _settings, _backend, store) = node().await;
    let id = routed(&store).await;
    let reader = reading_past_its_route(&store, id).await;
    server.kill();
    // Away for longer than the reader's first quiet spell (a second on a server outside a
    // cluster), so its re-read meets the outage.
    let reading = tokio::spawn(async move { drain(reader).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.restart();
    let deadline = Instant::now() + PROMPT;
    while let Err(e) = store.append(ev(id, 3, completed())).await {
        assert!(Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rest = reading.await.expect("the stream ended with an error");
    assert_eq!(json_of(&rest), stored(&store, id).await[2..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_exactly_the_log_while_writers_on_other_connections_race() {
    // Writers on separate connections (separate processes) race for every sequence; the losers
    // are fenced by compare-and-set. Readers on a third connection must show exactly the log.
    let server = NatsServer::start();
    let settings = fresh_settings();
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(Arc::new(event_store(&server, settings.clone()).await));
    }
    let readers = event_store(&server, settings.clone()).await;
    for _round in 0..10 {
        let id = routed(writers[0].as_ref()).await;
        let subscriptions = Readers::subscribe(&readers, id).await;
        let mut tasks = Vec::new();
        for (w, store) in writers.iter().enumerate() {
            let store = Arc::clone(store);
            tasks.push(tokio::spawn(async move {
                race_to(store.as_ref(), id, w, 12).await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        subscriptions.assert_saw(&stored(&readers, id).await).await;
    }
}

/// A private server and a namespace of its own in which another program (or an earlier version)
/// created the stream `config(settings)` before any process of this one starts; returns that
/// program's JetStream client too.
async fn stream_made_elsewhere(
    config: impl FnOnce(&NatsSettings) -> stream::Config,
) -> (NatsServer, NatsSettings, jetstream::Context) {
    let server = NatsServer::start();
    let settings = fresh_settings();
    let js = testkit::jetstream::connect(&server.url()).await;
    js.create_stream(config(&settings)).await.unwrap();
    (server, settings, js)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_stream_created_without_republish_gets_it_at_startup() {
    // The stream as earlier versions created it.
    let (server, settings, js) = stream_made_elsewhere(|settings| stream::Config {
        name: settings.events_stream(),
        subjects: vec![format!("{}.events.*", settings.namespace)],
        storage: stream::StorageType::File,
        max_age: settings.retention,
        allow_direct: true,
        ..Default::default()
    })
    .await;
    let store = event_store(&server, settings.clone()).await;
    let info = js
        .get_stream(settings.events_stream())
        .await
        .unwrap()
        .cached_info()
        .clone();
    assert!(info.config.republish.is_some(), "{:?}", info.config);
    // Live delivery works through it.
    let id = accepted(&store).await;
    let live = store.subscribe(id, Sequence(1)).await.unwrap().unwrap();
    store.append(ev(id, 2, route())).await.unwrap();
    store.append(ev(id, 3, completed())).await.unwrap();
    assert_eq!(drain(live).await.len(), 2);
}

/// The events stream as versions before sharding created it (one stream, the republish of
/// later versions of those, no shard record).
fn unsharded_events_stream(settings: &NatsSettings) -> stream::Config {
    stream::Config {
        name: settings.events_stream(),
        subjects: vec![format!("{}.events.*", settings.namespace)],
        storage: stream::StorageType::File,
        max_age: settings.retention,
        allow_direct: true,
        republish: Some(stream::Republish {
            source: format!("{}.events.*", settings.namespace),
            destination: format!("{}.stored.{{{{wildcard(1)}}}}", settings.namespace),
            headers_only: false,
        }),
        ..Default::default()
    }
}

/// Every delivery of one take of at most `max` jobs from `lane`, once the take ends.
async fn take(queue: &NatsJobQueue, lane: usize, max: usize) -> Vec<runtime::Delivery> {
    let deliveries = queue.take_from(lane, max).await.unwrap().unwrap();
    let deliveries: Vec<_> = futures_util::StreamExt::collect(deliveries).await;
    deliveries.into_iter().map(Result::unwrap).collect()
}

/// A write straight to the stream, past the store (as earlier versions, a fenced writer or a
/// foreign client wrote): the stream's answer to `message` on `subject`.
async fn publish_raw(
    js: &jetstream::Context,
    subject: String,
    message: jetstream::message::PublishMessage,
) -> Result<jetstream::publish::PublishAck, jetstream::context::PublishError> {
    js.send_publish(subject, message).await.unwrap().await
}

/// `execution.accepted` and `route.selected` of `id` on `subject`, as versions before runs
/// and shards wrote them: one event per message, the msg id in `Nats-Msg-Id`.
async fn write_as_earlier_versions(js: &jetstream::Context, subject: &str, id: ExecutionId) {
    let mut expected_last = 0;
    for event in [ev(id, 1, EventBody::Accepted), ev(id, 2, route())] {
        let ack = publish_raw(
            js,
            subject.to_owned(),
            jetstream::message::PublishMessage::build()
                .payload(EventRecord::new(event.clone()).json)
                .message_id(format!("{id}:{}:0123456789abcdef", event.sequence))
                .expected_last_subject_sequence(expected_last),
        )
        .await
        .unwrap();
        expected_last = ack.sequence;
    }
}

/// What connecting with `event_shards` gives: the connection, or why it was refused.
async fn connect_asking(
    server: &NatsServer,
    settings: &NatsSettings,
    event_shards: Option<u16>,
) -> Result<NatsBackend, StoreError> {
    let settings = NatsSettings {
        event_shards,
        ..settings.clone()
    };
    NatsBackend::connect(&server.url(), settings, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_before_sharding_keeps_its_one_stream_and_its_logs() {
    let (server, settings, js) = stream_made_elsewhere(unsharded_events_stream).await;
    // A log as those versions wrote it: one event per message on `{ns}.events.{id}`.
    let id = ExecutionId::new_random();
    let subject = format!("{}.events.{id}", settings.namespace);
    write_as_earlier_versions(&js, &subject, id).await;

    // A process asking for no count adopts the namespace's one stream, and the log is there.
    let backend = connect_asking(&server, &settings, None).await.unwrap();
    assert_eq!(backend.events.count(), 1);
    assert_eq!(backend.events.subject(&id), subject);
    let store = NatsEventStore::new(backend.clone(), 100).await.unwrap();
    let live = store.subscribe(id, Sequence(0)).await.unwrap().unwrap();
    store.append(ev(id, 3, completed())).await.unwrap();
    assert_eq!(sequences(&drain(live).await), [1, 2, 3]);
    assert_eq!(
        store.owner(id).await.unwrap(),
        Some(protocol::Tenant::default())
    );
    assert!(
        js.get_stream(format!("{}_1", settings.events_stream()))
            .await
            .is_err(),
        "no other events stream was created"
    );
    // Asking for the same count explicitly is fine; another count is refused, naming both.
    connect_asking(&server, &settings, Some(1)).await.unwrap();
    let Err(StoreError::Misconfigured(message)) = connect_asking(&server, &settings, Some(4)).await
    else {
        panic!("a one-stream namespace accepted a process asking for 4 shards");
    };
    assert!(message.contains("has 1 partition(s)"), "{message}");
    assert!(message.contains("asks for 4"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_namespace_records_one_shard_count_that_every_process_uses() {
    let server = NatsServer::start();
    let settings = fresh_settings();
    // Two processes create the namespace at once, asking for different counts: one wins, the
    // other is refused; neither ever uses a count the namespace does not record.
    let (two, three) = tokio::join!(
        connect_asking(&server, &settings, Some(2)),
        connect_asking(&server, &settings, Some(3)),
    );
    let winner = match (two, three) {
        (Ok(won), Err(StoreError::Misconfigured(_)))
        | (Err(StoreError::Misconfigured(_)), Ok(won)) => won,
        (two, three) => panic!("both or neither started: {two:?} / {three:?}"),
    };
    let count = winner.events.count();
    let js = testkit::jetstream::connect(&server.url()).await;
    let record = js
        .get_stream(settings.events_stream())
        .await
        .unwrap()
        .cached_info()
        .config
        .metadata
        .get(runtime::nats::SHARDS_METADATA_KEY)
        .cloned();
    assert_eq!(record, Some(count.to_string()));
    // A process asking for nothing uses the recorded count.
    let other = connect_asking(&server, &settings, None).await.unwrap();
    assert_eq!(other.events, winner.events);

    // Logs spread over every shard, each in its own shard's stream, and a process on another
    // connection reads each one, whole and live.
    let writer = NatsEventStore::new(winner, 100).await.unwrap();
    let reader = NatsEventStore::new(other.clone(), 100).await.unwrap();
    let mut per_shard = vec![0; usize::from(count)];
    // 48 executions: a shard left empty by chance has odds below 1e-7.
    for _ in 0..48 {
        let id = routed(&writer).await;
        per_shard[usize::from(other.events.shard_of(&id))] += 1;
        let live = reader.subscribe(id, Sequence(1)).await.unwrap().unwrap();
        writer.append(ev(id, 3, delta("x"))).await.unwrap();
        writer.append(ev(id, 4, completed())).await.unwrap();
        assert_eq!(sequences(&drain(live).await), [2, 3, 4]);
        assert_eq!(
            sequences(&reader.read(id, Sequence(0), 10).await.unwrap().unwrap()),
            [1, 2, 3, 4]
        );
        let last = last_message(&other, id).await;
        assert_eq!(last.subject.as_str(), other.events.subject(&id));
    }
    assert!(per_shard.iter().all(|&n| n > 0), "{per_shard:?}");
}

/// The workers' consumer as the server holds it.
async fn workers_consumer(backend: &NatsBackend) -> jetstream::consumer::Config {
    let s = &backend.settings;
    let stream = backend.jetstream.get_stream(s.jobs_stream()).await.unwrap();
    stream
        .consumer_info(s.workers_consumer())
        .await
        .unwrap()
        .config
        .clone()
}

/// Reconciles the workers' consumer through `queue`, a process on `backend`: the lease the
/// process reports and the one the server then holds are both `want`.
async fn assert_reconciled_lease(queue: &NatsJobQueue, backend: &NatsBackend, want: Duration) {
    assert_eq!(queue.reconcile_consumer().await.unwrap(), want);
    assert_eq!(workers_consumer(backend).await.ack_wait, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_another_ack_wait_changes_the_lease_on_the_server() {
    let server = NatsServer::start();
    let namespace = unique_namespace("t");
    let first = connect(
        &server,
        NatsSettings {
            ack_wait: Duration::from_secs(3),
            ..NatsSettings::new(namespace.clone())
        },
    )
    .await;
    let queue = NatsJobQueue::new(first.clone());
    assert_reconciled_lease(&queue, &first, Duration::from_secs(3)).await;

    // "Restart" with the default of 30 s: the server's consumer follows.
    let second = connect(&server, NatsSettings::new(namespace.clone())).await;
    let restarted = NatsJobQueue::new(second.clone());
    assert_reconciled_lease(&restarted, &second, Duration::from_secs(30)).await;

    // The process still running with 3 s learns the server's lease while it holds a job, so
    // its heartbeats follow the server, not its own flag.
    first_delivery_follows_the_server(&queue, Duration::from_secs(30)).await;

    // And back to 3 s: a killed holder's job is redelivered after the new lease, not 30 s.
    let third = connect(
        &server,
        NatsSettings {
            ack_wait: Duration::from_secs(3),
            ..NatsSettings::new(namespace)
        },
    )
    .await;
    let short = NatsJobQueue::new(third.clone());
    assert_eq!(
        short.reconcile_consumer().await.unwrap(),
        Duration::from_secs(3)
    );
    let id = ExecutionId::new_random();
    short.publish(&job(id)).await.unwrap();
    let held = next_delivery(&short).await;
    assert_eq!(held.job.execution_id, id);
    let lost_at = Instant::now();
    drop(held); // the holder dies: no ack, no heartbeat
    let again = next_delivery(&short).await;
    assert_eq!(again.job.execution_id, id);
    assert_eq!(again.delivered, 2);
    let waited = lost_at.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "redelivered after {waited:?}: the 3 s lease was not applied"
    );
    again.handle.ack().await.unwrap();
}

/// The next job `queue` delivers, within [`PROMPT`].
async fn next_delivery(queue: &NatsJobQueue) -> Delivery {
    tokio::time::timeout(PROMPT, queue.receive())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

/// A job queue in a namespace of its own with one tenant lane: one consumer, so one pull
/// request covers every job. Keep the server alive.
async fn one_lane_queue() -> (NatsServer, NatsJobQueue) {
    let (server, _settings, backend, _store) = node_with(NatsSettings {
        tenant_lanes: Some(1),
        ..fresh_settings()
    })
    .await;
    (server, NatsJobQueue::new(backend))
}

/// One pull request for up to `max` jobs.
async fn pull(queue: &NatsJobQueue, max: usize) -> Deliveries {
    tokio::time::timeout(PROMPT, queue.receive_up_to(max))
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

async fn first_delivery_follows_the_server(queue: &NatsJobQueue, want: Duration) {
    let id = ExecutionId::new_random();
    queue.publish(&job(id)).await.unwrap();
    let delivery = next_delivery(queue).await;
    let started = Instant::now();
    while delivery.handle.lease() != Some(want) {
        assert!(
            started.elapsed() < PROMPT,
            "lease still {:?}",
            delivery.handle.lease()
        );
        delivery.handle.in_progress().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(queue.lease(), Some(want));
    delivery.handle.ack().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_another_admission_limit_and_retention_applies_them() {
    let server = NatsServer::start();
    let namespace = unique_namespace("t");
    let small = NatsSettings {
        max_jobs: 2,
        retention: Duration::from_secs(600),
        ..NatsSettings::new(namespace.clone())
    };
    let first = connect(&server, small).await;
    let _bus = NatsCancelBus::new(first.clone()).await.unwrap();
    let queue = NatsJobQueue::new(first);
    queue
        .publish(&job(ExecutionId::new_random()))
        .await
        .unwrap();
    queue
        .publish(&job(ExecutionId::new_random()))
        .await
        .unwrap();
    assert!(matches!(
        queue.publish(&job(ExecutionId::new_random())).await,
        Err(StoreError::AdmissionFull)
    ));

    let larger = NatsSettings {
        max_jobs: 5,
        retention: Duration::from_secs(1200),
        ..NatsSettings::new(namespace)
    };
    let second = connect(&server, larger.clone()).await;
    let _bus = NatsCancelBus::new(second.clone()).await.unwrap();
    let restarted = NatsJobQueue::new(second.clone());
    restarted
        .publish(&job(ExecutionId::new_random()))
        .await
        .unwrap();
    restarted.reconcile_consumer().await.unwrap();
    let js = &second.jetstream;
    let config = |name: String| async move {
        js.get_stream(name)
            .await
            .unwrap()
            .cached_info()
            .config
            .clone()
    };
    let jobs = config(larger.jobs_stream()).await;
    assert_eq!(jobs.max_messages, 5);
    assert_eq!(jobs.max_age, Duration::from_secs(1200));
    assert_eq!(
        config(larger.events_stream()).await.max_age,
        Duration::from_secs(1200)
    );
    assert_eq!(
        config(format!("KV_{}", larger.cancel_bucket()))
            .await
            .max_age,
        Duration::from_secs(1200)
    );
    assert_eq!(workers_consumer(&second).await.max_ack_pending, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_jetstream_cannot_change_stops_the_start_and_is_named() {
    let (server, settings, _) = stream_made_elsewhere(|settings| stream::Config {
        name: settings.jobs_stream(),
        subjects: vec![settings.jobs_subject()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::Memory,
        // Everything else as this process wants it: only the storage type differs.
        max_age: settings.retention,
        max_messages: settings.max_jobs,
        discard: stream::DiscardPolicy::New,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await;
    let err = NatsBackend::connect(&server.url(), settings.clone(), Duration::from_secs(30))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&settings.jobs_stream()) && message.contains("storage"),
        "{message}"
    );
}

#[tokio::test]
async fn a_server_list_connects_past_a_dead_entry_and_a_malformed_list_is_refused() {
    let server = NatsServer::start();
    let dead = format!("nats://127.0.0.1:{}", testkit::free_port());
    let list = format!("{dead}, {}", server.url());
    let settings = fresh_settings();
    let backend = NatsBackend::connect(&list, settings.clone(), Duration::from_secs(30))
        .await
        .expect("one live server in the list is enough");
    assert!(backend.connected());

    let malformed = format!("{},nats://[::1", server.url());
    let err = NatsBackend::connect(&malformed, settings, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        !err.to_string().contains("[::1"),
        "the list is not echoed: {err}"
    );
}

#[tokio::test]
async fn replicas_are_applied_on_creation_and_reconciled_on_restart() {
    let server = NatsServer::start();
    let namespace = unique_namespace("t");
    let with = |replicas| NatsSettings {
        replicas,
        ..NatsSettings::new(namespace.clone())
    };
    let settings = with(1);
    let replicas_on_server = |backend: NatsBackend| {
        let settings = settings.clone();
        async move {
            let mut out = Vec::new();
            let names = backend.events.streams().chain([
                settings.jobs_stream(),
                format!("KV_{}", settings.cancel_bucket()),
            ]);
            for name in names.collect::<Vec<_>>() {
                let stream = backend.jetstream.get_stream(&name).await.unwrap();
                out.push(stream.cached_info().config.num_replicas);
            }
            out
        }
    };
    // A standalone server records a raised setting on existing streams (and keeps one copy); a
    // cluster places the copies. Creating a replicated stream there is refused with the reason.
    // Retried as a cluster still placing replicas would be, until the connect bound.
    let refused = NatsBackend::connect(&server.url(), with(3), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("replicas"), "{refused}");
    for replicas in [1, 3, 1] {
        let backend = connect(&server, with(replicas)).await;
        NatsCancelBus::new(backend.clone()).await.unwrap();
        assert_eq!(
            replicas_on_server(backend).await,
            vec![replicas; usize::from(runtime::nats::DEFAULT_EVENT_SHARDS) + 2],
            "after a start with {replicas} replicas"
        );
    }
}

/// Messages stored in the namespace's events streams (one execution per namespace in these
/// tests, so: the execution's messages).
async fn stored_messages(backend: &NatsBackend) -> u64 {
    let mut messages = 0;
    for name in backend.events.streams() {
        messages += stream_state(&backend.jetstream, &name).await.messages;
    }
    messages
}

/// Deltas `sequences` appended by `writer` in runs of `len` events (the last run may be
/// shorter).
async fn append_in_runs(
    store: &NatsEventStore,
    id: ExecutionId,
    writer: WriterId,
    sequences: std::ops::RangeInclusive<u64>,
    len: usize,
) {
    let all: Vec<u64> = sequences.collect();
    for chunk in all.chunks(len) {
        let run: Vec<EventRecord> = chunk
            .iter()
            .map(|&s| EventRecord::new(ev(id, s, delta("x"))))
            .collect();
        store.append_run_as(&run, writer).await.unwrap();
    }
}

/// The last message of the execution's log, read directly from its events stream.
async fn last_message(backend: &NatsBackend, id: ExecutionId) -> jetstream::message::StreamMessage {
    backend
        .jetstream
        .get_stream(backend.events.stream_of(&id))
        .await
        .unwrap()
        .direct_get_last_for_subject(backend.events.subject(&id))
        .await
        .unwrap()
}

fn sequences(records: &[Arc<EventRecord>]) -> Vec<u64> {
    records.iter().map(|r| r.sequence().get()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_message_and_single_event_messages_of_old_logs_stay_readable() {
    let (_server, _settings, backend, store) = node().await;
    let id = ExecutionId::new_random();
    let subject = backend.events.subject(&id);
    // The log as the previous version wrote it: one event per message, no format header.
    write_as_earlier_versions(&backend.jetstream, &subject, id).await;
    let live = store.subscribe(id, Sequence(0)).await.unwrap().unwrap();
    let live_inside = store.subscribe(id, Sequence(4)).await.unwrap().unwrap();
    let run: Vec<EventRecord> = (3..=6)
        .map(|s| EventRecord::new(ev(id, s, delta(&format!("d{s}")))))
        .collect();
    store.append_run_as(&run, WriterId::random()).await.unwrap();
    assert_eq!(stored_messages(&backend).await, 3, "the run is one message");
    let last = last_message(&backend, id).await;
    assert_eq!(
        last.headers.get("Mrt-Format").map(|v| v.as_str()),
        Some("2")
    );
    let body: Vec<serde_json::Value> = serde_json::from_slice(&last.payload).unwrap();
    assert_eq!(body.len(), 4, "format 2 holds the run as a JSON array");
    // A run of one is written in the old format.
    store.append(ev(id, 7, completed())).await.unwrap();
    let last = last_message(&backend, id).await;
    assert!(last.headers.get("Mrt-Format").is_none());
    assert_eq!(stored_messages(&backend).await, 4);
    // Old and new messages read alike, by direct get, live and from inside the run.
    let all = store.read(id, Sequence(0), 100).await.unwrap().unwrap();
    assert_eq!(sequences(&all), [1, 2, 3, 4, 5, 6, 7]);
    for (stored, appended) in all[2..6].iter().zip(&run) {
        assert_eq!(stored.json, appended.json);
    }
    assert_eq!(sequences(&drain(live).await), [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(sequences(&drain(live_inside).await), [5, 6, 7]);
    let state = store.state(id).await.unwrap().unwrap();
    assert_eq!(state.last_sequence(), Sequence(7));
    assert!(state.is_terminal());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_logs_of_runs_read_in_one_batch_and_long_logs_of_messages_by_the_ordered_consumer() {
    // Up to 64 messages a log is read in one batched direct get, however many events its runs
    // hold; past 64 messages readers use an ordered consumer, which expands runs too.
    let (_server, _, backend, store) = node().await;
    let id = routed(&store).await;
    let writer = WriterId::random();
    append_in_runs(&store, id, writer, 3..=98, 32).await;
    store.append(ev(id, 99, completed())).await.unwrap();
    assert_eq!(stored_messages(&backend).await, 6);
    let all = read(&store, id, 0, usize::MAX).await;
    assert_eq!(sequences(&all), (1..=99).collect::<Vec<_>>());
    let from_inside = store.subscribe(id, Sequence(70)).await.unwrap().unwrap();
    assert_eq!(
        sequences(&drain(from_inside).await),
        (71..=99).collect::<Vec<_>>()
    );

    // 72 messages: 34 runs of two, then single events; every cursor reads the same log.
    let id = routed(&store).await;
    append_in_runs(&store, id, writer, 3..=70, 2).await;
    for seq in 71..=105u64 {
        store.append(ev(id, seq, delta("x"))).await.unwrap();
    }
    store.append(ev(id, 106, completed())).await.unwrap();
    let all = read(&store, id, 0, usize::MAX).await;
    assert_eq!(sequences(&all), (1..=106).collect::<Vec<_>>());
    for after in [0u64, 3, 70, 104] {
        let stream = store.subscribe(id, Sequence(after)).await.unwrap().unwrap();
        assert_eq!(
            sequences(&drain(stream).await),
            (after + 1..=106).collect::<Vec<_>>()
        );
    }
    let (owner, stream) = store
        .owned_subscribe(id, Sequence(0))
        .await
        .unwrap()
        .unwrap();
    assert!(owner.is_default());
    assert_eq!(sequences(&drain(stream).await).len(), 106);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_an_unknown_format_is_refused_not_misread() {
    let (_server, _settings, backend, store) = node().await;
    let id = accepted(&store).await;
    let body = format!(
        "[{}]",
        String::from_utf8(EventRecord::new(ev(id, 2, route())).json.to_vec()).unwrap()
    );
    publish_raw(
        &backend.jetstream,
        backend.events.subject(&id),
        jetstream::message::PublishMessage::build()
            .payload(body.into())
            .header("Mrt-Format", "9"),
    )
    .await
    .unwrap();
    assert!(matches!(
        store.read(id, Sequence(0), 10).await,
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_run_after_a_lost_ack_is_absorbed_and_another_writers_run_is_fenced() {
    let (server, settings, backend, first) = node().await;
    // The retrying side still holds the head from before its run landed (its ack was lost).
    let retrying = event_store(&server, settings).await;
    let id = ExecutionId::new_random();
    first.create(ev(id, 1, EventBody::Accepted)).await.unwrap();
    first.append(ev(id, 2, route())).await.unwrap();
    assert_eq!(
        retrying.head(id).await.unwrap().unwrap().last_sequence,
        Sequence(2)
    );
    let writer = WriterId::random();
    let run: Vec<EventRecord> = (3..=5)
        .map(|s| EventRecord::new(ev(id, s, delta(&format!("d{s}")))))
        .collect();
    first.append_run_as(&run, writer).await.unwrap();
    // The identical run again, by the same writer, compare-and-set on the stale head.
    retrying.append_run_as(&run, writer).await.unwrap();
    // And once more with a fresh view of the log.
    first.append_run_as(&run, writer).await.unwrap();
    assert_eq!(stored_messages(&backend).await, 3, "deduplicated");
    // The same events from another writer are fenced.
    let fenced = retrying
        .append_run_as(&run, WriterId::random())
        .await
        .unwrap_err();
    assert!(
        matches!(fenced.error, StoreError::Conflict { last, .. } if last == Sequence(5)),
        "{fenced:?}"
    );
    assert_eq!(fenced.stored, 0);
    assert_eq!(stored_messages(&backend).await, 3);
    assert_eq!(
        sequences(&first.read(id, Sequence(0), 10).await.unwrap().unwrap()),
        [1, 2, 3, 4, 5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_ids_stay_out_of_the_servers_duplicate_state_and_older_writes_are_recognised() {
    let (server, settings, backend, store) = node().await;
    let id = ExecutionId::new_random();
    store.create(ev(id, 1, EventBody::Accepted)).await.unwrap();
    let writer = WriterId::random();
    store.append_as(ev(id, 2, route()), writer).await.unwrap();
    // The server keeps state for every `Nats-Msg-Id` it stores; appends send none.
    let last = last_message(&backend, id).await;
    assert!(
        last.headers.get("Nats-Msg-Id").is_none(),
        "{:?}",
        last.headers
    );
    assert_eq!(
        last.headers
            .get("Mrt-Msg-Id")
            .map(|v| v.as_str().to_owned()),
        Some(format!("{id}:2:{writer}"))
    );
    // A write stored by an earlier version (its id in `Nats-Msg-Id`) whose acknowledgement was
    // lost: its writer's retry, in a process that never saw it land, is recognised.
    let third = EventRecord::new(ev(id, 3, delta("d3")));
    publish_raw(
        &backend.jetstream,
        backend.events.subject(&id),
        jetstream::message::PublishMessage::build()
            .payload(third.json.clone())
            .message_id(format!("{id}:3:{writer}")),
    )
    .await
    .unwrap();
    let restarted = event_store(&server, settings.clone()).await;
    // The retry sends the very event it sent before (a recognised write must hold it).
    restarted
        .append_as(third.event.clone(), writer)
        .await
        .unwrap();
    // The same sequence from another writer is fenced, and nothing was stored twice.
    assert!(matches!(
        restarted
            .append_as(ev(id, 3, delta("d3")), WriterId::random())
            .await,
        Err(StoreError::Conflict { last, .. }) if last == Sequence(3)
    ));
    assert_eq!(stored_messages(&backend).await, 3);
    restarted.append(ev(id, 4, completed())).await.unwrap();
    assert_eq!(
        sequences(&store.read(id, Sequence(0), 10).await.unwrap().unwrap()),
        [1, 2, 3, 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_larger_than_a_message_are_split_to_fit_it() {
    let (_server, _, backend, store) = node_with_small_messages().await;
    let id = ExecutionId::new_random();
    store.create(ev(id, 1, EventBody::Accepted)).await.unwrap();
    store.append(ev(id, 2, route())).await.unwrap();
    // 12 events of about 1 KiB: three fit in the 3 KiB left for a body.
    let run: Vec<EventRecord> = (3..=14)
        .map(|s| EventRecord::new(ev(id, s, delta(&"x".repeat(900)))))
        .collect();
    store.append_run_as(&run, WriterId::random()).await.unwrap();
    let messages = stored_messages(&backend).await - 2;
    assert!((4..12).contains(&messages), "{messages} messages");
    assert_eq!(
        sequences(&store.read(id, Sequence(0), 100).await.unwrap().unwrap()),
        (1..=14).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_pipelined_writer_stores_the_mock_execution_in_at_most_four_messages() {
    // The mock's 7 events: accepted (the submission), route.selected (acknowledged before the
    // provider call), three deltas, usage and the terminal event handed over back to back.
    // On this one-thread runtime the appender runs only when the runner waits, the way it
    // finds the events queued behind an append in flight.
    let (_server, _, backend, store) = node().await;
    let store: Arc<dyn EventStore> = Arc::new(store);
    let id = ExecutionId::new_random();
    let mut writer = runtime::EventWriter::create(
        Arc::clone(&store),
        id,
        protocol::Timestamp::now(),
        &protocol::Tenant::default(),
    )
    .await
    .unwrap()
    .pipelined();
    assert!(writer.is_pipelined());
    writer.append(route()).await.unwrap();
    for text in ["hello", " from", " mock"] {
        writer.submit(delta(text)).await.unwrap();
    }
    writer.submit(output_usage(3.0)).await.unwrap();
    writer.append(completed()).await.unwrap();
    let messages = stored_messages(&backend).await;
    assert!(messages <= 4, "{messages} messages for 7 events");
    let all = store.read(id, Sequence(0), 10).await.unwrap().unwrap();
    assert_eq!(sequences(&all), [1, 2, 3, 4, 5, 6, 7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_stored_before_owners_existed_belong_to_the_default_tenant() {
    let (_server, _settings, backend, store) = node().await;
    // `execution.accepted` as earlier versions stored it: no owner header.
    let id = ExecutionId::new_random();
    let accepted = EventRecord::new(ev(id, 1, EventBody::Accepted));
    publish_raw(
        &backend.jetstream,
        backend.events.subject(&id),
        jetstream::message::PublishMessage::build()
            .payload(accepted.json.clone())
            .expected_last_subject_sequence(0),
    )
    .await
    .unwrap();
    assert_eq!(
        store.owner(id).await.unwrap(),
        Some(protocol::Tenant::default())
    );
    let (state, owner) = store.owned_state(id).await.unwrap().unwrap();
    assert_eq!(
        (state.last_sequence(), owner.is_default()),
        (Sequence(1), true)
    );
    // A log created for a tenant carries it in the header of its first message only.
    let acme: protocol::Tenant = "acme".parse().unwrap();
    let owned = ExecutionId::new_random();
    store
        .create_owned(ev(owned, 1, EventBody::Accepted), &acme)
        .await
        .unwrap();
    store.append(ev(owned, 2, route())).await.unwrap();
    let first = backend
        .jetstream
        .get_stream(backend.events.stream_of(&owned))
        .await
        .unwrap()
        .direct_get_next_for_subject(backend.events.subject(&owned), Some(1))
        .await
        .unwrap();
    assert_eq!(
        first
            .headers
            .get(runtime::nats::OWNER_HEADER)
            .map(|v| v.as_str()),
        Some("acme")
    );
    assert_eq!(store.owner(owned).await.unwrap(), Some(acme));
}

/// A pull request stays open for the jobs it asked for: jobs published one at a time come
/// through the same request, where each request used to end with the first jobs it found (so
/// a lightly loaded worker paid a request, an inbox subscription and a "no messages" answer for
/// every job). It still never brings more than it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pull_request_brings_jobs_that_arrive_one_at_a_time() {
    let (_server, queue) = one_lane_queue().await;
    let mut deliveries = pull(&queue, 3).await;
    for n in 1..=3 {
        let id = ExecutionId::new_random();
        queue.publish(&job(id)).await.unwrap();
        let delivery = tokio::time::timeout(PROMPT, deliveries.next())
            .await
            .unwrap_or_else(|_| panic!("job {n} never came"))
            .unwrap_or_else(|| panic!("the request ended before job {n}"))
            .unwrap();
        assert_eq!(delivery.job.execution_id, id, "job {n}");
        delivery.handle.ack().await.unwrap();
    }
    // Three asked for, three brought: the request is over, and a fourth job waits for the next.
    let fourth = ExecutionId::new_random();
    queue.publish(&job(fourth)).await.unwrap();
    assert!(
        tokio::time::timeout(PROMPT, deliveries.next())
            .await
            .unwrap()
            .is_none()
    );
    let next = next_delivery(&queue).await;
    assert_eq!(next.job.execution_id, fourth);
    next.handle.ack().await.unwrap();
}

/// The jobs of one pull request, large ones included (decoded on the blocking pool), come
/// whole, each with when this process received it: no earlier than the request was sent, no
/// later than it was handed to the worker (the worker times the job's first heartbeat from
/// it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_of_a_request_come_whole_with_when_they_were_received() {
    let (_server, queue) = one_lane_queue().await;
    let mut large = job(ExecutionId::new_random());
    large.request = serde_json::from_value(serde_json::json!({
        "ability": "text-generation",
        "input": [{"type": "text", "text": "x".repeat(600_000)}],
    }))
    .unwrap();
    let small = job(ExecutionId::new_random());
    queue.publish(&large).await.unwrap();
    queue.publish(&small).await.unwrap();
    let asked = tokio::time::Instant::now();
    let deliveries = pull(&queue, 2).await;
    let came: Vec<_> = tokio::time::timeout(
        PROMPT,
        deliveries
            .map(|d| (d.unwrap(), tokio::time::Instant::now()))
            .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(came.len(), 2);
    for (delivery, yielded) in &came {
        let received = delivery
            .handle
            .received_at()
            .expect("a NATS delivery's reception");
        assert!(asked <= received && received <= *yielded);
        delivery.handle.ack().await.unwrap();
    }
    let jobs: Vec<_> = came.into_iter().map(|(d, _)| d.job).collect();
    assert!(jobs.contains(&large), "the large job came whole");
    assert!(jobs.contains(&small));
}

/// A namespace spreads each partition's jobs over tenant lanes: a subject and a workers'
/// consumer each, so one tenant's backlog waits in its lane and another tenant's job is
/// handed out by its own lane's consumer at once; each delivery says what its lane has left. A restart asking for another lane count is
/// refused, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_backlog_waits_in_its_own_lane() {
    let (server, settings, backend, _store) = node().await;
    let layout = runtime::nats::EventShards::new(settings.namespace.clone(), 1)
        .unwrap()
        .with_lanes(runtime::nats::DEFAULT_TENANT_LANES)
        .unwrap();
    let a: protocol::Tenant = "tenant-a".parse().unwrap();
    let b: protocol::Tenant = (0..)
        .map(|i| format!("tenant-b{i}").parse::<protocol::Tenant>().unwrap())
        .find(|b| layout.lane_of(b.as_str()) != layout.lane_of(a.as_str()))
        .unwrap();
    let stream = backend
        .jetstream
        .get_stream(settings.jobs_stream())
        .await
        .unwrap();
    assert_eq!(
        stream.cached_info().config.subjects,
        layout.jobs_subjects(0),
        "one subject per lane"
    );
    let queue = NatsJobQueue::new(backend.clone());
    queue.reconcile_consumer().await.unwrap();
    assert_eq!(queue.sources(), usize::from(layout.lanes()));
    let mut backlog = Vec::new();
    for _ in 0..20 {
        let mut j = job(ExecutionId::new_random());
        j.tenant = Some(a.clone());
        queue.publish(&j).await.unwrap();
        backlog.push(j.execution_id);
    }
    let mut first_of_b = job(ExecutionId::new_random());
    first_of_b.tenant = Some(b.clone());
    queue.publish(&first_of_b).await.unwrap();

    // b's lane holds b's job alone, handed out at once.
    let lane_b = usize::from(layout.lane_of(b.as_str()));
    let taken = take(&queue, lane_b, 5).await;
    assert_eq!(taken.len(), 1);
    let taken = taken.into_iter().next().unwrap();
    assert_eq!(taken.job.execution_id, first_of_b.execution_id);
    assert_eq!(taken.job.tenant.as_ref(), Some(&b));
    assert_eq!(taken.handle.pending(), Some(0), "b's lane had nothing left");
    taken.handle.ack().await.unwrap();
    // a's lane holds a's backlog in publish order; an empty take ends at once.
    let lane_a = usize::from(layout.lane_of(a.as_str()));
    let firsts = take(&queue, lane_a, 3).await;
    let left: Vec<_> = firsts.iter().map(|d| d.handle.pending()).collect();
    assert_eq!(
        left,
        [Some(19), Some(18), Some(17)],
        "what each delivery's lane had left"
    );
    let firsts: Vec<_> = firsts.into_iter().map(|d| d.job.execution_id).collect();
    assert_eq!(firsts, backlog[..3]);
    let empty = tokio::time::timeout(PROMPT, take(&queue, lane_b, 5))
        .await
        .expect("a take from an empty lane ends at once");
    assert!(empty.is_empty());
    // The consumer of each lane is its own durable, filtered to its subject.
    let consumer = stream
        .consumer_info(layout.jobs_lane_consumer(0, layout.lane_of(a.as_str())))
        .await
        .unwrap();
    assert_eq!(consumer.num_pending, 17);

    let refused = NatsBackend::connect(
        &server.url(),
        NatsSettings {
            tenant_lanes: Some(1),
            ..settings.clone()
        },
        Duration::from_secs(30),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(refused.contains("has 8 tenant lane(s)"), "{refused}");
    assert!(refused.contains("asks for 1"), "{refused}");
}

/// A take (a request that asks for the jobs a lane holds now, without waiting) whose answer
/// never comes, as when it is lost in a reconnect (here the server is gone), ends after the
/// request bound instead of holding its worker's loop for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_the_server_never_answers_ends() {
    let (mut server, _settings, backend, _store) = node().await;
    let queue = NatsJobQueue::new(backend.clone());
    queue.reconcile_consumer().await.unwrap();
    server.kill();
    let taken = tokio::time::timeout(PROMPT, async {
        match queue.take_from(0, 5).await {
            Ok(Some(deliveries)) => deliveries.collect::<Vec<_>>().await.len(),
            _ => 0,
        }
    })
    .await
    .expect("a take the server never answers ends");
    assert_eq!(taken, 0);
}

/// A worker's pull requests answer to one standing inbox per source: after the first, a
/// request changes nothing in the server's subscription list (async-nats's own requests
/// subscribed and removed an inbox each, two writes under the list's lock that every message
/// the server routes waits for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_requests_leave_the_servers_subscription_list_alone() {
    let (server, queue) = one_lane_queue().await;
    let first = ExecutionId::new_random();
    queue.publish(&job(first)).await.unwrap();
    next_delivery(&queue).await.handle.ack().await.unwrap();
    let before = server.subscription_changes();
    let requests: u64 = 12;
    for _ in 0..requests {
        let id = ExecutionId::new_random();
        queue.publish(&job(id)).await.unwrap();
        let delivery = next_delivery(&queue).await;
        assert_eq!(delivery.job.execution_id, id);
        delivery.handle.ack().await.unwrap();
    }
    // Takes (requests that do not wait) as well.
    for _ in 0..requests {
        let taken = take(&queue, 0, 2).await;
        assert!(taken.is_empty(), "the lane is empty");
    }
    let after = server.subscription_changes();
    let changes = (after.0 - before.0) + (after.1 - before.1);
    assert!(
        changes < requests,
        "{changes} subscription-list changes over {} pull requests",
        2 * requests
    );
}

/// A job the server hands to a request its caller gave up on (here dropped before the job
/// was published: the request stays open on the server, and the standing inbox still listens)
/// is handed back by the next request at once and delivered afresh, neither held until its
/// lease runs out nor taken with its lease already running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_comes_after_its_request_was_dropped_is_handed_back_at_once() {
    let (_server, settings, backend, _store) = node_with(NatsSettings {
        tenant_lanes: Some(1),
        ack_wait: Duration::from_secs(120),
        ..fresh_settings()
    })
    .await;
    let queue = NatsJobQueue::new(backend.clone());
    queue.reconcile_consumer().await.unwrap();
    drop(pull(&queue, 1).await);
    let id = ExecutionId::new_random();
    queue.publish(&job(id)).await.unwrap();
    // The server delivered it to the dropped request: none pending, one unacknowledged.
    let stream = backend
        .jetstream
        .get_stream(settings.jobs_stream())
        .await
        .unwrap();
    let until = Instant::now() + PROMPT;
    loop {
        let info = stream
            .consumer_info(settings.workers_consumer())
            .await
            .unwrap();
        if info.num_pending == 0 && info.num_ack_pending == 1 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the job never went to the dropped request"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivery = next_delivery(&queue).await;
    assert_eq!(delivery.job.execution_id, id);
    // Not taken as it lay (its lease running since the server handed it over): handed back,
    // then delivered afresh.
    assert_eq!(delivery.delivered, 2);
    delivery.handle.ack().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logs_head_is_asked_on_the_streams_one_direct_get_subject() {
    // A head asked in the request subject ($JS.API.DIRECT.GET.{stream}.{subject}, as
    // async-nats does) is a subject new to the server for every execution, whose match misses
    // the server's cache and takes its subscription list's write lock.
    let (server, _, backend, store) = node().await;
    let id = routed(&store).await;
    let unknown = ExecutionId::new_random();
    let watcher = async_nats::connect(server.url()).await.unwrap();
    let mut requests = watcher.subscribe("$JS.API.DIRECT.GET.>").await.unwrap();
    // A flush only sends the subscription; a round trip on the same connection comes back
    // after the server has applied it.
    watcher.request("$JS.API.INFO", "".into()).await.unwrap();

    let head = store.head(id).await.unwrap().expect("the log's head");
    assert_eq!(head.last_sequence, Sequence(2));
    assert!(!head.terminal);
    assert!(store.head(unknown).await.unwrap().is_none());

    let stream = backend.events.stream_of(&id);
    for asked in [id, unknown] {
        let request = tokio::time::timeout(PROMPT, requests.next())
            .await
            .expect("the head's request")
            .unwrap();
        assert_eq!(
            request.subject.as_str(),
            format!("$JS.API.DIRECT.GET.{stream}"),
            "the stream's one direct-get subject"
        );
        let body: serde_json::Value = serde_json::from_slice(&request.payload).unwrap();
        assert_eq!(
            body,
            serde_json::json!({ "last_by_subj": backend.events.subject(&asked) })
        );
    }
}
