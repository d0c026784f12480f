//! [`Redlock`]: the handle many threads share — one engine (see `hub.rs`) behind an `Arc`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::engine::Shutdown;
use crate::engine::request::ReqKind;
use crate::model::addr::NodeAddr;
use crate::model::config::{Builder, Config, Shared};
use crate::model::error::Error;
use crate::model::error::FenceRepair;
use crate::model::fence_floor::FenceFloor;
use crate::model::lock::Lock;
use crate::model::lock_options::LockOptions;
use crate::model::node_status::NodeStatus;
use crate::model::round::deadline_after;
use crate::model::stats::{IoCounters, KeepStats, Metrics, Stats};
use crate::model::token::Token;
use crate::runtime::client::{Client, apply_extend, lock_of, released_of, repaired_of, status_of};
use crate::runtime::hub::Hub;

impl Builder {
    /// A handle for many threads ([`Redlock`]). Checks the settings and addresses and starts
    /// the handle's engine; it does not connect (connections are made on first use, or by
    /// [`Redlock::connect`]), so servers that are down do not make it fail.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::Builder;
    ///
    /// let redlock = Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .ttl(Duration::from_secs(10))
    ///     .build()?;
    /// assert_eq!(redlock.nodes().len(), 3);
    ///
    /// // A bad setting is refused here, before anything is sent.
    /// let refused = Builder::new(["redis://127.0.0.1:7001"]).ttl(Duration::ZERO).build();
    /// assert!(matches!(refused, Err(redlock_mux::Error::Config(_))));
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty or duplicate server list, more than
    /// [`MAX_NODES`](crate::MAX_NODES) servers, an unparsable address or a bad setting (each
    /// [`Builder`] method says which values it accepts). [`Error::System`] if the event loop
    /// or the engine's thread cannot be created.
    pub fn build(self) -> Result<Redlock, Error> {
        let shared = self.shared()?;
        let mut client = Client::from_shared(shared.clone())?;
        let metrics = client.engine().metrics().clone();
        let io = client.engine().net.io().clone();
        let hub = Hub::start(client)?;
        Ok(Redlock {
            handle: Arc::new(Handle {
                shared,
                hub,
                metrics,
                io,
            }),
        })
    }
}

struct Handle {
    shared: Arc<Shared>,
    hub: Arc<Hub>,
    /// The engine's counters: read without waiting for the loop.
    metrics: Arc<Metrics>,
    /// The syscall counters of the engine's connections and loop, likewise.
    io: Arc<IoCounters>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The engine thread flushes unconfirmed releases (bounded), then stops.
        self.hub.close();
    }
}

