//! Per-provider flow control [R 35-37]: at most `max_concurrency` attempts run at once, at most
//! `max_queue_depth` wait (FIFO), and a full queue fails the attempt at once with retryable
//! `queue_full` so that fallback can apply. Waiting is cancellable: dropping the future leaves
//! the queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use protocol::RuntimeError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// See the module docs.
#[derive(Debug)]
pub struct ConcurrencyGate {
    permits: Arc<Semaphore>,
    max_concurrency: usize,
    max_queue_depth: usize,
    waiting: AtomicUsize,
}

/// Holding this is permission to run one attempt.
#[derive(Debug)]
pub struct GatePermit {
    _permit: OwnedSemaphorePermit,
}

struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConcurrencyGate {
    pub fn new(max_concurrency: u32, max_queue_depth: u32) -> Self {
        let max_concurrency = max_concurrency.max(1) as usize;
        Self {
            permits: Arc::new(Semaphore::new(max_concurrency)),
            max_concurrency,
            max_queue_depth: max_queue_depth as usize,
            waiting: AtomicUsize::new(0),
        }
    }

    /// Waits for a slot, FIFO, or fails with retryable `queue_full` when the queue is full.
    pub async fn acquire(&self) -> Result<GatePermit, RuntimeError> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Ok(GatePermit { _permit: permit });
        }
        let reserved = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < self.max_queue_depth).then_some(w + 1)
            });
        if reserved.is_err() {
            return Err(RuntimeError::provider_queue_full());
        }
        let _waiting = Waiting(&self.waiting);
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map(|permit| GatePermit { _permit: permit })
            .map_err(|_| RuntimeError::internal())
    }

    /// Attempts allowed to run at once (`max_concurrency`).
    pub fn max_concurrency(&self) -> usize {
        self.max_concurrency
    }

    /// Attempts waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use protocol::ErrorCode;
    use std::time::Duration;

    #[tokio::test]
    async fn full_queue_fails_fast_and_retryably() {
        let gate = Arc::new(ConcurrencyGate::new(1, 1));
        let held = gate.acquire().await.unwrap();
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.acquire().await.map(|_| ()) })
        };
        while gate.queued() == 0 {
            tokio::task::yield_now().await;
        }
        let err = gate.acquire().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::QueueFull);
        assert!(err.retryable);
        drop(held);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn zero_queue_depth_means_no_queueing() {
        let gate = ConcurrencyGate::new(1, 0);
        let _held = gate.acquire().await.unwrap();
        assert_eq!(gate.acquire().await.unwrap_err().code, ErrorCode::QueueFull);
    }

    #[tokio::test]
    async fn waiters_are_served_fifo_and_cancelled_waiters_leave() {
        let gate = Arc::new(ConcurrencyGate::new(1, 8));
        let held = gate.acquire().await.unwrap();
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let waiter_gate = Arc::clone(&gate);
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let _p = waiter_gate.acquire().await.unwrap();
                order.lock().push(i);
            }));
            while gate.queued() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        // A cancelled waiter leaves the queue.
        let cancelled = tokio::time::timeout(Duration::from_millis(10), gate.acquire()).await;
        assert!(cancelled.is_err());
        assert_eq!(gate.queued(), 4);
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), vec![0, 1, 2, 3]);
    }
}
