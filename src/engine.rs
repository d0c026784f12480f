//! The engine: every operation in flight over one set of connections, one per node.
//!
//! An operation (acquire, extend, release, status read) is a slot of a slab: its own
//! [`Round`] (votes, node deadline, validity), its resource and token, and who waits for it.
//! Its requests carry the slot's tag (index and a sequence number), so replies coming back on a
//! shared connection — FIFO, pipelined with every other operation's — find their operation.
//! Every command queued for a node in one turn of the loop goes out in one `write`.
//!
//! Who drives it: a [`Client`](crate::Client) drives its own engine on the calling thread; a
//! [`Redlock`](crate::Redlock) handle shares one engine between all threads (see `hub.rs`):
//! a caller that finds it free drives it itself, the others queue their request in the
//! [`Mailbox`] and park until the driver hands them the outcome.
//!
//! The decisions (which bytes go to which node, which operation a reply belongs to, round
//! outcomes, deadlines) take `now` as an argument; the only clock is the [`Net`]'s, and tokens
//! come in with the request. The engine reaches the nodes only through its [`Net`]: the `mio`
//! [`Driver`] and `conn.rs` in production, the simulator's in-memory network in `sim`.
//!
//! An operation's slot lives until every node has answered or failed each of its requests, even
//! after its caller got the outcome: so a late reply always finds its operation (a late yes to
//! a lost acquire was already answered by the release queued behind it on the same
//! connection — unless that connection was full and refused the release, which then waits in
//! the ledger), and a release whose connection failed or refused it is remembered in the
//! [`Ledger`] of keys of unknown fate and sent again when the node is reachable.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::addr::NodeAddr;
use crate::config::{Regression, Shared};
use crate::driver::Driver;
use crate::error::{Error, NodeFault, Refusal, Report};
use crate::event::event;
use crate::fence::{FENCE_KEY, Flaw, Reading, Reads};
use crate::kept::{Callbacks, Kept};
use crate::lock::{Grant, Votes};
use crate::mailbox::{Alarm, Caller, Mailbox, Slot};
use crate::net::Net;
use crate::quarantine::NodeWatch;
use crate::repair::Repair;
use crate::request::{NodeFence, NodeStatus, OpId, Outcome, ReqKind};
use crate::resp::{Arg, Frame, SetNxPx};
use crate::round::{Decision, Loss, Round, RoundConfig, Vote, deadline_after};
use crate::session::{Delivery, Kind, REPAIR_SCRIPT, Script, ScriptCall, scripts};
use crate::stats::{self, Ending, Metrics};
use crate::token::Token;
use crate::wait::{Queue, Seen, Waits, retry_pause, split_pause};

/// Who waits for an operation.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// Nobody: a release after a lost acquire, a release of the ledger.
    None,
    /// The thread driving the engine: the outcome stays in the slab until taken.
    Local,
    /// A parked thread: the outcome goes into its slot, and it is unparked.
    Slot(Arc<Slot>),
    /// The engine itself: the extend of a kept lock.
    Keep(Arc<Kept>),
    /// The engine itself: the release of a kept lock that was lost; its callback runs after.
    KeepLost(Arc<Kept>),
    /// The engine itself: an attempt of the waiting acquire `OpId` (see `wait.rs`).
    Attempt(OpId),
}

impl Waiter {
    /// Counted in [`Engine::waiting`]: somebody (a parked thread, or the engine's own timers)
    /// needs the loop driven until it is decided.
    fn waits(&self) -> bool {
        !matches!(self, Waiter::None | Waiter::Local | Waiter::Attempt(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Acquire,
    Extend,
    Release,
    Status,
    /// A waiting acquire: its attempts are acquires of their own (see `wait.rs`).
    Wait,
    /// A fence repair: reads, then writes (see `repair.rs`).
    Repair,
}

/// Per node, for a release: until when its answer is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Answered, failed, or not waited for.
    No,
    /// Waited for until then; `behind` if it still owed earlier replies when the release was
    /// sent (so missing the deadline marks it slow).
    Until(Instant, bool),
}

/// Replies to `GET`, `PTTL` and `HMGET redlock:fence run n` per node.
#[derive(Debug, Default)]
struct StatusReplies {
    /// Per node: its uptime and restart quarantine left, as of its first reply.
    restart: Vec<(Option<Duration>, Option<Duration>)>,
    values: Vec<Option<Result<Option<Vec<u8>>, NodeFault>>>,
    ttls: Vec<Option<(Result<i64, NodeFault>, Instant)>>,
    fences: Vec<Option<Option<NodeFence>>>,
}

#[derive(Debug)]
struct Op {
    seq: u32,
    live: bool,
    /// The outcome is decided (handed to its waiter, or waiting in `outcome`).
    done: bool,
    kind: OpKind,
    round: Round,
    faults: Vec<Option<NodeFault>>,
    resource: Vec<u8>,
    token: Token,
    start: Instant,
    /// Extend: the validity before. Status, Wait: the deadline. Release: when its keys expire.
    until: Instant,
    /// Wait: the TTL of its attempts, and how many it has made.
    ttl: Duration,
    tries: u32,
    /// Requests sent and neither answered nor failed yet.
    outstanding: u32,
    // Release:
    wait: Vec<Wait>,
    counted: u64,
    released: usize,
    // Status:
    status: Option<Box<StatusReplies>>,
    // Fence repair (`until` is the deadline of its round trip under way):
    repair: Option<Box<Repair>>,
    // Fenced acquire (see `fence.rs`): 0 not fenced, 1 acquiring and reading the counters, 2
    // writing the fence back (then `until` is the validity won in 1); the answers of 1, and
    // per node the connection they came on.
    fenced: u8,
    fence: u64,
    reads: Reads,
    gens: Vec<u64>,
    /// Acquire, extend: per node, the `run_id` of the server process whose answer counts for
    /// it in this round (see [`one_vote_per_server`]); `None` before it answered, for a
    /// node whose process is unknown, and for a duplicate.
    runs: Vec<Option<[u8; 40]>>,
    /// Acquire, extend: the nodes that answered after the decision, and whether the nodes
    /// that never answered within the node timeout were counted as timeouts (stats).
    late: u64,
    silent_counted: bool,
    /// Acquire: when the last node answered (a vote that is not a failure), for the round trip
    /// the split pause is measured in (see `Engine::round_trip`).
    answered: Instant,
    waiter: Waiter,
    outcome: Option<Outcome>,
}

impl Op {
    fn new(n: usize, now: Instant) -> Op {
        Op {
            seq: 0,
            live: false,
            done: false,
            kind: OpKind::Release,
            round: Round::new(n),
            faults: vec![None; n],
            // The usual resource name fits: a slot's first use does not allocate.
            resource: Vec::with_capacity(RESOURCE_CAPACITY),
            token: Token::EMPTY,
            start: now,
            until: now,
            ttl: Duration::ZERO,
            tries: 0,
            outstanding: 0,
            wait: vec![Wait::No; n],
            counted: 0,
            released: 0,
            status: None,
            repair: None,
            fenced: 0,
            fence: 0,
            reads: Reads::default(),
            gens: vec![0; n],
            runs: vec![None; n],
            late: 0,
            silent_counted: false,
            answered: now,
            waiter: Waiter::None,
            outcome: None,
        }
    }

    /// The round trip of the nodes that answered this attempt: from its start to the last
    /// answer. Not to its decision: a round that waited out the node timeout for a frozen node
    /// says how slow that node is, not how far apart two attempts must start not to collide.
    fn round_trip(&self) -> Duration {
        self.answered.saturating_duration_since(self.start)
    }

    /// Records node `node`'s vote in the round (`Err`: failed, with the fault), given the
    /// `run_id` of the server process that answered: two entries that lead to one process count
    /// once (see [`one_vote_per_server`]).
    fn record_vote(
        &mut self,
        node: usize,
        mut vote: Result<Vote, NodeFault>,
        run_id: Option<&[u8; 40]>,
        nodes: &[crate::addr::NodeAddr],
        now: Instant,
    ) {
        let after = match run_id {
            Some(run_id) => one_vote_per_server(self, node, run_id, &vote),
            None => Counts::Alone,
        };
        match after {
            Counts::Alone => {}
            Counts::Keeps { better, .. } => {
                if let Some(better) = better {
                    vote = Ok(better);
                }
            }
            Counts::Duplicate { twin, run_id, .. } => {
                self.reads.forget(node);
                vote = Err(duplicate(nodes, twin, &run_id));
            }
        }
        match vote {
            Ok(vote) => {
                if vote != Vote::Failed {
                    self.answered = self.answered.max(now);
                }
                self.round.handle_vote(node, vote, now)
            }
            Err(fault) => {
                self.faults[node] = Some(fault);
                self.round.handle_vote(node, Vote::Failed, now);
            }
        }
        // The other entry's vote is changed after this node's is in: the decision is then made
        // again from the votes that count.
        match after {
            Counts::Alone => {}
            Counts::Keeps { twin, run_id, .. } => {
                self.reads.forget(twin);
                self.faults[twin] = Some(duplicate(nodes, node, &run_id));
                self.round.handle_withdraw(twin, now);
            }
            Counts::Duplicate { twin, better, .. } => {
                if let Some(better) = better {
                    self.faults[twin] = None;
                    self.round.handle_revote(twin, better, now);
                }
            }
        }
    }
}

/// Releases not confirmed by a node (its connection failed with the command written or queued,
/// or it was down): sent again when the node is reachable, even after the key would have
/// expired (see `Engine::flush_ledger`); `expires` orders them, the first to expire dropped
/// first when a node's list is full.
#[derive(Debug, Default)]
struct Ledger {
    nodes: Vec<VecDeque<Unconfirmed>>,
    len: usize,
}

#[derive(Debug)]
struct Unconfirmed {
    resource: Vec<u8>,
    token: Token,
    expires: Instant,
}

/// Operations' state that deliveries update (split from the driver, which calls into it).
struct Core {
    /// The server list (named in duplicate faults).
    nodes: Arc<[crate::addr::NodeAddr]>,
    ops: Vec<Op>,
    free: Vec<u32>,
    watch: Vec<NodeWatch>,
    /// Per node: missed a release's grace and has not caught up since (not waited for).
    slow: Vec<bool>,
    /// Nodes (a bit set) that let an acquire's or extend's node timeout pass in silence and
    /// have not answered anything since: acquires do not wait for them to decide a loss
    /// (`Round::expect_no_answer_from`).
    silent: u64,
    ledger: Ledger,
    window: Option<Duration>,
    max_pending: usize,
    node_timeout: Duration,
    /// Undone operations whose waiter is a parked thread or the engine's kept locks.
    waiting: usize,
    /// Release requests answered / failed (for `shutdown`).
    confirmed: u64,
    /// What replies told about contended resources, for the waits (taken at every step):
    /// their names in `events`, as spans; release notices, and releases our notice reached
    /// `n` clients with.
    events: Vec<u8>,
    notices: Vec<(usize, usize)>,
    listened: Vec<(usize, usize, u64)>,
    /// Per node: refused our `SUBSCRIBE` (an ACL without the channel) or `HELLO 3` (a server
    /// before Redis 6): its releases are noticed by polling only.
    no_notices: Vec<bool>,
    /// Per node: the connection on which `HELLO 3` succeeded (RESP3 from the handshake on, or
    /// switched for subscribing).
    resp3: Vec<Option<u64>>,
    /// Fencing: restart tracking for seeding blank counters, its window, and the simulator's
    /// deliberate flaw.
    fence_watch: Vec<NodeWatch>,
    seed_window: Duration,
    flaw: Flaw,
    /// Counters and histograms (read by the handles at any time; see `stats.rs`).
    metrics: Arc<Metrics>,
    /// Per node: the connection on which a quarantined yes was last reported (`warn` once per
    /// connection, not once per acquire).
    quarantine_told: Vec<u64>,
}

/// Counts of what a shutdown flushed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shutdown {
    /// Release requests answered by their node during the shutdown.
    pub confirmed: u64,
    /// Releases still unconfirmed when it ended whose keys may still live: in flight, or
    /// waiting for a node to come back before their TTL passed. (Releases past their TTL stay
    /// queued for their node, for a `SET` it may run late, but are not waited for.)
    pub unconfirmed: u64,
}

/// The engine of one [`Client`](crate::Client) or one [`Redlock`](crate::Redlock) handle.
pub(crate) struct Engine<N: Net = Driver> {
    pub shared: Arc<Shared>,
    pub net: N,
    core: Core,
    set_nx_px: SetNxPx,
    scratch: BytesMut,
    /// How long the last acquire took to decide (the release grace scales with it).
    last_round: Duration,
    mailbox: Option<Arc<Mailbox>>,
    /// Since when queued requests are held back ([`Engine::held`]).
    hold_since: Option<Instant>,
    taken: Vec<Arc<Slot>>,
    /// Lost acquires whose release is to be sent (reused list).
    lost: Vec<u32>,
    /// Resource names copied out of slots (reused).
    resource: Vec<u8>,
    /// The releases of lost acquires: each one's span of `resource`, its token, and the nodes
    /// released quietly (see `quiet_release`) (reused).
    releases: Vec<(usize, usize, Token, u64)>,
    /// The next release goes without its notice (`QUIET_RELEASE_BODY`): the cleanup of a lost
    /// acquire on nodes in their restart quarantine. Their yes counted for nobody, so a notice
    /// from them helps nobody, and it would bring our own next attempt at once: a waiter whose
    /// attempts such a node granted (it restarted without the holder's key) heard its own
    /// cleanup's notice there, attempted again, and sent ~14,000 requests a second to every
    /// node until the quarantine ended (the soak's finding; tests/soak.rs).
    quiet_release: bool,
    keeps: Keeps,
    /// Alarms of async callers (retry pauses, validity deadlines), fired when due.
    alarms: Vec<(Instant, Arc<Alarm>)>,
    /// The callback thread of kept locks that are lost.
    pub callbacks: Arc<Callbacks>,
    /// Queues of callers waiting for contended resources.
    waits: Waits,
    /// Attempts decided in this turn: the waiting operation, the attempt's token, its outcome,
    /// and whether it was a split vote (reused list).
    attempts: Vec<(OpId, Token, Outcome, bool)>,
    /// Waiting operations whose attempt is due, with their resource's queue (reused).
    due: Vec<OpId>,
    /// A waiting operation's resource, copied out (reused).
    wait_resource: Vec<u8>,
    /// Per node: the connection our subscriptions were made on (a new one has none).
    sub_gen: Vec<u64>,
    /// Per node: the connection a `HELLO 3` is in flight on.
    upgrading: Vec<Option<u64>>,
    /// Fenced acquires whose fence is to be written back (reused list).
    fence_due: Vec<u32>,
    /// Fence repairs whose reads are over and whose writes are to be sent (reused list).
    repair_due: Vec<u32>,
    /// The expiry of the ledger entry being sent again (`flush_ledger`): its release op keeps
    /// it, so a release that fails again goes back into the ledger with the key's real expiry.
    replay_until: Option<Instant>,
}

/// Kept locks: timers of the engine.
struct Keeps {
    locks: Vec<Arc<Kept>>,
    /// When to look at the list next (a lock due, a validity ending); `None`: nothing to do
    /// until an extend in flight is decided or a lock is added.
    next: Option<Instant>,
    /// Extend when this much of the TTL is left.
    renew_left: Duration,
    /// Locks due within this window of each other are extended in the same tick, so that locks
    /// taken a few milliseconds apart share one write per node instead of one each.
    coalesce: Duration,
    /// Reused lists: due in this tick; decided in this turn (extends, then lost releases).
    due: Vec<Arc<Kept>>,
    decided: Vec<(Arc<Kept>, Option<Outcome>)>,
    lost: Vec<(Arc<Kept>, Error)>,
}

/// Operation slots built with the engine (more are added when needed).
const PREBUILT_OPS: usize = 128;
/// Resource-name buffers start this large: the usual names fit, so their first use does not
/// allocate.
const RESOURCE_CAPACITY: usize = 64;
/// Small per-turn lists (fence write-backs due, attempts and kept locks due) start this
/// large: more than a turn usually holds.
const TURN_LIST_CAPACITY: usize = 16;
/// The scratch buffer for a request's encoded arguments: a `SET`, an `EVALSHA` tail with a
/// usual resource name and token fit.
const SCRATCH_CAPACITY: usize = 256;
/// The kept locks' timers are rounded to this share of the TTL (a tenth): renewals due close
/// together go out in one turn, and a renewal is still far from the end of the validity.
const COALESCE_SHARE: u32 = 10;
/// The background thread wakes at most this often for the ledger's retries, even with a
/// shorter reconnect backoff: a retry sooner is no likelier to succeed.
const MIN_LEDGER_RETRY: Duration = Duration::from_millis(10);
/// A queue with no deadline (cannot happen while it has waiters) is looked at again after this.
const FAR_FUTURE: Duration = Duration::from_secs(3600);
/// The ledger fills at most `max_pending / this` of a connection's outstanding requests at once
/// (see `Engine::flush_ledger`): the rest of the room is the callers'.
const LEDGER_SHARE_OF_PENDING: usize = 2;

/// A fence repair's round trip waits at most the seed window divided by this (see
/// `submit_to`): a margin for the time between an answer's arrival and the repair's return,
/// and for the clocks of A3.
const REPAIR_ROUND_SHARE: u32 = 2;

/// Bounds of a waiting mark's life (see `Engine::mark_waiting`).
const MIN_MARK_TTL: Duration = Duration::from_secs(1);
const MAX_MARK_TTL: Duration = Duration::from_secs(24 * 3600);
/// A release waits for a node still answering earlier requests this many of the last round's
/// durations (at least a tenth of the node timeout, at most all of it, and never under
/// `MIN_RELEASE_GRACE`): a healthy straggler makes it.
const RELEASE_GRACE_ROUNDS: u32 = 4;

/// The longest that queued requests wait for the requests of tasks just woken
/// ([`Engine::held`]): about the time two executor threads take to poll 32 tasks.
const HOLD: Duration = Duration::from_micros(50);
const RELEASE_GRACE_FLOOR_SHARE: u32 = 10;
const MIN_RELEASE_GRACE: Duration = Duration::from_millis(1);

fn node_bit(node: usize) -> u64 {
    1u64 << node
}

impl<N: Net> Engine<N> {
    pub fn new(shared: Arc<Shared>, net: N, now: Instant) -> Engine<N> {
        let n = shared.nodes.len();
        Engine {
            core: Core {
                nodes: shared.nodes.clone(),
                // Pre-built slots: a loaded machine that answers slowly keeps more operations
                // alive at once (releases after lost attempts linger until every node
                // answered), and growing the slab then would allocate on the hot path.
                ops: (0..PREBUILT_OPS).map(|_| Op::new(n, now)).collect(),
                free: (0..PREBUILT_OPS as u32).rev().collect(),
                watch: vec![NodeWatch::default(); n],
                slow: vec![false; n],
                silent: 0,
                ledger: Ledger {
                    nodes: (0..n).map(|_| VecDeque::new()).collect(),
                    len: 0,
                },
                window: shared.config.quarantine_window(),
                max_pending: shared.config.max_pending,
                node_timeout: shared.config.node_timeout_for(shared.config.ttl),
                waiting: 0,
                confirmed: 0,
                events: Vec::new(),
                notices: Vec::new(),
                listened: Vec::new(),
                no_notices: vec![false; n],
                resp3: vec![None; n],
                fence_watch: vec![NodeWatch::default(); n],
                seed_window: shared.config.seed_window(),
                flaw: shared.fence_flaw,
                metrics: Arc::new(Metrics::new(
                    (0..n).map(|i| net.session(i).counters().clone()).collect(),
                )),
                quarantine_told: vec![0; n],
            },
            upgrading: vec![None; n],
            fence_due: Vec::with_capacity(TURN_LIST_CAPACITY),
            repair_due: Vec::new(),
            replay_until: None,
            sub_gen: vec![0; n],
            set_nx_px: SetNxPx::new(shared.config.ttl.as_millis() as u64),
            scratch: BytesMut::with_capacity(SCRATCH_CAPACITY),
            last_round: Duration::ZERO,
            mailbox: None,
            hold_since: None,
            taken: Vec::with_capacity(RESOURCE_CAPACITY),
            lost: Vec::with_capacity(PREBUILT_OPS),
            resource: Vec::with_capacity(RESOURCE_CAPACITY),
            releases: Vec::with_capacity(PREBUILT_OPS),
            quiet_release: false,
            keeps: Keeps {
                locks: Vec::new(),
                next: None,
                renew_left: shared.config.ttl.mul_f64(shared.config.renew_fraction),
                coalesce: shared.config.ttl / COALESCE_SHARE,
                due: Vec::new(),
                decided: Vec::new(),
                lost: Vec::new(),
            },
            alarms: Vec::new(),
            callbacks: Arc::new(Callbacks::default()),
            waits: Waits::new(seed()),
            attempts: Vec::with_capacity(TURN_LIST_CAPACITY),
            due: Vec::with_capacity(TURN_LIST_CAPACITY),
            wait_resource: Vec::with_capacity(RESOURCE_CAPACITY),
            net,
            shared,
        }
    }

