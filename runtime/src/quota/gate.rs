//! [`QuotaGate`]: the gateway's one call per submit. It holds every tenant's limits (tenants
//! without limits never reach the store, so they cost no round trip), turns an execution's
//! deadline into its slot's hold, and, when a tenant is at its active cap, reconciles the
//! tenant's slots with the event store before answering (see the parent module for why).
//!
//! Reconciliation reads the log heads of up to [`GateSettings::reconcile_batch`] slot holders
//! (those expiring first; [`EventStore::heads`], many per request), releases the terminal ones
//! and, if any were released, admits once more. It runs at most once per
//! [`GateSettings::reconcile_interval`] per tenant in this process. Admits refused at the cap
//! while a reconciliation runs wait for it, and retry once if it (or any since they first
//! asked) released slots: otherwise a burst of submits arriving at a cap full of ended
//! executions would all be refused but the one that reconciled. A holder without a log is
//! kept: its submit may still be creating it, and if that submit died the slot expires.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use protocol::{ExecutionId, Tenant, Timestamp};
use tokio::time::Instant;

use super::{Admission, AdmitRequest, MemoryQuotaStore, QuotaLimits, QuotaStore};
use crate::error::StoreError;
use crate::event_store::EventStore;
use crate::memory::{MemoryEventStore, MemoryLimits};

/// How long the release of a slot after a failed admit is tried again while the store keeps
/// failing (the failure that lost the admit's answer usually outlasts it): a leader election
/// or a short cut; past that, the slot expires with its hold.
const RELEASE_AFTER_FAILED_ADMIT: Duration = Duration::from_secs(120);

/// Timing and bounds of a [`QuotaGate`].
#[derive(Debug, Clone)]
pub struct GateSettings {
    /// Added to an execution's remaining deadline to get its slot's hold. A sweeper closes an
    /// execution no worker ran at most 2 s after its deadline (contract section 8); the rest
    /// absorbs clock differences between gateways and the store.
    pub grace: Duration,
    /// Least time between two reconciliations of one tenant by this gate.
    pub reconcile_interval: Duration,
    /// Most slot holders whose log head one reconciliation reads.
    pub reconcile_batch: usize,
}

impl Default for GateSettings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(5),
            reconcile_interval: Duration::from_millis(250),
            reconcile_batch: 512,
        }
    }
}

/// See the module docs.
#[derive(derive_more::Debug)]
pub struct QuotaGate {
    #[debug(skip)]
    store: Arc<dyn QuotaStore>,
    #[debug(skip)]
    events: Arc<dyn EventStore>,
    /// Tenants with at least one limit.
    tenants: HashMap<Tenant, QuotaLimits>,
    settings: GateSettings,
    /// One per tenant with a cap.
    #[debug(skip)]
    reconcilers: HashMap<Tenant, Reconciler>,
}

