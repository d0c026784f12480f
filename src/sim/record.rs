//! What the checkers read, recorded as a run goes: beliefs, fenced acquisitions, wants,
//! faults and connects.

use std::time::Duration;

use super::callers::Want;
use super::clock::MS;
use super::report::LivenessViolation;
use super::setup::{
    BACKOFF_MAX, CONNECT_TIMEOUT, MOST_CLIENTS, NODE_TIMEOUT, NODES, RETRY_DELAY, RETRY_JITTER, TTL,
};

/// The longest a caller may wait for a resource that nobody holds while at most a minority
/// of the nodes is faulty and no fault begins or ends: the liveness check's bound, 4.43 s with
/// the simulation's settings. Each stretch it bounds begins at a change (a fault beginning or
/// ending, a holder ceasing to believe, the want itself); after it, in the worst case:
///
/// - keys set before the change by attempts or holders cut off by it expire: a TTL on the
///   nodes' clocks (+1 % and 2 ms for the drift);
/// - a connection the change broke is back: the reconnect backoff's ceiling and a connect
///   timeout;
/// - a release notice heard by other clients too: the attempt after it waits a random share of
///   a crowd's span, one round (at most a node timeout) per client subscribed other than the
///   releaser (the waiter itself among them) — at most `MOST_CLIENTS − 1` of them;
/// - split votes in a row (other callers' attempts racing ours), each followed by a random
///   pause that doubles up to 64 rounds of at most a node timeout: at most twice the last
///   (the pauses are random, so over a long enough run of splits this term is a likelihood,
///   not a certainty; the slack above makes a false report very unlikely);
/// - then the next attempt comes within a retry pause (or the wait's poll, the same) and is
///   decided within a node timeout.
pub const WAIT_BOUND: Duration = Duration::from_nanos(
    TTL.as_nanos() as u64 * 101 / 100
        + 2 * MS
        + BACKOFF_MAX.as_nanos() as u64
        + CONNECT_TIMEOUT.as_nanos() as u64
        + (MOST_CLIENTS - 1) * NODE_TIMEOUT
        + 2 * 64 * NODE_TIMEOUT
        + RETRY_DELAY.as_nanos() as u64
        + RETRY_JITTER.as_nanos() as u64
        + NODE_TIMEOUT,
);

/// What the checkers read, recorded as the run goes: every belief and fenced acquisition,
/// every want, and the faults and connects that excuse a wait or a reconnect.
#[derive(Default)]
pub(super) struct Record {
    /// (resource, client, start, end) of every reader's belief (checked against `beliefs`,
    /// the exclusive holders').
    pub(super) shared_beliefs: Vec<(usize, usize, u64, u64)>,
    /// (resource, client, start, end) of every belief interval that ended, and its fence.
    pub(super) beliefs: Vec<(usize, usize, u64, u64)>,
    pub(super) belief_fences: Vec<u64>,
    /// (start, end, fence, client) of every acquisition that got a fence.
    pub(super) acquisitions: Vec<(u64, u64, u64, usize)>,
    /// Every want that ended (granted or given up).
    pub(super) wants: Vec<Want>,
    /// (client, caller, members held, marks the next, from): a set's waiting acquire that
    /// holds its first members (won one step at a time, `engine/wait.rs`) and marks the one
    /// after them, from world time `from` until the caller's next entry (`(0, false)`: none any
    /// more), in order of time for each caller.
    pub(super) set_steps: Vec<(usize, usize, u16, bool, u64)>,
    /// (client, caller, resource, ns waited when sent): every waiting attempt of a writer or
    /// reader that a node ran with a script that steps back for a set's mark, placed by its
    /// wait (`World::place_deferring`), for the precedence clause.
    pub(super) deferences: Vec<(usize, usize, usize, u64)>,
    /// (client, waiting acquire, caller, resource): whose wait each is (to place `set_steps`
    /// and `deferences`).
    pub(super) wait_callers: Vec<(usize, crate::engine::request::OpId, usize, usize)>,
    /// (client, caller, resource, from, to): every waiting acquire (`lock_until`), from its
    /// submission until its outcome was taken or its async caller dropped it: the stretches in
    /// which a fair set may hold entries in its members' queues (the liveness check).
    pub(super) wait_spans: Vec<(usize, usize, usize, u64, u64)>,
    /// World times at which a fault began or ended (the liveness check's clock restarts).
    pub(super) changes: Vec<u64>,
    /// (node, from, to): a node down, paused, in its restart quarantine, or cut from or slow
    /// towards some client. While a majority is, no progress is owed.
    pub(super) node_faults: Vec<(usize, u64, u64)>,
    /// (client, from, to): a client paused; its own wants owe nothing then.
    pub(super) client_pauses: Vec<(usize, u64, u64)>,
    /// (client, node, duration): faults that may make a client reconnect to a node (`None`:
    /// every client, or every node).
    pub(super) link_faults: Vec<(Option<usize>, Option<usize>, u64)>,
    /// Connects by (client × NODES + node).
    pub(super) connects: Vec<u64>,
}

