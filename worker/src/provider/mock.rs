//! The mock provider [R 74-75]: deterministic text chunks with an optional cancellable delay,
//! for demos, tests and benchmarks.

use std::time::Duration;

use async_trait::async_trait;
use protocol::manifest::{ModelCapability, ProviderLimits, ProviderManifest};
use protocol::request::Modality;
use protocol::{ErrorCode, RuntimeError, UsageFact, UsageSource, UsageUnit};

use super::{Provider, ProviderCall, ProviderEvent, ProviderSink};

/// How the mock behaves.
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub id: String,
    pub model: String,
    pub abilities: Vec<String>,
    pub chunks: Vec<String>,
    /// Waited before each chunk; cancellation interrupts it.
    pub delay: Duration,
    /// Fail with retryable `provider_unavailable` before any output.
    pub fail_retryably: bool,
    /// Informational limits shown in the manifest.
    pub limits: ProviderLimits,
}

impl Default for MockOptions {
    fn default() -> Self {
        Self {
            id: "provider-mock".into(),
            model: "model-alpha".into(),
            abilities: vec!["text-generation".into()],
            chunks: vec!["hello".into(), " from".into(), " mock".into()],
            delay: Duration::ZERO,
            fail_retryably: false,
            limits: ProviderLimits {
                max_concurrency: 4,
                max_queue_depth: 8,
            },
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct MockProvider {
    options: MockOptions,
    manifest: ProviderManifest,
}

impl MockProvider {
    pub fn new(options: MockOptions) -> Self {
        let manifest = ProviderManifest {
            provider: options.id.clone(),
            protocol_version: protocol::PROTOCOL_VERSION.into(),
            models: vec![ModelCapability {
                model: options.model.clone(),
                abilities: options.abilities.clone(),
                input_modalities: vec![Modality::Text],
                output_modalities: vec![Modality::Text],
                stream: true,
                tools: false,
                structured_output: false,
                r#async: false,
                cancel: true,
            }],
            limits: Some(options.limits),
        };
        Self { options, manifest }
    }
}

#[async_trait]
impl Provider for MockProvider {
    fn id(&self) -> &str {
        &self.options.id
    }

    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    async fn execute(
        &self,
        call: ProviderCall<'_>,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
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
            sink.emit(ProviderEvent::OutputDelta {
                output_index: 0,
                delta: chunk.clone(),
            })
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
