//! Short sequences of an enqueue carried without a heap allocation: a kernel argument's bytes
//! (`ArgBytes`) and a work size (`Dims`). Every `clEnqueueNDRangeKernel` carries one to three
//! work sizes and usually a few scalar arguments; as `Vec`s they cost an allocation and a free
//! each in the shim (building the request, and dropping it or its journal entry) and again in the
//! worker (decoding it), a few hundred instructions per enqueue on either side.
//!
//! On the wire both are sequences, encoded exactly as a `Vec` of their elements, so the protocol
//! does not change with them (and a stream transport sees the same bytes).

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use serde::de::{self, DeserializeOwned, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What `ArgBytes` and `Dims` share: a sequence that grows one item at a time, and is compared,
/// shown and encoded as the slice it holds.
trait InlineSeq: Default + Deref<Target = [Self::Item]> {
    type Item: Copy + fmt::Debug + PartialEq + Serialize + DeserializeOwned;
    /// What a decoder expected, for its errors.
    const EXPECTING: &'static str;
    /// Appends `v`; `Err` when the type holds no more.
    fn push(&mut self, v: Self::Item) -> Result<(), ()>;
}

/// Decodes an `InlineSeq` element by element: a declared length the input does not hold ends in
/// an error, not in an allocation of that size.
struct SeqVisitor<T>(PhantomData<T>);

impl<'de, T: InlineSeq> Visitor<'de> for SeqVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let mut out = T::default();
        while let Some(v) = seq.next_element::<T::Item>()? {
            out.push(v).map_err(|()| de::Error::invalid_length(out.len() + 1, &self))?;
        }
        Ok(out)
    }
}

/// Equality, `Debug` and the encoding of a `Vec` of the items, for an `InlineSeq`.
macro_rules! as_slice_impls {
    ($t:ty) => {
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                **self == **other
            }
        }
        impl Eq for $t {}
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&**self, f)
            }
        }
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.iter())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_seq(SeqVisitor::<$t>(PhantomData))
            }
        }
    };
}

/// How many bytes an argument keeps inline: every scalar and vector up to 16 bytes (`long2`,
/// `float4`, a pointer-sized handle).
const INLINE_BYTES: usize = 16;

/// A kernel argument's bytes: inline up to 16, on the heap beyond.
#[derive(Clone)]
pub enum ArgBytes {
    /// `bytes[..len]`; the rest stays zero.
    Inline {
        len: u8,
        bytes: [u8; INLINE_BYTES],
    },
    Heap(Vec<u8>),
}

impl ArgBytes {
    pub const fn new() -> Self {
        ArgBytes::Inline { len: 0, bytes: [0; INLINE_BYTES] }
    }
}

impl Default for ArgBytes {
    fn default() -> Self {
        Self::new()
    }
}

impl InlineSeq for ArgBytes {
    type Item = u8;
    const EXPECTING: &'static str = "a kernel argument's bytes";
    fn push(&mut self, b: u8) -> Result<(), ()> {
        match self {
            ArgBytes::Inline { len, bytes } if usize::from(*len) < INLINE_BYTES => {
                bytes[usize::from(*len)] = b;
                *len += 1;
            }
            ArgBytes::Inline { bytes, .. } => {
                let mut v = Vec::with_capacity(2 * INLINE_BYTES);
                v.extend_from_slice(bytes);
                v.push(b);
                *self = ArgBytes::Heap(v);
            }
            ArgBytes::Heap(v) => v.push(b),
        }
        Ok(())
    }
}

impl From<&[u8]> for ArgBytes {
    fn from(s: &[u8]) -> Self {
        if s.len() <= INLINE_BYTES {
            let mut bytes = [0; INLINE_BYTES];
            bytes[..s.len()].copy_from_slice(s);
            ArgBytes::Inline { len: s.len() as u8, bytes }
        } else {
            ArgBytes::Heap(s.to_vec())
        }
    }
}

impl From<Vec<u8>> for ArgBytes {
    fn from(v: Vec<u8>) -> Self {
        match v.len() <= INLINE_BYTES {
            true => ArgBytes::from(&v[..]),
            false => ArgBytes::Heap(v),
        }
    }
}

