//! HTTP routes (contract.md section 2). Handlers parse and answer; the flows live in
//! [`crate::submit`] and [`crate::events`].

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use config::Scope;
use protocol::manifest::ProviderList;
use protocol::snapshot::{CancelResponse, CancelStatus, RuntimeInfo, RuntimeState};
use protocol::{ExecutionId, Sequence, Tenant};
use tracing::Instrument;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::events::{empty_sse_response, sse_response};
use crate::response::{json_response, security_headers};
use crate::state::AppState;
use crate::{quota, submit};

/// The application router. Tests call it directly with `oneshot`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/runtime", get(runtime_info))
        .route("/v1/providers", get(providers))
        .route("/v1/executions", post(submit_execution))
        .route("/v1/executions/{id}", get(get_execution))
        .route("/v1/executions/{id}/result", get(get_result))
        .route("/v1/executions/{id}/cancel", post(cancel_execution))
        .route("/v1/executions/{id}/events", get(get_events))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::openai::routes())
        .fallback(route_not_found)
        .method_not_allowed_fallback(route_not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(head_not_found))
        .layer(axum::middleware::map_response(security_headers))
        .layer(axum::middleware::from_fn(crate::instrument::record))
        .with_state(state)
}

/// 404 for an unknown route or method; below the OpenAI-compatible routes in OpenAI's shape.
async fn route_not_found(uri: Uri) -> Response {
    let error = ApiError::NotFound("Route not found");
    if crate::openai::owns(uri.path()) {
        return crate::openai::error::OpenAiError::from(error).into_response();
    }
    error.into_response()
}

/// HEAD is an unknown method on every route, as in the reference [R 24] (axum would otherwise
/// answer it on the GET routes only).
async fn head_not_found(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if request.method() == axum::http::Method::HEAD {
        return route_not_found(request.uri().clone()).await;
    }
    next.run(request).await
}

/// The execution id from the path: bad percent-encoding is 400, a non-UUID is 404 like an
/// unknown id.
fn execution_id(
    path: Result<Path<String>, PathRejection>,
    uri: &Uri,
) -> Result<Option<ExecutionId>, ApiError> {
    const BAD_ENCODING: ApiError = ApiError::InvalidRequest("Invalid execution ID encoding");
    // axum's `Path` rejects escapes that decode to invalid UTF-8 but leaves a malformed escape
    // such as `%zz` in place, so it would surface as a 404; the reference (JS
    // `decodeURIComponent`) answers 400 for it [R 24]. The other segments of these routes are
    // literals, so checking the whole raw path checks the id.
    if !well_formed_escapes(uri.path()) {
        return Err(BAD_ENCODING);
    }
    let Path(raw) = path.map_err(|_| BAD_ENCODING)?;
    Ok(raw.parse().ok())
}

/// Whether every `%` in `raw` starts a `%XX` escape.
fn well_formed_escapes(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

/// A W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`); anything else is ignored, so only
/// trace identifiers, never caller text, reach the job and the logs.
pub(crate) fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
}

const EXECUTION_NOT_FOUND: ApiError = ApiError::NotFound("Execution not found");

async fn backends_ready(state: &AppState) -> bool {
    let b = state.backend();
    let (s, q, i) = tokio::join!(b.store.ready(), b.queue.ready(), b.idempotency.ready());
    s.is_ok() && q.is_ok() && i.is_ok()
}

async fn runtime_info(State(state): State<AppState>) -> Response {
    let runtime_state = if state.is_stopping() {
        RuntimeState::Stopping
    } else if backends_ready(&state).await {
        RuntimeState::Ready
    } else {
        RuntimeState::Unavailable
    };
    let status = if runtime_state == RuntimeState::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        &RuntimeInfo::new(state.inner.capabilities.len(), runtime_state),
    )
}

async fn providers(State(state): State<AppState>) -> Response {
    json_response(
        StatusCode::OK,
        &ProviderList {
            data: state.inner.capabilities.manifests(),
        },
    )
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &serde_json::json!({ "status": "ok" }))
}

async fn readyz(State(state): State<AppState>) -> Response {
    if !state.is_stopping() && backends_ready(&state).await {
        json_response(StatusCode::OK, &serde_json::json!({ "status": "ready" }))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "status": "unavailable" }),
        )
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    // The process-wide registry: HTTP, submissions and streams, executions in embedded mode,
    // process CPU and memory.
    let mut response = Response::new(Body::from(state.exporter().render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.to_ascii_lowercase().contains("text/event-stream"))
    })
}

