//! The wire contract.

pub(crate) mod encode;
pub(crate) mod fencing;
pub(crate) mod info;
pub(crate) mod quarantine;
pub(crate) mod repair_tally;
pub mod resp;
pub(crate) mod scripts;
pub(crate) mod session;
