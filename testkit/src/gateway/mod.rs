//! A gateway under test and an HTTP client of its API. The gateway runs either in this process
//! in embedded mode ([`Embedded`], feature `embedded`) or as the real binaries next to the test
//! executable ([`process`], feature `process`); both are driven through [`Api`]: submit, poll
//! snapshots, read SSE streams, scrape metrics, and the header and log assertions every HTTP
//! test makes.
//!
//! Nothing here sleeps for a fixed time to wait for a condition: waits poll with a generous
//! deadline ([`WAIT`]) so the tests pass on a busy two-core machine.

pub mod auth_matrix;
#[cfg(feature = "embedded")]
mod embedded;
#[cfg(feature = "process")]
pub mod process;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
#[cfg(feature = "embedded")]
pub use embedded::{Embedded, Gateway, memory_backend, standalone_capabilities};
use protocol::sse::{SseEvent, SseParser};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// Longest any condition is awaited.
pub const WAIT: Duration = Duration::from_secs(20);
/// Poll interval of [`Api::wait_for`].
const POLL: Duration = Duration::from_millis(20);
/// A string that must never appear in a response: placed in ability text, metadata keys,
/// unknown property names and header values by the tests.
pub const CANARY: &str = "CANARY-93f1d2-secret";

/// The HTTP client tests use: no proxies, a short connect timeout, a large idle pool.
pub fn http_client() -> reqwest::Client {
    // The workspace's reqwest is built without a default TLS crypto provider (the worker
    // installs ring for its provider client); a client cannot be built until one is
    // installed, even for plain HTTP. "Already installed" is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}

// ---------- deployment files ----------

/// A deployment with `providers` and extra root fields merged in.
pub fn deployment(providers: Vec<Value>, extra: Value) -> Value {
    let mut root = json!({ "providers": providers });
    merge(&mut root, extra);
    root
}

/// A mock provider `id` serving `text-generation` on `model-alpha`, no delay, with `extra`
/// fields merged in.
pub fn mock(id: &str, extra: Value) -> Value {
    let mut m = json!({
        "type": "mock",
        "id": id,
        "model": "model-alpha",
        "abilities": ["text-generation"],
        "delay_ms": 0,
    });
    merge(&mut m, extra);
    m
}

/// The default mock (`provider-mock`, no delay) with extra root fields merged in.
pub fn default_deployment(extra: Value) -> Value {
    deployment(vec![mock("provider-mock", json!({}))], extra)
}

/// A deployment of one mock (`provider-mock`) that waits `delay_ms` before each chunk, with
/// extra root fields merged in.
pub fn slow_mock(delay_ms: u64, extra: Value) -> Value {
    deployment(
        vec![mock("provider-mock", json!({ "delay_ms": delay_ms }))],
        extra,
    )
}

fn merge(target: &mut Value, extra: Value) {
    if let (Some(t), Value::Object(e)) = (target.as_object_mut(), extra) {
        t.extend(e);
    }
}

/// A plain text-generation request.
pub fn text_request(text: &str) -> Value {
    json!({ "ability": "text-generation", "input": [{ "type": "text", "text": text }] })
}

// ---------- the API ----------

/// A client of one gateway's HTTP API.
#[derive(Debug, Clone)]
pub struct Api {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub client: reqwest::Client,
}

impl Api {
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            client: http_client(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `POST /v1/executions` with a JSON body.
    pub async fn submit(&self, body: &Value) -> reqwest::Response {
        self.submit_with(body, &[]).await
    }

    /// `POST /v1/executions` with a JSON body and extra headers.
    pub async fn submit_with(&self, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
        self.submit_raw(body.to_string(), headers).await
    }

    /// `POST /v1/executions` with `content-type: application/json`, a body sent as is, and
    /// extra headers.
    pub async fn submit_raw(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut request = self
            .client
            .post(self.url("/v1/executions"))
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("submit sent")
    }

    /// Submits `body` with `content_type` as its only `Content-Type`, or none at all (media
    /// type checks).
    pub async fn submit_as(
        &self,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let mut request = self.client.post(self.url("/v1/executions")).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request.send().await.expect("submit sent")
    }

    /// Submits and asserts 202; returns the execution id.
    pub async fn submit_ok(&self, body: &Value) -> String {
        let response = self.submit(body).await;
        let status = response.status();
        let json: Value = response.json().await.expect("json body");
        assert_eq!(status, StatusCode::ACCEPTED, "submit: {json}");
        json["execution_id"]
            .as_str()
            .expect("execution_id")
            .to_owned()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("get sent")
    }

    /// Status, headers and JSON body of `GET path`.
    pub async fn get_json(&self, path: &str) -> (StatusCode, HeaderMap, Value) {
        json_parts(self.get(path).await).await
    }

    /// `POST /v1/executions/{id}/cancel`.
    pub async fn cancel(&self, id: &str) -> (StatusCode, HeaderMap, Value) {
        let response = self
            .client
            .post(self.url(&format!("/v1/executions/{id}/cancel")))
            .send()
            .await
            .expect("cancel sent");
        json_parts(response).await
    }

    /// The snapshot of `id`, asserting 200.
    pub async fn snapshot(&self, id: &str) -> Value {
        let (status, _, body) = self.get_json(&format!("/v1/executions/{id}")).await;
        assert_eq!(status, StatusCode::OK, "snapshot of {id}: {body}");
        body
    }

    /// Polls the snapshot of `id` until `done` holds; panics with the last snapshot after
    /// [`WAIT`].
    pub async fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let snapshot = self.snapshot(id).await;
            if done(&snapshot) {
                return snapshot;
            }
            assert!(
                start.elapsed() < WAIT,
                "timed out waiting for {what}; last snapshot {snapshot}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls until the execution is terminal.
    pub async fn wait_terminal(&self, id: &str) -> Value {
        self.wait_for(id, "a terminal status", is_terminal_snapshot)
            .await
    }

    /// Polls until the execution's status is `status`.
    pub async fn wait_status(&self, id: &str, status: &str) -> Value {
        self.wait_for(id, status, |s| s["status"] == status).await
    }

    /// Polls until a worker has taken the execution (`routing` or `running`).
    pub async fn wait_started(&self, id: &str) -> Value {
        self.wait_for(id, "routing or running", |s| {
            matches!(s["status"].as_str(), Some("routing" | "running"))
        })
        .await
    }

    /// The `/metrics` exposition text.
    pub async fn metrics_text(&self) -> String {
        let response = self.get("/metrics").await;
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("metrics text")
    }

    /// The value of the sample named exactly `name` (labels included).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        sample(&text, name).unwrap_or_else(|| panic!("metric {name} missing from:\n{text}"))
    }

    /// Accepted submissions so far.
    pub async fn accepted_count(&self) -> f64 {
        self.metric("mrt_submissions_total{outcome=\"accepted\"}")
            .await
    }

    /// `GET /v1/executions/{id}/events` with an optional query and `Last-Event-ID`.
    pub async fn events(
        &self,
        id: &str,
        query: Option<&str>,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let path = match query {
            Some(q) => format!("/v1/executions/{id}/events?{q}"),
            None => format!("/v1/executions/{id}/events"),
        };
        let mut request = self.client.get(self.url(&path));
        if let Some(v) = last_event_id {
            request = request.header("last-event-id", v);
        }
        request.send().await.expect("events sent")
    }

    /// Opens the event stream of `id` from the start, asserting a 200 SSE response.
    pub async fn stream(&self, id: &str) -> Sse {
        let response = self.events(id, None, None).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_sse_headers(response.headers());
        Sse::new(response)
    }
}

/// Whether a snapshot's status is terminal.
pub fn is_terminal_snapshot(snapshot: &Value) -> bool {
    matches!(
        snapshot["status"].as_str(),
        Some("succeeded" | "failed" | "cancelled")
    )
}

/// Status, headers and JSON body (panics if the body is not JSON).
pub async fn json_parts(response: reqwest::Response) -> (StatusCode, HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let body =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text:?}"));
    (status, headers, body)
}

// ---------- response assertions ----------

fn assert_header(headers: &HeaderMap, name: &str, expected: &str) {
    assert_eq!(
        headers.get(name).map(|v| v.as_bytes()),
        Some(expected.as_bytes()),
        "{name} in {headers:?}"
    );
}

/// `cache-control: no-store` and `x-content-type-options: nosniff`.
pub fn assert_security_headers(headers: &HeaderMap) {
    assert_header(headers, "cache-control", "no-store");
    assert_header(headers, "x-content-type-options", "nosniff");
}

/// The headers of every JSON response.
pub fn assert_json_headers(headers: &HeaderMap) {
    assert_header(headers, "content-type", "application/json; charset=utf-8");
    assert_security_headers(headers);
}

/// The headers of every event stream.
pub fn assert_sse_headers(headers: &HeaderMap) {
    assert_header(headers, "content-type", "text/event-stream; charset=utf-8");
    assert_security_headers(headers);
}

/// Asserts an error response `{"error":{code,message,retryable}}` with exactly those keys.
pub fn assert_error(
    (status, headers, body): &(StatusCode, HeaderMap, Value),
    expected_status: u16,
    code: &str,
    message: &str,
    retryable: bool,
) {
    assert_eq!(status.as_u16(), expected_status, "status of {body}");
    assert_json_headers(headers);
    assert_eq!(
        body,
        &json!({ "error": { "code": code, "message": message, "retryable": retryable } }),
    );
}

/// Asserts the refusal of a malformed request: [`assert_error`] with code `invalid_request`,
/// which is never retryable.
pub fn assert_invalid_request(
    response: &(StatusCode, HeaderMap, Value),
    expected_status: u16,
    message: &str,
) {
    assert_error(response, expected_status, "invalid_request", message, false);
}

// ---------- event streams ----------

/// An incrementally read event stream.
#[derive(Debug)]
pub struct Sse {
    response: reqwest::Response,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    /// Every byte received so far.
    pub raw: Vec<u8>,
    ended: bool,
}

impl Sse {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            parser: SseParser::new(),
            pending: VecDeque::new(),
            raw: Vec::new(),
            ended: false,
        }
    }

    /// The next raw body chunk (`None` at a clean end), waiting at most [`WAIT`]. Its frames
    /// are parsed and queued for [`Sse::next`].
    pub async fn chunk(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        let chunk = tokio::time::timeout(WAIT, self.response.chunk())
            .await
            .expect("stream produced data or ended in time")
            .expect("stream ended cleanly, not with an error");
        match &chunk {
            Some(bytes) => {
                self.raw.extend_from_slice(bytes);
                let mut out = Vec::new();
                self.parser.push(bytes, &mut out).expect("valid SSE");
                self.pending.extend(out);
            }
            None => self.ended = true,
        }
        chunk
    }

    /// The next event, or `None` once the stream has ended.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            self.chunk().await?;
        }
    }

    /// The next event's JSON, checking that `id` and `event` agree with it.
    pub async fn next_json(&mut self) -> Option<Value> {
        self.next().await.map(|e| event_json(&e))
    }

    /// Asserts that the next event has type `expected`.
    pub async fn expect_type(&mut self, expected: &str) {
        let event = self.next_json().await;
        assert_eq!(
            event.as_ref().map(|e| e["type"].clone()),
            Some(Value::from(expected)),
            "next event: {event:?}"
        );
    }

    /// Every remaining event, up to the end of the stream.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(event) = self.next_json().await {
            out.push(event);
        }
        out
    }

    /// Whether the raw bytes end at a frame boundary.
    pub fn ends_cleanly(&self) -> bool {
        self.raw.is_empty() || self.raw.ends_with(b"\n\n")
    }
}

