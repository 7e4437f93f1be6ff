//! The deployment file's `auth` section (contract.md section 7): tenants with their quotas, and
//! API keys stored only as SHA-256 hashes.
//!
//! ```json
//! "auth": {
//!   "tenants": {"acme": {"max_active_executions": 100, "submits_per_second": 50, "burst": 100}},
//!   "keys": [{"id": "acme-ci", "tenant": "acme", "sha256": "<64 hex>",
//!             "scopes": ["submit", "read", "cancel"]}]
//! }
//! ```
//!
//! Decisions a reader must know:
//! - **Every key's tenant must be listed in `tenants`** (an empty object `{}` means "no
//!   quotas"). A misspelt tenant would otherwise silently become a new tenant with its own,
//!   unlimited executions.
//! - `keys` must not be empty (an `auth` section with no key would refuse every request), and
//!   no two keys share an `id` or a hash. Rotation is two keys of one tenant at once.
//! - `scopes` defaults to all three when absent; `[]` is allowed (a key that may only call
//!   `/v1/runtime` and `/v1/providers`).
//! - `submits_per_second` is a positive number (fractions allowed: `0.5` is one every two
//!   seconds); `burst` requires it and defaults to `ceil(submits_per_second)`.
//! - Errors follow [`crate::field`]: paths, never values. Hashes never appear in errors or in
//!   `Debug` output.

use std::collections::{BTreeMap, HashSet};

use protocol::tenant::is_valid_name;
use serde_json::Value;

use crate::error::ConfigError;
use crate::field::{Fields, MAX_SAFE_INTEGER};

const AUTH_FIELDS: &[&str] = &["tenants", "keys"];
// `webhooks` is parsed by `crate::webhook`.
const TENANT_FIELDS: &[&str] = &[
    "max_active_executions",
    "submits_per_second",
    "burst",
    "webhooks",
];
const KEY_FIELDS: &[&str] = &["id", "tenant", "sha256", "scopes"];

/// Largest `submits_per_second` (a million per second per tenant is beyond any deployment).
pub const MAX_SUBMITS_PER_SECOND: f64 = 1_000_000.0;

const NAME_RULE: &str = "must be 1 to 64 ASCII letters, digits, '-', '_' or '.'";

/// The `auth` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// Tenant name → its quotas. Every key's tenant is here.
    pub tenants: BTreeMap<String, TenantQuota>,
    /// Never empty; ids and hashes are unique.
    pub keys: Vec<ApiKeyEntry>,
}

/// Quotas of one tenant (enforced by the quota module; all optional).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TenantQuota {
    /// Non-terminal executions of the tenant at once, cluster-wide.
    pub max_active_executions: Option<u64>,
    /// Token-bucket refill rate; positive and finite.
    pub submits_per_second: Option<f64>,
    /// Token-bucket capacity: `Some` (at least 1) exactly when `submits_per_second` is.
    pub burst: Option<u64>,
}

// `submits_per_second` is validated finite (never NaN), so equality is total.
impl Eq for TenantQuota {}

/// One API key: its id (may be logged), tenant, hash and scopes.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKeyEntry {
    pub id: String,
    pub tenant: String,
    /// SHA-256 of the key's UTF-8 bytes.
    pub sha256: [u8; 32],
    pub scopes: Scopes,
}

impl std::fmt::Debug for ApiKeyEntry {
    /// The hash is left out: it never appears in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyEntry")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// One permission of a key (contract.md section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `POST /v1/executions`.
    Submit,
    /// `GET` of an execution's snapshot, result and events.
    Read,
    /// `POST /v1/executions/{id}/cancel`.
    Cancel,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Submit, Scope::Read, Scope::Cancel];

    /// The name used in the file and on the `mrt keygen` command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Read => "read",
            Scope::Cancel => "cancel",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    fn bit(self) -> u8 {
        match self {
            Scope::Submit => 1,
            Scope::Read => 2,
            Scope::Cancel => 4,
        }
    }
}

/// A set of [`Scope`]s.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scopes(u8);

impl Scopes {
    pub const NONE: Scopes = Scopes(0);
    pub const ALL: Scopes = Scopes(7);

    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    #[must_use]
    pub fn with(self, scope: Scope) -> Self {
        Scopes(self.0 | scope.bit())
    }

    /// The scopes in file order (`submit`, `read`, `cancel`).
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        iter.into_iter().fold(Scopes::NONE, Scopes::with)
    }
}

impl std::fmt::Debug for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(Scope::as_str))
            .finish()
    }
}

impl AuthConfig {
    /// Parses the root `auth` object.
    pub(crate) fn parse(value: &Value) -> Result<Self, ConfigError> {
        let fields = Fields::open(value, "auth".into(), AUTH_FIELDS)?;
        let tenants = parse_tenants(&fields)?;
        let keys = parse_keys(&fields, &tenants)?;
        Ok(AuthConfig { tenants, keys })
    }
}

