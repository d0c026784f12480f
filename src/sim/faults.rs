//! Faults: the plan a schedule draws at its start (which faults, when, for how long, by the
//! break it runs), and the record of each fault as it begins (the liveness and reconnect
//! checks' clock restarts at a change; no progress is owed while a majority is faulty).

use std::time::Duration;

use super::clock::MS;
use super::setup::{Break, NODES, TTL};
use super::workload::{MAX_THINK, Work};
use super::world::{EvKind, TIME_LIMIT, World};

/// A restarted node's quarantine, in world time: a TTL on its clock, which may run 0.49 %
/// slow, and a millisecond for the uptime's rounding.
pub(super) const QUARANTINE_SPAN: u64 = TTL.as_nanos() as u64 * 10_049 / 10_000 + MS;

/// (`Setup::young`) how long nodes that start with uptime 0 are quarantined for some client, in
/// world time: a client's first request comes within `MAX_THINK`, its connect and handshake
/// within four one-way deliveries (each a link's base of at most 2 ms, its jitter, and at
/// worst a rare delay spike: 62.2 ms each), then a window of its clock.
pub(super) const YOUNG_SPAN: u64 = MAX_THINK + 4 * (62 * MS + MS / 5) + QUARANTINE_SPAN;

impl World {
    pub(super) fn plan_faults(&mut self) {
        let n_clients = self.clients.len();
        if self.setup.breaks == Break::MajorityDown && !self.setup.control {
            // Down from the start until after the run (it ends after its lock operations).
            for node in 0..3 {
                self.at(0, EvKind::NodeCrash(node, TIME_LIMIT));
            }
        }
        if !self.setup.faults {
            return;
        }
        if self.setup.breaks.contention() {
            // Frozen from the start until after the run, and nothing else.
            self.at(0, EvKind::NodePause(0, TIME_LIMIT));
            return;
        }
        if self.setup.breaks == Break::FenceMajorityBlank {
            // A majority restarts at once, its counters lost, and nothing else goes wrong.
            let t = self.rng.range(200 * MS, 600 * MS);
            let mut back = 0;
            for node in 0..NODES / 2 + 1 {
                let d = self.rng.range(0, 300 * MS);
                back = back.max(t + d);
                self.at(t, EvKind::NodeCrash(node, d));
            }
            let healed = back + QUARANTINE_SPAN;
            self.healed_at = Some(healed);
            if self.setup.control {
                // The operator repairs once every node is back (and retries until it works).
                self.at(healed, EvKind::Operator);
            }
            return;
        }
        if self.setup.breaks == Break::UptimeAtItsWord {
            self.rolling_restart();
            return;
        }
        if self.setup.breaks == Break::EvictionCounted {
            // Memory pressure now and then on each evicting node, and nothing else.
            for node in 0..NODES {
                if !self.nodes[node].node.evicting {
                    continue;
                }
                for _ in 0..self.rng.range(5, 30) {
                    let t = self.rng.range(0, 4_000 * MS);
                    self.at(t, EvKind::Evict(node));
                }
            }
            return;
        }
        let count = match self.setup.breaks {
            Break::Nothing | Break::MajorityDown => self.rng.range(0, 6),
            _ => self.rng.range(3, 10),
        };
        let crashes = self.setup.breaks == Break::FenceBlankAsZero;

        for _ in 0..count {
            let t = self.rng.range(0, 4_000 * MS);
            // Replacements after every client has met every node: one that meets a node first
            // after it was replaced by a process up for long cannot tell (docs/reliability.md).
            let t = match self.setup.breaks {
                Break::RunIdOnYesOnly => 300 * MS + t * 37 / 40,
                _ => t,
            };
            let node = self.rng.range(0, NODES as u64) as usize;
            let client = self.rng.range(0, n_clients as u64) as usize;
            let kind = match self.setup.breaks {
                Break::Quarantine | Break::RunIdOnYesOnly => {
                    EvKind::NodeCrash(node, self.rng.range(0, 100 * MS))
                }
                // Restarts, and clients cut from the nodes that still hold the highest fence.
                _ if crashes && self.rng.chance(50) => {
                    EvKind::NodeCrash(node, self.rng.range(0, 1_000 * MS))
                }
                _ if crashes => {
                    EvKind::Partition(client, node, self.rng.range(10 * MS, 3_000 * MS))
                }
                Break::WorkPastValidity => {
                    EvKind::ClientPause(client, self.rng.range(300 * MS, 1_500 * MS))
                }
                // Nodes away while callers release, then back to a ledger that outgrew
                // max_pending.
                Break::LedgerUnpaced => match self.rng.range(0, 3) {
                    0 => EvKind::NodePause(node, self.rng.range(500 * MS, 2_500 * MS)),
                    1 => EvKind::NodeCrash(node, self.rng.range(200 * MS, 1_000 * MS)),
                    _ => EvKind::Partition(client, node, self.rng.range(500 * MS, 3_000 * MS)),
                },

                _ => match self.rng.range(0, 7) {
                    0 => EvKind::NodePause(node, self.rng.range(10 * MS, 2_000 * MS)),
                    1 => EvKind::NodeCrash(node, self.rng.range(0, 1_000 * MS)),
                    2 => EvKind::ConnReset(client, node),
                    3 => EvKind::Partition(client, node, self.rng.range(10 * MS, 3_000 * MS)),
                    4 => EvKind::ClientPause(client, self.rng.range(10 * MS, 1_500 * MS)),
                    5 => EvKind::ScriptFlush(node),
                    _ => EvKind::SlowLink(client, node, self.rng.range(100 * MS, 2_000 * MS)),
                },
            };
            self.at(t, kind);
        }
    }

