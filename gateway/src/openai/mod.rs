//! The OpenAI-compatible front door (contract.md section 10): `POST /v1/responses`,
//! `GET /v1/responses/{id}` (a snapshot, or `?stream=true[&starting_after=N]`),
//! `POST /v1/responses/{id}/cancel`, `POST /v1/chat/completions`, `GET /v1/models` and
//! `GET /v1/models/{id}`, for the unmodified OpenAI SDKs with `base_url` pointed at a gateway.
//!
//! The one decision a reader must know: these routes are another *view*, not another runtime.
//! A request is translated into a native execution request ([`translate`]) and runs through
//! the native submission flow (`crate::submit`: same keys, scopes, tenants, quotas,
//! idempotency); what they answer is projected from the execution's stored log
//! ([`projection`], [`chat`]), so an execution made through one API reads through the other,
//! and any gateway answers the same bytes for the same log.
//!
//! Module map: [`request`] parses the bodies, [`model`] resolves `model` and lists models,
//! [`translate`] builds the native request, [`projection`] is the Responses view of a log,
//! [`chat`] the Chat Completions view, [`stream`] writes both as SSE, [`id`] the ids,
//! [`error`] the OpenAI-shaped errors.

pub mod chat;
pub mod error;
#[cfg(test)]
mod fixture;
pub mod id;
pub mod model;
pub mod projection;
pub mod request;
pub mod stream;
pub mod translate;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use config::Scope;
use futures_util::StreamExt;
use protocol::{ExecutionId, ExecutionRequest, Sequence};

use self::error::OpenAiError;
use self::model::Dialect;
use self::projection::Projection;
use self::request::{ChatRequest, CreateRequest, ResponsesRequest};
use self::stream::Grammar;
use crate::api::{
    apart, idempotency_key, json_headers, read_body, stream_permit, valid_traceparent,
};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::response::json_response;
use crate::state::AppState;
use crate::submit;

/// Whether `path` is one of these routes (its errors, 401 included, take OpenAI's shape).
pub fn owns(path: &str) -> bool {
    path == "/v1/models"
        || path.starts_with("/v1/models/")
        || path == "/v1/chat/completions"
        || path == "/v1/responses"
        || path.starts_with("/v1/responses/")
}

/// The routes, merged into the application router (`crate::api::router`).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/responses", post(create_response))
        .route("/v1/responses/{id}", get(retrieve_response))
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/v1/chat/completions", post(create_chat_completion))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*id}", get(retrieve_model))
}

/// Longest a cancel waits for the terminal event it caused before answering the Response
/// as it stands.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Beyond an execution's deadline, how long a waiting request gives the runtime to write the
/// terminal event (the deadline sweeper writes it within 2 s, contract.md section 8).
const DEADLINE_SLACK: Duration = Duration::from_secs(5);

async fn list_models(State(state): State<AppState>) -> Response {
    json_response(
        StatusCode::OK,
        &model::list(&state.inner.capabilities.manifests()),
    )
}

/// `GET /v1/models/{id}` (an id may be `provider/model`): 404 `model_not_found` for a name
/// `/v1/models` does not list.
async fn retrieve_model(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, OpenAiError> {
    let Ok(Path(id)) = path else {
        return Err(OpenAiError::model_not_found());
    };
    let found = model::find(&state.inner.capabilities.manifests(), &id);
    let found = found.ok_or_else(OpenAiError::model_not_found)?;
    Ok(json_response(StatusCode::OK, &found))
}

/// What a create submitted: the execution and the permit of the stream it answers with.
struct Created {
    submission: protocol::snapshot::ExecutionSubmission,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Created {
    fn id(&self) -> ExecutionId {
        self.submission.execution_id
    }
}

/// What both creates take from their request: the state, the caller, the headers and the
/// body, which [`Create::submit`] submits.
struct Create {
    state: AppState,
    principal: Principal,
    headers: HeaderMap,
    body: Body,
}

impl FromRequest<AppState> for Create {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let principal = Principal::from_request_parts(&mut parts, state).await?;
        Ok(Self {
            state: state.clone(),
            principal,
            headers: parts.headers,
            body,
        })
    }
}

impl Create {
    /// The submission steps both creates share: scope, shutdown, headers, body, model, the
    /// native request and the native flow.
    /// Takes the body: a create submits once.
    async fn submit<T: CreateRequest>(&mut self) -> Result<(T, Created), OpenAiError> {
        let state = &self.state;
        self.principal.require(Scope::Submit)?;
        if state.is_stopping() {
            return Err(ApiError::Unavailable("Runtime is shutting down").into());
        }
        json_headers(state, &self.headers)?;
        let key = idempotency_key(&self.headers)?;
        let bytes = read_body(
            std::mem::take(&mut self.body),
            state.inner.limits.max_body_bytes,
        )
        .await?;
        // Parsed on the blocking pool when large, as native bodies are.
        let body_bytes = bytes.len();
        let parsed = apart(body_bytes, move || T::parse(&bytes)).await??;
        let (model_name, _, streaming) = parsed.plan();
        let manifests = state.inner.capabilities.manifests();
        let resolved = model::resolve(&manifests, model_name)?;
        let dialect = state.dialect(&resolved.provider);
        // The native request (a JSON tree of the input, then its parse) is built on the
        // blocking pool too when the body was large.
        let (parsed, resolved, request) = apart(body_bytes, move || {
            let request = translate::execution_request(parsed.plan().1, &resolved, dialect);
            (parsed, resolved, request)
        })
        .await?;
        let mut request: ExecutionRequest = request?;
        let targets = state.inner.capabilities.targets(&request);
        translate::pin_to_model(&mut request, &resolved, targets)?;
        // Reserved before anything is created, as for native streams.
        let permit = if streaming {
            Some(stream_permit(state)?)
        } else {
            None
        };
        // The caller's trace continues into the job, as for native submits (only a well-formed
        // W3C value, never caller text).
        let traceparent = self
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_traceparent(v))
            .map(str::to_owned);
        let submitted = submit::submit(
            state,
            &self.principal.tenant,
            request,
            body_bytes,
            key,
            traceparent,
        )
        .await;
        state.metrics().count_submission(&submitted);
        let submission = submitted?;
        Ok((parsed, Created { submission, permit }))
    }
}

