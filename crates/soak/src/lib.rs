//! The real-server liveness soak of redlock-mux: what its `examples/soak.rs` runs long
//! (`scripts/soak`) and its `tests/soak.rs` runs briefly, a crate of its own so that both use
//! it. Not published.
//!
//! | module | owns |
//! |---|---|
//! | this file | the run's settings ([`RunConfig`]), the client's settings ([`client_config`]), the bound on a wait while nobody holds ([`Bound`]), the clock, the seeded generator |
//! | `worker` | one worker process: one handle, blocking threads and tokio tasks locking through every API path — plain locks, shared locks, all-or-none sets, semaphore permits — recording holds and waits |
//! | `driver` | 5 local servers, the worker processes, seeded faults (never more than 2 of 5 servers faulty at once), collecting the results |
//! | `ideal` | the same workload under an ideal scheduler (no servers, no network: a grant the instant its policy allows), to tell the workload's limits from the lock's |
//! | `check` | overlaps (readers with readers allowed), permit holders at most P, fence order (readers skipped), the longest wait while nobody held (per kind), connects per node per process; the summary, the JSON line, the table |
//!
//! Every time is `CLOCK_MONOTONIC` in nanoseconds ([`mono_ns`]): one clock for every process of
//! the machine, so the holds of three processes can be compared.

pub mod check;
pub mod driver;
pub mod ideal;
pub mod worker;

use std::time::{Duration, Instant};

use redlock_mux::Config;

/// Servers started by the driver.
pub const NODES: usize = 5;
/// Servers faulty at once, at most: the rest (3 of 5) is a quorum.
pub const MAX_FAULTY: usize = 2;
/// The lock TTL of every worker: 1.5 s.
pub const TTL: Duration = Duration::from_millis(1_500);
/// Resources the workers lock, 4: `soak:0` … `soak:3`, each by plain locks,
/// shared locks and sets of 2 or 3 of them.
pub const RESOURCES: usize = 4;
/// The semaphore the workers also take permits of, on its own name.
pub const SEMAPHORE: &str = "soak:sem";
/// Its permits: at most 2 holders at once. In the records permit `i` (the key `soak:sem#<i>`)
/// is resource number `RESOURCES + i`.
pub const PERMITS: u32 = 2;
/// Resource numbers in the records: the resources, then the permits.
pub const KEYS: usize = RESOURCES + PERMITS as usize;

/// What one run does. The driver's and the workers' behaviour follow from it and the seed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Seeds the fault schedule and every task's choices (paths, resources, hold times).
    pub seed: u64,
    /// How long faults are injected and the workers lock (then the faults heal and the workers
    /// stop).
    pub duration: Duration,
    /// Worker processes.
    pub processes: usize,
    /// Callers per process: half blocking threads, half tokio tasks.
    pub tasks: usize,
    /// Print faults as they are injected.
    pub verbose: bool,
    /// Write the workers' records here (and keep them) instead of a temporary directory.
    pub keep: Option<std::path::PathBuf>,
}

impl RunConfig {
    /// The workload: 3 processes × 32 callers.
    pub fn new(seed: u64, duration: Duration) -> RunConfig {
        RunConfig {
            seed,
            duration,
            processes: 3,
            tasks: 32,
            verbose: false,
            keep: None,
        }
    }
}

/// The settings of every worker's handle: the library's defaults but for the TTL (1.5 s) and
/// fencing (on). The quarantine is the default one (`Quarantine::Ttl`: a window of one TTL).
pub fn client_config() -> Config {
    let mut config = Config::default();
    config.ttl = TTL;
    config.fencing = true;
    // `SOAK_ORDERED_SETS=1`: ordered sets in every worker (`Config::ordered_sets`).
    config.ordered_sets = std::env::var("SOAK_ORDERED_SETS").is_ok_and(|v| v == "1");
    // `SOAK_SET_PRECEDENCE_MS=N`: with ordered sets, `Config::set_precedence` (the default
    // otherwise).
    if let Some(ms) = std::env::var("SOAK_SET_PRECEDENCE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.set_precedence = std::time::Duration::from_millis(ms);
    }
    // `SOAK_FAIR=1`: fair locks, sets and readers in every worker (`Config::fair`), and so no fencing
    // (a fair lock is not fenced; the fence check is off) and no ordered sets (fair sets queue
    // for their members instead).
    if std::env::var("SOAK_FAIR").is_ok_and(|v| v == "1") {
        config.fair = true;
        config.fencing = false;
        config.ordered_sets = false;
    }
    config
}

