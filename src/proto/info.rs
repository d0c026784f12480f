//! What a node says about itself in its handshake's `INFO` answers: which server process it is
//! and how long it has been up (`INFO server`: the restart quarantine, fencing, the duplicate
//! check), and whether it may evict keys (`INFO memory`: [`Eviction`]).

use std::time::{Duration, Instant};

use crate::model::eviction::{Eviction, EvictionPolicy};

/// What the node said about itself in `INFO server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub run_id: [u8; 40],
    /// `uptime_in_seconds`; `None` when missing or not a whole number of seconds (Redis prints
    /// a signed `time_t`: negative after the server's clock stepped back). The restart tracking
    /// counts `None` as 0 the first time it meets the `run_id`, and as no news after that.
    pub uptime: Option<Duration>,
    /// When the reply arrived: the node started at about `seen - uptime`.
    pub seen: Instant,
    /// How many times this session's handshakes have met another process at this address
    /// than the one before (a restart, a failover, and back): the restart tracking treats a
    /// count that grew as a new process even when the `run_id` is one it knew, and a count
    /// above zero as one when it knew none — a connection can come up and go down without
    /// carrying one answer to the engine.
    pub changes: u32,
}

/// Extracts `run_id` and `uptime_in_seconds` from an `INFO server` reply: `None` without a
/// `run_id`. An uptime that is missing or not a whole number of seconds (Redis prints a signed
/// `time_t`: negative after the server's clock stepped back) is `None` and the `run_id` stands:
/// the restart tracking takes a process first met so as just started (a whole restart window
/// ahead: the safe direction), and one it knows by its `run_id` as no news. It used to throw
/// the `run_id` away with it, leaving the node unknown (fencing said "grant +info"); then it
/// counted as 0, which quarantined a known process again at every reconnect.
pub(crate) fn parse_info(text: &[u8], now: Instant) -> Option<ServerInfo> {
    let mut run_id = None;
    let mut uptime = None;
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"run_id:") {
            run_id = <[u8; 40]>::try_from(v).ok();
        } else if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
            uptime = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .map(Duration::from_secs);
        }
    }
    Some(ServerInfo {
        run_id: run_id?,
        uptime,
        seen: now,
        changes: 0,
    })
}

/// Reads `maxmemory:<bytes>` and `maxmemory_policy:<name>` from an `INFO memory` reply.
pub(crate) fn parse_memory(text: &[u8]) -> Eviction {
    let (mut limit, mut policy) = (None, None);
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"maxmemory:") {
            limit = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
        } else if let Some(v) = line.strip_prefix(b"maxmemory_policy:") {
            policy = Some(v);
        }
    }
    let (Some(limit), Some(policy)) = (limit, policy) else {
        return Eviction::Unknown;
    };
    let policy = match policy {
        _ if limit == 0 => return Eviction::Never,
        b"noeviction" => return Eviction::Never,
        b"allkeys-lru" => EvictionPolicy::AllkeysLru,
        b"allkeys-lfu" => EvictionPolicy::AllkeysLfu,
        b"allkeys-random" => EvictionPolicy::AllkeysRandom,
        b"volatile-lru" => EvictionPolicy::VolatileLru,
        b"volatile-lfu" => EvictionPolicy::VolatileLfu,
        b"volatile-random" => EvictionPolicy::VolatileRandom,
        b"volatile-ttl" => EvictionPolicy::VolatileTtl,
        _ => EvictionPolicy::Other,
    };
    Eviction::May(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_parsing() {
        let now = Instant::now();
        let text = b"# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789012345678901234567890123456789\r\nuptime_in_seconds:42\r\n";
        let info = parse_info(text, now).unwrap();
        assert_eq!(info.uptime, Some(Duration::from_secs(42)));
        assert_eq!(&info.run_id, b"0123456789012345678901234567890123456789");
        assert_eq!(parse_info(b"garbage", now), None);
    }

    /// The `run_id` is read whatever the uptime says: Redis prints `uptime_in_seconds` as a
    /// signed `time_t`, negative once the server's clock stepped back; missing or not a number,
    /// the uptime is unknown (`None`: the restart tracking decides what it means). Before, any
    /// of these made the node unknown.
    #[test]
    fn a_bad_uptime_is_unknown_and_keeps_the_run_id() {
        let now = Instant::now();
        let run_id = b"0123456789012345678901234567890123456789";
        for uptime in ["uptime_in_seconds:-3\r\n", "uptime_in_seconds:soon\r\n", ""] {
            let text = format!(
                "# Server\r\nrun_id:{}\r\n{uptime}",
                std::str::from_utf8(run_id).unwrap()
            );
            let info = parse_info(text.as_bytes(), now).expect(uptime);
            assert_eq!(&info.run_id, run_id, "{uptime}");
            assert_eq!(info.uptime, None, "{uptime}");
        }
        // No run_id, whatever the uptime: unknown.
        assert_eq!(parse_info(b"uptime_in_seconds:42\r\n", now), None);
    }
    #[test]
    fn a_limit_with_any_policy_but_noeviction_may_evict() {
        let info = |limit: &str, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1000\r\nmaxmemory:{limit}\r\nmaxmemory_human:4.00M\r\nmaxmemory_policy:{policy}\r\n"
            )
        };
        for (policy, expected) in [
            ("allkeys-lru", EvictionPolicy::AllkeysLru),
            ("allkeys-lfu", EvictionPolicy::AllkeysLfu),
            ("allkeys-random", EvictionPolicy::AllkeysRandom),
            ("volatile-lru", EvictionPolicy::VolatileLru),
            ("volatile-lfu", EvictionPolicy::VolatileLfu),
            ("volatile-random", EvictionPolicy::VolatileRandom),
            ("volatile-ttl", EvictionPolicy::VolatileTtl),
            ("allkeys-something-new", EvictionPolicy::Other),
        ] {
            let text = info("4194304", policy);
            assert_eq!(parse_memory(text.as_bytes()), Eviction::May(expected));
            // No limit: nothing is ever evicted, whatever the policy.
            let text = info("0", policy);
            assert_eq!(parse_memory(text.as_bytes()), Eviction::Never);
        }
        let text = info("4194304", "noeviction");
        assert_eq!(parse_memory(text.as_bytes()), Eviction::Never);
        // Missing or garbled fields: not known.
        for text in [
            "# Memory\r\nused_memory:1000\r\n".to_string(),
            info("-1", "noeviction"),
            "maxmemory:0\r\n".to_string(),
        ] {
            assert_eq!(parse_memory(text.as_bytes()), Eviction::Unknown, "{text}");
        }
    }
}
