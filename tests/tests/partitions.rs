//! Network partitions (docs/partitions.md) with real processes: a three-node NATS JetStream
//! cluster, a gateway and a worker, each in its own network namespace on one bridge, Redis on
//! the bridge's host side. A partition is a pair of blackhole routes per cut link (this kernel
//! has no netem and no iptables), so a cut-off server stays up and keeps its client
//! connections: exactly what a partition looks like to a client, unlike a kill.
//!
//! Under a closed loop of keyed submits (each client retries a 503 with the same key, as the
//! 503's hint says), three cuts of 20 s each, one after the other:
//! 0. a NATS node none of the processes is connected to (the meta leader when it is such a
//!    node) is cut off from the other two: leaders move while the clients stay;
//! 1. the NATS node the gateway is connected to is cut off from the other two (its clients keep
//!    their connections to a server that has no JetStream quorum);
//! 2. the worker is cut off from all three nodes.
//!
//! Audited afterwards, from the stored logs read through the gateway:
//! - every submit is answered (202, 200 replay, or 503 `unavailable`) within 2 s;
//! - after the gateway's node is cut off, a fresh submit succeeds within 15 s (the gateway moves
//!   to a server with the quorum: `runtime::nats::quorum`);
//! - every accepted execution is terminal within lease + heal + 10 s of the last heal, and none
//!   failed as "worker stopped heartbeating" (the one worker never stops);
//! - every log is 1..n without gap, with exactly one terminal event, last, and at most one
//!   `route.selected` (the mock provider runs in the worker: a second route selection would be a
//!   second provider call);
//! - every acceptance of one key names one execution.
//!
//! Needs root (network namespaces); without it the test prints why and passes without running.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e_tests::*;
use serde_json::{Value, json};
use testkit::{KillOnDrop, TempDir, unique_namespace};
use tokio::sync::Mutex;

/// How long a submit may take, partition or not (contract section 8).
const SUBMIT_BOUND: Duration = Duration::from_secs(2);
/// How soon after a cut of the gateway's node fresh submits must succeed again.
const RECOVERY_BOUND: Duration = Duration::from_secs(15);
/// How long each cut lasts.
const CUT: Duration = Duration::from_secs(20);
/// The job lease the worker runs with.
const LEASE: Duration = Duration::from_secs(5);
/// Concurrent clients in the closed loop.
const CLIENTS: usize = 8;
/// How long a status read may go unanswered before the test calls it lost: far above the
/// gateway's own bounds (each store request 1.5 s, a long log's read 3 s between events), so
/// only a read that hangs fails.
const READ_BOUND: Duration = Duration::from_secs(30);

/// Runs `ip` with `args`; `Err` with its stderr when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A bridge in this namespace and network namespaces attached to it, removed on drop.
struct Net {
    bridge: String,
    /// `10.{a}.{b}`: this net's /24.
    prefix: String,
    namespaces: Vec<String>,
}

impl Net {
    /// A bridge with address `{prefix}.1`; `None` (with the reason) where namespaces cannot be
    /// made.
    fn new() -> Result<Self, String> {
        let pid = std::process::id();
        let tag = format!("{:x}", pid % 0xffff);
        let prefix = format!("10.{}.{}", 100 + (pid % 100), (pid / 100) % 250);
        let net = Self {
            bridge: format!("mrtb{tag}"),
            prefix,
            namespaces: Vec::new(),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", net.prefix),
            "dev",
            &net.bridge,
        ])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// Adds namespace number `n` (address `{prefix}.{10 + n}`); returns its name and address.
    fn add(&mut self, n: u8) -> Result<(String, String), String> {
        let name = format!("{}-{n}", self.bridge);
        let addr = format!("{}.{}", self.prefix, 10 + u16::from(n));
        let (outer, inner) = (
            format!("{}o{n}", self.bridge),
            format!("{}i{n}", self.bridge),
        );
        ip(&["netns", "add", &name])?;
        self.namespaces.push(name.clone());
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ])?;
        ip(&["link", "set", &outer, "master", &self.bridge])?;
        ip(&["link", "set", &outer, "up"])?;
        ip(&["link", "set", &inner, "netns", &name])?;
        let exec = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        exec(&["addr", "add", &format!("{addr}/24"), "dev", &inner])?;
        exec(&["link", "set", &inner, "up"])?;
        exec(&["link", "set", "lo", "up"])?;
        Ok((name, addr))
    }

    /// Cuts (`true`) or heals the link between namespace `a` (address `a_addr`) and `b_addr`,
    /// in `a`'s direction: a blackhole route for `b_addr` in `a`.
    fn blackhole(a: &str, b_addr: &str, cut: bool) {
        let verb = if cut { "add" } else { "del" };
        ip(&[
            "netns",
            "exec",
            a,
            "ip",
            "route",
            verb,
            "blackhole",
            &format!("{b_addr}/32"),
        ])
        .unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for name in &self.namespaces {
            let _ = ip(&["netns", "del", name]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// One NATS node in its namespace.
struct Node {
    ns: String,
    addr: String,
    _child: KillOnDrop,
}

/// Our binary `name` (gateway or worker) with `args` and `env`, run in network namespace `ns`.
fn in_namespace(ns: &str, name: &str, args: &[&str], env: &[(String, String)]) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ns])
        .arg(binary(name))
        .args(args)
        .env_clear()
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)));
    command
}

