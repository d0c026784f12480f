//! One Redlock attempt as a state machine: votes, deadlines, early decision, validity. No I/O, no
//! clock: every input carries `now`, so it can be driven by a virtual clock in tests or embedded
//! in someone else's event loop (tokio, their own `mio` loop).
//!
//! The shape follows `quinn-proto`: inputs through `handle_*` methods, outputs through `poll_*`
//! methods.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use redlock_mux::round::{Round, RoundConfig, Vote, Decision};
//!
//! let t0 = Instant::now();
//! let config = RoundConfig::new(Duration::from_secs(10), 0.01, Duration::from_millis(50));
//! let mut round = Round::new(5);
//! round.start(t0, &config);                  // now send SET ... NX PX to all 5 nodes
//! for node in 0..3 {
//!     round.handle_vote(node, Vote::Yes, t0 + Duration::from_millis(1));
//! }
//! match round.poll_decision() {
//!     Some(Decision::Won { valid_until, .. }) => {
//!         // ttl − elapsed − drift, expressed as a deadline: t0 + 10 s − (100 ms + 2 ms)
//!         assert_eq!(valid_until, t0 + Duration::from_millis(9_898));
//!     }
//!     other => panic!("{other:?}"),
//! }
//! ```

use std::time::{Duration, Instant};

/// The fixed part of the drift allowance: Redis' 1 ms expire precision plus a minimum for small
/// TTLs.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Far enough to mean "no deadline" (about 34 years), near enough to add to any `Instant`.
const FOREVER: Duration = Duration::from_secs(1 << 30);

/// `d` truncated to whole milliseconds: what `PX` and `PEXPIRE` carry (an integer of ms; the
/// engine writes `ttl.as_millis()`). A TTL's validity is counted from this, never from the
/// fraction of a millisecond the nodes were not told.
fn whole_ms(d: Duration) -> Duration {
    // The seconds as they are, the nanoseconds cut to whole ms: `as_millis` goes through u128
    // arithmetic, ~20 instructions more on every round.
    Duration::new(d.as_secs(), d.subsec_millis() * 1_000_000)
}

/// The bit set of nodes `0..n` (bit `i` for node `i`; `n` at most 64).
pub(crate) fn all_nodes(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// `now + timeout`, saturating: a timeout too large to add to the clock (`Duration::MAX`) means
/// no deadline, instead of a panic.
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout).unwrap_or(now + FOREVER)
}

/// Timing parameters of one attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundConfig {
    /// The lock's time to live, as sent in `PX`: whole milliseconds, so a fraction of a
    /// millisecond is dropped, from the validity too ([`Round::start`]).
    pub ttl: Duration,
    /// `ttl × drift_factor + 2 ms` is subtracted from the validity for clock drift.
    pub drift_factor: f64,
    /// How long to wait for each node, from the start of the attempt.
    pub node_timeout: Duration,
    /// A quorum reached with less validity left than this counts as a failure.
    pub min_validity: Duration,
    /// If set (extend), the attempt must be decided before this instant (the current validity).
    pub not_after: Option<Instant>,
    /// Taken off the validity with the drift allowance: the clock check's margin
    /// ([`Config::clock_margin`](crate::Config::clock_margin)); zero without it.
    pub clock_margin: Duration,
}

impl RoundConfig {
    /// A configuration with no minimum validity and no `not_after` bound.
    pub fn new(ttl: Duration, drift_factor: f64, node_timeout: Duration) -> RoundConfig {
        RoundConfig {
            ttl,
            drift_factor,
            node_timeout,
            min_validity: Duration::ZERO,
            not_after: None,
            clock_margin: Duration::ZERO,
        }
    }

    /// The validity an attempt is given from its start: the TTL in the whole milliseconds `PX`
    /// and `PEXPIRE` carry (a fraction of one the nodes are not told is not counted: it would
    /// put the validity past the keys' expiry), less the drift allowance; `None` when the
    /// allowance takes it all. [`Round::start`] counts it; the configuration's checks and a
    /// dropped async extend's worst case count the same.
    pub(crate) fn validity(&self) -> Option<Duration> {
        whole_ms(self.ttl).checked_sub(self.drift())
    }

