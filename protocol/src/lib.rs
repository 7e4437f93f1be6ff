//! Wire types of the Model Runtime API 0.1.0 and the pure logic every process shares.
//!
//! Module map:
//! - [`id`]: `ExecutionId` and `Sequence` newtypes.
//! - [`time`]: `Timestamp`, always ISO-8601 UTC with milliseconds (`2026-01-01T00:00:00.000Z`).
//! - [`request`]: `ExecutionRequest` and its parts (the caller's input).
//! - [`json`]: `RawJson`, caller-defined JSON kept as its text, and the in-place readers and
//!   writers over it (compact text, canonical form, one member, provider bodies).
//! - [`validate`]: bytes → checked `ExecutionRequest`, with fixed public messages only (read in
//!   place by `strict`, with `JSON.parse` semantics and no JSON tree).
//! - [`fingerprint`]: canonical JSON and the sha256 request fingerprint used by idempotency.
//! - [`idempotency`]: the `Idempotency-Key` rule (1-256 visible ASCII characters).
//! - [`number`]: `MAX_SAFE_INTEGER`, the largest integer on the wire, and whole-number checks.
//! - [`error`]: portable error codes and the `RuntimeError` carried in events and responses.
//! - [`usage`]: `UsageFact` with known and namespaced custom units.
//! - [`event`]: the eleven runtime events and their envelope.
//! - [`snapshot`]: `ExecutionSnapshot`, submission, result and runtime-info response shapes.
//! - [`manifest`]: provider manifests and model capabilities.
//! - [`materialize`]: ordered events → snapshot and result, enforcing the log rules.
//! - [`sse`]: SSE frame encoding and a WHATWG-conformant incremental parser.
//! - [`tenant`]: `Tenant`, the owner of executions and idempotency keys.
//! - `schema` (feature `schema`): the spec generator, JSON Schema and OpenAPI documents
//!   generated from these types (`spec/`); off in the binaries, on for the spec drift test.
//!
//! This crate has no async runtime and no I/O: the gateway, the worker and the client all build
//! on it, and every public function returns a typed error instead of panicking on bad input.

/// Declares `$err`, the unit error of a text that is not a `$ty` (its message is fixed and never
/// echoes the input), and `FromStr for $ty` by `$parse`.
macro_rules! parse_error {
    ($(#[$doc:meta])* $err:ident = $msg:tt; $ty:ty => $parse:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
        #[error($msg)]
        pub struct $err;

        impl std::str::FromStr for $ty {
            type Err = $err;

            fn from_str(s: &str) -> Result<Self, $err> {
                $parse(s)
            }
        }
    };
}

/// `as_str`, the wire name of each variant of a fieldless enum (as serde writes it), and
/// `Display` by it.
macro_rules! wire_names {
    ($ty:ident { $($variant:ident => $name:literal,)* }) => {
        impl $ty {
            /// The value as it appears on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod error;
pub mod event;
pub mod fingerprint;
pub mod id;
pub mod idempotency;
pub mod json;
pub mod manifest;
pub mod materialize;
pub mod number;
mod parsed;
pub mod request;
#[cfg(feature = "schema")]
pub mod schema;
pub mod snapshot;
pub mod sse;
mod strict;
pub mod tenant;
pub mod time;
pub mod usage;
pub mod validate;

/// The protocol version this crate implements, as reported in manifests and `/v1/runtime`.
pub const PROTOCOL_VERSION: &str = "0.1.0";

pub use error::{ErrorCode, RuntimeError};
pub use event::{EventBody, ExecutionStatus, RuntimeEvent, Target};
pub use id::{ExecutionId, Sequence};
pub use number::MAX_SAFE_INTEGER;
pub use request::ExecutionRequest;
pub use snapshot::ExecutionSnapshot;
pub use tenant::Tenant;
pub use time::Timestamp;
pub use usage::{UsageFact, UsageSource, UsageUnit};
