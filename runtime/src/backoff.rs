//! How often a transiently failing backend operation is tried again.
//!
//! The failure these retries mostly ride out is a JetStream leader election: a follower waits 4
//! to 9 s for a lost leader before it campaigns (nats-server's Raft timeouts, not configurable),
//! and until a new leader is elected every write to that stream fails. What matters to a caller
//! is how soon after the election the next try comes, so the pause between tries grows quickly
//! to a short cap (a second) and stays there; how long to keep trying is a separate budget of
//! elapsed time, not a count of tries, so a shorter cap never shortens the time a blip may last.

use std::time::Duration;

use tokio::time::Instant;

/// Pauses between tries: `first`, doubling up to `cap`; with a budget, none that would start a
/// try later than the budget after the first failure.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    next: Duration,
    cap: Duration,
    budget: Option<Duration>,
    /// When the first pause was asked for (the first failure): the budget counts from there.
    started: Option<Instant>,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `cap`, for as long as the caller keeps asking.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            next: first,
            cap,
            budget: None,
            started: None,
        }
    }

    /// The same pauses, but none that would start a try more than `budget` after the first
    /// failure.
    pub const fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The pause before the next try, or `None` when the budget is spent (give up).
    pub fn next_pause(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let started = *self.started.get_or_insert(now);
        let pause = self.next;
        if let Some(budget) = self.budget
            && (now + pause).duration_since(started) > budget
        {
            return None;
        }
        self.next = (self.next * 2).min(self.cap);
        Some(pause)
    }

    /// Starts over after a success: the next failure pauses `first` and has the whole budget.
    pub fn reset(&mut self) {
        self.next = self.first;
        self.started = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_double_up_to_the_cap_and_stay_there() {
        let mut backoff = Backoff::new(ms(50), ms(1000));
        let pauses: Vec<u64> = (0..8)
            .map(|_| backoff.next_pause().unwrap().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_counts_elapsed_time_from_the_first_failure() {
        let mut backoff = Backoff::new(ms(50), ms(1000)).with_budget(Duration::from_secs(5));
        let mut tries_at = vec![];
        let start = Instant::now();
        while let Some(pause) = backoff.next_pause() {
            tokio::time::sleep(pause).await;
            tries_at.push(start.elapsed().as_millis() as u64);
        }
        assert_eq!(
            tries_at,
            [50, 150, 350, 750, 1550, 2550, 3550, 4550],
            "no try after 5 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reset_starts_the_pauses_and_the_budget_over() {
        let mut backoff = Backoff::new(ms(50), ms(1000)).with_budget(Duration::from_secs(2));
        while let Some(pause) = backoff.next_pause() {
            tokio::time::sleep(pause).await;
        }
        backoff.reset();
        assert_eq!(backoff.next_pause(), Some(ms(50)));
        assert_eq!(backoff.next_pause(), Some(ms(100)));
    }
}
