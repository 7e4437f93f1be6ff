//! What the text adapters share (openai-responses, openai-chat, anthropic-messages): their
//! section of the deployment file [R 63-68], its parsing, their manifest, and JSON input parts
//! rendered as text.
//!
//! The one decision a reader must know: the declared `capabilities` are the whole truth about
//! a text provider [R 68]. The manifest publishes exactly them, and each adapter refuses tool
//! fields in its extension unless `capabilities.tools` is true.

use config::{BaseUrl, ConfigError, Fields, FlowLimits};
use protocol::json::RawJson;
use protocol::manifest::{ModelCapability, ProviderManifest};
use protocol::request::Modality;
use protocol::{ExecutionRequest, RuntimeError};
use serde_json::Value;

use super::catalog::{ProviderType, section_from_fields};
use super::credential::{self, KeySource};
use super::frame_loop::{self, FrameMapper};
use super::{Provider, ProviderCall, ProviderSink, extension, http, manifest};

const TEXT_FIELDS: &[&str] = &[
    "type",
    "id",
    "model",
    "abilities",
    "api_key_env",
    "base_url",
    "capabilities",
    "max_concurrency",
    "max_queue_depth",
];
const CAPABILITY_FIELDS: &[&str] = &["input_modalities", "tools"];
const TEXT_DEFAULT_INPUTS: &[Modality] = &[Modality::Text, Modality::Json];

/// A text provider's section: `openai-responses`, `anthropic-messages` and `openai-chat`
/// [R 63-68].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextProviderConfig {
    /// Default `openai`, `anthropic` or `openai-chat`.
    pub id: String,
    pub model: String,
    /// Default `["text-generation"]`.
    pub abilities: Vec<String>,
    /// Name of the environment variable holding the credential, read at execution time.
    pub api_key_env: String,
    /// Default `https://api.openai.com/v1` or `https://api.anthropic.com`; required for
    /// `openai-chat`.
    pub base_url: BaseUrl,
    /// `capabilities.input_modalities`; default `[text, json]`. `openai-responses` may also
    /// declare `image` and `file`, the other two `image`.
    pub input_modalities: Vec<Modality>,
    /// `capabilities.tools`; default false.
    pub tools: bool,
    pub flow: FlowLimits,
}

/// A text adapter: its `type` and section defaults. Through this, every text adapter is a
/// [`ProviderType`] whose section is a [`TextProviderConfig`].
pub trait TextAdapter: Provider + Sized {
    /// The `type` the file names it by.
    const NAME: &'static str;
    /// What its section defaults to and may declare.
    const KIND: TextKind;
    /// The adapter for a parsed section, with its credential from `api_key_env`.
    fn from_section(config: &TextProviderConfig) -> Self;
}

impl<T: TextAdapter> ProviderType for T {
    const NAME: &'static str = <T as TextAdapter>::NAME;
    type Config = TextProviderConfig;

    fn parse(section: &Value, path: String) -> Result<TextProviderConfig, ConfigError> {
        TextProviderConfig::parse(section, path, &T::KIND)
    }

    fn build(config: &TextProviderConfig) -> Self {
        T::from_section(config)
    }
}

/// What differs between the text adapters' sections.
#[derive(Debug, Clone, Copy)]
pub struct TextKind {
    /// The default provider id.
    pub id: &'static str,
    /// The default base URL; `None` makes `base_url` required.
    pub base_url: Option<&'static str>,
    /// Input modalities the adapter can send; a deployment declares a subset [R 68].
    pub supported_inputs: &'static [Modality],
}

impl TextProviderConfig {
    /// Parses a text provider's section at `path`.
    pub fn parse(value: &Value, path: String, kind: &TextKind) -> Result<Self, ConfigError> {
        let fields = Fields::open(value, path, TEXT_FIELDS)?;
        let id = fields.name("id", Some(kind.id))?;
        let model = fields.name("model", None)?;
        let abilities = fields.names("abilities")?;
        let api_key_env = fields.env_name("api_key_env")?;
        let base_url = fields.base_url("base_url", kind.base_url)?;
        let (input_modalities, tools) = match fields.get("capabilities") {
            None => (TEXT_DEFAULT_INPUTS.to_vec(), false),
            Some(value) => {
                let capabilities =
                    Fields::open(value, fields.path_of("capabilities"), CAPABILITY_FIELDS)?;
                (
                    capabilities.modalities(
                        "input_modalities",
                        TEXT_DEFAULT_INPUTS,
                        kind.supported_inputs,
                    )?,
                    capabilities.boolean("tools", false)?,
                )
            }
        };
        Ok(TextProviderConfig {
            id,
            model,
            abilities,
            api_key_env,
            base_url,
            input_modalities,
            tools,
            flow: FlowLimits::parse(&fields)?,
        })
    }

    /// The manifest: exactly the deployment's declaration, streamed text out [R 68].
    pub fn manifest(&self) -> ProviderManifest {
        let model = ModelCapability {
            input_modalities: self.input_modalities.clone(),
            tools: self.tools,
            ..ModelCapability::streamed_text(self.model.clone(), self.abilities.clone())
        };
        manifest::single_model(&self.id, model, self.flow)
    }
}

/// A JSON part as text: its compact serialization.
pub fn json_text(value: &RawJson) -> Result<String, RuntimeError> {
    Ok(value.compact())
}

section_from_fields!(TextProviderConfig);

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

    /// The extension policy of an adapter reading `extensions.<key>.request` whose tool
    /// fields are `tool_fields` [R 68].
    pub fn admits(&self, request: &ExecutionRequest, key: &str, tool_fields: &[&str]) -> bool {
        let forbidden = if self.tools { &[][..] } else { tool_fields };
        extension::admits(request, key, "request", forbidden)
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