/// What one submit got.
#[derive(Debug, Clone)]
struct Answer {
    at: Instant,
    took: Duration,
    status: u16,
    key: String,
    id: Option<String>,
}

/// A status read of the closed loop that got no answer.
#[derive(Debug, Clone)]
struct ReadFailure {
    at: Instant,
    took: Duration,
    why: String,
}

/// The closed loop: each client submits with a fresh key, retrying a 503 with the same key,
/// until `stop`; after each acceptance it reads the execution's status until it has ended.
async fn clients(
    base: String,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    reads_failed: Arc<Mutex<Vec<ReadFailure>>>,
) {
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (base, stop, answers, reads_failed) = (
            base.clone(),
            Arc::clone(&stop),
            Arc::clone(&answers),
            Arc::clone(&reads_failed),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let key = format!("c{c}-{n}");
                loop {
                    let started = Instant::now();
                    let sent = client()
                        .post(format!("{base}/v1/executions"))
                        .header("Idempotency-Key", &key)
                        .json(&json!({"ability": "text-generation",
                            "input": [{"type": "text", "text": key.clone()}]}))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    let took = started.elapsed();
                    let (status, body) = match sent {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
                        }
                        Err(_) => (0, Value::Null),
                    };
                    let id = body["execution_id"].as_str().map(str::to_owned);
                    answers.lock().await.push(Answer {
                        at: started,
                        took,
                        status,
                        key: key.clone(),
                        id: id.clone(),
                    });
                    if status == 503 && !stop.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    // Closed loop: the next submit once this execution has ended (or a
                    // minute has passed; the audit says why).
                    if let (Some(id), 200 | 202) = (id, status) {
                        let until = Instant::now() + Duration::from_secs(60);
                        while Instant::now() < until {
                            let url = format!("{base}/v1/executions/{id}");
                            let asked = Instant::now();
                            let snapshot = match client().get(&url).timeout(READ_BOUND).send().await
                            {
                                Ok(resp) => resp.json::<Value>().await.unwrap_or(Value::Null),
                                Err(e) => {
                                    reads_failed.lock().await.push(ReadFailure {
                                        at: asked,
                                        took: asked.elapsed(),
                                        why: error_chain(&e),
                                    });
                                    Value::Null
                                }
                            };
                            if matches!(
                                snapshot["status"].as_str(),
                                Some("succeeded" | "failed" | "cancelled")
                            ) {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                    break;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Fresh submits (a new key each) every 500 ms until `stop`, not waiting for their executions:
/// how soon submits succeed again after a cut.
async fn prober(base: String, stop: Arc<AtomicBool>, answers: Arc<Mutex<Vec<Answer>>>) {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let key = format!("probe-{n}");
        let started = Instant::now();
        let (status, body) = submit(&base, &text_request(&key), Some(&key)).await;
        answers.lock().await.push(Answer {
            at: started,
            took: started.elapsed(),
            status,
            key,
            id: body["execution_id"].as_str().map(str::to_owned),
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When `at` was, relative to the latest phase that had begun by then ("3.2 s into cut 1").
fn phase_of(phases: &[(Instant, &str)], at: Instant) -> String {
    match phases.iter().rev().find(|(start, _)| *start <= at) {
        Some((start, name)) => format!(
            "{:.1} s into {name}",
            at.duration_since(*start).as_secs_f64()
        ),
        None => "before the load".to_owned(),
    }
}

/// The index of the node that leads the JetStream meta group, by the nodes' `/jsz`.
async fn meta_leader(nodes: &[Node]) -> Option<usize> {
    for node in nodes {
        let url = format!("http://{}:8222/jsz", node.addr);
        let Ok(resp) = client().get(&url).send().await else {
            continue;
        };
        let jsz: Value = resp.json().await.unwrap_or(Value::Null);
        if let Some(leader) = jsz["meta_cluster"]["leader"].as_str() {
            return leader.strip_prefix("node").and_then(|i| i.parse().ok());
        }
    }
    None
}

/// Cuts (or heals) node `i` off from the other nodes, both ways; its clients keep it.
fn isolate(nodes: &[Node], i: usize, cut: bool) {
    for (o, other) in nodes.iter().enumerate() {
        if o != i {
            Net::blackhole(&nodes[i].ns, &other.addr, cut);
            Net::blackhole(&other.ns, &nodes[i].addr, cut);
        }
    }
}

/// The node (index) a connection of `namespace` from `from_addr` is held by, by the nodes'
/// `/connz`.
async fn node_of(nodes: &[Node], namespace: &str, from_addr: &str) -> Option<usize> {
    for (i, node) in nodes.iter().enumerate() {
        let url = format!("http://{}:8222/connz?limit=1024", node.addr);
        let Ok(resp) = client().get(&url).send().await else {
            continue;
        };
        let connz: Value = resp.json().await.unwrap_or(Value::Null);
        let held = connz["connections"].as_array().is_some_and(|conns| {
            conns.iter().any(|c| {
                c["ip"].as_str() == Some(from_addr)
                    && c["name"]
                        .as_str()
                        .is_some_and(|n| n == format!("model-runtime-{namespace}"))
            })
        });
        if held {
            return Some(i);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_keep_every_execution_live_and_every_submit_prompt() {
    let mut net = match Net::new() {
        Ok(net) => net,
        Err(why) => {
            eprintln!(
                "SKIPPED partitions: network namespaces cannot be made here ({why}); run as root on Linux"
            );
            return;
        }
    };
    let dir = TempDir::new("mrt-partitions-");
    let nats = testkit::nats_server_binary();
    // Three NATS nodes.
    let mut addrs = Vec::new();
    let mut names = Vec::new();
    for n in 1..=3u8 {
        let (name, addr) = net.add(n).unwrap();
        names.push(name);
        addrs.push(addr);
    }
    let mut nodes = Vec::new();
    for (i, (ns, addr)) in names.iter().zip(&addrs).enumerate() {
        let routes: Vec<String> = addrs
            .iter()
            .filter(|a| *a != addr)
            .map(|a| format!("nats://{a}:6222"))
            .collect();
        let store = dir.path().join(format!("n{i}"));
        let log = std::fs::File::create(dir.path().join(format!("nats-{i}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&nats)
            .args(["-a", addr, "-p", "4222", "-m", "8222", "-js", "-n"])
            .arg(format!("node{i}"))
            .arg("-sd")
            .arg(&store)
            .args(["--cluster_name", "mrt", "--cluster"])
            .arg(format!("nats://{addr}:6222"))
            .arg("--routes")
            .arg(routes.join(","))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server");
        nodes.push(Node {
            ns: ns.clone(),
            addr: addr.clone(),
            _child: KillOnDrop(child),
        });
    }
    // Redis on the bridge's host side, open to the namespaces (no protected mode).
    let redis_port = testkit::free_port();
    let host = format!("{}.1", net.prefix);
    let _redis = KillOnDrop(
        Command::new(std::env::var("MRT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
            .args(["--bind", &host, "--port", &redis_port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    let (gw_ns, gw_addr) = net.add(4).unwrap();
    let (wk_ns, wk_addr) = net.add(5).unwrap();
    let namespace = unique_namespace("part");
    let config = dir.path().join("deployment.json");
    // Five chunks 400 ms apart: an execution lasts about two seconds.
    std::fs::write(&config, chunked_mock(400, 5).to_string()).unwrap();
    let nats_url = addrs
        .iter()
        .map(|a| format!("nats://{a}:4222"))
        .collect::<Vec<_>>()
        .join(",");
    let env: Vec<(String, String)> = [
        ("MODEL_RUNTIME_BACKEND", "nats".to_owned()),
        ("NATS_URL", nats_url),
        ("REDIS_URL", format!("redis://{host}:{redis_port}")),
        ("MODEL_RUNTIME_NAMESPACE", namespace.clone()),
        ("MODEL_RUNTIME_CONFIG", config.display().to_string()),
        ("MODEL_RUNTIME_REPLICAS", "3".to_owned()),
        ("MODEL_RUNTIME_ACK_WAIT_MS", LEASE.as_millis().to_string()),
        ("MODEL_RUNTIME_ADMIN_PORT", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let gateway_args = ["--host", gw_addr.as_str(), "--port", "0"];
    let gateway = in_namespace(&gw_ns, "gateway", &gateway_args, &env);
    let (gateway, line) = spawn_command(gateway, "gateway", "listening on ", &dir);
    let base = line.trim_start_matches("listening on ").trim().to_owned();
    let worker = in_namespace(&wk_ns, "worker", &[], &env);
    let (worker, _) = spawn_command(worker, "worker", "worker started", &dir);

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let reads_failed = Arc::new(Mutex::new(Vec::new()));
    let mut phases: Vec<(Instant, &str)> = vec![(Instant::now(), "the load")];
    let load = tokio::spawn(clients(
        base.clone(),
        Arc::clone(&stop),
        Arc::clone(&answers),
        Arc::clone(&reads_failed),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Cut 0: a node holding none of the processes' connections, the meta leader if it is
    // one, from the other two (leaders elsewhere are elected while the clients stay put).
    let gw_node = node_of(&nodes, &namespace, &gw_addr).await;
    let wk_node = node_of(&nodes, &namespace, &wk_addr).await;
    let clientless: Vec<usize> = (0..3)
        .filter(|i| Some(*i) != gw_node && Some(*i) != wk_node)
        .collect();
    let leader = meta_leader(&nodes).await;
    let leader_cut = match leader {
        Some(l) if clientless.contains(&l) => Some(l),
        _ => clientless.first().copied(),
    };
    match leader_cut {
        Some(i) => {
            phases.push((Instant::now(), "cut 0 (a clientless node)"));
            isolate(&nodes, i, true);
            tokio::time::sleep(CUT).await;
            isolate(&nodes, i, false);
            phases.push((Instant::now(), "after cut 0"));
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        None => eprintln!("partitions: every node holds a connection; the leader cut is skipped"),
    }

    // Cut 1: the gateway's node from the other two.
    let cut_node = node_of(&nodes, &namespace, &gw_addr)
        .await
        .expect("the gateway's NATS node");
    let set_cut = |cut: bool| isolate(&nodes, cut_node, cut);
    let probing = Arc::new(AtomicBool::new(false));
    let probes = tokio::spawn(prober(
        base.clone(),
        Arc::clone(&probing),
        Arc::clone(&answers),
    ));
    let cut_at = Instant::now();
    phases.push((cut_at, "cut 1 (the gateway's node)"));
    set_cut(true);
    tokio::time::sleep(CUT).await;
    set_cut(false);
    phases.push((Instant::now(), "after cut 1"));
    probing.store(true, Ordering::SeqCst);
    probes.await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Cut 2: the worker from every node.
    phases.push((Instant::now(), "cut 2 (the worker)"));
    for node in &nodes {
        Net::blackhole(&wk_ns, &node.addr, true);
        Net::blackhole(&node.ns, &wk_addr, true);
    }
    tokio::time::sleep(CUT).await;
    for node in &nodes {
        Net::blackhole(&wk_ns, &node.addr, false);
        Net::blackhole(&node.ns, &wk_addr, false);
    }
    let healed_at = Instant::now();
    phases.push((healed_at, "after cut 2"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();

    let answers = answers.lock().await.clone();
    let logs = || {
        format!(
            "gateway:\n{}\nworker:\n{}",
            gateway.log_text(),
            worker.log_text()
        )
    };
    if let Some(slowest) = answers.iter().max_by_key(|a| a.took) {
        eprintln!(
            "partitions: the slowest submit took {:?} {}: {slowest:?}",
            slowest.took,
            phase_of(&phases, slowest.at)
        );
    }
    // Every status read was answered (a 503 is an answer).
    if let Some(f) = reads_failed.lock().await.first() {
        panic!(
            "a status read got no answer after {:?}, {}: {}\n{}",
            f.took,
            phase_of(&phases, f.at),
            f.why,
            logs()
        );
    }
    // Every submit answered within the bound, with 202, 200 or 503.
    for a in &answers {
        assert!(
            matches!(a.status, 200 | 202 | 503),
            "a submit got {}: {a:?}",
            a.status
        );
        assert!(
            a.took <= SUBMIT_BOUND,
            "a submit took {:?} {}: {a:?}\n{}",
            a.took,
            phase_of(&phases, a.at),
            logs()
        );
    }
    // Fresh submits succeed again within the bound after the gateway's node was cut off:
    // every probe made from then until the heal was accepted.
    let late_probes: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.key.starts_with("probe-") && a.at >= cut_at + RECOVERY_BOUND)
        .collect();
    assert!(!late_probes.is_empty(), "no probe after the recovery bound");
    for a in &late_probes {
        assert_eq!(
            a.status,
            202,
            "a fresh submit {:?} after the cut was refused: {a:?}\n{}",
            a.at.duration_since(cut_at),
            logs()
        );
    }
    // One execution per key.
    let mut by_key: HashMap<&str, &str> = HashMap::new();
    for a in answers.iter().filter(|a| matches!(a.status, 200 | 202)) {
        let id = a.id.as_deref().expect("an execution id");
        let bound = by_key.entry(&a.key).or_insert(id);
        assert_eq!(*bound, id, "key {} named two executions", a.key);
    }
    // Every accepted execution is terminal within lease + heal + 10 s.
    let open_until = healed_at + LEASE + Duration::from_secs(10);
    tokio::time::sleep(open_until.saturating_duration_since(Instant::now())).await;
    let mut audited = 0;
    for id in by_key.values() {
        let (status, snapshot) = get_json(&format!("{base}/v1/executions/{id}")).await;
        assert_eq!(status, 200, "{snapshot}");
        assert!(
            matches!(
                snapshot["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ),
            "execution {id} still open {:?} after the heal: {snapshot}\n{}",
            healed_at.elapsed(),
            logs()
        );
        // The one worker never stopped: no failure may say it did.
        let message = snapshot["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("stopped heartbeating"),
            "execution {id} failed as if its worker had stopped: {snapshot}\n{}",
            logs()
        );
        let log = events(&base, id, 0).await;
        assert_log_well_formed(&log);
        let routed = log.iter().filter(|e| e["type"] == "route.selected").count();
        assert!(
            routed <= 1,
            "execution {id} called its provider twice: {log:?}"
        );
        audited += 1;
    }
    let timeline: Vec<String> = answers
        .iter()
        .filter(|a| a.key.starts_with("probe-"))
        .map(|a| {
            format!(
                "{:.1}s:{}",
                a.at.duration_since(cut_at).as_secs_f64(),
                a.status
            )
        })
        .collect();
    eprintln!("probes after the cut: {}", timeline.join(" "));
    let refused = answers.iter().filter(|a| a.status == 503).count();
    let moved = |p: &Process| {
        p.log_text()
            .matches("cannot reach the JetStream quorum")
            .count()
    };
    eprintln!(
        "partitions: {} submits ({refused} answered 503), {audited} executions audited; node \
         {leader_cut:?} cut off (meta leader: {leader:?}); gateway's \
         node n{cut_node} cut off, connections moved: gateway {}, worker {}; then the worker \
         cut off",
        answers.len(),
        moved(&gateway),
        moved(&worker),
    );
    drop(net);
}
