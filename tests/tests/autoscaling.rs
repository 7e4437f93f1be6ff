//! What the Kubernetes base scales the workers on (`deploy/k8s/base/worker-scaledobject.yaml`):
//! KEDA reads `mrt_jobs_pending` from a worker's `/metrics` and asks for one pod per
//! `MODEL_RUNTIME_WORKERS` jobs. That only works if the gauge is the whole namespace's queue:
//! every job of every partition and every tenant lane, waiting or held by a worker, as one bare
//! sample (KEDA's `metrics-api` scaler selects it by name). A trigger per consumer, as the base
//! had before, follows the busiest consumer only, and under-scales as soon as the load spreads
//! over tenants. Checked on the real binaries over a namespace of 3 partitions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use e2e_tests::*;
use runtime::nats::{DEFAULT_TENANT_LANES, EventShards};
use serde_json::{Value, json};
use testkit::gateway::auth_matrix::{self, tenant_key};

const PARTITIONS: u16 = 3;
/// The provider's slots: the worker runs 2 executions and the rest wait.
const SLOTS: u32 = 2;
/// Executions per tenant.
const EACH: usize = 3;
/// How long the gauge may take to follow the queue (the worker reads it every 5 s).
const FOLLOW: Duration = Duration::from_secs(60);

/// Four tenants whose names fall in at least three tenant lanes.
fn tenants() -> Vec<String> {
    let layout = EventShards::new("any", PARTITIONS)
        .unwrap()
        .with_lanes(DEFAULT_TENANT_LANES)
        .unwrap();
    let mut lanes = BTreeSet::new();
    let mut chosen = Vec::new();
    for name in (0..).map(|i| format!("tenant{i}")) {
        if lanes.insert(layout.lane_of(&name)) || lanes.len() >= 3 {
            chosen.push(name);
        }
        if chosen.len() == 4 {
            break;
        }
    }
    assert!(lanes.len() >= 3);
    chosen
}

fn deployment(tenants: &[&str]) -> Value {
    let auth_tenants: serde_json::Map<String, Value> = tenants
        .iter()
        .map(|t| ((*t).to_owned(), json!({})))
        .collect();
    json!({
        "providers": [{
            "type": "mock", "id": "provider-mock", "model": "model-alpha",
            "abilities": ["text-generation"], "chunks": ["done"], "delay_ms": 600_000,
            "max_concurrency": SLOTS, "max_queue_depth": 256
        }],
        "max_active_executions": 1000,
        "auth": {
            "tenants": auth_tenants,
            "keys": auth_matrix::tenant_keys(tenants, tenant_key)
        }
    })
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
fn bare_sample(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn jobs_pending(admin: &str) -> Result<f64, String> {
    let text = fetch_text(&format!("{admin}/metrics")).await?;
    // Absent until the worker's first reading of the queue.
    let value = bare_sample(&text, "mrt_jobs_pending")
        .ok_or_else(|| "no mrt_jobs_pending sample yet".to_owned())?;
    assert!(
        text.contains("# TYPE mrt_jobs_pending gauge"),
        "mrt_jobs_pending is a gauge"
    );
    assert!(
        !text.contains("mrt_jobs_pending{"),
        "mrt_jobs_pending carries no labels: KEDA selects the one sample by name"
    );
    Ok(value)
}

async fn wait_for_pending(admin: &str, want: f64) {
    poll_until(FOLLOW, Duration::from_millis(500), async || {
        let got = jobs_pending(admin).await?;
        if got == want {
            Ok(())
        } else {
            Err(format!("mrt_jobs_pending is {got}, want {want}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_jobs_pending_counts_every_partition_and_tenant_lane() {
    let tenants = tenants();
    let tenants: Vec<&str> = tenants.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start(&deployment(&tenants));
    cluster
        .extra_env
        .push(("MODEL_RUNTIME_PARTITIONS".into(), PARTITIONS.to_string()));
    let gateway = cluster.gateway();
    let (_worker, admin) = cluster.worker_with_admin(&[]);
    wait_for_pending(&admin, 0.0).await;

    let mut submitted = Vec::new();
    for tenant in &tenants {
        for _ in 0..EACH {
            let resp = client()
                .post(format!("{}/v1/executions", gateway.url))
                .bearer_auth(tenant_key(tenant))
                .json(&json!({"ability": "text-generation",
                              "input": [{"type": "text", "text": "hi"}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 202);
            let body: Value = resp.json().await.unwrap();
            submitted.push((*tenant, body["execution_id"].as_str().unwrap().to_owned()));
        }
    }
    let total = submitted.len();
    // The worker runs SLOTS of them; every other job waits in its lane of its partition.
    wait_for_pending(&admin, total as f64).await;

    // One trigger per consumer sees at most one lane of one partition: here at most two
    // tenants' jobs (the four fall in three lanes or more), never the whole queue.
    let layout = EventShards::new(cluster.namespace.clone(), PARTITIONS)
        .unwrap()
        .with_lanes(DEFAULT_TENANT_LANES)
        .unwrap();
    let busiest_lane = (0..DEFAULT_TENANT_LANES)
        .map(|lane| tenants.iter().filter(|t| layout.lane_of(t) == lane).count())
        .max()
        .unwrap();
    assert!(busiest_lane * EACH < total);

    // Cancelled, every execution ends and its job leaves the queue: the gauge falls to 0.
    for (tenant, id) in &submitted {
        let resp = client()
            .post(format!("{}/v1/executions/{id}/cancel", gateway.url))
            .bearer_auth(tenant_key(tenant))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "cancel: {}", resp.status());
    }
    wait_for_pending(&admin, 0.0).await;
}
