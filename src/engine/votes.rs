//! The round of an acquire, an extend or a fenced acquire's write-back: each node's vote
//! ([`Ballot::record`]: two entries of one server process count once; `Core::on_vote` in
//! `op.rs` turns an answer into a vote, a yes from a node in its restart quarantine into a
//! failure), the node timeout ([`Engine::round_decision`]: the nodes still silent then fail
//! with a timeout, and are not waited for by the next acquires until they answer), and the
//! reports and errors made of the votes ([`Ballot`]: pure functions of the round and the
//! server list).

use std::sync::Arc;
use std::time::Instant;

use crate::engine::net::Net;
use crate::engine::request::Outcome;
use crate::model::addr::NodeAddr;
use crate::model::clock::{self, ClockSample};
use crate::model::error::{Error, NodeFault, Refusal, Report, clipped};
use crate::model::event::event;
use crate::model::lock::{Grant, Votes};
use crate::model::round::{Decision, Loss, Round, RoundConfig, Vote};
use crate::model::stats::Metrics;
use crate::proto::resp::Frame;
use crate::proto::session::Kind;

use super::fence::Stage;
use super::{Engine, OpKind, node_bit, nodes_in};

impl<N: Net> Engine<N> {
    /// The outcome of acquire or extend `index` if its round is decided at `now`: at quorum,
    /// or once its node timeout passed (the nodes still silent then fail with a timeout).
    pub(super) fn round_decision(&mut self, index: usize, now: Instant) -> Option<Outcome> {
        let op = &mut self.core.ops[index];
        op.vote
            .time_out(&self.core.metrics, &mut self.core.silent, now);
        let mut decision = op.vote.round.poll_decision()?;
        // A fenced acquire's write-back sets no TTL: the keys' lives were judged in its first
        // round.
        if let (Some(tolerance), Decision::Won { .. }) = (self.core.clock_check, decision)
            && self.core.ops[index].fence.stage != Stage::Writing
        {
            decision = self.clock_checked(index, tolerance, now)?;
        }
        if let Decision::Lost {
            loss: Loss::NoQuorum | Loss::Held,
            yes,
        } = decision
            && !self.core.mutation.no_hurry()
        {
            self.hurry_silent(index, yes);
        }
        match self.core.ops[index].kind {
            OpKind::Acquire => self.acquire_decided(index, decision, now),
            _ => Some(self.extend_decided(index, decision)),
        }
    }

    /// Round `index`, won, with the clock check (`crate::model::clock`): won if a quorum of its
    /// yeses come from nodes whose clocks agree with a quorum's read in the round. Else, while
    /// nodes it waits for may still answer (their clocks may vouch for the yeses), undecided;
    /// once none may, the yeses that no quorum of clocks vouches for fail
    /// ([`NodeFault::Clock`]) and the round is decided on the rest.
    #[cold]
    fn clock_checked(
        &mut self,
        index: usize,
        tolerance: std::time::Duration,
        now: Instant,
    ) -> Option<Decision> {
        let n = self.net.nodes();
        let mut clocks = std::mem::take(&mut self.core.clocks);
        clocks.clear();
        // A node that voted: the reading sent just before its request (a later one, of another
        // operation, would vouch for a later moment); one still to answer: its latest, whose
        // request may have gone with this round's.
        let ballot = &self.core.ops[index].vote;
        clocks.extend((0..n).map(|node| match ballot.round.is_pending(node) {
            true => self.net.session(node).clock(),
            false => ballot.clocks.get(node).copied().flatten(),
        }));
        let ballot = &mut self.core.ops[index].vote;
        let (quorum, started) = (ballot.round.quorum(), ballot.started);
        let doubted = (0..n)
            .filter(|&node| ballot.round.vote(node) == Some(Vote::Yes))
            .filter(|&node| !clock::agrees(&clocks, node, started, tolerance, quorum))
            .fold(0u64, |bits, node| bits | node_bit(node));
        let yes = ballot.yes().count_ones() as usize;
        let decision = if doubted == 0 {
            ballot.round.poll_decision()
        } else if yes - (doubted.count_ones() as usize) < quorum
            && (0..n).any(|node| ballot.round.is_pending(node))
        {
            ballot.round.reopen();
            None
        } else {
            for node in nodes_in(doubted) {
                let fault = NodeFault::Clock(clock::off_by(&clocks, node, started));
                let generation = self.net.session(node).generation();
                if self.core.clock_told[node] != generation {
                    self.core.clock_told[node] = generation;
                    event!(Warn, event = "clock", node:% = self.shared.nodes[node];
                        "{}: {fault}", self.shared.nodes[node]);
                }
                let ballot = &mut self.core.ops[index].vote;
                ballot.withdraw(node, Some(&fault), now);
            }
            self.core.ops[index].vote.round.poll_decision()
        };
        self.core.clocks = clocks;
        decision
    }

