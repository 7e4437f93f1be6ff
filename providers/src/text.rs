//! The text provider types (openai-responses, anthropic-messages, openai-chat): their
//! section of the deployment file [R 63-68], its parsing, their manifest, and their request
//! policy; one [`TextKind`] per type says what differs.
//!
//! The one decision a reader must know: the declared `capabilities` are the whole truth about
//! a text provider [R 68]. The manifest publishes exactly them, and each type refuses tool
//! fields in its extension unless `capabilities.tools` is true.

use config::{BaseUrl, ConfigError, Fields, FlowLimits};
use protocol::ExecutionRequest;
use protocol::manifest::{ModelCapability, ProviderManifest};
use protocol::request::Modality;
use serde_json::Value;

use crate::{extension, manifest};

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

/// What differs between the text provider types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextKind {
    /// The `type` the file names it by.
    pub name: &'static str,
    /// The default provider id.
    pub id: &'static str,
    /// The default base URL; `None` makes `base_url` required.
    pub base_url: Option<&'static str>,
    /// Input modalities the adapter can send; a deployment declares a subset [R 68].
    pub supported_inputs: &'static [Modality],
    /// The `extensions` key the adapter reads (`extensions.<key>.request`).
    pub extension_key: &'static str,
    /// Extension fields that enable tools; refused unless the deployment declared
    /// `capabilities.tools` [R 68].
    pub tool_fields: &'static [&'static str],
}

/// `openai-responses`: OpenAI's defaults and the inputs the Responses API takes [R 63, 68].
pub const OPENAI_RESPONSES: TextKind = TextKind {
    name: "openai-responses",
    id: "openai",
    base_url: Some("https://api.openai.com/v1"),
    supported_inputs: &[
        Modality::Text,
        Modality::Json,
        Modality::Image,
        Modality::File,
    ],
    extension_key: "openai",
    tool_fields: &["tools", "tool_choice"],
};

/// `anthropic-messages`: Anthropic's defaults and the inputs the Messages API takes
/// [R 66-68].
pub const ANTHROPIC_MESSAGES: TextKind = TextKind {
    name: "anthropic-messages",
    id: "anthropic",
    base_url: Some("https://api.anthropic.com"),
    supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
    extension_key: "anthropic",
    tool_fields: &["tools", "tool_choice"],
};

/// `openai-chat`: no default base URL (the deployment names its server); images by URL,
/// files and audio only inline, which URI parts are not.
pub const OPENAI_CHAT: TextKind = TextKind {
    name: "openai-chat",
    id: "openai-chat",
    base_url: None,
    supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
    extension_key: "openai-chat",
    tool_fields: &["tools", "tool_choice", "functions", "function_call"],
};

impl TextKind {
    /// The extension policy of this type for a section with `tools` enabled or not: the
    /// extension, when present, is an object without the tool fields unless tools are
    /// enabled [R 68].
    pub fn admits(&self, request: &ExecutionRequest, tools: bool) -> bool {
        let forbidden = if tools { &[][..] } else { self.tool_fields };
        extension::admits(request, self.extension_key, "request", forbidden)
    }
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
