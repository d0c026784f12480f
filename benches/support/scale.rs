//! The `scale` scenario: K concurrent callers, each cycling acquire + release (one attempt, no
//! retry) on a resource of its own (no contention), for a fixed time or a fixed cycle count.
//!
//! - [`run_mux`]: this crate through its public API, K OS threads sharing ONE
//!   [`redlock_mux::Redlock`] handle.
//! - [`run_mux_async`]: this crate's async API, K tokio tasks sharing ONE
//!   [`redlock_mux::AsyncRedlock`] on a multi-thread runtime with 2 worker threads.
//! - [`run_rslock`]: `rslock` as shipped, K tokio tasks sharing one `LockManager` on a
//!   multi-thread runtime with 2 worker threads.
//! - [`run_floor`]: a hand-rolled pipelined floor on one thread: per batch of K cycles, K
//!   `SET … NX PX` in one write per node, read the K replies per node, then K `EVALSHA` releases
//!   in one write per node, read the replies. A cycle's latency is its batch's duration.
//!
//! Every runner warms up (connects) first, then calls `on_ready` (where a caller can freeze a
//! server), then measures. Latencies are kept in per-caller vectors allocated before the timed
//! part; client CPU is `getrusage(RUSAGE_SELF)` user + sys over the timed part (the servers are
//! other processes).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use redlock_mux::IoStats;

use super::clients::{self, FLOOR_TOKEN_LEN, FloorCycle, Mux, NODE_TIMEOUT, RELEASE, TTL, encode};

/// Warm-up cycles (batches for the floor) per caller before the measurement; the first one
/// connects.
pub const WARMUP: u64 = 3;
/// Upper bound on measured cycles per caller (the time limit normally ends a run first).
pub const MAX_CYCLES_PER_CALLER: u64 = 10_000_000;
/// Latency slots preallocated over all callers of a timed run, per second of run time.
const SLOTS_PER_SECOND: f64 = 100_000.0;

/// When a run ends.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// After this long (each caller finishes the cycle it is in).
    Time(Duration),
    /// After this many cycles per caller (batches for the floor).
    Cycles(u64),
}

/// Outcome of one run of one implementation at one K.
#[derive(Debug, Default)]
pub struct ScaleRun {
    /// Completed cycles: acquired and released.
    pub cycles: u64,
    /// Attempts that did not acquire (or whose release failed).
    pub failed: u64,
    /// From the start signal to the end of the last caller's last cycle.
    pub elapsed: Duration,
    /// Client CPU (user + sys of this process) over the timed part.
    pub cpu: Duration,
    /// One entry per completed cycle, all callers merged, sorted.
    pub latencies: Vec<Duration>,
    /// `false` if some caller had not returned by the hard deadline (its cycles are then
    /// missing from `cycles` and `latencies`; `completed_by_deadline` has them all).
    pub finished: bool,
    /// Cycles completed by the end of the run (counted as they complete, also by callers that
    /// had not returned).
    pub completed_by_deadline: u64,
    /// This crate's own I/O counters (write, read, epoll_wait calls), summed over callers.
    pub io: Option<IoStats>,
}

impl ScaleRun {
    pub fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Client CPU seconds per 1,000 cycles.
    pub fn cpu_per_1000(&self) -> f64 {
        self.cpu.as_secs_f64() * 1000.0 / (self.cycles.max(1) as f64)
    }
}

/// `getrusage(who)`: `RUSAGE_SELF` (this process) or `RUSAGE_THREAD` (the calling thread).
fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: getrusage only writes into the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    }
}

/// User + sys CPU time of this process so far.
pub fn process_cpu() -> Duration {
    let ru = rusage(libc::RUSAGE_SELF);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + sys CPU time so far of other processes (the servers: their share of a cycle), from
/// `/proc/<pid>/stat` (clock ticks: 10 ms on these machines, a 2 s run at about one CPU of
/// servers counts some 200 of them). A process that is gone counts nothing.
pub fn processes_cpu(pids: &[u32]) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks: u64 = pids
        .iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name (which may hold spaces): state is field 3, utime
            // and stime fields 14 and 15.
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    Duration::from_secs_f64(ticks as f64 / tck)
}

