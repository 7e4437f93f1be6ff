//! `Client`: one method per endpoint of contract.md section 2.
//!
//! The decision a reader must know: the client repeats a call by itself only when repeating
//! cannot change what happens on the server. Reads (`get`, `result`, `providers`,
//! `runtime_info`, event streams) are retried after transport failures and retryable API errors;
//! a submission is retried only when it carries an idempotency key (the key makes the repeat a
//! replay, never a second execution); a cancellation is never retried (a repeat after a lost
//! 202 would answer 404 and turn success into "not found").

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use protocol::manifest::{ProviderList, ProviderManifest};
use protocol::snapshot::{
    ExecutionResultResponse, ExecutionSubmission, ResultNotReady, RuntimeInfo,
};
use protocol::{ExecutionId, ExecutionRequest, ExecutionSnapshot, Sequence};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

use crate::base_url::{BaseUrl, check_cursor};
use crate::error::{ClientError, api_error};
use crate::events::EventStream;
use crate::idempotency::IdempotencyKey;
use crate::retry::RetryPolicy;

/// Largest JSON response body read (a result holds at most one execution's output).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Largest error body read; the rest is discarded.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Options of [`Client::submit`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// Sent as `Idempotency-Key`; makes the submission safe to repeat (and retried
    /// automatically after transient failures).
    pub idempotency_key: Option<IdempotencyKey>,
}

impl SubmitOptions {
    /// Options with this key.
    pub fn with_key(key: IdempotencyKey) -> Self {
        Self {
            idempotency_key: Some(key),
        }
    }

    /// Options with a freshly generated key.
    pub fn idempotent() -> Self {
        Self::with_key(IdempotencyKey::generate())
    }
}

/// Builder of a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: Result<BaseUrl, &'static str>,
    settings: Settings,
    http: Option<reqwest::Client>,
    api_key: Option<ApiKey>,
}

/// Longest API key accepted.
const MAX_API_KEY_BYTES: usize = 4096;

/// An API key, sent as `Authorization: Bearer <key>` (marked sensitive, so HTTP-level logging
/// redacts it). `Debug` never shows it.
#[derive(Clone)]
struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl ApiKey {
    fn header(&self) -> Result<HeaderValue, ClientError> {
        let key = self.0.as_bytes();
        if key.is_empty() || key.len() > MAX_API_KEY_BYTES || !key.iter().all(u8::is_ascii_graphic)
        {
            return Err(ClientError::InvalidApiKey);
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.0))
            .map_err(|_| ClientError::InvalidApiKey)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// Declares [`Settings`], its defaults, and the [`ClientBuilder`] method of each setting, named
/// as it, that replaces it.
macro_rules! settings {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $default:expr,)*) => {
        /// What a [`ClientBuilder`] sets and its [`Client`] keeps.
        #[derive(Debug, Clone)]
        pub(crate) struct Settings {
            $($(#[$doc])* pub(crate) $field: $ty,)*
        }

        impl Default for Settings {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                }
            }
        }

        impl ClientBuilder {
            $(
                $(#[$doc])*
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.settings.$field = $field;
                    self
                }
            )*
        }
    };
}

settings! {
    /// Retries of idempotent calls and of event-stream resumption.
    retry: RetryPolicy = RetryPolicy::default(),
    /// Time allowed to open a connection (default 10 s).
    connect_timeout: Duration = Duration::from_secs(10),
    /// Time allowed for a whole JSON call, and for an event stream's response headers
    /// (default 60 s).
    request_timeout: Duration = Duration::from_secs(60),
    /// Longest silence tolerated on an open event stream before it is treated as lost and
    /// resumed (default 60 s; the gateway sends a keep-alive every 15 s while idle).
    idle_timeout: Duration = Duration::from_secs(60),
    /// Largest JSON response body read (default 16 MiB).
    max_body_bytes: usize = DEFAULT_MAX_BODY_BYTES,
    /// Largest SSE frame accepted (default 1 MiB, the protocol's limit).
    max_frame_bytes: usize = protocol::sse::DEFAULT_MAX_FRAME_BYTES,
}

impl ClientBuilder {
    /// Sends `key` as `Authorization: Bearer <key>` on every call (gateways with an `auth`
    /// section require it). Checked by [`ClientBuilder::build`]; never shown in errors.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey(key.into()));
        self
    }

    /// Uses a preconfigured HTTP client (proxies, TLS roots, ...). `connect_timeout` is then
    /// the given client's business.
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http = Some(client);
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<Client, ClientError> {
        let base = self.base.map_err(ClientError::InvalidBaseUrl)?;
        let authorization = self.api_key.as_ref().map(ApiKey::header).transpose()?;
        let http = match self.http {
            Some(http) => http,
            None => {
                // The process-wide rustls provider for https; "already installed" is fine.
                let _ = rustls::crypto::ring::default_provider().install_default();
                reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(self.settings.connect_timeout)
                    .user_agent(concat!("mrt-client/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(ClientError::transport)?
            }
        };
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                settings: self.settings,
                authorization,
            }),
        })
    }
}

