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

use std::collections::BTreeMap;

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::error::ErrorResponse;
use crate::event::{ExecutionStatus, OutputArtifact, ProgressPhase, Target};
use crate::id::ExecutionId;
use crate::manifest::ProviderList;
use crate::request::ExecutionRequest;
use crate::snapshot::{
    CancelResponse, ExecutionResultResponse, ExecutionSnapshot, ExecutionSubmission,
    ResultNotReady, RuntimeInfo,
};
use crate::time::Timestamp;
use crate::usage::UsageFact;
use crate::{PROTOCOL_VERSION, RuntimeError};

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

/// The event types in protocol order, with the definition name of each one's schema.
const EVENT_TYPES: [(&str, &str); 11] = [
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

/// Description, allowed status, body properties and required body properties of one event type.
type EventSpec = (
    &'static str,
    Value,
    Vec<(&'static str, Value)>,
    Vec<&'static str>,
);

struct EventSchemas {
    /// `{description, type, required, properties.type, oneOf}` (plus `discriminator` in OpenAPI).
    root: Value,
    /// One definition per event type.
    definitions: Map<String, Value>,
}

/// Builds the per-type event schemas by hand: serde's flattened, internally tagged body does not
/// map onto a useful generated schema, and the allowed status depends on the type [R 44].
fn event_schemas(generator: &mut SchemaGenerator, prefix: &str) -> EventSchemas {
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

    // In EVENT_TYPES order: (description, status schema, body properties, required body
    // properties).
    let events: [EventSpec; 11] = [
        (
            "The runtime accepted the request (always sequence 1).",
            status_is(&["accepted"]),
            vec![],
            vec![],
        ),
        (
            "The runtime selected one provider/model attempt.",
            status_is(&["routing"]),
            vec![("target", target.clone()), ("attempt", attempt.clone())],
            vec!["target", "attempt"],
        ),
        (
            "A retryable attempt failed; the next route.selected follows (fallback).",
            status_is(&["routing"]),
            vec![
                ("target", target.clone()),
                ("attempt", attempt),
                ("error", error.clone()),
            ],
            vec!["target", "attempt", "error"],
        ),
        (
            "Incremental output text of one output index.",
            status_is(&["running"]),
            vec![
                ("output_index", json!({ "type": "integer", "minimum": 0 })),
                ("delta", text.clone()),
            ],
            vec!["output_index", "delta"],
        ),
        (
            "A provider began a named tool call.",
            status_is(&["running"]),
            vec![("call_id", text.clone()), ("name", text.clone())],
            vec!["call_id", "name"],
        ),
        (
            "A fragment of a tool call's arguments (JSON or text); callers accumulate before parsing.",
            status_is(&["running"]),
            vec![("call_id", text.clone()), ("delta", text)],
            vec!["call_id", "delta"],
        ),
        (
            "An asynchronous provider reports queued or processing progress.",
            status_is(&["running"]),
            vec![("phase", phase), ("progress", json!({ "type": "number" }))],
            vec!["phase"],
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
            vec!["result"],
        ),
        (
            "One or more usage facts became available; facts are listed, never summed.",
            status_is(&["running"]),
            vec![("facts", json!({ "type": "array", "items": fact }))],
            vec!["facts"],
        ),
        (
            "The execution succeeded (terminal).",
            status_is(&["succeeded"]),
            vec![("target", target)],
            vec!["target"],
        ),
        (
            "The execution failed or was cancelled (terminal).",
            status_is(&["failed", "cancelled"]),
            vec![("error", error)],
            vec!["error"],
        ),
    ];

    let mut definitions = Map::new();
    let mut one_of = Vec::new();
    for ((type_name, def_name), (description, status, fields, required_fields)) in
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
            properties.insert(name.into(), schema);
        }
        required.extend(required_fields.into_iter().map(Value::from));
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

// ---------------------------------------------------------------------------------------------
// OpenAPI
// ---------------------------------------------------------------------------------------------

/// The OpenAPI 3.1 document (`spec/openapi.yaml`) for every endpoint of the HTTP API.
pub fn openapi_document() -> Value {
    let prefix = ref_prefix(COMPONENTS);
    let p = prefix.as_str();

    // Requests are described as deserialized, responses and events as serialized.
    let mut request_gen = generator(COMPONENTS, false);
    let _ = request_gen.subschema_for::<ExecutionRequest>();
    let mut response_gen = generator(COMPONENTS, true);
    // Registering is all that is needed: the schemas land in the components.
    let _ = subschema::<ExecutionSnapshot>(&mut response_gen);
    let _ = subschema::<ExecutionSubmission>(&mut response_gen);
    let _ = subschema::<ExecutionResultResponse>(&mut response_gen);
    let _ = subschema::<ResultNotReady>(&mut response_gen);
    let _ = subschema::<CancelResponse>(&mut response_gen);
    let _ = subschema::<RuntimeInfo>(&mut response_gen);
    let _ = subschema::<ProviderList>(&mut response_gen);
    let _ = subschema::<ErrorResponse>(&mut response_gen);
    let events = event_schemas(&mut response_gen, p);

    let mut schemas = take_definitions(&mut request_gen);
    // Shared names (e.g. `Modality`) generate identically under both contracts; responses win
    // if they ever differ, and a test checks that they do not.
    schemas.extend(take_definitions(&mut response_gen));
    schemas.extend(events.definitions);
    let mut event_root = events.root;
    if let Value::Object(map) = &mut event_root {
        map.insert("title".into(), "RuntimeEvent".into());
        let mapping: Map<String, Value> = EVENT_TYPES
            .iter()
            .map(|(t, d)| ((*t).to_owned(), Value::from(format!("{p}{d}"))))
            .collect();
        map.insert(
            "discriminator".into(),
            json!({ "propertyName": "type", "mapping": mapping }),
        );
    }
    schemas.insert("RuntimeEvent".into(), event_root);
    schemas.insert("RuntimeEventFrame".into(), sse_frame_schema(p));
    schemas.insert(
        "NotFoundError".into(),
        json!({
            "description": "404 body. Unknown executions and routes; the reference omits `retryable` here, this runtime may send `retryable: false`.",
            "type": "object",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "code": { "type": "string", "const": "not_found" },
                        "message": { "type": "string" },
                        "retryable": { "type": "boolean", "const": false }
                    },
                    "required": ["code", "message"]
                }
            },
            "required": ["error"]
        }),
    );

    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Model Runtime API",
            "version": PROTOCOL_VERSION,
            "summary": "Provider-neutral AI model execution runtime.",
            "description": "Submit an execution request, then follow its ordered, resumable event log over SSE, read its materialized snapshot and result, or cancel it. Wire-compatible with Model Runtime API 0.1.0; status codes are finer than the reference's (see docs/contract.md). Every JSON response carries `cache-control: no-store` and `x-content-type-options: nosniff`; error messages are fixed sentences that never echo caller input.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" }
        },
        "jsonSchemaDialect": DRAFT_2020_12,
        "servers": [{ "url": "http://127.0.0.1:4320", "description": "Default local gateway" }],
        "tags": [
            { "name": "executions", "description": "Submit, observe and cancel executions." },
            { "name": "runtime", "description": "Runtime and provider information." },
            { "name": "operations", "description": "Health, readiness and metrics." }
        ],
        "paths": openapi_paths(p),
        "components": {
            "schemas": schemas,
            "parameters": openapi_parameters(),
            "headers": {
                "CacheControl": {
                    "description": "Responses are never cached.",
                    "required": true,
                    "schema": { "type": "string", "const": "no-store" }
                },
                "ContentTypeOptions": {
                    "description": "MIME sniffing is disabled.",
                    "required": true,
                    "schema": { "type": "string", "const": "nosniff" }
                },
                "RetryAfter": {
                    "description": "Seconds to wait before retrying.",
                    "required": true,
                    "schema": { "type": "integer", "minimum": 0 }
                }
            },
            "responses": openapi_responses(p),
        }
    });
    normalize(&mut doc);
    doc
}

