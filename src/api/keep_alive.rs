//! Keeping a lock: automatic extension by the handle's engine, batched per node with everything
//! else in flight, and lost-lock notification.
//!
//! A kept lock is a timer of the engine (`engine/keep.rs`): when a third of its TTL is left (by
//! default) the engine extends it, together with every other kept lock due within a tenth of
//! the TTL, in the same turn of its loop — one write per node per tick, however many locks, and
//! on the same connections as every other operation of the handle. The handle's background
//! thread wakes for these timers when no caller drives the loop. A lost renewal is tried again
//! after a backoff while the nodes that back the lock's validity (those that said yes to the
//! round that set it) and did not refuse still make a quorum, and another attempt can be
//! decided with half the renewal margin left. A lock whose renewal cannot win (refused — our
//! token gone — by too many of the nodes that back it, or no time left for another attempt),
//! whose validity runs out first, or which reaches the extension limit is marked lost at once:
//! [`KeepAlive::is_held`] turns false (an atomic load and a clock read) and waiters in
//! [`KeepAlive::wait_lost`] wake up, and the [`KeepAlive::on_lost`] callback goes to the
//! handle's callback thread, so that callbacks never run on the engine's loop: a callback may
//! block or call back into the library without holding up the renewal of other locks. The
//! engine does not release a lost lock: its keys stay on the nodes until the holder, which may
//! still be at work within the validity it was given, ends it (a release, a drop) — or until
//! they expire.
//!
//! Unlike Redisson's watchdog, which keeps renewing but never tells the holder when renewal
//! fails, a lost lock is always reported — and never later than its validity deadline, because
//! `is_held` and `wait_lost` also compare against the deadline themselves.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::api::async_redlock::AsyncRedlock;
use crate::api::redlock::Redlock;
use crate::engine::kept::{Ended, Kept, LossWaker};
use crate::model::error::{Error, WithLockError};
use crate::model::lock::Lock;
use crate::model::round::deadline_after;
use crate::runtime::call::Sleep;

/// A lock kept alive in the background until released (or dropped, which releases it too).
/// Made by [`Redlock::keep`]; [`Redlock::with_lock`] uses one for the length of a closure.
///
/// The handle's engine extends the lock when [`Config::renew_fraction`](crate::Config::renew_fraction)
/// of its TTL is left (a third by default), at most
/// [`Config::max_extensions`](crate::Config::max_extensions) times. A renewal that fails is
/// tried again after a backoff while the nodes that back the validity and did not refuse it
/// still make a quorum, and another attempt can be decided with half the renewal margin left.
/// A lock whose renewal cannot win (refused — our token gone — by too many of the nodes that
/// back it, or no time left for another attempt), whose validity runs out first, or which
/// reaches that limit is lost:
/// [`is_held`](KeepAlive::is_held) turns false, [`wait_lost`](KeepAlive::wait_lost) returns, the
/// [`on_lost`](KeepAlive::on_lost) callback runs; the lock stays on the nodes until this holder
/// releases it (or drops this) or it expires.
///
/// ```no_run
/// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
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
///
/// Its async face is the same type over an [`AsyncRedlock`]: [`AsyncKeepAlive`].
pub struct KeepAlive<R = Redlock> {
    kept: Arc<Kept>,
    redlock: R,
    done: bool,
    /// How the handle queues a release without waiting (what the drop does).
    release_nowait: fn(&R, Lock),
}

/// A lock kept alive in the background until released (or dropped, which releases it without
/// waiting); the async counterpart of [`KeepAlive`].
///
/// ```no_run
/// # async fn run(redlock: redlock_mux::AsyncRedlock) -> Result<(), redlock_mux::Error> {
/// let kept = redlock.keep(redlock.lock("report:daily").await?)?;
/// for chunk in 0..1000 {
///     if !kept.is_held() {
///         break; // lost: stop touching the resource
///     }
///     // ... work on chunk ...
/// }
/// kept.release().await?;
/// # Ok(()) }
/// ```
pub type AsyncKeepAlive = KeepAlive<AsyncRedlock>;

