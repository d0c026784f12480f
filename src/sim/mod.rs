//! Deterministic simulation (issue 16): the crate's real decision code — the engine, its
//! `Round`s and one real `Session` per node and client — in a simulated world with virtual
//! time, where a seed replays a run exactly.
//!
//! The world has N simulated Redis nodes (`node.rs`), C client processes each with its own
//! engine over a `SimNet` (`client_net.rs`), links with a delay drawn per message (FIFO per
//! connection, like TCP), and faults: node pauses (the node's clock runs on), crashes with all
//! keys lost and a new `run_id`, connection resets, partitions that heal (messages held, as TCP
//! retransmits them), `SCRIPT FLUSH`, client pauses ("GC pauses") and per-process clock rates.
//! Clients contend for a few resources with random hold times and extends.
//!
//! The checker works in world time: for each resource, the intervals during which a client
//! *believes* it holds the lock — from the outcome of its acquire until it sends the release or
//! its own clock reaches the lock's validity, whichever is first — must never overlap. A run
//! that breaks one of the README's assumptions ([`Break`]) is expected to find violations; one
//! that keeps them, never.
//!
//! Not a public API: behind the `sim` feature, for `tests/sim.rs` and `examples/sim.rs`.

mod checkers;
mod client_net;
mod clock;
mod network;
mod node;
mod report;
mod rng;
mod setup;

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Builder, Config, Quarantine, Shared};
use crate::engine::{Engine, Slab, Waiter};
use crate::kept::Kept;
use crate::lock::Lock;
use crate::mailbox::Slot;
use crate::request::{OpId, Outcome, ReqKind};
use crate::token::Token;

use client_net::{Inbound, SimNet};
use network::{Conns, Link, WConn};
use node::{Node, Persist};

pub use checkers::{DEADLINE_SLACK, PROGRESS_FLOOR, WAIT_BOUND, connects_allowed};
use checkers::{check_counted, check_fences, check_overlaps, check_readers};
use clock::{Clock, MS};
pub use report::{
    ConnectViolation, CoverViolation, FAULT_KINDS, FenceViolation, LateWait, LivenessViolation,
    ProgressViolation, Report, Violation,
};
use rng::Rng;
use setup::{
    BACKOFF_MAX, BACKOFF_MIN, CONNECT_TIMEOUT, MAX_CALLERS, MOST_CLIENTS, NODE_TIMEOUT, NODES,
    REPLY_TIMEOUT, RETRY_DELAY, RETRY_JITTER, SMALL_MAX_PENDING,
};
pub use setup::{Break, COUNTER_PERMITS, CROWD, Setup, TTL};

/// Lock operations of a `Break::WaitForSilent` run: long enough that the first node timeout
/// of each client (before it knows the frozen node for silent) is a small part of it.
const CONTENTION_OPS: u64 = 2_000;

/// A client pauses up to this long (in ns) between its locks: short against the TTL, so locks
/// contend, long enough that the clients' attempts interleave.
const MAX_THINK: u64 = 20 * MS;

