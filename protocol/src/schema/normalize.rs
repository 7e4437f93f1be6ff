//! Fix-ups applied to every generated document (see the parent module's docs): optional
//! properties never admit `null`, and Rust-specific `format`s are dropped.

use serde_json::{Value, json};

/// Formats schemars derives from Rust types that are not JSON Schema / OpenAPI formats.
const RUST_FORMATS: [&str; 14] = [
    "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32",
    "uint64", "uint128", "float", "double",
];

/// Applies the fix-ups described in the module docs to a whole document.
pub(super) fn normalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if matches!(map.get("format"), Some(Value::String(f)) if RUST_FORMATS.contains(&f.as_str()))
            {
                map.remove("format");
            }
            let required: Vec<String> = match map.get("required") {
                Some(Value::Array(names)) => names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            };
            if let Some(Value::Object(properties)) = map.get_mut("properties") {
                for (name, schema) in properties.iter_mut() {
                    if !required.contains(name) {
                        strip_null(schema);
                    }
                }
            }
            for child in map.values_mut() {
                normalize(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Removes `null` from a property schema: from a `type` list, from an `enum`, or an
/// `anyOf: [X, {"type": "null"}]` becomes `X` (keeping the property's own keywords).
fn strip_null(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    let new_type = match map.get("type") {
        Some(Value::Array(types)) if types.iter().any(|t| t == "null") => {
            let mut rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
            Some(if rest.len() == 1 {
                rest.remove(0)
            } else {
                Value::Array(rest)
            })
        }
        _ => None,
    };
    if let Some(t) = new_type {
        map.insert("type".into(), t);
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    let is_null = |s: &Value| *s == json!({ "type": "null" });
    let replacement = match map.get("anyOf") {
        Some(Value::Array(options)) if options.len() == 2 && options.iter().any(is_null) => {
            options.iter().find(|s| !is_null(s)).cloned()
        }
        _ => None,
    };
    if let Some(inner) = replacement {
        map.remove("anyOf");
        if let Value::Object(inner) = inner {
            for (k, v) in inner {
                map.entry(k).or_insert(v);
            }
        }
    }
}
