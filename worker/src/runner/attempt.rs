//! One execution's attempts: routing over the candidates in order, falling back on
//! retryable errors [R 25-28], and the sink through which an adapter's events become runtime
//! events ([`AttemptSink`]).

use std::time::Duration;

use async_trait::async_trait;
use protocol::event::EventBody;
use protocol::request::RoutingPreferences;
use protocol::{ErrorCode, RuntimeError, Target};
use runtime::own_wakes::OwnWakes;
use runtime::{EventWriter, Job, WriteError};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::Instrument;

use crate::instrument::AttemptMeter;
use crate::provider::{ProviderCall, ProviderEvent, ProviderSink};

use super::{Runner, Stop};

impl Runner {
    /// Routing and attempts; returns the completed target or why the execution stops.
    pub(super) async fn route(
        &self,
        writer: &mut EventWriter,
        job: &Job,
        cancel: CancellationToken,
    ) -> Result<Target, Stop> {
        let request = &job.request;
        let candidates = self.registry.candidates(request);
        if candidates.is_empty() {
            return Err(Stop::Failed(RuntimeError::capability_unavailable()));
        }
        let no_preferences = RoutingPreferences::default();
        let routing = request.routing.as_ref().unwrap_or(&no_preferences);
        let max_attempts = if routing.allow_fallback == Some(true) {
            routing
                .max_attempts
                .map_or(candidates.len(), |m| m as usize)
                .min(candidates.len())
        } else {
            1
        };
        let started = Instant::now();
        let budget = routing.retry_budget_ms.map(Duration::from_millis);
        let budget_spent = || budget.is_some_and(|b| started.elapsed() >= b);
        let mut last_error: Option<RuntimeError> = None;
        for (index, candidate) in candidates.iter().take(max_attempts).enumerate() {
            let attempt = u32::try_from(index + 1).unwrap_or(u32::MAX);
            if budget_spent() {
                break;
            }
            let target = candidate.target();
            writer
                .append(EventBody::RouteSelected {
                    target: target.clone(),
                    attempt,
                })
                .await?;
            let mut sink = AttemptSink {
                writer: &mut *writer,
                cancelled: runtime::own_wakes::cancelled(&cancel),
                write_error: None,
                refused: None,
                meter: None,
            };
            // The gate is taken after route.selected: a queued attempt is already routing [R 35].
            // Waiting for the gate is interruptible: a cancelled or expired execution leaves the
            // queue at once instead of waiting for a slot (and then calling the provider).
            let permit = tokio::select! {
                biased;
                () = cancel.cancelled() => Err(RuntimeError::cancelled()),
                permit = candidate.entry.gate.acquire() => permit,
            };
            let result = match permit {
                Ok(_permit) => {
                    let call = ProviderCall {
                        request,
                        model: &candidate.model,
                        cancel: cancel.clone(),
                    };
                    // Metrics and the attempt span (GenAI semantic-convention attributes, no
                    // prompt or output content).
                    let meter = AttemptMeter::start(
                        candidate.entry.provider.id(),
                        &candidate.model,
                        &request.ability,
                        attempt,
                    );
                    let span = meter.span();
                    sink.meter = Some(meter);
                    let result = candidate
                        .entry
                        .provider
                        .execute(call, &mut sink)
                        .instrument(span)
                        .await;
                    if let Some(meter) = sink.meter.take() {
                        meter.finish(result.as_ref().map(|_| ()));
                    }
                    result
                }
                Err(e) => Err(e),
            };
            if let Some(e) = sink.write_error.take() {
                return Err(Stop::Write(e));
            }
            // An adapter that reports success after the sink refused one of its events did not
            // complete: the refusal is the attempt's error.
            let error = match (result, sink.refused.take()) {
                (Ok(()), None) => return Ok(target),
                (Ok(()), Some(refused)) => refused,
                (Err(e), _) => e,
            };
            if writer.output_exposed() {
                // No fallback once output is exposed [R 31].
                return Err(Stop::Failed(error.not_retryable()));
            }
            // An interrupted execution (cancel, deadline, shutdown) never starts another attempt,
            // whatever error the interrupted adapter reported.
            if !error.retryable
                || index + 1 == max_attempts
                || budget_spent()
                || cancel.is_cancelled()
            {
                return Err(Stop::Failed(error));
            }
            writer
                .append(EventBody::RouteAttemptFailed {
                    target,
                    attempt,
                    error: error.clone(),
                })
                .await?;
            last_error = Some(error);
        }
        Err(Stop::Failed(last_error.unwrap_or_else(|| {
            RuntimeError::new(ErrorCode::ProviderUnavailable, "Execution failed", true)
        })))
    }
}

/// Turns adapter events into runtime events through the writer.
struct AttemptSink<'a> {
    writer: &'a mut EventWriter,
    /// The attempt's cancellation, read for every event without the token's lock.
    cancelled: OwnWakes<WaitForCancellationFutureOwned>,
    write_error: Option<WriteError>,
    /// The first event this sink refused (cancelled, invalid usage).
    refused: Option<RuntimeError>,
    /// The running attempt's metrics.
    meter: Option<AttemptMeter>,
}

impl AttemptSink<'_> {
    fn refuse(&mut self, error: RuntimeError) -> Result<(), RuntimeError> {
        self.refused.get_or_insert_with(|| error.clone());
        Err(error)
    }
}

#[async_trait]
impl ProviderSink for AttemptSink<'_> {
    async fn emit(&mut self, event: ProviderEvent) -> Result<(), RuntimeError> {
        if self.cancelled.is_cancelled().await {
            return self.refuse(RuntimeError::cancelled());
        }
        if self.write_error.is_some() {
            return Err(RuntimeError::internal());
        }
        let body = match event {
            ProviderEvent::OutputDelta {
                output_index,
                delta,
            } => EventBody::OutputDelta {
                output_index,
                delta,
            },
            ProviderEvent::ToolCallStarted { call_id, name } => {
                EventBody::ToolCallStarted { call_id, name }
            }
            ProviderEvent::ToolCallArgumentsDelta { call_id, delta } => {
                EventBody::ToolCallArgumentsDelta { call_id, delta }
            }
            ProviderEvent::Progress { phase, progress } => EventBody::Progress { phase, progress },
            ProviderEvent::OutputResult { result, artifacts } => {
                EventBody::OutputResult { result, artifacts }
            }
            ProviderEvent::Usage(facts) => {
                if facts.iter().any(|f| f.check().is_err()) {
                    return self.refuse(RuntimeError::new(
                        ErrorCode::ProviderProtocolError,
                        "Provider reported invalid usage",
                        false,
                    ));
                }
                if facts.is_empty() {
                    return Ok(());
                }
                if let Some(meter) = &mut self.meter {
                    meter.usage(&facts);
                }
                EventBody::UsageReported { facts }
            }
        };
        let output = matches!(
            body,
            EventBody::OutputDelta { .. }
                | EventBody::ToolCallStarted { .. }
                | EventBody::OutputResult { .. }
        );
        // Handed over without waiting for the acknowledgement (pipelined writer); a failure
        // comes back here on a later event, or through the runner's failure watch.
        match self.writer.submit(body).await {
            Ok(()) => {
                if output && let Some(meter) = &mut self.meter {
                    meter.output();
                }
                Ok(())
            }
            Err(e) => {
                self.write_error = Some(e);
                Err(RuntimeError::internal())
            }
        }
    }
}
