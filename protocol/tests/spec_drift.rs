//! The generated spec documents in `spec/` must match the types, and the request schema must
//! agree with the request validator.
//!
//! - `spec_files_are_up_to_date` regenerates `spec/` and fails (after writing the new files)
//!   when anything changed: run the tests once, review, commit. CI also runs
//!   `git diff --exit-code spec/`.
//! - The request schema, compiled with the `jsonschema` crate (draft 2020-12), accepts a
//!   document exactly when `protocol::validate::parse_request` does: on a fixed corpus and on
//!   randomly generated structured requests near every bound.
//! - Every event the types can produce validates against the event schema, and only with the
//!   statuses [R 44] allows.

// Test helpers outside `#[test]` functions panic on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::LazyLock;

use jsonschema::Validator;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use protocol::error::{ErrorCode, ErrorResponse, RuntimeError};
use protocol::event::{
    EventBody, ExecutionStatus, OutputArtifact, ProgressPhase, RuntimeEvent, Target,
};
use protocol::id::{ExecutionId, Sequence};
use protocol::manifest::{ModelCapability, ProviderLimits, ProviderList, ProviderManifest};
use protocol::schema::{
    execution_request_schema, openapi_document, render_json, runtime_event_schema, spec_files,
};
use protocol::snapshot::{
    CancelResponse, CancelStatus, ExecutionResultResponse, ExecutionSnapshot, ExecutionSubmission,
    ResultNotReady, RuntimeInfo, RuntimeState,
};
use protocol::time::Timestamp;
use protocol::usage::{UsageFact, UsageSource, UsageUnit};
use protocol::validate::{RequestError, parse_request};
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------------
// Drift
// ---------------------------------------------------------------------------------------------

