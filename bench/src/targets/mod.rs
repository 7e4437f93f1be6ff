//! `bench targets`: the verdict on an issue's targets from the reports of the runs that judge
//! them, one output directory of `scripts/bench-all.sh` per round.
//!
//! - `--issue 14` (the default): item 4's token-stream targets, from group a
//!   ([`issue14`]);
//! - `--issue 31`: the scale-out targets for a many-core machine, from group t and the
//!   fairness run of `scripts/bench-device.sh` ([`issue31`]).
//!
//! A target compares figures of one round only (two runs of the same round), because this
//! class of machine changes speed by a third within a session (BENCHMARKS.md, "Machine
//! speed"). With several rounds the table also says, per target, how many rounds met it and
//! the median figure, so a verdict does not rest on one run. A missing report (a run that
//! failed, was cut by a time limit or was not run) is shown as missing and is not met.

mod issue14;
mod issue31;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plot::LatencyJson;

/// Whose targets to judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Issue {
    /// Issue 14 item 4: token streams, zero-delay rate, keyed submit, messages per execution
    /// (group a).
    #[value(name = "14")]
    TokenStreams,
    /// Issue 31 item 5: scale-out on a many-core machine (group t, and `fairness.json` from
    /// `scripts/bench-device.sh`).
    #[value(name = "31")]
    ScaleOut,
}

/// `bench targets` options.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetsArgs {
    /// The issue whose targets are judged.
    #[arg(long, value_enum, default_value = "14")]
    pub issue: Issue,
    /// Output directories of the issue's group (`scripts/bench-all.sh DIR` with
    /// `BENCH_GROUPS=a` for issue 14, `t` for issue 31), one per round, in the order they ran.
    #[arg(required = true)]
    pub rounds: Vec<PathBuf>,
}

/// The figures of one report that the targets use.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunFigures {
    #[serde(default)]
    pub ok: u64,
    #[serde(default)]
    pub failed: u64,
    #[serde(default)]
    pub errored: u64,
    #[serde(default)]
    pub throughput_per_s: f64,
    #[serde(default)]
    latency: LatencyJson,
    #[serde(default)]
    jetstream: Option<JetStream>,
    /// The machine's cores.
    #[serde(default)]
    nproc: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct JetStream {
    events_per_execution: f64,
}

impl RunFigures {
    /// Executions that failed or ended in a client error.
    fn errors(&self) -> u64 {
        self.failed + self.errored
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// `report` when it measured something: a run that completed nothing has no figures to judge.
fn measured(report: &Option<RunFigures>) -> Option<&RunFigures> {
    report.as_ref().filter(|r| r.ok > 0)
}

/// The JSON file `name` in `dir` read as a `T`: `None` when there is none or it is empty (the
/// output of a run that failed before printing), an error when it is unreadable or not a `T`.
fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, String> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: not a bench report: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// The report of the run labelled `label` in `dir` (`LABEL.json`, bench's `--out`).
fn read_report(dir: &Path, label: &str) -> Result<Option<RunFigures>, String> {
    read_json(dir, &format!("{label}.json"))
}

/// The reports of one round of an issue's runs and the targets they are judged by.
pub trait Reports: Sized + 'static {
    /// The header of the table's first column.
    const TITLE: &'static str;

    /// Reads the reports of one round from `dir`; a missing report stays missing, an
    /// unreadable one is an error.
    fn read(dir: &Path) -> Result<Self, String>;

    /// The targets, in the issue's order.
    fn targets() -> &'static [Target<Self>];

    /// Figures shown after the table, beside the targets (none by default).
    fn footer(_rounds: &[(String, Self)]) -> String {
        String::new()
    }
}

/// What one round says of one target.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The figure the target is about (a ratio in percent for the "within" targets), `None`
    /// when a report is missing.
    pub figure: Option<f64>,
    /// The figure as the table shows it.
    pub shown: String,
    pub met: bool,
}

impl Verdict {
    fn missing() -> Self {
        Self {
            figure: None,
            shown: "missing".into(),
            met: false,
        }
    }
}

/// One of the targets: its name, how its figures are shown and how a round is judged.
pub struct Target<R> {
    pub name: &'static str,
    /// The unit after a figure ("%" figures are signed), and its decimals.
    unit: &'static str,
    decimals: usize,
    rule: Rule<R>,
}

