//! Caller-defined JSON kept as the caller's text.
//!
//! `extensions` values and `json` input parts are opaque to the runtime: only an adapter ever
//! looks inside them. Parsed into `serde_json::Value` trees they cost up to ~100× their size in
//! memory (a 1 MiB body of `[{"a":0},…]` is ~140 000 maps), so they are kept as [`RawJson`]
//! (the validated text, ~1× its size) and read on demand, in place:
//!
//! - [`member`] finds one member of an object without building anything;
//! - [`compact`] writes a value exactly as `serde_json::Value::to_string` would (keys sorted,
//!   duplicates resolved to the last, no whitespace), which is what adapters send providers;
//! - [`write_canonical`] streams the canonical form the idempotency fingerprint hashes
//!   ([`crate::fingerprint`]);
//! - [`object_with`] builds a provider body from a caller object and runtime-owned fields.
//!
//! The writers hold, per object being written, one entry per member (key and a borrowed slice of
//! its value), never a tree; arrays are streamed. Every function here reads text that was
//! validated when the [`RawJson`] was made (well-formed, nesting below [`MAX_DEPTH`]).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
pub use serde_json::value::RawValue;

/// Deepest nesting of arrays and objects in one JSON document, as `serde_json` enforces it
/// (127 levels: its recursion limit is 128).
pub const MAX_DEPTH: usize = 127;

/// A JSON value kept as its text: well-formed, nested at most [`MAX_DEPTH`] deep, exactly as
/// the caller wrote it (whitespace, key order and duplicate keys included; readers resolve a
/// duplicate key to its last value, as `JSON.parse` does).
///
/// Serializes as that text. Equality is equality of the text.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Parses and validates `text` (one JSON value, surrounding whitespace allowed).
    pub fn from_text(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The text, as received.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The value as a borrowed raw value (for [`member`] and friends).
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    /// Parses the value into `T` (an adapter that needs a part of it parses only that part:
    /// see [`member`]).
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The compact text `serde_json::Value::to_string` would give (see [`compact`]).
    pub fn compact(&self) -> String {
        compact(&self.0)
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Caller content: only its size is shown.
        write!(f, "RawJson({} bytes)", self.0.get().len())
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl From<&RawValue> for RawJson {
    fn from(raw: &RawValue) -> Self {
        RawJson(raw.to_owned())
    }
}

impl From<&serde_json::Value> for RawJson {
    fn from(value: &serde_json::Value) -> Self {
        // A `Value` is always well-formed and serializes to valid JSON.
        RawJson(serde_json::value::to_raw_value(value).unwrap_or_else(|_| null()))
    }
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".into()).unwrap_or_default()
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        // `RawValue` skips nested values without a depth limit; enforce serde_json's.
        check_depth(raw.get()).map_err(de::Error::custom)?;
        Ok(RawJson(raw))
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for RawJson {
    fn inline_schema() -> bool {
        <serde_json::Value as schemars::JsonSchema>::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        <serde_json::Value as schemars::JsonSchema>::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        <serde_json::Value as schemars::JsonSchema>::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <serde_json::Value as schemars::JsonSchema>::json_schema(generator)
    }
}

/// `body` with every lone UTF-16 surrogate escape replaced by `\ufffd` (U+FFFD, the
/// replacement character). JavaScript's `JSON.stringify` writes a string cut in the middle of
/// a character (an emoji's first half) as such an escape (`"\ud83d"`), and `JSON.parse`, as the
/// reference reads bodies, keeps it; a Rust string cannot hold it, and serde_json refuses the
/// whole body. Surrogate pairs and every other escape are left as written, and the replacement
/// is as long as the escape it replaces, so nothing else moves. Borrowed when there is nothing
/// to replace (the usual case). Backslashes occur only inside strings in valid JSON; in
/// anything else the parser that reads the result refuses it as it would have.
pub fn replace_lone_surrogates(body: &[u8]) -> Cow<'_, [u8]> {
    /// The code unit of the `\uXXXX` escape at `at` (its backslash), if there is one.
    fn unit(body: &[u8], at: usize) -> Option<u16> {
        let hex = body.get(at..at + 6)?.strip_prefix(b"\\u")?;
        if !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    }
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    // Every request body passes here: the search for a backslash is memchr's.
    while let Some(found) = body.get(i..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        i += found;
        let lone = match unit(body, i) {
            // Another escape (`\\` included, so its second backslash is not read as one).
            None => {
                i += 2;
                continue;
            }
            // A high surrogate is paired when a low one's escape follows at once.
            Some(0xD800..=0xDBFF) => match unit(body, i + 6) {
                Some(0xDC00..=0xDFFF) => {
                    i += 12;
                    continue;
                }
                _ => true,
            },
            Some(0xDC00..=0xDFFF) => true,
            Some(_) => false,
        };
        if lone {
            out.get_or_insert_with(|| body.to_vec())[i..i + 6].copy_from_slice(b"\\ufffd");
        }
        i += 6;
    }
    match out {
        Some(replaced) => Cow::Owned(replaced),
        None => Cow::Borrowed(body),
    }
}

/// Checks that `text` is one well-formed JSON value nested at most [`MAX_DEPTH`] deep, with
/// exactly serde_json's verdicts (syntax, numbers out of range, escapes, trailing characters,
/// recursion limit), allocating nothing but what unescaping a string needs.
pub fn check_syntax(bytes: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<Syntax>(bytes).map(|_| ())
}

fn check_depth(text: &str) -> Result<(), serde_json::Error> {
    check_syntax(text.as_bytes())
}

/// Deserializes any JSON value through `deserialize_any` (so serde_json counts its depth, as it
/// does for `Value`), keeping nothing.
struct Syntax;

impl<'de> Deserialize<'de> for Syntax {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SyntaxVisitor)
    }
}

