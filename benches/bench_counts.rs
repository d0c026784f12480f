//! Counts that do not depend on the machine, for one implementation: allocations per cycle
//! (counting global allocator), and, run under `strace -c -f` or `valgrind --tool=callgrind` by
//! `scripts/bench-counts`, syscalls and instructions per cycle (by the difference of two runs
//! with different cycle counts, which cancels start-up and connection set-up).
//!
//! ```text
//! bench_counts IMPL URL[,URL...] WARMUP CYCLES
//! bench_counts IMPL URL[,URL...] WARMUP CYCLES K
//! ```
//!
//! `IMPL` is `redlock-mux` (or `mux`), `seq` or `floor`; the servers must already run. Prints one
//! line of `key=value` pairs.
//!
//! With `K`, the `scale` scenario's callers (benches/support/scale.rs): `IMPL` is `redlock-mux`
//! (K OS threads sharing one `Redlock`), `floor` (one thread, K cycles per batch) or `rslock` (K
//! tokio tasks, 2 workers); CYCLES in all, CYCLES / K per caller (WARMUP is ignored: every caller
//! warms up with `scale::WARMUP` cycles). `allocs_total` counts the whole process, for a
//! difference of two runs.

mod support;

use redis_local::CountingAlloc;
use support::clients::{self, Kind};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        // `cargo test --all-targets` runs bench targets without arguments: counts need servers.
        eprintln!("bench_counts: no arguments, nothing run (scripts/bench-counts runs it)");
        return;
    }
    if args.len() == 5 {
        return scale_counts(&args);
    }
    if args.len() != 4 {
        eprintln!("usage: bench_counts IMPL URL[,URL...] WARMUP CYCLES [K]");
        std::process::exit(2);
    }
    let kind =
        Kind::parse(&args[0]).unwrap_or_else(|| panic!("unknown implementation {}", args[0]));
    let urls: Vec<String> = args[1].split(',').map(str::to_owned).collect();
    let warmup: u64 = args[2].parse().expect("WARMUP");
    let cycles: u64 = args[3].parse().expect("CYCLES");
    let resource = "bench:counts";

    let (mut mux, mut other) = match kind {
        Kind::Mux => (Some(clients::Mux::new(&urls)), None),
        Kind::Seq | Kind::Floor => (None, Some(clients::make(kind, &urls))),
        _ => panic!("counts are for redlock-mux, seq and floor"),
    };
    let mut cycle = |mux: &mut Option<clients::Mux>| -> Result<(), String> {
        use support::clients::Cycle;
        match (mux.as_mut(), other.as_mut()) {
            (Some(m), _) => m.cycle(resource),
            (None, Some(o)) => o.cycle(resource),
            _ => unreachable!(),
        }
    };
    for _ in 0..warmup {
        cycle(&mut mux).expect("warm-up cycle");
    }
    let io_before = mux.as_ref().map(|m| m.client.stats().io);
    let (a0, b0) = (CountingAlloc::allocations(), CountingAlloc::bytes());
    let mut failed = 0u64;
    for _ in 0..cycles {
        if cycle(&mut mux).is_err() {
            failed += 1;
        }
    }
    let (a1, b1) = (CountingAlloc::allocations(), CountingAlloc::bytes());
    let per = |x: u64| x as f64 / cycles.max(1) as f64;
    let mut line = format!(
        "impl={} n={} warmup={warmup} cycles={cycles} failed={failed} allocs={} allocs_per_cycle={:.3} alloc_bytes_per_cycle={:.1}",
        kind.name(),
        urls.len(),
        a1 - a0,
        per(a1 - a0),
        per(b1 - b0)
    );
    if let (Some(m), Some(before)) = (&mux, io_before) {
        let after = m.client.stats().io;
        line.push_str(&format!(
            " io_writes_per_cycle={:.3} io_reads_per_cycle={:.3} io_polls_per_cycle={:.3} io_connects={}",
            per(after.writes - before.writes),
            per(after.reads - before.reads),
            per(after.polls - before.polls),
            after.connects - before.connects
        ));
    }
    println!("{line}");
}

/// `bench_counts IMPL URLS WARMUP CYCLES K`: the scale scenario's callers, CYCLES in all.
fn scale_counts(args: &[String]) {
    use support::scale::{self, Stop};
    let kind =
        Kind::parse(&args[0]).unwrap_or_else(|| panic!("unknown implementation {}", args[0]));
    let urls: Vec<String> = args[1].split(',').map(str::to_owned).collect();
    let cycles: u64 = args[3].parse().expect("CYCLES");
    let k: usize = args[4].parse().expect("K");
    assert!(
        k > 0 && cycles.is_multiple_of(k as u64),
        "CYCLES must be a multiple of K"
    );
    scale::ensure_nofile((k * (urls.len() + 2) + 1024) as u64);
    let stop = Stop::Cycles(cycles / k as u64);
    let tag = format!("counts:scale:{}:{k}:{cycles}", kind.name());
    let hard = std::time::Duration::from_secs(600);
    let mut on_ready = || {};
    let run = match kind {
        Kind::Mux => scale::run_mux(&urls, k, stop, &tag, hard, false, &mut on_ready),
        Kind::Floor => scale::run_floor(&urls, k, stop, &tag, &mut on_ready),
        Kind::Rslock => scale::run_rslock(&urls, k, stop, &tag, hard, &mut on_ready),
        other => panic!("no scale runner for {other:?}"),
    };
    let total = run.cycles + run.failed;
    let per = |x: u64| x as f64 / total.max(1) as f64;
    let mut line = format!(
        "impl={} n={} k={k} cycles={} failed={} finished={} allocs_total={} alloc_bytes_total={}",
        kind.name(),
        urls.len(),
        run.cycles,
        run.failed,
        run.finished,
        CountingAlloc::allocations(),
        CountingAlloc::bytes(),
    );
    if let Some(io) = run.io {
        line.push_str(&format!(
            " io_writes_per_cycle={:.3} io_reads_per_cycle={:.3} io_polls_per_cycle={:.3} io_connects={}",
            per(io.writes),
            per(io.reads),
            per(io.polls),
            io.connects
        ));
    }
    println!("{line}");
}
