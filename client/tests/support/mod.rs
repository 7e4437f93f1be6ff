//! Test harness: a real gateway in embedded mode (from `testkit::gateway`), a TCP proxy that cuts the
//! server-to-client direction at random byte offsets, and a scripted fake HTTP server for the
//! protocol violations a real gateway never commits.
//!
//! Nothing here sleeps for a fixed time to wait for a condition: waits poll with a generous
//! deadline ([`WAIT`]) so the tests pass on a busy two-core machine.

// Each test binary uses a different subset; harness code panics on failure like the tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use model_runtime_client::{Client, ClientError, RetryPolicy, SubmitOptions, text_request};
use protocol::ExecutionId;
use protocol::snapshot::ExecutionSubmission;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest any condition is awaited.
pub const WAIT: Duration = Duration::from_secs(30);

pub use testkit::gateway::Gateway;

/// A mock provider `provider-mock` serving `text-generation` on `model-alpha` with `extra`
/// fields merged in.
pub fn mock(extra: Value) -> Value {
    testkit::gateway::mock("provider-mock", extra)
}

/// A gateway whose mock waits a minute before each chunk.
pub async fn slow_gateway() -> Gateway {
    Gateway::start(
        serde_json::json!({ "providers": [mock(serde_json::json!({ "delay_ms": 60_000 }))] }),
    )
    .await
}

/// A gateway whose mock fails every attempt retryably.
pub async fn failing_gateway() -> Gateway {
    Gateway::start(
        serde_json::json!({ "providers": [mock(serde_json::json!({ "fail_retryably": true }))] }),
    )
    .await
}

/// Submits a request for `ability` with one text part and default options.
pub async fn submit_plain(
    client: &Client,
    ability: &str,
    text: &str,
) -> Result<ExecutionSubmission, ClientError> {
    let request = text_request(ability, text);
    client.submit(&request, &SubmitOptions::default()).await
}

/// Submits a text-generation request with default options; returns its id.
pub async fn submit_text(client: &Client, text: &str) -> ExecutionId {
    let submission = submit_plain(client, "text-generation", text).await;
    submission.expect("submitted").execution_id
}

/// Polls the snapshot of `id` until it is terminal.
pub async fn wait_terminal(client: &Client, id: ExecutionId) -> protocol::ExecutionSnapshot {
    wait_for("a terminal status", || async move {
        let s = client.get(id).await.unwrap();
        s.status.is_terminal().then_some(s)
    })
    .await
}

/// The API client under test, for a gateway.
pub trait ClientOf {
    /// A client with quick retries.
    fn client(&self) -> Client;
}

impl ClientOf for Gateway {
    fn client(&self) -> Client {
        client_for(&self.base)
    }
}

/// A client of `base` with quick, generous retries (tests cut many connections).
pub fn client_for(base: &str) -> Client {
    Client::builder(base)
        .retry(RetryPolicy {
            max_retries: 12,
            initial_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(40),
        })
        .build()
        .expect("client")
}

/// Polls `check` until it returns `Some`, panicking with `what` after [`WAIT`].
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP proxy in front of `upstream` that forwards the client's bytes untouched and cuts the
/// server's: each connection gets a random budget of bytes (from a seeded generator), after
/// which both sockets are closed. Every `pass_every`-th connection is never cut, so any run
/// eventually completes.
pub struct CutProxy {
    pub base: String,
    pub connections: Arc<AtomicUsize>,
    pub cuts: Arc<AtomicUsize>,
}

