//! The OpenAI-compatible API in `nats` mode, driven by the official `openai` Python SDK and
//! npm package unchanged (`gateway/tests/openai/sdk_check.py` and `sdk_check.cjs`, installed by
//! `scripts/test.sh`): two
//! gateway processes and a worker over a private NATS JetStream and Redis. Every case of the
//! embedded test runs against the first gateway, and a Responses stream dropped there resumes
//! on the second with exactly the events after its cursor (the numbering is a function of
//! the stored log, so any gateway assigns the same numbers). A function-tool round trip runs
//! against a local OpenAI-compatible provider (`openai-chat` with tools declared), whose
//! received bodies show what the OpenAI request became.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use e2e_tests::*;
use serde_json::{Value, json};
use testkit::fake_provider::{FakeProvider, Piece, Received, Reply};
use testkit::gateway::auth_matrix::{self, tenant_key};
use testkit::openai_sdk::{NODE_CASES, PYTHON_CASES, Sdk};

/// One Chat Completions stream frame of the fixture with this `delta` and `finish_reason`.
fn frame(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({"id": "chatcmpl-fixture", "object": "chat.completion.chunk", "created": 1,
                       "model": "tool-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {chunk}\n\n")
}

/// The provider fixture: calls `get_weather` for Paris (its arguments in two fragments) until
/// a request carries the tool's output (`sunny`), then answers with text; usage last.
fn weather_provider(request: &Received) -> Reply {
    let body = String::from_utf8_lossy(&request.body);
    let mut frames = vec![frame(json!({"role": "assistant", "content": null}), None)];
    if body.contains("sunny") {
        for text in ["It is sunny", " in Paris."] {
            frames.push(frame(json!({"content": text}), None));
        }
        frames.push(frame(json!({}), Some("stop")));
    } else {
        frames.push(frame(
            json!({"tool_calls": [{"index": 0, "id": "call_weather_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]}),
            None,
        ));
        for fragment in ["{\"location\":", "\"Paris\"}"] {
            frames.push(frame(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
                None,
            ));
        }
        frames.push(frame(json!({}), Some("tool_calls")));
    }
    let usage = json!({"id": "chatcmpl-fixture", "object": "chat.completion.chunk", "created": 1,
                       "model": "tool-model", "choices": [],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}});
    frames.push(format!("data: {usage}\n\ndata: [DONE]\n\n"));
    Reply::Stream(frames.into_iter().map(Piece::text).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_and_node_sdks_work_across_gateways() {
    Sdk::Python.assert_installed();
    Sdk::Node.assert_installed();
    let mock = |id: &str, model: &str, chunks: Vec<&str>, delay_ms: u64| {
        json!({"type": "mock", "id": id, "model": model, "abilities": ["text-generation"],
               "chunks": chunks, "delay_ms": delay_ms, "max_concurrency": 64, "max_queue_depth": 256})
    };
    let fixture = FakeProvider::start(weather_provider).await;
    let config = json!({
        "providers": [
            mock("provider-mock", "model-alpha", vec!["hello", " from", " mock"], 0),
            mock("provider-slow", "model-slow", vec!["s "; 10], 200),
            mock("provider-stuck", "model-stuck", vec!["never"], 60_000),
            {"type": "openai-chat", "id": "local-chat", "model": "tool-model",
             "api_key_env": "MRT_TEST_OPENAI_FIXTURE_KEY",
             "base_url": format!("{}/v1", fixture.origin()),
             "capabilities": {"tools": true}},
        ],
        "auth": {
            "tenants": {"acme": {}, "other": {}, "limited": {"submits_per_second": 0.001, "burst": 1}},
            "keys": auth_matrix::tenant_keys(&["acme", "other", "limited"], tenant_key)
        }
    });
    let mut cluster = Cluster::start(&config);
    cluster
        .extra_env
        .push(("MRT_TEST_OPENAI_FIXTURE_KEY".into(), "fixture-key".into()));
    let g1 = cluster.gateway();
    let g2 = cluster.gateway();
    let _worker = cluster.worker();
    let (first, second) = (format!("{}/v1", g1.url), format!("{}/v1", g2.url));
    let node = Sdk::Node.spawn(vec![
        ("OPENAI_BASE_URL", first.clone()),
        ("MRT_SECOND_BASE_URL", second.clone()),
        ("MRT_KEY", tenant_key("acme")),
    ]);
    let output = Sdk::Python
        .spawn(vec![
            ("OPENAI_BASE_URL", first),
            ("MRT_SECOND_BASE_URL", second),
            ("MRT_TOOL_MODEL", "tool-model".into()),
            ("MRT_KEY", tenant_key("acme")),
            ("MRT_OTHER_KEY", tenant_key("other")),
            ("MRT_LIMITED_KEY", tenant_key("limited")),
        ])
        .await
        .unwrap();
    let cases = [&PYTHON_CASES[..], &["resume_elsewhere", "tool_round_trip"]].concat();
    let log = format!("gateway log:\n{}", g1.process.log_text());
    Sdk::Python.assert_passed(&output, &cases, &log);
    Sdk::Node.assert_passed(&node.await.unwrap(), &NODE_CASES, "");
    // What the OpenAI requests became at the provider: the tools in Chat Completions' shape,
    // and the tool's output carried in the follow-up's input.
    let bodies: Vec<Value> = fixture.received().iter().map(Received::json).collect();
    assert!(bodies.len() >= 5, "{} provider calls", bodies.len());
    assert_eq!(bodies[0]["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(bodies[0]["model"], "tool-model");
    assert!(bodies.iter().all(|b| b["stream"] == true));
    let follow_up = bodies[1]["messages"][0]["content"].to_string();
    assert!(
        follow_up.contains("sunny") && follow_up.contains("call_weather_1"),
        "{follow_up}"
    );
}
