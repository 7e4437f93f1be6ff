//! Portable error codes and the error object carried in events and HTTP responses.
//!
//! Callers branch on `code` and `retryable`; `provider_code` is diagnostic evidence only and
//! never replaces the portable code. Messages are fixed sentences chosen by the runtime: nothing
//! the caller or a provider sent is ever copied into them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The portable error codes of Model Runtime API 0.1.0, plus `not_found`, `idempotency_conflict`,
/// `unavailable`, `unauthenticated` and `permission_denied`, which this runtime uses on its
/// synchronous HTTP endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    CapabilityUnavailable,
    QueueFull,
    RateLimited,
    DeadlineExceeded,
    Cancelled,
    ProviderUnavailable,
    ProviderProtocolError,
    InternalError,
    NotFound,
    IdempotencyConflict,
    Unavailable,
    Unauthenticated,
    PermissionDenied,
}

wire_names!(ErrorCode {
    InvalidRequest => "invalid_request",
    CapabilityUnavailable => "capability_unavailable",
    QueueFull => "queue_full",
    RateLimited => "rate_limited",
    DeadlineExceeded => "deadline_exceeded",
    Cancelled => "cancelled",
    ProviderUnavailable => "provider_unavailable",
    ProviderProtocolError => "provider_protocol_error",
    InternalError => "internal_error",
    NotFound => "not_found",
    IdempotencyConflict => "idempotency_conflict",
    Unavailable => "unavailable",
    Unauthenticated => "unauthenticated",
    PermissionDenied => "permission_denied",
});

/// The error object of `execution.failed`, `route.attempt_failed` and error responses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RuntimeError {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
    /// Provider-native code (for example an HTTP status) kept as diagnostic evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
}

impl RuntimeError {
    /// An error with a fixed message and no provider code.
    pub fn new(code: ErrorCode, message: impl Into<String>, retryable: bool) -> Self {
        Self {
            code,
            message: message.into(),
            retryable,
            provider_code: None,
        }
    }

    /// Adds provider-native diagnostic evidence.
    pub fn with_provider_code(mut self, provider_code: impl Into<String>) -> Self {
        self.provider_code = Some(provider_code.into());
        self
    }

    /// The same error marked non-retryable (used once output has been exposed).
    pub fn not_retryable(mut self) -> Self {
        self.retryable = false;
        self
    }

    /// `cancelled`: "Execution was cancelled".
    pub fn cancelled() -> Self {
        Self::new(ErrorCode::Cancelled, "Execution was cancelled", false)
    }

    /// `deadline_exceeded`: terminal, never retried by the runtime.
    pub fn deadline_exceeded() -> Self {
        Self::new(
            ErrorCode::DeadlineExceeded,
            "Execution deadline was exceeded",
            false,
        )
    }

    /// The terminal failure of an execution that was accepted but never queued to run: its job
    /// could not be published, or its submission's idempotency key turned out to be bound to
    /// another execution. Its id was never given to a caller as a running execution.
    pub fn unqueued() -> Self {
        Self::new(
            ErrorCode::InternalError,
            "Execution could not be queued",
            false,
        )
    }

    /// No configured model serves the request.
    pub fn capability_unavailable() -> Self {
        Self::new(
            ErrorCode::CapabilityUnavailable,
            "No provider satisfies the requested ability and capabilities",
            false,
        )
    }

    /// A provider's own queue is full; retryable so that fallback may apply.
    pub fn provider_queue_full() -> Self {
        Self::new(
            ErrorCode::QueueFull,
            "Provider execution queue is full",
            true,
        )
    }

    /// A provider stream ended without completing.
    pub fn stream_ended_early() -> Self {
        Self::new(
            ErrorCode::ProviderProtocolError,
            "Provider stream ended without a completion event",
            false,
        )
    }

    /// The generic internal error; details go to logs only.
    pub fn internal() -> Self {
        Self::new(
            ErrorCode::InternalError,
            "Runtime request could not be completed",
            false,
        )
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for RuntimeError {}

/// The body of every JSON error response: `{"error":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorResponse {
    pub error: RuntimeError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialize_as_snake_case_and_match_as_str() {
        for code in [
            ErrorCode::InvalidRequest,
            ErrorCode::CapabilityUnavailable,
            ErrorCode::QueueFull,
            ErrorCode::RateLimited,
            ErrorCode::DeadlineExceeded,
            ErrorCode::Cancelled,
            ErrorCode::ProviderUnavailable,
            ErrorCode::ProviderProtocolError,
            ErrorCode::InternalError,
            ErrorCode::NotFound,
            ErrorCode::IdempotencyConflict,
            ErrorCode::Unavailable,
        ] {
            let json = serde_json::to_value(code).unwrap_or_default();
            assert_eq!(json, serde_json::Value::String(code.as_str().to_owned()));
        }
    }

    #[test]
    fn provider_code_is_omitted_when_absent() {
        let e = RuntimeError::cancelled();
        let json = serde_json::to_string(&e).unwrap_or_default();
        assert_eq!(
            json,
            r#"{"code":"cancelled","message":"Execution was cancelled","retryable":false}"#
        );
    }
}
