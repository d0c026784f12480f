//! Hooks for the crate's own tests (hidden: not part of the API, no stability promise). What a
//! user may want to watch is in [`Stats`](crate::Stats); these look at the machinery.

use std::sync::atomic::Ordering;

use crate::Redlock;

/// Times the background thread of `redlock`'s engine, woken for work, found the loop driven by
/// a caller. It then waits to be told the caller let go instead of trying again at once
/// (`tests/async_api.rs`).
pub fn background_found_loop_taken(redlock: &Redlock) -> u64 {
    redlock.hub().found_taken.load(Ordering::Relaxed)
}
