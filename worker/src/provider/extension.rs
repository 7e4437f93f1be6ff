//! The caller's per-provider extensions (`extensions.<key>.<field>`), for every adapter that
//! reads one: openai-responses and anthropic-messages (`request`), openai-chat (`request`
//! under `openai-chat`), fal-queue (`input`).
//!
//! The one decision a reader must know: an extension is the *base* of the provider body and
//! never more. [`admits`] (the policy, `providers::extension`, which the gateway checks at
//! submit too) refuses, at routing and before any credential read or I/O, a request whose
//! extension is not an object or would enable tools the deployment did not declare [R 68];
//! the adapter then writes the fields it owns over a copy of it ([`body_over`]).

use protocol::ExecutionRequest;
use protocol::json;

pub use protocol::json::NotAnObject;
pub use providers::extension::{admits, object};

/// A provider body: `extensions.<key>.<field>` (nothing when absent or not an object: routing
/// refuses such requests before they reach an adapter) without the members named in `drop`,
/// with `owned` (key, JSON text) written over it; compact, keys sorted, as a JSON map copy
/// printed would be. Written from the caller's text, never through a JSON tree.
pub fn body_over(
    request: &ExecutionRequest,
    key: &str,
    field: &str,
    drop: &[&str],
    owned: &[(&str, &str)],
) -> Result<String, protocol::RuntimeError> {
    let base = object(request, key, field).ok().flatten();
    json::object_with(base, drop, owned).map_err(|_| protocol::RuntimeError::internal())
}

/// `value` as JSON text for a body field.
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, protocol::RuntimeError> {
    serde_json::to_string(value).map_err(|_| protocol::RuntimeError::internal())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Routing refuses such requests (`providers::extension`, whose tests pin the policy);
    /// the body is still well formed if one gets here.
    #[test]
    fn a_body_never_starts_from_an_extension_that_is_not_an_object() {
        for bad in ["1", r#"{"request":[]}"#, r#"{"request":"x"}"#] {
            let text = format!(
                r#"{{"ability":"a","input":[{{"type":"text","text":"x"}}],"extensions":{{"anthropic":{bad}}}}}"#
            );
            let request: ExecutionRequest = serde_json::from_str(&text).unwrap();
            let body = body_over(&request, "anthropic", "request", &[], &[("a", "1")]).unwrap();
            assert_eq!(body, r#"{"a":1}"#, "{bad}");
        }
    }
}
