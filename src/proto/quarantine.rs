//! The restart quarantine: per node, whether it may have restarted (and lost its keys) within
//! the window, from its `run_id` and uptime as seen in each connection's handshake.

use std::time::{Duration, Instant};

use crate::model::round::deadline_after;
use crate::proto::info::ServerInfo;

/// How much more than the time a server has been up its `uptime_in_seconds` may say (see
/// [`NodeWatch::quarantine_left`]).
pub(crate) const UPTIME_ROUNDING: Duration = Duration::from_secs(1);

/// Per-node restart tracking for the quarantine.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NodeWatch {
    generation: u64,
    run_id: Option<[u8; 40]>,
    /// The session's count of process changes when last looked at (`ServerInfo::changes`).
    changes: u32,
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
        info: Option<&ServerInfo>,
        now: Instant,
    ) -> Option<Duration> {
        if generation != self.generation {
            self.generation = generation;
            let until = match info {
                Some(info) => self.until_of(info, window),
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

    /// When the quarantine of a process that said who it is (`info`) ends on this connection:
    /// a restart counts a whole window from the moment it was noticed, an uptime counts down
    /// from it, and no uptime is no news for a process known already.
    fn until_of(&mut self, info: &ServerInfo, window: Duration) -> Option<Instant> {
        self.unknown_since = None;
        // A new run_id means a new process — a restart, a failover, a promoted
        // replica, or an address that now leads to another server — whatever its
        // uptime says: when it lost (or never had) our keys is unknown, so the whole
        // window counts from the moment we noticed.
        // Known by this tracking (it has seen an answer of the node before), or
        // by the session, whose earlier connections may have met other processes
        // without carrying an answer here: without that, a client that never
        // heard the first process would take a replacement up for hours at its
        // word, and one that knew A would take A back after a B it never heard.
        let restarted = match self.run_id {
            Some(id) => id != info.run_id || info.changes > self.changes,
            None => info.changes > 0,
        };
        // Known before this answer (a restart is decided first, below).
        let known = self.run_id.is_some();
        self.changes = info.changes;
        self.run_id = Some(info.run_id);
        match info.uptime {
            _ if restarted => Some(deadline_after(info.seen, window)),
            // Counted a second short: `uptime_in_seconds` is the whole seconds of
            // the clock now less those at the start (Redis: `server.unixtime -
            // server.stat_starttime`), up to a second more than the process has
            // been up — a server started at x.95 s says 1 at x + 1.02 s. Read as
            // it stands, a node restarted 29.1 s ago would count in a 30 s window.
            Some(uptime) => {
                let up = uptime.saturating_sub(UPTIME_ROUNDING);
                window.checked_sub(up).map(|left| info.seen + left)
            }
            // No uptime (missing, or negative after the server's clock stepped
            // back) from the process this tracking knows: no news, the quarantine
            // it has stands. Counted as 0 here, it was quarantined for a whole
            // window again at every reconnect (a server's idle `timeout`, `CLIENT
            // KILL`): out for good behind servers that close idle connections.
            None if known => None,
            // No uptime from a process met for the first time: as if it had just
            // started, a whole window from now (its age is unknown: a blank fence
            // counter on it is not seeded before it has been known that long).
            None => Some(deadline_after(info.seen, window)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(uptime_secs: u64, seen: Instant) -> Option<ServerInfo> {
        Some(ServerInfo {
            run_id: [b'a'; 40],
            uptime: Some(Duration::from_secs(uptime_secs)),
            seen,
            changes: 0,
        })
    }

    #[test]
    fn a_node_seen_first_counts_once_it_has_surely_been_up_a_window() {
        let now = Instant::now();
        let window = Duration::from_secs(30);
        // Its uptime says 30 s: up for 29.x s at least, so still out for up to a second. (Read
        // as it stands it counted at once: a node restarted 29.1 s ago, inside the window.)
        let mut watch = NodeWatch::default();
        let left = watch.quarantine_left(window, 1, info(30, now).as_ref(), now);
        assert_eq!(left, Some(Duration::from_secs(1)));
        // 31 s: surely up for 30.
        let mut watch = NodeWatch::default();
        assert_eq!(
            watch.quarantine_left(window, 1, info(31, now).as_ref(), now),
            None
        );
        // Just started (0 or 1 s): the whole window from now.
        for up in [0, 1] {
            let mut watch = NodeWatch::default();
            assert_eq!(
                watch.quarantine_left(window, 1, info(up, now).as_ref(), now),
                Some(window)
            );
        }
        // 10 s: 21 s more.
        let mut watch = NodeWatch::default();
        let left = watch.quarantine_left(window, 1, info(10, now).as_ref(), now);
        assert_eq!(left, Some(Duration::from_secs(21)));
    }

    #[test]
    fn a_new_run_id_is_out_for_a_whole_window_whatever_its_uptime() {
        let now = Instant::now();
        let window = Duration::from_secs(30);
        let mut watch = NodeWatch::default();
        assert_eq!(
            watch.quarantine_left(window, 1, info(3_600, now).as_ref(), now),
            None
        );
        let other = Some(ServerInfo {
            run_id: [b'b'; 40],
            uptime: Some(Duration::from_secs(3_600)),
            seen: now,
            changes: 0,
        });
        assert_eq!(
            watch.quarantine_left(window, 2, other.as_ref(), now),
            Some(window)
        );
    }

    #[test]
    fn a_replacement_the_session_met_first_is_out_for_a_whole_window() {
        let now = Instant::now();
        let window = Duration::from_secs(30);
        let met = |changes, seen| info(3_600, seen).map(|i| ServerInfo { changes, ..i });
        // Its session's earlier connection met another process (no answer of it reached this
        // tracking): a process up for an hour is out for a whole window all the same. (Taken
        // by its uptime before, it counted at once.)
        let mut watch = NodeWatch::default();
        assert_eq!(
            watch.quarantine_left(window, 2, met(1, now).as_ref(), now),
            Some(window)
        );
        // The same process on a later connection (no new change) is not out again.
        let later = now + window;
        assert_eq!(
            watch.quarantine_left(window, 3, met(1, later).as_ref(), later),
            None
        );
        // Away to another process and back (A, B, A) while no answer reached this tracking:
        // the run_id is the one it knew, but the count grew: out for a whole window.
        let back = later + window;
        assert_eq!(
            watch.quarantine_left(window, 5, met(3, back).as_ref(), back),
            Some(window)
        );
    }

    #[test]
    fn a_known_process_without_an_uptime_is_not_quarantined_again_at_each_reconnect() {
        let now = Instant::now();
        let window = Duration::from_secs(30);
        let unknown_age = |seen| info(0, seen).map(|i| ServerInfo { uptime: None, ..i });
        // Met for the first time without an uptime (missing, or negative after the server's
        // clock stepped back): its age is unknown, a whole window from now.
        let mut watch = NodeWatch::default();
        assert_eq!(
            watch.quarantine_left(window, 1, unknown_age(now).as_ref(), now),
            Some(window)
        );
        // The same process on a later connection, still without an uptime: the quarantine it
        // had stands, no more. (Counted as 0, it was out for a whole window again at every
        // reconnect.)
        let half = now + window / 2;
        assert_eq!(
            watch.quarantine_left(window, 2, unknown_age(half).as_ref(), half),
            Some(window / 2)
        );
        let later = now + window;
        assert_eq!(
            watch.quarantine_left(window, 3, unknown_age(later).as_ref(), later),
            None
        );
        // A process up for an hour whose clock then stepped back (its uptime negative): no
        // news, it counts.
        let mut watch = NodeWatch::default();
        assert_eq!(
            watch.quarantine_left(window, 1, info(3_600, now).as_ref(), now),
            None
        );
        assert_eq!(
            watch.quarantine_left(window, 2, unknown_age(half).as_ref(), half),
            None
        );
        // A new process without an uptime is out for a whole window.
        let other = unknown_age(later).map(|i| ServerInfo {
            run_id: [b'b'; 40],
            ..i
        });
        assert_eq!(
            watch.quarantine_left(window, 3, other.as_ref(), later),
            Some(window)
        );
        // And the same process after the session met another one in between (A, B, A): out
        // for a whole window, uptime or none.
        let back = later + window;
        let returned = unknown_age(back).map(|i| ServerInfo { changes: 2, ..i });
        assert_eq!(
            watch.quarantine_left(window, 5, returned.as_ref(), back),
            Some(window)
        );
    }
}
