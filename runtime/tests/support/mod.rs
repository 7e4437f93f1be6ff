//! Connections and stores over a private nats-server, shared by the tests against real
//! servers.

#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use runtime::nats::{NatsBackend, NatsEventStore, NatsSettings};
use testkit::{NatsServer, unique_namespace};

/// The per-execution event limit of the stores below.
pub const MAX_EVENTS: u64 = 4096;

/// A connection to `server` with `settings` (several connections act like several processes).
pub async fn connect(server: &NatsServer, settings: NatsSettings) -> NatsBackend {
    NatsBackend::connect(&server.url(), settings, Duration::from_secs(30))
        .await
        .unwrap()
}

/// A connection to `server` in a namespace of its own, whose logs are spread over three events
/// streams and read on three readers' connections (as a gateway reads them): the contract
/// suites run on it, so every store operation is checked against logs in every shard (the
/// tests of `fresh_settings` namespaces cover the one-stream layout).
pub async fn backend(server: &NatsServer) -> NatsBackend {
    let settings = NatsSettings {
        event_shards: Some(3),
        reader_lanes: true,
        ..NatsSettings::new(unique_namespace("t"))
    };
    connect(server, settings).await
}

/// An event store on `backend` allowing `max_events` events per execution.
pub async fn store_on(backend: &NatsBackend, max_events: u64) -> NatsEventStore {
    NatsEventStore::new(backend.clone(), max_events)
        .await
        .unwrap()
}

/// An event store over its own connection with `settings`.
pub async fn event_store(server: &NatsServer, settings: NatsSettings) -> NatsEventStore {
    store_on(&connect(server, settings).await, MAX_EVENTS).await
}

/// Two connections to one namespace of its own on a private server, as two processes have
/// (keep the server alive).
pub async fn two_processes() -> (NatsServer, NatsBackend, NatsBackend) {
    let server = NatsServer::start();
    let settings = fresh_settings();
    let first = connect(&server, settings.clone()).await;
    let second = connect(&server, settings).await;
    (server, first, second)
}

/// The settings of a namespace of its own.
pub fn fresh_settings() -> NatsSettings {
    NatsSettings::new(unique_namespace("t"))
}

/// One process on a private server: the server (keep it alive), its settings, a connection
/// with them and an event store over that connection.
pub type Node = (NatsServer, NatsSettings, NatsBackend, NatsEventStore);

/// A [`Node`] with `settings`.
pub async fn node_with(settings: NatsSettings) -> Node {
    let server = NatsServer::start();
    let backend = connect(&server, settings.clone()).await;
    let store = store_on(&backend, MAX_EVENTS).await;
    (server, settings, backend, store)
}

/// [`node_with`] in a namespace of its own.
pub async fn node() -> Node {
    node_with(fresh_settings()).await
}

/// [`node`] whose streams refuse messages over 4 KiB: an 8 KiB event is never stored, and
/// runs of a few events are split over several messages.
pub async fn node_with_small_messages() -> Node {
    node_with(NatsSettings {
        max_event_bytes: 4096,
        ..fresh_settings()
    })
    .await
}
