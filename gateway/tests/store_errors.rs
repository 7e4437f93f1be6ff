//! Store errors in the submission flow: each kind has one deliberate HTTP meaning, and a store
//! that refuses to create an execution's log is never reported as a successful submission.
//!
//! The crash window under test: a submitter bound the idempotency key and died before creating
//! the log (the key is never released). The retry finds the key, no log, and heals by closing
//! the recorded execution unrun (its log created closed) before binding the key anew. Only
//! `AlreadyExists` (the log was created meanwhile) sends it back to read the log; `Conflict` and
//! `Violation` are failures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use protocol::materialize::LogViolation;
use protocol::{ExecutionId, RuntimeEvent, Sequence};
use runtime::memory::{MemoryEventStore, MemoryIdempotencyStore, MemoryJobQueue, MemoryLimits};
use runtime::{EventStore, IdempotencyRecord, IdempotencyStore, StoreError};
use serde_json::{Value, json};
use testkit::gateway::{memory_backend, standalone_capabilities};
use tower::ServiceExt;

/// A memory store whose `create` always fails with one error.
struct RefusingStore {
    inner: MemoryEventStore,
    create_error: StoreError,
}

#[async_trait]
impl runtime::intercept::Intercept for RefusingStore {
    fn inner(&self) -> &dyn EventStore {
        &self.inner
    }
    async fn create_owned(
        &self,
        _accepted: RuntimeEvent,
        _owner: &protocol::Tenant,
    ) -> Result<(), StoreError> {
        Err(self.create_error.clone())
    }
}

/// A memory idempotency store whose `release` is lost, as when the submitter crashes before
/// releasing its key.
struct CrashingSubmitterKeys(MemoryIdempotencyStore);

#[async_trait]
impl IdempotencyStore for CrashingSubmitterKeys {
    async fn claim(
        &self,
        key_hash: &str,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.0.claim(key_hash, record).await
    }
    async fn bound(&self, key_hash: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.0.bound(key_hash).await
    }
    async fn release(&self, _key_hash: &str, _id: ExecutionId) -> Result<(), StoreError> {
        Ok(())
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.0.ready().await
    }
}

struct Harness {
    app: axum::Router,
    queue: Arc<MemoryJobQueue>,
}

fn harness(create_error: StoreError) -> Harness {
    let queue = Arc::new(MemoryJobQueue::new());
    let backend = gateway::Backend {
        store: Arc::new(RefusingStore {
            inner: MemoryEventStore::new(MemoryLimits::default()),
            create_error,
        }),
        queue: queue.clone(),
        idempotency: Arc::new(CrashingSubmitterKeys(MemoryIdempotencyStore::new(
            Duration::from_secs(60),
        ))),
        // Distributed semantics: a bound key without a log is a crash window to heal.
        heal_missing: true,
        ..memory_backend()
    };
    let limits = gateway::ApiLimits {
        replay_wait: Duration::from_millis(10),
        ..gateway::ApiLimits::default()
    };
    let state = gateway::AppState::new(backend, standalone_capabilities(), limits);
    Harness {
        app: gateway::router(state),
        queue,
    }
}

/// Submits the same request with the same key; returns the status and JSON body.
async fn submit(app: &axum::Router) -> (StatusCode, Value) {
    let body = json!({ "ability": "text-generation", "input": [{ "type": "text", "text": "hi" }] });
    let request = Request::builder()
        .method("POST")
        .uri("/v1/executions")
        .header("content-type", "application/json")
        .header("idempotency-key", "store-errors-1")
        .body(Body::from(body.to_string()))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, serde_json::from_slice(&bytes).expect("JSON body"))
}

fn assert_internal_error(status: StatusCode, body: &Value) {
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["error"]["code"], "internal_error", "{body}");
    assert_eq!(body["error"]["retryable"], false, "{body}");
}

#[tokio::test]
async fn a_conflict_on_create_is_never_reported_as_success() {
    let h = harness(StoreError::Conflict {
        last: Sequence(1),
        terminal: false,
    });
    // The first submission binds the key, fails to create the log and (crashing) keeps the key.
    let (status, body) = submit(&h.app).await;
    assert_internal_error(status, &body);
    // The retry heals the crash window; the store refuses again with `Conflict`.
    let (status, body) = submit(&h.app).await;
    assert_internal_error(status, &body);
    assert!(
        h.queue.take_pending().is_empty(),
        "no job for a log that was never created"
    );
}

#[tokio::test]
async fn a_log_violation_on_create_is_never_reported_as_success() {
    let h = harness(StoreError::Violation(LogViolation::AfterTerminal));
    let (status, body) = submit(&h.app).await;
    assert_internal_error(status, &body);
    let (status, body) = submit(&h.app).await;
    assert_internal_error(status, &body);
    assert!(h.queue.take_pending().is_empty());
}

#[tokio::test]
async fn an_existing_log_while_healing_is_read_not_taken_for_success() {
    let h = harness(StoreError::AlreadyExists);
    // A freshly minted id that already has a log is a failure, not an acceptance.
    let (status, body) = submit(&h.app).await;
    assert_internal_error(status, &body);
    // While healing, an existing log was created meanwhile: the retry reads it again, and
    // while it cannot (this store never shows it) the answer is a retryable 503, never a
    // replay of something unseen.
    let (status, body) = submit(&h.app).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
}

#[tokio::test]
async fn an_unavailable_store_is_a_retryable_503() {
    let h = harness(StoreError::Unavailable("test outage".into()));
    let (status, body) = submit(&h.app).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    assert!(
        !body.to_string().contains("test outage"),
        "internals stay in the logs: {body}"
    );
}
