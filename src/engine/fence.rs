//! A fenced acquire (see `crate::proto::fencing` for the construction): its first round trip takes the
//! lock and reads every node's counter in one script; a won lock's fence is then written back
//! to the nodes that granted it, and handed out once a quorum took it, within the validity the
//! first round trip won.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome};
use crate::model::addr::NodeAddr;
use crate::model::config::Config;
use crate::model::error::{Error, FenceNote, NodeFault, Refusal, Report};
use crate::model::mutation::Mutation;
use crate::model::round::{Decision, RoundConfig, Vote};
use crate::proto::fencing::{FENCE_KEY, Reading, Reads, Short};
use crate::proto::quarantine::NodeWatch;
use crate::proto::resp::{Arg, Frame};
use crate::proto::scripts::{FENCE_WRITE_SCRIPT, ScriptCall, scripts};
use crate::proto::session::Delivery;

use bytes::BytesMut;

use super::votes::Ballot;
use super::{Engine, Parts, node_bit, script_call};

/// Where a fenced acquire is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Not fenced.
    Off,
    /// Acquiring and reading the counters.
    Reading,
    /// Writing the fence back (the op's `until` is then the validity won while reading).
    Writing,
}

/// A fenced acquire's state.
#[derive(Debug)]
pub(super) struct Fencing {
    pub stage: Stage,
    /// The fence chosen from the reads (written back in [`Stage::Writing`]).
    pub fence: u64,
    /// The counters read in the first round trip.
    pub reads: Reads,
    /// Per node: the connection its first answer came on (the write-back must go on it).
    pub gens: Vec<u64>,
}

impl Fencing {
    pub fn new(n: usize) -> Fencing {
        Fencing::build(Vec::new(), n)
    }

    /// A fenced acquire's state as [`Fencing::new`] makes it, in `self`'s buffer.
    pub fn rebuilt(self, n: usize) -> Fencing {
        Fencing::build(self.gens, n)
    }

    fn build(mut gens: Vec<u64>, n: usize) -> Fencing {
        gens.clear();
        gens.resize(n, 0);
        Fencing {
            stage: Stage::Off,
            fence: 0,
            reads: Reads::default(),
            gens,
        }
    }

    /// A fenced acquire's first answer from `node` (the acquire script's `[won, run, n]`): its
    /// vote, with the counter read. A blank counter may be seeded by this acquire only if its
    /// node was up for a whole seed window before the acquire (begun at `start`) began. Every
    /// answer updates the node's restart tracking (`watch`), so that a new `run_id` seen at the
    /// address (a restart, a failover) counts the whole window from when it was noticed.
    #[allow(clippy::too_many_arguments)]
    pub fn read_answer(
        &mut self,
        node: usize,
        frame: &Frame<'_>,
        d: &Delivery<'_>,
        start: Instant,
        watch: &mut NodeWatch,
        seed_window: std::time::Duration,
        mutation: Mutation,
    ) -> Result<Vote, NodeFault> {
        let run_id = d.info.as_ref().map(|i| &i.run_id);
        let Some((won, reading)) = crate::proto::fencing::parse_acquire(frame, run_id) else {
            return Err(NodeFault::unexpected(frame));
        };
        let settled = watch
            .quarantine_left(seed_window, d.generation, d.info, start)
            .is_none();
        let seedable = matches!(reading, Reading::Blank { .. }) && settled;
        self.reads.add(node, (won, reading), seedable, mutation);
        self.gens[node] = d.generation;
        Ok(if won { Vote::Yes } else { Vote::Refused })
    }
}

