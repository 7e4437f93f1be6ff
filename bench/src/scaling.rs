//! `bench scaling`: throughput and latency against worker processes, partitions, gateways and
//! NATS nodes (issue 31, item 4), from the reports of `scripts/bench-all.sh` group s (or t).
//!
//! Each report's `setup` names the stack it ran against (its partitions as the namespace
//! records them), so the runs need no naming convention. Written into `--out`:
//! - `{prefix}scaling.md`: a row per report: throughput, its ratio to the same configuration
//!   with one worker process, errors, terminal and first-delta latencies, and the cores each
//!   kind of process used, under the machine's cores;
//! - `{prefix}scaling-{workers,partitions,gateways,nodes}.svg`: throughput against each
//!   setting, one line per workload and the other settings, drawn where runs differ in that
//!   setting alone.
//!
//! Several reports of one configuration (rounds) make one point of a chart, the median of
//! their throughputs; the table keeps every report. Reports without a distributed stack
//! (embedded runs) are listed as left out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plot::{LatencyJson, Percentiles, line_chart};
use crate::report::plural;
use crate::spawn::ProcessCpu;
use crate::targets::median;

/// `bench scaling` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ScalingArgs {
    /// Reports (the `--out` JSON of `bench`) or directories holding them.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Only a directory's reports whose file name starts with this (`s-` for group s); it also
    /// starts the name of every file written.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Directory for the table and the charts (created if missing).
    #[arg(long)]
    pub out: PathBuf,
}

/// The settings a scaling run varies, and its workload. Ordered as the table's rows are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Config {
    /// `zero-delay`, or the mock's chunks and delay (`3 × 50 ms`).
    pub workload: String,
    pub nodes: usize,
    pub replicas: u8,
    pub gateways: u16,
    /// As the namespace recorded it; `None` in reports from before the harness read it.
    pub partitions: Option<u16>,
    pub workers: usize,
    /// Runtime threads of each worker process (`--worker-threads`); `None`: one per core.
    pub worker_threads: Option<u16>,
}

/// Cores used over the measured run, summed per kind of process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cores {
    pub gateways: f64,
    pub workers: f64,
    pub nats: f64,
    pub bench: f64,
}

/// The figures of one report that the table and charts use.
#[derive(Debug, Clone)]
pub struct ScalingRun {
    pub label: String,
    pub config: Config,
    /// The machine's cores as the harness saw them.
    pub nproc: Option<usize>,
    pub throughput_per_s: f64,
    /// Executions that failed or ended in a client error.
    pub errors: u64,
    pub terminal: Option<Percentiles>,
    pub first_delta: Option<Percentiles>,
    pub cores: Cores,
}

#[derive(Deserialize)]
struct ReportJson {
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    nproc: Option<usize>,
    #[serde(default)]
    failed: u64,
    #[serde(default)]
    errored: u64,
    #[serde(default)]
    throughput_per_s: f64,
    #[serde(default)]
    latency: LatencyJson,
    #[serde(default)]
    setup: Option<SetupJson>,
    #[serde(default)]
    processes: Vec<ProcessCpu>,
}

#[derive(Deserialize)]
struct SetupJson {
    #[serde(default)]
    nats_nodes: Option<usize>,
    #[serde(default)]
    replicas: Option<u8>,
    #[serde(default)]
    gateways: Option<u16>,
    #[serde(default)]
    partitions: Option<u16>,
    #[serde(default)]
    worker_processes: Option<usize>,
    #[serde(default)]
    worker_threads: Option<u16>,
    #[serde(default)]
    mock_chunks: Option<usize>,
    #[serde(default)]
    mock_delay_ms: u64,
}

/// The workload's name: `zero-delay`, or the mock's chunks (three unless set) and delay.
fn workload(chunks: Option<usize>, delay_ms: u64) -> String {
    match delay_ms {
        0 => "zero-delay".into(),
        d => format!("{} × {d} ms", chunks.unwrap_or(3)),
    }
}