    /// Seeds the random pauses of waiting acquires (the simulator's replay).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub fn seed(&mut self, seed: u64) {
        self.waits = Waits::new(seed);
    }

    /// The counters of this engine (and of its connections).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.core.metrics
    }

    /// Makes this engine take requests from `mailbox` at every turn.
    pub fn attach(&mut self, mailbox: Arc<Mailbox>) {
        self.mailbox = Some(mailbox);
    }

    /// Operations with a parked waiter not answered yet.
    pub fn waiting(&self) -> usize {
        self.core.waiting
    }

    /// Callers waiting in the queue of `resource`.
    pub fn waiters(&mut self, resource: &[u8]) -> usize {
        self.waits.get_mut(resource).map_or(0, |q| q.waiters.len())
    }

    /// Releases not confirmed yet: (release requests in flight, ledger entries).
    pub fn unconfirmed_parts(&self) -> (usize, usize) {
        let in_flight = self
            .core
            .ops
            .iter()
            .filter(|o| o.live && o.kind == OpKind::Release)
            .map(|o| o.outstanding as usize)
            .sum();
        (in_flight, self.core.ledger.len)
    }

    /// Releases not confirmed yet whose keys may still live at `now`: in flight, and the
    /// ledger's entries that have not expired (an expired one is still sent when its node is
    /// back, for a `SET` a frozen node may run late, but a process shutting down need not wait
    /// for it).
    fn unconfirmed_live(&self, now: Instant) -> usize {
        let (in_flight, _) = self.unconfirmed_parts();
        let ledger: usize = (self.core.ledger.nodes.iter())
            .map(|q| q.iter().filter(|e| e.expires > now).count())
            .sum();
        in_flight + ledger
    }

    /// Releases are waiting in the ledger for their node.
    pub fn has_ledger(&self) -> bool {
        self.core.ledger.len > 0
    }

    /// When the engine's timers need the loop next: a kept lock's renewal or validity end, an
    /// async caller's alarm; `None` while there is none (or every kept lock's extend is in
    /// flight). After a turn of the loop it is in the future: a driver that leaves publishes it
    /// for the background thread.
    pub fn timer(&self) -> Option<Instant> {
        [self.keeps.next, self.next_alarm()]
            .into_iter()
            .flatten()
            .min()
    }

    fn next_alarm(&self) -> Option<Instant> {
        self.alarms.iter().map(|(t, _)| *t).min()
    }

    /// Fires the alarms due at `now`.
    fn fire_alarms(&mut self, now: Instant) {
        if self.alarms.is_empty() {
            return;
        }
        self.alarms.retain(|(t, alarm)| {
            if *t <= now {
                alarm.fire();
                false
            } else {
                true
            }
        });
    }

    /// When someone should drive the engine again although nobody waits: a connection
    /// deadline of a request still outstanding, or the ledger's next try — when the backoff of
    /// its nodes ends, if every node with releases waiting is down (a node that never comes
    /// back costs a look per backoff, not one every few milliseconds), else soon.
    pub fn background_deadline(&self, now: Instant) -> Option<Instant> {
        let soon = now + self.shared.config.backoff_min.max(MIN_LEDGER_RETRY);
        let retry = (0..self.shared.nodes.len())
            .filter(|&i| !self.core.ledger.nodes[i].is_empty())
            .map(|i| self.net.session(i).retry_at().map_or(soon, |t| t.max(soon)))
            .min();
        let conn = self.net.next_deadline();
        [retry, conn, self.timer()].into_iter().flatten().min()
    }

    /// Starts an operation: queues its requests on every node (nothing written before
    /// [`Engine::flush`]).
    pub fn submit(
        &mut self,
        kind: ReqKind,
        resource: &[u8],
        token: &Token,
        waiter: Waiter,
        now: Instant,
    ) -> OpId {
        if let ReqKind::Wait { ttl, deadline } = kind {
            return self.submit_wait(resource, token, ttl, deadline, waiter, now);
        }
        let id = self.submit_to(kind, resource, token, waiter, self.all_nodes(), now);
        if matches!(kind, ReqKind::Release) && !self.waits.is_empty() {
            // A caller of this engine released: its next waiter attempts right behind.
            self.released(resource, now, Seen::Ours);
        }
        id
    }

    fn all_nodes(&self) -> u64 {
        let n = self.shared.nodes.len();
        if n == 64 { u64::MAX } else { node_bit(n) - 1 }
    }

    /// Starts a waiting acquire: its first attempt at once, unless callers of this engine
    /// already wait for the resource (then it lines up behind them).
    fn submit_wait(
        &mut self,
        resource: &[u8],
        token: &Token,
        ttl: Duration,
        deadline: Instant,
        waiter: Waiter,
        now: Instant,
    ) -> OpId {
        let n = self.shared.nodes.len();
        let id = self.core.alloc(n, now);
        if waiter.waits() {
            self.core.waiting += 1;
        }
        let op = &mut self.core.ops[id.index as usize];
        op.kind = OpKind::Wait;
        op.resource.clear();
        op.resource.extend_from_slice(resource);
        op.token = *token;
        op.start = now;
        op.until = deadline;
        op.ttl = ttl;
        op.tries = 0;
        op.waiter = waiter;
        op.outcome = None;
        op.outstanding = 0;
        // Not left from the slot's last use: a won lock its caller dropped is released
        // through `lost`, which reads them (`Engine::quiet_release`).
        op.faults.fill(None);
        match self.waits.get_mut(resource) {
            Some(q) => {
                q.waiters.push_back(id);
                q.earliest = q.earliest.min(deadline);
                q.touch(now);
                if q.waiters.len() == 1 && q.attempt.is_none() {
                    // First in a queue that lingers: attempts at once, as its head (unmarked,
                    // like an attempt with no queue: most find the resource free).
                    self.attempt(id, now, false);
                }
            }
            None => self.attempt(id, now, false),
        }
        id
    }

    /// Submits the next attempt of the waiting operation `w`, with a token of its own; if `w`
    /// heads a queue and `mark`, behind a waiting mark (see [`Engine::mark_waiting`]).
    fn attempt(&mut self, w: OpId, now: Instant, mark: bool) {
        let mut resource = std::mem::take(&mut self.wait_resource);
        let op = &mut self.core.ops[w.index as usize];
        let token = op.token.variant(op.tries);
        op.tries = op.tries.wrapping_add(1);
        let ttl = op.ttl;
        resource.clear();
        resource.extend_from_slice(&op.resource);
        let mut marked = false;
        if let Some(q) = self.waits.get_mut(&resource)
            && q.waiters.front() == Some(&w)
        {
            q.attempt = Some(w);
            q.released = false;
            q.marked = mark;
            marked = mark;
        }
        let all = self.all_nodes();
        if marked {
            // A waiter (subscribed since its queue opened): marked as one, ahead of the attempt
            // on the same connections, so that a release after a refusal publishes.
            self.mark_waiting(&resource, all, now);
        }
        let kind = ReqKind::Acquire { ttl };
        self.submit_to(kind, &resource, &token, Waiter::Attempt(w), all, now);
        self.wait_resource = resource;
    }

    /// A release of `resource` was submitted here ([`Seen::Ours`]) or announced by another
    /// client: the head of its queue attempts (now, in the same write as our release), unless a
    /// split vote's pause or the local streak's yield holds it back.
    fn released(&mut self, resource: &[u8], now: Instant, seen: Seen) {
        let round = self.last_round;
        let Some(q) = self.waits.get_mut(resource) else {
            return;
        };
        if seen == Seen::Notice && q.held_until.is_some_and(|t| t > now) {
            // A caller of ours holds it: a notice is of an earlier release (often our own,
            // coming back after the next of ours already won).
            return;
        }
        if let Some(at) = q.on_release(now, round, seen)
            && at <= now
            && let Some(&head) = q.waiters.front()
            && !is_cancelled(&self.core.ops[head.index as usize])
        {
            // Right behind our own release (in the same write), the attempt needs no mark.
            self.attempt(head, now, seen == Seen::Notice);
        }
    }

    /// Ends the waiting operation `w` with `outcome` (`None`: its caller is gone).
    fn finish_wait(&mut self, w: OpId, outcome: Option<Outcome>) {
        let op = &mut self.core.ops[w.index as usize];
        op.done = true;
        if let Some(Outcome::Locked(Ok((token, _)))) = &outcome {
            // What a release of a lock won for nobody must delete.
            op.token = *token;
        }
        match std::mem::replace(&mut op.waiter, Waiter::None) {
            Waiter::Local => op.outcome = outcome,
            Waiter::Slot(slot) => {
                self.core.waiting -= 1;
                if let Some(outcome) = outcome
                    && let Some(Outcome::Locked(Ok(_))) =
                        slot.deliver(outcome, self.mailbox.as_deref().map(|m| &m.unclaimed))
                {
                    // Its caller dropped the future: released like a lost attempt.
                    self.lost.push(w.index);
                }
            }
            _ => {}
        }
        if op.outstanding == 0 && op.outcome.is_none() {
            op.live = false;
            self.core.free.push(w.index);
        }
    }

    /// Applies the attempts decided in this turn to their waiting operations and queues.
    fn attempts_decided(&mut self, now: Instant) {
        let mut decided = std::mem::take(&mut self.attempts);
        let mut resource = std::mem::take(&mut self.wait_resource);
        for (w, token, outcome, split) in decided.drain(..) {
            let op = &self.core.ops[w.index as usize];
            if op.seq != w.seq || op.done || !op.live {
                continue;
            }
            resource.clear();
            resource.extend_from_slice(&op.resource);
            let deadline = op.until;
            let error = match outcome {
                Outcome::Acquired(Ok(grant)) => {
                    let valid_until = grant.valid_until;
                    acquired_event(
                        &self.shared.nodes,
                        &op.resource,
                        op.tries,
                        now.saturating_duration_since(op.start),
                        grant.votes,
                    );
                    self.finish_wait(w, Some(Outcome::Locked(Ok((token, grant)))));
                    let pause = retry_pause(&self.shared.config, self.waits.random());
                    if let Some(q) = self.waits.get_mut(&resource) {
                        q.held_until = Some(valid_until);
                        if q.leave(w) {
                            q.streak += 1;
                            q.splits = 0;
                            q.not_before = None;
                            // The next in line waits for the release (ours), or the end of the
                            // lock if it is never released.
                            q.try_at = q.after_refusal(now, pause);
                        }
                        q.touch(now);
                    }
                    continue;
                }
                Outcome::Acquired(Err(e)) => e,
                _ => continue,
            };
            // No retry mends it (a wrong CA, a port that speaks another protocol, credentials
            // refused on too many nodes): the caller learns at once.
            let last = error.is_final() || deadline <= now;
            if last {
                self.finish_wait(w, Some(Outcome::Locked(Err(error))));
                if let Some(q) = self.waits.get_mut(&resource) {
                    if q.leave(w) {
                        // The next in line takes its place at once.
                        q.try_at = now;
                    }
                    q.touch(now);
                }
                continue;
            }
            let round = self.last_round;
            let random = self.waits.random();
            let poll = retry_pause(&self.shared.config, random);
            let held = matches!(error, Error::Held(_));
            let hears = self.core.no_notices.iter().any(|&no| !no);
            let q: &mut Queue = match self.waits.get_mut(&resource) {
                Some(q) => {
                    if !q.waiters.contains(&w) {
                        q.waiters.push_back(w);
                    }
                    q.touch(now);
                    q
                }
                None => {
                    // Contended from now on: subscribed to its release notices, then (the
                    // subscription goes out first) one more attempt at once, since a release
                    // may have come while this one was in flight, with no queue to note it.
                    let all = self.all_nodes();
                    self.subscription(b"SUBSCRIBE", &resource, all, now);
                    let q = self.waits.open(&resource, w, error.clone(), now);
                    // Nodes not reached now are subscribed when they are back.
                    q.subscribed = all;
                    q.released = true;
                    q
                }
            };
            q.attempt_decided(w);
            if q.waiters.front() == Some(&w) {
                // Refused unmarked: nothing would tell of the holder's release but the poll,
                // so the next attempt, marked, goes at once (unless no node takes
                // subscriptions: then it would wait for the poll all the same).
                let unmarked = held && !std::mem::take(&mut q.marked) && hears;
                let released = std::mem::take(&mut q.released) || unmarked;
                q.try_at = if split {
                    q.splits += 1;
                    let pause = split_pause(q.splits, round, random);
                    q.not_before = Some(now + pause);
                    now + pause
                } else {
                    q.splits = 0;
                    // No quorum (nodes down, quarantined, too slow): a release notice does not
                    // make the next attempt any likelier to win, and the attempt's own cleanup
                    // publishes one that our subscription hears — without this pause a waiter
                    // would retry at once, again and again, while the nodes are unavailable.
                    q.not_before = (!held).then_some(now + poll);
                    if held && q.held_until.is_none_or(|t| t <= now) {
                        // Somebody else has it: our callers' streak is over.
                        q.streak = 0;
                    }
                    match (held, released) {
                        (true, true) => now,
                        (true, false) => q.after_refusal(now, poll),
                        (false, _) => now + poll,
                    }
                };
            } else {
                q.earliest = q.earliest.min(deadline);
            }
            q.last_error = error;
        }
        self.wait_resource = resource;
        self.attempts = decided;
    }

    /// What replies told about contended resources: notices bring the waiting head's attempt;
    /// a release of ours that reached other clients' subscriptions says that others wait.
    fn take_events(&mut self, now: Instant) {
        if self.core.notices.is_empty() && self.core.listened.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.core.events);
        let mut notices = std::mem::take(&mut self.core.notices);
        let mut listened = std::mem::take(&mut self.core.listened);
        for &(start, end, listeners) in &listened {
            if let Some(q) = self.waits.get_mut(&events[start..end]) {
                // Our own subscription on that node is one of them.
                q.remote = listeners > u64::from(q.subscribed != 0);
            }
        }
        for &(start, end) in &notices {
            self.released(&events[start..end], now, Seen::Notice);
        }
        notices.clear();
        listened.clear();
        self.core.notices = notices;
        self.core.listened = listened;
        let mut events = events;
        events.clear();
        self.core.events = events;
    }

    /// True if `node`'s connection speaks RESP3 (where a subscribed connection still runs
    /// every command).
    fn speaks_resp3(&self, node: usize) -> bool {
        self.shared.nodes[node].protocol == 3
            || self.core.resp3[node] == Some(self.net.session(node).generation())
    }

    /// Switches `node`'s RESP2 connection to RESP3 (`HELLO 3`) unless that is under way.
    fn upgrade(&mut self, node: usize, now: Instant) {
        let generation = self.net.session(node).generation();
        if self.upgrading[node] == Some(generation) {
            return;
        }
        let mut hello = BytesMut::new();
        crate::resp::encode_command(&mut hello, &[Arg::Bytes(b"HELLO"), Arg::Bytes(b"3")]);
        let Engine { net, core, .. } = self;
        if net
            .request(node, Kind::Upgrade, 0, &hello, now, &mut core.sink())
            .is_ok()
        {
            self.upgrading[node] = Some(generation);
        }
    }

    /// `SUBSCRIBE` (or `UNSUBSCRIBE`) to the release notices of `resource` on the nodes in
    /// `nodes` that are ready, speak RESP3 and allow it; the others are switched to RESP3 and
    /// subscribed later by [`Engine::resubscribe`].
    fn subscription(&mut self, verb: &[u8], resource: &[u8], nodes: u64, now: Instant) {
        let n = self.shared.nodes.len();
        let mut ready = 0;
        for node in (0..n).filter(|&i| nodes & node_bit(i) != 0) {
            if self.core.no_notices[node] || !self.net.session(node).is_ready() {
                continue;
            }
            if self.speaks_resp3(node) {
                ready |= node_bit(node);
            } else if verb == b"SUBSCRIBE" {
                self.upgrade(node, now);
            }
        }
        let Engine {
            net, core, scratch, ..
        } = self;
        scratch.clear();
        let prefix = crate::session::RELEASE_CHANNEL_PREFIX.as_bytes();
        crate::resp::encode_array_header(scratch, 2);
        crate::resp::encode_bulk(scratch, &Arg::Bytes(verb));
        // The channel, `prefix + resource`, as one bulk string without a copy.
        let _ = write!(scratch, "${}\r\n", prefix.len() + resource.len());
        scratch.extend_from_slice(prefix);
        scratch.extend_from_slice(resource);
        scratch.extend_from_slice(b"\r\n");
        for node in (0..n).filter(|&i| ready & node_bit(i) != 0) {
            let _ = net.request(node, Kind::Subscribe, 0, scratch, now, &mut core.sink());
        }
    }

    /// The mark script (`keys.rs`: `redlock:waiting:<resource>` set to the mark value with a
    /// TTL, only where no key or a mark is) on the nodes in `nodes` that are ready and take
    /// subscriptions: the mark that makes a release publish its notice (see `RELEASE_BODY`).
    /// It outlives two fallback polls (at least a second), so a waiter that polls keeps it; a
    /// release takes it. The reply is not waited for.
    fn mark_waiting(&mut self, resource: &[u8], nodes: u64, now: Instant) {
        let n = self.shared.nodes.len();
        let config = &self.shared.config;
        let ttl = (config.retry_delay.saturating_add(config.retry_jitter))
            .saturating_mul(2)
            .clamp(MIN_MARK_TTL, MAX_MARK_TTL);
        let Engine {
            net, core, scratch, ..
        } = self;
        scratch.clear();
        let prefix = crate::session::WAITING_KEY_PREFIX.as_bytes();
        // The script's tail: numkeys 1, the key `prefix + resource` as one bulk string
        // without a copy, the TTL.
        crate::resp::encode_bulk(scratch, &Arg::Int(1));
        let _ = write!(scratch, "${}\r\n", prefix.len() + resource.len());
        scratch.extend_from_slice(prefix);
        scratch.extend_from_slice(resource);
        scratch.extend_from_slice(b"\r\n");
        crate::resp::encode_bulk(scratch, &Arg::UInt(ttl.as_millis() as u64));
        let call = ScriptCall {
            script: &scripts()[crate::session::MARK_SCRIPT],
            tag: 0,
            tail: scratch,
            argc: 3,
        };
        for node in (0..n).filter(|&i| nodes & node_bit(i) != 0) {
            if core.no_notices[node] || !net.session(node).is_ready() {
                continue;
            }
            let _ = net.script(node, call, now, &mut core.sink());
        }
    }

    /// Subscribes on connections that have none of our subscriptions yet (new since, or just
    /// switched to RESP3); the head of each queue subscribed there tries once more, behind the
    /// subscription, in case a release came before it.
    fn resubscribe(&mut self, now: Instant) {
        let n = self.shared.nodes.len();
        for node in 0..n {
            let session = self.net.session(node);
            let generation = session.generation();
            if !session.is_ready() || generation == self.sub_gen[node] || self.core.no_notices[node]
            {
                continue;
            }
            let bit = node_bit(node);
            if !self.waits.iter().any(|(_, q)| q.subscribed & bit != 0) {
                continue;
            }
            if !self.speaks_resp3(node) {
                self.upgrade(node, now);
                continue;
            }
            self.sub_gen[node] = generation;
            // Rare (a new connection): the copies may allocate.
            let mut resources: Vec<Vec<u8>> = self
                .waits
                .iter()
                .filter(|(_, q)| q.subscribed & bit != 0)
                .map(|(r, _)| r.clone())
                .collect();
            resources.sort();
            for resource in &resources {
                self.subscription(b"SUBSCRIBE", resource, bit, now);
                self.released(resource, now, Seen::Notice);
            }
        }
    }

    /// The queues' timers: waiters whose deadline passed or whose caller is gone leave; a head
    /// whose attempt is due makes it.
    fn tick_waits(&mut self, now: Instant) {
        if self.waits.is_empty() {
            return;
        }
        let mut due = std::mem::take(&mut self.due);
        let mut ended: Vec<(OpId, Option<Error>)> = Vec::new();
        {
            let Engine { waits, core, .. } = self;
            let ops = &core.ops;
            for (_, q) in waits.iter_mut() {
                let attempting = q.attempt;
                if q.earliest <= now {
                    q.waiters.retain(|&id| {
                        let gone = attempting != Some(id) && ops[id.index as usize].until <= now;
                        if gone {
                            ended.push((id, Some(q.last_error.clone())));
                        }
                        !gone
                    });
                    q.earliest = q
                        .waiters
                        .iter()
                        .filter(|&&id| attempting != Some(id))
                        .map(|&id| ops[id.index as usize].until)
                        .min()
                        .unwrap_or(now + FAR_FUTURE);
                }
                while let Some(&head) = q.waiters.front() {
                    if attempting == Some(head) || !is_cancelled(&ops[head.index as usize]) {
                        break;
                    }
                    ended.push((head, None));
                    q.waiters.pop_front();
                }
                if attempting.is_none()
                    && q.try_at <= now
                    && let Some(&head) = q.waiters.front()
                {
                    due.push(head);
                }
                q.touch(now);
            }
        }
        // The queues' order is the hash map's: sorted, so that a simulated schedule replays.
        ended.sort_by_key(|(id, _)| (id.index, id.seq));
        for (id, error) in ended {
            self.finish_wait(id, error.map(|e| Outcome::Locked(Err(e))));
        }
        let mut closed = Vec::new();
        self.waits.close_idle(now, |resource, nodes| {
            if nodes != 0 {
                // Rare (a queue idle for a second): the copy may allocate.
                closed.push((resource.to_vec(), nodes));
            }
        });
        closed.sort();
        for (resource, nodes) in closed {
            self.subscription(b"UNSUBSCRIBE", &resource, nodes, now);
        }
        due.sort_by_key(|id| (id.index, id.seq));
        for head in due.drain(..) {
            self.attempt(head, now, true);
        }
        self.due = due;
        self.resubscribe(now);
    }

    fn submit_to(
        &mut self,
        kind: ReqKind,
        resource: &[u8],
        token: &Token,
        waiter: Waiter,
        targets: u64,
        now: Instant,
    ) -> OpId {
        let n = self.shared.nodes.len();
        let id = self.core.alloc(n, now);
        let config = &self.shared.config;
        let waits = waiter.waits();
        let silent = self.core.silent;
        let seed_window = self.core.seed_window;
        {
            let op = &mut self.core.ops[id.index as usize];
            op.resource.clear();
            op.resource.extend_from_slice(resource);
            op.token = *token;
            op.start = now;
            op.faults.fill(None);
            op.runs.fill(None);
            op.answered = now;
            op.late = 0;
            op.silent_counted = false;
            op.waiter = waiter;
            op.outcome = None;
            op.outstanding = 0;
            op.counted = 0;
            op.released = 0;
            op.wait.fill(Wait::No);
            op.fenced = 0;
            match kind {
                ReqKind::Acquire { ttl } => {
                    op.kind = OpKind::Acquire;
                    op.ttl = ttl;
                    if config.fencing {
                        op.fenced = 1;
                        op.reads = Reads::default();
                    }
                    let rc = RoundConfig {
                        min_validity: config.min_validity,
                        ..RoundConfig::new(ttl, config.drift_factor, config.node_timeout_for(ttl))
                    };
                    op.round.start(now, &rc);
                    op.round.expect_no_answer_from(silent, now);
                    for node in (0..n).filter(|&i| silent & node_bit(i) != 0) {
                        op.faults[node] = Some(NodeFault::Silent);
                    }
                }
                ReqKind::Extend { ttl, valid_until } => {
                    op.kind = OpKind::Extend;
                    op.until = valid_until;
                    let rc = RoundConfig {
                        min_validity: config.min_validity,
                        not_after: Some(valid_until),
                        ..RoundConfig::new(ttl, config.drift_factor, config.node_timeout_for(ttl))
                    };
                    op.round.start(now, &rc);
                }
                ReqKind::Release => {
                    op.kind = OpKind::Release;
                    op.until = (self.replay_until.take())
                        .unwrap_or_else(|| deadline_after(now, config.longest_ttl()));
                }
                ReqKind::Wait { .. } => {
                    // Dispatched by `submit` to `submit_wait`.
                    debug_assert!(false, "a waiting acquire reached submit_to");
                    op.kind = OpKind::Wait;
                }
                ReqKind::Status { timeout } => {
                    op.kind = OpKind::Status;
                    op.until = deadline_after(now, timeout);
                    let status = op.status.get_or_insert_with(Default::default);
                    status.values.clear();
                    status.values.resize(n, None);
                    status.ttls.clear();
                    status.ttls.resize(n, None);
                    status.fences.clear();
                    status.fences.resize(n, None);
                    status.restart.clear();
                    status.restart.resize(n, (None, None));
                }
                ReqKind::Repair { floor, timeout } => {
                    op.kind = OpKind::Repair;
                    // Each round trip well within the seed window (half of it): a node repaired
                    // and restarted at once is seeded again only a window later, after the
                    // repair returned — by then every counted write is in (docs/fencing.md,
                    // "Repair").
                    let round = timeout.min(seed_window / REPAIR_ROUND_SHARE);
                    op.until = deadline_after(now, round);
                    op.repair = Some(Box::new(Repair::new(n, floor, round)));
                }
            }
        }
        if waits {
            self.core.waiting += 1;
        }
        let tag = id.tag();
        let Engine {
            net,
            core,
            scratch,
            set_nx_px,
            shared,
            last_round,
            quiet_release,
            ..
        } = self;
        let config = &shared.config;
        // An entry known to lead to the same server process as one listed before it is asked
        // nothing: it does not count. (A release still goes to every node.)
        let twins = match kind {
            ReqKind::Release | ReqKind::Wait { .. } => 0,
            _ => (0..n)
                .filter(|&i| targets & node_bit(i) != 0 && listed_before(&*net, i).is_some())
                .fold(0, |m, i| m | node_bit(i)),
        };
        let targets = targets & !twins;
        match kind {
            ReqKind::Acquire { ttl } if config.fencing => {
                // SET NX and the counter's read in one script (see `fence.rs`).
                let script = match core.flaw {
                    Flaw::NoWriteBack => &scripts()[4],
                    _ => &scripts()[2],
                };
                let call = script_call(
                    scratch,
                    script,
                    tag,
                    &[
                        Arg::Int(2),
                        Arg::Bytes(resource),
                        Arg::Bytes(FENCE_KEY.as_bytes()),
                        Arg::Bytes(token.as_bytes()),
                        Arg::UInt(ttl.as_millis() as u64),
                    ],
                );
                for node in (0..n).filter(|&i| targets & node_bit(i) != 0) {
                    let sent = net.script(node, call, now, &mut core.sink());
                    core.sent(id, node, sent, now);
                }
            }
            ReqKind::Acquire { ttl } => {
                scratch.clear();
                if ttl == config.ttl {
                    set_nx_px.encode(scratch, resource, token.as_bytes());
                } else {
                    SetNxPx::new(ttl.as_millis() as u64).encode(
                        scratch,
                        resource,
                        token.as_bytes(),
                    );
                }
                for node in (0..n).filter(|&i| targets & node_bit(i) != 0) {
                    let sent = net.request(node, Kind::Set, tag, scratch, now, &mut core.sink());
                    core.sent(id, node, sent, now);
                }
            }
            ReqKind::Extend { ttl, .. } => {
                let call = script_call(
                    scratch,
                    &scripts()[1],
                    tag,
                    &[
                        Arg::Int(1),
                        Arg::Bytes(resource),
                        Arg::Bytes(token.as_bytes()),
                        Arg::UInt(ttl.as_millis() as u64),
                    ],
                );
                for node in (0..n).filter(|&i| targets & node_bit(i) != 0) {
                    let sent = net.script(node, call, now, &mut core.sink());
                    core.sent(id, node, sent, now);
                }
            }
            ReqKind::Release => {
                // With the notice for waiters, or without it (see `Config::release_notices`,
                // and `Engine::quiet_release`).
                let quiet = std::mem::take(quiet_release) || !config.release_notices;
                let script = &scripts()[if quiet { 5 } else { 0 }];
                let call = script_call(
                    scratch,
                    script,
                    tag,
                    &[
                        Arg::Int(1),
                        Arg::Bytes(resource),
                        Arg::Bytes(token.as_bytes()),
                    ],
                );
                let timeout = config.node_timeout_for(config.ttl);
                // At least a tenth of the node timeout (5 ms by default): a healthy straggler
                // on a loaded machine makes it; a slow node pays it once, then is not waited for.
                let floor = (timeout / RELEASE_GRACE_FLOOR_SHARE).max(MIN_RELEASE_GRACE);
                let grace = (*last_round * RELEASE_GRACE_ROUNDS).clamp(floor, timeout);
                let waited = !matches!(core.ops[id.index as usize].waiter, Waiter::None);
                for node in (0..n).filter(|&i| targets & node_bit(i) != 0) {
                    // Every node gets the release, but not every node is waited for: a node
                    // still answering earlier requests gets a short grace; one that missed it
                    // before is not waited for until it has caught up.
                    let behind = net.session(node).pending() > 0;
                    if !behind {
                        core.slow[node] = false;
                    }
                    let sent = net.script(node, call, now, &mut core.sink());
                    let ok = sent.is_ok();
                    core.sent(id, node, sent, now);
                    if ok && waited && !core.slow[node] {
                        let until = if behind { now + grace } else { now + timeout };
                        core.ops[id.index as usize].wait[node] = Wait::Until(until, behind);
                    }
                }
            }
            ReqKind::Wait { .. } => {}
            ReqKind::Repair { .. } => {
                let read = [
                    Arg::Bytes(b"HMGET"),
                    Arg::Bytes(FENCE_KEY.as_bytes()),
                    Arg::Bytes(b"run"),
                    Arg::Bytes(b"n"),
                ];
                scratch.clear();
                crate::resp::encode_command(scratch, &read);
                for node in (0..n).filter(|&i| targets & node_bit(i) != 0) {
                    let sent =
                        net.request(node, Kind::Command, tag, scratch, now, &mut core.sink());
                    core.sent(id, node, sent, now);
                }
            }
            ReqKind::Status { .. } => {
                let fence = [
                    Arg::Bytes(b"HMGET"),
                    Arg::Bytes(FENCE_KEY.as_bytes()),
                    Arg::Bytes(b"run"),
                    Arg::Bytes(b"n"),
                ];
                let get = [Arg::Bytes(b"GET"), Arg::Bytes(resource)];
                let pttl = [Arg::Bytes(b"PTTL"), Arg::Bytes(resource)];
                for args in [&get[..], &pttl[..], &fence[..]] {
                    let mut cmd = BytesMut::new();
                    crate::resp::encode_command(&mut cmd, args);
                    for node in (0..n).filter(|&i| targets & node_bit(i) != 0) {
                        let sent =
                            net.request(node, Kind::Command, tag, &cmd, now, &mut core.sink());
                        core.sent(id, node, sent, now);
                    }
                }
            }
        }
        for node in (0..n).filter(|&i| twins & node_bit(i) != 0) {
            if let Some((of, run_id)) = listed_before(&*net, node) {
                core.fail(id, node, duplicate(&core.nodes, of, &run_id), now);
            }
        }
        id
    }

    /// Writes what every connection has queued: one `write` per node.
    pub fn flush(&mut self, now: Instant) {
        let Engine { net, core, .. } = self;
        net.flush(now, &mut core.sink());
    }

    /// Takes what arrived while nobody drove, without waiting (one `epoll_wait`): stragglers,
    /// and connections the servers closed while idle, so that they are re-established within
    /// the next operation.
    pub fn drain(&mut self, now: Instant) {
        let Engine { net, core, .. } = self;
        net.turn(now, &mut core.sink());
        // What other callers queued meanwhile goes before whatever the caller submits next.
        if self.held(now).is_none() {
            self.take_inbox(now);
        }
    }

    /// Keeps `kept` renewed from now on (what [`Mailbox::push_keep`] hands over, for a driver
    /// without a mailbox, such as the simulator's).
    // Used by the simulator (feature `sim`).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub fn keep(&mut self, kept: Arc<Kept>, now: Instant) {
        self.keeps.locks.push(kept);
        self.keeps.next = Some(now);
    }

    /// Until when the requests queued in the mailbox are held back, if they are: while tasks
    /// woken with their outcomes have not taken them yet (they are about to queue their next
    /// requests), for [`HOLD`] at most. The last of them to take its outcome wakes the loop
    /// ([`Mailbox::claimed`]), so the held requests and theirs go out together: one write per
    /// node where each task's request would otherwise have gone out in a turn of its own.
    ///
    /// Measured with the bench's `scale` scenario against the commit before (2-core VM, 5
    /// loopback servers, tokio tasks on a 2-worker runtime, 2 alternating runs of 3 rounds):
    /// writes per cycle at K = 64 0.35–0.45 → 0.20–0.24, at K = 8 1.49–2.47 → 1.25–1.37; p99 at
    /// K = 64 1.33–1.46 → 1.08–1.51 ms (one round 2.06), at K = 8 0.39–0.60 → 0.39–0.43 ms;
    /// cycles/s unchanged (the cycle is then bound by its chain: the servers' round, then waking
    /// and polling the tasks; `docs/engine.md`).
    fn held(&mut self, now: Instant) -> Option<Instant> {
        let mailbox = self.mailbox.as_ref()?;
        if mailbox.queued() == 0 || mailbox.unclaimed.load(Ordering::SeqCst) == 0 {
            self.hold_since = None;
            return None;
        }
        let until = *self.hold_since.get_or_insert(now) + HOLD;
        if now >= until {
            self.hold_since = None;
            return None;
        }
        Some(until)
    }

    /// Starts the operations queued in the mailbox.
    pub fn take_inbox(&mut self, now: Instant) {
        let Some(mailbox) = self.mailbox.as_ref() else {
            return;
        };
        if mailbox.queued() == 0 {
            return;
        }
        if mailbox.take(&mut self.taken, &mut self.alarms, &mut self.keeps.locks) {
            self.keeps.next = Some(now);
        }
        let mut taken = std::mem::take(&mut self.taken);
        for slot in taken.drain(..) {
            let cell = slot.cell();
            let (kind, token) = (cell.request.kind, cell.request.token);
            if cell.cancelled && !matches!(kind, ReqKind::Release) {
                // An async caller gave up before its request was taken in: nothing was sent,
                // nothing is. (A release still goes out, waited for by nobody.)
                continue;
            }
            if cell.request.caller == Caller::Detached || cell.cancelled {
                self.submit(kind, &cell.request.resource, &token, Waiter::None, now);
                drop(cell);
                // Taken in: the caller may reuse the slot.
                slot.taken_in();
            } else {
                let waiter = Waiter::Slot(slot.clone());
                self.submit(kind, &cell.request.resource, &token, waiter, now);
            }
        }
        self.taken = taken;
    }

    /// Handles what is due at `now`: round deadlines, release graces, status deadlines; then
    /// hands decided outcomes over and frees finished slots.
    fn settle(&mut self, now: Instant) {
        let n = self.shared.nodes.len();
        self.lost.clear();
        for (index, op) in self.core.ops.iter_mut().enumerate() {
            if !op.live {
                continue;
            }
            if !op.done {
                let outcome = match op.kind {
                    OpKind::Acquire | OpKind::Extend => {
                        if op.round.poll_timeout().is_some_and(|t| t <= now)
                            && op.round.poll_decision().is_none()
                        {
                            for node in 0..n {
                                if op.round.is_pending(node) {
                                    op.faults[node] = Some(NodeFault::Timeout);
                                    self.core.metrics.node(node).timeouts.bump();
                                    // Silent for a whole node timeout: not waited for by the
                                    // next acquires until it answers (see `Core::silent`).
                                    self.core.silent |= node_bit(node);
                                }
                            }
                            op.round.handle_timeout(now);
                        }
                        match op.round.poll_decision() {
                            None => None,
                            Some(decision) => {
                                let nodes = &self.shared.nodes;
                                let flaw = self.core.flaw;
                                let net = &self.net;
                                let grant = |valid_until, fence, votes| {
                                    Outcome::Acquired(Ok(Grant {
                                        valid_until,
                                        fence,
                                        votes,
                                        nodes: Some(nodes.clone()),
                                    }))
                                };
                                match (op.kind, decision) {
                                    (OpKind::Acquire, Decision::Won { valid_until, .. })
                                        if op.fenced == 1 =>
                                    {
                                        let quorum = op.round.quorum();
                                        match op.reads.fence(n, quorum, flaw) {
                                            Ok(fence) if flaw == Flaw::NoWriteBack => {
                                                self.last_round =
                                                    now.saturating_duration_since(op.start);
                                                Some(grant(
                                                    valid_until,
                                                    Some(fence),
                                                    lock_votes(net, &op.round, &op.faults),
                                                ))
                                            }
                                            Ok(fence) => {
                                                // Written back before it is handed out.
                                                op.fence = fence;
                                                op.until = valid_until;
                                                self.fence_due.push(index as u32);
                                                None
                                            }
                                            // Short of seeded counters, with nodes yet to
                                            // answer (a quorum of yes comes before them, and
                                            // a new deployment needs them all): wait for them,
                                            // up to the node timeout.
                                            Err(_)
                                                if (0..n).any(|i| op.round.is_pending(i))
                                                    && op
                                                        .round
                                                        .node_deadline()
                                                        .is_some_and(|t| now < t) =>
                                            {
                                                None
                                            }
                                            Err(_) => {
                                                self.last_round =
                                                    now.saturating_duration_since(op.start);
                                                self.lost.push(index as u32);
                                                Some(Outcome::Acquired(Err(Error::Fence(
                                                    fence_report(nodes, op, quorum),
                                                ))))
                                            }
                                        }
                                    }
                                    (OpKind::Acquire, Decision::Won { .. }) if op.fenced == 2 => {
                                        // A quorum took the fence. The validity is the one the
                                        // first round trip won, less the time since.
                                        self.last_round = now.saturating_duration_since(op.start);
                                        let left = op.until.saturating_duration_since(now);
                                        let min = self.shared.config.min_validity;
                                        if !left.is_zero() && left >= min {
                                            Some(grant(
                                                op.until,
                                                Some(op.fence),
                                                lock_votes(net, &op.round, &op.faults),
                                            ))
                                        } else {
                                            self.lost.push(index as u32);
                                            Some(Outcome::Acquired(Err(Error::TooSlow(report(
                                                nodes,
                                                &op.round,
                                                &op.faults,
                                                Refusal::TokenGone,
                                            )))))
                                        }
                                    }
                                    (OpKind::Acquire, Decision::Lost { loss, .. })
                                        if op.fenced == 2 =>
                                    {
                                        self.last_round = now.saturating_duration_since(op.start);
                                        self.lost.push(index as u32);
                                        // Credentials and permissions as for any round;
                                        // anything else is a fence not taken by a quorum.
                                        Some(Outcome::Acquired(Err(
                                            match loss_error(
                                                nodes,
                                                &op.round,
                                                &op.faults,
                                                loss,
                                                Refusal::TokenGone,
                                            ) {
                                                e @ (Error::Auth { .. }
                                                | Error::Permission { .. }) => e,
                                                _ => Error::Fence(report(
                                                    nodes,
                                                    &op.round,
                                                    &op.faults,
                                                    Refusal::TokenGone,
                                                )),
                                            },
                                        )))
                                    }
                                    (OpKind::Acquire, Decision::Won { valid_until, .. }) => {
                                        self.last_round = op.round_trip();
                                        Some(grant(
                                            valid_until,
                                            None,
                                            lock_votes(net, &op.round, &op.faults),
                                        ))
                                    }
                                    (OpKind::Acquire, Decision::Lost { loss, .. }) => {
                                        // The live nodes' round trip, not the node timeout
                                        // a frozen node made this round wait (the split pause
                                        // is measured in it: issue 36, item 3).
                                        self.last_round = op.round_trip();
                                        self.lost.push(index as u32);
                                        Some(Outcome::Acquired(Err(loss_error(
                                            nodes,
                                            &op.round,
                                            &op.faults,
                                            loss,
                                            Refusal::HeldElsewhere,
                                        ))))
                                    }
                                    (_, Decision::Won { valid_until, .. }) => {
                                        Some(Outcome::Extended(valid_until, Ok(())))
                                    }
                                    (_, Decision::Lost { loss, .. }) => Some(Outcome::Extended(
                                        validity_after_lost_extend(op.until, &op.round),
                                        Err(loss_error(
                                            nodes,
                                            &op.round,
                                            &op.faults,
                                            loss,
                                            Refusal::TokenGone,
                                        )),
                                    )),
                                }
                            }
                        }
                    }
                    OpKind::Release => {
                        let mut open = false;
                        for node in 0..n {
                            if let Wait::Until(t, behind) = op.wait[node] {
                                if t <= now {
                                    op.wait[node] = Wait::No;
                                    if behind {
                                        self.core.slow[node] = true;
                                    }
                                } else {
                                    open = true;
                                }
                            }
                        }
                        (!open).then_some(Outcome::Released(op.released))
                    }
                    // Decided by its attempts (`attempts_decided`) and timers (`tick_waits`).
                    OpKind::Wait => None,
                    OpKind::Repair => {
                        let repair = op.repair.as_mut().expect("a repair op has its tally");
                        let quorum = n / 2 + 1;
                        if !repair.round_done() && op.until > now {
                            None
                        } else {
                            repair.time_out();
                            if repair.is_reading() && repair.plan(&self.shared.nodes, quorum) != 0 {
                                // The writes go out after this loop (`write_repairs`).
                                op.until = deadline_after(now, repair.round);
                                self.repair_due.push(index as u32);
                                None
                            } else {
                                Some(Outcome::Repaired(
                                    repair.outcome(&self.shared.nodes, quorum),
                                ))
                            }
                        }
                    }
                    OpKind::Status => {
                        let status = op.status.as_mut().expect("status op has its replies");
                        if status.fences.iter().all(Option::is_some) || op.until <= now {
                            let start = op.start;
                            let until = op.until;
                            Some(Outcome::Status(
                                (0..n)
                                    .map(|node| {
                                        let (pttl, at) = status.ttls[node]
                                            .take()
                                            .unwrap_or((Err(NodeFault::Timeout), until));
                                        let value = status.values[node]
                                            .take()
                                            .unwrap_or(Err(NodeFault::Timeout));
                                        let (uptime, quarantine) = status.restart[node];
                                        NodeStatus {
                                            node: self.shared.nodes[node].to_string(),
                                            state: value.and_then(|v| pttl.map(|t| (v, t))),
                                            rtt: at.saturating_duration_since(start),
                                            fence: status.fences[node].take().flatten(),
                                            uptime,
                                            quarantine,
                                        }
                                    })
                                    .collect(),
                            ))
                        } else {
                            None
                        }
                    }
                };
                if let Some(outcome) = outcome {
                    observe(&self.core.metrics, &self.shared.nodes, op, &outcome, now);
                    op.done = true;
                    match std::mem::replace(&mut op.waiter, Waiter::None) {
                        Waiter::None => {}
                        Waiter::Local => op.outcome = Some(outcome),
                        Waiter::Slot(slot) => {
                            self.core.waiting -= 1;
                            // An async caller that dropped its future: a lock won for nobody
                            // is released like a lost one (every node, late OKs included).
                            let unclaimed = self.mailbox.as_deref().map(|m| &m.unclaimed);
                            if let Some(Outcome::Acquired(Ok(_))) = slot.deliver(outcome, unclaimed)
                            {
                                self.lost.push(index as u32);
                            }
                        }
                        Waiter::Keep(kept) => {
                            self.core.waiting -= 1;
                            self.keeps.decided.push((kept, Some(outcome)));
                        }
                        Waiter::KeepLost(kept) => {
                            self.core.waiting -= 1;
                            self.keeps.decided.push((kept, None));
                        }
                        Waiter::Attempt(w) => {
                            // Split: some nodes said yes, not enough, and some refused — a
                            // competing attempt took the others.
                            let split = matches!(outcome, Outcome::Acquired(Err(Error::Held(_))))
                                && (0..n).any(|i| op.round.vote(i) == Some(Vote::Yes));
                            self.attempts.push((w, op.token, outcome, split));
                        }
                    }
                }
            }
            if op.done && !op.silent_counted && matches!(op.kind, OpKind::Acquire | OpKind::Extend)
            {
                count_silent(&self.core.metrics, &mut self.core.silent, op, now);
            }
            if op.done && op.outstanding == 0 && op.outcome.is_none() {
                op.live = false;
                self.core.free.push(index as u32);
            }
        }
        if !self.fence_due.is_empty() {
            self.write_fences(now);
        }
        if !self.repair_due.is_empty() {
            self.write_repairs(now);
        }
        if !self.attempts.is_empty() {
            self.attempts_decided(now);
        }
        // Release everywhere at once after a lost acquire — refused and silent nodes too,
        // since a late yes may still come — without anybody waiting for the replies.
        // Every lost acquire's resource and token are copied out before the first release is
        // submitted: the acquires' slots may already be free, and a release may get the slot of
        // a lost acquire whose own release is still to come (it once did, and released the
        // first token twice and the second never: its keys lived out their TTL).
        let mut resources = std::mem::take(&mut self.resource);
        let mut releases = std::mem::take(&mut self.releases);
        resources.clear();
        releases.clear();
        let n = self.shared.nodes.len();
        for &index in &self.lost {
            let op = &self.core.ops[index as usize];
            let start = resources.len();
            resources.extend_from_slice(&op.resource);
            let quiet = (0..n)
                .filter(|&i| {
                    matches!(
                        op.faults[i].as_ref().map(NodeFault::root),
                        Some(NodeFault::Quarantined(_))
                    )
                })
                .fold(0, |m, i| m | node_bit(i));
            releases.push((start, resources.len(), op.token, quiet));
        }
        let all = self.all_nodes();
        for &(start, end, token, quiet) in &releases {
            // Not `submit`: a lost attempt's release does not hand the resource to a waiter.
            for (targets, silently) in [(all & !quiet, false), (quiet, true)] {
                if targets == 0 {
                    continue;
                }
                self.quiet_release = silently;
                self.submit_to(
                    ReqKind::Release,
                    &resources[start..end],
                    &token,
                    Waiter::None,
                    targets,
                    now,
                );
                self.quiet_release = false;
            }
        }
        self.resource = resources;
        self.releases = releases;
        if !self.keeps.decided.is_empty() {
            self.kept_decided(now);
        }
    }

    /// Starts the write-back of the fenced acquires in `fence_due` (see `fence.rs`): the fence
    /// goes to every node that granted the lock on the connection it answered on; the fence is
    /// handed out once a quorum took it, before the validity won ends.
    fn write_fences(&mut self, now: Instant) {
        let n = self.shared.nodes.len();
        let mut due = std::mem::take(&mut self.fence_due);
        for &index in &due {
            let Engine {
                net,
                core,
                scratch,
                shared,
                ..
            } = self;
            let config = &shared.config;
            let op = &mut core.ops[index as usize];
            let granted: u64 = (0..n)
                .filter(|&i| op.round.vote(i) == Some(Vote::Yes))
                .fold(0, |m, i| m | node_bit(i));
            let rc = RoundConfig {
                not_after: Some(op.until),
                ..RoundConfig::new(op.ttl, config.drift_factor, config.node_timeout_for(op.ttl))
            };
            op.fenced = 2;
            // A duplicate stays one: the fence goes to the entry that counted for its server.
            let duplicates: u64 = (0..n)
                .filter(|&i| matches!(op.faults[i], Some(NodeFault::Duplicate { .. })))
                .fold(0, |m, i| m | node_bit(i));
            for (node, fault) in op.faults.iter_mut().enumerate() {
                if duplicates & node_bit(node) == 0 {
                    *fault = None;
                }
            }
            op.runs.fill(None);
            op.round.start(now, &rc);
            let id = OpId { index, seq: op.seq };
            let (fence, reads) = (op.fence, op.reads);
            // Blank counters that may be seeded get the write-back too, whether or not they
            // hold our key (seeding is a write of a quorum's maximum; it counts only with the
            // key): fewer blank nodes, fewer acquires short of a seeded quorum.
            let seeds = reads.seeds(n);
            for node in 0..n {
                let op = &mut core.ops[index as usize];
                if duplicates & node_bit(node) != 0 {
                    op.round.handle_vote(node, Vote::Failed, now);
                    continue;
                }
                if (granted | seeds) & node_bit(node) == 0 {
                    // Holds no key of ours: would not take the fence.
                    op.round.handle_vote(node, Vote::Refused, now);
                    continue;
                }
                let session = net.session(node);
                let same = session.is_ready() && session.generation() == op.gens[node];
                let Some(info) = session.info().filter(|_| same) else {
                    // A new connection since it answered: maybe a new process, whose counter
                    // our reads did not see.
                    op.faults[node] = Some(NodeFault::Closed);
                    op.round.handle_vote(node, Vote::Failed, now);
                    continue;
                };
                let seed: &[u8] = if seeds & node_bit(node) != 0 {
                    b"1"
                } else {
                    b"0"
                };
                let call = script_call(
                    scratch,
                    &scripts()[3],
                    id.tag(),
                    &[
                        Arg::Int(2),
                        Arg::Bytes(&op.resource),
                        Arg::Bytes(FENCE_KEY.as_bytes()),
                        Arg::Bytes(op.token.as_bytes()),
                        Arg::UInt(fence),
                        Arg::Bytes(&info.run_id),
                        Arg::Bytes(seed),
                    ],
                );
                let sent = net.script(node, call, now, &mut core.sink());
                core.sent(id, node, sent, now);
            }
        }
        due.clear();
        self.fence_due = due;
    }

    /// Sends the writes of the fence repairs in `repair_due` (see `repair.rs`): to each node
    /// the repair planned for, on the connection its counter was read on, with that
    /// connection's `run_id`; a node on a new connection since does not take it.
    fn write_repairs(&mut self, now: Instant) {
        let n = self.shared.nodes.len();
        let mut due = std::mem::take(&mut self.repair_due);
        for &index in &due {
            let Engine {
                net, core, scratch, ..
            } = self;
            let op = &core.ops[index as usize];
            let id = OpId { index, seq: op.seq };
            let Some(repair) = op.repair.as_deref() else {
                continue;
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
                    // A new connection since the read: maybe a new process, whose counter
                    // the read did not see.
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
        due.clear();
        self.repair_due = due;
    }

    /// Applies decided extends of kept locks (a lost one is marked lost and released), and
    /// hands the callbacks of lost locks whose release is over to the callback thread.
    fn kept_decided(&mut self, now: Instant) {
        let mut decided = std::mem::take(&mut self.keeps.decided);
        for (kept, outcome) in decided.drain(..) {
            let Some(outcome) = outcome else {
                // The release of a lost lock is over: every node that answered in time has
                // deleted our token; now the callback.
                kept.settle_loss();
                continue;
            };
            kept.extending.store(false, Ordering::Relaxed);
            // Its timer moves: look at the list again (in this same turn: see `drive_until`).
            self.keeps.next = Some(now);
            if kept.is_lost() {
                // Ended by its holder while the extend was in flight (the holder's release
                // went out behind it on every connection).
                continue;
            }
            if let Outcome::Extended(valid_until, result) = outcome {
                // Also after a lost extend: its validity is cut to what the nodes still back.
                kept.set_valid_until(valid_until);
                match result {
                    Ok(()) => {
                        kept.extended();
                        self.shared.keep_extended.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => self.keeps.lost.push((kept, why)),
                }
            }
        }
        self.keeps.decided = decided;
        self.release_lost_keeps(now);
    }

    /// Marks the locks in `keeps.lost` lost (every holder learns first, before any round
    /// trip), then releases them on every node, waiting for the replies as an unlock does: the
    /// callback runs when that is over, so it never finds our stale token on a node that
    /// answered.
    fn release_lost_keeps(&mut self, now: Instant) {
        let mut lost = std::mem::take(&mut self.keeps.lost);
        lost.retain(|(kept, why)| kept.mark_lost(why.clone()));
        #[cfg(feature = "log")]
        for (kept, why) in &lost {
            let resource = kept.base().resource().escape_ascii();
            event!(Warn, event = "lost", resource:% = resource, why:% = why;
                "{resource}: kept lock lost: {why}");
        }
        for (kept, _) in lost.drain(..) {
            let (resource, token) = (kept.base().resource(), *kept.base().token());
            let waiter = Waiter::KeepLost(kept.clone());
            self.submit(ReqKind::Release, resource, &token, waiter, now);
        }
        self.keeps.lost = lost;
    }

    /// The keep-alive timers: extends every kept lock that is due (with those due within the
    /// coalescing window) in one batch, one write per node; marks expired ones lost; forgets the
    /// ones their holder ended.
    fn tick_keeps(&mut self, now: Instant) {
        if self.keeps.next.is_none_or(|t| t > now) {
            return;
        }
        let Keeps {
            locks,
            renew_left,
            coalesce,
            due,
            lost,
            ..
        } = &mut self.keeps;
        // The next timer of the locks not in this tick's batch, and of the batch's (which only
        // counts when nothing is really due: then no batch goes out).
        let mut next_rest: Option<Instant> = None;
        let mut next_due: Option<Instant> = None;
        let mut any_due = false;
        let mut i = 0;
        while i < locks.len() {
            let kept = &locks[i];
            if kept.is_lost() {
                // Lost (its release is under way) or ended by the holder: not ours any more.
                locks.swap_remove(i);
                continue;
            }
            if kept.extending.load(Ordering::Relaxed) {
                i += 1;
                continue;
            }
            let valid_until = kept.valid_until();
            if now >= valid_until {
                lost.push((locks.swap_remove(i), Error::Expired { released: 0 }));
                continue;
            }
            let at = valid_until.checked_sub(*renew_left).unwrap_or(now);
            let next = if at <= now + *coalesce {
                any_due |= at <= now;
                due.push(kept.clone());
                &mut next_due
            } else {
                &mut next_rest
            };
            *next = Some(next.map_or(at, |n| n.min(at)));
            i += 1;
        }
        if !any_due {
            // Only when one of them is really due: the others just come along.
            due.clear();
            self.keeps.next = [next_rest, next_due].into_iter().flatten().min();
        } else {
            let mut batch = std::mem::take(due);
            // The others' timers; the batch's come back when their extends are decided.
            self.keeps.next = next_rest;
            let ttl = self.shared.config.ttl;
            for kept in batch.drain(..) {
                let lock = kept.lock();
                match ReqKind::extend(&self.shared.config, &lock, ttl, now) {
                    Ok(kind) => {
                        kept.extending.store(true, Ordering::Relaxed);
                        let waiter = Waiter::Keep(kept.clone());
                        self.submit(kind, lock.resource(), lock.token(), waiter, now);
                    }
                    Err(why) => self.keeps.lost.push((kept, why)),
                }
            }
            self.keeps.due = batch;
            let before = self.net.writes();
            self.flush(now);
            let shared = &self.shared;
            shared.keep_ticks.fetch_add(1, Ordering::Relaxed);
            shared
                .keep_writes
                .fetch_add(self.net.writes() - before, Ordering::Relaxed);
        }
        self.release_lost_keeps(now);
    }

    /// Sends the ledger's releases to nodes that can take them, paced within the connection's
    /// room for requests.
    ///
    /// An entry whose key's TTL has passed is sent all the same once its node is back (it
    /// stays in the ledger only while its node is unreachable): a node frozen (SIGSTOP, a VM
    /// pause) longer than the TTL runs, when it resumes, a `SET` still in its socket buffer,
    /// and that key would block the resource there for a TTL. The release goes out on a new
    /// connection, behind a handshake the node answers only once it runs again, so after the
    /// stale `SET`; it deletes only our own token. At most `max_pending` entries per node
    /// (`Ledger::add` drops the oldest).
    ///
    /// Paced: at most half of `max_pending` requests outstanding on the connection at once
    /// (the replies bring the next turn), so the ledger's burst leaves a fresh connection room
    /// for the callers' requests. (Under steady load the callers' requests may keep it above
    /// half, and the ledger waits: its keys' TTLs bound what that costs.)
    fn flush_ledger(&mut self, now: Instant) {
        if self.core.ledger.len == 0 {
            return;
        }
        let n = self.shared.nodes.len();
        for node in 0..n {
            if self.core.ledger.nodes[node].is_empty() {
                continue;
            }
            let conn = self.net.session(node);
            if !conn.is_ready() {
                // Reconnect if not backing off; the next turn tries again.
                if !conn.is_connecting() {
                    let Engine { net, core, .. } = self;
                    let _ = net.ensure_connected(node, now, &mut core.sink());
                }
                continue;
            }
            let share = match self.shared.regression {
                Regression::LedgerUnpaced => self.core.max_pending,
                _ => (self.core.max_pending / LEDGER_SHARE_OF_PENDING).max(1),
            };
            let room = share.saturating_sub(conn.pending());
            for _ in 0..room {
                let Some(e) = self.core.ledger.nodes[node].pop_front() else {
                    break;
                };
                self.core.ledger.len -= 1;
                self.replay_until = Some(e.expires);
                self.submit_to(
                    ReqKind::Release,
                    &e.resource,
                    &e.token,
                    Waiter::None,
                    node_bit(node),
                    now,
                );
            }
        }
    }

    /// The earliest deadline of an undone operation.
    fn next_deadline(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for op in self.core.ops.iter().filter(|o| o.live && !o.done) {
            let t = match op.kind {
                // A fenced acquire that won the lock may still wait for counters.
                OpKind::Acquire if op.fenced == 1 && op.round.poll_decision().is_some() => {
                    op.round.node_deadline()
                }
                // A write-back decided as it was sent (every target failed at once): due now.
                OpKind::Acquire if op.fenced == 2 && op.round.poll_decision().is_some() => {
                    Some(op.start)
                }
                OpKind::Acquire | OpKind::Extend => op.round.poll_timeout(),
                OpKind::Release => op
                    .wait
                    .iter()
                    .filter_map(|w| match w {
                        Wait::Until(t, _) => Some(*t),
                        Wait::No => None,
                    })
                    .min(),
                OpKind::Status => Some(op.until),
                // A round trip whose every node failed as it was sent: due now.
                OpKind::Repair if op.repair.as_ref().is_some_and(|r| r.round_done()) => {
                    Some(op.start)
                }
                OpKind::Repair => Some(op.until),
                // Its queue's timers are the waits' (`Waits::next`).
                OpKind::Wait => None,
            };
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        [next, self.timer(), self.waits.next()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the loop until `done` says so or `until` has passed. Each turn: take requests in,
    /// settle what is due, write (one `write` per node), wait for replies or the next deadline.
    pub fn drive_until(&mut self, until: Instant, mut done: impl FnMut(&Engine<N>) -> bool) {
        loop {
            let now = self.net.now();
            self.step(now);
            if done(self) || now >= until {
                return;
            }
            let wake = self.next_deadline().map_or(until, |t| t.min(until));
            if wake > now {
                self.sleep_turn(wake);
            } else {
                self.drain(now);
            }
        }
    }

    /// One turn at `now`, without waiting: takes the mailbox in, sends the ledger's releases,
    /// renews kept locks, settles what is due (round deadlines, graces), hands outcomes over and
    /// writes (one write per node). What arrived must have been taken in before
    /// ([`Engine::drain`] or [`Engine::take_input`]). A simulator calls this at every event
    /// of its virtual time; [`Engine::drive_until`] calls it at every turn of the real loop.
    pub fn step(&mut self, now: Instant) {
        self.take_events(now);
        if self.held(now).is_none() {
            self.take_inbox(now);
        }
        self.fire_alarms(now);
        self.flush_ledger(now);
        self.tick_keeps(now);
        self.settle(now);
        // Extends decided in `settle` moved their locks' timers: look again now, so that the
        // timer a driver leaves behind is never one already past.
        self.tick_keeps(now);
        self.tick_waits(now);
        self.flush(now);
    }

    /// Takes in what the network delivered, without waiting (for a network that never waits,
    /// such as the simulator's; the real loop waits in [`Engine::drive_until`]).
    // Used by the simulator (feature `sim`).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub fn take_input(&mut self, now: Instant) {
        let Engine { net, core, .. } = self;
        net.turn(now, &mut core.sink());
    }

    /// When the engine next needs a [`Engine::step`] although nothing arrives: an operation's
    /// deadline, a kept lock's timer, a connection deadline, the ledger's next try.
    // Used by the simulator (feature `sim`).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        [self.next_deadline(), self.background_deadline(now)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Waits in `poll` until `until` or a reply, unless a request is queued in the mailbox
    /// (and not [`Engine::held`]: then until the hold ends at the latest).
    fn sleep_turn(&mut self, until: Instant) {
        if let Some(mailbox) = self.mailbox.clone() {
            let held = self.held(self.net.now());
            let until = held.map_or(until, |h| h.min(until));
            if !mailbox.sleep_begin(held.is_some()) {
                if mailbox.wanted.load(Ordering::SeqCst) > 0 {
                    // Someone waits for the loop and this driver does not stop for it (its
                    // operation is not decided yet): it must not stop reading meanwhile.
                    let now = self.net.now();
                    let Engine { net, core, .. } = self;
                    net.turn(now, &mut core.sink());
                }
                return;
            }
            let Engine { net, core, .. } = self;
            net.turn(until, &mut core.sink());
            mailbox.sleep_end();
        } else {
            let Engine { net, core, .. } = self;
            net.turn(until, &mut core.sink());
        }
    }

    /// Connects to every node now and waits until each handshake is done, has failed, or
    /// `timeout` has passed; returns how many nodes are ready.
    pub fn connect(&mut self, timeout: Duration) -> usize {
        let now = self.net.now();
        let deadline = deadline_after(now, timeout);
        let n = self.shared.nodes.len();
        let Engine { net, core, .. } = self;
        let mut sink = core.sink();
        let mut ready = net.connect_all(now, &mut sink);
        net.flush(now, &mut sink);
        // Until every node is ready or down: a refused node does not hold the others up.
        while ready < n && (0..n).any(|i| net.session(i).is_connecting()) && net.now() < deadline {
            net.turn(deadline, &mut sink);
            ready = (0..n).filter(|&i| net.session(i).is_ready()).count();
        }
        ready
    }

    /// Runs the loop until `done` says so.
    pub fn drive(&mut self, done: impl FnMut(&Engine<N>) -> bool) {
        self.drive_until(deadline_after(self.net.now(), Duration::MAX), done);
    }

    /// True once the operation is decided.
    pub fn is_done(&self, id: OpId) -> bool {
        let op = &self.core.ops[id.index as usize];
        op.seq != id.seq || op.done
    }

    /// Takes a local operation's outcome (after [`Engine::is_done`]).
    pub fn take(&mut self, id: OpId) -> Option<Outcome> {
        let op = &mut self.core.ops[id.index as usize];
        if op.seq != id.seq {
            return None;
        }
        let outcome = op.outcome.take();
        if op.done && op.outstanding == 0 {
            op.live = false;
            self.core.free.push(id.index);
        }
        outcome
    }

    /// Runs one local operation to its outcome: drains, submits, drives.
    pub fn run(&mut self, kind: ReqKind, resource: &[u8], token: &Token) -> Outcome {
        let now = self.net.now();
        self.drain(now);
        // Requests queued before this one go first: a release not waited for must reach its
        // nodes before a later acquire of the same resource.
        self.take_inbox(now);
        let id = self.submit(kind, resource, token, Waiter::Local, now);
        self.flush(now);
        self.drive(|e| e.is_done(id));
        self.take(id)
            .expect("a local operation keeps its outcome until taken")
    }

    /// Runs a waiting acquire on the driving thread until it is decided or has to wait (its
    /// attempt refused, or in line behind others): `Err(id)` then, for the caller to
    /// [`Engine::adopt`] it with a slot and let go of the loop rather than hold it for the
    /// whole wait.
    pub fn run_until_waiting(
        &mut self,
        kind: ReqKind,
        resource: &[u8],
        token: &Token,
    ) -> Result<Outcome, OpId> {
        let now = self.net.now();
        self.drain(now);
        self.take_inbox(now);
        let id = self.submit(kind, resource, token, Waiter::Local, now);
        self.flush(now);
        self.drive(|e| e.is_done(id) || e.is_waiting(id));
        if self.is_done(id) {
            return Ok(self
                .take(id)
                .expect("a local operation keeps its outcome until taken"));
        }
        Err(id)
    }

    /// True while the waiting operation `id` waits in its queue with no attempt in flight.
    fn is_waiting(&self, id: OpId) -> bool {
        let op = &self.core.ops[id.index as usize];
        op.kind == OpKind::Wait
            && !op.done
            && self
                .waits
                .get(&op.resource)
                .is_some_and(|q| q.attempt != Some(id) && q.waiters.contains(&id))
    }

    /// Hands the undecided waiting operation `id` to `slot`: its outcome goes there, and the
    /// slot's thread is unparked.
    pub fn adopt(&mut self, id: OpId, slot: Arc<Slot>) {
        let op = &mut self.core.ops[id.index as usize];
        debug_assert!(matches!(op.waiter, Waiter::Local) && !op.done);
        op.waiter = Waiter::Slot(slot);
        self.core.waiting += 1;
    }

    /// Runs several local operations side by side to their outcomes: every node gets all their
    /// requests in one write. An outcome is `None` only if its slot was lost (a bug).
    pub fn run_all<'r>(
        &mut self,
        requests: impl IntoIterator<Item = (ReqKind, &'r [u8], Token)>,
    ) -> Vec<Option<Outcome>> {
        let now = self.net.now();
        self.drain(now);
        let ids: Vec<OpId> = requests
            .into_iter()
            .map(|(kind, resource, token)| self.submit(kind, resource, &token, Waiter::Local, now))
            .collect();
        self.flush(now);
        self.drive(|e| ids.iter().all(|&id| e.is_done(id)));
        ids.into_iter().map(|id| self.take(id)).collect()
    }

    /// Drives until every release is confirmed or `deadline` passes.
    pub fn shutdown(&mut self, deadline: Instant) -> Shutdown {
        let before = self.core.confirmed;
        // Kept locks still here (their holders are gone): released like a dropped `KeepAlive`.
        let now = self.net.now();
        for kept in std::mem::take(&mut self.keeps.locks) {
            if kept.end_by_holder() {
                let (resource, token) = (kept.base().resource(), *kept.base().token());
                self.submit(ReqKind::Release, resource, &token, Waiter::None, now);
            }
        }
        self.keeps.next = None;
        self.drive_until(deadline, |e| {
            e.unconfirmed_live(e.net.now()) == 0 && e.waiting() == 0
        });
        Shutdown {
            confirmed: self.core.confirmed - before,
            unconfirmed: self.unconfirmed_live(self.net.now()) as u64,
        }
    }
}

impl Core {
    /// What the [`Net`] hands every reply and fault to, stamped with the time of its clock.
    fn sink(&mut self) -> impl for<'a> FnMut(usize, Instant, Delivery<'a>) + '_ {
        |i, now, d| self.on_delivery(i, d, now)
    }

    fn alloc(&mut self, n: usize, now: Instant) -> OpId {
        let index = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.ops.push(Op::new(n, now));
                self.ops.len() - 1
            }
        };
        let op = &mut self.ops[index];
        op.seq = op.seq.wrapping_add(1);
        op.live = true;
        op.done = false;
        OpId {
            index: index as u32,
            seq: op.seq,
        }
    }

    /// Records the outcome of queuing one request.
    fn sent(&mut self, id: OpId, node: usize, sent: Result<(), NodeFault>, now: Instant) {
        let counters = self.metrics.node(node);
        counters.requests.bump();
        match sent {
            Ok(()) => self.ops[id.index as usize].outstanding += 1,
            Err(fault) => {
                counters.failures.bump();
                self.fail(id, node, fault, now);
            }
        }
    }

    /// A request that failed: a vote lost, a release to remember.
    fn fail(&mut self, id: OpId, node: usize, fault: NodeFault, now: Instant) {
        let op = &mut self.ops[id.index as usize];
        match op.kind {
            OpKind::Acquire | OpKind::Extend => {
                if !op.done {
                    op.faults[node] = Some(fault);
                    op.round.handle_vote(node, Vote::Failed, now);
                }
            }
            OpKind::Release => {
                // Even past the key's TTL: a node that comes back may still run a `SET` that
                // was in its socket buffer (see `Engine::flush_ledger`).
                op.wait[node] = Wait::No;
                let (resource, token, expires) = (op.resource.clone(), op.token, op.until);
                self.ledger
                    .add(node, resource, token, expires, self.max_pending);
            }
            OpKind::Status => {
                if let Some(status) = op.status.as_mut() {
                    status.values[node].get_or_insert(Err(fault.clone()));
                    status.ttls[node].get_or_insert((Err(fault), now));
                    status.fences[node].get_or_insert(None);
                }
            }
            OpKind::Repair => {
                if let Some(repair) = op.repair.as_mut().filter(|_| !op.done) {
                    repair.fail(node, fault);
                }
            }
            // Sends nothing of its own.
            OpKind::Wait => {}
        }
    }

    /// A reply (or a fault) for a request of operation `d.tag`.
    fn on_delivery(&mut self, node: usize, d: Delivery<'_>, now: Instant) {
        if d.reply.is_ok() {
            // It answers again: waited for again.
            self.silent &= !node_bit(node);
        }
        match (d.kind, &d.reply) {
            (Kind::Notice, Ok(Frame::Aggregate(push))) => {
                // Not from a node in its restart quarantine: no attempt can win there, and the
                // notice may be our own lost attempt's cleanup, whose yes there came after the
                // round was lost (so `Engine::quiet_release` did not know to keep it quiet) —
                // heard by our own subscription, it brought the next attempt at once, again and
                // again. The holder's release also publishes on the other nodes.
                if let (Some(window), Some(watch)) = (self.window, self.watch.get_mut(node))
                    && watch
                        .quarantine_left(window, d.generation, d.info, now)
                        .is_some()
                {
                    return;
                }
                // `message`, channel, payload.
                if let Some(Frame::Bulk(channel)) = push.iter().nth(1)
                    && let Some(resource) =
                        channel.strip_prefix(crate::session::RELEASE_CHANNEL_PREFIX.as_bytes())
                {
                    let start = self.events.len();
                    self.events.extend_from_slice(resource);
                    self.notices.push((start, self.events.len()));
                }
                return;
            }
            (Kind::Subscribe | Kind::Upgrade, Ok(Frame::Error(_))) => {
                self.no_notices[node] = true;
                return;
            }
            (Kind::Upgrade, Ok(_)) => {
                self.resp3[node] = Some(d.generation);
                return;
            }
            (Kind::Notice | Kind::Subscribe | Kind::Upgrade, _) => return,
            _ => {}
        }
        if !d.withdrawn {
            count_reply(self.metrics.node(node), d.kind, &d.reply);
        }
        let Some(id) = OpId::from_tag(d.tag) else {
            return;
        };
        let Some(op) = self.ops.get_mut(id.index as usize) else {
            return;
        };
        if op.seq != id.seq || !op.live {
            return;
        }
        if op.fenced == 2 && d.kind != Kind::Script(3) {
            // A late answer of the first round trip of a fenced acquire that has moved on to
            // its write-back: nothing more to learn from it (a late yes is released with the
            // lock, on every node).
            if !d.withdrawn {
                op.outstanding = op.outstanding.saturating_sub(1);
            }
            return;
        }
        if d.withdrawn {
            // The node's answer came with surplus frames or garbage: it does not count.
            match op.kind {
                OpKind::Acquire | OpKind::Extend => {
                    if !op.done {
                        op.reads.forget(node);
                        op.runs[node] = None;
                        if let Err(fault) = d.reply {
                            op.faults[node] = Some(fault.clone());
                        }
                        op.round.handle_withdraw(node, now);
                    }
                }
                OpKind::Release => {
                    if op.counted & node_bit(node) != 0 {
                        op.counted &= !node_bit(node);
                        op.released -= 1;
                    }
                }
                OpKind::Status => {
                    if let (Some(status), Err(fault)) = (op.status.as_mut(), d.reply) {
                        status.values[node] = Some(Err(fault.clone()));
                        status.ttls[node] = Some((Err(fault.clone()), now));
                        status.fences[node] = Some(None);
                    }
                }
                OpKind::Repair => {
                    if let (Some(repair), Err(fault), false) =
                        (op.repair.as_mut(), d.reply, op.done)
                    {
                        repair.withdraw(node, fault.clone());
                    }
                }
                OpKind::Wait => {}
            }
            return;
        }
        op.outstanding = op.outstanding.saturating_sub(1);
        match op.kind {
            OpKind::Acquire | OpKind::Extend => {
                if op.done {
                    op.late |= node_bit(node);
                    if d.kind == Kind::Set
                        && matches!(d.reply, Ok(Frame::Simple("OK")))
                        && op.round.node_deadline().is_some_and(|t| now <= t)
                    {
                        // A yes after the decision, within the node timeout: not a failure.
                        self.metrics.node(node).late_yes.bump();
                    }
                    return;
                }
                if d.kind == Kind::Script(3) && d.generation != op.gens[node] {
                    // A write-back that went out on a connection other than the one its node
                    // answered the first round trip on (maybe to another process): not counted.
                    op.faults[node] = Some(NodeFault::Closed);
                    op.round.handle_vote(node, Vote::Failed, now);
                    return;
                }
                let fenced_set = matches!(d.kind, Kind::Script(2 | 4));
                let mut vote = match &d.reply {
                    Ok(frame @ Frame::Aggregate(_)) if fenced_set => {
                        let run_id = d.info.as_ref().map(|i| &i.run_id);
                        match crate::fence::parse_acquire(frame, run_id) {
                            Some((won, reading)) => {
                                // A blank counter may be seeded by this acquire only if its
                                // node was up for a whole window before the acquire began.
                                // Every answer updates the node's restart tracking, so that a
                                // new run_id seen at the address (a restart, a failover) counts
                                // the whole window from when it was noticed.
                                let settled = self.fence_watch[node]
                                    .quarantine_left(
                                        self.seed_window,
                                        d.generation,
                                        d.info,
                                        op.start,
                                    )
                                    .is_none();
                                let seedable = matches!(reading, Reading::Blank(_)) && settled;
                                op.reads.add(node, won, reading, seedable, self.flaw);
                                op.gens[node] = d.generation;
                                Ok(if won { Vote::Yes } else { Vote::Refused })
                            }
                            None => Err(NodeFault::Unexpected(format!("{:?}", frame.to_value()))),
                        }
                    }
                    _ => vote_of(d.kind, &d.reply),
                };
                // Only a SET NX yes is doubtful: a node that lost its keys in a restart may
                // grant a lock that is held. An extend yes proves the node still holds our
                // token, so it is refusing everyone else and counts.
                if vote == Ok(Vote::Yes)
                    && (d.kind == Kind::Set || fenced_set)
                    && let (Some(window), Some(watch)) = (self.window, self.watch.get_mut(node))
                    && let Some(left) = watch.quarantine_left(window, d.generation, d.info, now)
                {
                    self.metrics.node(node).quarantined.bump();
                    if self.quarantine_told[node] != d.generation {
                        self.quarantine_told[node] = d.generation;
                        event!(Warn, event = "quarantined", node:% = self.nodes[node],
                            left_ms = left.as_millis() as u64;
                            "{}: restarted recently, its yeses do not count for {} ms more",
                            self.nodes[node], left.as_millis());
                    }
                    vote = Err(NodeFault::Quarantined(left));
                }
                // The process answering: none for a fault (no answer), or when not known.
                let run_id = d.info.filter(|_| d.reply.is_ok()).map(|info| info.run_id);
                op.record_vote(node, vote, run_id.as_ref(), &self.nodes, now);
            }
            OpKind::Release => match d.reply {
                Ok(frame) => {
                    self.confirmed += 1;
                    if now.saturating_duration_since(op.start) < self.node_timeout {
                        // Keeping up (within the node timeout), even if this release did not
                        // wait for it: waited for again next time. Under constant load its
                        // queue never drains, so this is how a slow node gets back.
                        self.slow[node] = false;
                    }
                    op.wait[node] = Wait::No;
                    // 1 + 2 × the clients our release notice reached (see `RELEASE_BODY`).
                    if let Frame::Integer(answer) = frame
                        && answer & 1 == 1
                        && op.counted & node_bit(node) == 0
                    {
                        op.counted |= node_bit(node);
                        op.released += 1;
                        let listeners = (answer >> 1) as u64;
                        if listeners > 0 {
                            let start = self.events.len();
                            self.events.extend_from_slice(&op.resource);
                            self.listened.push((start, self.events.len(), listeners));
                        }
                    }
                }
                Err(fault) => {
                    let fault = fault.clone();
                    self.fail(id, node, fault, now);
                }
            },
            OpKind::Status => {
                let Some(status) = op.status.as_mut() else {
                    return;
                };
                let unexpected =
                    |f: &Frame<'_>| NodeFault::Unexpected(format!("{:?}", f.to_value()));
                if status.values[node].is_none() {
                    if let Some(info) = d.info.filter(|_| d.reply.is_ok()) {
                        let uptime = info.uptime + now.saturating_duration_since(info.seen);
                        let left = self.window.and_then(|window| {
                            self.watch[node].quarantine_left(window, d.generation, d.info, now)
                        });
                        status.restart[node] = (Some(uptime), left);
                    }
                    status.values[node] = Some(match d.reply {
                        Ok(Frame::Bulk(b)) => Ok(Some(b.to_vec())),
                        Ok(Frame::Null) => Ok(None),
                        Ok(other) => Err(unexpected(&other)),
                        Err(f) => Err(f.clone()),
                    });
                } else if status.ttls[node].is_none() {
                    let pttl = match d.reply {
                        Ok(Frame::Integer(ms)) => Ok(ms),
                        Ok(other) => Err(unexpected(&other)),
                        Err(f) => Err(f.clone()),
                    };
                    status.ttls[node] = Some((pttl, now));
                } else if status.fences[node].is_none() {
                    // `run` and `n`; seeded when `run` is this connection's process.
                    let fence = match d.reply {
                        Ok(Frame::Aggregate(a)) => {
                            let mut it = a.iter();
                            let run = it.next();
                            let counter = match it.next() {
                                Some(Frame::Bulk(b)) => crate::fence::parse_u64(b),
                                Some(Frame::Null) => Some(0),
                                _ => None,
                            };
                            counter.map(|counter| NodeFence {
                                counter,
                                seeded: matches!(
                                    (run, d.info),
                                    (Some(Frame::Bulk(r)), Some(info)) if r == info.run_id
                                ),
                            })
                        }
                        _ => None,
                    };
                    status.fences[node] = Some(fence);
                }
            }
            OpKind::Repair => {
                let Some(repair) = op.repair.as_mut().filter(|_| !op.done) else {
                    return;
                };
                let reply = d.reply.as_ref().map_err(|f| *f);
                match d.kind {
                    Kind::Command if repair.is_reading() => {
                        let run_id = d.info.filter(|_| d.reply.is_ok()).map(|i| i.run_id);
                        // A blank counter may be repaired only if its process was up for a
                        // whole seed window before the repair began, as for seeding by an
                        // acquire (the same restart tracking).
                        let window_left = run_id.and_then(|_| {
                            self.fence_watch[node].quarantine_left(
                                self.seed_window,
                                d.generation,
                                d.info,
                                op.start,
                            )
                        });
                        repair.on_read(node, reply, run_id.as_ref(), d.generation, window_left);
                    }
                    Kind::Script(REPAIR_SCRIPT) => repair.on_written(node, reply, d.generation),
                    // A late answer of round trip 1.
                    _ => {}
                }
            }
            OpKind::Wait => {}
        }
    }
}

