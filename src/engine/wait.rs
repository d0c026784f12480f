//! A waiting acquire (`ReqKind::Wait`): a queue per contended resource (`crate::engine::queue`), whose
//! head makes attempts — acquires of their own, each with a token of its own — when a release
//! is seen (ours, or another client's notice: `notice.rs`), after a refusal's pause, or at the
//! fallback poll; waiters leave at their deadline or when their caller is gone.

use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::queue::{
    CANCEL_SWEEP, Queue, SAY_HELD_AFTER, Seen, WaitReason, crowd_pause, retry_pause, split_pause,
};
use crate::engine::request::{OpId, Outcome, ReqKind};
use crate::model::error::Error;
use crate::model::lock::Grant;
use crate::model::token::Token;
use crate::proto::scripts::SET_MARK_SCRIPT;

use super::Engine;
use super::observe::{acquired_event, waiting_event};
use super::op::is_cancelled;
use super::{OpKind, Waiter};

/// A queue with no deadline (cannot happen while it has waiters) is looked at again after this.
const FAR_FUTURE: Duration = Duration::from_secs(3600);

impl<N: Net> Engine<N> {
    /// Callers waiting in the queue of `resource`.
    pub fn waiters(&mut self, resource: &[u8]) -> usize {
        self.waits.get_mut(resource).map_or(0, |q| q.waiters.len())
    }

    /// The simulator's view of an attempt a node ran: the waiting acquire whose attempt wrote
    /// `value` (its token first), if that attempt is still in flight, and how long the wait
    /// had lasted when the attempt was sent.
    #[cfg(feature = "sim")]
    pub(crate) fn attempt_of(&self, value: &[u8]) -> Option<(OpId, Duration)> {
        let op = (self.core.ops.iter()).find(|op| {
            !op.done
                && matches!(op.waiter, Waiter::Attempt(_))
                && value.starts_with(op.token.as_bytes())
        })?;
        let Waiter::Attempt(w) = op.waiter else {
            return None;
        };
        let wait = &self.core.ops[w.index as usize];
        Some((w, op.start.saturating_duration_since(wait.start)))
    }

    /// Starts a waiting acquire: its first attempt at once, unless callers of this engine
    /// already wait for the resource (then it lines up behind them).
    pub(super) fn submit_wait(
        &mut self,
        (resource, token): (&[u8], &Token),
        (ttl, deadline): (Duration, Instant),
        waiter: Waiter,
        now: Instant,
    ) -> OpId {
        // `open` clears what a slot's last use left (the faults above all: a won lock its
        // caller dropped is released through `lost`, which reads them: `Engine::quiet_release`).
        let id = self.core.open((resource, token), waiter, now);
        let op = &mut self.core.ops[id.index as usize];
        op.kind = OpKind::Wait;
        op.until = deadline;
        op.ttl = ttl;
        op.tries = 0;
        op.behind = false;
        match self.waits.get_mut(resource) {
            Some(q) => {
                q.waiters.push_back(id);
                q.earliest = q.earliest.min(deadline);
                q.touch(now);
                if q.waiters.len() == 1 && q.attempt.is_none() {
                    // First in a queue that lingers: attempts at once, as its head (unmarked,
                    // like an attempt with no queue: most find the resource free).
                    self.attempt(id, now, false);
                } else {
                    self.core.ops[id.index as usize].behind = true;
                }
            }
            None => self.attempt(id, now, false),
        }
        id
    }

