//! Moving a connection away from a NATS server that lost the JetStream quorum.
//!
//! A client stays with the server it is connected to for as long as the TCP connection lives.
//! When a partition cuts that server off from the rest of its cluster, the connection lives on,
//! but the server cannot reach the JetStream meta leader or any stream leader: every API
//! request and every publish to a stream times out (or is answered "JetStream system
//! temporarily unavailable"), and the process answers 503 for as long as the partition lasts,
//! although two healthy servers of its `NATS_URL` could serve it. The client library never
//! leaves a server that still answers pings.
//!
//! So each connection of a process is watched ([`watch`]): every [`PROBE_EVERY`] a JetStream
//! account-info request (answered by the meta leader) is sent, bounded by [`PROBE_TIMEOUT`],
//! and the outcome of the process's own latest event write on it is looked at ([`Writes`]: a
//! cut-off server that holds the meta leader answers the probe until it steps down, but no
//! write needing a quorum is acknowledged). Once either has kept failing for [`LOST_AFTER`] (a
//! timeout, or the server's own "cluster not available"), the server is taken for cut off: it is shunned for [`SHUN_FOR`] and the client
//! is told to reconnect (`Client::force_reconnect`); the server-selection hook installed on the
//! connection ([`Selector`], `ConnectOptions::reconnect_to_server_callback`) then picks another
//! server of the pool. Subscriptions are restored by the client; requests in flight fail and
//! are retried by their callers.
//!
//! The one decision: [`LOST_AFTER`] is longer than a normal JetStream meta-leader election
//! (4 to 9 s, during which every server of a healthy majority fails the probe too), so an
//! election alone rarely moves connections, and short enough that submits succeed again
//! within 15 s of a cut (contract §8). A move during an election is harmless: it costs one
//! reconnect, never a lost write (an unacknowledged write is retried as before).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::AccountErrorKind;
use async_nats::{ReconnectToServer, Server, ServerAddr};
use parking_lot::Mutex;
use tokio::time::Instant;

/// How often a connection's JetStream is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long probes must keep failing before the server is taken for cut off.
pub const LOST_AFTER: Duration = Duration::from_secs(7);
/// How long a server taken for cut off is avoided when picking one to connect to.
pub const SHUN_FOR: Duration = Duration::from_secs(60);

/// The server-selection hook of one connection: while a server is shunned, picks another one
/// of the pool; otherwise leaves the choice to the client (shuffled, fewest failures first).
/// Install it with [`Selector::install`] before connecting.
#[derive(Clone, Default)]
pub struct Selector {
    shunned: Arc<Mutex<Option<(ServerAddr, Instant)>>>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector").finish_non_exhaustive()
    }
}

impl Selector {
    /// `options` with this selector consulted on every connect.
    pub fn install(&self, options: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
        let selector = self.clone();
        options.reconnect_to_server_callback(move |pool, _info| {
            let picked = selector.pick(&pool);
            async move { picked }
        })
    }

    /// The server to connect to now (`None`: the client's own choice).
    fn pick(&self, pool: &[Server]) -> Option<ReconnectToServer> {
        let mut shunned = self.shunned.lock();
        if shunned
            .as_ref()
            .is_some_and(|(_, until)| Instant::now() >= *until)
        {
            *shunned = None;
        }
        let (avoid, _) = shunned.as_ref()?;
        let start = usize::try_from(uuid::Uuid::new_v4().as_u128() % 1024).unwrap_or(0);
        // A move away from a cut-off server is due now; a server that failed already (every
        // other one refusing, as while this process is cut off from all of them) is tried
        // again after the client's own backoff. Without it the client retried in a tight
        // loop, hundreds of thousands of times a second, starving the process.
        choose(pool, start, avoid).map(|server| ReconnectToServer {
            delay: (server.failed_attempts == 0).then_some(Duration::ZERO),
            addr: server.addr.clone(),
        })
    }

    /// Shuns `server` for [`SHUN_FOR`].
    fn shun(&self, server: ServerAddr) {
        *self.shunned.lock() = Some((server, Instant::now() + SHUN_FOR));
    }
}

/// A server of `pool` other than `avoid` with the fewest failed attempts, the first of those
/// from position `start` on (a random start spreads processes over the others); `None` when
/// the pool holds nothing but `avoid`.
fn choose<'a>(pool: &'a [Server], start: usize, avoid: &ServerAddr) -> Option<&'a Server> {
    let mut best: Option<&Server> = None;
    for k in 0..pool.len() {
        let server = &pool[(start + k) % pool.len()];
        if &server.addr != avoid && best.is_none_or(|b| server.failed_attempts < b.failed_attempts)
        {
            best = Some(server);
        }
    }
    best
}

