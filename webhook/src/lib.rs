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
