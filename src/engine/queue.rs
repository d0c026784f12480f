//! Callers of one engine waiting for the same resource: a FIFO queue per contended resource, of
//! which only the head competes on the wire.
//!
//! A waiting acquire ([`ReqKind::Wait`](crate::engine::request::ReqKind::Wait)) is an operation of the
//! engine's slab that sends nothing itself: it makes attempts (ordinary acquires, each with a
//! token of its own) until one wins or its deadline passes. While nobody else of this engine
//! waits for the resource, the first attempt goes out at once and no queue exists (the
//! uncontended path costs one hash lookup, and only while some queue exists). A refused attempt
//! opens the queue; later callers line up behind it and make no attempt until they are at its
//! head. When the head wins, the next caller becomes the head and waits for the release.
//!
//! What brings the head's next attempt:
//! - a release of the resource submitted by this engine (any caller's `unlock`, a dropped
//!   guard): the attempt is submitted right behind the release, so it goes out in the same
//!   write and each node runs it after the delete — the local hand-off costs one round trip;
//! - a release notice published by another client (see `engine/notice.rs`): at once if nobody
//!   else heard it, otherwise after a random pause over a span that grows with the clients that
//!   did (the notice says how many: [`crowd_pause`]), so that they do not all attempt at the
//!   same moment and split the votes (notices from the other nodes do not cut it short);
//! - the fallback poll, `retry_delay` plus up to `retry_jitter`, for locks that expire or are
//!   released by clients that do not publish;
//! - after a split vote (some nodes said yes, too few for a quorum: another client's attempt
//!   raced ours), a random pause that doubles with every split in a row ([`split_pause`]);
//!   notices do not cut it short, or every loser of a split would come back at once and split
//!   again.
//!
//! Local hand-offs are not endless: after [`MAX_STREAK`] in a row, if other clients were known
//! to be waiting at the last release (they were subscribed to its notice), the next local head
//! steps back for a short pause before attempting, and the remote waiters, woken by the notice,
//! get their chance. (Not a fair lock's: its queue on the nodes decides who is next, and the
//! local head's attempt carries its entry.)
//!
//! Everything here is data and arithmetic; the engine drives it (`engine/wait.rs`), with `now` as an
//! argument and randomness from a seeded generator, so the simulator replays it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use std::time::Instant;

use crate::engine::request::OpId;
use crate::model::config::Config;
use crate::model::error::Error;

/// Local hand-offs in a row after which the next local head yields to known remote waiters.
pub(crate) const MAX_STREAK: u32 = 8;

/// The queues of contended resources.
pub(crate) struct Waits {
    queues: HashMap<Vec<u8>, Queue>,
    /// Keys and waiter lists of closed queues, reused: a resource that is contended again and
    /// again does not allocate each time.
    spare: Vec<(Vec<u8>, VecDeque<OpId>)>,
    /// xorshift64* state for the pauses.
    rng: u64,
}

/// The callers of this engine waiting for one resource.
#[derive(Debug)]
pub(crate) struct Queue {
    /// Waiting operations in arrival order; the first is the head.
    pub waiters: VecDeque<OpId>,
    /// The head's attempt in flight.
    pub attempt: Option<OpId>,
    /// When the head attempts next (if no attempt is in flight).
    pub try_at: Instant,
    /// Releases and notices do not bring the next attempt before this: a split vote's pause,
    /// the head yielding to remote waiters, or its place in a crowd woken by one notice.
    pub not_before: Option<Instant>,
    /// A release or notice came while the attempt was in flight: if it is refused, try again
    /// at once.
    pub released: bool,
    /// Split votes in a row.
    pub splits: u32,
    /// Acquisitions in a row by this engine's callers.
    pub streak: u32,
    /// A caller of this engine holds the resource (won through this queue, not released
    /// here since) until then at the latest: the head waits for that release, or for this
    /// instant (the lock may expire unreleased), instead of polling.
    pub held_until: Option<Instant>,
    /// Other clients subscribed to the notice of the last release we saw answered (on the
    /// node that answered last): they wait too.
    pub remote: u32,
    /// The crowd woken by the last release notice we heard, as the rounds its attempts spread
    /// over ([`crowd_rounds`] of its payload): they may all attempt now, so the head's attempt
    /// after it is spread ([`crowd_pause`]); 0 after a release of ours, a notice that does not
    /// say, or one that only we heard.
    pub crowd: u32,
    /// The head's attempt in flight went out behind a waiting mark (`redlock:waiting:<name>`):
    /// if it is refused, a release by another client publishes its notice. An attempt right
    /// behind our own release, or the first from a lingering queue, goes without one: refused,
    /// it is made again at once, marked.
    pub marked: bool,
    /// Subscribed to the resource's release notices (nodes, as a bit set).
    pub subscribed: u64,
    /// The head's last failure: what a caller gets whose deadline passes while it waits.
    pub last_error: Error,
    /// Why the wait goes on, as the last `waiting` event said it; `None` until one is said,
    /// and again once a caller of ours wins.
    pub said: Option<WaitReason>,
    /// Since when callers of ours have waited for the resource without one winning: the
    /// queue's opening, then each win. The `waiting` event's `waited_ms` counts from here, so
    /// that waits made of short calls one after the other (a caller's loop of
    /// `lock_until` with near deadlines; the lingering queue keeps them together) are one wait.
    pub since: Instant,
    /// The earliest deadline of the waiters (they are looked at when it has passed).
    pub earliest: Instant,
    /// Nobody has waited since then: the queue is closed after [`LINGER`]. Kept meanwhile, a
    /// caller that comes back (the usual pattern: lock, work, unlock, lock again) finds it, and
    /// its attempt learns of a release that comes while it is in flight.
    pub idle_since: Option<Instant>,
    /// When the waiters behind the head are next looked at for callers that are gone
    /// ([`CANCEL_SWEEP`]).
    pub cancel_sweep: Instant,
}

