//! Baselines that do not go through the gateway, as subcommands of `bench`:
//!
//! - `nats-rtt`: JetStream publish-with-ack round trips through async-nats, into a file-storage
//!   stream created for the run (and deleted after it) in a throwaway subject namespace.
//! - `redis-rtt`: `SET key val NX GET PX 60000` round trips, one fresh key per command, the
//!   command the gateway's Redis idempotency store sends per claim.
//! - `fixture-serve`: an HTTP server on 127.0.0.1 speaking the OpenAI Chat Completions streaming
//!   format (`data: {chat.completion.chunk}` frames, N content deltas, a finish chunk, a usage
//!   chunk, `data: [DONE]`), no delay: the whole body is one write.
//! - `fixture-direct`: reads that fixture directly with reqwest + `protocol::sse::SseParser`:
//!   time to first delta and per-delta time, the baseline for the `openai-chat` adapter path.
//! - `otlp-sink`: an OTLP/HTTP receiver that accepts and discards every export (`POST
//!   /v1/traces`, `/v1/metrics`, `/v1/logs`), so trace export can be measured with a collector
//!   that keeps up.
//!
//! Each prints a short human summary and, with `--json-out`, a JSON report. Latencies are in µs
//! (HdrHistogram, 3 significant figures) except `per_delta_ns`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use protocol::sse::{SseEvent, SseParser};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::stats::Summary;

