//! The slab of operations and the routing of what the network delivers: a reply or a failure
//! goes to the operation whose request it answers (the request's tag is the slot's index and
//! sequence number), and from there to the file of its kind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::kept::Kept;
use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome};
use crate::model::addr::NodeAddr;
use crate::model::clock::ClockSample;
use crate::model::config::{EvictingServers, Shared};
use crate::model::error::NodeFault;
use crate::model::event::event;
use crate::model::eviction::Eviction;
use crate::model::keys::RELEASE_CHANNEL_PREFIX;
use crate::model::mutation::Mutation;
use crate::model::round::Vote;
use crate::model::stats::{Metrics, NodeCounters};
use crate::model::token::Token;
use crate::proto::quarantine::NodeWatch;
use crate::proto::repair_tally::RepairTally;
use crate::proto::resp::{AggregateKind, Frame};
use crate::proto::scripts::{
    EXTEND_SCRIPT, FENCE_WRITE_SCRIPT, FENCED_ACQUIRE_SCRIPT, FLAWED_ACQUIRE_SCRIPT, REPAIR_SCRIPT,
    SET_EXTEND_SCRIPT, SET_FENCED_ACQUIRE_SCRIPT, SET_STEP_FENCED_SCRIPT, SHARED_EXTEND_SCRIPT,
    ScriptCall, WAITING_FENCED_ACQUIRE_SCRIPT,
};
use crate::proto::session::{Delivery, Kind, TIME_COMMAND};

use super::fence::{Fencing, Stage};
use super::ledger::Ledger;
use super::release::{Release, Wait};
use super::status::StatusReplies;
use super::votes::{Ballot, vote_of};
use super::{OpKind, PREBUILT_OPS, RESOURCE_CAPACITY, Waiter, node_bit, nodes_in};

/// One operation: what every kind has, then each kind's own state (a slot is reused by every
/// kind, so each part is kept, cleared, from one use to the next: no allocation per use).
#[derive(Debug)]
pub(super) struct Op {
    pub seq: u32,
    /// The outcome is decided (handed to its waiter, or waiting in `outcome`).
    pub done: bool,
    pub kind: OpKind,
    pub resource: Vec<u8>,
    pub token: Token,
    pub start: Instant,
    /// Extend: the validity before. Status, Wait, Repair: the deadline. Release: when its keys
    /// expire. Fenced acquire writing back: the validity won.
    pub until: Instant,
    /// Acquire, Wait: the TTL (of its attempts); Wait: how many attempts it has made.
    pub ttl: Duration,
    /// Extend: the nodes whose keys back the lock's validity (`Lock::backing`, a kept lock's
    /// `Kept::backed`), 0 when not known (then every node may).
    pub backing: u64,
    /// A waiting acquire: the attempts it made. One of its attempts: which variant of the
    /// waiter's token it carries ([`Token::variant`](crate::model::token::Token::variant)).
    pub tries: u32,
    /// A set's waiting acquire: how many of its members (the first ones, in order) it holds,
    /// won one step at a time (`wait.rs`). One of its attempts: how many members its keys are
    /// (a step of the ordered acquisition), 0 for an attempt at all of them at once.
    pub step: u16,
    /// A set's waiting acquire: the step of its attempt in flight (as `step` is for the
    /// attempt).
    pub stepping: u16,
    /// A plain lock's attempt after the first of its wait: it steps back where a set waits
    /// for the resource (`WAITING_ACQUIRE_BODY`).
    pub waiting: bool,
    /// A waiting acquire that lined up behind other callers of this engine: its first
    /// attempt comes as the queue's head, after it has waited, and (a fair lock) carries its
    /// entry (`Engine::send_acquire`).
    pub behind: bool,
    /// A reader's attempt of a wait past its set precedence (`Config::set_precedence`): it
    /// steps back for a waiting writer, and for a waiting set only where readers hold the
    /// resource (`SHARED_ACQUIRE_PAST_SETS_BODY`).
    pub past_sets: bool,
    /// Requests sent and neither answered nor failed yet.
    pub outstanding: u32,
    pub waiter: Waiter,
    pub outcome: Option<Outcome>,
    /// Acquire, extend: the round (`votes.rs`).
    pub vote: Ballot,
    /// Acquire: fencing (`fence.rs`).
    pub fence: Fencing,
    /// Release (`release.rs`).
    pub release: Release,
    /// Status read (`status.rs`), fence repair (`repair.rs`): allocated on first use.
    pub status: Option<Box<StatusReplies>>,
    pub repair: Option<Box<RepairTally>>,
    /// A kept lock's renewal that was lost (and may be tried again): refusals that come after
    /// its decision still tell the lock's backing (`Core::late_refusals`).
    pub renewing: Option<Arc<Kept>>,
}

impl Op {
    /// A waiting acquire's attempt (`later`: not its first) joins a fair lock's queue: it
    /// carries its entry (`Engine::send_acquire`). A new caller's first attempt does not: the
    /// callers of an engine that begin together each make one before its queue opens, and only
    /// the head attempts again — the others' entries, never refreshed, would keep every later
    /// waiter out until they expired (and most first attempts find the resource free). A wait
    /// that lined up behind other callers of this engine ([`Op::behind`]) makes its first
    /// attempt as the head, after waiting, and attempts until it ends: that attempt joins.
    /// Without its entry it was refused wherever a younger waiter of another client had one,
    /// and that waiter went first.
    pub fn joins(&self, later: bool) -> bool {
        later || self.behind
    }

