//! Recording: HdrHistograms of the whole measured run, a histogram per reporting window, a
//! timeline of completions per second, counters and error counts, all behind one short-held lock
//! taken once per execution. Also the derived figures: percentile summaries, the added time per
//! delta (client gap minus the provider's configured gap) and the timeline's rates.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

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

/// One `T` per latency of a run: the histograms while recording ([`Latencies`], microseconds
/// but for `per_delta_ns`) and their summaries in the report (`report::LatencyReport`).
#[derive(Debug, Serialize)]
pub struct LatencySet<T> {
    /// POST sent (or scheduled, open loop) → 202 body read; inline stream mode: → headers.
    pub submit: T,
    /// → first `output.delta` parsed.
    pub first_delta: T,
    /// → the `time` the worker stamped on `route.selected` (the gateway's and worker's wall
    /// clock against the client's, so only meaningful with everything on one machine; event
    /// times have millisecond resolution). With `first_delta_stamped`, it tells where the
    /// first-delta time goes: before the route was chosen (submit and dispatch), before the
    /// delta existed (routing and the provider), or after (append and delivery).
    pub route_stamped: T,
    /// → the `time` stamped on the first `output.delta` (see `route_stamped`).
    pub first_delta_stamped: T,
    /// → `execution.completed` / `execution.failed` parsed.
    pub terminal: T,
    /// Open loop only: actual dispatch − scheduled arrival (harness timer granularity and
    /// client overload show up here).
    pub dispatch_lag: T,
    /// Per execution with at least two deltas: (last − first delta) / (deltas − 1). Unit:
    /// **ns** (the `_us` field names of `Summary` do not apply here).
    pub per_delta_ns: T,
    /// Every gap between two consecutive `output.delta` events of one execution, as the client
    /// parsed them (µs; 0 when both came in one read).
    pub delta_gap: T,
}

impl<T> LatencySet<T> {
    /// `f` of every latency.
    pub fn map<U>(&self, f: impl Fn(&T) -> U) -> LatencySet<U> {
        LatencySet {
            submit: f(&self.submit),
            first_delta: f(&self.first_delta),
            route_stamped: f(&self.route_stamped),
            first_delta_stamped: f(&self.first_delta_stamped),
            terminal: f(&self.terminal),
            dispatch_lag: f(&self.dispatch_lag),
            per_delta_ns: f(&self.per_delta_ns),
            delta_gap: f(&self.delta_gap),
        }
    }
}

/// The latency histograms of a run.
pub type Latencies = LatencySet<Histogram<u64>>;

impl Latencies {
    fn new() -> Self {
        Self {
            submit: histogram(),
            first_delta: histogram(),
            route_stamped: histogram(),
            first_delta_stamped: histogram(),
            terminal: histogram(),
            dispatch_lag: histogram(),
            per_delta_ns: histogram(),
            delta_gap: histogram(),
        }
    }
}

/// Largest number of timeline buckets kept (a day of 1 s buckets); later completions go into the
/// last one.
const MAX_BUCKETS: usize = 86_400;

/// Completions per fixed-width time bucket since the start of the measured run: throughput over
/// time at a finer grain than the reporting windows, for the charts.
#[derive(Debug, Clone)]
pub struct Timeline {
    bucket: Duration,
    counts: Vec<u64>,
}

/// One timeline bucket: when it starts and its completions per second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub start_s: f64,
    pub per_s: f64,
}

impl Timeline {
    /// `bucket` is the bucket width (at least 1 ms).
    pub fn new(bucket: Duration) -> Self {
        Self {
            bucket: bucket.max(Duration::from_millis(1)),
            counts: Vec::new(),
        }
    }

    /// Counts one completion `since_start` after the measured start.
    pub fn record(&mut self, since_start: Duration) {
        let i = usize::try_from(since_start.as_nanos() / self.bucket.as_nanos())
            .unwrap_or(usize::MAX)
            .min(MAX_BUCKETS - 1);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
    }