impl Ledger {
    /// Remembers a release to send again; at most `max` per node. A full list keeps what it
    /// has and drops the new entry: entries pile up while their node is unreachable, and the
    /// first ones are those whose `SET`s may have been written before it failed (a frozen
    /// node may still run them), while later requests failed at once, their `SET`s never
    /// sent.
    fn add(&mut self, node: usize, resource: Vec<u8>, token: Token, expires: Instant, max: usize) {
        let q = &mut self.nodes[node];
        if q.len() >= max || q.iter().any(|e| e.token == token && e.resource == resource) {
            return;
        }
        let at = q.partition_point(|e| e.expires <= expires);
        q.insert(
            at,
            Unconfirmed {
                resource,
                token,
                expires,
            },
        );
        self.len += 1;
    }
}

/// What an answer is, given the other entries of its round (see [`one_vote_per_server`]).
#[derive(Debug, Clone, Copy)]
enum Counts {
    /// No other entry of the round answered from the same server process.
    Alone,
    /// Listed before the other entry that answered from its server process: it counts, with the
    /// better of the two answers; the other entry becomes a duplicate.
    Keeps {
        twin: usize,
        run_id: [u8; 40],
        better: Option<Vote>,
    },
    /// Listed after it: a duplicate; the other entry takes this answer if it is better.
    Duplicate {
        twin: usize,
        run_id: [u8; 40],
        better: Option<Vote>,
    },
}

