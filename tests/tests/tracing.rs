//! One trace per execution across processes (contract.md section 9): an OTLP/HTTP receiver in
//! this test collects the spans a gateway and a worker in `nats` mode export for an execution
//! submitted with a caller's `traceparent`, and checks the parent chain caller → gateway request
//! span → worker execution span → provider attempt span, the GenAI attributes (token counts as
//! integers), and that no span holds the prompt or the output text. A collector that is down
//! pauses span building and export resumes by itself when it is back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use e2e_tests::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

const PROMPT: &str = "PROMPT-CANARY-5d1e";
const OUTPUT: &str = "OUTPUT-CANARY-77a0";
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP (protobuf) trace receiver on a free port; returns its base URL.
async fn receiver(received: Received) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    receiver_on(listener, received)
}

/// An OTLP/HTTP (protobuf) trace receiver on `listener`; returns its base URL.
fn receiver_on(listener: tokio::net::TcpListener, received: Received) -> String {
    async fn traces(State(received): State<Received>, body: Bytes) -> &'static str {
        let request = ExportTraceServiceRequest::decode(body).unwrap();
        let mut out = received.lock().unwrap();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    AnyValue::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    out.push((service.clone(), span));
                }
            }
        }
        ""
    }
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .with_state(received);
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.clone()),
            AnyValue::IntValue(i) => Some(i.to_string()),
            AnyValue::BoolValue(b) => Some(b.to_string()),
            AnyValue::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        })
}

/// The value of an integer attribute; `None` when absent or of another type (a count exported
/// as a string, say).
fn int_attribute(span: &Span, key: &str) -> Option<i64> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::IntValue(i) => Some(*i),
            _ => None,
        })
}

#[tokio::test]
async fn one_trace_follows_an_execution_from_the_caller_through_gateway_and_worker() {
    let received: Received = Arc::default();
    let endpoint = receiver(Arc::clone(&received)).await;
    let (_cluster, gateway, _worker) = traced_cluster(endpoint);
    let id = submit_traced(&gateway.url, CALLER_TRACE).await;

    // Wait for the three spans of this trace (export is batched).
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans: Vec<(String, Span)> = received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| hex(&s.trace_id) == CALLER_TRACE)
            .cloned()
            .collect();
        let has = |name: &str| spans.iter().any(|(_, s)| s.name == name);
        if has("POST /v1/executions") && has("execution") && has("chat model-alpha") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans of the caller's trace did not arrive: {:?}; all received: {:?}\ngateway log:\n{}",
            spans
                .iter()
                .map(|(svc, s)| (svc, &s.name))
                .collect::<Vec<_>>(),
            received
                .lock()
                .unwrap()
                .iter()
                .map(|(svc, s)| (svc.clone(), s.name.clone(), hex(&s.trace_id)))
                .collect::<Vec<_>>(),
            gateway.process.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let find = |name: &str| {
        spans
            .iter()
            .find(|(_, s)| s.name == name)
            .map(|(svc, s)| (svc.clone(), s.clone()))
            .unwrap()
    };
    let (gateway_service, request) = find("POST /v1/executions");
    let (worker_service, execution) = find("execution");
    let (_, attempt) = find("chat model-alpha");
    assert_eq!(gateway_service, "gateway");
    assert_eq!(worker_service, "worker");
    // The chain: caller → gateway request → worker execution → provider attempt.
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(execution.parent_span_id, request.span_id);
    assert_eq!(attempt.parent_span_id, execution.span_id);
    assert_eq!(
        attribute(&execution, "execution_id").as_deref(),
        Some(id.as_str())
    );
    // GenAI semantic-convention attributes of the attempt.
    assert_eq!(
        attribute(&attempt, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        attribute(&attempt, "gen_ai.provider.name").as_deref(),
        Some("provider-mock")
    );
    assert_eq!(
        attribute(&attempt, "gen_ai.request.model").as_deref(),
        Some("model-alpha")
    );
    // Counts are integers, as the GenAI conventions type them and backends expect: the mock
    // reports one input token and one output token per chunk (one chunk here).
    for (span, key) in [
        (&attempt, "gen_ai.usage.input_tokens"),
        (&attempt, "gen_ai.usage.output_tokens"),
        (&attempt, "attempt"),
        (&execution, "delivered"),
    ] {
        assert_eq!(
            int_attribute(span, key),
            Some(1),
            "{key} as an integer: {:?}",
            span.attributes.iter().find(|kv| kv.key == key)
        );
    }
    // No content in any span of any service.
    for (service, span) in received.lock().unwrap().iter() {
        let text = format!("{span:?}");
        assert!(
            !text.contains(PROMPT) && !text.contains(OUTPUT),
            "{service} span {} holds content",
            span.name
        );
    }
}

