//! The manifest every adapter publishes (mock, openai-responses, openai-chat,
//! anthropic-messages, fal-queue): one configured model with the provider's flow limits.
//!
//! The one decision a reader must know: **capabilities come only from the deployment file**
//! [R 68], never from what the adapter or model could do; callers pass exactly what the
//! deployment declared.

use config::FlowLimits;
use protocol::manifest::{ModelCapability, ProviderLimits, ProviderManifest};

/// The manifest of provider `id` serving one `model`, with `flow` as its published limits.
pub fn single_model(id: &str, model: ModelCapability, flow: FlowLimits) -> ProviderManifest {
    ProviderManifest {
        provider: id.to_owned(),
        protocol_version: protocol::PROTOCOL_VERSION.into(),
        models: vec![model],
        limits: Some(ProviderLimits {
            max_concurrency: flow.max_concurrency,
            max_queue_depth: flow.max_queue_depth,
        }),
    }
}
