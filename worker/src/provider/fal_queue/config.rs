//! The `fal-queue` section of the deployment file [R 69-73].

use config::{BaseUrl, ConfigError, Fields, FlowLimits};
use protocol::request::Modality;
use serde_json::Value;

use super::FalQueueProvider;
use crate::provider::catalog::{ProviderType, section_from_fields};

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

section_from_fields!(FalConfig);

impl ProviderType for FalQueueProvider {
    const NAME: &'static str = "fal-queue";
    type Config = FalConfig;

    fn parse(section: &Value, path: String) -> Result<FalConfig, ConfigError> {
        FalConfig::parse(section, path)
    }

    fn build(config: &FalConfig) -> Self {
        Self::from_config(config)
    }
}
