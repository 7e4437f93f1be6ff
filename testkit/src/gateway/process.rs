//! The real `gateway` and `worker` binaries as child processes over a private NATS JetStream
//! and Redis per test ([`Cluster`]), and the plain HTTP/SSE calls end-to-end tests make.
//!
//! The binaries are the ones cargo built for this test run (next to the test executable);
//! if they are missing, the harness builds them once with `cargo build --bins`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{KillOnDrop, NatsServer, RedisServer, TempDir, unique_namespace};
use futures_util::StreamExt;
use protocol::sse::{SseEvent, SseParser};
use serde_json::{Value, json};

/// Generous bound for anything that should happen promptly on a busy 2-core machine.
pub const PROMPT: Duration = Duration::from_secs(30);

fn target_dir() -> PathBuf {
    // target/<profile>/deps/<test-binary>
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target profile dir")
        .to_path_buf()
}

/// Path of a workspace binary, building the binaries once if this run did not.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let path = target_dir().join(name);
    if !path.exists() {
        BUILT.get_or_init(|| {
            let status = Command::new(env!("CARGO"))
                .args(["build", "-p", "gateway", "-p", "worker", "--bins"])
                .status()
                .expect("run cargo build");
            assert!(status.success(), "cargo build of the binaries failed");
        });
    }
    assert!(path.exists(), "binary {} not found", path.display());
    path
}

/// A child process killed on drop; its stderr goes to a log file for post-mortems.
#[derive(Debug)]
pub struct Process {
    child: KillOnDrop,
    pub name: String,
    pub log: PathBuf,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the process's log, for a failure's message.
    pub fn log_tail(&self) -> String {
        crate::log_tail(&self.log)
    }
}

/// Spawns `binary` with `args`/`env` and waits for a stdout line starting with `ready_prefix`;
/// returns the process and that line.
pub fn spawn(
    name: &str,
    args: &[&str],
    env: &[(String, String)],
    ready_prefix: &str,
    logs: &TempDir,
) -> (Process, String) {
    let mut command = Command::new(binary(name));
    command.args(args).env_clear();
    for key in ["PATH", "HOME"] {
        if let Ok(v) = std::env::var(key) {
            command.env(key, v);
        }
    }
    command.env("RUST_LOG", "info");
    for (k, v) in env {
        command.env(k, v);
    }
    spawn_command(command, name, ready_prefix, logs)
}

/// Spawns `command`, which runs binary `name` (directly or through a wrapper such as
/// `ip netns exec`), with stderr to a log file in `logs`, and waits for a stdout line starting
/// with `ready_prefix`; returns the process and that line.
pub fn spawn_command(
    mut command: Command,
    name: &str,
    ready_prefix: &str,
    logs: &TempDir,
) -> (Process, String) {
    let log = logs
        .path()
        .join(format!("{}-{}.log", name, unique_namespace("")));
    let stderr = std::fs::File::create(&log).expect("log file");
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    let mut child = command.spawn().expect("spawn binary");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
    });
    let process = Process {
        child: KillOnDrop(child),
        name: name.to_owned(),
        log,
    };
    let deadline = Instant::now() + PROMPT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with(ready_prefix) => return (process, line),
            Ok(_) => {}
            Err(_) => panic!(
                "{name} did not print {ready_prefix:?} in time; log:\n{}",
                process.log_text()
            ),
        }
    }
}

/// A gateway process and its base URL.
#[derive(Debug)]
pub struct Gateway {
    pub process: Process,
    pub url: String,
}

/// Starts a gateway on a free port with `env` (see [`spawn`]) and waits until it listens.
pub fn spawn_gateway(env: &[(String, String)], logs: &TempDir) -> Gateway {
    let (process, line) = spawn("gateway", &["--port", "0"], env, "listening on ", logs);
    let url = line.trim_start_matches("listening on ").trim().to_owned();
    Gateway { process, url }
}

/// The environment of a process on the nats backend: the NATS server it connects to (one node
/// of a cluster learns the others from its gossip), Redis, its namespace and deployment file.
/// Several processes share the machine, so each admin endpoint is on a free port.
pub fn nats_env(
    nats_url: String,
    redis: &RedisServer,
    namespace: &str,
    config: &Path,
) -> Vec<(String, String)> {
    vec![
        ("MODEL_RUNTIME_BACKEND".into(), "nats".into()),
        ("NATS_URL".into(), nats_url),
        ("REDIS_URL".into(), redis.url()),
        ("MODEL_RUNTIME_NAMESPACE".into(), namespace.into()),
        ("MODEL_RUNTIME_CONFIG".into(), config.display().to_string()),
        ("MODEL_RUNTIME_ADMIN_PORT".into(), "0".into()),
    ]
}

