//! Maps a Chat Completions stream (`chat.completion.chunk` objects, then `data: [DONE]`) to
//! [`ProviderEvent`]s.
//!
//! Tool calls arrive as fragments keyed by their position (`tool_calls[j].index`) within a
//! choice: the first fragment carries the call's `id` and `function.name`, later ones only
//! argument text. The mapper remembers, per `(choice index, tool index)`, the call id it
//! announced, and resolves later fragments through it. A fragment carrying an id that differs
//! from the one known for its position starts a new call (servers that omit `index` and send
//! each call whole); a repeated identical id continues the call (servers that resend it).
//!
//! Usage: servers may send usage on the final chunk only (OpenAI with `include_usage`) or, when
//! configured so, cumulatively on every chunk (vLLM `continuous_usage_stats`). The mapper keeps
//! the last usage seen and reports it once, at `[DONE]`, so cumulative counts are never listed
//! twice.
//!
//! `finish_reason` (`stop`, `length`, `tool_calls`, `content_filter`) does not change the
//! outcome: the attempt completes at `[DONE]` whatever the reason. The reason is logged (as one
//! of those labels or `other`, never the provider's string).

use std::collections::HashMap;

use protocol::sse::SseEvent;
use protocol::{RuntimeError, UsageFact, UsageUnit};

use super::wire;
use crate::provider::ProviderEvent;
use crate::provider::frame_loop::{FrameMapper, FrameOutcome, decode, parse_data, stream_failure};
use crate::provider::http::protocol_error;
use crate::provider::usage::{UsageMapping, usage_facts};

/// Chat Completions usage counters and their units (contract section 5).
const USAGE: &[UsageMapping] = &[
    (&["prompt_tokens"], UsageUnit::input_token),
    (&["completion_tokens"], UsageUnit::output_token),
    (
        &["prompt_tokens_details", "cached_tokens"],
        UsageUnit::cache_read_token,
    ),
    (
        &["completion_tokens_details", "reasoning_tokens"],
        UsageUnit::reasoning_token,
    ),
];

/// The Chat Completions stream state. See the module docs.
#[derive(Debug, Default)]
pub struct ChatStream {
    /// `(choice index, tool call index)` → call id.
    calls: HashMap<(u32, u32), String>,
    /// Facts of the last usage object seen, reported at `[DONE]`.
    usage: Option<Vec<UsageFact>>,
}

impl ChatStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps one tool-call fragment of choice `choice`, at position `position` in `tool_calls`.
    fn tool_call(
        &mut self,
        choice: u32,
        position: u32,
        fragment: wire::ToolCallDelta,
        events: &mut Vec<ProviderEvent>,
    ) -> Result<(), RuntimeError> {
        let key = (choice, fragment.index.unwrap_or(position));
        let function = fragment.function.unwrap_or_default();
        let id = fragment.id.filter(|id| !id.is_empty());
        let known = self.calls.get(&key).cloned();
        let call_id = match (id, known) {
            (Some(id), Some(known)) if known == id => id,
            (Some(id), _) => {
                let name = function
                    .name
                    .ok_or_else(|| protocol_error("Provider sent a tool call without a name"))?;
                self.calls.insert(key, id.clone());
                events.push(ProviderEvent::tool_call_started(id.clone(), name));
                id
            }
            (None, Some(known)) => known,
            (None, None) => return Err(protocol_error("Provider sent a tool call without an id")),
        };
        if let Some(delta) = function.arguments.filter(|a| !a.is_empty()) {
            events.push(ProviderEvent::tool_call_arguments(call_id, delta));
        }
        Ok(())
    }
}

/// A bounded label for a finish reason, safe to log.
fn finish_label(reason: &str) -> &'static str {
    match reason {
        "stop" => "stop",
        "length" => "length",
        "tool_calls" => "tool_calls",
        "content_filter" => "content_filter",
        "function_call" => "function_call",
        _ => "other",
    }
}

