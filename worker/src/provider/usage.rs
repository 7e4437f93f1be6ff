//! Usage facts from a provider's usage object, for the adapters whose usage is a plain object
//! of counters (openai-responses, openai-chat): each declares a table of counter paths and
//! units.

use protocol::{RuntimeError, UsageFact, UsageSource, UsageUnit};
use serde_json::Value;

use super::http::protocol_error;

/// A usage counter's path in the provider's usage object, and its unit.
pub type UsageMapping = (&'static [&'static str], fn() -> UsageUnit);

/// Usage facts from a provider usage object: one complete `provider` fact per counter that is
/// present and numeric, in `mapping` order; absent, null or non-numeric counters are skipped.
/// A negative or non-finite count is `provider_protocol_error`.
pub fn usage_facts(
    usage: &Value,
    mapping: &[UsageMapping],
) -> Result<Vec<UsageFact>, RuntimeError> {
    mapping
        .iter()
        .filter_map(|(path, unit)| number_at(usage, path).map(|q| (unit(), q)))
        .map(|(unit, quantity)| {
            UsageFact::new(unit, quantity, UsageSource::Provider)
                .map_err(|_| protocol_error("Provider reported invalid usage"))
        })
        .collect()
}

/// The number at `path` inside `value`, if it is a JSON number.
fn number_at(value: &Value, path: &[&str]) -> Option<f64> {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_f64)
}
