//! The Responses view of one execution's log: the Response object and the Responses stream
//! events (contract.md section 10), folded from the native events in log order.
//!
//! The one decision a reader must know: everything here is a pure function of the stored
//! log. Each native event maps to zero or more Responses events, numbered from 0 in that
//! order, and item ids derive from the execution id and the item's position, so any gateway
//! replaying the log assigns the same `sequence_number` to the same event: a resume with
//! `starting_after=N` replays the log from its start, drops the events numbered N or less and
//! continues live, with no gap and no repeat. Output items are closed (their `.done` events)
//! when the terminal event arrives, since only then is their text final in the log.
//!
//! Mapping: `execution.accepted` → `response.created` (status `queued`); the first
//! `route.selected` → `response.in_progress`; text deltas by `output_index` → a message item
//! (`output_item.added`, `content_part.added`, then `output_text.delta`); tool calls → a
//! `function_call` item and `function_call_arguments.delta`; the terminal event → the `.done`
//! events of every item, then `response.completed` or `response.failed`. Usage facts, progress
//! and attempt failures show only in the Response object.

use std::collections::HashMap;

use protocol::{ErrorCode, EventBody, ExecutionId, ExecutionStatus, RuntimeError, RuntimeEvent};
use serde_json::{Value, json};

use super::id::response_id;

/// One output item.
#[derive(Debug, Clone)]
enum Item {
    Message {
        id: String,
        text: String,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// Usage by unit: the last fact reported for each (facts are reports, never summed).
#[derive(Debug, Clone, Default)]
struct Usage {
    reported: bool,
    input: f64,
    output: f64,
    cached: f64,
    cache_written: f64,
    reasoning: f64,
}

/// The token counts a Response's or a chat completion's `usage` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    /// Input read from the provider's cache (`cache_read_token`).
    pub cached: u64,
    /// Input written to the provider's cache (`cache_write_token`).
    pub cache_written: u64,
    pub reasoning: u64,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Projection {
    execution_id: ExecutionId,
    created_at: i64,
    status: ExecutionStatus,
    model: Option<String>,
    items: Vec<Item>,
    text_items: HashMap<u32, usize>,
    call_items: HashMap<String, usize>,
    usage: Usage,
    error: Option<RuntimeError>,
    routed: bool,
    /// The number of the next Responses event.
    next: u64,
}

/// The OpenAI status of a native one (contract.md section 10). A deadline is `failed`:
/// no provider of this runtime reports that it stopped at `max_output_tokens`.
pub fn status_name(status: ExecutionStatus) -> &'static str {
    match status {
        ExecutionStatus::Accepted => "queued",
        ExecutionStatus::Routing | ExecutionStatus::Running => "in_progress",
        ExecutionStatus::Succeeded => "completed",
        ExecutionStatus::Cancelled => "cancelled",
        ExecutionStatus::Failed => "failed",
    }
}

impl Projection {
    /// The view of a log whose first event is `first` (`execution.accepted`).
    pub fn new(first: &RuntimeEvent) -> Self {
        Self {
            execution_id: first.execution_id,
            created_at: first.time.unix_millis().div_euclid(1000),
            status: ExecutionStatus::Accepted,
            model: None,
            items: Vec::new(),
            text_items: HashMap::new(),
            call_items: HashMap::new(),
            usage: Usage::default(),
            error: None,
            routed: false,
            next: 0,
        }
    }

    /// Folds a whole log; `None` when it is empty.
    pub fn of_log<'a>(events: impl IntoIterator<Item = &'a RuntimeEvent>) -> Option<Self> {
        let mut events = events.into_iter();
        let first = events.next()?;
        let mut p = Self::new(first);
        let mut sink = Vec::new();
        p.apply(first, &mut sink);
        for event in events {
            sink.clear();
            p.apply(event, &mut sink);
        }
        Some(p)
    }

    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    pub fn status(&self) -> ExecutionStatus {
        self.status
    }

    pub fn error(&self) -> Option<&RuntimeError> {
        self.error.as_ref()
    }

