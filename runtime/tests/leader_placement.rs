//! Leader placement on a real 3-node cluster (`runtime::nats::spawn_leader_placement`): every
//! group of partition k (its events stream, jobs stream and lane consumers) is led from node
//! `n{k}` (the k-th by name), the leaders go back there after that node was killed and
//! restarted, and a namespace with one partition is left alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use async_nats::jetstream;
use runtime::nats::{NatsBackend, NatsJobQueue, NatsSettings, spawn_leader_placement};
use testkit::jetstream::{Group, ask_leader, leader};
use testkit::{NatsCluster, unique_namespace};
use tokio_util::sync::CancellationToken;

/// How long leaders may take to reach their places on a busy 2-core machine: two readings
/// 500 ms apart, then an election per misplaced group.
const PLACED: Duration = Duration::from_secs(90);

/// The groups of partition `k` of `backend`'s namespace: events stream, jobs stream, lane
/// consumers.
fn groups(backend: &NatsBackend, k: u16) -> Vec<Group> {
    let events = &backend.events;
    let mut groups = vec![
        Group::Stream(events.stream(k)),
        Group::Stream(events.jobs_stream(k)),
    ];
    for lane in 0..events.lanes() {
        groups.push(Group::Consumer(
            events.jobs_stream(k),
            events.jobs_lane_consumer(k, lane),
        ));
    }
    groups
}

/// Where every partition's groups are led now, for assertion messages.
async fn leaders(
    js: &jetstream::Context,
    backend: &NatsBackend,
) -> Vec<(u16, Vec<Option<String>>)> {
    let mut out = Vec::new();
    for k in 0..backend.events.count() {
        let mut of_k = Vec::new();
        for group in groups(backend, k) {
            of_k.push(leader(js, &group).await);
        }
        out.push((k, of_k));
    }
    out
}

/// Waits until every group of partition k is led from `cluster`'s node k.
async fn wait_placed(js: &jetstream::Context, backend: &NatsBackend, cluster: &NatsCluster) {
    let deadline = Instant::now() + PLACED;
    loop {
        let now = leaders(js, backend).await;
        let placed = now.iter().all(|(k, of_k)| {
            of_k.iter()
                .all(|l| l.as_deref() == Some(cluster.server_name(usize::from(*k))))
        });
        if placed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "leaders not in their places within {PLACED:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Asks every group of the namespace to be led from node `to`, and waits until it is.
async fn gather_on(js: &jetstream::Context, backend: &NatsBackend, to: &str) {
    let deadline = Instant::now() + PLACED;
    for k in 0..backend.events.count() {
        for group in groups(backend, k) {
            while leader(js, &group).await.as_deref() != Some(to) {
                ask_leader(js, &group, to).await;
                assert!(Instant::now() < deadline, "{group:?} not gathered on {to}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

async fn connect(cluster: &NatsCluster, partitions: u16) -> NatsBackend {
    let settings = NatsSettings {
        replicas: 3,
        event_shards: Some(partitions),
        tenant_lanes: Some(2),
        ..NatsSettings::new(unique_namespace("p"))
    };
    let backend = NatsBackend::connect(&cluster.url(), settings, Duration::from_secs(60))
        .await
        .unwrap();
    // The lanes' consumers, as a worker creates them.
    NatsJobQueue::new(backend.clone())
        .reconcile_consumer()
        .await
        .unwrap();
    backend
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_partition_is_led_from_a_node_of_its_own_and_goes_back_there_after_a_restart() {
    let mut cluster = NatsCluster::start(3);
    let backend = connect(&cluster, 3).await;
    let js = backend.jetstream.clone();
    // Every leader on one node: the state a restart leaves, which nothing else undoes.
    gather_on(&js, &backend, cluster.server_name(0)).await;

    let stop = CancellationToken::new();
    let task = spawn_leader_placement(&backend, Duration::from_millis(500), stop.clone())
        .expect("3 partitions of 3 replicas are placed");
    wait_placed(&js, &backend, &cluster).await;

    // Node 1 dies: partition 1's groups are led elsewhere while it is away...
    cluster.kill(1);
    let away = Instant::now() + PLACED;
    for group in groups(&backend, 1) {
        loop {
            let now = leader(&js, &group).await;
            if now.is_some() && now.as_deref() != Some(cluster.server_name(1)) {
                break;
            }
            assert!(
                Instant::now() < away,
                "{group:?} has no new leader: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // ...and once it is back and has caught up, they return to it.
    cluster.restart(1);
    cluster.wait_healthy(1);
    wait_placed(&js, &backend, &cluster).await;

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("placement stops when told")
        .unwrap();
    // One partition has nothing to spread: no task.
    let single = connect(&cluster, 1).await;
    assert!(spawn_leader_placement(&single, Duration::from_millis(500), stop).is_none());
}
