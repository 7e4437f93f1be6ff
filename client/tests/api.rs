//! The client against a real embedded gateway: every endpoint, idempotency, error shapes and
//! codes, cancellation, cursors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use model_runtime_client::{
    Client, ClientError, IdempotencyKey, RetryPolicy, SubmitOptions, Transcript, text_request,
};
use protocol::snapshot::RuntimeState;
use protocol::{ErrorCode, EventBody, ExecutionId, ExecutionStatus, RuntimeEvent, Sequence};
use serde_json::json;
use support::*;

async fn collect(client: &Client, id: ExecutionId, after: u64) -> Vec<RuntimeEvent> {
    let mut stream = client.events(id, Sequence(after)).unwrap();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item.unwrap());
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_stream_get_and_result_of_the_default_mock() {
    let gw = Gateway::start_default().await;
    let client = gw.client();
    let submission = submit_plain(&client, "text-generation", "hi")
        .await
        .unwrap();
    assert_eq!(submission.status, ExecutionStatus::Accepted);
    assert!(!submission.idempotent_replay);

    let events = collect(&client, submission.execution_id, 0).await;
    let types: Vec<&str> = events.iter().map(RuntimeEvent::type_name).collect();
    assert_eq!(types, testkit::gateway::MOCK_TYPES);
    let mut transcript = Transcript::new();
    events.iter().for_each(|e| transcript.apply(e));
    assert_eq!(transcript.text(), "hello from mock");
    assert_eq!(transcript.usage.len(), 2);

    let snapshot = client.get(submission.execution_id).await.unwrap();
    assert_eq!(snapshot.status, ExecutionStatus::Succeeded);
    assert_eq!(snapshot.last_sequence, Sequence(7));
    let result = client.result(submission.execution_id).await.unwrap();
    assert_eq!(result.execution_id, submission.execution_id);
    assert_eq!(
        result.result.unwrap()["outputs"][0]["text"],
        json!("hello from mock")
    );
    assert!(result.artifacts.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_info_and_providers() {
    let gw = Gateway::start_default().await;
    let client = gw.client();
    let info = client.runtime_info().await.unwrap();
    assert_eq!(info.name, "model-runtime-api");
    assert_eq!(info.protocol_version, "0.1.0");
    assert_eq!(info.state, RuntimeState::Ready);
    assert_eq!(info.provider_count, 1);
    let providers = client.providers().await.unwrap();
    assert_eq!(providers.len(), 1);
    assert_eq!(providers[0].provider, "provider-mock");
    assert_eq!(providers[0].models[0].model, "model-alpha");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_replay_and_conflict() {
    let gw = Gateway::start_default().await;
    let client = gw.client();
    let key = IdempotencyKey::generate();
    let options = SubmitOptions::with_key(key.clone());
    let first = client
        .submit(&text_request("text-generation", "a"), &options)
        .await
        .unwrap();
    let again = client
        .submit(&text_request("text-generation", "a"), &options)
        .await
        .unwrap();
    assert_eq!(again.execution_id, first.execution_id);
    assert!(again.idempotent_replay);
    assert!(!first.idempotent_replay);

    let conflict = client
        .submit(&text_request("text-generation", "b"), &options)
        .await
        .unwrap_err();
    let ClientError::Api(api) = &conflict else {
        panic!("{conflict:?}");
    };
    assert_eq!(api.status, 422);
    assert_eq!(api.code, ErrorCode::IdempotencyConflict);
    assert!(!conflict.is_retryable());
    assert_eq!(conflict.code(), Some(ErrorCode::IdempotencyConflict));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_carry_code_status_and_retryable() {
    let gw = Gateway::start_default().await;
    let client = gw.client();
    let unknown = ExecutionId::new_random();

    for error in [
        client.get(unknown).await.unwrap_err(),
        client.result(unknown).await.unwrap_err(),
    ] {
        let ClientError::Api(api) = &error else {
            panic!("{error:?}");
        };
        assert_eq!((api.status, api.code), (404, ErrorCode::NotFound));
        assert!(!error.is_retryable());
    }
    let mut stream = client.events(unknown, Sequence::ZERO).unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Err(ClientError::Api(ref api))) if api.code == ErrorCode::NotFound
    ));
    assert!(stream.next().await.is_none());
    assert!(
        !client.cancel(unknown).await.unwrap(),
        "cancel of an unknown id is false"
    );

    let invalid = client
        .submit_json(
            &json!({"ability": "", "input": []}),
            &SubmitOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&invalid, ClientError::Api(api) if api.status == 400 && api.code == ErrorCode::InvalidRequest),
        "{invalid:?}"
    );
    let unserved = submit_plain(&client, "image-generation", "x")
        .await
        .unwrap_err();
    assert_eq!(unserved.code(), Some(ErrorCode::CapabilityUnavailable));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_before_success_are_not_ready_with_status_and_error() {
    let gw = slow_gateway().await;
    let client = gw.client();
    let id = submit_text(&client, "slow").await;
    let running = client.result(id).await.unwrap_err();
    let ClientError::NotReady(not_ready) = &running else {
        panic!("{running:?}");
    };
    assert!(!not_ready.status.is_terminal());
    assert!(not_ready.error.is_none());
    assert_eq!(running.code(), None);

    assert!(
        client.cancel(id).await.unwrap(),
        "cancel of a running execution"
    );
    let events = collect(&client, id, 0).await;
    let last = events.last().unwrap();
    assert_eq!(last.status, ExecutionStatus::Cancelled);
    assert!(
        matches!(&last.body, EventBody::Failed { error } if error.code == ErrorCode::Cancelled)
    );
    assert!(
        !client.cancel(id).await.unwrap(),
        "cancel of a terminal execution"
    );

    let cancelled = client.result(id).await.unwrap_err();
    assert_eq!(cancelled.code(), Some(ErrorCode::Cancelled));
    assert!(!cancelled.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_executions_end_the_stream_with_the_failure() {
    let gw = failing_gateway().await;
    let client = gw.client();
    let id = submit_text(&client, "x").await;
    let events = collect(&client, id, 0).await;
    let last = events.last().unwrap();
    assert_eq!(last.status, ExecutionStatus::Failed);
    let EventBody::Failed { error } = &last.body else {
        panic!("{last:?}");
    };
    assert_eq!(error.code, ErrorCode::ProviderUnavailable);
    let not_ready = client.result(id).await.unwrap_err();
    assert_eq!(not_ready.code(), Some(ErrorCode::ProviderUnavailable));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_resume_strictly_after_and_end_at_the_terminal_event() {
    let gw = Gateway::start_default().await;
    let client = gw.client();
    let id = submit_text(&client, "hi").await;
    wait_terminal(&client, id).await;
    let tail = collect(&client, id, 3).await;
    let seqs: Vec<u64> = tail.iter().map(|e| e.sequence.get()).collect();
    assert_eq!(seqs, [4, 5, 6, 7]);
    // At and past the terminal cursor: an empty stream, which is not an error.
    assert!(collect(&client, id, 7).await.is_empty());
    assert!(collect(&client, id, 1000).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_failures_are_retryable_unavailable_errors() {
    // A port with nothing listening.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = Client::builder(&format!("http://{addr}"))
        .retry(RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        })
        .build()
        .unwrap();
    let error = client.runtime_info().await.unwrap_err();
    assert!(matches!(error, ClientError::Transport { .. }), "{error:?}");
    assert_eq!(error.code(), Some(ErrorCode::Unavailable));
    assert!(error.is_retryable());
}

#[tokio::test]
async fn unsafe_base_urls_are_rejected() {
    for bad in [
        "http://user:pw@127.0.0.1:4320",
        "http://127.0.0.1:4320/?token=1",
        "http://127.0.0.1:4320/#x",
        "ws://127.0.0.1:4320",
    ] {
        assert!(
            matches!(Client::new(bad), Err(ClientError::InvalidBaseUrl(_))),
            "{bad}"
        );
    }
    assert!(Client::new("https://runtime.example.com/prefix").is_ok());
}
