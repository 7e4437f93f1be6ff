//! Integration tests of the runner (`worker::runner::Runner`) and the job loop
//! (`worker::WorkerPool`) over the in-memory stores: every test checks the exact event log
//! (types, statuses, sequences 1..n, one terminal event last) and the materialized snapshot.
//! References `[R n]` are to `docs/reference-behaviours.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use protocol::event::{EventBody, ExecutionStatus, ProgressPhase};
use protocol::{
    ErrorCode, ExecutionId, ExecutionSnapshot, RuntimeError, RuntimeEvent, Target, Timestamp,
    UsageFact, UsageSource, UsageUnit,
};
use runtime::memory::{MemoryJobQueue, MemoryLimits};
use runtime::{CancelBus, EventStore, IdempotencyStore, JobQueue, StoreError};
use support::*;
use tokio::sync::Semaphore;
use worker::provider::mock::{MockConfig, MockProvider};
use worker::provider::{Provider, ProviderEvent};
use worker::runner::{RunOutcome, RunnerSettings, interrupted_error};
use worker::{PoolConfig, WorkerPool};

fn limits(max_concurrency: u32, max_queue_depth: u32) -> Limits {
    Limits {
        max_concurrency,
        max_queue_depth,
    }
}

/// Runner settings whose cleanup grace is far longer than any test waits, so a test fails if
/// an interrupted attempt is only ended by the grace period.
fn long_cleanup() -> RunnerSettings {
    RunnerSettings {
        cleanup_grace: Duration::from_secs(120),
        ..RunnerSettings::default()
    }
}

/// Submits `request` (deadline [`LONG`]) and runs it to its end.
async fn run_to_end(h: &Harness, request: &str) -> runtime::Job {
    let job = h.submit(request, LONG).await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);
    job
}

/// Submits `request` with a one-second deadline and runs it until the deadline ends it.
async fn run_past_a_short_deadline(h: &Harness, request: &str, what: &str) -> runtime::Job {
    let job = h.submit(request, Duration::from_secs(1)).await;
    let outcome = within(what, PATIENCE, h.runner.run(&job, 1)).await;
    assert_eq!(outcome, RunOutcome::Finished);
    job
}

/// Checks that the log of `id` is one attempt at scripted provider `a`, with `middle`
/// events, that failed the execution with `error`.
async fn assert_a_failed(
    h: &Harness,
    id: ExecutionId,
    middle: &[EventBody],
    error: RuntimeError,
) -> Vec<RuntimeEvent> {
    h.assert_log(id, &failed_after(target("a"), middle, error))
        .await
}

/// Checks that the log of `id` failed with `error` before any route was selected; returns
/// its snapshot.
async fn assert_failed_unrouted(
    h: &Harness,
    id: ExecutionId,
    error: RuntimeError,
) -> ExecutionSnapshot {
    h.assert_log(id, &[EventBody::Accepted, failed(error)])
        .await;
    let snapshot = h.snapshot(id).await;
    assert_eq!(snapshot.status, ExecutionStatus::Failed);
    assert_eq!(snapshot.target, None);
    snapshot
}

/// Checks the log of `id` against the log rules and its event types against `types`.
async fn assert_types(h: &Harness, id: ExecutionId, types: &[&str]) {
    let events = h.events(id).await;
    assert_log_rules(id, &events);
    assert_eq!(type_names(&events), types);
}

/// Checks an execution's error field by field.
fn assert_error(error: Option<RuntimeError>, code: ErrorCode, message: &str, retryable: bool) {
    let error = error.expect("the execution has an error");
    assert_eq!(error.code, code);
    assert_eq!(error.message, message);
    assert_eq!(error.retryable, retryable);
}

/// Checks that the snapshot of `id` ended `status` with a terminal (not retryable) error of
/// `code` and `message`.
async fn assert_ended(
    h: &Harness,
    id: ExecutionId,
    status: ExecutionStatus,
    code: ErrorCode,
    message: &str,
) {
    let snapshot = h.snapshot(id).await;
    assert_eq!(snapshot.status, status);
    assert_error(snapshot.error, code, message, false);
}

/// Starts a run of a new text execution of `h`, cancels it once its route is selected (before
/// any output) and checks its log; returns the execution.
async fn cancel_after_routing(h: &Harness) -> ExecutionId {
    let (job, run) = submit_and_spawn(h, &text_request("")).await;
    let id = job.execution_id;
    wait_until("route.selected is logged", PATIENCE, || {
        h.has_event(id, "route.selected")
    })
    .await;
    cancel_before_output(h, id, "cancel", run).await;
    id
}

/// Cancels `id`, awaits its `run`, and checks the log ends `cancelled` after the attempt at
/// `a` with no output.
async fn cancel_before_output(
    h: &Harness,
    id: ExecutionId,
    what: &str,
    run: tokio::task::JoinHandle<RunOutcome>,
) {
    h.bus.request(id).await.unwrap();
    finishes(what, run).await;
    assert_a_failed(h, id, &[], RuntimeError::cancelled()).await;
}

/// Runs `job` (delivery 1) on a log a gateway cancel closed before the runner's first event:
/// the runner is fenced, `a` is never called, and the log is `accepted`, `failed(cancelled)`.
async fn assert_fenced_by_a_cancel(
    h: &Harness,
    a: &ScriptedProvider,
    job: &runtime::Job,
) -> Vec<RuntimeEvent> {
    assert_eq!(h.runner.run(job, 1).await, RunOutcome::Dropped);
    let events = h
        .assert_log(
            job.execution_id,
            &[EventBody::Accepted, failed(RuntimeError::cancelled())],
        )
        .await;
    assert_eq!(a.calls(), 0);
    assert_eq!(h.bus.watched(), 0);
    events
}

/// Submits `request` (deadline [`LONG`]) and runs it (delivery 1) on a task.
async fn submit_and_spawn(
    h: &Harness,
    request: &str,
) -> (runtime::Job, tokio::task::JoinHandle<RunOutcome>) {
    let job = h.submit(request, LONG).await;
    let run = spawn_run(h, &job);
    (job, run)
}

/// Scripted provider `a`, succeeding, alone in a harness with default limits.
fn succeeding_a() -> (Arc<ScriptedProvider>, Harness) {
    let a = ScriptedProvider::succeeding("a");
    let h = Harness::scripted(&[&a]);
    (a, h)
}

/// [`succeeding_a`] with a job for a plain text request whose log exists.
async fn succeeding_a_with_job() -> (Arc<ScriptedProvider>, Harness, runtime::Job) {
    let (a, h) = succeeding_a();
    let job = h.submit(&text_request(""), LONG).await;
    (a, h, job)
}

/// Succeeding `a` whose runner writes through an [`InterposedStore`] that interferes with
/// the first `on_type` append (see [`Harness::interposed`]).
fn interposed_a(
    on_type: &'static str,
    interference: Interference,
    refuse_terminal: bool,
) -> (Arc<ScriptedProvider>, Harness) {
    let a = ScriptedProvider::succeeding("a");
    let h = Harness::interposed(&[&a], on_type, interference, refuse_terminal);
    (a, h)
}

/// Provider `a` that hangs for an hour, in a [`patient`] harness.
fn hanging_a() -> (Arc<ScriptedProvider>, Harness) {
    let a = ScriptedProvider::hanging("a");
    let h = patient(&[(&a, DEFAULT_LIMITS)]);
    (a, h)
}

/// Provider `a` that streams "partial" then goes quiet for an hour, in a [`patient`] harness.
fn partial_then_hanging() -> (Arc<ScriptedProvider>, Harness) {
    let a = ScriptedProvider::new(
        "a",
        vec![
            emit_delta("partial"),
            Step::Sleep(Duration::from_secs(3600)),
        ],
    );
    let h = patient(&[(&a, DEFAULT_LIMITS)]);
    (a, h)
}

/// Provider `a` that hangs for an hour and reports its interrupted call as a retryable
/// outage, and a succeeding fallback `b`, in a [`patient`] harness.
fn failing_when_interrupted_then_b() -> (Arc<ScriptedProvider>, Arc<ScriptedProvider>, Harness) {
    let a = ScriptedProvider::new(
        "a",
        vec![Step::SleepOrFail(Duration::from_secs(3600), unavailable())],
    );
    let b = ScriptedProvider::succeeding("b");
    let h = patient(&[(&a, DEFAULT_LIMITS), (&b, DEFAULT_LIMITS)]);
    (a, b, h)
}

/// The target of the default mock provider.
fn mock_target() -> Target {
    Target {
        provider: "provider-mock".into(),
        model: "model-alpha".into(),
    }
}

/// A harness over the default mock provider (limits 4/8).
fn mock_harness() -> Harness {
    let mock: Arc<dyn Provider> = Arc::new(MockProvider::new(MockConfig::default()));
    Harness::new(vec![(mock, limits(4, 8))])
}

/// The log of the default mock provider's successful run.
fn mock_reference_log() -> Vec<EventBody> {
    vec![
        EventBody::Accepted,
        EventBody::RouteSelected {
            target: mock_target(),
            attempt: 1,
        },
        delta("hello"),
        delta(" from"),
        delta(" mock"),
        usage(3),
        EventBody::Completed {
            target: mock_target(),
        },
    ]
}

/// A pool of `concurrency` job loops over a fresh memory queue, running `h`'s runner.
fn spawn_pool(
    h: &Harness,
    concurrency: usize,
    heartbeat: Duration,
) -> (Arc<MemoryJobQueue>, WorkerPool) {
    let queue = Arc::new(MemoryJobQueue::new());
    let pool = spawn_pool_on(
        h,
        Arc::clone(&queue) as Arc<dyn JobQueue>,
        concurrency,
        heartbeat,
    );
    (queue, pool)
}

/// [`spawn_pool`] over a given queue.
fn spawn_pool_on(
    h: &Harness,
    queue: Arc<dyn JobQueue>,
    concurrency: usize,
    heartbeat: Duration,
) -> WorkerPool {
    WorkerPool::spawn(
        queue,
        Arc::clone(&h.runner),
        PoolConfig {
            concurrency,
            heartbeat,
        },
    )
}

/// Provider `a` streams 20 deltas (fallback `b` after it) into a store that holds 4 events
/// per execution (`pipelined` or inline writes): the run stores what fits and the log is
/// closed with the limit failure. Returns the harness, the job and the limit error.
async fn run_into_the_event_limit(pipelined: bool) -> (Harness, runtime::Job, RuntimeError) {
    let script = (0..20).map(|i| emit_delta(&format!("chunk{i}"))).collect();
    let a = ScriptedProvider::new("a", script);
    let b = ScriptedProvider::succeeding("b");
    let mut h = Harness::event_limited(&[&a, &b], 4);
    if pipelined {
        h = h.pipelined();
    }
    let job = run_to_end(&h, &text_request(FALLBACK)).await;
    let limit_error = not_retryable(
        ErrorCode::QueueFull,
        "Execution event log limit was reached",
    );
    assert_a_failed(
        &h,
        job.execution_id,
        &[delta("chunk0"), delta("chunk1")],
        limit_error.clone(),
    )
    .await;
    assert_eq!(b.calls(), 0);
    assert_eq!(h.store.active(), 0, "the log is closed");
    (h, job, limit_error)
}

/// A provider that holds each attempt until the returned semaphore gives a permit, then
/// succeeds.
fn held_then_succeeding(id: &str) -> (Arc<ScriptedProvider>, Arc<Semaphore>) {
    let release = Arc::new(Semaphore::new(0));
    let mut script = vec![Step::Hold(Arc::clone(&release))];
    script.extend(success_script());
    (ScriptedProvider::new(id, script), release)
}

/// Provider `a` with one slot and one queue place ([`held_then_succeeding`], [`patient`]),
/// whose `first` job holds the slot and whose `second` waits in the queue.
struct HeldAndQueued {
    a: Arc<ScriptedProvider>,
    release: Arc<Semaphore>,
    h: Harness,
    first: runtime::Job,
    second: runtime::Job,
    first_run: tokio::task::JoinHandle<RunOutcome>,
    second_run: tokio::task::JoinHandle<RunOutcome>,
    /// The registration of `a`, whose gate holds the slot and the queue.
    entry: Arc<worker::registry::ProviderEntry>,
}

/// Runs a first job until it holds `a`'s only slot, then a second until it waits in `a`'s
/// queue.
async fn hold_and_queue() -> HeldAndQueued {
    let (a, release) = held_then_succeeding("a");
    let h = patient(&[(&a, limits(1, 1))]);
    let first = h.submit(&text_request(""), LONG).await;
    let second = h.submit(&text_request(""), LONG).await;
    let entry = Arc::clone(&h.registry.candidates(&first.request)[0].entry);
    let gate = &entry.gate;
    let first_run = spawn_run(&h, &first);
    wait_until("the first holds the slot", PATIENCE, || async {
        a.calls() == 1
    })
    .await;
    let second_run = spawn_run(&h, &second);
    wait_until("the second waits in the queue", PATIENCE, || async {
        gate.queued() == 1
    })
    .await;
    HeldAndQueued {
        a,
        release,
        h,
        first,
        second,
        first_run,
        second_run,
        entry,
    }
}

