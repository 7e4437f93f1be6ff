//! The worker's admin endpoint (contract.md section 9): `/metrics`, `/healthz`, `/readyz` on
//! `--admin-port`, separate from any API so probes and scrapes never compete with jobs.
//!
//! Liveness is the process answering; readiness is the caller's check (connected to the job
//! queue and not stopping), so an orchestrator stops routing to a worker that cannot pull jobs.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use telemetry::MetricsExporter;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Whether the worker can take jobs now. Must be cheap: probes call it every few seconds.
pub type Readiness = Arc<dyn Fn() -> bool + Send + Sync>;

/// Sets the gauges read from the process's own state (such as its pace's hold) just before
/// each scrape renders them. Must be cheap and never wait.
pub type Sampler = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
struct AdminState {
    exporter: MetricsExporter,
    ready: Readiness,
    sample: Sampler,
}

/// The admin router; tests call it with `oneshot`.
pub fn router(exporter: MetricsExporter, ready: Readiness, sample: Sampler) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .with_state(AdminState {
            exporter,
            ready,
            sample,
        })
}

/// Serves the admin router on `listener` until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    exporter: MetricsExporter,
    ready: Readiness,
    sample: Sampler,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(exporter, ready, sample))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (state.sample)();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.exporter.render(),
    )
        .into_response()
}

async fn readyz(State(state): State<AdminState>) -> Response {
    if (state.ready)() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::Pace;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tower::ServiceExt;

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        let response = router
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readiness_follows_the_check_and_metrics_render_the_catalogue() {
        let flag = Arc::new(AtomicBool::new(false));
        let check = flag.clone();
        let app = router(
            MetricsExporter::install(),
            Arc::new(move || check.load(Ordering::Relaxed)),
            Arc::new(|| {}),
        );
        assert_eq!(get(app.clone(), "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get(app.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        flag.store(true, Ordering::Relaxed);
        assert_eq!(get(app.clone(), "/readyz").await.0, StatusCode::OK);
        let (status, text) = get(app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.contains("mrt_job_redeliveries_total 0"), "{text}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }

    /// The value of an unlabelled gauge in a Prometheus text page.
    fn gauge(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn every_scrape_shows_the_pace_hold_as_it_stands() {
        let pace = Pace::adaptive();
        let sampled = pace.clone();
        let app = router(
            MetricsExporter::install(),
            Arc::new(|| true),
            Arc::new(move || crate::instrument::append_pace_hold(&sampled)),
        );
        let name = telemetry::metric::APPEND_PACE_HOLD_SECONDS;
        let (_, text) = get(app.clone(), "/metrics").await;
        assert_eq!(
            gauge(&text, name),
            0.0,
            "a store that keeps up holds nothing"
        );
        // The store turns slow: after a 0.1 ms round trip while idle (so the threshold stays
        // 1 ms), 3 ms acknowledgements, 2 ms over the threshold.
        pace.observe(Duration::from_micros(100));
        for _ in 0..400 {
            pace.observe(Duration::from_millis(3));
        }
        let (_, text) = get(app, "/metrics").await;
        let held = gauge(&text, name);
        assert!(held > 0.079 && held <= 0.080, "{held}");
    }
}