impl Record {
    /// A record for `clients` clients, empty.
    pub(super) fn new(clients: usize) -> Record {
        Record {
            connects: vec![0; clients * NODES],
            ..Record::default()
        }
    }

    /// The liveness check: each want's longest stretch during which nobody believed they held
    /// its resource, at most a minority of the nodes was faulty, its caller was not paused,
    /// and no fault began or ended (`members`: each resource's, see `World::members`): the
    /// longest such stretch of all the wants, and the violation it is if longer than
    /// [`WAIT_BOUND`].
    ///
    /// A set that waits takes its members one at a time, holds those it has and marks the one
    /// it waits for (`engine/wait.rs`): while it holds or marks a member, the others' wants of
    /// it are owed nothing (the mark's life after it too). The set itself is owed its next
    /// member: while none of the members up to the one it waits for is held by anybody else
    /// (a belief, another set's hold or mark), it must get it within the bound — starvation
    /// is a liveness violation. A set that waited for a moment when all its members were free
    /// together (`Mutation::SetsAllAtOnce`) is caught by it.
    ///
    /// Without ordered sets (`Config::ordered_sets`) a set is owed progress only while every
    /// member is free: it tries them all at once.
    ///
    /// With fair locks (`fair`: each resource's `shared_of`, `Config::fair`), a set that waits
    /// is in the queue of every member and marks each as a writer does: it keeps the younger
    /// fair waiters and the readers of each out while it waits for another (its reservation).
    /// A plain want or a reader of a member is owed nothing during another caller's set wait
    /// (`lock_until`, [`Record::wait_spans`]) of it, and a mark's life after (an entry or mark
    /// that a leave or release did not reach), whatever their ages — lenient for a plain want
    /// whose own wait was ahead of the set's, but a plain waiter needs one member and cannot
    /// block a set in turn. A set want is excused only by a set wait that began before the
    /// want did, so before any of its own waits: strict (its own later waits are behind such a
    /// set's, yet it is owed) but it keeps the oldest of sets that block each other owed its
    /// members, so that a deadlock between sets (each first on a member the other needs) is
    /// still a violation: a deadlock of waits refused while any other entry lives
    /// (a mutation of the model) gave violations only so, the simulator's waits being shorter
    /// than the bound.
    pub(super) fn liveness(
        &mut self,
        members: &[Vec<usize>],
        mark_life: u64,
        (ordered, fair): (bool, Option<&[bool]>),
    ) -> (u64, Option<LivenessViolation>) {
        let covers = self.owed_nothing(members);
        self.changes.sort_unstable();
        self.changes.dedup();
        // Each set want's segments: (from, to, members held, marks the next), covering it.
        let segments: Vec<Vec<(u64, u64, usize, bool)>> = (self.wants.iter())
            .map(|w| match members[w.res].len() > 1 {
                true => self.segments(w),
                false => Vec::new(),
            })
            .collect();
        // Per plain resource: (from, to, want) while a waiting set holds or marks it.
        let mut by_sets: Vec<Vec<(u64, u64, usize)>> = vec![Vec::new(); members.len()];
        for (i, (w, segs)) in self.wants.iter().zip(&segments).enumerate() {
            for &(a, b, held, marks) in segs {
                let set = &members[w.res];
                for (j, &m) in set.iter().enumerate().take(held + usize::from(marks)) {
                    let end = if j == held {
                        b.saturating_add(mark_life)
                    } else {
                        b
                    };
                    by_sets[m].push((a, end, i));
                }
            }
        }
        // Per plain resource: (from, to, client, caller) while a waiting fair set reserves it:
        // its wait, and a mark's life after (an entry or mark a leave or release did not reach).
        let mut reserved: Vec<Vec<(u64, u64, usize, usize)>> = vec![Vec::new(); members.len()];
        if let Some(shared_of) = fair.filter(|_| !ordered) {
            for &(c, k, res, from, to) in &self.wait_spans {
                if members[res].len() > 1 && !shared_of[res] {
                    for &m in &members[res] {
                        reserved[m].push((from, to.saturating_add(mark_life), c, k));
                    }
                }
            }
        }
        let mut longest = 0;
        let mut worst: Option<LivenessViolation> = None;
        for (i, w) in self.wants.iter().enumerate() {
            let set = &members[w.res];
            let a_set = set.len() > 1;
            // A set: per segment, the members up to the one it waits for; any other want: its
            // resource's members (itself, or the one a reader reads).
            let parts: Vec<(u64, u64, &[usize])> = match set.len() > 1 && ordered {
                true => (segments[i].iter())
                    .map(|&(a, b, held, _)| (a, b, &set[..(held + 1).min(set.len())]))
                    .collect(),
                false => vec![(w.start, w.end, &set[..])],
            };
            for (a, b, of) in parts {
                let mut cover: Vec<(u64, u64)> = Vec::new();
                for &m in of {
                    cover.extend_from_slice(&covers[m]);
                    cover.extend((by_sets[m].iter()).filter(|e| e.2 != i).map(|e| (e.0, e.1)));
                    cover.extend(
                        (reserved[m].iter())
                            .filter(|e| (e.2, e.3) != (w.client, w.caller))
                            .filter(|e| !a_set || e.0 < w.start)
                            .map(|e| (e.0, e.1)),
                    );
                }
                let cover = merged(cover);
                let part = Want {
                    start: a,
                    end: b,
                    ..*w
                };
                for (x, y) in free_stretches(&cover, &part) {
                    self.longest_unchanged(w, (x, y), &mut longest, &mut worst);
                }
            }
        }
        (longest, worst)
    }