    /// Round `index` was lost with `yes` votes: if the nodes that were silent in it (timed out,
    /// not waited for because they had, or refused the request because as many as
    /// `max_pending` already wait there unanswered) could have made its quorum, their
    /// connections are hurried ([`Session::hurry`](crate::proto::session::Session::hurry)): a
    /// connection that stays silent while callers need it is failed after the connect timeout
    /// and made again, rather than after `reply_timeout`.
    #[cold]
    fn hurry_silent(&mut self, index: usize, yes: usize) {
        let ballot = &self.core.ops[index].vote;
        let silent = (ballot.faults.iter().enumerate())
            .filter(|(_, f)| {
                matches!(
                    f,
                    Some(NodeFault::Timeout | NodeFault::Silent | NodeFault::Overloaded)
                )
            })
            .fold(0, |bits, (node, _)| bits | node_bit(node));
        if yes + silent.count_ones() as usize >= ballot.round.quorum() {
            for node in nodes_in(silent) {
                self.net.session_mut(node).hurry();
            }
        }
    }
}

/// An acquire's or extend's round and what each node said in it.
#[derive(Debug)]
pub(super) struct Ballot {
    pub round: Round,
    /// Per node: why it failed (or was not waited for).
    pub faults: Vec<Option<NodeFault>>,
    /// Per node, the `run_id` of the server process whose answer counts for it in this round
    /// (see [`one_vote_per_server`]); `None` before it answered, for a node whose process is
    /// unknown, and for a duplicate.
    pub runs: Vec<Option<[u8; 40]>>,
    /// The nodes that answered after the decision, and whether the nodes that never answered
    /// within the node timeout were counted as timeouts (stats).
    pub late: u64,
    pub silent_counted: bool,
    /// When the last node answered (a vote that is not a failure), for the round trip the
    /// split pause is measured in (see [`Ballot::round_trip`]).
    pub answered: Instant,
    /// When the current round started ([`Ballot::start`]): the clock check counts the nodes'
    /// clocks read since.
    pub started: Instant,
    /// (Clock check) per node, its clock as read just before the request it answered (empty
    /// without the check).
    pub clocks: Vec<Option<ClockSample>>,
}

impl Ballot {
    pub fn new(n: usize, now: Instant) -> Ballot {
        Ballot::build(Round::new(n), Vec::new(), Vec::new(), Vec::new(), now)
    }

    /// A ballot as [`Ballot::new`] makes it, in `self`'s buffers.
    pub fn rebuilt(self, n: usize, now: Instant) -> Ballot {
        Ballot::build(
            self.round.rebuilt(n),
            self.faults,
            self.runs,
            self.clocks,
            now,
        )
    }

    fn build(
        round: Round,
        mut faults: Vec<Option<NodeFault>>,
        mut runs: Vec<Option<[u8; 40]>>,
        mut clocks: Vec<Option<ClockSample>>,
        now: Instant,
    ) -> Ballot {
        let n = round.nodes();
        // Sized at the first vote a clock check records (`Core::on_vote`): none without it.
        clocks.clear();
        faults.clear();
        faults.resize(n, None);
        runs.clear();
        runs.resize(n, None);
        Ballot {
            round,
            faults,
            runs,
            late: 0,
            silent_counted: false,
            answered: now,
            started: now,
            clocks,
        }
    }

    /// Records the clock node `node` read just before the request it answered (the clock
    /// check).
    #[cold]
    pub fn record_clock(&mut self, node: usize, clock: Option<ClockSample>) {
        let n = self.round.nodes();
        if self.clocks.len() < n {
            self.clocks.resize(n, None);
        }
        self.clocks[node] = clock;
    }

