//! One engine shared by every thread that uses a [`Redlock`](crate::Redlock) handle.
//!
//! The engine (a [`Client`]: one connection per node, one `mio` loop) sits behind a mutex. The
//! mutex is the right to drive the loop, not a lock around each operation:
//!
//! - A caller that finds it free drives the loop itself until its own operation is decided —
//!   no thread hop, the lone caller's path is the same as a [`Client`]'s. While it drives, it
//!   also takes in and serves what other callers queue meanwhile.
//! - A caller that finds it taken queues its request in the [`Mailbox`] (a mutex-guarded
//!   `Vec` of reusable per-thread [`Slot`]s, no allocation), wakes the driver through a
//!   `mio::Waker` only if it sleeps in `epoll_wait`, and parks until its outcome is in its slot.
//! - A driver whose own operation is done hands the loop to the background thread if anybody
//!   still waits ([`Hub::leave`]); the background thread drives until nobody waits.
//! - The background thread also wakes for the engine's timers while nobody drives: kept locks
//!   due for renewal, unconfirmed releases to retry, connection deadlines. It plans its sleep
//!   from the timers it saw when it last drove; a caller that leaves publishes the kept locks'
//!   timer (which its turns may have moved) and wakes it if the timer is earlier than its plan.
//!
//! So at high concurrency one thread (usually the background one) runs the loop, and every
//! request queued during a turn goes out in one write per node; at low concurrency nobody pays a
//! hop. Lost wake-ups are excluded by two store-then-load pairs (`SeqCst`): a caller queues then
//! tries the mutex, a leaving driver unlocks then looks at the queue; and a caller queues then
//! looks at the driver's `sleeping` flag, a driver sets it then looks at the queue.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::engine::kept::{Callbacks, Kept};
use crate::engine::mailbox::{Alarm, Caller, Mailbox, Slot};
use crate::engine::request::{Outcome, ReqKind};
use crate::engine::{Shutdown, Waiter};
use crate::model::error::Error;
use crate::model::token::Token;
use crate::runtime::client::Client;

/// A parked caller re-checks its slot at least this seldom (it is unparked when its outcome is
/// in; the re-check only bounds a lost wake-up): more often would only burn CPU.
const MIN_RECHECK: Duration = Duration::from_millis(10);

/// Looks in a row the background thread takes at a loop a caller holds before it waits for the
/// caller to let go: some microseconds, about a task's turn.
const SPIN_LOOKS: u32 = 200;

pub(crate) struct Hub {
    engine: Mutex<Client>,
    pub mailbox: Arc<Mailbox>,
    /// The callback thread of this handle's kept locks.
    pub callbacks: Arc<Callbacks>,
    background: OnceLock<Thread>,
    /// Work for the background thread.
    notified: AtomicBool,
    /// The last handle is gone.
    closed: AtomicBool,
    /// Instants below, as nanoseconds since this.
    epoch: Instant,
    /// The kept locks' next timer, as the last driver to leave saw it (`u64::MAX`: none).
    timer: AtomicU64,
    /// Until when the background thread sleeps (0 while it is awake): a driver that leaves a
    /// timer earlier than this wakes it.
    planned: AtomicU64,
    /// Async operations handed over whose outcome their future has not taken yet (nor dropped),
    /// waiting acquires aside: while there are any, a new one is left to the background thread
    /// (see [`Hub::hand_over`]).
    pub active: AtomicUsize,
    /// Times the background thread, woken for work, found the loop driven by a caller.
    pub found_taken: AtomicU64,
    /// `with_client` closures of this hub running now, on any thread: while there are none,
    /// [`Hub::reentered`] answers with one relaxed load (the async face asks at every call).
    in_with_client: AtomicUsize,
    /// A parked caller re-checks after this long (a bound, not the mechanism: it is unparked
    /// when its outcome is in).
    recheck: Duration,
}

