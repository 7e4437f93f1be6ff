//! Builds the provider registry from the deployment file.

use std::sync::Arc;

use protocol::manifest::ProviderLimits;

use crate::config::{DeploymentConfig, ProviderConfig};
use crate::provider::mock::{MockOptions, MockProvider};
use crate::registry::{ProviderRegistry, RegistryError};

/// The providers cannot be registered together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Registry(#[from] RegistryError),
}

/// Registers every configured provider, in file order.
pub fn build_registry(config: &DeploymentConfig) -> Result<ProviderRegistry, BuildError> {
    let mut registry = ProviderRegistry::new();
    for provider in &config.providers {
        let flow = provider.flow();
        let adapter: Arc<dyn crate::provider::Provider> = match provider {
            ProviderConfig::Mock(m) => Arc::new(MockProvider::new(MockOptions {
                id: m.id.clone(),
                model: m.model.clone(),
                abilities: m.abilities.clone(),
                chunks: m.chunks.clone(),
                delay: m.delay,
                fail_retryably: m.fail_retryably,
                limits: ProviderLimits {
                    max_concurrency: flow.max_concurrency,
                    max_queue_depth: flow.max_queue_depth,
                },
            })),
            ProviderConfig::OpenAiResponses(c) => {
                Arc::new(crate::provider::openai_responses::OpenAiResponsesProvider::from_config(c))
            }
            ProviderConfig::OpenAiChat(c) => {
                Arc::new(crate::provider::openai_chat::OpenAiChatProvider::from_config(c))
            }
            ProviderConfig::AnthropicMessages(c) => Arc::new(
                crate::provider::anthropic_messages::AnthropicMessagesProvider::from_config(c),
            ),
            ProviderConfig::FalQueue(c) => {
                Arc::new(crate::provider::fal_queue::FalQueueProvider::from_config(c))
            }
        };
        registry.register(adapter, flow.max_concurrency, flow.max_queue_depth)?;
    }
    Ok(registry)
}
