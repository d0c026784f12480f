//! What a run's records say: overlaps of holds, permit holders at once, fence order, the
//! longest wait while nobody held, connects per node per process; the goals; the summary, the
//! JSON line, the table.
//!
//! - **Overlap**: two holds of one resource (any processes) whose intervals intersect, a hold
//!   being from the acquire's return until the release is sent or the validity ends — unless
//!   both are readers (shared locks). A set's hold is a hold of each member; a permit is a
//!   resource of its own (`soak:sem#<i>`), so this is also "each permit at most one holder".
//! - **Permit holders**: at most [`PERMITS`] holds of any permits at once.
//! - **Fence violation**: in the order the exclusive holds of a resource began (plain, set,
//!   permit: readers get no fence and are skipped), a fence not greater than every fence
//!   before it (or no fence: fencing is on).
//! - **Longest wait while nobody held**: see [`Bound`](super::Bound) for the definition, per
//!   kind of waiter; computed per resource (per set, for the semaphore) as the longest
//!   interval of (union of that kind's waits) minus (union of what rightly keeps them out).
//! - **Connects**: each process's `NodeStats::connects` per node against
//!   [`connect_limit`]: one connect, plus for each fault on that node what it can cost (below).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;

use super::driver::{
    CLIENT_KILL, ClockStep, DEBUG_SLEEP, FAULT_KINDS, Fault, KILL, RunResult, STOP, recovery_bound,
};
use super::worker::{
    BUDGETS, Hold, KINDS, LOST, OK, OUTCOMES, PATHS, PERMIT, PLAIN, SET, SHARED, Wait, budget_of,
    resource_name,
};
use super::{Bound, KEYS, NODES, PERMITS, RESOURCES, SEMAPHORE, client_config};

/// Examples of overlaps and fence violations kept for the report.
const EXAMPLES: usize = 5;
/// Stretches longer than this are counted apart in the report.
const LONG_STRETCH: Duration = Duration::from_secs(1);
/// Waits and faults named next to the longest stretch.
const NAMED: usize = 6;

/// A stretch during which a caller waited for a resource and nobody held it.
#[derive(Debug, Clone, Default)]
pub struct Stretch {
    /// The resource number (a set's first member; the semaphore's first permit).
    pub resource: u8,
    /// The kind of the waits (`worker::KINDS`).
    pub kind: u8,
    /// What they waited for: `soak:1`, `soak:1 (readers)`, `{soak:0, soak:2}`, `soak:sem (2
    /// permits)`.
    pub what: String,
    pub start: u64,
    pub end: u64,
    /// The waits it lies in: (process, task, path, outcome, start, end).
    pub waits: Vec<(usize, u16, u8, u8, u64, u64)>,
    /// Faults whose time as faulty came within a TTL before it, or during it.
    pub faults: Vec<Fault>,
}

impl Stretch {
    pub fn length(&self) -> Duration {
        Duration::from_nanos(self.end - self.start)
    }
}

/// The findings of one run.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub duration: Duration,
    pub processes: usize,
    pub tasks: usize,
    /// Holds, a set's counted once.
    pub holds: usize,
    /// `[path][kind]`.
    pub holds_by_path: Vec<[u64; 4]>,
    pub holds_by_kind: [u64; 4],
    /// Waits, a set's counted once.
    pub waits: usize,
    pub waits_by_kind: [u64; 4],
    pub waits_by_outcome: Vec<u64>,
    /// `[kind][budget]`: (waits that ended with the lock held, waits), a set's counted once;
    /// budgets as [`BUDGETS`](super::worker::BUDGETS).
    pub held_by_budget: [[(u64, u64); 3]; 4],
    /// Per resource (`soak:0` …): the share of the run during which a granted lock held it
    /// (readers and sets included), and how many callers waited for it on average (a set's
    /// wait counts for each member).
    pub held_share: [f64; RESOURCES],
    pub mean_waiting: [f64; RESOURCES],
    pub overlaps: usize,
    pub overlap_examples: Vec<String>,
    /// Holds that began after the engine gave a kept lock up (its `lost_at`, the hold's end)
    /// but before its holder noticed: not overlaps — the engine releases a lost lock only after
    /// marking it lost, and a rival can win only after that release — but they would have been
    /// counted as overlaps while a lost kept hold's end was the holder's wake-up (seed 8's 5
    /// overlaps at a load average of 16 may have been such: docs/guarantees.md, "One open
    /// finding").
    pub late_loss_notices: usize,
    pub late_loss_examples: Vec<String>,
    /// The most requests a process sent to a node within one second: (requests, process,
    /// node, when).
    pub peak_requests: (u64, usize, usize, u64),
    /// Requests per second per node per process, on average over the run.
    pub mean_request_rate: f64,
    pub fence_violations: usize,
    pub fence_examples: Vec<String>,
    /// Readers that began while another reader held the resource (allowed; shows that
    /// readers did share).
    pub readers_together: usize,
    /// Times a permit holder began while [`PERMITS`] others held a permit.
    pub over_permits: usize,
    /// The most permit holders at once.
    pub most_permit_holders: u64,
    pub longest: Stretch,
    /// The longest wait while nobody held, per kind of waiter.
    pub longest_by_kind: [Duration; 4],
    pub long_stretches: usize,
    pub bound: Bound,
    /// `[process][node]`.
    pub connects: Vec<Vec<u64>>,
    pub reconnects: Vec<Vec<u64>>,
    /// Per node, summed over the processes: connections lost, node timeouts, requests
    /// failed without a reply, idle connections closed by the server, `NOSCRIPT` answers,
    /// yeses refused by the quarantine.
    pub node_counters: Vec<[u64; 6]>,
    /// `[node]`.
    pub connect_limits: Vec<u64>,
    /// Per fault kind, the most connects one process made to the node during one fault.
    pub connects_in_fault_by_kind: Vec<u64>,
    /// Faults after which a process connected more often than [`fault_allowance`] says.
    pub over_allowance: Vec<String>,
    /// Connects with no fault on their node (after the first).
    pub unexplained: Vec<String>,
    /// The most connects of a process to a node before the faults began.
    pub initial_max: u64,
    /// Per fault kind, the longest time from a fault's end until every worker was connected
    /// to the node again.
    pub recovery_by_kind: Vec<Duration>,
    /// Faults whose recovery took longer than [`recovery_bound`].
    pub slow_recoveries: Vec<String>,
    /// The longest a restarted node took to have its fence counter seeded again.
    pub seeded_after: Duration,
    pub faults_by_node: Vec<u64>,
    pub faults_by_kind: Vec<u64>,
    pub most_faulty: usize,
    pub losses_by_path: Vec<u64>,
    pub unconfirmed: Vec<u64>,
    pub messages: Vec<String>,
    pub problems: Vec<String>,
    /// When the run's faults began (`mono_ns`), for times in the report.
    pub started: u64,
    /// How long faults were injected, as measured.
    pub ran: Duration,
    /// Steps of this machine's wall clock against its monotonic clock while the workers ran.
    pub clock_steps: Vec<ClockStep>,
}

/// What reconnects a fault on a node can cost one process, at most (each counted as a
/// connect, `NodeStats::connects`: sockets opened), from the fault's measured effect `d`:
///
/// - `SIGKILL` + restart, `SIGSTOP`, `DEBUG SLEEP`: while the node does not answer, a
///   connection that had worked and fails (refused; or `Overloaded`, 1024 requests waiting on
///   a frozen node; or its connect timeout) is reconnected at once; every connect that fails
///   before answering anything doubles the backoff (25 ms to the 2 s ceiling) before the
///   next. So: one at once, one per backoff step that fits in `d`, one once the node is back;
/// - `CLIENT KILL`: one; `SCRIPT FLUSH`: none;
///
/// plus one for each fault, for a connect under way when the fault struck.
pub fn fault_allowance(fault: &Fault) -> u64 {
    let config = client_config();
    let during = match fault.kind {
        STOP | KILL | DEBUG_SLEEP => {
            let d = fault.effect();
            let mut n = 1;
            let (mut at, mut backoff) = (Duration::ZERO, config.backoff_min);
            while at + backoff <= d {
                at += backoff;
                backoff = (backoff * 2).min(config.backoff_max);
                n += 1;
            }
            n + 1
        }
        CLIENT_KILL => 1,
        _ => 0,
    };
    during + 1
}

