//! The worker's half of a keyed submission's idempotency claim ([`runtime::KeyClaim`]).
//!
//! A keyed submission binds its key while its log is created and its job published, all at
//! once, so the job can reach a worker before the gateway knows whether the key was free. Before
//! a worker claims such a log it makes the same claim with the same record:
//! - the key is free: this claim binds it to the execution (the gateway's then finds it bound
//!   to the same execution, which is its own);
//! - the key is bound to this execution (by the gateway, or an earlier delivery): run it;
//! - the key is bound to another execution: the submission was a retry of that one, and this
//!   execution must never run. The gateway answers with the other execution and closes this
//!   one's log; the worker closes it too, whichever comes first.
//!
//! A worker that bound a free key and then finds the log closed unrun by its gateway (the
//! submission was answered 503 meanwhile) frees the key again ([`release_if_unqueued`]), so a
//! retry can create the execution.
//!
//! Most of the time the gateway's claim has landed before the job reaches a worker, so the
//! worker first only reads the binding ([`peek`]), at the same time as it reads the log's head:
//! a key found bound answers the question as a claim would (a claim of a bound key changes
//! nothing and returns the binding), and only a key found free (or a read that failed) is
//! claimed, once the log is found. The read never binds anything, so a job whose log never
//! comes leaves no binding behind. (Claiming after the head read cost the keyed submit at c=1
//! 0.06–0.08 ms at p50, through Redis and the cores it kept busy while the next submit was
//! under way: BENCHMARKS.md, "Keyed submits".)
//!
//! So among the executions of one key at most one ever runs, whatever the order in which the
//! gateway's and the worker's claims land. A key store the worker cannot reach is retried for
//! [`KEY_CLAIM_BUDGET`], or until the log is found closed (the gateway, which could not reach
//! the key store either, closes the log of a submission it answers 503); the job then goes back
//! to the queue unrun, or is dropped.

use std::time::Duration;

use runtime::backoff::Backoff;
use runtime::{EventStore, IdempotencyStore, KeyClaim, StoreError};
use tokio_util::sync::CancellationToken;

/// How long a worker keeps trying to reach the key store before it leaves the job to a later
/// delivery.
pub const KEY_CLAIM_BUDGET: Duration = Duration::from_secs(10);

/// What the key of a job says about running its execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHolder {
    /// The key is bound to this execution: it may run. `bound_here`: this claim bound it (it
    /// was free), rather than finding it bound by the gateway or an earlier delivery.
    This { bound_here: bool },
    /// The key is bound to another execution: this one must never run.
    Another,
    /// The key could not be claimed, and meanwhile the log was closed: nothing to run.
    Closed,
}

/// What the key's binding says, read without binding it: `Some(This { bound_here: false })` or
/// `Some(Another)` when the key is bound, `None` when it is free or could not be read (then
/// [`claim`] decides). Never `Closed`.
pub async fn peek(keys: &dyn IdempotencyStore, claim: &KeyClaim) -> Option<KeyHolder> {
    match keys.bound(&claim.key_hash).await {
        Ok(Some(bound)) if bound.execution_id == claim.record.execution_id => {
            Some(KeyHolder::This { bound_here: false })
        }
        Ok(Some(_)) => Some(KeyHolder::Another),
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(execution_id = %claim.record.execution_id, error = %e, "cannot read the idempotency key; claiming it instead");
            None
        }
    }
}

/// Claims `claim`'s key for its execution (see the module docs), retrying an unreachable store
/// with backoff for [`KEY_CLAIM_BUDGET`], until the execution's log in `log` is found closed,
/// or until `stop` is cancelled. Errors: the store could not be reached; nothing may run yet.
pub async fn claim(
    keys: &dyn IdempotencyStore,
    log: &dyn EventStore,
    claim: &KeyClaim,
    stop: &CancellationToken,
) -> Result<KeyHolder, StoreError> {
    let id = claim.record.execution_id;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
        .with_budget(KEY_CLAIM_BUDGET);
    loop {
        match keys.claim(&claim.key_hash, &claim.record).await {
            Ok(None) => return Ok(KeyHolder::This { bound_here: true }),
            Ok(Some(bound)) if bound.execution_id == id => {
                return Ok(KeyHolder::This { bound_here: false });
            }
            Ok(Some(_)) => return Ok(KeyHolder::Another),
            Err(e) => {
                if let Ok(Some(head)) = log.head(id).await
                    && head.terminal
                {
                    return Ok(KeyHolder::Closed);
                }
                let Some(pause) = backoff.next_pause() else {
                    return Err(e);
                };
                tracing::warn!(execution_id = %id, error = %e, "cannot claim the idempotency key yet; retrying");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => return Err(e),
                }
            }
        }
    }
}

/// Frees `claim`'s key, which this worker bound, when the execution's log turns out closed
/// with the unqueued failure right after `execution.accepted`: its gateway gave the submission
/// up (answered 503, or 429) while this worker was binding the key, and may have released the
/// key before this worker bound it. Nothing of the execution ran or will run, so a retry must
/// be free to create the execution. A log closed any other way (a cancellation, the deadline)
/// keeps its key: a retry replays that execution. Best effort: the binding expires anyway.
pub async fn release_if_unqueued(
    keys: &dyn IdempotencyStore,
    log: &dyn EventStore,
    claim: &KeyClaim,
) {
    let id = claim.record.execution_id;
    let Ok(Some(state)) = log.state(id).await else {
        return;
    };
    let snapshot = state.snapshot();
    let unqueued = snapshot.last_sequence.get() == 2
        && snapshot.error.as_ref() == Some(&protocol::RuntimeError::unqueued());
    if !unqueued {
        return;
    }
    match keys.release(&claim.key_hash, id).await {
        Ok(()) => {
            tracing::info!(execution_id = %id, "released the idempotency key of an execution given up unrun")
        }
        Err(e) => {
            tracing::warn!(execution_id = %id, error = %e, "cannot release the idempotency key of an execution given up unrun")
        }
    }
}
