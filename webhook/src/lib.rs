//! Webhooks: signed, durable deliveries of execution outcomes to each tenant's endpoints, as
//! the Standard Webhooks specification describes them (contract.md section 11).
//!
//! Module map:
//! - [`signature`]: the `webhook-id`, `webhook-timestamp` and `webhook-signature` headers
//!   (HMAC-SHA256 of `id.timestamp.body`, one `v1,` signature per secret).
//! - [`notification`]: the JSON body and `webhook-id` of one stored event, a pure function of
//!   the log (never input or output content).
//! - [`endpoint`]: the deployment's endpoints with their secrets, looked up by tenant and
//!   event; an endpoint that answered 410 is gone until restart.
//! - [`attempt`]: one attempt (15 s, no redirects), its metrics, and the retry schedule.
//! - [`nats`]: `nats` mode: deliveries derived from the events streams by a durable feed and
//!   carried by a WorkQueue stream with one consumer per endpoint, shared by every worker.
//! - [`memory`]: embedded mode: the same attempts fed by the memory event store.
//!
//! The decision a reader must know: a delivery is owed once its event is *stored*, so both
//! pipelines derive deliveries from the store, never from the writer that appended the event;
//! delivery is at least once, and receivers deduplicate by `webhook-id`.

pub mod attempt;
pub mod endpoint;
pub mod memory;
pub mod nats;
pub mod notification;
pub mod signature;

pub use attempt::{ATTEMPT_TIMEOUT, RetrySchedule, Sender};
pub use endpoint::{Endpoint, Endpoints};
pub use memory::MemoryWebhooks;
pub use nats::NatsWebhooks;

use std::sync::Arc;

use config::{ConfigError, WebhookConfig};

/// Why a delivering process cannot start its webhooks. `Display` is one sanitized line.
#[derive(Debug)]
pub enum SetupError {
    /// A secret variable is unset or holds no secret (the message names the field).
    Config(ConfigError),
    /// The HTTP client could not be built (the TLS backend refused).
    Client,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Config(e) => e.fmt(f),
            SetupError::Client => f.write_str("cannot build the webhook HTTP client"),
        }
    }
}

impl std::error::Error for SetupError {}

/// The endpoints (their secrets read from the environment now) and the sender of a process
/// that delivers webhooks; `None` when the deployment has no endpoint.
pub fn setup(config: &WebhookConfig) -> Result<Option<(Arc<Endpoints>, Sender)>, SetupError> {
    if config.is_empty() {
        return Ok(None);
    }
    let endpoints = Endpoints::from_config(config).map_err(SetupError::Config)?;
    let sender = Sender::new(RetrySchedule::of(config)).map_err(|e| {
        tracing::error!(error = %e, "cannot build the webhook HTTP client");
        SetupError::Client
    })?;
    Ok(Some((Arc::new(endpoints), sender)))
}
