//! `Idempotency-Key` values.
//!
//! A key makes a submission safe to repeat: the same key with the same request returns the
//! execution it created first (200, `idempotent_replay: true`) instead of a second one. That is
//! also what lets the client retry a submission by itself after a transport failure, when it
//! cannot know whether the first attempt reached the gateway.

use std::fmt;
use std::str::FromStr;

use crate::error::ClientError;

/// Longest key, in characters (all ASCII, so bytes).
pub const MAX_KEY_LEN: usize = protocol::idempotency::MAX_KEY_LEN;

/// A valid key: 1 to 256 visible ASCII characters (contract.md section 3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Checks `key`.
    pub fn new(key: impl Into<String>) -> Result<Self, ClientError> {
        let key = key.into();
        if !protocol::idempotency::is_valid_key(key.as_bytes()) {
            return Err(ClientError::InvalidIdempotencyKey);
        }
        Ok(Self(key))
    }

    /// A fresh random key (a UUID v4): unique per logical submission.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().hyphenated().to_string())
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for IdempotencyKey {
    type Err = ClientError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_characters() {
        assert!(IdempotencyKey::new("a").is_ok());
        assert!(IdempotencyKey::new("k".repeat(256)).is_ok());
        assert!(IdempotencyKey::new("k".repeat(257)).is_err());
        assert!(IdempotencyKey::new("").is_err());
        assert!(IdempotencyKey::new("has space").is_err());
        assert!(IdempotencyKey::new("tab\t").is_err());
        assert!(IdempotencyKey::new("é").is_err());
        let generated = IdempotencyKey::generate();
        assert_eq!(generated.as_str().len(), 36);
        assert_ne!(generated, IdempotencyKey::generate());
    }
}
