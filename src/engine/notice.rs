//! Release notices for waiters: the `SUBSCRIBE` to `redlock:released:<resource>` on every node
//! (switching a RESP2 connection to RESP3 first, where a subscribed connection still runs every
//! command), the waiting mark that makes a release publish (`model/keys.rs`), and what replies tell
//! about contended resources — notices, and how many clients a release of ours reached.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::engine::net::Net;
use crate::engine::queue::{Seen, Waits};
use crate::model::keys::{RELEASE_CHANNEL_PREFIX, WAITING_KEY_PREFIX, set_members, shared_name};
use crate::proto::resp::Arg;
use crate::proto::scripts::{MARK_SCRIPT, READER_MARK_SCRIPT, ScriptCall, scripts};
use crate::proto::session::Kind;

use super::{Engine, node_bit, nodes_in};

/// Bounds of a waiting mark's life (see [`Engine::mark_waiting`]).
const MIN_MARK_TTL: Duration = Duration::from_secs(1);
const MAX_MARK_TTL: Duration = Duration::from_secs(24 * 3600);

/// True if the waiters of `resource` listen on the channel of `name`: `name` itself, a set
/// holding it, or its shared form.
fn listens_on(resource: &[u8], name: &[u8]) -> bool {
    resource == name
        || shared_name(resource) == Some(name)
        || set_members(resource).is_some_and(|mut m| m.any(|m| m == name))
}

/// True if a queue of `waits` still open listens for `name`'s notices (its own, a set's, a
/// reader's): the engine is subscribed to `name`'s channel.
fn listened(waits: &Waits, name: &[u8]) -> bool {
    (waits.iter()).any(|(r, q)| q.subscribed != 0 && listens_on(r, name))
}

/// True if the engine is subscribed to the notices a release of `resource` publishes, so that
/// the release script leaves it out of their count: its own queue's subscription (one lookup:
/// the usual case), or another open queue's on the same channel — a set holding it, its
/// readers, the writer a reader's release wakes. A set's release counts us out only if we
/// listen on every member's channel (the script takes one switch for all of them).
pub(super) fn subscribed_to(waits: &Waits, resource: &[u8]) -> bool {
    if waits.get(resource).is_some_and(|q| q.subscribed != 0) {
        return true;
    }
    if waits.is_empty() {
        return false;
    }
    match set_members(resource) {
        Some(mut members) => members.all(|m| listened(waits, m)),
        None => listened(waits, shared_name(resource).unwrap_or(resource)),
    }
}

