//! The `contention` scenario's callers: K callers in one process compete for ONE resource, each
//! holding it for [`HOLD`] (spinning) once acquired, for a fixed time, all starting at one
//! instant; and the multi-process variant, where P child processes of the same binary each run
//! K callers from a common start and print what they measured (see [`child_main`]).
//!
//! - [`Kind::Mux`]: this crate, K OS threads sharing ONE [`redlock_mux::Redlock`], each looping
//!   `lock_until` → hold → `unlock`.
//! - [`Kind::Rslock`]: `rslock`, K tokio tasks sharing one `LockManager` on a multi-thread
//!   runtime with 2 workers, each looping `lock` → hold → `unlock`.
//!
//! Every critical section is recorded as CLOCK_MONOTONIC nanoseconds (one clock for every
//! process on the machine): when `lock` was called, when it returned the lock, and the instant
//! just before `unlock` was called. [`Fig::of`] turns the sections of one run (of all its
//! processes) into its figures: sections/s, time to acquire, the hand-off gap, fairness and
//! overlapping sections.

use std::io::{BufRead, BufWriter, Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use redlock_mux::Builder;

use super::clients::{self, Kind, NODE_TIMEOUT, TTL};
use super::quantile;
use super::scale::two_workers;

/// How long a caller holds the lock: a short critical section, so that the hand-off (release,
/// then the next acquisition) decides the throughput.
pub const HOLD: Duration = Duration::from_micros(200);
/// A caller gives up a `lock` call after this long: far beyond a run, so nobody gives up
/// within one unless something is badly wrong.
pub const GIVE_UP: Duration = Duration::from_secs(30);
/// After the end of a run, callers still waiting get this long to acquire (they then release at
/// once and stop); a wait still unfinished then is cut, and counted as at least that long.
pub const DRAIN: Duration = Duration::from_secs(3);
/// Cycles of the uncontended measurement (one caller, a resource of its own, the same handle)
/// whose median is the uncontended cycle; after [`SOLO_WARMUP`] unmeasured ones.
pub const SOLO_CYCLES: usize = 200;
pub const SOLO_WARMUP: usize = 20;
/// Beyond the end of a run plus [`DRAIN`]: a run whose callers have not all returned by then
/// hangs, and is abandoned (reported as not finished).
pub const HARD_MARGIN: Duration = Duration::from_secs(10);
/// The child processes measure their uncontended cycles one after the other (measured together,
/// they would slow each other down): the first this long after they are spawned (time to start
/// and connect), the next [`SOLO_SLOT`] later, and so on.
pub const SOLO_FIRST: Duration = Duration::from_millis(300);
/// Time per child for its uncontended cycles (about 0.1 s on loopback).
pub const SOLO_SLOT: Duration = Duration::from_millis(250);
/// From the last child's uncontended slot to the common start: time to spawn the callers.
pub const START_AFTER_SOLO: Duration = Duration::from_millis(500);
/// The hidden flag that makes the benchmark binary a child of the multi-process case.
pub const CHILD_FLAG: &str = "--contend-child";

/// The retry settings under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Retry {
    /// This crate's defaults: 200 ms plus up to 200 ms of jitter. rslock: its default delay
    /// (a uniform whole number of milliseconds in 0..200).
    Defaults,
    /// 1 ms plus up to 1 ms of jitter. rslock: `set_retry(_, 2 ms)`, a pause of 0 or 1 ms (its
    /// pause is a whole number of milliseconds below the delay).
    OneMs,
}

impl Retry {
    pub const ALL: [Retry; 2] = [Retry::Defaults, Retry::OneMs];

