//! The `anthropic-messages` and `fal-queue` adapters end to end: each test starts a fake
//! provider (`testkit::fake_provider`) that replays a transcript in the provider's real wire format,
//! runs a job through `worker::runner::Runner` over the in-memory stores, and checks the exact
//! event log, the materialized snapshot, the error, and what the fake provider received.
//! References `[R n]` are to `docs/reference-behaviours.md`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use config::{BaseUrl, FlowLimits};
use protocol::event::{EventBody, ExecutionStatus, OutputArtifact, ProgressPhase};
use protocol::request::Modality;
use protocol::{ErrorCode, RuntimeError, Target, UsageFact, UsageSource, UsageUnit};
use runtime::CancelBus;
use serde_json::{Value, json};
use support::*;
use testkit::fake_provider::{FakeProvider, Piece, Received, Reply};
use testkit::logs::Logs;
use tokio_util::sync::CancellationToken;
use worker::provider::anthropic_messages::AnthropicMessagesProvider;
use worker::provider::credential::{KeySource, Secret};
use worker::provider::fal_queue::{FalConfig, FalOptions, FalQueueProvider};
use worker::provider::mock::{MockConfig, MockProvider};
use worker::provider::text::TextProviderConfig;
use worker::provider::{Provider, ProviderCall, ProviderEvent, ProviderSink};
use worker::runner::RunOutcome;

const CANARY: &str = "sk-ant-CANARY-7f3e9d1c";
const CLAUDE: &str = "claude-sonnet-4-5";
const FAL_MODEL: &str = "fal-ai/flux/dev";
const REQUEST_ID: &str = "764cabcf-b745-4b3e-ae38-1200304cf45b";

// =============================================================================================
// The fake provider's answers

/// What happens after the last chunk of a streamed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// The body ends cleanly.
    End,
    /// The connection stays open and silent.
    Stall,
    /// The connection is aborted (a body error on the server side) shortly afterwards.
    Abort,
}

fn event_stream(chunks: Vec<String>, tail: Tail) -> Reply {
    let mut pieces: Vec<Piece> = chunks.into_iter().map(Piece::text).collect();
    match tail {
        Tail::End => {}
        Tail::Stall => pieces.push(Piece::Stall),
        // After a pause, so that what came before is on the wire first.
        Tail::Abort => pieces.extend([Piece::Pause(Duration::from_millis(100)), Piece::Cut]),
    }
    Reply::Stream(pieces)
}

fn json_response(status: StatusCode, value: Value) -> Reply {
    Reply::json(status.as_u16(), &value)
}

fn text_response(status: StatusCode, text: &str) -> Reply {
    Reply::text(status.as_u16(), text)
}

/// An error answer that echoes the credential, as a misbehaving proxy might.
fn echoing_error(status: StatusCode, received: &Received) -> Reply {
    let key = received
        .header("x-api-key")
        .or(received.header("authorization"))
        .unwrap_or_default()
        .to_owned();
    let response = json_response(
        status,
        json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {key}")}}),
    );
    if status == StatusCode::TOO_MANY_REQUESTS {
        response.with_header("retry-after", "17")
    } else {
        response
    }
}

/// Statuses a provider rejects a request with, and how each maps.
const REJECTIONS: [(StatusCode, ErrorCode, bool); 4] = [
    (
        StatusCode::BAD_REQUEST,
        ErrorCode::ProviderUnavailable,
        false,
    ),
    (
        StatusCode::UNAUTHORIZED,
        ErrorCode::ProviderUnavailable,
        false,
    ),
    (StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited, true),
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::ProviderUnavailable,
        true,
    ),
];

/// The error of a request rejected with `status`.
fn rejected(status: StatusCode, code: ErrorCode, retryable: bool) -> RuntimeError {
    RuntimeError::new(
        code,
        format!("Provider request failed with status {}", status.as_u16()),
        retryable,
    )
    .with_provider_code(status.as_u16().to_string())
}

/// The error of a request the provider answered with `status` once it may no longer be
/// retried (after a fal submit was accepted).
fn status_error(status: StatusCode) -> RuntimeError {
    rejected(status, ErrorCode::ProviderUnavailable, false)
}

fn base_url(server: &FakeProvider) -> BaseUrl {
    BaseUrl::parse(server.origin()).unwrap()
}

/// Every event, the snapshot and the logs (if captured) are free of the canary credential.
async fn assert_no_canary(h: &Harness, id: protocol::ExecutionId, logs: Option<&Logs>) {
    h.assert_no_canary(id, logs.map(Logs::text).as_deref())
        .await;
}

// =============================================================================================
// Harness pieces

fn anthropic_config(base_url: BaseUrl, tools: bool, inputs: &[Modality]) -> TextProviderConfig {
    TextProviderConfig {
        id: "anthropic".into(),
        model: CLAUDE.into(),
        abilities: vec!["text-generation".into()],
        api_key_env: "MRT_TEST_UNSET_ANTHROPIC_KEY".into(),
        base_url,
        input_modalities: inputs.to_vec(),
        tools,
        flow: FlowLimits::CONFIG_DEFAULT,
    }
}

fn anthropic(server: &FakeProvider, tools: bool) -> Arc<dyn Provider> {
    anthropic_with(
        anthropic_config(
            base_url(server),
            tools,
            &[Modality::Text, Modality::Json, Modality::Image],
        ),
        KeySource::Fixed(Secret::new(CANARY)),
    )
}

fn anthropic_with(config: TextProviderConfig, key: KeySource) -> Arc<dyn Provider> {
    Arc::new(AnthropicMessagesProvider::new(&config, key))
}

fn fal_config(base_url: BaseUrl, model: &str) -> FalConfig {
    FalConfig {
        id: "fal".into(),
        model: model.into(),
        ability: "image-generation".into(),
        api_key_env: "MRT_TEST_UNSET_FAL_KEY".into(),
        base_url,
        input_modalities: vec![Modality::Text, Modality::Json, Modality::Image],
        output_modalities: vec![Modality::Image],
        flow: FlowLimits::CONFIG_DEFAULT,
    }
}

fn fast() -> FalOptions {
    FalOptions {
        poll_interval: Duration::from_millis(5),
        max_polls: 1000,
        cancel_timeout: Duration::from_secs(5),
    }
}

fn fal(server: &FakeProvider, options: FalOptions) -> Arc<dyn Provider> {
    Arc::new(FalQueueProvider::new(
        &fal_config(base_url(server), FAL_MODEL),
        KeySource::Fixed(Secret::new(CANARY)),
        options,
    ))
}

/// A mock registered after the adapter under test, serving `ability`.
fn fallback_mock(ability: &str) -> Arc<dyn Provider> {
    Arc::new(MockProvider::new(MockConfig {
        id: "mock".into(),
        abilities: vec![ability.into()],
        ..MockConfig::default()
    }))
}

