//! # redlock-mux
//!
//! A [Redlock](https://redis.io/docs/latest/develop/use/patterns/distributed-locks/) client: a
//! lock over N independent Redis masters that stays safe while a majority of them is up.
//!
//! What sets it apart: its own RESP2/RESP3 codec (no Redis client crate), one `mio` event loop
//! that sends `SET … NX PX` to all N masters at once and decides at the first reply that settles
//! the quorum, and release/extend scripts sent by hash (`EVALSHA`, falling back to `EVAL`).
//!
//! ## Modules
//!
//! - [`resp`]: the codec — command encoding, incremental frame decoding. No I/O.
//! - [`round`]: one attempt as a state machine — votes, deadlines, validity. No I/O, no clock.
//! - `session`: one node's protocol state without I/O — takes bytes and `now`, gives bytes and
//!   replies. `conn` / `driver`: the socket of each node; the `mio` loop that drives them all.
//! - `engine`: every operation in flight over those connections — a slab of operations, each
//!   with its own round, requests pipelined (one write per node per turn) and matched FIFO;
//!   releases a node could not confirm are kept and sent again when it is back.
//! - `request` / `mailbox`: what a caller asks and gets back; the per-thread slots and the
//!   mailbox requests are handed over in.
//! - `hub`: one engine shared by all threads of a [`Redlock`] handle: a caller that finds the
//!   loop idle drives it; others hand their request over and park; a background thread takes
//!   over while callers wait.
//! - The public API, a file for each thing it owns: `config` ([`Config`], [`Quarantine`],
//!   [`Builder`]), `token` ([`Token`]), `lock` ([`Lock`]), `client` ([`Client`]: one thread's
//!   engine), `handle` ([`Redlock`]: the handle threads share), `guard` ([`LockGuard`]),
//!   `quarantine` (restart tracking per node).
//! - `keep` / `kept`: [`KeepAlive`] — kept locks are timers of the engine, extended in batches
//!   with everything else in flight; lost-lock notice; `on_lost` callbacks run on a callback
//!   thread of their own, after the lost lock was released.
//! - [`addr`]: `redis://` and `redis+unix://` addresses. [`error`]: the error types.
//!
//! ## The algorithm in five lines
//!
//! 1. Take `start` from a monotonic clock; send `SET resource token NX PX ttl` to all N nodes.
//! 2. Count `OK`s as they arrive; each node gets a small timeout (5 % of the TTL, ≤ 50 ms).
//! 3. Success at `N/2 + 1` OKs if `ttl − elapsed − (ttl × 0.01 + 2 ms)` is still positive.
//! 4. Otherwise (quorum out of reach, or no validity left) release on all N nodes at once.
//! 5. Retry after a random delay; release and extend are compare-and-delete/-expire scripts.
//!
//! ## Safety caveats
//!
//! The lock is safe only within its validity ([`Lock::validity`]): a process pause (GC, swap,
//! SIGSTOP) longer than that breaks mutual exclusion, as for any lease. Protect resources that
//! must never see two writers with fencing tokens. Nodes that restart without persistence can
//! forget keys; the client's restart quarantine ([`Config::quarantine`]) keeps such a node out of
//! quorums for a TTL.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_mux::Redlock;
//!
//! let redlock = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
//! let mut lock = redlock.lock("invoice:42")?;
//! assert!(lock.validity() > Duration::from_secs(29));
//! redlock.extend(&mut lock, Duration::from_secs(30))?;
//! let released = redlock.unlock(lock)?;
//! # Ok::<(), redlock_mux::Error>(())
//! ```
#![deny(missing_docs)]

pub mod addr;
mod async_guard;
mod async_handle;
mod async_keep;
mod client;
mod config;
mod conn;
mod driver;
mod engine;
pub mod error;
mod fence;
mod guard;
mod handle;
mod hub;
mod keep;
mod kept;
mod lock;
mod mailbox;
mod net;
mod quarantine;
mod request;
pub mod resp;
pub mod round;
mod session;
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod sim;
mod task;
mod token;
mod wait;

pub use addr::NodeAddr;
pub use async_guard::AsyncLockGuard;
pub use async_handle::AsyncRedlock;
pub use async_keep::{AsyncKeepAlive, LockWatch};
pub use client::Client;
pub use config::{Builder, Config, MAX_NODES, MAX_TTL, Quarantine};
pub use conn::IoStats;
pub use engine::Shutdown;
pub use error::{Error, NodeFault, NodeVote, Report};
pub use fence::FENCE_KEY;
pub use guard::LockGuard;
pub use handle::Redlock;
pub use keep::KeepAlive;
pub use lock::{Lock, Resource};
pub use request::{NodeFence, NodeStatus};
pub use token::{MAX_TOKEN_LEN, TOKEN_LEN, Token};

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
