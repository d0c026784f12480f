//! Hand-offs between clients: H handles (H engines, H sets of connections — H clients, as H
//! processes would be), each with C threads, all locking ONE resource in a loop (`lock_until`,
//! then `unlock` at once), in front of five servers reached three ways: directly (loopback),
//! through relays that delay every byte by 800 µs each way (even), and through relays whose
//! delays differ per node, 50 µs to 2 ms each way (skewed: a multi-zone deployment, where
//! waiters woken by one release notice reach the nodes in different orders). Every case runs
//! with release notices on and off, in rounds whose order alternates.
//!
//! Prints grants per second (after a 300 ms warm-up), the acquire latency's median and p99,
//! and the fewest and most grants of one handle (fairness). With notices off, a waiter of
//! another client only learns of a release at its fallback poll: the releasing client mostly
//! takes the lock again, so its throughput is high and its fairness and p99 poor.
//!
//! ```text
//! cargo bench --bench handoff -- [HANDLES] [CALLERS] [SECONDS] [ROUNDS]   (8 1 3 2)
//! ```
//!
//! What it showed (docs/benchmarks.md, "Hand-offs between clients"): before release notices
//! said how many clients heard them, every notified waiter attempted at once and their votes
//! split; behind the relays that halved the hand-off rate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_local::{Cluster, Relay};
use redlock_mux::Builder;

fn main() {
    // `cargo bench` passes `--bench`; the numbers are ours.
    let args: Vec<usize> = (std::env::args().skip(1))
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (handles, callers) = (arg(0, 8), arg(1, 1));
    let (time, rounds) = (Duration::from_secs(arg(2, 3) as u64), arg(3, 2));
    let cluster = Cluster::start(5);
    let addrs: Vec<SocketAddr> = (cluster.addrs().iter())
        .map(|a| a.parse().expect("a server's address"))
        .collect();
    let relays = |delays: [u64; 5]| -> Vec<Relay> {
        (addrs.iter().zip(delays))
            .map(|(a, us)| Relay::start(*a, Duration::from_micros(us)))
            .collect()
    };
    let even = relays([800; 5]);
    let skewed = relays([50, 300, 700, 1_200, 2_000]);
    let setups = [
        ("loopback", cluster.urls()),
        ("even 800 µs", even.iter().map(Relay::url).collect()),
        ("skewed 50 µs–2 ms", skewed.iter().map(Relay::url).collect()),
    ];
    println!(
        "{handles} handles × {callers} callers, one resource, {} s per case",
        time.as_secs()
    );
    println!("round | servers | notices | grants/s | p50 ms | p99 ms | fewest / most of a handle");
    for round in 0..rounds {
        for (name, urls) in &setups {
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for notices in order {
                let r = run(urls, (handles, callers), time, notices);
                println!(
                    "{round} | {name} | {notices} | {:.1} | {:.2} | {:.2} | {} / {}",
                    r.grants as f64 / time.as_secs_f64(),
                    r.p50,
                    r.p99,
                    r.fewest,
                    r.most
                );
            }
        }
    }
}

struct Run {
    grants: u64,
    p50: f64,
    p99: f64,
    fewest: u64,
    most: u64,
}

fn run(urls: &[String], (handles, callers): (usize, usize), time: Duration, notices: bool) -> Run {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let resource = format!("handoff-{}", CASE.fetch_add(1, Ordering::Relaxed));
    let stop = Arc::new(AtomicBool::new(false));
    let per: Arc<Vec<AtomicU64>> = Arc::new((0..handles).map(|_| AtomicU64::new(0)).collect());
    let mut threads = Vec::new();
    for h in 0..handles {
        let redlock = (Builder::new(urls.to_vec()))
            .ttl(Duration::from_secs(2))
            .release_notices(notices)
            .build()
            .expect("a handle");
        for _ in 0..callers {
            let (redlock, stop, per) = (redlock.clone(), stop.clone(), per.clone());
            let resource = resource.clone();
            threads.push(thread::spawn(move || {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let deadline = start + Duration::from_secs(5);
                    if let Ok(lock) = redlock.lock_until(&resource, deadline) {
                        latencies.push(start.elapsed());
                        per[h].fetch_add(1, Ordering::Relaxed);
                        let _ = redlock.unlock(lock);
                    }
                }
                latencies
            }));
        }
    }
    let total = |per: &[AtomicU64]| per.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
    thread::sleep(Duration::from_millis(300));
    let before = total(&per);
    let shares: Vec<u64> = per.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    thread::sleep(time);
    let grants = total(&per) - before;
    let mut during: Vec<u64> = (per.iter().zip(shares))
        .map(|(a, s)| a.load(Ordering::Relaxed) - s)
        .collect();
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = (threads.into_iter())
        .flat_map(|t| t.join().expect("a caller"))
        .collect();
    latencies.sort();
    let q = |f: f64| {
        let i = ((latencies.len().max(1) - 1) as f64 * f) as usize;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    during.sort();
    Run {
        grants,
        p50: q(0.5),
        p99: q(0.99),
        fewest: during[0],
        most: during[during.len() - 1],
    }
}