    /// The concatenated text of every message item.
    pub fn text(&self) -> String {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::Message { text, .. } => Some(text.as_str()),
                Item::FunctionCall { .. } => None,
            })
            .collect()
    }

    /// `(call_id, name, arguments)` of every function call, in order.
    pub fn tool_calls(&self) -> Vec<(&str, &str, &str)> {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                    ..
                } => Some((call_id.as_str(), name.as_str(), arguments.as_str())),
                Item::Message { .. } => None,
            })
            .collect()
    }

    /// The model that served (or is serving) the execution, once routed.
    pub fn model(&self) -> &str {
        self.model.as_deref().unwrap_or_default()
    }

    pub fn created_at(&self) -> i64 {
        self.created_at
    }

    /// The tokens, when usage was reported.
    pub fn usage(&self) -> Option<Tokens> {
        let u = &self.usage;
        // Quantities are finite and non-negative (the log's rule); tokens are whole.
        let whole = |x: f64| x.round() as u64;
        u.reported.then(|| Tokens {
            input: whole(u.input),
            output: whole(u.output),
            cached: whole(u.cached),
            cache_written: whole(u.cache_written),
            reasoning: whole(u.reasoning),
        })
    }

    fn push(&mut self, out: &mut Vec<Value>, mut event: Value) {
        event["sequence_number"] = Value::from(self.next);
        self.next += 1;
        out.push(event);
    }

    /// Applies the next native event, appending the Responses events it maps to.
    pub fn apply(&mut self, event: &RuntimeEvent, out: &mut Vec<Value>) {
        self.status = event.status;
        match &event.body {
            EventBody::Accepted => {
                let response = self.response();
                self.push(
                    out,
                    json!({"type": "response.created", "response": response}),
                );
            }
            EventBody::RouteSelected { target, .. } => {
                self.model = Some(target.model.clone());
                if !self.routed {
                    self.routed = true;
                    let response = self.response();
                    self.push(
                        out,
                        json!({"type": "response.in_progress", "response": response}),
                    );
                }
            }
            EventBody::Completed { target } => {
                self.model = Some(target.model.clone());
                self.finish(out);
            }
            EventBody::Failed { error } => {
                self.error = Some(error.clone());
                self.finish(out);
            }
            EventBody::OutputDelta {
                output_index,
                delta,
            } => {
                let index = match self.text_items.get(output_index) {
                    Some(&index) => index,
                    None => {
                        let index = self.items.len();
                        let id = format!("msg_{}_{index}", self.execution_id.as_uuid().simple());
                        self.items.push(Item::Message {
                            id: id.clone(),
                            text: String::new(),
                        });
                        self.text_items.insert(*output_index, index);
                        let item = self.item_json(index, "in_progress");
                        self.push(
                            out,
                            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
                        );
                        self.push(
                            out,
                            json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
                                   "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
                        );
                        index
                    }
                };
                let Some(Item::Message { id, text }) = self.items.get_mut(index) else {
                    return;
                };
                text.push_str(delta);
                let id = id.clone();
                self.push(
                    out,
                    json!({"type": "response.output_text.delta", "item_id": id, "output_index": index,
                           "content_index": 0, "delta": delta, "logprobs": []}),
                );
            }
            EventBody::ToolCallStarted { call_id, name } => {
                if self.call_items.contains_key(call_id) {
                    return;
                }
                let index = self.items.len();
                self.items.push(Item::FunctionCall {
                    id: format!("fc_{}_{index}", self.execution_id.as_uuid().simple()),
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
                self.call_items.insert(call_id.clone(), index);
                let item = self.item_json(index, "in_progress");
                self.push(
                    out,
                    json!({"type": "response.output_item.added", "output_index": index, "item": item}),
                );
            }
            EventBody::ToolCallArgumentsDelta { call_id, delta } => {
                // Arguments of an unknown call are ignored, as the native result does [R 58].
                let Some(&index) = self.call_items.get(call_id) else {
                    return;
                };
                let Some(Item::FunctionCall { id, arguments, .. }) = self.items.get_mut(index)
                else {
                    return;
                };
                arguments.push_str(delta);
                let id = id.clone();
                self.push(
                    out,
                    json!({"type": "response.function_call_arguments.delta", "item_id": id,
                           "output_index": index, "delta": delta}),
                );
            }
            EventBody::UsageReported { facts } => {
                for fact in facts {
                    let slot = match fact.unit.as_str() {
                        "input_token" => &mut self.usage.input,
                        "output_token" => &mut self.usage.output,
                        "cache_read_token" => &mut self.usage.cached,
                        "cache_write_token" => &mut self.usage.cache_written,
                        "reasoning_token" => &mut self.usage.reasoning,
                        _ => continue,
                    };
                    *slot = fact.quantity;
                    self.usage.reported = true;
                }
            }
            EventBody::RouteAttemptFailed { .. }
            | EventBody::Progress { .. }
            | EventBody::OutputResult { .. } => {}
        }
    }

    /// The `.done` events of every item, then the terminal lifecycle event.
    fn finish(&mut self, out: &mut Vec<Value>) {
        let item_status = if self.status == ExecutionStatus::Succeeded {
            "completed"
        } else {
            "incomplete"
        };
        for index in 0..self.items.len() {
            let item = self.item_json(index, item_status);
            match &self.items[index] {
                Item::Message { id, text } => {
                    let (id, text) = (id.clone(), text.clone());
                    self.push(
                        out,
                        json!({"type": "response.output_text.done", "item_id": id, "output_index": index,
                               "content_index": 0, "text": text, "logprobs": []}),
                    );
                    self.push(
                        out,
                        json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
                               "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}),
                    );
                }
                Item::FunctionCall {
                    id,
                    name,
                    arguments,
                    ..
                } => {
                    let (id, name, arguments) = (id.clone(), name.clone(), arguments.clone());
                    self.push(
                        out,
                        json!({"type": "response.function_call_arguments.done", "item_id": id,
                               "output_index": index, "name": name, "arguments": arguments}),
                    );
                }
            }
            self.push(
                out,
                json!({"type": "response.output_item.done", "output_index": index, "item": item}),
            );
        }
        let kind = if self.status == ExecutionStatus::Succeeded {
            "response.completed"
        } else {
            "response.failed"
        };
        let response = self.response();
        self.push(out, json!({"type": kind, "response": response}));
    }

    fn item_json(&self, index: usize, status: &str) -> Value {
        match &self.items[index] {
            Item::Message { id, text } => json!({
                "id": id, "type": "message", "status": status, "role": "assistant",
                "content": if status == "in_progress" { json!([]) } else {
                    json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
                },
            }),
            Item::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id,
                "name": name, "arguments": arguments,
            }),
        }
    }

    /// The Response object as the log stands. Fields the log does not record (the request's
    /// `instructions`, `tools`, sampling, `metadata`) are their defaults, so every gateway
    /// answers the same object for the same log.
    pub fn response(&self) -> Value {
        let item_status = match self.status {
            ExecutionStatus::Succeeded => "completed",
            s if s.is_terminal() => "incomplete",
            _ => "in_progress",
        };
        let output: Vec<Value> = (0..self.items.len())
            .map(|i| self.item_json(i, item_status))
            .collect();
        let error = match (&self.error, self.status) {
            (Some(e), ExecutionStatus::Failed) => {
                json!({"code": e.code.as_str(), "message": e.message})
            }
            _ => Value::Null,
        };
        let usage = self.usage().map(|t| {
            json!({
                "input_tokens": t.input,
                "input_tokens_details": {
                    "cached_tokens": t.cached,
                    "cache_write_tokens": t.cache_written,
                },
                "output_tokens": t.output,
                "output_tokens_details": {"reasoning_tokens": t.reasoning},
                "total_tokens": t.input + t.output,
            })
        });
        json!({
            "id": response_id(self.execution_id),
            "object": "response",
            "created_at": self.created_at,
            "status": status_name(self.status),
            "error": error,
            "incomplete_details": Value::Null,
            "instructions": Value::Null,
            "max_output_tokens": Value::Null,
            "model": self.model(),
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": Value::Null,
            "temperature": Value::Null,
            "top_p": Value::Null,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
        })
    }
}

