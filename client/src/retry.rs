//! Bounded retries with exponential backoff and jitter.
//!
//! One policy serves the two places the client repeats work by itself: idempotent calls (reads,
//! and submissions that carry an idempotency key) after a transient failure, and event streams
//! resuming after a truncation. The budget counts *consecutive* failures: an event stream that
//! delivered an event since its last failure starts again from the first delay, so a long
//! execution survives any number of well-separated connection losses.

use std::time::Duration;

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// Delay before the first retry; doubled for each further one.
    pub initial_backoff: Duration,
    /// Upper bound of one delay (before jitter).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 8 retries, 100 ms doubling up to 5 s: about 15 s of patience in total.
    fn default() -> Self {
        Self {
            max_retries: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Longest `Retry-After` honoured, so a misconfigured server cannot park the client for hours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The delay before retry number `retry` (1-based): `initial * 2^(retry-1)` capped at
    /// `max_backoff`, then "equal jitter" (a uniform pick in the upper half) so that clients
    /// cut off together do not come back together. A server's `Retry-After` is a lower bound.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let exponent = retry.saturating_sub(1).min(31);
        let base = self
            .initial_backoff
            .saturating_mul(1u32 << exponent)
            .min(self.max_backoff);
        let half = base / 2;
        let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if jitter_nanos == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(rand::random_range(0..=jitter_nanos))
        };
        let delay = half + jitter;
        match retry_after {
            Some(after) => delay.max(after.min(MAX_RETRY_AFTER)),
            None => delay,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_stay_bounded_and_jitter() {
        let policy = RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        for _ in 0..100 {
            let first = policy.delay(1, None);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = policy.delay(3, None);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let late = policy.delay(40, None);
            assert!(late >= Duration::from_millis(500) && late <= Duration::from_secs(1));
        }
        let delays: std::collections::HashSet<Duration> =
            (0..20).map(|_| policy.delay(5, None)).collect();
        assert!(delays.len() > 1, "jitter varies the delay");
    }

    #[test]
    fn retry_after_is_a_bounded_lower_bound() {
        let policy = RetryPolicy::default();
        assert!(policy.delay(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
        assert!(policy.delay(1, Some(Duration::from_secs(3600))) <= Duration::from_secs(60));
    }
}
