//! The engine: every operation in flight over one set of connections, one per node.
//!
//! An operation (acquire, extend, release, status read, waiting acquire, fence repair) is a
//! slot of a slab (`op.rs`): its resource, token and waiter, and the state of its kind. Its
//! requests carry the slot's tag (index and a sequence number), so replies coming back on a
//! shared connection — FIFO, pipelined with every other operation's — find their operation.
//! Every command queued for a node in one turn of the loop goes out in one `write`.
//!
//! This file is the core: the engine's state, the turn ([`Engine::step`]: take requests in,
//! send the ledger, renew kept locks, settle what is due, write), the routing of a new
//! operation to its kind ([`Engine::submit_to`]) and of a decided outcome to its waiter
//! ([`Engine::hand_over`]), and the loop's driving. Each kind is a file of its own:
//!
//! | file | owns |
//! |---|---|
//! | `drive.rs` | running it: turns, waiting in `poll`, the mailbox, local operations, shutdown |
//! | `op.rs` | the slab (`Op`, `Core`), routing replies and failures to their operation's kind |
//! | `votes.rs` | a round's votes: answers, quarantine, one vote per server, node timeout, reports |
//! | `acquire.rs` | `SET NX PX` (or the fenced script), the outcome of its round |
//! | `fence.rs` | a fenced acquire: its counter reads, the fence's write-back |
//! | `extend.rs` | compare-and-pexpire, the validity a lost extend leaves |
//! | `release.rs` | compare-and-delete, its graces, the releases of lost acquires |
//! | `ledger.rs` | releases of unknown fate, replayed paced within `max_pending` |
//! | `status.rs` | `GET`, `PTTL`, the fence counter, per node |
//! | `repair.rs` | the fence repair's reads and writes |
//! | `wait.rs` | waiting acquires: queues, attempts, their pauses and deadlines |
//! | `notice.rs` | subscriptions, waiting marks, release notices |
//! | `keep.rs` | kept locks: renewal batches, loss, callbacks |
//! | `observe.rs` | metrics and events of decided operations and of replies |
//! | `request.rs` | what a caller asks (`ReqKind`) and gets (`Outcome`), an operation's id |
//! | `queue.rs` | the FIFO queues of callers waiting for one resource |
//! | `kept.rs` | a kept lock's state, shared by its holder and the engine |
//! | `mailbox.rs` | the slots through which callers of a shared engine hand it requests |
//! | `net.rs` | `Net`: everything the engine asks of the network and the clock |
//! | `foreign.rs` | calls into code that is not the engine's (wakers, callbacks), caught |
//!
//! Who drives it: a [`Client`](crate::Client) drives its own engine on the calling thread; a
//! [`Redlock`](crate::Redlock) handle shares one engine between all threads (`runtime/hub.rs`):
//! a caller that finds it free drives it itself, the others queue their request in the
//! [`Mailbox`] and park until the driver hands them the outcome.
//!
//! The decisions (which bytes go to which node, which operation a reply belongs to, round
//! outcomes, deadlines) take `now` as an argument; the only clock is the [`Net`]'s, and tokens
//! come in with the request. What the layer may not touch: the runtime and the API above it
//! (it imports only `proto` and `model`), sockets, threads and the wall clock. It reaches the
//! nodes only through its [`Net`]: the `mio` `Driver` (`runtime/driver.rs`) in production, the
//! simulator's in-memory network in `sim`; and a thread parked on the [`Mailbox`] is woken
//! through a closure the runtime gives it, never by a `mio` type.
//!
//! An operation's slot lives until every node has answered or failed each of its requests, even
//! after its caller got the outcome: so a late reply always finds its operation (a late yes to
//! a lost acquire was already answered by the release queued behind it on the same
//! connection — unless that connection was full and refused the release, which then waits in
//! the ledger), and a release whose connection failed or refused it is remembered in the
//! ledger of keys of unknown fate and sent again when the node is reachable.

