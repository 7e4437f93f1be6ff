//! Test harness for the HTTP API: a real gateway in embedded mode served on a loopback port
//! through `gateway::server::serve` (so graceful shutdown is the production path), a `reqwest`
//! client, and helpers to poll snapshots, read SSE streams and scrape metrics.
//!
//! Nothing here sleeps for a fixed time to wait for a condition: waits poll with a generous
//! deadline ([`WAIT`]) so the tests pass on a busy two-core machine.

// Each test binary uses a different subset; harness code panics on failure like the tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::sse::{SseEvent, SseParser};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use worker::deployment::DeploymentConfig;

/// Longest any condition is awaited.
pub const WAIT: Duration = Duration::from_secs(20);
/// Poll interval of [`Gateway::wait_for`].
const POLL: Duration = Duration::from_millis(20);
/// A string that must never appear in a response: placed in ability text, metadata keys,
/// unknown property names and header values by the tests.
pub const CANARY: &str = "CANARY-93f1d2-secret";

/// A running gateway.
pub struct Gateway {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub client: reqwest::Client,
    pub state: gateway::AppState,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
}

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

fn merge(target: &mut Value, extra: Value) {
    if let (Some(t), Value::Object(e)) = (target.as_object_mut(), extra) {
        t.extend(e);
    }
}

/// A plain text-generation request.
pub fn text_request(text: &str) -> Value {
    json!({ "ability": "text-generation", "input": [{ "type": "text", "text": text }] })
}

impl Gateway {
    /// One default mock (three chunks, no delay), four workers.
    pub async fn start_default() -> Self {
        Self::start(deployment(
            vec![mock("provider-mock", json!({}))],
            json!({}),
        ))
        .await
    }

    /// The deployment `config` (JSON, as in a deployment file) with four workers.
    pub async fn start(config: Value) -> Self {
        Self::start_with(config, 4, Duration::from_secs(10)).await
    }

    /// The deployment `config` with `workers` runner slots and a shutdown `grace`.
    pub async fn start_with(config: Value, workers: usize, grace: Duration) -> Self {
        let config = worker::deployment::parse(&config.to_string()).expect("valid deployment file");
        Self::from_config(&config, workers, grace).await
    }

    /// A typed deployment (for providers too large to write as a file).
    pub async fn from_config(config: &DeploymentConfig, workers: usize, grace: Duration) -> Self {
        let registry =
            Arc::new(worker::deployment::build_registry(config).expect("buildable registry"));
        let embedded = gateway::Embedded::start(config, registry, workers);
        let state = embedded.state.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(gateway::server::serve(
            listener,
            embedded,
            async move {
                let _ = rx.await;
            },
            grace,
        ));
        Self::new(addr, state, Some(tx), served)
    }

    /// Serves a hand-built state with the plain router (no workers, no shutdown path).
    pub async fn from_state(state: gateway::AppState) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let app = gateway::router(state.clone());
        let served = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self::new(addr, state, None, served)
    }

    fn new(
        addr: std::net::SocketAddr,
        state: gateway::AppState,
        stop: Option<oneshot::Sender<()>>,
        served: JoinHandle<()>,
    ) -> Self {
        // The workspace's reqwest is built without a default TLS crypto provider (the worker
        // installs ring for its provider client); a client cannot be built until one is
        // installed, even for plain HTTP. "Already installed" is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(64)
            .build()
            .expect("client");
        Self {
            base: format!("http://{addr}"),
            addr,
            client,
            state,
            stop,
            served: Some(served),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends the shutdown signal to `serve`.
    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// Waits (up to `limit`) for `serve` to return; panics if it does not.
    pub async fn join(&mut self, limit: Duration) {
        let served = self.served.take().expect("served once");
        tokio::time::timeout(limit, served)
            .await
            .expect("serve returned within the limit")
            .expect("serve did not panic");
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
        self.wait_for(id, "a terminal status", |s| {
            matches!(
                s["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
        })
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
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (n, v) = l.rsplit_once(' ')?;
                (n == name).then(|| v.parse::<f64>().expect("numeric sample"))
            })
            .unwrap_or_else(|| panic!("metric {name} missing from:\n{text}"))
    }

    /// Accepted submissions so far.
    pub async fn accepted_count(&self) -> f64 {
        self.metric("mrt_submissions_total{outcome=\"accepted\"}")
            .await
    }

    /// Accepted submissions, read from the state (works after the server stopped).
    pub fn accepted_count_offline(&self) -> u64 {
        self.state
            .metrics()
            .submissions_accepted
            .load(std::sync::atomic::Ordering::Relaxed)
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

/// Status, headers and JSON body (panics if the body is not JSON).
pub async fn json_parts(response: reqwest::Response) -> (StatusCode, HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let body =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text:?}"));
    (status, headers, body)
}

/// `cache-control: no-store` and `x-content-type-options: nosniff`.
pub fn assert_security_headers(headers: &HeaderMap) {
    assert_eq!(
        headers.get("cache-control").map(|v| v.as_bytes()),
        Some(&b"no-store"[..]),
        "cache-control in {headers:?}"
    );
    assert_eq!(
        headers.get("x-content-type-options").map(|v| v.as_bytes()),
        Some(&b"nosniff"[..]),
        "x-content-type-options in {headers:?}"
    );
}

/// The headers of every JSON response.
pub fn assert_json_headers(headers: &HeaderMap) {
    assert_eq!(
        headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/json; charset=utf-8"[..]),
        "content-type in {headers:?}"
    );
    assert_security_headers(headers);
}

/// The headers of every event stream.
pub fn assert_sse_headers(headers: &HeaderMap) {
    assert_eq!(
        headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"text/event-stream; charset=utf-8"[..]),
        "content-type in {headers:?}"
    );
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

/// An incrementally read event stream.
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

/// The `type` of each event.
pub fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().expect("type"))
        .collect()
}

/// Asserts sequences `first..` with no gap, every event for `id`, and exactly one terminal
/// event, last.
pub fn assert_log(events: &[Value], id: &str, first: u64) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event["sequence"],
            first + i as u64,
            "contiguous sequence at {i}"
        );
        assert_eq!(event["execution_id"], id);
    }
    let terminal: Vec<_> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            matches!(
                e["type"].as_str(),
                Some("execution.completed" | "execution.failed")
            )
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        terminal,
        vec![events.len() - 1],
        "one terminal event, last: {events:?}"
    );
}

/// Whether `s` is `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn is_iso_millis(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b[i].is_ascii_digit());
    b.len() == 24
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z'
}

/// Whether `s` is a canonical (lowercase, hyphenated) random v4 UUID.
pub fn is_uuid_v4(s: &str) -> bool {
    uuid::Uuid::parse_str(s)
        .is_ok_and(|u| u.get_version_num() == 4 && u.hyphenated().to_string() == s)
}
