//! Webhooks end to end (contract.md section 11): the real gateway and worker binaries deliver
//! to a real receiver on loopback (`webhooks/receiver.py`) that verifies every request with the
//! published Standard Webhooks library (`standardwebhooks`, PyPI; `scripts/test.sh` installs
//! it) and also checks that a tampered body fails verification.
//!
//! Deliveries are at least once: where a test counts deliveries it counts distinct
//! `webhook-id`s and reports the repeats.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use e2e_tests::*;
use protocol::fingerprint::sha256_hex;
use serde_json::{Value, json};
use testkit::{KillOnDrop, TempDir, free_port};

/// Signing secrets (`whsec_` + base64 of 32 bytes). Endpoints sign with both during a
/// "rotation"; the receiver knows only [`NEW_SECRET`].
const OLD_SECRET: &str = "whsec_ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoM=";
const NEW_SECRET: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// Long enough for anything a test waits for on a busy machine, including a lease (30 s) that
/// has to run out after a kill -9.
const LONG: Duration = Duration::from_secs(150);

fn receiver_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks/receiver.py")
}

/// The Python receiver on `port`, logging to `log`; killed on drop.
struct Receiver {
    _process: KillOnDrop,
}

/// A fresh directory for a test's files, and a receiver on a free port recording what it is
/// sent to `received.jsonl` there: the directory, that file, the port and the receiver.
fn receiving() -> (TempDir, PathBuf, u16, Receiver) {
    let logs = TempDir::new("mrt-webhooks-");
    let log = logs.path().join("received.jsonl");
    let port = free_port();
    let receiver = Receiver::start(port, &log);
    (logs, log, port, receiver)
}

