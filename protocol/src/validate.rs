//! Request validation: bytes in, a checked [`ExecutionRequest`] or a fixed public error out.
//!
//! serde's and jsonschema's own messages echo caller content (unknown property names, instance
//! paths, values), so they are never passed through: every failure maps to one of the fixed
//! sentences of [`RequestError`].

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{ErrorCode, RuntimeError};
use crate::request::ExecutionRequest;
use crate::strict::Strict;

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
/// Read as the reference reads it (`JSON.parse`, then the schema), without a JSON tree: first
/// the whole body is checked to be JSON (syntax, numbers, escapes, nesting below
/// [`crate::json::MAX_DEPTH`]: "must be valid JSON"; a lone surrogate escape, which
/// `JSON.parse` keeps, is read as U+FFFD: [`crate::json::replace_lone_surrogates`]), then the
/// typed request is read in place by [`Strict`] (a repeated key keeps its last value; objects,
/// arrays and enum strings only where the schema wants them), keeping caller-defined JSON as
/// raw text. Memory: the request itself (about the body's size), a copy of the body only when
/// it holds a lone surrogate, and, while reading, at most 64 borrowed members per open object.
pub fn parse_request(body: &[u8]) -> Result<ExecutionRequest, RequestError> {
    // A string `JSON.parse` keeps but a Rust string cannot hold is read with U+FFFD.
    let body = crate::json::replace_lone_surrogates(body);
    crate::json::check_syntax(&body).map_err(|_| RequestError::InvalidJson)?;
    let root: &RawValue = serde_json::from_slice(&body).map_err(|_| RequestError::InvalidJson)?;
    let request = ExecutionRequest::deserialize(Strict(root)).map_err(|_| RequestError::Schema)?;
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

    #[test]
    fn a_repeated_key_keeps_its_last_value_at_every_level() {
        let request = parse_request(
            br#"{"ability":5,"ability":"b","input":[{"type":"text","text":5,"text":"x","type":"text"}],
                "routing":{"max_attempts":0,"max_attempts":2},"metadata":{"k":{},"k":1},
                "extensions":{"e":1,"e":{ "kept" : [1, 1] }}}"#,
        )
        .unwrap();
        assert_eq!(request.ability, "b");
        assert_eq!(
            request.input,
            vec![crate::request::InputPart::Text { text: "x".into() }]
        );
        assert_eq!(request.routing.and_then(|r| r.max_attempts), Some(2));
        let extensions = request.extensions.unwrap_or_default();
        // Caller-defined JSON is kept exactly as sent.
        assert_eq!(extensions["e"].get(), r#"{ "kept" : [1, 1] }"#);
        // 65 members, one of them repeated: 64 properties.
        let members: Vec<String> = (0..65).map(|i| format!(r#""k{}":1"#, i % 64)).collect();
        assert!(ok(&format!(
            r#"{{"ability":"a","input":[{{"type":"text","text":"x"}}],"extensions":{{{}}}}}"#,
            members.join(",")
        )));
    }

    #[test]
    fn json_verdicts_are_serde_json_verdicts() {
        // Nesting (serde_json's recursion limit), numbers out of range, bad escapes, trailing
        // text: the body is "not JSON" exactly when a `Value` parse refuses it, wherever it is.
        let part = |value: &str| {
            format!(r#"{{"ability":"a","input":[{{"type":"json","value":{value}}}],"x":1}}"#)
        };
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let mut bodies = vec![
            part(&deep(120)),
            part(&deep(124)),
            part(&deep(125)),
            part(&deep(200)),
            part("1e400"),
            part(r#""\x""#),
            part(r#""\u12""#),
            part("[1,]"),
            format!("{} x", part("1")),
        ];
        bodies.push(format!(
            r#"{{"ability":"a","input":[{{"type":"text","text":"x"}}],"extensions":{{"a":{}}}}}"#,
            deep(125)
        ));
        for body in bodies {
            let value_ok = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            let verdict = err(&body);
            assert_eq!(
                verdict != Some(RequestError::InvalidJson),
                value_ok,
                "{verdict:?} for {}",
                &body[..body.len().min(80)]
            );
        }
        assert_eq!(err(&part(&deep(200))), Some(RequestError::InvalidJson));
    }

    #[test]
    fn a_lone_surrogate_escape_is_read_as_a_replacement_character() {
        // `JSON.parse` accepts it (a string cut in the middle of an emoji); serde_json does not.
        let request = parse_request(
            br#"{"ability":"a","input":[{"type":"text","text":"cut \ud83d"}],"metadata":{"k":"\udc00"}}"#,
        )
        .unwrap();
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["input"][0]["text"], "cut \u{fffd}");
        assert_eq!(json["metadata"]["k"], "\u{fffd}");
        assert!(ok(
            r#"{"ability":"a","input":[{"type":"json","value":{"\ud800":"\ud83d\ude00"}}]}"#
        ));
    }

    #[test]
    fn structs_come_from_objects_and_enums_from_strings_only() {
        for body in [
            r#"{"ability":"a","input":[["text","x"]]}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":[null,null]}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"routing":{"strategy":{"ordered":null}}}"#,
            r#"{"ability":"a","input":[{"type":{"text":null},"text":"x"}]}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"requirements":{"input_modalities":[{"text":null}]}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x"}],"metadata":{"a":[1]}}"#,
            r#"{"ability":"a","input":[{"type":"text","text":"x","value":1}]}"#,
            r#"{"ability":"a","input":[{"type":"json"}]}"#,
            r#"{"ability":"a","input":[{"type":"image","uri":"u","media_type":null}]}"#,
        ] {
            assert_eq!(err(body), Some(RequestError::Schema), "{body}");
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