impl Deref for ArgBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ArgBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            ArgBytes::Heap(v) => v,
        }
    }
}

impl DerefMut for ArgBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            ArgBytes::Inline { len, bytes } => &mut bytes[..usize::from(*len)],
            ArgBytes::Heap(v) => v,
        }
    }
}

as_slice_impls!(ArgBytes);

/// A work size of `clEnqueueNDRangeKernel` (offset, global or local): one value per dimension,
/// at most three.
#[derive(Clone, Copy, Default)]
pub struct Dims {
    len: u8,
    values: [u64; 3],
}

impl Dims {
    /// `None` for more than three values.
    pub fn new(values: impl IntoIterator<Item = u64>) -> Option<Self> {
        let mut d = Dims::default();
        for v in values {
            d.push(v).ok()?;
        }
        Some(d)
    }

    /// The values, three always (those past `len` zero).
    pub fn padded(&self) -> [u64; 3] {
        self.values
    }

    /// The values as the driver takes them, three always (those past `len` zero).
    pub fn to_usize(&self) -> [usize; 3] {
        self.padded().map(|v| v as usize)
    }
}

impl Deref for Dims {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.values[..usize::from(self.len)]
    }
}

impl InlineSeq for Dims {
    type Item = u64;
    const EXPECTING: &'static str = "one to three work sizes";
    fn push(&mut self, v: u64) -> Result<(), ()> {
        *self.values.get_mut(usize::from(self.len)).ok_or(())? = v;
        self.len += 1;
        Ok(())
    }
}

as_slice_impls!(Dims);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_bytes_of_every_length_encode_as_a_vec_and_come_back() {
        for n in [0usize, 1, 4, 8, 15, 16, 17, 64, 300] {
            let v: Vec<u8> = (0..n).map(|i| (i * 7 + 1) as u8).collect();
            let a = ArgBytes::from(&v[..]);
            assert_eq!(matches!(a, ArgBytes::Inline { .. }), n <= INLINE_BYTES, "{n}");
            assert_eq!(&*a, &v[..]);
            let wire = postcard::to_allocvec(&a).unwrap();
            assert_eq!(wire, postcard::to_allocvec(&v).unwrap(), "{n}");
            let back: ArgBytes = postcard::from_bytes(&wire).unwrap();
            assert_eq!(back, a, "{n}");
            assert_eq!(ArgBytes::from(v.clone()), a, "{n}");
        }
    }

    #[test]
    fn arg_bytes_compare_by_content_and_are_writable_in_place() {
        let mut a = ArgBytes::from(&[1u8, 2, 3, 4][..]);
        a[2] = 9;
        assert_eq!(&*a, &[1, 2, 9, 4]);
        assert_ne!(a, ArgBytes::from(&[1u8, 2, 9][..]));
        assert_eq!(a, ArgBytes::from(vec![1u8, 2, 9, 4]));
    }

    #[test]
    fn a_length_the_input_does_not_hold_is_an_error() {
        // A declared length of 2^32 with three bytes behind it.
        let wire = [0x80, 0x80, 0x80, 0x80, 0x10, 1, 2, 3];
        assert!(postcard::from_bytes::<ArgBytes>(&wire).is_err());
        assert!(postcard::from_bytes::<Dims>(&wire).is_err());
    }

    #[test]
    fn dims_hold_one_to_three_values_and_encode_as_a_vec() {
        for v in [vec![], vec![5u64], vec![1, 2], vec![u64::MAX, 0, 7]] {
            let d = Dims::new(v.iter().copied()).unwrap();
            assert_eq!(&*d, &v[..]);
            let wire = postcard::to_allocvec(&Some(d)).unwrap();
            assert_eq!(wire, postcard::to_allocvec(&Some(v.clone())).unwrap());
            assert_eq!(postcard::from_bytes::<Option<Dims>>(&wire).unwrap(), Some(d));
        }
        assert!(Dims::new([1, 2, 3, 4]).is_none());
        let four = postcard::to_allocvec(&vec![1u64, 2, 3, 4]).unwrap();
        assert!(postcard::from_bytes::<Dims>(&four).is_err());
        assert_eq!(Dims::new([3, 4]).unwrap().to_usize(), [3, 4, 0]);
    }
}
