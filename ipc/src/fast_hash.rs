//! A fast hasher for the hot maps of the shim and the worker, keyed by ids, handles and
//! parameter names: one multiply per word instead of SipHash, which cost the worker about 1 300
//! instructions per posted transfer (its object, segment and staging tables are consulted on
//! every request). SipHash defends a map against keys chosen to collide; these keys come from
//! the process itself (heap addresses, its driver's handles) or from the side it serves (ids the
//! shim allocates, the application's own parameter names), so a flood of colliding keys could
//! only slow down the process that sent them.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        // FxHash's step (rustc's own hasher): rotate, mix in, multiply by a large odd constant.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_ne_bytes(word));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.add(n.into());
    }
    fn write_u32(&mut self, n: u32) {
        self.add(n.into());
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn write_usize(&mut self, n: usize) {
        // Heap addresses: the low bits are alignment, the high bits are all alike.
        self.add((n >> 4) as u64);
    }
}

/// A `HashMap` with the `FastHasher`.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
/// A `HashSet` with the `FastHasher`.
pub type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_and_aligned_addresses_spread_over_the_buckets() {
        // hashbrown picks a bucket from the low bits: sequential ids and 16-byte-aligned
        // addresses must not pile into a few of them.
        let bucket = |h: u64| (h & 1023) as usize;
        for keys in [(1..=512u64).collect::<Vec<_>>(), (0..512u64).map(|i| 0x5555_0000_0000 + 16 * i).collect()] {
            let mut used = std::collections::HashSet::new();
            for k in keys {
                let mut h = FastHasher::default();
                if k > 1 << 40 {
                    h.write_usize(k as usize);
                } else {
                    h.write_u64(k);
                }
                used.insert(bucket(h.finish()));
            }
            assert!(used.len() > 300, "{} of 512 keys landed in distinct buckets", used.len());
        }
    }

    #[test]
    fn maps_keep_every_key() {
        let mut m: FastMap<(usize, usize), u64> = FastMap::default();
        for i in 0..10_000u64 {
            m.insert((i as usize * 16, 7), i);
        }
        assert!((0..10_000u64).all(|i| m.get(&(i as usize * 16, 7)) == Some(&i)));
    }
}