fn harness(providers: Vec<Arc<dyn Provider>>) -> Harness {
    Harness::new(providers.into_iter().map(|p| (p, DEFAULT_LIMITS)).collect())
}

fn claude() -> Target {
    Target {
        provider: "anthropic".into(),
        model: CLAUDE.into(),
    }
}

fn fal_target() -> Target {
    Target {
        provider: "fal".into(),
        model: FAL_MODEL.into(),
    }
}

fn mock_target() -> Target {
    Target {
        provider: "mock".into(),
        model: "model-alpha".into(),
    }
}

fn route(target: Target, attempt: u32) -> EventBody {
    EventBody::RouteSelected { target, attempt }
}

fn text_delta(output_index: u32, text: &str) -> EventBody {
    EventBody::OutputDelta {
        output_index,
        delta: text.into(),
    }
}

fn queued() -> EventBody {
    EventBody::Progress {
        phase: ProgressPhase::Queued,
        progress: None,
    }
}

fn processing() -> EventBody {
    EventBody::Progress {
        phase: ProgressPhase::Processing,
        progress: None,
    }
}

fn facts(pairs: &[(UsageUnit, f64)]) -> Vec<UsageFact> {
    pairs
        .iter()
        .map(|(unit, q)| UsageFact::new(unit.clone(), *q, UsageSource::Provider).unwrap())
        .collect()
}

/// A request body for `ability` with `input` parts and optional extra top-level members.
fn request_json(ability: &str, input: Value, extra: Value) -> String {
    let mut request = json!({"ability": ability, "input": input});
    if let Value::Object(extra) = extra {
        request.as_object_mut().unwrap().extend(extra);
    }
    request.to_string()
}

fn chat(extra: Value) -> String {
    request_json(
        "text-generation",
        json!([{"type": "text", "text": "What is the weather in San Francisco?"}]),
        extra,
    )
}

async fn run(h: &Harness, request: &str, deadline: Duration) -> protocol::ExecutionId {
    let job = h.submit(request, deadline).await;
    let outcome = within("the run ends", PATIENCE, h.runner.run(&job, 1)).await;
    assert_eq!(outcome, RunOutcome::Finished);
    job.execution_id
}

/// The routing member that allows fallback.
fn fallback() -> Value {
    json!({"routing": {"allow_fallback": true}})
}

/// Runs `request` on `adapter` with a mock serving `ability` registered behind it.
async fn run_with_fallback(
    adapter: Arc<dyn Provider>,
    ability: &str,
    request: &str,
    deadline: Duration,
) -> (Harness, protocol::ExecutionId) {
    let h = harness(vec![adapter, fallback_mock(ability)]);
    let id = run(&h, request, deadline).await;
    (h, id)
}

/// Runs a chat request on anthropic, with the mock behind it and fallback allowed.
async fn claude_with_fallback(
    server: &FakeProvider,
    deadline: Duration,
) -> (Harness, protocol::ExecutionId) {
    let adapter = anthropic(server, false);
    run_with_fallback(adapter, "text-generation", &chat(fallback()), deadline).await
}

/// Runs an image request on fal, with the mock behind it and fallback allowed.
async fn fal_with_fallback(
    server: &FakeProvider,
    options: FalOptions,
) -> (Harness, protocol::ExecutionId) {
    let adapter = fal(server, options);
    run_with_fallback(
        adapter,
        "image-generation",
        &image_request(fallback()),
        LONG,
    )
    .await
}

/// Awaits `run` (a run with the mock behind the adapter and fallback allowed:
/// [`claude_with_fallback`], [`fal_with_fallback`]) and checks that its one attempt, at
/// `target`, failed the execution with `error` after the `middle` events.
async fn fails_at(
    run: impl std::future::Future<Output = (Harness, protocol::ExecutionId)>,
    target: Target,
    middle: &[EventBody],
    error: RuntimeError,
) -> (Harness, protocol::ExecutionId) {
    let (h, id) = run.await;
    h.assert_log(id, &failed_after(target, middle, error)).await;
    (h, id)
}

/// Checks that the log of `id` is one attempt at anthropic that failed the execution with
/// `error` after the `middle` events.
async fn assert_claude_failed(
    h: &Harness,
    id: protocol::ExecutionId,
    middle: &[EventBody],
    error: RuntimeError,
) {
    h.assert_log(id, &failed_after(claude(), middle, error))
        .await;
}

/// A non-retryable error with `code` and `message` that keeps the provider's own code.
fn coded(code: ErrorCode, message: &str, provider_code: &str) -> RuntimeError {
    not_retryable(code, message).with_provider_code(provider_code)
}

/// Runs `request` on `provider` alone and checks that it failed with `expected` (`what`
/// names the case); returns the harness and the execution.
async fn fails_alone(
    provider: Arc<dyn Provider>,
    request: &str,
    expected: RuntimeError,
    what: &str,
) -> (Harness, protocol::ExecutionId) {
    let h = harness(vec![provider]);
    let id = run(&h, request, LONG).await;
    assert_eq!(error_of(&h, id).await, expected, "{what}");
    (h, id)
}

async fn error_of(h: &Harness, id: protocol::ExecutionId) -> RuntimeError {
    h.snapshot(id).await.error.expect("the execution failed")
}

// =============================================================================================
// Anthropic transcripts (Messages API streaming format)

fn sse(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn message_start(input_tokens: u64) -> String {
    sse(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "content": [], "model": CLAUDE, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 128, "output_tokens": 1}
        }}),
    )
}

fn text_block_start(index: u32) -> String {
    sse(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    )
}

fn text_block_delta(index: u32, text: &str) -> String {
    sse(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
    )
}

fn block_stop(index: u32) -> String {
    sse(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

fn ping() -> String {
    sse("ping", json!({"type": "ping"}))
}

fn message_delta(stop_reason: &str, output_tokens: u64) -> String {
    sse(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": output_tokens}}),
    )
}

fn message_stop() -> String {
    sse("message_stop", json!({"type": "message_stop"}))
}

/// A plain text answer.
fn text_transcript() -> Vec<String> {
    vec![
        message_start(25),
        text_block_start(0),
        ping(),
        text_block_delta(0, "Hello"),
        text_block_delta(0, "!"),
        block_stop(0),
        message_delta("end_turn", 15),
        message_stop(),
    ]
}

/// Text, then a tool call whose arguments arrive in three fragments (the first empty), then
/// usage.
fn tool_transcript() -> Vec<String> {
    vec![
        message_start(472),
        text_block_start(0),
        text_block_delta(0, "Okay"),
        text_block_delta(0, ", let's check the weather for San Francisco, CA:"),
        block_stop(0),
        sse(
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {
                "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "get_weather", "input": {}}}),
        ),
        sse(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        ping(),
        sse(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"location\":"}}),
        ),
        sse(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": " \"San Francisco, CA\", \"unit\": \"fahrenheit\"}"}}),
        ),
        block_stop(1),
        message_delta("tool_use", 89),
        message_stop(),
    ]
}

