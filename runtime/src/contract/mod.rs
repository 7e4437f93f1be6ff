//! The contract test suite every implementation must pass.
//!
//! Each function takes a fresh implementation and panics on the first broken promise. The memory
//! implementations run it in this crate's tests; the NATS and Redis implementations run the same
//! functions against real servers. Executions use random ids, so one store instance can serve
//! several suites.
//!
//! One file per trait under test, every item re-exported here:
//! - `event_store`: [`event_store_suite`], [`run_limit_suite`] and the builders backend tests
//!   stage logs with ([`event`], [`accepted`], [`routed`], [`race_to`] ...);
//! - `job_queue`: [`job_queue_suite`] and [`job`];
//! - `idempotency`: [`idempotency_suite`];
//! - `cancel`: [`cancel_suite`];
//! - the quota store's suite, [`quota_suite`], lives beside the quota module.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cancel;
mod event_store;
mod idempotency;
mod job_queue;

use std::sync::Arc;
use std::time::Duration;

pub use self::cancel::cancel_suite;
pub use self::event_store::{
    accepted, completed, delta, drain, event, event_store_suite, output_usage, race_to, read,
    records, route_selected, routed, run_limit_suite, target,
};
pub use self::idempotency::idempotency_suite;
pub use self::job_queue::{job, job_queue_suite};
/// The quota store suite lives beside the quota module; re-exported so every suite is here.
pub use crate::quota::contract::quota_suite;

/// Generous bound for anything that should happen "promptly" on a busy 2-core machine.
const PROMPT: Duration = Duration::from_secs(20);

/// Starts `task(i, shared)` for each `i` in `0..n` on its own Tokio task, each with its own
/// handle on `shared`; the handles come back in the order of `i`.
pub fn spawn_each<S, T, Fut>(
    shared: &Arc<S>,
    n: usize,
    task: impl Fn(usize, Arc<S>) -> Fut,
) -> Vec<tokio::task::JoinHandle<T>>
where
    S: ?Sized,
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    (0..n)
        .map(|i| tokio::spawn(task(i, Arc::clone(shared))))
        .collect()
}