/// The most connects one process may make to `node`: one, plus [`fault_allowance`] of each
/// fault on it.
pub fn connect_limit(faults: &[Fault], node: usize) -> u64 {
    1 + faults
        .iter()
        .filter(|f| f.node == node)
        .map(fault_allowance)
        .sum::<u64>()
}

/// A connect is put down to a fault of its node if it was counted between the fault's start
/// and this long after the node stopped counting as faulty (the counters are read every
/// `worker::SAMPLE`).
const ATTRIBUTION_GRACE: Duration = Duration::from_millis(100);

/// Connects put down to faults: per fault and process, and those put down to none.
#[derive(Debug, Default)]
pub struct Attribution {
    /// `[fault][process]`.
    pub per_fault: Vec<Vec<u64>>,
    /// Connects before the faults began, most by one process to one node (1 expected).
    pub initial_max: u64,
    /// (process, node, when) of connects with no fault on their node.
    pub unexplained: Vec<(usize, usize, u64)>,
}

/// Puts each connect of each process down to the latest fault of its node whose time covers
/// it.
pub fn attribute(run: &RunResult) -> Attribution {
    let mut a = Attribution {
        per_fault: vec![vec![0; run.workers.len()]; run.faults.len()],
        ..Attribution::default()
    };
    let grace = ATTRIBUTION_GRACE.as_nanos() as u64;
    let sample = super::worker::SAMPLE.as_nanos() as u64;
    for (p, w) in run.workers.iter().enumerate() {
        let mut initial = vec![0; NODES];
        for &(node, at) in &w.connects {
            let node = node as usize;
            if at < run.started {
                initial[node] += 1;
                continue;
            }
            let fault = run.faults.iter().rposition(|f| {
                f.node == node && f.start <= at + sample && (f.open || at <= f.slot_end + grace)
            });
            match fault {
                Some(i) => a.per_fault[i][p] += 1,
                None => a.unexplained.push((p, node, at)),
            }
        }
        a.initial_max = a.initial_max.max(initial.into_iter().max().unwrap_or(0));
    }
    a
}

/// How long a waiting writer's mark (`redlock:waiting:<name>`, which keeps new readers out)
/// lives after the writer's last attempt: two fallback polls, at least a second
/// (`engine/notice.rs`, `mark`). A set that waits marks the member it waits for so.
pub fn mark_life() -> Duration {
    let c = client_config();
    ((c.retry_delay + c.retry_jitter) * 2).max(Duration::from_secs(1))
}

/// One liveness check: the waits of one kind for one thing, and what keeps them out
/// legitimately.
struct Class {
    kind: u8,
    what: String,
    resource: u8,
    waits: Vec<(Wait, usize)>,
    /// Disjoint, sorted: while the waits are rightly kept out.
    blocked: Vec<(u64, u64)>,
}

/// Sorted by start, then [`union`].
fn union_of(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    union(v.into_iter())
}

/// The name of a set of resource numbers: `{soak:0, soak:2}`.
fn set_name(members: u8) -> String {
    let names: Vec<String> = (0..8)
        .filter(|i| members & (1 << i) != 0)
        .map(resource_name)
        .collect();
    format!("{{{}}}", names.join(", "))
}

