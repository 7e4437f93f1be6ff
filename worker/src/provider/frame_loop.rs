//! The streaming attempt every SSE adapter runs (openai-responses, openai-chat,
//! anthropic-messages): send the request, feed each server-sent event to the adapter's
//! [`FrameMapper`], report what it maps, stop at completion.
//!
//! The one decision a reader must know: once the provider answered 2xx, every failure is
//! non-retryable (the provider accepted the request and may be working on it), and a stream
//! that ends before the mapper saw completion is `provider_protocol_error` [R 33]. Mappers are
//! pure state machines over frames (no I/O), so their rules are unit-tested without a server.

use protocol::sse::SseEvent;
use protocol::{ErrorCode, RuntimeError};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::http::{self, SseStream, protocol_error};
use super::{ProviderEvent, ProviderSink};

/// What one frame produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrameOutcome {
    /// Events to report, in order.
    pub events: Vec<ProviderEvent>,
    /// The provider signalled completion: report `events`, then end the attempt successfully
    /// without reading further.
    pub completed: bool,
}

impl FrameOutcome {
    /// Nothing to report; the stream goes on.
    pub fn none() -> Self {
        Self::default()
    }

    /// One event to report; the stream goes on.
    pub fn event(event: ProviderEvent) -> Self {
        Self {
            events: vec![event],
            completed: false,
        }
    }
}

/// A stream mapper the frame loop drives, one frame at a time.
pub trait FrameMapper: Send {
    /// Maps one SSE frame; an error ends the attempt with it (events of that frame are not
    /// reported).
    fn on_frame(&mut self, frame: &SseEvent) -> Result<FrameOutcome, RuntimeError>;
}

/// Sends `request` and feeds its event stream to `mapper`, reporting through `sink`, until the
/// mapper sees completion.
///
/// - A non-2xx answer is classified by [`http::send`] [R 61] (body discarded unread).
/// - After a 2xx, every failure is non-retryable (the provider accepted the request).
/// - End of stream before completion is `provider_protocol_error` "Provider stream ended
///   without a completion event" [R 33].
/// - Cancellation (the execution's cancel or deadline) is checked while waiting for the answer
///   and for every frame; it returns `cancelled` at once, and dropping the response closes the
///   connection.
/// - At completion the response is dropped unread: the attempt stops reading the provider
///   [R 33].
pub async fn run(
    request: reqwest::RequestBuilder,
    cancel: &CancellationToken,
    sink: &mut dyn ProviderSink,
    mapper: &mut dyn FrameMapper,
) -> Result<(), RuntimeError> {
    // One wait for the whole call, not one registered and dropped per frame, polled only once
    // cancelled (`OwnWakes`), not for each frame.
    let mut cancelled = runtime::own_wakes::cancelled(cancel);
    let response = tokio::select! {
        biased;
        () = &mut cancelled => return Err(RuntimeError::cancelled()),
        response = http::send(request) => response?,
    };
    let mut frames = SseStream::new(response);
    loop {
        let frame = tokio::select! {
            biased;
            () = &mut cancelled => return Err(RuntimeError::cancelled()),
            frame = frames.next() => frame.map_err(RuntimeError::not_retryable)?,
        };
        let Some(frame) = frame else {
            return Err(RuntimeError::stream_ended_early());
        };
        let outcome = mapper.on_frame(&frame)?;
        for event in outcome.events {
            sink.emit(event).await?;
        }
        if outcome.completed {
            return Ok(());
        }
    }
}

/// The provider reported a failure in its stream (OpenAI-compatible `response.failed`,
/// `error`). Not retryable: the provider accepted the request. The provider's own message is
/// never copied.
pub fn stream_failure() -> RuntimeError {
    RuntimeError::new(
        ErrorCode::ProviderUnavailable,
        "Provider response failed",
        false,
    )
}

/// Frame data that is not JSON, or a mapped event with the wrong shape.
pub fn malformed() -> RuntimeError {
    protocol_error("Provider returned malformed stream JSON")
}

/// Parses a frame's data as JSON.
pub fn parse_data(frame: &SseEvent) -> Result<Value, RuntimeError> {
    serde_json::from_str(&frame.data).map_err(|_| malformed())
}

/// Decodes a mapped event's typed shape.
pub fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, RuntimeError> {
    serde_json::from_value(value).map_err(|_| malformed())
}
