//! What the two OpenAI-compatible adapters share: [`OpenAiCompatible`], the provider of a
//! text section that POSTs a JSON body with a bearer credential and reads an event stream.
//! Users: `openai-responses` (the Responses API) and `openai-chat` (Chat Completions).
//!
//! The one decision a reader must know: an [`OpenAiDialect`] is only the translation (which
//! extension key and tool fields it reads, which path it posts to, how the body is built and
//! how frames map to events); the manifest, the extension policy and the attempt itself are
//! the same for every dialect, so they live here once.

use std::fmt;
use std::marker::PhantomData;

use async_trait::async_trait;
use protocol::manifest::ProviderManifest;
use protocol::{ExecutionRequest, RuntimeError};

use super::credential::KeySource;
use super::frame_loop::FrameMapper;
use super::text::{TextProviderConfig, TextTarget};
use super::{Provider, ProviderCall, ProviderSink};

/// One OpenAI-compatible API: what differs between the adapters built on [`OpenAiCompatible`].
pub trait OpenAiDialect: Send + Sync + 'static {
    /// The `extensions` key whose `request` object seeds the body.
    const EXTENSION_KEY: &'static str;
    /// Extension fields that enable tools; refused unless the deployment declared
    /// `capabilities.tools` [R 68].
    const TOOL_FIELDS: &'static [&'static str];
    /// The path below the base URL one attempt POSTs to.
    const PATH: &'static str;
    /// The stream state of one attempt.
    type Mapper: FrameMapper + Default;

    /// The request body: the extension's object, then the runtime-owned fields over it. Fails
    /// only for inputs routing should not have admitted, or JSON that cannot be rendered.
    fn body(call: &ProviderCall<'_>) -> Result<String, RuntimeError>;
}

/// An adapter speaking dialect `D`. See the module docs.
pub struct OpenAiCompatible<D> {
    target: TextTarget,
    dialect: PhantomData<fn() -> D>,
}

impl<D> fmt::Debug for OpenAiCompatible<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("target", &self.target)
            .finish()
    }
}

impl<D: OpenAiDialect> OpenAiCompatible<D> {
    /// The adapter for a deployment entry, with its credential from `config.api_key_env`.
    pub fn from_config(config: &TextProviderConfig) -> Self {
        Self::new(config, KeySource::Env(config.api_key_env.clone()))
    }

    /// The adapter for a deployment entry with an explicit credential source (tests).
    pub fn new(config: &TextProviderConfig, key: KeySource) -> Self {
        Self {
            target: TextTarget::new(config, key),
            dialect: PhantomData,
        }
    }

    /// The body one attempt would send for `call`.
    pub fn body(&self, call: &ProviderCall<'_>) -> Result<String, RuntimeError> {
        D::body(call)
    }
}

#[async_trait]
impl<D: OpenAiDialect> Provider for OpenAiCompatible<D> {
    fn manifest(&self) -> &ProviderManifest {
        &self.target.manifest
    }

    fn admits(&self, request: &ExecutionRequest) -> bool {
        self.target
            .admits(request, D::EXTENSION_KEY, D::TOOL_FIELDS)
    }

    async fn execute(
        &self,
        call: ProviderCall<'_>,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        let body = D::body(&call)?;
        let mut mapper = D::Mapper::default();
        self.target
            .bearer_attempt(D::PATH, &body, &call, sink, &mut mapper)
            .await
    }
}
