//! Hostile clients and operators against the real `gateway` binary (contract.md sections 1
//! and 8): a flood of silent sockets under a small open-file limit, a request body left
//! incomplete at shutdown, SIGTERM right after startup, a body at the size NATS refuses, and
//! credentials in `NATS_URL` at the most verbose log level.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::*;
use serde_json::{Value, json};
use testkit::{RedisServer, TempDir, free_port, nats_server_binary, unique_namespace};

fn mock_config(dir: &TempDir, limits: Value) -> PathBuf {
    let path = dir.path().join("deployment.json");
    let config = json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"]}],
        "limits": limits,
    });
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

/// A child killed on drop, with its stderr in `log`.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `command` (stdout piped) until it prints `listening on URL`; returns it and the URL.
fn start(mut command: Command, dir: &TempDir, env: &[(&str, &str)]) -> (Running, String) {
    let log = dir
        .path()
        .join(format!("gateway-{}.log", unique_namespace("")));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info");
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("spawn gateway");
    let stdout = child.stdout.take().unwrap();
    let mut running = Running { child, log };
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let Some(url) = line.trim().strip_prefix("listening on ") else {
        let _ = running.wait_exit(Duration::from_secs(5));
        panic!("no listening line: {line:?}; log:\n{}", running.log_text());
    };
    (running, url.to_owned())
}

fn gateway_command() -> Command {
    let mut command = Command::new(binary("gateway"));
    command.args(["--port", "0"]);
    command
}

