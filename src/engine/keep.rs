//! Kept locks (`KeepAlive`, `keep`): timers of the engine. Each is extended when a share of its
//! TTL is left, with every lock due within a coalescing window in the same batch (one write per
//! node); a lock whose extend is lost, or whose validity ends, is marked lost, released on every
//! node, and its callback runs once that release is over.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::Error;
use crate::kept::Kept;
use crate::net::Net;
use crate::request::{Outcome, ReqKind};

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
    /// Reused lists: due in this tick; decided in this turn (extends, then lost releases).
    due: Vec<Arc<Kept>>,
    pub decided: Vec<(Arc<Kept>, Option<Outcome>)>,
    lost: Vec<(Arc<Kept>, Error)>,
}

impl Keeps {
    pub fn new(config: &Config) -> Keeps {
        Keeps {
            locks: Vec::new(),
            next: None,
            renew_left: config.ttl.mul_f64(config.renew_fraction),
            coalesce: config.ttl / COALESCE_SHARE,
            due: Vec::new(),
            decided: Vec::new(),
            lost: Vec::new(),
        }
    }

    /// Looks at every lock at `now`: forgets the ones lost or ended by their holder, marks the
    /// expired ones lost (into `lost`), and gathers into `due` those to extend — the ones due
    /// within the coalescing window, if one of them really is due. Returns whether a batch is
    /// due, and sets `next` to the timer of the locks not in it.
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
                // Lost (its release is under way) or ended by the holder: not ours any more.
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

    /// Applies decided extends of kept locks (a lost one is marked lost and released), and
    /// hands the callbacks of lost locks whose release is over to the callback thread.
    pub(super) fn kept_decided(&mut self, now: Instant) {
        let mut decided = std::mem::take(&mut self.keeps.decided);
        for (kept, outcome) in decided.drain(..) {
            let Some(outcome) = outcome else {
                // The release of a lost lock is over: every node that answered in time has
                // deleted our token; now the callback.
                kept.settle_loss();
                continue;
            };
            kept.extending.store(false, Ordering::Relaxed);
            // Its timer moves: look at the list again (in this same turn: see `drive_until`).
            self.keeps.next = Some(now);
            if kept.is_lost() {
                // Ended by its holder while the extend was in flight (the holder's release
                // went out behind it on every connection).
                continue;
            }
            if let Outcome::Extended(valid_until, result) = outcome {
                // Also after a lost extend: its validity is cut to what the nodes still back.
                kept.set_valid_until(valid_until);
                match result {
                    Ok(()) => {
                        kept.extended();
                        self.shared.keep_extended.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => self.keeps.lost.push((kept, why)),
                }
            }
        }
        self.keeps.decided = decided;
        self.release_lost_keeps(now);
    }

    /// Marks the locks in `keeps.lost` lost (every holder learns first, before any round
    /// trip), then releases them on every node, waiting for the replies as an unlock does: the
    /// callback runs when that is over, so it never finds our stale token on a node that
    /// answered.
    fn release_lost_keeps(&mut self, now: Instant) {
        let mut lost = std::mem::take(&mut self.keeps.lost);
        lost.retain(|(kept, why)| kept.mark_lost(why.clone()));
        #[cfg(feature = "log")]
        for (kept, why) in &lost {
            let resource = kept.base().resource().escape_ascii();
            crate::event::event!(Warn, event = "lost", resource:% = resource, why:% = why;
                "{resource}: kept lock lost: {why}");
        }
        for (kept, _) in lost.drain(..) {
            let (resource, token) = (kept.base().resource(), *kept.base().token());
            let waiter = Waiter::KeepLost(kept.clone());
            self.submit(ReqKind::Release, resource, &token, waiter, now);
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
        self.release_lost_keeps(now);
    }

    /// Extends the kept locks in `keeps.due`, and writes them at once: one write per node.
    fn extend_batch(&mut self, now: Instant) {
        let mut batch = std::mem::take(&mut self.keeps.due);
        let ttl = self.shared.config.ttl;
        for kept in batch.drain(..) {
            let lock = kept.lock();
            match ReqKind::extend(&self.shared.config, &lock, ttl, now) {
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
