//! [`LockGuard`]: releases its lock when dropped.

use std::time::Duration;

use crate::error::Error;
use crate::handle::Redlock;
use crate::lock::Lock;

/// Releases its lock when dropped (waiting at most the per-node timeout; errors are ignored and
/// nothing panics). Derefs to the [`Lock`](crate::Lock).
#[derive(Debug)]
pub struct LockGuard<'a> {
    redlock: &'a Redlock,
    lock: Option<Lock>,
}

impl LockGuard<'_> {
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

impl std::ops::Deref for LockGuard<'_> {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a guard holds its lock until consumed")
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = self.redlock.unlock(lock);
        }
    }
}

impl Redlock {
    /// Acquire with retries and return a guard that releases the lock when dropped.
    ///
    /// # Errors
    ///
    /// As [`Client::lock`](crate::Client::lock).
    pub fn guard(&self, resource: impl AsRef<[u8]>) -> Result<LockGuard<'_>, Error> {
        Ok(LockGuard {
            redlock: self,
            lock: Some(self.lock(resource)?),
        })
    }
}
