//! Metrics and spans of executions and provider attempts (contract.md section 9), recorded by
//! the runner.
//!
//! Labels and attributes are the deployment's provider and model ids and portable codes only,
//! never caller content. An [`AttemptMeter`] lives exactly as long as one provider attempt: it
//! holds the in-flight gauge up while alive (also when the attempt is dropped on cancellation),
//! records time to first output, the operation's duration and outcome and reported token usage,
//! and owns the attempt's span with the GenAI semantic-convention attributes.

use protocol::event::EventBody;
use protocol::{RuntimeError, Target, Timestamp, UsageFact};
use telemetry::metric;
use tokio::time::Instant;

/// Label value used when an execution ended before any provider was selected.
const NO_TARGET: &str = "none";

/// Records a delivery that is not the job's first (the previous holder stopped acknowledging).
pub fn redelivered() {
    metrics::counter!(metric::JOB_REDELIVERIES_TOTAL).increment(1);
}

/// Records the time from acceptance until a worker started the execution.
pub fn queue_wait(accepted_at: Timestamp) {
    metrics::histogram!(metric::QUEUE_WAIT_SECONDS).record(seconds_since(accepted_at));
}

/// Records a terminal event this process appended: outcome, code and total duration.
///
/// The duration is labelled with the completed target; failed executions carry `none` (their
/// attempts are counted per provider in `mrt_provider_attempts_total`).
pub fn terminal(body: &EventBody, accepted_at: Timestamp) {
    let (outcome, code, target) = match body {
        EventBody::Completed { target } => {
            (metric::outcome::SUCCEEDED, metric::NO_CODE, Some(target))
        }
        EventBody::Failed { error } => {
            let code = error.code.as_str();
            if code == "cancelled" {
                (metric::outcome::CANCELLED, code, None)
            } else {
                (metric::outcome::FAILED, code, None)
            }
        }
        _ => return,
    };
    metrics::counter!(metric::EXECUTIONS_TOTAL, "outcome" => outcome, "code" => code).increment(1);
    let (provider, model) = target.map_or(
        (NO_TARGET.to_owned(), NO_TARGET.to_owned()),
        |t: &Target| (t.provider.clone(), t.model.clone()),
    );
    metrics::histogram!(
        metric::EXECUTION_DURATION_SECONDS,
        "provider" => provider,
        "model" => model,
        "outcome" => outcome
    )
    .record(seconds_since(accepted_at));
}

fn seconds_since(at: Timestamp) -> f64 {
    let ms = Timestamp::now().unix_millis() - at.unix_millis();
    (ms.max(0) as f64) / 1000.0
}

/// The meter of one provider attempt; see the module docs.
#[derive(Debug)]
pub struct AttemptMeter {
    provider: String,
    model: String,
    started: Instant,
    first_output: bool,
    finished: bool,
    span: tracing::Span,
    input_tokens: Option<f64>,
    output_tokens: Option<f64>,
}

/// The GenAI operation name of an ability: `chat` for text generation, `generate_content`
/// otherwise (the ability itself is caller content and never becomes an attribute).
fn operation_name(ability: &str) -> &'static str {
    if ability == "text-generation" {
        "chat"
    } else {
        "generate_content"
    }
}

impl AttemptMeter {
    pub fn start(provider: &str, model: &str, ability: &str, attempt: u32) -> Self {
        metrics::gauge!(metric::PROVIDER_INFLIGHT, "provider" => provider.to_owned())
            .increment(1.0);
        let operation = operation_name(ability);
        let span = tracing::info_span!(
            "provider.attempt",
            otel.name = %format_args!("{operation} {model}"),
            otel.kind = "client",
            gen_ai.operation.name = operation,
            gen_ai.provider.name = %provider,
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
            attempt,
        );
        Self {
            provider: provider.to_owned(),
            model: model.to_owned(),
            started: Instant::now(),
            first_output: false,
            finished: false,
            span,
            input_tokens: None,
            output_tokens: None,
        }
    }

    /// The attempt's span; the adapter's work runs inside it.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    /// The attempt exposed output (a delta, a tool call or a result): the first call records
    /// the time to first token.
    pub fn output(&mut self) {
        if !self.first_output {
            self.first_output = true;
            metrics::histogram!(
                metric::TIME_TO_FIRST_TOKEN_SECONDS,
                "gen_ai_provider_name" => self.provider.clone(),
                "gen_ai_request_model" => self.model.clone()
            )
            .record(self.started.elapsed().as_secs_f64());
        }
    }

    /// Reported usage: input and output tokens under the GenAI token types, other known units
    /// under their own names; vendor-namespaced units are not labels (unbounded).
    pub fn usage(&mut self, facts: &[UsageFact]) {
        for fact in facts {
            let token_type = match fact.unit.as_str() {
                "input_token" => {
                    // Facts are reports, never summed: the last one is the attempt's figure.
                    self.input_tokens = Some(fact.quantity);
                    metric::token_type::INPUT
                }
                "output_token" => {
                    self.output_tokens = Some(fact.quantity);
                    metric::token_type::OUTPUT
                }
                unit if !unit.contains('.') => unit,
                _ => continue,
            };
            metrics::histogram!(
                metric::TOKEN_USAGE,
                "gen_ai_provider_name" => self.provider.clone(),
                "gen_ai_request_model" => self.model.clone(),
                "gen_ai_token_type" => token_type.to_owned()
            )
            .record(fact.quantity);
        }
    }

    /// The attempt ended with `result`.
    pub fn finish(mut self, result: Result<(), &RuntimeError>) {
        self.finished = true;
        if let Some(tokens) = self.input_tokens {
            self.span.record("gen_ai.usage.input_tokens", tokens as u64);
        }
        if let Some(tokens) = self.output_tokens {
            self.span
                .record("gen_ai.usage.output_tokens", tokens as u64);
        }
        if let Err(error) = result {
            self.span.record("error.type", error.code.as_str());
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let outcome = match result {
            Ok(()) => {
                metrics::histogram!(
                    metric::OPERATION_DURATION_SECONDS,
                    "gen_ai_provider_name" => self.provider.clone(),
                    "gen_ai_request_model" => self.model.clone()
                )
                .record(elapsed);
                metric::outcome::SUCCEEDED
            }
            Err(error) => {
                metrics::histogram!(
                    metric::OPERATION_DURATION_SECONDS,
                    "gen_ai_provider_name" => self.provider.clone(),
                    "gen_ai_request_model" => self.model.clone(),
                    "error_type" => error.code.as_str()
                )
                .record(elapsed);
                metric::outcome::FAILED
            }
        };
        metrics::counter!(
            metric::PROVIDER_ATTEMPTS_TOTAL,
            "provider" => self.provider.clone(),
            "model" => self.model.clone(),
            "outcome" => outcome
        )
        .increment(1);
    }
}

impl Drop for AttemptMeter {
    fn drop(&mut self) {
        metrics::gauge!(metric::PROVIDER_INFLIGHT, "provider" => self.provider.clone())
            .decrement(1.0);
        if !self.finished {
            // Dropped mid-attempt (cancellation, deadline, shutdown): counted as failed.
            metrics::counter!(
                metric::PROVIDER_ATTEMPTS_TOTAL,
                "provider" => self.provider.clone(),
                "model" => self.model.clone(),
                "outcome" => metric::outcome::FAILED
            )
            .increment(1);
        }
    }
}
