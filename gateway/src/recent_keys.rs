//! The idempotency keys this gateway saw bound recently.
//!
//! A keyed submit normally binds its key while it creates its execution (`crate::submit`), so
//! a retry whose key is already bound creates an execution only to discard it: four JetStream
//! writes and a closed log kept for the retention period, for nothing. A submit whose key this
//! gateway saw bound is most likely such a retry, so it claims its key first and creates
//! nothing when the key is another's. The memory is bounded ([`CAPACITY`] keys, least useful
//! evicted first) and per process; forgetting a key, or remembering one that expired, only
//! changes the order of the steps, never the outcome.

use quick_cache::sync::Cache;

/// How many keys a gateway remembers (16 bytes of each key's hash, about 2 MiB in all).
pub const CAPACITY: usize = 65_536;

/// See the module docs.
pub struct RecentKeys(Cache<u128, ()>);

impl std::fmt::Debug for RecentKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentKeys")
            .field("len", &self.0.len())
            .finish()
    }
}

impl Default for RecentKeys {
    fn default() -> Self {
        Self(Cache::new(CAPACITY))
    }
}

impl RecentKeys {
    /// Whether `key_hash` (a stored key name: hex sha256) was seen bound lately.
    pub fn contains(&self, key_hash: &str) -> bool {
        self.0.get(&short(key_hash)).is_some()
    }

    /// Remembers that `key_hash` is bound.
    pub fn insert(&self, key_hash: &str) {
        self.0.insert(short(key_hash), ());
    }
}

/// The first 16 bytes of a hex hash (0 for anything else, which only means a shared entry).
fn short(key_hash: &str) -> u128 {
    key_hash
        .get(..32)
        .and_then(|hex| u128::from_str_radix(hex, 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_remembered_once_inserted_and_keys_are_told_apart() {
        let keys = RecentKeys::default();
        let a = protocol::fingerprint::sha256_hex(b"a");
        let b = protocol::fingerprint::sha256_hex(b"b");
        assert!(!keys.contains(&a));
        keys.insert(&a);
        assert!(keys.contains(&a));
        assert!(!keys.contains(&b));
    }

    #[test]
    fn the_memory_is_bounded() {
        let keys = RecentKeys::default();
        for i in 0..CAPACITY * 4 {
            keys.insert(&protocol::fingerprint::sha256_hex(&i.to_le_bytes()));
        }
        assert!(keys.0.len() <= CAPACITY + CAPACITY / 8, "{}", keys.0.len());
    }
}
