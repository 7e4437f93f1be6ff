//! Issue 31's item 5 targets for a many-core machine, judged from the reports of group t of
//! `scripts/bench-all.sh` and the fairness run of `scripts/bench-device.sh`
//! (`bench targets --issue 31`). The issue sets them for 16 cores: on fewer, the processes share
//! the cores and the verdict says what that machine does, not whether the design scales (the
//! footer names the cores the runs had).
//!
//! | target | reports |
//! | --- | --- |
//! | zero-delay c=256, 4 workers, one NATS server ≥ 20,000 exec/s (the better of 1 and 8 partitions) | `t-zero-p1-w4`, `t-zero-p8-w4` |
//! | 8 workers not slower than 4 by more than 5% | `t-zero-p8-w8`, `t-zero-p8-w4` |
//! | I/O-bound (3 × 50 ms, 128 provider slots per worker): 1 → 2 workers ≥ 1.9×, 1 → 4 ≥ 3.6× | `t-io-p8-w1`, `-w2`, `-w4` |
//! | 4,096 token streams (100 × 10 ms): 0 errors, terminal p99 ≤ 1.25 s, first-delta p99 ≤ 50 ms | `t-tokens-c4096` |
//! | 3-node R3 cluster, partitions spread: at least the one-node figure, no stall over 250 ms at p99.9 | `t-zero-r3-w4`, `t-zero-p8-w4` |
//! | a light tenant's queue wait p99 ≤ 1 s behind a heavy tenant's 2,000 one-second executions | `fairness.json` (`scripts/bench-fairness.py`) |
//!
//! and `t-embedded-c256` for the embedded rate, shown beside them.

use std::path::Path;

use serde::Deserialize;

use super::{Reports, Rule, RunFigures, Target, Verdict, measured, ms, read_json, read_report};

/// The reports of one round, each `None` when missing (a run that failed, was cut short by the
/// device's time limit, or was not run).
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub zero_p1_w4: Option<RunFigures>,
    pub zero_p8_w4: Option<RunFigures>,
    pub zero_p8_w8: Option<RunFigures>,
    pub tokens_c4096: Option<RunFigures>,
    pub io_w1: Option<RunFigures>,
    pub io_w2: Option<RunFigures>,
    pub io_w4: Option<RunFigures>,
    pub zero_r3_w4: Option<RunFigures>,
    pub embedded_c256: Option<RunFigures>,
    pub fairness: Option<Fairness>,
}

/// What `scripts/bench-fairness.py` prints: the light tenant's queue waits, in seconds.
#[derive(Debug, Clone, Deserialize)]
pub struct Fairness {
    light: Waits,
}

#[derive(Debug, Clone, Deserialize)]
struct Waits {
    /// How many of the light tenant's executions were measured.
    n: u64,
    p99: f64,
}

impl Reports for Round {
    const TITLE: &'static str = "target (issue 31 item 5)";

    fn read(dir: &Path) -> Result<Self, String> {
        Ok(Self {
            zero_p1_w4: read_report(dir, "t-zero-p1-w4")?,
            zero_p8_w4: read_report(dir, "t-zero-p8-w4")?,
            zero_p8_w8: read_report(dir, "t-zero-p8-w8")?,
            tokens_c4096: read_report(dir, "t-tokens-c4096")?,
            io_w1: read_report(dir, "t-io-p8-w1")?,
            io_w2: read_report(dir, "t-io-p8-w2")?,
            io_w4: read_report(dir, "t-io-p8-w4")?,
            zero_r3_w4: read_report(dir, "t-zero-r3-w4")?,
            embedded_c256: read_report(dir, "t-embedded-c256")?,
            fairness: read_json(dir, "fairness.json")?,
        })
    }

    fn targets() -> &'static [Target<Self>] {
        TARGETS
    }

    /// The embedded rate of each round, and the cores its runs had.
    fn footer(rounds: &[(String, Self)]) -> String {
        let shown: Vec<String> = rounds
            .iter()
            .map(|(name, r)| {
                let embedded = measured(&r.embedded_c256).map_or_else(
                    || "missing".to_string(),
                    |e| format!("{:.0} exec/s", e.throughput_per_s),
                );
                let cores = r
                    .reports()
                    .find_map(|r| r.nproc)
                    .map_or_else(|| "cores unknown".to_string(), |n| format!("{n} cores"));
                format!("{name}: {embedded} ({cores})")
            })
            .collect();
        format!(
            "\nembedded zero-delay c=256 (the issue's targets are for 16 cores): {}\n",
            shown.join(", ")
        )
    }
}

