//! [`AsyncKeepAlive`] and [`LockWatch`]: keep-alive for async code. The renewal is the engine's
//! (see `keep.rs`); what is async here is waiting for the loss and the release.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::api::async_redlock::AsyncRedlock;
use crate::api::keep_alive::KeepAlive;
use crate::engine::kept::{Kept, LossWaker};
use crate::model::error::{Error, WithLockError};
use crate::model::lock::Lock;
use crate::model::round::deadline_after;
use crate::runtime::call::Sleep;

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
#[derive(Debug)]
pub struct AsyncKeepAlive {
    inner: KeepAlive,
    watch: LockWatch,
}

impl AsyncKeepAlive {
    pub(crate) fn new(redlock: AsyncRedlock, inner: KeepAlive) -> AsyncKeepAlive {
        let watch = LockWatch {
            kept: inner.kept().clone(),
            redlock,
        };
        AsyncKeepAlive { inner, watch }
    }

    /// A view of the kept lock that can be cloned and moved into other tasks: held or not,
    /// why lost, wait for the loss. It does not release anything.
    pub fn watch(&self) -> LockWatch {
        self.watch.clone()
    }

    /// True while the lock is safe to rely on; see [`KeepAlive::is_held`].
    pub fn is_held(&self) -> bool {
        self.watch.is_held()
    }

    /// Why the lock is lost, or `None` while it is held.
    pub fn lost(&self) -> Option<Error> {
        self.watch.lost()
    }

    /// When the lock stopped being this holder's; see [`KeepAlive::lost_at`].
    pub fn lost_at(&self) -> Option<Instant> {
        self.watch.lost_at()
    }

    /// Waits until the lock is lost or `timeout` passes; see [`LockWatch::wait_lost`].
    pub async fn wait_lost(&self, timeout: Duration) -> Option<Error> {
        self.watch.wait_lost(timeout).await
    }

    /// Runs `callback` once when the lock is lost, on the handle's callback thread; see
    /// [`KeepAlive::on_lost`].
    pub fn on_lost(&self, callback: impl FnOnce(&Error) + Send + 'static) {
        self.inner.on_lost(callback);
    }

    /// The lock as it stands now (its validity moves forward with each extension).
    pub fn lock(&self) -> Lock {
        self.watch.lock()
    }

    /// The validity left now.
    pub fn validity(&self) -> Duration {
        self.watch.validity()
    }

    /// Stops keeping the lock and releases it on every node; returns how many still held it.
    ///
    /// # Errors
    ///
    /// As [`KeepAlive::release`].
    pub async fn release(mut self) -> Result<usize, Error> {
        let (lock, lost) = self.inner.end()?;
        let released = self.watch.redlock.unlock(lock).await?;
        match lost {
            false => Ok(released),
            true => Err(Error::Expired { released }),
        }
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
    /// True while the lock is safe to rely on: not reported lost, and its validity deadline not
    /// passed. No I/O: an atomic load and a monotonic clock read.
    pub fn is_held(&self) -> bool {
        self.kept.is_held()
    }

    /// Why the lock is lost, or `None` while it is held.
    pub fn lost(&self) -> Option<Error> {
        self.kept.loss()
    }

    /// When the lock stopped being this holder's; see [`KeepAlive::lost_at`].
    pub fn lost_at(&self) -> Option<Instant> {
        self.kept.lost_at()
    }

    /// The lock as it stands now.
    pub fn lock(&self) -> Lock {
        self.kept.lock()
    }

    /// The validity left now.
    pub fn validity(&self) -> Duration {
        self.kept.validity()
    }

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
        Ok(AsyncKeepAlive::new(
            self.clone(),
            self.blocking().keep(lock)?,
        ))
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
        let value =
            crate::api::reentry::Scoped::new(work(kept.watch()), engine, kept.inner.kept()).await;
        let lost = kept.lost();
        let _ = kept.release().await;
        match lost {
            None => Ok(value),
            Some(why) => Err(WithLockError::Lost { value, why }),
        }
    }
}