fn tool_events() -> Vec<EventBody> {
    vec![
        EventBody::Accepted,
        route(claude(), 1),
        text_delta(0, "Okay"),
        text_delta(0, ", let's check the weather for San Francisco, CA:"),
        EventBody::ToolCallStarted {
            call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            name: "get_weather".into(),
        },
        EventBody::ToolCallArgumentsDelta {
            call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            delta: "{\"location\":".into(),
        },
        EventBody::ToolCallArgumentsDelta {
            call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            delta: " \"San Francisco, CA\", \"unit\": \"fahrenheit\"}".into(),
        },
        EventBody::UsageReported {
            facts: facts(&[
                (UsageUnit::input_token(), 472.0),
                (UsageUnit::output_token(), 89.0),
                (UsageUnit::cache_write_token(), 0.0),
                (UsageUnit::cache_read_token(), 128.0),
            ]),
        },
        EventBody::Completed { target: claude() },
    ]
}

/// An anthropic server whose stream starts a text block with `text`, then ends as `tail`
/// says.
async fn partial_text_server(text: &str, tail: Tail) -> FakeProvider {
    let transcript = vec![
        message_start(25),
        text_block_start(0),
        text_block_delta(0, text),
    ];
    FakeProvider::start(transcript_server(transcript, tail)).await
}

fn transcript_server(
    transcript: Vec<String>,
    tail: Tail,
) -> impl Fn(&Received) -> Reply + Send + Sync + 'static {
    move |_| event_stream(transcript.clone(), tail)
}

// =============================================================================================
// Anthropic: success paths [R 66-67]

#[tokio::test]
async fn anthropic_text_streams_and_the_request_is_built_as_documented() {
    let server = FakeProvider::start(transcript_server(text_transcript(), Tail::End)).await;
    let h = harness(vec![anthropic(&server, false)]);
    let request = request_json(
        "text-generation",
        json!([
            {"type": "text", "text": "Describe this"},
            {"type": "json", "value": {"units": "metric"}},
            {"type": "image", "uri": "https://img.example/cat.png", "media_type": "image/png"}
        ]),
        json!({"extensions": {"anthropic": {"request": {
            "system": "Answer briefly.", "temperature": 0.3,
            "model": "claude-other", "stream": false,
            "messages": [{"role": "assistant", "content": "injected"}]
        }}}}),
    );
    let id = run(&h, &request, LONG).await;

    let usage = facts(&[
        (UsageUnit::input_token(), 25.0),
        (UsageUnit::output_token(), 15.0),
        (UsageUnit::cache_write_token(), 0.0),
        (UsageUnit::cache_read_token(), 128.0),
    ]);
    let events = h
        .assert_log(
            id,
            &[
                EventBody::Accepted,
                route(claude(), 1),
                text_delta(0, "Hello"),
                text_delta(0, "!"),
                EventBody::UsageReported {
                    facts: usage.clone(),
                },
                EventBody::Completed { target: claude() },
            ],
        )
        .await;
    assert_eq!(events[5].status, ExecutionStatus::Succeeded);
    let snapshot = h.snapshot(id).await;
    assert_eq!(
        snapshot.result,
        Some(
            json!({"outputs": [{"index": 0, "type": "text", "text": "Hello!"}], "tool_calls": []})
        )
    );
    assert_eq!(snapshot.usage, usage);
    assert_eq!(snapshot.target, Some(claude()));

    let received = server.received();
    assert_eq!(received.len(), 1);
    let post = &received[0];
    assert_eq!(
        (post.method.clone(), post.path.as_str()),
        (Method::POST, "/v1/messages")
    );
    assert_eq!(post.header("x-api-key"), Some(CANARY));
    assert_eq!(post.header("anthropic-version"), Some("2023-06-01"));
    assert!(
        post.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    assert_eq!(post.header("authorization"), None);
    assert_eq!(
        post.json(),
        json!({
            "system": "Answer briefly.",
            "temperature": 0.3,
            "model": CLAUDE,
            "max_tokens": 1024,
            "stream": true,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Describe this"},
                {"type": "text", "text": "{\"units\":\"metric\"}"},
                {"type": "image", "source": {"type": "url", "url": "https://img.example/cat.png"}}
            ]}]
        })
    );
}

#[tokio::test]
async fn anthropic_base_path_is_kept_and_max_tokens_may_be_set() {
    let server = FakeProvider::start(transcript_server(text_transcript(), Tail::End)).await;
    let base = BaseUrl::parse(&format!("{}/proxy/anthropic/", server.origin())).unwrap();
    let provider = anthropic_with(
        anthropic_config(base, false, &[Modality::Text, Modality::Json]),
        KeySource::Fixed(Secret::new(CANARY)),
    );
    let h = harness(vec![provider]);
    let id = run(
        &h,
        &chat(json!({"extensions": {"anthropic": {"request": {"max_tokens": 4096}}}})),
        LONG,
    )
    .await;
    assert_eq!(h.snapshot(id).await.status, ExecutionStatus::Succeeded);
    let received = server.received();
    assert_eq!(received[0].path, "/proxy/anthropic/v1/messages");
    assert_eq!(received[0].json()["max_tokens"], json!(4096));
}

#[tokio::test]
async fn anthropic_two_text_blocks_are_two_outputs() {
    let transcript = vec![
        message_start(10),
        text_block_start(0),
        text_block_delta(0, "First"),
        text_block_delta(0, " answer."),
        block_stop(0),
        text_block_start(1),
        text_block_delta(1, "Second answer."),
        block_stop(1),
        message_delta("end_turn", 6),
        message_stop(),
    ];
    let server = FakeProvider::start(transcript_server(transcript, Tail::End)).await;
    let h = harness(vec![anthropic(&server, false)]);
    let id = run(&h, &chat(json!({})), LONG).await;
    let events = h.events(id).await;
    assert_eq!(
        events.iter().map(|e| e.body.clone()).collect::<Vec<_>>()[2..5],
        [
            text_delta(0, "First"),
            text_delta(0, " answer."),
            text_delta(1, "Second answer.")
        ]
    );
    assert_eq!(
        h.snapshot(id).await.result,
        Some(json!({"outputs": [
            {"index": 0, "type": "text", "text": "First answer."},
            {"index": 1, "type": "text", "text": "Second answer."}
        ], "tool_calls": []}))
    );
}

#[tokio::test]
async fn anthropic_tool_calls_with_split_arguments() {
    let server = FakeProvider::start(transcript_server(tool_transcript(), Tail::End)).await;
    let h = harness(vec![anthropic(&server, true)]);
    let tools = json!([{"name": "get_weather", "description": "Get the current weather",
                        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}}}]);
    let id = run(
        &h,
        &chat(json!({
            "requirements": {"tools": true},
            "extensions": {"anthropic": {"request": {"tools": tools, "tool_choice": {"type": "auto"}}}}
        })),
        LONG,
    )
    .await;
    h.assert_log(id, &tool_events()).await;
    let snapshot = h.snapshot(id).await;
    assert_eq!(
        snapshot.result,
        Some(json!({
            "outputs": [{"index": 0, "type": "text", "text": "Okay, let's check the weather for San Francisco, CA:"}],
            "tool_calls": [{"call_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather",
                            "arguments": "{\"location\": \"San Francisco, CA\", \"unit\": \"fahrenheit\"}"}]
        }))
    );
    let body = server.received()[0].json();
    assert_eq!(body["tools"], tools, "declared tools pass through");
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
}

