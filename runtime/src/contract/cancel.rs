//! The cancel bus's contract ([`CancelBus`]).

use std::sync::Arc;

use protocol::ExecutionId;

use super::PROMPT;
use crate::cancel::CancelBus;

/// Runs every cancel-bus check.
pub async fn cancel_suite(bus: Arc<dyn CancelBus>) {
    let id = ExecutionId::new_random();
    bus.request(id).await.unwrap(); // nobody watches: no-op, no error
    let token = bus.watch(id);
    assert!(!token.is_cancelled());
    bus.request(id).await.unwrap();
    tokio::time::timeout(PROMPT, token.cancelled())
        .await
        .unwrap();
    bus.unwatch(id);
    let other = ExecutionId::new_random();
    let untouched = bus.watch(other);
    bus.request(ExecutionId::new_random()).await.unwrap();
    assert!(!untouched.is_cancelled());
    bus.unwatch(other);
    // Watches are counted: a second watcher leaving does not disarm the first.
    let shared = ExecutionId::new_random();
    let first = bus.watch(shared);
    let second = bus.watch(shared);
    bus.unwatch(shared);
    bus.request(shared).await.unwrap();
    tokio::time::timeout(PROMPT, first.cancelled())
        .await
        .unwrap();
    assert!(second.is_cancelled());
    bus.unwatch(shared);
}
