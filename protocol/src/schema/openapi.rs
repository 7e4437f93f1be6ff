//! The OpenAPI 3.1 document (`spec/openapi.yaml`): every endpoint of the HTTP API with its
//! parameters, responses and headers, over components generated from the wire types.

use serde_json::{Map, Value, json};

use super::event::{EVENT_TYPES, event_schemas};
use super::normalize::normalize;
use super::{
    COMPONENTS, DRAFT_2020_12, generator, ref_prefix, reference, subschema, take_definitions,
};
use crate::PROTOCOL_VERSION;
use crate::error::ErrorResponse;
use crate::manifest::ProviderList;
use crate::request::ExecutionRequest;
use crate::snapshot::{
    CancelResponse, ExecutionResultResponse, ExecutionSnapshot, ExecutionSubmission,
    ResultNotReady, RuntimeInfo,
};

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
        "paths": with_shared_responses(openapi_paths(p)),
        // A key when the deployment has an `auth` section; none otherwise.
        "security": [{ "apiKey": [] }, {}],
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
                "WwwAuthenticate": {
                    "description": "The scheme to authenticate with.",
                    "required": true,
                    "schema": { "type": "string", "const": "Bearer" }
                },
                "RetryAfter": {
                    "description": "Seconds to wait before retrying.",
                    "required": true,
                    "schema": { "type": "integer", "minimum": 0 }
                }
            },
            "responses": openapi_responses(p),
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key of the deployment's `auth` section (`Authorization: Bearer mrt_...`). Without an `auth` section no key is needed."
                }
            }
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
            "schema": { "type": "integer", "minimum": 0, "maximum": crate::number::MAX_SAFE_INTEGER }
        },
        "LastEventId": {
            "name": "Last-Event-ID",
            "in": "header",
            "required": false,
            "description": "Cursor sent by reconnecting SSE clients; ignored when `after` is given. Anything but a non-negative integer is 400.",
            "schema": { "type": "integer", "minimum": 0, "maximum": crate::number::MAX_SAFE_INTEGER }
        }
    })
}

/// A JSON response with the standard headers.
/// The path item of one execution's resource (`/v1/executions/{id}...`): the `id` path
/// parameter and its one `method` operation, tagged `executions`.
fn execution_item(execution_id: &Value, method: &str, mut operation: Value) -> Value {
    operation["tags"] = json!(["executions"]);
    let mut item = Map::new();
    item.insert("parameters".into(), json!([execution_id]));
    item.insert(method.into(), operation);
    Value::Object(item)
}

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

/// A JSON response with the standard headers and one more: `(name, header component)`.
fn json_response_with(description: &str, schema: Value, (name, header): (&str, &str)) -> Value {
    let mut response = json_response(description, schema);
    response["headers"][name] = json!({ "$ref": format!("#/components/headers/{header}") });
    response
}

/// A JSON error response whose body is [`error_schema`]`(p, codes, retryable)`.
fn error_response(p: &str, codes: &[&str], retryable: bool, description: &str) -> Value {
    json_response(description, error_schema(p, codes, retryable))
}

/// Schema `name` with some of its properties narrowed: `properties` maps each to the keywords
/// (`const`, `enum`) it must also satisfy.
fn narrowed(p: &str, name: &str, properties: Value) -> Value {
    json!({ "allOf": [reference(p, name), { "properties": properties }] })
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

/// The responses routes share, added here rather than spelled in each operation (an
/// operation's own response for a status wins):
/// - who may call what: every `/v1` operation answers 401 when the deployment has API keys and
///   the request has no valid one, and the execution routes, which each need a scope, 403 when
///   the key lacks it. Health, readiness and metrics never need a key;
/// - failures: every `/v1` operation may answer 500, the execution routes 503 (a backend is
///   unreachable), and the routes of one execution 404 (unknown execution).
fn with_shared_responses(mut paths: Value) -> Value {
    for (path, item) in paths.as_object_mut().into_iter().flatten() {
        let api = path.starts_with("/v1/");
        let executions = path.starts_with("/v1/executions");
        let one_execution = path.starts_with("/v1/executions/");
        let mut shared = vec![("401", "Unauthenticated"), ("500", "InternalError")];
        if executions {
            shared.extend([("403", "PermissionDenied"), ("503", "Unavailable")]);
        }
        if one_execution {
            shared.push(("404", "NotFound"));
        }
        for operation in item
            .as_object_mut()
            .into_iter()
            .flat_map(|o| o.values_mut())
        {
            let Some(operation) = operation.as_object_mut() else {
                continue;
            };
            if !api {
                operation.insert("security".into(), json!([]));
                continue;
            }
            if let Some(responses) = operation
                .get_mut("responses")
                .and_then(Value::as_object_mut)
            {
                for (status, name) in &shared {
                    responses
                        .entry(*status)
                        .or_insert_with(|| response_ref(name));
                }
            }
        }
    }
    paths
}

fn response_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/responses/{name}") })
}