impl<N: Net> Engine<N> {
    /// A fenced acquire whose first round trip won the lock until `valid_until`: the fence, to
    /// be written back (the op is queued in `fence_due`; `None`), or, short of seeded counters,
    /// a wait for the nodes yet to answer (`None`) or the failure.
    pub(super) fn fence_read(
        &mut self,
        index: usize,
        valid_until: Instant,
        now: Instant,
    ) -> Option<Outcome> {
        let n = self.shared.nodes.len();
        let mutation = self.core.mutation;
        let op = &mut self.core.ops[index];
        let quorum = op.vote.round.quorum();
        let duplicates = op.vote.duplicates();
        match op.fence.reads.fence(n, quorum, duplicates, mutation) {
            Ok(fence) if mutation.fence_no_write_back() => {
                self.last_round = now.saturating_duration_since(op.start);
                Some(
                    op.vote
                        .grant(&self.net, &self.shared.nodes, valid_until, Some(fence)),
                )
            }
            Ok(fence) => {
                // Written back before it is handed out.
                op.fence.fence = fence;
                op.until = valid_until;
                self.fence_due.push(index as u32);
                None
            }
            // Short of seeded counters, with nodes yet to answer (a quorum of yes comes before
            // them, and a new deployment needs them all): wait for them, up to the node timeout.
            Err(_)
                if (0..n).any(|i| op.vote.round.is_pending(i))
                    && op.vote.round.node_deadline().is_some_and(|t| now < t) =>
            {
                None
            }
            Err(short) => {
                self.last_round = now.saturating_duration_since(op.start);
                // The round won the lock on a quorum; only the fence failed.
                self.lost.push((index as u32, true));
                let note = op.fence.reads.note(n, quorum, duplicates);
                let report = fence_report(&self.shared.nodes, (short, note, &op.vote), quorum);
                Some(Outcome::Acquired(Err(Error::Fence(report))))
            }
        }
    }

    /// A fenced acquire's write-back decided: the lock with its fence if a quorum took it
    /// while the validity won lasts, else the failure (and the lock is released).
    pub(super) fn fence_written(
        &mut self,
        index: usize,
        decision: Decision,
        now: Instant,
    ) -> Outcome {
        let op = &self.core.ops[index];
        self.last_round = now.saturating_duration_since(op.start);
        let nodes = &self.shared.nodes;
        let (ballot, refusal) = (&op.vote, Refusal::TokenGone);
        match decision {
            Decision::Won { .. } => {
                // A quorum took the fence. The validity is the one the first round trip won,
                // less the time since.
                let left = op.until.saturating_duration_since(now);
                if !left.is_zero() && left >= self.shared.config.min_validity {
                    return ballot.grant(&self.net, nodes, op.until, Some(op.fence.fence));
                }
                self.lost.push((index as u32, true));
                Outcome::Acquired(Err(Error::TooSlow(ballot.report(nodes, refusal))))
            }
            Decision::Lost { loss, .. } => {
                // Won all the same: the first round trip set our key on a quorum, and the
                // ballot now holds the write-back's votes (its release goes with the notice).
                self.lost.push((index as u32, true));
                // Credentials and permissions as for any round; anything else is a fence not
                // taken by a quorum.
                Outcome::Acquired(Err(match ballot.loss_error(nodes, loss, refusal) {
                    e @ (Error::Auth { .. } | Error::Permission { .. }) => e,
                    _ => Error::Fence(ballot.report(nodes, refusal)),
                }))
            }
        }
    }

    /// Starts the write-back round of a fenced acquire (its round and fencing state) at `now`, within the validity won
    /// (`op.until`); returns the nodes that granted the lock and the duplicates (which stay
    /// failed: the fence goes to the entry that counted for its server).
    fn write_back_round(
        (vote, fence): (&mut Ballot, &mut Fencing),
        (until, ttl): (Instant, Duration),
        config: &Config,
        now: Instant,
    ) -> (u64, u64) {
        let granted = vote.yes();
        let rc = RoundConfig {
            not_after: Some(until),
            ..RoundConfig::new(ttl, config.drift_factor, config.node_timeout_for(ttl))
        };
        fence.stage = Stage::Writing;
        let duplicates = vote.duplicates();
        for (node, fault) in vote.faults.iter_mut().enumerate() {
            if duplicates & node_bit(node) == 0 {
                *fault = None;
            }
        }
        vote.runs.fill(None);
        vote.start(now, &rc);
        (granted, duplicates)
    }

