//! Standard Webhooks signatures: the three headers of a delivery attempt.
//!
//! The one decision a reader must know: the signed content is exactly
//! `"{webhook-id}.{webhook-timestamp}.{body}"` with the body's bytes as sent, keyed by the
//! secret's *decoded* bytes (the base64 after `whsec_`), and the header holds one
//! `v1,<base64 signature>` per secret, space-separated, so a receiver in the middle of a
//! rotation accepts either. The timestamp is the attempt's, not the event's: receivers reject
//! stale timestamps to stop replays, so every retry is signed afresh (with the same id).

use base64::Engine as _;
use config::SigningSecret;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Header names of the specification.
pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// The value of `webhook-signature` for one attempt: `v1,<sig>` per secret, space-separated.
pub fn sign(secrets: &[SigningSecret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut header = String::new();
    for secret in secrets {
        if !header.is_empty() {
            header.push(' ');
        }
        header.push_str("v1,");
        header.push_str(&signature(secret, id, timestamp, body));
    }
    header
}

/// base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}")).
pub fn signature(secret: &SigningSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.expose()) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks specification (and of every reference library).
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1_614_265_330;
    const BODY: &str = r#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn signs_the_specification_test_vector() {
        let secret = SigningSecret::parse(SECRET).unwrap();
        assert_eq!(sign(&[secret], ID, TIMESTAMP, BODY.as_bytes()), EXPECTED);
    }

    #[test]
    fn one_signature_per_secret_and_any_change_changes_it() {
        let a = SigningSecret::parse(SECRET).unwrap();
        let b = SigningSecret::parse(&SigningSecret::encode(&[9u8; 32])).unwrap();
        let header = sign(&[a.clone(), b.clone()], ID, TIMESTAMP, BODY.as_bytes());
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], EXPECTED);
        assert_eq!(
            parts[1],
            format!("v1,{}", signature(&b, ID, TIMESTAMP, BODY.as_bytes()))
        );
        let original = signature(&a, ID, TIMESTAMP, BODY.as_bytes());
        assert_ne!(
            signature(&a, ID, TIMESTAMP, br#"{"test": 2432232315}"#),
            original
        );
        assert_ne!(signature(&a, ID, TIMESTAMP + 1, BODY.as_bytes()), original);
        assert_ne!(
            signature(&a, "msg_other", TIMESTAMP, BODY.as_bytes()),
            original
        );
    }

    /// The Rust receiver of docs/webhooks.md, verbatim: it must accept what we sign.
    fn verify(secret: &str, headers: impl Fn(&str) -> Option<String>, body: &[u8]) -> bool {
        use base64::engine::general_purpose::STANDARD;
        let (Some(id), Some(timestamp), Some(signatures)) = (
            headers("webhook-id"),
            headers("webhook-timestamp"),
            headers("webhook-signature"),
        ) else {
            return false;
        };
        let Some(key) = secret
            .strip_prefix("whsec_")
            .and_then(|s| STANDARD.decode(s).ok())
        else {
            return false;
        };
        signatures.split(' ').any(|entry| {
            let Some(signature) = entry
                .strip_prefix("v1,")
                .and_then(|s| STANDARD.decode(s).ok())
            else {
                return false;
            };
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
                return false;
            };
            mac.update(format!("{id}.{timestamp}.").as_bytes());
            mac.update(body);
            mac.verify_slice(&signature).is_ok() // constant-time comparison
        })
    }

    #[test]
    fn the_documented_rust_receiver_accepts_our_signatures_and_refuses_a_tampered_body() {
        let other = SigningSecret::encode(&[3u8; 32]);
        let secrets = [
            SigningSecret::parse(&other).unwrap(),
            SigningSecret::parse(SECRET).unwrap(),
        ];
        let header = sign(&secrets, ID, TIMESTAMP, BODY.as_bytes());
        let headers = |name: &str| match name {
            ID_HEADER => Some(ID.to_owned()),
            TIMESTAMP_HEADER => Some(TIMESTAMP.to_string()),
            SIGNATURE_HEADER => Some(header.clone()),
            _ => None,
        };
        assert!(verify(SECRET, headers, BODY.as_bytes()));
        assert!(verify(&other, headers, BODY.as_bytes()));
        assert!(!verify(SECRET, headers, br#"{"test": 2432232315}"#));
        let unknown = SigningSecret::encode(&[4u8; 32]);
        assert!(!verify(&unknown, headers, BODY.as_bytes()));
    }
}
