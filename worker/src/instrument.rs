//! Metrics and spans of executions and provider attempts (contract.md section 9), recorded by
//! the runner.
//!
//! Labels and attributes are the deployment's provider and model ids and portable codes only,
//! never caller content. An [`AttemptMeter`] lives exactly as long as one provider attempt: it
//! holds the in-flight gauge up while alive (also when the attempt is dropped on cancellation),
//! records time to first output, the operation's duration and outcome and reported token usage,
//! and owns the attempt's span with the GenAI semantic-convention attributes.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use metrics::{Counter, Gauge, Histogram};
use parking_lot::RwLock;
use protocol::event::EventBody;
use protocol::{RuntimeError, Timestamp, UsageFact};
use runtime::Pace;
use telemetry::metric;
use tokio::time::Instant;

use crate::key_guard::KeyHolder;

/// The metric handles of one configured model, resolved on its first attempt: the hot path then
/// records through them, without a registry lookup or a label allocation per event.
#[derive(Debug)]
struct ModelHandles {
    inflight: Gauge,
    ttft: Histogram,
    operation_ok: Histogram,
    attempts_succeeded: Counter,
    attempts_failed: Counter,
    input_tokens: Histogram,
    output_tokens: Histogram,
    duration_succeeded: Histogram,
}

impl ModelHandles {
    fn new(provider: &str, model: &str) -> Self {
        let (p, m) = (provider.to_owned(), model.to_owned());
        let tokens = |kind: &'static str| {
            metrics::histogram!(
                metric::TOKEN_USAGE,
                "gen_ai_provider_name" => p.clone(),
                "gen_ai_request_model" => m.clone(),
                "gen_ai_token_type" => kind
            )
        };
        let attempts = |outcome: &'static str| {
            metrics::counter!(
                metric::PROVIDER_ATTEMPTS_TOTAL,
                "provider" => p.clone(),
                "model" => m.clone(),
                "outcome" => outcome
            )
        };
        Self {
            inflight: metrics::gauge!(metric::PROVIDER_INFLIGHT, "provider" => p.clone()),
            ttft: metrics::histogram!(
                metric::TIME_TO_FIRST_TOKEN_SECONDS,
                "gen_ai_provider_name" => p.clone(),
                "gen_ai_request_model" => m.clone()
            ),
            operation_ok: metrics::histogram!(
                metric::OPERATION_DURATION_SECONDS,
                "gen_ai_provider_name" => p.clone(),
                "gen_ai_request_model" => m.clone()
            ),
            attempts_succeeded: attempts(metric::outcome::SUCCEEDED),
            attempts_failed: attempts(metric::outcome::FAILED),
            input_tokens: tokens(metric::token_type::INPUT),
            output_tokens: tokens(metric::token_type::OUTPUT),
            duration_succeeded: metrics::histogram!(
                metric::EXECUTION_DURATION_SECONDS,
                "provider" => p.clone(),
                "model" => m.clone(),
                "outcome" => metric::outcome::SUCCEEDED
            ),
        }
    }
}

/// Handles by model, for one provider.
type ProviderHandles = HashMap<String, Arc<ModelHandles>>;

/// Handles by provider, then model (a bounded set: the deployment's models).
static MODELS: LazyLock<RwLock<HashMap<String, ProviderHandles>>> = LazyLock::new(RwLock::default);

fn model_handles(provider: &str, model: &str) -> Arc<ModelHandles> {
    if let Some(handles) = MODELS.read().get(provider).and_then(|m| m.get(model)) {
        return Arc::clone(handles);
    }
    let mut all = MODELS.write();
    let handles = all
        .entry(provider.to_owned())
        .or_default()
        .entry(model.to_owned())
        .or_insert_with(|| Arc::new(ModelHandles::new(provider, model)));
    Arc::clone(handles)
}

/// Handles without per-model labels, resolved once.
static QUEUE_WAIT: LazyLock<Histogram> =
    LazyLock::new(|| metrics::histogram!(metric::QUEUE_WAIT_SECONDS));

/// Label value used when an execution ended before any provider was selected.
const NO_TARGET: &str = "none";

/// Records a delivery that is not the job's first (the previous holder stopped acknowledging).
pub fn redelivered() {
    metrics::counter!(metric::JOB_REDELIVERIES_TOTAL).increment(1);
}

/// Records what the claim of a keyed job's idempotency key found ([`metric::key_claim`]). A key
/// that could not be claimed before the log was found closed counts as unreachable.
pub fn key_claim(claimed: &Result<KeyHolder, runtime::StoreError>) {
    let outcome = match claimed {
        Ok(KeyHolder::This { .. }) => metric::key_claim::BOUND,
        Ok(KeyHolder::Another) => metric::key_claim::ANOTHER,
        Ok(KeyHolder::Closed) | Err(_) => metric::key_claim::UNREACHABLE,
    };
    metrics::counter!(metric::KEY_CLAIMS_TOTAL, "outcome" => outcome).increment(1);
}

/// Sets the pace's hold as it stands now ([`metric::APPEND_PACE_HOLD_SECONDS`]); the admin
/// endpoint calls this before every scrape, so the hot path pays nothing for it.
pub fn append_pace_hold(pace: &Pace) {
    metrics::gauge!(metric::APPEND_PACE_HOLD_SECONDS).set(pace.hold().as_secs_f64());
}

