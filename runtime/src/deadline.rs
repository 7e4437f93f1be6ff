//! Deadline enforcement that does not need a live worker.
//!
//! A worker enforces the deadline of the execution it runs with its own timer. Nothing did when
//! no worker ran the execution: none alive (the job waits in the queue), or its worker died (the
//! job waits for its lease to lapse, then for another worker). The contract wants such an
//! execution to end with `deadline_exceeded` at most 2 s after its deadline, written by any
//! gateway or worker. Every gateway process therefore runs a [`DeadlineSweeper`] (and the
//! embedded gateway over its memory queue). Workers do not: a sweeper reads every job of the
//! namespace once, so a sweeper per worker would make every added worker cost each execution
//! one more read, where gateways are few and run one each whatever the workers.
//!
//! How it works, and why:
//! - It follows the job queue with [`JobQueue::scan`] from the last position it saw, keeping
//!   `(deadline, execution)` of every job the queue holds in a local index ordered by deadline.
//!   The queue is the source because it already holds every job not yet finished (acknowledged
//!   jobs leave it), bounded by the cluster's admission limit; a separate deadline index would
//!   cost one more write per submission and could disagree with the queue. Following from a
//!   cursor (one per partition of the queue) reads each job once per process, not once per
//!   sweep; a process that starts (or restarts) scans from the beginning, so jobs of a gateway
//!   that died are covered by the others, and while no gateway runs, by the first to start.
//! - Every [`SweeperSettings::interval`], executions whose deadline passed more than
//!   [`SweeperSettings::grace`] ago are taken from the index; their logs' heads are read (many
//!   per request) and, for each log not terminal, `execution.failed` `deadline_exceeded` is
//!   appended through [`EventWriter`] from that head. The append is compare-and-set, so concurrent sweepers, a live worker and a
//!   late worker all race safely: exactly one terminal is stored, nothing follows it, and a
//!   worker that later takes the job finds the log terminal and drops it. The grace leaves the
//!   worker running an execution a moment to close it itself (its timer fires at the deadline);
//!   either way the terminal is the same `deadline_exceeded`.
//! - An execution the store could not be asked about, or whose append lost a race without the
//!   log becoming terminal, stays in the index and is tried again on the next sweep.
//! - A job leaves the queue when a worker acknowledges it (its log is terminal), when its
//!   submission is withdrawn (after its log was closed) or when it ages out (with its log).
//!   Every sweep asks each partition where the queue now starts ([`JobQueue::held_span`]) and
//!   checks the heads of the indexed jobs before it, many per request
//!   ([`EventStore::heads`]): those whose log is terminal or gone leave the index. So the
//!   index holds what the queue holds, not every job of the last deadline's span, and a job
//!   costs one batched head check, not a read at its deadline (BENCHMARKS.md, "Reads per job
//!   and gateway"). A log found open stays indexed and is closed at its deadline: a job
//!   acknowledged while its log is open (a worker fenced by another that later died) is still
//!   enforced. Whether a log is terminal decides, so checking one too early (a listing
//!   answered by a replica behind its leader) costs a read, never a deadline.
//! - A job held long at the front of a partition keeps its start back while the jobs after it
//!   finish. Once the index holds more than twice the jobs the partition does (plus one scan
//!   batch), the partition is listed ([`JobQueue::scan_partition`] from its start) and the
//!   indexed jobs it no longer holds are checked the same way, at most 16 requests' worth a
//!   sweep and all before another listing: a listing reads the partition's jobs once and
//!   drops more entries than it reads. A sweep closes expired executions before it settles
//!   anything, so settling never delays a terminal event.
//! - Memory: the index holds at most [`SweeperSettings::max_indexed`] jobs; when full, the cursor
//!   stops advancing until deadlines pass (those jobs stay in the queue, so none is lost, only
//!   enforced later).
//! - The sweeper does not remove the job from the queue (it does not hold the delivery); the next
//!   worker to receive it acknowledges and drops it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use protocol::event::EventBody;
use protocol::{ExecutionId, RuntimeError, Timestamp};
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::event_store::{EventStore, LogHead};
use crate::job::JobQueue;
use crate::writer::EventWriter;

