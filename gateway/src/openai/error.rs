//! Errors of the OpenAI-compatible routes in OpenAI's shape (contract.md section 10):
//! `{"error":{"message","type","param","code"}}`, with the statuses the official SDKs map to
//! their exception classes and `retry-after` on 429 and 503.
//!
//! The one decision a reader must know: every failure of these routes goes through
//! [`OpenAiError`], built either from the native [`ApiError`] (so status, fixed message and
//! `Retry-After` stay decided in `crate::error`, the one place that decides them) or from one
//! of the fixed sentences below. `param` names a request field only by its fixed name; nothing
//! of the caller's request is ever echoed.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::{ErrorCode, RuntimeError};
use serde::Serialize;

use crate::error::ApiError;
use crate::response::error_response;

/// The header the official SDKs read before their own retry rules (`"false"`: never retry).
const SHOULD_RETRY: &str = "x-should-retry";

/// OpenAI's error `type`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    InvalidRequestError,
    AuthenticationError,
    PermissionError,
    NotFoundError,
    RateLimitError,
    ServerError,
}

impl ErrorType {
    /// The type OpenAI gives errors of this status.
    fn of(status: StatusCode) -> Self {
        match status.as_u16() {
            401 => ErrorType::AuthenticationError,
            403 => ErrorType::PermissionError,
            404 => ErrorType::NotFoundError,
            429 => ErrorType::RateLimitError,
            500.. => ErrorType::ServerError,
            _ => ErrorType::InvalidRequestError,
        }
    }
}

/// A failure of an OpenAI-compatible route.
#[derive(Debug, Clone)]
pub struct OpenAiError {
    status: StatusCode,
    message: &'static str,
    /// The request field at fault, by its fixed name.
    param: Option<&'static str>,
    code: &'static str,
    retry_after: Option<u64>,
    /// `x-should-retry: false`: the SDKs retry 409, 429 and 5xx on their own (a new execution
    /// each time, unless the caller sent an `Idempotency-Key`), which this header stops.
    final_answer: bool,
    /// Details for the log of a 500; never sent.
    internal: Option<String>,
}

/// The body: `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

/// OpenAI's error object.
#[derive(Debug, Serialize)]
pub struct ErrorObject {
    pub message: &'static str,
    #[serde(rename = "type")]
    pub kind: ErrorType,
    pub param: Option<&'static str>,
    pub code: &'static str,
}

impl OpenAiError {
    /// 400 `invalid_request_error` about field `param`.
    pub fn invalid(param: &'static str, message: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
            param: Some(param),
            code: ErrorCode::InvalidRequest.as_str(),
            retry_after: None,
            final_answer: false,
            internal: None,
        }
    }

    /// 400 for a feature this runtime does not offer, naming the field that asked for it.
    pub fn unsupported(param: &'static str) -> Self {
        Self {
            code: "unsupported_parameter",
            ..Self::invalid(param, "This parameter is not supported by this runtime")
        }
    }

    /// 404 `model_not_found`: the model names no deployment model (or more than one).
    pub fn model_not_found() -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: "The model does not exist or is ambiguous; use provider/model",
            param: Some("model"),
            code: "model_not_found",
            retry_after: None,
            final_answer: false,
            internal: None,
        }
    }

    /// 404 for an unknown response, another tenant's, or an id of the wrong form: one answer.
    pub fn response_not_found() -> Self {
        ApiError::NotFound("Response not found").into()
    }

    /// The answer to a request whose execution ended without success: the status its code
    /// means to a caller (overload 429, unavailable provider or deadline 503, cancelled 409,
    /// anything else 500), with the code as `code` and a fixed message. An error the runtime
    /// marks not retryable (a cancel, a deadline, output already streamed, a provider's
    /// refusal) answers `x-should-retry: false` and no `retry-after`, so an SDK does not run
    /// it again on its own.
    pub fn execution_failed(error: &RuntimeError) -> Self {
        let (status, message) = match error.code {
            ErrorCode::QueueFull | ErrorCode::RateLimited => (
                StatusCode::TOO_MANY_REQUESTS,
                "The model is overloaded; retry later",
            ),
            ErrorCode::ProviderUnavailable | ErrorCode::DeadlineExceeded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The model did not complete the request in time or is unavailable",
            ),
            ErrorCode::Cancelled => (StatusCode::CONFLICT, "The request was cancelled"),
            ErrorCode::CapabilityUnavailable => (
                StatusCode::BAD_REQUEST,
                "No model of the deployment can serve this request",
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "The model failed to complete the request",
            ),
        };
        let retry_after = (error.retryable && matches!(status.as_u16(), 429 | 503)).then_some(1);
        Self {
            status,
            message,
            param: None,
            code: error.code.as_str(),
            retry_after,
            final_answer: !error.retryable,
            internal: None,
        }
    }

    /// 500 with `detail` logged, never sent.
    pub fn internal(detail: impl Into<String>) -> Self {
        ApiError::Internal(detail.into()).into()
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The body this error answers with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorObject {
                message: self.message,
                kind: ErrorType::of(self.status),
                param: self.param,
                code: self.code,
            },
        }
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        let internal = match &e {
            ApiError::Internal(detail) => Some(detail.clone()),
            _ => None,
        };
        let native = e.to_runtime_error();
        let message = e.public_message();
        Self {
            status: e.status(),
            message,
            param: None,
            code: native.code.as_str(),
            retry_after: e.retry_after_secs(),
            final_answer: false,
            internal,
        }
    }
}