/// Raises the soft open-files limit to the hard one if it is below `need`. Returns the old and
/// new soft limit if it raised it.
pub fn ensure_nofile(need: u64) -> Option<(u64, u64)> {
    // SAFETY: getrlimit/setrlimit on our own process with a valid struct.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 || rl.rlim_cur >= need {
            return None;
        }
        let old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        (libc::setrlimit(libc::RLIMIT_NOFILE, &rl) == 0).then_some((old, rl.rlim_max))
    }
}

fn slots_per_caller(k: usize, stop: Stop) -> usize {
    match stop {
        Stop::Time(t) => ((t.as_secs_f64() * SLOTS_PER_SECOND) as usize / k).max(1024),
        Stop::Cycles(n) => n as usize,
    }
}

fn max_cycles(stop: Stop) -> u64 {
    match stop {
        Stop::Time(_) => MAX_CYCLES_PER_CALLER,
        Stop::Cycles(n) => n,
    }
}

/// What one caller hands back.
struct CallerResult {
    latencies: Vec<Duration>,
    failed: u64,
    finished_at: Instant,
    io: Option<IoStats>,
}

/// One caller's measured loop: each cycle timed and counted, done or failed, until `max` cycles
/// or the halt flag; then its result goes to the collector.
struct Caller {
    latencies: Vec<Duration>,
    failed: u64,
    cycles: u64,
    max: u64,
    halt: Arc<AtomicBool>,
    completed: Arc<AtomicU64>,
}

impl Caller {
    /// Room for `slots` latencies, prepared before the clock starts.
    fn new(slots: usize, max: u64, halt: Arc<AtomicBool>, completed: Arc<AtomicU64>) -> Caller {
        Caller {
            latencies: Vec::with_capacity(slots),
            failed: 0,
            cycles: 0,
            max,
            halt,
            completed,
        }
    }

    fn going(&self) -> bool {
        self.cycles < self.max && !self.halt.load(Ordering::Relaxed)
    }

    /// A cycle that started at `t0` ended now, acquired or not.
    #[inline]
    fn record(&mut self, t0: Instant, ok: bool) {
        let d = t0.elapsed();
        if ok {
            self.latencies.push(d);
            self.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed += 1;
        }
        self.cycles += 1;
    }

    fn done(self, tx: &mpsc::Sender<CallerResult>) {
        let _ = tx.send(CallerResult {
            latencies: self.latencies,
            failed: self.failed,
            finished_at: Instant::now(),
            io: None,
        });
    }
}

/// Collects `k` caller results until `hard_deadline`; then CPU and the end of the run.
fn collect(
    rx: &mpsc::Receiver<CallerResult>,
    k: usize,
    start: Instant,
    cpu0: Duration,
    hard_deadline: Instant,
    completed: &AtomicU64,
) -> ScaleRun {
    let mut run = ScaleRun {
        finished: true,
        ..ScaleRun::default()
    };
    let mut last = start;
    let mut got = 0;
    while got < k {
        let left = hard_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(r) => {
                got += 1;
                run.cycles += r.latencies.len() as u64;
                run.failed += r.failed;
                run.latencies.extend_from_slice(&r.latencies);
                last = last.max(r.finished_at);
                if let Some(io) = r.io {
                    let sum = run.io.get_or_insert_with(IoStats::default);
                    sum.writes += io.writes;
                    sum.reads += io.reads;
                    sum.polls += io.polls;
                    sum.connects += io.connects;
                    sum.wakes += io.wakes;
                }
            }
            Err(_) => {
                run.finished = false;
                last = Instant::now();
                break;
            }
        }
    }
    run.cpu = process_cpu().saturating_sub(cpu0);
    run.elapsed = last - start;
    run.completed_by_deadline = completed.load(Ordering::SeqCst);
    run.latencies.sort_unstable();
    run
}