struct SyntaxVisitor;

impl<'de> Visitor<'de> for SyntaxVisitor {
    type Value = Syntax;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Syntax, E> {
        Ok(Syntax)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Syntax, E> {
        Ok(Syntax)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Syntax, E> {
        Ok(Syntax)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Syntax, E> {
        Ok(Syntax)
    }
    fn visit_str<E>(self, _: &str) -> Result<Syntax, E> {
        Ok(Syntax)
    }
    fn visit_unit<E>(self) -> Result<Syntax, E> {
        Ok(Syntax)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Syntax, A::Error> {
        while seq.next_element::<Syntax>()?.is_some() {}
        Ok(Syntax)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Syntax, A::Error> {
        while map.next_key::<Syntax>()?.is_some() {
            map.next_value::<Syntax>()?;
        }
        Ok(Syntax)
    }
}

/// An object key, borrowed from the text unless it has escapes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key<'a>(pub(crate) Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

fn starts_object(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

/// Whether `raw` is a JSON object.
pub fn is_object(raw: &RawValue) -> bool {
    starts_object(raw.get())
}

/// `object`'s member `key` (its last value when the key repeats); `Err(NotAnObject)` when
/// `object` is not a JSON object. Builds nothing: a borrowed slice of the text.
pub fn member<'a>(object: &'a RawValue, key: &str) -> Result<Option<&'a RawValue>, NotAnObject> {
    struct Find<'k>(&'k str);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<Key<'de>>()? {
                let value = map.next_value::<&'de RawValue>()?;
                if key.0 == self.0 {
                    found = Some(value);
                }
            }
            Ok(found)
        }
    }
    if !is_object(object) {
        return Err(NotAnObject);
    }
    serde_json::Deserializer::from_str(object.get())
        .deserialize_map(Find(key))
        .map_err(|_| NotAnObject)
}

/// A JSON value that should be an object is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnObject;

/// Where the writers put text.
trait Sink {
    fn put(&mut self, text: &str);
}

impl Sink for String {
    fn put(&mut self, text: &str) {
        self.push_str(text);
    }
}

/// How numbers are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// As `serde_json::Value` prints them.
    Compact,
    /// Integral floats below 2^53 without a fraction (`5.0` is `5`): the fingerprint's form.
    Canonical,
}

/// `raw` as `serde_json::Value::to_string` would write it: no whitespace, object keys sorted
/// by code point, each once with its last value, numbers as `serde_json` prints them.
pub fn compact(raw: &RawValue) -> String {
    let mut out = String::with_capacity(raw.get().len());
    // The text was validated when it was made, so writing cannot fail; if it did, the value
    // would be written as `null` rather than as a fragment.
    if write(raw.get(), Form::Compact, &mut out).is_err() {
        return "null".into();
    }
    out
}

/// Streams the canonical JSON of `text` (see [`crate::fingerprint`]) into `put`.
pub fn write_canonical(text: &str, put: &mut dyn FnMut(&str)) -> Result<(), serde_json::Error> {
    struct FnSink<'a>(&'a mut dyn FnMut(&str));
    impl Sink for FnSink<'_> {
        fn put(&mut self, text: &str) {
            (self.0)(text);
        }
    }
    write(text, Form::Canonical, &mut FnSink(put))
}

