//! How callers hand requests to the thread that drives a shared engine: a reusable [`Slot`]
//! (request in, outcome out, the thread to unpark or the task to wake) and the [`Mailbox`] the
//! driver takes them from at every turn — with the [`Alarm`]s of async callers (a retry pause,
//! a validity deadline), which the engine's loop fires since the library has no timer of its
//! own.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::thread::Thread;
use std::time::Instant;

use crate::engine::foreign::wake;
use crate::engine::kept::Kept;

use crate::engine::request::{Outcome, ReqKind};
use crate::model::token::Token;

/// A request handed over through the [`Mailbox`]: kept in the caller's reusable [`Slot`].
#[derive(Debug)]
pub(crate) struct Request {
    pub kind: ReqKind,
    pub resource: Vec<u8>,
    pub token: Token,
    pub caller: Caller,
}

/// Whether the caller that queued a request waits for its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// It waits (parked, or an async task): the outcome goes into its slot.
    Waits,
    /// Nobody waits for the outcome (a release not waited for): the slot is free again as soon
    /// as the engine has taken the request in.
    Detached,
}

/// One caller's hand-over cell: reused for every operation of a thread (or, for async callers,
/// kept in a per-thread pool of free cells), so handing a request over allocates nothing.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The blocked thread to unpark; `None` for an async caller, woken through its waker.
    thread: Option<Thread>,
    pub done: AtomicBool,
    cell: Mutex<SlotCell>,
}

#[derive(Debug)]
pub(crate) struct SlotCell {
    pub request: Request,
    pub outcome: Option<Outcome>,
    /// The async caller's task, woken when the outcome is in.
    pub waker: Option<Waker>,
    /// The async caller dropped its future: nobody takes the outcome, and the engine cleans up
    /// after it (releases a lock won for nobody).
    pub cancelled: bool,
    /// The outcome was delivered with a wake and counted in [`Mailbox::unclaimed`]: its taker
    /// uncounts it ([`Mailbox::claimed`]).
    counted: bool,
}

impl SlotCell {
    /// Takes the outcome if it is in, with whether it was counted in [`Mailbox::unclaimed`]
    /// (then its taker calls [`Mailbox::claimed`]).
    pub fn take_outcome(&mut self) -> Option<(Outcome, bool)> {
        let outcome = self.outcome.take()?;
        Some((outcome, std::mem::take(&mut self.counted)))
    }
}

impl Slot {
    /// A slot for the calling thread, which parks while it waits.
    pub fn new() -> Slot {
        Slot::with_thread(Some(std::thread::current()))
    }

    /// A slot for async callers: they are woken through the waker they leave in it.
    pub fn for_tasks() -> Slot {
        Slot::with_thread(None)
    }

    fn with_thread(thread: Option<Thread>) -> Slot {
        Slot {
            thread,
            done: AtomicBool::new(false),
            cell: Mutex::new(SlotCell {
                request: Request {
                    kind: ReqKind::Release,
                    resource: Vec::new(),
                    token: Token::EMPTY,
                    caller: Caller::Waits,
                },
                outcome: None,
                waker: None,
                cancelled: false,
                counted: false,
            }),
        }
    }
    pub fn cell(&self) -> std::sync::MutexGuard<'_, SlotCell> {
        self.cell.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The engine took a detached request in: the caller may reuse the slot.
    pub fn taken_in(&self) {
        self.done.store(true, Ordering::Release);
    }

    /// Hands the outcome over and unparks (or wakes) the caller. A cancelled caller takes
    /// nothing: the outcome comes back, for the engine to clean up after.
    pub fn deliver(&self, outcome: Outcome, unclaimed: Option<&AtomicUsize>) -> Option<Outcome> {
        let mut cell = self.cell();
        if cell.cancelled {
            return Some(outcome);
        }
        cell.outcome = Some(outcome);
        let waker = cell.waker.take();
        if waker.is_some()
            && let Some(unclaimed) = unclaimed
        {
            unclaimed.fetch_add(1, Ordering::SeqCst);
            cell.counted = true;
        }
        self.done.store(true, Ordering::Release);
        drop(cell);
        if let Some(waker) = waker {
            wake(waker);
        } else if let Some(thread) = &self.thread {
            thread.unpark();
        }
        None
    }

