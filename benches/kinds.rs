//! The kinds of lock side by side with the plain lock, in one run: one caller
//! (K = 1) doing acquire + release cycles on five local servers, each kind measured in turn
//! within every round, the order rotated from round to round. Prints per kind the median of
//! the rounds' p50s and p99s and the median of the same-round ratios to the plain cycle.
//!
//! ```text
//! cargo bench --bench kinds [-- ROUNDS [MS_PER_KIND_PER_ROUND] [--relay-us US]]
//! ```
//!
//! `--relay-us US` puts a relay delaying each direction by US µs in front of every server
//! (`redis_local::Relay`; this kernel has no netem): the same cycles over a network whose round
//! trip is 2 × US, where the round trip rather than the servers' CPU sets a cycle's time.
//!
//! Then K = 64 threads sharing one `Redlock` (the scale rows): plain locks of 64 distinct
//! resources against shared locks of one resource, alternated the same way; throughput and the
//! same-round ratio.
//!
//! Goals: a shared-lock cycle and a semaphore's permit cycle (`try_acquire_permit`
//! on P = 3 + `unlock`) within 1.2× a plain cycle, a set of 8 resources within 1.5×; K = 64
//! readers of one resource ≥ 0.5× K = 64 plain locks of distinct resources. A cycle that fails
//! (a loaded machine: too slow, no quorum) is counted, not measured. The bench starts its own
//! `redis-server` processes; under `cargo test` (no `--bench`) it starts nothing.

use std::time::{Duration, Instant};

mod support;

use redis_local::{Cluster, Relay};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redlock_mux::{Builder, Client, Redlock, ResourceSet};

/// One kind's cycle on a client.
struct Kind {
    name: &'static str,
    goal: Option<f64>,
    /// One acquire + release; false if the acquire failed.
    cycle: Box<dyn FnMut(&mut Client) -> bool>,
}