/// One SSE frame on the events stream: `id: <sequence>\nevent: <type>\ndata: <event json>\n\n`.
fn sse_frame_schema(p: &str) -> Value {
    let types: Vec<Value> = EVENT_TYPES.iter().map(|(t, _)| Value::from(*t)).collect();
    json!({
        "description": "One server-sent event of the stream, framed `id: <sequence>\\nevent: <type>\\ndata: <event json>\\n\\n`: `id` is the event's sequence, `event` its type and `data` the event JSON on one line. Events with a sequence larger than the cursor are replayed, then live ones follow; the stream closes after the terminal event. Keep-alive comment lines (`: keep-alive`) may appear between events.",
        "type": "object",
        "properties": {
            "id": { "type": "string", "pattern": "^[1-9][0-9]*$" },
            "event": { "type": "string", "enum": types },
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": reference(p, "RuntimeEvent")
            }
        },
        "required": ["id", "event", "data"]
    })
}

fn openapi_parameters() -> Value {
    json!({
        "ExecutionId": {
            "name": "id",
            "in": "path",
            "required": true,
            "description": "Execution id (canonical hyphenated UUID). Anything that is not a UUID is 404, the same as an unknown id.",
            "schema": { "type": "string", "format": "uuid" }
        },
        "IdempotencyKey": {
            "name": "Idempotency-Key",
            "in": "header",
            "required": false,
            "description": "1-256 visible ASCII characters. The same key with the same request (compared canonically) returns the same execution (200, `idempotent_replay: true`); with a different request, 422 `idempotency_conflict`. A malformed key is 400.",
            "schema": { "type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[!-~]+$" }
        },
        "Accept": {
            "name": "Accept",
            "in": "header",
            "required": false,
            "description": "Documentation only (OpenAPI tools ignore `Accept` parameters): a value containing `text/event-stream` makes the submission answer 200 with the event stream from sequence 1 instead of JSON, also on replays.",
            "schema": { "type": "string" }
        },
        "After": {
            "name": "after",
            "in": "query",
            "required": false,
            "description": "Cursor: only events with a larger sequence are sent. Wins over `Last-Event-ID`. Default 0. A cursor at or past the terminal event gives an empty stream.",
            "schema": { "type": "integer", "minimum": 0, "maximum": 9_007_199_254_740_991_u64 }
        },
        "LastEventId": {
            "name": "Last-Event-ID",
            "in": "header",
            "required": false,
            "description": "Cursor sent by reconnecting SSE clients; ignored when `after` is given. Anything but a non-negative integer is 400.",
            "schema": { "type": "integer", "minimum": 0, "maximum": 9_007_199_254_740_991_u64 }
        }
    })
}