/// The accessors of a kept lock's holder and of its watch ([`KeepAlive`], [`LockWatch`]): both
/// read the engine's [`Kept`], from the field `kept`.
macro_rules! kept_accessors {
    () => {
        /// True while the lock is safe to rely on: not reported lost, and its validity deadline not
        /// passed. No I/O: an atomic load and a monotonic clock read.
        pub fn is_held(&self) -> bool {
            self.kept.is_held()
        }

        /// Why the lock is lost, or `None` while it is held.
        pub fn lost(&self) -> Option<Error> {
            self.kept.loss()
        }

        /// When the engine marked the lock lost (a renewal that failed, its validity over, the
        /// extension bound), or the holder ended it; `None` before. The engine does not release a
        /// lost lock (its holder does, when it ends it), so no rival is let in before this by a
        /// release; a rival may still win once the validity has run out, which the engine may
        /// notice later.
        /// The holder's thread or task learns of a loss when it is next scheduled, later still. So a
        /// record of who held what ends the hold at the earliest of this,
        /// [`lock`](Self::lock)`().valid_until()` and the moment the holder noticed.
        pub fn lost_at(&self) -> Option<Instant> {
            self.kept.lost_at()
        }

        /// The lock as it stands now (its validity moves forward with each extension).
        pub fn lock(&self) -> Lock {
            self.kept.lock()
        }

        /// The validity left now.
        pub fn validity(&self) -> Duration {
            self.kept.validity()
        }
    };
}

impl<R> std::fmt::Debug for KeepAlive<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("lock", &self.lock())
            .field("held", &self.is_held())
            .finish()
    }
}

impl<R> KeepAlive<R> {
    kept_accessors!();

    /// Runs `callback` once when the lock is lost, with the reason. Not called for a release by
    /// the holder (or a drop). Replaces a callback set earlier.
    ///
    /// When a lock is lost, in this order:
    ///
    /// 1. [`is_held`](KeepAlive::is_held) turns false and [`wait_lost`](KeepAlive::wait_lost)
    ///    returns, at once.
    /// 2. The callback is handed to the handle's callback thread (`redlock-callbacks`, one per
    ///    [`Redlock`] handle, started at the first loss), never run on the engine's loop. So it
    ///    may block, and it may use the library, this handle included (keep or release other
    ///    locks), without holding up the renewal of other locks. The callbacks of one handle run
    ///    one at a time, in the order of the losses: a callback that blocks delays the later
    ///    callbacks, not renewals.
    /// 3. The lock's keys stay on the nodes — a rival is refused — until this holder ends it
    ///    ([`release`](KeepAlive::release), a drop) or they expire: the holder may still be at
    ///    work, within the validity it was given. A callback that takes the same resource again
    ///    waits for that, like any rival.
    ///
    /// So the callback is a later notice than `is_held` and `wait_lost` (by a thread hand-off):
    /// to stop touching the resource as early as possible, check `is_held` or wait in
    /// `wait_lost`.
    ///
    /// Set after the loss, the callback is run at once, on the callback thread too. A panic in
    /// the callback is caught (the panic hook still reports it) and ends nothing else.
    pub fn on_lost(&self, callback: impl FnOnce(&Error) + Send + 'static) {
        self.kept.on_lost(Box::new(callback));
    }

    /// Stops keeping the lock: the lock to release on the nodes, and whether it had been lost
    /// (the engine leaves a lost lock's keys for its holder to release once it has stopped:
    /// see `Kept::leave_to_holder`); [`Error::Expired`] if there is nothing left to release.
    /// Dropping does nothing more after.
    pub(crate) fn end(&mut self) -> Result<(Lock, bool), Error> {
        self.done = true;
        let lock = self.kept.lock();
        match self.kept.end_by_holder() {
            Ended::Held => Ok((lock, false)),
            Ended::Lost => Ok((lock, true)),
            Ended::Nothing => Err(Error::Expired { released: 0 }),
        }
    }

