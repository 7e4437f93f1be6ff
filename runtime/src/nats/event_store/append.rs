//! The append path: a run published as one message, compare-and-set on the subject's last
//! stream sequence (cached per open execution, re-read when unknown or refused), with a retry
//! after a lost acknowledgement recognised by its message id.

use async_nats::header::HeaderName;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use protocol::{Sequence, Tenant};

use super::format::{
    FORMAT_HEADER, FORMAT_RUN, HEADER_ALLOWANCE, MSG_ID_HEADER, encode_run, msg_id,
};
use super::{Fetched, Head, NatsEventStore, OWNER_HEADER};
use crate::error::StoreError;
use crate::event_store::{EventRecord, WriterId};
use crate::nats::unavailable;

impl NatsEventStore {
    /// Publishes `run` as one message (format 1 for one event, else format 2) expecting the
    /// subject's last stream sequence to be `expected`.
    pub(super) async fn publish(
        &self,
        run: &[EventRecord],
        expected: u64,
        writer: WriterId,
        owner: Option<&Tenant>,
    ) -> Result<Result<u64, PublishErrorKind>, StoreError> {
        self.backend.check_connected()?;
        let id = run[0].event.execution_id;
        let mut message = if run.len() == 1 {
            PublishMessage::build().payload(run[0].json.clone())
        } else {
            PublishMessage::build()
                .payload(encode_run(run))
                .header(HeaderName::from_static(FORMAT_HEADER), FORMAT_RUN)
        };
        message = message
            .header(HeaderName::from_static(MSG_ID_HEADER), msg_id(run, writer))
            .expected_last_subject_sequence(expected);
        if let Some(owner) = owner {
            message = message.header(HeaderName::from_static(OWNER_HEADER), owner.as_str());
        }
        let lane = &self.shard(id).lane;
        let ack = match lane.context.send_publish(self.subject(id), message).await {
            Ok(ack) => ack,
            Err(e) => return Err(unavailable("publish", e)),
        };
        // Outcomes feed the connection's quorum watch (`nats::quorum`), a wait its caller gives
        // up on too.
        let mut waiting = AckWait {
            writes: &lane.writes,
            since: std::time::Instant::now(),
            answered: false,
        };
        let answer = ack.await;
        waiting.answered = true;
        match answer {
            Ok(ack) => {
                lane.writes.answered();
                Ok(Ok(ack.sequence))
            }
            Err(e) => match e.kind() {
                kind @ PublishErrorKind::WrongLastSequence => {
                    lane.writes.answered();
                    Ok(Err(kind))
                }
                // No answer, or no server reachable from here holds the stream (the stream
                // exists: a cut-off server has lost the route to its leader).
                PublishErrorKind::TimedOut | PublishErrorKind::StreamNotFound => {
                    lane.writes.timed_out();
                    Err(unavailable("publish ack", e))
                }
                _ => Err(unavailable("publish ack", e)),
            },
        }
    }

    /// The largest body a message of a run may have: the stream's message size and the
    /// server's payload limit, less room for headers.
    pub(super) fn message_budget(&self) -> usize {
        let max_message = usize::try_from(self.backend.settings.max_event_bytes).unwrap_or(0);
        // An atomic read: `server_info()` would clone the whole server info on every append.
        let max_payload = self.backend.client.max_payload();
        let limit = if max_payload == 0 {
            max_message
        } else {
            max_message.min(max_payload)
        };
        limit.saturating_sub(HEADER_ALLOWANCE)
    }

    /// Appends `run` (checked, contiguous, non-empty) as one message, compare-and-set on the
    /// subject's last stream sequence.
    pub(super) async fn append_message(
        &self,
        run: &[EventRecord],
        writer: WriterId,
    ) -> Result<(), StoreError> {
        let first = &run[0].event;
        let last = &run[run.len() - 1].event;
        let id = first.execution_id;
        // Every event before the run is stored: the writer appends a run once the one before
        // it was acknowledged (or settled), and `execution.accepted` before any.
        let known = Sequence(first.sequence.get().saturating_sub(1));
        let cached = self.heads.lock().get(&id).copied();
        let (head, fetched) = match cached {
            Some(h) if h.sequence.next() == first.sequence => (h, None),
            _ => match self.fetch_head(id, known).await? {
                Some(f) => (f.head, Some(f)),
                None => return Err(StoreError::NotFound),
            },
        };
        if head.terminal || head.sequence.next() != first.sequence {
            self.remember(id, head);
            if fetched.is_some_and(|f| f.is(run, writer)) {
                // Our write is the last one: a retry after a lost ack.
                return Ok(());
            }
            return Err(StoreError::Conflict {
                last: head.sequence,
                terminal: head.terminal,
            });
        }
        let appended = |stream_sequence| Head {
            sequence: last.sequence,
            stream_sequence,
            terminal: last.is_terminal(),
            time: last.time,
        };
        match self
            .publish(run, head.stream_sequence, writer, None)
            .await?
        {
            Ok(stream_sequence) => {
                self.remember(id, appended(stream_sequence));
                Ok(())
            }
            Err(_) => {
                self.heads.lock().remove(&id);
                match self.fetch_head(id, known).await? {
                    Some(f) if f.is(run, writer) => {
                        // Our write landed earlier (a retry after a lost ack).
                        self.remember(id, f.head);
                        Ok(())
                    }
                    Some(Fetched { head: h, .. }) => Err(StoreError::Conflict {
                        last: h.sequence,
                        terminal: h.terminal,
                    }),
                    None => Err(StoreError::NotFound),
                }
            }
        }
    }
}

/// A write waiting for its acknowledgement: dropped unanswered (its caller stopped waiting),
/// it tells the quorum watch ([`crate::nats::quorum::Writes::abandoned`]).
struct AckWait<'a> {
    writes: &'a crate::nats::quorum::Writes,
    since: std::time::Instant,
    answered: bool,
}

impl Drop for AckWait<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.writes.abandoned(self.since.elapsed());
        }
    }
}
