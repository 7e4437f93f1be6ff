//! Load drivers: closed loop, open loop and submit-only, plus the per-window sampler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Api, ExecError, StreamMode};
use crate::spawn::{ProcStats, ProcessCpu, cpu_between, cpu_snapshot, proc_stats, system_busy_s};
use crate::stats::{Latencies, Recorder, Timeline};

/// What the harness does per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `--concurrency` clients, each: submit, read the full event stream, repeat.
    Closed,
    /// Arrivals at a fixed `--rate`, latency measured from each scheduled arrival time.
    Open,
    /// `--concurrency` clients, each: `POST /v1/executions`, read the 202, repeat (no SSE).
    Submit,
}

/// The load a run applies: the run parameters the report repeats, in its units.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    pub mode: Mode,
    pub stream: StreamMode,
    pub concurrency: usize,
    /// Arrivals per second (open loop).
    pub rate_per_s: Option<f64>,
    /// Measured time; `None`: until `executions_limit` executions.
    pub duration_s: Option<f64>,
    pub executions_limit: Option<u64>,
    pub warmup_s: f64,
    /// Closed and submit modes: client `i` of `c` starts `i * ramp_up_s / c` seconds in, so
    /// the clients' cycles are spread instead of starting (and, with executions of nearly
    /// equal length, staying) in step. 0: all start at once.
    pub ramp_up_s: f64,
    pub window_s: f64,
}

impl Load {
    fn duration(&self) -> Option<Duration> {
        self.duration_s.map(Duration::from_secs_f64)
    }

    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_s)
    }

    /// When client `index` of the closed loop starts, from the run's start.
    fn client_start(&self, index: usize) -> Duration {
        let clients = self.concurrency.max(1);
        Duration::from_secs_f64(self.ramp_up_s * index as f64 / clients as f64)
    }

    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.window_s)
    }
}

/// Everything a run needs to know.
#[derive(Debug, Clone)]
pub struct Plan {
    pub load: Load,
    pub max_in_flight: usize,
    pub timeout: Duration,
    pub quiet: bool,
    /// The gateway's pid, when the harness can read its `/proc` entry.
    pub gateway_pid: Option<u32>,
    /// Every process whose CPU the report shows (`name`, pid), the harness itself included.
    pub processes: Vec<(String, u32)>,
    /// Width of the timeline's buckets (throughput over time for the charts).
    pub timeline_bucket: Duration,
    pub clock_ticks: f64,
}

/// One reporting window.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub index: usize,
    /// Seconds since the measured run started.
    pub start_s: f64,
    pub end_s: f64,
    /// Shorter than `--window` (the run ended inside it).
    pub partial: bool,
    /// Successful operations (terminal events read; 202s in submit-only mode).
    pub ops: u64,
    pub per_s: f64,
    pub failed: u64,
    pub errors: u64,
    /// Terminal-event latency in this window (submit latency in submit-only mode).
    #[serde(flatten)]
    pub latency: WindowLatency,
    pub gateway_rss_kb: Option<u64>,
    #[serde(flatten)]
    pub cores: Cores,
}

/// A window's latency percentiles, us; `None` when no operation completed in it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WindowLatency {
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    pub max_us: Option<u64>,
}

impl WindowLatency {
    fn of(hist: &Histogram<u64>) -> Self {
        if hist.is_empty() {
            return Self::default();
        }
        Self {
            p50_us: Some(hist.value_at_quantile(0.5)),
            p99_us: Some(hist.value_at_quantile(0.99)),
            max_us: Some(hist.max()),
        }
    }
}

/// CPU cores used over a span (CPU seconds / wall seconds, two decimals); `None` where a
/// reading failed.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cores {
    #[serde(rename = "gateway_cores")]
    pub gateway: Option<f64>,
    #[serde(rename = "bench_cores")]
    pub bench: Option<f64>,
    /// Cores busy machine-wide (everything, not only gateway and harness).
    #[serde(rename = "system_cores")]
    pub system: Option<f64>,
}

impl Cores {
    /// The cores `used` CPU seconds kept busy over `secs` wall seconds.
    fn over(used: CpuSeconds, secs: f64) -> Self {
        let cores = |s: Option<f64>| {
            s.filter(|_| secs > 0.0)
                .map(|s| (s / secs * 100.0).round() / 100.0)
        };
        Self {
            gateway: cores(used.gateway),
            bench: cores(used.bench),
            system: cores(used.system),
        }
    }
}

/// CPU seconds of the gateway, of the harness and of the whole machine (busy time): used so
/// far, or used over a span ([`CpuSeconds::since`]); `None` where a reading failed.
#[derive(Debug, Clone, Copy)]
pub struct CpuSeconds {
    pub gateway: Option<f64>,
    pub bench: Option<f64>,
    pub system: Option<f64>,
}