thread_local! {
    /// The hubs whose engines this thread holds for [`Redlock::with_client`]'s closures (their
    /// addresses, outermost first): a call into any of them from the innermost closure could
    /// only wait for itself. All of them, not the innermost alone: `a.with_client(|_|
    /// b.with_client(|_| a.try_lock(..)))` queued into `a`'s mailbox and parked for ever, and
    /// every other caller of `a` with it. Pushed by `with_client`; looked at
    /// only while a `with_client` closure of the hub asked about runs somewhere
    /// ([`Hub::reentered`]'s count first).
    ///
    /// [`Redlock::with_client`]: crate::Redlock::with_client
    static WITH_CLIENT: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    static SLOT: Arc<Slot> = Arc::new(Slot::new());
    /// For releases not waited for: free again once the engine took the request in.
    static DETACHED: Arc<Slot> = {
        let slot = Slot::new();
        slot.done.store(true, Ordering::Relaxed);
        Arc::new(slot)
    };
}

impl Hub {
    /// The hub and its background thread.
    pub fn start(mut client: Client) -> Result<Arc<Hub>, Error> {
        let waker = (client.engine().net.waker())
            .map_err(|e| Error::system("create the event loop's waker", e))?;
        let mailbox = Arc::new(Mailbox::new(Box::new(move || {
            // A failed wake (the poll gone) leaves nothing to wake.
            let _ = waker.wake();
        })));
        client.engine().attach(mailbox.clone());
        let callbacks = client.engine().callbacks.clone();
        let recheck = client
            .config()
            .node_timeout_for(client.config().ttl)
            .max(MIN_RECHECK);
        let hub = Arc::new(Hub {
            engine: Mutex::new(client),
            mailbox,
            callbacks,
            background: OnceLock::new(),
            notified: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            epoch: Instant::now(),
            timer: AtomicU64::new(u64::MAX),
            planned: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            found_taken: AtomicU64::new(0),
            in_with_client: AtomicUsize::new(0),
            recheck,
        });
        let runner = hub.clone();
        let thread = std::thread::Builder::new()
            .name("redlock-engine".into())
            .spawn(move || runner.background())
            .map_err(|e| Error::system("start the engine thread", e))?;
        let _ = hub.background.set(thread.thread().clone());
        Ok(hub)
    }

    /// True on a thread that runs `with_client`'s closure of this hub, or a closure nested in
    /// one. The blocking face looks only where the engine was found taken; the async face at
    /// every call's first poll (`task::Call`), where the count of closures running answers
    /// without the thread-local while there are none. Relaxed is enough: a thread that runs
    /// such a closure counted it itself, before.
    pub(crate) fn reentered(&self) -> bool {
        if self.in_with_client.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let me = self as *const Hub as usize;
        (WITH_CLIENT.try_with(|held| held.borrow().contains(&me))).unwrap_or(false)
    }

