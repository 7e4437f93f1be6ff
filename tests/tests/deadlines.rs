//! Deadlines without a live worker (contract §8): an execution whose deadline passes while no
//! worker runs it ends with `deadline_exceeded` at most 2 s after the deadline, written by the
//! gateway's deadline sweeper, and a worker that arrives later appends nothing after it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use e2e_tests::*;
use protocol::Timestamp;
use serde_json::{Value, json};
use testkit::jetstream::stream_state;

/// The contract's bound from a deadline to its terminal event.
const AFTER_DEADLINE_MS: i64 = 2000;

/// [`chunked_mock`], with room in the worker for every execution [`Layout::submit_followed`]
/// submits: the followed one starts at once even when it was the last of them (with 8 slots,
/// the run of 10 that submitted 9 or more started it only when the earlier ones, running for
/// 20 s, reached their deadlines: after it had passed its own).
fn mock(delay_ms: u64, chunks: usize) -> Value {
    let mut deployment = chunked_mock(delay_ms, chunks);
    deployment["providers"][0]["max_concurrency"] = json!(FOLLOW_SUBMITS);
    deployment["providers"][0]["max_queue_depth"] = json!(FOLLOW_SUBMITS);
    deployment["max_active_executions"] = json!(2 * FOLLOW_SUBMITS);
    deployment
}

fn with_deadline(deadline_ms: u64) -> Value {
    let mut request = text_request("hi");
    request["deadline_ms"] = json!(deadline_ms);
    request
}

/// The full log once its stream ended after the terminal event; fails (instead of hanging on
/// keep-alives) when no terminal came within [`PROMPT`].
async fn log_until_terminal(gateway: &Gateway, id: &str) -> Vec<Value> {
    tokio::time::timeout(PROMPT, events(&gateway.url, id, 0))
        .await
        .unwrap_or_else(|_| panic!("no terminal event for {id} within {PROMPT:?}"))
}

fn time_of(event: &Value) -> i64 {
    serde_json::from_value::<Timestamp>(event["time"].clone())
        .unwrap()
        .unix_millis()
}

/// Checks the full log ends with one `deadline_exceeded` terminal at most
/// [`AFTER_DEADLINE_MS`] after the deadline (measured from the accepted event's time); returns
/// how long after the deadline it was written.
fn assert_closed_by_deadline(events: &[Value], deadline_ms: u64) -> i64 {
    assert_log_well_formed(events);
    let terminal = events.last().unwrap();
    assert_eq!(terminal["type"], "execution.failed", "{events:?}");
    assert_eq!(terminal["error"]["code"], "deadline_exceeded", "{events:?}");
    let deadline = time_of(&events[0]) + i64::try_from(deadline_ms).unwrap();
    let late = time_of(terminal) - deadline;
    assert!(
        (0..=AFTER_DEADLINE_MS).contains(&late),
        "terminal {late} ms after the deadline: {events:?}"
    );
    late
}

/// Waits until every jobs stream holds no job: a worker received the jobs and acknowledged
/// them.
async fn wait_jobs_drained(cluster: &Cluster, layout: Layout) {
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let shards =
        runtime::nats::EventShards::new(cluster.namespace.clone(), layout.partitions()).unwrap();
    for partition in 0..layout.partitions() {
        let name = shards.jobs_stream(partition);
        poll_until(
            PROMPT,
            Duration::from_millis(50),
            async || match stream_state(&js, &name).await.messages {
                0 => Ok(()),
                messages => Err(format!("{messages} jobs still queued in {name}")),
            },
        )
        .await;
    }
}

/// Starts a worker, waits until it took and dropped the expired jobs, and checks that the log
/// is unchanged: the worker appended nothing after the terminal.
async fn a_late_worker_appends_nothing(
    cluster: &Cluster,
    layout: Layout,
    gateway: &Gateway,
    closed: &[Value],
) {
    let _worker = cluster.worker();
    wait_jobs_drained(cluster, layout).await;
    let id = closed[0]["execution_id"].as_str().unwrap();
    let after = log_until_terminal(gateway, id).await;
    assert_eq!(after, closed, "the late worker changed the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_alive_the_gateway_ends_an_expired_execution() {
    no_worker_alive(Layout::Single).await;
}

/// The gateway's sweeper follows every partition's jobs, not only partition 0's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_alive_the_gateway_ends_an_expired_execution_of_any_partition() {
    no_worker_alive(Layout::Partitioned).await;
}

async fn no_worker_alive(layout: Layout) {
    let cluster = layout.cluster(&mock(10, 2));
    let gateway = cluster.gateway();
    let deadline_ms = 3000;
    let id = layout
        .submit_followed(&gateway.url, &with_deadline(deadline_ms))
        .await;
    // The live stream ends after the terminal event.
    let all = log_until_terminal(&gateway, &id).await;
    let late = assert_closed_by_deadline(&all, deadline_ms);
    eprintln!("no worker: terminal {late} ms after the deadline");
    assert_eq!(all.len(), 2, "accepted, then the terminal: {all:?}");
    let snap = wait_terminal(&gateway.url, &id).await;
    assert_eq!(snap["status"], "failed");
    assert_eq!(snap["error"]["code"], "deadline_exceeded");
    a_late_worker_appends_nothing(&cluster, layout, &gateway, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_execution_ends_at_its_deadline_not_at_redelivery() {
    killed_worker_deadline(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_execution_ends_at_its_deadline_with_partitions() {
    killed_worker_deadline(Layout::Partitioned).await;
}

async fn killed_worker_deadline(layout: Layout) {
    // 100 chunks 200 ms apart: the attempt would run for 20 s.
    let cluster = layout.cluster(&mock(200, 100));
    let gateway = cluster.gateway();
    let worker = cluster.worker();
    let deadline_ms = 5000;
    let id = layout
        .submit_followed(&gateway.url, &with_deadline(deadline_ms))
        .await;
    // Kill the worker once the attempt has exposed output.
    let head = read_events(event_stream(&gateway.url, &id).await, Some(3)).await;
    assert_eq!(head[2]["type"], "output.delta", "{head:?}");
    worker.signal("KILL");
    drop(worker);
    let all = log_until_terminal(&gateway, &id).await;
    let late = assert_closed_by_deadline(&all, deadline_ms);
    eprintln!("killed worker: terminal {late} ms after the deadline");
    let failed = all.last().unwrap();
    assert!(
        !failed["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("worker"),
        "{failed}"
    );
    a_late_worker_appends_nothing(&cluster, layout, &gateway, &all).await;
}
