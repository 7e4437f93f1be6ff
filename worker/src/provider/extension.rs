//! The caller's per-provider extensions (`extensions.<key>.<field>`), for every adapter that
//! reads one: openai-responses and anthropic-messages (`request`), openai-chat (`request`
//! under `openai-chat`), fal-queue (`input`).
//!
//! The one decision a reader must know: an extension is the *base* of the provider body and
//! never more. [`admits`] refuses, at routing and before any credential read or I/O, a request
//! whose extension is not an object or would enable tools the deployment did not declare
//! [R 68]; the adapter then writes the fields it owns over a [`copy`] of it.

use protocol::ExecutionRequest;
use serde_json::{Map, Value};

/// `extensions.<key>` or its `<field>` exists but is not a JSON object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnObject;

/// `extensions.<key>.<field>`: `Ok(None)` when absent, an error when it (or
/// `extensions.<key>`) is present but not an object.
pub fn object<'a>(
    request: &'a ExecutionRequest,
    key: &str,
    field: &str,
) -> Result<Option<&'a Map<String, Value>>, NotAnObject> {
    let Some(extension) = request.extensions.as_ref().and_then(|e| e.get(key)) else {
        return Ok(None);
    };
    let Value::Object(extension) = extension else {
        return Err(NotAnObject);
    };
    match extension.get(field) {
        None => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object)),
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
        Ok(Some(fields)) => !forbidden.iter().any(|f| fields.contains_key(*f)),
    }
}

/// A copy of `extensions.<key>.<field>`, or an empty object (also when it is not an object:
/// routing refuses such requests before they reach an adapter).
pub fn copy(request: &ExecutionRequest, key: &str, field: &str) -> Map<String, Value> {
    object(request, key, field)
        .ok()
        .flatten()
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert_eq!(object(&with(json!({})), "anthropic", "request"), Ok(None));
        assert_eq!(
            object(&with(json!({"anthropic": {}})), "anthropic", "request"),
            Ok(None)
        );
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
            assert_eq!(
                object(&with(bad.clone()), "anthropic", "request"),
                Err(NotAnObject)
            );
            assert!(!admits(&with(bad.clone()), "anthropic", "request", &[]));
            assert_eq!(copy(&with(bad), "anthropic", "request"), Map::new());
        }
    }
}
