//! A fake model provider: a local HTTP server (axum on `127.0.0.1:0`) that answers with what a
//! test scripts, in the provider's real wire format, and records every request it received.
//!
//! A test either passes a responder (`Fn(&Received) -> Reply`, for answers that depend on the
//! request: a queue API's status polls, an error that echoes a header) or a list of replies
//! given to successive requests ([`FakeProvider::scripted`]). Streamed bodies are
//! [`Piece`]s: bytes, pauses (so what came before is flushed), a cut connection or a stall.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use parking_lot::Mutex;
use serde_json::Value;

/// One request the fake provider received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// `http://127.0.0.1:PORT` of the server that received it.
    pub origin: String,
    /// How many earlier requests had the same method and path.
    pub nth: usize,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

/// One step of a streamed response body.
#[derive(Debug, Clone)]
pub enum Piece {
    Bytes(Bytes),
    /// The server waits (so everything before is flushed to the client).
    Pause(Duration),
    /// The server fails the body: the connection is aborted mid-response.
    Cut,
    /// The server never sends anything again (nor closes).
    Stall,
}

impl Piece {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Bytes(Bytes::from(text.into()))
    }
}

/// `text` split into chunks of `size` bytes (which split frames, lines and UTF-8 characters).
pub fn chunked(text: &str, size: usize) -> Vec<Piece> {
    text.as_bytes()
        .chunks(size)
        .map(|c| Piece::Bytes(Bytes::copy_from_slice(c)))
        .collect()
}

type Responder = dyn Fn(&Received) -> Reply + Send + Sync;

/// What the fake provider answers to one request.
#[derive(Clone)]
pub enum Reply {
    /// A complete response.
    Status {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// `200 text/event-stream` with these pieces; the body ends cleanly after the last.
    Stream(Vec<Piece>),
    /// A reply computed from the request (for a scripted list of replies).
    Respond(Arc<Responder>),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status { status, body, .. } => write!(f, "Status({status}, {body:?})"),
            Self::Stream(pieces) => write!(f, "Stream({} pieces)", pieces.len()),
            Self::Respond(_) => f.write_str("Respond(..)"),
        }
    }
}

impl Reply {
    /// `status` with a JSON body (`content-type: application/json`).
    pub fn json(status: u16, value: &Value) -> Self {
        Self::raw_json(status, &value.to_string())
    }

    /// `status` with `body` sent as is under `content-type: application/json`.
    pub fn raw_json(status: u16, body: &str) -> Self {
        Self::Status {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: body.to_owned(),
        }
    }

    /// `status` with a body and no content type.
    pub fn text(status: u16, text: &str) -> Self {
        Self::Status {
            status,
            headers: Vec::new(),
            body: text.to_owned(),
        }
    }

    /// A reply computed from the request.
    pub fn respond(f: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Self {
        Self::Respond(Arc::new(f))
    }

    /// This reply with one more header (ignored on a stream).
    pub fn with_header(mut self, name: &'static str, value: &str) -> Self {
        if let Self::Status { headers, .. } = &mut self {
            headers.push((name, value.to_owned()));
        }
        self
    }
}

struct ServerState {
    received: Mutex<Vec<Received>>,
    responder: Box<Responder>,
    origin: String,
    /// Streamed response bodies dropped by the server (finished, cut, or the client went away).
    bodies_dropped: AtomicUsize,
}

/// A running fake provider, stopped when dropped.
pub struct FakeProvider {
    state: Arc<ServerState>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProvider")
            .field("origin", &self.state.origin)
            .finish_non_exhaustive()
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProvider {
    /// Answers every request with `responder`.
    pub async fn start(responder: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake provider");
        let origin = format!("http://{}", listener.local_addr().expect("local addr"));
        let state = Arc::new(ServerState {
            received: Mutex::new(Vec::new()),
            responder: Box::new(responder),
            origin,
            bodies_dropped: AtomicUsize::new(0),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("serve the fake provider");
        });
        Self { state, task }
    }

    /// Answers successive requests with `replies`, then with 500.
    pub async fn scripted(replies: Vec<Reply>) -> Self {
        let queue = Mutex::new(VecDeque::from(replies));
        Self::start(move |_| {
            queue
                .lock()
                .pop_front()
                .unwrap_or_else(|| Reply::text(500, ""))
        })
        .await
    }

    /// `http://127.0.0.1:PORT`
    pub fn origin(&self) -> &str {
        &self.state.origin
    }

    /// Every request so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().clone()
    }

    /// How many requests had `method` and `path`.
    pub fn count(&self, method: Method, path: &str) -> usize {
        self.state
            .received
            .lock()
            .iter()
            .filter(|r| r.method == method && r.path == path)
            .count()
    }

    /// Streamed response bodies the server has dropped (finished, cut, or abandoned by the
    /// client).
    pub fn bodies_dropped(&self) -> usize {
        self.state.bodies_dropped.load(Ordering::SeqCst)
    }
}

async fn handle(
    State(state): State<Arc<ServerState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = {
        let mut all = state.received.lock();
        let nth = all
            .iter()
            .filter(|r| r.method == method && r.path == uri.path())
            .count();
        let received = Received {
            method,
            path: uri.path().to_owned(),
            headers,
            body,
            origin: state.origin.clone(),
            nth,
        };
        all.push(received.clone());
        received
    };
    let mut reply = (state.responder)(&received);
    while let Reply::Respond(f) = reply {
        reply = f(&received);
    }
    render(reply, &state)
}

/// Counts a streamed body as dropped when the server drops it.
struct DropSignal(Arc<ServerState>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.bodies_dropped.fetch_add(1, Ordering::SeqCst);
    }
}

fn render(reply: Reply, state: &Arc<ServerState>) -> Response {
    let response = match reply {
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut builder = Response::builder().status(status);
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            builder.body(Body::from(body))
        }
        Reply::Stream(pieces) => {
            let signal = DropSignal(Arc::clone(state));
            let body = futures_util::stream::unfold(
                (pieces.into_iter(), signal),
                |(mut pieces, signal)| async move {
                    let mut piece = pieces.next()?;
                    while let Piece::Pause(pause) = piece {
                        tokio::time::sleep(pause).await;
                        piece = pieces.next()?;
                    }
                    match piece {
                        Piece::Bytes(bytes) => Some((Ok(bytes), (pieces, signal))),
                        Piece::Pause(_) => unreachable!("pauses are taken above"),
                        Piece::Cut => Some((
                            Err(std::io::Error::other("connection cut")),
                            (pieces, signal),
                        )),
                        Piece::Stall => std::future::pending().await,
                    }
                },
            );
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream; charset=utf-8")
                .header("cache-control", "no-cache")
                .body(Body::from_stream(body))
        }
        Reply::Respond(_) => unreachable!("computed replies are resolved by the handler"),
    };
    response.expect("valid response")
}