impl CpuSeconds {
    /// Used so far, with the gateway's figure as read with its other `/proc` figures.
    fn now(gateway: Option<f64>, ticks: f64) -> Self {
        Self {
            gateway,
            bench: proc_stats("self", ticks).cpu_s,
            system: system_busy_s(ticks),
        }
    }

    /// Used from `earlier` to `self`.
    fn since(&self, earlier: &Self) -> Self {
        let used = |from: Option<f64>, to: Option<f64>| from.zip(to).map(|(a, b)| b - a);
        Self {
            gateway: used(earlier.gateway, self.gateway),
            bench: used(earlier.bench, self.bench),
            system: used(earlier.system, self.system),
        }
    }
}

/// What became of a run's operations (the report shows them as they are).
#[derive(Debug, Serialize)]
pub struct Counts {
    pub issued: u64,
    /// Successful operations: executions whose `execution.completed` was read (202s in submit
    /// mode).
    pub ok: u64,
    pub failed: u64,
    pub errored: u64,
    pub shed: u64,
    pub errors: std::collections::BTreeMap<String, u64>,
}

/// What a run produced.
#[derive(Debug)]
pub struct Outcome {
    pub elapsed: Duration,
    pub counts: Counts,
    pub latencies: Latencies,
    pub windows: Vec<Window>,
    pub gateway_start: Option<ProcStats>,
    pub gateway_end: Option<ProcStats>,
    /// CPU seconds used over the measured run.
    pub cpu: CpuSeconds,
    /// CPU of each process of `Plan::processes` over the measured run.
    pub process_cpu: Vec<ProcessCpu>,
    /// Completions per bucket over the measured run.
    pub timeline: Timeline,
    /// Executions that reached a terminal event (202s in submit mode), warm-up included.
    pub settled_all: u64,
}

struct Control {
    stop: AtomicBool,
    issued: AtomicU64,
    limit: u64,
    /// Operations that started before this instant are warm-up and not recorded.
    measure_start: Instant,
}

impl Control {
    /// Claims the next operation, or `false` when the run is over.
    fn next(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
            && self.issued.fetch_add(1, Ordering::Relaxed) < self.limit
    }
}

/// Runs `plan` against `api`.
pub async fn run(api: Api, plan: Plan) -> Outcome {
    let api = Arc::new(api);
    let run_start = Instant::now();
    let measure_start = run_start + plan.load.warmup();
    let recorder = Arc::new(Recorder::new(measure_start, plan.timeline_bucket));
    let ctl = Arc::new(Control {
        stop: AtomicBool::new(false),
        issued: AtomicU64::new(0),
        limit: plan.load.executions_limit.unwrap_or(u64::MAX),
        measure_start,
    });
    let gateway_pid = plan.gateway_pid.map(|p| p.to_string());
    let read_gateway =
        |pid: &Option<String>| pid.as_deref().map(|p| proc_stats(p, plan.clock_ticks));

    let mut workers = JoinSet::new();
    match plan.load.mode {
        Mode::Closed | Mode::Submit => {
            for index in 0..plan.load.concurrency.max(1) {
                let client = closed_client(
                    Arc::clone(&api),
                    Arc::clone(&ctl),
                    Arc::clone(&recorder),
                    plan.clone(),
                );
                let starts_at = run_start + plan.load.client_start(index);
                workers.spawn(async move {
                    tokio::time::sleep_until(starts_at).await;
                    client.await;
                });
            }
        }
        Mode::Open => {
            workers.spawn(open_loop(
                Arc::clone(&api),
                Arc::clone(&ctl),
                Arc::clone(&recorder),
                plan.clone(),
            ));
        }
    }

    tokio::time::sleep_until(measure_start).await;
    let gateway_start = read_gateway(&gateway_pid);
    let processes_start = cpu_snapshot(&plan.processes, plan.clock_ticks);
    let cpu_start = CpuSeconds::now(gateway_start.and_then(|s| s.cpu_s), plan.clock_ticks);
    let finished = Arc::new(Notify::new());
    let sampler = tokio::spawn(sample_windows(
        Arc::clone(&recorder),
        Arc::clone(&finished),
        measure_start,
        plan.load.window(),
        gateway_pid.clone(),
        plan.clock_ticks,
        plan.quiet,
        plan.load.mode,
    ));

    let all_done = async { while workers.join_next().await.is_some() {} };
    tokio::pin!(all_done);
    match plan.load.duration() {
        Some(duration) => {
            tokio::select! {
                () = tokio::time::sleep_until(measure_start + duration) => {
                    ctl.stop.store(true, Ordering::Relaxed);
                    all_done.await;
                }
                () = &mut all_done => {}
            }
        }
        None => all_done.await,
    }
    let end = Instant::now();
    finished.notify_one();
    let windows = sampler.await.unwrap_or_default();
    let gateway_end = read_gateway(&gateway_pid);
    let processes_end = cpu_snapshot(&plan.processes, plan.clock_ticks);
    let cpu_end = CpuSeconds::now(gateway_end.and_then(|s| s.cpu_s), plan.clock_ticks);
    let (latencies, errors, timeline) = recorder.finish();
    let issued = ctl.issued.load(Ordering::Relaxed).min(ctl.limit);
    let elapsed = end.saturating_duration_since(measure_start);
    Outcome {
        elapsed,
        counts: Counts {
            issued,
            ok: recorder.ok.load(Ordering::Relaxed),
            failed: recorder.failed.load(Ordering::Relaxed),
            errored: recorder.errored.load(Ordering::Relaxed),
            shed: recorder.shed.load(Ordering::Relaxed),
            errors,
        },
        latencies,
        windows,
        gateway_start,
        gateway_end,
        cpu: cpu_end.since(&cpu_start),
        process_cpu: cpu_between(&processes_start, &processes_end, elapsed.as_secs_f64()),
        timeline,
        settled_all: recorder.settled_all.load(Ordering::Relaxed),
    }
}