impl Round {
    /// The bench reports present.
    fn reports(&self) -> impl Iterator<Item = &RunFigures> {
        [
            &self.zero_p1_w4,
            &self.zero_p8_w4,
            &self.zero_p8_w8,
            &self.tokens_c4096,
            &self.io_w1,
            &self.io_w2,
            &self.io_w4,
            &self.zero_r3_w4,
            &self.embedded_c256,
        ]
        .into_iter()
        .flatten()
    }
}

/// `a`'s throughput over `b`'s, when both runs measured one.
fn throughput_ratio(a: &Option<RunFigures>, b: &Option<RunFigures>) -> Option<f64> {
    let (a, b) = (measured(a)?, measured(b)?);
    (b.throughput_per_s > 0.0).then(|| a.throughput_per_s / b.throughput_per_s)
}

/// `a`'s throughput against `b`'s, in percent, with both figures shown; met when `a` is at
/// most `limit_percent` below `b` (`0`: at least `b`).
fn not_below(a: &Option<RunFigures>, b: &Option<RunFigures>, limit_percent: f64) -> Verdict {
    let (Some(a), Some(b)) = (measured(a), measured(b)) else {
        return Verdict::missing();
    };
    if b.throughput_per_s <= 0.0 {
        return Verdict::missing();
    }
    let (a, b) = (a.throughput_per_s, b.throughput_per_s);
    let change = (a / b - 1.0) * 100.0;
    Verdict {
        figure: Some(change),
        shown: format!("{a:.0} vs {b:.0} exec/s ({change:+.1}%)"),
        met: change >= -limit_percent,
    }
}

