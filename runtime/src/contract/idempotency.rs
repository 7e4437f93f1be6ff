//! The idempotency store's contract ([`IdempotencyStore`]).

use std::sync::Arc;

use protocol::{ExecutionId, Timestamp};

use super::spawn_each;
use crate::idempotency::{IdempotencyRecord, IdempotencyStore};

fn record(fingerprint: &str) -> IdempotencyRecord {
    IdempotencyRecord {
        fingerprint: fingerprint.into(),
        execution_id: ExecutionId::new_random(),
        created_at: Timestamp::now(),
    }
}

/// Runs every idempotency check.
pub async fn idempotency_suite(store: Arc<dyn IdempotencyStore>) {
    store.ready().await.unwrap();
    let key = format!("key-{}", ExecutionId::new_random());
    // Reading a free key finds nothing and binds nothing.
    assert_eq!(store.bound(&key).await.unwrap(), None);
    let first = record("fp1");
    assert_eq!(store.claim(&key, &first).await.unwrap(), None);
    assert_eq!(store.bound(&key).await.unwrap(), Some(first.clone()));
    assert_eq!(
        store.claim(&key, &record("fp2")).await.unwrap(),
        Some(first.clone())
    );
    // Release by another execution is a no-op; by the owner it frees the key.
    store
        .release(&key, ExecutionId::new_random())
        .await
        .unwrap();
    assert_eq!(
        store.claim(&key, &record("fp3")).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.bound(&key).await.unwrap(), Some(first.clone()));
    store.release(&key, first.execution_id).await.unwrap();
    assert_eq!(store.bound(&key).await.unwrap(), None);
    let again = record("fp4");
    assert_eq!(store.claim(&key, &again).await.unwrap(), None);
    assert_eq!(store.bound(&key).await.unwrap(), Some(again));
    // Concurrent first claims: exactly one wins, all others see the winner.
    let key = format!("race-{}", ExecutionId::new_random());
    let tasks = spawn_each(&store, 50, |i, store| {
        let key = key.clone();
        async move {
            let r = record(&format!("fp{i}"));
            (r.clone(), store.claim(&key, &r).await.unwrap())
        }
    });
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for t in tasks {
        let (mine, result) = t.await.unwrap();
        match result {
            None => winners.push(mine),
            Some(existing) => seen.push(existing),
        }
    }
    assert_eq!(winners.len(), 1);
    assert!(seen.iter().all(|r| *r == winners[0]));
}