    /// Its async caller dropped the future.
    pub fn is_cancelled(&self) -> bool {
        self.cell().cancelled
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
    /// Puts a new request in, with the waker of an async caller (the previous operation is
    /// over: its outcome was taken, or, for a detached one, the engine took the request in).
    pub fn fill(
        &self,
        kind: ReqKind,
        resource: &[u8],
        token: &Token,
        caller: Caller,
        waker: Option<Waker>,
    ) {
        let mut cell = self.cell();
        cell.request.kind = kind;
        cell.request.resource.clear();
        cell.request.resource.extend_from_slice(resource);
        cell.request.token = *token;
        cell.request.caller = caller;
        cell.outcome = None;
        cell.waker = waker;
        cell.cancelled = false;
        cell.counted = false;
        drop(cell);
        self.done.store(false, Ordering::Relaxed);
    }
}

/// The inbox starts this large: more requests than one turn usually takes in, so that queuing
/// does not allocate.
/// How the mailbox wakes a driver that waits for input: whatever interrupts its wait (the
/// runtime gives a `mio::Waker`'s wake). Called only when the driver sleeps or is about to.
pub(crate) type PollWaker = Box<dyn Fn() + Send + Sync>;

const INBOX_CAPACITY: usize = 64;

/// [`Mailbox::sleeping`]: the driver is not asleep.
const AWAKE: u8 = 0;
/// The driver sleeps until its own next deadline.
const ASLEEP: u8 = 1;
/// The driver sleeps no longer than a hold of queued requests.
const HOLDING: u8 = 2;

/// Requests queued by callers while another thread drives the engine.
pub(crate) struct Mailbox {
    inbox: Mutex<Vec<Arc<Slot>>>,
    /// Locks to keep, handed over by `Redlock::keep`.
    keeps: Mutex<Vec<Arc<Kept>>>,
    /// Alarms of async callers, for the engine's timers.
    alarms: Mutex<Vec<(Instant, Arc<Alarm>)>>,
    /// Requests in `inbox`; read without the lock by the driver before it sleeps.
    queued: AtomicUsize,
    /// Whether the driver is about to sleep (or sleeps) in `epoll_wait`, and how: [`AWAKE`],
    /// [`ASLEEP`] (until its own next deadline: a new request must wake it) or [`HOLDING`]
    /// (no longer than a hold: an async caller's request may wait for it).
    sleeping: AtomicU8,
    /// Wakes the driver out of its wait for input (the runtime's `mio::Waker`).
    waker: PollWaker,
    /// `Waker::wake` calls (for the counts of the benchmark).
    pub wakes: AtomicUsize,
    /// Threads waiting for the loop itself ([`Mailbox::want`]).
    pub wanted: AtomicUsize,
    /// Outcomes delivered to async callers (their tasks woken) and not taken yet: each such
    /// task is likely to queue its next request within microseconds.
    pub unclaimed: AtomicUsize,
}

impl Mailbox {
    pub fn new(waker: PollWaker) -> Mailbox {
        Mailbox {
            inbox: Mutex::new(Vec::with_capacity(INBOX_CAPACITY)),
            keeps: Mutex::new(Vec::new()),
            alarms: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            sleeping: AtomicU8::new(AWAKE),
            waker,
            wakes: AtomicUsize::new(0),
            wanted: AtomicUsize::new(0),
            unclaimed: AtomicUsize::new(0),
        }
    }

    /// Queues a request; wakes the driver if it sleeps in `poll`. Returns how many items were
    /// queued before it (not yet taken in by a driver).
    pub fn push(&self, slot: Arc<Slot>) -> usize {
        let before = self.enqueue(&self.inbox, slot);
        self.wake_if_asleep();
        before
    }

    /// Queues an async caller's request: like [`Mailbox::push`], but while other woken tasks
    /// have not taken their outcomes yet it leaves the sleeping driver asleep (it sleeps a
    /// bounded time while requests are queued): their requests come next, and go out with this
    /// one. The last of them to take its outcome wakes it ([`Mailbox::claimed`]).
    pub fn push_held(&self, slot: Arc<Slot>) -> usize {
        let before = self.enqueue(&self.inbox, slot);
        self.wake_unless_holding();
        before
    }

    /// Wakes the driver unless it sleeps holding queued requests back while woken tasks have
    /// not taken their outcomes (it wakes within the hold, or at the last one's
    /// [`Mailbox::claimed`]). A driver asleep until its own deadline is woken whatever
    /// `unclaimed` says: an outcome that is never taken (a future polled once, then kept
    /// unpolled) left an async caller's request unsent until then.
    fn wake_unless_holding(&self) {
        if self.unclaimed.load(Ordering::SeqCst) == 0
            || self.sleeping.load(Ordering::SeqCst) != HOLDING
        {
            self.wake_if_asleep();
        }
    }

