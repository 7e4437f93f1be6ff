//! The event stream against a scripted server: resume cursors, incomplete frames, the empty
//! stream rule, gaps, repeats, oversized frames, retryable statuses and the retry budget.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use model_runtime_client::{Client, ClientError, RetryPolicy};
use protocol::sse::write_event_frame;
use protocol::{
    ErrorCode, EventBody, ExecutionId, ExecutionStatus, RuntimeEvent, Sequence, Target, Timestamp,
};
use serde_json::json;
use support::*;

const LAST: u64 = 5;

/// Event `seq` of a five-event log of `id`: accepted, route.selected, two deltas, completed.
fn event(id: ExecutionId, seq: u64) -> RuntimeEvent {
    let target = Target {
        provider: "p".into(),
        model: "m".into(),
    };
    let body = match seq {
        1 => EventBody::Accepted,
        2 => EventBody::RouteSelected { target, attempt: 1 },
        3 | 4 => EventBody::OutputDelta {
            output_index: 0,
            delta: format!("d{seq}"),
        },
        _ => EventBody::Completed { target },
    };
    RuntimeEvent::new(id, Sequence(seq), Timestamp::from_unix_millis(0), body)
}

fn frames(id: ExecutionId, seqs: impl IntoIterator<Item = u64>) -> String {
    let mut out = String::new();
    for seq in seqs {
        let e = event(id, seq);
        write_event_frame(&mut out, seq, e.type_name(), &e.to_json());
    }
    out
}

fn snapshot(id: ExecutionId, status: &str, last: u64) -> serde_json::Value {
    json!({
        "execution_id": id,
        "status": status,
        "created_at": "2026-01-01T00:00:00.000Z",
        "updated_at": "2026-01-01T00:00:00.000Z",
        "last_sequence": last,
        "usage": [],
    })
}

fn quick(base: &str, retries: u32) -> Client {
    Client::builder(base)
        .retry(RetryPolicy {
            max_retries: retries,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        })
        .build()
        .unwrap()
}

async fn drain(client: &Client, id: ExecutionId, after: u64) -> (Vec<u64>, Option<ClientError>) {
    let mut stream = client.events(id, Sequence(after)).unwrap();
    let mut seqs = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(e) => seqs.push(e.sequence.get()),
            Err(e) => {
                assert!(stream.next().await.is_none(), "nothing after an error");
                return (seqs, Some(e));
            }
        }
    }
    (seqs, None)
}

/// Asserts a protocol error whose message contains `part`.
fn assert_protocol_error(error: &Option<ClientError>, part: &str) {
    let message = match error {
        Some(ClientError::Protocol(m)) => m,
        other => panic!("expected a protocol error about {part:?}, got {other:?}"),
    };
    assert!(
        message.contains(part),
        "{message:?} does not mention {part:?}"
    );
}

#[tokio::test]
async fn truncated_streams_resume_from_the_last_committed_sequence() {
    let id = ExecutionId::new_random();
    // Each connection sends two whole events and half of the next frame, then closes.
    let server = FakeServer::start(move |_, req| {
        let after = req.after().unwrap();
        let mut body = frames(id, (after + 1..=after + 2).filter(|s| *s <= LAST));
        if after + 3 <= LAST {
            let next = frames(id, [after + 3]);
            body.push_str(&next[..next.len() / 2]);
        }
        sse_response(body.as_bytes())
    })
    .await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    let cursors: Vec<Option<u64>> = server.seen().iter().map(SeenRequest::after).collect();
    assert_eq!(cursors, [Some(0), Some(2), Some(4)]);
}

#[tokio::test]
async fn an_empty_stream_at_or_past_the_terminal_cursor_ends_cleanly() {
    let id = ExecutionId::new_random();
    let server = FakeServer::start(move |_, req| {
        if req.path().ends_with("/events") {
            sse_response(b"")
        } else {
            json_response(200, &snapshot(id, "succeeded", LAST))
        }
    })
    .await;
    for after in [LAST, LAST + 10] {
        let (seqs, error) = drain(&quick(&server.base, 3), id, after).await;
        assert!(error.is_none(), "{error:?}");
        assert!(seqs.is_empty());
    }
}

