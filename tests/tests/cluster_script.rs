//! `scripts/cluster.sh` end to end: the loopback cluster (three NATS nodes, Redis, two gateways
//! behind HAProxy, workers) serves a streamed execution through HAProxy, the client resumes with
//! `Last-Event-ID` through HAProxy after the gateway serving its stream is killed with SIGKILL,
//! and `down` leaves no process behind. Needs haproxy and curl (`scripts/test.sh` installs them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use e2e_tests::*;
use futures_util::StreamExt;
use protocol::sse::{SseEvent, SseParser};
use serde_json::{Value, json};
use testkit::{TempDir, unique_namespace};

/// Offsets of the ports `cluster.sh` derives from `MRT_CLUSTER_PORT_BASE` (see the script),
/// plus 60 for HAProxy itself.
const PORT_OFFSETS: &[u16] = &[1, 2, 3, 11, 12, 13, 21, 22, 23, 30, 41, 42, 51, 52, 60];
const CHUNKS: usize = 40;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh")
}

/// A port base whose derived ports are all free now, away from the ephemeral range.
fn free_port_base() -> u16 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id();
    let mut base = 10_000 + (seed % 200) as u16 * 100;
    for _ in 0..200 {
        if PORT_OFFSETS
            .iter()
            .all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        {
            return base;
        }
        base = if base >= 29_900 { 10_000 } else { base + 100 };
    }
    panic!("no free port range for the cluster");
}

/// One cluster started by the script, stopped by it on drop (whatever the test did).
struct ScriptCluster {
    state: TempDir,
    base: u16,
    env: Vec<(String, String)>,
    down: bool,
}