mod acquire;
mod drive;
mod extend;
pub(crate) mod fair;
mod fence;
pub(crate) mod foreign;
mod keep;
pub(crate) mod kept;
mod ledger;
pub(crate) mod mailbox;
pub(crate) mod net;
pub(crate) mod notice;
mod observe;
mod op;
pub(crate) mod queue;
mod release;
mod repair;
pub(crate) mod request;
mod status;
mod votes;
mod wait;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::engine::kept::{Callbacks, Kept};
use crate::engine::mailbox::{Alarm, Mailbox, Slot};
use crate::engine::net::Net;
use crate::engine::queue::{Seen, Waits};
use crate::engine::request::{OpId, Outcome, ReqKind};
use crate::model::config::Shared;
use crate::model::error::Error;
use crate::model::stats::Metrics;
use crate::model::token::Token;
use crate::proto::resp::{Arg, SetNxPx};
use crate::proto::scripts::{Script, ScriptCall};

use keep::Keeps;
use observe::observe;
use op::Core;
pub(crate) use op::Slab;

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
pub(crate) struct Engine<N: Net> {
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
    /// The count of unclaimed outcomes when the last hold ran out (see `Engine::held`).
    hold_spent: Option<usize>,
    taken: Vec<Arc<Slot>>,
    /// Acquires whose release is to be sent (reused list), each with whether it had won the
    /// lock — a round won for nobody (its caller gone, a fence not written back) rather than
    /// a round lost: decided where the outcome is, not read back from the ballot afterwards
    /// (`Engine::release_lost`).
    lost: Vec<(u32, bool)>,
    /// Resource names copied out of slots (reused).
    resource: Vec<u8>,
    /// The releases of lost acquires: each one's span of `resource`, its token, the nodes
    /// released quietly (see `quiet_release`), and whether it is exact (`exact_release`)
    /// (reused).
    releases: Vec<(usize, usize, Token, u64, bool)>,
    /// The next release goes without its notice (`QUIET_RELEASE_BODY`): the cleanup of a lost
    /// acquire on nodes in their restart quarantine. Their yes counted for nobody, so a notice
    /// from them helps nobody, and it would bring our own next attempt at once: a waiter whose
    /// attempts such a node granted (it restarted without the holder's key) heard its own
    /// cleanup's notice there, attempted again, and sent ~14,000 requests a second to every
    /// node until the quarantine ended (the soak's finding; tests/soak.rs).
    quiet_release: bool,
    /// The release submitted next is a lost attempt's cleanup: it deletes the keys that hold
    /// exactly its token, never the other keys of its acquisition (a set's release by
    /// `Token::family`: `start_release`), which may be a later attempt's.
    exact_release: bool,
    /// The acquire submitted next is a step of a set's ordered acquisition (`wait.rs`): how
    /// many members its keys are, whether it is the last step, and its token's variant.
    step_attempt: Option<(u16, bool, u32)>,
    /// The acquire submitted next is a plain lock's attempt after the first of its wait: it
    /// steps back where a set waits for the resource (`Op::waiting`).
    waiting_attempt: bool,
    /// The acquire submitted next is a reader's attempt past its set precedence (`Op::past_sets`).
    past_sets_attempt: bool,
    /// This client's wall clock, for a fair lock's queue entries (`fair.rs`).
    pub(crate) wall: fair::Wall,
    keeps: Keeps,
    /// Alarms of async callers (retry pauses, validity deadlines), fired when due.
    alarms: Vec<(Instant, Arc<Alarm>)>,
    /// The callback thread of kept locks that are lost.
    pub callbacks: Arc<Callbacks>,
    /// Queues of callers waiting for contended resources.
    waits: Waits,
    /// Attempts decided in this turn: the waiting operation, the attempt's token variant
    /// ([`Token::variant`]), its outcome, and whether it was a split vote (reused list).
    attempts: Vec<(OpId, u32, Outcome, bool)>,
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
    /// The entries known to lead to the same server process as one listed before them.
    twins: votes::Twins,
    /// The simulator's record of sets' ordered acquisitions: (the set's waiting acquire, how
    /// many members it holds from `at` on, whether it marks the next; `(0, false)`: none any
    /// more — granted, or given up).
    #[cfg(feature = "sim")]
    pub(crate) step_log: Vec<(OpId, u16, bool, Instant)>,
    /// Fence repairs whose reads are over and whose writes are to be sent (reused list).
    repair_due: Vec<u32>,
    /// The expiry of the ledger entry being sent again (`flush_ledger`): its release op keeps
    /// it, so a release that fails again goes back into the ledger with the key's real expiry.
    replay_until: Option<Instant>,
}

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
    /// The engine itself: an attempt of the waiting acquire `OpId` (see `wait.rs`).
    Attempt(OpId),
}

