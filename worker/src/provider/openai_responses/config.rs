//! The `openai-responses` section of the deployment file: a text provider section with
//! OpenAI's defaults [R 63, 68].

use protocol::request::Modality;

use super::OpenAiResponsesProvider;
use crate::provider::text::{TextAdapter, TextKind, TextProviderConfig};

impl TextAdapter for OpenAiResponsesProvider {
    const NAME: &'static str = "openai-responses";
    /// Defaults and the inputs the Responses API takes.
    const KIND: TextKind = TextKind {
        id: "openai",
        base_url: Some("https://api.openai.com/v1"),
        supported_inputs: &[
            Modality::Text,
            Modality::Json,
            Modality::Image,
            Modality::File,
        ],
    };

    fn from_section(config: &TextProviderConfig) -> Self {
        Self::from_config(config)
    }
}
