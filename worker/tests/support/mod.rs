//! Shared harness for the runner and pool integration tests: a scripted provider, a
//! registry/runner builder over the in-memory stores, job and log construction, exact log
//! checks, and a polling `wait_until` (tests never sleep a fixed time to wait for a condition).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use protocol::event::{EventBody, ExecutionStatus, ProgressPhase};
use protocol::manifest::ProviderManifest;
use protocol::materialize::Materializer;
use protocol::{
    ErrorCode, ExecutionId, ExecutionSnapshot, RuntimeError, RuntimeEvent, Sequence, Target,
    Timestamp, UsageFact,
};
use runtime::memory::{MemoryCancelBus, MemoryEventStore, MemoryIdempotencyStore, MemoryLimits};
use runtime::{CancelBus, EventStore, IdempotencyStore, Job};
use tokio::sync::Semaphore;
use worker::ProviderRegistry;
use worker::provider::{AttemptResult, Provider, ProviderCall, ProviderEvent, ProviderSink};
use worker::runner::{RunOutcome, Runner, RunnerSettings};

/// One step of a [`ScriptedProvider`] attempt.
#[derive(Debug, Clone)]
pub enum Step {
    /// Report an event; a sink error ends the attempt with that error.
    Emit(ProviderEvent),
    /// Wait; cancellation of the attempt ends it with `cancelled`.
    Sleep(Duration),
    /// Wait; cancellation of the attempt ends it with the given error (an adapter that reports
    /// an interrupted call as, say, a retryable transport error).
    SleepOrFail(Duration, RuntimeError),
    /// Wait for a permit of the test-controlled semaphore (consumed); cancellation of the
    /// attempt ends it with `cancelled`.
    Hold(Arc<Semaphore>),
    /// End the attempt with this error.
    Fail(RuntimeError),
}

/// A provider that follows a script, for precise control of what an attempt does.
#[derive(Debug)]
pub struct ScriptedProvider {
    manifest: ProviderManifest,
    script: Vec<Step>,
    calls: AtomicUsize,
    finished: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// The model every scripted provider serves.
pub fn model_of(provider: &str) -> String {
    format!("{provider}-model")
}

pub fn target(provider: &str) -> Target {
    Target {
        provider: provider.into(),
        model: model_of(provider),
    }
}

impl ScriptedProvider {
    pub fn new(id: &str, script: Vec<Step>) -> Arc<Self> {
        // What the mock declares: text in, text out, streamed, cancellable.
        let manifest = serde_json::from_value(serde_json::json!({
            "provider": id,
            "protocol_version": protocol::PROTOCOL_VERSION,
            "models": [{
                "model": model_of(id),
                "abilities": ["text-generation"],
                "input_modalities": ["text"],
                "output_modalities": ["text"],
                "stream": true, "tools": false, "structured_output": false,
                "async": false, "cancel": true,
            }],
        }))
        .expect("valid manifest");
        Arc::new(Self {
            manifest,
            script,
            calls: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        })
    }

    /// The mock's success script: "hello", " from", " mock", then usage.
    pub fn succeeding(id: &str) -> Arc<Self> {
        Self::new(id, success_script())
    }

    /// Fails at once with retryable `provider_unavailable`.
    pub fn failing(id: &str) -> Arc<Self> {
        Self::new(id, vec![Step::Fail(unavailable())])
    }

    /// Sleeps (cancellably) for an hour.
    pub fn hanging(id: &str) -> Arc<Self> {
        Self::new(id, vec![Step::Sleep(Duration::from_secs(3600))])
    }

