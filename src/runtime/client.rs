//! [`Client`]: one engine owned by one thread, driven on the calling thread; and what turns an
//! engine's outcome into the public results (shared with `api/redlock.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::engine::request::{Outcome, ReqKind};
use crate::model::addr::NodeAddr;
use crate::model::config::{Builder, Config, Shared};
use crate::model::error::Error;
use crate::model::error::FenceRepair;
use crate::model::fence_floor::FenceFloor;
use crate::model::lock::Lock;
use crate::model::node_status::NodeStatus;
use crate::model::round::deadline_after;
use crate::model::stats::KeepStats;
use crate::model::token::Token;
use crate::runtime::driver::Driver;

/// One engine owned by one thread: its own connections to all nodes, driven on the calling
/// thread (`&mut self`), one operation at a time. `Send`, not shareable: see [`Redlock`](crate::Redlock) for a
/// handle many threads share (one engine, one connection per node).
///
/// Made by [`Client::new`], [`Builder::build_client`] or [`Redlock::client`](crate::Redlock::client).
///
/// ```no_run
/// use std::time::Duration;
///
/// let mut client = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .quarantine(None) // servers just started, never held a lock; in production keep the default
///     .build_client()?;
/// client.connect(Duration::from_secs(1)); // optional: connect now rather than on first use
/// let mut lock = client.lock("orders:42")?;
/// client.extend(&mut lock, Duration::from_secs(30))?;
/// client.unlock(lock)?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
pub struct Client {
    engine: Engine<Driver>,
    /// Counts this client's semaphore acquires: the permit an acquire attempts first is the
    /// count modulo P (`api/semaphore.rs`), so consecutive acquires rotate over the permits.
    permit_turn: u32,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.engine.shared.nodes)
            .finish_non_exhaustive()
    }
}

impl Client {
    crate::model::config::default_handle!(Client, build_client,
        /// A client with default settings.
    );

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Result<Client, Error> {
        let driver = Driver::new(&shared.nodes, &shared.conn)
            .map_err(|e| Error::system("create the event loop", e))?;
        Ok(Client {
            engine: Engine::new(shared, driver, Instant::now()),
            permit_turn: 0,
        })
    }

    /// The turn of this semaphore acquire (see `permit_turn`), and the count moved on.
    pub(crate) fn next_permit_turn(&mut self) -> u32 {
        let turn = self.permit_turn;
        self.permit_turn = turn.wrapping_add(1);
        turn
    }

    pub(crate) fn engine(&mut self) -> &mut Engine<Driver> {
        &mut self.engine
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.engine.shared.config
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.engine.shared.nodes
    }