    /// Runs `f` with the engine, this thread marked as holding it: calls into this hub from
    /// `f` fail with [`Error::Reentrant`] instead of waiting for themselves
    /// (a `try_lock` from `with_client`'s closure hung that caller and every other of the
    /// handle). Fails so at once when this thread already holds it.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client) -> R) -> Result<R, Error> {
        if self.reentered() {
            return Err(Error::Reentrant);
        }
        /// Takes this hub's mark off again, also when `f` panics: the last on the list, as
        /// the closures nest (`false`: never put on, the thread's list being gone).
        struct Mark<'h>(&'h Hub, bool);
        impl Drop for Mark<'_> {
            fn drop(&mut self) {
                if self.1 {
                    let _ = WITH_CLIENT.try_with(|held| held.borrow_mut().pop());
                }
                self.0.in_with_client.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let mut guard = self.engine();
        let me = self as *const Hub as usize;
        self.in_with_client.fetch_add(1, Ordering::Relaxed);
        let _mark = Mark(
            self,
            WITH_CLIENT
                .try_with(|held| held.borrow_mut().push(me))
                .is_ok(),
        );
        let result = f(&mut guard);
        drop(_mark);
        self.leave(guard);
        Ok(result)
    }

    fn try_engine(&self) -> Option<MutexGuard<'_, Client>> {
        match self.engine.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The engine, waiting for the driver to let go of it (not on the hot path): the driver
    /// does at its next turn, woken if it sleeps in `poll`.
    pub fn engine(&self) -> MutexGuard<'_, Client> {
        if let Some(guard) = self.try_engine() {
            return guard;
        }
        self.mailbox.want();
        let guard = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        self.mailbox.wanted.fetch_sub(1, Ordering::SeqCst);
        // The driver that let go comes back.
        self.notify();
        guard
    }

    fn wanted(&self) -> bool {
        self.mailbox.wanted.load(Ordering::SeqCst) > 0
    }

    /// Lets a thread blocked in [`Hub::engine`] have the loop: parked until it has it (its
    /// `notify` unparks this thread), a millisecond at a time — not spinning, which burnt a
    /// core for as long as a fast-path caller held the loop ahead of it.
    fn yield_to_wanted(&self) {
        while self.wanted() {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }

    /// Lets go of the engine; wakes the background thread if anybody still waits.
    pub fn leave(&self, mut guard: MutexGuard<'_, Client>) {
        let engine = guard.engine();
        // Deadlines of lingering requests are found by the background thread's own periodic
        // look; waiting callers and ledger retries need it now.
        let more = engine.waiting() > 0 || engine.has_ledger();
        // The kept locks' timer, which may have moved in this driver's turns (a lock taken in,
        // an extend decided): the background thread may be asleep until later than that.
        let timer = engine.timer().map_or(u64::MAX, |t| self.ns(t));
        drop(guard);
        // Stored only when it moved: no write to a shared cache line on every operation.
        if self.timer.load(Ordering::Relaxed) != timer {
            self.timer.store(timer, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        if more || self.mailbox.queued() > 0 || timer < self.planned.load(Ordering::SeqCst) {
            self.notify();
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    fn instant(&self, ns: u64) -> Option<Instant> {
        (ns != u64::MAX).then(|| self.epoch + Duration::from_nanos(ns))
    }

    fn notify(&self) {
        self.notified.store(true, Ordering::SeqCst);
        if let Some(t) = self.background.get() {
            t.unpark();
        }
    }

    /// Hands a lock to keep to the engine; the background thread (or whoever drives) takes it
    /// in and runs its timer.
    pub fn keep(&self, kept: Arc<Kept>) {
        self.mailbox.push_keep(kept);
        fence(Ordering::SeqCst);
        self.notify();
    }

    /// Runs one operation: on this thread if the engine is free, else through the mailbox.
    /// [`Error::Reentrant`] from `with_client`'s closure.
    pub fn call(&self, kind: ReqKind, resource: &[u8], token: &Token) -> Result<Outcome, Error> {
        // The thread's slot. The engine may still hold a reference from this thread's previous
        // operation for a moment after handing its outcome over; it never touches the slot
        // again (the waiter was taken out at completion), so reusing it is safe.
        let slot = || {
            SLOT.try_with(|s| s.clone())
                .unwrap_or_else(|_| Arc::new(Slot::new()))
        };
        if let Some(mut guard) = self.try_engine() {
            if let ReqKind::Wait { .. } = kind {
                // Driven here until it has to wait; then parked like a queued caller, so that
                // a long wait does not keep the loop on this thread.
                let slot = match guard.engine().run_until_waiting(kind, resource, token) {
                    Ok(outcome) => {
                        self.leave(guard);
                        return Ok(outcome);
                    }
                    Err(id) => {
                        let slot = slot();
                        slot.fill(kind, resource, token, Caller::Waits, None);
                        guard.engine().adopt(id, slot.clone());
                        self.leave(guard);
                        slot
                    }
                };
                return Ok(self.park(&slot));
            }
            let outcome = guard.engine().run(kind, resource, token);
            self.leave(guard);
            return Ok(outcome);
        }
        if self.reentered() {
            return Err(Error::Reentrant);
        }
        let slot = slot();
        slot.fill(kind, resource, token, Caller::Waits, None);
        self.mailbox.push(slot.clone());
        fence(Ordering::SeqCst);
        Ok(self.park(&slot))
    }

    /// Runs several operations side by side (the permits of a semaphore): on this thread if
    /// the engine is free (`Engine::run_all`), else through the mailbox, queued together. Either
    /// way every node gets all their requests in one write. An outcome is `None` only if it was
    /// lost (a bug).
    pub fn call_many(
        &self,
        requests: &[(ReqKind, &[u8], Token)],
    ) -> Result<Vec<Option<Outcome>>, Error> {
        if let Some(mut guard) = self.try_engine() {
            let outcomes = guard.engine().run_all(requests.iter().copied());
            self.leave(guard);
            return Ok(outcomes);
        }
        if self.reentered() {
            return Err(Error::Reentrant);
        }
        // Rare enough (the loop is busy) that a slot per request may allocate.
        let slots: Vec<Arc<Slot>> = requests
            .iter()
            .map(|&(kind, resource, token)| {
                let slot = Arc::new(Slot::new());
                slot.fill(kind, resource, &token, Caller::Waits, None);
                slot
            })
            .collect();
        self.mailbox.push_many(&slots, false);
        fence(Ordering::SeqCst);
        Ok(slots.iter().map(|slot| Some(self.park(slot))).collect())
    }

    /// Waits for the outcome in `slot`, driving the loop whenever it is free.
    fn park(&self, slot: &Slot) -> Outcome {
        loop {
            // The outcome is written before `done` is set, under the slot's mutex.
            if slot.is_done()
                && let Some(outcome) = slot.cell().outcome.take()
            {
                return outcome;
            }
            if !self.wanted()
                && let Some(mut guard) = self.try_engine()
            {
                guard.engine().drive(|_| slot.is_done() || self.wanted());
                self.leave(guard);
                continue;
            }
            std::thread::park_timeout(self.recheck);
        }
    }

    /// Hands a filled slot over without ever waiting (an async caller's operation, with its
    /// waker in the slot; a release nobody waits for): the request is queued. If its caller is
    /// `alone` (no other async operation of this handle is under way, waiting acquires aside),
    /// nothing else is queued and nobody drives the loop, this thread takes it for one turn
    /// that waits for nothing (the request goes out in one write per node) and leaves the rest
    /// to the background thread. Otherwise whoever drives takes it in (pairs with `leave`).
    ///
    /// Behind requests queued by others, it does not try the loop: whoever queued the first of
    /// them tries it (or a driver that leaves finds them queued and wakes the background
    /// thread), so nothing waits for a turn nobody runs. Measured: with 256 tasks on a 2-worker
    /// tokio runtime, a worker that took the loop whenever it was free sometimes submitted
    /// everybody's queued requests in one poll (longest poll 1.1 ms, p99.9 28 µs); the
    /// background thread does that work now, off the executor's threads.
    ///
    /// Not alone, it wakes the background thread rather than take the loop even when it is
    /// free: other tasks are about to queue theirs (their outcomes were just delivered), and
    /// the background thread's next turn writes them all at once, where each worker's own turn
    /// would write one request per node. Measured with the change to `Conn::on_ready` (writes
    /// only what waits for readiness) against the commit before both (2-core VM, 5 loopback
    /// servers, tokio tasks on a 2-worker runtime, 3 alternating runs, medians): writes per
    /// cycle 0.75–0.98 → 0.39–0.46 at K = 64; cycles/s +22 % at K = 8, +20 % at K = 64, +23 %
    /// at K = 256; p99 about halved. A lone task keeps taking the loop itself (no hop).
    pub fn hand_over(&self, slot: Arc<Slot>, alone: bool) {
        let before = self.mailbox.push_held(slot);
        self.after_hand_over(before, alone);
    }

    /// Hands several filled slots over together, as [`Hub::hand_over`] does one: they are
    /// taken in in the same turn, so every node gets their requests in one write.
    pub fn hand_over_many(&self, slots: &[Arc<Slot>], alone: bool) {
        let before = self.mailbox.push_many(slots, true);
        self.after_hand_over(before, alone);
    }

    /// What [`Hub::hand_over`] does once the request is queued (`before`: items queued ahead
    /// of it).
    fn after_hand_over(&self, before: usize, alone: bool) {
        if before > 0 {
            return;
        }
        fence(Ordering::SeqCst);
        if !alone {
            // Unparks it if it sleeps (a syscall), else only sets a flag: it looks at the
            // mailbox before it sleeps again (park's token covers an unpark just before).
            self.notify();
            return;
        }
        if let Some(mut guard) = self.try_engine() {
            guard.engine().drive_until(Instant::now(), |_| false);
            self.leave(guard);
        }
    }

    /// Fires `alarm` at `at` (or soon after): the engine's loop is the async API's only clock.
    pub fn alarm(&self, at: Instant, alarm: Arc<Alarm>) {
        self.mailbox.push_alarm(at, alarm);
        fence(Ordering::SeqCst);
        self.notify();
    }

    /// Queues an operation nobody waits for (a release): sent within the current or next turn
    /// of the loop, its reply consumed later, a failure remembered in the ledger.
    pub fn send(&self, kind: ReqKind, resource: &[u8], token: &Token) {
        if let Some(mut guard) = self.try_engine() {
            let engine = guard.engine();
            let now = Instant::now();
            engine.take_inbox(now);
            engine.submit(kind, resource, token, Waiter::None, now);
            engine.flush(now);
            self.leave(guard);
            return;
        }
        // The thread's detached slot, unless the engine has not taken its last request in yet
        // (then a fresh one: rare, it allocates).
        let slot = DETACHED
            .try_with(|s| s.clone())
            .ok()
            .filter(|s| s.is_done())
            .unwrap_or_else(|| Arc::new(Slot::new()));
        slot.fill(kind, resource, token, Caller::Detached, None);
        self.hand_over(slot, true);
    }

    /// Queues several operations nobody waits for (the releases of permits won and not kept),
    /// as [`Hub::send`] does one; they go out in one write per node.
    pub fn send_many(&self, requests: &[(ReqKind, &[u8], Token)]) {
        if let Some(mut guard) = self.try_engine() {
            let engine = guard.engine();
            let now = Instant::now();
            engine.take_inbox(now);
            for &(kind, resource, token) in requests {
                engine.submit(kind, resource, &token, Waiter::None, now);
            }
            engine.flush(now);
            self.leave(guard);
            return;
        }
        let slots: Vec<Arc<Slot>> = requests
            .iter()
            .map(|&(kind, resource, token)| {
                let slot = Arc::new(Slot::new());
                slot.fill(kind, resource, &token, Caller::Detached, None);
                slot
            })
            .collect();
        self.hand_over_many(&slots, true);
    }

    /// The background thread: drives the loop while callers wait and nobody else drives, and
    /// otherwise wakes for connection deadlines of requests still outstanding (hung nodes,
    /// connect timeouts) and to retry unconfirmed releases; flushes them when the last handle
    /// is gone.
    fn background(self: Arc<Hub>) {
        // Without a deadline it still looks every second (a bound, not the mechanism).
        const IDLE: Duration = Duration::from_secs(1);
        let mut next: Option<Instant> = None;
        let mut last = Instant::now();
        // Looks in a row at a loop a caller held, since this thread last drove it.
        let mut found_taken = 0u32;
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return self.close_down();
            }
            let notified = self.notified.swap(false, Ordering::SeqCst);
            let now = Instant::now();
            let wake = next.map_or(last + IDLE, |t| t.min(last + IDLE));
            if !notified && now < wake && self.mailbox.queued() == 0 {
                next = self.idle(wake, now).or(next);
                continue;
            }
            last = now;
            let Some(guard) = self.try_engine() else {
                next = self.found_taken(now, &mut found_taken);
                continue;
            };
            found_taken = 0;
            next = self.drive_turn(guard, now);
        }
    }

    /// The last handle is gone: unconfirmed releases flushed (bounded), kept locks released.
    fn close_down(&self) {
        let mut guard = self.engine();
        let config = guard.config().clone();
        let bound = config
            .connect_timeout
            .max(config.node_timeout_for(config.ttl));
        let _ = guard.engine().shutdown(Instant::now() + bound, true);
    }

    /// Nothing to do before `wake`: parks until then, unless a caller that leaves the loop has
    /// left an earlier timer behind, which it answers.
    fn idle(&self, wake: Instant, now: Instant) -> Option<Instant> {
        // Pairs with `leave`: it stores the timer then reads `planned`; this stores `planned`
        // then reads the timer. Either it sees the plan, or this sees its timer.
        self.planned.store(self.ns(wake), Ordering::SeqCst);
        let earlier = self
            .instant(self.timer.load(Ordering::SeqCst))
            .filter(|&t| t < wake);
        if earlier.is_none() {
            std::thread::park_timeout(wake - now);
        }
        self.planned.store(0, Ordering::SeqCst);
        earlier
    }

    /// A caller drives: it hands over when it leaves, and leaves the kept locks' timer behind
    /// (one already due is the caller's to run: look again shortly). Answers when to look.
    fn found_taken(&self, now: Instant, found_taken: &mut u32) -> Option<Instant> {
        self.found_taken.fetch_add(1, Ordering::Relaxed);
        let next = self
            .instant(self.timer.load(Ordering::SeqCst))
            .map(|t| t.max(now + Duration::from_millis(1)));
        // With requests queued, `background` does not park: this thread used to spin on the
        // lock for as long as the caller held it (3.4 million looks in 200 ms,
        // `tests/async_api.rs`), taking a CPU from the holder whenever the holder was
        // preempted. It tries again for a few microseconds (a task's turn is usually that
        // short, and a park costs a wake-up), then waits for the caller to let go: `leave`
        // wakes it if anything is left (pairs with its unlock-then-look: either this sees
        // `notified`, or the unpark is kept for this park); 1 ms at most, a bound, not the
        // mechanism.
        *found_taken += 1;
        if *found_taken <= SPIN_LOOKS {
            std::hint::spin_loop();
        } else if !self.notified.load(Ordering::SeqCst) {
            std::thread::park_timeout(Duration::from_millis(1));
        }
        next
    }

    /// Drives the loop while callers wait and nobody else drives; answers the engine's next
    /// background deadline.
    fn drive_turn(&self, mut guard: MutexGuard<'_, Client>, now: Instant) -> Option<Instant> {
        let mailbox = self.mailbox.clone();
        let engine = guard.engine();
        // Connection deadlines that passed while nobody drove.
        engine.drain(now);
        engine.drive(|e| (e.waiting() == 0 && mailbox.queued() == 0) || self.wanted());
        let timer = engine.timer().map_or(u64::MAX, |t| self.ns(t));
        self.timer.store(timer, Ordering::SeqCst);
        let next = engine.background_deadline(Instant::now());
        drop(guard);
        if self.wanted() {
            self.yield_to_wanted();
            self.notified.store(true, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        if self.mailbox.queued() > 0 {
            self.notified.store(true, Ordering::SeqCst);
        }
        next
    }

    /// Flushes unconfirmed releases until `timeout`.
    pub fn shutdown(&self, timeout: Duration) -> Shutdown {
        if self.reentered() {
            // From `with_client`'s closure: nothing can be flushed from here.
            return Shutdown::default();
        }
        let mut guard = self.engine();
        let deadline = crate::model::round::deadline_after(Instant::now(), timeout);
        let report = guard.engine().shutdown(deadline, false);
        self.leave(guard);
        report
    }

    /// Tells the background thread to flush and stop.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.notify();
    }
}