fn io_delta(a: IoStats, b: IoStats) -> IoStats {
    // `IoStats` is `#[non_exhaustive]`: built from its default, field by field.
    let mut d = IoStats::default();
    d.writes = b.writes - a.writes;
    d.reads = b.reads - a.reads;
    d.polls = b.polls - a.polls;
    d.connects = b.connects - a.connects;
    d.wakes = b.wakes - a.wakes;
    d.tls_handshakes = b.tls_handshakes - a.tls_handshakes;
    d.tls_resumed = b.tls_resumed - a.tls_resumed;
    d.tls_round_trips = b.tls_round_trips - a.tls_round_trips;
    d
}

// ---------------------------------------------------------------------------------------------
// this crate: K OS threads, one shared handle
// ---------------------------------------------------------------------------------------------

/// K OS threads sharing one [`redlock_mux::Redlock`]; thread `t` cycles `try_lock` + `unlock`
/// on `{tag}:{t}`. Threads still running at `hard_deadline` after the start are left behind
/// (reported as not finished).
pub fn run_mux(
    urls: &[String],
    k: usize,
    stop: Stop,
    tag: &str,
    hard_limit: Duration,
    nowait: bool,
    on_ready: &mut dyn FnMut(),
) -> ScaleRun {
    let redlock = Mux::builder(urls).build().expect("redlock-mux handle");
    let ready = Arc::new(Barrier::new(k + 1));
    let go = Arc::new(Barrier::new(k + 1));
    let halt = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let slots = slots_per_caller(k, stop);
    let max = max_cycles(stop);
    for t in 0..k {
        let (redlock, ready, go, halt, completed, tx) = (
            redlock.clone(),
            ready.clone(),
            go.clone(),
            halt.clone(),
            completed.clone(),
            tx.clone(),
        );
        let resource = format!("{tag}:{t}");
        std::thread::Builder::new()
            .name(format!("scale-mux-{t}"))
            .spawn(move || {
                // Warm-up: the first call creates this thread's client and connects it.
                let cycle = || match redlock.try_lock(&resource) {
                    Ok(lock) if nowait => {
                        redlock.unlock_nowait(lock);
                        true
                    }
                    Ok(lock) => redlock.unlock(lock).is_ok(),
                    Err(_) => false,
                };
                for _ in 0..WARMUP {
                    cycle();
                }
                let mut caller = Caller::new(slots, max, halt, completed);
                ready.wait();
                go.wait();
                while caller.going() {
                    let t0 = Instant::now();
                    let ok = cycle();
                    caller.record(t0, ok);
                }
                // The engine is shared: its counters are read once for all callers, below.
                caller.done(&tx);
            })
            .expect("spawn caller thread");
    }
    drop(tx);
    ready.wait();
    on_ready();
    let io0 = redlock.stats().io;
    let cpu0 = process_cpu();
    let start = Instant::now();
    go.wait();
    if let Stop::Time(t) = stop {
        std::thread::sleep(t);
        halt.store(true, Ordering::Relaxed);
    }
    let mut run = collect(&rx, k, start, cpu0, start + hard_limit, &completed);
    if run.finished {
        run.io = Some(io_delta(io0, redlock.stats().io));
    }
    run
}

// ---------------------------------------------------------------------------------------------
// rslock: K tokio tasks, one LockManager, 2 worker threads
// ---------------------------------------------------------------------------------------------

/// K tokio tasks on a 2-worker multi-thread runtime sharing one `rslock::LockManager` (one
/// attempt per `lock`); task `t` cycles `lock` + `unlock` on `{tag}:{t}`. Tasks still running
/// at `hard_limit` after the start are dropped with the runtime (reported as not finished).
pub fn run_rslock(
    urls: &[String],
    k: usize,
    stop: Stop,
    tag: &str,
    hard_limit: Duration,
    on_ready: &mut dyn FnMut(),
) -> ScaleRun {
    let rt = two_workers();
    let redis_clients = urls
        .iter()
        .map(|u| redis::Client::open(clients::redis_rs_info(u)).expect("redis client"))
        .collect();
    let mut mgr = rslock::LockManager::from_clients(redis_clients);
    mgr.set_retry(1, Duration::from_millis(1));
    let mgr = Rslock(mgr);
    warm_up(&rt, &mgr, tag);
    let run = spawn_callers(&rt, &mgr, k, stop, tag, hard_limit, on_ready);
    // Drops tasks still waiting on a frozen node.
    rt.shutdown_timeout(Duration::from_secs(2));
    run
}

