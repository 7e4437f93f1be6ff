//! What a failed step of a submission means (`gateway::submit`): the log is created and the
//! job published concurrently, so either can fail while the other succeeded, and a failure may
//! hide a stored write (a lost acknowledgement). Whatever happened, a 503 means nothing runs
//! (no provider call, the log closed with the unqueued failure), and a 202 means the
//! execution runs to a terminal event.
//!
//! The gateway runs with memory stores behind fault-injecting wrappers and a worker pool in
//! this process whose only provider is a fake HTTP server counting its calls; every request
//! carries a unique text, so each provider call is attributed to its execution.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use config::{BaseUrl, FlowLimits};
use parking_lot::Mutex;
use protocol::{ExecutionId, RuntimeEvent, Sequence};
use runtime::memory::{
    MemoryCancelBus, MemoryEventStore, MemoryIdempotencyStore, MemoryJobQueue, MemoryLimits,
};
use runtime::{
    EventStore, IdempotencyRecord, IdempotencyStore, Job, JobQueue, LogHead, StoreError,
};
use serde_json::{Value, json};
use testkit::fake_provider::{FakeProvider, Piece, Reply};
use testkit::gateway::memory_backend;
use tower::ServiceExt;
use worker::provider::credential::{KeySource, Secret};
use worker::provider::openai_chat::OpenAiChatProvider;
use worker::provider::text::TextProviderConfig;
use worker::{ProviderRegistry, WorkerPool};

/// Longest any condition is awaited (busy two-core machines).
const WAIT: Duration = Duration::from_secs(30);

/// How an injected fault treats a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The write is not stored and reported unavailable (e.g. no stream leader).
    Lost,
    /// The write is stored but reported unavailable (its acknowledgement timed out).
    AckLost,
    /// The write is stored at once and acknowledged only after [`SLOW_ACK`] (a JetStream
    /// publish handed to a reconnecting connection, then acknowledged).
    SlowAck,
    /// A job publish only: stored once its log is, its acknowledgement lost, and the gateway's
    /// event store out of reach from then on until the test lifts the outage (the residual
    /// window of `gateway::submit`: the gateway cannot close the log, a worker claims it).
    AckLostThenOutage,
}

/// How late a [`Fault::SlowAck`] write is acknowledged: longer than the submit bound.
const SLOW_ACK: Duration = Duration::from_secs(3);

/// Applies a fault to the first write of the next `remaining` executions.
struct Faults {
    fault: Fault,
    remaining: AtomicUsize,
    seen: Mutex<HashSet<ExecutionId>>,
}

impl Faults {
    fn new(fault: Fault, count: usize) -> Self {
        Self {
            fault,
            remaining: AtomicUsize::new(count),
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// The executions written so far.
    fn seen(&self) -> Vec<ExecutionId> {
        self.seen.lock().iter().copied().collect()
    }

    /// The one execution written so far (the tests that ask have written one).
    fn only(&self, what: &str) -> ExecutionId {
        *self.seen.lock().iter().next().expect(what)
    }

    /// The fault for this write of `id`, if any: only an execution's first write is hit.
    fn hit(&self, id: ExecutionId) -> Option<Fault> {
        if !self.seen.lock().insert(id) {
            return None;
        }
        self.remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| self.fault)
    }
}

fn unavailable() -> StoreError {
    StoreError::Unavailable("injected fault".into())
}

/// The gateway's event store: `create` under [`Faults`]; everything fails during an outage.
struct FaultyStore {
    inner: Arc<MemoryEventStore>,
    creates: Faults,
    /// Shared with the queue, which sets it on [`Fault::AckLostThenOutage`].
    outage: Arc<AtomicBool>,
    /// While set, every log creation fails unstored (reads still answer).
    create_outage: AtomicBool,
}

/// `Unavailable` while `outage` is set.
fn check(outage: &AtomicBool) -> Result<(), StoreError> {
    if outage.load(Ordering::SeqCst) {
        Err(unavailable())
    } else {
        Ok(())
    }
}

impl FaultyStore {
    fn check(&self) -> Result<(), StoreError> {
        check(&self.outage)
    }
}

#[async_trait]
impl runtime::intercept::Intercept for FaultyStore {
    fn inner(&self) -> &dyn EventStore {
        self.inner.as_ref()
    }
    fn available(&self) -> Result<(), StoreError> {
        self.check()
    }
    async fn create_owned(
        &self,
        accepted: RuntimeEvent,
        owner: &protocol::Tenant,
    ) -> Result<(), StoreError> {
        self.check()?;
        check(&self.create_outage)?;
        match self.creates.hit(accepted.execution_id) {
            None => self.inner.create_owned(accepted, owner).await,
            Some(Fault::Lost) => Err(unavailable()),
            Some(Fault::AckLost) => {
                self.inner.create_owned(accepted, owner).await?;
                Err(unavailable())
            }
            Some(Fault::SlowAck) => {
                self.inner.create_owned(accepted, owner).await?;
                tokio::time::sleep(SLOW_ACK).await;
                Ok(())
            }
            Some(Fault::AckLostThenOutage) => unreachable!("a publish fault"),
        }
    }
    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        self.check()?;
        self.inner.head(id).await
    }
}