async fn closed_client(api: Arc<Api>, ctl: Arc<Control>, rec: Arc<Recorder>, plan: Plan) {
    while ctl.next() {
        let start = Instant::now();
        let measured = start >= ctl.measure_start;
        let failed = match plan.load.mode {
            Mode::Submit => match tokio::time::timeout(plan.timeout, api.submit()).await {
                Ok(Ok(_)) => {
                    rec.settled_all.fetch_add(1, Ordering::Relaxed);
                    if measured {
                        rec.submit_only(start.elapsed());
                    }
                    false
                }
                Ok(Err(e)) => record_error(&rec, measured, &e),
                Err(_) => record_error(&rec, measured, &ExecError::Timeout),
            },
            _ => match tokio::time::timeout(plan.timeout, api.execute(start, plan.load.stream))
                .await
            {
                Ok(Ok(timing)) => {
                    rec.settled_all.fetch_add(1, Ordering::Relaxed);
                    if measured {
                        rec.execution(&timing);
                    }
                    false
                }
                Ok(Err(e)) => record_error(&rec, measured, &e),
                Err(_) => record_error(&rec, measured, &ExecError::Timeout),
            },
        };
        if failed {
            // No hot spin against a gateway that refuses everything.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn record_error(rec: &Recorder, measured: bool, e: &ExecError) -> bool {
    if measured {
        rec.error(e);
    }
    true
}

/// Dispatches arrival `i` at `t0 + i / rate`. The timer wakes at most once per millisecond, so
/// arrivals due in the same millisecond leave together; each execution's latencies are measured
/// from its *scheduled* time, so neither that nor a slow server hides queueing (no coordinated
/// omission). Arrivals beyond `--max-in-flight` are shed and counted.
async fn open_loop(api: Arc<Api>, ctl: Arc<Control>, rec: Arc<Recorder>, plan: Plan) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let drained = Arc::new(Notify::new());
    let t0 = Instant::now();
    let rate = plan.load.rate_per_s.unwrap_or(0.0).max(1e-9);
    let mut i: u64 = 0;
    loop {
        let scheduled = t0 + Duration::from_secs_f64(i as f64 / rate);
        i += 1;
        if Instant::now() < scheduled {
            tokio::time::sleep_until(scheduled).await;
        }
        if !ctl.next() {
            break;
        }
        let measured = scheduled >= ctl.measure_start;
        if in_flight.load(Ordering::Relaxed) >= plan.max_in_flight {
            if measured {
                rec.shed.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (api, rec, in_flight, drained) = (
            Arc::clone(&api),
            Arc::clone(&rec),
            Arc::clone(&in_flight),
            Arc::clone(&drained),
        );
        let (timeout, stream) = (plan.timeout, plan.load.stream);
        tokio::spawn(async move {
            if measured {
                rec.dispatch_lag(scheduled.elapsed());
            }
            let result = tokio::time::timeout(timeout, api.execute(scheduled, stream)).await;
            if matches!(result, Ok(Ok(_))) {
                rec.settled_all.fetch_add(1, Ordering::Relaxed);
            }
            match result {
                Ok(Ok(timing)) if measured => rec.execution(&timing),
                Ok(Err(e)) if measured => rec.error(&e),
                Err(_) if measured => rec.error(&ExecError::Timeout),
                _ => {}
            }
            if in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                drained.notify_one();
            }
        });
    }
    while in_flight.load(Ordering::Acquire) > 0 {
        let _ = tokio::time::timeout(Duration::from_millis(50), drained.notified()).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn sample_windows(
    rec: Arc<Recorder>,
    finished: Arc<Notify>,
    start: Instant,
    window: Duration,
    gateway_pid: Option<String>,
    ticks: f64,
    quiet: bool,
    mode: Mode,
) -> Vec<Window> {
    let mut windows = Vec::new();
    let mut prev_t = start;
    let (mut prev_ok, mut prev_failed, mut prev_err) = (0u64, 0u64, 0u64);
    let gateway_cpu = gateway_pid
        .as_deref()
        .and_then(|p| proc_stats(p, ticks).cpu_s);
    let mut prev_cpu = CpuSeconds::now(gateway_cpu, ticks);
    let finished = finished.notified();
    tokio::pin!(finished);
    let what = if mode == Mode::Submit {
        "submit"
    } else {
        "terminal"
    };
    loop {
        let partial = tokio::select! {
            () = tokio::time::sleep_until(prev_t + window) => false,
            () = &mut finished => true,
        };
        let now = Instant::now();
        let secs = now.saturating_duration_since(prev_t).as_secs_f64();
        // The run may end right at a window boundary: that window is full.
        let last = partial;
        let partial = partial && secs < 0.95 * window.as_secs_f64();
        let ok = rec.ok.load(Ordering::Relaxed);
        let failed = rec.failed.load(Ordering::Relaxed);
        let err = rec.errored.load(Ordering::Relaxed);
        let hist = rec.take_window();
        let gw = gateway_pid.as_deref().map(|p| proc_stats(p, ticks));
        let cpu = CpuSeconds::now(gw.and_then(|s| s.cpu_s), ticks);
        let ops = ok - prev_ok;
        let w = Window {
            index: windows.len(),
            start_s: prev_t.saturating_duration_since(start).as_secs_f64(),
            end_s: now.saturating_duration_since(start).as_secs_f64(),
            partial,
            ops,
            per_s: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
            failed: failed - prev_failed,
            errors: err - prev_err,
            latency: WindowLatency::of(&hist),
            gateway_rss_kb: gw.and_then(|s| s.rss_kb),
            cores: Cores::over(cpu.since(&prev_cpu), secs),
        };
        let sliver = partial && secs < 0.05;
        if !quiet && !sliver {
            eprintln!(
                "[{:>7.1}s] {:>9.1}/s  {what} p50 {:>8} p99 {:>8}  errors {}  failed {}  gw rss {}  cores gw {} bench {} all {}{}",
                w.end_s,
                w.per_s,
                crate::report::ms(w.latency.p50_us),
                crate::report::ms(w.latency.p99_us),
                w.errors,
                w.failed,
                crate::report::mib(w.gateway_rss_kb),
                crate::report::opt(w.cores.gateway),
                crate::report::opt(w.cores.bench),
                crate::report::opt(w.cores.system),
                if partial { "  (partial)" } else { "" },
            );
        }
        // A sliver of a window at the very end carries no information.
        if !sliver {
            windows.push(w);
        }
        (prev_t, prev_ok, prev_failed, prev_err) = (now, ok, failed, err);
        prev_cpu = cpu;
        if last {
            return windows;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_serializes_flat_with_the_keys_the_charts_and_scripts_read() {
        let used = CpuSeconds {
            gateway: Some(1.5),
            bench: None,
            system: Some(3.0),
        };
        let w = Window {
            index: 0,
            start_s: 0.0,
            end_s: 2.0,
            partial: false,
            ops: 10,
            per_s: 5.0,
            failed: 0,
            errors: 0,
            latency: WindowLatency::default(),
            gateway_rss_kb: Some(1024),
            cores: Cores::over(used, 2.0),
        };
        // The exact text: key order included (flattened and renamed fields stay in place).
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            concat!(
                r#"{"index":0,"start_s":0.0,"end_s":2.0,"partial":false,"ops":10,"per_s":5.0,"#,
                r#""failed":0,"errors":0,"p50_us":null,"p99_us":null,"max_us":null,"#,
                r#""gateway_rss_kb":1024,"gateway_cores":0.75,"bench_cores":null,"system_cores":1.5}"#,
            )
        );
    }

    #[test]
    fn a_ramp_up_spreads_the_client_starts_evenly_and_none_means_all_at_once() {
        let mut load = Load {
            mode: Mode::Closed,
            stream: StreamMode::Get,
            concurrency: 4,
            rate_per_s: None,
            duration_s: Some(1.0),
            executions_limit: None,
            warmup_s: 2.0,
            ramp_up_s: 2.0,
            window_s: 1.0,
        };
        let starts: Vec<Duration> = (0..4).map(|i| load.client_start(i)).collect();
        assert_eq!(
            starts,
            [0, 500, 1000, 1500].map(Duration::from_millis).to_vec()
        );
        load.ramp_up_s = 0.0;
        assert!((0..4).all(|i| load.client_start(i).is_zero()));
    }
}