impl Waiter {
    /// Counted in `Engine::waiting`: somebody (a parked thread, or the engine's own timers)
    /// needs the loop driven until it is decided.
    pub fn waits(&self) -> bool {
        !matches!(self, Waiter::None | Waiter::Local | Waiter::Attempt(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpKind {
    Acquire,
    Extend,
    Release,
    Status,
    /// A waiting acquire: its attempts are acquires of their own (see `wait.rs`).
    Wait,
    /// A fence repair: reads, then writes (see `repair.rs`).
    Repair,
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
/// The background thread wakes at most this often for the ledger's retries, even with a
/// shorter reconnect backoff: a retry sooner is no likelier to succeed.
const MIN_LEDGER_RETRY: Duration = Duration::from_millis(10);
/// The longest that queued requests wait for the requests of tasks just woken
/// ([`Engine::held`]): about the time two executor threads take to poll 32 tasks.
const HOLD: Duration = Duration::from_micros(50);

fn node_bit(node: usize) -> u64 {
    1u64 << node
}

/// What a kind's start borrows of the engine at once: the network, the slab, the scratch
/// buffer for a request's arguments, the settings.
struct Parts<'e, N> {
    net: &'e mut N,
    core: &'e mut Core,
    scratch: &'e mut BytesMut,
    shared: &'e Shared,
}

/// The nodes in the set `nodes` (a bit per node), in order.
fn nodes_in(mut nodes: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (nodes != 0).then(|| {
            let node = nodes.trailing_zeros() as usize;
            nodes &= nodes - 1;
            node
        })
    })
}

impl<N: Net> Engine<N> {
    pub fn new(shared: Arc<Shared>, net: N, now: Instant) -> Engine<N> {
        Engine::with_slab(shared, net, now, Slab::default())
    }

    /// [`Engine::new`]'s, its operation slots built in `old`'s (see [`Slab`]).
    pub fn with_slab(shared: Arc<Shared>, net: N, now: Instant, old: Slab) -> Engine<N> {
        let n = shared.nodes.len();
        let counters = (0..n).map(|i| net.session(i).counters().clone()).collect();
        Engine {
            core: Core::new(&shared, counters, now, old),
            upgrading: vec![None; n],
            fence_due: Vec::with_capacity(TURN_LIST_CAPACITY),
            repair_due: Vec::new(),
            twins: votes::Twins::new(n),
            #[cfg(feature = "sim")]
            step_log: Vec::new(),
            replay_until: None,
            sub_gen: vec![0; n],
            set_nx_px: SetNxPx::new(shared.config.ttl.as_millis() as u64),
            scratch: BytesMut::with_capacity(SCRATCH_CAPACITY),
            last_round: Duration::ZERO,
            mailbox: None,
            hold_since: None,
            hold_spent: None,
            taken: Vec::with_capacity(RESOURCE_CAPACITY),
            lost: Vec::with_capacity(PREBUILT_OPS),
            resource: Vec::with_capacity(RESOURCE_CAPACITY),
            releases: Vec::with_capacity(PREBUILT_OPS),
            quiet_release: false,
            exact_release: false,
            step_attempt: None,
            waiting_attempt: false,
            past_sets_attempt: false,
            wall: fair::Wall::read(now),
            keeps: Keeps::new(&shared.config),
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

    /// Ends the engine, keeping its operation slots for another (the simulator's next schedule).
    #[cfg(feature = "sim")]
    pub fn into_slab(self) -> Slab {
        self.core.into_slab()
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
            if alarm.is_cancelled() {
                false
            } else if *t <= now {
                alarm.fire();
                false
            } else {
                true
            }
        });
    }

    /// Alarms of async callers not fired yet (for tests).
    pub fn alarms(&self) -> usize {
        self.alarms.len()
    }

    /// When someone should drive the engine again although nobody waits: a connection
    /// deadline of a request still outstanding, or the ledger's next try — when the backoff of
    /// its nodes ends, if every node with releases waiting is down (a node that never comes
    /// back costs a look per backoff, not one every few milliseconds), else soon.
    pub fn background_deadline(&self, now: Instant) -> Option<Instant> {
        let soon = now + self.shared.config.backoff_min.max(MIN_LEDGER_RETRY);
        let retry = (0..self.shared.nodes.len())
            .filter(|&i| !self.core.ledger.nodes[i].is_empty())
            .map(|i| {
                let at = self.net.session(i).retry_at().map_or(soon, |t| t.max(soon));
                self.core
                    .ledger
                    .paused_until(i, now)
                    .map_or(at, |t| t.max(at))
            })
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
            return self.submit_wait((resource, token), (ttl, deadline), waiter, now);
        }
        let id = self.submit_to(kind, resource, token, waiter, self.all_nodes(), now);
        if matches!(kind, ReqKind::Release) && !self.waits.is_empty() {
            // A caller of this engine released: its next waiter attempts right behind.
            self.released(resource, now, Seen::Ours);
        }
        id
    }

    fn parts(&mut self) -> Parts<'_, N> {
        Parts {
            net: &mut self.net,
            core: &mut self.core,
            scratch: &mut self.scratch,
            shared: &self.shared,
        }
    }