impl FrameMapper for ChatStream {
    fn on_frame(&mut self, frame: &SseEvent) -> Result<FrameOutcome, RuntimeError> {
        if frame.data.trim() == "[DONE]" {
            let events = match self.usage.take() {
                Some(facts) if !facts.is_empty() => vec![ProviderEvent::Usage(facts)],
                _ => Vec::new(),
            };
            return Ok(FrameOutcome {
                events,
                completed: true,
            });
        }
        if frame.event == "error" {
            return Err(stream_failure());
        }
        let payload = parse_data(frame)?;
        // Servers report a failure after the stream started as a chunk `{"error": {...}}`.
        if payload.get("error").is_some_and(|e| !e.is_null()) {
            return Err(stream_failure());
        }
        let chunk: wire::Chunk = decode(payload)?;
        let mut events = Vec::new();
        for (position, choice) in chunk.choices.unwrap_or_default().into_iter().enumerate() {
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            let index = choice.index.unwrap_or(position);
            if let Some(delta) = choice.delta {
                if let Some(content) = delta.content.filter(|c| !c.is_empty()) {
                    events.push(ProviderEvent::output_delta(index, content));
                }
                for (j, fragment) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let j = u32::try_from(j).unwrap_or(u32::MAX);
                    self.tool_call(index, j, fragment, &mut events)?;
                }
            }
            if let Some(reason) = choice.finish_reason {
                tracing::debug!(
                    choice = index,
                    finish_reason = finish_label(&reason),
                    "provider finished a choice"
                );
            }
        }
        if let Some(usage) = chunk.usage.filter(|u| !u.is_null()) {
            self.usage = Some(usage_facts(&usage, USAGE)?);
        }
        Ok(FrameOutcome {
            events,
            completed: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{ErrorCode, UsageSource};

    fn data(data: &str) -> SseEvent {
        SseEvent {
            event: "message".into(),
            data: data.into(),
            id: None,
        }
    }

    fn chunk(choices: &str) -> SseEvent {
        data(&format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":{choices},"usage":null}}"#
        ))
    }

    /// The events `s` maps from a chunk with these `choices`.
    fn chunk_events(s: &mut ChatStream, choices: &str) -> Vec<ProviderEvent> {
        s.on_frame(&chunk(choices)).unwrap().events
    }

    #[test]
    fn content_deltas_use_the_choice_index() {
        let mut s = ChatStream::new();
        let first = s
            .on_frame(&chunk(
                r#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
            ))
            .unwrap();
        assert_eq!(first, FrameOutcome::default());
        assert_eq!(
            chunk_events(
                &mut s,
                r#"[{"index":1,"delta":{"content":"B"},"finish_reason":null},{"index":0,"delta":{"content":"A"},"finish_reason":"length"}]"#
            ),
            [
                ProviderEvent::output_delta(1, "B"),
                ProviderEvent::output_delta(0, "A")
            ]
        );
        // No index: position in `choices`.
        let positional = s
            .on_frame(&data(
                r#"{"choices":[{"delta":{"content":"x"}},{"delta":{"content":"y"}}]}"#,
            ))
            .unwrap();
        assert_eq!(
            positional.events,
            [
                ProviderEvent::output_delta(0, "x"),
                ProviderEvent::output_delta(1, "y")
            ]
        );
    }

    #[test]
    fn tool_call_fragments_are_keyed_by_index() {
        let mut s = ChatStream::new();
        // Frames of one stream, in order, and the events each maps to.
        for (choices, expected) in [
            (
                r#"[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]"#,
                vec![ProviderEvent::tool_call_started("call_A", "get_weather")],
            ),
            (
                r#"[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_B","type":"function","function":{"name":"get_time","arguments":"{\"tz\""}}]},"finish_reason":null}]"#,
                vec![
                    ProviderEvent::tool_call_started("call_B", "get_time"),
                    ProviderEvent::tool_call_arguments("call_B", "{\"tz\""),
                ],
            ),
            (
                r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}},{"index":1,"function":{"arguments":":\"UTC\"}"}}]},"finish_reason":null}]"#,
                vec![
                    ProviderEvent::tool_call_arguments("call_A", "{\"city\":"),
                    ProviderEvent::tool_call_arguments("call_B", ":\"UTC\"}"),
                ],
            ),
            // A resent identical id continues the call.
            (
                r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_A","function":{"arguments":"\"Paris\"}"}}]},"finish_reason":"tool_calls"}]"#,
                vec![ProviderEvent::tool_call_arguments("call_A", "\"Paris\"}")],
            ),
        ] {
            assert_eq!(chunk_events(&mut s, choices), expected, "{choices}");
        }
        // Whole calls without an index: a new id at a known position is a new call.
        let mut whole = ChatStream::new();
        for (id, name) in [("c1", "f"), ("c2", "g")] {
            let o = whole
                .on_frame(&data(&format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"id":"{id}","type":"function","function":{{"name":"{name}","arguments":"{{}}"}}}}]}}}}]}}"#
                )))
                .unwrap();
            assert_eq!(
                o.events,
                [
                    ProviderEvent::tool_call_started(id, name),
                    ProviderEvent::tool_call_arguments(id, "{}")
                ]
            );
        }
    }

    #[test]
    fn malformed_tool_calls_are_protocol_errors() {
        for bad in [
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]"#,
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"arguments":"{}"}}]}}]"#,
            r#"[{"index":0,"delta":{"tool_calls":[{"index":-1,"id":"c"}]}}]"#,
        ] {
            let e = ChatStream::new().on_frame(&chunk(bad)).unwrap_err();
            assert_eq!(
                (e.code, e.retryable),
                (ErrorCode::ProviderProtocolError, false),
                "{bad}"
            );
        }
    }

    #[test]
    fn usage_is_reported_once_at_done() {
        let mut s = ChatStream::new();
        let u = |p: u32| {
            data(&format!(
                r#"{{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{{"prompt_tokens":{p},"completion_tokens":5,"total_tokens":9,"prompt_tokens_details":{{"cached_tokens":2,"audio_tokens":0}},"completion_tokens_details":{{"reasoning_tokens":1,"accepted_prediction_tokens":0}}}}}}"#
            ))
        };
        assert_eq!(s.on_frame(&u(3)).unwrap(), FrameOutcome::default());
        assert_eq!(s.on_frame(&u(4)).unwrap(), FrameOutcome::default());
        let done = s.on_frame(&data("[DONE]")).unwrap();
        let fact = |unit, q| UsageFact::new(unit, q, UsageSource::Provider).unwrap();
        assert_eq!(
            done,
            FrameOutcome {
                events: vec![ProviderEvent::Usage(vec![
                    fact(UsageUnit::input_token(), 4.0),
                    fact(UsageUnit::output_token(), 5.0),
                    fact(UsageUnit::cache_read_token(), 2.0),
                    fact(UsageUnit::reasoning_token(), 1.0),
                ])],
                completed: true
            }
        );
        assert_eq!(
            ChatStream::new().on_frame(&data("[DONE]")).unwrap(),
            FrameOutcome {
                events: vec![],
                completed: true
            }
        );
    }

    #[test]
    fn errors_are_fixed_and_not_retryable() {
        for failure in [
            data(r#"{"error":{"message":"sk-CANARY leaked","type":"server_error","code":500}}"#),
            data(r#"{"object":"error","error":"boom"}"#),
            SseEvent {
                event: "error".into(),
                data: r#"{"message":"x"}"#.into(),
                id: None,
            },
        ] {
            let e = ChatStream::new().on_frame(&failure).unwrap_err();
            assert_eq!(
                (e.code, e.retryable, e.message.as_str(), e.provider_code),
                (
                    ErrorCode::ProviderUnavailable,
                    false,
                    "Provider response failed",
                    None
                )
            );
        }
        for bad in [
            "{",
            r#"{"choices":[{"delta":{"content":7}}]}"#,
            r#"{"choices":{}}"#,
        ] {
            let e = ChatStream::new().on_frame(&data(bad)).unwrap_err();
            assert_eq!(e.code, ErrorCode::ProviderProtocolError, "{bad}");
        }
        // `"error": null` is not a failure.
        assert!(
            ChatStream::new()
                .on_frame(&data(r#"{"choices":[],"error":null}"#))
                .is_ok()
        );
    }
}
