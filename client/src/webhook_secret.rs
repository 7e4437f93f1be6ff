//! `mrt webhook-secret`: a new webhook signing secret (contract.md section 11), printed for an
//! environment variable that an endpoint's `secret_env` names.
//!
//! The one decision a reader must know: the format is Standard Webhooks' — `whsec_` and the
//! standard base64 of 32 random bytes from the operating system — so the receiver's library
//! (`standardwebhooks` in Python, JavaScript, Go, Rust…) takes it as is.

use base64::Engine as _;
use rand::TryRngCore;

/// Bytes of randomness in a new secret (Standard Webhooks allows 24 to 64).
pub const SECRET_BYTES: usize = 32;

/// The operating system's random source failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot read random bytes from the operating system")]
pub struct RandomUnavailable;

/// A fresh secret: `whsec_` + base64 of [`SECRET_BYTES`] random bytes.
pub fn generate() -> Result<String, RandomUnavailable> {
    let mut bytes = [0u8; SECRET_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|_| RandomUnavailable)?;
    Ok(format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_whsec_base64_of_32_fresh_bytes() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        let encoded = a.strip_prefix("whsec_").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(bytes.len(), SECRET_BYTES);
    }
}
