//! Process settings shared by the `gateway` and `worker` binaries: flags with environment
//! fallbacks (flags win), as contract.md section 1 lists them. This is the only module that
//! reads the process environment for settings (credentials are read by adapters at execution
//! time, by name from the deployment file).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// Which storage and messaging implementations to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Everything in this process; nothing survives a restart.
    Memory,
    /// NATS JetStream for jobs and events, Redis for idempotency keys.
    Nats,
}

/// Settings common to both binaries.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Deployment file (JSON). Without it, the mock provider alone is configured.
    #[arg(long, env = "MODEL_RUNTIME_CONFIG")]
    pub config: Option<PathBuf>,
    /// Storage and messaging backend.
    #[arg(
        long,
        env = "MODEL_RUNTIME_BACKEND",
        value_enum,
        default_value = "memory"
    )]
    pub backend: BackendKind,
    /// NATS server with JetStream (backend nats): `nats://` or `tls://`, comma-separated for a
    /// cluster; `user:password@` or `token@` in the URL authenticate.
    #[arg(
        long,
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        hide_env_values = true
    )]
    pub nats_url: String,
    /// Credentials and TLS for NATS.
    #[command(flatten)]
    pub nats_access: NatsAccessArgs,
    /// Redis for idempotency keys (backend nats): `redis://[user:password@]host:port` or
    /// `rediss://` for TLS.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,
    /// CA certificate file (PEM) Redis's server certificate must chain to (`rediss://`);
    /// without it, the system's roots.
    #[arg(long, env = "REDIS_CA")]
    pub redis_ca: Option<PathBuf>,
    /// Replicas of every JetStream stream and bucket (1-5), applied on creation and reconciled
    /// at startup; 3 on a 3-node cluster survives the loss of any one node.
    #[arg(long, env = "MODEL_RUNTIME_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: u8,
    /// Partitions the jobs and event logs of a new namespace are spread over (1-64; default
    /// 1): each has its own jobs stream, workers' consumer and events stream. Fixed when the
    /// namespace is created: left out, a process uses the namespace's count; given and
    /// different from it, the process refuses to start.
    #[arg(long, env = "MODEL_RUNTIME_PARTITIONS",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub partitions: Option<u16>,
    /// Tenant lanes per partition of a new namespace (1-64; default 8): each tenant's jobs
    /// wait in its lane (a hash of its name), and workers serve the lanes in turn, so one
    /// tenant's backlog never holds back another's executions. 1: first come, first served.
    /// Fixed when the namespace is created, like `--partitions`.
    #[arg(long, env = "MODEL_RUNTIME_TENANT_LANES",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub tenant_lanes: Option<u16>,
    /// The earlier name of `--partitions` (when partitions held only event logs).
    #[arg(long, env = "MODEL_RUNTIME_EVENT_SHARDS", hide = true,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub event_shards: Option<u16>,
    /// Prefix of every stream, consumer, subject and Redis key.
    #[arg(long, env = "MODEL_RUNTIME_NAMESPACE", default_value = "mrt", value_parser = parse_namespace)]
    pub namespace: String,
    /// Optional cap on concurrent executions per process. Without it the providers' capacity
    /// decides (the sum of their `max_concurrency`, at most `max_active_executions`), never
    /// the core count.
    #[arg(long, env = "MODEL_RUNTIME_WORKERS", value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub workers: Option<u32>,
    /// Milliseconds in-flight work may take to finish after SIGTERM/SIGINT.
    #[arg(long, env = "MODEL_RUNTIME_SHUTDOWN_GRACE_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub shutdown_grace_ms: u64,
    /// Lease of a job delivery in milliseconds (backend nats): a worker silent for this long
    /// is presumed lost and its job is redelivered. Running executions heartbeat at a third
    /// of it.
    #[arg(long, env = "MODEL_RUNTIME_ACK_WAIT_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1000..=3_600_000))]
    pub ack_wait_ms: u64,
    /// Log format on stderr: `text` or `json`.
    #[arg(long, env = "MODEL_RUNTIME_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// NATS credentials and TLS, the names of the NATS tools. Secrets (`NATS_PASSWORD`,