/// The gateway's job queue: `publish` under [`Faults`].
struct FaultyQueue {
    inner: Arc<MemoryJobQueue>,
    publishes: Faults,
    /// Every withdrawal fails while set.
    withdraw_outage: AtomicBool,
    /// The logs, and the gateway's event store's outage, for [`Fault::AckLostThenOutage`].
    logs: Arc<MemoryEventStore>,
    store_outage: Arc<AtomicBool>,
}

#[async_trait]
impl runtime::intercept::QueueIntercept for FaultyQueue {
    fn inner(&self) -> &dyn JobQueue {
        &*self.inner
    }
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        match self.publishes.hit(job.execution_id) {
            None => self.inner.publish(job).await,
            Some(Fault::Lost) => Err(unavailable()),
            Some(Fault::AckLost) => {
                self.inner.publish(job).await?;
                Err(unavailable())
            }
            Some(Fault::SlowAck) => {
                self.inner.publish(job).await?;
                tokio::time::sleep(SLOW_ACK).await;
                Ok(())
            }
            Some(Fault::AckLostThenOutage) => {
                let until = Instant::now() + WAIT;
                while self.logs.head(job.execution_id).await?.is_none() {
                    assert!(Instant::now() < until, "the log was never created");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                self.store_outage.store(true, Ordering::SeqCst);
                self.inner.publish(job).await?;
                Err(unavailable())
            }
        }
    }
    async fn withdraw(&self, job: &Job) -> Result<(), StoreError> {
        if self.withdraw_outage.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        self.inner.withdraw(job).await
    }
}

/// The gateway's idempotency store: every call fails during an outage, and a claim can be made
/// to wait for a condition first. The workers bind keys in the inner store directly.
struct FaultyKeys {
    inner: Arc<MemoryIdempotencyStore>,
    outage: AtomicBool,
    /// While set, a claim first waits until its execution's job was published.
    after_publish: AtomicBool,
    /// While set, a claim first waits until its execution's log is terminal.
    after_close: AtomicBool,
    queue: Arc<FaultyQueue>,
    store: Arc<MemoryEventStore>,
}

impl FaultyKeys {
    fn check(&self) -> Result<(), StoreError> {
        check(&self.outage)
    }

    /// Whether `id`'s job was published, or, with `closed`, its log is terminal.
    async fn reached(&self, id: ExecutionId, closed: bool) -> bool {
        if closed {
            matches!(self.store.head(id).await, Ok(Some(head)) if head.terminal)
        } else {
            self.queue.publishes.seen.lock().contains(&id)
        }
    }

