//! What the caller of a fence repair vouches for about the fences handed out before it
//! ([`FenceFloor`]). What the repair did is an error's report ([`FenceRepair`](crate::FenceRepair),
//! `model/error.rs`); its tally `proto/repair_tally.rs`; the argument docs/fencing.md ("Repair").

use std::fmt;

/// What the caller of a fence repair vouches for about the fences handed out before it
/// ([`Redlock::repair_fences`](crate::Redlock::repair_fences)). The counters are raised to the
/// larger of the floor and every counter read; docs/fencing.md ("Repair") gives the argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceFloor {
    /// No floor: the repair goes ahead only if a quorum of the counters it reads is seeded —
    /// then their maximum is at least every fence handed out before the repair began, by the
    /// construction's own argument, and nothing beyond fencing's own assumptions is needed.
    /// Otherwise it fails ([`FenceRepair::needs_floor`](crate::FenceRepair::needs_floor)) and writes nothing. This repairs blank
    /// counters of a minority (restarted servers that no fenced acquire has seeded again).
    SeededQuorum,
    /// Every fence handed out before the repair began is at most this: the highest fence the
    /// protected resources have accepted, plus a margin for fences handed out and not
    /// presented yet (a holder paused in a GC may present its fence much later). Counters are
    /// raised to at least this; numbers are cheap, so be generous.
    AtLeast(u64),
    /// No floor is known, and the caller vouches that no holder of a fence handed out before
    /// the repair began will present it to a protected resource after the repair (every such
    /// lease has expired and its holder has stopped, or the resources no longer take its
    /// writes). Fences handed out after the repair may then be lower than earlier ones: a
    /// resource that refuses fences lower than the highest it has seen refuses them, until
    /// fences pass that mark (safe, but stuck), unless it forgets its mark too.
    EarlierHoldersStopped,
}

impl fmt::Display for FenceFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceFloor::SeededQuorum => f.write_str("none (a quorum of seeded counters)"),
            FenceFloor::AtLeast(n) => write!(f, "{n}"),
            FenceFloor::EarlierHoldersStopped => {
                f.write_str("none (every holder of an earlier fence has stopped)")
            }
        }
    }
}
