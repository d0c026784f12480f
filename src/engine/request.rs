//! What a caller asks of the engine ([`ReqKind`]), what the engine calls the operation it
//! starts ([`OpId`]) and what the caller gets back ([`Outcome`]): the vocabulary shared by the
//! engine, its wait queues, the hub's mailbox and the public API.

use std::time::{Duration, Instant};

use crate::model::config::Config;
use crate::model::error::Error;
use crate::model::error::FenceRepair;
use crate::model::fence_floor::FenceFloor;
use crate::model::lock::{Grant, Lock};
use crate::model::lock_options::LockOptions;
use crate::model::node_status::NodeStatus;
use crate::model::round::deadline_after;
use crate::model::token::Token;

/// Identifies an operation: slab index and the slot's sequence number (so a reused slot is
/// never confused with its previous occupant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpId {
    pub index: u32,
    pub seq: u32,
}

impl OpId {
    /// The tag carried by the operation's requests; 0 is the handshake's.
    pub fn tag(self) -> u64 {
        (u64::from(self.seq) << 32) | u64::from(self.index + 1)
    }
    #[cfg(test)]
    pub(crate) fn for_tests(index: u32) -> OpId {
        OpId { index, seq: 1 }
    }

    pub fn from_tag(tag: u64) -> Option<OpId> {
        let low = tag as u32;
        (low != 0).then(|| OpId {
            index: low - 1,
            seq: (tag >> 32) as u32,
        })
    }
}

/// What a caller asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReqKind {
    /// `SET resource token NX PX ttl` on every node.
    Acquire { ttl: Duration },
    /// The compare-and-pexpire script on every node, within the lock's validity.
    Extend {
        ttl: Duration,
        valid_until: Instant,
        /// The nodes whose keys back the validity (a bit set; 0: not known).
        backing: u64,
    },
    /// The compare-and-delete script on every node.
    Release,
    /// `GET` and `PTTL` on every node, waiting at most `timeout`.
    Status { timeout: Duration },
    /// Acquire, waiting for the resource until `deadline`: queued behind this engine's other
    /// callers waiting for it, attempts when it is released (see `wait.rs`).
    Wait { ttl: Duration, deadline: Instant },
    /// Repair the fence counters (see `repair.rs`), each round trip waiting at most `timeout`.
    Repair {
        floor: FenceFloor,
        timeout: Duration,
    },
}

impl ReqKind {
    /// An acquire of `resource` with the configured TTL and a fresh token.
    pub(crate) fn acquire(config: &Config, resource: &[u8]) -> Result<(ReqKind, Token), Error> {
        config.check_resource(resource)?;
        Ok((
            ReqKind::Acquire { ttl: config.ttl },
            Token::for_resource(resource)?,
        ))
    }

    /// An acquire of `resource` with the TTL and the wait of `options` (the configured ones
    /// where it has none), with a fresh token: one attempt for a zero wait, else waiting until
    /// `now` + the wait. Its TTL is checked as an extend's is: at most the longest TTL.
    pub(crate) fn with_options(
        config: &Config,
        resource: &[u8],
        options: LockOptions,
        now: Instant,
    ) -> Result<(ReqKind, Token), Error> {
        config.check_resource(resource)?;
        let ttl = match options.ttl {
            Some(ttl) => {
                config.check_held_ttl("lock ttl", ttl)?;
                ttl
            }
            None => config.ttl,
        };
        let wait = options.wait.unwrap_or_else(|| config.lock_wait());
        let kind = match wait.is_zero() {
            true => ReqKind::Acquire { ttl },
            false => ReqKind::Wait {
                ttl,
                deadline: deadline_after(now, wait),
            },
        };
        Ok((kind, Token::for_resource(resource)?))
    }

    /// An acquire of `resource` that waits until `deadline`, with a fresh token (each attempt
    /// uses a variant of it: [`Token::variant`]).
    pub(crate) fn wait(
        config: &Config,
        resource: &[u8],
        deadline: Instant,
    ) -> Result<(ReqKind, Token), Error> {
        config.check_resource(resource)?;
        Ok((
            ReqKind::Wait {
                ttl: config.ttl,
                deadline,
            },
            Token::for_resource(resource)?,
        ))
    }

    /// A fence repair: fencing must be on (the repair learns each node's `run_id` as fenced
    /// acquires do), a floor must leave room for a fence above it, and the timeout room for
    /// an answer.
    pub(crate) fn repair(
        config: &Config,
        floor: FenceFloor,
        timeout: Duration,
    ) -> Result<ReqKind, Error> {
        if !config.fencing {
            return Err(Error::Config(
                "repairing fence counters needs fencing on (Builder::fencing(true)): the repair \
                 learns each node's run_id as fenced acquires do"
                    .into(),
            ));
        }
        if floor == FenceFloor::AtLeast(u64::MAX) {
            return Err(Error::Config(format!(
                "a fence floor of {} leaves no fence above it",
                u64::MAX
            )));
        }
        if timeout.is_zero() {
            return Err(Error::Config(
                "a fence repair with a zero timeout waits for no answer".into(),
            ));
        }
        Ok(ReqKind::Repair { floor, timeout })
    }

    /// An extend of `lock` to `ttl`, if the lock may still be extended at `now`; `backing`:
    /// the nodes whose keys back its validity (`Lock::backing`; 0: not known).
    pub(crate) fn extend(
        config: &Config,
        (lock, backing): (&Lock, u64),
        ttl: Duration,
        now: Instant,
    ) -> Result<ReqKind, Error> {
        config.check_extend_ttl(ttl)?;
        if lock.extensions() >= config.max_extensions {
            return Err(Error::ExtensionLimit(config.max_extensions));
        }
        if now >= lock.valid_until() {
            return Err(Error::Expired { released: 0 });
        }
        Ok(ReqKind::Extend {
            ttl,
            valid_until: lock.valid_until(),
            backing,
        })
    }
}

/// What an operation came to.
#[derive(Debug)]
pub(crate) enum Outcome {
    Acquired(Result<Grant, Error>),
    /// A waited-for acquire: which of its token's variants ([`Token::variant`]) the attempt
    /// that won carried, and its grant.
    ///
    /// The variant's number, not the token: the caller has the token, and 64 bytes less make
    /// `Outcome` 112 bytes, moved inline rather than by a `memcpy` call at each of the six or
    /// seven hand-overs of every operation's outcome (callgrind, `benches/bench_counts.rs`).
    Locked(Result<(u32, Grant), Error>),
    /// The lock's validity after the extend (cut short if it was lost), and the result: the
    /// nodes that said yes (a bit set) when it won.
    Extended(Instant, Result<u64, Error>),
    /// Nodes that confirmed the release in time.
    Released(usize),
    Status(Vec<NodeStatus>),
    Repaired(Result<FenceRepair, Error>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation's outcome is moved several times between its decision and its caller;
    /// up to 128 bytes LLVM copies inline, above it through a `memcpy` call each time (13 calls
    /// per acquire + release cycle when `Locked` carried a whole token: +260 instructions per
    /// cycle, callgrind). A new variant or a grown error must stay under the line.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_outcome_is_small_enough_to_be_copied_inline() {
        assert!(
            std::mem::size_of::<Outcome>() <= 128,
            "Outcome is {} bytes",
            std::mem::size_of::<Outcome>()
        );
    }
}
