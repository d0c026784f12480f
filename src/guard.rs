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
/// waits for the count.
#[derive(Debug)]
pub struct LockGuard {
    redlock: Redlock,
    lock: Option<Lock>,
}

impl LockGuard {
    /// Extends the guarded lock.
    ///
    /// # Errors
    ///
    /// As [`Client::extend`](crate::Client::extend).
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        match self.lock.as_mut() {
            Some(lock) => self.redlock.extend(lock, ttl),
            None => Err(Error::Expired { released: 0 }),
        }
    }

    /// Releases now and reports how many nodes released.
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`](crate::Client::unlock).
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
    /// Acquire (waiting for it, as `lock`) and return a guard that releases the lock when
    /// dropped.
    ///
    /// # Errors
    ///
    /// As [`Client::lock`](crate::Client::lock).
    pub fn guard(&self, resource: impl AsRef<[u8]>) -> Result<LockGuard, Error> {
        Ok(LockGuard {
            redlock: self.clone(),
            lock: Some(self.lock(resource)?),
        })
    }
}
