//! The execution request: what a caller asks the runtime to do.
//!
//! Field names, enums and bounds follow the reference schema exactly; the JSON Schema in
//! `spec/schema/execution-request.json` is generated from these types, and [`ExecutionRequest::check`]
//! enforces the bounds that serde alone cannot, so the schema and the validator agree.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::json::RawJson;

/// Declares a request object whose `Option` fields may be absent but not `null` (as in the
/// reference schema) and are left out when `None`: each gets `#[serde(default,
/// skip_serializing_if = "Option::is_none")]` and is read by [`present`], or by the function named
/// after it (`pub n: Option<u64> via "de_opt_integer",`). Other fields are declared as written.
macro_rules! optional_fields {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($fields:tt)* }
    ) => {
        optional_fields!(@fields [$(#[$meta])* pub struct $name] [] $($fields)*);
    };
    (@fields [$($head:tt)*] [$($done:tt)*]
        $(#[$field_meta:meta])* pub $field:ident: Option<$ty:ty> via $with:tt, $($rest:tt)*
    ) => {
        optional_fields!(@fields [$($head)*] [
            $($done)*
            $(#[$field_meta])*
            #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = $with)]
            pub $field: Option<$ty>,
        ] $($rest)*);
    };
    (@fields [$($head:tt)*] [$($done:tt)*]
        $(#[$field_meta:meta])* pub $field:ident: Option<$ty:ty>, $($rest:tt)*
    ) => {
        optional_fields!(@fields [$($head)*] [$($done)*]
            $(#[$field_meta])* pub $field: Option<$ty> via "present", $($rest)*);
    };
    (@fields [$($head:tt)*] [$($done:tt)*]
        $(#[$field_meta:meta])* pub $field:ident: $ty:ty, $($rest:tt)*
    ) => {
        optional_fields!(@fields [$($head)*] [$($done)* $(#[$field_meta])* pub $field: $ty,] $($rest)*);
    };
    (@fields [$($head:tt)*] [$($done:tt)*]) => {
        $($head)* { $($done)* }
    };
}

/// Declares [`InputPart`]: a text part, a JSON part, and one part a media kind given, each a
/// `uri` with an optional `media_type`.
macro_rules! input_part {
    ($($(#[$doc:meta])* $media:ident,)*) => {
        /// One typed input part.
        // Deserialized by hand (below): serde's internally tagged enums buffer every value into a
        // tree first, which is what `RawJson` avoids.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
        pub enum InputPart {
            /// Plain text (may be empty).
            Text { text: String },
            /// Any JSON value, including null.
            Json { value: RawJson },
            $(
                $(#[$doc])*
                $media {
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
            )*
        }
    };
}

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

optional_fields! {
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
        #[serde(deserialize_with = "input_parts")]
        #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 1024)))]
        pub input: Vec<InputPart>,
        /// Capabilities that must be present before routing.
        pub requirements: Option<Requirements>,
        /// Bounded execution-routing preferences.
        pub routing: Option<RoutingPreferences>,
        /// Total execution-work deadline in milliseconds.
        #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400_000)))]
        pub deadline_ms: Option<u64> via "de_opt_integer",
        /// Low-cardinality caller metadata without sensitive content.
        #[cfg_attr(feature = "schema", schemars(extend("maxProperties" = 64)))]
        pub metadata: Option<BTreeMap<String, MetadataValue>>,
        /// Explicitly provider-neutral extension data.
        #[cfg_attr(feature = "schema", schemars(extend("maxProperties" = 64)))]
        pub extensions: Option<Extensions>,
    }
}

/// `extensions`: caller-defined JSON by key, each value kept as its text until an adapter
/// reads it.
pub type Extensions = BTreeMap<String, RawJson>;

input_part! {
    /// An image by reference.
    Image,
    /// Audio by reference.
    Audio,
    /// Video by reference.
    Video,
    /// Any other file by reference.
    File,
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

optional_fields! {
    /// Capabilities that must be present before routing. Boolean requirements are checked only
    /// when `true`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
    #[serde(deny_unknown_fields)]
    pub struct Requirements {
        #[cfg_attr(feature = "schema", schemars(extend("uniqueItems" = true)))]
        pub input_modalities: Option<Vec<Modality>>,
        #[cfg_attr(feature = "schema", schemars(extend("uniqueItems" = true)))]
        pub output_modalities: Option<Vec<Modality>>,
        pub stream: Option<bool>,
        pub tools: Option<bool>,
        pub structured_output: Option<bool>,
        #[serde(rename = "async")]
        pub r#async: Option<bool>,
        pub cancel: Option<bool>,
    }
}

/// Routing strategy. Accepted for compatibility; both values route the same way [R 27].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RoutingStrategy {
    FirstAvailable,
    Ordered,
}

optional_fields! {
    /// Bounded execution-routing preferences.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
    #[serde(deny_unknown_fields)]
    pub struct RoutingPreferences {
        pub strategy: Option<RoutingStrategy>,
        /// Providers to try first, in this order; unlisted providers follow.
        #[cfg_attr(feature = "schema", schemars(extend("uniqueItems" = true), inner(length(min = 1))))]
        pub provider_order: Option<NameList>,
        /// Whether a retryable failure may move on to the next candidate (default false).
        pub allow_fallback: Option<bool>,
        #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 32)))]
        pub max_attempts: Option<u32> via "de_opt_integer",
        #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400_000)))]
        pub retry_budget_ms: Option<u64> via "de_opt_integer",
    }
}

/// A metadata value: string, number or boolean.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
            if let Some(order) = &routing.provider_order
                && (order.has_duplicates() || order.iter().any(str::is_empty))
            {
                return Err(BoundViolation::ProviderOrder);
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

/// Names (`provider_order`) stored in one buffer: a list of short strings as `Vec<String>`
/// costs ~56 bytes each whatever their length, several times the body that carried them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameList {
    text: String,
    /// End of each name in `text`.
    ends: Vec<u32>,
}

impl NameList {
    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let name = self.text.get(start..end as usize).unwrap_or_default();
            start = end as usize;
            name
        })
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Index of the first name equal to `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.iter().position(|n| n == name)
    }

    /// Whether a name appears twice (4 bytes a name to find out).
    pub fn has_duplicates(&self) -> bool {
        let names: Vec<&str> = self.iter().collect();
        let mut order: Vec<u32> = (0..u32::try_from(names.len()).unwrap_or(u32::MAX)).collect();
        let name = |i: &u32| names.get(*i as usize).copied().unwrap_or_default();
        order.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        order.windows(2).any(|w| name(&w[0]) == name(&w[1]))
    }

    fn push(&mut self, name: &str) -> Result<(), &'static str> {
        self.text.push_str(name);
        self.ends
            .push(u32::try_from(self.text.len()).map_err(|_| "name list too long")?);
        Ok(())
    }
}

impl<S: AsRef<str>> FromIterator<S> for NameList {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut list = NameList::default();
        for name in iter {
            // Lists built in code stay far below 4 GiB.
            let _ = list.push(name.as_ref());
        }
        list
    }
}

impl Serialize for NameList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for NameList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;
        impl<'de> Visitor<'de> for Names {
            type Value = NameList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NameList, A::Error> {
                let mut list = NameList::default();
                while seq.next_element_seed(Append(&mut list))?.is_some() {}
                Ok(list)
            }
        }
        /// Appends one string to the list without allocating it on its own.
        struct Append<'a>(&'a mut NameList);
        impl<'de> DeserializeSeed<'de> for Append<'_> {
            type Value = ();
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_str(self)
            }
        }
        impl<'de> Visitor<'de> for Append<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
                self.0.push(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_seq(Names)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for NameList {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        <Vec<String> as schemars::JsonSchema>::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <Vec<String> as schemars::JsonSchema>::json_schema(generator)
    }
}

impl<'de> Deserialize<'de> for MetadataValue {
    /// A string, number or boolean; anything else is refused before it is read further (an
    /// untagged enum would first buffer it, however large).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Scalar;
        impl Visitor<'_> for Scalar {
            type Value = MetadataValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E>(self, v: &str) -> Result<MetadataValue, E> {
                Ok(MetadataValue::String(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<MetadataValue, E> {
                Ok(MetadataValue::String(v))
            }
            fn visit_bool<E>(self, v: bool) -> Result<MetadataValue, E> {
                Ok(MetadataValue::Bool(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<MetadataValue, E> {
                Ok(MetadataValue::Number(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<MetadataValue, E> {
                Ok(MetadataValue::Number(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<MetadataValue, E> {
                serde_json::Number::from_f64(v)
                    .map(MetadataValue::Number)
                    .ok_or_else(|| E::custom("number out of range"))
            }
        }
        deserializer.deserialize_any(Scalar)
    }
}

/// The `type` of an input part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PartType {
    Text,
    Json,
    Image,
    Audio,
    Video,
    File,
}

/// The members an input part may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum PartField {
    Type,
    Text,
    Value,
    Uri,
    MediaType,
}

impl<'de> Deserialize<'de> for InputPart {
    /// `{"type": ..., <the type's fields>}`: an unknown member, a member of another type, a
    /// missing required one or a `null` `media_type` is an error. A repeated member keeps its
    /// last value.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Part;
        impl<'de> Visitor<'de> for Part {
            type Value = InputPart;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an input part object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<InputPart, A::Error> {
                let mut kind = None;
                let mut text = None;
                let mut value = None;
                let mut uri = None;
                let mut media_type = None;
                while let Some(field) = map.next_key::<PartField>()? {
                    match field {
                        PartField::Type => kind = Some(map.next_value::<PartType>()?),
                        PartField::Text => text = Some(map.next_value::<String>()?),
                        PartField::Value => value = Some(map.next_value::<RawJson>()?),
                        PartField::Uri => uri = Some(map.next_value::<String>()?),
                        PartField::MediaType => media_type = Some(map.next_value::<String>()?),
                    }
                }
                let kind = kind.ok_or_else(|| de::Error::missing_field("type"))?;
                let misplaced = |ok: bool, name: &'static str| {
                    if ok {
                        Ok(())
                    } else {
                        Err(de::Error::unknown_field(name, &[]))
                    }
                };
                let media = matches!(
                    kind,
                    PartType::Image | PartType::Audio | PartType::Video | PartType::File
                );
                misplaced(text.is_none() || kind == PartType::Text, "text")?;
                misplaced(value.is_none() || kind == PartType::Json, "value")?;
                misplaced(uri.is_none() || media, "uri")?;
                misplaced(media_type.is_none() || media, "media_type")?;
                Ok(match kind {
                    PartType::Text => InputPart::Text {
                        text: text.ok_or_else(|| de::Error::missing_field("text"))?,
                    },
                    PartType::Json => InputPart::Json {
                        value: value.ok_or_else(|| de::Error::missing_field("value"))?,
                    },
                    media => {
                        let uri = uri.ok_or_else(|| de::Error::missing_field("uri"))?;
                        match media {
                            PartType::Image => InputPart::Image { uri, media_type },
                            PartType::Audio => InputPart::Audio { uri, media_type },
                            PartType::Video => InputPart::Video { uri, media_type },
                            _ => InputPart::File { uri, media_type },
                        }
                    }
                })
            }
        }
        deserializer.deserialize_map(Part)
    }
}

/// `input`, refused as soon as it has more than [`MAX_INPUT_PARTS`] parts.
fn input_parts<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<InputPart>, D::Error> {
    struct Parts;
    impl<'de> Visitor<'de> for Parts {
        type Value = Vec<InputPart>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of input parts")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<InputPart>, A::Error> {
            let mut parts = Vec::new();
            while let Some(part) = seq.next_element::<InputPart>()? {
                if parts.len() == MAX_INPUT_PARTS {
                    return Err(de::Error::invalid_length(MAX_INPUT_PARTS + 1, &self));
                }
                parts.push(part);
            }
            Ok(parts)
        }
    }
    deserializer.deserialize_seq(Parts)
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
