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

#[tokio::test]
async fn a_successful_execution_is_counted_with_latencies_and_token_usage() {
    let exporter = MetricsExporter::install();
    let a = ScriptedProvider::new("a", success_script());
    let h = Harness::new(vec![(a.clone() as Arc<dyn Provider>, DEFAULT_LIMITS)]);
    let job = h.submit(&text_request(""), Duration::from_secs(30)).await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);

    let text = exporter.render();
    let model = model_of("a");
    let labels = format!("gen_ai_provider_name=\"a\",gen_ai_request_model=\"{model}\"");
    for (series, expected) in [
        (
            "mrt_executions_total{outcome=\"succeeded\",code=\"none\"}".to_owned(),
            1.0,
        ),
        (
            format!(
                "mrt_provider_attempts_total{{provider=\"a\",model=\"{model}\",outcome=\"succeeded\"}}"
            ),
            1.0,
        ),
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
    ] {
        assert_eq!(
            sample(&text, &series),
            Some(expected),
            "{series} in:\n{text}"
        );
    }
    assert!(
        !text.contains(&job.execution_id.to_string()),
        "an execution id became a label"
    );
}

#[tokio::test]
async fn a_failed_attempt_and_a_redelivery_are_counted_by_code() {
    let exporter = MetricsExporter::install();
    let a = ScriptedProvider::new("a", vec![Step::Fail(unavailable())]);
    let h = Harness::new(vec![(a.clone() as Arc<dyn Provider>, DEFAULT_LIMITS)]);
    let job = h.submit(&text_request(""), Duration::from_secs(30)).await;
    // A second delivery of a job whose log holds only `accepted`: nothing had started.
    assert_eq!(h.runner.run(&job, 2).await, RunOutcome::Finished);

    let text = exporter.render();
    let model = model_of("a");
    for (series, expected) in [
        (
            "mrt_executions_total{outcome=\"failed\",code=\"provider_unavailable\"}".to_owned(),
            1.0,
        ),
        (
            format!(
                "mrt_provider_attempts_total{{provider=\"a\",model=\"{model}\",outcome=\"failed\"}}"
            ),
            1.0,
        ),
        (
            format!(
                "gen_ai_client_operation_duration_seconds_count{{gen_ai_provider_name=\"a\",gen_ai_request_model=\"{model}\",error_type=\"provider_unavailable\"}}"
            ),
            1.0,
        ),
        ("mrt_job_redeliveries_total".to_owned(), 1.0),
        ("mrt_provider_inflight{provider=\"a\"}".to_owned(), 0.0),
    ] {
        assert_eq!(
            sample(&text, &series),
            Some(expected),
            "{series} in:\n{text}"
        );
    }
}