    pub fn new(n: usize, now: Instant) -> Op {
        // The usual resource name fits: a slot's first use does not allocate.
        let resource = Vec::with_capacity(RESOURCE_CAPACITY);
        let parts = (Ballot::new(n, now), Fencing::new(n), Release::new(n));
        Op::build(resource, parts, now)
    }

    /// A slot as [`Op::new`] makes it, in `self`'s buffers.
    pub fn rebuilt(self, n: usize, now: Instant) -> Op {
        let parts = (
            self.vote.rebuilt(n, now),
            self.fence.rebuilt(n),
            self.release.rebuilt(n),
        );
        Op::build(self.resource, parts, now)
    }

    fn build(
        mut resource: Vec<u8>,
        (vote, fence, release): (Ballot, Fencing, Release),
        now: Instant,
    ) -> Op {
        resource.clear();
        Op {
            seq: 0,
            done: false,
            kind: OpKind::Release,
            resource,
            token: Token::EMPTY,
            start: now,
            until: now,
            ttl: Duration::ZERO,
            backing: 0,
            tries: 0,
            step: 0,
            stepping: 0,
            waiting: false,
            behind: false,
            past_sets: false,
            outstanding: 0,
            waiter: Waiter::None,
            outcome: None,
            vote,
            fence,
            release,
            status: None,
            repair: None,
            renewing: None,
        }
    }

    /// Ready for a new operation of `resource` and `token` begun at `now` (each kind then
    /// sets its own part).
    pub fn begin(&mut self, (resource, token): (&[u8], &Token), waiter: Waiter, now: Instant) {
        self.resource.clear();
        self.resource.extend_from_slice(resource);
        self.token = *token;
        self.start = now;
        self.vote.reset(now);
        self.waiter = waiter;
        // Mostly empty already (taken by its caller): no drop to run then.
        if self.outcome.is_some() {
            self.outcome = None;
        }
        self.renewing = None;
        self.step = 0;
        self.stepping = 0;
        self.waiting = false;
        self.outstanding = 0;
        self.release.reset();
        self.fence.stage = Stage::Off;
    }

    /// When this undone operation needs a look although nothing arrives; `None` for a
    /// waiting acquire (its queue's timers are the waits': `Waits::next`).
    pub fn deadline(&self) -> Option<Instant> {
        match self.kind {
            OpKind::Acquire
                if self.fence.stage != Stage::Off && self.vote.round.poll_decision().is_some() =>
            {
                match self.fence.stage {
                    // A fenced acquire that won the lock may still wait for counters.
                    Stage::Reading => self.vote.round.node_deadline(),
                    // A write-back decided as it was sent (every target failed at once): due
                    // now.
                    _ => Some(self.start),
                }
            }
            OpKind::Acquire | OpKind::Extend => self.vote.round.poll_timeout(),
            OpKind::Release => self.release.deadline(),
            OpKind::Status => Some(self.until),
            // A round trip whose every node failed as it was sent: due now.
            OpKind::Repair if self.repair.as_ref().is_some_and(|r| r.round_done()) => {
                Some(self.start)
            }
            OpKind::Repair => Some(self.until),
            OpKind::Wait => None,
        }
    }
}

/// True if the operation's async caller dropped its future.
pub(super) fn is_cancelled(op: &Op) -> bool {
    matches!(&op.waiter, Waiter::Slot(slot) if slot.is_cancelled())
}

/// Operations' state that deliveries update (split from the driver, which calls into it).
pub(super) struct Core {
    /// The server list (named in duplicate faults).
    pub nodes: Arc<[NodeAddr]>,
    pub ops: Vec<Op>,
    pub free: Vec<u32>,
    /// The live slots, a bit per slot: the turn looks at these only (a scan of every slot,
    /// 128 or more, was a third of the instructions of a lone caller's cycle under callgrind).
    pub live: Vec<u64>,
    pub watch: Vec<NodeWatch>,
    /// Per node: missed a release's grace and has not caught up since (not waited for).
    pub slow: Vec<bool>,
    /// Nodes (a bit set) that let an acquire's or extend's node timeout pass in silence and
    /// have not answered anything since: acquires do not wait for them to decide a loss
    /// (`Round::expect_no_answer_from`).
    pub silent: u64,
    pub ledger: Ledger,
    pub window: Option<Duration>,
    pub max_pending: usize,
    pub node_timeout: Duration,
    /// Undone operations whose waiter is a parked thread or the engine's kept locks.
    pub waiting: usize,
    /// Release requests answered / failed (for `shutdown`).
    pub confirmed: u64,
    /// What replies told about contended resources, for the waits (taken at every step):
    /// their names in `events`, as spans; release notices with the clients that heard them
    /// (their payload; 0: not said), and releases our notice reached `n` clients with.
    pub events: Vec<u8>,
    pub notices: Vec<(usize, usize, u32)>,
    pub listened: Vec<(usize, usize, u64)>,
    /// Per node: refused our `SUBSCRIBE` (an ACL without the channel) or `HELLO 3` (a server
    /// before Redis 6): its releases are noticed by polling only.
    pub no_notices: Vec<bool>,
    /// Per node: the connection on which `HELLO 3` succeeded (RESP3 from the handshake on, or
    /// switched for subscribing).
    pub resp3: Vec<Option<u64>>,
    /// Fencing: restart tracking for seeding blank counters, and its window.
    pub fence_watch: Vec<NodeWatch>,
    pub seed_window: Duration,
    /// A defect the simulator brought back (`model/mutation.rs`; none in the default build).
    pub mutation: Mutation,
    /// Counters and histograms (read by the handles at any time; see `model/stats.rs`).
    pub metrics: Arc<Metrics>,
    /// Per node: the connection on which a quarantined yes was last reported (`warn` once per
    /// connection, not once per acquire).
    pub quarantine_told: Vec<u64>,
    /// Whether a yes from a server that may evict keys is refused ([`EvictingServers`]), and
    /// per node the connection on which that was last reported (as `quarantine_told`).
    pub refuse_evicting: bool,
    pub evicting_told: Vec<u64>,
    /// Refusals (our token gone) that came after a lost renewal of a kept lock was decided,
    /// with the nodes (a bit set): its backing narrows, and it may be lost (`kept_decided`).
    pub late_refusals: Vec<(Arc<Kept>, u64)>,
    /// The clock check's tolerance ([`Config::clock_check`](crate::Config::clock_check)): an
    /// acquire's or extend's requests each go after a `TIME` to the same node.
    pub clock_check: Option<Duration>,
    /// The nodes' clock samples, gathered for one clock check (a buffer kept for the next),
    /// and per node the connection on which a clock left out was last reported (as
    /// `quarantine_told`).
    pub clocks: Vec<Option<ClockSample>>,
    pub clock_told: Vec<u64>,
}

