//! Where the event store's reads travel, against a private nats-server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::event::EventBody;
use protocol::{ExecutionId, Sequence};
use testkit::{NatsServer, unique_namespace};

use super::NatsEventStore;
use crate::EventStore;
use crate::contract::{completed, delta, drain, event, route_selected};
use crate::nats::{NatsBackend, NatsSettings};

const PARTITIONS: u16 = 4;
/// Events appended one message each to every execution below.
const EVENTS: u64 = 24;

/// Messages received so far on each readers' connection of `backend`.
fn received(backend: &NatsBackend) -> Vec<u64> {
    backend
        .readers
        .iter()
        .map(|r| r.client.statistics().in_messages.load(Ordering::Relaxed))
        .collect()
}

/// A fresh execution id of partition `partition`.
fn id_in(backend: &NatsBackend, partition: u16) -> ExecutionId {
    loop {
        let id = ExecutionId::new_random();
        if backend.events.shard_of(&id) == partition {
            return id;
        }
    }
}

/// With reader lanes (a gateway), each partition's logs are read on its lane's own readers'
/// connection: reading one execution to its end brings its messages in on that connection
/// alone, so a gateway's live reads are spread over as many connections as it has lanes.
/// Without (a worker), one readers' connection serves every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_partitions_logs_are_read_on_its_lanes_readers_connection() {
    let server = NatsServer::start();
    let settings = NatsSettings {
        event_shards: Some(PARTITIONS),
        reader_lanes: true,
        ..NatsSettings::new(unique_namespace("t"))
    };
    let url = server.url();
    let connect = |settings| NatsBackend::connect(&url, settings, Duration::from_secs(30));
    let backend = connect(settings.clone()).await.unwrap();
    assert_eq!(backend.readers.len(), usize::from(PARTITIONS));
    let connections: HashSet<u64> = backend
        .readers
        .iter()
        .map(|r| r.client.server_info().client_id)
        .collect();
    assert_eq!(
        connections.len(),
        usize::from(PARTITIONS),
        "one connection each"
    );
    let store = NatsEventStore::new(backend.clone(), 4096).await.unwrap();
    for partition in 0..PARTITIONS {
        let id = id_in(&backend, partition);
        store
            .create(event(id, 1, EventBody::Accepted))
            .await
            .unwrap();
        store.append(event(id, 2, route_selected())).await.unwrap();
        for seq in 3..EVENTS {
            store.append(event(id, seq, delta("x"))).await.unwrap();
        }
        store.append(event(id, EVENTS, completed())).await.unwrap();
        let before = received(&backend);
        let stream = store.subscribe(id, Sequence(0)).await.unwrap().unwrap();
        assert_eq!(drain(stream).await.len(), EVENTS as usize);
        let after = received(&backend);
        for (lane, (b, a)) in before.iter().zip(&after).enumerate() {
            let got = a - b;
            if lane == usize::from(partition) {
                assert!(
                    got >= EVENTS,
                    "partition {partition}: {got} messages on its lane"
                );
            } else {
                // At most the answers to a quorum probe or two (one a second per connection).
                assert!(
                    got < 4,
                    "partition {partition}: {got} messages on lane {lane}"
                );
            }
        }
    }

    let one = connect(NatsSettings {
        reader_lanes: false,
        ..settings
    })
    .await
    .unwrap();
    assert_eq!(one.readers.len(), 1);
}

#[test]
fn a_head_behind_what_the_writer_knows_is_stored_is_a_stale_read() {
    use super::stale_read;
    // The writer appends the run from 6: events up to 5 are stored.
    let known = Sequence(5);
    assert!(
        stale_read(Some(Sequence(3)), known),
        "a replica behind the leader"
    );
    assert!(
        stale_read(None, known),
        "a replica that has not the log yet"
    );
    assert!(
        !stale_read(Some(Sequence(5)), known),
        "the head the writer expects"
    );
    assert!(
        !stale_read(Some(Sequence(7)), known),
        "past it: another writer's events, or ours acknowledged late: decided as before"
    );
    // A log's first append knows nothing stored.
    assert!(!stale_read(None, Sequence::ZERO));
}
