//! What the text adapters share (openai-responses, openai-chat, anthropic-messages): what an
//! adapter keeps from its section (`providers::text`, where the section is parsed and its
//! manifest and policy live), the attempt of the OpenAI-compatible ones, and JSON input parts
//! rendered as text.

use config::BaseUrl;
use protocol::json::RawJson;
use protocol::manifest::ProviderManifest;
use protocol::{ExecutionRequest, RuntimeError};
pub use providers::text::{TextKind, TextProviderConfig};

use super::credential::{self, KeySource};
use super::frame_loop::{self, FrameMapper};
use super::{ProviderCall, ProviderSink, http};

/// A JSON part as text: its compact serialization.
pub fn json_text(value: &RawJson) -> Result<String, RuntimeError> {
    Ok(value.compact())
}

/// What a text adapter keeps from its section: where to send, with which credential, whether
/// tools are enabled, and the manifest; and the attempt of the OpenAI-compatible ones.
#[derive(Debug)]
pub struct TextTarget {
    pub base_url: BaseUrl,
    pub key: KeySource,
    pub tools: bool,
    pub manifest: ProviderManifest,
}

impl TextTarget {
    /// The target of a deployment entry, with its credential from `key`.
    pub fn new(config: &TextProviderConfig, key: KeySource) -> Self {
        Self {
            base_url: config.base_url.clone(),
            key,
            tools: config.tools,
            manifest: config.manifest(),
        }
    }

    /// The extension policy of text type `kind` for this section [R 68]: the same check the
    /// gateway makes at submit (`providers::text`).
    pub fn admits(&self, request: &ExecutionRequest, kind: &TextKind) -> bool {
        kind.admits(request, self.tools)
    }

    /// One OpenAI-compatible attempt (openai-responses, openai-chat): `body` POSTed to
    /// `{base}/{path}` with a bearer credential read now, its event stream read through
    /// `mapper` by the frame loop.
    pub async fn bearer_attempt(
        &self,
        path: &str,
        body: &str,
        call: &ProviderCall<'_>,
        sink: &mut dyn ProviderSink,
        mapper: &mut dyn FrameMapper,
    ) -> Result<(), RuntimeError> {
        let endpoint = http::endpoint(&self.base_url, path)?;
        let key = self.key.resolve()?;
        let request = http::sse_post(endpoint, credential::bearer(&key)?, body)?;
        frame_loop::run(request, &call.cancel, sink, mapper).await
    }
}