/// NATS + Redis + configuration shared by the processes of one test.
#[derive(Debug)]
pub struct Cluster {
    pub nats: NatsServer,
    pub redis: RedisServer,
    pub namespace: String,
    pub dir: TempDir,
    config: PathBuf,
    pub extra_env: Vec<(String, String)>,
}

impl Cluster {
    /// Starts NATS and Redis and writes `config` (a deployment file) for the processes.
    pub fn start(config: &Value) -> Self {
        let dir = TempDir::new("mrt-e2e-");
        let path = dir.path().join("deployment.json");
        std::fs::write(&path, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        Self {
            nats: NatsServer::start(),
            redis: RedisServer::start(),
            namespace: unique_namespace("e"),
            dir,
            config: path,
            extra_env: vec![("MODEL_RUNTIME_ACK_WAIT_MS".into(), "2000".into())],
        }
    }

    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = nats_env(self.nats.url(), &self.redis, &self.namespace, &self.config);
        env.push(("MODEL_RUNTIME_SHUTDOWN_GRACE_MS".into(), "5000".into()));
        env.extend(self.extra_env.iter().cloned());
        env
    }

    pub fn gateway(&self) -> Gateway {
        spawn_gateway(&self.env(), &self.dir)
    }

    pub fn worker(&self) -> Process {
        self.worker_with(&[])
    }

    /// `G` gateways, then `W` workers.
    pub fn processes<const G: usize, const W: usize>(&self) -> ([Gateway; G], [Process; W]) {
        let gateways = std::array::from_fn(|_| self.gateway());
        (gateways, std::array::from_fn(|_| self.worker()))
    }

    /// A worker and the base URL of its admin endpoint (`/metrics`, `/healthz`, `/readyz`).
    pub fn worker_with_admin(&self, env: &[(&str, &str)]) -> (Process, String) {
        let mut all = self.env();
        all.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let (process, line) = spawn("worker", &[], &all, "admin listening on ", &self.dir);
        let url = line
            .trim_start_matches("admin listening on ")
            .trim()
            .to_owned();
        (process, url)
    }

    pub fn worker_with(&self, env: &[(&str, &str)]) -> Process {
        let mut all = self.env();
        all.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        spawn("worker", &[], &all, "worker started", &self.dir).0
    }
}

/// A cluster for `config` with one gateway and one worker.
pub fn gateway_and_worker(config: &Value) -> (Cluster, Gateway, Process) {
    let cluster = Cluster::start(config);
    let gateway = cluster.gateway();
    let worker = cluster.worker();
    (cluster, gateway, worker)
}

/// The HTTP client used by tests (no proxies, short connect timeout).
pub fn client() -> reqwest::Client {
    super::http_client()
}

/// The body of a GET of `url` as text (a metrics exposition), or why it could not be read.
pub async fn fetch_text(url: &str) -> Result<String, String> {
    client()
        .get(url)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())
}

pub use super::{delta_texts, text_request, types};

/// A deployment of the mock `provider-mock` that streams `chunks` chunks (`c0 `, `c1 `, ...),
/// waiting `delay_ms` before each, with room for load: 64 running and 256 queued per worker
/// process, 1000 active executions.
pub fn chunked_mock(delay_ms: u64, chunks: usize) -> Value {
    let chunks: Vec<String> = (0..chunks).map(|i| format!("c{i} ")).collect();
    let limits = json!({"chunks": chunks, "delay_ms": delay_ms,
                        "max_concurrency": 64, "max_queue_depth": 256});
    super::deployment(
        vec![super::mock("provider-mock", limits)],
        json!({"max_active_executions": 1000}),
    )
}

/// Calls `probe` every `pause` until it returns `Ok`; once `within` has passed, panics with the
/// last `Err`.
pub async fn poll_until<T>(
    within: Duration,
    pause: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        tokio::time::sleep(pause).await;
    }
}

