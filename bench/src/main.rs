//! `bench`: load generator and benchmark harness for the gateway.
//!
//! Modes (`--mode`):
//! - `closed` (default): `--concurrency` clients, each submits, reads the full SSE stream to the
//!   terminal event, and repeats. Reports executions/s with a full SSE read per execution.
//! - `open`: arrivals at a fixed `--rate`; every latency is measured from the arrival's
//!   *scheduled* time, so a slow server cannot hide queueing (no coordinated omission).
//! - `submit`: `POST /v1/executions` then the next one, no SSE: submit latency alone.
//!
//! Latencies go into HdrHistograms (p50/p90/p99/p99.9/max): submit (POST → 202 read), first
//! `output.delta`, terminal event. Throughput is also reported per `--window` (5 s), so one can
//! see whether the last window keeps up with the first. `--spawn` starts the gateway itself with
//! a generated mock deployment on port 0 and reports its RSS (`VmRSS`) and CPU from `/proc`.
//!
//! `--spawn --backend nats` also starts the distributed stack (nats-server or a cluster of them,
//! Redis, worker processes: see `servers`), reports every process's CPU and the JetStream
//! messages stored per execution. `--mock-chunks N --mock-delay-ms D` make the mock a token
//! stream, and the report then shows the added time per delta. `--out DIR` writes the JSON
//! report and SVG charts; `bench plot` draws charts from several reports (before/after), and
//! `bench scaling` a table and charts of throughput against each setting of a scaling matrix.
//!
//! The client is one tokio runtime and one pooled `reqwest` client; on a small machine the
//! harness and the gateway share the cores, and the report shows how much CPU each used.
//! See BENCHMARKS.md at the repository root for results and exact commands.

mod client;
mod plot;
mod profile;
mod raw;
mod report;
mod run;
mod scaling;
mod servers;
mod spawn;
mod stats;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;

use crate::client::{Api, StreamMode};
use crate::report::{GatewayReport, JetStreamReport, Params, Report, Setup};
use crate::run::{Load, Mode, Plan};
use crate::servers::{Stack, StackPlan, StreamCounts};
use crate::spawn::{MockDeployment, SpawnedGateway, StreamLimits, clock_ticks};

/// The subcommands: baselines that do not go through the gateway, and charts.
#[derive(Debug, clap::Subcommand)]
enum Command {
    #[command(flatten)]
    Raw(raw::Command),
    /// SVG charts from JSON reports (`--json-out` / `--out`), e.g. before and after a change.
    Plot(plot::PlotArgs),
    /// The verdict on an issue's targets (14: token streams, from group a; 31: scale-out, from
    /// group t), one report directory per round.
    Targets(targets::TargetsArgs),
    /// Throughput against worker processes, partitions, gateways and NATS nodes: a table and
    /// SVG charts from the reports of a scaling matrix (`scripts/bench-all.sh` group s).
    Scaling(scaling::ScalingArgs),
}

/// Where the executions run with `--spawn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Backend {
    /// The gateway alone, memory backend (executions run inside it).
    Embedded,
    /// The harness also starts nats-server (or a cluster), Redis and worker processes.
    Nats,
}

