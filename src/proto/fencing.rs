//! Fencing tokens over N independent masters: the scripts, what a node's answer
//! means, and how a fence is derived from a quorum's answers. No I/O: the engine sends the
//! scripts and feeds the answers in. The argument is `docs/fencing.md`.
//!
//! Each node keeps **one** counter for all resources, the hash `redlock:fence` with the fields
//! `run` (the `run_id` of the server process that holds a trustworthy value) and `n` (the
//! counter, a decimal `u64`). A fenced acquire is two round trips:
//!
//! 1. With the `SET NX` ([`ACQUIRE_BODY`](crate::proto::scripts::ACQUIRE_BODY)) every node answers its `run` and `n`. A node whose
//!    `run` is its current process's `run_id` is *seeded*: its `n` is at least every fence
//!    written to it. Any other node is *blank* (restarted, flushed, evicted, or never used).
//!    With answers from a quorum of seeded nodes, the fence is their maximum + 1 ([`Reads`]).
//! 2. The fence is written back ([`WRITE_BODY`](crate::proto::scripts::WRITE_BODY), `n = max(n, fence)`) to the nodes that hold
//!    our key, and handed out only once a quorum of seeded nodes took it. A blank node that has
//!    been up for a whole restart window before the first round trip started is seeded by this
//!    write (its `run` set): every fence handed out before that window began is on a quorum of
//!    seeded nodes, which the first round trip read.
//!
//! Any quorum of seeded readers intersects the quorum that took any earlier fence, so fences
//! grow; the one key per node is what bounds the counter keys (no key per resource).

use crate::model::error::FenceNote;
use crate::model::mutation::Mutation;
use crate::proto::resp::Frame;

pub use crate::model::keys::FENCE_KEY;

/// What one node's answer to [`ACQUIRE_BODY`](crate::proto::scripts::ACQUIRE_BODY) said about its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Seeded for the process answering: its counter.
    Seeded(u64),
    /// Blank: the counter is not known to be complete (its value, if any, from an earlier
    /// process or a restored snapshot: never lower than the truth matters, so it is only ever
    /// used to raise a fence). `run`: the hash still names a process (an earlier one): it was
    /// seeded before, so this node is no part of a new deployment.
    Blank { value: u64, run: bool },
    /// The node's process is not known (no `INFO server`): it cannot take part.
    Unknown,
}

/// Parses an answer `{ok, run, n}` given the `run_id` of the process that answered. `None` for
/// an answer of the wrong shape (a fault of the node).
pub(crate) fn parse_acquire(
    frame: &Frame<'_>,
    run_id: Option<&[u8; 40]>,
) -> Option<(bool, Reading)> {
    let Frame::Aggregate(agg) = frame else {
        return None;
    };
    let mut it = agg.iter();
    let ok = match it.next()? {
        Frame::Integer(1) => true,
        Frame::Integer(0) => false,
        _ => None?,
    };
    let run = bulk(it.next()?)?;
    let n = bulk(it.next()?)?;
    if it.next().is_some() {
        return None;
    }
    let value = if n.is_empty() { 0 } else { parse_u64(n)? };
    let reading = match run_id {
        None => Reading::Unknown,
        Some(id) if !run.is_empty() && run == id => Reading::Seeded(value),
        Some(_) => Reading::Blank {
            value,
            run: !run.is_empty(),
        },
    };
    Some((ok, reading))
}

fn bulk<'a>(frame: Frame<'a>) -> Option<&'a [u8]> {
    match frame {
        Frame::Bulk(b) => Some(b),
        Frame::Simple(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Digits of `u64::MAX`: a longer number cannot fit.
const U64_DIGITS: usize = 20;

/// A canonical decimal `u64` (digits only, no sign, no leading zero but for "0").
pub(crate) fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > U64_DIGITS || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

/// The first round trip's answers, tallied (no allocation: bit sets over at most 64 nodes).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Reads {
    /// Largest counter among all answers (a blank node's stale value only ever raises it).
    any_max: u64,
    /// Nodes that answered seeded / blank / with their process unknown.
    seeded: u64,
    blank: u64,
    unknown: u64,
    /// Blank nodes whose counter names an earlier process (`run` set): seeded before.
    stale: u64,
    /// Blank nodes up for a whole restart window before the attempt started.
    seedable: u64,
    /// Nodes whose answer said our `SET NX` succeeded, with their counters (flawed variant).
    winners_max: u64,
}

/// Why no fence could be derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short {
    /// Seeded nodes that answered.
    pub seeded: u64,
    /// Nodes that answered blank, and those whose process was unknown.
    pub blank: u64,
    pub unknown: u64,
    /// Blank nodes whose counter was seeded before (by an earlier process): with every node
    /// blank, no new deployment (see [`Reads::genesis`]).
    pub stale: u64,
}