/// Whether an execution's failure was its cancellation.
pub fn was_cancelled(error: Option<&RuntimeError>) -> bool {
    error.is_some_and(|e| e.code == ErrorCode::Cancelled)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protocol::{UsageFact, UsageUnit};

    use super::super::fixture::{log, replay, says_then};
    use super::*;

    fn mock_run() -> Vec<RuntimeEvent> {
        says_then(
            "hello",
            vec![
                EventBody::ToolCallStarted {
                    call_id: "c1".into(),
                    name: "f".into(),
                },
                EventBody::OutputDelta {
                    output_index: 0,
                    delta: " mock".into(),
                },
                EventBody::ToolCallArgumentsDelta {
                    call_id: "c1".into(),
                    delta: "{}".into(),
                },
                EventBody::UsageReported {
                    facts: UsageFact::runtime_tokens(1.0, 2.0).unwrap(),
                },
            ],
        )
    }

    fn events(log: &[RuntimeEvent]) -> Vec<Value> {
        let mut p = Projection::new(&log[0]);
        replay(log, |e, out| p.apply(e, out))
    }

    #[test]
    fn the_grammar_is_numbered_from_zero_and_a_pure_function_of_the_log() {
        let log = mock_run();
        let out = events(&log);
        let types: Vec<&str> = out.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_item.added",
                "response.output_text.delta",
                "response.function_call_arguments.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (n, e) in out.iter().enumerate() {
            assert_eq!(e["sequence_number"], n as u64);
        }
        assert_eq!(out, events(&log), "replaying the log gives the same events");
        assert_eq!(out[0]["response"]["status"], "queued");
        let done = &out[13]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["model"], "m");
        assert_eq!(done["output"][0]["content"][0]["text"], "hello mock");
        assert_eq!(done["output"][1]["arguments"], "{}");
        assert_eq!(done["usage"]["total_tokens"], 3);
        assert_eq!(out[2]["item"]["id"], out[10]["item"]["id"]);
        let p = Projection::of_log(&log).unwrap();
        assert_eq!(p.response(), *done);
        assert_eq!(p.text(), "hello mock");
    }

    #[test]
    fn usage_reports_the_last_fact_of_each_unit_cache_reads_and_writes_included() {
        let fact = |unit: UsageUnit, quantity| {
            UsageFact::new(unit, quantity, protocol::UsageSource::Provider).unwrap()
        };
        let log = says_then(
            "hi",
            vec![EventBody::UsageReported {
                facts: vec![
                    fact(UsageUnit::input_token(), 10.0),
                    fact(UsageUnit::output_token(), 4.0),
                    fact(UsageUnit::cache_read_token(), 3.0),
                    fact(UsageUnit::cache_write_token(), 5.0),
                    fact(UsageUnit::reasoning_token(), 2.0),
                    fact(UsageUnit::output_token(), 6.0),
                ],
            }],
        );
        let usage = &Projection::of_log(&log).unwrap().response()["usage"];
        assert_eq!(
            *usage,
            json!({
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 3, "cache_write_tokens": 5},
                "output_tokens": 6,
                "output_tokens_details": {"reasoning_tokens": 2},
                "total_tokens": 16,
            })
        );
    }

    #[test]
    fn failures_and_cancellations_end_with_response_failed() {
        let log = log(vec![
            EventBody::Accepted,
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        ]);
        let out = events(&log);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1]["type"], "response.failed");
        assert_eq!(out[1]["response"]["status"], "cancelled");
        assert_eq!(out[1]["response"]["error"], Value::Null);
        let p = Projection::of_log(&log).unwrap();
        assert!(was_cancelled(p.error()));
        let failed = self::log(vec![
            EventBody::Accepted,
            EventBody::Failed {
                error: RuntimeError::deadline_exceeded(),
            },
        ]);
        let r = Projection::of_log(&failed).unwrap().response();
        assert_eq!(r["status"], "failed");
        assert_eq!(r["error"]["code"], "deadline_exceeded");
    }
}
