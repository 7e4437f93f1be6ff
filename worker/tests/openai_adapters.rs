//! The `openai-responses` and `openai-chat` adapters through the runtime: each test starts a
//! fake provider (`testkit::fake_provider`) that replays a recorded-style transcript of the
//! provider's real SSE format (`tests/fixtures/openai/*.sse`), runs an execution with
//! `worker::runner::Runner` over the in-memory stores, and checks the exact event log, the
//! materialized snapshot (outputs, tool calls, usage, error), fallback, and the request the
//! server received. Transcripts are delivered in small byte chunks that split frames and UTF-8
//! characters.
//!
//! Credentials are canaries injected with `KeySource::Fixed`; every finished log and snapshot
//! is checked to be free of them. References `[R n]` are to `docs/reference-behaviours.md`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use config::{BaseUrl, FlowLimits};
use protocol::event::EventBody;
use protocol::request::Modality;
use protocol::{
    ErrorCode, ExecutionId, ExecutionSnapshot, RuntimeError, RuntimeEvent, Target, UsageFact,
    UsageSource, UsageUnit,
};
use runtime::CancelBus;
use runtime::memory::MemoryLimits;
use serde_json::json;
use support::*;
use testkit::fake_provider::{FakeProvider, Piece, Received, Reply, chunked};
use worker::provider::Provider;
use worker::provider::credential::{KeySource, Secret};
use worker::provider::mock::{MockConfig, MockProvider};
use worker::provider::openai_chat::OpenAiChatProvider;
use worker::provider::openai_responses::OpenAiResponsesProvider;
use worker::provider::text::TextProviderConfig;
use worker::runner::{RunOutcome, RunnerSettings};

// ---------------------------------------------------------------------------------------------
// Transcripts

const RESPONSES_TEXT: &str = include_str!("fixtures/openai/responses_text.sse");
const RESPONSES_TWO_OUTPUTS: &str = include_str!("fixtures/openai/responses_two_outputs.sse");
const RESPONSES_TOOL_CALLS: &str = include_str!("fixtures/openai/responses_tool_calls.sse");
const RESPONSES_FAILED: &str = include_str!("fixtures/openai/responses_failed.sse");
const RESPONSES_ERROR: &str = include_str!("fixtures/openai/responses_error.sse");
const CHAT_TEXT: &str = include_str!("fixtures/openai/chat_text.sse");
const CHAT_TWO_CHOICES: &str = include_str!("fixtures/openai/chat_two_choices.sse");
const CHAT_TOOL_CALLS: &str = include_str!("fixtures/openai/chat_tool_calls.sse");
const CHAT_ERROR: &str = include_str!("fixtures/openai/chat_error.sse");

/// The text both text transcripts stream, in five deltas.
const TEXT_DELTAS: [&str; 5] = ["Hello", "!", " Ça", " va", " ☀️?"];

/// The transcript's frames (each ending with its blank line).
fn frames(transcript: &str) -> Vec<&str> {
    transcript.split_inclusive("\n\n").collect()
}

// ---------------------------------------------------------------------------------------------
// The fake provider

fn stream(transcript: &str) -> Reply {
    Reply::Stream(chunked(transcript, 61))
}

/// An error whose body echoes the request's Authorization header, as some gateways do.
fn echo_authorization(status: u16) -> Reply {
    Reply::respond(move |r| {
        let authorization = r.header("authorization").unwrap_or_default();
        Reply::json(
            status,
            &json!({"error": {
                "message": format!("Incorrect API key provided: {authorization}"),
                "type": "invalid_request_error",
                "param": null,
                "code": "invalid_api_key"
            }}),
        )
    })
}

/// A fake provider answering successive requests with scripted replies, and the API base the
/// adapters are configured with.
#[derive(Debug)]
struct Fake {
    server: FakeProvider,
    base: String,
}

impl Fake {
    /// Starts a server answering successive requests with `replies` (then 500).
    async fn start(replies: Vec<Reply>) -> Self {
        let server = FakeProvider::scripted(replies).await;
        let base = format!("{}/v1", server.origin());
        Self { server, base }
    }

    fn requests(&self) -> Vec<Received> {
        self.server.received()
    }

    fn bodies_dropped(&self) -> usize {
        self.server.bodies_dropped()
    }
}

// ---------------------------------------------------------------------------------------------
// Adapters under test

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Responses,
    Chat,
}

const FLAVORS: [Flavor; 2] = [Flavor::Responses, Flavor::Chat];

/// What the tests know about an adapter: its provider id, model, endpoint path, text transcript
/// and how many frames of it come before the first output delta.
struct Profile {
    id: &'static str,
    model: &'static str,
    path: &'static str,
    text: &'static str,
    frames_before_output: usize,
}

