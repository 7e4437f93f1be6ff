//! How long a pipelined [`crate::EventWriter`] holds an execution's output between two appends.
//!
//! A pipelined writer sends what is queued as soon as the previous append is acknowledged, so a
//! token stream whose deltas come further apart than an append's round trip is stored one
//! message per delta. That costs nothing while the store keeps up. On a saturated deployment
//! every message (stored, republished, read by a gateway) competes for the same cores, and
//! fewer, larger messages carry the same events for less (BENCHMARKS.md, "Fixed pace" and
//! "Adaptive pace"). A
//! [`Pace`] says how long after a run holding output the next run holding output may leave:
//!
//! - [`Pace::Off`]: never held.
//! - [`Pace::Fixed`]: always at least this long apart (the worker's `--append-pace-ms N`).
//! - [`Pace::Adaptive`] (the worker's default): held only while the store is slow. Every
//!   writer sharing one [`AppendPressure`] reports how long its appends took to be
//!   acknowledged; while their moving average is under a threshold nothing is held (no added
//!   latency while the store keeps up), and from there on output runs are held for
//!   [`HOLD_FACTOR`] times the average's excess over it, at most [`ADAPTIVE_MAX`] (with the
//!   usual 1 ms threshold, a 2 ms average holds 40 ms, a 3 ms one 80 ms). The threshold is
//!   [`ENGAGE_AT`], or [`FLOOR_FACTOR`] times the fastest acknowledgement seen if that is
//!   more: a store whose round trip is long even when nothing queues (replicas across zones)
//!   is not mistaken for a busy one. The hold relieves the store, the acknowledgements get
//!   faster and the hold shrinks again: it settles where the store keeps up. The rule is
//!   continuous, so it settles rather than flapping on and off at a threshold.
//!
//! What is never held, whatever the pace: the first output after routing, a queued terminal
//! event and anything a caller flushes (see the writer's module docs). Readers see the same
//! events either way; only the moment a held delta becomes visible moves.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The average acknowledgement time from which an adaptive pace holds output: several times an
/// append's round trip on a store that keeps up (0.1–0.3 ms on one machine), so only a
/// queueing store engages it.
pub const ENGAGE_AT: Duration = Duration::from_millis(1);

/// How many times the fastest acknowledgement seen (the store's round trip when nothing
/// queues) the average must exceed before an adaptive pace holds output, where that is more
/// than [`ENGAGE_AT`].
pub const FLOOR_FACTOR: u32 = 4;

/// How many times the average's excess over [`ENGAGE_AT`] an adaptive pace holds output.
pub const HOLD_FACTOR: u32 = 40;

/// The longest hold of an adaptive pace: a stream's deltas are never shown later than this by
/// the pace. Reached only by a store far behind (an average of 3.5 ms with the usual 1 ms
/// threshold, as with 1,024 streams on one 2-core machine), where
/// every event is late anyway and fewer messages are what lets it catch up (BENCHMARKS.md,
/// "Adaptive pace": a 50 ms cap left 1,024 streams' first deltas twice as late).
pub const ADAPTIVE_MAX: Duration = Duration::from_millis(100);

/// How much of each new acknowledgement time enters the moving average (1/16: it follows the
/// store within a few dozen appends, and a single slow acknowledgement fades as fast).
const WEIGHT_SHIFT: u32 = 4;

/// The most one acknowledgement counts for (an append retried through an outage takes
/// seconds, which says nothing about the store's load once it is back).
const SAMPLE_MAX: Duration = Duration::from_secs(1);

/// See the module docs. Cloning shares the pressure of an adaptive pace.
#[derive(Debug, Clone, Default)]
pub enum Pace {
    /// Output is never held.
    #[default]
    Off,
    /// Output runs at least this far apart (zero is the same as [`Pace::Off`]).
    Fixed(Duration),
    /// Output held only while the store is slow, by how slow it is.
    Adaptive(Arc<AppendPressure>),
}

impl Pace {
    /// An adaptive pace with a pressure of its own (share it by cloning the pace).
    pub fn adaptive() -> Self {
        Self::Adaptive(Arc::new(AppendPressure::default()))
    }

    /// How long after a run holding output the next run holding output waits, now.
    pub fn hold(&self) -> Duration {
        match self {
            Self::Off => Duration::ZERO,
            Self::Fixed(pace) => *pace,
            Self::Adaptive(pressure) => pressure.hold(),
        }
    }

    /// Reports that an append took `took` to be acknowledged (kept only by an adaptive pace).
    pub fn observe(&self, took: Duration) {
        if let Self::Adaptive(pressure) = self {
            pressure.observe(took);
        }
    }
}

/// The moving average of how long appends take to be acknowledged, shared by the writers of
/// one process (they share the store, so they share its load).
#[derive(Debug, Default)]
pub struct AppendPressure {
    /// The average, in microseconds.
    average_us: AtomicU64,
    /// The fastest acknowledgement seen, in microseconds; 0 before the first.
    floor_us: AtomicU64,
}

