//! Time in the simulated world: world time is nanoseconds from the start of a run, and each
//! process (client or node) reads it on a clock of its own that runs a little fast or slow.

use super::rng::Rng;

/// A millisecond, in nanoseconds (world time and every clock count in ns).
pub(super) const MS: u64 = 1_000_000;
/// A second, in nanoseconds.
pub(super) const SECOND: u64 = 1_000 * MS;
/// How long a node that is not new has been up: an hour, far past the restart quarantine's
/// window.
pub(super) const LONG_UP: u64 = 3_600 * SECOND;
/// Clock rates are drawn within this many ppm of world time. The drift factor is 1 %: every
/// clock within ±0.49 % keeps any two within the factor (see the README's Reliability
/// section).
pub(super) const DRIFT_PPM: u64 = 4_900;
/// …and within this many with `Break::ClockDrift` (±5 %, five times the factor).
pub(super) const BROKEN_DRIFT_PPM: u64 = 50_000;
/// Every process clock starts this far after the world's base instant (so local times never
/// come before it, whatever the rate).
const CLOCK_OFFSET: u64 = 1_000_000_000 * MS;

/// A process's clock: `local = offset + g × (1 + ppm / 10⁶)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    pub(super) ppm: i64,
}

impl Clock {
    /// A clock whose rate is drawn within ±`ppm_bound` ppm of world time.
    pub(super) fn drawn(rng: &mut Rng, ppm_bound: u64) -> Clock {
        Clock {
            ppm: rng.range(0, 2 * ppm_bound + 1) as i64 - ppm_bound as i64,
        }
    }

    /// What this clock reads at world time `g`.
    pub(super) fn local_ns(self, g: u64) -> u64 {
        // In 64 bits where nothing overflows (the same result; 128-bit division is slow).
        let fast = i64::try_from(g).ok().and_then(|g| {
            let drift = g.checked_mul(self.ppm)? / 1_000_000;
            (CLOCK_OFFSET as i64).checked_add(g)?.checked_add(drift)
        });
        if let Some(local) = fast {
            return local as u64;
        }
        let g = i128::from(g);
        (CLOCK_OFFSET as i128 + g + g * i128::from(self.ppm) / 1_000_000) as u64
    }
    /// The world time at which this clock reads `local_ns` (rounded up).
    pub(super) fn world_ns(self, local_ns: u64) -> u64 {
        let d = 1_000_000 + self.ppm;
        let fast = i64::try_from(local_ns).ok().and_then(|l| {
            let l = l - CLOCK_OFFSET as i64;
            Some(l.checked_mul(1_000_000)?.checked_add(d - 1)?.div_euclid(d))
        });
        if let Some(g) = fast {
            return g.max(0) as u64;
        }
        let l = i128::from(local_ns) - CLOCK_OFFSET as i128;
        let d = i128::from(d);
        ((l * 1_000_000 + d - 1).div_euclid(d)).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clocks' 64-bit paths give what the 128-bit formulas give.
    #[test]
    fn clock_conversions_match_the_exact_formulas() {
        let mut rng = Rng(7);
        for _ in 0..100_000 {
            let ppm = rng.range(0, 100_001) as i64 - 50_000;
            let clock = Clock { ppm };
            let g = match rng.range(0, 3) {
                0 => rng.range(0, 10_000 * MS),
                1 => rng.next() >> rng.range(0, 64),
                _ => u64::MAX - rng.range(0, 1000),
            };
            let exact = |g: u64| {
                let g = i128::from(g);
                (CLOCK_OFFSET as i128 + g + g * i128::from(ppm) / 1_000_000) as u64
            };
            assert_eq!(clock.local_ns(g), exact(g), "{g} {ppm}");
            let l = i128::from(g) - CLOCK_OFFSET as i128;
            let d = 1_000_000 + i128::from(ppm);
            let world = ((l * 1_000_000 + d - 1).div_euclid(d)).max(0) as u64;
            assert_eq!(clock.world_ns(g), world, "{g} {ppm}");
        }
    }
}
