//! Local Redis for tests, benchmarks and demos: real `redis-server` processes, a delaying TCP
//! relay, misbehaving fake servers, a counting allocator and throw-away certificates — one
//! implementation of each, shared by `redlock-mux`'s tests, benchmarks, examples and the
//! `redlock demo` / `redlock bench` commands.
//!
//! | module | owns |
//! |---|---|
//! | [`server`] | [`Server`] and [`ServerBuilder`]: one `redis-server` on a free loopback port, its own temporary directory, no persistence, a log file; freeze / resume / kill / restart on the same port |
//! | [`cluster`] | [`Cluster`]: N independent servers started together |
//! | `admin` (feature `admin`) | commands to a server through redis-rs: `Server::cmd`, `get`, `set`, `pttl`, `info`, … |
//! | [`raw`] | a few raw-TCP helpers: `PING` without a client library, RESP command encoding |
//! | [`relay`] | [`Relay`]: a TCP relay that delays every byte by a fixed one-way delay, and injects network faults on demand (black hole, partition, one-way loss, half-open connections, a slow drip, connects that never complete) |
//! | [`fake`] | [`FakeServer`]: an accept loop running a handler per connection, with a [`Peer`] that reads RESP commands, sends, trickles; optionally behind TLS (feature `tls`) |
//! | [`alloc`] | [`CountingAlloc`]: a global allocator that counts allocations (process-wide and per thread) |
//! | `pki` (feature `pki`) | `Pki`: a CA, a server and a client certificate made fresh with rcgen |
//! | [`process`] | [`die_with_parent`], [`pid_is_dead`] |
//! | [`binary`] | where `redis-server` is ([`redis_binary`]) and how to install it, its [`Version`] |
//! | [`clock`] | a server whose wall clock runs fast or slow or steps, under libfaketime ([`ServerBuilder::fake_clock`]) |
//!
//! Servers are SIGKILLed and reaped on drop, and get `PR_SET_PDEATHSIG = SIGKILL`, so a test
//! process that is killed leaves no server behind. Linux delivers that signal when the *thread*
//! that spawned the child exits: start servers on the thread that owns them (a test's own thread,
//! a program's main thread), not on short-lived helper threads.
//!
//! The binary is `$REDIS_SERVER` if set, else `redis-server` on `PATH`. If it is missing,
//! starting fails with a message saying how to install it ([`INSTALL_HINT`]); nothing is skipped.
//!
//! Linux only (`prctl`, `/proc`).
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod alloc;
pub mod binary;
pub mod clock;
pub mod cluster;
mod error;
pub mod fake;
pub mod process;
pub mod raw;
pub mod relay;
pub mod server;

#[cfg(feature = "admin")]
mod admin;
#[cfg(feature = "pki")]
pub mod pki;

pub use alloc::CountingAlloc;
pub use binary::{INSTALL_HINT, Version, find_redis_binary, redis_binary};
pub use cluster::Cluster;
pub use error::Error;
pub use fake::{Event, FakeServer, Peer};
pub use process::{die_with_parent, pid_is_dead};
pub use raw::{is_timeout, raw_ping, raw_ping_on, read_line, resp_encode};
pub use relay::{Connects, Direction, Flow, FlowStats, Relay, RelayStats};
pub use server::{ClientAuth, Server, ServerBuilder};

#[cfg(feature = "pki")]
pub use pki::Pki;

/// The README's example, compiled as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
