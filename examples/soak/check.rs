//! What a run's records say: overlaps of holds, fence order, the longest wait while nobody
//! held, connects per node per process; the goals; the summary, the JSON line, the table.
//!
//! - **Overlap**: two holds of one resource (any processes) whose intervals intersect, a hold
//!   being from the acquire's return until the release is sent or the validity ends.
//! - **Fence violation**: in the order the holds of a resource began, a fence not greater
//!   than every fence before it (or no fence: fencing is on).
//! - **Longest wait while nobody held**: see [`Bound`](super::Bound) for the definition;
//!   computed per resource as the longest interval of (union of waits) minus (union of holds).
//! - **Connects**: each process's `NodeStats::connects` per node against
//!   [`connect_limit`]: one connect, plus for each fault on that node what it can cost (below).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;

use super::driver::{
    CLIENT_KILL, DEBUG_SLEEP, FAULT_KINDS, Fault, KILL, RunResult, STOP, recovery_bound,
};
use super::worker::{Hold, LOST, OUTCOMES, PATHS, Wait};
use super::{Bound, NODES, RESOURCES, client_config};

/// An overlap that begins within this of the recorded end of a kept lock that was lost is put
/// down to the holder's wake-up, not counted as an overlap: the engine marks a kept lock lost
/// (`is_held()` false) *before* it sends the release (`Engine::release_lost_keeps`), and a rival
/// can win only after that release; the recorded end of such a hold is when the holder's thread
/// or task woke up to the loss, later by its scheduling delay.
pub const LOSS_WAKE_SLACK: Duration = Duration::from_millis(5);
/// Examples of overlaps and fence violations kept for the report.
const EXAMPLES: usize = 5;
/// Stretches longer than this are counted apart in the report.
const LONG_STRETCH: Duration = Duration::from_secs(1);
/// Waits and faults named next to the longest stretch.
const NAMED: usize = 6;

