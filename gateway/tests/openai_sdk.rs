//! The OpenAI-compatible API (contract.md section 10) driven by the official `openai` Python
//! SDK and npm package, unchanged (`tests/openai/sdk_check.py` and `sdk_check.cjs`, installed
//! by `scripts/test.sh`), against a
//! real embedded gateway with API keys for three tenants; and the raw HTTP shapes the SDK
//! does not show (error bodies, headers, ids across the native and OpenAI routes).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;
use testkit::gateway::auth_matrix::tenant_key;
use testkit::openai_sdk::{NODE_CASES, PYTHON_CASES, Sdk};

/// `model-alpha` (the default mock's three chunks), `model-slow` (ten chunks, 200 ms apart)
/// and `model-stuck` (a minute per chunk: still running when cancelled); tenants `acme` and
/// `other` without limits, `limited` with one submit token.
async fn gateway() -> Gateway {
    let keys = auth_matrix::tenant_keys(&["acme", "other", "limited"], tenant_key);
    let slow = mock(
        "provider-slow",
        json!({"model": "model-slow", "chunks": vec!["s "; 10], "delay_ms": 200}),
    );
    let stuck = mock(
        "provider-stuck",
        json!({"model": "model-stuck", "delay_ms": 60_000}),
    );
    Gateway::start(deployment(
        vec![mock("provider-mock", json!({})), slow, stuck],
        json!({"auth": {
            "tenants": {"acme": {}, "other": {}, "limited": {"submits_per_second": 0.001, "burst": 1}},
            "keys": keys
        }}),
    ))
    .await
}