/// Whether Content-Type is `application/json`, case-insensitive, with or without parameters.
/// Other types that merely start the same (`application/jsonp`, `application/json-seq`) are
/// not JSON, and neither are `+json` suffix types, which the reference rejects too [R 1].
fn is_json_media_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split(';').next().unwrap_or_default();
            essence.trim().eq_ignore_ascii_case("application/json")
        })
}

pub(crate) async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                Err(ApiError::BodyTooLarge)
            } else {
                Err(ApiError::InvalidRequest("Request body could not be read"))
            }
        }
    }
}

/// The checks of a JSON submit's headers before its body is read: `Content-Type` JSON (415)
/// and a `Content-Length` within the body limit (413).
pub(crate) fn json_headers(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if !is_json_media_type(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let limit = state.inner.limits.max_body_bytes;
    let too_long = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64);
    if too_long {
        return Err(ApiError::BodyTooLarge);
    }
    Ok(())
}

/// The one `Idempotency-Key` header, if any (contract.md section 3).
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut keys = headers.get_all("idempotency-key").iter();
    match (keys.next(), keys.next()) {
        (None, _) => Ok(None),
        (Some(v), None) if protocol::idempotency::is_valid_key(v.as_bytes()) => {
            Ok(Some(v.to_str().map_err(|_| {
                ApiError::InvalidRequest("Idempotency-Key must contain 1 to 256 characters")
            })?))
        }
        (Some(_), None) => Err(ApiError::InvalidRequest(
            "Idempotency-Key must contain 1 to 256 visible ASCII characters",
        )),
        (Some(_), Some(_)) => Err(ApiError::InvalidRequest(
            "Idempotency-Key must be sent once",
        )),
    }
}

/// [`runtime::apart::apart`] for a request's CPU work (parsing, fingerprinting, translating a
/// large body); a runtime shutting down is the 503 of a stopping gateway.
pub(crate) async fn apart<T, F>(size: usize, work: F) -> Result<T, ApiError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    runtime::apart::apart(size, work)
        .await
        .ok_or(ApiError::Unavailable("Runtime is shutting down"))
}

