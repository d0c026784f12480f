//! The soak's workload under an ideal scheduler: what share of the waits could end held at
//! all, whatever the lock.
//!
//! The same callers (processes × tasks, half of them blocking threads), the same choices
//! (`pick`, the same API paths and their budgets, `hold_time`, `kept_time`,
//! `short_wait`, `think_time`) and the same 4 resources and semaphore of 2 as the real
//! soak, but no servers, no network, no polling and no faults: a waiter is granted the instant
//! its [`Policy`] allows it, and a hold lasts exactly its drawn time. These figures are the
//! workload's limits; what the real soak loses beside them is the lock's cost.
//!
//! A discrete-event simulation in nanoseconds, seeded: the same seed gives the same figures.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::worker::{
    ASYNC_PATHS, ASYNC_SEM_PATHS, PATHS, PERMIT, PLAIN, SEM_PATHS, SET, SHARED, Target, budget_of,
    hold_time, kept_time, pick, short_wait, think_time,
};
use crate::{PERMITS, RESOURCES, Rng, TTL, client_config};

/// Who an ideal scheduler grants when a resource comes free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// First come, first served for every kind, with no overtaking: a waiter is granted only
    /// when no earlier waiter it conflicts with is waiting or holding (readers that came
    /// together are granted together). The ideal fair lock (`Builder::fair`).
    Fcfs,
    /// Sets first: a waiting set is granted the instant every member is free (the waiting
    /// sets in their order, each that fits), and no other kind is granted a member a set
    /// waits for; the other kinds first come, first served among themselves. The most any
    /// scheduler that keeps other kinds out of a waiting set's members gives the sets.
    SetsFirst,
}

impl Policy {
    /// Every policy, in the order they are reported.
    pub const ALL: [Policy; 2] = [Policy::Fcfs, Policy::SetsFirst];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fcfs => "first come, first served (every kind)",
            Policy::SetsFirst => "sets first",
        }
    }
}

/// What one simulated run gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `held[kind][budget] = (waits that ended held, waits)`, kinds as [`KINDS`](crate::worker::KINDS), budgets as
    /// [`BUDGETS`](crate::worker::BUDGETS): the real soak's `held_by_budget`.
    pub held: [[(u64, u64); 3]; 4],
    /// Locks granted (plain, shared and sets; not permits).
    pub grants: u64,
}

impl Outcome {
    /// The share in per cent of `kind`'s waits with the whole budget that ended held.
    pub fn whole_budget_held(&self, kind: u8) -> f64 {
        let (held, waits) = self.held[kind as usize][0];
        if waits == 0 {
            return f64::NAN;
        }
        100.0 * held as f64 / waits as f64
    }
}

/// How long a path holds what it won: as the worker's path does (`hold_time`, twice when it
/// extends and holds again, `kept_time` when it keeps the lock or works in `with_lock`).
fn hold_of(path: u8, rng: &mut Rng) -> Duration {
    match path {
        // guard+extend, lock+extend (blocking and async), acquire_until+extend
        4 | 5 | 13 | 14 | 20 => hold_time(rng) + hold_time(rng),
        // keep, with_lock (blocking and async), with_permit, acquire+keep
        6 | 7 | 15 | 16 | 22 | 27 => kept_time(rng),
        _ => hold_time(rng),
    }
}

/// The time in nanoseconds of a duration.
fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// A caller waiting.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    caller: usize,
    target: Target,
    budget: usize,
    path: u8,
}

/// What happens next to a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// It picks its next target and begins to wait.
    Begin,
    /// Its wait's deadline (stale if the wait was granted meanwhile: `Sim::wait_no`).
    Deadline,
    /// It releases what it holds.
    Release,
}

/// The state of the resources and the semaphore.
#[derive(Debug, Default)]
struct Held {
    /// An exclusive holder (plain lock or set member) per resource.
    writer: [bool; RESOURCES],
    /// Readers per resource.
    readers: [u32; RESOURCES],
    /// Permits held.
    permits: u32,
}

impl Held {
    /// Whether `t` could be granted now, by the locks' own rules.
    fn fits(&self, t: Target) -> bool {
        match t.kind {
            PERMIT => self.permits < PERMITS,
            SHARED => !self.writer[t.first() as usize],
            _ => t
                .resources()
                .all(|r| !self.writer[r as usize] && self.readers[r as usize] == 0),
        }
    }

