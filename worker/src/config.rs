//! The deployment file (`MODEL_RUNTIME_CONFIG`, JSON): which providers run, their flow limits,
//! request limits, retention and event-store bounds, typed once at startup.
//!
//! Parsing is strict. Every object in the file has a closed set of fields (the reference's
//! format [R 76-79] plus our additions, contract section 6); anything else fails startup, so a
//! misspelt limit or a credential pasted where it does not belong (`"api_key": "..."`) is
//! caught instead of being silently ignored.
//!
//! The one decision a reader must know: **errors name the field's path in the file, never its
//! value.** The file is walked by hand as a [`serde_json::Value`] rather than through serde
//! derives, because derive errors quote what they failed on and any value may be a secret.
//! A [`ConfigError`] is one line such as `unsupported or unsafe field providers[1].api_key` or
//! `providers[0].delay_ms must be a non-negative integer`, safe to print on stderr and to log.
//!
//! Credentials are never read here: a provider names its environment variable
//! (`api_key_env`) and the adapter reads it at execution time.

use std::collections::HashSet;
use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use protocol::request::{MAX_DURATION_MS, Modality};
use serde_json::{Map, Value};
use url::{Host, Url};

/// Default for `max_active_executions`. The reference uses 16, which a single busy client
/// exhausts; executions waiting on slow providers are cheap here, and per-provider flow
/// control still bounds what reaches each provider.
pub const DEFAULT_MAX_ACTIVE_EXECUTIONS: usize = 1024;
/// Default retention of a finished execution (24 hours) [R 82].
pub const DEFAULT_RETENTION: Duration = Duration::from_millis(86_400_000);
/// Largest mock `delay_ms` (one hour).
pub const MAX_MOCK_DELAY_MS: u64 = 3_600_000;
/// Largest `limits.max_body_bytes` (64 MiB).
pub const MAX_BODY_BYTES_LIMIT: usize = 64 * MIB;
/// Largest configuration file read (4 MiB); a deployment file is a few kilobytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

const MIB: usize = 1024 * 1024;
/// Integers above this are not exact in JSON consumers such as the reference (JS safe integer).
const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;
/// Longest id, model, ability and each entry of `abilities`, in Unicode scalar values.
const MAX_NAME_CHARS: usize = 256;
/// Longest unknown key shown in an error path; longer keys are cut.
const MAX_KEY_CHARS_SHOWN: usize = 64;
const DEFAULT_ABILITY: &str = "text-generation";
const UNSAFE_BASE_URL: &str =
    "must be https or loopback http without credentials, query or fragment";

const ROOT_FIELDS: &[&str] = &[
    "providers",
    "max_active_executions",
    "event_store",
    "limits",
    "retention_ms",
];
const LIMITS_FIELDS: &[&str] = &[
    "max_body_bytes",
    "max_deadline_ms",
    "default_deadline_ms",
    "max_sse_streams",
    "header_timeout_ms",
    "body_timeout_ms",
    "idle_timeout_ms",
    "max_connections",
];
/// `memory` fields only: the reference's file-only fields (`directory`, `encryption_key_env`,
/// `max_disk_bytes`) are therefore "unsupported or unsafe".
const EVENT_STORE_FIELDS: &[&str] = &[
    "type",
    "max_executions",
    "max_bytes",
    "max_execution_bytes",
    "max_events",
    "retention_ms",
];
const MOCK_FIELDS: &[&str] = &[
    "type",
    "id",
    "model",
    "abilities",
    "chunks",
    "delay_ms",
    "fail_retryably",
    "max_concurrency",
    "max_queue_depth",
];
const TEXT_FIELDS: &[&str] = &[
    "type",
    "id",
    "model",
    "abilities",
    "api_key_env",
    "base_url",
    "capabilities",
    "max_concurrency",
    "max_queue_depth",
];
const CAPABILITY_FIELDS: &[&str] = &["input_modalities", "tools"];
const FAL_FIELDS: &[&str] = &[
    "type",
    "id",
    "model",
    "ability",
    "api_key_env",
    "base_url",
    "input_modalities",
    "output_modalities",
    "max_concurrency",
    "max_queue_depth",
];
const PROVIDER_TYPES: &str = "mock, openai-responses, anthropic-messages, openai-chat, fal-queue";

/// Everything the deployment file configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentConfig {
    /// In registration order, which is routing order [R 25]. Never empty.
    pub providers: Vec<ProviderConfig>,
    /// Executions admitted at once across all providers [R 38]; default
    /// [`DEFAULT_MAX_ACTIVE_EXECUTIONS`].
    pub max_active_executions: usize,
    pub limits: Limits,
    /// How long a finished execution stays readable: root `retention_ms`, overridden by
    /// `event_store.retention_ms`; default 24 h.
    pub retention: Duration,
    pub event_store: EventStoreConfig,
}

impl Default for DeploymentConfig {
    /// No file: the mock provider alone, with concurrency 4 and queue depth 8 [R 39].
    fn default() -> Self {
        Self {
            providers: vec![ProviderConfig::Mock(MockConfig::default())],
            max_active_executions: DEFAULT_MAX_ACTIVE_EXECUTIONS,
            limits: Limits::default(),
            retention: DEFAULT_RETENTION,
            event_store: EventStoreConfig::default(),
        }
    }
}