    pub fn name(self) -> &'static str {
        match self {
            Retry::Defaults => "defaults",
            Retry::OneMs => "1 ms",
        }
    }

    /// The form used on a child's command line and in resource names.
    pub fn arg(self) -> &'static str {
        match self {
            Retry::Defaults => "defaults",
            Retry::OneMs => "1ms",
        }
    }

    pub fn parse(s: &str) -> Option<Retry> {
        Retry::ALL.into_iter().find(|r| r.arg() == s)
    }

    /// This crate's handle. Quarantine off: the servers were started seconds ago, and the
    /// default quarantine would keep each of them out of quorums for a TTL.
    fn mux(self, urls: &[String], shape: Option<Shape>) -> redlock_mux::Redlock {
        let b = Builder::new(urls)
            .quarantine(None)
            .ttl(TTL)
            .node_timeout(NODE_TIMEOUT)
            .ordered_sets(shape == Some(Shape::MixedOrdered))
            .fair(matches!(
                shape,
                Some(Shape::Fair | Shape::ReadWriteFair | Shape::MixedFair)
            ));
        let b = match self {
            Retry::Defaults => b,
            Retry::OneMs => b.retry_delay(Duration::from_millis(1), Duration::from_millis(1)),
        };
        b.build().expect("redlock-mux handle")
    }

    /// rslock's manager. Its retry count is unbounded (its default, 3, would give up within a
    /// second); each call is bounded by [`GIVE_UP`] instead, as ours.
    fn rslock(self, urls: &[String]) -> rslock::LockManager {
        let redis_clients = urls
            .iter()
            .map(|u| redis::Client::open(clients::redis_rs_info(u)).expect("redis client"))
            .collect();
        let mut mgr = rslock::LockManager::from_clients(redis_clients);
        let delay = match self {
            Retry::Defaults => Duration::from_millis(200),
            Retry::OneMs => Duration::from_millis(2),
        };
        mgr.set_retry(u32::MAX, delay);
        mgr
    }
}

/// What the callers of a run lock, in the kinds rows (`bench_table`'s contention scenario): one
/// resource for all (the plain rows), a set of two resources for all, writers and readers of one
/// resource, or a mix of every kind on two resources, with sets taken all at once or (`mixed,
/// ordered sets`) with `Builder::ordered_sets`, or one resource for all, fair (`plain, fair`:
/// `Builder::fair`), or writers and readers of one resource, all fair (`writers +
/// readers, fair`), or the mix with every handle fair (`mixed, fair`). Named by the run's resource
/// (`kinds:SHAPE:…`, [`Shape::resource`]), so that a child process learns it from its RESOURCE
/// argument; any other resource is the plain rows' one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shape {
    Plain,
    Set,
    ReadWrite,
    Mixed,
    MixedOrdered,
    Fair,
    ReadWriteFair,
    MixedFair,
}

/// What one caller locks: resource `a`, resource `b`, the set of both, or `a` shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    A,
    B,
    Both,
    SharedA,
}

impl Target {
    /// Whether sections of `self` and `other` may not overlap.
    pub fn conflicts(self, other: Target) -> bool {
        use Target::*;
        // Readers share; `b` has nothing in common with `a`, alone or read.
        !matches!(
            (self, other),
            (SharedA, SharedA) | (B, A) | (A, B) | (B, SharedA) | (SharedA, B)
        )
    }

    /// The name to lock, for the run's `resource`.
    fn name(self, resource: &str) -> Vec<u8> {
        let a = format!("{resource}:a");
        let b = format!("{resource}:b");
        match self {
            Target::A => a.into_bytes(),
            Target::B => b.into_bytes(),
            Target::Both => redlock_mux::ResourceSet::new([a, b])
                .expect("a set of two")
                .as_ref()
                .to_vec(),
            Target::SharedA => redlock_mux::Shared::new(a)
                .expect("a shared name")
                .as_ref()
                .to_vec(),
        }
    }
}

