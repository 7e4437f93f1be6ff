//! Fairness across tenants (issue: one tenant's backlog holds back no other tenant): tenant
//! `heavy` submits a backlog many times the slots, then tenant `light` submits one execution;
//! `light`'s execution must not wait behind the backlog. Checked on the real binaries, embedded
//! (the memory queue serves tenants in turn) and with one worker over NATS (each tenant's jobs
//! wait in their tenant lane, and the worker serves the lanes in turn).
//!
//! The check counts, when `light`'s execution has ended, how much of `heavy`'s backlog has not:
//! served first come, first served it would be none of it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use e2e_tests::*;
use serde_json::{Value, json};
use testkit::TempDir;
use testkit::gateway::auth_matrix::{self, tenant_key};

/// Slots of the one provider (and so of the process).
const SLOTS: u32 = 4;
/// `heavy`'s backlog: twelve rounds of the slots, twelve seconds of work.
const BACKLOG: usize = 48;
/// How long each execution holds its slot.
const HOLD_MS: u64 = 1000;
/// How long the backlog may take to drain on a slow machine.
const LONG: Duration = Duration::from_secs(120);

fn deployment() -> Value {
    json!({
        "providers": [{
            "type": "mock", "id": "provider-mock", "model": "model-alpha",
            "abilities": ["text-generation"], "chunks": ["done"], "delay_ms": HOLD_MS,
            "max_concurrency": SLOTS, "max_queue_depth": 256
        }],
        "max_active_executions": 1000,
        "auth": {
            "tenants": {"heavy": {}, "light": {}},
            "keys": auth_matrix::tenant_keys(&["heavy", "light"], tenant_key)
        }
    })
}

async fn submit_as(base: &str, tenant: &str) -> String {
    let resp = client()
        .post(format!("{base}/v1/executions"))
        .bearer_auth(tenant_key(tenant))
        .json(&json!({"ability": "text-generation", "input": [{"type": "text", "text": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "submit of {tenant}");
    let body: Value = resp.json().await.unwrap();
    body["execution_id"].as_str().unwrap().to_owned()
}

async fn status_as(base: &str, tenant: &str, id: &str) -> String {
    let url = format!("{base}/v1/executions/{id}");
    let (_, body) = get_json_as(&url, &tenant_key(tenant)).await;
    body["status"].as_str().unwrap_or_default().to_owned()
}

fn terminal(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "cancelled")
}

/// Submits `heavy`'s backlog, then `light`'s one execution, waits for the latter to end, and
/// checks that most of the backlog had not ended by then.
async fn light_is_not_served_after_heavys_backlog(base: &str) {
    let backlog =
        futures_util::future::join_all((0..BACKLOG).map(|_| submit_as(base, "heavy"))).await;
    let light = submit_as(base, "light").await;
    let light = wait_terminal_as(base, &tenant_key("light"), &light, LONG).await;
    assert_eq!(light["status"], "succeeded");
    let mut unfinished = 0;
    for id in &backlog {
        if !terminal(&status_as(base, "heavy", id).await) {
            unfinished += 1;
        }
    }
    // First come, first served: 0. Served in turn: `light` starts when one of the first slots
    // frees, so about BACKLOG - 2 * SLOTS remain; half the backlog leaves room for a slow machine.
    assert!(
        unfinished >= BACKLOG / 2,
        "only {unfinished} of heavy's {BACKLOG} executions were unfinished when light's ended: \
         light waited behind heavy's backlog"
    );
    // And the backlog is not starved in turn: all of it completes.
    for id in &backlog {
        wait_terminal_as(base, &tenant_key("heavy"), id, LONG).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_gateway_serves_tenants_in_turn() {
    let dir = TempDir::new("mrt-fairness-");
    let path = dir.path().join("deployment.json");
    std::fs::write(&path, serde_json::to_vec(&deployment()).unwrap()).unwrap();
    let env = [
        ("MODEL_RUNTIME_BACKEND".to_owned(), "memory".to_owned()),
        (
            "MODEL_RUNTIME_CONFIG".to_owned(),
            path.display().to_string(),
        ),
    ];
    let gateway = spawn_gateway(&env, &dir);
    light_is_not_served_after_heavys_backlog(&gateway.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_the_tenant_lanes_in_turn() {
    // The two tenants hash to different lanes of a new namespace (else they share a lane, and
    // its turn, by design).
    let layout = runtime::nats::EventShards::new("any", 1)
        .unwrap()
        .with_lanes(runtime::nats::DEFAULT_TENANT_LANES)
        .unwrap();
    assert_ne!(layout.lane_of("heavy"), layout.lane_of("light"));
    let cluster = Cluster::start(&deployment());
    let gateway = cluster.gateway();
    let _worker = cluster.worker();
    light_is_not_served_after_heavys_backlog(&gateway.url).await;
}