#[tokio::test]
async fn anthropic_mapping_does_not_depend_on_chunking_or_line_endings() {
    let whole = tool_transcript().concat();
    for (size, crlf) in [(1, false), (7, true), (64, false), (4096, true)] {
        let text = if crlf {
            whole.replace('\n', "\r\n")
        } else {
            whole.clone()
        };
        let chunks: Vec<String> = text
            .as_bytes()
            .chunks(size)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let server = FakeProvider::start(transcript_server(chunks, Tail::End)).await;
        let h = harness(vec![anthropic(&server, true)]);
        let id = run(&h, &chat(json!({})), LONG).await;
        h.assert_log(id, &tool_events()).await;
    }
}

#[tokio::test]
async fn anthropic_stops_reading_at_message_stop() {
    // The provider keeps the connection open after message_stop: the attempt completes anyway.
    let server = FakeProvider::start(transcript_server(text_transcript(), Tail::Stall)).await;
    let h = harness(vec![anthropic(&server, false)]);
    let id = run(&h, &chat(json!({})), LONG).await;
    assert_eq!(h.snapshot(id).await.status, ExecutionStatus::Succeeded);
}

// =============================================================================================
// Anthropic: failures [R 61, 67, 31, 33]

#[tokio::test]
async fn anthropic_http_errors_map_by_status_and_retryable_ones_fall_back() {
    let (logs, _guard) = testkit::logs::capture();
    for (status, code, retryable) in REJECTIONS {
        let server = FakeProvider::start(move |r| echoing_error(status, r)).await;
        let (h, id) = claude_with_fallback(&server, LONG).await;
        let expected = rejected(status, code, retryable);
        if retryable {
            h.assert_log(id, &fell_back_to_mock(claude(), expected, mock_target()))
                .await;
        } else {
            h.assert_log(id, &failed_after(claude(), &[], expected))
                .await;
        }
        assert_eq!(
            server.received().len(),
            1,
            "{status}: one attempt at anthropic"
        );
        assert_no_canary(&h, id, Some(&logs)).await;
    }
}

#[tokio::test]
async fn anthropic_error_event_is_unavailable_and_never_falls_back() {
    let transcript = vec![
        message_start(25),
        sse(
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": format!("Overloaded {CANARY}")}}),
        ),
    ];
    let server = FakeProvider::start(transcript_server(transcript, Tail::Stall)).await;
    let (h, id) = fails_at(
        claude_with_fallback(&server, LONG),
        claude(),
        &[],
        coded(
            ErrorCode::ProviderUnavailable,
            "Provider reported a stream error",
            "overloaded_error",
        ),
    )
    .await;
    assert_no_canary(&h, id, None).await;
}

#[tokio::test]
async fn anthropic_stream_cut_mid_frame_is_a_protocol_error_after_output() {
    let mut transcript = vec![message_start(25), text_block_start(0)];
    transcript.push(text_block_delta(0, "Hel"));
    // Half of the next frame, then the body ends.
    let next = text_block_delta(0, "lo there");
    transcript.push(next[..next.len() / 2].to_owned());
    let server = FakeProvider::start(transcript_server(transcript, Tail::End)).await;
    let (h, id) = fails_at(
        claude_with_fallback(&server, LONG),
        claude(),
        &[text_delta(0, "Hel")],
        RuntimeError::stream_ended_early(),
    )
    .await;
    let error = error_of(&h, id).await;
    assert_eq!(
        error.message,
        "Provider stream ended without a completion event"
    );
    assert!(!error.retryable);
}

#[tokio::test]
async fn anthropic_connection_reset_after_output_does_not_fall_back() {
    let server = partial_text_server("partial", Tail::Abort).await;
    let (h, id) = claude_with_fallback(&server, LONG).await;
    let events = h.events(id).await;
    assert_eq!(type_names(&events), FAILED_AFTER_ONE_DELTA);
    let error = error_of(&h, id).await;
    assert_eq!(error.code, ErrorCode::ProviderUnavailable);
    assert!(!error.retryable);
}

#[tokio::test]
async fn anthropic_stalled_stream_hits_the_deadline() {
    let server = partial_text_server("Thinking", Tail::Stall).await;
    let started = tokio::time::Instant::now();
    let (h, id) = claude_with_fallback(&server, Duration::from_millis(400)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "ended promptly");
    assert_claude_failed(
        &h,
        id,
        &[text_delta(0, "Thinking")],
        RuntimeError::deadline_exceeded(),
    )
    .await;
}

#[tokio::test]
async fn anthropic_malformed_json_is_a_protocol_error() {
    let transcript = vec![
        message_start(25),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\n\n"
            .to_owned(),
    ];
    let server = FakeProvider::start(transcript_server(transcript, Tail::End)).await;
    let _ = fails_at(
        claude_with_fallback(&server, LONG),
        claude(),
        &[],
        not_retryable(
            ErrorCode::ProviderProtocolError,
            "Provider returned malformed JSON",
        ),
    )
    .await;
}

#[tokio::test]
async fn anthropic_tool_arguments_without_a_tool_block_are_a_protocol_error() {
    let transcript = vec![
        message_start(25),
        sse(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 4, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":1}"}}),
        ),
        message_stop(),
    ];
    let server = FakeProvider::start(transcript_server(transcript, Tail::End)).await;
    let h = harness(vec![anthropic(&server, true)]);
    let id = run(&h, &chat(json!({})), LONG).await;
    let error = error_of(&h, id).await;
    assert_eq!(
        (error.code, error.retryable),
        (ErrorCode::ProviderProtocolError, false)
    );
    assert_eq!(h.events(id).await.len(), 3, "no output before the failure");
}

#[tokio::test]
async fn anthropic_eof_before_message_stop_is_a_protocol_error() {
    let transcript = vec![message_start(25), ping()];
    let server = FakeProvider::start(transcript_server(transcript, Tail::End)).await;
    let _ = fails_at(
        claude_with_fallback(&server, LONG),
        claude(),
        &[],
        RuntimeError::stream_ended_early(),
    )
    .await;
}

// =============================================================================================
// Anthropic: capabilities and credentials [R 68, 78, 87]