/// Examines a run.
pub fn examine(run: &RunResult) -> Report {
    let bound = Bound::of(&client_config());
    let ttl_ns = client_config().ttl.as_nanos() as u64;
    let mut holds_by_path = vec![[0; KINDS.len()]; PATHS.len()];
    let mut holds_by_kind = [0; KINDS.len()];
    let mut waits_by_kind = [0; KINDS.len()];
    let mut waits_by_outcome = vec![0; OUTCOMES.len()];
    let mut held_by_budget = [[(0, 0); BUDGETS.len()]; KINDS.len()];
    let mut holds: Vec<Vec<(Hold, usize)>> = vec![Vec::new(); KEYS];
    let mut waits: Vec<Vec<(Wait, usize)>> = vec![Vec::new(); KEYS];
    for (p, w) in run.workers.iter().enumerate() {
        for h in &w.holds {
            // A set's hold is on each member's line: counted once, at its first member.
            if u32::from(h.resource) == h.members.trailing_zeros() {
                holds_by_path[(h.path & !LOST) as usize][h.kind as usize] += 1;
                holds_by_kind[h.kind as usize] += 1;
            }
            holds[h.resource as usize].push((*h, p));
        }
        for x in &w.waits {
            if u32::from(x.resource) == x.members.trailing_zeros() {
                waits_by_outcome[x.outcome as usize] += 1;
                waits_by_kind[x.kind as usize] += 1;
                let cell = &mut held_by_budget[x.kind as usize][budget_of(x.path)];
                cell.0 += u64::from(x.outcome == OK);
                cell.1 += 1;
            }
            waits[x.resource as usize].push((*x, p));
        }
    }
    let t = |ns: u64| (ns as f64 - run.started as f64) / 1e9;
    let describe = |h: &Hold, p: usize| {
        format!(
            "process {p} task {} ({} {}{})",
            h.task,
            KINDS[h.kind as usize],
            PATHS[(h.path & !LOST) as usize],
            if h.path & LOST != 0 {
                ", lost while kept: the end is the engine's lost_at"
            } else {
                ""
            }
        )
    };
    let mut overlaps = 0;
    let mut overlap_examples = Vec::new();
    let mut late_loss_notices = 0;
    let mut late_loss_examples = Vec::new();
    let mut fence_violations = 0;
    let mut fence_examples = Vec::new();
    let mut readers_together = 0;
    // Fair locks (`SOAK_FAIR=1`) are not fenced: no fence to check.
    let fencing = client_config().fencing;
    for (r, hs) in holds.iter_mut().enumerate() {
        let name = resource_name(r as u8);
        hs.sort_by_key(|(h, _)| (h.start, h.end));
        // Overlaps: a hold that begins before the latest end so far of a hold it excludes —
        // any hold for a writer (a plain lock, a set, a permit), a writer's for a reader.
        let mut latest: Option<(Hold, usize)> = None;
        let mut latest_writer: Option<(Hold, usize)> = None;
        let mut latest_reader: Option<Hold> = None;
        // The lost kept holds whose holders noticed the loss last (any; a writer's).
        let mut noticed_last: Option<(Hold, usize)> = None;
        let mut noticed_last_writer: Option<(Hold, usize)> = None;
        let mut top_fence: Option<(Hold, usize)> = None;
        for &(h, p) in hs.iter() {
            if h.kind == SHARED {
                // Readers at once, as allowed: counted, to show that it happens.
                if latest_reader.is_some_and(|l| h.start < l.end) {
                    readers_together += 1;
                }
                if latest_reader.is_none_or(|l| h.end > l.end) {
                    latest_reader = Some(h);
                }
            }
            let rival = if h.kind == SHARED {
                latest_writer
            } else {
                latest
            };
            let noticed = if h.kind == SHARED {
                noticed_last_writer
            } else {
                noticed_last
            };
            let found = match (rival, noticed) {
                (Some((l, lp)), _) if h.start < l.end => {
                    Some((l, lp, l.end, &mut overlaps, &mut overlap_examples))
                }
                (_, Some((l, lp))) if h.start < l.noticed => Some((
                    l,
                    lp,
                    l.noticed,
                    &mut late_loss_notices,
                    &mut late_loss_examples,
                )),
                _ => None,
            };
            if let Some((l, lp, end, count, examples)) = found {
                *count += 1;
                if examples.len() < EXAMPLES {
                    examples.push(format!(
                        "{name}: {} held {:.6}–{:.6} s (noticed {:.6} s), {} from {:.6} s: \
                         {:.3} ms before {}",
                        describe(&l, lp),
                        t(l.start),
                        t(l.end),
                        t(l.noticed),
                        describe(&h, p),
                        t(h.start),
                        (end.min(h.end) - h.start) as f64 / 1e6,
                        if end == l.end {
                            "its end"
                        } else {
                            "its holder noticed"
                        },
                    ));
                }
            }
            if latest.is_none_or(|(l, _)| h.end > l.end) {
                latest = Some((h, p));
            }
            if h.path & LOST != 0 && noticed_last.is_none_or(|(l, _)| h.noticed > l.noticed) {
                noticed_last = Some((h, p));
            }
            if h.path & LOST != 0
                && h.kind != SHARED
                && noticed_last_writer.is_none_or(|(l, _)| h.noticed > l.noticed)
            {
                noticed_last_writer = Some((h, p));
            }
            if h.kind == SHARED {
                // Readers get no fence; a fence orders the exclusive holds.
                continue;
            }
            if latest_writer.is_none_or(|(l, _)| h.end > l.end) {
                latest_writer = Some((h, p));
            }
            if !fencing {
                continue;
            }
            // Fences: each greater than every one before it.
            match top_fence {
                Some((f, fp)) if h.fence <= f.fence || h.fence == 0 => {
                    fence_violations += 1;
                    if fence_examples.len() < EXAMPLES {
                        fence_examples.push(format!(
                            "{name}: fence {} ({}, from {:.6} s) after fence {} ({}, from \
                             {:.6} s)",
                            h.fence,
                            describe(&h, p),
                            t(h.start),
                            f.fence,
                            describe(&f, fp),
                            t(f.start)
                        ));
                    }
                }
                None if h.fence == 0 => {
                    fence_violations += 1;
                    fence_examples.push(format!("{name}: a hold without a fence"));
                }
                _ => top_fence = Some((h, p)),
            }
        }
    }
    // Permit holders at once, over every permit: at most PERMITS. (Each permit's own holders
    // are the overlap check's.)
    let mut events: Vec<(u64, i64)> = Vec::new();
    for hs in &holds[RESOURCES..] {
        for (h, _) in hs {
            if h.end > h.start {
                events.push((h.start, 1));
                events.push((h.end, -1));
            }
        }
    }
    events.sort_unstable(); // at one instant, ends (-1) before starts
    let (mut holders, mut most_permit_holders, mut over_permits) = (0i64, 0, 0);
    for (_, d) in events {
        holders += d;
        most_permit_holders = most_permit_holders.max(holders as u64);
        if d > 0 && holders > i64::from(PERMITS) {
            over_permits += 1;
        }
    }
    // How busy each resource was: held by somebody, waited for by how many.
    let (from, to) = (run.started, run.ended.max(run.started + 1));
    let within = |a: u64, b: u64| (a.max(from), b.min(to));
    let mut held_share = [0.0; RESOURCES];
    let mut mean_waiting = [0.0; RESOURCES];
    for r in 0..RESOURCES {
        let held = union_of(
            holds[r]
                .iter()
                .map(|(h, _)| within(h.start, h.end))
                .filter(|(a, b)| a < b)
                .collect(),
        );
        held_share[r] = held.iter().map(|(a, b)| b - a).sum::<u64>() as f64 / (to - from) as f64;
        let waited: u64 = waits[r]
            .iter()
            .map(|(w, _)| {
                let (a, b) = within(w.start, w.end);
                b.saturating_sub(a)
            })
            .sum();
        mean_waiting[r] = waited as f64 / (to - from) as f64;
    }
    // Liveness, per kind: (union of waits) − (union of what rightly keeps them out).
    let spans = |v: &[(Hold, usize)], keep: &dyn Fn(&Hold) -> bool| -> Vec<(u64, u64)> {
        v.iter()
            .filter(|(h, _)| keep(h))
            .map(|(h, _)| (h.start, h.end))
            .collect()
    };
    let of_kind = |r: usize, kinds: &[u8]| -> Vec<(Wait, usize)> {
        waits[r]
            .iter()
            .filter(|(w, _)| kinds.contains(&w.kind))
            .copied()
            .collect()
    };
    let mark = mark_life().as_nanos() as u64;
    // An ordered set that waits takes its members one at a time and holds those it has until
    // it is granted or gives up (`engine/wait.rs`): while it waits, it may rightly keep out
    // whoever waits for one of its members. The records say when it waited, not which member
    // it held when: its whole wait counts (a lenient bound for the waits beside it; the
    // set's own wait is checked against the holds of its members alone).
    let ordered = client_config().ordered_sets;
    // Fair (`SOAK_FAIR=1`), a set that waits is in every member's queue and marks each as a
    // writer does: it keeps younger fair waiters of its members out while it waits for another
    // (`FAIR_SET_ACQUIRE_BODY`). Its whole wait counts, whoever is younger, as an ordered set's;
    // and a set's wait is excused by another set's that shares a member, whichever began
    // first — so a deadlock between sets would not show here (the simulator's check keeps
    // the age rule: `Record::liveness`).
    let reserves = ordered || client_config().fair;
    let set_waits = |r: usize| -> Vec<(u64, u64)> {
        (waits.iter().flatten())
            .filter(|(w, _)| w.kind == SET && w.members & (1 << r) != 0)
            .map(|(w, _)| (w.start, w.end))
            .collect()
    };
    let mut classes = Vec::new();
    for (r, hs) in holds.iter().enumerate().take(RESOURCES) {
        let name = resource_name(r as u8);
        // A writer (plain): kept out by any hold of the resource, and by a set that waits
        // with it as a member (it holds the members before the one it waits for, and marks
        // that one).
        let mut blocked = spans(hs, &|_| true);
        // With ordered sets (`SOAK_ORDERED_SETS=1`), and by its mark after the set's wait:
        // waiting writers step back from a member a set waits for while the set's mark lives
        // (`SET_MARK_BODY`).
        // Fair, by its entry and mark after the set's wait (a leave that did not reach a node).
        if reserves {
            blocked.extend(set_waits(r).into_iter().map(|(a, b)| (a, b + mark)));
        }
        classes.push(Class {
            kind: PLAIN,
            what: name.clone(),
            resource: r as u8,
            waits: of_kind(r, &[PLAIN]),
            blocked: union_of(blocked),
        });
        // A reader: kept out by a writer's hold (plain or set), and by a waiting writer's
        // mark — a plain or set wait of the resource, and a mark's life after it (a set
        // marks the member it waits for).
        let mut blocked = spans(hs, &|h| h.kind != SHARED);
        blocked.extend(
            of_kind(r, &[PLAIN])
                .iter()
                .map(|(w, _)| (w.start, w.end + mark)),
        );
        blocked.extend(set_waits(r).into_iter().map(|(a, b)| (a, b + mark)));
        classes.push(Class {
            kind: SHARED,
            what: format!("{name} (readers)"),
            resource: r as u8,
            waits: of_kind(r, &[SHARED]),
            blocked: union_of(blocked),
        });
    }
    // A set: kept out by any hold of any member.
    for members in 1u8..(1 << RESOURCES) {
        let first = members.trailing_zeros() as usize;
        let ws: Vec<_> = of_kind(first, &[SET])
            .into_iter()
            .filter(|(w, _)| w.members == members)
            .collect();
        if ws.is_empty() {
            continue;
        }
        let mut blocked = Vec::new();
        for m in (0..RESOURCES).filter(|m| members & (1 << m) != 0) {
            blocked.extend(spans(&holds[m], &|_| true));
        }
        // With ordered or fair sets, and by another set that waits with a member of this one
        // (sets of the same members wait in one queue per process; each of them blocks the
        // others' checks only where they share a member, never its own wait).
        blocked.extend(
            (waits.iter().flatten())
                .filter(|(w, _)| reserves && w.kind == SET && w.members != members)
                .filter(|(w, _)| w.members & members != 0)
                .map(|(w, _)| (w.start, w.end)),
        );
        classes.push(Class {
            kind: SET,
            what: set_name(members),
            resource: first as u8,
            waits: ws,
            blocked: union_of(blocked),
        });
    }
    // The semaphore: kept out while every permit is held.
    let mut all_held = union_of(spans(&holds[RESOURCES], &|_| true));
    for hs in &holds[RESOURCES + 1..] {
        all_held = intersect(&all_held, &union_of(spans(hs, &|_| true)));
    }
    classes.push(Class {
        kind: PERMIT,
        what: format!("{SEMAPHORE} ({PERMITS} permits)"),
        resource: RESOURCES as u8,
        waits: of_kind(RESOURCES, &[PERMIT]),
        blocked: all_held,
    });
    let mut longest = Stretch::default();
    let mut longest_class = None;
    let mut longest_by_kind = [Duration::ZERO; KINDS.len()];
    let mut long_stretches = 0;
    for (i, c) in classes.iter().enumerate() {
        let waited = union_of(c.waits.iter().map(|(w, _)| (w.start, w.end)).collect());
        for (a, b) in minus(&waited, &c.blocked) {
            if b - a > LONG_STRETCH.as_nanos() as u64 {
                long_stretches += 1;
            }
            let d = Duration::from_nanos(b - a);
            let k = c.kind as usize;
            longest_by_kind[k] = longest_by_kind[k].max(d);
            if b - a > longest.end - longest.start {
                longest = Stretch {
                    resource: c.resource,
                    kind: c.kind,
                    what: c.what.clone(),
                    start: a,
                    end: b,
                    ..Stretch::default()
                };
                longest_class = Some(i);
            }
        }
    }
    if let Some(i) = longest_class {
        let (a, b) = (longest.start, longest.end);
        let mut named: Vec<_> = classes[i]
            .waits
            .iter()
            .filter(|(w, _)| w.start < b && w.end > a)
            .map(|(w, p)| (*p, w.task, w.path, w.outcome, w.start, w.end))
            .collect();
        named.sort_by_key(|x| std::cmp::Reverse(x.5.min(b) - x.4.max(a)));
        named.truncate(NAMED);
        longest.waits = named;
        longest.faults = run
            .faults
            .iter()
            .filter(|f| f.start < b && f.slot_end + ttl_ns > a)
            .take(NAMED)
            .cloned()
            .collect();
    }
    let connects: Vec<Vec<u64>> = run
        .workers
        .iter()
        .map(|w| w.nodes.iter().map(|n| n.connects).collect())
        .collect();
    let reconnects: Vec<Vec<u64>> = run
        .workers
        .iter()
        .map(|w| w.nodes.iter().map(|n| n.reconnects).collect())
        .collect();
    let mut faults_by_node = vec![0; NODES];
    let mut faults_by_kind = vec![0; FAULT_KINDS.len()];
    for f in &run.faults {
        faults_by_node[f.node] += 1;
        faults_by_kind[f.kind as usize] += 1;
    }
    let mut losses_by_path = vec![0; PATHS.len()];
    let mut messages = Vec::new();
    for w in &run.workers {
        for &(path, n) in &w.losses {
            losses_by_path[path as usize] += n;
        }
        for (path, outcome, m) in &w.messages {
            let line = format!(
                "{} → {}: {m}",
                PATHS[*path as usize], OUTCOMES[*outcome as usize]
            );
            if !messages.contains(&line) && messages.len() < 12 {
                messages.push(line);
            }
        }
    }
    let attribution = attribute(run);
    let mut connects_in_fault_by_kind = vec![0; FAULT_KINDS.len()];
    let mut over_allowance = Vec::new();
    for (i, per_process) in attribution.per_fault.iter().enumerate() {
        let f = &run.faults[i];
        let most = per_process.iter().copied().max().unwrap_or(0);
        let kind = f.kind as usize;
        connects_in_fault_by_kind[kind] = connects_in_fault_by_kind[kind].max(most);
        let allowed = fault_allowance(f);
        if most > allowed {
            over_allowance.push(format!(
                "node {} {} at {:.3} s (effect {} ms, healthy {:.3} s): {most} connects by one \
                 process (allowance {allowed}), per process {per_process:?}",
                f.node,
                FAULT_KINDS[kind],
                t(f.start),
                f.effect().as_millis(),
                t(f.slot_end)
            ));
        }
    }
    let mut recovery_by_kind = vec![Duration::ZERO; FAULT_KINDS.len()];
    let mut slow_recoveries = Vec::new();
    let mut seeded_after = Duration::ZERO;
    for f in run.faults.iter().filter(|f| !f.open) {
        let Some(recovery) = f.recovery() else {
            continue;
        };
        let kind = f.kind as usize;
        recovery_by_kind[kind] = recovery_by_kind[kind].max(recovery);
        if recovery > recovery_bound() {
            slow_recoveries.push(format!(
                "node {} {} at {:.3} s (effect {} ms): every worker connected again only {} ms \
                 after it ended (goal ≤ {} ms)",
                f.node,
                FAULT_KINDS[kind],
                t(f.start),
                f.effect().as_millis(),
                recovery.as_millis(),
                recovery_bound().as_millis()
            ));
        }
        if f.seeded > 0 {
            seeded_after = seeded_after.max(Duration::from_nanos(f.seeded - f.effect_end));
        }
    }
    let unexplained = attribution
        .unexplained
        .iter()
        .map(|(p, n, at)| format!("process {p} node {n} at {:.3} s", t(*at)))
        .collect();
    Report {
        seed: run.config.seed,
        duration: run.config.duration,
        processes: run.config.processes,
        tasks: run.config.tasks,
        holds: holds_by_kind.iter().sum::<u64>() as usize,
        holds_by_path,
        holds_by_kind,
        waits: waits_by_kind.iter().sum::<u64>() as usize,
        waits_by_kind,
        waits_by_outcome,
        held_by_budget,
        held_share,
        mean_waiting,
        overlaps,
        overlap_examples,
        late_loss_notices,
        late_loss_examples,
        peak_requests: peak_requests(run),
        mean_request_rate: mean_request_rate(run),
        fence_violations,
        fence_examples,
        readers_together,
        over_permits,
        most_permit_holders,
        longest,
        longest_by_kind,
        long_stretches,
        bound,
        connect_limits: (0..NODES).map(|n| connect_limit(&run.faults, n)).collect(),
        connects_in_fault_by_kind,
        over_allowance,
        unexplained,
        initial_max: attribution.initial_max,
        recovery_by_kind,
        slow_recoveries,
        seeded_after,
        connects,
        reconnects,
        faults_by_node,
        faults_by_kind,
        most_faulty: run.most_faulty,
        losses_by_path,
        unconfirmed: run.workers.iter().map(|w| w.shutdown.1).collect(),
        messages,
        problems: run.problems.clone(),
        started: run.started,
        ran: Duration::from_nanos(run.ended - run.started),
        clock_steps: run.clock_steps.clone(),
        node_counters: (0..NODES)
            .map(|n| {
                let mut sum = [0; 6];
                for w in &run.workers {
                    let f = w.nodes[n];
                    let each = [
                        f.downs,
                        f.timeouts,
                        f.failures,
                        f.idle_closes,
                        f.noscript,
                        f.quarantined,
                    ];
                    for (s, x) in sum.iter_mut().zip(each) {
                        *s += x;
                    }
                }
                sum
            })
            .collect(),
    }
}

