//! The file format without any real provider type: a stub catalog shows what this crate does
//! itself (root fields, dispatch by `type`, unique ids, defaults) and what it leaves to the
//! catalog. `providers/tests/deployment_file.rs` covers the real provider sections.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use config::deployment::parse;
use config::{ConfigError, DeploymentConfig, Fields, FlowLimits, Limits, ProviderCatalog};
use serde_json::Value;

/// Types `a` and `b`; a section has an optional `id` (default: the type name) and flow limits.
struct Stub;

#[derive(Debug, PartialEq)]
struct StubProvider {
    type_name: &'static str,
    id: String,
    flow: FlowLimits,
}

impl ProviderCatalog for Stub {
    type Provider = StubProvider;

    fn type_names(&self) -> Vec<&'static str> {
        vec!["a", "b"]
    }

    fn parse(
        &self,
        type_name: &str,
        section: &Value,
        path: String,
    ) -> Option<Result<StubProvider, ConfigError>> {
        let type_name = *self.type_names().iter().find(|t| **t == type_name)?;
        let parsed = (|| {
            let fields = Fields::open(
                section,
                path,
                &["type", "id", "max_concurrency", "max_queue_depth"],
            )?;
            Ok(StubProvider {
                type_name,
                id: fields.name("id", Some(type_name))?,
                flow: FlowLimits::parse(&fields)?,
            })
        })();
        Some(parsed)
    }

    fn id<'a>(&self, provider: &'a StubProvider) -> &'a str {
        &provider.id
    }
}

fn err(json: &str) -> String {
    parse(json, &Stub).unwrap_err().to_string()
}

#[test]
fn sections_are_dispatched_by_type_in_file_order() {
    let config = parse(
        r#"{"providers":[{"type":"b","max_concurrency":2},{"type":"a","id":"x"}]}"#,
        &Stub,
    )
    .unwrap();
    // Every other setting is at its default.
    assert_eq!(
        config,
        DeploymentConfig::with_providers(vec![
            StubProvider {
                type_name: "b",
                id: "b".into(),
                flow: FlowLimits {
                    max_concurrency: 2,
                    max_queue_depth: 64
                }
            },
            StubProvider {
                type_name: "a",
                id: "x".into(),
                flow: FlowLimits::CONFIG_DEFAULT
            }
        ])
    );
}

/// The documented defaults, written out as a file would: writing them changes nothing.
#[test]
fn defaults_are_the_documented_values() {
    let explicit = parse(
        r#"{"providers":[{"type":"a"}],"max_active_executions":1024,"retention_ms":86400000,
            "limits":{"max_body_bytes":1048576,"max_deadline_ms":86400000,
                      "default_deadline_ms":600000,"max_sse_streams":10000,
                      "header_timeout_ms":10000,"body_timeout_ms":30000,"idle_timeout_ms":60000},
            "event_store":{"type":"memory","max_executions":10000,"max_bytes":268435456,
                           "max_execution_bytes":4194304,"max_events":4096}}"#,
        &Stub,
    )
    .unwrap();
    assert_eq!(
        explicit,
        parse(r#"{"providers":[{"type":"a"}]}"#, &Stub).unwrap()
    );
    // A file cannot write `None`: the open-file limit minus a reserve.
    assert_eq!(Limits::default().max_connections, None);
}

#[test]
fn a_retention_shorter_than_the_longest_deadline_is_flagged() {
    let with = |extra: &str| {
        parse(
            &format!(r#"{{"providers":[{{"type":"a"}}]{extra}}}"#),
            &Stub,
        )
    };
    // The defaults (24 h each) and a retention at least the deadline are fine.
    assert!(!with("").unwrap().retention_below_max_deadline());
    assert!(
        !with(r#","retention_ms":3600000,"limits":{"max_deadline_ms":3600000,"default_deadline_ms":60000}"#)
            .unwrap()
            .retention_below_max_deadline()
    );
    // An hour of retention against the 24 h deadline a request may ask for: flagged, allowed.
    assert!(
        with(r#","retention_ms":3600000"#)
            .unwrap()
            .retention_below_max_deadline()
    );
    assert!(
        with(r#","event_store":{"type":"memory","retention_ms":1000}"#)
            .unwrap()
            .retention_below_max_deadline()
    );
}

#[test]
fn an_unknown_type_lists_the_catalog() {
    for provider in [r#"{"type":"c"}"#, r#"{"type":7}"#] {
        assert_eq!(
            err(&format!(r#"{{"providers":[{{"type":"a"}},{provider}]}}"#)),
            "providers[1].type must be one of a, b"
        );
    }
    assert_eq!(
        err(r#"{"providers":[{"id":"x"}]}"#),
        "providers[0].type is required"
    );
    assert_eq!(
        err(r#"{"providers":[[]]}"#),
        "providers[0] must be an object"
    );
}

#[test]
fn ids_are_unique_and_sections_are_the_catalogs() {
    assert_eq!(
        err(r#"{"providers":[{"type":"a"},{"type":"b","id":"a"}]}"#),
        "providers[1].id duplicates an earlier provider id"
    );
    assert_eq!(
        err(r#"{"providers":[{"type":"a","api_key":"sk-CANARY"}]}"#),
        "unsupported or unsafe field providers[0].api_key"
    );
    assert_eq!(
        err(r#"{"providers":[{"type":"a","max_queue_depth":-1}]}"#),
        "providers[0].max_queue_depth must be a non-negative integer"
    );
}

#[test]
fn root_fields_are_closed() {
    assert_eq!(
        err(r#"{"providers":[]}"#),
        "providers must be a non-empty array"
    );
    assert_eq!(err(r#"{}"#), "providers is required");
    assert_eq!(
        err(r#"{"providers":[{"type":"a"}],"api_key":"sk-CANARY"}"#),
        "unsupported or unsafe field api_key"
    );
    assert_eq!(err("[]"), "configuration root must be a JSON object");
}
