//! The API-key test matrix (contract.md section 7): every route, as the owner, as another
//! tenant, without a key, with an unknown key, and with a key lacking the route's scope. Run
//! against an embedded gateway and against two gateway processes over NATS; the deployment's
//! `auth` section comes from [`auth_section`].
//!
//! Reads by another tenant must be answered exactly like an unknown id: same status, same
//! body bytes, same headers (but `date`).

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::http_client;

/// Tenant `acme`, every scope.
pub const OWNER_KEY: &str = "mrt_test-owner-0123456789abcdef0123456789abcdef";
/// Tenant `rival`, every scope.
pub const RIVAL_KEY: &str = "mrt_test-rival-0123456789abcdef0123456789abcdef";
/// Tenant `acme`, scope `read` only.
pub const READ_ONLY_KEY: &str = "mrt_test-readonly-0123456789abcdef0123456789ab";
/// Tenant `acme`, scope `submit` only.
pub const SUBMIT_ONLY_KEY: &str = "mrt_test-submitonly-0123456789abcdef0123456789";
/// Tenant `acme`, no scope: may only call `/v1/runtime` and `/v1/providers`.
pub const NO_SCOPE_KEY: &str = "mrt_test-noscope-0123456789abcdef0123456789abc";
/// Configured nowhere.
pub const WRONG_KEY: &str = "mrt_test-wrong-0123456789abcdef0123456789abcdef";

/// Every key of the matrix (for log greps), with the configured ones' hashes.
pub const ALL_KEYS: [&str; 6] = [
    OWNER_KEY,
    RIVAL_KEY,
    READ_ONLY_KEY,
    SUBMIT_ONLY_KEY,
    NO_SCOPE_KEY,
    WRONG_KEY,
];

/// Lowercase hex SHA-256 of `key`.
pub fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One entry of a deployment's `auth.keys`: `key` (stored as its SHA-256) of `tenant`.
pub fn key_entry(id: &str, tenant: &str, key: &str, scopes: Value) -> Value {
    json!({"id": id, "tenant": tenant, "sha256": sha256_hex(key), "scopes": scopes})
}

/// The test API key of tenant `tenant` (what [`tenant_keys`] is given by the suites whose
/// deployments name their own tenants).
pub fn tenant_key(tenant: &str) -> String {
    format!("mrt-test-{tenant}-5f1c0e9a7b2d4c6e8a0b1c2d3e4f5a6b")
}

/// `auth.keys` with one key of every scope per tenant: `TENANT-key`, the key `api_key(TENANT)`.
pub fn tenant_keys(tenants: &[&str], api_key: impl Fn(&str) -> String) -> Vec<Value> {
    tenants
        .iter()
        .map(|t| {
            let scopes = json!(["submit", "read", "cancel"]);
            key_entry(&format!("{t}-key"), t, &api_key(t), scopes)
        })
        .collect()
}

/// The deployment's `auth` section for the matrix keys.
pub fn auth_section() -> Value {
    let key = key_entry;
    json!({
        "tenants": {"acme": {}, "rival": {}},
        "keys": [
            key("acme-owner", "acme", OWNER_KEY, json!(["submit", "read", "cancel"])),
            key("rival-all", "rival", RIVAL_KEY, json!(["submit", "read", "cancel"])),
            key("acme-read", "acme", READ_ONLY_KEY, json!(["read"])),
            key("acme-submit", "acme", SUBMIT_ONLY_KEY, json!(["submit"])),
            key("acme-none", "acme", NO_SCOPE_KEY, json!([])),
        ]
    })
}

/// One response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The headers that must match between two answers (all but `date`).
    fn comparable_headers(&self) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<(String, Vec<u8>)> = self
            .headers
            .iter()
            .filter(|(name, _)| name.as_str() != "date")
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect();
        out.sort();
        out
    }
}

