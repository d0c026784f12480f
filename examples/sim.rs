//! The simulation soak: runs many seeds of the deterministic simulator on every core
//! and prints schedules per second, simulated time, faults by kind and violations.
//!
//! ```text
//! cargo run --release --features sim --example sim -- [SEEDS] [--start N] [--break KIND]
//!     [--control] [--fence] [--sets] [--shared] [--crowd] [--young] [--cancel] [--owner] [--ordered-sets] [--fair] [--threads T]
//! cargo run --release --features sim --example sim -- --trace SEED [--break KIND] [--control]
//! ```
//!
//! KIND: nothing (default: every assumption holds, 0 violations expected), quarantine,
//! clock-drift, work-past-validity, lying-node, eviction-counted, half-open, majority-down,
//! the validity computed without the drift allowance (no-drift-allowance: the cover check's),
//! two wrong fencing constructions: fence-no-write-back, fence-blank-as-zero; two liveness
//! defects brought back: ledger-unpaced, fail-when-full; a wrong all-or-none lock: set-not-all-or-none; a wrong
//! read lock: reader-ignores-writer; a wrong semaphore (per-node counters of 2 permits,
//! majorities): counter-semaphore; a liveness defect brought back, caught by the progress
//! check (one of five nodes frozen, contention for one resource, grants per second against
//! the same schedule with every node up): wait-for-silent, and in the same runs release
//! notices' counts ignored (every woken client attempts at once): notice-herd (no longer caught
//! since a lost round's cleanup is quiet); one caught by
//! the deadline check
//! (a waiting acquire's outcome within a slack of its deadline): deadline-not-rearmed; a
//! majority restarted with its fence counters lost, no fenced lock again (`--control`: an
//! operator's repair brings them back): fence-majority-blank (`--crowd`: wait-for-silent's
//! runs with one client of 32 callers instead of eight clients; `--young`: in those runs the
//! servers start younger than the restart quarantine's window, and
//! each schedule's first grant is reported); a node's uptime read at its word, though Redis's
//! reads up to a second high (a rolling restart, then new clients that see the young nodes
//! for the first time): uptime-at-its-word; which process a node is learnt from counted yeses
//! only (nodes replaced by processes up for an hour, contention): run-id-on-yes-only; ordered
//! sets beside plain locks and readers of their members, a set waiting for all its members
//! free at once: sets-all-at-once, and writers and readers stepping back for sets' marks past
//! `Config::set_precedence`: set-marks-unbounded (both caught by the liveness check).
//! `--sets`: callers also lock sets of the resources all or none; `--shared`: callers also take shared (read) locks of
//! them. `--cancel`: half the waiting acquires are an async caller's, whose future is dropped at a
//! random instant before its deadline (a lock won for nobody is the engine's to release).
//! `--owner`: the clients' locks carry an owner (`Config::owner`), which every release and
//! extend must see past.
//! `--control` runs the fault plan of KIND with the assumption kept (for a defect brought
//! back, the code as it is; for fence-majority-blank, the operator's repair): 0 violations
//! expected. `--fence`: fenced acquires, and the fences checked too (fence violations: 0
//! expected but for the fence-* kinds, whatever the lock does). Exits 1 on a violation where
//! none is expected: an overlap, a validity not backed by a quorum of nodes' keys when its
//! holder was told (the cover check, `sim::CoverViolation`), a fence out of order, a wait or
//! reconnects past their bounds, a run that stalled where liveness is expected.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redlock_mux::sim::{self, Break, FAULT_KINDS, Report, Setup};

/// The usage line printed with an argument error.
const USAGE: &str = "usage: sim [SEEDS] [--start N] [--break KIND] [--control] [--fence] [--sets] \
    [--shared] [--crowd] [--young] [--cancel] [--owner] [--ordered-sets] [--fair] [--threads T] | sim --trace SEED [--break KIND] [--control]";

/// The value after `flag`, parsed.
fn value<T: std::str::FromStr>(
    args: &mut impl Iterator<Item = String>,
    flag: &str,
) -> Result<T, String> {
    let v = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
    v.replace('_', "")
        .parse()
        .map_err(|_| format!("{flag}: not a number: {v:?}"))
}