// ---------------------------------------------------------------------------------------------
// this crate, async: K tokio tasks, one AsyncRedlock, 2 worker threads
// ---------------------------------------------------------------------------------------------

/// The 2-worker multi-thread runtime the async runners use (rslock's too).
pub fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// K tokio tasks on a 2-worker multi-thread runtime sharing one [`redlock_mux::AsyncRedlock`]
/// (the same engine as [`run_mux`], woken through wakers); task `t` cycles `try_lock` +
/// `unlock` on `{tag}:{t}`. The same shape as [`run_rslock`].
pub fn run_mux_async(
    urls: &[String],
    k: usize,
    stop: Stop,
    tag: &str,
    hard_limit: Duration,
    notices: bool,
    on_ready: &mut dyn FnMut(),
) -> ScaleRun {
    let rt = two_workers();
    let redlock = Mux::builder(urls)
        .release_notices(notices)
        .build_async()
        .expect("redlock-mux handle");
    warm_up(&rt, &redlock, tag);
    let io0 = redlock.stats().io;
    let mut run = spawn_callers(&rt, &redlock, k, stop, tag, hard_limit, on_ready);
    if run.finished {
        run.io = Some(io_delta(io0, redlock.stats().io));
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    run
}

/// One async implementation's cycle, for [`spawn_callers`]: acquire `resource` once and release
/// it; `true` if it was acquired.
trait AsyncCycle: Clone + Send + 'static {
    fn cycle(&self, resource: &[u8]) -> impl std::future::Future<Output = bool> + Send;
}

/// rslock's manager, one attempt per `lock`.
#[derive(Clone)]
struct Rslock(rslock::LockManager);

impl AsyncCycle for Rslock {
    async fn cycle(&self, resource: &[u8]) -> bool {
        match self.0.lock(resource, TTL).await {
            Ok(lock) => {
                self.0.unlock(&lock).await;
                true
            }
            Err(_) => false,
        }
    }
}

impl AsyncCycle for redlock_mux::AsyncRedlock {
    async fn cycle(&self, resource: &[u8]) -> bool {
        match self.try_lock(resource).await {
            Ok(lock) => self.unlock(lock).await.is_ok(),
            Err(_) => false,
        }
    }
}

/// Cycles before the clock starts: the connections are the handle's, shared by every task.
fn warm_up<C: AsyncCycle>(rt: &tokio::runtime::Runtime, imp: &C, tag: &str) {
    rt.block_on(async {
        let warm = format!("{tag}:warm");
        for _ in 0..WARMUP {
            imp.cycle(warm.as_bytes()).await;
        }
    });
}

/// K tokio tasks on `rt`, task `t` cycling on `{tag}:{t}` through its clone of `imp` until
/// `stop`; everything a task needs is prepared before the clock starts. Tasks still running at
/// `hard_limit` after the start are reported as not finished (the caller drops them with the
/// runtime).
fn spawn_callers<C: AsyncCycle>(
    rt: &tokio::runtime::Runtime,
    imp: &C,
    k: usize,
    stop: Stop,
    tag: &str,
    hard_limit: Duration,
    on_ready: &mut dyn FnMut(),
) -> ScaleRun {
    let halt = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let slots = slots_per_caller(k, stop);
    let max = max_cycles(stop);
    let tasks: Vec<_> = (0..k)
        .map(|t| {
            (
                imp.clone(),
                format!("{tag}:{t}").into_bytes(),
                Caller::new(slots, max, halt.clone(), completed.clone()),
                tx.clone(),
            )
        })
        .collect();
    drop(tx);
    on_ready();
    let cpu0 = process_cpu();
    let start = Instant::now();
    for (imp, resource, mut caller, tx) in tasks {
        rt.spawn(async move {
            while caller.going() {
                let t0 = Instant::now();
                let ok = imp.cycle(&resource).await;
                caller.record(t0, ok);
            }
            caller.done(&tx);
        });
    }
    if let Stop::Time(t) = stop {
        std::thread::sleep(t);
        halt.store(true, Ordering::Relaxed);
    }
    collect(&rx, k, start, cpu0, start + hard_limit, &completed)
}