/// A JSON response with the standard headers.
fn json_response(description: &str, schema: Value) -> Value {
    json!({
        "description": description,
        "headers": {
            "Cache-Control": { "$ref": "#/components/headers/CacheControl" },
            "X-Content-Type-Options": { "$ref": "#/components/headers/ContentTypeOptions" }
        },
        "content": { "application/json": { "schema": schema } }
    })
}

/// `ErrorResponse` narrowed to the given codes and retryability.
fn error_schema(p: &str, codes: &[&str], retryable: bool) -> Value {
    let code = if let [only] = codes {
        json!({ "const": only })
    } else {
        json!({ "enum": codes })
    };
    json!({
        "allOf": [
            reference(p, "ErrorResponse"),
            { "properties": { "error": { "properties": {
                "code": code,
                "retryable": { "const": retryable }
            } } } }
        ]
    })
}

/// The events stream. In OpenAPI 3.1 the `schema` of a sequential media type such as
/// `text/event-stream` is read by tools (schemathesis among them) as the schema of each event,
/// which OpenAPI 3.2 calls `itemSchema`; each event is `{id, event, data}`.
fn sse_content(p: &str) -> Value {
    json!({ "schema": reference(p, "RuntimeEventFrame") })
}

fn response_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/responses/{name}") })
}

fn openapi_responses(p: &str) -> Value {
    json!({
        "InvalidRequest": json_response(
            "`invalid_request`: malformed JSON, schema violation, bad cursor or bad header.",
            error_schema(p, &["invalid_request"], false),
        ),
        "NotFound": {
            "description": "`not_found`: unknown execution (or an id that is not a UUID).",
            "headers": {
                "Cache-Control": { "$ref": "#/components/headers/CacheControl" },
                "X-Content-Type-Options": { "$ref": "#/components/headers/ContentTypeOptions" }
            },
            "content": { "application/json": { "schema": reference(p, "NotFoundError") } }
        },
        "Unavailable": json_response(
            "`unavailable`: a backend (NATS, Redis) is unreachable, or the runtime is shutting down.",
            error_schema(p, &["unavailable"], true),
        ),
        "InternalError": json_response(
            "`internal_error`: a bug; the message is generic and details are only logged.",
            error_schema(p, &["internal_error"], false),
        ),
    })
}