/// The longest a loaded loopback round trip is taken to last, for the split pause's base
/// (`wait.rs`: a split vote's pause is uniform in `0..base × 2^k`, `base` the last round of
/// the answering nodes, `k` capped at 6). Round trips on this 2-core VM under the soak's load
/// are a few hundred µs to a few ms.
pub const LOADED_ROUND: Duration = Duration::from_millis(4);
/// The split pause's largest factor: `2^MAX_SPLIT_DOUBLINGS` (`wait.rs`, 6).
pub const SPLIT_FACTOR: u32 = 64;
/// What the machine may add: 5 servers, 3 workers of 20+ threads each and the driver share 2
/// cores (and other builds may run): a thread that should run may wait this long.
pub const SCHEDULING_SLACK: Duration = Duration::from_millis(250);
/// After a fault's effect ends (a resumed freeze, a finished `DEBUG SLEEP`, a `CLIENT KILL`,
/// a `SCRIPT FLUSH`), the node counts as faulty at least this long: it runs the commands that
/// queued up (late `SET`s and the releases behind them), the clients reconnect (one round
/// trip) and resubscribe.
pub const SETTLE: Duration = Duration::from_millis(250);

/// The bound on the longest wait while nobody held, derived from the client's settings
/// ([`client_config`]), with each term and why it is there.
///
/// **What is bounded.** For one resource, a *stretch* is a maximal interval during which at
/// least one caller (any process, any API path) was inside an acquire call (`lock`,
/// `try_lock`, `lock_until`, `guard`, `with_lock`'s acquire, their async twins, an async
/// acquire cancelled by its timeout) and no caller believed it held the resource (a hold: from
/// the acquire's return until the release is sent or the validity ends, whichever is first).
/// No wait is left out.
///
/// **Per kind of waiter**, "nobody held" is what rightly keeps that waiter out,
/// and the waits of each kind are a stretch's waits only for their own kind:
///
/// - a plain lock (a writer) of a resource: any hold of it — plain, a reader, a set with it;
/// - a shared lock (a reader): a writer's hold (plain, or a set with it) or a writer waiting
///   for it (a plain or set wait, and for a mark's life after it, `check::mark_life`: a
///   waiting writer's mark keeps new readers out, by design, so that writers are not
///   starved);
/// - an all-or-none set: any hold of any member;
/// - a semaphore's permit: every permit held at once.
///
/// The same bound is claimed for each: the terms below are about keys nobody holds, polls and
/// pauses, which every kind's waits have alike (a reader's keys are its sorted-set entries,
/// each with its own expiry; a set's, one string per member; a permit is a plain lock).
///
/// **Assumed.** At most 2 of the 5 servers are faulty at once, where the driver counts a node
/// faulty from the fault's start until every worker can use it again: [`SETTLE`] after the
/// fault's effect ended, every worker connected to it again (a client whose connection failed
/// during the fault reconnects at the end of its backoff, up to the 2 s ceiling later), after
/// a restart a quarantine window (one TTL) after the last worker's new connection, and its
/// fence counter seeded again (see `driver.rs`). So 3 nodes always take part in every
/// client's attempts, and they are a quorum. The reconnect backoff ceiling, the connect
/// timeout and the quarantine window do not appear below because they are spent while the
/// node still counts as faulty; the driver measures that time (*recovery*) and checks it
/// against its own bound, `driver::recovery_bound` (backoff ceiling + connect timeout +
/// settle + its polling: 3.3 s).
///
/// **The terms.** With 3 healthy nodes and nobody holding, a waiter is kept out only by keys
/// that nobody holds, and by its own pauses:
///
/// 1. *A key nobody holds* lives at most one TTL on a healthy node: the `SET` of an attempt
///    that lost (or was cancelled), run late by a node resuming from a freeze or a `DEBUG
///    SLEEP`, whose release could not follow on the same connection; or a release lost with
///    a killed connection and not yet replayed. (A holder whose validity ran out without a
///    release leaves its keys for the attempt's elapsed time plus the drift allowance, less
///    than a TTL.) Term: `ttl + drift` (`ttl × drift_factor + 2 ms`).
/// 2. *Noticing the expiry*: an expiry publishes no notice, so the first in line notices it at
///    its fallback poll, `retry_delay + retry_jitter` after its last attempt. Term: one poll
///    and one node timeout (the attempt may wait for a node that just fell silent).
/// 3. *One attempt that meets a fault beginning*: a node killed or frozen as the attempt goes
///    out can leave it without a quorum (a no-quorum outcome pauses one poll, `engine/wait.rs`) or
///    make it split. Term: one more poll and one more node timeout.
/// 4. *Split votes* between the processes: one split pause at its cap, `64 ×` a loaded
///    loopback round ([`LOADED_ROUND`]); before it, the attempt after a release notice that
///    other processes heard waits a random share of their crowd's span, a round per other
///    subscriber (`wait::crowd_pause`), at most `64 ×` a loaded round too.
/// 5. *The machine*: [`SCHEDULING_SLACK`].
///
/// Not in the bound: the handle's background thread also looks every second when it has no
/// deadline (`hub.rs`, `IDLE`), but waits are driven by the engine's timers; a stretch about a
/// second above the bound would point at a missed timer. The waiting mark outlives two polls
/// (at least 1 s) and is set again by every attempt, so it does not lapse while a caller waits.
#[derive(Debug, Clone)]
pub struct Bound {
    /// Each term: what it is, and its value.
    pub terms: Vec<(&'static str, Duration)>,
}

impl Bound {
    /// The bound for `config`.
    pub fn of(config: &Config) -> Bound {
        let ttl = config.ttl;
        let drift = ttl.mul_f64(config.drift_factor) + Duration::from_millis(2);
        let poll = config.retry_delay + config.retry_jitter;
        let node_timeout = config.node_timeout_for(ttl);
        Bound {
            terms: vec![
                ("a key nobody holds: ttl", ttl),
                ("drift allowance: ttl × drift_factor + 2 ms", drift),
                (
                    "fallback poll noticing the expiry: retry_delay + retry_jitter",
                    poll,
                ),
                ("that attempt's node timeout", node_timeout),
                ("an attempt meeting a fault: one more poll", poll),
                ("… and its node timeout", node_timeout),
                (
                    "one split pause at its cap: 64 × loaded round",
                    LOADED_ROUND * SPLIT_FACTOR,
                ),
                (
                    "a crowd's pause after a notice, at its cap: 64 × loaded round",
                    LOADED_ROUND * SPLIT_FACTOR,
                ),
                ("scheduling slack (2 cores, 9+ processes)", SCHEDULING_SLACK),
            ],
        }
    }

    /// The sum of the terms.
    pub fn total(&self) -> Duration {
        self.terms.iter().map(|(_, d)| *d).sum()
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: comparable across the processes of one machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An `Instant` as [`mono_ns`] (`Instant` is `CLOCK_MONOTONIC` on Linux; the two reads are
/// taken back to back, so the error is the time between them).
pub fn instant_ns(at: Instant) -> u64 {
    let (now, ns) = (Instant::now(), mono_ns());
    if at >= now {
        ns.saturating_add((at - now).as_nanos() as u64)
    } else {
        ns.saturating_sub((now - at).as_nanos() as u64)
    }
}

/// SplitMix64: a small seeded generator, the same on every platform and version.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, mixed with `stream` (a process, a task) so streams differ.
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut rng = Rng(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `low..high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low))
    }
}
