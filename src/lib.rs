//! # redlock-mux
//!
//! A [Redlock](https://redis.io/docs/latest/develop/use/patterns/distributed-locks/) client: a
//! lock over N independent Redis masters that stays safe while a majority of them is up.
//!
//! What sets it apart: its own RESP2/RESP3 codec (no Redis client crate), one `mio` event loop
//! that sends `SET … NX PX` to all N masters at once and decides at the first reply that settles
//! the quorum, and release/extend scripts sent by hash (`EVALSHA`, falling back to `EVAL`).
//!
//! ## Quick start
//!
//! A [`Redlock`] handle is `Send + Sync + Clone`: build it once and share it between threads.
//! Connections are made on first use.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_mux::Builder;
//!
//! let redlock = Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .quarantine(None) // servers just started, never held a lock; in production keep the default
//!     .build()?;
//!
//! let mut lock = redlock.lock("invoice:42")?; // waits for the resource, at most 4 s by default
//! assert!(lock.validity() > Duration::from_secs(29)); // 30 s TTL − elapsed − drift
//! // ... work that must finish within lock.validity() ...
//! redlock.extend(&mut lock, Duration::from_secs(30))?;
//! let released = redlock.unlock(lock)?; // how many nodes still held it
//! # let _ = released;
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! **About `quarantine(None)`.** By default a node that restarted less than a TTL ago does not
//! count towards a quorum ([`Builder::quarantine`]): a node that restarted without its keys
//! could otherwise grant a lock that is still held elsewhere. Servers started a moment ago look
//! exactly like that, so for one TTL every lock on them is refused ([`Error::NoQuorum`], each
//! node "restarted recently, quarantined"). Switching the quarantine off is right for fresh
//! servers that never held a lock (tests, demos) and for servers that never lose keys; in
//! production keep the default.
//!
//! ## Ways to hold a lock
//!
//! | Call | Gives | Released by |
//! |---|---|---|
//! | [`Redlock::lock`], [`try_lock`](Redlock::try_lock), [`lock_until`](Redlock::lock_until) | [`Lock`], plain data | [`Redlock::unlock`] (or its TTL) |
//! | [`Redlock::guard`] | [`LockGuard`] | dropping it, or [`LockGuard::unlock`] |
//! | [`Redlock::keep`] | [`KeepAlive`], renewed in the background | dropping it, or [`KeepAlive::release`] |
//! | [`Redlock::with_lock`] | a kept lock for the length of a closure | the end of the closure |
//!
//! `lock` waits for a held resource (at most [`Config::lock_wait`], 4 s by default),
//! `try_lock` makes one attempt, `lock_until` waits until a deadline. A [`Lock`] is valid for
//! [`Lock::validity`]; [`Redlock::extend`] gives it a new TTL.
//!
//! ### `guard`: released when dropped
//!
//! ```no_run
//! # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
//! use std::time::Duration;
//!
//! let mut guard = redlock.guard("orders:42")?;
//! // ... work within guard.validity() (the guard derefs to the Lock) ...
//! guard.extend(Duration::from_secs(30))?;
//! drop(guard); // queues the release on every node; never waits
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! ### `keep`: renewed until released, with notice of a loss
//!
//! For work of unknown length. The handle extends the lock when a third of its TTL is left,
//! and tries again after a backoff when a renewal is lost while the nodes that back the lock
//! still can make a quorum; once no renewal can win (our token gone from too many of those
//! nodes, or no time left), [`KeepAlive::is_held`] turns false at once.
//!
//! ```no_run
//! # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
//! let kept = redlock.keep(redlock.lock("report:daily")?)?;
//! kept.on_lost(|why| eprintln!("lock lost: {why}")); // optional, on a thread of its own
//! for batch in 0..1000 {
//!     if !kept.is_held() {
//!         break; // lost: stop touching the resource
//!     }
//!     // ... process batch ...
//! }
//! kept.release()?; // or drop it, which releases too
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! ### `with_lock`: a kept lock for the length of a closure
//!
//! `Ok` only if the lock was held from start to end of the closure; a lock lost while it ran
//! is [`WithLockError::Lost`], with the closure's value (through `?`, [`Error::Lost`]).
//!
//! ```no_run
//! # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
//! let done = redlock.with_lock("report:weekly", |held| {
//!     let mut n = 0;
//!     while held.is_held() && n < 100 {
//!         n += 1; // ... one step of the work ...
//!     }
//!     n
//! })?; // Error::Lost if the lock was lost before the closure returned
//! println!("{done} steps under the lock");
//! # Ok::<(), redlock_mux::Error>(())
//! ```
//!
//! ### Async
//!
//! [`AsyncRedlock`] is the same handle seen through futures, usable from any executor:
//! [`guard`](AsyncRedlock::guard) ([`AsyncLockGuard`]), [`keep`](AsyncRedlock::keep)
//! ([`AsyncKeepAlive`]), [`with_lock`](AsyncRedlock::with_lock) (its work gets a
//! [`LockWatch`]), and `lock`, `try_lock`, `lock_until`, `extend`, `unlock`. Any of the
//! futures may be dropped at any point (before it is polled, midway, after it completed)
//! without leaving a lock held for nobody: what each does then is the table in
//! [`AsyncRedlock`]'s documentation (`docs/cancellation.md`).
//!
//! ```no_run
//! # async fn run() -> Result<(), redlock_mux::Error> {
//! use std::time::Duration;
//! use redlock_mux::{AsyncRedlock, Builder};
//!
//! let redlock: AsyncRedlock = Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .quarantine(None) // servers just started, never held a lock; in production keep the default
//!     .build_async()?;
//! let guard = redlock.guard("invoice:42").await?;
//! // ... work within guard.validity() ...
//! guard.unlock().await?;
//!
//! let rows = redlock
//!     .with_lock("report:daily", async |watch| {
//!         let mut rows = 0;
//!         while watch.is_held() && rows < 100 {
//!             rows += 1; // ... one step of the work ...
//!         }
//!         rows
//!     })
//!     .await?;
//! # let _ = rows;
//! redlock.shutdown(Duration::from_secs(2)).await; // flush releases before the process exits
//! # Ok(()) }
//! ```
//!
//! ### More
//!
//! - [`Client`]: an engine of its own for one thread (`&mut self` methods, its own connections).
//! - [`Builder`]: every setting with its default; [`Config`] holds them.
//! - Fencing tokens ([`Builder::fencing`], [`Lock::fence`]): a number that grows with every
//!   acquisition, for resources that must refuse a holder that paused past its validity.
//! - [`Redlock::status`]: what every node holds for a resource, for inspection;
//!   [`Redlock::repair_fences`]: fence counters left blank on a majority, repaired.
//! - Observability: [`Redlock::stats`] (counters and latency histograms per node and per
//!   operation, always on), [`Lock::votes`] (which nodes granted a lock, which were unreachable),
//!   and events through the `log` facade with the cargo feature `log` (target [`LOG_TARGET`]).
//!
//! ## Guarantees, and what they assume
//!
//! While a majority of the N masters is up and honest, at most one client holds a lock within
//! the validity its acquisition or extension returned ([`Lock::validity`],
//! [`KeepAlive::is_held`]). That assumes work that ends within the validity (a pause past it —
//! GC, swap, SIGSTOP — breaks exclusion, as for any lease: use fencing tokens where that
//! matters), clocks that run at about the same rate (1 % of the TTL + 2 ms of drift allowed),
//! masters that restart with their keys or are kept out by the restart quarantine
//! ([`Builder::quarantine`]: every client's window must cover the longest TTL any client uses),
//! and masters that are independent and honest.
//!
//! ## The algorithm in five lines
//!
//! 1. Take `start` from a monotonic clock; send `SET resource token NX PX ttl` to all N nodes.
//! 2. Count `OK`s as they arrive; each node gets a small timeout (5 % of the TTL, ≤ 50 ms).
//! 3. Success at `N/2 + 1` OKs if `ttl − elapsed − (ttl × 0.01 + 2 ms)` is still positive.
//! 4. Otherwise (quorum out of reach, or no validity left) release on all N nodes at once.
//! 5. Retry after a random delay; release and extend are compare-and-delete/-expire scripts.
//!
//! ## Cargo features
//!
//! | feature | what it adds |
//! |---|---|
//! | `tls` | `rediss://` servers through rustls with ring (`Builder::tls_config`) |
//! | `log` | events (acquired, lost, node down, …) through the `log` facade, target [`LOG_TARGET`] |
//! | `cli` | the `redlock` command (a binary: nothing in the library) |
//!
//! Without features the library depends on `mio`, `bytes`, `rand`, `sha1` and `thiserror` only.
//! (`sim` and `fuzzing` are the test suite's hooks: the simulator and the fuzz targets' checks.)
//!
//! ## The long documentation
//!
//! In the package's `docs/` folder (on docs.rs, under "Source"):
//!
//! - [The library in depth][library]: defaults, the restart quarantine, connections and
//!   addresses, waiting for a held lock, the keys this crate writes, keeping a lock, fencing,
//!   async, observability, the RESP codec.
//! - [Running in production][production]: a checklist (servers, the ACL rule, TTL, timeouts,
//!   what to watch) and TLS.
//! - [Guarantees][guarantees]: what is promised under which assumptions, and how each is
//!   checked; [the design][design]: the engine's map and the rules it keeps.
//! - [Fencing tokens][fencing], [cancellation of the async futures][cancellation],
//!   [benchmarks][benchmarks], [the `redlock` command][cli].
//!
//! [library]: https://docs.rs/crate/redlock-mux/latest/source/docs/library.md
//! [production]: https://docs.rs/crate/redlock-mux/latest/source/docs/production.md
//! [guarantees]: https://docs.rs/crate/redlock-mux/latest/source/docs/guarantees.md
//! [design]: https://docs.rs/crate/redlock-mux/latest/source/docs/design.md
//! [fencing]: https://docs.rs/crate/redlock-mux/latest/source/docs/fencing.md
//! [cancellation]: https://docs.rs/crate/redlock-mux/latest/source/docs/cancellation.md
//! [benchmarks]: https://docs.rs/crate/redlock-mux/latest/source/docs/benchmarks.md
//! [cli]: https://docs.rs/crate/redlock-mux/latest/source/docs/cli.md
//!
//! ## Modules
//!
//! Everything above is at the crate root. The public modules are lower-level pieces:
//! [`addr`] (`redis://` and `redis+unix://` addresses), [`error`] (the error types), [`keys`]
//! (the keys and channels this crate writes, for interoperating clients), [`resp`] (the RESP
//! codec, no I/O) and [`round`] (one attempt as a state machine, no I/O, no clock).
#![deny(missing_docs)]
// docs.rs (`--cfg docsrs`, see Cargo.toml): each item a feature gates says so.
#![cfg_attr(docsrs, feature(doc_cfg))]
// One `unsafe` block, `Resource::new` (a `repr(transparent)` cast), allowed where it stands.
#![deny(unsafe_code)]

