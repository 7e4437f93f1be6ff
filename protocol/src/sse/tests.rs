//! Unit and property tests of the SSE encoder and parser (random chunk splits, limits, WHATWG cases).

use super::*;
use proptest::prelude::*;
use proptest::sample::Index;

#[derive(Debug, PartialEq)]
struct Outcome {
    events: Vec<SseEvent>,
    error: Option<SseError>,
    retry: Option<u64>,
    last_id: Option<String>,
    end: StreamEnd,
}

fn run_with<'a>(chunks: impl IntoIterator<Item = &'a [u8]>, limit: usize) -> Outcome {
    let mut parser = SseParser::with_max_frame_bytes(limit);
    let mut events = Vec::new();
    let mut error = None;
    for chunk in chunks {
        if let Err(e) = parser.push(chunk, &mut events) {
            error.get_or_insert(e);
        }
    }
    Outcome {
        events,
        error,
        retry: parser.retry(),
        last_id: parser.last_event_id().map(str::to_owned),
        end: parser.finish(),
    }
}

fn run(chunks: &[&[u8]]) -> Outcome {
    run_with(chunks.iter().copied(), DEFAULT_MAX_FRAME_BYTES)
}

fn parse(bytes: &[u8]) -> Vec<SseEvent> {
    let outcome = run(&[bytes]);
    assert_eq!(outcome.error, None);
    outcome.events
}

fn bytewise(bytes: &[u8]) -> Outcome {
    run_with(bytes.chunks(1), DEFAULT_MAX_FRAME_BYTES)
}

fn ev(event: &str, data: &str, id: Option<&str>) -> SseEvent {
    SseEvent {
        event: event.to_owned(),
        data: data.to_owned(),
        id: id.map(str::to_owned),
    }
}

fn msg(data: &str) -> SseEvent {
    ev("message", data, None)
}

// ---- parser rules -------------------------------------------------------------------

