//! Server clocks that run fast or step, measured: 5 real servers under libfaketime
//! (`ServerBuilder::fake_clock`), the soak's
//! workers (`crates/soak/src/worker.rs`: 3 processes of callers taking plain locks, shared locks,
//! all-or-none sets and semaphore permits through every API path, TTL 1.5 s, fencing on), and,
//! after a healthy start, one clock fault on 1, 2 or 3 of the 5 nodes until the end: clocks
//! running ×2 or ×10, jumping forward by twice the TTL every few seconds, or stepping back as
//! far. The soak's checks read the workers' `CLOCK_MONOTONIC` records: overlapping holds (two
//! holders at once; readers may share), fences out of order, more permit holders than permits,
//! the longest wait while nobody held. A fenced store is played over the same records: every
//! exclusive holder writes as its hold begins and as it ends, and the store refuses a fence
//! below the highest it has seen; a *stale write* is one made after a newer grant of the
//! resource began, and each must be refused. The driver also reads each node's
//! `server_time_usec` (`INFO server`) every second against its own monotonic clock: the rate a
//! client could see.
//!
//! Each case is `#[ignore]`d (about 33 s each, and they need libfaketime and a server that runs
//! under it: not Debian's 7.0.15); `scripts/clocks` runs them all on redis-server 6.2.14 (or
//! 8.2.3) and prints the table of docs/guarantees.md. One case:
//!
//! ```text
//! REDIS_SERVER=$(scripts/servers path 6.2) cargo test --all-features --test clocks -- \
//!     --ignored --exact --nocapture one_node_runs_ten_times_fast
//! ```
//!
//! Asserted: with every clock healthy, no overlap; always, fences in order and every stale write
//! refused. With skewed clocks overlaps are only counted: a node whose clock runs fast drops
//! keys early, and a holder's quorum whose every node shared with a rival's is such a node is
//! overtaken — with 2 of 5 fast, a holder on 4 nodes already (`{0, 1, 2, 3}` against
//! `{0, 1, 4}`), with 1 of 5 only a holder on exactly 3 (docs/guarantees.md, "Server clocks").

#[allow(dead_code)]
use std::process::Command;
use std::time::{Duration, Instant};

use redis_local::{Cluster, Server};

use redlock_soak as soak;
use soak::driver::{RunResult, Workers};
use soak::worker::{self, WorkerConfig, WorkerResult};
use soak::{NODES, RunConfig, TTL, check, mono_ns};

/// The workload's seed (callers' choices of kind, path, resource and hold time).
const SEED: u64 = 1;
/// Worker processes.
const PROCESSES: usize = 3;
/// Callers per process (half threads, half tokio tasks): the soak's 32 halved, as the faked
/// clocks make each server's clock calls read a file.
const TASKS: usize = 16;
/// How long the workers lock with every clock healthy, before the fault.
const HEALTHY: Duration = Duration::from_secs(3);
/// How long the fault lasts (to the end of the run).
const FAULTY: Duration = Duration::from_secs(24);
/// A jump or a step back: twice the TTL, so that every key on the node expires at once
/// (forward) or lives a TTL longer than set (back).
const STEP: f64 = 2.0 * TTL.as_secs_f64();
/// How often the skewed nodes' clocks jump or step.
const STEP_EVERY: Duration = Duration::from_millis(2_500);
/// How often the driver reads each node's `server_time_usec`.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The quarantine window is one TTL; a node must say it has been up longer than that (its
/// uptime is read a second short) before the workers count it.
const UPTIME: u64 = TTL.as_secs() + 2;

/// What happens to the skewed nodes' clocks.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Runs this many times as fast as the machine's from the fault on.
    Rate(f64),
    /// Jumps forward by [`STEP`] every [`STEP_EVERY`].
    Jumps,
    /// Steps back by [`STEP`] every [`STEP_EVERY`].
    StepsBack,
}

impl Fault {
    fn describe(self) -> String {
        match self {
            Fault::Rate(r) => format!("runs ×{r}"),
            Fault::Jumps => format!("jumps +{STEP} s every {} s", STEP_EVERY.as_secs_f64()),
            Fault::StepsBack => format!("steps back {STEP} s every {} s", STEP_EVERY.as_secs_f64()),
        }
    }
}