/// A request to one gateway with an optional bearer key.
pub async fn call(
    base: &str,
    method: Method,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Answer {
    let client = http_client();
    let mut request = client.request(method, format!("{base}{path}"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let body = if headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
    {
        // Streams of a slow execution: the head is enough.
        bytes::Bytes::new()
    } else {
        response.bytes().await.expect("body")
    };
    Answer {
        status,
        headers,
        body,
    }
}

fn assert_unauthenticated(answer: &Answer, what: &str) {
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{what}");
    assert_eq!(
        answer.headers.get("www-authenticate").map(|v| v.as_bytes()),
        Some(&b"Bearer"[..]),
        "{what}"
    );
    let error = &answer.json()["error"];
    assert_eq!(error["code"], "unauthenticated", "{what}");
    assert_eq!(error["retryable"], false, "{what}");
}

fn assert_forbidden(answer: &Answer, what: &str) {
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{what}");
    assert_eq!(
        answer.json()["error"]["code"],
        "permission_denied",
        "{what}"
    );
    assert!(answer.headers.get("www-authenticate").is_none(), "{what}");
}

/// `rival`'s answer is byte for byte the answer for an id that does not exist.
fn assert_same_as_unknown(rival: &Answer, unknown: &Answer, what: &str) {
    assert_eq!(rival.status, StatusCode::NOT_FOUND, "{what}");
    assert_eq!(rival.status, unknown.status, "{what}");
    assert_eq!(rival.body, unknown.body, "{what}");
    assert_eq!(
        rival.comparable_headers(),
        unknown.comparable_headers(),
        "{what}"
    );
}

fn is_event_stream(answer: &Answer) -> bool {
    answer.status == StatusCode::OK
        && answer
            .headers
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// One request of the matrix, sent as one key after another.
struct Route<'a> {
    base: &'a str,
    method: Method,
    path: &'a str,
    headers: &'a [(&'a str, &'a str)],
    body: Option<&'a Value>,
}

impl<'a> Route<'a> {
    /// `POST /v1/executions` of `body` on `base`.
    fn submit(base: &'a str, headers: &'a [(&'a str, &'a str)], body: &'a Value) -> Self {
        Self {
            base,
            method: Method::POST,
            path: "/v1/executions",
            headers,
            body: Some(body),
        }
    }

    /// `method path` on `base`, without a body.
    fn plain(
        base: &'a str,
        method: Method,
        path: &'a str,
        headers: &'a [(&'a str, &'a str)],
    ) -> Self {
        Self {
            base,
            method,
            path,
            headers,
            body: None,
        }
    }

    async fn send(&self, key: Option<&str>) -> Answer {
        call(
            self.base,
            self.method.clone(),
            self.path,
            key,
            self.headers,
            self.body,
        )
        .await
    }

    /// Without a key and with an unknown one: unauthenticated (`WHAT, no key`, `WHAT, wrong
    /// key`).
    async fn assert_needs_key(&self, what: &str) {
        for (key, how) in [(None, "no key"), (Some(WRONG_KEY), "wrong key")] {
            assert_unauthenticated(&self.send(key).await, &format!("{what}, {how}"));
        }
    }

    /// [`Route::assert_needs_key`], then `weak_key`, which lacks `scope`: forbidden.
    async fn assert_needs_scope(&self, what: &str, weak_key: &str, scope: &str) {
        self.assert_needs_key(what).await;
        let answer = self.send(Some(weak_key)).await;
        assert_forbidden(&answer, &format!("{what} without the {scope} scope"));
    }
}

/// Runs the matrix. `submit_on` is where executions are created, `read_on` where every other
/// route is called (the same gateway, or another one of the cluster). `request` must run long
/// enough (a slow mock) that the owner's execution is still running when it is cancelled at
/// the end.
pub async fn run(submit_on: &str, read_on: &str, request: &Value) {
    use Method as M;
    let sse = [("accept", "text/event-stream")];

    // --- submit (JSON) ---
    let submit = Route::submit(submit_on, &[], request);
    let owned = submit.send(Some(OWNER_KEY)).await;
    assert_eq!(
        owned.status,
        StatusCode::ACCEPTED,
        "owner submit: {:?}",
        owned.json()
    );
    let id = owned.json()["execution_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let rival_own = submit.send(Some(RIVAL_KEY)).await;
    assert_eq!(
        rival_own.status,
        StatusCode::ACCEPTED,
        "another tenant submits its own"
    );
    submit
        .assert_needs_scope("submit", READ_ONLY_KEY, "submit")
        .await;

    // --- submit (SSE) ---
    let submit_sse = Route::submit(submit_on, &sse, request);
    let answer = submit_sse.send(Some(OWNER_KEY)).await;
    assert!(
        is_event_stream(&answer),
        "owner submit as SSE: {:?}",
        answer.status
    );
    submit_sse
        .assert_needs_scope("SSE submit", READ_ONLY_KEY, "submit")
        .await;

    // --- idempotent replay: keys are scoped per tenant ---
    let idem_key = format!("matrix-{id}");
    let keyed = [("idempotency-key", idem_key.as_str())];
    let keyed_sse = [
        ("idempotency-key", idem_key.as_str()),
        ("accept", "text/event-stream"),
    ];
    let first = Route::submit(submit_on, &keyed, request)
        .send(Some(OWNER_KEY))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    let keyed_id = first.json()["execution_id"].clone();
    let replay_route = Route::submit(read_on, &keyed, request);
    let replay = replay_route.send(Some(OWNER_KEY)).await;
    assert_eq!(replay.status, StatusCode::OK, "owner replay");
    assert_eq!(replay.json()["execution_id"], keyed_id);
    assert_eq!(replay.json()["idempotent_replay"], true);
    let replay_sse = Route::submit(read_on, &keyed_sse, request)
        .send(Some(OWNER_KEY))
        .await;
    assert!(is_event_stream(&replay_sse), "owner SSE replay");
    // Another tenant's same key and body is a new execution of its own, never a replay.
    let rival_same = replay_route.send(Some(RIVAL_KEY)).await;
    assert_eq!(
        rival_same.status,
        StatusCode::ACCEPTED,
        "rival, same key: {:?}",
        rival_same.json()
    );
    assert_ne!(rival_same.json()["execution_id"], keyed_id);
    assert_eq!(rival_same.json()["idempotent_replay"], false);
    // A different body under the same key tells the rival nothing (no 422).
    let mut other_body = request.clone();
    other_body["metadata"] = json!({"variant": "rival"});
    let fresh_key = format!("matrix-fresh-{id}");
    let fresh = [("idempotency-key", fresh_key.as_str())];
    let first = Route::submit(submit_on, &fresh, request)
        .send(Some(OWNER_KEY))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    let rival_diff = Route::submit(read_on, &fresh, &other_body)
        .send(Some(RIVAL_KEY))
        .await;
    assert_eq!(
        rival_diff.status,
        StatusCode::ACCEPTED,
        "no idempotency_conflict across tenants"
    );
    replay_route
        .assert_needs_scope("replay", READ_ONLY_KEY, "submit")
        .await;

    // --- reads: snapshot, result, events (with and without a cursor) ---
    let unknown = "00000000-0000-4000-8000-000000000000";
    let reads = [
        (
            "snapshot",
            format!("/v1/executions/{id}"),
            format!("/v1/executions/{unknown}"),
            vec![],
        ),
        (
            "result",
            format!("/v1/executions/{id}/result"),
            format!("/v1/executions/{unknown}/result"),
            vec![],
        ),
        (
            "events",
            format!("/v1/executions/{id}/events"),
            format!("/v1/executions/{unknown}/events"),
            vec![],
        ),
        (
            "events after 1",
            format!("/v1/executions/{id}/events?after=1"),
            format!("/v1/executions/{unknown}/events?after=1"),
            vec![],
        ),
        (
            "events, Last-Event-ID",
            format!("/v1/executions/{id}/events"),
            format!("/v1/executions/{unknown}/events"),
            vec![("last-event-id", "1")],
        ),
    ];
    for (what, path, unknown_path, headers) in &reads {
        let read = Route::plain(read_on, M::GET, path, headers);
        let owner = read.send(Some(OWNER_KEY)).await;
        match *what {
            "snapshot" => assert_eq!(owner.status, StatusCode::OK, "owner {what}"),
            "result" => assert!(
                matches!(owner.status, StatusCode::OK | StatusCode::CONFLICT),
                "owner {what}: {}",
                owner.status
            ),
            _ => assert!(is_event_stream(&owner), "owner {what}: {}", owner.status),
        }
        let read_only = read.send(Some(READ_ONLY_KEY)).await;
        assert_eq!(
            read_only.status, owner.status,
            "read scope suffices for {what}"
        );
        let rival = read.send(Some(RIVAL_KEY)).await;
        let unknown = Route::plain(read_on, M::GET, unknown_path, headers)
            .send(Some(RIVAL_KEY))
            .await;
        assert_same_as_unknown(&rival, &unknown, &format!("{what} by another tenant"));
        read.assert_needs_scope(what, SUBMIT_ONLY_KEY, "read").await;
    }

    // --- cancel ---
    let cancel_path = format!("/v1/executions/{id}/cancel");
    let cancel = Route::plain(read_on, M::POST, &cancel_path, &[]);
    let rival = cancel.send(Some(RIVAL_KEY)).await;
    let unknown_cancel = format!("/v1/executions/{unknown}/cancel");
    let unknown = Route::plain(read_on, M::POST, &unknown_cancel, &[])
        .send(Some(RIVAL_KEY))
        .await;
    assert_same_as_unknown(&rival, &unknown, "cancel by another tenant");
    cancel
        .assert_needs_scope("cancel", READ_ONLY_KEY, "cancel")
        .await;
    // None of those touched the execution; the owner can still cancel it.
    let snapshot_path = format!("/v1/executions/{id}");
    let snapshot = Route::plain(read_on, M::GET, &snapshot_path, &[])
        .send(Some(OWNER_KEY))
        .await;
    assert_ne!(
        snapshot.json()["status"],
        "cancelled",
        "{:?}",
        snapshot.json()
    );
    let answer = cancel.send(Some(OWNER_KEY)).await;
    assert_eq!(
        answer.status,
        StatusCode::ACCEPTED,
        "owner cancels: {:?}",
        answer.json()
    );

    // --- runtime and providers: any valid key ---
    for path in ["/v1/runtime", "/v1/providers"] {
        let route = Route::plain(read_on, M::GET, path, &[]);
        for key in [OWNER_KEY, RIVAL_KEY, NO_SCOPE_KEY] {
            let answer = route.send(Some(key)).await;
            assert_eq!(answer.status, StatusCode::OK, "{path}");
        }
        route.assert_needs_key(path).await;
    }
    // Unknown /v1 routes need a key too; health and metrics never do.
    assert_unauthenticated(
        &call(read_on, M::GET, "/v1/nothing", None, &[], None).await,
        "unknown /v1 route",
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = call(read_on, M::GET, path, None, &[], None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path} without a key");
    }
}
