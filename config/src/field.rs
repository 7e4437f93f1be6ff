//! The strict JSON walker every section of the deployment file is parsed with: [`Fields`] is
//! one object of the file, checked against its closed set of field names, with typed getters.
//!
//! The one decision a reader must know: **errors name the field's path in the file, never its
//! value.** The file is walked by hand as a [`serde_json::Value`] rather than through serde
//! derives, because derive errors quote what they failed on and any value may be a secret.
//! Sections owned elsewhere (each provider adapter parses its own section in the worker) use
//! this walker too, so every error of the file reads the same.

use std::time::Duration;

use protocol::request::Modality;
use serde_json::{Map, Value};

use crate::base_url::{BaseUrl, UNSAFE_BASE_URL, UnsafeBaseUrl};
use crate::error::ConfigError;

/// Integers above this are not exact in JSON consumers such as the reference (JS safe integer).
pub(crate) use protocol::MAX_SAFE_INTEGER;
/// Longest id, model, ability and each entry of `abilities`, in Unicode scalar values.
const MAX_NAME_CHARS: usize = 256;
/// Longest unknown key shown in an error path; longer keys are cut.
const MAX_KEY_CHARS_SHOWN: usize = 64;
/// The ability of a provider that declares none.
pub const DEFAULT_ABILITY: &str = "text-generation";

/// One object of the file, checked for unknown fields, with typed getters that report the
/// field's path and never its value.
#[derive(Debug)]
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Fields<'a> {
    /// `path` is empty for the root.
    pub fn open(value: &'a Value, path: String, allowed: &[&str]) -> Result<Self, ConfigError> {
        let Some(map) = value.as_object() else {
            return Err(if path.is_empty() {
                ConfigError::invalid("configuration root".into(), "must be a JSON object")
            } else {
                ConfigError::invalid(path, "must be an object")
            });
        };
        if let Some(key) = map.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(ConfigError::UnknownField {
                path: child_path(&path, key),
            });
        }
        Ok(Self { map, path })
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    pub fn path_of(&self, key: &str) -> String {
        child_path(&self.path, key)
    }

    /// A 1–256 character string; `default` when absent, required when there is none.
    pub fn name(&self, key: &str, default: Option<&str>) -> Result<String, ConfigError> {
        match (self.get(key), default) {
            (Some(value), _) => name_value(value, self.path_of(key)),
            (None, Some(default)) => Ok(default.to_owned()),
            (None, None) => Err(ConfigError::required(self.path_of(key))),
        }
    }

    /// `abilities`: a non-empty array of names; default `["text-generation"]`.
    pub fn names(&self, key: &str) -> Result<Vec<String>, ConfigError> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Ok(vec![DEFAULT_ABILITY.to_owned()]),
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(index, item)| name_value(item, format!("{path}[{index}]")))
                .collect(),
            Some(_) => Err(ConfigError::invalid(
                path,
                "must be a non-empty array of strings",
            )),
        }
    }

    /// An array of strings, possibly empty.
    pub fn strings(&self, key: &str, default: &[String]) -> Result<Vec<String>, ConfigError> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(index, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(ConfigError::invalid(
                        format!("{path}[{index}]"),
                        "must be a string",
                    )),
                })
                .collect(),
            Some(_) => Err(ConfigError::invalid(path, "must be an array of strings")),
        }
    }

    pub fn boolean(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ConfigError::invalid(
                self.path_of(key),
                "must be true or false",
            )),
        }
    }

    /// An integer in `min..=max` (`max` at most `MAX_SAFE_INTEGER`, the JS safe integer).
    /// Integral floats such as `5.0` count, as in the request schema.
    pub fn integer(&self, key: &str, min: u64, max: u64, default: u64) -> Result<u64, ConfigError> {
        let Some(value) = self.get(key) else {
            return Ok(default);
        };
        let path = self.path_of(key);
        match as_integer(value) {
            Some(n) if n < min => Err(ConfigError::invalid(path, integer_requirement(min))),
            Some(n) if n > max => Err(ConfigError::invalid(path, format!("must be at most {max}"))),
            Some(n) => Ok(n),
            None => Err(ConfigError::invalid(path, integer_requirement(min))),
        }
    }

    pub fn size(&self, key: &str, min: u64, default: usize) -> Result<usize, ConfigError> {
        let max = u64::try_from(usize::MAX).map_or(MAX_SAFE_INTEGER, |m| m.min(MAX_SAFE_INTEGER));
        let default = u64::try_from(default).unwrap_or(max);
        let n = self.integer(key, min, max, default)?;
        usize::try_from(n)
            .map_err(|_| ConfigError::invalid(self.path_of(key), format!("must be at most {max}")))
    }

    /// A required environment variable name, `^[A-Z][A-Z0-9_]{1,127}$` [R 78].
    pub fn env_name(&self, key: &str) -> Result<String, ConfigError> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Err(ConfigError::required(path)),
            Some(Value::String(name)) if is_env_name(name) => Ok(name.clone()),
            Some(_) => Err(ConfigError::invalid(
                path,
                "must be an environment variable name: an uppercase letter, then 1 to 127 \
                 uppercase letters, digits or underscores",
            )),
        }
    }

    pub fn base_url(&self, key: &str, default: Option<&str>) -> Result<BaseUrl, ConfigError> {
        let path = self.path_of(key);
        let text = match (self.get(key), default) {
            (Some(Value::String(text)), _) => text.as_str(),
            (Some(_), _) => return Err(ConfigError::invalid(path, "must be a string")),
            (None, Some(default)) => default,
            (None, None) => return Err(ConfigError::required(path)),
        };
        BaseUrl::parse(text).map_err(|UnsafeBaseUrl| ConfigError::invalid(path, UNSAFE_BASE_URL))
    }

    /// A non-empty array of distinct modalities drawn from `supported`.
    pub fn modalities(
        &self,
        key: &str,
        default: &[Modality],
        supported: &[Modality],
    ) -> Result<Vec<Modality>, ConfigError> {
        let path = self.path_of(key);
        let items = match self.get(key) {
            None => return Ok(default.to_vec()),
            Some(Value::Array(items)) if !items.is_empty() => items,
            Some(_) => {
                return Err(ConfigError::invalid(
                    path,
                    "must be a non-empty array of modalities",
                ));
            }
        };
        let mut modalities = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{index}]");
            let modality = item
                .as_str()
                .and_then(|name| {
                    supported
                        .iter()
                        .copied()
                        .find(|m| modality_name(*m) == name)
                })
                .ok_or_else(|| {
                    let names: Vec<&str> = supported.iter().map(|m| modality_name(*m)).collect();
                    ConfigError::invalid(
                        item_path.clone(),
                        format!("must be one of {}", names.join(", ")),
                    )
                })?;
            if modalities.contains(&modality) {
                return Err(ConfigError::invalid(
                    item_path,
                    "repeats an earlier modality",
                ));
            }
            modalities.push(modality);
        }
        Ok(modalities)
    }
}

