//! The job loop: `concurrency` slots. With a queue of one source, the loop waits for a free
//! slot, then asks the queue for as many jobs as slots are free then (at most [`MAX_PULL`]) in
//! one request, so no worker buffers jobs it cannot start and under load one round trip brings
//! several jobs.
//!
//! With several sources (partitions, and their tenant lanes), one loop per source, all sharing
//! the slots, each either *waiting* or *taking*:
//! - waiting, a loop holds no slot (a source without jobs holds none of the slots) and asks its
//!   source for one job or, when its last waiting request brought jobs, for its part of the
//!   slots free then, shared among such loops (`waiting_ask`), the request staying open a
//!   while, so jobs that arrive one at a time come through one request. Each job starts as it
//!   arrives, in a free slot, or, should the other loops have filled the slots meanwhile, once
//!   one frees, heartbeated while it waits (and the loop asks again only once its jobs all
//!   have a slot);
//! - once its source has jobs left, taking: as many as slots are free, up to its share,
//!   without waiting on the source, until the source runs dry. A request whose last delivery
//!   says its source had none left goes straight back to waiting, without a take that would
//!   only be told so.
//!
//! Free slots go to the loops in turn (the semaphore is first come, first served), so the
//! lanes of tenants with jobs share the slots evenly whatever their backlogs: one tenant's
//! thousand waiting jobs never stand in front of another tenant's first. Each job runs in its
//! slot, heartbeating the delivery while the execution runs, and is acknowledged once the log
//! is terminal. The slot is freed when the execution ends, before that acknowledgement's
//! round trip, so a busy worker takes its next job one round trip sooner.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::OptionFuture;
use futures_util::{FutureExt, StreamExt};
use runtime::backoff::Backoff;
use runtime::{Deliveries, Delivery, JobQueue, StoreError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::runner::{RunOutcome, Runner};

/// Pool settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Executions run at once by this process.
    pub concurrency: usize,
    /// How often a running delivery's lease is extended when its queue does not report the
    /// lease (see `DeliveryHandle::lease`).
    pub heartbeat: Duration,
}

impl Default for PoolConfig {
    /// 16 slots (a configured provider's default `max_concurrency`); processes size theirs
    /// with `crate::capacity`.
    fn default() -> Self {
        Self {
            concurrency: 16,
            heartbeat: Duration::from_secs(10),
        }
    }
}

/// A running pool. Dropping it does not stop it; call [`WorkerPool::shutdown`].
pub struct WorkerPool {
    runner: Arc<Runner>,
    stop: CancellationToken,
    tracker: TaskTracker,
    main: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool").finish_non_exhaustive()
    }
}

impl WorkerPool {
    /// Starts pulling jobs.
    pub fn spawn(queue: Arc<dyn JobQueue>, runner: Arc<Runner>, config: PoolConfig) -> Self {
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let main = tokio::spawn(receive_loops(
            queue,
            Arc::clone(&runner),
            config,
            stop.clone(),
            tracker.clone(),
        ));
        Self {
            runner,
            stop,
            tracker,
            main,
        }
    }

    /// Executions running now.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Stops taking jobs, lets running executions finish for `grace`, then cancels the rest
    /// (each gets a `cancelled` terminal event). Returns whether everything finished in time.
    pub async fn shutdown(self, grace: Duration) -> bool {
        self.stop.cancel();
        let _ = self.main.await;
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
        {
            return true;
        }
        self.runner.abort_all();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.tracker.wait()).await;
        false
    }
}

/// Most jobs asked for in one request (JetStream caps a pull's batch at 256).
pub const MAX_PULL: usize = 64;