    pub(crate) fn kept(&self) -> &Arc<Kept> {
        &self.kept
    }
}

impl<R> Drop for KeepAlive<R> {
    fn drop(&mut self) {
        if !self.done && self.kept.end_by_holder().releases() {
            (self.release_nowait)(&self.redlock, self.kept.lock());
        }
    }
}

/// The release's count once the holder ended its kept lock: [`Error::Expired`] if the lock had
/// been lost (its keys, left to the holder, are released all the same).
fn released_or_expired(released: usize, lost: bool) -> Result<usize, Error> {
    match lost {
        false => Ok(released),
        true => Err(Error::Expired { released }),
    }
}

/// A new kept lock of `lock`, handed to `redlock`'s engine to renew.
fn kept_on(redlock: &Redlock, lock: Lock) -> Result<Arc<Kept>, Error> {
    redlock.config().check_keep()?;
    let kept = Arc::new(Kept::new(
        lock,
        redlock.hub().callbacks.clone(),
        redlock.nodes(),
    ));
    redlock.hub().keep(kept.clone());
    Ok(kept)
}

impl KeepAlive {
    /// Blocks until the lock is lost or `timeout` passes; returns the reason, or `None` on
    /// timeout. Wakes at the validity deadline by itself, whatever the engine does.
    ///
    /// Returns as soon as the loss is known (before the [`on_lost`](KeepAlive::on_lost)
    /// callback). The lost lock stays on the nodes until this holder ends it (see
    /// [`KeepAlive::release`]). A timeout too long to add to the clock (such
    /// as `Duration::MAX`) means no timeout: it waits until the lock is lost.
    pub fn wait_lost(&self, timeout: Duration) -> Option<Error> {
        self.kept.wait_lost(deadline_after(Instant::now(), timeout))
    }

    /// Stops keeping the lock and releases it on every node; returns how many still held it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
    /// let kept = redlock.keep(redlock.lock("report:daily")?)?;
    /// // ... work, checking kept.is_held() ...
    /// let released = kept.release()?;
    /// # let _ = released;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] if the lock had been lost (its keys, which the engine leaves on the
    /// nodes for the holder, are released: `released` says on how many nodes our token still
    /// was) or had expired; errors of [`Redlock::unlock`].
    pub fn release(mut self) -> Result<usize, Error> {
        let (lock, lost) = self.end()?;
        released_or_expired(self.redlock.unlock(lock)?, lost)
    }

    /// Stops keeping the lock without releasing it: its keys stay on the nodes until they
    /// expire, at most a TTL after the last extension (a lost lock's too, which the engine left
    /// for its holder). For a holder that cannot tell whether the work the lock protects has
    /// stopped — `redlock run` when a process of COMMAND's group survived SIGKILL — and for
    /// which a release would let a rival in beside that work. Returns the lock as it stood.
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
    /// let kept = redlock.keep(redlock.lock("report:daily")?)?;
    /// // ... the work may still be going on, and nothing can stop it ...
    /// let lock = kept.abandon(); // no more extensions; the keys expire by themselves
    /// # let _ = lock;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn abandon(mut self) -> Lock {
        let lock = self.kept.lock();
        let _ = self.end();
        lock
    }
}

impl KeepAlive<AsyncRedlock> {
    /// A view of the kept lock that can be cloned and moved into other tasks: held or not,
    /// why lost, wait for the loss. It does not release anything.
    pub fn watch(&self) -> LockWatch {
        LockWatch {
            kept: self.kept.clone(),
            redlock: self.redlock.clone(),
        }
    }

    /// Waits until the lock is lost or `timeout` passes; see [`LockWatch::wait_lost`].
    pub async fn wait_lost(&self, timeout: Duration) -> Option<Error> {
        self.watch().wait_lost(timeout).await
    }

