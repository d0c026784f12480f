//! [`LockGuard`]: an owned guard; releases its lock when dropped, without waiting.

use std::time::Duration;

use crate::api::redlock::Redlock;
use crate::model::error::Error;
use crate::model::lock::Lock;

/// Releases its lock when dropped. Derefs to the [`Lock`](crate::Lock).
///
/// Owned and `'static`: it holds a clone of the handle, is `Send`, and can be moved into
/// another thread or returned from one. Dropping it never waits: the release is queued on the
/// handle's engine ([`Redlock::unlock_nowait`]) and written within a turn of its loop; a node
/// that is down gets it when it is back. A process that exits right after dropping guards can
/// lose those releases — call [`Redlock::shutdown`] first. [`LockGuard::unlock`] releases and
/// waits for the count. Made by [`Redlock::guard`].
///
/// ```no_run
/// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
/// let guard = redlock.guard("orders:42")?;
/// let worker = std::thread::spawn(move || {
///     // ... work within guard.validity() ...
///     drop(guard); // released
/// });
/// worker.join().expect("worker");
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Debug)]
pub struct LockGuard(Held<Redlock>);

/// A handle that can queue a release without waiting (what a guard's drop does).
pub(crate) trait ReleaseNowait {
    fn release_nowait(&self, lock: Lock);
}

impl ReleaseNowait for Redlock {
    fn release_nowait(&self, lock: Lock) {
        self.unlock_nowait(lock);
    }
}

/// What both guards ([`LockGuard`], [`AsyncLockGuard`](crate::AsyncLockGuard)) are: a handle
/// and the lock, until it is consumed; the lock is released without waiting when dropped.
#[derive(Debug)]
pub(crate) struct Held<H: ReleaseNowait> {
    pub handle: H,
    lock: Option<Lock>,
}

impl<H: ReleaseNowait> Held<H> {
    pub fn new(handle: H, lock: Lock) -> Held<H> {
        Held {
            handle,
            lock: Some(lock),
        }
    }

    /// The handle and the lock, to extend it (`Expired` once consumed: never, in practice).
    pub fn parts(&mut self) -> Result<(&H, &mut Lock), Error> {
        match self.lock.as_mut() {
            Some(lock) => Ok((&self.handle, lock)),
            None => Err(Error::Expired { released: 0 }),
        }
    }

    /// The handle and the lock, taken out: the drop no longer releases it.
    pub fn take(&mut self) -> (&H, Option<Lock>) {
        (&self.handle, self.lock.take())
    }

    pub fn into_inner(mut self) -> Lock {
        self.lock
            .take()
            .expect("a guard holds its lock until consumed")
    }

    pub fn lock(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a guard holds its lock until consumed")
    }
}

impl<H: ReleaseNowait> Drop for Held<H> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.handle.release_nowait(lock);
        }
    }
}

impl LockGuard {
    /// A guard of a lock already held (a semaphore's permit).
    pub(crate) fn new(redlock: Redlock, lock: Lock) -> LockGuard {
        LockGuard(Held::new(redlock, lock))
    }

    /// Extends the guarded lock to `ttl` from now; see [`Redlock::extend`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
    /// let mut guard = redlock.guard("orders:42")?;
    /// guard.extend(std::time::Duration::from_secs(30))?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::extend`].
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let (redlock, lock) = self.0.parts()?;
        redlock.extend(lock, ttl)
    }

    /// Releases now, waiting for the nodes' replies, and reports how many nodes released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
    /// let guard = redlock.guard("orders:42")?;
    /// let released = guard.unlock()?;
    /// # let _ = released;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::unlock`].
    pub fn unlock(mut self) -> Result<usize, Error> {
        match self.0.take() {
            (redlock, Some(lock)) => redlock.unlock(lock),
            (_, None) => Ok(0),
        }
    }

    /// Gives the lock up without releasing it.
    pub fn into_inner(self) -> Lock {
        self.0.into_inner()
    }
}

impl std::ops::Deref for LockGuard {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.0.lock()
    }
}

impl Redlock {
    /// Acquires `resource` (waiting for it, as [`Redlock::lock`]) and returns a guard that
    /// releases the lock when dropped, without waiting. The guard derefs to the [`Lock`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// {
    ///     let mut guard = redlock.guard("orders:42")?;
    ///     // ... work within guard.validity() ...
    ///     guard.extend(Duration::from_secs(30))?;
    ///     // ... more work ...
    /// } // released here
    /// redlock.shutdown(Duration::from_secs(1)); // before the process exits: flush releases
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`].
    pub fn guard(&self, resource: impl AsRef<[u8]>) -> Result<LockGuard, Error> {
        Ok(LockGuard(Held::new(self.clone(), self.lock(resource)?)))
    }
}
