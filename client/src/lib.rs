//! Rust client of the model runtime's HTTP+SSE API (Model Runtime API 0.1.0) and the `mrt`
//! command line.
//!
//! Module map:
//! - [`client`]: [`Client`] and [`ClientBuilder`], one method per endpoint (submit, get, result,
//!   cancel, runtime info, providers, events); which calls are retried and why.
//! - [`events`]: [`EventStream`], typed events that resume transparently after truncation or
//!   connection loss, exactly once and in order, ending at the terminal event.
//! - [`transcript`]: [`Transcript`], text, tool calls, results and usage accumulated from events.
//! - [`error`]: [`ClientError`] with the portable code and the retryable flag.
//! - [`base_url`]: base-URL and cursor checks (no credentials, query or fragment) [R 89].
//! - [`idempotency`]: [`IdempotencyKey`], checked or generated.
//! - [`keygen`]: new API keys and their deployment-file entries (`mrt keygen`).
//! - [`webhook_secret`]: new webhook signing secrets (`mrt webhook-secret`).
//! - [`retry`]: [`RetryPolicy`], bounded exponential backoff with jitter.
//! - `cli` (feature `cli`, on by default): the `mrt` command; the binary only calls it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), model_runtime_client::ClientError> {
//! use model_runtime_client::{Client, SubmitOptions, text_request};
//! use protocol::{EventBody, Sequence};
//!
//! let mut builder = Client::builder("http://127.0.0.1:4320");
//! // A gateway without an `auth` section takes no key (an empty one is refused).
//! if let Ok(key) = std::env::var("MODEL_RUNTIME_API_KEY") {
//!     builder = builder.api_key(key);
//! }
//! let client = builder.build()?;
//! let submission = client
//!     .submit(&text_request("text-generation", "hello"), &SubmitOptions::idempotent())
//!     .await?;
//! let mut events = client.events(submission.execution_id, Sequence::ZERO)?;
//! while let Some(event) = events.next().await {
//!     if let EventBody::OutputDelta { delta, .. } = &event?.body {
//!         print!("{delta}");
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod base_url;
pub mod client;
pub mod error;
pub mod events;
pub mod idempotency;
pub mod keygen;
pub mod retry;
pub mod transcript;
pub mod webhook_secret;

#[cfg(feature = "cli")]
pub mod cli;

pub use base_url::{BaseUrl, MAX_CURSOR};
pub use client::{Client, ClientBuilder, SubmitOptions};
pub use error::{ApiError, ClientError, TransportKind};
pub use events::EventStream;
pub use idempotency::IdempotencyKey;
pub use retry::RetryPolicy;
pub use transcript::{Outcome, Transcript};

use protocol::ExecutionRequest;
use protocol::request::InputPart;

/// A request for `ability` with one text part: the common case of
/// `{"ability":…,"input":[{"type":"text","text":…}]}`.
pub fn text_request(ability: &str, text: &str) -> ExecutionRequest {
    ExecutionRequest {
        ability: ability.to_owned(),
        input: vec![InputPart::Text {
            text: text.to_owned(),
        }],
        requirements: None,
        routing: None,
        deadline_ms: None,
        metadata: None,
        extensions: None,
    }
}