impl<N: Net> Engine<N> {
    /// What replies told about contended resources: notices bring the waiting head's attempt;
    /// a release of ours that reached other clients' subscriptions says that others wait.
    pub(super) fn take_events(&mut self, now: Instant) {
        if self.core.notices.is_empty() && self.core.listened.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.core.events);
        let mut notices = std::mem::take(&mut self.core.notices);
        let mut listened = std::mem::take(&mut self.core.listened);
        for &(start, end, listeners) in &listened {
            if let Some(q) = self.waits.get_mut(&events[start..end]) {
                // Our own subscription on that node is one of them.
                let others = listeners.saturating_sub(u64::from(q.subscribed != 0));
                q.remote = u32::try_from(others).unwrap_or(u32::MAX);
            }
        }
        for &(start, end, listeners) in &notices {
            self.released(&events[start..end], now, Seen::Notice(listeners));
            self.released_related(&events[start..end], now, listeners);
        }
        notices.clear();
        listened.clear();
        self.core.notices = notices;
        self.core.listened = listened;
        let mut events = events;
        events.clear();
        self.core.events = events;
    }

    /// A notice for `name` is one for every other queue that listens on its channel: the
    /// sets that hold it (all-or-none locks listen on their members' channels) and its
    /// readers.
    fn released_related(&mut self, name: &[u8], now: Instant, listeners: u32) {
        let mut related: Vec<Vec<u8>> = (self.waits.iter())
            .filter(|(r, _)| r.as_slice() != name && listens_on(r, name))
            .map(|(r, _)| r.clone())
            .collect();
        // The queues' order is the hash map's: sorted, so that a simulated schedule replays.
        related.sort();
        for resource in related {
            self.released(&resource, now, Seen::Notice(listeners));
        }
    }

    /// True if a queue still open listens for `name`'s notices: its own, a set's, a reader's.
    fn listened_for(&self, name: &[u8]) -> bool {
        listened(&self.waits, name)
    }

    /// True if `node`'s connection speaks RESP3 (where a subscribed connection still runs
    /// every command).
    fn speaks_resp3(&self, node: usize) -> bool {
        self.shared.nodes[node].protocol == 3
            || self.core.resp3[node] == Some(self.net.session(node).generation())
    }

    /// Switches `node`'s RESP2 connection to RESP3 (`HELLO 3`) unless that is under way.
    fn upgrade(&mut self, node: usize, now: Instant) {
        let generation = self.net.session(node).generation();
        if self.upgrading[node] == Some(generation) {
            return;
        }
        let mut hello = BytesMut::new();
        crate::proto::resp::encode_command(&mut hello, &[Arg::Bytes(b"HELLO"), Arg::Bytes(b"3")]);
        let Engine { net, core, .. } = self;
        if net
            .request(node, Kind::Upgrade, 0, &hello, now, &mut core.sink())
            .is_ok()
        {
            self.upgrading[node] = Some(generation);
        }
    }

    /// `SUBSCRIBE` (or `UNSUBSCRIBE`) to the release notices of `resource` on the nodes in
    /// `nodes` that are ready, speak RESP3 and allow it; the others are switched to RESP3 and
    /// subscribed later by [`Engine::resubscribe`].
    ///
    /// A set listens on each member's channel; a channel another open queue still listens on
    /// (a member of two sets, or a set's member locked alone) is not unsubscribed.
    pub(super) fn subscription(&mut self, verb: &[u8], resource: &[u8], nodes: u64, now: Instant) {
        let leaving = verb == b"UNSUBSCRIBE";
        if let Some(members) = set_members(resource) {
            for member in members {
                if !(leaving && self.listened_for(member)) {
                    self.subscription_of(verb, member, nodes, now);
                }
            }
        } else {
            // A reader listens on its resource's channel.
            let name = shared_name(resource).unwrap_or(resource);
            if !(leaving && self.listened_for(name)) {
                self.subscription_of(verb, name, nodes, now);
            }
        }
    }

    /// [`Engine::subscription`] for one channel.
    fn subscription_of(&mut self, verb: &[u8], resource: &[u8], nodes: u64, now: Instant) {
        let mut ready = 0;
        for node in nodes_in(nodes) {
            if self.core.no_notices[node] || !self.net.session(node).is_ready() {
                continue;
            }
            if self.speaks_resp3(node) {
                ready |= node_bit(node);
            } else if verb == b"SUBSCRIBE" {
                self.upgrade(node, now);
            }
        }
        let Engine {
            net, core, scratch, ..
        } = self;
        scratch.clear();
        let prefix = RELEASE_CHANNEL_PREFIX.as_bytes();
        crate::proto::resp::encode_array_header(scratch, 2);
        crate::proto::resp::encode_bulk(scratch, &Arg::Bytes(verb));
        // The channel, `prefix + resource`, as one bulk string without a copy.
        let _ = write!(scratch, "${}\r\n", prefix.len() + resource.len());
        scratch.extend_from_slice(prefix);
        scratch.extend_from_slice(resource);
        scratch.extend_from_slice(b"\r\n");
        for node in nodes_in(ready) {
            let _ = net.request(node, Kind::Subscribe, 0, scratch, now, &mut core.sink());
        }
    }

    /// The mark script (`model/keys.rs`: `redlock:waiting:<resource>` set to the mark value with a
    /// TTL, only where no key or a mark is) on the nodes in `nodes` that are ready and take
    /// subscriptions: the mark that makes a release publish its notice (see `RELEASE_BODY`).
    /// It outlives two fallback polls (at least a second), so a waiter that polls keeps it; a
    /// release takes it. The reply is not waited for.
    pub(super) fn mark_waiting(&mut self, resource: &[u8], nodes: u64, now: Instant) {
        if let Some(members) = set_members(resource) {
            // A set waits for each of its members, with the reader's mark: it must not keep
            // readers of a free member out while it waits for another member (they would wait
            // for nobody, as long as that other member stays held: the simulator's seed 18472
            // with `--sets --shared`). A set so gets no preference over readers. A fair set
            // (`Config::fair`) keeps its members from younger fair waiters while it waits
            // anyway (its entries in their queues), and readers with them, as a writer's mark
            // does: readers that came and went on one member kept it waiting, and the fair
            // waiters of its other members behind it, for as long as they kept coming (the
            // simulator, `--fair --shared --sets`: 3.1 s while nobody held, seed 6270).
            let script = match super::fair::applies(&self.shared.config)
                && self.shared.config.release_notices
            {
                true => MARK_SCRIPT,
                false => READER_MARK_SCRIPT,
            };
            for member in members {
                self.mark(member, script, nodes, now);
            }
            return;
        }
        // A reader marks its resource with the reader's mark, which keeps no reader out. So
        // does a writer whose own releases are quiet (`release_notices(false)`): they leave
        // marks in place, and a writer's mark left after its release kept readers out of a free
        // resource until the mark expired. Such a writer gets no preference
        // over readers; other clients' releases still announce themselves to it.
        match shared_name(resource) {
            Some(name) => self.mark(name, READER_MARK_SCRIPT, nodes, now),
            None if !self.shared.config.release_notices => {
                self.mark(resource, READER_MARK_SCRIPT, nodes, now)
            }
            None => self.mark(resource, MARK_SCRIPT, nodes, now),
        }
    }

    /// [`Engine::mark_waiting`] of one resource with the mark script `script`.
    pub(super) fn mark(&mut self, resource: &[u8], script: usize, nodes: u64, now: Instant) {
        let ttl = mark_ttl(&self.shared.config);
        let Engine {
            net, core, scratch, ..
        } = self;
        scratch.clear();
        let prefix = WAITING_KEY_PREFIX.as_bytes();
        // The script's tail: numkeys 1, the key `prefix + resource` as one bulk string
        // without a copy, the TTL.
        crate::proto::resp::encode_bulk(scratch, &Arg::Int(1));
        let _ = write!(scratch, "${}\r\n", prefix.len() + resource.len());
        scratch.extend_from_slice(prefix);
        scratch.extend_from_slice(resource);
        scratch.extend_from_slice(b"\r\n");
        crate::proto::resp::encode_bulk(scratch, &Arg::UInt(ttl.as_millis() as u64));
        let call = ScriptCall {
            script: &scripts()[script],
            tag: 0,
            tail: scratch,
            argc: 3,
        };
        for node in nodes_in(nodes) {
            if core.no_notices[node] || !net.session(node).is_ready() {
                continue;
            }
            let _ = net.script(node, call, now, &mut core.sink());
        }
    }

    /// Subscribes on connections that have none of our subscriptions yet (new since, or just
    /// switched to RESP3); the head of each queue subscribed there tries once more, behind the
    /// subscription, in case a release came before it.
    pub(super) fn resubscribe(&mut self, now: Instant) {
        for node in 0..self.shared.nodes.len() {
            let session = self.net.session(node);
            let generation = session.generation();
            if !session.is_ready() || generation == self.sub_gen[node] || self.core.no_notices[node]
            {
                continue;
            }
            let bit = node_bit(node);
            if !self.waits.iter().any(|(_, q)| q.subscribed & bit != 0) {
                continue;
            }
            if !self.speaks_resp3(node) {
                self.upgrade(node, now);
                continue;
            }
            self.sub_gen[node] = generation;
            // Rare (a new connection): the copies may allocate.
            let mut resources: Vec<Vec<u8>> = (self.waits.iter())
                .filter(|(_, q)| q.subscribed & bit != 0)
                .map(|(r, _)| r.clone())
                .collect();
            resources.sort();
            for resource in &resources {
                self.subscription(b"SUBSCRIBE", resource, bit, now);
                // Whatever was missed, its crowd is not known.
                self.released(resource, now, Seen::Notice(0));
            }
        }
    }
}