/// The baseline subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// JetStream publish-with-ack round trips (async-nats, file-storage stream).
    NatsRtt(NatsArgs),
    /// Redis `SET key val NX GET PX 60000` round trips, one fresh key each.
    RedisRtt(RedisArgs),
    /// Serve the OpenAI Chat Completions streaming fixture until killed.
    FixtureServe(FixtureArgs),
    /// Read the fixture directly (reqwest + SseParser): first delta and per-delta time.
    FixtureDirect(DirectArgs),
    /// Accept and discard OTLP/HTTP exports until killed (a collector that keeps up).
    OtlpSink(SinkArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct SinkArgs {
    /// Port on 127.0.0.1 (0: any).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// Options every loop shares.
#[derive(Debug, Clone, clap::Args)]
pub struct LoopArgs {
    /// Concurrent tasks, each one operation at a time.
    #[arg(long, short = 'c', default_value_t = 1)]
    pub concurrency: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds run before measuring (not recorded).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Also write the JSON report here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    pub payload: usize,
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct FixtureArgs {
    /// Content deltas per response.
    #[arg(long, default_value_t = 16)]
    pub deltas: usize,
    /// Port on 127.0.0.1 (0: any).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DirectArgs {
    /// Fixture base URL (`http://127.0.0.1:PORT`); without it, a fixture is started in-process.
    #[arg(long)]
    pub fixture_url: Option<String>,
    /// Content deltas per response for the in-process fixture.
    #[arg(long, default_value_t = 16)]
    pub deltas: usize,
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Serialize)]
struct RawReport {
    what: String,
    concurrency: usize,
    elapsed_s: f64,
    ops: u64,
    errors: u64,
    per_s: f64,
    /// Operation round trip (µs).
    rtt: Option<Summary>,
    /// fixture-direct: request sent → first content delta parsed (µs).
    first_delta: Option<Summary>,
    /// fixture-direct: request sent → `[DONE]` parsed (µs).
    done: Option<Summary>,
    /// fixture-direct: (last − first delta) / (deltas − 1) per response, **ns**.
    per_delta_ns: Option<Summary>,
}

#[allow(clippy::expect_used)]
fn histogram() -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds");
    h.auto(true);
    h
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Per-task results, merged at the end.
struct Hists {
    rtt: Histogram<u64>,
    first: Histogram<u64>,
    done: Histogram<u64>,
    per_delta: Histogram<u64>,
    ops: u64,
    errors: u64,
}

impl Hists {
    fn new() -> Self {
        Self {
            rtt: histogram(),
            first: histogram(),
            done: histogram(),
            per_delta: histogram(),
            ops: 0,
            errors: 0,
        }
    }
    fn merge(&mut self, o: &Hists) {
        let _ = self.rtt.add(&o.rtt);
        let _ = self.first.add(&o.first);
        let _ = self.done.add(&o.done);
        let _ = self.per_delta.add(&o.per_delta);
        self.ops += o.ops;
        self.errors += o.errors;
    }
}

/// Runs `op(task, i)` in `concurrency` tasks for warm-up + duration; `op` returns the timings it
/// wants recorded into the task's `Hists`, or an error.
async fn drive<F, Fut>(args: &LoopArgs, what: String, op: F) -> Result<RawReport, String>
where
    F: Fn(usize, u64, Arc<parking_lot::Mutex<Hists>>, bool) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let measure = start + Duration::from_secs_f64(args.warmup);
    let end = measure + Duration::from_secs_f64(args.duration);
    let mut set = JoinSet::new();
    for task in 0..args.concurrency.max(1) {
        let op = op.clone();
        set.spawn(async move {
            let h = Arc::new(parking_lot::Mutex::new(Hists::new()));
            let mut i = 0u64;
            let mut first_error = None;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let measured = now >= measure;
                match op(task, i, h.clone(), measured).await {
                    Ok(()) if measured => h.lock().ops += 1,
                    Ok(()) => {}
                    Err(e) => {
                        h.lock().errors += 1;
                        first_error.get_or_insert(e);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                i += 1;
            }
            (h, first_error)
        });
    }
    let mut total = Hists::new();
    while let Some(r) = set.join_next().await {
        let (h, err) = r.map_err(|e| e.to_string())?;
        if let Some(e) = err {
            eprintln!("bench: {what}: first error of a task: {e}");
        }
        total.merge(&h.lock());
    }
    let elapsed = Instant::now()
        .saturating_duration_since(measure)
        .as_secs_f64();
    Ok(RawReport {
        what,
        concurrency: args.concurrency.max(1),
        elapsed_s: elapsed,
        ops: total.ops,
        errors: total.errors,
        per_s: total.ops as f64 / elapsed.max(1e-9),
        rtt: Summary::of(&total.rtt),
        first_delta: Summary::of(&total.first),
        done: Summary::of(&total.done),
        per_delta_ns: Summary::of(&total.per_delta),
    })
}

fn print_report(r: &RawReport, json_out: Option<&PathBuf>) -> Result<(), String> {
    println!(
        "{}: c={} {:.1} s, {} ok, {} errors, {:.1}/s",
        r.what, r.concurrency, r.elapsed_s, r.ops, r.errors, r.per_s
    );
    let row = |name: &str, s: &Option<Summary>, div: f64, unit: &str| {
        if let Some(s) = s {
            println!(
                "  {name:<14} {unit}: p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3} max {:.3} mean {:.3} (n={})",
                s.p50_us as f64 / div,
                s.p90_us as f64 / div,
                s.p99_us as f64 / div,
                s.p999_us as f64 / div,
                s.max_us as f64 / div,
                s.mean_us / div,
                s.count
            );
        }
    };
    row("round trip", &r.rtt, 1000.0, "ms");
    row("first delta", &r.first_delta, 1000.0, "ms");
    row("[DONE]", &r.done, 1000.0, "ms");
    row("per delta", &r.per_delta_ns, 1.0, "ns");
    if let Some(path) = json_out {
        let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Runs one baseline subcommand.
pub async fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::NatsRtt(a) => nats_rtt(a).await,
        Command::RedisRtt(a) => redis_rtt(a).await,
        Command::FixtureServe(a) => {
            let (url, server) = start_fixture(a.deltas, a.port).await?;
            println!("fixture listening on {url}");
            server.await.map_err(|e| e.to_string())
        }
        Command::FixtureDirect(a) => fixture_direct(a).await,
        Command::OtlpSink(a) => {
            let (url, server) = start_otlp_sink(a.port).await?;
            println!("otlp sink listening on {url}");
            server.await.map_err(|e| e.to_string())
        }
    }
}

/// Starts the OTLP/HTTP sink on 127.0.0.1:`port`: every export is answered 200 with an empty
/// protobuf body (an `Export*ServiceResponse` with no partial success); returns its base URL.
pub async fn start_otlp_sink(port: u16) -> Result<(String, tokio::task::JoinHandle<()>), String> {
    use axum::http::header;
    let accept = || async {
        (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            Bytes::new(),
        )
    };
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(accept))
        .route("/v1/metrics", axum::routing::post(accept))
        .route("/v1/logs", axum::routing::post(accept))
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot bind the OTLP sink: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("bench: OTLP sink: {e}");
        }
    });
    Ok((format!("http://{addr}"), server))
}

