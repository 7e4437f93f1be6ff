//! Jobs: the unit of work a worker pulls, and the queue that carries them.

use async_trait::async_trait;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use protocol::{ExecutionId, ExecutionRequest, Tenant, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::idempotency::IdempotencyRecord;

/// Everything a worker needs to run one execution. Published once per execution, concurrently
/// with the creation of its log (a worker waits for the log before claiming it); the execution
/// id is the queue's dedupe id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub execution_id: ExecutionId,
    pub request: ExecutionRequest,
    /// When `execution.accepted` was stored; the deadline runs from here.
    pub accepted_at: Timestamp,
    /// Absolute deadline of the whole execution, queueing included.
    pub deadline_at: Timestamp,
    /// W3C `traceparent` of the gateway's submit span (or of the caller when traces are not
    /// exported). Transports carry it beside the job, never in the payload (NATS: the
    /// `traceparent` message header), so tracing never changes the job's bytes.
    #[serde(skip)]
    pub traceparent: Option<String>,
    /// The idempotency key of a keyed submission, which the worker binds too before it runs
    /// the execution (see [`KeyClaim`]). Absent for a submission without a key, and in jobs
    /// published before keys travelled with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyClaim>,
    /// The tenant that submitted the execution, which decides the job's tenant lane (see
    /// [`JobQueue`]): a queue serves tenants in turn, so one tenant's backlog never holds
    /// another's jobs back. Absent for the default tenant and in jobs published before jobs
    /// carried their tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
}

impl Job {
    /// The tenant whose turn this job takes (the default tenant when none is recorded).
    pub fn tenant_name(&self) -> &str {
        self.tenant
            .as_ref()
            .map_or(Tenant::DEFAULT_NAME, Tenant::as_str)
    }
}

/// An idempotency key and the binding its submission claims, carried by the job.
///
/// A keyed submission binds its key ([`crate::IdempotencyStore::claim`]) while the log is
/// created and the job published, all at once, so the key costs no round trip of its own. The
/// job may then reach a worker before the gateway knows whether the key was free. So the
/// worker makes the same claim, with the same record, before it claims the log: the first of
/// the two claims binds the key to this execution and the other finds it bound to the same
/// execution. A worker whose claim finds the key bound to another execution never runs this
/// one. Only hashes travel: never the raw key or request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyClaim {
    /// The stored name of the key (tenant-scoped hash, `gateway::submit::idempotency_key_hash`).
    pub key_hash: String,
    /// What the key is bound to when this execution holds it.
    pub record: IdempotencyRecord,
}

