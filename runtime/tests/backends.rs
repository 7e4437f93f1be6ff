//! The contract suite against real backends: a private nats-server (JetStream, file storage)
//! and a private redis-server, both on free ports, per test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::sync::Arc;
use std::time::Duration;

use protocol::event::EventBody;
use protocol::{ExecutionId, RuntimeError, RuntimeEvent, Sequence, Tenant, Timestamp};
use runtime::nats::{NatsCancelBus, NatsJobQueue};
use runtime::quota::RedisQuotaStore;
use runtime::redis_idempotency::RedisIdempotencyStore;
use runtime::{Admission, AdmitRequest, QuotaLimits, QuotaStore};
use runtime::{CancelBus, EventStore, JobQueue, StoreError, contract};
use testkit::{NatsServer, RedisServer, unique_namespace};

mod support;
use support::{MAX_EVENTS, backend, event_store, fresh_settings, store_on, two_processes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_event_store_passes_the_contract() {
    let server = NatsServer::start();
    let store = store_on(&backend(&server).await, MAX_EVENTS).await;
    contract::event_store_suite(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_event_store_limits_runs_like_events() {
    let server = NatsServer::start();
    let store = store_on(&backend(&server).await, 5).await;
    contract::run_limit_suite(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_job_queue_passes_the_contract() {
    let server = NatsServer::start();
    contract::job_queue_suite(Arc::new(NatsJobQueue::new(backend(&server).await))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cancel_bus_passes_the_contract() {
    let server = NatsServer::start();
    let bus = Arc::new(NatsCancelBus::new(backend(&server).await).await.unwrap());
    contract::cancel_suite(bus.clone()).await;
    assert_eq!(bus.watched(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_idempotency_passes_the_contract() {
    let server = RedisServer::start();
    let store = RedisIdempotencyStore::connect(
        &server.url(),
        &unique_namespace("t"),
        Duration::from_secs(60),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    contract::idempotency_suite(Arc::new(store)).await;
}

async fn redis_quota_store(server: &RedisServer, namespace: &str) -> RedisQuotaStore {
    let idempotency = RedisIdempotencyStore::connect(
        &server.url(),
        namespace,
        Duration::from_secs(60),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    RedisQuotaStore::new(idempotency.connection(), namespace)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_quota_store_passes_the_contract() {
    let server = RedisServer::start();
    let store = redis_quota_store(&server, &unique_namespace("t")).await;
    contract::quota_suite(Arc::new(store)).await;
}

/// Two gateways' stores (separate connections, one namespace) share the tenant's cap; another
/// namespace shares nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_quotas_hold_across_connections_and_stay_in_their_namespace() {
    let server = RedisServer::start();
    let namespace = unique_namespace("t");
    let stores = [
        Arc::new(redis_quota_store(&server, &namespace).await),
        Arc::new(redis_quota_store(&server, &namespace).await),
    ];
    let limits = QuotaLimits::new(Some(5), None, None).unwrap();
    let acme: Tenant = "acme".parse().unwrap();
    let hold = Duration::from_secs(600);
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let store = Arc::clone(&stores[i % 2]);
            let acme = acme.clone();
            tokio::spawn(async move {
                let id = ExecutionId::new_random();
                let request = AdmitRequest {
                    tenant: &acme,
                    limits: &limits,
                    execution: id,
                    hold,
                };
                (id, store.admit(request).await.unwrap())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    for task in tasks {
        let (id, answer) = task.await.unwrap();
        if answer == Admission::Admitted {
            admitted.push(id);
        }
    }
    assert_eq!(admitted.len(), 5);
    // A slot taken through one connection is released through the other.
    stores[1].release(&acme, &admitted[..1]).await.unwrap();
    let request = AdmitRequest {
        tenant: &acme,
        limits: &limits,
        execution: ExecutionId::new_random(),
        hold,
    };
    assert_eq!(stores[0].admit(request).await.unwrap(), Admission::Admitted);
    let elsewhere = redis_quota_store(&server, &unique_namespace("t")).await;
    assert_eq!(
        elsewhere
            .admit(AdmitRequest {
                execution: ExecutionId::new_random(),
                ..request
            })
            .await
            .unwrap(),
        Admission::Admitted,
        "another namespace is another deployment"
    );
    assert!(elsewhere.holders(&acme, 10).await.unwrap().len() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_requested_in_another_process_reaches_the_watcher() {
    let (_server, worker_side, gateway_side) = two_processes().await;
    let worker_bus = NatsCancelBus::new(worker_side).await.unwrap();
    let gateway_bus = NatsCancelBus::new(gateway_side).await.unwrap();
    let id = ExecutionId::new_random();
    let token = worker_bus.watch(id);
    gateway_bus.request(id).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), token.cancelled())
        .await
        .unwrap();
}

/// A mark stored without its core message (lost in a disconnect, or written by a process that
/// died before publishing it) still cancels the watcher: processes follow the bucket itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_without_its_core_message_still_cancels_the_watcher() {
    let (_server, worker_side, other) = two_processes().await;
    let bucket = other.settings.cancel_bucket();
    let worker_bus = NatsCancelBus::new(worker_side).await.unwrap();
    let id = ExecutionId::new_random();
    let token = worker_bus.watch(id);
    let untouched = worker_bus.watch(ExecutionId::new_random());
    let kv = other.jetstream.get_key_value(bucket).await.unwrap();
    kv.put(id.to_string(), bytes::Bytes::from_static(b"1"))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), token.cancelled())
        .await
        .unwrap();
    assert!(
        !untouched.is_cancelled(),
        "a mark cancels its execution only"
    );
}

/// A watcher's process keeps following the marks across a restart of the server: a cancel
/// requested afterwards reaches it, and so does a mark stored afterwards without its core
/// message (the watch is started again once the connection reconnected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_follows_the_marks_across_a_server_restart() {
    let mut server = NatsServer::start();
    let settings = fresh_settings();
    let worker_bus = NatsCancelBus::new(support::connect(&server, settings.clone()).await)
        .await
        .unwrap();
    let (requested, marked) = (ExecutionId::new_random(), ExecutionId::new_random());
    let tokens = [worker_bus.watch(requested), worker_bus.watch(marked)];
    server.restart();
    // The other side connects after the restart; its writes may meet a server still starting
    // JetStream, so each is retried until it is stored.
    let other = support::connect(&server, settings.clone()).await;
    let kv = other
        .jetstream
        .get_key_value(settings.cancel_bucket())
        .await
        .unwrap();
    let gateway_bus = NatsCancelBus::new(other).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = gateway_bus.request(requested).await {
        assert!(tokio::time::Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while let Err(e) = kv
        .put(marked.to_string(), bytes::Bytes::from_static(b"1"))
        .await
    {
        assert!(tokio::time::Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for token in tokens {
        tokio::time::timeout(Duration::from_secs(30), token.cancelled())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_instance_is_fenced_like_another_process() {
    // Two store instances with separate head caches race on one log: CAS in the server, not
    // the cache, decides.
    let (_server, a, b) = two_processes().await;
    let (a, b) = (
        store_on(&a, MAX_EVENTS).await,
        store_on(&b, MAX_EVENTS).await,
    );
    let id = ExecutionId::new_random();
    let ev = |seq, body| RuntimeEvent::new(id, Sequence(seq), Timestamp::now(), body);
    a.create(ev(1, EventBody::Accepted)).await.unwrap();
    // b learns the head (seq 1), then a appends seq 2: b's cached head is stale.
    assert_eq!(
        b.head(id).await.unwrap().unwrap().last_sequence,
        Sequence(1)
    );
    a.append(ev(
        2,
        EventBody::Failed {
            error: RuntimeError::cancelled(),
        },
    ))
    .await
    .unwrap();
    let stale = b.append(ev(2, contract::delta("x"))).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { terminal: true, .. })),
        "{stale:?}"
    );
    let too_late = b.append(ev(3, contract::delta("x"))).await;
    assert!(
        matches!(too_late, Err(StoreError::Conflict { terminal: true, .. })),
        "{too_late:?}"
    );
    assert!(matches!(
        a.create(ev(1, EventBody::Accepted)).await,
        Err(StoreError::AlreadyExists)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_a_server_restart() {
    let mut server = NatsServer::start();
    let settings = fresh_settings();
    let store = event_store(&server, settings).await;
    let id = contract::accepted(&store).await;
    for seq in 2..=20 {
        let body = if seq == 2 {
            EventBody::RouteSelected {
                target: protocol::Target {
                    provider: "p".into(),
                    model: "m".into(),
                },
                attempt: 1,
            }
        } else {
            EventBody::OutputDelta {
                output_index: 0,
                delta: format!("{seq}"),
            }
        };
        store
            .append(RuntimeEvent::new(id, Sequence(seq), Timestamp::now(), body))
            .await
            .unwrap();
    }
    server.restart();
    // The client reconnects by itself; reads succeed once it has.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let state = loop {
        match store.state(id).await {
            Ok(Some(state)) => break state,
            other if tokio::time::Instant::now() < deadline => {
                let _ = other;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("no state after restart: {other:?}"),
        }
    };
    assert_eq!(state.last_sequence(), Sequence(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_reported_promptly() {
    let mut server = NatsServer::start();
    let b = backend(&server).await;
    let queue = NatsJobQueue::new(b.clone());
    let store = store_on(&b, MAX_EVENTS).await;
    server.kill();
    let id = ExecutionId::new_random();
    let started = std::time::Instant::now();
    // Wait until the client notices the disconnect, then every call fails fast.
    loop {
        let r = store
            .create(contract::event(id, 1, EventBody::Accepted))
            .await;
        if matches!(r, Err(StoreError::Unavailable(_))) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still not unavailable: {r:?}"
        );
    }
    assert!(queue.ready().await.is_err());
    assert!(store.ready().await.is_err());
}

/// Over JetStream (three partitions): the sweeper reads jobs in batches, drops finished jobs
/// once they leave their jobs stream (also behind a job held at the front of its partition,
/// by listing the partition), and closes at its deadline one acknowledged while its log was
/// still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_drops_finished_jobs_and_closes_open_ones_over_jetstream() {
    use runtime::{DeadlineSweeper, EventWriter, Job, SweeperSettings};

    let server = NatsServer::start();
    let backend = backend(&server).await;
    let layout = backend.events.clone();
    let store: Arc<dyn EventStore> = Arc::new(support::store_on(&backend, MAX_EVENTS).await);
    let queue: Arc<dyn JobQueue> = Arc::new(NatsJobQueue::new(backend));
    // Executions of partition 0, where a job will be held at the front.
    let in_partition_0 = || loop {
        let id = ExecutionId::new_random();
        if layout.shard_of(&id) == 0 {
            return id;
        }
    };
    let submit = |id: ExecutionId, deadline_in_ms: i64| {
        let (store, queue) = (Arc::clone(&store), Arc::clone(&queue));
        async move {
            let accepted_at = Timestamp::now();
            let writer = EventWriter::create(store, id, accepted_at, &Tenant::default())
                .await
                .unwrap();
            let job = Job {
                deadline_at: Timestamp::from_unix_millis(
                    accepted_at.unix_millis() + deadline_in_ms,
                ),
                ..contract::job(id)
            };
            queue.publish(&job).await.unwrap();
            writer
        }
    };
    // More jobs than one scan request brings, so the scan takes several batches.
    let settings = SweeperSettings {
        grace: Duration::ZERO,
        scan_batch: 8,
        ..SweeperSettings::default()
    };
    let front = in_partition_0();
    submit(front, 600_000).await;
    let mut writers = std::collections::HashMap::new();
    for _ in 0..20 {
        let id = in_partition_0();
        writers.insert(id, submit(id, 600_000).await);
    }
    let open = ExecutionId::new_random();
    submit(open, 3_000).await;
    let mut sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings);
    assert_eq!(sweeper.sweep().await.scanned, 22);
    assert_eq!(sweeper.indexed(), 22);
    assert_eq!(sweeper.sweep().await.scanned, 0, "each job is read once");
    // A worker holds the front job (it runs on), finishes the 20 after it and acknowledges
    // every other job, the open one's too.
    let mut held = None;
    for _ in 0..22 {
        let delivery = queue.receive().await.unwrap().unwrap();
        let id = delivery.job.execution_id;
        if id == front {
            held = Some(delivery);
            continue;
        }
        if let Some(mut writer) = writers.remove(&id) {
            writer.append(contract::completed()).await.unwrap();
        }
        delivery.handle.ack().await.unwrap();
    }
    assert!(held.is_some());
    // The finished ones leave the index although the front job keeps its partition's start
    // back (21 indexed there against 1 held: the partition is listed); the open one is not
    // settled (its log is open) but closed once its deadline passes.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let (mut settled, mut closed) = (0, 0);
    while settled < 20 || closed < 1 {
        assert!(
            tokio::time::Instant::now() < until,
            "settled {settled}, closed {closed}"
        );
        let report = sweeper.sweep().await;
        settled += report.settled;
        closed += report.closed;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((settled, closed), (20, 1));
    let head = store.head(open).await.unwrap().unwrap();
    assert!(head.terminal);
    assert_eq!(sweeper.indexed(), 1, "the running front job stays");
    assert_eq!(sweeper.sweep().await, runtime::SweepReport::default());
}

/// On a 3-node cluster with three replicas, where any replica may answer a direct get:
/// `heads` reads every log's head (multi-subject gets answered by followers too),
/// `latest_head` the leader's, and the sweeper settles finished jobs by the jobs streams' first sequences, read from their leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_and_settling_work_on_a_replicated_cluster() {
    use runtime::nats::{NatsBackend, NatsSettings};
    use runtime::{DeadlineSweeper, EventWriter, Job, SweeperSettings};

    let cluster = testkit::NatsCluster::start(3);
    let settings = NatsSettings {
        replicas: 3,
        event_shards: Some(3),
        reader_lanes: true,
        ..NatsSettings::new(unique_namespace("t"))
    };
    let backend = NatsBackend::connect(&cluster.url(), settings, Duration::from_secs(60))
        .await
        .unwrap();
    let store: Arc<dyn EventStore> = Arc::new(support::store_on(&backend, MAX_EVENTS).await);
    let queue: Arc<dyn JobQueue> = Arc::new(NatsJobQueue::new(backend));
    let mut writers = Vec::new();
    for _ in 0..60 {
        let id = ExecutionId::new_random();
        let accepted_at = Timestamp::now();
        let writer = EventWriter::create(Arc::clone(&store), id, accepted_at, &Tenant::default())
            .await
            .unwrap();
        let job = Job {
            deadline_at: Timestamp::from_unix_millis(accepted_at.unix_millis() + 600_000),
            ..contract::job(id)
        };
        queue.publish(&job).await.unwrap();
        writers.push((id, writer));
    }
    let ids: Vec<ExecutionId> = writers.iter().map(|(id, _)| *id).collect();
    let mut sweeper = DeadlineSweeper::new(
        Arc::clone(&store),
        Arc::clone(&queue),
        SweeperSettings::default(),
    );
    // A scan answered by a follower a little behind may bring fewer at first.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut scanned = 0;
    while scanned < 60 {
        assert!(tokio::time::Instant::now() < until, "scanned {scanned}");
        scanned += sweeper.sweep().await.scanned;
    }
    // Every job is acknowledged, every other execution's log closed first (the other half
    // as a fenced worker leaves them: acknowledged, the log open).
    let mut closed = std::collections::HashSet::new();
    for _ in 0..60 {
        let delivery = queue.receive().await.unwrap().unwrap();
        let id = delivery.job.execution_id;
        if ids.iter().position(|i| *i == id).unwrap() % 2 == 0 {
            let (_, writer) = writers.iter_mut().find(|(i, _)| *i == id).unwrap();
            writer.append(contract::completed()).await.unwrap();
            closed.insert(id);
        }
        delivery.handle.ack().await.unwrap();
    }
    // The leader answers what was acknowledged at once.
    for id in &ids {
        let head = store.latest_head(*id).await.unwrap().unwrap();
        assert_eq!(head.terminal, closed.contains(id), "{id}");
        assert_eq!(head.last_sequence.get(), if head.terminal { 2 } else { 1 });
    }
    loop {
        assert!(tokio::time::Instant::now() < until, "heads never caught up");
        let heads = store.heads(&ids).await.unwrap();
        let terminal: std::collections::HashSet<ExecutionId> = ids
            .iter()
            .zip(&heads)
            .filter(|(_, h)| h.unwrap().terminal)
            .map(|(id, _)| *id)
            .collect();
        if terminal == closed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The finished half leaves the index once the leaders' first sequences pass them; the
    // open half stays, for its deadline.
    let mut settled = 0;
    while settled < 30 {
        assert!(tokio::time::Instant::now() < until, "settled {settled}");
        settled += sweeper.sweep().await.settled;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(settled, 30);
    assert_eq!(sweeper.indexed(), 30);
}

/// On a 3-node cluster with three replicas, a read of a log's state shows every event
/// acknowledged before the read began, whichever node's replica answers its direct get. A
/// follower that has not applied the leader's latest appends answers an older log: a client
/// that had read the terminal event from its event stream then got "running" from a status
/// read and 409 from a result read. Logs are written through one node, many at once (a
/// follower lags under load), and each is read as soon as it is closed through every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_read_on_a_replicated_cluster_shows_every_acknowledged_event() {
    use runtime::nats::{NatsBackend, NatsSettings};

    let cluster = testkit::NatsCluster::start(3);
    let namespace = unique_namespace("t");
    let mut stores = Vec::new();
    for node in 0..3 {
        let settings = NatsSettings {
            replicas: 3,
            ..NatsSettings::new(namespace.clone())
        };
        let backend =
            NatsBackend::connect(&cluster.node_url(node), settings, Duration::from_secs(60))
                .await
                .unwrap();
        stores.push(support::store_on(&backend, MAX_EVENTS).await);
    }
    let stores = Arc::new(stores);
    let mut tasks = Vec::new();
    for task in 0..64 {
        let stores = Arc::clone(&stores);
        tasks.push(tokio::spawn(async move {
            let mut stale = Vec::new();
            for round in 0..10 {
                let writer = &stores[0];
                let id = contract::accepted(writer).await;
                let bodies = [
                    contract::route_selected(),
                    contract::delta("a"),
                    contract::completed(),
                ];
                for (seq, body) in (2..).zip(bodies) {
                    writer.append(contract::event(id, seq, body)).await.unwrap();
                }
                for (node, reader) in stores.iter().enumerate() {
                    let state = reader.state(id).await.unwrap().unwrap();
                    if state.last_sequence() != Sequence(4) || !state.is_terminal() {
                        stale.push((task, round, node, "state", state.last_sequence().get()));
                    }
                    let events = reader.read(id, Sequence::ZERO, 100).await.unwrap().unwrap();
                    if events.len() != 4 {
                        stale.push((task, round, node, "read", events.len() as u64));
                    }
                }
            }
            stale
        }));
    }
    let mut stale = Vec::new();
    for task in tasks {
        stale.extend(task.await.unwrap());
    }
    assert!(
        stale.is_empty(),
        "{} stale reads (task, round, node, read, last): {stale:?}",
        stale.len()
    );
}
