//! Runtime events: the ordered, resumable log of one execution.
//!
//! The envelope (`status`, `execution_id`, `sequence`, `time`) is assigned only by the runtime;
//! providers produce bodies. On the wire the body's fields come first, then the envelope:
//! `{"type":"output.delta","output_index":0,"delta":"hi","status":"running","execution_id":…,"sequence":3,"time":…}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorCode, RuntimeError};
use crate::id::{ExecutionId, Sequence};
use crate::time::Timestamp;
use crate::usage::UsageFact;

mod decode;

/// Largest serialized terminal event, in bytes [R 47].
pub const MAX_TERMINAL_EVENT_BYTES: usize = 2048;

/// The lifecycle status of an execution, as carried by each event and the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Accepted,
    Routing,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl ExecutionStatus {
    /// Succeeded, failed and cancelled are terminal.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

wire_names!(ExecutionStatus {
    Accepted => "accepted",
    Routing => "routing",
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
    Cancelled => "cancelled",
});

/// One provider/model attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Target {
    pub provider: String,
    pub model: String,
}

/// Phase reported by asynchronous providers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProgressPhase {
    Queued,
    Processing,
}

/// A reference to a provider-produced artifact. The runtime never fetches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OutputArtifact {
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

/// The type-specific part of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type")]
pub enum EventBody {
    /// The runtime accepted the request (always sequence 1).
    #[serde(rename = "execution.accepted")]
    Accepted,
    /// The runtime selected one provider/model attempt.
    #[serde(rename = "route.selected")]
    RouteSelected { target: Target, attempt: u32 },
    /// A retryable attempt failed before fallback.
    #[serde(rename = "route.attempt_failed")]
    RouteAttemptFailed {
        target: Target,
        attempt: u32,
        error: RuntimeError,
    },
    /// Incremental output text.
    #[serde(rename = "output.delta")]
    OutputDelta { output_index: u32, delta: String },
    /// A provider began a named tool call.
    #[serde(rename = "tool.call.started")]
    ToolCallStarted { call_id: String, name: String },
    /// A fragment of a tool call's arguments; callers accumulate before parsing.
    #[serde(rename = "tool.call.arguments.delta")]
    ToolCallArgumentsDelta { call_id: String, delta: String },
    /// An asynchronous provider reports queued or processing progress.
    #[serde(rename = "execution.progress")]
    Progress {
        phase: ProgressPhase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress: Option<f64>,
    },
    /// A normalized asynchronous result with optional artifact references.
    #[serde(rename = "output.result")]
    OutputResult {
        result: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        artifacts: Option<Vec<OutputArtifact>>,
    },
    /// One or more usage facts became available.
    #[serde(rename = "usage.reported")]
    UsageReported { facts: Vec<UsageFact> },
    /// The execution succeeded (terminal).
    #[serde(rename = "execution.completed")]
    Completed { target: Target },
    /// The execution failed or was cancelled (terminal).
    #[serde(rename = "execution.failed")]
    Failed { error: RuntimeError },
}

impl EventBody {
    /// The event type string, e.g. `output.delta`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Accepted => "execution.accepted",
            Self::RouteSelected { .. } => "route.selected",
            Self::RouteAttemptFailed { .. } => "route.attempt_failed",
            Self::OutputDelta { .. } => "output.delta",
            Self::ToolCallStarted { .. } => "tool.call.started",
            Self::ToolCallArgumentsDelta { .. } => "tool.call.arguments.delta",
            Self::Progress { .. } => "execution.progress",
            Self::OutputResult { .. } => "output.result",
            Self::UsageReported { .. } => "usage.reported",
            Self::Completed { .. } => "execution.completed",
            Self::Failed { .. } => "execution.failed",
        }
    }

    /// The status this body carries [R 44]. A failure with code `cancelled` is `cancelled`.
    pub fn status(&self) -> ExecutionStatus {
        match self {
            Self::Accepted => ExecutionStatus::Accepted,
            Self::RouteSelected { .. } | Self::RouteAttemptFailed { .. } => {
                ExecutionStatus::Routing
            }
            Self::OutputDelta { .. }
            | Self::ToolCallStarted { .. }
            | Self::ToolCallArgumentsDelta { .. }
            | Self::Progress { .. }
            | Self::OutputResult { .. }
            | Self::UsageReported { .. } => ExecutionStatus::Running,
            Self::Completed { .. } => ExecutionStatus::Succeeded,
            Self::Failed { error } if error.code == ErrorCode::Cancelled => {
                ExecutionStatus::Cancelled
            }
            Self::Failed { .. } => ExecutionStatus::Failed,
        }
    }

    /// Whether `status` is allowed with this body [R 44].
    pub fn allows_status(&self, status: ExecutionStatus) -> bool {
        match self {
            Self::Failed { .. } => {
                matches!(status, ExecutionStatus::Failed | ExecutionStatus::Cancelled)
            }
            other => other.status() == status,
        }
    }

    /// Terminal events end the log.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Completed { .. } | Self::Failed { .. })
    }

    /// Whether this event exposes output to the caller, which forbids fallback [R 31].
    pub fn exposes_output(&self) -> bool {
        matches!(
            self,
            Self::OutputDelta { .. }
                | Self::OutputResult { .. }
                | Self::ToolCallStarted { .. }
                | Self::ToolCallArgumentsDelta { .. }
        )
    }
}