impl Flavor {
    fn profile(self) -> Profile {
        match self {
            Flavor::Responses => Profile {
                id: "openai",
                model: "gpt-4.1-mini",
                path: "/v1/responses",
                text: RESPONSES_TEXT,
                // created, in_progress, output_item.added, content_part.added
                frames_before_output: 4,
            },
            Flavor::Chat => Profile {
                id: "openai-chat",
                model: "meta-llama/Llama-3.1-8B-Instruct",
                path: "/v1/chat/completions",
                text: CHAT_TEXT,
                // the role chunk
                frames_before_output: 1,
            },
        }
    }

    fn id(self) -> &'static str {
        self.profile().id
    }

    fn model(self) -> &'static str {
        self.profile().model
    }

    fn path(self) -> &'static str {
        self.profile().path
    }

    /// The adapter's `extensions` key (the same string as its default provider id).
    fn extension_key(self) -> &'static str {
        match self {
            Flavor::Responses => worker::provider::openai_responses::EXTENSION_KEY,
            Flavor::Chat => worker::provider::openai_chat::EXTENSION_KEY,
        }
    }

    fn text(self) -> &'static str {
        self.profile().text
    }

    /// Frames of the text transcript before the first output delta.
    fn frames_before_output(self) -> usize {
        self.profile().frames_before_output
    }

    fn target(self) -> Target {
        Target {
            provider: self.id().into(),
            model: self.model().into(),
        }
    }

    fn config(self, fake: &Fake, tools: bool) -> TextProviderConfig {
        let mut input_modalities = vec![Modality::Text, Modality::Json, Modality::Image];
        if self == Flavor::Responses {
            input_modalities.push(Modality::File);
        }
        TextProviderConfig {
            id: self.id().into(),
            model: self.model().into(),
            abilities: vec!["text-generation".into()],
            api_key_env: "MRT_TEST_OPENAI_KEY_NOT_READ".into(),
            base_url: BaseUrl::parse(&fake.base).unwrap(),
            input_modalities,
            tools,
            flow: FlowLimits::CONFIG_DEFAULT,
        }
    }

    fn provider(self, fake: &Fake, tools: bool, key: KeySource) -> Arc<dyn Provider> {
        let config = self.config(fake, tools);
        match self {
            Flavor::Responses => Arc::new(OpenAiResponsesProvider::new(&config, key)),
            Flavor::Chat => Arc::new(OpenAiChatProvider::new(&config, key)),
        }
    }
}

/// A canary credential, unique per test.
fn canary(test: &str) -> String {
    testkit::canary::credential(test)
}

fn fixed(key: &str) -> KeySource {
    KeySource::Fixed(Secret::new(key))
}

fn mock() -> Arc<dyn Provider> {
    Arc::new(MockProvider::new(MockConfig::default()))
}

fn mock_target() -> Target {
    Target {
        provider: "provider-mock".into(),
        model: "model-alpha".into(),
    }
}

/// The adapter first, the mock second (a fallback target), with a cleanup grace far longer
/// than any test waits, so an adapter that ignores cancellation fails the test.
fn harness(adapter: Arc<dyn Provider>) -> Harness {
    Harness::with(
        vec![(adapter, DEFAULT_LIMITS), (mock(), DEFAULT_LIMITS)],
        MemoryLimits::default(),
        RunnerSettings {
            cleanup_grace: Duration::from_secs(120),
            ..RunnerSettings::default()
        },
    )
}

/// A text-generation request with the given extra top-level members (JSON text after a comma,
/// or empty).
fn request(extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(",{extra}")
    };
    format!(
        r#"{{"ability":"text-generation","input":[{{"type":"text","text":"Say hello in French."}}]{extra}}}"#
    )
}