impl Reads {
    /// Records node `node`'s answer: whether our `SET` won there, and its reading.
    /// `seedable`: a blank node that may be seeded by this attempt.
    pub fn add(
        &mut self,
        node: usize,
        (won, reading): (bool, Reading),
        seedable: bool,
        mutation: Mutation,
    ) {
        let bit = 1u64 << node;
        let reading = match reading {
            Reading::Blank { value, .. } if mutation.fence_blank_as_zero() => {
                // Counted as seeded, and seeded by the write-back at once.
                self.seedable |= bit;
                Reading::Seeded(value)
            }
            r => r,
        };
        match reading {
            Reading::Seeded(v) => {
                self.seeded |= bit;
                self.any_max = self.any_max.max(v);
            }
            Reading::Blank { value, run } => {
                self.blank |= bit;
                self.any_max = self.any_max.max(value);
                if run {
                    self.stale |= bit;
                }
                if seedable {
                    self.seedable |= bit;
                }
            }
            Reading::Unknown => self.unknown |= bit,
        }
        if won && let Reading::Seeded(v) | Reading::Blank { value: v, .. } = reading {
            self.winners_max = self.winners_max.max(v);
        }
    }

    /// Who answered what.
    pub fn short(&self) -> Short {
        Short {
            seeded: self.seeded,
            blank: self.blank,
            unknown: self.unknown,
            stale: self.stale,
        }
    }

    /// Takes node `node`'s answer back (it came with garbage). A maximum it raised stays:
    /// a higher fence is never wrong.
    pub fn forget(&mut self, node: usize) {
        let keep = !(1u64 << node);
        self.seeded &= keep;
        self.blank &= keep;
        self.unknown &= keep;
        self.stale &= keep;
        self.seedable &= keep;
    }

    /// The fence, from the answers of `n` nodes with quorum `quorum`: the largest counter + 1
    /// once a quorum of seeded nodes answered; 1 + the largest (stale) value when every server
    /// process answered blank and none was seeded before (a new deployment: every node is then
    /// seeded by the write-back). `duplicates`: the entries that lead to the process of another
    /// entry, whose answer stands for theirs.
    pub fn fence(
        &self,
        n: usize,
        quorum: usize,
        duplicates: u64,
        mutation: Mutation,
    ) -> Result<u64, Short> {
        let short = self.short();
        if mutation.fence_no_write_back() {
            return Ok(self.winners_max);
        }
        // A quorum of seeded answers, or a new deployment (every node blank).
        if (short.seeded.count_ones() as usize) < quorum && !self.genesis(n, duplicates) {
            return Err(short);
        }
        let max = self.any_max;
        max.checked_add(1).ok_or(short)
    }

    /// True when every server process answered blank and no counter names an earlier process:
    /// a new deployment, which the write-back seeds everywhere. Counted over processes: an
    /// entry in `duplicates` leads to the process of another entry, whose reading stands for
    /// its own (one server's TCP port and Unix socket; its reading was taken back, or it was
    /// asked nothing). A blank counter whose hash still has
    /// its `run` was seeded before: a snapshot restored after fences above its value were
    /// handed out (assumption A2 broken: every node restarted, or N ≤ 2 and one did) must not
    /// start the count again from its value. Then no fence until a repair
    /// (`redlock repair-fences --at-least`) seeds the counters.
    pub fn genesis(&self, n: usize, duplicates: u64) -> bool {
        self.all_blank(n, duplicates) && self.stale == 0
    }

    /// True when every server process answered blank (`duplicates` as for [`Reads::genesis`]).
    pub fn all_blank(&self, n: usize, duplicates: u64) -> bool {
        let all = crate::model::round::all_nodes(n);
        self.blank != 0 && (self.blank | duplicates) == all
    }

