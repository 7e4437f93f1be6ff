//! The mock provider [R 74-75]: deterministic text chunks with an optional cancellable delay,
//! for demos, tests and benchmarks. The delays keep a fixed rate: chunk i is due `delay_ms` ×
//! (i + 1) after the call, so a busy worker makes chunks late but not the stream slower (a
//! remote model's tokens do not wait for the runtime either; BENCHMARKS.md, "Mock at a fixed
//! rate").
//! Its settings are its section of the deployment file (`providers::mock`).

use async_trait::async_trait;
use protocol::manifest::ProviderManifest;
use protocol::{ErrorCode, RuntimeError, UsageFact};
use runtime::lazy_timer::LazyTimer;

use super::{AttemptResult, Provider, ProviderCall, ProviderEvent, ProviderSink};
pub use providers::mock::MockConfig;

/// See the module docs.
#[derive(Debug)]
pub struct MockProvider {
    options: MockConfig,
    manifest: ProviderManifest,
}

impl MockProvider {
    pub fn new(options: MockConfig) -> Self {
        let manifest = options.manifest();
        Self { options, manifest }
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
        // Chunk i is due `delay` × (i + 1) after the call, like tokens a remote model produces
        // at a fixed rate: one emitted late (the process was busy) does not push the rest back;
        // they come at once until the stream is on time again.
        let mut due = tokio::time::Instant::now();
        // One wait for the whole stream, not one registered and dropped per chunk, polled only
        // once cancelled (`OwnWakes`); one timer too, moved to each chunk's time (a `sleep` per
        // chunk took the runtime's timer lock twice a chunk: `runtime::lazy_timer`).
        let mut cancelled = runtime::own_wakes::cancelled(&call.cancel);
        let mut timer = LazyTimer::at(due);
        for chunk in &self.options.chunks {
            if !self.options.delay.is_zero() {
                due += self.options.delay;
                timer.set(due);
                tokio::select! {
                    () = timer.elapsed() => {}
                    () = &mut cancelled => return Err(RuntimeError::cancelled()),
                }
            }
            sink.emit(ProviderEvent::output_delta(0, chunk.clone()))
                .await?;
        }
        let count = self.options.chunks.len() as f64;
        let facts = UsageFact::runtime_tokens(1.0, count).map_err(|_| RuntimeError::internal())?;
        sink.emit(ProviderEvent::Usage(facts)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Records when each event came; the first emit stalls for `stall` (a busy process).
    struct StallingSink {
        start: tokio::time::Instant,
        stall: Duration,
        times: Vec<Duration>,
    }

    #[async_trait]
    impl ProviderSink for StallingSink {
        async fn emit(&mut self, event: ProviderEvent) -> Result<(), RuntimeError> {
            if matches!(event, ProviderEvent::Usage(_)) {
                return Ok(());
            }
            self.times.push(self.start.elapsed());
            if self.times.len() == 1 {
                tokio::time::sleep(self.stall).await;
            }
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn chunks_keep_their_rate_when_one_is_emitted_late() {
        let provider = MockProvider::new(MockConfig {
            chunks: (0..5).map(|i| format!("c{i}")).collect(),
            delay: Duration::from_millis(10),
            ..MockConfig::default()
        });
        let request = protocol::validate::parse_request(
            br#"{"ability":"text-generation","input":[{"type":"text","text":"hi"}]}"#,
        )
        .unwrap();
        let mut sink = StallingSink {
            start: tokio::time::Instant::now(),
            stall: Duration::from_millis(25),
            times: Vec::new(),
        };
        let call = ProviderCall {
            request: &request,
            model: "model-alpha",
            cancel: tokio_util::sync::CancellationToken::new(),
        };
        provider.execute(call, &mut sink).await.unwrap();
        let ms: Vec<u128> = sink.times.iter().map(Duration::as_millis).collect();
        // Due at 10, 20, 30, 40, 50 ms; the first emit took 25 ms, so the second and third
        // (due at 20 and 30) come at once at 35, and the rest on time.
        assert_eq!(ms, [10, 35, 35, 40, 50]);
    }
}