    /// The drift allowance `ttl × drift_factor + 2 ms`, plus the clock check's margin
    /// (saturating; a bad factor counts as 0).
    pub fn drift(&self) -> Duration {
        let factor = if self.drift_factor.is_finite() && self.drift_factor > 0.0 {
            self.drift_factor
        } else {
            0.0
        };
        let scaled =
            Duration::try_from_secs_f64(self.ttl.as_secs_f64() * factor).unwrap_or(Duration::MAX);
        scaled
            .saturating_add(DRIFT_FLOOR)
            .saturating_add(self.clock_margin)
    }
}

/// What one node answered, as far as the attempt is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// The node set (or extended) the key for us.
    Yes,
    /// The node answered, and the answer is no: the key is held by someone else (`SET NX` gave
    /// nil), or our token is no longer there (extend gave 0).
    Refused,
    /// The node could not vote: error reply, connection failure, timeout, quarantine.
    Failed,
}

/// Why an attempt was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Quorum is out of reach and at least one node refused: the lock is held elsewhere.
    Held,
    /// Quorum is out of reach and no node refused: too many nodes failed.
    NoQuorum,
    /// A quorum said yes, but the validity left was not positive (or below the minimum).
    TooSlow,
    /// (Extend) the attempt was not decided before the current validity ended.
    Expired,
}

/// The outcome of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Quorum reached in time. The lock is safe until `valid_until`.
    Won {
        /// `start + ttl − drift`: the moment the validity runs out.
        valid_until: Instant,
        /// The validity left at the moment of decision.
        validity: Duration,
        /// Nodes that said yes.
        yes: usize,
    },
    /// The attempt failed.
    Lost {
        /// Why.
        loss: Loss,
        /// Nodes that said yes (their keys must be released).
        yes: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pending,
    Voted(Vote),
}

/// The state of one attempt over `n` nodes. Reusable: [`Round::start`] resets it, without
/// allocating.
#[derive(Debug, Clone)]
pub struct Round {
    slots: Vec<Slot>,
    quorum: usize,
    yes: usize,
    refused: usize,
    failed: usize,
    /// Set by [`Round::start`]: the round never reads a clock itself.
    timing: Option<Timing>,
    not_after: Option<Instant>,
    min_validity: Duration,
    decision: Option<Decision>,
    /// Nodes (a bit set) not expected to answer in time: their pending votes do not keep the
    /// round from deciding that the quorum is out of reach ([`Round::expect_no_answer_from`]).
    unexpected: u64,
}

/// The deadlines of a started round.
#[derive(Debug, Clone, Copy)]
struct Timing {
    node_deadline: Instant,
    valid_until: Instant,
}

impl Round {
    /// A round over `n` nodes (quorum `n / 2 + 1`). Allocates its per-node slots once; reads no
    /// clock (the time comes with [`Round::start`]).
    pub fn new(n: usize) -> Round {
        Round::build(Vec::new(), n)
    }

    /// A round as [`Round::new`] makes it, in `self`'s slots (the simulator's engines, a few
    /// per schedule, reuse the previous schedule's).
    pub(crate) fn rebuilt(self, n: usize) -> Round {
        Round::build(self.slots, n)
    }

