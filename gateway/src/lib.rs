//! The HTTP+SSE gateway of the model runtime.
//!
//! Module map:
//! - [`api`]: the axum router and handlers (contract.md section 2).
//! - [`auth`]: API keys: the authentication middleware and the caller's `Principal`.
//! - [`submit`]: the submission and cancellation flows (idempotency, capability check, log
//!   creation, job publish), independent of HTTP; events are written through
//!   `runtime::EventWriter`, never built here.
//! - [`events`]: the SSE projection with backpressure, batching and keep-alives.
//! - [`error`]: `ApiError`, the only place errors become status codes and fixed messages;
//!   `From<StoreError>` gives each store error kind its one HTTP meaning, so handlers use `?`.
//! - [`recent_keys`]: the idempotency keys this gateway saw bound lately, whose submits claim
//!   their key before creating anything (most likely retries).
//! - [`quota`]: per-tenant quotas in the submission flow (`runtime::QuotaGate` built from the
//!   deployment's tenants), checked around the creation of an execution.
//! - [`response`]: JSON responses and the headers every response carries.
//! - [`state`]: backends, limits, lifecycle and metrics shared by handlers.
//! - [`metrics`]: Prometheus counters.
//! - [`embedded`]: the in-memory runtime with the worker pool in-process; the only module
//!   that names the `worker` crate (providers are read through `providers::Capabilities`;
//!   signals and backend settings come from the `startup` crate).
//! - [`distributed`]: NATS JetStream (`runtime::nats::NatsServices`, as the worker connects) and
//!   Redis backends for stateless gateways.
//! - [`connections`]: the accept loop, connection bounds and per-connection timeouts.
//! - [`openai`]: the OpenAI-compatible routes (Responses, Chat Completions, models), a view
//!   over the same submission flow and logs.
//! - [`server`]: settings, startup, serving and graceful shutdown; the binary only calls
//!   [`server::run`].
//!
//! The gateway keeps no per-execution state of its own: everything it serves comes from the
//! backends, so any gateway can serve any execution. (Its memory of recent keys only decides
//! the order of a submit's steps.)

pub mod api;
pub mod auth;
pub mod connections;
pub mod distributed;
pub mod embedded;
pub mod error;
pub mod events;
pub mod instrument;
pub mod metrics;
pub mod openai;
pub mod quota;
pub mod recent_keys;
pub mod response;
pub mod server;
pub mod state;
pub mod submit;

pub use api::router;
pub use embedded::Embedded;
pub use state::{ApiLimits, AppState, Backend};
