//! Per-tenant quotas, cluster-wide: a cap on active (non-terminal) executions and a token bucket
//! on submits (contract.md section 7).
//!
//! - [`QuotaStore`]: the atomic admit/release primitive, [`memory`] for embedded mode and
//!   [`redis`] (Lua scripts on Redis server time) shared by every gateway of a deployment.
//! - [`gate`]: [`QuotaGate`], what the gateway calls: it knows each tenant's limits (tenants
//!   without any skip the store entirely), turns deadlines into slot lifetimes, and reconciles
//!   slots of executions that ended elsewhere.
//!
//! The decision a reader must know: **how active slots are released.** An execution ends in a
//! worker (another process, which has no Redis connection), in the gateway (cancel of a queued
//! execution, a submit that failed after admission) or in a deadline sweeper in any process.
//! Making every terminal writer release would put Redis into the worker and into every
//! compare-and-set path, and a crash between the terminal append and the release would still
//! leak. Instead a slot is a member of a per-tenant set with an expiry, and three mechanisms
//! release it, each enough for a different case:
//! 1. **Eager**: whoever sees the terminal in the gateway releases at once (a submit that failed
//!    after admission, cancel of a queued execution). In embedded mode the memory event store
//!    reports every terminal append to the memory quota store, so release is exact there.
//! 2. **Reconciliation** (the normal path in `nats` mode): when a tenant is at its cap, the gate
//!    reads the log heads of the tenant's slot holders in the event store, releases those whose
//!    log is terminal, and tries the admit once more. The event store is the truth about
//!    terminality; reading it only when the cap is reached costs nothing while under it and is
//!    bounded (batch size, at most once per short interval per tenant and gateway).
//! 3. **Expiry** (backstop): a slot expires at its execution's deadline plus a grace, because
//!    the deadline is terminal (architecture.md, invariant 4; a sweeper closes an orphaned
//!    execution at most 2 s after it). This bounds any leak, e.g. a gateway that crashed
//!    between admission and creating the log, whose slot no log head can ever release.

pub mod gate;
pub mod memory;
pub mod redis;

#[cfg(any(test, feature = "contract-tests"))]
pub mod contract;

use std::time::Duration;

use async_trait::async_trait;
use protocol::{ExecutionId, Tenant};

use crate::error::StoreError;

pub use gate::{GateSettings, QuotaGate};
pub use memory::MemoryQuotaStore;
pub use redis::RedisQuotaStore;

/// A token bucket: `per_second` tokens refill continuously up to `burst`; each admitted submit
/// takes one. A full bucket is the starting state (an idle tenant may burst).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    per_second: f64,
    burst: u64,
}

impl RateLimit {
    /// `burst` defaults to one second's worth of tokens (at least 1).
    pub fn new(per_second: f64, burst: Option<u64>) -> Result<Self, InvalidQuota> {
        if !per_second.is_finite() || per_second <= 0.0 {
            return Err(InvalidQuota::Rate);
        }
        // Float → integer: saturating by definition of `as`; one second's worth, at least 1.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let burst = burst.unwrap_or_else(|| (per_second.ceil() as u64).max(1));
        if burst == 0 {
            return Err(InvalidQuota::Burst);
        }
        Ok(Self { per_second, burst })
    }

    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }
}

/// One tenant's limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QuotaLimits {
    pub max_active: Option<u64>,
    pub rate: Option<RateLimit>,
}

impl QuotaLimits {
    /// Limits from the deployment file's fields, validated.
    pub fn new(
        max_active: Option<u64>,
        submits_per_second: Option<f64>,
        burst: Option<u64>,
    ) -> Result<Self, InvalidQuota> {
        if max_active == Some(0) {
            return Err(InvalidQuota::MaxActive);
        }
        let rate = match (submits_per_second, burst) {
            (Some(rate), burst) => Some(RateLimit::new(rate, burst)?),
            (None, Some(_)) => return Err(InvalidQuota::BurstWithoutRate),
            (None, None) => None,
        };
        Ok(Self { max_active, rate })
    }

    /// Whether no limit applies (the store is never asked).
    pub fn is_unlimited(&self) -> bool {
        self.max_active.is_none() && self.rate.is_none()
    }
}

