//! One worker process: one handle (`Redlock`, and the same engine seen as `AsyncRedlock`),
//! half of its callers blocking threads and half tokio tasks, each locking the soak's
//! resources through every API path at random until the driver closes the worker's stdin.
//! Each turn a caller picks a kind ([`pick`]): a plain lock of one resource, a shared (read)
//! lock of one, an all-or-none set of 2 or 3 of them (each through the same 18 paths), or a
//! permit of the semaphore `soak:sem` of 2 permits (through its own 10 paths).
//!
//! Every acquire call is a *wait* (start, end, outcome); every lock the caller got is a
//! *hold*: from the acquire's return until the caller sends the release, or until the
//! validity it was given ends if that comes first (for a kept lock: until the engine marked it
//! lost, `lost_at`, with the moment its holder noticed beside it). Times are `CLOCK_MONOTONIC` ([`mono_ns`]). At the end the worker writes them, its
//! handle's per-node counters and its shutdown figures to the file the driver named, one
//! record per line:
//!
//! ```text
//! h RESOURCE START END FENCE PATH TASK KIND MEMBERS NOTICED   a hold
//! w RESOURCE START END OUTCOME PATH TASK KIND MEMBERS   a wait
//! n NODE CONNECTS RECONNECTS DOWNS IDLE_CLOSES TIMEOUTS FAILURES NOSCRIPT QUARANTINED
//! l PATH LOSSES                               kept locks lost while held, per path
//! s CONFIRMED UNCONFIRMED                     the final shutdown
//! e PATH OUTCOME MESSAGE                      a few error messages, for the report
//! c NODE TIME                                 a connect (socket opened), when it was counted
//! r TIME REQUESTS… FAILURES… TIMEOUTS…        per node, the counters at that time
//! ```
//!
//! `RESOURCE` is 0–3 for `soak:0` … `soak:3`, `4 + i` for permit `i` (`soak:sem#<i>`);
//! `KIND` is 0 plain, 1 shared, 2 set, 3 permit ([`KINDS`]); `MEMBERS` has bit `i` for each
//! resource number the lock covers. A set's hold and wait are written once per member (so a
//! set's hold is a hold of each member); a semaphore's wait once, under permit 0, with both
//! permits in `MEMBERS`; a reader's `FENCE` is 0 (readers get none). Lines without `KIND
//! MEMBERS` (6 fields, as before the kinds were mixed) are read as plain locks.
//!
//! A hold's `PATH` has [`LOST`] added when the hold ended because a kept lock was lost (its
//! `END` is then when the holder's thread or task woke up to the loss).
//!
//! The connect times are read off the handle's counters every [`SAMPLE`] (they are atomics
//! with nothing to wait on), so each is known to within that.

use std::fmt::Write as _;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock_mux::{
    AsyncRedlock, AsyncSemaphore, Builder, Error, Lock, Redlock, ResourceSet, Semaphore, Shared,
    WithLockError,
};

use super::{PERMITS, RESOURCES, Rng, SEMAPHORE, TTL, client_config, instant_ns, mono_ns};

/// The environment variable that carries a worker's settings.
pub const ENV: &str = "REDLOCK_SOAK_WORKER";
/// What a worker prints once its handle is connected and its callers start.
pub const READY: &str = "soak-worker: ready";
/// What a worker prints once its results are written.
pub const DONE: &str = "soak-worker: done";
/// Error messages kept per task and outcome.
const MESSAGES_KEPT: usize = 2;
/// How long the final shutdown may wait for releases to be confirmed.
const SHUTDOWN: Duration = Duration::from_secs(5);
/// How often the connect counters are read.
pub const SAMPLE: Duration = Duration::from_millis(20);
/// How long connecting to every node first may take.
const CONNECT: Duration = Duration::from_secs(5);

/// The API paths, as recorded (`PATHS[path]`). Blocking first, then async; then the
/// semaphore's, blocking first ([`SEM_PATHS`]), then async ([`ASYNC_SEM_PATHS`]). The first 18
/// take a plain lock, a shared lock or a set alike (the hold's kind says which).
pub const PATHS: [&str; 28] = [
    "lock+unlock",
    "try_lock+unlock",
    "lock_until(short)+unlock",
    "guard+drop",
    "guard+extend+unlock",
    "lock+extend+unlock",
    "keep+release",
    "with_lock",
    "lock+unlock_nowait",
    "async lock+unlock",
    "async try_lock+unlock_nowait",
    "async lock_until(short)+unlock",
    "async guard+drop",
    "async guard+extend+unlock",
    "async lock+extend+unlock",
    "async keep+release",
    "async with_lock",
    "async timeout(lock)+unlock",
    "sem try_acquire+unlock",
    "sem acquire+unlock",
    "sem acquire_until(short)+extend+unlock",
    "sem guard+drop",
    "sem with_permit",
    "async sem try_acquire+unlock_nowait",
    "async sem acquire+unlock",
    "async sem timeout(acquire)+unlock",
    "async sem guard+drop",
    "async sem acquire+keep+release",
];
/// Added to a hold's path when a kept lock was lost while held.
pub const LOST: u8 = 128;
/// Blocking paths are `0..ASYNC_PATHS`, async ones `ASYNC_PATHS..SEM_PATHS`.
pub(crate) const ASYNC_PATHS: usize = 9;
/// The semaphore's blocking paths are `SEM_PATHS..ASYNC_SEM_PATHS`, its async ones
/// `ASYNC_SEM_PATHS..`.
pub const SEM_PATHS: usize = 18;
pub(crate) const ASYNC_SEM_PATHS: usize = 23;

