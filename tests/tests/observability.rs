//! Observability with real parts (contract.md section 9): a real Prometheus scrapes a gateway
//! and a worker in `nats` mode during a short load, and every PromQL expression of the shipped
//! Grafana dashboard is evaluated through Prometheus's HTTP API and must return a series.
//!
//! Prometheus comes from Debian's `prometheus` package, installed by `scripts/test.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::*;
use serde_json::{Value, json};

/// Bound of every wait in this file (a busy 2-core machine).
const WAIT: Duration = Duration::from_secs(60);

struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile_dir::Dir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

mod tempfile_dir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn prometheus_binary() -> String {
    std::env::var("MRT_PROMETHEUS").unwrap_or_else(|_| "prometheus".into())
}

/// Starts Prometheus scraping `targets` (`job` → `host:port` list) every second.
fn start_prometheus(targets: &[(&str, &str)]) -> Prometheus {
    let dir = std::env::temp_dir().join(testkit::unique_namespace("prom"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = String::from(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
    );
    for (job, target) in targets {
        config.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: [\"{target}\"]\n"
        ));
    }
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = testkit::free_port();
    let child = Command::new(prometheus_binary())
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus (Debian package `prometheus`) is installed");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: tempfile_dir::Dir(dir),
    }
}

/// Every `expr` of every panel target in the dashboard JSON.
fn dashboard_queries() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/dashboards/model-runtime.json"
    );
    let dashboard: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(out.len() >= 15, "the dashboard has its panels");
    out
}

async fn query(prometheus: &str, expr: &str) -> Value {
    let encoded: String = expr
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let resp = client()
        .get(format!("{prometheus}/api/v1/query?query={encoded}"))
        .send()
        .await
        .unwrap();
    resp.json().await.unwrap()
}

fn host_port(url: &str) -> &str {
    url.trim_start_matches("http://").trim_end_matches('/')
}

#[tokio::test]
async fn every_dashboard_query_returns_series_from_a_real_prometheus() {
    let config = json!({
        "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                       "abilities": ["text-generation"], "chunks": ["a ", "b ", "c"],
                       "delay_ms": 20}],
        // Nothing listens there: every attempt fails fast, so the webhook panel's series
        // (attempts, their latency, deliveries pending) exist.
        "webhooks": [{"id": "unreachable", "url": "http://127.0.0.1:9/hook",
                      "secret_env": ["MRT_TEST_WEBHOOK_SECRET"]}]
    });
    let mut cluster = Cluster::start(&config);
    cluster.extra_env.push((
        "MRT_TEST_WEBHOOK_SECRET".into(),
        "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".into(),
    ));
    let gateway = cluster.gateway();
    let (_worker, admin) = cluster.worker_with_admin(&[]);
    let prometheus = start_prometheus(&[
        ("gateway", host_port(&gateway.url)),
        ("worker", host_port(&admin)),
    ]);

    // Worker admin endpoint: liveness, readiness and the catalogue from startup.
    let (status, _) = get_text(&format!("{admin}/healthz")).await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + WAIT;
    while get_text(&format!("{admin}/readyz")).await.0 != 200 {
        assert!(Instant::now() < deadline, "worker never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, text) = get_text(&format!("{admin}/metrics")).await;
    for name in [
        "mrt_executions_total",
        "mrt_job_redeliveries_total",
        "mrt_idempotency_key_claims_total{outcome=\"unreachable\"} 0",
        "mrt_append_pace_hold_seconds 0",
        "mrt_provider_attempts_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(
            text.contains(name),
            "{name} missing at worker startup:\n{text}"
        );
    }

    // A short load, long enough for rates over several scrapes.
    let load_until = Instant::now() + Duration::from_secs(8);
    let mut ids = Vec::new();
    while Instant::now() < load_until {
        let (status, body) = submit(&gateway.url, &text_request("hello"), None).await;
        assert_eq!(status, 202, "{body}");
        let id = body["execution_id"].as_str().unwrap().to_owned();
        let events = events(&gateway.url, &id, 0).await;
        assert_eq!(events.last().unwrap()["type"], "execution.completed");
        ids.push(id);
    }
    // Keep one SSE stream open while Prometheus scrapes, so the stream gauge is non-zero.
    let queries = dashboard_queries();
    let deadline = Instant::now() + WAIT;
    let mut missing: Vec<String>;
    loop {
        missing = Vec::new();
        for expr in &queries {
            let answer = query(&prometheus.url, expr).await;
            assert_eq!(answer["status"], "success", "{expr}: {answer}");
            if answer["data"]["result"]
                .as_array()
                .is_none_or(Vec::is_empty)
            {
                missing.push(expr.clone());
            }
        }
        if missing.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        missing.is_empty(),
        "dashboard queries without a series: {missing:#?}"
    );

    // Labels stay bounded: no execution id became a label value anywhere.
    let (_, gateway_text) = get_text(&format!("{}/metrics", gateway.url)).await;
    let (_, worker_text) = get_text(&format!("{admin}/metrics")).await;
    for id in &ids {
        assert!(
            !gateway_text.contains(id) && !worker_text.contains(id),
            "{id} is a label"
        );
    }
    assert!(
        worker_text.contains(&format!(
            "mrt_executions_total{{outcome=\"succeeded\",code=\"none\"}} {}",
            ids.len()
        )),
        "{worker_text}"
    );
}

async fn get_text(url: &str) -> (u16, String) {
    let resp = client().get(url).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}
