//! [`AsyncRedlock`]: the async face of a [`Redlock`] handle — the same engine, futures instead
//! of blocked threads (see `runtime/call.rs` for how they are woken).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::api::redlock::Redlock;
use crate::engine::Shutdown;
use crate::engine::request::ReqKind;
use crate::model::addr::NodeAddr;
use crate::model::config::{Builder, Config};
use crate::model::error::Error;
use crate::model::lock::Lock;
use crate::model::lock_options::LockOptions;
use crate::model::node_status::NodeStatus;
use crate::model::round::deadline_after;
use crate::model::token::Token;
use crate::runtime::call::Call;
use crate::runtime::client::{apply_extend, lock_of, released_of, status_of};
use crate::runtime::hub::Hub;

impl Builder {
    /// A handle for async code; see [`AsyncRedlock`]. Like [`Builder::build`], it does not
    /// connect.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .quarantine(None) // servers just started, never held a lock; in production keep the default
    ///     .build_async()?;
    /// # let _ = redlock;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Builder::build`].
    pub fn build_async(self) -> Result<AsyncRedlock, Error> {
        self.build().map(AsyncRedlock::from)
    }
}

/// The async lock client: `Send + Sync + Clone`, methods take `&self` and return futures.
///
/// It is a [`Redlock`] handle seen through futures: the same engine (one connection per node,
/// one `mio` loop on the handle's background thread), shared with the blocking API of the same
/// handle ([`AsyncRedlock::blocking`], `AsyncRedlock::from(redlock)`). The futures need no
/// particular runtime — they are woken through [`std::task::Waker`] by the engine's loop — so
/// they run under tokio (multi-thread or current-thread), any other executor, or a plain
/// `block_on`. They never block the thread that polls them: polling one costs at most a turn
/// of the loop that waits for nothing (a `write` per node).
///
/// Every future may be dropped at any point — before its first poll, midway, after it
/// completed — without leaving a lock held for nobody: an acquire dropped midway releases what
/// it wins; a release ([`unlock`](AsyncRedlock::unlock),
/// [`AsyncLockGuard::unlock`](crate::AsyncLockGuard::unlock),
/// [`AsyncKeepAlive::release`](crate::AsyncKeepAlive::release)) goes out even if its future is
/// never polled; a dropped extend cuts the lock's validity to what it could have set at worst.
/// The table under [Cancellation](#cancellation) below (also `docs/cancellation.md`) says what
/// each method does in each case.
///
/// ```no_run
/// # async fn run() -> Result<(), redlock_mux::Error> {
/// use redlock_mux::AsyncRedlock;
///
/// let redlock: AsyncRedlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .quarantine(None) // servers just started, never held a lock; in production keep the default
///     .build_async()?;
/// let guard = redlock.guard("orders:42").await?;
/// // ... work, within guard.validity() ...
/// drop(guard); // released through the engine; dropping never waits
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/cancellation.md")]
#[derive(Clone)]
pub struct AsyncRedlock {
    redlock: Redlock,
}

impl fmt::Debug for AsyncRedlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRedlock")
            .field("nodes", &self.nodes())
            .finish_non_exhaustive()
    }
}

impl From<Redlock> for AsyncRedlock {
    fn from(redlock: Redlock) -> AsyncRedlock {
        AsyncRedlock { redlock }
    }
}

impl From<AsyncRedlock> for Redlock {
    fn from(redlock: AsyncRedlock) -> Redlock {
        redlock.redlock
    }
}

impl AsyncRedlock {
    crate::model::config::default_handle!(AsyncRedlock, build_async,
        /// A handle with default settings: `Builder::new(servers).build_async()`.
    );

    /// The blocking API on the same engine (for a thread that is not an executor's).
    pub fn blocking(&self) -> &Redlock {
        &self.redlock
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        self.redlock.config()
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[NodeAddr] {
        self.redlock.nodes()
    }

    pub(crate) fn hub(&self) -> &Hub {
        self.redlock.hub()
    }

    /// What the shared engine has counted so far; see [`Redlock::stats`]. Never waits.
    pub fn stats(&self) -> crate::Stats {
        self.redlock.stats()
    }

    /// One attempt to acquire `resource`, no waiting for a held resource; see
    /// [`Redlock::try_lock`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// match redlock.try_lock("orders:42").await {
    ///     Ok(lock) => {
    ///         // ... work within lock.validity() ...
    ///         redlock.unlock(lock).await?;
    ///     }
    ///     Err(redlock_mux::Error::Held(_)) => println!("busy"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::try_lock`].
    pub async fn try_lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.attempt(resource.as_ref()).await
    }

