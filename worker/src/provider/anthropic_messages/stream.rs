//! Maps the Anthropic Messages event stream to provider events [R 67].
//!
//! | Anthropic event | provider event |
//! | --- | --- |
//! | `message_start` | usage remembered (not emitted yet) |
//! | `content_block_start` of type `tool_use` | `tool.call.started{call_id: block.id, name}` |
//! | `content_block_delta` / `text_delta` | `output.delta{output_index: block index}` |
//! | `content_block_delta` / `input_json_delta` | `tool.call.arguments.delta` for the block's call |
//! | `content_block_stop` of a `tool_use` block no fragment filled | `tool.call.arguments.delta` with the start's `input` (`{}`) |
//! | `message_delta` | usage merged over what `message_start` said |
//! | `message_stop` | `usage.reported` (merged), then the attempt completes |
//! | `error` | `provider_unavailable`, not retryable |
//! | `ping`, other `content_block_stop`s, unknown types | ignored |
//!
//! Decisions a reader must know:
//! - Usage is reported once, at `message_stop`, because Anthropic's `message_delta` usage is
//!   cumulative. Emitting both would double-count in any consumer that sums facts.
//! - A tool without parameters gets only empty `input_json_delta` fragments, which left its
//!   call's arguments `""`, not JSON (the non-streaming API says `{}`); servers that put the
//!   whole input in `content_block_start` send no fragments at all. A tool block that ends
//!   with no fragment therefore gets the start's `input` as its arguments (beyond the
//!   reference, which concatenates fragments only).

use std::collections::{HashMap, HashSet};

use protocol::sse::SseEvent;
use protocol::{ErrorCode, RuntimeError, UsageFact, UsageSource, UsageUnit};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::wire::{
    ContentBlockDelta, ContentBlockStart, ContentBlockStop, MessageDelta, MessageStart,
    StreamError, unexpected_event,
};
use crate::provider::ProviderEvent;
use crate::provider::frame_loop::{FrameMapper, FrameOutcome};
use crate::provider::http::protocol_error;

/// Whether the stream goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Continue,
    /// `message_stop` was seen: the attempt is complete; stop reading.
    Completed,
}

/// Usage as Anthropic names it, merged field by field (later values win).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageUsage {
    input_tokens: Option<f64>,
    output_tokens: Option<f64>,
    cache_creation_input_tokens: Option<f64>,
    cache_read_input_tokens: Option<f64>,
    thinking_tokens: Option<f64>,
}

impl MessageUsage {
    /// Takes every numeric field of `usage` that has a runtime unit; `null` and other
    /// non-numbers are skipped, as the reference does.
    pub fn merge(&mut self, usage: &Map<String, Value>) {
        let slots: [(&str, &mut Option<f64>); 5] = [
            ("input_tokens", &mut self.input_tokens),
            ("output_tokens", &mut self.output_tokens),
            (
                "cache_creation_input_tokens",
                &mut self.cache_creation_input_tokens,
            ),
            ("cache_read_input_tokens", &mut self.cache_read_input_tokens),
            ("thinking_tokens", &mut self.thinking_tokens),
        ];
        for (key, slot) in slots {
            if let Some(n) = usage.get(key).and_then(Value::as_f64) {
                *slot = Some(n);
            }
        }
    }

    /// Provider facts, complete, in a fixed unit order. A negative or non-finite quantity is
    /// `provider_protocol_error`.
    pub fn facts(&self) -> Result<Vec<UsageFact>, RuntimeError> {
        [
            (UsageUnit::input_token(), self.input_tokens),
            (UsageUnit::output_token(), self.output_tokens),
            (
                UsageUnit::cache_write_token(),
                self.cache_creation_input_tokens,
            ),
            (UsageUnit::cache_read_token(), self.cache_read_input_tokens),
            (UsageUnit::reasoning_token(), self.thinking_tokens),
        ]
        .into_iter()
        .filter_map(|(unit, quantity)| quantity.map(|q| (unit, q)))
        .map(|(unit, quantity)| {
            UsageFact::new(unit, quantity, UsageSource::Provider).map_err(|_| {
                RuntimeError::new(
                    ErrorCode::ProviderProtocolError,
                    "Provider reported invalid usage",
                    false,
                )
            })
        })
        .collect()
    }
}

/// A `tool_use` block of the stream.
#[derive(Debug)]
struct ToolBlock {
    call_id: String,
    /// The start's `input`, compact (`{}` when it stated none).
    start_input: String,
    /// Whether a non-empty fragment of its arguments was emitted.
    argued: bool,
}

/// The state of one response stream.
#[derive(Debug, Default)]
pub struct MessageStream {
    /// Tool-use blocks by index.
    tool_calls: HashMap<u32, ToolBlock>,
    /// Every block index started so far.
    blocks: HashSet<u32>,
    usage: MessageUsage,
}

