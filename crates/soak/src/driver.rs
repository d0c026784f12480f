//! The driver: 5 local servers (`redis-local`), the worker processes, and seeded faults for a
//! bounded time, never more than [`MAX_FAULTY`] of the servers faulty at once; then the faults
//! heal, the workers stop (their stdin closed) and their results are read.
//!
//! Faults, one node each, chosen by the seed among the healthy nodes:
//!
//! | fault | what | its effect ends |
//! |---|---|---|
//! | `SIGSTOP` | frozen for 50 ms – 3 s, then `SIGCONT` | at the `SIGCONT` |
//! | `SIGKILL` + restart | killed, down 100 ms – 2 s, restarted on the same port (empty: no persistence) | when the restarted server answers |
//! | `CLIENT KILL` | `CLIENT KILL TYPE normal`, then `TYPE pubsub` (a connection with subscriptions is of type pubsub): every client connection closed | at once |
//! | `DEBUG SLEEP 0.5` | the server blocks for 0.5 s | after 0.5 s |
//! | `SCRIPT FLUSH` | the scripts forgotten (`NOSCRIPT` → `EVAL`) | at once |
//!
//! **When a node is faulty.** From the fault's start until the node is usable again by every
//! worker, as far as the driver can see:
//!
//! 1. its effect has ended, and [`SETTLE`] has passed (the node runs what queued up meanwhile —
//!    late `SET`s and the releases behind them — and drops the connections clients closed);
//! 2. every worker has a connection on it again: `CLIENT LIST` shows one named
//!    `soak-worker-<p>` for each (the name is set in the handshake). A client whose connection
//!    failed during the fault (refused, or `Overloaded`: 1024 requests waiting on a frozen
//!    node) reconnects at the end of its backoff, up to the backoff ceiling (2 s) after the
//!    node is back: until then the node is as good as down for that client;
//! 3. after a restart, a quarantine window (one TTL) has passed since the *last* worker's new
//!    connection appeared: a client quarantines a restarted node from the moment it notices the
//!    new `run_id`, on its new connection;
//! 4. after a restart, the node's fence counter (`redlock:fence`, field `run`) names its new
//!    `run_id` again: fencing's assumption A2 (docs/fencing.md) wants a majority of the nodes
//!    seeded, and fenced acquires need that majority reachable, or they fail with
//!    `Error::Fence`.
//!
//! Counting a node as healthy as soon as its fault's effect ends would not keep "at most 2 of 5"
//! in the clients' view: a node back from a freeze may be backing off in every client for two
//! more seconds, while the driver faults two others — and so on, without end. The time from a
//! fault's end to step 2 is reported (*recovery*) and checked against its own bound,
//! [`recovery_bound`]. A node whose recovery does not complete within [`RECOVERY_LIMIT`] is
//! reported as a problem (and then no longer kept out).
//!
//! The fault schedule is seeded; when each fault lands against the workers' operations is
//! not (real processes, real time), so a seed repeats the faults, not the run.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use redis_local::{Cluster, Server};

use super::worker::{self, WorkerConfig, WorkerResult};
use super::{MAX_FAULTY, NODES, Rng, RunConfig, SETTLE, client_config, mono_ns};

/// The fault kinds (`FAULT_KINDS[kind]`).
pub const FAULT_KINDS: [&str; 5] = [
    "SIGSTOP",
    "SIGKILL+restart",
    "CLIENT KILL",
    "DEBUG SLEEP 0.5",
    "SCRIPT FLUSH",
];
pub const STOP: u8 = 0;
pub const KILL: u8 = 1;
pub const CLIENT_KILL: u8 = 2;
pub const DEBUG_SLEEP: u8 = 3;
pub const SCRIPT_FLUSH: u8 = 4;

