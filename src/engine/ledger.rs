//! The ledger: releases not confirmed by a node (its connection failed with the command written
//! or queued, or it was down), sent again when the node is reachable — paced within the
//! connection's room for requests, so that a replay never overflows a fresh connection.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::ReqKind;
use crate::model::token::Token;

use super::{Engine, OpKind, Waiter, node_bit};

/// The ledger fills at most `max_pending / this` of a connection's outstanding requests at once
/// (see [`Engine::flush_ledger`]): the rest of the room is the callers'.
const LEDGER_SHARE_OF_PENDING: usize = 2;

/// A node that answered a release "not now" (BUSY, LOADING, MASTERDOWN) is sent the ledger's
/// releases again after this pause, doubled at each such answer up to [`BUSY_PAUSE_MAX`]:
/// without it the ledger asked again at every turn of the loop, as fast as the node said no.
const BUSY_PAUSE_MIN: Duration = Duration::from_millis(50);
const BUSY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// Releases not confirmed by a node: sent again when the node is reachable, even after the key
/// would have expired (see [`Engine::flush_ledger`]); `expires` orders them, the first to
/// expire dropped first when a node's list is full.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub nodes: Vec<VecDeque<Unconfirmed>>,
    pub len: usize,
    /// Per node: not sent to before this instant, and the pause that set it (see
    /// [`Ledger::not_now`]).
    busy: Vec<(Option<Instant>, Duration)>,
}

#[derive(Debug)]
pub(super) struct Unconfirmed {
    resource: Vec<u8>,
    token: Token,
    expires: Instant,
}

impl Ledger {
    pub fn new(n: usize) -> Ledger {
        Ledger {
            nodes: (0..n).map(|_| VecDeque::new()).collect(),
            len: 0,
            busy: vec![(None, Duration::ZERO); n],
        }
    }

    /// `node` answered a release "not now": its releases wait a pause, doubling while it
    /// keeps answering so — again before twice its last pause has passed since that pause
    /// ended; later, the pause starts over (no bookkeeping on the replies that say yes: they
    /// are the hot path's).
    pub fn not_now(&mut self, node: usize, now: Instant) {
        let (until, last) = self.busy[node];
        let pause = match until {
            Some(t) if now < t + last * 2 => (last * 2).min(BUSY_PAUSE_MAX),
            _ => BUSY_PAUSE_MIN,
        };
        self.busy[node] = (Some(now + pause), pause);
        // The node is reachable: no `SET` of its can still be waiting to run, so entries whose
        // keys have expired are done with (a node that keeps answering MASTERDOWN was asked for
        // them every 2 s for good).
        let q = &mut self.nodes[node];
        let before = q.len();
        q.retain(|e| e.expires > now);
        self.len -= before - q.len();
    }

    /// Until when `node` is not sent to (a pause after "not now" not over at `now`).
    pub fn paused_until(&self, node: usize, now: Instant) -> Option<Instant> {
        self.busy[node].0.filter(|&t| t > now)
    }

    /// Remembers a release to send again; at most `max` per node. A full list keeps what it
    /// has and drops the new entry: entries pile up while their node is unreachable, and the
    /// first ones are those whose `SET`s may have been written before it failed (a frozen
    /// node may still run them), while later requests failed at once, their `SET`s never
    /// sent.
    pub fn add(
        &mut self,
        node: usize,
        resource: Vec<u8>,
        token: Token,
        expires: Instant,
        max: usize,
    ) {
        let q = &mut self.nodes[node];
        if q.len() >= max || q.iter().any(|e| e.token == token && e.resource == resource) {
            return;
        }
        let at = q.partition_point(|e| e.expires <= expires);
        q.insert(
            at,
            Unconfirmed {
                resource,
                token,
                expires,
            },
        );
        self.len += 1;
    }

    /// Entries whose keys may still live at `now`.
    pub fn live(&self, now: Instant) -> usize {
        (self.nodes.iter())
            .map(|q| q.iter().filter(|e| e.expires > now).count())
            .sum()
    }
}

impl<N: Net> Engine<N> {
    /// Releases not confirmed yet: (release requests in flight, ledger entries).
    pub fn unconfirmed_parts(&self) -> (usize, usize) {
        let in_flight = (self.core.ops.iter().enumerate())
            .filter(|&(i, o)| self.core.is_live(i) && o.kind == OpKind::Release)
            .map(|(_, o)| o)
            .map(|o| o.outstanding as usize)
            .sum();
        (in_flight, self.core.ledger.len)
    }

    /// Releases not confirmed yet whose keys may still live at `now`: in flight, and the
    /// ledger's entries that have not expired (an expired one is still sent when its node is
    /// back, for a `SET` a frozen node may run late, but a process shutting down need not wait
    /// for it).
    pub(super) fn unconfirmed_live(&self, now: Instant) -> usize {
        let (in_flight, _) = self.unconfirmed_parts();
        in_flight + self.core.ledger.live(now)
    }

