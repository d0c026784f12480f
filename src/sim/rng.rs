//! The one source of randomness of a schedule: every draw of the world — its shape, its
//! faults, its delays, its callers' wants — comes from this generator in a fixed order, so that a
//! seed replays a run exactly (a reordering of two draws changes every schedule after them).

use std::ops::Range;

/// SplitMix64: small, fast, and the same sequence on every platform and version.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    /// The next number of the sequence.
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi` (`lo` if empty).
    pub(super) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo)
        }
    }
    /// Uniform in `r` (its start if empty): [`Rng::range`] of its ends.
    pub(super) fn within(&mut self, r: Range<u64>) -> u64 {
        self.range(r.start, r.end)
    }
    /// True with a chance of `percent` in 100.
    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}
