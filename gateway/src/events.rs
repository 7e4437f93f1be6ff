//! SSE projection of an execution's log [R 49-55, contract section 4].
//!
//! The body is pulled by hyper only as fast as the socket drains, and the store subscription is
//! pulled only when the body is, so a client that stops reading holds at most one batch of
//! frames in memory and slows only its own stream. Ready events are coalesced into one chunk (up
//! to [`BATCH_BYTES`]) to save syscalls under load. An error after the headers ends the body
//! with an error, which aborts the connection: the client sees a truncation (never a partial
//! frame or a JSON error) and resumes from its last sequence. Closing the connection drops the
//! subscription and never touches the execution.
//!
//! Before a chunk holding the terminal event is sent, the execution's quota slot is released
//! (for a tenant with an active cap; a no-op otherwise): an execution stops counting against
//! its tenant's quota no later than a client sees it end, so a client that submits again as
//! soon as it read the terminal event is never refused for the execution it just watched.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use protocol::{ExecutionId, Tenant};
use runtime::EventStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::state::AppState;

/// Most bytes of frames coalesced into one body chunk.
pub const BATCH_BYTES: usize = 64 * 1024;

const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// Failure after the headers were sent; aborts the connection.
#[derive(Debug, thiserror::Error)]
#[error("event stream failed")]
pub struct StreamAborted;

struct Projection {
    /// The execution streamed, named by the stream's log lines.
    id: ExecutionId,
    /// Fused: batching peeks with `now_or_never`, which may observe the end of the stream.
    records: futures_util::stream::Fuse<EventStream>,
    keep_alive: Duration,
    close: CancellationToken,
    state: AppState,
    /// The execution's owner, whose quota slot the terminal event releases.
    owner: Tenant,
    _permit: OwnedSemaphorePermit,
    done: bool,
}

impl Drop for Projection {
    fn drop(&mut self) {
        self.state.metrics().stream_closed();
    }
}

/// A `200 text/event-stream` response streaming `records` of an execution `owner` owns.
pub fn sse_response(
    state: &AppState,
    id: ExecutionId,
    records: EventStream,
    permit: OwnedSemaphorePermit,
    owner: Tenant,
) -> Response {
    state.metrics().stream_opened();
    let projection = Projection {
        id,
        records: records.fuse(),
        keep_alive: state.inner.limits.keep_alive,
        close: state.inner.close_streams.clone(),
        state: state.clone(),
        owner,
        _permit: permit,
        done: false,
    };
    let body = futures_util::stream::unfold(projection, |mut p| async move {
        if p.done {
            return None;
        }
        let chunk = next_chunk(&mut p).await?;
        if chunk.is_err() {
            p.done = true;
        }
        Some((chunk, p))
    });
    event_stream_response(body)
}

/// A `200 text/event-stream` response whose body is `chunks` (an error ends it, aborting the
/// connection), with the headers every event stream carries: the native one above and the
/// OpenAI-compatible ones (`crate::openai::stream`).
pub fn event_stream_response(
    chunks: impl futures_util::Stream<Item = Result<Bytes, StreamAborted>> + Send + 'static,
) -> Response {
    let mut response = Response::new(Body::from_stream(chunks));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// An empty, immediately closed event stream (cursor at or past the terminal event).
pub fn empty_sse_response() -> Response {
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    response
}

async fn next_chunk(p: &mut Projection) -> Option<Result<Bytes, StreamAborted>> {
    let first = tokio::select! {
        biased;
        () = p.close.cancelled() => return None,
        item = p.records.next() => item?,
        () = tokio::time::sleep(p.keep_alive) => return Some(Ok(Bytes::from_static(KEEP_ALIVE))),
    };
    let mut out = String::new();
    let mut sent = 0u64;
    let mut ended = None;
    let mut item = Some(first);
    while let Some(next) = item.take() {
        let record = match next {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(execution_id = %p.id, error = %e, "event stream failed after headers");
                return Some(Err(StreamAborted));
            }
        };
        let Ok(json) = std::str::from_utf8(&record.json) else {
            return Some(Err(StreamAborted));
        };
        protocol::sse::write_event_frame(
            &mut out,
            record.sequence().get(),
            record.event.type_name(),
            json,
        );
        sent += 1;
        if record.event.is_terminal() {
            ended = Some(record.event.execution_id);
        }
        if out.len() >= BATCH_BYTES {
            break;
        }
        // Coalesce events that are already available, without waiting.
        item = p.records.next().now_or_never().flatten();
    }
    if let Some(id) = ended {
        crate::quota::release(&p.state, &p.owner, id).await;
    }
    p.state.metrics().events_sent(sent);
    Some(Ok(Bytes::from(out)))
}
