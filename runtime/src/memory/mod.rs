//! In-process implementations of every contract, for embedded mode and tests.
//!
//! Nothing here scans all executions on a request path: expiry and eviction pop from queues
//! ordered by time, so cost per operation stays flat as executions accumulate (the reference's
//! store slows from ~300 to ~100 executions/s because it does not).

mod cancel;
mod event_store;
mod idempotency;
mod job_queue;

pub use cancel::MemoryCancelBus;
pub use event_store::{MemoryEventStore, MemoryLimits, StoredHook, TerminalHook};
pub use idempotency::MemoryIdempotencyStore;
pub use job_queue::MemoryJobQueue;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::StreamExt;
    use protocol::event::EventBody;
    use protocol::{ExecutionId, RuntimeError, RuntimeEvent, Sequence, Timestamp};

    use super::*;
    use crate::contract::{self, accepted, delta, event as ev, route_selected};
    use crate::error::StoreError;
    use crate::event_store::EventStore;

    #[tokio::test]
    async fn memory_event_store_passes_the_contract() {
        contract::event_store_suite(Arc::new(MemoryEventStore::new(MemoryLimits::default()))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_event_store_passes_the_contract_multithreaded() {
        contract::event_store_suite(Arc::new(MemoryEventStore::new(MemoryLimits::default()))).await;
    }

    #[tokio::test]
    async fn memory_event_store_limits_runs_like_events() {
        contract::run_limit_suite(Arc::new(store_with(|l| l.max_events = 5))).await;
    }

    #[tokio::test]
    async fn memory_job_queue_passes_the_contract() {
        contract::job_queue_suite(Arc::new(MemoryJobQueue::new())).await;
    }

    #[tokio::test]
    async fn memory_idempotency_passes_the_contract() {
        contract::idempotency_suite(Arc::new(MemoryIdempotencyStore::new(Duration::from_secs(
            60,
        ))))
        .await;
    }

    #[tokio::test]
    async fn memory_cancel_bus_passes_the_contract() {
        let bus = Arc::new(MemoryCancelBus::new());
        contract::cancel_suite(bus.clone()).await;
        assert_eq!(bus.watched(), 0);
    }

    /// A memory event store with the default limits but for what `set` changes.
    fn store_with(set: impl FnOnce(&mut MemoryLimits)) -> MemoryEventStore {
        let mut limits = MemoryLimits::default();
        set(&mut limits);
        MemoryEventStore::new(limits)
    }

    fn done(id: ExecutionId, seq: u64) -> RuntimeEvent {
        ev(
            id,
            seq,
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        )
    }

    #[tokio::test]
    async fn admission_counts_active_executions_only() {
        let store = store_with(|l| l.max_active = 2);
        let a = accepted(&store).await;
        accepted(&store).await;
        let c = ExecutionId::new_random();
        assert!(matches!(
            store.create(ev(c, 1, EventBody::Accepted)).await,
            Err(StoreError::AdmissionFull)
        ));
        assert!(
            store.state(c).await.unwrap().is_none(),
            "a refused create leaves nothing behind"
        );
        store.append(done(a, 2)).await.unwrap();
        store.create(ev(c, 1, EventBody::Accepted)).await.unwrap();
        assert_eq!(store.active(), 2);
    }

    #[tokio::test]
    async fn evicts_oldest_terminal_and_never_active() {
        let store = store_with(|l| l.max_executions = 3);
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(accepted(&store).await);
        }
        // All active: nothing can be evicted.
        let extra = ExecutionId::new_random();
        assert!(matches!(
            store.create(ev(extra, 1, EventBody::Accepted)).await,
            Err(StoreError::CapacityExhausted)
        ));
        store.append(done(ids[1], 2)).await.unwrap();
        store.append(done(ids[0], 2)).await.unwrap();
        // A subscriber of the execution about to be evicted still finishes its stream.
        let mut sub = store.subscribe(ids[1], Sequence(0)).await.unwrap().unwrap();
        store
            .create(ev(extra, 1, EventBody::Accepted))
            .await
            .unwrap();
        assert!(
            store.state(ids[1]).await.unwrap().is_none(),
            "oldest terminal evicted first"
        );
        assert!(store.state(ids[0]).await.unwrap().is_some());
        assert!(
            store.state(ids[2]).await.unwrap().is_some(),
            "active never evicted"
        );
        let mut seen = 0;
        while let Some(r) = sub.next().await {
            r.unwrap();
            seen += 1;
        }
        assert_eq!(seen, 2);
        assert_eq!(store.retained(), 3);
    }

    #[tokio::test]
    async fn terminal_executions_expire_after_retention() {
        let store = store_with(|l| l.retention = Duration::from_millis(1));
        let a = accepted(&store).await;
        store.append(done(a, 2)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        accepted(&store).await;
        assert!(store.state(a).await.unwrap().is_none());
        assert_eq!(store.retained(), 1);
    }

    #[tokio::test]
    async fn per_execution_limits_stop_non_terminal_appends_but_admit_the_terminal() {
        let store = store_with(|l| l.max_events = 3);
        let id = accepted(&store).await;
        store.append(ev(id, 2, route_selected())).await.unwrap();
        store.append(ev(id, 3, delta("a"))).await.unwrap();
        let over = ev(id, 4, delta("b"));
        assert!(matches!(
            store.append(over).await,
            Err(StoreError::ExecutionLimit)
        ));
        store.append(done(id, 4)).await.unwrap();
    }

    #[tokio::test]
    async fn idempotency_keys_expire() {
        let store = MemoryIdempotencyStore::new(Duration::from_millis(1));
        let rec = crate::IdempotencyRecord {
            fingerprint: "f".into(),
            execution_id: ExecutionId::new_random(),
            created_at: Timestamp::now(),
        };
        use crate::IdempotencyStore as _;
        assert!(store.claim("k", &rec).await.unwrap().is_none());
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(
            store.claim("k", &rec).await.unwrap().is_none(),
            "expired key is free"
        );
        assert_eq!(store.len(), 1);
    }
}