async fn create_response(mut create: Create) -> Result<Response, OpenAiError> {
    let (request, created) = create.submit::<ResponsesRequest>().await?;
    let state = create.state;
    let id = created.id();
    if let Some(permit) = created.permit {
        return sse(&state, id, permit, Grammar::responses(None)).await;
    }
    let projection = match (request.background, created.submission.idempotent_replay) {
        // A new background response is answered as accepted (`queued`), whatever a worker
        // did since: the log's first event, which the submission already knows.
        (true, false) => Projection::new(&protocol::RuntimeEvent::new(
            id,
            Sequence(1),
            created.submission.created_at,
            protocol::EventBody::Accepted,
        )),
        // A retried background create answers the response as it stands.
        (true, true) => load(&state, id).await?,
        (false, _) => wait_terminal(&state, id, state.deadline_bound()).await?,
    };
    Ok(json_response(StatusCode::OK, &projection.response()))
}

async fn create_chat_completion(mut create: Create) -> Result<Response, OpenAiError> {
    let (request, created) = create.submit::<ChatRequest>().await?;
    let state = create.state;
    let id = created.id();
    if let Some(permit) = created.permit {
        let grammar = Grammar::Chat(chat::Chunks::new(request.include_usage));
        return sse(&state, id, permit, grammar).await;
    }
    let projection = wait_terminal(&state, id, state.deadline_bound()).await?;
    match projection.status() {
        protocol::ExecutionStatus::Succeeded => Ok(json_response(
            StatusCode::OK,
            &chat::completion(&projection),
        )),
        status if status.is_terminal() => Err(OpenAiError::execution_failed(
            &projection
                .error()
                .cloned()
                .unwrap_or_else(protocol::RuntimeError::internal),
        )),
        _ => Err(OpenAiError::execution_failed(
            &protocol::RuntimeError::deadline_exceeded(),
        )),
    }
}

/// `stream` and `starting_after` of a retrieve.
fn stream_query(query: Option<&str>) -> Result<(bool, Option<u64>), OpenAiError> {
    let mut stream = false;
    let mut after = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "stream" => stream = v == "true",
            "starting_after" => {
                after = Some(v.parse::<u64>().map_err(|_| {
                    OpenAiError::invalid(
                        "starting_after",
                        "starting_after must be a non-negative integer",
                    )
                })?);
            }
            _ => {}
        }
    }
    Ok((stream, after))
}