    /// Votes needed: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.engine.shared.nodes.len() / 2 + 1
    }

    /// Connects to every node now, instead of on first use, and waits until each handshake is
    /// done, has failed, or `timeout` has passed; returns how many nodes are ready.
    ///
    /// Connections are otherwise made lazily inside the first attempt, whose per-node timeout
    /// (at most 50 ms by default) must then also cover connect and handshake: against distant
    /// masters, call this once before the first attempt.
    pub fn connect(&mut self, timeout: Duration) -> usize {
        self.engine.connect(timeout)
    }

    /// Bytes buffered per node: (unsent output, undecoded input). For tests of the buffer
    /// limits.
    pub(crate) fn buffered(&self) -> Vec<(usize, usize)> {
        self.engine.net.conns.iter().map(|c| c.buffered()).collect()
    }

    /// What this client's engine has counted so far, per node and per operation kind, and
    /// the syscalls of its connections and event loop (see [`Stats`](crate::Stats); `keep` and
    /// `io.wakes` stay zero: a client keeps no locks, and its caller drives its loop).
    pub fn stats(&self) -> crate::Stats {
        let io = self.engine.net.io().snapshot(0);
        (self.engine.metrics()).snapshot(&self.engine.shared.nodes, io, KeepStats::default())
    }

    /// Requests waiting for a reply, per node. For tests of connection failures.
    pub(crate) fn pending(&self) -> Vec<usize> {
        self.engine.net.conns.iter().map(|c| c.pending()).collect()
    }

    /// Drives the engine until no release is in flight or `deadline`. For tests.
    pub(crate) fn settle_releases(&mut self, deadline: Instant) -> bool {
        self.engine
            .drive_until(deadline, |e| e.unconfirmed_parts().0 == 0);
        self.engine.unconfirmed_parts().0 == 0
    }

    /// Callers of this engine waiting in the queue of `resource` (its head included). For
    /// tests.
    pub(crate) fn waiters(&mut self, resource: &[u8]) -> usize {
        self.engine.waiters(resource)
    }

    /// Alarms of async callers the engine still holds. For tests.
    pub(crate) fn alarms(&self) -> usize {
        self.engine.alarms()
    }

    /// Releases not confirmed yet: (in flight, waiting in the ledger for their node). For tests.
    pub(crate) fn unconfirmed(&self) -> (usize, usize) {
        self.engine.unconfirmed_parts()
    }

    /// One attempt to acquire `resource` with the configured TTL.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when another holder has it, [`Error::NoQuorum`] when too few nodes
    /// answered or counted (a node in its restart quarantine does not count, see
    /// [`Builder::quarantine`]), [`Error::TooSlow`] when the attempt ate the validity (or left
    /// less than [`Config::min_validity`]), [`Error::Fence`] when fencing is on and no fence
    /// could be made safe, [`Error::Auth`] when a node refused our credentials,
    /// [`Error::Permission`] when a node refused a command the client needs, [`Error::Config`]
    /// for a bad resource name.
    pub fn try_lock(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::acquire(self.config(), resource)?;
        let outcome = self.engine.run(kind, resource, &token);
        lock_of(resource, token, outcome)
    }

    /// One attempt on each of several resources at once: every node gets all the `SET`s in one
    /// write, and the rounds are decided side by side in one loop.
    ///
    /// # Errors
    ///
    /// Per resource, as [`Client::try_lock`].
    pub fn try_lock_many<R: AsRef<[u8]>>(&mut self, resources: &[R]) -> Vec<Result<Lock, Error>> {
        let config = self.engine.shared.config.clone();
        let prepared: Vec<Result<(ReqKind, Token), Error>> = resources
            .iter()
            .map(|r| ReqKind::acquire(&config, r.as_ref()))
            .collect();
        let mut outcomes = self
            .engine
            .run_all(
                prepared
                    .iter()
                    .zip(resources)
                    .filter_map(|(p, r)| p.as_ref().ok().map(|&(k, t)| (k, r.as_ref(), t))),
            )
            .into_iter();
        prepared
            .into_iter()
            .zip(resources)
            .map(|(p, r)| {
                let (_, token) = p?;
                match outcomes.next().flatten() {
                    Some(outcome) => lock_of(r.as_ref(), token, outcome),
                    None => Err(Error::Internal("operation lost")),
                }
            })
            .collect()
    }

    /// Acquires `resource`, waiting for it at most [`Config::lock_wait`] (4 s by default); see
    /// [`Client::lock_until`].
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`].
    pub fn lock(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let deadline = deadline_after(Instant::now(), self.config().lock_wait());
        self.lock_until(resource, deadline)
    }

    /// Acquires `resource`, waiting for it until `deadline`.
    ///
    /// A refused attempt is followed by another as soon as the resource is released — by a
    /// caller of the same engine (the attempt goes out right behind the release), or by any
    /// client that publishes a release notice (this crate does) — or else after the fallback
    /// poll (`retry_delay` plus up to `retry_jitter`). A split vote (another client's attempt
    /// took some nodes) is followed by a random pause that grows with every split in a row.
    /// Failures other than a refusal (too few nodes answered, too slow) are retried after the
    /// retry pause. At least one attempt is made; one still in flight at the deadline is
    /// waited for.
    ///
    /// # Errors
    ///
    /// The last attempt's error, as [`Client::try_lock`]; refused credentials or a bad name at
    /// once.
    pub fn lock_until(
        &mut self,
        resource: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = ReqKind::wait(self.config(), resource, deadline)?;
        let outcome = self.engine.run(kind, resource, &token);
        lock_of(resource, token, outcome)
    }

    /// One attempt at a shared (read) lock of `resource`; see [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`Client::try_lock`].
    pub fn try_lock_shared(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.try_lock(crate::Shared::new(resource)?)
    }

    /// A shared (read) lock of `resource`, waiting until `deadline`; see
    /// [`Shared`](crate::Shared).
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`].
    pub fn lock_shared_until(
        &mut self,
        resource: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        self.lock_until(crate::Shared::new(resource)?, deadline)
    }

    /// Waits until `until` while consuming late replies (instead of sleeping blind), and
    /// sending the releases kept for nodes that were down when they come back (a `Client` has
    /// no background thread to do it).
    pub fn idle_until(&mut self, until: Instant) {
        self.engine.drive_until_woken(until, |_| false, true);
    }

    /// Releases the lock on every node and reports how many still held it.
    ///
    /// Waits for the replies at most the per-node timeout. A node still answering earlier
    /// requests gets a short grace (four times what the last round took, at least a tenth of the
    /// node timeout); one that missed it is slow or frozen and is not waited for again until it
    /// has caught up (it still gets the release; its reply is consumed later). The count is of
    /// the nodes that answered in time. A release a node could not confirm (its connection
    /// failed, or it was down) is sent again when the node is reachable, while the key could
    /// still live.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] when the lock's validity had run out before the call (the release is
    /// still sent, and the error says how many nodes still held it).
    pub fn unlock(&mut self, lock: Lock) -> Result<usize, Error> {
        let expired = !lock.is_valid();
        let outcome = self
            .engine
            .run(ReqKind::Release, lock.resource(), lock.token());
        released_of(expired, outcome)
    }

    /// Extends the lock to `ttl` from now, on a quorum, within its current validity. `PEXPIRE`
    /// takes whole milliseconds: a fraction of one is not sent, and not counted in the new
    /// validity.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] if its validity ran out first, [`Error::ExtensionLimit`] past the
    /// configured number of extensions, [`Error::Held`] when nodes no longer hold our token,
    /// [`Error::NoQuorum`] / [`Error::TooSlow`] as for acquiring. [`Error::Config`], with
    /// nothing sent and the validity unchanged, for a `ttl` above [`Config::longest_ttl`] or
    /// one that leaves no more validity than [`Config::min_validity`] after the drift
    /// allowance.
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let backing = lock.backing(&self.engine.shared.nodes);
        let kind = ReqKind::extend(self.config(), (lock, backing), ttl, Instant::now())?;
        let outcome = self.engine.run(kind, lock.resource(), lock.token());
        apply_extend(lock, outcome, &self.engine.shared.nodes)
    }

    /// Asks every node for the resource's value and remaining TTL (`GET` and `PTTL`), its
    /// readers if it is read-locked ([`NodeStatus::readers`](crate::NodeStatus::readers)) and
    /// the fence counter, waiting at most `timeout`. For inspection (`redlock status`); not a
    /// lock operation. A [`Shared`](crate::Shared) name is asked as its resource's; a
    /// [`ResourceSet`](crate::ResourceSet) is not one key: ask each member.
    pub fn status(&mut self, resource: impl AsRef<[u8]>, timeout: Duration) -> Vec<NodeStatus> {
        let kind = ReqKind::Status { timeout };
        status_of(self.engine.run(kind, resource.as_ref(), &Token::EMPTY))
    }

    /// Repairs blank fence counters; see [`Redlock::repair_fences`](crate::Redlock::repair_fences).
    ///
    /// # Errors
    ///
    /// As [`Redlock::repair_fences`](crate::Redlock::repair_fences).
    pub fn repair_fences(
        &mut self,
        floor: FenceFloor,
        timeout: Duration,
    ) -> Result<FenceRepair, Error> {
        let kind = ReqKind::repair(self.config(), floor, timeout)?;
        repaired_of(self.engine.run(kind, b"", &Token::EMPTY))
    }
}

