//! The `anthropic-messages` section of the deployment file: a text provider section with
//! Anthropic's defaults [R 66-68].

use protocol::request::Modality;

use super::AnthropicMessagesProvider;
use crate::provider::text::{TextAdapter, TextKind, TextProviderConfig};

impl TextAdapter for AnthropicMessagesProvider {
    const NAME: &'static str = "anthropic-messages";
    /// Defaults and the inputs the Messages API takes.
    const KIND: TextKind = TextKind {
        id: "anthropic",
        base_url: Some("https://api.anthropic.com"),
        supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
    };

    fn from_section(config: &TextProviderConfig) -> Self {
        Self::from_config(config)
    }
}
