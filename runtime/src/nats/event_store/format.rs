//! The stored format of the events stream.
//!
//! A message without the `Mrt-Format` header is format 1: its body is one event's JSON (every
//! log written before runs existed stays readable). `Mrt-Format: 2`: the body is a JSON array
//! holding a contiguous run of events, each element exactly the event's JSON, with
//! `Mrt-Msg-Id = {execution_id}:{first}-{last}:{writer}` ([`MSG_ID_HEADER`]).
//! [`EventStore::append_run_as`](crate::EventStore::append_run_as) packs a run into as few
//! messages as the stream's message size allows (a run of one is written in format 1, as
//! before), each still compare-and-set on the subject's last stream sequence; a retried
//! identical run fails that compare-and-set and is recognised by its msg id as the last message,
//! while another writer's run of the same sequences has another id and is fenced.
//! Every reader expands a message into its events and skips those at or before its cursor, so
//! a cursor may fall inside a run; the head of a log is the last event of its last message. A
//! message is stored (and republished) as a unit, so gap detection on the live path works per
//! message: a message whose first event is past the next expected one means a message was
//! missed, and the stream is re-read.

use async_nats::HeaderMap;
use bytes::{BufMut, Bytes, BytesMut};

use crate::error::StoreError;
use crate::event_store::{EventRecord, WriterId};

/// The header naming a message's stored format (see the module docs); absent means format 1.
pub(super) const FORMAT_HEADER: &str = "Mrt-Format";

/// Format 2: a JSON array holding a contiguous run of events.
pub(super) const FORMAT_RUN: &str = "2";

/// The header carrying a message's [`msg_id`].
///
/// Not `Nats-Msg-Id`: the server keeps every `Nats-Msg-Id` it stored for the duplicate window,
/// one entry per message, and on the events stream (every append of every execution) that
/// state grew to millions of entries whose garbage collection stalled the stream's appends
/// (BENCHMARKS.md, "Duplicate state"). Compare-and-set already refuses a second copy of a
/// message, so
/// the id only has to be readable on the last message. Logs written before carry it as
/// `Nats-Msg-Id`, which [`written_id`] still reads.
pub(super) const MSG_ID_HEADER: &str = "Mrt-Msg-Id";

/// The msg id a stored message was written with (see [`MSG_ID_HEADER`]).
pub(super) fn written_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(MSG_ID_HEADER)
        .or_else(|| headers.get("Nats-Msg-Id"))
        .map(|v| v.as_str().to_owned())
}

/// Room left in a message for its headers when packing a run (msg id, expected sequence,
/// format, and what the server adds), so a run never exceeds the stream's message size.
pub(super) const HEADER_ALLOWANCE: usize = 1024;

/// The events of one stored message, or `None` when it is not a message of a format this
/// process reads.
pub(super) fn decode_message(
    headers: Option<&HeaderMap>,
    payload: Bytes,
) -> Option<Vec<EventRecord>> {
    match headers
        .and_then(|h| h.get(FORMAT_HEADER))
        .map(|v| v.as_str())
    {
        None => Some(vec![EventRecord::decode(payload)?]),
        Some(FORMAT_RUN) => {
            let records = decode_packed(&payload).or_else(|| decode_elements(&payload))?;
            let contiguous = records
                .windows(2)
                .all(|pair| pair[1].sequence() == pair[0].sequence().next());
            (contiguous && !records.is_empty()).then_some(records)
        }
        Some(_) => None,
    }
}

/// The events of a run body as [`encode_run`] writes it, `[e1,e2,…]` with nothing between the
/// elements, each decoded where it is found: one pass over the body. `None` when the body has
/// another shape (or an element is not an event), for [`decode_elements`] to read.
fn decode_packed(payload: &Bytes) -> Option<Vec<EventRecord>> {
    // Checked as UTF-8 once, then read as text (see `EventRecord::decode`).
    let body = std::str::from_utf8(payload).ok()?;
    if !body.starts_with('[') {
        return None;
    }
    let mut records = Vec::new();
    let mut start = 1;
    loop {
        // `start` follows a `[` or a `,`: always a character boundary.
        let element = body.get(start..).filter(|rest| rest.starts_with('{'))?;
        let mut events = serde_json::Deserializer::from_str(element).into_iter();
        let event = events.next()?.ok()?;
        let end = start + events.byte_offset();
        // Each record keeps exactly its element's bytes, shared with the payload.
        records.push(EventRecord {
            event,
            json: payload.slice(start..end),
        });
        match body.as_bytes().get(end) {
            Some(b',') => start = end + 1,
            Some(b']') if end + 1 == body.len() => return Some(records),
            _ => return None,
        }
    }
}

/// The events of any JSON array of events: its elements found first, then each decoded.
fn decode_elements(payload: &Bytes) -> Option<Vec<EventRecord>> {
    let raws: Vec<&serde_json::value::RawValue> = serde_json::from_slice(payload).ok()?;
    raws.into_iter()
        .map(|raw| EventRecord::decode(payload.slice_ref(raw.get().as_bytes())))
        .collect()
}

pub(super) fn undecodable() -> StoreError {
    StoreError::Unavailable("undecodable message in the events stream".into())
}

