//! redlock-mux: a Redlock distributed-lock client over N independent Redis masters.
#![deny(missing_docs)]

pub mod resp;