/// How a round is judged on a target.
enum Rule<R> {
    /// The figure (`None`: a report is missing) must not exceed the limit.
    AtMost(f64, fn(&R) -> Option<f64>),
    /// The figure must reach the limit.
    AtLeast(f64, fn(&R) -> Option<f64>),
    /// A comparison of two runs, judged whole.
    Compare(fn(&R) -> Verdict),
}

impl<R> Target<R> {
    /// `figure` in this target's unit.
    fn show(&self, figure: f64) -> String {
        match self.unit {
            "%" => format!("{figure:+.prec$}%", prec = self.decimals),
            unit => format!("{figure:.prec$}{unit}", prec = self.decimals),
        }
    }

    /// What `round` says of this target.
    fn judge(&self, round: &R) -> Verdict {
        let (figure, met) = match self.rule {
            Rule::Compare(judge) => return judge(round),
            Rule::AtMost(limit, figure) => {
                let v = figure(round);
                (v, v.is_some_and(|v| v <= limit))
            }
            Rule::AtLeast(limit, figure) => {
                let v = figure(round);
                (v, v.is_some_and(|v| v >= limit))
            }
        };
        match figure {
            Some(v) => Verdict {
                figure: Some(v),
                shown: self.show(v),
                met,
            },
            None => Verdict::missing(),
        }
    }
}

/// The judgement of every target on `round`, in the targets' order.
pub fn judge<R: Reports>(round: &R) -> Vec<Verdict> {
    R::targets().iter().map(|t| t.judge(round)).collect()
}

/// The median of the figures present (the mean of the middle two for an even count).
pub(crate) fn median(mut figures: Vec<f64>) -> Option<f64> {
    figures.retain(|f| f.is_finite());
    if figures.is_empty() {
        return None;
    }
    figures.sort_by(f64::total_cmp);
    let mid = figures.len() / 2;
    Some(if figures.len() % 2 == 1 {
        figures[mid]
    } else {
        (figures[mid - 1] + figures[mid]) / 2.0
    })
}

/// The Markdown table of `rounds` (name, reports): a row per target, a column per round and,
/// with more than one round, how many met it and the median figure; then the footer.
pub fn table<R: Reports>(rounds: &[(String, R)]) -> String {
    let verdicts: Vec<Vec<Verdict>> = rounds.iter().map(|(_, r)| judge(r)).collect();
    let mut out = format!("| {} |", R::TITLE);
    for (name, _) in rounds {
        out.push_str(&format!(" {name} |"));
    }
    let summary = rounds.len() > 1;
    if summary {
        out.push_str(" met in | median |");
    }
    out.push_str("\n| --- |");
    for _ in rounds {
        out.push_str(" --- |");
    }
    if summary {
        out.push_str(" ---: | ---: |");
    }
    out.push('\n');
    for (i, target) in R::targets().iter().enumerate() {
        out.push_str(&format!("| {} |", target.name));
        for round in &verdicts {
            let v = &round[i];
            let mark = if v.figure.is_none() {
                ""
            } else if v.met {
                ": met"
            } else {
                ": **not met**"
            };
            out.push_str(&format!(" {}{mark} |", v.shown));
        }
        if summary {
            let met = verdicts.iter().filter(|v| v[i].met).count();
            let median = median(verdicts.iter().filter_map(|v| v[i].figure).collect());
            let median = median.map_or_else(|| "–".into(), |m| target.show(m));
            out.push_str(&format!(" {met} of {} | {median} |", rounds.len()));
        }
        out.push('\n');
    }
    out.push_str(&R::footer(rounds));
    out
}

/// The rounds of `dirs` read as `R`, each named by its directory.
fn read_rounds<R: Reports>(dirs: &[PathBuf]) -> Result<Vec<(String, R)>, String> {
    let mut rounds = Vec::with_capacity(dirs.len());
    for dir in dirs {
        if !dir.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        rounds.push((name, R::read(dir)?));
    }
    Ok(rounds)
}

/// `bench targets`.
pub fn run(a: &TargetsArgs) -> Result<(), String> {
    let table = match a.issue {
        Issue::TokenStreams => table(&read_rounds::<issue14::Round>(&a.rounds)?),
        Issue::ScaleOut => table(&read_rounds::<issue31::Round>(&a.rounds)?),
    };
    print!("{table}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![f64::INFINITY, 7.0]), Some(7.0));
    }
}