impl Shape {
    pub const ALL: [Shape; 8] = [
        Shape::Plain,
        Shape::Fair,
        Shape::Set,
        Shape::ReadWrite,
        Shape::ReadWriteFair,
        Shape::Mixed,
        Shape::MixedOrdered,
        Shape::MixedFair,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Plain => "plain",
            Shape::Set => "set",
            Shape::ReadWrite => "writers + readers",
            Shape::Mixed => "mixed",
            Shape::MixedOrdered => "mixed, ordered sets",
            Shape::Fair => "plain, fair",
            Shape::ReadWriteFair => "writers + readers, fair",
            Shape::MixedFair => "mixed, fair",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Shape::Plain => "plain",
            Shape::Set => "set",
            Shape::ReadWrite => "rw",
            Shape::Mixed => "mixed",
            Shape::MixedOrdered => "mixed-ordered",
            Shape::Fair => "fair",
            Shape::ReadWriteFair => "rw-fair",
            Shape::MixedFair => "mixed-fair",
        }
    }

    /// The resource of a run of this shape; `run` makes it unique.
    pub fn resource(self, run: &str) -> String {
        format!("kinds:{}:{run}", self.tag())
    }

    /// The shape named by a run's resource, `None` for the plain rows' one resource.
    pub fn of(resource: &str) -> Option<Shape> {
        let tag = resource.strip_prefix("kinds:")?.split(':').next()?;
        Shape::ALL.into_iter().find(|s| s.tag() == tag)
    }

    /// Caller `caller`'s role: its name and what it locks. Callers are numbered across the
    /// processes, 8 a process, so that every process has every role.
    pub fn role(self, caller: u32) -> (&'static str, Target) {
        match (self, caller % 4) {
            (Shape::Plain, _) => ("plain", Target::A),
            (Shape::Fair, _) => ("fair", Target::A),
            (Shape::Set, _) => ("set", Target::Both),
            (Shape::ReadWrite, 0 | 2) => ("writer", Target::A),
            (Shape::ReadWrite, _) => ("reader", Target::SharedA),
            (Shape::ReadWriteFair, 0 | 2) => ("fair writer", Target::A),
            (Shape::ReadWriteFair, _) => ("reader", Target::SharedA),
            (Shape::Mixed | Shape::MixedOrdered | Shape::MixedFair, 0) => {
                ("writer of a", Target::A)
            }
            (Shape::Mixed | Shape::MixedOrdered | Shape::MixedFair, 1) => ("plain b", Target::B),
            (Shape::Mixed | Shape::MixedOrdered | Shape::MixedFair, 2) => {
                ("set a + b", Target::Both)
            }
            (Shape::Mixed | Shape::MixedOrdered | Shape::MixedFair, _) => {
                ("reader of a", Target::SharedA)
            }
        }
    }

    /// The roles, in caller order.
    pub fn roles(self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = Vec::new();
        for c in 0..4 {
            let (name, _) = self.role(c);
            if !v.contains(&name) {
                v.push(name);
            }
        }
        v
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `Instant`, readable across processes.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `Instant` of a [`mono_ns`] reading (in the future or now).
fn instant_at(ns: u64) -> Instant {
    Instant::now() + Duration::from_nanos(ns.saturating_sub(mono_ns()))
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// One critical section, in [`mono_ns`] nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    /// Numbered across the processes of a run.
    pub caller: u32,
    /// `lock` called.
    pub call: u64,
    /// `lock` returned the lock.
    pub enter: u64,
    /// Just before `unlock` was called.
    pub exit: u64,
}

/// A `lock` call still waiting at the end of the run plus [`DRAIN`].
#[derive(Clone, Copy, Debug)]
pub struct Cut {
    pub caller: u32,
    pub call: u64,
    /// When it was abandoned.
    pub at: u64,
}

/// What the callers of one process measured in one run.
#[derive(Debug, Default)]
pub struct Callers {
    pub sections: Vec<Section>,
    pub cut: Vec<Cut>,
    /// Times a caller entered while another of the same process was inside (`inside.swap`).
    pub overlaps: u64,
    /// `lock` calls that gave up (within their own [`GIVE_UP`]).
    pub gave_up: u64,
    /// Median uncontended cycle (`lock` + `unlock`), same handle.
    pub solo: Duration,
    /// Every caller returned before the hard deadline.
    pub finished: bool,
    /// How late this process was ready for the common start (children only).
    pub late: Duration,
    /// The start of the run ([`mono_ns`]).
    pub start: u64,
}

/// One run of one process.
pub struct Spec<'a> {
    pub kind: Kind,
    pub retry: Retry,
    pub urls: &'a [String],
    pub resource: &'a str,
    pub k: usize,
    pub time: Duration,
    /// Number of this process's first caller.
    pub caller_base: u32,
    /// Common start ([`mono_ns`]) of a multi-process run; `None`: as soon as ready.
    pub start: Option<u64>,
    /// When to measure the uncontended cycle ([`mono_ns`]); `None`: at once.
    pub solo_at: Option<u64>,
}

/// What one caller hands back.
#[derive(Default)]
struct CallerOut {
    sections: Vec<Section>,
    cut: Option<Cut>,
    overlaps: u64,
    gave_up: u64,
}

impl CallerOut {
    /// A lock taken for the call made at `call`: its critical section, held now (overlaps
    /// flagged when `flag`: see [`Shared::hold`]).
    fn section(&mut self, shared: &Shared, caller: u32, call: u64, flag: bool) {
        let (enter, exit) = shared.hold(self, flag);
        self.sections.push(Section {
            caller,
            call,
            enter,
            exit,
        });
    }

    /// The call made at `call` was cut off by the end of the run.
    fn cut_off(&mut self, caller: u32, call: u64) {
        self.cut = Some(Cut {
            caller,
            call,
            at: mono_ns(),
        });
    }
}

