//! Per-tenant quotas in embedded mode (contract.md section 7): a real gateway on loopback with
//! API keys for three tenants. `capped` may run one execution at a time, `rated` has two tokens
//! that (for a test's length) never refill, `free` has no limits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;
use testkit::gateway::auth_matrix::tenant_key;

const TENANTS: [&str; 3] = ["capped", "rated", "free"];

/// Each execution streams three chunks 300 ms apart: long enough to be active while the test
/// submits again.
async fn gateway() -> Gateway {
    let keys = auth_matrix::tenant_keys(&TENANTS, tenant_key);
    Gateway::start(slow_mock(
        300,
        json!({"auth": {
            "tenants": {
                "capped": {"max_active_executions": 1},
                "rated": {"submits_per_second": 0.001, "burst": 2},
                "free": {}
            },
            "keys": keys
        }}),
    ))
    .await
}

/// Status, `Retry-After` and body of a submit as `tenant`.
async fn submit(
    gw: &Gateway,
    tenant: &str,
    idempotency_key: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let auth = format!("Bearer {}", tenant_key(tenant));
    let mut headers = vec![("authorization", auth.as_str())];
    if let Some(key) = idempotency_key {
        headers.push(("idempotency-key", key));
    }
    let response = gw.submit_with(&text_request("hi"), &headers).await;
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, response.json().await.unwrap())
}

fn assert_refused(answer: &(StatusCode, Option<String>, Value), code: &str) {
    let (status, retry_after, body) = answer;
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    let secs: u64 = retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(secs >= 1);
}

async fn wait_terminal(gw: &Gateway, tenant: &str, id: &str) {
    let started = Instant::now();
    loop {
        let response = gw
            .client
            .get(gw.url(&format!("/v1/executions/{id}")))
            .bearer_auth(tenant_key(tenant))
            .send()
            .await
            .unwrap();
        let body: Value = response.json().await.unwrap();
        if matches!(
            body["status"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        ) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `mrt_quota_rejections_total` sample of `tenant` for `reason`.
fn rejections(tenant: &str, reason: &str) -> String {
    format!("mrt_quota_rejections_total{{tenant=\"{tenant}\",reason=\"{reason}\"}}")
}

fn id_of(body: &Value) -> String {
    body["execution_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_cap_refuses_with_queue_full_until_the_execution_ends() {
    let gw = gateway().await;
    let first = submit(&gw, "capped", None).await;
    assert_eq!(first.0, StatusCode::ACCEPTED, "{}", first.2);
    let refused = submit(&gw, "capped", None).await;
    assert_refused(&refused, "queue_full");
    assert_eq!(refused.1.as_deref(), Some("1"));
    assert_eq!(gw.metric(&rejections("capped", "active_limit")).await, 1.0);
    assert_eq!(gw.metric(&rejections("capped", "rate_limited")).await, 0.0);
    // Other tenants are not held back.
    for _ in 0..3 {
        assert_eq!(submit(&gw, "free", None).await.0, StatusCode::ACCEPTED);
    }
    wait_terminal(&gw, "capped", &id_of(&first.2)).await;
    let next = submit(&gw, "capped", None).await;
    assert_eq!(
        next.0,
        StatusCode::ACCEPTED,
        "the slot is free once the execution ended: {}",
        next.2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bucket_refuses_with_rate_limited_and_says_when_a_token_is_back() {
    let gw = gateway().await;
    for _ in 0..2 {
        assert_eq!(submit(&gw, "rated", None).await.0, StatusCode::ACCEPTED);
    }
    let refused = submit(&gw, "rated", None).await;
    assert_refused(&refused, "rate_limited");
    assert_eq!(gw.metric(&rejections("rated", "rate_limited")).await, 1.0);
    // One token at 0.001/s: about 1000 s.
    let secs: u64 = refused.1.unwrap().parse().unwrap();
    assert!((900..=1000).contains(&secs), "{secs}");
    assert_eq!(submit(&gw, "free", None).await.0, StatusCode::ACCEPTED);
}

/// Replays create nothing, so they take no token and no slot, even at the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_replays_take_no_token_and_no_slot() {
    let gw = gateway().await;
    let first = submit(&gw, "rated", Some("k1")).await;
    assert_eq!(first.0, StatusCode::ACCEPTED);
    for _ in 0..3 {
        let replay = submit(&gw, "rated", Some("k1")).await;
        assert_eq!(replay.0, StatusCode::OK, "{}", replay.2);
        assert_eq!(replay.2["idempotent_replay"], true);
        assert_eq!(id_of(&replay.2), id_of(&first.2));
    }
    assert_eq!(
        submit(&gw, "rated", None).await.0,
        StatusCode::ACCEPTED,
        "the second token is still there"
    );
    assert_refused(&submit(&gw, "rated", None).await, "rate_limited");
    // At the bucket's limit, the replay still answers.
    assert_eq!(submit(&gw, "rated", Some("k1")).await.0, StatusCode::OK);

    let running = submit(&gw, "capped", Some("k2")).await;
    assert_eq!(running.0, StatusCode::ACCEPTED);
    let replay = submit(&gw, "capped", Some("k2")).await;
    assert_eq!(
        replay.0,
        StatusCode::OK,
        "a replay at the cap: {}",
        replay.2
    );
}

/// A refused submit leaves its idempotency key free: the retry after `Retry-After` creates the
/// execution (a fresh 202, not a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_submit_leaves_its_idempotency_key_free() {
    let gw = gateway().await;
    let running = submit(&gw, "capped", None).await;
    assert_eq!(running.0, StatusCode::ACCEPTED);
    assert_refused(&submit(&gw, "capped", Some("retry-me")).await, "queue_full");
    wait_terminal(&gw, "capped", &id_of(&running.2)).await;
    let retried = submit(&gw, "capped", Some("retry-me")).await;
    assert_eq!(retried.0, StatusCode::ACCEPTED, "{}", retried.2);
    assert_eq!(retried.2["idempotent_replay"], false);
}

/// The gateway frees the slot of a queued execution it cancels itself, without waiting for a
/// reconciliation: here the quota store has no terminal hook and reconciliation, having just
/// run, is throttled for an hour, so only the eager release can admit the next submit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_queued_execution_frees_its_slot_at_once() {
    use std::sync::Arc;

    use runtime::memory::{MemoryEventStore, MemoryLimits};
    use runtime::quota::{GateSettings, MemoryQuotaStore};
    use runtime::{QuotaGate, QuotaLimits};

    let store = Arc::new(MemoryEventStore::new(MemoryLimits::default()));
    let quotas = QuotaGate::new(
        Arc::new(MemoryQuotaStore::new()),
        store.clone(),
        [(
            protocol::Tenant::default(),
            QuotaLimits::new(Some(1), None, None).unwrap(),
        )],
        GateSettings {
            reconcile_interval: Duration::from_secs(3600),
            ..GateSettings::default()
        },
    );
    // No workers: executions stay queued.
    let backend = gateway::Backend {
        store,
        quotas: Arc::new(quotas),
        ..memory_backend()
    };
    let gw = Gateway::from_state(gateway::AppState::new(
        backend,
        standalone_capabilities(),
        gateway::ApiLimits::default(),
    ))
    .await;
    let queued = gw.submit_ok(&text_request("hi")).await;
    // At the cap: refused, and the one reconciliation of the hour has run.
    let refused = gw.submit(&text_request("hi")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let (status, _, body) = gw.cancel(&queued).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    gw.submit_ok(&text_request("hi")).await;
}