    fn take(&mut self, t: Target, n: i32) {
        match t.kind {
            PERMIT => self.permits = self.permits.wrapping_add_signed(n),
            SHARED => {
                let r = &mut self.readers[t.first() as usize];
                *r = r.wrapping_add_signed(n);
            }
            _ => {
                for r in t.resources() {
                    debug_assert_eq!(self.writer[r as usize], n < 0, "a resource taken twice");
                    self.writer[r as usize] = n > 0;
                }
            }
        }
    }
}

/// One simulated run.
struct Sim {
    policy: Policy,
    now: u64,
    rngs: Vec<Rng>,
    /// Events by time, then by their order of scheduling: (time, seq, caller, event).
    events: BinaryHeap<Reverse<(u64, u64, usize, Event)>>,
    seq: u64,
    held: Held,
    /// The waiting callers, in order of arrival.
    waiting: Vec<Waiter>,
    /// Each caller's current wait (its deadline event's `seq`; 0: none).
    wait_no: Vec<u64>,
    holding: Vec<Option<Target>>,
    out: Outcome,
}

impl Sim {
    fn schedule(&mut self, after: Duration, caller: usize, event: Event) -> u64 {
        self.seq += 1;
        self.events
            .push(Reverse((self.now + ns(after), self.seq, caller, event)));
        self.seq
    }

    /// `caller` picks its next target and path, as the worker's callers do, and waits.
    fn begin(&mut self, caller: usize, blocking: bool, lock_wait: Duration) {
        let rng = &mut self.rngs[caller];
        let target = pick(rng);
        let (first, end) = match (target.kind == PERMIT, blocking) {
            (false, true) => (0, ASYNC_PATHS),
            (false, false) => (ASYNC_PATHS, SEM_PATHS),
            (true, true) => (SEM_PATHS, ASYNC_SEM_PATHS),
            (true, false) => (ASYNC_SEM_PATHS, PATHS.len()),
        };
        let path = (first as u64 + rng.below((end - first) as u64)) as u8;
        let budget = budget_of(path);
        let wait = match budget {
            0 => lock_wait,
            1 => short_wait(rng),
            _ => Duration::ZERO,
        };
        self.out.held[target.kind as usize][budget].1 += 1;
        self.waiting.push(Waiter {
            caller,
            target,
            budget,
            path,
        });
        self.wait_no[caller] = self.schedule(wait, caller, Event::Deadline);
    }

    /// Grants the waiter at `i` of `waiting`.
    fn start_hold(&mut self, i: usize) {
        let w = self.waiting.remove(i);
        self.held.take(w.target, 1);
        self.holding[w.caller] = Some(w.target);
        self.wait_no[w.caller] = 0;
        self.out.held[w.target.kind as usize][w.budget].0 += 1;
        if w.target.kind != PERMIT {
            self.out.grants += 1;
        }
        let hold = hold_of(w.path, &mut self.rngs[w.caller]);
        self.schedule(hold, w.caller, Event::Release);
    }