    /// The segments of set want `w`: (from, to, members held, marks the next), from its start
    /// to its end.
    fn segments(&self, w: &Want) -> Vec<(u64, u64, usize, bool)> {
        let mut out = Vec::new();
        let (mut from, mut held, mut marks) = (w.start, 0usize, false);
        for &(c, k, h, m, t) in &self.set_steps {
            if c != w.client || k != w.caller || t < w.start || t >= w.end {
                continue;
            }
            if t > from {
                out.push((from, t, held, marks));
            }
            (from, held, marks) = (t, usize::from(h), m);
        }
        out.push((from, w.end, held, marks));
        out
    }

    /// The stretches during which a majority of the nodes was faulty: nothing is owed then.
    fn majority_faulty(&self) -> Vec<(u64, u64)> {
        let mut edges: Vec<(u64, i32, usize)> = self
            .node_faults
            .iter()
            .flat_map(|&(n, from, to)| [(from, 1, n), (to, -1, n)])
            .collect();
        // Beginnings before ends at the same instant: one fault taking over from another.
        edges.sort_unstable_by_key(|&(t, d, n)| (t, -d, n));
        let mut active = [0i32; NODES];
        let mut blocked: Vec<(u64, u64)> = Vec::new();
        let mut since = None;
        for (t, d, n) in edges {
            active[n] += d;
            let faulty = active.iter().filter(|&&a| a > 0).count();
            if faulty > NODES / 2 {
                since.get_or_insert(t);
            } else if let Some(from) = since.take() {
                blocked.push((from, t));
            }
        }
        if let Some(from) = since {
            blocked.push((from, u64::MAX));
        }
        blocked
    }

