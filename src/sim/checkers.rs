//! The checkers: what every schedule must keep, checked in world time. Holders' beliefs never
//! overlap (readers may overlap readers), fences grow, every validity a holder is told is
//! backed by a quorum of the nodes' keys (the cover check), a caller never waits for a free
//! resource longer than [`WAIT_BOUND`](super::WAIT_BOUND), a waiting acquire ends by its deadline
//! ([`DEADLINE_SLACK`]), contention with a node frozen keeps [`PROGRESS_FLOOR`] of its
//! healthy rate, and reconnects are bounded by the faults that cause them.
//!
//! The beliefs are recorded as the run goes ([`World::believed`]); the cover and deadline
//! checks run at the moment they check, the others over the record once the run is over.

use std::time::{Duration, Instant};

use super::callers::{Hold, Work};
use super::clock::MS;
use super::report::{
    ConnectViolation, CoverViolation, FenceViolation, LateWait, ProgressViolation, Report,
    Violation,
};
use super::setup::{BACKOFF_MAX, COUNTER_PERMITS, NODE_TIMEOUT, NODES};
use super::world::World;

/// The deadline check: a waiting acquire (`lock_until`) has its outcome within this of its
/// deadline, whatever the nodes do, even with no quorum reachable (waiting for servers that are
/// not there is a hang). An attempt in flight at the deadline is decided within a node timeout,
/// and a fenced one's write-back within another (both on the client's clock: the check converts
/// them to world time with the client's rate); 1 ms for rounding. A pause of the client after
/// the deadline counts from its end.
pub const DEADLINE_SLACK: Duration = Duration::from_nanos(2 * NODE_TIMEOUT + MS);

/// The progress check's floor: with one of five nodes frozen, contention keeps at least half
/// of its grants per second (the goal `redlock demo` is held to on real servers). In the
/// simulated world the four live nodes must give 3 of 4 yeses across links whose delays
/// differ by up to 2 ms. Measured in 1,000 schedules each with a lost round's cleanup sending
/// release notices: honest runs keep 0.551 at worst, with notices in half the runs or in all
/// (`Break::WaitForSilent`'s and `Break::NoticeHerd`'s controls; 1 % 0.596 and 0.581), while
/// the herd brought back falls to 0.321 (1 % 0.419) and `Break::WaitForSilent`'s defect to
/// 0.374 (1 % 0.404). With the cleanup quiet, as it is, the herd too keeps 0.58 at worst (300
/// schedules).
pub const PROGRESS_FLOOR: f64 = 0.5;

/// Connects a fault of duration `d` (ns) may cause on one link: the first reconnects back off
/// from `BACKOFF_MIN` doubling to `BACKOFF_MAX` (five of them below the ceiling), then one per
/// `BACKOFF_MAX` while the fault lasts, each taking at least its connect or handshake; and two
/// more for the one that works and a second failure found when the fault ends.
pub fn connects_allowed(d: u64) -> u64 {
    8 + d / BACKOFF_MAX.as_nanos() as u64
}

impl World {
    /// The checks over the record once the run is over, in this order: fences, the heal of a
    /// blank majority, liveness, reconnects, overlaps. Each violation found is logged.
    pub(super) fn check_record(&mut self) {
        let record = &mut self.record;
        self.report.fence_violation = check_fences(
            &mut record.acquisitions,
            &record.beliefs,
            &record.belief_fences,
        );
        if let Some(v) = self.report.fence_violation.clone() {
            self.log(|| format!("FENCE VIOLATION {v:?}"));
        }
        if self.healed_at.is_some_and(|h| self.g > h) && self.report.fenced_after_heal == 0 {
            self.report.stuck_blank = true;
            self.log(|| "STUCK: no lock granted after every node was back".to_string());
        }
        let mark_life = crate::engine::notice::mark_ttl(&self.shared.config).as_nanos() as u64;
        let ordered = self.shared.config.ordered_sets;
        let fair = self.shared.config.fair.then_some(&self.shared_of[..]);
        let (longest, worst) = (self.record).liveness(&self.members, mark_life, (ordered, fair));
        self.report.longest_wait = Duration::from_nanos(longest);
        let precedence = self.shared.config.set_precedence.as_nanos() as u64;
        self.report.liveness = worst.or_else(|| self.record.deferences_past(precedence));
        if let Some(v) = self.report.liveness.clone() {
            self.log(|| format!("LIVENESS VIOLATION {v:?}"));
        }
        self.check_connects();
        if let Some(v) = self.report.connect_violation.clone() {
            self.log(|| format!("RECONNECT VIOLATION {v:?}"));
        }
        let cap = (self.only_shared && !self.setup.control).then_some(COUNTER_PERMITS);
        let record = &mut self.record;
        self.report.violation = check_overlaps(&mut record.beliefs)
            .or_else(|| check_readers(&record.shared_beliefs, &record.beliefs))
            .or_else(|| cap.and_then(|p| check_counted(&mut record.shared_beliefs, p)));
        if let Some(v) = self.report.violation.clone() {
            self.log(|| format!("VIOLATION {v:?}"));
        }
    }