#[test]
fn bom_is_stripped_once_at_stream_start() {
    assert_eq!(parse(b"\xEF\xBB\xBFdata: a\n\n"), vec![msg("a")]);
    // A second BOM is part of the first field name, which is then unknown.
    assert_eq!(parse(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n"), vec![]);
    // Not stripped mid-stream.
    assert_eq!(parse(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"), vec![msg("a")]);
    // Split across chunks.
    let outcome = run(&[b"\xEF", b"", b"\xBB", b"\xBFdata: a\n", b"\n"]);
    assert_eq!(outcome.events, vec![msg("a")]);
    assert_eq!(bytewise(b"\xEF\xBB\xBFdata: a\n\n").events, vec![msg("a")]);
}

#[test]
fn partial_bom_is_content_not_dropped() {
    // If the held-back 0xEF were dropped, "data: a" would dispatch.
    assert_eq!(parse(b"\xEFdata: a\n\n"), vec![]);
    assert_eq!(run(&[b"\xEF\xBB", b"data: a\n\n"]).events, vec![]);
    assert_eq!(
        run(&[b"\xEF", b"\n", b"data: a\n\n"]).events,
        vec![msg("a")]
    );
    // A stream that is only a partial BOM ends with a discarded partial line.
    assert_eq!(run(&[b"\xEF\xBB"]).end, StreamEnd::DiscardedIncompleteFrame);
    assert_eq!(run(&[b""]).end, StreamEnd::Clean);
}

#[test]
fn lf_cr_and_crlf_line_endings() {
    let expected = vec![msg("a\nb\nc")];
    assert_eq!(parse(b"data: a\rdata: b\r\ndata: c\n\r"), expected);
    assert_eq!(parse(b"data: a\ndata: b\ndata: c\n\n"), expected);
    assert_eq!(parse(b"data: a\r\ndata: b\r\ndata: c\r\n\r\n"), expected);
    assert_eq!(parse(b"data: a\rdata: b\rdata: c\r\r"), expected);
    // CR at a chunk end, LF at the next chunk start: one line ending, not two.
    let outcome = run(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
    assert_eq!(outcome.events, vec![msg("a\nb")]);
    assert_eq!(outcome.end, StreamEnd::Clean);
    // An empty chunk between CR and LF changes nothing.
    let outcome = run(&[b"data: a\r", b"", b"\n", b"\r", b"", b"\n"]);
    assert_eq!(outcome.events, vec![msg("a")]);
    // LF then CR are two line endings (dispatch), CR then CR too.
    assert_eq!(parse(b"data: a\n\rdata: b\r\r"), vec![msg("a"), msg("b")]);
    assert_eq!(
        bytewise(b"data: a\r\n\r\ndata: b\r\r").events,
        vec![msg("a"), msg("b")]
    );
}

#[test]
fn comments_are_ignored() {
    assert_eq!(parse(b": hello\ndata: x\n:\n: more\n\n"), vec![msg("x")]);
    assert_eq!(parse(b": only a comment\n\n"), vec![]);
    assert_eq!(run(&[b": keep-alive\n\n"]).end, StreamEnd::Clean);
}

#[test]
fn exactly_one_space_after_the_colon_is_removed() {
    assert_eq!(parse(b"data:x\n\n"), vec![msg("x")]);
    assert_eq!(parse(b"data: x\n\n"), vec![msg("x")]);
    assert_eq!(parse(b"data:  x\n\n"), vec![msg(" x")]);
    assert_eq!(parse(b"data:\tx\n\n"), vec![msg("\tx")]);
    assert_eq!(parse(b"data: a: b\n\n"), vec![msg("a: b")]);
    assert_eq!(parse(b"event:  x\ndata\n\n"), vec![ev(" x", "", None)]);
}

#[test]
fn line_without_colon_is_a_field_with_empty_value() {
    assert_eq!(parse(b"data\n\n"), vec![msg("")]);
    assert_eq!(parse(b"data\ndata\n\n"), vec![msg("\n")]);
    assert_eq!(parse(b"data:\n\n"), vec![msg("")]);
    assert_eq!(parse(b"data \n\n"), vec![]); // field name "data " is unknown
}

#[test]
fn multi_line_data_is_joined_with_lf() {
    assert_eq!(parse(b"data: a\ndata: b\ndata:\n\n"), vec![msg("a\nb\n")]);
    assert_eq!(
        parse(b"data: {\"x\":\ndata: 1}\n\n"),
        vec![msg("{\"x\":\n1}")]
    );
}

#[test]
fn event_type_is_set_and_reset_by_blank_lines() {
    assert_eq!(
        parse(b"event: add\ndata: 1\n\ndata: 2\n\n"),
        vec![ev("add", "1", None), msg("2")]
    );
    // Reset even when the frame dispatches nothing.
    assert_eq!(parse(b"event: x\n\ndata: 1\n\n"), vec![msg("1")]);
    // The last event line wins; an empty one means "message".
    assert_eq!(
        parse(b"event: a\nevent: b\ndata: 1\n\nevent:\ndata: 2\n\n"),
        vec![ev("b", "1", None), msg("2")]
    );
}

#[test]
fn id_containing_nul_is_ignored() {
    assert_eq!(
        parse(b"id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\n"),
        vec![ev("message", "a", Some("1")), ev("message", "b", Some("1"))]
    );
}

#[test]
fn id_persists_across_events_and_can_be_reset() {
    let outcome = run(&[b"id: 7\ndata: a\n\ndata: b\n\nid: x:y\ndata: c\n\nid\ndata: d\n\n"]);
    assert_eq!(
        outcome.events,
        vec![
            ev("message", "a", Some("7")),
            ev("message", "b", Some("7")),
            ev("message", "c", Some("x:y")),
            ev("message", "d", None),
        ]
    );
    assert_eq!(outcome.last_id, None);
}

#[test]
fn last_event_id_is_committed_at_blank_lines() {
    // A blank line commits the buffer even when no event is dispatched.
    assert_eq!(run(&[b"id: 9\n\n"]).last_id.as_deref(), Some("9"));
    // Without a blank line the buffer is not committed, and the frame is incomplete.
    let outcome = run(&[b"id: 9\n\nid: 10\n"]);
    assert_eq!(outcome.last_id.as_deref(), Some("9"));
    assert_eq!(outcome.end, StreamEnd::DiscardedIncompleteFrame);
}

#[test]
fn empty_data_buffer_dispatches_nothing() {
    assert_eq!(parse(b"\n\n\r\n\r"), vec![]);
    assert_eq!(parse(b"event: x\nid: 1\nretry: 5\nfoo: bar\n\n"), vec![]);
}

#[test]
fn unknown_fields_are_ignored() {
    assert_eq!(
        parse(b"foo: bar\nDATA: no\ndata: x\nfoo\n\n"),
        vec![msg("x")]
    );
}

#[test]
fn retry_requires_ascii_digits() {
    assert_eq!(run(&[b"retry: 1500\n"]).retry, Some(1500));
    assert_eq!(run(&[b"retry:0\n\n"]).retry, Some(0));
    for bad in [
        &b"retry: 15a\n"[..],
        b"retry:\n",
        b"retry\n",
        b"retry:  5\n",
        b"retry: -5\n",
        b"retry: +5\n",
        b"retry: 1.5\n",
        b"retry: \xD9\xA1\n", // ARABIC-INDIC DIGIT ONE
    ] {
        assert_eq!(run(&[bad]).retry, None, "{bad:?}");
    }
    // Later valid values replace earlier ones; invalid ones leave them.
    assert_eq!(run(&[b"retry: 1\nretry: 2\nretry: x\n"]).retry, Some(2));
    assert_eq!(
        run(&[b"retry: 99999999999999999999999\n"]).retry,
        Some(u64::MAX)
    );
}

#[test]
fn unterminated_final_frame_is_discarded() {
    let outcome = run(&[b"data: a\n\ndata: b\n"]);
    assert_eq!(outcome.events, vec![msg("a")]);
    assert_eq!(outcome.end, StreamEnd::DiscardedIncompleteFrame);
    let outcome = run(&[b"data: a\n\ndata: b"]);
    assert_eq!(outcome.events, vec![msg("a")]);
    assert_eq!(outcome.end, StreamEnd::DiscardedIncompleteFrame);
    let outcome = run(&[b"data: a\n\n"]);
    assert_eq!(outcome.end, StreamEnd::Clean);
    assert!(outcome.end.is_clean());
    assert_eq!(run(&[b"data: a\n\n: bye\n"]).end, StreamEnd::Clean);
    assert_eq!(
        run(&[b"data: a\n\n: bye"]).end,
        StreamEnd::DiscardedIncompleteFrame
    );
    assert_eq!(
        run(&[b"data: a\r"]).end,
        StreamEnd::DiscardedIncompleteFrame
    );
}

#[test]
fn invalid_utf8_is_decoded_lossily_per_line() {
    assert_eq!(
        parse(b"data: \xFF\xFEa\n\n"),
        vec![msg("\u{FFFD}\u{FFFD}a")]
    );
    // A truncated sequence right before the line end.
    assert_eq!(
        parse(b"data: \xE2\x82\ndata: ok\n\n"),
        vec![msg("\u{FFFD}\nok")]
    );
    // A multi-byte character split across chunks is decoded whole.
    let euro = "data: €\n\n".as_bytes();
    assert_eq!(bytewise(euro).events, vec![msg("€")]);
}

#[test]
fn frame_limit_counts_pending_line_and_buffers() {
    let limit = 16;
    // A 16-byte line fits exactly.
    let outcome = run_with([&b"data: 0123456789\n\n"[..]], limit);
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.events, vec![msg("0123456789")]);
    // A 19-byte line does not.
    let outcome = run_with([&b"data: 0123456789abc\n\n"[..]], limit);
    assert_eq!(outcome.error, Some(SseError::FrameTooLarge { limit }));
    assert!(outcome.events.is_empty());
    assert_eq!(outcome.end, StreamEnd::DiscardedIncompleteFrame);
    // Accumulated data counts: 11 + 0, then 10 + 6, then 8 + 11 > 16.
    let stream = b"data: 01234\ndata: 0123\ndata: 01\n\n";
    let outcome = run_with([&stream[..]], limit);
    assert_eq!(outcome.error, Some(SseError::FrameTooLarge { limit }));
    // Buffers are per frame: the same lines split into frames are fine.
    let stream = b"data: 01234\ndata: 0123\n\ndata: 01\n\n";
    let outcome = run_with([&stream[..]], limit);
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.events, vec![msg("01234\n0123"), msg("01")]);
    // The event type counts too.
    let outcome = run_with([&b"data: 0123456\nevent: abcdefghij\n\n"[..]], limit);
    assert_eq!(outcome.error, Some(SseError::FrameTooLarge { limit }));
}

#[test]
fn frame_limit_keeps_earlier_events_and_poisons() {
    let limit = 16;
    let mut parser = SseParser::with_max_frame_bytes(limit);
    let mut out = Vec::new();
    let err = parser
        .push(b"data: ok\n\ndata: this line is far too long\n\n", &mut out)
        .unwrap_err();
    assert_eq!(err, SseError::FrameTooLarge { limit });
    assert_eq!(out, vec![msg("ok")]);
    // Poisoned: later input is refused, even if valid.
    assert_eq!(parser.push(b"data: x\n\n", &mut out), Err(err));
    assert_eq!(out.len(), 1);
    assert_eq!(parser.finish(), StreamEnd::DiscardedIncompleteFrame);
}

#[test]
fn frame_limit_bounds_the_pending_line_buffer() {
    let limit = 1000;
    let mut parser = SseParser::with_max_frame_bytes(limit);
    let mut out = Vec::new();
    let mut failed_at = None;
    for i in 0..5000 {
        if parser.push(b"x", &mut out).is_err() {
            failed_at = Some(i);
            break;
        }
        assert!(parser.line.capacity() <= limit);
    }
    assert_eq!(failed_at, Some(limit));
    // Same for data accumulated across many lines.
    let mut parser = SseParser::with_max_frame_bytes(limit);
    let mut result = Ok(());
    for _ in 0..5000 {
        result = parser.push(b"data: abc\n", &mut out);
        if result.is_err() {
            break;
        }
        assert!(parser.data.capacity() <= limit);
    }
    assert_eq!(result, Err(SseError::FrameTooLarge { limit }));
    // Zero allows only blank lines.
    let outcome = run_with([&b"\n\n"[..]], 0);
    assert_eq!(outcome.error, None);
    let outcome = run_with([&b"\n:\n"[..]], 0);
    assert_eq!(outcome.error, Some(SseError::FrameTooLarge { limit: 0 }));
}

#[test]
fn error_and_debug_output_do_not_echo_content() {
    let mut parser = SseParser::with_max_frame_bytes(8);
    let mut out = Vec::new();
    let err = parser.push(b"data: secret-token", &mut out).unwrap_err();
    assert_eq!(err.to_string(), "SSE frame exceeds the limit of 8 bytes");
    let mut parser = SseParser::new();
    parser.push(b"data: secret\ndata: sec", &mut out).unwrap();
    assert!(!format!("{parser:?}").contains("sec"));
}

// ---- encoder ------------------------------------------------------------------------

#[test]
fn encode_frame_layout() {
    assert_eq!(
        encode_frame(Some("1"), Some("delta"), "{\"a\":1}"),
        "id: 1\nevent: delta\ndata: {\"a\":1}\n\n"
    );
    assert_eq!(encode_frame(None, None, ""), "data: \n\n");
    assert_eq!(encode_frame(None, None, "a\n"), "data: a\ndata: \n\n");
    assert_eq!(
        encode_frame(None, None, "a\r\nb\rc\nd\r\r\n"),
        "data: a\ndata: b\ndata: c\ndata: d\ndata: \ndata: \n\n"
    );
    let mut out = String::from("x");
    encode_frame_into(&mut out, Some(""), None, "y");
    assert_eq!(out, "xid: \ndata: y\n\n");
}

#[test]
fn encode_frame_removes_breaks_from_id_and_event() {
    assert_eq!(
        encode_frame(Some("1\r\n2\u{0}3"), Some("a\rb\nc\0"), "d"),
        "id: 123\nevent: abc\ndata: d\n\n"
    );
}

#[test]
fn encoder_round_trip_normalises_cr_and_crlf() {
    let frame = encode_frame(Some("42"), Some("chunk"), "a\r\nb\rc\nd");
    assert!(!frame.contains('\r'));
    assert_eq!(
        parse(frame.as_bytes()),
        vec![ev("chunk", "a\nb\nc\nd", Some("42"))]
    );
    let frame = encode_frame(None, None, " leading space\n\n");
    assert_eq!(parse(frame.as_bytes()), vec![msg(" leading space\n\n")]);
}

#[test]
fn encode_comment_layout() {
    assert_eq!(encode_comment("keep-alive"), ": keep-alive\n\n");
    assert_eq!(encode_comment("a\r\nb\rc\n"), ": abc\n\n");
    assert_eq!(encode_comment(""), ": \n\n");
    let mut stream = encode_comment("x\ny");
    stream.push_str(&encode_frame(None, None, "z"));
    assert_eq!(parse(stream.as_bytes()), vec![msg("z")]);
}

#[test]
fn write_event_frame_fast_path_and_fallback() {
    let mut out = String::new();
    write_event_frame(&mut out, 7, "execution.delta", "{\"t\":\"hi\"}");
    assert_eq!(
        out,
        "id: 7\nevent: execution.delta\ndata: {\"t\":\"hi\"}\n\n"
    );
    write_event_frame(&mut out, u64::MAX, "e", "a\r\nb");
    assert_eq!(
        out,
        format!(
            "id: 7\nevent: execution.delta\ndata: {{\"t\":\"hi\"}}\n\nid: {}\nevent: e\ndata: a\ndata: b\n\n",
            u64::MAX
        )
    );
    let mut out = String::new();
    write_event_frame(&mut out, 1, "a\nb", "{}");
    assert_eq!(out, encode_frame(Some("1"), Some("ab"), "{}"));
}

// ---- property tests -----------------------------------------------------------------

/// An independent, whole-stream reference implementation of the specification: decode,
/// strip one BOM, split into lines, interpret.
fn reference(bytes: &[u8]) -> (Vec<SseEvent>, Option<u64>, Option<String>) {
    let decoded = String::from_utf8_lossy(bytes);
    let text = decoded.strip_prefix('\u{FEFF}').unwrap_or(&decoded);
    let mut lines = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                lines.push(std::mem::take(&mut current));
            }
            '\n' => lines.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    let (mut data, mut event, mut id_buffer, mut last_id) =
        (String::new(), String::new(), String::new(), String::new());
    let mut retry = None;
    let mut events = Vec::new();
    for line in lines {
        if line.is_empty() {
            last_id = id_buffer.clone();
            if data.is_empty() {
                event.clear();
                continue;
            }
            if data.ends_with('\n') {
                data.pop();
            }
            events.push(SseEvent {
                event: if event.is_empty() {
                    "message".into()
                } else {
                    event.clone()
                },
                data: std::mem::take(&mut data),
                id: (!last_id.is_empty()).then(|| last_id.clone()),
            });
            event.clear();
        } else if line.starts_with(':') {
        } else {
            let (name, value) = match line.find(':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(' ').unwrap_or(v))
                }
                None => (line.as_str(), ""),
            };
            match name {
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                "event" => event = value.to_owned(),
                "id" if !value.contains('\0') => id_buffer = value.to_owned(),
                "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                    retry = Some(value.parse().unwrap_or(u64::MAX));
                }
                _ => {}
            }
        }
    }
    (events, retry, (!last_id.is_empty()).then_some(last_id))
}