    /// Attempts started (`execute` entered, so the gate was passed).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Attempts that returned.
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    /// The most attempts that ran at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    async fn follow(
        &self,
        call: &ProviderCall<'_>,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        assert_eq!(
            call.model,
            model_of(&self.manifest.provider),
            "the runner passes the routed model"
        );
        for step in &self.script {
            match step {
                Step::Emit(event) => sink.emit(event.clone()).await?,
                Step::Sleep(d) => tokio::select! {
                    () = tokio::time::sleep(*d) => {}
                    () = call.cancel.cancelled() => return Err(RuntimeError::cancelled()),
                },
                Step::SleepOrFail(d, error) => tokio::select! {
                    () = tokio::time::sleep(*d) => {}
                    () = call.cancel.cancelled() => return Err(error.clone()),
                },
                Step::Hold(semaphore) => tokio::select! {
                    permit = semaphore.acquire() => permit.expect("semaphore open").forget(),
                    () = call.cancel.cancelled() => return Err(RuntimeError::cancelled()),
                },
                Step::Fail(error) => return Err(error.clone()),
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn id(&self) -> &str {
        self.manifest.provider.as_str()
    }

    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    async fn execute(&self, call: ProviderCall<'_>, sink: &mut dyn ProviderSink) -> AttemptResult {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = self.follow(&call, sink).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.finished.fetch_add(1, Ordering::SeqCst);
        result
    }
}

// ---------- script and event vocabulary ----------

pub fn emit_delta(text: &str) -> Step {
    Step::Emit(ProviderEvent::output_delta(0, text))
}

pub fn mock_usage_facts(chunks: u32) -> Vec<UsageFact> {
    UsageFact::runtime_tokens(1.0, f64::from(chunks)).expect("valid")
}

pub fn success_script() -> Vec<Step> {
    vec![
        emit_delta("hello"),
        emit_delta(" from"),
        emit_delta(" mock"),
        Step::Emit(ProviderEvent::Usage(mock_usage_facts(3))),
    ]
}

/// A non-retryable error.
pub fn not_retryable(code: ErrorCode, message: &str) -> RuntimeError {
    RuntimeError::new(code, message, false)
}

/// A retryable error with `code`, as an adapter reports an HTTP `status` before any output.
pub fn status_failure(code: ErrorCode, status: u16) -> RuntimeError {
    RuntimeError::new(
        code,
        format!("Provider request failed with status {status}"),
        true,
    )
    .with_provider_code(status.to_string())
}

/// Retryable `provider_unavailable`, as an adapter reports an outage before any output.
pub fn unavailable() -> RuntimeError {
    status_failure(ErrorCode::ProviderUnavailable, 503)
}

pub fn progress() -> ProviderEvent {
    ProviderEvent::Progress {
        phase: ProgressPhase::Processing,
        progress: Some(0.5),
    }
}

pub fn selected(provider: &str, attempt: u32) -> EventBody {
    EventBody::RouteSelected {
        target: target(provider),
        attempt,
    }
}

pub fn attempt_failed(provider: &str, attempt: u32, error: RuntimeError) -> EventBody {
    EventBody::RouteAttemptFailed {
        target: target(provider),
        attempt,
        error,
    }
}

pub fn delta(text: &str) -> EventBody {
    EventBody::OutputDelta {
        output_index: 0,
        delta: text.into(),
    }
}

pub fn usage(chunks: u32) -> EventBody {
    EventBody::UsageReported {
        facts: mock_usage_facts(chunks),
    }
}

pub fn completed(provider: &str) -> EventBody {
    EventBody::Completed {
        target: target(provider),
    }
}

pub fn failed(error: RuntimeError) -> EventBody {
    EventBody::Failed { error }
}

/// The bodies of the mock's successful run, `accepted` through `completed`.
pub fn success_log(provider: &str) -> Vec<EventBody> {
    vec![
        EventBody::Accepted,
        selected(provider, 1),
        delta("hello"),
        delta(" from"),
        delta(" mock"),
        usage(3),
        completed(provider),
    ]
}

/// A log whose first attempt, at `target`, failed the execution: `accepted`,
/// `route.selected`, the `middle` events, then `execution.failed` with `error`.
pub fn failed_after(target: Target, middle: &[EventBody], error: RuntimeError) -> Vec<EventBody> {
    let mut log = vec![
        EventBody::Accepted,
        EventBody::RouteSelected { target, attempt: 1 },
    ];
    log.extend_from_slice(middle);
    log.push(failed(error));
    log
}

/// A log whose first attempt, at `first`, failed with `error` before any output, and whose
/// second attempt ran the mock's success script at `mock`.
pub fn fell_back_to_mock(first: Target, error: RuntimeError, mock: Target) -> Vec<EventBody> {
    vec![
        EventBody::Accepted,
        EventBody::RouteSelected {
            target: first.clone(),
            attempt: 1,
        },
        EventBody::RouteAttemptFailed {
            target: first,
            attempt: 1,
            error,
        },
        EventBody::RouteSelected {
            target: mock.clone(),
            attempt: 2,
        },
        delta("hello"),
        delta(" from"),
        delta(" mock"),
        usage(3),
        EventBody::Completed { target: mock },
    ]
}

pub fn hello_result() -> serde_json::Value {
    serde_json::json!({
        "outputs": [{"index": 0, "type": "text", "text": "hello from mock"}],
        "tool_calls": []
    })
}

// ---------- harness ----------

/// Registration of one provider: flow-control limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_concurrency: u32,
    pub max_queue_depth: u32,
}

pub const DEFAULT_LIMITS: Limits = Limits {
    max_concurrency: 16,
    max_queue_depth: 64,
};

/// Registrations of scripted providers, in order, with [`DEFAULT_LIMITS`].
pub fn with_default_limits(
    providers: &[&Arc<ScriptedProvider>],
) -> Vec<(Arc<dyn Provider>, Limits)> {
    providers
        .iter()
        .map(|p| (Arc::clone(*p) as Arc<dyn Provider>, DEFAULT_LIMITS))
        .collect()
}

/// Stores, bus, registry and runner over in-memory implementations.
pub struct Harness {
    pub store: Arc<MemoryEventStore>,
    pub bus: Arc<MemoryCancelBus>,
    pub registry: Arc<ProviderRegistry>,
    pub runner: Arc<Runner>,
    /// Where the runner binds the idempotency keys of keyed jobs.
    pub keys: Arc<dyn IdempotencyStore>,
    runner_store: Arc<dyn EventStore>,
    settings: RunnerSettings,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").finish_non_exhaustive()
    }
}