    /// Queues several requests at once (the permits of a semaphore): a driver takes them in
    /// the same turn, so every node gets them in one write. `held` as [`Mailbox::push_held`]
    /// (an async caller's), else as [`Mailbox::push`]. Returns how many items were queued
    /// before them.
    pub fn push_many(&self, slots: &[Arc<Slot>], held: bool) -> usize {
        let mut list = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        list.extend(slots.iter().cloned());
        let before = self.queued.fetch_add(slots.len(), Ordering::SeqCst);
        drop(list);
        if held {
            self.wake_unless_holding();
        } else {
            self.wake_if_asleep();
        }
        before
    }

    /// An async caller took an outcome counted in `unclaimed`: if it was the last and requests
    /// are queued, the driver must not sleep on them (pairs with [`Mailbox::push_held`]: it
    /// stores `queued` then loads `unclaimed`, this stores `unclaimed` then loads `queued`).
    pub fn claimed(&self) {
        if self.unclaimed.fetch_sub(1, Ordering::SeqCst) == 1 && self.queued() > 0 {
            self.wake_if_asleep();
        }
    }

    /// Appends `item` to one of the queues and counts it in `queued` (so the driver looks);
    /// returns the count before it. The caller wakes the driver.
    fn enqueue<T>(&self, queue: &Mutex<Vec<T>>, item: T) -> usize {
        let mut list = queue.lock().unwrap_or_else(|e| e.into_inner());
        list.push(item);
        let before = self.queued.fetch_add(1, Ordering::SeqCst);
        drop(list);
        before
    }

    /// Moves everything in `queue` to the end of `into` and uncounts it; true if there was any.
    fn drain<T>(&self, queue: &Mutex<Vec<T>>, into: &mut Vec<T>) -> bool {
        let mut list = queue.lock().unwrap_or_else(|e| e.into_inner());
        if list.is_empty() {
            return false;
        }
        self.queued.fetch_sub(list.len(), Ordering::SeqCst);
        into.append(&mut list);
        true
    }

    /// After queuing: pairs with the driver's store-then-load in [`Mailbox::sleep_begin`]:
    /// either it sees what was queued, or this sees it asleep and wakes it.
    fn wake_if_asleep(&self) {
        if self.sleeping.swap(AWAKE, Ordering::SeqCst) != AWAKE {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            (self.waker)();
        }
    }

    /// A thread waits for the loop itself (`Hub::engine`): the driver lets go at its next turn,
    /// woken if it sleeps in `poll` (the same store-then-load pairing as a request's).
    pub fn want(&self) {
        self.wanted.fetch_add(1, Ordering::SeqCst);
        self.wake_if_asleep();
    }

    /// Queues a lock to keep; wakes the driver if it sleeps in `poll`.
    pub fn push_keep(&self, kept: Arc<Kept>) {
        self.enqueue(&self.keeps, kept);
        self.wake_if_asleep();
    }

    /// Queues an alarm; wakes the driver if it sleeps in `poll`.
    pub fn push_alarm(&self, at: Instant, alarm: Arc<Alarm>) {
        self.enqueue(&self.alarms, (at, alarm));
        self.wake_if_asleep();
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// The driver takes everything queued: requests swapped into `requests` (an empty list
    /// whose capacity is reused), alarms appended to `alarms`, locks to keep appended to
    /// `keeps`; true if there were locks to keep.
    pub fn take(
        &self,
        requests: &mut Vec<Arc<Slot>>,
        alarms: &mut Vec<(Instant, Arc<Alarm>)>,
        keeps: &mut Vec<Arc<Kept>>,
    ) -> bool {
        {
            let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *inbox, requests);
            self.queued.fetch_sub(requests.len(), Ordering::SeqCst);
        }
        self.drain(&self.alarms, alarms);
        self.drain(&self.keeps, keeps)
    }

    /// The driver is about to sleep in `poll`: false (and no sleep) if something is queued —
    /// unless it `hold`s queued requests back while woken tasks have not taken their outcomes
    /// (then it sleeps no longer than the hold). Pairs with the store-then-load in
    /// [`Mailbox::push`]: either the driver sees the request, or the caller sees it asleep and
    /// wakes it (and likewise with [`Mailbox::claimed`] for `unclaimed`).
    ///
    /// With `heed_wanted`, not if a thread waits for the loop ([`Mailbox::want`]) either: a
    /// driver that gives way to it returns instead. One that does not (its own operation is
    /// not decided) sleeps as usual; it spun in zero-timeout polls until its operation ended.
    pub fn sleep_begin(&self, hold: bool, heed_wanted: bool) -> bool {
        self.sleeping.store(ASLEEP, Ordering::SeqCst);
        let queued = self.queued() > 0;
        let holding = queued && hold && self.unclaimed.load(Ordering::SeqCst) > 0;
        if (queued && !holding) || (heed_wanted && self.wanted.load(Ordering::SeqCst) > 0) {
            self.sleeping.store(AWAKE, Ordering::SeqCst);
            return false;
        }
        if holding {
            // A caller that saw `ASLEEP` meanwhile woke it: a turn early, no more.
            let _ =
                self.sleeping
                    .compare_exchange(ASLEEP, HOLDING, Ordering::SeqCst, Ordering::SeqCst);
        }
        true
    }

