//! HTTP-level tests of the SSE projection over real loopback HTTP: frame format, replay and
//! resume cursors, live tailing, disconnects, backpressure and keep-alives (contract.md
//! section 4; `[R n]` items are reference-behaviours.md H).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A finished default mock execution.
async fn finished(gw: &Gateway) -> String {
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_terminal(&id).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_is_exact_sse_frames_with_contiguous_sequences_then_closes() {
    let gw = Gateway::start_default().await;
    let id = finished(&gw).await;
    let mut sse = gw.stream(&id).await;
    while sse.chunk().await.is_some() {}
    let raw = String::from_utf8(sse.raw.clone()).expect("utf-8 stream");
    // Every frame is exactly `id: N\nevent: TYPE\ndata: JSON\n\n` [R 49].
    assert!(raw.ends_with("\n\n"), "{raw:?}");
    let frames: Vec<&str> = raw.trim_end_matches('\n').split("\n\n").collect();
    assert_eq!(frames.len(), 7, "{raw:?}");
    for (i, frame) in frames.iter().enumerate() {
        let lines: Vec<&str> = frame.split('\n').collect();
        assert_eq!(lines.len(), 3, "frame {frame:?}");
        let seq = lines[0].strip_prefix("id: ").expect("id line");
        let kind = lines[1].strip_prefix("event: ").expect("event line");
        let data = lines[2].strip_prefix("data: ").expect("data line");
        let event: Value = serde_json::from_str(data).expect("data is JSON");
        assert_eq!(seq, (i + 1).to_string());
        assert_eq!(event["sequence"], i as u64 + 1);
        assert_eq!(kind, MOCK_TYPES[i]);
        assert_eq!(event["type"], kind);
        assert_eq!(event["execution_id"], id.as_str());
        assert!(is_iso_millis(event["time"].as_str().expect("time")));
    }
    let statuses: Vec<Value> = frames
        .iter()
        .map(|f| {
            let data = f
                .split('\n')
                .nth(2)
                .expect("data")
                .trim_start_matches("data: ");
            serde_json::from_str::<Value>(data).expect("json")["status"].clone()
        })
        .collect();
    assert_eq!(
        statuses,
        [
            "accepted",
            "routing",
            "running",
            "running",
            "running",
            "running",
            "succeeded"
        ]
    );
    assert_eq!(gw.metric("mrt_sse_events_sent_total").await, 7.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_replay_strictly_after_and_the_query_beats_last_event_id() {
    let gw = Gateway::start_default().await;
    let id = finished(&gw).await;
    let sequences = |events: &[Value]| -> Vec<u64> {
        events
            .iter()
            .map(|e| e["sequence"].as_u64().expect("seq"))
            .collect()
    };
    for (query, header, first) in [
        (Some("after=3"), None, 4),
        (None, Some("3"), 4),
        (Some("after=5"), Some("2"), 6),
        (Some("after=0"), Some("6"), 1),
        (Some("after="), None, 1),
        (Some("other=1&after=6"), None, 7),
        (Some("after=2.0"), None, 3),
    ] {
        let response = gw.events(&id, query, header).await;
        assert_eq!(response.status(), StatusCode::OK, "{query:?} {header:?}");
        assert_sse_headers(response.headers());
        let mut sse = Sse::new(response);
        let events = sse.rest().await;
        assert!(sse.ends_cleanly());
        assert_eq!(
            sequences(&events),
            (first..=7).collect::<Vec<_>>(),
            "{query:?} {header:?}"
        );
        assert_log(&events, &id, first);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_at_or_past_the_terminal_event_is_an_empty_closed_stream() {
    let gw = Gateway::start_default().await;
    let id = finished(&gw).await;
    for (query, header) in [
        (Some("after=7"), None),
        (Some("after=1000"), None),
        (None, Some("7")),
        (Some("after=9007199254740991"), None),
    ] {
        let response = gw.events(&id, query, header).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_sse_headers(response.headers());
        let body = tokio::time::timeout(WAIT, response.bytes())
            .await
            .expect("closed in time")
            .expect("body");
        assert!(body.is_empty(), "{query:?} {header:?}: {body:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cursors_are_400_and_existence_is_checked_first() {
    let gw = Gateway::start_default().await;
    let id = finished(&gw).await;
    let bad = "Event cursor must be a non-negative integer";
    for (query, header) in [
        (Some("after=-1"), None),
        (Some("after=1.5"), None),
        (Some("after=abc"), None),
        (Some("after=0x10"), None),
        (Some("after=9007199254740992"), None),
        (Some("after=%zz"), None),
        (None, Some("-1")),
        (None, Some("abc")),
        // `after` wins even when the header is fine.
        (Some("after=x"), Some("3")),
    ] {
        let response = json_parts(gw.events(&id, query, header).await).await;
        assert_error(&response, 400, "invalid_request", bad, false);
    }
    let unknown = uuid::Uuid::new_v4().to_string();
    let response = json_parts(gw.events(&unknown, Some("after=-1"), None).await).await;
    assert_error(&response, 404, "not_found", "Execution not found", false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_subscriber_receives_every_event_as_it_happens() {
    let gw = Gateway::start(slow_mock(500, json!({}))).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let mut sse = gw.stream(&id).await;
    let first = sse.chunk().await.expect("first chunk");
    let first = String::from_utf8_lossy(&first).into_owned();
    assert!(
        first.contains("execution.accepted") && !first.contains("execution.completed"),
        "the first chunk comes before the end: {first:?}"
    );
    while sse.chunk().await.is_some() {}
    let mut all = Vec::new();
    let mut parser = protocol::sse::SseParser::new();
    parser.push(&sse.raw, &mut all).expect("valid SSE");
    assert!(parser.finish().is_clean());
    let events: Vec<Value> = all.iter().map(event_json).collect();
    assert_log(&events, &id, 1);
    assert_eq!(types(&events), MOCK_TYPES);
    // A subscriber joining mid-execution with a cursor gets the rest, live.
    let id = gw.submit_ok(&text_request("again")).await;
    gw.wait_started(&id).await;
    let response = gw.events(&id, Some("after=2"), None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = Sse::new(response).rest().await;
    assert_log(&events, &id, 3);
    assert_eq!(types(&events), MOCK_TYPES[2..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_accepting_event_stream_streams_from_the_first_event() {
    let gw = Gateway::start_default().await;
    for accept in [
        "text/event-stream",
        "application/json, text/event-stream;q=0.9",
    ] {
        let response = gw
            .submit_with(&text_request("hi"), &[("accept", accept)])
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{accept}");
        assert_sse_headers(response.headers());
        let mut sse = Sse::new(response);
        let events = sse.rest().await;
        assert!(sse.ends_cleanly());
        let id = events[0]["execution_id"].as_str().expect("id").to_owned();
        assert!(is_uuid_v4(&id));
        assert_log(&events, &id, 1);
        assert_eq!(types(&events), MOCK_TYPES);
    }
    assert_eq!(gw.accepted_count().await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_stream_mid_execution_does_not_cancel_it() {
    let gw = Gateway::start(slow_mock(300, json!({}))).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let mut sse = gw.stream(&id).await;
    loop {
        let event = sse.next_json().await.expect("event");
        if event["type"] == "output.delta" {
            break;
        }
    }
    drop(sse);
    let snapshot = gw.wait_terminal(&id).await;
    assert_eq!(snapshot["status"], "succeeded", "{snapshot}");
    assert_eq!(snapshot["last_sequence"], 7);
    assert_eq!(gw.metric("mrt_cancellations_total").await, 0.0);
    // The server noticed the disconnect and dropped the watcher [R 55].
    let start = std::time::Instant::now();
    while gw.metric("mrt_sse_streams_active").await != 0.0 {
        assert!(start.elapsed() < WAIT, "stream never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Backpressure (contract section 4: a slow client slows only its own stream)

/// Writes a raw HTTP/1.1 request on a socket with a small receive buffer, so a client that does
/// not read pushes back on the server after a few kilobytes rather than megabytes.
async fn raw_request(addr: std::net::SocketAddr, request: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(16 * 1024).expect("rcvbuf");
    let mut stream = socket.connect(addr).await.expect("connect");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request written");
    stream
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) {
    buf.reserve(256 * 1024);
    let n = stream.read_buf(buf).await.expect("read");
    assert!(n > 0, "connection closed before the end of the response");
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads a response head and its chunked body up to the last chunk.
async fn read_chunked_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        fill(stream, &mut buf).await;
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).expect("ascii head");
    let mut pos = head_end + 4;
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = find(&buf[pos..], b"\r\n") {
                break pos + i;
            }
            fill(stream, &mut buf).await;
        };
        let line = std::str::from_utf8(&buf[pos..line_end]).expect("size line");
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .expect("hex chunk size");
        pos = line_end + 2;
        while buf.len() < pos + size + 2 {
            fill(stream, &mut buf).await;
        }
        body.extend_from_slice(&buf[pos..pos + size]);
        assert_eq!(
            &buf[pos + size..pos + size + 2],
            b"\r\n",
            "chunk terminator"
        );
        pos += size + 2;
        if size == 0 {
            return (head, body);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_neither_stalls_the_execution_nor_loses_events() {
    const CHUNKS: usize = 2000;
    const CHUNK_BYTES: usize = 8 * 1024;
    // accepted, route.selected, the deltas, usage, completed
    const TOTAL: usize = CHUNKS + 4;
    let chunks: Vec<String> = (0..CHUNKS)
        .map(|i| {
            let mut s = format!("{i:06}:");
            s.push_str(&"x".repeat(CHUNK_BYTES - s.len()));
            s
        })
        .collect();
    let gw = Gateway::with_long_log(chunks.clone()).await;

    // Submit asking for the event stream (so the stream exists before the execution runs),
    // then never read it.
    let body = text_request("flood").to_string();
    let request = format!(
        "POST /v1/executions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         accept: text/event-stream\r\nidempotency-key: flood\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stalled = raw_request(gw.addr, &request).await;

    // Learn the id through an idempotent replay, then wait for the terminal event with a
    // second stream that starts just before it.
    let response = gw
        .submit_raw(body.clone(), &[("idempotency-key", "flood")])
        .await;
    assert!(matches!(response.status().as_u16(), 200 | 202));
    let id = response.json::<Value>().await.expect("json")["execution_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let cursor = format!("after={}", TOTAL - 1);
    let response = gw.events(&id, Some(&cursor), None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let tail = Sse::new(response).rest().await;
    assert_eq!(types(&tail), ["execution.completed"]);
    assert_eq!(tail[0]["sequence"], TOTAL as u64);

    // The execution finished while the first client read nothing; its stream pulled only what
    // the socket took (bounded), not the whole log.
    let start = std::time::Instant::now();
    while gw.metric("mrt_sse_streams_opened_total").await < 2.0 {
        assert!(start.elapsed() < WAIT, "the stalled stream never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server's socket buffer keeps growing for a moment (kernel autotuning, 4 MiB at most
    // here); wait until the pull count settles, then check it is a fraction of the log.
    let mut pulled = gw.metric("mrt_sse_events_sent_total").await - 1.0;
    let start = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = gw.metric("mrt_sse_events_sent_total").await - 1.0;
        if now == pulled {
            break;
        }
        pulled = now;
        assert!(
            start.elapsed() < WAIT,
            "the stalled stream kept pulling: {pulled}"
        );
    }
    assert!(
        pulled < (TOTAL / 2) as f64,
        "a stalled stream pulled {pulled} of {TOTAL} events"
    );
    assert_eq!(gw.metric("mrt_sse_streams_active").await, 1.0);

    // Now read everything: all events, in order, intact.
    let (head, sse_bytes) = tokio::time::timeout(WAIT, read_chunked_response(&mut stalled))
        .await
        .expect("stream read in time");
    let head_lower = head.to_ascii_lowercase();
    assert!(head_lower.starts_with("http/1.1 200"), "{head}");
    assert!(
        head_lower.contains("content-type: text/event-stream; charset=utf-8"),
        "{head}"
    );
    let mut parser = protocol::sse::SseParser::new();
    let mut frames = Vec::new();
    parser.push(&sse_bytes, &mut frames).expect("valid SSE");
    assert!(parser.finish().is_clean());
    let events: Vec<Value> = frames.iter().map(event_json).collect();
    assert_eq!(events.len(), TOTAL);
    assert_log(&events, &id, 1);
    for (i, chunk) in chunks.iter().enumerate() {
        let event = &events[i + 2];
        assert_eq!(event["type"], "output.delta");
        assert_eq!(event["delta"].as_str(), Some(chunk.as_str()), "delta {i}");
    }
    assert_eq!(events[TOTAL - 1]["type"], "execution.completed");
    assert_eq!(
        gw.metric("mrt_sse_events_sent_total").await,
        (TOTAL + 1) as f64
    );
}

// ---------------------------------------------------------------------------------------------
// Keep-alive (contract section 4)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_receives_keep_alive_comments() {
    // No workers: an execution stays queued, so its stream is idle after `accepted`.
    let limits = gateway::ApiLimits {
        keep_alive: Duration::from_millis(100),
        ..gateway::ApiLimits::default()
    };
    let state = gateway::AppState::new(memory_backend(), standalone_capabilities(), limits);
    let gw = Gateway::from_state(state).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    let mut sse = gw.stream(&id).await;
    let keep_alives = |raw: &[u8]| {
        String::from_utf8_lossy(raw)
            .matches(": keep-alive\n\n")
            .count()
    };
    while keep_alives(&sse.raw) < 3 {
        sse.chunk().await.expect("the idle stream stays open");
    }
    // Comments are not events: only `accepted` so far, and frames are never split by them.
    let mut parser = protocol::sse::SseParser::new();
    let mut frames = Vec::new();
    parser.push(&sse.raw, &mut frames).expect("valid SSE");
    assert!(parser.finish().is_clean());
    assert_eq!(frames.len(), 1);
    assert_eq!(event_json(&frames[0])["type"], "execution.accepted");
    // The stream still delivers the next event and closes after it.
    assert_eq!(gw.cancel(&id).await.0, StatusCode::ACCEPTED);
    let all = sse.rest().await;
    assert_eq!(types(&all), ["execution.accepted", "execution.failed"]);
    assert_eq!(all[1]["status"], "cancelled");
    assert!(sse.ends_cleanly());
}
