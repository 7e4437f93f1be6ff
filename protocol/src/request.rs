//! The execution request: what a caller asks the runtime to do.
//!
//! Field names, enums and bounds follow the reference schema exactly; the JSON Schema in
//! `spec/schema/execution-request.json` is generated from these types, and [`ExecutionRequest::check`]
//! enforces the bounds that serde alone cannot, so the schema and the validator agree.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Largest `deadline_ms` and `retry_budget_ms` (24 hours).
pub const MAX_DURATION_MS: u64 = 86_400_000;
/// Most input parts in one request.
pub const MAX_INPUT_PARTS: usize = 1024;
/// Most metadata or extension properties.
pub const MAX_PROPERTIES: usize = 64;
/// Longest ability, in Unicode scalar values.
pub const MAX_ABILITY_CHARS: usize = 256;
/// Longest media `uri`.
pub const MAX_URI_CHARS: usize = 8192;
/// Longest `media_type`.
pub const MAX_MEDIA_TYPE_CHARS: usize = 256;
/// Most attempts a caller may ask for.
pub const MAX_ATTEMPTS: u32 = 32;

/// A request to run one ability over typed input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(title = "ExecutionRequest"))]
pub struct ExecutionRequest {
    /// Stable caller intent, e.g. `text-generation`.
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 256)))]
    pub ability: String,
    /// One or more typed input parts.
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 1024)))]
    pub input: Vec<InputPart>,
    /// Capabilities that must be present before routing.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub requirements: Option<Requirements>,
    /// Bounded execution-routing preferences.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub routing: Option<RoutingPreferences>,
    /// Total execution-work deadline in milliseconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_opt_integer"
    )]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400_000)))]
    pub deadline_ms: Option<u64>,
    /// Low-cardinality caller metadata without sensitive content.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("maxProperties" = 64)))]
    pub metadata: Option<BTreeMap<String, MetadataValue>>,
    /// Explicitly provider-neutral extension data.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("maxProperties" = 64)))]
    pub extensions: Option<serde_json::Map<String, Value>>,
}

/// One typed input part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum InputPart {
    /// Plain text (may be empty).
    Text { text: String },
    /// Any JSON value, including null.
    Json { value: Value },
    /// An image by reference.
    Image {
        #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 8192)))]
        uri: String,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
        media_type: Option<String>,
    },
    /// Audio by reference.
    Audio {
        #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 8192)))]
        uri: String,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
        media_type: Option<String>,
    },
    /// Video by reference.
    Video {
        #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 8192)))]
        uri: String,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
        media_type: Option<String>,
    },
    /// Any other file by reference.
    File {
        #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 8192)))]
        uri: String,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
        media_type: Option<String>,
    },
}

impl InputPart {
    /// The modality this part needs from a model.
    pub fn modality(&self) -> Modality {
        match self {
            InputPart::Text { .. } => Modality::Text,
            InputPart::Json { .. } => Modality::Json,
            InputPart::Image { .. } => Modality::Image,
            InputPart::Audio { .. } => Modality::Audio,
            InputPart::Video { .. } => Modality::Video,
            InputPart::File { .. } => Modality::File,
        }
    }

    /// `(uri, media_type)` for media parts.
    pub fn media(&self) -> Option<(&str, Option<&str>)> {
        match self {
            InputPart::Image { uri, media_type }
            | InputPart::Audio { uri, media_type }
            | InputPart::Video { uri, media_type }
            | InputPart::File { uri, media_type } => Some((uri, media_type.as_deref())),
            InputPart::Text { .. } | InputPart::Json { .. } => None,
        }
    }
}

/// Input and output modalities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Modality {
    Text,
    Image,
    Audio,
    Video,
    File,
    Json,
}

/// Capabilities that must be present before routing. Boolean requirements are checked only
/// when `true`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Requirements {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("uniqueItems" = true)))]
    pub input_modalities: Option<Vec<Modality>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("uniqueItems" = true)))]
    pub output_modalities: Option<Vec<Modality>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub stream: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub tools: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub structured_output: Option<bool>,
    #[serde(
        default,
        rename = "async",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub r#async: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub cancel: Option<bool>,
}

/// Routing strategy. Accepted for compatibility; both values route the same way [R 27].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RoutingStrategy {
    FirstAvailable,
    Ordered,
}

