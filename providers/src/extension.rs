//! The caller's per-provider extensions (`extensions.<key>.<field>`) as the request policy
//! sees them: openai-responses and anthropic-messages (`request`), openai-chat (`request`
//! under `openai-chat`), fal-queue (`input`).
//!
//! The one decision a reader must know: an extension is the *base* of the provider body and
//! never more. [`admits`] refuses, at submit and at routing, before any credential read or
//! I/O, a request whose extension is not an object or would enable tools the deployment did
//! not declare [R 68]; the worker's adapters then write the fields they own over a copy of it
//! (`worker::provider::extension`).

use protocol::ExecutionRequest;
use protocol::json::{self, RawValue};

pub use protocol::json::NotAnObject;

/// `extensions.<key>.<field>`: `Ok(None)` when absent, an error when it (or
/// `extensions.<key>`) is present but not an object. Read in place from the caller's text:
/// nothing but `<key>`'s members is looked at, and nothing is built.
pub fn object<'a>(
    request: &'a ExecutionRequest,
    key: &str,
    field: &str,
) -> Result<Option<&'a RawValue>, NotAnObject> {
    let Some(extension) = request.extensions.as_ref().and_then(|e| e.get(key)) else {
        return Ok(None);
    };
    match json::member(extension.as_raw(), field)? {
        None => Ok(None),
        Some(object) if json::is_object(object) => Ok(Some(object)),
        Some(_) => Err(NotAnObject),
    }
}

/// The extension policy: `extensions.<key>` and its `<field>`, when present, must be objects,
/// and that object must contain none of `forbidden` (whatever their value, `null` included).
/// Text adapters pass their tool fields as `forbidden` unless the deployment enabled tools.
pub fn admits(request: &ExecutionRequest, key: &str, field: &str, forbidden: &[&str]) -> bool {
    match object(request, key, field) {
        Err(NotAnObject) => false,
        Ok(None) => true,
        Ok(Some(fields)) => !forbidden
            .iter()
            .any(|f| matches!(json::member(fields, f), Ok(Some(_)))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn request(value: Value) -> ExecutionRequest {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn extension_shape_is_checked() {
        let with = |ext: Value| {
            request(
                json!({"ability": "a", "input": [{"type": "text", "text": "x"}], "extensions": ext}),
            )
        };
        assert!(matches!(
            object(&with(json!({})), "anthropic", "request"),
            Ok(None)
        ));
        assert!(matches!(
            object(&with(json!({"anthropic": {}})), "anthropic", "request"),
            Ok(None)
        ));
        assert!(
            object(
                &with(json!({"anthropic": {"request": {"a": 1}}})),
                "anthropic",
                "request"
            )
            .unwrap()
            .is_some()
        );
        for bad in [
            json!({"anthropic": 1}),
            json!({"anthropic": {"request": []}}),
            json!({"anthropic": {"request": "x"}}),
        ] {
            assert!(matches!(
                object(&with(bad.clone()), "anthropic", "request"),
                Err(NotAnObject)
            ));
            assert!(!admits(&with(bad), "anthropic", "request", &[]));
        }
    }
}