/// Runs one execution that allows fallback, with deadline `deadline`, on `flavor`'s adapter
/// (with the canary credential of `test`) against a fake provider answering `replies`.
async fn run_with_fallback(
    flavor: Flavor,
    replies: Vec<Reply>,
    test: &str,
    deadline: Duration,
) -> (Fake, Harness, runtime::Job) {
    let fake = Fake::start(replies).await;
    let h = harness(flavor.provider(&fake, false, fixed(&canary(test))));
    let job = h
        .submit(&request(r#""routing":{"allow_fallback":true}"#), deadline)
        .await;
    run(&h, &job).await;
    (fake, h, job)
}

/// Runs `job` to its end and checks that no canary reached the log or the snapshot.
async fn run(h: &Harness, job: &runtime::Job) {
    let outcome = within("the execution ends", PATIENCE, h.runner.run(job, 1)).await;
    assert_eq!(outcome, RunOutcome::Finished);
    h.assert_no_canary(job.execution_id, None).await;
}

fn out(index: u32, text: &str) -> EventBody {
    EventBody::OutputDelta {
        output_index: index,
        delta: text.into(),
    }
}

fn started(call_id: &str, name: &str) -> EventBody {
    EventBody::ToolCallStarted {
        call_id: call_id.into(),
        name: name.into(),
    }
}

fn args(call_id: &str, delta: &str) -> EventBody {
    EventBody::ToolCallArgumentsDelta {
        call_id: call_id.into(),
        delta: delta.into(),
    }
}

fn provider_fact(unit: UsageUnit, quantity: f64) -> UsageFact {
    UsageFact::new(unit, quantity, UsageSource::Provider).unwrap()
}

/// Provider usage facts of the four counters both APIs report, in this order: input, output,
/// cache read and reasoning tokens.
fn usage_of([input, output, cache_read, reasoning]: [f64; 4]) -> Vec<UsageFact> {
    vec![
        provider_fact(UsageUnit::input_token(), input),
        provider_fact(UsageUnit::output_token(), output),
        provider_fact(UsageUnit::cache_read_token(), cache_read),
        provider_fact(UsageUnit::reasoning_token(), reasoning),
    ]
}

/// The log of a first attempt at `target` that streamed `deltas`, reported `usage` and
/// completed.
fn completed_log(
    target: &Target,
    deltas: impl IntoIterator<Item = EventBody>,
    usage: Vec<UsageFact>,
) -> Vec<EventBody> {
    let mut log = vec![EventBody::Accepted, selected_of(target.clone(), 1)];
    log.extend(deltas);
    log.push(EventBody::UsageReported { facts: usage });
    log.push(EventBody::Completed {
        target: target.clone(),
    });
    log
}

/// The checks every OpenAI-compatible attempt's request passes: a JSON POST to `path` with the
/// bearer credential `key`.
fn assert_bearer_json_post(r: &Received, path: &str, key: &str) {
    assert_eq!(r.method, Method::POST);
    assert_eq!(r.path, path);
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
}

fn selected_of(target: Target, attempt: u32) -> EventBody {
    EventBody::RouteSelected { target, attempt }
}

/// The error an adapter reports for an HTTP `status`: the provider kit's mapping [R 61]
/// (`worker::provider::http::status_error`, whose unit tests pin it).
fn status_error(status: u16) -> RuntimeError {
    worker::provider::http::status_error(axum::http::StatusCode::from_u16(status).unwrap())
}

fn stream_failed() -> RuntimeError {
    not_retryable(ErrorCode::ProviderUnavailable, "Provider response failed")
}

fn ended_early() -> RuntimeError {
    not_retryable(
        ErrorCode::ProviderProtocolError,
        "Provider stream ended without a completion event",
    )
}

fn malformed() -> RuntimeError {
    not_retryable(
        ErrorCode::ProviderProtocolError,
        "Provider returned malformed stream JSON",
    )
}

/// A transport failure after the provider accepted the request: never retryable.
fn transport_failed() -> RuntimeError {
    not_retryable(ErrorCode::ProviderUnavailable, "Provider execution failed")
}

// ---------------------------------------------------------------------------------------------
// Text, outputs, tool calls, usage, and the request sent

/// Runs `request` against `flavor`'s text transcript, after which the server keeps the
/// connection open: the adapter must complete at the completion frame without waiting for the
/// end of the body [R 33]. Checks the log (the text deltas, the usage facts of `quantities`
/// (see [`usage_of`]), completed) and the result, and that one request was sent, a JSON POST
/// with the bearer canary credential named `key_name`; returns that request, the log and the
/// snapshot for the flavor's own checks.
async fn run_text(
    flavor: Flavor,
    key_name: &str,
    request: &str,
    quantities: [f64; 4],
) -> (Received, Vec<RuntimeEvent>, ExecutionSnapshot) {
    let key = &canary(key_name);
    let usage = usage_of(quantities);
    let mut pieces = chunked(flavor.text(), 61);
    pieces.push(Piece::Stall);
    let fake = Fake::start(vec![Reply::Stream(pieces)]).await;
    let h = harness(flavor.provider(&fake, false, fixed(key)));
    let job = h.submit(request, LONG).await;
    run(&h, &job).await;

    let deltas = TEXT_DELTAS.iter().map(|d| out(0, d));
    let expected = completed_log(&flavor.target(), deltas, usage.clone());
    let events = h.assert_log(job.execution_id, &expected).await;
    let snapshot = h.snapshot(job.execution_id).await;
    assert_eq!(
        snapshot.result,
        Some(json!({
            "outputs": [{"index": 0, "type": "text", "text": "Hello! Ça va ☀️?"}],
            "tool_calls": []
        })),
        "{flavor:?}"
    );
    assert_eq!(snapshot.usage, usage, "{flavor:?}");
    let mut seen = fake.requests();
    assert_eq!(seen.len(), 1, "{flavor:?}");
    let sent = seen.remove(0);
    assert_bearer_json_post(&sent, flavor.path(), key);
    (sent, events, snapshot)
}

/// Both APIs: the caller's input parts and extension reach the provider translated, with the
/// runtime-owned fields written over the extension, and the provider's usage is logged.
#[tokio::test]
async fn text_streams_through_the_runtime() {
    let cases = [
        (
            Flavor::Responses,
            "responses-text",
            r#"{"ability":"text-generation","input":[
                {"type":"text","text":"Say hello in French."},
                {"type":"json","value":{"tone":"warm","max_words":5}},
                {"type":"image","uri":"https://images.example.com/cat.png","media_type":"image/png"},
                {"type":"file","uri":"https://files.example.com/brief.pdf"}],
              "extensions":{"openai":{"request":{"model":"gpt-evil","input":"ignored","stream":false,
                "store":true,"temperature":0.3,"max_output_tokens":256,"metadata":{"team":"docs"}}}}}"#,
            [37.0, 11.0, 12.0, 0.0],
            json!({
                "model": "gpt-4.1-mini",
                "stream": true,
                "store": false,
                "temperature": 0.3,
                "max_output_tokens": 256,
                "metadata": {"team": "docs"},
                "input": [{"role": "user", "content": [
                    {"type": "input_text", "text": "Say hello in French."},
                    {"type": "input_text", "text": "{\"max_words\":5,\"tone\":\"warm\"}"},
                    {"type": "input_image", "image_url": "https://images.example.com/cat.png"},
                    {"type": "input_file", "file_url": "https://files.example.com/brief.pdf"}
                ]}]
            }),
        ),
        (
            Flavor::Chat,
            "chat-text",
            r#"{"ability":"text-generation","input":[
                {"type":"text","text":"Say hello in French."},
                {"type":"json","value":["warm",5]},
                {"type":"image","uri":"https://images.example.com/cat.png"}],
              "extensions":{"openai-chat":{"request":{"model":"other","messages":[{"role":"system","content":"x"}],
                "stream":false,"stream_options":{"include_usage":false},"temperature":0.3,"max_tokens":64}},
                "openai":{"request":{"store":true}}}}"#,
            [19.0, 10.0, 4.0, 2.0],
            json!({
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "stream": true,
                "stream_options": {"include_usage": true},
                "temperature": 0.3,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "Say hello in French."},
                    {"type": "text", "text": "[\"warm\",5]"},
                    {"type": "image_url", "image_url": {"url": "https://images.example.com/cat.png"}}
                ]}]
            }),
        ),
    ];
    for (flavor, key_name, request, quantities, body) in cases {
        let (r, events, snapshot) = run_text(flavor, key_name, request, quantities).await;
        let input = quantities[0];
        let facts = format!(
            r#""facts":[{{"unit":"input_token","quantity":{input},"source":"provider","complete":true}}"#
        );
        let usage = events[events.len() - 2].to_json();
        assert!(usage.contains(&facts), "{flavor:?}: {usage}");
        assert_eq!(snapshot.target, Some(flavor.target()), "{flavor:?}");
        assert_eq!(snapshot.error, None, "{flavor:?}");
        assert_eq!(r.header("accept"), Some("text/event-stream"), "{flavor:?}");
        assert_eq!(r.json(), body, "{flavor:?}");
    }
}