/// The slots of an engine that is gone, for another to build its slots in: the simulator's
/// engines, a few per schedule, whose slots built new and dropped were 3 % of a schedule's
/// instructions (empty elsewhere).
#[derive(Default)]
pub(crate) struct Slab(Vec<Op>);

impl Core {
    /// The slab of an engine of `shared`'s nodes, whose connections count into `counters`,
    /// built in `old`'s slots (each the same as one built new).
    pub fn new(
        shared: &Shared,
        counters: Box<[Arc<NodeCounters>]>,
        now: Instant,
        old: Slab,
    ) -> Core {
        let n = shared.nodes.len();
        let config = &shared.config;
        let mut old = old.0.into_iter();
        Core {
            nodes: shared.nodes.clone(),
            // Pre-built slots: a loaded machine that answers slowly keeps more operations
            // alive at once (releases after lost attempts linger until every node answered),
            // and growing the slab then would allocate on the hot path.
            ops: (0..PREBUILT_OPS)
                .map(|_| match old.next() {
                    Some(op) => op.rebuilt(n, now),
                    None => Op::new(n, now),
                })
                .collect(),
            free: (0..PREBUILT_OPS as u32).rev().collect(),
            live: vec![0; PREBUILT_OPS.div_ceil(64)],
            watch: vec![NodeWatch::default(); n],
            slow: vec![false; n],
            silent: 0,
            ledger: Ledger::new(n),
            window: config.quarantine_window(),
            max_pending: config.max_pending,
            node_timeout: config.node_timeout_for(config.ttl),
            waiting: 0,
            confirmed: 0,
            events: Vec::new(),
            notices: Vec::new(),
            listened: Vec::new(),
            no_notices: vec![false; n],
            resp3: vec![None; n],
            fence_watch: vec![NodeWatch::default(); n],
            seed_window: config.seed_window(),
            mutation: shared.mutation,
            metrics: Arc::new(Metrics::new(counters)),
            quarantine_told: vec![0; n],
            refuse_evicting: config.evicting_servers == EvictingServers::Refuse,
            evicting_told: vec![0; n],
            late_refusals: Vec::new(),
            clock_check: config.clock_check,
            clocks: Vec::with_capacity(if config.clock_check.is_some() { n } else { 0 }),
            clock_told: vec![0; n],
        }
    }

    /// The slots, for another engine to build its own in.
    #[cfg(feature = "sim")]
    pub fn into_slab(self) -> Slab {
        Slab(self.ops)
    }

