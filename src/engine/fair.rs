//! A fair lock's queue ([`Config::fair`](crate::Config::fair)): each waiting acquire's entry
//! on the nodes (`redlock:queue:<resource>`, `FAIR_ACQUIRE_BODY`) is its wait's start on this
//! client's wall clock and its token's family, the same text on every node, so that every node
//! orders the same waiters the same way; a wait that ends leaves the queue
//! (`FAIR_LEAVE_BODY`) instead of keeping its place until its entry expires.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::engine::net::Net;
use crate::engine::request::OpId;
use crate::model::keys::QUEUE_ENTRY_LEN;
use crate::model::token::{FAMILY_LEN, Token};
use crate::proto::resp::Arg;
use crate::proto::scripts::{FAIR_LEAVE_SCRIPT, FAIR_SET_LEAVE_SCRIPT, scripts};

use super::{Engine, keyed_call, nodes_in};

/// Whether this handle's acquires go through the fair lock's queues: with
/// [`Config::fair`](crate::Config::fair), of every kind — a plain lock (one key), a set (the queue
/// of every member: `FAIR_SET_ACQUIRE_BODY`) and a reader (its resource's queue, with an entry
/// of its own kind: `FAIR_SHARED_ACQUIRE_BODY`). Readers that did not queue stepped back for
/// the mark of every waiting fair writer or set, and with a queue that was never empty that
/// mark was always there: a reader of the contention benchmark's fair mix got 6–7 sections in
/// 2 s against a writer's hundreds.
pub(crate) fn applies(config: &crate::Config) -> bool {
    config.fair
}

/// How many decimal digits a queue entry's start has (milliseconds since 1970: 13 digits until
/// the year 2286).
const START_DIGITS: usize = 15;

/// This client's wall clock against its monotonic one: at the instant `.0`, `.1` ms since 1970.
/// Read once, when the engine starts: a start read from the wall clock at every wait would jump
/// with it (an NTP step) and could reorder one client's own waiters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wall(pub Instant, pub u64);

impl Wall {
    /// The wall clock now, against `now`.
    pub fn read(now: Instant) -> Wall {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Wall(now, ms)
    }

    /// Milliseconds since 1970 at `at`, on this clock.
    fn ms(self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.0).as_millis() as u64;
        let before = self.0.saturating_duration_since(at).as_millis() as u64;
        (self.1 + since).saturating_sub(before)
    }

    /// The queue entry of a wait that started at `start` with a token of the family of `token`:
    /// the start in ms (15 digits, so that entries compare as their starts do), a space (a
    /// reader's: `r`, which `FAIR_SHARED_ACQUIRE_BODY` tells from a writer's), the family (its
    /// first [`FAMILY_LEN`] bytes, random: no two waits share it).
    pub fn entry(self, start: Instant, token: &Token, reader: bool) -> [u8; QUEUE_ENTRY_LEN] {
        let mut out = [b'0'; QUEUE_ENTRY_LEN];
        let mut ms = self.ms(start);
        for digit in out[..START_DIGITS].iter_mut().rev() {
            *digit = b'0' + (ms % 10) as u8;
            ms /= 10;
        }
        out[START_DIGITS] = if reader { b'r' } else { b' ' };
        out[START_DIGITS + 1..].copy_from_slice(&token.as_bytes()[..FAMILY_LEN]);
        out
    }
}

impl<N: Net> Engine<N> {
    /// The fair waiting acquire `w` leaves the queue of its resource (a set: of each member) on
    /// the nodes of `nodes` that are ready (the others drop its entry when it expires);
    /// `notice`: if waiters remain and the resource is free there, the next is told (not for a
    /// waiter that won).
    pub(super) fn leave_queue(&mut self, w: OpId, (nodes, notice): (u64, bool), now: Instant) {
        let Engine {
            net,
            core,
            scratch,
            wall,
            waits,
            ..
        } = self;
        let op = &core.ops[w.index as usize];
        let name = crate::model::keys::shared_name(&op.resource);
        let entry = wall.entry(op.start, &op.token, name.is_some());
        let mode: &[u8] = match (notice, super::notice::subscribed_to(waits, &op.resource)) {
            (false, _) => b"0",
            (true, true) => b"1",
            (true, false) => b"2",
        };
        let args = [Arg::Bytes(&entry), Arg::Bytes(mode)];
        let script = match crate::model::keys::set_members(&op.resource) {
            Some(_) => &scripts()[FAIR_SET_LEAVE_SCRIPT],
            None => &scripts()[FAIR_LEAVE_SCRIPT],
        };
        let key = name.unwrap_or(&op.resource);
        let call = keyed_call(scratch, (script, 0), key, None, &args);
        for node in nodes_in(nodes) {
            if net.session(node).is_ready() {
                let _ = net.script(node, call, now, &mut core.sink());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_compare_as_their_starts_and_carry_the_family() {
        let now = Instant::now();
        let wall = Wall(now, 1_765_000_000_123);
        let token = Token::generate().unwrap();
        let a = wall.entry(now, &token, false);
        let b = wall.entry(now + Duration::from_millis(5), &token.variant(3), false);
        assert_eq!(&a[..16], b"001765000000123 ");
        assert_eq!(&a[16..], &token.as_bytes()[..FAMILY_LEN]);
        // Another attempt of the same wait (a token variant) writes the same entry.
        assert_eq!(&a[16..], &b[16..]);
        assert!(a < b);
        // A start before the clock was read.
        let earlier = now.checked_sub(Duration::from_millis(23)).unwrap();
        assert_eq!(
            &wall.entry(earlier, &token, false)[..16],
            b"001765000000100 "
        );
        // A reader's entry: its separator tells it from a writer's, and it sorts as its start.
        let r = wall.entry(now, &token, true);
        assert_eq!(&r[..16], b"001765000000123r");
        assert_eq!(&r[16..], &a[16..]);
        assert!(r < b && a < r);
    }
}
