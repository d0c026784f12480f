//! The async API's plumbing: the future of one engine operation ([`Call`]) and of one point in
//! time ([`Sleep`]), both woken by the engine's loop through `std::task::Waker` — no runtime.
//!
//! A [`Call`] fills a [`Slot`] with its request and its waker and hands it to the hub
//! ([`Hub::hand_over`]): one turn of the loop that waits for nothing if the loop is free and
//! no other operation of the handle is under way (the request goes out in one write per node),
//! the mailbox and the background thread's next turn otherwise. The outcome comes back in the
//! slot, and the waker is woken by whoever drives the loop (the background thread, or a blocking
//! caller). Nothing here ever waits: an executor's worker thread pays a few non-blocking
//! syscalls at most.
//!
//! Dropping a [`Call`] before its outcome was taken cancels it: the slot is marked, and
//! whichever comes second — the engine with the outcome, or the drop — cleans up. An acquire
//! won for nobody is released on every node (late replies included; a node that is down gets
//! the release when it is back, from the engine's ledger); anything else is dropped.
//!
//! Async slots are reused through a small per-thread pool (a task may finish on another thread
//! than it started on; the pool is only a cache), so the hot path does not allocate once warm.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::engine::mailbox::{Alarm, Caller, Slot};
use crate::engine::request::{Outcome, ReqKind};
use crate::model::token::Token;
use crate::runtime::hub::Hub;

/// Free async slots kept per thread.
const POOL: usize = 64;

thread_local! {
    static FREE: RefCell<Vec<Arc<Slot>>> = const { RefCell::new(Vec::new()) };
}

fn take_slot() -> Arc<Slot> {
    FREE.try_with(|free| free.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Arc::new(Slot::for_tasks()))
}

/// Back to the pool if nobody else holds it (the engine may still, for a moment after it
/// delivered; then the slot is simply dropped when the engine lets go).
fn give_back(slot: Arc<Slot>) {
    if Arc::strong_count(&slot) == 1 {
        let _ = FREE.try_with(|free| {
            let mut free = free.borrow_mut();
            if free.len() < POOL {
                free.push(slot);
            }
        });
    }
}

/// One operation of the engine, as a future.
pub(crate) struct Call<'a> {
    hub: &'a Hub,
    kind: ReqKind,
    resource: &'a [u8],
    token: Token,
    /// Submitted and not finished: the slot the outcome comes back in.
    slot: Option<Arc<Slot>>,
    finished: bool,
}

impl<'a> Call<'a> {
    pub fn new(hub: &'a Hub, kind: ReqKind, resource: &'a [u8], token: Token) -> Call<'a> {
        Call {
            hub,
            kind,
            resource,
            token,
            slot: None,
            finished: false,
        }
    }
}

impl Future for Call<'_> {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let this = &mut *self;
        assert!(
            !this.finished,
            "a redlock-mux future polled after it completed"
        );
        if this.slot.is_none() {
            if this.hub.reentered() {
                // From a `with_client` closure of this handle (through `block_on`, say): the
                // engine is this thread's until the closure returns, so the request would wait
                // for itself, and every other caller of the handle with it.
                this.finished = true;
                return Poll::Ready(this.refused());
            }
            let slot = take_slot();
            let waker = Some(cx.waker().clone());
            slot.fill(this.kind, this.resource, &this.token, Caller::Waits, waker);
            this.slot = Some(slot.clone());
            // Counted until the outcome is taken (or the future dropped): a task woken by its
            // outcome is still counted when it has not been polled yet, so others queuing
            // meanwhile leave their requests to the background thread's next turn. A waiting
            // acquire is not counted: it may wait for seconds, and says nothing of requests
            // about to come.
            let others = if this.counted() {
                this.hub.active.fetch_add(1, Ordering::SeqCst)
            } else {
                this.hub.active.load(Ordering::SeqCst)
            };
            this.hub.hand_over(slot, others == 0);
        }
        this.poll_slot(cx)
    }
}

