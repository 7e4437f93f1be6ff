//! Maps the Responses API event stream to [`ProviderEvent`]s [R 64-65].
//!
//! [`ResponsesStream`] is a pure state machine over SSE frames (no I/O), so every mapping rule
//! is unit-tested here and the kit's frame loop drives it. The one piece of state is the
//! function-call table: argument deltas name the output *item* (`item_id`), while callers know
//! a call by its `call_id`, so each `function_call` item's id is remembered when it is added.
//!
//! Provider-sent text never reaches an error: failures carry fixed messages.

use std::collections::HashMap;

use protocol::sse::SseEvent;
use protocol::{RuntimeError, UsageUnit};
use serde_json::Value;

use super::wire;
use crate::provider::ProviderEvent;
use crate::provider::frame_loop::{FrameMapper, FrameOutcome, decode, parse_data, stream_failure};
use crate::provider::usage::{UsageMapping, usage_facts};

/// Responses API usage counters and their units [R 65].
const USAGE: &[UsageMapping] = &[
    (&["input_tokens"], UsageUnit::input_token),
    (&["output_tokens"], UsageUnit::output_token),
    (
        &["input_tokens_details", "cache_write_tokens"],
        UsageUnit::cache_write_token,
    ),
    (
        &["input_tokens_details", "cached_tokens"],
        UsageUnit::cache_read_token,
    ),
    (
        &["output_tokens_details", "reasoning_tokens"],
        UsageUnit::reasoning_token,
    ),
];

/// The Responses stream state. See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesStream {
    /// `function_call` item id → call id.
    calls: HashMap<String, String>,
}

impl ResponsesStream {
    pub fn new() -> Self {
        Self::default()
    }
}

