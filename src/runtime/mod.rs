//! What runs the engine.

pub(crate) mod call;
pub(crate) mod client;
pub(crate) mod conn;
pub(crate) mod driver;
pub(crate) mod hub;
pub(crate) mod resolve;
#[cfg(feature = "tls")]
pub(crate) mod tls_stream;
