//! Keeping a lock: automatic extension by one background thread per [`Redlock`] handle, batched
//! per node, and lost-lock notification.
//!
//! The keeper thread owns its own [`Client`]. It sleeps until the next lock is due (by default
//! when a third of its TTL is left) or until a validity deadline, then extends every lock that is
//! due in one burst: one write per node per tick, however many locks. A lock whose extension
//! fails, whose validity runs out first, or which reaches the extension limit is marked lost at
//! once: [`KeepAlive::is_held`] turns false (an atomic load and a clock read) and waiters in
//! [`KeepAlive::wait_lost`] wake up. The keeper then releases it on the nodes and waits for their
//! replies (bounded by the node timeout), and only then hands the [`KeepAlive::on_lost`] callback
//! to the handle's callback thread, so that callbacks never run on the keeper thread: a callback
//! may block or call back into the library without holding up the renewal of other locks.
//!
//! Unlike Redisson's watchdog, which keeps renewing but never tells the holder when renewal
//! fails, a lost lock is always reported — and never later than its validity deadline, because
//! `is_held` and `wait_lost` also compare against the deadline themselves.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::config::Shared;
use crate::error::Error;
use crate::handle::Redlock;
use crate::lock::Lock;
use crate::round::deadline_after;

type Callback = Box<dyn FnOnce(&Error) + Send>;

/// Requests to the keeper thread.
pub(crate) enum Cmd {
    Keep(Arc<Kept>, Lock),
    Release(u64, Option<Sender<Result<usize, Error>>>),
    /// A callback set after its lock's loss was settled: for the callback thread.
    Notify(Callback, Error),
    Shutdown,
}

/// The callback of one kept lock, and whether its end is settled: lost (or released by the
/// holder) *and* released on the nodes. Before that a callback is stored; after, it is run.
#[derive(Default)]
struct Notice {
    callback: Option<Callback>,
    settled: bool,
}

/// What the keeper thread and the holder share about one kept lock.
pub(crate) struct Kept {
    id: u64,
    epoch: Instant,
    /// `valid_until` as nanoseconds since `epoch`.
    valid_ns: AtomicU64,
    extensions: AtomicU32,
    lost: AtomicBool,
    reason: Mutex<Option<Error>>,
    changed: Condvar,
    notice: Mutex<Notice>,
    base: Lock,
}

impl Kept {
    fn valid_until(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.valid_ns.load(Ordering::Acquire))
    }

    fn set_valid_until(&self, t: Instant) {
        let ns = t.saturating_duration_since(self.epoch).as_nanos();
        self.valid_ns
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Marks the lock lost (once) and wakes waiters. The callback is not run here: see
    /// [`Kept::settle`].
    fn mark_lost(&self, why: Error) {
        let mut reason = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        *reason = Some(why);
        drop(reason);
        self.changed.notify_all();
    }

    /// Records that the lock's end is settled (its release is over); returns the callback set
    /// so far. A callback set from now on is handed to the callback thread at once by
    /// [`KeepAlive::on_lost`].
    fn settle(&self) -> Option<Callback> {
        let mut notice = self.notice.lock().unwrap_or_else(|e| e.into_inner());
        notice.settled = true;
        notice.callback.take()
    }

    /// The holder released the lock (or the handle is shutting down): no callback runs.
    fn end_by_holder(&self) {
        self.mark_lost(Error::Expired { released: 0 });
        drop(self.settle());
    }

    fn loss(&self) -> Option<Error> {
        if self.lost.load(Ordering::Acquire) {
            let reason = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            return reason.clone().or(Some(Error::Expired { released: 0 }));
        }
        if Instant::now() >= self.valid_until() {
            return Some(Error::Expired { released: 0 });
        }
        None
    }
}

/// A lock kept alive in the background until released (or dropped, which releases it too).
///
/// ```no_run
/// # let redlock = redlock_mux::Redlock::new(["redis://127.0.0.1:7001"])?;
/// let kept = redlock.keep(redlock.lock("report:daily")?)?;
/// for chunk in 0..1000 {
///     if !kept.is_held() {
///         break; // lost: stop touching the resource
///     }
///     // ... work on chunk ...
/// }
/// kept.release()?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
pub struct KeepAlive {
    kept: Arc<Kept>,
    redlock: Redlock,
    done: bool,
}

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("lock", &self.lock())
            .field("held", &self.is_held())
            .finish()
    }
}

impl KeepAlive {
    /// True while the lock is safe to rely on: not reported lost, and its validity deadline not
    /// passed. No I/O: an atomic load and a monotonic clock read.
    pub fn is_held(&self) -> bool {
        !self.kept.lost.load(Ordering::Acquire) && Instant::now() < self.kept.valid_until()
    }