/// How often a queue's waiters behind its head are looked at for callers that are gone (an
/// async caller that dropped its future): they leave then, rather than at their deadline.
/// The head's caller is looked at every turn. Not every turn for the others: looking costs a
/// lock per waiter. So a dropped wait holds its place (a slot and an entry) at most this long
/// and a turn (a task that times its waits out in a loop behind a long head
/// piled up an operation per drop — per permit, for a semaphore — until their deadlines).
pub(crate) const CANCEL_SWEEP: Duration = Duration::from_millis(50);

/// How long an empty queue is kept (and its subscriptions).
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// A lock held elsewhere is said (the `waiting` event) once the wait has lasted this long, as
/// `flock` waits in silence for a moment; any other reason at once.
pub(crate) const SAY_HELD_AFTER: Duration = Duration::from_secs(1);

/// Why a queue's head waits, as the `waiting` event names it (`reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitReason {
    /// Held by another token.
    Held,
    /// No quorum only because nodes are in their restart quarantine.
    Quarantine,
    /// No quorum: nodes down, unreachable or too slow (or too slow to leave any validity).
    NoQuorum,
    /// Anything else (no fence read).
    Other,
}

impl Queue {
    /// A caller of ours won: the wait that the `waiting` event tells of is over.
    pub fn wait_over(&mut self, now: Instant) {
        self.said = None;
        self.since = now;
    }
}

impl WaitReason {
    /// The reason `error` (a lost attempt's) gives.
    pub fn of(error: &Error) -> WaitReason {
        match error {
            Error::Held(_) => WaitReason::Held,
            Error::TooSlow(_) => WaitReason::NoQuorum,
            Error::NoQuorum(r) if r.short_by_quarantine() => WaitReason::Quarantine,
            Error::NoQuorum(_) => WaitReason::NoQuorum,
            _ => WaitReason::Other,
        }
    }

    /// Its name in the event.
    #[cfg_attr(not(feature = "log"), allow(dead_code))]
    pub fn name(self) -> &'static str {
        match self {
            WaitReason::Held => "held",
            WaitReason::Quarantine => "quarantined",
            WaitReason::NoQuorum => "no_quorum",
            WaitReason::Other => "other",
        }
    }
}