fn name_value(value: &Value, path: String) -> Result<String, ConfigError> {
    match value {
        Value::String(s) if (1..=MAX_NAME_CHARS).contains(&s.chars().count()) => Ok(s.clone()),
        _ => Err(ConfigError::invalid(
            path,
            format!("must be a string of 1 to {MAX_NAME_CHARS} characters"),
        )),
    }
}

fn as_integer(value: &Value) -> Option<u64> {
    let Value::Number(n) = value else {
        return None;
    };
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    protocol::number::safe_integer(n.as_f64()?)
}

fn integer_requirement(min: u64) -> String {
    match min {
        0 => "must be a non-negative integer".into(),
        1 => "must be a positive integer".into(),
        min => format!("must be an integer of at least {min}"),
    }
}

pub(crate) fn is_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (2..=128).contains(&bytes.len())
        && bytes[0].is_ascii_uppercase()
        && bytes[1..]
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
}

fn modality_name(modality: Modality) -> &'static str {
    match modality {
        Modality::Text => "text",
        Modality::Image => "image",
        Modality::Audio => "audio",
        Modality::Video => "video",
        Modality::File => "file",
        Modality::Json => "json",
    }
}

pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `parent.key`, or `parent["..."]` (escaped, cut to 64 characters) for keys that are not
/// plain identifiers, so an error stays one printable line whatever the file's keys contain.
pub(crate) fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.len() <= MAX_KEY_CHARS_SHOWN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        if parent.is_empty() {
            key.to_owned()
        } else {
            format!("{parent}.{key}")
        }
    } else {
        let mut escaped: String = key
            .chars()
            .take(MAX_KEY_CHARS_SHOWN)
            .flat_map(char::escape_default)
            .collect();
        if key.chars().count() > MAX_KEY_CHARS_SHOWN {
            escaped.push_str("...");
        }
        format!("{parent}[\"{escaped}\"]")
    }
}
