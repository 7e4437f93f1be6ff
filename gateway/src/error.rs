//! The one place where errors become HTTP responses.
//!
//! Every public message is a fixed sentence chosen here; internals (store errors, backend
//! messages) go to logs only. Status codes are contract.md section 2's, deliberately finer than
//! the reference's "400 or 500".

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::error::ErrorResponse;
use protocol::{ErrorCode, RuntimeError};
use runtime::StoreError;

use crate::response::error_response;

/// An API failure.
#[derive(Debug, Clone)]
pub enum ApiError {
    /// 400 `invalid_request` with a fixed message.
    InvalidRequest(&'static str),
    /// 413 `invalid_request`.
    BodyTooLarge,
    /// 415 `invalid_request`.
    UnsupportedMediaType,
    /// 422 `idempotency_conflict`.
    IdempotencyConflict,
    /// 422 `capability_unavailable`.
    CapabilityUnavailable,
    /// 404 `not_found` with a fixed message.
    NotFound(&'static str),
    /// 429 `queue_full` with a fixed message and `Retry-After`.
    QueueFull(&'static str),
    /// 429 `queue_full`: the tenant holds its `max_active_executions`; `Retry-After` from the
    /// hint.
    TenantActiveLimit { retry_after: Duration },
    /// 429 `rate_limited`: the tenant's submit bucket is empty; `Retry-After` when a token is
    /// back.
    RateLimited { retry_after: Duration },
    /// 503 `unavailable` with a fixed message and `Retry-After`.
    Unavailable(&'static str),
    /// 401 `unauthenticated` with `WWW-Authenticate: Bearer`: no API key, or an unknown one.
    Unauthenticated,
    /// 403 `permission_denied`: a valid API key without the scope the route needs.
    PermissionDenied,
    /// 500 `internal_error`; the detail is logged, never sent.
    Internal(String),
}

/// Each store error kind has one HTTP meaning. Flows that expect a kind as an outcome (the
/// submission flow's `AlreadyExists`, the cancel flow's `Conflict`) match it before converting;
/// what reaches this conversion is a failure.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::NotFound("Execution not found"),
            StoreError::AdmissionFull => ApiError::QueueFull("Runtime execution capacity is full"),
            StoreError::CapacityExhausted => ApiError::QueueFull("Event store capacity exhausted"),
            StoreError::ExecutionLimit => {
                ApiError::QueueFull("Execution event log limit was reached")
            }
            StoreError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "backend unavailable");
                ApiError::Unavailable("A runtime backend is unavailable")
            }
            StoreError::Closed => ApiError::Unavailable("Runtime is shutting down"),
            // A log that exists, moved on or refused the event where the flow did not expect
            // it: a bug or a concurrent writer the flow cannot reconcile. Never a success.
            // A backend an operator must fix: a failure of ours to report, not a retry.
            e @ (StoreError::AlreadyExists
            | StoreError::Conflict { .. }
            | StoreError::Violation(_)
            | StoreError::Misconfigured(_)) => ApiError::Internal(e.to_string()),
        }
    }
}

impl ApiError {
    fn parts(&self) -> (StatusCode, ErrorCode, &'static str) {
        match self {
            ApiError::InvalidRequest(m) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, m),
            ApiError::BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::InvalidRequest,
                "Request body exceeds the size limit",
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::InvalidRequest,
                "Content-Type must be application/json",
            ),
            ApiError::IdempotencyConflict => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::IdempotencyConflict,
                "Idempotency key was already used with a different request",
            ),
            ApiError::CapabilityUnavailable => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::CapabilityUnavailable,
                "No provider satisfies the requested ability and capabilities",
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, ErrorCode::NotFound, m),
            ApiError::QueueFull(m) => (StatusCode::TOO_MANY_REQUESTS, ErrorCode::QueueFull, m),
            ApiError::TenantActiveLimit { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::QueueFull,
                "Tenant active execution limit reached",
            ),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                "Tenant submit rate limit reached",
            ),
            ApiError::Unavailable(m) => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, m)
            }
            ApiError::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthenticated,
                "A valid API key is required",
            ),
            ApiError::PermissionDenied => (
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied,
                "The API key does not allow this operation",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::InternalError,
                "Runtime request could not be completed",
            ),
        }
    }

    /// The portable error object.
    pub fn to_runtime_error(&self) -> RuntimeError {
        let (_, code, message) = self.parts();
        let retryable = matches!(
            code,
            ErrorCode::QueueFull | ErrorCode::RateLimited | ErrorCode::Unavailable
        );
        RuntimeError::new(code, message, retryable)
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The fixed sentence the caller gets (the OpenAI-compatible routes answer it too).
    pub fn public_message(&self) -> &'static str {
        self.parts().2
    }

    /// Whole seconds for the `Retry-After` header, at least 1, or `None` when the error is not
    /// worth retrying.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::QueueFull(_) | ApiError::Unavailable(_) => Some(1),
            ApiError::TenantActiveLimit { retry_after } | ApiError::RateLimited { retry_after } => {
                let secs = retry_after
                    .as_secs()
                    .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
                Some(secs.max(1))
            }
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            tracing::error!(error = %detail, "internal error");
        }
        let status = self.status();
        let body = ErrorResponse {
            error: self.to_runtime_error(),
        };
        error_response(status, &body, self.retry_after_secs())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::http::header;

    use super::*;

    #[test]
    fn quota_rejections_are_429_with_whole_second_retry_after() {
        let limited = ApiError::RateLimited {
            retry_after: Duration::from_millis(1200),
        };
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        let e = limited.to_runtime_error();
        assert_eq!((e.code, e.retryable), (ErrorCode::RateLimited, true));
        assert_eq!(limited.retry_after_secs(), Some(2), "rounded up");
        let response = limited.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let short = ApiError::RateLimited {
            retry_after: Duration::from_millis(30),
        };
        assert_eq!(short.retry_after_secs(), Some(1), "at least 1");
        let full = ApiError::TenantActiveLimit {
            retry_after: Duration::from_secs(3),
        };
        assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.to_runtime_error().code, ErrorCode::QueueFull);
        assert_eq!(full.retry_after_secs(), Some(3));
        assert_eq!(ApiError::IdempotencyConflict.retry_after_secs(), None);
    }
}
