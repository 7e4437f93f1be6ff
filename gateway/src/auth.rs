//! API key authentication (contract.md section 7): who is calling, for which tenant, with which
//! scopes.
//!
//! [`authenticate`] runs on every `/v1/*` request (never on `/healthz`, `/readyz`, `/metrics`)
//! and puts the caller's [`Principal`] into the request; handlers take it as an extractor and
//! check the scope their route needs with [`Principal::require`].
//!
//! Decisions a reader must know:
//! - **Hash, then look up.** The presented bearer token is hashed with SHA-256 first and the
//!   digest is looked up in a `HashMap` of the configured hashes. Nothing ever compares a
//!   presented key with a stored one byte by byte, so response timing can only depend on the
//!   digest of what the caller sent, which tells them nothing about any stored key.
//! - Without an `auth` section every request is anonymous: tenant `default`, every scope.
//! - Every failure to authenticate (no header, two headers, another scheme, an unknown key) is
//!   the same 401; the key id may be logged, never the key nor its hash.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use config::{AuthConfig, Scope, Scopes};
use protocol::Tenant;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The owner of what the request creates, and the only tenant whose executions it sees.
    pub tenant: Tenant,
    /// The id of the API key used (safe to log); `None` when anonymous.
    pub key_id: Option<Arc<str>>,
    pub scopes: Scopes,
}

impl Principal {
    /// The principal of every request when the deployment has no `auth` section.
    pub fn anonymous() -> Self {
        Self {
            tenant: Tenant::default(),
            key_id: None,
            scopes: Scopes::ALL,
        }
    }

    /// `Ok` when the key has `scope`, else 403 `permission_denied`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.scopes.contains(scope) {
            Ok(())
        } else {
            tracing::debug!(
                key_id = self.key_id.as_deref(),
                scope = scope.as_str(),
                "scope missing"
            );
            Err(ApiError::PermissionDenied)
        }
    }
}

/// The configured keys, by the SHA-256 of the key; `None`: anonymous deployment.
#[derive(Clone, Default)]
pub struct Authenticator {
    keys: Option<Arc<HashMap<[u8; 32], Principal>>>,
}

impl std::fmt::Debug for Authenticator {
    /// Key ids only; never hashes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Option<Vec<&str>> = self
            .keys
            .as_ref()
            .map(|keys| keys.values().filter_map(|p| p.key_id.as_deref()).collect());
        f.debug_struct("Authenticator")
            .field("key_ids", &ids)
            .finish()
    }
}

impl Authenticator {
    /// Every request is anonymous (tenant `default`, every scope).
    pub fn anonymous() -> Self {
        Self { keys: None }
    }

    /// From the deployment file's `auth` section; `None` is [`Authenticator::anonymous`].
    /// The config crate checks tenant names by [`Tenant`]'s rule; a hand-built section with an
    /// invalid one loses that key (fails closed), with an error logged.
    pub fn from_config(auth: Option<&AuthConfig>) -> Self {
        let Some(auth) = auth else {
            return Self::anonymous();
        };
        let mut keys = HashMap::with_capacity(auth.keys.len());
        for entry in &auth.keys {
            let Ok(tenant) = entry.tenant.parse() else {
                tracing::error!(key_id = %entry.id, "API key names an invalid tenant; key ignored");
                continue;
            };
            keys.insert(
                entry.sha256,
                Principal {
                    tenant,
                    key_id: Some(Arc::from(entry.id.as_str())),
                    scopes: entry.scopes,
                },
            );
        }
        Self {
            keys: Some(Arc::new(keys)),
        }
    }

    /// Whether requests need no key.
    pub fn is_anonymous(&self) -> bool {
        self.keys.is_none()
    }

    /// The principal of a request with these headers, or 401 `unauthenticated`.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let Some(keys) = &self.keys else {
            return Ok(Principal::anonymous());
        };
        let token = bearer_token(headers).ok_or(ApiError::Unauthenticated)?;
        let digest: [u8; 32] = Sha256::digest(token).into();
        keys.get(&digest).cloned().ok_or(ApiError::Unauthenticated)
    }
}

/// The token of the one `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let bytes = value.as_bytes();
    let (scheme, rest) = bytes.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// axum middleware: authenticates `/v1/*` requests and stores their [`Principal`]; answers
/// 401 itself. Other paths pass untouched.
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    if !request.uri().path().starts_with("/v1/") {
        return next.run(request).await;
    }
    match state.inner.auth.authenticate(request.headers()) {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(e) => {
            tracing::debug!("request without a valid API key");
            if crate::openai::owns(request.uri().path()) {
                return crate::openai::error::OpenAiError::from(e).into_response();
            }
            e.into_response()
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| ApiError::Internal("route outside the authentication layer".into()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn only_one_well_formed_bearer_header_counts() {
        assert_eq!(bearer_token(&headers(&["Bearer abc"])), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&headers(&["bearer  abc "])), Some(&b"abc"[..]));
        for bad in [
            &[][..],
            &["Basic abc"],
            &["Bearer"],
            &["Bearer "],
            &["Bearerabc"],
            &["abc"],
            &["Bearer abc", "Bearer abc"],
        ] {
            assert_eq!(bearer_token(&headers(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn keys_are_found_by_their_hash() {
        let auth = AuthConfig {
            tenants: [("acme".to_owned(), config::TenantQuota::default())].into(),
            keys: vec![config::ApiKeyEntry {
                id: "ci".into(),
                tenant: "acme".into(),
                sha256: Sha256::digest(b"mrt_secret").into(),
                scopes: [Scope::Read].into_iter().collect(),
            }],
        };
        let authenticator = Authenticator::from_config(Some(&auth));
        let principal = authenticator
            .authenticate(&headers(&["Bearer mrt_secret"]))
            .unwrap();
        assert_eq!(principal.tenant.as_str(), "acme");
        assert_eq!(principal.key_id.as_deref(), Some("ci"));
        assert!(principal.require(Scope::Read).is_ok());
        assert!(matches!(
            principal.require(Scope::Submit),
            Err(ApiError::PermissionDenied)
        ));
        for bad in [&["Bearer mrt_secreT"][..], &[]] {
            assert!(matches!(
                authenticator.authenticate(&headers(bad)),
                Err(ApiError::Unauthenticated)
            ));
        }
        // The hash itself is not a key.
        let hash = hex::encode(auth.keys[0].sha256);
        assert!(
            authenticator
                .authenticate(&headers(&[&format!("Bearer {hash}")]))
                .is_err()
        );
        let debug = format!("{authenticator:?}");
        assert!(
            debug.contains("ci") && !debug.contains(&hash[..8]),
            "{debug}"
        );
        assert_eq!(
            Authenticator::anonymous()
                .authenticate(&HeaderMap::new())
                .unwrap(),
            Principal::anonymous()
        );
    }
}
