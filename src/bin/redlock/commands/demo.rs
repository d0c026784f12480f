//! `redlock demo`: local servers, competing clients doing a non-atomic read-modify-write under
//! the lock, then the same with one node frozen. Its figures' helpers (histograms, the
//! progress bar, the interrupt flag) serve `bench` too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use redis_local::{Cluster, Server};
use redlock_mux::{Builder, Error, Redlock};

use crate::fail::{Fail, code_of, exit};
use crate::parse::{count, parse_duration};
use crate::text::fmt_duration;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How many redis-server processes to start (3 to 15)
    #[arg(long, default_value_t = 5, value_parser = |s: &str| count(s, 3, 15))]
    nodes: u16,
    /// How many competing clients (1 to 64), each with its own connections
    #[arg(long, default_value_t = 8, value_parser = |s: &str| count(s, 1, 64))]
    clients: u16,
    /// How long each of the two phases runs (more than 0)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_phase)]
    duration: Duration,
    /// How long each attempt waits for each node (default: 5% of the TTL, at most 50ms); the
    /// second phase freezes one node, and this is what each attempt loses to it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    node_timeout: Option<Duration>,
}

/// `--duration`: a phase of no time runs no lock cycle, and checks nothing (it would end with
/// "mutual exclusion violated").
fn parse_phase(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => {
            Err("must be longer than 0: a phase of no time runs no lock cycle".into())
        }
        d => Ok(d),
    }
}

/// The lock the demo's clients compete for.
const DEMO_RESOURCE: &str = "redlock-demo:counter";
/// The demo's lock TTL.
const DEMO_TTL: Duration = Duration::from_secs(10);
/// Clients retry after `RETRY_DELAY` plus up to `RETRY_JITTER`: a jitter near the node timeout
/// keeps competing clients from splitting the votes again and again when a node is frozen.
const RETRY_DELAY: Duration = Duration::from_millis(1);
const RETRY_JITTER: Duration = Duration::from_millis(50);
/// The pause between reading and writing the counter: wide enough for a race without the lock.
const CRITICAL_PAUSE: Duration = Duration::from_micros(50);

pub(super) fn histogram() -> Histogram<u64> {
    // Microseconds, 1 µs to an hour, 3 significant digits: these bounds are always valid.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| unreachable!())
}

pub(super) fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

/// `latency  p50  p90  p99  max` rows.
pub(super) fn latency_table(rows: &[(&str, &Histogram<u64>)]) -> String {
    let mut out = format!(
        "  {:<10}{:>11}{:>11}{:>11}{:>11}\n",
        "latency", "p50", "p90", "p99", "max"
    );
    for (name, h) in rows {
        if h.is_empty() {
            out.push_str(&format!("  {name:<10}{:>11}\n", "-"));
            continue;
        }
        out.push_str(&format!(
            "  {name:<10}{:>11}{:>11}{:>11}{:>11}\n",
            ms(h.value_at_quantile(0.50)),
            ms(h.value_at_quantile(0.90)),
            ms(h.value_at_quantile(0.99)),
            ms(h.max())
        ));
    }
    out
}

