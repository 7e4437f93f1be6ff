//! Distributed mode: settings of an existing namespace follow the processes started on it. A
//! worker restarted with another `--ack-wait-ms` changes the lease for real (time to detect a
//! killed worker), and a worker heartbeats at the lease the server holds, never at its flag's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use e2e_tests::*;

const ACK_WAIT: &str = "MODEL_RUNTIME_ACK_WAIT_MS";

/// The workers' consumer's `ack_wait` on the server, once the consumer exists.
async fn consumer_ack_wait(cluster: &Cluster) -> Option<Duration> {
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let upper = cluster.namespace.to_ascii_uppercase();
    let stream = js.get_stream(format!("{upper}_JOBS")).await.ok()?;
    let info = stream
        .consumer_info(format!("{}_workers", cluster.namespace))
        .await
        .ok()?;
    Some(info.config.ack_wait)
}

/// Starts a worker with `ack_wait_ms`, waits until the consumer holds that lease, and kills the
/// worker, leaving the consumer behind as the namespace's first settings.
async fn leave_a_consumer_with(cluster: &Cluster, ack_wait_ms: u64) {
    let first = cluster.worker_with(&[(ACK_WAIT, &ack_wait_ms.to_string())]);
    poll_until(PROMPT, Duration::from_millis(50), async || {
        if consumer_ack_wait(cluster).await == Some(Duration::from_millis(ack_wait_ms)) {
            Ok(())
        } else {
            Err(first.log_text())
        }
    })
    .await;
    first.signal("KILL");
}

/// A gateway over a mock of `chunks` chunks 300 ms apart, on a namespace whose consumer was
/// first made with a lease of `first_ack_wait_ms`; then a worker with `ack_wait_ms` (as a flag
/// value) and one execution submitted. Returns what runs and the execution's id.
async fn after_a_first_lease(
    chunks: usize,
    first_ack_wait_ms: u64,
    ack_wait_ms: &str,
) -> (Cluster, Gateway, Process, String) {
    let cluster = Cluster::start(&chunked_mock(300, chunks));
    let gateway = cluster.gateway();
    leave_a_consumer_with(&cluster, first_ack_wait_ms).await;
    let worker = cluster.worker_with(&[(ACK_WAIT, ack_wait_ms)]);
    let id = submit_accepted(&gateway.url, &text_request("hi")).await;
    (cluster, gateway, worker, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_ack_wait_on_restart_detects_a_killed_worker_in_seconds() {
    let (cluster, gateway, doomed, id) = after_a_first_lease(100, 30_000, "3000").await;
    // Running, with output: the worker holds the job.
    wait_snapshot(&gateway.url, &id, "running with output", PROMPT, |s| {
        s["last_sequence"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    doomed.signal("KILL");
    let killed_at = Instant::now();
    let _survivor = cluster.worker_with(&[(ACK_WAIT, "3000")]);
    // With the 30 s lease of the first consumer this would take 30 s.
    wait_snapshot(&gateway.url, &id, "failed", Duration::from_secs(25), |s| {
        s["status"] == "failed"
    })
    .await;
    let took = killed_at.elapsed();
    eprintln!("the killed worker's execution failed {took:?} after the kill");
    assert!(
        took < Duration::from_secs(15),
        "the killed worker's execution failed after {took:?}; the 3 s lease was not applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_after_a_shorter_lease_keeps_healthy_executions_alive() {
    // 25 chunks every 300 ms: about 7.5 s, far longer than the 2 s lease of the first worker.
    let (_cluster, gateway, _worker, id) = after_a_first_lease(25, 2_000, "30000").await;
    let snap = wait_terminal(&gateway.url, &id).await;
    assert_eq!(snap["status"], "succeeded", "{snap}");
}
