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