impl MessageStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Handles one SSE event, appending what it maps to onto `out`. The event type is the
    /// payload's `type`, else the SSE event name.
    pub fn on_event(
        &mut self,
        event: &SseEvent,
        out: &mut Vec<ProviderEvent>,
    ) -> Result<Step, RuntimeError> {
        let payload: Value = serde_json::from_str(&event.data)
            .map_err(|_| protocol_error("Provider returned malformed JSON"))?;
        let kind = match payload.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            _ => event.event.clone(),
        };
        match kind.as_str() {
            "message_start" => {
                let start: MessageStart = shaped(payload)?;
                if let Some(usage) = &start.message.usage {
                    self.usage.merge(usage);
                }
            }
            "content_block_start" => {
                let start: ContentBlockStart = shaped(payload)?;
                self.blocks.insert(start.index);
                if start.content_block.kind == "tool_use" {
                    let (Some(call_id), Some(name)) =
                        (start.content_block.id, start.content_block.name)
                    else {
                        return Err(unexpected_event());
                    };
                    let start_input = match start.content_block.input {
                        Some(Value::Object(input)) => Value::Object(input).to_string(),
                        _ => "{}".to_owned(),
                    };
                    self.tool_calls.insert(
                        start.index,
                        ToolBlock {
                            call_id: call_id.clone(),
                            start_input,
                            argued: false,
                        },
                    );
                    out.push(ProviderEvent::tool_call_started(call_id, name));
                }
            }
            "content_block_stop" => {
                let stop: ContentBlockStop = shaped(payload)?;
                self.close_tool_block(stop.index, out);
            }
            "content_block_delta" => {
                let delta: ContentBlockDelta = shaped(payload)?;
                self.on_delta(delta, out)?;
            }
            "message_delta" => {
                let delta: MessageDelta = shaped(payload)?;
                if let Some(usage) = &delta.usage {
                    self.usage.merge(usage);
                }
            }
            "message_stop" => {
                // Blocks the stream never stopped are complete now.
                let mut open: Vec<u32> = self.tool_calls.keys().copied().collect();
                open.sort_unstable();
                for index in open {
                    self.close_tool_block(index, out);
                }
                out.push(ProviderEvent::Usage(self.usage.facts()?));
                return Ok(Step::Completed);
            }
            "error" => {
                let error: StreamError = shaped(payload)?;
                let mut failure = RuntimeError::new(
                    ErrorCode::ProviderUnavailable,
                    "Provider reported a stream error",
                    false,
                );
                if let Some(code) = error
                    .error
                    .and_then(|e| e.kind)
                    .filter(|code| is_error_type(code))
                {
                    failure = failure.with_provider_code(code);
                }
                return Err(failure);
            }
            // ping and event types added after 2023-06-01.
            _ => {}
        }
        Ok(Step::Continue)
    }

    fn on_delta(
        &mut self,
        delta: ContentBlockDelta,
        out: &mut Vec<ProviderEvent>,
    ) -> Result<(), RuntimeError> {
        match delta.delta.kind.as_str() {
            "text_delta" => {
                let text = delta.delta.text.ok_or_else(unexpected_event)?;
                if !text.is_empty() {
                    out.push(ProviderEvent::output_delta(delta.index, text));
                }
            }
            "input_json_delta" => {
                let fragment = delta.delta.partial_json.ok_or_else(unexpected_event)?;
                match self.tool_calls.get_mut(&delta.index) {
                    Some(block) => {
                        if !fragment.is_empty() {
                            block.argued = true;
                            out.push(ProviderEvent::tool_call_arguments(
                                block.call_id.clone(),
                                fragment,
                            ));
                        }
                    }
                    // Arguments of a server-side tool (`server_tool_use`): not a caller's call.
                    None if self.blocks.contains(&delta.index) => {}
                    None => {
                        return Err(protocol_error(
                            "Provider sent tool arguments without a matching tool call",
                        ));
                    }
                }
            }
            // thinking_delta, signature_delta, citations_delta: not part of the output.
            _ => {}
        }
        Ok(())
    }
}

impl MessageStream {
    /// Ends the `tool_use` block at `index`, if it is one: a block no fragment filled gets the
    /// start's `input` as its arguments (see the module docs).
    fn close_tool_block(&mut self, index: u32, out: &mut Vec<ProviderEvent>) {
        if let Some(block) = self.tool_calls.remove(&index)
            && !block.argued
        {
            out.push(ProviderEvent::tool_call_arguments(
                block.call_id,
                block.start_input,
            ));
        }
    }
}

impl FrameMapper for MessageStream {
    fn on_frame(&mut self, frame: &SseEvent) -> Result<FrameOutcome, RuntimeError> {
        let mut events = Vec::new();
        let step = self.on_event(frame, &mut events)?;
        Ok(FrameOutcome {
            events,
            completed: step == Step::Completed,
        })
    }
}

fn shaped<T: DeserializeOwned>(payload: Value) -> Result<T, RuntimeError> {
    serde_json::from_value(payload).map_err(|_| unexpected_event())
}

