//! The `anthropic-messages` section of the deployment file: a text provider section with
//! Anthropic's defaults [R 66-68].

use config::ConfigError;
use protocol::request::Modality;
use serde_json::Value;

use super::AnthropicMessagesProvider;
use crate::provider::catalog::ProviderType;
use crate::provider::text::{TextKind, TextProviderConfig};

/// Defaults and the inputs the Messages API takes.
pub const KIND: TextKind = TextKind {
    id: "anthropic",
    base_url: Some("https://api.anthropic.com"),
    supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
};

impl ProviderType for AnthropicMessagesProvider {
    const NAME: &'static str = "anthropic-messages";
    type Config = TextProviderConfig;

    fn parse(section: &Value, path: String) -> Result<TextProviderConfig, ConfigError> {
        TextProviderConfig::parse(section, path, &KIND)
    }

    fn build(config: &TextProviderConfig) -> Self {
        Self::from_config(config)
    }
}