    /// Starts a round at `now` ([`Round::start`]).
    pub fn start(&mut self, now: Instant, config: &RoundConfig) {
        self.started = now;
        self.clocks.fill(None);
        self.round.start(now, config);
    }

    /// Ready for a new round started at `now` (the round itself is started by its caller).
    pub fn reset(&mut self, now: Instant) {
        self.faults.fill(None);
        self.runs.fill(None);
        self.answered = now;
        self.late = 0;
        self.silent_counted = false;
    }

    /// The round trip of the nodes that answered this attempt: from `start` to the last
    /// answer. Not to its decision: a round that waited out the node timeout for a frozen node
    /// says how slow that node is, not how far apart two attempts must start not to collide.
    pub fn round_trip(&self, start: Instant) -> std::time::Duration {
        self.answered.saturating_duration_since(start)
    }

    /// A request that failed before the decision: a vote lost.
    pub fn fail(&mut self, node: usize, fault: NodeFault, now: Instant) {
        self.faults[node] = Some(fault);
        self.round.handle_vote(node, Vote::Failed, now);
    }

    /// The node's answer came with surplus frames or garbage: it does not count.
    pub fn withdraw(&mut self, node: usize, fault: Option<&NodeFault>, now: Instant) {
        self.runs[node] = None;
        // Its clock reading came in the same spoiled read: it vouches for nobody.
        if let Some(clock) = self.clocks.get_mut(node) {
            *clock = None;
        }
        if let Some(fault) = fault {
            self.faults[node] = Some(fault.clone());
        }
        self.round.handle_withdraw(node, now);
    }

    /// The entries that failed as duplicates: they lead to the server process of an entry
    /// listed before them (known before sending, or from the answers), whose vote counts.
    pub fn duplicates(&self) -> u64 {
        (self.faults.iter().enumerate())
            .filter(|(_, f)| matches!(f, Some(NodeFault::Duplicate { .. })))
            .fold(0, |m, (i, _)| m | node_bit(i))
    }

    /// The nodes that said yes.
    pub fn yes(&self) -> u64 {
        (0..self.round.nodes())
            .filter(|&i| self.round.vote(i) == Some(Vote::Yes))
            .fold(0, |m, i| m | node_bit(i))
    }

