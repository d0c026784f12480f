//! Repairing blank fence counters: the operation's tally without I/O ([`RepairTally`]) — the
//! engine sends the requests and feeds the answers in. What a caller asks ([`FenceFloor`], `model/fence_floor.rs`) and
//! gets back ([`FenceRepair`], one [`NodeRepair`] per node: `model/error.rs`) are data of the model.
//! The argument and the assumptions it rests on: docs/fencing.md, "Repair".
//!
//! A fenced acquire needs a quorum of *seeded* counters (`fencing.rs`), and a blank counter is
//! seeded only by an acquire that read such a quorum. Once a majority is blank (a majority of
//! the servers restarted, or a new deployment's first write-back reached a minority), nothing
//! seeds them again: every fenced acquire fails with [`Error::Fence`]. The repair is two round
//! trips, each node's on one connection:
//!
//! 1. `HMGET redlock:fence run n` on every node: its counter `n`, and whether it is seeded for
//!    the process answering (`run` equals the `run_id` that process gave in the connection's
//!    handshake).
//! 2. With `V` the larger of the caller's floor and every counter read (seeded or blank),
//!    [`REPAIR_BODY`](crate::proto::scripts::REPAIR_BODY) on the same connection — `n = max(n, V)`,
//!    `run` = that connection's `run_id` — to every node that was seeded, or blank and up for
//!    the whole seed window before round trip 1 was sent (inside its window, an acquire that
//!    began before its restart may still be handing out a fence the reads cannot see).
//!
//! It succeeds once a quorum of distinct server processes answered round trip 2 with a
//! counter of at least `V`. It never lowers a counter, so a repair that failed, or one that
//! ran twice, leaves nothing worse than it found.

use std::sync::Arc;
use std::time::Duration;

use crate::model::addr::NodeAddr;
use crate::model::error::{Error, NodeFault};
use crate::model::error::{FenceRepair, NodeRepair};
use crate::model::fence_floor::FenceFloor;
use crate::proto::fencing::parse_u64;
use crate::proto::resp::{ErrorKind, Frame};

/// One node's part in a repair.
#[derive(Debug, Clone, Default)]
struct Node {
    /// Round trip 1: `None` while awaited.
    read: Option<Result<Read, NodeFault>>,
    /// Read, but kept out of round trip 2 (a duplicate, a blank counter inside its window).
    held_back: Option<NodeFault>,
    /// Round trip 2.
    write: Write,
}

/// A counter as round trip 1 read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counter {
    counter: u64,
    /// Complete for the process answering.
    seeded: bool,
}

/// What round trip 1 read on a node.
#[derive(Debug, Clone, Copy)]
struct Read {
    fence: Counter,
    run_id: [u8; 40],
    generation: u64,
    /// For a blank counter: how much longer its server must stay up before it may be seeded.
    window_left: Option<Duration>,
}

#[derive(Debug, Clone, Default)]
enum Write {
    /// Not sent.
    #[default]
    No,
    /// Sent, not answered.
    Sent,
    /// Answered (or failed).
    Done(Result<u64, NodeFault>),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Reading,
    Writing,
    /// Stopped before writing (no floor and too few seeded, or too few nodes to repair).
    Stopped,
}

/// A repair in flight: the answers of both round trips.
#[derive(Debug)]
pub(crate) struct RepairTally {
    floor: FenceFloor,
    phase: Phase,
    nodes: Vec<Node>,
    highest: u64,
    value: u64,
    seeded_read: usize,
    /// How long each round trip waits for the answers.
    pub round: Duration,
}

impl RepairTally {
    /// A repair over `n` nodes with this floor, each round trip waiting at most `round`.
    pub fn new(n: usize, floor: FenceFloor, round: Duration) -> RepairTally {
        RepairTally {
            floor,
            phase: Phase::Reading,
            nodes: vec![Node::default(); n],
            highest: 0,
            value: 0,
            seeded_read: 0,
            round,
        }
    }