/// State shared by the callers of one run.
struct Shared {
    inside: AtomicBool,
    /// The end of the run ([`mono_ns`]), set when the callers are released.
    end: AtomicU64,
}

impl Shared {
    fn new() -> Arc<Shared> {
        Arc::new(Shared {
            inside: AtomicBool::new(false),
            end: AtomicU64::new(0),
        })
    }

    /// The critical section: spins for [`HOLD`]; returns (enter, exit). With `flag`, counts an
    /// entry while another caller of this process is inside as an overlap; the kinds rows'
    /// sections may rightly overlap (readers, different resources), and their conflicts are
    /// found from the recorded intervals instead ([`conflicts`]).
    fn hold(&self, out: &mut CallerOut, flag: bool) -> (u64, u64) {
        let enter = mono_ns();
        let t = Instant::now();
        if flag && self.inside.swap(true, Ordering::SeqCst) {
            out.overlaps += 1;
        }
        while t.elapsed() < HOLD {
            std::hint::spin_loop();
        }
        if flag {
            self.inside.store(false, Ordering::SeqCst);
        }
        (enter, mono_ns())
    }
}

/// The deadline of a `lock` call made at `call`: [`GIVE_UP`] later, or the end of the drain if
/// sooner (`true`: the drain's, so a failure is a cut, not a give-up).
fn deadline(call: u64, end: u64) -> (Duration, bool) {
    let to_cut = Duration::from_nanos((end + nanos(DRAIN)).saturating_sub(call));
    if to_cut < GIVE_UP {
        (to_cut, true)
    } else {
        (GIVE_UP, false)
    }
}

/// Sleeps until `at` ([`mono_ns`]), if given.
fn sleep_until(at: Option<u64>) {
    if let Some(at) = at {
        std::thread::sleep(Duration::from_nanos(at.saturating_sub(mono_ns())));
    }
}

/// Runs K callers of `spec.kind` in this process.
pub fn run(spec: &Spec) -> Callers {
    match spec.kind {
        Kind::Mux => run_mux(spec),
        Kind::Rslock => run_rslock(spec),
        other => panic!("no contention runner for {other:?}"),
    }
}

fn median_of(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    quantile(&v, 0.5)
}

/// Collects `k` caller results until `hard` (a [`mono_ns`] instant).
fn collect(rx: &mpsc::Receiver<CallerOut>, k: usize, hard: u64, solo: Duration) -> Callers {
    let mut c = Callers {
        solo,
        finished: true,
        ..Callers::default()
    };
    for _ in 0..k {
        let left = Duration::from_nanos(hard.saturating_sub(mono_ns()));
        match rx.recv_timeout(left) {
            Ok(o) => {
                c.sections.extend_from_slice(&o.sections);
                c.cut.extend(o.cut);
                c.overlaps += o.overlaps;
                c.gave_up += o.gave_up;
            }
            Err(_) => {
                c.finished = false;
                break;
            }
        }
    }
    c
}