    /// Records node `node`'s vote in the round (`Err`: failed, with the fault), given the
    /// `run_id` of the server process that answered: two entries that lead to one process count
    /// once (see [`one_vote_per_server`]). Returns the entry whose reading no longer counts (a
    /// duplicate), if any.
    pub fn record(
        &mut self,
        node: usize,
        mut vote: Result<Vote, NodeFault>,
        run_id: Option<&[u8; 40]>,
        nodes: &[NodeAddr],
        now: Instant,
    ) -> Option<usize> {
        let after = match run_id {
            Some(run_id) => one_vote_per_server(self, node, run_id, &vote),
            None => Counts::Alone,
        };
        let mut forget = None;
        match after {
            Counts::Alone => {}
            Counts::Keeps { better, .. } => {
                if let Some(better) = better {
                    vote = Ok(better);
                }
            }
            Counts::Duplicate { twin, run_id, .. } => {
                forget = Some(node);
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
                forget = Some(twin);
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
        forget
    }

    /// The round's timer at `now`, if due and the round is undecided: once the node timeout
    /// has passed, the nodes still silent fail with a timeout and join `silent` (not waited for
    /// by the next acquires until they answer: see `Core::silent`); the round is decided
    /// (lost) if its validity or its `not_after` ran out first — then the silent nodes are not
    /// timeouts yet (an extend near its lock's end once marked every node it still waited for
    /// as silent, healthy ones included); `count_silent` counts those that stay
    /// silent through the node timeout.
    #[inline]
    pub fn time_out(&mut self, metrics: &Metrics, silent: &mut u64, now: Instant) {
        // None once decided.
        if self.round.poll_timeout().is_some_and(|t| t <= now) {
            self.timed_out(metrics, silent, now);
        }
    }

    #[cold]
    fn timed_out(&mut self, metrics: &Metrics, silent: &mut u64, now: Instant) {
        let round = &mut self.round;
        if round.node_deadline().is_some_and(|d| d <= now) {
            for node in 0..round.nodes() {
                if round.is_pending(node) {
                    self.faults[node] = Some(NodeFault::Timeout);
                    metrics.node(node).timeouts.bump();
                    *silent |= node_bit(node);
                }
            }
        }
        round.handle_timeout(now);
    }

    /// Once the node timeout of a decided round has passed: the nodes that had not answered by
    /// the decision and have not since count as timeouts (a round decided at quorum never
    /// times out itself, but a frozen node must still show in its stats); they join `silent`.
    pub fn count_silent(&mut self, metrics: &Metrics, silent: &mut u64, now: Instant) {
        let Some(deadline) = self.round.node_deadline() else {
            return;
        };
        if now < deadline {
            return;
        }
        self.silent_counted = true;
        for node in 0..self.round.nodes() {
            if self.round.is_pending(node) && self.late & node_bit(node) == 0 {
                metrics.node(node).timeouts.bump();
                *silent |= node_bit(node);
            }
        }
    }

    /// The nodes that said yes, as a bit set.
    pub fn yes_bits(&self) -> u64 {
        self.bits(Vote::Yes)
    }

    /// The nodes that refused (for an extend: our token is gone from them), as a bit set.
    pub fn refused_bits(&self) -> u64 {
        self.bits(Vote::Refused)
    }

    fn bits(&self, vote: Vote) -> u64 {
        (0..self.round.nodes())
            .filter(|&node| self.round.vote(node) == Some(vote))
            .fold(0, |bits, node| bits | node_bit(node))
    }

    /// What each node said to an acquire that won, at the moment of the decision: a node that
    /// failed for want of a connection (down, backing off, timed out) or whose connection is
    /// known to be down is unreachable; one that had simply not answered yet was not waited for.
    pub fn lock_votes<N: Net>(&self, net: &N) -> Votes {
        let round = &self.round;
        let n = round.nodes();
        let (mut yes, mut refused, mut unreachable, mut failed) = (0, 0, 0, 0);
        for (node, fault) in self.faults.iter().enumerate().take(n) {
            let bit = node_bit(node);
            match round.vote(node) {
                Some(Vote::Yes) => yes |= bit,
                Some(Vote::Refused) => refused |= bit,
                Some(Vote::Failed) => match fault.as_ref().map(NodeFault::root) {
                    Some(NodeFault::Quarantined(_) | NodeFault::Duplicate { .. })
                    | Some(
                        NodeFault::Server(..) | NodeFault::Unexpected(_) | NodeFault::Protocol(_),
                    )
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

    /// The outcome of an acquire that won until `valid_until` (with `fence`, if fenced).
    pub fn grant<N: Net>(
        &self,
        net: &N,
        nodes: &Arc<[NodeAddr]>,
        valid_until: Instant,
        fence: Option<u64>,
    ) -> Outcome {
        Outcome::Acquired(Ok(Grant {
            valid_until,
            fence,
            votes: self.lock_votes(net),
            nodes: Some(nodes.clone()),
        }))
    }

    /// The node-by-node report of the round.
    pub fn report(&self, nodes: &Arc<[NodeAddr]>, refusal: Refusal) -> Report {
        let round = &self.round;
        let mut refused = 0u64;
        let mut said_yes = 0u64;
        let mut failed = Vec::new();
        for (node, fault) in self.faults.iter().enumerate().take(nodes.len()) {
            match round.vote(node) {
                Some(Vote::Yes) => said_yes |= 1 << node,
                Some(Vote::Refused) => refused |= 1 << node,
                Some(Vote::Failed) => {
                    failed.push((node, fault.clone().unwrap_or(NodeFault::Timeout)))
                }
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
            note: None,
        }
    }

    /// The error for a lost round. Credentials or permissions refused take precedence when the
    /// nodes that fail for good (those, and any other permanent fault) leave too few for a
    /// quorum (nothing but a change of configuration mends that: `Error::is_permanent`); with
    /// fewer, the round is reported by its loss, those nodes' faults in its report — one
    /// misconfigured node of five made a lock held elsewhere a final `Auth` (`lock` gave up at
    /// once) and a kept lock's renewal lost to a frozen majority not tried again (found by
    /// review).
    pub fn loss_error(&self, nodes: &Arc<[NodeAddr]>, loss: Loss, refusal: Refusal) -> Error {
        let report = self.report(nodes, refusal);
        let for_good = (report.failed.iter())
            .filter(|(_, f)| f.is_permanent())
            .count();
        if nodes.len().saturating_sub(for_good) >= report.quorum {
            return by_loss(loss, report);
        }
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
        by_loss(loss, report)
    }
}

fn by_loss(loss: Loss, report: Report) -> Error {
    match loss {
        Loss::Held => Error::Held(report),
        Loss::NoQuorum => Error::NoQuorum(report),
        Loss::TooSlow => Error::TooSlow(report),
        Loss::Expired => Error::Expired { released: 0 },
    }
}

/// What a reply means for a vote, per request kind.
pub(super) fn vote_of(
    kind: Kind,
    reply: &Result<Frame<'_>, &NodeFault>,
) -> Result<Vote, NodeFault> {
    match (kind, reply) {
        (_, Err(fault)) => Err((*fault).clone()),
        (Kind::Set, Ok(Frame::Simple("OK"))) => Ok(Vote::Yes),
        (Kind::Set, Ok(Frame::Null)) => Ok(Vote::Refused),
        (Kind::Script(_), Ok(Frame::Integer(1))) => Ok(Vote::Yes),
        (Kind::Script(_), Ok(Frame::Integer(0))) => Ok(Vote::Refused),
        // A command of the script refused by the user's ACL: named by what the script calls
        // (the refusal of 6.2 and 7.0 names none: "The user executing the script can't run
        // this command or subcommand").
        (Kind::Script(index), Ok(Frame::Error(e))) if is_acl_refusal(e) => {
            Err(NodeFault::Permission {
                command: crate::proto::scripts::SCRIPT_CALLS[index],
                message: clipped(e.message),
            })
        }
        (_, Ok(Frame::Error(e))) if e.kind.is_auth() => Err(NodeFault::Auth(clipped(e.message))),
        (_, Ok(Frame::Error(e))) => Err(NodeFault::Server(e.kind, clipped(e.message))),
        (_, Ok(other)) => Err(NodeFault::unexpected(other)),
    }
}

/// True for a server's refusal of a command by the user's ACL, as each version words it inside
/// a script: `ERR The user executing the script can't run this command or subcommand` (6.2 and
/// 7.0), `ERR ACL failure in script: User … has no permissions to run the '…' command` (8.2);
/// `NOPERM …` is the wording outside a script, kept should a version use it inside one.
fn is_acl_refusal(e: &crate::proto::resp::ServerError<'_>) -> bool {
    e.kind == crate::proto::resp::ErrorKind::NoPerm
        || e.message.contains("NOPERM")
        || e.message.contains("can't run this command")
        || e.message.contains("ACL failure in script")
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
    ballot: &mut Ballot,
    node: usize,
    run_id: &[u8; 40],
    vote: &Result<Vote, NodeFault>,
) -> Counts {
    let twin = (0..ballot.runs.len()).find(|&k| {
        k != node && ballot.runs[k].as_ref() == Some(run_id) && ballot.round.vote(k).is_some()
    });
    let Some(twin) = twin else {
        ballot.runs[node] = Some(*run_id);
        return Counts::Alone;
    };
    let rank = |vote: Option<Vote>| match vote {
        Some(Vote::Yes) => 2,
        Some(Vote::Refused) => 1,
        Some(Vote::Failed) | None => 0,
    };
    let (this, that) = (vote.as_ref().ok().copied(), ballot.round.vote(twin));
    if node < twin {
        ballot.runs[twin] = None;
        ballot.runs[node] = Some(*run_id);
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

/// The entries of the server list known to lead to the same server process as one listed
/// before them (see [`listed_before`]), kept until a connection changes: what a handshake's
/// `INFO server` said holds for its connection, so the set is found again only when some
/// node's connection, readiness or `run_id` is new (a scan of every pair of nodes per acquire
/// was 2.5 % of a cycle's instructions at K = 64).
#[derive(Debug)]
pub(super) struct Twins {
    /// Per node: the connection, its readiness and whether its `run_id` was known, when `set`
    /// was found.
    seen: Vec<(u64, bool, bool)>,
    set: u64,
}

impl Twins {
    pub fn new(n: usize) -> Twins {
        Twins {
            // No connection is generation `u64::MAX`: found at the first use.
            seen: vec![(u64::MAX, false, false); n],
            set: 0,
        }
    }

    /// The entries that are twins of one listed before them, as `net`'s connections say now.
    pub fn of<N: Net>(&mut self, net: &N) -> u64 {
        let mut same = true;
        for (node, seen) in self.seen.iter_mut().enumerate() {
            let session = net.session(node);
            let now = (
                session.generation(),
                session.is_ready(),
                session.info().is_some(),
            );
            if *seen != now {
                *seen = now;
                same = false;
            }
        }
        if !same {
            self.set = (0..self.seen.len())
                .filter(|&i| listed_before(net, i).is_some())
                .fold(0, |m, i| m | node_bit(i));
        }
        self.set
    }
}

/// The entry listed before `node` that leads to the same server process, with its `run_id`, as
/// both entries' live connections said in their handshakes (`INFO server`); `None` while either
/// is not known.
pub(super) fn listed_before<N: Net>(net: &N, node: usize) -> Option<(usize, [u8; 40])> {
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
pub(super) fn duplicate(nodes: &[NodeAddr], of: usize, run_id: &[u8; 40]) -> NodeFault {
    NodeFault::Duplicate {
        of: nodes[of].to_string(),
        run_id: String::from_utf8_lossy(run_id).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::round::{Decision, RoundConfig};
    use std::time::Duration;

    const A: &[u8; 40] = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &[u8; 40] = b"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// Each node's vote and fault.
    type NodeVotes = Vec<(Option<Vote>, Option<NodeFault>)>;

    /// Entries 0 and 1 lead to server A, entry 2 to server B; the answers come in `order`
    /// (node, vote); the round's decision, and every node's vote and fault.
    fn three_entries_two_servers(
        order: &[(usize, Result<Vote, NodeFault>)],
    ) -> (Option<Decision>, NodeVotes) {
        let nodes: Vec<NodeAddr> = ["redis://a:1", "redis+unix:///a.sock", "redis://b:1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let now = Instant::now();
        let mut ballot = Ballot::new(3, now);
        let rc = RoundConfig::new(Duration::from_secs(10), 0.01, Duration::from_secs(1));
        ballot.round.start(now, &rc);
        for (node, vote) in order {
            let run_id = if *node == 2 { B } else { A };
            ballot.record(*node, vote.clone(), Some(run_id), &nodes, now);
        }
        let votes = (0..3)
            .map(|i| (ballot.round.vote(i), ballot.faults[i].clone()))
            .collect();
        (ballot.round.poll_decision(), votes)
    }

    fn duplicate_of_first() -> Option<NodeFault> {
        Some(NodeFault::Duplicate {
            of: "a:1".into(),
            run_id: String::from_utf8(A.to_vec()).unwrap(),
        })
    }

    /// The round was decided as expected (`decided`), entry 0 counted server A's yes, and
    /// entry 1 is its duplicate.
    fn assert_counted_once(decided: bool, votes: &NodeVotes, context: String) {
        assert!(decided, "{context}");
        assert_eq!(votes[0], (Some(Vote::Yes), None), "{context}");
        let duplicate = (Some(Vote::Failed), duplicate_of_first());
        assert_eq!(votes[1], duplicate, "{context}");
    }

    #[test]
    fn one_server_listed_twice_counts_once_whichever_answers_first() {
        use Vote::{Refused, Yes};
        // Extend: both connections of server A say yes, B refuses. One yes of the two needed.
        for order in [[0, 1, 2], [1, 0, 2], [2, 1, 0], [1, 2, 0]] {
            let (decision, votes) = three_entries_two_servers(
                &order.map(|i| (i, Ok(if i == 2 { Refused } else { Yes }))),
            );
            let lost = matches!(decision, Some(Decision::Lost { yes: 1, .. }));
            assert_counted_once(lost, &votes, format!("{order:?}: {decision:?}"));
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
            let won = matches!(decision, Some(Decision::Won { yes: 2, .. }));
            assert_counted_once(won, &votes, format!("{granted} {order:?}: {decision:?}"));
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
    fn a_late_answer_of_a_silent_node_is_not_a_timeout() {
        // Nodes 0–2 say yes at once; 3 answers after the decision, 4 never: once the node
        // timeout has passed, only 4 counts as a timeout and joins the silent set.
        let now = Instant::now();
        let metrics = Metrics::new((0..5).map(|_| Arc::new(Default::default())).collect());
        let mut ballot = Ballot::new(5, now);
        let rc = RoundConfig::new(Duration::from_secs(10), 0.01, Duration::from_millis(50));
        ballot.round.start(now, &rc);
        for node in 0..3 {
            ballot.record(node, Ok(Vote::Yes), None, &[], now);
        }
        assert!(matches!(
            ballot.round.poll_decision(),
            Some(Decision::Won { .. })
        ));
        ballot.late |= node_bit(3);
        let mut silent = 0;
        ballot.count_silent(&metrics, &mut silent, now + Duration::from_millis(10));
        assert_eq!(
            (silent, ballot.silent_counted),
            (0, false),
            "before the node timeout"
        );
        ballot.count_silent(&metrics, &mut silent, now + Duration::from_millis(50));
        assert_eq!((silent, ballot.silent_counted), (node_bit(4), true));
        assert_eq!(metrics.node(4).timeouts.get(), 1);
        assert_eq!(metrics.node(3).timeouts.get(), 0);
    }

    #[test]
    fn a_round_cut_short_by_its_deadline_marks_no_node_silent() {
        // An extend that must be decided 5 ms in (its lock's end), with a 50 ms node timeout:
        // at 5 ms it is lost, and nobody is a timeout yet; at 50 ms the nodes still silent are.
        let now = Instant::now();
        let metrics = Metrics::new((0..3).map(|_| Arc::new(Default::default())).collect());
        let mut ballot = Ballot::new(3, now);
        let rc = RoundConfig {
            not_after: Some(now + Duration::from_millis(5)),
            ..RoundConfig::new(Duration::from_secs(10), 0.01, Duration::from_millis(50))
        };
        ballot.round.start(now, &rc);
        ballot.record(0, Ok(Vote::Yes), None, &[], now);
        let mut silent = 0;
        ballot.time_out(&metrics, &mut silent, now + Duration::from_millis(4));
        assert_eq!(ballot.round.poll_decision(), None);
        ballot.time_out(&metrics, &mut silent, now + Duration::from_millis(5));
        assert!(
            matches!(
                ballot.round.poll_decision(),
                Some(Decision::Lost { yes: 1, .. })
            ),
            "{:?}",
            ballot.round.poll_decision()
        );
        assert_eq!((silent, ballot.faults[1].clone()), (0, None));
        assert_eq!(metrics.node(1).timeouts.get(), 0);
        ballot.count_silent(&metrics, &mut silent, now + Duration::from_millis(50));
        assert_eq!(silent, node_bit(1) | node_bit(2));
        assert_eq!(metrics.node(1).timeouts.get(), 1);
    }

    /// Each version's wording of a script's command refused by the ACL is a permission fault
    /// naming the command the script calls; another `ERR` is not.
    #[test]
    fn acl_refusals_inside_a_script_are_read_in_every_version_s_wording() {
        use crate::model::wire::ErrorKind;
        use crate::proto::resp::ServerError;
        for message in [
            // 6.2 and 7.0
            "ERR The user executing the script can't run this command or subcommand script: \
             4d6b, on @user_script:1.",
            // 8.2
            "ERR ACL failure in script: User locker has no permissions to run the 'zadd' \
             command script: 4d6b, on @user_script:1.",
            "NOPERM User locker has no permissions to run the 'zadd' command",
        ] {
            let e = ServerError {
                kind: ErrorKind::classify(message.as_bytes()),
                message,
            };
            let fault = vote_of(Kind::Script(0), &Ok(Frame::Error(e))).unwrap_err();
            assert!(
                matches!(fault, NodeFault::Permission { command, .. }
                    if command == crate::proto::scripts::SCRIPT_CALLS[0]),
                "{message}: {fault:?}"
            );
        }
        let other = "ERR Error running script: attempt to compare nil with number";
        let e = ServerError {
            kind: ErrorKind::classify(other.as_bytes()),
            message: other,
        };
        let fault = vote_of(Kind::Script(0), &Ok(Frame::Error(e))).unwrap_err();
        assert!(matches!(fault, NodeFault::Server(..)), "{fault:?}");
    }
}