impl Harness {
    pub fn new(providers: Vec<(Arc<dyn Provider>, Limits)>) -> Self {
        Self::with(
            providers,
            MemoryLimits::default(),
            RunnerSettings::default(),
        )
    }

    /// Scripted providers registered in order with default limits.
    pub fn scripted(providers: &[&Arc<ScriptedProvider>]) -> Self {
        Self::new(with_default_limits(providers))
    }

    /// Scripted providers (default limits) over a memory store holding at most `max_events`
    /// events per execution.
    pub fn event_limited(providers: &[&Arc<ScriptedProvider>], max_events: usize) -> Self {
        Self::with(
            with_default_limits(providers),
            MemoryLimits {
                max_events,
                ..MemoryLimits::default()
            },
            RunnerSettings::default(),
        )
    }

    /// Scripted providers (default limits) whose runner writes through an [`InterposedStore`]
    /// over a fresh memory store (see [`InterposedStore::new`]); `store` is that memory store.
    pub fn interposed(
        providers: &[&Arc<ScriptedProvider>],
        on_type: &'static str,
        interference: Interference,
        refuse_terminal: bool,
    ) -> Self {
        let store = Arc::new(MemoryEventStore::new(MemoryLimits::default()));
        let interposed =
            InterposedStore::new(Arc::clone(&store), on_type, interference, refuse_terminal);
        Self::with_store(
            with_default_limits(providers),
            interposed,
            store,
            RunnerSettings::default(),
        )
    }

    pub fn with(
        providers: Vec<(Arc<dyn Provider>, Limits)>,
        limits: MemoryLimits,
        settings: RunnerSettings,
    ) -> Self {
        let store = Arc::new(MemoryEventStore::new(limits));
        Self::with_store(
            providers,
            Arc::clone(&store) as Arc<dyn EventStore>,
            store,
            settings,
        )
    }

