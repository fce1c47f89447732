//! Streaming, forgiving field readers for Harbor's job `result.json` (docs/decisions.md, issue 21):
//! a field of the wrong type reads as absent, as `serde_json::Value`'s `as_u64`/`as_object` did, but
//! nothing that is not needed is kept. Arrays whose length is all that counts (`exception_stats`,
//! `reward_stats` trial ids) are counted element by element with [`IgnoredAny`], and whatever is
//! skipped is skipped the same way, so a 16 MiB file costs its bytes, not a tree of `Value`s.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Visitor methods for the kinds of value a reader does not want: each reads as `$out`, an array's
/// or object's contents skipped with [`IgnoredAny`] (walked, never kept).
macro_rules! skip {
    ($out:expr; $($kind:ident)*) => { $( skip!(@one $kind $out); )* };
    (@one bool $out:expr) => { fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok($out) } };
    (@one u64 $out:expr) => { fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok($out) } };
    (@one i64 $out:expr) => { fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok($out) } };
    (@one f64 $out:expr) => { fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok($out) } };
    (@one str $out:expr) => { fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok($out) } };
    (@one unit $out:expr) => { fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok($out) } };
    (@one seq $out:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($out)
        }
    };
    (@one map $out:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($out)
        }
    };
}

fn expecting_any(f: &mut fmt::Formatter) -> fmt::Result {
    f.write_str("any JSON value")
}

/// A non-negative integer, else `None`.
pub(crate) fn u64_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(u64::try_from(v).ok())
        }
        skip!(None; f64 bool str unit seq map);
    }
    d.deserialize_any(V)
}

/// Any number, else `None`.
pub(crate) fn f64_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<f64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        skip!(None; bool str unit seq map);
    }
    d.deserialize_any(V)
}

/// A string, else `None` (`null` included).
pub(crate) fn string_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        skip!(None; u64 i64 f64 bool unit seq map);
    }
    d.deserialize_any(V)
}

/// A struct read from an object, else `None`.
pub(crate) fn some_struct<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        skip!(None; u64 i64 f64 bool str unit seq);
    }
    d.deserialize_any(V(PhantomData))
}

/// The number of elements of an array (0 for anything else), none of them kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                expecting_any(f)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
            skip!(Count(0); u64 i64 f64 bool str unit map);
        }
        d.deserialize_any(V)
    }
}

/// A struct read from an object; anything else reads as its default. Its own fields decide how
/// forgiving they are.
pub(crate) fn struct_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    struct V<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map))
        }
        skip!(T::default(); u64 i64 f64 bool str unit seq);
    }
    d.deserialize_any(V(PhantomData))
}

/// A value read as [`struct_or_default`], for map values and array elements.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Forgiving<T>(pub T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Forgiving<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct_or_default(d).map(Forgiving)
    }
}

/// An object's entries (each value read by `V`'s own rules), or none for anything else.
pub(crate) fn map_or_empty<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Vis<V>(PhantomData<V>);
    impl<'de, V: Deserialize<'de>> Visitor<'de> for Vis<V> {
        type Value = BTreeMap<String, V>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                let value = map.next_value::<V>()?;
                out.insert(key, value);
            }
            Ok(out)
        }
        skip!(BTreeMap::new(); u64 i64 f64 bool str unit seq);
    }
    d.deserialize_any(Vis(PhantomData))
}

/// The first element of an array read as [`struct_or_default`] (the rest skipped), else the default.
pub(crate) fn first_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    struct Vis<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for Vis<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            expecting_any(f)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
            let first = seq.next_element::<Forgiving<T>>()?.map(|f| f.0).unwrap_or_default();
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
        skip!(T::default(); u64 i64 f64 bool str unit map);
    }
    d.deserialize_any(Vis(PhantomData))
}
