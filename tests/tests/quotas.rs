//! Per-tenant quotas held across gateways (contract.md section 7): two real gateways and a
//! worker over one NATS JetStream and one Redis. Accepted submits are counted by the client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use e2e_tests::*;
use serde_json::{Value, json};
use testkit::gateway::auth_matrix::{self, tenant_key};
use tokio::task::JoinSet;

/// The bucket of tenants `rated` and `steady`. The burst covers 3 s without submits, so a
/// stall of the busy test machine shorter than that loses no tokens.
const RATE: f64 = 10.0;
const BURST: u64 = 30;
/// The cap of tenant `capped`.
const CAP: usize = 3;

/// A deployment with the three tenants and one key each; the mock streams `chunks` chunks,
/// waiting `delay_ms` before each.
fn deployment(chunks: usize, delay_ms: u64) -> Value {
    let mut deployment = chunked_mock(delay_ms, chunks);
    deployment["auth"] = json!({
        "tenants": {
            "rated": {"submits_per_second": RATE, "burst": BURST},
            "steady": {"submits_per_second": RATE, "burst": BURST},
            "capped": {"max_active_executions": CAP}
        },
        "keys": auth_matrix::tenant_keys(&["rated", "steady", "capped"], tenant_key)
    });
    deployment
}

/// A cluster of `deployment(chunks, delay_ms)` with two gateways and a worker; the gateways'
/// base URLs.
fn two_gateways(chunks: usize, delay_ms: u64) -> (Cluster, [Gateway; 2], Process, [String; 2]) {
    let cluster = Cluster::start(&deployment(chunks, delay_ms));
    let (gateways, [worker]) = cluster.processes::<2, 1>();
    let bases = [gateways[0].url.clone(), gateways[1].url.clone()];
    (cluster, gateways, worker, bases)
}

/// What a submit got: status, `Retry-After` (parsed as whole seconds), body, and when.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
    at: Instant,
}

async fn submit_as(base: String, tenant: &'static str) -> Answer {
    submit_with(client(), base, tenant).await
}

async fn submit_with(client: reqwest::Client, base: String, tenant: &'static str) -> Answer {
    let resp = client
        .post(format!("{base}/v1/executions"))
        .bearer_auth(tenant_key(tenant))
        .json(&text_request("hi"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().expect("whole seconds"));
    let body = resp.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        retry_after,
        body,
        at: Instant::now(),
    }
}

/// Asserts a quota rejection: 429, `code`, retryable, `Retry-After` of at least 1 s.
fn assert_rejected(answer: &Answer, code: &str) {
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
    assert_eq!(answer.body["error"]["retryable"], true, "{answer:?}");
    assert!(answer.retry_after.is_some_and(|s| s >= 1), "{answer:?}");
}

/// `rated` offers three times its rate for 5 s, alternating between the gateways: the accepted
/// count is the bucket's allowance (burst + rate × elapsed) within 10%, whichever gateway took
/// the submits. `steady`, submitting at half its rate meanwhile, is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_a_tenants_bucket_and_other_tenants_are_unaffected() {
    let (_cluster, _gateways, _worker, bases) = two_gateways(1, 0);
    // One client: pooled connections, so submits are not paced by connection setup.
    let client = client();

    let offered = 3.0 * RATE;
    let sends = (offered * 5.0) as usize;
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / offered));
    let mut rated = JoinSet::new();
    let mut steady = JoinSet::new();
    ticker.tick().await;
    let first = Instant::now();
    for i in 0..sends {
        if i > 0 {
            ticker.tick().await;
        }
        rated.spawn(submit_with(client.clone(), bases[i % 2].clone(), "rated"));
        if i % 6 == 0 {
            let base = bases[(i / 6) % 2].clone();
            steady.spawn(submit_with(client.clone(), base, "steady"));
        }
    }
    let span = first.elapsed().as_secs_f64();
    let mut accepted = 0u64;
    let mut last_answer = first;
    for answer in rated.join_all().await {
        last_answer = last_answer.max(answer.at);
        if answer.status == 202 {
            accepted += 1;
        } else {
            assert_rejected(&answer, "rate_limited");
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let (burst, got) = (BURST as f64, accepted as f64);
    let allowance = burst + RATE * span;
    // Every admit ran between the first send and the last answer: never more than that allows.
    let ceiling = burst + RATE * (last_answer - first).as_secs_f64();
    eprintln!(
        "rated: {sends} sent over {span:.2} s, answered within {:.2} s; {accepted} accepted, \
         allowance {allowance:.1}",
        (last_answer - first).as_secs_f64()
    );
    assert!(got <= ceiling, "{accepted} accepted; at most {ceiling:.1}");
    assert!(
        (got - allowance).abs() <= 0.10 * allowance,
        "{accepted} accepted; the bucket allows {allowance:.1} over {span:.2} s"
    );
    let steady = steady.join_all().await;
    assert!(
        steady.iter().all(|a| a.status == 202),
        "another tenant is unaffected: {steady:?}"
    );
}

/// Ten concurrent submits of `capped` over both gateways while its executions run: exactly
/// the cap is accepted, the rest get `queue_full`. Once those executions end, the slots are
/// free again (reconciled from the event store; the worker never talks to Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_active_holds_across_two_gateways_and_frees_when_executions_end() {
    // Each execution takes about 4 × 1.5 s: far longer than a wave of submits.
    let (_cluster, _gateways, _worker, bases) = two_gateways(4, 1500);
    for wave in 0..2 {
        let mut submits = JoinSet::new();
        for i in 0..10 {
            submits.spawn(submit_as(bases[i % 2].clone(), "capped"));
        }
        let mut accepted = Vec::new();
        for answer in submits.join_all().await {
            if answer.status == 202 {
                accepted.push(answer.body["execution_id"].as_str().unwrap().to_owned());
            } else {
                assert_rejected(&answer, "queue_full");
            }
        }
        assert_eq!(accepted.len(), CAP, "wave {wave}: exactly the cap");
        // Another tenant is not held back by this one's cap.
        let other = submit_as(bases[1].clone(), "steady").await;
        assert_eq!(other.status, 202, "{other:?}");
        for id in &accepted {
            wait_terminal_as(&bases[0], &tenant_key("capped"), id, PROMPT).await;
        }
    }
}
