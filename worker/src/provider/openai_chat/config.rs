//! The `openai-chat` section of the deployment file: a text provider section without a
//! default base URL (the deployment names its server).

use config::ConfigError;
use protocol::request::Modality;
use serde_json::Value;

use super::OpenAiChatProvider;
use crate::provider::catalog::ProviderType;
use crate::provider::text::{TextKind, TextProviderConfig};

/// Defaults and the inputs Chat Completions takes: images by URL; files and audio only
/// inline, which URI parts are not.
pub const KIND: TextKind = TextKind {
    id: "openai-chat",
    base_url: None,
    supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
};

impl ProviderType for OpenAiChatProvider {
    const NAME: &'static str = "openai-chat";
    type Config = TextProviderConfig;

    fn parse(section: &Value, path: String) -> Result<TextProviderConfig, ConfigError> {
        TextProviderConfig::parse(section, path, &KIND)
    }

    fn build(config: &TextProviderConfig) -> Self {
        Self::from_config(config)
    }
}
