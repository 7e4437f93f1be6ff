//! What the two OpenAI-compatible adapters share: [`OpenAiCompatible`], the provider of a
//! text section that POSTs a JSON body with a bearer credential and reads an event stream.
//! Users: `openai-responses` (the Responses API) and `openai-chat` (Chat Completions).
//!
//! The one decision a reader must know: an [`OpenAiDialect`] is only the translation (which
//! extension key and tool fields it reads, which path it posts to, which body fields it owns,
//! how input parts are written and how frames map to events); the manifest, the extension
//! policy, the body's layout (one user message) and the attempt itself are the same for every
//! dialect, so they live here once.

use std::fmt;
use std::marker::PhantomData;

use async_trait::async_trait;
use protocol::manifest::ProviderManifest;
use protocol::request::InputPart;
use protocol::{ExecutionRequest, RuntimeError};
use serde::Serialize;

use super::credential::KeySource;
use super::frame_loop::FrameMapper;
use super::text::{TextKind, TextProviderConfig, TextTarget};
use super::{AttemptResult, Provider, ProviderCall, ProviderSink, extension};

/// One OpenAI-compatible API: what differs between the adapters built on [`OpenAiCompatible`].
pub trait OpenAiDialect: Send + Sync + 'static {
    /// Its provider type: the `extensions` key whose `request` object seeds the body, and
    /// the tool fields refused unless the deployment declared `capabilities.tools` [R 68].
    const KIND: TextKind;
    /// The path below the base URL one attempt POSTs to.
    const PATH: &'static str;
    /// The body field that holds the one user message (`messages`, `input`).
    const MESSAGES_FIELD: &'static str;
    /// The runtime-owned field written after `stream`: its name and its JSON text.
    const OWNED_FIELD: (&'static str, &'static str);
    /// The stream state of one attempt.
    type Mapper: FrameMapper + Default;
    /// One part of the user message's `content`, as this API writes it.
    type Part<'a>: Serialize;

    /// Maps one input part. Routing admits only the declared modalities, so the error arm is
    /// a guard, not a path callers reach.
    fn part(part: &InputPart) -> Result<Self::Part<'_>, RuntimeError>;

    /// The request body: the extension's object, then the runtime-owned fields over it:
    /// `model`, [`MESSAGES_FIELD`](Self::MESSAGES_FIELD) with one user message holding every
    /// input part, `stream: true`, and [`OWNED_FIELD`](Self::OWNED_FIELD). Fails only for
    /// inputs routing should not have admitted, or JSON that cannot be rendered.
    fn body(call: &ProviderCall<'_>) -> Result<String, RuntimeError> {
        let content = call
            .request
            .input
            .iter()
            .map(Self::part)
            .collect::<Result<Vec<_>, _>>()?;
        let messages = vec![UserMessage {
            role: "user",
            content,
        }];
        extension::body_over(
            call.request,
            Self::KIND.extension_key,
            "request",
            &[],
            &[
                ("model", &extension::to_json(call.model)?),
                (Self::MESSAGES_FIELD, &extension::to_json(&messages)?),
                ("stream", "true"),
                Self::OWNED_FIELD,
            ],
        )
    }
}

/// The one message of a body: `{role: "user", content: [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserMessage<P> {
    /// Always `user`.
    pub role: &'static str,
    /// The input parts, in order.
    pub content: Vec<P>,
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
        self.target.admits(request, &D::KIND)
    }

    async fn execute(&self, call: ProviderCall<'_>, sink: &mut dyn ProviderSink) -> AttemptResult {
        let body = D::body(&call)?;
        let mut mapper = D::Mapper::default();
        self.target
            .bearer_attempt(D::PATH, &body, &call, sink, &mut mapper)
            .await
    }
}

/// Test helpers shared by the dialects' unit tests.
#[cfg(test)]
pub(crate) mod test_kit {
    use ::config::{BaseUrl, FlowLimits};
    use protocol::request::Modality;
    use tokio_util::sync::CancellationToken;

    use super::{OpenAiCompatible, OpenAiDialect};
    use crate::provider::ProviderCall;
    use crate::provider::text::TextProviderConfig;

    /// A text-generation section `id` serving `model` at `base_url` with these inputs and
    /// tools; its key variable is never set.
    pub(crate) fn text_config(
        id: &str,
        model: &str,
        base_url: &str,
        input_modalities: &[Modality],
        tools: bool,
    ) -> TextProviderConfig {
        TextProviderConfig {
            id: id.into(),
            model: model.into(),
            abilities: vec!["text-generation".into()],
            api_key_env: "MRT_TEST_UNSET_DIALECT_KEY".into(),
            base_url: BaseUrl::parse(base_url).unwrap(),
            input_modalities: input_modalities.to_vec(),
            tools,
            flow: FlowLimits::CONFIG_DEFAULT,
        }
    }

    /// The body `provider` would send for the request `request_json` routed to `model`.
    pub(crate) fn body_json<D: OpenAiDialect>(
        provider: &OpenAiCompatible<D>,
        request_json: &str,
        model: &str,
    ) -> serde_json::Value {
        let request = protocol::validate::parse_request(request_json.as_bytes()).unwrap();
        let call = ProviderCall {
            request: &request,
            model,
            cancel: CancellationToken::new(),
        };
        serde_json::from_str(&provider.body(&call).unwrap()).unwrap()
    }
}
