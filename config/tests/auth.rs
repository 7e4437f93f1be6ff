//! The `auth` section: tenants, quotas and key hashes, parsed strictly, with errors that name
//! paths and never echo a key hash or any other value.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use config::deployment::parse;
use config::{ConfigError, Fields, Scope, Scopes, TenantQuota};
use serde_json::{Value, json};

/// Providers are irrelevant here: one stub type with no fields.
struct Stub;

impl config::ProviderCatalog for Stub {
    type Provider = ();
    fn type_names(&self) -> Vec<&'static str> {
        vec!["a"]
    }
    fn parse(&self, _: &str, section: &Value, path: String) -> Option<Result<(), ConfigError>> {
        Some(Fields::open(section, path, &["type"]).map(|_| ()))
    }
    fn id<'a>(&self, _: &'a ()) -> &'a str {
        "a"
    }
}

const HASH_A: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
const HASH_B: &str = "FCDE2B2EDBA56BF408601FB721FE9B5C338D10EE429EA04FAE5511B68FBF8FB9";

fn file(auth: Value) -> String {
    json!({"providers": [{"type": "a"}], "auth": auth}).to_string()
}

fn auth(auth: Value) -> config::AuthConfig {
    parse(&file(auth), &Stub)
        .unwrap()
        .auth
        .expect("auth section")
}

fn err(auth: Value) -> String {
    parse(&file(auth), &Stub).unwrap_err().to_string()
}

fn key(id: &str, tenant: &str, hash: &str) -> Value {
    json!({"id": id, "tenant": tenant, "sha256": hash})
}

#[test]
fn the_contract_example_parses() {
    let parsed = auth(json!({
        "tenants": {"acme": {"max_active_executions": 100, "submits_per_second": 50, "burst": 100}},
        "keys": [{"id": "acme-ci", "tenant": "acme", "sha256": HASH_A,
                  "scopes": ["submit", "read", "cancel"]}]
    }));
    assert_eq!(
        parsed.tenants["acme"],
        TenantQuota {
            max_active_executions: Some(100),
            submits_per_second: Some(50.0),
            burst: Some(100),
        }
    );
    let entry = &parsed.keys[0];
    assert_eq!(
        (entry.id.as_str(), entry.tenant.as_str()),
        ("acme-ci", "acme")
    );
    assert_eq!(hex::encode(entry.sha256), HASH_A);
    assert_eq!(entry.scopes, Scopes::ALL);
}

#[test]
fn defaults_no_auth_all_scopes_and_burst_from_the_rate() {
    let none = parse(&json!({"providers": [{"type": "a"}]}).to_string(), &Stub).unwrap();
    assert_eq!(none.auth, None);
    let parsed = auth(json!({
        "tenants": {"t": {"submits_per_second": 2.5}, "u": {}},
        "keys": [key("k1", "t", HASH_A),
                 {"id": "k2", "tenant": "u", "sha256": HASH_B, "scopes": ["read"]}]
    }));
    assert_eq!(parsed.tenants["t"].burst, Some(3), "ceil(2.5)");
    assert_eq!(parsed.tenants["u"], TenantQuota::default());
    assert_eq!(parsed.keys[0].scopes, Scopes::ALL);
    assert!(parsed.keys[1].scopes.contains(Scope::Read));
    assert!(!parsed.keys[1].scopes.contains(Scope::Submit));
    // Uppercase hex is the same hash.
    assert_eq!(hex::encode_upper(parsed.keys[1].sha256), HASH_B);
    let monitor = auth(json!({
        "tenants": {"t": {}},
        "keys": [{"id": "m", "tenant": "t", "sha256": HASH_A, "scopes": []}]
    }));
    assert_eq!(monitor.keys[0].scopes, Scopes::NONE);
}