    /// Stops keeping the lock and releases it on every node; returns how many still held it.
    ///
    /// # Errors
    ///
    /// As [`KeepAlive::release`].
    pub async fn release(mut self) -> Result<usize, Error> {
        let (lock, lost) = self.end()?;
        released_or_expired(self.redlock.unlock(lock).await?, lost)
    }
}

/// A view of a kept lock ([`AsyncKeepAlive::watch`], or what
/// [`AsyncRedlock::with_lock`] hands its work): `Clone + Send + 'static`, it can check and wait
/// for the loss, and releases nothing.
#[derive(Clone)]
pub struct LockWatch {
    kept: Arc<Kept>,
    redlock: AsyncRedlock,
}

impl std::fmt::Debug for LockWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockWatch")
            .field("lock", &self.lock())
            .field("held", &self.is_held())
            .finish()
    }
}

impl LockWatch {
    kept_accessors!();

    /// Waits until the lock is lost or `timeout` passes; returns the reason, or `None` on
    /// timeout. Wakes at the validity deadline by itself (a timer of the engine), whatever
    /// the renewal does; returns as soon as the loss is known. `Duration::MAX` waits until the
    /// lock is lost. Race it against the work (`tokio::select!`) to stop at the loss.
    pub async fn wait_lost(&self, timeout: Duration) -> Option<Error> {
        let give_up = deadline_after(Instant::now(), timeout);
        let hub = self.redlock.hub();
        let mut sleep: Option<Sleep<'_>> = None;
        let mut loss = LossWaker::new(&self.kept);
        std::future::poll_fn(|cx| {
            loop {
                if let Some(why) = self.kept.loss() {
                    return Poll::Ready(Some(why));
                }
                if Instant::now() >= give_up {
                    return Poll::Ready(None);
                }
                if loss.register(cx.waker()) {
                    continue;
                }
                // The validity moves forward with each extension: the alarm follows it.
                let wake = give_up.min(self.kept.valid_until());
                if sleep.as_ref().is_none_or(|s| s.at() != wake) {
                    sleep = Some(Sleep::until(hub, wake));
                }
                let pinned = Pin::new(sleep.as_mut().expect("set above"));
                if pinned.poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        })
        .await
    }
}

impl Redlock {
    /// Keeps `lock` alive in the background until the returned [`KeepAlive`] is released or
    /// dropped: the handle's engine extends it when a third of its TTL is left (by default),
    /// and reports a loss ([`KeepAlive::is_held`], [`KeepAlive::wait_lost`],
    /// [`KeepAlive::on_lost`]). It is extended at most
    /// [`Config::max_extensions`](crate::Config::max_extensions) times (1000 by default), then
    /// let go and reported lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let kept = redlock.keep(redlock.lock("report:daily")?)?;
    /// kept.on_lost(|why| eprintln!("lock lost: {why}"));
    /// for step in 0..100 {
    ///     if let Some(why) = kept.lost() {
    ///         eprintln!("stopped at step {step}: {why}");
    ///         break;
    ///     }
    ///     // ... step ...
    /// }
    /// // Or wait for a loss, e.g. on a watchdog thread:
    /// let _ = kept.wait_lost(Duration::from_millis(10));
    /// kept.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if this client's TTL is too short to keep a lock (a few ms: its
    /// renewal point lies behind its validity); the lock is then left to expire, within that
    /// TTL.
    pub fn keep(&self, lock: Lock) -> Result<KeepAlive, Error> {
        Ok(KeepAlive {
            kept: kept_on(self, lock)?,
            redlock: self.clone(),
            done: false,
            release_nowait: Redlock::unlock_nowait,
        })
    }

