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
//!
//! The subscription with its stream slot, keep-alive and shutdown signal ([`LogFeed`]) and the
//! body built from a [`Projector`] are shared with the OpenAI streams (`crate::openai::stream`),
//! which write other frames from the same log.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use protocol::{ExecutionId, Tenant};
use runtime::lazy_timer::LazyTimer;
use runtime::own_wakes::OwnWakes;
use runtime::{EventRecord, EventStream, StoreError};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::state::AppState;

/// Most bytes of frames coalesced into one body chunk.
pub const BATCH_BYTES: usize = 64 * 1024;

/// The comment frame sent when the log is idle, so proxies keep the connection open.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// Failure after the headers were sent; aborts the connection.
#[derive(Debug, thiserror::Error)]
#[error("event stream failed")]
pub struct StreamAborted;

/// A subscription to an execution's log as a response body reads it, shared by the native
/// projection here and the OpenAI ones (`crate::openai::stream`): the stream slot it holds,
/// the keep-alive timer and the shutdown signal. It counts as an open stream from
/// [`LogFeed::open`] until it is dropped, however the body ends.
#[derive(derive_more::Debug)]
pub struct LogFeed {
    /// Fused: batching peeks with `now_or_never`, which may observe the end of the stream.
    #[debug(skip)]
    records: futures_util::stream::Fuse<EventStream>,
    keep_alive: Duration,
    /// When the next keep-alive is due: one timer for the feed's life, its deadline moved by
    /// each wait (a `sleep` made per wait took the runtime's timer lock twice per chunk of
    /// every stream: `runtime::lazy_timer`).
    #[debug(skip)]
    idle: LazyTimer,
    /// Ready once the gateway closes its streams: one wait for the feed's life, on a child of
    /// the gateway's token (the gateway's own token, shared by all of them, would be a lock
    /// they all take), polled by [`LogFeed::wait`] only once that child was cancelled
    /// (`OwnWakes`), not for every chunk of the stream.
    #[debug(skip)]
    closed: OwnWakes<WaitForCancellationFutureOwned>,
    pub state: AppState,
    _permit: OwnedSemaphorePermit,
    /// Set once the body must end: after an error, or (for a projection that says so) the
    /// terminal event.
    pub done: bool,
}

/// What [`LogFeed::wait`] saw first.
#[derive(Debug)]
pub enum Waited {
    /// The next record; `None` at the end of the subscription.
    Record(Option<Result<Arc<EventRecord>, StoreError>>),
    /// Nothing for the keep-alive period: send [`KEEP_ALIVE`].
    Idle,
    /// The gateway shuts down its streams.
    Closed,
}

impl LogFeed {
    pub fn open(state: &AppState, records: EventStream, permit: OwnedSemaphorePermit) -> Self {
        state.metrics().stream_opened();
        Self {
            records: records.fuse(),
            keep_alive: state.inner.limits.keep_alive,
            idle: LazyTimer::at(Instant::now() + state.inner.limits.keep_alive),
            closed: runtime::own_wakes::cancelled(&state.inner.close_streams.child_token()),
            state: state.clone(),
            _permit: permit,
            done: false,
        }
    }

    /// Waits for the next record, the keep-alive period or the shutdown signal, whichever
    /// comes first (shutdown wins a tie).
    pub async fn wait(&mut self) -> Waited {
        self.idle.set(Instant::now() + self.keep_alive);
        tokio::select! {
            biased;
            () = &mut self.closed => Waited::Closed,
            item = self.records.next() => Waited::Record(item),
            () = self.idle.elapsed() => Waited::Idle,
        }
    }

    /// The next record if it is available now, without waiting (to coalesce a batch).
    pub fn ready(&mut self) -> Option<Result<Arc<EventRecord>, StoreError>> {
        self.records.next().now_or_never().flatten()
    }
}

impl Drop for LogFeed {
    fn drop(&mut self) {
        self.state.metrics().stream_closed();
    }
}