async fn retrieve_response(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, OpenAiError> {
    principal.require(Scope::Read)?;
    let id = owned(&state, &principal, path).await?;
    let (streaming, after) = stream_query(query.as_deref())?;
    if streaming {
        let permit = stream_permit(&state)?;
        return sse(&state, id, permit, Grammar::responses(after)).await;
    }
    Ok(json_response(
        StatusCode::OK,
        &load(&state, id).await?.response(),
    ))
}

async fn cancel_response(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, OpenAiError> {
    principal.require(Scope::Cancel)?;
    let id = owned(&state, &principal, path).await?;
    // `false`: already terminal; the cancel is then a no-op and the answer the same Response.
    submit::cancel(&state, id).await?;
    let projection = wait_terminal(&state, id, CANCEL_WAIT).await?;
    Ok(json_response(StatusCode::OK, &projection.response()))
}

/// The execution a path names, when the caller's tenant owns it; else 404, the same answer
/// as for an unknown id (a segment that does not decode names nothing either).
async fn owned(
    state: &AppState,
    principal: &Principal,
    path: Result<Path<String>, PathRejection>,
) -> Result<ExecutionId, OpenAiError> {
    let Ok(Path(raw)) = path else {
        return Err(OpenAiError::response_not_found());
    };
    let id = id::parse(&raw).ok_or_else(OpenAiError::response_not_found)?;
    match state.backend().store.owner(id).await? {
        Some(owner) if owner == principal.tenant => Ok(id),
        _ => Err(OpenAiError::response_not_found()),
    }
}

/// The execution's log from its first event, answered as SSE in `grammar`.
async fn sse(
    state: &AppState,
    id: ExecutionId,
    permit: tokio::sync::OwnedSemaphorePermit,
    grammar: Grammar,
) -> Result<Response, OpenAiError> {
    let records = subscribe(state, id).await?;
    Ok(stream::sse_response(state, records, permit, grammar))
}

async fn subscribe(state: &AppState, id: ExecutionId) -> Result<runtime::EventStream, OpenAiError> {
    state
        .backend()
        .store
        .subscribe(id, Sequence::ZERO)
        .await?
        .ok_or_else(OpenAiError::response_not_found)
}

/// The log as it stands, folded.
async fn load(state: &AppState, id: ExecutionId) -> Result<Projection, OpenAiError> {
    const PAGE: usize = 1024;
    let store = &state.backend().store;
    let mut after = Sequence::ZERO;
    let mut projection: Option<Projection> = None;
    let mut sink = Vec::new();
    loop {
        let page = store
            .read(id, after, PAGE)
            .await?
            .ok_or_else(OpenAiError::response_not_found)?;
        for record in &page {
            sink.clear();
            projection
                .get_or_insert_with(|| Projection::new(&record.event))
                .apply(&record.event, &mut sink);
            after = record.event.sequence;
        }
        if page.len() < PAGE {
            break;
        }
    }
    projection.ok_or_else(OpenAiError::response_not_found)
}

/// The log folded up to its terminal event, or as it stands after `bound`.
async fn wait_terminal(
    state: &AppState,
    id: ExecutionId,
    bound: Duration,
) -> Result<Projection, OpenAiError> {
    let mut records = subscribe(state, id).await?;
    let mut projection: Option<Projection> = None;
    let mut sink = Vec::new();
    let folded = tokio::time::timeout(bound, async {
        while let Some(record) = records.next().await {
            let record = record?;
            sink.clear();
            let p = projection.get_or_insert_with(|| Projection::new(&record.event));
            p.apply(&record.event, &mut sink);
            if p.is_terminal() {
                break;
            }
        }
        Ok::<(), runtime::StoreError>(())
    })
    .await;
    match folded {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.into()),
        Err(_elapsed) => {}
    }
    if projection.as_ref().is_some_and(Projection::is_terminal) {
        // The tenant's quota slot is free before the client sees the end.
        crate::quota::release_ended(state, id).await;
    }
    match projection {
        Some(p) => Ok(p),
        None => load(state, id).await,
    }
}

impl AppState {
    /// How the adapter of `provider` reads OpenAI's request fields.
    fn dialect(&self, provider: &str) -> Dialect {
        self.inner
            .provider_types
            .get()
            .and_then(|types| types.get(provider))
            .map_or(Dialect::Plain, |t| Dialect::of_type(t))
    }

    /// How long a create waits for its execution's terminal event: the default deadline (an
    /// OpenAI request sets none) and the slack for the runtime to write it.
    fn deadline_bound(&self) -> Duration {
        Duration::from_millis(self.inner.limits.default_deadline_ms) + DEADLINE_SLACK
    }

    /// Records each provider's deployment `type`, so the OpenAI routes write the extension its
    /// adapter reads. Set once at startup; without it every provider gets input only.
    pub fn set_provider_types<'a>(&self, types: impl IntoIterator<Item = (&'a str, &'static str)>) {
        let types = types
            .into_iter()
            .map(|(id, t)| (id.to_owned(), t))
            .collect();
        if self.inner.provider_types.set(types).is_err() {
            tracing::debug!("provider types were already set");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrieve_query_reads_stream_and_cursor() {
        assert_eq!(stream_query(None).ok(), Some((false, None)));
        assert_eq!(
            stream_query(Some("stream=true&starting_after=7")).ok(),
            Some((true, Some(7)))
        );
        assert!(stream_query(Some("stream=true&starting_after=-1")).is_err());
        assert!(owns("/v1/responses/resp_1/cancel") && owns("/v1/models"));
        assert!(!owns("/v1/executions"));
    }
}
