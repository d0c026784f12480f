//! Faults: the plan a schedule draws at its start (which faults, when, for how long, by the
//! break it runs), and the record of each fault as it begins (the liveness and reconnect
//! checks' clock restarts at a change; no progress is owed while a majority is faulty).

use std::ops::Range;
use std::time::Duration;

use super::callers::{MAX_THINK, Work};
use super::clock::{LONG_UP, MS};
use super::events::EvKind;
use super::links::{JITTER, LINK_BASE, SPIKE};
use super::node::{Persist, run_id};
use super::setup::{Break, NODES, TTL};
use super::world::{TIME_LIMIT, World};

/// A restarted node's quarantine, in world time: a TTL on its clock, which may run 0.49 %
/// slow, and a millisecond for the uptime's rounding.
const QUARANTINE_SPAN: u64 = TTL.as_nanos() as u64 * 10_049 / 10_000 + MS;

/// (`Setup::young`) how long nodes that start with uptime 0 are quarantined for some client, in
/// world time: a client's first request comes within `MAX_THINK`, its connect and handshake
/// within four one-way deliveries (each a link's base of at most 2 ms, its jitter, and at
/// worst a rare delay spike: 62.2 ms each), then a window of its clock.
const YOUNG_SPAN: u64 = MAX_THINK + 4 * (LINK_BASE.end + JITTER.end + SPIKE.end) + QUARANTINE_SPAN;

/// The random plan's faults, and evictions, begin within the first 4 s of world time (a run of
/// the default hundred operations lasts about 6 s).
const FAULT_WINDOW: u64 = 4_000 * MS;
/// How many faults the random plan draws: a few without a break (or with
/// `Break::MajorityDown`, whose outage is planned apart), more with one.
const FEW_FAULTS: Range<u64> = 0..6;
const MORE_FAULTS: Range<u64> = 3..10;
/// How long the random plan's faults last (ns), from a blip to a few TTLs (500 ms): a node's
/// pause, a crashed node's time down, a partition, a client's pause, a slow link.
const NODE_PAUSE: Range<u64> = 10 * MS..2_000 * MS;
const NODE_DOWN: Range<u64> = 0..1_000 * MS;
const PARTITION: Range<u64> = 10 * MS..3_000 * MS;
const CLIENT_PAUSE: Range<u64> = 10 * MS..1_500 * MS;
const SLOW_LINK: Range<u64> = 100 * MS..2_000 * MS;
/// (`Break::Quarantine`, `Break::RunIdOnYesOnly`, `Break::UptimeAtItsWord`) a node down for a
/// moment, back while the locks whose keys it lost still live.
const QUICK_RESTART: Range<u64> = 0..100 * MS;
/// (`Break::WorkPastValidity`) clients paused for about a validity or longer.
const LONG_CLIENT_PAUSE: Range<u64> = 300 * MS..1_500 * MS;
/// (`Break::LedgerUnpaced`) nodes away long enough for several callers' releases to pile up
/// for them: paused, down, or cut from a client.
const LEDGER_NODE_PAUSE: Range<u64> = 500 * MS..2_500 * MS;
const LEDGER_NODE_DOWN: Range<u64> = 200 * MS..1_000 * MS;
const LEDGER_PARTITION: Range<u64> = 500 * MS..3_000 * MS;
/// (`Break::RunIdOnYesOnly`) replacements begin after this, when every client has met every
/// node.
const REPLACED_AFTER: u64 = 300 * MS;
/// (`Break::FenceMajorityBlank`) when the majority restarts, and how long each node of it is
/// down.
const BLANK_RESTART: Range<u64> = 200 * MS..600 * MS;
const BLANK_DOWN: Range<u64> = 0..300 * MS;
/// (`Break::HalfOpen`) how many times the flows to a majority are dropped.
const FLOW_DROPS: Range<u64> = 1..4;
/// (`Break::EvictionCounted`) how many times memory pressure comes to each evicting node.
const EVICTIONS: Range<u64> = 5..30;
/// (`Break::UptimeAtItsWord`) when the rolling restart begins, and the pause before each
/// next node goes down.
const ROLLING_START: Range<u64> = 300 * MS..2_000 * MS;
const ROLLING_GAP: Range<u64> = 0..50 * MS;
/// A restart keeps an older snapshot of the fence counter as many as this many fences behind
/// (drawn from 1).
const SNAPSHOT_LAG: Range<u64> = 1..5;