/// Acknowledgement of one delivery.
#[async_trait]
pub trait DeliveryHandle: Send + Sync {
    /// The job is finished (its log is terminal) or must be dropped; never redeliver it.
    /// `Ok` may come before the queue has applied it: an ack that is lost after all shows as
    /// a redelivery after the lease, which finds the log terminal and is dropped.
    async fn ack(&self) -> Result<(), StoreError>;
    /// The job is still running: extend its lease (heartbeat).
    async fn in_progress(&self) -> Result<(), StoreError>;
    /// How long the queue holds this delivery without a heartbeat, as the queue's server has
    /// it now (it may change while the job runs); holders heartbeat at a third of it. `None`:
    /// the lease never lapses (a queue in this process), so heartbeats are a formality.
    fn lease(&self) -> Option<std::time::Duration> {
        None
    }
    /// When this process received the delivery, before decoding its job: the lease runs from
    /// about then, not from when the job starts, so the first heartbeat is due a beat after
    /// it. `None`: the lease never lapses (see [`Self::lease`]).
    fn received_at(&self) -> Option<tokio::time::Instant> {
        None
    }
    /// Whether the job of this delivery was withdrawn from the queue ([`JobQueue::withdraw`])
    /// since it was delivered. A worker asks only when it had to wait for the job's log to
    /// appear, i.e. when its submitter may be failing the submission; it never runs a withdrawn
    /// job. Errors: the queue could not be asked (the job must not run yet).
    async fn withdrawn(&self) -> Result<bool, StoreError> {
        Ok(false)
    }
    /// How many more jobs its source held, not yet handed to anyone, when this one was handed
    /// over (`None`: the queue does not say). A worker that got a job through a request that
    /// waited asks for more at once only when some were left.
    fn pending(&self) -> Option<u64> {
        None
    }
    /// Gives the job back unstarted, for delivery to another worker now rather than after the
    /// lease (a worker stopping while it held a job it had no slot for yet, or a delivery that
    /// stopped before it claimed the log). Best effort: a lost release is a redelivery after
    /// the lease.
    async fn release(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// One delivery of a job to a worker.
pub struct Delivery {
    pub job: Job,
    /// 1 on first delivery; more when the previous holder lost its lease (worker loss).
    pub delivered: u32,
    pub handle: Box<dyn DeliveryHandle>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("execution_id", &self.job.execution_id)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

/// A job the queue still holds (waiting, or delivered and not acknowledged), as a deadline
/// sweeper sees it: where it sits in the queue and when its execution must be over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedJob {
    /// Position in the queue, increasing in publish order; a scan continues after it.
    pub position: u64,
    pub execution_id: ExecutionId,
    pub deadline_at: Timestamp,
}

/// Where one partition's held jobs lie ([`JobQueue::held_span`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldSpan {
    /// Every job at a position before this one has left the queue (0: not known).
    pub first: u64,
    /// How many jobs the partition holds (`None`: not known).
    pub jobs: Option<u64>,
}

/// The deliveries of one [`JobQueue::receive_up_to`] request, in arrival order; an item's error
/// ends the request.
pub type Deliveries = BoxStream<'static, Result<Delivery, StoreError>>;

/// A work queue of jobs shared by every worker.
///
/// Contract (checked by `contract::job_queue_suite`):
/// - `publish` returns only once the job is durably queued; publishing the same execution id
///   again within the dedupe window is absorbed (at most one delivery per publish window).
/// - `receive` waits for the next job and hands it to exactly one caller; a caller asks only
///   when it has a free slot, so no worker buffers jobs it cannot start. `Ok(None)` means the
///   queue was closed.
/// - `receive_up_to(max)` is `receive` for a caller with `max` free slots: one request to the
///   queue that yields at most `max` deliveries, each as it arrives, and ends when the request
///   does (possibly with none, when it expired). It never yields more than `max`, so the bound
///   above holds; the default asks `receive` for one.
/// - An unacknowledged delivery whose lease lapses is redelivered with `delivered` + 1
///   (memory queues never lose a lease: their only consumer is in the same process).
/// - `scan` lists jobs the queue still holds with a position after `after`, in position order,
///   at most `limit`, without taking or disturbing any delivery; any process may call it (the
///   deadline sweeper of every gateway and worker does). A job published later always gets a
///   greater position, so a scanner that continues from the last position it saw misses none.
///   A queue of several partitions (`partitions`) keeps positions per partition: the rule holds
///   within each, read with `scan_partition`.
/// - `held_span(partition)`: every job of the partition at a position before its `first` has
///   left the queue (acknowledged, withdrawn or aged out), and it holds `jobs` jobs. `first`
///   may lag the queue (be lower than the truth), never run ahead of it; 0 says nothing, as
///   `jobs: None` does.
/// - `withdraw` removes an execution's job whatever became of its publish: stored, not stored,
///   or outcome unknown (a lost acknowledgement). Once it returns `Ok`, the job is no longer
///   held and will not be delivered again, and a delivery already handed out reports
///   [`DeliveryHandle::withdrawn`]. Idempotent. Only a submitter failing its submission calls it.
#[async_trait]
pub trait JobQueue: Send + Sync + 'static {
    async fn publish(&self, job: &Job) -> Result<(), StoreError>;
    /// Removes `job` from the queue, published or not (see the contract above).
    async fn withdraw(&self, job: &Job) -> Result<(), StoreError>;
    async fn receive(&self) -> Result<Option<Delivery>, StoreError>;
    /// Up to `max` deliveries from one request (see the contract above); `Ok(None)`: closed.
    async fn receive_up_to(&self, _max: usize) -> Result<Option<Deliveries>, StoreError> {
        Ok(self
            .receive()
            .await?
            .map(|delivery| futures_util::stream::iter([Ok(delivery)]).boxed()))
    }
    /// Stops handing out jobs; pending `receive` calls return `Ok(None)`.
    fn close(&self);
    async fn ready(&self) -> Result<(), StoreError>;
    /// Held jobs after position `after` (see the contract above); of partition 0 when the
    /// queue has several.
    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<QueuedJob>, StoreError>;
    /// How many partitions the queue spreads its jobs over. Positions are per partition: a
    /// scanner keeps one cursor per partition and reads each with [`Self::scan_partition`].
    fn partitions(&self) -> usize {
        1
    }
    /// How many sources a worker pulls from: every partition's tenant lanes (a queue that
    /// serves tenants in turn by itself has one). A worker runs one receive loop per source
    /// when there are several, so a source without jobs never holds up the others, and one
    /// tenant's backlog waits in its own lane.
    fn sources(&self) -> usize {
        self.partitions()
    }
    /// [`Self::receive_up_to`] from source `source` alone (below [`Self::sources`]): the
    /// request waits a while for jobs when the source has none.
    async fn receive_from(
        &self,
        _source: usize,
        max: usize,
    ) -> Result<Option<Deliveries>, StoreError> {
        self.receive_up_to(max).await
    }
    /// The jobs source `source` holds now, up to `max`, without waiting for more: an empty
    /// stream when it holds none. A worker asks so while a source has jobs, so a request never
    /// keeps slots waiting while another source has jobs.
    async fn take_from(&self, source: usize, max: usize) -> Result<Option<Deliveries>, StoreError> {
        self.receive_from(source, max).await
    }
    /// Where partition `partition`'s jobs lie (see the contract above): a scanner's jobs
    /// before its `first` are done with. The default says nothing.
    async fn held_span(&self, _partition: usize) -> Result<HeldSpan, StoreError> {
        Ok(HeldSpan::default())
    }
    /// [`Self::scan`] of partition `partition` (below [`Self::partitions`]).
    async fn scan_partition(
        &self,
        _partition: usize,
        after: u64,
        limit: usize,
    ) -> Result<Vec<QueuedJob>, StoreError> {
        self.scan(after, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        crate::contract::job(protocol::ExecutionId::new_random())
    }

    /// A job without a key is written as before (no `key` member), and a job written before
    /// keys travelled with jobs reads as unkeyed; a keyed job carries the key's hash and
    /// binding and nothing else of the key.
    #[test]
    fn a_key_travels_with_its_job_only_when_there_is_one() {
        let unkeyed = job();
        let text = serde_json::to_string(&unkeyed).unwrap();
        assert!(!text.contains("\"key\""), "{text}");
        assert_eq!(serde_json::from_str::<Job>(&text).unwrap(), unkeyed);

        let mut keyed = job();
        keyed.key = Some(KeyClaim {
            key_hash: "ab12".into(),
            record: IdempotencyRecord {
                fingerprint: "cd34".into(),
                execution_id: keyed.execution_id,
                created_at: keyed.accepted_at,
            },
        });
        let value = serde_json::to_value(&keyed).unwrap();
        assert_eq!(value["key"]["key_hash"], "ab12");
        assert_eq!(value["key"]["record"]["fingerprint"], "cd34");
        assert_eq!(serde_json::from_value::<Job>(value).unwrap(), keyed);
    }
}
