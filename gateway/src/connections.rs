//! Client connections (contract.md section 8): the accept loop bounded by
//! `limits.max_connections`, the header, body and idle timeouts of every connection, and the
//! drain at shutdown.
//!
//! hyper's own `header_read_timeout` restarts as soon as a keep-alive connection waits for its
//! next request, so it cannot tell an idle connection from a slow one. Instead a watchdog per
//! connection follows the connection's [`Phase`] (seen from the socket reads and writes, the
//! request body and the response body) and closes the connection when the phase's deadline
//! passes.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Open files kept for everything but client connections (listener, NATS, Redis, logs).
pub const RESERVED_FILES: u64 = 64;
/// Open-file limit assumed when it cannot be read.
const FALLBACK_OPEN_FILES: u64 = 1024;
/// Pause after an accept error caused by exhausted resources (open files, memory), so the loop
/// waits for connections to close instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one accept-error log line per this interval.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Time and count bounds of client connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From accept, or from the first byte of a later request, to the end of the headers.
    pub header_timeout: Duration,
    /// From the end of the headers to the end of the body.
    pub body_timeout: Duration,
    /// Keep-alive wait between requests, and the longest stall of a response write.
    pub idle_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// The bounds of the deployment file; `open_files` is the process's open-file limit, which
    /// sets the default `max_connections`.
    pub fn new(limits: &config::Limits, open_files: u64) -> Self {
        let by_files = open_files.saturating_sub(RESERVED_FILES).max(1);
        Self {
            header_timeout: Duration::from_millis(limits.header_timeout_ms),
            body_timeout: Duration::from_millis(limits.body_timeout_ms),
            idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
            max_connections: limits
                .max_connections
                .unwrap_or_else(|| usize::try_from(by_files).unwrap_or(usize::MAX)),
        }
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::new(&config::Limits::default(), FALLBACK_OPEN_FILES)
    }
}

/// Raises the soft open-file limit to the hard limit and returns the soft limit now in force.
pub fn raise_open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(FALLBACK_OPEN_FILES)
        }
    }
}

/// Connections the kernel queues while the gateway is at `max_connections` (std's default of
/// 128 would make further clients retry their SYN with growing back-off instead of waiting).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` (`host:port`, the first resolved address that binds) with [`LISTEN_BACKLOG`].
pub async fn bind(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for candidate in tokio::net::lookup_host(addr).await? {
        let socket = if candidate.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        match socket
            .bind(candidate)
            .and_then(|()| socket.listen(LISTEN_BACKLOG))
        {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
}

/// Serves `app` on `listener` until `drain` is cancelled: then stops accepting and asks every
/// connection to close after its current request. Cancelling `force` closes them at once.
/// Every connection task is spawned on `tracker`.
pub async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    drain: CancellationToken,
    force: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(
        limits.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let mut last_logged: Option<Instant> = None;
    let mut suppressed = 0u64;
    loop {
        // Over the bound, new connections stay in the listen backlog until one closes.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            () = drain.cancelled() => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = drain.cancelled() => return,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                if is_resource_error(&e) {
                    let now = Instant::now();
                    if last_logged.is_none_or(|t| now >= t + ACCEPT_ERROR_LOG_INTERVAL) {
                        tracing::warn!(error = %e, suppressed, "accept error; waiting for connections to close");
                        last_logged = Some(now);
                        suppressed = 0;
                    } else {
                        suppressed += 1;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                        () = drain.cancelled() => return,
                    }
                }
                // Other errors belong to the one connection (reset before accept): go on.
                continue;
            }
        };
        // Small SSE frames must leave at once: without TCP_NODELAY, Nagle's algorithm and
        // delayed ACKs hold them back for ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        tracker.spawn(serve_connection(
            tcp,
            app.clone(),
            limits,
            drain.clone(),
            force.clone(),
            permit,
        ));
    }
}

