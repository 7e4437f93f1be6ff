//! Bounds of the in-memory event store (the file's `event_store` object with
//! `type: "memory"`).
//!
//! The one decision a reader must know: the reference's encrypted `file` store is refused with
//! its own error ([`ConfigError::FileEventStore`]); durability comes from the NATS backend.

use serde_json::Value;

use crate::error::ConfigError;
use crate::field::{Fields, MAX_SAFE_INTEGER};
use crate::limits::MIB;

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

/// Bounds of the in-memory event store. Retention is
/// [`crate::DeploymentConfig::retention`].
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

impl EventStoreConfig {
    /// The memory store's bounds, and `retention_ms` when set.
    pub(crate) fn parse(value: &Value) -> Result<(Self, Option<u64>), ConfigError> {
        let Some(map) = value.as_object() else {
            return Err(ConfigError::invalid(
                "event_store".into(),
                "must be an object",
            ));
        };
        // The type decides which fields exist, so it is checked first.
        match map.get("type") {
            None => return Err(ConfigError::required("event_store.type".into())),
            Some(Value::String(kind)) if kind == "memory" => {}
            Some(Value::String(kind)) if kind == "file" => {
                return Err(ConfigError::FileEventStore);
            }
            Some(_) => {
                return Err(ConfigError::invalid(
                    "event_store.type".into(),
                    "must be memory",
                ));
            }
        }
        let fields = Fields::open(value, "event_store".into(), EVENT_STORE_FIELDS)?;
        let defaults = EventStoreConfig::default();
        let config = EventStoreConfig {
            max_executions: fields.size("max_executions", 1, defaults.max_executions)?,
            max_bytes: fields.size("max_bytes", 1, defaults.max_bytes)?,
            max_execution_bytes: fields.size(
                "max_execution_bytes",
                1,
                defaults.max_execution_bytes,
            )?,
            max_events: fields.size("max_events", 1, defaults.max_events)?,
        };
        let retention_ms = match fields.get("retention_ms") {
            None => None,
            Some(_) => Some(fields.integer("retention_ms", 1, MAX_SAFE_INTEGER, 0)?),
        };
        Ok((config, retention_ms))
    }
}
