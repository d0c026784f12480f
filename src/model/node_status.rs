//! What a status read says about a resource, node by node ([`NodeStatus`], [`NodeFence`]):
//! plain data, filled by the engine's status operation.

use std::time::Duration;

use crate::model::error::NodeFault;

/// What one node says about a resource ([`Client::status`](crate::Client::status)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// `host:port`.
    pub node: String,
    /// `Ok((value, pttl))` — the key's value (None: absent) and its remaining TTL in ms — or why
    /// the node could not be asked.
    pub state: Result<(Option<Vec<u8>>, i64), NodeFault>,
    /// Time from sending to the reply.
    pub rtt: Duration,
    /// The readers of a read-locked resource ([`Shared`](crate::Shared)) on this node, as its
    /// sorted set counts them (a reader past its expiry is counted until another reader's
    /// release drops it, or the key expires); `None` when it is not read-locked (then `state`
    /// holds no value for it).
    pub readers: Option<usize>,
    /// The node's fence counter (`HMGET redlock:fence run n`), when it answered.
    pub fence: Option<NodeFence>,
    /// How long the node's server process has been up, as its handshake's `INFO server` said
    /// (brought forward to the reply); `None` when not asked or not answered.
    pub uptime: Option<Duration>,
    /// The restart quarantine left: how much longer the node's yeses do not count
    /// ([`Config::quarantine`](crate::Config::quarantine)); `None` when it counts (or the
    /// quarantine is off).
    pub quarantine: Option<Duration>,
    /// Whether the server may evict keys, as its handshake's `INFO memory` said
    /// ([`EvictingServers`](crate::EvictingServers)): an evicting server's yes does not count
    /// unless the client counts them. [`Eviction::Unknown`](crate::Eviction::Unknown) when not
    /// asked or not answered.
    pub eviction: crate::Eviction,
}

impl NodeStatus {
    /// The token of the lock this node holds for the resource: the value's token
    /// ([`split_value`](crate::split_value)); `None` when the key is absent, read-locked or
    /// the node did not answer. A value this crate did not write is returned whole.
    pub fn token(&self) -> Option<&[u8]> {
        self.value().map(|v| crate::split_value(v).0)
    }

    /// Who holds the lock on this node, as its acquire recorded it
    /// ([`Config::owner`](crate::Config::owner)); `None` when no owner was recorded (or
    /// the key is absent, read-locked, or the node did not answer).
    pub fn owner(&self) -> Option<&[u8]> {
        self.value().and_then(|v| crate::split_value(v).1)
    }

    fn value(&self) -> Option<&[u8]> {
        match &self.state {
            Ok((Some(v), _)) => Some(v),
            _ => None,
        }
    }
}

/// A node's fence counter, as [`Client::status`](crate::Client::status) reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeFence {
    /// The counter (0 when absent): every fence this node took is at most this.
    pub counter: u64,
    /// Seeded for the node's current server process: the counter is at least every fence
    /// written to it. A blank one (restarted, flushed) does not count for fences until a
    /// fenced acquire seeds it again. Always false from a client that does not ask the nodes'
    /// `run_id` (neither fencing nor the restart quarantine on).
    pub seeded: bool,
}