    /// Per resource, the stretches (sorted, merged) during which its wants are owed nothing:
    /// someone believed they held it, or a majority of the nodes was faulty (counted as held).
    fn owed_nothing(&self, members: &[Vec<usize>]) -> Vec<Vec<(u64, u64)>> {
        let blocked = self.majority_faulty();
        let mut covers: Vec<Vec<(u64, u64)>> = vec![blocked; members.len()];
        for &(res, _, start, end) in self.beliefs.iter().chain(&self.shared_beliefs) {
            if start < end {
                covers[res].push((start, end));
            }
        }
        // A set is held while any member is (beliefs are recorded per member).
        for res in 0..members.len() {
            if members[res] != [res] {
                for i in 0..members[res].len() {
                    let held = covers[members[res][i]].clone();
                    covers[res].extend(held);
                }
            }
        }
        for list in &mut covers {
            *list = merged(std::mem::take(list));
        }
        covers
    }

    /// The caller and resource of client `client`'s waiting acquire `id` (`wait_callers`).
    pub(super) fn wait_of(
        &self,
        client: usize,
        id: crate::engine::request::OpId,
    ) -> Option<(usize, usize)> {
        (self.wait_callers.iter())
            .find(|e| e.0 == client && e.1 == id)
            .map(|e| (e.2, e.3))
    }

    /// The precedence clause: with ordered sets, no node runs a waiting writer's or reader's
    /// attempt with a script that steps back for a set's mark (`WAITING_ACQUIRE_BODY`, its
    /// fenced twin, `SHARED_ACQUIRE_BODY`) once the wait had lasted `precedence` (ns;
    /// `Config::set_precedence`) when the attempt was sent — else a steady stream of sets keeps
    /// it out as long as the stream lasts, though the resource is released and taken again
    /// and again (`Mutation::SetMarksUnbounded`). Reported as a [`LivenessViolation`] whose
    /// `free` stretch runs from the end of the precedence to that attempt (in the wait's own
    /// time: `want` starts at 0).
    pub(super) fn deferences_past(&self, precedence: u64) -> Option<LivenessViolation> {
        let &(client, caller, resource, waited) =
            self.deferences.iter().find(|d| d.3 > precedence)?;
        Some(LivenessViolation {
            resource,
            client,
            caller,
            want: (0, waited),
            free: (precedence, waited),
        })
    }

    /// Within the stretch `free` of want `w`, the pieces between changes: a piece longer than
    /// `longest` (within no pause of the caller, which owes nothing) is the new longest, and
    /// the new `worst` if it is longer than [`WAIT_BOUND`].
    fn longest_unchanged(
        &self,
        w: &Want,
        (a, b): (u64, u64),
        longest: &mut u64,
        worst: &mut Option<LivenessViolation>,
    ) {
        let mut from = a;
        let i = self.changes.partition_point(|&t| t <= a);
        for &t in self.changes[i..].iter().take_while(|&&t| t < b).chain([&b]) {
            let mid = from + (t - from) / 2;
            let paused = self
                .client_pauses
                .iter()
                .any(|&(c, p, q)| c == w.client && p <= mid && mid < q);
            if !paused && t - from > *longest {
                *longest = t - from;
                if t - from > WAIT_BOUND.as_nanos() as u64 {
                    *worst = Some(LivenessViolation {
                        resource: w.res,
                        client: w.client,
                        caller: w.caller,
                        want: (w.start, w.end),
                        free: (from, t),
                    });
                }
            }
            from = t;
        }
    }
}

/// `list` sorted, its overlapping intervals merged.
fn merged(mut list: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    list.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(list.len());
    for &(a, b) in list.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// The stretches of want `w` during which nothing in `list` (sorted, merged) covered it.
fn free_stretches(list: &[(u64, u64)], w: &Want) -> Vec<(u64, u64)> {
    let mut cur = w.start;
    let first = list.partition_point(|&(_, b)| b <= w.start);
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    for &(a, b) in &list[first..] {
        if a >= w.end {
            break;
        }
        if a > cur {
            gaps.push((cur, a));
        }
        cur = cur.max(b);
    }
    if cur < w.end {
        gaps.push((cur, w.end));
    }
    gaps
}