    /// Submits the next attempt of the waiting operation `w`, with a token of its own; if `w`
    /// heads a queue and `mark`, behind a waiting mark (see [`Engine::mark_waiting`]).
    pub(super) fn attempt(&mut self, w: OpId, now: Instant, mark: bool) {
        let mut resource = std::mem::take(&mut self.wait_resource);
        let op = &mut self.core.ops[w.index as usize];
        let variant = op.tries;
        let token = op.token.variant(variant);
        op.tries = op.tries.wrapping_add(1);
        let ttl = op.ttl;
        resource.clear();
        resource.extend_from_slice(&op.resource);
        // A set of several members tries all of them at once first (most find them free);
        // refused, with ordered sets (`Config::ordered_sets`), it takes them one at a time, in
        // order, each step keeping what it has
        // (`SET_STEP_BODY`): all at once, a set waited for a moment when every member was free
        // together, which callers of each member alone (and readers, who overlap) need never
        // leave — the real-server soak saw about one set wait in a hundred end with the set.
        // Held members are the set's, every other waiter of them waits for it; ordered, no
        // two sets wait for each other (each waits only for a member after all it holds).
        let ordered = self.shared.config.ordered_sets;
        // With ordered sets, a waiter steps back for a waiting set's mark only during the
        // first `Config::set_precedence` of its wait: a steady stream of sets, each marking the
        // member it waits for, kept this crate's writers and readers of a set's first member
        // out for as long as it lasted (the contention benchmark's mixed shape, ordered: 0–2
        // sections in 2 s for a median writer or reader of it).
        let past_sets = ordered
            && now.saturating_duration_since(op.start) >= self.shared.config.set_precedence
            && !self.core.mutation.set_marks_unbounded();
        let members = crate::model::keys::set_members(&resource).map_or(0, Iterator::count);
        let stepping = members > 1 && variant > 0 && ordered;
        let step = match stepping && !self.core.mutation.sets_all_at_once() {
            true => op.step + 1,
            false => 0,
        };
        #[cfg(feature = "sim")]
        if step == 1 && op.stepping == 0 {
            // Its first step: it marks the first member from now on.
            self.step_log.push((w, 0, true, now));
        }
        let op = &mut self.core.ops[w.index as usize];
        op.stepping = step;
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
        let keys = match crate::model::keys::set_prefix(&resource, usize::from(step)) {
            Some((keys, member)) => {
                if marked {
                    // Waiting for this member alone: its mark (`SET_MARK_BODY`) makes this
                    // crate's waiting writers and readers of it step back.
                    self.mark(member, SET_MARK_SCRIPT, all, now);
                }
                self.step_attempt = Some((step, usize::from(step) == members, variant));
                keys
            }
            None => {
                if marked {
                    // A waiter (subscribed since its queue opened): marked as one, ahead of the
                    // attempt on the same connections, so that a release after a refusal
                    // publishes.
                    self.mark_waiting(&resource, all, now);
                }
                // A plain lock's attempt after its first steps back for a set's mark (with
                // ordered sets: `Config::ordered_sets`).
                self.waiting_attempt = ordered
                    && variant > 0
                    && !past_sets
                    && crate::model::keys::is_one_key(&resource);
                self.past_sets_attempt = past_sets;
                &resource[..]
            }
        };
        let kind = ReqKind::Acquire { ttl };
        let id = self.submit_to(kind, keys, &token, Waiter::Attempt(w), all, now);
        // The attempt's variant, for the outcome (`Outcome::Locked`).
        self.core.ops[id.index as usize].tries = variant;
        self.wait_resource = resource;
    }

    /// A release of `resource` was submitted here ([`Seen::Ours`]) or announced by another
    /// client: the head of its queue attempts (now, in the same write as our release), unless a
    /// split vote's pause or the local streak's yield holds it back.
    pub(super) fn released(&mut self, resource: &[u8], now: Instant, seen: Seen) {
        // Capped like a split's pause (`attempt_lost`): a stalled client's last round can be
        // far longer than any node's answer.
        let round = self.last_round.min(self.core.node_timeout);
        let notice = matches!(seen, Seen::Notice(_));
        // Readers do not split each other's votes (every one of them can win): no crowd to
        // spread. Nor do fair waiters (only the first in the queue can win: the others' pause
        // delayed the one that could, and cut the contention benchmark's fair rate to a fifth
        // of the plain lock's). Nor with the herd brought back (the simulator's
        // `Mutation::NoticeHerd`).
        let seen = match seen {
            Seen::Notice(_)
                if crate::model::keys::shared_name(resource).is_some()
                    || super::fair::applies(&self.shared.config)
                    || self.core.mutation.notice_herd() =>
            {
                Seen::Notice(0)
            }
            seen => seen,
        };
        let Some(q) = self.waits.get_mut(resource) else {
            return;
        };
        if notice && q.held_until.is_some_and(|t| t > now) {
            // A caller of ours holds it: a notice is of an earlier release (often our own,
            // coming back after the next of ours already won).
            return;
        }
        let random = self.waits.random();
        let Some(q) = self.waits.get_mut(resource) else {
            return;
        };
        if let Some(at) = q.on_release(now, (round, random), seen)
            && at <= now
            && let Some(&head) = q.waiters.front()
            && !is_cancelled(&self.core.ops[head.index as usize])
        {
            // Right behind our own release (in the same write), the attempt needs no mark.
            self.attempt(head, now, notice);
        }
    }