    async fn attempt(&self, resource: &[u8]) -> Result<Lock, Error> {
        let (kind, token) = ReqKind::acquire(self.config(), resource)?;
        // Checked at the first poll: inside the `with_lock` whose work polls this, if any.
        crate::api::reentry::check(self.blocking().engine_id(), resource)?;
        let outcome = Call::new(self.hub(), kind, resource, token).await;
        lock_of(resource, token, outcome)
    }

    /// Acquires `resource`, waiting at most [`Config::lock_wait`] (4 s by default; the waits
    /// are timers of the engine: no runtime needed); see [`Redlock::lock`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let lock = redlock.lock("orders:42").await?;
    /// // ... work within lock.validity() ...
    /// redlock.unlock(lock).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`].
    pub async fn lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let deadline = deadline_after(Instant::now(), self.config().lock_wait());
        self.lock_until(resource, deadline).await
    }

    /// Acquires `resource`, waiting until `deadline`; see [`Redlock::lock_until`]. Dropping the
    /// future leaves the queue (a lock it won meanwhile is released).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::{Duration, Instant};
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let lock = redlock.lock_until("orders:42", Instant::now() + Duration::from_secs(10)).await?;
    /// redlock.unlock(lock).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock_until`].
    pub async fn lock_until(
        &self,
        resource: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::wait(self.config(), resource, deadline)?;
        crate::api::reentry::check(self.blocking().engine_id(), resource)?;
        let outcome = Call::new(self.hub(), kind, resource, token).await;
        lock_of(resource, token, outcome)
    }

    /// Acquires `resource` with the TTL and the wait of `options`, the handle's settings for
    /// what it leaves out; see [`Redlock::lock_with`](crate::Redlock::lock_with). Dropping the
    /// future leaves the queue (a lock it won meanwhile is released).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::LockOptions;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let lock = redlock.lock_with("report:daily", LockOptions::new().ttl(Duration::from_secs(2))).await?;
    /// redlock.unlock(lock).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock_with`](crate::Redlock::lock_with).
    pub async fn lock_with(
        &self,
        resource: impl AsRef<[u8]>,
        options: LockOptions,
    ) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = self.blocking().request_with(resource, options)?;
        let outcome = Call::new(self.hub(), kind, resource, token).await;
        lock_of(resource, token, outcome)
    }

    /// Acquires `resource`, waiting for it at most `wait`; see
    /// [`Redlock::try_lock_for`](crate::Redlock::try_lock_for).
    ///
    /// # Errors
    ///
    /// As [`AsyncRedlock::lock_until`].
    pub async fn try_lock_for(
        &self,
        resource: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Lock, Error> {
        self.lock_with(resource, LockOptions::new().wait(wait))
            .await
    }

    /// One attempt at a shared (read) lock of `resource`; see [`Shared`](crate::Shared) and
    /// [`Redlock::try_lock_shared`](crate::Redlock::try_lock_shared).
    ///
    /// # Errors
    ///
    /// As [`AsyncRedlock::try_lock`].
    pub async fn try_lock_shared(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.try_lock(crate::Shared::new(resource)?).await
    }

    /// A shared (read) lock of `resource`, waiting at most [`Config::lock_wait`]; see
    /// [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`AsyncRedlock::lock_until`].
    pub async fn lock_shared(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.lock(crate::Shared::new(resource)?).await
    }

    /// A shared (read) lock of `resource`, waiting until `deadline`; see
    /// [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`AsyncRedlock::lock_until`].
    pub async fn lock_shared_until(
        &self,
        resource: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        self.lock_until(crate::Shared::new(resource)?, deadline)
            .await
    }

    /// Releases the lock, waiting for the nodes' replies, and returns how many nodes still held
    /// it; see [`Redlock::unlock`].
    ///
    /// The release is the call's, not the first poll's: the future owns the lock from the call
    /// on, and dropped before it was ever polled it releases it without waiting (as
    /// [`AsyncRedlock::unlock_nowait`]); dropped later, the release handed to the engine at the
    /// first poll still completes in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let lock = redlock.lock("orders:42").await?;
    /// let released = redlock.unlock(lock).await?;
    /// println!("released on {released} of 3 nodes");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::unlock`].
    pub fn unlock(&self, lock: Lock) -> impl Future<Output = Result<usize, Error>> + Send + '_ {
        let unsent = Unsent {
            redlock: self,
            lock: Some(lock),
        };
        async move {
            let mut unsent = unsent;
            let lock = unsent.lock.take().expect("taken at the first poll only");
            let expired = !lock.is_valid();
            if self.hub().reentered() {
                // From a `with_client` closure of this handle: queued, it goes out once the
                // closure returns (as the blocking face's `unlock`).
                self.hub()
                    .send(ReqKind::Release, lock.resource(), lock.token());
                return Err(Error::Reentrant);
            }
            // No await from the take to the first poll of the call, which hands the release to
            // the engine: from there on the engine owns it (a cancelled release still goes out).
            let outcome =
                Call::new(self.hub(), ReqKind::Release, lock.resource(), *lock.token()).await;
            released_of(expired, outcome)
        }
    }

    /// Releases without waiting for the replies (not a future: nothing to wait for); see
    /// [`Redlock::unlock_nowait`].
    pub fn unlock_nowait(&self, lock: Lock) {
        self.redlock.unlock_nowait(lock);
    }

    /// Extends the lock to `ttl` from now, on a quorum, within its current validity; see
    /// [`Redlock::extend`].
    ///
    /// Dropped before it is decided, the extend may still reach some nodes. It never shortens a
    /// key there (`PEXPIRE … GT`), except before Redis 7 for an ACL user without `+pttl` (a plain
    /// `PEXPIRE`): so the lock's validity is cut to what the extend could have given at worst,
    /// `min(validity before, start + ttl − drift)`, where `start` is when the future was first
    /// polled.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// let mut lock = redlock.lock("orders:42").await?;
    /// redlock.extend(&mut lock, Duration::from_secs(30)).await?;
    /// redlock.unlock(lock).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::extend`].
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let now = Instant::now();
        let backing = lock.backing(self.redlock.nodes());
        let kind = ReqKind::extend(self.config(), (lock, backing), ttl, now)?;
        // As the round counts it (`RoundConfig::validity`).
        let most = self.config().ttl_round(ttl).validity();
        let worst = lock.valid_until().min(now + most.unwrap_or_default());
        let mut pending = ExtendInFlight {
            lock,
            worst,
            armed: true,
        };
        let outcome = Call::new(
            self.hub(),
            kind,
            pending.lock.resource(),
            *pending.lock.token(),
        )
        .await;
        pending.armed = false;
        apply_extend(&mut *pending.lock, outcome, self.redlock.nodes())
    }

    /// What every node says about `resource`, waiting at most `timeout`; see
    /// [`Redlock::status`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> Result<(), redlock_mux::Error> {
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
    /// for node in redlock.status("orders:42", Duration::from_millis(500)).await {
    ///     println!("{}: {:?}", node.node, node.state);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn status(&self, resource: impl AsRef<[u8]>, timeout: Duration) -> Vec<NodeStatus> {
        let outcome = Call::new(
            self.hub(),
            ReqKind::Status { timeout },
            resource.as_ref(),
            Token::EMPTY,
        )
        .await;
        status_of(outcome)
    }

    /// Sends every release not confirmed yet and waits for the replies, at most `timeout`; see
    /// [`Redlock::shutdown`]. Call it before a process exits: releases queued by dropped guards
    /// are written within a turn of the engine's loop, but a process that exits at once can
    /// lose them (their keys then live out their TTL). The flush runs on a thread of its own,
    /// so no executor thread waits.
    pub async fn shutdown(&self, timeout: Duration) -> Shutdown {
        let done = Arc::new(Mutex::new((None::<Shutdown>, None::<Waker>)));
        let (redlock, cell) = (self.redlock.clone(), done.clone());
        let spawned = std::thread::Builder::new()
            .name("redlock-shutdown".into())
            .spawn(move || {
                let report = redlock.shutdown(timeout);
                let mut cell = cell.lock().unwrap_or_else(|e| e.into_inner());
                cell.0 = Some(report);
                if let Some(waker) = cell.1.take() {
                    drop(cell);
                    crate::engine::foreign::wake(waker);
                }
            });
        if spawned.is_err() {
            // No thread to spare (rare): flush on this one rather than not at all.
            return self.redlock.shutdown(timeout);
        }
        std::future::poll_fn(|cx| {
            let mut cell = done.lock().unwrap_or_else(|e| e.into_inner());
            match cell.0.take() {
                Some(report) => Poll::Ready(report),
                None => {
                    cell.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// A release not handed to the engine yet: the lock of an [`AsyncRedlock::unlock`] future that
/// was never polled. Dropped with the lock still in it, it releases the lock without waiting.
struct Unsent<'a> {
    redlock: &'a AsyncRedlock,
    /// Taken at the first poll, in the same poll that hands the release to the engine.
    lock: Option<Lock>,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.redlock.unlock_nowait(lock);
        }
    }
}

/// An extend in flight: if its future is dropped, the lock's validity is cut to the worst the
/// extend could have set.
struct ExtendInFlight<'l> {
    lock: &'l mut Lock,
    worst: Instant,
    /// Cleared once the outcome is in.
    armed: bool,
}

impl Drop for ExtendInFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (valid_until, extensions) = (self.lock.valid_until(), self.lock.extensions());
        self.lock.set_state(valid_until.min(self.worst), extensions);
    }
}