#[tokio::test]
async fn anthropic_capabilities_come_only_from_the_declaration() {
    let server = FakeProvider::start(transcript_server(text_transcript(), Tail::End)).await;
    let provider = anthropic_with(
        anthropic_config(base_url(&server), false, &[Modality::Text, Modality::Json]),
        KeySource::Fixed(Secret::new(CANARY)),
    );
    let manifest = provider.manifest().clone();
    assert_eq!(manifest.provider, "anthropic");
    let model = &manifest.models[0];
    assert_eq!(model.model, CLAUDE);
    assert_eq!(model.abilities, ["text-generation"]);
    assert_eq!(model.input_modalities, [Modality::Text, Modality::Json]);
    assert_eq!(model.output_modalities, [Modality::Text]);
    assert!(model.stream && model.cancel);
    assert!(!model.tools && !model.structured_output && !model.r#async);

    let h = harness(vec![provider]);
    for refused in [
        chat(json!({"extensions": {"anthropic": {"request": {"tools": []}}}})),
        chat(json!({"extensions": {"anthropic": {"request": {"tool_choice": {"type": "any"}}}}})),
        chat(json!({"extensions": {"anthropic": {"request": "tools"}}})),
        chat(json!({"extensions": {"anthropic": ["request"]}})),
        chat(json!({"requirements": {"tools": true}})),
        chat(json!({"requirements": {"structured_output": true}})),
        chat(json!({"requirements": {"output_modalities": ["json"]}})),
        request_json(
            "text-generation",
            json!([{"type": "image", "uri": "https://img.example/a.png"}]),
            json!({}),
        ),
    ] {
        let request = protocol::validate::parse_request(refused.as_bytes()).unwrap();
        assert!(!h.registry.can_serve(&request), "{refused}");
        let id = run(&h, &refused, LONG).await;
        assert_eq!(
            error_of(&h, id).await,
            RuntimeError::capability_unavailable()
        );
    }
    assert!(server.received().is_empty(), "nothing reached the provider");
    // Extensions addressed to other providers are not this adapter's business.
    let other = chat(json!({"extensions": {"openai": {"request": {"tools": []}}}}));
    let request = protocol::validate::parse_request(other.as_bytes()).unwrap();
    assert!(h.registry.can_serve(&request));
}

#[tokio::test]
async fn anthropic_missing_credential_fails_without_a_request() {
    let server = FakeProvider::start(transcript_server(text_transcript(), Tail::End)).await;
    let provider = anthropic_with(
        anthropic_config(base_url(&server), false, &[Modality::Text]),
        KeySource::Env("MRT_TEST_SURELY_UNSET_ANTHROPIC_KEY".into()),
    );
    let _ = fails_alone(
        provider,
        &chat(json!({})),
        not_retryable(
            ErrorCode::ProviderUnavailable,
            "Required provider credential is unavailable",
        ),
        "the credential is unset",
    )
    .await;
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn anthropic_cancel_mid_stream() {
    let server = partial_text_server("Once upon", Tail::Stall).await;
    let h = harness(vec![anthropic(&server, false)]);
    let job = h.submit(&chat(json!({})), LONG).await;
    let id = job.execution_id;
    let running = spawn_run(&h, &job);
    wait_for_output(&h, id).await;
    h.bus.request(id).await.unwrap();
    finishes("cancel ends the run", running).await;
    assert_claude_failed(
        &h,
        id,
        &[text_delta(0, "Once upon")],
        RuntimeError::cancelled(),
    )
    .await;
}

// =============================================================================================
// fal transcripts (queue API format)

fn request_base(origin: &str) -> String {
    format!("{origin}/fal-ai/flux/requests/{REQUEST_ID}")
}

fn status_path() -> String {
    format!("/fal-ai/flux/requests/{REQUEST_ID}/status")
}

fn result_path() -> String {
    format!("/fal-ai/flux/requests/{REQUEST_ID}")
}

fn cancel_path() -> String {
    format!("/fal-ai/flux/requests/{REQUEST_ID}/cancel")
}

/// The submit answer: request id and the three lifecycle URLs on `origin`.
fn submitted(origin: &str) -> Value {
    let base = request_base(origin);
    json!({
        "status": "IN_QUEUE",
        "request_id": REQUEST_ID,
        "response_url": base,
        "status_url": format!("{base}/status"),
        "cancel_url": format!("{base}/cancel"),
        "queue_position": 0
    })
}

fn status_doc(origin: &str, status: &str) -> Value {
    let base = request_base(origin);
    let mut doc = json!({
        "status": status,
        "request_id": REQUEST_ID,
        "response_url": base,
        "status_url": format!("{base}/status"),
        "cancel_url": format!("{base}/cancel"),
        "logs": null,
        "metrics": {}
    });
    match status {
        "IN_QUEUE" => doc["queue_position"] = json!(1),
        "IN_PROGRESS" => {
            doc["logs"] = json!([
                {"message": "Loading model weights", "level": "INFO", "source": "USER", "timestamp": "2025-06-01T10:00:00.000Z"},
                {"message": "12%|█▏        | 3/28 [00:00<00:03]", "level": "INFO", "source": "USER", "timestamp": "2025-06-01T10:00:01.000Z"}
            ])
        }
        "COMPLETED" => doc["metrics"] = json!({"inference_time": 1.734}),
        _ => {}
    }
    doc
}

fn flux_result() -> Value {
    json!({
        "images": [
            {"url": "https://v3.fal.media/files/penguin/m8b1JdWHFYBJZAGCZ5jmE.jpeg",
             "content_type": "image/jpeg", "width": 1024, "height": 768},
            {"url": "https://v3.fal.media/files/koala/0xW9yRZ4f2ppvbdwbSKBr.jpeg",
             "content_type": "image/jpeg", "width": 1024, "height": 768}
        ],
        "timings": {"inference": 1.61},
        "seed": 1917493337,
        "has_nsfw_concepts": [false, false],
        "prompt": "a watercolor fox"
    })
}

fn flux_artifacts() -> Vec<OutputArtifact> {
    vec![
        OutputArtifact {
            uri: "https://v3.fal.media/files/penguin/m8b1JdWHFYBJZAGCZ5jmE.jpeg".into(),
            media_type: Some("image/jpeg".into()),
        },
        OutputArtifact {
            uri: "https://v3.fal.media/files/koala/0xW9yRZ4f2ppvbdwbSKBr.jpeg".into(),
            media_type: Some("image/jpeg".into()),
        },
    ]
}

/// A fal queue: submit at `/fal-ai/flux/dev`, then the status sequence `statuses` (the last
/// repeated forever), the result answered by `result`, cancel answered 202.
fn fal_queue(
    statuses: Vec<&'static str>,
    result: impl Fn() -> Reply + Send + Sync + 'static,
) -> impl Fn(&Received) -> Reply + Send + Sync + 'static {
    move |r: &Received| {
        let path = r.path.as_str();
        if r.method == Method::POST && path == "/fal-ai/flux/dev" {
            json_response(StatusCode::OK, submitted(&r.origin))
        } else if r.method == Method::GET && path == status_path() {
            let status = statuses[r.nth.min(statuses.len() - 1)];
            let code = if status == "COMPLETED" {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            json_response(code, status_doc(&r.origin, status))
        } else if r.method == Method::GET && path == result_path() {
            result()
        } else if r.method == Method::PUT && path == cancel_path() {
            json_response(
                StatusCode::ACCEPTED,
                json!({"status": "CANCELLATION_REQUESTED"}),
            )
        } else {
            text_response(StatusCode::NOT_FOUND, "not found")
        }
    }
}

/// A fal server that accepts every submit (a POST) and answers every other request with
/// `rest`.
async fn fal_accepting(rest: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> FakeProvider {
    FakeProvider::start(move |r: &Received| {
        if r.method == Method::POST {
            json_response(StatusCode::OK, submitted(&r.origin))
        } else {
            rest(r)
        }
    })
    .await
}

fn image_request(extra: Value) -> String {
    request_json(
        "image-generation",
        json!([{"type": "text", "text": "a watercolor fox"}]),
        extra,
    )
}

// =============================================================================================
// fal: success [R 69-70, 73]

#[tokio::test]
async fn fal_lifecycle_reports_progress_then_result_and_artifacts() {
    let server = FakeProvider::start(fal_queue(
        vec![
            "IN_QUEUE",
            "IN_QUEUE",
            "IN_PROGRESS",
            "IN_PROGRESS",
            "COMPLETED",
        ],
        || json_response(StatusCode::OK, flux_result()),
    ))
    .await;
    let h = harness(vec![fal(&server, fast())]);
    let request = request_json(
        "image-generation",
        json!([
            {"type": "text", "text": "a watercolor fox"},
            {"type": "json", "value": {"palette": ["ochre", "teal"]}},
            {"type": "image", "uri": "https://img.example/sketch.png"}
        ]),
        json!({"extensions": {"fal": {"input": {
            "num_images": 2, "image_size": "landscape_4_3",
            "prompt": "ignored", "image_urls": ["https://evil.example/x.png"]
        }}}}),
    );
    let id = run(&h, &request, LONG).await;

    let events = h
        .assert_log(
            id,
            &[
                EventBody::Accepted,
                route(fal_target(), 1),
                queued(),
                processing(),
                EventBody::OutputResult {
                    result: flux_result(),
                    artifacts: Some(flux_artifacts()),
                },
                EventBody::Completed {
                    target: fal_target(),
                },
            ],
        )
        .await;
    assert_eq!(events[2].status, ExecutionStatus::Running);
    let snapshot = h.snapshot(id).await;
    assert_eq!(snapshot.result, Some(flux_result()));
    assert_eq!(snapshot.artifacts, Some(flux_artifacts()));
    assert!(snapshot.usage.is_empty());

    let received = server.received();
    let submit = &received[0];
    assert_eq!(
        (submit.method.clone(), submit.path.as_str()),
        (Method::POST, "/fal-ai/flux/dev")
    );
    assert_eq!(
        submit.json(),
        json!({
            "num_images": 2,
            "image_size": "landscape_4_3",
            "prompt": "a watercolor fox\n{\"palette\":[\"ochre\",\"teal\"]}",
            "image_url": "https://img.example/sketch.png"
        })
    );
    let key = format!("Key {CANARY}");
    for r in &received {
        assert_eq!(r.header("authorization"), Some(key.as_str()), "{}", r.path);
    }
    assert_eq!(server.count(Method::GET, &status_path()), 5);
    assert_eq!(server.count(Method::GET, &result_path()), 1);
    assert_eq!(
        server.count(Method::PUT, &cancel_path()),
        0,
        "a completed request is never cancelled"
    );
    assert_eq!(received.len(), 7);
}

#[tokio::test]
async fn fal_several_images_are_sent_as_image_urls_and_the_model_slash_is_dropped() {
    let server = FakeProvider::start(fal_queue(vec!["COMPLETED"], || {
        json_response(
            StatusCode::OK,
            json!({"video": {"url": "https://v3.fal.media/files/v.mp4"}}),
        )
    }))
    .await;
    let provider: Arc<dyn Provider> = Arc::new(FalQueueProvider::new(
        &fal_config(base_url(&server), "/fal-ai/flux/dev"),
        KeySource::Fixed(Secret::new(CANARY)),
        fast(),
    ));
    let h = harness(vec![provider]);
    let request = request_json(
        "image-generation",
        json!([
            {"type": "image", "uri": "https://img.example/1.png"},
            {"type": "image", "uri": "https://img.example/2.png"}
        ]),
        json!({}),
    );
    let job = h.submit(&request, LONG).await;
    assert_eq!(h.runner.run(&job, 1).await, RunOutcome::Finished);
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(snapshot.status, ExecutionStatus::Succeeded);
    assert_eq!(
        snapshot.artifacts,
        Some(vec![OutputArtifact {
            uri: "https://v3.fal.media/files/v.mp4".into(),
            media_type: None
        }])
    );
    let submit = &server.received()[0];
    assert_eq!(submit.path, "/fal-ai/flux/dev");
    assert_eq!(
        submit.json(),
        json!({"image_urls": ["https://img.example/1.png", "https://img.example/2.png"]})
    );
}

// =============================================================================================
// fal: failures and cancellation [R 70-72]

#[tokio::test]
async fn fal_completed_with_error_is_unavailable_with_the_error_type() {
    let server = fal_accepting(|r: &Received| {
        if r.path == status_path() {
            let mut doc = status_doc(&r.origin, "COMPLETED");
            doc["error"] = json!("Internal error while running the model");
            doc["error_type"] = json!("runner_disconnected");
            json_response(StatusCode::OK, doc)
        } else {
            json_response(StatusCode::ACCEPTED, json!({}))
        }
    })
    .await;
    let _ = fails_at(
        fal_with_fallback(&server, fast()),
        fal_target(),
        &[],
        coded(
            ErrorCode::ProviderUnavailable,
            "Provider reported a failed request",
            "runner_disconnected",
        ),
    )
    .await;
    assert_eq!(server.count(Method::PUT, &cancel_path()), 0);
    assert_eq!(server.count(Method::GET, &result_path()), 0);
}

#[tokio::test]
async fn fal_error_type_echoing_the_credential_is_dropped() {
    let server = fal_accepting(|r: &Received| {
        let mut doc = status_doc(&r.origin, "COMPLETED");
        doc["error"] = json!(format!("bad key {CANARY}"));
        doc["error_type"] = json!(CANARY);
        json_response(StatusCode::OK, doc)
    })
    .await;
    let (h, id) = fails_alone(
        fal(&server, fast()),
        &image_request(json!({})),
        not_retryable(
            ErrorCode::ProviderUnavailable,
            "Provider reported a failed request",
        ),
        "the error type echoes the credential",
    )
    .await;
    assert_no_canary(&h, id, None).await;
}

#[tokio::test]
async fn fal_unknown_status_is_a_protocol_error_and_cancels_once() {
    let (logs, _guard) = testkit::logs::capture();
    let server =
        FakeProvider::start(fal_queue(vec!["IN_QUEUE", "PAUSED"], || unreachable!())).await;
    let h = harness(vec![fal(&server, fast())]);
    let id = run(&h, &image_request(json!({})), LONG).await;
    h.assert_log(
        id,
        &failed_after(
            fal_target(),
            &[queued()],
            not_retryable(
                ErrorCode::ProviderProtocolError,
                "Provider returned an unknown queue status",
            ),
        ),
    )
    .await;
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
    let put = server
        .received()
        .into_iter()
        .find(|r| r.method == Method::PUT)
        .unwrap();
    assert_eq!(
        put.header("authorization"),
        Some(format!("Key {CANARY}").as_str())
    );
    assert!(
        logs.text().contains("fal request cancelled"),
        "{}",
        logs.text()
    );
    assert_no_canary(&h, id, Some(&logs)).await;
}

#[tokio::test]
async fn fal_poll_exhaustion_is_a_terminal_deadline_with_one_cancel() {
    let server = FakeProvider::start(fal_queue(
        vec!["IN_QUEUE", "IN_PROGRESS"],
        || unreachable!(),
    ))
    .await;
    let options = FalOptions {
        max_polls: 3,
        ..fast()
    };
    let _ = fails_at(
        fal_with_fallback(&server, options),
        fal_target(),
        &[queued(), processing()],
        not_retryable(ErrorCode::DeadlineExceeded, "fal polling limit was reached"),
    )
    .await;
    assert_eq!(server.count(Method::GET, &status_path()), 3);
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
}

#[tokio::test]
async fn fal_cancel_mid_poll_sends_exactly_one_cancel() {
    let server = FakeProvider::start(fal_queue(vec!["IN_QUEUE"], || unreachable!())).await;
    let h = harness(vec![fal(&server, fast())]);
    let job = h.submit(&image_request(json!({})), LONG).await;
    let id = job.execution_id;
    let running = spawn_run(&h, &job);
    wait_until("fal is polled", PATIENCE, || async {
        server.count(Method::GET, &status_path()) >= 3
    })
    .await;
    h.bus.request(id).await.unwrap();
    finishes("cancel ends the run", running).await;
    h.assert_log(
        id,
        &failed_after(fal_target(), &[queued()], RuntimeError::cancelled()),
    )
    .await;
    assert_eq!(
        server.count(Method::PUT, &cancel_path()),
        1,
        "the cancel was sent before the run ended"
    );
    let polls = server.count(Method::GET, &status_path());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        server.count(Method::GET, &status_path()),
        polls,
        "no polling after cancel"
    );
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
}

#[tokio::test]
async fn fal_deadline_mid_poll_cancels_the_request() {
    let server = FakeProvider::start(fal_queue(vec!["IN_PROGRESS"], || unreachable!())).await;
    let h = harness(vec![fal(&server, fast())]);
    let id = run(&h, &image_request(json!({})), Duration::from_millis(300)).await;
    h.assert_log(
        id,
        &failed_after(
            fal_target(),
            &[processing()],
            RuntimeError::deadline_exceeded(),
        ),
    )
    .await;
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
}

#[tokio::test]
async fn fal_cancel_is_bounded_by_its_own_timeout_and_never_replaces_the_error() {
    // The cancel endpoint never answers: the attempt still ends, with its own error.
    let server = fal_accepting(|r: &Received| {
        if r.method == Method::PUT {
            event_stream(vec![], Tail::Stall)
        } else {
            json_response(StatusCode::OK, json!({"status": "EXPLODED"}))
        }
    })
    .await;
    let options = FalOptions {
        cancel_timeout: Duration::from_millis(200),
        ..fast()
    };
    let h = harness(vec![fal(&server, options)]);
    let id = run(&h, &image_request(json!({})), LONG).await;
    assert_eq!(
        error_of(&h, id).await.code,
        ErrorCode::ProviderProtocolError
    );
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
}

#[tokio::test]
async fn fal_result_failure_after_completed_is_never_cancelled() {
    let server = FakeProvider::start(fal_queue(vec!["IN_PROGRESS", "COMPLETED"], || {
        text_response(StatusCode::INTERNAL_SERVER_ERROR, "upstream failure")
    }))
    .await;
    let _ = fails_at(
        fal_with_fallback(&server, fast()),
        fal_target(),
        &[processing()],
        status_error(StatusCode::INTERNAL_SERVER_ERROR),
    )
    .await;
    assert_eq!(server.count(Method::GET, &result_path()), 1);
    assert_eq!(server.count(Method::PUT, &cancel_path()), 0);
}

#[tokio::test]
async fn fal_status_poll_errors_are_not_retryable_and_cancel() {
    let server = fal_accepting(|r: &Received| {
        if r.method == Method::PUT {
            json_response(StatusCode::ACCEPTED, json!({}))
        } else {
            echoing_error(StatusCode::SERVICE_UNAVAILABLE, r)
        }
    })
    .await;
    let (h, id) = fails_at(
        fal_with_fallback(&server, fast()),
        fal_target(),
        &[],
        status_error(StatusCode::SERVICE_UNAVAILABLE),
    )
    .await;
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
    assert_no_canary(&h, id, None).await;
}

#[tokio::test]
async fn fal_cross_origin_lifecycle_urls_are_refused_unrequested() {
    let elsewhere = FakeProvider::start(|_| json_response(StatusCode::OK, json!({}))).await;
    let other_origin = elsewhere.origin().to_owned();
    let server = FakeProvider::start(move |r: &Received| {
        if r.method == Method::POST {
            let mut answer = submitted(&r.origin);
            answer["status_url"] = json!(format!("{}/status", request_base(&other_origin)));
            json_response(StatusCode::OK, answer)
        } else {
            json_response(StatusCode::ACCEPTED, json!({}))
        }
    })
    .await;
    let h = harness(vec![fal(&server, fast())]);
    let id = run(&h, &image_request(json!({})), LONG).await;
    let error = error_of(&h, id).await;
    assert_eq!(
        (error.code, error.retryable),
        (ErrorCode::ProviderProtocolError, false)
    );
    assert_eq!(
        error.message,
        "Provider lifecycle URL leaves the configured origin"
    );
    assert!(
        elsewhere.received().is_empty(),
        "the credential never went to another origin"
    );
    assert_eq!(
        server.count(Method::PUT, &cancel_path()),
        1,
        "the valid cancel URL is still used"
    );
    assert_eq!(server.count(Method::GET, &status_path()), 0);
}

#[tokio::test]
async fn fal_submit_answer_without_urls_is_a_protocol_error() {
    let server = FakeProvider::start(|r: &Received| {
        if r.method == Method::POST {
            json_response(StatusCode::OK, json!({"request_id": REQUEST_ID}))
        } else {
            json_response(StatusCode::ACCEPTED, json!({}))
        }
    })
    .await;
    let _ = fails_alone(
        fal(&server, fast()),
        &image_request(json!({})),
        not_retryable(
            ErrorCode::ProviderProtocolError,
            "Provider response omitted a lifecycle URL",
        ),
        "the submit answer has no URLs",
    )
    .await;
    assert_eq!(server.received().len(), 1, "nothing else was requested");
}

#[tokio::test]
async fn fal_submit_rejections_keep_the_status_mapping() {
    let (logs, _guard) = testkit::logs::capture();
    for (status, code, retryable) in REJECTIONS {
        let server = FakeProvider::start(move |r| echoing_error(status, r)).await;
        let (h, id) = fal_with_fallback(&server, fast()).await;
        let expected = rejected(status, code, retryable);
        let events = h.events(id).await;
        if retryable {
            assert_eq!(
                events[2].body,
                EventBody::RouteAttemptFailed {
                    target: fal_target(),
                    attempt: 1,
                    error: expected
                }
            );
            assert_eq!(
                h.snapshot(id).await.target,
                Some(mock_target()),
                "{status} falls back"
            );
        } else {
            assert_eq!(error_of(&h, id).await, expected);
        }
        assert_eq!(
            server.received().len(),
            1,
            "{status}: no cancel without a task"
        );
        assert_no_canary(&h, id, Some(&logs)).await;
    }
}

#[tokio::test]
async fn fal_submit_transport_failure_never_falls_back() {
    // A port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let base = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let provider: Arc<dyn Provider> = Arc::new(FalQueueProvider::new(
        &fal_config(base, FAL_MODEL),
        KeySource::Fixed(Secret::new(CANARY)),
        fast(),
    ));
    let (h, id) = run_with_fallback(
        provider,
        "image-generation",
        &image_request(fallback()),
        LONG,
    )
    .await;
    h.assert_log(
        id,
        &failed_after(
            fal_target(),
            &[],
            not_retryable(ErrorCode::ProviderUnavailable, "Provider execution failed"),
        ),
    )
    .await;
}

