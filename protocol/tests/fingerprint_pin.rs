//! Request fingerprints are stored with idempotency keys (Redis keeps them for the retention
//! period), so the same request must keep the same fingerprint across releases. The values
//! below were computed before caller-defined JSON was kept as raw text; they must never change.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use protocol::fingerprint::request_fingerprint;
use protocol::validate::parse_request;

/// (request body, fingerprint). The bodies exercise every part of the canonical form: key order, duplicate keys (the last
/// one wins), whitespace, number forms, escapes and non-ASCII text, in every caller-defined
/// JSON field (`extensions`, `metadata`, `json` input parts) and in the typed fields.
const PINNED: &[(&str, &str)] = &[
    (
        r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"}]}"#,
        "4ae62d0ebc0f18e70e498c67f1aedd347a49f6f87b335d46bbe8f6e1fe8e3705",
    ),
    (
        include_str!("data/fingerprint_full.json"),
        "c321f6a8917d092457129d12c03483f717c13345cd9bdd25c2d9ed9e6ce12850",
    ),
    (
        r#"{ "input" : [ { "value" : { "b" : [ 1.0 , 2.5 , -0 , 1e2 , 1E300 , 18446744073709551616 , -9007199254740993 ] , "a" : { "z" : null , "y" : true , "z" : false } } , "type" : "json" } ] , "ability" : "a" }"#,
        "5d9ee193b9ed6e22cd8c3fd910ad31370e27754cee3c415e891c9c9c60daa7ee",
    ),
    (
        r#"{"ability":"a","input":[{"type":"json","value":"caf\u00e9 \ud83d\ude00 \/ \" \\ \u0001 é"}],"extensions":{"\u0061":{"k\u00e9y":1,"kéy":2},"b":[],"c":{},"d":"x","e":0.1,"f":1.5e-7,"g":123456789012345678}}"#,
        "81cf08963a8518a4894ff2fa5f1db053c79e1dda9d37533cef30e3ffbc042a0e",
    ),
    (
        r#"{"ability":"a","input":[{"type":"text","text":"x"},{"type":"json","value":[[[[{"deep":[{"deeper":{"x":[1,2,{"y":"z"}]}}]}]]]]}],"metadata":{"b":"x","a":1.0,"c":true,"a":2,"d":-1.25e3},"extensions":{"tools":true,"x":{"deep":[1,{"y":null}]}},"deadline_ms":5.0,"routing":{"max_attempts":3.0,"provider_order":["p","q"]}}"#,
        "1dbc0d41ea6f8224b99d7c57adcbccd024274908bedbe0e81497b1a2354605ca",
    ),
    (
        r#"{"ability":"a","input":[{"type":"json","value":null},{"type":"json","value":0},{"type":"json","value":-1},{"type":"json","value":4.0e0}],"extensions":{"z":1,"y":{"x":{"w":{"v":{}}}},"z":[2]}}"#,
        "6939c8cdc01eb798afcfd52aeb20fa4a556a1b6482d99a0ee5cbd0fc93e1d7e9",
    ),
];

#[test]
fn fingerprints_of_the_same_request_never_change() {
    for (i, (body, pinned)) in PINNED.iter().enumerate() {
        let request = parse_request(body.as_bytes()).expect("valid request");
        assert_eq!(request_fingerprint(&request), *pinned, "body {i}");
    }
}