// The layers of the crate (for its developers), each a folder that imports only the folders
// listed above it here (`scripts/test` checks no file of a layer names a layer below it in
// this list); each folder's `mod.rs` says what it holds and what it may not touch:
//
// 1. `model/`: plain data and rules — configuration, addresses, locks, tokens, errors, stats,
//    events, the keys this crate writes, one attempt's quorum decision (`round`).
// 2. `proto/`: the wire contract without I/O — the RESP codec, the Lua scripts, one node's
//    session (handshake, reply matching, `NOSCRIPT` fallback), the quarantine, fencing.
// 3. `engine/`: every operation in flight over one connection per node, sans-IO: it reaches
//    the network and the clock only through its `Net`.
// 4. `runtime/`: what runs it — the mio driver, sockets, TLS, the resolver, the engine shared
//    behind its lock (`hub`), the futures of the async face.
// 5. `api/`: what users call — `Redlock`, `AsyncRedlock`, guards, keep-alive, semaphores.
//
// Beside them: `sim/` (the simulator, feature `sim`: the engine over an in-memory network),
// `fuzzing.rs` (feature `fuzzing`, hidden: the fuzz targets' checks) and `testing.rs` (hidden:
// hooks for the crate's tests). The crate root only declares and re-exports.

mod api;
mod engine;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod model;
mod proto;
mod runtime;
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod sim;
#[doc(hidden)]
pub mod testing;

