//! The provider adapter contract and the adapters.
//!
//! An adapter translates one attempt: it turns the request into the provider's wire format,
//! reads what the provider sends, and reports it through a [`ProviderSink`] as
//! [`ProviderEvent`]s. It never assigns sequences, timestamps or execution ids, never decides
//! about fallback, and never touches the event store: the runner does all of that.
//!
//! Adapters (one folder each): [`mock`], [`openai_responses`], [`openai_chat`],
//! [`anthropic_messages`], [`fal_queue`]. Their sections of the deployment file, manifests
//! and request policies are the `providers` crate's (the gateway checks capabilities with
//! them); [`catalog`] builds each type's adapter from its parsed section.
//!
//! The kit the adapters share (an adapter imports from these and never from another adapter):
//! - [`http`]: the one HTTP client, status classification, bounded bodies and SSE frames.
//! - [`frame_loop`]: the streaming attempt: request, frames through a `FrameMapper`, completion.
//! - [`credential`]: `Secret`, `KeySource`, sensitive headers, scrubbing echoed keys.
//! - [`extension`]: `extensions.<key>.<field>` shape checks, tool policy, copies.
//! - [`text`]: what the text adapters keep from their section, and their attempt.
//! - [`openai_compat`]: the OpenAI-compatible adapter, generic over its dialect (Responses,
//!   Chat Completions), including the body both dialects send (one user message).
//! - [`usage`]: usage facts from a table of counter paths.

pub mod anthropic_messages;
pub mod catalog;
pub mod credential;
pub mod extension;
pub mod fal_queue;
pub mod frame_loop;
pub mod http;
pub mod mock;
pub mod openai_chat;
pub mod openai_compat;
pub mod openai_responses;
pub mod text;
pub mod usage;

use async_trait::async_trait;
use protocol::event::{OutputArtifact, ProgressPhase};
use protocol::manifest::ProviderManifest;
use protocol::{ExecutionRequest, RuntimeError, UsageFact};
use tokio_util::sync::CancellationToken;

/// What an adapter reports during an attempt. The runner wraps each in a runtime event.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderEvent {
    OutputDelta {
        output_index: u32,
        delta: String,
    },
    ToolCallStarted {
        call_id: String,
        name: String,
    },
    ToolCallArgumentsDelta {
        call_id: String,
        delta: String,
    },
    Progress {
        phase: ProgressPhase,
        progress: Option<f64>,
    },
    OutputResult {
        result: serde_json::Value,
        artifacts: Option<Vec<OutputArtifact>>,
    },
    Usage(Vec<UsageFact>),
}

impl ProviderEvent {
    /// [`OutputDelta`](Self::OutputDelta): `delta` appended to output `output_index`.
    pub fn output_delta(output_index: u32, delta: impl Into<String>) -> Self {
        Self::OutputDelta {
            output_index,
            delta: delta.into(),
        }
    }

    /// [`ToolCallStarted`](Self::ToolCallStarted): the provider began call `call_id` of `name`.
    pub fn tool_call_started(call_id: impl Into<String>, name: impl Into<String>) -> Self {
        Self::ToolCallStarted {
            call_id: call_id.into(),
            name: name.into(),
        }
    }

    /// [`ToolCallArgumentsDelta`](Self::ToolCallArgumentsDelta): a fragment of the arguments of
    /// call `call_id`.
    pub fn tool_call_arguments(call_id: impl Into<String>, delta: impl Into<String>) -> Self {
        Self::ToolCallArgumentsDelta {
            call_id: call_id.into(),
            delta: delta.into(),
        }
    }
}

/// Where an adapter reports events. `emit` fails once the attempt must stop (cancelled,
/// deadline, fenced by another writer, store failure); the adapter then returns that error.
#[async_trait]
pub trait ProviderSink: Send {
    async fn emit(&mut self, event: ProviderEvent) -> Result<(), RuntimeError>;
}

/// One attempt's inputs.
#[derive(Debug, Clone)]
pub struct ProviderCall<'a> {
    pub request: &'a ExecutionRequest,
    /// The configured model this attempt targets.
    pub model: &'a str,
    /// Cancelled when the execution is cancelled or its deadline passes. Adapters that hold
    /// remote state (fal) run their bounded cleanup when it fires; the runner drops the attempt
    /// after a short grace period regardless.
    pub cancel: CancellationToken,
}

/// What one attempt ends with: `Ok(())` when the provider completed it, else its classified
/// error (see [`Provider`]'s contract).
pub type AttemptResult = Result<(), RuntimeError>;

/// A configured provider.
///
/// Contract:
/// - `manifest()` describes exactly what the deployment declared for its models (never
///   inferred from the adapter name); `manifest().provider == id()`.
/// - `execute` returns `Ok(())` only when the provider completed the attempt; a stream that ends
///   without the provider's completion signal is `provider_protocol_error`.
/// - Errors are classified where they are created: `retryable` is true only when nothing the
///   provider may have accepted would be repeated by a new attempt.
/// - Credentials are read at execution time from the deployment's environment and never appear
///   in events or errors.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider id: by default, and necessarily, the manifest's `provider`.
    fn id(&self) -> &str {
        &self.manifest().provider
    }

    fn manifest(&self) -> &ProviderManifest;

    /// Adapter policy beyond the manifest, checked at routing and at submit: for example text
    /// adapters refuse `extensions.<provider>.request` that would enable tools the deployment
    /// disabled [R 68]. Must not read credentials or do I/O.
    fn admits(&self, _request: &ExecutionRequest) -> bool {
        true
    }

    async fn execute(&self, call: ProviderCall<'_>, sink: &mut dyn ProviderSink) -> AttemptResult;
}