/// A client of one gateway. Cheap to clone; clones share connections.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) http: reqwest::Client,
    pub(crate) base: BaseUrl,
    pub(crate) settings: Settings,
    /// `Bearer <key>`, marked sensitive.
    pub(crate) authorization: Option<HeaderValue>,
}

impl Inner {
    /// Adds the `Authorization` header when the client has an API key.
    pub(crate) fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.authorization {
            Some(value) => request.header(AUTHORIZATION, value.clone()),
            None => request,
        }
    }
}

impl Client {
    /// A client with default settings.
    pub fn new(base_url: &str) -> Result<Self, ClientError> {
        Self::builder(base_url).build()
    }

    /// A builder; the base URL is checked by [`ClientBuilder::build`].
    pub fn builder(base_url: &str) -> ClientBuilder {
        ClientBuilder {
            base: BaseUrl::parse(base_url).map_err(|e| match e {
                ClientError::InvalidBaseUrl(m) => m,
                _ => "invalid",
            }),
            settings: Settings::default(),
            http: None,
            api_key: None,
        }
    }

    /// The gateway's base URL.
    pub fn base_url(&self) -> &BaseUrl {
        &self.inner.base
    }

    /// `POST /v1/executions`: 202 for a new execution, 200 with `idempotent_replay: true` for a
    /// repeated key. With a key, transient failures are retried (as replays).
    pub async fn submit(
        &self,
        request: &ExecutionRequest,
        options: &SubmitOptions,
    ) -> Result<ExecutionSubmission, ClientError> {
        let body = serde_json::to_vec(request).map_err(|_| ClientError::InvalidRequest)?;
        self.submit_body(body, options).await
    }

    /// Like [`Client::submit`] for a request held as JSON (for example read from a file); the
    /// gateway validates it.
    pub async fn submit_json(
        &self,
        request: &serde_json::Value,
        options: &SubmitOptions,
    ) -> Result<ExecutionSubmission, ClientError> {
        let body = serde_json::to_vec(request).map_err(|_| ClientError::InvalidRequest)?;
        self.submit_body(body, options).await
    }