async fn nats_rtt(a: NatsArgs) -> Result<(), String> {
    use async_nats::jetstream::{self, stream};
    let client = async_nats::connect(&a.nats_url)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", a.nats_url))?;
    let js = jetstream::new(client);
    let pid = std::process::id();
    let name = format!("BENCHRAW_{pid}");
    let prefix = format!("benchraw{pid}");
    js.get_or_create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("cannot create stream {name}: {e}"))?;
    let payload = Bytes::from(vec![b'x'; a.payload]);
    let js2 = js.clone();
    let what = format!(
        "JetStream publish+ack, file stream {name}, {} B payload",
        a.payload
    );
    let report = drive(&a.run, what, move |task, _i, h, measured| {
        let js = js2.clone();
        let payload = payload.clone();
        let subject = format!("{prefix}.t{task}");
        async move {
            let t = Instant::now();
            js.publish(subject, payload)
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())?;
            if measured {
                let _ = h.lock().rtt.record(us(t.elapsed()));
            }
            Ok(())
        }
    })
    .await;
    let deleted = js.delete_stream(&name).await;
    if let Err(e) = deleted {
        eprintln!("bench: cannot delete stream {name}: {e}");
    }
    print_report(&report?, a.run.json_out.as_ref())
}

async fn redis_rtt(a: RedisArgs) -> Result<(), String> {
    let client = redis::Client::open(a.redis_url.as_str()).map_err(|e| e.to_string())?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", a.redis_url))?;
    let pid = std::process::id();
    let report = drive(
        &a.run,
        "Redis SET key val NX GET PX 60000, fresh key each".to_string(),
        move |task, i, h, measured| {
            let mut conn = conn.clone();
            let key = format!("benchraw:{pid}:{task}:{i}");
            async move {
                let mut cmd = redis::cmd("SET");
                cmd.arg(&key)
                    .arg("1")
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(60_000);
                let t = Instant::now();
                let _: redis::Value = cmd
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if measured {
                    let _ = h.lock().rtt.record(us(t.elapsed()));
                }
                Ok(())
            }
        },
    )
    .await?;
    print_report(&report, a.run.json_out.as_ref())
}

