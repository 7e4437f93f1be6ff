//! HTTP-level tests of the JSON endpoints over real loopback HTTP: submission, validation,
//! idempotency, snapshots, results, cancellation, admission, deadlines, fallback, and the
//! runtime/provider/health endpoints (contract.md sections 2-3; `[R n]` items are
//! reference-behaviours.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;

// ---------------------------------------------------------------------------------------------
// Submission [R 15]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_is_202_with_the_submission_shape_and_json_headers() {
    let gw = Gateway::start_default().await;
    let (status, headers, body) = json_parts(gw.submit(&text_request("hi")).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_json_headers(&headers);
    let object = body.as_object().expect("object");
    let mut keys: Vec<_> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["created_at", "execution_id", "idempotent_replay", "status"]
    );
    let id = body["execution_id"].as_str().expect("id");
    assert!(is_uuid_v4(id), "execution_id {id} is a canonical UUID v4");
    assert_eq!(body["status"], "accepted");
    assert_eq!(body["idempotent_replay"], false);
    let created_at = body["created_at"].as_str().expect("created_at");
    assert!(is_iso_millis(created_at), "created_at {created_at}");
    // `execution.accepted` is stored before the response [R 15].
    let snapshot = gw.snapshot(id).await;
    assert_eq!(snapshot["created_at"], created_at);
    assert!(snapshot["last_sequence"].as_u64().expect("last_sequence") >= 1);
    // Every submission is a new execution.
    let other = gw.submit_ok(&text_request("hi")).await;
    assert_ne!(other, id);
    assert_eq!(gw.accepted_count().await, 2.0);
}

// ---------------------------------------------------------------------------------------------
// Validation [R 1-8], contract section 2 (415, 413, 400)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_json_content_type_is_415_and_creates_nothing() {
    let gw = Gateway::start_default().await;
    let body = text_request("hi").to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("text/json"),
        None,
    ] {
        let response = json_parts(gw.submit_as(content_type, body.clone()).await).await;
        assert_invalid_request(&response, 415, "Content-Type must be application/json");
    }
    assert_eq!(gw.accepted_count().await, 0.0);
    // Parameters and case do not matter [R 1].
    for content_type in ["application/json; charset=utf-8", "Application/JSON"] {
        let response = gw.submit_as(Some(content_type), body.clone()).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "{content_type}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_413_with_or_without_content_length() {
    let gw = Gateway::start(default_deployment(
        json!({ "limits": { "max_body_bytes": 2048 } }),
    ))
    .await;
    let big = text_request(&"x".repeat(3000)).to_string();
    // Chunked: no declared length, the limit is enforced while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.as_bytes().chunks(500).map(|c| Ok(c.to_vec())).collect();
    let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    // First with the declared length over the limit, then chunked.
    for body in [reqwest::Body::from(big), streamed] {
        let response = json_parts(gw.submit_raw(body, &[]).await).await;
        assert_invalid_request(&response, 413, "Request body exceeds the size limit");
    }
    assert_eq!(gw.accepted_count().await, 0.0);
    // Just under the limit is fine.
    let fits = text_request(&"x".repeat(1900)).to_string();
    assert!(fits.len() <= 2048);
    let response = gw.submit_raw(fits, &[]).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_is_400() {
    let gw = Gateway::start_default().await;
    for body in [
        "",
        "{",
        "{not json}",
        r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"}]} trailing"#,
        "\u{feff}{}",
    ] {
        let response = json_parts(gw.submit_raw(body.to_owned(), &[]).await).await;
        assert_invalid_request(&response, 400, "Request body must be valid JSON");
    }
    assert_eq!(gw.accepted_count().await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_violations_are_400_and_never_echo_caller_text() {
    let gw = Gateway::start_default().await;
    let text = json!([{ "type": "text", "text": "hi" }]);
    let cases = [
        // Unknown root property named by the caller.
        json!({ "ability": "text-generation", "input": text, CANARY: 1 }),
        // Unknown property in an input part.
        json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "hi", CANARY: true }] }),
        // Metadata key with a value of the wrong type.
        json!({ "ability": "text-generation", "input": text, "metadata": { CANARY: { "nested": 1 } } }),
        // Ability text with another violation (no input).
        json!({ "ability": CANARY }),
        json!({ "ability": CANARY, "input": [] }),
        json!({ "ability": "", "input": text }),
        json!({ "ability": "x".repeat(257), "input": text }),
        json!({ "ability": "text-generation", "input": text, "deadline_ms": "100" }),
        json!({ "ability": "text-generation", "input": text, "deadline_ms": 0 }),
        json!({ "ability": "text-generation", "input": text, "deadline_ms": 86_400_001 }),
        json!({ "ability": "text-generation", "input": text, "routing": { "max_attempts": 0 } }),
        json!({ "ability": "text-generation", "input": [{ "type": CANARY, "text": "hi" }] }),
        json!([1, 2, 3]),
    ];
    for body in cases {
        let response = gw.submit(&body).await;
        let raw = response.text().await.expect("body");
        testkit::canary::assert_absent(CANARY, &format!("the answer to {body}"), &raw);
        let parsed: Value = serde_json::from_str(&raw).expect("json");
        assert_eq!(
            parsed,
            json!({ "error": {
                "code": "invalid_request",
                "message": "Request does not match the execution schema",
                "retryable": false,
            }}),
            "for {body}"
        );
    }
    // A schema-valid request whose ability nobody serves: 422, still no echo.
    let response = gw
        .submit(&json!({ "ability": CANARY, "input": text, "metadata": { CANARY: CANARY } }))
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let raw = response.text().await.expect("body");
    testkit::canary::assert_absent(CANARY, "the 422 answer", &raw);
    assert_eq!(gw.accepted_count().await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capability_unavailable_is_422_synchronously_and_creates_nothing() {
    let gw = Gateway::start_default().await;
    let cases = [
        // Image input to the text-only mock: inferred modality [R 25].
        json!({ "ability": "text-generation", "input": [{ "type": "image", "uri": "https://example.com/a.png" }] }),
        // Narrowing the requirements cannot bypass the inferred modality.
        json!({
            "ability": "text-generation",
            "input": [{ "type": "text", "text": "hi" }, { "type": "image", "uri": "https://example.com/a.png" }],
            "requirements": { "input_modalities": ["text"] },
        }),
        json!({ "ability": "image-generation", "input": [{ "type": "text", "text": "hi" }] }),
        json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "hi" }], "requirements": { "tools": true } }),
    ];
    for body in cases {
        let response = json_parts(gw.submit(&body).await).await;
        assert_error(
            &response,
            422,
            "capability_unavailable",
            "No provider satisfies the requested ability and capabilities",
            false,
        );
    }
    assert_eq!(gw.accepted_count().await, 0.0);
    assert_eq!(
        gw.metric("mrt_submissions_total{outcome=\"rejected\"}")
            .await,
        4.0
    );
    assert_eq!(gw.metric("mrt_sse_streams_opened_total").await, 0.0);
}

