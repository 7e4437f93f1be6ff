//! In-memory idempotency keys with a TTL, expired lazily from a time-ordered queue.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use protocol::ExecutionId;

use crate::error::StoreError;
use crate::idempotency::{IdempotencyRecord, IdempotencyStore};

#[derive(Default)]
struct Keys {
    bound: HashMap<String, (IdempotencyRecord, Instant)>,
    expiry: VecDeque<(Instant, String)>,
}

impl Keys {
    /// Drops the bindings whose TTL ran out by `now`.
    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.expiry.front() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.expiry.pop_front() {
                // The key may have been released and re-bound since; only drop a stale binding.
                if self.bound.get(&key).is_some_and(|(_, exp)| *exp <= now) {
                    self.bound.remove(&key);
                }
            }
        }
    }
}

/// See the module docs.
#[derive(derive_more::Debug)]
pub struct MemoryIdempotencyStore {
    ttl: Duration,
    #[debug(skip)]
    keys: Mutex<Keys>,
}

impl MemoryIdempotencyStore {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            keys: Mutex::new(Keys::default()),
        }
    }

    /// Bound keys (for metrics and tests).
    pub fn len(&self) -> usize {
        self.keys.lock().bound.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl IdempotencyStore for MemoryIdempotencyStore {
    async fn claim(
        &self,
        key_hash: &str,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let now = Instant::now();
        let mut keys = self.keys.lock();
        keys.expire(now);
        if let Some((existing, _)) = keys.bound.get(key_hash) {
            return Ok(Some(existing.clone()));
        }
        let expires = now + self.ttl;
        keys.bound
            .insert(key_hash.to_owned(), (record.clone(), expires));
        keys.expiry.push_back((expires, key_hash.to_owned()));
        Ok(None)
    }

    async fn bound(&self, key_hash: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        let now = Instant::now();
        let keys = self.keys.lock();
        Ok(keys
            .bound
            .get(key_hash)
            .filter(|(_, expires)| *expires > now)
            .map(|(record, _)| record.clone()))
    }

    async fn release(&self, key_hash: &str, execution_id: ExecutionId) -> Result<(), StoreError> {
        let mut keys = self.keys.lock();
        if keys
            .bound
            .get(key_hash)
            .is_some_and(|(r, _)| r.execution_id == execution_id)
        {
            keys.bound.remove(key_hash);
        }
        Ok(())
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