    fn all_nodes(&self) -> u64 {
        crate::model::round::all_nodes(self.shared.nodes.len())
    }

    /// Starts an operation of `kind` on the nodes in `targets`: a slot, then its kind's start
    /// (its state, its requests queued). An entry known to lead to the same server process as
    /// one listed before it is asked nothing and fails as a duplicate: it does not count. (A
    /// release still goes to every node.)
    fn submit_to(
        &mut self,
        kind: ReqKind,
        resource: &[u8],
        token: &Token,
        waiter: Waiter,
        targets: u64,
        now: Instant,
    ) -> OpId {
        let id = self.core.open((resource, token), waiter, now);
        let twins = match kind {
            ReqKind::Release | ReqKind::Wait { .. } => 0,
            _ => self.twins.of(&self.net) & targets,
        };
        let targets = targets & !twins;
        match kind {
            ReqKind::Acquire { ttl } => self.start_acquire(id, ttl, targets, now),
            ReqKind::Extend {
                ttl,
                valid_until,
                backing,
            } => self.start_extend(id, (ttl, valid_until, backing), targets, now),
            ReqKind::Release => self.start_release(id, targets, now),
            ReqKind::Status { timeout } => self.start_status(id, timeout, targets, now),
            ReqKind::Repair { floor, timeout } => {
                self.start_repair(id, (floor, timeout), targets, now)
            }
            ReqKind::Wait { .. } => {
                // Dispatched by `submit` to `submit_wait`.
                debug_assert!(false, "a waiting acquire reached submit_to");
                self.core.ops[id.index as usize].kind = OpKind::Wait;
            }
        }
        for node in nodes_in(twins) {
            if let Some((of, run_id)) = votes::listed_before(&self.net, node) {
                let fault = votes::duplicate(&self.core.nodes, of, &run_id);
                self.core.fail(id, node, fault, now);
            }
        }
        id
    }

