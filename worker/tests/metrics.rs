//! The runner's metrics (contract.md section 9) as an operator scrapes them: each test runs in
//! its own process under nextest, so the process-wide registry starts empty.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use telemetry::MetricsExporter;
use worker::provider::Provider;
use worker::runner::RunOutcome;

/// The value of the sample `series` (name with labels, as rendered) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Runs one job, delivered as delivery `delivery`, on scripted provider `a` following
/// `script`; returns the job and the metrics rendered afterwards.
async fn run_and_render(script: Vec<Step>, delivery: u32) -> (runtime::Job, String) {
    let exporter = MetricsExporter::install();
    let a = ScriptedProvider::new("a", script);
    let h = Harness::new(vec![(a as Arc<dyn Provider>, DEFAULT_LIMITS)]);
    let job = h.submit(&text_request(""), Duration::from_secs(30)).await;
    assert_eq!(h.runner.run(&job, delivery).await, RunOutcome::Finished);
    (job, exporter.render())
}

/// Checks every `(series, value)` sample in the rendered `text`.
fn assert_samples(text: &str, expected: &[(String, f64)]) {
    for (series, value) in expected {
        assert_eq!(sample(text, series), Some(*value), "{series} in:\n{text}");
    }
}

/// The series of provider `a`'s attempts with `outcome`.
fn attempts_of_a(outcome: &str) -> String {
    let model = model_of("a");
    format!("mrt_provider_attempts_total{{provider=\"a\",model=\"{model}\",outcome=\"{outcome}\"}}")
}

#[tokio::test]
async fn a_successful_execution_is_counted_with_latencies_and_token_usage() {
    let (job, text) = run_and_render(success_script(), 1).await;
    let model = model_of("a");
    let labels = format!("gen_ai_provider_name=\"a\",gen_ai_request_model=\"{model}\"");
    let expected = [
        (
            "mrt_executions_total{outcome=\"succeeded\",code=\"none\"}".to_owned(),
            1.0,
        ),
        (attempts_of_a("succeeded"), 1.0),
        ("mrt_provider_inflight{provider=\"a\"}".to_owned(), 0.0),
        ("mrt_queue_wait_seconds_count".to_owned(), 1.0),
        (
            format!("gen_ai_server_time_to_first_token_seconds_count{{{labels}}}"),
            1.0,
        ),
        (
            format!("gen_ai_client_operation_duration_seconds_count{{{labels}}}"),
            1.0,
        ),
        (
            format!("gen_ai_client_token_usage_sum{{{labels},gen_ai_token_type=\"output\"}}"),
            3.0,
        ),
        (
            format!("gen_ai_client_token_usage_sum{{{labels},gen_ai_token_type=\"input\"}}"),
            1.0,
        ),
        (
            format!(
                "mrt_execution_duration_seconds_count{{provider=\"a\",model=\"{model}\",outcome=\"succeeded\"}}"
            ),
            1.0,
        ),
        ("mrt_job_redeliveries_total".to_owned(), 0.0),
    ];
    assert_samples(&text, &expected);
    assert!(
        !text.contains(&job.execution_id.to_string()),
        "an execution id became a label"
    );
}

#[tokio::test]
async fn a_failed_attempt_and_a_redelivery_are_counted_by_code() {
    // A second delivery of a job whose log holds only `accepted`: nothing had started.
    let (_, text) = run_and_render(vec![Step::Fail(unavailable())], 2).await;
    let model = model_of("a");
    let expected = [
        (
            "mrt_executions_total{outcome=\"failed\",code=\"provider_unavailable\"}".to_owned(),
            1.0,
        ),
        (attempts_of_a("failed"), 1.0),
        (
            format!(
                "gen_ai_client_operation_duration_seconds_count{{gen_ai_provider_name=\"a\",gen_ai_request_model=\"{model}\",error_type=\"provider_unavailable\"}}"
            ),
            1.0,
        ),
        ("mrt_job_redeliveries_total".to_owned(), 1.0),
        ("mrt_provider_inflight{provider=\"a\"}".to_owned(), 0.0),
    ];
    assert_samples(&text, &expected);
}

/// Claims of keyed jobs' keys are counted by outcome; every outcome is there from the start.
#[tokio::test]
async fn key_claims_are_counted_by_outcome() {
    let exporter = MetricsExporter::install();
    let a = ScriptedProvider::succeeding("a");
    let h = Harness::new(vec![(a as Arc<dyn Provider>, DEFAULT_LIMITS)]);
    let keyed = |mut job: runtime::Job| {
        job.key = Some(runtime::KeyClaim {
            key_hash: "k".into(),
            record: runtime::IdempotencyRecord {
                fingerprint: "f".into(),
                execution_id: job.execution_id,
                created_at: job.accepted_at,
            },
        });
        job
    };
    let first = keyed(h.submit(&text_request(""), Duration::from_secs(30)).await);
    assert_eq!(h.runner.run(&first, 1).await, RunOutcome::Finished);
    let retry = keyed(h.submit(&text_request(""), Duration::from_secs(30)).await);
    assert_eq!(h.runner.run(&retry, 1).await, RunOutcome::Dropped);
    let text = exporter.render();
    let claims =
        |outcome: &str| format!("mrt_idempotency_key_claims_total{{outcome=\"{outcome}\"}}");
    assert_samples(
        &text,
        &[
            (claims("bound"), 1.0),
            (claims("another"), 1.0),
            (claims("unreachable"), 0.0),
        ],
    );
}