impl ScriptCluster {
    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new("bash");
        command.arg(script()).args(args);
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command.output().expect("run scripts/cluster.sh")
    }

    fn dir(&self) -> &Path {
        self.state.path()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.base + 60)
    }

    fn gateway_url(&self, n: u16) -> String {
        format!("http://127.0.0.1:{}", self.base + 40 + n)
    }

    fn pid(&self, name: &str) -> u32 {
        let text = std::fs::read_to_string(self.dir().join(format!("run/{name}.pid"))).unwrap();
        text.trim().parse().unwrap()
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir().join("log")) {
            for entry in entries.flatten() {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                out.push_str(&format!("--- {}\n", entry.path().display()));
                for line in tail.iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("cluster logs:\n{}", self.logs());
        }
        if !self.down {
            let _ = self.run(&["down"]);
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Pids of processes whose command line names `dir` (everything the script started does).
fn processes_of(dir: &Path) -> Vec<u32> {
    let needle = format!("{}/", dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(&needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Value of the gateway's `mrt_sse_streams_active` gauge.
async fn streams_active(gateway: &str) -> Option<i64> {
    let text = client()
        .get(format!("{gateway}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("mrt_sse_streams_active "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as i64)
}

fn is_terminal(event: &Value) -> bool {
    matches!(
        event["type"].as_str(),
        Some("execution.completed" | "execution.failed")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_script_serves_through_haproxy_survives_a_killed_gateway_and_stops_cleanly() {
    let state = TempDir::new("mrt-cluster-");
    let chunks: Vec<String> = (0..CHUNKS).map(|i| format!("c{i} ")).collect();
    // A stream of about 4 s: long enough to kill its gateway in the middle.
    let deployment = json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"], "chunks": chunks, "delay_ms": 100,
                       "max_concurrency": 64, "max_queue_depth": 256}],
        "max_active_executions": 1000
    });
    let config = state.path().join("deployment.json");
    std::fs::write(&config, serde_json::to_vec(&deployment).unwrap()).unwrap();
    let bin_dir = binary("gateway").parent().unwrap().to_path_buf();
    assert!(binary("worker").exists());
    let base = free_port_base();
    let env = vec![
        ("MRT_CLUSTER_DIR".into(), state.path().display().to_string()),
        ("MRT_CLUSTER_PORT_BASE".into(), base.to_string()),
        ("MRT_CLUSTER_PORT".into(), (base + 60).to_string()),
        ("MRT_CLUSTER_CONFIG".into(), config.display().to_string()),
        ("MRT_CLUSTER_NAMESPACE".into(), unique_namespace("c")),
        ("MRT_CLUSTER_BIN_DIR".into(), bin_dir.display().to_string()),
        (
            "MRT_NATS_SERVER".into(),
            testkit::nats_server_binary().display().to_string(),
        ),
    ];
    let mut cluster = ScriptCluster {
        state,
        base,
        env,
        down: false,
    };

    let up = cluster.run(&["up", "--workers", "2"]);
    assert!(up.status.success(), "cluster.sh up failed: {}", text(&up));
    let status = cluster.run(&["status"]);
    assert!(status.status.success(), "{}", text(&status));
    let listing = String::from_utf8_lossy(&status.stdout).to_string();
    for name in ["nats-3", "redis", "gateway-2", "worker-2", "haproxy"] {
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with(name) && l.contains("running")),
            "{name} not running: {listing}"
        );
    }

    // Submit and stream in one call, through HAProxy.
    let resp = client()
        .post(format!("{}/v1/executions", cluster.url()))
        .header("accept", "text/event-stream")
        .json(&text_request("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.bytes_stream();
    let mut parser = SseParser::new();
    let mut frames: Vec<SseEvent> = Vec::new();
    while frames.len() < 3 {
        let chunk = tokio::time::timeout(PROMPT, body.next())
            .await
            .expect("stream stalled")
            .expect("stream ended early")
            .unwrap();
        parser.push(&chunk, &mut frames).unwrap();
    }

    // Find the gateway serving this stream (the only one with an open stream) and kill it.
    let deadline = Instant::now() + PROMPT;
    let serving = loop {
        let counts = [
            streams_active(&cluster.gateway_url(1)).await,
            streams_active(&cluster.gateway_url(2)).await,
        ];
        match counts {
            [Some(1), Some(0)] => break 1,
            [Some(0), Some(1)] => break 2,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no gateway reports the stream: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let gateway = format!("gateway-{serving}");
    let killed = Command::new("kill")
        .args(["-KILL", &cluster.pid(&gateway).to_string()])
        .status()
        .unwrap();
    assert!(killed.success());

    // The first stream is cut before its terminal event; keep what arrived before the cut.
    while let Some(Ok(chunk)) = tokio::time::timeout(PROMPT, body.next())
        .await
        .expect("cut stream stalled")
    {
        parser.push(&chunk, &mut frames).unwrap();
    }
    let head: Vec<Value> = frames
        .iter()
        .map(|f| serde_json::from_str(&f.data).unwrap())
        .collect();
    assert!(
        !head.iter().any(is_terminal),
        "the stream ended before its gateway was killed: {head:?}"
    );
    let id = head[0]["execution_id"].as_str().unwrap().to_owned();
    let last = head.last().unwrap()["sequence"].as_u64().unwrap();

    // Resume through HAProxy, which now routes to the surviving gateway.
    let resp = client()
        .get(format!("{}/v1/executions/{id}/events", cluster.url()))
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let tail = read_events(resp, None).await;
    let mut all = head;
    all.extend(tail);
    assert_log_well_formed(&all);
    assert_eq!(all.last().unwrap()["type"], "execution.completed");
    let deltas = all.iter().filter(|e| e["type"] == "output.delta").count();
    assert_eq!(deltas, CHUNKS, "{all:?}");

    // `status` reports the killed gateway and a partly running cluster (exit 1).
    let status = cluster.run(&["status"]);
    assert_eq!(status.status.code(), Some(1), "{}", text(&status));
    let listing = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(&gateway) && l.contains("stopped")),
        "{listing}"
    );

    // `down` stops everything the script started.
    let down = cluster.run(&["down"]);
    cluster.down = true;
    assert!(
        down.status.success(),
        "cluster.sh down failed: {}",
        text(&down)
    );
    let left = processes_of(cluster.dir());
    assert!(left.is_empty(), "processes left after down: {left:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", base + 60)).is_err(),
        "HAProxy still listening after down"
    );
}