    /// Ends the waiting operation `w` with `outcome` (`None`: its caller is gone). False if a
    /// lock it won found its caller gone: then it is on `lost`, released in this turn.
    pub(super) fn finish_wait(&mut self, w: OpId, outcome: Option<Outcome>, now: Instant) -> bool {
        let mut kept = true;
        let op = &mut self.core.ops[w.index as usize];
        op.done = true;
        #[cfg(feature = "sim")]
        if op.step > 0 || op.stepping > 0 {
            self.step_log.push((w, 0, false, now));
        }
        let op = &mut self.core.ops[w.index as usize];
        // A fair lock's waiter that joined its queue (an attempt after its first, or any of a
        // waiter that lined up behind others of this engine: `Op::joins`) leaves it: won, on the
        // nodes that did not say yes (a yes took its entry out), which still hold its entry,
        // older than any later waiter's; given up, on every node. Only a waiter that did not
        // win tells the next in line.
        if super::fair::applies(&self.shared.config) && op.tries > 0 && op.joins(op.tries > 1) {
            let all = self.all_nodes();
            let (nodes, notice) = match &outcome {
                Some(Outcome::Locked(Ok((_, grant)))) => (all & !grant.votes.yes, false),
                _ => (all, true),
            };
            if nodes != 0 {
                self.leave_queue(w, (nodes, notice), now);
            }
        }
        let op = &mut self.core.ops[w.index as usize];
        if let Some(Outcome::Locked(Ok((variant, _)))) = &outcome {
            // What a release of a lock won for nobody must delete.
            op.token = op.token.variant(*variant);
        } else if op.step > 0 {
            // A set that gave up (its deadline, its caller gone) holding members won by steps
            // of its ordered acquisition: released at once, with their notices, by the token's
            // family (every key any attempt of this wait set), as a lock is.
            op.step = 0;
            let (resource, token) = (op.resource.clone(), op.token);
            let all = self.all_nodes();
            self.submit_to(ReqKind::Release, &resource, &token, Waiter::None, all, now);
        }
        let op = &mut self.core.ops[w.index as usize];
        match std::mem::replace(&mut op.waiter, Waiter::None) {
            Waiter::Local => op.outcome = outcome,
            Waiter::Slot(slot) => {
                self.core.waiting -= 1;
                if let Some(outcome) = outcome
                    && let Some(Outcome::Locked(Ok(_))) =
                        slot.deliver(outcome, self.mailbox.as_deref().map(|m| &m.unclaimed))
                {
                    // Its caller dropped the future: released like a lost attempt — but won
                    // (its notice goes out): this op ran no round whose votes could say so.
                    self.lost.push((w.index, true));
                    kept = false;
                }
            }
            _ => {}
        }
        if op.outstanding == 0 && op.outcome.is_none() && kept {
            // Not a lock won for nobody: its slot is freed by `release_lost`, once read.
            self.core.free_slot(w.index as usize);
        }
        kept
    }

    /// Applies the attempts decided in this turn to their waiting operations and queues.
    pub(super) fn attempts_decided(&mut self, now: Instant) {
        let mut decided = std::mem::take(&mut self.attempts);
        let mut resource = std::mem::take(&mut self.wait_resource);
        for (w, variant, outcome, split) in decided.drain(..) {
            let op = &self.core.ops[w.index as usize];
            if op.seq != w.seq || op.done || !self.core.is_live(w.index as usize) {
                continue;
            }
            resource.clear();
            resource.extend_from_slice(&op.resource);
            let deadline = op.until;
            match outcome {
                Outcome::Acquired(Ok(grant)) => self.attempt_won(w, variant, grant, &resource, now),
                // No retry mends it (a wrong CA, a port that speaks another protocol,
                // credentials refused on too many nodes): the caller learns at once.
                Outcome::Acquired(Err(error)) if error.is_permanent() || deadline <= now => {
                    self.wait_failed(w, error, &resource, now)
                }
                Outcome::Acquired(Err(error)) => {
                    self.attempt_lost(w, (error, split), &resource, deadline, now)
                }
                _ => {}
            }
        }
        self.wait_resource = resource;
        self.attempts = decided;
    }

