//! The OpenAI-compatible API (contract.md section 10) driven by the official `openai` Python
//! SDK and npm package, unchanged (`tests/openai/sdk_check.py` and `sdk_check.cjs`, installed
//! by `scripts/test.sh`), against a
//! real embedded gateway with API keys for three tenants; and the raw HTTP shapes the SDK
//! does not show (error bodies, headers, ids across the native and OpenAI routes).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;

fn api_key(tenant: &str) -> String {
    format!("mrt-openai-test-{tenant}-5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d")
}

/// `model-alpha` (the default mock's three chunks), `model-slow` (ten chunks, 200 ms apart)
/// and `model-stuck` (a minute per chunk: still running when cancelled); tenants `acme` and
/// `other` without limits, `limited` with one submit token.
async fn gateway() -> Gateway {
    let keys = auth_matrix::tenant_keys(&["acme", "other", "limited"], api_key);
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

/// Whether the SDK is installed (`scripts/test.sh` installs it; a bare `cargo test` on a
/// machine without it fails with this message rather than an obscure import error).
fn python_with_sdk() -> bool {
    Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_works_unchanged() {
    assert!(
        python_with_sdk(),
        "the openai Python package is missing: run scripts/test.sh, which installs it"
    );
    let gw = gateway().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai/sdk_check.py");
    let base = gw.url("/v1");
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .env("OPENAI_BASE_URL", base)
            .env("MRT_KEY", api_key("acme"))
            .env("MRT_OTHER_KEY", api_key("other"))
            .env("MRT_LIMITED_KEY", api_key("limited"))
            .env_remove("OPENAI_API_KEY")
            .output()
            .expect("run python3")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for case in [
        "create_plain",
        "create_stream",
        "background",
        "resume",
        "stream_helper",
        "cancel",
        "chat",
        "models",
        "idempotency",
        "errors",
    ] {
        assert!(
            stdout.contains(&format!("ok {case}\n")),
            "{case}:\n{stdout}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_node_sdk_works_unchanged() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai");
    assert!(
        std::path::Path::new(dir)
            .join("node_modules/openai")
            .exists(),
        "the openai npm package is missing: run scripts/test.sh, which installs it"
    );
    let gw = gateway().await;
    let base = gw.url("/v1");
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(format!("{dir}/sdk_check.cjs"))
            .env("OPENAI_BASE_URL", base)
            .env("MRT_KEY", api_key("acme"))
            .env_remove("OPENAI_API_KEY")
            .output()
            .expect("run node")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for case in ["create", "stream", "background", "resume", "cancel"] {
        assert!(
            stdout.contains(&format!("ok {case}\n")),
            "{case}:\n{stdout}"
        );
    }
}

async fn post(gw: &Gateway, path: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = gw.client.post(gw.url(path)).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_take_openai_shape_and_echo_nothing_while_native_routes_keep_theirs() {
    let gw = gateway().await;
    let acme = api_key("acme");
    // 401 on an OpenAI route: OpenAI's shape and WWW-Authenticate.
    let r = post(
        &gw,
        "/v1/responses",
        None,
        &json!({"model": "model-alpha", "input": "hi"}),
    )
    .await;
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
        let r = gw
            .client
            .get(gw.url(&format!("/v1/responses/{id}")))
            .bearer_auth(&acme)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["type"], "not_found_error");
    }
    // Unknown routes below the OpenAI ones answer in OpenAI's shape too.
    let r = gw
        .client
        .get(gw.url("/v1/responses/resp_x/input_items"))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_made_through_one_api_reads_through_the_other() {
    let gw = gateway().await;
    let acme = api_key("acme");
    let r = post(
        &gw,
        "/v1/responses",
        Some(&acme),
        &json!({"model": "model-alpha", "input": "hi"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let response: Value = r.json().await.unwrap();
    assert_eq!(response["status"], "completed");
    let hex = response["id"]
        .as_str()
        .unwrap()
        .trim_start_matches("resp_")
        .to_owned();
    let native = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    let snapshot: Value = gw
        .client
        .get(gw.url(&format!("/v1/executions/{native}")))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(snapshot["status"], "succeeded");
    assert_eq!(snapshot["result"]["outputs"][0]["text"], "hello from mock");
    // And a native execution reads as a Response, by either id.
    let submitted: Value = gw
        .client
        .post(gw.url("/v1/executions"))
        .bearer_auth(&acme)
        .json(&text_request("hi"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = submitted["execution_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let r: Value = gw
            .client
            .get(gw.url(&format!("/v1/responses/{id}")))
            .bearer_auth(&acme)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
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
    let models: Value = gw
        .client
        .get(gw.url("/v1/models"))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
        let body = json!({"model": model, "input": "hi"});
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
    let models: Value = gw
        .client
        .get(gw.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let r = post(
        &gw2,
        "/v1/responses",
        None,
        &json!({"model": "model-beta", "input": "hi"}),
    )
    .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["status"], "failed",
        "never served by another model: {body}"
    );
    assert_eq!(body["error"]["code"], "provider_unavailable");
}