async fn submit_execution(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    principal.require(Scope::Submit)?;
    // Checked before the body is read: a stopping gateway answers 503 at once. The flow itself
    // does not check again.
    if state.is_stopping() {
        return Err(ApiError::Unavailable("Runtime is shutting down"));
    }
    json_headers(&state, &headers)?;
    let limit = state.inner.limits.max_body_bytes;
    let key = idempotency_key(&headers)?;
    let bytes = read_body(body, limit).await?;
    let request_bytes = bytes.len();
    // Parsed on the blocking pool when large ([`runtime::apart`]). The request holds what it
    // needs (caller-defined JSON as raw text): the body goes with the parse, not after the
    // submit, so a request costs about one body while it is admitted.
    let request = apart(request_bytes, move || {
        protocol::validate::parse_request(&bytes).map_err(|e| e.message())
    })
    .await?
    .map_err(ApiError::InvalidRequest)?;
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| valid_traceparent(v))
        .map(str::to_owned);
    // Reserve the stream slot before anything is created: a retryable 429 for the stream
    // after the execution exists would invite a retry that creates a duplicate.
    let stream_permit = if wants_event_stream(&headers) {
        Some(stream_permit(&state)?)
    } else {
        None
    };
    // The request span continues the caller's trace; the job carries this span's context to
    // the worker. Its `trace_id` is on every line the submission logs, as the worker's
    // execution span puts it on the execution's lines. Without export the caller's own
    // `traceparent` travels unchanged, and a span (for its trace id alone) is built only when
    // the caller sent one: none on the untraced hot path.
    let (span, traceparent) = if telemetry::trace::exporting() {
        let span = tracing::info_span!(
            "POST /v1/executions",
            otel.kind = "server",
            http.request.method = "POST",
            http.route = "/v1/executions",
            execution_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        if let Some(parent) = &traceparent {
            telemetry::propagation::set_parent(&span, parent);
        }
        if let Some(trace_id) = telemetry::propagation::trace_id_of(&span) {
            span.record("trace_id", trace_id);
        }
        let traceparent = telemetry::propagation::traceparent_of(&span).or(traceparent);
        (span, traceparent)
    } else if let Some(trace_id) = traceparent.as_deref().and_then(|t| t.split('-').nth(1)) {
        let span = tracing::info_span!(
            "POST /v1/executions",
            execution_id = tracing::field::Empty,
            trace_id,
        );
        (span, traceparent)
    } else {
        (tracing::Span::none(), traceparent)
    };
    let submitted = submit::submit(
        &state,
        &principal.tenant,
        request,
        request_bytes,
        key,
        traceparent,
    )
    .instrument(span.clone())
    .await;
    state.metrics().count_submission(&submitted);
    let submission = submitted?;
    span.record(
        "execution_id",
        tracing::field::display(&submission.execution_id),
    );
    if let Some(permit) = stream_permit {
        return events_response(
            &state,
            submission.execution_id,
            Sequence::ZERO,
            permit,
            principal.tenant,
        )
        .await;
    }
    let status = if submission.idempotent_replay {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok(json_response(status, &submission))
}

/// The materialized execution named by the path, or the matching API error. Another tenant's
/// execution is not found, exactly like an unknown one.
async fn load_execution(
    state: &AppState,
    principal: &Principal,
    path: Result<Path<String>, PathRejection>,
    uri: &Uri,
) -> Result<protocol::materialize::Materializer, ApiError> {
    let id = execution_id(path, uri)?.ok_or(EXECUTION_NOT_FOUND)?;
    match state.backend().store.owned_state(id).await? {
        Some((execution, owner)) if owner == principal.tenant => {
            if execution.is_terminal() {
                // Its tenant's quota slot is free no later than a client sees it ended.
                quota::release(state, &owner, id).await;
            }
            Ok(execution)
        }
        _ => Err(EXECUTION_NOT_FOUND),
    }
}

/// Whether the execution exists and belongs to the caller's tenant (one read of the log's
/// first message).
async fn owned_by(
    state: &AppState,
    principal: &Principal,
    id: ExecutionId,
) -> Result<bool, ApiError> {
    Ok(state.backend().store.owner(id).await? == Some(principal.tenant.clone()))
}

/// The execution named by the path, loaded for a caller allowed to read it ([`load_execution`]):
/// what `GET` of a snapshot or of a result answers from.
struct ReadableExecution(protocol::materialize::Materializer);

impl FromRequestParts<AppState> for ReadableExecution {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let principal = Principal::from_request_parts(parts, state).await?;
        principal.require(Scope::Read)?;
        let path = Path::<String>::from_request_parts(parts, state).await;
        load_execution(state, &principal, path, &parts.uri)
            .await
            .map(Self)
    }
}

async fn get_execution(ReadableExecution(execution): ReadableExecution) -> Response {
    json_response(StatusCode::OK, &execution.snapshot())
}

async fn get_result(ReadableExecution(execution): ReadableExecution) -> Response {
    match execution.result_response() {
        Ok(result) => json_response(StatusCode::OK, &result),
        Err(not_ready) => json_response(StatusCode::CONFLICT, &not_ready),
    }
}

async fn cancel_execution(
    State(state): State<AppState>,
    principal: Principal,
    uri: Uri,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    principal.require(Scope::Cancel)?;
    let cancelled = match execution_id(path, &uri)? {
        // Another tenant's execution is answered like an unknown one.
        Some(id) if owned_by(&state, &principal, id).await? => submit::cancel(&state, id).await?,
        _ => false,
    };
    Ok(if cancelled {
        json_response(
            StatusCode::ACCEPTED,
            &CancelResponse {
                status: CancelStatus::CancellationRequested,
            },
        )
    } else {
        json_response(
            StatusCode::NOT_FOUND,
            &CancelResponse {
                status: CancelStatus::NotFound,
            },
        )
    })
}

/// Parses a cursor as the reference does (JS `Number()`, then a safe non-negative integer):
/// surrounding whitespace is ignored, an empty value is 0, `5.0` and `5e0` are 5.
pub fn parse_cursor(raw: &str) -> Option<Sequence> {
    let s = raw.trim_matches(|c: char| c.is_ascii_whitespace());
    if s.is_empty() {
        return Some(Sequence::ZERO);
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None; // rejects "inf", "NaN", hex and anything Rust parses but JS would not
    }
    let n: f64 = s.parse().ok()?;
    protocol::number::safe_integer(n).map(Sequence)
}