/// `--break KIND`'s kind.
fn break_kind(kind: Option<String>) -> Result<Break, String> {
    Ok(match kind.as_deref() {
        Some("nothing") => Break::Nothing,
        Some("quarantine") => Break::Quarantine,
        Some("clock-drift") => Break::ClockDrift,
        Some("work-past-validity") => Break::WorkPastValidity,
        Some("lying-node") => Break::LyingNode,
        Some("eviction-counted") => Break::EvictionCounted,
        Some("half-open") => Break::HalfOpen,
        Some("sets-all-at-once") => Break::SetsAllAtOnce,
        Some("set-marks-unbounded") => Break::SetMarksUnbounded,
        Some("majority-down") => Break::MajorityDown,
        Some("fence-no-write-back") => Break::FenceNoWriteBack,
        Some("fence-blank-as-zero") => Break::FenceBlankAsZero,
        Some("ledger-unpaced") => Break::LedgerUnpaced,
        Some("fail-when-full") => Break::FailWhenFull,
        Some("no-drift-allowance") => Break::NoDriftAllowance,
        Some("set-not-all-or-none") => Break::SetNotAllOrNone,
        Some("reader-ignores-writer") => Break::ReaderIgnoresWriter,
        Some("counter-semaphore") => Break::CounterSemaphore,
        Some("wait-for-silent") => Break::WaitForSilent,
        Some("notice-herd") => Break::NoticeHerd,
        Some("deadline-not-rearmed") => Break::DeadlineNotRearmed,
        Some("fence-majority-blank") => Break::FenceMajorityBlank,
        Some("uptime-at-its-word") => Break::UptimeAtItsWord,
        Some("run-id-on-yes-only") => Break::RunIdOnYesOnly,
        Some(other) => {
            return Err(format!(
                "unknown --break {other:?} (see the kinds in examples/sim.rs)"
            ));
        }
        None => return Err("--break needs a kind".into()),
    })
}

/// What the command line asks for.
struct Options {
    seeds: u64,
    start: u64,
    threads: usize,
    trace: Option<u64>,
    setup: Setup,
}