impl FrameMapper for ResponsesStream {
    fn on_frame(&mut self, frame: &SseEvent) -> Result<FrameOutcome, RuntimeError> {
        if frame.data.trim() == "[DONE]" {
            return Ok(FrameOutcome::none());
        }
        let payload = parse_data(frame)?;
        // The type comes from the payload, else from the SSE event name [R 64].
        let kind = match payload.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            Some(_) => String::new(),
            None => frame.event.clone(),
        };
        match kind.as_str() {
            "response.output_text.delta" => {
                let delta: wire::OutputTextDelta = decode(payload)?;
                Ok(FrameOutcome::event(ProviderEvent::output_delta(
                    delta.output_index.unwrap_or(0),
                    delta.delta,
                )))
            }
            "response.output_item.added" => {
                let is_function_call = payload
                    .get("item")
                    .and_then(|item| item.get("type"))
                    .and_then(Value::as_str)
                    == Some("function_call");
                if !is_function_call {
                    return Ok(FrameOutcome::none());
                }
                let added: wire::FunctionCallItemAdded = decode(payload)?;
                let item = added.item;
                if let Some(id) = item.id {
                    self.calls.insert(id, item.call_id.clone());
                }
                Ok(FrameOutcome::event(ProviderEvent::tool_call_started(
                    item.call_id,
                    item.name,
                )))
            }
            "response.function_call_arguments.delta" => {
                let delta: wire::FunctionCallArgumentsDelta = decode(payload)?;
                // An item never announced keeps its item id, as the reference does; the
                // materializer ignores deltas of unknown calls [R 58].
                let call_id = self
                    .calls
                    .get(&delta.item_id)
                    .cloned()
                    .unwrap_or(delta.item_id);
                Ok(FrameOutcome::event(ProviderEvent::tool_call_arguments(
                    call_id,
                    delta.delta,
                )))
            }
            "response.completed" => {
                let completed: wire::Completed = decode(payload)?;
                let facts = match completed.response.and_then(|r| r.usage) {
                    Some(usage) => usage_facts(&usage, USAGE)?,
                    None => Vec::new(),
                };
                let events = if facts.is_empty() {
                    Vec::new()
                } else {
                    vec![ProviderEvent::Usage(facts)]
                };
                Ok(FrameOutcome {
                    events,
                    completed: true,
                })
            }
            "response.failed" | "error" => Err(stream_failure()),
            _ => Ok(FrameOutcome::none()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{ErrorCode, UsageFact, UsageSource};

    fn frame(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: None,
        }
    }

    fn data(data: &str) -> SseEvent {
        frame("message", data)
    }

    fn fact(unit: UsageUnit, q: f64) -> UsageFact {
        UsageFact::new(unit, q, UsageSource::Provider).unwrap()
    }

    #[test]
    fn text_deltas_default_to_output_zero() {
        let mut s = ResponsesStream::new();
        let out = s
            .on_frame(&data(
                r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"Hi","sequence_number":4}"#,
            ))
            .unwrap();
        assert_eq!(out.events, [ProviderEvent::output_delta(1, "Hi")]);
        // Without payload.type, the SSE event name is the type; output_index defaults to 0.
        let out = s
            .on_frame(&frame("response.output_text.delta", r#"{"delta":"x"}"#))
            .unwrap();
        assert_eq!(out.events, [ProviderEvent::output_delta(0, "x")]);
        assert!(!out.completed);
    }

    #[test]
    fn function_call_arguments_map_item_ids_to_call_ids() {
        let mut s = ResponsesStream::new();
        for (payload, expected) in [
            (
                r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_A","name":"get_weather"}}"#,
                FrameOutcome::event(ProviderEvent::tool_call_started("call_A", "get_weather")),
            ),
            (
                r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"ci"}"#,
                FrameOutcome::event(ProviderEvent::tool_call_arguments("call_A", "{\"ci")),
            ),
            (
                r#"{"type":"response.function_call_arguments.delta","item_id":"fc_9","delta":"x"}"#,
                FrameOutcome::event(ProviderEvent::tool_call_arguments("fc_9", "x")),
            ),
            // Other item types are not tool calls.
            (
                r#"{"type":"response.output_item.added","output_index":1,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}"#,
                FrameOutcome::none(),
            ),
        ] {
            assert_eq!(s.on_frame(&data(payload)).unwrap(), expected, "{payload}");
        }
    }

    #[test]
    fn completion_reports_numeric_usage_then_completes() {
        let mut s = ResponsesStream::new();
        let out = s
            .on_frame(&data(
                r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":8,"cache_write_tokens":"n/a"},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}}}"#,
            ))
            .unwrap();
        assert!(out.completed);
        assert_eq!(
            out.events,
            [ProviderEvent::Usage(vec![
                fact(UsageUnit::input_token(), 36.0),
                fact(UsageUnit::output_token(), 87.0),
                fact(UsageUnit::cache_read_token(), 8.0),
                fact(UsageUnit::reasoning_token(), 0.0),
            ])]
        );
        let bare = s
            .on_frame(&data(r#"{"type":"response.completed","response":{}}"#))
            .unwrap();
        assert_eq!(
            bare,
            FrameOutcome {
                events: vec![],
                completed: true
            }
        );
        let negative = s
            .on_frame(&data(
                r#"{"type":"response.completed","response":{"usage":{"input_tokens":-1}}}"#,
            ))
            .unwrap_err();
        assert_eq!(negative.code, ErrorCode::ProviderProtocolError);
    }

    #[test]
    fn failures_and_malformed_frames() {
        let mut s = ResponsesStream::new();
        for failure in [
            data(
                r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"secret text"}}}"#,
            ),
            data(r#"{"type":"error","code":"rate_limit_exceeded","message":"secret text"}"#),
            frame("error", r#"{"message":"secret text"}"#),
        ] {
            let e = s.on_frame(&failure).unwrap_err();
            assert_eq!(
                (e.code, e.retryable, e.message.as_str()),
                (
                    ErrorCode::ProviderUnavailable,
                    false,
                    "Provider response failed"
                )
            );
            assert_eq!(e.provider_code, None);
        }
        for bad in [
            data("{not json"),
            data(r#"{"type":"response.output_text.delta","delta":5}"#),
            data(r#"{"type":"response.output_text.delta","output_index":-1,"delta":"x"}"#),
            data(r#"{"type":"response.output_item.added","item":{"type":"function_call"}}"#),
        ] {
            let e = s.on_frame(&bad).unwrap_err();
            assert_eq!(
                (e.code, e.retryable),
                (ErrorCode::ProviderProtocolError, false)
            );
        }
        assert_eq!(s.on_frame(&data("[DONE]")).unwrap(), FrameOutcome::none());
        assert_eq!(
            s.on_frame(&data(r#"{"type":"response.in_progress","response":{}}"#))
                .unwrap(),
            FrameOutcome::none()
        );
    }
}