    /// Waits up to 5 s for [`FaultyKeys::reached`]; an error when it never held.
    async fn wait_for(&self, id: ExecutionId, closed: bool) -> Result<(), StoreError> {
        let until = Instant::now() + Duration::from_secs(5);
        while !self.reached(id, closed).await {
            if Instant::now() >= until {
                return Err(StoreError::Unavailable("the claim waited in vain".into()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

#[async_trait]
impl IdempotencyStore for FaultyKeys {
    async fn claim(
        &self,
        key_hash: &str,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.check()?;
        let id = record.execution_id;
        if self.after_publish.load(Ordering::SeqCst) {
            self.wait_for(id, false).await?;
        }
        if self.after_close.load(Ordering::SeqCst) {
            self.wait_for(id, true).await?;
        }
        self.inner.claim(key_hash, record).await
    }
    async fn bound(&self, key_hash: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.check()?;
        self.inner.bound(key_hash).await
    }
    async fn release(&self, key_hash: &str, execution_id: ExecutionId) -> Result<(), StoreError> {
        self.check()?;
        self.inner.release(key_hash, execution_id).await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.check()
    }
}

struct Harness {
    app: axum::Router,
    /// A second gateway over the same stores: it has not seen the first one's keys bound.
    other_gateway: axum::Router,
    store: Arc<MemoryEventStore>,
    queue: Arc<MemoryJobQueue>,
    gateway_store: Arc<FaultyStore>,
    gateway_queue: Arc<FaultyQueue>,
    gateway_keys: Arc<FaultyKeys>,
    provider: FakeProvider,
    pool: Option<WorkerPool>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            // Stops the workers; nothing is awaited here.
            drop(tokio::spawn(pool.shutdown(Duration::ZERO)));
        }
    }
}

/// A gateway whose `create` suffers `create_fault` for the next `creates` executions and whose
/// `publish` suffers `publish_fault` for the next `publishes`, with four workers sharing the
/// memory stores.
async fn harness(create_fault: (Fault, usize), publish_fault: (Fault, usize)) -> Harness {
    harness_with(create_fault, publish_fault, Duration::from_millis(50)).await
}

/// [`harness`] whose replays wait `replay_wait` for the log of a key bound lately.
async fn harness_with(
    create_fault: (Fault, usize),
    publish_fault: (Fault, usize),
    replay_wait: Duration,
) -> Harness {
    // The provider fails every call (500): an execution that reaches it ends quickly, and the
    // call is counted either way.
    harness_replying(
        create_fault,
        publish_fault,
        replay_wait,
        Reply::text(500, ""),
    )
    .await
}

/// [`harness_with`] whose provider answers every call with `reply`.
async fn harness_replying(
    create_fault: (Fault, usize),
    publish_fault: (Fault, usize),
    replay_wait: Duration,
    reply: Reply,
) -> Harness {
    let provider = FakeProvider::start(move |_| reply.clone()).await;
    let config = TextProviderConfig {
        id: "openai-chat".into(),
        model: "model-alpha".into(),
        abilities: vec!["text-generation".into()],
        api_key_env: "MRT_TEST_KEY_NOT_READ".into(),
        base_url: BaseUrl::parse(&format!("{}/v1", provider.origin())).unwrap(),
        input_modalities: vec![protocol::request::Modality::Text],
        tools: false,
        flow: FlowLimits::CONFIG_DEFAULT,
    };
    let mut registry = ProviderRegistry::new();
    registry
        .register(
            Arc::new(OpenAiChatProvider::new(
                &config,
                KeySource::Fixed(Secret::new("test-key")),
            )),
            16,
            64,
        )
        .unwrap();
    let registry = Arc::new(registry);
    let store = Arc::new(MemoryEventStore::new(MemoryLimits::default()));
    let queue = Arc::new(MemoryJobQueue::new());
    let cancel = Arc::new(MemoryCancelBus::new());
    let store_outage = Arc::new(AtomicBool::new(false));
    let gateway_store = Arc::new(FaultyStore {
        inner: store.clone(),
        creates: Faults::new(create_fault.0, create_fault.1),
        outage: store_outage.clone(),
        create_outage: AtomicBool::new(false),
    });
    let gateway_queue = Arc::new(FaultyQueue {
        inner: queue.clone(),
        publishes: Faults::new(publish_fault.0, publish_fault.1),
        withdraw_outage: AtomicBool::new(false),
        logs: store.clone(),
        store_outage,
    });
    let keys = Arc::new(MemoryIdempotencyStore::new(Duration::from_secs(600)));
    let gateway_keys = Arc::new(FaultyKeys {
        inner: keys.clone(),
        outage: AtomicBool::new(false),
        after_publish: AtomicBool::new(false),
        after_close: AtomicBool::new(false),
        queue: gateway_queue.clone(),
        store: store.clone(),
    });
    let backend = gateway::Backend {
        store: gateway_store.clone(),
        queue: gateway_queue.clone(),
        idempotency: gateway_keys.clone(),
        cancel: cancel.clone(),
        heal_missing: true,
        ..memory_backend()
    };
    let pool = gateway::embedded::spawn_pool(
        Arc::clone(&registry),
        store.clone(),
        queue.clone(),
        cancel,
        keys,
        4,
    );
    let limits = gateway::ApiLimits {
        replay_wait,
        ..gateway::ApiLimits::default()
    };
    let capabilities = registry.capabilities();
    Harness {
        app: gateway::router(gateway::AppState::new(
            backend.clone(),
            capabilities.clone(),
            limits.clone(),
        )),
        other_gateway: gateway::router(gateway::AppState::new(backend, capabilities, limits)),
        store,
        queue,
        gateway_store,
        gateway_queue,
        gateway_keys,
        provider,
        pool: Some(pool),
    }
}

/// One submission as the client saw it.
#[derive(Debug)]
struct Answer {
    text: String,
    status: StatusCode,
    body: Value,
    latency: Duration,
}

impl Harness {
    async fn submit(&self, text: &str, key: Option<&str>) -> Answer {
        self.submit_to(&self.app, text, key).await
    }

    /// [`Self::submit`], answered with `status`.
    async fn submit_expecting(&self, text: &str, key: Option<&str>, status: StatusCode) -> Answer {
        let answer = self.submit(text, key).await;
        assert_eq!(answer.status, status, "{answer:?}");
        answer
    }

    /// [`Self::submit`], answered 202 (a new execution).
    async fn accepted(&self, text: &str, key: Option<&str>) -> Answer {
        self.submit_expecting(text, key, StatusCode::ACCEPTED).await
    }

    /// [`Self::submit`] while the outcome cannot be settled: 503 within the submit bound.
    async fn submit_unsettled(&self, text: &str, key: Option<&str>) -> Answer {
        let answer = self
            .submit_expecting(text, key, StatusCode::SERVICE_UNAVAILABLE)
            .await;
        assert!(answer.latency <= Duration::from_secs(2), "{answer:?}");
        answer
    }

    async fn submit_to(&self, app: &axum::Router, text: &str, key: Option<&str>) -> Answer {
        let body =
            json!({ "ability": "text-generation", "input": [{ "type": "text", "text": text }] });
        let mut request = Request::builder()
            .method("POST")
            .uri("/v1/executions")
            .header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Body::from(body.to_string())).unwrap();
        let started = Instant::now();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        Answer {
            text: text.to_owned(),
            status,
            body: serde_json::from_slice(&bytes).unwrap(),
            latency: started.elapsed(),
        }
    }

    /// Submits `n` unkeyed executions one after another, with the texts `[label-0]`,
    /// `[label-1]`, ...
    async fn submit_each(&self, label: &str, n: usize) -> Vec<Answer> {
        let mut answers = Vec::new();
        for i in 0..n {
            answers.push(self.submit(&format!("[{label}-{i}]"), None).await);
        }
        answers
    }

    /// `mrt_submissions_run_after_503_total{keyed}` as the gateway's `/metrics` shows it.
    async fn run_after_503(&self, keyed: &str) -> f64 {
        let request = Request::get("/metrics").body(Body::empty()).unwrap();
        let response = self.app.clone().oneshot(request).await.unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap();
        let series = format!("mrt_submissions_run_after_503_total{{keyed=\"{keyed}\"}}");
        testkit::gateway::sample(&String::from_utf8_lossy(&bytes), &series)
            .expect("the series is exported")
    }

    /// Provider calls made for the execution submitted with `text`.
    fn calls_for(&self, text: &str) -> usize {
        self.provider
            .received()
            .iter()
            .filter(|r| r.json().to_string().contains(text))
            .count()
    }

    /// The event types of `id`'s log.
    async fn log_types(&self, id: ExecutionId) -> Vec<&'static str> {
        self.store
            .read(id, Sequence::ZERO, 100)
            .await
            .unwrap()
            .unwrap_or_default()
            .iter()
            .map(|r| r.event.type_name())
            .collect()
    }

    /// Waits until `id`'s log is terminal, returning its event types.
    async fn terminal_log(&self, id: ExecutionId) -> Vec<&'static str> {
        let until = Instant::now() + WAIT;
        loop {
            let head = self.store.head(id).await.unwrap();
            if head.is_some_and(|h| h.terminal) {
                return self.log_types(id).await;
            }
            assert!(
                Instant::now() < until,
                "{id} never reached a terminal event"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until no worker holds a delivery and no job is queued.
    async fn drained(&self) {
        let until = Instant::now() + WAIT;
        loop {
            let running = self.pool.as_ref().map_or(0, WorkerPool::running);
            // Jobs still held (waiting, or delivered and not acknowledged).
            let queued = self.queue.scan(0, 1).await.unwrap().is_empty();
            if running == 0 && queued {
                return;
            }
            assert!(Instant::now() < until, "the workers never went idle");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn execution_id(answer: &Answer) -> ExecutionId {
    let id = answer.body["execution_id"]
        .as_str()
        .expect("an execution id");
    id.parse().expect("a UUID")
}

/// Every submission hit by a fault answers 202 or 503 `unavailable` within 2 s; a 503 never
/// ran; a 202 ran once and ended.
async fn assert_consistent(h: &Harness, answers: &[Answer]) -> (usize, usize) {
    let (mut accepted, mut refused) = (0, 0);
    for answer in answers {
        assert!(
            answer.latency <= Duration::from_secs(2),
            "a submit took {:?}",
            answer.latency
        );
        match answer.status {
            StatusCode::ACCEPTED => {
                accepted += 1;
                let log = h.terminal_log(execution_id(answer)).await;
                assert_eq!(log.last(), Some(&"execution.failed"), "{log:?}");
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                refused += 1;
                assert_eq!(answer.body["error"]["code"], "unavailable", "{answer:?}");
            }
            other => panic!("unexpected answer {other}: {answer:?}"),
        }
    }
    h.drained().await;
    for answer in answers {
        let calls = h.calls_for(&answer.text);
        if answer.status == StatusCode::ACCEPTED {
            assert_eq!(calls, 1, "an accepted execution calls its provider once");
        } else {
            assert_eq!(calls, 0, "a submission answered 503 reached a provider");
        }
    }
    (accepted, refused)
}

/// One submission labelled `label` per execution the faults hit (each fault hits one
/// execution's first write), through a harness with those faults, checked by
/// [`assert_consistent`]; returns how many were accepted and how many answered 503.
async fn settle_under_faults(
    create_fault: (Fault, usize),
    publish_fault: (Fault, usize),
    label: &str,
) -> (usize, usize) {
    let h = harness(create_fault, publish_fault).await;
    let answers = h
        .submit_each(label, create_fault.1.max(publish_fault.1))
        .await;
    let (accepted, refused) = assert_consistent(&h, &answers).await;
    eprintln!("{label}: {accepted} accepted, {refused} answered 503");
    (accepted, refused)
}

/// A log creation that failed (nothing stored) while the job was published: the client gets
/// 503, the job is withdrawn, the provider is never called; the key is released, so a retry
/// creates and runs the execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_log_creation_failed_never_runs() {
    let h = harness((Fault::Lost, 8), (Fault::Lost, 0)).await;
    let answers = h.submit_each("lost-create", 8).await;
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        assert_eq!(answer.body["error"]["code"], "unavailable");
        assert_eq!(answer.body["error"]["retryable"], true);
    }
    // Give the workers every chance: wait until they are idle and the queue is empty.
    h.drained().await;
    for answer in &answers {
        assert_eq!(h.calls_for(&answer.text), 0, "{answer:?}");
    }

    // Keyed: the failure is certain, so the key is released and a retry creates a new
    // execution, which runs.
    let h = harness((Fault::Lost, 1), (Fault::Lost, 0)).await;
    h.submit_expecting(
        "keyed-lost-create",
        Some("k-1"),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    let retry = h.accepted("keyed-lost-create", Some("k-1")).await;
    let log = h.terminal_log(execution_id(&retry)).await;
    assert_eq!(log.first(), Some(&"execution.accepted"));
    h.drained().await;
    assert_eq!(h.calls_for("keyed-lost-create"), 1);
}

/// The log of a create that failed is closed before the job is withdrawn: with the queue
/// unable to withdraw anything, the log already reads closed, so the worker handed the job
/// drops it. A closed log settles the outcome: the answer is 503 within the bound, the key is
/// released, and a keyed retry creates a second execution, which runs; the first never reaches
/// the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_creates_log_is_closed_even_while_its_job_cannot_be_withdrawn() {
    let h = harness((Fault::Lost, 1), (Fault::Lost, 0)).await;
    h.gateway_queue
        .withdraw_outage
        .store(true, Ordering::SeqCst);
    h.submit_unsettled("closed-first", Some("k-closed-first"))
        .await;
    let first_id = h
        .gateway_store
        .creates
        .only("the failed create's execution");
    assert_eq!(
        h.log_types(first_id).await,
        ["execution.accepted", "execution.failed"]
    );
    let retry = h.accepted("closed-first", Some("k-closed-first")).await;
    assert_ne!(execution_id(&retry), first_id);
    h.terminal_log(execution_id(&retry)).await;
    h.drained().await;
    assert_eq!(h.calls_for("closed-first"), 1, "only the retry ran");
}

/// A log creation stored but unacknowledged, with workers racing for the job: each submission
/// is settled one way or the other, consistently with what ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_acknowledgement_was_lost_is_settled_consistently() {
    settle_under_faults((Fault::AckLost, 16), (Fault::Lost, 0), "ack-lost-create").await;
}

/// Task A: a job publish stored but unacknowledged (a JetStream election). The gateway closes
/// the log by compare-and-set; whoever appends sequence 2 first decides the answer: a 503's job
/// finds the log terminal and is dropped, a 202's job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_whose_acknowledgement_was_lost_is_settled_consistently() {
    settle_under_faults((Fault::Lost, 0), (Fault::AckLost, 16), "ack-lost-publish").await;
    // A publish that was not stored: the log is closed, nothing runs.
    let (accepted, _) =
        settle_under_faults((Fault::Lost, 0), (Fault::Lost, 4), "lost-publish").await;
    assert_eq!(accepted, 0, "an unstored job cannot be claimed");
}

/// A log creation or a job publish stored at once but acknowledged only after 3 s (a JetStream
/// publish waits up to the request timeout to be handed to a reconnecting connection, then as
/// long again for its acknowledgement): every submission is still answered within 2 s, a 503
/// never runs and a 202 runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_answered_after_the_bound_is_settled_within_it() {
    settle_under_faults((Fault::SlowAck, 3), (Fault::Lost, 0), "slow-create").await;
    settle_under_faults((Fault::Lost, 0), (Fault::SlowAck, 3), "slow-publish").await;
}

/// The residual window of `gateway::submit`: a job stored with its acknowledgement lost, and
/// the event store out of the gateway's reach until after the answer, so the gateway cannot
/// close the log and answers 503 while a worker claims the execution. Unkeyed, its submitter
/// cannot know it and may submit it again: once the store answers, the gateway cancels it,
/// which stops its provider call (here a response that never ends) and ends it `cancelled`.
/// Keyed, it runs on: a retry with its key replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_answered_503_that_a_worker_claimed_is_cancelled_unless_keyed() {
    let h = harness_replying(
        (Fault::Lost, 0),
        (Fault::AckLostThenOutage, 2),
        Duration::from_millis(50),
        Reply::Stream(vec![Piece::Stall]),
    )
    .await;
    let claimed_by_worker = |text: &'static str| {
        let h = &h;
        async move {
            let until = Instant::now() + WAIT;
            while h.calls_for(text) == 0 {
                assert!(Instant::now() < until, "{text}: no worker ran it");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    h.submit_unsettled("claimed-unkeyed", None).await;
    let unkeyed = h.gateway_queue.publishes.only("the unkeyed job");
    claimed_by_worker("claimed-unkeyed").await;
    h.gateway_store.outage.store(false, Ordering::SeqCst);
    h.submit_unsettled("claimed-keyed", Some("k-claimed")).await;
    let keyed = *h
        .gateway_queue
        .publishes
        .seen()
        .iter()
        .find(|id| **id != unkeyed)
        .expect("the keyed job");
    claimed_by_worker("claimed-keyed").await;
    h.gateway_store.outage.store(false, Ordering::SeqCst);

    let log = h.terminal_log(unkeyed).await;
    assert_eq!(
        log[..2],
        ["execution.accepted", "route.selected"],
        "{log:?}"
    );
    let records = h
        .store
        .read(unkeyed, Sequence::ZERO, 100)
        .await
        .unwrap()
        .unwrap();
    match &records.last().unwrap().event.body {
        protocol::event::EventBody::Failed { error } => {
            assert_eq!(error.code, protocol::ErrorCode::Cancelled, "{log:?}");
        }
        other => panic!("{log:?} ended with {other:?}"),
    }
    let until = Instant::now() + WAIT;
    while h.provider.bodies_dropped() == 0 {
        assert!(
            Instant::now() < until,
            "the provider call was never stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The keyed execution's background settle finds its claim too (and counts it, as the
    // unkeyed one's did); the retry the 503 asked for then replays it, still running.
    let until = Instant::now() + WAIT;
    while h.run_after_503("true").await < 1.0 {
        assert!(
            Instant::now() < until,
            "the keyed execution's claim was never found"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.run_after_503("false").await, 1.0);
    let retry = h.submit("claimed-keyed", Some("k-claimed")).await;
    assert!(
        matches!(retry.status, StatusCode::ACCEPTED | StatusCode::OK),
        "{retry:?}"
    );
    assert_eq!(execution_id(&retry), keyed);
    let head = h.store.head(keyed).await.unwrap().unwrap();
    assert!(!head.terminal, "the keyed execution was stopped");
    assert_eq!(
        h.provider.bodies_dropped(),
        1,
        "only the unkeyed call was stopped"
    );
    assert_eq!(h.calls_for("claimed-keyed"), 1);
}

/// A retry whose key is bound to an execution whose log does not exist yet (its first
/// submission is still creating it, or settling a failed creation) waits for the log only
/// within the submit bound: answered 503 within 2 s, creating nothing, while the binding is
/// younger than the replay wait (2 s, as deployed). Once older, a retry closes that execution
/// unrun by creating its log closed (here that creation fails too: 503 again, within the
/// bound). Once creations succeed again, a retry gets a fresh execution, which runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_for_a_missing_log_only_within_the_submit_bound() {
    let replay_wait = Duration::from_secs(2);
    let h = harness_with((Fault::Lost, 0), (Fault::Lost, 0), replay_wait).await;
    h.gateway_store.create_outage.store(true, Ordering::SeqCst);
    let first_at = Instant::now();
    h.submit_unsettled("missing-log", Some("k-missing")).await;
    let first_id = h.gateway_queue.publishes.only("the first submission's job");
    assert!(
        h.store.head(first_id).await.unwrap().is_none(),
        "no log yet"
    );
    let mut retries = Vec::new();
    while first_at.elapsed() < replay_wait + Duration::from_secs(1) {
        retries.push(h.submit("missing-log", Some("k-missing")).await);
    }
    for retry in &retries {
        assert_eq!(retry.status, StatusCode::SERVICE_UNAVAILABLE, "{retry:?}");
        assert!(retry.latency <= Duration::from_secs(2), "{retry:?}");
    }
    assert_eq!(
        h.gateway_queue.publishes.seen().len(),
        1,
        "only the first submission published a job"
    );
    h.gateway_store.create_outage.store(false, Ordering::SeqCst);
    let until = Instant::now() + WAIT;
    let retry = loop {
        let retry = h.submit("missing-log", Some("k-missing")).await;
        assert!(retry.latency <= Duration::from_secs(2), "{retry:?}");
        if retry.status != StatusCode::SERVICE_UNAVAILABLE {
            break retry;
        }
        assert!(Instant::now() < until, "never accepted: {retry:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        matches!(retry.status, StatusCode::ACCEPTED | StatusCode::OK),
        "{retry:?}"
    );
    h.terminal_log(execution_id(&retry)).await;
    h.drained().await;
    assert_eq!(h.calls_for("missing-log"), 1, "one execution ran, once");
}

/// When the outcome cannot be learnt within the submit bound (the event store is down), the
/// answer is 503 and the key stays bound while the outcome is unknown: a keyed retry then
/// cannot create a second execution (invariant 3). Once the outcome is settled (the log
/// closed unrun in the background when the store answers again), a retry with the same key,
/// as the 503's retry hint invites, creates the execution, which runs once; a further retry
/// replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_keeps_the_key_bound_until_settled_unrun() {
    let h = harness((Fault::Lost, 0), (Fault::Lost, 0)).await;
    h.gateway_store.outage.store(true, Ordering::SeqCst);
    h.submit_unsettled("unknown-outcome", Some("k-unknown"))
        .await;
    let first_id = h.gateway_queue.publishes.only("the first submission's job");
    // Still unknown: the retry finds the key bound and cannot read its execution.
    let unsettled = h.submit("unknown-outcome", Some("k-unknown")).await;
    assert_eq!(
        unsettled.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{unsettled:?}"
    );
    h.gateway_store.outage.store(false, Ordering::SeqCst);
    let until = Instant::now() + WAIT;
    while h
        .store
        .head(first_id)
        .await
        .unwrap()
        .is_none_or(|head| !head.terminal)
    {
        assert!(
            Instant::now() < until,
            "the first submission was never settled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        h.log_types(first_id).await,
        ["execution.accepted", "execution.failed"],
        "settled unrun"
    );
    let retry = h.accepted("unknown-outcome", Some("k-unknown")).await;
    assert_ne!(execution_id(&retry), first_id);
    let again = h
        .submit_expecting("unknown-outcome", Some("k-unknown"), StatusCode::OK)
        .await;
    assert_eq!(again.body["idempotent_replay"], true, "{again:?}");
    assert_eq!(again.body["execution_id"], retry.body["execution_id"]);
    h.terminal_log(execution_id(&retry)).await;
    h.drained().await;
    assert_eq!(h.calls_for("unknown-outcome"), 1, "the retry ran, once");
}

/// A keyed submission binds its key while the job is published, not before: here the key
/// store answers a claim only once the job of that execution was published. Were the claim
/// made first (as before), the job would wait for it and the claim would give up: a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_submission_binds_its_key_while_the_job_is_published() {
    let h = harness((Fault::Lost, 0), (Fault::Lost, 0)).await;
    h.gateway_keys.after_publish.store(true, Ordering::SeqCst);
    let first = h.accepted("bound-meanwhile", Some("k-meanwhile")).await;
    h.terminal_log(execution_id(&first)).await;
    h.drained().await;
    assert_eq!(h.calls_for("bound-meanwhile"), 1);
}

/// A retry reaching the gateway that saw its key bound claims the key first: it is answered
/// with the first execution and creates nothing (no job is published for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_to_the_gateway_that_saw_its_key_creates_nothing() {
    let h = harness((Fault::Lost, 0), (Fault::Lost, 0)).await;
    let first = h.accepted("seen-key", Some("k-seen")).await;
    let published = h.gateway_queue.publishes.seen.lock().len();
    for _ in 0..3 {
        let retry = h
            .submit_expecting("seen-key", Some("k-seen"), StatusCode::OK)
            .await;
        assert_eq!(retry.body["execution_id"], first.body["execution_id"]);
    }
    assert_eq!(h.gateway_queue.publishes.seen.lock().len(), published);
    // The other gateway has not seen the key: its retry creates an execution (discarded; the
    // answer may come before the creation, which goes on in the background).
    let elsewhere = h
        .submit_to(&h.other_gateway, "seen-key", Some("k-seen"))
        .await;
    assert_eq!(elsewhere.status, StatusCode::OK, "{elsewhere:?}");
    let until = Instant::now() + WAIT;
    while h.gateway_queue.publishes.seen.lock().len() < published + 1 {
        assert!(
            Instant::now() < until,
            "the retry's job was never published"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.drained().await;
    assert_eq!(h.gateway_queue.publishes.seen.lock().len(), published + 1);
    assert_eq!(h.calls_for("seen-key"), 1);
}

/// A retry's own execution is created and its job published before the gateway learns that
/// the key is bound: here a worker takes that job and finishes with it before the gateway's
/// claim is answered. The worker binds the key itself, finds it bound to the first execution,
/// and closes the retry's log unrun; the retry is answered with the first execution, and the
/// provider is called once in all. A different request under the same key is then refused
/// (422) without creating anything, since that gateway has seen the key bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrys_job_that_reaches_a_worker_first_never_runs() {
    let h = harness((Fault::Lost, 0), (Fault::Lost, 0)).await;
    let first = h.accepted("runs-once", Some("k-once")).await;
    let first_id = execution_id(&first);
    h.terminal_log(first_id).await;

    // The retry reaches the other gateway, which has not seen the key bound: it creates its
    // execution while binding the key.
    h.gateway_keys.after_close.store(true, Ordering::SeqCst);
    let retry = h
        .submit_to(&h.other_gateway, "runs-once", Some("k-once"))
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.body["idempotent_replay"], true, "{retry:?}");
    assert_eq!(execution_id(&retry), first_id);
    // Now that gateway has seen the key bound: a different request under it is refused
    // without creating anything.
    h.gateway_keys.after_close.store(false, Ordering::SeqCst);
    let conflict = h
        .submit_to(&h.other_gateway, "another request", Some("k-once"))
        .await;
    assert_eq!(
        conflict.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{conflict:?}"
    );
    assert_eq!(conflict.body["error"]["code"], "idempotency_conflict");

    h.drained().await;
    assert_eq!(
        h.calls_for("runs-once"),
        1,
        "the retry's execution never ran"
    );
    assert_eq!(h.calls_for("another request"), 0);
    let others: Vec<ExecutionId> = h
        .gateway_queue
        .publishes
        .seen()
        .into_iter()
        .filter(|id| *id != first_id)
        .collect();
    assert_eq!(
        others.len(),
        1,
        "the retry's job, and none for the conflict"
    );
    for id in others {
        let log = h.store.read(id, Sequence::ZERO, 10).await.unwrap().unwrap();
        let types: Vec<_> = log.iter().map(|r| r.event.type_name()).collect();
        assert_eq!(types, ["execution.accepted", "execution.failed"], "{id}");
        let failed = serde_json::to_value(&log[1].event).unwrap();
        assert_eq!(failed["error"]["message"], "Execution could not be queued");
    }
}

/// The key store is out of reach for the gateway but not for the workers: the first keyed
/// submission, made before the gateway knew, bound its key while creating its execution, so
/// whether the key was bound is unknown and a worker may bind it and run the execution. It is
/// settled one way or the other, consistently with what ran: a 503 never ran, a 202 ran once.
/// The gateway then claims keys first: while claims fail, keyed submissions publish nothing.
/// Once the store answers again, a submission claims first, and the next binds its key while
/// its job is published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_store_out_of_reach_is_settled_consistently() {
    let h = harness((Fault::Lost, 0), (Fault::Lost, 0)).await;
    h.gateway_keys.outage.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for i in 0..8 {
        let text = format!("[keys-down-{i}]");
        answers.push(h.submit(&text, Some(&format!("k-down-{i}"))).await);
    }
    let (accepted, refused) = assert_consistent(&h, &answers).await;
    eprintln!("key store down: {accepted} accepted, {refused} answered 503");
    assert_eq!(
        h.gateway_queue.publishes.seen.lock().len(),
        1,
        "only the first submission published a job"
    );
    assert!(
        answers[1..]
            .iter()
            .all(|a| a.status == StatusCode::SERVICE_UNAVAILABLE),
        "{answers:?}"
    );

    h.gateway_keys.outage.store(false, Ordering::SeqCst);
    h.accepted("[keys-back]", Some("k-back")).await;
    h.gateway_keys.after_publish.store(true, Ordering::SeqCst);
    h.accepted("[keys-concurrent]", Some("k-concurrent")).await;
}