/// One vote per server process: two entries of the server list that lead to the same process
/// (the same `run_id`: one server's TCP port and Unix socket, two of its addresses) would count
/// twice towards the quorum. Their answers in a round count once, for the entry listed first,
/// whichever came first, and as the better of the two (a yes over a refusal over a failure: the
/// same server's `SET NX` grants one connection and refuses the other — our own key — in
/// whatever order they reach it). The other entry is a duplicate. Records the `run_id` of the
/// entry that counts.
fn one_vote_per_server(
    op: &mut Op,
    node: usize,
    run_id: &[u8; 40],
    vote: &Result<Vote, NodeFault>,
) -> Counts {
    let twin = (0..op.runs.len())
        .find(|&k| k != node && op.runs[k].as_ref() == Some(run_id) && op.round.vote(k).is_some());
    let Some(twin) = twin else {
        op.runs[node] = Some(*run_id);
        return Counts::Alone;
    };
    let rank = |vote: Option<Vote>| match vote {
        Some(Vote::Yes) => 2,
        Some(Vote::Refused) => 1,
        Some(Vote::Failed) | None => 0,
    };
    let (this, that) = (vote.as_ref().ok().copied(), op.round.vote(twin));
    if node < twin {
        op.runs[twin] = None;
        op.runs[node] = Some(*run_id);
        Counts::Keeps {
            twin,
            run_id: *run_id,
            better: that.filter(|_| rank(that) > rank(this)),
        }
    } else {
        Counts::Duplicate {
            twin,
            run_id: *run_id,
            better: this.filter(|_| rank(this) > rank(that)),
        }
    }
}

