//! Canonical JSON and request fingerprints for idempotency.
//!
//! Two requests are "the same" when their canonical JSON is equal: object keys sorted by code
//! point, no insignificant whitespace, and integral numbers written without a fraction (JSON
//! numbers `5` and `5.0` are the same number). Only the sha256 of that text is ever stored, so
//! the form never changes (`tests/fingerprint_pin.rs` pins digests). [`canonical_json`] writes
//! it for a `Value`; [`request_fingerprint`] streams it from text ([`crate::json`]).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::request::ExecutionRequest;

/// Writes `value` as canonical JSON.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                out.push_str(&(f as i64).to_string());
            }
            _ => out.push_str(&n.to_string()),
        },
        other => out.push_str(&other.to_string()),
    }
}

/// sha256 (hex) of the request's canonical JSON, streamed from its serialized text (no JSON
/// tree): the same digest as `canonical_json(&serde_json::to_value(request))`.
pub fn request_fingerprint(request: &ExecutionRequest) -> String {
    let mut hasher = Sha256::new();
    // A request always serializes (its raw parts are valid JSON); should it ever fail, every
    // such request shares the fingerprint of `null`, as before.
    let written = serde_json::to_string(request).map(|text| {
        crate::json::write_canonical(&text, &mut |piece| hasher.update(piece.as_bytes()))
    });
    if !matches!(written, Ok(Ok(()))) {
        return sha256_hex(b"null");
    }
    hex::encode(hasher.finalize())
}

/// sha256 of arbitrary bytes, hex encoded (used for idempotency keys: never stored raw).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::parse_request;

    #[test]
    fn key_order_and_number_form_do_not_matter() {
        let a = parse_request(br#"{"ability":"a","input":[{"type":"json","value":{"x":1,"y":2.0}}],"metadata":{"b":1,"a":2}}"#);
        let b = parse_request(br#"{"metadata":{"a":2,"b":1.0},"input":[{"value":{"y":2,"x":1},"type":"json"}],"ability":"a"}"#);
        let (Ok(a), Ok(b)) = (a, b) else {
            panic!("both parse")
        };
        assert_eq!(request_fingerprint(&a), request_fingerprint(&b));
    }

    #[test]
    fn different_requests_differ() {
        let a = parse_request(br#"{"ability":"a","input":[{"type":"text","text":"x"}]}"#);
        let b = parse_request(br#"{"ability":"a","input":[{"type":"text","text":"y"}]}"#);
        let (Ok(a), Ok(b)) = (a, b) else {
            panic!("both parse")
        };
        assert_ne!(request_fingerprint(&a), request_fingerprint(&b));
    }

    #[test]
    fn canonical_form_is_sorted_and_compact() {
        let v: Value = serde_json::from_str(r#"{"b":[1,2.5,{"d":null,"c":"\u0001"}],"a":true}"#)
            .unwrap_or_default();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":true,"b":[1,2.5,{"c":"\u0001","d":null}]}"#
        );
    }
}