/// A freeze lasts 50 ms – 3 s.
const FREEZE_MS: (u64, u64) = (50, 3_000);
/// A killed node stays down 100 ms – 2 s before it is restarted.
const DOWN_MS: (u64, u64) = (100, 2_000);
/// `DEBUG SLEEP 0.5`.
const DEBUG_SLEEP_TIME: Duration = Duration::from_millis(500);
/// Time between two fault injections (when a node may be made faulty): 100 ms – 1 s.
const BETWEEN_FAULTS_MS: (u64, u64) = (100, 1_000);
/// A node not usable again (reconnected by every worker, quarantine over, seeded) this long
/// after its fault's effect ended is reported.
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(20);
/// How often a recovering node's client list and fence counter are read: they change when the
/// workers reconnect and when a fenced acquire writes the counter, of which the driver cannot
/// be told.
pub const POLL: Duration = Duration::from_millis(50);
/// The driver's loop wakes at least this often (to start the next fault).
const TICK: Duration = Duration::from_millis(20);
/// Workers must be connected and running within this.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Workers must have finished (current operations, the final shutdown, the results) within
/// this after their stdin closed: an operation takes at most a `lock()` wait (4 s) and a kept
/// hold (3 s), the shutdown 5 s.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Reading the reply of `DEBUG SLEEP` gives up after this.
const DEBUG_SLEEP_REPLY: Duration = Duration::from_secs(10);

/// The longest a worker may take to be connected to a node again once the node's fault is
/// over ([`SETTLE`] after its effect ended): the end of its reconnect backoff (at most the
/// ceiling) plus a connect and handshake (at most the connect timeout), plus the driver's
/// polling.
pub fn recovery_bound() -> Duration {
    let client = client_config();
    SETTLE + client.backoff_max + client.connect_timeout + POLL
}

/// One fault injected. Times are `mono_ns`.
#[derive(Debug, Clone)]
pub struct Fault {
    pub node: usize,
    pub kind: u8,
    /// When it began.
    pub start: u64,
    /// When its effect ended: the `SIGCONT`, the restarted server's readiness, the end of the
    /// sleep; `start` for the instant ones.
    pub effect_end: u64,
    /// When every worker was connected to the node again (0: not seen).
    pub reconnected: u64,
    /// After a restart: when its fence counter was seen seeded (0: not seen).
    pub seeded: u64,
    /// When the node stopped counting as faulty.
    pub slot_end: u64,
    /// The freeze's or the downtime's length as planned.
    pub length: Duration,
    /// Still faulty when the run ended (its `slot_end` is the run's end).
    pub open: bool,
}

impl Fault {
    /// How long its effect lasted: the freeze from `SIGSTOP` to `SIGCONT`, the downtime from
    /// `SIGKILL` to the restarted server's readiness, the sleep; zero for the instant ones.
    pub fn effect(&self) -> Duration {
        Duration::from_nanos(self.effect_end.saturating_sub(self.start))
    }

    /// From the end of its effect until every worker was connected again.
    pub fn recovery(&self) -> Option<Duration> {
        (self.reconnected > 0)
            .then(|| Duration::from_nanos(self.reconnected.saturating_sub(self.effect_end)))
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunResult {
    pub config: RunConfig,
    pub workers: Vec<WorkerResult>,
    pub faults: Vec<Fault>,
    /// When the workers were all running and faults began (`mono_ns`).
    pub started: u64,
    /// When faults ended and the workers were told to stop.
    pub ended: u64,
    /// Things the driver saw go wrong with itself or the servers (a node that did not recover,
    /// an admin command refused): each one fails the run.
    pub problems: Vec<String>,
    /// The most servers faulty at once (at most [`MAX_FAULTY`]).
    pub most_faulty: usize,
    /// Steps of the wall clock against the monotonic clock while the workers ran
    /// ([`ClockSteps`]).
    pub clock_steps: Vec<ClockStep>,
}

/// A step of the wall clock (`CLOCK_REALTIME`, by which Redis expires keys) against the
/// monotonic clock (`CLOCK_MONOTONIC`, by which the clients count validity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockStep {
    /// When it was seen (`mono_ns`).
    pub at: u64,
    /// How far the wall clock moved against the monotonic clock between two samples, in ns:
    /// positive, forward (keys expire that much early on a server of this machine).
    pub step: i64,
}

/// How far apart [`ClockSteps`] samples the two clocks.
pub const CLOCK_SAMPLE: Duration = Duration::from_millis(5);

/// The longest the two readings of the monotonic clock around a reading of the wall clock may
/// be apart for the sample to count ([`ClockSteps::watch`]).
pub const CLOCK_READ: Duration = Duration::from_micros(100);

/// The smallest move between two samples that counts as a step: NTP's slew (at most 500 ppm)
/// moves the wall clock 2.5 µs in a [`CLOCK_SAMPLE`]; a step (a VM resumed from a snapshot and
/// its clock set again, `date -s`, an NTP step) moves it at once.
pub const CLOCK_STEP: Duration = Duration::from_millis(2);

/// Finds steps of the wall clock against the monotonic clock in samples of both. The soak's
/// servers and workers share this machine's clocks: a forward step makes every server expire
/// its keys early by that much while the clients, counting validity on the monotonic clock,
/// still believe their locks — a server clock jump on every node at once, outside Redlock's
/// assumptions. Recorded so that an overlap can be set beside it.
#[derive(Debug, Default)]
pub struct ClockSteps {
    last: Option<i128>,
    pub steps: Vec<ClockStep>,
}

impl ClockSteps {
    /// One sample: the wall clock and the monotonic clock, in ns, read back to back.
    pub fn sample(&mut self, real_ns: i128, mono: u64) {
        let d = real_ns - i128::from(mono);
        if let Some(last) = self.last {
            let step = d - last;
            if step.unsigned_abs() > CLOCK_STEP.as_nanos() {
                self.steps.push(ClockStep {
                    at: mono,
                    step: step.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
                });
            }
        }
        self.last = Some(d);
    }

