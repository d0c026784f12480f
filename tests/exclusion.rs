//! Mutual exclusion demonstrated across processes: P worker processes × M iterations on one
//! resource over 5 real servers. Each critical section reads a counter file, waits a small random
//! time, writes counter + 1 and logs (pid, start, end) in CLOCK_MONOTONIC nanoseconds. The final
//! count must be exactly P × M and no two intervals may overlap — healthy, with one node frozen
//! halfway through, and with one node killed and restarted (no persistence) halfway through with
//! restart quarantine on.
//!
//! The workers are this test binary run again with `worker` and an environment that says what to
//! do. `REDLOCK_SOAK=1` runs longer variants (more processes and iterations).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redis_local::Cluster;

fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// The worker: runs only when started by [`run_phase`].
#[test]
#[ignore = "started as a subprocess by the exclusion tests"]
fn worker() {
    let Ok(servers) = std::env::var("EXCL_SERVERS") else {
        return;
    };
    let iterations: usize = std::env::var("EXCL_ITER").unwrap().parse().unwrap();
    let counter = PathBuf::from(std::env::var("EXCL_COUNTER").unwrap());
    let log = PathBuf::from(std::env::var("EXCL_LOG").unwrap());
    let quarantine = match std::env::var("EXCL_QUARANTINE_MS").unwrap().as_str() {
        "off" => None,
        ms => Some(Duration::from_millis(ms.parse().unwrap())),
    };
    let redlock = redlock_mux::Builder::new(servers.split(','))
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(50))
        .quarantine(quarantine)
        .retry_count(u32::MAX)
        .retry_delay(Duration::from_millis(1), Duration::from_millis(4))
        .build()
        .unwrap();
    let pid = std::process::id();
    let mut rng = rand::rng();
    let stdout = std::io::stdout();
    for _ in 0..iterations {
        let lock = redlock.lock("exclusion").unwrap();
        let start = monotonic_ns();
        let value: u64 = fs::read_to_string(&counter)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.random_range(0..2_000)));
        fs::write(&counter, format!("{}\n", value + 1)).unwrap();
        let end = monotonic_ns();
        assert!(
            lock.is_valid(),
            "the critical section outlived the validity"
        );
        let mut f = fs::OpenOptions::new().append(true).open(&log).unwrap();
        writeln!(f, "{pid} {start} {end}").unwrap();
        drop(f);
        let _ = redlock.unlock(lock);
        let mut out = stdout.lock();
        writeln!(out, "tick").unwrap();
        out.flush().unwrap();
    }
}

struct Phase<'a> {
    servers: &'a mut Cluster,
    processes: usize,
    iterations: usize,
    quarantine: Option<Duration>,
    /// Run once, when half of all critical sections are done.
    halfway: Box<dyn FnMut(&mut Cluster) + 'a>,
}

fn spawn_worker(dir: &Path, urls: &str, phase: &Phase<'_>) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "worker", "--ignored", "--nocapture", "--quiet"])
        .env("EXCL_SERVERS", urls)
        .env("EXCL_ITER", phase.iterations.to_string())
        .env("EXCL_COUNTER", dir.join("counter"))
        .env("EXCL_LOG", dir.join("log"))
        .env(
            "EXCL_QUARANTINE_MS",
            phase
                .quarantine
                .map_or("off".to_string(), |q| q.as_millis().to_string()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Runs one phase and checks the count and the intervals.
fn run_phase(mut phase: Phase<'_>) {
    // The counter and the log on tmpfs where there is one: on a disk, truncating and rewriting
    // the counter waits for the previous version's writeback, which behind other writers (a
    // build, CI) took over a second, longer than the TTL, so the critical section outlived the
    // lock and the next holder read the truncated file.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    fs::write(dir.path().join("counter"), "0\n").unwrap();
    fs::write(dir.path().join("log"), "").unwrap();
    let urls = phase.servers.urls().join(",");
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = (0..phase.processes)
        .map(|_| spawn_worker(dir.path(), &urls, &phase))
        .collect();
    for child in &mut children {
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line == "tick" {
                    let _ = tx.send(());
                }
            }
        });
    }
    drop(tx);
    let total = phase.processes * phase.iterations;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut ticks = 0;
    while ticks < total {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(()) => {
                ticks += 1;
                if ticks == total / 2 {
                    (phase.halfway)(phase.servers);
                }
            }
            Err(_) => break,
        }
    }
    for mut child in children {
        if ticks < total {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        assert!(status.success() || ticks < total, "worker failed: {status}");
    }
    assert_eq!(ticks, total, "critical sections completed");
    let count: usize = fs::read_to_string(dir.path().join("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(count, total, "lost updates: two holders at once");
    let mut intervals: Vec<(u128, u128, u32)> = fs::read_to_string(dir.path().join("log"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[0].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(intervals.len(), total);
    intervals.sort_unstable();
    for pair in intervals.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "overlap: pid {} [{}, {}] and pid {} [{}, {}]",
            pair[0].2,
            pair[0].0,
            pair[0].1,
            pair[1].2,
            pair[1].0,
            pair[1].1
        );
    }
    let pids: std::collections::HashSet<u32> = intervals.iter().map(|i| i.2).collect();
    assert_eq!(pids.len(), phase.processes);
}

fn size() -> (usize, usize) {
    if std::env::var_os("REDLOCK_SOAK").is_some() {
        (8, 200)
    } else {
        (4, 25)
    }
}

#[test]
fn processes_exclude_each_other_healthy_frozen_and_restarted() {
    let mut servers = Cluster::start(5);
    let (processes, iterations) = size();
    run_phase(Phase {
        servers: &mut servers,
        processes,
        iterations,
        quarantine: None,
        halfway: Box::new(|_| {}),
    });
    run_phase(Phase {
        servers: &mut servers,
        processes,
        iterations,
        quarantine: None,
        halfway: Box::new(|s| s[1].freeze()),
    });
    servers[1].resume();
    // Quarantine on: the other nodes must be past their own start-up quarantine first.
    let window = Duration::from_secs(1);
    for s in servers.iter() {
        s.wait_uptime(3);
    }
    run_phase(Phase {
        servers: &mut servers,
        processes,
        iterations,
        quarantine: Some(window),
        halfway: Box::new(|s| s[2].restart()),
    });
}