    /// Acquires `resource` (waiting for it, as [`Redlock::lock`]), keeps it alive (as
    /// [`Redlock::keep`]) while `work` runs, then releases it and returns what `work` returned
    /// — `Ok` only if the lock was held from start to end of the work.
    ///
    /// `work` should check [`KeepAlive::is_held`] between steps, to stop touching the resource
    /// as soon as the lock is lost. Whether or not it does, a lock lost while it ran (its
    /// renewal failed, or its validity ran out) is reported when it returns:
    /// [`WithLockError::Lost`], which carries the work's value and the reason. The lock is
    /// looked at when `work` returns; the outcome of the final release is not reported.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::WithLockError;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let steps = redlock.with_lock("report:weekly", |held| {
    ///     let mut steps = 0;
    ///     while held.is_held() && steps < 100 {
    ///         steps += 1; // ... one step of the work ...
    ///     }
    ///     steps
    /// });
    /// match steps {
    ///     Ok(steps) => println!("{steps} steps, under the lock throughout"),
    ///     Err(WithLockError::Lost { value, why }) => {
    ///         eprintln!("lock lost after {value} steps: {why}"); // the last ones unprotected
    ///     }
    ///     Err(e) => return Err(e.into()), // not acquired: the work did not run
    /// }
    /// // Or, when a loss is just an error: `?` makes it `Error::Lost`.
    /// let steps = redlock.with_lock("report:weekly", |_| 100)?;
    /// # let _ = steps;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`WithLockError::NotAcquired`] as [`Redlock::lock`] fails (then `work` is not run);
    /// [`WithLockError::Lost`] if the lock was lost by the time `work` returned.
    ///
    /// Inside `work`, on this thread, an acquire of the same resource through this handle
    /// (`try_lock`, `lock`, `guard`, a nested `with_lock`, the async face too) fails at once
    /// with [`Error::AlreadyHeld`] instead of waiting until its deadline for a lock that is
    /// released only when `work` returns. A thread spawned from `work` is another caller and
    /// waits.
    pub fn with_lock<R>(
        &self,
        resource: impl AsRef<[u8]>,
        work: impl FnOnce(&KeepAlive) -> R,
    ) -> Result<R, WithLockError<R>> {
        let lock = self.lock(resource).map_err(WithLockError::NotAcquired)?;
        self.with_held(lock, work)
    }

    /// The rest of [`Redlock::with_lock`], for a lock already acquired (a semaphore's permit).
    pub(crate) fn with_held<R>(
        &self,
        lock: Lock,
        work: impl FnOnce(&KeepAlive) -> R,
    ) -> Result<R, WithLockError<R>> {
        let kept = self.keep(lock).map_err(WithLockError::NotAcquired)?;
        let value = {
            // An acquire of the same resource from inside the work fails at once (`reentry.rs`).
            let _inside = crate::api::reentry::Scope::enter(self.engine_id(), kept.kept());
            work(&kept)
        };
        let lost = kept.lost();
        let _ = kept.release();
        match lost {
            None => Ok(value),
            Some(why) => Err(WithLockError::Lost { value, why }),
        }
    }
}

impl AsyncRedlock {
    /// Keeps `lock` alive in the background until the returned handle is released or dropped;
    /// see [`Redlock::keep`](crate::Redlock::keep). Not a future: handing the lock to the engine waits for nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let kept = redlock.keep(redlock.lock("report:daily").await?)?;
    /// let watch = kept.watch(); // for other tasks: is_held, wait_lost
    /// for step in 0..100 {
    ///     if !watch.is_held() {
    ///         break; // lost: stop touching the resource
    ///     }
    ///     // ... step ...
    ///     # let _ = step;
    /// }
    /// if let Some(why) = kept.wait_lost(Duration::ZERO).await {
    ///     eprintln!("lost: {why}");
    /// }
    /// kept.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::keep`](crate::Redlock::keep): [`Error::Config`] if this client's TTL is too
    /// short to keep a lock.
    pub fn keep(&self, lock: Lock) -> Result<AsyncKeepAlive, Error> {
        let kept = kept_on(self.blocking(), lock)?;
        Ok(KeepAlive {
            kept,
            redlock: self.clone(),
            done: false,
            release_nowait: AsyncRedlock::unlock_nowait,
        })
    }

