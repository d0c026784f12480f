//! What a run is asked to do — the [`Setup`], and the assumption it breaks ([`Break`]) — and
//! the settings every run shares: the nodes, the TTL, the clients' timings.

use std::ops::Range;
use std::time::Duration;

use crate::model::mutation::Mutation;

/// Which assumption of the README's Reliability section a run breaks (none: the run must
/// find no violation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// Every assumption holds.
    Nothing,
    /// Restart quarantine is off while nodes crash and restart empty.
    Quarantine,
    /// Clock rates differ by more than the drift factor allows (±5 % against a factor of 1 %).
    ClockDrift,
    /// (Validity) the drift allowance left out of the validity (a drift factor of 0: only the 2 ms
    /// floor is taken off), clocks within ±0.49 % as usual: a node whose clock runs faster than the
    /// holder's expires the key up to ~5 ms before the validity ends. The cover check
    /// ([`CoverViolation`](super::CoverViolation)) finds it in most schedules; two holders need a
    /// rival to win in those milliseconds, and are seldom seen.
    NoDriftAllowance,
    /// Clients pause longer than their validity and go on working as holders afterwards.
    WorkPastValidity,
    /// One node answers every `SET NX` with `OK`.
    LyingNode,
    /// A majority of nodes is down for most of the run (liveness: runs stall, never violate).
    MajorityDown,
    /// (Fencing) a wrong construction: per-node increments, the maximum of the winners', no
    /// write-back.
    FenceNoWriteBack,
    /// (Fencing) a wrong construction: blank counters (restarted empty) read as seeded, as
    /// with "the quarantine alone".
    FenceBlankAsZero,
    /// (Liveness) a defect brought back: the ledger's releases all sent at once on a fresh
    /// connection, which fails it as overloaded, again and again. Runs with a small
    /// `max_pending` and nodes that pause and crash while callers release.
    LedgerUnpaced,
    /// (Liveness) a defect brought back: a connection with `max_pending` requests outstanding
    /// is failed, every request on it with it, although the node is fine and merely has several
    /// callers. Runs with a small `max_pending`.
    FailWhenFull,
    /// (Sets) a wrong all-or-none acquire: every node runs a set's acquire as a `SET NX` of
    /// each member on its own and answers as its first member did (implies `sets`).
    SetNotAllOrNone,
    /// (Read-write) a wrong shared acquire: every node adds a reader without looking for a
    /// writer, overwriting the writer's key (implies `shared`).
    ReaderIgnoresWriter,
    /// (Semaphore) the wrong construction of a semaphore of [`COUNTER_PERMITS`] permits: a set
    /// of holders per node, admitted while it has fewer than P, won on a majority of nodes.
    /// Callers take only such permits; more than P holders at once is the violation. (The
    /// crate's semaphore is a plain lock per permit, which the plain runs check.)
    CounterSemaphore,
    /// (Liveness) a defect brought back: acquires wait for a node that let a node timeout pass
    /// in silence. One of the five nodes is frozen for the whole run (no other fault) and every
    /// caller wants the one resource; the progress check compares the grants per second with
    /// the same schedule's with every node up.
    WaitForSilent,
    /// (Liveness) a defect brought back: a waiting acquire whose attempt lost at the head of
    /// its queue does not put its deadline back into the queue's earliest, so the wait ends at
    /// its next attempt (after a split vote's pause or the poll) instead of at its deadline.
    /// Caught by the deadline check ([`DEADLINE_SLACK`](super::DEADLINE_SLACK)).
    DeadlineNotRearmed,
    /// (Liveness) release notices' counts ignored: every client woken by one release attempts
    /// at once and they split its votes. The same runs as [`Break::WaitForSilent`]'s (one node
    /// frozen, eight clients contending, the progress check), always with notices. Not caught
    /// while a lost round's cleanup is quiet (notices from it would feed the herd): none of
    /// 4,000 seeds below the floor, 0.58 of the healthy rate at worst in 300.
    NoticeHerd,
    /// (Fencing, liveness) a majority of the nodes restarts at once with its fence counters
    /// lost (fencing's assumption broken; fenced runs). No fenced acquire is granted again —
    /// blank counters on a majority, nobody to seed them — which the heal check catches; with
    /// `--control` a simulated operator runs the repair (`repair_fences` with a floor above
    /// every fence handed out) once the nodes are back, and locks resume with their fences
    /// still in order.
    FenceMajorityBlank,
    /// (Quarantine) a defect brought back: a node's uptime read as it stands, although Redis's
    /// reads up to a second high (the simulated nodes count it as Redis does). A rolling
    /// restart of three to five nodes, and every client but the first starts within a TTL after
    /// the last is back: its first contact with those nodes comes while they are younger than
    /// the quarantine's window, and one whose uptime already says 1 counts at once, though it
    /// forgot the keys of locks still held.
    UptimeAtItsWord,
    /// (Quarantine) a defect brought back: the restart tracking learns which process a node is
    /// from counted yeses only, not from refusals. Nodes crash and come back as *old* processes
    /// (uptime an hour: a failover to another server, an address that moved) without the keys;
    /// callers contend for one resource, so some clients hear only refusals from a node before
    /// it is replaced, take the new process by its uptime and count it at once.
    RunIdOnYesOnly,
    /// (Eviction) servers that evict keys under memory pressure counted as any other
    /// ([`EvictingServers::CountUnsafely`](crate::EvictingServers::CountUnsafely)): three of
    /// the five nodes say `maxmemory-policy volatile-ttl` and drop the key closest to expiring
    /// now and then — a held lock's. With `--control` two of them do, and the client refuses
    /// their yeses (the default): a quorum of three comes from the others.
    EvictionCounted,
    /// (Liveness) a defect brought back: silent connections that a lost round needed are not
    /// hurried, so a half-open connection is reset only by `reply_timeout`. Now and then the
    /// flows to a majority of the nodes are dropped (every client's connections to them go half
    /// open at once; new connections work), with the default `reply_timeout` (5 s, longer than
    /// a `lock`'s wait): the liveness check ([`WAIT_BOUND`](super::WAIT_BOUND)) catches the
    /// callers left waiting on dead connections while a quorum was reachable.
    HalfOpen,
    /// (Liveness) a defect brought back: a set that waits tries all its members at once every
    /// time (`Mutation::SetsAllAtOnce`), so it waits for a moment when every member is free
    /// together, which callers of each member alone need never leave. Sets beside plain locks
    /// and readers of their members; the liveness check's starvation clause (a set is owed
    /// the member it waits for: `Record::liveness`) catches it.
    SetsAllAtOnce,
    /// (Liveness) a defect brought back: with ordered sets, a waiting writer or reader steps
    /// back for a set's mark for its whole wait (`Mutation::SetMarksUnbounded`), not only during
    /// `Config::set_precedence`, so a steady stream of sets keeps the writers and readers of a
    /// set's first member out. The runs of [`Break::SetsAllAtOnce`]; the precedence clause of
    /// the liveness check (`Record::deferences`) catches it.
    SetMarksUnbounded,
}