/// SIGINT, SIGTERM and SIGHUP set the flag (we stop and clean up); a second one ends the process at once.
pub(super) fn interrupt_flag() -> Result<Arc<AtomicBool>, Fail> {
    let flag = Arc::new(AtomicBool::new(false));
    for (signal, code) in [
        (signal_hook::consts::SIGINT, 130),
        (signal_hook::consts::SIGTERM, 143),
        (signal_hook::consts::SIGHUP, 129),
    ] {
        signal_hook::flag::register_conditional_shutdown(signal, code, flag.clone())
            .and_then(|_| signal_hook::flag::register(signal, flag.clone()))
            .map_err(|e| {
                Fail::new(
                    exit::INTERNAL,
                    format!("cannot install signal handlers: {e}"),
                )
            })?;
    }
    Ok(flag)
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(super) fn progress(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("  [{bar:36}] {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// What the clients of one phase share.
#[derive(Default)]
struct Board {
    stop: AtomicBool,
    /// Clients inside the critical section right now.
    inside: AtomicUsize,
    /// Times a client entered while another was inside.
    overlaps: AtomicU64,
    /// The shared counter, updated non-atomically (load, pause, store).
    counter: AtomicU64,
    /// Critical sections run (the counter must equal this).
    entered: AtomicU64,
    /// Critical sections that ended after the lock's validity.
    late: AtomicU64,
}

impl Board {
    /// The non-atomic read-modify-write, with an overlap detector around it.
    fn critical_section(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let value = self.counter.load(Ordering::SeqCst);
        std::thread::sleep(CRITICAL_PAUSE);
        self.counter.store(value + 1, Ordering::SeqCst);
        self.entered.fetch_add(1, Ordering::SeqCst);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One client's figures.
pub(super) struct Tally {
    pub(super) acquire: Histogram<u64>,
    pub(super) release: Histogram<u64>,
    pub(super) cycle: Histogram<u64>,
    pub(super) cycles: u64,
    pub(super) failed: u64,
    pub(super) last_error: Option<Error>,
}

impl Tally {
    pub(super) fn new() -> Tally {
        Tally {
            acquire: histogram(),
            release: histogram(),
            cycle: histogram(),
            cycles: 0,
            failed: 0,
            last_error: None,
        }
    }

    /// One lock cycle: its acquire, release and whole-cycle times, and the release's result.
    pub(super) fn cycle(
        &mut self,
        acquire: Duration,
        release: Duration,
        cycle: Duration,
        released: Result<usize, Error>,
    ) {
        if let Err(e) = released {
            self.failed += 1;
            self.last_error = Some(e);
        }
        record(&mut self.acquire, acquire);
        record(&mut self.release, release);
        record(&mut self.cycle, cycle);
        self.cycles += 1;
    }

    /// Waits for the clients and merges their tallies; `panicked` is the failure if one did.
    pub(super) fn join(
        workers: Vec<ScopedJoinHandle<'_, Tally>>,
        panicked: &'static str,
    ) -> Result<Tally, Fail> {
        let mut total = Tally::new();
        for w in workers {
            let t = w.join().map_err(|_| Fail::new(exit::INTERNAL, panicked))?;
            total.merge(&t);
        }
        Ok(total)
    }

    fn merge(&mut self, other: &Tally) {
        let _ = self.acquire.add(&other.acquire);
        let _ = self.release.add(&other.release);
        let _ = self.cycle.add(&other.cycle);
        self.cycles += other.cycles;
        self.failed += other.failed;
        if other.last_error.is_some() {
            self.last_error.clone_from(&other.last_error);
        }
    }
}

/// A demo client: lock, critical section, unlock, until told to stop.
fn demo_client(r: &Redlock, board: &Board, interrupted: &AtomicBool) -> Tally {
    let mut t = Tally::new();
    while !board.stop.load(Ordering::Relaxed) && !interrupted.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        // Retry in slices, so that a client waiting for the lock notices the end of the phase.
        let lock = loop {
            if board.stop.load(Ordering::Relaxed) || interrupted.load(Ordering::Relaxed) {
                return t;
            }
            match r.lock_until(DEMO_RESOURCE, Instant::now() + Duration::from_millis(200)) {
                Ok(lock) => break Some(lock),
                Err(Error::Held(_) | Error::NoQuorum(_) | Error::TooSlow(_) | Error::Fence(_))
                    if t0.elapsed() < DEMO_TTL => {}
                Err(e) => {
                    t.failed += 1;
                    t.last_error = Some(e);
                    break None;
                }
            }
        };
        let Some(lock) = lock else { continue };
        let t1 = Instant::now();
        board.critical_section();
        if !lock.is_valid() {
            board.late.fetch_add(1, Ordering::SeqCst);
        }
        let t2 = Instant::now();
        let released = r.unlock(lock);
        let t3 = Instant::now();
        t.cycle(t1 - t0, t3 - t2, t3 - t0, released);
    }
    t
}

/// Runs the clients for `duration` with a progress bar; `None` if interrupted.
fn demo_phase(
    handles: &[Redlock],
    duration: Duration,
    interrupted: &AtomicBool,
) -> Result<Option<(Board, Tally, Duration)>, Fail> {
    let board = Board::default();
    let started = Instant::now();
    let total = std::thread::scope(|s| {
        let workers: Vec<_> = handles
            .iter()
            .map(|r| s.spawn(|| demo_client(r, &board, interrupted)))
            .collect();
        let bar = progress(duration.as_millis() as u64);
        loop {
            let elapsed = started.elapsed();
            bar.set_position(elapsed.as_millis() as u64);
            bar.set_message(format!(
                "{:>5.1}s / {}  {} cycles",
                elapsed.as_secs_f64(),
                fmt_duration(duration),
                board.entered.load(Ordering::Relaxed)
            ));
            if elapsed >= duration || interrupted.load(Ordering::Relaxed) {
                break;
            }
            // Screen refresh, not synchronisation: the clients stop at the flag.
            std::thread::sleep((duration - elapsed).min(Duration::from_millis(100)));
        }
        board.stop.store(true, Ordering::SeqCst);
        bar.finish_and_clear();
        Tally::join(workers, "a demo client panicked")
    })?;
    let elapsed = started.elapsed();
    if interrupted.load(Ordering::Relaxed) {
        return Ok(None);
    }
    Ok(Some((board, total, elapsed)))
}

/// The same clients without the lock: how many updates the race loses.
fn unlocked_phase(clients: usize, duration: Duration) -> (u64, u64) {
    let board = Board::default();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                while !board.stop.load(Ordering::Relaxed) {
                    let value = board.counter.load(Ordering::SeqCst);
                    std::thread::sleep(CRITICAL_PAUSE);
                    board.counter.store(value + 1, Ordering::SeqCst);
                    board.entered.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        std::thread::sleep(duration);
        board.stop.store(true, Ordering::SeqCst);
    });
    (
        board.entered.load(Ordering::SeqCst),
        board.counter.load(Ordering::SeqCst),
    )
}

/// Checks one phase and prints its figures; returns what went wrong, if anything (no lock
/// cycle at all is not: the caller tells it apart, it violates nothing).
fn report_phase(board: &Board, t: &Tally, elapsed: Duration) -> Vec<String> {
    let entered = board.entered.load(Ordering::SeqCst);
    let counter = board.counter.load(Ordering::SeqCst);
    let overlaps = board.overlaps.load(Ordering::SeqCst);
    let late = board.late.load(Ordering::SeqCst);
    let rate = entered as f64 / elapsed.as_secs_f64().max(1e-9);
    let mut problems = Vec::new();
    let check = |ok: bool| if ok { "ok" } else { "FAILED" };
    out!(
        "  {entered} lock cycles ({rate:.0}/s)\n  overlapping critical sections: {overlaps} ({})\n  \
         counter: {counter}, expected {entered} ({})",
        check(overlaps == 0),
        check(counter == entered)
    );
    if overlaps != 0 {
        problems.push(format!("{overlaps} overlapping critical sections"));
    }
    if counter != entered {
        problems.push(format!("counter {counter} after {entered} increments"));
    }
    if late != 0 {
        out!("  {late} critical sections ended after the lock's validity");
        problems.push(format!("{late} critical sections outlived the lock"));
    }
    if t.failed > 0 {
        let why = t
            .last_error
            .as_ref()
            .map(|e| format!("; last: {e}"))
            .unwrap_or_default();
        out!(
            "  {} lock operations failed (a client waited {} in vain, or a release failed){why}",
            t.failed,
            fmt_duration(DEMO_TTL)
        );
    }
    out_part!(
        "{}",
        latency_table(&[("acquire", &t.acquire), ("cycle", &t.cycle)])
    );
    problems
}

/// Starts `n` local redis-servers for `demo` or `bench` (on this thread: they die with it).
pub(super) fn local_servers(n: usize) -> Result<Cluster, Fail> {
    let code = |e: &redis_local::Error| match e {
        redis_local::Error::Io { .. } => exit::INTERNAL,
        _ => exit::UNAVAILABLE,
    };
    Cluster::try_start_with(n, Server::builder()).map_err(|e| Fail::new(code(&e), e.to_string()))
}

/// `redis-server 7.0.15`, or just `redis-server` if it does not say.
pub(super) fn version(local: &Cluster) -> String {
    local
        .first()
        .and_then(Server::version)
        .unwrap_or_else(|| "redis-server".into())
}

/// One handle per client, each with its own connections.
fn demo_clients(urls: &[String], a: &DemoArgs) -> Result<Vec<Redlock>, Fail> {
    (0..a.clients)
        .map(|_| {
            let mut b = Builder::new(urls)
                .ttl(DEMO_TTL)
                .quarantine(None)
                .retry_delay(RETRY_DELAY, RETRY_JITTER);
            if let Some(t) = a.node_timeout {
                b = b.node_timeout(t);
            }
            b.build()
        })
        .collect::<Result<Vec<Redlock>, Error>>()
        .map_err(|e| Fail::new(code_of(&e), e.to_string()))
}

/// Starts the servers and the clients, and says what the demo does.
fn set_up(a: &DemoArgs) -> Result<(Cluster, Vec<Redlock>), Fail> {
    let (nodes, clients) = (usize::from(a.nodes), usize::from(a.clients));
    out!(
        "redlock demo: {nodes} local redis-servers, {clients} competing client{}, {} per phase",
        if clients == 1 { "" } else { "s" },
        fmt_duration(a.duration)
    );
    let local = local_servers(nodes)?;
    let ports: Vec<String> = local.ports().iter().map(u16::to_string).collect();
    out!(
        "started {} on 127.0.0.1 ports {}",
        version(&local),
        ports.join(", ")
    );
    out!("the servers are fresh, so the restart quarantine is off (as with --quarantine off)");
    let handles = demo_clients(&local.urls(), a)?;
    out!(
        "each client has its own connections and loops: lock {DEMO_RESOURCE:?} (ttl {}; if it is\n\
         taken, retry after {} to {}), read the shared counter, pause {}µs, write it back\n\
         plus one, unlock\n",
        fmt_duration(DEMO_TTL),
        fmt_duration(RETRY_DELAY),
        fmt_duration(RETRY_DELAY + RETRY_JITTER),
        CRITICAL_PAUSE.as_micros()
    );
    Ok((local, handles))
}

/// The race the lock prevents: the clients without it, for a second at most.
fn show_the_race(a: &DemoArgs) {
    let clients = usize::from(a.clients);
    let warmup = a.duration.min(Duration::from_secs(1));
    let (increments, counter) = unlocked_phase(clients, warmup);
    if clients > 1 {
        out!(
            "first without the lock, for {}: {increments} increments, the counter says \
             {counter}:\n{} updates lost to the race that the lock prevents",
            fmt_duration(warmup),
            increments - counter
        );
    } else {
        out!("(one client: nothing to race with; use --clients 2 or more)");
    }
}

/// Both phases' acquire and cycle latencies, what went wrong in either, and the phases in which
/// no lock cycle ran (with the last error of their clients, if any).
struct Totals {
    acquire: Histogram<u64>,
    cycle: Histogram<u64>,
    problems: Vec<String>,
    idle: Vec<String>,
}

impl Totals {
    fn add(&mut self, phase: &str, (board, tally, elapsed): &(Board, Tally, Duration)) {
        let problems = report_phase(board, tally, *elapsed);
        self.problems
            .extend(problems.into_iter().map(|p| format!("{phase}: {p}")));
        if board.entered.load(Ordering::SeqCst) == 0 {
            let why = tally
                .last_error
                .as_ref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default();
            self.idle.push(format!("{phase}{why}"));
        }
        let _ = self.acquire.add(&tally.acquire);
        let _ = self.cycle.add(&tally.cycle);
    }
}

/// Phase 2: one node frozen with SIGSTOP for the phase; `None` if interrupted.
fn frozen_phase(
    local: &mut Cluster,
    handles: &[Redlock],
    duration: Duration,
    interrupted: &AtomicBool,
) -> Result<Option<(Board, Tally, Duration)>, Fail> {
    let nodes = local.len();
    let frozen = nodes / 2;
    local[frozen].freeze();
    out!(
        "\nphase 2 of 2: node {} frozen with SIGSTOP (connections stay open, no answers);\n\
         the other {} still make a quorum of {}",
        local[frozen].addr(),
        nodes - 1,
        nodes / 2 + 1
    );
    let phase = demo_phase(handles, duration, interrupted);
    local[frozen].resume();
    phase
}

pub fn demo(a: &DemoArgs) -> Result<u8, Fail> {
    let interrupted = interrupt_flag()?;
    let nodes = usize::from(a.nodes);
    let (mut local, handles) = set_up(a)?;
    show_the_race(a);
    let mut totals = Totals {
        acquire: histogram(),
        cycle: histogram(),
        problems: Vec::new(),
        idle: Vec::new(),
    };
    out!(
        "\nphase 1 of 2: all {nodes} nodes up, quorum {}",
        nodes / 2 + 1
    );
    let Some(phase) = demo_phase(&handles, a.duration, &interrupted)? else {
        out!("interrupted; stopping the servers");
        return Ok(exit::INTERRUPTED);
    };
    totals.add("phase 1", &phase);
    let Some(phase) = frozen_phase(&mut local, &handles, a.duration, &interrupted)? else {
        out!("interrupted; stopping the servers");
        return Ok(exit::INTERRUPTED);
    };
    totals.add("phase 2", &phase);
    out!(
        "  (when competing clients split the live nodes' votes, each waits the node timeout\n  \
         for the frozen node before giving up and retrying: hence the longer tail)"
    );
    out!("\nboth phases (acquire includes waiting for the other clients to release):");
    out_part!(
        "{}",
        latency_table(&[("acquire", &totals.acquire), ("cycle", &totals.cycle)])
    );
    out!("stopping the {nodes} servers");
    drop(handles);
    drop(local);
    totals.verdict(a.duration)
}

impl Totals {
    /// What both phases come to: success, nothing put to the test, or the violations.
    fn verdict(&self, duration: Duration) -> Result<u8, Fail> {
        if self.problems.is_empty() && !self.idle.is_empty() {
            // Nothing was violated, and nothing was checked either.
            return Err(Fail::new(
                exit::INTERNAL,
                format!(
                    "demo: no client got the lock in {} (--duration {}): mutual exclusion was \
                     not put to the test (a phase too short for a lock cycle?)",
                    self.idle.join(", "),
                    fmt_duration(duration)
                ),
            ));
        }
        if self.problems.is_empty() {
            out!(
                "ok: no two clients were ever inside the critical section at once, and no \
                 update was lost"
            );
            return Ok(exit::OK);
        }
        Err(Fail::new(
            exit::INTERNAL,
            format!(
                "demo: mutual exclusion violated: {}{}",
                self.problems.join("; "),
                match self.idle.is_empty() {
                    true => String::new(),
                    false => format!("; no client got the lock in {}", self.idle.join(", ")),
                }
            ),
        ))
    }
}
