//! Idempotency keys: one atomic claim per key maps it to at most one execution.

use async_trait::async_trait;
use protocol::{ExecutionId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// What a key is bound to. Only hashes are stored: never the raw key or request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// sha256 of the canonical request JSON.
    pub fingerprint: String,
    pub execution_id: ExecutionId,
    pub created_at: Timestamp,
}

/// Idempotency key storage.
///
/// Contract (checked by `contract::idempotency_suite`):
/// - `claim(key_hash, record)` atomically binds the key to `record` if it is free and returns
///   `None`; if the key is bound, it changes nothing and returns the existing record. Among any
///   number of concurrent claims of one key, exactly one gets `None`.
/// - A binding lives for the store's TTL, then the key is free again.
/// - `release(key_hash, execution_id)` frees the key only if it is bound to that execution (used
///   when creating the execution failed, so a retry can create it [R 14]).
/// - `bound(key_hash)` returns the record the key is bound to, or `None` while it is free, and
///   changes nothing: what a `claim` made at the same moment would return when the key is
///   bound. (A worker reads a keyed job's binding while it reads the job's log, and claims the
///   key only when the read finds it free: `worker::key_guard`.)
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    async fn claim(
        &self,
        key_hash: &str,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;
    async fn bound(&self, key_hash: &str) -> Result<Option<IdempotencyRecord>, StoreError>;
    async fn release(&self, key_hash: &str, execution_id: ExecutionId) -> Result<(), StoreError>;
    async fn ready(&self) -> Result<(), StoreError>;
}
