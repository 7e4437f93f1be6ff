//! Request and connection limits of the gateway (the file's root `limits` object), and the
//! defaults of the root-level execution limits (`max_active_executions`, `retention_ms`).

use std::time::Duration;

use protocol::request::MAX_DURATION_MS;
use serde_json::Value;

use crate::error::ConfigError;
use crate::field::Fields;

/// Default for `max_active_executions`. The reference uses 16, which a single busy client
/// exhausts; executions waiting on slow providers are cheap here, and per-provider flow
/// control still bounds what reaches each provider.
pub const DEFAULT_MAX_ACTIVE_EXECUTIONS: usize = 1024;
/// Default retention of a finished execution (24 hours) [R 82].
pub const DEFAULT_RETENTION: Duration = Duration::from_millis(86_400_000);
/// Largest `limits.max_body_bytes` (64 MiB).
pub const MAX_BODY_BYTES_LIMIT: usize = 64 * MIB;

pub(crate) const MIB: usize = 1024 * 1024;

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

impl Limits {
    /// Parses the root `limits` object.
    pub(crate) fn parse(value: &Value) -> Result<Self, ConfigError> {
        let fields = Fields::open(value, "limits".into(), LIMITS_FIELDS)?;
        let defaults = Limits::default();
        let max_body_bytes = fields.size("max_body_bytes", 1, defaults.max_body_bytes)?;
        if max_body_bytes > MAX_BODY_BYTES_LIMIT {
            return Err(ConfigError::invalid(
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
                    return Err(ConfigError::invalid(
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
}