impl From<runtime::StoreError> for OpenAiError {
    fn from(e: runtime::StoreError) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        if let Some(detail) = &self.internal {
            tracing::error!(error = %detail, "internal error");
        }
        let mut response = error_response(self.status, &self.body(), self.retry_after);
        if self.final_answer {
            response
                .headers_mut()
                .insert(SHOULD_RETRY, axum::http::HeaderValue::from_static("false"));
        }
        response
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use axum::http::header;

    use super::*;

    fn json(e: OpenAiError) -> serde_json::Value {
        serde_json::to_value(e.body()).unwrap()
    }

    #[test]
    fn native_errors_keep_status_code_and_fixed_message_in_openai_shape() {
        let cases = [
            (
                ApiError::Unauthenticated,
                401,
                "authentication_error",
                "unauthenticated",
            ),
            (
                ApiError::PermissionDenied,
                403,
                "permission_error",
                "permission_denied",
            ),
            (
                ApiError::NotFound("Response not found"),
                404,
                "not_found_error",
                "not_found",
            ),
            (
                ApiError::IdempotencyConflict,
                422,
                "invalid_request_error",
                "idempotency_conflict",
            ),
            (
                ApiError::RateLimited {
                    retry_after: Duration::from_millis(1500),
                },
                429,
                "rate_limit_error",
                "rate_limited",
            ),
            (
                ApiError::Unavailable("A runtime backend is unavailable"),
                503,
                "server_error",
                "unavailable",
            ),
            (
                ApiError::Internal("secret detail".into()),
                500,
                "server_error",
                "internal_error",
            ),
        ];
        for (native, status, kind, code) in cases {
            let message = native.public_message();
            let e = OpenAiError::from(native);
            assert_eq!(e.status().as_u16(), status);
            let body = json(e.clone());
            assert_eq!(body["error"]["type"], kind);
            assert_eq!(body["error"]["code"], code);
            assert_eq!(body["error"]["message"], message);
            assert_eq!(body["error"]["param"], serde_json::Value::Null);
            assert!(!body.to_string().contains("secret"));
            let response = e.into_response();
            assert_eq!(
                response.headers().get(header::RETRY_AFTER).is_some(),
                matches!(status, 429 | 503),
                "{status}"
            );
        }
    }

    #[test]
    fn request_errors_name_the_field_only() {
        let body = json(OpenAiError::unsupported("previous_response_id"));
        assert_eq!(body["error"]["param"], "previous_response_id");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let body = json(OpenAiError::model_not_found());
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(
            OpenAiError::model_not_found().status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn execution_failures_map_to_the_status_sdks_retry_or_not() {
        let failed = |code| OpenAiError::execution_failed(&RuntimeError::new(code, "x", false));
        assert_eq!(failed(ErrorCode::QueueFull).status(), 429);
        assert_eq!(failed(ErrorCode::ProviderUnavailable).status(), 503);
        assert_eq!(failed(ErrorCode::ProviderProtocolError).status(), 500);
        assert_eq!(failed(ErrorCode::Cancelled).status(), 409);
        // Not retryable: the SDKs are told not to retry, and no retry-after invites it.
        for code in [
            ErrorCode::Cancelled,
            ErrorCode::DeadlineExceeded,
            ErrorCode::QueueFull,
        ] {
            let response = failed(code).into_response();
            assert_eq!(response.headers()[SHOULD_RETRY], "false", "{code:?}");
            assert!(!response.headers().contains_key(header::RETRY_AFTER));
        }
        // Retryable: the status decides, as OpenAI's own answers do.
        let retryable = OpenAiError::execution_failed(&RuntimeError::new(
            ErrorCode::ProviderUnavailable,
            "x",
            true,
        ))
        .into_response();
        assert_eq!(retryable.status(), 503);
        assert!(!retryable.headers().contains_key(SHOULD_RETRY));
        assert_eq!(retryable.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            failed(ErrorCode::ProviderProtocolError).code(),
            "provider_protocol_error"
        );
        assert!(
            !json(failed(ErrorCode::InternalError))
                .to_string()
                .contains("\"x\"")
        );
    }
}
