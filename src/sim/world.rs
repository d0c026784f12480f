//! The world: its clients, nodes and connections, built from a seed; the event queue; and the
//! loop that runs a schedule — each event at its world time, in the order planned — to its
//! end, where the checkers read the record. [`run`] is the entry point.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::request::OpId;
use crate::engine::{Engine, Slab};
use crate::model::config::{Builder, Config, Quarantine, Shared};

use super::callers::{Caller, MAX_THINK, Work, resources};
use super::client_net::SimNet;
use super::clock::{BROKEN_DRIFT_PPM, Clock, DRIFT_PPM, LONG_UP, MS};
use super::events::{Ev, EvKind};
use super::links::{Conns, Link};
use super::node::{Node, run_id};
use super::record::Record;
use super::report::Report;
use super::rng::Rng;
use super::setup::{
    BACKOFF_MAX, BACKOFF_MIN, Break, CLIENTS, CONNECT_TIMEOUT, COUNTER_PERMITS, CROWD, MAX_CALLERS,
    MOST_CLIENTS, NODES, REPLY_TIMEOUT, RETRY_DELAY, RETRY_JITTER, SMALL_MAX_PENDING, Setup, TTL,
};

/// A run that has not finished after this much world time has stalled.
pub(super) const TIME_LIMIT: u64 = 600_000 * MS;
/// …or has processed this many events.
const EVENT_LIMIT: u64 = 2_000_000;

/// An event's key in the queue is its time, its sequence number and its slot in one number
/// (ordered as the time, then the sequence number: compared at once, it is the cheaper heap):
/// 64 bits of time, then these for the sequence number (a schedule stops at `EVENT_LIMIT`
/// events, each of which plans a few) and for the slot (of the events planned at once).
const SEQ_BITS: u32 = 40;
const SLOT_BITS: u32 = 64 - SEQ_BITS;

/// A client's wake is planned at least this long (1 µs) after the poke that plans it: an
/// engine whose deadline is already due is run again a moment later, not again and again at
/// one instant.
const MIN_WAKE_GAP: u64 = 1_000;

/// (`Break::EvictionCounted`) the nodes that evict: three of the five, so that every quorum
/// counts one of them; in the control two, whose yeses the client refuses, and the three
/// others make the quorum.
const EVICTING_NODES: usize = 3;
const EVICTING_NODES_CONTROL: usize = 2;

/// A client process: its engine and clock, and the callers that share them.
pub(super) struct Client {
    pub(super) engine: Engine<SimNet>,
    pub(super) clock: Clock,
    /// The process's callers, sharing its engine.
    pub(super) callers: Vec<Caller>,
    /// World time of the wake event planned (stale events are skipped).
    pub(super) wake: Option<u64>,
    /// The last wake asked for on the client's clock, and in world time: the same deadline
    /// comes back poke after poke, and the conversion is a costly part of a poke.
    pub(super) wake_of: Option<(Instant, u64)>,
    /// While paused, until when; what reaches it meanwhile waits in `deferred`.
    pub(super) paused_until: Option<u64>,
    pub(super) deferred: Vec<Ev>,
    /// Goes on as holder after its validity ended (breaks "work within validity").
    pub(super) ignores_validity: bool,
}

/// A simulated node as the world runs it: its clock, whether it is down or paused (what
/// reaches it meanwhile waits in `deferred`), and its incarnation (a crash starts the next:
/// connections of an earlier one are dead).
pub(super) struct NodeState {
    pub(super) node: Node,
    pub(super) clock: Clock,
    pub(super) down: bool,
    pub(super) paused: bool,
    pub(super) deferred: Vec<Ev>,
    pub(super) incarnation: u64,
}

/// The events planned, by (time, sequence number), with their slot in `planned`: a heap of
/// small keys (the events themselves, some large, stay where they were put), each one number
/// (see `SEQ_BITS`).
#[derive(Default)]
struct EventQueue {
    seq: u64,
    keys: BinaryHeap<Reverse<u128>>,
    planned: Vec<Option<EvKind>>,
    /// Slots of `planned` free for the next events.
    free_slots: Vec<u32>,
}