/// One receive loop per source of the queue (see the module docs), all sharing the pool's
/// slots. A taking loop asks for at most its share of them (`concurrency / partitions`,
/// rounded up) a request.
async fn receive_loops(
    queue: Arc<dyn JobQueue>,
    runner: Arc<Runner>,
    config: PoolConfig,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let sources = queue.sources().max(1);
    let busy = Arc::new(AtomicUsize::new(0));
    let puller = |source, share| Puller {
        queue: Arc::clone(&queue),
        runner: Arc::clone(&runner),
        heartbeat: config.heartbeat,
        stop: stop.clone(),
        tracker: tracker.clone(),
        slots: Arc::clone(&slots),
        busy: Arc::clone(&busy),
        source,
        share,
        backoff: receive_backoff(),
    };
    if sources == 1 {
        return puller(None, MAX_PULL).receive_loop().await;
    }
    let share = config
        .concurrency
        .max(1)
        .div_ceil(queue.partitions().max(1))
        .clamp(1, MAX_PULL);
    let loops: Vec<_> = (0..sources)
        .map(|source| tokio::spawn(puller(Some(source), share).source_loop()))
        .collect();
    for receive in loops {
        let _ = receive.await;
    }
}

/// One receive loop: what it asks (one source, `None`: the whole queue, for at most `share`
/// jobs a request) and what it shares with the pool's other loops.
struct Puller {
    queue: Arc<dyn JobQueue>,
    runner: Arc<Runner>,
    heartbeat: Duration,
    stop: CancellationToken,
    tracker: TaskTracker,
    slots: Arc<Semaphore>,
    /// How many of the pool's loops are busy: their last waiting request brought jobs (see
    /// [`waiting_ask`]).
    busy: Arc<AtomicUsize>,
    source: Option<usize>,
    share: usize,
    backoff: Backoff,
}

impl Puller {
    /// The deliveries of a request, or `None` when there are none to take: `Some(None)`
    /// after a failed request (logged, and paused for), `None` when the loop must end (the
    /// queue closed, or the pool stopped).
    async fn answered(
        &mut self,
        request: Result<Option<Deliveries>, StoreError>,
    ) -> Option<Option<Deliveries>> {
        match request {
            Ok(Some(deliveries)) => Some(Some(deliveries)),
            Ok(None) => None,
            Err(e) => pause_after(&e, &mut self.backoff, &self.stop)
                .await
                .then_some(None),
        }
    }

    /// Runs `delivery` in the slot `permit` holds, tracked so shutdown can wait for it.
    fn start(&self, delivery: Delivery, permit: OwnedSemaphorePermit) {
        let runner = Arc::clone(&self.runner);
        let heartbeat = self.heartbeat;
        self.tracker.spawn(async move {
            run_delivery(&runner, delivery, permit, heartbeat).await;
        });
    }

    /// Runs `delivery`, a job received while no slot was free, once one frees: it waits in
    /// its own tracked task, its turn among the loops (the semaphore is first come, first
    /// served), heartbeating the delivery so its lease never lapses meanwhile, and the loop
    /// goes on reading its request. Stopping before a slot freed hands it back, so another
    /// worker runs it now. The returned receiver ends once the job has its slot (or was
    /// handed back).
    fn start_when_free(&self, delivery: Delivery) -> oneshot::Receiver<()> {
        let runner = Arc::clone(&self.runner);
        let slots = Arc::clone(&self.slots);
        let stop = self.stop.clone();
        let heartbeat = self.heartbeat;
        let (seated, waited) = oneshot::channel();
        self.tracker.spawn(async move {
            let permit = slot_for(&slots, &delivery, &stop, heartbeat).await;
            drop(seated);
            match permit {
                Some(permit) => run_delivery(&runner, delivery, permit, heartbeat).await,
                None => {
                    let _ = delivery.handle.release().await;
                }
            }
        });
        waited
    }

    /// Starts `delivery` in a slot split off `permits`; `false` when none is left. A queue
    /// never yields more deliveries than asked for; one that did would only lose this job to
    /// redelivery, never overfill the slots.
    fn start_in(&self, permits: &mut OwnedSemaphorePermit, delivery: Delivery) -> bool {
        let Some(permit) = permits.split(1) else {
            tracing::error!("job queue yielded more jobs than asked for");
            return false;
        };
        self.start(delivery, permit);
        true
    }

