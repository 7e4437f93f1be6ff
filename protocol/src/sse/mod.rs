//! Server-Sent Events: frame encoding and an incremental parser that follows the WHATWG HTML
//! "event stream interpretation" rules.
//!
//! The gateway uses the encoder ([`write_event_frame`], [`encode_frame`], [`encode_comment`]) to
//! stream runtime events; the worker uses [`SseParser`] to read provider streams (OpenAI,
//! Anthropic, ...) and the client uses it to read the gateway's own streams.
//!
//! # Key decision: split lines on bytes, decode UTF-8 per line
//!
//! The specification decodes the whole stream as UTF-8 and then splits it into lines. Network
//! chunks, however, can end in the middle of a multi-byte character. This parser therefore splits
//! the *bytes* into lines first and decodes each complete line (lossily, invalid sequences become
//! U+FFFD) only once it is terminated. That is equivalent to decoding first: CR (0x0D) and LF
//! (0x0A) are ASCII and never occur inside a multi-byte UTF-8 sequence, and an ASCII byte always
//! ends an invalid sequence, so a line boundary is never inside a character and per-line lossy
//! decoding yields exactly the replacement characters whole-stream decoding would. As a result,
//! any chunking of the same byte stream yields identical events, and no partial character ever
//! has to be carried between chunks. The only other cross-chunk state is a CR that ended a chunk
//! (an LF at the start of the next chunk completes that CRLF and is skipped) and a byte order
//! mark split across the first chunks.
//!
//! Each push scans only the newly appended bytes for line terminators, and complete lines that
//! lie entirely within one chunk are processed in place without copying, so parsing is linear in
//! the stream length whatever the chunk sizes.
//!
//! # Bounded memory
//!
//! A frame is the set of lines between two blank lines. When the bytes of the pending
//! (unterminated) line plus the data and event type buffers of the current frame would exceed
//! the parser's limit ([`DEFAULT_MAX_FRAME_BYTES`] unless set with
//! [`SseParser::with_max_frame_bytes`]), [`SseParser::push`] fails with
//! [`SseError::FrameTooLarge`] before buffering those bytes. The check depends only on the stream
//! content, never on how it was chunked. After an error the parser is poisoned: every later push
//! returns the same error and appends nothing.
//!
//! # Encoding
//!
//! Frames are written with LF line endings and a `field: value` form (one space after the
//! colon, which the parser strips again, so values that start with a space round-trip). Data
//! containing LF, CR or CRLF is split into several `data:` lines; the parser rejoins them with
//! LF, so CR and CRLF inside data arrive as LF. `id`, `event` and comment text cannot carry line
//! breaks at all: the encoder *removes* CR and LF from them (and NUL from `id`, which would make
//! a conforming parser ignore the whole field) rather than failing, so encoding is infallible.

use std::fmt;

/// Default limit for one frame's buffered bytes: 1 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 1024 * 1024;

/// The UTF-8 byte order mark, stripped once at the start of a stream.
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Appends `id: <sequence>\nevent: <event_type>\ndata: <json>\n\n` to `out`.
///
/// This is the gateway's fast path for compact JSON (which never contains CR or LF). If `json`
/// contains a line break, or `event_type` a character the encoder must remove, it falls back to
/// [`encode_frame_into`], so the output is always a well-formed frame.
pub fn write_event_frame(out: &mut String, sequence: u64, event_type: &str, json: &str) {
    // Byte searches: the gateway runs this for every event it streams, and `str::contains`
    // with a set of chars decodes the text char by char.
    let clean_type = memchr::memchr3(b'\r', b'\n', b'\0', event_type.as_bytes()).is_none();
    if clean_type && memchr::memchr2(b'\r', b'\n', json.as_bytes()).is_none() {
        // "id: " + up to 20 digits + "\nevent: " + type + "\ndata: " + json + "\n\n"
        out.reserve(4 + 20 + 8 + event_type.len() + 7 + json.len() + 2);
        out.push_str("id: ");
        out.push_str(itoa::Buffer::new().format(sequence));
        out.push_str("\nevent: ");
        out.push_str(event_type);
        out.push_str("\ndata: ");
        out.push_str(json);
        out.push_str("\n\n");
    } else {
        let id = sequence.to_string();
        encode_frame_into(out, Some(&id), Some(event_type), json);
    }
}