    /// True while round trip 1 is under way.
    pub fn is_reading(&self) -> bool {
        self.phase == Phase::Reading
    }

    /// Node `node`'s answer to round trip 1 (`HMGET redlock:fence run n`), on connection
    /// `generation` of the process `run_id`; `window_left`: how much longer that process must
    /// stay up before its counter may be seeded (`None`: up for the whole window before the
    /// repair began).
    pub fn on_read(
        &mut self,
        node: usize,
        reply: Result<&Frame<'_>, &NodeFault>,
        run_id: Option<&[u8; 40]>,
        generation: u64,
        window_left: Option<Duration>,
    ) {
        if self.phase != Phase::Reading || self.nodes[node].read.is_some() {
            return;
        }
        let read = match (reply, run_id) {
            (Err(fault), _) => Err(fault.clone()),
            (Ok(Frame::Error(e)), _) => Err(server_fault(e.kind, e.message, "HMGET")),
            (Ok(_), None) => Err(NodeFault::Unexpected(
                "no run_id from INFO server: the counter cannot be seeded".into(),
            )),
            (Ok(frame), Some(&run_id)) => match parse_read(frame, &run_id) {
                Some(fence) => Ok(Read {
                    fence,
                    run_id,
                    generation,
                    window_left: window_left.filter(|_| !fence.seeded),
                }),
                None => Err(NodeFault::unexpected(frame)),
            },
        };
        self.nodes[node].read = Some(read);
    }

    /// Node `node`'s answer to round trip 2, on connection `generation`.
    pub fn on_written(
        &mut self,
        node: usize,
        reply: Result<&Frame<'_>, &NodeFault>,
        generation: u64,
    ) {
        let value = self.value;
        let Some(node) = self.nodes.get_mut(node) else {
            return;
        };
        if !matches!(node.write, Write::Sent) {
            return;
        }
        let same = node
            .read
            .as_ref()
            .is_some_and(|r| r.as_ref().is_ok_and(|r| r.generation == generation));
        node.write = Write::Done(match reply {
            // Sent on the connection its node was read on (maybe another process now).
            _ if !same => Err(NodeFault::Closed),
            Err(fault) => Err(fault.clone()),
            Ok(Frame::Error(e)) => Err(server_fault(e.kind, e.message, "the fence repair script")),
            Ok(Frame::Bulk(b)) => match parse_u64(b) {
                Some(n) if n >= value => Ok(n),
                _ => Err(NodeFault::unexpected(b.escape_ascii())),
            },
            Ok(other) => Err(NodeFault::unexpected(other)),
        });
    }

    /// A request of node `node` failed (or was never sent).
    pub fn fail(&mut self, node: usize, fault: NodeFault) {
        let phase = self.phase;
        let Some(node) = self.nodes.get_mut(node) else {
            return;
        };
        match phase {
            Phase::Reading if node.read.is_none() => node.read = Some(Err(fault)),
            Phase::Writing if matches!(node.write, Write::Sent) => {
                node.write = Write::Done(Err(fault));
            }
            _ => {}
        }
    }

    /// Node `node`'s answer came with surplus frames or garbage: it does not count.
    pub fn withdraw(&mut self, node: usize, fault: NodeFault) {
        let phase = self.phase;
        let Some(node) = self.nodes.get_mut(node) else {
            return;
        };
        match phase {
            Phase::Reading => node.read = Some(Err(fault)),
            Phase::Writing if !matches!(node.write, Write::No) => {
                node.write = Write::Done(Err(fault));
            }
            _ => {}
        }
    }

    /// True when every node has answered (or failed) the round trip under way.
    pub fn round_done(&self) -> bool {
        match self.phase {
            Phase::Reading => self.nodes.iter().all(|n| n.read.is_some()),
            Phase::Writing => !self.nodes.iter().any(|n| matches!(n.write, Write::Sent)),
            Phase::Stopped => true,
        }
    }

