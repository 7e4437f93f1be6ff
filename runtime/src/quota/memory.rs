//! In-memory quotas for embedded mode: one lock around every tenant's bucket and slots, so an
//! admit's check and commit are one critical section.
//!
//! Slots are released exactly when the memory event store stores a terminal event: embedded mode
//! registers [`MemoryQuotaStore::release_execution`] as the event store's terminal hook, which
//! is why this store also remembers each slot's tenant. Tenant state lives as long as the
//! process; tenants come from the deployment file, so their number is bounded by it.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use protocol::{ExecutionId, Tenant};

use super::{ACTIVE_RETRY_AFTER, Admission, AdmitRequest, QuotaStore, RateLimit};
use crate::error::StoreError;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Tokens now, refilled since the last update.
    fn refilled(self, rate: &RateLimit, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        let burst = rate.burst() as f64;
        (self.tokens + elapsed * rate.per_second()).min(burst)
    }
}

#[derive(Debug, Default)]
struct Account {
    bucket: Option<Bucket>,
    /// Slot holders and their expiry.
    slots: HashMap<ExecutionId, Instant>,
    /// The same slots ordered by expiry.
    expiry: BTreeSet<(Instant, ExecutionId)>,
}

#[derive(Debug, Default)]
struct State {
    tenants: HashMap<Tenant, Account>,
    /// The tenant of every slot holder, for [`MemoryQuotaStore::release_execution`].
    owners: HashMap<ExecutionId, Tenant>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct MemoryQuotaStore {
    state: Mutex<State>,
}

impl MemoryQuotaStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Frees `execution`'s slot, whatever its tenant (the event store's terminal hook).
    pub fn release_execution(&self, execution: ExecutionId) {
        let mut state = self.state.lock();
        let Some(tenant) = state.owners.remove(&execution) else {
            return;
        };
        if let Some(t) = state.tenants.get_mut(&tenant)
            && let Some(expires) = t.slots.remove(&execution)
        {
            t.expiry.remove(&(expires, execution));
        }
    }

    /// Slots held across all tenants (for tests).
    pub fn held(&self) -> usize {
        self.state.lock().owners.len()
    }
}

fn admit_locked(state: &mut State, request: AdmitRequest<'_>, now: Instant) -> Admission {
    let AdmitRequest {
        tenant,
        limits,
        execution,
        hold,
    } = request;
    let State { tenants, owners } = state;
    let t = tenants.entry(tenant.clone()).or_default();
    if t.slots.contains_key(&execution) {
        return Admission::Admitted;
    }
    let mut tokens = None;
    if let Some(rate) = &limits.rate {
        #[allow(clippy::cast_precision_loss)]
        let full = rate.burst() as f64;
        let available = t.bucket.map_or(full, |b| b.refilled(rate, now));
        if available < 1.0 {
            let wait = (1.0 - available) / rate.per_second();
            return Admission::RateLimited {
                retry_after: Duration::try_from_secs_f64(wait).unwrap_or(Duration::MAX),
            };
        }
        tokens = Some(available - 1.0);
    }
    if let Some(max) = limits.max_active {
        while let Some(&(expires, id)) = t.expiry.first() {
            if expires > now {
                break;
            }
            t.expiry.pop_first();
            t.slots.remove(&id);
            owners.remove(&id);
        }
        if t.slots.len() as u64 >= max {
            return Admission::ActiveLimit {
                retry_after: ACTIVE_RETRY_AFTER,
            };
        }
        // A hold too long to represent never expires in practice.
        let expires = now
            .checked_add(hold)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        t.slots.insert(execution, expires);
        t.expiry.insert((expires, execution));
        owners.insert(execution, tenant.clone());
    }
    if let Some(tokens) = tokens {
        t.bucket = Some(Bucket { tokens, at: now });
    }
    Admission::Admitted
}

#[async_trait]
impl QuotaStore for MemoryQuotaStore {
    async fn admit(&self, request: AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let mut state = self.state.lock();
        Ok(admit_locked(&mut state, request, Instant::now()))
    }

    async fn release(&self, tenant: &Tenant, executions: &[ExecutionId]) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        let State { tenants, owners } = &mut *state;
        let Some(t) = tenants.get_mut(tenant) else {
            return Ok(());
        };
        for id in executions {
            if let Some(expires) = t.slots.remove(id) {
                t.expiry.remove(&(expires, *id));
                owners.remove(id);
            }
        }
        Ok(())
    }

    async fn holders(&self, tenant: &Tenant, limit: usize) -> Result<Vec<ExecutionId>, StoreError> {
        let state = self.state.lock();
        Ok(state.tenants.get(tenant).map_or_else(Vec::new, |t| {
            t.expiry.iter().take(limit).map(|&(_, id)| id).collect()
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use protocol::event::EventBody;
    use protocol::{RuntimeError, RuntimeEvent, Sequence, Timestamp};

    use super::*;
    use crate::event_store::EventStore;
    use crate::memory::{MemoryEventStore, MemoryLimits};
    use crate::quota::{QuotaLimits, contract};

    #[tokio::test]
    async fn memory_quota_store_passes_the_contract() {
        contract::quota_suite(Arc::new(MemoryQuotaStore::new())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_quota_store_passes_the_contract_multithreaded() {
        contract::quota_suite(Arc::new(MemoryQuotaStore::new())).await;
    }

    #[tokio::test]
    async fn the_event_store_hook_releases_at_the_terminal_event() {
        let quotas = Arc::new(MemoryQuotaStore::new());
        let events = MemoryEventStore::new(MemoryLimits::default());
        let hook = Arc::clone(&quotas);
        events.on_terminal(Arc::new(move |id| hook.release_execution(id)));
        let limits = QuotaLimits::new(Some(1), None, None).unwrap();
        let tenant: Tenant = "t".parse().unwrap();
        let id = ExecutionId::new_random();
        let hold = Duration::from_secs(600);
        let (q, tenant, limits) = (&quotas, &tenant, &limits);
        let admits = |id| async move {
            let request = AdmitRequest {
                tenant,
                limits,
                execution: id,
                hold,
            };
            q.admit(request).await.unwrap().is_admitted()
        };
        assert!(admits(id).await);
        let at = Timestamp::now();
        events
            .create(RuntimeEvent::new(id, Sequence(1), at, EventBody::Accepted))
            .await
            .unwrap();
        let other = ExecutionId::new_random();
        assert!(!admits(other).await);
        assert_eq!(quotas.held(), 1, "a non-terminal event releases nothing");
        let failed = EventBody::Failed {
            error: RuntimeError::cancelled(),
        };
        events
            .append(RuntimeEvent::new(id, Sequence(2), at, failed))
            .await
            .unwrap();
        assert_eq!(quotas.held(), 0);
        assert!(admits(other).await);
    }
}