    /// Completions per second in each bucket up to `elapsed` (the run's measured length); the
    /// last bucket is divided by the part of it the run covered, so a run that ends inside a
    /// bucket does not show a false drop. A last bucket the run covered for less than half its
    /// width is left out: it holds the executions that were draining when the run stopped (all
    /// finishing at once) over a sliver of time, which would show as a false spike. Buckets with
    /// no completion are included (as 0).
    pub fn rates(&self, elapsed: Duration) -> Vec<TimelinePoint> {
        let width = self.bucket.as_secs_f64();
        let total = elapsed.as_secs_f64();
        let buckets = ((total / width).ceil() as usize).max(self.counts.len());
        (0..buckets)
            .filter_map(|i| {
                let start = i as f64 * width;
                let covered = (total - start).clamp(0.0, width);
                if i + 1 == buckets && i > 0 && covered < 0.5 * width {
                    return None;
                }
                let covered = if covered > 0.0 { covered } else { width };
                let n = self.counts.get(i).copied().unwrap_or(0);
                Some(TimelinePoint {
                    start_s: (start * 1000.0).round() / 1000.0,
                    per_s: n as f64 / covered,
                })
            })
            .collect()
    }

    pub fn bucket(&self) -> Duration {
        self.bucket
    }
}

/// The added time per delta: each gap between consecutive deltas at the client minus the gap the
/// provider was configured with. Signed (a delta that arrives in the same read as the previous
/// one has a client gap of 0, so it shows as `-provider_gap`); µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddedPerDelta {
    pub provider_gap_us: u64,
    /// Gaps measured.
    pub count: u64,
    pub p50_us: i64,
    pub p90_us: i64,
    pub p99_us: i64,
    pub max_us: i64,
    pub mean_us: f64,
}

impl AddedPerDelta {
    /// From the histogram of client gaps (µs). Subtracting a constant keeps the order, so each
    /// quantile of the difference is the gap's quantile minus the provider's gap.
    pub fn of(gaps: &Histogram<u64>, provider_gap: Duration) -> Option<Self> {
        if gaps.is_empty() {
            return None;
        }
        let provider = i64::try_from(provider_gap.as_micros()).unwrap_or(i64::MAX);
        let minus = |v: u64| {
            i64::try_from(v)
                .unwrap_or(i64::MAX)
                .saturating_sub(provider)
        };
        Some(Self {
            provider_gap_us: u64::try_from(provider).unwrap_or(0),
            count: gaps.len(),
            p50_us: minus(gaps.value_at_quantile(0.50)),
            p90_us: minus(gaps.value_at_quantile(0.90)),
            p99_us: minus(gaps.value_at_quantile(0.99)),
            max_us: minus(gaps.max()),
            mean_us: ((gaps.mean() - provider as f64) * 10.0).round() / 10.0,
        })
    }
}

#[derive(Debug)]
struct Locked {
    total: Latencies,
    /// Terminal latency in the current window (submit latency in submit-only mode).
    window: Histogram<u64>,
    timeline: Timeline,
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
    /// Executions that reached a terminal event, warm-up included (the divisor of the JetStream
    /// messages counted over the whole run).
    pub settled_all: AtomicU64,
    /// Start of the measured run: the timeline's origin.
    measure_start: Instant,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new(Instant::now(), Duration::from_secs(1))
    }
}

impl Recorder {
    /// A recorder whose timeline starts at `measure_start`, in buckets of `bucket`.
    pub fn new(measure_start: Instant, bucket: Duration) -> Self {
        Self {
            locked: Mutex::new(Locked {
                total: Latencies::new(),
                window: histogram(),
                timeline: Timeline::new(bucket),
                errors: BTreeMap::new(),
            }),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            errored: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            settled_all: AtomicU64::new(0),
            measure_start,
        }
    }