#[tokio::test]
async fn fal_model_leaving_the_base_is_invalid_without_a_request() {
    let server = FakeProvider::start(fal_queue(vec!["COMPLETED"], || unreachable!())).await;
    let base = BaseUrl::parse(&format!("{}/api", server.origin())).unwrap();
    for model in ["../x", "a/../../x", "a?x=1", "a#f"] {
        let provider: Arc<dyn Provider> = Arc::new(FalQueueProvider::new(
            &fal_config(base.clone(), model),
            KeySource::Env("MRT_TEST_SURELY_UNSET_FAL_KEY".into()),
            fast(),
        ));
        let _ = fails_alone(
            provider,
            &image_request(json!({})),
            not_retryable(
                ErrorCode::InvalidRequest,
                "fal model must remain on the configured origin",
            ),
            model,
        )
        .await;
    }
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn fal_manifest_and_admission() {
    let server = FakeProvider::start(fal_queue(vec!["COMPLETED"], || unreachable!())).await;
    let provider = fal(&server, fast());
    let model = &provider.manifest().models[0];
    assert_eq!(provider.manifest().provider, "fal");
    assert_eq!(model.model, FAL_MODEL);
    assert_eq!(model.abilities, ["image-generation"]);
    assert_eq!(
        model.input_modalities,
        [Modality::Text, Modality::Json, Modality::Image]
    );
    assert_eq!(model.output_modalities, [Modality::Image]);
    assert!(model.r#async && model.cancel);
    assert!(!model.stream && !model.tools && !model.structured_output);

    let h = harness(vec![provider]);
    for refused in [
        image_request(json!({"extensions": {"fal": {"input": "a fox"}}})),
        image_request(json!({"extensions": {"fal": {"input": [1]}}})),
        image_request(json!({"extensions": {"fal": 3}})),
        image_request(json!({"requirements": {"stream": true}})),
    ] {
        let id = run(&h, &refused, LONG).await;
        assert_eq!(
            error_of(&h, id).await,
            RuntimeError::capability_unavailable(),
            "{refused}"
        );
    }
    assert!(server.received().is_empty());
}

/// Records events; refuses nothing.
#[derive(Debug, Default)]
struct VecSink(Vec<ProviderEvent>);

#[async_trait]
impl ProviderSink for VecSink {
    async fn emit(&mut self, event: ProviderEvent) -> Result<(), RuntimeError> {
        self.0.push(event);
        Ok(())
    }
}

#[tokio::test]
async fn fal_attempt_dropped_mid_poll_still_cancels_once() {
    let server = FakeProvider::start(fal_queue(vec!["IN_QUEUE"], || unreachable!())).await;
    let provider = fal(&server, fast());
    let request = protocol::validate::parse_request(image_request(json!({})).as_bytes()).unwrap();
    let mut sink = VecSink::default();
    let call = ProviderCall {
        request: &request,
        model: FAL_MODEL,
        cancel: CancellationToken::new(),
    };
    {
        let attempt = provider.execute(call, &mut sink);
        tokio::select! {
            result = attempt => panic!("the attempt ended: {result:?}"),
            () = wait_until("fal is polled", PATIENCE, || async {
                server.count(Method::GET, &status_path()) >= 2
            }) => {}
        }
        // The attempt future is dropped here, as when the runner's cleanup grace runs out.
    }
    wait_until("the background cancel arrives", PATIENCE, || async {
        server.count(Method::PUT, &cancel_path()) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.count(Method::PUT, &cancel_path()), 1);
    assert_eq!(
        sink.0,
        [ProviderEvent::Progress {
            phase: ProgressPhase::Queued,
            progress: None
        }]
    );
}

// =============================================================================================
// Deployment wiring

#[tokio::test]
async fn the_deployment_file_builds_both_adapters() {
    let config = providers::deployment::parse(
        r#"{"providers":[
            {"type":"anthropic-messages","model":"claude-sonnet-4-5","api_key_env":"ANTHROPIC_API_KEY",
             "capabilities":{"input_modalities":["text","image"],"tools":true}},
            {"type":"fal-queue","model":"fal-ai/flux/dev","ability":"image-generation",
             "api_key_env":"FAL_KEY","output_modalities":["image"]}
        ]}"#,
    )
    .unwrap();
    let registry = worker::deployment::build_registry(&config).unwrap();
    let manifests = registry.manifests();
    assert_eq!(
        manifests
            .iter()
            .map(|m| m.provider.as_str())
            .collect::<Vec<_>>(),
        ["anthropic", "fal"]
    );
    let claude = &manifests[0].models[0];
    assert_eq!(claude.input_modalities, [Modality::Text, Modality::Image]);
    assert!(claude.tools && claude.stream && !claude.r#async);
    let flux = &manifests[1].models[0];
    assert_eq!(flux.input_modalities, [Modality::Text, Modality::Json]);
    assert_eq!(flux.output_modalities, [Modality::Image]);
    assert!(flux.r#async && !flux.stream);
}