    /// The round trip's time is up: the nodes that have not answered did not make it.
    pub fn time_out(&mut self) {
        for node in 0..self.nodes.len() {
            self.fail(node, NodeFault::Timeout);
        }
    }

    /// Ends round trip 1: the value, and the nodes round trip 2 goes to (a bit set; 0 when the
    /// repair stops here). A node listed after another entry that answered from the same
    /// server process is a duplicate and does not count.
    pub fn plan(&mut self, nodes: &[NodeAddr], quorum: usize) -> u64 {
        debug_assert!(self.phase == Phase::Reading);
        let reads: Vec<Option<Read>> = self
            .nodes
            .iter()
            .map(|n| n.read.as_ref().and_then(|r| r.as_ref().ok().copied()))
            .collect();
        self.highest = reads
            .iter()
            .flatten()
            .map(|r| r.fence.counter)
            .max()
            .unwrap_or(0);
        self.value = match self.floor {
            FenceFloor::AtLeast(floor) => floor.max(self.highest),
            FenceFloor::SeededQuorum | FenceFloor::EarlierHoldersStopped => self.highest,
        };
        let mut targets = 0u64;
        self.seeded_read = 0;
        for (i, read) in reads.iter().enumerate() {
            let Some(read) = read else { continue };
            let twin = (0..i).find(|&k| reads[k].is_some_and(|r| r.run_id == read.run_id));
            let node = &mut self.nodes[i];
            if let Some(twin) = twin {
                node.held_back = Some(NodeFault::Duplicate {
                    of: nodes[twin].to_string(),
                    run_id: String::from_utf8_lossy(&read.run_id).into_owned(),
                });
                continue;
            }
            if read.fence.seeded {
                self.seeded_read += 1;
            }
            match read.window_left {
                Some(left) => node.held_back = Some(NodeFault::SeedWindow(left)),
                None => targets |= 1u64 << i,
            }
        }
        let enough = targets.count_ones() as usize >= quorum;
        let floor_known = self.floor != FenceFloor::SeededQuorum || self.seeded_read >= quorum;
        if !(enough && floor_known) {
            self.phase = Phase::Stopped;
            return 0;
        }
        self.phase = Phase::Writing;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if targets & (1u64 << i) != 0 {
                node.write = Write::Sent;
            }
        }
        targets
    }

    /// What round trip 2 sends to `node`: the value, and the connection and `run_id` its read
    /// came on (the write goes on that connection only). Only to the nodes [`RepairTally::plan`]
    /// chose: a blank counter inside its seed window must stay blank (an acquire that began
    /// before its restart may still be writing its fence back to the others, where the read
    /// could not see it), and it was written — seeded below that fence — while its answer was
    /// ignored (the fence could repeat).
    pub fn target(&self, node: usize) -> Option<(u64, u64, [u8; 40])> {
        let node = self.nodes.get(node)?;
        match (&node.read, &node.write) {
            (Some(Ok(read)), Write::Sent) => Some((self.value, read.generation, read.run_id)),
            _ => None,
        }
    }

    /// The outcome: `Ok` once a quorum of server processes is repaired.
    pub fn outcome(&self, nodes: &Arc<[NodeAddr]>, quorum: usize) -> Result<FenceRepair, Error> {
        let mut repaired = 0;
        let per_node: Vec<NodeRepair> = self
            .nodes
            .iter()
            .zip(nodes.iter())
            .map(|(n, addr)| {
                let read = n.read.as_ref().and_then(|r| r.as_ref().ok());
                let (after, fault) = match (&n.read, &n.held_back, &n.write) {
                    (Some(Err(fault)), _, _) => (None, Some(fault.clone())),
                    (_, Some(fault), _) => (None, Some(fault.clone())),
                    (_, _, Write::Done(Ok(value))) => {
                        repaired += 1;
                        (Some(*value), None)
                    }
                    (_, _, Write::Done(Err(fault))) => (None, Some(fault.clone())),
                    (None, _, _) => (None, Some(NodeFault::Timeout)),
                    _ => (None, None),
                };
                NodeRepair {
                    node: addr.to_string(),
                    before: read.map(|r| r.fence.counter),
                    seeded: read.is_some_and(|r| r.fence.seeded),
                    after,
                    fault,
                }
            })
            .collect();
        // Stopped for want of a floor: enough nodes to repair, too few seeded to trust.
        let repairable = (per_node.iter())
            .filter(|n| n.before.is_some() && n.fault.is_none())
            .count();
        let needs_floor = self.floor == FenceFloor::SeededQuorum
            && self.seeded_read < quorum
            && repaired == 0
            && repairable >= quorum;
        let repair = FenceRepair {
            floor: match self.floor {
                FenceFloor::AtLeast(floor) => Some(floor),
                FenceFloor::SeededQuorum | FenceFloor::EarlierHoldersStopped => None,
            },
            needs_floor,
            highest_read: self.highest,
            value: self.value,
            quorum,
            seeded_read: self.seeded_read,
            repaired,
            nodes: per_node,
        };
        if repair.repaired >= quorum {
            Ok(repair)
        } else {
            Err(Error::FenceRepair(Box::new(repair)))
        }
    }
}

