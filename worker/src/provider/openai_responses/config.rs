//! The `openai-responses` section of the deployment file: a text provider section with
//! OpenAI's defaults [R 63, 68].

use config::ConfigError;
use protocol::request::Modality;
use serde_json::Value;

use super::OpenAiResponsesProvider;
use crate::provider::catalog::ProviderType;
use crate::provider::text::{TextKind, TextProviderConfig};

/// Defaults and the inputs the Responses API takes.
pub const KIND: TextKind = TextKind {
    id: "openai",
    base_url: Some("https://api.openai.com/v1"),
    supported_inputs: &[
        Modality::Text,
        Modality::Json,
        Modality::Image,
        Modality::File,
    ],
};

impl ProviderType for OpenAiResponsesProvider {
    const NAME: &'static str = "openai-responses";
    type Config = TextProviderConfig;

    fn parse(section: &Value, path: String) -> Result<TextProviderConfig, ConfigError> {
        TextProviderConfig::parse(section, path, &KIND)
    }

    fn build(config: &TextProviderConfig) -> Self {
        Self::from_config(config)
    }
}
