//! The synchronous capability check: which configured providers could serve a request, read
//! from their manifests and request policies alone. The gateway answers `/v1/providers` and
//! refuses a request no provider can serve with it; the worker's registry routes with the
//! same rule ([`serving_models`]).
//!
//! The one decision a reader must know: a provider serves a request when its policy admits
//! the request *and* one of its manifest's models satisfies it [R 25-28]; nothing else (load,
//! credentials, health) is looked at, so the check needs no adapter and does no I/O.

use std::fmt;
use std::sync::Arc;

use protocol::manifest::{ModelCapability, ProviderManifest};
use protocol::{ExecutionRequest, Target};

use crate::catalog::ProviderConfig;

/// What the capability check knows of one provider.
///
/// Contract: `manifest().provider` is the provider id; `admits` reads no credential and does
/// no I/O.
pub trait Capability: Send + Sync {
    fn manifest(&self) -> &ProviderManifest;
    /// Policy beyond the manifest, such as tools the deployment disabled [R 68].
    fn admits(&self, request: &ExecutionRequest) -> bool;
}

/// The models of `manifest` that satisfy `request`, in manifest order (the provider's policy
/// is checked separately).
pub fn serving_models<'a>(
    manifest: &'a ProviderManifest,
    request: &'a ExecutionRequest,
) -> impl Iterator<Item = &'a ModelCapability> + 'a {
    manifest.models.iter().filter(|m| m.satisfies(request))
}

/// Sorts `items` (candidates in registration then model order) stably by
/// `routing.provider_order`, providers it does not list last; `strategy` has no effect
/// [R 27].
pub fn order_by_preference<T>(
    items: &mut [T],
    request: &ExecutionRequest,
    provider: impl Fn(&T) -> &str,
) {
    if let Some(order) = request
        .routing
        .as_ref()
        .and_then(|r| r.provider_order.as_ref())
    {
        items.sort_by_key(|item| {
            let id = provider(item);
            order.iter().position(|p| p == id).unwrap_or(order.len())
        });
    }
}

/// A provider section with its manifest built once.
struct Declared {
    manifest: ProviderManifest,
    config: ProviderConfig,
}

impl Capability for Declared {
    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    fn admits(&self, request: &ExecutionRequest) -> bool {
        self.config.admits(request)
    }
}

/// Configured providers in registration (file) order, for the capability check.
#[derive(Clone, Default)]
pub struct Capabilities {
    providers: Vec<Arc<dyn Capability>>,
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self
            .providers
            .iter()
            .map(|p| p.manifest().provider.as_str())
            .collect();
        f.debug_struct("Capabilities")
            .field("providers", &ids)
            .finish()
    }
}

impl Capabilities {
    /// Providers as given, in routing order.
    pub fn new(providers: Vec<Arc<dyn Capability>>) -> Self {
        Self { providers }
    }

    /// The providers a deployment declares, in file order.
    pub fn of(configs: &[ProviderConfig]) -> Self {
        Self::new(
            configs
                .iter()
                .map(|config| {
                    Arc::new(Declared {
                        manifest: config.manifest(),
                        config: config.clone(),
                    }) as Arc<dyn Capability>
                })
                .collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.providers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// Manifests in registration order.
    pub fn manifests(&self) -> Vec<ProviderManifest> {
        self.providers
            .iter()
            .map(|p| p.manifest().clone())
            .collect()
    }

    /// Every provider/model that can serve `request`, in the order the worker tries them
    /// (registration then model order, by `routing.provider_order`).
    pub fn targets(&self, request: &ExecutionRequest) -> Vec<Target> {
        let mut out: Vec<Target> = self
            .providers
            .iter()
            .filter(|p| p.admits(request))
            .flat_map(|p| {
                let provider = &p.manifest().provider;
                serving_models(p.manifest(), request).map(|m| Target {
                    provider: provider.clone(),
                    model: m.model.clone(),
                })
            })
            .collect();
        order_by_preference(&mut out, request, |t| &t.provider);
        out
    }

    /// Whether any configured model can serve `request`.
    pub fn can_serve(&self, request: &ExecutionRequest) -> bool {
        self.providers
            .iter()
            .any(|p| p.admits(request) && serving_models(p.manifest(), request).next().is_some())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mock::MockConfig;
    use crate::text::{OPENAI_CHAT, TextProviderConfig};

    fn request(json: &str) -> ExecutionRequest {
        protocol::validate::parse_request(json.as_bytes()).unwrap()
    }

    const TEXT: &str = r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}]"#;

    #[test]
    fn ability_and_modalities_decide() {
        let set = Capabilities::of(&[MockConfig::default().into()]);
        assert_eq!(set.len(), 1);
        assert!(set.can_serve(&request(&format!("{TEXT}}}"))));
        assert!(!set.can_serve(&request(
            r#"{"ability":"image-generation","input":[{"type":"text","text":"x"}]}"#
        )));
        assert!(!set.can_serve(&request(
            r#"{"ability":"text-generation","input":[{"type":"json","value":1}],"requirements":{"input_modalities":["text"]}}"#
        )));
    }

    #[test]
    fn the_policy_refuses_tools_the_deployment_did_not_enable() {
        let chat = TextProviderConfig::parse(
            &serde_json::json!({"type": "openai-chat", "model": "m", "api_key_env": "KEY", "base_url": "https://example.com/v1"}),
            "providers[0]".into(),
            &OPENAI_CHAT,
        )
        .unwrap();
        let set = Capabilities::of(&[ProviderConfig::OpenAiChat(chat)]);
        assert!(set.can_serve(&request(&format!("{TEXT}}}"))));
        assert!(!set.can_serve(&request(&format!(
            r#"{TEXT},"extensions":{{"openai-chat":{{"request":{{"tools":[]}}}}}}}}"#
        ))));
        assert!(!set.can_serve(&request(&format!(
            r#"{TEXT},"extensions":{{"openai-chat":1}}}}"#
        ))));
    }
}