/// POSTs a request; returns status and JSON body.
pub async fn submit(base: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let mut req = client().post(format!("{base}/v1/executions")).json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// POSTs a request without an idempotency key, asserts it was accepted (202) and returns the
/// execution's id.
pub async fn submit_accepted(base: &str, body: &Value) -> String {
    let (status, sub) = submit(base, body, None).await;
    assert_eq!(status, 202, "{sub}");
    sub["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned()
}

/// Submits `text_request("hi")` (under `key`, when given) every 100 ms until one is accepted,
/// as after an outage (within [`PROMPT`], else a panic naming the last answer), and returns
/// that execution's terminal snapshot.
pub async fn submit_until_accepted(base: &str, key: Option<&str>) -> Value {
    let id = poll_until(PROMPT, Duration::from_millis(100), async || {
        let (status, body) = submit(base, &text_request("hi"), key).await;
        match body["execution_id"].as_str() {
            Some(id) if status == 202 => Ok(id.to_owned()),
            _ => Err(format!("did not recover: {status} {body}")),
        }
    })
    .await;
    wait_terminal(base, &id).await
}

/// `error` and each of its sources, `: `-separated (reqwest's own message names no cause: a
/// refused connection, a reset and a timeout all read "error sending request").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// GETs JSON.
pub async fn get_json(url: &str) -> (u16, Value) {
    get_json_with(url, None).await
}

/// [`get_json`] with API key `key` as the bearer token.
pub async fn get_json_as(url: &str, key: &str) -> (u16, Value) {
    get_json_with(url, Some(key)).await
}

async fn get_json_with(url: &str, key: Option<&str>) -> (u16, Value) {
    // Bounded, so a gateway that stops answering fails the test, naming the request, instead
    // of holding it until the harness kills it.
    let mut request = client().get(url).timeout(Duration::from_secs(60));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let started = Instant::now();
    let resp = request.send().await.unwrap_or_else(|e| {
        panic!(
            "GET {url}, after {:?}: {}",
            started.elapsed(),
            error_chain(&e)
        )
    });
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Parsed SSE events of a response body, read to the end (or until `limit` events).
pub async fn read_events(resp: reqwest::Response, limit: Option<usize>) -> Vec<Value> {
    let mut parser = SseParser::new();
    let mut out: Vec<SseEvent> = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = tokio::time::timeout(PROMPT, body.next())
        .await
        .expect("event stream stalled")
    {
        let Ok(chunk) = chunk else { break };
        parser.push(&chunk, &mut out).unwrap();
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
    }
    out.iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect()
}

/// The response to `GET /v1/executions/{id}/events` (no cursor), unread.
pub async fn event_stream(base: &str, id: &str) -> reqwest::Response {
    client()
        .get(format!("{base}/v1/executions/{id}/events"))
        .send()
        .await
        .unwrap()
}

/// Streams an execution's events after `after` until the stream closes.
pub async fn events(base: &str, id: &str, after: u64) -> Vec<Value> {
    let resp = client()
        .get(format!("{base}/v1/executions/{id}/events?after={after}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    read_events(resp, None).await
}

/// Polls the snapshot until it is terminal.
pub async fn wait_terminal(base: &str, id: &str) -> Value {
    wait_snapshot(base, id, "terminal", PROMPT, super::is_terminal_snapshot).await
}

/// Polls the snapshot of `id` until `pred` holds (`what` it should be, for the panic after
/// `within`); returns that snapshot.
pub async fn wait_snapshot(
    base: &str,
    id: &str,
    what: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    wait_snapshot_with(base, None, id, what, within, pred).await
}

/// Polls the snapshot of `id`, read with API key `key`, until it is terminal or `within` has
/// passed; returns that snapshot.
pub async fn wait_terminal_as(base: &str, key: &str, id: &str, within: Duration) -> Value {
    let terminal = super::is_terminal_snapshot;
    wait_snapshot_with(base, Some(key), id, "terminal", within, terminal).await
}

async fn wait_snapshot_with(
    base: &str,
    key: Option<&str>,
    id: &str,
    what: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    poll_until(within, Duration::from_millis(50), async || {
        let (status, snap) = get_json_with(&format!("{base}/v1/executions/{id}"), key).await;
        if status == 200 && pred(&snap) {
            Ok(snap)
        } else {
            Err(format!("execution {id} not {what} in time: {snap}"))
        }
    })
    .await
}

/// Asserts the log rules on a full event list: sequences 1..n contiguous, one terminal, last.
pub fn assert_log_well_formed(events: &[Value]) {
    super::assert_log_shape(events, 1);
}
