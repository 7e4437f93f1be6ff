//! The Chat Completions view of an execution: the `chat.completion` object and the
//! `chat.completion.chunk` frames, from the same log as every other view.
//!
//! The one decision a reader must know: one execution is one choice (`index` 0). Text deltas
//! become `delta.content`, tool calls `delta.tool_calls` entries by `index` (the call's
//! position in the execution), with `id`, `type` and the name in the call's first chunk and
//! argument fragments after. The role comes in the first chunk, the finish reason in the
//! last, then the usage chunk when `stream_options.include_usage` asked for it.

use protocol::{EventBody, ExecutionStatus, RuntimeEvent};
use serde_json::{Value, json};

use super::id::completion_id;
use super::projection::Projection;

/// `usage` in Chat Completions' shape.
fn usage_json(p: &Projection) -> Value {
    let t = p.usage().unwrap_or_default();
    json!({
        "prompt_tokens": t.input,
        "completion_tokens": t.output,
        "total_tokens": t.input + t.output,
        "prompt_tokens_details": {
            "cached_tokens": t.cached,
            "cache_write_tokens": t.cache_written,
        },
        "completion_tokens_details": {"reasoning_tokens": t.reasoning},
    })
}

fn finish_reason(p: &Projection) -> &'static str {
    if p.tool_calls().is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

/// The `chat.completion` of a succeeded execution.
pub fn completion(p: &Projection) -> Value {
    let calls: Vec<Value> = p
        .tool_calls()
        .into_iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    // OpenAI's assistant turn that only calls tools has no content (`null`, not "").
    let text = p.text();
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    let mut message = json!({"role": "assistant", "content": content, "refusal": Value::Null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": completion_id(p.execution_id()),
        "object": "chat.completion",
        "created": p.created_at(),
        "model": p.model(),
        "choices": [{"index": 0, "message": message, "logprobs": Value::Null,
                     "finish_reason": finish_reason(p)}],
        "usage": usage_json(p),
    })
}

/// The chunks of one stream: folds the log and writes each chunk's JSON.
#[derive(Debug)]
pub struct Chunks {
    projection: Option<Projection>,
    include_usage: bool,
    role_sent: bool,
}

impl Chunks {
    pub fn new(include_usage: bool) -> Self {
        Self {
            projection: None,
            include_usage,
            role_sent: false,
        }
    }

    fn chunk(&self, p: &Projection, delta: Value, finish: Option<&str>) -> Value {
        let mut chunk = json!({
            "id": completion_id(p.execution_id()),
            "object": "chat.completion.chunk",
            "created": p.created_at(),
            "model": p.model(),
            "system_fingerprint": Value::Null,
            "choices": [{"index": 0, "delta": delta, "logprobs": Value::Null, "finish_reason": finish}],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// Appends the chunks (`data:` payloads) `event` maps to. A failed execution maps to
    /// none: the stream answers its error instead (`super::stream`).
    pub fn apply(&mut self, event: &RuntimeEvent, out: &mut Vec<Value>) {
        // Taken out while chunks are written, so `self` stays readable; put back below.
        let mut p = self
            .projection
            .take()
            .unwrap_or_else(|| Projection::new(event));
        let calls_before = p.tool_calls().len();
        p.apply(event, &mut Vec::new());
        self.write(&p, event, calls_before, out);
        self.projection = Some(p);
    }

    fn write(
        &mut self,
        p: &Projection,
        event: &RuntimeEvent,
        calls_before: usize,
        out: &mut Vec<Value>,
    ) {
        let succeeded_or_running = !matches!(
            p.status(),
            ExecutionStatus::Failed | ExecutionStatus::Cancelled
        );
        let output = event.body.exposes_output() || event.is_terminal();
        if output && !self.role_sent && succeeded_or_running {
            self.role_sent = true;
            out.push(self.chunk(p, json!({"role": "assistant", "content": ""}), None));
        }
        match &event.body {
            EventBody::OutputDelta { delta, .. } => {
                out.push(self.chunk(p, json!({"content": delta}), None));
            }
            // A call id seen before is one call: only its first start opens it.
            EventBody::ToolCallStarted { call_id, name } if p.tool_calls().len() > calls_before => {
                out.push(self.chunk(
                    p,
                    json!({"tool_calls": [{"index": calls_before, "id": call_id, "type": "function",
                                           "function": {"name": name, "arguments": ""}}]}),
                    None,
                ));
            }
            EventBody::ToolCallArgumentsDelta { call_id, delta } => {
                if let Some(index) = p.tool_calls().iter().position(|(id, _, _)| id == call_id) {
                    out.push(self.chunk(
                        p,
                        json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]}),
                        None,
                    ));
                }
            }
            EventBody::Completed { .. } => {
                out.push(self.chunk(p, json!({}), Some(finish_reason(p))));
                if self.include_usage {
                    let mut last = self.chunk(p, json!({}), None);
                    last["choices"] = json!([]);
                    last["usage"] = usage_json(p);
                    out.push(last);
                }
            }
            _ => {}
        }
    }

    /// The execution's state so far.
    pub fn projection(&self) -> Option<&Projection> {
        self.projection.as_ref()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::fixture::{replay, says_hi_then};
    use super::*;

    #[test]
    fn chunks_carry_role_content_tool_calls_by_index_finish_and_usage() {
        let log = says_hi_then(vec![
            EventBody::ToolCallStarted {
                call_id: "call_1".into(),
                name: "f".into(),
            },
            EventBody::ToolCallArgumentsDelta {
                call_id: "call_1".into(),
                delta: "{\"a\":1}".into(),
            },
        ]);
        let mut chunks = Chunks::new(true);
        let out: Vec<Value> = replay(&log, |e, out| chunks.apply(e, out));
        let deltas: Vec<&Value> = out.iter().map(|c| &c["choices"][0]["delta"]).collect();
        assert_eq!(*deltas[0], json!({"role": "assistant", "content": ""}));
        assert_eq!(deltas[1]["content"], "hi");
        assert_eq!(deltas[2]["tool_calls"][0]["index"], 0);
        assert_eq!(deltas[2]["tool_calls"][0]["id"], "call_1");
        assert_eq!(
            deltas[3]["tool_calls"][0]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(out[4]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(out[5]["choices"], json!([]));
        assert_eq!(out[5]["usage"]["total_tokens"], 0);
        assert!(out.iter().all(|c| c["object"] == "chat.completion.chunk"));
        let done = completion(chunks.projection().unwrap());
        assert_eq!(done["choices"][0]["message"]["content"], "hi");
        assert_eq!(
            done["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "f"
        );
    }

    #[test]
    fn a_turn_that_only_calls_tools_has_null_content_and_an_empty_one_empty_text() {
        let mut log = says_hi_then(vec![EventBody::ToolCallStarted {
            call_id: "call_1".into(),
            name: "f".into(),
        }]);
        // Without its one delta ("hi"), the turn only calls a tool.
        log.retain(|e| !matches!(e.body, EventBody::OutputDelta { .. }));
        let p = Projection::of_log(&log).unwrap();
        let message = &completion(&p)["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["id"], "call_1");
        log.retain(|e| !matches!(e.body, EventBody::ToolCallStarted { .. }));
        let p = Projection::of_log(&log).unwrap();
        assert_eq!(completion(&p)["choices"][0]["message"]["content"], "");
    }
}