/// A lock client for many threads: `Send + Sync + Clone`, methods take `&self`. Built by
/// [`Redlock::new`] or [`Builder::build`].
///
/// All clones share one engine: one connection per node and one `mio` loop, with any number of
/// operations in flight from any number of threads. Every command queued for a node during a
/// turn of the loop goes out in one `write`; replies are matched to their operations in order.
/// A caller that finds the loop idle drives it itself (no thread hop); callers arriving while
/// it runs hand their request over and park until their outcome is in. A background thread
/// (`redlock-engine`) takes the loop over while callers wait and nobody else drives it.
///
/// Ways to hold a lock: [`lock`](Redlock::lock) / [`try_lock`](Redlock::try_lock) /
/// [`lock_until`](Redlock::lock_until) then [`unlock`](Redlock::unlock);
/// [`guard`](Redlock::guard) (released when dropped); [`keep`](Redlock::keep) (renewed in the
/// background); [`with_lock`](Redlock::with_lock) (kept for the length of a closure).
///
/// ```no_run
/// let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .quarantine(None) // servers just started, never held a lock; in production keep the default
///     .build()?;
/// let lock = redlock.lock("orders:42")?;
/// // ... work, within lock.validity() ...
/// let released = redlock.unlock(lock)?;
/// assert_eq!(released, 3);
/// # Ok::<(), redlock_mux::Error>(())
/// ```
///
/// [`Redlock::new`] keeps the default restart quarantine ([`Builder::quarantine`]): on servers
/// started less than a TTL (30 s) ago, every lock is refused until then.
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
    crate::model::config::default_handle!(Redlock, build,
        /// A handle with default settings: `Builder::new(servers).build()`.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// let redlock = redlock_mux::Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
        /// # Ok::<(), redlock_mux::Error>(())
        /// ```
    );

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.handle.shared.config
    }

    pub(crate) fn hub(&self) -> &Hub {
        &self.handle.hub
    }

    /// Identifies the engine (shared by every clone and the async face): its hub's address.
    pub(crate) fn engine_id(&self) -> usize {
        std::ptr::from_ref::<Hub>(&self.handle.hub) as usize
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
    /// `f` must not call into this handle (or its async face, or a clone), nor may a
    /// `with_client` closure of another handle nested in `f`: the engine is its thread's until
    /// `f` returns. Such a call fails at once with [`Error::Reentrant`] (a
    /// [`Redlock::status`] gives no node, a [`Redlock::shutdown`] flushes nothing) rather than
    /// wait for itself; use the `Client` `f` is given. Releases not waited for (a guard's drop,
    /// [`Redlock::unlock_nowait`]) are queued and go out once `f` returns. Two threads that
    /// nest `with_client` closures of two handles in opposite orders wait for each other, as
    /// two mutexes taken in opposite orders do: nest them in one order.
    ///
    /// # Errors
    ///
    /// [`Error::Reentrant`] when called from `with_client`'s closure of the same handle, or
    /// from a closure nested in one.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client) -> R) -> Result<R, Error> {
        self.handle.hub.with_client(f)
    }

    /// What the shared engine has counted so far, per node and per operation kind: requests,
    /// replies, timeouts, reconnects, latency histograms; its syscalls and the renewals of kept
    /// locks (see [`Stats`]). Reads atomics: it never waits for the loop, and costs the caller
    /// one allocation per node for the snapshot. The counters are always on.
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
    /// let stats = redlock.stats();
    /// for node in &stats.nodes {
    ///     println!("{}: {} requests, {} timeouts, p99 {:?}", node.node, node.requests,
    ///         node.timeouts, node.latency.percentile(99.0));
    /// }
    /// println!("acquires: {} won, {} held elsewhere", stats.acquire.ok, stats.acquire.refused);
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let Handle {
            shared,
            hub,
            metrics,
            io,
        } = &*self.handle;
        let io = io.snapshot(hub.mailbox.wakes.load(Ordering::Relaxed) as u64);
        let keep = KeepStats {
            batches: shared.keep_ticks.load(Ordering::Relaxed),
            writes: shared.keep_writes.load(Ordering::Relaxed),
            extended: shared.keep_extended.load(Ordering::Relaxed),
            retried: shared.keep_retried.load(Ordering::Relaxed),
        };
        metrics.snapshot(&shared.nodes, io, keep)
    }

    /// Connects the shared engine to every node now; see [`Client::connect`](crate::Client::connect).
    ///
    /// # Errors
    ///
    /// None today; kept fallible for compatibility.
    pub fn connect(&self, timeout: Duration) -> Result<usize, Error> {
        self.with_client(|c| c.connect(timeout))
    }

    /// One attempt to acquire `resource` with the configured TTL: no waiting for a held
    /// resource. See [`Client::try_lock`](crate::Client::try_lock).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlock_mux::Error;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// match redlock.try_lock("orders:42") {
    ///     Ok(lock) => {
    ///         // ... work within lock.validity() ...
    ///         redlock.unlock(lock)?;
    ///     }
    ///     Err(Error::Held(_)) => println!("busy: someone else holds orders:42"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::try_lock`](crate::Client::try_lock): [`Error::Held`] when another holder
    /// has it, [`Error::NoQuorum`] when too few nodes answered (or counted), among others;
    /// [`Error::ReservedName`] for a name starting with `redlock:`; [`Error::AlreadyHeld`]
    /// from inside the work of a [`Redlock::with_lock`] of the same resource.
    pub fn try_lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::acquire(self.config(), resource)?;
        crate::api::reentry::check(self.engine_id(), resource)?;
        let outcome = self.handle.hub.call(kind, resource, &token)?;
        lock_of(resource, token, outcome)
    }
    /// Acquires `resource`, waiting for it at most [`Config::lock_wait`] (4 s by default; not
    /// forever, as std's `Mutex::lock` does: [`Redlock::try_lock_for`] and
    /// [`Redlock::lock_until`] wait as long as told); see [`Redlock::lock_until`] for how it
    /// waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let lock = redlock.lock("orders:42")?;
    /// println!("held for {:?} more", lock.validity());
    /// redlock.unlock(lock)?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`]: the last attempt's error — [`Error::Held`] if the resource
    /// was still held at the end of the wait.
    pub fn lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let deadline = deadline_after(Instant::now(), self.config().lock_wait());
        self.lock_until(resource, deadline)
    }
    /// Acquires `resource`, waiting for it until `deadline`; see [`Client::lock_until`].
    /// Callers of this handle that wait for the same resource queue in arrival order; only the
    /// first competes on the wire, and a release by one of them hands the resource to the next
    /// at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::{Duration, Instant};
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let lock = redlock.lock_until("orders:42", Instant::now() + Duration::from_secs(10))?;
    /// redlock.unlock(lock)?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`]: the last attempt's error — [`Error::Held`] if the resource
    /// was still held at the deadline.
    pub fn lock_until(&self, resource: impl AsRef<[u8]>, deadline: Instant) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::wait(self.config(), resource, deadline)?;
        crate::api::reentry::check(self.engine_id(), resource)?;
        let outcome = self.handle.hub.call(kind, resource, &token)?;
        lock_of(resource, token, outcome)
    }
    /// Acquires `resource` with the TTL and the wait of `options`, the handle's settings for
    /// what it leaves out: a lock of another TTL than the handle's, or a wait given as a
    /// duration. A zero wait is one attempt ([`Redlock::try_lock`]); otherwise the wait is
    /// [`Redlock::lock_until`]'s, until now + the wait. Extends and keep-alives of the lock take
    /// their own TTL ([`Redlock::extend`]) or the handle's.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::LockOptions;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let options = LockOptions::new().ttl(Duration::from_secs(2)).wait(Duration::from_secs(30));
    /// let lock = redlock.lock_with("report:daily", options)?;
    /// redlock.unlock(lock)?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock_until`] (or [`Redlock::try_lock`] for a zero wait), and
    /// [`Error::Config`] for a TTL that is zero, longer than
    /// [`Config::longest_ttl`](crate::Config::longest_ttl) (the restart quarantine must
    /// outlive the lock: raise `Builder::max_ttl`) or too short to leave any validity; nothing
    /// is sent then.
    pub fn lock_with(
        &self,
        resource: impl AsRef<[u8]>,
        options: LockOptions,
    ) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = self.request_with(resource, options)?;
        let outcome = self.handle.hub.call(kind, resource, &token)?;
        lock_of(resource, token, outcome)
    }

    /// The request of a [`Redlock::lock_with`] (of either face), checked: its options, and
    /// not from inside a `with_lock` of the same resource.
    pub(crate) fn request_with(
        &self,
        resource: &[u8],
        options: LockOptions,
    ) -> Result<(ReqKind, Token), Error> {
        let request = ReqKind::with_options(self.config(), resource, options, Instant::now())?;
        crate::api::reentry::check(self.engine_id(), resource)?;
        Ok(request)
    }

    /// Acquires `resource`, waiting for it at most `wait` (the shape of `try_lock_for` in
    /// `parking_lot`): [`Redlock::lock_with`] with that wait.
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock_until`]: [`Error::Held`] if the resource was still held when the
    /// wait ran out.
    pub fn try_lock_for(&self, resource: impl AsRef<[u8]>, wait: Duration) -> Result<Lock, Error> {
        self.lock_with(resource, LockOptions::new().wait(wait))
    }

    /// One attempt at a shared (read) lock of `resource`: many readers at once, none with a
    /// writer (an ordinary lock of `resource`); see [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`Redlock::try_lock`]: [`Error::Held`] while a writer holds it or waits for it.
    pub fn try_lock_shared(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.try_lock(crate::Shared::new(resource)?)
    }

    /// A shared (read) lock of `resource`, waiting at most [`Config::lock_wait`] as
    /// [`Redlock::lock`] does; see [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock_until`].
    pub fn lock_shared(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.lock(crate::Shared::new(resource)?)
    }

    /// A shared (read) lock of `resource`, waiting until `deadline`; see
    /// [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock_until`].
    pub fn lock_shared_until(
        &self,
        resource: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        self.lock_until(crate::Shared::new(resource)?, deadline)
    }

    /// Releases the lock on every node and returns how many still held it; see
    /// [`Client::unlock`](crate::Client::unlock) for how long it waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let lock = redlock.lock("orders:42")?;
    /// let released = redlock.unlock(lock)?;
    /// println!("released on {released} of 3 nodes");
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`](crate::Client::unlock): [`Error::Expired`] when the lock's validity
    /// had run out before the call (the release is still sent).
    pub fn unlock(&self, lock: Lock) -> Result<usize, Error> {
        let expired = !lock.is_valid();
        let hub = &self.handle.hub;
        let outcome = match hub.call(ReqKind::Release, lock.resource(), lock.token()) {
            Ok(outcome) => outcome,
            Err(e) => {
                // From `with_client`'s closure: the release is queued, as `unlock_nowait` does
                // (it goes out once the closure returns), rather than lost with the lock.
                hub.send(ReqKind::Release, lock.resource(), lock.token());
                return Err(e);
            }
        };
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
    /// Extends the lock to `ttl` from now, on a quorum, within its current validity; on
    /// success `lock`'s validity is updated. See [`Client::extend`](crate::Client::extend).
    /// `ttl` may not exceed [`Config::longest_ttl`] (the TTL, or [`Builder::max_ttl`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// let mut lock = redlock.lock("orders:42")?;
    /// // ... a first part of the work ...
    /// redlock.extend(&mut lock, Duration::from_secs(30))?;
    /// assert_eq!(lock.extensions(), 1);
    /// // ... the rest, within lock.validity() ...
    /// redlock.unlock(lock)?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::extend`](crate::Client::extend): [`Error::Expired`] if the validity ran
    /// out first, [`Error::Held`] when the nodes no longer hold our token,
    /// [`Error::ExtensionLimit`], [`Error::Config`] for a `ttl` above the longest allowed or
    /// one too short to leave [`Config::min_validity`] (nothing is sent then).
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let backing = lock.backing(&self.handle.shared.nodes);
        let kind = ReqKind::extend(self.config(), (lock, backing), ttl, Instant::now())?;
        let outcome = self.handle.hub.call(kind, lock.resource(), lock.token())?;
        apply_extend(lock, outcome, &self.handle.shared.nodes)
    }
    /// What every node says about `resource` (its value and remaining TTL, or why the node
    /// could not be asked), waiting at most `timeout`; see
    /// [`Client::status`](crate::Client::status). For inspection, not a lock operation.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
    /// for node in redlock.status(b"orders:42", Duration::from_millis(500)) {
    ///     // The value's token, and its owner if the holder recorded one (`Config::owner`).
    ///     let (token, owner) = (node.token(), node.owner());
    ///     match &node.state {
    ///         Ok((Some(_), pttl)) => {
    ///             println!("{}: held by {token:?} ({owner:?}) for {pttl} ms", node.node)
    ///         }
    ///         Ok((None, _)) => println!("{}: free", node.node),
    ///         Err(fault) => println!("{}: {fault}", node.node),
    ///     }
    /// }
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn status(&self, resource: impl AsRef<[u8]>, timeout: Duration) -> Vec<NodeStatus> {
        // From `with_client`'s closure (`Error::Reentrant`): no node could be asked.
        (self.handle.hub)
            .call(
                ReqKind::Status { timeout },
                resource.as_ref(),
                &Token::EMPTY,
            )
            .map_or_else(|_| Vec::new(), status_of)
    }
    /// Repairs blank fence counters, so that fenced acquires work again after a majority of
    /// the servers lost their counters (restarted; or a new deployment whose first write-back
    /// reached a minority): fenced acquires then fail with [`Error::Fence`] until an operator
    /// steps in, since a blank counter is seeded only from a quorum of seeded ones. For
    /// operators (`redlock repair-fences`), not for the hot path.
    ///
    /// Reads every node's counter (`HMGET redlock:fence run n`), then raises every counter it
    /// may to `V`, the larger of `floor` and every counter read, and marks it complete for the
    /// node's current server process — on each node that was seeded, or blank and up for the
    /// whole seed window (the restart quarantine's window, at least the longest TTL) before
    /// the repair began. A counter is only ever raised. Each of the two round trips waits at
    /// most `timeout` for the answers (and never longer than half the seed window). The handle
    /// must have fencing on ([`Builder::fencing`]), with the seed window of the fenced
    /// clients (at least their longest TTL: [`Builder::quarantine`], [`Builder::max_ttl`]).
    ///
    /// What it assumes, by floor (the argument: docs/fencing.md, "Repair"):
    ///
    /// - [`FenceFloor::SeededQuorum`]: nothing beyond fencing's own assumptions. It repairs
    ///   only if it reads a quorum of seeded counters (a minority was blank), and writes nothing
    ///   otherwise ([`FenceRepair::needs_floor`]).
    /// - [`FenceFloor::AtLeast`]`(f)`: every fence handed out before the repair began is at
    ///   most `f`. Then fences keep growing across the repair, for every pair of acquisitions.
    /// - [`FenceFloor::EarlierHoldersStopped`]: no holder of a fence handed out before the
    ///   repair will present it after the repair. Fences handed out after the repair grow among
    ///   themselves, but may be lower than earlier ones.
    ///
    /// A fenced acquire that begins after a successful repair gets a fence above
    /// [`FenceRepair::value`]; acquires in flight during the repair may return lower fences,
    /// still in order with every other fence.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::{Builder, FenceFloor};
    ///
    /// let redlock = Builder::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    ///     .fencing(true)
    ///     .build()?;
    /// // The protected store has accepted fences up to 41,277; a margin covers fences handed
    /// // out and not yet presented.
    /// let repair = redlock.repair_fences(FenceFloor::AtLeast(41_277 + 1_000_000), Duration::from_secs(1))?;
    /// for node in &repair.nodes {
    ///     println!("{}: {:?} -> {:?} {}", node.node, node.before, node.after,
    ///         node.fault.as_ref().map(|f| f.to_string()).unwrap_or_default());
    /// }
    /// println!("fences from now on are above {}", repair.value);
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::FenceRepair`] when fewer than a quorum of counters were left repaired (nodes
    /// unreachable, blank inside their seed window, duplicates; or no floor and too few seeded
    /// counters: then nothing was written), with every node's reading and fault.
    /// [`Error::Config`] when fencing is off, for a zero `timeout`, or a floor of `u64::MAX`.
    pub fn repair_fences(
        &self,
        floor: FenceFloor,
        timeout: Duration,
    ) -> Result<FenceRepair, Error> {
        let kind = ReqKind::repair(self.config(), floor, timeout)?;
        repaired_of(self.handle.hub.call(kind, b"", &Token::EMPTY)?)
    }
    /// Sends every release not confirmed yet (in flight, or waiting for its node to come back)
    /// and waits for their replies, at most `timeout`; says how many were confirmed. Dropping
    /// the last handle does the same in the background, bounded by the connect timeout.
    pub fn shutdown(&self, timeout: Duration) -> Shutdown {
        self.handle.hub.shutdown(timeout)
    }
}
