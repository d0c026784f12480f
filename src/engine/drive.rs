//! Running the engine: the loop's turns on a real network (waiting in `poll` for replies or
//! the next deadline), the hand-off of requests queued by other callers (the mailbox, held
//! briefly for the tasks just woken), local operations run to their outcomes on the calling
//! thread, and the shutdown that waits for unconfirmed releases.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::engine::mailbox::{Caller, Slot};
use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome, ReqKind};
use crate::model::round::deadline_after;
use crate::model::token::Token;

use super::{Engine, HOLD, Shutdown, Waiter};

impl<N: Net> Engine<N> {
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

    /// Until when the requests queued in the mailbox are held back, if they are: while tasks
    /// woken with their outcomes have not taken them yet (they are about to queue their next
    /// requests), for [`HOLD`] at most. The last of them to take its outcome wakes the loop
    /// ([`Mailbox::claimed`](crate::engine::mailbox::Mailbox::claimed)), so the held requests and theirs go out together: one write per
    /// node where each task's request would otherwise have gone out in a turn of its own.
    ///
    /// Measured with the bench's `scale` scenario against the commit before (2-core VM, 5
    /// loopback servers, tokio tasks on a 2-worker runtime, 2 alternating runs of 3 rounds):
    /// writes per cycle at K = 64 0.35–0.45 → 0.20–0.24, at K = 8 1.49–2.47 → 1.25–1.37; p99 at
    /// K = 64 1.33–1.46 → 1.08–1.51 ms (one round 2.06), at K = 8 0.39–0.60 → 0.39–0.43 ms;
    /// cycles/s unchanged (the cycle is then bound by its chain: the servers' round, then waking
    /// and polling the tasks; `docs/design.md`, "Callers and the loop").
    pub(super) fn held(&mut self, now: Instant) -> Option<Instant> {
        let mailbox = self.mailbox.as_ref()?;
        // The unclaimed count is looked at only when requests are queued.
        let unclaimed = match mailbox.queued() {
            0 => 0,
            _ => mailbox.unclaimed.load(Ordering::SeqCst),
        };
        if unclaimed == 0 {
            self.hold_since = None;
            return None;
        }
        if self.hold_spent == Some(unclaimed) {
            // A hold ran out and no outcome was taken (nor delivered) since: one never taken
            // (a future neither polled again nor dropped) would otherwise hold every batch
            // after it — a millisecond each, as `poll` rounds its timeout up.
            return None;
        }
        self.hold_spent = None;
        let until = *self.hold_since.get_or_insert(now) + HOLD;
        if now >= until {
            self.hold_since = None;
            self.hold_spent = Some(unclaimed);
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

    /// Runs the loop until `done` says so or `until` has passed. Each turn: take requests in,
    /// settle what is due, write (one `write` per node), wait for replies or the next deadline.
    pub fn drive_until(&mut self, until: Instant, done: impl FnMut(&Engine<N>) -> bool) {
        self.drive_until_woken(until, done, false);
    }

    /// [`Engine::drive_until`]; with `background`, woken also when the background thread
    /// would be ([`Engine::background_deadline`]: the kept releases' next try), for a `done`
    /// that waits on those (`shutdown`). Not for an operation's caller: that would add the
    /// look at every node's ledger to every turn of the hot path, and the background thread
    /// does it once the caller is done.
    pub(crate) fn drive_until_woken(
        &mut self,
        until: Instant,
        mut done: impl FnMut(&Engine<N>) -> bool,
        background: bool,
    ) {
        loop {
            let now = self.net.now();
            self.step(now);
            if done(self) || now >= until {
                return;
            }
            let next = match background {
                true => self.wake_at(now),
                false => self.next_deadline(),
            };
            let wake = next.map_or(until, |t| t.min(until));
            if wake > now {
                if self.sleep_turn(wake, true) == Slept::Wanted && !done(self) {
                    // A thread waits for the loop, and this driver does not give way to it
                    // (its own operation is not decided): it sleeps as usual, reading on.
                    self.sleep_turn(wake, false);
                }
            } else {
                self.drain(now);
            }
        }
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
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        [self.next_deadline(), self.background_deadline(now)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Waits in `poll` until `until` or a reply, unless a request is queued in the mailbox
    /// (and not [`Engine::held`]: then until the hold ends at the latest), or — with
    /// `heed_wanted` — a thread waits for the loop ([`Slept::Wanted`]: the caller decides).
    fn sleep_turn(&mut self, until: Instant, heed_wanted: bool) -> Slept {
        if let Some(mailbox) = self.mailbox.clone() {
            let held = self.held(self.net.now());
            let until = held.map_or(until, |h| h.min(until));
            if !mailbox.sleep_begin(held.is_some(), heed_wanted) {
                return match heed_wanted && mailbox.wanted.load(Ordering::SeqCst) > 0 {
                    true => Slept::Wanted,
                    false => Slept::Queued,
                };
            }
            let Engine { net, core, .. } = self;
            net.turn(until, &mut core.sink());
            mailbox.sleep_end();
        } else {
            let Engine { net, core, .. } = self;
            net.turn(until, &mut core.sink());
        }
        Slept::Waited
    }

    /// Connects to every node now and waits until each handshake is done, has failed, or
    /// `timeout` has passed; returns how many nodes are ready.
    pub fn connect(&mut self, timeout: Duration) -> usize {
        let now = self.net.now();
        let deadline = deadline_after(now, timeout);
        let n = self.shared.nodes.len();
        {
            let Engine { net, core, .. } = self;
            let mut sink = core.sink();
            net.connect_all(now, &mut sink);
            net.flush(now, &mut sink);
        }
        // Until every node is ready or down (a refused node does not hold the others up), in
        // whole turns of the loop: on a handle in use, its callers' operations and its kept
        // locks' renewals go on meanwhile (bare reads of the sockets held them for up to the
        // connect timeout, and a kept lock could be lost).
        self.drive_until(deadline, |e| {
            let sessions = (0..n).map(|i| e.net.session(i));
            sessions.clone().all(|s| s.is_ready()) || !sessions.clone().any(|s| s.is_connecting())
        });
        (0..n).filter(|&i| self.net.session(i).is_ready()).count()
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
            self.core.free_slot(id.index as usize);
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
        // As in `run`: what was queued before goes first (a semaphore's permits released
        // without waiting, then acquired again, were refused by their own releases; found by
        // review).
        self.take_inbox(now);
        let ids: Vec<OpId> = requests
            .into_iter()
            .map(|(kind, resource, token)| self.submit(kind, resource, &token, Waiter::Local, now))
            .collect();
        self.flush(now);
        self.drive(|e| ids.iter().all(|&id| e.is_done(id)));
        ids.into_iter().map(|id| self.take(id)).collect()
    }

    /// Drives until every release is confirmed or `deadline` passes. `closing`: the last
    /// handle is gone, and kept locks still here are released (their holders are gone too);
    /// otherwise (`Redlock::shutdown` on a handle in use) they stay kept: their holders work on
    /// and are told of a loss as always.
    pub fn shutdown(&mut self, deadline: Instant, closing: bool) -> Shutdown {
        let before = self.core.confirmed;
        let now = self.net.now();
        // What waits in the mailbox (a release handed over while the engine was busy, a lock
        // to keep) comes in first: held back for the requests of woken tasks (`held`), it is
        // neither in flight nor waited for, and a stop that looked only at those could return
        // with it unsent, the key left to its TTL. The stop waits for the
        // mailbox too.
        self.take_inbox(now);
        // On close, kept locks still here (their holders are gone): released like a dropped
        // `KeepAlive`. Not on a handle in use: that once ended every kept lock of holders
        // still at work, with no `on_lost` callback (`tests/keep.rs`).
        if closing {
            for kept in std::mem::take(&mut self.keeps.locks) {
                if kept.end_by_holder().releases() {
                    let (resource, token) = (kept.base().resource(), *kept.base().token());
                    self.submit(ReqKind::Release, resource, &token, Waiter::None, now);
                }
            }
            self.keeps.next = None;
        }
        // Woken for the kept releases' next try too: a release kept for a node in its
        // backoff waited for nothing else, and the stop slept to its deadline.
        let done = |e: &Engine<N>| {
            e.unconfirmed_live(e.net.now()) == 0
                && e.waiting() == 0
                && e.mailbox.as_ref().is_none_or(|m| m.queued() == 0)
        };
        self.drive_until_woken(deadline, done, true);
        Shutdown {
            confirmed: self.core.confirmed - before,
            unconfirmed: self.unconfirmed_live(self.net.now()) as u64,
        }
    }
}

/// What [`Engine::sleep_turn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slept {
    /// Waited in `poll` (until a deadline, a reply or a wake-up).
    Waited,
    /// Did not: requests are queued.
    Queued,
    /// Did not: a thread waits for the loop.
    Wanted,
}
