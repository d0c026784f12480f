//! [`AsyncLockGuard`]: an owned guard for async code; releases its lock when dropped, without
//! waiting.

use std::time::Duration;

use crate::api::async_redlock::AsyncRedlock;
use crate::api::guard::{Held, ReleaseNowait};
use crate::model::error::Error;
use crate::model::lock::Lock;

/// Releases its lock when dropped. Derefs to the [`Lock`].
///
/// Owned and `'static`: it holds a clone of the handle, is `Send`, and can be moved into a
/// spawned task or returned from one. Dropping it never waits: the release is queued on the
/// handle's engine and written within a turn of its loop (a node that is down gets it when it
/// is back). A process that exits right after dropping guards can lose those releases — call
/// [`AsyncRedlock::shutdown`] first. [`AsyncLockGuard::unlock`] releases and waits for the
/// count. Made by [`AsyncRedlock::guard`].
#[derive(Debug)]
pub struct AsyncLockGuard(Held<AsyncRedlock>);

impl ReleaseNowait for AsyncRedlock {
    fn release_nowait(&self, lock: Lock) {
        self.unlock_nowait(lock);
    }
}

impl AsyncLockGuard {
    pub(crate) fn new(redlock: AsyncRedlock, lock: Lock) -> AsyncLockGuard {
        AsyncLockGuard(Held::new(redlock, lock))
    }

    /// Extends the guarded lock to `ttl` from now; see [`AsyncRedlock::extend`].
    ///
    /// # Errors
    ///
    /// As [`Redlock::extend`](crate::Redlock::extend).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let (redlock, lock) = self.0.parts()?;
        redlock.extend(lock, ttl).await
    }

    /// Releases now, waiting for the nodes' replies, and reports how many nodes released.
    ///
    /// # Errors
    ///
    /// As [`Redlock::unlock`](crate::Redlock::unlock).
    pub async fn unlock(mut self) -> Result<usize, Error> {
        match self.0.take() {
            (redlock, Some(lock)) => redlock.unlock(lock).await,
            (_, None) => Ok(0),
        }
    }

    /// Gives the lock up without releasing it.
    pub fn into_inner(self) -> Lock {
        self.0.into_inner()
    }
}

impl std::ops::Deref for AsyncLockGuard {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.0.lock()
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