/// A quota setting that cannot work; the message names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidQuota {
    #[error("max_active_executions must be at least 1")]
    MaxActive,
    #[error("submits_per_second must be a positive number")]
    Rate,
    #[error("burst must be at least 1")]
    Burst,
    #[error("burst needs submits_per_second")]
    BurstWithoutRate,
}

/// The answer to an admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A token was taken and the execution holds an active slot.
    Admitted,
    /// The bucket is empty; one token refills after `retry_after`.
    RateLimited { retry_after: Duration },
    /// The tenant holds `max_active` slots. When one frees is unknown: `retry_after` is a hint.
    ActiveLimit { retry_after: Duration },
}

impl Admission {
    pub fn is_admitted(&self) -> bool {
        matches!(self, Admission::Admitted)
    }
}

/// One admit asked of a [`QuotaStore`]: `execution` would hold one of `tenant`'s active slots
/// for at most `hold`, and take a token of its bucket, within `limits`.
#[derive(Debug, Clone, Copy)]
pub struct AdmitRequest<'a> {
    pub tenant: &'a Tenant,
    pub limits: &'a QuotaLimits,
    pub execution: ExecutionId,
    pub hold: Duration,
}

/// How long to wait after an `ActiveLimit`: slots free when executions end, which no store can
/// foresee, so a short fixed hint.
pub const ACTIVE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Atomic per-tenant quota state.
///
/// Contract (checked by `contract::quota_suite`):
/// - `admit` checks the tenant's bucket (if `limits.rate`) and its active slots (if
///   `limits.max_active`) and either commits both (takes one token, adds `execution` as a slot
///   holder for at most `hold`) and returns `Admitted`, or changes nothing at all and says why:
///   `RateLimited` when the bucket has less than one token (checked first: retrying sooner cannot
///   help, whatever the slots), else `ActiveLimit` when `max_active` slots are held. A rejected
///   admit consumes neither a token nor a slot. The check and the commit are atomic across every
///   process sharing the store: concurrent admits never hold more than `max_active` slots, and
///   over any interval of length `t` at most `burst + per_second × t` admits succeed.
/// - Admitting an execution that already holds a slot of the tenant returns `Admitted` and takes
///   nothing (a retried admit after a lost answer does not count twice).
/// - A slot is held until `release` or until `hold` has passed since the admit, whichever is
///   first; expired slots stop counting at the next admit of the tenant.
/// - `release` frees the given executions' slots; unknown ids are ignored (releasing twice, or
///   after expiry, is harmless).
/// - `holders` lists up to `limit` executions holding a slot of the tenant, those expiring first
///   first (the oldest, for executions with equal deadlines).
/// - Tenants are independent. Time is the store's own clock (Redis: the server's), so the
///   callers' clocks do not matter.
/// - On `Err` (backend unreachable) the admit's outcome is unknown; the slot, if taken, expires.
#[async_trait]
pub trait QuotaStore: Send + Sync + 'static {
    async fn admit(&self, request: AdmitRequest<'_>) -> Result<Admission, StoreError>;

    async fn release(&self, tenant: &Tenant, executions: &[ExecutionId]) -> Result<(), StoreError>;

    async fn holders(&self, tenant: &Tenant, limit: usize) -> Result<Vec<ExecutionId>, StoreError>;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_validated() {
        assert!(QuotaLimits::new(None, None, None).unwrap().is_unlimited());
        assert_eq!(
            QuotaLimits::new(Some(0), None, None),
            Err(InvalidQuota::MaxActive)
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                QuotaLimits::new(None, Some(bad), None),
                Err(InvalidQuota::Rate)
            );
        }
        assert_eq!(
            QuotaLimits::new(None, Some(1.0), Some(0)),
            Err(InvalidQuota::Burst)
        );
        assert_eq!(
            QuotaLimits::new(None, None, Some(3)),
            Err(InvalidQuota::BurstWithoutRate)
        );
        let l = QuotaLimits::new(Some(2), Some(2.5), None).unwrap();
        assert_eq!(l.rate.unwrap().burst(), 3, "one second's worth by default");
        assert_eq!(
            QuotaLimits::new(None, Some(0.1), None)
                .unwrap()
                .rate
                .unwrap()
                .burst(),
            1
        );
    }
}