/// What a client is doing.
enum Work {
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
struct Hold {
    res: usize,
    token: Token,
    /// The nodes that back its validity (`Lock::backing`).
    backing: u64,
    valid: Instant,
    until: Instant,
    start_g: u64,
    extensions: u32,
    fence: u64,
}

struct Keeping {
    kept: Arc<Kept>,
    res: usize,
    until: Instant,
    /// Start of the belief interval while the holder believes (`is_held()` would say yes).
    open: Option<u64>,
    fence: u64,
    /// The latest validity the cover check saw (`World::check_cover`).
    checked: Instant,
}

/// One caller of a client's engine (a thread or task of the process), wanting one resource
/// at a time until it gets it.
struct Caller {
    work: Work,
    /// The resource it wants, and since when (world time): from its first attempt until one
    /// wins, across refusals, failures and waits that time out.
    want: Option<(usize, u64)>,
}

struct Client {
    engine: Engine<SimNet>,
    clock: Clock,
    /// The process's callers, sharing its engine.
    callers: Vec<Caller>,
    /// World time of the wake event planned (stale events are skipped).
    wake: Option<u64>,
    /// The last wake asked for on the client's clock, and in world time: the same deadline
    /// comes back poke after poke, and the conversion is a costly part of a poke.
    wake_of: Option<(Instant, u64)>,
    paused_until: Option<u64>,
    deferred: Vec<Ev>,
    /// Goes on as holder after its validity ended (breaks "work within validity").
    ignores_validity: bool,
}

struct NodeState {
    node: Node,
    clock: Clock,
    down: bool,
    paused: bool,
    deferred: Vec<Ev>,
    incarnation: u64,
}

#[derive(Debug)]
enum EvKind {
    ClientWake(usize),
    ConnArrive {
        conn: u64,
        client: usize,
        node: usize,
    },
    ToNode {
        conn: u64,
        bytes: Vec<u8>,
    },
    NodeClose {
        conn: u64,
    },
    ToClient {
        client: usize,
        node: usize,
        conn: u64,
        what: Inbound,
    },
    NodePause(usize, u64),
    NodeResume(usize),
    NodeCrash(usize, u64),
    NodeRestart(usize),
    ConnReset(usize, usize),
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

#[derive(Debug)]
struct Ev {
    t: u64,
    kind: EvKind,
}

/// A restarted node's quarantine, in world time: a TTL on its clock, which may run 0.49 %
/// slow, and a millisecond for the uptime's rounding.
const QUARANTINE_SPAN: u64 = TTL.as_nanos() as u64 * 10_049 / 10_000 + MS;

/// (`Setup::young`) how long nodes that start with uptime 0 are quarantined for some client, in
/// world time: a client's first request comes within `MAX_THINK`, its connect and handshake
/// within four one-way deliveries (each a link's base of at most 2 ms, its jitter, and at
/// worst a rare delay spike: 62.2 ms each), then a window of its clock.
const YOUNG_SPAN: u64 = MAX_THINK + 4 * (62 * MS + MS / 5) + QUARANTINE_SPAN;

/// A run that has not finished after this much world time has stalled.
const TIME_LIMIT: u64 = 600_000 * MS;
const EVENT_LIMIT: u64 = 2_000_000;

/// An event's key in the queue is its time, its sequence number and its slot in one number
/// (ordered as the time, then the sequence number: compared at once, it is the cheaper heap):
/// 64 bits of time, then these for the sequence number (a schedule stops at `EVENT_LIMIT`
/// events, each of which plans a few) and for the slot (of the events planned at once).
const SEQ_BITS: u32 = 40;
const SLOT_BITS: u32 = 64 - SEQ_BITS;

struct World {
    rng: Rng,
    g: u64,
    seq: u64,
    /// The events planned, by (time, sequence number), with their slot in `planned`: a heap
    /// of small keys (the events themselves, some large, stay where they were put), each one
    /// number (see `SEQ_BITS`).
    queue: BinaryHeap<Reverse<u128>>,
    planned: Vec<Option<EvKind>>,
    /// Slots of `planned` free for the next events.
    free_slots: Vec<u32>,
    base: Instant,
    shared: Arc<Shared>,
    clients: Vec<Client>,
    nodes: Vec<NodeState>,
    conns: Conns,
    links: Vec<Link>,
    resources: Vec<Vec<u8>>,
    /// Each resource's plain members: itself, or a set's (see `Setup::sets`), or the one
    /// a shared lock is of.
    members: Vec<Vec<usize>>,
    /// Which resources are shared (read) locks (see `Setup::shared`).
    shared_of: Vec<bool>,
    /// Callers take shared locks only (`Break::CounterSemaphore`: the shared locks stand for
    /// the counted permits, with the nodes' cap).
    only_shared: bool,
    /// (resource, client, start, end) of every reader's belief (checked against `beliefs`,
    /// the exclusive holders').
    shared_beliefs: Vec<(usize, usize, u64, u64)>,
    /// (resource, client, start, end) of every belief interval that ended, and its fence.
    beliefs: Vec<(usize, usize, u64, u64)>,
    belief_fences: Vec<u64>,
    /// (start, end, fence, client) of every acquisition that got a fence.
    acquisitions: Vec<(u64, u64, u64, usize)>,
    setup: Setup,
    /// Fenced acquires (the setup's, or a fence break's).
    fencing: bool,
    report: Report,
    trace: Option<String>,
    args: Vec<(usize, usize)>,
    /// Buffers of messages the nodes read, for their replies (see `net::recycle`).
    spare: Vec<Vec<u8>>,
    /// Every want that ended (granted or given up).
    wants: Vec<Want>,
    /// World times at which a fault began or ended (the liveness check's clock restarts).
    changes: Vec<u64>,
    /// (node, from, to): a node down, paused, in its restart quarantine, or cut from or slow
    /// towards some client. While a majority is, no progress is owed.
    node_faults: Vec<(usize, u64, u64)>,
    /// (client, from, to): a client paused; its own wants owe nothing then.
    client_pauses: Vec<(usize, u64, u64)>,
    /// (client, node, duration): faults that may make a client reconnect to a node (`None`:
    /// every client, or every node).
    link_faults: Vec<(Option<usize>, Option<usize>, u64)>,
    /// Connects by (client × NODES + node).
    connects: Vec<u64>,
    /// (`Break::FenceMajorityBlank`) when the restarted majority is back and out of its
    /// quarantine, and the operator's repair in flight.
    healed_at: Option<u64>,
    repair: Option<OpId>,
    /// Callers in all, and those whose work is `Done` (a caller never leaves `Done`).
    callers: usize,
    done_callers: usize,
}

/// A caller's want of a resource, from its first attempt until it was granted (or given up).
#[derive(Debug, Clone, Copy)]
struct Want {
    res: usize,
    client: usize,
    caller: usize,
    start: u64,
    end: u64,
}

/// Operation slots kept per thread for the next schedules' engines, at most: a contention
/// run's eight clients and its baseline's.
const KEPT_SLABS: usize = 2 * MOST_CLIENTS as usize;

thread_local! {
    /// The operation slots of this thread's engines that are gone, for the next ones to build
    /// theirs in (see `Slab`): building them new and dropping them was 3 % of a schedule's
    /// instructions.
    static SLABS: RefCell<Vec<Slab>> = const { RefCell::new(Vec::new()) };
}

/// Runs one schedule; `trace` collects a readable log of what happened.
pub fn run(seed: u64, setup: Setup, trace: Option<&mut String>) -> Report {
    let mut world = World::new(seed, setup, trace.is_some());
    world.run();
    for client in &world.clients {
        let shared = &client.engine.shared;
        world.report.renewals.0 += shared
            .keep_extended
            .load(std::sync::atomic::Ordering::Relaxed);
        world.report.renewals.1 += shared
            .keep_retried
            .load(std::sync::atomic::Ordering::Relaxed);
    }
    if setup.breaks.contention() && setup.faults {
        // The same schedule with every node up: its grants per second are the measure.
        let healthy = run(
            seed,
            Setup {
                faults: false,
                ..setup
            },
            None,
        );
        // A baseline that stalled would lower the bar: a stall of the schedule.
        world.report.stalled |= healthy.stalled;
        let frozen = &world.report;
        let rate = |r: &Report| r.acquired as f64 / r.sim_time.as_secs_f64().max(1e-9);
        world.report.progress_ratio = Some(rate(frozen) / rate(&healthy).max(1e-9));
        let frozen = &world.report;
        if rate(frozen) < PROGRESS_FLOOR * rate(&healthy) {
            let v = ProgressViolation {
                frozen: (frozen.acquired, frozen.sim_time),
                healthy: (healthy.acquired, healthy.sim_time),
            };
            world.log(|| format!("PROGRESS VIOLATION {v:?}"));
            world.report.progress = Some(v);
        }
    }
    if let (Some(out), Some(t)) = (trace, world.trace.take()) {
        *out = t;
    }
    for client in world.clients.drain(..) {
        let slab = client.engine.into_slab();
        SLABS.with_borrow_mut(|kept| {
            if kept.len() < KEPT_SLABS {
                kept.push(slab);
            }
        });
    }
    world.report
}

impl World {
    fn new(seed: u64, setup: Setup, tracing: bool) -> World {
        let mut rng = Rng(seed);
        let broken = |b: Break| setup.breaks == b && !setup.control;
        let fencing = setup.fencing || setup.breaks.needs_fencing();
        let young = setup.young && setup.breaks.contention();
        let quarantine = if broken(Break::Quarantine) {
            Quarantine::Off
        } else {
            Quarantine::Ttl
        };
        // Some runs with room for only a few requests per connection: more releases outstanding
        // than that when a node comes back (issue 36, item 1).
        let small = matches!(setup.breaks, Break::LedgerUnpaced | Break::FailWhenFull);
        let max_pending = if small || rng.chance(30) {
            SMALL_MAX_PENDING
        } else {
            Config::default().max_pending
        };
        let config = Config {
            max_pending,
            ..Config::default()
        };
        let shared = Builder::new((0..NODES).map(|i| format!("redis://127.0.0.1:{}", 7000 + i)))
            .config(config)
            .ttl(TTL)
            .retry_delay(RETRY_DELAY, RETRY_JITTER)
            .connect_timeout(CONNECT_TIMEOUT)
            .backoff(BACKOFF_MIN, BACKOFF_MAX)
            .reply_timeout(REPLY_TIMEOUT)
            .quarantine(quarantine)
            .fencing(fencing)
            .shared()
            .expect("the simulation's settings are valid");
        let mut shared = shared;
        if !setup.control {
            let shared = Arc::get_mut(&mut shared).expect("not shared yet");
            shared.mutation = setup.breaks.mutation();
            shared.conn.mutation = shared.mutation;
            if setup.breaks == Break::NoDriftAllowance {
                shared.config.drift_factor = 0.0;
            }
            if setup.breaks == Break::EvictionCounted {
                shared.config.evicting_servers = crate::EvictingServers::CountUnsafely;
            }
        }
        let base = Instant::now();
        // The drift factor is 1 %: every clock within ±0.49 % of world time keeps any two
        // within the factor (see the README's Reliability section).
        let ppm_bound = if broken(Break::ClockDrift) {
            50_000
        } else {
            4_900
        };
        let clock = |rng: &mut Rng| Clock {
            ppm: rng.range(0, 2 * ppm_bound + 1) as i64 - ppm_bound as i64,
        };
        let n_clients = match setup.breaks {
            b if b.contention() && setup.crowd => 1,
            // `redlock demo`'s eight handles.
            b if b.contention() => MOST_CLIENTS as usize,
            _ => rng.range(3, 6) as usize,
        };
        let mut clients = Vec::with_capacity(n_clients);
        for c in 0..n_clients {
            let clock = clock(&mut rng);
            let now = base + Duration::from_nanos(clock.local_ns(0));
            let net = SimNet::new(c, &shared.nodes, &shared.conn, now);
            let slab = SLABS.with_borrow_mut(|kept| kept.pop()).unwrap_or_default();
            let mut engine = Engine::with_slab(shared.clone(), net, now, slab);
            // The waits' pauses replay with the schedule.
            engine.seed(rng.next());
            let callers = rng.range(1, MAX_CALLERS + 1);
            let callers = match setup.crowd && setup.breaks.contention() {
                true => CROWD,
                false => callers,
            };
            let callers = (0..callers)
                .map(|_| Caller {
                    work: Work::Idle {
                        until: now + Duration::from_nanos(rng.range(0, MAX_THINK)),
                    },
                    want: None,
                })
                .collect();
            clients.push(Client {
                engine,
                clock,
                callers,
                wake: None,
                wake_of: None,
                paused_until: None,
                deferred: Vec::new(),
                ignores_validity: broken(Break::WorkPastValidity),
            });
        }
        // Half the runs with release notices (pub/sub: waiters woken by releases at once,
        // which is where contention with a frozen node once collapsed); the others poll, as
        // clients of servers whose ACL refuses the channel. (Notices fan out: a run with them
        // is about 2.6 times the events.)
        let pubsub = rng.chance(50) || setup.breaks == Break::NoticeHerd;
        let mut nodes = Vec::with_capacity(NODES);
        for i in 0..NODES {
            let clock = clock(&mut rng);
            // Up for an hour (not quarantined), or just started.
            let age = if young { 0 } else { 3_600_000 * MS };
            let mut node = Node::new(run_id(&mut rng), clock.local_ns(0) - age);
            node.lying = broken(Break::LyingNode) && i == 0;
            node.set_first_only = broken(Break::SetNotAllOrNone);
            node.reader_ignores_writer = broken(Break::ReaderIgnoresWriter);
            node.reader_cap = broken(Break::CounterSemaphore).then_some(COUNTER_PERMITS);
            node.pubsub = pubsub;
            node.evicting =
                setup.breaks == Break::EvictionCounted && i < if setup.control { 2 } else { 3 };
            nodes.push(NodeState {
                node,
                clock,
                down: false,
                paused: false,
                deferred: Vec::new(),
                incarnation: 0,
            });
        }
        let links = (0..n_clients * NODES)
            .map(|_| Link {
                base: rng.range(50_000, 2 * MS),
                blocked_until: 0,
                slow_until: 0,
            })
            .collect();
        let sets = setup.sets || setup.breaks == Break::SetNotAllOrNone;
        let plain = match rng.range(1, 4) {
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
                let set = crate::keys::encode_set(&names, |_| Ok(())).expect("a valid set");
                resources.push(set);
                members.push(group);
            }
        }
        // With readers, each plain resource's shared lock.
        let mut shared_of = vec![false; resources.len()];
        let counter = setup.breaks == Break::CounterSemaphore;
        if setup.shared || setup.breaks == Break::ReaderIgnoresWriter || counter {
            for r in 0..plain {
                let mut name = crate::keys::SHARED_PREFIX.as_bytes().to_vec();
                name.extend_from_slice(&resources[r]);
                resources.push(name);
                members.push(vec![r]);
                shared_of.push(true);
            }
        }
        let mut world = World {
            rng,
            g: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            planned: Vec::new(),
            free_slots: Vec::new(),
            base,
            shared,
            clients,
            nodes,
            conns: Conns::default(),
            links,
            resources,
            members,
            shared_of,
            only_shared: counter,
            shared_beliefs: Vec::new(),
            beliefs: Vec::new(),
            belief_fences: Vec::new(),
            acquisitions: Vec::new(),
            fencing,
            setup,
            report: Report {
                seed,
                ..Report::default()
            },
            trace: tracing.then(String::new),
            args: Vec::new(),
            spare: Vec::new(),
            wants: Vec::new(),
            changes: Vec::new(),
            node_faults: Vec::new(),
            client_pauses: Vec::new(),
            link_faults: Vec::new(),
            connects: vec![0; n_clients * NODES],
            healed_at: None,
            repair: None,
            callers: 0,
            done_callers: 0,
        };
        world.callers = world.clients.iter().map(|c| c.callers.len()).sum();
        if young {
            // Every node in its quarantine from the start until a window after the last
            // client's first contact: no progress owed meanwhile.
            for node in 0..NODES {
                world.node_faults.push((node, 0, YOUNG_SPAN));
            }
            world.changes.push(YOUNG_SPAN);
        }
        world.plan_faults();
        for c in 0..n_clients {
            world.poke(c);
        }
        world
    }