/// Benchmark harness for the gateway.
#[derive(Debug, Parser)]
#[command(name = "bench", version, about, args_conflicts_with_subcommands = true)]
struct Args {
    /// A baseline that does not go through the gateway, `plot` or `targets` (see `bench help <subcommand>`).
    #[command(subcommand)]
    command: Option<Command>,
    /// closed: N clients submit→full SSE read→repeat; open: fixed arrival rate; submit: POST only.
    #[arg(long, value_enum, default_value = "closed")]
    mode: Mode,
    /// Gateway base URL (ignored with --spawn).
    #[arg(
        long,
        env = "MODEL_RUNTIME_URL",
        default_value = "http://127.0.0.1:4320"
    )]
    url: String,
    /// Concurrent clients (closed and submit modes).
    #[arg(long, short = 'c', default_value_t = 1)]
    concurrency: usize,
    /// Arrivals per second (open mode).
    #[arg(long)]
    rate: Option<f64>,
    /// Measured duration in seconds. Default 60, or unlimited when --executions is given.
    #[arg(long)]
    duration: Option<f64>,
    /// Stop after this many executions (submits in submit mode), warm-up included.
    #[arg(long)]
    executions: Option<u64>,
    /// Seconds of load before measuring starts (not recorded).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Closed and submit modes: spread the clients' starts evenly over this many seconds
    /// (at most --warmup), so their cycles do not run in step. Executions of nearly equal
    /// length keep clients that started together in step for the whole run: every cycle
    /// then begins with all of them submitting at once. One execution's length spreads them
    /// evenly.
    #[arg(long, default_value_t = 0.0)]
    ramp_up: f64,
    /// Reporting window for per-window throughput, seconds.
    #[arg(long, default_value_t = 5.0)]
    window: f64,
    /// get: POST (202) then GET /events; inline: POST with Accept: text/event-stream.
    #[arg(long, value_enum, default_value = "get")]
    stream: StreamMode,
    /// Open mode: arrivals beyond this many in flight are shed (and counted).
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,
    /// Per-execution timeout, seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Tokio worker threads of the harness (default: the number of cores).
    #[arg(long)]
    client_threads: Option<usize>,
    /// Print the JSON report on stdout (the human report then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// No per-window progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Start the gateway: generated deployment file in a temp dir, port 0, RSS read at the end.
    #[arg(long)]
    spawn: bool,
    /// Gateway binary for --spawn.
    #[arg(long, default_value = "target/release/gateway")]
    gateway_bin: PathBuf,
    /// --spawn: use this deployment file instead of generating one.
    #[arg(long)]
    config: Option<PathBuf>,
    /// --spawn: extra gateway argument (repeatable), e.g. --gateway-arg=--workers=8.
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    gateway_args: Vec<String>,
    /// --spawn: write the gateway's stderr (logs) here; discarded otherwise.
    #[arg(long)]
    gateway_log: Option<PathBuf>,
    /// Generated config: mock delay before each chunk, ms (the provider's gap between deltas).
    #[arg(long, visible_alias = "mock-delay-ms", default_value_t = 0)]
    delay_ms: u64,
    /// Generated config: number of mock chunks (default: the mock's three).
    #[arg(long, visible_alias = "mock-chunks")]
    chunks: Option<usize>,
    /// --spawn: embedded (gateway alone) or nats (the harness also starts nats-server, Redis and
    /// workers, on free ports, under a namespace of its own, all stopped on exit).
    #[arg(long, value_enum, default_value = "embedded")]
    backend: Backend,
    /// --backend nats: worker binary.
    #[arg(long, default_value = "target/release/worker")]
    worker_bin: PathBuf,
    /// --backend nats: worker processes.
    #[arg(long, default_value_t = 1)]
    worker_procs: usize,
    /// --backend nats: runtime threads of each worker process (its `TOKIO_WORKER_THREADS`;
    /// default: one per core, each process its own, so several workers on one machine run
    /// more threads than it has cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,
    /// --backend nats: gateway processes (each execution goes to the next in turn, its events
    /// read from the gateway it was submitted to).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    gateways: u16,
    /// Concurrent executions per executing process: the gateway's `--workers` in embedded mode,
    /// each worker's `--workers` in nats mode. Default: the binary's own in embedded mode,
    /// max(concurrency, 64) per worker in nats mode.
    #[arg(long)]
    exec_slots: Option<usize>,
    /// --backend nats: nodes of the NATS cluster (1: a single server).
    #[arg(long, default_value_t = 1)]
    nats_cluster: usize,
    /// --backend nats: replicas of every stream and the bucket (gateway and workers `--replicas`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    replicas: u8,
    /// --backend nats: JetStream `sync_interval` of every node (`always`, or a duration like
    /// `2m`); the server's default when unset.
    #[arg(long)]
    sync_interval: Option<String>,
    /// --backend nats: turn nats-server's subscription match cache off (`no_sublist_cache`;
    /// on in `deploy/nats/nats.conf`, the server's default): fewer lock waits at a few messages
    /// per execution, a collapse with thousands of live readers (BENCHMARKS.md, "The
    /// subscription match cache").
    #[arg(long)]
    nats_no_sublist_cache: bool,
    /// --backend nats: nats-server binary (default: MRT_NATS_SERVER, the pip-installed one, PATH).
    #[arg(long)]
    nats_server: Option<PathBuf>,
    /// --spawn: keep every spawned process's log in this directory (`gateway.log`, ...).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// --spawn: profile the processes after the warm-up into this directory: nats-server's Go
    /// CPU and block profiles, `perf` of the gateways and workers where perf runs (see
    /// `bench/src/profile.rs`). Profiling slows the run: its figures are not comparable.
    #[arg(long)]
    profile_dir: Option<PathBuf>,
    /// Write `LABEL.json` and SVG charts of this run into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The configuration's name in the report, file names and charts (default: derived from
    /// the options, e.g. `nats-c256-100x10ms`).
    #[arg(long)]
    label: Option<String>,
    /// Width of the throughput timeline's buckets, seconds.
    #[arg(long, default_value_t = 1.0)]
    timeline_bucket: f64,
    /// Generated config: provider max_concurrency.
    #[arg(long, default_value_t = 256)]
    provider_concurrency: u32,
    /// Generated config: provider max_queue_depth.
    #[arg(long, default_value_t = 4096)]
    provider_queue_depth: u32,
    /// Generated config: max_active_executions.
    #[arg(long, default_value_t = 4096)]
    max_active_executions: usize,
    /// The ability to request.
    #[arg(long, default_value = "text-generation")]
    ability: String,
    /// The prompt text.
    #[arg(long, default_value = "hi")]
    prompt: String,
    /// The request's `deadline_ms` (the deployment's default when unset): short deadlines put
    /// the deadline sweepers' checks of every execution inside the measured window.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Send `Idempotency-Key: {this}-{n}`, unique per submit (puts the idempotency store, Redis
    /// in nats mode, on the submit path).
    #[arg(long)]
    idempotency_prefix: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = validate(&args) {
        eprintln!("bench: {e}");
        return ExitCode::from(2);
    }
    // reqwest is built with rustls but without a default crypto provider (see Cargo.toml); the
    // harness only speaks plain HTTP, but the client builder needs one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let threads = args
        .client_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // On SIGINT/SIGTERM the run is dropped, and with it every process it started (each is
    // killed on drop) and their directories.
    let result = runtime.block_on(async {
        tokio::select! {
            result = bench(args, threads) => result,
            () = interrupted() => Err("interrupted; every process the harness started was stopped".into()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// Resolves on SIGINT or SIGTERM (never, if the handlers cannot be installed).
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

fn validate(args: &Args) -> Result<(), String> {
    if args.mode == Mode::Open && !args.rate.is_some_and(|r| r > 0.0) {
        return Err("--mode open needs --rate > 0".into());
    }
    for (name, v) in [
        ("--duration", args.duration.unwrap_or(1.0)),
        ("--window", args.window),
        ("--timeout", args.timeout),
        ("--timeline-bucket", args.timeline_bucket),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} must be a positive number of seconds"));
        }
    }
    if !(args.warmup.is_finite() && args.warmup >= 0.0) {
        return Err("--warmup must be >= 0".into());
    }
    if !(args.ramp_up.is_finite() && args.ramp_up >= 0.0) {
        return Err("--ramp-up must be >= 0".into());
    }
    if args.ramp_up > args.warmup {
        return Err(
            "--ramp-up must not exceed --warmup: clients still starting would be measured".into(),
        );
    }
    if args.ramp_up > 0.0 && args.mode == Mode::Open {
        return Err("--ramp-up applies to the closed and submit modes (open mode has its own arrival times)".into());
    }
    if args.executions == Some(0) {
        return Err("--executions must be at least 1".into());
    }
    if args.backend == Backend::Nats && !args.spawn {
        return Err("--backend nats starts its own stack: it needs --spawn".into());
    }
    if args.profile_dir.is_some() && !args.spawn {
        return Err(
            "--profile-dir profiles the processes the harness starts: it needs --spawn".into(),
        );
    }
    if args.nats_cluster == 0 || args.worker_procs == 0 {
        return Err("--nats-cluster and --worker-procs must be at least 1".into());
    }
    if usize::from(args.replicas) > args.nats_cluster && args.backend == Backend::Nats {
        return Err("--replicas cannot exceed the nodes of --nats-cluster".into());
    }
    if let Some(label) = &args.label
        && (label.is_empty()
            || !label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.=".contains(c)))
    {
        return Err("--label takes letters, digits and - _ . = only (it names files)".into());
    }
    Ok(())
}

/// The default `--label`: backend, concurrency (or rate), and the token stream's shape.
fn default_label(args: &Args) -> String {
    let backend = match (args.spawn, args.backend) {
        (false, _) => "external".to_string(),
        (true, Backend::Embedded) => "embedded".to_string(),
        (true, Backend::Nats) if args.nats_cluster > 1 => {
            format!("nats{}r{}", args.nats_cluster, args.replicas)
        }
        (true, Backend::Nats) => "nats".to_string(),
    };
    let backend = match args.gateways {
        1 => backend,
        n => format!("{backend}-g{n}"),
    };
    let load = match args.mode {
        Mode::Open => format!("open{}", args.rate.unwrap_or(0.0)),
        Mode::Submit => format!("submit-c{}", args.concurrency),
        Mode::Closed => format!("c{}", args.concurrency),
    };
    let chunks = args.chunks.unwrap_or(3);
    format!("{backend}-{load}-{chunks}x{}ms", args.delay_ms)
}

/// Raises the open-file soft limit to the hard limit (spawned processes inherit it) and returns
/// the limit now in force.
fn raise_nofile() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok().or_else(|| {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|l| l.0)
    })
}

/// The servers' subscription-list counters, or `None` (said on stderr) where a node's
/// monitoring endpoint does not answer: the report then leaves the figure out.
async fn sublists(monitors: &[String]) -> Option<servers::SublistCounts> {
    let http = reqwest::Client::new();
    match servers::sublist_counts(&http, monitors).await {
        Ok(counts) => Some(counts),
        Err(e) => {
            eprintln!("bench: no subscription-list counts: {e}");
            None
        }
    }
}

async fn bench(mut args: Args, threads: usize) -> Result<(), String> {
    match args.command.take() {
        Some(Command::Raw(cmd)) => return raw::run(cmd).await,
        Some(Command::Plot(a)) => return plot::run(&a),
        Some(Command::Targets(a)) => return targets::run(&a),
        Some(Command::Scaling(a)) => return scaling::run(&a),
        None => {}
    }
    let nofile = raise_nofile();
    let wanted = 2 * args.concurrency.max(args.max_in_flight.min(4096)) as u64 + 256;
    if let Some(limit) = nofile.filter(|l| *l < wanted) {
        eprintln!(
            "bench: warning: the open-file limit is {limit}, below the {wanted} this concurrency needs (raise the hard limit: ulimit -Hn)"
        );
    }
    let label = args.label.clone().unwrap_or_else(|| default_label(&args));
    let deployment = MockDeployment {
        delay_ms: args.delay_ms,
        chunks: args.chunks,
        max_concurrency: args.provider_concurrency,
        max_queue_depth: args.provider_queue_depth,
        max_active_executions: args.max_active_executions,
        streams: StreamLimits::needed(args.concurrency.max(args.max_in_flight.min(4096)), nofile),
    };
    let config_json = deployment.to_json();
    let exec_slots = match args.backend {
        Backend::Embedded => args.exec_slots,
        Backend::Nats => Some(args.exec_slots.unwrap_or(args.concurrency.max(64))),
    };
    let stack_plan = StackPlan {
        nats_server: args.nats_server.clone(),
        nats_nodes: args.nats_cluster,
        sync_interval: args.sync_interval.clone(),
        sublist_cache: !args.nats_no_sublist_cache,
        worker_bin: args.worker_bin.clone(),
        workers: args.worker_procs,
        worker_threads: args.worker_threads,
        worker_slots: exec_slots.unwrap_or(64),
        replicas: args.replicas,
        log_dir: args.log_dir.clone(),
        profiling: args.profile_dir.is_some(),
    };
    for dir in [&args.log_dir, &args.profile_dir].into_iter().flatten() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let probe = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let mut stack = if args.spawn && args.backend == Backend::Nats {
        let stack = Stack::start(&stack_plan, &probe).await?;
        if !args.quiet {
            eprintln!(
                "bench: started {} nats node(s) at {}, redis at {}, namespace {}",
                stack.nats_urls.len(),
                stack.nats_url(0),
                stack.redis_url,
                stack.namespace
            );
        }
        Some(stack)
    } else {
        None
    };
    let mut gateway_args = stack
        .as_ref()
        .map(|s| s.gateway_args(args.replicas))
        .unwrap_or_default();
    if let (Backend::Embedded, Some(slots)) = (args.backend, exec_slots) {
        gateway_args.push(format!("--workers={slots}"));
    }
    gateway_args.extend(args.gateway_args.iter().cloned());
    let gateway_log = args
        .gateway_log
        .clone()
        .or_else(|| args.log_dir.as_ref().map(|d| d.join("gateway.log")));
    if args.gateways > 1 && !(args.spawn && args.backend == Backend::Nats) {
        return Err("--gateways above 1 needs --spawn --backend nats".into());
    }
    let mut gateways = Vec::new();
    for n in 0..if args.spawn { args.gateways } else { 0 } {
        // The first gateway's log keeps its name; the others are numbered.
        let log = match n {
            0 => gateway_log.clone(),
            n => args
                .log_dir
                .as_ref()
                .map(|d| d.join(format!("gateway-{}.log", n + 1))),
        };
        let g = SpawnedGateway::start(
            &args.gateway_bin,
            &config_json,
            args.config.as_deref(),
            &gateway_args,
            log.as_deref(),
        )?;
        if !args.quiet {
            eprintln!(
                "bench: started {} (pid {}) on {} with {}",
                args.gateway_bin.display(),
                g.pid,
                g.url,
                g.config.display()
            );
        }
        gateways.push(g);
    }
    let gateway_pid = gateways.first().map(|g| g.pid);
    if let (Some(stack), Some(g)) = (stack.as_mut(), gateways.first()) {
        stack.start_workers(&stack_plan, &g.config).await?;
        if !args.quiet {
            eprintln!(
                "bench: started {} worker process(es), {} executions each",
                stack_plan.workers, stack_plan.worker_slots
            );
        }
    }
    let urls: Vec<String> = if gateways.is_empty() {
        vec![args.url.clone()]
    } else {
        gateways.iter().map(|g| g.url.clone()).collect()
    };
    let mut body = serde_json::json!({
        "ability": args.ability,
        "input": [{"type": "text", "text": args.prompt}],
    });
    if let Some(deadline_ms) = args.deadline_ms {
        body["deadline_ms"] = deadline_ms.into();
    }
    let body = Bytes::from(serde_json::to_vec(&body).map_err(|e| e.to_string())?);
    let pool = args.concurrency.max(args.max_in_flight.min(4096)).max(1);
    let mut api = Api::new(&urls, body, pool)?;
    if let Some(prefix) = &args.idempotency_prefix {
        api = api.with_idempotency_keys(prefix);
    }
    api.wait_ready("/healthz", Duration::from_secs(10)).await?;

    // JetStream message counts before any load (the gateway created the streams at startup),
    // and the namespace's partitions and lanes.
    let mut layout = None;
    let js = match &stack {
        Some(stack) => {
            let js = stack.jetstream().await?;
            let before = servers::stream_counts(&js, &stack.namespace).await?;
            let subs = sublists(&stack.nats_monitors).await;
            // Not fatal: a report without it is still a report (of an older gateway, say).
            layout = stack
                .layout(&js)
                .await
                .inspect_err(|e| eprintln!("bench: the namespace's partitions unknown: {e}"))
                .ok();
            Some((js, before, subs))
        }
        None => None,
    };

    let duration = match (args.duration, args.executions) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(60)),
    };
    let mut processes: Vec<(String, u32)> = Vec::new();
    for (n, g) in gateways.iter().enumerate() {
        let name = match n {
            0 => "gateway".to_owned(),
            n => format!("gateway-{}", n + 1),
        };
        processes.push((name, g.pid));
    }
    if let Some(stack) = &stack {
        processes.extend(stack.processes());
    }
    processes.push(("bench".into(), std::process::id()));
    let load = Load {
        mode: args.mode,
        stream: args.stream,
        concurrency: args.concurrency,
        rate_per_s: args.rate,
        duration_s: duration.map(|d| d.as_secs_f64()),
        executions_limit: args.executions,
        warmup_s: args.warmup,
        ramp_up_s: args.ramp_up,
        window_s: args.window,
    };
    let plan = Plan {
        load: load.clone(),
        max_in_flight: args.max_in_flight.max(1),
        timeout: Duration::from_secs_f64(args.timeout),
        quiet: args.quiet,
        gateway_pid,
        processes,
        timeline_bucket: Duration::from_secs_f64(args.timeline_bucket),
        clock_ticks: clock_ticks(),
    };
    let profiling = args.profile_dir.clone().map(|dir| {
        let targets = profile::Targets {
            nats: stack
                .as_ref()
                .map(|s| s.nats_profiling.clone())
                .unwrap_or_default(),
            processes: plan
                .processes
                .iter()
                .filter(|(name, _)| name.starts_with("gateway") || name.starts_with("worker"))
                .cloned()
                .collect(),
        };
        let window = profile::Window::of_run(args.warmup, load.duration_s);
        tokio::spawn(profile::capture(dir, window, targets, probe.clone()))
    });
    let outcome = run::run(api, plan).await;
    if let Some(profiling) = profiling {
        match profiling.await {
            Ok(lines) => lines.iter().for_each(|l| eprintln!("bench: profile {l}")),
            Err(e) => eprintln!("bench: profiling failed: {e}"),
        }
    }

    let jetstream = match (&js, &stack) {
        (Some((js, before, subs_before)), Some(stack)) => {
            let after: StreamCounts = servers::stream_counts(js, &stack.namespace).await?;
            let subs_after = sublists(&stack.nats_monitors).await;
            let sublist = match (subs_before, subs_after) {
                (Some(b), Some(a)) => Some(b.since(&a)),
                _ => None,
            };
            Some(JetStreamReport::new(
                format!("{}_EVENTS*", stack.namespace.to_ascii_uppercase()),
                after.events_last_seq.saturating_sub(before.events_last_seq),
                after.jobs_last_seq.saturating_sub(before.jobs_last_seq),
                sublist,
                outcome.settled_all,
            ))
        }
        _ => None,
    };
    let crashed = stack.as_mut().and_then(Stack::exited);
    // The first gateway's exit code is reported; the others are stopped the same way.
    let mut exit_code = None;
    for (n, g) in gateways.into_iter().enumerate() {
        let code = tokio::task::spawn_blocking(move || g.stop(Duration::from_secs(15)))
            .await
            .ok()
            .flatten();
        if n == 0 {
            exit_code = code;
        }
    }
    let pid = gateway_pid;
    drop(stack);
    let gateway_report = GatewayReport {
        spawned: args.spawn,
        pid,
        binary: args.spawn.then(|| args.gateway_bin.display().to_string()),
        config: (args.spawn && args.config.is_none()).then_some(config_json),
        extra_args: gateway_args,
        start: None,
        end: None,
        cpu_s: None,
        exit_code,
    };
    let setup = Setup {
        backend: match (args.spawn, args.backend) {
            (false, _) => "external",
            (true, Backend::Embedded) => "embedded",
            (true, Backend::Nats) => "nats",
        }
        .into(),
        nats_nodes: (args.backend == Backend::Nats).then_some(args.nats_cluster),
        replicas: (args.backend == Backend::Nats).then_some(args.replicas),
        sync_interval: args.sync_interval.clone(),
        sublist_cache: (args.backend == Backend::Nats).then_some(!args.nats_no_sublist_cache),
        worker_processes: (args.backend == Backend::Nats).then_some(args.worker_procs),
        worker_threads: args
            .worker_threads
            .filter(|_| args.backend == Backend::Nats),
        gateways: (args.backend == Backend::Nats).then_some(args.gateways),
        partitions: layout.map(|(partitions, _)| partitions),
        tenant_lanes: layout.map(|(_, lanes)| lanes),
        exec_slots,
        mock_chunks: args.chunks,
        mock_delay_ms: args.delay_ms,
        nofile_limit: nofile,
        otlp_endpoint: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .ok()
            .filter(|v| !v.is_empty()),
    };
    let report = Report::new(
        Params {
            load,
            url: urls.join(" "),
            client_threads: threads,
            label: label.clone(),
            setup,
            provider_gap: Duration::from_millis(args.delay_ms),
        },
        outcome,
        gateway_report,
        jetstream,
    );
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    if let Some(path) = &args.json_out {
        std::fs::write(path, &json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join(format!("{label}.json"));
        std::fs::write(&path, &json)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let run = plot::PlotRun::from_json(&json, &label)?;
        plot::write_charts(&[run], dir, &format!("{label}-"))?;
    }
    if args.json {
        eprint!("{}", report.render());
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    if let Some(name) = crashed {
        return Err(format!(
            "{name} exited during the run (see --log-dir); the figures above are not valid"
        ));
    }
    Ok(())
}
