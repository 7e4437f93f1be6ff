//! The request body as the reference reads it, without building a JSON tree.
//!
//! The reference parses a body with `JSON.parse` (a repeated key keeps its last value) and then
//! validates it with a JSON Schema validator (which never turns an array into a struct nor a
//! single-key object into an enum). [`Strict`] gives serde's derived deserializers that view of
//! a validated body while reading it in place:
//!
//! - a struct or map is read from an object only: its members are collected first (a key and a
//!   borrowed slice of its value, each key once, the last value winning), at most
//!   [`MAX_MEMBERS`] of them, since no object the typed request reads may have more;
//! - a sequence is read from an array only, element by element (nothing is collected);
//! - an enum is read from a string only;
//! - everything else (and opaque [`crate::json::RawJson`] values) is read from the text as is.
//!
//! Nothing here is allocated per byte of the body: opaque values are copied once into their
//! `RawJson`, strings into their `String`s, and that is all the request holds.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::MapDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, SeqAccess, Visitor};
use serde_json::Error;
use serde_json::value::RawValue;

use crate::json::Key;
use crate::request::MAX_PROPERTIES;

/// Most distinct members of any object the typed request reads (`metadata` and `extensions`
/// allow 64 properties; the structs have fewer fields).
pub const MAX_MEMBERS: usize = MAX_PROPERTIES;

/// A deserializer over one validated JSON value (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Strict<'de>(pub &'de RawValue);

impl<'de> Strict<'de> {
    fn first(&self) -> u8 {
        self.0
            .get()
            .trim_start()
            .as_bytes()
            .first()
            .copied()
            .unwrap_or(b' ')
    }

    fn expect(&self, byte: u8, what: &'static str) -> Result<(), Error> {
        if self.first() == byte {
            Ok(())
        } else {
            Err(de::Error::invalid_type(
                de::Unexpected::Other("JSON value"),
                &what,
            ))
        }
    }

    /// The object's members, each key once with its last value, in first-seen order.
    fn members(self) -> Result<Vec<(Cow<'de, str>, Strict<'de>)>, Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Vec<(Cow<'de, str>, Strict<'de>)>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Self::Value = Vec::new();
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    let value = Strict(map.next_value::<&'de RawValue>()?);
                    if let Some(slot) = out.iter_mut().find(|(k, _)| *k == key) {
                        slot.1 = value;
                    } else if out.len() == MAX_MEMBERS {
                        return Err(de::Error::custom("too many properties"));
                    } else {
                        out.push((key, value));
                    }
                }
                Ok(out)
            }
        }
        serde_json::Deserializer::from_str(self.0.get()).deserialize_map(Members)
    }
}

impl<'de> IntoDeserializer<'de, Error> for Strict<'de> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

/// Hands each element of an array to the target as a [`Strict`] value.
struct Elements<A>(A);

impl<'de, A: SeqAccess<'de, Error = Error>> SeqAccess<'de> for Elements<A> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.0.next_element::<&'de RawValue>()? {
            Some(raw) => seed.deserialize(Strict(raw)).map(Some),
            None => Ok(None),
        }
    }
}

/// Passes an array on to `V` as [`Elements`].
struct ArrayOf<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for ArrayOf<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        // `A` is serde_json's own sequence access, so no error changes its kind here.
        self.0
            .visit_seq(Elements(ErrorAs(seq)))
            .map_err(de::Error::custom)
    }
}

/// A sequence access whose errors are reported as serde_json errors.
struct ErrorAs<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for ErrorAs<A> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0.next_element_seed(seed).map_err(de::Error::custom)
    }
}

/// Methods that hand the value to `serde_json` as is, with their arguments before the visitor.
macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*))*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Error> {
                self.0.$method($($arg,)* visitor)
            }
        )*
    };
}

/// Methods that ignore their arguments before the visitor and read the value as `$as` does.
macro_rules! read_as {
    ($($method:ident($($arg:ty),*) => $as:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $(_: $arg,)* visitor: V) -> Result<V::Value, Error> {
                self.$as(visitor)
            }
        )*
    };
}

impl<'de> Deserializer<'de> for Strict<'de> {
    type Error = Error;

    forward! {
        deserialize_any() deserialize_bool() deserialize_i8() deserialize_i16() deserialize_i32()
        deserialize_i64() deserialize_i128() deserialize_u8() deserialize_u16() deserialize_u32()
        deserialize_u64() deserialize_u128() deserialize_f32() deserialize_f64() deserialize_char()
        deserialize_str() deserialize_string() deserialize_bytes() deserialize_byte_buf()
        deserialize_option() deserialize_unit() deserialize_identifier() deserialize_ignored_any()
        deserialize_unit_struct(name: &'static str)
        // Opaque values (`RawJson`) take the text as is.
        deserialize_newtype_struct(name: &'static str)
    }

    read_as! {
        deserialize_tuple(usize) => deserialize_seq
        deserialize_tuple_struct(&'static str, usize) => deserialize_seq
        deserialize_struct(&'static str, &'static [&'static str]) => deserialize_map
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(b'[', "an array")?;
        serde_json::Deserializer::from_str(self.0.get()).deserialize_seq(ArrayOf(visitor))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(b'{', "an object")?;
        let mut map = MapDeserializer::new(self.members()?.into_iter());
        let value = visitor.visit_map(&mut map)?;
        map.end()?;
        Ok(value)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.expect(b'"', "a string")?;
        self.0.deserialize_enum(name, variants, visitor)
    }
}
