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

#[derive(Clone)]
struct AdminState {
    exporter: MetricsExporter,
    ready: Readiness,
}

/// The admin router; tests call it with `oneshot`.
pub fn router(exporter: MetricsExporter, ready: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .with_state(AdminState { exporter, ready })
}

/// Serves the admin router on `listener` until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    exporter: MetricsExporter,
    ready: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(exporter, ready))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn metrics(State(state): State<AdminState>) -> Response {
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
    use std::sync::atomic::{AtomicBool, Ordering};
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
}
