//! An acquire: `SET resource token NX PX ttl` on every node (with fencing, the script that also
//! reads the node's fence counter: `fence.rs`), decided at quorum by its round (`votes.rs`). A
//! lost acquire is released on every node at once (`release.rs`, `Engine::release_lost`).

use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome};
use crate::model::error::{NodeFault, Refusal};
use crate::model::keys::QUEUE_ENTRY_LEN;
use crate::model::round::Decision;
use crate::model::token::{FAMILY_LEN, MAX_VALUE_LEN, lock_value};
use crate::proto::fencing::{FENCE_KEY, Reads};
use crate::proto::resp::{Arg, SetNxPx};
use crate::proto::scripts::{
    FAIR_ACQUIRE_SCRIPT, FAIR_SET_ACQUIRE_SCRIPT, FAIR_SHARED_ACQUIRE_SCRIPT,
    FENCED_ACQUIRE_SCRIPT, FLAWED_ACQUIRE_SCRIPT, SET_ACQUIRE_SCRIPT, SET_FENCED_ACQUIRE_SCRIPT,
    SET_STEP_FENCED_SCRIPT, SET_STEP_SCRIPT, SHARED_ACQUIRE_PAST_SETS_SCRIPT,
    SHARED_ACQUIRE_SCRIPT, WAITING_ACQUIRE_SCRIPT, WAITING_FENCED_ACQUIRE_SCRIPT, scripts,
};
use crate::proto::session::Kind;

use super::fence::Stage;
use super::notice::mark_ttl;
use super::{Engine, OpKind, Waiter, keyed_call, nodes_in, script_call};

impl<N: Net> Engine<N> {
    /// Starts the round of acquire `id` and queues its requests to the nodes in `targets`.
    /// Nodes silent for a whole node timeout lately (`Core::silent`) are not waited for.
    pub(super) fn start_acquire(&mut self, id: OpId, ttl: Duration, targets: u64, now: Instant) {
        let config = &self.shared.config;
        let silent = match self.core.mutation.wait_for_silent() {
            true => 0,
            false => self.core.silent,
        };
        let op = &mut self.core.ops[id.index as usize];
        op.kind = OpKind::Acquire;
        op.ttl = ttl;
        // A step of a set's ordered acquisition (`wait.rs`): only the last one is fenced (the
        // lock is the set's, won by that step; the steps before hold parts of it).
        let (step, last, variant) = self.step_attempt.take().unwrap_or((0, true, 0));
        op.step = step;
        // The step's variant, for its script (the attempt's own is set after: `Op::tries`).
        op.tries = variant;
        op.waiting = std::mem::take(&mut self.waiting_attempt);
        op.past_sets = std::mem::take(&mut self.past_sets_attempt);
        // A reader gets no fence: a fence orders writers, and a reader writes nothing.
        if config.fencing && last && crate::model::keys::shared_name(&op.resource).is_none() {
            op.fence.stage = Stage::Reading;
            op.fence.reads = Reads::default();
        }
        let rc = config.round(ttl, config.node_timeout_for(ttl));
        op.vote.start(now, &rc);
        op.vote.round.expect_no_answer_from(silent, now);
        for node in nodes_in(silent) {
            op.vote.faults[node] = Some(NodeFault::Silent);
        }
        self.send_acquire(id, targets, now);
    }