    /// Samples every [`CLOCK_SAMPLE`] on a thread of its own until [`ClockWatch::finish`] (or
    /// the watch's drop).
    pub fn watch() -> ClockWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut steps = ClockSteps::default();
            while !flag.load(Ordering::Relaxed) {
                // The wall clock read between two readings of the monotonic clock, kept only if
                // they are close: a thread preempted between its two reads (milliseconds on this
                // loaded 2-core machine) would see the wall clock step back, then forward again.
                let before = mono_ns();
                let real = realtime_ns();
                let after = mono_ns();
                if after - before <= CLOCK_READ.as_nanos() as u64 {
                    steps.sample(real, before + (after - before) / 2);
                }
                std::thread::sleep(CLOCK_SAMPLE);
            }
            steps.steps
        });
        ClockWatch {
            stop,
            thread: Some(thread),
        }
    }
}

/// The thread of [`ClockSteps::watch`]; dropped, it stops.
pub struct ClockWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<ClockStep>>>,
}

impl ClockWatch {
    /// Stops the watch: the steps it saw.
    pub fn finish(mut self) -> Vec<ClockStep> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ClockWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `CLOCK_REALTIME` now, in ns since 1970.
fn realtime_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_REALTIME)");
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// Where a node is in its fault.
#[derive(Debug)]
enum State {
    Healthy,
    /// Its fault's effect lasts until `until` (a freeze, a downtime, a sleep).
    Effect {
        until: Instant,
        fault: usize,
    },
    /// The effect is over since `over`: waiting for the workers, the quarantine, the seeding.
    Recovering {
        fault: usize,
        over: Instant,
        polled: Option<Instant>,
        /// After a restart: the new `run_id`, and when each worker's new connection was first
        /// seen.
        restart: Option<(String, Vec<Option<Instant>>)>,
    },
}