/// What writes a body's frames from a [`LogFeed`], one chunk at a time.
pub trait Projector: Send + 'static {
    /// The next body chunk read from `feed`; `None` ends the body, an error aborts the
    /// connection.
    fn next_chunk(
        &mut self,
        feed: &mut LogFeed,
    ) -> impl Future<Output = Option<Result<Bytes, StreamAborted>>> + Send;
}

/// A `200 text/event-stream` response whose body `projector` writes from `feed`; it ends at
/// the first error or once the feed is done.
pub fn projected_response(feed: LogFeed, projector: impl Projector) -> Response {
    let body = futures_util::stream::unfold((feed, projector), |(mut feed, mut p)| async move {
        if feed.done {
            return None;
        }
        let chunk = p.next_chunk(&mut feed).await?;
        if chunk.is_err() {
            feed.done = true;
        }
        Some((chunk, (feed, p)))
    });
    event_stream_response(body)
}

/// The native projection of one execution's log.
struct Projection {
    /// The execution streamed, named by the stream's log lines.
    id: ExecutionId,
    /// The execution's owner, whose quota slot the terminal event releases.
    owner: Tenant,
}

impl Projector for Projection {
    async fn next_chunk(&mut self, feed: &mut LogFeed) -> Option<Result<Bytes, StreamAborted>> {
        let first = match feed.wait().await {
            Waited::Record(item) => item?,
            Waited::Idle => return Some(Ok(Bytes::from_static(KEEP_ALIVE))),
            Waited::Closed => return None,
        };
        let mut out = String::new();
        let mut sent = 0u64;
        let mut ended = None;
        let mut item = Some(first);
        while let Some(next) = item.take() {
            let record = match next {
                Ok(record) => record,
                Err(e) => {
                    tracing::warn!(execution_id = %self.id, error = %e, "event stream failed after headers");
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
            item = feed.ready();
        }
        if let Some(id) = ended {
            crate::quota::release(&feed.state, &self.owner, id).await;
        }
        feed.state.metrics().events_sent(sent);
        Some(Ok(Bytes::from(out)))
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
    let feed = LogFeed::open(state, records, permit);
    projected_response(feed, Projection { id, owner })
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::StreamExt;
    use runtime::memory::{
        MemoryCancelBus, MemoryEventStore, MemoryIdempotencyStore, MemoryJobQueue, MemoryLimits,
    };
    use runtime::quota::QuotaGate;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::state::{ApiLimits, Backend};

    fn state() -> AppState {
        let backend = Backend {
            store: Arc::new(MemoryEventStore::new(MemoryLimits::default())),
            queue: Arc::new(MemoryJobQueue::new()),
            idempotency: Arc::new(MemoryIdempotencyStore::new(Duration::from_secs(60))),
            cancel: Arc::new(MemoryCancelBus::new()),
            quotas: Arc::new(QuotaGate::unlimited()),
            heal_missing: false,
        };
        AppState::new(backend, Default::default(), ApiLimits::default())
    }

    fn feed(state: &AppState) -> LogFeed {
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        LogFeed::open(state, futures_util::stream::pending().boxed(), permit)
    }

    #[tokio::test]
    async fn closing_the_gateways_streams_ends_a_waiting_feed_and_any_opened_later() {
        let state = state();
        let mut waiting = feed(&state);
        let mut quiet = feed(&state);
        // Waits on its own child token, kept across waits: a wait that timed out leaves it armed.
        assert!(quiet.wait().now_or_never().is_none());
        let waited = tokio::spawn(async move { waiting.wait().await });
        tokio::task::yield_now().await;
        state.close_streams();
        let waited = tokio::time::timeout(Duration::from_secs(10), waited)
            .await
            .expect("the waiting feed ends once streams are closed")
            .unwrap();
        assert!(matches!(waited, Waited::Closed));
        assert!(matches!(quiet.wait().await, Waited::Closed));
        assert!(matches!(feed(&state).wait().await, Waited::Closed));
    }
}