/// Request and connection limits (root `limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest submit body; 1 MiB by default [R 2], at most [`MAX_BODY_BYTES_LIMIT`].
    pub max_body_bytes: usize,
    /// Largest `deadline_ms` a caller may ask for; 24 h by default and at most.
    pub max_deadline_ms: u64,
    /// Deadline when the request sets none; 10 minutes by default, at most `max_deadline_ms`
    /// (when only `max_deadline_ms` is set and is smaller, the default shrinks to it).
    pub default_deadline_ms: u64,
    /// Open SSE streams per gateway process.
    pub max_sse_streams: usize,
    /// Time for a connection to send a request line and headers (10 s by default).
    pub header_timeout_ms: u64,
    /// Time to receive a request body once the headers are in (30 s by default).
    pub body_timeout_ms: u64,
    /// Keep-alive time between requests, and longest stall of a response write (60 s).
    pub idle_timeout_ms: u64,
    /// Open connections per gateway; `None`: the open-file limit minus a reserve.
    pub max_connections: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: MIB,
            max_deadline_ms: MAX_DURATION_MS,
            default_deadline_ms: 600_000,
            max_sse_streams: 10_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            max_connections: None,
        }
    }
}

/// Bounds of the in-memory event store (`event_store` with `type: "memory"`). Retention is
/// [`DeploymentConfig::retention`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventStoreConfig {
    /// Executions kept; the oldest finished ones are evicted first [R 83].
    pub max_executions: usize,
    /// Total bytes of stored events.
    pub max_bytes: usize,
    /// Bytes of one execution's events [R 84].
    pub max_execution_bytes: usize,
    /// Non-terminal events of one execution [R 84].
    pub max_events: usize,
}

impl Default for EventStoreConfig {
    /// Larger than the reference's 1000 executions / 64 MiB [R 82]; per-execution bounds match.
    fn default() -> Self {
        Self {
            max_executions: 10_000,
            max_bytes: 256 * MIB,
            max_execution_bytes: 4 * MIB,
            max_events: 4096,
        }
    }
}

/// A provider's concurrency gate [R 35-37].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowLimits {
    /// Attempts running at once; at least 1.
    pub max_concurrency: u32,
    /// Attempts waiting, FIFO; 0 means no queueing.
    pub max_queue_depth: u32,
}

impl FlowLimits {
    /// What a provider declared in the file gets unless it says otherwise [R 39].
    pub const CONFIG_DEFAULT: FlowLimits = FlowLimits {
        max_concurrency: 16,
        max_queue_depth: 64,
    };
    /// The mock running alone because no file was given [R 39, 74].
    pub const STANDALONE_MOCK: FlowLimits = FlowLimits {
        max_concurrency: 4,
        max_queue_depth: 8,
    };
}

impl Default for FlowLimits {
    fn default() -> Self {
        Self::CONFIG_DEFAULT
    }
}

/// One configured provider, by `type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderConfig {
    /// `mock`
    Mock(MockConfig),
    /// `openai-responses`
    OpenAiResponses(TextProviderConfig),
    /// `anthropic-messages`
    AnthropicMessages(TextProviderConfig),
    /// `openai-chat` (Chat Completions: vLLM, Ollama, llama.cpp, hosted gateways)
    OpenAiChat(TextProviderConfig),
    /// `fal-queue`
    FalQueue(FalConfig),
}

impl ProviderConfig {
    /// The provider id, unique within the file.
    pub fn id(&self) -> &str {
        match self {
            ProviderConfig::Mock(c) => &c.id,
            ProviderConfig::OpenAiResponses(c)
            | ProviderConfig::AnthropicMessages(c)
            | ProviderConfig::OpenAiChat(c) => &c.id,
            ProviderConfig::FalQueue(c) => &c.id,
        }
    }

    pub fn flow(&self) -> FlowLimits {
        match self {
            ProviderConfig::Mock(c) => c.flow,
            ProviderConfig::OpenAiResponses(c)
            | ProviderConfig::AnthropicMessages(c)
            | ProviderConfig::OpenAiChat(c) => c.flow,
            ProviderConfig::FalQueue(c) => c.flow,
        }
    }

    /// The `type` as written in the file.
    pub fn type_name(&self) -> &'static str {
        match self {
            ProviderConfig::Mock(_) => "mock",
            ProviderConfig::OpenAiResponses(_) => "openai-responses",
            ProviderConfig::AnthropicMessages(_) => "anthropic-messages",
            ProviderConfig::OpenAiChat(_) => "openai-chat",
            ProviderConfig::FalQueue(_) => "fal-queue",
        }
    }
}

/// `type: "mock"` [R 74-75].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockConfig {
    pub id: String,
    pub model: String,
    pub abilities: Vec<String>,
    /// Emitted in order as output deltas; may be empty.
    pub chunks: Vec<String>,
    /// `delay_ms`: waited before each chunk.
    pub delay: Duration,
    /// Fail with retryable `provider_unavailable` before any output.
    pub fail_retryably: bool,
    pub flow: FlowLimits,
}

impl Default for MockConfig {
    /// The reference mock. Its flow limits are [`FlowLimits::STANDALONE_MOCK`]; a mock declared
    /// in a file gets [`FlowLimits::CONFIG_DEFAULT`] unless it sets its own.
    fn default() -> Self {
        Self {
            id: "provider-mock".into(),
            model: "model-alpha".into(),
            abilities: vec![DEFAULT_ABILITY.into()],
            chunks: vec!["hello".into(), " from".into(), " mock".into()],
            delay: Duration::ZERO,
            fail_retryably: false,
            flow: FlowLimits::STANDALONE_MOCK,
        }
    }
}

