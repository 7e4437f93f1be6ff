//! HTTP request metrics: one middleware records `mrt_http_requests_total{route,method,status}`
//! and `mrt_http_request_duration_seconds{route}` for every request.
//!
//! The `route` label is the matched route template (`/v1/executions/{id}`), never the raw path,
//! so ids never become labels; requests that match no route share the label `unmatched`. Methods
//! outside the standard set are counted as `other`. For SSE streams the duration ends when the
//! response head is ready, not when the stream closes (`mrt_sse_streams_active` covers those).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{Counter, Histogram};
use parking_lot::RwLock;
use telemetry::metric;

/// axum middleware (`axum::middleware::from_fn(instrument::record)`).
pub async fn record(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = method_label(request.method());
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let (count, duration) = handles(route, method, response.status().as_u16());
    duration.record(started.elapsed().as_secs_f64());
    count.increment(1);
    response
}

/// Handles by route template, then (method, status): a bounded set (the router's routes, the
/// methods below, the statuses the server answers), resolved once each, so a request costs
/// two map reads instead of two registry lookups with label allocations.
type RouteHandles = HashMap<(&'static str, u16), (Counter, Histogram)>;
static HANDLES: LazyLock<RwLock<HashMap<String, RouteHandles>>> = LazyLock::new(RwLock::default);

fn handles(route: &str, method: &'static str, status: u16) -> (Counter, Histogram) {
    if let Some(found) = HANDLES
        .read()
        .get(route)
        .and_then(|by| by.get(&(method, status)))
    {
        return found.clone();
    }
    let made = (
        metrics::counter!(
            metric::HTTP_REQUESTS_TOTAL,
            "route" => route.to_owned(),
            "method" => method,
            "status" => status.to_string()
        ),
        metrics::histogram!(metric::HTTP_REQUEST_DURATION_SECONDS, "route" => route.to_owned()),
    );
    HANDLES
        .write()
        .entry(route.to_owned())
        .or_default()
        .insert((method, status), made.clone());
    made
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use telemetry::MetricsExporter;
    use tower::ServiceExt;

    #[tokio::test]
    async fn requests_are_counted_by_route_template_method_and_status() {
        let exporter = MetricsExporter::install();
        let app = Router::new()
            .route("/v1/executions/{id}", get(|| async { StatusCode::OK }))
            .fallback(|| async { StatusCode::NOT_FOUND })
            .layer(axum::middleware::from_fn(record));
        for path in [
            "/v1/executions/abc",
            "/v1/executions/def",
            "/nowhere/secret-id",
        ] {
            let request = Request::get(path).body(Body::empty()).unwrap();
            app.clone().oneshot(request).await.unwrap();
        }
        let text = exporter.render();
        assert!(
            text.contains(
                "mrt_http_requests_total{route=\"/v1/executions/{id}\",method=\"GET\",status=\"200\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "mrt_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "mrt_http_request_duration_seconds_count{route=\"/v1/executions/{id}\"} 2"
            )
        );
        assert!(!text.contains("secret-id") && !text.contains("abc"));
    }
}
