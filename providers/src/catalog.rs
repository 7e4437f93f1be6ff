//! The provider types a deployment file may name: [`ProviderConfig`], one variant per type,
//! and the [`Catalog`] through which `config::deployment` parses the `providers` array.
//!
//! The one decision a reader must know: **each type's module owns its section** (`mock`,
//! `text`, `fal`: parsing, manifest, request policy), as mini-redis commands own their frame
//! parsing; this module only dispatches, and the enum is closed so every consumer (the
//! worker's adapters, the capability check) matches it exhaustively. Adding a provider type
//! is one module here, one variant, one row in [`TYPE_NAMES`], and one adapter in the worker.

use config::{ConfigError, FlowLimits, ProviderCatalog};
use protocol::ExecutionRequest;
use protocol::manifest::ProviderManifest;
use serde_json::Value;

use crate::fal::{self, FalConfig};
use crate::mock::{self, MockConfig};
use crate::text::{self, TextKind, TextProviderConfig};

/// Every provider type, in the order errors list them.
pub const TYPE_NAMES: &[&str] = &[
    mock::NAME,
    text::OPENAI_RESPONSES.name,
    text::ANTHROPIC_MESSAGES.name,
    text::OPENAI_CHAT.name,
    fal::NAME,
];

/// A parsed provider section: its type and the settings its adapter is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderConfig {
    Mock(MockConfig),
    OpenAiResponses(TextProviderConfig),
    AnthropicMessages(TextProviderConfig),
    OpenAiChat(TextProviderConfig),
    FalQueue(FalConfig),
}

impl ProviderConfig {
    /// The provider id, unique within the file.
    pub fn id(&self) -> &str {
        match self {
            Self::Mock(c) => &c.id,
            Self::OpenAiResponses(c) | Self::AnthropicMessages(c) | Self::OpenAiChat(c) => &c.id,
            Self::FalQueue(c) => &c.id,
        }
    }

    /// The provider's concurrency gate.
    pub fn flow(&self) -> FlowLimits {
        match self {
            Self::Mock(c) => c.flow,
            Self::OpenAiResponses(c) | Self::AnthropicMessages(c) | Self::OpenAiChat(c) => c.flow,
            Self::FalQueue(c) => c.flow,
        }
    }

    /// The `type` as written in the file.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Mock(_) => mock::NAME,
            Self::OpenAiResponses(_) => text::OPENAI_RESPONSES.name,
            Self::AnthropicMessages(_) => text::ANTHROPIC_MESSAGES.name,
            Self::OpenAiChat(_) => text::OPENAI_CHAT.name,
            Self::FalQueue(_) => fal::NAME,
        }
    }

    /// Exactly what the deployment declared for the provider's model [R 68].
    pub fn manifest(&self) -> ProviderManifest {
        match self {
            Self::Mock(c) => c.manifest(),
            Self::OpenAiResponses(c) | Self::AnthropicMessages(c) | Self::OpenAiChat(c) => {
                c.manifest()
            }
            Self::FalQueue(c) => c.manifest(),
        }
    }

    /// The type's policy beyond the manifest (its extension's shape, tools the deployment
    /// disabled); the adapter applies the same at routing.
    pub fn admits(&self, request: &ExecutionRequest) -> bool {
        match self {
            Self::Mock(_) => true,
            Self::OpenAiResponses(c) => text::OPENAI_RESPONSES.admits(request, c.tools),
            Self::AnthropicMessages(c) => text::ANTHROPIC_MESSAGES.admits(request, c.tools),
            Self::OpenAiChat(c) => text::OPENAI_CHAT.admits(request, c.tools),
            Self::FalQueue(_) => fal::admits(request),
        }
    }
}

/// A text type and the variant its sections parse into.
type TextType = (&'static TextKind, fn(TextProviderConfig) -> ProviderConfig);

const TEXT_TYPES: [TextType; 3] = [
    (&text::OPENAI_RESPONSES, ProviderConfig::OpenAiResponses),
    (&text::ANTHROPIC_MESSAGES, ProviderConfig::AnthropicMessages),
    (&text::OPENAI_CHAT, ProviderConfig::OpenAiChat),
];

/// The catalog of [`TYPE_NAMES`], for [`config::deployment::parse`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Catalog;

impl ProviderCatalog for Catalog {
    type Provider = ProviderConfig;

    fn type_names(&self) -> Vec<&'static str> {
        TYPE_NAMES.to_vec()
    }

    fn parse(
        &self,
        type_name: &str,
        section: &Value,
        path: String,
    ) -> Option<Result<ProviderConfig, ConfigError>> {
        if let Some((kind, variant)) = TEXT_TYPES.iter().find(|(kind, _)| kind.name == type_name) {
            return Some(TextProviderConfig::parse(section, path, kind).map(*variant));
        }
        match type_name {
            mock::NAME => Some(MockConfig::parse(section, path).map(ProviderConfig::Mock)),
            fal::NAME => Some(FalConfig::parse(section, path).map(ProviderConfig::FalQueue)),
            _ => None,
        }
    }

    fn id<'a>(&self, provider: &'a ProviderConfig) -> &'a str {
        provider.id()
    }
}
