//! Deserializing a value that is parsed from a string, without copying the string.
//!
//! `Cow<'de, str>`'s own `Deserialize` always builds an owned `String` (serde cannot know
//! whether a borrow will outlive the input), so a type read through it paid an allocation per
//! value: on every event's `time`, for every event a gateway streams. [`deserialize`] hands
//! the parser whatever the format has, borrowed or transient.

use std::fmt::Display;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Reads a string and parses it with `parse`; its error is reported as the format's.
pub(crate) fn deserialize<'de, D, T, E>(
    deserializer: D,
    expecting: &'static str,
    parse: fn(&str) -> Result<T, E>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: Display,
{
    deserializer.deserialize_str(Parsed { expecting, parse })
}

struct Parsed<T, E> {
    expecting: &'static str,
    parse: fn(&str) -> Result<T, E>,
}

impl<T, E: Display> Visitor<'_> for Parsed<T, E> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<Er: de::Error>(self, s: &str) -> Result<T, Er> {
        (self.parse)(s).map_err(Er::custom)
    }
}

#[cfg(test)]
mod tests {
    use crate::time::Timestamp;

    #[test]
    fn parses_borrowed_and_escaped_strings_and_refuses_other_types() {
        let plain: Timestamp = serde_json::from_str("\"2026-01-01T00:00:00.000Z\"").unwrap();
        // An escape makes the string transient (unescaped into a scratch buffer).
        let escaped: Timestamp =
            serde_json::from_str("\"2026-01-01T00:00:00.000\\u005a\"").unwrap();
        assert_eq!(plain, escaped);
        let from_value: Timestamp =
            serde_json::from_value(serde_json::json!("2026-01-01T00:00:00.000Z")).unwrap();
        assert_eq!(plain, from_value);
        let error = serde_json::from_str::<Timestamp>("12").unwrap_err();
        assert!(
            error.to_string().contains("expected a timestamp"),
            "{error}"
        );
        assert!(serde_json::from_str::<Timestamp>("\"yesterday\"").is_err());
    }
}
