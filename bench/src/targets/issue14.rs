//! Issue 14's item 4 targets, judged from the reports of group a of `scripts/bench-all.sh`
//! (`bench targets`, the default issue). A nats run is compared with the embedded run of the
//! same round.
//!
//! The reports it reads (`--out` JSON of `bench`, named by their labels in bench-all.sh):
//!
//! | target | reports |
//! | --- | --- |
//! | c=256 terminal p50 within 10% of embedded's | `a-nats-c256`, `a-embedded-c256` |
//! | c=256 first-delta p99 ≤ 30 ms | `a-nats-c256` |
//! | c=1024 no errors, terminal p99 within 25% of embedded's | `a-nats-c1024`, `a-embedded-c1024` |
//! | zero-delay closed loop c=32 ≥ 3,000 exec/s | `a-nats-zero-c32` |
//! | submit p50 at c=1 ≤ 0.45 ms (with an Idempotency-Key) | `a-nats-submit-c1` |
//! | ≤ 4 event-log messages per 7-event execution | `a-nats-msgs-c1` |
//!
//! and `a-embedded-zero-c32` for the embedded rate, shown beside them ("embedded mode not
//! slower than today" needs a build to compare with: `bench plot --before/--after`).

use std::path::Path;

use super::{Reports, Rule, RunFigures, Target, Verdict, measured, ms, read_report};
use crate::plot::Percentiles;

/// The reports of one round, each `None` when missing (a run that failed or was not run).
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub embedded_c256: Option<RunFigures>,
    pub nats_c256: Option<RunFigures>,
    pub embedded_c1024: Option<RunFigures>,
    pub nats_c1024: Option<RunFigures>,
    pub nats_zero_c32: Option<RunFigures>,
    pub embedded_zero_c32: Option<RunFigures>,
    pub nats_submit_c1: Option<RunFigures>,
    pub nats_msgs_c1: Option<RunFigures>,
}

impl Reports for Round {
    const TITLE: &'static str = "target (issue 14 item 4)";

    fn read(dir: &Path) -> Result<Self, String> {
        Ok(Self {
            embedded_c256: read_report(dir, "a-embedded-c256")?,
            nats_c256: read_report(dir, "a-nats-c256")?,
            embedded_c1024: read_report(dir, "a-embedded-c1024")?,
            nats_c1024: read_report(dir, "a-nats-c1024")?,
            nats_zero_c32: read_report(dir, "a-nats-zero-c32")?,
            embedded_zero_c32: read_report(dir, "a-embedded-zero-c32")?,
            nats_submit_c1: read_report(dir, "a-nats-submit-c1")?,
            nats_msgs_c1: read_report(dir, "a-nats-msgs-c1")?,
        })
    }

    fn targets() -> &'static [Target<Self>] {
        TARGETS
    }

    /// The embedded zero-delay rate of each round ("embedded mode not slower than today" needs
    /// a build to compare with).
    fn footer(rounds: &[(String, Self)]) -> String {
        let embedded: Vec<String> = rounds
            .iter()
            .map(|(name, r)| match measured(&r.embedded_zero_c32) {
                Some(e) => format!("{name}: {:.1}", e.throughput_per_s),
                None => format!("{name}: missing"),
            })
            .collect();
        format!(
            "\nembedded zero-delay c=32, exec/s (compare builds with `bench plot --before/--after`): {}\n",
            embedded.join(", ")
        )
    }
}

/// Percent by which `nats` exceeds `embedded` (negative when faster).
fn excess_percent(nats: f64, embedded: f64) -> f64 {
    if embedded > 0.0 {
        (nats / embedded - 1.0) * 100.0
    } else {
        f64::INFINITY
    }
}

/// The nats run with the terminal latencies of it and of the embedded run it is compared
/// with, when both measured them.
fn terminals<'a>(
    nats: &'a Option<RunFigures>,
    embedded: &Option<RunFigures>,
) -> Option<(&'a RunFigures, Percentiles, Percentiles)> {
    let n = measured(nats)?;
    Some((
        n,
        n.latency.terminal?,
        measured(embedded)?.latency.terminal?,
    ))
}

fn within(nats: u64, embedded: u64, limit_percent: f64, what: &str) -> Verdict {
    let excess = excess_percent(ms(nats), ms(embedded));
    Verdict {
        figure: Some(excess),
        shown: format!(
            "{:.1} vs {:.1} ms ({excess:+.1}%){what}",
            ms(nats),
            ms(embedded)
        ),
        met: excess <= limit_percent,
    }
}

