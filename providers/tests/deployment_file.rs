//! The deployment file as both binaries parse it: the `config` crate's format with every
//! provider section parsed by its type through the catalog. Errors name paths, never values.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use config::deployment::MAX_FILE_BYTES;
use config::limits::{DEFAULT_MAX_ACTIVE_EXECUTIONS, DEFAULT_RETENTION};
use config::{ConfigError, EventStoreConfig, FlowLimits, Limits};
use protocol::request::Modality;
use providers::ProviderConfig;
use providers::deployment::{load, parse, standalone};
use providers::fal::FalConfig;
use providers::mock::MockConfig;
use providers::text::TextProviderConfig;

/// A section type of [`ProviderConfig`]'s variants.
trait Section: Sized {
    fn of(provider: &ProviderConfig) -> Option<Self>;
}

impl Section for MockConfig {
    fn of(provider: &ProviderConfig) -> Option<Self> {
        match provider {
            ProviderConfig::Mock(c) => Some(c.clone()),
            _ => None,
        }
    }
}

impl Section for TextProviderConfig {
    fn of(provider: &ProviderConfig) -> Option<Self> {
        match provider {
            ProviderConfig::OpenAiResponses(c)
            | ProviderConfig::AnthropicMessages(c)
            | ProviderConfig::OpenAiChat(c) => Some(c.clone()),
            _ => None,
        }
    }
}

impl Section for FalConfig {
    fn of(provider: &ProviderConfig) -> Option<Self> {
        match provider {
            ProviderConfig::FalQueue(c) => Some(c.clone()),
            _ => None,
        }
    }
}

/// The settings of `provider`, which must be of type `type_name`.
fn settings_of<T: Section>(provider: &ProviderConfig, type_name: &str) -> T {
    assert_eq!(provider.type_name(), type_name);
    T::of(provider).expect("settings of the type's config")
}

fn err(json: &str) -> String {
    parse(json)
        .expect_err("config should be rejected")
        .to_string()
}