impl World {
    /// (`Setup::young`) every node in its quarantine from the start until a window after the
    /// last client's first contact: no progress owed meanwhile.
    pub(super) fn young_nodes_quarantined(&mut self) {
        for node in 0..NODES {
            self.record.node_faults.push((node, 0, YOUNG_SPAN));
        }
        self.record.changes.push(YOUNG_SPAN);
    }

    /// Plans the schedule's faults, by the break it runs: the random plan, or a break's own.
    pub(super) fn plan_faults(&mut self) {
        if self.setup.broken(Break::MajorityDown) {
            // Down from the start until after the run (it ends after its lock operations).
            for node in 0..NODES / 2 + 1 {
                self.at(0, EvKind::NodeCrash(node, TIME_LIMIT));
            }
        }
        if !self.setup.faults {
            return;
        }
        match self.setup.breaks {
            // Frozen from the start until after the run, and nothing else.
            b if b.contention() => self.at(0, EvKind::NodePause(0, TIME_LIMIT)),
            Break::FenceMajorityBlank => self.majority_restarts_blank(),
            Break::UptimeAtItsWord => self.rolling_restart(),
            Break::EvictionCounted => self.memory_pressure(),
            Break::HalfOpen => self.flows_dropped(),
            _ => self.random_faults(),
        }
    }

    /// (`Break::FenceMajorityBlank`) a majority restarts at once, its counters lost, and
    /// nothing else goes wrong.
    fn majority_restarts_blank(&mut self) {
        let t = self.rng.within(BLANK_RESTART);
        let mut back = 0;
        for node in 0..NODES / 2 + 1 {
            let d = self.rng.within(BLANK_DOWN);
            back = back.max(t + d);
            self.at(t, EvKind::NodeCrash(node, d));
        }
        let healed = back + QUARANTINE_SPAN;
        self.healed_at = Some(healed);
        if self.setup.control {
            // The operator repairs once every node is back (and retries until it works).
            self.at(healed, EvKind::Operator);
        }
    }

    /// (`Break::HalfOpen`) now and then a middlebox drops the flows to a majority of the
    /// nodes: every client's connections to them go half open at once, and nothing else goes
    /// wrong.
    fn flows_dropped(&mut self) {
        for _ in 0..self.rng.within(FLOW_DROPS) {
            let t = self.rng.range(0, FAULT_WINDOW);
            let first = self.rng.range(0, NODES as u64) as usize;
            for i in 0..NODES / 2 + 1 {
                for client in 0..self.clients.len() {
                    self.at(t, EvKind::HalfOpen(client, (first + i) % NODES));
                }
            }
        }
    }

    /// (`Break::EvictionCounted`) memory pressure now and then on each evicting node, and
    /// nothing else.
    fn memory_pressure(&mut self) {
        for node in 0..NODES {
            if !self.nodes[node].node.evicting {
                continue;
            }
            for _ in 0..self.rng.within(EVICTIONS) {
                let t = self.rng.range(0, FAULT_WINDOW);
                self.at(t, EvKind::Evict(node));
            }
        }
    }

