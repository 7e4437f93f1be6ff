//! API keys and tenants in `nats` mode: the route matrix of `testkit::gateway::auth_matrix`
//! with executions created on one gateway process and read, streamed, replayed and cancelled
//! on another, over a private NATS JetStream and Redis. The gateways log at `trace`, and no
//! line of any process may hold a key or a key's hash.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use e2e_tests::*;
use serde_json::json;
use testkit::gateway::auth_matrix;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_key_scope_and_tenant_across_two_gateways() {
    // Three chunks a minute apart: the owner's execution still runs when it is cancelled,
    // however long a busy machine takes to run the matrix (nothing in it waits for an end).
    let config = json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"], "delay_ms": 60000,
                       "max_concurrency": 64, "max_queue_depth": 256}],
        "auth": auth_matrix::auth_section()
    });
    let mut cluster = Cluster::start(&config);
    cluster.extra_env.push(("RUST_LOG".into(), "trace".into()));
    let g1 = cluster.gateway();
    let g2 = cluster.gateway();
    let worker = cluster.worker();
    auth_matrix::run(&g1.url, &g2.url, &testkit::gateway::text_request("matrix")).await;

    let logs = [&g1.process, &g2.process, &worker].map(|p| p.log_text());
    assert!(
        logs[0].lines().count() > 100,
        "trace logging is on (gateway log has {} lines)",
        logs[0].lines().count()
    );
    for key in auth_matrix::ALL_KEYS {
        let hash = auth_matrix::sha256_hex(key);
        for (log, name) in logs.iter().zip(["gateway 1", "gateway 2", "worker"]) {
            for line in log.lines() {
                assert!(!line.contains(key), "{name} logged a key: {line}");
                assert!(
                    !line.to_ascii_lowercase().contains(&hash),
                    "{name} logged a key hash: {line}"
                );
            }
        }
    }
}