    /// The loop of a queue of one source: every free slot, then one request for that many.
    async fn receive_loop(mut self) {
        loop {
            let Some(mut permits) = free_slots(&self.slots, self.share, &self.stop).await else {
                return;
            };
            let asked = permits.num_permits();
            let request = tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                d = async {
                    match self.source {
                        Some(source) => self.queue.receive_from(source, asked).await,
                        None => self.queue.receive_up_to(asked).await,
                    }
                } => d,
            };
            let Some(mut deliveries) = self.answered(request).await else {
                return;
            };
            while let Some(deliveries) = deliveries.as_mut() {
                let next = tokio::select! {
                    biased;
                    () = self.stop.cancelled() => {
                        // What the request already delivered still runs (a memory queue would
                        // never deliver it again); the shutdown grace decides for how long.
                        while let Some(Some(Ok(delivery))) = deliveries.next().now_or_never() {
                            if !self.start_in(&mut permits, delivery) {
                                break;
                            }
                        }
                        return;
                    }
                    next = deliveries.next() => next,
                };
                match next {
                    Some(Ok(delivery)) => {
                        self.backoff.reset();
                        if !self.start_in(&mut permits, delivery) {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        if !pause_after(&e, &mut self.backoff, &self.stop).await {
                            return;
                        }
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    /// The loop of one source of several (see the module docs): waiting without holding a
    /// slot (for one job, or, while its source is busy, for its part of the free slots), then,
    /// unless the last delivery says the source had none left, taking what the free slots
    /// allow until the source runs dry.
    async fn source_loop(mut self) {
        let source = self.source.unwrap_or(0);
        // Whether this loop's last waiting request brought jobs (counted in `self.busy`).
        let mut busy = false;
        loop {
            // Waiting: no slot held meanwhile.
            let asked = if busy {
                waiting_ask(
                    self.slots.available_permits(),
                    self.busy.load(Ordering::Relaxed),
                    self.share,
                )
            } else {
                1
            };
            let request = tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                d = self.queue.receive_from(source, asked) => d,
            };
            let Some(waited) = self.answered(request).await else {
                return;
            };
            let Some(mut deliveries) = waited else {
                continue;
            };
            let mut got = false;

            // What the source had left after the last job that came: none means taking would
            // only be told so (a round trip per job in a sparse lane).
            let mut left = None;
            // The jobs that came while every slot was busy, until they have one.
            let mut unseated = Vec::new();
            while let Some(next) = tokio::select! {
                biased;
                () = self.stop.cancelled() => None,
                next = deliveries.next() => next,
            } {
                match next {
                    Ok(delivery) => {
                        left = delivery.handle.pending();
                        match Arc::clone(&self.slots).try_acquire_owned() {
                            Ok(permit) => self.start(delivery, permit),
                            Err(_) => unseated.push(self.start_when_free(delivery)),
                        }
                        got = true;
                    }
                    Err(e) => {
                        if !pause_after(&e, &mut self.backoff, &self.stop).await {
                            return;
                        }
                        break;
                    }
                }
            }
            if got != busy {
                busy = got;
                if got {
                    self.busy.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.busy.fetch_sub(1, Ordering::Relaxed);
                }
            }
            // The loop asks again only once every job it holds has a slot: a lane never holds
            // more jobs without one than it asked for, which another worker may be free for.
            for waited in unseated {
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => return,
                    _ = waited => {}
                }
            }
            if self.stop.is_cancelled() {
                return;
            }
            if got {
                self.backoff.reset();
                if left != Some(0) && !self.take(source).await {
                    return;
                }
            }
        }
    }

    /// Taking: the source has jobs; as many as slots are free (up to the share), never waiting
    /// on the source, until a request brings fewer than it asked for. `false`: the loop must
    /// end.
    async fn take(&mut self, source: usize) -> bool {
        loop {
            let Some(mut permits) = free_slots(&self.slots, self.share, &self.stop).await else {
                return false;
            };
            let asked = permits.num_permits();
            let request = self.queue.take_from(source, asked).await;
            let Some(taken) = self.answered(request).await else {
                return false;
            };
            let Some(mut deliveries) = taken else {
                return true;
            };
            let mut taken = 0;
            // A request that asks for jobs the source holds is answered at once; what it
            // brought still runs when the pool stops meanwhile (the shutdown grace decides).
            while let Some(Ok(delivery)) = deliveries.next().await {
                if !self.start_in(&mut permits, delivery) {
                    break;
                }
                taken += 1;
            }
            if taken < asked || self.stop.is_cancelled() {
                return !self.stop.is_cancelled();
            }
        }
    }
}

/// Every slot free now, up to `share` (at least one, waiting for it in turn), in one permit:
/// a delivery splits its slot off, and those a request does not fill are released when the
/// permit drops. `None`: the pool stopped first.
async fn free_slots(
    slots: &Arc<Semaphore>,
    share: usize,
    stop: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    let mut permits = tokio::select! {
        biased;
        () = stop.cancelled() => return None,
        permit = Arc::clone(slots).acquire_owned() => permit.ok()?,
    };
    let more = slots.available_permits().min(share.saturating_sub(1));
    if let Ok(extra) = Arc::clone(slots).try_acquire_many_owned(u32::try_from(more).unwrap_or(0)) {
        permits.merge(extra);
    }
    Some(permits)
}

/// How many jobs a busy waiting loop (its last waiting request brought jobs) asks its source
/// for: its part (one of the `busy` loops') of the slots free now, at least one and at most
/// `share`; a loop whose last request brought none asks for one. So jobs that arrive one at a
/// time in a busy lane come through one request, not a request each, and the waiting loops
/// together never ask for more jobs than slots were free when they asked, plus one per idle
/// lane (whose first job may come at any time): a worker holds jobs it cannot start only when
/// other loops filled the slots meanwhile, and each such job waits for a slot, heartbeated.
fn waiting_ask(free: usize, busy: usize, share: usize) -> usize {
    (free / busy.max(1)).clamp(1, share.max(1))
}

/// A slot for `delivery`, a job received before one was free: waits its turn among the
/// loops (the semaphore is first come, first served), heartbeating the delivery meanwhile so
/// its lease never lapses while it waits. `None`: the pool stopped first.
async fn slot_for(
    slots: &Arc<Semaphore>,
    delivery: &Delivery,
    stop: &CancellationToken,
    heartbeat: Duration,
) -> Option<OwnedSemaphorePermit> {
    let acquire = Arc::clone(slots).acquire_owned();
    tokio::pin!(acquire);
    let interval = || {
        delivery
            .handle
            .lease()
            .map_or(heartbeat, heartbeat_interval)
    };
    let mut next_beat = delivery.handle.received_at().unwrap_or_else(Instant::now) + interval();
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            permit = &mut acquire => return permit.ok(),
            () = tokio::time::sleep_until(next_beat) => {
                next_beat = Instant::now() + interval();
                if let Err(e) = delivery.handle.in_progress().await {
                    tracing::warn!(execution_id = %delivery.job.execution_id, error = %e, "heartbeat failed");
                }
            }
        }
    }
}

/// The pauses between failed receives: from 100 ms, doubling, at most a second apart, so jobs
/// flow again within a second of the jobs stream's leader election ending. A failing request
/// costs the server next to nothing (no responders, or a timeout), and a worker never stops
/// asking.
fn receive_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), RECEIVE_PAUSE_CAP)
}