/// `openai-responses`, `anthropic-messages` and `openai-chat` [R 63-68].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextProviderConfig {
    /// Default `openai`, `anthropic` or `openai-chat`.
    pub id: String,
    pub model: String,
    /// Default `["text-generation"]`.
    pub abilities: Vec<String>,
    /// Name of the environment variable holding the credential, read at execution time.
    pub api_key_env: String,
    /// Default `https://api.openai.com/v1` or `https://api.anthropic.com`; required for
    /// `openai-chat`.
    pub base_url: BaseUrl,
    /// `capabilities.input_modalities`; default `[text, json]`. `openai-responses` may also
    /// declare `image` and `file`, the other two `image`.
    pub input_modalities: Vec<Modality>,
    /// `capabilities.tools`; default false.
    pub tools: bool,
    pub flow: FlowLimits,
}

/// `fal-queue` [R 69-73].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FalConfig {
    /// Default `fal`.
    pub id: String,
    pub model: String,
    pub ability: String,
    pub api_key_env: String,
    /// Default `https://queue.fal.run`.
    pub base_url: BaseUrl,
    /// Default `[text, json]`; `image` may be declared.
    pub input_modalities: Vec<Modality>,
    /// Default `[json]`.
    pub output_modalities: Vec<Modality>,
    pub flow: FlowLimits,
}

/// A provider base URL: https, or http only on 127.0.0.1, localhost or `[::1]`; no user
/// info, query or fragment [R 62]. Stored without a trailing slash, so `format!("{base}/x")`
/// and [`BaseUrl::endpoint`] both give `…/x`. It holds no secret and may be logged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BaseUrl(Url);

/// Why a base URL was refused. Deliberately carries nothing of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("base URL {UNSAFE_BASE_URL}")]
pub struct UnsafeBaseUrl;

impl BaseUrl {
    pub fn parse(input: &str) -> Result<Self, UnsafeBaseUrl> {
        let mut url = Url::parse(input).map_err(|_| UnsafeBaseUrl)?;
        let loopback = match url.host() {
            Some(Host::Domain(domain)) => domain == "localhost",
            Some(Host::Ipv4(ip)) => ip == Ipv4Addr::LOCALHOST,
            Some(Host::Ipv6(ip)) => ip == Ipv6Addr::LOCALHOST,
            None => false,
        };
        let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
        if !scheme_ok
            || url.host().is_none()
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(UnsafeBaseUrl);
        }
        let path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&path);
        Ok(Self(url))
    }

    /// The URL without a trailing slash.
    pub fn as_str(&self) -> &str {
        // Query, fragment and trailing slashes are gone, so a final `/` is the root path.
        let s = self.0.as_str();
        s.strip_suffix('/').unwrap_or(s)
    }

    pub fn url(&self) -> &Url {
        &self.0
    }

    /// `suffix` appended below the base path, or `None` when the result would leave it: another
    /// origin, a path outside the base (`../`), or a query or fragment. Use this for paths built
    /// from configuration such as a fal model [R 69].
    pub fn endpoint(&self, suffix: &str) -> Option<Url> {
        let joined = format!("{}/{}", self.as_str(), suffix.trim_start_matches('/'));
        let url = Url::parse(&joined).ok()?;
        let base_path = self.0.path().trim_end_matches('/');
        let below = url
            .path()
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        let same_origin = url.origin() == self.0.origin();
        let clean = url.username().is_empty()
            && url.password().is_none()
            && url.query().is_none()
            && url.fragment().is_none();
        (same_origin && below && clean).then_some(url)
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the deployment file was refused. `Display` is one line that names paths (in the file,
/// or of the file) and the rule broken, never a value from the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be opened or read. Only the kind of failure is kept.
    #[error("configuration file {path:?} could not be read: {kind}")]
    Io {
        path: PathBuf,
        kind: std::io::ErrorKind,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("configuration file {path:?} is larger than 4 MiB")]
    TooLarge { path: PathBuf },
    /// Not JSON (or not UTF-8). Position only, never the text around it.
    #[error("configuration file is not valid JSON (line {line}, column {column})")]
    Json { line: usize, column: usize },
    /// A field this format does not have.
    #[error("unsupported or unsafe field {path}")]
    UnknownField { path: String },
    /// A field with a wrong type or out of range, or a required field missing.
    #[error("{path} {requirement}")]
    Invalid { path: String, requirement: String },
    /// The reference's encrypted file store is not implemented; durability comes from NATS.
    #[error("event_store type file is not supported; use backend nats for durable storage")]
    FileEventStore,
}

/// Reads and parses the deployment file at `path`.
pub fn load(path: &Path) -> Result<DeploymentConfig, ConfigError> {
    let io_error = |error: std::io::Error| ConfigError::Io {
        path: path.to_path_buf(),
        kind: error.kind(),
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    parse_bytes(&bytes)
}

/// Parses deployment JSON.
pub fn parse(json: &str) -> Result<DeploymentConfig, ConfigError> {
    parse_bytes(json.as_bytes())
}

fn parse_bytes(bytes: &[u8]) -> Result<DeploymentConfig, ConfigError> {
    // Editors on some platforms prefix a byte-order mark; it is not JSON but harmless.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let value: Value = serde_json::from_slice(bytes).map_err(|error| ConfigError::Json {
        line: error.line(),
        column: error.column(),
    })?;
    from_value(&value)
}

