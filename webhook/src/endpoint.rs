//! The endpoints this process delivers to: the deployment's endpoints with their secrets read,
//! looked up by tenant and event, and by the key that names each in NATS.
//!
//! The one decision a reader must know: an endpoint's [`Endpoint::key`] is a hash of its
//! tenant and id, not the names themselves, because tenant names may hold `.` (a NATS subject
//! separator) and consumer names are restricted; the key is stable across restarts and
//! processes, so every process of a deployment agrees on where an endpoint's deliveries wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use config::{ConfigError, SigningSecret, WebhookConfig, WebhookEvent};
use protocol::Tenant;
use sha2::{Digest, Sha256};

/// One endpoint of one tenant, ready to sign for.
#[derive(derive_more::Debug)]
pub struct Endpoint {
    pub tenant: Tenant,
    pub id: String,
    pub url: reqwest::Url,
    pub events: Vec<WebhookEvent>,
    /// Never shown by `Debug`.
    #[debug(skip)]
    pub secrets: Vec<SigningSecret>,
    /// See the module docs.
    pub key: String,
    /// Answered 410 Gone: nothing more is sent to it until the process restarts.
    gone: AtomicBool,
}

impl Endpoint {
    pub fn wants(&self, event: WebhookEvent) -> bool {
        self.events.contains(&event)
    }

    /// Whether it answered 410 since this process started.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_gone(&self) {
        if !self.gone.swap(true, Ordering::Relaxed) {
            tracing::warn!(tenant = %self.tenant, endpoint = %self.id,
                "webhook endpoint answered 410 Gone: no more deliveries to it until restart");
        }
    }
}

/// The key of an endpoint (see the module docs): 16 hex digits.
pub fn endpoint_key(tenant: &str, id: &str) -> String {
    let digest = Sha256::new()
        .chain_update(tenant.as_bytes())
        .chain_update([0u8])
        .chain_update(id.as_bytes())
        .finalize();
    hex::encode(&digest[..8])
}

/// Every endpoint of the deployment.
#[derive(Debug, Default)]
pub struct Endpoints {
    all: Vec<Arc<Endpoint>>,
    by_tenant: HashMap<Tenant, Vec<Arc<Endpoint>>>,
    by_key: HashMap<String, Arc<Endpoint>>,
}

impl Endpoints {
    /// The deployment's endpoints, their secrets read from the environment now (an unset
    /// variable or a value that is not a secret fails, naming the field). Registers each
    /// endpoint's metrics at 0.
    pub fn from_config(config: &WebhookConfig) -> Result<Self, ConfigError> {
        let secrets = config.secrets()?;
        Self::with_secrets(config, secrets)
    }

    /// [`Endpoints::from_config`] with the secrets given (tests, and callers with their own
    /// source); `secrets[i]` are endpoint `i`'s.
    pub fn with_secrets(
        config: &WebhookConfig,
        secrets: Vec<Vec<SigningSecret>>,
    ) -> Result<Self, ConfigError> {
        let mut endpoints = Self::default();
        for (endpoint, secrets) in config.endpoints.iter().zip(secrets) {
            let tenant: Tenant = endpoint.tenant.parse().map_err(|_| {
                ConfigError::invalid(endpoint.path.clone(), "belongs to an invalid tenant name")
            })?;
            telemetry::metric::register_webhook_endpoint(tenant.as_str(), &endpoint.id);
            let resolved = Arc::new(Endpoint {
                key: endpoint_key(tenant.as_str(), &endpoint.id),
                tenant: tenant.clone(),
                id: endpoint.id.clone(),
                url: endpoint.url.url().clone(),
                events: endpoint.events.clone(),
                secrets,
                gone: AtomicBool::new(false),
            });
            endpoints
                .by_tenant
                .entry(tenant)
                .or_default()
                .push(Arc::clone(&resolved));
            endpoints
                .by_key
                .insert(resolved.key.clone(), Arc::clone(&resolved));
            endpoints.all.push(resolved);
        }
        Ok(endpoints)
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    pub fn all(&self) -> &[Arc<Endpoint>] {
        &self.all
    }

    /// Whether any endpoint of any tenant wants `event` (saves looking up owners of events no
    /// one wants).
    pub fn anyone_wants(&self, event: WebhookEvent) -> bool {
        self.all.iter().any(|e| e.wants(event))
    }

    /// The endpoints of `tenant` that want `event` and have not gone.
    pub fn for_event<'a>(
        &'a self,
        tenant: &Tenant,
        event: WebhookEvent,
    ) -> impl Iterator<Item = &'a Arc<Endpoint>> + 'a {
        self.by_tenant
            .get(tenant)
            .into_iter()
            .flatten()
            .filter(move |e| e.wants(event) && !e.is_gone())
    }

    pub fn by_key(&self, key: &str) -> Option<&Arc<Endpoint>> {
        self.by_key.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(
        tenant: &str,
        id: &str,
        url: &str,
        events: &[WebhookEvent],
    ) -> config::WebhookEndpoint {
        config::WebhookEndpoint {
            tenant: tenant.into(),
            id: id.into(),
            url: config::ExactUrl::parse(url).unwrap(),
            events: events.to_vec(),
            secret_env: vec!["S".into()],
            path: "webhooks[0]".into(),
        }
    }

    #[test]
    fn endpoints_are_found_by_tenant_and_event_and_keys_are_stable() {
        let config = WebhookConfig {
            endpoints: vec![
                endpoint(
                    "a.b",
                    "one",
                    "http://127.0.0.1:1/",
                    &[WebhookEvent::Completed],
                ),
                endpoint("c", "one", "http://127.0.0.1:2/", &[WebhookEvent::Accepted]),
            ],
            ..WebhookConfig::default()
        };
        let secret = SigningSecret::parse(&SigningSecret::encode(&[1u8; 24])).unwrap();
        let endpoints =
            Endpoints::with_secrets(&config, vec![vec![secret.clone()], vec![secret]]).unwrap();
        let ab: Tenant = "a.b".parse().unwrap();
        let c: Tenant = "c".parse().unwrap();
        let found: Vec<_> = endpoints.for_event(&ab, WebhookEvent::Completed).collect();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].url.as_str(), "http://127.0.0.1:1/");
        assert_eq!(endpoints.for_event(&c, WebhookEvent::Completed).count(), 0);
        assert_eq!(endpoints.for_event(&c, WebhookEvent::Accepted).count(), 1);
        assert!(!endpoints.anyone_wants(WebhookEvent::RouteSelected));
        let key = endpoint_key("a.b", "one");
        assert_eq!(key.len(), 16);
        assert_ne!(key, endpoint_key("c", "one"));
        assert_eq!(endpoints.by_key(&key).unwrap().id, "one");
        found[0].mark_gone();
        assert_eq!(endpoints.for_event(&ab, WebhookEvent::Completed).count(), 0);
        assert!(!format!("{:?}", endpoints).contains("secrets"));
    }
}