/// A runtime event: a body plus the runtime-owned envelope. Its decoder is written by hand
/// (`decode`), in one pass over the fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RuntimeEvent {
    #[serde(flatten)]
    pub body: EventBody,
    pub status: ExecutionStatus,
    pub execution_id: ExecutionId,
    pub sequence: Sequence,
    pub time: Timestamp,
}

impl RuntimeEvent {
    /// Wraps a body in its envelope, with the status the body implies.
    pub fn new(
        execution_id: ExecutionId,
        sequence: Sequence,
        time: Timestamp,
        body: EventBody,
    ) -> Self {
        let status = body.status();
        Self {
            body,
            status,
            execution_id,
            sequence,
            time,
        }
    }

    /// The log of `bodies` for one execution: sequences from 1, the event at index `i` stamped
    /// `time(i)` (a log as stores hold it, for fixtures and tests).
    pub fn numbered(
        execution_id: ExecutionId,
        bodies: Vec<EventBody>,
        time: impl Fn(usize) -> Timestamp,
    ) -> Vec<Self> {
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Self::new(execution_id, Sequence(i as u64 + 1), time(i), body))
            .collect()
    }

    /// The event type string.
    pub fn type_name(&self) -> &'static str {
        self.body.type_name()
    }

    /// Whether this event ends the log.
    pub fn is_terminal(&self) -> bool {
        self.body.is_terminal()
    }

    /// Serializes to compact JSON ([`RuntimeEvent::to_json_vec`]).
    pub fn to_json(&self) -> String {
        String::from_utf8(self.to_json_vec()).unwrap_or_else(|_| String::from("{}"))
    }

    /// Serializes to compact JSON, the bytes [`Serialize`] writes. The body goes through its
    /// derived serializer (the type tag, then its fields), except an `output.delta`'s, the
    /// event written most, which is written directly, and the envelope is appended directly:
    /// `#[serde(flatten)]` would run every field through serde's map adapter, and the id
    /// through the string escaper, for every event a worker writes (a token delta took about
    /// 300 ns that way, 100 ns this way).
    /// Serialization of these types cannot fail except for non-finite floats, which validated
    /// events never contain; the fallback keeps the log well-formed anyway.
    pub fn to_json_vec(&self) -> Vec<u8> {
        let text = match &self.body {
            EventBody::OutputDelta { delta, .. }
            | EventBody::ToolCallArgumentsDelta { delta, .. } => delta.len(),
            _ => 96,
        };
        let mut out = Vec::with_capacity(ENVELOPE_BYTES + text);
        if let EventBody::OutputDelta {
            output_index,
            delta,
        } = &self.body
        {
            out.extend_from_slice(b"{\"type\":\"output.delta\",\"output_index\":");
            out.extend_from_slice(itoa::Buffer::new().format(*output_index).as_bytes());
            out.extend_from_slice(b",\"delta\":");
            if serde_json::to_writer(&mut out, delta).is_err() {
                return b"{}".to_vec();
            }
        } else if serde_json::to_writer(&mut out, &self.body).is_err() || out.pop() != Some(b'}') {
            return b"{}".to_vec();
        }
        out.extend_from_slice(b",\"status\":\"");
        out.extend_from_slice(self.status.as_str().as_bytes());
        out.extend_from_slice(b"\",\"execution_id\":\"");
        let mut id = uuid::Uuid::encode_buffer();
        out.extend_from_slice(
            self.execution_id
                .as_uuid()
                .hyphenated()
                .encode_lower(&mut id)
                .as_bytes(),
        );
        out.extend_from_slice(b"\",\"sequence\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.sequence.0).as_bytes());
        out.extend_from_slice(b",\"time\":");
        if serde_json::to_writer(&mut out, &self.time).is_err() {
            return b"{}".to_vec();
        }
        out.push(b'}');
        out
    }
}

