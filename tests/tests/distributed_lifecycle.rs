//! Distributed mode: cancellation across processes, deadlines from acceptance, and healing of
//! the idempotency crash windows.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use e2e_tests::*;
use protocol::event::EventBody;
use protocol::fingerprint::{request_fingerprint, sha256_hex};
use protocol::{ExecutionId, RuntimeEvent, Sequence, Timestamp};
use runtime::nats::{NatsBackend, NatsEventStore};
use runtime::redis_idempotency::RedisIdempotencyStore;
use runtime::{EventStore, IdempotencyRecord, IdempotencyStore};
use serde_json::{Value, json};

fn slow_mock() -> Value {
    json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"], "chunks": ["a", "b", "c", "d", "e", "f"],
                       "delay_ms": 500}],
        "max_active_executions": 100
    })
}

fn fast_mock() -> Value {
    json!({"providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                          "abilities": ["text-generation"]}]})
}

async fn cancel(base: &str, id: &str) -> (u16, Value) {
    let resp = client()
        .post(format!("{base}/v1/executions/{id}/cancel"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_execution_is_cancelled_by_any_gateway_and_never_runs() {
    cancel_queued(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_execution_of_any_partition_is_cancelled_and_never_runs() {
    cancel_queued(Layout::Partitioned).await;
}

async fn cancel_queued(layout: Layout) {
    let cluster = layout.cluster(&slow_mock());
    let g1 = cluster.gateway();
    let g2 = cluster.gateway();
    // No worker yet: the job waits in the queue.
    let id = layout.submit_followed(&g1.url, &text_request("hi")).await;
    let (status, body) = cancel(&g2.url, &id).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "cancellation_requested");
    let snap = wait_terminal(&g1.url, &id).await;
    assert_eq!(snap["status"], "cancelled");
    // A worker that arrives later drops the job without running it.
    let _worker = cluster.worker();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let all = events(&g1.url, &id, 0).await;
    assert_log_well_formed(&all);
    assert_eq!(
        all.len(),
        2,
        "accepted then cancelled, nothing else: {all:?}"
    );
    // Cancelling a terminal execution is 404.
    assert_eq!(cancel(&g1.url, &id).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_execution_is_cancelled_from_another_gateway() {
    cancel_running(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_execution_of_any_partition_is_cancelled_from_another_gateway() {
    cancel_running(Layout::Partitioned).await;
}

async fn cancel_running(layout: Layout) {
    let cluster = layout.cluster(&slow_mock());
    let g1 = cluster.gateway();
    let g2 = cluster.gateway();
    let _worker = cluster.worker();
    let id = layout.submit_followed(&g1.url, &text_request("hi")).await;
    // Wait until the worker has claimed it.
    let deadline = Instant::now() + PROMPT;
    loop {
        let (_, snap) = get_json(&format!("{}/v1/executions/{id}", g2.url)).await;
        if snap["last_sequence"].as_u64().unwrap_or(0) >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "never started: {snap}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let (status, _) = cancel(&g2.url, &id).await;
    assert_eq!(status, 202);
    let snap = wait_terminal(&g1.url, &id).await;
    assert_eq!(snap["status"], "cancelled");
    assert_eq!(snap["error"]["code"], "cancelled");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        started.elapsed()
    );
    let all = events(&g2.url, &id, 0).await;
    assert_log_well_formed(&all);
    assert!(
        all.iter().filter(|e| e["type"] == "output.delta").count() < 6,
        "stopped before the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_runs_from_acceptance_including_queueing() {
    let cluster = Cluster::start(&fast_mock());
    let gateway = cluster.gateway();
    let mut request = text_request("hi");
    request["deadline_ms"] = json!(300);
    let (_, sub) = submit(&gateway.url, &request, None).await;
    let id = sub["execution_id"].as_str().unwrap().to_owned();
    // The deadline passes while the job waits for a worker.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let _worker = cluster.worker();
    let snap = wait_terminal(&gateway.url, &id).await;
    assert_eq!(snap["status"], "failed");
    assert_eq!(snap["error"]["code"], "deadline_exceeded");
    assert_eq!(snap["error"]["retryable"], false);
    let all = events(&gateway.url, &id, 0).await;
    assert!(
        !all.iter().any(|e| e["type"] == "route.selected"),
        "the provider was never called"
    );
}

async fn redis_store(cluster: &Cluster) -> RedisIdempotencyStore {
    RedisIdempotencyStore::connect(
        &cluster.redis.url(),
        &cluster.namespace,
        Duration::from_secs(3600),
        PROMPT,
    )
    .await
    .unwrap()
}

fn binding(key: &str, request: &Value) -> (String, IdempotencyRecord) {
    let parsed = protocol::validate::parse_request(request.to_string().as_bytes()).unwrap();
    let record = IdempotencyRecord {
        fingerprint: request_fingerprint(&parsed),
        execution_id: ExecutionId::new_random(),
        created_at: Timestamp::now(),
    };
    (sha256_hex(format!("\u{0}{key}").as_bytes()), record)
}

/// Binds `key` to a fresh execution of `request` in Redis, as a gateway that then crashed.
async fn bind_key(cluster: &Cluster, key: &str, request: &Value) -> IdempotencyRecord {
    let (hash, record) = binding(key, request);
    let store = redis_store(cluster).await;
    assert!(
        store.claim(&hash, &record).await.unwrap().is_none(),
        "{key} was free"
    );
    record
}

/// Retries `request` with `key`: the answer names the bound execution, which then succeeds.
/// Returns the answer.
async fn retry_heals(base: &str, request: &Value, key: &str, record: &IdempotencyRecord) -> Value {
    let (status, body) = submit(base, request, Some(key)).await;
    assert_eq!(status, 200, "{body}");
    let id = record.execution_id.to_string();
    assert_eq!(body["execution_id"], id);
    assert_eq!(wait_terminal(base, &id).await["status"], "succeeded");
    body
}

/// A gateway bound the key and died before creating the log. Retries are answered 503 within
/// the submit bound while the binding is younger than the replay wait (its submission may
/// still be creating the log); then a retry closes the recorded execution unrun and creates a
/// fresh one, which runs; further retries replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_binding_the_key_heals_on_retry() {
    let (cluster, gateway, _worker) = gateway_and_worker(&fast_mock());
    let request = text_request("crash window 1");
    let record = bind_key(&cluster, "k-crash-1", &request).await;
    let until = Instant::now() + Duration::from_secs(30);
    let healed = loop {
        let started = Instant::now();
        let (status, body) = submit(&gateway.url, &request, Some("k-crash-1")).await;
        assert!(started.elapsed() <= Duration::from_secs(2), "{body}");
        if status != 503 {
            assert_eq!(status, 202, "{body}");
            break body;
        }
        assert_eq!(body["error"]["retryable"], true, "{body}");
        assert!(Instant::now() < until, "never healed: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let fresh = healed["execution_id"].as_str().unwrap().to_owned();
    assert_ne!(fresh, record.execution_id.to_string());
    assert_eq!(
        wait_terminal(&gateway.url, &fresh).await["status"],
        "succeeded"
    );
    let crashed = events(&gateway.url, &record.execution_id.to_string(), 0).await;
    let types: Vec<&str> = crashed.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        ["execution.accepted", "execution.failed"],
        "closed unrun"
    );
    let (status, again) = submit(&gateway.url, &request, Some("k-crash-1")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["execution_id"], fresh.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_creating_the_log_heals_on_retry() {
    let (cluster, gateway, _worker) = gateway_and_worker(&fast_mock());
    let request = text_request("crash window 2");
    // A gateway bound the key, created the log, and died before publishing the job.
    let record = bind_key(&cluster, "k-crash-2", &request).await;
    let settings = runtime::nats::NatsSettings::new(cluster.namespace.clone());
    let nats = NatsBackend::connect(&cluster.nats.url(), settings, PROMPT)
        .await
        .unwrap();
    let store = NatsEventStore::new(nats, 4096).await.unwrap();
    store
        .create(RuntimeEvent::new(
            record.execution_id,
            Sequence(1),
            record.created_at,
            EventBody::Accepted,
        ))
        .await
        .unwrap();
    retry_heals(&gateway.url, &request, "k-crash-2", &record).await;
    let all = events(&gateway.url, &record.execution_id.to_string(), 0).await;
    assert_log_well_formed(&all);
    assert_eq!(
        all.iter().filter(|e| e["type"] == "route.selected").count(),
        1
    );
}
