//! The one error type of every store and queue implementation.

use protocol::materialize::LogViolation;
use protocol::{ErrorCode, Sequence};

/// What can go wrong talking to a store, queue or bus.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// `create` for an execution that already has a log.
    #[error("execution already exists")]
    AlreadyExists,
    /// The execution has no log (never created, expired or evicted).
    #[error("execution not found")]
    NotFound,
    /// Compare-and-set failed: another writer appended first. `last` is the log's last sequence
    /// now; `terminal` tells whether the log is closed.
    #[error("append conflict: log is at sequence {last}")]
    Conflict { last: Sequence, terminal: bool },
    /// The event breaks the log rules.
    #[error("log rule violated: {0}")]
    Violation(#[from] LogViolation),
    /// The execution hit its per-execution event or byte limit [R 84].
    #[error("execution event log limit reached")]
    ExecutionLimit,
    /// Admission limit of concurrently active executions reached.
    #[error("admission limit reached")]
    AdmissionFull,
    /// Retained-execution capacity is exhausted and nothing can be evicted [R 83].
    #[error("event store capacity exhausted")]
    CapacityExhausted,
    /// The backend is unreachable or failed; the operation may or may not have happened only
    /// where the method's contract says so.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The store or queue was shut down.
    #[error("closed")]
    Closed,
    /// The backend holds a setting this process cannot bring to its own value (for example a
    /// stream's storage type): retrying will not help, an operator must act.
    #[error("backend misconfigured: {0}")]
    Misconfigured(String),
}

impl StoreError {
    /// The portable code this error maps to when it reaches a caller.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::NotFound => ErrorCode::NotFound,
            StoreError::ExecutionLimit
            | StoreError::AdmissionFull
            | StoreError::CapacityExhausted => ErrorCode::QueueFull,
            StoreError::Unavailable(_) | StoreError::Closed => ErrorCode::Unavailable,
            StoreError::AlreadyExists
            | StoreError::Conflict { .. }
            | StoreError::Violation(_)
            | StoreError::Misconfigured(_) => ErrorCode::InternalError,
        }
    }

    /// Whether retrying the same operation later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            StoreError::AdmissionFull
                | StoreError::CapacityExhausted
                | StoreError::Unavailable(_)
                | StoreError::Closed
        )
    }
}