/// A provider body: the members of `base` (when it is an object) except those named in
/// `drop`, then `owned` (key and JSON text) over them, written by [`compact`] rules. The same
/// text as inserting `owned` into a `serde_json::Map` copy of `base` and printing it.
pub fn object_with(
    base: Option<&RawValue>,
    drop: &[&str],
    owned: &[(&str, &str)],
) -> Result<String, serde_json::Error> {
    /// Copies the members of an object, but for `skip`, into `out` (each followed by a comma).
    struct CopyMembers<'a> {
        out: &'a mut String,
        skip: &'a dyn Fn(&str) -> bool,
    }
    impl<'de> Visitor<'de> for CopyMembers<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<&'de RawValue>()? {
                let value = map.next_value::<&'de RawValue>()?;
                let name = key_text(key.get()).map_err(de::Error::custom)?;
                if !(self.skip)(&name) {
                    self.out.push_str(key.get());
                    self.out.push(':');
                    self.out.push_str(value.get());
                    self.out.push(',');
                }
            }
            Ok(())
        }
    }
    let mut merged = String::from("{");
    if let Some(base) = base.filter(|b| is_object(b)) {
        let skip = |name: &str| drop.contains(&name) || owned.iter().any(|(k, _)| *k == name);
        serde_json::Deserializer::from_str(base.get()).deserialize_map(CopyMembers {
            out: &mut merged,
            skip: &skip,
        })?;
    }
    for (key, value) in owned {
        // A key is a plain string: serializing it cannot fail.
        merged.push_str(&serde_json::to_string(key).unwrap_or_default());
        merged.push(':');
        merged.push_str(value);
        merged.push(',');
    }
    if merged.ends_with(',') {
        merged.pop();
    }
    merged.push('}');
    let mut out = String::with_capacity(merged.len());
    write(&merged, Form::Compact, &mut out)?;
    Ok(out)
}

/// The key a raw JSON string (quotes included) stands for: borrowed unless it has escapes.
fn key_text(raw: &str) -> Result<Cow<'_, str>, serde_json::Error> {
    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => Ok(Cow::Borrowed(inner)),
        _ => serde_json::from_str::<String>(raw).map(Cow::Owned),
    }
}

fn write(text: &str, form: Form, out: &mut dyn Sink) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    Writer {
        text,
        form,
        out,
        comma: false,
    }
    .deserialize(&mut de)?;
    de.end()
}

/// Writes one value (preceded by a comma when `comma`) read from `text`.
struct Writer<'t, 'o> {
    /// The whole text the deserializer reads: members are remembered as offsets into it.
    text: &'t str,
    form: Form,
    out: &'o mut dyn Sink,
    comma: bool,
}

impl Writer<'_, '_> {
    fn start(&mut self) {
        if self.comma {
            self.out.put(",");
        }
    }

    fn string(&mut self, s: &str) {
        self.start();
        // Escaping a string cannot fail.
        self.out.put(&serde_json::to_string(s).unwrap_or_default());
    }

    fn number(&mut self, n: serde_json::Number) {
        self.start();
        self.out.put(&n.to_string());
    }

    /// Offset of `part`, a slice of `self.text`.
    fn offset(&self, part: &str) -> Result<u32, serde_json::Error> {
        (part.as_ptr() as usize)
            .checked_sub(self.text.as_ptr() as usize)
            .filter(|o| *o <= self.text.len())
            .and_then(|o| u32::try_from(o).ok())
            .ok_or_else(|| de::Error::custom("member outside the text"))
    }
}

/// The key whose raw string (quotes included) starts at `at` in `text`.
fn key_at(text: &str, at: u32) -> Result<Cow<'_, str>, serde_json::Error> {
    let rest = text.get(at as usize..).unwrap_or_default();
    // The first quote after the opening one closes the key unless a backslash comes first.
    let after = rest.get(1..).unwrap_or_default();
    let raw = match after.find(['"', '\\']) {
        Some(end) if after.as_bytes().get(end) == Some(&b'"') => {
            rest.get(..end + 2).unwrap_or_default()
        }
        _ => <&RawValue>::deserialize(&mut serde_json::Deserializer::from_str(rest))?.get(),
    };
    key_text(raw)
}