/// A stretch during which a caller waited for a resource and nobody held it.
#[derive(Debug, Clone, Default)]
pub struct Stretch {
    pub resource: u8,
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
    pub holds: usize,
    pub holds_by_path: Vec<u64>,
    pub waits: usize,
    pub waits_by_outcome: Vec<u64>,
    pub overlaps: usize,
    pub overlap_examples: Vec<String>,
    /// Overlaps within [`LOSS_WAKE_SLACK`] of a lost kept lock's recorded end.
    pub late_loss_notices: usize,
    pub late_loss_examples: Vec<String>,
    /// The most requests a process sent to a node within one second: (requests, process,
    /// node, when).
    pub peak_requests: (u64, usize, usize, u64),
    /// Requests per second per node per process, on average over the run.
    pub mean_request_rate: f64,
    pub fence_violations: usize,
    pub fence_examples: Vec<String>,
    pub longest: Stretch,
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

/// Examines a run.
pub fn examine(run: &RunResult) -> Report {
    let bound = Bound::of(&client_config());
    let ttl_ns = client_config().ttl.as_nanos() as u64;
    let mut holds_by_path = vec![0; PATHS.len()];
    let mut waits_by_outcome = vec![0; OUTCOMES.len()];
    let mut holds: Vec<Vec<(Hold, usize)>> = vec![Vec::new(); RESOURCES];
    let mut waits: Vec<Vec<(Wait, usize)>> = vec![Vec::new(); RESOURCES];
    for (p, w) in run.workers.iter().enumerate() {
        for h in &w.holds {
            holds_by_path[(h.path & !LOST) as usize] += 1;
            holds[h.resource as usize].push((*h, p));
        }
        for x in &w.waits {
            waits_by_outcome[x.outcome as usize] += 1;
            waits[x.resource as usize].push((*x, p));
        }
    }
    let t = |ns: u64| (ns as f64 - run.started as f64) / 1e9;
    let mut overlaps = 0;
    let mut overlap_examples = Vec::new();
    let mut late_loss_notices = 0;
    let mut late_loss_examples = Vec::new();
    let mut fence_violations = 0;
    let mut fence_examples = Vec::new();
    let mut longest = Stretch::default();
    let mut long_stretches = 0;
    for r in 0..RESOURCES {
        let hs = &mut holds[r];
        hs.sort_by_key(|(h, _)| (h.start, h.end));
        // Overlaps: a hold that begins before the latest end so far.
        let mut latest: Option<(Hold, usize)> = None;
        let mut top_fence: Option<(Hold, usize)> = None;
        for &(h, p) in hs.iter() {
            if let Some((l, lp)) = latest
                && h.start < l.end
            {
                let late_notice =
                    l.path & LOST != 0 && l.end - h.start <= LOSS_WAKE_SLACK.as_nanos() as u64;
                let (count, examples) = if late_notice {
                    (&mut late_loss_notices, &mut late_loss_examples)
                } else {
                    (&mut overlaps, &mut overlap_examples)
                };
                *count += 1;
                if examples.len() < EXAMPLES {
                    examples.push(format!(
                        "soak:{r}: process {lp} task {} ({}) held {:.6}–{:.6} s, process {p} \
                         task {} ({}) from {:.6} s: {:.3} ms together",
                        l.task,
                        PATHS[(l.path & !LOST) as usize],
                        t(l.start),
                        t(l.end),
                        h.task,
                        PATHS[(h.path & !LOST) as usize],
                        t(h.start),
                        (l.end.min(h.end) - h.start) as f64 / 1e6
                    ));
                }
            }
            if latest.is_none_or(|(l, _)| h.end > l.end) {
                latest = Some((h, p));
            }
            // Fences: each greater than every one before it.
            match top_fence {
                Some((f, fp)) if h.fence <= f.fence || h.fence == 0 => {
                    fence_violations += 1;
                    if fence_examples.len() < EXAMPLES {
                        fence_examples.push(format!(
                            "soak:{r}: fence {} (process {p}, {}, from {:.6} s) after fence {} \
                             (process {fp}, {}, from {:.6} s)",
                            h.fence,
                            PATHS[(h.path & !LOST) as usize],
                            t(h.start),
                            f.fence,
                            PATHS[(f.path & !LOST) as usize],
                            t(f.start)
                        ));
                    }
                }
                None if h.fence == 0 => {
                    fence_violations += 1;
                    fence_examples.push(format!("soak:{r}: a hold without a fence"));
                }
                _ => top_fence = Some((h, p)),
            }
        }
        // Nobody held while someone waited: (union of waits) − (union of holds).
        let held = union(hs.iter().map(|(h, _)| (h.start, h.end)));
        let ws = &mut waits[r];
        ws.sort_by_key(|(w, _)| w.start);
        let waited = union(ws.iter().map(|(w, _)| (w.start, w.end)));
        for (a, b) in minus(&waited, &held) {
            if b - a > LONG_STRETCH.as_nanos() as u64 {
                long_stretches += 1;
            }
            if b - a > longest.end - longest.start {
                longest = Stretch {
                    resource: r as u8,
                    start: a,
                    end: b,
                    ..Stretch::default()
                };
            }
        }
    }
    if longest.end > longest.start {
        let (a, b) = (longest.start, longest.end);
        let mut named: Vec<_> = waits[longest.resource as usize]
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
        holds: holds.iter().map(Vec::len).sum(),
        holds_by_path,
        waits: waits.iter().map(Vec::len).sum(),
        waits_by_outcome,
        overlaps,
        overlap_examples,
        late_loss_notices,
        late_loss_examples,
        peak_requests: peak_requests(run),
        mean_request_rate: mean_request_rate(run),
        fence_violations,
        fence_examples,
        longest,
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
        let bound = self.bound.total();
        if self.longest.length() > bound {
            v.push(format!(
                "a wait of {} ms while nobody held soak:{} (goal ≤ {} ms)",
                self.longest.length().as_millis(),
                self.longest.resource,
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
        if self.holds == 0 {
            v.push("no lock was ever held".into());
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
        v
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
        let _ = writeln!(
            s,
            "soak seed {}: {:.1} s of faults, {} processes × {} callers (half threads, half tokio tasks), \
             {NODES} servers, TTL {} ms, fencing on, default quarantine",
            self.seed,
            self.ran.as_secs_f64(),
            self.processes,
            self.tasks,
            client_config().ttl.as_millis()
        );
        let _ = writeln!(s, "  holds {}; by path:", self.holds);
        for (i, n) in self.holds_by_path.iter().enumerate() {
            let lost = self.losses_by_path[i];
            let lost = if lost > 0 {
                format!(" ({lost} lost while kept)")
            } else {
                String::new()
            };
            let _ = writeln!(s, "    {:<32} {n}{lost}", PATHS[i]);
        }
        let outcomes: Vec<String> = OUTCOMES
            .iter()
            .zip(&self.waits_by_outcome)
            .filter(|(_, n)| **n > 0)
            .map(|(o, n)| format!("{o} {n}"))
            .collect();
        let _ = writeln!(s, "  waits {}: {}", self.waits, outcomes.join(", "));
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
            "  overlaps {} (goal 0); fence violations {} (goal 0)",
            self.overlaps, self.fence_violations
        );
        for e in self.overlap_examples.iter().chain(&self.fence_examples) {
            let _ = writeln!(s, "    {e}");
        }
        if self.late_loss_notices > 0 {
            let _ = writeln!(
                s,
                "  not counted as overlaps: {} holds that began within {} ms before the \
                 recorded end of a kept lock lost meanwhile (the lock is marked lost before \
                 its release is sent; the end recorded is the holder's wake-up):",
                self.late_loss_notices,
                LOSS_WAKE_SLACK.as_millis()
            );
            for e in &self.late_loss_examples {
                let _ = writeln!(s, "    {e}");
            }
        }
        let l = &self.longest;
        let _ = writeln!(
            s,
            "  longest wait while nobody held: {} ms on soak:{} at {:.3}–{:.3} s (goal ≤ {} \
             ms); stretches over {} s: {}",
            l.length().as_millis(),
            l.resource,
            secs(l.start),
            secs(l.end),
            self.bound.total().as_millis(),
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
        json!({
            "seed": self.seed,
            "duration_s": self.duration.as_secs_f64(),
            "processes": self.processes,
            "tasks": self.tasks,
            "holds": self.holds,
            "waits": self.waits,
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
        })
        .to_string()
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
        "| seed | s | holds | waits | overlaps (goal 0) | fence violations (goal 0) | longest \
         wait while nobody held, ms (goal ≤ bound) | most connects by a process to a node \
         (goal ≤ limit) | faults: SIGSTOP / SIGKILL+restart / CLIENT KILL / DEBUG SLEEP / \
         SCRIPT FLUSH | requests/s per node per process: mean, peak | connects with no fault \
         | goals |"
    );
    let _ = writeln!(s, "|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|---|");
    for line in lines.iter().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("not a run: {e}: {line}"))?;
        let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let kinds: Vec<String> = FAULT_KINDS
            .iter()
            .map(|k| v["faults_by_kind"][*k].as_u64().unwrap_or(0).to_string())
            .collect();
        let violations = v["violations"].as_array().map_or(0, Vec::len);
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} (≤ {:.0}) | {:.0} (≤ {:.0}) | \
             {} | {:.0}, {:.0} | {:.0} | {} |",
            v["seed"],
            n("duration_s"),
            n("holds"),
            n("waits"),
            n("overlaps"),
            n("fence_violations"),
            n("longest_nobody_held_ms"),
            n("bound_ms"),
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

#[cfg(test)]
mod tests {
    use super::*;

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