/// The fixture's response body: N content deltas, a finish chunk, a usage chunk, `[DONE]`.
pub fn fixture_body(deltas: usize) -> Bytes {
    let mut s = String::with_capacity(deltas * 160 + 512);
    let head = r#"{"id":"chatcmpl-fixture","object":"chat.completion.chunk","created":1700000000,"model":"m","#;
    s.push_str("data: ");
    s.push_str(head);
    s.push_str(r#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#);
    s.push_str("\n\n");
    for i in 0..deltas {
        s.push_str("data: ");
        s.push_str(head);
        s.push_str(&format!(
            r#""choices":[{{"index":0,"delta":{{"content":"tok{i} "}},"finish_reason":null}}]}}"#
        ));
        s.push_str("\n\n");
    }
    s.push_str("data: ");
    s.push_str(head);
    s.push_str(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#);
    s.push_str("\n\n");
    s.push_str("data: ");
    s.push_str(head);
    s.push_str(&format!(
        r#""choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":{deltas},"total_tokens":{}}}}}"#,
        deltas + 1
    ));
    s.push_str("\n\ndata: [DONE]\n\n");
    Bytes::from(s)
}

/// Starts the fixture on 127.0.0.1:`port`; returns its base URL and the serving task.
pub async fn start_fixture(
    deltas: usize,
    port: u16,
) -> Result<(String, tokio::task::JoinHandle<()>), String> {
    use axum::http::header;
    let body = fixture_body(deltas);
    let handler = move |_req: axum::body::Bytes| {
        let body = body.clone();
        async move {
            (
                [
                    (header::CONTENT_TYPE, "text/event-stream"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                body,
            )
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot bind the fixture: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move {
        // TCP_NODELAY on accepted sockets, like the gateway (see Problems found, item 1).
        let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
            let _ = s.set_nodelay(true);
        });
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("bench: fixture server: {e}");
        }
    });
    Ok((format!("http://{addr}"), server))
}

async fn fixture_direct(a: DirectArgs) -> Result<(), String> {
    let (base, _server) = match &a.fixture_url {
        Some(u) => (u.trim_end_matches('/').to_string(), None),
        None => {
            let (u, s) = start_fixture(a.deltas, 0).await?;
            (u, Some(s))
        }
    };
    let url = reqwest::Url::parse(&format!("{base}/v1/chat/completions"))
        .map_err(|e| format!("bad fixture url: {e}"))?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(a.run.concurrency.max(1))
        .build()
        .map_err(|e| e.to_string())?;
    let body = Bytes::from_static(
        br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let what = format!("fixture direct (reqwest + SseParser) {base}");
    let report = drive(&a.run, what, move |_task, _i, h, measured| {
        let http = http.clone();
        let url = url.clone();
        let body = body.clone();
        async move {
            let t = Instant::now();
            let mut resp = http
                .post(url)
                .header("content-type", "application/json")
                .header("authorization", "Bearer fixture")
                .body(body)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if resp.status().as_u16() != 200 {
                return Err(format!("status {}", resp.status()));
            }
            let mut parser = SseParser::new();
            let mut events: Vec<SseEvent> = Vec::with_capacity(32);
            let (mut first, mut last, mut done, mut n) = (None, None, None, 0u32);
            while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
                parser
                    .push(&chunk, &mut events)
                    .map_err(|e| format!("sse: {e:?}"))?;
                for ev in events.drain(..) {
                    if ev.data == "[DONE]" {
                        done.get_or_insert(t.elapsed());
                    } else if ev.data.contains(r#""content":"tok"#) {
                        let now = t.elapsed();
                        first.get_or_insert(now);
                        last = Some(now);
                        n += 1;
                    }
                }
            }
            let (Some(first), Some(last), Some(done)) = (first, last, done) else {
                return Err("stream without deltas or [DONE]".into());
            };
            if measured {
                let mut h = h.lock();
                let _ = h.rtt.record(us(done));
                let _ = h.first.record(us(first));
                let _ = h.done.record(us(done));
                if n >= 2 {
                    let gap = (last - first).as_nanos() / u128::from(n - 1);
                    let _ = h
                        .per_delta
                        .record(u64::try_from(gap).unwrap_or(u64::MAX).max(1));
                }
            }
            Ok(())
        }
    })
    .await?;
    print_report(&report, a.run.json_out.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn otlp_sink_accepts_exports_and_refuses_other_paths() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, server) = start_otlp_sink(0).await.unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let ok = http
            .post(format!("{url}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(vec![0u8; 64])
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status().as_u16(), 200);
        assert_eq!(
            ok.headers()["content-type"].to_str().unwrap(),
            "application/x-protobuf"
        );
        let other = http.post(format!("{url}/v1/other")).send().await.unwrap();
        assert_eq!(other.status().as_u16(), 404);
        server.abort();
    }

    #[test]
    fn fixture_body_is_sse_with_deltas_usage_and_done() {
        let body = fixture_body(3);
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        assert!(parser.push(&body, &mut events).is_ok());
        // role chunk, 3 deltas, finish chunk, usage chunk, [DONE]
        assert_eq!(events.len(), 7);
        assert!(events[1].data.contains(r#""content":"tok0 ""#));
        assert!(events[5].data.contains(r#""usage""#));
        assert_eq!(events[6].data, "[DONE]");
        for ev in &events[..6] {
            assert!(serde_json::from_str::<serde_json::Value>(&ev.data).is_ok());
        }
    }
}
