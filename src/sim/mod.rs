//! Deterministic simulation: the crate's real decision code — the engine, its `Round`s and
//! one real `Session` per node and client — in a simulated world with virtual time, where a
//! seed replays a run exactly.
//!
//! What it may not touch, so that a seed replays: the wall clock (every process reads a
//! simulated clock, counted from one base instant taken when the world is built), sockets and
//! threads (a run is one thread, which hands each engine what arrived in the order of the event
//! queue), and any randomness but the schedule's generator, drawn in a fixed order (a
//! reordering of two draws changes every schedule). Nor does it patch the code it runs: a break
//! that brings a client's defect back does so through the crate's own `Mutation` switch, set
//! before the run.
//!
//! The world has N simulated Redis nodes (`node.rs`), C client processes each with its own
//! engine over a `SimNet` (`client_net.rs`), links with a delay drawn per message (FIFO per
//! connection, like TCP), and faults: node pauses (the node's clock runs on), crashes with all
//! keys lost and a new `run_id`, connection resets, partitions that heal (messages held, as TCP
//! retransmits them), `SCRIPT FLUSH`, client pauses ("GC pauses") and per-process clock rates.
//! Clients contend for a few resources with random hold times and extends.
//!
//! The checker works in world time: for each resource, the intervals during which a client
//! *believes* it holds the lock — from the outcome of its acquire until it sends the release or
//! its own clock reaches the lock's validity, whichever is first — must never overlap. A run
//! that breaks one of the README's assumptions ([`Break`]) is expected to find violations; one
//! that keeps them, never.
//!
//! The files: `world.rs` (the world, its event queue and loop, [`run`]), `events.rs` (what an
//! event does), `setup.rs` (what a run is asked to do), `callers.rs` and `workload.rs` (the
//! callers: what they are, and how they act), `faults.rs` (the fault plan and how faults act),
//! `links.rs`, `network.rs` and `client_net.rs` (the links, and messages over them both ways),
//! `node.rs`, `script_models.rs` and `node_io.rs` (the simulated Redis), `record.rs` (what the
//! checkers read) and `checkers.rs` (every check), `report.rs` (what a run found), `clock.rs`
//! and `rng.rs` (time and chance). Data and its checks come before the world: the world's
//! methods are spread over the files that act (`impl World` in `workload.rs`, `network.rs`,
//! `faults.rs`, `checkers.rs`), and no file the world uses uses the world back.
//!
//! Not a public API: behind the `sim` feature, for `tests/sim.rs` and `examples/sim.rs`.

mod callers;
mod checkers;
mod client_net;
mod clock;
mod events;
mod faults;
mod links;
mod network;
mod node;
mod node_io;
mod record;
mod report;
mod rng;
mod script_models;
mod setup;
mod workload;
mod world;

pub use checkers::{DEADLINE_SLACK, PROGRESS_FLOOR, connects_allowed};
pub use record::WAIT_BOUND;
pub use report::{
    ConnectViolation, CoverViolation, FAULT_KINDS, FenceViolation, LateWait, LivenessViolation,
    ProgressViolation, Report, Violation,
};
pub use setup::{Break, COUNTER_PERMITS, CROWD, Setup, TTL};
pub use world::run;