/// Encodes one frame: optional `id:` and `event:` lines, one `data:` line per line of `data`
/// (split at LF, CR and CRLF), and the terminating blank line.
///
/// CR, LF and NUL are removed from `id`, and CR, LF and NUL from `event` (see the module
/// documentation). `Some("")` as `id` is written as `id: `, which resets the receiver's last
/// event ID.
pub fn encode_frame(id: Option<&str>, event: Option<&str>, data: &str) -> String {
    let mut out = String::new();
    encode_frame_into(&mut out, id, event, data);
    out
}

/// Like [`encode_frame`], but appends to `out`.
pub fn encode_frame_into(out: &mut String, id: Option<&str>, event: Option<&str>, data: &str) {
    let fields = id.map_or(0, |v| 5 + v.len()) + event.map_or(0, |v| 8 + v.len());
    out.reserve(fields + 7 + data.len() + 1);
    if let Some(id) = id {
        out.push_str("id: ");
        push_without(out, id, &['\r', '\n', '\0']);
        out.push('\n');
    }
    if let Some(event) = event {
        out.push_str("event: ");
        push_without(out, event, &['\r', '\n', '\0']);
        out.push('\n');
    }
    let mut rest = data;
    loop {
        out.push_str("data: ");
        match rest.find(['\r', '\n']) {
            None => {
                out.push_str(rest);
                out.push('\n');
                break;
            }
            Some(i) => {
                let (line, tail) = rest.split_at(i);
                out.push_str(line);
                out.push('\n');
                rest = tail
                    .strip_prefix("\r\n")
                    .or_else(|| tail.strip_prefix('\r'))
                    .or_else(|| tail.strip_prefix('\n'))
                    .unwrap_or(tail);
            }
        }
    }
    out.push('\n');
}

/// Encodes a comment frame, `: <text>\n\n`, with CR and LF removed from `text`. Receivers ignore
/// comments; the gateway uses them as keep-alives.
pub fn encode_comment(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    out.push_str(": ");
    push_without(&mut out, text, &['\r', '\n']);
    out.push_str("\n\n");
    out
}

fn push_without(out: &mut String, value: &str, banned: &[char]) {
    if value.contains(banned) {
        out.extend(value.chars().filter(|c| !banned.contains(c)));
    } else {
        out.push_str(value);
    }
}

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event type: the last `event:` value of the frame, or `"message"` if there was none or
    /// it was empty.
    pub event: String,
    /// The `data:` values of the frame joined with LF (the final LF removed).
    pub data: String,
    /// The last event ID buffer at dispatch. It persists across frames until another `id:` line
    /// changes it; the specification's empty string (never set, or reset by an empty `id:`) is
    /// represented as `None`.
    pub id: Option<String>,
}

/// Why [`SseParser::push`] failed. Messages never contain stream content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// The current frame's buffered bytes would exceed the parser's limit.
    #[error("SSE frame exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// The configured limit in bytes.
        limit: usize,
    },
}

/// How a stream ended, as reported by [`SseParser::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum StreamEnd {
    /// The stream ended on a frame boundary (comments and blank lines aside): nothing was lost.
    Clean,
    /// The stream ended inside a frame (an unterminated line, or field lines not followed by a
    /// blank line), or after a [`SseError`]; that frame was discarded, as the specification
    /// requires, and never dispatched.
    DiscardedIncompleteFrame,
}