impl CutProxy {
    pub async fn start(upstream: SocketAddr, seed: u64, max_cut: usize, pass_every: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let cuts = Arc::new(AtomicUsize::new(0));
        let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
        let (conns, cut_count) = (Arc::clone(&connections), Arc::clone(&cuts));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let n = conns.fetch_add(1, Ordering::SeqCst) + 1;
                let budget = if n % pass_every == 0 {
                    None
                } else {
                    Some(rng.lock().unwrap().random_range(0..max_cut))
                };
                let cut_count = Arc::clone(&cut_count);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    if proxy(client, server, budget).await {
                        cut_count.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        Self {
            base: format!("http://{addr}"),
            connections,
            cuts,
        }
    }
}

/// Copies both directions; returns whether the budget cut the connection.
async fn proxy(client: TcpStream, server: TcpStream, budget: Option<usize>) -> bool {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let mut left = budget.unwrap_or(usize::MAX);
    let mut buf = vec![0u8; 4096];
    let mut cut = false;
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let take = n.min(left);
        if client_write.write_all(&buf[..take]).await.is_err() {
            break;
        }
        left -= take;
        if take < n || left == 0 {
            cut = budget.is_some();
            break;
        }
    }
    // Dropping the halves closes both sockets: the client sees the connection end mid-response.
    upstream.abort();
    cut
}

/// One request seen by a [`FakeServer`].
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// `GET /path?query HTTP/1.1`
    pub line: String,
}

impl SeenRequest {
    /// The `after` query value, if any.
    pub fn after(&self) -> Option<u64> {
        let target = self.line.split(' ').nth(1)?;
        let query = target.split_once('?')?.1;
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("after="))
            .and_then(|v| v.parse().ok())
    }

    pub fn path(&self) -> String {
        let target = self.line.split(' ').nth(1).unwrap_or_default();
        target.split('?').next().unwrap_or_default().to_owned()
    }
}

/// A scripted HTTP/1.1 server: each connection carries one request; `respond` gets the
/// connection's index and the request and returns the raw response bytes, after which the
/// connection is closed (so a body without a length ends at EOF).
pub struct FakeServer {
    pub base: String,
    pub requests: Arc<Mutex<Vec<SeenRequest>>>,
}

impl FakeServer {
    pub async fn start<F>(respond: F) -> Self
    where
        F: Fn(usize, &SeenRequest) -> Vec<u8> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake");
        let addr = listener.local_addr().expect("fake addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let respond = Arc::new(respond);
        tokio::spawn(async move {
            let mut index = 0usize;
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let request = SeenRequest {
                    line: text.lines().next().unwrap_or_default().to_owned(),
                };
                seen.lock().unwrap().push(request.clone());
                let response = respond(index, &request);
                index += 1;
                let _ = socket.write_all(&response).await;
                let _ = socket.shutdown().await;
            }
        });
        Self {
            base: format!("http://{addr}"),
            requests,
        }
    }

    pub fn seen(&self) -> Vec<SeenRequest> {
        self.requests.lock().unwrap().clone()
    }
}

/// An SSE response head whose body runs until the connection closes.
pub fn sse_response(body: &[u8]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\nconnection: close\r\n\r\n".to_vec();
    out.extend_from_slice(body);
    out
}

/// A JSON response with `status`.
pub fn json_response(status: u16, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What a run of the `mrt` binary printed, and its exit code (-1: killed by a signal).
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `mrt ARGS` with `env` and `stdin` (none: closed at once), without the caller's
/// `MODEL_RUNTIME_URL`, `MODEL_RUNTIME_API_KEY` and proxy variables, off the runtime's worker
/// threads so that an in-process gateway keeps serving.
pub async fn run_mrt(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Run {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mrt"));
        command
            .args(&args)
            .env_remove("MODEL_RUNTIME_URL")
            .env_remove("MODEL_RUNTIME_API_KEY")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy")
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn mrt");
        let mut pipe = child.stdin.take().expect("stdin");
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes()).expect("write stdin");
        }
        drop(pipe);
        let output = child.wait_with_output().expect("mrt output");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout).expect("utf-8 stdout"),
            stderr: String::from_utf8(output.stderr).expect("utf-8 stderr"),
        }
    })
    .await
    .expect("mrt task")
}
