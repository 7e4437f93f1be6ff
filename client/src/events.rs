//! `EventStream`: one execution's events, exactly once and in order, across reconnections.
//!
//! The decision a reader must know: the stream trusts nothing but the sequence numbers. It keeps
//! the last *committed* sequence (the last event it handed to the caller), resumes with
//! `?after=<that>` whenever a connection ends before the terminal event (EOF, reset, idle
//! timeout, a retryable HTTP status), and accepts an event only if its sequence is exactly the
//! committed one plus one. A repeat or a gap is a protocol violation and ends the stream with an
//! error; it is never papered over. The stream ends right after the terminal event.
//!
//! An end of stream with no event at all is ambiguous: the reference answers a cursor at or past
//! the terminal event with an empty stream [R 52], but a gateway shutting down also closes
//! streams before their first event. The stream then asks for the snapshot and ends cleanly only
//! if the execution is terminal at or before the cursor; otherwise it resumes like after any
//! other truncation.

use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::Stream;
use protocol::sse::{SseError, SseEvent, SseParser};
use protocol::{ExecutionId, ExecutionSnapshot, RuntimeEvent, Sequence};
use reqwest::StatusCode;

use crate::client::{Inner, error_of, events_request};
use crate::error::ClientError;

/// An open connection and its parser.
#[derive(Debug)]
struct Connection {
    response: reqwest::Response,
    parser: SseParser,
}

/// The events of one execution after a cursor. Poll with [`EventStream::next`], or turn it into
/// a [`Stream`] with [`EventStream::into_stream`].
#[derive(Debug)]
pub struct EventStream {
    inner: Arc<Inner>,
    execution_id: ExecutionId,
    /// Last sequence handed to the caller (or the starting cursor).
    committed: Sequence,
    /// Whether any event was handed out: after one, an end of stream is a truncation.
    delivered: bool,
    connection: Option<Connection>,
    /// Parsed frames not yet checked and handed out.
    pending: VecDeque<SseEvent>,
    /// A parser error to report once the frames before it are handed out.
    deferred: Option<SseError>,
    /// Consecutive failures since the last delivered event.
    failures: u32,
    /// Connections opened (for diagnostics and tests).
    connections: u32,
    finished: bool,
}

impl EventStream {
    pub(crate) fn new(inner: Arc<Inner>, execution_id: ExecutionId, after: Sequence) -> Self {
        Self {
            inner,
            execution_id,
            committed: after,
            delivered: false,
            connection: None,
            pending: VecDeque::new(),
            deferred: None,
            failures: 0,
            connections: 0,
            finished: false,
        }
    }

    /// The execution this stream follows.
    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    /// The sequence of the last event handed out (the starting cursor before the first): the
    /// cursor to resume from with [`crate::Client::events`] after an error.
    pub fn last_sequence(&self) -> Sequence {
        self.committed
    }

    /// How many connections the stream has opened so far (1 without any resume).
    pub fn connections(&self) -> u32 {
        self.connections
    }

    /// The next event; `None` after the terminal event (or when the execution was already
    /// terminal at the cursor). After an error the stream is over: resume from
    /// [`EventStream::last_sequence`] with a new stream if the error is retryable.
    pub async fn next(&mut self) -> Option<Result<RuntimeEvent, ClientError>> {
        if self.finished {
            return None;
        }
        match self.advance().await {
            Ok(Some(event)) => Some(Ok(event)),
            Ok(None) => {
                self.close();
                None
            }
            Err(e) => {
                self.close();
                Some(Err(e))
            }
        }
    }

    /// The stream as a [`Stream`] of events.
    pub fn into_stream(self) -> impl Stream<Item = Result<RuntimeEvent, ClientError>> + Send {
        futures_util::stream::unfold(self, |mut events| async move {
            events.next().await.map(|item| (item, events))
        })
    }

    fn close(&mut self) {
        self.finished = true;
        self.connection = None;
        self.pending.clear();
    }

