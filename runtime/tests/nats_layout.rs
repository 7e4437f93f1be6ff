//! The JetStream layout against a private nats-server: live readers see stored events only, and
//! a process started with other settings reconciles the streams, the workers' consumer and the
//! cancel bucket instead of keeping the first process's values.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use protocol::event::EventBody;
use protocol::{ExecutionId, Sequence};
use runtime::contract::{completed, delta, event as ev, job, route_selected as route};
use runtime::nats::{NatsBackend, NatsCancelBus, NatsEventStore, NatsJobQueue, NatsSettings};
use runtime::{EventRecord, EventStore, EventStream, JobQueue, StoreError, WriterId};
use testkit::{NatsServer, unique_namespace};

const PROMPT: Duration = Duration::from_secs(20);

async fn connect(server: &NatsServer, settings: NatsSettings) -> NatsBackend {
    NatsBackend::connect(&server.url(), settings, Duration::from_secs(30))
        .await
        .unwrap()
}

/// Everything a subscription yields until it ends.
async fn drain(mut stream: EventStream) -> Vec<Arc<EventRecord>> {
    let mut out = Vec::new();
    while let Some(item) = tokio::time::timeout(PROMPT, stream.next()).await.unwrap() {
        out.push(item.unwrap());
    }
    out
}

fn json_of(records: &[Arc<EventRecord>]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.json.to_vec()).unwrap())
        .collect()
}