fn from_value(value: &Value) -> Result<DeploymentConfig, ConfigError> {
    let root = Fields::open(value, String::new(), ROOT_FIELDS)?;
    let providers = parse_providers(&root)?;
    let max_active_executions =
        root.size("max_active_executions", 1, DEFAULT_MAX_ACTIVE_EXECUTIONS)?;
    let limits = match root.get("limits") {
        None => Limits::default(),
        Some(value) => parse_limits(value)?,
    };
    let root_retention_ms = root.integer(
        "retention_ms",
        1,
        MAX_SAFE_INTEGER,
        duration_ms(DEFAULT_RETENTION),
    )?;
    let (event_store, store_retention_ms) = match root.get("event_store") {
        None => (EventStoreConfig::default(), None),
        Some(value) => parse_event_store(value)?,
    };
    Ok(DeploymentConfig {
        providers,
        max_active_executions,
        limits,
        retention: Duration::from_millis(store_retention_ms.unwrap_or(root_retention_ms)),
        event_store,
    })
}

fn parse_providers(root: &Fields<'_>) -> Result<Vec<ProviderConfig>, ConfigError> {
    let items = match root.get("providers") {
        None => return Err(required("providers".into())),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => return Err(invalid("providers".into(), "must be a non-empty array")),
    };
    let mut seen = HashSet::new();
    let mut providers = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let path = format!("providers[{index}]");
        let provider = parse_provider(item, path.clone())?;
        if !seen.insert(provider.id().to_owned()) {
            return Err(invalid(
                format!("{path}.id"),
                "duplicates an earlier provider id",
            ));
        }
        providers.push(provider);
    }
    Ok(providers)
}

fn parse_provider(value: &Value, path: String) -> Result<ProviderConfig, ConfigError> {
    let Some(map) = value.as_object() else {
        return Err(invalid(path, "must be an object"));
    };
    let type_path = child_path(&path, "type");
    let kind = match map.get("type") {
        None => return Err(required(type_path)),
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(unknown_type(type_path)),
    };
    match kind {
        "mock" => parse_mock(value, path).map(ProviderConfig::Mock),
        "openai-responses" => {
            parse_text(value, path, &OPENAI_RESPONSES).map(ProviderConfig::OpenAiResponses)
        }
        "anthropic-messages" => {
            parse_text(value, path, &ANTHROPIC_MESSAGES).map(ProviderConfig::AnthropicMessages)
        }
        "openai-chat" => parse_text(value, path, &OPENAI_CHAT).map(ProviderConfig::OpenAiChat),
        "fal-queue" => parse_fal(value, path).map(ProviderConfig::FalQueue),
        _ => Err(unknown_type(type_path)),
    }
}

fn unknown_type(path: String) -> ConfigError {
    invalid(path, format!("must be one of {PROVIDER_TYPES}"))
}

fn parse_mock(value: &Value, path: String) -> Result<MockConfig, ConfigError> {
    let fields = Fields::open(value, path, MOCK_FIELDS)?;
    let defaults = MockConfig::default();
    Ok(MockConfig {
        id: fields.name("id", Some(&defaults.id))?,
        model: fields.name("model", Some(&defaults.model))?,
        abilities: fields.names("abilities")?,
        chunks: fields.strings("chunks", &defaults.chunks)?,
        delay: Duration::from_millis(fields.integer("delay_ms", 0, MAX_MOCK_DELAY_MS, 0)?),
        fail_retryably: fields.boolean("fail_retryably", false)?,
        flow: fields.flow()?,
    })
}

/// What differs between the text adapters.
struct TextKind {
    id: &'static str,
    base_url: Option<&'static str>,
    /// Input modalities the adapter can send; a deployment declares a subset [R 68].
    supported_inputs: &'static [Modality],
}

const OPENAI_RESPONSES: TextKind = TextKind {
    id: "openai",
    base_url: Some("https://api.openai.com/v1"),
    supported_inputs: &[
        Modality::Text,
        Modality::Json,
        Modality::Image,
        Modality::File,
    ],
};
const ANTHROPIC_MESSAGES: TextKind = TextKind {
    id: "anthropic",
    base_url: Some("https://api.anthropic.com"),
    supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
};
// Chat Completions takes images by URL; files and audio only inline, which URI parts are not.
const OPENAI_CHAT: TextKind = TextKind {
    id: "openai-chat",
    base_url: None,
    supported_inputs: &[Modality::Text, Modality::Json, Modality::Image],
};
const TEXT_DEFAULT_INPUTS: &[Modality] = &[Modality::Text, Modality::Json];

fn parse_text(
    value: &Value,
    path: String,
    kind: &TextKind,
) -> Result<TextProviderConfig, ConfigError> {
    let fields = Fields::open(value, path, TEXT_FIELDS)?;
    let id = fields.name("id", Some(kind.id))?;
    let model = fields.name("model", None)?;
    let abilities = fields.names("abilities")?;
    let api_key_env = fields.env_name("api_key_env")?;
    let base_url = fields.base_url("base_url", kind.base_url)?;
    let (input_modalities, tools) = match fields.get("capabilities") {
        None => (TEXT_DEFAULT_INPUTS.to_vec(), false),
        Some(value) => {
            let capabilities =
                Fields::open(value, fields.path_of("capabilities"), CAPABILITY_FIELDS)?;
            (
                capabilities.modalities(
                    "input_modalities",
                    TEXT_DEFAULT_INPUTS,
                    kind.supported_inputs,
                )?,
                capabilities.boolean("tools", false)?,
            )
        }
    };
    Ok(TextProviderConfig {
        id,
        model,
        abilities,
        api_key_env,
        base_url,
        input_modalities,
        tools,
        flow: fields.flow()?,
    })
}

