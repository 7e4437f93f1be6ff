//! The `providers` array: what every provider section has (an object with a known `type` and
//! an id unique within the file, flow limits), and the [`ProviderCatalog`] that parses the
//! rest.
//!
//! The one decision a reader must know: this crate does not know any provider type. The
//! `providers` crate's catalog (`providers::Catalog`) maps each type name to the module that
//! owns its section, as mini-redis commands own their frame parsing; this module only dispatches,
//! so adding a provider type never touches the file format's code.

use std::collections::HashSet;

use serde_json::Value;

use crate::error::ConfigError;
use crate::field::{Fields, child_path};

/// A provider's concurrency gate [R 35-37].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowLimits {
    /// Attempts running at once; at least 1.
    pub max_concurrency: u32,
    /// Attempts waiting, FIFO; 0 means no queueing.
    pub max_queue_depth: u32,
}

impl FlowLimits {
    /// What a provider declared in the file gets unless it says otherwise [R 39].
    pub const CONFIG_DEFAULT: FlowLimits = FlowLimits {
        max_concurrency: 16,
        max_queue_depth: 64,
    };
    /// The mock running alone because no file was given [R 39, 74].
    pub const STANDALONE_MOCK: FlowLimits = FlowLimits {
        max_concurrency: 4,
        max_queue_depth: 8,
    };
    /// Field names of the flow limits, which every provider section has.
    pub const FIELDS: [&'static str; 2] = ["max_concurrency", "max_queue_depth"];

    /// `max_concurrency` and `max_queue_depth` of a provider section.
    pub fn parse(fields: &Fields<'_>) -> Result<Self, ConfigError> {
        let defaults = FlowLimits::CONFIG_DEFAULT;
        let max = u64::from(u32::MAX);
        let concurrency = fields.integer(
            "max_concurrency",
            1,
            max,
            u64::from(defaults.max_concurrency),
        )?;
        let depth = fields.integer(
            "max_queue_depth",
            0,
            max,
            u64::from(defaults.max_queue_depth),
        )?;
        Ok(FlowLimits {
            max_concurrency: u32::try_from(concurrency).unwrap_or(u32::MAX),
            max_queue_depth: u32::try_from(depth).unwrap_or(u32::MAX),
        })
    }
}

impl Default for FlowLimits {
    fn default() -> Self {
        Self::CONFIG_DEFAULT
    }
}

/// The provider types a deployment file may name, and how each parses its section.
///
/// Contract: `parse` returns `None` exactly for names not in `type_names`; a section it
/// accepts was checked for unknown fields with [`Fields::open`], and its errors name paths
/// below the `path` it was given, never values.
pub trait ProviderCatalog {
    /// A parsed provider section.
    type Provider;

    /// Every type name, in the order the error for an unknown `type` lists them.
    fn type_names(&self) -> Vec<&'static str>;

    /// Parses `section` (found at `path`, such as `providers[0]`) as a provider of
    /// `type_name`; `None` when there is no such type.
    fn parse(
        &self,
        type_name: &str,
        section: &Value,
        path: String,
    ) -> Option<Result<Self::Provider, ConfigError>>;

    /// The id of a parsed provider, which must be unique within the file.
    fn id<'a>(&self, provider: &'a Self::Provider) -> &'a str;
}

/// The root `providers` array, in file order (which is routing order [R 25]).
pub(crate) fn parse_providers<C: ProviderCatalog>(
    root: &Fields<'_>,
    catalog: &C,
) -> Result<Vec<C::Provider>, ConfigError> {
    let items = match root.get("providers") {
        None => return Err(ConfigError::required("providers".into())),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => {
            return Err(ConfigError::invalid(
                "providers".into(),
                "must be a non-empty array",
            ));
        }
    };
    let mut seen = HashSet::new();
    let mut providers = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let path = format!("providers[{index}]");
        let provider = parse_provider(item, path.clone(), catalog)?;
        if !seen.insert(catalog.id(&provider).to_owned()) {
            return Err(ConfigError::invalid(
                format!("{path}.id"),
                "duplicates an earlier provider id",
            ));
        }
        providers.push(provider);
    }
    Ok(providers)
}

fn parse_provider<C: ProviderCatalog>(
    value: &Value,
    path: String,
    catalog: &C,
) -> Result<C::Provider, ConfigError> {
    let Some(map) = value.as_object() else {
        return Err(ConfigError::invalid(path, "must be an object"));
    };
    let type_path = child_path(&path, "type");
    let unknown_type = |path: String| {
        let names = catalog.type_names().join(", ");
        ConfigError::invalid(path, format!("must be one of {names}"))
    };
    match map.get("type") {
        None => Err(ConfigError::required(type_path)),
        Some(Value::String(kind)) => catalog
            .parse(kind, value, path)
            .unwrap_or_else(|| Err(unknown_type(type_path))),
        Some(_) => Err(unknown_type(type_path)),
    }
}