/// `{"providers":[PROVIDER]}`
fn with_provider(provider: &str) -> String {
    format!(r#"{{"providers":[{provider}]}}"#)
}

fn only_provider(provider: &str) -> ProviderConfig {
    let mut config = parse(&with_provider(provider)).unwrap();
    assert_eq!(config.providers.len(), 1);
    config.providers.remove(0)
}

/// The settings of the one provider of a file holding only `provider`, checking its type.
fn only_section<T: Section>(provider: &str, type_name: &str) -> T {
    settings_of(&only_provider(provider), type_name)
}

/// Checks the id of `section`, its base URL (as written and as shown, which are the same
/// text), and the URL it sends requests for `path` to.
fn assert_addressed(
    section: &TextProviderConfig,
    id: &str,
    base_url: &str,
    (path, endpoint): (&str, &str),
) {
    assert_eq!(section.id, id);
    assert_eq!(section.base_url.as_str(), base_url);
    assert_eq!(section.base_url.to_string(), base_url);
    assert_eq!(section.base_url.endpoint(path).unwrap().as_str(), endpoint);
}

const OPENAI: &str = r#"{"type":"openai-responses","model":"m","api_key_env":"OPENAI_API_KEY""#;

#[test]
fn no_file_runs_the_mock_alone_with_small_limits() {
    let config = standalone();
    assert_eq!(config.providers.len(), 1);
    let mock: MockConfig = settings_of(&config.providers[0], "mock");
    assert_eq!(mock.id, "provider-mock");
    assert_eq!(mock.model, "model-alpha");
    assert_eq!(mock.abilities, ["text-generation"]);
    assert_eq!(mock.chunks, ["hello", " from", " mock"]);
    assert_eq!(mock.delay, Duration::ZERO);
    assert!(!mock.fail_retryably);
    assert_eq!(
        config.providers[0].flow(),
        FlowLimits {
            max_concurrency: 4,
            max_queue_depth: 8
        }
    );
    // The root settings are the config crate's defaults, whose values its tests pin.
    assert_eq!(config.max_active_executions, DEFAULT_MAX_ACTIVE_EXECUTIONS);
    assert_eq!(config.retention, DEFAULT_RETENTION);
    assert_eq!(config.limits, Limits::default());
    assert_eq!(config.event_store, EventStoreConfig::default());
}

#[test]
fn mock_only_file_gets_config_defaults() {
    let config = parse(r#"{"providers":[{"type":"mock"}]}"#).unwrap();
    let mock: MockConfig = settings_of(&config.providers[0], "mock");
    assert_eq!(
        mock,
        MockConfig {
            flow: FlowLimits::CONFIG_DEFAULT,
            ..MockConfig::default()
        }
    );
    assert_eq!(config.providers[0].flow().max_concurrency, 16);
    assert_eq!(config.providers[0].flow().max_queue_depth, 64);
    assert_eq!(config.providers[0].type_name(), "mock");
    let defaults = standalone();
    assert_eq!(config.max_active_executions, defaults.max_active_executions);
    assert_eq!(config.limits, defaults.limits);
    assert_eq!(config.retention, defaults.retention);
    assert_eq!(config.event_store, defaults.event_store);
}

#[test]
fn mock_with_every_field() {
    let provider = only_provider(
        r#"{"type":"mock","id":"demo","model":"m1","abilities":["a","b"],"chunks":[],
            "delay_ms":250,"fail_retryably":true,"max_concurrency":2,"max_queue_depth":0}"#,
    );
    assert_eq!(
        settings_of::<MockConfig>(&provider, "mock"),
        MockConfig {
            id: "demo".into(),
            model: "m1".into(),
            abilities: vec!["a".into(), "b".into()],
            chunks: vec![],
            delay: Duration::from_millis(250),
            fail_retryably: true,
            flow: FlowLimits {
                max_concurrency: 2,
                max_queue_depth: 0
            },
        }
    );
}

#[test]
fn reference_example_config_parses() {
    // deploy/runtime-config.example.json of the reference.
    let config = parse(
        r#"{
          "providers": [
            {
              "type": "openai-responses",
              "id": "provider-a",
              "capabilities": { "input_modalities": ["text", "json"], "tools": false },
              "model": "model-public",
              "abilities": ["text-generation"],
              "api_key_env": "PROVIDER_A_API_KEY"
            },
            {
              "type": "anthropic-messages",
              "id": "provider-b",
              "capabilities": { "input_modalities": ["text", "json"], "tools": false },
              "model": "model-public",
              "abilities": ["text-generation"],
              "api_key_env": "PROVIDER_B_API_KEY"
            },
            {
              "type": "fal-queue",
              "id": "provider-media",
              "model": "models/image",
              "ability": "image-generation",
              "input_modalities": ["text", "json"],
              "output_modalities": ["image"],
              "api_key_env": "PROVIDER_MEDIA_API_KEY"
            }
          ]
        }"#,
    )
    .unwrap();
    let ids: Vec<&str> = config.providers.iter().map(ProviderConfig::id).collect();
    assert_eq!(ids, ["provider-a", "provider-b", "provider-media"]);
    let openai: TextProviderConfig = settings_of(&config.providers[0], "openai-responses");
    assert_eq!(openai.model, "model-public");
    assert_eq!(openai.api_key_env, "PROVIDER_A_API_KEY");
    assert_eq!(openai.base_url.as_str(), "https://api.openai.com/v1");
    assert_eq!(openai.input_modalities, [Modality::Text, Modality::Json]);
    assert!(!openai.tools);
    assert_eq!(openai.flow, FlowLimits::CONFIG_DEFAULT);
    let anthropic: TextProviderConfig = settings_of(&config.providers[1], "anthropic-messages");
    assert_eq!(anthropic.base_url.as_str(), "https://api.anthropic.com");
    assert_eq!(anthropic.api_key_env, "PROVIDER_B_API_KEY");
    let fal: FalConfig = settings_of(&config.providers[2], "fal-queue");
    assert_eq!(fal.model, "models/image");
    assert_eq!(fal.ability, "image-generation");
    assert_eq!(fal.base_url.as_str(), "https://queue.fal.run");
    assert_eq!(fal.input_modalities, [Modality::Text, Modality::Json]);
    assert_eq!(fal.output_modalities, [Modality::Image]);
}

#[test]
fn text_provider_defaults() {
    let openai: TextProviderConfig = only_section(&format!("{OPENAI}}}"), "openai-responses");
    assert_eq!(openai.id, "openai");
    assert_eq!(openai.abilities, ["text-generation"]);
    assert_eq!(openai.input_modalities, [Modality::Text, Modality::Json]);
    assert!(!openai.tools);
    let anthropic: TextProviderConfig = only_section(
        r#"{"type":"anthropic-messages","model":"claude","api_key_env":"ANTHROPIC_API_KEY"}"#,
        "anthropic-messages",
    );
    assert_addressed(
        &anthropic,
        "anthropic",
        "https://api.anthropic.com",
        ("v1/messages", "https://api.anthropic.com/v1/messages"),
    );
    let fal: FalConfig = only_section(
        r#"{"type":"fal-queue","model":"x/y","ability":"i","api_key_env":"FAL_KEY"}"#,
        "fal-queue",
    );
    assert_eq!(fal.id, "fal");
    assert_eq!(fal.output_modalities, [Modality::Json]);
    assert_eq!(fal.flow, FlowLimits::CONFIG_DEFAULT);
}