fn split<'a>(bytes: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut chunks = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for p in points {
        chunks.push(&bytes[start..p]);
        start = p;
    }
    chunks.push(&bytes[start..]);
    chunks
}

fn text_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => any::<char>(),
        6 => proptest::char::range('a', 'e'),
        2 => Just('\r'),
        2 => Just('\n'),
        1 => Just('\0'),
        1 => Just(':'),
        1 => Just(' '),
        1 => Just('é'),
        1 => Just('€'),
        1 => Just('😀'),
        1 => Just('\u{FEFF}'),
    ]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(text_char(), 0..max).prop_map(|v| v.into_iter().collect())
}

fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"data:".to_vec()),
        Just(b"data: ".to_vec()),
        Just(b"data".to_vec()),
        Just(b"event: ".to_vec()),
        Just(b"id:".to_vec()),
        Just(b"retry: ".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b":".to_vec()),
        Just(b" ".to_vec()),
        Just(BOM.to_vec()),
        Just(vec![0xEF, 0xBB]),
        Just("é€😀".as_bytes().to_vec()),
        Just(vec![0]),
        Just(b"123".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..4),
    ]
}

fn stream() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(token(), 0..64).prop_map(|t| t.concat()),
        proptest::collection::vec(any::<u8>(), 0..256),
    ]
}