/// The lock an acquire's outcome gives.
pub(crate) fn lock_of(resource: &[u8], token: Token, outcome: Outcome) -> Result<Lock, Error> {
    match outcome {
        Outcome::Acquired(Ok(grant)) => Ok(Lock::granted(resource, token, grant)),
        Outcome::Acquired(Err(e)) => Err(e),
        Outcome::Locked(Ok((variant, grant))) => {
            Ok(Lock::granted(resource, token.variant(variant), grant))
        }
        Outcome::Locked(Err(e)) => Err(e),
        _ => unreachable_outcome(Err(Error::Internal("unexpected outcome"))),
    }
}

/// What a status read returns.
pub(crate) fn status_of(outcome: Outcome) -> Vec<NodeStatus> {
    match outcome {
        Outcome::Status(s) => s,
        _ => unreachable_outcome(Vec::new()),
    }
}

/// What a fence repair returns.
pub(crate) fn repaired_of(outcome: Outcome) -> Result<FenceRepair, Error> {
    match outcome {
        Outcome::Repaired(result) => result,
        _ => unreachable_outcome(Err(Error::Internal("unexpected outcome"))),
    }
}

/// What an unlock returns.
pub(crate) fn released_of(expired: bool, outcome: Outcome) -> Result<usize, Error> {
    let released = match outcome {
        Outcome::Released(n) => n,
        _ => unreachable_outcome(0),
    };
    if expired {
        Err(Error::Expired { released })
    } else {
        Ok(released)
    }
}

/// Applies an extend's outcome, through an engine of `servers`, to the lock: the validity
/// after it (cut short if it was lost) and the nodes that back it.
pub(crate) fn apply_extend(
    lock: &mut Lock,
    outcome: Outcome,
    servers: &[NodeAddr],
) -> Result<(), Error> {
    match outcome {
        Outcome::Extended(valid_until, result) => {
            let extensions = lock.extensions() + u32::from(result.is_ok());
            lock.set_state(valid_until, extensions);
            let (won, votes) = crate::model::lock::extend_votes(&result);
            lock.extended_on(servers, won, votes);
            result.map(|_| ())
        }
        _ => unreachable_outcome(Err(Error::Internal("unexpected outcome"))),
    }
}

fn unreachable_outcome<T>(fallback: T) -> T {
    // Each request kind has its outcome kind; reaching here would be a bug in the engine.
    debug_assert!(false, "outcome of the wrong kind");
    fallback
}

impl Builder {
    /// A client owned by one thread.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`](crate::Builder::build).
    pub fn build_client(self) -> Result<Client, Error> {
        Client::from_shared(self.shared()?)
    }
}
