//! Kept locks (`KeepAlive`, `keep`): timers of the engine. Each is extended when a share of its
//! TTL is left, with every lock due within a coalescing window in the same batch (one write per
//! node). A lost renewal is tried again after a doubling backoff while the nodes that back the
//! lock's validity and did not refuse still make a quorum, and another attempt can be decided
//! with half the renewal margin left (see [`Keeps::retry_after`]); a lock whose renewal cannot
//! win any more, or whose validity ends, is marked lost and its callback runs; its keys are
//! left for the holder to release when it ends the lock (`Engine::lose_keeps`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::engine::kept::Kept;
use crate::engine::net::Net;
use crate::engine::request::{Outcome, ReqKind};
use crate::model::config::Config;
use crate::model::error::{Error, Report};

use super::{Engine, Waiter};

/// The kept locks' timers are rounded to this share of the TTL (a tenth): renewals due close
/// together go out in one turn, and a renewal is still far from the end of the validity.
const COALESCE_SHARE: u32 = 10;

/// Kept locks: timers of the engine.
pub(super) struct Keeps {
    pub locks: Vec<Arc<Kept>>,
    /// When to look at the list next (a lock due, a validity ending); `None`: nothing to do
    /// until an extend in flight is decided or a lock is added.
    pub next: Option<Instant>,
    /// Extend when this much of the TTL is left.
    renew_left: Duration,
    /// Locks due within this window of each other are extended in the same tick, so that locks
    /// taken a few milliseconds apart share one write per node instead of one each.
    coalesce: Duration,
    /// A renewal's node timeout: the first backoff after a lost one, and the time an attempt
    /// needs to be decided.
    node_timeout: Duration,
    /// Reused lists: due in this tick; extends decided in this turn.
    due: Vec<Arc<Kept>>,
    pub decided: Vec<(Arc<Kept>, Outcome)>,
    lost: Vec<(Arc<Kept>, Error)>,
}

impl Keeps {
    pub fn new(config: &Config) -> Keeps {
        Keeps {
            locks: Vec::new(),
            next: None,
            renew_left: config.ttl.mul_f64(config.renew_fraction),
            coalesce: config.ttl / COALESCE_SHARE,
            node_timeout: config.node_timeout_for(config.ttl),
            due: Vec::new(),
            decided: Vec::new(),
            lost: Vec::new(),
        }
    }

    /// Looks at every lock at `now`: forgets the ones lost or ended by their holder, marks the
    /// expired ones lost (into `lost`), and gathers into `due` those to extend — the ones due
    /// within the coalescing window, if one of them really is due; a lock backing off after a
    /// lost renewal is due at its retry time and joins no batch before it. Returns whether a
    /// batch is due, and sets `next` to the timer of the locks not in it.
    fn scan(&mut self, now: Instant) -> bool {
        // The next timer of the locks not in this tick's batch, and of the batch's (which only
        // counts when nothing is really due: then no batch goes out).
        let mut next_rest: Option<Instant> = None;
        let mut next_due: Option<Instant> = None;
        let mut any_due = false;
        let mut i = 0;
        while i < self.locks.len() {
            let kept = &self.locks[i];
            if kept.is_lost() {
                // Lost (its keys left to the holder) or ended by the holder: not ours any more.
                self.locks.swap_remove(i);
                continue;
            }
            if kept.extending.load(Ordering::Relaxed) {
                i += 1;
                continue;
            }
            let valid_until = kept.valid_until();
            if now >= valid_until {
                let kept = self.locks.swap_remove(i);
                self.lost.push((kept, Error::Expired { released: 0 }));
                continue;
            }
            if let Some(retry) = kept.retry_at().filter(|&t| t > now) {
                // Backing off after a lost renewal: not before its time, not even in another
                // lock's batch.
                next_rest = Some(next_rest.map_or(retry, |n| n.min(retry)));
                i += 1;
                continue;
            }
            let at = valid_until.checked_sub(self.renew_left).unwrap_or(now);
            let next = if at <= now + self.coalesce {
                any_due |= at <= now;
                self.due.push(kept.clone());
                &mut next_due
            } else {
                &mut next_rest
            };
            *next = Some(next.map_or(at, |n| n.min(at)));
            i += 1;
        }
        if !any_due {
            // Only when one of them is really due: the others just come along.
            self.due.clear();
            self.next = [next_rest, next_due].into_iter().flatten().min();
        } else {
            // The others' timers; the batch's come back when their extends are decided.
            self.next = next_rest;
        }
        any_due
    }