impl<'a> Call<'a> {
    /// Hands several calls of one hub to the engine together, each waking `waker` when its
    /// outcome is in: they are taken in in the same turn of the loop, so every node gets their
    /// requests in one write (the permits of a semaphore). Each is then polled as usual, and
    /// dropping one cancels it as usual. Calls already handed over are left alone.
    pub fn submit_together(calls: &mut [Call<'a>], waker: &Waker) {
        let Some(hub) = calls.first().map(|c| c.hub) else {
            return;
        };
        if hub.reentered() {
            // Each is refused at its first poll (`Call::poll`).
            return;
        }
        let mut slots = Vec::with_capacity(calls.len());
        let mut counted = 0;
        for call in calls.iter_mut().filter(|c| c.slot.is_none() && !c.finished) {
            debug_assert!(std::ptr::eq(call.hub, hub), "calls of one hub");
            let slot = take_slot();
            let waker = Some(waker.clone());
            slot.fill(call.kind, call.resource, &call.token, Caller::Waits, waker);
            call.slot = Some(slot.clone());
            counted += usize::from(call.counted());
            slots.push(slot);
        }
        if slots.is_empty() {
            return;
        }
        // As in `poll`: counted until each outcome is taken.
        let others = hub.active.fetch_add(counted, Ordering::SeqCst);
        hub.hand_over_many(&slots, others == 0);
    }
}

impl Call<'_> {
    /// The outcome of a call refused with [`Error::Reentrant`](crate::Error::Reentrant), as
    /// its kind gives it: a release is queued (it goes out once the closure returns, as the
    /// blocking face's), a status read hears no node.
    fn refused(&self) -> Outcome {
        let error = crate::Error::Reentrant;
        match self.kind {
            ReqKind::Acquire { .. } => Outcome::Acquired(Err(error)),
            ReqKind::Wait { .. } => Outcome::Locked(Err(error)),
            ReqKind::Extend { valid_until, .. } => Outcome::Extended(valid_until, Err(error)),
            ReqKind::Release => {
                self.hub.send(ReqKind::Release, self.resource, &self.token);
                Outcome::Released(0)
            }
            ReqKind::Status { .. } => Outcome::Status(Vec::new()),
            ReqKind::Repair { .. } => Outcome::Repaired(Err(error)),
        }
    }

    /// Counted in [`Hub::active`] while submitted and not finished.
    fn counted(&self) -> bool {
        !matches!(self.kind, ReqKind::Wait { .. })
    }

    /// Its outcome taken, or the future dropped: out of [`Hub::active`], and out of the
    /// mailbox's `unclaimed` if the outcome was delivered with a wake.
    fn uncount(&self, unclaimed: bool) {
        if self.counted() {
            self.hub.active.fetch_sub(1, Ordering::SeqCst);
        }
        if unclaimed {
            self.hub.mailbox.claimed();
        }
    }

    fn poll_slot(&mut self, cx: &mut Context<'_>) -> Poll<Outcome> {
        let slot = self.slot.as_ref().expect("submitted");
        let mut cell = slot.cell();
        if let Some((outcome, unclaimed)) = cell.take_outcome() {
            drop(cell);
            self.uncount(unclaimed);
            self.finished = true;
            if let Some(slot) = self.slot.take() {
                give_back(slot);
            }
            return Poll::Ready(outcome);
        }
        match &cell.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => cell.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            // Never submitted, or finished.
            return;
        };
        let mut cell = slot.cell();
        let Some((outcome, unclaimed)) = cell.take_outcome() else {
            // In flight: the engine cleans up when it decides (a lock won for nobody is
            // released); a request not taken in yet is skipped.
            cell.cancelled = true;
            cell.waker = None;
            drop(cell);
            self.uncount(false);
            return;
        };
        drop(cell);
        self.uncount(unclaimed);
        // Decided, but the caller went away before it looked: a lock is released at once.
        match outcome {
            Outcome::Acquired(Ok(_)) => self.hub.send(ReqKind::Release, self.resource, &self.token),
            Outcome::Locked(Ok((variant, _))) => self.hub.send(
                ReqKind::Release,
                self.resource,
                &self.token.variant(variant),
            ),
            _ => {}
        }
        give_back(slot);
    }
}

/// Waits until an instant: an alarm the engine's loop fires.
pub(crate) struct Sleep<'a> {
    hub: &'a Hub,
    at: Instant,
    alarm: Option<Arc<Alarm>>,
}

impl<'a> Sleep<'a> {
    pub fn until(hub: &'a Hub, at: Instant) -> Sleep<'a> {
        Sleep {
            hub,
            at,
            alarm: None,
        }
    }

    /// The instant it waits for.
    pub fn at(&self) -> Instant {
        self.at
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        if let Some(alarm) = &self.alarm {
            alarm.cancel();
        }
    }
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        match &self.alarm {
            Some(alarm) => {
                if alarm.poll(cx.waker()) {
                    return Poll::Ready(());
                }
            }
            None => {
                let alarm = Arc::new(Alarm::default());
                alarm.poll(cx.waker());
                self.hub.alarm(self.at, alarm.clone());
                self.alarm = Some(alarm);
            }
        }
        Poll::Pending
    }
}