/// Runs the soak: servers, workers (each made by `worker_command`, to which the worker's
/// settings are added as the environment variable [`worker::ENV`]), faults, results.
///
/// # Errors
///
/// The servers could not be started (no `redis-server`: the message says how to install it),
/// a worker did not start, stop or write its results in time.
pub fn run(cfg: &RunConfig, worker_command: &dyn Fn() -> Command) -> Result<RunResult, String> {
    let client = client_config();
    let window = client.quarantine_window().unwrap_or(Duration::ZERO);
    let mut servers = Cluster::try_start_with(
        NODES,
        Server::builder().arg("--enable-debug-command").arg("yes"),
    )
    .map_err(|e| format!("starting {NODES} redis-servers: {e}"))?;
    // The workers' quarantine: a node seen for the first time counts once it has surely been up
    // the window — its uptime, which Redis rounds up by up to a second, read a second short —
    // so servers must say a second more than the window; younger ones refuse every quorum.
    for s in servers.iter() {
        s.wait_uptime(window.as_secs_f64().ceil() as u64 + 1);
    }
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let records = match &cfg.keep {
        Some(keep) => {
            std::fs::create_dir_all(keep).map_err(|e| format!("{}: {e}", keep.display()))?;
            keep.clone()
        }
        None => dir.path().into(),
    };
    let clock_watch = ClockSteps::watch();
    let mut workers = Workers::start(cfg, &servers.urls(), records, worker_command)?;
    workers.wait_ready()?;

    let mut faults = Faults {
        states: (0..NODES).map(|_| State::Healthy).collect(),
        log: Vec::new(),
        problems: Vec::new(),
        most_faulty: 0,
        window,
        fencing: client.fencing,
        processes: cfg.processes,
        verbose: cfg.verbose,
        t0: Instant::now(),
    };
    let mut rng = Rng::new(cfg.seed, u64::MAX);
    let started = mono_ns();
    let end = faults.t0 + cfg.duration;
    let mut next_fault = faults.t0 + rng.millis(BETWEEN_FAULTS_MS.0, BETWEEN_FAULTS_MS.1);
    loop {
        let now = Instant::now();
        let over = now >= end;
        for node in 0..NODES {
            faults.advance(&mut servers[node], node, over);
        }
        if over {
            break;
        }
        if now >= next_fault && faults.faulty() < MAX_FAULTY {
            faults.inject(&mut servers, &mut rng);
            next_fault = now + rng.millis(BETWEEN_FAULTS_MS.0, BETWEEN_FAULTS_MS.1);
        }
        // Sleeping until the schedule's next moment: the schedule is time itself.
        let wake = faults.next_wake().min(next_fault).min(end).min(now + TICK);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
    let ended = mono_ns();
    // The faults have healed (`advance` resumed the frozen nodes and restarted the killed ones
    // once the time was over); now the workers stop.
    let results = workers.stop()?;
    let clock_steps = clock_watch.finish();
    // Nodes still counting as faulty end their slot with the run.
    for f in &mut faults.log {
        if f.slot_end == 0 {
            f.slot_end = ended;
            f.open = true;
        }
    }
    let mut problems = faults.problems;
    problems.append(&mut REFUSED_SLEEPS.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(RunResult {
        config: cfg.clone(),
        workers: results,
        faults: faults.log,
        started,
        ended,
        problems,
        most_faulty: faults.most_faulty,
        clock_steps,
    })
}

/// The nodes' fault states and the log of faults.
struct Faults {
    states: Vec<State>,
    log: Vec<Fault>,
    problems: Vec<String>,
    most_faulty: usize,
    /// The workers' quarantine window.
    window: Duration,
    /// The workers fence their locks: a restarted node is usable again once its counter is
    /// seeded (without fencing — `SOAK_FAIR=1` — once its quarantine is over).
    fencing: bool,
    processes: usize,
    verbose: bool,
    t0: Instant,
}

impl Faults {
    fn faulty(&self) -> usize {
        self.states
            .iter()
            .filter(|s| !matches!(s, State::Healthy))
            .count()
    }

    /// The earliest moment a state may change.
    fn next_wake(&self) -> Instant {
        let far = Instant::now() + TICK;
        self.states
            .iter()
            .map(|s| match s {
                State::Healthy => far,
                State::Effect { until, .. } => *until,
                State::Recovering { over, polled, .. } => polled.map_or(*over, |p| p + POLL),
            })
            .min()
            .unwrap_or(far)
    }

    fn say(&self, node: usize, what: &str) {
        if self.verbose {
            let at = self.t0.elapsed().as_secs_f64();
            eprintln!("soak: {at:7.3} s  node {node}  {what}");
        }
    }

    /// Makes a healthy node, chosen by `rng`, faulty with a fault chosen by `rng`.
    fn inject(&mut self, servers: &mut Cluster, rng: &mut Rng) {
        let healthy: Vec<usize> = (0..NODES)
            .filter(|&n| matches!(self.states[n], State::Healthy))
            .collect();
        let node = healthy[rng.below(healthy.len() as u64) as usize];
        let kind = rng.below(FAULT_KINDS.len() as u64) as u8;
        let server = &mut servers[node];
        let now = Instant::now();
        let start = mono_ns();
        let fault = self.log.len();
        let length = match kind {
            STOP => rng.millis(FREEZE_MS.0, FREEZE_MS.1),
            KILL => rng.millis(DOWN_MS.0, DOWN_MS.1),
            DEBUG_SLEEP => DEBUG_SLEEP_TIME,
            _ => Duration::ZERO,
        };
        let done = match kind {
            STOP => {
                server.freeze();
                Ok(())
            }
            KILL => {
                server.kill();
                Ok(())
            }
            CLIENT_KILL => admin(
                server,
                &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
            )
            .and_then(|_| {
                admin(
                    server,
                    &["CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes"],
                )
            })
            .map(drop),
            DEBUG_SLEEP => debug_sleep(node, server),
            SCRIPT_FLUSH => admin(server, &["SCRIPT", "FLUSH"]).map(drop),
            _ => unreachable!("{} fault kinds", FAULT_KINDS.len()),
        };
        if let Err(e) = done {
            self.problems.push(format!(
                "node {node}: {} failed: {e}",
                FAULT_KINDS[kind as usize]
            ));
            return;
        }
        let instant = length.is_zero();
        self.log.push(Fault {
            node,
            kind,
            start,
            effect_end: if instant { start } else { 0 },
            reconnected: 0,
            seeded: 0,
            slot_end: 0,
            length,
            open: false,
        });
        let detail = if instant {
            String::new()
        } else {
            format!(" for {} ms", length.as_millis())
        };
        self.say(node, &format!("{}{detail}", FAULT_KINDS[kind as usize]));
        self.states[node] = if instant {
            State::Recovering {
                fault,
                over: now,
                polled: None,
                restart: None,
            }
        } else {
            State::Effect {
                until: now + length,
                fault,
            }
        };
        self.most_faulty = self.most_faulty.max(self.faulty());
    }

    /// Moves `node` on in its fault: resumes, restarts, watches its recovery. With `over`, a
    /// frozen node is resumed and a killed one restarted at once.
    fn advance(&mut self, server: &mut Server, node: usize, over: bool) {
        let now = Instant::now();
        let state = std::mem::replace(&mut self.states[node], State::Healthy);
        self.states[node] = match state {
            State::Healthy => State::Healthy,
            State::Effect { until, fault } if now < until && !over => {
                State::Effect { until, fault }
            }
            State::Effect { fault, .. } => {
                let mut restart = None;
                match self.log[fault].kind {
                    STOP => {
                        server.resume();
                        self.say(node, "SIGCONT");
                    }
                    KILL => {
                        server.restart();
                        let run_id = run_id(server).unwrap_or_else(|e| {
                            self.problems
                                .push(format!("node {node}: no run_id after its restart: {e}"));
                            String::new()
                        });
                        self.say(node, "restarted");
                        restart = Some((run_id, vec![None; self.processes]));
                    }
                    // The sleep ends by itself.
                    _ => {}
                }
                self.log[fault].effect_end = mono_ns();
                State::Recovering {
                    fault,
                    over: Instant::now(),
                    polled: None,
                    restart,
                }
            }
            State::Recovering {
                fault,
                over: effect_over,
                polled,
                restart,
            } => self.recover(server, node, now, fault, effect_over, polled, restart),
        };
    }

    /// A node whose fault's effect is over: healthy once every worker is connected again (and
    /// after a restart, a quarantine window after the last of them, and seeded).
    #[allow(clippy::too_many_arguments)]
    fn recover(
        &mut self,
        server: &Server,
        node: usize,
        now: Instant,
        fault: usize,
        effect_over: Instant,
        polled: Option<Instant>,
        mut restart: Option<(String, Vec<Option<Instant>>)>,
    ) -> State {
        // After a restart every connection is new: watch them from the start; otherwise
        // connections closed by the clients may still be listed until the node settles.
        let from = if restart.is_some() {
            effect_over
        } else {
            effect_over + SETTLE
        };
        let due = now >= from && polled.is_none_or(|p| now >= p + POLL);
        let mut polled = polled;
        let mut healthy = false;
        if due {
            polled = Some(now);
            let connected = worker_connections(server, self.processes);
            let f = &mut self.log[fault];
            match &mut restart {
                None => {
                    if connected.iter().all(|&c| c) {
                        f.reconnected = mono_ns();
                        healthy = true;
                    }
                }
                Some((run_id, seen)) => {
                    for (p, c) in connected.iter().enumerate() {
                        if *c && seen[p].is_none() {
                            seen[p] = Some(now);
                        }
                    }
                    if f.reconnected == 0 && seen.iter().all(Option::is_some) {
                        f.reconnected = mono_ns();
                    }
                    if f.seeded == 0
                        && (!self.fencing
                            || admin(server, &["HGET", redlock_mux::FENCE_KEY, "run"])
                                .is_ok_and(|run| run == *run_id))
                    {
                        f.seeded = mono_ns();
                    }
                    let last = seen.iter().flatten().max().copied();
                    let quarantine_over = seen.iter().all(Option::is_some)
                        && last.is_some_and(|t| now >= t + self.window + SETTLE);
                    healthy = quarantine_over && f.seeded > 0;
                }
            }
        }
        if !healthy && now >= effect_over + RECOVERY_LIMIT {
            let f = &self.log[fault];
            self.problems.push(format!(
                "node {node}: not usable again {} s after its {} ended (every worker \
                 reconnected: {}; seeded: {})",
                RECOVERY_LIMIT.as_secs(),
                FAULT_KINDS[f.kind as usize],
                f.reconnected > 0,
                restart.is_none() || f.seeded > 0
            ));
            healthy = true;
        }
        if healthy {
            self.log[fault].slot_end = mono_ns();
            let f = &self.log[fault];
            let ms = |t: u64| (t.saturating_sub(f.effect_end)) as f64 / 1e6;
            let seeded = if f.seeded > 0 {
                format!(", seeded after {:.0} ms", ms(f.seeded))
            } else {
                String::new()
            };
            self.say(
                node,
                &format!(
                    "healthy: reconnected {:.0} ms after its fault{seeded}",
                    ms(f.reconnected)
                ),
            );
            State::Healthy
        } else {
            State::Recovering {
                fault,
                over: effect_over,
                polled,
                restart,
            }
        }
    }
}

/// Which workers have a connection on `server` (`CLIENT LIST`, by the name their handshake
/// set). None, if the list cannot be read.
fn worker_connections(server: &Server, processes: usize) -> Vec<bool> {
    let mut connected = vec![false; processes];
    if let Ok(list) = admin(server, &["CLIENT", "LIST"]) {
        for line in list.lines() {
            let name = line
                .split(' ')
                .find_map(|f| f.strip_prefix("name=soak-worker-"))
                .and_then(|p| p.parse::<usize>().ok());
            if let Some(p) = name.filter(|&p| p < processes) {
                connected[p] = true;
            }
        }
    }
    connected
}

/// One admin command (a fresh connection each), its reply as text.
fn admin(server: &Server, args: &[&str]) -> Result<String, String> {
    use redis::Value;
    match server.try_cmd(args) {
        Ok(Value::BulkString(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Ok(Value::SimpleString(s)) => Ok(s),
        Ok(Value::VerbatimString { text, .. }) => Ok(text),
        Ok(Value::Okay) => Ok("OK".into()),
        Ok(Value::Int(n)) => Ok(n.to_string()),
        Ok(Value::Nil) => Ok(String::new()),
        Ok(other) => Ok(format!("{other:?}")),
        Err(e) => Err(format!("{args:?}: {e}")),
    }
}

/// The `run_id` of the server's current process.
fn run_id(server: &Server) -> Result<String, String> {
    let info = admin(server, &["INFO", "server"])?;
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .ok_or_else(|| "no run_id in INFO server".to_owned())
}

/// `DEBUG SLEEP`s that a server refused (an error reply): the run's problems at its end — a
/// fault that did not happen must not pass for one that did (found by review).
static REFUSED_SLEEPS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Sends `DEBUG SLEEP 0.5` to node `node` without waiting for it: a thread reads the reply,
/// and an error reply (DEBUG not allowed) is noted in [`REFUSED_SLEEPS`]. (No reply at all
/// is normal: the server may be frozen or killed by a later fault before it answers.)
fn debug_sleep(node: usize, server: &Server) -> Result<(), String> {
    let mut s = TcpStream::connect(server.socket_addr()).map_err(|e| e.to_string())?;
    s.write_all(&redis_local::resp_encode(&["DEBUG", "SLEEP", "0.5"]))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(DEBUG_SLEEP_REPLY))
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        if let Ok(line) = redis_local::read_line(&mut s)
            && line.starts_with('-')
        {
            REFUSED_SLEEPS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!(
                    "node {node}: DEBUG SLEEP refused: {}",
                    line.trim_end()
                ));
        }
    });
    Ok(())
}

