//! [`Tenant`]: who an execution belongs to (contract.md section 7).
//!
//! Every request acts for one tenant: the tenant of its API key, or [`Tenant::DEFAULT`] when the
//! deployment has no `auth` section. Executions and idempotency keys are scoped by it. The name
//! is restricted to a small, log- and header-safe alphabet so it can travel in a NATS message
//! header and appear in logs without escaping.

use std::fmt;
use std::sync::Arc;

/// Longest tenant name (and API key id), in characters.
pub const MAX_TENANT_CHARS: usize = 64;

/// A validated tenant name: 1 to [`MAX_TENANT_CHARS`] ASCII letters, digits, `-`, `_` or `.`.
/// Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<str>);

impl Tenant {
    /// The name of the tenant of anonymous requests (no `auth` section) and of logs stored
    /// before executions had owners.
    pub const DEFAULT_NAME: &'static str = "default";

    /// The tenant of anonymous requests.
    pub fn default_tenant() -> Self {
        Self(Arc::from(Self::DEFAULT_NAME))
    }

    /// Whether this is [`Tenant::DEFAULT_NAME`].
    pub fn is_default(&self) -> bool {
        &*self.0 == Self::DEFAULT_NAME
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Tenant {
    fn default() -> Self {
        Self::default_tenant()
    }
}

/// Whether `name` is a valid tenant name (also the rule for API key ids).
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_TENANT_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

parse_error! {
    /// A string that is not a valid tenant name; it never echoes the input.
    InvalidTenant = "a tenant name must be 1 to 64 ASCII letters, digits, '-', '_' or '.'";
    Tenant => Tenant::parse
}

impl Tenant {
    /// Validates a tenant name (also [`FromStr`](std::str::FromStr)).
    fn parse(s: &str) -> Result<Self, InvalidTenant> {
        if is_valid_name(s) {
            Ok(Self(Arc::from(s)))
        } else {
            Err(InvalidTenant)
        }
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Written as its name.
impl serde::Serialize for Tenant {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Read from its name, which must be valid (the error never echoes the input).
impl<'de> serde::Deserialize<'de> for Tenant {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::parsed::deserialize(deserializer, "a tenant name", Self::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_restricted_to_a_header_safe_alphabet() {
        for good in ["default", "acme", "a", "Team_1.prod-eu", &"x".repeat(64)] {
            assert_eq!(
                good.parse::<Tenant>().map(|t| t.to_string()),
                Ok(good.to_owned())
            );
        }
        for bad in [
            "",
            "has space",
            "a/b",
            "caf\u{e9}",
            "a\nb",
            "a:b",
            &"x".repeat(65),
        ] {
            assert_eq!(bad.parse::<Tenant>(), Err(InvalidTenant), "{bad:?}");
        }
        assert!(Tenant::default().is_default());
        assert!(!"acme".parse::<Tenant>().is_ok_and(|t| t.is_default()));
    }

    #[test]
    fn a_tenant_travels_as_its_name_and_an_invalid_name_is_refused() {
        let acme: Tenant = "acme".parse().unwrap();
        assert_eq!(serde_json::to_string(&acme).unwrap(), "\"acme\"");
        assert_eq!(serde_json::from_str::<Tenant>("\"acme\"").unwrap(), acme);
        let refused = serde_json::from_str::<Tenant>("\"a b\"").unwrap_err();
        assert!(!refused.to_string().contains("a b"), "{refused}");
    }
}
