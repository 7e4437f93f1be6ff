//! Direct gets made here on the wire rather than through async-nats.
//!
//! - Batched (ADR-31, nats-server 2.11 and newer): up to `batch` messages of one subject from a
//!   stream sequence on, in one request. async-nats offers single direct gets only. The server
//!   answers with one message per stored message (the stored headers plus `Nats-Sequence` and
//!   the like, as a single direct get), then an end-of-batch status (`204 EOB`) whose
//!   `Nats-Num-Pending` says how many messages of the subject it did not send; a subject with
//!   nothing from that sequence on is one `404`. The replies come through the readers'
//!   connection's replies multiplexer (`nats::replies`: the client's own takes a single reply
//!   per request), registered before the request is sent.
//! - The last message of a subject, asked in the request's body (`last_by_subj`) on the
//!   stream's one direct-get subject. async-nats asks it in the request subject instead
//!   (`$JS.API.DIRECT.GET.{stream}.{subject}`), a new subject for every execution, whose match
//!   misses the server's cache of matches and takes its subscription list's write lock, the
//!   lock every message routed waits on (docs/scaling.md, "What one execution costs").

use async_nats::HeaderMap;
use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use protocol::ExecutionId;
use serde::Serialize;

use super::NatsEventStore;
use crate::error::StoreError;
use crate::nats::unavailable;

/// Most bytes one batch may carry; a log past this is read in further batches (or, past the
/// short-log bound, by an ordered consumer).
const BATCH_MAX_BYTES: usize = 8 * 1024 * 1024;

/// The status of the end-of-batch reply.
const END_OF_BATCH: u16 = 204;
/// The status of the one reply for a subject without messages from the requested sequence on.
const NOT_FOUND: u16 = 404;

/// One message of a batch.
pub(super) struct BatchMessage {
    pub stream_sequence: u64,
    pub headers: HeaderMap,
    pub payload: Bytes,
}

/// What one batched direct get returned.
pub(super) struct Batch {
    /// The subject's messages from the requested sequence on, in stream order.
    pub messages: Vec<BatchMessage>,
    /// The subject had messages after these when the server answered (the batch was full).
    pub more: bool,
}

/// The request body (ADR-31's `next_by_subj` with `batch`).
#[derive(Serialize)]
struct BatchRequest<'a> {
    seq: u64,
    next_by_subj: &'a str,
    batch: usize,
    max_bytes: usize,
}

/// The request body of a last-message get.
#[derive(Serialize)]
struct LastRequest<'a> {
    last_by_subj: &'a str,
}

/// The JSON body of a direct-get request.
fn body(request: &impl Serialize) -> Result<Bytes, StoreError> {
    serde_json::to_vec(request)
        .map(Bytes::from)
        .map_err(|e| unavailable("direct get", e))
}

/// A reply status a direct get cannot go on from.
fn refused(status: u16) -> StoreError {
    StoreError::Unavailable(format!("direct get: status {status}"))
}

fn header_u64(headers: Option<&HeaderMap>, name: &str) -> Option<u64> {
    headers?.get(name)?.as_str().parse().ok()
}

impl NatsEventStore {
    /// The last message of the execution's subject, on the partition's lane, or `None` where
    /// the subject has none (as this server saw it: a follower may lag its leader).
    pub(super) async fn direct_last(
        &self,
        id: ExecutionId,
    ) -> Result<Option<StreamMessage>, StoreError> {
        self.backend.check_connected()?;
        let subject = self.subject(id);
        let shard = self.shard(id);
        let request = async_nats::Request::new()
            .payload(body(&LastRequest {
                last_by_subj: &subject,
            })?)
            .timeout(Some(self.backend.settings.request_timeout));
        let reply = shard
            .lane
            .client
            .send_request(shard.direct_get_subject.clone(), request)
            .await
            .map_err(|e| unavailable("direct get", e))?;
        match reply.status.map(|s| s.as_u16()) {
            None | Some(200) => StreamMessage::try_from(reply)
                .map(Some)
                .map_err(|e| unavailable("direct get", e)),
            Some(NOT_FOUND) => Ok(None),
            Some(status) => Err(refused(status)),
        }
    }

    /// Up to `max` messages of the execution's subject from stream sequence `from` on, in one
    /// request. An empty batch means the subject has no message from `from` on (as this server
    /// saw it: a follower may lag its leader).
    pub(super) async fn direct_batch(
        &self,
        id: ExecutionId,
        from: u64,
        max: usize,
    ) -> Result<Batch, StoreError> {
        self.backend.check_connected()?;
        let subject = self.subject(id);
        let shard = self.shard(id);
        let readers = &shard.readers;
        let mut replies = readers.replies.register();
        let request = body(&BatchRequest {
            seq: from.max(1),
            next_by_subj: &subject,
            batch: max,
            max_bytes: BATCH_MAX_BYTES,
        })?;
        readers
            .client
            .publish_with_reply(
                shard.direct_get_subject.clone(),
                replies.subject.clone(),
                request,
            )
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
        tokio::time::timeout(self.backend.settings.request_timeout, collect)
            .await
            .map_err(|_| StoreError::Unavailable("direct get: timed out".into()))?
    }
}