/// The entry listed before `node` that leads to the same server process, with its `run_id`, as
/// both entries' live connections said in their handshakes (`INFO server`); `None` while either
/// is not known.
fn listed_before<N: Net>(net: &N, node: usize) -> Option<(usize, [u8; 40])> {
    let known = |i: usize| {
        let session = net.session(i);
        session.info().filter(|_| session.is_ready())
    };
    let run_id = known(node)?.run_id;
    (0..node)
        .find(|&k| known(k).is_some_and(|info| info.run_id == run_id))
        .map(|k| (k, run_id))
}

/// The fault of an entry that leads to the same server process as entry `of`.
fn duplicate(nodes: &[crate::addr::NodeAddr], of: usize, run_id: &[u8; 40]) -> NodeFault {
    NodeFault::Duplicate {
        of: nodes[of].to_string(),
        run_id: String::from_utf8_lossy(run_id).into_owned(),
    }
}

/// True if the operation's async caller dropped its future.
fn is_cancelled(op: &Op) -> bool {
    matches!(&op.waiter, Waiter::Slot(slot) if slot.is_cancelled())
}

/// A seed for the waits' pauses: differs between processes and engines.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let here = &nanos as *const u64 as u64;
    nanos ^ (u64::from(std::process::id()) << 32) ^ here.rotate_left(17)
}