/// The targets of issue 14 item 4, in the issue's order.
pub const TARGETS: &[Target<Round>] = &[
    Target {
        name: "nats c=256: terminal p50 within 10% of embedded",
        unit: "%",
        decimals: 1,
        rule: Rule::Compare(|r| match terminals(&r.nats_c256, &r.embedded_c256) {
            Some((_, n, e)) => within(n.p50_us, e.p50_us, 10.0, ""),
            None => Verdict::missing(),
        }),
    },
    Target {
        name: "nats c=256: first-delta p99 ≤ 30 ms",
        unit: " ms",
        decimals: 1,
        rule: Rule::AtMost(30.0, |r| {
            measured(&r.nats_c256).and_then(|n| n.latency.first_delta.map(|p| ms(p.p99_us)))
        }),
    },
    Target {
        name: "nats c=1024: no errors, terminal p99 within 25% of embedded",
        unit: "%",
        decimals: 1,
        rule: Rule::Compare(|r| match terminals(&r.nats_c1024, &r.embedded_c1024) {
            Some((run, n, e)) => {
                let errors = run.errors();
                let mut v = within(n.p99_us, e.p99_us, 25.0, &format!(", {errors} errors"));
                v.met &= errors == 0;
                v
            }
            None => Verdict::missing(),
        }),
    },
    Target {
        name: "zero-delay closed loop c=32 ≥ 3,000 exec/s",
        unit: " exec/s",
        decimals: 1,
        rule: Rule::AtLeast(3000.0, |r| {
            measured(&r.nats_zero_c32).map(|n| n.throughput_per_s)
        }),
    },
    Target {
        name: "submit p50 at c=1 ≤ 0.45 ms (with an Idempotency-Key)",
        unit: " ms",
        decimals: 3,
        rule: Rule::AtMost(0.45, |r| {
            measured(&r.nats_submit_c1).and_then(|n| n.latency.submit.map(|p| ms(p.p50_us)))
        }),
    },
    Target {
        name: "≤ 4 event-log messages per 7-event execution",
        unit: "",
        decimals: 2,
        rule: Rule::AtMost(4.0, |r| {
            measured(&r.nats_msgs_c1).and_then(|n| n.jetstream.map(|js| js.events_per_execution))
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

    fn terminal(p50_ms: u64, p99_ms: u64) -> Option<RunFigures> {
        run(&format!(
            r#"{{"ok": 10, "failed": 0, "errored": 0, "throughput_per_s": 240.0,
               "latency": {{"terminal": {{"p50_us": {}, "p99_us": {}, "p90_us": 0}},
                            "first_delta": {{"p50_us": 15000, "p90_us": 0, "p99_us": 29000}}}}}}"#,
            p50_ms * 1000,
            p99_ms * 1000
        ))
    }

    /// A round that meets every target.
    fn good_round() -> Round {
        Round {
            embedded_c256: terminal(1000, 1010),
            nats_c256: terminal(1050, 1070),
            embedded_c1024: terminal(1020, 1100),
            nats_c1024: terminal(1200, 1300),
            nats_zero_c32: run(r#"{"ok": 10, "throughput_per_s": 3100.0}"#),
            embedded_zero_c32: run(r#"{"ok": 10, "throughput_per_s": 9000.0}"#),
            nats_submit_c1: run(
                r#"{"ok": 10, "latency": {"submit": {"p50_us": 440, "p90_us": 0, "p99_us": 1200}}}"#,
            ),
            nats_msgs_c1: run(r#"{"ok": 10, "jetstream": {"events_per_execution": 3.0}}"#),
        }
    }

    #[test]
    fn a_round_meeting_every_target_is_judged_met_throughout() {
        let verdicts = judge(&good_round());
        assert_eq!(verdicts.len(), TARGETS.len());
        assert!(verdicts.iter().all(|v| v.met), "{verdicts:#?}");
        assert_eq!(verdicts[0].shown, "1050.0 vs 1000.0 ms (+5.0%)");
        assert_eq!(verdicts[2].shown, "1300.0 vs 1100.0 ms (+18.2%), 0 errors");
    }

    #[test]
    fn each_target_fails_on_its_own_figure() {
        let mut r = good_round();
        r.nats_c256 = terminal(1120, 1130); // +12%
        assert!(!judge(&r)[0].met);

        let mut r = good_round();
        r.nats_c256 = run(
            r#"{"ok": 10, "latency": {"terminal": {"p50_us": 1000000, "p90_us": 0, "p99_us": 1000000},
                            "first_delta": {"p50_us": 15000, "p90_us": 0, "p99_us": 30001}}}"#,
        );
        let v = judge(&r);
        assert!(v[0].met && !v[1].met, "{v:#?}");

        let mut r = good_round();
        r.nats_c1024 = terminal(1200, 1400); // +27.3%
        assert!(!judge(&r)[2].met);
        let mut r = good_round();
        r.nats_c1024 = run(
            r#"{"ok": 10, "errored": 1, "latency": {"terminal": {"p50_us": 1000000, "p90_us": 0, "p99_us": 1100000}}}"#,
        );
        let v = judge(&r);
        assert!(!v[2].met && v[2].shown.ends_with("1 errors"), "{v:#?}");

        let mut r = good_round();
        r.nats_zero_c32 = run(r#"{"ok": 10, "throughput_per_s": 2999.9}"#);
        assert!(!judge(&r)[3].met);

        let mut r = good_round();
        r.nats_submit_c1 = run(
            r#"{"ok": 10, "latency": {"submit": {"p50_us": 451, "p90_us": 0, "p99_us": 900}}}"#,
        );
        assert!(!judge(&r)[4].met);

        let mut r = good_round();
        r.nats_msgs_c1 = run(r#"{"ok": 10, "jetstream": {"events_per_execution": 4.01}}"#);
        assert!(!judge(&r)[5].met);
    }

    #[test]
    fn a_missing_report_is_shown_missing_and_not_met() {
        let mut r = good_round();
        r.embedded_c1024 = None;
        r.nats_msgs_c1 = None;
        let v = judge(&r);
        assert_eq!(v[2], Verdict::missing());
        assert_eq!(v[5], Verdict::missing());
        assert!(v[0].met);
    }

    #[test]
    fn a_run_that_completed_nothing_is_judged_missing() {
        let mut r = good_round();
        r.nats_zero_c32 = run(r#"{"ok": 0, "throughput_per_s": 5000.0}"#);
        assert_eq!(judge(&r)[3], Verdict::missing());
    }

    #[test]
    fn several_rounds_count_the_rounds_that_met_each_target_and_give_the_median() {
        let mut slow = good_round();
        slow.nats_zero_c32 = run(r#"{"ok": 10, "throughput_per_s": 2000.0}"#);
        let mut slower = slow.clone();
        slower.nats_zero_c32 = run(r#"{"ok": 10, "throughput_per_s": 1000.0}"#);
        let rounds = vec![
            ("r1".to_string(), good_round()),
            ("r2".to_string(), slow),
            ("r3".to_string(), slower),
        ];
        let table = table(&rounds);
        let zero = table
            .lines()
            .find(|l| l.starts_with("| zero-delay"))
            .expect("zero-delay row");
        assert!(zero.ends_with("| 1 of 3 | 2000.0 exec/s |"), "{zero}");
        assert!(zero.contains("3100.0 exec/s: met"), "{zero}");
        assert!(zero.contains("1000.0 exec/s: **not met**"), "{zero}");
        let msgs = table
            .lines()
            .find(|l| l.starts_with("| ≤ 4"))
            .expect("messages row");
        assert!(msgs.ends_with("| 3 of 3 | 3.00 |"), "{msgs}");
        let c256 = table
            .lines()
            .find(|l| l.starts_with("| nats c=256: terminal"))
            .expect("c=256 row");
        assert!(c256.ends_with("| 3 of 3 | +5.0% |"), "{c256}");
        assert!(
            table.contains("r1: 9000.0, r2: 9000.0, r3: 9000.0"),
            "{table}"
        );
    }

    #[test]
    fn one_round_has_no_summary_columns() {
        let table = table(&[("only".to_string(), good_round())]);
        assert!(table.starts_with("| target (issue 14 item 4) | only |\n| --- | --- |\n"));
        assert!(!table.contains("met in"));
    }

    #[test]
    fn reads_a_round_from_a_directory_and_refuses_an_unreadable_report() {
        let dir = std::env::temp_dir().join(format!("bench-targets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("a-nats-zero-c32.json"),
            r#"{"label": "a-nats-zero-c32", "throughput_per_s": 3500.5, "ok": 7}"#,
        )
        .expect("write");
        let round = Round::read(&dir).expect("round");
        assert_eq!(round.nats_zero_c32.as_ref().map(|r| r.ok), Some(7));
        assert!(round.nats_c256.is_none());
        assert!(judge(&round)[3].met);
        std::fs::write(dir.join("a-nats-c256.json"), "not json").expect("write");
        let e = Round::read(&dir).expect_err("unreadable report");
        assert!(e.contains("a-nats-c256.json: not a bench report"), "{e}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