fn cursor(query: Option<&str>, headers: &HeaderMap) -> Result<Sequence, ApiError> {
    const BAD: ApiError = ApiError::InvalidRequest("Event cursor must be a non-negative integer");
    let after = query.and_then(|q| {
        q.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == "after").then_some(v)
        })
    });
    if let Some(raw) = after {
        let decoded = percent_decode(raw).ok_or(BAD)?;
        return parse_cursor(&decoded).ok_or(BAD);
    }
    match headers.get("last-event-id") {
        Some(v) => v.to_str().ok().and_then(parse_cursor).ok_or(BAD),
        None => Ok(Sequence::ZERO),
    }
}

/// Decodes `%XX` escapes and `+` in a query value.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let s = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(s, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

async fn get_events(
    State(state): State<AppState>,
    principal: Principal,
    uri: Uri,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    principal.require(Scope::Read)?;
    let id = execution_id(path, &uri)?.ok_or(EXECUTION_NOT_FOUND)?;
    // Existence (and ownership) is checked before the cursor [R 52]: the cursor is parsed now
    // but its error is answered only for an execution the caller may see.
    let after = cursor(query.as_deref(), &headers);
    let store = &state.backend().store;
    if matches!(after, Ok(after) if after == Sequence::ZERO)
        && let Ok(permit) = stream_permit(&state)
    {
        // From the start, the common case: the owner comes with the log's first read (one
        // request for a short log); the subscription is dropped unused if the caller may not
        // see the execution.
        let (owner, records) = store
            .owned_subscribe(id, Sequence::ZERO)
            .await?
            .ok_or(EXECUTION_NOT_FOUND)?;
        if owner != principal.tenant {
            return Err(EXECUTION_NOT_FOUND);
        }
        return Ok(sse_response(&state, id, records, permit, owner));
    }
    // A resume, a cursor error, or no stream slot left (answered 429 only to a caller who may
    // see the execution). A resume past the end of a finished log is answered at once, without
    // a stream: that needs the end of the log, read beside the owner (a request, not a round
    // trip).
    let resuming = matches!(after, Ok(after) if after > Sequence::ZERO);
    let (owner, head) = tokio::join!(store.owner(id), async {
        if resuming {
            store.head(id).await.map(Some)
        } else {
            Ok(None)
        }
    });
    if owner? != Some(principal.tenant.clone()) {
        return Err(EXECUTION_NOT_FOUND);
    }
    let after = after?;
    if let Some(head) = head? {
        let head = head.ok_or(EXECUTION_NOT_FOUND)?;
        if head.terminal && after >= head.last_sequence {
            return Ok(empty_sse_response());
        }
    }
    events_response(&state, id, after, stream_permit(&state)?, principal.tenant).await
}

/// One of the `max_sse_streams` slots, held by the stream until it ends.
pub(crate) fn stream_permit(
    state: &AppState,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    std::sync::Arc::clone(&state.inner.streams)
        .try_acquire_owned()
        .map_err(|_| ApiError::QueueFull("Too many open event streams"))
}

/// The event stream of execution `id` (owned by `owner`) after `after`.
async fn events_response(
    state: &AppState,
    id: ExecutionId,
    after: Sequence,
    permit: tokio::sync::OwnedSemaphorePermit,
    owner: Tenant,
) -> Result<Response, ApiError> {
    let records = state
        .backend()
        .store
        .subscribe(id, after)
        .await?
        .ok_or(EXECUTION_NOT_FOUND)?;
    Ok(sse_response(state, id, records, permit, owner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_w3c_traceparents_are_kept() {
        assert!(valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "00-xyz",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "secret text",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
    }

    #[test]
    fn cursors_follow_js_number_semantics() {
        assert_eq!(parse_cursor(""), Some(Sequence(0)));
        assert_eq!(parse_cursor(" 7 "), Some(Sequence(7)));
        assert_eq!(parse_cursor("5.0"), Some(Sequence(5)));
        assert_eq!(parse_cursor("1e2"), Some(Sequence(100)));
        assert_eq!(
            parse_cursor("9007199254740991"),
            Some(Sequence(protocol::MAX_SAFE_INTEGER))
        );
        for bad in [
            "-1",
            "1.5",
            "abc",
            "inf",
            "NaN",
            "Infinity",
            "9007199254740992",
            "0x10",
        ] {
            assert_eq!(parse_cursor(bad), None, "{bad}");
        }
    }
}
