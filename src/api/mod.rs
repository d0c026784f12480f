//! What users call.

pub(crate) mod async_redlock;
pub(crate) mod guard;
pub(crate) mod keep_alive;
pub(crate) mod redlock;
pub(crate) mod reentry;
pub(crate) mod semaphore;