    /// When to renew `kept` again after a renewal lost with `why`, or `None`: lost.
    ///
    /// A renewal that failed leaves the lock its validity (cut to what the nodes that ran it
    /// back: `validity_after_lost_extend`), and another may still win within it: after a
    /// client-side pause, a partition or a majority slow for one node timeout, one lost
    /// renewal used to end a lock with a third of its TTL left. So it is tried again while the
    /// nodes that back the validity still make a quorum (below) — after a backoff
    /// that doubles from the node timeout up to a tenth of the TTL, as long as the attempt
    /// after the backoff would be decided (a node timeout later) with half the renewal margin
    /// (a sixth of the TTL by default) still left. The lock is lost, and its holder told, at
    /// the first lost renewal that fails either test: a holder is told with at least that half
    /// margin left (or at its first renewal, if the node timeout is longer), time to stop its
    /// work before the validity ends.
    ///
    /// The validity is backed by the nodes that said yes to the round that set it (the
    /// acquire, or the last renewal that won: [`Kept::backed`]); a refusal says our token is
    /// gone from a node (expired, evicted, lost in a failover or a restart, deleted). While the
    /// backing nodes that did not refuse still make a quorum, every rival's quorum meets one
    /// of them, which holds our token until the validity ends: retrying is safe and may win
    /// once the silent ones answer (refusals add up over the retries, and one that comes after
    /// its round was decided counts too: `late_refusals`). When they do not, the refusals are
    /// evidence that the lock is no longer held as believed, and the holder is told at once —
    /// counting every node that did not refuse instead, a node that never had our token (down
    /// at the acquire) would have kept a holder believing while a rival could win. With the
    /// backing not known (`Lock::backing`: a lock of another server list, extended through
    /// one, or rebuilt from its parts), any refusal ends it. Not tried again either: a
    /// credentials error (`Auth`, `Permission`: so many nodes failing for good that the others
    /// make no quorum) or a validity already over (`Expired`). A lock lost for its refusals is
    /// no longer valid from then on.
    ///
    /// Retrying after answers that did not come is as safe as the first try: an extend only
    /// moves our own token's expiry, and the lock is believed only until the validity that a
    /// quorum backs.
    fn retry_after(&self, kept: &Kept, why: &Error, now: Instant) -> Option<Instant> {
        let report = match why {
            Error::NoQuorum(report) | Error::Held(report) | Error::TooSlow(report) => report,
            _ => return None,
        };
        // The backing counts the nodes that said yes to this lost renewal (their keys now
        // outlive the validity: a lock whose backing node was frozen at the renewal is not
        // lost while the nodes that took the renewal hold our token) and no
        // longer the nodes that refused (`kept_decided`).
        if !report.still_backed(kept.backed()) {
            // Lost for the refusals: its validity ends now, as the extend's own outcome cut
            // it when its backing said so (`extend.rs`) — the backing it was sent with may have
            // narrowed since, by a late refusal of an earlier round.
            kept.set_valid_until(kept.valid_until().min(now));
            return None;
        }
        let failures = kept.renewal_lost();
        let backoff = (self.node_timeout)
            .saturating_mul(1 << (failures - 1).min(20))
            .min(self.coalesce.max(self.node_timeout));
        let at = now + backoff;
        (at + self.node_timeout + self.renew_left / 2 < kept.valid_until()).then_some(at)
    }
}