    /// Grants every waiter the policy lets in now.
    fn grant(&mut self) {
        // Resources that an earlier waiter (or, sets first, any waiting set) wants: to write,
        // to read; and whether an earlier waiter of the semaphore waits.
        let mut write = 0u8;
        let mut read = 0u8;
        let mut sem_waits = false;
        if self.policy == Policy::SetsFirst {
            let mut i = 0;
            while i < self.waiting.len() {
                let t = self.waiting[i].target;
                if t.kind == SET && self.held.fits(t) {
                    self.start_hold(i);
                } else {
                    if t.kind == SET {
                        write |= t.members;
                    }
                    i += 1;
                }
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            let t = self.waiting[i].target;
            let clear = match t.kind {
                SET if self.policy == Policy::SetsFirst => {
                    i += 1;
                    continue;
                }
                PERMIT => !sem_waits,
                SHARED => write & t.members == 0,
                _ => (write | read) & t.members == 0,
            };
            if clear && self.held.fits(t) {
                self.start_hold(i);
                continue;
            }
            match t.kind {
                PERMIT => sem_waits = true,
                SHARED => read |= t.members,
                _ => write |= t.members,
            }
            i += 1;
        }
    }
}

/// Runs the soak's workload for `duration` under `policy`: `callers` callers (the first half
/// blocking threads, the rest tasks, as the worker's), seeded by `seed`.
pub fn run(policy: Policy, seed: u64, duration: Duration, callers: usize) -> Outcome {
    let lock_wait = client_config().lock_wait();
    let blocking = callers.div_ceil(2);
    let mut sim = Sim {
        policy,
        now: 0,
        rngs: (0..callers).map(|c| Rng::new(seed, c as u64)).collect(),
        events: BinaryHeap::new(),
        seq: 0,
        held: Held::default(),
        waiting: Vec::new(),
        wait_no: vec![0; callers],
        holding: vec![None; callers],
        out: Outcome {
            held: [[(0, 0); 3]; 4],
            grants: 0,
        },
    };
    for c in 0..callers {
        let first = think_time(&mut sim.rngs[c]);
        sim.schedule(first, c, Event::Begin);
    }
    while let Some(Reverse((at, seq, caller, event))) = sim.events.pop() {
        if at > ns(duration) {
            break;
        }
        sim.now = at;
        match event {
            Event::Begin => sim.begin(caller, caller < blocking, lock_wait),
            Event::Release => {
                let target = sim.holding[caller].take().expect("a release of a hold");
                sim.held.take(target, -1);
                let think = think_time(&mut sim.rngs[caller]);
                sim.schedule(think, caller, Event::Begin);
            }
            Event::Deadline => {
                if sim.wait_no[caller] != seq {
                    continue;
                }
                // A last chance at its deadline (a `try_lock`'s only one), then it gives up.
                sim.grant();
                if let Some(i) = sim.waiting.iter().position(|w| w.caller == caller) {
                    sim.waiting.remove(i);
                    sim.wait_no[caller] = 0;
                    let think = think_time(&mut sim.rngs[caller]);
                    sim.schedule(think, caller, Event::Begin);
                }
                continue;
            }
        }
        sim.grant();
    }
    sim.out
}

/// The report: for each policy, the share of the waits with the whole budget that ended held
/// per kind (least–most over `seeds` seeds from `first`, and the median), and the locks granted
/// a seed, as a markdown table.
pub fn report(first: u64, seeds: u64, duration: Duration, callers: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "The soak's workload under an ideal scheduler ({callers} callers, {} s, seeds {first}–{}; \
         TTL {} ms):\n",
        duration.as_secs(),
        first + seeds - 1,
        TTL.as_millis()
    );
    let _ = writeln!(
        s,
        "| scheduler | waits with the whole budget ended held, % (median): plain | shared | set \
         | permit | locks granted a seed |\n|---|--:|--:|--:|--:|--:|"
    );
    for policy in Policy::ALL {
        let runs: Vec<Outcome> = (first..first + seeds)
            .map(|seed| run(policy, seed, duration, callers))
            .collect();
        // least–most (median)
        let range = |f: &dyn Fn(&Outcome) -> f64| {
            let mut xs: Vec<f64> = runs.iter().map(f).collect();
            xs.sort_by(f64::total_cmp);
            let median = xs[xs.len() / 2];
            format!("{:.0}–{:.0} ({median:.0})", xs[0], xs[xs.len() - 1])
        };
        let cells: Vec<String> = [PLAIN, SHARED, SET, PERMIT]
            .iter()
            .map(|&k| range(&|o: &Outcome| o.whole_budget_held(k)))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            policy.name(),
            cells.join(" | "),
            range(&|o: &Outcome| o.grants as f64)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::{BUDGETS, KINDS};

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_lone_caller_gets_every_lock_it_waits_for() {
        for policy in Policy::ALL {
            let o = run(policy, 7, MINUTE, 1);
            for (kind, by_budget) in o.held.iter().enumerate() {
                for (budget, (held, waits)) in by_budget.iter().enumerate() {
                    assert_eq!(
                        held, waits,
                        "{policy:?} {} {}",
                        KINDS[kind], BUDGETS[budget]
                    );
                }
            }
            assert!(o.grants > 100, "{policy:?}: {} grants", o.grants);
        }
    }

    #[test]
    fn a_seed_gives_the_same_outcome() {
        assert_eq!(
            run(Policy::Fcfs, 3, MINUTE, 96),
            run(Policy::Fcfs, 3, MINUTE, 96)
        );
    }

    #[test]
    fn sets_first_gives_sets_more_and_the_others_less_than_first_come_first_served() {
        for seed in 1..=3 {
            let fcfs = run(Policy::Fcfs, seed, MINUTE, 96);
            let first = run(Policy::SetsFirst, seed, MINUTE, 96);
            assert!(first.whole_budget_held(SET) > fcfs.whole_budget_held(SET) + 20.0);
            for kind in [PLAIN, SHARED] {
                assert!(first.whole_budget_held(kind) < fcfs.whole_budget_held(kind));
            }
        }
    }
}
