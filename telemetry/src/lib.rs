//! Telemetry shared by the gateway and the worker: Prometheus metrics, OTLP traces, logs.
//!
//! Module map:
//! - [`metric`]: every metric name of contract.md section 9, its help text, its histogram
//!   buckets and its bounded label values; registration at startup so every counter is exported
//!   at 0 before anything happened.
//! - [`exporter`]: the process-wide recorder (`metrics` facade → `metrics-exporter-prometheus`)
//!   and the `/metrics` text, with the standard `process_*` metrics refreshed per scrape.
//! - [`trace`]: log and span setup: `RUST_LOG` filter, text or JSON lines on stderr, and OTLP/HTTP
//!   span export configured only by the standard `OTEL_*` environment variables.
//! - [`collector`]: the OTLP exporter's health: after a failed batch, span building pauses with a
//!   backoff, so a collector that is down costs the request paths nothing.
//! - [`propagation`]: W3C `traceparent` in and out of spans, so one trace follows an execution
//!   from the caller through the gateway, the job's NATS headers and the worker.
//!
//! The decision a reader must know: instrumented code calls the `metrics` macros with the names
//! in [`metric`], never an exporter; the exporter is installed once per process by the binary (or
//! by a test harness), and without it every macro is a no-op, so libraries stay cheap to test.

pub mod collector;
pub mod exporter;
pub mod metric;
pub mod propagation;
pub mod trace;

pub use exporter::MetricsExporter;
pub use trace::{LogFormat, TracingGuard};
