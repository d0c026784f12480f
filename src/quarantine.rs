//! The restart quarantine: per node, whether it may have restarted (and lost its keys) within
//! the window, from its `run_id` and uptime as seen in each connection's handshake.

use std::time::{Duration, Instant};

use crate::round::deadline_after;
use crate::session::ServerInfo;

/// Per-node restart tracking for the quarantine.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NodeWatch {
    generation: u64,
    run_id: Option<[u8; 40]>,
    quarantined_until: Option<Instant>,
    /// Since when the node's restart state has been unknown (its `INFO server` reply had no
    /// `run_id` or uptime), across reconnects; `None` while it is known.
    unknown_since: Option<Instant>,
}

impl NodeWatch {
    /// Updates restart tracking from what the handshake's `INFO server` said on connection
    /// `generation`, and answers how long the node is still quarantined.
    pub(crate) fn quarantine_left(
        &mut self,
        window: Duration,
        generation: u64,
        info: Option<ServerInfo>,
        now: Instant,
    ) -> Option<Duration> {
        if generation != self.generation {
            self.generation = generation;
            let until = match info {
                Some(info) => {
                    self.unknown_since = None;
                    // A new run_id means a new process — a restart, a failover, a promoted
                    // replica, or an address that now leads to another server — whatever its
                    // uptime says: when it lost (or never had) our keys is unknown, so the whole
                    // window counts from the moment we noticed.
                    let restarted = self.run_id.is_some_and(|id| id != info.run_id);
                    self.run_id = Some(info.run_id);
                    if restarted {
                        Some(deadline_after(info.seen, window))
                    } else {
                        window.checked_sub(info.uptime).map(|left| info.seen + left)
                    }
                }
                // Restart state unknown: out of quorums until a whole window has passed since
                // this client first saw the node in that state (kept across reconnects, so a
                // server that closes idle connections is not quarantined forever).
                None => Some(deadline_after(
                    *self.unknown_since.get_or_insert(now),
                    window,
                )),
            };
            self.quarantined_until = until.max(self.quarantined_until);
        }
        self.quarantined_until
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}
