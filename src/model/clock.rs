//! The clock check ([`Builder::clock_check`](crate::Builder::clock_check)): a node whose wall
//! clock disagrees with the others' does not count towards a quorum.
//!
//! Redis expires a key on its own wall clock. A server whose clock runs fast, or jumps
//! forward, drops a lock's key early, and a rival whose quorum shares only that node with the
//! holder's is granted the lock while it is held (docs/guarantees.md, "Server clocks"). No
//! client can see a key vanish, but it can see the clock that made it vanish: with the check
//! on, every acquire and extend sends `TIME` in the same write, just before its own command,
//! to each node, and a node's yes counts only if its clock reads within the tolerance `X` of
//! the clocks of a quorum of nodes (itself included) read in the same round.
//!
//! Why that is enough, with a majority of servers whose clocks agree within `X` and run at the
//! right rate (NTP keeps them so): a node's key expires early by as much as its clock gained
//! on the right time while the key lived. A yes is counted only while the node's clock is
//! within `X` of a quorum's, so of at least one healthy clock; by the holder (when its key was
//! set) and by a rival (when its own `SET NX` found the key gone) alike. Between the two it
//! gained at most `X + X` on that healthy clock, plus the healthy clocks' own spread (`X`):
//! the key went at most `3X` early, and `3X` is taken off every validity
//! ([`Config::clock_margin`](crate::Config)). A fast clock, a jump, a clock that was behind
//! and is stepped forward: each moves the node away from the others and out of the quorums,
//! for as long as it disagrees.
//!
//! Not covered: a clock that jumps forward and is stepped back within a TTL. The key went at
//! the jump; by the rival's reading the clock agrees again. The check bounds what a clock
//! gained between two readings, not how far it went in between.
//!
//! Each reading is bounded in local time by when its request was queued and when its reply
//! was read: the server ran `TIME` in between, so two nodes' offsets are compared with half of
//! each round trip added to their difference — a slow reply can only make a node disagree.
//!
//! Pure: times are arguments; the samples come from the sessions (`Session::clock`).

use std::time::{Duration, Instant};

/// One reading of a node's clock: `TIME`'s answer and the local instants around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClockSample {
    /// When the `TIME` request was queued (before it was written).
    pub sent: Instant,
    /// When its reply was read.
    pub received: Instant,
    /// The server's wall clock, microseconds since the Unix epoch.
    pub server_us: i64,
}

impl ClockSample {
    /// The server's clock less the local instant halfway through the round trip (µs, on a
    /// local time line that starts at `anchor`), and half the round trip (µs): the true
    /// offset is within that much of the first.
    fn offset(&self, anchor: Instant) -> (i128, i128) {
        let local = |t: Instant| match t.checked_duration_since(anchor) {
            Some(d) => d.as_micros() as i128,
            None => -(anchor.duration_since(t).as_micros() as i128),
        };
        let (a, b) = (local(self.sent), local(self.received));
        (
            i128::from(self.server_us) - (a + b) / 2,
            (b - a).abs() / 2 + 1,
        )
    }
}

/// Reads `TIME`'s reply: seconds and microseconds, as two bulk strings of digits.
pub(crate) fn parse_time(secs: &[u8], micros: &[u8]) -> Option<i64> {
    let number = |b: &[u8]| -> Option<i64> {
        if b.is_empty() || b.len() > 18 || !b.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(b).ok()?.parse().ok()
    };
    let (s, us) = (number(secs)?, number(micros)?);
    if us >= 1_000_000 {
        return None;
    }
    s.checked_mul(1_000_000)?.checked_add(us)
}

/// Whether node `node`'s clock agrees with a quorum's: its sample is of this round (queued at
/// or after `round_start`) and at least `quorum` nodes' samples of this round (its own
/// included) are within `tolerance` of it, round trips counted against it.
pub(crate) fn agrees(
    samples: &[Option<ClockSample>],
    node: usize,
    round_start: Instant,
    tolerance: Duration,
    quorum: usize,
) -> bool {
    let fresh = |s: &Option<ClockSample>| s.filter(|s| s.sent >= round_start);
    let Some(own) = samples.get(node).and_then(fresh) else {
        return false;
    };
    let x = tolerance.as_micros() as i128;
    let (mine, my_slack) = own.offset(round_start);
    let close = (samples.iter().filter_map(fresh))
        .filter(|s| {
            let (theirs, their_slack) = s.offset(round_start);
            (mine - theirs).abs() + my_slack + their_slack <= x
        })
        .count();
    close >= quorum
}