/// The clock check (`Builder::clock_check`) against the hazard of a fast clock, on three real
/// servers under libfaketime. A holder gets nodes 0 and 1 (node 2 held by a foreign key, then
/// freed); node 0's clock then runs ten times fast and drops the holder's key within a
/// fraction of its TTL. A rival without the check is granted nodes 0 and 2 — a quorum, while
/// the holder's lock is valid: two holders. A rival with the check is refused: node 0's yes
/// does not count, its clock named in the report as ahead of the others.
#[test]
fn the_clock_check_does_not_count_a_node_whose_clock_runs_fast() {
    let bin = redis_local::clock::fake_clock_server().unwrap_or_else(|e| panic!("{e}"));
    let mut servers = Cluster::start_with(3, Server::builder().fake_clock(true).binary(bin));
    let handle = |check: bool| {
        let mut b = redlock_mux::Builder::new(servers.urls())
            .ttl(Duration::from_secs(10))
            .quarantine(None)
            .retry_count(0);
        if check {
            b = b.clock_check(Duration::from_millis(20));
        }
        b.build().expect("a handle")
    };
    let (plain, checked) = (handle(false), handle(true));

    // Healthy clocks: the check grants, its margin (3 × 20 ms) off the validity.
    let lock = checked.try_lock("healthy").expect("healthy clocks grant");
    assert!(lock.votes().yes() >= 2, "{:?}", lock.votes());
    assert!(lock.validity() <= Duration::from_millis(10_000 - 102 - 60));
    checked.unlock(lock).expect("unlock");

    servers[2].cmd(&["SET", "r", "foreign", "PX", "60000"]);
    let holder = plain.try_lock("r").expect("the holder on nodes 0 and 1");
    servers[2].cmd(&["DEL", "r"]);
    servers[0].set_clock_rate(10.0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while servers[0].pttl("r") != -2 {
        assert!(Instant::now() < deadline, "node 0 kept the key");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(holder.valid_until() > Instant::now() + Duration::from_secs(5));

    let refused = checked
        .try_lock("r")
        .expect_err("node 0's clock must not count");
    let report = refused.report().expect("a report");
    let (_, fault) = (report.failed())
        .find(|(node, _)| node.to_string() == servers[0].addr())
        .unwrap_or_else(|| panic!("node 0 not failed: {refused}"));
    match fault {
        redlock_mux::NodeFault::Clock(Some(ahead)) => assert!(*ahead > 500, "{fault}"),
        other => panic!("node 0: {other}"),
    }
    // Without the check: two holders.
    let rival = plain.try_lock("r").expect("the hazard: a rival is granted");
    assert!(rival.valid_until() > Instant::now() && holder.valid_until() > Instant::now());
    servers[0].set_clock_rate(1.0);
}

/// The clock check on a server that refuses `TIME` (an ACL user without `+time`): its yes never
/// counts — the report names its clock as unread — and the key its `SET` wrote is released.
#[test]
fn the_clock_check_counts_no_yes_of_a_server_that_refuses_time() {
    let servers = Cluster::start_with(
        1,
        Server::builder().acl_user("locker on >pw ~* &* +@all -time"),
    );
    let url = format!("redis://locker:pw@{}", servers[0].addr());
    let redlock = redlock_mux::Builder::new([url])
        .quarantine(None)
        .retry_count(0)
        .clock_check(Duration::from_millis(20))
        .build()
        .expect("a handle");
    let refused = redlock.try_lock("x").expect_err("no clock read, no lock");
    let report = refused.report().expect("a report");
    assert!(
        report
            .failed()
            .any(|(_, f)| matches!(f, redlock_mux::NodeFault::Clock(None))),
        "{refused}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while servers[0].dbsize() != 0 {
        assert!(Instant::now() < deadline, "the key was left behind");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "started as a subprocess by the clock cases"]
fn clock_worker() {
    let Some(cfg) = WorkerConfig::from_env() else {
        return;
    };
    if let Err(e) = worker::run(&cfg) {
        panic!("{e}");
    }
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn no_node_skewed() {
    measure("no_node_skewed", 0, Fault::Rate(1.0));
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn one_node_runs_twice_as_fast() {
    measure("one_node_runs_twice_as_fast", 1, Fault::Rate(2.0));
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn one_node_runs_ten_times_fast() {
    measure("one_node_runs_ten_times_fast", 1, Fault::Rate(10.0));
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn one_node_jumps_past_the_ttl() {
    measure("one_node_jumps_past_the_ttl", 1, Fault::Jumps);
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn two_nodes_run_ten_times_fast() {
    measure("two_nodes_run_ten_times_fast", 2, Fault::Rate(10.0));
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn two_nodes_jump_past_the_ttl() {
    measure("two_nodes_jump_past_the_ttl", 2, Fault::Jumps);
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn three_nodes_run_twice_as_fast() {
    measure("three_nodes_run_twice_as_fast", 3, Fault::Rate(2.0));
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn three_nodes_run_ten_times_fast() {
    measure("three_nodes_run_ten_times_fast", 3, Fault::Rate(10.0));
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn three_nodes_jump_past_the_ttl() {
    measure("three_nodes_jump_past_the_ttl", 3, Fault::Jumps);
}

#[test]
#[ignore = "a measurement (33 s, libfaketime, a server that runs under it): scripts/clocks"]
fn one_node_steps_back() {
    measure("one_node_steps_back", 1, Fault::StepsBack);
}

/// Runs the workload on 5 servers with `fault` on the first `skewed` of them, prints the row,
/// and asserts what must hold.
fn measure(name: &str, skewed: usize, fault: Fault) {
    let mut servers = Cluster::start_with(NODES, Server::builder().fake_clock(true));
    for s in servers.iter() {
        s.wait_uptime(UPTIME);
    }
    let records = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::new(SEED, HEALTHY + FAULTY);
    cfg.processes = PROCESSES;
    cfg.tasks = TASKS;
    // This test binary again, running `clock_worker`.
    let worker_command = || {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args([
            "--exact",
            "clock_worker",
            "--ignored",
            "--nocapture",
            "--quiet",
        ]);
        cmd
    };
    let mut workers = Workers::start(
        &cfg,
        &servers.urls(),
        records.path().to_owned(),
        &worker_command,
    )
    .expect("the workers");
    workers.wait_ready().expect("the workers ready");
    let mut sampler = Sampler::new(servers.len());
    let started = mono_ns();
    let t0 = Instant::now();
    let onset = t0 + HEALTHY;
    let end = onset + FAULTY;
    let mut next_step = onset;
    let mut next_sample = t0;
    let mut begun = false;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now >= next_sample {
            sampler.sample(&servers, now >= onset);
            next_sample += SAMPLE_EVERY;
        }
        if now >= onset && !begun {
            begun = true;
            if let Fault::Rate(rate) = fault {
                for s in servers.iter_mut().take(skewed) {
                    s.set_clock_rate(rate);
                }
            }
        }
        if now >= next_step && now >= onset {
            let by = match fault {
                Fault::Rate(_) => 0.0,
                Fault::Jumps => STEP,
                Fault::StepsBack => -STEP,
            };
            if by != 0.0 {
                for s in servers.iter_mut().take(skewed) {
                    s.step_clock(by);
                }
            }
            next_step += STEP_EVERY;
        }
        // The schedule is time itself: sleep until its next moment.
        let wake = next_sample.min(next_step.max(onset)).min(end);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
    let ended = mono_ns();
    let results = workers.stop().expect("the workers' records");
    for s in servers.iter_mut().take(skewed) {
        if let Fault::Rate(_) = fault {
            s.set_clock_rate(1.0);
        }
    }
    let store = FencedStore::play(&results);
    let run = RunResult {
        config: cfg,
        workers: results,
        faults: Vec::new(),
        started,
        ended,
        problems: Vec::new(),
        most_faulty: 0,
        // The servers' clocks are this run's fault (libfaketime), not the machine's.
        clock_steps: Vec::new(),
    };
    let report = check::examine(&run);
    let skewed_rates = sampler.rates(0..skewed);
    let healthy_rates = sampler.rates(skewed..servers.len());
    let kinds = report
        .holds_by_kind
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" / ");
    let row = format!(
        "| {} of 5 {} | {} ({kinds}) | {} | {} | {} | {} of {} refused | {} | {} ms | {} |",
        skewed,
        fault.describe(),
        report.holds,
        report.overlaps,
        report.fence_violations,
        report.over_permits,
        store.stale_refused,
        store.stale,
        store.accepted_stale,
        report.longest.length().as_millis(),
        rate_range(&skewed_rates, &healthy_rates),
    );
    let name = match worker::clock_check() {
        Some(x) => format!("{name} (clock check, tolerance {} ms)", x.as_millis()),
        None => name.to_owned(),
    };
    println!("clocks: {name}\n{row}");
    for example in report.overlap_examples.iter().take(3) {
        println!("clocks:   overlap: {example}");
    }
    for example in report.fence_examples.iter().take(3) {
        println!("clocks:   fence: {example}");
    }
    assert!(report.holds > 0, "nothing was held\n{}", report.summary());
    assert_eq!(report.fence_violations, 0, "{row}\n{}", report.summary());
    assert_eq!(store.accepted_stale, 0, "{row}");
    // With every clock healthy, or with the clock check and a minority skewed: no overlap.
    if skewed == 0 || (worker::clock_check().is_some() && skewed < NODES / 2 + 1) {
        assert_eq!(report.overlaps, 0, "{row}\n{}", report.summary());
        assert_eq!(report.over_permits, 0, "{row}\n{}", report.summary());
    }
}

/// The range of rates seen, as a cell: the skewed nodes' and the healthy ones'.
fn rate_range(skewed: &[f64], healthy: &[f64]) -> String {
    let span = |rates: &[f64]| -> String {
        let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if rates.is_empty() {
            "—".into()
        } else {
            format!("{lo:.4}–{hi:.4}")
        }
    };
    format!("skewed {} / healthy {}", span(skewed), span(healthy))
}

/// Each node's `server_time_usec` against the driver's monotonic clock, once a second.
struct Sampler {
    /// Per node: (monotonic seconds at the middle of the request, the server's wall clock in
    /// seconds, during the fault).
    samples: Vec<Vec<(f64, f64, bool)>>,
    origin: Instant,
}

impl Sampler {
    fn new(nodes: usize) -> Sampler {
        Sampler {
            samples: vec![Vec::new(); nodes],
            origin: Instant::now(),
        }
    }

    fn sample(&mut self, servers: &Cluster, faulty: bool) {
        for (n, s) in servers.iter().enumerate() {
            let before = self.origin.elapsed().as_secs_f64();
            let info = s.info("server");
            let after = self.origin.elapsed().as_secs_f64();
            let usec: f64 = info
                .lines()
                .find_map(|l| l.strip_prefix("server_time_usec:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no server_time_usec in INFO server: {info}"));
            self.samples[n].push(((before + after) / 2.0, usec / 1e6, faulty));
        }
    }

    /// The rates between consecutive samples taken during the fault, for `nodes`: how fast
    /// each node's wall clock ran against the driver's monotonic one over a second.
    fn rates(&self, nodes: std::ops::Range<usize>) -> Vec<f64> {
        let mut rates = Vec::new();
        for n in nodes {
            for pair in self.samples[n].windows(2) {
                let ((m0, w0, f0), (m1, w1, f1)) = (pair[0], pair[1]);
                if f0 && f1 {
                    rates.push((w1 - w0) / (m1 - m0));
                }
            }
        }
        rates
    }
}

/// A store that checks fences, played over the holds: each exclusive holder writes as its hold
/// begins and as it ends; the store refuses a fence below the highest it has seen for the
/// resource.
#[derive(Debug, Default)]
struct FencedStore {
    /// Writes made after a newer grant of the resource had begun.
    stale: usize,
    /// Of those, refused by the store.
    stale_refused: usize,
    /// Of those, accepted: a fence violation at the store.
    accepted_stale: usize,
}

impl FencedStore {
    fn play(results: &[WorkerResult]) -> FencedStore {
        let mut store = FencedStore::default();
        let holds: Vec<worker::Hold> = results
            .iter()
            .flat_map(|r| r.holds.iter().copied())
            .filter(|h| h.kind != worker::SHARED && h.fence != 0)
            .collect();
        for resource in 0..soak::KEYS as u8 {
            let mine: Vec<&worker::Hold> =
                holds.iter().filter(|h| h.resource == resource).collect();
            // (when, fence, the hold's start)
            let mut writes: Vec<(u64, u64, u64)> = mine
                .iter()
                .flat_map(|h| [(h.start, h.fence, h.start), (h.end, h.fence, h.start)])
                .collect();
            writes.sort_unstable();
            let mut highest = 0;
            for (at, fence, began) in writes {
                let superseded = mine.iter().any(|o| o.start > began && o.start <= at);
                let accepted = fence >= highest;
                if accepted {
                    highest = fence;
                }
                if superseded {
                    store.stale += 1;
                    if accepted {
                        store.accepted_stale += 1;
                    } else {
                        store.stale_refused += 1;
                    }
                }
            }
        }
        store
    }
}
