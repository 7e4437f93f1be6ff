//! `anthropic-messages`: Anthropic's Messages API with streaming [R 66-68].
//!
//! One attempt is one `POST {base}/v1/messages` with `x-api-key` and
//! `anthropic-version: 2023-06-01`, read as server-sent events until `message_stop`
//! (`stream.rs` has the mapping table, `wire.rs` the body).
//!
//! The one decision a reader must know: capabilities come only from the deployment file
//! (`capabilities.input_modalities`, `capabilities.tools`), never from what the model could do.
//! A request that would smuggle tools past a deployment that disabled them
//! (`extensions.anthropic.request.tools` / `tool_choice`) is refused at routing by
//! [`Provider::admits`], before any credential is read or request sent.

pub mod stream;
pub mod wire;

use async_trait::async_trait;
use protocol::manifest::{ModelCapability, ProviderLimits, ProviderManifest};
use protocol::request::Modality;
use protocol::{ErrorCode, ExecutionRequest, RuntimeError};
use reqwest::header::HeaderValue;
use url::Url;

use super::http::{self, SseStream};
use super::secret::Secret;
use super::{Provider, ProviderCall, ProviderEvent, ProviderSink};
use crate::config::TextProviderConfig;
use stream::{MessageStream, Step};

pub use super::secret::KeySource;

pub(crate) fn credential_unavailable() -> RuntimeError {
    RuntimeError::new(
        ErrorCode::ProviderUnavailable,
        "Required provider credential is unavailable",
        false,
    )
}

/// A header value carrying the credential, marked sensitive so no HTTP layer prints it.
pub(crate) fn credential_header(value: &str) -> Result<HeaderValue, RuntimeError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| credential_unavailable())?;
    header.set_sensitive(true);
    Ok(header)
}

/// Drops a provider code that contains the credential. Provider codes are short tokens taken
/// from provider payloads; a provider echoing the key there must not carry it into an event.
pub(crate) fn scrub(mut error: RuntimeError, key: &Secret) -> RuntimeError {
    if error
        .provider_code
        .as_deref()
        .is_some_and(|code| code.contains(key.expose()))
    {
        error.provider_code = None;
    }
    error
}

/// See the module docs.
#[derive(Debug)]
pub struct AnthropicMessagesProvider {
    id: String,
    tools: bool,
    key: KeySource,
    /// `{base}/v1/messages`; `None` only if the base URL cannot take a path (never for a
    /// parsed [`crate::config::BaseUrl`]).
    endpoint: Option<Url>,
    manifest: ProviderManifest,
}

impl AnthropicMessagesProvider {
    /// The adapter for a deployment entry, reading `api_key_env` at execution time.
    pub fn from_config(config: &TextProviderConfig) -> Self {
        Self::new(config, KeySource::Env(config.api_key_env.clone()))
    }

    /// The adapter for a deployment entry with an explicit credential source (tests).
    pub fn new(config: &TextProviderConfig, key: KeySource) -> Self {
        let manifest = ProviderManifest {
            provider: config.id.clone(),
            protocol_version: protocol::PROTOCOL_VERSION.into(),
            models: vec![ModelCapability {
                model: config.model.clone(),
                abilities: config.abilities.clone(),
                input_modalities: config.input_modalities.clone(),
                output_modalities: vec![Modality::Text],
                stream: true,
                tools: config.tools,
                structured_output: false,
                r#async: false,
                cancel: true,
            }],
            limits: Some(ProviderLimits {
                max_concurrency: config.flow.max_concurrency,
                max_queue_depth: config.flow.max_queue_depth,
            }),
        };
        Self {
            endpoint: config.base_url.endpoint(wire::MESSAGES_PATH),
            id: config.id.clone(),
            tools: config.tools,
            key,
            manifest,
        }
    }

    async fn stream(
        &self,
        call: &ProviderCall<'_>,
        key: &Secret,
        body: &serde_json::Value,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        let endpoint = self.endpoint.clone().ok_or_else(RuntimeError::internal)?;
        let request = http::client()?
            .post(endpoint)
            .header("x-api-key", credential_header(key.expose())?)
            .header("anthropic-version", wire::API_VERSION)
            .json(body);
        let response = tokio::select! {
            biased;
            () = call.cancel.cancelled() => return Err(RuntimeError::cancelled()),
            response = http::send(request) => response?,
        };
        let mut events = SseStream::new(response);
        let mut message = MessageStream::new();
        let mut mapped: Vec<ProviderEvent> = Vec::new();
        loop {
            let next = tokio::select! {
                biased;
                () = call.cancel.cancelled() => return Err(RuntimeError::cancelled()),
                // After a 2xx the provider is working on the request: never retried.
                next = events.next() => next.map_err(RuntimeError::not_retryable)?,
            };
            let Some(event) = next else {
                return Err(RuntimeError::stream_ended_early());
            };
            let step = message.on_event(&event, &mut mapped)?;
            for event in mapped.drain(..) {
                sink.emit(event).await?;
            }
            if step == Step::Completed {
                // Completion ends the attempt: the rest of the response is not read.
                return Ok(());
            }
        }
    }
}

#[async_trait]
impl Provider for AnthropicMessagesProvider {
    fn id(&self) -> &str {
        &self.id
    }

    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    /// Refuses a non-object `extensions.anthropic` or `extensions.anthropic.request`, and
    /// `tools` / `tool_choice` in it when the deployment disabled tools [R 68].
    fn admits(&self, request: &ExecutionRequest) -> bool {
        match wire::extension_object(request, wire::EXTENSION, "request") {
            Err(_) => false,
            Ok(None) => true,
            Ok(Some(extension)) => {
                self.tools
                    || !(extension.contains_key("tools") || extension.contains_key("tool_choice"))
            }
        }
    }

    async fn execute(
        &self,
        call: ProviderCall<'_>,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        // The body first: a request the adapter cannot express fails before the credential is
        // read.
        let body = wire::request_body(call.request, call.model)?;
        let key = self.key.resolve()?;
        self.stream(&call, &key, &body, sink)
            .await
            .map_err(|error| scrub(error, &key))
    }
}