impl StreamEnd {
    /// Whether nothing was discarded.
    pub fn is_clean(self) -> bool {
        self == StreamEnd::Clean
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At stream start; `matched` leading bytes equal the BOM's first bytes.
    Bom { matched: usize },
    /// Past the optional BOM.
    Body,
}

/// Incremental, chunking-independent SSE parser (see the module documentation).
pub struct SseParser {
    max_frame_bytes: usize,
    start: Start,
    /// The previous chunk ended with CR: an LF at the start of the next chunk belongs to it.
    after_cr: bool,
    /// Bytes of the pending, not yet terminated line.
    line: Vec<u8>,
    data: String,
    event_type: String,
    /// The specification's last event ID buffer.
    id_buffer: String,
    /// The specification's "last event ID string", committed from the buffer at each blank line.
    last_event_id: String,
    retry: Option<u64>,
    /// A field line was seen since the last blank line.
    frame_open: bool,
    error: Option<SseError>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SseParser {
    // Sizes only: buffers hold stream content, which must not leak into logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseParser")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("pending_line_bytes", &self.line.len())
            .field("data_bytes", &self.data.len())
            .field("retry", &self.retry)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl SseParser {
    /// A parser with the [`DEFAULT_MAX_FRAME_BYTES`] limit.
    pub fn new() -> Self {
        Self::with_max_frame_bytes(DEFAULT_MAX_FRAME_BYTES)
    }

    /// A parser whose frames may buffer at most `max_frame_bytes` bytes (pending line plus the
    /// frame's data and event type). With `0`, any non-blank line fails.
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        Self {
            max_frame_bytes,
            start: Start::Bom { matched: 0 },
            after_cr: false,
            line: Vec::new(),
            data: String::new(),
            event_type: String::new(),
            id_buffer: String::new(),
            last_event_id: String::new(),
            retry: None,
            frame_open: false,
            error: None,
        }
    }

    /// The configured frame limit in bytes.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// The last valid `retry:` value (reconnection time in milliseconds) seen so far. Values too
    /// large for `u64` saturate to `u64::MAX`.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// The specification's "last event ID string" to send as `Last-Event-ID` when reconnecting:
    /// the last event ID buffer as of the last blank line (whether or not it dispatched an
    /// event), `None` if empty.
    pub fn last_event_id(&self) -> Option<&str> {
        (!self.last_event_id.is_empty()).then_some(self.last_event_id.as_str())
    }

    /// Feeds the next chunk of the stream, appending every event it completes to `out`.
    ///
    /// On error, events completed before the offending line have already been appended; the
    /// parser is then poisoned and every later call returns the same error.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let result = self.feed(chunk, out);
        if let Err(error) = result {
            self.error = Some(error);
            self.line = Vec::new();
            self.data = String::new();
            self.event_type = String::new();
        }
        result
    }

    /// Ends the stream. An incomplete final frame is discarded, never dispatched; the result says
    /// whether that happened.
    pub fn finish(self) -> StreamEnd {
        let partial_bom = matches!(self.start, Start::Bom { matched } if matched > 0);
        if self.error.is_some() || partial_bom || !self.line.is_empty() || self.frame_open {
            StreamEnd::DiscardedIncompleteFrame
        } else {
            StreamEnd::Clean
        }
    }

    fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut bytes = chunk;
        if let Start::Bom { mut matched } = self.start {
            while let Some(&expected) = BOM.get(matched) {
                match bytes.split_first() {
                    None => {
                        self.start = Start::Bom { matched };
                        return Ok(());
                    }
                    Some((&b, tail)) if b == expected => {
                        matched += 1;
                        bytes = tail;
                    }
                    Some(_) => {
                        // Not a BOM after all: the bytes held back are ordinary content.
                        self.start = Start::Body;
                        self.feed_body(BOM.get(..matched).unwrap_or_default(), out)?;
                        return self.feed_body(bytes, out);
                    }
                }
            }
            self.start = Start::Body;
        }
        self.feed_body(bytes, out)
    }

