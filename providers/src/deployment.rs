//! The deployment this process runs: the deployment file parsed with each provider type's
//! own section parser ([`Catalog`]), or the mock alone without a file. Both binaries open it
//! here; the worker builds its adapters from it, the gateway its capability check.

use std::path::Path;

use config::ConfigError;

use crate::catalog::{Catalog, ProviderConfig};
use crate::mock::MockConfig;

/// The deployment file, with provider sections parsed by their types.
pub type DeploymentConfig = config::DeploymentConfig<ProviderConfig>;

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

/// The deployment at `path`, or [`standalone`] without one. The error's `Display` is the one
/// sanitized startup line. A retention shorter than the longest deadline is logged as a
/// warning ([`config::DeploymentConfig::retention_below_max_deadline`]).
pub fn open(path: Option<&Path>) -> Result<DeploymentConfig, ConfigError> {
    let deployment = match path {
        Some(path) => load(path)?,
        None => standalone(),
    };
    if deployment.retention_below_max_deadline() {
        tracing::warn!(
            retention_ms = deployment.retention.as_millis(),
            max_deadline_ms = deployment.limits.max_deadline_ms,
            "retention_ms is shorter than limits.max_deadline_ms: an execution that runs longer \
             than the retention can lose its idempotency key (a retry then runs it again) and \
             the start of its log; raise retention_ms or lower max_deadline_ms"
        );
    }
    Ok(deployment)
}
