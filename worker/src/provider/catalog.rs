//! The provider types a deployment file may name: one row per adapter in [`PROVIDER_TYPES`],
//! mapping the `type` to the adapter that parses its section and builds from it.
//!
//! The one decision a reader must know: **each adapter owns its section** (its `config.rs`
//! implements [`ProviderType`]), as mini-redis commands own their frame parsing; the catalog
//! only dispatches. Adding a provider is one adapter folder and one row here; the error for an
//! unknown `type` lists the rows' names. A section whose id and gate are plain fields gets its
//! [`Section`] impl from `section_from_fields!`.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use config::{ConfigError, FlowLimits, ProviderCatalog};
use serde_json::Value;

use super::Provider;
use super::anthropic_messages::AnthropicMessagesProvider;
use super::fal_queue::FalQueueProvider;
use super::mock::MockProvider;
use super::openai_chat::OpenAiChatProvider;
use super::openai_responses::OpenAiResponsesProvider;

/// Every provider type, in the order errors list them.
pub const PROVIDER_TYPES: &[TypeEntry] = &[
    TypeEntry::of::<MockProvider>(),
    TypeEntry::of::<OpenAiResponsesProvider>(),
    TypeEntry::of::<AnthropicMessagesProvider>(),
    TypeEntry::of::<OpenAiChatProvider>(),
    TypeEntry::of::<FalQueueProvider>(),
];

/// An adapter that a deployment file can configure.
///
/// Contract: `parse` checks the section strictly with [`config::Fields`] (unknown fields
/// refused, errors naming paths and never values); `build` does no I/O and reads no
/// credential.
pub trait ProviderType: Provider + Sized {
    /// The `type` the file names it by.
    const NAME: &'static str;
    /// Its parsed section.
    type Config: Section;
    /// Parses its section, found at `path` (such as `providers[0]`).
    fn parse(section: &Value, path: String) -> Result<Self::Config, ConfigError>;
    /// The adapter for a parsed section.
    fn build(config: &Self::Config) -> Self;
}

/// What every parsed section tells the registry.
pub trait Section: fmt::Debug + Clone + Send + Sync + 'static {
    /// The provider id, unique within the file.
    fn id(&self) -> &str;
    /// The provider's concurrency gate.
    fn flow(&self) -> FlowLimits;
}

/// Implements [`Section`] for section structs whose provider id is their `id` field and whose
/// concurrency gate is their `flow` field.
macro_rules! section_from_fields {
    ($($section:ty),+ $(,)?) => {$(
        impl $crate::provider::catalog::Section for $section {
            fn id(&self) -> &str {
                &self.id
            }

            fn flow(&self) -> ::config::FlowLimits {
                self.flow
            }
        }
    )+};
}
pub(crate) use section_from_fields;

/// One row of [`PROVIDER_TYPES`].
#[derive(Debug, Clone, Copy)]
pub struct TypeEntry {
    pub name: &'static str,
    parse: fn(&Value, String) -> Result<ProviderConfig, ConfigError>,
}

impl TypeEntry {
    /// The row of adapter `P`.
    pub const fn of<P: ProviderType>() -> Self {
        Self {
            name: P::NAME,
            parse: parse_as::<P>,
        }
    }
}

fn parse_as<P: ProviderType>(section: &Value, path: String) -> Result<ProviderConfig, ConfigError> {
    P::parse(section, path).map(ProviderConfig::new::<P>)
}

/// A parsed provider section: which type it is, and the adapter's own settings, from which the
/// adapter is built.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    type_name: &'static str,
    settings: Arc<dyn Settings>,
}

impl ProviderConfig {
    /// A section of adapter `P`, parsed or made by hand.
    pub fn new<P: ProviderType>(config: P::Config) -> Self {
        Self {
            type_name: P::NAME,
            settings: Arc::new(Typed::<P>(config)),
        }
    }

    /// The provider id, unique within the file.
    pub fn id(&self) -> &str {
        self.settings.id()
    }

    pub fn flow(&self) -> FlowLimits {
        self.settings.flow()
    }

    /// The `type` as written in the file.
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// The adapter's settings, when they are a `T` (such as `MockConfig`).
    pub fn settings<T: 'static>(&self) -> Option<&T> {
        self.settings.as_any().downcast_ref()
    }

    /// The adapter.
    pub fn build(&self) -> Arc<dyn Provider> {
        self.settings.build()
    }
}

/// The catalog of [`PROVIDER_TYPES`], for [`config::deployment::parse`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Catalog;

impl ProviderCatalog for Catalog {
    type Provider = ProviderConfig;

    fn type_names(&self) -> Vec<&'static str> {
        PROVIDER_TYPES.iter().map(|t| t.name).collect()
    }

    fn parse(
        &self,
        type_name: &str,
        section: &Value,
        path: String,
    ) -> Option<Result<ProviderConfig, ConfigError>> {
        let entry = PROVIDER_TYPES.iter().find(|t| t.name == type_name)?;
        Some((entry.parse)(section, path))
    }

    fn id<'a>(&self, provider: &'a ProviderConfig) -> &'a str {
        provider.id()
    }
}

/// A section with the adapter it builds, its type erased so one list holds every type.
trait Settings: fmt::Debug + Send + Sync {
    fn id(&self) -> &str;
    fn flow(&self) -> FlowLimits;
    fn as_any(&self) -> &dyn Any;
    fn build(&self) -> Arc<dyn Provider>;
}

struct Typed<P: ProviderType>(P::Config);

impl<P: ProviderType> fmt::Debug for Typed<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<P: ProviderType> Settings for Typed<P> {
    fn id(&self) -> &str {
        self.0.id()
    }

    fn flow(&self) -> FlowLimits {
        self.0.flow()
    }

    fn as_any(&self) -> &dyn Any {
        &self.0
    }

    fn build(&self) -> Arc<dyn Provider> {
        Arc::new(P::build(&self.0))
    }
}