/// Anthropic error types are short snake_case words (`overloaded_error`); anything else is not
/// kept as a provider code.
fn is_error_type(code: &str) -> bool {
    (1..=64).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(data: &str) -> SseEvent {
        SseEvent {
            event: "message".into(),
            data: data.into(),
            id: None,
        }
    }

    fn run(frames: &[&str]) -> (Vec<ProviderEvent>, Result<Step, RuntimeError>) {
        let mut stream = MessageStream::new();
        let mut out = Vec::new();
        let mut last = Ok(Step::Continue);
        for frame in frames {
            last = stream.on_event(&sse(frame), &mut out);
            if !matches!(last, Ok(Step::Continue)) {
                break;
            }
        }
        (out, last)
    }

    /// The tool events of `frames` (usage and text left out).
    fn tool_events(frames: &[&str]) -> Vec<ProviderEvent> {
        let (out, last) = run(frames);
        assert_eq!(last, Ok(Step::Completed));
        out.into_iter()
            .filter(|e| {
                matches!(
                    e,
                    ProviderEvent::ToolCallStarted { .. }
                        | ProviderEvent::ToolCallArgumentsDelta { .. }
                )
            })
            .collect()
    }

    #[test]
    fn a_tool_block_no_fragment_filled_gets_the_start_input_as_arguments() {
        let started = ProviderEvent::tool_call_started("toolu_1", "now");
        let args = |json: &str| ProviderEvent::tool_call_arguments("toolu_1", json);
        // Anthropic's stream for a tool without parameters: `{}` at the start, one empty
        // fragment.
        assert_eq!(
            tool_events(&[
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":{}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"message_stop"}"#,
            ]),
            [started.clone(), args("{}")]
        );
        // A server that states the whole input at the start and sends no fragment; and one
        // that never stops the block before the message ends.
        assert_eq!(
            tool_events(&[
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":{"tz":"UTC"}}}"#,
                r#"{"type":"message_stop"}"#,
            ]),
            [started.clone(), args(r#"{"tz":"UTC"}"#)]
        );
        // Fragments that carry the arguments are all there is: the start's `{}` is not added.
        assert_eq!(
            tool_events(&[
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":{}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"tz\":"}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\"UTC\"}"}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"message_stop"}"#,
            ]),
            [started, args(r#"{"tz":"#), args(r#""UTC"}"#)]
        );
    }

    #[test]
    fn usage_is_merged_and_reported_at_stop() {
        let (out, last) = run(&[
            r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"output_tokens":1,"cache_creation_input_tokens":3,"cache_read_input_tokens":null}}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15,"cache_read_input_tokens":7,"thinking_tokens":4}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(last, Ok(Step::Completed));
        let ProviderEvent::Usage(facts) = &out[0] else {
            panic!("{out:?}")
        };
        let pairs: Vec<(&str, f64)> = facts
            .iter()
            .map(|f| (f.unit.as_str(), f.quantity))
            .collect();
        assert_eq!(
            pairs,
            [
                ("input_token", 25.0),
                ("output_token", 15.0),
                ("cache_write_token", 3.0),
                ("cache_read_token", 7.0),
                ("reasoning_token", 4.0)
            ]
        );
        assert!(
            facts
                .iter()
                .all(|f| f.source == UsageSource::Provider && f.complete == Some(true))
        );
    }

    #[test]
    fn the_event_name_is_used_when_the_payload_has_no_type() {
        let mut stream = MessageStream::new();
        let mut out = Vec::new();
        let event = SseEvent {
            event: "message_stop".into(),
            data: "{}".into(),
            id: None,
        };
        assert_eq!(stream.on_event(&event, &mut out), Ok(Step::Completed));
    }

    #[test]
    fn negative_usage_is_a_protocol_error() {
        let (_, last) = run(&[
            r#"{"type":"message_start","message":{"usage":{"input_tokens":-1}}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(last.unwrap_err().code, ErrorCode::ProviderProtocolError);
    }

    #[test]
    fn tool_arguments_need_a_started_block() {
        let (_, last) = run(&[
            r#"{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
        ]);
        let error = last.unwrap_err();
        assert_eq!(error.code, ErrorCode::ProviderProtocolError);
        assert!(!error.retryable);
        // A server-side tool's arguments are skipped.
        let (out, last) = run(&[
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"q\":1}"}}"#,
        ]);
        assert_eq!((out, last), (vec![], Ok(Step::Continue)));
    }

    #[test]
    fn errors_keep_only_a_well_formed_type() {
        let (_, last) = run(&[
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded sk-secret"}}"#,
        ]);
        let error = last.unwrap_err();
        assert_eq!(
            (error.code, error.retryable, error.provider_code.as_deref()),
            (
                ErrorCode::ProviderUnavailable,
                false,
                Some("overloaded_error")
            )
        );
        assert_eq!(error.message, "Provider reported a stream error");
        let (_, last) = run(&[r#"{"type":"error","error":{"type":"Bad Type!"}}"#]);
        assert_eq!(last.unwrap_err().provider_code, None);
    }

    #[test]
    fn malformed_payloads_are_protocol_errors() {
        for frame in [
            "{not json",
            r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","name":"f"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta"}}"#,
        ] {
            let (_, last) = run(&[frame]);
            assert_eq!(
                last.unwrap_err().code,
                ErrorCode::ProviderProtocolError,
                "{frame}"
            );
        }
    }
}