    async fn advance(&mut self) -> Result<Option<RuntimeEvent>, ClientError> {
        loop {
            if let Some(frame) = self.pending.pop_front() {
                let event = self.accept(&frame)?;
                if event.is_terminal() {
                    self.close();
                }
                return Ok(Some(event));
            }
            if let Some(error) = self.deferred.take() {
                return Err(match error {
                    SseError::FrameTooLarge { .. } => {
                        ClientError::Protocol("an event frame exceeds the size limit")
                    }
                    _ => ClientError::Protocol("the event stream is malformed"),
                });
            }
            let Some(connection) = self.connection.as_mut() else {
                match self.connect().await {
                    Ok(connection) => self.connection = Some(connection),
                    Err(e) if e.is_transient() => self.back_off(e).await?,
                    Err(e) => return Err(e),
                }
                continue;
            };
            let idle = self.inner.settings.idle_timeout;
            let read = tokio::time::timeout(idle, connection.response.chunk()).await;
            match read {
                Ok(Ok(Some(bytes))) => {
                    let mut frames = Vec::new();
                    if let Err(e) = connection.parser.push(&bytes, &mut frames) {
                        self.deferred = Some(e);
                        self.connection = None;
                    }
                    self.pending.extend(frames);
                }
                Ok(Ok(None)) => {
                    // An incomplete final frame is dropped by the parser, never dispatched.
                    if let Some(connection) = self.connection.take() {
                        let _ = connection.parser.finish();
                    }
                    if !self.delivered && self.ended_at_cursor().await? {
                        return Ok(None);
                    }
                    self.back_off(ClientError::StreamTruncated {
                        last_sequence: self.committed,
                    })
                    .await?;
                }
                Ok(Err(e)) => {
                    self.connection = None;
                    self.back_off(ClientError::transport(e)).await?;
                }
                Err(_) => {
                    self.connection = None;
                    self.back_off(ClientError::timeout()).await?;
                }
            }
        }
    }

    /// Opens `GET …/events?after=<committed>`.
    async fn connect(&mut self) -> Result<Connection, ClientError> {
        self.connections = self.connections.saturating_add(1);
        let url = self.inner.base.events(self.execution_id, self.committed);
        let send = events_request(&self.inner, url).send();
        let response = match tokio::time::timeout(self.inner.settings.request_timeout, send).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(ClientError::transport(e)),
            Err(_) => return Err(ClientError::timeout()),
        };
        if response.status() != StatusCode::OK {
            return Err(error_of(response, self.inner.settings.request_timeout).await);
        }
        let is_sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            });
        if !is_sse {
            return Err(ClientError::Protocol(
                "the events endpoint did not answer with an event stream",
            ));
        }
        Ok(Connection {
            response,
            parser: SseParser::with_max_frame_bytes(self.inner.settings.max_frame_bytes),
        })
    }

    /// Checks one frame and commits its event.
    fn accept(&mut self, frame: &SseEvent) -> Result<RuntimeEvent, ClientError> {
        let event: RuntimeEvent = serde_json::from_str(&frame.data)
            .map_err(|_| ClientError::Protocol("an event is not a valid runtime event"))?;
        if event.execution_id != self.execution_id {
            return Err(ClientError::Protocol(
                "an event belongs to another execution",
            ));
        }
        let expected = self.committed.next();
        if event.sequence < expected {
            return Err(ClientError::Protocol("an event sequence was repeated"));
        }
        if event.sequence > expected {
            return Err(ClientError::Protocol("the event sequence has a gap"));
        }
        if frame
            .id
            .as_deref()
            .is_some_and(|id| id != event.sequence.to_string())
        {
            return Err(ClientError::Protocol(
                "an event id differs from its sequence",
            ));
        }
        if frame.event != "message" && frame.event != event.type_name() {
            return Err(ClientError::Protocol("an event name differs from its type"));
        }
        self.committed = event.sequence;
        self.delivered = true;
        self.failures = 0;
        Ok(event)
    }

    /// After an empty stream: whether the execution is terminal at or before the cursor (so
    /// nothing more will ever come).
    async fn ended_at_cursor(&self) -> Result<bool, ClientError> {
        let client = crate::Client {
            inner: Arc::clone(&self.inner),
        };
        let snapshot: ExecutionSnapshot = client.get(self.execution_id).await?;
        Ok(snapshot.status.is_terminal() && snapshot.last_sequence <= self.committed)
    }

    /// Counts a failure and waits before the next connection, or gives up with `error` when
    /// the budget of consecutive failures is spent.
    async fn back_off(&mut self, error: ClientError) -> Result<(), ClientError> {
        if self.failures >= self.inner.settings.retry.max_retries {
            return Err(error);
        }
        self.failures += 1;
        let delay = self
            .inner
            .settings
            .retry
            .delay(self.failures, error.retry_after());
        tokio::time::sleep(delay).await;
        Ok(())
    }
}