/// How long single polls of the locking tasks' futures took: 1 µs buckets up to 1 ms, and the
/// longest poll exactly. A poll is the time the library holds an executor's worker thread.
#[derive(Clone, Debug)]
pub struct PollTimes {
    /// `us[i]`: polls that took `i` µs (rounded down); the last bucket counts 1 ms and more.
    pub us: Vec<u64>,
    pub max: Duration,
}

impl PollTimes {
    const BUCKETS: usize = 1001;

    pub fn new() -> PollTimes {
        PollTimes {
            us: vec![0; Self::BUCKETS],
            max: Duration::ZERO,
        }
    }

    fn record(&mut self, d: Duration) {
        let i = (d.as_micros() as usize).min(Self::BUCKETS - 1);
        self.us[i] += 1;
        self.max = self.max.max(d);
    }

    pub fn merge(&mut self, other: &PollTimes) {
        for (a, b) in self.us.iter_mut().zip(&other.us) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    /// Polls recorded.
    pub fn count(&self) -> u64 {
        self.us.iter().sum()
    }

    /// The `q` quantile, to the µs bucket's upper edge (1 ms and more: the longest poll).
    pub fn quantile(&self, q: f64) -> Duration {
        let want = (self.count() as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.us.iter().enumerate() {
            seen += n;
            if seen >= want.max(1) {
                if i == Self::BUCKETS - 1 {
                    return self.max;
                }
                return Duration::from_micros(i as u64 + 1).min(self.max);
            }
        }
        self.max
    }
}

impl Default for PollTimes {
    fn default() -> PollTimes {
        PollTimes::new()
    }
}

/// Awaits `fut`, timing each of its polls into `times`.
async fn timed<F: std::future::Future>(fut: F, times: &mut PollTimes) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let diagnose = *DIAGNOSE_POLLS;
    std::future::poll_fn(|cx| {
        let before = diagnose.then(thread_switches);
        let t = Instant::now();
        let r = fut.as_mut().poll(cx);
        let took = t.elapsed();
        times.record(took);
        if let Some((vol, invol)) = before
            && took >= LONG_POLL
        {
            let (vol2, invol2) = thread_switches();
            LONG_POLLS[0].fetch_add(1, Ordering::Relaxed);
            LONG_POLLS[1].fetch_add(u64::from(vol2 > vol), Ordering::Relaxed);
            LONG_POLLS[2].fetch_add(u64::from(invol2 > invol), Ordering::Relaxed);
        }
        r
    })
    .await
}

/// `BENCH_DIAGNOSE_POLLS=1`: for each poll of [`LONG_POLL`] or more, whether its thread was
/// switched out meanwhile, blocked (a voluntary switch: a lock, a syscall that waits) or
/// preempted (involuntary): printed after each lateness run. Costs a `getrusage` per poll.
static DIAGNOSE_POLLS: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("BENCH_DIAGNOSE_POLLS").is_some());
const LONG_POLL: Duration = Duration::from_micros(200);
/// Long polls: all, with a voluntary switch, with an involuntary one.
static LONG_POLLS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// This thread's voluntary and involuntary context switches so far.
fn thread_switches() -> (i64, i64) {
    let ru = rusage(libc::RUSAGE_THREAD);
    (ru.ru_nvcsw, ru.ru_nivcsw)
}

/// What [`ticker_lateness`] measured.
pub struct Lateness {
    /// How late each tick ran, sorted.
    pub ticks: Vec<Duration>,
    /// The locking tasks' polls (none without lockers).
    pub polls: PollTimes,
}

