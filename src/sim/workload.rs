//! The workload: each client's callers (threads or tasks sharing its engine), what each wants
//! and does — think, acquire (or wait for) a resource, hold, extend, keep, release — and
//! the operator who repairs the fence counters in `Break::FenceMajorityBlank`'s control.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Waiter;
use crate::engine::kept::Kept;
use crate::engine::mailbox::Slot;
use crate::engine::request::{OpId, Outcome, ReqKind};
use crate::model::lock::{Grant, Lock};
use crate::model::token::Token;

use super::callers::{Hold, Keeping, MAX_THINK, Want, Work};
use super::clock::MS;
use super::events::EvKind;
use super::setup::{Break, NODE_TIMEOUT, TTL};
use super::world::World;

/// Lock operations of a `Break::WaitForSilent` run: long enough that the first node timeout
/// of each client (before it knows the frozen node for silent) is a small part of it.
const CONTENTION_OPS: u64 = 2_000;

/// Operations of a `Break::FenceMajorityBlank` run, at least: past the outage (every attempt
/// during it an operation) and the repair.
const BLANK_MAJORITY_OPS: u64 = 600;

/// A waiting acquire's deadline comes within two TTLs.
const LONGEST_WAIT: u64 = 2 * TTL.as_nanos() as u64;

/// A holder plans to hold for a share of the validity it has left, in percent: some keep it
/// past their validity (they stop believing then).
const HOLD_PERCENT: Range<u64> = 0..120;

/// A kept lock is held for up to four TTLs, in percent of a TTL (renewed by the engine).
const KEEP_PERCENT: Range<u64> = 0..400;

/// A holder extends its lock at most this many times.
const MAX_EXTENDS: u32 = 3;

/// A poke moves the callers on at most this many turns: the operations one turn submits are
/// written by another step of the engine, and the callers may then submit again.
const WORK_TURNS: usize = 4;

/// The operator's repair is looked at, and tried again until it works, this often.
const OPERATOR_RETRY: u64 = 100 * MS;

/// The time the operator's repair is given: ten node timeouts, room for several of its rounds.
const REPAIR_TIMEOUT: u64 = 10 * NODE_TIMEOUT;

impl World {
    /// Moves client `c`'s callers on, up to [`WORK_TURNS`] turns.
    pub(super) fn work_turns(&mut self, c: usize, callers: usize, now: Instant) {
        // The workload may submit; each turn's submissions are written by another step.
        for _ in 0..WORK_TURNS {
            let mut submitted = false;
            for k in 0..callers {
                submitted |= self.work(c, k, now);
            }
            if !submitted {
                break;
            }
            self.clients[c].engine.step(now);
        }
    }

    /// The earliest instant (client `c`'s clock) at which one of its callers has something
    /// due by a timer of its own: the end of its thinking or holding, a kept lock's planned
    /// end, an async wait's drop.
    pub(super) fn callers_due(&self, c: usize) -> Option<Instant> {
        self.clients[c]
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
            .min()
    }

