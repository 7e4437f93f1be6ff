//! Process plumbing both binaries share, so the gateway never reaches into the worker for
//! it: shutdown signals, and the NATS and Redis settings of the command line turned into the
//! `runtime` types that connect. (Flags themselves are `config::process`; the deployment file
//! is `providers::deployment`.)
//!
//! Module map:
//! - [`signal`]: SIGTERM and SIGINT as a future, installed before anything else starts.
//! - [`backend`]: NATS access and JetStream layout settings, and the Redis key store
//!   connection, from `config::CommonArgs` and the deployment.

pub mod backend;
pub mod signal;

pub use signal::{install_shutdown_signal, shutdown_signal};