/// Bounded execution-routing preferences.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RoutingPreferences {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub strategy: Option<RoutingStrategy>,
    /// Providers to try first, in this order; unlisted providers follow.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("uniqueItems" = true), inner(length(min = 1))))]
    pub provider_order: Option<Vec<String>>,
    /// Whether a retryable failure may move on to the next candidate (default false).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub allow_fallback: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_opt_integer"
    )]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 32)))]
    pub max_attempts: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_opt_integer"
    )]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400_000)))]
    pub retry_budget_ms: Option<u64>,
}

/// A metadata value: string, number or boolean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetadataValue {
    String(String),
    Number(serde_json::Number),
    Bool(bool),
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for MetadataValue {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MetadataValue".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": ["string", "number", "boolean"] })
    }
}

/// Why a parsed request breaks a bound. Internal detail only: the public message is fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BoundViolation {
    #[error("ability length")]
    Ability,
    #[error("input part count")]
    InputCount,
    #[error("media uri length")]
    Uri,
    #[error("media type length")]
    MediaType,
    #[error("duplicate modality")]
    DuplicateModality,
    #[error("provider order entry")]
    ProviderOrder,
    #[error("integer out of range")]
    Range,
    #[error("too many properties")]
    Properties,
}

impl ExecutionRequest {
    /// Checks the bounds the schema states beyond types: lengths (in Unicode scalar values, as
    /// JSON Schema counts them), counts, ranges and uniqueness.
    pub fn check(&self) -> Result<(), BoundViolation> {
        let chars = |s: &str| s.chars().count();
        if !(1..=MAX_ABILITY_CHARS).contains(&chars(&self.ability)) {
            return Err(BoundViolation::Ability);
        }
        if !(1..=MAX_INPUT_PARTS).contains(&self.input.len()) {
            return Err(BoundViolation::InputCount);
        }
        for part in &self.input {
            if let Some((uri, media_type)) = part.media() {
                if !(1..=MAX_URI_CHARS).contains(&chars(uri)) {
                    return Err(BoundViolation::Uri);
                }
                if media_type.is_some_and(|m| chars(m) > MAX_MEDIA_TYPE_CHARS) {
                    return Err(BoundViolation::MediaType);
                }
            }
        }
        if let Some(req) = &self.requirements {
            for list in [&req.input_modalities, &req.output_modalities]
                .into_iter()
                .flatten()
            {
                let unique: BTreeSet<_> = list.iter().collect();
                if unique.len() != list.len() {
                    return Err(BoundViolation::DuplicateModality);
                }
            }
        }
        if let Some(routing) = &self.routing {
            if let Some(order) = &routing.provider_order {
                let unique: BTreeSet<_> = order.iter().collect();
                if unique.len() != order.len() || order.iter().any(String::is_empty) {
                    return Err(BoundViolation::ProviderOrder);
                }
            }
            if routing
                .max_attempts
                .is_some_and(|n| !(1..=MAX_ATTEMPTS).contains(&n))
                || routing
                    .retry_budget_ms
                    .is_some_and(|n| !(1..=MAX_DURATION_MS).contains(&n))
            {
                return Err(BoundViolation::Range);
            }
        }
        if self
            .deadline_ms
            .is_some_and(|n| !(1..=MAX_DURATION_MS).contains(&n))
        {
            return Err(BoundViolation::Range);
        }
        if self
            .metadata
            .as_ref()
            .is_some_and(|m| m.len() > MAX_PROPERTIES)
            || self
                .extensions
                .as_ref()
                .is_some_and(|m| m.len() > MAX_PROPERTIES)
        {
            return Err(BoundViolation::Properties);
        }
        Ok(())
    }

    /// The modalities every input part needs, in first-seen order without duplicates.
    pub fn inferred_input_modalities(&self) -> Vec<Modality> {
        let mut seen = Vec::new();
        for part in &self.input {
            let m = part.modality();
            if !seen.contains(&m) {
                seen.push(m);
            }
        }
        seen
    }
}

/// JSON Schema's `integer` admits `5.0`; so do we (the reference validates with a JSON Schema
/// validator, where `5.0` and `5` are the same number).
fn de_opt_integer<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = serde_json::Number::deserialize(deserializer)?;
    let as_u64 = if let Some(u) = n.as_u64() {
        Some(u)
    } else if let Some(f) = n.as_f64() {
        crate::number::safe_integer(f)
    } else {
        None
    };
    as_u64
        .and_then(|u| T::try_from(u).ok())
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom("expected a non-negative integer in range"))
}

/// Optional fields may be absent but not `null`, as in the reference schema.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}