type Frame = (Option<String>, Option<String>, String);

fn strip(s: &str, banned: &[char]) -> String {
    s.chars().filter(|c| !banned.contains(c)).collect()
}

fn normalise(data: &str) -> String {
    data.replace("\r\n", "\n").replace('\r', "\n")
}

fn expected_events(frames: &[Frame]) -> Vec<SseEvent> {
    let mut id = String::new();
    frames
        .iter()
        .map(|(i, e, d)| {
            if let Some(i) = i {
                id = strip(i, &['\r', '\n', '\0']);
            }
            let event = e
                .as_deref()
                .map(|e| strip(e, &['\r', '\n', '\0']))
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "message".into());
            SseEvent {
                event,
                data: normalise(d),
                id: (!id.is_empty()).then(|| id.clone()),
            }
        })
        .collect()
}

/// Rewrites the encoder's LF line endings as LF, CR or CRLF (chosen by `styles`), never
/// letting a bare CR be followed by an LF ending (which would merge two endings into one).
fn restyle(encoded: &str, styles: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded.len() * 2);
    let mut k = 0;
    let mut prev_bare_cr = false;
    for &b in encoded.as_bytes() {
        if b == b'\n' {
            let mut style = styles.get(k % styles.len().max(1)).copied().unwrap_or(0) % 3;
            k += 1;
            let line_empty = out.last().is_none_or(|&l| l == b'\r' || l == b'\n');
            if style == 0 && prev_bare_cr && line_empty {
                style = 2;
            }
            match style {
                0 => out.push(b'\n'),
                1 => out.push(b'\r'),
                _ => out.extend_from_slice(b"\r\n"),
            }
            prev_bare_cr = style == 1;
        } else {
            out.push(b);
            prev_bare_cr = false;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (a) Encoded event lists, with any line-ending style, optional BOM and any chunking,
    /// parse back to the original events (data line breaks normalised to LF).
    #[test]
    fn encoded_events_survive_any_chunking(
        frames in proptest::collection::vec(
            (proptest::option::of(text(8)), proptest::option::of(text(8)), text(24)),
            0..8,
        ),
        bom in any::<bool>(),
        styles in proptest::collection::vec(any::<u8>(), 0..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        let mut encoded = String::new();
        for (i, e, d) in &frames {
            encode_frame_into(&mut encoded, i.as_deref(), e.as_deref(), d);
        }
        let mut bytes = if bom { BOM.to_vec() } else { Vec::new() };
        bytes.extend(restyle(&encoded, &styles));
        let expected = expected_events(&frames);

        let whole = run(&[&bytes]);
        prop_assert_eq!(&whole.events, &expected);
        prop_assert_eq!(whole.error, None);
        prop_assert_eq!(whole.end, StreamEnd::Clean);
        let chunked = run(&split(&bytes, &cuts));
        prop_assert_eq!(&chunked, &whole);
        prop_assert_eq!(&bytewise(&bytes), &whole);
    }

    /// (b) Arbitrary bytes never panic, match the whole-stream reference implementation and
    /// give the same outcome however they are chunked.
    #[test]
    fn arbitrary_bytes_are_chunking_independent(
        bytes in stream(),
        cuts in proptest::collection::vec(any::<Index>(), 0..16),
    ) {
        let whole = run(&[&bytes]);
        let (events, retry, last_id) = reference(&bytes);
        prop_assert_eq!(&whole.events, &events);
        prop_assert_eq!(whole.retry, retry);
        prop_assert_eq!(&whole.last_id, &last_id);
        prop_assert_eq!(&run(&split(&bytes, &cuts)), &whole);
        prop_assert_eq!(&bytewise(&bytes), &whole);
    }

    /// (b') With a small limit, errors and the events before them do not depend on chunking.
    #[test]
    fn frame_limit_is_chunking_independent(
        bytes in stream(),
        limit in 0usize..48,
        cuts in proptest::collection::vec(any::<Index>(), 0..16),
    ) {
        let whole = run_with([&bytes[..]], limit);
        prop_assert_eq!(&run_with(split(&bytes, &cuts), limit), &whole);
        prop_assert_eq!(&run_with(bytes.chunks(1), limit), &whole);
        if whole.error.is_none() {
            prop_assert_eq!(&whole.events, &reference(&bytes).0);
        }
    }

    /// (c) Any strings round-trip through the encoder, data line breaks normalised to LF.
    #[test]
    fn encode_then_parse_round_trips(
        id in proptest::option::of(text(16)),
        event in proptest::option::of(text(16)),
        data in text(64),
        any_data in any::<String>(),
    ) {
        for data in [&data, &any_data] {
            let frame = encode_frame(id.as_deref(), event.as_deref(), data);
            prop_assert_eq!(
                parse(frame.as_bytes()),
                expected_events(&[(id.clone(), event.clone(), data.clone())])
            );
        }
    }

    /// (c') The gateway fast path round-trips too and agrees with the general encoder.
    #[test]
    fn write_event_frame_round_trips(seq in any::<u64>(), event_type in text(12), json in text(48)) {
        let mut out = String::new();
        write_event_frame(&mut out, seq, &event_type, &json);
        prop_assert_eq!(&out, &encode_frame(Some(&seq.to_string()), Some(&event_type), &json));
        let events = parse(out.as_bytes());
        prop_assert_eq!(events.len(), 1);
        prop_assert_eq!(events[0].id.clone(), Some(seq.to_string()));
        prop_assert_eq!(&events[0].data, &normalise(&json));
    }
}