    /// Queues acquire `id`'s requests: `SET NX PX`, or with fencing the script that also reads
    /// the node's counter.
    fn send_acquire(&mut self, id: OpId, targets: u64, now: Instant) {
        let Engine {
            net,
            core,
            scratch,
            set_nx_px,
            shared,
            wall,
            ..
        } = self;
        let op = &core.ops[id.index as usize];
        let (resource, ttl) = (&op.resource[..], op.ttl);
        // The value written: the token, or `<token> <owner>` (`Config::owner`); a reader's
        // member is its token alone.
        let owner = shared.config.owner.as_deref().map(str::as_bytes);
        let reader = crate::model::keys::shared_name(resource);
        // Filled only with an owner: the plain path does no more work than before.
        let mut value_buf: [u8; MAX_VALUE_LEN];
        let token = match owner {
            None => op.token.as_bytes(),
            Some(_) if reader.is_some() => op.token.as_bytes(),
            Some(_) => {
                value_buf = [0u8; MAX_VALUE_LEN];
                lock_value(op.token.as_bytes(), owner, &mut value_buf)
            }
        };
        if super::fair::applies(&shared.config) {
            // A fair lock (`FAIR_ACQUIRE_BODY`; a set, `FAIR_SET_ACQUIRE_BODY`: all or none, in
            // the queue of every member; a reader, `FAIR_SHARED_ACQUIRE_BODY` on its resource's
            // key, with a reader's entry): a waiting acquire's attempt with its entry in the
            // resource's queue; a new caller's first attempt (the wait's own token) and
            // `try_lock` with none: they take the resource only if nobody waits, and join
            // nothing (why: `Op::joins`; the contention benchmark's p99 wait was an orphan
            // entry's life, a second; found with a review).
            let written: [u8; QUEUE_ENTRY_LEN];
            let wait = match op.waiter {
                Waiter::Attempt(w) => Some(&core.ops[w.index as usize]),
                _ => None,
            };
            let entry = match wait {
                // A later attempt carries a token of its own (`Op::tries` is set after this).
                Some(wait) if wait.joins(wait.token != op.token) => {
                    written = wall.entry(wait.start, &op.token, reader.is_some());
                    &written[..]
                }
                _ => &[][..],
            };
            let args = [
                Arg::Bytes(token),
                Arg::UInt(ttl.as_millis() as u64),
                Arg::Bytes(entry),
                Arg::UInt(mark_ttl(&shared.config).as_millis() as u64),
            ];
            let script = match (reader, crate::model::keys::set_members(resource)) {
                (Some(_), _) => FAIR_SHARED_ACQUIRE_SCRIPT,
                (None, Some(_)) => FAIR_SET_ACQUIRE_SCRIPT,
                (None, None) => FAIR_ACQUIRE_SCRIPT,
            };
            let key = reader.unwrap_or(resource);
            let call = keyed_call(scratch, (&scripts()[script], id.tag()), key, None, &args);
            return core.send_script(net, (id, call), targets, now);
        }
        if let Some(name) = reader {
            // A reader: one script per node (`SHARED_ACQUIRE_BODY`), on the resource's key;
            // past its set precedence, the one that no longer steps back for sets.
            let args = [Arg::Bytes(token), Arg::UInt(ttl.as_millis() as u64)];
            let script = match op.past_sets {
                false => &scripts()[SHARED_ACQUIRE_SCRIPT],
                true => &scripts()[SHARED_ACQUIRE_PAST_SETS_SCRIPT],
            };
            let call = keyed_call(scratch, (script, id.tag()), name, None, &args);
            return core.send_script(net, (id, call), targets, now);
        }
        if op.step > 0 || crate::model::keys::set_members(resource).is_some() {
            // A set: one script per node over its members, all or none (`SET_ACQUIRE_BODY`), or
            // a step of its ordered acquisition (`SET_STEP_BODY`: the members it holds and the
            // next, the keys of its earlier attempts counted as its own by the token's first
            // `FAMILY_LEN` bytes). Fenced (the last step only), the script that also reads the
            // counter, its last key.
            let fenced = op.fence.stage == Stage::Reading;
            let script = match (op.step > 0, fenced) {
                (false, false) => SET_ACQUIRE_SCRIPT,
                (false, true) => SET_FENCED_ACQUIRE_SCRIPT,
                (true, false) => SET_STEP_SCRIPT,
                (true, true) => SET_STEP_FENCED_SCRIPT,
            };
            let counter = fenced.then_some(FENCE_KEY.as_bytes());
            let args = [
                Arg::Bytes(token),
                Arg::UInt(ttl.as_millis() as u64),
                Arg::UInt(FAMILY_LEN as u64),
                Arg::UInt(u64::from(op.tries)),
            ];
            let args = if op.step > 0 { &args[..] } else { &args[..2] };
            let call = keyed_call(
                scratch,
                (&scripts()[script], id.tag()),
                resource,
                counter,
                args,
            );
            return core.send_script(net, (id, call), targets, now);
        }
        if shared.config.fencing {
            // SET NX and the counter's read in one script (see `crate::proto::fencing`); a
            // waiting attempt's steps back for a set's mark.
            let script = match (core.mutation.fence_no_write_back(), op.waiting) {
                (true, _) => &scripts()[FLAWED_ACQUIRE_SCRIPT],
                (false, true) => &scripts()[WAITING_FENCED_ACQUIRE_SCRIPT],
                (false, false) => &scripts()[FENCED_ACQUIRE_SCRIPT],
            };
            let args = [
                Arg::Int(2),
                Arg::Bytes(resource),
                Arg::Bytes(FENCE_KEY.as_bytes()),
                Arg::Bytes(token),
                Arg::UInt(ttl.as_millis() as u64),
            ];
            let call = script_call(scratch, script, id.tag(), &args);
            return core.send_script(net, (id, call), targets, now);
        }
        if op.waiting {
            // An attempt after the first of a wait: `SET NX`, unless a set waits for the
            // resource (`WAITING_ACQUIRE_BODY`). Only contended attempts pay for the script.
            let args = [Arg::Bytes(token), Arg::UInt(ttl.as_millis() as u64)];
            let script = &scripts()[WAITING_ACQUIRE_SCRIPT];
            let call = keyed_call(scratch, (script, id.tag()), resource, None, &args);
            return core.send_script(net, (id, call), targets, now);
        }
        scratch.clear();
        if ttl == shared.config.ttl {
            set_nx_px.encode(scratch, resource, token);
        } else {
            SetNxPx::new(ttl.as_millis() as u64).encode(scratch, resource, token);
        }
        core.send_command(net, (id, Kind::Set, scratch), targets, now);
    }

    /// The outcome of acquire `index`'s decided round: won (with fencing, once the fence is
    /// written back: `fence.rs`), or lost — then its lock is released (`lost`).
    pub(super) fn acquire_decided(
        &mut self,
        index: usize,
        decision: Decision,
        now: Instant,
    ) -> Option<Outcome> {
        let op = &self.core.ops[index];
        match (op.fence.stage, decision) {
            (Stage::Reading, Decision::Won { valid_until, .. }) => {
                self.fence_read(index, valid_until, now)
            }
            (Stage::Writing, decision) => Some(self.fence_written(index, decision, now)),
            (_, Decision::Won { valid_until, .. }) => {
                self.last_round = op.vote.round_trip(op.start);
                Some(
                    op.vote
                        .grant(&self.net, &self.shared.nodes, valid_until, None),
                )
            }
            (_, Decision::Lost { loss, yes }) => {
                // The live nodes' round trip, not the node timeout a frozen node made this
                // round wait (the split pause is measured in it).
                self.last_round = op.vote.round_trip(op.start);
                // Won, for nobody, if a quorum said yes too late (`TooSlow`): its release
                // goes with the notice; a round short of a quorum is cleaned up quietly.
                let won = yes >= op.vote.round.quorum();
                self.lost.push((index as u32, won));
                let error = op
                    .vote
                    .loss_error(&self.shared.nodes, loss, Refusal::HeldElsewhere);
                Some(Outcome::Acquired(Err(error)))
            }
        }
    }
}
