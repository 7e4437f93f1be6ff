//! API keys and tenants in embedded mode (contract.md section 7): the route matrix of
//! `testkit::gateway::auth_matrix`, the anonymous default, and the idempotency key scoping.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use protocol::Tenant;
use protocol::fingerprint::sha256_hex;
use reqwest::StatusCode;
use serde_json::json;
use support::auth_matrix::{self, OWNER_KEY};
use support::*;

/// A mock slow enough (3 chunks × 60 s) that the owner's execution is still running when the
/// matrix cancels it at the end, however long a busy machine takes to run the matrix (13.5 s
/// seen with the 2 cores saturated; nothing in the matrix waits for an execution to end).
fn deployment_with_auth() -> serde_json::Value {
    slow_mock(60_000, json!({ "auth": auth_matrix::auth_section() }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_the_key_the_scope_and_the_tenant() {
    let gw = Gateway::start(deployment_with_auth()).await;
    auth_matrix::run(&gw.base, &gw.base, &text_request("matrix")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auth_every_request_is_the_default_tenant() {
    let gw = Gateway::start_default().await;
    let id = gw.submit_ok(&text_request("anonymous")).await;
    // A bearer header changes nothing when no keys are configured.
    let answer = auth_matrix::call(
        &gw.base,
        reqwest::Method::GET,
        &format!("/v1/executions/{id}"),
        Some(OWNER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let (status, _, _) = gw.get_json(&format!("/v1/executions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn the_default_tenant_keeps_the_idempotency_hash_of_earlier_versions() {
    let default = Tenant::default();
    let acme: Tenant = "acme".parse().unwrap();
    assert_eq!(
        gateway::submit::idempotency_key_hash(&default, "k-1"),
        sha256_hex(b"\0k-1"),
        "upgrading keeps anonymous deployments' keys"
    );
    assert_ne!(
        gateway::submit::idempotency_key_hash(&acme, "k-1"),
        gateway::submit::idempotency_key_hash(&default, "k-1")
    );
    // No (tenant, key) pair collides with another by shifting the separator.
    let ab: Tenant = "a".parse().unwrap();
    assert_ne!(
        gateway::submit::idempotency_key_hash(&ab, "b-c"),
        gateway::submit::idempotency_key_hash(&"a-b".parse().unwrap(), "c")
    );
}