/// The event JSON of a frame, checking that the frame's `id` and `event` fields match it.
pub fn event_json(frame: &SseEvent) -> Value {
    let json: Value = serde_json::from_str(&frame.data).expect("event data is JSON");
    assert_eq!(
        frame.id.as_deref(),
        Some(json["sequence"].to_string().as_str()),
        "frame id matches the sequence of {json}"
    );
    assert_eq!(
        frame.event,
        json["type"].as_str().expect("type"),
        "frame event"
    );
    json
}

/// The event types of the default mock's successful execution.
pub const MOCK_TYPES: [&str; 7] = [
    "execution.accepted",
    "route.selected",
    "output.delta",
    "output.delta",
    "output.delta",
    "usage.reported",
    "execution.completed",
];

/// The `type` of each event.
pub fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().expect("type"))
        .collect()
}

/// The text of each `output.delta`, in log order.
pub fn delta_texts(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["type"] == "output.delta")
        .map(|e| e["delta"].as_str().expect("delta"))
        .collect()
}

fn is_terminal_event(event: &Value) -> bool {
    matches!(
        event["type"].as_str(),
        Some("execution.completed" | "execution.failed")
    )
}

/// Asserts sequences `first..` with no gap, every event for `id`, and exactly one terminal
/// event, last.
pub fn assert_log(events: &[Value], id: &str, first: u64) {
    for event in events {
        assert_eq!(event["execution_id"], id);
    }
    assert_log_shape(events, first);
}