fn run_mux(spec: &Spec) -> Callers {
    // The kinds rows: the shape the resource names (`Shape::of`); the plain rows: none.
    let shape = Shape::of(spec.resource);
    let redlock = spec.retry.mux(spec.urls, shape);
    sleep_until(spec.solo_at);
    // The uncontended cycle on the same handle (the first cycles connect).
    let solo_res = format!("{}:solo:{}", spec.resource, spec.caller_base);
    let mut solo = Vec::with_capacity(SOLO_CYCLES);
    for i in 0..SOLO_WARMUP + SOLO_CYCLES {
        let t = Instant::now();
        let lock = redlock
            .lock_until(&solo_res, t + GIVE_UP)
            .expect("uncontended lock");
        redlock.unlock(lock).expect("uncontended unlock");
        if i >= SOLO_WARMUP {
            solo.push(t.elapsed());
        }
    }
    let shared = Shared::new();
    let ready = Arc::new(Barrier::new(spec.k + 1));
    let go = Arc::new(Barrier::new(spec.k + 1));
    let (tx, rx) = mpsc::channel();
    for t in 0..spec.k {
        let (redlock, shared, ready, go, tx) = (
            redlock.clone(),
            shared.clone(),
            ready.clone(),
            go.clone(),
            tx.clone(),
        );
        let caller = spec.caller_base + t as u32;
        let resource = spec.resource.to_owned();
        // The kinds rows: what this caller locks (`Shape::role`); the plain rows: the resource.
        let name = match shape {
            Some(shape) => shape.role(caller).1.name(&resource),
            None => resource.clone().into_bytes(),
        };
        let flag = matches!(shape, None | Some(Shape::Plain | Shape::Fair | Shape::Set));
        std::thread::Builder::new()
            .name(format!("contend-{caller}"))
            .spawn(move || {
                // Warm-up on a resource of its own: the first call from a thread sets it up.
                let warm = format!("{resource}:warm:{caller}");
                if let Ok(lock) = redlock.try_lock(&warm) {
                    let _ = redlock.unlock(lock);
                }
                let mut out = CallerOut {
                    sections: Vec::with_capacity(1024),
                    ..CallerOut::default()
                };
                ready.wait();
                go.wait();
                let end = shared.end.load(Ordering::SeqCst);
                loop {
                    let call = mono_ns();
                    if call >= end {
                        break;
                    }
                    let (wait, cut) = deadline(call, end);
                    match redlock.lock_until(&name, Instant::now() + wait) {
                        Ok(lock) => {
                            out.section(&shared, caller, call, flag);
                            let _ = redlock.unlock(lock);
                        }
                        Err(_) if cut => {
                            out.cut_off(caller, call);
                            break;
                        }
                        Err(_) => out.gave_up += 1,
                    }
                }
                let _ = tx.send(out);
            })
            .expect("spawn caller thread");
    }
    drop(tx);
    ready.wait();
    let start = spec.start.unwrap_or_else(mono_ns);
    let late = Duration::from_nanos(mono_ns().saturating_sub(start));
    sleep_until(spec.start);
    let end = start + nanos(spec.time);
    shared.end.store(end, Ordering::SeqCst);
    go.wait();
    let hard = end + nanos(DRAIN + HARD_MARGIN);
    // Callers still running at `hard` are left behind (the run is reported as not finished).
    let mut c = collect(&rx, spec.k, hard, median_of(solo));
    c.late = late;
    c.start = start;
    c
}

fn run_rslock(spec: &Spec) -> Callers {
    let rt = two_workers();
    let mgr = spec.retry.rslock(spec.urls);
    sleep_until(spec.solo_at);
    let solo_res = format!("{}:solo:{}", spec.resource, spec.caller_base);
    let solo = rt.block_on(async {
        let mut solo = Vec::with_capacity(SOLO_CYCLES);
        for i in 0..SOLO_WARMUP + SOLO_CYCLES {
            let t = Instant::now();
            let lock = tokio::time::timeout(GIVE_UP, mgr.lock(solo_res.as_bytes(), TTL))
                .await
                .expect("rslock: uncontended lock timed out")
                .expect("rslock: uncontended lock");
            mgr.unlock(&lock).await;
            if i >= SOLO_WARMUP {
                solo.push(t.elapsed());
            }
        }
        solo
    });
    let shared = Shared::new();
    let (tx, rx) = mpsc::channel();
    // Tasks are spawned before the start and sleep until it.
    let start = spec
        .start
        .unwrap_or_else(|| mono_ns() + nanos(Duration::from_millis(5)));
    let late = Duration::from_nanos(mono_ns().saturating_sub(start));
    let end = start + nanos(spec.time);
    for t in 0..spec.k {
        let (mgr, shared, tx) = (mgr.clone(), shared.clone(), tx.clone());
        let caller = spec.caller_base + t as u32;
        let resource = spec.resource.as_bytes().to_vec();
        rt.spawn(async move {
            let mut out = CallerOut {
                sections: Vec::with_capacity(1024),
                ..CallerOut::default()
            };
            tokio::time::sleep_until(instant_at(start).into()).await;
            loop {
                let call = mono_ns();
                if call >= end {
                    break;
                }
                let (wait, cut) = deadline(call, end);
                match tokio::time::timeout(wait, mgr.lock(&resource[..], TTL)).await {
                    Ok(Ok(lock)) => {
                        out.section(&shared, caller, call, true);
                        mgr.unlock(&lock).await;
                    }
                    Err(_) if cut => {
                        out.cut_off(caller, call);
                        break;
                    }
                    Ok(Err(_)) | Err(_) => out.gave_up += 1,
                }
            }
            let _ = tx.send(out);
        });
    }
    drop(tx);
    let hard = end + nanos(DRAIN + HARD_MARGIN);
    let mut c = collect(&rx, spec.k, hard, median_of(solo));
    c.late = late;
    c.start = start;
    // Drops tasks that hang.
    rt.shutdown_timeout(Duration::from_secs(2));
    c
}