/// The worker processes, killed if dropped before they stopped: [`run`]'s, and any other
/// harness's that plays its own faults (`tests/clocks.rs`).
pub struct Workers {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    outs: Vec<PathBuf>,
    /// `(worker, Some(line))` for each line a worker prints, `(worker, None)` at its end.
    lines: mpsc::Receiver<(usize, Option<String>)>,
}

impl Workers {
    /// Starts `cfg.processes` workers with `worker_command` (the process that runs
    /// [`worker::main`](crate::worker)), each writing its records under `dir`.
    ///
    /// # Errors
    ///
    /// A worker that cannot be started.
    pub fn start(
        cfg: &RunConfig,
        servers: &[String],
        dir: PathBuf,
        worker_command: &dyn Fn() -> Command,
    ) -> Result<Workers, String> {
        let (tx, lines) = mpsc::channel();
        let mut workers = Workers {
            children: Vec::new(),
            stdins: Vec::new(),
            outs: Vec::new(),
            lines,
        };
        for process in 0..cfg.processes {
            let out = dir.join(format!("worker-{process}.txt"));
            let settings = WorkerConfig {
                servers: servers.to_vec(),
                process,
                seed: cfg.seed,
                tasks: cfg.tasks,
                out: out.clone(),
            };
            let mut cmd = worker_command();
            cmd.env(worker::ENV, settings.to_env())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            redis_local::die_with_parent(&mut cmd);
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("starting worker {process}: {e}"))?;
            let stdout = child.stdout.take().expect("piped");
            workers.stdins.push(child.stdin.take());
            workers.children.push(child);
            workers.outs.push(out);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send((process, Some(line)));
                }
                let _ = tx.send((process, None));
            });
        }
        Ok(workers)
    }

    /// Waits until every worker said it is ready.
    ///
    /// # Errors
    ///
    /// A worker that ended first, or none ready within a minute.
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut ready = vec![false; self.children.len()];
        while ready.iter().any(|r| !r) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((p, Some(line))) if line == worker::READY => ready[p] = true,
                Ok((_, Some(_))) => {}
                Ok((p, None)) => {
                    let status = self.children[p].wait().map_err(|e| e.to_string())?;
                    return Err(format!("worker {p} ended before it was ready: {status}"));
                }
                Err(_) => {
                    return Err(format!(
                        "workers not ready within {} s",
                        READY_TIMEOUT.as_secs()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Closes the workers' stdin, waits until each has written its results and ended, and
    /// reads the results.
    ///
    /// # Errors
    ///
    /// A worker that did not stop within a minute, failed, or left no records.
    pub fn stop(mut self) -> Result<Vec<WorkerResult>, String> {
        for stdin in &mut self.stdins {
            drop(stdin.take());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut done = vec![false; self.children.len()];
        let mut ended = vec![false; self.children.len()];
        while ended.iter().any(|e| !e) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((p, Some(line))) if line == worker::DONE => done[p] = true,
                Ok((_, Some(_))) => {}
                Ok((p, None)) => ended[p] = true,
                Err(_) => {
                    return Err(format!(
                        "workers {:?} did not stop within {} s of being told to",
                        (0..ended.len()).filter(|&p| !ended[p]).collect::<Vec<_>>(),
                        STOP_TIMEOUT.as_secs()
                    ));
                }
            }
        }
        let mut results = Vec::new();
        for (p, child) in self.children.iter_mut().enumerate() {
            // Its stdout is closed: it is exiting.
            let status = child.wait().map_err(|e| e.to_string())?;
            if !status.success() || !done[p] {
                return Err(format!("worker {p} failed: {status}"));
            }
            results.push(worker::read_results(&self.outs[p])?);
        }
        Ok(results)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