    /// Handles what is due at `now`: round deadlines, release graces, status deadlines; then
    /// hands decided outcomes over and frees finished slots; then what the decisions start
    /// (fence write-backs, repair writes, the next attempts of waiters, the releases of lost
    /// acquires, kept locks' renewals or losses).
    fn settle(&mut self, now: Instant) {
        self.lost.clear();
        // Live slots only, in order (nothing here allocates one).
        for word in 0..self.core.live.len() {
            for index in self.core.live_in(word) {
                if !self.core.is_live(index) {
                    continue;
                }
                if !self.core.ops[index].done
                    && let Some(outcome) = self.poll_outcome(index, now)
                {
                    self.hand_over(index, outcome, now);
                }
                let Core {
                    ops,
                    metrics,
                    silent,
                    ..
                } = &mut self.core;
                let op = &mut ops[index];
                if op.done
                    && !op.vote.silent_counted
                    && matches!(op.kind, OpKind::Acquire | OpKind::Extend)
                {
                    op.vote.count_silent(metrics, silent, now);
                }
                if op.done
                    && op.outstanding == 0
                    && op.outcome.is_none()
                    && !self.lost.iter().any(|&(i, _)| i as usize == index)
                {
                    // Every reply is in: no late refusal is to come (and the kept lock is not
                    // held on by a free slot). Not one whose keys are to be released this
                    // turn (`lost`): freed by `release_lost` once they are copied, so that
                    // no operation opened before (a set's next step, a wait's release) takes
                    // its slot and has its own keys released instead.
                    op.renewing = None;
                    self.core.free_slot(index);
                }
            }
        }
        Self::for_each_due(self, |e| &mut e.fence_due, Self::write_fence, now);
        Self::for_each_due(self, |e| &mut e.repair_due, Self::write_repair, now);
        if !self.attempts.is_empty() {
            self.attempts_decided(now);
        }
        self.release_lost(now);
        if !self.keeps.decided.is_empty() || !self.core.late_refusals.is_empty() {
            self.kept_decided(now);
        }
    }

    /// Runs `f` for each operation in the list that `list` picks, and empties it (the list is
    /// kept: no allocation).
    fn for_each_due(
        &mut self,
        list: fn(&mut Self) -> &mut Vec<u32>,
        f: fn(&mut Self, u32, Instant),
        now: Instant,
    ) {
        if list(self).is_empty() {
            return;
        }
        let mut due = std::mem::take(list(self));
        for &index in &due {
            f(self, index, now);
        }
        due.clear();
        *list(self) = due;
    }

    /// Operation `index`'s outcome if it is decided at `now` (its kind decides).
    fn poll_outcome(&mut self, index: usize, now: Instant) -> Option<Outcome> {
        match self.core.ops[index].kind {
            OpKind::Acquire | OpKind::Extend => self.round_decision(index, now),
            OpKind::Release => {
                let Core { ops, slow, .. } = &mut self.core;
                ops[index].release.graces(slow, now)
            }
            // Decided by its attempts (`attempts_decided`) and timers (`tick_waits`).
            OpKind::Wait => None,
            OpKind::Repair => self.repair_round_over(index, now),
            OpKind::Status => {
                let op = &mut self.core.ops[index];
                let times = (op.start, op.until);
                let status = op.status.as_mut().expect("status op has its replies");
                status.outcome(&self.shared.nodes, times, now)
            }
        }
    }

    /// Hands operation `index`'s outcome to its waiter (counted and told first).
    fn hand_over(&mut self, index: usize, outcome: Outcome, now: Instant) {
        let op = &mut self.core.ops[index];
        observe(&self.core.metrics, &self.shared.nodes, op, &outcome, now);
        op.done = true;
        match std::mem::replace(&mut op.waiter, Waiter::None) {
            Waiter::None => {}
            Waiter::Local => op.outcome = Some(outcome),
            Waiter::Slot(slot) => {
                self.core.waiting -= 1;
                // An async caller that dropped its future: a lock won for nobody is released
                // like a lost one (every node, late OKs included).
                let unclaimed = self.mailbox.as_deref().map(|m| &m.unclaimed);
                if let Some(Outcome::Acquired(Ok(_))) = slot.deliver(outcome, unclaimed) {
                    self.lost.push((index as u32, true));
                }
            }
            Waiter::Keep(kept) => {
                if matches!(outcome, Outcome::Extended(_, Err(_))) {
                    // Lost, and perhaps tried again: refusals that come after this decision
                    // still count against the lock's backing (`Core::late_refusals`).
                    op.renewing = Some(kept.clone());
                }
                self.core.waiting -= 1;
                self.keeps.decided.push((kept, outcome));
            }
            Waiter::Attempt(w) => {
                // Split: some nodes said yes, not enough, and some refused — a competing
                // attempt took the others.
                let split =
                    matches!(outcome, Outcome::Acquired(Err(Error::Held(_)))) && op.vote.yes() != 0;
                self.attempts.push((w, op.tries, outcome, split));
            }
        }
    }