/// The most requests one process sent to one node within a second (from the sampled
/// counters): (requests, process, node, when the second ended).
fn peak_requests(run: &RunResult) -> (u64, usize, usize, u64) {
    let second = 1_000_000_000;
    let mut best = (0, 0, 0, 0);
    for (p, w) in run.workers.iter().enumerate() {
        let c = &w.counters;
        let mut i = 0;
        for j in 0..c.len() {
            while c[j].0 - c[i].0 > second {
                i += 1;
            }
            for n in 0..c[j].1.len() {
                let sent = c[j].1[n][0] - c[i].1[n][0];
                if sent > best.0 {
                    best = (sent, p, n, c[j].0);
                }
            }
        }
    }
    best
}

/// Requests per second per node per process, over the run.
fn mean_request_rate(run: &RunResult) -> f64 {
    let mut total = 0;
    let mut pairs = 0;
    let mut span = 0.0;
    for w in &run.workers {
        if let (Some(first), Some(last)) = (w.counters.first(), w.counters.last()) {
            for n in 0..last.1.len() {
                total += last.1[n][0] - first.1[n][0];
                pairs += 1;
            }
            span = f64::max(span, (last.0 - first.0) as f64 / 1e9);
        }
    }
    if pairs == 0 || span == 0.0 {
        0.0
    } else {
        total as f64 / pairs as f64 / span
    }
}

