//! The in-memory job queue: an unbounded channel (admission bounds it) with a short dedupe
//! window on execution ids.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex as SyncMutex;
use protocol::ExecutionId;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::job::{Delivery, DeliveryHandle, Job, JobQueue};

const DEDUPE_WINDOW: Duration = Duration::from_secs(120);
/// Most ids remembered, whatever the window: keeps memory flat at high throughput. Embedded
/// mode publishes each execution once, so the window only guards against a retried publish.
const DEDUPE_MAX_IDS: usize = 65_536;

#[derive(Default)]
struct Dedupe {
    seen: HashSet<ExecutionId>,
    order: VecDeque<(Instant, ExecutionId)>,
}

/// See the module docs.
pub struct MemoryJobQueue {
    tx: mpsc::UnboundedSender<Job>,
    rx: Mutex<mpsc::UnboundedReceiver<Job>>,
    dedupe: SyncMutex<Dedupe>,
    closed: CancellationToken,
}

impl std::fmt::Debug for MemoryJobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryJobQueue").finish_non_exhaustive()
    }
}

impl Default for MemoryJobQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryJobQueue {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            tx,
            rx: Mutex::new(rx),
            dedupe: SyncMutex::new(Dedupe::default()),
            closed: CancellationToken::new(),
        }
    }
}

struct NoopHandle;

#[async_trait]
impl DeliveryHandle for NoopHandle {
    async fn ack(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[async_trait]
impl JobQueue for MemoryJobQueue {
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        if self.closed.is_cancelled() {
            return Err(StoreError::Closed);
        }
        {
            let mut d = self.dedupe.lock();
            let now = Instant::now();
            while let Some(&(at, id)) = d.order.front() {
                if now.duration_since(at) < DEDUPE_WINDOW && d.order.len() < DEDUPE_MAX_IDS {
                    break;
                }
                d.order.pop_front();
                d.seen.remove(&id);
            }
            if !d.seen.insert(job.execution_id) {
                return Ok(());
            }
            d.order.push_back((now, job.execution_id));
        }
        self.tx.send(job.clone()).map_err(|_| StoreError::Closed)
    }

    async fn receive(&self) -> Result<Option<Delivery>, StoreError> {
        let mut rx = tokio::select! {
            rx = self.rx.lock() => rx,
            () = self.closed.cancelled() => return Ok(None),
        };
        tokio::select! {
            job = rx.recv() => Ok(job.map(|job| Delivery { job, delivered: 1, handle: Box::new(NoopHandle) })),
            () = self.closed.cancelled() => Ok(None),
        }
    }

    fn close(&self) {
        self.closed.cancel();
    }

    async fn ready(&self) -> Result<(), StoreError> {
        if self.closed.is_cancelled() {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }
}

impl MemoryJobQueue {
    /// Removes and returns every job not yet received (used at shutdown, after `close`, to
    /// cancel executions that never started).
    pub fn take_pending(&self) -> Vec<Job> {
        let mut out = Vec::new();
        if let Ok(mut rx) = self.rx.try_lock() {
            while let Ok(job) = rx.try_recv() {
                out.push(job);
            }
        }
        out
    }
}