#[tokio::test]
async fn two_outputs_keep_their_indexes() {
    for flavor in FLAVORS {
        let (transcript, deltas, usage) = match flavor {
            Flavor::Responses => (
                RESPONSES_TWO_OUTPUTS,
                vec![
                    out(0, "First"),
                    out(0, " answer."),
                    out(1, "Second"),
                    out(1, " answer."),
                ],
                usage_of([20.0, 8.0, 0.0, 0.0]),
            ),
            // n=2: the choices interleave; choice 1 ends with finish_reason "length" and the
            // attempt still completes.
            Flavor::Chat => (
                CHAT_TWO_CHOICES,
                vec![
                    out(0, "First"),
                    out(1, "Second"),
                    out(0, " answer"),
                    out(1, " answer"),
                    out(0, "."),
                    out(1, "."),
                ],
                usage_of([20.0, 8.0, 0.0, 0.0]),
            ),
        };
        let fake = Fake::start(vec![stream(transcript)]).await;
        let h = harness(flavor.provider(&fake, false, fixed(&canary("two"))));
        let job = h.submit(&request(""), LONG).await;
        run(&h, &job).await;

        let expected = completed_log(&flavor.target(), deltas, usage);
        h.assert_log(job.execution_id, &expected).await;
        assert_eq!(
            h.snapshot(job.execution_id).await.result,
            Some(json!({
                "outputs": [
                    {"index": 0, "type": "text", "text": "First answer."},
                    {"index": 1, "type": "text", "text": "Second answer."}
                ],
                "tool_calls": []
            })),
            "{flavor:?}"
        );
    }
}