const FAL_SUPPORTED_INPUTS: &[Modality] = &[Modality::Text, Modality::Json, Modality::Image];
const ALL_MODALITIES: &[Modality] = &[
    Modality::Text,
    Modality::Image,
    Modality::Audio,
    Modality::Video,
    Modality::File,
    Modality::Json,
];

fn parse_fal(value: &Value, path: String) -> Result<FalConfig, ConfigError> {
    let fields = Fields::open(value, path, FAL_FIELDS)?;
    Ok(FalConfig {
        id: fields.name("id", Some("fal"))?,
        model: fields.name("model", None)?,
        ability: fields.name("ability", None)?,
        api_key_env: fields.env_name("api_key_env")?,
        base_url: fields.base_url("base_url", Some("https://queue.fal.run"))?,
        input_modalities: fields.modalities(
            "input_modalities",
            TEXT_DEFAULT_INPUTS,
            FAL_SUPPORTED_INPUTS,
        )?,
        output_modalities: fields.modalities(
            "output_modalities",
            &[Modality::Json],
            ALL_MODALITIES,
        )?,
        flow: fields.flow()?,
    })
}

fn parse_limits(value: &Value) -> Result<Limits, ConfigError> {
    let fields = Fields::open(value, "limits".into(), LIMITS_FIELDS)?;
    let defaults = Limits::default();
    let max_body_bytes = fields.size("max_body_bytes", 1, defaults.max_body_bytes)?;
    if max_body_bytes > MAX_BODY_BYTES_LIMIT {
        return Err(invalid(
            fields.path_of("max_body_bytes"),
            format!("must be at most {MAX_BODY_BYTES_LIMIT}"),
        ));
    }
    let max_deadline_ms = fields.integer(
        "max_deadline_ms",
        1,
        MAX_DURATION_MS,
        defaults.max_deadline_ms,
    )?;
    let default_deadline_ms = match fields.get("default_deadline_ms") {
        None => defaults.default_deadline_ms.min(max_deadline_ms),
        Some(_) => {
            let ms = fields.integer("default_deadline_ms", 1, MAX_DURATION_MS, 0)?;
            if ms > max_deadline_ms {
                return Err(invalid(
                    fields.path_of("default_deadline_ms"),
                    "must not exceed limits.max_deadline_ms",
                ));
            }
            ms
        }
    };
    Ok(Limits {
        max_body_bytes,
        max_deadline_ms,
        default_deadline_ms,
        max_sse_streams: fields.size("max_sse_streams", 1, defaults.max_sse_streams)?,
        header_timeout_ms: fields.integer(
            "header_timeout_ms",
            1,
            MAX_DURATION_MS,
            defaults.header_timeout_ms,
        )?,
        body_timeout_ms: fields.integer(
            "body_timeout_ms",
            1,
            MAX_DURATION_MS,
            defaults.body_timeout_ms,
        )?,
        idle_timeout_ms: fields.integer(
            "idle_timeout_ms",
            1,
            MAX_DURATION_MS,
            defaults.idle_timeout_ms,
        )?,
        max_connections: match fields.get("max_connections") {
            None => None,
            Some(_) => Some(fields.size("max_connections", 1, 0)?),
        },
    })
}

/// The memory store's bounds, and `retention_ms` when set.
fn parse_event_store(value: &Value) -> Result<(EventStoreConfig, Option<u64>), ConfigError> {
    let Some(map) = value.as_object() else {
        return Err(invalid("event_store".into(), "must be an object"));
    };
    // The type decides which fields exist, so it is checked first.
    match map.get("type") {
        None => return Err(required("event_store.type".into())),
        Some(Value::String(kind)) if kind == "memory" => {}
        Some(Value::String(kind)) if kind == "file" => return Err(ConfigError::FileEventStore),
        Some(_) => return Err(invalid("event_store.type".into(), "must be memory")),
    }
    let fields = Fields::open(value, "event_store".into(), EVENT_STORE_FIELDS)?;
    let defaults = EventStoreConfig::default();
    let config = EventStoreConfig {
        max_executions: fields.size("max_executions", 1, defaults.max_executions)?,
        max_bytes: fields.size("max_bytes", 1, defaults.max_bytes)?,
        max_execution_bytes: fields.size("max_execution_bytes", 1, defaults.max_execution_bytes)?,
        max_events: fields.size("max_events", 1, defaults.max_events)?,
    };
    let retention_ms = match fields.get("retention_ms") {
        None => None,
        Some(_) => Some(fields.integer("retention_ms", 1, MAX_SAFE_INTEGER, 0)?),
    };
    Ok((config, retention_ms))
}