/// The pool's entry for the server `info` describes (the one connected to): the one with its
/// port and, unless it listens on every address, its host; `None` when that is not one entry.
fn connected_entry(pool: &[Server], info: &async_nats::ServerInfo) -> Option<ServerAddr> {
    let any_host = matches!(info.host.as_str(), "" | "0.0.0.0" | "::" | "[::]");
    let mut matching = pool
        .iter()
        .filter(|s| s.addr.port() == info.port && (any_host || s.addr.host() == info.host));
    let first = matching.next()?;
    matching.next().is_none().then(|| first.addr.clone())
}

/// How recent a write's timeout must be to count as the connection failing now: longer than
/// the gap between the failed writes of a lone client retrying through a cut (each submit is
/// answered within 2 s, then retried; with 2 s, the signal lapsed between two of them and the
/// watch started over), shorter than [`LOST_AFTER`], so that one timeout alone never moves a
/// connection.
const WRITE_FAILURE_RECENT: Duration = Duration::from_secs(5);

/// How long a write must have waited for its acknowledgement for its caller's giving up on it
/// to count as a timeout ([`Writes::abandoned`]).
pub const ABANDONED_AFTER: Duration = Duration::from_secs(1);

/// What this process's own JetStream writes on a connection say: the probe alone misses a cut
/// whose minority side holds the meta leader (it keeps answering until it steps down), while
/// every write needing a quorum times out. A write that was answered (stored or refused)
/// clears it.
#[derive(Clone, Default)]
pub struct Writes {
    state: Arc<Mutex<WriteOutcomes>>,
}

#[derive(Default)]
struct WriteOutcomes {
    last_answered: Option<Instant>,
    last_timed_out: Option<Instant>,
}

impl std::fmt::Debug for Writes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writes").finish_non_exhaustive()
    }
}

impl Writes {
    /// A write was answered by the server (stored, or refused on its merits).
    pub fn answered(&self) {
        self.state.lock().last_answered = Some(Instant::now());
    }

    /// A write's acknowledgement timed out, or no server holding its stream answered.
    pub fn timed_out(&self) {
        self.state.lock().last_timed_out = Some(Instant::now());
    }

    /// A write whose caller stopped waiting for its acknowledgement (a submission's own bound
    /// ends before the acknowledgement's timeout) after `waited`: a timeout once it waited
    /// [`ABANDONED_AFTER`], else nothing (the caller went away for its own reasons).
    pub fn abandoned(&self, waited: Duration) {
        if waited >= ABANDONED_AFTER {
            self.timed_out();
        }
    }

    /// Whether the latest write outcome is a recent timeout.
    fn failing(&self) -> bool {
        let state = self.state.lock();
        match state.last_timed_out {
            Some(t) if t.elapsed() < WRITE_FAILURE_RECENT => {
                state.last_answered.is_none_or(|a| a < t)
            }
            _ => false,
        }
    }

    fn forget(&self) {
        *self.state.lock() = WriteOutcomes::default();
    }
}

/// Stops its watch when dropped.
#[derive(Debug)]
pub struct Watch {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether a probe's failure says the server cannot reach the JetStream quorum (rather than,
/// say, an account without JetStream, which no other server would change).
fn quorum_lost(kind: &AccountErrorKind) -> bool {
    match kind {
        AccountErrorKind::TimedOut | AccountErrorKind::JetStreamUnavailable => true,
        AccountErrorKind::JetStream(e) => {
            e.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE
                || e.error_code() == jetstream::ErrorCode::CLUSTER_NO_PEERS
        }
        _ => false,
    }
}

/// Watches `client` (named `role` in logs), which `selector` was installed on, and moves it
/// to another server of its pool when its server has lost the JetStream quorum (see the
/// module docs).
pub fn watch(
    client: async_nats::Client,
    selector: Selector,
    writes: Writes,
    role: &'static str,
) -> Watch {
    let task = tokio::spawn(async move {
        let mut js = jetstream::new(client.clone());
        js.set_timeout(PROBE_TIMEOUT);
        let mut failing_since: Option<Instant> = None;
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            if client.connection_state() != async_nats::connection::State::Connected {
                // Reconnecting already: the client's own failover is at work.
                failing_since = None;
                continue;
            }
            let probe_failed =
                match tokio::time::timeout(PROBE_TIMEOUT * 2, js.query_account()).await {
                    Ok(Ok(_)) => false,
                    Ok(Err(e)) => quorum_lost(&e.kind()),
                    Err(_) => true,
                };
            let failed = probe_failed || writes.failing();
            if !failed {
                failing_since = None;
                continue;
            }
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() < LOST_AFTER {
                continue;
            }
            failing_since = None;
            let pool = match client.server_pool().await {
                Ok(pool) => pool,
                Err(e) => {
                    tracing::debug!(connection = role, error = %e, "cannot read the server pool");
                    continue;
                }
            };
            let info = client.server_info();
            let Some(server) = connected_entry(&pool, &info) else {
                tracing::warn!(
                    connection = role,
                    "the NATS server this connection uses cannot reach the JetStream quorum, and it is not one entry of NATS_URL: staying"
                );
                continue;
            };
            if pool.iter().all(|s| s.addr == server) {
                tracing::warn!(
                    connection = role,
                    "the NATS server this connection uses cannot reach the JetStream quorum, and NATS_URL names no other"
                );
                continue;
            }
            tracing::warn!(
                connection = role,
                server = %format!("{}:{}", server.host(), server.port()),
                "the NATS server this connection uses cannot reach the JetStream quorum (no meta leader, API requests time out): moving to another server of NATS_URL"
            );
            selector.shun(server);
            writes.forget();
            if let Err(e) = client.force_reconnect().await {
                tracing::warn!(connection = role, error = %e, "cannot move the NATS connection");
            }
        }
    });
    Watch { task }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pool(ports: &[u16]) -> Vec<Server> {
        ports
            .iter()
            .map(|p| Server {
                addr: format!("nats://127.0.0.1:{p}").parse().unwrap(),
                failed_attempts: 0,
                did_connect: false,
                is_discovered: false,
                last_error: None,
            })
            .collect()
    }

