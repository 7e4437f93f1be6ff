//! Provider credentials, for every adapter that sends one (openai-responses, openai-chat,
//! anthropic-messages, fal-queue). They come only from the deployment's environment, by the
//! name the deployment file gives (`api_key_env`), and are read at execution time so a rotated
//! key takes effect without a restart.
//!
//! The one decision a reader must know: a credential never prints. [`Secret`]'s `Debug` and
//! `Display` are redacted, nothing in this crate serializes it, [`header`] marks the header
//! sensitive so no HTTP layer logs it, and [`scrub`] drops a provider code that echoes it.
//! Every failure to obtain or send it is the one [`unavailable`] error.

use std::fmt;

use protocol::{ErrorCode, RuntimeError};
use reqwest::header::HeaderValue;

/// `provider_unavailable` "Required provider credential is unavailable", not retryable
/// [R 78]: the credential is missing, empty, or not sendable as a header value (without saying
/// why, which could reveal part of it).
pub fn unavailable() -> RuntimeError {
    RuntimeError::new(
        ErrorCode::ProviderUnavailable,
        "Required provider credential is unavailable",
        false,
    )
}

/// A header value carrying the credential (`value` is the whole value, such as
/// `Bearer <key>`), marked sensitive.
pub fn header(value: &str) -> Result<HeaderValue, RuntimeError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| unavailable())?;
    header.set_sensitive(true);
    Ok(header)
}

/// `Authorization: Bearer <key>`, as OpenAI-compatible APIs take it.
pub fn bearer(key: &Secret) -> Result<HeaderValue, RuntimeError> {
    header(&format!("Bearer {}", key.expose()))
}

/// Drops a provider code that contains the credential. Provider codes are short tokens taken
/// from provider payloads; a provider echoing the key there must not carry it into an event.
pub fn scrub(mut error: RuntimeError, key: &Secret) -> RuntimeError {
    if error
        .provider_code
        .as_deref()
        .is_some_and(|code| code.contains(key.expose()))
    {
        error.provider_code = None;
    }
    error
}

/// A credential value. Use [`Secret::expose`] only to build the request header.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Reads the credential named `env_name`; a missing or empty value is
    /// `provider_unavailable` "Required provider credential is unavailable" [R 78].
    pub fn from_env(env_name: &str) -> Result<Self, RuntimeError> {
        match std::env::var(env_name) {
            Ok(value) if !value.is_empty() => Ok(Self(value)),
            _ => Err(unavailable()),
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
            KeySource::Fixed(_) => Err(unavailable()),
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
