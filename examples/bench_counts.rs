//! Counts that do not depend on the machine, for one implementation: allocations per cycle
//! (counting global allocator), and, run under `strace -c -f` or `valgrind --tool=callgrind` by
//! `scripts/bench-counts`, syscalls and instructions per cycle (by the difference of two runs
//! with different cycle counts, which cancels start-up and connection set-up).
//!
//! ```text
//! bench_counts IMPL URL[,URL...] WARMUP CYCLES
//! ```
//!
//! `IMPL` is `redlock-mux` (or `mux`), `seq` or `floor`; the servers must already run. Prints one
//! line of `key=value` pairs.

#[path = "../benches/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use support::clients::{self, Kind};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 {
        eprintln!("usage: bench_counts IMPL URL[,URL...] WARMUP CYCLES");
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
    let io_before = mux.as_ref().map(|m| m.client.io_stats());
    let (a0, b0) = (ALLOCS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));
    let mut failed = 0u64;
    for _ in 0..cycles {
        if cycle(&mut mux).is_err() {
            failed += 1;
        }
    }
    let (a1, b1) = (ALLOCS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));
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
        let after = m.client.io_stats();
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