    /// Acquires `resource` (waiting, as `lock`), keeps it alive while the future `work` returns
    /// runs, then releases it and returns the work's output — `Ok` only if the lock was held
    /// from start to end of the work. `work` gets a [`LockWatch`] to check between steps
    /// ([`LockWatch::is_held`]) or to race against the loss ([`LockWatch::wait_lost`]).
    ///
    /// A lock lost while the work ran (its renewal failed, or its validity ran out) is
    /// reported when the work's future completes: [`WithLockError::Lost`], which carries the
    /// work's output and the reason, as for [`Redlock::with_lock`](crate::Redlock::with_lock).
    /// The outcome of the final release is not reported. Dropped midway, the lock is released
    /// (without waiting); see the [cancellation table](AsyncRedlock#cancellation).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::WithLockError;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let rows = redlock
    ///     .with_lock("report:daily", async |watch| {
    ///         let mut rows = 0;
    ///         while watch.is_held() && rows < 100 {
    ///             rows += 1; // ... one step of the work ...
    ///         }
    ///         rows
    ///     })
    ///     .await;
    /// match rows {
    ///     Ok(rows) => println!("{rows} rows, under the lock throughout"),
    ///     Err(WithLockError::Lost { value, why }) => {
    ///         eprintln!("lock lost after {value} rows: {why}"); // the last ones unprotected
    ///     }
    ///     Err(e) => return Err(e.into()), // not acquired: the work did not run
    /// }
    /// redlock.shutdown(Duration::from_secs(2)).await;
    /// # Ok(()) }
    /// ```
    ///
    /// With tokio, race the work against the loss (`?` makes a loss [`Error::Lost`]):
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// redlock
    ///     .with_lock("report:daily", async |watch| {
    ///         tokio::select! {
    ///             _ = async { /* the job */ } => {}
    ///             why = watch.wait_lost(Duration::MAX) => eprintln!("lock lost: {why:?}"),
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WithLockError::NotAcquired`] as [`Redlock::lock`](crate::Redlock::lock) fails (then
    /// `work` is not run); [`WithLockError::Lost`] if the lock was lost by the time the work's
    /// future completed.
    ///
    /// Inside the work's future (polled within it: the same task), an acquire of the same
    /// resource through this handle fails at once with [`Error::AlreadyHeld`] instead of waiting
    /// until its deadline for a lock released only when the work completes. A task spawned from
    /// the work is another caller and waits.
    pub async fn with_lock<F, Fut, R>(
        &self,
        resource: impl AsRef<[u8]>,
        work: F,
    ) -> Result<R, WithLockError<R>>
    where
        F: FnOnce(LockWatch) -> Fut,
        Fut: Future<Output = R>,
    {
        let lock = self
            .lock(resource)
            .await
            .map_err(WithLockError::NotAcquired)?;
        self.with_held(lock, work).await
    }

    /// The rest of [`AsyncRedlock::with_lock`], for a lock already acquired (a semaphore's
    /// permit).
    pub(crate) async fn with_held<F, Fut, R>(
        &self,
        lock: Lock,
        work: F,
    ) -> Result<R, WithLockError<R>>
    where
        F: FnOnce(LockWatch) -> Fut,
        Fut: Future<Output = R>,
    {
        let kept = self.keep(lock).map_err(WithLockError::NotAcquired)?;
        // An acquire of the same resource first polled inside the work (the same task) fails
        // at once (`reentry.rs`).
        let engine = self.blocking().engine_id();
        let value = crate::api::reentry::Scoped::new(work(kept.watch()), engine, kept.kept()).await;
        let lost = kept.lost();
        let _ = kept.release().await;
        match lost {
            None => Ok(value),
            Some(why) => Err(WithLockError::Lost { value, why }),
        }
    }
}