    /// A harness whose runner writes through `runner_store` (for example a wrapper around
    /// `store` that injects failures or competing writers).
    pub fn with_store(
        providers: Vec<(Arc<dyn Provider>, Limits)>,
        runner_store: Arc<dyn EventStore>,
        store: Arc<MemoryEventStore>,
        settings: RunnerSettings,
    ) -> Self {
        let mut registry = ProviderRegistry::new();
        for (provider, limits) in providers {
            registry
                .register(provider, limits.max_concurrency, limits.max_queue_depth)
                .expect("register provider");
        }
        let registry = Arc::new(registry);
        let bus = Arc::new(MemoryCancelBus::new());
        let keys: Arc<dyn IdempotencyStore> =
            Arc::new(MemoryIdempotencyStore::new(Duration::from_secs(3600)));
        let runner = Arc::new(Runner::new(
            Arc::clone(&registry),
            Arc::clone(&runner_store),
            Arc::clone(&bus) as Arc<dyn CancelBus>,
            Arc::clone(&keys),
            settings.clone(),
        ));
        Self {
            store,
            bus,
            registry,
            runner,
            keys,
            runner_store,
            settings,
        }
    }

    /// The same harness with a runner whose writer pipelines its appends, as it does against
    /// JetStream (see [`PipelinedStore`]).
    pub fn pipelined(self) -> Self {
        let runner_store: Arc<dyn EventStore> = Arc::new(PipelinedStore(self.runner_store));
        let runner = Arc::new(Runner::new(
            Arc::clone(&self.registry),
            Arc::clone(&runner_store),
            Arc::clone(&self.bus) as Arc<dyn CancelBus>,
            Arc::clone(&self.keys),
            self.settings.clone(),
        ));
        Self {
            runner,
            runner_store,
            ..self
        }
    }

    /// The same harness with a runner that binds idempotency keys in `keys`.
    pub fn with_keys(self, keys: Arc<dyn IdempotencyStore>) -> Self {
        let runner = Arc::new(Runner::new(
            Arc::clone(&self.registry),
            Arc::clone(&self.runner_store),
            Arc::clone(&self.bus) as Arc<dyn CancelBus>,
            Arc::clone(&keys),
            self.settings.clone(),
        ));
        Self {
            runner,
            keys,
            ..self
        }
    }

    /// Creates the execution's log (`execution.accepted` at sequence 1) and returns its job.
    pub async fn submit(&self, request_json: &str, deadline: Duration) -> Job {
        let job = job(request_json, deadline);
        self.create_log(job.execution_id).await;
        job
    }

    pub async fn create_log(&self, id: ExecutionId) {
        let accepted = RuntimeEvent::new(id, Sequence(1), Timestamp::now(), EventBody::Accepted);
        self.store.create(accepted).await.expect("create log");
    }

    /// Appends `body` as the next event, as another writer (a gateway or a previous worker).
    pub async fn append_foreign(&self, id: ExecutionId, body: EventBody) {
        let last = self.state(id).await.last_sequence();
        self.store
            .append(RuntimeEvent::new(id, last.next(), Timestamp::now(), body))
            .await
            .expect("foreign append");
    }

    pub async fn events(&self, id: ExecutionId) -> Vec<RuntimeEvent> {
        self.store
            .read(id, Sequence(0), 1000)
            .await
            .expect("read")
            .expect("log exists")
            .iter()
            .map(|r| r.event.clone())
            .collect()
    }

    pub async fn state(&self, id: ExecutionId) -> Materializer {
        self.store
            .state(id)
            .await
            .expect("state")
            .expect("log exists")
    }

    pub async fn snapshot(&self, id: ExecutionId) -> ExecutionSnapshot {
        self.state(id).await.snapshot()
    }

    pub async fn is_terminal(&self, id: ExecutionId) -> bool {
        self.state(id).await.is_terminal()
    }