#[tokio::test]
async fn tool_calls_stream_their_arguments_in_fragments() {
    for flavor in FLAVORS {
        let (transcript, tools) = match flavor {
            Flavor::Responses => (
                RESPONSES_TOOL_CALLS,
                json!([{"type": "function", "name": "get_weather",
                        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}]),
            ),
            Flavor::Chat => (
                CHAT_TOOL_CALLS,
                json!([{"type": "function", "function": {"name": "get_weather",
                        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}]),
            ),
        };
        let fake = Fake::start(vec![Reply::Stream(chunked(transcript, 37))]).await;
        let h = harness(flavor.provider(&fake, true, fixed(&canary("tools"))));
        let extension =
            json!({flavor.extension_key(): {"request": {"tools": tools, "tool_choice": "auto"}}});
        let job = h
            .submit(
                &request(&format!(
                    r#""requirements":{{"tools":true}},"extensions":{extension}"#
                )),
                LONG,
            )
            .await;
        run(&h, &job).await;

        let paris = "call_Q2xb8h3Tz9JkLm4nOp5qRs6t";
        let bogota = "call_Vw7xY8zA1bC2dE3fG4hI5jK6";
        let mut expected = vec![
            EventBody::Accepted,
            selected_of(flavor.target(), 1),
            started(paris, "get_weather"),
        ];
        for fragment in ["{\"", "location", "\":\"", "Paris", ",", " France", "\"}"] {
            expected.push(args(paris, fragment));
        }
        expected.push(started(bogota, "get_weather"));
        for fragment in ["{\"location\"", ":\"Bogot", "á, Colombia\"}"] {
            expected.push(args(bogota, fragment));
        }
        expected.push(EventBody::UsageReported {
            facts: usage_of([61.0, 42.0, 0.0, 0.0]),
        });
        expected.push(EventBody::Completed {
            target: flavor.target(),
        });
        h.assert_log(job.execution_id, &expected).await;
        assert_eq!(
            h.snapshot(job.execution_id).await.result,
            Some(json!({
                "outputs": [],
                "tool_calls": [
                    {"call_id": paris, "name": "get_weather",
                     "arguments": "{\"location\":\"Paris, France\"}"},
                    {"call_id": bogota, "name": "get_weather",
                     "arguments": "{\"location\":\"Bogotá, Colombia\"}"}
                ]
            })),
            "{flavor:?}"
        );
        // Tools pass through when the deployment enabled them.
        let body = &fake.requests()[0].json();
        assert_eq!(body["tools"], tools, "{flavor:?}");
        assert_eq!(body["tool_choice"], "auto", "{flavor:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Capability policy and credentials

#[tokio::test]
async fn tools_in_an_extension_are_refused_unless_declared() {
    for flavor in FLAVORS {
        let fields: &[&str] = match flavor {
            Flavor::Responses => &["tools", "tool_choice"],
            Flavor::Chat => &["tools", "tool_choice", "functions", "function_call"],
        };
        for field in fields {
            let fake = Fake::start(vec![stream(flavor.text())]).await;
            let h = harness(flavor.provider(&fake, false, fixed(&canary("refused"))));
            let extensions = json!({flavor.extension_key(): {"request": {*field: []}}});
            // Routed alone (the mock would otherwise serve it).
            let job = h
                .submit(
                    &request(&format!(
                        r#""extensions":{extensions},"routing":{{"provider_order":["{}"]}}"#,
                        flavor.id()
                    )),
                    LONG,
                )
                .await;
            assert!(
                !h.registry
                    .candidates(&job.request)
                    .iter()
                    .any(|c| c.target() == flavor.target()),
                "{flavor:?} {field}"
            );
            // With only this adapter registered, submit-time admission refuses the request.
            let alone = Harness::new(vec![(
                flavor.provider(&fake, false, fixed(&canary("refused"))),
                DEFAULT_LIMITS,
            )]);
            assert!(
                !alone.registry.can_serve(&job.request),
                "{flavor:?} {field}"
            );
            let refused = alone
                .submit(&request(&format!(r#""extensions":{extensions}"#)), LONG)
                .await;
            run(&alone, &refused).await;
            alone
                .assert_log(
                    refused.execution_id,
                    &[
                        EventBody::Accepted,
                        failed(RuntimeError::capability_unavailable()),
                    ],
                )
                .await;
            assert!(
                fake.requests().is_empty(),
                "no HTTP call for {flavor:?} {field}"
            );
        }
        // A non-object `request` is refused even with tools enabled.
        let fake = Fake::start(vec![]).await;
        let alone = Harness::new(vec![(
            flavor.provider(&fake, true, fixed(&canary("refused"))),
            DEFAULT_LIMITS,
        )]);
        for bad in [json!("tools"), json!([1]), json!(null)] {
            let extensions = json!({flavor.extension_key(): {"request": bad}});
            let malformed = support::job(&request(&format!(r#""extensions":{extensions}"#)), LONG);
            assert!(
                !alone.registry.can_serve(&malformed.request),
                "{flavor:?} {bad}"
            );
        }
        // The other adapter's extension key is not this adapter's business.
        let other = match flavor {
            Flavor::Responses => "openai-chat",
            Flavor::Chat => "openai",
        };
        let extensions = json!({other: {"request": {"tools": []}}});
        let foreign = support::job(&request(&format!(r#""extensions":{extensions}"#)), LONG);
        assert!(alone.registry.can_serve(&foreign.request), "{flavor:?}");
    }
}

#[tokio::test]
async fn a_missing_credential_fails_without_calling_the_provider() {
    for (n, flavor) in FLAVORS.into_iter().enumerate() {
        let fake = Fake::start(vec![stream(flavor.text())]).await;
        let env = format!("MRT_TEST_OPENAI_KEY_SURELY_UNSET_{n}");
        let h = harness(flavor.provider(&fake, false, KeySource::Env(env)));
        let job = h
            .submit(&request(r#""routing":{"allow_fallback":true}"#), LONG)
            .await;
        run(&h, &job).await;
        let error = not_retryable(
            ErrorCode::ProviderUnavailable,
            "Required provider credential is unavailable",
        );
        h.assert_log(job.execution_id, &failed_after(flavor.target(), &[], error))
            .await;
        assert!(fake.requests().is_empty(), "{flavor:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Provider errors before the stream [R 61] and fallback [R 29-31]

#[tokio::test]
async fn http_errors_before_the_stream_are_classified() {
    for flavor in FLAVORS {
        let cases = [
            (
                Reply::raw_json(
                    400,
                    r#"{"error":{"message":"Invalid 'input': sk-CANARY in text","type":"invalid_request_error"}}"#,
                ),
                400,
            ),
            (echo_authorization(401), 401),
            (
                Reply::raw_json(
                    429,
                    r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
                ).with_header("retry-after", "7"),
                429,
            ),
            (
                Reply::raw_json(
                    500,
                    r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
                ),
                500,
            ),
        ];
        for (reply, status) in cases {
            let fake = Fake::start(vec![reply]).await;
            let key = canary("status");
            let h = harness(flavor.provider(&fake, false, fixed(&key)));
            let job = h.submit(&request(""), LONG).await;
            run(&h, &job).await;
            let error = status_error(status);
            h.assert_log(
                job.execution_id,
                &failed_after(flavor.target(), &[], error.clone()),
            )
            .await;
            let snapshot = h.snapshot(job.execution_id).await;
            assert_eq!(snapshot.error, Some(error), "{flavor:?} {status}");
            assert_eq!(snapshot.target, Some(flavor.target()));
            assert_eq!(fake.requests()[0].path, flavor.path());
            // The echoing server did receive the key; nothing of it came back.
            assert_eq!(
                fake.requests()[0].header("authorization"),
                Some(format!("Bearer {key}").as_str())
            );
        }
    }
}

#[tokio::test]
async fn retryable_errors_before_output_fall_back_to_the_next_provider() {
    for flavor in FLAVORS {
        for (status, headers) in [(500, vec![]), (429, vec![("retry-after", "7")])] {
            let mut reply = Reply::raw_json(status, "{}");
            for (name, value) in headers {
                reply = reply.with_header(name, value);
            }
            let (fake, h, job) = run_with_fallback(flavor, vec![reply], "fallback", LONG).await;
            h.assert_log(
                job.execution_id,
                &fell_back_to_mock(flavor.target(), status_error(status), mock_target()),
            )
            .await;
            let snapshot = h.snapshot(job.execution_id).await;
            assert_eq!(snapshot.target, Some(mock_target()));
            assert_eq!(snapshot.result, Some(hello_result()));
            assert_eq!(snapshot.error, None);
            assert_eq!(fake.requests().len(), 1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Failures inside the stream: never retried, whatever fallback allows

#[tokio::test]
async fn failures_reported_in_the_stream_are_not_retryable() {
    let cases = [
        (Flavor::Responses, RESPONSES_FAILED),
        (Flavor::Responses, RESPONSES_ERROR),
        (Flavor::Chat, CHAT_ERROR),
    ];
    for (flavor, transcript) in cases {
        let (_fake, h, job) =
            run_with_fallback(flavor, vec![stream(transcript)], "stream-failure", LONG).await;
        h.assert_log(
            job.execution_id,
            &failed_after(flavor.target(), &[], stream_failed()),
        )
        .await;
    }
}

/// The first `whole` frames of `flavor`'s text transcript, then the first `part(len)` bytes of
/// the next frame.
fn whole_frames_then_part(flavor: Flavor, whole: usize, part: fn(usize) -> usize) -> String {
    let frames = frames(flavor.text());
    let next = frames[whole];
    let mut sent = frames[..whole].concat();
    sent.push_str(&next[..part(next.len())]);
    sent
}

#[tokio::test]
async fn a_stream_cut_after_output_fails_without_fallback() {
    for flavor in FLAVORS {
        // Two deltas, then half a frame, then the connection is aborted.
        let sent = whole_frames_then_part(flavor, flavor.frames_before_output() + 2, |n| n / 2);
        let mut pieces = chunked(&sent, 61);
        pieces.extend([Piece::Pause(Duration::from_millis(20)), Piece::Cut]);
        let (_fake, h, job) =
            run_with_fallback(flavor, vec![Reply::Stream(pieces)], "cut", LONG).await;
        h.assert_log(
            job.execution_id,
            &failed_after(
                flavor.target(),
                &[out(0, "Hello"), out(0, "!")],
                transport_failed(),
            ),
        )
        .await;
        let snapshot = h.snapshot(job.execution_id).await;
        assert_eq!(snapshot.target, Some(flavor.target()), "no fallback");
        assert!(!snapshot.error.unwrap().retryable);
        assert_eq!(
            snapshot.result,
            Some(
                json!({"outputs": [{"index": 0, "type": "text", "text": "Hello!"}], "tool_calls": []})
            )
        );
    }
}

#[tokio::test]
async fn a_stream_ending_mid_frame_before_output_is_a_protocol_error() {
    for flavor in FLAVORS {
        // The body ends cleanly in the middle of the first output frame: the partial frame is
        // dropped and the stream ended without completion. The provider had accepted the
        // request, so there is no fallback.
        let sent = whole_frames_then_part(flavor, flavor.frames_before_output(), |n| n - 3);
        let (_fake, h, job) = run_with_fallback(flavor, vec![stream(&sent)], "eof", LONG).await;
        h.assert_log(
            job.execution_id,
            &failed_after(flavor.target(), &[], ended_early()),
        )
        .await;
    }
}

#[tokio::test]
async fn a_stream_without_its_completion_signal_is_a_protocol_error() {
    for flavor in FLAVORS {
        // Every frame but the completion (`response.completed` / `data: [DONE]`).
        let frames = frames(flavor.text());
        let sent = frames[..frames.len() - 1].concat();
        let fake = Fake::start(vec![stream(&sent)]).await;
        let h = harness(flavor.provider(&fake, false, fixed(&canary("no-completion"))));
        let job = h.submit(&request(""), LONG).await;
        run(&h, &job).await;
        let mut expected = vec![EventBody::Accepted, selected_of(flavor.target(), 1)];
        expected.extend(TEXT_DELTAS.iter().map(|d| out(0, d)));
        expected.push(failed(ended_early()));
        h.assert_log(job.execution_id, &expected).await;
        assert!(
            h.snapshot(job.execution_id).await.usage.is_empty(),
            "{flavor:?}"
        );
    }
}

#[tokio::test]
async fn malformed_json_is_a_protocol_error() {
    for flavor in FLAVORS {
        let frames = frames(flavor.text());
        let mut sent: String = frames[..flavor.frames_before_output()].concat();
        sent.push_str(match flavor {
            Flavor::Responses => {
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hel\n\n"
            }
            Flavor::Chat => {
                "data: {\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel}\n\n"
            }
        });
        sent.push_str(frames[flavor.frames_before_output()]);
        let (_fake, h, job) = run_with_fallback(flavor, vec![stream(&sent)], "json", LONG).await;
        h.assert_log(
            job.execution_id,
            &failed_after(flavor.target(), &[], malformed()),
        )
        .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Deadline and cancellation close the connection promptly

/// The text transcript up to its first delta, then silence.
fn stalls_after_first_delta(flavor: Flavor) -> Reply {
    let frames = frames(flavor.text());
    let sent = frames[..=flavor.frames_before_output()].concat();
    let mut pieces = chunked(&sent, 61);
    pieces.push(Piece::Stall);
    Reply::Stream(pieces)
}

/// Asserts the attempt of `id` failed with `error` after its first delta ("Hello"), and the
/// adapter closed the provider connection.
async fn failed_after_hello_and_closed(
    h: &Harness,
    fake: &Fake,
    id: ExecutionId,
    flavor: Flavor,
    error: RuntimeError,
) {
    let log = failed_after(flavor.target(), &[out(0, "Hello")], error);
    h.assert_log(id, &log).await;
    wait_until("the provider connection is closed", PATIENCE, || async {
        fake.bodies_dropped() == 1
    })
    .await;
}

#[tokio::test]
async fn a_stalled_stream_hits_the_deadline() {
    for flavor in FLAVORS {
        let (fake, h, job) = run_with_fallback(
            flavor,
            vec![stalls_after_first_delta(flavor)],
            "stall",
            Duration::from_millis(600),
        )
        .await;
        failed_after_hello_and_closed(
            &h,
            &fake,
            job.execution_id,
            flavor,
            RuntimeError::deadline_exceeded(),
        )
        .await;
    }
}

#[tokio::test]
async fn cancelling_closes_the_provider_connection() {
    for flavor in FLAVORS {
        let fake = Fake::start(vec![stalls_after_first_delta(flavor)]).await;
        let h = harness(flavor.provider(&fake, false, fixed(&canary("cancel"))));
        let job = h.submit(&request(""), LONG).await;
        let id = job.execution_id;
        let running = spawn_run(&h, &job);
        wait_for_output(&h, id).await;
        assert_eq!(fake.bodies_dropped(), 0, "the stream is open");
        h.bus.request(id).await.unwrap();
        let outcome = within("cancel ends the run", PATIENCE, running)
            .await
            .unwrap();
        assert_eq!(outcome, RunOutcome::Finished);
        failed_after_hello_and_closed(&h, &fake, id, flavor, RuntimeError::cancelled()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The credential never leaks, logs included

#[tokio::test]
async fn the_credential_never_reaches_events_errors_or_logs() {
    let (captured, _guard) = testkit::logs::capture();

    for flavor in FLAVORS {
        let key = canary("logs");
        let cut = {
            let frames = frames(flavor.text());
            let mut pieces = chunked(&frames[..=flavor.frames_before_output()].concat(), 61);
            pieces.extend([Piece::Pause(Duration::from_millis(20)), Piece::Cut]);
            Reply::Stream(pieces)
        };
        let failure = match flavor {
            Flavor::Responses => stream(RESPONSES_ERROR),
            Flavor::Chat => stream(CHAT_ERROR),
        };
        let replies = vec![
            echo_authorization(401),
            echo_authorization(503),
            failure,
            cut,
            stream(flavor.text()),
        ];
        let count = replies.len();
        let fake = Fake::start(replies).await;
        let h = harness(flavor.provider(&fake, false, fixed(&key)));
        for _ in 0..count {
            let job = h.submit(&request(""), LONG).await;
            run(&h, &job).await;
            let error = h.snapshot(job.execution_id).await.error;
            assert!(!format!("{error:?}").contains("CANARY"));
        }
        let seen = fake.requests();
        assert_eq!(seen.len(), count);
        assert!(
            seen.iter()
                .all(|r| r.header("authorization") == Some(format!("Bearer {key}").as_str()))
        );
    }
    let logs = captured.text();
    assert!(
        logs.contains("provider transport failed"),
        "logs were captured: {logs}"
    );
    testkit::canary::assert_absent(testkit::canary::MARKER, "the logs", &logs);
}

// ---------------------------------------------------------------------------------------------
// The deployment file builds both adapters with the declared capabilities [R 68]

#[test]
fn the_deployment_file_declares_the_capabilities() {
    let config = providers::deployment::parse(
        r#"{"providers":[
            {"type":"openai-responses","model":"gpt-4.1-mini","api_key_env":"OPENAI_API_KEY",
             "capabilities":{"input_modalities":["text","image","file"],"tools":true}},
            {"type":"openai-chat","id":"local","model":"llama3.1","api_key_env":"OLLAMA_KEY",
             "base_url":"http://localhost:11434/v1","abilities":["text-generation","chat"],
             "max_concurrency":2,"max_queue_depth":0}
        ]}"#,
    )
    .unwrap();
    let registry = worker::deployment::build_registry(&config).unwrap();
    let manifests = serde_json::to_value(registry.manifests()).unwrap();
    assert_eq!(
        manifests,
        json!([
            {"provider": "openai", "protocol_version": "0.1.0",
             "models": [{"model": "gpt-4.1-mini", "abilities": ["text-generation"],
                         "input_modalities": ["text", "image", "file"], "output_modalities": ["text"],
                         "stream": true, "tools": true, "structured_output": false,
                         "async": false, "cancel": true}],
             "limits": {"max_concurrency": 16, "max_queue_depth": 64}},
            {"provider": "local", "protocol_version": "0.1.0",
             "models": [{"model": "llama3.1", "abilities": ["text-generation", "chat"],
                         "input_modalities": ["text", "json"], "output_modalities": ["text"],
                         "stream": true, "tools": false, "structured_output": false,
                         "async": false, "cancel": true}],
             "limits": {"max_concurrency": 2, "max_queue_depth": 0}}
        ])
    );
    // Undeclared capabilities are not served: JSON input to the first, images to the second,
    // structured output to either.
    let serve = |json: &str| {
        registry.can_serve(&protocol::validate::parse_request(json.as_bytes()).unwrap())
    };
    assert!(serve(
        r#"{"ability":"chat","input":[{"type":"json","value":1}]}"#
    ));
    assert!(!serve(
        r#"{"ability":"chat","input":[{"type":"image","uri":"https://x.test/a.png"}]}"#
    ));
    assert!(!serve(
        r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}],"requirements":{"structured_output":true}}"#
    ));
}