    fn feed_body(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.after_cr {
            match bytes.split_first() {
                None => return Ok(()),
                Some((&first, tail)) => {
                    self.after_cr = false;
                    if first == b'\n' {
                        bytes = tail;
                    }
                }
            }
        }
        while let Some(pos) = bytes.iter().position(|&b| b == b'\r' || b == b'\n') {
            let (content, rest) = bytes.split_at(pos);
            let rest = match rest.split_first() {
                Some((&b'\r', tail)) => match tail.split_first() {
                    Some((&b'\n', after_lf)) => after_lf,
                    Some(_) => tail,
                    None => {
                        self.after_cr = true;
                        tail
                    }
                },
                Some((_, tail)) => tail,
                None => rest,
            };
            if self.line.is_empty() {
                self.check(content.len())?;
                self.process_line(content, out)?;
            } else {
                self.check(self.line.len() + content.len())?;
                self.append_line(content);
                let line = std::mem::take(&mut self.line);
                let result = self.process_line(&line, out);
                self.line = line;
                self.line.clear();
                result?;
            }
            bytes = rest;
        }
        if !bytes.is_empty() {
            self.check(self.line.len() + bytes.len())?;
            self.append_line(bytes);
        }
        Ok(())
    }

    /// Fails if `line_bytes` plus the frame's buffers exceed the limit.
    fn check(&self, line_bytes: usize) -> Result<(), SseError> {
        let total = line_bytes
            .saturating_add(self.data.len())
            .saturating_add(self.event_type.len());
        if total > self.max_frame_bytes {
            Err(SseError::FrameTooLarge {
                limit: self.max_frame_bytes,
            })
        } else {
            Ok(())
        }
    }

    /// Appends to the pending line without letting its capacity overshoot the limit (a plain
    /// `extend` could double it). Only called after [`Self::check`] succeeded.
    fn append_line(&mut self, bytes: &[u8]) {
        let needed = self.line.len() + bytes.len();
        if needed > self.line.capacity() {
            let target = needed
                .max(self.line.capacity().saturating_mul(2))
                .min(self.max_frame_bytes)
                .max(needed);
            self.line.reserve_exact(target - self.line.len());
        }
        self.line.extend_from_slice(bytes);
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let Some(&first) = line.first() else {
            self.dispatch(out);
            return Ok(());
        };
        if first == b':' {
            return Ok(());
        }
        self.frame_open = true;
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let (name, rest) = line.split_at(i);
                let value = rest.get(1..).unwrap_or_default();
                (name, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        // Field names are compared as bytes: the known names are ASCII, and U+FFFD from invalid
        // bytes could never match them anyway.
        match name {
            b"data" => {
                let value = String::from_utf8_lossy(value);
                self.check(value.len() + 1)?;
                reserve_capped(&mut self.data, value.len() + 1, self.max_frame_bytes);
                self.data.push_str(&value);
                self.data.push('\n');
            }
            b"event" => {
                let value = String::from_utf8_lossy(value);
                let total = self.data.len().saturating_add(value.len());
                if total > self.max_frame_bytes {
                    return Err(SseError::FrameTooLarge {
                        limit: self.max_frame_bytes,
                    });
                }
                self.event_type.clear();
                self.event_type.push_str(&value);
            }
            // An id containing NUL is ignored entirely.
            b"id" if !value.contains(&0) => {
                self.id_buffer.clear();
                self.id_buffer.push_str(&String::from_utf8_lossy(value));
            }
            // Only a non-empty run of ASCII digits; anything else is ignored.
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                let parsed = value.iter().try_fold(0u64, |acc, &d| {
                    acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                });
                self.retry = Some(parsed.unwrap_or(u64::MAX));
            }
            // Unknown fields, and ignored id/retry values.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.frame_open = false;
        if self.last_event_id != self.id_buffer {
            self.last_event_id.clone_from(&self.id_buffer);
        }
        if self.data.is_empty() {
            self.event_type.clear();
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event = if self.event_type.is_empty() {
            String::from("message")
        } else {
            std::mem::take(&mut self.event_type)
        };
        let id = (!self.id_buffer.is_empty()).then(|| self.id_buffer.clone());
        out.push(SseEvent { event, data, id });
    }
}

/// Reserves room for `additional` bytes without letting the capacity overshoot `limit` (unless
/// the content itself needs more).
fn reserve_capped(buf: &mut String, additional: usize, limit: usize) {
    let needed = buf.len() + additional;
    if needed > buf.capacity() {
        let target = needed
            .max(buf.capacity().saturating_mul(2))
            .min(limit)
            .max(needed);
        buf.reserve_exact(target - buf.len());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
