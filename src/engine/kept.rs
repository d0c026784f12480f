//! What a kept lock's holder ([`KeepAlive`](crate::KeepAlive)) and the engine that renews it
//! share: the lock's validity and extension count (atomics, read without a lock), whether and
//! why it was lost, the `on_lost` callback — and the callback thread, so that callbacks never
//! run on the engine's loop.
//!
//! The engine owns the renewal (its timers, its extends, batched with everything else queued in
//! the same turn); the holder only reads, and ends the lock by [`Kept::end_by_holder`].

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::model::addr::NodeAddr;
use crate::model::error::Error;
use crate::model::lock::Lock;

pub(crate) type Callback = Box<dyn FnOnce(&Error) + Send>;

/// The callback of one kept lock, and whether its end is settled (lost, or ended by the
/// holder). Before that a callback is stored; after, it is run.
#[derive(Default)]
struct Notice {
    callback: Option<Callback>,
    settled: bool,
}

/// How a holder's end of a kept lock ([`Kept::end_by_holder`]) found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Held: the holder releases it.
    Held,
    /// Lost, its keys left on the nodes for the holder: the holder releases them (once).
    Lost,
    /// Nothing to release (ended before).
    Nothing,
}

impl Ended {
    /// The holder is to release the lock's keys.
    pub fn releases(self) -> bool {
        self != Ended::Nothing
    }
}

/// One kept lock.
pub(crate) struct Kept {
    epoch: Instant,
    /// `valid_until` as nanoseconds since `epoch`.
    valid_ns: AtomicU64,
    extensions: AtomicU32,
    lost: AtomicBool,
    /// When `lost` was set, as nanoseconds since `epoch` plus one (0: not yet).
    lost_ns: AtomicU64,
    /// An extend of it is in flight (touched by the engine only, under its mutex).
    pub extending: AtomicBool,
    /// The nodes that back the validity: those that said yes to the acquire or to the last
    /// renewal that won, less those that refused a renewal since, as a bit set (0: not known;
    /// see `Lock::backing`).
    backed: AtomicU64,
    /// Renewals lost in a row since the last one won (touched by the engine only).
    failures: AtomicU32,
    /// Not to be renewed again before this, as nanoseconds since `epoch` plus one (0: no
    /// such bound): the backoff after a lost renewal (touched by the engine only).
    retry_ns: AtomicU64,
    reason: Mutex<Option<Error>>,
    changed: Condvar,
    /// Async waiters for the loss ([`LossWaker`]), each under its own id.
    wakers: Mutex<Vec<(u64, Waker)>>,
    /// The next [`LossWaker`]'s id.
    waiter_ids: AtomicU64,
    notice: Mutex<Notice>,
    /// Lost, and its keys left on the nodes for the holder to release once it has stopped
    /// (`end_by_holder`): the engine does not release a lost lock (see `Engine::lose_keeps`).
    owed: AtomicBool,
    base: Lock,
    pub callbacks: Arc<Callbacks>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("lock", &self.lock())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Kept {
    /// `lock`, kept by an engine of `servers`.
    pub fn new(lock: Lock, callbacks: Arc<Callbacks>, servers: &[NodeAddr]) -> Kept {
        let kept = Kept {
            epoch: Instant::now(),
            valid_ns: AtomicU64::new(0),
            extensions: AtomicU32::new(lock.extensions()),
            lost: AtomicBool::new(false),
            lost_ns: AtomicU64::new(0),
            extending: AtomicBool::new(false),
            backed: AtomicU64::new(lock.backing(servers)),
            failures: AtomicU32::new(0),
            retry_ns: AtomicU64::new(0),
            reason: Mutex::new(None),
            changed: Condvar::new(),
            wakers: Mutex::new(Vec::new()),
            waiter_ids: AtomicU64::new(0),
            notice: Mutex::new(Notice::default()),
            owed: AtomicBool::new(false),
            callbacks,
            base: lock,
        };
        kept.set_valid_until(kept.base.valid_until());
        kept
    }

    pub fn valid_until(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.valid_ns.load(Ordering::Acquire))
    }