/// Errors of the process or system rather than of one connection.
fn is_resource_error(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Serves one connection until it closes, times out or is forced closed.
async fn serve_connection(
    tcp: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    drain: CancellationToken,
    force: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    // The loop below polls every branch whenever the connection's task wakes, which is for
    // every chunk of an event stream's body. Its waits for the drain and the force close are
    // polled only once cancelled (`OwnWakes`), and on this connection's own child tokens, not
    // the gateway's, which every connection shares (a lock each would take).
    let mut drained = runtime::own_wakes::cancelled(&drain.child_token());
    let mut forced = runtime::own_wakes::cancelled(&force.child_token());
    let watch = Arc::new(Watch::new(limits));
    let io = TokioIo::new(WatchedIo {
        inner: tcp,
        watch: watch.clone(),
    });
    let service_watch = watch.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let watch = service_watch.clone();
        let app = app.clone();
        async move {
            if request.body().is_end_stream() {
                watch.set_phase(Phase::Busy);
            } else {
                watch.set_phase(Phase::Body(Instant::now()));
            }
            let request = request.map(|body| Body::new(WatchedBody::request(body, watch.clone())));
            let response = match app.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(response.map(|body| Body::new(WatchedBody::response(body, watch))))
        }
    });
    // No hyper timer: the watchdog below owns every timeout.
    let connection = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        // Polled only once notified, as the cancellations above.
        let changed = runtime::own_wakes::own_wakes(watch.changed.notified());
        let deadline = watch.deadline();
        let expired = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = expired => {
                if watch.deadline().is_some_and(|at| at <= Instant::now()) {
                    tracing::debug!(phase = ?watch.phase(), "connection timed out; closing");
                    return;
                }
            }
            () = changed => {}
            () = &mut drained, if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
            () = &mut forced => return,
        }
    }
}

/// Where a connection is in its request cycle; each phase has its own time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a request line and headers, since the instant (accept or first byte).
    Head(Instant),
    /// Headers are in; receiving the body since the instant.
    Body(Instant),
    /// The handler runs or the response is written: only a stalled write times out, so an SSE
    /// stream lives as long as its frames and keep-alives flow.
    Busy,
    /// Between requests of a keep-alive connection, since the instant.
    Idle(Instant),
}

#[derive(Debug)]
struct WatchState {
    phase: Phase,
    /// Since when a write to the socket has been waiting for the peer to read.
    write_stalled: Option<Instant>,
}

/// The timing state of one connection, shared by its socket, bodies and watchdog.
#[derive(Debug)]
struct Watch {
    limits: ConnectionLimits,
    state: Mutex<WatchState>,
    /// Wakes the watchdog when the deadline may have moved earlier.
    changed: Notify,
}

impl Watch {
    fn new(limits: ConnectionLimits) -> Self {
        Self {
            limits,
            state: Mutex::new(WatchState {
                phase: Phase::Head(Instant::now()),
                write_stalled: None,
            }),
            changed: Notify::new(),
        }
    }

    fn phase(&self) -> Phase {
        self.state.lock().phase
    }

    fn deadline(&self) -> Option<Instant> {
        let state = self.state.lock();
        let limits = &self.limits;
        let phase = match state.phase {
            Phase::Head(since) => Some(since + limits.header_timeout),
            Phase::Body(since) => Some(since + limits.body_timeout),
            Phase::Busy => None,
            Phase::Idle(since) => Some(since + limits.idle_timeout),
        };
        let stall = state.write_stalled.map(|since| since + limits.idle_timeout);
        match (phase, stall) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.state.lock().phase = phase;
        self.changed.notify_one();
    }

