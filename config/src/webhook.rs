//! The deployment file's webhook endpoints (contract.md section 11): per tenant
//! (`auth.tenants.<t>.webhooks`), or top-level `webhooks` for tenant `default` when the file
//! has no `auth` section, and the root `webhook_retry_schedule_ms`.
//!
//! ```json
//! "webhooks": [{"id": "acme-main", "url": "https://hooks.acme.example/mrt",
//!               "events": ["execution.completed", "execution.failed"],
//!               "secret_env": ["ACME_WEBHOOK_SECRET"]}]
//! ```
//!
//! Decisions a reader must know:
//! - **Secrets never live in the file**: an endpoint names the environment variables holding
//!   them (several during a rotation; each is signed with). [`WebhookConfig::secrets`] reads
//!   them, and only the processes that deliver call it, so a gateway that only accepts
//!   executions in `nats` mode starts without them. Errors name the field (`…secret_env[1]`),
//!   never the variable's value; [`SigningSecret`]'s `Debug` shows nothing of it.
//! - A secret is `whsec_` + standard base64 of 24 to 64 bytes, as Standard Webhooks specifies;
//!   the decoded bytes are the HMAC key. `mrt webhook-secret` prints one.
//! - The URL follows the providers' rule ([`ExactUrl`]): https, or http on loopback only, no
//!   user info, query or fragment; it is kept as written (a trailing slash included).
//! - `webhook_retry_schedule_ms` lists the pauses before each *retry*: the first attempt is
//!   made as soon as the event is stored, a failed attempt `k` (1-based) is retried after
//!   `schedule[k-1]`, and a delivery whose attempt `len + 1` fails is abandoned.

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine as _;
use protocol::tenant::is_valid_name;
use serde_json::Value;

use crate::base_url::{ExactUrl, UNSAFE_BASE_URL};
use crate::error::ConfigError;
use crate::field::{Fields, child_path};

const ENDPOINT_FIELDS: &[&str] = &["id", "url", "events", "secret_env"];

/// Most endpoints per tenant, and most secrets per endpoint (a rotation needs two).
pub const MAX_ENDPOINTS_PER_TENANT: usize = 16;
pub const MAX_SECRETS_PER_ENDPOINT: usize = 4;
/// Most retries in `webhook_retry_schedule_ms`, and the longest pause (7 days).
pub const MAX_RETRIES: usize = 32;
pub const MAX_RETRY_PAUSE_MS: u64 = 7 * 24 * 3600 * 1000;

/// The prefix of a signing secret (Standard Webhooks).
pub const SECRET_PREFIX: &str = "whsec_";
/// Bounds of a secret's decoded length, in bytes.
pub const MIN_SECRET_BYTES: usize = 24;
pub const MAX_SECRET_BYTES: usize = 64;

/// The default retry schedule (contract.md section 11): 0 s, 5 s, 5 min, 30 min, 2 h, 5 h,
/// 10 h, 10 h.
pub const DEFAULT_RETRY_SCHEDULE_MS: [u64; 8] = [
    0, 5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000,
];

/// The event types an endpoint may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WebhookEvent {
    Accepted,
    RouteSelected,
    Completed,
    Failed,
}

impl WebhookEvent {
    pub const ALL: [WebhookEvent; 4] = [
        WebhookEvent::Accepted,
        WebhookEvent::RouteSelected,
        WebhookEvent::Completed,
        WebhookEvent::Failed,
    ];

    /// The event's type as in the event log (`execution.completed`).
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::Accepted => "execution.accepted",
            WebhookEvent::RouteSelected => "route.selected",
            WebhookEvent::Completed => "execution.completed",
            WebhookEvent::Failed => "execution.failed",
        }
    }

    /// The webhook event of an event type, if endpoints may ask for it.
    pub fn from_type(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

/// One endpoint of one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// The tenant whose executions it hears of.
    pub tenant: String,
    /// Unique within the tenant; a tenant-name-like string (may be logged and is a label).
    pub id: String,
    pub url: ExactUrl,
    /// Never empty, no repeats.
    pub events: Vec<WebhookEvent>,
    /// Names of the environment variables holding the secrets; never empty.
    pub secret_env: Vec<String>,
    /// Where the endpoint is in the file, for errors found after parsing.
    pub path: String,
}

impl WebhookEndpoint {
    pub fn wants(&self, event: WebhookEvent) -> bool {
        self.events.contains(&event)
    }
}

