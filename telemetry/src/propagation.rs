//! W3C trace context in and out of `tracing` spans.
//!
//! The gateway validates a caller's `traceparent` and the job carries the gateway span's
//! context to the worker (NATS headers, or the in-memory job); the worker makes it the parent of
//! its execution span. Without an OTLP exporter the spans have no OpenTelemetry context and
//! [`traceparent_of`] returns `None`: the caller's own `traceparent` is then passed on unchanged.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of `span`, when it belongs to a sampled or recorded OpenTelemetry trace.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes the trace named by `traceparent` the parent of `span`. An invalid value is ignored
/// (the span then starts a trace of its own).
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    let mut carrier = HashMap::new();
    carrier.insert(TRACEPARENT.to_owned(), traceparent.to_owned());
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The trace id of `span` as 32 lowercase hex digits, when it has one (for log lines).
pub fn trace_id_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}
