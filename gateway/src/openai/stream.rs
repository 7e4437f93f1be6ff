//! The OpenAI event streams over HTTP: the Responses grammar (`event:` + `data:` frames with
//! `sequence_number`) and Chat Completions chunks (`data:` frames, then `data: [DONE]`),
//! projected from the store's subscription to an execution's log.
//!
//! Backpressure, batching, keep-alives, the stream slot and the shutdown signal work as in
//! the native projection, whose [`LogFeed`] and [`Projector`] this module uses: the body is pulled only as fast as the socket
//! drains, events already available are coalesced, and a store failure after the headers
//! aborts the connection so the client sees a truncation and resumes. The one decision a reader
//! must know: a Responses stream always reads the log from its start, whatever the cursor, and
//! only drops the events numbered at or below `starting_after` ([`super::projection`]), so
//! the numbering does not depend on where a reader joined.

use axum::response::Response;
use bytes::Bytes;
use protocol::{ExecutionStatus, RuntimeEvent};
use runtime::EventStream;
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;

use super::chat::Chunks;
use super::error::OpenAiError;
use super::projection::Projection;
use crate::events::{
    BATCH_BYTES, KEEP_ALIVE, LogFeed, Projector, StreamAborted, Waited, projected_response,
};
use crate::state::AppState;

/// Which API's frames a stream writes.
#[derive(Debug)]
pub enum Grammar {
    /// The Responses events numbered above `after` (all of them when `None`).
    Responses {
        projection: Option<Projection>,
        after: Option<u64>,
    },
    /// Chat Completions chunks.
    Chat(Chunks),
}

impl Grammar {
    /// The Responses grammar, resuming after event `after`.
    pub fn responses(after: Option<u64>) -> Self {
        Grammar::Responses {
            projection: None,
            after,
        }
    }

    /// Writes the frames of `event` to `out`; returns how many.
    fn write(&mut self, event: &RuntimeEvent, out: &mut String) -> u64 {
        let mut values = Vec::new();
        match self {
            Grammar::Responses { projection, after } => {
                projection
                    .get_or_insert_with(|| Projection::new(event))
                    .apply(event, &mut values);
                let mut n = 0;
                for v in &values {
                    let number = v.get("sequence_number").and_then(Value::as_u64);
                    if after.is_some_and(|after| number.is_none_or(|n| n <= after)) {
                        continue;
                    }
                    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
                    out.push_str("event: ");
                    out.push_str(kind);
                    out.push_str("\ndata: ");
                    out.push_str(&v.to_string());
                    out.push_str("\n\n");
                    n += 1;
                }
                n
            }
            Grammar::Chat(chunks) => {
                chunks.apply(event, &mut values);
                for v in &values {
                    out.push_str("data: ");
                    out.push_str(&v.to_string());
                    out.push_str("\n\n");
                }
                if event.is_terminal() {
                    let failure = chunks.projection().and_then(|p| match p.status() {
                        ExecutionStatus::Succeeded => None,
                        _ => Some(
                            p.error()
                                .cloned()
                                .unwrap_or_else(protocol::RuntimeError::internal),
                        ),
                    });
                    match failure {
                        // The SDKs raise an API error for a `data:` object with `error`.
                        Some(error) => {
                            let body = OpenAiError::execution_failed(&error).body();
                            let json = serde_json::to_string(&body).unwrap_or_default();
                            out.push_str("data: ");
                            out.push_str(&json);
                            out.push_str("\n\n");
                        }
                        None => out.push_str("data: [DONE]\n\n"),
                    }
                }
                values.len() as u64
            }
        }
    }
}

impl Projector for Grammar {
    /// The next body chunk: frames of the events available now (waiting for at least one that
    /// writes a frame), a keep-alive when idle, `None` at the end.
    async fn next_chunk(&mut self, feed: &mut LogFeed) -> Option<Result<Bytes, StreamAborted>> {
        let mut out = String::new();
        let mut sent = 0u64;
        loop {
            let first = match feed.wait().await {
                Waited::Record(item) => item,
                Waited::Idle => return Some(Ok(Bytes::from_static(KEEP_ALIVE))),
                Waited::Closed => return None,
            };
            let Some(first) = first else {
                feed.done = true;
                break;
            };
            let mut item = Some(first);
            while let Some(next) = item.take() {
                let record = match next {
                    Ok(record) => record,
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream failed after headers");
                        return Some(Err(StreamAborted));
                    }
                };
                sent += self.write(&record.event, &mut out);
                if record.event.is_terminal() {
                    // The tenant's quota slot is free before the client sees the end (as on the
                    // native event stream).
                    crate::quota::release_ended(&feed.state, record.event.execution_id).await;
                    feed.done = true;
                    break;
                }
                if out.len() >= BATCH_BYTES {
                    break;
                }
                item = feed.ready();
            }
            if !out.is_empty() || feed.done {
                break;
            }
        }
        feed.state.metrics().events_sent(sent);
        if out.is_empty() {
            return None;
        }
        Some(Ok(Bytes::from(out)))
    }
}

/// A `200 text/event-stream` response writing `records` in `grammar`.
pub fn sse_response(
    state: &AppState,
    records: EventStream,
    permit: OwnedSemaphorePermit,
    grammar: Grammar,
) -> Response {
    projected_response(LogFeed::open(state, records, permit), grammar)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protocol::{EventBody, RuntimeError};

    use super::super::fixture::{log, replay, says_hi_then};
    use super::*;

    fn written(mut grammar: Grammar, log: &[RuntimeEvent]) -> String {
        replay(log, |event, out| {
            grammar.write(event, out);
        })
    }

    #[test]
    fn responses_frames_name_their_type_and_a_resume_starts_after_the_cursor() {
        let log = says_hi_then(vec![]);
        let whole = written(Grammar::responses(None), &log);
        let frames: Vec<&str> = whole.split_terminator("\n\n").collect();
        for (n, frame) in frames.iter().enumerate() {
            let (event, data) = frame.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap();
            assert_eq!(event.trim_start_matches("event: "), data["type"]);
            assert_eq!(data["sequence_number"], n as u64);
        }
        // Exactly the frames after the cursor, byte for byte.
        let resumed = written(Grammar::responses(Some(2)), &log);
        let tail: String = frames[3..].iter().map(|f| format!("{f}\n\n")).collect();
        assert_eq!(resumed, tail);
        assert!(written(Grammar::responses(Some(frames.len() as u64 - 1)), &log).is_empty());
    }

    #[test]
    fn a_chat_stream_ends_with_done_or_with_the_error() {
        let ok = written(Grammar::Chat(Chunks::new(false)), &says_hi_then(vec![]));
        assert!(ok.ends_with("data: [DONE]\n\n"), "{ok}");
        assert!(!ok.contains("event:"));
        let failed = log(vec![
            EventBody::Accepted,
            EventBody::Failed {
                error: RuntimeError::deadline_exceeded(),
            },
        ]);
        let failed = written(Grammar::Chat(Chunks::new(true)), &failed);
        assert!(!failed.contains("[DONE]"), "{failed}");
        let last = failed.trim_end().rsplit("data: ").next().unwrap();
        let error: Value = serde_json::from_str(last).unwrap();
        assert_eq!(error["error"]["code"], "deadline_exceeded");
        assert_eq!(error["error"]["type"], "server_error");
    }
}
