//! The in-memory job queue: an unbounded channel (admission bounds it) with a short dedupe
//! window on execution ids. Jobs are also listed by position until acknowledged, so `scan`
//! behaves as in the NATS queue (admission bounds that list too).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use parking_lot::Mutex as SyncMutex;
use protocol::ExecutionId;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::job::{Deliveries, Delivery, DeliveryHandle, Job, JobQueue, QueuedJob};

const DEDUPE_WINDOW: Duration = Duration::from_secs(120);
/// Most ids remembered, whatever the window: keeps memory flat at high throughput. Embedded
/// mode publishes each execution once, so the window only guards against a retried publish.
const DEDUPE_MAX_IDS: usize = 65_536;

#[derive(Default)]
struct Held {
    next: u64,
    jobs: BTreeMap<u64, QueuedJob>,
    /// Withdrawn executions whose job is still in the channel or delivered and not yet
    /// acknowledged (withdrawals are rare: only failed submissions).
    withdrawn: HashSet<ExecutionId>,
}

#[derive(Default)]
struct Dedupe {
    seen: HashSet<ExecutionId>,
    order: VecDeque<(Instant, ExecutionId)>,
}

/// See the module docs.
pub struct MemoryJobQueue {
    tx: mpsc::UnboundedSender<(u64, Job)>,
    rx: Mutex<mpsc::UnboundedReceiver<(u64, Job)>>,
    dedupe: SyncMutex<Dedupe>,
    /// Jobs published and not yet acknowledged, by position.
    held: Arc<SyncMutex<Held>>,
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
            held: Arc::new(SyncMutex::new(Held::default())),
            closed: CancellationToken::new(),
        }
    }
}

/// Acknowledging removes the job from the held list; the lease never lapses.
struct MemoryHandle {
    held: Arc<SyncMutex<Held>>,
    position: u64,
    execution_id: ExecutionId,
}

#[async_trait]
impl DeliveryHandle for MemoryHandle {
    async fn ack(&self) -> Result<(), StoreError> {
        let mut held = self.held.lock();
        held.jobs.remove(&self.position);
        held.withdrawn.remove(&self.execution_id);
        Ok(())
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn withdrawn(&self) -> Result<bool, StoreError> {
        Ok(self.held.lock().withdrawn.contains(&self.execution_id))
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
        let position = {
            let mut held = self.held.lock();
            held.next += 1;
            let position = held.next;
            held.jobs.insert(
                position,
                QueuedJob {
                    position,
                    execution_id: job.execution_id,
                    deadline_at: job.deadline_at,
                },
            );
            position
        };
        self.tx.send((position, job.clone())).map_err(|_| {
            self.held.lock().jobs.remove(&position);
            StoreError::Closed
        })
    }

    async fn withdraw(&self, job: &Job) -> Result<(), StoreError> {
        let id = job.execution_id;
        let mut held = self.held.lock();
        // Only a failing submission withdraws, so a scan of the held jobs is fine here.
        held.jobs.retain(|_, queued| queued.execution_id != id);
        held.withdrawn.insert(id);
        Ok(())
    }

    async fn receive(&self) -> Result<Option<Delivery>, StoreError> {
        Ok(self.take(1).await?.and_then(|mut taken| taken.pop()))
    }

    /// The next job as `receive` waits for it, then every job already waiting, up to `max`.
    async fn receive_up_to(&self, max: usize) -> Result<Option<Deliveries>, StoreError> {
        Ok(self
            .take(max)
            .await?
            .map(|taken| futures_util::stream::iter(taken.into_iter().map(Ok)).boxed()))
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

    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<QueuedJob>, StoreError> {
        let held = self.held.lock();
        Ok(held
            .jobs
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(_, job)| *job)
            .collect())
    }
}

impl MemoryJobQueue {
    /// Waits for the next job not withdrawn, then takes every job already waiting, up to `max`
    /// in all (at least one); `None` once the queue is closed.
    async fn take(&self, max: usize) -> Result<Option<Vec<Delivery>>, StoreError> {
        let mut rx = tokio::select! {
            rx = self.rx.lock() => rx,
            () = self.closed.cancelled() => return Ok(None),
        };
        let mut taken = Vec::new();
        while taken.is_empty() {
            let received = tokio::select! {
                job = rx.recv() => job,
                () = self.closed.cancelled() => return Ok(None),
            };
            let Some((position, job)) = received else {
                return Ok(None);
            };
            taken.extend(self.deliver(position, job));
        }
        while taken.len() < max {
            let Ok((position, job)) = rx.try_recv() else {
                break;
            };
            taken.extend(self.deliver(position, job));
        }
        Ok(Some(taken))
    }

    /// The delivery of a received job; `None` for a withdrawn one (dropped).
    fn deliver(&self, position: u64, job: Job) -> Option<Delivery> {
        if self.held.lock().withdrawn.remove(&job.execution_id) {
            return None;
        }
        Some(Delivery {
            handle: Box::new(MemoryHandle {
                held: Arc::clone(&self.held),
                position,
                execution_id: job.execution_id,
            }),
            job,
            delivered: 1,
        })
    }

    /// Removes and returns every job not yet received (used at shutdown, after `close`, to
    /// cancel executions that never started).
    pub fn take_pending(&self) -> Vec<Job> {
        let mut out = Vec::new();
        if let Ok(mut rx) = self.rx.try_lock() {
            while let Ok((position, job)) = rx.try_recv() {
                let mut held = self.held.lock();
                held.jobs.remove(&position);
                if !held.withdrawn.remove(&job.execution_id) {
                    out.push(job);
                }
            }
        }
        out
    }
}