/// The body of a format-2 message: the events' JSON as one array.
pub(super) fn encode_run(run: &[EventRecord]) -> Bytes {
    let size = run.iter().map(|r| r.json.len() + 1).sum::<usize>() + 1;
    let mut body = BytesMut::with_capacity(size);
    body.put_u8(b'[');
    for (i, record) in run.iter().enumerate() {
        if i > 0 {
            body.put_u8(b',');
        }
        body.put_slice(&record.json);
    }
    body.put_u8(b']');
    body.freeze()
}

/// The end of the first message of `run[start..end]`: as many events as fit in `budget` bytes
/// of body, at least one.
pub(super) fn pack(run: &[EventRecord], start: usize, end: usize, budget: usize) -> usize {
    let mut size = 1 + run[start].json.len() + 1;
    let mut next = start + 1;
    while next < end {
        size += run[next].json.len() + 1;
        if size > budget {
            break;
        }
        next += 1;
    }
    next
}

/// The msg id of a message holding `run` ([`MSG_ID_HEADER`]): `{execution_id}:{sequence}:{writer}`
/// for one event (format 1, as ever), `{execution_id}:{first}-{last}:{writer}` for a run. The
/// writer part keeps two writers of the same sequences apart even when their events serialize
/// identically (two duplicate deliveries selecting the same route in the same millisecond), so
/// recognising a landed write only ever absorbs a writer's own retry and compare-and-set
/// decides between writers.
pub(super) fn msg_id(run: &[EventRecord], writer: WriterId) -> String {
    let (first, last) = (&run[0].event, &run[run.len() - 1].event);
    let id = first.execution_id;
    if run.len() == 1 {
        format!("{id}:{}:{writer}", first.sequence)
    } else {
        format!("{id}:{}-{}:{writer}", first.sequence, last.sequence)
    }
}

#[cfg(test)]
mod tests {
    use async_nats::HeaderMap;
    use protocol::{EventBody, ExecutionId, RuntimeEvent, Sequence, Timestamp};

    use super::*;

    fn run(id: ExecutionId, first: u64, deltas: &[&str]) -> Vec<EventRecord> {
        deltas
            .iter()
            .enumerate()
            .map(|(i, text)| {
                EventRecord::new(RuntimeEvent::new(
                    id,
                    Sequence(first + i as u64),
                    Timestamp::now(),
                    EventBody::OutputDelta {
                        output_index: 0,
                        delta: (*text).to_owned(),
                    },
                ))
            })
            .collect()
    }

    fn run_headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(FORMAT_HEADER, FORMAT_RUN);
        headers
    }

    fn decoded(body: &str) -> Option<Vec<EventRecord>> {
        decode_message(
            Some(&run_headers()),
            Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    #[test]
    fn a_written_run_decodes_in_one_pass_to_its_events_and_their_exact_bytes() {
        let written = run(ExecutionId::new_random(), 3, &["a", "b,]", "\"c\" [x]"]);
        let body = encode_run(&written);
        assert!(
            decode_packed(&body).is_some(),
            "the writer's shape is read in one pass"
        );
        let read = decode_message(Some(&run_headers()), body).unwrap();
        assert_eq!(read.len(), 3);
        for (read, written) in read.iter().zip(&written) {
            assert_eq!(read.event, written.event);
            assert_eq!(read.json, written.json);
        }
    }

    #[test]
    fn a_run_of_another_shape_decodes_like_the_writers() {
        let written = run(ExecutionId::new_random(), 1, &["a", "b"]);
        let [a, b] = [&written[0].json, &written[1].json].map(|j| std::str::from_utf8(j).unwrap());
        let spaced = format!("[ {a} ,\n{b} ]");
        assert!(decode_packed(&Bytes::from(spaced.clone())).is_none());
        let read = decoded(&spaced).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[1].event, written[1].event);
        assert_eq!(read[1].json, written[1].json);
    }

    #[test]
    fn a_broken_or_discontiguous_run_is_not_read() {
        let id = ExecutionId::new_random();
        let written = run(id, 1, &["a", "b"]);
        let [a, b] = [&written[0].json, &written[1].json].map(|j| std::str::from_utf8(j).unwrap());
        assert!(decoded(&format!("[{b},{a}]")).is_none(), "out of order");
        assert!(decoded(&format!("[{a},{a}]")).is_none(), "repeated");
        assert!(decoded(&format!("[{a},{b}")).is_none(), "cut short");
        assert!(decoded(&format!("[{a},{b}]x")).is_none(), "trailing bytes");
        assert!(
            decoded(&format!("[{a},{{\"type\":1}}]")).is_none(),
            "not an event"
        );
        assert!(decoded("[]").is_none(), "empty");
    }

    #[test]
    fn text_beyond_ascii_is_read_and_bytes_that_are_not_utf8_are_refused() {
        let id = ExecutionId::new_random();
        let written = run(id, 1, &["é", "😀 \u{1}"]);
        let read = decode_message(Some(&run_headers()), encode_run(&written)).unwrap();
        assert_eq!(read[1].event, written[1].event);
        let single = decode_message(None, written[0].json.clone()).unwrap();
        assert_eq!(single[0].event, written[0].event);
        // The same messages with one byte of the text replaced by one that is never UTF-8.
        let broken = |bytes: &Bytes| {
            let mut bytes = bytes.to_vec();
            let at = bytes.iter().position(|&b| b >= 0x80).unwrap();
            bytes[at] = 0xff;
            Bytes::from(bytes)
        };
        assert!(decode_message(Some(&run_headers()), broken(&encode_run(&written))).is_none());
        assert!(decode_message(None, broken(&written[0].json)).is_none());
    }
}