impl EventQueue {
    /// Plans `kind` at world time `t`, after every event planned before at the same time.
    fn push(&mut self, t: u64, kind: EvKind) {
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
        self.keys.push(Reverse(key));
    }

    /// The next event planned (the earliest; of those at the same time, the first planned).
    fn pop(&mut self) -> Option<Ev> {
        let Reverse(key) = self.keys.pop()?;
        let (t, slot) = ((key >> 64) as u64, (key as u32) & ((1 << SLOT_BITS) - 1));
        let kind = self.planned[slot as usize].take().expect("a planned event");
        self.free_slots.push(slot);
        Some(Ev { t, kind })
    }
}

/// A schedule's world: everything it is made of, and the record the checkers read.
pub(super) struct World {
    pub(super) rng: Rng,
    /// World time now (ns).
    pub(super) g: u64,
    /// The events planned.
    events: EventQueue,
    pub(super) base: Instant,
    pub(super) shared: Arc<Shared>,
    pub(super) clients: Vec<Client>,
    pub(super) nodes: Vec<NodeState>,
    pub(super) conns: Conns,
    pub(super) links: Vec<Link>,
    pub(super) resources: Vec<Vec<u8>>,
    /// Each resource's plain members: itself, or a set's (see `Setup::sets`), or the one
    /// a shared lock is of.
    pub(super) members: Vec<Vec<usize>>,
    /// Which resources are shared (read) locks (see `Setup::shared`).
    pub(super) shared_of: Vec<bool>,
    /// Callers take shared locks only (`Break::CounterSemaphore`: the shared locks stand for
    /// the counted permits, with the nodes' cap).
    pub(super) only_shared: bool,
    pub(super) setup: Setup,
    /// Fenced acquires (the setup's, or a fence break's).
    pub(super) fencing: bool,
    pub(super) report: Report,
    /// The readable log of the run, if one is asked for.
    pub(super) trace: Option<String>,
    /// The argument ranges of the command a node parses (its room kept from one to the next).
    pub(super) args: Vec<(usize, usize)>,
    /// Buffers of messages the nodes read, for their replies (see `client_net::recycle`).
    pub(super) spare: Vec<Vec<u8>>,
    /// (`Break::FenceMajorityBlank`) when the restarted majority is back and out of its
    /// quarantine, and the operator's repair in flight.
    pub(super) healed_at: Option<u64>,
    pub(super) repair: Option<OpId>,
    /// Callers in all, and those whose work is `Done` (a caller never leaves `Done`).
    pub(super) callers: usize,
    pub(super) done_callers: usize,
    /// What the checkers read.
    pub(super) record: Record,
}

/// Operation slots kept per thread for the next schedules' engines, at most: a contention
/// run's eight clients and its baseline's.
const KEPT_SLABS: usize = 2 * MOST_CLIENTS as usize;

thread_local! {
    /// The operation slots of this thread's engines that are gone, for the next ones to build
    /// theirs in (see `Slab`): building them new and dropping them would cost 3 % of a
    /// schedule's instructions.
    static SLABS: RefCell<Vec<Slab>> = const { RefCell::new(Vec::new()) };
}

/// Runs one schedule; `trace` collects a readable log of what happened.
pub fn run(seed: u64, setup: Setup, trace: Option<&mut String>) -> Report {
    let mut world = World::new(seed, setup, trace.is_some());
    world.run();
    world.count_renewals();
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
        world.check_progress(&healthy);
    }
    if let (Some(out), Some(t)) = (trace, world.trace.take()) {
        *out = t;
    }
    world.keep_slabs();
    world.report
}

