//! The `fal-queue` section of the deployment file [R 69-73], its manifest (one asynchronous,
//! cancellable model) and its request policy (`extensions.fal.input` must be an object).

use config::{BaseUrl, ConfigError, Fields, FlowLimits};
use protocol::ExecutionRequest;
use protocol::manifest::{ModelCapability, ProviderManifest};
use protocol::request::Modality;
use serde_json::Value;

use crate::{extension, manifest};

/// The `type` the file names it by.
pub const NAME: &str = "fal-queue";

/// The `extensions` key the adapter reads: `extensions.fal.input`.
pub const EXTENSION: &str = "fal";

const FAL_FIELDS: &[&str] = &[
    "type",
    "id",
    "model",
    "ability",
    "api_key_env",
    "base_url",
    "input_modalities",
    "output_modalities",
    "max_concurrency",
    "max_queue_depth",
];
const DEFAULT_INPUTS: &[Modality] = &[Modality::Text, Modality::Json];
const SUPPORTED_INPUTS: &[Modality] = &[Modality::Text, Modality::Json, Modality::Image];
const ALL_MODALITIES: &[Modality] = &[
    Modality::Text,
    Modality::Image,
    Modality::Audio,
    Modality::Video,
    Modality::File,
    Modality::Json,
];

/// `fal-queue` [R 69-73].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FalConfig {
    /// Default `fal`.
    pub id: String,
    pub model: String,
    pub ability: String,
    pub api_key_env: String,
    /// Default `https://queue.fal.run`.
    pub base_url: BaseUrl,
    /// Default `[text, json]`; `image` may be declared.
    pub input_modalities: Vec<Modality>,
    /// Default `[json]`.
    pub output_modalities: Vec<Modality>,
    pub flow: FlowLimits,
}

impl FalConfig {
    /// Parses a `fal-queue` section at `path`.
    pub fn parse(value: &Value, path: String) -> Result<Self, ConfigError> {
        let fields = Fields::open(value, path, FAL_FIELDS)?;
        Ok(FalConfig {
            id: fields.name("id", Some("fal"))?,
            model: fields.name("model", None)?,
            ability: fields.name("ability", None)?,
            api_key_env: fields.env_name("api_key_env")?,
            base_url: fields.base_url("base_url", Some("https://queue.fal.run"))?,
            input_modalities: fields.modalities(
                "input_modalities",
                DEFAULT_INPUTS,
                SUPPORTED_INPUTS,
            )?,
            output_modalities: fields.modalities(
                "output_modalities",
                &[Modality::Json],
                ALL_MODALITIES,
            )?,
            flow: FlowLimits::parse(&fields)?,
        })
    }
}

impl FalConfig {
    /// Exactly the deployment's declaration: one model, asynchronous and cancellable, never
    /// streamed [R 68].
    pub fn manifest(&self) -> ProviderManifest {
        let model = ModelCapability {
            model: self.model.clone(),
            abilities: vec![self.ability.clone()],
            input_modalities: self.input_modalities.clone(),
            output_modalities: self.output_modalities.clone(),
            stream: false,
            tools: false,
            structured_output: false,
            r#async: true,
            cancel: true,
        };
        manifest::single_model(&self.id, model, self.flow)
    }
}

/// Refuses a non-object `extensions.fal` or `extensions.fal.input`.
pub fn admits(request: &ExecutionRequest) -> bool {
    extension::object(request, EXTENSION, "input").is_ok()
}