    /// The driver is back from `poll`.
    pub fn sleep_end(&self) {
        self.sleeping.store(AWAKE, Ordering::SeqCst);
    }
}

/// A point in time an async caller waits for (a retry pause, a validity deadline): fired by
/// whoever drives the engine when it has passed. The waker is replaced at every poll, so a
/// task that moved between threads (or a combinator with wakers of its own) is still woken.
#[derive(Debug, Default)]
pub(crate) struct Alarm {
    cell: Mutex<(bool, Option<Waker>)>,
    /// Its future was dropped: the engine forgets it at its next turn.
    cancelled: AtomicBool,
}

impl Alarm {
    /// Its future was dropped: its waker goes now, the alarm at the engine's next turn (a
    /// `select!` loop that made a new `wait_lost` at every pass left one alarm each, waker
    /// and all, until its time: up to a TTL).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let waker = self.cell.lock().unwrap_or_else(|e| e.into_inner()).1.take();
        drop(waker);
    }

    /// See [`Alarm::cancel`].
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// True once fired; otherwise leaves `waker` to be woken.
    pub fn poll(&self, waker: &Waker) -> bool {
        let mut cell = self.cell.lock().unwrap_or_else(|e| e.into_inner());
        if cell.0 {
            return true;
        }
        match &cell.1 {
            Some(w) if w.will_wake(waker) => {}
            _ => cell.1 = Some(waker.clone()),
        }
        false
    }

    /// Its time has come.
    pub fn fire(&self) {
        let mut cell = self.cell.lock().unwrap_or_else(|e| e.into_inner());
        cell.0 = true;
        let waker = cell.1.take();
        drop(cell);
        if let Some(waker) = waker {
            wake(waker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn async_slot() -> (Slot, Arc<Flag>) {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let slot = Slot::for_tasks();
        let waker = Waker::from(flag.clone());
        slot.fill(
            ReqKind::Release,
            b"r",
            &Token::EMPTY,
            Caller::Waits,
            Some(waker),
        );
        (slot, flag)
    }

    #[test]
    fn an_outcome_delivered_with_a_wake_is_counted_until_taken() {
        let unclaimed = AtomicUsize::new(0);
        let (slot, flag) = async_slot();
        assert!(
            slot.deliver(Outcome::Released(3), Some(&unclaimed))
                .is_none()
        );
        assert!(flag.0.load(Ordering::SeqCst));
        assert_eq!(unclaimed.load(Ordering::SeqCst), 1);
        let mut cell = slot.cell();
        // The taker learns to uncount it (`Mailbox::claimed`), once.
        assert!(matches!(
            cell.take_outcome(),
            Some((Outcome::Released(3), true))
        ));
        assert!(!cell.counted);
    }

    #[test]
    fn a_cancelled_or_threaded_caller_is_not_counted() {
        let unclaimed = AtomicUsize::new(0);
        let (slot, _) = async_slot();
        slot.cell().cancelled = true;
        assert!(
            slot.deliver(Outcome::Released(3), Some(&unclaimed))
                .is_some()
        );
        // A blocked thread is unparked, not woken: nothing to wait for.
        let parked = Slot::new();
        parked.fill(ReqKind::Release, b"r", &Token::EMPTY, Caller::Waits, None);
        assert!(
            parked
                .deliver(Outcome::Released(3), Some(&unclaimed))
                .is_none()
        );
        assert!(!parked.cell().counted);
        assert_eq!(unclaimed.load(Ordering::SeqCst), 0);
        // Refilled, a slot starts uncounted.
        let (slot, _) = async_slot();
        assert!(
            slot.deliver(Outcome::Released(3), Some(&unclaimed))
                .is_none()
        );
        slot.fill(ReqKind::Release, b"r", &Token::EMPTY, Caller::Waits, None);
        assert!(!slot.cell().counted);
    }
}