/// How long a waiting mark lives after the attempt it was set for: two fallback polls, within
/// `MIN_MARK_TTL..=MAX_MARK_TTL`.
pub(crate) fn mark_ttl(config: &crate::model::config::Config) -> std::time::Duration {
    (config.retry_delay.saturating_add(config.retry_jitter))
        .saturating_mul(2)
        .clamp(MIN_MARK_TTL, MAX_MARK_TTL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::OpId;
    use crate::model::error::Error;
    use crate::model::lock::{ResourceSet, Shared};

    /// A release counts the engine out wherever a queue of it listens on the release's
    /// channel: its own, its readers' (for the writer), the writer's (for a reader), a set's;
    /// a set's release only where every member's channel is listened.
    #[test]
    fn a_release_counts_us_out_wherever_a_queue_of_ours_listens() {
        let now = Instant::now();
        let error = || Error::Expired { released: 0 };
        let reader = Shared::new("x").unwrap();
        let (reader, xy, xz) = (
            reader.as_ref().to_vec(),
            ResourceSet::new(["x", "y"]).unwrap(),
            ResourceSet::new(["x", "z"]).unwrap(),
        );
        let mut waits = Waits::new(1);
        assert!(!subscribed_to(&waits, b"x"));
        waits
            .open(&reader, OpId::for_tests(0), error(), now)
            .subscribed = 1;
        assert!(subscribed_to(&waits, b"x"));
        assert!(subscribed_to(&waits, &reader));
        assert!(!subscribed_to(&waits, b"y"));
        assert!(!subscribed_to(&waits, xy.as_ref()));
        waits
            .open(b"y", OpId::for_tests(1), error(), now)
            .subscribed = 1;
        assert!(subscribed_to(&waits, xy.as_ref()));
        assert!(!subscribed_to(&waits, xz.as_ref()));
        // A queue not (yet) subscribed anywhere does not count.
        waits.open(b"z", OpId::for_tests(2), error(), now);
        assert!(!subscribed_to(&waits, b"z"));
    }
}