    /// Submits `n` text executions, publishes their jobs on `queue` and waits (at most
    /// `timeout`) until every one is terminal; returns their ids.
    pub async fn run_texts(
        &self,
        queue: &dyn runtime::JobQueue,
        n: usize,
        timeout: Duration,
    ) -> Vec<ExecutionId> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let job = self.submit(&text_request(""), LONG).await;
            queue.publish(&job).await.expect("publish");
            ids.push(job.execution_id);
        }
        let what = format!("all {n} executions are terminal");
        wait_until(&what, timeout, || async {
            for id in &ids {
                if !self.is_terminal(*id).await {
                    return false;
                }
            }
            true
        })
        .await;
        ids
    }

    pub async fn has_event(&self, id: ExecutionId, type_name: &str) -> bool {
        self.events(id)
            .await
            .iter()
            .any(|e| e.type_name() == type_name)
    }

    /// Reads the whole log, checks the invariants every finished log obeys, and compares the
    /// bodies exactly.
    pub async fn assert_log(&self, id: ExecutionId, expected: &[EventBody]) -> Vec<RuntimeEvent> {
        let events = self.events(id).await;
        assert_log_rules(id, &events);
        let bodies: Vec<EventBody> = events.iter().map(|e| e.body.clone()).collect();
        assert_eq!(bodies, expected, "event bodies of {id}");
        events
    }
}

impl Harness {
    /// Every event and the snapshot of `id`, and `logs` if given, are free of canary
    /// credentials (`testkit::canary`).
    pub async fn assert_no_canary(&self, id: ExecutionId, logs: Option<&str>) {
        let marker = testkit::canary::MARKER;
        let events = self.events(id).await;
        testkit::canary::assert_absent_all(marker, "an event", events.iter().map(|e| e.to_json()));
        let snapshot = serde_json::to_string(&self.snapshot(id).await).expect("snapshot JSON");
        testkit::canary::assert_absent(marker, "the snapshot", &snapshot);
        if let Some(logs) = logs {
            testkit::canary::assert_absent(marker, "the logs", logs);
        }
    }

    /// Checks the log so far (not yet terminal) against `expected` exactly.
    pub async fn assert_log_prefix(&self, id: ExecutionId, expected: &[EventBody]) {
        let events = self.events(id).await;
        for (i, event) in events.iter().enumerate() {
            assert_eq!(
                event.sequence,
                Sequence(i as u64 + 1),
                "contiguous sequence"
            );
            assert!(!event.is_terminal(), "log of {id} is not terminal yet");
        }
        let bodies: Vec<EventBody> = events.iter().map(|e| e.body.clone()).collect();
        assert_eq!(bodies, expected, "event bodies of {id} so far");
    }
}

/// Sequences 1..n contiguous, one execution, times non-decreasing, statuses as the body
/// implies, exactly one terminal event and it is the last.
pub fn assert_log_rules(id: ExecutionId, events: &[RuntimeEvent]) {
    assert!(!events.is_empty(), "log of {id} is empty");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event.sequence,
            Sequence(i as u64 + 1),
            "contiguous sequence"
        );
        assert_eq!(event.execution_id, id);
        assert!(
            event.body.allows_status(event.status),
            "status {} not allowed for {}",
            event.status,
            event.type_name()
        );
        assert_eq!(event.status, event.body.status());
        if i > 0 {
            assert!(event.time >= events[i - 1].time, "times never go backwards");
        }
    }
    let terminals: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.is_terminal())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        terminals,
        vec![events.len() - 1],
        "exactly one terminal event, last"
    );
}

/// The event types of an execution that failed after one output delta.
pub const FAILED_AFTER_ONE_DELTA: [&str; 4] = [
    "execution.accepted",
    "route.selected",
    "output.delta",
    "execution.failed",
];

/// The event types of an execution that failed while routing, before any output.
pub const FAILED_AT_ROUTING: [&str; 3] =
    ["execution.accepted", "route.selected", "execution.failed"];