/// About what an event's JSON takes besides its text: the type tag, the envelope (status,
/// a 36-character id, a sequence, a 24-character time) and a few small fields.
const ENVELOPE_BYTES: usize = 176;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::{UsageSource, UsageUnit};

    fn sample(body: EventBody) -> RuntimeEvent {
        RuntimeEvent::new(
            ExecutionId::new_random(),
            Sequence(3),
            Timestamp::from_unix_millis(0),
            body,
        )
    }

    #[test]
    fn envelope_follows_body_fields_on_the_wire() {
        let e = sample(EventBody::OutputDelta {
            output_index: 0,
            delta: "hi".into(),
        });
        let json = e.to_json();
        let expected = format!(
            r#"{{"type":"output.delta","output_index":0,"delta":"hi","status":"running","execution_id":"{}","sequence":3,"time":"1970-01-01T00:00:00.000Z"}}"#,
            e.execution_id
        );
        assert_eq!(json, expected);
        let back: RuntimeEvent =
            serde_json::from_str(&json).unwrap_or_else(|_| sample(EventBody::Accepted));
        assert_eq!(back, e);
    }

    #[test]
    fn every_body_round_trips() {
        let target = Target {
            provider: "p".into(),
            model: "m".into(),
        };
        let bodies = vec![
            EventBody::Accepted,
            EventBody::RouteSelected {
                target: target.clone(),
                attempt: 1,
            },
            EventBody::RouteAttemptFailed {
                target: target.clone(),
                attempt: 1,
                error: RuntimeError::provider_queue_full(),
            },
            EventBody::OutputDelta {
                output_index: 2,
                delta: "x".into(),
            },
            EventBody::ToolCallStarted {
                call_id: "c".into(),
                name: "n".into(),
            },
            EventBody::ToolCallArgumentsDelta {
                call_id: "c".into(),
                delta: "{".into(),
            },
            EventBody::Progress {
                phase: ProgressPhase::Queued,
                progress: None,
            },
            EventBody::OutputResult {
                result: serde_json::json!({"a":1}),
                artifacts: Some(vec![OutputArtifact {
                    uri: "https://x/y.png".into(),
                    media_type: None,
                }]),
            },
            EventBody::UsageReported {
                facts: vec![
                    UsageFact::new(UsageUnit::request(), 1.0, UsageSource::Runtime)
                        .unwrap_or_else(|_| unreachable!()),
                ],
            },
            EventBody::Completed { target },
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        ];
        for body in bodies {
            let e = sample(body);
            let back: RuntimeEvent = serde_json::from_str(&e.to_json())
                .unwrap_or_else(|err| panic!("{err}: {}", e.to_json()));
            assert_eq!(back, e);
            // The hand-appended envelope writes what the derived serializer writes.
            assert_eq!(
                e.to_json_vec(),
                serde_json::to_vec(&e).unwrap_or_default(),
                "{}",
                e.to_json()
            );
            assert_eq!(
                serde_json::to_value(&e)
                    .ok()
                    .and_then(|v| v.get("type").cloned()),
                Some(e.type_name().into())
            );
        }
    }

    #[test]
    fn the_envelope_is_written_as_the_derived_serializer_writes_it() {
        let id = ExecutionId::new_random();
        let events = [
            // Escapes, control characters and non-ASCII text in the body.
            RuntimeEvent::new(
                id,
                Sequence(u64::MAX),
                Timestamp::from_unix_millis(1_780_000_000_123),
                EventBody::OutputDelta {
                    output_index: u32::MAX,
                    delta: "a\"b\\c\n\u{1}\u{7f}é😀</script>".into(),
                },
            ),
            // A time past year 9999 (written by the formatter, not the fixed-width path).
            RuntimeEvent::new(
                id,
                Sequence(1),
                Timestamp::from_unix_millis(300_000_000_000_000),
                EventBody::Accepted,
            ),
            // A time before 1970, and a progress with its optional field.
            RuntimeEvent::new(
                id,
                Sequence(7),
                Timestamp::from_unix_millis(-86_400_001),
                EventBody::Progress {
                    phase: ProgressPhase::Processing,
                    progress: Some(0.25),
                },
            ),
        ];
        for e in events {
            let derived = serde_json::to_vec(&e).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&e.to_json_vec()),
                String::from_utf8_lossy(&derived)
            );
        }
    }

    #[test]
    fn status_rules() {
        assert_eq!(
            EventBody::Failed {
                error: RuntimeError::cancelled()
            }
            .status(),
            ExecutionStatus::Cancelled
        );
        assert_eq!(
            EventBody::Failed {
                error: RuntimeError::internal()
            }
            .status(),
            ExecutionStatus::Failed
        );
        assert!(
            EventBody::Failed {
                error: RuntimeError::internal()
            }
            .allows_status(ExecutionStatus::Cancelled)
        );
        assert!(!EventBody::Accepted.allows_status(ExecutionStatus::Running));
    }
}
