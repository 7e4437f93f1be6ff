//! The deployment this process runs: the deployment file parsed with the adapters' own section
//! parsers (the provider catalog), or the mock alone without a file; and the provider registry
//! built from it. Both binaries, and the gateway's embedded mode, start here.

use std::path::Path;

use config::ConfigError;

use crate::provider::catalog::{Catalog, ProviderConfig};
use crate::provider::mock::MockConfig;
use crate::registry::{ProviderRegistry, RegistryError};

/// The deployment file, with provider sections parsed by their adapters.
pub type DeploymentConfig = config::DeploymentConfig<ProviderConfig>;

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

/// No file: the mock provider alone, with concurrency 4 and queue depth 8 [R 39].
pub fn standalone() -> DeploymentConfig {
    DeploymentConfig::with_providers(vec![MockConfig::default().into()])
}

/// Parses deployment JSON.
pub fn parse(json: &str) -> Result<DeploymentConfig, ConfigError> {
    config::deployment::parse(json, &Catalog)
}

/// Reads and parses the deployment file at `path`.
pub fn load(path: &Path) -> Result<DeploymentConfig, ConfigError> {
    config::deployment::load(path, &Catalog)
}

/// The deployment at `path` (or [`standalone`] without one) and its registry.
pub fn open(path: Option<&Path>) -> Result<(DeploymentConfig, ProviderRegistry), DeploymentError> {
    let deployment = match path {
        Some(path) => load(path)?,
        None => standalone(),
    };
    let registry = build_registry(&deployment)?;
    Ok((deployment, registry))
}

/// Registers every configured provider, in file order.
pub fn build_registry(config: &DeploymentConfig) -> Result<ProviderRegistry, BuildError> {
    let mut registry = ProviderRegistry::new();
    for provider in &config.providers {
        let flow = provider.flow();
        registry.register(provider.build(), flow.max_concurrency, flow.max_queue_depth)?;
    }
    Ok(registry)
}
