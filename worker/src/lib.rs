//! Runs executions: pulls jobs, routes them to capable providers, enforces deadlines,
//! cancellation and flow control, and turns what providers do into runtime events.
//!
//! Module map:
//! - [`config`]: the deployment file (providers, limits, retention), typed and strictly parsed.
//! - [`provider`]: the `Provider` trait adapters implement, and the adapters (`mock`, ...).
//! - [`registry`]: configured providers in registration order with their manifests; candidate
//!   selection [R 25-28].
//! - [`flow`]: per-provider concurrency gates with bounded FIFO queues [R 35-37].
//! - [`writer`]: the per-execution event writer: assigns sequence and time, appends with
//!   compare-and-set, tracks whether output was exposed.
//! - [`runner`]: one execution from job to terminal event: attempts, fallback, deadline,
//!   cancellation.
//! - [`pool`]: N concurrent runner slots pulling from a `JobQueue`, with graceful shutdown.
//!
//! Adapters translate only; every decision (routing, fallback, sequence, time, ids) is the
//! runner's.

pub mod admin;
pub mod config;
pub mod deployment;
pub mod flow;
pub mod instrument;
pub mod pool;
pub mod process;
pub mod provider;
pub mod registry;
pub mod runner;
pub mod settings;
pub mod writer;

pub use pool::{PoolConfig, WorkerPool};
pub use registry::ProviderRegistry;