/// `{run, n}` from `HMGET redlock:fence run n`, given the `run_id` of the process answering:
/// `None` for an answer of the wrong shape or a counter that is not a canonical `u64`.
fn parse_read(frame: &Frame<'_>, run_id: &[u8; 40]) -> Option<Counter> {
    let Frame::Aggregate(agg) = frame else {
        return None;
    };
    let mut it = agg.iter();
    let run = it.next()?;
    let counter = match it.next()? {
        Frame::Bulk(b) => parse_u64(b)?,
        Frame::Null => 0,
        _ => return None,
    };
    if it.next().is_some() {
        return None;
    }
    let seeded = match run {
        Frame::Bulk(r) => r == run_id,
        Frame::Null => false,
        _ => return None,
    };
    Some(Counter { counter, seeded })
}

/// A server's error answer as a node fault (`command`: what it answered).
fn server_fault(kind: ErrorKind, message: &str, command: &'static str) -> NodeFault {
    let message = &crate::model::error::clipped(message);
    match kind {
        ErrorKind::NoPerm => NodeFault::Permission {
            command,
            message: message.to_owned(),
        },
        kind if kind.is_auth() => NodeFault::Auth(message.to_owned()),
        kind => NodeFault::Server(kind, message.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::resp::{Limits, Status, decode};

    const A: [u8; 40] = [b'a'; 40];
    const B: [u8; 40] = [b'b'; 40];
    const C: [u8; 40] = [b'c'; 40];
    const D: [u8; 40] = [b'd'; 40];
    const E: [u8; 40] = [b'e'; 40];

    fn nodes(n: usize) -> Arc<[NodeAddr]> {
        (0..n)
            .map(|i| NodeAddr::parse(&format!("redis://n{i}:6379")).unwrap())
            .collect()
    }

    /// Decodes one whole RESP frame and hands it to `f`.
    fn with_frame<R>(bytes: &[u8], f: impl FnOnce(&Frame<'_>) -> R) -> R {
        match decode(bytes, &Limits::DEFAULT) {
            Ok(Status::Complete((frame, used))) if used == bytes.len() => f(&frame),
            other => panic!("not one frame: {other:?}"),
        }
    }

    /// `HMGET redlock:fence run n` answered with this `run` (None: absent) and `n`.
    fn read(
        r: &mut RepairTally,
        node: usize,
        run: Option<&[u8; 40]>,
        n: Option<u64>,
        me: &[u8; 40],
    ) {
        read_in(r, node, run, n, me, None);
    }

    fn read_in(
        r: &mut RepairTally,
        node: usize,
        run: Option<&[u8; 40]>,
        n: Option<u64>,
        me: &[u8; 40],
        window_left: Option<Duration>,
    ) {
        let mut bytes = b"*2\r\n".to_vec();
        match run {
            Some(run) => bytes.extend_from_slice(&[b"$40\r\n", &run[..], b"\r\n"].concat()),
            None => bytes.extend_from_slice(b"$-1\r\n"),
        }
        match n {
            Some(n) => {
                let n = n.to_string();
                bytes.extend_from_slice(format!("${}\r\n{n}\r\n", n.len()).as_bytes());
            }
            None => bytes.extend_from_slice(b"$-1\r\n"),
        }
        with_frame(&bytes, |f| r.on_read(node, Ok(f), Some(me), 1, window_left));
    }

    fn written(r: &mut RepairTally, node: usize, n: &str, generation: u64) {
        let bytes = format!("${}\r\n{n}\r\n", n.len());
        with_frame(bytes.as_bytes(), |f| r.on_written(node, Ok(f), generation));
    }

    #[test]
    fn a_floor_raises_every_counter_and_blank_ones_in_their_window_are_held_back() {
        let (n, q) = (5, 3);
        let mut r = RepairTally::new(n, FenceFloor::AtLeast(100), Duration::from_secs(1));
        // Nodes 0 and 1 restarted long ago (blank, one with a stale snapshot's value), node 2
        // restarted just now, nodes 3 and 4 seeded.
        read(&mut r, 0, None, None, &A);
        read(&mut r, 1, Some(&E), Some(7), &B);
        read_in(&mut r, 2, None, None, &C, Some(Duration::from_secs(3)));
        read(&mut r, 3, Some(&D), Some(40), &D);
        assert!(!r.round_done());
        read(&mut r, 4, Some(&E), Some(41), &E);
        assert!(r.round_done());
        let targets = r.plan(&nodes(n), q);
        assert_eq!(targets, 0b11011);
        assert_eq!(r.target(0), Some((100, 1, A)));
        assert_eq!(r.target(2), None, "in its seed window: left blank");
        for (node, answer) in [(0, "100"), (1, "100"), (3, "100")] {
            written(&mut r, node, answer, 1);
        }
        assert!(!r.round_done());
        r.time_out();
        assert!(r.round_done());
        let done = r.outcome(&nodes(n), q).expect("three repaired");
        assert_eq!(
            (done.value, done.highest_read, done.seeded_read),
            (100, 41, 2)
        );
        assert_eq!(done.repaired, 3);
        let faults: Vec<_> = done.nodes.iter().map(|n| n.fault.clone()).collect();
        assert_eq!(
            faults,
            [
                None,
                None,
                Some(NodeFault::SeedWindow(Duration::from_secs(3))),
                None,
                Some(NodeFault::Timeout)
            ]
        );
        let before: Vec<_> = done.nodes.iter().map(|n| (n.before, n.seeded)).collect();
        assert_eq!((before[1], before[4]), ((Some(7), false), (Some(41), true)));
    }

    #[test]
    fn without_a_floor_the_repair_needs_a_quorum_of_seeded_counters() {
        let (n, q) = (3, 2);
        let mut r = RepairTally::new(n, FenceFloor::SeededQuorum, Duration::from_secs(1));
        read(&mut r, 0, Some(&A), Some(9), &A);
        read(&mut r, 1, None, None, &B);
        read(&mut r, 2, Some(&A), Some(12), &C);
        assert_eq!(
            r.plan(&nodes(n), q),
            0,
            "one seeded of three: nothing written"
        );
        let e = r.outcome(&nodes(n), q).unwrap_err();
        let Error::FenceRepair(done) = &e else {
            panic!("{e:?}")
        };
        assert!(done.needs_floor);
        assert_eq!(
            (done.highest_read, done.seeded_read, done.repaired),
            (12, 1, 0)
        );
        assert!(e.to_string().contains("no floor given"), "{e}");
        // Two seeded of three: the maximum of a seeded quorum, no floor needed.
        let mut r = RepairTally::new(n, FenceFloor::SeededQuorum, Duration::from_secs(1));
        read(&mut r, 0, Some(&A), Some(9), &A);
        read(&mut r, 1, None, None, &B);
        read(&mut r, 2, Some(&C), Some(12), &C);
        assert_eq!(r.plan(&nodes(n), q), 0b111);
        assert_eq!(r.target(1).map(|t| t.0), Some(12));
        // Acknowledging that earlier holders stopped: the highest read, whatever is seeded.
        let mut r = RepairTally::new(n, FenceFloor::EarlierHoldersStopped, Duration::from_secs(1));
        read(&mut r, 0, None, Some(3), &A);
        read(&mut r, 1, None, None, &B);
        r.fail(2, NodeFault::Timeout);
        assert_eq!(r.plan(&nodes(n), q), 0b011);
        assert_eq!(r.target(0).map(|t| t.0), Some(3));
    }

    #[test]
    fn one_server_under_two_entries_counts_once() {
        let (n, q) = (3, 2);
        let mut r = RepairTally::new(n, FenceFloor::AtLeast(5), Duration::from_secs(1));
        read(&mut r, 0, Some(&A), Some(1), &A);
        read(&mut r, 1, Some(&A), Some(1), &A);
        r.fail(2, NodeFault::Io(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(r.plan(&nodes(n), q), 0, "one server: no quorum");
        let Err(Error::FenceRepair(done)) = r.outcome(&nodes(n), q) else {
            panic!("a quorum from one server")
        };
        assert!(matches!(
            &done.nodes[1].fault,
            Some(NodeFault::Duplicate { of, .. }) if of == "n0:6379"
        ));
        assert!(!done.needs_floor);
        assert!(done.to_string().contains("n0:6379: not written"), "{done}");
    }

    #[test]
    fn a_write_counts_only_on_its_connection_and_at_least_the_value() {
        let (n, q) = (3, 2);
        let mut r = RepairTally::new(n, FenceFloor::AtLeast(50), Duration::from_secs(1));
        for (i, id) in [A, B, C].iter().enumerate() {
            read(&mut r, i, Some(id), Some(10), id);
        }
        assert_eq!(r.plan(&nodes(n), q), 0b111);
        // Node 0 answers on another connection, node 1 below the value (not our script's
        // answer), node 2 above it (a counter that was already higher keeps its value).
        written(&mut r, 0, "50", 2);
        written(&mut r, 1, "49", 1);
        written(&mut r, 2, "77", 1);
        let Err(Error::FenceRepair(done)) = r.outcome(&nodes(n), q) else {
            panic!("one repaired of three is no quorum")
        };
        assert_eq!(done.nodes[0].fault, Some(NodeFault::Closed));
        assert!(matches!(
            done.nodes[1].fault,
            Some(NodeFault::Unexpected(_))
        ));
        assert_eq!((done.nodes[2].after, done.repaired), (Some(77), 1));
        // Late answers after the decision change nothing.
        written(&mut r, 0, "50", 1);
        assert_eq!(r.outcome(&nodes(n), q).unwrap_err().to_string(), {
            Error::FenceRepair(done).to_string()
        });
    }

    #[test]
    fn answers_of_the_wrong_shape_are_faults() {
        let mut r = RepairTally::new(2, FenceFloor::AtLeast(1), Duration::from_secs(1));
        with_frame(b"*2\r\n$-1\r\n$3\r\n007\r\n", |f| {
            r.on_read(0, Ok(f), Some(&A), 1, None)
        });
        with_frame(b"-NOPERM no\r\n", |f| {
            r.on_read(1, Ok(f), Some(&B), 1, None)
        });
        let Err(Error::FenceRepair(done)) = ({
            r.plan(&nodes(2), 2);
            r.outcome(&nodes(2), 2)
        }) else {
            panic!("nothing readable")
        };
        assert!(matches!(
            done.nodes[0].fault,
            Some(NodeFault::Unexpected(_))
        ));
        assert!(matches!(
            done.nodes[1].fault,
            Some(NodeFault::Permission {
                command: "HMGET",
                ..
            })
        ));
    }
}