fn openapi_paths(p: &str) -> Value {
    let execution_id = json!({ "$ref": "#/components/parameters/ExecutionId" });
    let accepted_submission = json!({
        "allOf": [
            reference(p, "ExecutionSubmission"),
            { "properties": {
                "status": { "const": "accepted" },
                "idempotent_replay": { "const": false }
            } }
        ]
    });
    let replayed_submission = json!({
        "allOf": [
            reference(p, "ExecutionSubmission"),
            { "properties": { "idempotent_replay": { "const": true } } }
        ]
    });
    let mut replay = json_response(
        "Idempotent replay: the existing execution with its current status. With `Accept: text/event-stream` (new or replayed execution), the event stream from sequence 1 instead.",
        replayed_submission,
    );
    if let Some(Value::Object(content)) = replay.get_mut("content") {
        content.insert("text/event-stream".into(), sse_content(p));
    }
    json!({
        "/v1/runtime": {
            "get": {
                "tags": ["runtime"],
                "operationId": "getRuntime",
                "summary": "Runtime information and readiness",
                "responses": {
                    "200": json_response("The runtime is ready.", json!({
                        "allOf": [reference(p, "RuntimeInfo"), { "properties": { "state": { "const": "ready" } } }]
                    })),
                    "503": json_response("The runtime is stopping or a backend is unavailable; same body.", json!({
                        "allOf": [reference(p, "RuntimeInfo"), { "properties": { "state": { "enum": ["stopping", "unavailable"] } } }]
                    })),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/v1/providers": {
            "get": {
                "tags": ["runtime"],
                "operationId": "listProviders",
                "summary": "Configured provider manifests",
                "responses": {
                    "200": json_response("The manifests from the deployment file.", reference(p, "ProviderList")),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/v1/executions": {
            "post": {
                "tags": ["executions"],
                "operationId": "createExecution",
                "summary": "Submit an execution",
                "description": "Returns once `execution.accepted` (sequence 1) is stored. Requests no configured model can serve are rejected synchronously with 422 `capability_unavailable` and nothing is created.",
                "parameters": [
                    { "$ref": "#/components/parameters/IdempotencyKey" },
                    { "$ref": "#/components/parameters/Accept" }
                ],
                "requestBody": {
                    "required": true,
                    "content": { "application/json": { "schema": reference(p, "ExecutionRequest") } }
                },
                "responses": {
                    "202": json_response("A new execution was accepted.", accepted_submission),
                    "200": replay,
                    "400": response_ref("InvalidRequest"),
                    "413": json_response(
                        "`invalid_request`: the body exceeds the limit (1 MiB by default).",
                        error_schema(p, &["invalid_request"], false),
                    ),
                    "415": json_response(
                        "`invalid_request`: the Content-Type is not `application/json`.",
                        error_schema(p, &["invalid_request"], false),
                    ),
                    "422": json_response(
                        "`idempotency_conflict` (the key was used with a different request) or `capability_unavailable` (no configured model serves the ability with the required and inferred capabilities).",
                        error_schema(p, &["idempotency_conflict", "capability_unavailable"], false),
                    ),
                    "429": {
                        "description": "`queue_full`: admission limits reached.",
                        "headers": {
                            "Cache-Control": { "$ref": "#/components/headers/CacheControl" },
                            "X-Content-Type-Options": { "$ref": "#/components/headers/ContentTypeOptions" },
                            "Retry-After": { "$ref": "#/components/headers/RetryAfter" }
                        },
                        "content": { "application/json": { "schema": error_schema(p, &["queue_full"], true) } }
                    },
                    "503": response_ref("Unavailable"),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/v1/executions/{id}": {
            "parameters": [execution_id.clone()],
            "get": {
                "tags": ["executions"],
                "operationId": "getExecution",
                "summary": "The materialized snapshot of an execution",
                "responses": {
                    "200": json_response("The snapshot; optional keys are omitted when unset.", reference(p, "ExecutionSnapshot")),
                    "404": response_ref("NotFound"),
                    "503": response_ref("Unavailable"),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/v1/executions/{id}/result": {
            "parameters": [execution_id.clone()],
            "get": {
                "tags": ["executions"],
                "operationId": "getExecutionResult",
                "summary": "The result of a succeeded execution",
                "responses": {
                    "200": json_response("The execution succeeded; `artifacts` defaults to `[]`.", reference(p, "ExecutionResultResponse")),
                    "409": json_response("The execution has not succeeded (yet): its status, and its error once failed or cancelled.", reference(p, "ResultNotReady")),
                    "404": response_ref("NotFound"),
                    "503": response_ref("Unavailable"),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/v1/executions/{id}/cancel": {
            "parameters": [execution_id.clone()],
            "post": {
                "tags": ["executions"],
                "operationId": "cancelExecution",
                "summary": "Request cancellation",
                "description": "The execution ends with `execution.failed` (status `cancelled`) unless it finishes first.",
                "responses": {
                    "202": json_response("Cancellation was requested.", json!({
                        "allOf": [reference(p, "CancelResponse"), { "properties": { "status": { "const": "cancellation_requested" } } }]
                    })),
                    "404": json_response("Unknown or already terminal execution.", json!({
                        "allOf": [reference(p, "CancelResponse"), { "properties": { "status": { "const": "not_found" } } }]
                    })),
                    "503": response_ref("Unavailable"),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/v1/executions/{id}/events": {
            "parameters": [execution_id],
            "get": {
                "tags": ["executions"],
                "operationId": "streamExecutionEvents",
                "summary": "Replay and follow the event log (SSE)",
                "description": "Events with a sequence larger than the cursor are replayed, then live events follow; the stream closes after the terminal event. `: keep-alive` comments are sent every 15 s while idle. A failure after the headers ends the stream without a partial frame; clients resume from their last sequence.",
                "parameters": [
                    { "$ref": "#/components/parameters/After" },
                    { "$ref": "#/components/parameters/LastEventId" }
                ],
                "responses": {
                    "200": {
                        "description": "The event stream (empty and closed when the cursor is at or past the terminal event).",
                        "content": { "text/event-stream": sse_content(p) }
                    },
                    "400": response_ref("InvalidRequest"),
                    "404": response_ref("NotFound"),
                    "503": response_ref("Unavailable"),
                    "500": response_ref("InternalError")
                }
            }
        },
        "/healthz": {
            "get": {
                "tags": ["operations"],
                "operationId": "healthz",
                "summary": "Liveness",
                "responses": {
                    "200": { "description": "The process is alive." },
                    "503": { "description": "The process is shutting down." }
                }
            }
        },
        "/readyz": {
            "get": {
                "tags": ["operations"],
                "operationId": "readyz",
                "summary": "Readiness (checks the backends)",
                "responses": {
                    "200": { "description": "Ready to accept executions." },
                    "503": { "description": "A backend is unreachable or the runtime is shutting down." }
                }
            }
        },
        "/metrics": {
            "get": {
                "tags": ["operations"],
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format.",
                        "content": { "text/plain": { "schema": { "type": "string" } } }
                    }
                }
            }
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

/// Formats schemars derives from Rust types that are not JSON Schema / OpenAPI formats.
const RUST_FORMATS: [&str; 14] = [
    "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32",
    "uint64", "uint128", "float", "double",
];

/// Applies the fix-ups described in the module docs to a whole document.
fn normalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if matches!(map.get("format"), Some(Value::String(f)) if RUST_FORMATS.contains(&f.as_str()))
            {
                map.remove("format");
            }
            let required: Vec<String> = match map.get("required") {
                Some(Value::Array(names)) => names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            };
            if let Some(Value::Object(properties)) = map.get_mut("properties") {
                for (name, schema) in properties.iter_mut() {
                    if !required.contains(name) {
                        strip_null(schema);
                    }
                }
            }
            for child in map.values_mut() {
                normalize(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Removes `null` from a property schema: from a `type` list, from an `enum`, or an
/// `anyOf: [X, {"type": "null"}]` becomes `X` (keeping the property's own keywords).
fn strip_null(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    let new_type = match map.get("type") {
        Some(Value::Array(types)) if types.iter().any(|t| t == "null") => {
            let mut rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
            Some(if rest.len() == 1 {
                rest.remove(0)
            } else {
                Value::Array(rest)
            })
        }
        _ => None,
    };
    if let Some(t) = new_type {
        map.insert("type".into(), t);
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    let is_null = |s: &Value| *s == json!({ "type": "null" });
    let replacement = match map.get("anyOf") {
        Some(Value::Array(options)) if options.len() == 2 && options.iter().any(is_null) => {
            options.iter().find(|s| !is_null(s)).cloned()
        }
        _ => None,
    };
    if let Some(inner) = replacement {
        map.remove("anyOf");
        if let Value::Object(inner) = inner {
            for (k, v) in inner {
                map.entry(k).or_insert(v);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

/// Keys that come first, in this order; every other key follows alphabetically.
const KEY_ORDER: &[&str] = &[
    "openapi",
    "info",
    "jsonSchemaDialect",
    "servers",
    "tags",
    "paths",
    "components",
    "$schema",
    "$id",
    "$ref",
    "name",
    "in",
    "operationId",
    "title",
    "summary",
    "description",
    "version",
    "license",
    "identifier",
    "url",
    "type",
    "const",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "properties",
    "additionalProperties",
    "required",
    "allOf",
    "anyOf",
    "oneOf",
    "discriminator",
    "contentMediaType",
    "contentSchema",
    "parameters",
    "requestBody",
    "headers",
    "content",
    "schema",
    "responses",
    "get",
    "post",
    "schemas",
    "$defs",
];

fn sorted_entries(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(usize::MAX);
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by(|(a, _), (b, _)| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    entries
}

/// JSON string literal (never fails for a `str`).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

/// Pretty JSON: 2-space indentation, deterministic key order, trailing newline.
pub fn render_json(value: &Value) -> String {
    fn write(out: &mut String, value: &Value, indent: usize) {
        let pad = |n: usize| " ".repeat(n);
        match value {
            Value::Object(map) if !map.is_empty() => {
                out.push_str("{\n");
                let entries = sorted_entries(map);
                let last = entries.len() - 1;
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    out.push_str(&pad(indent + 2));
                    out.push_str(&quote(k));
                    out.push_str(": ");
                    write(out, v, indent + 2);
                    out.push_str(if i == last { "\n" } else { ",\n" });
                }
                out.push_str(&pad(indent));
                out.push('}');
            }
            Value::Array(items) if !items.is_empty() => {
                out.push_str("[\n");
                let last = items.len() - 1;
                for (i, v) in items.iter().enumerate() {
                    out.push_str(&pad(indent + 2));
                    write(out, v, indent + 2);
                    out.push_str(if i == last { "\n" } else { ",\n" });
                }
                out.push_str(&pad(indent));
                out.push(']');
            }
            Value::Object(_) => out.push_str("{}"),
            Value::Array(_) => out.push_str("[]"),
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(&mut out, value, 0);
    out.push('\n');
    out
}

/// Block-style YAML for a JSON value, with the same key order as [`render_json`]. Strings are
/// always double-quoted JSON literals (a subset of YAML double-quoted scalars); keys are plain
/// only when they cannot be read as anything but a string.
pub fn render_yaml(value: &Value) -> String {
    fn key(k: &str) -> String {
        let plain = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '-' | '.'))
            && !matches!(
                k.to_ascii_lowercase().as_str(),
                "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
            );
        if plain { k.to_owned() } else { quote(k) }
    }
    fn inline(value: &Value) -> Option<String> {
        match value {
            Value::Object(m) if m.is_empty() => Some("{}".into()),
            Value::Array(a) if a.is_empty() => Some("[]".into()),
            Value::Object(_) | Value::Array(_) => None,
            Value::String(s) => Some(quote(s)),
            scalar => Some(scalar.to_string()),
        }
    }
    fn lines(out: &mut Vec<String>, value: &Value, indent: usize) {
        let pad = " ".repeat(indent);
        match value {
            Value::Object(map) => {
                for (k, v) in sorted_entries(map) {
                    match inline(v) {
                        Some(s) => out.push(format!("{pad}{}: {s}", key(k))),
                        None => {
                            out.push(format!("{pad}{}:", key(k)));
                            lines(out, v, indent + 2);
                        }
                    }
                }
            }
            Value::Array(items) => {
                for v in items {
                    match inline(v) {
                        Some(s) => out.push(format!("{pad}- {s}")),
                        None => {
                            let start = out.len();
                            lines(out, v, indent + 2);
                            if let Some(first) = out.get_mut(start) {
                                // "{pad}  x" becomes "{pad}- x".
                                first.replace_range(indent..indent + 2, "- ");
                            }
                        }
                    }
                }
            }
            scalar => out.push(format!("{pad}{}", inline(scalar).unwrap_or_default())),
        }
    }
    let mut out = Vec::new();
    lines(&mut out, value, 0);
    let mut text = out.join("\n");
    text.push('\n');
    text
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
    fn yaml_rendering_handles_nesting_and_quoting() {
        let v = json!({
            "200": { "a": [1, "x", { "b": true, "c": [] }, [null, "y"]] },
            "yes": "no",
            "plain_key": {},
            "/path/{id}": "line\nbreak"
        });
        let expected = concat!(
            "\"/path/{id}\": \"line\\nbreak\"\n",
            "\"200\":\n",
            "  a:\n",
            "    - 1\n",
            "    - \"x\"\n",
            "    - b: true\n",
            "      c: []\n",
            "    - - null\n",
            "      - \"y\"\n",
            "plain_key: {}\n",
            "\"yes\": \"no\"\n",
        );
        assert_eq!(render_yaml(&v), expected);
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
