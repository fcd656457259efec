//! Byte strings on the wire as byte strings.
//!
//! serde sees a `Vec<u8>` as a sequence of numbers, and postcard wrote and read it one element
//! at a time: a call and a capacity check per byte. A 100 MB program source crossed at about
//! 70 MB/s in a release build (1.5 s to create the program, 0.7 s for each `clGetProgramInfo`
//! reading it back) and ten times slower in a debug one, past the 10 s deadline of the read-back.
//! Fields marked `#[serde(with = "crate::bulk")]` travel as serde's bytes instead: postcard
//! encodes those exactly as it encoded the sequence (a varint length, then the bytes), so the
//! protocol is unchanged, but each is written and read with one copy. A format that sends such a
//! field as a sequence of numbers is still understood.

use serde::de::{DeserializeOwned, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::wire::RawBytes;

/// A field type made of byte strings, which `serialize` and `deserialize` carry as bytes.
pub trait Bulk: Sized {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

/// `#[serde(with = "crate::bulk")]`'s serializer.
pub fn serialize<T: Bulk, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    value.write(s)
}

/// `#[serde(with = "crate::bulk")]`'s deserializer.
pub fn deserialize<'de, T: Bulk, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    T::read(d)
}

/// An owned byte string, deserialized from bytes (or from a sequence of numbers).
struct ByteString(Vec<u8>);

impl<'de> Deserialize<'de> for ByteString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(ByteStringVisitor).map(ByteString)
    }
}

struct ByteStringVisitor;

impl<'de> Visitor<'de> for ByteStringVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        // The length is the peer's word: grow as elements really come, not by its claim.
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(b) = seq.next_element()? {
            v.push(b);
        }
        Ok(v)
    }
}

impl Bulk for Vec<u8> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self)
    }
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ByteString::deserialize(d).map(|b| b.0)
    }
}

impl Bulk for Option<Vec<u8>> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Some(v) => s.serialize_some(&RawBytes(v)),
            None => s.serialize_none(),
        }
    }
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<ByteString>::deserialize(d).map(|o| o.map(|b| b.0))
    }
}

impl Bulk for Vec<Vec<u8>> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(|v| RawBytes(v)))
    }
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<ByteString>::deserialize(d).map(|v| v.into_iter().map(|b| b.0).collect())
    }
}

/// Named byte strings (include files by path, headers by program).
impl<K: Serialize + DeserializeOwned> Bulk for Vec<(K, Vec<u8>)> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(|(k, v)| (k, RawBytes(v))))
    }
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<(K, ByteString)>::deserialize(d).map(|v| v.into_iter().map(|(k, b)| (k, b.0)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shape as serde derives it (a sequence of numbers) and as `bulk` carries it.
    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Derived {
        one: Vec<u8>,
        maybe: Option<Vec<u8>>,
        none: Option<Vec<u8>>,
        many: Vec<Vec<u8>>,
        named: Vec<(String, Vec<u8>)>,
        after: u32,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Bulky {
        #[serde(with = "crate::bulk")]
        one: Vec<u8>,
        #[serde(with = "crate::bulk")]
        maybe: Option<Vec<u8>>,
        #[serde(with = "crate::bulk")]
        none: Option<Vec<u8>>,
        #[serde(with = "crate::bulk")]
        many: Vec<Vec<u8>>,
        #[serde(with = "crate::bulk")]
        named: Vec<(String, Vec<u8>)>,
        after: u32,
    }

    fn sample() -> (Derived, Bulky) {
        let bytes: Vec<u8> = (0..=255u8).chain(0..200).collect();
        let d = Derived {
            one: bytes.clone(),
            maybe: Some(vec![7; 130]),
            none: None,
            many: vec![vec![], vec![1, 2, 3], bytes.clone()],
            named: vec![("a.h".into(), b"#define A 1\n".to_vec()), ("b.h".into(), vec![])],
            after: 0xdead_beef,
        };
        let b = Bulky {
            one: d.one.clone(),
            maybe: d.maybe.clone(),
            none: None,
            many: d.many.clone(),
            named: d.named.clone(),
            after: d.after,
        };
        (d, b)
    }

    #[test]
    fn postcard_encodes_bytes_exactly_as_it_encoded_the_sequence() {
        let (d, b) = sample();
        let derived = postcard::to_stdvec(&d).unwrap();
        let bulky = postcard::to_stdvec(&b).unwrap();
        assert_eq!(derived, bulky, "the wire format must not change");
        // Each side reads what the other wrote.
        assert_eq!(postcard::from_bytes::<Bulky>(&derived).unwrap(), b);
        assert_eq!(postcard::from_bytes::<Derived>(&bulky).unwrap(), d);
    }

    #[test]
    fn a_length_past_the_input_is_an_error_not_an_allocation() {
        let (_, b) = sample();
        let mut wire = postcard::to_stdvec(&b).unwrap();
        // `one`'s length varint (456 = 0xc8 0x03) claims far more than is there.
        assert_eq!(&wire[..2], &[0xc8, 0x03]);
        wire[0] = 0xff;
        wire[1] = 0xff;
        wire.insert(2, 0x7f);
        assert!(postcard::from_bytes::<Bulky>(&wire).is_err());
        assert!(postcard::from_bytes::<Bulky>(&wire[..10]).is_err());
    }

    /// Every byte-string field of the wire types is marked to travel as bytes: one left unmarked
    /// would be encoded a byte at a time again, silently (a 100 MB source took 26 s that way).
    #[test]
    fn every_byte_string_field_of_the_wire_travels_as_bytes() {
        const MARK: &str = "#[serde(with = \"crate::bulk\")]";
        let src = include_str!("wire.rs");
        let lines: Vec<&str> = src.lines().collect();
        let mut fields = 0;
        let mut unmarked = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // Functions' parameters and results are not fields.
            if code.contains("fn ") || (code.contains("->") && !code.contains('}')) || code.contains("&mut Vec<u8>") {
                continue;
            }
            for (at, _) in code.match_indices("Vec<u8>") {
                // The field this type belongs to: the name before the last `: `.
                let Some(colon) = code[..at].rfind(": ") else { continue };
                let head = code[..colon].trim_end();
                let name_start = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |p| p + 1);
                let before = head[..name_start].trim_end();
                let before = before.strip_suffix("pub").unwrap_or(before).trim_end();
                let marked = before.ends_with(MARK) || (before.is_empty() && i > 0 && lines[i - 1].trim() == MARK);
                fields += 1;
                if !marked {
                    unmarked.push(format!("wire.rs:{}: {}", i + 1, line.trim()));
                }
            }
        }
        assert!(fields >= 19, "the scan found only {fields} byte-string fields: it no longer reads wire.rs right");
        assert!(unmarked.is_empty(), "byte-string fields without {MARK}:\n{}", unmarked.join("\n"));
    }

    #[test]
    fn a_format_without_bytes_still_gives_its_sequence() {
        // serde's own value-based deserializers hand bytes over as a sequence of numbers.
        use serde::de::value::{Error, SeqDeserializer};
        let seq = SeqDeserializer::<_, Error>::new(vec![1u8, 2, 3].into_iter());
        assert_eq!(<Vec<u8> as Bulk>::read(seq).unwrap(), vec![1, 2, 3]);
    }
}
