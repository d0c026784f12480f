//! What a schedule did — the [`Report`] that `run` returns — and the violations the checkers
//! put in it: overlapping holders, fences out of order, holders told of a validity that no
//! quorum backs, waits past their bound or their deadline, progress below its floor,
//! reconnects the faults do not explain.

use std::time::Duration;

/// Fault kinds, as counted in a [`Report`].
pub const FAULT_KINDS: [&str; 7] = [
    "node pause",
    "node crash",
    "conn reset",
    "partition",
    "client pause",
    "script flush",
    "slow link",
];

/// Two clients that believed they held the same resource at once (world time, ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The resource's index.
    pub resource: usize,
    /// (client, belief start, belief end) of the earlier holder.
    pub first: (usize, u64, u64),
    /// (client, belief start, belief end) of the later one, which started before `first` ended.
    pub second: (usize, u64, u64),
}

/// Two acquisitions whose fences are out of order (world time, ns): `second` began after
/// `first` had completed (or held the resource after `first` held it), with a fence that is not
/// greater.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceViolation {
    /// Which order was broken: "completed before began" (any resources) or "held after" (the
    /// same resource).
    pub order: &'static str,
    /// (client, start, end, fence) of the earlier acquisition (or holder).
    pub first: (usize, u64, u64, u64),
    /// (client, start, end, fence) of the later one.
    pub second: (usize, u64, u64, u64),
}

/// A caller that waited for a resource nobody held, with every fault healed or at most a minority
/// of the nodes faulty, for longer than [`WAIT_BOUND`](super::WAIT_BOUND) (world time, ns); or,
/// with ordered sets, a waiting writer or reader whose attempt stepped back for a set's mark
/// after it had waited `Config::set_precedence` (then `want` and `free` are in the wait's own
/// time: `want.0` is 0, `free` runs from the end of the precedence to that attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivenessViolation {
    /// The resource's index.
    pub resource: usize,
    /// The waiting client and its caller.
    pub client: usize,
    /// The caller within the client.
    pub caller: usize,
    /// When its want began, and when it was granted (or given up).
    pub want: (u64, u64),
    /// The stretch within it during which nobody held the resource and nothing changed.
    pub free: (u64, u64),
}

/// A client that connected to a node more often than the faults on that link explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectViolation {
    /// The client.
    pub client: usize,
    /// The node.
    pub node: usize,
    /// Connects it made.
    pub connects: u64,
    /// What the faults on the link allow ([`connects_allowed`](super::connects_allowed)).
    pub allowed: u64,
}

/// A holder told it held a resource until a validity that fewer than a quorum of nodes
/// backed: when it took the grant (or a renewal or an extend won), fewer than a quorum of
/// nodes held its token until at least that validity's end (world time, ns). The direct form
/// of Redlock's safety argument: an overlap needs a rival to win in the gap, this needs no
/// rival — a validity overstated by a millisecond shows here in any schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoverViolation {
    /// The resource's index.
    pub resource: usize,
    pub client: usize,
    /// When the holder was told, and until when.
    pub told: u64,
    pub valid: u64,
    /// The nodes whose keys held the token until then (a crashed node's counted until they
    /// would have expired), and the quorum.
    pub covering: usize,
    pub quorum: usize,
}

/// A waiting acquire whose outcome came later than [`DEADLINE_SLACK`](super::DEADLINE_SLACK) after
/// its deadline (world time, ns): a wait that its deadline did not end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateWait {
    /// The client.
    pub client: usize,
    /// When it was submitted.
    pub start: u64,
    /// Its deadline.
    pub deadline: u64,
    /// When its outcome came.
    pub end: u64,
}

/// Contention with one of five nodes frozen that fell below
/// [`PROGRESS_FLOOR`](super::PROGRESS_FLOOR) of the same schedule's grants per second with every
/// node up (`Break::WaitForSilent`'s runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressViolation {
    /// Acquires granted, and the simulated time they took, with the node frozen.
    pub frozen: (u64, Duration),
    /// The same with every node up.
    pub healthy: (u64, Duration),
}

/// What one schedule did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Lock operations started (acquire attempts, extends, releases).
    pub ops: u64,
    /// Acquires that succeeded.
    pub acquired: u64,
    /// Simulated time the run covered.
    pub sim_time: Duration,
    /// Faults injected, by kind (see [`FAULT_KINDS`]).
    pub faults: [u64; 7],
    /// Events the world processed.
    pub events: u64,
    /// The first overlap found, if any.
    pub violation: Option<Violation>,
    /// The first validity not backed by a quorum of nodes' keys, if any.
    pub cover: Option<CoverViolation>,
    /// (Fenced runs) the first pair of fences out of order, if any.
    pub fence_violation: Option<FenceViolation>,
    /// (Fenced runs) acquisitions that got a fence.
    pub fenced: u64,
    /// The run hit its event or time bound before every client finished.
    pub stalled: bool,
    /// Wants (a caller wanting a resource until it gets it) that began, and those given up
    /// when the run's operations ran out.
    pub wants: u64,
    /// Wants given up (the run's operations ran out first).
    pub abandoned: u64,
    /// The longest stretch a caller waited while nobody held its resource and nothing changed
    /// (see [`WAIT_BOUND`](super::WAIT_BOUND)).
    pub longest_wait: Duration,
    /// The first wait longer than [`WAIT_BOUND`](super::WAIT_BOUND), if any.
    pub liveness: Option<LivenessViolation>,
    /// The most connects of one client to one node, and what its faults allowed.
    pub most_connects: (u64, u64),
    /// The first (client, node) with more connects than its faults allow, if any.
    pub connect_violation: Option<ConnectViolation>,
    /// (`Break::FenceMajorityBlank`) no fenced acquire was granted after the nodes were back
    /// and out of their quarantine (the run went on past it).
    pub stuck_blank: bool,
    /// (`Break::FenceMajorityBlank`) fenced acquires granted after the nodes were back.
    pub fenced_after_heal: u64,
    /// (`Break::FenceMajorityBlank`'s control) a repair reported a quorum repaired.
    pub repaired: bool,
    /// The most a waiting acquire's outcome came after its deadline (a pause of its client
    /// after the deadline excepted).
    pub longest_overrun: Duration,
    /// The first waiting acquire whose outcome came more than
    /// [`DEADLINE_SLACK`](super::DEADLINE_SLACK) after its deadline, if any.
    pub late: Option<LateWait>,
    /// (`Break::WaitForSilent`) the grants per second fell below
    /// [`PROGRESS_FLOOR`](super::PROGRESS_FLOOR) of the same schedule's with every node up.
    pub progress: Option<ProgressViolation>,
    /// (`Break::contention`'s runs) grants per second with the node frozen ÷ with every node
    /// up, the measure the progress check compares with [`PROGRESS_FLOOR`](super::PROGRESS_FLOOR).
    pub progress_ratio: Option<f64>,
    /// World time of the first grant, if any.
    pub first_grant: Option<Duration>,
    /// Kept locks' renewals that won, and lost renewals tried again after a backoff (the
    /// engines' `KeepStats`): that the schedules take these paths.
    pub renewals: (u64, u64),
    /// (`Setup::cancel`) async waits whose future was dropped before their outcome came.
    pub dropped: u64,
}