/// Sweeper settings.
#[derive(Debug, Clone)]
pub struct SweeperSettings {
    /// Time between sweeps; with `grace`, the worst delay from a deadline to its terminal event
    /// (plus a store round trip) must stay under the contract's 2 s.
    pub interval: Duration,
    /// How long after a deadline the sweeper waits for a live worker to close the execution.
    pub grace: Duration,
    /// Jobs read from the queue per request, and logs whose heads are asked at once.
    pub scan_batch: usize,
    /// Most jobs kept in the index.
    pub max_indexed: usize,
}

impl Default for SweeperSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            grace: Duration::from_millis(250),
            scan_batch: 256,
            max_indexed: 1_000_000,
        }
    }
}

/// Batches of jobs that left the queue checked per sweep, at most: a flood of them (the
/// queue's first job, long held, finally acknowledged) is worked off over several sweeps, so
/// expired executions are not kept waiting behind it.
const SETTLE_BATCHES_PER_SWEEP: usize = 16;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Jobs newly read from the queue.
    pub scanned: usize,
    /// Indexed jobs that left the queue and whose logs were found terminal (or gone): dropped
    /// from the index before their deadline.
    pub settled: usize,
    /// Executions this sweep closed with `deadline_exceeded`.
    pub closed: usize,
    /// Expired executions left for the next sweep (store unreachable or a lost race).
    pub retry: usize,
}

/// An indexed job: its deadline (unix milliseconds), execution, partition and position in the
/// queue. Ordered by deadline first.
type Indexed = (i64, ExecutionId, usize, u64);

/// See the module docs.
pub struct DeadlineSweeper {
    store: Arc<dyn EventStore>,
    queue: Arc<dyn JobQueue>,
    settings: SweeperSettings,
    /// Last queue position read, per partition of the queue.
    cursors: Vec<u64>,
    /// The partition the next read continues in.
    partition: usize,
    /// Indexed jobs by deadline.
    index: BTreeSet<Indexed>,
    /// Per partition, the indexed jobs the queue may still hold, by position: those before
    /// the partition's first held position left the queue and are checked then.
    held: Vec<BTreeMap<u64, (i64, ExecutionId)>>,
    /// The partition whose jobs that left the queue are checked first in the next sweep.
    settle_from: usize,
    /// Indexed jobs a listing found gone and not checked yet (a sweep checks a bounded number).
    unsettled: VecDeque<Indexed>,
}

impl std::fmt::Debug for DeadlineSweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineSweeper")
            .field("cursors", &self.cursors)
            .field("indexed", &self.index.len())
            .finish_non_exhaustive()
    }
}

/// The positions a partition holds up to a point ([`DeadlineSweeper::listed`]).
struct Listed {
    positions: BTreeSet<u64>,
    /// The last position the listing covers.
    through: u64,
}

/// What became of one expired execution.
enum Closing {
    /// Terminal now, by this sweeper.
    Closed,
    /// Terminal already, or gone: nothing to do.
    Done,
    /// Try again next sweep.
    Retry,
}

impl DeadlineSweeper {
    pub fn new(
        store: Arc<dyn EventStore>,
        queue: Arc<dyn JobQueue>,
        settings: SweeperSettings,
    ) -> Self {
        let partitions = queue.partitions().max(1);
        Self {
            store,
            cursors: vec![0; partitions],
            held: vec![BTreeMap::new(); partitions],
            settle_from: 0,
            unsettled: VecDeque::new(),
            queue,
            partition: 0,
            settings,
            index: BTreeSet::new(),
        }
    }

    /// Jobs in the index now.
    pub fn indexed(&self) -> usize {
        self.index.len()
    }