/// One object of the file, checked for unknown fields, with typed getters that report the
/// field's path and never its value.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Fields<'a> {
    /// `path` is empty for the root.
    fn open(value: &'a Value, path: String, allowed: &[&str]) -> Result<Self, ConfigError> {
        let Some(map) = value.as_object() else {
            return Err(if path.is_empty() {
                invalid("configuration root".into(), "must be a JSON object")
            } else {
                invalid(path, "must be an object")
            });
        };
        if let Some(key) = map.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(ConfigError::UnknownField {
                path: child_path(&path, key),
            });
        }
        Ok(Self { map, path })
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    fn path_of(&self, key: &str) -> String {
        child_path(&self.path, key)
    }

    /// A 1–256 character string; `default` when absent, required when there is none.
    fn name(&self, key: &str, default: Option<&str>) -> Result<String, ConfigError> {
        match (self.get(key), default) {
            (Some(value), _) => name_value(value, self.path_of(key)),
            (None, Some(default)) => Ok(default.to_owned()),
            (None, None) => Err(required(self.path_of(key))),
        }
    }

    /// `abilities`: a non-empty array of names; default `["text-generation"]`.
    fn names(&self, key: &str) -> Result<Vec<String>, ConfigError> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Ok(vec![DEFAULT_ABILITY.to_owned()]),
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(index, item)| name_value(item, format!("{path}[{index}]")))
                .collect(),
            Some(_) => Err(invalid(path, "must be a non-empty array of strings")),
        }
    }

    /// An array of strings, possibly empty.
    fn strings(&self, key: &str, default: &[String]) -> Result<Vec<String>, ConfigError> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(index, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(invalid(format!("{path}[{index}]"), "must be a string")),
                })
                .collect(),
            Some(_) => Err(invalid(path, "must be an array of strings")),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(self.path_of(key), "must be true or false")),
        }
    }

    /// An integer in `min..=max` (`max` at most [`MAX_SAFE_INTEGER`]). Integral floats such as
    /// `5.0` count, as in the request schema.
    fn integer(&self, key: &str, min: u64, max: u64, default: u64) -> Result<u64, ConfigError> {
        let Some(value) = self.get(key) else {
            return Ok(default);
        };
        let path = self.path_of(key);
        match as_integer(value) {
            Some(n) if n < min => Err(invalid(path, integer_requirement(min))),
            Some(n) if n > max => Err(invalid(path, format!("must be at most {max}"))),
            Some(n) => Ok(n),
            None => Err(invalid(path, integer_requirement(min))),
        }
    }

    fn size(&self, key: &str, min: u64, default: usize) -> Result<usize, ConfigError> {
        let max = u64::try_from(usize::MAX).map_or(MAX_SAFE_INTEGER, |m| m.min(MAX_SAFE_INTEGER));
        let default = u64::try_from(default).unwrap_or(max);
        let n = self.integer(key, min, max, default)?;
        usize::try_from(n).map_err(|_| invalid(self.path_of(key), format!("must be at most {max}")))
    }

    fn flow(&self) -> Result<FlowLimits, ConfigError> {
        let defaults = FlowLimits::CONFIG_DEFAULT;
        let max = u64::from(u32::MAX);
        let concurrency = self.integer(
            "max_concurrency",
            1,
            max,
            u64::from(defaults.max_concurrency),
        )?;
        let depth = self.integer(
            "max_queue_depth",
            0,
            max,
            u64::from(defaults.max_queue_depth),
        )?;
        Ok(FlowLimits {
            max_concurrency: u32::try_from(concurrency).unwrap_or(u32::MAX),
            max_queue_depth: u32::try_from(depth).unwrap_or(u32::MAX),
        })
    }

    /// A required environment variable name, `^[A-Z][A-Z0-9_]{1,127}$` [R 78].
    fn env_name(&self, key: &str) -> Result<String, ConfigError> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Err(required(path)),
            Some(Value::String(name)) if is_env_name(name) => Ok(name.clone()),
            Some(_) => Err(invalid(
                path,
                "must be an environment variable name: an uppercase letter, then 1 to 127 \
                 uppercase letters, digits or underscores",
            )),
        }
    }

    fn base_url(&self, key: &str, default: Option<&str>) -> Result<BaseUrl, ConfigError> {
        let path = self.path_of(key);
        let text = match (self.get(key), default) {
            (Some(Value::String(text)), _) => text.as_str(),
            (Some(_), _) => return Err(invalid(path, "must be a string")),
            (None, Some(default)) => default,
            (None, None) => return Err(required(path)),
        };
        BaseUrl::parse(text).map_err(|UnsafeBaseUrl| invalid(path, UNSAFE_BASE_URL))
    }

    /// A non-empty array of distinct modalities drawn from `supported`.
    fn modalities(
        &self,
        key: &str,
        default: &[Modality],
        supported: &[Modality],
    ) -> Result<Vec<Modality>, ConfigError> {
        let path = self.path_of(key);
        let items = match self.get(key) {
            None => return Ok(default.to_vec()),
            Some(Value::Array(items)) if !items.is_empty() => items,
            Some(_) => return Err(invalid(path, "must be a non-empty array of modalities")),
        };
        let mut modalities = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{index}]");
            let modality = item
                .as_str()
                .and_then(|name| {
                    supported
                        .iter()
                        .copied()
                        .find(|m| modality_name(*m) == name)
                })
                .ok_or_else(|| {
                    let names: Vec<&str> = supported.iter().map(|m| modality_name(*m)).collect();
                    invalid(
                        item_path.clone(),
                        format!("must be one of {}", names.join(", ")),
                    )
                })?;
            if modalities.contains(&modality) {
                return Err(invalid(item_path, "repeats an earlier modality"));
            }
            modalities.push(modality);
        }
        Ok(modalities)
    }
}

fn name_value(value: &Value, path: String) -> Result<String, ConfigError> {
    match value {
        Value::String(s) if (1..=MAX_NAME_CHARS).contains(&s.chars().count()) => Ok(s.clone()),
        _ => Err(invalid(
            path,
            format!("must be a string of 1 to {MAX_NAME_CHARS} characters"),
        )),
    }
}

fn as_integer(value: &Value) -> Option<u64> {
    let Value::Number(n) = value else {
        return None;
    };
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    let f = n.as_f64()?;
    (f.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER as f64).contains(&f)).then_some(f as u64)
}

