//! The provider registry of a deployment (`providers::deployment`, which both binaries open):
//! one adapter per declared provider, in file order, each behind its concurrency gate.

use std::path::Path;

use config::ConfigError;
use providers::DeploymentConfig;

use crate::provider::catalog;
use crate::registry::{ProviderRegistry, RegistryError};

/// The providers cannot be registered together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Registry(#[from] RegistryError),
}

/// Why the process cannot start with its deployment. `Display` is the one sanitized startup
/// line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeploymentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// The deployment at `path` (or the standalone mock without one) and its registry.
pub fn open(path: Option<&Path>) -> Result<(DeploymentConfig, ProviderRegistry), DeploymentError> {
    let deployment = providers::deployment::open(path)?;
    let registry = build_registry(&deployment)?;
    Ok((deployment, registry))
}

/// Registers every configured provider, in file order.
pub fn build_registry(config: &DeploymentConfig) -> Result<ProviderRegistry, BuildError> {
    let mut registry = ProviderRegistry::new();
    for provider in &config.providers {
        let flow = provider.flow();
        registry.register(
            catalog::build(provider),
            flow.max_concurrency,
            flow.max_queue_depth,
        )?;
    }
    Ok(registry)
}
