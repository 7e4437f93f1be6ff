//! Request validation: bytes in, a checked [`ExecutionRequest`] or a fixed public error out.
//!
//! serde's and jsonschema's own messages echo caller content (unknown property names, instance
//! paths, values), so they are never passed through: every failure maps to one of the fixed
//! sentences of [`RequestError`].

use serde::Deserialize;

use crate::error::{ErrorCode, RuntimeError};
use crate::request::ExecutionRequest;

/// Default and reference limit for request bodies: 1 MiB.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Why a request was rejected. `Display` is the public message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("Request body must be valid JSON")]
    InvalidJson,
    #[error("Request does not match the execution schema")]
    Schema,
    #[error("Request must be bounded JSON data")]
    Unbounded,
}

impl RequestError {
    /// The portable error object for this rejection.
    pub fn to_runtime_error(self) -> RuntimeError {
        RuntimeError::new(ErrorCode::InvalidRequest, self.to_string(), false)
    }
}

/// Parses and checks a request body. Never panics; never echoes input in the error.
pub fn parse_request(body: &[u8]) -> Result<ExecutionRequest, RequestError> {
    let request = match serde_json::from_slice::<ExecutionRequest>(body) {
        Ok(request) => request,
        Err(e) if e.is_data() => {
            // serde stops at the first problem. A type error early in a document whose tail is
            // not JSON at all must still be reported as invalid JSON, as the reference does.
            let mut de = serde_json::Deserializer::from_slice(body);
            return match serde::de::IgnoredAny::deserialize(&mut de).and_then(|_| de.end()) {
                Ok(()) => Err(RequestError::Schema),
                Err(_) => Err(RequestError::InvalidJson),
            };
        }
        Err(_) => return Err(RequestError::InvalidJson),
    };
    request.check().map_err(|_| RequestError::Schema)?;
    Ok(request)
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
        assert!(ok(MIN));
        assert!(ok(
            r#"{"ability":"a","input":[{"type":"text","text":""},{"type":"json","value":null},
            {"type":"image","uri":"https://x/a.png","media_type":"image/png"},{"type":"audio","uri":"a"},
            {"type":"video","uri":"v"},{"type":"file","uri":"f"}],
            "requirements":{"input_modalities":["text","json"],"output_modalities":["text"],"stream":true,"tools":false,"structured_output":false,"async":false,"cancel":true},
            "routing":{"strategy":"ordered","provider_order":["a","b"],"allow_fallback":true,"max_attempts":32,"retry_budget_ms":86400000},
            "deadline_ms":1,"metadata":{"k":"v","n":1.5,"b":true},"extensions":{"openai":{"request":{}}}}"#
        ));
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
        let cases = [
            r#"{"ability":"","input":[{"type":"text","text":"x"}]}"#,
            r#"{"ability":"a","input":[]}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x","extra":1}]}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"extra":1}"#,
            r#"{"ability":"a","input":[{"type":"json"}]}"#,
            r#"{"ability":"a","input":[{"type":"image","uri":""}]}"#,
            r#"{"ability":"a","input":[{"type":"pdf","uri":"x"}]}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"deadline_ms":0}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"deadline_ms":86400001}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"deadline_ms":1.5}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"deadline_ms":null}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"max_attempts":33}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"max_attempts":0}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"strategy":"random"}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"provider_order":["a","a"]}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"provider_order":[""]}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"extra":true}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"requirements":{"input_modalities":["text","text"]}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"requirements":{"stream":"yes"}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"metadata":{"k":{"nested":1}}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"metadata":{"k":null}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"extensions":[]}"#,
        ];
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