impl ScalingRun {
    /// From a report's JSON; `Ok(None)` for a report without a distributed stack.
    pub fn from_json(json: &str, fallback_label: &str) -> Result<Option<Self>, String> {
        let r: ReportJson =
            serde_json::from_str(json).map_err(|e| format!("not a bench report: {e}"))?;
        let Some(setup) = r.setup else {
            return Ok(None);
        };
        let Some(nodes) = setup.nats_nodes else {
            return Ok(None);
        };
        let mut cores = Cores::default();
        for p in &r.processes {
            let Some(c) = p.cores else { continue };
            let kind = match p.name.as_str() {
                n if n.starts_with("gateway") => &mut cores.gateways,
                n if n.starts_with("worker") => &mut cores.workers,
                n if n.starts_with("nats") => &mut cores.nats,
                "bench" => &mut cores.bench,
                _ => continue,
            };
            *kind += c;
        }
        Ok(Some(Self {
            label: r.label.unwrap_or_else(|| fallback_label.to_string()),
            config: Config {
                workload: workload(setup.mock_chunks, setup.mock_delay_ms),
                nodes,
                replicas: setup.replicas.unwrap_or(1),
                gateways: setup.gateways.unwrap_or(1),
                partitions: setup.partitions,
                workers: setup.worker_processes.unwrap_or(1),
                worker_threads: setup.worker_threads,
            },
            nproc: r.nproc,
            throughput_per_s: r.throughput_per_s,
            errors: r.failed + r.errored,
            terminal: r.latency.terminal,
            first_delta: r.latency.first_delta,
            cores,
        }))
    }
}

/// A setting throughput is charted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Workers,
    Partitions,
    Gateways,
    Nodes,
}

impl Axis {
    pub const ALL: [Self; 4] = [Self::Workers, Self::Partitions, Self::Gateways, Self::Nodes];

    /// The chart's file name part.
    fn name(self) -> &'static str {
        match self {
            Self::Workers => "workers",
            Self::Partitions => "partitions",
            Self::Gateways => "gateways",
            Self::Nodes => "nodes",
        }
    }

    fn described(self) -> &'static str {
        match self {
            Self::Workers => "worker processes",
            Self::Partitions => "partitions",
            Self::Gateways => "gateway processes",
            Self::Nodes => "NATS nodes (replicas = nodes)",
        }
    }

    /// The setting's value in `c` (`None`: not known).
    fn value(self, c: &Config) -> Option<u64> {
        match self {
            Self::Workers => u64::try_from(c.workers).ok(),
            Self::Partitions => c.partitions.map(u64::from),
            Self::Gateways => Some(u64::from(c.gateways)),
            Self::Nodes => u64::try_from(c.nodes).ok(),
        }
    }

    /// `c` without this setting: the runs of one line share it. A cluster's replicas go with
    /// its nodes (one node R1 against three R3).
    fn rest(self, c: &Config) -> Config {
        let mut rest = c.clone();
        match self {
            Self::Workers => rest.workers = 0,
            Self::Partitions => rest.partitions = None,
            Self::Gateways => rest.gateways = 0,
            Self::Nodes => {
                rest.nodes = 0;
                rest.replicas = 0;
            }
        }
        rest
    }
}

/// The lines of `axis`'s chart: for every configuration but that setting, its runs'
/// throughput (the median of a configuration's reports) at each value of the setting, where
/// there are at least two values.
pub fn lines(runs: &[ScalingRun], axis: Axis) -> Vec<(Config, Vec<(f64, f64)>)> {
    let mut by_rest: BTreeMap<Config, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for run in runs {
        if let Some(x) = axis.value(&run.config) {
            by_rest
                .entry(axis.rest(&run.config))
                .or_default()
                .entry(x)
                .or_default()
                .push(run.throughput_per_s);
        }
    }
    by_rest
        .into_iter()
        .filter(|(_, points)| points.len() >= 2)
        .map(|(rest, points)| {
            let points = points
                .into_iter()
                .map(|(x, ys)| (x as f64, median(ys).unwrap_or(0.0)))
                .collect();
            (rest, points)
        })
        .collect()
}