/// The lock kinds, as recorded (`KINDS[kind]`).
pub const KINDS: [&str; 4] = ["plain", "shared", "set", "permit"];
/// A plain lock: exclusive (the writer of its resource).
pub const PLAIN: u8 = 0;
/// A shared (read) lock.
pub const SHARED: u8 = 1;
/// An all-or-none set of 2 or 3 resources.
pub const SET: u8 = 2;
/// A permit of the semaphore.
pub const PERMIT: u8 = 3;

/// How long an acquire call of each path may wait (`BUDGETS[budget_of(path)]`): the
/// client's whole `lock_wait` (4 s with the soak's settings: `lock`, `guard`, `keep`,
/// `with_lock`, `acquire`, …), a short deadline (`short_wait`: `lock_until`, `timeout`,
/// `acquire_until`), or none (`try_lock`, `try_acquire`). A call with no budget fails at once
/// on a held resource, whatever the other callers do: the share of waits held is compared
/// between kinds within a budget.
pub const BUDGETS: [&str; 3] = ["lock_wait", "short", "none"];

/// The index in [`BUDGETS`] of `path`'s acquire call.
pub fn budget_of(path: u8) -> usize {
    match path & !LOST {
        1 | 10 | 18 | 23 => 2,
        2 | 11 | 17 | 20 | 25 => 1,
        _ => 0,
    }
}

/// How a wait ended (`OUTCOMES[outcome]`).
pub const OUTCOMES: [&str; 7] = [
    "ok",
    "held",
    "no quorum",
    "no fence",
    "too slow",
    "cancelled",
    "other",
];
/// A wait that ended with the lock held.
pub const OK: u8 = 0;
const CANCELLED: u8 = 5;

/// A worker's settings, from the driver.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `redis://…` of each server.
    pub servers: Vec<String>,
    /// This worker's number.
    pub process: usize,
    /// The run's seed.
    pub seed: u64,
    /// Callers: half threads, half tasks.
    pub tasks: usize,
    /// Where to write the results.
    pub out: PathBuf,
}

impl WorkerConfig {
    /// As the value of [`ENV`].
    pub fn to_env(&self) -> String {
        serde_json::json!({
            "servers": self.servers,
            "process": self.process,
            "seed": self.seed,
            "tasks": self.tasks,
            "out": self.out,
        })
        .to_string()
    }

    /// From [`ENV`], if set.
    pub fn from_env() -> Option<WorkerConfig> {
        let text = std::env::var(ENV).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).expect("worker settings: JSON");
        let num = |k: &str| {
            v[k].as_u64()
                .unwrap_or_else(|| panic!("worker settings: {k}"))
        };
        Some(WorkerConfig {
            servers: v["servers"]
                .as_array()
                .expect("worker settings: servers")
                .iter()
                .map(|s| s.as_str().expect("a server").to_owned())
                .collect(),
            process: num("process") as usize,
            seed: num("seed"),
            tasks: num("tasks") as usize,
            out: PathBuf::from(v["out"].as_str().expect("worker settings: out")),
        })
    }
}

/// A hold: a lock its caller believed it had. A set's hold is recorded once per member (each
/// with the set's `members`), so that it counts as a hold of each.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    pub resource: u8,
    pub start: u64,
    pub end: u64,
    pub fence: u64,
    pub path: u8,
    pub task: u16,
    /// [`PLAIN`], [`SHARED`], [`SET`] or [`PERMIT`].
    pub kind: u8,
    /// Bit `i` for each resource number `i` the lock is of: the set's members, else the one
    /// resource.
    pub members: u8,
    /// A kept lock lost (path with [`LOST`]): when its holder noticed the loss (woke up to it,
    /// or its validity ran out), which may be after `end` (the engine's `lost_at`) by the
    /// holder's scheduling delay; else `end`.
    pub noticed: u64,
}

/// A wait: one acquire call. A set's wait is recorded once per member, a semaphore's once,
/// under its first permit's number, with every permit in `members`.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    pub resource: u8,
    pub start: u64,
    pub end: u64,
    pub outcome: u8,
    pub path: u8,
    pub task: u16,
    /// As [`Hold::kind`].
    pub kind: u8,
    /// As [`Hold::members`]; a semaphore's wait: every permit.
    pub members: u8,
}

/// What a caller locks: a kind and the resource numbers (`members`, a bit each) it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub kind: u8,
    pub members: u8,
}

impl Target {
    /// The plain (exclusive, writer) lock of resource `r`.
    pub fn plain(r: u8) -> Target {
        Target {
            kind: PLAIN,
            members: 1 << r,
        }
    }

    /// A shared (read) lock of resource `r`.
    pub fn shared(r: u8) -> Target {
        Target {
            kind: SHARED,
            members: 1 << r,
        }
    }

    /// The all-or-none set of the resources in `members`.
    pub fn set(members: u8) -> Target {
        Target { kind: SET, members }
    }

    /// The semaphore as a whole (what its acquires wait for): every permit.
    pub fn semaphore() -> Target {
        Target {
            kind: PERMIT,
            members: (((1u16 << PERMITS) - 1) << RESOURCES) as u8,
        }
    }

    /// Permit `i` of the semaphore (resource number `RESOURCES + i`).
    pub fn permit(i: u8) -> Target {
        Target {
            kind: PERMIT,
            members: 1 << (RESOURCES as u8 + i),
        }
    }