    fn log(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            let _ = writeln!(t, "{:>12.6} ms  {}", self.g as f64 / MS as f64, what());
        }
    }

    fn at(&mut self, t: u64, kind: EvKind) {
        self.seq += 1;
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.planned[slot as usize] = Some(kind);
                slot
            }
            None => {
                self.planned.push(Some(kind));
                (self.planned.len() - 1) as u32
            }
        };
        assert!(
            self.seq < 1 << SEQ_BITS && slot < 1 << SLOT_BITS,
            "more events planned than an event's key holds"
        );
        let key = (u128::from(t) << 64) | (u128::from(self.seq) << SLOT_BITS) | u128::from(slot);
        self.queue.push(Reverse(key));
    }

    /// The next event planned (the earliest; of those at the same time, the first planned).
    fn next_event(&mut self) -> Option<Ev> {
        let Reverse(key) = self.queue.pop()?;
        let (t, slot) = ((key >> 64) as u64, (key as u32) & ((1 << SLOT_BITS) - 1));
        let kind = self.planned[slot as usize].take().expect("a planned event");
        self.free_slots.push(slot);
        Some(Ev { t, kind })
    }

    fn plan_faults(&mut self) {
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
    fn rolling_restart(&mut self) {
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

    fn run(&mut self) {
        while let Some(ev) = self.next_event() {
            if self.done_callers == self.callers {
                break;
            }
            self.report.events += 1;
            if ev.t > TIME_LIMIT || self.report.events > EVENT_LIMIT {
                self.report.stalled = true;
                break;
            }
            self.g = self.g.max(ev.t);
            self.handle(ev);
        }
        // Nothing left to happen while a caller still has work: a hang (an operation no timer
        // will end, an engine that asked for no wake) — found as a stall, not let through.
        if self
            .clients
            .iter()
            .any(|c| c.callers.iter().any(|k| !matches!(k.work, Work::Done)))
        {
            self.report.stalled = true;
            self.log(|| "STALLED: no event left while callers still have work".to_string());
        }
        // Holders still holding when the run ends believe until their validity.
        for c in 0..self.clients.len() {
            for k in 0..self.clients[c].callers.len() {
                let hold = match &self.clients[c].callers[k].work {
                    Work::Holding(h) | Work::Extending { hold: h, .. } => Some(*h),
                    _ => None,
                };
                if let Some(h) = hold {
                    self.end_belief(c, &h, u64::MAX);
                }
                if let Work::Keeping(k) = &self.clients[c].callers[k].work
                    && let Some(start) = k.open
                {
                    let (res, valid, fence) = (k.res, k.kept.valid_until(), k.fence);
                    let end = self.belief_end(c, valid, u64::MAX);
                    self.believed(c, res, start, end, fence);
                }
            }
        }
        self.report.sim_time = Duration::from_nanos(self.g);
        self.report.fence_violation =
            check_fences(&mut self.acquisitions, &self.beliefs, &self.belief_fences);
        if let Some(v) = self.report.fence_violation.clone() {
            self.log(|| format!("FENCE VIOLATION {v:?}"));
        }
        if self.healed_at.is_some_and(|h| self.g > h) && self.report.fenced_after_heal == 0 {
            self.report.stuck_blank = true;
            self.log(|| "STUCK: no lock granted after every node was back".to_string());
        }
        self.check_liveness();
        if let Some(v) = self.report.liveness.clone() {
            self.log(|| format!("LIVENESS VIOLATION {v:?}"));
        }
        self.check_connects();
        if let Some(v) = self.report.connect_violation.clone() {
            self.log(|| format!("RECONNECT VIOLATION {v:?}"));
        }
        let cap = (self.only_shared && !self.setup.control).then_some(COUNTER_PERMITS);
        self.report.violation = check_overlaps(&mut self.beliefs)
            .or_else(|| check_readers(&self.shared_beliefs, &self.beliefs))
            .or_else(|| cap.and_then(|p| check_counted(&mut self.shared_beliefs, p)));
        if let Some(v) = self.report.violation.clone() {
            self.log(|| format!("VIOLATION {v:?}"));
        }
    }

    /// A fault began now for `d` on a node (`None`: the client's every node), for a client
    /// (`None`: every client): the liveness check's clock restarts when it begins and ends.
    fn fault_on(&mut self, node: Option<usize>, client: Option<usize>, d: u64) {
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
    fn fence_assumption_needs(&self, node: usize) -> bool {
        let seeded = |i: usize| !self.nodes[i].down && self.nodes[i].node.fence_seeded();
        let count = (0..NODES).filter(|&i| seeded(i)).count();
        count > 0 && seeded(node) && count - 1 < NODES / 2 + 1
    }

    fn handle(&mut self, ev: Ev) {
        match ev.kind {
            EvKind::ClientWake(c) => {
                if self.clients[c].wake == Some(ev.t) {
                    self.clients[c].wake = None;
                    self.poke(c);
                }
            }
            EvKind::ToClient { client, .. } if self.clients[client].paused_until.is_some() => {
                self.clients[client].deferred.push(ev);
            }
            EvKind::ToClient {
                client,
                node,
                conn,
                what,
            } => {
                self.clients[client].engine.net.deliver(node, conn, what);
                self.poke(client);
            }
            EvKind::ConnArrive { conn, client, node } => {
                if self.nodes[node].down {
                    self.send_client(client, node, conn, Inbound::Refused, 0);
                } else {
                    let incarnation = self.nodes[node].incarnation;
                    let t = self.send_client(client, node, conn, Inbound::Connected, 0);
                    self.conns.insert(
                        conn,
                        WConn {
                            client,
                            node,
                            alive: true,
                            incarnation,
                            inbuf: Vec::new(),
                            up: 0,
                            down: t,
                        },
                    );
                }
            }
            EvKind::ToNode { conn, .. } | EvKind::NodeClose { conn } => {
                let Some(node) = self.conns.get(&conn).map(|c| c.node) else {
                    return;
                };
                if self.nodes[node].paused {
                    self.nodes[node].deferred.push(ev);
                } else {
                    self.at_node(ev);
                }
            }
            EvKind::NodePause(node, d) => {
                if self.nodes[node].down || self.nodes[node].paused {
                    return;
                }
                self.report.faults[0] += 1;
                self.fault_on(Some(node), None, d);
                self.log(|| format!("node {node} paused for {} ms", d / MS));
                self.nodes[node].paused = true;
                self.at(self.g + d, EvKind::NodeResume(node));
            }
            EvKind::NodeResume(node) => {
                if !self.nodes[node].paused {
                    return;
                }
                self.log(|| format!("node {node} resumes"));
                self.nodes[node].paused = false;
                for ev in std::mem::take(&mut self.nodes[node].deferred) {
                    self.at_node(ev);
                }
            }
            EvKind::NodeCrash(node, d) => {
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
                self.node_faults
                    .push((node, self.g, self.g + d + quarantine));
                self.changes.push(self.g + d + quarantine);
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
            EvKind::NodeRestart(node) => {
                let id = run_id(&mut self.rng);
                // The fence counter: lost, kept, or an older snapshot of it.
                // (Drawn in fenced runs only: the others replay as before fencing existed.)
                let persist = match self.fencing.then(|| self.rng.range(0, 3)) {
                    _ if self.setup.breaks == Break::FenceMajorityBlank => Persist::Nothing,
                    None | Some(0) => Persist::Nothing,
                    Some(1) => Persist::All,
                    Some(_) => Persist::Snapshot(self.rng.range(1, 5)),
                };
                // Another process that has been up an hour takes the address over (a
                // failover), or this one starts again.
                let age = match self.setup.breaks {
                    Break::RunIdOnYesOnly => 3_600_000 * MS,
                    _ => 0,
                };
                let state = &mut self.nodes[node];
                let now = state.clock.local_ns(self.g);
                state.node.restart(id, now - age, persist);
                state.down = false;
                self.log(|| format!("node {node} restarted empty (fence counter: {persist:?})"));
            }
            EvKind::ConnReset(client, node) => {
                let found = self
                    .conns
                    .iter_mut()
                    .find(|(_, c)| c.client == client && c.node == node && c.alive)
                    .map(|(id, c)| {
                        c.alive = false;
                        id
                    });
                if let Some(conn) = found {
                    self.nodes[node].node.forget(conn);
                    self.report.faults[2] += 1;
                    self.fault_on(Some(node), Some(client), 0);
                    self.log(|| format!("connection client {client} - node {node} reset"));
                    self.reset(conn, client, node);
                }
            }
            EvKind::Partition(client, node, d) => {
                self.report.faults[3] += 1;
                self.fault_on(Some(node), Some(client), d);
                self.log(|| format!("client {client} cut from node {node} for {} ms", d / MS));
                let until = self.g + d;
                let link = self.link(client, node);
                link.blocked_until = link.blocked_until.max(until);
            }
            EvKind::SlowLink(client, node, d) => {
                self.report.faults[6] += 1;
                self.fault_on(Some(node), Some(client), d);
                self.log(|| format!("link client {client} - node {node} slow for {} ms", d / MS));
                let until = self.g + d;
                self.link(client, node).slow_until = until;
            }
            EvKind::ClientPause(c, d) => {
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
                self.client_pauses.push((c, self.g, self.g + d));
                self.log(|| format!("client {c} paused for {} ms", d / MS));
                self.clients[c].paused_until = Some(self.g + d);
                self.at(self.g + d, EvKind::ClientResume(c));
            }
            EvKind::ClientResume(c) => {
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
            EvKind::ScriptFlush(node) => {
                self.report.faults[5] += 1;
                self.changes.push(self.g);
                self.log(|| format!("node {node}: SCRIPT FLUSH"));
                self.nodes[node].node.flush_scripts();
            }
            EvKind::Evict(node) => {
                let state = &mut self.nodes[node];
                let now = state.clock.local_ns(self.g);
                if !state.down && state.node.evict(now) {
                    self.log(|| format!("node {node}: evicted a key"));
                }
            }
            EvKind::Operator => self.operate(),
        }
    }

    /// The operator of `Break::FenceMajorityBlank`'s control: `repair_fences` through client
    /// 0 with the floor at the highest fence handed out so far — the least that the repair's
    /// assumption R1 allows (docs/fencing.md, "Repair"; a real operator adds a margin) — every
    /// 100 ms until a repair reports a quorum of counters repaired.
    fn operate(&mut self) {
        let engine = &mut self.clients[0].engine;
        if let Some(id) = self.repair {
            if !engine.is_done(id) {
                self.at(self.g + 100 * MS, EvKind::Operator);
                return;
            }
            self.repair = None;
            let outcome = engine.take(id);
            self.log(|| format!("operator: {outcome:?}"));
            if let Some(Outcome::Repaired(Ok(r))) = outcome
                && r.repaired >= r.quorum
            {
                self.report.repaired = true;
                return;
            }
        }
        let highest = self.acquisitions.iter().map(|a| a.2).max().unwrap_or(0);
        let floor = crate::repair::FenceFloor::AtLeast(highest);
        let timeout = Duration::from_nanos(10 * NODE_TIMEOUT);
        let kind = ReqKind::repair(&self.shared.config, floor, timeout).expect("a valid repair");
        let now = self.local(0);
        self.log(|| format!("operator repairs the fence counters: {floor:?}"));
        let id = self.clients[0]
            .engine
            .submit(kind, b"", &Token::EMPTY, Waiter::Local, now);
        self.repair = Some(id);
        self.poke(0);
        self.at(self.g + 100 * MS, EvKind::Operator);
    }

    fn local(&self, c: usize) -> Instant {
        self.base + Duration::from_nanos(self.clients[c].clock.local_ns(self.g))
    }

    fn world_of(&self, c: usize, t: Instant) -> u64 {
        let local = t.saturating_duration_since(self.base).as_nanos() as u64;
        self.clients[c].clock.world_ns(local)
    }

    /// Runs client `c` at the current world time: takes in what arrived, steps its engine,
    /// moves its workload on, sends what it wrote and plans its next wake.
    fn poke(&mut self, c: usize) {
        if self.clients[c].paused_until.is_some() {
            return;
        }
        let now = self.local(c);
        let callers = self.clients[c].callers.len();
        for k in 0..callers {
            self.keeping_before(c, k, now);
        }
        let client = &mut self.clients[c];
        client.engine.net.now = now;
        client.engine.take_input(now);
        client.engine.step(now);
        for k in 0..callers {
            self.keeping_after(c, k, now);
        }
        // The workload may submit; each turn's submissions are written by another step.
        for _ in 0..4 {
            let mut submitted = false;
            for k in 0..callers {
                submitted |= self.work(c, k, now);
            }
            if !submitted {
                break;
            }
            self.clients[c].engine.step(now);
        }
        // The list goes back empty: its room is kept for the next turn's actions.
        let mut actions = std::mem::take(&mut self.clients[c].engine.net.actions);
        for action in actions.drain(..) {
            self.send(c, action);
        }
        self.clients[c].engine.net.actions = actions;
        let timer = self.clients[c]
            .callers
            .iter()
            .filter_map(|k| match &k.work {
                Work::Idle { until } => Some(*until),
                Work::Holding(h) => Some(h.until),
                Work::Keeping(k) => Some(k.until),
                Work::Acquiring {
                    slot: Some((slot, drop_at)),
                    ..
                } if !slot.is_done() => Some(*drop_at),
                _ => None,
            })
            .min();
        let next = [self.clients[c].engine.wake_at(now), timer]
            .into_iter()
            .flatten()
            .min();
        if let Some(t) = next {
            let t = match self.clients[c].wake_of {
                Some((local, world)) if local == t => world,
                _ => {
                    let world = self.world_of(c, t);
                    self.clients[c].wake_of = Some((t, world));
                    world
                }
            };
            let t = t.max(self.g + 1_000);
            if self.clients[c].wake.is_none_or(|w| t < w || w <= self.g) {
                self.clients[c].wake = Some(t);
                self.at(t, EvKind::ClientWake(c));
            }
        }
    }

    fn submit(&mut self, c: usize, kind: ReqKind, res: usize, token: &Token, now: Instant) -> OpId {
        self.submit_for(c, kind, res, token, Waiter::Local, now)
    }

    fn submit_for(
        &mut self,
        c: usize,
        kind: ReqKind,
        res: usize,
        token: &Token,
        waiter: Waiter,
        now: Instant,
    ) -> OpId {
        self.report.ops += 1;
        let resource = self.resources[res].clone();
        self.clients[c]
            .engine
            .submit(kind, &resource, token, waiter, now)
    }

    /// A kept lock's belief ends when its validity passed without a renewal seen: found at
    /// the first poke after (validity only moves in pokes, so the end is exact).
    fn keeping_before(&mut self, c: usize, caller: usize, now: Instant) {
        if self.clients[c].ignores_validity {
            return;
        }
        let Work::Keeping(k) = &self.clients[c].callers[caller].work else {
            return;
        };
        let valid = k.kept.valid_until();
        if let Some(start) = k.open
            && now >= valid
        {
            let (res, end, fence) = (k.res, self.world_of(c, valid), k.fence);
            self.believed(c, res, start, end, fence);
            if let Work::Keeping(k) = &mut self.clients[c].callers[caller].work {
                k.open = None;
            }
        }
    }

    /// After the engine ran: a lost lock is no longer believed; a renewed one is again.
    fn keeping_after(&mut self, c: usize, caller: usize, now: Instant) {
        let ignores_validity = self.clients[c].ignores_validity;
        let g = self.g;
        let Work::Keeping(k) = &mut self.clients[c].callers[caller].work else {
            return;
        };
        let valid = k.kept.valid_until();
        let lost = k.kept.is_lost();
        match k.open {
            Some(start) if lost && !ignores_validity => {
                k.open = None;
                let (res, fence) = (k.res, k.fence);
                let end = self.belief_end(c, valid, g);
                self.believed(c, res, start, end, fence);
            }
            None if !lost && now < valid => k.open = Some(g),
            _ => {}
        }
        let Work::Keeping(k) = &mut self.clients[c].callers[caller].work else {
            return;
        };
        if k.open.is_some() && valid > k.checked {
            k.checked = valid;
            let (res, token) = (k.res, *k.kept.base().token());
            self.check_cover(c, res, token.as_bytes(), valid);
        }
    }

    /// Moves client `c`'s workload on; true if it submitted an operation.
    fn work(&mut self, c: usize, k: usize, now: Instant) -> bool {
        // Most pokes find nothing due for a caller: decided by reference, without moving its
        // (large) state out and back (the same guards as `work_due`'s arms).
        let engine = &self.clients[c].engine;
        let due = match &self.clients[c].callers[k].work {
            Work::Idle { until } => now >= *until,
            Work::Holding(h) => now >= h.until,
            Work::Keeping(kp) => now >= kp.until,
            Work::Acquiring {
                slot: Some((slot, drop_at)),
                ..
            } => slot.is_done() || now >= *drop_at,
            Work::Acquiring { id, .. } | Work::Extending { id, .. } | Work::Releasing { id } => {
                engine.is_done(*id)
            }
            Work::Done => false,
        };
        if !due {
            return false;
        }
        let submitted = self.work_due(c, k, now);
        if matches!(self.clients[c].callers[k].work, Work::Done) {
            self.done_callers += 1;
        }
        submitted
    }

    /// Lock operations after which callers stop starting new acquires.
    fn ops(&self) -> u64 {
        match self.setup.breaks {
            b if b.contention() => self.setup.ops.max(CONTENTION_OPS),
            // Past the outage (every attempt during it an operation) and the repair.
            Break::FenceMajorityBlank => self.setup.ops.max(600),
            _ => self.setup.ops,
        }
    }

    /// Callers release at once and never keep or extend: contention for the acquire itself
    /// (`Break::contention`).
    fn contend(&self) -> bool {
        self.setup.breaks.contention()
    }

    /// [`World::work`] for a caller with something due.
    fn work_due(&mut self, c: usize, k: usize, now: Instant) -> bool {
        let client = &mut self.clients[c];
        match std::mem::replace(&mut client.callers[k].work, Work::Done) {
            Work::Idle { until } if now >= until => {
                let g = self.g;
                let res = match self.clients[c].callers[k].want {
                    // A want goes on until it is granted — or, so that a run without a quorum
                    // ends, until the run has made twice its operations.
                    Some((res, _)) if self.report.ops < 2 * self.ops() => res,
                    Some((res, start)) => {
                        self.clients[c].callers[k].want = None;
                        self.wants.push(Want {
                            res,
                            client: c,
                            caller: k,
                            start,
                            end: g,
                        });
                        self.report.abandoned += 1;
                        self.log(|| format!("client {c}/{k} gives {res} up"));
                        return false;
                    }
                    None if self.report.ops >= self.ops() => return false,
                    None => {
                        let mut res = self.rng.range(0, self.resources.len() as u64) as usize;
                        if self.only_shared && !self.shared_of[res] {
                            // The shared locks are the last `plain` resources.
                            let plain = self.shared_of.iter().filter(|&&s| s).count();
                            res = self.resources.len() - plain + res % plain;
                        }
                        self.clients[c].callers[k].want = Some((res, g));
                        self.report.wants += 1;
                        res
                    }
                };
                // 20 bytes, encoded as the client's own tokens are (a reader's release sweeps
                // only members of that shape).
                let mut raw = [0u8; crate::token::RANDOM_BYTES];
                for chunk in raw.chunks_mut(8) {
                    let n = self.rng.next().to_le_bytes();
                    chunk.copy_from_slice(&n[..chunk.len()]);
                }
                let token = Token::encode(&raw);
                // A third wait for the resource (lock_until): attempts with tokens of their own,
                // brought by releases, the poll or a split vote's pause, until a deadline.
                let wait = self
                    .rng
                    .chance(33)
                    .then(|| Duration::from_nanos(self.rng.range(0, 2 * TTL.as_nanos() as u64)));
                let kind = match wait {
                    Some(wait) => ReqKind::Wait {
                        ttl: TTL,
                        deadline: now + wait,
                    },
                    None => ReqKind::Acquire { ttl: TTL },
                };
                // An async caller's wait, whose future is dropped before its deadline.
                let slot = match wait {
                    Some(wait) if self.setup.cancel && self.rng.chance(50) => {
                        let drop_in = self.rng.range(0, wait.as_nanos() as u64);
                        let drop_at = now + Duration::from_nanos(drop_in);
                        Some((Arc::new(Slot::for_tasks()), drop_at))
                    }
                    _ => None,
                };
                let id = match &slot {
                    Some((slot, _)) => {
                        let waiter = Waiter::Slot(slot.clone());
                        self.submit_for(c, kind, res, &token, waiter, now)
                    }
                    None => self.submit(c, kind, res, &token, now),
                };
                self.log(|| match wait {
                    Some(wait) => format!("client {c} acquires {res}, waiting {wait:?} at most"),
                    None => format!("client {c} acquires {res}"),
                });
                let start_g = self.g;
                self.clients[c].callers[k].work = Work::Acquiring {
                    id,
                    res,
                    token,
                    start_g,
                    deadline: wait.map(|wait| now + wait),
                    slot,
                };
                true
            }
            Work::Acquiring {
                slot: Some((slot, drop_at)),
                res,
                ..
            } if !slot.is_done() && now >= drop_at => {
                // The async caller drops its future: nobody takes the outcome (a lock won for
                // it is the engine's to release); the caller still wants the resource.
                slot.cell().cancelled = true;
                self.report.dropped += 1;
                self.log(|| format!("client {c} drops its wait for {res}"));
                let pause = crate::wait::retry_pause(&self.shared.config, self.rng.next());
                self.clients[c].callers[k].work = Work::Idle { until: now + pause };
                false
            }
            Work::Acquiring {
                id,
                res,
                token,
                start_g,
                deadline,
                slot,
            } if slot
                .as_ref()
                .map_or(client.engine.is_done(id), |s| s.0.is_done()) =>
            {
                if let Some(deadline) = deadline {
                    self.ended_wait(c, start_g, deadline);
                }
                let client = &mut self.clients[c];
                let outcome = match slot {
                    Some((slot, _)) => slot.cell().take_outcome().map(|(outcome, _)| outcome),
                    None => client.engine.take(id),
                };
                let won = match outcome {
                    Some(Outcome::Acquired(Ok(grant))) => Ok((token, grant)),
                    // A waited-for acquire: the token is the winning attempt's.
                    Some(Outcome::Locked(Ok((variant, grant)))) => {
                        Ok((token.variant(variant), grant))
                    }
                    other => Err(other),
                };
                match won {
                    Ok((token, grant)) => {
                        let valid = grant.valid_until;
                        let backing = grant.votes.yes;
                        self.check_cover(c, res, token.as_bytes(), valid);
                        let fence = grant.fence.unwrap_or(0);
                        if let Some(f) = grant.fence {
                            self.report.fenced += 1;
                            self.acquisitions.push((start_g, self.g, f, c));
                            self.log(|| format!("client {c} got fence {f}"));
                        }
                        self.report.acquired += 1;
                        if self.report.first_grant.is_none() {
                            self.report.first_grant = Some(Duration::from_nanos(self.g));
                        }
                        if grant.fence.is_some() && self.healed_at.is_some_and(|h| self.g > h) {
                            self.report.fenced_after_heal += 1;
                        }
                        if let Some((r, start)) = self.clients[c].callers[k].want.take() {
                            let end = self.g;
                            self.wants.push(Want {
                                res: r,
                                client: c,
                                caller: k,
                                start,
                                end,
                            });
                        }
                        let left = valid.saturating_duration_since(now);
                        // Some holders keep it past their validity (they stop believing then).
                        let hold = match self.contend() {
                            // Released at once, as `redlock demo`'s handles do.
                            true => Duration::ZERO,
                            false => left.mul_f64(self.rng.range(0, 120) as f64 / 100.0),
                        };
                        let g = self.g;
                        self.log(|| {
                            format!("client {c} holds {res}, valid {} ms", left.as_millis())
                        });
                        if !self.contend() && self.rng.chance(25) {
                            // Kept: renewed by the engine for up to four TTLs.
                            let resource = &self.resources[res];
                            let lock = Lock::granted(resource, token, grant);
                            let kept = Arc::new(Kept::new(
                                lock,
                                self.clients[c].engine.callbacks.clone(),
                                &self.clients[c].engine.shared.nodes,
                            ));
                            self.clients[c].engine.keep(kept.clone(), now);
                            let until = now + TTL.mul_f64(self.rng.range(0, 400) as f64 / 100.0);
                            self.log(|| format!("client {c} keeps {res}"));
                            self.clients[c].callers[k].work = Work::Keeping(Keeping {
                                kept,
                                res,
                                until,
                                open: Some(g),
                                fence,
                                checked: valid,
                            });
                            return true;
                        }
                        self.clients[c].callers[k].work = Work::Holding(Hold {
                            res,
                            token,
                            backing,
                            valid,
                            until: now + hold,
                            start_g: g,
                            extensions: 0,
                            fence,
                        });
                    }
                    Err(other) => {
                        self.log(|| format!("client {c} failed to acquire {res}: {other:?}"));
                        let pause = crate::wait::retry_pause(&self.shared.config, self.rng.next());
                        self.clients[c].callers[k].work = Work::Idle { until: now + pause };
                    }
                }
                false
            }
            Work::Holding(mut hold) if now >= hold.until => {
                let extend = !self.contend()
                    && hold.extensions < 3
                    && now < hold.valid
                    && self.rng.chance(30);
                if extend {
                    let kind = ReqKind::Extend {
                        ttl: TTL,
                        valid_until: hold.valid,
                        backing: hold.backing,
                    };
                    let id = self.submit(c, kind, hold.res, &hold.token, now);
                    hold.extensions += 1;
                    self.log(|| format!("client {c} extends {}", hold.res));
                    self.clients[c].callers[k].work = Work::Extending { id, hold };
                } else {
                    self.end_belief(c, &hold, self.g);
                    if self.rng.chance(30) {
                        // unlock_nowait: nobody waits for the replies.
                        let (res, token) = (hold.res, hold.token);
                        self.submit_for(c, ReqKind::Release, res, &token, Waiter::None, now);
                        self.log(|| format!("client {c} releases {res} without waiting"));
                        let think = Duration::from_nanos(self.rng.range(0, MAX_THINK));
                        self.clients[c].callers[k].work = Work::Idle { until: now + think };
                    } else {
                        let id = self.submit(c, ReqKind::Release, hold.res, &hold.token, now);
                        self.log(|| format!("client {c} releases {}", hold.res));
                        self.clients[c].callers[k].work = Work::Releasing { id };
                    }
                }
                true
            }
            Work::Extending { id, mut hold } if client.engine.is_done(id) => {
                match client.engine.take(id) {
                    Some(Outcome::Extended(valid, result)) => {
                        if result.is_ok() {
                            self.check_cover(c, hold.res, hold.token.as_bytes(), valid);
                        }
                        // As `Lock::extended_on` follows it (0: not known, and stays so).
                        let (won, votes) = crate::lock::extend_votes(&result);
                        hold.backing = crate::lock::backing_after_extend(hold.backing, won, votes);
                        hold.valid = valid;
                        let left = valid.saturating_duration_since(now);
                        let frac = self.rng.range(0, 120) as f64 / 100.0;
                        hold.until = now + left.mul_f64(frac);
                        let result = result.map(|_| ());
                        self.log(|| format!("client {c} extend: {result:?}"));
                    }
                    other => unreachable!("an extend's outcome: {other:?}"),
                }
                self.clients[c].callers[k].work = Work::Holding(hold);
                false
            }
            // A holder stops at its planned end, or when it learns of the loss (then it
            // releases what the engine left on the nodes for it: `Kept::leave_to_holder`); a
            // client that ignores validity works on to its planned end.
            Work::Keeping(kp)
                if now >= kp.until || (kp.kept.is_lost() && !client.ignores_validity) =>
            {
                if let Some(start) = kp.open {
                    let end = self.belief_end(c, kp.kept.valid_until(), self.g);
                    self.believed(c, kp.res, start, end, kp.fence);
                }
                if kp.kept.end_by_holder().releases() {
                    let (res, token) = (kp.res, *kp.kept.base().token());
                    let id = self.submit(c, ReqKind::Release, res, &token, now);
                    self.log(|| format!("client {c} releases kept {res}"));
                    self.clients[c].callers[k].work = Work::Releasing { id };
                    true
                } else {
                    self.log(|| format!("client {c} finds kept {} released", kp.res));
                    self.clients[c].callers[k].work = Work::Idle { until: now };
                    false
                }
            }
            Work::Releasing { id } if client.engine.is_done(id) => {
                let _ = client.engine.take(id);
                let think = Duration::from_nanos(self.rng.range(0, MAX_THINK));
                self.clients[c].callers[k].work = Work::Idle { until: now + think };
                false
            }
            other => {
                self.clients[c].callers[k].work = other;
                false
            }
        }
    }
}

fn run_id(rng: &mut Rng) -> [u8; 40] {
    let mut id = [0u8; 40];
    for b in id.iter_mut() {
        *b = b"0123456789abcdef"[(rng.next() % 16) as usize];
    }
    id
}