/// Reconciliation state of one tenant in this gate.
#[derive(Debug, Default)]
struct Reconciler {
    /// Counts reconciliations that released slots, so an admit can tell whether any did since
    /// it asked the store.
    released: AtomicU64,
    /// When this gate last reconciled the tenant. Held during a reconciliation, so admits
    /// refused meanwhile wait for its outcome.
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl QuotaGate {
    /// A gate over `store` for `tenants`' limits; `events` is read to reconcile.
    pub fn new(
        store: Arc<dyn QuotaStore>,
        events: Arc<dyn EventStore>,
        tenants: impl IntoIterator<Item = (Tenant, QuotaLimits)>,
        settings: GateSettings,
    ) -> Self {
        let tenants: HashMap<Tenant, QuotaLimits> = tenants
            .into_iter()
            .filter(|(_, limits)| !limits.is_unlimited())
            .collect();
        let reconcilers = tenants
            .iter()
            .filter(|(_, limits)| limits.max_active.is_some())
            .map(|(tenant, _)| (tenant.clone(), Reconciler::default()))
            .collect();
        Self {
            store,
            events,
            tenants,
            settings,
            reconcilers,
        }
    }

    /// A gate for a deployment where no tenant has limits: it never reaches a store.
    pub fn unlimited() -> Self {
        Self::new(
            Arc::new(MemoryQuotaStore::new()),
            Arc::new(MemoryEventStore::new(MemoryLimits::default())),
            [],
            GateSettings::default(),
        )
    }

    /// Whether any tenant has a limit.
    pub fn is_unlimited(&self) -> bool {
        self.tenants.is_empty()
    }

    /// Whether any tenant has an active-execution cap (so slots may need releasing).
    pub fn has_caps(&self) -> bool {
        !self.reconcilers.is_empty()
    }

    /// The tenant's limits, `None` when it has none.
    pub fn limits(&self, tenant: &Tenant) -> Option<&QuotaLimits> {
        self.tenants.get(tenant)
    }

    /// Admits a new execution of `tenant` whose deadline is `deadline_at` (see
    /// [`QuotaStore::admit`]). On `Err` the outcome is unknown; a slot possibly taken is
    /// released in the background, tried again for [`RELEASE_AFTER_FAILED_ADMIT`].
    pub async fn admit(
        &self,
        tenant: &Tenant,
        execution: ExecutionId,
        deadline_at: Timestamp,
    ) -> Result<Admission, StoreError> {
        let Some(limits) = self.tenants.get(tenant) else {
            return Ok(Admission::Admitted);
        };
        let remaining = deadline_at
            .unix_millis()
            .saturating_sub(Timestamp::now().unix_millis());
        let hold = Duration::from_millis(u64::try_from(remaining).unwrap_or(0))
            .saturating_add(self.settings.grace);
        let reconciler = self.reconcilers.get(tenant);
        let seen = reconciler.map(|r| r.released.load(Ordering::SeqCst));
        let request = AdmitRequest {
            tenant,
            limits,
            execution,
            hold,
        };
        let mut answer = self.store.admit(request).await;
        if let (Ok(Admission::ActiveLimit { .. }), Some(reconciler), Some(seen)) =
            (&answer, reconciler, seen)
            && self.reconcile(tenant, reconciler, seen).await
        {
            answer = self.store.admit(request).await;
        }
        if answer.is_err() && limits.max_active.is_some() {
            // The store that failed the admit is usually still failing: keep trying the release
            // a while (the slot would otherwise count until its hold expires, the deadline plus
            // the grace: reconciliation keeps a slot whose log does not exist).
            let store = Arc::clone(&self.store);
            let tenant = tenant.clone();
            tokio::spawn(async move {
                let mut backoff = crate::backoff::Backoff::new(
                    Duration::from_millis(100),
                    Duration::from_secs(5),
                )
                .with_budget(RELEASE_AFTER_FAILED_ADMIT);
                loop {
                    let Err(e) = store.release(&tenant, &[execution]).await else {
                        return;
                    };
                    let Some(pause) = backoff.next_pause() else {
                        tracing::debug!(error = %e, "could not release a slot after a failed admit; it expires");
                        return;
                    };
                    tokio::time::sleep(pause).await;
                }
            });
        }
        answer
    }

    /// Frees `execution`'s slot now that it ended or was never created. Failures are logged:
    /// the slot then ends by reconciliation or expiry.
    pub async fn release(&self, tenant: &Tenant, execution: ExecutionId) {
        if self
            .tenants
            .get(tenant)
            .is_none_or(|limits| limits.max_active.is_none())
        {
            return;
        }
        if let Err(e) = self.store.release(tenant, &[execution]).await {
            tracing::warn!(execution_id = %execution, error = %e, "could not release a quota slot; it ends by reconciliation or expiry");
        }
    }

    /// Whether slots were released since the admit that read `seen` asked the store: by a
    /// reconciliation that ran meanwhile, or by one run now if the interval allows.
    async fn reconcile(&self, tenant: &Tenant, reconciler: &Reconciler, seen: u64) -> bool {
        let mut last = reconciler.last.lock().await;
        if reconciler.released.load(Ordering::SeqCst) != seen {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < self.settings.reconcile_interval) {
            return false;
        }
        *last = Some(Instant::now());
        if self.release_ended(tenant).await == 0 {
            return false;
        }
        reconciler.released.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Releases the slots of `tenant`'s executions whose log is terminal; returns how many.
    async fn release_ended(&self, tenant: &Tenant) -> usize {
        let holders = match self
            .store
            .holders(tenant, self.settings.reconcile_batch)
            .await
        {
            Ok(holders) => holders,
            Err(e) => {
                tracing::warn!(error = %e, "could not list quota slot holders");
                return 0;
            }
        };
        let heads = match self.events.heads(&holders).await {
            Ok(heads) => heads,
            Err(e) => {
                tracing::debug!(error = %e, "log heads unreadable; slots kept");
                return 0;
            }
        };
        let ended: Vec<ExecutionId> = holders
            .iter()
            .zip(heads)
            .filter(|(_, head)| head.is_some_and(|h| h.terminal))
            .map(|(&id, _)| id)
            .collect();
        if ended.is_empty() {
            return 0;
        }
        match self.store.release(tenant, &ended).await {
            Ok(()) => {
                tracing::debug!(released = ended.len(), "reconciled quota slots");
                ended.len()
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not release reconciled quota slots");
                0
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use protocol::RuntimeError;
    use protocol::event::EventBody;

    use super::*;

    /// A memory quota store that counts admits and can fail them after taking the slot (a
    /// lost answer), and fail its first `failing_releases` releases (the store still away).
    #[derive(Default)]
    struct Probe {
        inner: MemoryQuotaStore,
        admits: AtomicUsize,
        lose_answers: bool,
        failing_releases: AtomicUsize,
    }

    #[async_trait]
    impl QuotaStore for Probe {
        async fn admit(&self, request: AdmitRequest<'_>) -> Result<Admission, StoreError> {
            self.admits.fetch_add(1, Ordering::SeqCst);
            let answer = self.inner.admit(request).await;
            if self.lose_answers {
                return Err(StoreError::Unavailable("answer lost".into()));
            }
            answer
        }

        async fn release(
            &self,
            tenant: &Tenant,
            executions: &[ExecutionId],
        ) -> Result<(), StoreError> {
            let failing =
                self.failing_releases
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if failing.is_ok() {
                return Err(StoreError::Unavailable("store away".into()));
            }
            self.inner.release(tenant, executions).await
        }

        async fn holders(
            &self,
            tenant: &Tenant,
            limit: usize,
        ) -> Result<Vec<ExecutionId>, StoreError> {
            self.inner.holders(tenant, limit).await
        }
    }

    /// `probe` and an empty memory event store, to build a gate over.
    fn stores(probe: Probe) -> (Arc<Probe>, Arc<MemoryEventStore>) {
        (
            Arc::new(probe),
            Arc::new(MemoryEventStore::new(MemoryLimits::default())),
        )
    }

    /// A gate over `probe` and an empty memory event store for the tenants `capped` (one
    /// active execution) and `free` (no limits), with the default settings but for what `set`
    /// changes; the probe and the event store come back beside it.
    fn gate_with(
        probe: Probe,
        set: impl FnOnce(&mut GateSettings),
    ) -> (Arc<Probe>, Arc<MemoryEventStore>, QuotaGate) {
        let (store, events) = stores(probe);
        let mut settings = GateSettings::default();
        set(&mut settings);
        let tenants = [
            (t("capped"), QuotaLimits::new(Some(1), None, None).unwrap()),
            (t("free"), QuotaLimits::default()),
        ];
        let gate = QuotaGate::new(store.clone(), events.clone(), tenants, settings);
        (store, events, gate)
    }

    fn t(name: &str) -> Tenant {
        name.parse().unwrap()
    }

    fn later() -> Timestamp {
        Timestamp::from_unix_millis(Timestamp::now().unix_millis() + 600_000)
    }

    /// Whether `gate` admits `id` for `tenant` with `deadline`.
    async fn admits(gate: &QuotaGate, tenant: &str, id: ExecutionId, deadline: Timestamp) -> bool {
        gate.admit(&t(tenant), id, deadline)
            .await
            .unwrap()
            .is_admitted()
    }

    /// A new execution with an open log in `events`.
    async fn open_log(events: &MemoryEventStore) -> ExecutionId {
        crate::contract::accepted(events).await
    }

    async fn close_log(events: &MemoryEventStore, id: ExecutionId) {
        let body = EventBody::Failed {
            error: RuntimeError::cancelled(),
        };
        events
            .append(crate::contract::event(id, 2, body))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn tenants_without_limits_never_reach_the_store() {
        let (store, _, gate) = gate_with(Probe::default(), |_| {});
        for tenant in ["free", "unknown"] {
            let a = gate
                .admit(&t(tenant), ExecutionId::new_random(), later())
                .await;
            assert_eq!(a.unwrap(), Admission::Admitted);
            gate.release(&t(tenant), ExecutionId::new_random()).await;
        }
        assert_eq!(store.admits.load(Ordering::SeqCst), 0);
        assert!(gate.limits(&t("free")).is_none());
        assert!(gate.limits(&t("capped")).is_some());
    }

    #[tokio::test]
    async fn at_the_cap_terminal_holders_are_reconciled_and_live_ones_kept() {
        let (store, events, gate) =
            gate_with(Probe::default(), |s| s.reconcile_interval = Duration::ZERO);
        // A holder without a log (its submit may still be creating it) is kept.
        let unlogged = ExecutionId::new_random();
        assert!(admits(&gate, "capped", unlogged, later()).await);
        let b = open_log(&events).await;
        let refused = gate.admit(&t("capped"), b, later()).await.unwrap();
        assert!(
            matches!(refused, Admission::ActiveLimit { .. }),
            "{refused:?}"
        );
        gate.release(&t("capped"), unlogged).await;
        // A holder whose log is open is kept.
        assert!(admits(&gate, "capped", b, later()).await);
        let c = open_log(&events).await;
        assert!(!admits(&gate, "capped", c, later()).await);
        // Once its log is terminal, the next admit at the cap frees its slot and succeeds.
        close_log(&events, b).await;
        assert!(admits(&gate, "capped", c, later()).await);
        assert_eq!(store.holders(&t("capped"), 10).await.unwrap(), vec![c]);
    }

    /// Ten admits at once at a cap held by ended executions: one reconciles, the others wait
    /// for it and retry, so exactly the cap is admitted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_admits_at_a_stale_cap_share_one_reconciliation() {
        let (store, events) = stores(Probe::default());
        let settings = GateSettings {
            reconcile_interval: Duration::from_secs(3600),
            ..GateSettings::default()
        };
        let limits = QuotaLimits::new(Some(3), None, None).unwrap();
        let gate = Arc::new(QuotaGate::new(
            store.clone(),
            events.clone(),
            [(t("t"), limits)],
            settings,
        ));
        for _ in 0..3 {
            let id = open_log(&events).await;
            assert!(admits(&gate, "t", id, later()).await);
            close_log(&events, id).await;
        }
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let gate = Arc::clone(&gate);
                tokio::spawn(
                    async move { admits(&gate, "t", ExecutionId::new_random(), later()).await },
                )
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            if task.await.unwrap() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 3);
    }

    #[tokio::test]
    async fn reconciliation_is_throttled_per_tenant() {
        let (store, events, gate) = gate_with(Probe::default(), |s| {
            s.reconcile_interval = Duration::from_secs(3600)
        });
        let a = open_log(&events).await;
        assert!(admits(&gate, "capped", a, later()).await);
        let b = ExecutionId::new_random();
        // Reconciles (nothing to free), then the interval has not passed.
        assert!(!admits(&gate, "capped", b, later()).await);
        close_log(&events, a).await;
        assert!(
            !admits(&gate, "capped", b, later()).await,
            "no second reconciliation within the interval"
        );
        assert_eq!(store.holders(&t("capped"), 10).await.unwrap(), vec![a]);
    }

    #[tokio::test]
    async fn a_failed_admit_gives_back_the_slot_it_may_have_taken() {
        let probe = Probe {
            lose_answers: true,
            ..Probe::default()
        };
        let (store, _, gate) = gate_with(probe, |_| {});
        let id = ExecutionId::new_random();
        assert!(gate.admit(&t("capped"), id, later()).await.is_err());
        let started = std::time::Instant::now();
        while !store.holders(&t("capped"), 10).await.unwrap().is_empty() {
            assert!(started.elapsed() < Duration::from_secs(20), "slot kept");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_release_after_a_failed_admit_outlasts_a_store_still_away() {
        // The store that lost the admit's answer fails the next releases too: the release is
        // tried again until it lands, not left to the slot's expiry (the deadline, 10 min).
        let probe = Probe {
            lose_answers: true,
            failing_releases: AtomicUsize::new(5),
            ..Probe::default()
        };
        let (store, _, gate) = gate_with(probe, |_| {});
        assert!(
            gate.admit(&t("capped"), ExecutionId::new_random(), later())
                .await
                .is_err()
        );
        let started = Instant::now();
        while !store.holders(&t("capped"), 10).await.unwrap().is_empty() {
            assert!(started.elapsed() < Duration::from_secs(60), "slot kept");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(store.failing_releases.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_slot_is_held_until_the_deadline_plus_the_grace() {
        let (_, _, gate) = gate_with(Probe::default(), |s| s.grace = Duration::from_millis(200));
        // Deadline already passed: the slot lives for the grace only.
        let past = Timestamp::from_unix_millis(Timestamp::now().unix_millis() - 1000);
        assert!(admits(&gate, "capped", ExecutionId::new_random(), past).await);
        let b = ExecutionId::new_random();
        let started = std::time::Instant::now();
        while !admits(&gate, "capped", b, later()).await {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "slot never expired"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
