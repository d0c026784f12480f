//! [`LockGuard`]: an owned guard; releases its lock when dropped, without waiting.

use std::time::Duration;

use crate::error::Error;
use crate::handle::Redlock;
use crate::lock::Lock;

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
pub struct LockGuard {
    redlock: Redlock,
    lock: Option<Lock>,
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
        match self.lock.as_mut() {
            Some(lock) => self.redlock.extend(lock, ttl),
            None => Err(Error::Expired { released: 0 }),
        }
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
        match self.lock.take() {
            Some(lock) => self.redlock.unlock(lock),
            None => Ok(0),
        }
    }

    /// Gives the lock up without releasing it.
    pub fn into_inner(mut self) -> Lock {
        self.lock
            .take()
            .expect("a guard holds its lock until consumed")
    }
}

impl std::ops::Deref for LockGuard {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a guard holds its lock until consumed")
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.redlock.unlock_nowait(lock);
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
        Ok(LockGuard {
            redlock: self.clone(),
            lock: Some(self.lock(resource)?),
        })
    }
}