/// Records the time from acceptance until a worker started the execution.
pub fn queue_wait(accepted_at: Timestamp) {
    QUEUE_WAIT.record(seconds_since(accepted_at));
}

/// Records the total duration of an execution whose terminal event this process appended (its
/// count is `runtime::ended::record`'s, which every writer of terminal events calls).
///
/// The duration is labelled with the completed target; failed executions carry `none` (their
/// attempts are counted per provider in `mrt_provider_attempts_total`).
pub fn terminal(body: &EventBody, accepted_at: Timestamp) {
    let elapsed = seconds_since(accepted_at);
    match body {
        EventBody::Completed { target } => {
            model_handles(&target.provider, &target.model)
                .duration_succeeded
                .record(elapsed);
        }
        EventBody::Failed { error } => {
            let outcome = if error.code == protocol::ErrorCode::Cancelled {
                metric::outcome::CANCELLED
            } else {
                metric::outcome::FAILED
            };
            metrics::histogram!(
                metric::EXECUTION_DURATION_SECONDS,
                "provider" => NO_TARGET,
                "model" => NO_TARGET,
                "outcome" => outcome
            )
            .record(elapsed);
        }
        _ => {}
    }
}

fn seconds_since(at: Timestamp) -> f64 {
    let ms = Timestamp::now().unix_millis() - at.unix_millis();
    (ms.max(0) as f64) / 1000.0
}

/// The meter of one provider attempt; see the module docs.
#[derive(Debug)]
pub struct AttemptMeter {
    handles: Arc<ModelHandles>,
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
        let handles = model_handles(provider, model);
        handles.inflight.increment(1.0);
        let operation = operation_name(ability);
        // The full GenAI attribute set only when spans leave the process: formatting eight
        // fields per attempt for local logs alone is measurable on the hot path.
        let span = if telemetry::trace::exporting() {
            tracing::info_span!(
                "provider.attempt",
                otel.name = %format_args!("{operation} {model}"),
                otel.kind = "client",
                gen_ai.operation.name = operation,
                gen_ai.provider.name = %provider,
                gen_ai.request.model = %model,
                gen_ai.usage.input_tokens = tracing::field::Empty,
                gen_ai.usage.output_tokens = tracing::field::Empty,
                error.type = tracing::field::Empty,
                attempt = i64::from(attempt),
            )
        } else {
            tracing::info_span!(
                "provider.attempt",
                gen_ai.provider.name = %provider,
                gen_ai.request.model = %model,
                attempt = i64::from(attempt),
            )
        };
        Self {
            handles,
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
            self.handles
                .ttft
                .record(self.started.elapsed().as_secs_f64());
        }
    }

    /// Reported usage: input and output tokens under the GenAI token types, other known units
    /// under their own names; vendor-namespaced units are not labels (unbounded).
    pub fn usage(&mut self, facts: &[UsageFact]) {
        for fact in facts {
            match fact.unit.as_str() {
                "input_token" => {
                    // Facts are reports, never summed: the last one is the attempt's figure.
                    self.input_tokens = Some(fact.quantity);
                    self.handles.input_tokens.record(fact.quantity);
                }
                "output_token" => {
                    self.output_tokens = Some(fact.quantity);
                    self.handles.output_tokens.record(fact.quantity);
                }
                unit if !unit.contains('.') => metrics::histogram!(
                    metric::TOKEN_USAGE,
                    "gen_ai_provider_name" => self.provider.clone(),
                    "gen_ai_request_model" => self.model.clone(),
                    "gen_ai_token_type" => unit.to_owned()
                )
                .record(fact.quantity),
                _ => {}
            }
        }
    }

    /// The attempt ended with `result`.
    pub fn finish(mut self, result: Result<(), &RuntimeError>) {
        self.finished = true;
        // Token counts are integer attributes (the GenAI conventions' type): recorded as `i64`,
        // which tracing-opentelemetry exports as an OTLP int; a `u64` would go through its
        // `Debug` fallback and arrive as a string. Quantities are non-negative and whole for
        // these units; `as` saturates anything beyond `i64`.
        if let Some(tokens) = self.input_tokens {
            self.span.record("gen_ai.usage.input_tokens", tokens as i64);
        }
        if let Some(tokens) = self.output_tokens {
            self.span
                .record("gen_ai.usage.output_tokens", tokens as i64);
        }
        if let Err(error) = result {
            self.span.record("error.type", error.code.as_str());
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                self.handles.operation_ok.record(elapsed);
                self.handles.attempts_succeeded.increment(1);
            }
            Err(error) => {
                metrics::histogram!(
                    metric::OPERATION_DURATION_SECONDS,
                    "gen_ai_provider_name" => self.provider.clone(),
                    "gen_ai_request_model" => self.model.clone(),
                    "error_type" => error.code.as_str()
                )
                .record(elapsed);
                self.handles.attempts_failed.increment(1);
            }
        }
    }
}

impl Drop for AttemptMeter {
    fn drop(&mut self) {
        self.handles.inflight.decrement(1.0);
        if !self.finished {
            // Dropped mid-attempt (cancellation, deadline, shutdown): counted as failed.
            self.handles.attempts_failed.increment(1);
        }
    }
}