/// Each line's name: the workload and settings in which the chart's lines differ; a chart's
/// only line names them all.
fn line_names(rests: &[&Config], axis: Axis) -> Vec<String> {
    // The worker threads go with no axis: a line never leaves them out of its name.
    let parts = |c: &Config| -> Vec<(Option<Axis>, String)> {
        vec![
            (
                Some(Axis::Partitions),
                c.partitions.map_or_else(
                    || "partitions unknown".into(),
                    |p| plural(p.into(), "partition"),
                ),
            ),
            (Some(Axis::Workers), plural(c.workers, "worker")),
            (
                None,
                c.worker_threads.map_or_else(
                    || "worker threads per core".into(),
                    |t| format!("{} per worker", plural(t.into(), "thread")),
                ),
            ),
            (Some(Axis::Gateways), plural(c.gateways.into(), "gateway")),
            (
                Some(Axis::Nodes),
                format!("{} R{}", plural(c.nodes, "node"), c.replicas),
            ),
        ]
    };
    let all: Vec<Vec<(Option<Axis>, String)>> = rests.iter().map(|c| parts(c)).collect();
    let workloads_differ = rests.iter().any(|c| c.workload != rests[0].workload);
    rests
        .iter()
        .zip(&all)
        .map(|(c, own)| {
            let mut name: Vec<String> = Vec::new();
            if workloads_differ || rests.len() == 1 {
                name.push(c.workload.clone());
            }
            for (k, (part_axis, text)) in own.iter().enumerate() {
                let differs = all.iter().any(|other| other[k].1 != *text);
                let shown = match part_axis {
                    Some(part_axis) => *part_axis != axis && (differs || rests.len() == 1),
                    // Named only where lines differ in it.
                    None => differs,
                };
                if shown {
                    name.push(text.clone());
                }
            }
            if name.is_empty() {
                name.push(c.workload.clone());
            }
            name.join(", ")
        })
        .collect()
}

/// The ratio of `run`'s throughput to its configuration's with one worker process (the
/// median of those reports); `None` without such a report.
fn ratio_to_one_worker(run: &ScalingRun, runs: &[ScalingRun]) -> Option<f64> {
    let one = Config {
        workers: 1,
        worker_threads: None,
        ..run.config.clone()
    };
    let base: Vec<f64> = runs
        .iter()
        .filter(|r| r.config == one)
        .map(|r| r.throughput_per_s)
        .collect();
    let base = median(base)?;
    (base > 0.0).then(|| run.throughput_per_s / base)
}

fn ms(p: &Option<Percentiles>) -> String {
    p.as_ref().map_or_else(
        || "—".into(),
        |p| {
            format!(
                "{:.1} / {:.1}",
                p.p50_us as f64 / 1000.0,
                p.p99_us as f64 / 1000.0
            )
        },
    )
}

/// The table (`{prefix}scaling.md`): a row per report, in the order of their configurations.
pub fn table(runs: &[ScalingRun], left_out: &[String]) -> String {
    let mut sorted: Vec<&ScalingRun> = runs.iter().collect();
    sorted.sort_by(|a, b| a.config.cmp(&b.config).then(a.label.cmp(&b.label)));
    let mut cores: Vec<usize> = runs.iter().filter_map(|r| r.nproc).collect();
    cores.sort_unstable();
    cores.dedup();
    let cores = match cores.as_slice() {
        [] => "not recorded".to_string(),
        [one] => one.to_string(),
        many => format!(
            "{} (the reports differ)",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut s = String::new();
    let _ = writeln!(s, "# Scaling\n");
    let _ = writeln!(
        s,
        "Machine: {cores} cores, every process on it. Throughput in executions/s (a full SSE \
         read each); × 1 worker: against the same configuration with one worker process; \
         latencies p50 / p99 in ms; cores: what each kind of process used on average over \
         the measured run.\n"
    );
    let _ = writeln!(
        s,
        "| run | workload | NATS nodes | gateways | partitions | workers | exec/s | × 1 worker \
         | errors | terminal | first delta | cores: gateways / workers / nats-server / bench |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"
    );
    for run in sorted {
        let c = &run.config;
        let ratio =
            ratio_to_one_worker(run, runs).map_or_else(|| "—".into(), |r| format!("{r:.2}×"));
        let _ = writeln!(
            s,
            "| {} | {} | {} R{} | {} | {} | {} | {:.0} | {ratio} | {} | {} | {} | {:.2} / {:.2} / {:.2} / {:.2} |",
            run.label,
            c.workload,
            c.nodes,
            c.replicas,
            c.gateways,
            c.partitions.map_or_else(|| "?".into(), |p| p.to_string()),
            c.worker_threads.map_or_else(
                || c.workers.to_string(),
                |t| format!("{} ({} each)", c.workers, plural(t.into(), "thread"))
            ),
            run.throughput_per_s,
            run.errors,
            ms(&run.terminal),
            ms(&run.first_delta),
            run.cores.gateways,
            run.cores.workers,
            run.cores.nats,
            run.cores.bench,
        );
    }
    if !left_out.is_empty() {
        let _ = writeln!(
            s,
            "\nLeft out (no distributed stack): {}.",
            left_out.join(", ")
        );
    }
    s
}

/// Writes the table and every chart the runs have two points of into `dir`; returns the
/// files written.
pub fn write(
    runs: &[ScalingRun],
    left_out: &[String],
    dir: &Path,
    prefix: &str,
) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    let table_path = dir.join(format!("{prefix}scaling.md"));
    std::fs::write(&table_path, table(runs, left_out))
        .map_err(|e| format!("cannot write {}: {e}", table_path.display()))?;
    written.push(table_path);
    for axis in Axis::ALL {
        let lines = lines(runs, axis);
        if lines.is_empty() {
            continue;
        }
        let rests: Vec<&Config> = lines.iter().map(|(rest, _)| rest).collect();
        let named: Vec<(String, Vec<(f64, f64)>)> = line_names(&rests, axis)
            .into_iter()
            .zip(lines.iter().map(|(_, points)| points.clone()))
            .collect();
        let path = dir.join(format!("{prefix}scaling-{}.svg", axis.name()));
        line_chart(
            &path,
            &format!("Throughput against {}", axis.described()),
            axis.described(),
            "executions per second",
            &named,
            true,
        )?;
        written.push(path);
    }
    Ok(written)
}

/// The reports `inputs` name: files as given, and a directory's `*.json` whose name starts
/// with `prefix`, in name order.
fn report_paths(inputs: &[PathBuf], prefix: &str) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            paths.push(input.clone());
            continue;
        }
        let entries = std::fs::read_dir(input)
            .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "json")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect();
        found.sort();
        paths.extend(found);
    }
    Ok(paths)
}

