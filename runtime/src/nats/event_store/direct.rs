//! Direct gets of the events stream.
//!
//! - Batched reads of one log and the heads of many logs at once: `nats::direct` (ADR-31).
//! - The last message of a subject, asked in the request's body (`last_by_subj`) on the
//!   stream's one direct-get subject. async-nats asks it in the request subject instead
//!   (`$JS.API.DIRECT.GET.{stream}.{subject}`), a new subject for every execution, whose match
//!   misses the server's cache of matches and takes its subscription list's write lock, the
//!   lock every message routed waits on (docs/scaling.md, "What one execution costs").

use std::collections::HashMap;

use async_nats::jetstream::message::StreamMessage;
use protocol::ExecutionId;
use serde::Serialize;

use super::NatsEventStore;
use crate::error::StoreError;
use crate::nats::direct::{
    BATCH_MAX_BYTES, Batch, BatchMessage, MULTI_LAST_MAX, MultiLast, NOT_FOUND, NextBatch, body,
    refused,
};
use crate::nats::unavailable;

/// Heads asked in one multi-subject get, well under the server's [`MULTI_LAST_MAX`]: a log's
/// last message may be a run of events up to the stream's message size, so a request naming
/// many subjects may not get all of them in one batch (those left are read one by one).
const HEADS_PER_REQUEST: usize = 256;
const _: () = assert!(HEADS_PER_REQUEST <= MULTI_LAST_MAX);

/// The request body of a last-message get.
#[derive(Serialize)]
struct LastRequest<'a> {
    last_by_subj: &'a str,
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
        let request = body(&NextBatch {
            seq: from.max(1),
            next_by_subj: &subject,
            batch: max,
            max_bytes: BATCH_MAX_BYTES,
        })?;
        crate::nats::direct::batch(
            &shard.readers,
            shard.direct_get_subject.clone(),
            request,
            self.backend.settings.request_timeout,
        )
        .await
    }

    /// The last message of each log of `ids` that has one, as this server saw it (a follower
    /// may lag its leader): one multi-subject get per partition and [`HEADS_PER_REQUEST`]
    /// logs. A log missing from the answer either has no message there or did not fit in its
    /// request's batch; callers read those one by one.
    pub(super) async fn direct_lasts(
        &self,
        ids: &[ExecutionId],
    ) -> Result<HashMap<ExecutionId, BatchMessage>, StoreError> {
        self.backend.check_connected()?;
        let mut by_shard: HashMap<usize, Vec<(String, ExecutionId)>> = HashMap::new();
        for &id in ids {
            by_shard
                .entry(usize::from(self.backend.events.shard_of(&id)))
                .or_default()
                .push((self.subject(id), id));
        }
        let mut found = HashMap::with_capacity(ids.len());
        for (shard, logs) in by_shard {
            let shard = &self.shards[shard];
            for chunk in logs.chunks(HEADS_PER_REQUEST) {
                let subjects: Vec<String> = chunk.iter().map(|(s, _)| s.clone()).collect();
                let request = body(&MultiLast {
                    multi_last: &subjects,
                    batch: subjects.len(),
                })?;
                let batch = crate::nats::direct::batch(
                    &shard.readers,
                    shard.direct_get_subject.clone(),
                    request,
                    self.backend.settings.request_timeout,
                )
                .await?;
                let of: HashMap<&str, ExecutionId> =
                    chunk.iter().map(|(s, id)| (s.as_str(), *id)).collect();
                for message in batch.messages {
                    if let Some(&id) = message.subject().and_then(|s| of.get(s)) {
                        found.insert(id, message);
                    }
                }
            }
        }
        Ok(found)
    }
}