impl Receiver {
    fn start(port: u16, log: &Path) -> Self {
        let mut child = Command::new("python3")
            .arg(receiver_script())
            .arg(port.to_string())
            .arg(log)
            .arg(NEW_SECRET)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the receiver");
        let stdout = child.stdout.take().unwrap();
        let process = KillOnDrop(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert!(
            line.starts_with("receiver listening"),
            "the receiver did not start (is standardwebhooks installed? scripts/test.sh \
             installs it): {line:?}"
        );
        Self { _process: process }
    }
}

/// Every request the receiver logged so far.
fn records(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Requests logged for paths starting with `prefix`, by `webhook-id`.
fn by_id(log: &Path, prefix: &str) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for record in records(log) {
        if record["path"].as_str().unwrap().starts_with(prefix) {
            out.entry(record["webhook_id"].as_str().unwrap().to_owned())
                .or_default()
                .push(record);
        }
    }
    out
}

/// Checks what every delivery must be: signed so the library verifies it, a tampered copy
/// refused, JSON, and nothing of the execution's input or output.
fn assert_well_signed(records: &[Value]) {
    for r in records {
        assert_eq!(r["verified"], true, "signature not verified: {r}");
        assert_eq!(
            r["tampered_rejected"], true,
            "a tampered body verified: {r}"
        );
        assert_eq!(r["content_type"], "application/json", "{r}");
        let text = r["body"].to_string();
        assert!(!text.contains("hello from mock"), "output leaked: {r}");
        assert!(!text.contains("\"input\""), "input leaked: {r}");
    }
}

fn endpoint(id: &str, url: &str, events: &[&str]) -> Value {
    json!({"id": id, "url": url, "events": events,
           "secret_env": ["MRT_TEST_OLD_SECRET", "MRT_TEST_NEW_SECRET"]})
}

fn mock(delay_ms: u64) -> Value {
    json!({"type": "mock", "id": "provider-mock", "model": "model-alpha",
           "abilities": ["text-generation"], "chunks": ["a", "b"], "delay_ms": delay_ms,
           "max_concurrency": 64, "max_queue_depth": 1000})
}

fn with_secrets(cluster: &mut Cluster) {
    cluster
        .extra_env
        .push(("MRT_TEST_OLD_SECRET".into(), OLD_SECRET.into()));
    cluster
        .extra_env
        .push(("MRT_TEST_NEW_SECRET".into(), NEW_SECRET.into()));
}

/// Submits `text_request` as the bearer of `key` (if any); returns the execution id.
/// The `gateway` binary in embedded mode (`memory` backend) with deployment `config` and both
/// test secrets, its files under `logs`; returns it and its base URL.
fn embedded_gateway(logs: &TempDir, config: &Value) -> (Process, String) {
    let config_path = logs.path().join("deployment.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let env: Vec<(String, String)> = vec![
        ("MODEL_RUNTIME_BACKEND".into(), "memory".into()),
        (
            "MODEL_RUNTIME_CONFIG".into(),
            config_path.display().to_string(),
        ),
        ("MRT_TEST_OLD_SECRET".into(), OLD_SECRET.into()),
        ("MRT_TEST_NEW_SECRET".into(), NEW_SECRET.into()),
    ];
    let gateway = spawn_gateway(&env, logs);
    (gateway.process, gateway.url)
}

async fn submit_as(base: &str, key: Option<&str>) -> String {
    let mut request = client()
        .post(format!("{base}/v1/executions"))
        .json(&text_request("hi"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 202, "{body}");
    body["execution_id"].as_str().unwrap().to_owned()
}

/// Waits until `probe` holds, within `within`; panics with its last complaint.
async fn eventually(within: Duration, mut probe: impl FnMut() -> Result<(), String>) {
    poll_until(within, Duration::from_millis(200), async || probe()).await;
}

/// Waits until endpoint `prefix` has received deliveries of at least `n` executions.
async fn wait_received(log: &Path, prefix: &str, n: usize) {
    eventually(LONG, || {
        let received = by_id(log, prefix).len();
        (received >= n)
            .then_some(())
            .ok_or(format!("{prefix} received {received} of {n}"))
    })
    .await;
}

/// Waits until endpoint `prefix` has answered 200 to a delivery of at least `n` executions.
async fn wait_answered(log: &Path, prefix: &str, n: usize) {
    eventually(LONG, || {
        let answered = by_id(log, prefix)
            .values()
            .filter(|d| d.iter().any(|r| r["status"] == 200))
            .count();
        (answered >= n)
            .then_some(())
            .ok_or(format!("{prefix} answered {answered} of {n}"))
    })
    .await;
}

async fn get_text(url: &str) -> (u16, String) {
    let response = client().get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_terminal_event_reaches_its_tenants_endpoint_signed_and_only_that_one() {
    const ACME_EXECUTIONS: usize = 200;
    const BETA_EXECUTIONS: usize = 20;
    let (_logs, log, port, _receiver) = receiving();
    let base = format!("http://127.0.0.1:{port}");
    let (acme_key, beta_key) = (
        "mrt_test_acme_key_0123456789",
        "mrt_test_beta_key_0123456789",
    );
    let config = json!({
        "providers": [mock(0)],
        "max_active_executions": 1000,
        "auth": {
            "tenants": {
                "acme": {"webhooks": [endpoint("main", &format!("{base}/ok/acme"),
                                               &["execution.completed", "execution.failed"])]},
                "beta": {"webhooks": [endpoint("main", &format!("{base}/ok/beta"),
                                               &["execution.completed"])]}
            },
            "keys": [
                {"id": "acme", "tenant": "acme", "sha256": sha256_hex(acme_key.as_bytes())},
                {"id": "beta", "tenant": "beta", "sha256": sha256_hex(beta_key.as_bytes())}
            ]
        }
    });
    let mut cluster = Cluster::start(&config);
    with_secrets(&mut cluster);
    // Logs spread over three events streams: the feed reads each.
    cluster
        .extra_env
        .push(("MODEL_RUNTIME_EVENT_SHARDS".into(), "3".into()));
    let gateway = cluster.gateway();
    let (_worker, admin) = cluster.worker_with_admin(&[]);
    let mut acme = BTreeSet::new();
    for _ in 0..ACME_EXECUTIONS {
        acme.insert(submit_as(&gateway.url, Some(acme_key)).await);
    }
    let mut beta = BTreeSet::new();
    for _ in 0..BETA_EXECUTIONS {
        beta.insert(submit_as(&gateway.url, Some(beta_key)).await);
    }
    eventually(LONG, || {
        let (a, b) = (by_id(&log, "/ok/acme").len(), by_id(&log, "/ok/beta").len());
        (a >= ACME_EXECUTIONS && b >= BETA_EXECUTIONS)
            .then_some(())
            .ok_or(format!("delivered so far: acme {a}, beta {b}"))
    })
    .await;
    for (prefix, owned, other) in [("/ok/acme", &acme, &beta), ("/ok/beta", &beta, &acme)] {
        let received = by_id(&log, prefix);
        let mut executions = BTreeSet::new();
        let mut repeats = 0;
        for (webhook_id, deliveries) in &received {
            assert_well_signed(deliveries);
            repeats += deliveries.len() - 1;
            let body = &deliveries[0]["body"];
            assert_eq!(body["type"], "execution.completed", "{body}");
            let data = &body["data"];
            let id = data["execution_id"].as_str().unwrap().to_owned();
            assert!(
                !other.contains(&id),
                "{prefix} heard of another tenant's execution {id}"
            );
            assert!(
                owned.contains(&id),
                "{prefix} heard of an unknown execution {id}"
            );
            assert_eq!(data["status"], "succeeded");
            assert_eq!(data["target"]["provider"], "provider-mock");
            let sequence = data["sequence"].as_u64().unwrap();
            assert_eq!(webhook_id, &format!("{id}_{sequence}"));
            assert!(body["timestamp"].is_string());
            // Same body on every attempt.
            assert!(deliveries.iter().all(|d| d["body"] == *body));
            executions.insert(id);
        }
        assert_eq!(
            &executions, owned,
            "{prefix}: every execution exactly once by id"
        );
        eprintln!(
            "{prefix}: {} deliveries, {repeats} repeated (at least once)",
            received.len()
        );
    }
    // Every shard's feed consumer read its stream.
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let shards = runtime::nats::EventShards::new(cluster.namespace.clone(), 3).unwrap();
    for stream in shards.streams() {
        let info = js
            .get_stream(&stream)
            .await
            .unwrap()
            .consumer_info(format!("{}_webhook_feed", cluster.namespace))
            .await
            .unwrap();
        assert!(info.delivered.stream_sequence > 0, "{stream}: {info:?}");
    }
    let (_, text) = get_text(&format!("{admin}/metrics")).await;
    let delivered = metric(
        &text,
        "mrt_webhook_deliveries_total",
        &["tenant=\"acme\"", "outcome=\"delivered\""],
    );
    assert!(delivered >= ACME_EXECUTIONS as f64, "{delivered}\n{text}");
    assert!(
        text.contains("mrt_webhook_delivery_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains("mrt_webhook_pending"), "{text}");
    for outcome in ["retried", "abandoned", "gone"] {
        assert!(
            text.contains(&format!("outcome=\"{outcome}\"")),
            "{outcome} exported from startup"
        );
    }
}

/// A TCP listener that accepts connections and never answers; counts connections accepted
/// and connections the client closed.
struct Blackhole {
    port: u16,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Blackhole {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (a, c) = (Arc::clone(&accepted), Arc::clone(&closed));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                a.fetch_add(1, Ordering::SeqCst);
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    // Read the request and beyond, never answer; end of input means the
                    // client gave up on the attempt.
                    let _ = std::io::copy(&mut stream, &mut std::io::sink());
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            port,
            accepted,
            closed,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_with_the_same_id_and_a_dead_endpoint_delays_no_other() {
    // More than a process's attempt slots per endpoint (16): were slots shared between
    // endpoints, the dead endpoint's hanging attempts would take them all.
    const EXECUTIONS: usize = 20;
    let (_logs, log, port, _receiver) = receiving();
    let base = format!("http://127.0.0.1:{port}");
    let dead = Blackhole::start();
    // No auth: top-level endpoints belong to tenant `default`.
    let config = json!({
        "providers": [mock(0)],
        "webhook_retry_schedule_ms": [100, 200, 60000],
        "webhooks": [
            endpoint("dead", &format!("http://127.0.0.1:{}/dead", dead.port),
                     &["execution.completed"]),
            endpoint("flaky", &format!("{base}/flaky"), &["execution.completed"]),
            endpoint("healthy", &format!("{base}/ok"), &["execution.completed"]),
        ]
    });
    let mut cluster = Cluster::start(&config);
    with_secrets(&mut cluster);
    let gateway = cluster.gateway();
    let _worker = cluster.worker();
    let mut ids = BTreeSet::new();
    for _ in 0..EXECUTIONS {
        ids.insert(submit_as(&gateway.url, None).await);
    }
    // The healthy endpoint gets everything while no attempt at the dead one has even ended
    // (each waits 15 s for an answer): it never waited behind them.
    wait_received(&log, "/ok", EXECUTIONS).await;
    let (accepted, closed) = (
        dead.accepted.load(Ordering::SeqCst),
        dead.closed.load(Ordering::SeqCst),
    );
    assert!(accepted > 0, "the dead endpoint was tried");
    assert_eq!(
        closed, 0,
        "the healthy endpoint was complete only after an attempt at the dead one timed out"
    );
    let healthy = by_id(&log, "/ok");
    for deliveries in healthy.values() {
        assert_well_signed(deliveries);
    }
    // The flaky endpoint answers 500 twice per delivery, then 200: three attempts each, one
    // webhook-id, each attempt signed afresh.
    wait_answered(&log, "/flaky", EXECUTIONS).await;
    let flaky = by_id(&log, "/flaky");
    assert_eq!(flaky.len(), EXECUTIONS);
    for (webhook_id, attempts) in &flaky {
        assert_well_signed(attempts);
        let statuses: Vec<u64> = attempts
            .iter()
            .map(|r| r["status"].as_u64().unwrap())
            .collect();
        assert_eq!(statuses, [500, 500, 200], "{webhook_id}");
        let execution = webhook_id.rsplit_once('_').unwrap().0;
        assert!(ids.contains(execution), "{webhook_id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_then_back_and_a_worker_killed_mid_delivery_lose_nothing() {
    const EXECUTIONS: usize = 20;
    let logs = TempDir::new("mrt-webhooks-");
    let log = logs.path().join("received.jsonl");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let hang_log = logs.path().join("hang.jsonl");
    let hang_port = free_port();
    let hang_base = format!("http://127.0.0.1:{hang_port}");
    let _hanging = Receiver::start(hang_port, &hang_log);
    let config = json!({
        "providers": [mock(100)],
        // About a minute of retries, two seconds apart: the receiver is back well before.
        "webhook_retry_schedule_ms": vec![2000; 30],
        "webhooks": [
            endpoint("main", &format!("{base}/ok"),
                     &["execution.accepted", "execution.completed", "execution.failed"]),
            // Holds each first attempt for longer than the sender waits.
            endpoint("slow", &format!("{hang_base}/hang"), &["execution.accepted"]),
        ]
    });
    let mut cluster = Cluster::start(&config);
    with_secrets(&mut cluster);
    let gateway = cluster.gateway();
    let (worker, admin) = cluster.worker_with_admin(&[]);
    let mut ids = BTreeSet::new();
    for _ in 0..EXECUTIONS {
        ids.insert(submit_as(&gateway.url, None).await);
    }
    // The receiver is down: attempts fail and are retried.
    poll_until(LONG, Duration::from_millis(200), async || {
        let (_, text) = get_text(&format!("{admin}/metrics")).await;
        let retried = metric(
            &text,
            "mrt_webhook_deliveries_total",
            &["endpoint=\"main\"", "outcome=\"retried\""],
        );
        (retried >= EXECUTIONS as f64)
            .then_some(())
            .ok_or(format!("retried {retried}"))
    })
    .await;
    // ...and attempts at the slow endpoint are in flight.
    eventually(LONG, || {
        let hanging = by_id(&hang_log, "/hang").len();
        (hanging > 0)
            .then_some(())
            .ok_or("no attempt in flight".into())
    })
    .await;
    // The delivering process dies with deliveries owed, some in flight.
    worker.signal("KILL");
    drop(worker);
    // More executions complete while no worker delivers.
    let _worker = cluster.worker();
    for _ in 0..EXECUTIONS {
        ids.insert(submit_as(&gateway.url, None).await);
    }
    // The receiver comes back on the same address and gets everything.
    let _receiver = Receiver::start(port, &log);
    let expected = 2 * ids.len();
    wait_received(&log, "/ok", expected).await;
    let received = by_id(&log, "/ok");
    let mut heard: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    let mut repeats = 0;
    for deliveries in received.values() {
        assert_well_signed(deliveries);
        repeats += deliveries.len() - 1;
        let body = &deliveries[0]["body"];
        heard
            .entry(body["data"]["execution_id"].as_str().unwrap().to_owned())
            .or_default()
            .insert(
                body["type"].as_str().unwrap().to_owned(),
                body["data"].clone(),
            );
    }
    assert_eq!(heard.keys().cloned().collect::<BTreeSet<_>>(), ids);
    for (id, by_type) in &heard {
        // Accepted, then the terminal event the log holds: completed, or failed for the
        // executions the killed worker was running (their outcome is unknown, invariant 4).
        let (_, snapshot) = get_json(&format!("{}/v1/executions/{id}", gateway.url)).await;
        let terminal = if snapshot["status"] == "succeeded" {
            "execution.completed"
        } else {
            "execution.failed"
        };
        assert_eq!(
            by_type.keys().map(String::as_str).collect::<Vec<_>>(),
            ["execution.accepted", terminal],
            "{id}: {snapshot}"
        );
        assert_eq!(by_type["execution.accepted"]["sequence"], 1);
        assert_eq!(
            by_type[terminal]["sequence"], snapshot["last_sequence"],
            "{id}"
        );
        assert_eq!(by_type[terminal]["status"], snapshot["status"], "{id}");
    }
    eprintln!(
        "{} deliveries, {repeats} repeated (at least once)",
        received.len()
    );
    // Every attempt the killed worker had in flight was made again, by the other worker,
    // and answered.
    wait_answered(&hang_log, "/hang", ids.len()).await;
    let slow = by_id(&hang_log, "/hang");
    let executions: BTreeSet<String> = slow
        .keys()
        .map(|id| id.rsplit_once('_').unwrap().0.to_owned())
        .collect();
    assert_eq!(executions, ids);
    for attempts in slow.values() {
        assert_well_signed(attempts);
        assert_eq!(attempts[0]["status"], "hang");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_delivers_signed_outcomes() {
    let (logs, log, port, _receiver) = receiving();
    let config = json!({
        "providers": [mock(0)],
        "webhook_retry_schedule_ms": [100, 100],
        "webhooks": [endpoint("main", &format!("http://127.0.0.1:{port}/flaky"),
                              &["execution.completed", "execution.failed"])]
    });
    let (_gateway, url) = embedded_gateway(&logs, &config);
    let mut ids = BTreeSet::new();
    for _ in 0..5 {
        ids.insert(submit_as(&url, None).await);
    }
    wait_answered(&log, "/flaky", ids.len()).await;
    for (webhook_id, attempts) in by_id(&log, "/flaky") {
        assert_well_signed(&attempts);
        assert_eq!(attempts.len(), 3, "{webhook_id}: 500, 500, then 200");
        assert!(ids.contains(webhook_id.rsplit_once('_').unwrap().0));
    }
}

#[test]
fn a_missing_secret_stops_the_start_naming_the_field_never_a_value() {
    let logs = TempDir::new("mrt-webhooks-");
    let config_path = logs.path().join("deployment.json");
    let config = json!({
        "providers": [mock(0)],
        "webhooks": [endpoint("main", "http://127.0.0.1:9/x", &["execution.completed"])]
    });
    std::fs::write(&config_path, config.to_string()).unwrap();
    for binary_name in ["gateway", "worker"] {
        let backend = if binary_name == "gateway" {
            "memory"
        } else {
            "nats"
        };
        let output = Command::new(binary(binary_name))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("MODEL_RUNTIME_BACKEND", backend)
            .env("MODEL_RUNTIME_CONFIG", &config_path)
            .env("MRT_TEST_OLD_SECRET", OLD_SECRET)
            .env("MODEL_RUNTIME_PORT", "0")
            .env("MODEL_RUNTIME_ADMIN_PORT", "0")
            // Nothing listens here: the start must fail before connecting.
            .env("NATS_URL", "nats://127.0.0.1:9")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{binary_name}: {stderr}");
        assert!(
            stderr.contains(
                "webhooks[0].secret_env[1] names an environment variable that is not set"
            ),
            "{binary_name}: {stderr}"
        );
        assert!(!stderr.contains(OLD_SECRET), "{binary_name}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_stops_an_endpoint_redirects_fail_and_an_exhausted_schedule_abandons_with_a_log_line()
{
    const EXECUTIONS: usize = 3;
    let (logs, log, port, _receiver) = receiving();
    let config = json!({
        "providers": [mock(0)],
        // No retry: the first failure abandons the delivery.
        "webhook_retry_schedule_ms": [],
        "webhooks": [
            endpoint("gone", &format!("http://127.0.0.1:{port}/gone"), &["execution.completed"]),
            endpoint("failing", &format!("http://127.0.0.1:{port}/flaky"),
                     &["execution.completed"]),
            endpoint("redirecting", &format!("http://127.0.0.1:{port}/redirect"),
                     &["execution.completed"]),
        ]
    });
    let (gateway, url) = embedded_gateway(&logs, &config);
    let mut ids = Vec::new();
    let metrics_url = format!("{url}/metrics");
    for _ in 0..EXECUTIONS {
        let id = submit_as(&url, None).await;
        wait_terminal(&url, &id).await;
        eventually(LONG, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains(&id)
                .then_some(())
                .ok_or(format!("{id} not delivered yet"))
        })
        .await;
        if ids.is_empty() {
            // One at a time: the first 410 is counted (so the endpoint is marked gone) before
            // the next execution's delivery.
            poll_until(LONG, Duration::from_millis(100), async || {
                let (_, text) = get_text(&metrics_url).await;
                let gone = metric(
                    &text,
                    "mrt_webhook_deliveries_total",
                    &["endpoint=\"gone\"", "outcome=\"gone\""],
                );
                (gone >= 1.0).then_some(()).ok_or(format!("gone {gone}"))
            })
            .await;
        }
        ids.push(id);
    }
    poll_until(LONG, Duration::from_millis(200), async || {
        let (_, text) = get_text(&metrics_url).await;
        let gone = metric(
            &text,
            "mrt_webhook_deliveries_total",
            &["endpoint=\"gone\"", "outcome=\"gone\""],
        );
        let abandoned = metric(
            &text,
            "mrt_webhook_deliveries_total",
            &["endpoint=\"failing\"", "outcome=\"abandoned\""],
        );
        // The 410 counts; later events are not even queued for a gone endpoint.
        let redirected = metric(
            &text,
            "mrt_webhook_deliveries_total",
            &["endpoint=\"redirecting\"", "outcome=\"abandoned\""],
        );
        (gone >= 1.0 && abandoned >= EXECUTIONS as f64 && redirected >= EXECUTIONS as f64)
            .then_some(())
            .ok_or(format!(
                "gone {gone}, abandoned {abandoned}, redirects abandoned {redirected}"
            ))
    })
    .await;
    // The endpoint that answered 410 was asked once, never again.
    assert_eq!(
        records(&log)
            .iter()
            .filter(|r| r["path"].as_str().unwrap().starts_with("/gone"))
            .count(),
        1
    );
    // Each failing delivery was tried once, then abandoned with a line naming the execution.
    let failing = by_id(&log, "/flaky");
    assert_eq!(failing.len(), EXECUTIONS);
    assert!(failing.values().all(|attempts| attempts.len() == 1));
    // A redirect is a failure, never followed.
    let redirecting = by_id(&log, "/redirect");
    assert_eq!(redirecting.len(), EXECUTIONS);
    assert!(
        redirecting
            .values()
            .all(|a| a.len() == 1 && a[0]["status"] == 307)
    );
    assert!(by_id(&log, "/ok").is_empty(), "a redirect was followed");
    let text = gateway.log_text();
    for id in &ids {
        assert!(
            text.lines()
                .any(|l| l.contains("webhook delivery abandoned") && l.contains(id.as_str())),
            "no abandonment line for {id}:\n{text}"
        );
    }
    assert!(!text.contains(NEW_SECRET) && !text.contains(OLD_SECRET));
}

/// Submits until one is accepted (a leader election answers 503 for a while); returns the id.
async fn submit_through_elections(base: &str) -> String {
    poll_until(LONG, Duration::from_millis(200), async || {
        let response = client()
            .post(format!("{base}/v1/executions"))
            .json(&text_request("hi"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match body["execution_id"].as_str() {
            Some(id) if status == 202 => Ok(id.to_owned()),
            _ => Err(format!("not accepted: {status} {body}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_death_of_a_nats_node_loses_no_delivery_and_two_workers_share_them() {
    const EXECUTIONS: usize = 20;
    let (logs, log, port, _receiver) = receiving();
    let mut nats = testkit::NatsCluster::start(3);
    let redis = testkit::RedisServer::start();
    let config_path = logs.path().join("deployment.json");
    let config = json!({
        "providers": [mock(50)],
        "max_active_executions": 1000,
        "webhook_retry_schedule_ms": vec![1000; 30],
        "webhooks": [endpoint("main", &format!("http://127.0.0.1:{port}/ok"),
                              &["execution.completed", "execution.failed"])]
    });
    std::fs::write(&config_path, config.to_string()).unwrap();
    let namespace = testkit::unique_namespace("w");
    // Each process is given one node and learns the others from the cluster's gossip.
    let env = |node: usize| -> Vec<(String, String)> {
        let mut env = nats_env(nats.node_url(node), &redis, &namespace, &config_path);
        env.extend([
            ("MODEL_RUNTIME_REPLICAS".into(), "3".into()),
            ("MODEL_RUNTIME_ACK_WAIT_MS".into(), "5000".into()),
            ("MRT_TEST_OLD_SECRET".into(), OLD_SECRET.into()),
            ("MRT_TEST_NEW_SECRET".into(), NEW_SECRET.into()),
        ]);
        env
    };
    let Gateway {
        process: _gateway,
        url,
    } = spawn_gateway(&env(1), &logs);
    let mut admins = Vec::new();
    let mut workers = Vec::new();
    for node in [0, 2] {
        let (worker, line) = spawn("worker", &[], &env(node), "admin listening on ", &logs);
        admins.push(
            line.trim_start_matches("admin listening on ")
                .trim()
                .to_owned(),
        );
        workers.push(worker);
    }
    let mut ids = BTreeSet::new();
    for _ in 0..EXECUTIONS {
        ids.insert(submit_through_elections(&url).await);
    }
    // Kill the node leading the deliveries stream while deliveries flow.
    let servers: Vec<async_nats::ServerAddr> =
        nats.url().split(',').map(|u| u.parse().unwrap()).collect();
    let js = async_nats::jetstream::new(async_nats::connect(servers).await.unwrap());
    let stream = format!("{}_WEBHOOKS", namespace.to_ascii_uppercase());
    let leader = poll_until(LONG, Duration::from_millis(100), async || {
        let mut s = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
        let info = s.info().await.map_err(|e| e.to_string())?;
        info.cluster
            .as_ref()
            .and_then(|c| c.leader.as_deref())
            .and_then(|leader| nats.node_index(leader))
            .ok_or_else(|| "no leader yet".to_owned())
    })
    .await;
    nats.kill(leader);
    for _ in 0..EXECUTIONS {
        ids.insert(submit_through_elections(&url).await);
    }
    eventually(LONG, || {
        let mut delivered = BTreeSet::new();
        for deliveries in by_id(&log, "/ok").values() {
            let body = &deliveries[0]["body"];
            delivered.insert(body["data"]["execution_id"].as_str().unwrap().to_owned());
        }
        let missing = ids.difference(&delivered).count();
        (missing == 0)
            .then_some(())
            .ok_or(format!("{missing} of {} not delivered yet", ids.len()))
    })
    .await;
    let received = by_id(&log, "/ok");
    let mut repeats = 0;
    let mut unanswered = 0;
    for (webhook_id, deliveries) in &received {
        assert_well_signed(deliveries);
        repeats += deliveries.len() - 1;
        // Each delivery is of a stored terminal event. A submit answered 503 during the
        // election may have stored its log before failing, which the gateway then closes
        // (`execution.failed`): that terminal event is stored, so it is delivered too.
        let data = &deliveries[0]["body"]["data"];
        let execution = data["execution_id"].as_str().unwrap();
        let (status, snapshot) = get_json(&format!("{url}/v1/executions/{execution}")).await;
        assert_eq!(status, 200, "{webhook_id}");
        assert_eq!(data["sequence"], snapshot["last_sequence"], "{webhook_id}");
        assert_eq!(data["status"], snapshot["status"], "{webhook_id}");
        if !ids.contains(execution) {
            unanswered += 1;
        }
    }
    let mut per_worker = Vec::new();
    for admin in &admins {
        let (_, text) = get_text(&format!("{admin}/metrics")).await;
        per_worker.push(metric(
            &text,
            "mrt_webhook_deliveries_total",
            &["outcome=\"delivered\""],
        ));
    }
    eprintln!(
        "{} deliveries ({unanswered} of logs closed by a failed submit), {repeats} repeated; \
         delivered per worker: {per_worker:?}",
        received.len()
    );
    nats.restart(leader);
}