/// `bench scaling`.
pub fn run(a: &ScalingArgs) -> Result<(), String> {
    let mut runs = Vec::new();
    let mut left_out = Vec::new();
    for path in report_paths(&a.inputs, &a.prefix)? {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .map_or_else(|| "run".into(), |s| s.to_string_lossy().into_owned());
        match ScalingRun::from_json(&text, &stem).map_err(|e| format!("{}: {e}", path.display()))? {
            Some(run) => runs.push(run),
            None => left_out.push(stem),
        }
    }
    if runs.is_empty() {
        return Err("bench scaling: no report of a distributed stack among the inputs".into());
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    for path in write(&runs, &left_out, &a.out, &a.prefix)? {
        println!("{}", path.display());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::plot::tests::{svg_texts, temp_dir};

    /// A report as `bench --out` writes it (the fields this module reads).
    fn report(label: &str, workers: usize, partitions: u16, delay_ms: u64, per_s: f64) -> String {
        serde_json::json!({
            "label": label,
            "nproc": 16,
            "ok": 1000, "failed": 1, "errored": 2,
            "throughput_per_s": per_s,
            "latency": {"terminal": {"count": 3, "min_us": 1, "mean_us": 2.0, "p50_us": 1500,
                        "p90_us": 2000, "p99_us": 2500, "p999_us": 2500, "max_us": 2500}},
            "setup": {"backend": "nats", "nats_nodes": 1, "replicas": 1, "gateways": 1,
                      "partitions": partitions, "tenant_lanes": 8, "worker_processes": workers,
                      "mock_chunks": if delay_ms > 0 { Some(3) } else { None },
                      "mock_delay_ms": delay_ms},
            "processes": [
                {"name": "gateway", "pid": 1, "cpu_s": 10.0, "cores": 1.0, "rss_end_kb": 1},
                {"name": "worker-1", "pid": 2, "cpu_s": 5.0, "cores": 0.5, "rss_end_kb": 1},
                {"name": "worker-2", "pid": 3, "cpu_s": 5.0, "cores": 0.25, "rss_end_kb": 1},
                {"name": "nats-n0", "pid": 4, "cpu_s": 20.0, "cores": 2.0, "rss_end_kb": 1},
                {"name": "redis", "pid": 5, "cpu_s": 0.1, "cores": 0.01, "rss_end_kb": 1},
                {"name": "bench", "pid": 6, "cpu_s": 3.0, "cores": 0.3, "rss_end_kb": 1}
            ]
        })
        .to_string()
    }

    /// The table's row of the run `label`.
    fn row_of<'a>(table: &'a str, label: &str) -> &'a str {
        let start = format!("| {label} ");
        table.lines().find(|l| l.starts_with(&start)).unwrap()
    }

    fn run(label: &str, workers: usize, partitions: u16, delay_ms: u64, per_s: f64) -> ScalingRun {
        ScalingRun::from_json(&report(label, workers, partitions, delay_ms, per_s), "x")
            .unwrap()
            .unwrap()
    }

    /// Group s's matrix, smaller: workers 1, 2, 4 over partitions 1 and 8, both workloads.
    fn matrix() -> Vec<ScalingRun> {
        let mut runs = Vec::new();
        for p in [1, 8] {
            for w in [1, 2, 4] {
                let zero = 1000.0 * w as f64 + f64::from(p);
                runs.push(run(&format!("s-zero-p{p}-w{w}"), w, p, 0, zero));
                runs.push(run(&format!("s-io-p{p}-w{w}"), w, p, 50, 800.0 * w as f64));
            }
        }
        runs
    }

    #[test]
    fn a_report_gives_its_configuration_and_the_cores_of_each_kind_of_process() {
        let r = run("s-io-p8-w2", 2, 8, 50, 1600.0);
        assert_eq!(
            r.config,
            Config {
                workload: "3 × 50 ms".into(),
                nodes: 1,
                replicas: 1,
                gateways: 1,
                partitions: Some(8),
                workers: 2,
                worker_threads: None,
            }
        );
        assert_eq!(r.errors, 3);
        assert_eq!(r.nproc, Some(16));
        assert_eq!(
            r.cores,
            Cores {
                gateways: 1.0,
                workers: 0.75,
                nats: 2.0,
                bench: 0.3
            }
        );
        assert_eq!(run("z", 1, 1, 0, 1.0).config.workload, "zero-delay");
        let embedded = r#"{"throughput_per_s": 5.0, "setup": {"backend": "embedded",
            "nats_nodes": null, "mock_delay_ms": 0}}"#;
        assert!(ScalingRun::from_json(embedded, "e").unwrap().is_none());
        assert!(ScalingRun::from_json("not json", "e").is_err());
    }

    #[test]
    fn each_line_is_one_configuration_against_one_setting() {
        let runs = matrix();
        let workers = lines(&runs, Axis::Workers);
        // Two workloads × two partition counts, each over workers 1, 2, 4.
        assert_eq!(workers.len(), 4);
        let zero_p8 = workers
            .iter()
            .find(|(c, _)| c.workload == "zero-delay" && c.partitions == Some(8))
            .unwrap();
        assert_eq!(zero_p8.1, vec![(1.0, 1008.0), (2.0, 2008.0), (4.0, 4008.0)]);
        let partitions = lines(&runs, Axis::Partitions);
        assert_eq!(partitions.len(), 6, "two workloads × three worker counts");
        assert!(partitions.iter().all(|(_, points)| points.len() == 2));
        // No run differs in gateways or nodes alone: no such chart.
        assert!(lines(&runs, Axis::Gateways).is_empty());
        assert!(lines(&runs, Axis::Nodes).is_empty());
    }

    #[test]
    fn rounds_of_one_configuration_make_one_point_their_median() {
        let runs = vec![
            run("a", 1, 8, 0, 100.0),
            run("a", 1, 8, 0, 300.0),
            run("a", 1, 8, 0, 200.0),
            run("b", 2, 8, 0, 500.0),
        ];
        assert_eq!(
            lines(&runs, Axis::Workers)[0].1,
            vec![(1.0, 200.0), (2.0, 500.0)]
        );
        let ratio = ratio_to_one_worker(&runs[3], &runs).unwrap();
        assert!((ratio - 2.5).abs() < 1e-9);
    }

    #[test]
    fn a_cluster_is_charted_against_one_node_with_its_replicas() {
        let mut three = run("s-zero-nodes3", 4, 8, 0, 900.0);
        three.config.nodes = 3;
        three.config.replicas = 3;
        let runs = vec![run("s-zero-nodes1", 4, 8, 0, 1000.0), three];
        let nodes = lines(&runs, Axis::Nodes);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].1, vec![(1.0, 1000.0), (3.0, 900.0)]);
    }

    #[test]
    fn lines_are_named_by_what_tells_them_apart() {
        let runs = matrix();
        let workers = lines(&runs, Axis::Workers);
        let rests: Vec<&Config> = workers.iter().map(|(c, _)| c).collect();
        let names = line_names(&rests, Axis::Workers);
        assert!(
            names.contains(&"zero-delay, 8 partitions".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"3 × 50 ms, 1 partition".to_string()),
            "{names:?}"
        );
        let one = run("a", 1, 8, 0, 1.0).config;
        assert_eq!(
            line_names(&[&one], Axis::Workers),
            ["zero-delay, 8 partitions, 1 gateway, 1 node R1"]
        );
        let threaded = Config {
            worker_threads: Some(2),
            ..one.clone()
        };
        assert_eq!(
            line_names(&[&one, &threaded], Axis::Workers),
            ["worker threads per core", "2 threads per worker"]
        );
    }

    #[test]
    fn a_run_with_capped_worker_threads_is_a_configuration_of_its_own() {
        let json = report("t-zero-p8-w8-t2", 8, 8, 0, 900.0).replace(
            "\"worker_processes\":8",
            "\"worker_processes\":8,\"worker_threads\":2",
        );
        let threaded = ScalingRun::from_json(&json, "x").unwrap().unwrap();
        assert_eq!(threaded.config.worker_threads, Some(2));
        let runs = [
            run("w1", 1, 8, 0, 300.0),
            run("w8", 8, 8, 0, 600.0),
            threaded,
        ];
        let text = table(&runs, &[]);
        let row = row_of(&text, "t-zero-p8-w8-t2");
        assert!(
            row.contains("| 8 (2 threads each) | 900 | 3.00× |"),
            "{row}"
        );
        let workers = lines(&runs, Axis::Workers);
        assert_eq!(
            workers.len(),
            1,
            "a lone threaded run is no line of its own"
        );
        assert_eq!(workers[0].1, [(1.0, 300.0), (8.0, 600.0)]);
        let single = report("t-tokens-shared", 4, 8, 0, 400.0).replace(
            "\"worker_processes\":4",
            "\"worker_processes\":4,\"worker_threads\":1",
        );
        let single = ScalingRun::from_json(&single, "x").unwrap().unwrap();
        let text = table(&[single], &[]);
        assert!(
            row_of(&text, "t-tokens-shared").contains("| 4 (1 thread each) |"),
            "{text}"
        );
    }

    #[test]
    fn the_table_has_a_row_per_report_with_its_ratio_and_cores() {
        let runs = matrix();
        let text = table(&runs, &["t-embedded-c256".into()]);
        assert!(text.contains("Machine: 16 cores"), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("| s-")).count(), 12);
        let row = row_of(&text, "s-io-p8-w4");
        assert!(
            row.contains("| 3200 | 4.00× | 3 | 1.5 / 2.5 | — |"),
            "{row}"
        );
        assert!(row.ends_with("| 1.00 / 0.75 / 2.00 / 0.30 |"), "{row}");
        assert!(text.contains("Left out (no distributed stack): t-embedded-c256."));
    }

    #[test]
    fn writes_the_table_and_a_chart_per_setting_that_varies() {
        let dir = temp_dir("scaling");
        for r in matrix() {
            let (w, p) = (r.config.workers, r.config.partitions.unwrap());
            let delay = if r.config.workload == "zero-delay" {
                0
            } else {
                50
            };
            let json = report(&r.label, w, p, delay, r.throughput_per_s);
            std::fs::write(dir.join(format!("{}.json", r.label)), json).unwrap();
        }
        std::fs::write(dir.join("t-other.json"), "not json").unwrap();
        let out = dir.join("out");
        run_args(&dir, &out);
        let names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        for expected in [
            "s-scaling.md",
            "s-scaling-workers.svg",
            "s-scaling-partitions.svg",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
        assert!(
            !names
                .iter()
                .any(|n| n.contains("gateways") || n.contains("nodes"))
        );
        let texts = svg_texts(&out.join("s-scaling-workers.svg"));
        assert!(
            texts.iter().any(|t| t == "zero-delay, 8 partitions"),
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t.contains("worker processes")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn run_args(dir: &Path, out: &Path) {
        super::run(&ScalingArgs {
            inputs: vec![dir.to_path_buf()],
            prefix: "s-".into(),
            out: out.to_path_buf(),
        })
        .unwrap();
    }
}