    /// Releases are waiting in the ledger for their node.
    pub fn has_ledger(&self) -> bool {
        self.core.ledger.len > 0
    }

    /// Sends the ledger's releases to nodes that can take them, paced within the connection's
    /// room for requests.
    ///
    /// An entry whose key's TTL has passed is sent all the same once its node is back (it
    /// stays in the ledger only while its node is unreachable): a node frozen (SIGSTOP, a VM
    /// pause) longer than the TTL runs, when it resumes, a `SET` still in its socket buffer,
    /// and that key would block the resource there for a TTL. The release goes out on a new
    /// connection, behind a handshake the node answers only once it runs again, so after the
    /// stale `SET`; it deletes only our own token. At most `max_pending` entries per node
    /// (`Ledger::add` keeps what it has and drops the new entry).
    ///
    /// Paced: at most half of `max_pending` requests outstanding on the connection at once
    /// (the replies bring the next turn), so the ledger's burst leaves a fresh connection room
    /// for the callers' requests. (Under steady load the callers' requests may keep it above
    /// half, and the ledger waits: its keys' TTLs bound what that costs.)
    pub(super) fn flush_ledger(&mut self, now: Instant) {
        if self.core.ledger.len == 0 {
            return;
        }
        for node in 0..self.shared.nodes.len() {
            if self.core.ledger.nodes[node].is_empty() {
                continue;
            }
            if self.core.ledger.paused_until(node, now).is_some() {
                continue;
            }
            let conn = self.net.session(node);
            if !conn.is_ready() {
                // Reconnect if not backing off; the next turn tries again.
                if !conn.is_connecting() {
                    let Engine { net, core, .. } = self;
                    let _ = net.ensure_connected(node, now, &mut core.sink());
                }
                continue;
            }
            let share = match self.core.mutation.ledger_unpaced() {
                true => self.core.max_pending,
                false => (self.core.max_pending / LEDGER_SHARE_OF_PENDING).max(1),
            };
            let room = share.saturating_sub(conn.pending());
            for _ in 0..room {
                let Some(e) = self.core.ledger.nodes[node].pop_front() else {
                    break;
                };
                self.core.ledger.len -= 1;
                self.replay_until = Some(e.expires);
                // Sent again with the token it first went with: a set's lock released by its
                // family already carries it, and a lost attempt's cleanup stays exact.
                self.exact_release = true;
                let bit = node_bit(node);
                self.submit_to(
                    ReqKind::Release,
                    &e.resource,
                    &e.token,
                    Waiter::None,
                    bit,
                    now,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_full_list_keeps_its_oldest_entries_and_never_holds_one_twice() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let token = |b: u8| Token::from_bytes(&[b; 20]).unwrap();
        let mut ledger = Ledger::new(2);
        ledger.add(0, b"x".to_vec(), token(1), now + s(3), 2);
        ledger.add(0, b"x".to_vec(), token(1), now + s(3), 2);
        ledger.add(0, b"y".to_vec(), token(2), now + s(1), 2);
        ledger.add(0, b"z".to_vec(), token(3), now + s(2), 2);
        assert_eq!(ledger.len, 2);
        // Ordered by expiry: what expires first is sent first.
        let order: Vec<&[u8]> = ledger.nodes[0].iter().map(|e| &e.resource[..]).collect();
        assert_eq!(order, [&b"y"[..], &b"x"[..]]);
        assert_eq!(ledger.live(now + s(1)), 1, "y has expired at +1 s");
        assert!(ledger.nodes[1].is_empty());
    }

    #[test]
    fn a_node_that_says_not_now_is_asked_again_after_a_doubling_pause() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut ledger = Ledger::new(2);
        let mut pauses = Vec::new();
        for _ in 0..8 {
            ledger.not_now(1, now);
            pauses.push((ledger.paused_until(1, now).unwrap() - now).as_millis());
        }
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(ledger.paused_until(0, now), None);
        assert_eq!(ledger.paused_until(1, now + ms(2000)), None, "over");
        // Entries whose keys have expired go at a "not now" (the node is reachable).
        let token = Token::from_bytes(&[7; 20]).unwrap();
        ledger.add(1, b"old".to_vec(), token, now + ms(10), 8);
        ledger.add(1, b"new".to_vec(), token, now + ms(60_000), 8);
        assert_eq!(ledger.len, 2);
        ledger.not_now(1, now + ms(20));
        assert_eq!(ledger.len, 1);
        assert_eq!(ledger.nodes[1][0].resource, b"new");
        // Not now again long after the last pause ended (twice its length): from the start.
        let later = now + ms(20 + 2000 + 4001);
        ledger.not_now(1, later);
        assert_eq!(ledger.paused_until(1, later), Some(later + ms(50)));
    }
}