#[test]
fn bad_sections_are_refused_with_their_path() {
    let t = || json!({"t": {}});
    let cases = [
        (json!([]), "auth must be an object"),
        (
            json!({"keys": [key("k", "t", HASH_A)]}),
            "auth.tenants is required",
        ),
        (json!({"tenants": t()}), "auth.keys is required"),
        (
            json!({"tenants": t(), "keys": []}),
            "auth.keys must be a non-empty array",
        ),
        (
            json!({"tenants": t(), "keys": [], "extra": 1}),
            "unsupported or unsafe field auth.extra",
        ),
        (
            json!({"tenants": {"a b": {}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants[\"a b\"] is not a valid tenant name",
        ),
        (
            json!({"tenants": {"t": {"max_active_executions": 0}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants.t.max_active_executions must be a positive integer",
        ),
        (
            json!({"tenants": {"t": {"submits_per_second": 0}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants.t.submits_per_second must be a positive number",
        ),
        (
            json!({"tenants": {"t": {"submits_per_second": -1}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants.t.submits_per_second must be a positive number",
        ),
        (
            json!({"tenants": {"t": {"submits_per_second": "5"}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants.t.submits_per_second must be a positive number",
        ),
        (
            json!({"tenants": {"t": {"burst": 5}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants.t.burst requires submits_per_second",
        ),
        (
            json!({"tenants": {"t": {"submits_per_second": 1, "burst": 0}}, "keys": [key("k", "t", HASH_A)]}),
            "auth.tenants.t.burst must be a positive integer",
        ),
        (
            json!({"tenants": {"t": {"quota": 1}}, "keys": [key("k", "t", HASH_A)]}),
            "unsupported or unsafe field auth.tenants.t.quota",
        ),
        (
            json!({"tenants": t(), "keys": [key("k", "other", HASH_A)]}),
            "auth.keys[0].tenant must name a tenant listed in auth.tenants",
        ),
        (
            json!({"tenants": t(), "keys": [key("k k", "t", HASH_A)]}),
            "auth.keys[0].id must be 1 to 64",
        ),
        (
            json!({"tenants": t(), "keys": [{"tenant": "t", "sha256": HASH_A}]}),
            "auth.keys[0].id is required",
        ),
        (
            json!({"tenants": t(), "keys": [key("k", "t", HASH_A), key("k", "t", HASH_B)]}),
            "auth.keys[1].id repeats the id of an earlier key",
        ),
        (
            json!({"tenants": t(), "keys": [key("k", "t", HASH_A), key("j", "t", &HASH_A.to_uppercase())]}),
            "auth.keys[1].sha256 repeats the hash of an earlier key",
        ),
        (
            json!({"tenants": t(), "keys": [{"id": "k", "tenant": "t", "sha256": HASH_A, "scopes": ["admin"]}]}),
            "auth.keys[0].scopes[0] must be one of submit, read, cancel",
        ),
        (
            json!({"tenants": t(), "keys": [{"id": "k", "tenant": "t", "sha256": HASH_A, "scopes": ["read", "read"]}]}),
            "auth.keys[0].scopes[1] repeats an earlier scope",
        ),
        (
            json!({"tenants": t(), "keys": [{"id": "k", "tenant": "t", "sha256": HASH_A, "key": "mrt_secret"}]}),
            "unsupported or unsafe field auth.keys[0].key",
        ),
    ];
    for (section, expected) in cases {
        let message = err(section.clone());
        assert!(message.starts_with(expected), "{section}: {message}");
    }
}

#[test]
fn malformed_hashes_are_refused_without_echoing_them() {
    let secretish = "mrt_thisIsAPlaintextKeyPastedByMistake0123456789abcdefABCDEF";
    for bad in [
        json!(secretish),
        json!(&HASH_A[..63]),
        json!(format!("{HASH_A}0")),
        json!(HASH_A.replace('2', "g")),
        json!(7),
    ] {
        let message =
            err(json!({"tenants": {"t": {}}, "keys": [{"id": "k", "tenant": "t", "sha256": bad}]}));
        assert!(
            message.starts_with("auth.keys[0].sha256 must be"),
            "{message}"
        );
        assert!(
            !message.contains("mrt_") && !message.contains(&HASH_A[..16]),
            "{message}"
        );
    }
}

#[test]
fn debug_output_never_shows_a_hash() {
    let parsed = auth(json!({"tenants": {"t": {}}, "keys": [key("k", "t", HASH_A)]}));
    let debug = format!("{parsed:?}");
    assert!(
        debug.contains("\"k\"") && debug.contains("submit"),
        "{debug}"
    );
    assert!(!debug.to_lowercase().contains(&HASH_A[..8]), "{debug}");
    let bytes = format!("{:?}", parsed.keys[0].sha256[0]);
    assert!(!debug.contains(&format!("[{bytes},")), "{debug}");
}