    /// Why the lock is lost, or `None` while it is held.
    pub fn lost(&self) -> Option<Error> {
        self.kept.loss()
    }

    /// Blocks until the lock is lost or `timeout` passes; returns the reason, or `None` on
    /// timeout. Wakes at the validity deadline by itself, whatever the keeper thread does.
    ///
    /// Returns as soon as the loss is known, before the lost lock's release (and before the
    /// [`on_lost`](KeepAlive::on_lost) callback). A timeout too long to add to the clock (such
    /// as `Duration::MAX`) means no timeout: it waits until the lock is lost.
    pub fn wait_lost(&self, timeout: Duration) -> Option<Error> {
        let give_up = deadline_after(Instant::now(), timeout);
        let mut guard = self.kept.reason.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            // The reason is read through the guard held here (`loss()` would lock it again).
            if self.kept.lost.load(Ordering::Acquire) {
                return guard.clone().or(Some(Error::Expired { released: 0 }));
            }
            let now = Instant::now();
            let valid_until = self.kept.valid_until();
            if now >= valid_until {
                return Some(Error::Expired { released: 0 });
            }
            if now >= give_up {
                return None;
            }
            let wake = give_up.min(valid_until);
            guard = self
                .kept
                .changed
                .wait_timeout(guard, wake.saturating_duration_since(now))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs `callback` once when the lock is lost, with the reason. Not called for a release by
    /// the holder (or a drop). Replaces a callback set earlier.
    ///
    /// When a lock is lost, in this order:
    ///
    /// 1. [`is_held`](KeepAlive::is_held) turns false and [`wait_lost`](KeepAlive::wait_lost)
    ///    returns, at once.
    /// 2. The keeper releases the lock on the nodes and waits for their replies as
    ///    [`Client::unlock`] does, at most the node timeout: by the time the callback runs, every
    ///    node that answered has deleted our token (if it still had it). A node that did not
    ///    answer in time (down, frozen, cut off) is not waited for; the release stays queued on
    ///    its connection and runs if the node takes it in later.
    /// 3. The callback runs on the handle's callback thread (`redlock-callbacks`, one per
    ///    [`Redlock`] handle, started at the first loss), never on the keeper thread. So it may
    ///    block, and it may use the library, this handle included (keep or release other locks,
    ///    take the same resource again), without holding up the renewal of other locks. The
    ///    callbacks of one handle run one at a time, in the order the losses were settled: a
    ///    callback that blocks delays the later callbacks, not renewals.
    ///
    /// So the callback is a later notice than `is_held` and `wait_lost`, by up to a node timeout
    /// when nodes do not answer, and it may come after the validity deadline: to stop touching
    /// the resource as early as possible, check `is_held` or wait in `wait_lost`.
    ///
    /// Set after the loss, the callback is run as soon as step 2 is over (at once if it is), on
    /// the callback thread too. A panic in the callback is caught (the panic hook still reports
    /// it) and ends nothing else.
    pub fn on_lost(&self, callback: impl FnOnce(&Error) + Send + 'static) {
        let callback: Callback = Box::new(callback);
        let mut notice = self.kept.notice.lock().unwrap_or_else(|e| e.into_inner());
        if !notice.settled {
            notice.callback = Some(callback);
            return;
        }
        drop(notice);
        // Settled without a loss: released by the holder, which calls no callback.
        if !self.kept.lost.load(Ordering::Acquire) {
            return;
        }
        let why = self.kept.loss().unwrap_or(Error::Expired { released: 0 });
        // To the callback thread, through the keeper (which owns it). Should the keeper have
        // stopped, the callback runs here rather than never.
        let undelivered = match self.redlock.shared().keeper() {
            Ok(keeper) => match keeper.send(Cmd::Notify(callback, why)) {
                Ok(()) => return,
                Err(mpsc::SendError(cmd)) => cmd,
            },
            Err(_) => Cmd::Notify(callback, why),
        };
        if let Cmd::Notify(callback, why) = undelivered {
            run_guarded(callback, &why);
        }
    }

    /// The lock as it stands now (its validity moves forward with each extension).
    pub fn lock(&self) -> Lock {
        let mut lock = self.kept.base.clone();
        lock.set_state(
            self.kept.valid_until(),
            self.kept.extensions.load(Ordering::Acquire),
        );
        lock
    }

    /// The validity left now.
    pub fn validity(&self) -> Duration {
        self.kept
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// Stops keeping the lock and releases it on every node; returns how many still held it.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] if the lock had been lost or had expired; errors of
    /// [`Client::unlock`].
    pub fn release(mut self) -> Result<usize, Error> {
        self.done = true;
        let (tx, rx) = mpsc::channel();
        let keeper = self.redlock.shared().keeper()?;
        if keeper.send(Cmd::Release(self.kept.id, Some(tx))).is_err() {
            return Err(Error::Internal("the keep-alive thread has stopped".into()));
        }
        // The keeper answers within its node timeout; the margin covers a tick in progress.
        let config = self.redlock.config();
        let bound = config.node_timeout_for(config.ttl) * 4 + Duration::from_secs(5);
        rx.recv_timeout(bound).unwrap_or_else(|_| {
            Err(Error::Internal(
                "the keep-alive thread did not answer".into(),
            ))
        })
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if !self.done
            && let Ok(keeper) = self.redlock.shared().keeper()
        {
            let _ = keeper.send(Cmd::Release(self.kept.id, None));
        }
    }
}

impl Redlock {
    /// Keeps `lock` alive in the background until the returned handle is released or dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Internal`] if the keep-alive thread cannot be started.
    pub fn keep(&self, lock: Lock) -> Result<KeepAlive, Error> {
        let shared = self.shared();
        let keeper = shared.keeper()?;
        let epoch = Instant::now();
        let kept = Arc::new(Kept {
            id: shared.next_keep_id(),
            epoch,
            valid_ns: AtomicU64::new(0),
            extensions: AtomicU32::new(lock.extensions()),
            lost: AtomicBool::new(false),
            reason: Mutex::new(None),
            changed: Condvar::new(),
            notice: Mutex::new(Notice::default()),
            base: lock.clone(),
        });
        kept.set_valid_until(lock.valid_until());
        keeper
            .send(Cmd::Keep(kept.clone(), lock))
            .map_err(|_| Error::Internal("the keep-alive thread has stopped".into()))?;
        Ok(KeepAlive {
            kept,
            redlock: self.clone(),
            done: false,
        })
    }

    /// Acquires `resource` (with retries), keeps it alive while `work` runs, then releases it.
    /// `work` should check [`KeepAlive::is_held`] between steps.
    ///
    /// # Errors
    ///
    /// As [`Client::lock`] when the lock cannot be acquired.
    pub fn with_lock<R>(
        &self,
        resource: impl AsRef<[u8]>,
        work: impl FnOnce(&KeepAlive) -> R,
    ) -> Result<R, Error> {
        let kept = self.keep(self.lock(resource)?)?;
        let result = work(&kept);
        let _ = kept.release();
        Ok(result)
    }
}

struct Entry {
    kept: Arc<Kept>,
    lock: Lock,
}

/// Starts the keeper thread of `shared`.
pub(crate) fn spawn(shared: Arc<Shared>) -> Result<Sender<Cmd>, Error> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("redlock-keeper".into())
        .spawn(move || run(shared, rx))
        .map_err(|e| Error::Internal(format!("cannot start the keep-alive thread: {e}")))?;
    Ok(tx)
}

/// Runs a callback, catching a panic: it must not take its thread (and the callbacks after it)
/// down.
fn run_guarded(callback: Callback, why: &Error) {
    let _ = catch_unwind(AssertUnwindSafe(|| callback(why)));
}

/// The keeper's side of the callback thread, which it starts at the first callback to run and
/// which ends when the keeper does (after running the callbacks handed over until then).
#[derive(Default)]
struct Callbacks {
    tx: Option<Sender<(Callback, Error)>>,
}

impl Callbacks {
    fn run(&mut self, callback: Callback, why: Error) {
        if self.tx.is_none() {
            let (tx, rx) = mpsc::channel::<(Callback, Error)>();
            let started = std::thread::Builder::new()
                .name("redlock-callbacks".into())
                .spawn(move || {
                    for (callback, why) in rx {
                        run_guarded(callback, &why);
                    }
                });
            if started.is_ok() {
                self.tx = Some(tx);
            }
        }
        let job = match &self.tx {
            Some(tx) => match tx.send((callback, why)) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => (callback, why),
        };
        // No callback thread (it could not be started, or it is gone): better late renewals
        // than a loss never reported. The next callback tries to start the thread again.
        self.tx = None;
        run_guarded(job.0, &job.1);
    }
}

fn run(shared: Arc<Shared>, rx: Receiver<Cmd>) {
    let mut callbacks = Callbacks::default();
    let mut client = match Client::from_shared(shared.clone()) {
        Ok(c) => c,
        Err(e) => {
            // Nothing can be kept: report every lock handed over as lost (nothing was sent to
            // the nodes, so there is nothing to release).
            while let Ok(cmd) = rx.recv() {
                match cmd {
                    Cmd::Keep(kept, _) => {
                        kept.mark_lost(e.clone());
                        if let Some(callback) = kept.settle() {
                            callbacks.run(callback, e.clone());
                        }
                    }
                    Cmd::Release(_, reply) => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(Error::Expired { released: 0 }));
                        }
                    }
                    Cmd::Notify(callback, why) => callbacks.run(callback, why),
                    Cmd::Shutdown => return,
                }
            }
            return;
        }
    };
    let config = client.config().clone();
    let renew_left = config.ttl.mul_f64(config.renew_fraction);
    // Locks due within this window of each other are extended in the same tick, so that locks
    // taken a few milliseconds apart share one write per node instead of one each.
    let coalesce = config.ttl / 10;
    let mut entries: Vec<Entry> = Vec::new();
    loop {
        let now = Instant::now();
        let next = entries
            .iter()
            .map(|e| e.lock.valid_until().checked_sub(renew_left).unwrap_or(now))
            .min();
        let cmd = match next {
            Some(t) => rx.recv_timeout(t.saturating_duration_since(now)),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match cmd {
            Ok(Cmd::Keep(kept, lock)) => entries.push(Entry { kept, lock }),
            Ok(Cmd::Release(id, reply)) => {
                let result = match entries.iter().position(|e| e.kept.id == id) {
                    Some(at) => {
                        let entry = entries.swap_remove(at);
                        entry.kept.end_by_holder();
                        client.unlock(entry.lock)
                    }
                    None => Err(Error::Expired { released: 0 }),
                };
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
            Ok(Cmd::Notify(callback, why)) => callbacks.run(callback, why),
            Ok(Cmd::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                for entry in entries.drain(..) {
                    entry.kept.end_by_holder();
                    let _ = client.unlock(entry.lock);
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        tick(
            &mut client,
            &mut callbacks,
            &mut entries,
            renew_left,
            coalesce,
            config.ttl,
        );
    }
}

/// Extends every lock that is due, in one batch; reports the ones that are lost.
fn tick(
    client: &mut Client,
    callbacks: &mut Callbacks,
    entries: &mut Vec<Entry>,
    renew_left: Duration,
    coalesce: Duration,
    ttl: Duration,
) {
    let now = Instant::now();
    let mut lost = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if now >= entry.lock.valid_until() {
            lost.push((i, Error::Expired { released: 0 }));
        }
    }
    let due: Vec<usize> = (0..entries.len())
        .filter(|&i| !lost.iter().any(|(j, _)| *j == i))
        .filter(|&i| {
            entries[i]
                .lock
                .valid_until()
                .checked_sub(renew_left)
                .is_none_or(|t| t <= now + coalesce)
        })
        .collect();
    // Only when one of them is really due: the others just come along.
    let any_due = due.iter().any(|&i| {
        entries[i]
            .lock
            .valid_until()
            .checked_sub(renew_left)
            .is_none_or(|t| t <= now)
    });
    if any_due {
        let before = client.io_stats().writes;
        let mut locks: Vec<&mut Lock> = entries
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| due.contains(i))
            .map(|(_, e)| &mut e.lock)
            .collect();
        let results = client.extend_batch(&mut locks, ttl);
        let extended = results.iter().filter(|r| r.is_ok()).count() as u64;
        client
            .shared()
            .record_tick(client.io_stats().writes - before, extended);
        for (&i, result) in due.iter().zip(results) {
            // Also after a lost extend: its validity is cut to what the nodes still back.
            let entry = &entries[i];
            entry.kept.set_valid_until(entry.lock.valid_until());
            match result {
                Ok(()) => entry
                    .kept
                    .extensions
                    .store(entry.lock.extensions(), Ordering::Release),
                Err(e) => lost.push((i, e)),
            }
        }
    }
    lost.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
    let lost: Vec<(Entry, Error)> = lost
        .into_iter()
        .map(|(i, why)| (entries.swap_remove(i), why))
        .collect();
    // Every holder learns first, before any round trip.
    for (entry, why) in &lost {
        entry.kept.mark_lost(why.clone());
    }
    for (entry, why) in lost {
        // The lock cannot be relied on any more: free it for others at once, and wait for the
        // nodes' replies (at most the node timeout; a node that does not answer in time still
        // has the release queued), so that the callback never finds our stale token. This
        // delays the renewal of the other locks by that round trip only: the callback itself
        // runs on the callback thread.
        let _ = client.unlock(entry.lock);
        if let Some(callback) = entry.kept.settle() {
            callbacks.run(callback, why);
        }
    }
}