/// The permits of `Break::CounterSemaphore`'s semaphore: with 5 nodes and majorities of 3,
/// P + 1 = 3 holders fit on (P + 1) · 3 = 9 ≤ P · 5 = 10 slots.
pub const COUNTER_PERMITS: usize = 2;

impl Break {
    /// The defect this break brings back (`model/mutation.rs`).
    pub(super) fn mutation(self) -> Mutation {
        match self {
            Break::FenceNoWriteBack => Mutation::FenceNoWriteBack,
            Break::FenceBlankAsZero => Mutation::FenceBlankAsZero,
            Break::LedgerUnpaced => Mutation::LedgerUnpaced,
            Break::FailWhenFull => Mutation::FailWhenFull,
            Break::WaitForSilent => Mutation::WaitForSilent,
            Break::DeadlineNotRearmed => Mutation::DeadlineNotRearmed,
            Break::NoticeHerd => Mutation::NoticeHerd,
            Break::UptimeAtItsWord => Mutation::UptimeAtItsWord,
            Break::RunIdOnYesOnly => Mutation::RunIdOnYesOnly,
            Break::HalfOpen => Mutation::NoHurry,
            Break::SetsAllAtOnce => Mutation::SetsAllAtOnce,
            Break::SetMarksUnbounded => Mutation::SetMarksUnbounded,
            _ => Mutation::None,
        }
    }

    /// Its runs are the progress check's: one node frozen, contention for one resource.
    pub fn contention(self) -> bool {
        matches!(self, Break::WaitForSilent | Break::NoticeHerd)
    }

    /// Its runs are the sets' starvation runs: ordered sets beside plain locks and readers of
    /// their members, eight clients contending.
    pub fn of_sets(self) -> bool {
        matches!(self, Break::SetsAllAtOnce | Break::SetMarksUnbounded)
    }

    /// Its runs are fenced: a wrong fencing construction, or the fence counters lost.
    pub(super) fn needs_fencing(self) -> bool {
        matches!(
            self,
            Break::FenceNoWriteBack | Break::FenceBlankAsZero | Break::FenceMajorityBlank
        )
    }
}

