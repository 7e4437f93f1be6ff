//! The mock provider [R 74-75]: deterministic text chunks with an optional cancellable delay,
//! for demos, tests and benchmarks. `config.rs` has its settings, which are its section of the
//! deployment file.

pub mod config;

use async_trait::async_trait;
use protocol::manifest::{ModelCapability, ProviderManifest};
use protocol::{ErrorCode, RuntimeError, UsageFact, UsageSource, UsageUnit};
use serde_json::Value;

pub use self::config::MockConfig;
use super::catalog::ProviderType;
use super::manifest;
use super::{AttemptResult, Provider, ProviderCall, ProviderEvent, ProviderSink};

/// See the module docs.
#[derive(Debug)]
pub struct MockProvider {
    options: MockConfig,
    manifest: ProviderManifest,
}

impl MockProvider {
    pub fn new(options: MockConfig) -> Self {
        let model =
            ModelCapability::streamed_text(options.model.clone(), options.abilities.clone());
        let manifest = manifest::single_model(&options.id, model, options.flow);
        Self { options, manifest }
    }
}

impl ProviderType for MockProvider {
    const NAME: &'static str = "mock";
    type Config = MockConfig;

    fn parse(section: &Value, path: String) -> Result<MockConfig, ::config::ConfigError> {
        MockConfig::parse(section, path)
    }

    fn build(config: &MockConfig) -> Self {
        Self::new(config.clone())
    }
}

#[async_trait]
impl Provider for MockProvider {
    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    async fn execute(&self, call: ProviderCall<'_>, sink: &mut dyn ProviderSink) -> AttemptResult {
        if self.options.fail_retryably {
            return Err(RuntimeError::new(
                ErrorCode::ProviderUnavailable,
                "Mock provider failed",
                true,
            ));
        }
        for chunk in &self.options.chunks {
            if !self.options.delay.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(self.options.delay) => {}
                    () = call.cancel.cancelled() => return Err(RuntimeError::cancelled()),
                }
            }
            sink.emit(ProviderEvent::output_delta(0, chunk.clone()))
                .await?;
        }
        let count = self.options.chunks.len() as f64;
        let facts = [
            (UsageUnit::input_token(), 1.0),
            (UsageUnit::output_token(), count),
        ]
        .into_iter()
        .map(|(unit, q)| UsageFact::new(unit, q, UsageSource::Runtime))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| RuntimeError::internal())?;
        sink.emit(ProviderEvent::Usage(facts)).await?;
        Ok(())
    }
}
