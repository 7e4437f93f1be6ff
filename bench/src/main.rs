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
//! The client is one tokio runtime and one pooled `reqwest` client; on a small machine the
//! harness and the gateway share the cores, and the report shows how much CPU each used.
//! See BENCHMARKS.md at the repository root for results and exact commands.

mod client;
mod raw;
mod report;
mod run;
mod spawn;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;

use crate::client::{Api, StreamMode};
use crate::report::{GatewayReport, Params, Report};
use crate::run::{Mode, Plan};
use crate::spawn::{MockDeployment, SpawnedGateway, clock_ticks};

/// Benchmark harness for the gateway.
#[derive(Debug, Parser)]
#[command(name = "bench", version, about, args_conflicts_with_subcommands = true)]
struct Args {
    /// A baseline that does not go through the gateway (see `bench help <subcommand>`).
    #[command(subcommand)]
    command: Option<raw::Command>,
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
    /// Generated config: mock delay before each chunk, ms.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Generated config: number of mock chunks (default: the mock's three).
    #[arg(long)]
    chunks: Option<usize>,
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
    match runtime.block_on(bench(args, threads)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::from(1)
        }
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
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} must be a positive number of seconds"));
        }
    }
    if !(args.warmup.is_finite() && args.warmup >= 0.0) {
        return Err("--warmup must be >= 0".into());
    }
    if args.executions == Some(0) {
        return Err("--executions must be at least 1".into());
    }
    Ok(())
}

async fn bench(mut args: Args, threads: usize) -> Result<(), String> {
    if let Some(cmd) = args.command.take() {
        return raw::run(cmd).await;
    }
    let deployment = MockDeployment {
        delay_ms: args.delay_ms,
        chunks: args.chunks,
        max_concurrency: args.provider_concurrency,
        max_queue_depth: args.provider_queue_depth,
        max_active_executions: args.max_active_executions,
    };
    let config_json = deployment.to_json();
    let gateway = if args.spawn {
        let g = SpawnedGateway::start(
            &args.gateway_bin,
            &config_json,
            args.config.as_deref(),
            &args.gateway_args,
            args.gateway_log.as_deref(),
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
        Some(g)
    } else {
        None
    };
    let url = gateway
        .as_ref()
        .map_or_else(|| args.url.clone(), |g| g.url.clone());
    let body = serde_json::json!({
        "ability": args.ability,
        "input": [{"type": "text", "text": args.prompt}],
    });
    let body = Bytes::from(serde_json::to_vec(&body).map_err(|e| e.to_string())?);
    let pool = args.concurrency.max(args.max_in_flight.min(4096)).max(1);
    let mut api = Api::new(&url, body, pool)?;
    if let Some(prefix) = &args.idempotency_prefix {
        api = api.with_idempotency_keys(prefix);
    }
    api.wait_ready("/healthz", Duration::from_secs(10)).await?;

    let duration = match (args.duration, args.executions) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(60)),
    };
    let plan = Plan {
        mode: args.mode,
        stream: args.stream,
        concurrency: args.concurrency,
        rate: args.rate.unwrap_or(0.0),
        duration,
        executions: args.executions,
        warmup: Duration::from_secs_f64(args.warmup),
        window: Duration::from_secs_f64(args.window),
        max_in_flight: args.max_in_flight.max(1),
        timeout: Duration::from_secs_f64(args.timeout),
        quiet: args.quiet,
        gateway_pid: gateway.as_ref().map(|g| g.pid),
        clock_ticks: clock_ticks(),
    };
    let outcome = run::run(api, plan).await;

    let (pid, exit_code) = match gateway {
        Some(g) => {
            let pid = g.pid;
            let code = tokio::task::spawn_blocking(move || g.stop(Duration::from_secs(15)))
                .await
                .ok()
                .flatten();
            (Some(pid), code)
        }
        None => (None, None),
    };
    let gateway_report = GatewayReport {
        spawned: args.spawn,
        pid,
        binary: args.spawn.then(|| args.gateway_bin.display().to_string()),
        config: (args.spawn && args.config.is_none()).then_some(config_json),
        extra_args: args.gateway_args.clone(),
        start: None,
        end: None,
        cpu_s: None,
        exit_code,
    };
    let report = Report::new(
        Params {
            mode: args.mode,
            stream: args.stream,
            url,
            concurrency: args.concurrency,
            rate: args.rate,
            duration_s: duration.map(|d| d.as_secs_f64()),
            executions: args.executions,
            warmup_s: args.warmup,
            window_s: args.window,
            client_threads: threads,
        },
        outcome,
        gateway_report,
    );
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    if let Some(path) = &args.json_out {
        std::fs::write(path, &json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.json {
        eprint!("{}", report.render());
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    Ok(())
}
