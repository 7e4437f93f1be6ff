//! The run report: a JSON document (`--json`, `--json-out`) and its human-readable rendering.

use std::fmt::Write as _;

use serde::Serialize;

use crate::client::StreamMode;
use crate::run::{Counts, Load, Mode, Outcome, Window};
use crate::servers::SublistCounts;
use crate::spawn::{ProcStats, ProcessCpu};
use crate::stats::{AddedPerDelta, LatencySet, Summary, TimelinePoint};

/// Milliseconds with three decimals, from microseconds; `-` when absent.
pub fn ms(us: Option<u64>) -> String {
    us.map_or_else(|| "-".into(), |v| format!("{:.3}", v as f64 / 1000.0))
}

/// MiB with one decimal, from KiB; `-` when absent.
pub fn mib(kb: Option<u64>) -> String {
    kb.map_or_else(|| "-".into(), |v| format!("{:.1} MiB", v as f64 / 1024.0))
}

pub fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// The latencies' summaries (see [`LatencySet`] for what each measures).
pub type LatencyReport = LatencySet<Option<Summary>>;

/// What the harness ran against: the figures that tell one configuration from another.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// `embedded` (memory backend), `nats` (the harness's own stack), or `external`.
    pub backend: String,
    pub nats_nodes: Option<usize>,
    pub replicas: Option<u8>,
    /// JetStream `sync_interval` the harness set (`None`: the server's default).
    pub sync_interval: Option<String>,
    /// Whether nats-server's subscription match cache was on (off: `--nats-no-sublist-cache`).
    pub sublist_cache: Option<bool>,
    pub worker_processes: Option<usize>,
    /// Runtime threads of each worker process (`--worker-threads`; `None`: one per core).
    pub worker_threads: Option<u16>,
    /// Gateway processes the harness started (nats mode).
    pub gateways: Option<u16>,
    /// The namespace's partitions and tenant lanes per partition (nats mode), as recorded.
    pub partitions: Option<u16>,
    pub tenant_lanes: Option<u16>,
    /// Concurrent executions per executing process (`--workers` of the gateway in embedded mode
    /// or of each worker); `None`: the binary's default.
    pub exec_slots: Option<usize>,
    /// Mock chunks per execution (`None`: the mock's three) and its delay before each, ms.
    pub mock_chunks: Option<usize>,
    pub mock_delay_ms: u64,
    /// The harness's open-file limit after raising it (spawned processes inherit it).
    pub nofile_limit: Option<u64>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` as the spawned processes saw it (trace export on when set).
    pub otlp_endpoint: Option<String>,
}

/// `n` and the word `one` for one of them, with an `s` unless `n` is 1 ("1 worker", "2 workers").
pub fn plural(n: usize, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

impl Setup {
    /// The distributed stack in words (`None` without one): the figures a scaling run varies.
    pub fn stack_line(&self) -> Option<String> {
        let nodes = self.nats_nodes?;
        let mut parts = vec![plural(self.gateways.map_or(1, usize::from), "gateway")];
        let workers = self.worker_processes.unwrap_or(0);
        let threads = self.worker_threads.map_or_else(String::new, |t| {
            format!(" of {}", plural(t.into(), "thread"))
        });
        parts.push(format!(
            "{workers} worker process{}{threads}",
            if workers == 1 { "" } else { "es" }
        ));
        if let Some(p) = self.partitions {
            let lanes = self.tenant_lanes.map_or_else(String::new, |l| {
                format!(" of {}", plural(l.into(), "tenant lane"))
            });
            parts.push(format!("{}{lanes}", plural(p.into(), "partition")));
        }
        parts.push(format!(
            "{} R{}",
            plural(nodes, "NATS node"),
            self.replicas.unwrap_or(1)
        ));
        Some(parts.join(", "))
    }
}

/// JetStream messages the run stored, from the streams' last sequence before the first and
/// after the last execution, warm-up included, divided by the executions that reached a
/// terminal event over the same span.
#[derive(Debug, Clone, Serialize)]
pub struct JetStreamReport {
    /// The events streams counted (`{NS}_EVENTS*`: the first and every other shard).
    pub events_stream: String,
    pub events_messages: u64,
    pub jobs_messages: u64,
    pub executions: u64,
    pub events_per_execution: Option<f64>,
    pub jobs_per_execution: Option<f64>,
    /// Subscriptions inserted into and removed from the servers' subscription lists over the
    /// same span, every node and account summed (`/subsz`); `None` where the monitoring
    /// endpoint could not be read.
    pub subscription_changes: Option<u64>,
    pub subscription_changes_per_execution: Option<f64>,
    /// Lookups in the shared subscription lists over the same span, and those that missed
    /// their cache; each miss, like each change, takes the list's write lock.
    pub sublist_matches: Option<u64>,
    pub sublist_misses: Option<u64>,
    pub sublist_matches_per_execution: Option<f64>,
    pub sublist_misses_per_execution: Option<f64>,
}

impl JetStreamReport {
    pub fn new(
        events_stream: String,
        events: u64,
        jobs: u64,
        sublist: Option<SublistCounts>,
        executions: u64,
    ) -> Self {
        let per = |n: u64| (executions > 0).then(|| n as f64 / executions as f64);
        let subscription_changes = sublist.map(|c| c.inserts + c.removes);
        let sublist_matches = sublist.map(|c| c.matches);
        let sublist_misses = sublist.map(|c| c.misses);
        Self {
            events_stream,
            events_messages: events,
            jobs_messages: jobs,
            executions,
            events_per_execution: per(events),
            jobs_per_execution: per(jobs),
            subscription_changes,
            subscription_changes_per_execution: subscription_changes.and_then(per),
            sublist_matches,
            sublist_misses,
            sublist_matches_per_execution: sublist_matches.and_then(per),
            sublist_misses_per_execution: sublist_misses.and_then(per),
        }
    }
}

/// Completions per `bucket_s` over the measured run.
#[derive(Debug, Serialize)]
pub struct TimelineReport {
    pub bucket_s: f64,
    pub points: Vec<TimelinePoint>,
}

/// First versus last full window.
#[derive(Debug, Serialize)]
pub struct Stability {
    pub first_per_s: f64,
    pub last_per_s: f64,
    /// `last / first`.
    pub ratio: f64,
    /// `|last − first| ≤ 10% of first`.
    pub within_10pct: bool,
}

#[derive(Debug, Serialize)]
pub struct GatewayReport {
    pub spawned: bool,
    pub pid: Option<u32>,
    pub binary: Option<String>,
    pub config: Option<serde_json::Value>,
    pub extra_args: Vec<String>,
    /// At the start of the measured run.
    pub start: Option<ProcStats>,
    /// Right after the last execution finished (before the gateway is stopped).
    pub end: Option<ProcStats>,
    /// CPU seconds the gateway used during the measured run.
    pub cpu_s: Option<f64>,
    pub exit_code: Option<i32>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// The run's parameters: the report's first fields.
    #[serde(flatten)]
    pub params: Params,
    pub nproc: usize,
    pub elapsed_s: f64,
    #[serde(flatten)]
    pub counts: Counts,
    /// `ok / elapsed_s`.
    pub throughput_per_s: f64,
    pub latency: LatencyReport,
    /// Client gap between consecutive deltas minus the provider's configured gap.
    pub added_per_delta: Option<AddedPerDelta>,
    pub windows: Vec<Window>,
    pub timeline: TimelineReport,
    pub stability: Option<Stability>,
    pub gateway: GatewayReport,
    pub bench_cpu_s: Option<f64>,
    /// Busy CPU seconds of the whole machine during the run.
    pub system_cpu_s: Option<f64>,
    /// CPU of every process the harness started, and of the harness, over the measured run.
    pub processes: Vec<ProcessCpu>,
    /// `--backend nats`: JetStream messages per execution.
    pub jetstream: Option<JetStreamReport>,
}

/// Run parameters that the outcome does not carry.
#[derive(Debug, Serialize)]
pub struct Params {
    /// The configuration's name in charts and file names (`--label`).
    pub label: String,
    pub setup: Setup,
    #[serde(flatten)]
    pub load: Load,
    pub url: String,
    pub client_threads: usize,
    /// The provider's configured gap between deltas (the mock's delay); not reported.
    #[serde(skip)]
    pub provider_gap: std::time::Duration,
}

impl Report {
    pub fn new(
        p: Params,
        o: Outcome,
        gateway: GatewayReport,
        jetstream: Option<JetStreamReport>,
    ) -> Self {
        let elapsed_s = o.elapsed.as_secs_f64();
        let full: Vec<&Window> = o.windows.iter().filter(|w| !w.partial).collect();
        let stability = match (full.first(), full.last()) {
            (Some(first), Some(last)) if full.len() >= 2 && first.per_s > 0.0 => {
                let ratio = last.per_s / first.per_s;
                Some(Stability {
                    first_per_s: first.per_s,
                    last_per_s: last.per_s,
                    ratio,
                    within_10pct: (ratio - 1.0).abs() <= 0.10,
                })
            }
            _ => None,
        };
        let gateway = GatewayReport {
            cpu_s: o.cpu.gateway,
            start: o.gateway_start,
            end: o.gateway_end,
            ..gateway
        };
        let timeline = TimelineReport {
            bucket_s: o.timeline.bucket().as_secs_f64(),
            points: o.timeline.rates(o.elapsed),
        };
        Self {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            elapsed_s,
            throughput_per_s: if elapsed_s > 0.0 {
                o.counts.ok as f64 / elapsed_s
            } else {
                0.0
            },
            counts: o.counts,
            latency: o.latencies.map(Summary::of),
            added_per_delta: AddedPerDelta::of(&o.latencies.delta_gap, p.provider_gap),
            params: p,
            windows: o.windows,
            timeline,
            stability,
            gateway,
            bench_cpu_s: o.cpu.bench,
            system_cpu_s: o.cpu.system,
            processes: o.process_cpu,
            jetstream,
        }
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let load = &self.params.load;
        let what = match load.mode {
            Mode::Closed => format!("closed loop, concurrency {}", load.concurrency),
            Mode::Open => format!("open loop, {} arrivals/s", load.rate_per_s.unwrap_or(0.0)),
            Mode::Submit => format!("submit only, concurrency {}", load.concurrency),
        };
        let stream = match (load.mode, load.stream) {
            (Mode::Submit, _) => "no SSE",
            (_, StreamMode::Get) => "POST 202 then GET /events",
            (_, StreamMode::Inline) => "POST with Accept: text/event-stream",
        };
        let _ = writeln!(
            s,
            "bench [{}]: {what} ({stream}) against {} ({} backend)",
            self.params.label, self.params.url, self.params.setup.backend
        );
        let _ = writeln!(
            s,
            "  measured {:.1} s (limit: {}{}), warm-up {:.1} s{}, {} client threads on {} cores (client and gateway share them)",
            self.elapsed_s,
            load.duration_s
                .map_or_else(|| "none".into(), |d| format!("{d} s")),
            load.executions_limit
                .map_or_else(String::new, |n| format!(", {n} executions")),
            load.warmup_s,
            if load.ramp_up_s > 0.0 {
                format!(" (client starts spread over {:.1} s)", load.ramp_up_s)
            } else {
                String::new()
            },
            self.params.client_threads,
            self.nproc,
        );
        if let Some(stack) = self.params.setup.stack_line() {
            let _ = writeln!(s, "  stack: {stack}");
        }
        let unit = if load.mode == Mode::Submit {
            "submits/s"
        } else {
            "executions/s (full SSE read each)"
        };
        let _ = writeln!(
            s,
            "  ok {}  failed {}  errors {}  shed {}  issued {}",
            self.counts.ok,
            self.counts.failed,
            self.counts.errored,
            self.counts.shed,
            self.counts.issued
        );
        for (label, n) in &self.counts.errors {
            let _ = writeln!(s, "    error {label}: {n}");
        }
        let _ = writeln!(s, "  throughput: {:.1} {unit}", self.throughput_per_s);
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  {:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "latency (ms)", "count", "min", "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        let from = if load.mode == Mode::Open {
            "sched"
        } else {
            "POST"
        };
        let rows = [
            (
                if load.mode != Mode::Submit && load.stream == StreamMode::Inline {
                    format!("submit ({from}→headers)")
                } else {
                    format!("submit ({from}→202)")
                },
                &self.latency.submit,
            ),
            (format!("first delta ({from}→)"), &self.latency.first_delta),
            (
                format!("route stamped ({from}→)"),
                &self.latency.route_stamped,
            ),
            (
                format!("delta stamped ({from}→)"),
                &self.latency.first_delta_stamped,
            ),
            (format!("terminal ({from}→)"), &self.latency.terminal),
            ("dispatch lag".to_string(), &self.latency.dispatch_lag),
        ];
        for (name, summary) in rows {
            if let Some(h) = summary {
                let _ = writeln!(
                    s,
                    "  {:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9.3}",
                    name,
                    h.count,
                    ms(Some(h.min_us)),
                    ms(Some(h.p50_us)),
                    ms(Some(h.p90_us)),
                    ms(Some(h.p99_us)),
                    ms(Some(h.p999_us)),
                    ms(Some(h.max_us)),
                    h.mean_us / 1000.0
                );
            }
        }
        if let Some(h) = &self.latency.per_delta_ns {
            let _ = writeln!(
                s,
                "  per delta (ns, (last-first)/(n-1)): count {} p50 {} p90 {} p99 {} max {} mean {:.0}",
                h.count, h.p50_us, h.p90_us, h.p99_us, h.max_us, h.mean_us
            );
        }
        if let Some(a) = &self.added_per_delta {
            let _ = writeln!(
                s,
                "  added per delta (client gap - provider gap {:.3} ms, ms): count {} p50 {:.3} p90 {:.3} p99 {:.3} max {:.3} mean {:.3}",
                a.provider_gap_us as f64 / 1000.0,
                a.count,
                a.p50_us as f64 / 1000.0,
                a.p90_us as f64 / 1000.0,
                a.p99_us as f64 / 1000.0,
                a.max_us as f64 / 1000.0,
                a.mean_us / 1000.0
            );
        }
        if let Some(js) = &self.jetstream {
            let _ = writeln!(
                s,
                "  JetStream: {} event-log messages, {} job messages for {} executions: {} event-log and {} job messages per execution",
                js.events_messages,
                js.jobs_messages,
                js.executions,
                opt(js.events_per_execution),
                opt(js.jobs_per_execution)
            );
            if let (Some(changes), Some(matches), Some(misses)) = (
                js.subscription_changes,
                js.sublist_matches,
                js.sublist_misses,
            ) {
                let _ = writeln!(
                    s,
                    "  NATS subscription lists (all nodes): {changes} inserts and removes, {matches} shared lookups of which {misses} missed the cache: {} changes, {} lookups, {} misses per execution",
                    opt(js.subscription_changes_per_execution),
                    opt(js.sublist_matches_per_execution),
                    opt(js.sublist_misses_per_execution)
                );
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  {:>3} {:>8} {:>10} {:>9} {:>9} {:>6} {:>12} {:>7} {:>7} {:>7}",
            "win",
            "end s",
            "ops/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "gw RSS",
            "gw cpu",
            "bench",
            "all"
        );
        for w in &self.windows {
            let _ = writeln!(
                s,
                "  {:>3} {:>8.1} {:>10.1} {:>9} {:>9} {:>6} {:>12} {:>7} {:>7} {:>7}{}",
                w.index,
                w.end_s,
                w.per_s,
                ms(w.latency.p50_us),
                ms(w.latency.p99_us),
                w.errors + w.failed,
                mib(w.gateway_rss_kb),
                opt(w.cores.gateway),
                opt(w.cores.bench),
                opt(w.cores.system),
                if w.partial { " partial" } else { "" }
            );
        }
        if let Some(st) = &self.stability {
            let _ = writeln!(
                s,
                "  first full window {:.1}/s, last full window {:.1}/s: last/first = {:.3} ({} 10%)",
                st.first_per_s,
                st.last_per_s,
                st.ratio,
                if st.within_10pct {
                    "within"
                } else {
                    "NOT within"
                }
            );
        }
        let _ = writeln!(s);
        let g = &self.gateway;
        if let Some(end) = &g.end {
            let _ = writeln!(
                s,
                "  gateway pid {}: RSS {} at end (start {}, peak {}), {} threads",
                g.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                mib(end.rss_kb),
                mib(g.start.and_then(|st| st.rss_kb)),
                mib(end.hwm_kb),
                end.threads.map_or_else(|| "-".into(), |t| t.to_string()),
            );
        }
        let cores = |cpu: Option<f64>| {
            cpu.filter(|_| self.elapsed_s > 0.0).map_or_else(
                || "-".into(),
                |c| format!("{c:.1} s ({:.2} cores)", c / self.elapsed_s),
            )
        };
        let _ = writeln!(
            s,
            "  CPU during the run: gateway {}, bench {}, whole machine {}",
            cores(g.cpu_s),
            cores(self.bench_cpu_s),
            cores(self.system_cpu_s)
        );
        if !self.processes.is_empty() {
            let per: Vec<String> = self
                .processes
                .iter()
                .map(|p| format!("{} {}", p.name, opt(p.cores)))
                .collect();
            let _ = writeln!(s, "  cores per process: {}", per.join(", "));
        }
        if let Some(code) = g.exit_code {
            let _ = writeln!(s, "  gateway exit code after SIGTERM: {code}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_milliseconds_and_mebibytes() {
        assert_eq!(ms(Some(1500)), "1.500");
        assert_eq!(ms(None), "-");
        assert_eq!(mib(Some(2048)), "2.0 MiB");
        assert_eq!(opt(Some(0.5)), "0.50");
    }

    fn embedded() -> Setup {
        Setup {
            backend: "embedded".into(),
            nats_nodes: None,
            replicas: None,
            sync_interval: None,
            sublist_cache: None,
            worker_processes: None,
            worker_threads: None,
            gateways: None,
            partitions: None,
            tenant_lanes: None,
            exec_slots: None,
            mock_chunks: None,
            mock_delay_ms: 0,
            nofile_limit: None,
            otlp_endpoint: None,
        }
    }

    #[test]
    fn the_stack_line_names_what_a_scaling_run_varies() {
        assert_eq!(embedded().stack_line(), None);
        let one = Setup {
            backend: "nats".into(),
            nats_nodes: Some(1),
            replicas: Some(1),
            worker_processes: Some(1),
            gateways: Some(1),
            partitions: Some(1),
            tenant_lanes: Some(8),
            ..embedded()
        };
        assert_eq!(
            one.stack_line().unwrap(),
            "1 gateway, 1 worker process, 1 partition of 8 tenant lanes, 1 NATS node R1"
        );
        let many = Setup {
            nats_nodes: Some(3),
            replicas: Some(3),
            worker_processes: Some(4),
            gateways: Some(2),
            partitions: Some(8),
            tenant_lanes: Some(1),
            ..one
        };
        assert_eq!(
            many.stack_line().unwrap(),
            "2 gateways, 4 worker processes, 8 partitions of 1 tenant lane, 3 NATS nodes R3"
        );
        let threads = Setup {
            worker_threads: Some(2),
            ..many
        };
        assert_eq!(
            threads.stack_line().unwrap(),
            "2 gateways, 4 worker processes of 2 threads, 8 partitions of 1 tenant lane, 3 NATS nodes R3"
        );
    }

    #[test]
    fn the_run_parameters_stay_top_level_keys() {
        let params = Params {
            label: "l".into(),
            setup: embedded(),
            load: Load {
                mode: Mode::Open,
                stream: StreamMode::Get,
                concurrency: 8,
                rate_per_s: Some(100.0),
                duration_s: Some(5.0),
                executions_limit: None,
                warmup_s: 1.0,
                ramp_up_s: 0.0,
                window_s: 2.0,
            },
            url: "http://127.0.0.1:1".into(),
            client_threads: 2,
            provider_gap: std::time::Duration::ZERO,
        };
        let json = serde_json::to_value(&params).unwrap();
        assert!(json.get("load").is_none(), "{json}");
        assert_eq!(json["mode"], "open");
        assert_eq!(json["stream"], "get");
        assert_eq!(json["concurrency"], 8);
        assert_eq!(json["rate_per_s"], 100.0);
        assert_eq!(json["duration_s"], 5.0);
        assert_eq!(json["executions_limit"], serde_json::Value::Null);
        assert_eq!(json["warmup_s"], 1.0);
        assert_eq!(json["ramp_up_s"], 0.0);
        assert_eq!(json["window_s"], 2.0);
        assert_eq!(json["url"], "http://127.0.0.1:1");
        assert_eq!(json["client_threads"], 2);
        assert!(json.get("provider_gap").is_none());
    }
}