fn options(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        seeds: 10_000,
        start: 0,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        trace: None,
        setup: Setup::default(),
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--start" => o.start = value(&mut args, "--start")?,
            "--threads" => o.threads = value::<usize>(&mut args, "--threads")?.max(1),
            "--control" => o.setup.control = true,
            "--fence" => o.setup.fencing = true,
            "--sets" => o.setup.sets = true,
            "--shared" => o.setup.shared = true,
            "--crowd" => o.setup.crowd = true,
            "--young" => o.setup.young = true,
            "--cancel" => o.setup.cancel = true,
            "--owner" => o.setup.owner = true,
            "--ordered-sets" => o.setup.ordered_sets = true,
            "--fair" => o.setup.fair = true,
            "--trace" => o.trace = Some(value(&mut args, "--trace")?),
            "--break" => o.setup.breaks = break_kind(args.next())?,
            n if !n.starts_with('-') => {
                o.seeds = n
                    .replace('_', "")
                    .parse()
                    .map_err(|_| format!("SEEDS: not a number: {n:?}"))?
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

fn main() {
    let Options {
        seeds,
        start,
        threads,
        trace,
        setup,
    } = match options(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sim: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let Setup {
        breaks,
        control,
        young,
        fencing,
        ..
    } = setup;
    if let Some(seed) = trace {
        let mut text = String::new();
        let report = sim::run(seed, setup, Some(&mut text));
        print!("{text}");
        println!("{report:?}");
        return;
    }
    let next = Arc::new(AtomicU64::new(start));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            std::thread::spawn(move || {
                let mut total = Report::default();
                let mut violations = Vec::new();
                let mut stalled = 0u64;
                let mut waits = Vec::new();
                let mut overrun = (std::time::Duration::ZERO, 0);
                let mut ratios = Vec::new();
                let mut firsts = Vec::new();
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= start + seeds {
                        break;
                    }
                    let r = sim::run(seed, setup, None);
                    total.ops += r.ops;
                    total.acquired += r.acquired;
                    total.renewals.0 += r.renewals.0;
                    total.renewals.1 += r.renewals.1;
                    total.sim_time += r.sim_time;
                    total.events += r.events;
                    for (t, f) in total.faults.iter_mut().zip(r.faults) {
                        *t += f;
                    }
                    stalled += u64::from(r.stalled);
                    total.fenced += r.fenced;
                    total.wants += r.wants;
                    total.abandoned += r.abandoned;
                    waits.push((r.longest_wait, r.most_connects, r.seed));
                    overrun = overrun.max((r.longest_overrun, r.seed));
                    if let Some(ratio) = r.progress_ratio {
                        ratios.push((ratio, r.seed));
                    }
                    if young {
                        firsts.push((r.first_grant, r.seed));
                    }
                    if r.violation.is_some()
                        || r.cover.is_some()
                        || r.fence_violation.is_some()
                        || r.liveness.is_some()
                        || r.connect_violation.is_some()
                        || r.progress.is_some()
                        || r.late.is_some()
                        || r.stuck_blank
                    {
                        violations.push(r);
                    }
                }
                (total, violations, stalled, waits, overrun, (ratios, firsts))
            })
        })
        .collect();
    let mut total = Report::default();
    let mut violations = Vec::new();
    let mut stalled = 0;
    let mut waits = Vec::new();
    let mut overrun = (std::time::Duration::ZERO, 0);
    let mut ratios = Vec::new();
    let mut firsts = Vec::new();
    for w in workers {
        let (t, v, s, l, o, (r, f)) = w.join().expect("a worker panicked");
        ratios.extend(r);
        firsts.extend(f);
        overrun = overrun.max(o);
        waits.extend(l);
        total.wants += t.wants;
        total.abandoned += t.abandoned;
        total.ops += t.ops;
        total.acquired += t.acquired;
        total.renewals.0 += t.renewals.0;
        total.renewals.1 += t.renewals.1;
        total.sim_time += t.sim_time;
        total.events += t.events;
        total.fenced += t.fenced;
        for (a, b) in total.faults.iter_mut().zip(t.faults) {
            *a += b;
        }
        violations.extend(v);
        stalled += s;
    }
    let secs = t0.elapsed().as_secs_f64();
    violations.sort_by_key(|r| r.seed);
    println!(
        "break: {breaks:?}{}",
        if control {
            " (control: assumption kept)"
        } else {
            ""
        }
    );
    println!(
        "schedules: {seeds} (seeds {start}..{}) in {secs:.1} s on {threads} threads: {:.0} schedules/s, {:.0} per thread",
        start + seeds,
        seeds as f64 / secs,
        seeds as f64 / secs / threads as f64
    );
    println!(
        "simulated: {:.2} h; lock operations: {} ({} acquired); events: {}",
        total.sim_time.as_secs_f64() / 3600.0,
        total.ops,
        total.acquired,
        total.events
    );
    println!(
        "kept locks: {} renewals won, {} lost renewals tried again",
        total.renewals.0, total.renewals.1
    );
    let faults: Vec<String> = FAULT_KINDS
        .iter()
        .zip(total.faults)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("faults: {}", faults.join(", "));
    println!("stalled: {stalled}");
    let overlaps = found(&violations, |r| &r.violation);
    let fences = found(&violations, |r| &r.fence_violation);
    show("violations", &overlaps);
    let covers = found(&violations, |r| &r.cover);
    show("cover violations", &covers);
    let fence_break = matches!(breaks, Break::FenceNoWriteBack | Break::FenceBlankAsZero);
    let flawed = fence_break && !control;
    if fencing || fence_break {
        println!("fenced acquisitions: {}", total.fenced);
        show("fence violations", &fences);
    }
    // Liveness: the longest wait while nobody held the resource, per schedule.
    waits.sort_unstable();
    let pct = |p: f64| waits[((waits.len() - 1) as f64 * p) as usize].0;
    let worst = waits.last().copied().unwrap_or_default();
    println!(
        "wants: {} ({} given up); longest wait while nobody held, per schedule: median {:?}, p99 {:?}, max {:?} (seed {}); bound {:?}",
        total.wants,
        total.abandoned,
        pct(0.5),
        pct(0.99),
        worst.0,
        worst.2,
        sim::WAIT_BOUND
    );
    let connects = waits
        .iter()
        .map(|w| w.1)
        .max_by_key(|c| c.0)
        .unwrap_or_default();
    println!(
        "most connects of one client to one node: {} (its faults allowed {})",
        connects.0, connects.1
    );
    let slow = found(&violations, |r| &r.liveness);
    let loops = found(&violations, |r| &r.connect_violation);
    show("liveness violations", &slow);
    show("reconnect violations", &loops);
    println!(
        "waiting acquires' outcomes after their deadline: max {:?} (seed {}); slack {:?}",
        overrun.0,
        overrun.1,
        sim::DEADLINE_SLACK
    );
    let late = found(&violations, |r| &r.late);
    show("deadline violations", &late);
    if breaks == Break::FenceMajorityBlank {
        let blank: Vec<u64> = (violations.iter())
            .filter(|r| r.stuck_blank)
            .map(|r| r.seed)
            .collect();
        println!(
            "no lock after every node was back: {} (seeds {:?})",
            blank.len(),
            &blank[..blank.len().min(10)]
        );
        if control && !blank.is_empty() {
            std::process::exit(1);
        }
    }
    let stuck = found(&violations, |r| &r.progress);
    if breaks.contention() {
        ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let Some(&(worst, seed)) = ratios.first() {
            let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q) as usize].0;
            println!(
                "frozen ÷ healthy grants per second: worst {worst:.3} (seed {seed}), 1 % {:.3}, \
                 median {:.3}; below {:.2} (the floor): {}",
                at(0.01),
                at(0.5),
                sim::PROGRESS_FLOOR,
                ratios.iter().filter(|r| r.0 < sim::PROGRESS_FLOOR).count()
            );
        }
        show("progress violations", &stuck);
    }
    if young && !breaks.contention() {
        println!("--young: only in the contention family (wait-for-silent, notice-herd): ignored");
    } else if young {
        // Every schedule's first grant: none before the servers are a quarantine window old.
        firsts.sort_unstable();
        let at = |f: Option<&(Option<std::time::Duration>, u64)>| match f {
            Some((Some(t), seed)) => format!("{t:?} (seed {seed})"),
            Some((None, seed)) => format!("none (seed {seed})"),
            None => "none".to_owned(),
        };
        println!(
            "servers younger than the quarantine's window: first grant per schedule earliest {}, \
             latest {} (the window: {:?} of each client's clock from its first contact)",
            at(firsts.first()),
            at(firsts.last()),
            sim::TTL
        );
    }
    let lock_expected = breaks == Break::Nothing || control || flawed;
    let live_expected = breaks == Break::Nothing || control;
    if (lock_expected && (!overlaps.is_empty() || !covers.is_empty()))
        || (live_expected && stalled > 0)
        || (!flawed && !fences.is_empty())
        || (breaks != Break::DeadlineNotRearmed || control) && !late.is_empty()
        || (live_expected && (!slow.is_empty() || !loops.is_empty() || !stuck.is_empty()))
    {
        std::process::exit(1);
    }
}

/// The schedules among `violations` that found `what`: (seed, what it found).
fn found<'a, T>(
    violations: &'a [Report],
    what: impl Fn(&'a Report) -> &'a Option<T>,
) -> Vec<(u64, &'a Option<T>)> {
    violations
        .iter()
        .map(|r| (r.seed, what(r)))
        .filter(|(_, v)| v.is_some())
        .collect()
}

/// Prints how many schedules found something of a kind, and the first ten.
fn show<T: std::fmt::Debug>(label: &str, found: &[(u64, &Option<T>)]) {
    println!("{label}: {}", found.len());
    for (seed, v) in found.iter().take(10) {
        println!("  seed {seed}: {v:?}");
    }
}