// ---------------------------------------------------------------------------------------------
// several processes
// ---------------------------------------------------------------------------------------------

/// Runs `p` child processes of this binary, each with `k` callers of `kind` on `resource`, from
/// a common start; returns each one's results (`finished: false` for a child that failed or
/// hung, which is killed) and the start. `prepare` gets each child's command before it is
/// spawned (the harness's `die_with_parent`, so that a killed benchmark leaves no children).
#[allow(clippy::too_many_arguments)]
pub fn run_processes(
    prepare: fn(&mut Command),
    kind: Kind,
    retry: Retry,
    urls: &[String],
    resource: &str,
    p: usize,
    k: usize,
    time: Duration,
) -> (Vec<Callers>, u64) {
    let exe = std::env::current_exe().expect("current_exe");
    let spawned = mono_ns();
    let solo_at = |i: usize| spawned + nanos(SOLO_FIRST + SOLO_SLOT * i as u32);
    let start = solo_at(p) + nanos(START_AFTER_SOLO);
    let hard = start + nanos(time + DRAIN + HARD_MARGIN);
    let (tx, rx) = mpsc::channel();
    let mut children = Vec::new();
    for i in 0..p {
        let mut cmd = Command::new(&exe);
        cmd.arg(CHILD_FLAG)
            .arg(kind.name())
            .arg(retry.arg())
            .arg(urls.join(","))
            .arg(resource)
            .arg(k.to_string())
            .arg((i * k).to_string())
            .arg(start.to_string())
            .arg(solo_at(i).to_string())
            .arg(time.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        prepare(&mut cmd);
        let mut c = cmd.spawn().expect("spawn a contention child");
        let mut stdout = c.stdout.take().expect("child stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            let _ = tx.send((i, s));
        });
        children.push(c);
    }
    drop(tx);
    let mut out: Vec<Callers> = (0..p).map(|_| Callers::default()).collect();
    for _ in 0..p {
        let left = Duration::from_nanos(hard.saturating_sub(mono_ns()));
        match rx.recv_timeout(left) {
            Ok((i, text)) => out[i] = parse_child(&text),
            Err(_) => break,
        }
    }
    for (i, c) in children.iter_mut().enumerate() {
        if !out[i].finished {
            eprintln!("bench_table: contention child {i} did not finish; killing it");
            let _ = c.kill();
        }
        let _ = c.wait();
    }
    (out, start)
}

