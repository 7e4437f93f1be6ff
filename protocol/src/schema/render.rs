//! Deterministic JSON and YAML text for the spec files: a fixed keyword order, then
//! alphabetical, whatever map type `serde_json` was built with, so regenerating `spec/` is
//! byte-stable.

use serde_json::{Map, Value};

/// Keys that come first, in this order; every other key follows alphabetically.
const KEY_ORDER: &[&str] = &[
    "openapi",
    "info",
    "jsonSchemaDialect",
    "servers",
    "tags",
    "paths",
    "components",
    "$schema",
    "$id",
    "$ref",
    "name",
    "in",
    "operationId",
    "title",
    "summary",
    "description",
    "version",
    "license",
    "identifier",
    "url",
    "type",
    "const",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "properties",
    "additionalProperties",
    "required",
    "allOf",
    "anyOf",
    "oneOf",
    "discriminator",
    "contentMediaType",
    "contentSchema",
    "parameters",
    "requestBody",
    "headers",
    "content",
    "schema",
    "responses",
    "get",
    "post",
    "schemas",
    "$defs",
];

fn sorted_entries(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(usize::MAX);
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by(|(a, _), (b, _)| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    entries
}

/// JSON string literal (never fails for a `str`).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

/// Pretty JSON: 2-space indentation, deterministic key order, trailing newline.
pub fn render_json(value: &Value) -> String {
    fn write(out: &mut String, value: &Value, indent: usize) {
        let pad = |n: usize| " ".repeat(n);
        match value {
            Value::Object(map) if !map.is_empty() => {
                out.push_str("{\n");
                let entries = sorted_entries(map);
                let last = entries.len() - 1;
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    out.push_str(&pad(indent + 2));
                    out.push_str(&quote(k));
                    out.push_str(": ");
                    write(out, v, indent + 2);
                    out.push_str(if i == last { "\n" } else { ",\n" });
                }
                out.push_str(&pad(indent));
                out.push('}');
            }
            Value::Array(items) if !items.is_empty() => {
                out.push_str("[\n");
                let last = items.len() - 1;
                for (i, v) in items.iter().enumerate() {
                    out.push_str(&pad(indent + 2));
                    write(out, v, indent + 2);
                    out.push_str(if i == last { "\n" } else { ",\n" });
                }
                out.push_str(&pad(indent));
                out.push(']');
            }
            Value::Object(_) => out.push_str("{}"),
            Value::Array(_) => out.push_str("[]"),
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(&mut out, value, 0);
    out.push('\n');
    out
}

/// Block-style YAML for a JSON value, with the same key order as [`render_json`]. Strings are
/// always double-quoted JSON literals (a subset of YAML double-quoted scalars); keys are plain
/// only when they cannot be read as anything but a string.
pub fn render_yaml(value: &Value) -> String {
    fn key(k: &str) -> String {
        let plain = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '-' | '.'))
            && !matches!(
                k.to_ascii_lowercase().as_str(),
                "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
            );
        if plain { k.to_owned() } else { quote(k) }
    }
    fn inline(value: &Value) -> Option<String> {
        match value {
            Value::Object(m) if m.is_empty() => Some("{}".into()),
            Value::Array(a) if a.is_empty() => Some("[]".into()),
            Value::Object(_) | Value::Array(_) => None,
            Value::String(s) => Some(quote(s)),
            scalar => Some(scalar.to_string()),
        }
    }
    fn lines(out: &mut Vec<String>, value: &Value, indent: usize) {
        let pad = " ".repeat(indent);
        match value {
            Value::Object(map) => {
                for (k, v) in sorted_entries(map) {
                    match inline(v) {
                        Some(s) => out.push(format!("{pad}{}: {s}", key(k))),
                        None => {
                            out.push(format!("{pad}{}:", key(k)));
                            lines(out, v, indent + 2);
                        }
                    }
                }
            }
            Value::Array(items) => {
                for v in items {
                    match inline(v) {
                        Some(s) => out.push(format!("{pad}- {s}")),
                        None => {
                            let start = out.len();
                            lines(out, v, indent + 2);
                            if let Some(first) = out.get_mut(start) {
                                // "{pad}  x" becomes "{pad}- x".
                                first.replace_range(indent..indent + 2, "- ");
                            }
                        }
                    }
                }
            }
            scalar => out.push(format!("{pad}{}", inline(scalar).unwrap_or_default())),
        }
    }
    let mut out = Vec::new();
    lines(&mut out, value, 0);
    let mut text = out.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn yaml_rendering_handles_nesting_and_quoting() {
        let v = json!({
            "200": { "a": [1, "x", { "b": true, "c": [] }, [null, "y"]] },
            "yes": "no",
            "plain_key": {},
            "/path/{id}": "line\nbreak"
        });
        let expected = concat!(
            "\"/path/{id}\": \"line\\nbreak\"\n",
            "\"200\":\n",
            "  a:\n",
            "    - 1\n",
            "    - \"x\"\n",
            "    - b: true\n",
            "      c: []\n",
            "    - - null\n",
            "      - \"y\"\n",
            "plain_key: {}\n",
            "\"yes\": \"no\"\n",
        );
        assert_eq!(render_yaml(&v), expected);
    }
}