/// How late a tokio task that ticks every millisecond runs while `k` tasks lock through `imp`
/// on the same 2-worker runtime (one server frozen by `on_ready`): the executor's worker threads
/// must never be held up by the library. Also times every poll of the locking tasks' futures:
/// how long the library itself holds a worker thread each time, whatever else keeps it busy.
pub fn ticker_lateness(
    urls: &[String],
    k: usize,
    time: Duration,
    tag: &str,
    rslock: bool,
    on_ready: &mut dyn FnMut(),
) -> Lateness {
    let polls = Arc::new(std::sync::Mutex::new(PollTimes::new()));
    let mut lockers = Vec::with_capacity(k);
    let rt = two_workers();
    let halt = Arc::new(AtomicBool::new(false));
    if rslock {
        let redis_clients = urls
            .iter()
            .map(|u| redis::Client::open(clients::redis_rs_info(u)).expect("redis client"))
            .collect();
        let mut mgr = rslock::LockManager::from_clients(redis_clients);
        mgr.set_retry(1, Duration::from_millis(1));
        rt.block_on(async {
            let _ = mgr.lock(format!("{tag}:warm").as_bytes(), TTL).await;
        });
        on_ready();
        for t in 0..k {
            let (mgr, halt, resource) = (mgr.clone(), halt.clone(), format!("{tag}:{t}"));
            let (all, mut mine) = (polls.clone(), PollTimes::new());
            lockers.push(rt.spawn(async move {
                while !halt.load(Ordering::Relaxed) {
                    if let Ok(lock) = timed(mgr.lock(resource.as_bytes(), TTL), &mut mine).await {
                        timed(mgr.unlock(&lock), &mut mine).await;
                    }
                }
                all.lock().unwrap().merge(&mine);
            }));
        }
    } else {
        let redlock = Mux::builder(urls)
            .build_async()
            .expect("redlock-mux handle");
        rt.block_on(async {
            let _ = redlock.try_lock(format!("{tag}:warm")).await;
        });
        on_ready();
        for t in 0..k {
            let (redlock, halt, resource) = (redlock.clone(), halt.clone(), format!("{tag}:{t}"));
            let (all, mut mine) = (polls.clone(), PollTimes::new());
            lockers.push(rt.spawn(async move {
                while !halt.load(Ordering::Relaxed) {
                    if let Ok(lock) = timed(redlock.try_lock(&resource), &mut mine).await {
                        let _ = timed(redlock.unlock(lock), &mut mine).await;
                    }
                }
                all.lock().unwrap().merge(&mine);
            }));
        }
    }
    let ticks = rt.block_on(rt.spawn(async move {
        let mut late = Vec::with_capacity(time.as_millis() as usize + 16);
        let end = Instant::now() + time;
        let mut next = Instant::now() + Duration::from_millis(1);
        while next < end {
            tokio::time::sleep_until(next.into()).await;
            late.push(Instant::now().saturating_duration_since(next));
            next += Duration::from_millis(1);
        }
        late
    }));
    halt.store(true, Ordering::Relaxed);
    // Tasks in a cycle finish it (rslock's within its 1 s timeout on the frozen node) and
    // merge their polls; one still running after 3 s is left out.
    let bound = tokio::time::Instant::now() + Duration::from_secs(3);
    rt.block_on(async {
        for locker in lockers {
            let _ = tokio::time::timeout_at(bound, locker).await;
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    let mut ticks = ticks.expect("the ticker task");
    ticks.sort_unstable();
    let polls = polls.lock().unwrap().clone();
    if *DIAGNOSE_POLLS {
        let [all, vol, invol] = LONG_POLLS.each_ref().map(|c| c.swap(0, Ordering::Relaxed));
        eprintln!(
            "bench_table: polls of {LONG_POLL:?} or more: {all}; blocked meanwhile: {vol}; preempted meanwhile: {invol}"
        );
    }
    Lateness { ticks, polls }
}

// ---------------------------------------------------------------------------------------------
// floor: one thread, K cycles per batch, pipelined
// ---------------------------------------------------------------------------------------------

struct BatchNode {
    sock: TcpStream,
    buf: Vec<u8>,
    len: usize,
    /// Replies still owed for commands of earlier phases (discarded when they come).
    stale: usize,
    /// Replies owed for the current phase.
    pending: usize,
    /// A write failed or the connection closed: left out for good.
    dead: bool,
}

/// The pipelined floor: `SET` ×K in one write per node, read K replies per node, then
/// `EVALSHA` ×K in one write per node, read K replies per node.
///
/// Blocking sockets with a read timeout of [`NODE_TIMEOUT`]: a node that sends nothing for that
/// long is not waited for in this phase; its replies still owed are discarded when they come
/// (drained without blocking at the start of each phase), and it gets no new commands until
/// it has caught up — so a frozen node costs one timeout, not one per batch, and its socket
/// buffers do not fill. A healthy node is waited for, as the one-cycle `Floor` does.
pub struct FloorBatch {
    nodes: Vec<BatchNode>,
    k: usize,
    quorum: usize,
    set: Vec<u8>,
    set_tokens: Vec<usize>,
    release: Vec<u8>,
    release_tokens: Vec<usize>,
    /// `OK`s per cycle of the current batch.
    ok: Vec<u16>,
    rng: u64,
}

const BATCH_BUF: usize = 1 << 16;

impl FloorBatch {
    /// Connects to `urls`, loads the release script, and pre-encodes K `SET`s and K releases
    /// on resources `{tag}:0` … `{tag}:{K-1}`.
    pub fn new(urls: &[String], k: usize, tag: &str) -> FloorBatch {
        let mut nodes = Vec::new();
        let mut sha = String::new();
        for url in urls {
            let mut s = TcpStream::connect(clients::socket_addr(url)).expect("floor: connect");
            s.set_nodelay(true).expect("nodelay");
            s.write_all(&encode(&[b"SCRIPT", b"LOAD", RELEASE.as_bytes()]))
                .expect("floor: script load");
            let mut got = Vec::new();
            let mut buf = [0u8; 128];
            while got.len() < 47 {
                let n = s.read(&mut buf).expect("floor: read sha");
                assert!(n > 0, "floor: closed");
                got.extend_from_slice(&buf[..n]);
            }
            sha = String::from_utf8_lossy(&got[5..45]).into_owned();
            s.set_read_timeout(Some(NODE_TIMEOUT))
                .expect("read timeout");
            s.set_write_timeout(Some(NODE_TIMEOUT))
                .expect("write timeout");
            nodes.push(BatchNode {
                sock: s,
                buf: vec![0; BATCH_BUF],
                len: 0,
                stale: 0,
                pending: 0,
                dead: false,
            });
        }
        let (mut set, mut set_tokens) = (Vec::new(), Vec::with_capacity(k));
        let (mut release, mut release_tokens) = (Vec::new(), Vec::with_capacity(k));
        for i in 0..k {
            let cycle = FloorCycle::new(&format!("{tag}:{i}"), &sha);
            set_tokens.push(set.len() + cycle.set_token);
            set.extend_from_slice(&cycle.set);
            release_tokens.push(release.len() + cycle.release_token);
            release.extend_from_slice(&cycle.release);
        }
        FloorBatch {
            quorum: nodes.len() / 2 + 1,
            nodes,
            k,
            set,
            set_tokens,
            release,
            release_tokens,
            ok: vec![0; k],
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Bytes written per node per batch: (SETs, releases).
    pub fn batch_bytes(&self) -> (usize, usize) {
        (self.set.len(), self.release.len())
    }

    /// One batch of K cycles; returns how many acquired a quorum.
    pub fn batch(&mut self) -> usize {
        // Fresh tokens (xorshift, printable), as the one-cycle floor.
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        for i in 0..self.k {
            let (s, r) = (self.set_tokens[i], self.release_tokens[i]);
            for j in 0..FLOOR_TOKEN_LEN {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let c = ALPHABET[(self.rng & 63) as usize];
                self.set[s + j] = c;
                self.release[r + j] = c;
            }
        }
        self.ok.fill(0);
        self.phase(false);
        let won = self
            .ok
            .iter()
            .filter(|&&n| n as usize >= self.quorum)
            .count();
        self.phase(true);
        won
    }

    fn phase(&mut self, release: bool) {
        let msg = if release { &self.release } else { &self.set };
        let k = self.k;
        for node in &mut self.nodes {
            node.stale += node.pending;
            node.pending = 0;
            if node.dead {
                continue;
            }
            if node.stale > 0 {
                // Behind: take what has come without waiting.
                drain_nonblocking(node, &mut self.ok, k, release);
                if node.stale > 0 || node.dead {
                    continue;
                }
            }
            if node.sock.write_all(msg).is_err() {
                node.dead = true;
                continue;
            }
            node.pending = k;
        }
        for node in &mut self.nodes {
            while node.pending > 0 && !node.dead {
                match node.sock.read(&mut node.buf[node.len..]) {
                    Ok(0) => node.dead = true,
                    Ok(n) => {
                        node.len += n;
                        take_replies(node, &mut self.ok, k, release);
                    }
                    // Nothing for NODE_TIMEOUT: not waited for any longer in this phase.
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => node.dead = true,
                }
            }
        }
    }
}

/// Reads whatever a behind node has sent, without blocking.
fn drain_nonblocking(node: &mut BatchNode, ok: &mut [u16], k: usize, release: bool) {
    let fd = node.sock.as_raw_fd();
    for _ in 0..64 {
        let free = &mut node.buf[node.len..];
        // SAFETY: recv into our own buffer, within its length.
        let n = unsafe { libc::recv(fd, free.as_mut_ptr().cast(), free.len(), libc::MSG_DONTWAIT) };
        match n {
            0 => {
                node.dead = true;
                return;
            }
            n if n < 0 => return,
            n => {
                node.len += n as usize;
                take_replies(node, ok, k, release);
                if node.stale == 0 {
                    return;
                }
            }
        }
    }
}

/// Consumes the complete replies in `node.buf` (every reply to `SET … NX PX` and to the
/// release script is one line: `+OK`, `$-1`, `:1`, `:0` or `-ERR …`).
fn take_replies(node: &mut BatchNode, ok: &mut [u16], k: usize, release: bool) {
    let mut at = 0;
    while let Some(nl) = node.buf[at..node.len].iter().position(|&b| b == b'\n') {
        let first = node.buf[at];
        at += nl + 1;
        if node.stale > 0 {
            node.stale -= 1;
        } else if node.pending > 0 {
            let slot = k - node.pending;
            if !release && first == b'+' {
                ok[slot] += 1;
            }
            node.pending -= 1;
        }
    }
    node.buf.copy_within(at..node.len, 0);
    node.len -= at;
}

/// The floor on one thread (the calling one): batches of K cycles until `stop`.
pub fn run_floor(
    urls: &[String],
    k: usize,
    stop: Stop,
    tag: &str,
    on_ready: &mut dyn FnMut(),
) -> ScaleRun {
    let mut floor = FloorBatch::new(urls, k, tag);
    for _ in 0..WARMUP {
        floor.batch();
    }
    let max = max_cycles(stop);
    let slots = match stop {
        Stop::Time(t) => (t.as_secs_f64() * SLOTS_PER_SECOND) as usize / k + 1024,
        Stop::Cycles(n) => n as usize,
    };
    // (batch duration, cycles of the batch that acquired)
    let mut batches: Vec<(Duration, u32)> = Vec::with_capacity(slots);
    on_ready();
    let cpu0 = process_cpu();
    let start = Instant::now();
    let deadline = match stop {
        Stop::Time(t) => Some(start + t),
        Stop::Cycles(_) => None,
    };
    let mut failed = 0u64;
    let mut now = start;
    let mut n = 0;
    while n < max && deadline.is_none_or(|d| now < d) {
        let won = floor.batch();
        let end = Instant::now();
        batches.push((end - now, won as u32));
        failed += (k - won) as u64;
        now = end;
        n += 1;
    }
    let cpu = process_cpu().saturating_sub(cpu0);
    let elapsed = now - start;
    let mut latencies: Vec<Duration> = batches
        .iter()
        .flat_map(|&(d, won)| std::iter::repeat_n(d, won as usize))
        .collect();
    latencies.sort_unstable();
    let cycles = latencies.len() as u64;
    ScaleRun {
        cycles,
        failed,
        elapsed,
        cpu,
        latencies,
        finished: true,
        completed_by_deadline: cycles,
        io: None,
    }
}