    pub fn set_valid_until(&self, t: Instant) {
        let ns = t.saturating_duration_since(self.epoch).as_nanos();
        self.valid_ns
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// The validity left now.
    pub fn validity(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    pub fn extensions(&self) -> u32 {
        self.extensions.load(Ordering::Acquire)
    }

    /// One more extension won, backed by the nodes in `yes` (a bit set): the renewals lost
    /// before it, and their backoff, are forgotten.
    pub fn extended(&self, yes: u64) {
        self.extensions.fetch_add(1, Ordering::AcqRel);
        self.backed.store(yes, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        self.retry_ns.store(0, Ordering::Relaxed);
    }

    /// The nodes that back the validity (a bit set; 0: not known).
    pub fn backed(&self) -> u64 {
        self.backed.load(Ordering::Relaxed)
    }

    /// Nodes in `yes` (a bit set) said yes to a renewal that was lost: each moved our token's
    /// expiry to at least the renewal's start + TTL, past the validity, so they back it too
    /// (when the backing is known: an unknown one stays unknown).
    pub fn backed_also_by(&self, yes: u64) {
        let _ = self
            .backed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b != 0).then_some(b | yes)
            });
    }

    /// A lost renewal that says nothing of the nodes (a credentials error): the backing is no
    /// longer known (any refusal ends the lock from now on).
    pub fn forget_backing(&self) {
        self.backed.store(0, Ordering::Relaxed);
    }

    /// Nodes in `refused` (a bit set) said our token is gone: they back the validity no more.
    /// (A refusal cannot be undone: nothing puts our token back on a node.)
    pub fn refused_by(&self, refused: u64) {
        self.backed.fetch_and(!refused, Ordering::Relaxed);
    }

