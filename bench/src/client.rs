//! The HTTP side of one execution: submit, then read the event stream to its terminal event.
//!
//! One `reqwest::Client` (and so one connection pool) is shared by every task. A connection goes
//! back to the pool only once its response body has been read to the end, so event streams are
//! always drained past the terminal event (the gateway closes them right after it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use protocol::sse::{SseEvent, SseParser};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use tokio::time::Instant;

/// How the events of an execution are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamMode {
    /// `POST /v1/executions` (202), then `GET /v1/executions/{id}/events`: two requests.
    Get,
    /// `POST /v1/executions` with `Accept: text/event-stream`: one request; the submit latency is
    /// the time to the response headers.
    Inline,
}

/// Why an execution did not produce a terminal event. The label is the error-count key.
#[derive(Debug)]
pub enum ExecError {
    /// The submit answered with an unexpected status (429 `queue_full`, 503, ...).
    SubmitStatus(u16),
    /// The event stream answered with an unexpected status.
    StreamStatus(u16),
    /// Connect, write or read failure.
    Transport(String),
    /// The 202 body was not an `ExecutionSubmission`.
    BadSubmission,
    /// The stream ended (or broke) before a terminal event.
    Truncated,
    /// A frame could not be parsed.
    BadFrame,
    /// No terminal event within the per-execution timeout.
    Timeout,
}

impl ExecError {
    pub fn label(&self) -> String {
        match self {
            ExecError::SubmitStatus(s) => format!("submit_http_{s}"),
            ExecError::StreamStatus(s) => format!("events_http_{s}"),
            ExecError::Transport(kind) => format!("transport_{kind}"),
            ExecError::BadSubmission => "bad_submission_body".into(),
            ExecError::Truncated => "stream_truncated".into(),
            ExecError::BadFrame => "bad_sse_frame".into(),
            ExecError::Timeout => "timeout".into(),
        }
    }
}

impl From<reqwest::Error> for ExecError {
    fn from(e: reqwest::Error) -> Self {
        let kind = if e.is_connect() {
            "connect"
        } else if e.is_timeout() {
            "timeout"
        } else if e.is_body() || e.is_decode() {
            "body"
        } else if e.is_request() {
            "request"
        } else {
            "other"
        };
        ExecError::Transport(kind.into())
    }
}

/// Timings of one execution, each measured from the execution's start instant (the scheduled
/// arrival in open loop, the moment the request is sent in closed loop).
#[derive(Debug, Clone)]
pub struct ExecTiming {
    /// Until the 202 body was read (get mode) or the stream's headers arrived (inline mode).
    pub submit: Duration,
    /// Until the first `output.delta` was parsed; `None` if the execution produced none.
    pub first_delta: Option<Duration>,
    /// Until the `time` stamped on `route.selected`, read against the wall clock at the start
    /// (see `stats::LatencySet::route_stamped`); `None` without one.
    pub route_stamped: Option<Duration>,
    /// Until the `time` stamped on the first `output.delta` (as `route_stamped`).
    pub first_delta_stamped: Option<Duration>,
    /// Until the last `output.delta` was parsed; `None` if the execution produced none.
    pub last_delta: Option<Duration>,
    /// How many `output.delta` events the stream carried.
    pub deltas: u32,
    /// Until the terminal event was parsed.
    pub terminal: Duration,
    /// `execution.completed` (true) or `execution.failed` (false).
    pub completed: bool,
    /// Each gap between two consecutive `output.delta` events as parsed, in µs (0 for deltas
    /// parsed from the same read).
    pub gaps_us: Vec<u32>,
}

#[derive(Deserialize)]
struct Submission {
    execution_id: String,
}

/// Shared client state.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    /// The gateways, each execution going to the next in turn (submit and events alike).
    gateways: Arc<[Gateway]>,
    next: Arc<AtomicUsize>,
    body: Bytes,
    /// `Some(prefix)`: every submit carries `Idempotency-Key: {prefix}-{n}`, unique per submit,
    /// so a gateway with an idempotency store (Redis in nats mode) claims a key each time.
    idempotency: Option<(Arc<str>, Arc<AtomicU64>)>,
}

/// One gateway's base URL and submit URL.
#[derive(Debug)]
struct Gateway {
    base: String,
    submit_url: reqwest::Url,
}

