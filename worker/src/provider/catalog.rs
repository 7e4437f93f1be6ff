//! The adapter of each provider type: [`build`] matches the closed `providers::ProviderConfig`
//! exhaustively, so a new type does not compile until it has an adapter here.
//!
//! Sections are parsed, and manifests and request policies defined, in the `providers`
//! crate, which the gateway shares; building an adapter does no I/O and reads no credential
//! (the adapters read theirs at execution time).

use std::sync::Arc;

use providers::ProviderConfig;

use super::Provider;
use super::anthropic_messages::AnthropicMessagesProvider;
use super::fal_queue::FalQueueProvider;
use super::mock::MockProvider;
use super::openai_chat::OpenAiChatProvider;
use super::openai_responses::OpenAiResponsesProvider;

/// The adapter for a parsed provider section.
pub fn build(config: &ProviderConfig) -> Arc<dyn Provider> {
    match config {
        ProviderConfig::Mock(c) => Arc::new(MockProvider::new(c.clone())),
        ProviderConfig::OpenAiResponses(c) => Arc::new(OpenAiResponsesProvider::from_config(c)),
        ProviderConfig::AnthropicMessages(c) => Arc::new(AnthropicMessagesProvider::from_config(c)),
        ProviderConfig::OpenAiChat(c) => Arc::new(OpenAiChatProvider::from_config(c)),
        ProviderConfig::FalQueue(c) => Arc::new(FalQueueProvider::from_config(c)),
    }
}