/// `NATS_TOKEN`) come from the environment only, never from a flag: a command line is visible
/// to every local user. Files (creds, nkey seed, certificates) are named by path.
#[derive(Debug, Clone, Default, Args)]
pub struct NatsAccessArgs {
    /// NATS user; the password comes from `NATS_PASSWORD`.
    #[arg(long, env = "NATS_USER")]
    pub nats_user: Option<String>,
    /// `NATS_PASSWORD` (environment only).
    #[arg(skip = Secret::from_env("NATS_PASSWORD"))]
    pub nats_password: Option<Secret>,
    /// `NATS_TOKEN` (environment only).
    #[arg(skip = Secret::from_env("NATS_TOKEN"))]
    pub nats_token: Option<Secret>,
    /// NATS credentials file (`.creds`: user JWT and nkey seed).
    #[arg(long, env = "NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// File holding an nkey seed (`SU...`) of an nkey user.
    #[arg(long, env = "NATS_NKEY")]
    pub nats_nkey: Option<PathBuf>,
    /// CA certificate file (PEM) the NATS server certificate must chain to; implies TLS.
    #[arg(long, env = "NATS_CA")]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate file (PEM) for NATS TLS (with `--nats-key`); implies TLS.
    #[arg(long, env = "NATS_CERT")]
    pub nats_cert: Option<PathBuf>,
    /// Private key file (PEM) of the client certificate.
    #[arg(long, env = "NATS_KEY")]
    pub nats_key: Option<PathBuf>,
}

/// A secret read from the environment: `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The variable's value; unset or empty is `None`.
    pub fn from_env(name: &str) -> Option<Self> {
        std::env::var(name).ok().filter(|v| !v.is_empty()).map(Self)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl CommonArgs {
    /// The operator's cap on concurrent executions (`--workers`), if any; the providers'
    /// capacity decides the rest (`worker::capacity`).
    pub fn workers_cap(&self) -> Option<usize> {
        self.workers.map(|n| n as usize)
    }

    /// The partition count asked for (`--partitions`, or its earlier name `--event-shards`);
    /// `None`: the namespace's. Both given and different is an error naming both.
    pub fn partitions(&self) -> Result<Option<u16>, String> {
        match (self.partitions, self.event_shards) {
            (Some(p), Some(e)) if p != e => Err(format!(
                "--partitions {p} and --event-shards {e} disagree (--event-shards is the \
                 earlier name of --partitions; give one)"
            )),
            (p, e) => Ok(p.or(e)),
        }
    }

    pub fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    /// Whether log lines are JSON (`--log-format json`).
    pub fn json_logs(&self) -> bool {
        self.log_format == LogFormat::Json
    }
}

/// Namespaces become parts of stream names, subjects and keys: 1-32 of `[A-Za-z0-9_-]`.
fn parse_namespace(s: &str) -> Result<String, String> {
    let ok = (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(s.to_owned())
    } else {
        Err("namespace must be 1-32 characters of A-Z a-z 0-9 _ -".into())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse(args: &[&str]) -> CommonArgs {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .unwrap()
            .common
    }

    #[test]
    fn partitions_take_either_name_and_refuse_two_that_disagree() {
        assert_eq!(parse(&[]).partitions().unwrap(), None);
        assert_eq!(parse(&["--partitions", "4"]).partitions().unwrap(), Some(4));
        assert_eq!(
            parse(&["--event-shards", "3"]).partitions().unwrap(),
            Some(3)
        );
        let both = ["--partitions", "4", "--event-shards", "4"];
        assert_eq!(parse(&both).partitions().unwrap(), Some(4));
        let message = parse(&["--partitions", "4", "--event-shards", "2"])
            .partitions()
            .unwrap_err();
        assert!(message.contains("--partitions 4") && message.contains("--event-shards 2"));
    }

    #[test]
    fn workers_is_only_a_cap_and_never_zero() {
        assert_eq!(parse(&[]).workers_cap(), None);
        assert_eq!(parse(&["--workers", "8"]).workers_cap(), Some(8));
        let zero = Cli::try_parse_from(["test", "--workers", "0"]).unwrap_err();
        assert!(zero.to_string().contains("--workers"), "{zero}");
    }
}
