//! The gateway's own counters: submissions by outcome, cancellations, SSE streams and events.
//!
//! Each one is exported through the process's `metrics` registry (rendered by
//! [`telemetry::MetricsExporter`], registered at 0 when the state is built) and also kept on this
//! gateway instance as a plain atomic, which the shutdown drain and the tests read. The handles
//! are resolved once here, so the hot path does no registry lookup. No prompt or output content
//! ever becomes a label.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use metrics::{Counter, Gauge, counter, describe_counter, describe_gauge, gauge};
use protocol::snapshot::ExecutionSubmission;

const SUBMISSIONS_TOTAL: &str = "mrt_submissions_total";
const CANCELLATIONS_TOTAL: &str = "mrt_cancellations_total";
const SSE_STREAMS_OPENED_TOTAL: &str = "mrt_sse_streams_opened_total";
const SSE_EVENTS_SENT_TOTAL: &str = "mrt_sse_events_sent_total";
const STOPPING: &str = "mrt_stopping";
const RUN_AFTER_503_TOTAL: &str = "mrt_submissions_run_after_503_total";

/// Counters of the HTTP layer.
#[derive(Debug)]
pub struct Metrics {
    submissions_accepted: AtomicU64,
    sse_streams_active: AtomicI64,
    exported: Exported,
}

/// The registry handles, one per series.
#[derive(Debug)]
struct Exported {
    accepted: Counter,
    replayed: Counter,
    rejected: Counter,
    cancellations: Counter,
    streams_opened: Counter,
    streams_active: Gauge,
    events_sent: Counter,
    stopping: Gauge,
    run_after_503_unkeyed: Counter,
    run_after_503_keyed: Counter,
}

impl Metrics {
    /// Registers the gateway's series in the process registry `_exporter` installed (the handles
    /// would be no-ops without it) and starts every count at 0.
    pub fn new(_exporter: &telemetry::MetricsExporter) -> Self {
        describe_counter!(SUBMISSIONS_TOTAL, "Execution submissions by outcome.");
        describe_counter!(CANCELLATIONS_TOTAL, "Cancel requests accepted.");
        describe_counter!(SSE_STREAMS_OPENED_TOTAL, "SSE streams opened.");
        describe_gauge!(
            telemetry::metric::SSE_STREAMS_ACTIVE,
            "SSE streams open now."
        );
        describe_counter!(SSE_EVENTS_SENT_TOTAL, "Events written to SSE streams.");
        describe_gauge!(STOPPING, "1 while the process is shutting down.");
        describe_counter!(
            RUN_AFTER_503_TOTAL,
            "Submissions answered 503 whose execution a worker claimed after all (unkeyed ones are cancelled)."
        );
        let exported = Exported {
            accepted: counter!(SUBMISSIONS_TOTAL, "outcome" => "accepted"),
            replayed: counter!(SUBMISSIONS_TOTAL, "outcome" => "replayed"),
            rejected: counter!(SUBMISSIONS_TOTAL, "outcome" => "rejected"),
            cancellations: counter!(CANCELLATIONS_TOTAL),
            streams_opened: counter!(SSE_STREAMS_OPENED_TOTAL),
            streams_active: gauge!(telemetry::metric::SSE_STREAMS_ACTIVE),
            events_sent: counter!(SSE_EVENTS_SENT_TOTAL),
            stopping: gauge!(STOPPING),
            run_after_503_unkeyed: counter!(RUN_AFTER_503_TOTAL, "keyed" => "false"),
            run_after_503_keyed: counter!(RUN_AFTER_503_TOTAL, "keyed" => "true"),
        };
        // Every series is exported from startup, at 0.
        for c in [
            &exported.accepted,
            &exported.replayed,
            &exported.rejected,
            &exported.cancellations,
            &exported.streams_opened,
            &exported.events_sent,
            &exported.run_after_503_unkeyed,
            &exported.run_after_503_keyed,
        ] {
            c.increment(0);
        }
        exported.streams_active.increment(0.0);
        exported.stopping.set(0.0);
        Self {
            submissions_accepted: AtomicU64::new(0),
            sse_streams_active: AtomicI64::new(0),
            exported,
        }
    }

    /// Counts one submission by how it ended: accepted, replayed (idempotent) or rejected.
    pub fn count_submission<E>(&self, result: &Result<ExecutionSubmission, E>) {
        match result {
            Ok(s) if s.idempotent_replay => self.exported.replayed.increment(1),
            Ok(_) => {
                self.submissions_accepted.fetch_add(1, Ordering::Relaxed);
                self.exported.accepted.increment(1);
            }
            Err(_) => self.exported.rejected.increment(1),
        }
    }

    /// Counts one accepted cancel request.
    pub fn cancellation(&self) {
        self.exported.cancellations.increment(1);
    }

    /// Counts a submission answered 503 whose execution a worker claimed after all (the
    /// residual window of `crate::submit`), by whether it carried an idempotency key.
    pub fn run_after_503(&self, keyed: bool) {
        if keyed {
            self.exported.run_after_503_keyed.increment(1);
        } else {
            self.exported.run_after_503_unkeyed.increment(1);
        }
    }

    /// Counts an SSE stream that opened (and is now active).
    pub fn stream_opened(&self) {
        self.sse_streams_active.fetch_add(1, Ordering::SeqCst);
        self.exported.streams_opened.increment(1);
        self.exported.streams_active.increment(1.0);
    }

    /// Counts an SSE stream that closed.
    pub fn stream_closed(&self) {
        self.sse_streams_active.fetch_sub(1, Ordering::SeqCst);
        self.exported.streams_active.decrement(1.0);
    }

    /// Counts `n` events written to an SSE stream.
    pub fn events_sent(&self, n: u64) {
        self.exported.events_sent.increment(n);
    }

    /// Sets the `mrt_stopping` gauge.
    pub fn set_stopping(&self, stopping: bool) {
        self.exported.stopping.set(if stopping { 1.0 } else { 0.0 });
    }

    /// Submissions this gateway accepted.
    pub fn accepted(&self) -> u64 {
        self.submissions_accepted.load(Ordering::Relaxed)
    }

    /// SSE streams this gateway has open now.
    pub fn active_streams(&self) -> i64 {
        self.sse_streams_active.load(Ordering::SeqCst)
    }
}