/// The union of intervals sorted by start, as disjoint sorted intervals.
fn union(intervals: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in intervals {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// `a ∩ b`, both disjoint and sorted.
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `a − b`, both disjoint and sorted.
fn minus(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while s < e {
            match b.get(k) {
                Some(&(hs, he)) if hs < e => {
                    if hs > s {
                        out.push((s, hs));
                    }
                    s = s.max(he);
                    k += 1;
                }
                _ => {
                    out.push((s, e));
                    break;
                }
            }
        }
    }
    out
}

impl Report {
    /// The goals this run missed, each a sentence; empty when it met them all.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.overlaps > 0 {
            v.push(format!("{} overlapping holds (goal 0)", self.overlaps));
        }
        if self.fence_violations > 0 {
            v.push(format!(
                "{} fences out of order (goal 0)",
                self.fence_violations
            ));
        }
        if self.over_permits > 0 {
            v.push(format!(
                "{} times more than {PERMITS} permit holders at once (most {}; goal 0)",
                self.over_permits, self.most_permit_holders
            ));
        }
        let bound = self.bound.total();
        if self.longest.length() > bound {
            v.push(format!(
                "a wait of {} ms while nobody held {} (goal ≤ {} ms)",
                self.longest.length().as_millis(),
                self.longest.what,
                bound.as_millis()
            ));
        }
        for (p, row) in self.connects.iter().enumerate() {
            for (n, &c) in row.iter().enumerate() {
                if c > self.connect_limits[n] {
                    v.push(format!(
                        "process {p} connected {c} times to node {n} (goal ≤ {}: {} faults \
                         there)",
                        self.connect_limits[n], self.faults_by_node[n]
                    ));
                }
            }
        }
        // A rival that began after a kept lock was given up but before its holder noticed
        // (the notice capped at the validity): since the engine leaves a lost lock's keys to
        // its holder (16ec485), and a lock lost for refusals ends its validity at the loss, a
        // rival can win there only if the keys went from a majority before the validity
        // ended — a safety violation; it was reported apart and failed nothing (review).
        if self.late_loss_notices > 0 {
            v.push(format!(
                "{} holds began after a kept lock was given up but before its holder noticed \
                 (goal 0)",
                self.late_loss_notices
            ));
        }
        if self.holds == 0 {
            v.push("no lock was ever held".into());
        } else {
            // "0 overlaps" says nothing of a kind that was never held (review: a seed of an
            // earlier soak had no set hold at all, and met every goal).
            for (kind, &n) in KINDS.iter().zip(&self.holds_by_kind) {
                if n == 0 {
                    v.push(format!("no {kind} lock was ever held"));
                }
            }
        }
        // A run that did not keep to its own rules (a fault not injected, a node that never
        // became usable again) proves nothing either way.
        v.extend(self.problems.iter().cloned());
        v
    }

    /// What else the run showed that its goals do not cover, each a sentence: connects with no
    /// fault on their node, recoveries slower than their bound, faults that cost more connects
    /// than their allowance. Reported, not failed on.
    pub fn findings(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.unexplained.is_empty() {
            v.push(format!(
                "{} connects with no fault on their node (a healthy node's connection reset: \
                 1024 requests waiting, or the reply timeout): {}",
                self.unexplained.len(),
                self.unexplained[..self.unexplained.len().min(EXAMPLES)].join(", ")
            ));
        }
        v.extend(self.slow_recoveries.iter().cloned());
        v.extend(self.over_allowance.iter().take(EXAMPLES).cloned());
        if !self.clock_steps.is_empty() {
            v.push(format!(
                "the wall clock stepped against the monotonic clock: {} (the servers expire keys \
                 by the wall clock, the clients count validity on the monotonic one: a forward \
                 step ends every key that much early, on all {NODES} servers at once — outside \
                 the assumptions)",
                self.clock_steps_text()
            ));
        }
        v
    }

    /// The clock steps, as `+812.3 ms at 63.5 s, …` (at most [`EXAMPLES`]).
    fn clock_steps_text(&self) -> String {
        let mut v: Vec<String> = self
            .clock_steps
            .iter()
            .take(EXAMPLES)
            .map(|c| {
                format!(
                    "{:+.1} ms at {:.1} s",
                    c.step as f64 / 1e6,
                    (c.at as f64 - self.started as f64) / 1e9
                )
            })
            .collect();
        if self.clock_steps.len() > EXAMPLES {
            v.push(format!("{} more", self.clock_steps.len() - EXAMPLES));
        }
        v.join(", ")
    }

    /// The largest connects of a process to a node, and that node's limit.
    fn max_connects(&self) -> (u64, u64, usize, usize) {
        let mut best = (0, 0, 0, 0);
        for (p, row) in self.connects.iter().enumerate() {
            for (n, &c) in row.iter().enumerate() {
                if c > best.0 {
                    best = (c, self.connect_limits[n], p, n);
                }
            }
        }
        best
    }

    /// A readable summary, several lines.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let secs = |ns: u64| (ns as f64 - self.started as f64) / 1e9;
        // The workers' configuration as it ran (`SOAK_FAIR`, `SOAK_ORDERED_SETS` change it).
        let config = client_config();
        let on_off = |on: bool| if on { "on" } else { "off" };
        let _ = writeln!(
            s,
            "soak seed {}: {:.1} s of faults, {} processes × {} callers (half threads, half tokio tasks), \
             {NODES} servers, TTL {} ms, fencing {}, fair {}, ordered sets {}, default quarantine",
            self.seed,
            self.ran.as_secs_f64(),
            self.processes,
            self.tasks,
            config.ttl.as_millis(),
            on_off(config.fencing),
            on_off(config.fair),
            on_off(config.ordered_sets),
        );
        let per_kind = |counts: &[u64; 4]| -> String {
            let v: Vec<String> = KINDS
                .iter()
                .zip(counts)
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            v.join(", ")
        };
        let _ = writeln!(
            s,
            "  holds {}: {}; by path (plain / shared / set, or permit):",
            self.holds,
            per_kind(&self.holds_by_kind)
        );
        for (i, n) in self.holds_by_path.iter().enumerate() {
            let lost = self.losses_by_path[i];
            let lost = if lost > 0 {
                format!(" ({lost} lost while kept)")
            } else {
                String::new()
            };
            let counts = if n[PERMIT as usize] > 0 || i >= super::worker::SEM_PATHS {
                n[PERMIT as usize].to_string()
            } else {
                format!("{} / {} / {}", n[0], n[1], n[2])
            };
            let _ = writeln!(s, "    {:<40} {counts}{lost}", PATHS[i]);
        }
        let outcomes: Vec<String> = OUTCOMES
            .iter()
            .zip(&self.waits_by_outcome)
            .filter(|(_, n)| **n > 0)
            .map(|(o, n)| format!("{o} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  waits {}: {}; {}",
            self.waits,
            per_kind(&self.waits_by_kind),
            outcomes.join(", ")
        );
        let held: Vec<String> = KINDS
            .iter()
            .zip(&self.held_by_budget)
            .map(|(k, cells)| {
                let cells: Vec<String> = cells
                    .iter()
                    .map(|&(h, n)| format!("{h} of {n} ({})", percent(h, n)))
                    .collect();
                format!("{k} {}", cells.join(" / "))
            })
            .collect();
        let _ = writeln!(
            s,
            "  waits that ended held, by budget ({}): {}",
            BUDGETS.join(" / "),
            held.join("; ")
        );
        let busy: Vec<String> = (0..RESOURCES)
            .map(|r| {
                format!(
                    "{} {:.0} % / {:.1}",
                    resource_name(r as u8),
                    self.held_share[r] * 100.0,
                    self.mean_waiting[r]
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "  resources held by a granted lock / callers waiting on average: {}",
            busy.join(", ")
        );
        let kinds: Vec<String> = FAULT_KINDS
            .iter()
            .zip(&self.faults_by_kind)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  faults {}: {}; at most {} of {NODES} servers faulty at once",
            self.faults_by_kind.iter().sum::<u64>(),
            kinds.join(", "),
            self.most_faulty
        );
        let _ = writeln!(
            s,
            "  overlaps {} (goal 0; readers may share with readers: {} readers began while \
             another held); fence violations {} (goal 0; readers have none); most permit \
             holders at once {} (goal ≤ {PERMITS}), more than {PERMITS}: {}",
            self.overlaps,
            self.readers_together,
            self.fence_violations,
            self.most_permit_holders,
            self.over_permits
        );
        for e in self.overlap_examples.iter().chain(&self.fence_examples) {
            let _ = writeln!(s, "    {e}");
        }
        let _ = writeln!(
            s,
            "  the wall clock against the monotonic clock: {}",
            if self.clock_steps.is_empty() {
                format!("no step over {} ms", super::driver::CLOCK_STEP.as_millis())
            } else {
                format!("stepped {}", self.clock_steps_text())
            }
        );
        if self.late_loss_notices > 0 {
            let _ = writeln!(
                s,
                "  {} holds that began after the engine gave a kept lock up (lost_at, the \
                 hold's end) but before its holder noticed (within the validity: a violation, \
                 goal 0):",
                self.late_loss_notices,
            );
            for e in &self.late_loss_examples {
                let _ = writeln!(s, "    {e}");
            }
        }
        let l = &self.longest;
        let by_kind: Vec<String> = KINDS
            .iter()
            .zip(&self.longest_by_kind)
            .map(|(k, d)| format!("{k} {}", d.as_millis()))
            .collect();
        let _ = writeln!(
            s,
            "  longest wait while nobody held: {} ms on {} at {:.3}–{:.3} s (goal ≤ {} ms); \
             by kind of waiter, ms: {}; stretches over {} s: {}",
            l.length().as_millis(),
            l.what,
            secs(l.start),
            secs(l.end),
            self.bound.total().as_millis(),
            by_kind.join(", "),
            LONG_STRETCH.as_secs(),
            self.long_stretches
        );
        for (p, task, path, outcome, a, b) in &l.waits {
            let _ = writeln!(
                s,
                "    waiting: process {p} task {task} {} {:.3}–{:.3} s → {}",
                PATHS[*path as usize],
                secs(*a),
                secs(*b),
                OUTCOMES[*outcome as usize]
            );
        }
        for f in &l.faults {
            let _ = writeln!(
                s,
                "    fault: node {} {}{} {:.3} s, effect over {:.3} s, healthy {:.3} s",
                f.node,
                FAULT_KINDS[f.kind as usize],
                if f.length.is_zero() {
                    String::new()
                } else {
                    format!(" ({} ms)", f.length.as_millis())
                },
                secs(f.start),
                secs(f.effect_end),
                secs(f.slot_end)
            );
        }
        let recoveries: Vec<String> = FAULT_KINDS
            .iter()
            .zip(&self.recovery_by_kind)
            .map(|(k, d)| format!("{k} {} ms", d.as_millis()))
            .collect();
        let _ = writeln!(
            s,
            "  longest recovery (fault over → every worker connected again; goal ≤ {} ms): {}; \
             restarted node seeded again after ≤ {} ms",
            recovery_bound().as_millis(),
            recoveries.join(", "),
            self.seeded_after.as_millis()
        );
        let _ = writeln!(
            s,
            "  connects per node (columns) per process (rows); limit = 1 + each fault's \
             allowance:"
        );
        let limits: Vec<String> = (0..NODES)
            .map(|n| {
                format!(
                    "n{n}: {} faults, ≤ {}",
                    self.faults_by_node[n], self.connect_limits[n]
                )
            })
            .collect();
        let _ = writeln!(s, "    {}", limits.join(" | "));
        for (p, row) in self.connects.iter().enumerate() {
            let cells: Vec<String> = row
                .iter()
                .zip(&self.reconnects[p])
                .map(|(c, r)| format!("{c:>3} ({r} up again)"))
                .collect();
            let _ = writeln!(s, "    process {p}: {}", cells.join("  "));
        }
        let kinds: Vec<String> = FAULT_KINDS
            .iter()
            .zip(&self.connects_in_fault_by_kind)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "    most connects by one process in one fault: {}; before the faults: {}; with no \
             fault: {}; faults over their allowance: {}",
            kinds.join(", "),
            self.initial_max,
            self.unexplained.len(),
            self.over_allowance.len()
        );
        for o in self.over_allowance.iter().take(EXAMPLES) {
            let _ = writeln!(s, "      {o}");
        }
        let (peak, pp, pn, pat) = self.peak_requests;
        let _ = writeln!(
            s,
            "  requests per node per process: {:.0}/s on average; at most {peak} in one second \
             (process {pp} to node {pn}, the second up to {:.3} s)",
            self.mean_request_rate,
            secs(pat)
        );
        let _ = writeln!(
            s,
            "  per node, all processes: connections lost / node timeouts / failed requests / \
             idle closes / NOSCRIPT / quarantined yeses:"
        );
        for (n, c) in self.node_counters.iter().enumerate() {
            let cells: Vec<String> = c.iter().map(u64::to_string).collect();
            let _ = writeln!(s, "    node {n}: {}", cells.join(" / "));
        }
        let _ = writeln!(
            s,
            "  releases unconfirmed at shutdown, per process: {:?}",
            self.unconfirmed
        );
        if !self.messages.is_empty() {
            let _ = writeln!(s, "  some errors the callers got:");
            for m in &self.messages {
                let _ = writeln!(s, "    {m}");
            }
        }
        let findings = self.findings();
        if !findings.is_empty() {
            let _ = writeln!(s, "  findings (not goals):");
            for f in findings {
                let _ = writeln!(s, "    {f}");
            }
        }
        let violations = self.violations();
        if violations.is_empty() {
            let _ = writeln!(s, "  result: every goal met");
        } else {
            let _ = writeln!(s, "  result: FAILED");
            for v in violations {
                let _ = writeln!(s, "    {v}");
            }
        }
        s
    }

    /// The run as one JSON object (one line).
    pub fn json(&self) -> String {
        let (max_c, max_limit, max_p, max_n) = self.max_connects();
        let l = &self.longest;
        let mut v = json!({
            "seed": self.seed,
            "duration_s": self.duration.as_secs_f64(),
            "processes": self.processes,
            "tasks": self.tasks,
            "holds": self.holds,
            "waits": self.waits,
            "held_share": self.held_share,
            "mean_waiting": self.mean_waiting,
            "held_by_budget": KINDS.iter().zip(&self.held_by_budget)
                .map(|(k, cells)| {
                    let cells: serde_json::Map<String, serde_json::Value> = BUDGETS
                        .iter()
                        .zip(cells)
                        .map(|(b, &(h, n))| ((*b).to_owned(), json!([h, n])))
                        .collect();
                    ((*k).to_owned(), serde_json::Value::Object(cells))
                })
                .collect::<serde_json::Map<_, _>>(),
            "waits_by_outcome": OUTCOMES.iter().zip(&self.waits_by_outcome)
                .map(|(o, n)| (o.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "overlaps": self.overlaps,
            "late_loss_notices": self.late_loss_notices,
            "peak_requests_per_s": self.peak_requests.0,
            "mean_requests_per_s": self.mean_request_rate,
            "fence_violations": self.fence_violations,
            "longest_nobody_held_ms": l.length().as_secs_f64() * 1e3,
            "longest_at_s": (l.start as f64 - self.started as f64) / 1e9,
            "longest_resource": l.resource,
            "stretches_over_1s": self.long_stretches,
            "bound_ms": self.bound.total().as_secs_f64() * 1e3,
            "max_connects": max_c,
            "max_connects_limit": max_limit,
            "max_connects_at": [max_p, max_n],
            "connects": self.connects,
            "connect_limits": self.connect_limits,
            "faults_by_node": self.faults_by_node,
            "faults_by_kind": FAULT_KINDS.iter().zip(&self.faults_by_kind)
                .map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "most_faulty": self.most_faulty,
            "connects_in_fault_by_kind": FAULT_KINDS.iter().zip(&self.connects_in_fault_by_kind)
                .map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "faults_over_allowance": self.over_allowance.len(),
            "recovery_ms_by_kind": FAULT_KINDS.iter().zip(&self.recovery_by_kind)
                .map(|(k, d)| (k.to_string(), json!(d.as_millis() as u64)))
                .collect::<serde_json::Map<_, _>>(),
            "recovery_bound_ms": recovery_bound().as_millis() as u64,
            "seeded_after_ms": self.seeded_after.as_millis() as u64,
            "unexplained_connects": self.unexplained.len(),
            "kept_losses": self.losses_by_path.iter().sum::<u64>(),
            "unconfirmed_at_shutdown": self.unconfirmed,
            "violations": self.violations(),
            "findings": self.findings(),
            "clock_steps": self.clock_steps.iter()
                .map(|c| json!([(c.at as f64 - self.started as f64) / 1e9, c.step as f64 / 1e6]))
                .collect::<Vec<_>>(),
        });
        // The kinds, apart: one `json!` of everything passes its recursion limit.
        let kinds = json!({
            "longest_kind": KINDS[l.kind as usize],
            "longest_what": l.what,
            "longest_by_kind_ms": KINDS.iter().zip(&self.longest_by_kind)
                .map(|(k, d)| (k.to_string(), json!(d.as_secs_f64() * 1e3)))
                .collect::<serde_json::Map<_, _>>(),
            "holds_by_kind": KINDS.iter().zip(&self.holds_by_kind)
                .map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "waits_by_kind": KINDS.iter().zip(&self.waits_by_kind)
                .map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "permits": PERMITS,
            "most_permit_holders": self.most_permit_holders,
            "over_permits": self.over_permits,
            "readers_together": self.readers_together,
        });
        if let (Some(all), serde_json::Value::Object(kinds)) = (v.as_object_mut(), kinds) {
            all.extend(kinds);
        }
        v.to_string()
    }
}

/// A markdown table of runs, from their JSON lines.
///
/// # Errors
///
/// A line is not a run's JSON.
pub fn table(lines: &[String]) -> Result<String, String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| seed | s | holds | holds: plain / shared / set / permit | waits | waits with the \
         whole budget ended held, %: plain / shared / set / permit | overlaps (goal 0) \
         | fence violations (goal 0) | most permit holders at once (goal ≤ P) | longest \
         wait while nobody held, ms (goal ≤ bound) | … by kind of waiter: plain / shared / set \
         / permit | most connects by a process to a node \
         (goal ≤ limit) | faults: SIGSTOP / SIGKILL+restart / CLIENT KILL / DEBUG SLEEP / \
         SCRIPT FLUSH | requests/s per node per process: mean, peak | connects with no fault \
         | goals |"
    );
    let _ = writeln!(
        s,
        "|--:|--:|--:|---|--:|---|--:|--:|--:|--:|---|--:|---|--:|--:|---|"
    );
    for line in lines.iter().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("not a run: {e}: {line}"))?;
        let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let kinds: Vec<String> = FAULT_KINDS
            .iter()
            .map(|k| v["faults_by_kind"][*k].as_u64().unwrap_or(0).to_string())
            .collect();
        let violations = v["violations"].as_array().map_or(0, Vec::len);
        // Runs from before the kinds were mixed have no per-kind figures.
        let by_kind = |k: &str, ms: bool| -> String {
            if !v[k].is_object() {
                return "–".to_owned();
            }
            let cells: Vec<String> = KINDS
                .iter()
                .map(|kind| match v[k][*kind].as_f64() {
                    Some(x) if ms => format!("{x:.0}"),
                    Some(x) => format!("{x}"),
                    None => "–".to_owned(),
                })
                .collect();
            cells.join(" / ")
        };
        // The share of the waits with the whole budget (`lock_wait`) that ended held.
        let held = if v["held_by_budget"].is_object() {
            let cells: Vec<String> = KINDS
                .iter()
                .map(|kind| {
                    let cell = &v["held_by_budget"][*kind][BUDGETS[0]];
                    percent(cell[0].as_u64().unwrap_or(0), cell[1].as_u64().unwrap_or(0))
                        .trim_end_matches(" %")
                        .to_owned()
                })
                .collect();
            cells.join(" / ")
        } else {
            "–".to_owned()
        };
        let permits = match (v["most_permit_holders"].as_u64(), v["permits"].as_u64()) {
            (Some(m), Some(p)) => format!("{m} (≤ {p})"),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {} | {:.0} | {} | {:.0} | {:.0} | {} | {:.0} (≤ {:.0}) | {} | \
             {:.0} (≤ {:.0}) | {} | {:.0}, {:.0} | {:.0} | {} |",
            v["seed"],
            n("duration_s"),
            n("holds"),
            by_kind("holds_by_kind", false),
            n("waits"),
            held,
            n("overlaps"),
            n("fence_violations"),
            permits,
            n("longest_nobody_held_ms"),
            n("bound_ms"),
            by_kind("longest_by_kind_ms", true),
            n("max_connects"),
            n("max_connects_limit"),
            kinds.join(" / "),
            n("mean_requests_per_s"),
            n("peak_requests_per_s"),
            n("unexplained_connects"),
            if violations == 0 {
                "met".to_owned()
            } else {
                format!("**{violations} missed**")
            }
        );
    }
    Ok(s)
}

