//! `ClientError`, the one error type of the crate, and the parsing of the gateway's error bodies.
//!
//! Every error answers the two questions callers branch on: [`ClientError::code`] (the portable
//! code of contract.md section 2, when there is one) and [`ClientError::is_retryable`]. Errors the
//! gateway reports keep its code, message and `retryable` flag exactly; errors that happen on the
//! client's side of the wire are given the portable code that describes them best (`unavailable`
//! for a transport failure, `internal_error` for a server that broke the protocol,
//! `invalid_request` for a bad argument), so a caller needs one `match` only.

use std::fmt;
use std::time::Duration;

use protocol::snapshot::ResultNotReady;
use protocol::{ErrorCode, ExecutionStatus, Sequence};
use serde::Deserialize;

/// An error response of the gateway: `{"error":{"code","message","retryable"}}`, or one of the
/// status-only shapes (`{"status":"not_found"}`), or a body that is not JSON at all (a proxy in
/// front of the gateway), in which case the code is derived from the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// The portable code.
    pub code: ErrorCode,
    /// The server's fixed message (or a description of the status when the body had none).
    pub message: String,
    /// Whether the same request may succeed later.
    pub retryable: bool,
    /// The `Retry-After` delay the server asked for, if any.
    pub retry_after: Option<Duration>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (HTTP {})", self.code, self.message, self.status)
    }
}

/// What failed on the way to or from the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The TCP or TLS connection could not be established.
    Connect,
    /// No response, or no bytes on an open response, within the configured time.
    Timeout,
    /// Sending the request or reading the response failed (reset, closed connection).
    Io,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Connect => "could not connect to the gateway",
            TransportKind::Timeout => "the gateway did not answer in time",
            TransportKind::Io => "the connection to the gateway failed",
        })
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The base URL is unusable or unsafe (credentials, query, fragment, not http/https).
    #[error("invalid base URL: {0}")]
    InvalidBaseUrl(&'static str),
    /// An event cursor outside `0..=2^53-1` (the range every peer can represent); rejected
    /// before any request is made.
    #[error(
        "event cursor must be a non-negative integer no larger than {}",
        protocol::MAX_SAFE_INTEGER
    )]
    InvalidCursor,
    /// An `Idempotency-Key` that is not 1-256 visible ASCII characters.
    #[error(
        "Idempotency-Key must contain 1 to {} visible ASCII characters",
        protocol::idempotency::MAX_KEY_LEN
    )]
    InvalidIdempotencyKey,
    /// An API key that cannot be sent as a bearer token (empty, or not visible ASCII). The key
    /// itself is never shown.
    #[error("API key must be 1 to 4096 visible ASCII characters")]
    InvalidApiKey,
    /// The request could not be serialized as JSON (non-finite numbers).
    #[error("request must be bounded JSON data")]
    InvalidRequest,
    /// The gateway answered with an error status.
    #[error("{0}")]
    Api(ApiError),
    /// `GET …/result` answered 409: the execution has not succeeded (yet).
    #[error("{}", not_ready_message(.0))]
    NotReady(ResultNotReady),
    /// The connection failed.
    #[error("{kind}{}", source_suffix(.source.as_ref()))]
    Transport {
        kind: TransportKind,
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The gateway broke the protocol: a malformed body or event, an oversized frame, a
    /// sequence gap or repeat, an event of another execution.
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// An event stream kept ending before its terminal event and the retry budget ran out.
    #[error("stream ended before a terminal event (last sequence {last_sequence})")]
    StreamTruncated { last_sequence: Sequence },
}

fn not_ready_message(r: &ResultNotReady) -> String {
    match &r.error {
        Some(e) => format!("execution {}: {}: {}", r.status, e.code, e.message),
        None => format!("execution is {}; no result yet", r.status),
    }
}

/// `": root cause"` of a reqwest error chain (reqwest's own message repeats the URL).
fn source_suffix(source: Option<&reqwest::Error>) -> String {
    let Some(source) = source else {
        return String::new();
    };
    let mut root: &dyn std::error::Error = source;
    while let Some(next) = root.source() {
        root = next;
    }
    format!(" ({root})")
}

impl ClientError {
    /// The portable code: the gateway's own for API errors and failed results, `unavailable`
    /// for transport failures and exhausted resumes, `internal_error` for protocol violations,
    /// `invalid_request` for rejected arguments. `None` only for [`ClientError::NotReady`] of
    /// an execution that is still running.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::InvalidBaseUrl(_)
            | ClientError::InvalidCursor
            | ClientError::InvalidIdempotencyKey
            | ClientError::InvalidApiKey
            | ClientError::InvalidRequest => Some(ErrorCode::InvalidRequest),
            ClientError::Api(e) => Some(e.code),
            ClientError::NotReady(r) => match (&r.error, r.status) {
                (Some(e), _) => Some(e.code),
                (None, ExecutionStatus::Cancelled) => Some(ErrorCode::Cancelled),
                (None, _) => None,
            },
            ClientError::Transport { .. } | ClientError::StreamTruncated { .. } => {
                Some(ErrorCode::Unavailable)
            }
            ClientError::Protocol(_) => Some(ErrorCode::InternalError),
        }
    }

    /// Whether repeating the call may succeed. A retryable error from a submission without an
    /// idempotency key may still have created the execution: retry submissions with a key.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Api(e) => e.retryable,
            ClientError::NotReady(r) => {
                !r.status.is_terminal() || r.error.as_ref().is_some_and(|e| e.retryable)
            }
            ClientError::Transport { .. } | ClientError::StreamTruncated { .. } => true,
            ClientError::InvalidBaseUrl(_)
            | ClientError::InvalidCursor
            | ClientError::InvalidIdempotencyKey
            | ClientError::InvalidApiKey
            | ClientError::InvalidRequest
            | ClientError::Protocol(_) => false,
        }
    }

    /// Whether the client may repeat an idempotent call by itself: transport failures and API
    /// errors the server marked retryable (429, 503, a retryable 500).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport { .. } => true,
            ClientError::Api(e) => e.retryable,
            _ => false,
        }
    }

    /// The delay the server asked for, if any.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Api(e) => e.retry_after,
            _ => None,
        }
    }

    /// Maps a reqwest failure to a transport error.
    pub(crate) fn transport(error: reqwest::Error) -> Self {
        let kind = if error.is_timeout() {
            TransportKind::Timeout
        } else if error.is_connect() {
            TransportKind::Connect
        } else {
            TransportKind::Io
        };
        ClientError::Transport {
            kind,
            source: Some(error),
        }
    }

    /// A timeout measured by the client itself.
    pub(crate) fn timeout() -> Self {
        ClientError::Transport {
            kind: TransportKind::Timeout,
            source: None,
        }
    }
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorFields,
}

