//! [`AsyncLockGuard`]: an owned guard for async code; releases its lock when dropped, without
//! waiting.

use std::time::Duration;

use crate::async_handle::AsyncRedlock;
use crate::error::Error;
use crate::lock::Lock;

/// Releases its lock when dropped. Derefs to the [`Lock`].
///
/// Owned and `'static`: it holds a clone of the handle, is `Send`, and can be moved into a
/// spawned task or returned from one. Dropping it never waits: the release is queued on the
/// handle's engine and written within a turn of its loop (a node that is down gets it when it
/// is back). A process that exits right after dropping guards can lose those releases — call
/// [`AsyncRedlock::shutdown`] first. [`AsyncLockGuard::unlock`] releases and waits for the
/// count. Made by [`AsyncRedlock::guard`].
#[derive(Debug)]
pub struct AsyncLockGuard {
    redlock: AsyncRedlock,
    lock: Option<Lock>,
}

impl AsyncLockGuard {
    pub(crate) fn new(redlock: AsyncRedlock, lock: Lock) -> AsyncLockGuard {
        AsyncLockGuard {
            redlock,
            lock: Some(lock),
        }
    }

    /// Extends the guarded lock to `ttl` from now; see [`AsyncRedlock::extend`].
    ///
    /// # Errors
    ///
    /// As [`Redlock::extend`](crate::Redlock::extend).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        match self.lock.as_mut() {
            Some(lock) => self.redlock.extend(lock, ttl).await,
            None => Err(Error::Expired { released: 0 }),
        }
    }

    /// Releases now, waiting for the nodes' replies, and reports how many nodes released.
    ///
    /// # Errors
    ///
    /// As [`Redlock::unlock`](crate::Redlock::unlock).
    pub async fn unlock(mut self) -> Result<usize, Error> {
        match self.lock.take() {
            Some(lock) => self.redlock.unlock(lock).await,
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

impl std::ops::Deref for AsyncLockGuard {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a guard holds its lock until consumed")
    }
}

impl Drop for AsyncLockGuard {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.redlock.unlock_nowait(lock);
        }
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
        Ok(AsyncLockGuard::new(self.clone(), lock))
    }
}