    /// The resource numbers it covers, in order.
    pub fn resources(self) -> impl Iterator<Item = u8> {
        (0..8).filter(move |i| self.members & (1 << i) != 0)
    }

    /// The resource number a one-line record goes under: the lowest.
    pub fn first(self) -> u8 {
        self.members.trailing_zeros() as u8
    }

    /// What is passed to the library as the resource (not for the semaphore).
    fn key(self) -> Vec<u8> {
        match self.kind {
            PLAIN => resource_name(self.first()).into_bytes(),
            SHARED => Shared::new(resource_name(self.first()))
                .expect("a shared lock's name")
                .as_ref()
                .to_vec(),
            SET => ResourceSet::new(self.resources().map(resource_name))
                .expect("a set's names")
                .as_ref()
                .to_vec(),
            _ => unreachable!("a semaphore is not locked by name"),
        }
    }
}

/// One node's counters, as the worker's handle counted them (`NodeStats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeFigures {
    pub connects: u64,
    pub reconnects: u64,
    pub downs: u64,
    pub idle_closes: u64,
    pub timeouts: u64,
    pub failures: u64,
    pub noscript: u64,
    pub quarantined: u64,
}

/// What one worker recorded.
#[derive(Debug, Default)]
pub struct WorkerResult {
    pub holds: Vec<Hold>,
    pub waits: Vec<Wait>,
    pub nodes: Vec<NodeFigures>,
    /// Kept locks lost while held, per path.
    pub losses: Vec<(u8, u64)>,
    /// The final shutdown: releases confirmed, unconfirmed.
    pub shutdown: (u64, u64),
    /// (path, outcome, message) samples.
    pub messages: Vec<(u8, u8, String)>,
    /// (node, when) of every connect, to within [`SAMPLE`].
    pub connects: Vec<(u8, u64)>,
    /// (when, per node: requests, failures, timeouts so far), every [`SAMPLE`].
    pub counters: Vec<(u64, Vec<[u64; 3]>)>,
}

/// One caller's records.
struct Rec {
    task: u16,
    holds: Vec<Hold>,
    waits: Vec<Wait>,
    losses: [u64; PATHS.len()],
    messages: Vec<(u8, u8, String)>,
}

impl Rec {
    fn new(task: u16) -> Rec {
        Rec {
            task,
            holds: Vec::new(),
            waits: Vec::new(),
            losses: [0; PATHS.len()],
            messages: Vec::new(),
        }
    }

    /// A wait from `start` to now that ended with `outcome` (`Err`: how it failed).
    fn wait(&mut self, t: Target, start: u64, end: u64, path: u8, outcome: Result<(), &Error>) {
        let outcome = match outcome {
            Ok(()) => OK,
            Err(e) => {
                let code = match e {
                    Error::Held(_) => 1,
                    Error::NoQuorum(_) => 2,
                    Error::Fence(_) => 3,
                    Error::TooSlow(_) => 4,
                    _ => 6,
                };
                let kept = self
                    .messages
                    .iter()
                    .filter(|(p, o, _)| *p == path && *o == code)
                    .count();
                if code != 1 && kept < MESSAGES_KEPT {
                    self.messages.push((path, code, e.to_string()));
                }
                code
            }
        };
        self.push_wait(t, start, end, outcome, path);
    }

    fn cancelled(&mut self, t: Target, start: u64, end: u64, path: u8) {
        self.push_wait(t, start, end, CANCELLED, path);
    }

    /// A set's wait once per member; any other once.
    fn push_wait(&mut self, t: Target, start: u64, end: u64, outcome: u8, path: u8) {
        let lines = if t.kind == SET {
            t.members
        } else {
            1 << t.first()
        };
        for r in (0..8).filter(|i| lines & (1 << i) != 0) {
            self.waits.push(Wait {
                resource: r,
                start,
                end,
                outcome,
                path,
                task: self.task,
                kind: t.kind,
                members: t.members,
            });
        }
    }

    /// A kept lock's hold; `lost`: it ended because the lock was lost.
    /// A kept lock's hold; `end` is `(ended, noticed)` ([`kept_end`], [`Hold::noticed`]).
    fn kept_hold(
        &mut self,
        t: Target,
        start: u64,
        end: (u64, u64),
        fence: Option<u64>,
        path: u8,
        lost: bool,
    ) {
        // Lost after the holder stopped waiting for it still ends at `lost_at`, before it noticed.
        let lost = lost || end.0 < end.1;
        if lost {
            self.losses[path as usize] += 1;
        }
        let first = self.holds.len();
        self.hold(
            t,
            start,
            end.0,
            fence,
            if lost { path | LOST } else { path },
        );
        for h in &mut self.holds[first..] {
            h.noticed = end.1.max(h.end);
        }
    }

    /// A set's hold once per member; any other once.
    fn hold(&mut self, t: Target, start: u64, end: u64, fence: Option<u64>, path: u8) {
        for r in t.resources() {
            self.holds.push(Hold {
                resource: r,
                start,
                end: end.max(start),
                // Fencing is on: an exclusive lock without a fence is a violation (0 is below
                // every fence). Readers get none.
                fence: fence.unwrap_or(0),
                path,
                task: self.task,
                kind: t.kind,
                members: t.members,
                noticed: end.max(start),
            });
        }
    }
}

