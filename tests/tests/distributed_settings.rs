//! Distributed mode: settings of an existing namespace follow the processes started on it. A
//! worker restarted with another `--ack-wait-ms` changes the lease for real (time to detect a
//! killed worker), and a worker heartbeats at the lease the server holds, never at its flag's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use e2e_tests::*;
use serde_json::{Value, json};

fn mock(delay_ms: u64, chunks: usize) -> Value {
    let chunks: Vec<String> = (0..chunks).map(|i| format!("c{i} ")).collect();
    json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"], "chunks": chunks, "delay_ms": delay_ms,
                       "max_concurrency": 64, "max_queue_depth": 256}],
        "max_active_executions": 1000
    })
}

const ACK_WAIT: &str = "MODEL_RUNTIME_ACK_WAIT_MS";

/// The workers' consumer's `ack_wait` on the server, once the consumer exists.
async fn consumer_ack_wait(cluster: &Cluster) -> Option<Duration> {
    let client = async_nats::connect(cluster.nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
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
    let deadline = Instant::now() + PROMPT;
    while consumer_ack_wait(cluster).await != Some(Duration::from_millis(ack_wait_ms)) {
        assert!(Instant::now() < deadline, "{}", first.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.signal("KILL");
}

/// Polls the snapshot until `pred` holds.
async fn wait_snapshot(base: &str, id: &str, within: Duration, pred: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let (_, snap) = get_json(&format!("{base}/v1/executions/{id}")).await;
        if pred(&snap) {
            return;
        }
        assert!(Instant::now() < deadline, "not in time: {snap}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_ack_wait_on_restart_detects_a_killed_worker_in_seconds() {
    let cluster = Cluster::start(&mock(300, 100));
    let gateway = cluster.gateway();
    leave_a_consumer_with(&cluster, 30_000).await;
    let doomed = cluster.worker_with(&[(ACK_WAIT, "3000")]);
    let (status, sub) = submit(&gateway.url, &text_request("hi"), None).await;
    assert_eq!(status, 202, "{sub}");
    let id = sub["execution_id"].as_str().unwrap().to_owned();
    // Running, with output: the worker holds the job.
    wait_snapshot(&gateway.url, &id, PROMPT, |s| {
        s["last_sequence"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    doomed.signal("KILL");
    let killed_at = Instant::now();
    let _survivor = cluster.worker_with(&[(ACK_WAIT, "3000")]);
    // With the 30 s lease of the first consumer this would take 30 s.
    wait_snapshot(&gateway.url, &id, Duration::from_secs(25), |s| {
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
    let cluster = Cluster::start(&mock(300, 25));
    let gateway = cluster.gateway();
    leave_a_consumer_with(&cluster, 2_000).await;
    let _worker = cluster.worker_with(&[(ACK_WAIT, "30000")]);
    let (status, sub) = submit(&gateway.url, &text_request("hi"), None).await;
    assert_eq!(status, 202, "{sub}");
    let id = sub["execution_id"].as_str().unwrap().to_owned();
    let snap = wait_terminal(&gateway.url, &id).await;
    assert_eq!(snap["status"], "succeeded", "{snap}");
}
