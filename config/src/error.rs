//! [`ConfigError`]: why the deployment file was refused.
//!
//! The one decision a reader must know: `Display` names paths (in the file, or of the file)
//! and the rule broken, never a value from the file, because any value may be a secret. It is
//! one line, safe to print on stderr and to log.

use std::path::PathBuf;

/// Why the deployment file was refused. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be opened or read. Only the kind of failure is kept.
    #[error("configuration file {path:?} could not be read: {kind}")]
    Io {
        path: PathBuf,
        kind: std::io::ErrorKind,
    },
    /// The file is larger than [`crate::deployment::MAX_FILE_BYTES`].
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

impl ConfigError {
    /// `path` breaks `requirement` (a phrase such as "must be an object").
    pub fn invalid(path: String, requirement: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path,
            requirement: requirement.into(),
        }
    }

    /// `path` is missing.
    pub fn required(path: String) -> Self {
        Self::invalid(path, "is required")
    }
}
