//! SVG charts of one or more run reports (the JSON of `--json-out` / `--out`), drawn with
//! `plotters`' SVG backend (text is written as SVG `<text>`, so no font is loaded):
//!
//! - `throughput.svg`: completions per second over time (the report's timeline), one line per
//!   run;
//! - `exec-per-s.svg`: each run's throughput;
//! - `latency-first-delta.svg`, `latency-terminal.svg`, `latency-submit.svg`: p50/p90/p99 per
//!   run (ms);
//! - `added-per-delta.svg`: p50/p99 of the client gap between deltas minus the provider's gap;
//! - `cpu.svg`: cores used per process and run.
//!
//! `bench plot --before a.json --after b.json --out DIR` puts each "before" next to the "after"
//! of the same label, so one chart compares them.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

use crate::spawn::ProcessCpu;
use crate::stats::AddedPerDelta;

/// `bench plot` options.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// A report to chart (repeatable); its label names it.
    #[arg(long = "run")]
    pub runs: Vec<PathBuf>,
    /// Reports of the "before" build (repeatable), charted next to the `--after` of the same
    /// label.
    #[arg(long)]
    pub before: Vec<PathBuf>,
    /// Reports of the "after" build (repeatable).
    #[arg(long)]
    pub after: Vec<PathBuf>,
    /// Directory for the SVG files (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Prefix of every file name written.
    #[arg(long, default_value = "")]
    pub prefix: String,
}

/// The figures of one report that the charts use.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotRun {
    pub label: String,
    pub throughput_per_s: f64,
    /// `(seconds since the start, completions per second)`.
    pub timeline: Vec<(f64, f64)>,
    /// `[p50, p90, p99]` in ms.
    pub submit: Option<[f64; 3]>,
    pub first_delta: Option<[f64; 3]>,
    pub terminal: Option<[f64; 3]>,
    /// `[p50, p99]` in ms.
    pub added_per_delta: Option<[f64; 2]>,
    /// `(process, cores)`.
    pub cpu: Vec<(String, f64)>,
}

#[derive(Deserialize)]
struct ReportJson {
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    throughput_per_s: f64,
    #[serde(default)]
    latency: LatencyJson,
    #[serde(default)]
    added_per_delta: Option<AddedPerDelta>,
    #[serde(default)]
    timeline: Option<TimelineJson>,
    #[serde(default)]
    windows: Vec<WindowJson>,
    #[serde(default)]
    processes: Vec<ProcessCpu>,
}

/// The latencies of a report (also read by `bench targets`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LatencyJson {
    #[serde(default)]
    pub submit: Option<Percentiles>,
    #[serde(default)]
    pub first_delta: Option<Percentiles>,
    #[serde(default)]
    pub terminal: Option<Percentiles>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Percentiles {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    /// 0 when a report lacks it.
    #[serde(default)]
    pub p999_us: u64,
}

impl Percentiles {
    fn ms(&self) -> [f64; 3] {
        [self.p50_us, self.p90_us, self.p99_us].map(|v| v as f64 / 1000.0)
    }
}

#[derive(Deserialize)]
struct TimelineJson {
    points: Vec<crate::stats::TimelinePoint>,
}

#[derive(Deserialize)]
struct WindowJson {
    start_s: f64,
    per_s: f64,
}

impl PlotRun {
    /// From a report's JSON; `fallback_label` when the report has none (older reports). Reports
    /// without a timeline (older ones) chart their reporting windows instead.
    pub fn from_json(json: &str, fallback_label: &str) -> Result<Self, String> {
        let r: ReportJson =
            serde_json::from_str(json).map_err(|e| format!("not a bench report: {e}"))?;
        let timeline = match r.timeline {
            Some(t) if !t.points.is_empty() => {
                t.points.iter().map(|p| (p.start_s, p.per_s)).collect()
            }
            _ => r.windows.iter().map(|w| (w.start_s, w.per_s)).collect(),
        };
        Ok(Self {
            label: r.label.unwrap_or_else(|| fallback_label.to_string()),
            throughput_per_s: r.throughput_per_s,
            timeline,
            submit: r.latency.submit.as_ref().map(Percentiles::ms),
            first_delta: r.latency.first_delta.as_ref().map(Percentiles::ms),
            terminal: r.latency.terminal.as_ref().map(Percentiles::ms),
            added_per_delta: r
                .added_per_delta
                .map(|a| [a.p50_us as f64 / 1000.0, a.p99_us as f64 / 1000.0]),
            cpu: r
                .processes
                .iter()
                .filter_map(|p| p.cores.map(|c| (p.name.clone(), c)))
                .collect(),
        })
    }

    fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .map_or_else(|| "run".into(), |s| s.to_string_lossy().into_owned());
        Self::from_json(&text, &stem).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// `bench plot`.
pub fn run(a: &PlotArgs) -> Result<(), String> {
    let mut runs = Vec::new();
    for path in &a.runs {
        runs.push(PlotRun::read(path)?);
    }
    let before = a
        .before
        .iter()
        .map(|p| PlotRun::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    let after = a
        .after
        .iter()
        .map(|p| PlotRun::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    runs.extend(pair_before_after(before, after));
    if runs.is_empty() {
        return Err("bench plot: give reports with --run, or --before and --after".into());
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let written = write_charts(&runs, &a.out, &a.prefix)?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

/// Orders `before` and `after` so that each "before" is followed by the "after" of the same
/// label; labels get ` before` / ` after`. Unmatched reports keep their place at the end.
pub fn pair_before_after(before: Vec<PlotRun>, after: Vec<PlotRun>) -> Vec<PlotRun> {
    let mut after: Vec<Option<PlotRun>> = after.into_iter().map(Some).collect();
    let mut out = Vec::new();
    let tag = |mut r: PlotRun, what: &str| {
        r.label = format!("{} {what}", r.label);
        r
    };
    for b in before {
        let matching = after
            .iter_mut()
            .find(|a| a.as_ref().is_some_and(|a| a.label == b.label))
            .and_then(Option::take);
        out.push(tag(b, "before"));
        if let Some(a) = matching {
            out.push(tag(a, "after"));
        }
    }
    out.extend(after.into_iter().flatten().map(|a| tag(a, "after")));
    out
}

/// Writes every chart the runs have data for into `dir`, names prefixed with `prefix`; returns
/// the files written.
pub fn write_charts(runs: &[PlotRun], dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let path = |name: &str| dir.join(format!("{prefix}{name}.svg"));

    let lines: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .filter(|r| !r.timeline.is_empty())
        .map(|r| (r.label.clone(), r.timeline.clone()))
        .collect();
    if !lines.is_empty() {
        let p = path("throughput");
        line_chart(
            &p,
            "Throughput over time",
            "seconds since the measured start",
            "completions per second",
            &lines,
            false,
        )?;
        written.push(p);
    }

    let p = path("exec-per-s");
    bar_chart(
        &p,
        "Throughput",
        "completions per second",
        &labels,
        &[(
            "per second".to_string(),
            runs.iter().map(|r| Some(r.throughput_per_s)).collect(),
        )],
    )?;
    written.push(p);

    let percentile_names = ["p50", "p90", "p99"];
    for (name, title, pick) in [
        (
            "latency-first-delta",
            "Time to the first output.delta",
            (|r: &PlotRun| r.first_delta) as fn(&PlotRun) -> Option<[f64; 3]>,
        ),
        (
            "latency-terminal",
            "Time to the terminal event",
            |r: &PlotRun| r.terminal,
        ),
        ("latency-submit", "Submit (POST to 202)", |r: &PlotRun| {
            r.submit
        }),
    ] {
        if runs.iter().all(|r| pick(r).is_none()) {
            continue;
        }
        let series: Vec<(String, Vec<Option<f64>>)> = percentile_names
            .iter()
            .enumerate()
            .map(|(k, n)| {
                (
                    n.to_string(),
                    runs.iter().map(|r| pick(r).map(|v| v[k])).collect(),
                )
            })
            .collect();
        let p = path(name);
        bar_chart(&p, title, "milliseconds", &labels, &series)?;
        written.push(p);
    }

    if runs.iter().any(|r| r.added_per_delta.is_some()) {
        let series: Vec<(String, Vec<Option<f64>>)> = ["p50", "p99"]
            .iter()
            .enumerate()
            .map(|(k, n)| {
                (
                    n.to_string(),
                    runs.iter()
                        .map(|r| r.added_per_delta.map(|v| v[k]))
                        .collect(),
                )
            })
            .collect();
        let p = path("added-per-delta");
        bar_chart(
            &p,
            "Added time per delta (client gap minus provider gap)",
            "milliseconds",
            &labels,
            &series,
        )?;
        written.push(p);
    }

    let mut processes: Vec<String> = Vec::new();
    for r in runs {
        for (name, _) in &r.cpu {
            if !processes.contains(name) {
                processes.push(name.clone());
            }
        }
    }
    if !processes.is_empty() {
        let series: Vec<(String, Vec<Option<f64>>)> = processes
            .iter()
            .map(|p| {
                (
                    p.clone(),
                    runs.iter()
                        .map(|r| r.cpu.iter().find(|(n, _)| n == p).map(|(_, c)| *c))
                        .collect(),
                )
            })
            .collect();
        let p = path("cpu");
        bar_chart(&p, "CPU per process", "cores", &labels, &series)?;
        written.push(p);
    }
    Ok(written)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("cannot draw the chart: {e}")
}

/// A chart of `f64` coordinates on an SVG drawing area.
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Fills `root` white and builds a chart on it: `title` above, `x_label_area` pixels for the
/// x labels, 70 for the y labels.
fn chart_on<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
    x_label_area: u32,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> Result<Chart<'a, 'b>, String> {
    root.fill(&WHITE).map_err(err)?;
    ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(x_label_area)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(err)
}

/// Draws the series' legend at `position`.
fn draw_legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// One line per series over a shared x axis; with `markers`, a dot on every point too (for a
/// few measured points, such as throughput against worker processes).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    markers: bool,
) -> Result<(), String> {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (x_max, y_max) = points.fold((0f64, 0f64), |(x, y), (px, py)| (x.max(*px), y.max(*py)));
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    // Measured points sit on whole settings (1, 2, 4, 8 workers): labelled there alone.
    let x = if markers {
        0.5..x_max.max(1.0) + 0.5
    } else {
        0f64..(x_max * 1.02).max(1.0)
    };
    let whole = |v: &f64| {
        if (v - v.round()).abs() < 1e-9 {
            format!("{v:.0}")
        } else {
            String::new()
        }
    };
    let mut chart = chart_on(&root, title, 45, x, 0f64..(y_max * 1.1).max(1.0))?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc).y_desc(y_desc);
    if markers {
        // At most 16 labels, one per whole setting up to 15, then every other and so on.
        let labels = (x_max.max(1.0) as usize).min(16);
        mesh.x_labels(labels + 1).x_label_formatter(&whole);
    }
    mesh.draw().map_err(err)?;
    for (k, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if markers {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)
}

/// Grouped bars: one group per label, one bar per series in each group (a missing value draws
/// no bar). Negative values go below the zero line.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    labels: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<(), String> {
    let n = labels.len().max(1);
    let values = series.iter().flat_map(|(_, v)| v.iter().flatten());
    let (lo, hi) = values.fold((0f64, 0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let span = (hi - lo).max(1e-3);
    let (y_lo, y_hi) = (
        if lo < 0.0 { lo - 0.08 * span } else { 0.0 },
        hi + 0.12 * span,
    );
    let width = (160 * n as u32 + 200).clamp(700, 2400);
    let root = SVGBackend::new(path, (width, 560)).into_drawing_area();
    let mut chart = chart_on(&root, title, 50, 0f64..n as f64, y_lo..y_hi)?;
    // The x axis is categorical: no numeric labels; each group's name goes under its centre.
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|_| String::new())
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    let name_style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, label) in labels.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, y_lo));
        root.draw(&Text::new(label.as_str(), (x, y + 10), &name_style))
            .map_err(err)?;
    }
    let k_total = series.len().max(1) as f64;
    let bar = 0.8 / k_total;
    for (k, (name, vals)) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(vals.iter().enumerate().filter_map(|(i, v)| {
                v.map(|v| {
                    let x0 = i as f64 + 0.1 + k as f64 * bar;
                    Rectangle::new([(x0, 0.0), (x0 + bar * 0.92, v)], color.filled())
                })
            }))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(err)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn run(label: &str, added: Option<[f64; 2]>) -> PlotRun {
        PlotRun {
            label: label.into(),
            throughput_per_s: 250.0,
            timeline: vec![(0.0, 240.0), (1.0, 260.0), (2.0, 250.0)],
            submit: Some([0.4, 0.6, 0.9]),
            first_delta: Some([12.0, 15.0, 30.0]),
            terminal: Some([1_140.0, 1_200.0, 1_400.0]),
            added_per_delta: added,
            cpu: vec![("gateway".into(), 0.5), ("nats-n0".into(), 0.8)],
        }
    }

