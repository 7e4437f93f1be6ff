//! `Transcript`: what a caller has seen of an execution, accumulated event by event.
//!
//! It is the client-side counterpart of the snapshot's materialized result [R 56-59], but it
//! accepts a stream that starts anywhere (`watch --after N`), so it does not insist on
//! `execution.accepted` first: text deltas by output index, tool calls with their argument
//! fragments, the last `output.result`, the usage facts in order, the last target and the
//! terminal outcome.

use std::collections::BTreeMap;

use protocol::event::OutputArtifact;
use protocol::snapshot::ToolCall;
use protocol::{EventBody, ExecutionStatus, RuntimeError, RuntimeEvent, Target, UsageFact};
use serde_json::Value;

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `execution.completed`.
    Succeeded { target: Target },
    /// `execution.failed` with a code other than `cancelled`.
    Failed { error: RuntimeError },
    /// `execution.failed` with code `cancelled`.
    Cancelled { error: RuntimeError },
}

/// Accumulated output of the events applied so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transcript {
    /// Text by `output_index`, deltas concatenated.
    pub outputs: BTreeMap<u32, String>,
    /// Tool calls in the order they started, arguments concatenated. Argument fragments of an
    /// unknown call are ignored, as the snapshot does.
    pub tool_calls: Vec<ToolCall>,
    /// The last `output.result` and its artifacts.
    pub result: Option<(Value, Vec<OutputArtifact>)>,
    /// Every usage fact, in order (never summed).
    pub usage: Vec<UsageFact>,
    /// The last selected or completing target.
    pub target: Option<Target>,
    /// Set by the terminal event.
    pub outcome: Option<Outcome>,
    /// The status of the last event applied.
    pub status: Option<ExecutionStatus>,
}

impl Transcript {
    /// An empty transcript.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event in.
    pub fn apply(&mut self, event: &RuntimeEvent) {
        self.status = Some(event.status);
        match &event.body {
            EventBody::Accepted | EventBody::Progress { .. } => {}
            EventBody::RouteSelected { target, .. }
            | EventBody::RouteAttemptFailed { target, .. } => {
                self.target = Some(target.clone());
            }
            EventBody::OutputDelta {
                output_index,
                delta,
            } => self
                .outputs
                .entry(*output_index)
                .or_default()
                .push_str(delta),
            EventBody::ToolCallStarted { call_id, name } => self.tool_calls.push(ToolCall {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: String::new(),
            }),
            EventBody::ToolCallArgumentsDelta { call_id, delta } => {
                if let Some(call) = self
                    .tool_calls
                    .iter_mut()
                    .rev()
                    .find(|c| &c.call_id == call_id)
                {
                    call.arguments.push_str(delta);
                }
            }
            EventBody::OutputResult { result, artifacts } => {
                self.result = Some((result.clone(), artifacts.clone().unwrap_or_default()));
            }
            EventBody::UsageReported { facts } => self.usage.extend(facts.iter().cloned()),
            EventBody::Completed { target } => {
                self.target = Some(target.clone());
                self.outcome = Some(Outcome::Succeeded {
                    target: target.clone(),
                });
            }
            EventBody::Failed { error } => {
                self.outcome = Some(if event.status == ExecutionStatus::Cancelled {
                    Outcome::Cancelled {
                        error: error.clone(),
                    }
                } else {
                    Outcome::Failed {
                        error: error.clone(),
                    }
                });
            }
        }
    }

    /// All text outputs joined in index order.
    pub fn text(&self) -> String {
        self.outputs.values().map(String::as_str).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use protocol::{ErrorCode, ExecutionId, Sequence, Timestamp};

    /// Event `seq` of a random execution at the epoch (also used by the CLI output tests).
    pub(crate) fn event(seq: u64, body: EventBody) -> RuntimeEvent {
        RuntimeEvent::new(
            ExecutionId::new_random(),
            Sequence(seq),
            Timestamp::from_unix_millis(0),
            body,
        )
    }

    #[test]
    fn accumulates_text_tools_and_outcome() {
        let mut t = Transcript::new();
        t.apply(&event(
            3,
            EventBody::OutputDelta {
                output_index: 1,
                delta: "b".into(),
            },
        ));
        t.apply(&event(
            4,
            EventBody::OutputDelta {
                output_index: 0,
                delta: "a".into(),
            },
        ));
        t.apply(&event(
            5,
            EventBody::ToolCallStarted {
                call_id: "c1".into(),
                name: "lookup".into(),
            },
        ));
        for piece in ["{\"q\":", "1}"] {
            t.apply(&event(
                6,
                EventBody::ToolCallArgumentsDelta {
                    call_id: "c1".into(),
                    delta: piece.into(),
                },
            ));
        }
        t.apply(&event(
            7,
            EventBody::ToolCallArgumentsDelta {
                call_id: "unknown".into(),
                delta: "x".into(),
            },
        ));
        t.apply(&event(
            8,
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        ));
        assert_eq!(t.text(), "ab");
        assert_eq!(t.tool_calls.len(), 1);
        assert_eq!(t.tool_calls[0].arguments, "{\"q\":1}");
        assert!(matches!(
            t.outcome,
            Some(Outcome::Cancelled { ref error }) if error.code == ErrorCode::Cancelled
        ));
    }
}