/// Every endpoint of the deployment and the retry schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub endpoints: Vec<WebhookEndpoint>,
    /// Pauses before each retry (see the module docs).
    pub retry_schedule: Vec<Duration>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            retry_schedule: DEFAULT_RETRY_SCHEDULE_MS
                .iter()
                .map(|ms| Duration::from_millis(*ms))
                .collect(),
        }
    }
}

/// The decoded bytes of one signing secret. `Debug` shows nothing of them.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    /// Parses `whsec_<base64>`; `None` when it is not a valid secret. Never echoes the input.
    pub fn parse(text: &str) -> Option<Self> {
        let encoded = text.trim().strip_prefix(SECRET_PREFIX)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()?;
        (MIN_SECRET_BYTES..=MAX_SECRET_BYTES)
            .contains(&bytes.len())
            .then_some(Self(bytes))
    }

    /// The secret as written in a variable: `whsec_` + base64 of `bytes`.
    pub fn encode(bytes: &[u8]) -> String {
        format!(
            "{SECRET_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    }

    /// The HMAC key.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

impl WebhookConfig {
    /// Whether any endpoint is configured.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The secrets of every endpoint, in endpoint order, read from the environment now.
    /// An unset variable or a value that is not a secret fails, naming the field.
    pub fn secrets(&self) -> Result<Vec<Vec<SigningSecret>>, ConfigError> {
        self.secrets_from(|name| std::env::var(name).ok())
    }

    /// [`WebhookConfig::secrets`] with another source of variables (tests).
    pub fn secrets_from(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<Vec<SigningSecret>>, ConfigError> {
        self.endpoints
            .iter()
            .map(|endpoint| {
                endpoint
                    .secret_env
                    .iter()
                    .enumerate()
                    .map(|(index, name)| {
                        let path = format!("{}.secret_env[{index}]", endpoint.path);
                        let value = lookup(name).ok_or_else(|| {
                            ConfigError::invalid(
                                path.clone(),
                                "names an environment variable that is not set",
                            )
                        })?;
                        SigningSecret::parse(&value).ok_or_else(|| {
                            ConfigError::invalid(
                                path,
                                "names an environment variable that does not hold a secret \
                                 (whsec_ and the base64 of 24 to 64 bytes; mrt webhook-secret \
                                 prints one)",
                            )
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Parses the root's `webhooks` and `webhook_retry_schedule_ms` and every tenant's
    /// `webhooks` under `auth` (whose other fields `auth` parses).
    pub(crate) fn parse(root: &Fields<'_>) -> Result<Self, ConfigError> {
        let mut endpoints = Vec::new();
        let auth = root.get("auth");
        if let Some(list) = root.get("webhooks") {
            if auth.is_some() {
                return Err(ConfigError::invalid(
                    root.path_of("webhooks"),
                    "is only for deployments without auth; list each tenant's endpoints \
                     under auth.tenants.<tenant>.webhooks",
                ));
            }
            parse_list(list, root.path_of("webhooks"), "default", &mut endpoints)?;
        }
        if let Some(tenants) = auth
            .and_then(|a| a.get("tenants"))
            .and_then(Value::as_object)
        {
            for (tenant, section) in tenants {
                if let Some(list) = section.get("webhooks") {
                    let path = child_path(&child_path("auth.tenants", tenant), "webhooks");
                    parse_list(list, path, tenant, &mut endpoints)?;
                }
            }
        }
        let retry_schedule = match root.get("webhook_retry_schedule_ms") {
            None => WebhookConfig::default().retry_schedule,
            Some(value) => parse_schedule(value, root.path_of("webhook_retry_schedule_ms"))?,
        };
        Ok(Self {
            endpoints,
            retry_schedule,
        })
    }
}

fn parse_schedule(value: &Value, path: String) -> Result<Vec<Duration>, ConfigError> {
    let requirement = || {
        ConfigError::invalid(
            path.clone(),
            format!(
                "must be an array of at most {MAX_RETRIES} pauses in milliseconds, each from 0 \
                 to {MAX_RETRY_PAUSE_MS}"
            ),
        )
    };
    let Value::Array(items) = value else {
        return Err(requirement());
    };
    if items.len() > MAX_RETRIES {
        return Err(requirement());
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| match item.as_u64() {
            Some(ms) if ms <= MAX_RETRY_PAUSE_MS => Ok(Duration::from_millis(ms)),
            _ => Err(ConfigError::invalid(
                format!("{path}[{index}]"),
                format!("must be an integer number of milliseconds from 0 to {MAX_RETRY_PAUSE_MS}"),
            )),
        })
        .collect()
}

fn parse_list(
    value: &Value,
    path: String,
    tenant: &str,
    out: &mut Vec<WebhookEndpoint>,
) -> Result<(), ConfigError> {
    let items = match value {
        Value::Array(items) if items.len() <= MAX_ENDPOINTS_PER_TENANT => items,
        _ => {
            return Err(ConfigError::invalid(
                path,
                format!("must be an array of at most {MAX_ENDPOINTS_PER_TENANT} endpoints"),
            ));
        }
    };
    let mut ids = HashSet::new();
    for (index, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{index}]");
        let fields = Fields::open(item, item_path.clone(), ENDPOINT_FIELDS)?;
        let id = match fields.get("id") {
            Some(Value::String(id)) if is_valid_name(id) => id.clone(),
            None => return Err(ConfigError::required(fields.path_of("id"))),
            Some(_) => {
                return Err(ConfigError::invalid(
                    fields.path_of("id"),
                    "must be 1 to 64 ASCII letters, digits, '-', '_' or '.'",
                ));
            }
        };
        if !ids.insert(id.clone()) {
            return Err(ConfigError::invalid(
                fields.path_of("id"),
                "repeats the id of an earlier endpoint of this tenant",
            ));
        }
        let url = match fields.get("url") {
            None => return Err(ConfigError::required(fields.path_of("url"))),
            Some(Value::String(text)) => ExactUrl::parse(text)
                .map_err(|_| ConfigError::invalid(fields.path_of("url"), UNSAFE_BASE_URL))?,
            Some(_) => {
                return Err(ConfigError::invalid(
                    fields.path_of("url"),
                    "must be a string",
                ));
            }
        };
        let events = parse_events(&fields)?;
        let secret_env = parse_secret_env(&fields)?;
        out.push(WebhookEndpoint {
            tenant: tenant.to_owned(),
            id,
            url,
            events,
            secret_env,
            path: item_path,
        });
    }
    Ok(())
}

fn parse_events(fields: &Fields<'_>) -> Result<Vec<WebhookEvent>, ConfigError> {
    let path = fields.path_of("events");
    let names: Vec<&str> = WebhookEvent::ALL.iter().map(|e| e.as_str()).collect();
    let items = match fields.get("events") {
        None => return Ok(vec![WebhookEvent::Completed, WebhookEvent::Failed]),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => {
            return Err(ConfigError::invalid(
                path,
                format!("must be a non-empty array of {}", names.join(", ")),
            ));
        }
    };
    let mut events = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{index}]");
        let Some(event) = item.as_str().and_then(WebhookEvent::from_type) else {
            return Err(ConfigError::invalid(
                item_path,
                format!("must be one of {}", names.join(", ")),
            ));
        };
        if events.contains(&event) {
            return Err(ConfigError::invalid(item_path, "repeats an earlier event"));
        }
        events.push(event);
    }
    Ok(events)
}

fn parse_secret_env(fields: &Fields<'_>) -> Result<Vec<String>, ConfigError> {
    let path = fields.path_of("secret_env");
    let items = match fields.get("secret_env") {
        None => return Err(ConfigError::required(path)),
        Some(Value::Array(items)) if (1..=MAX_SECRETS_PER_ENDPOINT).contains(&items.len()) => items,
        Some(_) => {
            return Err(ConfigError::invalid(
                path,
                format!(
                    "must be an array of 1 to {MAX_SECRETS_PER_ENDPOINT} environment variable names"
                ),
            ));
        }
    };
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{index}]");
        match item {
            Value::String(name) if crate::field::is_env_name(name) => {
                if names.contains(name) {
                    return Err(ConfigError::invalid(
                        item_path,
                        "repeats an earlier variable",
                    ));
                }
                names.push(name.clone());
            }
            _ => {
                return Err(ConfigError::invalid(
                    item_path,
                    "must be an environment variable name: an uppercase letter, then 1 to 127 \
                     uppercase letters, digits or underscores",
                ));
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<WebhookConfig, ConfigError> {
        let value: Value = serde_json::from_str(json).unwrap();
        let root = Fields::open(
            &value,
            String::new(),
            &["webhooks", "webhook_retry_schedule_ms", "auth"],
        )
        .unwrap();
        WebhookConfig::parse(&root)
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn top_level_endpoints_belong_to_the_default_tenant() {
        let config = parse(
            r#"{"webhooks":[{"id":"main","url":"http://127.0.0.1:9/hook",
                "secret_env":["HOOK_SECRET"]}],"webhook_retry_schedule_ms":[0,100]}"#,
        )
        .unwrap();
        let endpoint = &config.endpoints[0];
        assert_eq!(endpoint.tenant, "default");
        assert_eq!(endpoint.id, "main");
        assert_eq!(
            endpoint.events,
            [WebhookEvent::Completed, WebhookEvent::Failed]
        );
        assert_eq!(
            config.retry_schedule,
            [Duration::ZERO, Duration::from_millis(100)]
        );
        assert_eq!(parse("{}").unwrap(), WebhookConfig::default());
        assert_eq!(WebhookConfig::default().retry_schedule.len(), 8);
    }

    #[test]
    fn tenant_endpoints_are_read_under_auth_and_top_level_is_refused_with_auth() {
        let config = parse(
            r#"{"auth":{"tenants":{"acme":{"webhooks":[{"id":"a","url":"https://h.example/x",
                "events":["execution.accepted","route.selected"],"secret_env":["A_S","A_T"]}]},
                "beta":{}}}}"#,
        )
        .unwrap();
        assert_eq!(config.endpoints.len(), 1);
        assert_eq!(config.endpoints[0].tenant, "acme");
        assert_eq!(config.endpoints[0].path, "auth.tenants.acme.webhooks[0]");
        assert!(config.endpoints[0].wants(WebhookEvent::RouteSelected));
        assert!(!config.endpoints[0].wants(WebhookEvent::Completed));
        let err = parse(r#"{"auth":{"tenants":{}},"webhooks":[]}"#).unwrap_err();
        assert!(err.to_string().starts_with("webhooks is only for"), "{err}");
    }

    #[test]
    fn errors_name_the_field_and_never_the_value() {
        let cases = [
            (
                r#"{"webhooks":[{"id":"m","url":"http://hooks.example/x","secret_env":["S_A"]}]}"#,
                "webhooks[0].url must be https",
            ),
            (
                r#"{"webhooks":[{"id":"m","url":"https://h.example","secret_env":["S_A"],"secret":"whsec_x"}]}"#,
                "unsupported or unsafe field webhooks[0].secret",
            ),
            (
                r#"{"webhooks":[{"id":"m","url":"https://h.example","events":["output.delta"],"secret_env":["S_A"]}]}"#,
                "webhooks[0].events[0] must be one of",
            ),
            (
                r#"{"webhooks":[{"id":"m","url":"https://h.example","secret_env":["whsec_abc"]}]}"#,
                "webhooks[0].secret_env[0] must be an environment variable name",
            ),
            (
                r#"{"webhooks":[{"id":"m","url":"https://h.example","secret_env":["S_A"]},{"id":"m","url":"https://h.example","secret_env":["S_A"]}]}"#,
                "webhooks[1].id repeats",
            ),
            (
                r#"{"webhook_retry_schedule_ms":[0,-5]}"#,
                "webhook_retry_schedule_ms[1] must be",
            ),
        ];
        for (json, expected) in cases {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{json}: {err}");
            assert!(!err.contains("whsec_"), "{err}");
            assert!(!err.contains("hooks.example"), "{err}");
        }
    }

    #[test]
    fn secrets_come_from_the_named_variables_and_errors_never_show_them() {
        let config = parse(
            r#"{"webhooks":[{"id":"m","url":"https://h.example","secret_env":["S_A","S_B"]}]}"#,
        )
        .unwrap();
        let secrets = config
            .secrets_from(|name| (name == "S_A" || name == "S_B").then(|| SECRET.to_owned()))
            .unwrap();
        assert_eq!(secrets[0].len(), 2);
        assert_eq!(secrets[0][0].expose().len(), 24);
        assert_eq!(format!("{:?}", secrets[0][0]), "SigningSecret(..)");
        let missing = config
            .secrets_from(|name| (name == "S_A").then(|| SECRET.to_owned()))
            .unwrap_err()
            .to_string();
        assert_eq!(
            missing,
            "webhooks[0].secret_env[1] names an environment variable that is not set"
        );
        let short = "whsec_c2hvcnQ=";
        let bad = config
            .secrets_from(|_| Some(short.to_owned()))
            .unwrap_err()
            .to_string();
        assert!(bad.starts_with("webhooks[0].secret_env[0] names"), "{bad}");
        assert!(!bad.contains(short), "{bad}");
    }

    #[test]
    fn secrets_round_trip_and_reject_what_is_not_one() {
        let bytes = [7u8; 32];
        let text = SigningSecret::encode(&bytes);
        assert!(text.starts_with("whsec_"));
        assert_eq!(SigningSecret::parse(&text).unwrap().expose(), bytes);
        assert!(SigningSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_none());
        assert!(SigningSecret::parse("whsec_not base64!").is_none());
        assert!(SigningSecret::parse(&SigningSecret::encode(&[1u8; 65])).is_none());
    }
}
