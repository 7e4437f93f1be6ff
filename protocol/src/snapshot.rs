//! Response shapes: the materialized snapshot, submission, result, cancel and runtime info.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RuntimeError;
use crate::event::{ExecutionStatus, OutputArtifact, Target};
use crate::id::{ExecutionId, Sequence};
use crate::time::Timestamp;
use crate::usage::UsageFact;

/// The materialized state of one execution [R 17, 56-59].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionSnapshot {
    pub execution_id: ExecutionId,
    pub status: ExecutionStatus,
    pub created_at: Timestamp,
    /// Time of the last event (or `created_at`).
    pub updated_at: Timestamp,
    pub last_sequence: Sequence,
    /// Every usage fact in order, concatenated, never summed.
    pub usage: Vec<UsageFact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RuntimeError>,
    /// Either the synthesized [`SynthesizedResult`] or the last `output.result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<OutputArtifact>>,
}

/// The result built from text and tool events when no `output.result` exists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SynthesizedResult {
    pub outputs: Vec<TextOutput>,
    pub tool_calls: Vec<ToolCall>,
}

/// Concatenated text of one `output_index`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TextOutput {
    pub index: u32,
    /// Always `"text"`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

/// A tool call with its concatenated argument text (not parsed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

/// `POST /v1/executions` response [R 15, 10].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionSubmission {
    pub execution_id: ExecutionId,
    /// `accepted` for a new execution, the current status on an idempotent replay.
    pub status: ExecutionStatus,
    pub created_at: Timestamp,
    pub idempotent_replay: bool,
}

/// `GET /v1/executions/{id}/result` on success [R 19].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionResultResponse {
    pub execution_id: ExecutionId,
    pub target: Option<Target>,
    pub result: Option<Value>,
    pub artifacts: Vec<OutputArtifact>,
    pub usage: Vec<UsageFact>,
}

/// `GET /v1/executions/{id}/result` before success: 409 [R 20].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ResultNotReady {
    pub status: ExecutionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RuntimeError>,
}

/// `POST /v1/executions/{id}/cancel` responses [R 21]: `cancellation_requested` or `not_found`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CancelResponse {
    pub status: CancelStatus,
}

/// See [`CancelResponse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    CancellationRequested,
    NotFound,
}

/// Readiness of the runtime as reported by `/v1/runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RuntimeState {
    Ready,
    Stopping,
    Unavailable,
}

/// Feature flags of `/v1/runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RuntimeFeatures {
    pub routing: bool,
    pub flow_control: bool,
    pub usage_facts: bool,
    pub billing: bool,
}

/// `GET /v1/runtime` [R 22].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RuntimeInfo {
    /// Always `model-runtime-api`.
    pub name: String,
    pub protocol_version: String,
    pub provider_count: usize,
    pub state: RuntimeState,
    pub features: RuntimeFeatures,
}

impl RuntimeInfo {
    /// The runtime info for `provider_count` providers in `state`.
    pub fn new(provider_count: usize, state: RuntimeState) -> Self {
        Self {
            name: "model-runtime-api".into(),
            protocol_version: crate::PROTOCOL_VERSION.into(),
            provider_count,
            state,
            features: RuntimeFeatures {
                routing: true,
                flow_control: true,
                usage_facts: true,
                billing: false,
            },
        }
    }
}