/// NATS, Redis, a gateway and a worker exporting spans to `endpoint`; the mock answers `OUTPUT`.
fn traced_cluster(endpoint: String) -> (Cluster, Gateway, Process) {
    let config = json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"], "chunks": [OUTPUT], "delay_ms": 0}]
    });
    let mut cluster = Cluster::start(&config);
    cluster.extra_env.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint),
        // Export promptly: the batch processor's delay is the standard variable's.
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ]);
    let gateway = cluster.gateway();
    let worker = cluster.worker();
    (cluster, gateway, worker)
}

/// Submits `PROMPT` with the caller's trace `trace` and waits for its success.
async fn submit_traced(gateway: &str, trace: &str) -> String {
    let response = client()
        .post(format!("{gateway}/v1/executions"))
        .header("traceparent", format!("00-{trace}-{CALLER_SPAN}-01"))
        .json(&text_request(PROMPT))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let body: serde_json::Value = response.json().await.unwrap();
    let id = body["execution_id"].as_str().unwrap().to_owned();
    let snapshot = wait_terminal(gateway, &id).await;
    assert_eq!(snapshot["status"], "succeeded", "{snapshot}");
    id
}

#[tokio::test]
async fn span_export_pauses_while_the_collector_is_down_and_resumes_when_it_is_back() {
    const PAUSED: &str = "span building paused";
    const RESUMED: &str = "OTLP span export resumed";
    // Nothing listens on the collector's port yet.
    let port = testkit::free_port();
    let (_cluster, gateway, worker) = traced_cluster(format!("http://127.0.0.1:{port}"));
    let logs = || (gateway.process.log_text(), worker.log_text());

    // Down: executions succeed, and each process warns once that span building paused.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut round = 0u64;
    loop {
        round += 1;
        submit_traced(&gateway.url, &format!("{round:032x}")).await;
        let (gateway_log, worker_log) = logs();
        if gateway_log.contains(PAUSED) && worker_log.contains(PAUSED) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no pause warning after {round} executions\ngateway:\n{gateway_log}\nworker:\n{worker_log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Back: a receiver on the same port gets a whole trace of a later execution (the pause is
    // at most 10 s), with the chain caller → gateway → worker intact.
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    receiver_on(listener, Arc::clone(&received));
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut traces = Vec::new();
    let complete = |trace: &str| {
        let spans = received.lock().unwrap();
        let find = |name: &str| {
            spans
                .iter()
                .find(|(_, s)| s.name == name && hex(&s.trace_id) == trace)
                .map(|(_, s)| s.clone())
        };
        match (
            find("POST /v1/executions"),
            find("execution"),
            find("chat model-alpha"),
        ) {
            (Some(request), Some(execution), Some(attempt)) => {
                hex(&request.parent_span_id) == CALLER_SPAN
                    && execution.parent_span_id == request.span_id
                    && attempt.parent_span_id == execution.span_id
            }
            _ => false,
        }
    };
    loop {
        round += 1;
        let trace = format!("{round:032x}");
        submit_traced(&gateway.url, &trace).await;
        traces.push(trace);
        if traces.iter().any(|t| complete(t)) {
            break;
        }
        let (gateway_log, worker_log) = logs();
        assert!(
            Instant::now() < deadline,
            "no whole trace after the collector came back\ngateway:\n{gateway_log}\nworker:\n{worker_log}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Each process said once that export paused, and says that it resumed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (gateway_log, worker_log) = logs();
        if gateway_log.contains(RESUMED) && worker_log.contains(RESUMED) {
            assert_eq!(gateway_log.matches(PAUSED).count(), 1, "{gateway_log}");
            assert_eq!(worker_log.matches(PAUSED).count(), 1, "{worker_log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no resume line\ngateway:\n{gateway_log}\nworker:\n{worker_log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
