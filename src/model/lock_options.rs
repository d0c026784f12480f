//! [`LockOptions`]: the TTL and the wait of one acquire, in place of the handle's settings.

use std::time::Duration;

/// What one call of [`Redlock::lock_with`](crate::Redlock::lock_with) (or
/// [`AsyncRedlock::lock_with`](crate::AsyncRedlock::lock_with)) takes in place of the handle's
/// settings; what is left `None` is the handle's.
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::LockOptions;
///
/// let options = LockOptions::new().ttl(Duration::from_secs(2)).wait(Duration::from_millis(500));
/// assert_eq!(options.ttl, Some(Duration::from_secs(2)));
/// assert_eq!(LockOptions::new().wait(Duration::ZERO).wait, Some(Duration::ZERO)); // one attempt
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// The lock's TTL; `None`: [`Config::ttl`](crate::Config::ttl). At most
    /// [`Config::longest_ttl`](crate::Config::longest_ttl) (`Builder::max_ttl`, else the TTL):
    /// the restart quarantine must outlive every lock.
    pub ttl: Option<Duration>,
    /// How long to wait for a held lock; `None`:
    /// [`Config::lock_wait`](crate::Config::lock_wait) (4 s by default); zero: one attempt, as
    /// [`try_lock`](crate::Redlock::try_lock).
    pub wait: Option<Duration>,
}

impl LockOptions {
    /// The handle's settings, unchanged.
    pub const fn new() -> LockOptions {
        LockOptions {
            ttl: None,
            wait: None,
        }
    }

    /// This acquire's TTL.
    pub const fn ttl(mut self, ttl: Duration) -> LockOptions {
        self.ttl = Some(ttl);
        self
    }

    /// How long this acquire waits for a held lock (zero: one attempt).
    pub const fn wait(mut self, wait: Duration) -> LockOptions {
        self.wait = Some(wait);
        self
    }
}
