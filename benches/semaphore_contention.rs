//! Throw-away prototype for the question "which is faster under contention": this
//! crate's semaphore (each permit a Redlock on `<name>#<i>`) against per-node counters (a Lua
//! script per node: a sorted set of holders with expiries, admit while `ZCARD < P`, a majority
//! of nodes to admit). The counter variant is UNSAFE — P + 1 holders fit on majorities as soon
//! as (P + 1)·⌊M/2 + 1⌋ ≤ P·M — and is not part of the library; it lives only here, with a
//! minimal RESP client of its own (all N requests written, then the N replies read).
//!
//! K threads contend for P = 3 permits on 5 local servers; each cycle is acquire (retried after
//! a random 0.5–1.5 ms pause while refused, the same for every variant), a critical section
//! that yields once, release. Reports cycles/s, p99 acquire latency and the most holders seen
//! at once, in rounds with the variants' order alternated.
//!
//! ```text
//! cargo bench --bench semaphore_contention [-- SECONDS ROUNDS [permits]]
//! taskset -c 0 cargo bench --bench semaphore_contention
//! ```
//!
//! With `permits` as third argument only the per-permit variants run (the counter is left out):
//!
//! ```text
//! cargo bench --bench semaphore_contention -- 2 3 permits
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rand::RngExt;
use redis_local::Cluster;
use redlock_mux::{Builder, Client, Redlock};

const P: u32 = 3;
const TTL_MS: u64 = 10_000;

const ACQUIRE: &str = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000) \
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) \
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then \
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1]) redis.call('PEXPIRE', KEYS[1], ARGV[3]) return 1 end return 0";

fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// One thread's connections to every node, for the counter variant.
struct Counters {
    nodes: Vec<(TcpStream, BufReader<TcpStream>)>,
}

impl Counters {
    fn new(addrs: &[String]) -> Counters {
        let nodes = addrs
            .iter()
            .map(|a| {
                let s = TcpStream::connect(a).unwrap();
                s.set_nodelay(true).unwrap();
                (s.try_clone().unwrap(), BufReader::new(s))
            })
            .collect();
        Counters { nodes }
    }

    /// Every node gets `cmd`, then every reply is read: the integers answered.
    fn all(&mut self, cmd: &[u8]) -> Vec<i64> {
        for (w, _) in &mut self.nodes {
            w.write_all(cmd).unwrap();
        }
        self.nodes
            .iter_mut()
            .map(|(_, r)| {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                assert!(line.starts_with(':'), "{line}");
                line[1..].trim().parse().unwrap()
            })
            .collect()
    }

    fn try_acquire(&mut self, token: &str) -> bool {
        let ttl = TTL_MS.to_string();
        let cmd = resp(&["EVAL", ACQUIRE, "1", "ctr", token, &P.to_string(), &ttl]);
        let yes = self.all(&cmd).iter().filter(|&&v| v == 1).count();
        if yes > self.nodes.len() / 2 {
            return true;
        }
        self.release(token);
        false
    }

    fn release(&mut self, token: &str) {
        self.all(&resp(&["ZREM", "ctr", token]));
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Variant {
    /// Per-permit Redlocks, each thread a `Client` of its own, the same retry loop as Counter.
    Permits,
    /// Per-permit Redlocks through one shared handle and `Semaphore::acquire_until` (the
    /// library's own waiting: queues and release notices), as a user would write it.
    PermitsShared,
    /// Per-node counters (unsafe).
    Counter,
}

struct Result {
    cycles_per_s: f64,
    p99: Duration,
    max_holders: usize,
}

fn pause(rng: &mut impl rand::Rng) {
    std::thread::sleep(Duration::from_micros(rng.random_range(500..1500)));
}

fn run(variant: Variant, k: usize, secs: f64, urls: &[String], addrs: &[String]) -> Result {
    let stop = Arc::new(AtomicBool::new(false));
    let holders = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(k + 1));
    let shared: Redlock = Builder::new(urls).quarantine(None).build().unwrap();
    let threads: Vec<_> = (0..k)
        .map(|t| {
            let (stop, holders, max, start) =
                (stop.clone(), holders.clone(), max.clone(), start.clone());
            let (urls, addrs, shared) = (urls.to_vec(), addrs.to_vec(), shared.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rng();
                let mut lat = Vec::new();
                let mut client: Option<Client> = (variant == Variant::Permits)
                    .then(|| Builder::new(&urls).quarantine(None).build_client().unwrap());
                let mut counters = (variant == Variant::Counter).then(|| Counters::new(&addrs));
                let sem = shared.semaphore("bench-sem", P).unwrap();
                start.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let token = format!("t{t}-{n}");
                    n += 1;
                    // Acquire.
                    let permit = match variant {
                        Variant::Permits => loop {
                            match client.as_mut().unwrap().try_acquire_permit("bench-sem", P) {
                                Ok(l) => break Some(l),
                                Err(_) => pause(&mut rng),
                            }
                        },
                        Variant::PermitsShared => Some(
                            sem.acquire_until(Instant::now() + Duration::from_secs(30))
                                .unwrap(),
                        ),
                        Variant::Counter => {
                            while !counters.as_mut().unwrap().try_acquire(&token) {
                                pause(&mut rng);
                            }
                            None
                        }
                    };
                    lat.push(t0.elapsed());
                    let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(h, Ordering::SeqCst);
                    std::thread::yield_now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    match (variant, permit) {
                        (Variant::Permits, Some(l)) => {
                            let _ = client.as_mut().unwrap().unlock(l);
                        }
                        (Variant::PermitsShared, Some(l)) => {
                            let _ = shared.unlock(l);
                        }
                        _ => counters.as_mut().unwrap().release(&token),
                    }
                }
                lat
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::SeqCst);
    let mut lat: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let elapsed = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    Result {
        cycles_per_s: lat.len() as f64 / elapsed,
        p99: lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
        max_holders: max.load(Ordering::SeqCst),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let args: Vec<String> = std::env::args().filter(|a| !a.starts_with('-')).collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let servers = Cluster::start(5);
    let (urls, addrs) = (servers.urls(), servers.addrs());
    let variants: &[Variant] = if args.get(3).is_some_and(|a| a == "permits") {
        &[Variant::Permits, Variant::PermitsShared]
    } else {
        &[Variant::Permits, Variant::PermitsShared, Variant::Counter]
    };
    println!("| K | variant | cycles/s (median) | p99 acquire (median) | most holders seen |");
    println!("|---|---|---|---|---|");
    for k in [8, 32] {
        let mut per: Vec<(Vec<f64>, Vec<f64>, usize)> =
            variants.iter().map(|_| (vec![], vec![], 0)).collect();
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..variants.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let r = run(variants[i], k, secs, &urls, &addrs);
                per[i].0.push(r.cycles_per_s);
                per[i].1.push(r.p99.as_secs_f64() * 1e3);
                per[i].2 = per[i].2.max(r.max_holders);
            }
        }
        for (i, (c, p, m)) in per.into_iter().enumerate() {
            println!(
                "| {k} | {:?} | {:.0} | {:.2} ms | {m} |",
                variants[i],
                median(c),
                median(p)
            );
        }
    }
}