    /// Starts the write-back of fenced acquire `index` (queued in `fence_due`): the fence goes
    /// to every node that granted the lock on the connection it answered on; the fence is
    /// handed out once a quorum took it, before the validity won ends.
    pub(super) fn write_fence(&mut self, index: u32, now: Instant) {
        let n = self.shared.nodes.len();
        let Parts {
            net,
            core,
            scratch,
            shared,
        } = self.parts();
        let op = &mut core.ops[index as usize];
        let state = (&mut op.vote, &mut op.fence);
        let (granted, duplicates) =
            Self::write_back_round(state, (op.until, op.ttl), &shared.config, now);
        let id = OpId { index, seq: op.seq };
        let (fence, reads) = (op.fence.fence, op.fence.reads);
        // Blank counters that may be seeded get the write-back too, whether or not they hold
        // our key (seeding is a write of a quorum's maximum; it counts only with the key):
        // fewer blank nodes, fewer acquires short of a seeded quorum.
        let seeds = reads.seeds(n, duplicates);
        for node in 0..n {
            let op = &mut core.ops[index as usize];
            if duplicates & node_bit(node) != 0 {
                op.vote.round.handle_vote(node, Vote::Failed, now);
                continue;
            }
            if (granted | seeds) & node_bit(node) == 0 {
                // Holds no key of ours: would not take the fence.
                op.vote.round.handle_vote(node, Vote::Refused, now);
                continue;
            }
            let session = net.session(node);
            let same = session.is_ready() && session.generation() == op.fence.gens[node];
            let Some(info) = session.info().filter(|_| same) else {
                // A new connection since it answered: maybe a new process, whose counter our
                // reads did not see.
                op.vote.fail(node, NodeFault::Closed, now);
                continue;
            };
            let seed = seeds & node_bit(node) != 0;
            let held = (op.resource.as_slice(), op.token.as_bytes());
            let call = write_back_call(scratch, id, held, (fence, &info.run_id, seed));
            let sent = net.script(node, call, now, &mut core.sink());
            core.sent(id, node, sent, now);
        }
    }
}

/// The report of a fenced acquire that won the lock but read too few seeded counters (`short`,
/// and why, if the faults do not say it: `note`): the seeded nodes count as yes, the blank and
/// silent ones as failed.
fn fence_report(
    nodes: &Arc<[NodeAddr]>,
    (short, note, vote): (Short, Option<FenceNote>, &Ballot),
    quorum: usize,
) -> Report {
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
            let fault = vote.faults[node].clone().unwrap_or(NodeFault::Timeout);
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
        note,
    }
}

/// The write-back of `fence` to one node, for the process `run_id` (`seed`: a blank counter it
/// may seed), of the lock on `resource` with `token`, encoded into `scratch`.
fn write_back_call<'a>(
    scratch: &'a mut BytesMut,
    id: OpId,
    (resource, token): (&[u8], &[u8]),
    (fence, run_id, seed): (u64, &[u8; 40], bool),
) -> ScriptCall<'a> {
    let seed: &[u8] = if seed { b"1" } else { b"0" };
    script_call(
        scratch,
        &scripts()[FENCE_WRITE_SCRIPT],
        id.tag(),
        &[
            Arg::Int(2),
            // A set's write-back looks at its first member: all were set together.
            Arg::Bytes(crate::model::keys::first_key(resource)),
            Arg::Bytes(FENCE_KEY.as_bytes()),
            Arg::Bytes(token),
            Arg::UInt(fence),
            Arg::Bytes(run_id),
            Arg::Bytes(seed),
        ],
    )
}
