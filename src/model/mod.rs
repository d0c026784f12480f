//! Plain data and rules.

pub mod addr;
pub(crate) mod config;
pub mod error;
pub(crate) mod event;
pub(crate) mod eviction;
pub mod keys;
pub(crate) mod lock;
pub(crate) mod mutation;
pub mod round;
pub(crate) mod stats;
pub(crate) mod token;