// The public modules.
pub use model::{addr, error, keys, round};
pub use proto::resp;

pub use api::async_redlock::AsyncRedlock;
pub use api::guard::{AsyncLockGuard, LockGuard};
pub use api::keep_alive::{AsyncKeepAlive, KeepAlive, LockWatch};
pub use api::redlock::Redlock;
pub use api::semaphore::{AsyncSemaphore, MAX_PERMITS, Semaphore};
pub use engine::Shutdown;
pub use model::addr::{NodeAddr, TlsParams};
pub use model::config::{
    Builder, Config, EvictingServers, MAX_NODES, MAX_TTL, MIN_RETRY_DELAY, Quarantine,
};
pub use model::error::{
    Error, FenceRepair, NodeFault, NodeRepair, NodeVote, Report, WithLockError,
};
pub use model::event::TARGET as LOG_TARGET;
pub use model::eviction::{Eviction, EvictionPolicy};
pub use model::fence_floor::FenceFloor;
pub use model::keys::{FENCE_KEY, MAX_SET_LEN, PERMIT_SEPARATOR, RESERVED_PREFIX};
pub use model::lock::{Lock, LockVote, Resource, ResourceSet, Shared, Votes};
pub use model::lock_options::LockOptions;
pub use model::node_status::{NodeFence, NodeStatus};
pub use model::stats::{Histogram, IoStats, KeepStats, NodeStats, OpStats, Stats};
pub use model::token::{
    MAX_OWNER_LEN, MAX_TOKEN_LEN, OWNER_SEPARATOR, TOKEN_LEN, Token, split_value,
};
pub use runtime::client::Client;

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The examples of `docs/library.md`, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/library.md")]
struct LibraryDoctests;

/// The examples of `docs/keeping.md`, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/keeping.md")]
struct KeepingDoctests;

/// The examples of `docs/async.md`, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/async.md")]
struct AsyncDoctests;

/// The examples of `docs/observability.md`, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/observability.md")]
struct ObservabilityDoctests;

/// The examples of `docs/production.md`, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/production.md")]
struct ProductionDoctests;
