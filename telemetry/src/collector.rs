//! Whether the OTLP collector is taking spans, and a pause in span building while it is not.
//!
//! Export is batched on the SDK's own thread, so a collector that is down never blocks a request;
//! but every span built while it is down is serialised, sent, refused and dropped, which costs
//! the request paths CPU on a small machine. [`Watched`] wraps the OTLP exporter and reports
//! the outcome of each batch to [`Health`]: after a failed batch, [`crate::trace::exporting`]
//! answers false for a backoff (1 s, doubling up to 10 s), so request paths build no spans; once
//! it elapses spans are built again and the next batch is the probe. A success ends the pause at
//! once. The caller's own `traceparent` still travels with each job during a pause (what the
//! paths do without export), so traces resume intact when the collector is back.
//!
//! One warning is logged when export pauses and one line when it resumes; failures in between
//! are counted, not logged.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// First pause after a failed batch.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between probes while the collector stays down.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The export health state machine: up, or paused until a time with a current backoff.
///
/// Times are milliseconds on a caller-given monotonic clock, so the machine is testable; the
/// process-wide instance ([`process`]) uses milliseconds since the first call.
#[derive(Debug, Default)]
pub struct Health {
    /// 0 while up; else the clock time (ms) when span building resumes.
    paused_until: AtomicU64,
    /// The backoff (ms) of the current pause; 0 while up.
    backoff: AtomicU64,
    /// Failed batches since the last success.
    failures: AtomicU64,
}

/// What a reported batch outcome changed, for the one log line per transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing to tell: still up, or one more failure during a pause.
    None,
    /// The first failure after success: span building pauses for this long.
    Paused(Duration),
    /// The first success after failures: span building resumed.
    Resumed {
        /// Failed batches (each one dropped its spans) during the outage.
        failed_batches: u64,
    },
}

impl Health {
    /// True when spans should be built at clock time `now_ms`: up, or the pause is over (probe).
    pub fn accepting(&self, now_ms: u64) -> bool {
        let until = self.paused_until.load(Ordering::Relaxed);
        until == 0 || now_ms >= until
    }

    /// Records one batch's outcome at clock time `now_ms`.
    pub fn report(&self, ok: bool, now_ms: u64) -> Transition {
        if ok {
            self.paused_until.store(0, Ordering::Relaxed);
            self.backoff.store(0, Ordering::Relaxed);
            let failed_batches = self.failures.swap(0, Ordering::Relaxed);
            return if failed_batches == 0 {
                Transition::None
            } else {
                Transition::Resumed { failed_batches }
            };
        }
        let first = self.failures.fetch_add(1, Ordering::Relaxed) == 0;
        let previous = self.backoff.load(Ordering::Relaxed);
        let next = if previous == 0 {
            millis(FIRST_BACKOFF)
        } else {
            previous.saturating_mul(2).min(millis(MAX_BACKOFF))
        };
        self.backoff.store(next, Ordering::Relaxed);
        self.paused_until
            .store(now_ms.saturating_add(next), Ordering::Relaxed);
        if first {
            Transition::Paused(Duration::from_millis(next))
        } else {
            Transition::None
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    millis(START.get_or_init(Instant::now).elapsed())
}

static PROCESS: Health = Health {
    paused_until: AtomicU64::new(0),
    backoff: AtomicU64::new(0),
    failures: AtomicU64::new(0),
};

/// True unless span export is paused after a failed batch (one atomic load while up).
pub fn accepting() -> bool {
    PROCESS.paused_until.load(Ordering::Relaxed) == 0 || PROCESS.accepting(clock_ms())
}

/// The process's OTLP exporter, reporting each batch's outcome to the process's [`Health`].
#[derive(Debug)]
pub struct Watched<E> {
    inner: E,
}

impl<E> Watched<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self { inner }
    }
}

impl<E: SpanExporter> SpanExporter for Watched<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            match PROCESS.report(result.is_ok(), clock_ms()) {
                Transition::None => {}
                // The exporter's error text may hold the endpoint URL, and with it credentials
                // a deployment put there: it is not logged.
                Transition::Paused(pause) => tracing::warn!(
                    pause_ms = millis(pause),
                    "OTLP span export failed (collector unreachable or refusing); \
                     span building paused, retried with backoff"
                ),
                Transition::Resumed { failed_batches } => {
                    tracing::info!(failed_batches, "OTLP span export resumed");
                }
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_until_a_batch_fails_then_paused_for_the_backoff() {
        let health = Health::default();
        assert!(health.accepting(0));
        assert_eq!(health.report(true, 5), Transition::None);
        assert_eq!(
            health.report(false, 1_000),
            Transition::Paused(FIRST_BACKOFF)
        );
        assert!(!health.accepting(1_000));
        assert!(!health.accepting(1_999));
        // The pause is over: spans are built again, and the next batch is the probe.
        assert!(health.accepting(2_000));
    }

    #[test]
    fn failed_probes_double_the_pause_up_to_the_cap_and_log_nothing_more() {
        let health = Health::default();
        let mut now = 0;
        let mut pauses = Vec::new();
        for i in 0..7 {
            let transition = health.report(false, now);
            assert_eq!(transition == Transition::None, i > 0, "round {i}");
            let until = health.paused_until.load(Ordering::Relaxed);
            pauses.push(until - now);
            assert!(!health.accepting(until - 1));
            now = until;
            assert!(health.accepting(now));
        }
        assert_eq!(pauses, [1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000]);
    }

    #[test]
    fn a_success_ends_the_pause_and_resets_the_backoff() {
        let health = Health::default();
        health.report(false, 0);
        health.report(false, 1_000);
        assert_eq!(
            health.report(true, 3_000),
            Transition::Resumed { failed_batches: 2 }
        );
        assert!(health.accepting(3_000));
        assert_eq!(
            health.report(false, 4_000),
            Transition::Paused(FIRST_BACKOFF)
        );
        assert!(health.accepting(5_000));
    }
}
