//! `mrt keygen`: a new API key and the `auth.keys` entry that admits it (contract.md
//! section 7). The deployment file holds only the entry, which carries the key's SHA-256.
//!
//! A key is `mrt_` followed by 64 hex digits: 256 bits from the operating system's random
//! number generator. The prefix makes a leaked key easy to recognize (and to scan for).

use rand::TryRngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Prefix of every generated key.
pub const KEY_PREFIX: &str = "mrt_";
/// The scopes a key may have, in file order.
pub const SCOPES: [&str; 3] = ["submit", "read", "cancel"];

/// A generated key with its deployment-file entry. `Debug` never shows the key.
#[derive(Clone, Serialize)]
pub struct GeneratedKey {
    /// Shown once; only its hash is stored.
    pub key: String,
    pub entry: KeyEntry,
}

impl std::fmt::Debug for GeneratedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedKey")
            .field("entry", &self.entry.id)
            .finish_non_exhaustive()
    }
}

/// One element of the deployment file's `auth.keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyEntry {
    pub id: String,
    pub tenant: String,
    /// Lowercase hex SHA-256 of the key.
    pub sha256: String,
    pub scopes: Vec<String>,
}

/// Why no key was generated. Messages name the rule, never the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeygenError {
    #[error("--tenant must be 1 to 64 ASCII letters, digits, '-', '_' or '.'")]
    InvalidTenant,
    #[error("--id must be 1 to 64 ASCII letters, digits, '-', '_' or '.'")]
    InvalidId,
    #[error("--scopes must be a comma-separated list of submit, read, cancel without repeats")]
    InvalidScopes,
    #[error("the operating system's random number generator failed")]
    Random,
}

/// The SHA-256 of `key` as the deployment file spells it (64 lowercase hex digits).
pub fn key_hash(key: &str) -> String {
    hex_string(&Sha256::digest(key.as_bytes()))
}

/// A fresh key for `tenant` named `id` with `scopes` (a comma-separated list; `None`: all).
pub fn generate(tenant: &str, id: &str, scopes: Option<&str>) -> Result<GeneratedKey, KeygenError> {
    use protocol::tenant::is_valid_name;
    if !is_valid_name(tenant) {
        return Err(KeygenError::InvalidTenant);
    }
    if !is_valid_name(id) {
        return Err(KeygenError::InvalidId);
    }
    let scopes = parse_scopes(scopes)?;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|_| KeygenError::Random)?;
    let key = format!("{KEY_PREFIX}{}", hex_string(&bytes));
    Ok(GeneratedKey {
        entry: KeyEntry {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            sha256: key_hash(&key),
            scopes,
        },
        key,
    })
}

fn parse_scopes(list: Option<&str>) -> Result<Vec<String>, KeygenError> {
    let Some(list) = list else {
        return Ok(SCOPES.iter().map(|s| (*s).to_owned()).collect());
    };
    let mut out: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !SCOPES.contains(&name) || out.iter().any(|s| s == name) {
            return Err(KeygenError::InvalidScopes);
        }
        out.push(name.to_owned());
    }
    // File order, whatever order they were given in.
    out.sort_by_key(|s| SCOPES.iter().position(|n| n == s));
    Ok(out)
}

fn hex_string(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_hashed() {
        let a = generate("acme", "acme-ci", None).unwrap();
        let b = generate("acme", "acme-ci", None).unwrap();
        assert_ne!(a.key, b.key);
        assert!(a.key.starts_with(KEY_PREFIX) && a.key.len() == KEY_PREFIX.len() + 64);
        assert_eq!(a.entry.sha256, key_hash(&a.key));
        assert_eq!(a.entry.sha256.len(), 64);
        assert_eq!(a.entry.scopes, ["submit", "read", "cancel"]);
        assert!(!format!("{a:?}").contains(&a.key[4..]));
        // Known vector: sha256("abc").
        assert_eq!(
            key_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn arguments_are_checked() {
        assert_eq!(
            generate("acme", "k", Some("cancel, read"))
                .unwrap()
                .entry
                .scopes,
            ["read", "cancel"]
        );
        assert_eq!(
            generate("acme", "k", Some("")).unwrap().entry.scopes,
            Vec::<String>::new()
        );
        assert_eq!(
            generate("a b", "k", None).unwrap_err(),
            KeygenError::InvalidTenant
        );
        assert_eq!(
            generate("acme", "", None).unwrap_err(),
            KeygenError::InvalidId
        );
        for bad in ["admin", "read,read", "submit;read"] {
            assert_eq!(
                generate("acme", "k", Some(bad)).unwrap_err(),
                KeygenError::InvalidScopes
            );
        }
    }
}