    /// Runs a sweep every `interval` until `stop` fires.
    pub fn spawn(mut self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.settings.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let report = self.sweep().await;
                if report.closed > 0 {
                    tracing::info!(
                        closed = report.closed,
                        "executions closed past their deadline"
                    );
                }
            }
        })
    }

    /// One sweep: reads new jobs, closes every execution past its deadline and grace, then
    /// drops the jobs that left the queue with their execution over.
    pub async fn sweep(&mut self) -> SweepReport {
        let mut report = SweepReport::default();
        match self.follow_queue().await {
            Ok(scanned) => report.scanned = scanned,
            // Expired executions already indexed are still closed below.
            Err(e) => tracing::warn!(error = %e, "deadline sweeper cannot read the job queue"),
        }
        let grace = i64::try_from(self.settings.grace.as_millis()).unwrap_or(i64::MAX);
        let due_before = Timestamp::now().unix_millis().saturating_sub(grace);
        let mut expired = Vec::new();
        while let Some(&entry) = self.index.first() {
            if entry.0 > due_before {
                break;
            }
            self.index.pop_first();
            let (_, _, partition, position) = entry;
            if let Some(held) = self.held.get_mut(partition) {
                held.remove(&position);
            }
            expired.push(entry);
        }
        for chunk in expired.chunks(self.settings.scan_batch.max(1)) {
            let ids: Vec<ExecutionId> = chunk.iter().map(|e| e.1).collect();
            let heads = match self.store.heads(&ids).await {
                Ok(heads) => heads,
                Err(e) => {
                    tracing::warn!(error = %e, "deadline sweeper cannot read the logs");
                    report.retry += chunk.len();
                    self.index.extend(chunk.iter().copied());
                    continue;
                }
            };
            for (&entry, head) in chunk.iter().zip(heads) {
                match self.close(entry.1, head).await {
                    Closing::Closed => report.closed += 1,
                    Closing::Done => {}
                    Closing::Retry => {
                        report.retry += 1;
                        self.index.insert(entry);
                    }
                }
            }
        }
        // After the deadlines: settling (a listing above all) never delays a terminal.
        report.settled = self.settle_left().await;
        report
    }

    /// Reads jobs after the cursor into the index, within its bound.
    async fn follow_queue(&mut self) -> Result<usize, StoreError> {
        let mut scanned = 0;
        loop {
            let room = self.settings.max_indexed.saturating_sub(self.index.len());
            let limit = self.settings.scan_batch.min(room);
            if limit == 0 {
                return Ok(scanned);
            }
            let partition = self.partition;
            let cursor = self.cursors.get(partition).copied().unwrap_or(0);
            let jobs = self.queue.scan_partition(partition, cursor, limit).await?;
            let done = jobs.len() < limit;
            if done {
                // This partition is read to its end: the next read starts at the next one.
                self.partition = (partition + 1) % self.cursors.len();
            }
            for job in jobs {
                if let Some(cursor) = self.cursors.get_mut(partition) {
                    *cursor = (*cursor).max(job.position);
                }
                let deadline = job.deadline_at.unix_millis();
                self.index
                    .insert((deadline, job.execution_id, partition, job.position));
                if let Some(held) = self.held.get_mut(partition) {
                    held.insert(job.position, (deadline, job.execution_id));
                }
                scanned += 1;
            }
            if done && self.partition == 0 {
                return Ok(scanned);
            }
        }
    }

    /// Checks the indexed jobs that left the queue (before their partition's first held
    /// position) and drops those whose log is terminal or gone; returns how many. One whose
    /// log is still open (its job acknowledged by a worker that was fenced, while the writer
    /// that fenced it died) stays indexed and is closed at its deadline like any other.
    async fn settle_left(&mut self) -> usize {
        let batch = self.settings.scan_batch.max(1);
        let mut budget = SETTLE_BATCHES_PER_SWEEP * batch;
        let mut left: Vec<Indexed> = Vec::new();
        // Partitions take turns at being first, so a flood in one never starves the others.
        let partitions = self.held.len();
        self.settle_from = (self.settle_from + 1) % partitions.max(1);
        for partition in (0..partitions).map(|k| (self.settle_from + k) % partitions) {
            if budget == 0 || self.held[partition].is_empty() {
                continue;
            }
            let span = match self.queue.held_span(partition).await {
                Ok(span) => span,
                Err(e) => {
                    tracing::debug!(partition, error = %e, "deadline sweeper cannot read where the queue starts");
                    continue;
                }
            };
            let held = &mut self.held[partition];
            while budget > 0 {
                let Some(entry) = held.first_entry() else {
                    break;
                };
                if *entry.key() >= span.first {
                    break;
                }
                let (position, (deadline, id)) = entry.remove_entry();
                left.push((deadline, id, partition, position));
                budget -= 1;
            }
            // A job held long at the front keeps `first` back while the jobs after it finish:
            // once this index holds more than twice what the partition does, the partition is
            // listed, and the indexed jobs it no longer holds are checked, over as many sweeps
            // as it takes, before another listing. So a listing reads the partition's jobs once
            // and settles more entries than it reads.
            let stale = span
                .jobs
                .is_some_and(|jobs| held.len() as u64 > jobs.saturating_mul(2) + batch as u64);
            if stale && self.unsettled.is_empty() {
                let listed = match self.listed(partition, span.first).await {
                    Ok(listed) => listed,
                    Err(e) => {
                        tracing::debug!(partition, error = %e, "deadline sweeper cannot list the queue");
                        continue;
                    }
                };
                let gone = self.held[partition].extract_if(..=listed.through, |position, _| {
                    !listed.positions.contains(position)
                });
                self.unsettled.extend(
                    gone.map(|(position, (deadline, id))| (deadline, id, partition, position)),
                );
            }
        }
        // What listings found gone, with what is left of the bound.
        let take = budget.min(self.unsettled.len());
        left.extend(self.unsettled.drain(..take));
        let mut settled = 0;
        for chunk in left.chunks(batch) {
            let ids: Vec<ExecutionId> = chunk.iter().map(|e| e.1).collect();
            match self.store.heads(&ids).await {
                Ok(heads) => {
                    for (entry, head) in chunk.iter().zip(heads) {
                        // An entry that expired meanwhile was taken from the index already.
                        if head.is_none_or(|h| h.terminal) && self.index.remove(entry) {
                            settled += 1;
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "deadline sweeper cannot read the logs of finished jobs");
                    // Checked again on the next sweep.
                    for &(deadline, id, partition, position) in chunk {
                        if let Some(held) = self.held.get_mut(partition) {
                            held.insert(position, (deadline, id));
                        }
                    }
                }
            }
        }
        settled
    }

    /// The positions partition `partition` holds from `first` through this sweeper's cursor
    /// there, read with batched scans.
    async fn listed(&self, partition: usize, first: u64) -> Result<Listed, StoreError> {
        let through = self.cursors.get(partition).copied().unwrap_or(0);
        let batch = self.settings.scan_batch.max(1);
        let mut positions = BTreeSet::new();
        let mut after = first.saturating_sub(1);
        loop {
            let jobs = self.queue.scan_partition(partition, after, batch).await?;
            let full = jobs.len() == batch;
            for job in jobs {
                if job.position > through {
                    return Ok(Listed { positions, through });
                }
                positions.insert(job.position);
                after = job.position;
            }
            if !full {
                return Ok(Listed { positions, through });
            }
        }
    }

    /// Appends the `deadline_exceeded` terminal unless the log, whose head is `head`, is
    /// terminal already.
    async fn close(&self, id: ExecutionId, head: Option<LogHead>) -> Closing {
        let Some(head) = head else {
            return Closing::Done;
        };
        if head.terminal {
            return Closing::Done;
        }
        let mut writer = EventWriter::from_head(Arc::clone(&self.store), id, head);
        let terminal = EventBody::Failed {
            error: RuntimeError::deadline_exceeded(),
        };
        match writer.append_once(terminal.clone()).await {
            Ok(()) => {
                crate::ended::record(id, &terminal);
                Closing::Closed
            }
            Err(StoreError::Conflict { terminal: true, .. }) => Closing::Done,
            // Another writer appended first: look again next sweep.
            Err(StoreError::Conflict { .. }) => Closing::Retry,
            Err(e @ (StoreError::Unavailable(_) | StoreError::Closed)) => {
                tracing::warn!(execution_id = %id, error = %e, "deadline sweeper cannot append");
                Closing::Retry
            }
            Err(e) => {
                tracing::error!(execution_id = %id, error = %e, "deadline sweeper append refused");
                Closing::Done
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Job;
    use crate::memory::{MemoryEventStore, MemoryJobQueue, MemoryLimits};
    use protocol::Sequence;

    fn request() -> protocol::ExecutionRequest {
        serde_json::from_value(serde_json::json!({
            "ability": "text-generation",
            "input": [{"type": "text", "text": "hi"}],
        }))
        .unwrap()
    }

    async fn submit(
        store: &Arc<dyn EventStore>,
        queue: &Arc<dyn JobQueue>,
        deadline_in_ms: i64,
    ) -> (ExecutionId, EventWriter) {
        let id = ExecutionId::new_random();
        let accepted_at = Timestamp::now();
        let writer = EventWriter::create(
            Arc::clone(store),
            id,
            accepted_at,
            &protocol::Tenant::default(),
        )
        .await
        .unwrap();
        let job = Job {
            execution_id: id,
            request: request(),
            accepted_at,
            deadline_at: Timestamp::from_unix_millis(accepted_at.unix_millis() + deadline_in_ms),
            traceparent: None,
            key: None,
            tenant: None,
        };
        queue.publish(&job).await.unwrap();
        (id, writer)
    }

    fn backends() -> (Arc<dyn EventStore>, Arc<dyn JobQueue>) {
        (
            Arc::new(MemoryEventStore::new(MemoryLimits::default())),
            Arc::new(MemoryJobQueue::new()),
        )
    }

    fn settings() -> SweeperSettings {
        SweeperSettings {
            grace: Duration::ZERO,
            ..SweeperSettings::default()
        }
    }

    async fn terminal_error(store: &Arc<dyn EventStore>, id: ExecutionId) -> Option<String> {
        let events = store.read(id, Sequence::ZERO, 100).await.unwrap().unwrap();
        let terminals: Vec<_> = events
            .iter()
            .filter(|e| e.event.body.is_terminal())
            .collect();
        assert!(terminals.len() <= 1, "one terminal at most: {events:?}");
        let last = events.last()?;
        match &last.event.body {
            EventBody::Failed { error } => Some(format!("{:?}", error.code)),
            other if other.is_terminal() => Some(format!("{other:?}")),
            _ => None,
        }
    }

    #[tokio::test]
    async fn an_expired_unclaimed_execution_is_closed_and_a_live_one_is_not() {
        let (store, queue) = backends();
        let (expired, _) = submit(&store, &queue, -10).await;
        let (live, _) = submit(&store, &queue, 60_000).await;
        let mut sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings());
        let report = sweeper.sweep().await;
        assert_eq!(report.scanned, 2);
        assert_eq!(report.closed, 1);
        assert_eq!(
            terminal_error(&store, expired).await.as_deref(),
            Some("DeadlineExceeded")
        );
        assert_eq!(terminal_error(&store, live).await, None);
        assert_eq!(sweeper.indexed(), 1, "the live job stays indexed");
        // A second sweep reads nothing new and closes nothing again.
        assert_eq!(sweeper.sweep().await, SweepReport::default());
    }

    /// An operator holding the id of an execution the sweeper failed finds one warn line about
    /// it with its code, logged by the sweeper that closed it; a second sweeper finding it
    /// closed logs nothing more.
    #[tokio::test]
    async fn the_sweeper_that_closes_an_execution_logs_one_warn_line_with_its_code() {
        let (logs, guard) = testkit::logs::capture();
        let (store, queue) = backends();
        let (expired, _) = submit(&store, &queue, -10).await;
        let (live, _) = submit(&store, &queue, 60_000).await;
        for _ in 0..2 {
            let mut sweeper =
                DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings());
            sweeper.sweep().await;
        }
        drop(guard);
        let text = logs.text();
        let warns: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ")).collect();
        assert_eq!(warns.len(), 1, "{text}");
        assert!(warns[0].contains("execution failed"), "{text}");
        assert!(
            warns[0].contains(&format!("execution_id={expired}")),
            "{text}"
        );
        assert!(warns[0].contains("code=\"deadline_exceeded\""), "{text}");
        assert!(!text.contains(&live.to_string()), "{text}");
    }

    #[tokio::test]
    async fn an_execution_a_worker_claimed_is_closed_after_its_last_event() {
        let (store, queue) = backends();
        let (id, mut worker) = submit(&store, &queue, -10).await;
        worker
            .append(EventBody::Progress {
                phase: protocol::event::ProgressPhase::Processing,
                progress: None,
            })
            .await
            .unwrap();
        let mut sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings());
        assert_eq!(sweeper.sweep().await.closed, 1);
        assert_eq!(
            terminal_error(&store, id).await.as_deref(),
            Some("DeadlineExceeded")
        );
        // The worker that comes back late is fenced: nothing follows the terminal.
        let late = worker
            .append(EventBody::Failed {
                error: RuntimeError::internal(),
            })
            .await;
        assert!(
            matches!(late, Err(crate::writer::WriteError::Fenced)),
            "{late:?}"
        );
        assert_eq!(
            terminal_error(&store, id).await.as_deref(),
            Some("DeadlineExceeded")
        );
    }

    #[tokio::test]
    async fn racing_sweepers_store_exactly_one_terminal() {
        let (store, queue) = backends();
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(submit(&store, &queue, -10).await.0);
        }
        let sweepers: Vec<_> = (0..4)
            .map(|_| DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings()))
            .collect();
        let reports = futures_util::future::join_all(sweepers.into_iter().map(|mut s| {
            tokio::spawn(async move {
                // A sweeper that lost a race retries on its next sweep.
                let mut closed = 0;
                for _ in 0..3 {
                    closed += s.sweep().await.closed;
                }
                closed
            })
        }))
        .await;
        let closed: usize = reports.into_iter().map(|r| r.unwrap()).sum();
        assert_eq!(closed, ids.len(), "each execution closed exactly once");
        for id in ids {
            assert_eq!(
                terminal_error(&store, id).await.as_deref(),
                Some("DeadlineExceeded")
            );
            let head = store.head(id).await.unwrap().unwrap();
            assert_eq!(head.last_sequence, Sequence(2));
        }
    }

    /// A job a worker finished and acknowledged leaves the index on the next sweep, long
    /// before its deadline, and is never read again.
    #[tokio::test]
    async fn a_finished_job_leaves_the_index_before_its_deadline() {
        let (store, queue) = backends();
        let (id, mut writer) = submit(&store, &queue, 600_000).await;
        let (other, _) = submit(&store, &queue, 600_000).await;
        let mut sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings());
        assert_eq!(sweeper.sweep().await.scanned, 2);
        assert_eq!(sweeper.indexed(), 2);
        let delivery = queue.receive().await.unwrap().unwrap();
        assert_eq!(delivery.job.execution_id, id);
        writer.append(crate::contract::completed()).await.unwrap();
        delivery.handle.ack().await.unwrap();
        let report = sweeper.sweep().await;
        assert_eq!((report.settled, report.closed), (1, 0));
        assert_eq!(sweeper.indexed(), 1, "the job still queued stays");
        assert_eq!(sweeper.sweep().await, SweepReport::default());
        assert_eq!(terminal_error(&store, other).await, None);
    }

    /// A job acknowledged while its log is still open (its worker was fenced by another writer
    /// that then died) stays indexed and is closed at its deadline.
    #[tokio::test]
    async fn a_job_acknowledged_with_its_log_open_is_still_closed_at_its_deadline() {
        let (store, queue) = backends();
        let (id, _) = submit(&store, &queue, 2_000).await;
        let mut sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings());
        assert_eq!(sweeper.sweep().await.scanned, 1);
        let delivery = queue.receive().await.unwrap().unwrap();
        delivery.handle.ack().await.unwrap();
        assert_eq!(sweeper.sweep().await.settled, 0);
        assert_eq!(sweeper.indexed(), 1);
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let report = sweeper.sweep().await;
            if report.closed == 1 {
                break;
            }
            assert!(tokio::time::Instant::now() < until, "never closed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            terminal_error(&store, id).await.as_deref(),
            Some("DeadlineExceeded")
        );
        assert_eq!(sweeper.indexed(), 0);
    }

    /// The memory queue says where it starts (its first held job, or past every job given
    /// out) and how many jobs it holds.
    #[tokio::test]
    async fn the_memory_queue_says_where_its_jobs_lie() {
        let (store, queue) = backends();
        let span = |first, jobs| crate::HeldSpan {
            first,
            jobs: Some(jobs),
        };
        assert_eq!(queue.held_span(0).await.unwrap(), span(1, 0));
        submit(&store, &queue, 1000).await;
        submit(&store, &queue, 1000).await;
        let held = queue.scan(0, 10).await.unwrap();
        assert_eq!(queue.held_span(0).await.unwrap(), span(held[0].position, 2));
        for _ in 0..2 {
            let delivery = queue.receive().await.unwrap().unwrap();
            delivery.handle.ack().await.unwrap();
        }
        assert_eq!(
            queue.held_span(0).await.unwrap(),
            span(held[1].position + 1, 0)
        );
    }

    /// A sweeper reading `scan_batch` jobs a request, which indexed a queue whose first job was
    /// then taken and runs on while the `finished` jobs after it ended and were acknowledged;
    /// with the store, the front job's id and its delivery (kept, so the job stays held).
    async fn behind_a_running_job(
        finished: usize,
        scan_batch: usize,
    ) -> (
        Arc<dyn EventStore>,
        DeadlineSweeper,
        ExecutionId,
        crate::Delivery,
    ) {
        let (store, queue) = backends();
        let (front, _) = submit(&store, &queue, 600_000).await;
        let mut writers = std::collections::HashMap::new();
        for _ in 0..finished {
            let (id, writer) = submit(&store, &queue, 600_000).await;
            writers.insert(id, writer);
        }
        let settings = SweeperSettings {
            scan_batch,
            ..settings()
        };
        let mut sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&queue), settings);
        assert_eq!(sweeper.sweep().await.scanned, finished + 1);
        let held = queue.receive().await.unwrap().unwrap();
        assert_eq!(held.job.execution_id, front);
        for _ in 0..finished {
            let delivery = queue.receive().await.unwrap().unwrap();
            let mut writer = writers.remove(&delivery.job.execution_id).unwrap();
            writer.append(crate::contract::completed()).await.unwrap();
            delivery.handle.ack().await.unwrap();
        }
        (store, sweeper, front, held)
    }

    /// A job held at the front of the queue does not keep the finished jobs after it indexed:
    /// once they outnumber what the queue holds, the queue is listed and they are dropped.
    #[tokio::test]
    async fn finished_jobs_behind_a_long_one_leave_the_index_too() {
        let (store, mut sweeper, front, _held) = behind_a_running_job(6, 2).await;
        // 7 indexed against 1 held: more than twice what the queue holds plus a batch.
        let report = sweeper.sweep().await;
        assert_eq!((report.settled, report.closed), (6, 0));
        assert_eq!(sweeper.indexed(), 1);
        // Nothing more to list while the index and the queue agree.
        assert_eq!(sweeper.sweep().await, SweepReport::default());
        assert_eq!(terminal_error(&store, front).await, None);
    }

    /// What a listing found gone is checked over as many sweeps as the per-sweep bound takes
    /// (one job a request: 16 checks a sweep).
    #[tokio::test]
    async fn a_listing_is_settled_over_several_sweeps() {
        let (_store, mut sweeper, _front, _held) = behind_a_running_job(20, 1).await;
        assert_eq!(sweeper.sweep().await.settled, SETTLE_BATCHES_PER_SWEEP);
        assert_eq!(sweeper.sweep().await.settled, 20 - SETTLE_BATCHES_PER_SWEEP);
        assert_eq!(sweeper.indexed(), 1);
        assert_eq!(sweeper.sweep().await, SweepReport::default());
    }

    #[tokio::test]
    async fn acknowledged_jobs_leave_the_scan_and_positions_increase() {
        let queue = MemoryJobQueue::new();
        let store: Arc<dyn EventStore> = Arc::new(MemoryEventStore::new(MemoryLimits::default()));
        let queue_dyn: Arc<dyn JobQueue> = Arc::new(queue);
        let (a, _) = submit(&store, &queue_dyn, 1000).await;
        let (b, _) = submit(&store, &queue_dyn, 1000).await;
        let all = queue_dyn.scan(0, 10).await.unwrap();
        assert_eq!(
            all.iter().map(|j| j.execution_id).collect::<Vec<_>>(),
            [a, b]
        );
        assert!(all[0].position < all[1].position);
        let delivery = queue_dyn.receive().await.unwrap().unwrap();
        assert_eq!(delivery.job.execution_id, a);
        assert_eq!(
            queue_dyn.scan(0, 10).await.unwrap().len(),
            2,
            "held until acked"
        );
        delivery.handle.ack().await.unwrap();
        let rest = queue_dyn.scan(0, 10).await.unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].execution_id, b);
        assert!(
            queue_dyn
                .scan(rest[0].position, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
