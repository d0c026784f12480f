//! A fence repair (`crate::proto::repair_tally` holds its tally and plan; docs/fencing.md, "Repair"): it
//! reads every node's fence counter, then writes the planned value to the nodes that need it,
//! each on the connection its counter was read on; each round trip well within the seed
//! window.

use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome};
use crate::model::error::NodeFault;
use crate::model::fence_floor::FenceFloor;
use crate::model::round::deadline_after;
use crate::proto::fencing::FENCE_KEY;
use crate::proto::repair_tally::RepairTally;
use crate::proto::resp::Arg;
use crate::proto::scripts::{REPAIR_SCRIPT, scripts};
use crate::proto::session::Kind;

use super::{Engine, OpKind, script_call};

/// A fence repair's round trip waits at most the seed window divided by this: a margin for
/// the time between an answer's arrival and the repair's return, and for the clocks of A3.
const REPAIR_ROUND_SHARE: u32 = 2;

impl<N: Net> Engine<N> {
    /// Starts repair `id` (counters raised to at least `floor`), each round trip answered
    /// within `timeout`: reads the counters of the nodes in `targets`.
    pub(super) fn start_repair(
        &mut self,
        id: OpId,
        (floor, timeout): (FenceFloor, Duration),
        targets: u64,
        now: Instant,
    ) {
        let n = self.shared.nodes.len();
        let seed_window = self.core.seed_window;
        let op = &mut self.core.ops[id.index as usize];
        op.kind = OpKind::Repair;
        // Each round trip well within the seed window (half of it): a node repaired and
        // restarted at once is seeded again only a window later, after the repair returned —
        // by then every counted write is in (docs/fencing.md, "Repair").
        let round = timeout.min(seed_window / REPAIR_ROUND_SHARE);
        op.until = deadline_after(now, round);
        op.repair = Some(Box::new(RepairTally::new(n, floor, round)));
        let read = [
            Arg::Bytes(b"HMGET"),
            Arg::Bytes(FENCE_KEY.as_bytes()),
            Arg::Bytes(b"run"),
            Arg::Bytes(b"n"),
        ];
        let Engine {
            net, core, scratch, ..
        } = self;
        scratch.clear();
        crate::proto::resp::encode_command(scratch, &read);
        core.send_command(net, (id, Kind::Command, scratch), targets, now);
    }

    /// Repair `index` once its round trip is over (or its deadline passed): the writes planned
    /// from the reads (queued in `repair_due`; `None`), or its outcome.
    pub(super) fn repair_round_over(&mut self, index: usize, now: Instant) -> Option<Outcome> {
        let nodes = &self.shared.nodes;
        let quorum = nodes.len() / 2 + 1;
        let op = &mut self.core.ops[index];
        let repair = op.repair.as_mut().expect("a repair op has its tally");
        if !repair.round_done() && op.until > now {
            return None;
        }
        repair.time_out();
        if repair.is_reading() && repair.plan(nodes, quorum) != 0 {
            // The writes go out after the turn's settling (`write_repairs`).
            op.until = deadline_after(now, repair.round);
            self.repair_due.push(index as u32);
            return None;
        }
        Some(Outcome::Repaired(repair.outcome(nodes, quorum)))
    }

    /// Sends the writes of fence repair `index` (queued in `repair_due`): to each node the
    /// repair planned for, on the connection its counter was read on, with that connection's
    /// `run_id`; a node on a new connection since does not take it.
    pub(super) fn write_repair(&mut self, index: u32, now: Instant) {
        let n = self.shared.nodes.len();
        let Engine {
            net, core, scratch, ..
        } = self;
        let op = &core.ops[index as usize];
        let id = OpId { index, seq: op.seq };
        let Some(repair) = op.repair.as_deref() else {
            return;
        };
        let targets: Vec<(usize, u64, u64, [u8; 40])> = (0..n)
            .filter_map(|i| repair.target(i).map(|(v, g, r)| (i, v, g, r)))
            .collect();
        for (node, value, generation, run_id) in targets {
            let session = net.session(node);
            let same = session.is_ready()
                && session.generation() == generation
                && session.info().is_some_and(|i| i.run_id == run_id);
            if !same {
                // A new connection since the read: maybe a new process, whose counter the read
                // did not see.
                core.fail(id, node, NodeFault::Closed, now);
                continue;
            }
            let call = script_call(
                scratch,
                &scripts()[REPAIR_SCRIPT],
                id.tag(),
                &[
                    Arg::Int(1),
                    Arg::Bytes(FENCE_KEY.as_bytes()),
                    Arg::UInt(value),
                    Arg::Bytes(&run_id),
                ],
            );
            let sent = net.script(node, call, now, &mut core.sink());
            core.sent(id, node, sent, now);
        }
    }
}
