//! The mock's section of the deployment file (`type: "mock"`) [R 74-75], which is also the
//! mock adapter's one settings struct (the worker's `provider::mock` runs it), and its
//! manifest: streamed text from one model.

use std::time::Duration;

use config::field::DEFAULT_ABILITY;
use config::{ConfigError, Fields, FlowLimits};
use serde_json::Value;

use protocol::manifest::{ModelCapability, ProviderManifest};

use crate::catalog::ProviderConfig;
use crate::manifest;

/// The `type` the file names it by.
pub const NAME: &str = "mock";

/// Largest mock `delay_ms` (one hour).
pub const MAX_MOCK_DELAY_MS: u64 = 3_600_000;

const MOCK_FIELDS: &[&str] = &[
    "type",
    "id",
    "model",
    "abilities",
    "chunks",
    "delay_ms",
    "fail_retryably",
    "max_concurrency",
    "max_queue_depth",
];

/// How the mock behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockConfig {
    pub id: String,
    pub model: String,
    pub abilities: Vec<String>,
    /// Emitted in order as output deltas; may be empty.
    pub chunks: Vec<String>,
    /// `delay_ms`: waited before each chunk, at a fixed rate (chunk i is due (i + 1) × delay
    /// after the call; see the module docs); cancellation interrupts it.
    pub delay: Duration,
    /// Fail with retryable `provider_unavailable` before any output.
    pub fail_retryably: bool,
    /// Its concurrency gate, also shown in the manifest.
    pub flow: FlowLimits,
}

impl Default for MockConfig {
    /// The reference mock. Its flow limits are [`FlowLimits::STANDALONE_MOCK`]; a mock declared
    /// in a file gets [`FlowLimits::CONFIG_DEFAULT`] unless it sets its own.
    fn default() -> Self {
        Self {
            id: "provider-mock".into(),
            model: "model-alpha".into(),
            abilities: vec![DEFAULT_ABILITY.into()],
            chunks: vec!["hello".into(), " from".into(), " mock".into()],
            delay: Duration::ZERO,
            fail_retryably: false,
            flow: FlowLimits::STANDALONE_MOCK,
        }
    }
}

impl MockConfig {
    /// Parses a `mock` section at `path`.
    pub fn parse(value: &Value, path: String) -> Result<Self, ConfigError> {
        let fields = Fields::open(value, path, MOCK_FIELDS)?;
        let defaults = MockConfig::default();
        Ok(MockConfig {
            id: fields.name("id", Some(&defaults.id))?,
            model: fields.name("model", Some(&defaults.model))?,
            abilities: fields.names("abilities")?,
            chunks: fields.strings("chunks", &defaults.chunks)?,
            delay: Duration::from_millis(fields.integer("delay_ms", 0, MAX_MOCK_DELAY_MS, 0)?),
            fail_retryably: fields.boolean("fail_retryably", false)?,
            flow: FlowLimits::parse(&fields)?,
        })
    }

    /// Streamed text from its one model, with its flow limits.
    pub fn manifest(&self) -> ProviderManifest {
        let model = ModelCapability::streamed_text(self.model.clone(), self.abilities.clone());
        manifest::single_model(&self.id, model, self.flow)
    }
}

impl From<MockConfig> for ProviderConfig {
    fn from(config: MockConfig) -> Self {
        ProviderConfig::Mock(config)
    }
}