/// The targets of issue 31 item 5, in the issue's order.
pub const TARGETS: &[Target<Round>] = &[
    Target {
        name: "zero-delay c=256, 4 workers, one NATS server ≥ 20,000 exec/s",
        unit: " exec/s",
        decimals: 0,
        rule: Rule::Compare(|r| {
            let rate = |run: &Option<RunFigures>| measured(run).map(|n| n.throughput_per_s);
            let (one, eight) = (rate(&r.zero_p1_w4), rate(&r.zero_p8_w4));
            let Some(best) = one.into_iter().chain(eight).reduce(f64::max) else {
                return Verdict::missing();
            };
            let show = |v: Option<f64>| v.map_or_else(|| "missing".into(), |v| format!("{v:.0}"));
            Verdict {
                figure: Some(best),
                shown: format!(
                    "{best:.0} exec/s (8 partitions {}, 1 partition {})",
                    show(eight),
                    show(one)
                ),
                met: best >= 20_000.0,
            }
        }),
    },
    Target {
        name: "zero-delay c=256: 8 workers not slower than 4 by more than 5%",
        unit: "%",
        decimals: 1,
        rule: Rule::Compare(|r| not_below(&r.zero_p8_w8, &r.zero_p8_w4, 5.0)),
    },
    Target {
        name: "I/O-bound (3 × 50 ms, 128 slots a worker): 1 → 2 workers ≥ 1.9×",
        unit: "×",
        decimals: 2,
        rule: Rule::AtLeast(1.9, |r| throughput_ratio(&r.io_w2, &r.io_w1)),
    },
    Target {
        name: "I/O-bound: 1 → 4 workers ≥ 3.6×",
        unit: "×",
        decimals: 2,
        rule: Rule::AtLeast(3.6, |r| throughput_ratio(&r.io_w4, &r.io_w1)),
    },
    Target {
        name: "4,096 token streams (100 × 10 ms), 4 workers: 0 errors",
        unit: " errors",
        decimals: 0,
        rule: Rule::AtMost(0.0, |r| {
            measured(&r.tokens_c4096).map(|n| n.errors() as f64)
        }),
    },
    Target {
        name: "4,096 token streams: terminal p99 ≤ 1.25 s",
        unit: " ms",
        decimals: 1,
        rule: Rule::AtMost(1250.0, |r| {
            measured(&r.tokens_c4096).and_then(|n| n.latency.terminal.map(|p| ms(p.p99_us)))
        }),
    },
    Target {
        name: "4,096 token streams: first-delta p99 ≤ 50 ms",
        unit: " ms",
        decimals: 1,
        rule: Rule::AtMost(50.0, |r| {
            measured(&r.tokens_c4096).and_then(|n| n.latency.first_delta.map(|p| ms(p.p99_us)))
        }),
    },
    Target {
        name: "3-node R3 cluster, 4 workers, partitions spread: at least the one-node figure",
        unit: "%",
        decimals: 1,
        rule: Rule::Compare(|r| not_below(&r.zero_r3_w4, &r.zero_p8_w4, 0.0)),
    },
    Target {
        name: "3-node R3 cluster: no latency over 250 ms at p99.9 (first delta, terminal)",
        unit: " ms",
        decimals: 1,
        rule: Rule::AtMost(250.0, |r| {
            let n = measured(&r.zero_r3_w4)?;
            let p999 = |p: Option<crate::plot::Percentiles>| p.map(|p| ms(p.p999_us));
            p999(n.latency.first_delta)
                .into_iter()
                .chain(p999(n.latency.terminal))
                .reduce(f64::max)
        }),
    },
    Target {
        name: "fairness: a light tenant's queue wait p99 ≤ 1 s",
        unit: " s",
        decimals: 3,
        rule: Rule::AtMost(1.0, |r| {
            r.fairness
                .as_ref()
                .filter(|f| f.light.n > 0)
                .map(|f| f.light.p99)
        }),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::{judge, table};

    fn run(json: &str) -> Option<RunFigures> {
        Some(serde_json::from_str(json).expect("report"))
    }

    fn rate(exec_per_s: f64) -> Option<RunFigures> {
        run(&format!(
            r#"{{"ok": 10, "throughput_per_s": {exec_per_s}, "nproc": 16,
               "latency": {{"first_delta": {{"p50_us": 5000, "p90_us": 0, "p99_us": 20000, "p999_us": 90000}},
                            "terminal": {{"p50_us": 6000, "p90_us": 0, "p99_us": 25000, "p999_us": 120000}}}}}}"#
        ))
    }

    /// A round that meets every target.
    fn good_round() -> Round {
        Round {
            zero_p1_w4: rate(18_000.0),
            zero_p8_w4: rate(21_000.0),
            zero_p8_w8: rate(20_500.0),
            tokens_c4096: run(
                r#"{"ok": 4096, "failed": 0, "errored": 0, "throughput_per_s": 3900.0,
                   "latency": {"first_delta": {"p50_us": 12000, "p90_us": 0, "p99_us": 41000},
                               "terminal": {"p50_us": 1010000, "p90_us": 0, "p99_us": 1200000}}}"#,
            ),
            io_w1: rate(800.0),
            io_w2: rate(1560.0),
            io_w4: rate(3000.0),
            zero_r3_w4: rate(21_500.0),
            embedded_c256: rate(40_000.0),
            fairness: serde_json::from_str(r#"{"light": {"n": 20, "p50": 0.1, "p99": 0.4}}"#)
                .expect("fairness"),
        }
    }

    #[test]
    fn a_round_meeting_every_target_is_judged_met_throughout() {
        let verdicts = judge(&good_round());
        assert_eq!(verdicts.len(), TARGETS.len());
        assert!(verdicts.iter().all(|v| v.met), "{verdicts:#?}");
        assert_eq!(
            verdicts[0].shown,
            "21000 exec/s (8 partitions 21000, 1 partition 18000)"
        );
        assert_eq!(verdicts[1].shown, "20500 vs 21000 exec/s (-2.4%)");
        assert_eq!(verdicts[2].shown, "1.95×");
        assert_eq!(verdicts[8].figure, Some(120.0));
    }

    #[test]
    fn each_target_fails_on_its_own_figure() {
        let fails = |change: fn(&mut Round), index: usize| {
            let mut r = good_round();
            change(&mut r);
            let v = judge(&r);
            assert!(!v[index].met, "target {index}: {v:#?}");
            let others = v.iter().enumerate().filter(|(i, _)| *i != index);
            assert!(others.clone().all(|(_, v)| v.met), "{v:#?}");
        };
        fails(|r| r.zero_p8_w4 = rate(19_000.0), 0);
        fails(|r| r.zero_p8_w8 = rate(19_900.0), 1); // −5.2%
        fails(|r| r.io_w2 = rate(1510.0), 2); // 1.89×
        fails(|r| r.io_w4 = rate(2870.0), 3); // 3.59×
        fails(
            |r| {
                r.tokens_c4096 = r.tokens_c4096.take().map(|mut n| {
                    n.errored = 1;
                    n
                })
            },
            4,
        );
        fails(
            |r| {
                r.tokens_c4096 = run(
                    r#"{"ok": 4096, "latency": {"first_delta": {"p50_us": 12000, "p90_us": 0, "p99_us": 41000},
                       "terminal": {"p50_us": 1010000, "p90_us": 0, "p99_us": 1250001}}}"#,
                )
            },
            5,
        );
        fails(
            |r| {
                r.tokens_c4096 = run(
                    r#"{"ok": 4096, "latency": {"first_delta": {"p50_us": 12000, "p90_us": 0, "p99_us": 50001},
                       "terminal": {"p50_us": 1010000, "p90_us": 0, "p99_us": 1200000}}}"#,
                )
            },
            6,
        );
        fails(|r| r.zero_r3_w4 = rate(20_900.0), 7);
        fails(
            |r| {
                r.zero_r3_w4 = run(r#"{"ok": 10, "throughput_per_s": 22000.0,
                       "latency": {"first_delta": {"p50_us": 5000, "p90_us": 0, "p99_us": 20000, "p999_us": 1011000},
                                   "terminal": {"p50_us": 6000, "p90_us": 0, "p99_us": 25000, "p999_us": 1012000}}}"#)
            },
            8,
        );
        fails(
            |r| {
                r.fairness =
                    serde_json::from_str(r#"{"light": {"n": 20, "p99": 1.02}}"#).expect("fairness")
            },
            9,
        );
    }

    #[test]
    fn the_better_partition_count_judges_the_rate_and_a_missing_one_is_shown() {
        let mut r = good_round();
        r.zero_p1_w4 = None;
        r.zero_p8_w4 = rate(20_100.0);
        r.zero_p8_w8 = rate(20_100.0);
        r.zero_r3_w4 = rate(20_100.0);
        let v = judge(&r);
        assert!(v[0].met, "{v:#?}");
        assert_eq!(
            v[0].shown,
            "20100 exec/s (8 partitions 20100, 1 partition missing)"
        );
        r.zero_p8_w4 = None;
        assert_eq!(judge(&r)[0], Verdict::missing());
    }

    #[test]
    fn missing_or_empty_runs_are_missing_and_not_met() {
        let mut r = good_round();
        r.io_w1 = run(r#"{"ok": 0, "throughput_per_s": 0.0}"#);
        r.tokens_c4096 = None;
        r.fairness = None;
        let v = judge(&r);
        for i in [2, 3, 4, 5, 6, 9] {
            assert_eq!(v[i], Verdict::missing(), "target {i}");
        }
        assert!(v[0].met && v[1].met && v[7].met && v[8].met);
    }

    #[test]
    fn reads_a_round_with_the_fairness_run_and_names_the_cores() {
        let dir = std::env::temp_dir().join(format!("bench-targets31-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("t-zero-p8-w4.json"),
            r#"{"label": "t-zero-p8-w4", "throughput_per_s": 20500.4, "ok": 7, "nproc": 16}"#,
        )
        .expect("write");
        std::fs::write(
            dir.join("fairness.json"),
            r#"{"mode": "nats", "light": {"n": 20, "p50": 0.2, "p99": 0.9, "max": 0.9}}"#,
        )
        .expect("write");
        let round = Round::read(&dir).expect("round");
        let v = judge(&round);
        assert!(v[0].met && v[9].met, "{v:#?}");
        assert_eq!(v[2], Verdict::missing());
        let table = table(&[("r1".to_string(), round)]);
        assert!(
            table.starts_with("| target (issue 31 item 5) | r1 |\n"),
            "{table}"
        );
        assert!(
            table.ends_with(
                "c=256 (the issue's targets are for 16 cores): r1: missing (16 cores)\n"
            ),
            "{table}"
        );
        // A fairness run that failed leaves its output empty: no figure, not an error.
        std::fs::write(dir.join("fairness.json"), "").expect("write");
        assert!(Round::read(&dir).expect("round").fairness.is_none());
        std::fs::write(dir.join("fairness.json"), "{").expect("write");
        let e = Round::read(&dir).expect_err("unreadable");
        assert!(e.contains("fairness.json"), "{e}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
