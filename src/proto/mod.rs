//! The wire contract: what goes to a Redis node and what comes back, without I/O. The RESP
//! codec (`encode.rs`, `resp.rs`: an incremental decoder that survives any bytes), every Lua
//! script this crate sends beside the keys it touches (`scripts.rs`), one node's protocol
//! state (`session/`: its handshake, the buffers, matching replies to requests in order,
//! the `EVALSHA` → `EVAL` fallback on `NOSCRIPT`), what a node says about itself (`info.rs`),
//! the restart quarantine (`quarantine.rs`), and the fencing counters' arithmetic and their
//! repair's tally (`fencing.rs`, `repair_tally.rs`).
//!
//! What it may not touch: the engine, the runtime and the API above it (it imports only
//! `model`); sockets and the clock — a `Session` is handed the bytes that arrived and the
//! time it is, and hands back the bytes to write. So the same code runs under the `mio`
//! driver and under the simulator.

pub(crate) mod encode;
pub(crate) mod fencing;
pub(crate) mod info;
pub(crate) mod quarantine;
pub(crate) mod repair_tally;
pub mod resp;
pub(crate) mod scripts;
pub(crate) mod session;
