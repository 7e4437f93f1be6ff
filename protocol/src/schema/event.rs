//! The event schema, written by hand: serde's flattened, internally tagged body does not map
//! onto a useful generated schema, and the allowed status depends on the type [R 44]. Shared by
//! `runtime-event.json` (under `$defs`) and the OpenAPI document (under components).

use schemars::SchemaGenerator;
use serde_json::{Map, Value, json};

use super::{reference, subschema};
use crate::RuntimeError;
use crate::event::{ExecutionStatus, OutputArtifact, ProgressPhase, Target};
use crate::id::ExecutionId;
use crate::time::Timestamp;
use crate::usage::UsageFact;

/// The event types in protocol order, with the definition name of each one's schema.
pub(super) const EVENT_TYPES: [(&str, &str); 11] = [
    ("execution.accepted", "ExecutionAcceptedEvent"),
    ("route.selected", "RouteSelectedEvent"),
    ("route.attempt_failed", "RouteAttemptFailedEvent"),
    ("output.delta", "OutputDeltaEvent"),
    ("tool.call.started", "ToolCallStartedEvent"),
    ("tool.call.arguments.delta", "ToolCallArgumentsDeltaEvent"),
    ("execution.progress", "ExecutionProgressEvent"),
    ("output.result", "OutputResultEvent"),
    ("usage.reported", "UsageReportedEvent"),
    ("execution.completed", "ExecutionCompletedEvent"),
    ("execution.failed", "ExecutionFailedEvent"),
];

/// Description, allowed status, body properties and the optional ones among them (every other
/// body property is required) of one event type.
type EventSpec = (
    &'static str,
    Value,
    Vec<(&'static str, Value)>,
    &'static [&'static str],
);

pub(super) struct EventSchemas {
    /// `{description, type, required, properties.type, oneOf}` (plus `discriminator` in OpenAPI).
    pub root: Value,
    /// One definition per event type.
    pub definitions: Map<String, Value>,
}

/// Builds the per-type event schemas by hand: serde's flattened, internally tagged body does not
/// map onto a useful generated schema, and the allowed status depends on the type [R 44].
pub(super) fn event_schemas(generator: &mut SchemaGenerator, prefix: &str) -> EventSchemas {
    // Register the shared sub-schemas under their own names.
    let target = subschema::<Target>(generator);
    let error = subschema::<RuntimeError>(generator);
    let fact = subschema::<UsageFact>(generator);
    let artifact = subschema::<OutputArtifact>(generator);
    let phase = subschema::<ProgressPhase>(generator);
    let execution_id = subschema::<ExecutionId>(generator);
    let time = subschema::<Timestamp>(generator);
    // Registers the status enum; each event narrows it [R 44].
    let _ = subschema::<ExecutionStatus>(generator);

    let attempt = json!({
        "type": "integer",
        "minimum": 1,
        "description": "1-based attempt number; a fallback attempt is the failed one plus 1."
    });
    let text = json!({ "type": "string" });
    let status_ref = reference(prefix, "ExecutionStatus");
    let status_is = |allowed: &[&str]| {
        let mut schema = status_ref.clone();
        if let (Value::Object(map), [only]) = (&mut schema, allowed) {
            map.insert("const".into(), (*only).into());
        } else if let Value::Object(map) = &mut schema {
            map.insert("enum".into(), allowed.into());
        }
        schema
    };

    // In EVENT_TYPES order: (description, status schema, body properties, optional body
    // properties).
    let events: [EventSpec; 11] = [
        (
            "The runtime accepted the request (always sequence 1).",
            status_is(&["accepted"]),
            vec![],
            &[],
        ),
        (
            "The runtime selected one provider/model attempt.",
            status_is(&["routing"]),
            vec![("target", target.clone()), ("attempt", attempt.clone())],
            &[],
        ),
        (
            "A retryable attempt failed; the next route.selected follows (fallback).",
            status_is(&["routing"]),
            vec![
                ("target", target.clone()),
                ("attempt", attempt),
                ("error", error.clone()),
            ],
            &[],
        ),
        (
            "Incremental output text of one output index.",
            status_is(&["running"]),
            vec![
                ("output_index", json!({ "type": "integer", "minimum": 0 })),
                ("delta", text.clone()),
            ],
            &[],
        ),
        (
            "A provider began a named tool call.",
            status_is(&["running"]),
            vec![("call_id", text.clone()), ("name", text.clone())],
            &[],
        ),
        (
            "A fragment of a tool call's arguments (JSON or text); callers accumulate before parsing.",
            status_is(&["running"]),
            vec![("call_id", text.clone()), ("delta", text)],
            &[],
        ),
        (
            "An asynchronous provider reports queued or processing progress.",
            status_is(&["running"]),
            vec![("phase", phase), ("progress", json!({ "type": "number" }))],
            &["progress"],
        ),
        (
            "A normalized asynchronous result with optional artifact references.",
            status_is(&["running"]),
            vec![
                (
                    "result",
                    json!({ "description": "Provider result (any JSON value)." }),
                ),
                ("artifacts", json!({ "type": "array", "items": artifact })),
            ],
            &["artifacts"],
        ),
        (
            "One or more usage facts became available; facts are listed, never summed.",
            status_is(&["running"]),
            vec![("facts", json!({ "type": "array", "items": fact }))],
            &[],
        ),
        (
            "The execution succeeded (terminal).",
            status_is(&["succeeded"]),
            vec![("target", target)],
            &[],
        ),
        (
            "The execution failed or was cancelled (terminal).",
            status_is(&["failed", "cancelled"]),
            vec![("error", error)],
            &[],
        ),
    ];

    let mut definitions = Map::new();
    let mut one_of = Vec::new();
    for ((type_name, def_name), (description, status, fields, optional)) in
        EVENT_TYPES.iter().zip(events)
    {
        let mut properties = Map::new();
        properties.insert(
            "type".into(),
            json!({ "type": "string", "const": type_name }),
        );
        properties.insert("status".into(), status);
        properties.insert("execution_id".into(), execution_id.clone());
        properties.insert(
            "sequence".into(),
            json!({
                "type": "integer",
                "minimum": 1,
                "description": "Execution-scoped, starts at 1, no gaps; assigned by the runtime."
            }),
        );
        properties.insert("time".into(), time.clone());
        let mut required: Vec<Value> = ["type", "status", "execution_id", "sequence", "time"]
            .into_iter()
            .map(Value::from)
            .collect();
        for (name, schema) in fields {
            if !optional.contains(&name) {
                required.push(name.into());
            }
            properties.insert(name.into(), schema);
        }
        definitions.insert(
            (*def_name).into(),
            json!({
                "title": type_name,
                "description": description,
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            }),
        );
        one_of.push(reference(prefix, def_name));
    }
    let types: Vec<Value> = EVENT_TYPES.iter().map(|(t, _)| Value::from(*t)).collect();
    let root = json!({
        "description": "One runtime event: the type-specific fields, then the runtime-owned envelope (status, execution_id, sequence, time). Discriminated by `type`.",
        "type": "object",
        "properties": { "type": { "type": "string", "enum": types } },
        "required": ["type", "status", "execution_id", "sequence", "time"],
        "oneOf": one_of,
    });
    EventSchemas { root, definitions }
}