    /// The earliest deadline of an undone operation, a timer or a queue.
    fn next_deadline(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let live = (0..self.core.live.len()).flat_map(|w| self.core.live_in(w));
        for op in live.map(|i| &self.core.ops[i]).filter(|o| !o.done) {
            if let Some(t) = op.deadline() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        [next, self.timer(), self.waits.next()]
            .into_iter()
            .flatten()
            .min()
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
    buf.reserve(args.iter().map(crate::proto::resp::bulk_len).sum());
    encode_args(buf, (script, tag), 0, args)
}

/// Appends `args` to `buf` (which holds `before` arguments already): the call's whole tail.
fn encode_args<'a>(
    buf: &'a mut BytesMut,
    (script, tag): (&'a Script, u64),
    before: usize,
    args: &[Arg<'_>],
) -> ScriptCall<'a> {
    for arg in args {
        crate::proto::resp::encode_bulk(buf, arg);
    }
    ScriptCall {
        script,
        tag,
        tail: buf,
        argc: before + args.len(),
    }
}

/// A call of the script for `resource`'s shape, `scripts` = `[plain, set, shared]`: its keys
/// are the name, a set's members or a shared lock's resource, then `args` follow.
fn shaped_call<'a>(
    buf: &'a mut BytesMut,
    tag: u64,
    resource: &[u8],
    [plain, set, shared]: [usize; 3],
    args: &[Arg<'_>],
) -> ScriptCall<'a> {
    let all = crate::proto::scripts::scripts();
    let (script, keys) = match crate::model::keys::shared_name(resource) {
        Some(name) => (shared, name),
        None if crate::model::keys::set_members(resource).is_some() => (set, resource),
        None => (plain, resource),
    };
    keyed_call(buf, (&all[script], tag), keys, None, args)
}

/// Encodes a script call whose keys are `resource`'s — the name itself, or each member of a
/// set (`keys::set_members`) — then `extra` (one more key, or none), then `args`: the tail
/// of every script that takes a lock's keys, so that a set goes out as one call per node.
fn keyed_call<'a>(
    buf: &'a mut BytesMut,
    (script, tag): (&'a Script, u64),
    resource: &[u8],
    extra: Option<&[u8]>,
    args: &[Arg<'_>],
) -> ScriptCall<'a> {
    buf.clear();
    let extra_keys = usize::from(extra.is_some());
    let keys = match crate::model::keys::set_members(resource) {
        Some(members) => {
            let count = members.clone().count();
            crate::proto::resp::encode_bulk(buf, &Arg::UInt((count + extra_keys) as u64));
            for member in members {
                crate::proto::resp::encode_bulk(buf, &Arg::Bytes(member));
            }
            count
        }
        None => {
            crate::proto::resp::encode_bulk(buf, &Arg::UInt(1 + extra_keys as u64));
            crate::proto::resp::encode_bulk(buf, &Arg::Bytes(resource));
            1
        }
    };
    if let Some(key) = extra {
        crate::proto::resp::encode_bulk(buf, &Arg::Bytes(key));
    }
    encode_args(buf, (script, tag), 1 + keys + extra_keys, args)
}

#[cfg(test)]
mod tests {
    use super::*;

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