    /// Bytes arrived: on an idle connection they start the next request's header time.
    fn read_some(&self) {
        let mut state = self.state.lock();
        if matches!(state.phase, Phase::Idle(_)) {
            state.phase = Phase::Head(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    fn body_done(&self) {
        let mut state = self.state.lock();
        if matches!(state.phase, Phase::Body(_)) {
            state.phase = Phase::Busy;
        }
    }

    fn write_pending(&self) {
        let mut state = self.state.lock();
        if state.write_stalled.is_none() {
            state.write_stalled = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    fn write_ready(&self) {
        self.state.lock().write_stalled = None;
    }
}

/// The socket, reporting reads and stalled writes to the [`Watch`].
struct WatchedIo {
    inner: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.watch.read_some();
        }
        result
    }
}

impl WatchedIo {
    fn note<T>(&self, result: Poll<T>) -> Poll<T> {
        match result {
            Poll::Pending => self.watch.write_pending(),
            Poll::Ready(_) => self.watch.write_ready(),
        }
        result
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request or response body that tells the connection's watch, once, when it ends or is
/// dropped.
struct WatchedBody<B> {
    inner: B,
    watch: Arc<Watch>,
    /// What the end means to the watch; `None` once told.
    on_end: Option<fn(&Watch)>,
    /// Whether a frame that leaves `inner` at its end already ends the body (rather than the
    /// poll that reads its end).
    end_with_last_frame: bool,
}

impl<B> WatchedBody<B> {
    /// The request body; its end (or drop) ends the body phase.
    fn request(inner: B, watch: Arc<Watch>) -> Self {
        Self {
            inner,
            watch,
            on_end: Some(Watch::body_done),
            end_with_last_frame: true,
        }
    }

    /// The response body; its end (or drop) starts the idle time before the next request.
    fn response(inner: B, watch: Arc<Watch>) -> Self {
        Self {
            inner,
            watch,
            on_end: Some(|watch| watch.set_phase(Phase::Idle(Instant::now()))),
            end_with_last_frame: false,
        }
    }

    fn finish(&mut self) {
        if let Some(on_end) = self.on_end.take() {
            on_end(&self.watch);
        }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for WatchedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let result = Pin::new(&mut self.inner).poll_frame(cx);
        match &result {
            Poll::Ready(None | Some(Err(_))) => self.finish(),
            Poll::Ready(Some(Ok(_))) if self.end_with_last_frame && self.inner.is_end_stream() => {
                self.finish()
            }
            _ => {}
        }
        result
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for WatchedBody<B> {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(1),
            body_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(3),
            max_connections: 10,
        }
    }

    #[test]
    fn max_connections_defaults_to_the_open_file_limit_minus_the_reserve() {
        let config = config::Limits::default();
        assert_eq!(ConnectionLimits::new(&config, 512).max_connections, 448);
        assert_eq!(ConnectionLimits::new(&config, 10).max_connections, 1);
        let set = config::Limits {
            max_connections: Some(7),
            ..config
        };
        assert_eq!(ConnectionLimits::new(&set, 512).max_connections, 7);
        let default = ConnectionLimits::default();
        assert_eq!(default.header_timeout, Duration::from_secs(10));
        assert_eq!(default.body_timeout, Duration::from_secs(30));
        assert_eq!(default.idle_timeout, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_deadline() {
        let watch = Watch::new(limits());
        let start = Instant::now();
        assert_eq!(watch.deadline(), Some(start + Duration::from_secs(1)));
        watch.set_phase(Phase::Body(start));
        assert_eq!(watch.deadline(), Some(start + Duration::from_secs(2)));
        watch.body_done();
        assert_eq!(watch.deadline(), None, "a running handler has no deadline");
        watch.write_pending();
        assert_eq!(watch.deadline(), Some(start + Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        watch.write_ready();
        assert_eq!(watch.deadline(), None, "writes flow again");
        let idle = Instant::now();
        watch.set_phase(Phase::Idle(idle));
        assert_eq!(watch.deadline(), Some(idle + Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(2)).await;
        watch.read_some();
        assert_eq!(
            watch.deadline(),
            Some(Instant::now() + Duration::from_secs(1)),
            "the first byte of the next request starts its header time"
        );
    }
}