    fn port(server: Option<&Server>) -> Option<u16> {
        server.map(|s| s.addr.port())
    }

    #[test]
    fn a_shunned_server_is_avoided_while_another_is_in_the_pool() {
        let servers = pool(&[1, 2, 3]);
        let addr = |i: usize| servers[i].addr.clone();
        // From the start position on, never the avoided one.
        assert_eq!(port(choose(&servers, 0, &addr(0))), Some(2));
        assert_eq!(port(choose(&servers, 2, &addr(2))), Some(1));
        // Fewer failed attempts win.
        let mut failing = servers.clone();
        failing[1].failed_attempts = 3;
        assert_eq!(port(choose(&failing, 0, &addr(0))), Some(3));
        // Nothing else: the client's own choice.
        let alone = pool(&[1]);
        assert!(choose(&alone, 0, &alone[0].addr).is_none());
    }

    #[tokio::test]
    async fn the_selector_chooses_only_while_a_server_is_shunned() {
        let selector = Selector::default();
        let servers = pool(&[1, 2, 3]);
        assert!(selector.pick(&servers).is_none(), "the client's own choice");
        selector.shun(servers[0].addr.clone());
        for _ in 0..20 {
            let moved = selector.pick(&servers).unwrap();
            assert_ne!(moved.addr, servers[0].addr);
            assert_eq!(moved.delay, Some(Duration::ZERO), "a move is due now");
        }
        // Every other server refused already (this process is cut off from all of them): the
        // client's backoff applies, no tight loop of retries.
        let mut refusing = servers.clone();
        for server in &mut refusing[1..] {
            server.failed_attempts = 1;
        }
        for _ in 0..20 {
            let retry = selector.pick(&refusing).unwrap();
            assert_ne!(retry.addr, servers[0].addr);
            assert_eq!(retry.delay, None, "the client's own backoff");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_count_as_failing_only_while_their_latest_outcome_is_a_recent_timeout() {
        let writes = Writes::default();
        assert!(!writes.failing(), "no write yet");
        writes.timed_out();
        assert!(writes.failing());
        writes.answered();
        assert!(!writes.failing(), "answered since");
        writes.timed_out();
        tokio::time::advance(WRITE_FAILURE_RECENT).await;
        assert!(
            !writes.failing(),
            "an idle connection is not failing on an old timeout"
        );
        writes.timed_out();
        writes.forget();
        assert!(!writes.failing(), "forgotten after a move");
        writes.abandoned(ABANDONED_AFTER / 2);
        assert!(!writes.failing(), "given up on early: not a timeout");
        writes.abandoned(ABANDONED_AFTER);
        assert!(writes.failing(), "given up on after waiting: a timeout");
    }

    #[tokio::test(start_paused = true)]
    async fn failed_writes_two_seconds_apart_keep_the_connection_failing() {
        // A lone client retrying through a cut: a submit answered 503 within 2 s, then the next.
        let writes = Writes::default();
        for _ in 0..5 {
            writes.timed_out();
            tokio::time::advance(Duration::from_millis(2300)).await;
            assert!(writes.failing(), "between two failed writes");
        }
    }

    #[test]
    fn the_connected_server_is_found_by_its_port_and_host() {
        let servers = pool(&[1, 2, 3]);
        let info = |host: &str, port: u16| async_nats::ServerInfo {
            host: host.into(),
            port,
            ..Default::default()
        };
        assert_eq!(
            connected_entry(&servers, &info("0.0.0.0", 2)).map(|a| a.port()),
            Some(2)
        );
        assert_eq!(
            connected_entry(&servers, &info("127.0.0.1", 3)).map(|a| a.port()),
            Some(3)
        );
        assert_eq!(connected_entry(&servers, &info("10.0.0.9", 3)), None);
        assert_eq!(connected_entry(&servers, &info("0.0.0.0", 9)), None);
    }
}