// ---------------------------------------------------------------------------------------------
// Idempotency [R 9-12], contract section 3

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_replay_is_200_with_the_same_execution_and_its_current_status() {
    let gw = Gateway::start_default().await;
    let first = r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"}],"metadata":{"a":"1","b":2}}"#;
    let reordered = r#"{"metadata":{"b":2,"a":"1"},"input":[{"text":"hi","type":"text"}],"ability":"text-generation"}"#;
    let key = [("idempotency-key", "order-42")];
    let (status, _, created) = json_parts(gw.submit_raw(first, &key).await).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(created["idempotent_replay"], false);
    let id = created["execution_id"].as_str().expect("id");
    gw.wait_status(id, "succeeded").await;

    let (status, headers, replay) = json_parts(gw.submit_raw(reordered, &key).await).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_json_headers(&headers);
    assert_eq!(
        replay,
        json!({
            "execution_id": id,
            "status": "succeeded",
            "created_at": created["created_at"],
            "idempotent_replay": true,
        })
    );
    assert_eq!(gw.accepted_count().await, 1.0);
    assert_eq!(
        gw.metric("mrt_submissions_total{outcome=\"replayed\"}")
            .await,
        1.0
    );
    // The replay did not run the execution again.
    assert_eq!(gw.snapshot(id).await["last_sequence"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_execution_was_evicted_creates_a_new_execution() {
    // [R 13]: the identity goes with its execution. Two executions retained: the keyed one is
    // evicted by two later ones, and the key then creates a new execution (it answered a
    // retryable "no longer retained" for the key's whole retention, 24 h).
    let gw = Gateway::start(default_deployment(
        json!({ "event_store": { "type": "memory", "max_executions": 2 } }),
    ))
    .await;
    let key = [("idempotency-key", "evicted-1")];
    let (status, _, first) = json_parts(gw.submit_with(&text_request("hi"), &key).await).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let first_id = first["execution_id"].as_str().expect("id").to_owned();
    gw.wait_terminal(&first_id).await;
    for _ in 0..2 {
        let other = gw.submit_ok(&text_request("other")).await;
        gw.wait_terminal(&other).await;
    }
    assert_eq!(
        gw.get_json(&format!("/v1/executions/{first_id}")).await.0,
        StatusCode::NOT_FOUND
    );

    // Within the replay wait (2 s) of the binding, a missing log may still be being created:
    // 503, retryable; past it, the key is bound anew.
    let started = std::time::Instant::now();
    let (status, again) = loop {
        let (status, _, body) = json_parts(gw.submit_with(&text_request("hi"), &key).await).await;
        if status != StatusCode::SERVICE_UNAVAILABLE || started.elapsed() > Duration::from_secs(30)
        {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["idempotent_replay"], false);
    let second_id = again["execution_id"].as_str().expect("id");
    assert_ne!(second_id, first_id);
    // The key is bound to the new execution now: a retry replays it.
    let (status, _, replay) = json_parts(gw.submit_with(&text_request("hi"), &key).await).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(replay["execution_id"], second_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_reused_with_a_different_request_is_422() {
    let gw = Gateway::start_default().await;
    let key = format!("key-{CANARY}");
    let headers = [("idempotency-key", key.as_str())];
    let first = gw.submit_with(&text_request("one"), &headers).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let id = first.json::<Value>().await.expect("json")["execution_id"].clone();
    for other in [
        text_request("two"),
        json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "one" }], "deadline_ms": 1000 }),
    ] {
        let response = gw.submit_with(&other, &headers).await;
        let status = response.status();
        let h = response.headers().clone();
        let raw = response.text().await.expect("body");
        testkit::canary::assert_absent(CANARY, "the answer to a reused key", &raw);
        assert_error(
            &(status, h, serde_json::from_str(&raw).expect("json")),
            422,
            "idempotency_conflict",
            "Idempotency key was already used with a different request",
            false,
        );
    }
    assert_eq!(gw.accepted_count().await, 1.0);
    // The original is untouched and still replays.
    let replay = gw.submit_with(&text_request("one"), &headers).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(
        replay.json::<Value>().await.expect("json")["execution_id"],
        id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_idempotency_keys_are_400_and_create_nothing() {
    let gw = Gateway::start_default().await;
    let body = text_request("hi").to_string();
    let url = gw.url("/v1/executions");
    let bad: Vec<reqwest::header::HeaderValue> = vec![
        reqwest::header::HeaderValue::from_static(""),
        reqwest::header::HeaderValue::from_str(&"k".repeat(257)).expect("value"),
        reqwest::header::HeaderValue::from_static("has space"),
        reqwest::header::HeaderValue::from_static("tab\there"),
        reqwest::header::HeaderValue::from_bytes("caf\u{e9}".as_bytes()).expect("value"),
    ];
    for value in bad {
        let response = gw
            .client
            .post(&url)
            .header("content-type", "application/json")
            .header("idempotency-key", value.clone())
            .body(body.clone())
            .send()
            .await
            .expect("sent");
        let response = json_parts(response).await;
        assert_invalid_request(
            &response,
            400,
            "Idempotency-Key must contain 1 to 256 visible ASCII characters",
        );
    }
    // The key is one header.
    let response = gw
        .client
        .post(&url)
        .header("content-type", "application/json")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_invalid_request(
        &json_parts(response).await,
        400,
        "Idempotency-Key must be sent once",
    );
    assert_eq!(gw.accepted_count().await, 0.0);
    // 256 visible characters are fine.
    let longest = "~".repeat(256);
    let response = gw
        .submit_raw(body, &[("idempotency-key", longest.as_str())])
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_with_one_key_create_exactly_one_execution() {
    // Slow enough that the execution is still running while all 50 arrive.
    let gw = Gateway::start(slow_mock(300, json!({}))).await;
    let body = text_request("once").to_string();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let client = gw.client.clone();
        let url = gw.url("/v1/executions");
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", "shared-key")
                .body(body)
                .send()
                .await
                .expect("sent");
            let status = response.status();
            (status, response.json::<Value>().await.expect("json"))
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    let created: Vec<_> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::ACCEPTED)
        .collect();
    let replayed: Vec<_> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .collect();
    assert_eq!(created.len(), 1, "exactly one creation: {results:?}");
    assert_eq!(replayed.len(), 49, "the rest replay: {results:?}");
    let (_, first) = created[0];
    assert_eq!(first["idempotent_replay"], false);
    for (_, r) in &replayed {
        assert_eq!(r["execution_id"], first["execution_id"]);
        assert_eq!(r["created_at"], first["created_at"]);
        assert_eq!(r["idempotent_replay"], true);
    }
    assert_eq!(gw.accepted_count().await, 1.0);
    assert_eq!(
        gw.metric("mrt_submissions_total{outcome=\"replayed\"}")
            .await,
        49.0
    );
    // One job: one attempt, one clean log.
    let id = first["execution_id"].as_str().expect("id");
    assert_eq!(gw.wait_terminal(id).await["status"], "succeeded");
    let events = gw.stream(id).await.rest().await;
    assert_log(&events, id, 1);
    assert_eq!(types(&events), MOCK_TYPES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_submit_asking_for_events_streams_and_replays_the_stream() {
    let gw = Gateway::start_default().await;
    let headers = [
        ("idempotency-key", "stream-key"),
        ("accept", "text/event-stream"),
    ];
    let mut ids = Vec::new();
    for _ in 0..2 {
        let response = gw.submit_with(&text_request("hi"), &headers).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_sse_headers(response.headers());
        let mut sse = Sse::new(response);
        let events = sse.rest().await;
        assert!(sse.ends_cleanly());
        let id = events[0]["execution_id"].as_str().expect("id").to_owned();
        assert_log(&events, &id, 1);
        assert_eq!(events.len(), 7);
        assert_eq!(events[6]["type"], "execution.completed");
        ids.push(id);
    }
    assert_eq!(ids[0], ids[1], "the replay streams the same execution");
    assert_eq!(gw.accepted_count().await, 1.0);
}

// ---------------------------------------------------------------------------------------------
// Snapshot and result [R 17-20, 56-59]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_of_a_mock_execution_is_materialized_from_its_log() {
    let gw = Gateway::start_default().await;
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_terminal(&id).await;
    let (status, headers, snapshot) = gw.get_json(&format!("/v1/executions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_json_headers(&headers);
    let mut keys: Vec<_> = snapshot
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    // `error` and `artifacts` are unset and therefore omitted [R 17, 59].
    assert_eq!(
        keys,
        [
            "created_at",
            "execution_id",
            "last_sequence",
            "result",
            "status",
            "target",
            "updated_at",
            "usage"
        ]
    );
    assert_eq!(snapshot["execution_id"], id.as_str());
    assert_eq!(snapshot["status"], "succeeded");
    assert_eq!(snapshot["last_sequence"], 7);
    assert_eq!(
        snapshot["target"],
        json!({ "provider": "provider-mock", "model": "model-alpha" })
    );
    assert_eq!(
        snapshot["result"],
        json!({ "outputs": [{ "index": 0, "type": "text", "text": "hello from mock" }], "tool_calls": [] })
    );
    let created_at = snapshot["created_at"].as_str().expect("created_at");
    let updated_at = snapshot["updated_at"].as_str().expect("updated_at");
    assert!(is_iso_millis(created_at) && is_iso_millis(updated_at));
    assert!(updated_at >= created_at);
    // Usage is every usage.reported fact in order [R 57]; updated_at is the last event's time.
    let events = gw.stream(&id).await.rest().await;
    let facts: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "usage.reported")
        .flat_map(|e| e["facts"].as_array().expect("facts").clone())
        .collect();
    assert_eq!(snapshot["usage"], Value::Array(facts));
    let usage: Vec<(&Value, &Value, &Value)> = snapshot["usage"]
        .as_array()
        .expect("usage")
        .iter()
        .map(|f| (&f["unit"], &f["quantity"], &f["source"]))
        .collect();
    assert_eq!(
        usage,
        [
            (&json!("input_token"), &json!(1), &json!("runtime")),
            (&json!("output_token"), &json!(3), &json!("runtime")),
        ]
    );
    assert_eq!(snapshot["updated_at"], events[6]["time"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_malformed_execution_ids_are_404_and_bad_encoding_is_400() {
    let gw = Gateway::start_default().await;
    let unknown = uuid::Uuid::new_v4().to_string();
    for id in [
        unknown.as_str(),
        "not-a-uuid",
        "12345",
        "%7Bdeadbeef%7D",
        &unknown.replace('-', ""),
    ] {
        for suffix in ["", "/result", "/events"] {
            let response = json_parts(gw.get(&format!("/v1/executions/{id}{suffix}")).await).await;
            assert_error(&response, 404, "not_found", "Execution not found", false);
        }
        let (status, headers, body) = gw.cancel(id).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_json_headers(&headers);
        assert_eq!(body, json!({ "status": "not_found" }));
    }
    for bad in ["%zz", "%ff", "abc%", "%E0%A4%A"] {
        // The three reads, then the cancel.
        let mut responses = Vec::new();
        for suffix in ["", "/result", "/events"] {
            responses
                .push(json_parts(gw.get(&format!("/v1/executions/{bad}{suffix}")).await).await);
        }
        responses.push(gw.cancel(bad).await);
        for response in &responses {
            assert_invalid_request(response, 400, "Invalid execution ID encoding");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_result_of_a_successful_execution_is_200_with_empty_artifacts() {
    let gw = Gateway::start_default().await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let snapshot = gw.wait_terminal(&id).await;
    let (status, headers, result) = gw.get_json(&format!("/v1/executions/{id}/result")).await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_json_headers(&headers);
    assert_eq!(
        result,
        json!({
            "execution_id": id,
            "target": { "provider": "provider-mock", "model": "model-alpha" },
            "result": { "outputs": [{ "index": 0, "type": "text", "text": "hello from mock" }], "tool_calls": [] },
            "artifacts": [],
            "usage": snapshot["usage"],
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_result_is_409_with_the_status_while_running_and_after_cancel() {
    let gw = Gateway::start(slow_mock(10000, json!({}))).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    // The mock waits before its first chunk: the execution stays in routing.
    gw.wait_status(&id, "routing").await;
    let (status, headers, body) = gw.get_json(&format!("/v1/executions/{id}/result")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_json_headers(&headers);
    assert_eq!(body, json!({ "status": "routing" }));

    let (status, _, _) = gw.cancel(&id).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    gw.wait_terminal(&id).await;
    let (status, headers, body) = gw.get_json(&format!("/v1/executions/{id}/result")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_json_headers(&headers);
    assert_eq!(
        body,
        json!({
            "status": "cancelled",
            "error": { "code": "cancelled", "message": "Execution was cancelled", "retryable": false },
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Cancellation [R 21, 41]

/// The last of `events` is `execution.failed` with this status and error.
fn assert_failed_last(events: &[Value], status: &str, error: Value) {
    let last = events.last().expect("terminal event");
    assert_eq!(last["type"], "execution.failed");
    assert_eq!(last["status"], status);
    assert_eq!(last["error"], error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_execution_ends_it_cancelled() {
    let gw = Gateway::start(deployment(
        vec![mock(
            "provider-mock",
            json!({ "delay_ms": 200, "chunks": vec!["a"; 100] }),
        )],
        json!({}),
    ))
    .await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let mut sse = gw.stream(&id).await;
    // Wait for output: the provider is mid-stream.
    loop {
        let event = sse.next_json().await.expect("event before the end");
        if event["type"] == "output.delta" {
            break;
        }
    }
    let (status, headers, body) = gw.cancel(&id).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_json_headers(&headers);
    assert_eq!(body, json!({ "status": "cancellation_requested" }));
    let rest = sse.rest().await;
    assert_failed_last(
        &rest,
        "cancelled",
        json!({ "code": "cancelled", "message": "Execution was cancelled", "retryable": false }),
    );
    let snapshot = gw.snapshot(&id).await;
    assert_eq!(snapshot["status"], "cancelled");
    assert_eq!(snapshot["error"]["code"], "cancelled");
    assert!(
        snapshot["last_sequence"].as_u64().expect("seq") < 50,
        "the provider stopped early: {snapshot}"
    );
    // Terminal now: a second cancel is 404.
    let (status, _, body) = gw.cancel(&id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, json!({ "status": "not_found" }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_queued_execution_ends_it_without_running() {
    // One worker slot, occupied by a slow first execution: the second waits in the job queue.
    // Unordered requests go to the slow mock (registration order).
    let gw = Gateway::start_with(
        deployment(
            vec![
                mock("mock-slow", json!({ "delay_ms": 10000 })),
                mock("mock-fast", json!({})),
            ],
            json!({}),
        ),
        1,
        Duration::from_secs(10),
    )
    .await;
    let first = gw.submit_ok(&text_request("first")).await;
    gw.wait_started(&first).await;
    let queued = gw.submit_ok(&text_request("queued")).await;
    assert_eq!(gw.snapshot(&queued).await["status"], "accepted");

    let (status, _, body) = gw.cancel(&queued).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body, json!({ "status": "cancellation_requested" }));
    let snapshot = gw.wait_terminal(&queued).await;
    assert_eq!(snapshot["status"], "cancelled");
    assert_eq!(snapshot["error"]["code"], "cancelled");
    // The gateway wrote that terminal event, and counted it as every writer does.
    let cancelled = "mrt_executions_total{outcome=\"cancelled\",code=\"cancelled\"}";
    assert_eq!(gw.metric(cancelled).await, 1.0);

    // Free the slot, then run one more execution through the same FIFO queue: once it has
    // succeeded, the worker has taken (and must have dropped) the cancelled job.
    assert_eq!(gw.cancel(&first).await.0, StatusCode::ACCEPTED);
    gw.wait_terminal(&first).await;
    let fast = gw
        .submit_ok(&json!({
            "ability": "text-generation",
            "input": [{ "type": "text", "text": "x" }],
            "routing": { "provider_order": ["mock-fast"] },
        }))
        .await;
    assert_eq!(gw.wait_terminal(&fast).await["status"], "succeeded");
    let events = gw.stream(&queued).await.rest().await;
    assert_log(&events, &queued, 1);
    assert_eq!(types(&events), ["execution.accepted", "execution.failed"]);
    assert_eq!(events[1]["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_an_execution_waiting_for_a_provider_slot_ends_it_cancelled() {
    // The provider runs one attempt at a time; the second waits at its gate, in routing [R 35].
    let gw = Gateway::start(deployment(
        vec![mock(
            "provider-mock",
            json!({ "delay_ms": 10000, "max_concurrency": 1, "max_queue_depth": 4 }),
        )],
        json!({}),
    ))
    .await;
    let first = gw.submit_ok(&text_request("first")).await;
    gw.wait_started(&first).await;
    let waiting = gw.submit_ok(&text_request("waiting")).await;
    gw.wait_status(&waiting, "routing").await;
    assert_eq!(gw.cancel(&waiting).await.0, StatusCode::ACCEPTED);
    let snapshot = gw.wait_terminal(&waiting).await;
    assert_eq!(snapshot["status"], "cancelled");
    let events = gw.stream(&waiting).await.rest().await;
    assert_log(&events, &waiting, 1);
    assert_eq!(
        types(&events),
        ["execution.accepted", "route.selected", "execution.failed"]
    );
    // The first one is unaffected.
    let status = gw.snapshot(&first).await["status"].clone();
    assert!(status == "routing" || status == "running", "{status}");
    assert_eq!(gw.cancel(&first).await.0, StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_terminal_execution_is_404() {
    let gw = Gateway::start_default().await;
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_terminal(&id).await;
    let (status, headers, body) = gw.cancel(&id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_json_headers(&headers);
    assert_eq!(body, json!({ "status": "not_found" }));
    assert_eq!(gw.snapshot(&id).await["status"], "succeeded");
    assert_eq!(gw.metric("mrt_cancellations_total").await, 0.0);
}

// ---------------------------------------------------------------------------------------------
// Admission [R 38] and deadlines [R 40]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_limit_is_429_queue_full_with_retry_after_until_capacity_frees() {
    let gw = Gateway::start(slow_mock(2000, json!({ "max_active_executions": 2 }))).await;
    let a = gw.submit_ok(&text_request("a")).await;
    let b = gw.submit_ok(&text_request("b")).await;
    let response = gw.submit(&text_request("c")).await;
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s >= 1),
        "Retry-After seconds: {:?}",
        response.headers()
    );
    let response = json_parts(response).await;
    assert_error(
        &response,
        429,
        "queue_full",
        "Runtime execution capacity is full",
        true,
    );
    assert_eq!(gw.accepted_count().await, 2.0);
    // An idempotent submit is refused the same way and does not bind its key.
    let keyed = gw
        .submit_with(&text_request("c"), &[("idempotency-key", "after-full")])
        .await;
    assert_eq!(keyed.status(), StatusCode::TOO_MANY_REQUESTS);

    for id in [&a, &b] {
        assert_eq!(gw.cancel(id).await.0, StatusCode::ACCEPTED);
        gw.wait_terminal(id).await;
    }
    let response = gw
        .submit_with(&text_request("c"), &[("idempotency-key", "after-full")])
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let c = response.json::<Value>().await.expect("json");
    assert_eq!(c["idempotent_replay"], false);
    assert_eq!(
        gw.cancel(c["execution_id"].as_str().expect("id")).await.0,
        StatusCode::ACCEPTED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deadline_fails_the_execution_with_deadline_exceeded() {
    let gw = Gateway::start(slow_mock(1000, json!({}))).await;
    let id = gw
        .submit_ok(&json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "hi" }], "deadline_ms": 200 }))
        .await;
    let events = gw.stream(&id).await.rest().await;
    assert_log(&events, &id, 1);
    assert_failed_last(
        &events,
        "failed",
        json!({ "code": "deadline_exceeded", "message": "Execution deadline was exceeded", "retryable": false }),
    );
    assert!(
        !types(&events).contains(&"output.delta"),
        "deadline hit before the first chunk: {events:?}"
    );
    let snapshot = gw.snapshot(&id).await;
    assert_eq!(snapshot["status"], "failed");
    assert_eq!(snapshot["error"]["code"], "deadline_exceeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_in_the_queue_ends_the_execution_while_every_slot_is_busy() {
    // Contract §8: deadline_exceeded at most 2 s after the deadline, even for an execution no
    // runner can take yet (one slot, held by a ten-second execution): the embedded gateway's
    // sweeper writes it, as a distributed gateway's does.
    let gw = Gateway::start_with(slow_mock(10_000, json!({})), 1, Duration::from_secs(10)).await;
    let first = gw.submit_ok(&text_request("first")).await;
    gw.wait_started(&first).await;
    let queued = gw
        .submit_ok(&json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "hi" }], "deadline_ms": 300 }))
        .await;
    let snapshot = gw.wait_terminal(&queued).await;
    assert_eq!(snapshot["status"], "failed");
    assert_eq!(snapshot["error"]["code"], "deadline_exceeded");
    // Ended by the sweeper, not by a runner that finally took it: the slot is still held.
    let holder = gw.snapshot(&first).await;
    assert!(
        matches!(holder["status"].as_str(), Some("routing" | "running")),
        "{holder}"
    );
    let events = gw.stream(&queued).await.rest().await;
    assert_eq!(types(&events), ["execution.accepted", "execution.failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_outside_the_allowed_range_are_400() {
    let gw = Gateway::start(default_deployment(
        json!({ "limits": { "max_deadline_ms": 60000 } }),
    ))
    .await;
    let with_deadline = |ms: u64| json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "hi" }], "deadline_ms": ms });
    assert_invalid_request(
        &json_parts(gw.submit(&with_deadline(0)).await).await,
        400,
        "Request does not match the execution schema",
    );
    assert_invalid_request(
        &json_parts(gw.submit(&with_deadline(60001)).await).await,
        400,
        "Request deadline exceeds the configured maximum",
    );
    assert_eq!(gw.accepted_count().await, 0.0);
    assert_eq!(
        gw.submit(&with_deadline(60000)).await.status(),
        StatusCode::ACCEPTED
    );
}

// ---------------------------------------------------------------------------------------------
// Fallback [R 28-29]

fn fallback_deployment() -> Value {
    deployment(
        vec![
            mock("mock-down", json!({ "fail_retryably": true })),
            mock("mock-up", json!({})),
        ],
        json!({}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_falls_back_to_the_next_provider_when_allowed() {
    let gw = Gateway::start(fallback_deployment()).await;
    let id = gw
        .submit_ok(&json!({
            "ability": "text-generation",
            "input": [{ "type": "text", "text": "hi" }],
            "routing": { "allow_fallback": true },
        }))
        .await;
    let events = gw.stream(&id).await.rest().await;
    assert_log(&events, &id, 1);
    assert_eq!(
        types(&events),
        [
            "execution.accepted",
            "route.selected",
            "route.attempt_failed",
            "route.selected",
            "output.delta",
            "output.delta",
            "output.delta",
            "usage.reported",
            "execution.completed"
        ]
    );
    let down = json!({ "provider": "mock-down", "model": "model-alpha" });
    let up = json!({ "provider": "mock-up", "model": "model-alpha" });
    assert_eq!(events[1]["target"], down);
    assert_eq!(events[1]["attempt"], 1);
    assert_eq!(events[2]["target"], down);
    assert_eq!(events[2]["attempt"], 1);
    assert_eq!(events[2]["status"], "routing");
    assert_eq!(events[2]["error"]["code"], "provider_unavailable");
    assert_eq!(events[2]["error"]["retryable"], true);
    assert_eq!(events[3]["target"], up);
    assert_eq!(events[3]["attempt"], 2);
    assert_eq!(events[8]["target"], up);
    let snapshot = gw.snapshot(&id).await;
    assert_eq!(snapshot["status"], "succeeded");
    assert_eq!(snapshot["target"], up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fallback_a_retryable_failure_fails_the_execution() {
    let gw = Gateway::start(fallback_deployment()).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let events = gw.stream(&id).await.rest().await;
    assert_log(&events, &id, 1);
    assert_eq!(
        types(&events),
        ["execution.accepted", "route.selected", "execution.failed"]
    );
    let error = &events[2]["error"];
    assert_eq!(error["code"], "provider_unavailable");
    assert_eq!(error["retryable"], true);
    let snapshot = gw.snapshot(&id).await;
    assert_eq!(snapshot["status"], "failed");
    // A failed execution reports the attempted target [R 56].
    assert_eq!(
        snapshot["target"],
        json!({ "provider": "mock-down", "model": "model-alpha" })
    );
    let (status, _, body) = gw.get_json(&format!("/v1/executions/{id}/result")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body, json!({ "status": "failed", "error": error }));
}

// ---------------------------------------------------------------------------------------------
// Runtime, providers, routes, health [R 22-24]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_info_and_providers_describe_the_deployment() {
    let gw = Gateway::start(deployment(
        vec![
            mock(
                "mock-a",
                json!({ "max_concurrency": 3, "max_queue_depth": 5 }),
            ),
            mock(
                "mock-b",
                json!({ "model": "model-beta", "abilities": ["text-generation", "summarize"] }),
            ),
        ],
        json!({}),
    ))
    .await;
    let (status, headers, info) = gw.get_json("/v1/runtime").await;
    assert_eq!(status, StatusCode::OK);
    assert_json_headers(&headers);
    assert_eq!(
        info,
        json!({
            "name": "model-runtime-api",
            "protocol_version": "0.1.0",
            "provider_count": 2,
            "state": "ready",
            "features": { "routing": true, "flow_control": true, "usage_facts": true, "billing": false },
        })
    );
    let (status, headers, providers) = gw.get_json("/v1/providers").await;
    assert_eq!(status, StatusCode::OK);
    assert_json_headers(&headers);
    let model = |name: &str, abilities: Value| {
        json!({
            "model": name,
            "abilities": abilities,
            "input_modalities": ["text"],
            "output_modalities": ["text"],
            "stream": true,
            "tools": false,
            "structured_output": false,
            "async": false,
            "cancel": true,
        })
    };
    assert_eq!(
        providers,
        json!({ "data": [
            {
                "provider": "mock-a",
                "protocol_version": "0.1.0",
                "models": [model("model-alpha", json!(["text-generation"]))],
                "limits": { "max_concurrency": 3, "max_queue_depth": 5 },
            },
            {
                "provider": "mock-b",
                "protocol_version": "0.1.0",
                "models": [model("model-beta", json!(["text-generation", "summarize"]))],
                "limits": { "max_concurrency": 16, "max_queue_depth": 64 },
            },
        ]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_wrong_methods_are_404_route_not_found() {
    let gw = Gateway::start_default().await;
    let id = uuid::Uuid::new_v4();
    let cases = [
        (reqwest::Method::GET, "/".to_owned()),
        (reqwest::Method::GET, "/v1".to_owned()),
        (reqwest::Method::GET, "/v1/nope".to_owned()),
        (reqwest::Method::GET, "/v2/runtime".to_owned()),
        (reqwest::Method::DELETE, "/v1/runtime".to_owned()),
        (reqwest::Method::POST, "/v1/runtime".to_owned()),
        (reqwest::Method::GET, "/v1/executions".to_owned()),
        (reqwest::Method::PUT, "/v1/executions".to_owned()),
        (reqwest::Method::DELETE, format!("/v1/executions/{id}")),
        (reqwest::Method::GET, format!("/v1/executions/{id}/cancel")),
        (reqwest::Method::POST, format!("/v1/executions/{id}/events")),
        (reqwest::Method::GET, format!("/v1/executions/{id}/other")),
    ];
    for (method, path) in cases {
        let response = gw
            .client
            .request(method.clone(), gw.url(&path))
            .send()
            .await
            .expect("sent");
        let response = json_parts(response).await;
        assert_eq!(response.0, StatusCode::NOT_FOUND, "{method} {path}");
        assert_error(&response, 404, "not_found", "Route not found", false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_endpoints_answer() {
    let gw = Gateway::start_default().await;
    for path in ["/healthz", "/readyz"] {
        let (status, headers, _) = gw.get_json(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_json_headers(&headers);
    }
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_terminal(&id).await;
    let response = gw.get("/metrics").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_security_headers(response.headers());
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = response.text().await.expect("text");
    assert!(
        text.contains("# TYPE mrt_submissions_total counter"),
        "{text}"
    );
    assert!(
        text.contains("mrt_submissions_total{outcome=\"accepted\"} 1"),
        "{text}"
    );
    assert!(text.contains("mrt_stopping 0"), "{text}");
    // Every provider's series exist from startup, those of outcomes not seen yet at 0.
    assert!(
        text.contains(
            "mrt_provider_attempts_total{provider=\"provider-mock\",model=\"model-alpha\",outcome=\"failed\"} 0"
        ),
        "{text}"
    );
}

/// A gateway allowing one event stream (mock delay `delay_ms`), an execution, and the stream of
/// that execution holding the only slot (past its first event).
async fn holding_the_only_stream_slot(delay_ms: u64) -> (Gateway, String, Sse) {
    let config = slow_mock(delay_ms, json!({ "limits": { "max_sse_streams": 1 } }));
    let gw = Gateway::start(config).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let mut held = gw.stream(&id).await;
    held.expect_type("execution.accepted").await;
    (gw, id, held)
}

/// The refusal when every event stream slot is taken.
fn assert_no_stream_slot(response: &(StatusCode, reqwest::header::HeaderMap, Value)) {
    let message = "Too many open event streams";
    assert_error(response, 429, "queue_full", message, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_event_streams_are_limited_and_released_on_close() {
    let (gw, id, first) = holding_the_only_stream_slot(2000).await;
    let response = gw.events(&id, None, None).await;
    let response = json_parts(response).await;
    assert_no_stream_slot(&response);
    drop(first);
    // The slot is released when the client goes away.
    let start = std::time::Instant::now();
    loop {
        let response = gw.events(&id, None, None).await;
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(start.elapsed() < WAIT, "stream slot never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gw.cancel(&id).await.0, StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_submit_refused_for_lack_of_stream_slots_creates_nothing() {
    let (gw, id, held) = holding_the_only_stream_slot(10000).await;
    // A retryable refusal must mean nothing was created, or the client's retry duplicates it.
    let response = gw
        .submit_with(
            &text_request("streamed"),
            &[("accept", "text/event-stream")],
        )
        .await;
    assert_no_stream_slot(&json_parts(response).await);
    assert_eq!(gw.accepted_count().await, 1.0);
    drop(held);
    assert_eq!(gw.cancel(&id).await.0, StatusCode::ACCEPTED);
}