    /// Reconnects bounded by the faults that caused them: per (client, node), one connect,
    /// plus for each fault on the link [`connects_allowed`].
    fn check_connects(&mut self) {
        for c in 0..self.clients.len() {
            for n in 0..NODES {
                let allowed = 1 + self
                    .record
                    .link_faults
                    .iter()
                    .filter(|&&(fc, fn_, _)| {
                        fc.is_none_or(|x| x == c) && fn_.is_none_or(|x| x == n)
                    })
                    .map(|&(_, _, d)| connects_allowed(d))
                    .sum::<u64>();
                let made = self.record.connects[c * NODES + n];
                if made > self.report.most_connects.0 {
                    self.report.most_connects = (made, allowed);
                }
                if made > allowed && self.report.connect_violation.is_none() {
                    self.report.connect_violation = Some(ConnectViolation {
                        client: c,
                        node: n,
                        connects: made,
                        allowed,
                    });
                }
            }
        }
    }

    /// The progress check (`Break::contention`'s runs): this run's grants per second against
    /// those of `healthy`, the same schedule with every node up.
    pub(super) fn check_progress(&mut self, healthy: &Report) {
        // A baseline that stalled would lower the bar: a stall of the schedule.
        self.report.stalled |= healthy.stalled;
        let frozen = &self.report;
        let rate = |r: &Report| r.acquired as f64 / r.sim_time.as_secs_f64().max(1e-9);
        self.report.progress_ratio = Some(rate(frozen) / rate(healthy).max(1e-9));
        let frozen = &self.report;
        if rate(frozen) < PROGRESS_FLOOR * rate(healthy) {
            let v = ProgressViolation {
                frozen: (frozen.acquired, frozen.sim_time),
                healthy: (healthy.acquired, healthy.sim_time),
            };
            self.log(|| format!("PROGRESS VIOLATION {v:?}"));
            self.report.progress = Some(v);
        }
    }

    /// Holders still holding when the run ends believe until their validity.
    pub(super) fn close_beliefs(&mut self) {
        for c in 0..self.clients.len() {
            for k in 0..self.clients[c].callers.len() {
                let hold = match &self.clients[c].callers[k].work {
                    Work::Holding(h) | Work::Extending { hold: h, .. } => Some(*h),
                    _ => None,
                };
                if let Some(h) = hold {
                    self.end_belief(c, &h, u64::MAX);
                }
                if let Work::Keeping(k) = &self.clients[c].callers[k].work
                    && let Some(start) = k.open
                {
                    let (res, valid, fence) = (k.res, k.kept.valid_until(), k.fence);
                    let end = self.belief_end(c, valid, u64::MAX);
                    self.believed(c, res, start, end, fence);
                }
            }
        }
    }

    /// The belief of client `c` in `hold` ends at `end` (world time) or at its validity.
    pub(super) fn end_belief(&mut self, c: usize, hold: &Hold, end: u64) {
        let end = self.belief_end(c, hold.valid, end);
        self.believed(c, hold.res, hold.start_g, end, hold.fence);
    }

    /// When a belief that would last until `end` (world time) ends: at the lock's validity
    /// `valid` on the client's clock, unless the client ignores it (then no later than now).
    pub(super) fn belief_end(&self, c: usize, valid: Instant, end: u64) -> u64 {
        if self.clients[c].ignores_validity {
            end.min(self.g)
        } else {
            end.min(self.world_of(c, valid))
        }
    }