fn accept_errors(log: &str) -> usize {
    log.lines().filter(|l| l.contains("accept error")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_under_a_small_open_file_limit_do_not_keep_healthz_down() {
    let dir = TempDir::new("mrt-hostile-");
    let config = mock_config(&dir, json!({ "header_timeout_ms": 2000 }));
    let mut command = Command::new("prlimit");
    command
        .args(["--nofile=512:512", "--"])
        .arg(binary("gateway"));
    command.args(["--port", "0"]);
    let (gateway, url) = start(
        command,
        &dir,
        &[("MODEL_RUNTIME_CONFIG", config.to_str().unwrap())],
    );
    let deadline = Instant::now() + PROMPT;
    while !gateway.log_text().contains("gateway started") {
        assert!(
            Instant::now() < deadline,
            "no start log: {}",
            gateway.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = gateway.log_text();
    let started = started
        .lines()
        .find(|l| l.contains("gateway started"))
        .unwrap();
    assert!(
        started.contains("max_connections") && started.contains("448"),
        "the bound is the open-file limit minus 64: {started}"
    );
    let addr = url.trim_start_matches("http://").to_owned();
    // More silent sockets than the process may open files.
    let silent: Vec<TcpStream> = (0..600)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    let start = Instant::now();
    let response = client()
        .get(format!("{url}/healthz"))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("healthz answers");
    let waited = start.elapsed();
    assert_eq!(response.status().as_u16(), 200);
    // The header timeout (2 s) frees the first wave; /healthz is served in the next.
    assert!(
        waited < Duration::from_secs(10),
        "/healthz answered after {waited:?}"
    );
    let log = gateway.log_text();
    assert!(
        accept_errors(&log) <= 2,
        "accept errors spin: {} lines",
        accept_errors(&log)
    );
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_an_incomplete_body_ends_within_the_grace_period() {
    let dir = TempDir::new("mrt-hostile-");
    let config = mock_config(&dir, json!({}));
    let (mut gateway, url) = start(
        gateway_command(),
        &dir,
        &[
            ("MODEL_RUNTIME_CONFIG", config.to_str().unwrap()),
            ("MODEL_RUNTIME_SHUTDOWN_GRACE_MS", "100"),
        ],
    );
    let addr = url.trim_start_matches("http://").to_owned();
    let mut partial = TcpStream::connect(&addr).unwrap();
    partial
        .write_all(
            b"POST /v1/executions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
              content-length: 1000\r\n\r\n{\"ability\"",
        )
        .unwrap();
    // A full round trip on another connection: the partial request has been read by then.
    let (status, _) = get_json(&format!("{url}/healthz")).await;
    assert_eq!(status, 200);
    let signalled = Instant::now();
    gateway.terminate();
    let status = gateway
        .wait_exit(Duration::from_secs(30))
        .expect("gateway exits");
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        took < Duration::from_millis(1500),
        "grace 100 ms, exit after {took:?}"
    );
    drop(partial);
}

#[test]
fn sigterm_right_after_startup_is_a_graceful_stop() {
    let dir = TempDir::new("mrt-hostile-");
    let config = mock_config(&dir, json!({}));
    for run in 0..20 {
        let (mut gateway, _) = start(
            gateway_command(),
            &dir,
            &[("MODEL_RUNTIME_CONFIG", config.to_str().unwrap())],
        );
        gateway.terminate();
        let status = gateway
            .wait_exit(Duration::from_secs(30))
            .expect("gateway exits");
        assert_eq!(
            status.code(),
            Some(0),
            "run {run}: {status:?}; log:\n{}",
            gateway.log_text()
        );
        assert!(gateway.log_text().contains("shutting down"), "run {run}");
    }
}

/// A submit body of exactly `size` bytes.
fn body_of(size: usize) -> String {
    let empty = text_request("").to_string();
    let body = text_request(&"x".repeat(size - empty.len())).to_string();
    assert_eq!(body.len(), size);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_nats_mode_a_body_nats_cannot_carry_is_413_not_503() {
    let cluster = Cluster::start(&json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"]}],
    }));
    let gateway = cluster.gateway();
    let url = &gateway.url;
    let post = |body: String| async move {
        let response = client()
            .post(format!("{url}/v1/executions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (
            status,
            response.json::<Value>().await.unwrap_or(Value::Null),
        )
    };
    // The configured limit (1 MiB) equals NATS's default max_payload: at the limit the job
    // could not be published, so the effective limit is smaller and this is a 413.
    let (status, body) = post(body_of(1024 * 1024)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(body["error"]["retryable"], false);
    assert!(
        gateway.process.log_text().contains("clamped"),
        "the clamp is logged"
    );
    // Just under the effective limit the submission is published.
    let (status, body) = post(body_of(1024 * 1024 - 16 * 1024)).await;
    assert_eq!(status, 202, "{body}");
}

/// A nats-server with JetStream that requires `user`/`password`.
fn nats_with_password(dir: &Path, user: &str, password: &str) -> (Running, u16) {
    let port = free_port();
    let log = dir.join("nats.log");
    let child = Command::new(nats_server_binary())
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir.join("nats-store"))
        .args(["--user", user, "--pass", password])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let running = Running { child, log };
    let deadline = Instant::now() + PROMPT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (running, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_line_holds_the_nats_password_even_at_trace() {
    const PASSWORD: &str = "secretpw-5b1e";
    let dir = TempDir::new("mrt-hostile-");
    let (_nats, port) = nats_with_password(dir.path(), "mrtuser", PASSWORD);
    let redis = RedisServer::start();
    let config = mock_config(&dir, json!({}));
    let nats_url = format!("nats://mrtuser:{PASSWORD}@127.0.0.1:{port}");
    let (mut gateway, url) = start(
        gateway_command(),
        &dir,
        &[
            ("MODEL_RUNTIME_BACKEND", "nats"),
            ("NATS_URL", &nats_url),
            ("REDIS_URL", &redis.url()),
            ("MODEL_RUNTIME_NAMESPACE", &unique_namespace("h")),
            ("MODEL_RUNTIME_CONFIG", config.to_str().unwrap()),
            ("RUST_LOG", "trace"),
        ],
    );
    // Authenticated: the backends are ready and a submission is published.
    let (status, body) = get_json(&format!("{url}/readyz")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = submit(&url, &text_request("hi"), Some("key-1")).await;
    assert_eq!(status, 202, "{body}");
    gateway.terminate();
    gateway.wait_exit(PROMPT).expect("gateway exits");
    let log = gateway.log_text();
    assert!(log.lines().count() > 20, "trace logging is on");
    let leaks: Vec<&str> = log.lines().filter(|l| l.contains(PASSWORD)).collect();
    assert!(
        leaks.is_empty(),
        "{} log lines hold the password, e.g. {}",
        leaks.len(),
        leaks[0]
    );
}

#[test]
fn sigterm_while_waiting_for_nats_stops_at_once() {
    let dir = TempDir::new("mrt-hostile-");
    let config = mock_config(&dir, json!({}));
    let log = dir.path().join("gateway.log");
    let child = Command::new(binary("gateway"))
        .args(["--port", "0", "--backend", "nats"])
        .arg("--config")
        .arg(&config)
        // Nothing listens there: startup keeps retrying for up to 15 s.
        .args(["--nats-url", &format!("nats://127.0.0.1:{}", free_port())])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut gateway = Running { child, log };
    let deadline = Instant::now() + PROMPT;
    while !gateway.log_text().contains("connecting to server") {
        assert!(Instant::now() < deadline, "{}", gateway.log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
    let signalled = Instant::now();
    gateway.terminate();
    let status = gateway.wait_exit(PROMPT).expect("gateway exits");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "exit after {:?}",
        signalled.elapsed()
    );
}