    /// Waiting operation `w`'s attempt won: the caller has the lock; the next in line waits for
    /// its release (ours), or the end of the lock if it is never released. If the caller is
    /// gone (a dropped future; every permit but one of a semaphore's race), the lock is
    /// released in this turn and the next in line attempts right behind that release: it
    /// waited for the lock's whole validity — past its deadline, with the resource free — for
    /// a release that does not come through `submit` and a notice ignored while the queue
    /// believed a caller of ours held it (found by two reviews).
    fn attempt_won(&mut self, w: OpId, variant: u32, grant: Grant, resource: &[u8], now: Instant) {
        let op = &mut self.core.ops[w.index as usize];
        let step = op.stepping;
        if step > 0 && crate::model::keys::set_prefix(resource, usize::from(step) + 1).is_some() {
            // A step of a set's ordered acquisition: one member more is the set's, held on a
            // quorum; the next is tried at once (marked: it is this wait's next member).
            op.step = step;
            #[cfg(feature = "sim")]
            self.step_log.push((w, step, true, now));
            let op = &self.core.ops[w.index as usize];
            let (deadline, gone) = (op.until, is_cancelled(op));
            if let Some(q) = self.waits.get_mut(resource) {
                q.attempt_decided(w);
                q.touch(now);
            }
            if !gone && deadline > now {
                self.attempt(w, now, true);
                return;
            }
            // Out of time (with the last refusal), or its caller gone: it leaves, and releases
            // what it holds (`finish_wait`); the next in line takes its place at once.
            let error = (self.waits.get(resource))
                .filter(|_| !gone)
                .map(|q| q.last_error.clone());
            self.finish_wait(w, error.map(|e| Outcome::Locked(Err(e))), now);
            if let Some(q) = self.waits.get_mut(resource) {
                if q.leave(w) {
                    q.try_at = now;
                }
                q.touch(now);
            }
            return;
        }
        let op = &self.core.ops[w.index as usize];
        let since = now.saturating_duration_since(op.start);
        acquired_event(
            &self.shared.nodes,
            &op.resource,
            op.tries,
            since,
            grant.votes,
        );
        let valid_until = grant.valid_until;
        let kept = self.finish_wait(w, Some(Outcome::Locked(Ok((variant, grant)))), now);
        if !kept || crate::model::keys::shared_name(resource).is_some() {
            // A reader: the next reader in line does not wait for this one, it attempts now;
            // nor for a lock won for a caller gone, released in this turn (the attempt goes
            // out behind that release, in the same write).
            if let Some(q) = self.waits.get_mut(resource) {
                if !kept {
                    // Nobody of ours holds it: the lock just won was ours alone.
                    q.held_until = None;
                } else {
                    q.wait_over(now);
                }
                if q.leave(w) {
                    q.splits = 0;
                    q.not_before = None;
                    q.try_at = now;
                }
                q.touch(now);
            }
            return;
        }
        let pause = retry_pause(&self.shared.config, self.waits.random());
        // A fair lock's local hand-offs are no streak to yield from: the next caller of ours
        // goes first only where its entry is the oldest (it attempts behind the release with its
        // entry: `Op::joins`), and a yield let a younger waiter of another client pass it.
        let streak = u32::from(!super::fair::applies(&self.shared.config));
        if let Some(q) = self.waits.get_mut(resource) {
            q.held_until = Some(valid_until);
            q.wait_over(now);
            if q.leave(w) {
                q.streak += streak;
                q.splits = 0;
                q.not_before = None;
                q.try_at = q.after_refusal(now, pause);
            }
            q.touch(now);
        }
    }

    /// Waiting operation `w` ends with `error`; the next in line takes its place at once.
    fn wait_failed(&mut self, w: OpId, error: Error, resource: &[u8], now: Instant) {
        self.finish_wait(w, Some(Outcome::Locked(Err(error))), now);
        if let Some(q) = self.waits.get_mut(resource) {
            if q.leave(w) {
                q.try_at = now;
            }
            q.touch(now);
        }
    }