    /// The cover check: client `c`, told now that it holds `res` with `token` until `valid`
    /// (its clock), must find a quorum of nodes whose keys hold the token until then (in
    /// world time, each node's expiry on its own clock). A validity already over when told
    /// is not a belief (its keys may have gone to a rival since, rightly).
    pub(super) fn check_cover(&mut self, c: usize, res: usize, token: &[u8], valid: Instant) {
        let valid_g = self.world_of(c, valid);
        if self.report.cover.is_some() || valid_g <= self.g || self.clients[c].ignores_validity {
            return;
        }
        let reader = self.shared_of[res];
        let (members, resources) = (&self.members[res], &self.resources);
        let covering = (self.nodes.iter())
            .filter(|n| {
                members.iter().all(|&m| {
                    let until = n.node.holds_until(&resources[m], token, reader);
                    until.is_some_and(|t| n.clock.world_ns(t) >= valid_g)
                })
            })
            .count();
        let quorum = self.nodes.len() / 2 + 1;
        if covering < quorum {
            self.log(|| {
                format!(
                    "COVER: client {c} told it holds {res} until {valid_g} ns: {covering} nodes"
                )
            });
            self.report.cover = Some(CoverViolation {
                resource: res,
                client: c,
                told: self.g,
                valid: valid_g,
                covering,
                quorum,
            });
        }
    }

    /// Records that client `c` believed it held `res` (or, a shared lock, read it) from `start`
    /// to `end` (world time), with `fence`.
    pub(super) fn believed(&mut self, c: usize, res: usize, start: u64, end: u64, fence: u64) {
        if self.shared_of[res] {
            let of = self.members[res][0];
            self.record.shared_beliefs.push((of, c, start, end));
            self.log(|| {
                format!(
                    "client {c} believed it read {of} from {:.6} to {:.6} ms",
                    start as f64 / MS as f64,
                    end as f64 / MS as f64
                )
            });
            return;
        }
        // A set's holder believed it held each member.
        for i in 0..self.members[res].len() {
            let member = self.members[res][i];
            self.record.beliefs.push((member, c, start, end));
            self.record.belief_fences.push(fence);
            self.log(|| {
                format!(
                    "client {c} believed it held {member} from {:.6} to {:.6} ms",
                    start as f64 / MS as f64,
                    end as f64 / MS as f64
                )
            });
        }
    }

    /// A waiting acquire of client `c` submitted at `start` (world time) with `deadline` (its
    /// clock) has its outcome now: the deadline check (see [`DEADLINE_SLACK`]).
    pub(super) fn ended_wait(&mut self, c: usize, start: u64, deadline: Instant) {
        let due = self.world_of(c, deadline);
        // A pause of the client after the deadline: counted from its end (the engine settles
        // at once when it resumes).
        let resumed = (self.record.client_pauses.iter())
            .filter(|&&(p, from, to)| p == c && from <= self.g && to > due)
            .map(|&(_, _, to)| to.min(self.g))
            .max()
            .unwrap_or(0);
        let over = self.g.saturating_sub(due.max(resumed));
        // The slack's node timeouts run on the client's clock.
        let ppm = self.clients[c].clock.ppm;
        let slack = (DEADLINE_SLACK.as_nanos() as i64 - MS as i64) * 1_000_000 / (1_000_000 + ppm)
            + MS as i64;
        if over > slack as u64 && self.report.late.is_none() {
            let late = LateWait {
                client: c,
                start,
                deadline: due,
                end: self.g,
            };
            self.log(|| format!("LATE WAIT {late:?}"));
            self.report.late = Some(late);
        }
        if over > self.report.longest_overrun.as_nanos() as u64 {
            self.report.longest_overrun = Duration::from_nanos(over);
        }
    }
}