impl Waits {
    pub fn new(seed: u64) -> Waits {
        Waits {
            queues: HashMap::new(),
            spare: Vec::new(),
            rng: seed | 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    pub fn get(&self, resource: &[u8]) -> Option<&Queue> {
        self.queues.get(resource)
    }

    pub fn get_mut(&mut self, resource: &[u8]) -> Option<&mut Queue> {
        self.queues.get_mut(resource)
    }

    /// Opens the queue of `resource` with `head` at its head, after its attempt failed with
    /// `error`.
    pub fn open(&mut self, resource: &[u8], head: OpId, error: Error, now: Instant) -> &mut Queue {
        let (mut key, mut waiters) = self.spare.pop().unwrap_or_default();
        key.clear();
        key.extend_from_slice(resource);
        waiters.clear();
        waiters.push_back(head);
        self.queues.entry(key).or_insert(Queue {
            waiters,
            attempt: None,
            try_at: now,
            not_before: None,
            released: false,
            splits: 0,
            streak: 0,
            held_until: None,
            remote: 0,
            crowd: 0,
            marked: false,
            subscribed: 0,
            last_error: error,
            said: None,
            since: now,
            earliest: now,
            idle_since: None,
            cancel_sweep: now + CANCEL_SWEEP,
        })
    }

    /// Closes the queues nobody has waited in for [`LINGER`]; `closed` gets each one's
    /// resource and the nodes it was subscribed on.
    pub fn close_idle(&mut self, now: Instant, mut closed: impl FnMut(&[u8], u64)) {
        let spare = &mut self.spare;
        self.queues.retain(|key, q| {
            let idle = q
                .idle_since
                .is_some_and(|t| now.saturating_duration_since(t) >= LINGER);
            if idle {
                closed(key, q.subscribed);
                if spare.len() < MAX_SPARE_QUEUES {
                    spare.push((Vec::new(), std::mem::take(&mut q.waiters)));
                }
            }
            !idle
        });
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &Queue)> {
        self.queues.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Vec<u8>, &mut Queue)> {
        self.queues.iter_mut()
    }

    /// A random `u64` (xorshift64*): seeded per engine, so the simulator replays it and two
    /// processes do not pause alike.
    pub fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// When the engine needs to look at the queues next: a head's attempt due, a deadline.
    pub fn next(&self) -> Option<Instant> {
        self.queues
            .values()
            .map(|q| match (q.idle_since, q.attempt) {
                (Some(t), _) => t + LINGER,
                (None, None) => q.try_at.min(q.earliest),
                (None, Some(_)) => q.earliest,
            })
            .min()
    }
}

impl Queue {
    /// When the head tries again after a refusal (no release seen meanwhile): after the
    /// fallback `poll`, or at the end of a local holder's lock if that comes first. Not at the
    /// end of a local holder's lock when it comes later: the lock can be released where this
    /// engine does not see it (`Lock::from_parts` in another handle, `redlock release` in
    /// another process), and the waiters slept until its validity ended — past their
    /// deadlines, the resource free for seconds (`tests/contention.rs`).
    pub fn after_refusal(&self, now: Instant, poll: Duration) -> Instant {
        match self.held_until {
            Some(t) if t > now => t.min(now + poll),
            _ => now + poll,
        }
    }

    /// Notes when the queue became empty (or that it is not).
    pub fn touch(&mut self, now: Instant) {
        if self.waiters.is_empty() && self.attempt.is_none() {
            self.idle_since.get_or_insert(now);
        } else {
            self.idle_since = None;
        }
    }

    /// The attempt of waiting operation `id` was decided (if it was the head's in flight).
    pub fn attempt_decided(&mut self, id: OpId) {
        if self.attempt == Some(id) {
            self.attempt = None;
        }
    }

    /// The waiting operation `id` is done: its attempt decided, and out of the queue; true if it
    /// was the head.
    pub fn leave(&mut self, id: OpId) -> bool {
        self.attempt_decided(id);
        self.remove(id)
    }

    /// Takes `id` out of the queue, wherever it is; true if it was the head.
    pub fn remove(&mut self, id: OpId) -> bool {
        match self.waiters.iter().position(|&w| w == id) {
            Some(0) => {
                self.waiters.pop_front();
                true
            }
            Some(i) => {
                self.waiters.remove(i);
                false
            }
            None => false,
        }
    }

    /// A release of the resource was seen (ours, or another client's notice): when the head
    /// attempts, `None` if an attempt is in flight (it is marked to try again if refused).
    /// `round` is the last round's duration, `random` (uniform over `u64`) picks the head's
    /// place in a crowd.
    pub fn on_release(
        &mut self,
        now: Instant,
        (round, random): (Duration, u64),
        seen: Seen,
    ) -> Option<Instant> {
        let local = seen == Seen::Ours;
        self.crowd = match seen {
            Seen::Ours => 0,
            Seen::Notice(listeners) => crowd_rounds(listeners),
        };
        if local {
            self.held_until = None;
        }
        if self.attempt.is_some() {
            self.released = true;
            return None;
        }
        if local && self.streak >= MAX_STREAK && self.remote > 0 {
            // Our callers have had it MAX_STREAK times in a row while others wait: step back
            // long enough for a notified remote waiter's attempt to land first — they spread
            // theirs over a round each (`crowd_rounds`; a lone one attempts at once, and the
            // round we wait for it anyway is spare) — (our own notice, which comes next, does
            // not cut this short).
            let crowd = crowd_pause(self.remote, round, u64::MAX);
            self.not_before = Some(now + yield_pause(round) + crowd);
            self.streak = 0;
        } else if self.crowd > 0 && self.not_before.is_none_or(|t| t <= now) {
            // Other clients heard the same notice: each takes its own place in the crowd (the
            // notices from the other nodes, which come next, do not move it).
            self.not_before = Some(now + crowd_pause(self.crowd, round, random));
        }
        let at = self.not_before.map_or(now, |t| t.max(now));
        self.try_at = at;
        Some(at)
    }
}

/// How a release of a resource that callers wait for was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A caller of this engine released it (the release was submitted here).
    Ours,
    /// Another client's release notice, with the number of clients subscribed to it on that
    /// node, the releaser not counted (its payload; 0: not known — a resubscription that may have missed one, or a
    /// releaser that does not count).
    Notice(u32),
}

/// The wait before the next try: the retry delay plus a share of the jitter picked by
/// `random` (uniform over `u64`). The randomness is an input, so a simulator replays it.
pub(crate) fn retry_pause(config: &Config, random: u64) -> Duration {
    let share = random as f64 / (u64::MAX as f64 + 1.0);
    config.retry_delay + config.retry_jitter.mul_f64(share)
}

/// The shortest yield: a loopback round trip can be a few µs, too short for the remote
/// waiter's attempt to land first.
const MIN_YIELD_PAUSE: Duration = Duration::from_millis(1);

/// The pause of a local head that yields to remote waiters: two round trips (theirs: the
/// notice, then their attempt), at least a millisecond.
pub(crate) fn yield_pause(round: Duration) -> Duration {
    (round * 2).max(MIN_YIELD_PAUSE)
}

/// The shortest base of a split vote's pause: a loopback round trip can be a few µs, too short
/// for competing clients to spread out.
const MIN_SPLIT_BASE: Duration = Duration::from_micros(500);
/// A split vote's pause doubles at most this many times (64 rounds): enough for dozens of
/// competitors to spread out, without a pause longer than a retry delay.
const MAX_SPLIT_DOUBLINGS: u32 = 6;
/// A crowd's pause spreads its attempts over at most this many rounds (as far as a split's
/// pause doubles to; the waits' liveness bounds have a term for each: `sim::WAIT_BOUND`,
/// the soak's `Bound`).
const MAX_CROWD_ROUNDS: u32 = 1 << MAX_SPLIT_DOUBLINGS;

/// The span, in rounds, over which the waiters woken by a release notice that counts
/// `listeners` (the clients subscribed, the releaser not counted: they all may attempt at the
/// same moment) spread their attempts: a round each when more than one heard it, one round
/// more than the others (the span it had when a subscribed releaser was counted), so that the
/// releaser's own next attempt — its callers may lock again at once, and that attempt is not
/// spread — meets fewer of theirs in the first round; none for a waiter alone, which then
/// races only the releaser's attempt (spread, it lost that race nearly every time: with two
/// clients behind 800 µs relays the acquire's p99 doubled).
pub(crate) fn crowd_rounds(listeners: u32) -> u32 {
    if listeners > 1 { listeners } else { 0 }
}

/// The pause before the attempt of a waiter that heard a release notice with a crowd of
/// `rounds` ([`crowd_rounds`]): uniform in `0..rounds × base` (`base`: the last round, at least
/// 500 µs; at most 64 of them). Without it every waiter attempts at once, their votes split
/// (each node says yes to whichever attempt reaches it first), and all of them pause and try
/// again. Spread over a span that grows with the crowd, the first attempt still comes after
/// about one `base` however many wait, and the next ones, a round or more later, find the
/// resource taken (a refusal: they wait for the next notice) instead of splitting it. A waiter
/// alone (`rounds` = 0) attempts at once.
pub(crate) fn crowd_pause(rounds: u32, round: Duration, random: u64) -> Duration {
    let base = round.max(MIN_SPLIT_BASE);
    let span = base * rounds.min(MAX_CROWD_ROUNDS);
    let share = random as f64 / (u64::MAX as f64 + 1.0);
    span.mul_f64(share)
}

/// Closed queues kept for reuse (their buffers): more than the resources usually waited for
/// at once, so a busy engine does not allocate a queue per wait.
const MAX_SPARE_QUEUES: usize = 64;

/// The pause after the `splits`th split vote in a row: uniform in `0..base × 2^splits`, where
/// `base` is the last round's duration (at least 500 µs), the exponent capped at 6 (64 rounds).
/// Randomized and growing, so competing clients spread out until one wins alone.
pub(crate) fn split_pause(splits: u32, round: Duration, random: u64) -> Duration {
    let base = round.max(MIN_SPLIT_BASE);
    let span = base * (1u32 << splits.min(MAX_SPLIT_DOUBLINGS));
    let share = random as f64 / (u64::MAX as f64 + 1.0);
    span.mul_f64(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_pauses_grow_and_stay_bounded() {
        let round = Duration::from_micros(200);
        let top = |splits| split_pause(splits, round, u64::MAX);
        assert!(top(1) < top(2) && top(2) < top(3));
        assert!(top(60) <= Duration::from_micros(500) * 64);
        assert_eq!(split_pause(3, round, 0), Duration::ZERO);
    }

    #[test]
    fn a_local_streak_yields_only_to_known_remote_waiters() {
        let now = Instant::now();
        let err = Error::Config(String::new());
        let mut waits = Waits::new(7);
        let id = OpId::for_tests(1);
        let q = waits.open(b"r", id, err, now);
        q.streak = MAX_STREAK;
        assert_eq!(
            q.on_release(now, (Duration::ZERO, 0), Seen::Ours),
            Some(now)
        );
        q.remote = 1;
        let at = q.on_release(now, (Duration::ZERO, 0), Seen::Ours).unwrap();
        // The yield (at least 1 ms) and the span of a crowd of one (at least 500 µs).
        assert!(
            at > now + Duration::from_micros(1_499) && at <= now + Duration::from_micros(1_500)
        );
        assert_eq!(q.streak, 0);
        q.attempt = Some(id);
        assert_eq!(q.on_release(now, (Duration::ZERO, 0), Seen::Ours), None);
        assert!(q.released);
    }

    #[test]
    fn crowd_pauses_grow_with_the_crowd_and_stay_bounded() {
        let round = Duration::from_millis(2);
        let top = |rounds| crowd_pause(rounds, round, u64::MAX);
        assert_eq!(top(0), Duration::ZERO);
        assert!(top(1) < top(2) && top(2) < top(7));
        assert!(top(7) <= round * 7);
        assert!(top(10_000) <= round * 64);
        // A loopback round of a few µs still spreads them over half-milliseconds.
        let tiny = crowd_pause(3, Duration::from_micros(5), u64::MAX);
        assert!(tiny > Duration::from_micros(1_400) && tiny <= Duration::from_micros(1_500));
        assert_eq!(crowd_pause(7, round, 0), Duration::ZERO);
    }

    /// A waiter alone races the releaser's next attempt; a crowd of n spreads over n rounds, the
    /// releaser (not counted) keeping the first.
    #[test]
    fn a_crowd_spreads_over_a_round_per_waiter_a_lone_waiter_not_at_all() {
        assert_eq!(
            [0, 1, 2, 3, 8].map(crowd_rounds),
            [0, 0, 2, 3, 8],
            "listeners → rounds"
        );
    }

    /// A notice that several clients heard spreads the head's attempt; one that only we heard,
    /// one that does not say, and a release of ours bring it at once.
    #[test]
    fn a_notice_heard_by_a_crowd_spreads_the_attempt_a_lone_one_does_not() {
        let now = Instant::now();
        let round = Duration::from_millis(1);
        let err = Error::Config(String::new());
        let mut waits = Waits::new(7);
        let id = OpId::for_tests(1);
        let q = waits.open(b"r", id, err, now);
        for seen in [Seen::Notice(1), Seen::Notice(0), Seen::Ours] {
            assert_eq!(
                q.on_release(now, (round, u64::MAX), seen),
                Some(now),
                "{seen:?}"
            );
            assert_eq!((q.crowd, q.not_before), (0, None));
        }
        // Eight waiting (the releaser not counted): a round each.
        let at = q
            .on_release(now, (round, u64::MAX / 2), Seen::Notice(8))
            .unwrap();
        assert_eq!(q.crowd, 8);
        assert!(at > now && at <= now + round * 8, "{:?}", at - now);
        assert_eq!(q.try_at, at);
        // The same release's notice from the other nodes does not move it.
        let later = now + Duration::from_micros(100);
        assert_eq!(q.on_release(later, (round, 0), Seen::Notice(8)), Some(at));
        // An attempt in flight: noted, the crowd kept for its refusal (`next_try`).
        q.attempt = Some(id);
        assert_eq!(q.on_release(later, (round, 0), Seen::Notice(5)), None);
        assert!(q.released);
        assert_eq!(q.crowd, 5);
    }
}