    /// Why no fence, where the nodes' faults do not say it: a counter read at `u64::MAX`, with
    /// enough answers for a fence ([`FenceNote::Exhausted`]); every server process blank with a
    /// counter seeded before ([`FenceNote::SeededBefore`]); or so many blank that the other
    /// entries cannot make a quorum of seeded counters ([`FenceNote::MajorityBlank`]): no
    /// acquire seeds a blank counter without one, so only a repair does — unless a new
    /// deployment's write-back is on its way, or (every process blank or unknown) `+info` for
    /// the unknown ones would make it a new deployment. `duplicates` as for [`Reads::genesis`].
    pub fn note(&self, n: usize, quorum: usize, duplicates: u64) -> Option<FenceNote> {
        let all = crate::model::round::all_nodes(n);
        let enough = self.seeded.count_ones() as usize >= quorum || self.genesis(n, duplicates);
        if enough && self.any_max == u64::MAX {
            return Some(FenceNote::Exhausted);
        }
        if self.all_blank(n, duplicates) && self.stale != 0 {
            return Some(FenceNote::SeededBefore);
        }
        let out = (self.blank | duplicates).count_ones() as usize;
        let unknown_only = self.stale == 0 && (self.blank | self.unknown | duplicates) == all;
        (n - out < quorum && !unknown_only).then_some(FenceNote::MajorityBlank)
    }

