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
use protocol::manifest::ProviderManifest;
use protocol::{ExecutionRequest, RuntimeError};
use url::Url;

use super::credential::{self, KeySource, Secret};
use super::text::{TextProviderConfig, TextTarget};
use super::{AttemptResult, Provider, ProviderCall, ProviderSink, frame_loop, http};
use providers::text::ANTHROPIC_MESSAGES;
use stream::MessageStream;

/// Extension fields that enable tools in the Messages API; refused unless the deployment
/// declared `capabilities.tools` [R 68].
pub const TOOL_FIELDS: &[&str] = ANTHROPIC_MESSAGES.tool_fields;

/// See the module docs.
#[derive(Debug)]
pub struct AnthropicMessagesProvider {
    target: TextTarget,
    /// `{base}/v1/messages`; `None` only if the base URL cannot take a path (never for a
    /// parsed [`::config::BaseUrl`]).
    endpoint: Option<Url>,
}

impl AnthropicMessagesProvider {
    /// The adapter for a deployment entry, reading `api_key_env` at execution time.
    pub fn from_config(config: &TextProviderConfig) -> Self {
        Self::new(config, KeySource::Env(config.api_key_env.clone()))
    }

    /// The adapter for a deployment entry with an explicit credential source (tests).
    pub fn new(config: &TextProviderConfig, key: KeySource) -> Self {
        Self {
            endpoint: config.base_url.endpoint(wire::MESSAGES_PATH),
            target: TextTarget::new(config, key),
        }
    }

    async fn stream(
        &self,
        call: &ProviderCall<'_>,
        key: &Secret,
        body: &str,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        let endpoint = self.endpoint.clone().ok_or_else(RuntimeError::internal)?;
        let request = http::client()?
            .post(endpoint)
            .header("x-api-key", credential::header(key.expose())?)
            .header("anthropic-version", wire::API_VERSION)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_owned());
        frame_loop::run(request, &call.cancel, sink, &mut MessageStream::new()).await
    }
}

#[async_trait]
impl Provider for AnthropicMessagesProvider {
    fn manifest(&self) -> &ProviderManifest {
        &self.target.manifest
    }

    /// Refuses a non-object `extensions.anthropic` or `extensions.anthropic.request`, and
    /// `tools` / `tool_choice` in it when the deployment disabled tools [R 68].
    fn admits(&self, request: &ExecutionRequest) -> bool {
        self.target.admits(request, &ANTHROPIC_MESSAGES)
    }

    async fn execute(&self, call: ProviderCall<'_>, sink: &mut dyn ProviderSink) -> AttemptResult {
        // The body first: a request the adapter cannot express fails before the credential is
        // read.
        let body = wire::request_body(call.request, call.model)?;
        let key = self.target.key.resolve()?;
        self.stream(&call, &key, &body, sink)
            .await
            .map_err(|error| credential::scrub(error, &key))
    }
}
