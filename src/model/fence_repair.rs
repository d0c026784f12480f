//! A fence repair's terms: what its caller vouches for about the fences handed out before it
//! ([`FenceFloor`]), and what it did, node by node ([`FenceRepair`], [`NodeRepair`]: the
//! payload of [`Error::FenceRepair`](crate::Error::FenceRepair) when it fell short). Plain data;
//! the repair's tally is `proto/repair_tally.rs`, the argument docs/fencing.md ("Repair").

use std::fmt;

use crate::model::error::NodeFault;

/// What the caller of a fence repair vouches for about the fences handed out before it
/// ([`Redlock::repair_fences`](crate::Redlock::repair_fences)). The counters are raised to the
/// larger of the floor and every counter read; docs/fencing.md ("Repair") gives the argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceFloor {
    /// No floor: the repair goes ahead only if a quorum of the counters it reads is seeded —
    /// then their maximum is at least every fence handed out before the repair began, by the
    /// construction's own argument, and nothing beyond fencing's own assumptions is needed.
    /// Otherwise it fails ([`FenceRepair::needs_floor`]) and writes nothing. This repairs blank
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

/// What a fence repair ([`Redlock::repair_fences`](crate::Redlock::repair_fences)) did, node
/// by node: its result, and the payload of [`Error::FenceRepair`](crate::Error::FenceRepair) when it fell short.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceRepair {
    /// The floor given ([`FenceFloor::AtLeast`](crate::FenceFloor::AtLeast)), if any.
    pub floor: Option<u64>,
    /// True when the repair was given no floor
    /// ([`FenceFloor::SeededQuorum`](crate::FenceFloor::SeededQuorum)) and read fewer than a
    /// quorum of seeded counters, though enough nodes could have been repaired: it wrote
    /// nothing. A floor, or the acknowledgement that earlier holders have stopped, is needed.
    pub needs_floor: bool,
    /// The largest counter read, seeded or blank (0 when none was read).
    pub highest_read: u64,
    /// The value every repaired counter holds at least: the larger of the floor and
    /// `highest_read`. A fenced acquire that begins after a successful repair gets a greater
    /// fence (as long as no other repair with a lower floor runs in between).
    pub value: u64,
    /// Counters needed: `nodes.len() / 2 + 1`.
    pub quorum: usize,
    /// Server processes whose counter was read seeded (two entries of the server list that
    /// lead to one process count once).
    pub seeded_read: usize,
    /// Server processes whose counter the repair left seeded and at least `value`.
    pub repaired: usize,
    /// Every node, in the order of the server list.
    pub nodes: Vec<NodeRepair>,
}

/// What a fence repair did on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeRepair {
    /// `host:port`.
    pub node: String,
    /// The counter before the repair (0 when the node had none); `None` if it could not be
    /// read.
    pub before: Option<u64>,
    /// Whether that counter was seeded: complete for the node's current server process.
    pub seeded: bool,
    /// The counter after the repair, seeded for the node's process: at least
    /// [`FenceRepair::value`]. `None` when the node was not repaired.
    pub after: Option<u64>,
    /// Why the node could not be read or was not repaired (a blank counter inside its seed
    /// window, a duplicate entry, a connection lost between the round trips, …). `None` when
    /// it was repaired, or when the repair stopped before its writes
    /// ([`FenceRepair::needs_floor`], or too few nodes to repair).
    pub fault: Option<NodeFault>,
}

impl fmt::Display for FenceRepair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nodes.len();
        if self.needs_floor {
            write!(
                f,
                "no floor given, and only {} of {n} counters read are seeded ({} needed for \
                 their maximum, {}, to cover every fence handed out): nothing written; give a \
                 floor at least as high as every fence ever handed out, or acknowledge that \
                 every holder of an earlier fence has stopped",
                self.seeded_read, self.quorum, self.highest_read
            )?;
        } else {
            write!(
                f,
                "{} of {n} counters repaired (seeded, at least {}), {} needed",
                self.repaired, self.value, self.quorum
            )?;
        }
        for node in &self.nodes {
            match (&node.fault, node.after) {
                (Some(fault), _) => write!(f, "; {}: {fault}", node.node)?,
                (None, None) if !self.needs_floor => {
                    write!(f, "; {}: not written (too few nodes to repair)", node.node)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
