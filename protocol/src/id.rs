//! Identifier newtypes. Execution IDs are random UUIDs minted only by the runtime; sequences are
//! execution-scoped, start at 1 and have no gaps.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A random UUID (v4) naming one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct ExecutionId(#[cfg_attr(feature = "schema", schemars(with = "String"))] Uuid);

impl ExecutionId {
    /// Mints a fresh random execution id (122 random bits).
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps an existing UUID.
    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID inside.
    pub fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

parse_error! {
    /// Error returned when a string is not a UUID; it never echoes the input.
    InvalidExecutionId = "execution id is not a UUID";
    ExecutionId => ExecutionId::parse
}

impl ExecutionId {
    /// Reads the canonical text form (also [`FromStr`](std::str::FromStr)).
    fn parse(s: &str) -> Result<Self, InvalidExecutionId> {
        // Only the canonical lowercase hyphenated form is accepted: uppercase, braces, URNs and
        // simple forms would give one execution several URLs.
        if s.len() != 36 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(InvalidExecutionId);
        }
        Uuid::parse_str(s).map(Self).map_err(|_| InvalidExecutionId)
    }
}

/// Position of an event in its execution's log (1-based, contiguous).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Sequence(pub u64);

impl Sequence {
    /// The cursor before the first event.
    pub const ZERO: Sequence = Sequence(0);

    /// The sequence that must follow this one.
    pub fn next(self) -> Sequence {
        Sequence(self.0.saturating_add(1))
    }

    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_id_round_trips_and_rejects_other_forms() {
        let id = ExecutionId::new_random();
        let text = id.to_string();
        assert_eq!(text.parse::<ExecutionId>(), Ok(id));
        assert!("not-a-uuid".parse::<ExecutionId>().is_err());
        assert!(text.replace('-', "").parse::<ExecutionId>().is_err());
        assert!(format!("{{{text}}}").parse::<ExecutionId>().is_err());
        assert!(text.to_ascii_uppercase().parse::<ExecutionId>().is_err());
        assert_eq!(id.as_uuid().get_version_num(), 4);
    }
}
