//! The deployment file (`MODEL_RUNTIME_CONFIG`, JSON): which providers run, their flow limits,
//! request limits, retention and event-store bounds, typed once at startup.
//!
//! Parsing is strict. Every object in the file has a closed set of fields (the reference's
//! format [R 76-79] plus our additions, contract section 6); anything else fails startup, so a
//! misspelt limit or a credential pasted where it does not belong (`"api_key": "..."`) is
//! caught instead of being silently ignored. Errors follow [`crate::field`]: paths, never
//! values.
//!
//! Credentials are never read here: a provider names its environment variable
//! (`api_key_env`) and the adapter reads it at execution time.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::auth::AuthConfig;
use crate::error::ConfigError;
use crate::event_store::EventStoreConfig;
use crate::field::{Fields, MAX_SAFE_INTEGER, duration_ms};
use crate::limits::{DEFAULT_MAX_ACTIVE_EXECUTIONS, DEFAULT_RETENTION, Limits};
use crate::provider::{ProviderCatalog, parse_providers};
use crate::webhook::WebhookConfig;

/// Largest configuration file read (4 MiB); a deployment file is a few kilobytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

const ROOT_FIELDS: &[&str] = &[
    "providers",
    "max_active_executions",
    "event_store",
    "limits",
    "retention_ms",
    "auth",
    "webhooks",
    "webhook_retry_schedule_ms",
];

/// Everything the deployment file configures. `P` is a parsed provider section, as the
/// [`ProviderCatalog`] that parsed the file makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentConfig<P> {
    /// In registration order, which is routing order [R 25]. Never empty.
    pub providers: Vec<P>,
    /// Executions admitted at once across all providers [R 38]; default
    /// [`DEFAULT_MAX_ACTIVE_EXECUTIONS`].
    pub max_active_executions: usize,
    pub limits: Limits,
    /// How long a finished execution stays readable: root `retention_ms`, overridden by
    /// `event_store.retention_ms`; default 24 h.
    pub retention: Duration,
    pub event_store: EventStoreConfig,
    /// API keys and tenants; `None`: every request is anonymous (tenant `default`).
    pub auth: Option<AuthConfig>,
    /// Webhook endpoints of every tenant and the retry schedule (none by default).
    pub webhooks: WebhookConfig,
}

impl<P> DeploymentConfig<P> {
    /// `providers` with every other setting at its default.
    pub fn with_providers(providers: Vec<P>) -> Self {
        Self {
            providers,
            max_active_executions: DEFAULT_MAX_ACTIVE_EXECUTIONS,
            limits: Limits::default(),
            retention: DEFAULT_RETENTION,
            event_store: EventStoreConfig::default(),
            auth: None,
            webhooks: WebhookConfig::default(),
        }
    }

    /// Whether an execution may outlive its records: `retention` shorter than the longest
    /// deadline a request may ask for (`limits.max_deadline_ms`). Its idempotency key could
    /// then expire while it runs (a retry would run the request a second time), and the start
    /// of its log age out. Allowed (a deployment of short executions may want it), but worth
    /// a warning at startup.
    pub fn retention_below_max_deadline(&self) -> bool {
        self.retention.as_millis() < u128::from(self.limits.max_deadline_ms)
    }
}

/// Reads and parses the deployment file at `path`, provider sections through `catalog`.
pub fn load<C: ProviderCatalog>(
    path: &Path,
    catalog: &C,
) -> Result<DeploymentConfig<C::Provider>, ConfigError> {
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
    parse_bytes(&bytes, catalog)
}

/// Parses deployment JSON, provider sections through `catalog`.
pub fn parse<C: ProviderCatalog>(
    json: &str,
    catalog: &C,
) -> Result<DeploymentConfig<C::Provider>, ConfigError> {
    parse_bytes(json.as_bytes(), catalog)
}

/// Parses deployment JSON given as bytes (which must be UTF-8), provider sections through
/// `catalog`.
pub fn parse_bytes<C: ProviderCatalog>(
    bytes: &[u8],
    catalog: &C,
) -> Result<DeploymentConfig<C::Provider>, ConfigError> {
    // Editors on some platforms prefix a byte-order mark; it is not JSON but harmless.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let value: Value = serde_json::from_slice(bytes).map_err(|error| ConfigError::Json {
        line: error.line(),
        column: error.column(),
    })?;
    from_value(&value, catalog)
}

fn from_value<C: ProviderCatalog>(
    value: &Value,
    catalog: &C,
) -> Result<DeploymentConfig<C::Provider>, ConfigError> {
    let root = Fields::open(value, String::new(), ROOT_FIELDS)?;
    let providers = parse_providers(&root, catalog)?;
    let max_active_executions =
        root.size("max_active_executions", 1, DEFAULT_MAX_ACTIVE_EXECUTIONS)?;
    let limits = match root.get("limits") {
        None => Limits::default(),
        Some(value) => Limits::parse(value)?,
    };
    let root_retention_ms = root.integer(
        "retention_ms",
        1,
        MAX_SAFE_INTEGER,
        duration_ms(DEFAULT_RETENTION),
    )?;
    let (event_store, store_retention_ms) = match root.get("event_store") {
        None => (EventStoreConfig::default(), None),
        Some(value) => EventStoreConfig::parse(value)?,
    };
    let auth = root.get("auth").map(AuthConfig::parse).transpose()?;
    let webhooks = WebhookConfig::parse(&root)?;
    Ok(DeploymentConfig {
        providers,
        max_active_executions,
        limits,
        retention: Duration::from_millis(store_retention_ms.unwrap_or(root_retention_ms)),
        event_store,
        auth,
        webhooks,
    })
}
