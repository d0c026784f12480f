//! The runtime: what runs the engine on real sockets and threads. The `mio` poll loop
//! (`driver.rs`) over one connection per node (`conn.rs`, with `tls_stream.rs` for
//! `rediss://`), host names resolved off the engine's thread (`resolve.rs`), a [`Client`] that
//! owns one engine on one thread (`client.rs`), the engine shared by every thread of a handle
//! behind its lock, driven by whichever caller finds it free or by its background thread
//! (`hub.rs`), and the futures of the async face (`call.rs`).
//!
//! What it may not touch: the API above it (`api/`). It is the only layer that opens sockets,
//! reads the clock for the engine, or parks a thread; the engine reaches it only through the
//! `Net` interface (`engine/net.rs`), which the `Driver` implements.
//!
//! [`Client`]: client::Client

pub(crate) mod call;
pub(crate) mod client;
pub(crate) mod conn;
pub(crate) mod driver;
pub(crate) mod hub;
pub(crate) mod resolve;
#[cfg(feature = "tls")]
pub(crate) mod tls_stream;
