//! The `mrt` binary against a real embedded gateway: output, exit codes, JSON lines, stdin,
//! watch cursors, cancellation and usage errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use model_runtime_client::{IdempotencyKey, SubmitOptions, text_request};
use serde_json::{Value, json};
use support::*;
use testkit::gateway::delta_texts;

/// Runs `mrt ARGS` with `MODEL_RUNTIME_URL=url` (when given) and `stdin`.
async fn mrt(url: Option<&str>, args: &[&str], stdin: Option<&str>) -> Run {
    let env: Vec<(&str, &str)> = url.map(|u| ("MODEL_RUNTIME_URL", u)).into_iter().collect();
    run_mrt(args, &env, stdin).await
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_the_output_and_exits_zero() {
    let gw = Gateway::start_default().await;
    let out = mrt(Some(&gw.base), &["run", "--text", "hi"], None).await;
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.stdout, "hello from mock\n");
    assert!(
        out.stderr.contains("usage: input_token=1 output_token=3"),
        "{}",
        out.stderr
    );

    // The same from a file given with --url, and from stdin.
    let dir = std::env::temp_dir().join(format!("mrt-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("request.json");
    std::fs::write(
        &file,
        json!({"ability":"text-generation","input":[{"type":"text","text":"hi"}]}).to_string(),
    )
    .unwrap();
    let out = mrt(
        None,
        &["--url", &gw.base, "run", file.to_str().unwrap()],
        None,
    )
    .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "hello from mock\n"),
        "{}",
        out.stderr
    );
    let request = std::fs::read_to_string(&file).unwrap();
    let out = mrt(Some(&gw.base), &["run", "-"], Some(&request)).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "hello from mock\n"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_execution_exits_one_with_the_code_on_stderr() {
    let gw = failing_gateway().await;
    let out = mrt(Some(&gw.base), &["run", "--text", "hi"], None).await;
    assert_eq!(
        out.code, 1,
        "stdout {:?} stderr {:?}",
        out.stdout, out.stderr
    );
    assert!(
        out.stderr.contains("provider_unavailable"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "{:?}", out.stdout);

    let out = mrt(Some(&gw.base), &["--json", "run", "--text", "hi"], None).await;
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("provider_unavailable"),
        "{}",
        out.stderr
    );
    let events = json_lines(&out.stdout);
    assert_eq!(events.last().unwrap()["type"], "execution.failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_prints_one_event_per_line_with_contiguous_sequences() {
    let gw = Gateway::start_default().await;
    let out = mrt(Some(&gw.base), &["run", "--json", "--text", "hi"], None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let events = json_lines(&out.stdout);
    assert_eq!(events.len(), 7);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence"], json!(i + 1));
        assert_eq!(event["execution_id"], events[0]["execution_id"]);
    }
    assert_eq!(events[0]["type"], "execution.accepted");
    assert_eq!(events[6]["type"], "execution.completed");
    let text: String = delta_texts(&events).concat();
    assert_eq!(text, "hello from mock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_get_result_and_watch_after_a_cursor() {
    let gw = Gateway::start_default().await;
    let out = mrt(
        Some(&gw.base),
        &["submit", "--text", "hi", "--idempotent"],
        None,
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let id = out.stdout.trim().to_owned();
    assert_eq!(id.len(), 36, "{:?}", out.stdout);
    assert!(out.stderr.contains("idempotency key"), "{}", out.stderr);

    let client = gw.client();
    let parsed = id.parse().unwrap();
    wait_terminal(&client, parsed).await;

    let out = mrt(Some(&gw.base), &["watch", &id, "--after", "3"], None).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, " from mock\n"),
        "{}",
        out.stderr
    );
    let out = mrt(
        Some(&gw.base),
        &["--json", "watch", &id, "--after", "3"],
        None,
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let seqs: Vec<Value> = json_lines(&out.stdout)
        .iter()
        .map(|e| e["sequence"].clone())
        .collect();
    assert_eq!(seqs, [json!(4), json!(5), json!(6), json!(7)]);
    // Past the terminal event: nothing to print, and the snapshot decides the exit code.
    let out = mrt(Some(&gw.base), &["watch", &id, "--after", "7"], None).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, ""), "{}", out.stderr);

    let out = mrt(Some(&gw.base), &["get", &id], None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let snapshot: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(snapshot["status"], "succeeded");
    let out = mrt(Some(&gw.base), &["--json", "result", &id], None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let result = json_lines(&out.stdout);
    assert_eq!(result[0]["result"]["outputs"][0]["text"], "hello from mock");

    let out = mrt(Some(&gw.base), &["providers"], None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .starts_with("provider-mock\tmodel-alpha\ttext-generation"),
        "{}",
        out.stdout
    );
    let out = mrt(Some(&gw.base), &["--json", "runtime"], None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json_lines(&out.stdout)[0]["state"], "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_slow_execution() {
    let gw = slow_gateway().await;
    let client = gw.client();
    let id = submit_text(&client, "slow").await.to_string();

    let out = mrt(Some(&gw.base), &["result", &id], None).await;
    assert_eq!(out.code, 4, "result of a running execution: {}", out.stderr);

    let out = mrt(Some(&gw.base), &["cancel", &id], None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "cancellation requested\n");

    let out = mrt(Some(&gw.base), &["watch", &id], None).await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("execution cancelled: cancelled"),
        "{}",
        out.stderr
    );

    let out = mrt(Some(&gw.base), &["cancel", &id], None).await;
    assert_eq!(
        out.code, 4,
        "cancel of a finished execution: {}",
        out.stderr
    );
    assert!(out.stderr.contains("not_found"), "{}", out.stderr);
    let out = mrt(Some(&gw.base), &["result", &id], None).await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("cancelled"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_while_streaming_exits_one() {
    let gw = slow_gateway().await;
    let key = IdempotencyKey::generate();
    let base = gw.base.clone();
    let key_arg = key.to_string();
    let running = tokio::spawn(async move {
        mrt(
            Some(&base),
            &["run", "--text", "slow", "--idempotency-key", &key_arg],
            None,
        )
        .await
    });
    // The same request with the same key names the run's execution, whoever submits first.
    let client = gw.client();
    let id = client
        .submit(
            &text_request("text-generation", "slow"),
            &SubmitOptions::with_key(key),
        )
        .await
        .unwrap()
        .execution_id;
    wait_for("the run to open its event stream", || async {
        (gw.open_streams() > 0).then_some(())
    })
    .await;
    assert!(client.cancel(id).await.unwrap());
    let out = running.await.unwrap();
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("execution cancelled: cancelled"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&id.to_string()),
        "the run names its execution: {}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_api_key_variable_is_no_key() {
    // `export MODEL_RUNTIME_API_KEY=` to "unset" it was a usage error (exit 2).
    let gw = Gateway::start_default().await;
    let env = [
        ("MODEL_RUNTIME_URL", gw.base.as_str()),
        ("MODEL_RUNTIME_API_KEY", ""),
    ];
    let out = run_mrt(&["providers"], &env, None).await;
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert!(out.stdout.contains("model-alpha"), "{}", out.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_transport_errors_have_their_exit_codes() {
    let out = mrt(None, &["run"], None).await;
    assert_eq!(out.code, 2, "missing request: {}", out.stderr);
    let out = mrt(None, &["get", "not-a-uuid"], None).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    let out = mrt(
        None,
        &["--url", "http://u:p@127.0.0.1:1", "providers"],
        None,
    )
    .await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(!out.stderr.contains("u:p"), "{}", out.stderr);
    let out = mrt(None, &["run", "-"], Some("{not json")).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    let id = uuid::Uuid::new_v4().to_string();
    let out = mrt(None, &["watch", &id, "--after", "9007199254740992"], None).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    let out = mrt(
        None,
        &["run", "--text", "x", "--idempotency-key", "has space"],
        None,
    )
    .await;
    assert_eq!(out.code, 2, "{}", out.stderr);

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let out = mrt(
        Some(&format!("http://{addr}")),
        &["--retries", "1", "providers"],
        None,
    )
    .await;
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("unavailable"), "{}", out.stderr);

    let gw = Gateway::start_default().await;
    let out = mrt(Some(&gw.base), &["get", &id], None).await;
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("not_found"), "{}", out.stderr);
    let out = mrt(
        Some(&gw.base),
        &["run", "--text", "x", "--ability", "unknown"],
        None,
    )
    .await;
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("capability_unavailable"),
        "{}",
        out.stderr
    );
}