/// Polls until the log of `id` has an output delta.
pub async fn wait_for_output(h: &Harness, id: ExecutionId) {
    wait_until("output arrives", PATIENCE, || {
        h.has_event(id, "output.delta")
    })
    .await;
}

/// The statuses of a log, for readable assertions.
pub fn statuses(events: &[RuntimeEvent]) -> Vec<ExecutionStatus> {
    events.iter().map(|e| e.status).collect()
}

pub fn type_names(events: &[RuntimeEvent]) -> Vec<&'static str> {
    events.iter().map(RuntimeEvent::type_name).collect()
}

/// A job for `request_json` accepted now, with its deadline `deadline` from now.
pub fn job(request_json: &str, deadline: Duration) -> Job {
    let request =
        protocol::validate::parse_request(request_json.as_bytes()).expect("valid request");
    let now = Timestamp::now();
    let deadline_ms = i64::try_from(deadline.as_millis()).expect("deadline fits");
    Job {
        execution_id: ExecutionId::new_random(),
        request,
        accepted_at: now,
        deadline_at: Timestamp::from_unix_millis(now.unix_millis() + deadline_ms),
        traceparent: None,
        key: None,
        tenant: None,
    }
}

/// A text-generation request with the given `routing` object (JSON text, or empty for none).
pub fn text_request(routing: &str) -> String {
    let routing = if routing.is_empty() {
        String::new()
    } else {
        format!(r#","routing":{routing}"#)
    };
    format!(r#"{{"ability":"text-generation","input":[{{"type":"text","text":"hi"}}]{routing}}}"#)
}

pub const FALLBACK: &str = r#"{"allow_fallback":true}"#;

/// A deadline no test reaches.
pub const LONG: Duration = Duration::from_secs(600);

/// How long a test waits for something that should happen promptly. Generous, so that a busy
/// machine does not make tests flaky; the wait ends as soon as the condition holds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Polls `condition` until it holds; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs `job` (delivery 1) on a task.
pub fn spawn_run(h: &Harness, job: &Job) -> tokio::task::JoinHandle<RunOutcome> {
    let runner = Arc::clone(&h.runner);
    let job = job.clone();
    tokio::spawn(async move { runner.run(&job, 1).await })
}

/// Awaits a spawned run (at most [`PATIENCE`]), asserting it finished the execution.
pub async fn finishes(what: &str, run: tokio::task::JoinHandle<RunOutcome>) {
    let outcome = within(what, PATIENCE, run)
        .await
        .expect("the run did not panic");
    assert_eq!(outcome, RunOutcome::Finished, "{what}");
}

/// Awaits `fut`, panicking with `what` if it takes longer than `timeout`.
pub async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {timeout:?}: {what}"),
    }
}

// ---------- an event store that lets a test interfere ----------

/// What [`InterposedStore`] does before the runner's first append of a given event type.
#[derive(Debug, Clone)]
pub enum Interference {
    /// Another writer (a gateway cancel, a zombie worker) appends this body at the same
    /// sequence first, so the runner's append loses the compare-and-set.
    Foreign(EventBody),
    /// The store refuses the append with this error (nothing is written).
    Fail(runtime::StoreError),
}

/// Delegates to a [`MemoryEventStore`], interfering once with the first append of one event
/// type, and optionally refusing every terminal append.
pub struct InterposedStore {
    pub inner: Arc<MemoryEventStore>,
    trigger: parking_lot::Mutex<Option<(&'static str, Interference)>>,
    refuse_terminal: bool,
}

impl std::fmt::Debug for InterposedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterposedStore").finish_non_exhaustive()
    }
}

impl InterposedStore {
    pub fn new(
        inner: Arc<MemoryEventStore>,
        on_type: &'static str,
        interference: Interference,
        refuse_terminal: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            trigger: parking_lot::Mutex::new(Some((on_type, interference))),
            refuse_terminal,
        })
    }
}

#[async_trait]
impl runtime::intercept::Intercept for InterposedStore {
    fn inner(&self) -> &dyn EventStore {
        self.inner.as_ref()
    }

