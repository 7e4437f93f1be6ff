//! Runs executions: pulls jobs, routes them to capable providers, enforces deadlines,
//! cancellation and flow control, and turns what providers do into runtime events.
//!
//! Module map:
//! - [`deployment`]: the registry of the deployment this process runs (opened with
//!   `providers::deployment`): one adapter per declared provider; what this binary and the
//!   gateway's embedded mode run.
//! - [`provider`]: the `Provider` trait adapters implement, the adapters (`mock`, ...), the
//!   adapter of each provider type (`catalog`), and the kit the adapters share (`http`,
//!   `frame_loop`, `credential`, `extension`, `text`, `usage`).
//! - [`registry`]: configured providers in registration order with their manifests; candidate
//!   selection [R 25-28].
//! - [`flow`]: per-provider concurrency gates with bounded FIFO queues [R 35-37].
//! - [`runner`]: one execution from job to terminal event: attempts, fallback, deadline,
//!   cancellation.
//! - [`holder`]: whether a redelivered execution's previous holder may still be alive
//!   (running here, or still writing), so a lapsed lease is not taken for a stopped worker.
//! - [`key_guard`]: the worker's half of a keyed submission's idempotency claim: a job whose
//!   key is bound to another execution never runs.
//! - [`capacity`]: how many executions a process runs at once (its providers' capacity, with
//!   an optional cap; never its cores).
//! - [`pool`]: N concurrent runner slots pulling from a `JobQueue`, with graceful shutdown.
//! - [`process`]: the `worker` binary: settings, startup, graceful shutdown.
//! - [`instrument`]: metrics and spans of executions and provider attempts.
//! - [`admin`]: the admin endpoint (`/metrics`, `/healthz`, `/readyz`).
//!
//! Adapters translate only; every decision (routing, fallback, ids) is the runner's, and the
//! runner writes events through `runtime::EventWriter`, which assigns sequences and times.

pub mod admin;
pub mod capacity;
pub mod deployment;
pub mod flow;
pub mod holder;
pub mod instrument;
pub mod key_guard;
pub mod pool;
pub mod process;
pub mod provider;
pub mod registry;
pub mod runner;

pub use pool::{PoolConfig, WorkerPool};
pub use registry::ProviderRegistry;