/// Scripted providers with their limits, and [`long_cleanup`].
fn patient(providers: &[(&Arc<ScriptedProvider>, Limits)]) -> Harness {
    Harness::with(
        providers
            .iter()
            .map(|(p, l)| (Arc::clone(*p) as Arc<dyn Provider>, *l))
            .collect(),
        MemoryLimits::default(),
        long_cleanup(),
    )
}

// ---------------------------------------------------------------------------------------------
// Success and routing [R 25-31, 46]

#[tokio::test]
async fn mock_success_writes_the_reference_sequence_and_snapshot() {
    let h = mock_harness();
    let job = run_to_end(&h, &text_request("")).await;

    let events = h.assert_log(job.execution_id, &mock_reference_log()).await;
    use ExecutionStatus::*;
    assert_eq!(
        statuses(&events),
        [
            Accepted, Routing, Running, Running, Running, Running, Succeeded
        ]
    );
    // Integral quantities are written as JavaScript peers write them.
    assert!(
        events[5].to_json().starts_with(
            r#"{"type":"usage.reported","facts":[{"unit":"input_token","quantity":1,"source":"runtime","complete":true},{"unit":"output_token","quantity":3,"source":"runtime","complete":true}],"status":"running","#
        ),
        "{}",
        events[5].to_json()
    );

    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.status, Succeeded);
    assert_eq!(snapshot.last_sequence.get(), 7);
    assert_eq!(snapshot.target, Some(mock_target()));
    assert_eq!(snapshot.result, Some(hello_result()));
    assert_eq!(snapshot.usage, mock_usage_facts(3));
    assert_eq!(snapshot.error, None);
    assert_eq!(snapshot.artifacts, None);
    assert_eq!(snapshot.updated_at, events[6].time);
    assert_eq!(h.bus.watched(), 0, "the runner stops watching for cancels");
}

#[tokio::test]
async fn retryable_failure_falls_back_to_the_next_candidate() {
    let a = ScriptedProvider::failing("a");
    let b = ScriptedProvider::succeeding("b");
    let h = Harness::scripted(&[&a, &b]);
    let job = run_to_end(&h, &text_request(FALLBACK)).await;

    let events = h
        .assert_log(
            job.execution_id,
            &[
                EventBody::Accepted,
                selected("a", 1),
                attempt_failed("a", 1, unavailable()),
                selected("b", 2),
                delta("hello"),
                delta(" from"),
                delta(" mock"),
                usage(3),
                completed("b"),
            ],
        )
        .await;
    assert_eq!(events[2].status, ExecutionStatus::Routing);
    assert_eq!(events[3].status, ExecutionStatus::Routing);
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.status, ExecutionStatus::Succeeded);
    assert_eq!(snapshot.target, Some(target("b")));
    assert_eq!(snapshot.result, Some(hello_result()));
    assert_eq!(
        snapshot.error, None,
        "a recovered attempt failure is not the execution's error"
    );
    assert_eq!((a.calls(), b.calls()), (1, 1));
}

#[tokio::test]
async fn without_allow_fallback_there_is_exactly_one_attempt() {
    for routing in [
        "",
        r#"{"max_attempts":5}"#,
        r#"{"allow_fallback":false,"max_attempts":5}"#,
        r#"{"strategy":"ordered","max_attempts":32,"retry_budget_ms":86400000}"#,
    ] {
        let a = ScriptedProvider::failing("a");
        let b = ScriptedProvider::succeeding("b");
        let h = Harness::scripted(&[&a, &b]);
        let job = run_to_end(&h, &text_request(routing)).await;

        assert_a_failed(&h, job.execution_id, &[], unavailable()).await;
        let snapshot = h.snapshot(job.execution_id).await;
        assert_eq!(snapshot.status, ExecutionStatus::Failed);
        assert_eq!(
            snapshot.target,
            Some(target("a")),
            "the attempted target is reported"
        );
        let error = snapshot.error.unwrap();
        assert!(
            error.retryable,
            "the provider's retryable error is kept: {routing}"
        );
        assert_eq!(error, unavailable());
        assert_eq!(snapshot.result, None);
        assert_eq!((a.calls(), b.calls()), (1, 0), "{routing}");
    }
}

#[tokio::test]
async fn max_attempts_bounds_the_attempts() {
    let rate_limited = status_failure(ErrorCode::RateLimited, 429);
    let a = ScriptedProvider::failing("a");
    let b = ScriptedProvider::new("b", vec![Step::Fail(rate_limited.clone())]);
    let c = ScriptedProvider::succeeding("c");
    let h = Harness::scripted(&[&a, &b, &c]);
    let job = run_to_end(
        &h,
        &text_request(r#"{"allow_fallback":true,"max_attempts":2}"#),
    )
    .await;

    let events = assert_a_failed(
        &h,
        job.execution_id,
        &[attempt_failed("a", 1, unavailable()), selected("b", 2)],
        rate_limited.clone(),
    )
    .await;
    assert_eq!(
        type_names(&events)
            .iter()
            .filter(|t| **t == "route.selected")
            .count(),
        2
    );
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.target, Some(target("b")));
    assert_eq!(
        snapshot.error,
        Some(rate_limited),
        "the last error, still retryable"
    );
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 1, 0));
}

#[tokio::test]
async fn fallback_without_max_attempts_tries_every_candidate_once() {
    let last = status_failure(ErrorCode::ProviderUnavailable, 502);
    let a = ScriptedProvider::failing("a");
    let b = ScriptedProvider::failing("b");
    let c = ScriptedProvider::new("c", vec![Step::Fail(last.clone())]);
    let h = Harness::scripted(&[&a, &b, &c]);
    // max_attempts above the candidate count is capped by it [R 28].
    for routing in [FALLBACK, r#"{"allow_fallback":true,"max_attempts":32}"#] {
        let job = run_to_end(&h, &text_request(routing)).await;
        assert_a_failed(
            &h,
            job.execution_id,
            &[
                attempt_failed("a", 1, unavailable()),
                selected("b", 2),
                attempt_failed("b", 2, unavailable()),
                selected("c", 3),
            ],
            last.clone(),
        )
        .await;
        assert_eq!(h.snapshot(job.execution_id).await.target, Some(target("c")));
    }
    assert_eq!((a.calls(), b.calls(), c.calls()), (2, 2, 2));
}

#[tokio::test]
async fn provider_order_ranks_candidates_and_unlisted_go_last() {
    let a = ScriptedProvider::failing("a");
    let b = ScriptedProvider::failing("b");
    let c = ScriptedProvider::succeeding("c");
    let h = Harness::scripted(&[&a, &b, &c]);
    let job = run_to_end(
        &h,
        &text_request(
            r#"{"allow_fallback":true,"provider_order":["b","zzz"],"strategy":"first_available"}"#,
        ),
    )
    .await;

    let mut expected = vec![
        EventBody::Accepted,
        selected("b", 1),
        attempt_failed("b", 1, unavailable()),
        selected("a", 2),
        attempt_failed("a", 2, unavailable()),
        selected("c", 3),
    ];
    expected.extend(success_log("c").into_iter().skip(2));
    h.assert_log(job.execution_id, &expected).await;
}

#[tokio::test]
async fn no_fallback_once_output_was_exposed() {
    let outputs = [
        (ProviderEvent::output_delta(0, "partial"), delta("partial")),
        (
            ProviderEvent::tool_call_started("call-1", "lookup"),
            EventBody::ToolCallStarted {
                call_id: "call-1".into(),
                name: "lookup".into(),
            },
        ),
        (
            ProviderEvent::tool_call_arguments("call-1", "{\"q\":"),
            EventBody::ToolCallArgumentsDelta {
                call_id: "call-1".into(),
                delta: "{\"q\":".into(),
            },
        ),
        (
            ProviderEvent::OutputResult {
                result: serde_json::json!({"image": 1}),
                artifacts: None,
            },
            EventBody::OutputResult {
                result: serde_json::json!({"image": 1}),
                artifacts: None,
            },
        ),
    ];
    for (event, body) in outputs {
        let a = ScriptedProvider::new("a", vec![Step::Emit(event), Step::Fail(unavailable())]);
        let b = ScriptedProvider::succeeding("b");
        let h = Harness::scripted(&[&a, &b]);
        let job = run_to_end(&h, &text_request(FALLBACK)).await;

        let not_retryable = unavailable().not_retryable();
        let events = assert_a_failed(
            &h,
            job.execution_id,
            std::slice::from_ref(&body),
            not_retryable.clone(),
        )
        .await;
        assert_eq!(events[3].status, ExecutionStatus::Failed);
        let snapshot = h.snapshot(job.execution_id).await;
        assert_eq!(snapshot.status, ExecutionStatus::Failed);
        assert_eq!(snapshot.target, Some(target("a")), "{body:?}");
        assert_eq!(snapshot.error, Some(not_retryable), "{body:?}");
        assert!(
            snapshot.result.is_some(),
            "the exposed output stays visible: {body:?}"
        );
        assert_eq!((a.calls(), b.calls()), (1, 0), "{body:?}");
    }
}

#[tokio::test]
async fn usage_and_progress_do_not_count_as_output() {
    let provider_usage = vec![UsageFact {
        unit: UsageUnit::request(),
        quantity: 1.0,
        source: UsageSource::Provider,
        complete: None,
    }];
    let cases = [
        (
            ProviderEvent::Usage(provider_usage.clone()),
            EventBody::UsageReported {
                facts: provider_usage.clone(),
            },
        ),
        (
            progress(),
            EventBody::Progress {
                phase: ProgressPhase::Processing,
                progress: Some(0.5),
            },
        ),
    ];
    for (event, body) in cases {
        let a = ScriptedProvider::new("a", vec![Step::Emit(event), Step::Fail(unavailable())]);
        let b = ScriptedProvider::succeeding("b");
        let h = Harness::scripted(&[&a, &b]);
        let job = run_to_end(&h, &text_request(FALLBACK)).await;

        let mut expected = vec![
            EventBody::Accepted,
            selected("a", 1),
            body.clone(),
            attempt_failed("a", 1, unavailable()),
            selected("b", 2),
        ];
        expected.extend(success_log("b").into_iter().skip(2));
        let events = h.assert_log(job.execution_id, &expected).await;
        assert_eq!(events[2].status, ExecutionStatus::Running);
        let snapshot = h.snapshot(job.execution_id).await;
        assert_eq!(snapshot.status, ExecutionStatus::Succeeded);
        assert_eq!(snapshot.target, Some(target("b")));
        assert_eq!(snapshot.result, Some(hello_result()));
        // Usage facts are concatenated across attempts, never summed [R 57].
        let mut usage = Vec::new();
        if matches!(body, EventBody::UsageReported { .. }) {
            usage.extend(provider_usage.clone());
        }
        usage.extend(mock_usage_facts(3));
        assert_eq!(snapshot.usage, usage);
        assert_eq!((a.calls(), b.calls()), (1, 1));
    }
}

#[tokio::test]
async fn a_non_retryable_error_ends_routing() {
    let bad_request = not_retryable(
        ErrorCode::ProviderUnavailable,
        "Provider request failed with status 400",
    )
    .with_provider_code("400");
    let a = ScriptedProvider::new("a", vec![Step::Fail(bad_request.clone())]);
    let b = ScriptedProvider::succeeding("b");
    let h = Harness::scripted(&[&a, &b]);
    let job = run_to_end(&h, &text_request(FALLBACK)).await;

    assert_a_failed(&h, job.execution_id, &[], bad_request.clone()).await;
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.error, Some(bad_request));
    assert_eq!(snapshot.target, Some(target("a")));
    assert_eq!((a.calls(), b.calls()), (1, 0));
}

#[tokio::test]
async fn a_spent_retry_budget_stops_fallback_and_keeps_the_last_error() {
    // The budget (50 ms) is spent by the first attempt (200 ms), so there is no fallback and no
    // attempt_failed; the final error keeps retryable:true [R 30].
    let a = ScriptedProvider::new(
        "a",
        vec![
            Step::Sleep(Duration::from_millis(200)),
            Step::Fail(unavailable()),
        ],
    );
    let b = ScriptedProvider::succeeding("b");
    let h = Harness::scripted(&[&a, &b]);
    let job = run_to_end(
        &h,
        &text_request(r#"{"allow_fallback":true,"retry_budget_ms":50}"#),
    )
    .await;

    assert_a_failed(&h, job.execution_id, &[], unavailable()).await;
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.status, ExecutionStatus::Failed);
    assert!(snapshot.error.unwrap().retryable);
    assert_eq!((a.calls(), b.calls()), (1, 0));

    // Control: with budget left, the same failure falls back.
    let job = run_to_end(
        &h,
        &text_request(r#"{"allow_fallback":true,"retry_budget_ms":600000}"#),
    )
    .await;
    assert_eq!(h.snapshot(job.execution_id).await.target, Some(target("b")));
    assert_eq!((a.calls(), b.calls()), (2, 1));
}

#[tokio::test]
async fn no_candidates_fails_with_capability_unavailable_without_routing() {
    let a = ScriptedProvider::succeeding("a");
    let h = Harness::scripted(&[&a]);
    for request in [
        r#"{"ability":"image-generation","input":[{"type":"text","text":"x"}]}"#,
        // The inferred input modality cannot be bypassed by narrowing requirements [R 25].
        r#"{"ability":"text-generation","input":[{"type":"image","uri":"https://x/y.png"}],"requirements":{"input_modalities":["text"]}}"#,
        r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}],"requirements":{"tools":true}}"#,
    ] {
        let job = run_to_end(&h, request).await;
        let snapshot =
            assert_failed_unrouted(&h, job.execution_id, RuntimeError::capability_unavailable())
                .await;
        assert_error(
            snapshot.error,
            ErrorCode::CapabilityUnavailable,
            "No provider satisfies the requested ability and capabilities",
            false,
        );
    }
    assert_eq!(a.calls(), 0);
}