fn integer_requirement(min: u64) -> String {
    match min {
        0 => "must be a non-negative integer".into(),
        1 => "must be a positive integer".into(),
        min => format!("must be an integer of at least {min}"),
    }
}

fn is_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (2..=128).contains(&bytes.len())
        && bytes[0].is_ascii_uppercase()
        && bytes[1..]
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
}

fn modality_name(modality: Modality) -> &'static str {
    match modality {
        Modality::Text => "text",
        Modality::Image => "image",
        Modality::Audio => "audio",
        Modality::Video => "video",
        Modality::File => "file",
        Modality::Json => "json",
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `parent.key`, or `parent["..."]` (escaped, cut to 64 characters) for keys that are not
/// plain identifiers, so an error stays one printable line whatever the file's keys contain.
fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.len() <= MAX_KEY_CHARS_SHOWN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        if parent.is_empty() {
            key.to_owned()
        } else {
            format!("{parent}.{key}")
        }
    } else {
        let mut escaped: String = key
            .chars()
            .take(MAX_KEY_CHARS_SHOWN)
            .flat_map(char::escape_default)
            .collect();
        if key.chars().count() > MAX_KEY_CHARS_SHOWN {
            escaped.push_str("...");
        }
        format!("{parent}[\"{escaped}\"]")
    }
}

fn invalid(path: String, requirement: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path,
        requirement: requirement.into(),
    }
}