/// Encodes `args` as bulk strings (no array header): the tail of a script call.
fn script_call<'a>(
    buf: &'a mut BytesMut,
    script: &'a Script,
    tag: u64,
    args: &[Arg<'_>],
) -> ScriptCall<'a> {
    buf.clear();
    buf.reserve(args.iter().map(crate::resp::bulk_len).sum());
    for arg in args {
        crate::resp::encode_bulk(buf, arg);
    }
    ScriptCall {
        script,
        tag,
        tail: buf,
        argc: args.len(),
    }
}

/// What a reply means for a vote, per request kind.
fn vote_of(kind: Kind, reply: &Result<Frame<'_>, &NodeFault>) -> Result<Vote, NodeFault> {
    match (kind, reply) {
        (_, Err(fault)) => Err((*fault).clone()),
        (Kind::Set, Ok(Frame::Simple("OK"))) => Ok(Vote::Yes),
        (Kind::Set, Ok(Frame::Null)) => Ok(Vote::Refused),
        (Kind::Script(_), Ok(Frame::Integer(1))) => Ok(Vote::Yes),
        (Kind::Script(_), Ok(Frame::Integer(0))) => Ok(Vote::Refused),
        (_, Ok(Frame::Error(e))) if e.kind.is_auth() => Err(NodeFault::Auth(e.message.to_owned())),
        (_, Ok(Frame::Error(e))) => Err(NodeFault::Server(e.kind, e.message.to_owned())),
        (_, Ok(other)) => Err(NodeFault::Unexpected(format!("{:?}", other.to_value()))),
    }
}