#[test]
fn spec_files_are_up_to_date() {
    let spec_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../spec");
    let mut regenerated = Vec::new();
    for (relative, content) in spec_files() {
        let path = spec_dir.join(relative);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(content.as_str()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        std::fs::write(&path, &content)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        regenerated.push(relative);
    }
    assert!(
        regenerated.is_empty(),
        "spec/ did not match the protocol types and was regenerated: {regenerated:?}. \
         Review the changes and commit them (CI runs `git diff --exit-code spec/`)."
    );
}

#[test]
fn spec_documents_are_deterministic() {
    assert_eq!(spec_files(), spec_files());
    let request = execution_request_schema();
    assert_eq!(
        request["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(
        request["$id"],
        "https://model-runtime.dev/schema/execution-request.json"
    );
    assert_eq!(
        runtime_event_schema()["$id"],
        "https://model-runtime.dev/schema/runtime-event.json"
    );
    assert_eq!(openapi_document()["openapi"], "3.1.0");
}

#[test]
fn generated_schemas_are_valid_draft_2020_12() {
    for schema in [execution_request_schema(), runtime_event_schema()] {
        if let Err(e) = jsonschema::draft202012::meta::validate(&schema) {
            panic!("{e}: {}", render_json(&schema));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Request schema ⇔ parse_request
// ---------------------------------------------------------------------------------------------

static REQUEST_VALIDATOR: LazyLock<Validator> = LazyLock::new(|| {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&execution_request_schema())
        .unwrap_or_else(|e| panic!("request schema does not compile: {e}"))
});

/// `(schema accepts, parse_request accepts)`; `None` when the body is not JSON at all (then the
/// validator must say so).
fn verdicts(body: &[u8]) -> Option<(bool, bool)> {
    let parsed = parse_request(body);
    // `JSON.parse` keeps a lone surrogate in its string; the schema sees it as U+FFFD, as
    // `parse_request` reads it.
    let body = protocol::json::replace_lone_surrogates(body);
    match serde_json::from_slice::<Value>(&body) {
        Ok(value) => Some((REQUEST_VALIDATOR.is_valid(&value), parsed.is_ok())),
        Err(_) => {
            assert_eq!(
                parsed.err(),
                Some(RequestError::InvalidJson),
                "not JSON: {}",
                String::from_utf8_lossy(&body)
            );
            None
        }
    }
}

fn shorten(body: &str) -> String {
    if body.len() > 300 {
        format!(
            "{}… ({} bytes)",
            &body[..body.floor_char_boundary(300)],
            body.len()
        )
    } else {
        body.to_owned()
    }
}

fn assert_case(expected_valid: bool, body: &str) {
    let Some((schema, parser)) = verdicts(body.as_bytes()) else {
        panic!("case is not JSON: {}", shorten(body));
    };
    assert_eq!(
        (schema, parser),
        (expected_valid, expected_valid),
        "(schema, parse_request) disagree with the expectation for {}",
        shorten(body)
    );
}

const PART: &str = r#"{"type":"text","text":"x"}"#;

/// A request with the minimal required fields plus `extra` (a JSON object fragment).
fn with(extra: &str) -> String {
    if extra.is_empty() {
        format!(r#"{{"ability":"a","input":[{PART}]}}"#)
    } else {
        format!(r#"{{"ability":"a","input":[{PART}],{extra}}}"#)
    }
}

fn with_part(part: &str) -> String {
    format!(r#"{{"ability":"a","input":[{part}]}}"#)
}

fn properties(n: usize, value: &str) -> String {
    let entries: Vec<String> = (0..n).map(|i| format!(r#""k{i}":{value}"#)).collect();
    format!("{{{}}}", entries.join(","))
}

fn corpus() -> Vec<(bool, String)> {
    let mut cases: Vec<(bool, String)> = Vec::new();
    let mut valid = |b: String| cases.push((true, b));

    // From protocol/src/validate.rs.
    for b in include_str!("data/valid_requests.jsonl").lines() {
        valid(b.into());
    }
    valid(with(r#""deadline_ms":5.0"#));
    // Lone surrogates (a string cut in the middle of an emoji), as `JSON.parse` takes them.
    valid(r#"{"ability":"a\ud800","input":[{"type":"text","text":"\udc00 \ud83d\ude00"}]}"#.into());
    valid(with_part(&format!(
        r#"{{"type":"text","text":"{}"}}"#,
        "é".repeat(3000)
    )));
    // Bounds, inclusive.
    for v in ["1", "86400000", "86400000.0", "1e3", "1.0", "5E2"] {
        valid(with(&format!(r#""deadline_ms":{v}"#)));
        valid(with(&format!(r#""routing":{{"retry_budget_ms":{v}}}"#)));
    }
    for v in ["1", "32", "32.0", "5.0"] {
        valid(with(&format!(r#""routing":{{"max_attempts":{v}}}"#)));
    }
    for c in ["a", "é", "😀"] {
        valid(format!(
            r#"{{"ability":"{}","input":[{PART}]}}"#,
            c.repeat(256)
        ));
        valid(with_part(&format!(
            r#"{{"type":"image","uri":"{}","media_type":"{}"}}"#,
            c.repeat(8192),
            c.repeat(256)
        )));
    }
    valid(with_part(r#"{"type":"file","uri":"f","media_type":""}"#));
    for v in [
        "null",
        "0",
        "\"\"",
        "[]",
        "{}",
        "[null,{\"a\":[1.5]}]",
        "false",
    ] {
        valid(with_part(&format!(r#"{{"type":"json","value":{v}}}"#)));
    }
    valid(format!(
        r#"{{"ability":"a","input":[{}]}}"#,
        vec![PART; 1024].join(",")
    ));
    valid(with(&format!(r#""metadata":{}"#, properties(64, "1"))));
    valid(with(&format!(r#""extensions":{}"#, properties(64, "null"))));
    valid(with(
        r#""metadata":{},"extensions":{},"requirements":{},"routing":{}"#,
    ));
    valid(with(
        r#""metadata":{"s":"","i":0,"n":-1.5,"b":false,"big":1e300,"u":18446744073709551616}"#,
    ));
    valid(with(
        r#""routing":{"provider_order":[],"strategy":"first_available"}"#,
    ));
    valid(with(
        r#""requirements":{"input_modalities":[],"output_modalities":["text","image","audio","video","file","json"]}"#,
    ));
    valid(with(
        r#""extensions":{"x":{"deep":[1,{"y":null}]},"tools":true}"#,
    ));

    let mut invalid = |b: String| cases.push((false, b));
    // The requests protocol/src/validate.rs refuses.
    let violations = include_str!("data/schema_violations.jsonl").lines();
    for b in [r#"{"ability":"a"}"#, "[]"].into_iter().chain(violations) {
        invalid(b.into());
    }
    // Roots that are not requests.
    for b in ["null", "5", "\"x\"", "{}", "true"] {
        invalid(b.into());
    }
    // `null` for every optional field.
    for field in ["requirements", "routing", "metadata", "extensions"] {
        invalid(with(&format!(r#""{field}":null"#)));
    }
    let requirement_fields = [
        "input_modalities",
        "output_modalities",
        "stream",
        "tools",
        "structured_output",
        "async",
        "cancel",
    ];
    let routing_fields = [
        "strategy",
        "provider_order",
        "allow_fallback",
        "max_attempts",
        "retry_budget_ms",
    ];
    for (object, fields) in [
        ("requirements", &requirement_fields[..]),
        ("routing", &routing_fields),
    ] {
        for field in fields {
            invalid(with(&format!(r#""{object}":{{"{field}":null}}"#)));
        }
    }
    for kind in ["image", "audio", "video", "file"] {
        invalid(with_part(&format!(
            r#"{{"type":"{kind}","uri":"u","media_type":null}}"#
        )));
        invalid(with_part(&format!(r#"{{"type":"{kind}","uri":null}}"#)));
        invalid(with_part(&format!(r#"{{"type":"{kind}"}}"#)));
        invalid(with_part(&format!(
            r#"{{"type":"{kind}","uri":"u","x":1}}"#
        )));
        invalid(with_part(&format!(
            r#"{{"type":"{kind}","uri":"u","text":"t"}}"#
        )));
        invalid(with_part(&format!(
            r#"{{"type":"{kind}","uri":"{}"}}"#,
            "é".repeat(8193)
        )));
        invalid(with_part(&format!(
            r#"{{"type":"{kind}","uri":"u","media_type":"{}"}}"#,
            "😀".repeat(257)
        )));
    }
    // Extra properties in every nested object.
    invalid(with_part(r#"{"type":"json","value":1,"x":1}"#));
    invalid(with_part(r#"{"type":"text","text":"t","value":1}"#));
    invalid(with(r#""requirements":{"extra":true}"#));
    invalid(with(r#""requirements":{"stream":true,"streaming":true}"#));
    invalid(with(r#""routing":{"strategy":"ordered","fallback":true}"#));
    // Integers.
    for v in [
        "1.5",
        "0",
        "-1",
        "-0.0",
        "86400001",
        "86400000.5",
        "\"5\"",
        "true",
        "1e20",
    ] {
        invalid(with(&format!(r#""deadline_ms":{v}"#)));
        invalid(with(&format!(r#""routing":{{"retry_budget_ms":{v}}}"#)));
    }
    for v in ["1.5", "0", "33", "32.5", "-1", "4294967297", "\"1\""] {
        invalid(with(&format!(r#""routing":{{"max_attempts":{v}}}"#)));
    }
    // Lengths and counts, one past the bound.
    for c in ["a", "é", "😀"] {
        invalid(format!(
            r#"{{"ability":"{}","input":[{PART}]}}"#,
            c.repeat(257)
        ));
    }
    invalid(format!(
        r#"{{"ability":"a","input":[{}]}}"#,
        vec![PART; 1025].join(",")
    ));
    invalid(with(&format!(r#""metadata":{}"#, properties(65, "\"v\""))));
    invalid(with(&format!(r#""extensions":{}"#, properties(65, "{}"))));
    // Types.
    for b in [
        r#"{"ability":5,"input":[{"type":"text","text":"x"}]}"#,
        r#"{"ability":null,"input":[{"type":"text","text":"x"}]}"#,
        r#"{"input":[{"type":"text","text":"x"}]}"#,
        r#"{"ability":"a","input":{}}"#,
        r#"{"ability":"a","input":"x"}"#,
        r#"{"ability":"a","input":null}"#,
        r#"{"ability":"a","input":["x"]}"#,
        r#"{"ability":"a","input":[null]}"#,
        r#"{"ability":"a","input":[{"text":"x"}]}"#,
        r#"{"ability":"a","input":[{"type":null,"text":"x"}]}"#,
        r#"{"ability":"a","input":[{"type":"TEXT","text":"x"}]}"#,
        r#"{"ability":"a","input":[{"type":"text"}]}"#,
        r#"{"ability":"a","input":[{"type":"text","text":null}]}"#,
        r#"{"ability":"a","input":[{"type":"text","text":5}]}"#,
        r#"{"ability":"a","input":[{"type":"image","uri":5}]}"#,
    ] {
        invalid(b.into());
    }
    for extra in [
        r#""requirements":{"input_modalities":["pdf"]}"#,
        r#""requirements":{"output_modalities":"text"}"#,
        r#""requirements":{"output_modalities":["json","json"]}"#,
        r#""requirements":"all""#,
        r#""routing":{"provider_order":[1]}"#,
        r#""routing":{"provider_order":"a"}"#,
        r#""routing":{"allow_fallback":"true"}"#,
        r#""routing":{"allow_fallback":1}"#,
        r#""routing":{"strategy":"Ordered"}"#,
        r#""metadata":[]"#,
        r#""metadata":{"k":[1]}"#,
        r#""metadata":"k""#,
        r#""extensions":"x""#,
        r#""extensions":5"#,
    ] {
        invalid(with(extra));
    }
    cases
}

#[test]
fn request_schema_agrees_with_parse_request_on_the_corpus() {
    let cases = corpus();
    assert!(cases.len() > 150, "{}", cases.len());
    for (expected, body) in &cases {
        assert_case(*expected, body);
    }
}

#[test]
fn bodies_that_are_not_json_are_invalid_json() {
    for body in [
        "",
        "{",
        r#"{"ability":5, nope"#,
        r#"{"ability":"a","input":[{"type":"text","text":"x"}],"metadata":{"k":1e400}}"#,
        r#"{"ability":"a","input":[{"type":"text","text":"x"}]} x"#,
        "{\"ability\":\"\\x\",\"input\":[]}",
        "{\"ability\":\"\\ud80\",\"input\":[]}",
    ] {
        assert_eq!(verdicts(body.as_bytes()), None, "{body}");
    }
}

/// Shapes serde accepts and the schema (like the reference's validator) rejects. They are
/// listed so the divergence stays visible; `parse_request` needs a fix for them to agree.
#[test]
fn shapes_serde_would_accept_are_rejected_like_the_schema() {
    // Arrays where objects are required (serde accepts struct fields by position, and an
    // internally tagged enum as [tag, fields...]).
    assert_case(false, r#"["a",[{"type":"text","text":"x"}]]"#);
    assert_case(false, r#"{"ability":"a","input":[["text","x"]]}"#);
    assert_case(false, &with(r#""requirements":[["text"]]"#));
    assert_case(false, &with(r#""routing":["ordered"]"#));
    // Unit enum values as single-key objects (serde's externally tagged form).
    assert_case(false, &with(r#""routing":{"strategy":{"ordered":null}}"#));
    assert_case(
        false,
        &with(r#""requirements":{"input_modalities":[{"text":null}]}"#),
    );
    // Duplicate keys: JSON.parse (the reference) and serde_json::Value keep the last one;
    // serde's derived struct visitor rejects them.
    assert_case(
        true,
        r#"{"ability":"a","ability":"b","input":[{"type":"text","text":"x"}]}"#,
    );
}

// Random structured requests near every bound: each field is usually absent or valid, and
// otherwise just past a bound, `null`, or of the wrong type.

fn sized(lengths: &'static [usize]) -> impl Strategy<Value = Value> {
    (
        prop::sample::select(lengths),
        prop::sample::select(&["a", "é", "😀", "\u{0}", " "][..]),
    )
        .prop_map(|(n, c)| Value::from(c.repeat(n)))
}

/// One of `values`, each as likely: a field's `null` and wrong-typed values, weighted in a
/// `prop_oneof!` by their count (so that each weighs as much as a one-value arm).
fn one_of(values: &[Value]) -> BoxedStrategy<Value> {
    prop::sample::select(values.to_vec()).boxed()
}

/// Strings with lengths at the valid bounds (`ok`) or just past them (`bad`).
fn string_near(ok: &'static [usize], bad: &'static [usize]) -> BoxedStrategy<Value> {
    if bad.is_empty() {
        return prop_oneof![40 => sized(ok), 2 => one_of(&[Value::Null, json!(5)])].boxed();
    }
    prop_oneof![
        40 => sized(ok),
        3 => sized(bad),
        2 => one_of(&[Value::Null, json!(5)]),
    ]
    .boxed()
}

/// Integers at the valid bounds (`ok`), just past them (`bad`), as floats, or not integers.
fn integer_near(ok: &'static [i64], bad: &'static [i64]) -> BoxedStrategy<Value> {
    prop_oneof![
        30 => prop::sample::select(ok).prop_map(Value::from),
        6 => prop::sample::select(ok).prop_map(|n| json!(n as f64)),
        3 => prop::sample::select(bad).prop_map(Value::from),
        1 => prop::sample::select(ok).prop_map(|n| json!(n as f64 + 0.5)),
        1 => (1i64..100_000_000).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        3 => one_of(&[Value::Null, json!("5"), json!(1e20)]),
    ]
    .boxed()
}

fn boolean() -> BoxedStrategy<Value> {
    prop_oneof![
        20 => any::<bool>().prop_map(Value::from),
        3 => one_of(&[Value::Null, json!("true"), json!(1)]),
    ]
    .boxed()
}

fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-z]{0,4}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn object(entries: Vec<(&str, Option<Value>)>, extra: bool) -> Value {
    let mut map: Map<String, Value> = entries
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
        .collect();
    if extra {
        map.insert("unexpected".into(), json!(1));
    }
    Value::Object(map)
}

fn strings(values: Vec<&str>) -> Value {
    Value::from(values.into_iter().map(Value::from).collect::<Vec<_>>())
}

fn input_part() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => Just("text"),
        3 => Just("json"),
        2 => Just("image"),
        2 => Just("audio"),
        2 => Just("video"),
        2 => Just("file"),
        1 => Just("pdf"),
    ]
    .prop_flat_map(|kind| {
        let media = matches!(kind, "image" | "audio" | "video" | "file");
        let p = |yes: bool| if yes { 0.97 } else { 0.02 };
        (
            prop::option::weighted(
                0.98,
                prop_oneof![30 => Just(Value::from(kind)), 1 => Just(json!(5))],
            ),
            prop::option::weighted(p(kind == "text"), string_near(&[0, 1, 7], &[])),
            prop::option::weighted(p(kind == "json"), any_json()),
            prop::option::weighted(p(media), string_near(&[1, 2, 8191, 8192], &[0, 8193])),
            prop::option::weighted(
                if media { 0.5 } else { 0.02 },
                string_near(&[0, 1, 255, 256], &[257]),
            ),
            prop::bool::weighted(0.02),
        )
            .prop_map(|(t, text, value, uri, media_type, extra)| {
                object(
                    vec![
                        ("type", t),
                        ("text", text),
                        ("value", value),
                        ("uri", uri),
                        ("media_type", media_type),
                    ],
                    extra,
                )
            })
    })
    .boxed()
}

fn input() -> BoxedStrategy<Value> {
    let text = json!({ "type": "text", "text": "" });
    prop_oneof![
        40 => prop::collection::vec(input_part(), 1..4).prop_map(Value::from),
        1 => Just(json!([])),
        2 => prop::sample::select(&[1023usize, 1024, 1025][..])
            .prop_map(move |n| Value::from(vec![text.clone(); n])),
        1 => Just(json!({})),
    ]
    .boxed()
}

const MODALITIES: [&str; 6] = ["text", "image", "audio", "video", "file", "json"];

fn modalities() -> BoxedStrategy<Value> {
    prop_oneof![
        12 => prop::sample::subsequence(&MODALITIES[..], 0..=6)
            .prop_shuffle()
            .prop_map(strings),
        2 => prop::collection::vec(prop::sample::select(&["text", "json", "pdf"][..]), 1..4)
            .prop_map(strings),
        2 => one_of(&[Value::Null, json!("text")]),
    ]
    .boxed()
}

fn requirements() -> BoxedStrategy<Value> {
    let w = 0.3;
    (
        prop::option::weighted(w, modalities()),
        prop::option::weighted(w, modalities()),
        prop::option::weighted(w, boolean()),
        prop::option::weighted(w, boolean()),
        prop::option::weighted(w, boolean()),
        prop::option::weighted(w, boolean()),
        prop::option::weighted(w, boolean()),
        prop::bool::weighted(0.03),
        prop_oneof![30 => Just(None), 1 => Just(Some(Value::Null)), 1 => Just(Some(json!("x")))],
    )
        .prop_map(|(i, o, s, t, so, a, c, extra, replacement)| {
            replacement.unwrap_or_else(|| {
                object(
                    vec![
                        ("input_modalities", i),
                        ("output_modalities", o),
                        ("stream", s),
                        ("tools", t),
                        ("structured_output", so),
                        ("async", a),
                        ("cancel", c),
                    ],
                    extra,
                )
            })
        })
        .boxed()
}

fn routing() -> BoxedStrategy<Value> {
    let w = 0.35;
    let provider_order = prop_oneof![
        12 => prop::sample::subsequence(&["a", "b", "c", "d"][..], 0..=4)
            .prop_shuffle()
            .prop_map(strings),
        2 => prop::collection::vec(prop::sample::select(&["a", "b", ""][..]), 1..4)
            .prop_map(strings),
        2 => one_of(&[json!([1]), Value::Null]),
    ];
    let strategy = prop_oneof![
        12 => prop::sample::select(&["first_available", "ordered"][..]).prop_map(Value::from),
        2 => one_of(&[json!("random"), Value::Null]),
    ];
    (
        prop::option::weighted(w, strategy),
        prop::option::weighted(w, provider_order),
        prop::option::weighted(w, boolean()),
        prop::option::weighted(w, integer_near(&[1, 2, 31, 32], &[0, 33, -1])),
        prop::option::weighted(
            w,
            integer_near(&[1, 2, 86_399_999, 86_400_000], &[0, 86_400_001]),
        ),
        prop::bool::weighted(0.03),
        prop_oneof![30 => Just(None), 1 => Just(Some(Value::Null)), 1 => Just(Some(json!(true)))],
    )
        .prop_map(|(s, p, f, m, r, extra, replacement)| {
            replacement.unwrap_or_else(|| {
                object(
                    vec![
                        ("strategy", s),
                        ("provider_order", p),
                        ("allow_fallback", f),
                        ("max_attempts", m),
                        ("retry_budget_ms", r),
                    ],
                    extra,
                )
            })
        })
        .boxed()
}

fn metadata_value() -> BoxedStrategy<Value> {
    prop_oneof![
        10 => "[a-z]{0,3}".prop_map(Value::from),
        5 => any::<i64>().prop_map(Value::from),
        5 => (-1e9f64..1e9).prop_map(Value::from),
        5 => any::<bool>().prop_map(Value::from),
        3 => one_of(&[Value::Null, json!({}), json!([])]),
    ]
    .boxed()
}

/// Objects of 0-2 random values, or of 63-65 valid values (random ones would almost never all
/// be valid), or not objects.
fn properties_near(value: BoxedStrategy<Value>, filler: Value) -> BoxedStrategy<Value> {
    let entries = |values: Vec<Value>| {
        Value::Object(
            values
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("k{i}"), v))
                .collect(),
        )
    };
    prop_oneof![
        16 => prop::collection::vec(value, 0..3).prop_map(entries),
        4 => prop::sample::select(&[63usize, 64][..])
            .prop_map(move |n| entries(vec![filler.clone(); n])),
        1 => Just(entries(vec![json!(1); 65])),
        3 => one_of(&[Value::Null, json!([]), json!("x")]),
    ]
    .boxed()
}

fn request() -> impl Strategy<Value = Value> {
    (
        prop::option::weighted(0.98, string_near(&[1, 2, 255, 256], &[0, 257])),
        prop::option::weighted(0.98, input()),
        prop::option::weighted(0.3, requirements()),
        prop::option::weighted(0.3, routing()),
        prop::option::weighted(
            0.3,
            integer_near(&[1, 2, 86_399_999, 86_400_000], &[0, 86_400_001]),
        ),
        prop::option::weighted(0.3, properties_near(metadata_value(), json!(true))),
        prop::option::weighted(0.2, properties_near(any_json(), Value::Null)),
        prop::bool::weighted(0.02),
    )
        .prop_map(
            |(ability, input, requirements, routing, deadline, metadata, extensions, extra)| {
                object(
                    vec![
                        ("ability", ability),
                        ("input", input),
                        ("requirements", requirements),
                        ("routing", routing),
                        ("deadline_ms", deadline),
                        ("metadata", metadata),
                        ("extensions", extensions),
                    ],
                    extra,
                )
            },
        )
}

proptest! {
    // No regression files: this test may only write under spec/.
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn request_schema_agrees_with_parse_request_on_random_requests(value in request()) {
        let body = serde_json::to_vec(&value).unwrap_or_default();
        let (schema, parser) = verdicts(&body).unwrap_or((false, true));
        prop_assert_eq!(
            schema,
            parser,
            "schema={} parse_request={} for {}",
            schema,
            parser,
            shorten(&String::from_utf8_lossy(&body))
        );
    }
}

/// The generator must reach both verdicts often, or the property above proves little.
#[test]
fn random_requests_cover_valid_and_invalid() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = request();
    let (mut valid, mut total) = (0, 0);
    for _ in 0..1000 {
        let value = strategy
            .new_tree(&mut runner)
            .map(|t| t.current())
            .unwrap_or_else(|e| panic!("{e}"));
        total += 1;
        if REQUEST_VALIDATOR.is_valid(&value) {
            valid += 1;
        }
    }
    assert!(
        valid * 5 > total && valid * 5 < total * 4,
        "{valid} of {total} valid"
    );
}

// ---------------------------------------------------------------------------------------------
// Event schema
// ---------------------------------------------------------------------------------------------

static EVENT_VALIDATOR: LazyLock<Validator> = LazyLock::new(|| {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&runtime_event_schema())
        .unwrap_or_else(|e| panic!("event schema does not compile: {e}"))
});

fn target() -> Target {
    Target {
        provider: "provider-mock".into(),
        model: "model-alpha".into(),
    }
}

fn fact(unit: UsageUnit, quantity: f64) -> UsageFact {
    UsageFact::new(unit, quantity, UsageSource::Provider).unwrap_or_else(|e| panic!("{e}"))
}

fn every_body() -> Vec<EventBody> {
    vec![
        EventBody::Accepted,
        EventBody::RouteSelected {
            target: target(),
            attempt: 1,
        },
        EventBody::RouteAttemptFailed {
            target: target(),
            attempt: 2,
            error: RuntimeError::provider_queue_full().with_provider_code("429"),
        },
        EventBody::OutputDelta {
            output_index: 0,
            delta: "hello".into(),
        },
        EventBody::ToolCallStarted {
            call_id: "call_1".into(),
            name: "lookup".into(),
        },
        EventBody::ToolCallArgumentsDelta {
            call_id: "call_1".into(),
            delta: "{\"q\":".into(),
        },
        EventBody::Progress {
            phase: ProgressPhase::Queued,
            progress: None,
        },
        EventBody::Progress {
            phase: ProgressPhase::Processing,
            progress: Some(0.5),
        },
        EventBody::OutputResult {
            result: json!({"images": [{"url": "https://x/y.png"}]}),
            artifacts: Some(vec![
                OutputArtifact {
                    uri: "https://x/y.png".into(),
                    media_type: Some("image/png".into()),
                },
                OutputArtifact {
                    uri: "https://x/z".into(),
                    media_type: None,
                },
            ]),
        },
        EventBody::OutputResult {
            result: Value::Null,
            artifacts: None,
        },
        EventBody::UsageReported {
            facts: vec![
                fact(UsageUnit::input_token(), 12.0),
                fact(
                    UsageUnit::parse("vendor.gpu_second").unwrap_or_else(|e| panic!("{e}")),
                    0.25,
                ),
            ],
        },
        EventBody::Completed { target: target() },
        EventBody::Failed {
            error: RuntimeError::deadline_exceeded(),
        },
        EventBody::Failed {
            error: RuntimeError::cancelled(),
        },
    ]
}

fn event_json(body: EventBody, sequence: u64) -> Value {
    let event = RuntimeEvent::new(
        ExecutionId::new_random(),
        Sequence(sequence),
        Timestamp::from_unix_millis(1_767_225_600_123),
        body,
    );
    serde_json::to_value(&event).unwrap_or_else(|e| panic!("{e}"))
}

const STATUSES: [ExecutionStatus; 6] = [
    ExecutionStatus::Accepted,
    ExecutionStatus::Routing,
    ExecutionStatus::Running,
    ExecutionStatus::Succeeded,
    ExecutionStatus::Failed,
    ExecutionStatus::Cancelled,
];

#[test]
fn every_event_validates_with_exactly_its_allowed_statuses() {
    let bodies = every_body();
    let types: std::collections::BTreeSet<&str> = bodies.iter().map(|b| b.type_name()).collect();
    assert_eq!(types.len(), 11);
    for body in bodies {
        let value = event_json(body.clone(), 3);
        if let Err(e) = EVENT_VALIDATOR.validate(&value) {
            panic!("{e}: {value}");
        }
        for status in STATUSES {
            let mut v = value.clone();
            v["status"] = json!(status.as_str());
            assert_eq!(
                EVENT_VALIDATOR.is_valid(&v),
                body.allows_status(status),
                "{} with status {status}",
                body.type_name()
            );
        }
    }
}

#[test]
fn malformed_events_are_invalid() {
    let delta = event_json(
        EventBody::OutputDelta {
            output_index: 0,
            delta: "x".into(),
        },
        2,
    );
    type Mutation = Box<dyn Fn(&mut Value)>;
    let mutations: Vec<(&str, Mutation)> = vec![
        ("extra field", Box::new(|v| v["extra"] = json!(1))),
        ("sequence 0", Box::new(|v| v["sequence"] = json!(0))),
        ("sequence string", Box::new(|v| v["sequence"] = json!("2"))),
        (
            "bad uuid",
            Box::new(|v| v["execution_id"] = json!("not-a-uuid")),
        ),
        ("bad time", Box::new(|v| v["time"] = json!("yesterday"))),
        (
            "negative index",
            Box::new(|v| v["output_index"] = json!(-1)),
        ),
        (
            "missing delta",
            Box::new(|v| {
                if let Value::Object(m) = v {
                    m.remove("delta");
                }
            }),
        ),
        (
            "missing time",
            Box::new(|v| {
                if let Value::Object(m) = v {
                    m.remove("time");
                }
            }),
        ),
        (
            "unknown type",
            Box::new(|v| v["type"] = json!("output.deltas")),
        ),
        (
            "other type's fields",
            Box::new(|v| v["type"] = json!("tool.call.arguments.delta")),
        ),
    ];
    for (name, mutate) in mutations {
        let mut v = delta.clone();
        mutate(&mut v);
        assert!(!EVENT_VALIDATOR.is_valid(&v), "{name}: {v}");
    }
    let progress = event_json(
        EventBody::Progress {
            phase: ProgressPhase::Queued,
            progress: None,
        },
        2,
    );
    let mut v = progress.clone();
    v["progress"] = Value::Null;
    assert!(!EVENT_VALIDATOR.is_valid(&v), "null progress");
    let mut v = progress;
    v["phase"] = json!("done");
    assert!(!EVENT_VALIDATOR.is_valid(&v), "unknown phase");
    let mut failed = event_json(
        EventBody::Failed {
            error: RuntimeError::internal(),
        },
        9,
    );
    failed["error"]["provider_code"] = Value::Null;
    assert!(!EVENT_VALIDATOR.is_valid(&failed), "null provider_code");
    let mut usage = event_json(
        EventBody::UsageReported {
            facts: vec![fact(UsageUnit::request(), 1.0)],
        },
        4,
    );
    usage["facts"][0]["quantity"] = json!(-1);
    assert!(!EVENT_VALIDATOR.is_valid(&usage), "negative quantity");
    usage["facts"][0]["quantity"] = json!(1);
    usage["facts"][0]["unit"] = json!("tokens");
    assert!(!EVENT_VALIDATOR.is_valid(&usage), "unknown unit");
}

// ---------------------------------------------------------------------------------------------
// OpenAPI
// ---------------------------------------------------------------------------------------------

/// Compiles `schema` in the context of the OpenAPI document's components.
/// A validator for the JSON body of `response` (an OpenAPI response object).
fn response_validator(doc: &Value, response: &Value) -> Validator {
    openapi_validator(doc, &response["content"]["application/json"]["schema"])
}

fn openapi_validator(doc: &Value, schema: &Value) -> Validator {
    let mut root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"].clone(),
    });
    if let (Value::Object(root), Value::Object(schema)) = (&mut root, schema) {
        for (k, v) in schema {
            root.insert(k.clone(), v.clone());
        }
    }
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&root)
        .unwrap_or_else(|e| panic!("{e}: {schema}"))
}

fn component(doc: &Value, name: &str) -> Validator {
    openapi_validator(
        doc,
        &json!({ "$ref": format!("#/components/schemas/{name}") }),
    )
}

fn assert_valid(validator: &Validator, value: &Value) {
    if let Err(e) = validator.validate(value) {
        panic!("{e}: {value}");
    }
}

#[test]
fn openapi_request_schema_is_the_request_schema() {
    fn rewrite(v: &mut Value) {
        match v {
            Value::String(s) if s.starts_with("#/$defs/") => {
                *s = s.replace("#/$defs/", "#/components/schemas/");
            }
            Value::Object(m) => m.values_mut().for_each(rewrite),
            Value::Array(a) => a.iter_mut().for_each(rewrite),
            _ => {}
        }
    }
    let doc = openapi_document();
    let mut standalone = execution_request_schema();
    rewrite(&mut standalone);
    let Value::Object(mut root) = standalone else {
        panic!("request schema is not an object");
    };
    let Some(Value::Object(defs)) = root.remove("$defs") else {
        panic!("request schema has no $defs");
    };
    root.remove("$schema");
    root.remove("$id");
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["ExecutionRequest"], Value::Object(root));
    for (name, def) in defs {
        assert_eq!(schemas[&name], def, "{name}");
    }
}

#[test]
fn openapi_covers_the_contract_endpoints() {
    let doc = openapi_document();
    let expected: [(&str, &str, &[&str]); 10] = [
        ("/v1/runtime", "get", &["200", "503"]),
        ("/v1/providers", "get", &["200"]),
        (
            "/v1/executions",
            "post",
            &[
                "202", "200", "400", "413", "415", "422", "429", "503", "500",
            ],
        ),
        ("/v1/executions/{id}", "get", &["200", "404"]),
        ("/v1/executions/{id}/result", "get", &["200", "404", "409"]),
        ("/v1/executions/{id}/cancel", "post", &["202", "404"]),
        ("/v1/executions/{id}/events", "get", &["200", "400", "404"]),
        ("/healthz", "get", &["200"]),
        ("/readyz", "get", &["200", "503"]),
        ("/metrics", "get", &["200"]),
    ];
    let paths = doc["paths"]
        .as_object()
        .map(|p| p.len())
        .unwrap_or_default();
    assert_eq!(paths, expected.len());
    for (path, method, statuses) in expected {
        let responses = &doc["paths"][path][method]["responses"];
        for status in statuses {
            assert!(responses.get(status).is_some(), "{method} {path} {status}");
        }
    }
    // Every schema in the document compiles against the components.
    fn schemas<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    if k == "schema" {
                        out.push(child);
                    } else {
                        schemas(child, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|c| schemas(c, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    schemas(&doc["paths"], &mut found);
    schemas(&doc["components"]["parameters"], &mut found);
    schemas(&doc["components"]["responses"], &mut found);
    schemas(&doc["components"]["headers"], &mut found);
    assert!(found.len() >= 30, "{}", found.len());
    for schema in found {
        let _ = openapi_validator(&doc, schema);
    }
    if let Some(all) = doc["components"]["schemas"].as_object() {
        for name in all.keys() {
            let _ = component(&doc, name);
        }
    }
}

#[test]
fn serialized_responses_match_their_openapi_schemas() {
    let doc = openapi_document();
    let id = ExecutionId::new_random();
    let t = Timestamp::from_unix_millis(1_767_225_600_000);
    let usage = vec![fact(UsageUnit::output_token(), 3.0)];

    let snapshot = component(&doc, "ExecutionSnapshot");
    let bare = ExecutionSnapshot {
        execution_id: id,
        status: ExecutionStatus::Accepted,
        created_at: t,
        updated_at: t,
        last_sequence: Sequence(1),
        usage: vec![],
        target: None,
        error: None,
        result: None,
        artifacts: None,
    };
    assert_valid(&snapshot, &json!(bare));
    let full = ExecutionSnapshot {
        status: ExecutionStatus::Failed,
        last_sequence: Sequence(7),
        usage: usage.clone(),
        target: Some(target()),
        error: Some(RuntimeError::internal()),
        result: Some(json!({"outputs": [], "tool_calls": []})),
        artifacts: Some(vec![]),
        ..bare.clone()
    };
    assert_valid(&snapshot, &json!(full));
    let mut nulled = json!(bare);
    nulled["target"] = Value::Null;
    assert!(
        !snapshot.is_valid(&nulled),
        "optional keys are omitted, not null"
    );

    let result = component(&doc, "ExecutionResultResponse");
    for r in [
        ExecutionResultResponse {
            execution_id: id,
            target: Some(target()),
            result: Some(json!("x")),
            artifacts: vec![],
            usage: usage.clone(),
        },
        ExecutionResultResponse {
            execution_id: id,
            target: None,
            result: None,
            artifacts: vec![],
            usage: vec![],
        },
    ] {
        assert_valid(&result, &json!(r));
    }

    let submission = ExecutionSubmission {
        execution_id: id,
        status: ExecutionStatus::Accepted,
        created_at: t,
        idempotent_replay: false,
    };
    let post = &doc["paths"]["/v1/executions"]["post"]["responses"];
    let accepted = response_validator(&doc, &post["202"]);
    let replayed = response_validator(&doc, &post["200"]);
    assert_valid(&accepted, &json!(submission));
    assert!(!replayed.is_valid(&json!(submission)));
    let replay = ExecutionSubmission {
        status: ExecutionStatus::Succeeded,
        idempotent_replay: true,
        ..submission
    };
    assert_valid(&replayed, &json!(replay));
    assert!(!accepted.is_valid(&json!(replay)));

    let error = |code: ErrorCode, retryable: bool| {
        json!(ErrorResponse {
            error: RuntimeError::new(code, "Fixed sentence", retryable),
        })
    };
    let schema_at = |status: &str| response_validator(&doc, &post[status]);
    assert_valid(&schema_at("429"), &error(ErrorCode::QueueFull, true));
    assert!(!schema_at("429").is_valid(&error(ErrorCode::QueueFull, false)));
    assert_valid(
        &schema_at("422"),
        &error(ErrorCode::IdempotencyConflict, false),
    );
    assert_valid(
        &schema_at("422"),
        &error(ErrorCode::CapabilityUnavailable, false),
    );
    assert!(!schema_at("422").is_valid(&error(ErrorCode::InvalidRequest, false)));
    assert_valid(&schema_at("415"), &error(ErrorCode::InvalidRequest, false));
    let responses = &doc["components"]["responses"];
    let invalid = response_validator(&doc, &responses["InvalidRequest"]);
    assert_valid(&invalid, &error(ErrorCode::InvalidRequest, false));
    let unavailable = response_validator(&doc, &responses["Unavailable"]);
    assert_valid(&unavailable, &error(ErrorCode::Unavailable, true));
    assert_valid(&schema_at("429"), &error(ErrorCode::RateLimited, true));
    // API keys: 401 on every /v1 route, 403 on the scoped execution routes, none elsewhere.
    let unauthenticated = response_validator(&doc, &responses["Unauthenticated"]);
    assert_valid(&unauthenticated, &error(ErrorCode::Unauthenticated, false));
    assert!(!unauthenticated.is_valid(&error(ErrorCode::PermissionDenied, false)));
    let denied = response_validator(&doc, &responses["PermissionDenied"]);
    assert_valid(&denied, &error(ErrorCode::PermissionDenied, false));
    for (path, method, scoped) in [
        ("/v1/executions", "post", true),
        ("/v1/executions/{id}", "get", true),
        ("/v1/executions/{id}/result", "get", true),
        ("/v1/executions/{id}/cancel", "post", true),
        ("/v1/executions/{id}/events", "get", true),
        ("/v1/runtime", "get", false),
        ("/v1/providers", "get", false),
    ] {
        let responses = &doc["paths"][path][method]["responses"];
        assert_eq!(
            responses["401"]["$ref"], "#/components/responses/Unauthenticated",
            "{method} {path}"
        );
        assert_eq!(responses.get("403").is_some(), scoped, "{method} {path}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(doc["paths"][path]["get"]["security"], json!([]), "{path}");
    }
    let not_found = component(&doc, "NotFoundError");
    assert_valid(
        &not_found,
        &json!({"error": {"code": "not_found", "message": "Execution not found"}}),
    );
    assert_valid(&not_found, &error(ErrorCode::NotFound, false));

    let not_ready = component(&doc, "ResultNotReady");
    assert_valid(
        &not_ready,
        &json!(ResultNotReady {
            status: ExecutionStatus::Routing,
            error: None
        }),
    );
    assert_valid(
        &not_ready,
        &json!(ResultNotReady {
            status: ExecutionStatus::Cancelled,
            error: Some(RuntimeError::cancelled())
        }),
    );

    let cancel = &doc["paths"]["/v1/executions/{id}/cancel"]["post"]["responses"];
    let requested = json!(CancelResponse {
        status: CancelStatus::CancellationRequested
    });
    let missing = json!(CancelResponse {
        status: CancelStatus::NotFound
    });
    let c202 = response_validator(&doc, &cancel["202"]);
    let c404 = response_validator(&doc, &cancel["404"]);
    assert_valid(&c202, &requested);
    assert_valid(&c404, &missing);
    assert!(!c202.is_valid(&missing) && !c404.is_valid(&requested));

    let runtime = &doc["paths"]["/v1/runtime"]["get"]["responses"];
    let r200 = response_validator(&doc, &runtime["200"]);
    let r503 = response_validator(&doc, &runtime["503"]);
    assert_valid(&r200, &json!(RuntimeInfo::new(1, RuntimeState::Ready)));
    assert_valid(&r503, &json!(RuntimeInfo::new(1, RuntimeState::Stopping)));
    assert_valid(
        &r503,
        &json!(RuntimeInfo::new(0, RuntimeState::Unavailable)),
    );
    assert!(!r200.is_valid(&json!(RuntimeInfo::new(1, RuntimeState::Stopping))));

    let providers = component(&doc, "ProviderList");
    let list = ProviderList {
        data: vec![ProviderManifest {
            provider: "provider-mock".into(),
            protocol_version: "0.1.0".into(),
            models: vec![ModelCapability::streamed_text(
                "model-alpha",
                vec!["text-generation".into()],
            )],
            limits: Some(ProviderLimits {
                max_concurrency: 4,
                max_queue_depth: 8,
            }),
        }],
    };
    assert_valid(&providers, &json!(list));

    // SSE frames: the event in `data` follows the same event schema.
    let events = component(&doc, "RuntimeEvent");
    for body in every_body() {
        let event = event_json(body, 5);
        assert_valid(&events, &event);
        assert!(EVENT_VALIDATOR.is_valid(&event));
    }
    let frame = component(&doc, "RuntimeEventFrame");
    assert_valid(
        &frame,
        &json!({"id": "5", "event": "output.delta", "data": "{}"}),
    );
    assert!(!frame.is_valid(&json!({"id": "0", "event": "output.delta", "data": "{}"})));
}