/// `part` of `whole` as a whole percentage, `–` of nothing.
fn percent(part: u64, whole: u64) -> String {
    match whole {
        0 => "–".to_owned(),
        _ => format!("{:.0} %", part as f64 * 100.0 / whole as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunConfig;
    use crate::worker::{NodeFigures, WorkerResult};

    const MS: u64 = 1_000_000;

    /// A hold of `kind` on the resources in `members` (once per member, as the worker writes
    /// a set's), from `a` to `b` ms, with `fence`.
    fn hold(kind: u8, members: u8, a: u64, b: u64, fence: u64) -> Vec<Hold> {
        (0..8u8)
            .filter(|i| members & (1 << i) != 0)
            .map(|r| Hold {
                resource: r,
                start: a * MS,
                end: b * MS,
                fence,
                path: 0,
                task: 0,
                kind,
                members,
                noticed: b * MS,
            })
            .collect()
    }

    /// A wait as the worker writes it: a set's once per member, any other once.
    fn wait(kind: u8, members: u8, a: u64, b: u64) -> Vec<Wait> {
        let lines = if kind == SET {
            members
        } else {
            1 << members.trailing_zeros()
        };
        (0..8u8)
            .filter(|i| lines & (1 << i) != 0)
            .map(|r| Wait {
                resource: r,
                start: a * MS,
                end: b * MS,
                outcome: 0,
                path: 0,
                task: 0,
                kind,
                members,
            })
            .collect()
    }

    fn run(holds: Vec<Vec<Hold>>, waits: Vec<Vec<Wait>>) -> Report {
        let worker = WorkerResult {
            holds: holds.concat(),
            waits: waits.concat(),
            nodes: vec![NodeFigures::default(); NODES],
            ..WorkerResult::default()
        };
        examine(&RunResult {
            config: RunConfig::new(0, Duration::from_secs(1)),
            workers: vec![worker],
            faults: Vec::new(),
            started: 0,
            ended: 10_000 * MS,
            problems: Vec::new(),
            most_faulty: 0,
            clock_steps: Vec::new(),
        })
    }

    const PERMIT_0: u8 = 1 << RESOURCES;
    const PERMIT_1: u8 = 1 << (RESOURCES + 1);

    #[test]
    fn clock_steps_are_found_and_reported_beside_the_overlaps() {
        use crate::driver::ClockSteps;
        // Samples 5 ms apart: a slew of 500 ppm is no step; the wall clock set 800 ms forward
        // is, and so is one set 3 ms back.
        let mut c = ClockSteps::default();
        let (mut real, mut mono) = (1_700_000_000_000_000_000i128, 1_000 * MS);
        for _ in 0..100 {
            real += 5 * MS as i128 + 2_500;
            mono += 5 * MS;
            c.sample(real, mono);
        }
        assert!(c.steps.is_empty(), "{:?}", c.steps);
        real += 5 * MS as i128 + 800 * MS as i128;
        mono += 5 * MS;
        c.sample(real, mono);
        real += 2 * MS as i128;
        mono += 5 * MS;
        c.sample(real, mono);
        assert_eq!(
            c.steps,
            [
                ClockStep {
                    at: mono - 5 * MS,
                    step: 800 * MS as i64
                },
                ClockStep {
                    at: mono,
                    step: -3 * MS as i64
                },
            ]
        );

        let mut report = run(Vec::new(), Vec::new());
        assert!(report.summary().contains("no step over 2 ms"));
        assert!(report.findings().is_empty());
        report.clock_steps = vec![ClockStep {
            at: 3_500 * MS,
            step: 812_300_000,
        }];
        assert!(
            report.summary().contains("stepped +812.3 ms at 3.5 s"),
            "{}",
            report.summary()
        );
        assert!(report.findings()[0].contains("+812.3 ms at 3.5 s"));
        let line: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
        assert_eq!(line["clock_steps"], json!([[3.5, 812.3]]));
    }

    #[test]
    fn waits_held_are_counted_per_kind_and_budget_a_set_once() {
        let mut set_held = wait(SET, 0b11, 0, 5);
        let mut set_refused = wait(SET, 0b101, 0, 4000);
        set_refused.iter_mut().for_each(|w| w.outcome = 1);
        let mut tried = wait(PLAIN, 0b1, 0, 0);
        tried[0].path = 1; // try_lock+unlock
        tried[0].outcome = 1;
        let mut short = wait(SHARED, 0b10, 0, 300);
        short[0].path = 11; // async lock_until(short)+unlock
        set_held.iter_mut().for_each(|w| w.path = 7); // with_lock
        let r = run(vec![], vec![set_held, set_refused, tried, short]);
        assert_eq!(r.held_by_budget[SET as usize], [(1, 2), (0, 0), (0, 0)]);
        assert_eq!(r.held_by_budget[PLAIN as usize], [(0, 0), (0, 0), (0, 1)]);
        assert_eq!(r.held_by_budget[SHARED as usize], [(0, 0), (1, 1), (0, 0)]);
        assert!(
            r.summary()
                .contains("set 1 of 2 (50 %) / 0 of 0 (–) / 0 of 0 (–)"),
            "{}",
            r.summary()
        );
        let table = table(&[r.json()]).unwrap();
        assert!(table.contains("| – / – / 50 / – |"), "{table}");
    }

    #[test]
    fn a_resource_s_held_share_is_the_union_of_its_holds_and_its_waiters_are_averaged() {
        // A run of 10 s: soak:0 held 0–4 s and (two readers) 3–5 s, so 5 s in all; a set of
        // soak:0 and soak:1 waits 0–2 s, a plain lock of soak:1 6–8 s. Past the run's end, only
        // what is within it counts: soak:2 held 9–12 s (1 s), waited for 9.5–11 s (0.5 s).
        let r = run(
            vec![
                hold(PLAIN, 0b1, 0, 4000, 1),
                hold(SHARED, 0b1, 3000, 5000, 0),
                hold(SHARED, 0b1, 3500, 4500, 0),
                hold(PLAIN, 0b100, 9000, 12_000, 2),
            ],
            vec![
                wait(SET, 0b11, 0, 2000),
                wait(PLAIN, 0b10, 6000, 8000),
                wait(PLAIN, 0b100, 9500, 11_000),
            ],
        );
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(r.held_share[0], 0.5), "{:?}", r.held_share);
        assert!(close(r.held_share[1], 0.0), "{:?}", r.held_share);
        assert!(close(r.held_share[2], 0.1), "{:?}", r.held_share);
        assert!(close(r.mean_waiting[0], 0.2), "{:?}", r.mean_waiting);
        assert!(close(r.mean_waiting[1], 0.4), "{:?}", r.mean_waiting);
        assert!(close(r.mean_waiting[2], 0.05), "{:?}", r.mean_waiting);
        assert!(
            r.summary()
                .contains("soak:0 50 % / 0.2, soak:1 0 % / 0.4, soak:2 10 % / 0.1"),
            "{}",
            r.summary()
        );
    }

    #[test]
    fn readers_share_with_readers_only() {
        let r = run(
            vec![
                hold(SHARED, 0b1, 0, 10, 0),
                hold(SHARED, 0b1, 5, 20, 0),
                hold(PLAIN, 0b1, 30, 40, 7),
            ],
            vec![],
        );
        assert_eq!((r.overlaps, r.fence_violations), (0, 0));
        assert_eq!(r.holds_by_kind, [1, 2, 0, 0]);
        assert_eq!(r.readers_together, 1);
        // A writer among readers, and a reader inside a writer's hold.
        let r = run(
            vec![
                hold(SHARED, 0b1, 0, 10, 0),
                hold(PLAIN, 0b1, 5, 20, 7),
                hold(SHARED, 0b1, 15, 16, 0),
            ],
            vec![],
        );
        assert_eq!(r.overlaps, 2);
    }

    /// A kept lock lost at 10 ms whose holder noticed at 30 ms: a rival from 20 ms is not an
    /// overlap (the engine released it at 10), but is counted apart; one from 5 ms is one.
    #[test]
    fn a_rival_after_the_loss_before_the_holder_noticed_is_counted_apart() {
        let mut lost = hold(PLAIN, 0b1, 0, 10, 5);
        lost[0].path |= LOST;
        lost[0].noticed = 30 * MS;
        let r = run(vec![lost.clone(), hold(PLAIN, 0b1, 20, 40, 6)], vec![]);
        assert_eq!((r.overlaps, r.late_loss_notices), (0, 1));
        // A goal: since the engine leaves a lost lock's keys to its holder, such a rival won
        // while the keys should have been there.
        let v = r.violations();
        assert!(
            v.iter().any(|v| v.contains("before its holder noticed")),
            "{v:?}"
        );
        // And a run without a kind's holds says so: its "0 overlaps" covers nothing there.
        assert!(
            v.iter().any(|v| v.contains("no set lock was ever held")),
            "{v:?}"
        );
        let r = run(vec![lost.clone(), hold(SHARED, 0b1, 20, 40, 0)], vec![]);
        assert_eq!((r.overlaps, r.late_loss_notices), (0, 1));
        let r = run(vec![lost, hold(PLAIN, 0b1, 5, 40, 6)], vec![]);
        assert_eq!((r.overlaps, r.late_loss_notices), (1, 0));
    }

    #[test]
    fn a_set_holds_each_member() {
        // {0, 2} against a reader of 2, and fenced on each member.
        let r = run(
            vec![
                hold(PLAIN, 0b001, 0, 10, 5),
                hold(SET, 0b101, 20, 30, 6),
                hold(SHARED, 0b100, 25, 35, 0),
                hold(PLAIN, 0b100, 40, 50, 4),
            ],
            vec![],
        );
        assert_eq!(r.holds_by_kind, [2, 1, 1, 0]);
        assert_eq!(r.overlaps, 1);
        // Fence 4 on soak:2 after the set's 6.
        assert_eq!(r.fence_violations, 1);
    }

    #[test]
    fn permits_at_most_p_holders() {
        let r = run(
            vec![
                hold(PERMIT, PERMIT_0, 0, 10, 1),
                hold(PERMIT, PERMIT_1, 5, 15, 2),
                hold(PERMIT, PERMIT_0, 8, 12, 3),
            ],
            vec![],
        );
        assert_eq!(
            (r.overlaps, r.over_permits, r.most_permit_holders),
            (1, 1, 3)
        );
        let r = run(
            vec![
                hold(PERMIT, PERMIT_0, 0, 10, 1),
                hold(PERMIT, PERMIT_1, 5, 15, 2),
                hold(PERMIT, PERMIT_0, 10, 12, 3),
            ],
            vec![],
        );
        assert_eq!(
            (r.overlaps, r.over_permits, r.most_permit_holders),
            (0, 0, 2)
        );
    }

    #[test]
    fn each_kind_waits_for_its_own_reasons() {
        let mark = mark_life().as_nanos() as u64 / MS;
        // A reader kept out by a waiting writer (and its mark after it) while another reader
        // holds: no stretch for the reader; the writer's wait, held throughout, none either.
        let r = run(
            vec![hold(SHARED, 0b1, 0, 500, 0)],
            vec![wait(PLAIN, 0b1, 10, 400), wait(SHARED, 0b1, 20, 300 + mark)],
        );
        assert_eq!(r.longest.length(), Duration::ZERO);
        // Past the mark's life the reader counts.
        let r = run(
            vec![hold(SHARED, 0b1, 0, 500, 0)],
            vec![wait(PLAIN, 0b1, 10, 400), wait(SHARED, 0b1, 20, 900 + mark)],
        );
        assert_eq!(
            r.longest_by_kind[SHARED as usize],
            Duration::from_millis(500)
        );
        // A set kept out by one member; the plain waiter of the other member is not.
        let r = run(
            vec![hold(PLAIN, 0b10, 0, 100, 1)],
            vec![wait(SET, 0b11, 0, 100), wait(PLAIN, 0b01, 0, 30)],
        );
        assert_eq!(r.longest_by_kind[SET as usize], Duration::ZERO);
        assert_eq!(r.longest_by_kind[PLAIN as usize], Duration::from_millis(30));
        assert_eq!(r.longest.what, "soak:0");
        assert_eq!(r.waits_by_kind, [1, 0, 1, 0]);
        // The semaphore: kept out only while both permits are held (50–100 ms).
        let r = run(
            vec![
                hold(PERMIT, PERMIT_0, 0, 100, 1),
                hold(PERMIT, PERMIT_1, 50, 200, 2),
            ],
            vec![wait(PERMIT, PERMIT_0 | PERMIT_1, 60, 300)],
        );
        assert_eq!(
            r.longest_by_kind[PERMIT as usize],
            Duration::from_millis(200)
        );
        assert_eq!(r.longest.what, format!("{SEMAPHORE} ({PERMITS} permits)"));
    }

    #[test]
    fn intersect_keeps_the_common_parts() {
        assert_eq!(
            intersect(&[(0, 10), (20, 30)], &[(5, 25), (28, 40)]),
            vec![(5, 10), (20, 25), (28, 30)]
        );
        assert_eq!(intersect(&[(0, 10)], &[]), vec![]);
    }

    #[test]
    fn minus_leaves_the_gaps() {
        let w = union([(0, 10), (5, 20), (30, 40)].into_iter());
        assert_eq!(w, vec![(0, 20), (30, 40)]);
        let h = union([(2, 4), (6, 8), (15, 35)].into_iter());
        assert_eq!(minus(&w, &h), vec![(0, 2), (4, 6), (8, 15), (35, 40)]);
        assert_eq!(minus(&w, &[]), w);
        assert_eq!(minus(&[(5, 6)], &[(0, 10)]), vec![]);
    }
}