/// The log as stored, for comparison with what readers saw.
async fn stored(store: &NatsEventStore, id: ExecutionId) -> Vec<String> {
    json_of(
        &store
            .read(id, Sequence(0), usize::MAX)
            .await
            .unwrap()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_appends_the_stream_refused_or_never_stored() {
    let server = NatsServer::start();
    let settings = NatsSettings {
        max_event_bytes: 4096,
        ..NatsSettings::new(unique_namespace("t"))
    };
    let backend = connect(&server, settings.clone()).await;
    let store = NatsEventStore::new(backend.clone(), 4096).await.unwrap();
    let id = ExecutionId::new_random();
    store.create(ev(id, 1, EventBody::Accepted)).await.unwrap();
    store.append(ev(id, 2, route())).await.unwrap();
    // Readers on their own connection (another gateway), subscribed before the ghosts.
    let reader_side = NatsEventStore::new(connect(&server, settings.clone()).await, 4096)
        .await
        .unwrap();
    let from_start = reader_side
        .subscribe(id, Sequence(0))
        .await
        .unwrap()
        .unwrap();
    let from_two = reader_side
        .subscribe(id, Sequence(2))
        .await
        .unwrap()
        .unwrap();
    let subject = settings.events_subject(&id);
    let ghost = |text: &str| EventRecord::new(ev(id, 3, delta(text))).json;

    // A fenced writer: its compare-and-set names a stream sequence that is no longer the last
    // of the subject, so the stream refuses the append.
    let refused = backend
        .jetstream
        .send_publish(
            subject.clone(),
            jetstream::message::PublishMessage::build()
                .payload(ghost("fenced"))
                .expected_last_subject_sequence(1),
        )
        .await
        .unwrap()
        .await;
    assert!(
        refused.is_err(),
        "the stream must refuse a stale compare-and-set"
    );
    // An append the stream never stores: over its message size limit (as good as a publish
    // whose leader was lost: core subscribers of the write subject still receive it).
    let big = EventRecord::new(ev(id, 3, delta(&"x".repeat(8192)))).json;
    let unstored = backend
        .jetstream
        .send_publish(
            subject.clone(),
            jetstream::message::PublishMessage::build().payload(big),
        )
        .await
        .unwrap()
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
    assert_eq!(json_of(&drain(from_start).await), log);
    assert_eq!(json_of(&drain(from_two).await), log[2..].to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_exactly_the_log_while_writers_on_other_connections_race() {
    // Writers on separate connections (separate processes) race for every sequence; the losers
    // are fenced by compare-and-set. Readers on a third connection must show exactly the log.
    let server = NatsServer::start();
    let settings = NatsSettings::new(unique_namespace("t"));
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(Arc::new(
            NatsEventStore::new(connect(&server, settings.clone()).await, 4096)
                .await
                .unwrap(),
        ));
    }
    let readers = NatsEventStore::new(connect(&server, settings.clone()).await, 4096)
        .await
        .unwrap();
    for _round in 0..10 {
        let id = ExecutionId::new_random();
        writers[0]
            .create(ev(id, 1, EventBody::Accepted))
            .await
            .unwrap();
        writers[0].append(ev(id, 2, route())).await.unwrap();
        let subscriptions = [
            readers.subscribe(id, Sequence(0)).await.unwrap().unwrap(),
            readers.subscribe(id, Sequence(2)).await.unwrap().unwrap(),
        ];
        let mut tasks = Vec::new();
        for (w, store) in writers.iter().enumerate() {
            let store = Arc::clone(store);
            tasks.push(tokio::spawn(async move {
                let writer = WriterId::random();
                for seq in 3..=12u64 {
                    let body = if seq == 12 {
                        completed()
                    } else {
                        delta(&format!("writer {w} seq {seq}"))
                    };
                    match store.append_as(ev(id, seq, body), writer).await {
                        Ok(()) | Err(StoreError::Conflict { .. }) => {}
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let log = stored(&readers, id).await;
        let [from_start, from_two] = subscriptions;
        assert_eq!(json_of(&drain(from_start).await), log);
        assert_eq!(json_of(&drain(from_two).await), log[2..].to_vec());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_stream_created_without_republish_gets_it_at_startup() {
    let server = NatsServer::start();
    let settings = NatsSettings::new(unique_namespace("t"));
    // The stream as earlier versions created it.
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: settings.events_stream(),
        subjects: vec![format!("{}.events.*", settings.namespace)],
        storage: stream::StorageType::File,
        max_age: settings.retention,
        allow_direct: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let store = NatsEventStore::new(connect(&server, settings.clone()).await, 4096)
        .await
        .unwrap();
    let info = js
        .get_stream(settings.events_stream())
        .await
        .unwrap()
        .cached_info()
        .clone();
    assert!(info.config.republish.is_some(), "{:?}", info.config);
    // Live delivery works through it.
    let id = ExecutionId::new_random();
    store.create(ev(id, 1, EventBody::Accepted)).await.unwrap();
    let live = store.subscribe(id, Sequence(1)).await.unwrap().unwrap();
    store.append(ev(id, 2, route())).await.unwrap();
    store.append(ev(id, 3, completed())).await.unwrap();
    assert_eq!(drain(live).await.len(), 2);
}

async fn consumer_ack_wait(backend: &NatsBackend) -> Duration {
    let s = &backend.settings;
    let stream = backend.jetstream.get_stream(s.jobs_stream()).await.unwrap();
    stream
        .consumer_info(s.workers_consumer())
        .await
        .unwrap()
        .config
        .ack_wait
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
    assert_eq!(
        queue.reconcile_consumer().await.unwrap(),
        Duration::from_secs(3)
    );
    assert_eq!(consumer_ack_wait(&first).await, Duration::from_secs(3));

    // "Restart" with the default of 30 s: the server's consumer follows.
    let second = connect(&server, NatsSettings::new(namespace.clone())).await;
    let restarted = NatsJobQueue::new(second.clone());
    assert_eq!(
        restarted.reconcile_consumer().await.unwrap(),
        Duration::from_secs(30)
    );
    assert_eq!(consumer_ack_wait(&second).await, Duration::from_secs(30));

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
    let held = tokio::time::timeout(PROMPT, short.receive())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(held.job.execution_id, id);
    let lost_at = Instant::now();
    drop(held); // the holder dies: no ack, no heartbeat
    let again = tokio::time::timeout(PROMPT, short.receive())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(again.job.execution_id, id);
    assert_eq!(again.delivered, 2);
    let waited = lost_at.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "redelivered after {waited:?}: the 3 s lease was not applied"
    );
    again.handle.ack().await.unwrap();
}

async fn first_delivery_follows_the_server(queue: &NatsJobQueue, want: Duration) {
    let id = ExecutionId::new_random();
    queue.publish(&job(id)).await.unwrap();
    let delivery = tokio::time::timeout(PROMPT, queue.receive())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
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
    let consumer = js
        .get_stream(larger.jobs_stream())
        .await
        .unwrap()
        .consumer_info(larger.workers_consumer())
        .await
        .unwrap();
    assert_eq!(consumer.config.max_ack_pending, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_jetstream_cannot_change_stops_the_start_and_is_named() {
    let server = NatsServer::start();
    let settings = NatsSettings::new(unique_namespace("t"));
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
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
    .await
    .unwrap();
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
    let settings = NatsSettings::new(unique_namespace("t"));
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
            for name in [
                settings.events_stream(),
                settings.jobs_stream(),
                format!("KV_{}", settings.cancel_bucket()),
            ] {
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
            vec![replicas; 3],
            "after a start with {replicas} replicas"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_stored_before_owners_existed_belong_to_the_default_tenant() {
    let server = NatsServer::start();
    let settings = NatsSettings::new(unique_namespace("t"));
    let backend = connect(&server, settings.clone()).await;
    let store = NatsEventStore::new(backend.clone(), 4096).await.unwrap();
    // `execution.accepted` as earlier versions stored it: no owner header.
    let id = ExecutionId::new_random();
    let accepted = EventRecord::new(ev(id, 1, EventBody::Accepted));
    backend
        .jetstream
        .send_publish(
            settings.events_subject(&id),
            jetstream::message::PublishMessage::build()
                .payload(accepted.json.clone())
                .expected_last_subject_sequence(0),
        )
        .await
        .unwrap()
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
        .get_stream(settings.events_stream())
        .await
        .unwrap()
        .direct_get_next_for_subject(settings.events_subject(&owned), Some(1))
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