/// The name of resource `r`: `soak:<r>`, and for the permits (`RESOURCES..`) their keys,
/// `soak:sem#<i>`.
pub fn resource_name(r: u8) -> String {
    match (r as usize).checked_sub(RESOURCES) {
        Some(i) => format!("{SEMAPHORE}#{i}"),
        None => format!("soak:{r}"),
    }
}

/// The permit a lock of the semaphore is (from its key, `soak:sem#<i>`).
fn permit_of(lock: &Lock) -> Target {
    let key = lock.resource().to_string();
    let i = key
        .strip_prefix(&format!("{SEMAPHORE}#"))
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("not a permit of {SEMAPHORE}: {key}"));
    Target::permit(i)
}

/// What a caller locks next: a plain lock of one of the resources (45 %), a shared lock of one
/// (25 %), a set of 2 or 3 of them (15 %), or a permit of the semaphore (15 %).
pub(crate) fn pick(rng: &mut Rng) -> Target {
    let one = |rng: &mut Rng| rng.below(RESOURCES as u64) as u8;
    match rng.below(100) {
        0..45 => Target::plain(one(rng)),
        45..70 => Target::shared(one(rng)),
        70..85 => loop {
            let members = rng.below(1 << RESOURCES) as u8;
            if (2..=3).contains(&members.count_ones()) {
                break Target::set(members);
            }
        },
        _ => Target::semaphore(),
    }
}

/// How long a plain hold lasts: mostly short, sometimes a good part of the validity.
pub(crate) fn hold_time(rng: &mut Rng) -> Duration {
    match rng.below(100) {
        0..60 => rng.millis(0, 10),
        60..92 => rng.millis(10, 100),
        _ => rng.millis(100, 600),
    }
}

/// How long a kept lock is held: mostly short, sometimes up to twice the TTL, so that it is
/// renewed (at a third of the TTL left) once or twice.
pub(crate) fn kept_time(rng: &mut Rng) -> Duration {
    if rng.below(100) < 70 {
        rng.millis(20, 300)
    } else {
        rng.millis(TTL.as_millis() as u64 * 2 / 3, 2 * TTL.as_millis() as u64)
    }
}

/// A short deadline for `lock_until` and the async timeouts.
pub(crate) fn short_wait(rng: &mut Rng) -> Duration {
    rng.millis(20, 800)
}

/// The pause between two operations of a caller.
pub(crate) fn think_time(rng: &mut Rng) -> Duration {
    rng.millis(0, 20)
}

/// When the holder stops believing: now, or the end of the validity if that came first.
fn believed_end(valid_until: Instant) -> u64 {
    mono_ns().min(instant_ns(valid_until))
}

/// When the holder of a kept lock stops believing: as [`believed_end`], or when the engine gave
/// the lock up (`lost_at`) if that came first — the holder learns of a loss only when it is next
/// scheduled, and a rival may take the resource from the moment the engine released it. Also
/// when the holder noticed ([`believed_end`] alone: the end as recorded before `lost_at`).
fn kept_end(valid_until: Instant, lost_at: Option<Instant>) -> (u64, u64) {
    let noticed = believed_end(valid_until);
    (
        lost_at.map_or(noticed, |t| noticed.min(instant_ns(t))),
        noticed,
    )
}

/// After an extend that returned at `returned`: if the lock's validity (cut by a failed
/// extend) is already over, the holder believed it until the extend returned or the validity
/// it had before, whichever was first: `Some(end)`. `None`: still held.
fn extend_ended(before: Instant, after: Instant, returned: u64) -> Option<u64> {
    (after <= Instant::now()).then(|| returned.min(instant_ns(before)))
}

/// The environment variable that turns the workers' clock check on, with its tolerance in
/// milliseconds (`scripts/clocks --clock-check MS`); inherited from the driver.
pub const CLOCK_CHECK_ENV: &str = "SOAK_CLOCK_CHECK_MS";

/// The clock check's tolerance the workers run with ([`CLOCK_CHECK_ENV`]), if any.
pub fn clock_check() -> Option<Duration> {
    let ms: u64 = std::env::var(CLOCK_CHECK_ENV).ok()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms))
}

