//! Capacity (contract §12): a process runs as many executions at once as its providers allow,
//! not a multiple of its cores; `MODEL_RUNTIME_WORKERS` only caps it. Checked on the real
//! binaries, embedded and with one worker over NATS, by counting the provider calls in flight
//! (`mrt_provider_inflight`) while a mock holds every call open.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use e2e_tests::*;
use serde_json::{Value, json};
use testkit::TempDir;

/// Executions submitted at once: eight times the old default of 2 × cores on this machine's
/// two cores.
const AT_ONCE: usize = 32;

/// One mock with room for `max_concurrency` calls whose first chunk comes after ten minutes,
/// so every call stays in flight for the test.
fn holding_mock(max_concurrency: u32) -> Value {
    json!({
        "providers": [{
            "type": "mock", "id": "provider-mock", "model": "model-alpha",
            "abilities": ["text-generation"], "chunks": ["held"], "delay_ms": 600_000,
            "max_concurrency": max_concurrency, "max_queue_depth": 256
        }],
        "max_active_executions": 1000
    })
}

/// The sample `mrt_provider_inflight{provider="provider-mock"}` of a `/metrics` text.
fn inflight(metrics: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix("mrt_provider_inflight{provider=\"provider-mock\"} ")?;
        value.trim().parse().ok()
    })
}

/// Submits [`AT_ONCE`] executions to `gateway`, then waits until `metrics_url` shows `want`
/// provider calls in flight, and checks it does not exceed it after every job could have
/// been taken.
async fn submit_and_count_inflight(gateway: &str, metrics_url: &str, want: usize) {
    let request = json!({"ability": "text-generation", "input": [{"type": "text", "text": "hi"}]});
    let submits = (0..AT_ONCE).map(|_| submit_accepted(gateway, &request));
    futures_util::future::join_all(submits).await;
    let read = async || {
        let text = fetch_text(metrics_url).await?;
        inflight(&text).ok_or_else(|| format!("no inflight gauge in:\n{text}"))
    };
    poll_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            let now = read().await?;
            if now == want as f64 {
                Ok(())
            } else {
                Err(format!("{now} provider calls in flight, want {want}"))
            }
        },
    )
    .await;
    // The rest had time to be taken (a pull brings jobs within milliseconds); a process that
    // took more than its capacity would show them now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        read().await.unwrap(),
        want as f64,
        "in flight after settling"
    );
}

/// An embedded gateway (memory backend) with `config` and extra `env`.
fn embedded_gateway(config: &Value, env: &[(&str, &str)]) -> (Gateway, TempDir) {
    let dir = TempDir::new("mrt-capacity-");
    let path = dir.path().join("deployment.json");
    std::fs::write(&path, serde_json::to_vec(config).unwrap()).unwrap();
    let mut all = vec![
        ("MODEL_RUNTIME_BACKEND".to_owned(), "memory".to_owned()),
        (
            "MODEL_RUNTIME_CONFIG".to_owned(),
            path.display().to_string(),
        ),
    ];
    all.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    (spawn_gateway(&all, &dir), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_gateway_runs_as_many_executions_as_its_provider_allows() {
    let (gateway, _dir) = embedded_gateway(&holding_mock(64), &[]);
    let metrics = format!("{}/metrics", gateway.url);
    submit_and_count_inflight(&gateway.url, &metrics, AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_setting_only_caps_what_the_providers_allow() {
    let (gateway, _dir) = embedded_gateway(&holding_mock(64), &[("MODEL_RUNTIME_WORKERS", "5")]);
    let metrics = format!("{}/metrics", gateway.url);
    submit_and_count_inflight(&gateway.url, &metrics, 5).await;
    // And the providers' capacity bounds it when it is below the cap.
    let (gateway, _dir) = embedded_gateway(&holding_mock(7), &[("MODEL_RUNTIME_WORKERS", "20")]);
    let metrics = format!("{}/metrics", gateway.url);
    submit_and_count_inflight(&gateway.url, &metrics, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_default_worker_runs_as_many_executions_as_its_provider_allows() {
    let cluster = Cluster::start(&holding_mock(64));
    let gateway = cluster.gateway();
    let (_worker, admin) = cluster.worker_with_admin(&[]);
    submit_and_count_inflight(&gateway.url, &format!("{admin}/metrics"), AT_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_workers_cap_is_a_startup_error_naming_the_setting() {
    let dir = TempDir::new("mrt-capacity-");
    let (code, log) = run_gateway_to_exit(&dir, &[("MODEL_RUNTIME_WORKERS", "0")]);
    assert_ne!(code, Some(0), "{log}");
    assert!(log.contains("--workers"), "{log}");
}

/// Runs the gateway binary with `env` until it exits (it must, within 30 s); its exit code
/// and stderr.
fn run_gateway_to_exit(dir: &TempDir, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let log = dir.path().join("gateway.log");
    let mut command = std::process::Command::new(binary("gateway"));
    command
        .args(["--port", "0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the gateway did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The limit of the next test: the deployment's `max_active_executions` and the tenant's.
const LIMIT: usize = 6;

/// Closed-loop clients at exactly the limit: each submits, reads the event stream to its
/// terminal event, and submits again at once. An execution stops counting against
/// `max_active_executions` and its tenant's quota no later than its terminal event is
/// visible, so none of them is ever refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_at_exactly_the_limit_are_never_refused_after_reading_their_terminal_event() {
    let key = "mrt-capacity-test-capped-0a1b2c3d4e5f60718293a4b5c6d7e8f9";
    let mut config = chunked_mock(0, 3);
    config["max_active_executions"] = json!(LIMIT);
    config["auth"] = json!({
        "tenants": {"capped": {"max_active_executions": LIMIT}},
        "keys": testkit::gateway::auth_matrix::tenant_keys(&["capped"], |_| key.to_owned())
    });
    let cluster = Cluster::start(&config);
    let gateway = cluster.gateway();
    let _worker = cluster.worker();
    let request = json!({"ability": "text-generation", "input": [{"type": "text", "text": "hi"}]});
    let rounds = 15;
    let clients = (0..LIMIT).map(|_| {
        let (base, request) = (gateway.url.clone(), request.clone());
        tokio::spawn(async move {
            let mut refused = Vec::new();
            for _ in 0..rounds {
                let response = client()
                    .post(format!("{base}/v1/executions"))
                    .bearer_auth(key)
                    .json(&request)
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status != 202 {
                    refused.push(format!("{status} {body}"));
                    continue;
                }
                let id = body["execution_id"].as_str().unwrap().to_owned();
                let stream = client()
                    .get(format!("{base}/v1/executions/{id}/events"))
                    .bearer_auth(key)
                    .send()
                    .await
                    .unwrap();
                let events = read_events(stream, None).await;
                assert_eq!(
                    events.last().unwrap()["type"],
                    "execution.completed",
                    "{events:?}"
                );
            }
            refused
        })
    });
    let mut refused = Vec::new();
    for client in futures_util::future::join_all(clients).await {
        refused.extend(client.unwrap());
    }
    assert!(
        refused.is_empty(),
        "{} of {} submits refused: {refused:?}",
        refused.len(),
        LIMIT * rounds
    );
}