    pub(crate) fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "bench-plot-test-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Every text node of an SVG document, which must parse as XML with an `svg` root.
    pub(crate) fn svg_texts(path: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect()
    }

    #[test]
    fn charts_are_svg_documents_with_every_series_and_label() {
        let dir = temp_dir("all");
        let runs = [
            run("embedded-c256", None),
            run("nats-c256", Some([0.3, -2.5])),
        ];
        let written = write_charts(&runs, &dir, "t-").unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for expected in [
            "t-throughput.svg",
            "t-exec-per-s.svg",
            "t-latency-first-delta.svg",
            "t-latency-terminal.svg",
            "t-latency-submit.svg",
            "t-added-per-delta.svg",
            "t-cpu.svg",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
        let throughput = svg_texts(&dir.join("t-throughput.svg"));
        assert!(throughput.iter().any(|t| t == "embedded-c256"));
        assert!(throughput.iter().any(|t| t == "nats-c256"));
        let terminal = svg_texts(&dir.join("t-latency-terminal.svg"));
        for series in ["p50", "p90", "p99", "embedded-c256", "nats-c256"] {
            assert!(
                terminal.iter().any(|t| t == series),
                "{series} in {terminal:?}"
            );
        }
        let added = svg_texts(&dir.join("t-added-per-delta.svg"));
        assert!(added.iter().any(|t| t == "p99"));
        let cpu = svg_texts(&dir.join("t-cpu.svg"));
        assert!(cpu.iter().any(|t| t == "nats-n0"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_token_stream_no_added_per_delta_chart() {
        let dir = temp_dir("none");
        let written = write_charts(&[run("a", None)], &dir, "").unwrap();
        assert!(!written.iter().any(|p| p.ends_with("added-per-delta.svg")));
        assert!(dir.join("throughput.svg").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn before_and_after_of_one_label_sit_side_by_side() {
        let paired = pair_before_after(
            vec![run("x", None), run("y", None)],
            vec![run("y", None), run("z", None), run("x", None)],
        );
        let labels: Vec<&str> = paired.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["x before", "x after", "y before", "y after", "z after"]
        );
    }

    #[test]
    fn reads_a_report_and_falls_back_to_windows_and_the_file_name() {
        let json = r#"{
            "throughput_per_s": 12.5,
            "latency": {"terminal": {"count": 3, "min_us": 1, "mean_us": 2.0, "p50_us": 1500,
                         "p90_us": 2000, "p99_us": 2500, "p999_us": 2500, "max_us": 2500}},
            "windows": [{"start_s": 0.0, "per_s": 10.0}, {"start_s": 5.0, "per_s": 15.0}]
        }"#;
        let r = PlotRun::from_json(json, "old").unwrap();
        assert_eq!(r.label, "old");
        assert_eq!(r.terminal, Some([1.5, 2.0, 2.5]));
        assert_eq!(r.timeline, vec![(0.0, 10.0), (5.0, 15.0)]);
        assert!(r.first_delta.is_none() && r.added_per_delta.is_none());
        assert!(PlotRun::from_json("[1]", "x").is_err());
    }
}