#[tokio::test]
async fn invalid_usage_from_a_provider_is_a_protocol_error() {
    for quantity in [-1.0, f64::NAN, f64::INFINITY] {
        let bad = UsageFact {
            unit: UsageUnit::input_token(),
            quantity,
            source: UsageSource::Provider,
            complete: None,
        };
        let a = ScriptedProvider::new(
            "a",
            vec![emit_delta("x"), Step::Emit(ProviderEvent::Usage(vec![bad]))],
        );
        let b = ScriptedProvider::succeeding("b");
        let h = Harness::scripted(&[&a, &b]);
        let job = run_to_end(&h, &text_request(FALLBACK)).await;

        assert_types(&h, job.execution_id, &FAILED_AFTER_ONE_DELTA).await;
        let error = h.snapshot(job.execution_id).await.error.unwrap();
        assert_eq!(error.code, ErrorCode::ProviderProtocolError, "{quantity}");
        assert!(!error.retryable);
        assert_eq!(b.calls(), 0);
    }

    // Without output first, the protocol error is not retryable either: no fallback.
    let bad = UsageFact {
        unit: UsageUnit::output_token(),
        quantity: -1.0,
        source: UsageSource::Provider,
        complete: Some(true),
    };
    let a = ScriptedProvider::new("a", vec![Step::Emit(ProviderEvent::Usage(vec![bad]))]);
    let b = ScriptedProvider::succeeding("b");
    let h = Harness::scripted(&[&a, &b]);
    let job = run_to_end(&h, &text_request(FALLBACK)).await;
    assert_types(&h, job.execution_id, &FAILED_AT_ROUTING).await;
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(
        snapshot.error.unwrap().code,
        ErrorCode::ProviderProtocolError
    );
    assert!(
        snapshot.usage.is_empty(),
        "invalid usage never reaches the log"
    );
    assert_eq!(b.calls(), 0);
}

#[tokio::test]
async fn empty_usage_reports_are_not_logged() {
    let a = ScriptedProvider::new(
        "a",
        vec![
            Step::Emit(ProviderEvent::Usage(Vec::new())),
            emit_delta("hello"),
            emit_delta(" from"),
            emit_delta(" mock"),
            Step::Emit(ProviderEvent::Usage(mock_usage_facts(3))),
        ],
    );
    let h = Harness::scripted(&[&a]);
    let job = run_to_end(&h, &text_request("")).await;
    h.assert_log(job.execution_id, &success_log("a")).await;
}

// ---------------------------------------------------------------------------------------------
// Deadlines [R 40]

#[tokio::test]
async fn the_deadline_fails_a_running_attempt() {
    let (a, h) = hanging_a();
    let job = run_past_a_short_deadline(&h, &text_request(""), "the deadline ends the run").await;

    let events =
        assert_a_failed(&h, job.execution_id, &[], RuntimeError::deadline_exceeded()).await;
    assert_eq!(events[2].status, ExecutionStatus::Failed);
    assert_ended(
        &h,
        job.execution_id,
        ExecutionStatus::Failed,
        ErrorCode::DeadlineExceeded,
        "Execution deadline was exceeded",
    )
    .await;
    assert_eq!(a.finished(), 1, "the attempt was cancelled and returned");
    assert_eq!(h.bus.watched(), 0);
}

#[tokio::test]
async fn the_deadline_applies_even_after_output_was_exposed() {
    let (_a, h) = partial_then_hanging();
    let job =
        run_past_a_short_deadline(&h, &text_request(FALLBACK), "the deadline ends the run").await;

    assert_a_failed(
        &h,
        job.execution_id,
        &[delta("partial")],
        RuntimeError::deadline_exceeded(),
    )
    .await;
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.status, ExecutionStatus::Failed);
    assert_eq!(snapshot.error, Some(RuntimeError::deadline_exceeded()));
    assert_eq!(
        snapshot.result,
        Some(
            serde_json::json!({"outputs":[{"index":0,"type":"text","text":"partial"}],"tool_calls":[]})
        )
    );
}

#[tokio::test]
async fn the_deadline_is_never_followed_by_fallback() {
    // An adapter that reports its interrupted call as a retryable transport error must not make
    // the runner try the next candidate after the deadline [R 40; invariant 4].
    let (a, b, h) = failing_when_interrupted_then_b();
    let job =
        run_past_a_short_deadline(&h, &text_request(FALLBACK), "the deadline ends the run").await;

    assert_a_failed(&h, job.execution_id, &[], RuntimeError::deadline_exceeded()).await;
    assert_eq!((a.calls(), b.calls()), (1, 0));
}

#[tokio::test]
async fn a_job_past_its_deadline_at_pickup_never_reaches_a_provider() {
    let (a, h) = succeeding_a();
    for late_by_ms in [0, 1, 60_000] {
        let mut job = job(&text_request(""), LONG);
        job.deadline_at = Timestamp::from_unix_millis(Timestamp::now().unix_millis() - late_by_ms);
        h.create_log(job.execution_id).await;

        assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);

        assert_failed_unrouted(&h, job.execution_id, RuntimeError::deadline_exceeded()).await;
    }
    assert_eq!(a.calls(), 0);
}