/// Settings of a run.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// What assumption to break.
    pub breaks: Break,
    /// Lock operations after which clients stop starting new acquires.
    pub ops: u64,
    /// Inject random faults.
    pub faults: bool,
    /// Run the fault plan of `breaks` but keep the assumption itself (quarantine on, clocks
    /// within the bound, validity respected, nodes honest; for the defects brought back, the
    /// code as it is; for `FenceMajorityBlank`, whose majority still restarts blank, the
    /// operator's repair): the control run, which must find no violation.
    pub control: bool,
    /// Fenced acquires (the fence breaks and `FenceMajorityBlank` imply it).
    pub fencing: bool,
    /// Some callers lock sets of the resources all or none (`ResourceSet`), beside plain
    /// locks of the members; each set holder counts as a holder of every member.
    pub sets: bool,
    /// Some callers take shared (read) locks of the resources beside the ordinary (write)
    /// locks; readers may overlap each other, never a writer.
    pub shared: bool,
    /// (`Break::WaitForSilent`'s family) one client with [`CROWD`] callers sharing its engine,
    /// instead of eight clients: 32 threads on one `Redlock`, one resource, a node frozen.
    pub crowd: bool,
    /// (`Break::contention`'s runs) the servers are younger than the restart quarantine's
    /// window when the run begins (uptime 0), so every node is quarantined for a window from
    /// each client's first contact. A run begun on servers younger than the window waits for
    /// its end: on servers 22 s old, every caller waits ~8 s for the default 30 s window's end.
    pub young: bool,
    /// Half the waiting acquires are an async caller's (their outcome in a slot, as
    /// `AsyncRedlock`'s futures take it), and each of those drops its future at a random
    /// instant before its deadline unless the outcome came first: a lock won for a caller
    /// that is gone must be released, and the waiters behind it served.
    pub cancel: bool,
    /// The clients' locks carry an owner (`Config::owner`): every lock key's value is
    /// `<token> sim-owner`, which releases and extends must still recognise by the token alone.
    pub owner: bool,
    /// Sets that wait take their members one at a time (`Config::ordered_sets`); always in
    /// `Break::SetsAllAtOnce`'s runs, whose broken side takes that back.
    pub ordered_sets: bool,
    /// The clients' plain locks and sets are fair (`Config::fair`): first come, first served
    /// through each node's queues. Not with `fencing` (a fair lock is not fenced) nor with
    /// ordered sets (the other way to give sets their members): those win.
    pub fair: bool,
}

impl Setup {
    /// This run breaks `b`'s assumption itself (it is `b`'s run, not its control).
    pub(super) fn broken(self, b: Break) -> bool {
        self.breaks == b && !self.control
    }
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            breaks: Break::Nothing,
            ops: 100,
            faults: true,
            control: false,
            fencing: false,
            sets: false,
            shared: false,
            crowd: false,
            young: false,
            cancel: false,
            owner: false,
            ordered_sets: false,
            fair: false,
        }
    }
}

pub(super) const NODES: usize = 5;

/// The clients' TTL (and so their restart quarantine's window).
pub const TTL: Duration = Duration::from_millis(500);

/// The clients' settings are ten times faster than the defaults where the simulated network's
/// delays allow, so that a run covers many retries, reconnects and timeouts: retries every
/// 20 ms plus up to 100 ms of jitter…
pub(super) const RETRY_DELAY: Duration = Duration::from_millis(20);
pub(super) const RETRY_JITTER: Duration = Duration::from_millis(100);
/// …connects that fail within 200 ms, reconnects after 10 ms up to 200 ms…
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(10);
pub(super) const BACKOFF_MAX: Duration = Duration::from_millis(200);
/// …and a node that hangs for 2 s reset.
pub(super) const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// The acquires' node timeout: the default share of the TTL (1/20).
pub(super) const NODE_TIMEOUT: u64 = TTL.as_nanos() as u64 / 20;

/// The most clients a schedule has (the progress check's eight; others three to five).
pub(super) const MOST_CLIENTS: u64 = 8;
/// Clients of a schedule other than the progress check's: three to five.
pub(super) const CLIENTS: Range<u64> = 3..6;

/// Callers per client, at most: threads or tasks sharing the client's engine.
pub(super) const MAX_CALLERS: u64 = 4;

/// Callers of the one client of a crowd (`Setup::crowd`).
pub const CROWD: u64 = 32;

/// `max_pending` in the runs that test the ledger's pacing: below the releases a few callers
/// leave outstanding while a node is away.
pub(super) const SMALL_MAX_PENDING: usize = 8;