impl<'de> DeserializeSeed<'de> for Writer<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Writer<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(mut self, v: bool) -> Result<(), E> {
        self.start();
        self.out.put(if v { "true" } else { "false" });
        Ok(())
    }

    fn visit_unit<E>(mut self) -> Result<(), E> {
        self.start();
        self.out.put("null");
        Ok(())
    }

    fn visit_u64<E>(mut self, v: u64) -> Result<(), E> {
        self.number(v.into());
        Ok(())
    }

    fn visit_i64<E>(mut self, v: i64) -> Result<(), E> {
        self.number(v.into());
        Ok(())
    }

    fn visit_f64<E>(mut self, v: f64) -> Result<(), E> {
        if self.form == Form::Canonical && v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0 {
            // Exact: a whole number below 2^53.
            self.number((v as i64).into());
        } else {
            match serde_json::Number::from_f64(v) {
                Some(n) => self.number(n),
                // The parser never yields a non-finite number.
                None => {
                    self.start();
                    self.out.put("null");
                }
            }
        }
        Ok(())
    }

    fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
        self.string(v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.start();
        self.out.put("[");
        let mut comma = false;
        while seq
            .next_element_seed(Writer {
                text: self.text,
                form: self.form,
                out: &mut *self.out,
                comma,
            })?
            .is_some()
        {
            comma = true;
        }
        self.out.put("]");
        Ok(())
    }

    /// Members are written sorted by key, each key once with its last value, so they are
    /// collected first: 8 bytes each (offsets of the key and the value in the text).
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.start();
        let mut members: Vec<(u32, u32)> = Vec::new();
        while let Some(key) = map.next_key::<&'de RawValue>()? {
            let value = map.next_value::<&'de RawValue>()?;
            let at = |part: &str| self.offset(part).map_err(de::Error::custom);
            members.push((at(key.get())?, at(value.get())?));
        }
        // Keys were read once already; reading them again cannot fail.
        let text = self.text;
        let key = |at: u32| key_at(text, at).unwrap_or_default();
        // Stable: equal keys keep text order, so the last of each run is the value that wins.
        members.sort_by(|a, b| key(a.0).cmp(&key(b.0)));
        let mut last: Option<(u32, u32)> = None;
        let mut first = true;
        self.out.put("{");
        for member in members.into_iter().map(Some).chain([None]) {
            if let (Some(prev), Some(next)) = (last, member)
                && key(prev.0) == key(next.0)
            {
                last = member;
                continue;
            }
            if let Some((k, v)) = last {
                if !first {
                    self.out.put(",");
                }
                first = false;
                let name = key_at(text, k).map_err(de::Error::custom)?;
                self.out
                    .put(&serde_json::to_string(name.as_ref()).unwrap_or_default());
                self.out.put(":");
                let rest = text.get(v as usize..).unwrap_or_default();
                Writer {
                    text: rest,
                    form: self.form,
                    out: &mut *self.out,
                    comma: false,
                }
                .deserialize(&mut serde_json::Deserializer::from_str(rest))
                .map_err(de::Error::custom)?;
            }
            last = member;
        }
        self.out.put("}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn raw(text: &str) -> Box<RawValue> {
        serde_json::from_str(text).unwrap()
    }

    const SAMPLES: &[&str] = &[
        "null",
        " true ",
        r#"{"b":1,"a":[1.0,2.5,-0,1e2,1E300,18446744073709551616,-9007199254740993,4.0e0]}"#,
        r#"{ "z" : null , "y" : true , "z" : false, "\u0061": {"k\u00e9y":1,"kéy":2} }"#,
        r#""caf\u00e9 \ud83d\ude00 \/ \" \\ \u0001 é""#,
        r#"[[[[{"deep":[{"deeper":{"x":[1,2,{"y":"z"}]}}]}]]]]"#,
        r#"[{"a":0},{"a":0},[0],[],{},"",null,true,false,-1.5e-10,0.1,1.5e-7,123456789012345678]"#,
    ];

    #[test]
    fn lone_surrogate_escapes_become_replacement_characters_and_nothing_else_changes() {
        for (input, expected) in [
            (r#""\ud83d""#, r#""\ufffd""#),
            (r#""a\ud83d""#, r#""a\ufffd""#),
            (r#""\ude00x""#, r#""\ufffdx""#),
            (r#""\ud83d\u0041""#, r#""\ufffd\u0041""#),
            (r#""\ud83d\ud83d\ude00""#, r#""\ufffd\ud83d\ude00""#),
            (r#"{"\udc00":["\uD83D"]}"#, r#"{"\ufffd":["\ufffd"]}"#),
        ] {
            let replaced = replace_lone_surrogates(input.as_bytes());
            assert_eq!(std::str::from_utf8(&replaced).unwrap(), expected, "{input}");
            assert!(
                serde_json::from_slice::<Value>(&replaced).is_ok(),
                "{input}"
            );
        }
        // Pairs, other escapes, an escaped backslash before a `u`, and text without escapes
        // are borrowed as they are.
        for kept in [
            r#""\ud83d\ude00""#,
            r#""\\ud83d""#,
            r#""\\\ud83d\ude00""#,
            r#""\n\t\u00e9""#,
            "\"plain\"",
            r#""\u""#,
            r#""\ud8""#,
            "\\",
            "",
        ] {
            assert!(
                matches!(replace_lone_surrogates(kept.as_bytes()), Cow::Borrowed(_)),
                "{kept}"
            );
        }
        for sample in SAMPLES {
            assert!(matches!(
                replace_lone_surrogates(sample.as_bytes()),
                Cow::Borrowed(_)
            ));
        }
    }

    #[test]
    fn compact_is_what_a_value_prints() {
        for text in SAMPLES {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(compact(&raw(text)), value.to_string(), "{text}");
        }
    }

    #[test]
    fn canonical_is_the_canonical_json_of_the_value() {
        for text in SAMPLES {
            let value: Value = serde_json::from_str(text).unwrap();
            let mut out = String::new();
            write_canonical(text, &mut |s| out.push_str(s)).unwrap();
            assert_eq!(out, crate::fingerprint::canonical_json(&value), "{text}");
        }
    }

    #[test]
    fn member_finds_the_last_value_of_a_key_and_refuses_non_objects() {
        let object = raw(r#"{"a":1,"b":{"c":2},"a":[3]}"#);
        assert_eq!(
            member(&object, "a").unwrap().map(RawValue::get),
            Some("[3]")
        );
        assert_eq!(
            member(&object, "b").unwrap().map(RawValue::get),
            Some(r#"{"c":2}"#)
        );
        assert!(matches!(member(&object, "c"), Ok(None)));
        for not_object in ["[]", "1", "\"{\"", "null"] {
            assert!(matches!(member(&raw(not_object), "a"), Err(NotAnObject)));
        }
    }

    #[test]
    fn object_with_is_a_map_copy_with_owned_fields_over_it() {
        let base = raw(r#"{"temperature":0.5,"model":"evil","z":{"b":1,"a":2},"drop":1}"#);
        let body = object_with(
            Some(&base),
            &["drop"],
            &[("model", r#""m""#), ("stream", "true")],
        )
        .unwrap();
        assert_eq!(
            body,
            r#"{"model":"m","stream":true,"temperature":0.5,"z":{"a":2,"b":1}}"#
        );
        assert_eq!(
            object_with(Some(&raw("[1]")), &[], &[("a", "1")]).unwrap(),
            r#"{"a":1}"#
        );
        assert_eq!(object_with(None, &[], &[]).unwrap(), "{}");
    }

    #[test]
    fn raw_json_keeps_the_text_and_refuses_what_a_value_refuses() {
        let text = r#"{ "b" : 1, "a" : 2, "b" : 3 }"#;
        let raw = RawJson::from_text(text).unwrap();
        assert_eq!(raw.get(), text.trim());
        assert_eq!(serde_json::to_string(&raw).unwrap(), text.trim());
        assert_eq!(raw.compact(), r#"{"a":2,"b":3}"#);
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(RawJson::from_text(&deep(MAX_DEPTH)).is_ok());
        assert!(RawJson::from_text(&deep(MAX_DEPTH + 1)).is_err());
        assert!(serde_json::from_str::<Value>(&deep(MAX_DEPTH)).is_ok());
        assert!(serde_json::from_str::<Value>(&deep(MAX_DEPTH + 1)).is_err());
        assert!(RawJson::from_text("[1,]").is_err());
        assert!(RawJson::from_text("1e400").is_err());
        assert!(format!("{raw:?}").contains("bytes"));
    }

    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            (-1e20f64..1e20).prop_map(|f| format!("{f:e}")),
            (-1e6f64..1e6).prop_map(|f| format!("{f}")),
            prop_oneof![Just("1.0"), Just("-0"), Just("2E3"), Just("0.000001")]
                .prop_map(str::to_string),
            "[a-c\\\\\"é\u{1F600}]{0,4}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just(r#""\u00e9\n""#.to_string()),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6)
                    .prop_map(|items| format!("[ {} ]", items.join(" , "))),
                prop::collection::vec(("[a-d]{0,2}", inner), 0..6).prop_map(|entries| {
                    let members: Vec<String> = entries
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\" :{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn writers_agree_with_value_on_random_json(text in json_text()) {
            let value: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(compact(&raw(&text)), value.to_string());
            let mut out = String::new();
            write_canonical(&text, &mut |s| out.push_str(s)).unwrap();
            prop_assert_eq!(out, crate::fingerprint::canonical_json(&value));
        }
    }
}