/// The report of a fenced acquire that won the lock but read too few seeded counters: the
/// seeded nodes count as yes, the blank and silent ones as failed.
fn fence_report(nodes: &Arc<[crate::addr::NodeAddr]>, op: &Op, quorum: usize) -> Report {
    let short = op.reads.short();
    let mut failed = Vec::new();
    for node in 0..nodes.len() {
        let bit = node_bit(node);
        if short.blank & bit != 0 {
            failed.push((node, NodeFault::FenceBlank));
        } else if short.unknown & bit != 0 {
            failed.push((
                node,
                NodeFault::Unexpected(
                    "no run_id from INFO server: fencing needs it (grant +info)".into(),
                ),
            ));
        } else if short.seeded & bit == 0 {
            let fault = op.faults[node].clone().unwrap_or(NodeFault::Timeout);
            failed.push((node, fault));
        }
    }
    Report {
        nodes: nodes.clone(),
        quorum,
        yes: short.seeded.count_ones() as usize,
        said_yes: short.seeded,
        refused: 0,
        failed,
        refusal: Refusal::HeldElsewhere,
    }
}

/// What each node said to an acquire that won, at the moment of the decision: a node that
/// failed for want of a connection (down, backing off, timed out) or whose connection is known
/// to be down is unreachable; one that had simply not answered yet was not waited for.
fn lock_votes<N: Net>(net: &N, round: &Round, faults: &[Option<NodeFault>]) -> Votes {
    let n = round.nodes();
    let (mut yes, mut refused, mut unreachable, mut failed) = (0, 0, 0, 0);
    for (node, fault) in faults.iter().enumerate().take(n) {
        let bit = node_bit(node);
        match round.vote(node) {
            Some(Vote::Yes) => yes |= bit,
            Some(Vote::Refused) => refused |= bit,
            Some(Vote::Failed) => match fault.as_ref().map(NodeFault::root) {
                Some(NodeFault::Quarantined(_) | NodeFault::Duplicate { .. })
                | Some(NodeFault::Server(..) | NodeFault::Unexpected(_) | NodeFault::Protocol(_))
                | Some(NodeFault::Auth(_) | NodeFault::Permission { .. })
                | Some(NodeFault::Database { .. } | NodeFault::FenceBlank) => failed |= bit,
                _ => unreachable |= bit,
            },
            None if net.session(node).is_down() => unreachable |= bit,
            None => {}
        }
    }
    Votes::new(n, yes, refused, unreachable, failed)
}