fn required(path: String) -> ConfigError {
    invalid(path, "is required")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

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

    const OPENAI: &str = r#"{"type":"openai-responses","model":"m","api_key_env":"OPENAI_API_KEY""#;

    #[test]
    fn no_file_runs_the_mock_alone_with_small_limits() {
        let config = DeploymentConfig::default();
        assert_eq!(config.providers.len(), 1);
        let ProviderConfig::Mock(mock) = &config.providers[0] else {
            panic!("expected the mock");
        };
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
        assert_eq!(config.max_active_executions, 1024);
        assert_eq!(config.retention, Duration::from_secs(24 * 3600));
        assert_eq!(
            config.limits,
            Limits {
                max_body_bytes: 1 << 20,
                max_deadline_ms: 86_400_000,
                default_deadline_ms: 600_000,
                max_sse_streams: 10_000,
                header_timeout_ms: 10_000,
                body_timeout_ms: 30_000,
                idle_timeout_ms: 60_000,
                max_connections: None,
            }
        );
        assert_eq!(
            config.event_store,
            EventStoreConfig {
                max_executions: 10_000,
                max_bytes: 256 << 20,
                max_execution_bytes: 4 << 20,
                max_events: 4096
            }
        );
    }

    #[test]
    fn mock_only_file_gets_config_defaults() {
        let config = parse(r#"{"providers":[{"type":"mock"}]}"#).unwrap();
        let ProviderConfig::Mock(mock) = &config.providers[0] else {
            panic!("expected the mock");
        };
        assert_eq!(
            mock,
            &MockConfig {
                flow: FlowLimits::CONFIG_DEFAULT,
                ..MockConfig::default()
            }
        );
        assert_eq!(config.providers[0].flow().max_concurrency, 16);
        assert_eq!(config.providers[0].flow().max_queue_depth, 64);
        assert_eq!(config.providers[0].type_name(), "mock");
        let defaults = DeploymentConfig::default();
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
            provider,
            ProviderConfig::Mock(MockConfig {
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
            })
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
        let ProviderConfig::OpenAiResponses(openai) = &config.providers[0] else {
            panic!("expected openai-responses");
        };
        assert_eq!(openai.model, "model-public");
        assert_eq!(openai.api_key_env, "PROVIDER_A_API_KEY");
        assert_eq!(openai.base_url.as_str(), "https://api.openai.com/v1");
        assert_eq!(openai.input_modalities, [Modality::Text, Modality::Json]);
        assert!(!openai.tools);
        assert_eq!(openai.flow, FlowLimits::CONFIG_DEFAULT);
        let ProviderConfig::AnthropicMessages(anthropic) = &config.providers[1] else {
            panic!("expected anthropic-messages");
        };
        assert_eq!(anthropic.base_url.as_str(), "https://api.anthropic.com");
        assert_eq!(anthropic.api_key_env, "PROVIDER_B_API_KEY");
        let ProviderConfig::FalQueue(fal) = &config.providers[2] else {
            panic!("expected fal-queue");
        };
        assert_eq!(fal.model, "models/image");
        assert_eq!(fal.ability, "image-generation");
        assert_eq!(fal.base_url.as_str(), "https://queue.fal.run");
        assert_eq!(fal.input_modalities, [Modality::Text, Modality::Json]);
        assert_eq!(fal.output_modalities, [Modality::Image]);
    }

    #[test]
    fn text_provider_defaults() {
        let ProviderConfig::OpenAiResponses(openai) = only_provider(&format!("{OPENAI}}}")) else {
            panic!("expected openai-responses");
        };
        assert_eq!(openai.id, "openai");
        assert_eq!(openai.abilities, ["text-generation"]);
        assert_eq!(openai.input_modalities, [Modality::Text, Modality::Json]);
        assert!(!openai.tools);
        let ProviderConfig::AnthropicMessages(anthropic) = only_provider(
            r#"{"type":"anthropic-messages","model":"claude","api_key_env":"ANTHROPIC_API_KEY"}"#,
        ) else {
            panic!("expected anthropic-messages");
        };
        assert_eq!(anthropic.id, "anthropic");
        assert_eq!(anthropic.base_url.to_string(), "https://api.anthropic.com");
        assert_eq!(
            anthropic.base_url.endpoint("v1/messages").unwrap().as_str(),
            "https://api.anthropic.com/v1/messages"
        );
        let ProviderConfig::FalQueue(fal) = only_provider(
            r#"{"type":"fal-queue","model":"x/y","ability":"i","api_key_env":"FAL_KEY"}"#,
        ) else {
            panic!("expected fal-queue");
        };
        assert_eq!(fal.id, "fal");
        assert_eq!(fal.output_modalities, [Modality::Json]);
        assert_eq!(fal.flow, FlowLimits::CONFIG_DEFAULT);
    }

    #[test]
    fn openai_chat_on_loopback() {
        let ProviderConfig::OpenAiChat(chat) = only_provider(
            r#"{"type":"openai-chat","model":"llama","api_key_env":"LOCAL_KEY",
                "base_url":"http://127.0.0.1:8080/v1",
                "capabilities":{"input_modalities":["text","image"],"tools":true},
                "max_concurrency":1,"max_queue_depth":0}"#,
        ) else {
            panic!("expected openai-chat");
        };
        assert_eq!(chat.id, "openai-chat");
        assert_eq!(chat.base_url.as_str(), "http://127.0.0.1:8080/v1");
        assert_eq!(
            chat.base_url.endpoint("chat/completions").unwrap().as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
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
        assert_eq!(config.retention, DEFAULT_RETENTION);
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
                parse(json),
                Err(ConfigError::UnknownField { path: path.into() }),
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
        let ProviderConfig::Mock(mock) = only_provider(r#"{"type":"mock","delay_ms":5.0}"#) else {
            panic!("expected the mock");
        };
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
        let ProviderConfig::Mock(mock) =
            only_provider(&format!(r#"{{"type":"mock","id":"{ok}","model":"{ok}"}}"#))
        else {
            panic!("expected the mock");
        };
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
                with_provider(
                    r#"{"type":"fal-queue","model":"m","ability":"","api_key_env":"AK"}"#,
                ),
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
            let ProviderConfig::OpenAiResponses(openai) = only_provider(&format!(
                r#"{{"type":"openai-responses","model":"m","api_key_env":"{good}"}}"#
            )) else {
                panic!("expected openai-responses");
            };
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
            Ok(config) => match &config.providers[0] {
                ProviderConfig::OpenAiResponses(c) => Ok(c.base_url.as_str().to_owned()),
                other => panic!("unexpected provider {other:?}"),
            },
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
    fn endpoint_stays_below_the_base() {
        let base = BaseUrl::parse("https://queue.example.com/api").unwrap();
        assert_eq!(
            base.endpoint("/fal-ai/flux/dev").unwrap().as_str(),
            "https://queue.example.com/api/fal-ai/flux/dev"
        );
        assert_eq!(
            base.endpoint("models/image").unwrap().as_str(),
            "https://queue.example.com/api/models/image"
        );
        for escape in [
            "../x",
            "a/../../x",
            "%2e%2e/x",
            "a?x=1",
            "a#f",
            "//evil.example/x",
        ] {
            let joined = base.endpoint(escape);
            assert!(
                joined
                    .as_ref()
                    .is_none_or(|url| url.host_str() == Some("queue.example.com")
                        && url.path().starts_with("/api/")
                        && url.query().is_none()
                        && url.fragment().is_none()),
                "{escape}: {joined:?}"
            );
        }
        assert!(base.endpoint("../x").is_none());
        assert!(base.endpoint("a?x=1").is_none());
        let root = BaseUrl::parse("https://queue.example.com").unwrap();
        assert_eq!(
            root.endpoint("a/b").unwrap().as_str(),
            "https://queue.example.com/a/b"
        );
        assert_eq!(
            UnsafeBaseUrl.to_string(),
            "base URL must be https or loopback http without credentials, query or fragment"
        );
    }

    #[test]
    fn modalities_are_checked() {
        let ProviderConfig::FalQueue(fal) = only_provider(
            r#"{"type":"fal-queue","model":"m","ability":"a","api_key_env":"AK",
                "input_modalities":["image","text"],"output_modalities":["video","audio","file"]}"#,
        ) else {
            panic!("expected fal-queue");
        };
        assert_eq!(fal.input_modalities, [Modality::Image, Modality::Text]);
        assert_eq!(
            fal.output_modalities,
            [Modality::Video, Modality::Audio, Modality::File]
        );
        let ProviderConfig::OpenAiResponses(openai) = only_provider(&format!(
            r#"{OPENAI},"capabilities":{{"input_modalities":["file","image","json","text"]}}}}"#
        )) else {
            panic!("expected openai-responses");
        };
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
        let store =
            |body: &str| format!(r#"{{"providers":[{{"type":"mock"}}],"event_store":{body}}}"#);
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
        assert_eq!(parse(reference), Err(ConfigError::FileEventStore));
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
        let error = parse(
            "{\n  \"providers\": [\n    {\"type\": \"mock\", \"api_key\": sk-CANARY}\n  ]\n}",
        )
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
            parse_bytes(b"{\"providers\":[{\"type\":\"mo\xffck\"}]}"),
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
        assert_eq!(load(&big), Err(ConfigError::TooLarge { path: big.clone() }));

        std::fs::remove_dir_all(&dir).unwrap();
    }
}