    /// Faults at random times in the first seconds: a few of every kind, or many of the kinds
    /// the break is about.
    fn random_faults(&mut self) {
        let n_clients = self.clients.len();
        let count = match self.setup.breaks {
            Break::Nothing | Break::MajorityDown => self.rng.within(FEW_FAULTS),
            _ => self.rng.within(MORE_FAULTS),
        };
        for _ in 0..count {
            let t = self.rng.range(0, FAULT_WINDOW);
            // Replacements after every client has met every node: one that meets a node first
            // after it was replaced by a process up for long cannot tell (docs/guarantees.md, "What it assumes").
            // The window is mapped onto its part after `REPLACED_AFTER` (its last 37/40).
            let t = match self.setup.breaks {
                Break::RunIdOnYesOnly => REPLACED_AFTER + t * 37 / 40,
                _ => t,
            };
            let node = self.rng.range(0, NODES as u64) as usize;
            let client = self.rng.range(0, n_clients as u64) as usize;
            let kind = self.random_fault(node, client);
            self.at(t, kind);
        }
    }

    /// A fault of `node`, `client` or their link, of a kind the break is about (any, without
    /// one), with its duration.
    fn random_fault(&mut self, node: usize, client: usize) -> EvKind {
        let crashes = self.setup.breaks == Break::FenceBlankAsZero;
        match self.setup.breaks {
            Break::Quarantine | Break::RunIdOnYesOnly => {
                EvKind::NodeCrash(node, self.rng.within(QUICK_RESTART))
            }
            // Restarts, and clients cut from the nodes that still hold the highest fence.
            _ if crashes && self.rng.chance(50) => {
                EvKind::NodeCrash(node, self.rng.within(NODE_DOWN))
            }
            _ if crashes => EvKind::Partition(client, node, self.rng.within(PARTITION)),
            Break::WorkPastValidity => {
                EvKind::ClientPause(client, self.rng.within(LONG_CLIENT_PAUSE))
            }
            // Nodes away while callers release, then back to a ledger that outgrew
            // max_pending.
            Break::LedgerUnpaced => match self.rng.range(0, 3) {
                0 => EvKind::NodePause(node, self.rng.within(LEDGER_NODE_PAUSE)),
                1 => EvKind::NodeCrash(node, self.rng.within(LEDGER_NODE_DOWN)),
                _ => EvKind::Partition(client, node, self.rng.within(LEDGER_PARTITION)),
            },
            _ => match self.rng.range(0, 7) {
                0 => EvKind::NodePause(node, self.rng.within(NODE_PAUSE)),
                1 => EvKind::NodeCrash(node, self.rng.within(NODE_DOWN)),
                2 => EvKind::ConnReset(client, node),
                3 => EvKind::Partition(client, node, self.rng.within(PARTITION)),
                4 => EvKind::ClientPause(client, self.rng.within(CLIENT_PAUSE)),
                5 => EvKind::ScriptFlush(node),
                _ => EvKind::SlowLink(client, node, self.rng.within(SLOW_LINK)),
            },
        }
    }