    /// Records one execution that reached a terminal event.
    pub fn execution(&self, t: &ExecTiming) {
        let since_start = Instant::now().saturating_duration_since(self.measure_start);
        {
            let mut l = self.locked.lock();
            l.timeline.record(since_start);
            for gap in &t.gaps_us {
                let _ = l.total.delta_gap.record(u64::from(*gap));
            }
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
            if let Some(d) = t.route_stamped {
                let _ = l.total.route_stamped.record(micros(d));
            }
            if let Some(d) = t.first_delta_stamped {
                let _ = l.total.first_delta_stamped.record(micros(d));
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
        let since_start = Instant::now().saturating_duration_since(self.measure_start);
        {
            let mut l = self.locked.lock();
            l.timeline.record(since_start);
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

    pub fn finish(&self) -> (Latencies, BTreeMap<String, u64>, Timeline) {
        let mut l = self.locked.lock();
        let total = std::mem::replace(&mut l.total, Latencies::new());
        let bucket = l.timeline.bucket();
        let timeline = std::mem::replace(&mut l.timeline, Timeline::new(bucket));
        (total, std::mem::take(&mut l.errors), timeline)
    }
}

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
            route_stamped: None,
            first_delta_stamped: None,
            last_delta: Some(Duration::from_micros(290)),
            deltas: 4,
            terminal: Duration::from_micros(300),
            completed: true,
            gaps_us: vec![30, 0, 60],
        };
        rec.execution(&t);
        rec.execution(&ExecTiming {
            completed: false,
            first_delta: None,
            route_stamped: None,
            first_delta_stamped: None,
            gaps_us: Vec::new(),
            ..t.clone()
        });
        rec.error(&ExecError::SubmitStatus(429));
        assert_eq!(rec.ok.load(Ordering::Relaxed), 1);
        assert_eq!(rec.failed.load(Ordering::Relaxed), 1);
        assert_eq!(rec.take_window().len(), 2);
        assert!(rec.take_window().is_empty());
        let (lat, errors, timeline) = rec.finish();
        assert_eq!(lat.terminal.len(), 2);
        assert_eq!(lat.delta_gap.len(), 3);
        assert_eq!(lat.delta_gap.min(), 0);
        assert_eq!(timeline.counts.iter().sum::<u64>(), 2);
        assert_eq!(lat.first_delta.len(), 1);
        // (290 - 200) us / 3 gaps = 30 us = 30,000 ns (3 significant figures).
        assert_eq!(lat.per_delta_ns.len(), 1);
        assert_eq!(lat.per_delta_ns.value_at_quantile(0.5) / 100, 300);
        assert_eq!(errors.get("submit_http_429"), Some(&1));
    }

    #[test]
    fn added_per_delta_subtracts_the_provider_gap_from_each_quantile() {
        let mut gaps = histogram();
        // 98 gaps of 10.2 ms, one of 0 (same read), one of 25 ms: provider gap 10 ms.
        for _ in 0..98 {
            gaps.record(10_200).unwrap();
        }
        gaps.record(0).unwrap();
        gaps.record(25_000).unwrap();
        let a = AddedPerDelta::of(&gaps, Duration::from_millis(10)).unwrap();
        assert_eq!(a.provider_gap_us, 10_000);
        assert_eq!(a.count, 100);
        // 10,200 is exact at 3 significant figures (resolution 8 µs above 8,192: 10,200 lies in
        // [10,200, 10,208)); the quantile reports the bucket's highest equivalent value.
        assert!((200..=208).contains(&a.p50_us), "{a:?}");
        assert!((200..=208).contains(&a.p90_us), "{a:?}");
        assert!((14_990..=15_020).contains(&a.max_us), "{a:?}");
        // A negative figure is kept: deltas that arrive together show as -provider gap.
        let mut together = histogram();
        together.record(0).unwrap();
        let b = AddedPerDelta::of(&together, Duration::from_millis(10)).unwrap();
        assert_eq!(b.p50_us, -10_000);
        assert!(AddedPerDelta::of(&histogram(), Duration::from_millis(10)).is_none());
    }

    #[test]
    fn timeline_buckets_by_second_and_rates_the_partial_last_bucket() {
        let mut t = Timeline::new(Duration::from_secs(1));
        for ms in [0, 10, 999, 1_000, 2_500, 2_600] {
            t.record(Duration::from_millis(ms));
        }
        assert_eq!(t.counts, vec![3, 1, 2]);
        // The run lasted 2.5 s: the third bucket covered 0.5 s, a fourth none at all.
        let r = t.rates(Duration::from_millis(2_500));
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0],
            TimelinePoint {
                start_s: 0.0,
                per_s: 3.0
            }
        );
        assert_eq!(r[1].per_s, 1.0);
        assert_eq!(r[2].start_s, 2.0);
        assert!((r[2].per_s - 4.0).abs() < 1e-9);
        // A last bucket covered for less than half its width (draining executions) is left out.
        let r = t.rates(Duration::from_millis(2_400));
        assert_eq!(r.len(), 2);
        // Empty buckets inside the run are reported as 0.
        let mut gap = Timeline::new(Duration::from_millis(500));
        gap.record(Duration::from_millis(1_700));
        let r = gap.rates(Duration::from_secs(2));
        assert_eq!(
            r.iter().map(|p| p.per_s).collect::<Vec<_>>(),
            vec![0.0, 0.0, 0.0, 2.0]
        );
    }

    #[test]
    fn timeline_caps_the_number_of_buckets() {
        let mut t = Timeline::new(Duration::from_secs(1));
        t.record(Duration::from_secs(10 * MAX_BUCKETS as u64));
        assert_eq!(t.counts.len(), MAX_BUCKETS);
        assert_eq!(t.counts[MAX_BUCKETS - 1], 1);
    }
}
