//! Whether a server may evict keys under memory pressure, from its `INFO memory`: the
//! `maxmemory` limit and the `maxmemory_policy`. An evicting server can drop a held lock's key
//! and grant the lock to another client ([`EvictingServers`](crate::EvictingServers)).

use std::fmt;

/// A server's `maxmemory-policy` that may evict lock keys (every lock key has a TTL, so the
/// `volatile-*` policies reach them as the `allkeys-*` ones do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionPolicy {
    /// `allkeys-lru`.
    AllkeysLru,
    /// `allkeys-lfu`.
    AllkeysLfu,
    /// `allkeys-random`.
    AllkeysRandom,
    /// `volatile-lru`.
    VolatileLru,
    /// `volatile-lfu`.
    VolatileLfu,
    /// `volatile-random`.
    VolatileRandom,
    /// `volatile-ttl`: the keys closest to expiring go first — lock keys among the first.
    VolatileTtl,
    /// A policy this client does not know (a newer server's): taken as one that may evict.
    Other,
}

impl EvictionPolicy {
    /// The policy as the server's configuration names it.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::AllkeysLru => "allkeys-lru",
            EvictionPolicy::AllkeysLfu => "allkeys-lfu",
            EvictionPolicy::AllkeysRandom => "allkeys-random",
            EvictionPolicy::VolatileLru => "volatile-lru",
            EvictionPolicy::VolatileLfu => "volatile-lfu",
            EvictionPolicy::VolatileRandom => "volatile-random",
            EvictionPolicy::VolatileTtl => "volatile-ttl",
            EvictionPolicy::Other => "another policy",
        }
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a server's `INFO memory` said about evicting keys, on the connection it answered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Eviction {
    /// Not known (not asked — the client counts evicting servers — not answered yet, refused,
    /// or an answer without `maxmemory` and `maxmemory_policy`).
    #[default]
    Unknown,
    /// No key is ever evicted: no `maxmemory` limit, or the policy `noeviction`.
    Never,
    /// Keys may be evicted.
    May(EvictionPolicy),
}

impl Eviction {
    /// Reads `maxmemory:<bytes>` and `maxmemory_policy:<name>` from an `INFO memory` reply.
    pub(crate) fn parse(text: &[u8]) -> Eviction {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(Eviction::parse(text.as_bytes()), Eviction::May(expected));
            // No limit: nothing is ever evicted, whatever the policy.
            let text = info("0", policy);
            assert_eq!(Eviction::parse(text.as_bytes()), Eviction::Never);
        }
        let text = info("4194304", "noeviction");
        assert_eq!(Eviction::parse(text.as_bytes()), Eviction::Never);
        // Missing or garbled fields: not known.
        for text in [
            "# Memory\r\nused_memory:1000\r\n".to_string(),
            info("-1", "noeviction"),
            "maxmemory:0\r\n".to_string(),
        ] {
            assert_eq!(
                Eviction::parse(text.as_bytes()),
                Eviction::Unknown,
                "{text}"
            );
        }
    }
}