/// Runs `sdk`'s check script against a fresh [`gateway`] with the key of each `(variable,
/// tenant)`, and asserts that it passed `cases`.
async fn check_sdk(sdk: Sdk, keys: &[(&'static str, &str)], cases: &[&str]) {
    sdk.assert_installed();
    let gw = gateway().await;
    let mut env = vec![("OPENAI_BASE_URL", gw.url("/v1"))];
    env.extend(
        keys.iter()
            .map(|(variable, tenant)| (*variable, tenant_key(tenant))),
    );
    let output = sdk.spawn(env).await.unwrap();
    sdk.assert_passed(&output, cases, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_works_unchanged() {
    let keys = [
        ("MRT_KEY", "acme"),
        ("MRT_OTHER_KEY", "other"),
        ("MRT_LIMITED_KEY", "limited"),
    ];
    check_sdk(Sdk::Python, &keys, &PYTHON_CASES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_node_sdk_works_unchanged() {
    check_sdk(Sdk::Node, &[("MRT_KEY", "acme")], &NODE_CASES).await;
}

/// A Responses request saying "hi" to `model`.
fn say_hi(model: &str) -> Value {
    json!({"model": model, "input": "hi"})
}

async fn post(gw: &Gateway, path: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = gw.client.post(gw.url(path)).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

/// The status and JSON body of `GET path`, with `key` as the bearer token if there is one.
async fn get(gw: &Gateway, path: &str, key: Option<&str>) -> (StatusCode, Value) {
    let mut request = gw.client.get(gw.url(path));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_take_openai_shape_and_echo_nothing_while_native_routes_keep_theirs() {
    let gw = gateway().await;
    let acme = tenant_key("acme");
    // 401 on an OpenAI route: OpenAI's shape and WWW-Authenticate.
    let r = post(&gw, "/v1/responses", None, &say_hi("model-alpha")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error");
    assert!(body["error"].get("retryable").is_none());
    // The native route keeps its own shape.
    let r = gw.submit(&text_request("hi")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthenticated");
    assert_eq!(body["error"]["retryable"], false);
    // Refused features name their field; nothing of the request comes back.
    for (body, param) in [
        (
            json!({"model": "model-alpha", "input": "hi", "previous_response_id": CANARY}),
            "previous_response_id",
        ),
        (
            json!({"model": "model-alpha", "input": "hi", "conversation": CANARY}),
            "conversation",
        ),
        (
            json!({"model": "model-alpha", "input": "hi", "tools": [{"type": "web_search", "x": CANARY}]}),
            "tools",
        ),
        (json!({"model": CANARY, "input": "hi"}), "model"),
    ] {
        let r = post(&gw, "/v1/responses", Some(&acme), &body).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(!text.contains(CANARY), "{text}");
        let json: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["error"]["param"], param, "{text}");
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{status}"
        );
    }
    // Tools need the model's declared capability (the mock declares none).
    let tools = json!({"model": "model-alpha", "input": "hi",
                       "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]});
    let r = post(&gw, "/v1/responses", Some(&acme), &tools).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = post(
        &gw,
        "/v1/chat/completions",
        Some(&acme),
        &json!({"model": "model-alpha", "messages": [], "n": 3}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // An unknown response and a malformed id are the same 404.
    for id in [
        "resp_00000000000000000000000000000000",
        "resp_x",
        "nope",
        "%ff%fe",
    ] {
        let (status, body) = get(&gw, &format!("/v1/responses/{id}"), Some(&acme)).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["type"], "not_found_error");
    }
    // Unknown routes below the OpenAI ones answer in OpenAI's shape too.
    let (status, body) = get(&gw, "/v1/responses/resp_x/input_items", Some(&acme)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["type"], "not_found_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_made_through_one_api_reads_through_the_other() {
    let gw = gateway().await;
    let acme = tenant_key("acme");
    let r = post(&gw, "/v1/responses", Some(&acme), &say_hi("model-alpha")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let response: Value = r.json().await.unwrap();
    assert_eq!(response["status"], "completed");
    let hex = response["id"].as_str().unwrap().trim_start_matches("resp_");
    let native = uuid::Uuid::parse_str(hex).unwrap();
    let (_, snapshot) = get(&gw, &format!("/v1/executions/{native}"), Some(&acme)).await;
    assert_eq!(snapshot["status"], "succeeded");
    assert_eq!(snapshot["result"]["outputs"][0]["text"], "hello from mock");
    // And a native execution reads as a Response, by either id.
    let submitted: Value = post(&gw, "/v1/executions", Some(&acme), &text_request("hi"))
        .await
        .json()
        .await
        .unwrap();
    let id = submitted["execution_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, r) = get(&gw, &format!("/v1/responses/{id}"), Some(&acme)).await;
        assert_eq!(r["object"], "response");
        assert_eq!(r["id"], format!("resp_{}", id.replace('-', "")));
        if r["status"] == "completed" {
            assert_eq!(r["output"][0]["content"][0]["text"], "hello from mock");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{r}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Models list in OpenAI's shape.
    let (_, models) = get(&gw, "/v1/models", Some(&acme)).await;
    assert_eq!(models["object"], "list");
    assert_eq!(
        models["data"][0],
        json!({"id": "model-alpha", "object": "model", "created": 0, "owned_by": "provider-mock"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_names_a_provider_and_fallback_stays_within_the_model() {
    // `model-beta` is served by two providers, the first failing retryably; `model-gamma` by
    // one that always works, which a `model-beta` request must never reach.
    let beta =
        |id: &str, fail: bool| mock(id, json!({"model": "model-beta", "fail_retryably": fail}));
    let gw = Gateway::start(deployment(
        vec![
            beta("flaky", true),
            beta("steady", false),
            mock("gamma", json!({"model": "model-gamma"})),
        ],
        json!({}),
    ))
    .await;
    let create = |model: &str| {
        let body = say_hi(model);
        let gw = &gw;
        async move {
            let r = post(gw, "/v1/responses", None, &body).await;
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = create("model-beta").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "ambiguous: {body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    let (status, body) = create("flaky/model-beta").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["status"], "completed",
        "fell back to the other provider of the model"
    );
    assert_eq!(body["model"], "model-beta");
    let (_, models) = get(&gw, "/v1/models", None).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["flaky/model-beta", "steady/model-beta", "model-gamma"]
    );

    let gw2 = Gateway::start(deployment(
        vec![
            beta("flaky", true),
            mock("gamma", json!({"model": "model-gamma"})),
        ],
        json!({}),
    ))
    .await;
    let r = post(&gw2, "/v1/responses", None, &say_hi("model-beta")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["status"], "failed",
        "never served by another model: {body}"
    );
    assert_eq!(body["error"]["code"], "provider_unavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_create_is_answered_like_a_small_one_and_its_key_replays() {
    // Above `runtime::apart::APART_BYTES`: parsed, translated and fingerprinted on the
    // blocking pool.
    let big = "word ".repeat(40_000);
    assert!(big.len() > runtime::apart::APART_BYTES);
    let gw = gateway().await;
    let acme = tenant_key("acme");
    let chat = json!({"model": "model-alpha", "messages": [{"role": "user", "content": big}]});
    let r = post(&gw, "/v1/chat/completions", Some(&acme), &chat).await;
    assert_eq!(r.status(), StatusCode::OK);
    let completion: Value = r.json().await.unwrap();
    assert_eq!(
        completion["choices"][0]["message"]["content"], "hello from mock",
        "{completion}"
    );
    let keyed = |body: &Value| {
        gw.client
            .post(gw.url("/v1/responses"))
            .bearer_auth(&acme)
            .header("idempotency-key", "large-create")
            .json(body)
    };
    let body = json!({"model": "model-alpha", "input": big});
    let first: Value = keyed(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(first["status"], "completed", "{first}");
    let again: Value = keyed(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        again["id"], first["id"],
        "the same key replays the same execution"
    );
    let other = json!({"model": "model-alpha", "input": format!("{big}!")});
    let conflict = keyed(&other).send().await.unwrap();
    assert_eq!(conflict.status(), StatusCode::UNPROCESSABLE_ENTITY);
}
