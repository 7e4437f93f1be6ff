//! Configured providers in registration order, and candidate selection [R 25-28] with the
//! rule of the capability check the gateway makes (`providers::capability`).

use std::sync::Arc;

use protocol::manifest::ProviderManifest;
use protocol::{ExecutionRequest, Target};
use providers::capability::{Capabilities, Capability, order_by_preference, serving_models};

use crate::flow::ConcurrencyGate;
use crate::provider::Provider;

/// A provider with its flow-control gate.
pub struct ProviderEntry {
    pub provider: Arc<dyn Provider>,
    pub gate: ConcurrencyGate,
}

impl std::fmt::Debug for ProviderEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderEntry")
            .field("id", &self.provider.id())
            .finish_non_exhaustive()
    }
}

/// One eligible provider/model for a request.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub entry: Arc<ProviderEntry>,
    pub model: String,
}

impl Candidate {
    pub fn target(&self) -> Target {
        Target {
            provider: self.entry.provider.id().to_owned(),
            model: self.model.clone(),
        }
    }
}

/// Registration failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("provider ids must be unique")]
    DuplicateId,
    #[error("a provider's manifest names another provider id")]
    ManifestMismatch,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ProviderRegistry {
    entries: Vec<Arc<ProviderEntry>>,
}

impl ProviderRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a provider after the ones already registered.
    pub fn register(
        &mut self,
        provider: Arc<dyn Provider>,
        max_concurrency: u32,
        max_queue_depth: u32,
    ) -> Result<(), RegistryError> {
        if self
            .entries
            .iter()
            .any(|e| e.provider.id() == provider.id())
        {
            return Err(RegistryError::DuplicateId);
        }
        if provider.manifest().provider != provider.id() {
            return Err(RegistryError::ManifestMismatch);
        }
        let gate = ConcurrencyGate::new(max_concurrency, max_queue_depth);
        self.entries
            .push(Arc::new(ProviderEntry { provider, gate }));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Attempts every provider together may run at once: the sum of their `max_concurrency`
    /// (saturating). A process needs no more execution slots than this (see `capacity`).
    pub fn total_concurrency(&self) -> usize {
        self.entries.iter().fold(0usize, |sum, e| {
            sum.saturating_add(e.gate.max_concurrency())
        })
    }

    /// Manifests in registration order.
    pub fn manifests(&self) -> Vec<ProviderManifest> {
        self.entries
            .iter()
            .map(|e| e.provider.manifest().clone())
            .collect()
    }

    /// Every provider/model that can serve `request`, in registration then model order, stably
    /// sorted by `routing.provider_order` (unlisted providers last). `strategy` has no effect
    /// [R 27].
    pub fn candidates(&self, request: &ExecutionRequest) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
            .entries
            .iter()
            .filter(|e| e.provider.admits(request))
            .flat_map(|e| {
                serving_models(e.provider.manifest(), request)
                    .map(|m| Candidate {
                        entry: Arc::clone(e),
                        model: m.model.clone(),
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        order_by_preference(&mut out, request, |c| c.entry.provider.id());
        out
    }

    /// Whether any configured model can serve `request` (the synchronous capability check).
    pub fn can_serve(&self, request: &ExecutionRequest) -> bool {
        self.capabilities().can_serve(request)
    }

    /// The capability check of these providers (their manifests and policies), as the
    /// gateway's embedded mode serves it.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            self.entries
                .iter()
                .map(|e| Arc::new(Adapter(Arc::clone(&e.provider))) as Arc<dyn Capability>)
                .collect(),
        )
    }
}

/// An adapter as the capability check sees it.
struct Adapter(Arc<dyn Provider>);

impl Capability for Adapter {
    fn manifest(&self) -> &ProviderManifest {
        self.0.manifest()
    }

    fn admits(&self, request: &ExecutionRequest) -> bool {
        self.0.admits(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::mock::{MockConfig, MockProvider};

    fn mock(id: &str) -> Arc<dyn Provider> {
        Arc::new(MockProvider::new(MockConfig {
            id: id.into(),
            ..MockConfig::default()
        }))
    }

    fn request(json: &str) -> ExecutionRequest {
        protocol::validate::parse_request(json.as_bytes()).unwrap()
    }

    #[test]
    fn provider_order_is_a_stable_sort_with_unlisted_last() {
        let mut r = ProviderRegistry::new();
        for id in ["a", "b", "c", "d"] {
            r.register(mock(id), 4, 8).unwrap();
        }
        let req = request(
            r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}],"routing":{"provider_order":["c","zzz","a"]}}"#,
        );
        let order: Vec<_> = r
            .candidates(&req)
            .iter()
            .map(|c| c.target().provider)
            .collect();
        assert_eq!(order, vec!["c", "a", "b", "d"]);
    }

    #[test]
    fn ability_and_modalities_filter_candidates() {
        let mut r = ProviderRegistry::new();
        r.register(mock("a"), 4, 8).unwrap();
        assert!(r.can_serve(&request(
            r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}]}"#
        )));
        assert!(!r.can_serve(&request(
            r#"{"ability":"image-generation","input":[{"type":"text","text":"x"}]}"#
        )));
        assert!(!r.can_serve(&request(
            r#"{"ability":"text-generation","input":[{"type":"image","uri":"https://x/y.png"}],"requirements":{"input_modalities":["text"]}}"#
        )));
        assert!(!r.can_serve(&request(
            r#"{"ability":"text-generation","input":[{"type":"json","value":1}]}"#
        )));
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let mut r = ProviderRegistry::new();
        r.register(mock("a"), 4, 8).unwrap();
        assert_eq!(r.register(mock("a"), 4, 8), Err(RegistryError::DuplicateId));
    }
}