fn kinds() -> Vec<Kind> {
    let set8 = ResourceSet::new((0..8).map(|i| format!("bench:set:{i}"))).expect("a set");
    let set2 = ResourceSet::new(["bench:pair:a", "bench:pair:b"]).expect("a set");
    vec![
        Kind {
            name: "plain",
            goal: None,
            cycle: Box::new(|c| {
                c.try_lock("bench:plain")
                    .map(|lock| c.unlock(lock).is_ok())
                    .unwrap_or(false)
            }),
        },
        Kind {
            name: "shared (reader)",
            goal: Some(1.2),
            cycle: Box::new(|c| {
                c.try_lock_shared("bench:shared")
                    .map(|lock| c.unlock(lock).is_ok())
                    .unwrap_or(false)
            }),
        },
        Kind {
            name: "set of 2",
            goal: None,
            cycle: Box::new(move |c| {
                c.try_lock(&set2)
                    .map(|lock| c.unlock(lock).is_ok())
                    .unwrap_or(false)
            }),
        },
        Kind {
            name: "set of 8",
            goal: Some(1.5),
            cycle: Box::new(move |c| {
                c.try_lock(&set8)
                    .map(|lock| c.unlock(lock).is_ok())
                    .unwrap_or(false)
            }),
        },
        Kind {
            name: "permit of 3",
            goal: Some(1.2),
            cycle: Box::new(|c| {
                c.try_acquire_permit("bench:sem", 3)
                    .map(|lock| c.unlock(lock).is_ok())
                    .unwrap_or(false)
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

/// K threads sharing `redlock` for `per`: cycles per second. `shared`: shared locks of one
/// resource; else plain locks of K distinct resources.
fn scale(redlock: &Redlock, k: usize, shared: bool, per: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..k)
        .map(|i| {
            let (redlock, stop, cycles) = (redlock.clone(), stop.clone(), cycles.clone());
            std::thread::spawn(move || {
                let name = format!("bench:scale:{i}");
                while !stop.load(Ordering::Relaxed) {
                    let lock = if shared {
                        redlock.try_lock_shared("bench:scale:shared")
                    } else {
                        redlock.try_lock(&name)
                    };
                    // A failed cycle (a loaded machine) is not counted.
                    if lock.is_ok_and(|lock| redlock.unlock(lock).is_ok()) {
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (c0, t0) = (cycles.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(per);
    let rate = (cycles.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a bench thread");
    }
    rate
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("benches/kinds.rs: runs only under `cargo bench` (it starts redis-server)");
        return;
    }
    let relay_us: Option<u64> = args.iter().position(|a| a == "--relay-us").map(|i| {
        args.get(i + 1)
            .and_then(|v| v.parse().ok())
            .expect("--relay-us US")
    });
    let free: Vec<u64> = args
        .iter()
        .enumerate()
        .filter(|(i, _)| relay_us.is_none() || args[i.saturating_sub(1)] != "--relay-us")
        .filter_map(|(_, a)| a.parse().ok())
        .collect();
    let rounds = free.first().copied().unwrap_or(7) as usize;
    let per = Duration::from_millis(free.get(1).copied().unwrap_or(1_500));

    let servers = Cluster::start(5);
    let relays: Vec<Relay> = match relay_us {
        Some(us) => servers
            .iter()
            .map(|s| Relay::start(s.socket_addr(), Duration::from_micros(us)))
            .collect(),
        None => Vec::new(),
    };
    let urls: Vec<String> = match relay_us {
        Some(_) => relays.iter().map(Relay::url).collect(),
        None => servers.urls(),
    };
    let mut client = Builder::new(urls.clone())
        .quarantine(None)
        .build_client()
        .expect("a client");
    client.connect(Duration::from_secs(5));
    let mut kinds = kinds();
    // p50 and p99 per kind per round (µs).
    let mut p50: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut p99: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut samples: Vec<Duration> = Vec::with_capacity(100_000);
    let mut failed = vec![0u64; kinds.len()];
    // The five servers' CPU (user + system, as the scale scenario reads it) per cycle, µs, per
    // kind per round: on loopback they share the cores with the client and set the cycle's time.
    let pids: Vec<u32> = servers.iter().map(|s| s.pid()).collect();
    let mut server_us: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        for i in 0..kinds.len() {
            let k = (i + round) % kinds.len();
            let kind = &mut kinds[k];
            for _ in 0..200 {
                (kind.cycle)(&mut client);
            }
            samples.clear();
            let (cpu0, failed0) = (support::scale::processes_cpu(&pids), failed[k]);
            let end = Instant::now() + per;
            while Instant::now() < end {
                let t = Instant::now();
                if (kind.cycle)(&mut client) {
                    samples.push(t.elapsed());
                } else {
                    failed[k] += 1;
                }
            }
            // Failed cycles cost the servers too: per cycle tried.
            let cpu = support::scale::processes_cpu(&pids)
                .saturating_sub(cpu0)
                .as_secs_f64();
            let tried = samples.len() as u64 + failed[k] - failed0;
            server_us[k].push(cpu * 1e6 / tried.max(1) as f64);
            if samples.is_empty() {
                samples.push(per);
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
    let network = match relay_us {
        Some(us) => format!("each behind a relay delaying {us} µs each way"),
        None => "loopback".to_owned(),
    };
    println!(
        "kinds: K = 1, 5 local servers ({network}), {rounds} rounds × {per:?} per kind, order rotated; {cpu}, {} CPUs",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "| kind (K = 1) | p50 µs | p99 µs | p50 ÷ plain p50 (same round, median) | goal | failed cycles | servers' CPU µs per cycle (sum of 5, median) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (k, kind) in kinds.iter().enumerate() {
        let ratios: Vec<f64> = (0..rounds).map(|r| p50[k][r] / p50[0][r]).collect();
        let ratio = median(ratios);
        let goal = match kind.goal {
            Some(g) => format!("≤ {g}× ({})", if ratio <= g { "met" } else { "missed" }),
            None => "—".into(),
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.2} | {goal} | {} | {:.1} |",
            kind.name,
            median(p50[k].clone()),
            median(p99[k].clone()),
            ratio,
            failed[k],
            median(server_us[k].clone())
        );
    }

    // The scale rows: K = 64 threads on one handle.
    let redlock = Builder::new(urls)
        .quarantine(None)
        .build()
        .expect("a handle");
    redlock.connect(Duration::from_secs(5)).expect("connected");
    let k = 64;
    let (mut plain, mut shared, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (p, s) = if round % 2 == 0 {
            let p = scale(&redlock, k, false, per);
            (p, scale(&redlock, k, true, per))
        } else {
            let s = scale(&redlock, k, true, per);
            (scale(&redlock, k, false, per), s)
        };
        plain.push(p);
        shared.push(s);
        ratios.push(s / p);
    }
    let ratio = median(ratios);
    println!();
    println!(
        "| K = {k} threads, one handle | cycles/s (median) | ÷ plain (same round, median) | goal |"
    );
    println!("|---|---|---|---|");
    println!(
        "| plain locks, {k} distinct resources | {:.0} | 1.00 | — |",
        median(plain)
    );
    println!(
        "| shared locks, one resource | {:.0} | {ratio:.2} | ≥ 0.5× ({}) |",
        median(shared),
        if ratio >= 0.5 { "met" } else { "missed" }
    );
}