    /// Blank nodes the write-back may seed.
    pub fn seeds(&self, n: usize, duplicates: u64) -> u64 {
        if self.genesis(n, duplicates) {
            self.blank
        } else {
            self.seedable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blank answer of a node whose `SET NX` succeeded: its counter's `value`, and whether
    /// its hash still names an earlier process (`run`).
    fn blank(value: u64, run: bool) -> (bool, Reading) {
        (true, Reading::Blank { value, run })
    }

    #[test]
    fn numbers_are_canonical_u64() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"007"), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b""), None);
    }

    #[test]
    fn a_fence_needs_a_quorum_of_seeded_answers_or_a_blank_deployment() {
        let (n, q) = (3, 2);
        // Every node blank: a new deployment, fence 1.
        let mut r = Reads::default();
        for i in 0..3 {
            r.add(i, blank(0, false), false, Mutation::None);
        }
        assert_eq!(r.fence(n, q, 0, Mutation::None), Ok(1));
        assert_eq!(r.seeds(n, 0), 0b111);
        // The example: node 2 restarted empty, node 3 older, node 1 silent: no fence
        // rather than a smaller one.
        let mut r = Reads::default();
        r.add(1, blank(0, false), false, Mutation::None);
        r.add(2, (true, Reading::Seeded(4)), false, Mutation::None);
        assert!(r.fence(n, q, 0, Mutation::None).is_err());
        assert_eq!(r.seeds(n, 0), 0);
        // ... which the flawed variant would hand out (5, not above node 1's 5).
        let mut bad = Reads::default();
        bad.add(1, blank(0, false), false, Mutation::FenceBlankAsZero);
        bad.add(
            2,
            (true, Reading::Seeded(4)),
            false,
            Mutation::FenceBlankAsZero,
        );
        assert_eq!(bad.fence(n, q, 0, Mutation::FenceBlankAsZero), Ok(5));
        // Node 1 answers: 6.
        r.add(0, (false, Reading::Seeded(5)), false, Mutation::None);
        assert_eq!(r.fence(n, q, 0, Mutation::None), Ok(6));
        // A stale snapshot's value only ever raises the fence.
        r.add(1, blank(9, true), true, Mutation::None);
        assert_eq!(r.fence(n, q, 0, Mutation::None), Ok(10));
        // The unknown never count; a counter at u64::MAX gives no fence.
        let mut r = Reads::default();
        r.add(0, (true, Reading::Unknown), true, Mutation::None);
        r.add(1, (true, Reading::Seeded(u64::MAX)), false, Mutation::None);
        r.add(2, (true, Reading::Seeded(1)), false, Mutation::None);
        assert!(r.fence(n, q, 0, Mutation::None).is_err());
        // ... and its text says why (a quorum of seeded yes, and no fault to show).
        assert_eq!(r.note(n, q, 0), Some(FenceNote::Exhausted));
        // Not when the quorum is missing anyway: that is what the faults say.
        let mut r = Reads::default();
        r.add(0, (true, Reading::Seeded(u64::MAX)), false, Mutation::None);
        assert_eq!(r.note(n, q, 0), None);
    }

    /// One server listed twice (its TCP port and its Unix socket): the second entry's reading
    /// does not count, so a new deployment is every server *process* blank. A reading taken
    /// back for garbage (not a duplicate) still stands in the way.
    #[test]
    fn a_new_deployment_is_counted_over_server_processes() {
        let mut r = Reads::default();
        r.add(0, blank(0, false), false, Mutation::None);
        r.add(2, blank(0, false), false, Mutation::None);
        assert!(r.fence(3, 2, 0, Mutation::None).is_err());
        assert_eq!(r.fence(3, 2, 0b010, Mutation::None), Ok(1));
        assert_eq!(r.seeds(3, 0b010), 0b101);
        r.add(1, blank(0, false), false, Mutation::None);
        r.forget(1);
        assert!(r.fence(3, 2, 0, Mutation::None).is_err());
    }

    /// The text of a fence refused says what mends it where the nodes' faults do not.
    #[test]
    fn a_blank_majority_is_noted_for_the_repair() {
        let seeded = (true, Reading::Seeded(4));
        // 5 nodes, 3 blank: the other two cannot make a quorum, whatever they say.
        let mut r = Reads::default();
        for i in 0..3 {
            r.add(i, blank(0, false), true, Mutation::None);
        }
        r.add(3, seeded, false, Mutation::None);
        assert_eq!(r.note(5, 3, 0), Some(FenceNote::MajorityBlank));
        // 2 blank, 2 seeded, 1 silent: it may answer seeded; nothing to note.
        let mut r = Reads::default();
        r.add(0, blank(0, false), true, Mutation::None);
        r.add(1, blank(0, true), true, Mutation::None);
        r.add(2, seeded, false, Mutation::None);
        r.add(3, seeded, false, Mutation::None);
        assert_eq!(r.note(5, 3, 0), None);
        // 3 entries, two of one server (entry 1 its duplicate), the server blank: a quorum of
        // entries is out of reach.
        let mut r = Reads::default();
        r.add(0, blank(0, true), true, Mutation::None);
        r.add(2, seeded, false, Mutation::None);
        assert_eq!(r.note(3, 2, 0b010), Some(FenceNote::MajorityBlank));
        // Every process blank or unknown, none seeded before: `+info` (the unknown node's
        // fault) makes it a new deployment, no repair.
        let mut r = Reads::default();
        r.add(0, blank(0, false), true, Mutation::None);
        r.add(1, blank(0, false), true, Mutation::None);
        r.add(2, (true, Reading::Unknown), true, Mutation::None);
        assert_eq!(r.note(3, 2, 0), None);
        // Every process blank, one seeded before.
        let mut r = Reads::default();
        r.add(0, blank(0, false), true, Mutation::None);
        r.add(1, blank(0, false), true, Mutation::None);
        r.add(2, blank(0, true), true, Mutation::None);
        assert_eq!(r.note(3, 2, 0), Some(FenceNote::SeededBefore));
    }

    /// Every node blank, one counter still naming the process that seeded it (a snapshot
    /// restored, N = 1 restarted with persistence): seeded before, so no new deployment — its
    /// value may be below fences handed out since. No fence, nothing seeded.
    #[test]
    fn every_node_blank_is_no_new_deployment_if_a_counter_was_seeded_before() {
        let (n, q) = (3, 2);
        let mut r = Reads::default();
        r.add(0, blank(0, false), true, Mutation::None);
        r.add(1, blank(50, true), true, Mutation::None);
        r.add(2, blank(0, false), true, Mutation::None);
        let short = r.fence(n, q, 0, Mutation::None).unwrap_err();
        assert_eq!((short.blank, short.stale), (0b111, 0b010));
        assert!(!r.genesis(n, 0));
        // N = 1: the one counter restored from a snapshot.
        let mut r = Reads::default();
        r.add(0, blank(50, true), true, Mutation::None);
        assert!(r.fence(1, 1, 0, Mutation::None).is_err());
        // Without a `run`, the hash was never seeded (or was lost entirely): a new deployment.
        let mut r = Reads::default();
        r.add(0, blank(0, false), false, Mutation::None);
        assert_eq!(r.fence(1, 1, 0, Mutation::None), Ok(1));
    }
}
