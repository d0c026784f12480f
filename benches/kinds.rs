//! The kinds of lock side by side with the plain lock (issue 38), in one run: one caller
//! (K = 1) doing acquire + release cycles on five local servers, each kind measured in turn
//! within every round, the order rotated from round to round. Prints per kind the median of
//! the rounds' p50s and p99s and the median of the same-round ratios to the plain cycle.
//!
//! ```text
//! cargo bench --bench kinds [-- ROUNDS [MS_PER_KIND_PER_ROUND]]
//! ```
//!
//! Goals (issue 38): a set of 8 resources within 1.5× a plain cycle; a semaphore's permit cycle
//! (`try_acquire_permit` on P = 3 + `unlock`) within 1.2×. The bench starts its own
//! `redis-server` processes; under `cargo test` (no `--bench`) it starts nothing.

use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Client, ResourceSet};

/// One kind's cycle on a client.
struct Kind {
    name: &'static str,
    goal: Option<f64>,
    cycle: Box<dyn FnMut(&mut Client)>,
}

fn kinds() -> Vec<Kind> {
    let set8 = ResourceSet::new((0..8).map(|i| format!("bench:set:{i}"))).expect("a set");
    let set2 = ResourceSet::new(["bench:pair:a", "bench:pair:b"]).expect("a set");
    vec![
        Kind {
            name: "plain",
            goal: None,
            cycle: Box::new(|c| {
                let lock = c.try_lock("bench:plain").expect("plain lock");
                c.unlock(lock).expect("release");
            }),
        },
        Kind {
            name: "set of 2",
            goal: None,
            cycle: Box::new(move |c| {
                let lock = c.try_lock(&set2).expect("set of 2");
                c.unlock(lock).expect("release");
            }),
        },
        Kind {
            name: "set of 8",
            goal: Some(1.5),
            cycle: Box::new(move |c| {
                let lock = c.try_lock(&set8).expect("set of 8");
                c.unlock(lock).expect("release");
            }),
        },
        Kind {
            name: "permit of 3",
            goal: Some(1.2),
            cycle: Box::new(|c| {
                let permit = c.try_acquire_permit("bench:sem", 3).expect("a permit");
                c.unlock(permit).expect("release");
            }),
        },
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("benches/kinds.rs: runs only under `cargo bench` (it starts redis-server)");
        return;
    }
    let free: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let rounds = free.first().copied().unwrap_or(7) as usize;
    let per = Duration::from_millis(free.get(1).copied().unwrap_or(1_500));

    let servers = Cluster::start(5);
    let mut client = Builder::new(servers.urls())
        .quarantine(None)
        .build_client()
        .expect("a client");
    client.connect(Duration::from_secs(5));
    let mut kinds = kinds();
    // p50 and p99 per kind per round (µs).
    let mut p50: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut p99: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut samples: Vec<Duration> = Vec::with_capacity(100_000);
    for round in 0..rounds {
        for i in 0..kinds.len() {
            let k = (i + round) % kinds.len();
            let kind = &mut kinds[k];
            for _ in 0..200 {
                (kind.cycle)(&mut client);
            }
            samples.clear();
            let end = Instant::now() + per;
            while Instant::now() < end {
                let t = Instant::now();
                (kind.cycle)(&mut client);
                samples.push(t.elapsed());
            }
            samples.sort_unstable();
            p50[k].push(percentile(&samples, 0.5).as_secs_f64() * 1e6);
            p99[k].push(percentile(&samples, 0.99).as_secs_f64() * 1e6);
        }
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    println!(
        "kinds: K = 1, 5 local servers, {rounds} rounds × {per:?} per kind, order rotated; {cpu}, {} CPUs",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| kind | p50 µs | p99 µs | p50 ÷ plain p50 (same round, median) | goal |");
    println!("|---|---|---|---|---|");
    for (k, kind) in kinds.iter().enumerate() {
        let ratios: Vec<f64> = (0..rounds).map(|r| p50[k][r] / p50[0][r]).collect();
        let ratio = median(ratios);
        let goal = match kind.goal {
            Some(g) => format!("≤ {g}× ({})", if ratio <= g { "met" } else { "missed" }),
            None => "—".into(),
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.2} | {goal} |",
            kind.name,
            median(p50[k].clone()),
            median(p99[k].clone()),
            ratio
        );
    }
}
