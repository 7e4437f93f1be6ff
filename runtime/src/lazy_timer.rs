//! A timer whose deadline moves far more often than it fires: [`LazyTimer`].
//!
//! tokio's timer driver (1.54, without `tokio_unstable`) keeps all of a runtime's timers in one
//! wheel behind one mutex. The first poll of a `Sleep` inserts it under that lock, and
//! dropping a `Sleep` that was polled takes the lock again to remove it; even resetting one
//! clones and drops the runtime's handle, two atomic operations on a counter every thread
//! shares. A wait made afresh for each message, as `tokio::time::timeout(period, next)` or a
//! `sleep` beside it in a `select!` is, so takes the process's one timer lock twice per
//! message, from every core: at thousands of token streams, hundreds of thousands of takes a
//! second of a single lock.
//!
//! [`LazyTimer`] keeps one `Sleep` in the wheel and only records where its deadline moved:
//! [`LazyTimer::set`] stores the instant, and the `Sleep` is reset only when it fires before
//! that instant (at most once per period while the deadline keeps moving later) or when a
//! deadline earlier than the one it waits for needs it sooner.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::time::{Instant, Sleep};

/// A timer that fires at its latest deadline (see the module docs). It elapses once `now`
/// passes the deadline last [set](LazyTimer::set), and stays elapsed until the deadline is set
/// later again.
#[derive(Debug)]
pub struct LazyTimer {
    /// The deadline the caller asked for.
    deadline: Instant,
    /// The timer in the runtime's wheel, made on the first poll (so a `LazyTimer` can be made
    /// outside a runtime); it waits for `deadline` or an earlier instant.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl LazyTimer {
    /// A timer that elapses at `deadline`.
    pub fn at(deadline: Instant) -> Self {
        Self {
            deadline,
            sleep: None,
        }
    }

    /// The deadline last set.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline to `deadline`: a later one is only recorded, an earlier one resets
    /// the timer in the wheel (under the driver's lock).
    pub fn set(&mut self, deadline: Instant) {
        self.deadline = deadline;
        if let Some(sleep) = &mut self.sleep
            && deadline < sleep.deadline()
        {
            sleep.as_mut().reset(deadline);
        }
    }

    /// Ready once the deadline has passed; registers the task to be woken when it does (or a
    /// little earlier, once, where the deadline moved later since the timer was armed).
    pub fn poll_elapsed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            ready!(sleep.as_mut().poll(cx));
            if deadline <= sleep.deadline() {
                return Poll::Ready(());
            }
            // It fired for an earlier deadline: wait on for the one set since.
            sleep.as_mut().reset(deadline);
        }
    }

    /// Waits until the deadline has passed.
    pub async fn elapsed(&mut self) {
        std::future::poll_fn(|cx| self.poll_elapsed(cx)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::FutureExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn it_elapses_at_the_latest_deadline_set() {
        let start = Instant::now();
        let mut timer = LazyTimer::at(start + Duration::from_millis(100));
        assert!(timer.elapsed().now_or_never().is_none(), "armed");
        // Moved later before it fires, as a wait restarted for each message moves it.
        for step in 1..=5u64 {
            tokio::time::advance(Duration::from_millis(50)).await;
            timer.set(Instant::now() + Duration::from_millis(100));
            assert!(
                timer.elapsed().now_or_never().is_none(),
                "not elapsed {step} steps on: its deadline moved"
            );
        }
        timer.elapsed().await;
        assert_eq!(
            Instant::now() - start,
            Duration::from_millis(350),
            "at the last deadline, not the first"
        );
        // It stays elapsed until set later again.
        assert!(timer.elapsed().now_or_never().is_some());
        timer.set(Instant::now() + Duration::from_millis(30));
        assert!(timer.elapsed().now_or_never().is_none());
        timer.elapsed().await;
        assert_eq!(Instant::now() - start, Duration::from_millis(380));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_fires_earlier() {
        let start = Instant::now();
        let mut timer = LazyTimer::at(start + Duration::from_secs(8));
        assert!(timer.elapsed().now_or_never().is_none());
        timer.set(start + Duration::from_millis(50));
        timer.elapsed().await;
        assert_eq!(Instant::now() - start, Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_past_is_elapsed_at_once() {
        let start = Instant::now();
        let mut timer = LazyTimer::at(start);
        assert!(timer.elapsed().now_or_never().is_some());
        tokio::time::advance(Duration::from_millis(10)).await;
        timer.set(start + Duration::from_millis(5));
        assert!(timer.elapsed().now_or_never().is_some());
    }

    #[test]
    fn it_is_made_outside_a_runtime() {
        let mut timer = LazyTimer::at(Instant::now());
        timer.set(Instant::now() + Duration::from_secs(1));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(timer.elapsed());
    }
}