fn openapi_responses(p: &str) -> Value {
    json!({
        "InvalidRequest": error_response(p, &["invalid_request"], false, "`invalid_request`: malformed JSON, schema violation, bad cursor or bad header."),
        "NotFound": json_response("`not_found`: unknown execution (or an id that is not a UUID).", reference(p, "NotFoundError")),
        "Unavailable": error_response(p, &["unavailable"], true, "`unavailable`: a backend (NATS, Redis) is unreachable, or the runtime is shutting down."),
        "Unauthenticated": json_response_with(
            "`unauthenticated`: the deployment requires an API key and none, or an unknown one, was presented.",
            error_schema(p, &["unauthenticated"], false),
            ("WWW-Authenticate", "WwwAuthenticate"),
        ),
        "PermissionDenied": error_response(p, &["permission_denied"], false, "`permission_denied`: the API key lacks the operation's scope (`submit`, `read` or `cancel`)."),
        "InternalError": error_response(p, &["internal_error"], false, "`internal_error`: a bug; the message is generic and details are only logged."),
    })
}

fn openapi_paths(p: &str) -> Value {
    let execution_id = json!({ "$ref": "#/components/parameters/ExecutionId" });
    let accepted_submission = narrowed(
        p,
        "ExecutionSubmission",
        json!({ "status": { "const": "accepted" }, "idempotent_replay": { "const": false } }),
    );
    let mut replay = json_response(
        "Idempotent replay: the existing execution with its current status. With `Accept: text/event-stream` (new or replayed execution), the event stream from sequence 1 instead.",
        narrowed(
            p,
            "ExecutionSubmission",
            json!({ "idempotent_replay": { "const": true } }),
        ),
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
                    "200": json_response("The runtime is ready.", narrowed(p, "RuntimeInfo", json!({ "state": { "const": "ready" } }))),
                    "503": json_response("The runtime is stopping or a backend is unavailable; same body.", narrowed(p, "RuntimeInfo", json!({ "state": { "enum": ["stopping", "unavailable"] } })))
                }
            }
        },
        "/v1/providers": {
            "get": {
                "tags": ["runtime"],
                "operationId": "listProviders",
                "summary": "Configured provider manifests",
                "responses": {
                    "200": json_response("The manifests from the deployment file.", reference(p, "ProviderList"))
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
                    "413": error_response(p, &["invalid_request"], false, "`invalid_request`: the body exceeds the limit (1 MiB by default)."),
                    "415": error_response(p, &["invalid_request"], false, "`invalid_request`: the Content-Type is not `application/json`."),
                    "422": error_response(
                        p,
                        &["idempotency_conflict", "capability_unavailable"],
                        false,
                        "`idempotency_conflict` (the key was used with a different request) or `capability_unavailable` (no configured model serves the ability with the required and inferred capabilities).",
                    ),
                    "429": json_response_with(
                        "`queue_full`: admission limits reached (the runtime's, or the tenant's active executions); `rate_limited`: the tenant's submit rate.",
                        error_schema(p, &["queue_full", "rate_limited"], true),
                        ("Retry-After", "RetryAfter"),
                    )
                }
            }
        },
        "/v1/executions/{id}": execution_item(&execution_id, "get", json!({
            "operationId": "getExecution",
            "summary": "The materialized snapshot of an execution",
            "responses": {
                "200": json_response("The snapshot; optional keys are omitted when unset.", reference(p, "ExecutionSnapshot"))
            }
        })),
        "/v1/executions/{id}/result": execution_item(&execution_id, "get", json!({
            "operationId": "getExecutionResult",
            "summary": "The result of a succeeded execution",
            "responses": {
                "200": json_response("The execution succeeded; `artifacts` defaults to `[]`.", reference(p, "ExecutionResultResponse")),
                "409": json_response("The execution has not succeeded (yet): its status, and its error once failed or cancelled.", reference(p, "ResultNotReady"))
            }
        })),
        "/v1/executions/{id}/cancel": execution_item(&execution_id, "post", json!({
            "operationId": "cancelExecution",
            "summary": "Request cancellation",
            "description": "The execution ends with `execution.failed` (status `cancelled`) unless it finishes first.",
            "responses": {
                "202": json_response("Cancellation was requested.", narrowed(p, "CancelResponse", json!({ "status": { "const": "cancellation_requested" } }))),
                "404": json_response("Unknown or already terminal execution.", narrowed(p, "CancelResponse", json!({ "status": { "const": "not_found" } })))
            }
        })),
        "/v1/executions/{id}/events": execution_item(&execution_id, "get", json!({
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
                "400": response_ref("InvalidRequest")
            }
        })),
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
