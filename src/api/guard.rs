//! Owned guards: [`LockGuard`] releases its lock when dropped, without waiting; its async face
//! is the same type over an [`AsyncRedlock`] ([`AsyncLockGuard`]). Both faces share the guard
//! itself (its lock, its `Deref`, giving the lock up) and differ only in how they extend and
//! release: by blocking, or through futures.

use std::time::Duration;

use crate::api::async_redlock::AsyncRedlock;
use crate::api::redlock::Redlock;
use crate::model::error::Error;
use crate::model::lock::Lock;

/// Releases its lock when dropped. Derefs to the [`Lock`].
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
pub struct LockGuard<R = Redlock> {
    handle: R,
    /// The lock until the guard is consumed.
    lock: Option<Lock>,
    /// How the handle queues a release without waiting (what the drop does).
    release_nowait: fn(&R, Lock),
}

/// [`LockGuard`] for async code: releases its lock when dropped. Derefs to the [`Lock`].
///
/// Owned and `'static`: it holds a clone of the handle, is `Send`, and can be moved into a
/// spawned task or returned from one. Dropping it never waits: the release is queued on the
/// handle's engine and written within a turn of its loop (a node that is down gets it when it
/// is back). A process that exits right after dropping guards can lose those releases — call
/// [`AsyncRedlock::shutdown`] first. [`AsyncLockGuard::unlock`] releases and waits for the
/// count. Made by [`AsyncRedlock::guard`].
pub type AsyncLockGuard = LockGuard<AsyncRedlock>;

impl<R> LockGuard<R> {
    /// The handle and the lock, to extend it (`Expired` once consumed: never, in practice).
    fn parts(&mut self) -> Result<(&R, &mut Lock), Error> {
        match self.lock.as_mut() {
            Some(lock) => Ok((&self.handle, lock)),
            None => Err(Error::Expired { released: 0 }),
        }
    }

    /// The handle and the lock, taken out: the drop no longer releases it.
    fn take(&mut self) -> (&R, Option<Lock>) {
        (&self.handle, self.lock.take())
    }

    /// Gives the lock up without releasing it.
    pub fn into_inner(mut self) -> Lock {
        self.lock
            .take()
            .expect("a guard holds its lock until consumed")
    }
}

impl<R> std::ops::Deref for LockGuard<R> {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a guard holds its lock until consumed")
    }
}

impl<R> Drop for LockGuard<R> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            (self.release_nowait)(&self.handle, lock);
        }
    }
}

/// A handle that can queue a release without waiting: what a guard's drop does.
pub(crate) trait ReleaseNowait {
    fn release_nowait(&self, lock: Lock);
}

impl ReleaseNowait for Redlock {
    fn release_nowait(&self, lock: Lock) {
        self.unlock_nowait(lock);
    }
}

impl ReleaseNowait for AsyncRedlock {
    fn release_nowait(&self, lock: Lock) {
        self.unlock_nowait(lock);
    }
}

/// A guard of a lock already held, on the handle that took it.
pub(crate) fn guard<R: ReleaseNowait>(handle: R, lock: Lock) -> LockGuard<R> {
    LockGuard {
        handle,
        lock: Some(lock),
        release_nowait: R::release_nowait,
    }
}

impl LockGuard {
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
        let (redlock, lock) = self.parts()?;
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
        match self.take() {
            (redlock, Some(lock)) => redlock.unlock(lock),
            (_, None) => Ok(0),
        }
    }
}

impl LockGuard<AsyncRedlock> {
    /// Extends the guarded lock to `ttl` from now; see [`AsyncRedlock::extend`].
    ///
    /// # Errors
    ///
    /// As [`Redlock::extend`](crate::Redlock::extend).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let (redlock, lock) = self.parts()?;
        redlock.extend(lock, ttl).await
    }

    /// Releases now, waiting for the nodes' replies, and reports how many nodes released.
    ///
    /// # Errors
    ///
    /// As [`Redlock::unlock`](crate::Redlock::unlock).
    pub async fn unlock(mut self) -> Result<usize, Error> {
        match self.take() {
            (redlock, Some(lock)) => redlock.unlock(lock).await,
            (_, None) => Ok(0),
        }
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
        Ok(guard(self.clone(), self.lock(resource)?))
    }
}

impl AsyncRedlock {
    /// Acquires `resource` (waiting for it, as [`AsyncRedlock::lock`]) and returns a guard that
    /// releases the lock when dropped, without waiting; see [`AsyncLockGuard`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let mut guard = redlock.guard("orders:42").await?;
    /// // ... work within guard.validity() ...
    /// guard.extend(Duration::from_secs(30)).await?;
    /// guard.unlock().await?; // or drop it: released without waiting
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`](crate::Redlock::lock).
    pub async fn guard(&self, resource: impl AsRef<[u8]>) -> Result<AsyncLockGuard, Error> {
        let lock = self.lock(resource).await?;
        Ok(guard(self.clone(), lock))
    }
}
