//! Prometheus metrics: plain atomic counters and gauges rendered in the text exposition format.
//! No prompt or output content ever becomes a label.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Counters of the HTTP layer.
#[derive(Debug, Default)]
pub struct Metrics {
    pub submissions_accepted: AtomicU64,
    pub submissions_replayed: AtomicU64,
    pub submissions_rejected: AtomicU64,
    pub cancellations: AtomicU64,
    pub sse_streams_opened: AtomicU64,
    pub sse_streams_active: AtomicI64,
    pub sse_events_sent: AtomicU64,
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text, plus extra gauges supplied by the caller.
    pub fn render(&self, extra: &[(&str, &str, f64)]) -> String {
        let mut out = String::new();
        let counters = [
            (
                "mrt_submissions_total{outcome=\"accepted\"}",
                &self.submissions_accepted,
            ),
            (
                "mrt_submissions_total{outcome=\"replayed\"}",
                &self.submissions_replayed,
            ),
            (
                "mrt_submissions_total{outcome=\"rejected\"}",
                &self.submissions_rejected,
            ),
        ];
        out.push_str("# HELP mrt_submissions_total Execution submissions by outcome.\n# TYPE mrt_submissions_total counter\n");
        for (name, c) in counters {
            let _ = writeln!(out, "{name} {}", c.load(Ordering::Relaxed));
        }
        let simple = [
            (
                "mrt_cancellations_total",
                "Cancel requests accepted.",
                "counter",
                self.cancellations.load(Ordering::Relaxed) as f64,
            ),
            (
                "mrt_sse_streams_opened_total",
                "SSE streams opened.",
                "counter",
                self.sse_streams_opened.load(Ordering::Relaxed) as f64,
            ),
            (
                "mrt_sse_streams_active",
                "SSE streams open now.",
                "gauge",
                self.sse_streams_active.load(Ordering::Relaxed) as f64,
            ),
            (
                "mrt_sse_events_sent_total",
                "Events written to SSE streams.",
                "counter",
                self.sse_events_sent.load(Ordering::Relaxed) as f64,
            ),
        ];
        let extra = extra
            .iter()
            .map(|&(name, help, value)| (name, help, "gauge", value));
        for (name, help, kind, value) in simple.into_iter().chain(extra) {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            );
        }
        out
    }
}