impl Api {
    /// Each of `bases` is `http://HOST:PORT` (no trailing slash); `body` the request JSON to
    /// submit. Executions go to the gateways in turn.
    pub fn new(bases: &[String], body: Bytes, pool: usize) -> Result<Self, String> {
        let gateways = bases
            .iter()
            .map(|base| {
                let base = base.trim_end_matches('/').to_string();
                let submit_url = reqwest::Url::parse(&format!("{base}/v1/executions"))
                    .map_err(|e| format!("bad --url: {e}"))?;
                Ok(Gateway { base, submit_url })
            })
            .collect::<Result<Vec<_>, String>>()?;
        if gateways.is_empty() {
            return Err("no gateway to send executions to".into());
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(pool)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            http,
            gateways: gateways.into(),
            next: Arc::new(AtomicUsize::new(0)),
            body,
            idempotency: None,
        })
    }

    /// The gateway of the next execution.
    fn gateway(&self) -> &Gateway {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        &self.gateways[n % self.gateways.len()]
    }

    /// Sends a unique `Idempotency-Key` (`{prefix}-{counter}`) with every submit.
    pub fn with_idempotency_keys(mut self, prefix: &str) -> Self {
        self.idempotency = Some((Arc::from(prefix), Arc::new(AtomicU64::new(0))));
        self
    }

    /// `GET path` on every gateway until each answers 200 or `within` passes.
    pub async fn wait_ready(&self, path: &str, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        for gateway in self.gateways.iter() {
            let url = format!("{}{path}", gateway.base);
            loop {
                match self.http.get(&url).send().await {
                    Ok(r) if r.status().as_u16() == 200 => {
                        let _ = r.bytes().await;
                        break;
                    }
                    Ok(r) if Instant::now() >= deadline => {
                        return Err(format!("{url} answered {}", r.status()));
                    }
                    Err(e) if Instant::now() >= deadline => return Err(format!("{url}: {e}")),
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok(())
    }

    fn post(&self, gateway: &Gateway) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(gateway.submit_url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(self.body.clone());
        match &self.idempotency {
            Some((prefix, counter)) => {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                request.header("Idempotency-Key", format!("{prefix}-{n}"))
            }
            None => request,
        }
    }

    /// `POST /v1/executions` and read the 202 body; returns the execution id.
    pub async fn submit(&self) -> Result<String, ExecError> {
        self.submit_to(self.gateway()).await
    }

    async fn submit_to(&self, gateway: &Gateway) -> Result<String, ExecError> {
        let response = self.post(gateway).send().await?;
        let status = response.status().as_u16();
        let body = response.bytes().await?;
        if status != 202 {
            return Err(ExecError::SubmitStatus(status));
        }
        let submission: Submission =
            serde_json::from_slice(&body).map_err(|_| ExecError::BadSubmission)?;
        Ok(submission.execution_id)
    }

    /// One full execution from `start`: submit, then read every event up to the terminal one
    /// and drain the stream.
    pub async fn execute(&self, start: Instant, mode: StreamMode) -> Result<ExecTiming, ExecError> {
        let start_wall = protocol::Timestamp::now().unix_millis()
            - i64::try_from(start.elapsed().as_millis()).unwrap_or(0);
        let gateway = self.gateway();
        let (response, submit) = match mode {
            StreamMode::Get => {
                let id = self.submit_to(gateway).await?;
                let submit = start.elapsed();
                let url = format!("{}/v1/executions/{id}/events", gateway.base);
                let response = self.http.get(url).send().await?;
                let status = response.status().as_u16();
                if status != 200 {
                    let _ = response.bytes().await;
                    return Err(ExecError::StreamStatus(status));
                }
                (response, submit)
            }
            StreamMode::Inline => {
                let response = self
                    .post(gateway)
                    .header(ACCEPT, HeaderValue::from_static("text/event-stream"))
                    .send()
                    .await?;
                let submit = start.elapsed();
                let status = response.status().as_u16();
                if !(200..300).contains(&status) {
                    let _ = response.bytes().await;
                    return Err(ExecError::SubmitStatus(status));
                }
                (response, submit)
            }
        };
        read_stream(response, start, start_wall, submit).await
    }
}

async fn read_stream(
    mut response: reqwest::Response,
    start: Instant,
    start_wall: i64,
    submit: Duration,
) -> Result<ExecTiming, ExecError> {
    // An event's `time` stamp as an offset from the start's wall clock.
    let stamped = |event: &SseEvent| -> Option<Duration> {
        #[derive(Deserialize)]
        struct Stamp {
            time: protocol::Timestamp,
        }
        let stamp: Stamp = serde_json::from_str(&event.data).ok()?;
        let ms = u64::try_from(stamp.time.unix_millis() - start_wall).unwrap_or(0);
        Some(Duration::from_millis(ms))
    };
    let mut route_stamped = None;
    let mut first_delta_stamped = None;
    let mut parser = SseParser::new();
    let mut events: Vec<SseEvent> = Vec::with_capacity(8);
    let mut first_delta = None;
    let mut last_delta = None;
    let mut deltas = 0u32;
    let mut gaps_us = Vec::new();
    let mut terminal: Option<(Duration, bool)> = None;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            // A break after the terminal event costs the connection, not the execution.
            Err(_) if terminal.is_some() => break,
            Err(e) => return Err(e.into()),
        };
        if parser.push(&chunk, &mut events).is_err() {
            return Err(ExecError::BadFrame);
        }
        for event in events.drain(..) {
            match event.event.as_str() {
                "output.delta" => {
                    let now = start.elapsed();
                    if first_delta.is_none() {
                        first_delta = Some(now);
                        first_delta_stamped = stamped(&event);
                    }
                    if let Some(previous) = last_delta {
                        gaps_us.push(gap_us(previous, now));
                    }
                    last_delta = Some(now);
                    deltas += 1;
                }
                "route.selected" if route_stamped.is_none() => {
                    route_stamped = stamped(&event);
                }
                "execution.completed" if terminal.is_none() => {
                    terminal = Some((start.elapsed(), true));
                }
                "execution.failed" if terminal.is_none() => {
                    terminal = Some((start.elapsed(), false));
                }
                _ => {}
            }
        }
    }
    let Some((terminal, completed)) = terminal else {
        return Err(ExecError::Truncated);
    };
    Ok(ExecTiming {
        submit,
        first_delta,
        route_stamped,
        first_delta_stamped,
        last_delta,
        deltas,
        terminal,
        completed,
        gaps_us,
    })
}

/// `later − earlier` in whole µs, saturating (0 if `later` is not after `earlier`).
pub fn gap_us(earlier: Duration, later: Duration) -> u32 {
    u32::try_from(later.saturating_sub(earlier).as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_is_whole_microseconds_and_never_negative() {
        let a = Duration::from_micros(1_000);
        assert_eq!(gap_us(a, Duration::from_nanos(11_000_999)), 10_000);
        assert_eq!(gap_us(a, a), 0);
        assert_eq!(gap_us(Duration::from_millis(5), a), 0);
        assert_eq!(
            gap_us(Duration::ZERO, Duration::from_secs(10_000)),
            u32::MAX
        );
    }
}
