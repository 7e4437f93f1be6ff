//! Recording: HdrHistograms of the whole measured run, a histogram per reporting window, counters
//! and error counts, all behind one short-held lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

use crate::client::{ExecError, ExecTiming};

/// Highest trackable value: 10 minutes in microseconds (the histograms resize beyond it).
const HIGHEST_US: u64 = 600_000_000;

#[allow(clippy::expect_used)]
fn histogram() -> Histogram<u64> {
    // Three significant figures: 1 us resolution up to 2 ms, 0.1% above. The bounds are valid
    // constants, so construction cannot fail.
    let mut h = Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("valid histogram bounds");
    h.auto(true);
    h
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// The latency histograms of a run (microseconds).
#[derive(Debug)]
pub struct Latencies {
    pub submit: Histogram<u64>,
    pub first_delta: Histogram<u64>,
    pub terminal: Histogram<u64>,
    /// Open loop only: how late each arrival was dispatched relative to its schedule (harness
    /// timer granularity and client overload show up here).
    pub dispatch_lag: Histogram<u64>,
    /// Per execution with at least two deltas: (last − first delta) / (deltas − 1), in **ns**.
    pub per_delta_ns: Histogram<u64>,
}

impl Latencies {
    fn new() -> Self {
        Self {
            submit: histogram(),
            first_delta: histogram(),
            terminal: histogram(),
            dispatch_lag: histogram(),
            per_delta_ns: histogram(),
        }
    }
}

#[derive(Debug)]
struct Locked {
    total: Latencies,
    /// Terminal latency in the current window (submit latency in submit-only mode).
    window: Histogram<u64>,
    errors: BTreeMap<String, u64>,
}

/// Shared by every task of a run.
#[derive(Debug)]
pub struct Recorder {
    locked: Mutex<Locked>,
    /// Successful operations (terminal event read, or 202 in submit-only mode).
    pub ok: AtomicU64,
    /// Executions that ended with `execution.failed`.
    pub failed: AtomicU64,
    /// Requests that ended with an error (see `errors`).
    pub errored: AtomicU64,
    /// Open-loop arrivals not sent because `--max-in-flight` was reached.
    pub shed: AtomicU64,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            locked: Mutex::new(Locked {
                total: Latencies::new(),
                window: histogram(),
                errors: BTreeMap::new(),
            }),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            errored: AtomicU64::new(0),
            shed: AtomicU64::new(0),
        }
    }
}

impl Recorder {
    /// Records one execution that reached a terminal event.
    pub fn execution(&self, t: &ExecTiming) {
        {
            let mut l = self.locked.lock();
            let _ = l.total.submit.record(micros(t.submit));
            if let Some(d) = t.first_delta {
                let _ = l.total.first_delta.record(micros(d));
                if let Some(last) = t.last_delta.filter(|_| t.deltas >= 2) {
                    let gap = last.saturating_sub(d).as_nanos() / u128::from(t.deltas - 1);
                    let _ = l
                        .total
                        .per_delta_ns
                        .record(u64::try_from(gap).unwrap_or(u64::MAX).max(1));
                }
            }
            let _ = l.total.terminal.record(micros(t.terminal));
            let _ = l.window.record(micros(t.terminal));
        }
        if t.completed {
            self.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records one accepted submit (submit-only mode).
    pub fn submit_only(&self, d: Duration) {
        {
            let mut l = self.locked.lock();
            let _ = l.total.submit.record(micros(d));
            let _ = l.window.record(micros(d));
        }
        self.ok.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dispatch_lag(&self, d: Duration) {
        let _ = self.locked.lock().total.dispatch_lag.record(micros(d));
    }

    pub fn error(&self, e: &ExecError) {
        let label = e.label();
        *self.locked.lock().errors.entry(label).or_insert(0) += 1;
        self.errored.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the current window's histogram, leaving an empty one.
    pub fn take_window(&self) -> Histogram<u64> {
        let mut l = self.locked.lock();
        let fresh = histogram();
        std::mem::replace(&mut l.window, fresh)
    }

    pub fn finish(&self) -> (Latencies, BTreeMap<String, u64>) {
        let mut l = self.locked.lock();
        let total = std::mem::replace(&mut l.total, Latencies::new());
        (total, std::mem::take(&mut l.errors))
    }
}

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub count: u64,
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Summary {
    pub fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        Some(Self {
            count: h.len(),
            min_us: h.min(),
            mean_us: (h.mean() * 10.0).round() / 10.0,
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_empty_histogram_is_none() {
        assert!(Summary::of(&histogram()).is_none());
    }

    #[test]
    fn summary_percentiles_are_ordered() {
        let mut h = histogram();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let s = Summary::of(&h).unwrap();
        assert_eq!(s.count, 10_000);
        assert!(s.min_us <= s.p50_us && s.p50_us <= s.p90_us && s.p90_us <= s.p99_us);
        assert!(s.p99_us <= s.p999_us && s.p999_us <= s.max_us);
        // Three significant figures.
        assert!((4_990..=5_010).contains(&s.p50_us));
    }

    #[test]
    fn recorder_counts_and_windows() {
        let rec = Recorder::default();
        let t = ExecTiming {
            submit: Duration::from_micros(100),
            first_delta: Some(Duration::from_micros(200)),
            last_delta: Some(Duration::from_micros(290)),
            deltas: 4,
            terminal: Duration::from_micros(300),
            completed: true,
        };
        rec.execution(&t);
        rec.execution(&ExecTiming {
            completed: false,
            first_delta: None,
            ..t
        });
        rec.error(&ExecError::SubmitStatus(429));
        assert_eq!(rec.ok.load(Ordering::Relaxed), 1);
        assert_eq!(rec.failed.load(Ordering::Relaxed), 1);
        assert_eq!(rec.take_window().len(), 2);
        assert!(rec.take_window().is_empty());
        let (lat, errors) = rec.finish();
        assert_eq!(lat.terminal.len(), 2);
        assert_eq!(lat.first_delta.len(), 1);
        // (290 - 200) us / 3 gaps = 30 us = 30,000 ns (3 significant figures).
        assert_eq!(lat.per_delta_ns.len(), 1);
        assert_eq!(lat.per_delta_ns.value_at_quantile(0.5) / 100, 300);
        assert_eq!(errors.get("submit_http_429"), Some(&1));
    }
}