#[derive(Deserialize)]
struct ErrorFields {
    code: String,
    #[serde(default)]
    message: Option<String>,
    /// The reference omits it on 404 responses: absent means not retryable.
    #[serde(default)]
    retryable: Option<bool>,
}

#[derive(Deserialize)]
struct StatusOnly {
    status: String,
}

/// The code and retryability implied by an HTTP status when the body says nothing usable.
fn code_for_status(status: u16) -> (ErrorCode, bool) {
    match status {
        400 | 413 | 415 => (ErrorCode::InvalidRequest, false),
        404 => (ErrorCode::NotFound, false),
        422 => (ErrorCode::InvalidRequest, false),
        429 => (ErrorCode::QueueFull, true),
        502..=504 => (ErrorCode::Unavailable, true),
        _ => (ErrorCode::InternalError, false),
    }
}

fn parse_code(code: &str) -> Option<ErrorCode> {
    serde_json::from_value(serde_json::Value::String(code.to_owned())).ok()
}

/// Builds the error of a non-success response from its status, `Retry-After` header and
/// (already size-capped) body.
pub(crate) fn api_error(status: u16, retry_after: Option<Duration>, body: &[u8]) -> ApiError {
    let (fallback_code, fallback_retryable) = code_for_status(status);
    if let Ok(envelope) = serde_json::from_slice::<ErrorEnvelope>(body) {
        let known = parse_code(&envelope.error.code);
        return ApiError {
            status,
            code: known.unwrap_or(fallback_code),
            message: envelope
                .error
                .message
                .unwrap_or_else(|| format!("request failed with HTTP status {status}")),
            retryable: envelope.error.retryable.unwrap_or(false),
            retry_after,
        };
    }
    if let Ok(StatusOnly { status: s }) = serde_json::from_slice::<StatusOnly>(body)
        && s == "not_found"
    {
        return ApiError {
            status,
            code: ErrorCode::NotFound,
            message: "Execution not found".into(),
            retryable: false,
            retry_after,
        };
    }
    ApiError {
        status,
        code: fallback_code,
        message: format!("request failed with HTTP status {status}"),
        retryable: fallback_retryable,
        retry_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_error_envelope() {
        let e = api_error(
            429,
            Some(Duration::from_secs(1)),
            br#"{"error":{"code":"queue_full","message":"Runtime execution capacity is full","retryable":true}}"#,
        );
        assert_eq!(e.code, ErrorCode::QueueFull);
        assert!(e.retryable);
        assert_eq!(e.message, "Runtime execution capacity is full");
        assert_eq!(e.retry_after, Some(Duration::from_secs(1)));
    }

    #[test]
    fn reference_404_without_retryable_is_not_retryable() {
        let e = api_error(
            404,
            None,
            br#"{"error":{"code":"not_found","message":"Execution not found"}}"#,
        );
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(!e.retryable);
    }

    #[test]
    fn reference_500_keeps_the_body_code_and_flag() {
        let e = api_error(
            500,
            None,
            br#"{"error":{"code":"queue_full","message":"Provider execution queue is full","retryable":true}}"#,
        );
        assert_eq!(e.code, ErrorCode::QueueFull);
        assert!(e.retryable);
        let client = ClientError::Api(e);
        assert!(client.is_transient());
        assert_eq!(client.code(), Some(ErrorCode::QueueFull));
    }

    #[test]
    fn status_only_and_unparseable_bodies_fall_back_to_the_status() {
        let e = api_error(404, None, br#"{"status":"not_found"}"#);
        assert_eq!(e.code, ErrorCode::NotFound);
        let e = api_error(503, None, b"<html>bad gateway</html>");
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(e.retryable);
        let e = api_error(
            400,
            None,
            br#"{"error":{"code":"some_future_code","message":"m","retryable":false}}"#,
        );
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert_eq!(e.message, "m");
    }

    #[test]
    fn not_ready_codes() {
        let running = ClientError::NotReady(ResultNotReady {
            status: ExecutionStatus::Running,
            error: None,
        });
        assert_eq!(running.code(), None);
        assert!(running.is_retryable());
        let failed = ClientError::NotReady(ResultNotReady {
            status: ExecutionStatus::Failed,
            error: Some(protocol::RuntimeError::deadline_exceeded()),
        });
        assert_eq!(failed.code(), Some(ErrorCode::DeadlineExceeded));
        assert!(!failed.is_retryable());
        assert!(failed.to_string().contains("deadline_exceeded"));
    }
}
