//! Provider credentials. They come only from the deployment's environment, by the name the
//! deployment file gives (`api_key_env`), and are read at execution time so a rotated key takes
//! effect without a restart. `Secret` never prints its value: `Debug` and `Display` are
//! redacted, and nothing in this crate serializes it.

use std::fmt;

use protocol::{ErrorCode, RuntimeError};

/// A credential value. Use [`Secret::expose`] only to build the request header.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Reads the credential named `env_name`; a missing or empty value is
    /// `provider_unavailable` "Required provider credential is unavailable" [R 78].
    pub fn from_env(env_name: &str) -> Result<Self, RuntimeError> {
        match std::env::var(env_name) {
            Ok(value) if !value.is_empty() => Ok(Self(value)),
            _ => Err(RuntimeError::new(
                ErrorCode::ProviderUnavailable,
                "Required provider credential is unavailable",
                false,
            )),
        }
    }

    /// Wraps a value (tests, or credentials from another source of deployment config).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The raw value.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Where an adapter gets its credential at execution time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The environment variable named by the deployment's `api_key_env`, read at every
    /// attempt so a rotated key takes effect without a restart.
    Env(String),
    /// A fixed value (tests, or a credential obtained elsewhere).
    Fixed(Secret),
}

impl KeySource {
    /// The credential; missing or empty is `provider_unavailable` "Required provider credential
    /// is unavailable" [R 78].
    pub fn resolve(&self) -> Result<Secret, RuntimeError> {
        match self {
            KeySource::Env(name) => Secret::from_env(name),
            KeySource::Fixed(secret) if !secret.expose().is_empty() => Ok(secret.clone()),
            KeySource::Fixed(_) => Secret::from_env(""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_its_value() {
        let s = Secret::new("sk-CANARY-123");
        assert!(!format!("{s:?} {s}").contains("CANARY"));
        assert_eq!(s.expose(), "sk-CANARY-123");
    }

    #[test]
    fn a_missing_variable_is_provider_unavailable() {
        let e = Secret::from_env("MRT_TEST_SURELY_UNSET_VARIABLE").unwrap_err();
        assert_eq!(e.code, ErrorCode::ProviderUnavailable);
        assert_eq!(e.message, "Required provider credential is unavailable");
    }
}
