//! The simulated world's events: what happens at a moment of world time.

use super::client_net::Inbound;

/// What an event does (see `World::handle`).
#[derive(Debug)]
pub(super) enum EvKind {
    /// A client's wake, planned by its last poke.
    ClientWake(usize),
    /// A client's connect reaches the node.
    ConnArrive {
        conn: u64,
        client: usize,
        node: usize,
    },
    /// What a client wrote reaches the node.
    ToNode {
        conn: u64,
        bytes: Vec<u8>,
    },
    /// A client's close reaches the node.
    NodeClose {
        conn: u64,
    },
    /// What the world or a node sent reaches the client.
    ToClient {
        client: usize,
        node: usize,
        conn: u64,
        what: Inbound,
    },
    // Faults (node, client, duration in ns) and their ends: see `faults.rs`.
    NodePause(usize, u64),
    NodeResume(usize),
    NodeCrash(usize, u64),
    NodeRestart(usize),
    ConnReset(usize, usize),
    /// (`Break::HalfOpen`) a client's connection to a node goes half open: the node forgets it,
    /// the client is not told, and what it sends there is lost.
    HalfOpen(usize, usize),
    Partition(usize, usize, u64),
    ClientPause(usize, u64),
    ClientResume(usize),
    ScriptFlush(usize),
    SlowLink(usize, usize, u64),
    /// An evicting node drops the key closest to expiring.
    Evict(usize),
    /// The operator's fence repair (`Break::FenceMajorityBlank`'s control), through client 0.
    Operator,
}

/// An event, at its world time.
#[derive(Debug)]
pub(super) struct Ev {
    pub(super) t: u64,
    pub(super) kind: EvKind,
}