#[test]
fn openai_chat_on_loopback() {
    let chat: TextProviderConfig = only_section(
        r#"{"type":"openai-chat","model":"llama","api_key_env":"LOCAL_KEY",
            "base_url":"http://127.0.0.1:8080/v1",
            "capabilities":{"input_modalities":["text","image"],"tools":true},
            "max_concurrency":1,"max_queue_depth":0}"#,
        "openai-chat",
    );
    assert_addressed(
        &chat,
        "openai-chat",
        "http://127.0.0.1:8080/v1",
        (
            "chat/completions",
            "http://127.0.0.1:8080/v1/chat/completions",
        ),
    );
    assert_eq!(chat.input_modalities, [Modality::Text, Modality::Image]);
    assert!(chat.tools);
    assert_eq!(
        chat.flow,
        FlowLimits {
            max_concurrency: 1,
            max_queue_depth: 0
        }
    );
    assert_eq!(
        err(&with_provider(
            r#"{"type":"openai-chat","model":"m","api_key_env":"LOCAL_KEY"}"#
        )),
        "providers[0].base_url is required"
    );
}

#[test]
fn root_options() {
    let config = parse(
        r#"{"providers":[{"type":"mock"}],"max_active_executions":3,"retention_ms":5000,
            "limits":{"max_body_bytes":2048,"max_deadline_ms":60000,"default_deadline_ms":1000,
                      "max_sse_streams":7,"header_timeout_ms":2000,"body_timeout_ms":3000,
                          "idle_timeout_ms":4000,"max_connections":500},
            "event_store":{"type":"memory","max_executions":5,"max_bytes":6,
                           "max_execution_bytes":7,"max_events":8}}"#,
    )
    .unwrap();
    assert_eq!(config.max_active_executions, 3);
    assert_eq!(config.retention, Duration::from_millis(5000));
    assert_eq!(
        config.limits,
        Limits {
            max_body_bytes: 2048,
            max_deadline_ms: 60_000,
            default_deadline_ms: 1000,
            max_sse_streams: 7,
            header_timeout_ms: 2000,
            body_timeout_ms: 3000,
            idle_timeout_ms: 4000,
            max_connections: Some(500),
        }
    );
    assert_eq!(
        config.event_store,
        EventStoreConfig {
            max_executions: 5,
            max_bytes: 6,
            max_execution_bytes: 7,
            max_events: 8
        }
    );
}

#[test]
fn event_store_retention_overrides_root_retention() {
    let config = parse(
        r#"{"providers":[{"type":"mock"}],"retention_ms":5000,
            "event_store":{"type":"memory","retention_ms":9000}}"#,
    )
    .unwrap();
    assert_eq!(config.retention, Duration::from_millis(9000));
    let config =
        parse(r#"{"providers":[{"type":"mock"}],"event_store":{"type":"memory"}}"#).unwrap();
    assert_eq!(config.retention, config::limits::DEFAULT_RETENTION);
    assert_eq!(config.event_store, EventStoreConfig::default());
}

