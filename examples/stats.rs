//! The counters and latency histograms of `Redlock::stats()`: what to watch in production.
//!
//! ```text
//! cargo run --release --example stats                      # starts 3 local redis-servers
//! cargo run --release --example stats -- redis://127.0.0.1:7001 redis://127.0.0.1:7002 redis://127.0.0.1:7003
//! ```
//!
//! Runs 1,000 lock cycles, then prints per node (requests, replies, timeouts, reconnects,
//! request latency percentiles), per operation (outcomes, latency), the syscalls per cycle and
//! the kept locks' renewals.

use std::time::Duration;

use redis_local::Cluster;
use redlock_mux::{Builder, Histogram};

const CYCLES: usize = 1_000;

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn percentiles(h: &Histogram) -> String {
    format!(
        "n {} mean {} p50 {} p99 {} max {}",
        h.count(),
        ms(h.mean()),
        ms(h.percentile(50.0)),
        ms(h.percentile(99.0)),
        ms(h.max())
    )
}

fn main() -> Result<(), redlock_mux::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let local = args.is_empty().then(|| Cluster::start(3));
    let urls = local.as_ref().map_or(args, |s| s.urls());
    let mut builder = Builder::new(&urls);
    if local.is_some() {
        // Servers this example just started: never held a lock (keep the quarantine on yours).
        builder = builder.quarantine(None);
    }
    let redlock = builder.build()?;
    for i in 0..CYCLES {
        let lock = redlock.lock(format!("stats:{}", i % 16))?;
        redlock.unlock(lock)?;
    }

    let stats = redlock.stats();
    for n in &stats.nodes {
        println!(
            "{}: {} requests, {} ok, {} refused, {} errors, {} failures, {} timeouts, {} late \
             yes, {} reconnects, {} NOSCRIPT\n    latency {}",
            n.node,
            n.requests,
            n.ok,
            n.refused,
            n.errors,
            n.failures,
            n.timeouts,
            n.late_yes,
            n.reconnects,
            n.noscript,
            percentiles(&n.latency)
        );
    }
    for (name, op) in [
        ("acquire", &stats.acquire),
        ("extend", &stats.extend),
        ("release", &stats.release),
    ] {
        println!(
            "{name}: {} ok, {} refused, {} no quorum, {} failed; {}",
            op.ok,
            op.refused,
            op.no_quorum,
            op.failed,
            percentiles(&op.latency)
        );
    }
    // Syscalls of the engine's connections and loop, all nodes together (connecting included).
    let per = |n: u64| n as f64 / CYCLES as f64;
    println!(
        "syscalls per cycle: {:.2} write, {:.2} read, {:.2} poll; {} wakes of the loop, {} connects",
        per(stats.io.writes),
        per(stats.io.reads),
        per(stats.io.polls),
        stats.io.wakes,
        stats.io.connects
    );
    println!(
        "kept locks: {} renewal batches, {} writes, {} extended, {} lost renewals tried again",
        stats.keep.batches, stats.keep.writes, stats.keep.extended, stats.keep.retried
    );
    assert_eq!(stats.acquire.ok, CYCLES as u64);
    Ok(())
}
