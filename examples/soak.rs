//! The real-server liveness soak: 5 local redis-servers, 3 worker processes ×
//! 32 callers (half blocking threads, half tokio tasks, one handle per process) locking 4
//! resources through every API path — plain locks, shared (read) locks, all-or-none sets of 2
//! or 3 of them — and taking permits of a semaphore of 2, TTL 1.5 s, fencing on, the default
//! quarantine; seeded faults, never more than 2 of the 5 servers faulty at once
//! (SIGSTOP/SIGCONT, SIGKILL and restart on the same port, `CLIENT KILL`, `DEBUG SLEEP 0.5`,
//! `SCRIPT FLUSH`); all traffic on loopback. Then it checks: no hold of a resource overlaps
//! another but readers with readers (a set's hold is a hold of each member), at most 2 permit
//! holders at once, fences of exclusive holds grow in hold order, the longest wait while
//! nobody held (per kind of waiter) stays within the bound derived from the settings, and no
//! process connects to a node more often than that node's faults explain.
//!
//! ```text
//! cargo run --release --example soak -- [--seed S] [--duration SECS] [--processes P]
//!     [--tasks T] [--json] [--verbose] [--keep DIR]
//! cargo run --release --example soak -- --table < runs.jsonl   # the JSON lines as a table
//! cargo run --release --example soak -- --bound                # the bound and its terms
//! cargo run --release --example soak -- --ideal SEEDS [--seed S] [--duration SECS]
//! ```
//!
//! `--ideal SEEDS` runs no servers: it prints what share of each kind's waits could end held
//! under an ideal scheduler (first come, first served; sets first), the same workload with no
//! network and no polling, for SEEDS seeds from S (1): the workload's limits, beside which the
//! real soak's figures are the lock's (`redlock_soak::ideal`).
//!
//! `--verbose` prints each fault as it is injected and healed; `--keep DIR` keeps the
//! workers' records (holds, waits, connects, counters: see `crates/soak/src/worker.rs`) in DIR.
//!
//! Prints a summary (and with `--json`, one JSON line last on stdout); exits 1 if a goal was
//! missed, 2 if the run could not be made. `scripts/soak` runs many seeds; `tests/soak.rs` a
//! short one. See docs/guarantees.md, "Soak against real servers".

use std::io::BufRead;
use std::process::{Command, ExitCode};
use std::time::Duration;

use redlock_soak::{Bound, RunConfig, check, driver, ideal, worker};

fn usage() -> ExitCode {
    eprintln!(
        "usage: soak [--seed S] [--duration SECS] [--processes P] [--tasks T] [--json] \
         [--verbose] [--keep DIR] | --table | --bound | --ideal SEEDS [--seed S] [--duration SECS]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    if let Some(cfg) = worker::WorkerConfig::from_env() {
        return match worker::run(&cfg) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("soak worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    let mut cfg = RunConfig::new(0, Duration::from_secs(60));
    let mut json = false;
    let mut ideal = None;
    let mut seed = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Option<u64> {
            let v = args.next().and_then(|v| v.parse().ok());
            if v.is_none() {
                eprintln!("{name} needs a number");
            }
            v
        };
        match a.as_str() {
            "--seed" => match num("--seed") {
                Some(v) => seed = Some(v),
                None => return usage(),
            },
            "--duration" => match num("--duration") {
                Some(v) => cfg.duration = Duration::from_secs(v),
                None => return usage(),
            },
            "--processes" => match num("--processes") {
                Some(v) if v > 0 => cfg.processes = v as usize,
                _ => return usage(),
            },
            "--tasks" => match num("--tasks") {
                Some(v) if v > 0 => cfg.tasks = v as usize,
                _ => return usage(),
            },
            "--ideal" => match num("--ideal") {
                Some(v) if v > 0 => ideal = Some(v),
                _ => return usage(),
            },
            "--json" => json = true,
            "--verbose" => cfg.verbose = true,
            "--keep" => match args.next() {
                Some(dir) => cfg.keep = Some(dir.into()),
                None => return usage(),
            },
            "--table" => {
                let lines: Vec<String> = std::io::stdin()
                    .lock()
                    .lines()
                    .map_while(Result::ok)
                    .collect();
                return match check::table(&lines) {
                    Ok(t) => {
                        print!("{t}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("{e}");
                        ExitCode::from(2)
                    }
                };
            }
            "--bound" => {
                let bound = Bound::of(&redlock_soak::client_config());
                for (what, d) in &bound.terms {
                    println!("{:>6} ms  {what}", d.as_millis());
                }
                println!("{:>6} ms  the bound", bound.total().as_millis());
                return ExitCode::SUCCESS;
            }
            _ => return usage(),
        }
    }
    if let Some(seeds) = ideal {
        // Seeds from 1, as `scripts/soak`'s.
        let first = seed.unwrap_or(1);
        let callers = cfg.processes * cfg.tasks;
        print!("{}", ideal::report(first, seeds, cfg.duration, callers));
        return ExitCode::SUCCESS;
    }
    cfg.seed = seed.unwrap_or(cfg.seed);
    // Workers are this program again, told what to do through the environment.
    let worker_command =
        || Command::new(std::env::current_exe().expect("the soak's own executable"));
    let run = match driver::run(&cfg, &worker_command) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let report = check::examine(&run);
    print!("{}", report.summary());
    if json {
        println!("{}", report.json());
    }
    if report.violations().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