    async fn append_as(
        &self,
        event: RuntimeEvent,
        writer: runtime::WriterId,
    ) -> Result<(), runtime::StoreError> {
        let fire = {
            let mut trigger = self.trigger.lock();
            match trigger.as_ref() {
                Some((on_type, _)) if *on_type == event.type_name() => trigger.take(),
                _ => None,
            }
        };
        if let Some((_, interference)) = fire {
            match interference {
                Interference::Foreign(body) => {
                    let foreign = RuntimeEvent::new(
                        event.execution_id,
                        event.sequence,
                        Timestamp::now(),
                        body,
                    );
                    self.inner.append(foreign).await.expect("foreign append");
                }
                Interference::Fail(error) => return Err(error),
            }
        }
        if self.refuse_terminal && event.is_terminal() {
            return Err(runtime::StoreError::NotFound);
        }
        self.inner.append_as(event, writer).await
    }
}

/// Delegates to another store but asks writers to pipeline their appends (as the JetStream
/// store does), so the runner's pipelined path runs over a memory store: its appender task
/// sends what queued during an append as one run.
pub struct PipelinedStore(pub Arc<dyn EventStore>);

impl std::fmt::Debug for PipelinedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelinedStore").finish_non_exhaustive()
    }
}

#[async_trait]
impl runtime::intercept::Intercept for PipelinedStore {
    fn inner(&self) -> &dyn EventStore {
        self.0.as_ref()
    }

    async fn append_run_as(
        &self,
        run: &[runtime::EventRecord],
        writer: runtime::WriterId,
    ) -> Result<(), runtime::RunError> {
        self.0.append_run_as(run, writer).await
    }

    fn pipelines_appends(&self) -> bool {
        true
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<runtime::LogHead>, runtime::StoreError> {
        self.0.head(id).await
    }
}

/// A memory store behind a link that can be cut, as a worker partitioned from JetStream sees
/// it (pipelined, like the JetStream store). While cut, a run is not stored: its append fails
/// `Unavailable` after [`PartitionedStore::ACK_TIMEOUT`] (a publish whose acknowledgement
/// timed out), but it is still on its way. The cut heals by itself `lasting` after it began,
/// at the first append from then on: the runs on their way land then, in order, each
/// compare-and-set like any append (late, after their writer may have given up, as JetStream
/// stores publishes once a partition heals), before that append is served.
pub struct PartitionedStore {
    pub inner: Arc<MemoryEventStore>,
    cut: parking_lot::Mutex<Option<tokio::time::Instant>>,
    in_flight: parking_lot::Mutex<Vec<(Vec<runtime::EventRecord>, runtime::WriterId)>>,
}

impl std::fmt::Debug for PartitionedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedStore").finish_non_exhaustive()
    }
}

impl PartitionedStore {
    /// How long an append waits for its acknowledgement across the cut.
    pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

    pub fn new(inner: Arc<MemoryEventStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            cut: parking_lot::Mutex::new(None),
            in_flight: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// Cuts the link for `lasting`.
    pub fn cut(&self, lasting: Duration) {
        *self.cut.lock() = Some(tokio::time::Instant::now() + lasting);
    }

    /// Heals the link now; the runs on their way are lost (never stored).
    pub fn heal_losing_in_flight(&self) {
        *self.cut.lock() = None;
        self.in_flight.lock().clear();
    }

    /// Whether the link is cut now; heals it (landing the runs on their way) once the cut is
    /// over.
    async fn is_cut(&self) -> bool {
        let until = *self.cut.lock();
        match until {
            Some(until) if tokio::time::Instant::now() < until => true,
            Some(_) => {
                *self.cut.lock() = None;
                let in_flight = std::mem::take(&mut *self.in_flight.lock());
                for (run, writer) in in_flight {
                    // A later copy of a run, or a run behind one, may lose its compare-and-set.
                    let _ = self.inner.append_run_as(&run, writer).await;
                }
                false
            }
            None => false,
        }
    }
}

#[async_trait]
impl runtime::intercept::Intercept for PartitionedStore {
    fn inner(&self) -> &dyn EventStore {
        self.inner.as_ref()
    }