/// Asserts sequences `first..` with no gap and exactly one terminal event, last.
pub fn assert_log_shape(events: &[Value], first: u64) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event["sequence"].as_u64(),
            Some(first + i as u64),
            "contiguous sequence at {i}: {events:?}"
        );
    }
    let terminal: Vec<_> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| is_terminal_event(e))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        terminal,
        vec![events.len().saturating_sub(1)],
        "one terminal event, last: {events:?}"
    );
}

// ---------- value formats ----------

/// Whether `s` is `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn is_iso_millis(s: &str) -> bool {
    // `d` stands for any digit; every other character must match exactly.
    const PATTERN: &[u8] = b"dddd-dd-ddTdd:dd:dd.dddZ";
    s.len() == PATTERN.len()
        && s.bytes().zip(PATTERN).all(|(c, &p)| match p {
            b'd' => c.is_ascii_digit(),
            _ => c == p,
        })
}

/// Whether `s` is a canonical (lowercase, hyphenated) random v4 UUID.
pub fn is_uuid_v4(s: &str) -> bool {
    uuid::Uuid::parse_str(s)
        .is_ok_and(|u| u.get_version_num() == 4 && u.hyphenated().to_string() == s)
}

/// The value of the sample named exactly `name` (labels included) in a Prometheus exposition
/// `text`, `None` when there is none.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.rsplit_once(' ')?;
        (n == name).then(|| v.parse::<f64>().expect("numeric sample"))
    })
}