    async fn submit_body(
        &self,
        body: Vec<u8>,
        options: &SubmitOptions,
    ) -> Result<ExecutionSubmission, ClientError> {
        let key = options.idempotency_key.as_ref();
        let url = &self.inner.base.executions();
        let body = &body;
        self.with_retries(key.is_some(), || {
            let mut request = self
                .inner
                .http
                .post(url.clone())
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "application/json")
                .body(body.clone());
            if let Some(key) = key {
                request = request.header("idempotency-key", key.as_str());
            }
            async move {
                let response = self.send(request).await?;
                match response.status() {
                    StatusCode::OK | StatusCode::ACCEPTED => self.read_json(response).await,
                    _ => Err(self.error_of(response).await),
                }
            }
        })
        .await
    }

    /// `GET /v1/executions/{id}`.
    pub async fn get(&self, id: ExecutionId) -> Result<ExecutionSnapshot, ClientError> {
        self.get_json(self.inner.base.execution(id)).await
    }

    /// `GET /v1/executions/{id}/result`. An execution that has not succeeded is
    /// [`ClientError::NotReady`] with its status (and error, once failed or cancelled).
    pub async fn result(&self, id: ExecutionId) -> Result<ExecutionResultResponse, ClientError> {
        let url = &self.inner.base.result(id);
        self.with_retries(true, || async move {
            let response = self.send(self.inner.http.get(url.clone())).await?;
            match response.status() {
                StatusCode::OK => self.read_json(response).await,
                StatusCode::CONFLICT => {
                    let not_ready: ResultNotReady = self.read_json(response).await?;
                    Err(ClientError::NotReady(not_ready))
                }
                _ => Err(self.error_of(response).await),
            }
        })
        .await
    }

    /// `POST /v1/executions/{id}/cancel`: `true` when cancellation was requested, `false` when
    /// the execution is unknown or already terminal (404). Never retried.
    pub async fn cancel(&self, id: ExecutionId) -> Result<bool, ClientError> {
        let request = self.inner.http.post(self.inner.base.cancel(id));
        let response = self.send(request).await?;
        match response.status() {
            StatusCode::ACCEPTED | StatusCode::OK => {
                let _ = self.read_limited(response, MAX_ERROR_BODY_BYTES).await;
                Ok(true)
            }
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.error_of(response).await),
        }
    }

    /// `GET /v1/runtime`. The body is returned for 503 too: its `state` says `stopping` or
    /// `unavailable`.
    pub async fn runtime_info(&self) -> Result<RuntimeInfo, ClientError> {
        let url = &self.inner.base.runtime();
        self.with_retries(true, || async move {
            let response = self.send(self.inner.http.get(url.clone())).await?;
            match response.status() {
                StatusCode::OK | StatusCode::SERVICE_UNAVAILABLE => {
                    let status = response.status().as_u16();
                    let retry_after = retry_after(response.headers());
                    let bytes = self
                        .read_limited(response, self.inner.settings.max_body_bytes)
                        .await?;
                    match serde_json::from_slice(&bytes) {
                        Ok(info) => Ok(info),
                        Err(_) if status == 503 => {
                            Err(ClientError::Api(api_error(status, retry_after, &bytes)))
                        }
                        Err(_) => Err(ClientError::Protocol(
                            "response body is not the expected JSON",
                        )),
                    }
                }
                _ => Err(self.error_of(response).await),
            }
        })
        .await
    }

    /// `GET /v1/providers`: the manifests of the deployment.
    pub async fn providers(&self) -> Result<Vec<ProviderManifest>, ClientError> {
        let list: ProviderList = self.get_json(self.inner.base.providers()).await?;
        Ok(list.data)
    }

    /// The events of `id` strictly after `after`, resumed transparently after truncations and
    /// connection losses, ending with the terminal event. The cursor is checked here, before
    /// any request; nothing is sent until the stream is polled.
    pub fn events(&self, id: ExecutionId, after: Sequence) -> Result<EventStream, ClientError> {
        let after = check_cursor(after)?;
        Ok(EventStream::new(Arc::clone(&self.inner), id, after))
    }

    async fn get_json<T: DeserializeOwned>(&self, url: url::Url) -> Result<T, ClientError> {
        let url = &url;
        self.with_retries(true, || async move {
            let response = self.send(self.inner.http.get(url.clone())).await?;
            if response.status() == StatusCode::OK {
                self.read_json(response).await
            } else {
                Err(self.error_of(response).await)
            }
        })
        .await
    }

    /// Runs `call` until it succeeds, fails for good, or (when `retry` holds) the policy's
    /// budget of transient failures is spent.
    async fn with_retries<T, F, Fut>(&self, retry: bool, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut failures = 0u32;
        loop {
            match call().await {
                Err(e)
                    if retry
                        && e.is_transient()
                        && failures < self.inner.settings.retry.max_retries =>
                {
                    failures += 1;
                    tokio::time::sleep(self.inner.settings.retry.delay(failures, e.retry_after()))
                        .await;
                }
                other => return other,
            }
        }
    }

    /// Sends a JSON call with the whole-call timeout.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        self.inner
            .authorize(request)
            .timeout(self.inner.settings.request_timeout)
            .send()
            .await
            .map_err(ClientError::transport)
    }

    async fn read_json<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, ClientError> {
        let bytes = self
            .read_limited(response, self.inner.settings.max_body_bytes)
            .await?;
        serde_json::from_slice(&bytes)
            .map_err(|_| ClientError::Protocol("response body is not the expected JSON"))
    }

    /// Reads at most `limit` bytes; a longer body is a protocol violation.
    async fn read_limited(
        &self,
        mut response: reqwest::Response,
        limit: usize,
    ) -> Result<BytesMut, ClientError> {
        let mut out = BytesMut::new();
        while let Some(chunk) = response.chunk().await.map_err(ClientError::transport)? {
            if out.len() + chunk.len() > limit {
                return Err(ClientError::Protocol(
                    "response body exceeds the size limit",
                ));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    async fn error_of(&self, response: reqwest::Response) -> ClientError {
        error_of(response, self.inner.settings.request_timeout).await
    }
}

/// The error of a non-success response. The body is read up to a small cap and for at most
/// `within` (a body stalled after its headers, by a proxy or a gateway, must not hang a call
/// that has no whole-request timeout, such as opening an event stream); a body that cannot be
/// read in time still yields an error derived from the status.
pub(crate) async fn error_of(mut response: reqwest::Response, within: Duration) -> ClientError {
    let status = response.status().as_u16();
    let retry_after = retry_after(response.headers());
    let mut body = Vec::new();
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            if body.len() + chunk.len() > MAX_ERROR_BODY_BYTES {
                break;
            }
            body.extend_from_slice(&chunk);
        }
    };
    // What arrived in time is used; the status alone decides when nothing did.
    let _ = tokio::time::timeout(within, read).await;
    ClientError::Api(api_error(status, retry_after, &body))
}

/// `Retry-After` in seconds (the HTTP-date form is not used by the gateway).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// `GET` with `Accept: text/event-stream`.
pub(crate) fn events_request(inner: &Inner, url: url::Url) -> reqwest::RequestBuilder {
    inner.authorize(
        inner
            .http
            .request(Method::GET, url)
            .header(ACCEPT, "text/event-stream"),
    )
}
