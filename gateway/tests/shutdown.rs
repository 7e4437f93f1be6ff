//! Graceful shutdown through `gateway::server::serve` (contract.md section 1): new submits get
//! 503, running work finishes within the grace or is cancelled after it, queued work is
//! cancelled, subscribers see the terminal events, and `serve` returns, even when a client has
//! stopped reading.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use protocol::ExecutionId;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;
use tokio::io::AsyncWriteExt;

/// The status of `id` read straight from the store (the HTTP server may be gone).
async fn stored_status(gw: &Gateway, id: &str) -> String {
    let id: ExecutionId = id.parse().expect("uuid");
    let state = gw
        .state
        .backend()
        .store
        .state(id)
        .await
        .expect("store readable")
        .expect("execution retained");
    state.status().as_str().to_owned()
}

/// Polls `/v1/runtime` until it reports `stopping`.
async fn wait_stopping(gw: &Gateway) {
    let start = Instant::now();
    loop {
        let (status, headers, body) = gw.get_json("/v1/runtime").await;
        if body["state"] == "stopping" {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert_json_headers(&headers);
            return;
        }
        assert!(start.elapsed() < WAIT, "never stopping: {body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_work_and_lets_running_executions_finish() {
    let mut gw = Gateway::start_with(slow_mock(700, json!({})), 4, Duration::from_secs(15)).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_started(&id).await;
    let mut sse = gw.stream(&id).await;
    sse.expect_type("execution.accepted").await;

    gw.signal_shutdown();
    wait_stopping(&gw).await;
    let response = gw.submit(&text_request("late")).await;
    let retry_after = response.headers().get("retry-after").cloned();
    assert_error(
        &json_parts(response).await,
        503,
        "unavailable",
        "Runtime is shutting down",
        true,
    );
    assert!(retry_after.is_some(), "503 carries Retry-After");
    let (status, _, _) = gw.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(gw.metric("mrt_stopping").await, 1.0);
    // Reads still work while draining.
    assert_eq!(gw.snapshot(&id).await["execution_id"], id.as_str());

    // The subscriber sees the execution through to success, then a clean end.
    let events = sse.rest().await;
    assert!(sse.ends_cleanly());
    let last = events.last().expect("terminal");
    assert_eq!(last["type"], "execution.completed");
    assert_eq!(last["sequence"], 7);
    gw.join(Duration::from_secs(30)).await;
    assert_eq!(stored_status(&gw, &id).await, "succeeded");
    assert_eq!(gw.accepted_count_offline(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_short_grace_running_and_queued_executions_end_cancelled() {
    // One worker slot: the first execution runs (slowly), the second waits in the queue.
    let mut gw =
        Gateway::start_with(slow_mock(5000, json!({})), 1, Duration::from_millis(300)).await;
    let running = gw.submit_ok(&text_request("running")).await;
    gw.wait_started(&running).await;
    let queued = gw.submit_ok(&text_request("queued")).await;
    let mut running_sse = gw.stream(&running).await;
    let mut queued_sse = gw.stream(&queued).await;

    let signalled = Instant::now();
    gw.signal_shutdown();
    let running_events = running_sse.rest().await;
    let queued_events = queued_sse.rest().await;
    gw.join(Duration::from_secs(30)).await;
    assert!(
        signalled.elapsed() < Duration::from_secs(15),
        "shutdown took {:?}",
        signalled.elapsed()
    );

    let cancelled =
        json!({ "code": "cancelled", "message": "Execution was cancelled", "retryable": false });
    assert_log(&running_events, &running, 1);
    assert_eq!(
        types(&running_events),
        ["execution.accepted", "route.selected", "execution.failed"]
    );
    let last: &Value = &running_events[2];
    assert_eq!(last["status"], "cancelled");
    assert_eq!(last["error"], cancelled);
    assert_log(&queued_events, &queued, 1);
    assert_eq!(
        types(&queued_events),
        ["execution.accepted", "execution.failed"]
    );
    assert_eq!(queued_events[1]["error"], cancelled);
    assert_eq!(stored_status(&gw, &running).await, "cancelled");
    assert_eq!(stored_status(&gw, &queued).await, "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_completes_even_when_a_client_stops_reading_its_stream() {
    // A long log (about 8 MiB of events) so the stream cannot fit in the socket buffers.
    let mut gw = Gateway::with_long_log(vec!["y".repeat(8 * 1024); 1000]).await;
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_terminal(&id).await;
    // A raw client with a small receive buffer that never reads.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stalled = socket.connect(gw.addr).await.unwrap();
    stalled
        .write_all(format!("GET /v1/executions/{id}/events HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let start = Instant::now();
    while gw.metric("mrt_sse_streams_active").await < 1.0 {
        assert!(start.elapsed() < WAIT, "stream never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let signalled = Instant::now();
    gw.signal_shutdown();
    // Streams get 2 s to finish after the executions, connections 5 s more; then serve
    // returns whatever the client does.
    gw.join(Duration::from_secs(30)).await;
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        signalled.elapsed()
    );
    drop(stalled);
}