    /// One more renewal lost in a row: returns how many now.
    pub fn renewal_lost(&self) -> u32 {
        self.failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Not to be renewed before this (the backoff after a lost renewal), if set.
    pub fn retry_at(&self) -> Option<Instant> {
        self.stamped(self.retry_ns.load(Ordering::Relaxed))
    }

    pub fn set_retry_at(&self, t: Instant) {
        self.retry_ns.store(self.stamp(t), Ordering::Relaxed);
    }

    /// The resource and token (what the engine sends).
    pub fn base(&self) -> &Lock {
        &self.base
    }

    /// The lock as it stands now (its validity moves forward with each extension).
    pub fn lock(&self) -> Lock {
        let mut lock = self.base.clone();
        lock.set_state(self.valid_until(), self.extensions());
        lock.set_backed(self.backed());
        lock
    }

    /// When it was marked lost (or ended by the holder).
    /// `None` while not marked; set before `is_lost` turns true.
    pub fn lost_at(&self) -> Option<Instant> {
        self.stamped(self.lost_ns.load(Ordering::Acquire))
    }

    /// `t` as the optional instants are kept: nanoseconds since `epoch`, plus one (0: none).
    fn stamp(&self, t: Instant) -> u64 {
        let ns = t.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1
    }

    /// The instant that [`Kept::stamp`] made `ns` of, if any.
    fn stamped(&self, ns: u64) -> Option<Instant> {
        (ns != 0).then(|| self.epoch + Duration::from_nanos(ns - 1))
    }

    /// Lost, or ended by the holder.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Held: not lost, validity deadline not passed.
    pub fn is_held(&self) -> bool {
        !self.is_lost() && Instant::now() < self.valid_until()
    }

    fn reason(&self) -> MutexGuard<'_, Option<Error>> {
        self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the lock lost and wakes waiters; false if it already was (lost, or ended by its
    /// holder). `owed`: its keys are left on the nodes for the holder to release (the engine's
    /// loss; see [`Kept::leave_to_holder`]). The callback is not run here: see
    /// [`Kept::settle`].
    pub fn mark_lost(&self, why: Error, owed: bool) -> bool {
        let mut reason = self.reason();
        // Every writer of `lost` holds `reason`: the instant and `owed` are stored first, so
        // that whoever sees `is_lost()` also sees `lost_at()` — and a holder that ends the lock
        // the moment it learns of the loss (`end_by_holder`, under `reason` too) finds the keys
        // owed to it (they were once set owed after the wake-up, and a holder woken first
        // released nothing).
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        self.lost_ns
            .store(self.stamp(Instant::now()), Ordering::Release);
        self.owed.store(owed, Ordering::Release);
        self.lost.store(true, Ordering::Release);
        *reason = Some(why);
        drop(reason);
        self.changed.notify_all();
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, waker) in wakers {
            crate::engine::foreign::wake(waker);
        }
        true
    }

    /// How many async waiters are registered (tests).
    #[cfg(test)]
    fn waiters(&self) -> usize {
        self.wakers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Records that the lock's end is settled (lost, or ended by the holder); returns the callback set
    /// so far. A callback set from now on is handed to the callback thread at once by
    /// [`Kept::on_lost`].
    pub fn settle(&self) -> Option<Callback> {
        let mut notice = self.notice.lock().unwrap_or_else(|e| e.into_inner());
        notice.settled = true;
        notice.callback.take()
    }

    /// The holder ends the lock (a release, a drop): no callback runs, and the engine stops
    /// renewing it. What the holder is to do on the nodes: see [`Ended`].
    pub fn end_by_holder(&self) -> Ended {
        if self.mark_lost(Error::Expired { released: 0 }, false) {
            drop(self.settle());
            return Ended::Held;
        }
        match self.owed.swap(false, Ordering::AcqRel) {
            true => Ended::Lost,
            false => Ended::Nothing,
        }
    }

    /// Lost (marked by the engine with its keys owed to the holder: they stay on the nodes
    /// until the holder ends it — it may still be at work, and the validity it was given still
    /// protects it — or until they expire): the callback goes to the callback thread now.
    pub fn leave_to_holder(&self) {
        self.settle_loss();
    }

    /// Why the lock is lost, or `None` while it is held.
    pub fn loss(&self) -> Option<Error> {
        if self.is_lost() {
            return self
                .reason()
                .clone()
                .or(Some(Error::Expired { released: 0 }));
        }
        if Instant::now() >= self.valid_until() {
            return Some(Error::Expired { released: 0 });
        }
        None
    }

    /// Blocks until the lock is lost or `give_up`; the reason, or `None` at `give_up`.
    pub fn wait_lost(&self, give_up: Instant) -> Option<Error> {
        let mut guard = self.reason();
        loop {
            // The reason is read through the guard held here (`loss()` would lock it again).
            if self.is_lost() {
                return guard.clone().or(Some(Error::Expired { released: 0 }));
            }
            let now = Instant::now();
            let valid_until = self.valid_until();
            if now >= valid_until {
                return Some(Error::Expired { released: 0 });
            }
            if now >= give_up {
                return None;
            }
            let wake = give_up.min(valid_until);
            guard = self
                .changed
                .wait_timeout(guard, wake.saturating_duration_since(now))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sets the callback; once the end is settled, hands it to the callback thread at once.
    /// (A lock its holder ended has no `KeepAlive` left to set one on.)
    pub fn on_lost(&self, callback: Callback) {
        let mut notice = self.notice.lock().unwrap_or_else(|e| e.into_inner());
        if !notice.settled {
            notice.callback = Some(callback);
            return;
        }
        drop(notice);
        let why = self.loss().unwrap_or(Error::Expired { released: 0 });
        self.callbacks.run(callback, why);
    }

    /// The lost lock's end is settled: the callback (if any) goes to the callback thread.
    pub fn settle_loss(&self) {
        if let Some(callback) = self.settle() {
            let why = self.loss().unwrap_or(Error::Expired { released: 0 });
            self.callbacks.run(callback, why);
        }
    }
}

/// Runs a callback, catching a panic: it must not take its thread (and the callbacks after it)
/// down.
fn run_guarded(callback: Callback, why: &Error) {
    let _ = crate::engine::foreign::catch(|| callback(why));
}

/// The callback thread of one handle, started at the first callback to run; it ends when the
/// last holder of this (the engine, and every kept lock) is gone, after running the callbacks
/// handed over until then.
#[derive(Default)]
pub(crate) struct Callbacks {
    tx: Mutex<Option<Sender<(Callback, Error)>>>,
}

impl Callbacks {
    pub fn run(&self, callback: Callback, why: Error) {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            let (sender, rx) = mpsc::channel::<(Callback, Error)>();
            let started = std::thread::Builder::new()
                .name("redlock-callbacks".into())
                .spawn(move || {
                    for (callback, why) in rx {
                        run_guarded(callback, &why);
                    }
                });
            if started.is_ok() {
                *tx = Some(sender);
            }
        }
        let job = match tx.as_ref() {
            Some(sender) => match sender.send((callback, why)) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => (callback, why),
        };
        // No callback thread (it could not be started, or it is gone): better a callback run
        // here than a loss never reported. The next callback tries to start the thread again.
        *tx = None;
        drop(tx);
        run_guarded(job.0, &job.1);
    }
}

/// One async waiter for a kept lock's loss (`AsyncKeepAlive::wait_lost`): its waker is woken
/// when the lock is marked lost, and taken out when the waiter is dropped. (The list once only
/// grew: every task that ever waited left its waker until the loss.)
pub struct LossWaker<'a> {
    kept: &'a Kept,
    id: u64,
    waker: Option<Waker>,
}

impl<'a> LossWaker<'a> {
    pub fn new(kept: &'a Kept) -> LossWaker<'a> {
        let id = kept.waiter_ids.fetch_add(1, Ordering::Relaxed);
        LossWaker {
            kept,
            id,
            waker: None,
        }
    }

    /// Registers `waker` (in place of this waiter's last one), then looks again, so a loss
    /// marked meanwhile is not missed: true if the lock is lost already.
    pub fn register(&mut self, waker: &Waker) -> bool {
        if self.waker.as_ref().is_none_or(|w| !w.will_wake(waker)) {
            let mut wakers = self.kept.wakers.lock().unwrap_or_else(|e| e.into_inner());
            match wakers.iter_mut().find(|(id, _)| *id == self.id) {
                Some(entry) => entry.1 = waker.clone(),
                None => wakers.push((self.id, waker.clone())),
            }
            self.waker = Some(waker.clone());
        }
        self.kept.is_lost()
    }
}

impl Drop for LossWaker<'_> {
    fn drop(&mut self) {
        if self.waker.is_some() {
            let mut wakers = self.kept.wakers.lock().unwrap_or_else(|e| e.into_inner());
            wakers.retain(|(id, _)| *id != self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lock::Lock;
    use crate::model::token::Token;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn kept() -> Kept {
        let token = Token::from_bytes(b"t").unwrap();
        let lock = Lock::new(b"job", token, Instant::now() + Duration::from_secs(60));
        Kept::new(lock, Arc::new(Callbacks::default()), &[])
    }

    /// A lock the engine found lost is the holder's to release, once; a holder woken by the
    /// loss finds it so at once (`owed` is set with `lost`, under the same lock: it was set
    /// after the wake-up, and a holder woken first released nothing).
    #[test]
    fn a_lost_lock_is_the_holders_to_release_once() {
        let held = kept();
        assert_eq!(held.end_by_holder(), Ended::Held);
        assert_eq!(held.end_by_holder(), Ended::Nothing);
        let lost = Arc::new(kept());
        let waiter = {
            let lost = lost.clone();
            std::thread::spawn(move || {
                let why = lost.wait_lost(Instant::now() + Duration::from_secs(10));
                assert!(why.is_some());
                lost.end_by_holder()
            })
        };
        assert!(lost.mark_lost(Error::Expired { released: 0 }, true));
        assert_eq!(waiter.join().unwrap(), Ended::Lost);
        assert_eq!(lost.end_by_holder(), Ended::Nothing, "once");
    }

    #[test]
    fn a_dropped_waiter_leaves_no_waker_behind() {
        let kept = kept();
        // A thousand tasks, one after another, each waiting a while and giving up.
        for _ in 0..1000 {
            let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
            let mut waiter = LossWaker::new(&kept);
            assert!(!waiter.register(&waker));
            assert!(!waiter.register(&waker), "the same waker again");
        }
        assert_eq!(kept.waiters(), 0);
        // Two waiters of one task (one waker): each has its own entry, and the loss wakes both.
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (mut a, mut b) = (LossWaker::new(&kept), LossWaker::new(&kept));
        a.register(&waker);
        b.register(&waker);
        drop(a);
        assert_eq!(kept.waiters(), 1);
        assert!(kept.mark_lost(Error::Expired { released: 0 }, false));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(b.register(&waker), "lost");
    }
}