    /// Waiting operation `w`'s attempt lost (`split`: to a competing attempt that took some of
    /// the nodes) and it waits on, until `deadline`: in its queue, which opens now if the
    /// resource was not contended yet.
    fn attempt_lost(
        &mut self,
        w: OpId,
        (error, split): (Error, bool),
        resource: &[u8],
        deadline: Instant,
        now: Instant,
    ) {
        // A split pause scales with the last round, which a stalled client (a GC pause, a
        // stopped process, a starved engine thread) can stretch far past any node's answer:
        // never more than a node timeout, so that 2^6 of them stay within the bound that the
        // waits' liveness is derived from (docs/guarantees.md, "The simulator").
        let round = self.last_round.min(self.core.node_timeout);
        let random = self.waits.random();
        let poll = retry_pause(&self.shared.config, random);
        let held = matches!(error, Error::Held(_));
        let hears = self.core.no_notices.iter().any(|&no| !no);
        let q: &mut Queue = match self.waits.get_mut(resource) {
            Some(q) => {
                if !q.waiters.contains(&w) {
                    q.waiters.push_back(w);
                }
                q.touch(now);
                q
            }
            None => {
                // Contended from now on: subscribed to its release notices, then (the
                // subscription goes out first) one more attempt at once, since a release may
                // have come while this one was in flight, with no queue to note it.
                let all = self.all_nodes();
                self.subscription(b"SUBSCRIBE", resource, all, now);
                let q = self.waits.open(resource, w, error.clone(), now);
                // Nodes not reached now are subscribed when they are back.
                q.subscribed = all;
                q.released = true;
                q
            }
        };
        q.attempt_decided(w);
        let head = q.waiters.front() == Some(&w);
        if head {
            q.try_at = next_try(q, (held, split, hears), (round, random, poll), now);
        }
        // The head too: its deadline was left out of `earliest` while its attempt was in
        // flight, and its next attempt may come after the deadline (a split pause, the poll).
        if !(head && self.core.mutation.deadline_not_rearmed()) {
            q.earliest = q.earliest.min(deadline);
        }
        let reason = WaitReason::of(&error);
        let waited = now.saturating_duration_since(q.since);
        if q.said != Some(reason)
            && (q.said.is_some() || reason != WaitReason::Held || waited >= SAY_HELD_AFTER)
        {
            q.said = Some(reason);
            waiting_event(resource, reason, waited, &error);
        }
        q.last_error = error;
    }

    /// True while the waiting operation `id` waits in its queue with no attempt in flight.
    pub(super) fn is_waiting(&self, id: OpId) -> bool {
        let op = &self.core.ops[id.index as usize];
        op.kind == OpKind::Wait
            && !op.done
            && self
                .waits
                .get(&op.resource)
                .is_some_and(|q| q.attempt != Some(id) && q.waiters.contains(&id))
    }