/// The clients' shared settings: the simulation's timings, the quarantine and fencing as
/// `setup` has them, room for only a few requests per connection in some runs, and the defect
/// a break brings back.
fn shared_settings(setup: Setup, fencing: bool, rng: &mut Rng) -> Arc<Shared> {
    let quarantine = if setup.broken(Break::Quarantine) {
        Quarantine::Off
    } else {
        Quarantine::Ttl
    };
    // Some runs with room for only a few requests per connection: more releases outstanding
    // than that when a node comes back.
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
    // (`Break::HalfOpen`, and its control) the default reply timeout, longer than a wait: the
    // proportions under which only a reset by `reply_timeout` leaves callers waiting.
    let reply_timeout = match setup.breaks {
        Break::HalfOpen => config.reply_timeout,
        _ => REPLY_TIMEOUT,
    };
    let shared = Builder::new((0..NODES).map(|i| format!("redis://127.0.0.1:{}", 7000 + i)))
        .config(config)
        .ttl(TTL)
        .retry_delay(RETRY_DELAY, RETRY_JITTER)
        .connect_timeout(CONNECT_TIMEOUT)
        .backoff(BACKOFF_MIN, BACKOFF_MAX)
        .reply_timeout(reply_timeout)
        .quarantine(quarantine)
        .fencing(fencing)
        .ordered_sets(setup.ordered_sets || setup.breaks.of_sets())
        .fair(setup.fair && !fencing && !(setup.ordered_sets || setup.breaks.of_sets()));
    let shared = match setup.owner {
        true => shared.owner("sim-owner"),
        false => shared,
    }
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
    shared
}

/// What every client's wall clock reads when a run starts (ms since 1970).
const SIM_WALL_START_MS: u64 = 1_700_000_000_000;

/// The clients: one (a crowd), eight (contention) or three to five.
fn new_clients(
    setup: Setup,
    shared: &Arc<Shared>,
    base: Instant,
    ppm_bound: u64,
    rng: &mut Rng,
) -> Vec<Client> {
    let n_clients = match setup.breaks {
        b if (b.contention() || b.of_sets()) && setup.crowd => 1,
        // `redlock demo`'s eight handles; sets among busy members.
        b if b.contention() || b.of_sets() => MOST_CLIENTS as usize,
        _ => rng.within(CLIENTS) as usize,
    };
    let mut clients = Vec::with_capacity(n_clients);
    for c in 0..n_clients {
        clients.push(new_client(c, setup, shared, base, ppm_bound, rng));
    }
    clients
}