impl AppendPressure {
    /// Adds one acknowledgement time to the average (an exponentially weighted moving average
    /// with weight 1/16; concurrent updates may overwrite each other, which only drops samples).
    pub fn observe(&self, took: Duration) {
        let sample = u64::try_from(took.min(SAMPLE_MAX).as_micros()).unwrap_or(u64::MAX);
        let old = self.average_us.load(Ordering::Relaxed);
        let new = if sample >= old {
            old + ((sample - old) >> WEIGHT_SHIFT)
        } else {
            old - ((old - sample) >> WEIGHT_SHIFT)
        };
        self.average_us.store(new, Ordering::Relaxed);
        // At least 1 µs, so 0 keeps meaning "none yet".
        let fastest = sample.max(1);
        let floor = self.floor_us.load(Ordering::Relaxed);
        if floor == 0 || fastest < floor {
            self.floor_us.store(fastest, Ordering::Relaxed);
        }
    }

    /// The current average acknowledgement time.
    pub fn average(&self) -> Duration {
        Duration::from_micros(self.average_us.load(Ordering::Relaxed))
    }

    /// The average acknowledgement time from which output is held (see the module docs).
    pub fn threshold(&self) -> Duration {
        let floor = Duration::from_micros(self.floor_us.load(Ordering::Relaxed));
        ENGAGE_AT.max(floor * FLOOR_FACTOR)
    }

    /// The hold this average calls for (see the module docs).
    pub fn hold(&self) -> Duration {
        (self.average().saturating_sub(self.threshold()) * HOLD_FACTOR).min(ADAPTIVE_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pressure on one machine (its fastest acknowledgement took 0.1 ms) whose average has
    /// settled at `took`.
    fn settled_at(took: Duration) -> AppendPressure {
        let pressure = AppendPressure::default();
        pressure.observe(Duration::from_micros(100));
        feed(|t| pressure.observe(t), took, 400);
        pressure
    }

    /// Reports `times` acknowledgements of `took` each.
    fn feed(observe: impl Fn(Duration), took: Duration, times: usize) {
        for _ in 0..times {
            observe(took);
        }
    }

    #[test]
    fn a_store_that_keeps_up_holds_nothing() {
        let pressure = settled_at(Duration::from_micros(800));
        assert!(pressure.average() > Duration::from_micros(750));
        assert_eq!(pressure.hold(), Duration::ZERO);
        assert_eq!(Pace::Off.hold(), Duration::ZERO);
        assert_eq!(
            Pace::Fixed(Duration::from_millis(7)).hold(),
            Duration::from_millis(7)
        );
    }

    #[test]
    fn a_slow_store_holds_output_forty_times_its_excess_acknowledgement_time_up_to_the_maximum() {
        let hold = settled_at(Duration::from_millis(3)).hold();
        assert!(
            hold > Duration::from_millis(79) && hold <= Duration::from_millis(80),
            "{hold:?}"
        );
        assert_eq!(settled_at(Duration::from_millis(45)).hold(), ADAPTIVE_MAX);
    }

    #[test]
    fn one_slow_acknowledgement_engages_it_briefly_and_an_outage_counts_for_a_second_at_most() {
        let pressure = settled_at(Duration::from_micros(500));
        pressure.observe(Duration::from_millis(100));
        assert!(pressure.hold() > Duration::ZERO);
        feed(|t| pressure.observe(t), Duration::from_micros(500), 40);
        assert_eq!(pressure.hold(), Duration::ZERO, "{:?}", pressure.average());
        pressure.observe(Duration::from_secs(30));
        assert!(pressure.average() < Duration::from_millis(70));
    }

    #[test]
    fn a_store_with_a_long_round_trip_is_held_only_beyond_four_times_its_fastest_acknowledgement() {
        // Replicas across zones: 3 ms even when nothing queues.
        let far = AppendPressure::default();
        far.observe(Duration::from_millis(3));
        feed(|t| far.observe(t), Duration::from_millis(5), 400);
        assert_eq!(far.threshold(), Duration::from_millis(12));
        assert_eq!(
            far.hold(),
            Duration::ZERO,
            "5 ms is not busy for this store"
        );
        feed(|t| far.observe(t), Duration::from_millis(14), 400);
        let hold = far.hold();
        assert!(hold > Duration::from_millis(75) && hold <= Duration::from_millis(80));
        // One box: a 0.1 ms round trip keeps the 1 ms threshold.
        let near = settled_at(Duration::from_millis(5));
        assert_eq!(near.threshold(), ENGAGE_AT);
        assert!(near.hold() > Duration::from_millis(70));
    }

    #[test]
    fn the_hold_shrinks_again_once_the_store_catches_up() {
        let pace = Pace::adaptive();
        pace.observe(Duration::from_micros(100));
        feed(|t| pace.observe(t), Duration::from_millis(40), 400);
        assert_eq!(pace.hold(), ADAPTIVE_MAX);
        let shared = pace.clone();
        feed(|t| shared.observe(t), Duration::from_micros(500), 200);
        assert_eq!(pace.hold(), Duration::ZERO, "the clone shares the pressure");
    }
}