#[test]
fn default_deadline_shrinks_to_a_smaller_max() {
    let config =
        parse(r#"{"providers":[{"type":"mock"}],"limits":{"max_deadline_ms":1000}}"#).unwrap();
    assert_eq!(config.limits.max_deadline_ms, 1000);
    assert_eq!(config.limits.default_deadline_ms, 1000);
}

#[test]
fn unknown_fields_are_named_by_path() {
    let cases = [
        (r#"{"providers":[{"type":"mock"}],"extra":1}"#, "extra"),
        (
            &with_provider(r#"{"type":"mock","api_key":"x"}"#),
            "providers[0].api_key",
        ),
        (
            &with_provider(r#"{"type":"mock","capabilities":{}}"#),
            "providers[0].capabilities",
        ),
        (
            &with_provider(&format!(r#"{OPENAI},"api_key":"x"}}"#)),
            "providers[0].api_key",
        ),
        (
            &with_provider(&format!(r#"{OPENAI},"chunks":[]}}"#)),
            "providers[0].chunks",
        ),
        (
            &with_provider(&format!(r#"{OPENAI},"input_modalities":["text"]}}"#)),
            "providers[0].input_modalities",
        ),
        (
            &with_provider(&format!(r#"{OPENAI},"capabilities":{{"stream":true}}}}"#)),
            "providers[0].capabilities.stream",
        ),
        (
            &with_provider(
                r#"{"type":"anthropic-messages","model":"m","api_key_env":"AK","headers":{}}"#,
            ),
            "providers[0].headers",
        ),
        (
            &with_provider(
                r#"{"type":"openai-chat","model":"m","api_key_env":"AK","base_url":"https://h","organization":"o"}"#,
            ),
            "providers[0].organization",
        ),
        (
            &with_provider(
                r#"{"type":"fal-queue","model":"m","ability":"a","api_key_env":"AK","abilities":["a"]}"#,
            ),
            "providers[0].abilities",
        ),
        (
            &with_provider(
                r#"{"type":"fal-queue","model":"m","ability":"a","api_key_env":"AK","capabilities":{}}"#,
            ),
            "providers[0].capabilities",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"limits":{"max_body":1}}"#,
            "limits.max_body",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"event_store":{"type":"memory","compress":true}}"#,
            "event_store.compress",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"event_store":{"type":"memory","directory":"/d"}}"#,
            "event_store.directory",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"event_store":{"type":"memory","encryption_key_env":"K"}}"#,
            "event_store.encryption_key_env",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"event_store":{"type":"memory","max_disk_bytes":1}}"#,
            "event_store.max_disk_bytes",
        ),
        (
            r#"{"providers":[{"type":"mock"},{"type":"mock","id":"b","secret":1}]}"#,
            "providers[1].secret",
        ),
    ];
    for (json, path) in cases {
        assert_eq!(
            parse(json).unwrap_err(),
            ConfigError::UnknownField { path: path.into() },
            "{json}"
        );
        assert_eq!(err(json), format!("unsupported or unsafe field {path}"));
    }
}

#[test]
fn odd_keys_stay_on_one_printable_line() {
    let message = err("{\"providers\":[{\"type\":\"mock\"}],\"a\\nb\\u0000\\u00e9\":1}");
    assert_eq!(
        message,
        r#"unsupported or unsafe field ["a\nb\u{0}\u{e9}"]"#
    );
    let long = "k".repeat(100);
    let message = err(&format!(
        r#"{{"providers":[{{"type":"mock","{long}":1}}]}}"#
    ));
    assert_eq!(
        message,
        format!(
            r#"unsupported or unsafe field providers[0]["{}..."]"#,
            "k".repeat(64)
        )
    );
}

#[test]
fn values_never_appear_in_errors() {
    const CANARY: &str = "sk-CANARY-9f8e7d";
    let cases = [
        format!(r#"{{"providers":[{{"type":"mock"}}],"api_key":"{CANARY}"}}"#),
        with_provider(&format!(r#"{{"type":"mock","api_key":"{CANARY}"}}"#)),
        with_provider(&format!(r#"{OPENAI},"api_key":"{CANARY}"}}"#)),
        with_provider(&format!(r#"{{"type":"{CANARY}"}}"#)),
        with_provider(&format!(
            r#"{{"type":"openai-responses","model":"m","api_key_env":"{CANARY}"}}"#
        )),
        with_provider(&format!(
            r#"{OPENAI},"base_url":"https://{CANARY}@api.test"}}"#
        )),
        with_provider(&format!(
            r#"{OPENAI},"base_url":"https://user:{CANARY}@api.test"}}"#
        )),
        with_provider(&format!(
            r#"{OPENAI},"base_url":"https://api.test/?key={CANARY}"}}"#
        )),
        with_provider(&format!(r#"{OPENAI},"base_url":"http://{CANARY}.test"}}"#)),
        with_provider(&format!(r#"{OPENAI},"base_url":"{CANARY}"}}"#)),
        with_provider(&format!(
            r#"{OPENAI},"capabilities":{{"input_modalities":["{CANARY}"]}}}}"#
        )),
        with_provider(&format!(r#"{{"type":"mock","delay_ms":"{CANARY}"}}"#)),
        with_provider(&format!(
            r#"{{"type":"mock","id":"{}{CANARY}"}}"#,
            "x".repeat(300)
        )),
        with_provider(&format!(
            r#"{{"type":"mock","chunks":[{{"k":"{CANARY}"}}]}}"#
        )),
        format!(r#"{{"providers":[{{"type":"mock"}}],"event_store":{{"type":"{CANARY}"}}}}"#),
        format!(r#"{{"providers":[{{"type":"mock"}}],"limits":"{CANARY}"}}"#),
        format!(r#"{{"providers":[{{"type":"mock","api_key":"{CANARY}" oops}}]}}"#),
        format!(r#"{{"providers":[{{"type":"mock","api_key":"{CANARY}\u0001"}}]}}"#),
    ];
    for json in &cases {
        let message = err(json);
        assert!(!message.contains("CANARY"), "{message}");
        assert!(!message.contains('\n'), "{message}");
        let debug = format!("{:?}", parse(json));
        assert!(!debug.contains("CANARY"), "{debug}");
    }
}

#[test]
fn type_errors_name_the_path() {
    let cases = [
        (
            with_provider(r#"{"type":"mock","delay_ms":-1}"#),
            "providers[0].delay_ms must be a non-negative integer",
        ),
        (
            with_provider(r#"{"type":"mock","delay_ms":"5"}"#),
            "providers[0].delay_ms must be a non-negative integer",
        ),
        (
            with_provider(r#"{"type":"mock","delay_ms":1.5}"#),
            "providers[0].delay_ms must be a non-negative integer",
        ),
        (
            with_provider(r#"{"type":"mock","delay_ms":3600001}"#),
            "providers[0].delay_ms must be at most 3600000",
        ),
        (
            with_provider(r#"{"type":"mock","fail_retryably":"yes"}"#),
            "providers[0].fail_retryably must be true or false",
        ),
        (
            with_provider(r#"{"type":"mock","chunks":"hello"}"#),
            "providers[0].chunks must be an array of strings",
        ),
        (
            with_provider(r#"{"type":"mock","chunks":["a",1]}"#),
            "providers[0].chunks[1] must be a string",
        ),
        (
            with_provider(r#"{"type":"mock","id":null}"#),
            "providers[0].id must be a string of 1 to 256 characters",
        ),
        (
            with_provider(&format!(r#"{OPENAI},"capabilities":{{"tools":"no"}}}}"#)),
            "providers[0].capabilities.tools must be true or false",
        ),
        (
            with_provider(&format!(r#"{OPENAI},"capabilities":[]}}"#)),
            "providers[0].capabilities must be an object",
        ),
        (
            with_provider(&format!(r#"{OPENAI},"base_url":5}}"#)),
            "providers[0].base_url must be a string",
        ),
        (
            with_provider(r#"{"type":"mock","max_concurrency":0}"#),
            "providers[0].max_concurrency must be a positive integer",
        ),
        (
            with_provider(r#"{"type":"mock","max_concurrency":4294967296}"#),
            "providers[0].max_concurrency must be at most 4294967295",
        ),
        (
            with_provider(r#"{"type":"mock","max_queue_depth":-1}"#),
            "providers[0].max_queue_depth must be a non-negative integer",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"max_active_executions":0}"#.into(),
            "max_active_executions must be a positive integer",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"retention_ms":0}"#.into(),
            "retention_ms must be a positive integer",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"retention_ms":null}"#.into(),
            "retention_ms must be a positive integer",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"limits":[]}"#.into(),
            "limits must be an object",
        ),
        (
            r#"{"providers":[{"type":"mock"}],"event_store":true}"#.into(),
            "event_store must be an object",
        ),
        ("[]".into(), "configuration root must be a JSON object"),
        ("null".into(), "configuration root must be a JSON object"),
        (
            r#"{"providers":[1]}"#.into(),
            "providers[0] must be an object",
        ),
    ];
    for (json, expected) in cases {
        assert_eq!(err(&json), expected, "{json}");
    }
}

#[test]
fn integral_floats_count_as_integers() {
    let mock: MockConfig = only_section(r#"{"type":"mock","delay_ms":5.0}"#, "mock");
    assert_eq!(mock.delay, Duration::from_millis(5));
}

#[test]
fn providers_must_be_a_non_empty_array() {
    assert_eq!(err("{}"), "providers is required");
    assert_eq!(
        err(r#"{"providers":[]}"#),
        "providers must be a non-empty array"
    );
    assert_eq!(
        err(r#"{"providers":{"type":"mock"}}"#),
        "providers must be a non-empty array"
    );
}

#[test]
fn provider_type_is_checked() {
    let expected = "providers[1].type must be one of mock, openai-responses, \
                    anthropic-messages, openai-chat, fal-queue";
    assert_eq!(
        err(r#"{"providers":[{"type":"mock"},{"type":"bedrock"}]}"#),
        expected
    );
    assert_eq!(
        err(r#"{"providers":[{"type":"mock"},{"type":7}]}"#),
        expected
    );
    assert_eq!(
        err(r#"{"providers":[{"type":"mock"},{"id":"x"}]}"#),
        "providers[1].type is required"
    );
}

#[test]
fn duplicate_provider_ids_are_rejected() {
    assert_eq!(
        err(
            r#"{"providers":[{"type":"mock","id":"a"},{"type":"mock","id":"b"},{"type":"mock","id":"a"}]}"#
        ),
        "providers[2].id duplicates an earlier provider id"
    );
    // Defaults collide too.
    assert_eq!(
        err(&format!(r#"{{"providers":[{OPENAI}}},{OPENAI}}}]}}"#)),
        "providers[1].id duplicates an earlier provider id"
    );
}

#[test]
fn names_are_1_to_256_characters() {
    let ok = "é".repeat(256);
    let mock: MockConfig = only_section(
        &format!(r#"{{"type":"mock","id":"{ok}","model":"{ok}"}}"#),
        "mock",
    );
    assert_eq!(mock.id.chars().count(), 256);
    let long = "x".repeat(257);
    let cases = [
        (
            with_provider(r#"{"type":"mock","id":""}"#),
            "providers[0].id",
        ),
        (
            with_provider(&format!(r#"{{"type":"mock","model":"{long}"}}"#)),
            "providers[0].model",
        ),
        (
            with_provider(r#"{"type":"mock","abilities":["a",""]}"#),
            "providers[0].abilities[1]",
        ),
        (
            with_provider(r#"{"type":"mock","abilities":[3]}"#),
            "providers[0].abilities[0]",
        ),
        (
            with_provider(r#"{"type":"fal-queue","model":"m","ability":"","api_key_env":"AK"}"#),
            "providers[0].ability",
        ),
    ];
    for (json, path) in cases {
        assert_eq!(
            err(&json),
            format!("{path} must be a string of 1 to 256 characters"),
            "{json}"
        );
    }
    assert_eq!(
        err(&with_provider(r#"{"type":"mock","abilities":[]}"#)),
        "providers[0].abilities must be a non-empty array of strings"
    );
    assert_eq!(
        err(&with_provider(r#"{"type":"mock","abilities":"a"}"#)),
        "providers[0].abilities must be a non-empty array of strings"
    );
}

#[test]
fn required_provider_fields() {
    assert_eq!(
        err(&with_provider(
            r#"{"type":"openai-responses","api_key_env":"AK"}"#
        )),
        "providers[0].model is required"
    );
    assert_eq!(
        err(&with_provider(
            r#"{"type":"anthropic-messages","model":"m"}"#
        )),
        "providers[0].api_key_env is required"
    );
    assert_eq!(
        err(&with_provider(
            r#"{"type":"fal-queue","model":"m","api_key_env":"AK"}"#
        )),
        "providers[0].ability is required"
    );
}

#[test]
fn api_key_env_must_be_an_uppercase_name() {
    for good in [
        "AK",
        "OPENAI_API_KEY",
        "A1",
        "A_",
        &format!("A{}", "B".repeat(127)),
    ] {
        let openai: TextProviderConfig = only_section(
            &format!(r#"{{"type":"openai-responses","model":"m","api_key_env":"{good}"}}"#),
            "openai-responses",
        );
        assert_eq!(openai.api_key_env, good);
    }
    for bad in [
        "A",
        "a_KEY",
        "1KEY",
        "_KEY",
        "API-KEY",
        "API KEY",
        "APÏ",
        "",
        &format!("A{}", "B".repeat(128)),
    ] {
        assert_eq!(
            err(&with_provider(&format!(
                r#"{{"type":"openai-responses","model":"m","api_key_env":"{bad}"}}"#
            ))),
            "providers[0].api_key_env must be an environment variable name: an uppercase \
             letter, then 1 to 127 uppercase letters, digits or underscores",
            "{bad}"
        );
    }
    assert!(
        err(&with_provider(
            r#"{"type":"openai-responses","model":"m","api_key_env":7}"#
        ))
        .starts_with("providers[0].api_key_env must be")
    );
}

fn base_url_of(url: &str) -> Result<String, String> {
    match parse(&with_provider(&format!(r#"{OPENAI},"base_url":"{url}"}}"#))) {
        Ok(config) => {
            let c: TextProviderConfig = settings_of(&config.providers[0], "openai-responses");
            Ok(c.base_url.as_str().to_owned())
        }
        Err(error) => Err(error.to_string()),
    }
}

#[test]
fn base_url_accepts_https_and_loopback_http() {
    let cases = [
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
        ("https://api.example.com", "https://api.example.com"),
        ("https://api.example.com/", "https://api.example.com"),
        (
            "https://api.example.com:8443/a//",
            "https://api.example.com:8443/a",
        ),
        ("HTTPS://API.Example.COM/v1", "https://api.example.com/v1"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
        ("http://localhost:11434/v1", "http://localhost:11434/v1"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("http://[::1]", "http://[::1]"),
    ];
    for (input, stored) in cases {
        assert_eq!(base_url_of(input), Ok(stored.to_owned()), "{input}");
    }
}

#[test]
fn base_url_rejects_remote_http_credentials_query_and_fragment() {
    let expected = "providers[0].base_url must be https or loopback http without \
                    credentials, query or fragment";
    for input in [
        "http://api.example.com/v1",
        "http://10.0.0.1/v1",
        "http://127.0.0.2/v1",
        "http://[::2]/v1",
        "http://localhost.example.com/v1",
        "ftp://127.0.0.1/",
        "file:///etc/passwd",
        "https://user@api.example.com/v1",
        "https://user:pass@api.example.com/v1",
        "https://:pass@api.example.com/v1",
        "https://api.example.com/v1?key=1",
        "https://api.example.com/v1?",
        "https://api.example.com/v1#frag",
        "https://api.example.com/v1#",
        "api.example.com/v1",
        "/v1",
        "",
        "https://",
    ] {
        assert_eq!(base_url_of(input), Err(expected.to_owned()), "{input}");
    }
}

#[test]
fn modalities_are_checked() {
    let fal: FalConfig = only_section(
        r#"{"type":"fal-queue","model":"m","ability":"a","api_key_env":"AK",
            "input_modalities":["image","text"],"output_modalities":["video","audio","file"]}"#,
        "fal-queue",
    );
    assert_eq!(fal.input_modalities, [Modality::Image, Modality::Text]);
    assert_eq!(
        fal.output_modalities,
        [Modality::Video, Modality::Audio, Modality::File]
    );
    let openai: TextProviderConfig = only_section(
        &format!(
            r#"{OPENAI},"capabilities":{{"input_modalities":["file","image","json","text"]}}}}"#
        ),
        "openai-responses",
    );
    assert_eq!(openai.input_modalities.len(), 4);

    let fal = |field: &str| {
        with_provider(&format!(
            r#"{{"type":"fal-queue","model":"m","ability":"a","api_key_env":"AK",{field}}}"#
        ))
    };
    let cases = [
        (
            fal(r#""input_modalities":["text","text"]"#),
            "providers[0].input_modalities[1] repeats an earlier modality",
        ),
        (
            fal(r#""input_modalities":[]"#),
            "providers[0].input_modalities must be a non-empty array of modalities",
        ),
        (
            fal(r#""input_modalities":"text""#),
            "providers[0].input_modalities must be a non-empty array of modalities",
        ),
        (
            fal(r#""input_modalities":["text","audio"]"#),
            "providers[0].input_modalities[1] must be one of text, json, image",
        ),
        (
            fal(r#""output_modalities":["json","hologram"]"#),
            "providers[0].output_modalities[1] must be one of text, image, audio, video, \
             file, json",
        ),
        (
            fal(r#""output_modalities":[1]"#),
            "providers[0].output_modalities[0] must be one of text, image, audio, video, \
             file, json",
        ),
        (
            with_provider(&format!(
                r#"{OPENAI},"capabilities":{{"input_modalities":["text","audio"]}}}}"#
            )),
            "providers[0].capabilities.input_modalities[1] must be one of text, json, \
             image, file",
        ),
        (
            with_provider(
                r#"{"type":"anthropic-messages","model":"m","api_key_env":"AK",
                    "capabilities":{"input_modalities":["file"]}}"#,
            ),
            "providers[0].capabilities.input_modalities[0] must be one of text, json, image",
        ),
    ];
    for (json, expected) in cases {
        assert_eq!(err(&json), expected, "{json}");
    }
}

#[test]
fn limits_are_bounded() {
    let limits = |body: &str| format!(r#"{{"providers":[{{"type":"mock"}}],"limits":{body}}}"#);
    let max = parse(&limits(
        r#"{"max_body_bytes":67108864,"max_deadline_ms":86400000,
            "default_deadline_ms":86400000,"max_sse_streams":1}"#,
    ))
    .unwrap();
    assert_eq!(max.limits.max_body_bytes, 64 << 20);
    assert_eq!(max.limits.default_deadline_ms, 86_400_000);
    let cases = [
        (
            r#"{"max_body_bytes":0}"#,
            "limits.max_body_bytes must be a positive integer",
        ),
        (
            r#"{"max_body_bytes":67108865}"#,
            "limits.max_body_bytes must be at most 67108864",
        ),
        (
            r#"{"max_deadline_ms":0}"#,
            "limits.max_deadline_ms must be a positive integer",
        ),
        (
            r#"{"max_deadline_ms":86400001}"#,
            "limits.max_deadline_ms must be at most 86400000",
        ),
        (
            r#"{"default_deadline_ms":0}"#,
            "limits.default_deadline_ms must be a positive integer",
        ),
        (
            r#"{"max_deadline_ms":1000,"default_deadline_ms":1001}"#,
            "limits.default_deadline_ms must not exceed limits.max_deadline_ms",
        ),
        (
            r#"{"max_sse_streams":0}"#,
            "limits.max_sse_streams must be a positive integer",
        ),
        (
            r#"{"max_sse_streams":9007199254740992}"#,
            "limits.max_sse_streams must be at most 9007199254740991",
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(err(&limits(body)), expected, "{body}");
    }
}

#[test]
fn event_store_must_be_memory() {
    let store = |body: &str| format!(r#"{{"providers":[{{"type":"mock"}}],"event_store":{body}}}"#);
    // deploy/runtime-store.example.json of the reference.
    let reference = r#"{
      "max_active_executions": 16,
      "event_store": {
        "type": "file",
        "directory": "/var/lib/model-runtime/events",
        "encryption_key_env": "MODEL_RUNTIME_EVENT_STORE_KEY",
        "max_executions": 1000,
        "max_bytes": 67108864,
        "max_execution_bytes": 4194304,
        "max_events": 4096,
        "retention_ms": 86400000,
        "max_disk_bytes": 268435456
      },
      "providers": [{ "type": "mock" }]
    }"#;
    assert_eq!(parse(reference).unwrap_err(), ConfigError::FileEventStore);
    assert_eq!(
        err(reference),
        "event_store type file is not supported; use backend nats for durable storage"
    );
    let cases = [
        (r#"{}"#, "event_store.type is required"),
        (r#"{"type":"disk"}"#, "event_store.type must be memory"),
        (r#"{"type":null}"#, "event_store.type must be memory"),
        (
            r#"{"type":"memory","max_executions":0}"#,
            "event_store.max_executions must be a positive integer",
        ),
        (
            r#"{"type":"memory","max_bytes":-5}"#,
            "event_store.max_bytes must be a positive integer",
        ),
        (
            r#"{"type":"memory","max_execution_bytes":1.5}"#,
            "event_store.max_execution_bytes must be a positive integer",
        ),
        (
            r#"{"type":"memory","max_events":"10"}"#,
            "event_store.max_events must be a positive integer",
        ),
        (
            r#"{"type":"memory","retention_ms":0}"#,
            "event_store.retention_ms must be a positive integer",
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(err(&store(body)), expected, "{body}");
    }
}

#[test]
fn invalid_json_reports_position_only() {
    let error =
        parse("{\n  \"providers\": [\n    {\"type\": \"mock\", \"api_key\": sk-CANARY}\n  ]\n}")
            .unwrap_err();
    let ConfigError::Json { line, column } = error else {
        panic!("expected a JSON error, got {error:?}");
    };
    assert_eq!(line, 3);
    assert!(column > 0);
    assert_eq!(
        error.to_string(),
        format!("configuration file is not valid JSON (line 3, column {column})")
    );
    assert!(matches!(parse(""), Err(ConfigError::Json { .. })));
    assert!(matches!(
        config::deployment::parse_bytes(
            b"{\"providers\":[{\"type\":\"mo\xffck\"}]}",
            &providers::Catalog
        ),
        Err(ConfigError::Json { .. })
    ));
    // A byte-order mark is tolerated.
    assert!(parse("\u{feff}{\"providers\":[{\"type\":\"mock\"}]}").is_ok());
}

#[test]
fn load_reads_a_file() {
    let dir = std::env::temp_dir().join(format!(
        "worker-config-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runtime.json");
    std::fs::write(
        &path,
        r#"{"providers":[{"type":"mock","id":"from-file"}],"max_active_executions":2}"#,
    )
    .unwrap();
    let config = load(&path).unwrap();
    assert_eq!(config.providers[0].id(), "from-file");
    assert_eq!(config.max_active_executions, 2);

    std::fs::write(
        &path,
        r#"{"providers":[{"type":"mock","api_key":"sk-CANARY"}]}"#,
    )
    .unwrap();
    let message = load(&path).unwrap_err().to_string();
    assert_eq!(message, "unsupported or unsafe field providers[0].api_key");

    let missing = dir.join("missing.json");
    let error = load(&missing).unwrap_err();
    assert_eq!(
        error,
        ConfigError::Io {
            path: missing.clone(),
            kind: std::io::ErrorKind::NotFound
        }
    );
    assert!(error.to_string().starts_with("configuration file \""));
    assert!(error.to_string().contains("could not be read"));

    let big = dir.join("big.json");
    std::fs::write(
        &big,
        vec![b' '; usize::try_from(MAX_FILE_BYTES).unwrap() + 1],
    )
    .unwrap();
    assert_eq!(
        load(&big).unwrap_err(),
        ConfigError::TooLarge { path: big.clone() }
    );

    std::fs::remove_dir_all(&dir).unwrap();
}
