//! Request validation: bytes in, a checked [`ExecutionRequest`] or a fixed public error out.
//!
//! serde's and jsonschema's own messages echo caller content (unknown property names, instance
//! paths, values), so they are never passed through: every failure maps to one of the fixed
//! sentences of [`RequestError`].

use serde::Deserialize;
use serde_json::Value;

use crate::error::{ErrorCode, RuntimeError};
use crate::request::ExecutionRequest;

/// Default and reference limit for request bodies: 1 MiB.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Why a request was rejected. `Display` is the public message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{}", self.message())]
    InvalidJson,
    #[error("{}", self.message())]
    Schema,
    #[error("{}", self.message())]
    Unbounded,
}

impl RequestError {
    /// The fixed public message.
    pub fn message(self) -> &'static str {
        match self {
            RequestError::InvalidJson => "Request body must be valid JSON",
            RequestError::Schema => "Request does not match the execution schema",
            RequestError::Unbounded => "Request must be bounded JSON data",
        }
    }

    /// The portable error object for this rejection.
    pub fn to_runtime_error(self) -> RuntimeError {
        RuntimeError::new(ErrorCode::InvalidRequest, self.to_string(), false)
    }
}

/// Parses and checks a request body. Never panics; never echoes input in the error.
///
/// The body is first parsed into a JSON value (so duplicate keys keep the last value, as
/// `JSON.parse` does), then its shape is checked where serde is more lenient than JSON Schema
/// (serde fills structs from arrays and accepts enums as single-key objects), and only then
/// deserialized into the typed request.
pub fn parse_request(body: &[u8]) -> Result<ExecutionRequest, RequestError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| RequestError::InvalidJson)?;
    if !shape_ok(&value) {
        return Err(RequestError::Schema);
    }
    let request = ExecutionRequest::deserialize(value).map_err(|_| RequestError::Schema)?;
    request.check().map_err(|_| RequestError::Schema)?;
    Ok(request)
}

/// Objects where the schema wants objects, strings where it wants enum values.
fn shape_ok(root: &Value) -> bool {
    let Some(root) = root.as_object() else {
        return false;
    };
    let object_or_absent = |key: &str| root.get(key).is_none_or(Value::is_object);
    if !object_or_absent("requirements") || !object_or_absent("routing") {
        return false;
    }
    if let Some(input) = root.get("input").and_then(Value::as_array)
        && !input.iter().all(Value::is_object)
    {
        return false;
    }
    let strings = |v: Option<&Value>| match v {
        None => true,
        Some(Value::Array(items)) => items.iter().all(Value::is_string),
        Some(_) => true, // wrong type: serde rejects it
    };
    let requirements = root.get("requirements");
    let routing = root.get("routing");
    strings(requirements.and_then(|r| r.get("input_modalities")))
        && strings(requirements.and_then(|r| r.get("output_modalities")))
        && routing
            .and_then(|r| r.get("strategy"))
            .is_none_or(Value::is_string)
}

/// Checks an already-typed request (for embedders building requests in code): bounds plus the
/// serialized-size limit.
pub fn check_request(request: &ExecutionRequest) -> Result<(), RequestError> {
    request.check().map_err(|_| RequestError::Schema)?;
    let size = serde_json::to_vec(request)
        .map_err(|_| RequestError::Unbounded)?
        .len();
    if size > MAX_REQUEST_BYTES {
        return Err(RequestError::Unbounded);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(body: &str) -> bool {
        parse_request(body.as_bytes()).is_ok()
    }

    fn err(body: &str) -> Option<RequestError> {
        parse_request(body.as_bytes()).err()
    }

    const MIN: &str = r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"}]}"#;

    #[test]
    fn accepts_minimal_and_full_requests() {
        // One request a line (the minimal one and one with every field), shared with the spec
        // drift test (which checks the schema accepts them too).
        for case in include_str!("../tests/data/valid_requests.jsonl").lines() {
            assert!(ok(case), "{case}");
        }
        assert!(ok(
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"deadline_ms":5.0}"#
        ));
    }

    #[test]
    fn distinguishes_invalid_json_from_schema_errors() {
        assert_eq!(err("{"), Some(RequestError::InvalidJson));
        assert_eq!(err(""), Some(RequestError::InvalidJson));
        assert_eq!(
            err(r#"{"ability":5, nope"#),
            Some(RequestError::InvalidJson)
        );
        assert_eq!(err(r#"{"ability":"a"}"#), Some(RequestError::Schema));
        assert_eq!(err("[]"), Some(RequestError::Schema));
        assert_eq!(err(&format!("{MIN} x")), Some(RequestError::InvalidJson));
    }

    #[test]
    fn rejects_every_schema_violation() {
        // One request a line, shared with the spec drift test (which checks the schema refuses
        // them too).
        let cases = include_str!("../tests/data/schema_violations.jsonl").lines();
        for case in cases {
            assert_eq!(err(case), Some(RequestError::Schema), "{case}");
        }
        let long = "é".repeat(257);
        assert_eq!(
            err(&format!(
                r#"{{"ability":"{long}","input":[{{"type":"text","text":"x"}}]}}"#
            )),
            Some(RequestError::Schema)
        );
        let just_fits = "é".repeat(256);
        assert!(ok(&format!(
            r#"{{"ability":"{just_fits}","input":[{{"type":"text","text":"x"}}]}}"#
        )));
        let many: Vec<String> = (0..65).map(|i| format!(r#""k{i}":1"#)).collect();
        assert_eq!(
            err(&format!(
                r#"{{"ability":"a","input":[{{"type":"text","text":"x"}}],"metadata":{{{}}}}}"#,
                many.join(",")
            )),
            Some(RequestError::Schema)
        );
        let parts = vec![r#"{"type":"text","text":""}"#; 1025].join(",");
        assert_eq!(
            err(&format!(r#"{{"ability":"a","input":[{parts}]}}"#)),
            Some(RequestError::Schema)
        );
    }

    #[test]
    fn public_messages_never_echo_input() {
        let secret = "sk-CANARY-ability-text";
        let bodies = [
            format!(r#"{{"ability":"{secret}","input":[]}}"#),
            format!(r#"{{"ability":"a","input":[{{"type":"text","text":"x"}}],"{secret}":1}}"#),
            format!(
                r#"{{"ability":"a","input":[{{"type":"text","text":"x"}}],"metadata":{{"{secret}":{{}}}}}}"#
            ),
            format!(r#"{{"{secret}"#),
        ];
        for body in bodies {
            let e = parse_request(body.as_bytes())
                .err()
                .map(|e| e.to_runtime_error());
            let text = serde_json::to_string(&e).unwrap_or_default();
            assert!(!text.contains("CANARY"), "{text}");
            assert!(text.contains("invalid_request"));
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(&bytes);
        }

        #[test]
        fn arbitrary_json_never_panics(s in r#"\{("(ability|input|type|text|routing|metadata|deadline_ms)":(\[|\{|"[a-z]*"|-?[0-9]{1,12}(\.[0-9])?|null|true)[,\]\}]{0,2}){0,8}"#) {
            let _ = parse_request(s.as_bytes());
        }
    }
}
