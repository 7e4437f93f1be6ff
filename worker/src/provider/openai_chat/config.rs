//! The `openai-chat` section of the deployment file: a text provider section without a
//! default base URL (the deployment names its server).

use protocol::request::Modality;

use super::OpenAiChatProvider;
use crate::provider::text::{TextAdapter, TextKind, TextProviderConfig};

impl TextAdapter for OpenAiChatProvider {
    const NAME: &'static str = "openai-chat";
    /// Defaults and the inputs Chat Completions takes: images by URL; files and audio only
    /// inline, which URI parts are not.
    const KIND: TextKind = TextKind {
        id: "openai-chat",
        base_url: None,
        supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
    };

    fn from_section(config: &TextProviderConfig) -> Self {
        Self::from_config(config)
    }
}