/// Client `c`: its clock, its engine (its waits' pauses drawn from the schedule) and its
/// callers, each thinking a while before its first lock.
fn new_client(
    c: usize,
    setup: Setup,
    shared: &Arc<Shared>,
    base: Instant,
    ppm_bound: u64,
    rng: &mut Rng,
) -> Client {
    let clock = Clock::drawn(rng, ppm_bound);
    let now = base + Duration::from_nanos(clock.local_ns(0));
    let net = SimNet::new(c, &shared.nodes, &shared.conn, now);
    let slab = SLABS.with_borrow_mut(|kept| kept.pop()).unwrap_or_default();
    let mut engine = Engine::with_slab(shared.clone(), net, now, slab);
    // Every client's wall clock reads the same at the run's start (then each runs at its own
    // rate): fair locks' queue entries replay with the schedule.
    engine.wall = crate::engine::fair::Wall(now, SIM_WALL_START_MS);
    // The waits' pauses replay with the schedule.
    engine.seed(rng.next());
    let callers = rng.range(1, MAX_CALLERS + 1);
    let crowd = setup.breaks.contention() || setup.breaks.of_sets();
    let callers = match setup.crowd && crowd {
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
    Client {
        engine,
        clock,
        callers,
        wake: None,
        wake_of: None,
        paused_until: None,
        deferred: Vec::new(),
        ignores_validity: setup.broken(Break::WorkPastValidity),
    }
}

/// The nodes, honest or with the defect of the break, up for an hour or (`Setup::young`)
/// just started.
fn new_nodes(setup: Setup, ppm_bound: u64, rng: &mut Rng) -> Vec<NodeState> {
    let young = setup.young && setup.breaks.contention();
    // Half the runs with release notices (pub/sub: waiters woken by releases at once,
    // where contention with a frozen node is most fragile); the others poll, as
    // clients of servers whose ACL refuses the channel. (Notices fan out: a run with them
    // is about 2.6 times the events.)
    let pubsub = rng.chance(50) || setup.breaks == Break::NoticeHerd;
    let mut nodes = Vec::with_capacity(NODES);
    for i in 0..NODES {
        let clock = Clock::drawn(rng, ppm_bound);
        // Up for an hour (not quarantined), or just started.
        let age = if young { 0 } else { LONG_UP };
        let mut node = Node::new(run_id(rng), clock.local_ns(0) - age);
        node.lying = setup.broken(Break::LyingNode) && i == 0;
        node.set_first_only = setup.broken(Break::SetNotAllOrNone);
        node.reader_ignores_writer = setup.broken(Break::ReaderIgnoresWriter);
        node.reader_cap = setup
            .broken(Break::CounterSemaphore)
            .then_some(COUNTER_PERMITS);
        node.pubsub = pubsub;
        let evicting = match setup.control {
            true => EVICTING_NODES_CONTROL,
            false => EVICTING_NODES,
        };
        node.evicting = setup.breaks == Break::EvictionCounted && i < evicting;
        nodes.push(NodeState {
            node,
            clock,
            down: false,
            paused: false,
            deferred: Vec::new(),
            incarnation: 0,
        });
    }
    nodes
}

impl World {
    /// The world of schedule `seed`, drawn in this order: the clients' settings, the
    /// clients, the nodes, the links, the resources; then its faults are planned and every
    /// client runs once.
    pub(super) fn new(seed: u64, setup: Setup, tracing: bool) -> World {
        let mut rng = Rng(seed);
        let fencing = setup.fencing || setup.breaks.needs_fencing();
        let shared = shared_settings(setup, fencing, &mut rng);
        let base = Instant::now();
        let ppm_bound = if setup.broken(Break::ClockDrift) {
            BROKEN_DRIFT_PPM
        } else {
            DRIFT_PPM
        };
        let clients = new_clients(setup, &shared, base, ppm_bound, &mut rng);
        let nodes = new_nodes(setup, ppm_bound, &mut rng);
        let n_clients = clients.len();
        let links = (0..n_clients * NODES)
            .map(|_| Link::drawn(&mut rng))
            .collect();
        let (resources, members, shared_of) = resources(setup, &mut rng);
        let callers = clients.iter().map(|c| c.callers.len()).sum();
        let mut world = World {
            rng,
            g: 0,
            events: EventQueue::default(),
            base,
            shared,
            clients,
            nodes,
            conns: Conns::default(),
            links,
            resources,
            members,
            shared_of,
            only_shared: setup.breaks == Break::CounterSemaphore,
            fencing,
            setup,
            report: Report {
                seed,
                ..Report::default()
            },
            trace: tracing.then(String::new),
            args: Vec::new(),
            spare: Vec::new(),
            record: Record::new(n_clients),
            healed_at: None,
            repair: None,
            callers,
            done_callers: 0,
        };
        if setup.young && setup.breaks.contention() {
            world.young_nodes_quarantined();
        }
        world.plan_faults();
        for c in 0..n_clients {
            world.poke(c);
        }
        world
    }

    /// Adds a line to the trace, if one is kept (`what` is not called otherwise).
    pub(super) fn log(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            let _ = writeln!(t, "{:>12.6} ms  {}", self.g as f64 / MS as f64, what());
        }
    }

    /// Plans `kind` at world time `t`.
    pub(super) fn at(&mut self, t: u64, kind: EvKind) {
        self.events.push(t, kind);
    }

    /// Runs the schedule to its end (every caller done, nothing left to happen, or a limit
    /// reached), then checks the record.
    pub(super) fn run(&mut self) {
        self.run_events();
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
        self.close_beliefs();
        self.take_set_steps();
        self.report.sim_time = Duration::from_nanos(self.g);
        self.check_record();
    }

    /// The engines' records of sets' ordered acquisitions, placed by caller in world time
    /// (`Record::set_steps`, for the liveness check).
    fn take_set_steps(&mut self) {
        for c in 0..self.clients.len() {
            for (id, held, marks, at) in std::mem::take(&mut self.clients[c].engine.step_log) {
                if let Some((k, _)) = self.record.wait_of(c, id) {
                    let t = self.world_of(c, at);
                    self.record.set_steps.push((c, k, held, marks, t));
                }
            }
        }
    }

    /// Handles the events in order until every caller is done or none is left; one past a
    /// limit stalls the run.
    fn run_events(&mut self) {
        while let Some(ev) = self.events.pop() {
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
    }

    /// Does what an event says, at its world time.
    pub(super) fn handle(&mut self, ev: Ev) {
        match ev.kind {
            EvKind::ClientWake(c) => self.wake(c, ev.t),
            EvKind::ToClient { client, .. } if self.clients[client].paused_until.is_some() => {
                self.clients[client].deferred.push(ev);
            }
            EvKind::ToClient {
                client,
                node,
                conn,
                what,
            } => self.reach_client(client, node, conn, what),
            EvKind::ConnArrive { conn, client, node } => self.accept(conn, client, node),
            EvKind::ToNode { conn, .. } | EvKind::NodeClose { conn } => self.reach_node(conn, ev),
            EvKind::NodePause(node, d) => self.pause_node(node, d),
            EvKind::NodeResume(node) => self.resume_node(node),
            EvKind::NodeCrash(node, d) => self.crash_node(node, d),
            EvKind::NodeRestart(node) => self.restart_node(node),
            EvKind::ConnReset(client, node) => self.reset_conn(client, node),
            EvKind::HalfOpen(client, node) => self.half_open(client, node),
            EvKind::Partition(client, node, d) => self.partition(client, node, d),
            EvKind::SlowLink(client, node, d) => self.slow_link(client, node, d),
            EvKind::ClientPause(c, d) => self.pause_client(c, d),
            EvKind::ClientResume(c) => self.resume_client(c),
            EvKind::ScriptFlush(node) => self.flush_scripts(node),
            EvKind::Evict(node) => self.evict(node),
            EvKind::Operator => self.operate(),
        }
    }

    /// A client's wake, unless a later poke planned another.
    pub(super) fn wake(&mut self, c: usize, t: u64) {
        if self.clients[c].wake == Some(t) {
            self.clients[c].wake = None;
            self.poke(c);
        }
    }

    /// Client `c`'s clock now.
    pub(super) fn local(&self, c: usize) -> Instant {
        self.base + Duration::from_nanos(self.clients[c].clock.local_ns(self.g))
    }

    /// The world time at which client `c`'s clock reads `t`.
    pub(super) fn world_of(&self, c: usize, t: Instant) -> u64 {
        let local = t.saturating_duration_since(self.base).as_nanos() as u64;
        self.clients[c].clock.world_ns(local)
    }

    /// Runs client `c` at the current world time: takes in what arrived, steps its engine,
    /// moves its workload on, sends what it wrote and plans its next wake.
    pub(super) fn poke(&mut self, c: usize) {
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
        self.work_turns(c, callers, now);
        self.send_actions(c);
        self.plan_wake(c, now);
    }

    /// Plans client `c`'s next wake: its engine's next deadline or its callers' next timer,
    /// whichever comes first, and never at the instant of this poke.
    fn plan_wake(&mut self, c: usize, now: Instant) {
        let timer = self.callers_due(c);
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
            let t = t.max(self.g + MIN_WAKE_GAP);
            if self.clients[c].wake.is_none_or(|w| t < w || w <= self.g) {
                self.clients[c].wake = Some(t);
                self.at(t, EvKind::ClientWake(c));
            }
        }
    }

    /// Adds up the kept locks' renewals that the engines counted.
    fn count_renewals(&mut self) {
        for client in &self.clients {
            let shared = &client.engine.shared;
            self.report.renewals.0 += shared
                .keep_extended
                .load(std::sync::atomic::Ordering::Relaxed);
            self.report.renewals.1 += shared
                .keep_retried
                .load(std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Gives the clients' operation slots back to the thread, for the next schedules.
    fn keep_slabs(&mut self) {
        for client in self.clients.drain(..) {
            let slab = client.engine.into_slab();
            SLABS.with_borrow_mut(|kept| {
                if kept.len() < KEPT_SLABS {
                    kept.push(slab);
                }
            });
        }
    }
}