    /// What the `Net` hands every reply and fault to, stamped with the time of its clock.
    pub fn sink(&mut self) -> impl for<'a> FnMut(usize, Instant, Delivery<'a>) + '_ {
        |i, now, d| self.on_delivery(i, d, now)
    }

    /// A new operation of `resource` and `token` begun at `now` for `waiter`: a slot, ready
    /// for its kind to set its own part.
    pub fn open(&mut self, what: (&[u8], &Token), waiter: Waiter, now: Instant) -> OpId {
        let id = self.alloc(self.nodes.len(), now);
        if waiter.waits() {
            self.waiting += 1;
        }
        self.ops[id.index as usize].begin(what, waiter, now);
        id
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
        op.done = false;
        if self.live.len() <= index / 64 {
            self.live.resize(index / 64 + 1, 0);
        }
        self.live[index / 64] |= 1 << (index % 64);
        OpId {
            index: index as u32,
            seq: op.seq,
        }
    }

    /// Frees slot `index` for the next operation.
    pub fn free_slot(&mut self, index: usize) {
        self.free.push(index as u32);
        self.live[index / 64] &= !(1 << (index % 64));
    }

    /// True while slot `index` holds an operation (allocated and not freed).
    pub fn is_live(&self, index: usize) -> bool {
        self.live
            .get(index / 64)
            .is_some_and(|w| w & (1 << (index % 64)) != 0)
    }

    /// The live slots in word `word` of [`Core::live`] (64 slots a word), in order.
    pub fn live_in(&self, word: usize) -> impl Iterator<Item = usize> + use<> {
        let mut bits = self.live[word];
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                word * 64 + bit
            })
        })
    }

    /// Queues operation `id`'s script call `call` to every node in `targets`.
    pub fn send_script<N: Net>(
        &mut self,
        net: &mut N,
        (id, call): (OpId, ScriptCall<'_>),
        targets: u64,
        now: Instant,
    ) {
        let timed = self.timed(id);
        for node in nodes_in(targets) {
            if timed {
                self.read_clock(net, node, now);
            }
            let sent = net.script(node, call, now, &mut self.sink());
            self.sent(id, node, sent, now);
        }
    }

    /// Whether operation `id`'s requests go after a `TIME` each: an acquire's or an extend's,
    /// with the clock check on (a fenced acquire's write-back is sent by `write_fence`, without:
    /// it sets no TTL).
    fn timed(&self, id: OpId) -> bool {
        self.clock_check.is_some()
            && matches!(
                self.ops[id.index as usize].kind,
                OpKind::Acquire | OpKind::Extend
            )
    }

    /// Queues a `TIME` to node `node`, for the clock check (`crate::model::clock`): its answer
    /// is the node's clock sample, read by the session. If it cannot be queued the node has no
    /// sample this round, and its yes does not count.
    #[cold]
    fn read_clock<N: Net>(&mut self, net: &mut N, node: usize, now: Instant) {
        let _ = net.request(node, Kind::Time, 0, TIME_COMMAND, now, &mut self.sink());
    }

    /// Queues operation `id`'s encoded command `encoded` (a request of `kind`) to every node in
    /// `targets`.
    pub fn send_command<N: Net>(
        &mut self,
        net: &mut N,
        (id, kind, encoded): (OpId, Kind, &[u8]),
        targets: u64,
        now: Instant,
    ) {
        let timed = self.timed(id);
        for node in nodes_in(targets) {
            if timed {
                self.read_clock(net, node, now);
            }
            let sent = net.request(node, kind, id.tag(), encoded, now, &mut self.sink());
            self.sent(id, node, sent, now);
        }
    }

    /// Records the outcome of queuing one request.
    pub fn sent(&mut self, id: OpId, node: usize, sent: Result<(), NodeFault>, now: Instant) {
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
    pub fn fail(&mut self, id: OpId, node: usize, fault: NodeFault, now: Instant) {
        let op = &mut self.ops[id.index as usize];
        match op.kind {
            OpKind::Acquire | OpKind::Extend => {
                if !op.done {
                    op.vote.fail(node, fault, now);
                }
            }
            OpKind::Release => self.release_failed(id.index as usize, node),
            OpKind::Status => {
                if let Some(status) = op.status.as_mut() {
                    status.fail(node, fault, now);
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

    /// A reply (or a fault) for a request of operation `d.tag`, or a delivery of the pub/sub
    /// machinery (`notice.rs`).
    /// Node `node` answered (a refusal too): it is waited for again, and the restart tracking
    /// learns which process answers.
    fn heard_from(&mut self, node: usize, d: &Delivery<'_>, now: Instant) {
        // It answers again: waited for again.
        self.silent &= !node_bit(node);
        // Every answer tells the restart tracking which process answers, a refusal too,
        // so that a new process's window counts from the first answer the client had from
        // it. (Learnt from counted yeses only, a client whose answers from a node were all
        // refusals took a later process at that address by its uptime, and counted at once
        // one up long without the keys: two holders. The session's count of the processes
        // its handshakes met, `ServerInfo::changes`, now prevents that by itself, also for
        // a process met by handshakes only; this makes the window start no later.) Once
        // per connection: the tracking looks at a generation once.
        if d.info.is_some()
            && !d.withdrawn
            && !self.mutation.run_id_on_yes_only()
            && let (Some(window), Some(watch)) = (self.window, self.watch.get_mut(node))
        {
            watch.quarantine_left(window, d.generation, d.info, now);
        }
    }

    fn on_delivery(&mut self, node: usize, d: Delivery<'_>, now: Instant) {
        if d.reply.is_ok() {
            self.heard_from(node, &d, now);
        }
        if self.on_pubsub(node, &d, now) {
            return;
        }
        if !d.withdrawn {
            count_reply(self.metrics.node(node), d.kind, &d.reply);
        }
        let Some(id) = OpId::from_tag(d.tag) else {
            return;
        };
        let live = self.is_live(id.index as usize);
        let Some(op) = self.ops.get_mut(id.index as usize) else {
            return;
        };
        if op.seq != id.seq || !live {
            return;
        }
        if op.fence.stage == Stage::Writing && d.kind != Kind::Script(FENCE_WRITE_SCRIPT) {
            // A late answer of the first round trip of a fenced acquire that has moved on to
            // its write-back: nothing more to learn from it (a late yes is released with the
            // lock, on every node).
            if !d.withdrawn {
                op.outstanding = op.outstanding.saturating_sub(1);
            }
            return;
        }
        if d.withdrawn {
            return Self::withdraw(op, node, &d, now);
        }
        op.outstanding = op.outstanding.saturating_sub(1);
        let index = id.index as usize;
        match op.kind {
            OpKind::Acquire | OpKind::Extend => self.on_vote(index, node, &d, now),
            OpKind::Release => self.on_release_reply(id, node, &d, now),
            OpKind::Status => {
                if let Some(status) = op.status.as_mut() {
                    let watch = &mut self.watch[node];
                    status.on_reply(node, &d, (self.window, watch), now);
                }
            }
            OpKind::Repair => self.on_repair_reply(index, node, &d),
            OpKind::Wait => {}
        }
    }

    /// Node `node`'s answer to `op` came with surplus frames or garbage: it does not count.
    fn withdraw(op: &mut Op, node: usize, d: &Delivery<'_>, now: Instant) {
        let fault = d.reply.as_ref().err().copied();
        match op.kind {
            OpKind::Acquire | OpKind::Extend => {
                if !op.done {
                    op.fence.reads.forget(node);
                    op.vote.withdraw(node, fault, now);
                }
            }
            OpKind::Release => op.release.withdraw(node),
            OpKind::Status => {
                if let (Some(status), Some(fault)) = (op.status.as_mut(), fault) {
                    status.withdraw(node, fault, now);
                }
            }
            OpKind::Repair => {
                if let (Some(repair), Some(fault), false) = (op.repair.as_mut(), fault, op.done) {
                    repair.withdraw(node, fault.clone());
                }
            }
            OpKind::Wait => {}
        }
    }
}

/// What each kind does with a reply: the glue between a delivery and the kind's state (the
/// logic is the state's, in the kind's file).
impl Core {
    /// Node `node` answered release `index` (or its request failed: then into the ledger).
    pub(super) fn on_release_reply(
        &mut self,
        id: OpId,
        node: usize,
        d: &Delivery<'_>,
        now: Instant,
    ) {
        let frame = match &d.reply {
            Ok(Frame::Error(e)) if crate::proto::session::is_transient(e.kind, e.message) => {
                // Not an answer: the server runs another client's script (BUSY), loads its
                // data (LOADING: the key may come back from its AOF) or lost its master. Kept
                // in the ledger and sent again, as a failed request is; it was counted as
                // confirmed, and the key left to its TTL. The node is
                // asked again after a pause (`Ledger::not_now`).
                self.ledger.not_now(node, now);
                return self.release_failed(id.index as usize, node);
            }
            Ok(frame) => frame,
            Err(fault) => {
                let fault = (*fault).clone();
                return self.fail(id, node, fault, now);
            }
        };
        self.confirmed += 1;
        let op = &mut self.ops[id.index as usize];
        if now.saturating_duration_since(op.start) < self.node_timeout {
            // Keeping up (within the node timeout), even if this release did not wait for it:
            // waited for again next time. Under constant load its queue never drains, so this
            // is how a slow node gets back.
            self.slow[node] = false;
        }
        if let Some(listeners) = op.release.answered(node, frame)
            && listeners > 0
        {
            let start = self.events.len();
            self.events.extend_from_slice(&op.resource);
            self.listened.push((start, self.events.len(), listeners));
        }
    }

    /// A release's request to `node` failed: remembered in the ledger, even past the key's
    /// TTL (a node that comes back may still run a `SET` that was in its socket buffer: see
    /// `Engine::flush_ledger`).
    pub(super) fn release_failed(&mut self, index: usize, node: usize) {
        let op = &mut self.ops[index];
        op.release.wait[node] = Wait::No;
        let (resource, token, expires) = (op.resource.clone(), op.token, op.until);
        self.ledger
            .add(node, resource, token, expires, self.max_pending);
    }

    /// Node `node` answered acquire or extend `index` (or its request failed).
    pub(super) fn on_vote(&mut self, index: usize, node: usize, d: &Delivery<'_>, now: Instant) {
        if self.ops[index].done {
            return self.on_late_vote(index, node, d, now);
        }
        let op = &mut self.ops[index];
        if d.kind == Kind::Script(FENCE_WRITE_SCRIPT) && d.generation != op.fence.gens[node] {
            // A write-back that went out on a connection other than the one its node answered
            // the first round trip on (maybe to another process): not counted.
            return op.vote.fail(node, NodeFault::Closed, now);
        }
        let fenced_set = matches!(
            d.kind,
            Kind::Script(
                FENCED_ACQUIRE_SCRIPT
                    | FLAWED_ACQUIRE_SCRIPT
                    | SET_FENCED_ACQUIRE_SCRIPT
                    | SET_STEP_FENCED_SCRIPT
                    | WAITING_FENCED_ACQUIRE_SCRIPT
            )
        );
        let vote = match &d.reply {
            Ok(frame @ Frame::Aggregate(_)) if fenced_set => {
                let watch = &mut self.fence_watch[node];
                (op.fence).read_answer(
                    node,
                    frame,
                    d,
                    op.start,
                    watch,
                    self.seed_window,
                    self.mutation,
                )
            }
            _ => vote_of(d.kind, &d.reply),
        };
        // Only a SET NX yes is doubtful: a node that lost its keys in a restart may grant a
        // lock that is held. An extend yes proves the node still holds our token, so it is
        // refusing everyone else and counts.
        let doubtful = sets_a_hold(d.kind);
        let vote = match vote {
            // Any yes of a server that may evict keys: a key it holds now may be gone the next
            // moment, the same as a key lost in a restart (an extend's and a fence write-back's
            // too: they back the lock's validity from here on).
            Ok(Vote::Yes) if self.refuse_evicting && d.eviction != Eviction::Never => {
                Err(self.evicting(node, d))
            }
            Ok(Vote::Yes) if doubtful => self.doubt_restarted(node, d, now),
            vote => vote,
        };
        // The process answering: none for a fault (no answer), or when not known.
        let run_id = d.info.filter(|_| d.reply.is_ok()).map(|info| info.run_id);
        let op = &mut self.ops[index];
        if self.clock_check.is_some() {
            op.vote.record_clock(node, d.clock.copied());
        }
        if let Some(forget) = op
            .vote
            .record(node, vote, run_id.as_ref(), &self.nodes, now)
        {
            op.fence.reads.forget(forget);
        }
    }

    /// Node `node` answered acquire or extend `index` after it was decided: noted, and a yes
    /// within the node timeout counted as late, not as a failure.
    fn on_late_vote(&mut self, index: usize, node: usize, d: &Delivery<'_>, now: Instant) {
        let op = &mut self.ops[index];
        op.vote.late |= node_bit(node);
        // A lost renewal's refusal that came too late to be counted is evidence all the same:
        // without it a node slower than the node timeout could say our token is gone, round
        // after round, while the lock was tried again.
        if let Some(kept) = &op.renewing
            && matches!(
                (d.kind, &d.reply),
                (
                    Kind::Script(EXTEND_SCRIPT | SET_EXTEND_SCRIPT | SHARED_EXTEND_SCRIPT),
                    Ok(Frame::Integer(0))
                )
            )
        {
            self.late_refusals.push((kept.clone(), node_bit(node)));
        }
        // A yes of an acquire (a fenced one answers an array: not counted here).
        let yes = matches!(
            (d.kind, &d.reply),
            (Kind::Set, Ok(Frame::Simple("OK"))) | (Kind::Script(_), Ok(Frame::Integer(1)))
        );
        if yes && sets_a_hold(d.kind) && op.vote.round.node_deadline().is_some_and(|t| now <= t) {
            self.metrics.node(node).late_yes.bump();
        }
    }

    /// A doubtful yes from `node`: still a yes, unless the node restarted within the quarantine
    /// window, whose yeses do not count until it has passed (warned once per connection).
    fn doubt_restarted(
        &mut self,
        node: usize,
        d: &Delivery<'_>,
        now: Instant,
    ) -> Result<Vote, NodeFault> {
        let (Some(window), Some(watch)) = (self.window, self.watch.get_mut(node)) else {
            return Ok(Vote::Yes);
        };
        let Some(left) = watch.quarantine_left(window, d.generation, d.info, now) else {
            return Ok(Vote::Yes);
        };
        self.metrics.node(node).quarantined.bump();
        if self.quarantine_told[node] != d.generation {
            self.quarantine_told[node] = d.generation;
            event!(Warn, event = "quarantined", node:% = self.nodes[node],
                left_ms = left.as_millis() as u64;
                "{}: restarted recently, its yeses do not count for {} ms more",
                self.nodes[node], left.as_millis());
        }
        Err(NodeFault::Quarantined(left))
    }

    /// A yes from `node`, whose server may evict keys (or did not say): refused, warned once
    /// per connection.
    fn evicting(&mut self, node: usize, d: &Delivery<'_>) -> NodeFault {
        let policy = match d.eviction {
            Eviction::May(policy) => Some(policy),
            _ => None,
        };
        self.metrics.node(node).evicting.bump();
        if self.evicting_told[node] != d.generation {
            self.evicting_told[node] = d.generation;
            event!(Warn, event = "evicting", node:% = self.nodes[node],
                policy = policy.map_or("unknown", |p| p.name());
                "{}: {}", self.nodes[node], NodeFault::Evicting(policy));
        }
        NodeFault::Evicting(policy)
    }

    /// Node `node` answered repair `index`: a counter read (round trip 1) or a write (2).
    pub(super) fn on_repair_reply(&mut self, index: usize, node: usize, d: &Delivery<'_>) {
        let Core {
            ops,
            fence_watch,
            seed_window,
            ..
        } = self;
        let op = &mut ops[index];
        let Some(repair) = op.repair.as_mut().filter(|_| !op.done) else {
            return;
        };
        let reply = d.reply.as_ref().map_err(|f| *f);
        match d.kind {
            Kind::Command if repair.is_reading() => {
                let run_id = d.info.filter(|_| d.reply.is_ok()).map(|i| i.run_id);
                // A blank counter may be repaired only if its process was up for a whole seed
                // window before the repair began, as for seeding by an acquire (the same
                // restart tracking).
                let window_left = run_id.and_then(|_| {
                    fence_watch[node].quarantine_left(*seed_window, d.generation, d.info, op.start)
                });
                repair.on_read(node, reply, run_id.as_ref(), d.generation, window_left);
            }
            Kind::Script(REPAIR_SCRIPT) => repair.on_written(node, reply, d.generation),
            // A late answer of round trip 1.
            _ => {}
        }
    }

    /// A delivery of the pub/sub machinery (a notice, a refused `SUBSCRIBE` or `HELLO 3`, the
    /// switch to RESP3): handled here, `true`. Anything else: `false`.
    pub(super) fn on_pubsub(&mut self, node: usize, d: &Delivery<'_>, now: Instant) -> bool {
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
                    return true;
                }
                // `message`, channel, payload.
                if let Some(Frame::Bulk(channel)) = push.iter().nth(1)
                    && let Some(resource) = channel.strip_prefix(RELEASE_CHANNEL_PREFIX.as_bytes())
                {
                    let listeners = notice_listeners(push.iter().nth(2));
                    let start = self.events.len();
                    self.events.extend_from_slice(resource);
                    self.notices.push((start, self.events.len(), listeners));
                }
                true
            }
            (Kind::Subscribe | Kind::Upgrade, Ok(Frame::Error(e))) => {
                // Refused for good (no permission for the channel, no RESP3, no pub/sub): no
                // notices from this node, polls only. A passing refusal (BUSY while another
                // client's script runs, LOADING) costs only this connection's subscription —
                // the polls cover it, and the next connection subscribes again (found by
                // review: one BUSY turned the node's notices off for the engine's life).
                if !crate::proto::session::is_transient(e.kind, e.message) {
                    self.no_notices[node] = true;
                }
                true
            }
            // Only a RESP3 map proves the switch. Anything else (a proxy answering `HELLO 3` in
            // RESP2 with an array) is a node that does not do RESP3, as a refusal is: subscribed
            // in RESP2, its messages would be arrays matched FIFO to our requests (found by
            // review).
            (Kind::Upgrade, Ok(Frame::Aggregate(a))) if a.kind() == AggregateKind::Map => {
                self.resp3[node] = Some(d.generation);
                true
            }
            (Kind::Upgrade, Ok(_)) => {
                self.no_notices[node] = true;
                true
            }
            (Kind::Notice | Kind::Subscribe | Kind::Upgrade, _) => true,
            _ => false,
        }
    }
}

/// Counts one reply (or fault) of node `counters`' connection.
fn count_reply(counters: &NodeCounters, kind: Kind, reply: &Result<Frame<'_>, &NodeFault>) {
    let counter = match (kind, reply) {
        (_, Err(NodeFault::Timeout)) => &counters.timeouts,
        (_, Err(_)) => &counters.failures,
        // A status read's or a fence repair's answer is no lock reply: neither a yes nor an
        // error (`ZCARD` of a held key answers WRONGTYPE by design). Every status read added 4
        // yeses per node, and one error per node while the key was held.
        (Kind::Command, Ok(_)) => return,
        (_, Ok(Frame::Error(_))) => &counters.errors,
        (Kind::Set, Ok(Frame::Simple("OK"))) => &counters.ok,
        (Kind::Set, Ok(Frame::Null)) => &counters.refused,
        (Kind::Script(_), Ok(Frame::Integer(0))) => &counters.refused,
        (Kind::Script(_), Ok(Frame::Integer(_) | Frame::Aggregate(_))) => &counters.ok,
        // The fence repair answers the counter it left, a bulk string: no error (it was
        // counted as one).
        (Kind::Script(REPAIR_SCRIPT), Ok(Frame::Bulk(_))) => &counters.ok,
        _ => &counters.errors,
    };
    counter.bump();
}

/// A release notice's payload: how many clients listened on its node when it went out, the
/// releaser not counted, in decimal (the release script's `PUBSUB NUMSUB`). 0 — not known —
/// for anything else: the empty payload of a releaser that does not count, or bytes no server
/// of ours sends.
fn notice_listeners(payload: Option<Frame<'_>>) -> u32 {
    match payload {
        Some(Frame::Bulk(p))
            if !p.is_empty() && p.len() <= 20 && p.iter().all(u8::is_ascii_digit) =>
        {
            (p.iter())
                .fold(0u64, |n, &d| {
                    n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                })
                .min(u64::from(u32::MAX)) as u32
        }
        _ => 0,
    }
}

/// Whether a request of `kind` writes a new hold: `SET NX`, or an acquire script
/// (`scripts::writes_a_hold`). Its yes is doubtful (a node that lost its keys in a restart may
/// grant a lock that is held), and counted late when it comes after its round.
fn sets_a_hold(kind: Kind) -> bool {
    match kind {
        Kind::Set => true,
        Kind::Script(index) => crate::proto::scripts::writes_a_hold(index),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Builder;
    use crate::proto::resp::{Limits, Status, decode};

    /// A slab for three nodes, with a release `id` of `x` sent to every node (three requests
    /// outstanding), no socket anywhere.
    fn slab_with_release(now: Instant) -> (Core, OpId) {
        let shared = Builder::new(["redis://a:1", "redis://b:1", "redis://c:1"])
            .quarantine(None)
            .shared()
            .unwrap();
        let counters = (0..3).map(|_| Arc::new(NodeCounters::default())).collect();
        let mut core = Core::new(&shared, counters, now, Slab::default());
        let id = core.open((b"x", &Token::EMPTY), Waiter::Local, now);
        let op = &mut core.ops[id.index as usize];
        op.kind = OpKind::Release;
        op.outstanding = 3;
        (core, id)
    }

    /// Hands `bytes` (one RESP frame) to the slab as node `node`'s reply to request `tag`.
    fn deliver(core: &mut Core, node: usize, (tag, bytes): (u64, &[u8]), withdrawn: bool) {
        let Ok(Status::Complete((reply, _))) = decode(bytes, &Limits::default()) else {
            panic!("{bytes:?} decodes");
        };
        let d = Delivery {
            tag,
            kind: Kind::Script(crate::proto::scripts::RELEASE_SCRIPT),
            reply: Ok(reply),
            generation: 1,
            eviction: crate::model::eviction::Eviction::Never,
            info: None,
            clock: None,
            withdrawn,
        };
        (core.sink())(node, Instant::now(), d);
    }

    /// A slot rebuilt in a used one's buffers is the slot built new: the simulator's engines
    /// build theirs in the last schedule's, and its schedules must not change.
    #[test]
    fn a_rebuilt_slot_is_a_new_one() {
        let now = Instant::now();
        let (mut core, id) = slab_with_release(now);
        let later = now + Duration::from_secs(1);
        let op = &mut core.ops[id.index as usize];
        let config =
            crate::model::round::RoundConfig::new(Duration::from_secs(1), 0.01, later - now);
        op.vote.round.start(now, &config);
        op.vote.fail(1, NodeFault::Timeout, later);
        op.vote.runs[0] = Some([1; 40]);
        op.vote.late = 2;
        op.fence.stage = Stage::Writing;
        op.fence.fence = 9;
        op.fence.gens[2] = 7;
        op.release.wait[0] = Wait::Until(later, true);
        op.release.released = 1;
        (op.seq, op.done, op.tries, op.until, op.ttl) = (4, true, 3, later, later - now);
        op.outcome = Some(Outcome::Released(1));
        let used = core.ops.swap_remove(id.index as usize);
        let rebuilt = format!("{:?}", used.rebuilt(5, later));
        assert_eq!(rebuilt, format!("{:?}", Op::new(5, later)));
    }

    #[test]
    fn a_reply_reaches_the_operation_its_tag_names_and_no_later_one_in_that_slot() {
        let now = Instant::now();
        let (mut core, id) = slab_with_release(now);
        deliver(&mut core, 0, (id.tag(), b":1\r\n"), false);
        deliver(&mut core, 1, (id.tag(), b":3\r\n"), false);
        let op = &core.ops[id.index as usize];
        assert_eq!((op.release.released, op.outstanding), (2, 1));
        // Node 1's notice reached one other client: told to the waits.
        assert_eq!(core.listened.len(), 1);
        assert_eq!(core.metrics.node(0).ok.get(), 1);
        // Node 1's answer came with garbage after all: taken back, not counted twice.
        deliver(&mut core, 1, (id.tag(), b":3\r\n"), true);
        assert_eq!(core.ops[id.index as usize].release.released, 1);
        // The slot is freed and reused: a late reply with the old tag finds nothing.
        core.free_slot(id.index as usize);
        let next = core.open((b"y", &Token::EMPTY), Waiter::Local, now);
        assert_eq!(next.index, id.index);
        core.ops[next.index as usize].kind = OpKind::Release;
        deliver(&mut core, 2, (id.tag(), b":1\r\n"), false);
        assert_eq!(core.ops[next.index as usize].release.released, 0);
        // The handshake's tag (0) and a slot that never existed are no operation's.
        deliver(&mut core, 2, (0, b":1\r\n"), false);
        let unknown = OpId {
            index: 9_999,
            seq: 1,
        };
        deliver(&mut core, 2, (unknown.tag(), b":1\r\n"), false);
        assert_eq!(core.ops[next.index as usize].release.released, 0);
    }

    #[test]
    fn the_turn_sees_only_live_slots_in_order() {
        let now = Instant::now();
        let (mut core, first) = slab_with_release(now);
        let ids: Vec<OpId> = (0..70)
            .map(|_| core.open((b"z", &Token::EMPTY), Waiter::None, now))
            .collect();
        core.free_slot(ids[3].index as usize);
        let live: Vec<usize> = (0..core.live.len()).flat_map(|w| core.live_in(w)).collect();
        let mut expected: Vec<usize> = std::iter::once(first.index as usize)
            .chain(ids.iter().map(|id| id.index as usize))
            .filter(|&i| i != ids[3].index as usize)
            .collect();
        expected.sort();
        assert_eq!(live, expected);
        assert_eq!(live.len(), 70);
    }

    #[test]
    fn a_notice_says_how_many_listened_or_nothing() {
        let read = |p: &[u8]| notice_listeners(Some(Frame::Bulk(p)));
        assert_eq!(read(b"7"), 7);
        assert_eq!(read(b"0"), 0);
        // An older releaser's empty payload, and what no server of ours sends: not known.
        for odd in [&b""[..], b"-3", b"3 ", b"x", b"1e3", b"\xff"] {
            assert_eq!(read(odd), 0, "{odd:?}");
        }
        assert_eq!(read(b"99999999999999999999"), u32::MAX);
        assert_eq!(read(b"123456789012345678901"), 0);
        assert_eq!(notice_listeners(Some(Frame::Integer(3))), 0);
        assert_eq!(notice_listeners(None), 0);
    }

    #[test]
    fn only_a_lasting_refusal_of_a_subscription_turns_a_nodes_notices_off() {
        let now = Instant::now();
        let (mut core, _) = slab_with_release(now);
        let refusal = |core: &mut Core, node: usize, kind: Kind, bytes: &[u8]| {
            let Ok(Status::Complete((reply, _))) = decode(bytes, &Limits::default()) else {
                panic!("{bytes:?} decodes");
            };
            let d = Delivery {
                tag: 0,
                kind,
                reply: Ok(reply),
                generation: 1,
                eviction: crate::model::eviction::Eviction::Never,
                info: None,
                clock: None,
                withdrawn: false,
            };
            assert!(core.on_pubsub(node, &d, now));
        };
        refusal(
            &mut core,
            0,
            Kind::Subscribe,
            b"-BUSY Redis is busy running a script.\r\n",
        );
        refusal(
            &mut core,
            0,
            Kind::Upgrade,
            b"-LOADING Redis is loading the dataset\r\n",
        );
        assert_eq!(core.no_notices, [false, false, false]);
        refusal(
            &mut core,
            1,
            Kind::Subscribe,
            b"-NOPERM this user has no permissions to access one of the channels\r\n",
        );
        refusal(
            &mut core,
            2,
            Kind::Upgrade,
            b"-NOPROTO unsupported protocol version\r\n",
        );
        assert_eq!(core.no_notices, [false, true, true]);
    }

    #[test]
    fn only_a_resp3_map_in_answer_to_hello_3_makes_a_connection_resp3() {
        let now = Instant::now();
        let (mut core, _) = slab_with_release(now);
        let answer = |core: &mut Core, node: usize, bytes: &[u8]| {
            let Ok(Status::Complete((reply, _))) = decode(bytes, &Limits::default()) else {
                panic!("{bytes:?} decodes");
            };
            let d = Delivery {
                tag: 0,
                kind: Kind::Upgrade,
                reply: Ok(reply),
                generation: 1,
                eviction: crate::model::eviction::Eviction::Never,
                info: None,
                clock: None,
                withdrawn: false,
            };
            assert!(core.on_pubsub(node, &d, now));
        };
        // A proxy that answers in RESP2, as to `HELLO 2`; one that answers `+OK`.
        answer(
            &mut core,
            0,
            b"*4\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:2\r\n",
        );
        answer(&mut core, 1, b"+OK\r\n");
        // Redis 6 and later.
        answer(
            &mut core,
            2,
            b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n",
        );
        assert_eq!(core.resp3, [None, None, Some(1)]);
        assert_eq!(core.no_notices, [true, true, false]);
    }
}