    /// The queues' timers: waiters whose deadline passed or whose caller is gone leave; a head
    /// whose attempt is due makes it; idle queues close (and unsubscribe).
    pub(super) fn tick_waits(&mut self, now: Instant) {
        if self.waits.is_empty() {
            return;
        }
        let mut due = std::mem::take(&mut self.due);
        let mut ended: Vec<(OpId, Option<Error>)> = Vec::new();
        self.sweep_queues(&mut ended, &mut due, now);
        // The queues' order is the hash map's: sorted, so that a simulated schedule replays.
        ended.sort_by_key(|(id, _)| (id.index, id.seq));
        for (id, error) in ended {
            self.finish_wait(id, error.map(|e| Outcome::Locked(Err(e))), now);
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

    /// Every queue at `now`: its waiters past their deadline (with the last error) and its
    /// cancelled heads go into `ended`; a head whose attempt is due into `due`.
    fn sweep_queues(
        &mut self,
        ended: &mut Vec<(OpId, Option<Error>)>,
        due: &mut Vec<OpId>,
        now: Instant,
    ) {
        let Engine { waits, core, .. } = self;
        let ops = &core.ops;
        for (_, q) in waits.iter_mut() {
            let attempting = q.attempt;
            if q.cancel_sweep <= now {
                q.cancel_sweep = now + CANCEL_SWEEP;
                q.waiters.retain(|&id| {
                    let gone = attempting != Some(id) && is_cancelled(&ops[id.index as usize]);
                    if gone {
                        ended.push((id, None));
                    }
                    !gone
                });
            }
            if q.earliest <= now {
                q.waiters.retain(|&id| {
                    let gone = attempting != Some(id) && ops[id.index as usize].until <= now;
                    if gone {
                        ended.push((id, Some(q.last_error.clone())));
                    }
                    !gone
                });
                q.earliest = (q.waiters.iter())
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
}

/// When the head of queue `q` attempts next, after its attempt lost at `now`: `held` (refused:
/// somebody holds it) or not (no quorum: nodes down, quarantined, too slow), `split` (some
/// nodes said yes, not enough), `hears` (some node takes our subscriptions); `round` the last
/// round's duration, `random` for the jitter, `poll` the fallback poll's pause.
fn next_try(
    q: &mut Queue,
    (held, split, hears): (bool, bool, bool),
    (round, random, poll): (Duration, u64, Duration),
    now: Instant,
) -> Instant {
    // Refused unmarked: nothing would tell of the holder's release but the poll, so the next
    // attempt, marked, goes at once (unless no node takes subscriptions: then it would wait
    // for the poll all the same).
    let unmarked = held && !std::mem::take(&mut q.marked) && hears;
    let notified = std::mem::take(&mut q.released);
    let released = notified || unmarked;
    if split {
        q.splits += 1;
        let pause = split_pause(q.splits, round, random);
        q.not_before = Some(now + pause);
        return now + pause;
    }
    q.splits = 0;
    // No quorum (nodes down, quarantined, too slow): a release notice does not make the next
    // attempt any likelier to win, and the attempt's own cleanup publishes one that our
    // subscription hears — without this pause a waiter would retry at once, again and again,
    // while the nodes are unavailable.
    q.not_before = (!held).then_some(now + poll);
    if held && q.held_until.is_none_or(|t| t <= now) {
        // Somebody else has it: our callers' streak is over.
        q.streak = 0;
    }
    match (held, released) {
        // Refused while a notice that others heard came: in the crowd like them
        // (`Queue::on_release`).
        (true, true) if notified && q.crowd > 0 => {
            let at = now + crowd_pause(q.crowd, round, random);
            q.not_before = Some(at);
            at
        }
        (true, true) => now,
        (true, false) => q.after_refusal(now, poll),
        (false, _) => now + poll,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::queue::Waits;
    use crate::engine::request::OpId;

    fn queue(now: Instant) -> Waits {
        let mut waits = Waits::new(1);
        let error = Error::Expired { released: 0 };
        waits.open(b"r", OpId::for_tests(0), error, now);
        waits
    }

    #[test]
    fn after_a_lost_attempt_the_head_waits_as_its_loss_says() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let (round, poll) = (ms(1), ms(100));
        let mut waits = queue(now);
        let q = waits.get_mut(b"r").unwrap();
        // Held, refused unmarked, and some node takes subscriptions: the next attempt, marked,
        // goes at once.
        q.marked = false;
        assert_eq!(next_try(q, (true, false, true), (round, 7, poll), now), now);
        // Held, marked: waits for the release's notice, the fallback poll at the latest.
        q.marked = true;
        let at = next_try(q, (true, false, true), (round, 7, poll), now);
        assert!(at > now && at <= now + poll, "{at:?}");
        // No quorum: one poll, and no notice brings it sooner.
        let at = next_try(q, (false, false, true), (round, 7, poll), now);
        assert_eq!((at, q.not_before), (now + poll, Some(now + poll)));
        // Split votes: a random pause within a span that doubles with each split in a row.
        let half = u64::MAX / 2;
        let first = next_try(q, (true, true, true), (round, half, poll), now);
        let second = next_try(q, (true, true, true), (round, half, poll), now);
        assert_eq!(q.splits, 2);
        assert!(now < first && first < second, "{first:?} {second:?}");
        assert_eq!(q.not_before, Some(second));
        // Refused, with a notice heard meanwhile: at once if only we heard it; in the crowd
        // (not before a random share of its span) if a crowd of three did.
        q.marked = true;
        q.released = true;
        q.crowd = 0;
        assert_eq!(
            next_try(q, (true, false, true), (round, half, poll), now),
            now
        );
        q.marked = true;
        q.released = true;
        q.crowd = 3;
        let at = next_try(q, (true, false, true), (round, half, poll), now);
        assert!(now < at && at <= now + round * 3, "{at:?}");
        assert_eq!(q.not_before, Some(at));
        // Refused unmarked (no notice): at once, marked, whatever an older crowd was.
        q.marked = false;
        assert_eq!(
            next_try(q, (true, false, true), (round, half, poll), now),
            now
        );
    }
}
