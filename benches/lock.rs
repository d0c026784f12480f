//! Criterion benchmarks of one uncontended acquire + release cycle, this crate against redis-rs
//! node after node (`seq`), `rslock`, the `redlock` crate and a hand-rolled multiplexed `floor`,
//! on loopback (N = 1, 3, 5) and behind a 250 µs one-way delay relay (N = 5); and a
//! semaphore's permit cycle (P = 3) beside a plain cycle (N = 5). The bench starts
//! its own `redis-server` processes.
//!
//! ```text
//! cargo bench --bench lock [-- FILTER]
//! ```
//!
//! The side-by-side table with same-round ratios, p99, fault and contention scenarios is
//! `examples/bench_table.rs` (`scripts/bench`). Under `cargo test` (no `--bench` argument) this
//! target starts nothing and returns at once.

mod support;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use redis_local::{Cluster, Relay};
use support::clients::{self, Kind};

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "benches/lock.rs: benchmarks run only under `cargo bench` (they start redis-server)"
        );
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();

    let servers = Cluster::start(5);
    let direct = servers.urls();
    for n in [1, 3, 5] {
        let mut group = c.benchmark_group(format!("loopback/N={n}"));
        for kind in Kind::ALL {
            let id = BenchmarkId::from_parameter(kind.name());
            if !group_wants(&c_filter(), &format!("loopback/N={n}/{}", kind.name())) {
                continue;
            }
            let mut client = clients::make(kind, &direct[..n]);
            group.bench_function(id, |b| {
                b.iter(|| client.cycle("criterion:loopback").expect("cycle"))
            });
        }
        group.finish();
    }

    // A permit cycle (try_acquire on P = 3 permits + unlock) beside a plain cycle (try_lock +
    // unlock), K = 1, N = 5, one shared handle each, in the same run. Goal: within 1.2×.
    let mut group = c.benchmark_group("semaphore/N=5");
    let redlock = redlock_mux::Builder::new(&direct)
        .quarantine(None)
        .build()
        .expect("handle");
    if group_wants(&c_filter(), "semaphore/N=5/plain") {
        group.bench_function("plain", |b| {
            b.iter(|| {
                let lock = redlock.try_lock("criterion:plain").expect("lock");
                assert_eq!(redlock.unlock(lock).expect("unlock"), 5);
            })
        });
    }
    let sem = redlock.semaphore("criterion:sem", 3).expect("semaphore");
    if group_wants(&c_filter(), "semaphore/N=5/permit-P=3") {
        group.bench_function("permit-P=3", |b| {
            b.iter(|| {
                let permit = sem.try_acquire().expect("permit");
                assert_eq!(redlock.unlock(permit).expect("unlock"), 5);
            })
        });
    }
    group.finish();

    let relays: Vec<Relay> = servers
        .iter()
        .map(|s| Relay::start(s.socket_addr(), Duration::from_micros(250)))
        .collect();
    let urls: Vec<String> = relays.iter().map(Relay::url).collect();
    let mut group = c.benchmark_group("relay250us/N=5");
    group.measurement_time(Duration::from_secs(5));
    for kind in Kind::ALL {
        if !group_wants(&c_filter(), &format!("relay250us/N=5/{}", kind.name())) {
            continue;
        }
        let mut client = clients::make(kind, &urls);
        group.bench_function(BenchmarkId::from_parameter(kind.name()), |b| {
            b.iter(|| client.cycle("criterion:relay").expect("cycle"))
        });
    }
    group.finish();
    c.final_summary();
}

/// The first free argument (criterion's filter), if any.
fn c_filter() -> Option<String> {
    const WITH_VALUE: &[&str] = &[
        "--save-baseline",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--measurement-time",
        "--warm-up-time",
        "--sample-size",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--nresamples",
        "--profile-time",
        "--color",
        "--output-format",
        "--format",
        "--plotting-backend",
    ];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if WITH_VALUE.contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            return Some(a);
        }
    }
    None
}

/// Clients are only built for benchmarks the filter selects (building one connects).
fn group_wants(filter: &Option<String>, id: &str) -> bool {
    filter.as_ref().is_none_or(|f| id.contains(f.as_str()))
}
