//! The HTTP transport every adapter shares: one client per process with the reference's safety
//! rules [R 62, 88], status classification [R 61], bounded JSON bodies and bounded SSE frames.
//!
//! - Redirects are never followed: a 3xx is answered as a failed request, so a provider can
//!   never send the credential-bearing request to a second origin.
//! - Connect and idle-read timeouts, no total timeout: a stream may run as long as the
//!   execution's deadline allows, but a silent connection fails.
//! - Bodies are read with hard caps (4 MiB JSON, 1 MiB per SSE frame); beyond them the response
//!   is dropped (closing the connection) and the attempt fails with `provider_protocol_error`.
//! - Error bodies are discarded unread, so nothing a provider echoes (including a credential)
//!   can reach events, logs or errors.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use config::BaseUrl;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use protocol::sse::{SseEvent, SseParser};
use protocol::{ErrorCode, RuntimeError};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use url::Url;

/// Largest JSON response body read from a provider.
pub const MAX_JSON_BYTES: usize = 4 * 1024 * 1024;
/// Largest SSE frame read from a provider.
pub const MAX_SSE_FRAME_BYTES: usize = 1024 * 1024;
/// Time allowed to establish a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence tolerated on an open response.
pub const IDLE_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The shared client. Built once; building cannot fail with this configuration, but if the TLS
/// backend ever refused, attempts fail with `provider_unavailable` instead of panicking.
pub fn client() -> Result<&'static reqwest::Client, RuntimeError> {
    static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            // The process-wide rustls provider; ignore "already installed".
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(IDLE_READ_TIMEOUT)
                .no_proxy()
                .build()
                .map_err(|e| tracing::error!(error = %e, "cannot build the provider HTTP client"))
                .ok()
        })
        .as_ref()
        .ok_or_else(|| {
            RuntimeError::new(
                ErrorCode::ProviderUnavailable,
                "Provider execution failed",
                true,
            )
        })
}

/// The portable error for a non-success HTTP status [R 61]: 429 → `rate_limited`
/// (retryable); 408 and 5xx → `provider_unavailable` (retryable); anything else →
/// `provider_unavailable` (not retryable). `provider_code` is the status; the body is not read.
pub fn status_error(status: StatusCode) -> RuntimeError {
    let code = status.as_u16();
    let message = format!("Provider request failed with status {code}");
    let error = match code {
        429 => RuntimeError::new(ErrorCode::RateLimited, message, true),
        408 | 500..=599 => RuntimeError::new(ErrorCode::ProviderUnavailable, message, true),
        _ => RuntimeError::new(ErrorCode::ProviderUnavailable, message, false),
    };
    error.with_provider_code(code.to_string())
}

/// A transport failure (connect, TLS, reset, idle timeout). Never carries the underlying
/// message, which may contain URLs or addresses.
pub fn transport_error(error: &reqwest::Error) -> RuntimeError {
    let kind = if error.is_timeout() {
        "timeout"
    } else if error.is_connect() {
        "connect"
    } else if error.is_body() || error.is_decode() {
        "body"
    } else {
        "request"
    };
    tracing::warn!(kind, "provider transport failed");
    RuntimeError::new(
        ErrorCode::ProviderUnavailable,
        "Provider execution failed",
        true,
    )
}

/// `provider_protocol_error` with a fixed message.
pub fn protocol_error(message: &'static str) -> RuntimeError {
    RuntimeError::new(ErrorCode::ProviderProtocolError, message, false)
}

/// Sends `request`; a non-success status becomes [`status_error`] (body discarded).
pub async fn send(request: reqwest::RequestBuilder) -> Result<reqwest::Response, RuntimeError> {
    let response = request.send().await.map_err(|e| transport_error(&e))?;
    let status = response.status();
    if status.is_success() {
        Ok(response)
    } else {
        drop(response);
        Err(status_error(status))
    }
}

/// `{base}/{path}` for a constant `path`, which cannot leave the base; the error arm is a
/// guard.
pub fn endpoint(base: &BaseUrl, path: &str) -> Result<Url, RuntimeError> {
    base.endpoint(path).ok_or_else(RuntimeError::internal)
}

/// A JSON POST asking for server-sent events, with `authorization` (a sensitive header from
/// [`super::credential`]).
pub fn sse_post(
    endpoint: Url,
    authorization: HeaderValue,
    body: &str,
) -> Result<reqwest::RequestBuilder, RuntimeError> {
    Ok(client()?
        .post(endpoint)
        .header(AUTHORIZATION, authorization)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "text/event-stream")
        .body(body.to_owned()))
}

/// Reads a JSON body of at most [`MAX_JSON_BYTES`].
pub async fn read_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Result<T, RuntimeError> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_JSON_BYTES as u64)
    {
        return Err(protocol_error("Provider response body is too large"));
    }
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| transport_error(&e))?;
        if body.len() + chunk.len() > MAX_JSON_BYTES {
            return Err(protocol_error("Provider response body is too large"));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|_| protocol_error("Provider returned malformed JSON"))
}

/// Server-sent events read from a provider response with a 1 MiB frame cap.
pub struct SseStream {
    body: BoxStream<'static, Result<Bytes, reqwest::Error>>,
    parser: SseParser,
    ready: std::collections::VecDeque<SseEvent>,
    done: bool,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseStream")
            .field("ready", &self.ready.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl SseStream {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            parser: SseParser::with_max_frame_bytes(MAX_SSE_FRAME_BYTES),
            ready: std::collections::VecDeque::new(),
            done: false,
        }
    }

    /// The next complete event; `Ok(None)` at end of stream (an unterminated final frame is
    /// discarded, as the SSE rules require).
    pub async fn next(&mut self) -> Result<Option<SseEvent>, RuntimeError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            if self.done {
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    let mut out = Vec::new();
                    let pushed = self.parser.push(&chunk, &mut out);
                    self.ready.extend(out);
                    if pushed.is_err() {
                        self.done = true;
                        self.ready.clear();
                        return Err(protocol_error("Provider stream frame exceeds 1 MiB"));
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Err(transport_error(&e));
                }
                None => self.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_like_the_reference() {
        let e = status_error(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            (e.code, e.retryable, e.provider_code.as_deref()),
            (ErrorCode::RateLimited, true, Some("429"))
        );
        assert_eq!(e.message, "Provider request failed with status 429");
        for s in [408, 500, 502, 503, 599] {
            let e = status_error(StatusCode::from_u16(s).unwrap());
            assert_eq!(
                (e.code, e.retryable),
                (ErrorCode::ProviderUnavailable, true),
                "{s}"
            );
        }
        for s in [301, 400, 401, 403, 404, 422] {
            let e = status_error(StatusCode::from_u16(s).unwrap());
            assert_eq!(
                (e.code, e.retryable),
                (ErrorCode::ProviderUnavailable, false),
                "{s}"
            );
        }
    }
}
