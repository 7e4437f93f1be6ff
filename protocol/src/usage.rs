//! Usage facts: what an execution consumed, as reported by the provider or derived by the
//! runtime. Facts are listed, never summed: two facts with the same unit are two reports.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The known units of Model Runtime API 0.1.0.
pub const KNOWN_UNITS: [&str; 11] = [
    "input_token",
    "output_token",
    "cache_write_token",
    "cache_read_token",
    "reasoning_token",
    "image_count",
    "video_second",
    "audio_input_second",
    "audio_output_second",
    "tool_request",
    "request",
];

/// Longest accepted unit name.
pub const MAX_UNIT_CHARS: usize = 128;

/// A usage unit: one of [`KNOWN_UNITS`] or a namespaced custom unit such as `vendor.gpu_second`
/// (two or more dot-separated segments of ASCII letters, digits, `_` and `-`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
#[cfg_attr(feature = "schema", schemars(extend("pattern" = "^(input_token|output_token|cache_write_token|cache_read_token|reasoning_token|image_count|video_second|audio_input_second|audio_output_second|tool_request|request|[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)+)$", "maxLength" = 128)))]
pub struct UsageUnit(String);

/// The unit is neither known nor namespaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("usage unit is neither a known unit nor a namespaced custom unit")]
pub struct InvalidUnit;

/// Constructors of known units, each named as its unit.
macro_rules! known_units {
    ($($unit:ident),* $(,)?) => {
        $(
            #[doc = concat!("The `", stringify!($unit), "` unit.")]
            pub fn $unit() -> Self {
                Self(stringify!($unit).into())
            }
        )*
    };
}

impl UsageUnit {
    known_units!(
        input_token,
        output_token,
        cache_write_token,
        cache_read_token,
        reasoning_token,
        request,
    );

    /// Validates a unit name.
    pub fn parse(name: &str) -> Result<Self, InvalidUnit> {
        if KNOWN_UNITS.contains(&name) {
            return Ok(Self(name.to_owned()));
        }
        let segment_ok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        if name.len() <= MAX_UNIT_CHARS && name.contains('.') && name.split('.').all(segment_ok) {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidUnit)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UsageUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for UsageUnit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::parsed::deserialize(deserializer, "a usage unit", UsageUnit::parse)
    }
}

/// Whether the provider reported a fact or the runtime derived it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    Provider,
    Runtime,
}

/// One usage fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UsageFact {
    pub unit: UsageUnit,
    /// Finite and non-negative. Integral values are written without a fraction (`3`, not
    /// `3.0`), as JavaScript peers write them.
    #[cfg_attr(feature = "schema", schemars(range(min = 0)))]
    #[serde(serialize_with = "serialize_quantity")]
    pub quantity: f64,
    pub source: UsageSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
}

fn serialize_quantity<S: serde::Serializer>(q: &f64, s: S) -> Result<S::Ok, S::Error> {
    if q.fract() == 0.0 && q.abs() < 9_007_199_254_740_992.0 {
        s.serialize_i64(*q as i64)
    } else {
        s.serialize_f64(*q)
    }
}

/// The fact's quantity is negative or not finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("usage quantity must be finite and non-negative")]
pub struct InvalidQuantity;

impl UsageFact {
    /// A complete fact; fails when the quantity is negative, NaN or infinite.
    pub fn new(
        unit: UsageUnit,
        quantity: f64,
        source: UsageSource,
    ) -> Result<Self, InvalidQuantity> {
        let fact = Self {
            unit,
            quantity,
            source,
            complete: Some(true),
        };
        fact.check()?;
        Ok(fact)
    }

    /// The input and output token counts the runtime reckoned itself (source `runtime`), in
    /// that order: what the mock provider reports, one input token and one output token per
    /// chunk.
    pub fn runtime_tokens(input: f64, output: f64) -> Result<Vec<Self>, InvalidQuantity> {
        Ok(vec![
            Self::new(UsageUnit::input_token(), input, UsageSource::Runtime)?,
            Self::new(UsageUnit::output_token(), output, UsageSource::Runtime)?,
        ])
    }

    /// Checks the quantity (the unit is valid by construction).
    pub fn check(&self) -> Result<(), InvalidQuantity> {
        if self.quantity.is_finite() && self.quantity >= 0.0 {
            Ok(())
        } else {
            Err(InvalidQuantity)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_known_or_namespaced() {
        for ok in KNOWN_UNITS
            .iter()
            .copied()
            .chain(["vendor.gpu_second", "a.b.c", "fal.megapixel"])
        {
            assert!(UsageUnit::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "tokens", ".x", "x.", "a..b", "a b.c", &"a.".repeat(70)] {
            assert!(UsageUnit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantities_must_be_finite_and_non_negative() {
        assert!(UsageFact::new(UsageUnit::request(), 0.0, UsageSource::Runtime).is_ok());
        for q in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(UsageFact::new(UsageUnit::request(), q, UsageSource::Runtime).is_err());
        }
    }

    #[test]
    fn integral_quantities_serialize_without_fraction() {
        let f = UsageFact::new(UsageUnit::request(), 3.0, UsageSource::Runtime).unwrap();
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"unit":"request","quantity":3,"source":"runtime","complete":true}"#
        );
        let f = UsageFact::new(UsageUnit::request(), 0.25, UsageSource::Runtime).unwrap();
        assert!(serde_json::to_string(&f).unwrap().contains("0.25"));
    }

    #[test]
    fn deserializing_rejects_unknown_units() {
        let bad = serde_json::from_str::<UsageFact>(
            r#"{"unit":"tokens","quantity":1,"source":"provider"}"#,
        );
        assert!(bad.is_err());
    }
}
