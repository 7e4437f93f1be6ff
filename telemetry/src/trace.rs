//! Logs and spans: the `tracing` subscriber of every binary.
//!
//! Logs go to stderr as text or JSON lines, filtered by `RUST_LOG` (default `info`). Spans are
//! exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`); every
//! other setting comes from the standard variables the OpenTelemetry SDK reads itself
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`). Export is batched on the SDK's own thread with a
//! bounded queue: a collector that is down or slow drops spans, it never blocks a request, and
//! after a failed batch the request paths stop building spans for a backoff
//! ([`crate::collector`]).
//!
//! A JSON line carries the fields of every span it was logged in, not only the innermost one:
//! a line an adapter logs inside its provider attempt's span still names the execution
//! (`execution_id`, and `trace_id` when traced) from the enclosing `execution` span.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Log line format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// `Json` when `json`, else `Text`.
    pub fn json_if(json: bool) -> Self {
        if json { Self::Json } else { Self::Text }
    }
}

/// Keeps the span exporter alive; dropping it flushes what is queued (bounded by the exporter's
/// timeout) and stops export.
#[derive(Debug, Default)]
pub struct TracingGuard {
    provider: Option<SdkTracerProvider>,
}

impl TracingGuard {
    /// True when spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Set once spans are exported: request paths skip building spans nobody receives.
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process exports spans over OTLP and the collector is taking them (cheap: two
/// atomic loads; see [`crate::collector`] for the pause after a failed export).
pub fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed) && crate::collector::accepting()
}

/// Whether the environment asks for OTLP span export.
pub fn otlp_configured() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Installs the global subscriber for a binary named `service` (the default service name when
/// `OTEL_SERVICE_NAME` is unset). A second call in one process is a no-op for logs.
pub fn init(service: &'static str, format: LogFormat) -> TracingGuard {
    let filter = log_filter(std::env::var(EnvFilter::DEFAULT_ENV).ok().as_deref()).layer();
    let fmt = match format {
        LogFormat::Json => json_layer(std::io::stderr).boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let (otel, provider) = match otlp_provider(service) {
        Ok(Some(provider)) => {
            let tracer = provider.tracer(service);
            // While the collector is down ([`crate::collector`]) the layer sees no span, so
            // none is built only to be dropped.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(tracing_subscriber::filter::filter_fn(|_| {
                    crate::collector::accepting()
                }));
            (Some(layer), Some(provider))
        }
        Ok(None) => (None, None),
        Err(message) => {
            // The subscriber is not up yet: this is the one place stderr is written directly.
            eprintln!("OTLP trace export disabled: {message}");
            (None, None)
        }
    };
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    if installed && provider.is_some() {
        EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    TracingGuard { provider }
}

/// The log filter `spec` (`RUST_LOG`) asks for, `info` when unset or invalid.
///
/// Directives that name spans or fields (`target[span{field=value}]=level`) need `EnvFilter`,
/// which tracks the spans they match and looks every entered and exited span up under one
/// lock the whole process shares: each poll of an instrumented future (an execution's, a
/// request's) takes it twice. The usual directives (`info`, `worker=debug,info`) are static,
/// and a static filter (`Targets`, the type `EnvFilter` keeps such directives in, with the same
/// matching) costs nothing when a span is entered.
fn log_filter(spec: Option<&str>) -> LogFilter {
    let info = || LogFilter::Static(Box::new(Targets::new().with_default(tracing::Level::INFO)));
    let Some(spec) = spec else {
        return info();
    };
    let Ok(env) = EnvFilter::try_new(spec) else {
        return info();
    };
    match static_targets(spec) {
        Some(targets) => LogFilter::Static(Box::new(targets)),
        None => LogFilter::Spans(Box::new(env)),
    }
}

/// The filter [`log_filter`] chose.
enum LogFilter {
    /// Directives by target and level alone.
    Static(Box<Targets>),
    /// Directives that name spans or fields.
    Spans(Box<EnvFilter>),
}

impl LogFilter {
    fn layer(self) -> Box<dyn Layer<Registry> + Send + Sync> {
        match self {
            Self::Static(targets) => targets,
            Self::Spans(env) => env,
        }
    }
}

/// `spec` as static directives, unless it names spans or fields (or is empty, which
/// `EnvFilter` reads its own way).
fn static_targets(spec: &str) -> Option<Targets> {
    if spec.contains('[') {
        return None;
    }
    let parts: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        return None;
    }
    parts.join(",").parse().ok()
}

/// JSON lines to `writer`, each with its innermost span (`span`) and every span it was logged
/// in, outermost first (`spans`); see the module docs.
fn json_layer<S, W>(writer: W) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .json()
        .with_current_span(true)
        .with_span_list(true)
}

fn otlp_provider(service: &'static str) -> Result<Option<SdkTracerProvider>, String> {
    if !otlp_configured() {
        return Ok(None);
    }
    // The workspace builds reqwest without a default TLS provider (one provider, ring, for
    // every client of the process); the exporter's client is built here, before any other.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|err| format!("exporter: {err}"))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    let provider = SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(crate::collector::Watched::new(exporter))
        .build();
    Ok(Some(provider))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Whether an event of `target` at `level` passes `filter`.
    fn passes(filter: Box<dyn Layer<Registry> + Send + Sync>, target: &str, level: &str) -> bool {
        let subscriber = tracing_subscriber::registry().with(filter);
        tracing::subscriber::with_default(subscriber, || match (target, level) {
            ("worker::runner", "debug") => {
                tracing::enabled!(target: "worker::runner", tracing::Level::DEBUG)
            }
            ("worker::runner", "info") => {
                tracing::enabled!(target: "worker::runner", tracing::Level::INFO)
            }
            ("gateway::api", "debug") => {
                tracing::enabled!(target: "gateway::api", tracing::Level::DEBUG)
            }
            ("gateway::api", "info") => {
                tracing::enabled!(target: "gateway::api", tracing::Level::INFO)
            }
            ("gateway::api", "warn") => {
                tracing::enabled!(target: "gateway::api", tracing::Level::WARN)
            }
            _ => unreachable!(),
        })
    }

    #[test]
    fn static_directives_filter_as_env_filter_does_and_span_directives_keep_it() {
        for spec in [
            "info",
            "worker=debug,info",
            "warn,worker::runner=debug",
            "info,",
            "off",
            "gateway",
        ] {
            let filter = log_filter(Some(spec));
            assert!(matches!(filter, LogFilter::Static(_)), "{spec}");
            for (target, level) in [
                ("worker::runner", "debug"),
                ("worker::runner", "info"),
                ("gateway::api", "debug"),
                ("gateway::api", "info"),
                ("gateway::api", "warn"),
            ] {
                let env = Box::new(EnvFilter::try_new(spec).expect(spec));
                assert_eq!(
                    passes(log_filter(Some(spec)).layer(), target, level),
                    passes(env, target, level),
                    "{spec}: {target} at {level}"
                );
            }
        }
        // Spans or fields named, or nothing: `EnvFilter` itself.
        for spec in ["worker[execution]=debug", "[{execution_id}]=trace,info", ""] {
            let filter = log_filter(Some(spec));
            assert!(matches!(filter, LogFilter::Spans(_)), "{spec}");
        }
        // Unset or invalid: `info`.
        for spec in [None, Some("worker=loud")] {
            assert!(passes(log_filter(spec).layer(), "gateway::api", "info"));
            assert!(!passes(log_filter(spec).layer(), "gateway::api", "debug"));
        }
    }

    #[test]
    fn a_json_line_inside_a_nested_span_names_the_execution_of_the_outer_one() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(json_layer(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let execution = tracing::info_span!(
                "execution",
                execution_id = "exec-1",
                trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            let _execution = execution.enter();
            let attempt = tracing::info_span!("provider.attempt", attempt = 1_i64);
            let _attempt = attempt.enter();
            tracing::warn!("provider transport failed");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).expect(&text);
        // The innermost span alone would not name the execution.
        assert_eq!(line["span"]["name"], "provider.attempt", "{line}");
        let spans = line["spans"].as_array().expect("a span list");
        assert_eq!(spans[0]["name"], "execution", "{line}");
        assert_eq!(spans[0]["execution_id"], "exec-1", "{line}");
        assert_eq!(
            spans[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
            "{line}"
        );
    }
}
