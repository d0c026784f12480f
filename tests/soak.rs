//! The real-server liveness soak, briefly: what CI runs of `examples/soak.rs`
//! (`scripts/soak` runs it long). One seed, 9 s of faults, 3 processes × 8 callers instead of
//! 32, the same servers, faults, lock kinds (plain, shared, all-or-none sets, semaphore
//! permits), API paths and checks; see docs/guarantees.md, "Soak against real servers".
//!
//! The workers are this test binary run again (`soak_worker`, with the settings in the
//! environment). Without a `redis-server` the test fails and says how to install one.

use std::process::Command;
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Redlock};

use redlock_soak::{self as soak, RunConfig, check, driver, worker};

/// The seed of the short run: its first six faults are of all five kinds, a SIGKILL and
/// restart first (the kinds drawn depend on the seed alone; how many fit in the time, on the
/// run).
const SEED: u64 = 31;
/// Faults are injected for this long.
const DURATION: Duration = Duration::from_secs(9);
/// Callers per process (the long soak has 32).
const TASKS: usize = 8;

/// A worker: runs only when started by [`soak_briefly`].
#[test]
#[ignore = "started as a subprocess by soak_briefly"]
fn soak_worker() {
    let Some(cfg) = worker::WorkerConfig::from_env() else {
        return;
    };
    if let Err(e) = worker::run(&cfg) {
        panic!("{e}");
    }
}

#[test]
fn soak_briefly() {
    let mut cfg = RunConfig::new(SEED, DURATION);
    cfg.tasks = TASKS;
    let worker = || {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args([
            "--exact",
            "soak_worker",
            "--ignored",
            "--nocapture",
            "--quiet",
        ]);
        cmd
    };
    let run = driver::run(&cfg, &worker).unwrap_or_else(|e| panic!("soak: {e}"));
    let report = check::examine(&run);
    let summary = report.summary();
    eprintln!("{summary}");
    assert!(report.holds > 0, "no lock was ever held\n{summary}");
    for (kind, &n) in worker::KINDS.iter().zip(&report.holds_by_kind) {
        assert!(n > 0, "no {kind} lock was ever held\n{summary}");
    }
    assert_eq!(report.overlaps, 0, "two holders at once\n{summary}");
    assert_eq!(report.fence_violations, 0, "fences out of order\n{summary}");
    assert_eq!(
        report.over_permits,
        0,
        "more than {} permit holders at once\n{summary}",
        soak::PERMITS
    );
    assert!(
        report.longest.length() <= report.bound.total(),
        "a caller waited {} ms while nobody held the resource (bound {} ms)\n{summary}",
        report.longest.length().as_millis(),
        report.bound.total().as_millis()
    );
    for (p, row) in report.connects.iter().enumerate() {
        for (n, &c) in row.iter().enumerate() {
            assert!(
                c <= report.connect_limits[n],
                "process {p} connected {c} times to node {n}, more than its {} faults \
                 explain ({})\n{summary}",
                report.faults_by_node[n],
                report.connect_limits[n]
            );
        }
    }
    assert!(
        report.problems.is_empty(),
        "the run did not keep to its rules: {:?}\n{summary}",
        report.problems
    );
}

/// A caller waits for a resource held by another handle, while one of the five servers has
/// just restarted (empty) and is in the restart quarantine. Found by the soak: the waiter
/// sent thousands of attempts a second instead of one per release or fallback poll.
///
/// The restarted node holds no key, so it grants every attempt's `SET NX`; its yes does not
/// count (quarantine), so the attempt is refused as `Held` — not a split vote, as no counted
/// node said yes, so no split pause. The attempt's cleanup release then deletes our key *and
/// our waiting mark* on that node and publishes a release notice there, which the waiter's
/// own subscription hears: the next attempt goes at once, marked again, and so on. Measured:
/// 14,042 and 14,798 requests per node in the 1 s wait (12–18 without the restart; 12 with
/// the restart and the waiter's `release_notices(false)`); 19,348 on main before the fix.
/// Fixed: a lost attempt's cleanup on a node in its quarantine goes without the notice
/// (`Engine::quiet_release`): its yes counted for nobody, so its notice helps nobody; and a
/// notice from a node in its quarantine is ignored (its yes may come after the round was
/// lost, when the cleanup did not know). Now 12–14 requests per node, as without the restart.
#[test]
fn a_waiter_does_not_spin_while_a_restarted_node_is_quarantined() {
    /// The fallback poll brings about 3–5 attempts a second, each a mark, a `SET` and a
    /// release per node: this is several times that.
    const MOST_REQUESTS: u64 = 100;
    let mut servers = Cluster::start(5);
    // Past the quarantine of a node seen for the first time (uptime below one TTL).
    for s in servers.iter() {
        s.wait_uptime(2);
    }
    let handle = |name: &str| -> Redlock {
        Builder::new(servers.urls())
            .ttl(Duration::from_millis(1_500))
            .client_name(name)
            .build()
            .unwrap()
    };
    let (holder, waiter) = (handle("holder"), handle("waiter"));
    assert_eq!(holder.connect(Duration::from_secs(5)).unwrap(), 5);
    assert_eq!(waiter.connect(Duration::from_secs(5)).unwrap(), 5);
    let kept = holder.keep(holder.lock("r").unwrap()).unwrap();
    servers[4].restart();
    // The waiter notices the restart: its connection to node 4 comes up again (and reads
    // the new run_id), at its next requests, and node 4's yeses stop counting. (Waited for by
    // the quarantined yes, not by `reconnects`: the server's close of an idle connection is
    // an idle close, reconnected without counting as one.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiter.stats().nodes[4].quarantined == 0 {
        assert!(
            Instant::now() < deadline,
            "the waiter never saw node 4 restarted: {:?}",
            waiter.stats().nodes[4]
        );
        if let Ok(lock) = waiter.try_lock("warm") {
            waiter.unlock(lock).unwrap();
        }
    }
    let requests =
        |r: &Redlock| -> Vec<u64> { r.stats().nodes.iter().map(|n| n.requests).collect() };
    let before = requests(&waiter);
    let waited = waiter.lock_until("r", Instant::now() + Duration::from_secs(1));
    assert!(waited.is_err(), "the held lock was granted: {waited:?}");
    let sent: Vec<u64> = requests(&waiter)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    assert!(kept.is_held(), "the holder lost its lock");
    assert!(
        sent.iter().all(|&n| n <= MOST_REQUESTS),
        "requests per node during a 1 s wait: {sent:?} (quarantined yeses: {:?})",
        waiter
            .stats()
            .nodes
            .iter()
            .map(|n| n.quarantined)
            .collect::<Vec<_>>()
    );
}