    /// (`Break::UptimeAtItsWord`) three to five nodes restart one after another, each down
    /// for a moment; every client but the first starts within a TTL after the last is back,
    /// so that it sees those nodes for the first time while they are younger than the
    /// quarantine's window (a process deployed beside the servers' rolling restart).
    fn rolling_restart(&mut self) {
        let mut t = self.rng.within(ROLLING_START);
        let k = self.rng.range(3, NODES as u64 + 1) as usize;
        let first = self.rng.range(0, NODES as u64) as usize;
        let mut back = 0;
        for i in 0..k {
            let d = self.rng.within(QUICK_RESTART);
            self.at(t, EvKind::NodeCrash((first + i) % NODES, d));
            back = back.max(t + d);
            t += self.rng.within(ROLLING_GAP);
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
    fn fault_on(&mut self, node: Option<usize>, client: Option<usize>, d: u64) {
        self.record.changes.push(self.g);
        self.record.changes.push(self.g + d);
        if let Some(n) = node
            && d > 0
        {
            self.record.node_faults.push((n, self.g, self.g + d));
        }
        self.record.link_faults.push((client, node, d));
    }

    /// Fencing's assumption (see docs/fencing.md): at every moment a majority of the nodes
    /// holds a seeded counter (once any does). True if crashing `node` now would break it.
    fn fence_assumption_needs(&self, node: usize) -> bool {
        let seeded = |i: usize| !self.nodes[i].down && self.nodes[i].node.fence_seeded();
        let count = (0..NODES).filter(|&i| seeded(i)).count();
        count > 0 && seeded(node) && count - 1 < NODES / 2 + 1
    }

    /// A node pauses for `d`: its clock runs on, what reaches it waits. Not one that is down
    /// or paused already.
    pub(super) fn pause_node(&mut self, node: usize, d: u64) {
        if self.nodes[node].down || self.nodes[node].paused {
            return;
        }
        self.report.faults[0] += 1;
        self.fault_on(Some(node), None, d);
        self.log(|| format!("node {node} paused for {} ms", d / MS));
        self.nodes[node].paused = true;
        self.at(self.g + d, EvKind::NodeResume(node));
    }

    /// A paused node resumes and takes what reached it meanwhile, in order.
    pub(super) fn resume_node(&mut self, node: usize) {
        if !self.nodes[node].paused {
            return;
        }
        self.log(|| format!("node {node} resumes"));
        self.nodes[node].paused = false;
        for ev in std::mem::take(&mut self.nodes[node].deferred) {
            self.at_node(ev);
        }
    }

    /// A node crashes for `d`: its keys lost, its connections reset, a new incarnation. Not
    /// where a fenced run would lose fencing's assumption by it (see
    /// [`World::fence_assumption_needs`]).
    pub(super) fn crash_node(&mut self, node: usize, d: u64) {
        if self.nodes[node].down {
            return;
        }
        let kept = self.setup.breaks != Break::FenceMajorityBlank;
        if self.fencing && kept && self.fence_assumption_needs(node) {
            self.log(|| {
                format!("node {node} would crash: skipped, a majority of counters would be blank")
            });
            return;
        }
        self.report.faults[1] += 1;
        self.fault_on(Some(node), None, d);
        // Then quarantined for a TTL of its clock after its restart.
        let quarantine = QUARANTINE_SPAN;
        self.record
            .node_faults
            .push((node, self.g, self.g + d + quarantine));
        self.record.changes.push(self.g + d + quarantine);
        self.log(|| format!("node {node} crashes, restarts in {} ms", d / MS));
        let state = &mut self.nodes[node];
        state.down = true;
        state.paused = false;
        state.deferred.clear();
        state.incarnation += 1;
        let dead: Vec<(u64, usize)> = self
            .conns
            .iter_mut()
            .filter(|(_, c)| c.node == node && c.alive)
            .map(|(id, c)| {
                c.alive = false;
                (id, c.client)
            })
            .collect();
        for (conn, client) in dead {
            self.reset(conn, client, node);
        }
        self.at(self.g + d, EvKind::NodeRestart(node));
    }

    /// A crashed node restarts empty as a new process (a new `run_id`), with what its
    /// persistence kept of the fence counter.
    pub(super) fn restart_node(&mut self, node: usize) {
        let id = run_id(&mut self.rng);
        // The fence counter: lost, kept, or an older snapshot of it.
        // (Drawn in fenced runs only: the others replay as before fencing existed.)
        let persist = match self.fencing.then(|| self.rng.range(0, 3)) {
            _ if self.setup.breaks == Break::FenceMajorityBlank => Persist::Nothing,
            None | Some(0) => Persist::Nothing,
            Some(1) => Persist::All,
            Some(_) => Persist::Snapshot(self.rng.within(SNAPSHOT_LAG)),
        };
        // Another process that has been up an hour takes the address over (a
        // failover), or this one starts again.
        let age = match self.setup.breaks {
            Break::RunIdOnYesOnly => LONG_UP,
            _ => 0,
        };
        let state = &mut self.nodes[node];
        let now = state.clock.local_ns(self.g);
        state.node.restart(id, now - age, persist);
        state.down = false;
        self.log(|| format!("node {node} restarted empty (fence counter: {persist:?})"));
    }

    /// The connection of a client to a node, if one is up, is reset.
    pub(super) fn reset_conn(&mut self, client: usize, node: usize) {
        if let Some(conn) = self.drop_conn(client, node, "reset") {
            self.reset(conn, client, node);
        }
    }

    /// (`Break::HalfOpen`) the connection of a client to a node, if one is up, goes half open:
    /// the node forgets it (as a middlebox that dropped the flow, or a host that vanished,
    /// would leave it), the client is not told, and what either side sends on it is lost. Only
    /// a timeout of the client's tells it; a new connection works. Counted with the resets.
    pub(super) fn half_open(&mut self, client: usize, node: usize) {
        self.drop_conn(client, node, "half open");
    }

    /// The node's side of the connection of a client to a node, if one is up, is gone: the
    /// fault recorded (with the resets) and logged as `what`. The client is not told here.
    fn drop_conn(&mut self, client: usize, node: usize, what: &str) -> Option<u64> {
        let conn = self
            .conns
            .iter_mut()
            .find(|(_, c)| c.client == client && c.node == node && c.alive)
            .map(|(id, c)| {
                c.alive = false;
                id
            })?;
        self.nodes[node].node.forget(conn);
        self.report.faults[2] += 1;
        self.fault_on(Some(node), Some(client), 0);
        self.log(|| format!("connection client {client} - node {node} {what}"));
        Some(conn)
    }

    /// A client is cut from a node for `d`: messages held, and delivered when it heals.
    pub(super) fn partition(&mut self, client: usize, node: usize, d: u64) {
        self.report.faults[3] += 1;
        self.fault_on(Some(node), Some(client), d);
        self.log(|| format!("client {client} cut from node {node} for {} ms", d / MS));
        let until = self.g + d;
        let link = self.link(client, node);
        link.blocked_until = link.blocked_until.max(until);
    }

    /// The link between a client and a node is slow for `d`: each message delayed more.
    pub(super) fn slow_link(&mut self, client: usize, node: usize, d: u64) {
        self.report.faults[6] += 1;
        self.fault_on(Some(node), Some(client), d);
        self.log(|| format!("link client {client} - node {node} slow for {} ms", d / MS));
        let until = self.g + d;
        self.link(client, node).slow_until = until;
    }

    /// A client pauses for `d` (a GC pause): what reaches it waits. Not one that is paused
    /// already, or whose callers are all done.
    pub(super) fn pause_client(&mut self, c: usize, d: u64) {
        if self.clients[c].paused_until.is_some()
            || self.clients[c]
                .callers
                .iter()
                .all(|k| matches!(k.work, Work::Done))
        {
            return;
        }
        self.report.faults[4] += 1;
        self.fault_on(None, Some(c), d);
        self.record.client_pauses.push((c, self.g, self.g + d));
        self.log(|| format!("client {c} paused for {} ms", d / MS));
        self.clients[c].paused_until = Some(self.g + d);
        self.at(self.g + d, EvKind::ClientResume(c));
    }

    /// A paused client resumes, takes in what reached it meanwhile and runs.
    pub(super) fn resume_client(&mut self, c: usize) {
        self.log(|| format!("client {c} resumes"));
        self.clients[c].paused_until = None;
        for ev in std::mem::take(&mut self.clients[c].deferred) {
            if let EvKind::ToClient {
                client,
                node,
                conn,
                what,
            } = ev.kind
            {
                self.clients[client].engine.net.deliver(node, conn, what);
            }
        }
        self.clients[c].wake = None;
        self.poke(c);
    }

    /// `SCRIPT FLUSH` on a node: the scripts it cached are forgotten.
    pub(super) fn flush_scripts(&mut self, node: usize) {
        self.report.faults[5] += 1;
        self.record.changes.push(self.g);
        self.log(|| format!("node {node}: SCRIPT FLUSH"));
        self.nodes[node].node.flush_scripts();
    }

    /// Memory pressure on an evicting node: the key closest to expiring goes.
    pub(super) fn evict(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        let now = state.clock.local_ns(self.g);
        if !state.down && state.node.evict(now) {
            self.log(|| format!("node {node}: evicted a key"));
        }
    }
}
