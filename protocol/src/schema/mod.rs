//! JSON Schema and OpenAPI documents generated from the wire types (`spec/`).
//!
//! - [`execution_request_schema`] → `spec/schema/execution-request.json` (normative request
//!   schema: the validator in [`crate::validate`] must agree with it, which the `spec_drift`
//!   test checks case by case and by property test).
//! - [`runtime_event_schema`] → `spec/schema/runtime-event.json`: the eleven events as a `oneOf`
//!   discriminated by a `type` const, each with its allowed `status` [R 44] and fields [R 45].
//! - [`openapi_document`] → `spec/openapi.yaml` (OpenAPI 3.1, rendered by [`render_yaml`]).
//!
//! Everything is generated with schemars (draft 2020-12 settings) and then normalized:
//! - optional properties never admit `null` (the request validator rejects `null` for every
//!   optional field, and responses omit unset optional keys instead of writing `null`); a
//!   *required* nullable property, such as `target` in the result response, keeps its `null`;
//! - Rust-specific `format`s (`uint32`, `double`, ...) are dropped: the `type` and bounds say it;
//! - execution ids carry `format: uuid`.
//!
//! Request schemas describe what is *deserialized*; response and event schemas describe what is
//! *serialized*. Output is deterministic: [`render_json`] and [`render_yaml`] order keys with a
//! fixed keyword order (then alphabetically) whatever map type `serde_json` was built with.
//!
//! Submodules: `event` (the hand-written event schemas), `openapi` (the document), `normalize`
//! (the fix-ups above), `render` (JSON and YAML text). All of it is behind the `schema`
//! feature: only the spec drift test and tools need it, never the binaries.

mod event;
mod normalize;
mod openapi;
mod render;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

pub use openapi::openapi_document;
pub use render::{render_json, render_yaml};

use self::event::event_schemas;
use self::normalize::normalize;
use crate::manifest::ProviderList;
use crate::request::ExecutionRequest;
use crate::snapshot::ExecutionSnapshot;

/// The JSON Schema dialect of every generated schema.
pub const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";
/// `$id` of the request schema.
pub const EXECUTION_REQUEST_SCHEMA_ID: &str =
    "https://model-runtime.dev/schema/execution-request.json";
/// `$id` of the event schema.
pub const RUNTIME_EVENT_SCHEMA_ID: &str = "https://model-runtime.dev/schema/runtime-event.json";

/// The spec files, relative to the repository's `spec/` directory, with their content.
pub fn spec_files() -> Vec<(&'static str, String)> {
    vec![
        (
            "schema/execution-request.json",
            render_json(&execution_request_schema()),
        ),
        (
            "schema/runtime-event.json",
            render_json(&runtime_event_schema()),
        ),
        ("openapi.yaml", render_yaml(&openapi_document())),
    ]
}

const DEFS: &str = "/$defs";
const COMPONENTS: &str = "/components/schemas";

fn generator(definitions_path: &'static str, serialize: bool) -> SchemaGenerator {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = definitions_path.into();
    });
    let settings = if serialize {
        settings.for_serialize()
    } else {
        settings.for_deserialize()
    };
    settings.into_generator()
}

/// `"#/$defs/"` or `"#/components/schemas/"`.
fn ref_prefix(definitions_path: &str) -> String {
    format!("#{definitions_path}/")
}

fn subschema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Value {
    generator.subschema_for::<T>().to_value()
}

fn reference(prefix: &str, name: &str) -> Value {
    json!({ "$ref": format!("{prefix}{name}") })
}

/// The execution request schema (`spec/schema/execution-request.json`).
pub fn execution_request_schema() -> Value {
    let mut generator = generator(DEFS, false);
    let root = generator.root_schema_for::<ExecutionRequest>();
    let definitions = take_definitions(&mut generator);
    let mut value = root.to_value();
    if let Value::Object(map) = &mut value {
        map.insert("$schema".into(), DRAFT_2020_12.into());
        map.insert("$id".into(), EXECUTION_REQUEST_SCHEMA_ID.into());
        map.insert("$defs".into(), Value::Object(definitions));
    }
    normalize(&mut value);
    value
}

/// The runtime event schema (`spec/schema/runtime-event.json`).
pub fn runtime_event_schema() -> Value {
    let mut generator = generator(DEFS, true);
    let events = event_schemas(&mut generator, &ref_prefix(DEFS));
    let mut definitions = take_definitions(&mut generator);
    definitions.extend(events.definitions);
    let mut root = Map::new();
    root.insert("$schema".into(), DRAFT_2020_12.into());
    root.insert("$id".into(), RUNTIME_EVENT_SCHEMA_ID.into());
    root.insert("title".into(), "RuntimeEvent".into());
    if let Value::Object(body) = events.root {
        root.extend(body);
    }
    root.insert("$defs".into(), Value::Object(definitions));
    let mut value = Value::Object(root);
    normalize(&mut value);
    value
}

/// Takes the generator's definitions and fixes up the ones that need more than schemars says.
fn take_definitions(generator: &mut SchemaGenerator) -> Map<String, Value> {
    let mut definitions = std::mem::take(generator.definitions_mut());
    if let Some(Value::Object(id)) = definitions.get_mut("ExecutionId") {
        id.insert("format".into(), "uuid".into());
    }
    definitions
}

/// Definitions that appear under both contracts in [`openapi_document`] with different content
/// (expected: none). Exposed for tests.
pub fn openapi_contract_conflicts() -> Vec<String> {
    let mut request_gen = generator(COMPONENTS, false);
    let _ = request_gen.subschema_for::<ExecutionRequest>();
    let mut response_gen = generator(COMPONENTS, true);
    let _ = response_gen.subschema_for::<ExecutionSnapshot>();
    let _ = response_gen.subschema_for::<ProviderList>();
    let requests = take_definitions(&mut request_gen);
    let responses: BTreeMap<_, _> = take_definitions(&mut response_gen).into_iter().collect();
    requests
        .into_iter()
        .filter(|(name, schema)| responses.get(name).is_some_and(|other| other != schema))
        .map(|(name, _)| name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_is_deterministic_and_ends_with_newline() {
        let a = render_json(&execution_request_schema());
        let b = render_json(&execution_request_schema());
        assert_eq!(a, b);
        assert!(a.ends_with("}\n"));
        assert!(a.starts_with("{\n  \"$schema\": "));
        let parsed: Value = serde_json::from_str(&a).unwrap_or_default();
        assert_eq!(parsed, execution_request_schema());
    }

    #[test]
    fn optional_properties_are_not_nullable_but_required_ones_may_be() {
        let doc = openapi_document();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["ExecutionSnapshot"]["properties"]["target"]["$ref"],
            "#/components/schemas/Target"
        );
        // Always serialized, possibly null.
        assert!(schemas["ExecutionResultResponse"]["properties"]["target"]["anyOf"].is_array());
        let request = execution_request_schema();
        assert_eq!(request["properties"]["deadline_ms"]["type"], "integer");
        assert_eq!(
            request["$defs"]["Requirements"]["properties"]["stream"]["type"],
            "boolean"
        );
    }

    #[test]
    fn request_and_response_contracts_agree_on_shared_definitions() {
        assert_eq!(openapi_contract_conflicts(), Vec::<String>::new());
    }
}