    /// (`Break::UptimeAtItsWord`) three to five nodes restart one after another, each down
    /// for a moment; every client but the first starts within a TTL after the last is back,
    /// so that it sees those nodes for the first time while they are younger than the
    /// quarantine's window (a process deployed beside the servers' rolling restart).
    pub(super) fn rolling_restart(&mut self) {
        let mut t = self.rng.range(300 * MS, 2_000 * MS);
        let k = self.rng.range(3, NODES as u64 + 1) as usize;
        let first = self.rng.range(0, NODES as u64) as usize;
        let mut back = 0;
        for i in 0..k {
            let d = self.rng.range(0, 100 * MS);
            self.at(t, EvKind::NodeCrash((first + i) % NODES, d));
            back = back.max(t + d);
            t += self.rng.range(0, 50 * MS);
        }
        for c in 1..self.clients.len() {
            let join = back + self.rng.range(0, TTL.as_nanos() as u64);
            for k in 0..self.clients[c].callers.len() {
                let at = self.clients[c]
                    .clock
                    .local_ns(join + self.rng.range(0, MAX_THINK));
                self.clients[c].callers[k].work = Work::Idle {
                    until: self.base + Duration::from_nanos(at),
                };
            }
        }
    }

    /// A fault began now for `d` on a node (`None`: the client's every node), for a client
    /// (`None`: every client): the liveness check's clock restarts when it begins and ends.
    pub(super) fn fault_on(&mut self, node: Option<usize>, client: Option<usize>, d: u64) {
        self.changes.push(self.g);
        self.changes.push(self.g + d);
        if let Some(n) = node
            && d > 0
        {
            self.node_faults.push((n, self.g, self.g + d));
        }
        self.link_faults.push((client, node, d));
    }

    /// Fencing's assumption (see docs/fencing.md): at every moment a majority of the nodes
    /// holds a seeded counter (once any does). True if crashing `node` now would break it.
    pub(super) fn fence_assumption_needs(&self, node: usize) -> bool {
        let seeded = |i: usize| !self.nodes[i].down && self.nodes[i].node.fence_seeded();
        let count = (0..NODES).filter(|&i| seeded(i)).count();
        count > 0 && seeded(node) && count - 1 < NODES / 2 + 1
    }
}
