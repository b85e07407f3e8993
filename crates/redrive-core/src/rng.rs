//! A tiny seeded random number generator.
//!
//! Jitter must be reproducible from a seed (SPEC §3), and the core crate must
//! not reach for the OS. SplitMix64 is small, fast, passes BigCrush for this
//! purpose, and its whole state is one `u64`, so a store can persist or derive
//! it trivially.

/// SplitMix64 (Steele, Lea, Flood 2014). Same seed, same sequence.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator that yields the same sequence for the same `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `lo..=hi` (returns `lo` when `hi <= lo`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo;
        if span == u64::MAX {
            return self.next_u64();
        }
        // Multiply-shift: unbiased enough for jitter, and never out of range.
        let r = ((self.next_u64() as u128 * (span as u128 + 1)) >> 64) as u64;
        lo + r
    }
}

/// FNV-1a, 64 bits: a stable fingerprint of bytes (idempotency checks of payloads, a
/// bridge's identity of a body without a message id). Not for security.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn between_stays_in_range() {
        let mut r = SplitMix64::new(1);
        for _ in 0..10_000 {
            let v = r.between(10, 20);
            assert!((10..=20).contains(&v));
        }
        assert_eq!(r.between(5, 5), 5);
        assert_eq!(r.between(9, 3), 9);
    }
}
