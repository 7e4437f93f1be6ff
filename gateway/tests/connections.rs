//! Connection time limits (contract.md section 8), served in-process through
//! `gateway::server::serve_embedded` with short limits: a connection that sends its headers
//! slowly, a body that stops, and a keep-alive connection left idle are closed when their own
//! limit passes; an event stream is not idle while it delivers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::connections::ConnectionLimits;
use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Served {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An embedded gateway with the mock (`delay_ms` between chunks) and `limits`.
async fn serve(limits: ConnectionLimits, delay_ms: u64) -> Served {
    let config = providers::deployment::parse(
        &deployment(
            vec![mock("provider-mock", json!({ "delay_ms": delay_ms }))],
            json!({}),
        )
        .to_string(),
    )
    .expect("valid deployment file");
    let registry =
        Arc::new(worker::deployment::build_registry(&config).expect("buildable registry"));
    let embedded = gateway::Embedded::start(&config, registry, 2);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(gateway::server::serve_embedded(
        listener,
        embedded,
        async move {
            let _ = rx.await;
        },
        Duration::from_secs(1),
        limits,
    ));
    Served {
        addr,
        stop: Some(tx),
    }
}

fn limits(header_ms: u64, body_ms: u64, idle_ms: u64) -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: Duration::from_millis(header_ms),
        body_timeout: Duration::from_millis(body_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_connections: 1000,
    }
}

/// Reads until the server closes the connection (EOF or reset); returns what was read.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Err(_) => panic!("connection still open after {WAIT:?}"),
            Ok(Ok(0) | Err(_)) => return all,
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// [`read_until_closed`], checking that the close came no sooner than `at_least` after the call
/// (and within 8 s); `why` opens the failure message.
async fn read_until_closed_after(stream: &mut TcpStream, at_least: Duration, why: &str) -> Vec<u8> {
    let start = Instant::now();
    let rest = read_until_closed(stream).await;
    let elapsed = start.elapsed();
    assert!(elapsed >= at_least, "{why}closed after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(8), "closed after {elapsed:?}");
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_within_the_header_timeout() {
    let header = Duration::from_secs(2);
    let served = serve(limits(2000, 30_000, 60_000), 0).await;
    let request =
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let addr = served.addr;
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let opened = Instant::now();
            let mut buf = [0u8; 64];
            // One header byte a second, never completing the headers in time.
            for byte in request.iter().copied() {
                tokio::select! {
                    read = stream.read(&mut buf) => {
                        assert!(!matches!(read, Ok(n) if n > 0), "no response to partial headers");
                        return opened.elapsed();
                    }
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if stream.write_all(&[byte]).await.is_err() {
                            return opened.elapsed();
                        }
                    }
                }
            }
            panic!("the whole request went through, one byte a second");
        }));
    }
    let mut slowest = Duration::ZERO;
    for task in tasks {
        slowest = slowest.max(task.await.expect("slow client"));
    }
    assert!(
        slowest >= header,
        "closed before the header timeout: {slowest:?}"
    );
    // Generous for a busy machine; without a header timeout they stay open for the whole
    // request (about a minute at a byte a second).
    assert!(
        slowest < header + Duration::from_secs(8),
        "slowest close after {slowest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_closed_after_the_body_timeout() {
    let served = serve(limits(10_000, 1000, 60_000), 0).await;
    let mut stream = TcpStream::connect(served.addr).await.expect("connect");
    stream
        .write_all(
            b"POST /v1/executions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
              content-length: 1000\r\n\r\n{\"ability\"",
        )
        .await
        .expect("write");
    read_until_closed_after(&mut stream, Duration::from_millis(900), "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_waits_the_idle_timeout_not_the_header_timeout() {
    let served = serve(limits(300, 30_000, 1500), 0).await;
    let mut stream = TcpStream::connect(served.addr).await.expect("connect");
    for _ in 0..2 {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("response in time")
            .expect("read");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    let rest = read_until_closed_after(
        &mut stream,
        Duration::from_millis(1300),
        "an idle keep-alive connection lives the idle timeout (1.5 s), not the header timeout: ",
    )
    .await;
    assert!(rest.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_outlives_the_idle_timeout_while_it_delivers() {
    // Chunks come 1.2 s apart, so the stream is quiet longer than the 1 s idle timeout at
    // every step, and lasts about 4 s.
    let served = serve(limits(2000, 2000, 1000), 1200).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let response = client
        .post(format!("http://{}/v1/executions", served.addr))
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(text_request("hi").to_string())
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let mut sse = Sse::new(response);
    let events = tokio::time::timeout(WAIT, sse.rest())
        .await
        .expect("stream ends");
    assert!(sse.ends_cleanly());
    assert_eq!(
        events.last().expect("events")["type"],
        "execution.completed",
        "{events:?}"
    );
}