    async fn append_run_as(
        &self,
        run: &[runtime::EventRecord],
        writer: runtime::WriterId,
    ) -> Result<(), runtime::RunError> {
        if self.is_cut().await {
            self.in_flight.lock().push((run.to_vec(), writer));
            tokio::time::sleep(Self::ACK_TIMEOUT).await;
            return Err(runtime::RunError {
                stored: 0,
                error: runtime::StoreError::Unavailable("publish ack: timed out".into()),
            });
        }
        self.inner.append_run_as(run, writer).await
    }

    fn pipelines_appends(&self) -> bool {
        true
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<runtime::LogHead>, runtime::StoreError> {
        self.inner.head(id).await
    }
}

/// A memory store whose log-head reads time out, as a JetStream store's direct gets do on a
/// busy server: each of the next `failures` reads waits [`SlowReadsStore::TIMEOUT`] and then
/// fails `Unavailable`; the reads after them are served.
pub struct SlowReadsStore {
    pub inner: Arc<MemoryEventStore>,
    failures: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for SlowReadsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowReadsStore").finish_non_exhaustive()
    }
}

impl SlowReadsStore {
    /// How long a failing read takes (the JetStream store's request timeout).
    pub const TIMEOUT: Duration = Duration::from_millis(1500);

    /// `failures` reads fail (`u32::MAX`: every one).
    pub fn new(inner: Arc<MemoryEventStore>, failures: u32) -> Arc<Self> {
        Arc::new(Self {
            inner,
            failures: std::sync::atomic::AtomicU32::new(failures),
        })
    }

    /// How many reads are still to fail (for a finite count).
    pub fn failures_left(&self) -> u32 {
        self.failures.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait]
impl runtime::intercept::Intercept for SlowReadsStore {
    fn inner(&self) -> &dyn EventStore {
        self.inner.as_ref()
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<runtime::LogHead>, runtime::StoreError> {
        let failing = self
            .failures
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |left| match left {
                    0 => None,
                    u32::MAX => Some(u32::MAX),
                    left => Some(left - 1),
                },
            )
            .is_ok();
        if failing {
            tokio::time::sleep(Self::TIMEOUT).await;
            return Err(runtime::StoreError::Unavailable(
                "direct get: timed out".into(),
            ));
        }
        self.inner.head(id).await
    }
}

/// A memory store whose cheap head read ([`EventStore::head`]) answers from a copy of a log
/// frozen behind it, as a JetStream replica that stopped applying its leader's appends does,
/// while [`EventStore::latest_head`] answers from the log itself (the leader).
pub struct LaggingStore {
    pub inner: Arc<MemoryEventStore>,
    frozen: parking_lot::Mutex<std::collections::HashMap<ExecutionId, runtime::LogHead>>,
}

impl std::fmt::Debug for LaggingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaggingStore").finish_non_exhaustive()
    }
}

impl LaggingStore {
    pub fn new(inner: Arc<MemoryEventStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            frozen: parking_lot::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// From now on, head reads of `id` answer its head as it is now.
    pub async fn freeze(&self, id: ExecutionId) {
        let head = self.inner.head(id).await.expect("head").expect("a log");
        self.frozen.lock().insert(id, head);
    }
}

#[async_trait]
impl runtime::intercept::Intercept for LaggingStore {
    fn inner(&self) -> &dyn EventStore {
        self.inner.as_ref()
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<runtime::LogHead>, runtime::StoreError> {
        let frozen = self.frozen.lock().get(&id).copied();
        match frozen {
            Some(head) => Ok(Some(head)),
            None => self.inner.head(id).await,
        }
    }

    async fn latest_head(
        &self,
        id: ExecutionId,
    ) -> Result<Option<runtime::LogHead>, runtime::StoreError> {
        self.inner.head(id).await
    }
}