// ---------------------------------------------------------------------------------------------
// Cancellation [R 41]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_execution() {
    let (a, h) = partial_then_hanging();
    let (job, run) = submit_and_spawn(&h, &text_request("")).await;
    let id = job.execution_id;

    wait_for_output(&h, id).await;
    assert_eq!(h.bus.watched(), 1);
    h.bus.request(id).await.unwrap();

    let outcome = within("cancel ends the run", PATIENCE, run).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished);
    let events = assert_a_failed(&h, id, &[delta("partial")], RuntimeError::cancelled()).await;
    assert_eq!(events[3].status, ExecutionStatus::Cancelled);
    assert_ended(
        &h,
        id,
        ExecutionStatus::Cancelled,
        ErrorCode::Cancelled,
        "Execution was cancelled",
    )
    .await;
    assert_eq!(a.finished(), 1, "the adapter saw the cancel and returned");
    assert_eq!(
        h.bus.watched(),
        0,
        "the runner stops watching once terminal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_right_after_routing() {
    let (_a, h) = hanging_a();
    let id = cancel_after_routing(&h).await;
    assert_eq!(h.snapshot(id).await.status, ExecutionStatus::Cancelled);
    assert_eq!(h.bus.watched(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_execution_is_never_routed_to_a_fallback() {
    let (a, b, h) = failing_when_interrupted_then_b();
    let (job, run) = submit_and_spawn(&h, &text_request(FALLBACK)).await;

    wait_until("the attempt runs", PATIENCE, || async { a.calls() == 1 }).await;
    cancel_before_output(&h, job.execution_id, "cancel", run).await;
    assert_eq!(b.calls(), 0, "no provider call after the cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_does_not_break_cancelling_the_live_attempt() {
    let (a, h) = hanging_a();
    let (job, live) = submit_and_spawn(&h, &text_request("")).await;
    let id = job.execution_id;
    wait_until("the live attempt runs", PATIENCE, || async {
        a.calls() == 1
    })
    .await;

    // The same job delivered again for the first time (a republish) is dropped untouched...
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);
    assert_eq!(h.events(id).await.len(), 2);
    assert_eq!(a.calls(), 1);

    // ...and a cancel still reaches the live attempt.
    cancel_before_output(&h, id, "cancel reaches the live attempt", live).await;
    assert_eq!(h.bus.watched(), 0);
}

// ---------------------------------------------------------------------------------------------
// Flow control [R 35-37]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_provider_queue_fails_the_attempt_retryably() {
    let a = ScriptedProvider::hanging("a");
    let b = ScriptedProvider::succeeding("b");
    let h = patient(&[(&a, limits(1, 0)), (&b, DEFAULT_LIMITS)]);
    let (holder, holding) = submit_and_spawn(&h, &text_request("")).await;
    wait_until(
        "the first execution holds a's only slot",
        PATIENCE,
        || async { a.calls() == 1 },
    )
    .await;

    // With fallback: queue_full (retryable) → attempt_failed → b.
    let job = run_to_end(&h, &text_request(FALLBACK)).await;
    let mut expected = vec![
        EventBody::Accepted,
        selected("a", 1),
        attempt_failed("a", 1, RuntimeError::provider_queue_full()),
        selected("b", 2),
    ];
    expected.extend(success_log("b").into_iter().skip(2));
    h.assert_log(job.execution_id, &expected).await;
    assert_eq!(h.snapshot(job.execution_id).await.target, Some(target("b")));

    // Without fallback: the execution fails with queue_full, still retryable.
    let job = run_to_end(&h, &text_request("")).await;
    assert_a_failed(
        &h,
        job.execution_id,
        &[],
        RuntimeError::provider_queue_full(),
    )
    .await;
    assert_error(
        h.snapshot(job.execution_id).await.error,
        ErrorCode::QueueFull,
        "Provider execution queue is full",
        true,
    );
    assert_eq!(a.calls(), 1, "refused attempts never reach the provider");

    h.bus.request(holder.execution_id).await.unwrap();
    finishes("cancel", holding).await;
    assert_eq!(
        h.snapshot(holder.execution_id).await.status,
        ExecutionStatus::Cancelled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_attempts_are_routing_and_run_when_a_slot_frees() {
    let q = hold_and_queue().await;
    let h = &q.h;
    // The gate is taken after route.selected: a queued attempt is already routing [R 35].
    h.assert_log_prefix(
        q.second.execution_id,
        &[EventBody::Accepted, selected("a", 1)],
    )
    .await;
    assert_eq!(
        h.snapshot(q.second.execution_id).await.status,
        ExecutionStatus::Routing
    );

    q.release.add_permits(2);
    finishes("first", q.first_run).await;
    finishes("second", q.second_run).await;
    h.assert_log(q.first.execution_id, &success_log("a")).await;
    h.assert_log(q.second.execution_id, &success_log("a")).await;
    assert_eq!(q.a.max_in_flight(), 1);
    assert_eq!(q.entry.gate.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_queued_attempt_leaves_the_queue_promptly() {
    let q = hold_and_queue().await;
    let h = &q.h;

    // The cleanup grace is 120 s: only a waiter that leaves the queue on cancel ends in time.
    cancel_before_output(
        h,
        q.second.execution_id,
        "the queued attempt is cancelled",
        q.second_run,
    )
    .await;
    assert_eq!(
        q.entry.gate.queued(),
        0,
        "the cancelled waiter left the queue"
    );
    assert_eq!(q.a.calls(), 1);

    q.release.add_permits(1);
    finishes("first", q.first_run).await;
    h.assert_log(q.first.execution_id, &success_log("a")).await;
    assert_eq!(h.bus.watched(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_covers_time_spent_queued() {
    let a = ScriptedProvider::hanging("a");
    let h = patient(&[(&a, limits(1, 4))]);
    let (holder, holding) = submit_and_spawn(&h, &text_request("")).await;
    wait_until("the slot is held", PATIENCE, || async { a.calls() == 1 }).await;

    let job =
        run_past_a_short_deadline(&h, &text_request(""), "the deadline ends the queued run").await;
    assert_a_failed(&h, job.execution_id, &[], RuntimeError::deadline_exceeded()).await;
    assert_eq!(a.calls(), 1);

    h.bus.request(holder.execution_id).await.unwrap();
    finishes("cancel", holding).await;
}

// ---------------------------------------------------------------------------------------------
// Worker loss and fencing [architecture invariants 1 and 4]

#[tokio::test]
async fn a_redelivered_job_with_a_started_attempt_fails_as_interrupted() {
    let (a, h) = succeeding_a();
    for partial in [
        vec![selected("a", 1), delta("hel")],
        vec![selected("a", 1)],
        vec![selected("a", 1), attempt_failed("a", 1, unavailable())],
    ] {
        let job = h.submit(&text_request(FALLBACK), LONG).await;
        let id = job.execution_id;
        for body in &partial {
            h.append_foreign(id, body.clone()).await;
        }

        assert_eq!(h.runner.run(&job, 2).await, RunOutcome::Finished);

        let mut expected = vec![EventBody::Accepted];
        expected.extend(partial.clone());
        expected.push(failed(interrupted_error()));
        h.assert_log(id, &expected).await;
        let snapshot = h.snapshot(id).await;
        assert_eq!(snapshot.status, ExecutionStatus::Failed);
        assert_eq!(snapshot.target, Some(target("a")));
        let error = snapshot.error.unwrap();
        assert_eq!(error.code, ErrorCode::InternalError);
        assert!(
            error.message.contains("remote outcome is unknown"),
            "{}",
            error.message
        );
        assert!(!error.retryable);
    }
    assert_eq!(a.calls(), 0, "a provider call is never silently repeated");
    assert_eq!(h.bus.watched(), 0);
}

/// A delivery handed to the runner directly: leased for `lease` (`None`: never lapses), and
/// withdrawn by its submitter once `withdrawn` is set; `asked` counts the runner's questions.
#[derive(Default)]
struct Handed {
    lease: Option<Duration>,
    withdrawn: Arc<AtomicBool>,
    asked: Arc<AtomicUsize>,
}

impl Handed {
    /// From a queue whose leases lapse after `lease` without a heartbeat.
    fn leased(lease: Duration) -> Self {
        Self {
            lease: Some(lease),
            ..Self::default()
        }
    }

    /// Of a job its submitter withdraws by setting `withdrawn`.
    fn withdrawable(withdrawn: Arc<AtomicBool>) -> Self {
        Self {
            withdrawn,
            ..Self::default()
        }
    }
}

#[async_trait::async_trait]
impl runtime::DeliveryHandle for Handed {
    async fn ack(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn lease(&self) -> Option<Duration> {
        self.lease
    }
    async fn withdrawn(&self) -> Result<bool, StoreError> {
        self.asked.fetch_add(1, SeqCst);
        Ok(self.withdrawn.load(SeqCst))
    }
}

/// Delivers `job` to `h`'s runner again (delivery 2), leased for `lease`, in a task.
fn redeliver(
    h: &Harness,
    job: &runtime::Job,
    lease: Duration,
) -> tokio::task::JoinHandle<RunOutcome> {
    let runner = Arc::clone(&h.runner);
    let job = job.clone();
    tokio::spawn(async move {
        runner
            .run_delivery(&job, 2, Some(&Handed::leased(lease)))
            .await
    })
}

#[tokio::test]
async fn a_redelivery_of_an_execution_running_here_waits_for_it_and_writes_nothing() {
    // The lease of a healthy execution lapsed (a consumer leader election, or a partition
    // between this worker and the leader): the job comes back to this very worker while its
    // attempt runs. The attempt is not failed as "stopped heartbeating"; it finishes, and the
    // redelivery is then dropped (acknowledged).
    let (a, release) = held_then_succeeding("a");
    let h = Harness::scripted(&[&a]);
    let job = h.submit(&text_request(""), LONG).await;
    let id = job.execution_id;
    let runner = Arc::clone(&h.runner);
    let first = {
        let job = job.clone();
        tokio::spawn(async move { runner.run(&job, 1).await })
    };
    wait_until("the attempt holds the provider", PATIENCE, || async {
        a.calls() == 1
    })
    .await;
    let second = redeliver(&h, &job, Duration::from_millis(200));
    // Several leases pass: the redelivery still writes nothing.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(!second.is_finished());
    h.assert_log_prefix(id, &[EventBody::Accepted, selected("a", 1)])
        .await;
    release.add_permits(1);
    assert_eq!(first.await.unwrap(), RunOutcome::Finished);
    let second = within("the redelivery ends", PATIENCE, second).await;
    assert_eq!(second.unwrap(), RunOutcome::Dropped);
    h.assert_log(id, &success_log("a")).await;
    assert_eq!(a.calls(), 1);
}

#[tokio::test]
async fn a_redelivery_waits_while_its_previous_holder_writes_and_closes_the_log_once_silent() {
    // Another process holds the execution and keeps writing although its lease lapsed: it is
    // left to finish while it writes; once its log has been silent for a whole lease, the
    // redelivery closes it as interrupted.
    let (a, h) = succeeding_a();
    let job = h.submit(&text_request(""), LONG).await;
    let id = job.execution_id;
    h.append_foreign(id, selected("a", 1)).await;
    let lease = Duration::from_millis(600);
    let redelivery = redeliver(&h, &job, lease);
    let mut written = vec![EventBody::Accepted, selected("a", 1)];
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!redelivery.is_finished(), "left alone while written to");
        let body = delta(&format!("chunk{i}"));
        h.append_foreign(id, body.clone()).await;
        written.push(body);
    }
    let outcome = within("the redelivery ends", PATIENCE, redelivery).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Finished);
    written.push(failed(interrupted_error()));
    h.assert_log(id, &written).await;
    assert_eq!(a.calls(), 0);

    // A holder that closes the log itself: the redelivery is dropped.
    let job = h.submit(&text_request(""), LONG).await;
    let id = job.execution_id;
    h.append_foreign(id, selected("a", 1)).await;
    let redelivery = redeliver(&h, &job, lease);
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.append_foreign(id, completed("a")).await;
    let outcome = within("the redelivery ends", PATIENCE, redelivery).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Dropped);
    h.assert_log(id, &[EventBody::Accepted, selected("a", 1), completed("a")])
        .await;
}

#[tokio::test]
async fn a_redelivery_decides_its_holder_is_gone_on_the_latest_head_not_a_lagging_replica() {
    // A replica behind the leader answers the cheap head reads with a head a lease old; the
    // holder's last write, a moment ago, is on the leader only. Taking that stale head for
    // silence closed the log at it: the compare-and-set lost to the holder's write, the
    // redelivery was dropped, and, the holder being gone, the log stayed open until its
    // deadline. The redelivery waits a lease from the holder's real last write, then closes
    // the log after it.
    let a = ScriptedProvider::succeeding("a");
    let (h, lagging) = over_wrapped_store(&a, LaggingStore::new);
    let job = h.submit(&text_request(""), LONG).await;
    let id = job.execution_id;
    h.append_foreign(id, selected("a", 1)).await;
    lagging.freeze(id).await;
    let lease = Duration::from_millis(600);
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let last_write = delta("last");
    h.append_foreign(id, last_write.clone()).await;
    let written_at = std::time::Instant::now();

    let outcome = within("the redelivery ends", PATIENCE, redeliver(&h, &job, lease)).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Finished);
    assert!(
        // (The write's own time is a little before `written_at`.)
        written_at.elapsed() >= lease - Duration::from_millis(50),
        "closed {:?} after the holder's last write, within its lease",
        written_at.elapsed()
    );
    h.assert_log(
        id,
        &[
            EventBody::Accepted,
            selected("a", 1),
            last_write,
            failed(interrupted_error()),
        ],
    )
    .await;
    assert_eq!(a.calls(), 0);
}

#[tokio::test]
async fn a_redelivery_that_a_lagging_replica_shows_unstarted_closes_the_started_log() {
    // The previous holder wrote `route.selected` and died; a replica behind the leader still
    // shows only `execution.accepted`. Taken at its word, the redelivery claimed the log, lost
    // the compare-and-set to that `route.selected`, and was dropped (acknowledged): the log
    // stayed open until its deadline. It decides on the latest head, so it closes the log as
    // interrupted, without calling the provider.
    let a = ScriptedProvider::succeeding("a");
    let (h, lagging) = over_wrapped_store(&a, LaggingStore::new);
    let job = h.submit(&text_request(""), LONG).await;
    let id = job.execution_id;
    lagging.freeze(id).await;
    h.append_foreign(id, selected("a", 1)).await;
    let lease = Duration::from_millis(300);
    tokio::time::sleep(lease + Duration::from_millis(100)).await;

    let outcome = within("the redelivery ends", PATIENCE, redeliver(&h, &job, lease)).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Finished);
    h.assert_log(
        id,
        &[
            EventBody::Accepted,
            selected("a", 1),
            failed(interrupted_error()),
        ],
    )
    .await;
    assert_eq!(a.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_redelivery_of_a_job_this_worker_gave_up_names_the_unreachable_store() {
    // The cut outlasted every retry: the job was given back; its redelivery here, after the
    // heal, names the cause it knows rather than a stopped worker.
    let (h, store, job, outcome) = across_a_cut(Vec::new(), Duration::from_secs(600)).await;
    assert_eq!(outcome, RunOutcome::Abandoned);
    store.heal_losing_in_flight();
    let outcome = h
        .runner
        .run_delivery(&job, 2, Some(&Handed::leased(Duration::from_secs(30))))
        .await;
    assert_eq!(outcome, RunOutcome::Finished);
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(
        snapshot.error.unwrap().message,
        "Execution event store was unreachable; remote outcome is unknown"
    );
}

#[tokio::test]
async fn a_redelivered_job_past_its_deadline_fails_with_deadline_exceeded() {
    // Contract §8: the deadline, not the lost worker, ended an execution nobody ran in time.
    let (a, h) = succeeding_a();
    let mut job = h.submit(&text_request(FALLBACK), LONG).await;
    job.deadline_at = Timestamp::from_unix_millis(Timestamp::now().unix_millis() - 10);
    h.append_foreign(job.execution_id, selected("a", 1)).await;

    assert_eq!(h.runner.run(&job, 2).await, RunOutcome::Finished);

    h.assert_log(
        job.execution_id,
        &[
            EventBody::Accepted,
            selected("a", 1),
            failed(RuntimeError::deadline_exceeded()),
        ],
    )
    .await;
    assert_eq!(a.calls(), 0);
    assert!(interrupted_error().message.contains("stopped heartbeating"));
}

#[tokio::test]
async fn a_first_delivery_of_a_claimed_log_is_dropped() {
    let (a, h, job) = succeeding_a_with_job().await;
    let id = job.execution_id;
    h.append_foreign(id, selected("a", 1)).await;
    h.append_foreign(id, delta("hel")).await;
    let before = h.events(id).await;

    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);

    assert_eq!(h.events(id).await, before, "nothing appended");
    assert_eq!(h.snapshot(id).await.status, ExecutionStatus::Running);
    assert_eq!(a.calls(), 0);
    assert_eq!(h.bus.watched(), 0);
}

#[tokio::test]
async fn a_redelivered_job_that_never_started_runs_normally() {
    let (a, h, job) = succeeding_a_with_job().await;

    assert_eq!(h.runner.run(&job, 3).await, RunOutcome::Finished);

    h.assert_log(job.execution_id, &success_log("a")).await;
    assert_eq!(a.calls(), 1);
}

#[tokio::test]
async fn a_terminal_log_is_dropped_whatever_the_delivery() {
    let (a, h) = succeeding_a();
    let job = run_to_end(&h, &text_request("")).await;
    let done = h.events(job.execution_id).await;

    for delivered in [1, 2, 5] {
        assert_eq!(h.runner.run(&job, delivered).await, RunOutcome::Dropped);
    }
    assert_eq!(h.events(job.execution_id).await, done);
    assert_eq!(a.calls(), 1);
    assert_eq!(h.bus.watched(), 0);
}

// Paused time: the runner waits `log_wait` (10 s) for the log before dropping the job.
#[tokio::test(start_paused = true)]
async fn a_job_whose_log_never_appears_is_dropped_after_the_log_wait() {
    let (a, h) = succeeding_a();
    let job = job(&text_request(""), LONG);
    let waited = tokio::time::Instant::now();
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);
    assert!(waited.elapsed() >= RunnerSettings::default().log_wait);
    assert!(h.store.state(job.execution_id).await.unwrap().is_none());
    assert_eq!(a.calls(), 0);
}

/// Starts a delivery (to [`succeeding_a`]) of a job whose log does not exist, lets the runner
/// find it missing (paused time: the runner's sleeps run only when every task is idle), then
/// creates the log; with `withdraw`, as a submitter settling a failed create does: the log
/// created closed (one write), then the job withdrawn. Returns the provider, the harness, the
/// job and the run's outcome.
async fn run_before_the_log(
    withdraw: bool,
) -> (Arc<ScriptedProvider>, Harness, runtime::Job, RunOutcome) {
    let (a, h) = succeeding_a();
    let job = job(&text_request(""), LONG);
    let runner = Arc::clone(&h.runner);
    let delivered = job.clone();
    let withdrawn = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handle = Handed::withdrawable(Arc::clone(&withdrawn));
    let run = tokio::spawn(async move { runner.run_delivery(&delivered, 1, Some(&handle)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!run.is_finished(), "the runner waits for the log");
    let id = job.execution_id;
    if withdraw {
        let at = Timestamp::now();
        let unqueued = EventBody::Failed {
            error: RuntimeError::unqueued(),
        };
        h.store
            .create_closed(
                RuntimeEvent::new(id, protocol::Sequence(1), at, EventBody::Accepted),
                RuntimeEvent::new(id, protocol::Sequence(2), at, unqueued),
                &protocol::Tenant::default(),
            )
            .await
            .unwrap();
        withdrawn.store(true, std::sync::atomic::Ordering::SeqCst);
    } else {
        h.create_log(id).await;
    }
    let outcome = run.await.unwrap();
    (a, h, job, outcome)
}

#[tokio::test(start_paused = true)]
async fn a_job_that_arrives_before_its_log_waits_for_it_and_runs() {
    let (a, h, job, outcome) = run_before_the_log(false).await;
    assert_eq!(outcome, RunOutcome::Finished);
    assert_eq!(a.calls(), 1);
    let events = h.events(job.execution_id).await;
    assert_eq!(events.last().unwrap().type_name(), "execution.completed");
}

#[tokio::test(start_paused = true)]
async fn a_job_whose_log_appears_is_claimed_on_the_log_alone() {
    // Once its log was found after a wait, a job was dropped if the queue said it was
    // withdrawn. On replicated jobs streams the queue is asked at the stream's leader, which
    // can answer "no such message" for a job it has not applied yet (a follower's consumer
    // delivered it first): a live job was dropped and its execution left to its deadline. A
    // submitter closes a log before it withdraws its job, and a closed log refuses the claim,
    // so the log alone decides; here the queue would (wrongly) say withdrawn.
    let (a, h) = succeeding_a();
    let job = job(&text_request(""), LONG);
    let handle = Handed {
        withdrawn: Arc::new(AtomicBool::new(true)),
        ..Handed::default()
    };
    let asked = Arc::clone(&handle.asked);
    let runner = Arc::clone(&h.runner);
    let delivered = job.clone();
    let run = tokio::spawn(async move { runner.run_delivery(&delivered, 1, Some(&handle)).await });
    // Within the quick polls, which never ask the queue.
    tokio::time::sleep(Duration::from_millis(3)).await;
    assert!(!run.is_finished(), "the runner waits for the log");
    h.create_log(job.execution_id).await;
    assert_eq!(run.await.unwrap(), RunOutcome::Finished);
    assert_eq!(a.calls(), 1);
    assert_eq!(asked.load(SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_job_whose_log_never_comes_frees_its_slot_long_before_the_log_wait() {
    let (a, h) = succeeding_a();
    let job = job(&text_request(""), LONG);
    let handle = Handed::withdrawable(Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let waited = tokio::time::Instant::now();
    assert_eq!(
        h.runner.run_delivery(&job, 1, Some(&handle)).await,
        RunOutcome::Dropped
    );
    // Asked after the quick polls (about 10 ms of paused time), not at the end of the 10 s.
    assert!(
        waited.elapsed() < Duration::from_secs(1),
        "{:?}",
        waited.elapsed()
    );
    assert!(h.store.state(job.execution_id).await.unwrap().is_none());
    assert_eq!(a.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_job_is_never_claimed_when_its_log_appears_late() {
    let (a, h, job, outcome) = run_before_the_log(true).await;
    assert_eq!(outcome, RunOutcome::Dropped);
    assert_eq!(a.calls(), 0);
    // Closed by the submitter: the worker wrote nothing.
    assert_eq!(
        type_names(&h.events(job.execution_id).await),
        ["execution.accepted", "execution.failed"]
    );
}

/// Provider `a` succeeding, its runner reading log heads through a [`SlowReadsStore`] whose
/// next `failures` reads time out.
fn slow_reads_a(failures: u32) -> (Arc<ScriptedProvider>, Harness, Arc<SlowReadsStore>) {
    let a = ScriptedProvider::succeeding("a");
    let (h, slow) = over_wrapped_store(&a, |store| SlowReadsStore::new(store, failures));
    (a, h, slow)
}

/// A harness with provider `a` whose runner goes through the store `wrap` makes around a
/// memory store (the harness reads that memory store directly).
fn over_wrapped_store<S: EventStore>(
    a: &Arc<ScriptedProvider>,
    wrap: impl FnOnce(Arc<runtime::memory::MemoryEventStore>) -> Arc<S>,
) -> (Harness, Arc<S>) {
    let store = Arc::new(runtime::memory::MemoryEventStore::new(
        MemoryLimits::default(),
    ));
    let wrapped = wrap(Arc::clone(&store));
    let h = Harness::with_store(
        with_default_limits(&[a]),
        Arc::clone(&wrapped) as Arc<dyn EventStore>,
        store,
        RunnerSettings::default(),
    );
    (h, wrapped)
}

// Paused time. A read that times out on a busy store once left the job to the lease's lapse
// (30 s on JetStream) before anyone ran it.
#[tokio::test(start_paused = true)]
async fn a_log_read_that_times_out_is_retried_and_the_job_runs_in_this_delivery() {
    let (a, h, slow) = slow_reads_a(3);
    let job = h.submit(&text_request(""), LONG).await;
    let handle = Handed::default();
    let started = tokio::time::Instant::now();
    assert_eq!(
        h.runner.run_delivery(&job, 1, Some(&handle)).await,
        RunOutcome::Finished
    );
    assert_eq!(slow.failures_left(), 0);
    assert_eq!(a.calls(), 1);
    // Three timed-out reads and the pauses between them, not a lease.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        type_names(&h.events(job.execution_id).await).last(),
        Some(&"execution.completed")
    );
}

#[tokio::test(start_paused = true)]
async fn a_delivery_whose_reads_keep_failing_hands_its_job_back_after_the_log_wait() {
    let (a, h, _slow) = slow_reads_a(u32::MAX);
    let job = h.submit(&text_request(""), LONG).await;
    let handle = Handed::default();
    let started = tokio::time::Instant::now();
    assert_eq!(
        h.runner.run_delivery(&job, 1, Some(&handle)).await,
        RunOutcome::Unclaimed
    );
    assert!(started.elapsed() >= RunnerSettings::default().log_wait);
    assert_eq!(a.calls(), 0);
    // Nothing written: the next delivery starts from `execution.accepted`.
    assert_eq!(
        type_names(&h.events(job.execution_id).await),
        ["execution.accepted"]
    );
}

/// Acknowledgements and hand-backs of a [`Wrapping`] queue's deliveries, counted.
#[derive(Default)]
struct HandBacks {
    acks: AtomicUsize,
    releases: AtomicUsize,
}

#[async_trait::async_trait]
impl runtime::DeliveryHandle for Wrapped<HandBacks> {
    async fn ack(&self) -> Result<(), StoreError> {
        self.state.acks.fetch_add(1, SeqCst);
        self.inner.ack().await
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        self.inner.in_progress().await
    }
    async fn release(&self) -> Result<(), StoreError> {
        self.state.releases.fetch_add(1, SeqCst);
        self.inner.release().await
    }
}

#[tokio::test(start_paused = true)]
async fn the_pool_hands_back_a_job_its_delivery_could_not_claim() {
    let (a, h, _slow) = slow_reads_a(u32::MAX);
    let queue = Wrapping::new(HandBacks::default());
    let pool = spawn_pool_on(
        &h,
        Arc::clone(&queue) as Arc<dyn JobQueue>,
        2,
        Duration::from_secs(1),
    );
    let job = h.submit(&text_request(""), LONG).await;
    queue.publish(&job).await.unwrap();
    wait_until("the job was handed back", Duration::from_secs(60), || {
        let released = queue.state.releases.load(SeqCst) > 0;
        async move { released }
    })
    .await;
    assert_eq!(
        queue.state.acks.load(SeqCst),
        0,
        "an unclaimed job is not acknowledged"
    );
    assert_eq!(a.calls(), 0);
    assert!(pool.shutdown(Duration::from_secs(1)).await);
}

#[tokio::test]
async fn a_gateway_cancel_of_a_queued_execution_fences_the_runner() {
    let (a, h, job) = succeeding_a_with_job().await;
    h.append_foreign(job.execution_id, failed(RuntimeError::cancelled()))
        .await;

    let events = assert_fenced_by_a_cancel(&h, &a, &job).await;
    assert_eq!(events[1].status, ExecutionStatus::Cancelled);
}

#[tokio::test]
async fn a_gateway_cancel_that_wins_the_race_for_sequence_two_fences_the_runner() {
    // The runner has read the log (only `accepted`) but the gateway's cancel appends sequence 2
    // first: the runner's route.selected loses the compare-and-set.
    let (a, h) = interposed_a(
        "route.selected",
        Interference::Foreign(failed(RuntimeError::cancelled())),
        false,
    );
    let job = h.submit(&text_request(""), LONG).await;

    assert_fenced_by_a_cancel(&h, &a, &job).await;
}

#[tokio::test]
async fn a_writer_fenced_mid_attempt_stops_writing() {
    // Another writer closes the log while the attempt streams: the runner's next append is
    // fenced, the adapter is told to stop, and nothing more is written.
    let a = ScriptedProvider::succeeding("a");
    let b = ScriptedProvider::succeeding("b");
    let h = Harness::interposed(
        &[&a, &b],
        "output.delta",
        Interference::Foreign(failed(interrupted_error())),
        false,
    );
    let job = h.submit(&text_request(FALLBACK), LONG).await;

    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);

    assert_a_failed(&h, job.execution_id, &[], interrupted_error()).await;
    assert_eq!((a.calls(), a.finished(), b.calls()), (1, 1, 0));
}

/// Provider `a` streams "hel", then waits for the returned semaphore, then emits `after`
/// and succeeds; its runner writes through a [`PartitionedStore`] (paused time).
fn partitioned_a(after: Vec<Step>) -> (Harness, Arc<PartitionedStore>, Arc<Semaphore>) {
    let release = Arc::new(Semaphore::new(0));
    let mut script = vec![emit_delta("hel"), Step::Hold(Arc::clone(&release))];
    script.extend(after);
    let a = ScriptedProvider::new("a", script);
    let (h, partitioned) = over_wrapped_store(&a, PartitionedStore::new);
    (h, partitioned, release)
}

/// Runs a job of [`partitioned_a`] (`after` the hold); once "hel" is stored the link is cut
/// for `cut` and the provider released. Returns the harness, its store, the job and the
/// run's outcome.
async fn across_a_cut(
    after: Vec<Step>,
    cut: Duration,
) -> (Harness, Arc<PartitionedStore>, runtime::Job, RunOutcome) {
    let (h, store, release) = partitioned_a(after);
    let job = h.submit(&text_request(""), LONG).await;
    let id = job.execution_id;
    let outcome = {
        let run = h.runner.run(&job, 1);
        tokio::pin!(run);
        loop {
            tokio::select! {
                outcome = &mut run => panic!("ended before the cut: {outcome:?}"),
                () = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            if h.has_event(id, "output.delta").await {
                break;
            }
        }
        store.cut(cut);
        release.add_permits(1);
        run.await
    };
    (h, store, job, outcome)
}

#[tokio::test(start_paused = true)]
async fn writes_that_landed_after_the_worker_gave_up_are_continued_not_taken_for_a_fence() {
    // The issue's stuck executions: the worker lost the event store for longer than its append
    // retries; its `usage.reported` (or its terminal event) landed after it had given up. The
    // log must still be closed, after that event, by the worker itself (before: its terminal
    // append met its own late write, was taken for another writer's, the job was acknowledged
    // and dropped, and the log stayed open until the deadline).
    for (after, landed) in [
        (
            vec![Step::Emit(ProviderEvent::Usage(mock_usage_facts(1)))],
            vec![usage(1)],
        ),
        (Vec::new(), Vec::new()),
    ] {
        let (h, _, job, outcome) = across_a_cut(after, Duration::from_secs(40)).await;
        assert_eq!(outcome, RunOutcome::Finished);
        let mut expected = vec![EventBody::Accepted, selected("a", 1), delta("hel")];
        expected.extend(landed);
        expected.push(completed("a"));
        h.assert_log(job.execution_id, &expected).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_cut_longer_than_every_retry_leaves_the_job_to_a_later_delivery() {
    // Past both retry budgets the runner gives the job back unacknowledged; the redelivery
    // after the heal closes the log (here: the same runner, a second delivery).
    let (h, _, job, outcome) = across_a_cut(Vec::new(), Duration::from_secs(600)).await;
    assert_eq!(outcome, RunOutcome::Abandoned);
    assert!(!h.is_terminal(job.execution_id).await);
}

// ---------------------------------------------------------------------------------------------
// Store limits and failures [R 47-48, 84]

#[tokio::test]
async fn the_per_execution_event_limit_ends_the_execution() {
    let (h, job, limit_error) = run_into_the_event_limit(false).await;
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.status, ExecutionStatus::Failed);
    assert_eq!(snapshot.error, Some(limit_error));
}

#[tokio::test]
async fn the_event_limit_during_routing_ends_the_execution() {
    // Limit reached by route.attempt_failed: the execution still gets its one terminal event.
    let a = ScriptedProvider::failing("a");
    let b = ScriptedProvider::succeeding("b");
    let h = Harness::event_limited(&[&a, &b], 2);
    let job = run_to_end(&h, &text_request(FALLBACK)).await;
    assert_types(&h, job.execution_id, &FAILED_AT_ROUTING).await;
    let error = h.snapshot(job.execution_id).await.error.unwrap();
    assert_eq!((error.code, error.retryable), (ErrorCode::QueueFull, false));
    assert_eq!(b.calls(), 0);
}

#[tokio::test]
async fn a_store_failure_during_the_attempt_fails_the_execution() {
    // Unavailable is retried by the writer, so the append lands on the second try.
    let (_, h) = interposed_a(
        "output.delta",
        Interference::Fail(StoreError::Unavailable("disk on fire".into())),
        false,
    );
    let job = run_to_end(&h, &text_request("")).await;
    h.assert_log(job.execution_id, &success_log("a")).await;

    // A refusal that is not transient ends the execution with internal_error.
    let (a, h) = interposed_a(
        "output.delta",
        Interference::Fail(StoreError::NotFound),
        false,
    );
    let job = run_to_end(&h, &text_request("")).await;
    assert_a_failed(
        &h,
        job.execution_id,
        &[],
        not_retryable(ErrorCode::InternalError, "Execution event storage failed"),
    )
    .await;
    assert_eq!(a.finished(), 1);
}

#[tokio::test]
async fn a_terminal_the_store_refuses_abandons_the_delivery_for_redelivery() {
    let (a, h) = interposed_a("never", Interference::Fail(StoreError::NotFound), true);
    let job = h.submit(&text_request(""), LONG).await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Abandoned);
    let events = h.events(job.execution_id).await;
    assert_eq!(events.len(), 6, "everything but the terminal event");
    assert!(!h.is_terminal(job.execution_id).await);

    // The redelivery (on a healthy store) closes the log without calling the provider again.
    let healthy = Harness::with_store(
        with_default_limits(&[&a]),
        Arc::clone(&h.store) as Arc<dyn EventStore>,
        Arc::clone(&h.store),
        RunnerSettings::default(),
    );
    assert_eq!(healthy.runner.run(&job, 2).await, RunOutcome::Finished);
    let mut expected = success_log("a");
    expected.pop();
    expected.push(failed(interrupted_error()));
    healthy.assert_log(job.execution_id, &expected).await;
    assert_eq!(a.calls(), 1);
}

// ---------------------------------------------------------------------------------------------
// The pool

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_runs_every_published_job() {
    let mut script = vec![Step::Sleep(Duration::from_millis(2))];
    script.extend(success_script());
    let a = ScriptedProvider::new("a", script);
    let h = Harness::scripted(&[&a]);
    let (queue, pool) = spawn_pool(&h, 4, Duration::from_millis(50));

    let ids = h.run_texts(&*queue, 50, Duration::from_secs(60)).await;

    for id in &ids {
        h.assert_log(*id, &success_log("a")).await;
    }
    assert_eq!(a.calls(), 50);
    assert!(
        a.max_in_flight() <= 4,
        "at most `concurrency` executions run at once"
    );
    assert!(
        within("shutdown", PATIENCE, pool.shutdown(Duration::from_secs(10))).await,
        "nothing was running"
    );
    assert_eq!(h.bus.watched(), 0);
    assert_eq!(h.store.active(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_drops_jobs_whose_log_is_already_terminal() {
    let (a, h) = succeeding_a();
    let (queue, pool) = spawn_pool(&h, 2, Duration::from_secs(10));
    let cancelled = h.submit(&text_request(""), LONG).await;
    h.append_foreign(cancelled.execution_id, failed(RuntimeError::cancelled()))
        .await;
    let normal = h.submit(&text_request(""), LONG).await;
    queue.publish(&cancelled).await.unwrap();
    queue.publish(&normal).await.unwrap();

    wait_until("the normal job finishes", PATIENCE, || {
        h.is_terminal(normal.execution_id)
    })
    .await;
    h.assert_log(normal.execution_id, &success_log("a")).await;
    assert!(within("shutdown", PATIENCE, pool.shutdown(Duration::from_secs(10))).await);
    h.assert_log(
        cancelled.execution_id,
        &[EventBody::Accepted, failed(RuntimeError::cancelled())],
    )
    .await;
    assert_eq!(a.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_what_outlives_the_grace_period() {
    // One execution runs (hanging), one waits in the provider's queue. After the grace period
    // both end `cancelled`, and shutdown reports that not everything finished.
    let a = ScriptedProvider::hanging("a");
    let h = patient(&[(&a, limits(1, 8))]);
    let (queue, pool) = spawn_pool(&h, 2, Duration::from_millis(20));
    let running = h.submit(&text_request(""), LONG).await;
    let queued = h.submit(&text_request(""), LONG).await;
    let gate = &h.registry.candidates(&running.request)[0].entry.gate;
    queue.publish(&running).await.unwrap();
    wait_until("the first execution runs", PATIENCE, || async {
        a.calls() == 1
    })
    .await;
    queue.publish(&queued).await.unwrap();
    wait_until("the second waits for the provider", PATIENCE, || async {
        gate.queued() == 1
    })
    .await;
    assert_eq!(pool.running(), 2);

    let finished_in_time = within(
        "shutdown",
        PATIENCE,
        pool.shutdown(Duration::from_millis(100)),
    )
    .await;
    assert!(!finished_in_time);

    for id in [running.execution_id, queued.execution_id] {
        assert_a_failed(&h, id, &[], RuntimeError::cancelled()).await;
        assert_eq!(h.snapshot(id).await.status, ExecutionStatus::Cancelled);
    }
    assert_eq!(a.calls(), 1);
    assert_eq!(h.bus.watched(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_executions_finish_within_the_grace_period() {
    let (a, release) = held_then_succeeding("a");
    let h = Harness::scripted(&[&a]);
    let (queue, pool) = spawn_pool(&h, 1, Duration::from_millis(20));
    let first = h.submit(&text_request(""), LONG).await;
    queue.publish(&first).await.unwrap();
    wait_until("the execution runs", PATIENCE, || async { a.calls() == 1 }).await;

    // Best effort only: release the attempt shortly after shutdown began. If the machine is
    // slow and the release comes first, the test still holds.
    let releaser = {
        let release = Arc::clone(&release);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            release.add_permits(1);
        })
    };
    assert!(within("shutdown", PATIENCE * 2, pool.shutdown(PATIENCE)).await);
    releaser.await.unwrap();
    h.assert_log(first.execution_id, &success_log("a")).await;
    assert_eq!(a.calls(), 1);
}

// ---------------------------------------------------------------------------------------------
// Pipelined writes (the runner's path against JetStream): the same logs as inline writes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_produce_the_reference_log() {
    let h = mock_harness().pipelined();
    let job = run_to_end(&h, &text_request("")).await;
    // The terminal event is acknowledged before the run returns (the job is acked after it).
    assert!(h.is_terminal(job.execution_id).await);
    h.assert_log(job.execution_id, &mock_reference_log()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_end_at_the_event_limit_like_inline_writes() {
    // The deltas are queued faster than they are stored; the run that crosses the limit stores
    // what fits, and the log is closed right after it with the limit failure.
    run_into_the_event_limit(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_writer_fenced_while_the_provider_is_quiet_stops_the_attempt() {
    // Another writer closes the log while the first delta is in flight; the provider then goes
    // quiet for longer than the test may take. The appender's failure reaches the runner
    // without another event: the attempt is cancelled and nothing more is written.
    let a = ScriptedProvider::new(
        "a",
        vec![emit_delta("one"), Step::Sleep(Duration::from_secs(600))],
    );
    let h = Harness::interposed(
        &[&a],
        "output.delta",
        Interference::Foreign(failed(interrupted_error())),
        false,
    )
    .pipelined();
    let job = h.submit(&text_request(""), LONG).await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), h.runner.run(&job, 1))
        .await
        .expect("the fenced runner stops without waiting for the provider");
    assert_eq!(outcome, RunOutcome::Dropped);
    assert_a_failed(&h, job.execution_id, &[], interrupted_error()).await;
    assert_eq!((a.calls(), a.finished()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_execution_past_its_deadline_is_closed_after_its_output() {
    let a = ScriptedProvider::new(
        "a",
        vec![
            emit_delta("one"),
            emit_delta("two"),
            Step::Sleep(Duration::from_secs(600)),
        ],
    );
    let h = Harness::scripted(&[&a]).pipelined();
    let job = h
        .submit(&text_request(""), Duration::from_millis(500))
        .await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);
    assert_a_failed(
        &h,
        job.execution_id,
        &[delta("one"), delta("two")],
        RuntimeError::deadline_exceeded(),
    )
    .await;
}

/// A pool of `slots` over `queue`, and two jobs for plain text requests, their logs created,
/// published to it.
async fn two_jobs_on(
    h: &Harness,
    queue: Arc<dyn JobQueue>,
    slots: usize,
) -> (WorkerPool, runtime::Job, runtime::Job) {
    let pool = spawn_pool_on(h, Arc::clone(&queue), slots, Duration::from_secs(10));
    let first = h.submit(&text_request(""), LONG).await;
    let second = h.submit(&text_request(""), LONG).await;
    queue.publish(&first).await.unwrap();
    queue.publish(&second).await.unwrap();
    (pool, first, second)
}

/// A memory queue whose batch request holds its second job until `gate` opens: a request the
/// pool has taken one delivery from while the next is still on its way.
struct SecondHeld {
    inner: Arc<MemoryJobQueue>,
    gate: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl runtime::intercept::QueueIntercept for SecondHeld {
    fn inner(&self) -> &dyn JobQueue {
        &*self.inner
    }
    async fn receive_up_to(&self, max: usize) -> Result<Option<runtime::Deliveries>, StoreError> {
        use futures_util::StreamExt;
        assert!(max >= 2, "two free slots");
        let (Some(first), Some(second)) =
            (self.inner.receive().await?, self.inner.receive().await?)
        else {
            return Ok(None);
        };
        let gate = Arc::clone(&self.gate);
        let second = futures_util::stream::once(async move {
            gate.notified().await;
            Ok(second)
        });
        Ok(Some(
            futures_util::stream::iter([Ok(first)])
                .chain(second)
                .boxed(),
        ))
    }
}

// One thread: opening the gate and stopping the pool happen in one poll of the test, so the
// pool sees both at once (the case where a stop finds a delivered job not yet started).
#[tokio::test(flavor = "current_thread")]
async fn shutdown_still_runs_the_jobs_a_request_already_delivered() {
    let (a, h) = succeeding_a();
    let gate = Arc::new(tokio::sync::Notify::new());
    let queue = Arc::new(SecondHeld {
        inner: Arc::new(MemoryJobQueue::new()),
        gate: Arc::clone(&gate),
    });
    let (pool, first, second) = two_jobs_on(&h, Arc::clone(&queue) as Arc<dyn JobQueue>, 2).await;
    wait_until("the first job ran", PATIENCE, || {
        h.is_terminal(first.execution_id)
    })
    .await;

    gate.notify_one();
    assert!(within("shutdown", PATIENCE, pool.shutdown(PATIENCE)).await);
    h.assert_log(second.execution_id, &success_log("a")).await;
    assert_eq!(a.calls(), 2);
}

/// A delivery's handle wrapped with the state the test shares with it (what a [`Wrapping`]
/// queue hands out); each kind of state gives the handle its behaviour.
struct Wrapped<S> {
    inner: Box<dyn runtime::DeliveryHandle>,
    state: Arc<S>,
}

/// A memory queue whose deliveries' handles are [`Wrapped`] with `state`.
struct Wrapping<S> {
    inner: Arc<MemoryJobQueue>,
    state: Arc<S>,
}

impl<S> Wrapping<S> {
    fn new(state: S) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(MemoryJobQueue::new()),
            state: Arc::new(state),
        })
    }
}

#[async_trait::async_trait]
impl<S: Send + Sync + 'static> runtime::intercept::QueueIntercept for Wrapping<S>
where
    Wrapped<S>: runtime::DeliveryHandle,
{
    fn inner(&self) -> &dyn JobQueue {
        &*self.inner
    }
    async fn receive(&self) -> Result<Option<runtime::Delivery>, StoreError> {
        let Some(delivery) = self.inner.receive().await? else {
            return Ok(None);
        };
        let state = Arc::clone(&self.state);
        Ok(Some(runtime::Delivery {
            handle: Box::new(Wrapped {
                inner: delivery.handle,
                state,
            }),
            ..delivery
        }))
    }
}

/// Acknowledgements that wait until `gate` opens (a slow ack round trip), counting those
/// that completed.
struct AckGate {
    gate: Semaphore,
    acked: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl runtime::DeliveryHandle for Wrapped<AckGate> {
    async fn ack(&self) -> Result<(), StoreError> {
        self.state.gate.acquire().await.unwrap().forget();
        self.state
            .acked
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.ack().await
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        self.inner.in_progress().await
    }
}

#[tokio::test]
async fn a_slot_is_free_for_the_next_job_while_the_last_one_is_still_being_acknowledged() {
    let (a, h) = succeeding_a();
    let closed = AckGate {
        gate: Semaphore::new(0),
        acked: std::sync::atomic::AtomicUsize::new(0),
    };
    let queue = Wrapping::new(closed);
    let acked = || queue.state.acked.load(std::sync::atomic::Ordering::SeqCst);
    // One slot.
    let (pool, first, second) = two_jobs_on(&h, Arc::clone(&queue) as Arc<dyn JobQueue>, 1).await;
    // The first job's ack hangs; its ended execution no longer holds the only slot.
    wait_until("the second job ran", PATIENCE, || {
        h.is_terminal(second.execution_id)
    })
    .await;
    assert_eq!(acked(), 0);
    // Shutdown still waits for the acks of both.
    queue.state.gate.add_permits(2);
    assert!(within("shutdown", PATIENCE, pool.shutdown(PATIENCE)).await);
    assert_eq!(acked(), 2);
    h.assert_log(first.execution_id, &success_log("a")).await;
    h.assert_log(second.execution_id, &success_log("a")).await;
    assert_eq!(a.calls(), 2);
}

/// Heartbeats that each take `send` to go out (a congested connection), recording when each
/// started, of deliveries received at `received_at`.
struct BeatLog {
    send: Duration,
    received_at: Option<tokio::time::Instant>,
    beats: std::sync::Mutex<Vec<tokio::time::Instant>>,
}

#[async_trait::async_trait]
impl runtime::DeliveryHandle for Wrapped<BeatLog> {
    async fn ack(&self) -> Result<(), StoreError> {
        self.inner.ack().await
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        self.state
            .beats
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        tokio::time::sleep(self.state.send).await;
        self.inner.in_progress().await
    }
    fn received_at(&self) -> Option<tokio::time::Instant> {
        self.state.received_at
    }
}

/// Runs one job (a provider that takes `runs`, then succeeds) through a one-slot pool with a
/// 300 ms heartbeat, over deliveries whose beats `log` shapes; returns when each beat started.
async fn beats_of_one_run(runs: Duration, log: BeatLog) -> Vec<tokio::time::Instant> {
    let mut script = vec![Step::Sleep(runs)];
    script.extend(success_script());
    let a = ScriptedProvider::new("a", script);
    let h = Harness::scripted(&[&a]);
    let queue = Wrapping::new(log);
    let pool = spawn_pool_on(
        &h,
        Arc::clone(&queue) as Arc<dyn JobQueue>,
        1,
        Duration::from_millis(300),
    );
    let job = h.submit(&text_request(""), LONG).await;
    queue.publish(&job).await.unwrap();
    wait_until("the execution ended", PATIENCE, || {
        h.is_terminal(job.execution_id)
    })
    .await;
    assert!(within("shutdown", PATIENCE, pool.shutdown(PATIENCE)).await);
    h.assert_log(job.execution_id, &success_log("a")).await;
    queue.state.beats.lock().unwrap().clone()
}

/// Beats keep their cadence when sending one is slow: the next is timed from when the last
/// started, so the lease (three beats) never lapses for a live execution because its beats
/// went out slowly. (Timed from when the send returned, the beats here were 500 ms apart.)
/// Paused time: the clock moves only when every task waits, so the gaps are exact.
#[tokio::test(start_paused = true)]
async fn heartbeats_keep_their_cadence_when_sending_one_is_slow() {
    let log = BeatLog {
        send: Duration::from_millis(200),
        received_at: None,
        beats: std::sync::Mutex::default(),
    };
    let beats = beats_of_one_run(Duration::from_secs(3), log).await;
    assert!(beats.len() >= 5, "{} beats in 3 s", beats.len());
    for pair in beats.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap <= Duration::from_millis(310),
            "beats {gap:?} apart, heartbeat 300 ms"
        );
    }
}

/// The first beat is due a beat after the delivery was received, not after the job started:
/// the lease runs from the reception, and decoding the job (or those before it) may have
/// taken part of it. Here the job starts 250 ms after its reception, with a 300 ms heartbeat:
/// the first beat goes out 50 ms after the start (timed from the start, it went out 300 ms
/// after it, 550 ms after the reception). Paused time, so the times are exact.
#[tokio::test(start_paused = true)]
async fn the_first_heartbeat_is_timed_from_when_the_delivery_was_received() {
    let started = tokio::time::Instant::now();
    let log = BeatLog {
        send: Duration::ZERO,
        received_at: Some(started - Duration::from_millis(250)),
        beats: std::sync::Mutex::default(),
    };
    let beats = beats_of_one_run(Duration::from_secs(1), log).await;
    let first = *beats.first().expect("a beat in 1 s") - started;
    assert_eq!(
        first,
        Duration::from_millis(50),
        "first beat {first:?} after the start"
    );
}

/// The key claim of `job` under `key_hash` (see `runtime::KeyClaim`).
fn keyed(mut job: runtime::Job, key_hash: &str) -> runtime::Job {
    job.key = Some(runtime::KeyClaim {
        key_hash: key_hash.into(),
        record: runtime::IdempotencyRecord {
            fingerprint: "f".into(),
            execution_id: job.execution_id,
            created_at: job.accepted_at,
        },
    });
    job
}

/// A keyed job whose key is free or already bound to its own execution runs, and leaves the
/// key bound to it: the worker's claim is the same as the gateway's, whichever lands first.
#[tokio::test]
async fn a_keyed_job_runs_when_its_key_is_free_or_its_own() {
    let (a, h) = succeeding_a();
    let free = keyed(h.submit(&text_request(""), LONG).await, "key-free");
    assert_eq!(h.runner.run(&free, 1).await, RunOutcome::Finished);
    let claim = free.key.as_ref().unwrap();
    let bound = h.keys.claim("key-free", &claim.record).await.unwrap();
    assert_eq!(
        bound.map(|r| r.execution_id),
        Some(free.execution_id),
        "the worker bound the free key to its execution"
    );

    let own = keyed(h.submit(&text_request(""), LONG).await, "key-own");
    let own_claim = own.key.as_ref().unwrap();
    assert_eq!(
        h.keys.claim("key-own", &own_claim.record).await.unwrap(),
        None
    );
    assert_eq!(h.runner.run(&own, 1).await, RunOutcome::Finished);
    assert_eq!(a.calls(), 2);
    assert_eq!(
        h.state(own.execution_id).await.status(),
        ExecutionStatus::Succeeded
    );
}

/// A keyed job whose key is bound to another execution (its submission was a retry of that
/// one) never runs: its log is closed unrouted with the unqueued failure and the job dropped.
/// A log the gateway closed first is left as it is. The same with a pipelined writer, as
/// against JetStream.
#[tokio::test]
async fn a_keyed_job_whose_key_is_anothers_never_runs() {
    for pipelined in [false, true] {
        let (a, h) = succeeding_a();
        let h = if pipelined { h.pipelined() } else { h };
        a_job_whose_key_is_anothers_never_runs(&a, &h).await;
    }
}

async fn a_job_whose_key_is_anothers_never_runs(a: &ScriptedProvider, h: &Harness) {
    let first = keyed(h.submit(&text_request(""), LONG).await, "key-taken");
    assert_eq!(
        h.keys
            .claim("key-taken", &first.key.as_ref().unwrap().record)
            .await
            .unwrap(),
        None
    );
    let retry = keyed(h.submit(&text_request(""), LONG).await, "key-taken");
    assert_eq!(h.runner.run(&retry, 1).await, RunOutcome::Dropped);
    assert_failed_unrouted(h, retry.execution_id, RuntimeError::unqueued()).await;

    let closed_first = keyed(h.submit(&text_request(""), LONG).await, "key-taken");
    h.append_foreign(
        closed_first.execution_id,
        EventBody::Failed {
            error: RuntimeError::unqueued(),
        },
    )
    .await;
    assert_eq!(h.runner.run(&closed_first, 1).await, RunOutcome::Dropped);
    assert_eq!(h.events(closed_first.execution_id).await.len(), 2);
    assert_eq!(a.calls(), 0, "no provider call");
}

/// The memory key store of the key tests. It counts claims and reads of bindings and notes
/// whether the log of `watched` existed when a binding was first read. With `close_with`, a
/// claim is followed at once by the execution's log closed with that error: a gateway giving
/// the submission up (or a cancellation) landing between the worker's claim of the key and its
/// claim of the log. With `unreachable`, every call fails: a key store out of reach.
struct TestKeys {
    inner: runtime::memory::MemoryIdempotencyStore,
    log: Arc<runtime::memory::MemoryEventStore>,
    watched: Option<ExecutionId>,
    close_with: Option<RuntimeError>,
    unreachable: bool,
    claims: AtomicUsize,
    reads: AtomicUsize,
    read_before_the_log: AtomicBool,
}

impl TestKeys {
    /// `h` with a [`TestKeys`] store that `setup` configures; returns the store too.
    fn install(h: Harness, setup: impl FnOnce(&mut Self)) -> (Harness, Arc<Self>) {
        let mut keys = Self {
            inner: runtime::memory::MemoryIdempotencyStore::new(Duration::from_secs(600)),
            log: Arc::clone(&h.store),
            watched: None,
            close_with: None,
            unreachable: false,
            claims: Default::default(),
            reads: Default::default(),
            read_before_the_log: Default::default(),
        };
        setup(&mut keys);
        let keys = Arc::new(keys);
        (h.with_keys(keys.clone()), keys)
    }

    /// The memory store, while the key store is reachable.
    fn store(&self) -> Result<&runtime::memory::MemoryIdempotencyStore, StoreError> {
        if self.unreachable {
            return Err(StoreError::Unavailable("keys down".into()));
        }
        Ok(&self.inner)
    }

    fn claims(&self) -> usize {
        self.claims.load(SeqCst)
    }

    fn reads(&self) -> usize {
        self.reads.load(SeqCst)
    }

    fn assert_read_once_never_claimed(&self) {
        assert_eq!(
            (self.reads(), self.claims()),
            (1, 0),
            "read once, never claimed"
        );
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for TestKeys {
    async fn claim(
        &self,
        key_hash: &str,
        record: &runtime::IdempotencyRecord,
    ) -> Result<Option<runtime::IdempotencyRecord>, StoreError> {
        let store = self.store()?;
        self.claims.fetch_add(1, SeqCst);
        let claimed = store.claim(key_hash, record).await?;
        if let Some(error) = &self.close_with {
            let closed = RuntimeEvent::new(
                record.execution_id,
                protocol::Sequence(2),
                Timestamp::now(),
                EventBody::Failed {
                    error: error.clone(),
                },
            );
            self.log.append(closed).await?;
        }
        Ok(claimed)
    }
    async fn bound(
        &self,
        key_hash: &str,
    ) -> Result<Option<runtime::IdempotencyRecord>, StoreError> {
        let store = self.store()?;
        let first = self.reads.fetch_add(1, SeqCst) == 0;
        if let (true, Some(watched)) = (first, self.watched)
            && self.log.head(watched).await?.is_none()
        {
            self.read_before_the_log.store(true, SeqCst);
        }
        store.bound(key_hash).await
    }
    async fn release(&self, key_hash: &str, id: ExecutionId) -> Result<(), StoreError> {
        self.store()?.release(key_hash, id).await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.store().map(|_| ())
    }
}

/// Provider `a` (succeeding) in a harness whose [`TestKeys`] watch `job`, keyed with
/// `key_hash`: submitted (its log created) when `logged`.
async fn keyed_and_counted(
    key_hash: &str,
    logged: bool,
) -> (Arc<ScriptedProvider>, Harness, runtime::Job, Arc<TestKeys>) {
    let (a, h) = succeeding_a();
    let job = if logged {
        h.submit(&text_request(""), LONG).await
    } else {
        job(&text_request(""), LONG)
    };
    let job = keyed(job, key_hash);
    let (h, keys) = TestKeys::install(h, |k| k.watched = Some(job.execution_id));
    (a, h, job, keys)
}

/// A keyed job whose key cannot be claimed (the key store is out of reach) is retried for the
/// claim's budget (tries until a second before it ends, at most a second apart), then handed
/// back for the next delivery: not run, its log untouched.
#[tokio::test(start_paused = true)]
async fn a_keyed_job_whose_key_cannot_be_claimed_is_left_unrun() {
    let (a, h) = succeeding_a();
    let (h, _) = TestKeys::install(h, |k| k.unreachable = true);
    let job = keyed(h.submit(&text_request(""), LONG).await, "key-unreachable");
    let started = tokio::time::Instant::now();
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Unclaimed);
    let budget = worker::key_guard::KEY_CLAIM_BUDGET;
    let tried = started.elapsed();
    assert!(
        tried + Duration::from_secs(1) >= budget && tried <= budget,
        "gave up after {tried:?}"
    );
    assert_eq!(
        h.events(job.execution_id).await.len(),
        1,
        "the log is untouched"
    );
    assert_eq!(a.calls(), 0);
}

/// A keyed job whose key cannot be claimed is dropped as soon as its log is found closed (the
/// gateway, out of the key store's reach too, closes the log of the submission it answers
/// 503), instead of holding its slot for the whole retry budget.
#[tokio::test(start_paused = true)]
async fn a_keyed_job_whose_key_cannot_be_claimed_is_dropped_once_its_log_is_closed() {
    let (a, h) = succeeding_a();
    let h = Arc::new(TestKeys::install(h, |k| k.unreachable = true).0);
    let job = keyed(h.submit(&text_request(""), LONG).await, "key-unreachable");
    let started = tokio::time::Instant::now();
    let run = {
        let (h, job) = (Arc::clone(&h), job.clone());
        tokio::spawn(async move { h.runner.run(&job, 1).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.append_foreign(
        job.execution_id,
        EventBody::Failed {
            error: RuntimeError::unqueued(),
        },
    )
    .await;
    assert_eq!(run.await.unwrap(), RunOutcome::Dropped);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(h.events(job.execution_id).await.len(), 2);
    assert_eq!(a.calls(), 0);
}

/// A worker that bound a free key and then finds the log closed unrun by its gateway (the
/// submission was answered 503 meanwhile) frees the key, so a retry can create the execution;
/// a log closed by a cancellation keeps its key, so a retry replays the cancelled execution.
#[tokio::test]
async fn a_key_bound_for_an_execution_given_up_unrun_is_freed_again() {
    for (close_with, freed) in [
        (RuntimeError::unqueued(), true),
        (RuntimeError::cancelled(), false),
    ] {
        let (a, h) = succeeding_a();
        let (h, keys) = TestKeys::install(h, |k| k.close_with = Some(close_with.clone()));
        let job = keyed(h.submit(&text_request(""), LONG).await, "key-given-up");
        assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);
        assert_eq!(a.calls(), 0);
        let mut retry = job.key.clone().unwrap().record;
        retry.execution_id = ExecutionId::new_random();
        let bound = keys.inner.claim("key-given-up", &retry).await.unwrap();
        if freed {
            assert_eq!(bound, None, "the key is free for a retry ({close_with:?})");
        } else {
            assert_eq!(
                bound.map(|r| r.execution_id),
                Some(job.execution_id),
                "the key still names the cancelled execution"
            );
        }
    }
}

/// A keyed job whose key its gateway bound already (to this execution, or to another one) is
/// decided by reading the binding: the worker claims only a key it finds free.
#[tokio::test]
async fn a_key_found_bound_is_read_not_claimed_again() {
    // Bound by the gateway to this execution: it runs.
    let (a, h, job, keys) = keyed_and_counted("key-bound", true).await;
    let record = &job.key.as_ref().unwrap().record;
    assert_eq!(keys.inner.claim("key-bound", record).await.unwrap(), None);
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);
    assert_eq!(a.calls(), 1);
    keys.assert_read_once_never_claimed();

    // Bound to another execution: never runs.
    let (a, h, job, keys) = keyed_and_counted("key-taken", true).await;
    let mut other = job.key.as_ref().unwrap().record.clone();
    other.execution_id = ExecutionId::new_random();
    assert_eq!(keys.inner.claim("key-taken", &other).await.unwrap(), None);
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);
    assert_failed_unrouted(&h, job.execution_id, RuntimeError::unqueued()).await;
    assert_eq!(a.calls(), 0);
    keys.assert_read_once_never_claimed();

    // Free: claimed, and bound to this execution.
    let (a, h, job, keys) = keyed_and_counted("key-free", true).await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);
    assert_eq!(a.calls(), 1);
    assert_eq!((keys.reads(), keys.claims()), (1, 1), "read, then claimed");
    assert_eq!(
        keys.inner
            .bound("key-free")
            .await
            .unwrap()
            .map(|r| r.execution_id),
        Some(job.execution_id)
    );
}

/// A keyed job's binding is read while its log is read: here the log does not exist yet when
/// the job is delivered, and the binding has been read before it appears (paused time).
#[tokio::test(start_paused = true)]
async fn a_keyed_jobs_binding_is_read_while_its_log_is_awaited() {
    let (a, h, job, keys) = keyed_and_counted("key-early", false).await;
    let record = job.key.as_ref().unwrap().record.clone();
    assert_eq!(keys.inner.claim("key-early", &record).await.unwrap(), None);
    let runner = Arc::clone(&h.runner);
    let delivered = job.clone();
    let run = tokio::spawn(async move { runner.run(&delivered, 1).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!run.is_finished(), "the runner waits for the log");
    assert!(
        keys.read_before_the_log.load(SeqCst),
        "the binding was read while the log was awaited"
    );
    h.create_log(job.execution_id).await;
    assert_eq!(run.await.unwrap(), RunOutcome::Finished);
    assert_eq!(a.calls(), 1);
    assert_eq!(keys.claims(), 0);
}

/// Reading a binding binds nothing: a keyed job whose log never comes (its submission failed
/// and was withdrawn) leaves its free key free (paused time: the runner waits `log_wait`).
#[tokio::test(start_paused = true)]
async fn a_keyed_job_whose_log_never_comes_leaves_its_key_free() {
    let (a, h, job, keys) = keyed_and_counted("key-no-log", false).await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Dropped);
    assert_eq!(a.calls(), 0);
    keys.assert_read_once_never_claimed();
    assert_eq!(keys.inner.bound("key-no-log").await.unwrap(), None);
}

/// An operator holding the id of a failed execution finds exactly one warn line about it in
/// the process that ended it, with its portable code; a success and a cancellation log none.
#[tokio::test]
async fn a_failed_execution_logs_one_warn_line_with_its_code_and_others_none() {
    let (logs, guard) = testkit::logs::capture();
    let bad_request = not_retryable(
        ErrorCode::ProviderUnavailable,
        "Provider request failed with status 400",
    );
    let failing = ScriptedProvider::new("a", vec![Step::Fail(bad_request)]);
    let h = Harness::scripted(&[&failing]);
    let failed_job = run_to_end(&h, &text_request("")).await;
    let (_, h) = succeeding_a();
    let succeeded_job = run_to_end(&h, &text_request("")).await;
    // On this (current) thread, the spawned run logs into the capture too.
    let (_, h) = hanging_a();
    let cancelled_id = cancel_after_routing(&h).await;
    drop(guard);

    let text = logs.text();
    let warns: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warns.len(), 1, "{text}");
    assert!(warns[0].contains("execution failed"), "{text}");
    let failed_id = failed_job.execution_id.to_string();
    assert!(
        warns[0].contains(&format!("execution_id={failed_id}")),
        "{text}"
    );
    assert!(warns[0].contains("code=\"provider_unavailable\""), "{text}");
    // The success is a debug line and the cancellation an info line, each naming its execution.
    let succeeded_id = succeeded_job.execution_id.to_string();
    assert!(
        text.lines().any(|l| l.contains(" DEBUG ")
            && l.contains("execution succeeded")
            && l.contains(&succeeded_id)),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains(" INFO ")
            && l.contains("execution cancelled")
            && l.contains(&cancelled_id.to_string())),
        "{text}"
    );
}

/// A queue of two partitions over a memory queue: partition 0's requests stay open forever
/// with no job (a partition nobody submits to), partition 1 hands out the memory queue's jobs
/// and records how many jobs each of its waiting requests asked for.
struct OneSilentPartition {
    inner: Arc<MemoryJobQueue>,
    asked: std::sync::Mutex<Vec<usize>>,
    /// Whether each delivery says its source had no more jobs (as a NATS lane drained by the
    /// delivery does), so the pool goes back to waiting rather than taking.
    none_left: bool,
}

impl OneSilentPartition {
    fn new(inner: Arc<MemoryJobQueue>) -> Self {
        Self {
            inner,
            asked: std::sync::Mutex::new(Vec::new()),
            none_left: false,
        }
    }

    /// A queue whose deliveries say their source had no more jobs.
    fn none_left(inner: Arc<MemoryJobQueue>) -> Self {
        Self {
            none_left: true,
            ..Self::new(inner)
        }
    }

    /// What partition 1's waiting requests asked for, in order.
    fn asked(&self) -> Vec<usize> {
        self.asked.lock().unwrap().clone()
    }
}

/// `request`, unless it is one of partition 0's: those never end.
async fn unless_silent<T>(partition: usize, request: impl std::future::Future<Output = T>) -> T {
    match partition {
        0 => std::future::pending().await,
        _ => request.await,
    }
}

#[async_trait::async_trait]
impl JobQueue for OneSilentPartition {
    async fn publish(&self, job: &runtime::Job) -> Result<(), StoreError> {
        self.inner.publish(job).await
    }
    async fn withdraw(&self, job: &runtime::Job) -> Result<(), StoreError> {
        self.inner.withdraw(job).await
    }
    async fn receive(&self) -> Result<Option<runtime::Delivery>, StoreError> {
        self.inner.receive().await
    }
    /// A request over both partitions: it ends only when partition 0's does, never.
    async fn receive_up_to(&self, _max: usize) -> Result<Option<runtime::Deliveries>, StoreError> {
        std::future::pending().await
    }
    fn partitions(&self) -> usize {
        2
    }
    async fn receive_from(
        &self,
        partition: usize,
        max: usize,
    ) -> Result<Option<runtime::Deliveries>, StoreError> {
        use futures_util::StreamExt;
        unless_silent(partition, async {
            self.asked.lock().unwrap().push(max);
            let deliveries = self.inner.receive_up_to(max).await?;
            if !self.none_left {
                return Ok(deliveries);
            }
            Ok(deliveries.map(|deliveries| {
                deliveries
                    .map(|delivery| {
                        delivery.map(|mut delivery| {
                            delivery.handle = Box::new(NoneLeft(delivery.handle));
                            delivery
                        })
                    })
                    .boxed()
            }))
        })
        .await
    }
    async fn take_from(
        &self,
        partition: usize,
        max: usize,
    ) -> Result<Option<runtime::Deliveries>, StoreError> {
        unless_silent(partition, self.inner.take_from(0, max)).await
    }
    fn close(&self) {
        self.inner.close();
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<runtime::QueuedJob>, StoreError> {
        self.inner.scan(after, limit).await
    }
}

/// A delivery that says its source had no more jobs; everything else is its inner handle's.
struct NoneLeft(Box<dyn runtime::DeliveryHandle>);

#[async_trait::async_trait]
impl runtime::DeliveryHandle for NoneLeft {
    async fn ack(&self) -> Result<(), StoreError> {
        self.0.ack().await
    }
    async fn in_progress(&self) -> Result<(), StoreError> {
        self.0.in_progress().await
    }
    fn lease(&self) -> Option<Duration> {
        self.0.lease()
    }
    fn received_at(&self) -> Option<tokio::time::Instant> {
        self.0.received_at()
    }
    async fn withdrawn(&self) -> Result<bool, StoreError> {
        self.0.withdrawn().await
    }
    fn pending(&self) -> Option<u64> {
        Some(0)
    }
    async fn release(&self) -> Result<(), StoreError> {
        self.0.release().await
    }
}

#[tokio::test]
async fn a_partition_without_jobs_never_holds_up_the_jobs_of_another() {
    let a = ScriptedProvider::succeeding("a");
    let h = Harness::scripted(&[&a]);
    let inner = Arc::new(MemoryJobQueue::new());
    let queue = Arc::new(OneSilentPartition::new(Arc::clone(&inner)));
    let pool = spawn_pool_on(&h, queue, 8, Duration::from_millis(50));
    h.run_texts(&*inner, 20, Duration::from_secs(30)).await;
    assert_eq!(a.calls(), 20);
    drop(pool);
}

/// A waiting loop, holding no slot, asks its idle source for one job, and once its source has
/// had jobs, for its part of the slots free then (8 slots, one busy loop, at most its share of
/// 4), not for one job: jobs that arrive one at a time in a busy lane come through one
/// request, not a round trip each.
#[tokio::test]
async fn a_waiting_loop_asks_for_its_part_of_the_free_slots() {
    let a = ScriptedProvider::succeeding("a");
    let h = Harness::scripted(&[&a]);
    let inner = Arc::new(MemoryJobQueue::new());
    let queue = Arc::new(OneSilentPartition::new(Arc::clone(&inner)));
    let pool = spawn_pool_on(
        &h,
        Arc::clone(&queue) as Arc<dyn JobQueue>,
        8,
        Duration::from_millis(50),
    );
    wait_until("partition 1 is asked", PATIENCE, || async {
        !queue.asked().is_empty()
    })
    .await;
    assert_eq!(queue.asked(), [1], "an idle source");
    h.run_texts(&*inner, 1, Duration::from_secs(30)).await;
    wait_until("partition 1 is asked again", PATIENCE, || async {
        queue.asked().len() >= 2
    })
    .await;
    assert_eq!(
        queue.asked()[1],
        4,
        "a busy source, 7 or 8 free slots, a share of 4"
    );
    h.run_texts(&*inner, 5, Duration::from_secs(30)).await;
    assert_eq!(a.calls(), 6);
    assert!(
        queue.asked().iter().all(|&asked| (1..=4).contains(&asked)),
        "never more than a source's part of the slots: {:?}",
        queue.asked()
    );
    drop(pool);
}

/// A job a waiting loop receives while every slot is busy waits for a slot, and its loop asks
/// its source again only once that job has one: a lane holds no more jobs it cannot start
/// than it asked for, and the rest stay in the queue for a worker with free slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_holds_no_more_jobs_without_a_slot_than_it_asked_for() {
    let (a, h) = hanging_a();
    let inner = Arc::new(MemoryJobQueue::new());
    let queue = Arc::new(OneSilentPartition::none_left(Arc::clone(&inner)));
    let pool = spawn_pool_on(
        &h,
        Arc::clone(&queue) as Arc<dyn JobQueue>,
        1,
        Duration::from_millis(20),
    );
    let running = h.submit(&text_request(""), LONG).await;
    inner.publish(&running).await.unwrap();
    wait_until("the first job runs", PATIENCE, || async { a.calls() == 1 }).await;
    // Its delivery said the lane had no more: the loop waits again, for one job (no slot free).
    wait_until("the loop waits again", PATIENCE, || async {
        queue.asked().len() == 2
    })
    .await;
    assert_eq!(queue.asked(), [1, 1]);
    let held = h.submit(&text_request(""), LONG).await;
    let left = h.submit(&text_request(""), LONG).await;
    inner.publish(&held).await.unwrap();
    inner.publish(&left).await.unwrap();
    // Without the bound the loop would ask again at once and take `left` too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        queue.asked().len(),
        2,
        "asked again while its job had no slot"
    );
    let waiting: Vec<_> = inner
        .take_pending()
        .into_iter()
        .map(|job| job.execution_id)
        .collect();
    assert_eq!(waiting, [left.execution_id]);
    assert_eq!(a.calls(), 1);
    drop(pool);
}
