//! Hooks for the crate's own tests (hidden: not part of the API, no stability promise). What a
//! user may want to watch is in [`Stats`](crate::Stats); these look at the machinery.

use std::sync::atomic::Ordering;

use crate::{Client, Redlock};

/// Times the background thread of `redlock`'s engine, woken for work, found the loop driven by
/// a caller. It then waits to be told the caller let go instead of trying again at once
/// (`tests/async_api.rs`).
pub fn background_found_loop_taken(redlock: &Redlock) -> u64 {
    redlock.hub().found_taken.load(Ordering::Relaxed)
}

/// Bytes buffered per node of `client`: (unsent output, undecoded input). For tests of the
/// buffer limits.
pub fn buffered(client: &Client) -> Vec<(usize, usize)> {
    client.buffered()
}

/// Requests waiting for a reply, per node of `client`. For tests of connection failures.
pub fn pending(client: &Client) -> Vec<usize> {
    client.pending()
}

/// Alarms of async callers (retry pauses, `wait_lost` deadlines) `client`'s engine holds.
pub fn alarms(client: &Client) -> usize {
    client.alarms()
}

/// Callers of `client`'s engine waiting in the queue of `resource` (its head included).
pub fn waiters(client: &mut Client, resource: &[u8]) -> usize {
    client.waiters(resource)
}

/// Releases of `client`'s engine not confirmed yet: (in flight, waiting in the ledger for
/// their node).
pub fn unconfirmed(client: &Client) -> (usize, usize) {
    client.unconfirmed()
}

/// Drives `client`'s engine until no release is in flight (every one answered, or moved to the
/// ledger by its node's failure) or until `deadline`; true when none is left. For tests that
/// look at a server right after a call whose releases are not waited for (a lost attempt's).
pub fn settle_releases(client: &mut Client, deadline: std::time::Instant) -> bool {
    client.settle_releases(deadline)
}

/// The body of every Lua script the client may send (the simulator's deliberately wrong one
/// excepted): for tests that hold them against an ACL rule.
pub fn script_bodies() -> Vec<&'static str> {
    crate::proto::scripts::scripts()
        .iter()
        .filter(|s| s.index != crate::proto::scripts::FLAWED_ACQUIRE_SCRIPT)
        .map(|s| s.body)
        .collect()
}