/// Runs the worker: connects, tells the driver it is ready, locks until stdin closes, then
/// writes the results.
///
/// # Errors
///
/// The handle could not be built, or the results not written.
pub fn run(cfg: &WorkerConfig) -> Result<(), String> {
    let mut builder = Builder::new(&cfg.servers)
        .config(client_config())
        .client_name(format!("soak-worker-{}", cfg.process));
    if let Some(tolerance) = clock_check() {
        builder = builder.clock_check(tolerance);
    }
    let redlock = builder
        .build()
        .map_err(|e| format!("worker {}: {e}", cfg.process))?;
    let connected = redlock.connect(CONNECT).unwrap_or(0);
    if connected < cfg.servers.len() {
        return Err(format!(
            "worker {}: connected to {connected} of {} servers",
            cfg.process,
            cfg.servers.len()
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // The driver closes our stdin to stop us (or dies, which closes it too).
            let mut sink = Vec::new();
            let _ = std::io::stdin().lock().read_to_end(&mut sink);
            stop.store(true, Ordering::SeqCst);
        });
    }
    let blocking = cfg.tasks.div_ceil(2);
    let tasks = cfg.tasks - blocking;
    let stream = |task: usize| ((cfg.process as u64) << 32) | task as u64;
    let threads: Vec<_> = (0..blocking)
        .map(|t| {
            let (redlock, stop) = (redlock.clone(), stop.clone());
            let rng = Rng::new(cfg.seed, stream(t));
            std::thread::Builder::new()
                .name(format!("soak-{t}"))
                .spawn(move || blocking_caller(&redlock, t as u16, rng, &stop))
                .map_err(|e| format!("spawn a caller thread: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let handles: Vec<_> = (blocking..blocking + tasks)
        .map(|t| {
            let (redlock, stop) = (AsyncRedlock::from(redlock.clone()), stop.clone());
            let rng = Rng::new(cfg.seed, stream(t));
            runtime.spawn(async move { async_caller(&redlock, t as u16, rng, &stop).await })
        })
        .collect();
    let sampler = {
        let (redlock, stop) = (redlock.clone(), stop.clone());
        // The first connects are counted before the driver hears we are ready: they are no
        // fault's.
        let mut seen = vec![0; redlock.nodes().len()];
        let mut connects = Vec::new();
        let mut counters = Vec::new();
        sample(&redlock, &mut seen, &mut connects, &mut counters);
        std::thread::spawn(move || {
            loop {
                let done = stop.load(Ordering::SeqCst);
                sample(&redlock, &mut seen, &mut connects, &mut counters);
                if done {
                    return (connects, seen, counters);
                }
                std::thread::sleep(SAMPLE);
            }
        })
    };
    say(READY);
    let mut recs = Vec::with_capacity(cfg.tasks);
    for h in handles {
        recs.push(
            runtime
                .block_on(h)
                .map_err(|e| format!("a task failed: {e}"))?,
        );
    }
    for t in threads {
        recs.push(
            t.join()
                .map_err(|_| "a caller thread panicked".to_owned())?,
        );
    }
    drop(runtime);
    let (mut connects, mut seen, mut counters) = sampler
        .join()
        .map_err(|_| "the sampler panicked".to_owned())?;
    let shutdown = redlock.shutdown(SHUTDOWN);
    sample(&redlock, &mut seen, &mut connects, &mut counters);
    let stats = redlock.stats();
    let mut out = String::new();
    for (node, at) in &connects {
        let _ = writeln!(out, "c {node} {at}");
    }
    for (at, nodes) in &counters {
        let _ = write!(out, "r {at}");
        for i in 0..3 {
            for n in nodes {
                let _ = write!(out, " {}", n[i]);
            }
        }
        out.push('\n');
    }
    for rec in &recs {
        for h in &rec.holds {
            let _ = writeln!(
                out,
                "h {} {} {} {} {} {} {} {} {}",
                h.resource, h.start, h.end, h.fence, h.path, h.task, h.kind, h.members, h.noticed
            );
        }
        for w in &rec.waits {
            let _ = writeln!(
                out,
                "w {} {} {} {} {} {} {} {}",
                w.resource, w.start, w.end, w.outcome, w.path, w.task, w.kind, w.members
            );
        }
        for (path, msg_outcome, message) in &rec.messages {
            let one_line = message.replace('\n', " ");
            let _ = writeln!(out, "e {path} {msg_outcome} {one_line}");
        }
    }
    for path in 0..PATHS.len() {
        let losses: u64 = recs.iter().map(|r| r.losses[path]).sum();
        let _ = writeln!(out, "l {path} {losses}");
    }
    for (i, n) in stats.nodes.iter().enumerate() {
        let _ = writeln!(
            out,
            "n {i} {} {} {} {} {} {} {} {}",
            n.connects,
            n.reconnects,
            n.downs,
            n.idle_closes,
            n.timeouts,
            n.failures,
            n.noscript,
            n.quarantined
        );
    }
    let _ = writeln!(out, "s {} {}", shutdown.confirmed, shutdown.unconfirmed);
    let mut file = BufWriter::new(
        std::fs::File::create(&cfg.out).map_err(|e| format!("{}: {e}", cfg.out.display()))?,
    );
    file.write_all(out.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    say(DONE);
    Ok(())
}

/// Notes the connects counted since `seen`, with the time now, and the request counters.
fn sample(
    redlock: &Redlock,
    seen: &mut [u64],
    connects: &mut Vec<(u8, u64)>,
    counters: &mut Vec<(u64, Vec<[u64; 3]>)>,
) {
    let now = mono_ns();
    let stats = redlock.stats();
    for (i, n) in stats.nodes.iter().enumerate() {
        for _ in seen[i]..n.connects {
            connects.push((i as u8, now));
        }
        seen[i] = seen[i].max(n.connects);
    }
    let row = stats
        .nodes
        .iter()
        .map(|n| [n.requests, n.failures, n.timeouts])
        .collect();
    counters.push((now, row));
}

/// A line to the driver.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reads the results a worker wrote.
///
/// # Errors
///
/// The file is missing or a line is malformed.
pub fn read_results(path: &Path) -> Result<WorkerResult, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut res = WorkerResult::default();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        let bad = || format!("{}: malformed line {line:?}", path.display());
        let (kind, rest) = line.split_once(' ').ok_or_else(bad)?;
        if kind == "e" {
            let mut f = rest.splitn(3, ' ');
            let path_no = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
            let outcome = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
            res.messages
                .push((path_no, outcome, f.next().unwrap_or("").to_owned()));
            continue;
        }
        let f: Vec<u64> = rest
            .split(' ')
            .map(|v| v.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let need = |n: usize| if f.len() == n { Ok(()) } else { Err(bad()) };
        // Holds and waits: 6 fields, or 8 with the kind and the members (without them, as
        // before the kinds were mixed: a plain lock of the one resource); holds 9 with when a
        // lost kept lock's holder noticed.
        let kind_members = || match f.len() {
            6 => Ok((PLAIN, 1u8 << f[0])),
            8 | 9 => Ok((f[6] as u8, f[7] as u8)),
            _ => Err(bad()),
        };
        match kind {
            "h" => {
                let (kind, members) = kind_members()?;
                res.holds.push(Hold {
                    resource: f[0] as u8,
                    start: f[1],
                    end: f[2],
                    fence: f[3],
                    path: f[4] as u8,
                    task: f[5] as u16,
                    kind,
                    members,
                    noticed: f.get(8).copied().unwrap_or(f[2]),
                });
            }
            "w" => {
                let (kind, members) = kind_members()?;
                res.waits.push(Wait {
                    resource: f[0] as u8,
                    start: f[1],
                    end: f[2],
                    outcome: f[3] as u8,
                    path: f[4] as u8,
                    task: f[5] as u16,
                    kind,
                    members,
                });
            }
            "n" => {
                need(9)?;
                res.nodes.push(NodeFigures {
                    connects: f[1],
                    reconnects: f[2],
                    downs: f[3],
                    idle_closes: f[4],
                    timeouts: f[5],
                    failures: f[6],
                    noscript: f[7],
                    quarantined: f[8],
                });
            }
            "l" => {
                need(2)?;
                res.losses.push((f[0] as u8, f[1]));
            }
            "s" => {
                need(2)?;
                res.shutdown = (f[0], f[1]);
            }
            "c" => {
                need(2)?;
                res.connects.push((f[0] as u8, f[1]));
            }
            "r" => {
                if f.len() < 4 || !(f.len() - 1).is_multiple_of(3) {
                    return Err(bad());
                }
                let nodes = (f.len() - 1) / 3;
                let row = (0..nodes)
                    .map(|n| [f[1 + n], f[1 + nodes + n], f[1 + 2 * nodes + n]])
                    .collect();
                res.counters.push((f[0], row));
            }
            _ => return Err(bad()),
        }
    }
    Ok(res)
}

/// A blocking caller: one path after another until `stop`.
fn blocking_caller(redlock: &Redlock, task: u16, mut rng: Rng, stop: &AtomicBool) -> Rec {
    let mut rec = Rec::new(task);
    let sem = redlock
        .semaphore(SEMAPHORE, PERMITS)
        .expect("the soak's semaphore");
    while !stop.load(Ordering::Relaxed) {
        let t = pick(&mut rng);
        if t.kind == PERMIT {
            let path = SEM_PATHS as u64 + rng.below((ASYNC_SEM_PATHS - SEM_PATHS) as u64);
            blocking_sem_path(redlock, &sem, &mut rec, &mut rng, path as u8);
        } else {
            let path = rng.below(ASYNC_PATHS as u64) as u8;
            blocking_path(redlock, &mut rec, &mut rng, t, path);
        }
        std::thread::sleep(think_time(&mut rng));
    }
    rec
}

/// What a `with_lock` work returns: what it held, when it began, when its belief ended, its
/// fence, and whether the lock was lost meanwhile.
type WithLockRun = (Target, u64, (u64, u64), Option<u64>, bool);

/// Records a `with_lock` (blocking or async) that began waiting at `t0`: its wait and its hold
/// as a kept lock's, or the wait's failure when the lock was not acquired.
fn with_lock_done(
    rec: &mut Rec,
    waited: Target,
    t0: u64,
    path: u8,
    res: Result<WithLockRun, WithLockError<WithLockRun>>,
) {
    let (held, start, end, fence, lost) = match res {
        Ok(v) => v,
        Err(WithLockError::Lost { value, .. }) => value,
        Err(WithLockError::NotAcquired(e)) => {
            rec.wait(waited, t0, mono_ns(), path, Err(&e));
            return;
        }
        Err(other) => panic!("with_lock: {}", other.error()),
    };
    rec.wait(waited, t0, start, path, Ok(()));
    rec.kept_hold(held, start, end, fence, path, lost);
}

/// Holds `lock` for a plain hold time, then records the hold; the caller releases.
fn plain_hold(rec: &mut Rec, rng: &mut Rng, t: Target, start: u64, lock: &Lock, path: u8) {
    std::thread::sleep(hold_time(rng));
    rec.hold(
        t,
        start,
        believed_end(lock.valid_until()),
        lock.fence(),
        path,
    );
}

fn blocking_path(redlock: &Redlock, rec: &mut Rec, rng: &mut Rng, t: Target, path: u8) {
    let name = t.key();
    let t0 = mono_ns();
    match path {
        // lock / try_lock / lock_until(short) / lock + unlock_nowait
        0..=2 | 8 => {
            let res = match path {
                0 | 8 => redlock.lock(&name),
                1 => redlock.try_lock(&name),
                _ => redlock.lock_until(&name, Instant::now() + short_wait(rng)),
            };
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            if let Ok(lock) = res {
                plain_hold(rec, rng, t, t1, &lock, path);
                if path == 8 {
                    redlock.unlock_nowait(lock);
                } else {
                    let _ = redlock.unlock(lock);
                }
            }
        }
        // guard, dropped / extended and unlocked
        3 | 4 => {
            let res = redlock.guard(&name);
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(mut guard) = res else { return };
            if path == 3 {
                plain_hold(rec, rng, t, t1, &guard, path);
                drop(guard);
                return;
            }
            std::thread::sleep(hold_time(rng));
            let before = guard.valid_until();
            let _ = guard.extend(TTL);
            if let Some(end) = extend_ended(before, guard.valid_until(), mono_ns()) {
                rec.hold(t, t1, end, guard.fence(), path);
            } else {
                plain_hold(rec, rng, t, t1, &guard, path);
            }
            let _ = guard.unlock();
        }
        // lock, extend, unlock
        5 => {
            let res = redlock.lock(&name);
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(mut lock) = res else { return };
            std::thread::sleep(hold_time(rng));
            let before = lock.valid_until();
            let _ = redlock.extend(&mut lock, TTL);
            if let Some(end) = extend_ended(before, lock.valid_until(), mono_ns()) {
                rec.hold(t, t1, end, lock.fence(), path);
            } else {
                plain_hold(rec, rng, t, t1, &lock, path);
            }
            let _ = redlock.unlock(lock);
        }
        // keep: renewed by the engine past the TTL
        6 => {
            let res = redlock.lock(&name);
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(lock) = res else { return };
            let fence = lock.fence();
            let kept = match redlock.keep(lock) {
                Ok(kept) => kept,
                Err(e) => panic!("keep: {e}"),
            };
            let lost = kept.wait_lost(kept_time(rng)).is_some();
            let end = kept_end(kept.lock().valid_until(), kept.lost_at());
            rec.kept_hold(t, t1, end, fence, path, lost);
            let _ = kept.release();
        }
        // with_lock: the work waits for the loss or its time
        7 => {
            let time = kept_time(rng);
            let res = redlock.with_lock(&name, |held| {
                let start = mono_ns();
                let lost = held.wait_lost(time).is_some();
                let end = kept_end(held.lock().valid_until(), held.lost_at());
                (t, start, end, held.lock().fence(), lost)
            });
            with_lock_done(rec, t, t0, path, res);
        }
        _ => unreachable!("blocking paths are 0..{ASYNC_PATHS}"),
    }
}

/// A blocking caller's turn at the semaphore: a wait for any permit, then a hold of the one
/// won.
fn blocking_sem_path(redlock: &Redlock, sem: &Semaphore, rec: &mut Rec, rng: &mut Rng, path: u8) {
    let waited = Target::semaphore();
    let t0 = mono_ns();
    match path {
        // try_acquire / acquire + unlock; acquire_until(short) + extend + unlock
        18..=20 => {
            let res = match path {
                18 => sem.try_acquire(),
                19 => sem.acquire(),
                _ => sem.acquire_until(Instant::now() + short_wait(rng)),
            };
            let t1 = mono_ns();
            rec.wait(waited, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(mut lock) = res else { return };
            let t = permit_of(&lock);
            if path == 20 {
                std::thread::sleep(hold_time(rng));
                let before = lock.valid_until();
                let _ = redlock.extend(&mut lock, TTL);
                if let Some(end) = extend_ended(before, lock.valid_until(), mono_ns()) {
                    rec.hold(t, t1, end, lock.fence(), path);
                } else {
                    plain_hold(rec, rng, t, t1, &lock, path);
                }
            } else {
                plain_hold(rec, rng, t, t1, &lock, path);
            }
            let _ = redlock.unlock(lock);
        }
        21 => {
            let res = sem.guard();
            let t1 = mono_ns();
            rec.wait(waited, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(guard) = res else { return };
            plain_hold(rec, rng, permit_of(&guard), t1, &guard, path);
            drop(guard);
        }
        22 => {
            let time = kept_time(rng);
            let res = sem.with_permit(|held| {
                let start = mono_ns();
                let lost = held.wait_lost(time).is_some();
                let end = kept_end(held.lock().valid_until(), held.lost_at());
                let t = permit_of(&held.lock());
                (t, start, end, held.lock().fence(), lost)
            });
            with_lock_done(rec, waited, t0, path, res);
        }
        _ => unreachable!("the semaphore's blocking paths are {SEM_PATHS}..{ASYNC_SEM_PATHS}"),
    }
}

/// An async caller: one path after another until `stop`.
async fn async_caller(redlock: &AsyncRedlock, task: u16, mut rng: Rng, stop: &AtomicBool) -> Rec {
    let mut rec = Rec::new(task);
    let sem = redlock
        .semaphore(SEMAPHORE, PERMITS)
        .expect("the soak's semaphore");
    while !stop.load(Ordering::Relaxed) {
        let t = pick(&mut rng);
        if t.kind == PERMIT {
            let path = ASYNC_SEM_PATHS as u64 + rng.below((PATHS.len() - ASYNC_SEM_PATHS) as u64);
            async_sem_path(redlock, &sem, &mut rec, &mut rng, path as u8).await;
        } else {
            let path = ASYNC_PATHS as u64 + rng.below((SEM_PATHS - ASYNC_PATHS) as u64);
            async_path(redlock, &mut rec, &mut rng, t, path as u8).await;
        }
        tokio::time::sleep(think_time(&mut rng)).await;
    }
    rec
}

/// [`plain_hold`] for tasks.
async fn plain_hold_async(
    rec: &mut Rec,
    rng: &mut Rng,
    t: Target,
    start: u64,
    lock: &Lock,
    path: u8,
) {
    tokio::time::sleep(hold_time(rng)).await;
    rec.hold(
        t,
        start,
        believed_end(lock.valid_until()),
        lock.fence(),
        path,
    );
}

async fn async_path(redlock: &AsyncRedlock, rec: &mut Rec, rng: &mut Rng, t: Target, path: u8) {
    let name = t.key();
    let t0 = mono_ns();
    match path {
        // lock / try_lock / lock_until(short) / timeout(lock): the acquire, then a plain hold
        9..=11 | 17 => {
            let res = match path {
                9 => redlock.lock(&name).await,
                10 => redlock.try_lock(&name).await,
                11 => {
                    redlock
                        .lock_until(&name, Instant::now() + short_wait(rng))
                        .await
                }
                _ => match tokio::time::timeout(short_wait(rng), redlock.lock(&name)).await {
                    Ok(res) => res,
                    Err(_) => {
                        rec.cancelled(t, t0, mono_ns(), path);
                        return;
                    }
                },
            };
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            if let Ok(lock) = res {
                plain_hold_async(rec, rng, t, t1, &lock, path).await;
                if path == 10 {
                    redlock.unlock_nowait(lock);
                } else {
                    let _ = redlock.unlock(lock).await;
                }
            }
        }
        12 | 13 => {
            let res = redlock.guard(&name).await;
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(mut guard) = res else { return };
            if path == 12 {
                plain_hold_async(rec, rng, t, t1, &guard, path).await;
                drop(guard);
                return;
            }
            tokio::time::sleep(hold_time(rng)).await;
            let before = guard.valid_until();
            let _ = guard.extend(TTL).await;
            if let Some(end) = extend_ended(before, guard.valid_until(), mono_ns()) {
                rec.hold(t, t1, end, guard.fence(), path);
            } else {
                plain_hold_async(rec, rng, t, t1, &guard, path).await;
            }
            let _ = guard.unlock().await;
        }
        14 => {
            let res = redlock.lock(&name).await;
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(mut lock) = res else { return };
            tokio::time::sleep(hold_time(rng)).await;
            let before = lock.valid_until();
            let _ = redlock.extend(&mut lock, TTL).await;
            if let Some(end) = extend_ended(before, lock.valid_until(), mono_ns()) {
                rec.hold(t, t1, end, lock.fence(), path);
            } else {
                plain_hold_async(rec, rng, t, t1, &lock, path).await;
            }
            let _ = redlock.unlock(lock).await;
        }
        15 => {
            let res = redlock.lock(&name).await;
            let t1 = mono_ns();
            rec.wait(t, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(lock) = res else { return };
            let fence = lock.fence();
            let kept = match redlock.keep(lock) {
                Ok(kept) => kept,
                Err(e) => panic!("keep: {e}"),
            };
            let lost = kept.wait_lost(kept_time(rng)).await.is_some();
            let end = kept_end(kept.lock().valid_until(), kept.lost_at());
            rec.kept_hold(t, t1, end, fence, path, lost);
            let _ = kept.release().await;
        }
        16 => {
            let time = kept_time(rng);
            let res = redlock
                .with_lock(&name, move |watch| async move {
                    let start = mono_ns();
                    let lost = watch.wait_lost(time).await.is_some();
                    let end = kept_end(watch.lock().valid_until(), watch.lost_at());
                    (t, start, end, watch.lock().fence(), lost)
                })
                .await;
            with_lock_done(rec, t, t0, path, res);
        }
        _ => unreachable!("async paths are {ASYNC_PATHS}..{SEM_PATHS}"),
    }
}

/// [`blocking_sem_path`] for tasks.
async fn async_sem_path(
    redlock: &AsyncRedlock,
    sem: &AsyncSemaphore,
    rec: &mut Rec,
    rng: &mut Rng,
    path: u8,
) {
    let waited = Target::semaphore();
    let t0 = mono_ns();
    match path {
        // try_acquire + unlock_nowait; acquire / timeout(acquire) + unlock
        23..=25 => {
            let res = match path {
                23 => sem.try_acquire().await,
                24 => sem.acquire().await,
                _ => match tokio::time::timeout(short_wait(rng), sem.acquire()).await {
                    Ok(res) => res,
                    Err(_) => {
                        rec.cancelled(waited, t0, mono_ns(), path);
                        return;
                    }
                },
            };
            let t1 = mono_ns();
            rec.wait(waited, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(lock) = res else { return };
            plain_hold_async(rec, rng, permit_of(&lock), t1, &lock, path).await;
            if path == 23 {
                redlock.unlock_nowait(lock);
            } else {
                let _ = redlock.unlock(lock).await;
            }
        }
        26 => {
            let res = sem.guard().await;
            let t1 = mono_ns();
            rec.wait(waited, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(guard) = res else { return };
            plain_hold_async(rec, rng, permit_of(&guard), t1, &guard, path).await;
            drop(guard);
        }
        27 => {
            let res = sem.acquire().await;
            let t1 = mono_ns();
            rec.wait(waited, t0, t1, path, res.as_ref().map(|_| ()));
            let Ok(lock) = res else { return };
            let (t, fence) = (permit_of(&lock), lock.fence());
            let kept = match redlock.keep(lock) {
                Ok(kept) => kept,
                Err(e) => panic!("keep: {e}"),
            };
            let lost = kept.wait_lost(kept_time(rng)).await.is_some();
            let end = kept_end(kept.lock().valid_until(), kept.lost_at());
            rec.kept_hold(t, t1, end, fence, path, lost);
            let _ = kept.release().await;
        }
        _ => unreachable!("the semaphore's async paths are {ASYNC_SEM_PATHS}.."),
    }
}