/// Counts a decided operation (acquire, extend, a release somebody waits for) and tells its
/// event.
fn observe(metrics: &Metrics, nodes: &[NodeAddr], op: &Op, outcome: &Outcome, now: Instant) {
    let latency = now.saturating_duration_since(op.start);
    let ending = |e: &Error| match e {
        Error::Held(_) => Ending::Refused,
        Error::NoQuorum(_) => Ending::NoQuorum,
        _ => Ending::Failed,
    };
    match (op.kind, outcome) {
        (OpKind::Acquire, Outcome::Acquired(Ok(grant))) => {
            metrics.op(stats::OpKind::Acquire, Ending::Ok, latency);
            if !matches!(op.waiter, Waiter::Attempt(_)) {
                // A waiting acquire's is told when its attempt is applied, with its attempts.
                acquired_event(nodes, &op.resource, 1, latency, grant.votes);
            }
        }
        (OpKind::Acquire, Outcome::Acquired(Err(e))) => {
            metrics.op(stats::OpKind::Acquire, ending(e), latency);
            failed_event(&op.resource, "acquire", e);
        }
        (OpKind::Extend, Outcome::Extended(_, Ok(()))) => {
            metrics.op(stats::OpKind::Extend, Ending::Ok, latency);
            event!(Debug, event = "extended", resource:% = op.resource.escape_ascii(),
                latency_us = latency.as_micros() as u64;
                "{}: extended in {latency:?}", op.resource.escape_ascii());
        }
        (OpKind::Extend, Outcome::Extended(_, Err(e))) => {
            metrics.op(stats::OpKind::Extend, ending(e), latency);
            failed_event(&op.resource, "extend", e);
        }
        (OpKind::Release, Outcome::Released(released)) if !matches!(op.waiter, Waiter::None) => {
            let ending = if *released > 0 {
                Ending::Ok
            } else {
                Ending::Refused
            };
            metrics.op(stats::OpKind::Release, ending, latency);
            event!(Debug, event = "released", resource:% = op.resource.escape_ascii(),
                released = *released, latency_us = latency.as_micros() as u64;
                "{}: released on {released} node(s) in {latency:?}", op.resource.escape_ascii());
        }
        _ => {}
    }
}

/// The event of an acquire that won: after how many attempts and how long, and which nodes
/// said yes, refused, or were unreachable.
#[cfg_attr(not(feature = "log"), allow(unused_variables))]
fn acquired_event(
    nodes: &[NodeAddr],
    resource: &[u8],
    attempts: u32,
    latency: Duration,
    votes: Votes,
) {
    event!(Debug, event = "acquired", resource:% = resource.escape_ascii(), attempts = attempts,
        latency_us = latency.as_micros() as u64, yes = votes.yes(), nodes = votes.nodes(),
        unreachable = votes.unreachable();
        "{}: acquired after {attempts} attempt(s) in {latency:?}; yes from {}{}",
        resource.escape_ascii(), crate::event::NodeList(nodes, votes, crate::LockVote::Yes),
        crate::event::Unreachable(nodes, votes));
}

/// The event of an acquire or extend that failed: held elsewhere (`debug`: routine under
/// contention), no quorum (`warn`, each node's fault), anything else (`info`).
#[cfg_attr(not(feature = "log"), allow(unused_variables))]
fn failed_event(resource: &[u8], what: &'static str, e: &Error) {
    let resource = resource.escape_ascii();
    match (what, e) {
        ("acquire", Error::Held(_)) => {
            event!(Debug, event = "refused", resource:% = resource; "{resource}: {e}");
        }
        (_, Error::NoQuorum(_)) => {
            event!(Warn, event = "no_quorum", resource:% = resource, operation = what;
                "{resource}: {what}: {e}");
        }
        ("acquire", _) => {
            event!(Info, event = "acquire_failed", resource:% = resource; "{resource}: {e}");
        }
        _ => {
            event!(Info, event = "extend_failed", resource:% = resource; "{resource}: {e}");
        }
    }
}

/// Once the node timeout of a decided acquire or extend has passed: the nodes that had not
/// answered by the decision and have not since count as timeouts (a round decided at quorum
/// never times out itself, but a frozen node must still show in its stats).
fn count_silent(metrics: &Metrics, silent: &mut u64, op: &mut Op, now: Instant) {
    let Some(deadline) = op.round.node_deadline() else {
        return;
    };
    if now < deadline {
        return;
    }
    op.silent_counted = true;
    for node in 0..op.round.nodes() {
        if op.round.is_pending(node) && op.late & node_bit(node) == 0 {
            metrics.node(node).timeouts.bump();
            *silent |= node_bit(node);
        }
    }
}

/// Counts one reply (or fault) of node `counters`' connection.
fn count_reply(counters: &stats::NodeCounters, kind: Kind, reply: &Result<Frame<'_>, &NodeFault>) {
    let counter = match (kind, reply) {
        (_, Err(NodeFault::Timeout)) => &counters.timeouts,
        (_, Err(_)) => &counters.failures,
        (_, Ok(Frame::Error(_))) => &counters.errors,
        (Kind::Set, Ok(Frame::Simple("OK"))) => &counters.ok,
        (Kind::Set, Ok(Frame::Null)) => &counters.refused,
        (Kind::Script(_), Ok(Frame::Integer(0))) => &counters.refused,
        (Kind::Script(_), Ok(Frame::Integer(_) | Frame::Aggregate(_))) => &counters.ok,
        (Kind::Command, Ok(_)) => &counters.ok,
        _ => &counters.errors,
    };
    counter.bump();
}

/// The validity a lock keeps after an extend that was sent and did not win.
///
/// Nodes that ran the compare-and-pexpire — in time, late, or after resuming from a freeze with
/// the command still queued — now expire the key at least `ttl` after they ran it, and sooner
/// than before only where the script had to fall back to a plain `PEXPIRE` (before Redis 7,
/// an ACL user without `+pttl`: see `EXTEND_BODY`). All of them ran it after the round's start, so the key lives on each of them at
/// least until `start + ttl − drift` (the round's `valid_until`), and on the others until the
/// old deadline: the lock is safe until the smaller of the two, never longer.
fn validity_after_lost_extend(old: Instant, round: &Round) -> Instant {
    round.valid_until().map_or(old, |backed| old.min(backed))
}

/// The node-by-node report of a round.
fn report(
    nodes: &Arc<[crate::addr::NodeAddr]>,
    round: &Round,
    faults: &[Option<NodeFault>],
    refusal: Refusal,
) -> Report {
    let mut refused = 0u64;
    let mut said_yes = 0u64;
    let mut failed = Vec::new();
    for (node, fault) in faults.iter().enumerate().take(nodes.len()) {
        match round.vote(node) {
            Some(Vote::Yes) => said_yes |= 1 << node,
            Some(Vote::Refused) => refused |= 1 << node,
            Some(Vote::Failed) => failed.push((node, fault.clone().unwrap_or(NodeFault::Timeout))),
            // Not waited for because it was silent (`Core::silent`): said so, with why.
            None => {
                if let Some(fault) = fault {
                    failed.push((node, fault.clone()));
                }
            }
        }
    }
    Report {
        nodes: nodes.clone(),
        quorum: round.quorum(),
        yes: said_yes.count_ones() as usize,
        said_yes,
        refused,
        failed,
        refusal,
    }
}

/// The error for a lost round; an authentication failure on any node takes precedence.
fn loss_error(
    nodes: &Arc<[crate::addr::NodeAddr]>,
    round: &Round,
    faults: &[Option<NodeFault>],
    loss: Loss,
    refusal: Refusal,
) -> Error {
    let report = report(nodes, round, faults, refusal);
    for (node, fault) in report.failed.iter().map(|(i, f)| (*i, f.root())) {
        match fault {
            NodeFault::Auth(message) => {
                return Error::Auth {
                    node: nodes[node].to_string(),
                    message: message.clone(),
                };
            }
            NodeFault::Permission { .. } => {
                return Error::Permission {
                    node: nodes[node].to_string(),
                    message: fault.to_string(),
                };
            }
            _ => {}
        }
    }
    match loss {
        Loss::Held => Error::Held(report),
        Loss::NoQuorum => Error::NoQuorum(report),
        Loss::TooSlow => Error::TooSlow(report),
        Loss::Expired => Error::Expired { released: 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8; 40] = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &[u8; 40] = b"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// Each node's vote and fault.
    type Votes = Vec<(Option<Vote>, Option<NodeFault>)>;

    /// Entries 0 and 1 lead to server A, entry 2 to server B; the answers come in `order`
    /// (node, vote); the round's decision, and every node's vote and fault.
    fn three_entries_two_servers(
        order: &[(usize, Result<Vote, NodeFault>)],
    ) -> (Option<Decision>, Votes) {
        let nodes: Vec<crate::addr::NodeAddr> =
            ["redis://a:1", "redis+unix:///a.sock", "redis://b:1"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
        let now = Instant::now();
        let mut op = Op::new(3, now);
        let rc = RoundConfig::new(Duration::from_secs(10), 0.01, Duration::from_secs(1));
        op.round.start(now, &rc);
        for (node, vote) in order {
            let run_id = if *node == 2 { B } else { A };
            op.record_vote(*node, vote.clone(), Some(run_id), &nodes, now);
        }
        let votes = (0..3)
            .map(|i| (op.round.vote(i), op.faults[i].clone()))
            .collect();
        (op.round.poll_decision(), votes)
    }

    fn duplicate_of_first() -> Option<NodeFault> {
        Some(NodeFault::Duplicate {
            of: "a:1".into(),
            run_id: String::from_utf8(A.to_vec()).unwrap(),
        })
    }

    #[test]
    fn one_server_listed_twice_counts_once_whichever_answers_first() {
        use Vote::{Refused, Yes};
        // Extend: both connections of server A say yes, B refuses. One yes of the two needed.
        for order in [[0, 1, 2], [1, 0, 2], [2, 1, 0], [1, 2, 0]] {
            let (decision, votes) = three_entries_two_servers(
                &order.map(|i| (i, Ok(if i == 2 { Refused } else { Yes }))),
            );
            assert!(
                matches!(decision, Some(Decision::Lost { yes: 1, .. })),
                "{order:?}: {decision:?}"
            );
            assert_eq!(votes[0], (Some(Yes), None), "{order:?}");
            assert_eq!(
                votes[1],
                (Some(Vote::Failed), duplicate_of_first()),
                "{order:?}"
            );
        }
        // Acquire: server A grants one connection and refuses the other (our own key), in
        // either order; with B's yes the lock is won, A counted once, for the entry listed first.
        for (granted, order) in [
            (0, [0, 1, 2]),
            (1, [0, 1, 2]),
            (0, [1, 0, 2]),
            (1, [1, 0, 2]),
            (1, [2, 1, 0]),
        ] {
            let answers =
                order.map(|i| (i, Ok(if i == granted || i == 2 { Yes } else { Refused })));
            let (decision, votes) = three_entries_two_servers(&answers);
            assert!(
                matches!(decision, Some(Decision::Won { yes: 2, .. })),
                "{order:?}: {decision:?}"
            );
            assert_eq!(votes[0], (Some(Yes), None), "{granted} {order:?}");
            assert_eq!(
                votes[1],
                (Some(Vote::Failed), duplicate_of_first()),
                "{granted} {order:?}"
            );
        }
        // A failure on one connection and a yes on the other: the yes counts.
        let (decision, votes) =
            three_entries_two_servers(&[(1, Ok(Yes)), (0, Err(NodeFault::Timeout)), (2, Ok(Yes))]);
        assert!(
            matches!(decision, Some(Decision::Won { yes: 2, .. })),
            "{decision:?}"
        );
        assert_eq!(votes[0], (Some(Yes), None));
    }

    #[test]
    fn tags_round_trip_and_never_collide_with_the_handshake() {
        let id = OpId { index: 0, seq: 7 };
        assert_ne!(id.tag(), 0);
        assert_eq!(OpId::from_tag(id.tag()), Some(id));
        assert_eq!(OpId::from_tag(0), None);
        let big = OpId {
            index: u32::MAX - 1,
            seq: u32::MAX,
        };
        assert_eq!(OpId::from_tag(big.tag()), Some(big));
    }
}