    /// The operator of `Break::FenceMajorityBlank`'s control: `repair_fences` through client
    /// 0 with the floor at the highest fence handed out so far — the least that the repair's
    /// assumption R1 allows (docs/fencing.md, "Repair"; a real operator adds a margin) — every
    /// [`OPERATOR_RETRY`] until a repair reports a quorum of counters repaired.
    pub(super) fn operate(&mut self) {
        let engine = &mut self.clients[0].engine;
        if let Some(id) = self.repair {
            if !engine.is_done(id) {
                self.at(self.g + OPERATOR_RETRY, EvKind::Operator);
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
        let highest = self
            .record
            .acquisitions
            .iter()
            .map(|a| a.2)
            .max()
            .unwrap_or(0);
        let floor = crate::model::fence_floor::FenceFloor::AtLeast(highest);
        let timeout = Duration::from_nanos(REPAIR_TIMEOUT);
        let kind = ReqKind::repair(&self.shared.config, floor, timeout).expect("a valid repair");
        let now = self.local(0);
        self.log(|| format!("operator repairs the fence counters: {floor:?}"));
        let id = self.clients[0]
            .engine
            .submit(kind, b"", &Token::EMPTY, Waiter::Local, now);
        self.repair = Some(id);
        self.poke(0);
        self.at(self.g + OPERATOR_RETRY, EvKind::Operator);
    }

    /// Submits an operation of client `c` on resource `res`, for a caller that waits for its
    /// outcome.
    fn submit(&mut self, c: usize, kind: ReqKind, res: usize, token: &Token, now: Instant) -> OpId {
        self.submit_for(c, kind, res, token, Waiter::Local, now)
    }

    /// Submits an operation of client `c` on resource `res`, its outcome to `waiter`; counted
    /// in the report's operations.
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
    pub(super) fn keeping_before(&mut self, c: usize, caller: usize, now: Instant) {
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
    pub(super) fn keeping_after(&mut self, c: usize, caller: usize, now: Instant) {
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
            b if b.contention() || b.of_sets() => self.setup.ops.max(CONTENTION_OPS),
            Break::FenceMajorityBlank => self.setup.ops.max(BLANK_MAJORITY_OPS),
            _ => self.setup.ops,
        }
    }

    /// Callers release at once and never keep or extend: contention for the acquire itself
    /// (`Break::contention`).
    fn contend(&self) -> bool {
        self.setup.breaks.contention()
    }

    /// [`World::work`] for a caller with something due: the next step of what it is doing.
    /// True if it submitted an operation.
    fn work_due(&mut self, c: usize, k: usize, now: Instant) -> bool {
        let client = &mut self.clients[c];
        match std::mem::replace(&mut client.callers[k].work, Work::Done) {
            Work::Idle { until } if now >= until => self.acquire(c, k, now),
            Work::Acquiring {
                slot: Some((slot, drop_at)),
                res,
                start_g,
                ..
            } if !slot.is_done() && now >= drop_at => {
                let g = self.g;
                self.record.wait_spans.push((c, k, res, start_g, g));
                self.drop_wait(c, k, slot, res, now)
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
                    let g = self.g;
                    self.record.wait_spans.push((c, k, res, start_g, g));
                }
                match self.acquire_outcome(c, id, token, slot) {
                    Ok(won) => return self.granted(c, k, res, start_g, won, now),
                    Err(other) => {
                        self.log(|| format!("client {c} failed to acquire {res}: {other:?}"));
                        let pause =
                            crate::engine::queue::retry_pause(&self.shared.config, self.rng.next());
                        self.clients[c].callers[k].work = Work::Idle { until: now + pause };
                    }
                }
                false
            }
            Work::Holding(hold) if now >= hold.until => self.hold_ends(c, k, hold, now),
            Work::Extending { id, hold } if client.engine.is_done(id) => {
                self.extended(c, k, id, hold, now)
            }
            // A holder stops at its planned end, or when it learns of the loss (then it
            // releases what the engine left on the nodes for it: `Kept::leave_to_holder`); a
            // client that ignores validity works on to its planned end.
            Work::Keeping(kp)
                if now >= kp.until || (kp.kept.is_lost() && !client.ignores_validity) =>
            {
                self.keeping_ends(c, k, kp, now)
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

    /// Caller `k` of client `c`, done thinking, goes on with its want (or begins one) and
    /// submits an acquire of it — a third of them a wait. Its want given up, or none begun
    /// (the run's operations are spent), it is done.
    fn acquire(&mut self, c: usize, k: usize, now: Instant) -> bool {
        let Some(res) = self.next_want(c, k) else {
            return false;
        };
        let token = self.draw_token();
        // A third wait for the resource (lock_until): attempts with tokens of their own,
        // brought by releases, the poll or a split vote's pause, until a deadline.
        let wait = self
            .rng
            .chance(33)
            .then(|| Duration::from_nanos(self.rng.range(0, LONGEST_WAIT)));
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
        if wait.is_some() {
            self.record.wait_callers.push((c, id, k, res));
        }
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

    /// The resource caller `k` of client `c` wants next: the one it wants still, or a new
    /// one. `None` when it gives its want up or begins none.
    fn next_want(&mut self, c: usize, k: usize) -> Option<usize> {
        let g = self.g;
        match self.clients[c].callers[k].want {
            // A want goes on until it is granted — or, so that a run without a quorum
            // ends, until the run has made twice its operations.
            Some((res, _)) if self.report.ops < 2 * self.ops() => Some(res),
            Some((res, start)) => {
                self.clients[c].callers[k].want = None;
                self.record.wants.push(Want {
                    res,
                    client: c,
                    caller: k,
                    start,
                    end: g,
                });
                self.report.abandoned += 1;
                self.log(|| format!("client {c}/{k} gives {res} up"));
                None
            }
            None if self.report.ops >= self.ops() => None,
            None => {
                let mut res = self.rng.range(0, self.resources.len() as u64) as usize;
                if self.only_shared && !self.shared_of[res] {
                    // The shared locks are the last `plain` resources.
                    let plain = self.shared_of.iter().filter(|&&s| s).count();
                    res = self.resources.len() - plain + res % plain;
                }
                self.clients[c].callers[k].want = Some((res, g));
                self.report.wants += 1;
                Some(res)
            }
        }
    }

    /// A token for an acquire: 20 bytes, encoded as the client's own tokens are (a reader's
    /// release sweeps only members of that shape).
    fn draw_token(&mut self) -> Token {
        let mut raw = [0u8; crate::model::token::RANDOM_BYTES];
        for chunk in raw.chunks_mut(8) {
            let n = self.rng.next().to_le_bytes();
            chunk.copy_from_slice(&n[..chunk.len()]);
        }
        Token::encode(&raw)
    }

    /// The async caller drops its future: nobody takes the outcome (a lock won for it is the
    /// engine's to release); the caller still wants the resource.
    fn drop_wait(&mut self, c: usize, k: usize, slot: Arc<Slot>, res: usize, now: Instant) -> bool {
        slot.cell().cancelled = true;
        self.report.dropped += 1;
        self.log(|| format!("client {c} drops its wait for {res}"));
        let pause = crate::engine::queue::retry_pause(&self.shared.config, self.rng.next());
        self.clients[c].callers[k].work = Work::Idle { until: now + pause };
        false
    }

    /// An acquire's outcome, from its slot (an async caller's) or from the engine: its token
    /// and grant if it won, else what came.
    fn acquire_outcome(
        &mut self,
        c: usize,
        id: OpId,
        token: Token,
        slot: Option<(Arc<Slot>, Instant)>,
    ) -> Result<(Token, Grant), Option<Outcome>> {
        let client = &mut self.clients[c];
        let outcome = match slot {
            Some((slot, _)) => slot.cell().take_outcome().map(|(outcome, _)| outcome),
            None => client.engine.take(id),
        };
        match outcome {
            Some(Outcome::Acquired(Ok(grant))) => Ok((token, grant)),
            // A waited-for acquire: the token is the winning attempt's.
            Some(Outcome::Locked(Ok((variant, grant)))) => Ok((token.variant(variant), grant)),
            other => Err(other),
        }
    }

    /// Caller `k` of client `c` won `res` (an acquire submitted at `start_g`): the grant is
    /// checked and recorded, and the caller holds the lock for a while — or keeps it, renewed
    /// by the engine. True if it kept it.
    fn granted(
        &mut self,
        c: usize,
        k: usize,
        res: usize,
        start_g: u64,
        (token, grant): (Token, Grant),
        now: Instant,
    ) -> bool {
        let valid = grant.valid_until;
        let backing = grant.votes.yes;
        self.check_cover(c, res, token.as_bytes(), valid);
        let fence = grant.fence.unwrap_or(0);
        self.record_grant(c, k, start_g, grant.fence);
        let left = valid.saturating_duration_since(now);
        // Some holders keep it past their validity (they stop believing then).
        let hold = match self.contend() {
            // Released at once, as `redlock demo`'s handles do.
            true => Duration::ZERO,
            false => left.mul_f64(self.rng.within(HOLD_PERCENT) as f64 / 100.0),
        };
        let g = self.g;
        self.log(|| format!("client {c} holds {res}, valid {} ms", left.as_millis()));
        if !self.contend() && self.rng.chance(25) {
            // Kept: renewed by the engine for up to four TTLs.
            let kept = self.keep(c, res, (token, grant), now);
            let until = now + TTL.mul_f64(self.rng.within(KEEP_PERCENT) as f64 / 100.0);
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
        false
    }

    /// Counts a grant to caller `k` of client `c` (an acquire submitted at `start_g`), and
    /// records its fence, if any, and the end of the caller's want.
    fn record_grant(&mut self, c: usize, k: usize, start_g: u64, fence: Option<u64>) {
        if let Some(f) = fence {
            self.report.fenced += 1;
            self.record.acquisitions.push((start_g, self.g, f, c));
            self.log(|| format!("client {c} got fence {f}"));
        }
        self.report.acquired += 1;
        if self.report.first_grant.is_none() {
            self.report.first_grant = Some(Duration::from_nanos(self.g));
        }
        if fence.is_some() && self.healed_at.is_some_and(|h| self.g > h) {
            self.report.fenced_after_heal += 1;
        }
        if let Some((r, start)) = self.clients[c].callers[k].want.take() {
            let end = self.g;
            self.record.wants.push(Want {
                res: r,
                client: c,
                caller: k,
                start,
                end,
            });
        }
    }

    /// Hands a lock won by client `c` to its engine to keep (renew) until it is released.
    fn keep(
        &mut self,
        c: usize,
        res: usize,
        (token, grant): (Token, Grant),
        now: Instant,
    ) -> Arc<Kept> {
        let resource = &self.resources[res];
        let lock = Lock::granted(resource, token, grant);
        let kept = Arc::new(Kept::new(
            lock,
            self.clients[c].engine.callbacks.clone(),
            &self.clients[c].engine.shared.nodes,
        ));
        self.clients[c].engine.keep(kept.clone(), now);
        kept
    }

    /// A holder's planned end: it extends (now and then, up to three times, while valid), or
    /// stops believing and releases (a third without waiting for the replies).
    fn hold_ends(&mut self, c: usize, k: usize, mut hold: Hold, now: Instant) -> bool {
        let extend = !self.contend()
            && hold.extensions < MAX_EXTENDS
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

    /// An extend's outcome: the holder holds on, until a new planned end within the validity
    /// it now has.
    fn extended(&mut self, c: usize, k: usize, id: OpId, mut hold: Hold, now: Instant) -> bool {
        match self.clients[c].engine.take(id) {
            Some(Outcome::Extended(valid, result)) => {
                if result.is_ok() {
                    self.check_cover(c, hold.res, hold.token.as_bytes(), valid);
                }
                // As `Lock::extended_on` follows it (0: not known, and stays so).
                let (won, votes) = crate::model::lock::extend_votes(&result);
                hold.backing = crate::model::lock::backing_after_extend(hold.backing, won, votes);
                hold.valid = valid;
                let left = valid.saturating_duration_since(now);
                let frac = self.rng.within(HOLD_PERCENT) as f64 / 100.0;
                hold.until = now + left.mul_f64(frac);
                let result = result.map(|_| ());
                self.log(|| format!("client {c} extend: {result:?}"));
            }
            other => unreachable!("an extend's outcome: {other:?}"),
        }
        self.clients[c].callers[k].work = Work::Holding(hold);
        false
    }

    /// A kept lock's end: the belief in it, if still held, ends; the holder releases what is
    /// its to release, or finds it released.
    fn keeping_ends(&mut self, c: usize, k: usize, kp: Keeping, now: Instant) -> bool {
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
}
