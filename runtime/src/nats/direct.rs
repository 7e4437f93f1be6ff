//! Batched direct gets (ADR-31, nats-server 2.11 and newer), made here on the wire: async-nats
//! offers single direct gets only.
//!
//! A batched request is answered with one message per stored message it selects (the stored
//! headers plus `Nats-Sequence`, `Nats-Subject` and the like, as a single direct get), then an
//! end-of-batch status (`204 EOB`) whose `Nats-Num-Pending` says how many selected messages it
//! did not send; a request that selects nothing is one `404`. The replies come through a
//! connection's replies multiplexer (`nats::replies`: the client's own takes a single reply per
//! request), registered before the request is sent. Two selections are used:
//! - [`NextBatch`]: up to `batch` messages of a subject (wildcards allowed) from a stream
//!   sequence on: an execution's log (`event_store::read`), a partition's jobs (the deadline
//!   sweeper's scan, `job_queue`).
//! - [`MultiLast`]: the last message of each of up to [`MULTI_LAST_MAX`] subjects: the heads
//!   of many logs at once (`event_store`).

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde::Serialize;

use super::{Readers, unavailable};
use crate::error::StoreError;

/// Most bytes one batch may carry; what is left is read by a further request.
pub(crate) const BATCH_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Most subjects one [`MultiLast`] request may name (the server answers more with `413`).
pub(crate) const MULTI_LAST_MAX: usize = 1024;

/// The status of the end-of-batch reply.
const END_OF_BATCH: u16 = 204;
/// The status of the one reply for a request that selects no message.
pub(crate) const NOT_FOUND: u16 = 404;

/// Up to `batch` messages of `next_by_subj` from stream sequence `seq` on, at most
/// `max_bytes` in all (ADR-31's `next_by_subj` with `batch`).
#[derive(Serialize)]
pub(crate) struct NextBatch<'a> {
    pub seq: u64,
    pub next_by_subj: &'a str,
    pub batch: usize,
    pub max_bytes: usize,
}

/// The last message of each subject of `multi_last` that has one (ADR-31's multi-subject
/// get), at most `batch` messages.
#[derive(Serialize)]
pub(crate) struct MultiLast<'a> {
    pub multi_last: &'a [String],
    pub batch: usize,
}

/// One message of a batch.
pub(crate) struct BatchMessage {
    pub stream_sequence: u64,
    pub headers: HeaderMap,
    pub payload: Bytes,
}

impl BatchMessage {
    /// The subject the message was stored under.
    pub(crate) fn subject(&self) -> Option<&str> {
        self.headers.get("Nats-Subject").map(|v| v.as_str())
    }
}

/// What one batched direct get returned.
pub(crate) struct Batch {
    /// The selected messages, in stream order.
    pub messages: Vec<BatchMessage>,
    /// The request selected messages after these when the server answered (the batch was
    /// full).
    pub more: bool,
}

/// The JSON body of a direct-get request.
pub(crate) fn body(request: &impl Serialize) -> Result<Bytes, StoreError> {
    serde_json::to_vec(request)
        .map(Bytes::from)
        .map_err(|e| unavailable("direct get", e))
}

/// A reply status a direct get cannot go on from.
pub(crate) fn refused(status: u16) -> StoreError {
    StoreError::Unavailable(format!("direct get: status {status}"))
}

fn header_u64(headers: Option<&HeaderMap>, name: &str) -> Option<u64> {
    headers?.get(name)?.as_str().parse().ok()
}

/// Sends the batched request `request` (a [`body`]) to a stream's direct-get subject
/// (`$JS.API.DIRECT.GET.{stream}`) on `readers`' connection and collects its replies, within
/// `timeout`.
pub(crate) async fn batch(
    readers: &Readers,
    direct_get_subject: async_nats::Subject,
    request: Bytes,
    timeout: Duration,
) -> Result<Batch, StoreError> {
    let mut replies = readers.replies.register();
    readers
        .client
        .publish_with_reply(direct_get_subject, replies.subject.clone(), request)
        .await
        .map_err(|e| unavailable("direct get", e))?;
    let collect = async {
        let mut messages = Vec::new();
        while let Some(reply) = replies.next().await {
            match reply.status.map(|s| s.as_u16()) {
                None | Some(200) => {
                    let stream_sequence = header_u64(reply.headers.as_ref(), "Nats-Sequence")
                        .ok_or_else(|| {
                            StoreError::Unavailable("direct get: reply without sequence".into())
                        })?;
                    messages.push(BatchMessage {
                        stream_sequence,
                        headers: reply.headers.unwrap_or_default(),
                        payload: reply.payload,
                    });
                }
                Some(END_OF_BATCH) => {
                    let pending = header_u64(reply.headers.as_ref(), "Nats-Num-Pending");
                    return Ok(Batch {
                        more: pending.is_some_and(|p| p > 0),
                        messages,
                    });
                }
                Some(NOT_FOUND) if messages.is_empty() => {
                    return Ok(Batch {
                        messages,
                        more: false,
                    });
                }
                Some(status) => return Err(refused(status)),
            }
        }
        Err(StoreError::Unavailable(
            "direct get: subscription closed".into(),
        ))
    };
    tokio::time::timeout(timeout, collect)
        .await
        .map_err(|_| StoreError::Unavailable("direct get: timed out".into()))?
}