#[tokio::test]
async fn an_empty_stream_of_a_running_execution_is_a_truncation() {
    let id = ExecutionId::new_random();
    // The first stream closes before its first event (a gateway shutting down); the snapshot
    // says the execution is still running, so the client resumes.
    let server = FakeServer::start(move |i, req| {
        if !req.path().ends_with("/events") {
            json_response(200, &snapshot(id, "running", 2))
        } else if i == 0 {
            sse_response(b"")
        } else {
            sse_response(frames(id, 1..=LAST).as_bytes())
        }
    })
    .await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn eof_after_a_non_terminal_event_exhausts_the_retry_budget_then_fails() {
    let id = ExecutionId::new_random();
    let server = FakeServer::start(move |i, _| {
        if i == 0 {
            sse_response(frames(id, [1]).as_bytes())
        } else {
            sse_response(b"")
        }
    })
    .await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert_eq!(seqs, [1]);
    let error = error.expect("truncation error");
    assert!(
        matches!(error, ClientError::StreamTruncated { last_sequence } if last_sequence == Sequence(1)),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("stream ended before a terminal event")
    );
    assert!(error.is_retryable());
    // One connection, then three retries from the committed cursor.
    let cursors: Vec<Option<u64>> = server.seen().iter().map(SeenRequest::after).collect();
    assert_eq!(cursors, [Some(0), Some(1), Some(1), Some(1)]);
}

#[tokio::test]
async fn a_sequence_gap_is_an_error_after_the_contiguous_prefix() {
    let id = ExecutionId::new_random();
    let server =
        FakeServer::start(move |_, _| sse_response(frames(id, [1, 2, 4, 5]).as_bytes())).await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert_eq!(seqs, [1, 2]);
    let error = error.expect("gap error");
    assert!(
        matches!(error, ClientError::Protocol(m) if m.contains("gap")),
        "{error:?}"
    );
    assert_eq!(error.code(), Some(ErrorCode::InternalError));
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn a_repeated_sequence_is_an_error_never_a_second_delivery() {
    let id = ExecutionId::new_random();
    // The resumed connection ignores the cursor and starts over.
    let server = FakeServer::start(move |i, _| {
        if i == 0 {
            sse_response(frames(id, [1, 2]).as_bytes())
        } else {
            sse_response(frames(id, 1..=LAST).as_bytes())
        }
    })
    .await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert_eq!(seqs, [1, 2]);
    assert_protocol_error(&error, "repeated");
}

#[tokio::test]
async fn events_of_another_execution_are_rejected() {
    let id = ExecutionId::new_random();
    let other = ExecutionId::new_random();
    let server =
        FakeServer::start(move |_, _| sse_response(frames(other, 1..=LAST).as_bytes())).await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert!(seqs.is_empty());
    assert!(matches!(error, Some(ClientError::Protocol(_))), "{error:?}");
}

#[tokio::test]
async fn a_frame_over_one_mebibyte_is_an_error() {
    let id = ExecutionId::new_random();
    let server = FakeServer::start(move |_, _| {
        let mut body = frames(id, [1]);
        let huge = "x".repeat(1024 * 1024 + 16);
        body.push_str(&format!("id: 2\nevent: output.delta\ndata: {huge}\n\n"));
        sse_response(body.as_bytes())
    })
    .await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert_eq!(seqs, [1], "events before the oversized frame are delivered");
    assert_protocol_error(&error, "size limit");
}

#[tokio::test]
async fn retryable_statuses_are_retried_and_not_found_is_final() {
    let id = ExecutionId::new_random();
    let server = FakeServer::start(move |i, _| match i {
        0 => json_response(
            503,
            &json!({"error":{"code":"unavailable","message":"A runtime backend is unavailable","retryable":true}}),
        ),
        1 => json_response(
            429,
            &json!({"error":{"code":"queue_full","message":"Too many open event streams","retryable":true}}),
        ),
        _ => sse_response(frames(id, 1..=LAST).as_bytes()),
    })
    .await;
    let (seqs, error) = drain(&quick(&server.base, 3), id, 0).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(seqs, [1, 2, 3, 4, 5]);

    let missing = FakeServer::start(|_, _| {
        json_response(
            404,
            &json!({"error":{"code":"not_found","message":"Execution not found"}}),
        )
    })
    .await;
    let (seqs, error) = drain(&quick(&missing.base, 3), id, 0).await;
    assert!(seqs.is_empty());
    let Some(ClientError::Api(api)) = error else {
        panic!("expected an API error, got {error:?}");
    };
    assert_eq!(
        (api.status, api.code, api.retryable),
        (404, ErrorCode::NotFound, false)
    );
    assert_eq!(missing.seen().len(), 1, "a 404 is not retried");
}

#[tokio::test]
async fn an_error_whose_body_stalls_after_its_headers_ends_within_the_request_timeout() {
    // A proxy or a gateway that sends an error's headers and then nothing: opening the stream
    // has no whole-request timeout, so reading that body hung the stream for ever.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let head =
                "HTTP/1.1 404 X\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{";
            let _ = socket.write_all(head.as_bytes()).await;
            held.push(socket);
        }
    });
    let client = Client::builder(&base)
        .request_timeout(Duration::from_millis(500))
        .retry(RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    let drained = tokio::time::timeout(
        Duration::from_secs(60),
        drain(&client, ExecutionId::new_random(), 0),
    )
    .await;
    let (seqs, error) = drained.expect("the stream ends: no hang on a stalled error body");
    assert!(seqs.is_empty());
    let Some(ClientError::Api(api)) = error else {
        panic!("expected an API error, got {error:?}");
    };
    assert_eq!((api.status, api.retryable), (404, false));
}

#[tokio::test]
async fn the_cursor_is_checked_before_any_request() {
    let server = FakeServer::start(|_, _| sse_response(b"")).await;
    let client = quick(&server.base, 0);
    let result = client.events(
        ExecutionId::new_random(),
        Sequence(model_runtime_client::MAX_CURSOR + 1),
    );
    assert!(matches!(result, Err(ClientError::InvalidCursor)));
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn the_terminal_event_ends_the_stream_even_if_more_bytes_follow() {
    let id = ExecutionId::new_random();
    let server = FakeServer::start(move |_, _| {
        let mut body = frames(id, 1..=LAST);
        body.push_str(": trailing comment\n\n");
        sse_response(body.as_bytes())
    })
    .await;
    let client = quick(&server.base, 0);
    let mut stream = client.events(id, Sequence::ZERO).unwrap();
    let mut last = None;
    while let Some(item) = stream.next().await {
        last = Some(item.unwrap());
    }
    let last = last.unwrap();
    assert_eq!(last.sequence, Sequence(LAST));
    assert_eq!(last.status, ExecutionStatus::Succeeded);
    assert_eq!(stream.connections(), 1);
}
