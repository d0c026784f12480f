//! [`Redlock`]: the handle many threads share — one engine (see `hub.rs`) behind an `Arc`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::addr::NodeAddr;
use crate::client::{Client, apply_extend, lock_of, released_of, status_of};
use crate::config::{Builder, Config, Shared};
use crate::conn::IoStats;
use crate::engine::Shutdown;
use crate::error::Error;
use crate::hub::Hub;
use crate::lock::Lock;
use crate::request::{NodeStatus, ReqKind};
use crate::round::deadline_after;
use crate::token::Token;

impl Builder {
    /// A handle for many threads.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty or duplicate server list, an unparsable address or a bad
    /// setting.
    pub fn build(self) -> Result<Redlock, Error> {
        let shared = self.shared()?;
        let hub = Hub::start(Client::from_shared(shared.clone())?)?;
        Ok(Redlock {
            handle: Arc::new(Handle { shared, hub }),
        })
    }
}

struct Handle {
    shared: Arc<Shared>,
    hub: Arc<Hub>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The engine thread flushes unconfirmed releases (bounded), then stops.
        self.hub.close();
    }
}

/// A lock client for many threads: `Send + Sync + Clone`, methods take `&self`.
///
/// All clones share one engine: one connection per node and one `mio` loop, with any number of
/// operations in flight from any number of threads. Every command queued for a node during a
/// turn of the loop goes out in one `write`; replies are matched to their operations in order.
/// A caller that finds the loop idle drives it itself (no thread hop); callers arriving while
/// it runs hand their request over and park until their outcome is in. A background thread
/// (`redlock-engine`) takes the loop over while callers wait and nobody else drives it.
///
/// ```no_run
/// let redlock = redlock_mux::Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = redlock.lock("orders:42")?;
/// // ... work, within lock.validity() ...
/// let released = redlock.unlock(lock)?;
/// assert_eq!(released, 3);
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Clone)]
pub struct Redlock {
    handle: Arc<Handle>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.handle.shared.nodes)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// A handle with default settings.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`](crate::Builder::build).
    pub fn new<I, S>(servers: I) -> Result<Redlock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder::new(servers).build()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.handle.shared.config
    }

    pub(crate) fn hub(&self) -> &Hub {
        &self.handle.hub
    }

    /// Keep-alive counters so far: (ticks that extended locks, `write` calls in them, locks
    /// extended). For tests of the batching.
    #[doc(hidden)]
    pub fn keeper_stats(&self) -> (u64, u64, u64) {
        let s = &self.handle.shared;
        (
            s.keep_ticks.load(Ordering::Relaxed),
            s.keep_writes.load(Ordering::Relaxed),
            s.keep_extended.load(Ordering::Relaxed),
        )
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.handle.shared.nodes
    }

    /// A new client owned by the caller, with connections of its own, sharing this handle's
    /// configuration.
    ///
    /// # Errors
    ///
    /// If the event loop cannot be created.
    pub fn client(&self) -> Result<Client, Error> {
        Client::from_shared(self.handle.shared.clone())
    }

    /// Runs `f` with the handle's engine, once the loop is free (requests other threads queue
    /// meanwhile are served by whatever `f` does, or wait until it returns). For inspection and
    /// tests; not for the hot path.
    ///
    /// # Errors
    ///
    /// None today; kept fallible for compatibility.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client) -> R) -> Result<R, Error> {
        let hub = &self.handle.hub;
        let mut guard = hub.engine();
        let result = f(&mut guard);
        hub.leave(guard);
        Ok(result)
    }

    /// Syscalls made so far by the shared engine's connections and poll loop, and how often a
    /// caller had to wake the loop (`wakes`).
    pub fn io_stats(&self) -> IoStats {
        let hub = &self.handle.hub;
        let mut stats = self.with_client(|c| c.io_stats()).unwrap_or_default();
        stats.wakes = hub.mailbox.wakes.load(Ordering::Relaxed) as u64;
        stats
    }

    /// Connects the shared engine to every node now; see [`Client::connect`](crate::Client::connect).
    ///
    /// # Errors
    ///
    /// None today; kept fallible for compatibility.
    pub fn connect(&self, timeout: Duration) -> Result<usize, Error> {
        self.with_client(|c| c.connect(timeout))
    }

    /// One attempt; see [`Client::try_lock`](crate::Client::try_lock).
    ///
    /// # Errors
    ///
    /// As [`Client::try_lock`](crate::Client::try_lock).
    pub fn try_lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::acquire(self.config(), resource)?;
        let outcome = self.handle.hub.call(kind, resource, &token);
        lock_of(resource, token, outcome)
    }
    /// Acquire, waiting at most [`Config::lock_wait`]; see [`Client::lock_until`].
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`].
    pub fn lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let deadline = deadline_after(Instant::now(), self.config().lock_wait());
        self.lock_until(resource, deadline)
    }
    /// Acquire, waiting until `deadline`; see [`Client::lock_until`]. Callers of this handle
    /// that wait for the same resource queue in arrival order; only the first competes on the
    /// wire, and a release by one of them hands the resource to the next at once.
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`].
    pub fn lock_until(&self, resource: impl AsRef<[u8]>, deadline: Instant) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::wait(self.config(), resource, deadline)?;
        let outcome = self.handle.hub.call(kind, resource, &token);
        lock_of(resource, token, outcome)
    }
    /// Release; see [`Client::unlock`](crate::Client::unlock).
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`](crate::Client::unlock).
    pub fn unlock(&self, lock: Lock) -> Result<usize, Error> {
        let expired = !lock.is_valid();
        let outcome = self
            .handle
            .hub
            .call(ReqKind::Release, lock.resource(), lock.token());
        released_of(expired, outcome)
    }
    /// Releases the lock without waiting for the nodes' replies: the release is queued on the
    /// shared engine and written within the current (or next) turn of its loop. Half the
    /// hand-offs of [`Redlock::unlock`] under load. A node that cannot confirm it (down, or its
    /// connection fails) gets it again when reachable, while the key could live;
    /// [`Redlock::shutdown`] waits for every release to be confirmed and says how many were.
    pub fn unlock_nowait(&self, lock: Lock) {
        self.handle
            .hub
            .send(ReqKind::Release, lock.resource(), lock.token());
    }
    /// Extend; see [`Client::extend`](crate::Client::extend).
    ///
    /// # Errors
    ///
    /// As [`Client::extend`](crate::Client::extend).
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let kind = ReqKind::extend(self.config(), lock, ttl, Instant::now())?;
        let outcome = self.handle.hub.call(kind, lock.resource(), lock.token());
        apply_extend(lock, outcome)
    }
    /// What every node says about `resource`; see [`Client::status`](crate::Client::status).
    pub fn status(&self, resource: &[u8], timeout: Duration) -> Vec<NodeStatus> {
        status_of(
            self.handle
                .hub
                .call(ReqKind::Status { timeout }, resource, &Token::EMPTY),
        )
    }
    /// Sends every release not confirmed yet (in flight, or waiting for its node to come back)
    /// and waits for their replies, at most `timeout`; says how many were confirmed. Dropping
    /// the last handle does the same in the background, bounded by the connect timeout.
    pub fn shutdown(&self, timeout: Duration) -> Shutdown {
        self.handle.hub.shutdown(timeout)
    }
}
