//! The in-memory job queue: one queue per tenant, served in turn (admission bounds them), with
//! a short dedupe window on execution ids. A receive takes one job of each tenant with jobs
//! waiting, in turn, so one tenant's backlog never holds another tenant's jobs back: a tenant
//! whose first job arrives behind a thousand of another's is served next. Jobs are also listed
//! by position until acknowledged, so `scan` behaves as in the NATS queue (admission bounds
//! that list too).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use parking_lot::Mutex as SyncMutex;
use protocol::ExecutionId;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::job::{Deliveries, Delivery, DeliveryHandle, HeldSpan, Job, JobQueue, QueuedJob};

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

/// Jobs not yet received: per tenant in publish order, the tenants with jobs in turn.
#[derive(Default)]
struct Waiting {
    by_tenant: HashMap<Arc<str>, VecDeque<(u64, Job)>>,
    turn: VecDeque<Arc<str>>,
}

impl Waiting {
    fn push(&mut self, position: u64, job: Job) {
        let tenant = job.tenant_name();
        match self.by_tenant.get_mut(tenant) {
            Some(jobs) => jobs.push_back((position, job)),
            None => {
                let tenant: Arc<str> = Arc::from(tenant);
                self.turn.push_back(Arc::clone(&tenant));
                self.by_tenant
                    .insert(tenant, VecDeque::from([(position, job)]));
            }
        }
    }

    /// The next tenant's oldest job; that tenant's turn comes again after every other's.
    fn pop(&mut self) -> Option<(u64, Job)> {
        let tenant = self.turn.pop_front()?;
        let jobs = self.by_tenant.get_mut(&tenant)?;
        let next = jobs.pop_front();
        if jobs.is_empty() {
            self.by_tenant.remove(&tenant);
        } else {
            self.turn.push_back(tenant);
        }
        next
    }
}

/// See the module docs.
pub struct MemoryJobQueue {
    waiting: SyncMutex<Waiting>,
    /// Woken on every publish and on close.
    published: Notify,
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
        Self {
            waiting: SyncMutex::new(Waiting::default()),
            published: Notify::new(),
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
        self.waiting.lock().push(position, job.clone());
        self.published.notify_waiters();
        Ok(())
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

    /// The jobs waiting now, up to `max`, in turn (see the module docs).
    async fn take_from(
        &self,
        _source: usize,
        max: usize,
    ) -> Result<Option<Deliveries>, StoreError> {
        if self.closed.is_cancelled() {
            return Ok(None);
        }
        let taken = self.take_waiting(max);
        Ok(Some(
            futures_util::stream::iter(taken.into_iter().map(Ok)).boxed(),
        ))
    }

    fn close(&self) {
        self.closed.cancel();
        self.published.notify_waiters();
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

    async fn held_span(&self, _partition: usize) -> Result<HeldSpan, StoreError> {
        let held = self.held.lock();
        // Positions start at 1; with nothing held, every position given out is done with.
        let first = held
            .jobs
            .first_key_value()
            .map_or(held.next.saturating_add(1), |(&position, _)| position);
        Ok(HeldSpan {
            first,
            jobs: Some(held.jobs.len() as u64),
        })
    }
}

impl MemoryJobQueue {
    /// Waits for a job not withdrawn, then takes every job already waiting, up to `max` in all
    /// (at least one), tenants in turn; `None` once the queue is closed.
    async fn take(&self, max: usize) -> Result<Option<Vec<Delivery>>, StoreError> {
        loop {
            let published = self.published.notified();
            tokio::pin!(published);
            // Registered before looking, so a publish in between is not missed.
            published.as_mut().enable();
            if self.closed.is_cancelled() {
                return Ok(None);
            }
            let taken = self.take_waiting(max);
            if !taken.is_empty() {
                return Ok(Some(taken));
            }
            tokio::select! {
                () = published => {}
                () = self.closed.cancelled() => return Ok(None),
            }
        }
    }

    /// The jobs waiting now, up to `max`, one of each tenant in turn; withdrawn ones dropped.
    fn take_waiting(&self, max: usize) -> Vec<Delivery> {
        let mut taken = Vec::new();
        while taken.len() < max.max(1) {
            let Some((position, job)) = self.waiting.lock().pop() else {
                break;
            };
            taken.extend(self.deliver(position, job));
        }
        taken
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
        while let Some((position, job)) = self.waiting.lock().pop() {
            let mut held = self.held.lock();
            held.jobs.remove(&position);
            if !held.withdrawn.remove(&job.execution_id) {
                out.push(job);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_of(tenant: Option<&str>) -> Job {
        let mut job = crate::contract::job(ExecutionId::new_random());
        job.tenant = tenant.map(|t| t.parse().unwrap());
        job
    }

    /// One tenant's backlog of 100 waits behind nobody's first job: each receive serves the
    /// tenants in turn, each in its own publish order.
    #[tokio::test]
    async fn tenants_are_served_in_turn_whatever_their_backlog() {
        let queue = MemoryJobQueue::new();
        let backlog: Vec<Job> = (0..100).map(|_| job_of(Some("a"))).collect();
        for job in &backlog {
            queue.publish(job).await.unwrap();
        }
        let b = job_of(Some("b"));
        let anonymous = job_of(None);
        queue.publish(&b).await.unwrap();
        queue.publish(&anonymous).await.unwrap();

        let taken = async |max| -> Vec<ExecutionId> {
            let taken = queue.take(max).await.unwrap().unwrap();
            taken.into_iter().map(|d| d.job.execution_id).collect()
        };
        assert_eq!(
            taken(4).await,
            [
                backlog[0].execution_id,
                b.execution_id,
                anonymous.execution_id,
                backlog[1].execution_id
            ]
        );
        let rest = taken(1000).await;
        let expected: Vec<ExecutionId> = backlog[2..].iter().map(|j| j.execution_id).collect();
        assert_eq!(rest, expected);
        assert!(queue.take_waiting(10).is_empty());
    }

    #[tokio::test]
    async fn a_waiting_receive_wakes_on_publish_and_on_close() {
        let queue = Arc::new(MemoryJobQueue::new());
        let waiting = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.take(8).await }
        });
        tokio::task::yield_now().await;
        let job = job_of(Some("a"));
        queue.publish(&job).await.unwrap();
        let taken = waiting.await.unwrap().unwrap().unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].job.execution_id, job.execution_id);

        let closed = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.take(8).await }
        });
        tokio::task::yield_now().await;
        queue.close();
        assert!(closed.await.unwrap().unwrap().is_none());
    }
}