/// The child's side: `CHILD_FLAG KIND RETRY URL,URL... RESOURCE K CALLER_BASE START_NS SOLO_NS
/// TIME_MS` (instants in [`mono_ns`]).
/// Prints one line per item (`solo NS`, `late NS`, `section CALLER CALL ENTER EXIT`, `cut CALLER
/// CALL AT`, `overlaps N`, `gave_up N`) and `finished 0|1` last.
pub fn child_main(args: &[String]) {
    let [kind, retry, urls, resource, k, base, start, solo, time] = args else {
        panic!(
            "{CHILD_FLAG} KIND RETRY URL,URL... RESOURCE K CALLER_BASE START_NS SOLO_NS TIME_MS"
        );
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let spec = Spec {
        kind: Kind::parse(kind).expect("KIND"),
        retry: Retry::parse(retry).expect("RETRY"),
        urls: &urls,
        resource,
        k: k.parse().expect("K"),
        time: Duration::from_millis(time.parse().expect("TIME_MS")),
        caller_base: base.parse().expect("CALLER_BASE"),
        start: Some(start.parse().expect("START_NS")),
        solo_at: Some(solo.parse().expect("SOLO_NS")),
    };
    let c = run(&spec);
    let mut w = BufWriter::new(std::io::stdout().lock());
    let _ = writeln!(w, "solo {}", nanos(c.solo));
    let _ = writeln!(w, "late {}", nanos(c.late));
    for s in &c.sections {
        let _ = writeln!(w, "section {} {} {} {}", s.caller, s.call, s.enter, s.exit);
    }
    for x in &c.cut {
        let _ = writeln!(w, "cut {} {} {}", x.caller, x.call, x.at);
    }
    let _ = writeln!(w, "overlaps {}", c.overlaps);
    let _ = writeln!(w, "gave_up {}", c.gave_up);
    let _ = writeln!(w, "finished {}", u8::from(c.finished));
    let _ = w.flush();
    // Callers left behind (a hang) must not keep the process alive.
    std::process::exit(0);
}

/// Reads a child's output; `finished` only if it got to its last line.
fn parse_child(text: &str) -> Callers {
    let mut c = Callers::default();
    for line in text.as_bytes().lines() {
        let line = line.unwrap_or_default();
        let mut f = line.split_ascii_whitespace();
        let tag = f.next().unwrap_or("");
        let mut n = || -> u64 { f.next().and_then(|x| x.parse().ok()).unwrap_or(0) };
        match tag {
            "solo" => c.solo = Duration::from_nanos(n()),
            "late" => c.late = Duration::from_nanos(n()),
            "section" => c.sections.push(Section {
                caller: n() as u32,
                call: n(),
                enter: n(),
                exit: n(),
            }),
            "cut" => c.cut.push(Cut {
                caller: n() as u32,
                call: n(),
                at: n(),
            }),
            "overlaps" => c.overlaps = n(),
            "gave_up" => c.gave_up = n(),
            "finished" => c.finished = n() == 1,
            _ => {}
        }
    }
    c
}

// ---------------------------------------------------------------------------------------------
// figures
// ---------------------------------------------------------------------------------------------

/// Fewest ÷ most of `counts` (sections per caller or per process); 0 when none has any.
fn ratio(counts: &[u64]) -> f64 {
    match (counts.iter().min(), counts.iter().max()) {
        (Some(&lo), Some(&hi)) if hi > 0 => lo as f64 / hi as f64,
        _ => 0.0,
    }
}

/// The figures of one run (all its processes).
#[derive(Clone, Debug)]
pub struct Fig {
    /// Sections entered within the run, per second.
    pub rate: f64,
    /// 1 ÷ (uncontended cycle + hold).
    pub ideal: f64,
    /// Uncontended cycle (median over the processes' medians).
    pub solo: Duration,
    /// Time to acquire, of every `lock` call made within the run (a cut wait counts as what it
    /// had waited by then).
    pub acquire_p50: Duration,
    pub acquire_p99: Duration,
    pub acquire_max: Duration,
    /// From a holder's `unlock` call to the next acquisition, within the run.
    pub gap_p50: Duration,
    pub gap_p99: Duration,
    /// Fewest ÷ most sections among callers (several processes: among processes).
    pub fairness: f64,
    /// Several processes: the worst process's fewest ÷ most among its callers.
    pub fairness_within: Option<f64>,
    /// The larger of: entries while another caller of the same process was inside; sections
    /// overlapping another (any process) by their recorded intervals.
    pub overlaps: u64,
    pub gave_up: u64,
    /// Waits cut at the end of the drain.
    pub cut: usize,
    pub finished: bool,
    /// Latest a process was ready for the common start.
    pub late: Duration,
}

impl Fig {
    /// `procs` ran `k` callers each, numbered `0..procs.len() * k`, from `start` for `time`.
    pub fn of(procs: &[Callers], k: usize, start: u64, time: Duration) -> Fig {
        let end = start + nanos(time);
        let mut all: Vec<Section> = procs.iter().flat_map(|c| c.sections.clone()).collect();
        all.sort_unstable_by_key(|s| s.enter);
        let window: Vec<&Section> = all.iter().filter(|s| s.enter < end).collect();
        let cut: Vec<&Cut> = procs.iter().flat_map(|c| &c.cut).collect();

        let mut acquire: Vec<Duration> = all
            .iter()
            .filter(|s| s.call < end)
            .map(|s| Duration::from_nanos(s.enter - s.call))
            .chain(cut.iter().map(|x| Duration::from_nanos(x.at - x.call)))
            .collect();
        acquire.sort_unstable();

        let mut gaps = Vec::with_capacity(window.len());
        let mut interval_overlaps = 0;
        let mut last_exit = 0;
        for s in &all {
            if s.enter < last_exit {
                interval_overlaps += 1;
            } else if last_exit > 0 && s.enter < end {
                gaps.push(Duration::from_nanos(s.enter - last_exit));
            }
            last_exit = last_exit.max(s.exit);
        }
        gaps.sort_unstable();

        let callers = procs.len() * k;
        let mut per_caller = vec![0u64; callers];
        for s in &window {
            if let Some(n) = per_caller.get_mut(s.caller as usize) {
                *n += 1;
            }
        }
        let (fairness, fairness_within) = if procs.len() > 1 {
            let per_proc: Vec<u64> = per_caller.chunks(k).map(|c| c.iter().sum()).collect();
            let within = per_caller
                .chunks(k)
                .map(ratio)
                .fold(f64::INFINITY, f64::min);
            (ratio(&per_proc), Some(within))
        } else {
            (ratio(&per_caller), None)
        };

        let solo = median_of(procs.iter().map(|c| c.solo).collect());
        Fig {
            rate: window.len() as f64 / time.as_secs_f64(),
            ideal: 1.0 / (solo + HOLD).as_secs_f64(),
            solo,
            acquire_p50: quantile(&acquire, 0.5),
            acquire_p99: quantile(&acquire, 0.99),
            acquire_max: acquire.last().copied().unwrap_or_default(),
            gap_p50: quantile(&gaps, 0.5),
            gap_p99: quantile(&gaps, 0.99),
            fairness,
            fairness_within,
            overlaps: procs
                .iter()
                .map(|c| c.overlaps)
                .sum::<u64>()
                .max(interval_overlaps),
            gave_up: procs.iter().map(|c| c.gave_up).sum(),
            cut: cut.len(),
            finished: procs.iter().all(|c| c.finished),
            late: procs.iter().map(|c| c.late).max().unwrap_or_default(),
        }
    }
}

/// Sections of conflicting targets that overlap in time, of a kinds run (`shape`): the count.
pub fn conflicts(procs: &[Callers], shape: Shape) -> usize {
    let mut all: Vec<Section> = procs.iter().flat_map(|c| c.sections.clone()).collect();
    all.sort_unstable_by_key(|s| s.enter);
    let mut n = 0;
    for (i, s) in all.iter().enumerate() {
        let target = shape.role(s.caller).1;
        n += all[i + 1..]
            .iter()
            .take_while(|t| t.enter < s.exit)
            .filter(|t| target.conflicts(shape.role(t.caller).1))
            .count();
    }
    n
}

/// One role's figures in a kinds run.
#[derive(Clone, Debug)]
pub struct RoleFig {
    /// Sections entered within the run, per second, all its callers.
    pub rate: f64,
    /// Median sections per caller.
    pub per_caller: f64,
    /// Fewest ÷ most sections among its callers (all processes).
    pub fairness: f64,
    /// Fewest ÷ most sections of its callers in each process, among the processes (the plain
    /// rows' "among processes").
    pub fairness_procs: f64,
    /// Time to acquire, p99 and the longest (cut waits counted as what they had waited).
    pub acquire_p99: Duration,
    pub acquire_max: Duration,
}

impl RoleFig {
    /// The figures of role `role` of `shape` in a run of `procs` (`k` callers each) from
    /// `start` for `time`.
    pub fn of(
        procs: &[Callers],
        shape: Shape,
        role: &str,
        k: usize,
        start: u64,
        time: Duration,
    ) -> RoleFig {
        let end = start + nanos(time);
        let mine = |caller: u32| shape.role(caller).0 == role;
        let callers: Vec<u32> = (0..(procs.len() * k) as u32).filter(|&c| mine(c)).collect();
        let mut per_caller: Vec<u64> = vec![0; callers.len()];
        let mut acquire = Vec::new();
        let mut entered = 0;
        for s in procs.iter().flat_map(|c| &c.sections) {
            if !mine(s.caller) {
                continue;
            }
            if s.call < end {
                acquire.push(Duration::from_nanos(s.enter - s.call));
            }
            if s.enter < end {
                entered += 1;
                if let Ok(i) = callers.binary_search(&s.caller) {
                    per_caller[i] += 1;
                }
            }
        }
        for x in procs.iter().flat_map(|c| &c.cut) {
            if mine(x.caller) {
                acquire.push(Duration::from_nanos(x.at - x.call));
            }
        }
        acquire.sort_unstable();
        let mut per_proc = vec![0u64; procs.len()];
        for (i, &c) in callers.iter().enumerate() {
            if let Some(n) = per_proc.get_mut(c as usize / k.max(1)) {
                *n += per_caller[i];
            }
        }
        let fairness = ratio(&per_caller);
        let fairness_procs = ratio(&per_proc);
        let mut sorted: Vec<f64> = per_caller.iter().map(|&n| n as f64).collect();
        sorted.sort_unstable_by(f64::total_cmp);
        RoleFig {
            rate: entered as f64 / time.as_secs_f64(),
            per_caller: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
            fairness,
            fairness_procs,
            acquire_p99: quantile(&acquire, 0.99),
            acquire_max: acquire.last().copied().unwrap_or_default(),
        }
    }
}