/// How far node `node`'s clock read from the median of the clocks read this round (since
/// `round_start`), in whole milliseconds (ahead: positive); `None` if it gave no reading this
/// round. What a [`NodeFault::Clock`](crate::NodeFault::Clock) says.
pub(crate) fn off_by(
    samples: &[Option<ClockSample>],
    node: usize,
    round_start: Instant,
) -> Option<i64> {
    let fresh = |s: &Option<ClockSample>| s.filter(|s| s.sent >= round_start);
    let own = samples.get(node).and_then(fresh)?;
    let mut offsets: Vec<i128> = (samples.iter().filter_map(fresh))
        .map(|s| s.offset(round_start).0)
        .collect();
    offsets.sort_unstable();
    let median = offsets[offsets.len() / 2];
    let off = (own.offset(round_start).0 - median) / 1_000;
    Some(off.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A sample read `rtt` after `at`, of a clock `ahead` of the others (µs; the healthy
    /// clocks read 1,000,000,000 s at `t0`).
    fn sample(t0: Instant, at: Duration, rtt: Duration, ahead: i64) -> Option<ClockSample> {
        let mid = (at + rtt / 2).as_micros() as i64;
        Some(ClockSample {
            sent: t0 + at,
            received: t0 + at + rtt,
            server_us: 1_000_000_000_000_000 + mid + ahead,
        })
    }

    #[test]
    fn time_replies_are_read_and_nonsense_is_refused() {
        assert_eq!(
            parse_time(b"1700000000", b"123456"),
            Some(1_700_000_000_123_456)
        );
        assert_eq!(parse_time(b"0", b"0"), Some(0));
        for (s, us) in [
            (&b""[..], &b"1"[..]),
            (b"-1", b"0"),
            (b"1", b"1000000"),
            (b"12a", b"0"),
            (b"9999999999999999999", b"0"),
        ] {
            assert_eq!(parse_time(s, us), None, "{s:?} {us:?}");
        }
    }

    #[test]
    fn healthy_clocks_agree_and_one_ahead_by_more_than_the_tolerance_does_not() {
        let t0 = Instant::now();
        let rtt = MS / 5;
        let mut samples = vec![
            sample(t0, MS, rtt, 0),
            sample(t0, MS, rtt, 3_000),
            sample(t0, 2 * MS, rtt, -2_000),
            sample(t0, MS, rtt, 1_000),
            sample(t0, MS, rtt, 3_000_000),
        ];
        for node in 0..4 {
            assert!(agrees(&samples, node, t0, 20 * MS, 3), "{node}");
        }
        assert!(!agrees(&samples, 4, t0, 20 * MS, 3));
        // With two healthy clocks read so far, none has a quorum yet.
        samples[2] = None;
        samples[3] = None;
        assert!(!agrees(&samples, 0, t0, 20 * MS, 3));
    }

    #[test]
    fn the_fault_says_how_far_off_the_clock_read() {
        let t0 = Instant::now();
        let samples = vec![
            sample(t0, MS, MS / 10, 0),
            sample(t0, MS, MS / 10, 1_000),
            sample(t0, MS, MS / 10, 3_000_000),
            None,
        ];
        assert_eq!(off_by(&samples, 2, t0), Some(2_999));
        assert_eq!(off_by(&samples, 0, t0), Some(-1));
        assert_eq!(off_by(&samples, 3, t0), None);
    }

    #[test]
    fn a_sample_of_an_earlier_round_does_not_count() {
        let t0 = Instant::now();
        let samples = vec![
            sample(t0, MS, MS, 0),
            sample(t0, MS, MS, 0),
            sample(t0, MS, MS, 0),
        ];
        let later = t0 + 5 * MS;
        assert!(agrees(&samples, 0, t0, 20 * MS, 2));
        assert!(!agrees(&samples, 0, later, 20 * MS, 2));
    }

    #[test]
    fn a_slow_reply_counts_its_round_trip_against_agreement() {
        let t0 = Instant::now();
        // Each clock exactly right, but one read over a 30 ms round trip: its offset could be
        // 15 ms off, so within 10 ms it cannot be said to agree.
        let samples = vec![
            sample(t0, MS, MS / 10, 0),
            sample(t0, MS, MS / 10, 0),
            sample(t0, MS, 30 * MS, 0),
        ];
        assert!(agrees(&samples, 0, t0, 10 * MS, 2));
        assert!(!agrees(&samples, 2, t0, 10 * MS, 2));
        assert!(agrees(&samples, 2, t0, 20 * MS, 2));
    }

    #[test]
    fn two_clocks_off_the_same_way_do_not_outvote_three_healthy_ones() {
        let t0 = Instant::now();
        let samples = vec![
            sample(t0, MS, MS / 10, 0),
            sample(t0, MS, MS / 10, 0),
            sample(t0, MS, MS / 10, 0),
            sample(t0, MS, MS / 10, 9_000_000),
            sample(t0, MS, MS / 10, 9_000_000),
        ];
        assert!(agrees(&samples, 0, t0, 20 * MS, 3));
        assert!(!agrees(&samples, 3, t0, 20 * MS, 3));
        assert!(!agrees(&samples, 4, t0, 20 * MS, 3));
    }
}
