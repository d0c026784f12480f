//! Code shared by the benchmark targets (`benches/lock.rs`, `benches/bench_table.rs`,
//! `benches/bench_counts.rs`): the compared clients, the `contention` and `scale` scenarios'
//! runners and a few statistics. (The delay relay is `redis_local::Relay`.)
#![allow(dead_code)]

pub mod clients;
pub mod contention;
pub mod scale;

use std::time::Duration;

/// The `q`-quantile (0..=1) of sorted samples, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Median of unsorted floats (NaN-free).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Microseconds with one decimal under 100 µs, whole above.
pub fn us(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e6;
    if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}