/// The first pair of fences out of order, if any: an acquisition that began after another had
/// completed (any resource: the counter is shared) must have a greater fence; so must a holder
/// that believed after another holder of the same resource stopped believing.
fn check_fences(
    acquisitions: &mut [(u64, u64, u64, usize)],
    beliefs: &[(usize, usize, u64, u64)],
    fences: &[u64],
) -> Option<FenceViolation> {
    // Completed-before-began: sweep the starts in order, with the largest fence of the
    // acquisitions completed strictly before.
    let mut by_end: Vec<(u64, u64, u64, usize)> = acquisitions.to_vec();
    by_end.sort_unstable_by_key(|a| a.1);
    acquisitions.sort_unstable_by_key(|a| a.0);
    let mut best: Option<(u64, u64, u64, usize)> = None;
    let mut next = 0;
    for &b in acquisitions.iter() {
        while next < by_end.len() && by_end[next].1 < b.0 {
            if best.is_none_or(|m| by_end[next].2 > m.2) {
                best = Some(by_end[next]);
            }
            next += 1;
        }
        if let Some(a) = best
            && b.2 <= a.2
        {
            return Some(FenceViolation {
                order: "completed before began",
                first: (a.3, a.0, a.1, a.2),
                second: (b.3, b.0, b.1, b.2),
            });
        }
    }
    // Held-after, per resource: every earlier belief that ended before this one began.
    let mut order: Vec<usize> = (0..beliefs.len())
        .filter(|&i| fences[i] != 0 && beliefs[i].2 < beliefs[i].3)
        .collect();
    order.sort_unstable_by_key(|&i| (beliefs[i].0, beliefs[i].2));
    for (k, &i) in order.iter().enumerate() {
        let (res, client, start, end) = beliefs[i];
        for &j in &order[..k] {
            let (r, c, s, e) = beliefs[j];
            if r == res && e <= start && fences[i] <= fences[j] {
                return Some(FenceViolation {
                    order: "held after",
                    first: (c, s, e, fences[j]),
                    second: (client, start, end, fences[i]),
                });
            }
        }
    }
    None
}

/// The first reader whose belief overlaps an exclusive holder's of the same resource, if any
/// (readers may overlap each other).
fn check_readers(
    readers: &[(usize, usize, u64, u64)],
    holders: &[(usize, usize, u64, u64)],
) -> Option<Violation> {
    readers.iter().find_map(|&(res, client, start, end)| {
        let h = holders
            .iter()
            .find(|h| h.0 == res && start < end && h.2 < h.3 && start < h.3 && h.2 < end)?;
        Some(Violation {
            resource: res,
            first: (h.1, h.2, h.3),
            second: (client, start, end),
        })
    })
}

/// The first moment more than `permits` holders believed they held one resource at once
/// (the counted semaphore of `Break::CounterSemaphore`), if any: the holder that made it
/// `permits + 1`, and one it overlapped.
fn check_counted(beliefs: &mut [(usize, usize, u64, u64)], permits: usize) -> Option<Violation> {
    beliefs.sort_unstable_by_key(|&(res, _, start, end)| (res, start, end));
    for (i, &(res, client, start, end)) in beliefs.iter().enumerate() {
        if start >= end {
            continue;
        }
        let overlapping: Vec<&(usize, usize, u64, u64)> = beliefs[..i]
            .iter()
            .filter(|b| b.0 == res && b.2 < b.3 && b.3 > start)
            .collect();
        if overlapping.len() >= permits {
            let first = overlapping[0];
            return Some(Violation {
                resource: res,
                first: (first.1, first.2, first.3),
                second: (client, start, end),
            });
        }
    }
    None
}

/// The first overlap of two belief intervals on one resource, if any.
fn check_overlaps(beliefs: &mut [(usize, usize, u64, u64)]) -> Option<Violation> {
    beliefs.sort_unstable_by_key(|&(res, _, start, end)| (res, start, end));
    let mut last: Option<(usize, usize, u64, u64)> = None;
    for &b in beliefs.iter() {
        let (res, client, start, end) = b;
        if start >= end {
            continue; // believed for no time at all (validity over at acquisition)
        }
        if let Some(l) = last.filter(|l| l.0 == res) {
            if start < l.3 {
                return Some(Violation {
                    resource: res,
                    first: (l.1, l.2, l.3),
                    second: (client, start, end),
                });
            }
            if end <= l.3 {
                continue;
            }
        }
        last = Some(b);
    }
    None
}