fn parse_tenants(auth: &Fields<'_>) -> Result<BTreeMap<String, TenantQuota>, ConfigError> {
    let path = auth.path_of("tenants");
    let Some(value) = auth.get("tenants") else {
        return Err(ConfigError::required(path));
    };
    let Some(map) = value.as_object() else {
        return Err(ConfigError::invalid(path, "must be an object"));
    };
    let mut tenants = BTreeMap::new();
    for (name, quota) in map {
        let tenant_path = crate::field::child_path(&path, name);
        if !is_valid_name(name) {
            return Err(ConfigError::invalid(
                tenant_path,
                format!("is not a valid tenant name: a tenant name {NAME_RULE}"),
            ));
        }
        tenants.insert(name.clone(), parse_quota(quota, tenant_path)?);
    }
    Ok(tenants)
}

fn parse_quota(value: &Value, path: String) -> Result<TenantQuota, ConfigError> {
    let fields = Fields::open(value, path, TENANT_FIELDS)?;
    let max_active_executions = match fields.get("max_active_executions") {
        None => None,
        Some(_) => Some(fields.integer("max_active_executions", 1, MAX_SAFE_INTEGER, 1)?),
    };
    let submits_per_second = match fields.get("submits_per_second") {
        None => None,
        Some(value) => {
            let rate = value.as_f64().filter(|r| r.is_finite() && *r > 0.0);
            match rate {
                Some(r) if r <= MAX_SUBMITS_PER_SECOND => Some(r),
                _ => {
                    return Err(ConfigError::invalid(
                        fields.path_of("submits_per_second"),
                        format!("must be a positive number of at most {MAX_SUBMITS_PER_SECOND}"),
                    ));
                }
            }
        }
    };
    let burst = match (fields.get("burst"), submits_per_second) {
        (Some(_), None) => {
            return Err(ConfigError::invalid(
                fields.path_of("burst"),
                "requires submits_per_second",
            ));
        }
        (Some(_), Some(_)) => Some(fields.integer("burst", 1, MAX_SAFE_INTEGER, 1)?),
        // At most 1e6, so the cast is exact.
        (None, Some(rate)) => Some((rate.ceil() as u64).max(1)),
        (None, None) => None,
    };
    Ok(TenantQuota {
        max_active_executions,
        submits_per_second,
        burst,
    })
}

fn parse_keys(
    auth: &Fields<'_>,
    tenants: &BTreeMap<String, TenantQuota>,
) -> Result<Vec<ApiKeyEntry>, ConfigError> {
    let path = auth.path_of("keys");
    let items = match auth.get("keys") {
        None => return Err(ConfigError::required(path)),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => return Err(ConfigError::invalid(path, "must be a non-empty array")),
    };
    let mut ids = HashSet::new();
    let mut hashes = HashSet::new();
    let mut keys = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let fields = Fields::open(item, format!("{path}[{index}]"), KEY_FIELDS)?;
        let id = valid_name(&fields, "id")?;
        if !ids.insert(id.clone()) {
            return Err(ConfigError::invalid(
                fields.path_of("id"),
                "repeats the id of an earlier key",
            ));
        }
        let tenant = valid_name(&fields, "tenant")?;
        if !tenants.contains_key(&tenant) {
            return Err(ConfigError::invalid(
                fields.path_of("tenant"),
                "must name a tenant listed in auth.tenants",
            ));
        }
        let sha256 = hash(&fields)?;
        if !hashes.insert(sha256) {
            return Err(ConfigError::invalid(
                fields.path_of("sha256"),
                "repeats the hash of an earlier key",
            ));
        }
        keys.push(ApiKeyEntry {
            id,
            tenant,
            sha256,
            scopes: scopes(&fields)?,
        });
    }
    Ok(keys)
}

fn valid_name(fields: &Fields<'_>, key: &str) -> Result<String, ConfigError> {
    match fields.get(key) {
        None => Err(ConfigError::required(fields.path_of(key))),
        Some(Value::String(name)) if is_valid_name(name) => Ok(name.clone()),
        Some(_) => Err(ConfigError::invalid(fields.path_of(key), NAME_RULE)),
    }
}

fn hash(fields: &Fields<'_>) -> Result<[u8; 32], ConfigError> {
    let path = fields.path_of("sha256");
    let text = match fields.get("sha256") {
        None => return Err(ConfigError::required(path)),
        Some(Value::String(text)) => text,
        Some(_) => return Err(ConfigError::invalid(path, "must be a string")),
    };
    let mut out = [0u8; 32];
    match hex::decode_to_slice(text, &mut out) {
        Ok(()) => Ok(out),
        Err(_) => Err(ConfigError::invalid(
            path,
            "must be the SHA-256 of the key as 64 hexadecimal characters (mrt keygen prints it)",
        )),
    }
}

fn scopes(fields: &Fields<'_>) -> Result<Scopes, ConfigError> {
    let path = fields.path_of("scopes");
    let items = match fields.get("scopes") {
        None => return Ok(Scopes::ALL),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ConfigError::invalid(
                path,
                "must be an array of \"submit\", \"read\" or \"cancel\"",
            ));
        }
    };
    let mut scopes = Scopes::NONE;
    for (index, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{index}]");
        let Some(scope) = item.as_str().and_then(Scope::parse) else {
            return Err(ConfigError::invalid(
                item_path,
                "must be one of submit, read, cancel",
            ));
        };
        if scopes.contains(scope) {
            return Err(ConfigError::invalid(item_path, "repeats an earlier scope"));
        }
        scopes = scopes.with(scope);
    }
    Ok(scopes)
}
