//! The simulated callers and what they want: each caller's state (idle, waiting, holding,
//! keeping), its wants, and the resources of a run. Data only; `workload.rs` drives them.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::kept::Kept;
use crate::engine::mailbox::Slot;
use crate::engine::request::OpId;
use crate::model::token::Token;

use super::clock::MS;
use super::rng::Rng;
use super::setup::{Break, Setup};

/// A client pauses up to this long (in ns) between its locks: short against the TTL, so locks
/// contend, long enough that the clients' attempts interleave.
pub(super) const MAX_THINK: u64 = 20 * MS;

/// Plain resources of a schedule: one to three (one in contention runs).
const PLAIN_RESOURCES: Range<u64> = 1..4;

/// What a client is doing.
pub(super) enum Work {
    Idle {
        until: Instant,
    },
    Acquiring {
        id: OpId,
        res: usize,
        token: Token,
        /// World time the acquire was submitted.
        start_g: u64,
        /// A waiting acquire's deadline (the client's clock).
        deadline: Option<Instant>,
        /// (`Setup::cancel`) an async caller's wait: its outcome comes in this slot, and its
        /// future is dropped at the instant given unless the outcome came first.
        slot: Option<(Arc<Slot>, Instant)>,
    },
    Holding(Hold),
    Extending {
        id: OpId,
        hold: Hold,
    },
    /// A kept lock (renewed by the engine's timers), held until `until`.
    Keeping(Keeping),
    Releasing {
        id: OpId,
    },
    Done,
}

#[derive(Clone, Copy)]
pub(super) struct Hold {
    pub(super) res: usize,
    pub(super) token: Token,
    /// The nodes that back its validity (`Lock::backing`).
    pub(super) backing: u64,
    pub(super) valid: Instant,
    pub(super) until: Instant,
    pub(super) start_g: u64,
    pub(super) extensions: u32,
    pub(super) fence: u64,
}

pub(super) struct Keeping {
    pub(super) kept: Arc<Kept>,
    pub(super) res: usize,
    pub(super) until: Instant,
    /// Start of the belief interval while the holder believes (`is_held()` would say yes).
    pub(super) open: Option<u64>,
    pub(super) fence: u64,
    /// The latest validity the cover check saw (`World::check_cover`).
    pub(super) checked: Instant,
}

/// One caller of a client's engine (a thread or task of the process), wanting one resource
/// at a time until it gets it.
pub(super) struct Caller {
    pub(super) work: Work,
    /// The resource it wants, and since when (world time): from its first attempt until one
    /// wins, across refusals, failures and waits that time out.
    pub(super) want: Option<(usize, u64)>,
}

/// A caller's want of a resource, from its first attempt until it was granted (or given up).
#[derive(Debug, Clone, Copy)]
pub(super) struct Want {
    pub(super) res: usize,
    pub(super) client: usize,
    pub(super) caller: usize,
    pub(super) start: u64,
    pub(super) end: u64,
}

/// The resources the callers contend for (their names), each one's plain members (itself, a
/// set's, or the one a shared lock is of) and whether it is a shared lock: one to three plain
/// resources, then with `Setup::sets` their sets, then with readers each one's shared lock.
pub(super) fn resources(setup: Setup, rng: &mut Rng) -> (Vec<Vec<u8>>, Vec<Vec<usize>>, Vec<bool>) {
    let sets = setup.sets || setup.breaks == Break::SetNotAllOrNone || setup.breaks.of_sets();
    let plain = match rng.within(PLAIN_RESOURCES) {
        // Contention for one resource.
        _ if setup.breaks.contention() || setup.breaks == Break::RunIdOnYesOnly => 1,
        1 if sets => 2,
        k => k as usize,
    };
    let mut resources: Vec<Vec<u8>> = (0..plain)
        .map(|r| format!("sim:{r}").into_bytes())
        .collect();
    // Each resource's members (itself for a plain one); with sets, every pair of
    // neighbours and, of three, all three.
    let mut members: Vec<Vec<usize>> = (0..plain).map(|r| vec![r]).collect();
    if sets {
        let mut groups: Vec<Vec<usize>> = (0..plain - 1).map(|r| vec![r, r + 1]).collect();
        if plain == 3 {
            groups.push(vec![0, 1, 2]);
        }
        for group in groups {
            let names: Vec<&[u8]> = group.iter().map(|&m| &resources[m][..]).collect();
            let set = crate::model::keys::encode_set(&names, |_| Ok(())).expect("a valid set");
            resources.push(set);
            members.push(group);
        }
    }
    // With readers, each plain resource's shared lock.
    let mut shared_of = vec![false; resources.len()];
    let counter = setup.breaks == Break::CounterSemaphore;
    if setup.shared
        || setup.breaks == Break::ReaderIgnoresWriter
        || setup.breaks.of_sets()
        || counter
    {
        for r in 0..plain {
            let mut name = crate::model::keys::SHARED_PREFIX.as_bytes().to_vec();
            name.extend_from_slice(&resources[r]);
            resources.push(name);
            members.push(vec![r]);
            shared_of.push(true);
        }
    }
    (resources, members, shared_of)
}