impl<N: Net> Engine<N> {
    /// Keeps `kept` renewed from now on (what `Mailbox::push_keep` hands over, for a driver
    /// without a mailbox, such as the simulator's).
    // Used by the simulator (feature `sim`).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub fn keep(&mut self, kept: Arc<Kept>, now: Instant) {
        self.keeps.locks.push(kept);
        self.keeps.next = Some(now);
    }

    /// Applies decided extends of kept locks (a lost one is marked lost: `lose_keeps`).
    pub(super) fn kept_decided(&mut self, now: Instant) {
        let mut decided = std::mem::take(&mut self.keeps.decided);
        for (kept, outcome) in decided.drain(..) {
            kept.extending.store(false, Ordering::Relaxed);
            // Its timer moves: look at the list again (in this same turn: see `drive_until`).
            self.keeps.next = Some(now);
            if kept.is_lost() {
                // Ended by its holder while the extend was in flight (the holder's release
                // went out behind it on every connection).
                continue;
            }
            if let Outcome::Extended(valid_until, result) = outcome {
                // The backing first, then the validity (also after a lost extend: cut to what
                // the nodes still back): a snapshot taken between the two (`Kept::lock`, on
                // the holder's thread) pairs the old validity with the new backing, which
                // backs it too — never a new validity with a backing that does not (review).
                match &result {
                    Ok(yes) => kept.extended(*yes),
                    Err(why) => match why.report() {
                        // Its yeses hold our token past the validity; its refusals do not.
                        Some(report) => {
                            kept.backed_also_by(report.said_yes);
                            kept.refused_by(report.refused);
                        }
                        None => kept.forget_backing(),
                    },
                }
                kept.set_valid_until(valid_until);
                match result {
                    Ok(_) => {
                        self.shared.keep_extended.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => match self.keeps.retry_after(&kept, &why, now) {
                        Some(at) => {
                            kept.set_retry_at(at);
                            self.shared.keep_retried.fetch_add(1, Ordering::Relaxed);
                            #[cfg(feature = "log")]
                            {
                                let resource = kept.base().resource().escape_ascii();
                                let after = at - now;
                                crate::model::event::event!(Warn, event = "renewal_lost",
                                    resource:% = resource, why:% = why, retry_in:? = after;
                                    "{resource}: renewal lost ({why}); trying again in {after:?}");
                            }
                        }
                        None => self.keeps.lost.push((kept, why)),
                    },
                }
            }
        }
        self.keeps.decided = decided;
        // After the outcomes: a renewal won in this turn has replaced the backing that a late
        // refusal of an earlier round would otherwise be weighed against.
        self.late_refusals(now);
        self.lose_keeps();
    }

    /// Refusals of lost renewals that came after their decision (`Core::late_refusals`): each
    /// narrows its lock's backing, and a lock whose backing no longer makes a quorum (or not
    /// known, now refused) is lost, even while it waits to be tried again — its validity ends
    /// now: a rival may hold the lock (as after an extend refused in time: `extend.rs`).
    fn late_refusals(&mut self, now: Instant) {
        let mut late = std::mem::take(&mut self.core.late_refusals);
        let quorum = self.shared.nodes.len() / 2 + 1;
        for (kept, refused) in late.drain(..) {
            if kept.is_lost() {
                continue;
            }
            let report = Report::late_refusal(&self.shared.nodes, quorum, refused);
            if report.still_backed(kept.backed()) {
                kept.refused_by(refused);
                continue;
            }
            kept.set_valid_until(kept.valid_until().min(now));
            self.keeps.lost.push((kept, Error::Held(report)));
        }
        self.core.late_refusals = late;
    }

    /// Marks the locks in `keeps.lost` lost: every holder learns at once, and the callbacks go
    /// to the callback thread. Their keys are not released here: the holder may still be at
    /// work, within the validity it was given, and a release now would let a rival in while it
    /// stops (`redlock run`'s COMMAND ran its grace after the release). The
    /// holder releases when it ends the lock (`Kept::end_by_holder`: a release, a drop, the end
    /// of `with_lock`), or the keys expire.
    fn lose_keeps(&mut self) {
        let mut lost = std::mem::take(&mut self.keeps.lost);
        for (kept, why) in lost.drain(..) {
            if !kept.mark_lost(why.clone(), true) {
                continue;
            }
            #[cfg(feature = "log")]
            {
                let resource = kept.base().resource().escape_ascii();
                crate::model::event::event!(Warn, event = "lost", resource:% = resource, why:% = why;
                    "{resource}: kept lock lost: {why}");
            }
            #[cfg(not(feature = "log"))]
            let _ = why;
            kept.leave_to_holder();
        }
        self.keeps.lost = lost;
    }

    /// The keep-alive timers: extends every kept lock that is due (with those due within the
    /// coalescing window) in one batch, one write per node; marks expired ones lost; forgets the
    /// ones their holder ended.
    pub(super) fn tick_keeps(&mut self, now: Instant) {
        if self.keeps.next.is_none_or(|t| t > now) {
            return;
        }
        if self.keeps.scan(now) {
            self.extend_batch(now);
        }
        self.lose_keeps();
    }

    /// Extends the kept locks in `keeps.due`, and writes them at once: one write per node.
    fn extend_batch(&mut self, now: Instant) {
        let mut batch = std::mem::take(&mut self.keeps.due);
        let ttl = self.shared.config.ttl;
        for kept in batch.drain(..) {
            let lock = kept.lock();
            let backing = (&lock, kept.backed());
            match ReqKind::extend(&self.shared.config, backing, ttl, now) {
                Ok(kind) => {
                    kept.extending.store(true, Ordering::Relaxed);
                    let waiter = Waiter::Keep(kept.clone());
                    self.submit(kind, lock.resource(), lock.token(), waiter, now);
                }
                Err(why) => self.keeps.lost.push((kept, why)),
            }
        }
        self.keeps.due = batch;
        let before = self.net.writes();
        self.flush(now);
        let shared = &self.shared;
        shared.keep_ticks.fetch_add(1, Ordering::Relaxed);
        shared
            .keep_writes
            .fetch_add(self.net.writes() - before, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kept::Callbacks;
    use crate::model::addr::NodeAddr;
    use crate::model::error::{NodeFault, Refusal, Report};
    use crate::model::lock::Lock;
    use crate::model::token::Token;

    /// A kept lock of a fresh engine, valid until `until` (its backing not known).
    fn kept(until: Instant) -> Arc<Kept> {
        let token = Token::from_bytes(b"t").unwrap();
        let lock = Lock::new(b"job", token, until);
        Arc::new(Kept::new(lock, Arc::new(Callbacks::default()), &[]))
    }

    fn report(refused: u64, failed: &[usize]) -> Report {
        let nodes: Arc<[NodeAddr]> = ["redis://a:1", "redis://b:2", "redis://c:3"]
            .iter()
            .map(|s| NodeAddr::parse(s).unwrap())
            .collect();
        Report {
            nodes,
            quorum: 2,
            yes: 0,
            said_yes: 0,
            refused,
            failed: failed.iter().map(|&i| (i, NodeFault::Timeout)).collect(),
            refusal: Refusal::TokenGone,
            note: None,
        }
    }

    #[test]
    fn a_lost_renewal_is_tried_again_with_a_doubling_backoff_while_half_the_margin_is_left() {
        // TTL 30 s: renewed with 10 s left, given up with 5 s left; node timeout 50 ms, backoff
        // capped at 3 s.
        let config = Config::default();
        let keeps = Keeps::new(&config);
        let now = Instant::now();
        let kept = kept(now + Duration::from_secs(10));
        let no_quorum = Error::NoQuorum(report(0, &[1, 2]));
        let mut t = now;
        let mut backoffs = Vec::new();
        while let Some(at) = keeps.retry_after(&kept, &no_quorum, t) {
            backoffs.push((at - t).as_millis());
            // The attempt fails a node timeout later.
            t = at + Duration::from_millis(50);
        }
        assert_eq!(backoffs, [50, 100, 200, 400, 800, 1600]);
        // Given up with more than half the margin (5 s) left: no holder is told too late.
        assert!(kept.valid_until() - t > Duration::from_secs(5), "{t:?}");
        // A renewal that won forgets the backoff.
        kept.set_retry_at(t);
        assert_eq!(kept.retry_at(), Some(t));
        kept.extended(0b111);
        assert_eq!(kept.retry_at(), None);
        assert_eq!(
            keeps.retry_after(&kept, &no_quorum, now).map(|at| at - now),
            Some(Duration::from_millis(50))
        );
    }

    #[test]
    fn a_renewal_that_cannot_win_any_more_is_not_tried_again() {
        let config = Config::default();
        let keeps = Keeps::new(&config);
        let now = Instant::now();
        let kept = kept(now + Duration::from_secs(10));
        // The backing not known (a lock rebuilt from its parts): any refusal ends it, and its
        // validity with it.
        let a_gone = Error::Held(report(0b001, &[1, 2]));
        assert_eq!(keeps.retry_after(&kept, &a_gone, now), None);
        assert!(kept.valid_until() < now + Duration::from_millis(1));
        kept.set_valid_until(now + Duration::from_secs(10));
        let c_gone = Error::TooSlow(report(0b100, &[]));
        assert_eq!(keeps.retry_after(&kept, &c_gone, now), None);
        kept.set_valid_until(now + Duration::from_secs(10));
        // No answers from two: tried again.
        let silent = Error::NoQuorum(report(0, &[1, 2]));
        assert!(keeps.retry_after(&kept, &silent, now).is_some());
        // Won on a and b (c down then): our token gone from a leaves b alone of the backing,
        // and a rival may win on a and c — lost, though two nodes did not refuse.
        kept.extended(0b011);
        assert_eq!(keeps.retry_after(&kept, &a_gone, now), None);
        kept.set_valid_until(now + Duration::from_secs(10));
        // Gone from c, which never backed it: a and b still do. Tried again.
        let c_gone_b_silent = Error::Held(report(0b100, &[0, 1]));
        assert!(keeps.retry_after(&kept, &c_gone_b_silent, now).is_some());
        // Won on all three: gone from a (restarted, say), b and c silent: still backed by two.
        kept.extended(0b111);
        assert!(keeps.retry_after(&kept, &a_gone, now).is_some());
        // Gone from two of the three: lost.
        let two_gone = Error::Held(report(0b011, &[2]));
        assert_eq!(keeps.retry_after(&kept, &two_gone, now), None);
        kept.set_valid_until(now + Duration::from_secs(10));
        // Refusals add up over the retries (`kept_decided` narrows the backing): gone from a,
        // then from b (a silent then), leaves c alone of the three.
        kept.extended(0b111);
        assert!(keeps.retry_after(&kept, &a_gone, now).is_some());
        kept.refused_by(0b001);
        let b_gone = Error::Held(report(0b010, &[0, 2]));
        assert_eq!(keeps.retry_after(&kept, &b_gone, now), None);
        // The validity over, or a credentials error: lost.
        let expired = Error::Expired { released: 0 };
        assert_eq!(keeps.retry_after(&kept, &expired, now), None);
        let auth = Error::Auth {
            node: "a:1".into(),
            message: "WRONGPASS".into(),
        };
        assert_eq!(keeps.retry_after(&kept, &auth, now), None);
    }

    #[test]
    fn a_lock_backing_off_joins_no_batch_before_its_time_and_still_expires() {
        let config = Config::default();
        let mut keeps = Keeps::new(&config);
        let now = Instant::now();
        let kept = |valid: u64| kept(now + Duration::from_millis(valid));
        // Due now (less than a third of the TTL left), and another due now but backing off
        // until 200 ms from now.
        let due = kept(9_000);
        let backing_off = kept(9_000);
        backing_off.set_retry_at(now + Duration::from_millis(200));
        keeps.locks = vec![due.clone(), backing_off.clone()];
        assert!(keeps.scan(now));
        assert_eq!(keeps.due.len(), 1);
        assert!(Arc::ptr_eq(&keeps.due[0], &due));
        // Its retry time is the next timer.
        assert_eq!(keeps.next, Some(now + Duration::from_millis(200)));
        keeps.due.clear();
        // At its time it is due.
        let later = now + Duration::from_millis(200);
        keeps.locks = vec![backing_off.clone()];
        assert!(keeps.scan(later));
        assert!(Arc::ptr_eq(&keeps.due[0], &backing_off));
        keeps.due.clear();
        // A lock whose validity ends while it backs off is lost then, not left waiting.
        let ending = kept(100);
        ending.set_retry_at(now + Duration::from_millis(500));
        keeps.locks = vec![ending];
        assert!(!keeps.scan(now + Duration::from_millis(100)));
        assert_eq!(keeps.lost.len(), 1);
        assert!(keeps.locks.is_empty());
    }
}
