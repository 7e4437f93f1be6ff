//! Configuration shared by the `gateway` and `worker` binaries, one module per subsystem
//! (restate's `crates/types/src/config/` is the model). Both binaries depend on this crate;
//! the gateway never reaches into the worker for its settings.
//!
//! Module map:
//! - [`process`]: flags and environment variables of both binaries (`CommonArgs`,
//!   `BackendKind`); the only place process settings are read from the environment.
//! - [`deployment`]: the deployment file: load, parse, and the typed [`DeploymentConfig`].
//! - [`limits`]: the gateway's request and connection limits; execution-limit defaults.
//! - [`event_store`]: bounds of the in-memory event store.
//! - [`provider`]: the `providers` array: flow limits, unique ids, and the
//!   [`ProviderCatalog`] through which the worker's adapters parse their own sections.
//! - [`auth`]: the `auth` section: tenants, their quotas, and API key hashes.
//! - [`base_url`]: provider base URLs, restricted to safe origins.
//! - [`webhook`]: each tenant's webhook endpoints, the retry schedule, and signing secrets
//!   read from the variables the endpoints name.
//! - [`field`]: the strict JSON walker every section is parsed with.
//! - [`error`]: [`ConfigError`], which names paths and never values.
//!
//! Parsing is strict and errors never echo a value from the file: see [`field`].

pub mod auth;
pub mod base_url;
pub mod deployment;
pub mod error;
pub mod event_store;
pub mod field;
pub mod limits;
pub mod process;
pub mod provider;
pub mod webhook;

pub use auth::{ApiKeyEntry, AuthConfig, Scope, Scopes, TenantQuota};
pub use base_url::{BaseUrl, ExactUrl, UnsafeBaseUrl};
pub use deployment::DeploymentConfig;
pub use error::ConfigError;
pub use event_store::EventStoreConfig;
pub use field::Fields;
pub use limits::Limits;
pub use process::{BackendKind, CommonArgs, LogFormat, NatsAccessArgs, Secret};
pub use provider::{FlowLimits, ProviderCatalog};
pub use webhook::{SigningSecret, WebhookConfig, WebhookEndpoint, WebhookEvent};