/// The longest pause between failed receives.
const RECEIVE_PAUSE_CAP: Duration = Duration::from_secs(1);

/// Logs a failed receive and waits `backoff`'s next pause before the next request; `false`
/// when the pool stopped meanwhile.
async fn pause_after(error: &StoreError, backoff: &mut Backoff, stop: &CancellationToken) -> bool {
    tracing::warn!(error = %error, "job queue receive failed; retrying");
    // Without a budget there is always a next pause.
    let pause = backoff.next_pause().unwrap_or(RECEIVE_PAUSE_CAP);
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        () = stop.cancelled() => return false,
    }
    true
}

/// Heartbeats at a third of the lease, so two may be lost before the lease lapses.
fn heartbeat_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(100))
}

/// Runs `delivery` in the slot `permit` holds. The slot is freed as soon as the execution has
/// ended, before the job's acknowledgement round trip: the next job can start meanwhile (the
/// task stays tracked until the ack is sent, so shutdown still waits for it).
async fn run_delivery(
    runner: &Runner,
    delivery: Delivery,
    permit: OwnedSemaphorePermit,
    heartbeat: Duration,
) {
    let Delivery {
        job,
        delivered,
        handle,
    } = delivery;
    // The submitting request's W3C trace context travels in the job: the execution span
    // continues that trace (exported over OTLP when configured), and its trace id is on every
    // log line of the execution so logs of both processes can be joined.
    let span = tracing::info_span!(
        "execution",
        execution_id = %job.execution_id,
        // i64: an integer span attribute (a u64 would be exported as a string).
        delivered = i64::from(delivered),
        trace_id = tracing::field::Empty,
    );
    if telemetry::trace::exporting()
        && let Some(traceparent) = job.traceparent.as_deref()
    {
        telemetry::propagation::set_parent(&span, traceparent);
    }
    let trace_id = if telemetry::trace::exporting() {
        telemetry::propagation::trace_id_of(&span)
    } else {
        None
    };
    if let Some(trace_id) =
        trace_id.or_else(|| job.traceparent.as_deref().and_then(trace_id_of_traceparent))
    {
        span.record("trace_id", trace_id);
    }
    let run = runner
        .run_delivery(&job, delivered, Some(&*handle))
        .instrument(span);
    tokio::pin!(run);
    // The lease is read on every beat: the server's value wins over the configured one. The
    // first beat is due a beat after the delivery was received (its lease runs from then, and
    // decoding it, or the jobs before it, may have taken part of it); a beat is sent beside the
    // run, which never waits for it, and the next is timed from when this one started, so a
    // slow send never moves it closer to the lease's end (a beat still being sent when the
    // next is due delays that one until the send returns).
    let interval = || handle.lease().map_or(heartbeat, heartbeat_interval);
    let mut next_beat = handle.received_at().unwrap_or_else(Instant::now) + interval();
    let mut sending = None;
    let outcome = loop {
        tokio::select! {
            outcome = &mut run => break outcome,
            () = tokio::time::sleep_until(next_beat), if sending.is_none() => {
                next_beat = Instant::now() + interval();
                sending = Some(handle.in_progress());
            }
            Some(sent) = OptionFuture::from(sending.as_mut()) => {
                sending = None;
                if let Err(e) = sent {
                    tracing::warn!(execution_id = %job.execution_id, error = %e, "heartbeat failed");
                }
            }
        }
    };
    drop(permit);
    match outcome {
        RunOutcome::Finished | RunOutcome::Dropped => {
            if let Err(e) = handle.ack().await {
                tracing::warn!(execution_id = %job.execution_id, error = %e, "ack failed; the job may be redelivered");
            }
        }
        RunOutcome::Unclaimed => {
            if let Err(e) = handle.release().await {
                tracing::warn!(execution_id = %job.execution_id, error = %e, "could not hand the job back; it is redelivered when its lease lapses");
            }
        }
        RunOutcome::Abandoned => {}
    }
}

/// The trace id field of a validated `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id_of_traceparent(traceparent: &str) -> Option<String> {
    traceparent.split('-').nth(1).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::waiting_ask;

    #[test]
    fn waiting_loops_together_never_ask_for_more_jobs_than_slots_are_free() {
        assert_eq!(waiting_ask(64, 8, 64), 8);
        assert_eq!(waiting_ask(64, 1, 16), 16, "at most a loop's share");
        // A busy source is always asked, for one job when slots are few or none are free.
        assert_eq!(waiting_ask(4, 8, 1), 1);
        assert_eq!(waiting_ask(0, 8, 8), 1);
        assert_eq!(waiting_ask(5, 0, 0), 1);
        for busy in 1..=16 {
            for free in busy..=200 {
                assert!(waiting_ask(free, busy, 64) * busy <= free);
            }
        }
    }
}