    fn build(mut slots: Vec<Slot>, n: usize) -> Round {
        slots.clear();
        slots.resize(n, Slot::Pending);
        Round {
            slots,
            quorum: n / 2 + 1,
            yes: 0,
            refused: 0,
            failed: 0,
            timing: None,
            not_after: None,
            min_validity: Duration::ZERO,
            decision: None,
            unexpected: 0,
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.slots.len()
    }

    /// Votes needed: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Starts an attempt at `now`, the instant taken *before* the first command is sent. The
    /// validity runs until `now + ttl − drift`, with the TTL in whole milliseconds — what `PX`
    /// and `PEXPIRE` carry: a TTL of 10.999 ms keeps the key 10 ms, and counts for 10.
    pub fn start(&mut self, now: Instant, config: &RoundConfig) {
        self.slots.fill(Slot::Pending);
        self.yes = 0;
        self.refused = 0;
        self.failed = 0;
        self.decision = None;
        self.unexpected = 0;
        self.min_validity = config.min_validity;
        self.not_after = config.not_after;
        let far = |d: Duration| deadline_after(now, d);
        self.timing = Some(Timing {
            node_deadline: far(config.node_timeout),
            valid_until: match config.validity() {
                Some(left) => far(left),
                None => now,
            },
        });
        self.evaluate(now);
    }

    /// After [`Round::start`]: the nodes in `nodes` (a bit set over the node indices) are not
    /// expected to answer in time — they let the last round's node timeout pass in silence and
    /// have not answered anything since (a frozen server). Their votes still count if they
    /// come, but the round does not wait for them to decide that the quorum is out of reach:
    /// with one node frozen, two competing attempts that split the live nodes' votes 2–2 lose
    /// at once instead of both holding their keys for a whole node timeout (without it, a
    /// frozen node cut contention to 6 locks/s against 923 healthy). Deciding a loss early is always
    /// safe; a win still needs a quorum of real yeses.
    ///
    /// Bit `i` names node `i`, so only nodes 0 to 63 can be named: in a round of more nodes
    /// (the engine uses at most [`MAX_NODES`](crate::MAX_NODES), 64) the others are always
    /// waited for.
    pub fn expect_no_answer_from(&mut self, nodes: u64, now: Instant) {
        self.unexpected = nodes;
        self.evaluate(now);
    }

    /// A node's vote. Later votes of the same node, and votes after the decision, are ignored.
    pub fn handle_vote(&mut self, node: usize, vote: Vote, now: Instant) {
        let Some(slot) = self.slots.get_mut(node) else {
            return;
        };
        if *slot != Slot::Pending {
            return;
        }
        // Votes after the decision are still recorded: a late yes must be released.
        *slot = Slot::Voted(vote);
        match vote {
            Vote::Yes => self.yes += 1,
            Vote::Refused => self.refused += 1,
            Vote::Failed => self.failed += 1,
        }
        self.evaluate(now);
    }

    /// Takes a node's vote back: its answer turned out to come from a node that does not speak
    /// the protocol (surplus frames or garbage in the same read), or from a server another
    /// node's answer already counts for (one server listed twice). The node counts as failed, and
    /// a decision that vote made is taken back and made again from the remaining votes. Call it
    /// before acting on [`Round::poll_decision`]: a decision already acted on cannot be undone.
    pub fn handle_withdraw(&mut self, node: usize, now: Instant) {
        let Some(slot) = self.slots.get_mut(node) else {
            return;
        };
        match *slot {
            Slot::Voted(Vote::Failed) => return,
            Slot::Voted(Vote::Yes) => self.yes -= 1,
            Slot::Voted(Vote::Refused) => self.refused -= 1,
            Slot::Pending => {}
        }
        *slot = Slot::Voted(Vote::Failed);
        self.failed += 1;
        if self.timing.is_some() {
            self.decision = None;
            self.evaluate(now);
        }
    }

    /// Replaces a node's vote (or records it, if it has not voted): its server answered better
    /// on another connection, whose own vote does not count (one server listed twice, see
    /// [`NodeFault::Duplicate`](crate::NodeFault::Duplicate)). A decision already made is taken
    /// back and made again, as with [`Round::handle_withdraw`], and the same rule applies: call
    /// it before acting on [`Round::poll_decision`].
    pub fn handle_revote(&mut self, node: usize, vote: Vote, now: Instant) {
        let Some(slot) = self.slots.get_mut(node) else {
            return;
        };
        match *slot {
            Slot::Voted(Vote::Yes) => self.yes -= 1,
            Slot::Voted(Vote::Refused) => self.refused -= 1,
            Slot::Voted(Vote::Failed) => self.failed -= 1,
            Slot::Pending => {}
        }
        *slot = Slot::Voted(vote);
        match vote {
            Vote::Yes => self.yes += 1,
            Vote::Refused => self.refused += 1,
            Vote::Failed => self.failed += 1,
        }
        if self.timing.is_some() {
            self.decision = None;
            self.evaluate(now);
        }
    }

    /// Time has passed: nodes still pending after the per-node timeout count as failed, and an
    /// attempt whose validity has run out is lost.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(timing) = self.timing else {
            return;
        };
        if self.decision.is_some() {
            return;
        }
        if now >= timing.node_deadline {
            for slot in &mut self.slots {
                if *slot == Slot::Pending {
                    *slot = Slot::Voted(Vote::Failed);
                    self.failed += 1;
                }
            }
        }
        self.evaluate(now);
    }

    /// When [`Round::handle_timeout`] must be called next, or `None` once decided.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timing = self.timing?;
        if self.decision.is_some() {
            return None;
        }
        let mut at = timing.node_deadline.min(timing.valid_until);
        if let Some(limit) = self.not_after {
            at = at.min(limit);
        }
        Some(at)
    }

    /// Until when nodes are waited for (from [`Round::start`]), also after the decision.
    pub fn node_deadline(&self) -> Option<Instant> {
        self.timing.map(|t| t.node_deadline)
    }

    /// The decision, once there is one.
    pub fn poll_decision(&self) -> Option<Decision> {
        self.decision
    }

    /// Takes back a win not yet acted on, keeping every vote: the clock check could not yet
    /// vouch for enough of its yeses (`crate::model::clock`). The round is decided again at the
    /// next vote or timeout, and wins again while a quorum of yeses stands.
    pub(crate) fn reopen(&mut self) {
        if let Some(Decision::Won { .. }) = self.decision {
            self.decision = None;
        }
    }

    /// True when `node` has not voted yet.
    pub fn is_pending(&self, node: usize) -> bool {
        self.slots.get(node) == Some(&Slot::Pending)
    }

    /// The vote of `node`, if it has voted.
    pub fn vote(&self, node: usize) -> Option<Vote> {
        match self.slots.get(node) {
            Some(Slot::Voted(v)) => Some(*v),
            _ => None,
        }
    }

    /// The instant the validity of a won attempt runs out: `start + ttl − drift`; `None` before
    /// [`Round::start`].
    pub fn valid_until(&self) -> Option<Instant> {
        self.timing.map(|t| t.valid_until)
    }

    fn evaluate(&mut self, now: Instant) {
        let Some(Timing { valid_until, .. }) = self.timing else {
            return;
        };
        if self.decision.is_some() {
            return;
        }
        let late = self.not_after.is_some_and(|limit| now >= limit);
        if late {
            self.decision = Some(Decision::Lost {
                loss: Loss::Expired,
                yes: self.yes,
            });
            return;
        }
        let validity = valid_until.saturating_duration_since(now);
        let in_time = validity > Duration::ZERO && validity >= self.min_validity;
        if self.yes >= self.quorum {
            self.decision = Some(if in_time {
                Decision::Won {
                    valid_until,
                    validity,
                    yes: self.yes,
                }
            } else {
                Decision::Lost {
                    loss: Loss::TooSlow,
                    yes: self.yes,
                }
            });
            return;
        }
        let mut pending = self.slots.len() - self.yes - self.refused - self.failed;
        if self.unexpected != 0 {
            // Only the first 64 nodes can be named in the bit set (a round may have more:
            // `1 << 64` would overflow, and wrap to node 0 in a release build).
            let silent = (self.slots.iter().enumerate().take(u64::BITS as usize))
                .filter(|&(i, s)| *s == Slot::Pending && self.unexpected & (1u64 << i) != 0)
                .count();
            pending -= silent;
        }
        if self.yes + pending < self.quorum {
            let loss = if self.refused > 0 {
                Loss::Held
            } else {
                Loss::NoQuorum
            };
            self.decision = Some(Decision::Lost {
                loss,
                yes: self.yes,
            });
        } else if !in_time {
            // Even if the quorum came now, no validity would be left.
            self.decision = Some(Decision::Lost {
                loss: Loss::TooSlow,
                yes: self.yes,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> RoundConfig {
        RoundConfig::new(10_000 * MS, 0.01, 50 * MS)
    }

    fn started(n: usize, t0: Instant) -> Round {
        let mut r = Round::new(n);
        r.start(t0, &config());
        r
    }

    #[test]
    fn a_reopened_win_is_decided_again_at_the_next_vote_or_timeout() {
        let t0 = Instant::now();
        let mut r = started(3, t0);
        r.handle_vote(0, Vote::Yes, t0);
        r.handle_vote(1, Vote::Yes, t0);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 2, .. })
        ));
        r.reopen();
        assert_eq!(r.poll_decision(), None);
        assert_eq!(r.poll_timeout(), Some(t0 + 50 * MS));
        r.handle_vote(2, Vote::Refused, t0 + MS);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 2, .. })
        ));
        // Reopened with nothing left to wait for: decided again at the node deadline.
        r.reopen();
        r.handle_timeout(t0 + 50 * MS);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 2, .. })
        ));
        // A loss is never reopened.
        let mut lost = started(3, t0);
        lost.handle_vote(0, Vote::Refused, t0);
        lost.handle_vote(1, Vote::Refused, t0);
        let decided = lost.poll_decision();
        lost.reopen();
        assert_eq!(lost.poll_decision(), decided);
    }

    #[test]
    fn three_of_five_wins_at_the_third_yes() {
        let t0 = Instant::now();
        let mut r = started(5, t0);
        r.handle_vote(0, Vote::Yes, t0 + MS);
        r.handle_vote(1, Vote::Yes, t0 + 2 * MS);
        assert_eq!(r.poll_decision(), None);
        r.handle_vote(2, Vote::Yes, t0 + 3 * MS);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Won {
                valid_until: t0 + 9_898 * MS,
                validity: 9_895 * MS,
                yes: 3
            })
        );
        // Stragglers after the decision change nothing.
        r.handle_vote(3, Vote::Refused, t0 + 4 * MS);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 3, .. })
        ));
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn two_of_five_loses_as_soon_as_quorum_is_out_of_reach() {
        let t0 = Instant::now();
        let mut r = started(5, t0);
        r.handle_vote(0, Vote::Yes, t0 + MS);
        r.handle_vote(1, Vote::Refused, t0 + MS);
        r.handle_vote(2, Vote::Refused, t0 + MS);
        assert_eq!(
            r.poll_decision(),
            None,
            "1 yes + 2 pending can still make 3"
        );
        r.handle_vote(3, Vote::Refused, t0 + MS);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::Held,
                yes: 1
            })
        );
    }

    #[test]
    fn failures_without_refusals_mean_no_quorum() {
        let t0 = Instant::now();
        let mut r = started(3, t0);
        r.handle_vote(0, Vote::Failed, t0);
        r.handle_vote(1, Vote::Failed, t0);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::NoQuorum,
                yes: 0
            })
        );
    }

    #[test]
    fn silent_nodes_time_out_at_the_node_deadline() {
        let t0 = Instant::now();
        let mut r = started(5, t0);
        r.handle_vote(0, Vote::Yes, t0 + MS);
        r.handle_vote(1, Vote::Yes, t0 + MS);
        assert_eq!(r.poll_timeout(), Some(t0 + 50 * MS));
        r.handle_timeout(t0 + 49 * MS);
        assert_eq!(r.poll_decision(), None);
        r.handle_timeout(t0 + 50 * MS);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::NoQuorum,
                yes: 2
            })
        );
        for node in 2..5 {
            assert_eq!(r.vote(node), Some(Vote::Failed));
        }
    }

    #[test]
    fn replies_so_slow_they_eat_the_validity_lose() {
        let t0 = Instant::now();
        let mut r = Round::new(3);
        let cfg = RoundConfig::new(100 * MS, 0.01, 500 * MS);
        r.start(t0, &cfg);
        // valid_until = t0 + 100 − (1 + 2) ms.
        assert_eq!(r.valid_until(), Some(t0 + 97 * MS));
        assert_eq!(r.poll_timeout(), Some(t0 + 97 * MS));
        r.handle_vote(0, Vote::Yes, t0 + 10 * MS);
        r.handle_vote(1, Vote::Yes, t0 + 97 * MS);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::TooSlow,
                yes: 2
            })
        );
    }

    #[test]
    fn validity_running_out_before_quorum_decides_the_attempt() {
        let t0 = Instant::now();
        let mut r = Round::new(3);
        r.start(t0, &RoundConfig::new(100 * MS, 0.01, 500 * MS));
        r.handle_timeout(t0 + 97 * MS);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::TooSlow,
                yes: 0
            })
        );
    }

    #[test]
    fn minimum_validity_is_enforced() {
        let t0 = Instant::now();
        let mut r = Round::new(1);
        let cfg = RoundConfig {
            min_validity: 90 * MS,
            ..RoundConfig::new(100 * MS, 0.0, 500 * MS)
        };
        r.start(t0, &cfg);
        // valid_until = t0 + 100 − 2 ms: 90 ms are left at t0 + 8 ms.
        r.handle_vote(0, Vote::Yes, t0 + 8 * MS);
        assert!(matches!(r.poll_decision(), Some(Decision::Won { .. })));
        r.start(t0, &cfg);
        r.handle_vote(0, Vote::Yes, t0 + 8 * MS + Duration::from_micros(1));
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::TooSlow,
                ..
            })
        ));
    }

    /// `PX` and `PEXPIRE` carry whole milliseconds (`ttl.as_millis()`, rounded down): a
    /// validity counted from the exact `Duration` ran up to a millisecond past the keys'
    /// expiry (a TTL of 10.999 ms: `PX 10`, valid for 8.999 ms after the 2 ms drift).
    #[test]
    fn whole_ms_is_the_milliseconds_that_px_carries() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(999_999),
            Duration::from_micros(10_999),
            Duration::new(1, 999_999_999),
            Duration::from_secs(30),
            Duration::MAX,
        ] {
            assert_eq!(whole_ms(d).as_millis(), d.as_millis(), "{d:?}");
            assert_eq!(whole_ms(d).subsec_nanos() % 1_000_000, 0, "{d:?}");
        }
    }

    #[test]
    fn the_validity_counts_only_the_whole_milliseconds_sent_to_the_nodes() {
        let t0 = Instant::now();
        for (ttl, factor) in [
            (Duration::from_micros(10_999), 0.0),
            (Duration::from_micros(10_001), 0.0),
            (Duration::from_nanos(1_000_999_999), 0.01),
            (Duration::from_micros(29_999_500), 0.01),
        ] {
            let cfg = RoundConfig::new(ttl, factor, 50 * MS);
            let sent = Duration::from_millis(ttl.as_millis() as u64);
            let bound = t0 + sent - cfg.drift();
            let mut r = Round::new(1);
            r.start(t0, &cfg);
            assert!(r.valid_until().unwrap() <= bound, "{ttl:?}");
            r.handle_vote(0, Vote::Yes, t0);
            match r.poll_decision() {
                Some(Decision::Won {
                    valid_until,
                    validity,
                    ..
                }) => {
                    assert!(valid_until <= bound, "{ttl:?}");
                    assert!(validity <= sent - cfg.drift(), "{ttl:?}");
                }
                other => panic!("{ttl:?}: {other:?}"),
            }
        }
        // Whole milliseconds lose nothing.
        let mut r = Round::new(1);
        r.start(t0, &RoundConfig::new(10 * MS, 0.0, 50 * MS));
        assert_eq!(r.valid_until(), Some(t0 + 8 * MS));
    }

    #[test]
    fn a_ttl_smaller_than_the_drift_can_never_win() {
        let t0 = Instant::now();
        let mut r = Round::new(1);
        r.start(t0, &RoundConfig::new(MS, 0.01, MS));
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::TooSlow,
                ..
            })
        ));
    }

    #[test]
    fn extend_must_be_decided_before_the_current_validity_ends() {
        let t0 = Instant::now();
        let mut r = Round::new(3);
        let cfg = RoundConfig {
            not_after: Some(t0 + 5 * MS),
            ..config()
        };
        r.start(t0, &cfg);
        assert_eq!(r.poll_timeout(), Some(t0 + 5 * MS));
        r.handle_vote(0, Vote::Yes, t0 + MS);
        r.handle_vote(1, Vote::Yes, t0 + 5 * MS);
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::Expired,
                yes: 2
            })
        );
    }

    #[test]
    fn single_node_and_even_n() {
        let t0 = Instant::now();
        let mut r = started(1, t0);
        assert_eq!(r.quorum(), 1);
        r.handle_vote(0, Vote::Yes, t0);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 1, .. })
        ));

        let mut r = started(4, t0);
        assert_eq!(r.quorum(), 3);
        r.handle_vote(0, Vote::Yes, t0);
        r.handle_vote(1, Vote::Yes, t0);
        r.handle_vote(2, Vote::Refused, t0);
        r.handle_vote(3, Vote::Yes, t0);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 3, .. })
        ));
    }

    #[test]
    fn duplicate_and_out_of_range_votes_are_ignored() {
        let t0 = Instant::now();
        let mut r = started(3, t0);
        r.handle_vote(0, Vote::Yes, t0);
        r.handle_vote(0, Vote::Yes, t0);
        r.handle_vote(7, Vote::Yes, t0);
        assert_eq!(r.poll_decision(), None);
        assert!(r.is_pending(1) && !r.is_pending(0));
    }

    #[test]
    fn a_withdrawn_yes_takes_back_the_decision_it_made() {
        let t0 = Instant::now();
        let mut r = started(3, t0);
        r.handle_vote(0, Vote::Yes, t0 + MS);
        r.handle_vote(1, Vote::Refused, t0 + MS);
        r.handle_vote(2, Vote::Yes, t0 + MS);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 2, .. })
        ));
        // Node 2's yes came with surplus frames in the same read: it did not count.
        r.handle_withdraw(2, t0 + MS);
        assert_eq!(r.vote(2), Some(Vote::Failed));
        assert_eq!(
            r.poll_decision(),
            Some(Decision::Lost {
                loss: Loss::Held,
                yes: 1
            })
        );
        // Withdrawing a pending node fails it; withdrawing twice changes nothing.
        let mut r = started(3, t0);
        r.handle_withdraw(0, t0);
        r.handle_withdraw(0, t0);
        assert_eq!(r.poll_decision(), None);
        r.handle_vote(1, Vote::Yes, t0);
        r.handle_vote(2, Vote::Yes, t0);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 2, .. })
        ));
    }

    /// `Round` is public and takes any number of nodes, but the silent-node mask names 64:
    /// node 64's bit was `1 << 64` — an overflow panic in a debug build, node 0's bit in a
    /// release build (node 64 then counted as silent with node 0, and a round that could still
    /// win was lost).
    #[test]
    fn a_round_of_more_than_64_nodes_ignores_the_mask_beyond_them() {
        let t0 = Instant::now();
        let mut r = started(65, t0);
        assert_eq!(r.quorum(), 33);
        for node in 1..=32 {
            r.handle_vote(node, Vote::Yes, t0);
        }
        for node in 33..=63 {
            r.handle_vote(node, Vote::Refused, t0);
        }
        // Node 0 is silent; node 64 is still pending and can make the quorum.
        r.expect_no_answer_from(1, t0);
        assert_eq!(r.poll_decision(), None);
        r.expect_no_answer_from(u64::MAX, t0);
        assert_eq!(r.poll_decision(), None);
        r.handle_vote(64, Vote::Yes, t0 + MS);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Won { yes: 33, .. })
        ));
    }

    #[test]
    fn late_yes_after_a_loss_is_still_counted_for_release() {
        let t0 = Instant::now();
        let mut r = started(3, t0);
        r.handle_vote(0, Vote::Refused, t0);
        r.handle_vote(1, Vote::Refused, t0);
        assert!(matches!(
            r.poll_decision(),
            Some(Decision::Lost { yes: 0, .. })
        ));
        r.handle_vote(2, Vote::Yes, t0 + MS);
        assert_eq!(r.vote(2), Some(Vote::Yes));
    }
}
