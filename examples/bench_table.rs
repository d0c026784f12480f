//! The benchmark table: every implementation, every scenario, in rounds with the order of the
//! implementations rotated from round to round, on the same `redis-server` processes.
//!
//! ```text
//! cargo run --release --example bench_table -- [--quick] [--rounds R] [--out FILE] [--label TEXT]
//! ```
//!
//! Usually run through `scripts/bench`, which also runs it pinned to one CPU. Prints markdown:
//! per scenario and implementation p50, p99 and cycles/s over all rounds, and the median over
//! rounds of each opponent's p50 divided by this crate's p50 *in the same round* (the machine's
//! loopback latency drifts between regimes; a ratio taken within one round cancels that out).
//!
//! Scenarios (N Redis masters; a cycle is one acquisition plus its release):
//! 1. loopback, N = 1, 3, 5;
//! 2. a relay that delays every byte by a fixed one-way delay (250 µs; 1 ms) in front of each
//!    server, N = 1, 3, 5 and N = 5;
//! 3. N = 5 with one server frozen (SIGSTOP), one slowed (a relay adding 10 ms each way, 20 ms
//!    per round trip), and both at once; plus that node behind a relay without delay, the
//!    baseline that separates the relay's own CPU cost from the effect of the slow node;
//! 4. contention: K threads, each with its own client, competing for one resource.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../benches/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::Servers;
use support::clients::{self, Cycle, Kind};
use support::relay::Relay;
use support::{median, quantile, us};

struct Opts {
    rounds: usize,
    /// Time spent measuring one implementation in one scenario in one round.
    cap: Duration,
    /// At most this many measured cycles per implementation, scenario and round.
    max_cycles: usize,
    /// At least this many (slow implementations in the fault scenarios).
    min_cycles: usize,
    contention_rounds: usize,
    contention_time: Duration,
    out: Option<String>,
    label: String,
    only: Option<String>,
}

impl Opts {
    fn parse() -> Opts {
        let mut o = Opts {
            rounds: 7,
            cap: Duration::from_millis(600),
            max_cycles: 5000,
            min_cycles: 3,
            contention_rounds: 3,
            contention_time: Duration::from_secs(1),
            out: None,
            label: "unpinned".into(),
            only: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
            match a.as_str() {
                "--quick" => {
                    o.rounds = 3;
                    o.cap = Duration::from_millis(150);
                    o.max_cycles = 1500;
                    o.contention_rounds = 1;
                    o.contention_time = Duration::from_millis(500);
                }
                "--rounds" => o.rounds = val().parse().expect("--rounds N"),
                "--cap-ms" => o.cap = Duration::from_millis(val().parse().expect("--cap-ms MS")),
                "--max-cycles" => o.max_cycles = val().parse().expect("--max-cycles N"),
                "--contention-rounds" => {
                    o.contention_rounds = val().parse().expect("--contention-rounds N")
                }
                "--out" => o.out = Some(val()),
                "--label" => o.label = val(),
                "--only" => o.only = Some(val()),
                // `cargo bench` passes this to every bench target.
                "--bench" => {}
                other => panic!("unknown argument {other}"),
            }
        }
        o
    }
}

/// Scenario groups, for the goals.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Group {
    Loopback,
    Relay,
    Fault,
}

struct Scenario {
    name: String,
    group: Group,
    /// Index of the server frozen during the scenario.
    freeze: Option<usize>,
    clients: Vec<(Kind, Box<dyn Cycle>)>,
}

struct Spec {
    name: String,
    group: Group,
    urls: Vec<String>,
    freeze: Option<usize>,
    kinds: Vec<Kind>,
}

/// Samples of one implementation in one scenario in one round.
#[derive(Default)]
struct Run {
    /// Whole cycles.
    samples: Vec<Duration>,
    /// The acquisition part of each cycle (same order).
    acquire: Vec<Duration>,
    errors: usize,
}

fn main() {
    let opts = Opts::parse();
    let started = Instant::now();
    eprintln!("bench_table: starting 5 redis-server processes");
    let mut servers = Servers::start(5);
    let direct = servers.urls();
    let addrs: Vec<_> = servers.iter().map(|s| s.socket_addr()).collect();
    let relays_250: Vec<Relay> = addrs
        .iter()
        .map(|a| Relay::start(*a, Duration::from_micros(250)))
        .collect();
    let relays_1ms: Vec<Relay> = addrs
        .iter()
        .map(|a| Relay::start(*a, Duration::from_millis(1)))
        .collect();
    let slow = Relay::start(addrs[4], Duration::from_millis(10));
    // The same hop without delay: what the relay itself costs (threads, copies, wake-ups).
    let hop = Relay::start(addrs[4], Duration::ZERO);
    let urls_250: Vec<String> = relays_250.iter().map(Relay::url).collect();
    let urls_1ms: Vec<String> = relays_1ms.iter().map(Relay::url).collect();
    let mut slowed = direct[..4].to_vec();
    slowed.push(slow.url());
    let mut relayed = direct[..4].to_vec();
    relayed.push(hop.url());

    let healthy = Kind::ALL.to_vec();
    let with_timeouts = vec![Kind::Mux, Kind::Seq, Kind::Rslock];
    let mut specs: Vec<Spec> = Vec::new();
    for n in [1, 3, 5] {
        specs.push(Spec {
            name: format!("loopback N={n}"),
            group: Group::Loopback,
            urls: direct[..n].to_vec(),
            freeze: None,
            kinds: healthy.clone(),
        });
    }
    for n in [1, 3, 5] {
        specs.push(Spec {
            name: format!("relay 250µs N={n}"),
            group: Group::Relay,
            urls: urls_250[..n].to_vec(),
            freeze: None,
            kinds: healthy.clone(),
        });
    }
    specs.push(Spec {
        name: "relay 1ms N=5".into(),
        group: Group::Relay,
        urls: urls_1ms.clone(),
        freeze: None,
        kinds: healthy.clone(),
    });
    specs.push(Spec {
        name: "N=5, 1 frozen".into(),
        group: Group::Fault,
        urls: direct.clone(),
        freeze: Some(4),
        kinds: with_timeouts.clone(),
    });
    specs.push(Spec {
        name: "N=5, 1 relayed, no delay".into(),
        group: Group::Fault,
        urls: relayed.clone(),
        freeze: None,
        kinds: vec![Kind::Mux, Kind::Seq, Kind::Rslock, Kind::Redlock],
    });
    specs.push(Spec {
        name: "N=5, 1 slowed".into(),
        group: Group::Fault,
        urls: slowed.clone(),
        freeze: None,
        kinds: vec![Kind::Mux, Kind::Seq, Kind::Rslock, Kind::Redlock],
    });
    specs.push(Spec {
        name: "N=5, 1 frozen + 1 slowed".into(),
        group: Group::Fault,
        urls: slowed.clone(),
        freeze: Some(3),
        kinds: with_timeouts.clone(),
    });
    let keep = |name: &str| {
        opts.only
            .as_ref()
            .is_none_or(|f| name.contains(f.as_str()) || name == "loopback N=5")
    };

    let mut scenarios: Vec<Scenario> = Vec::new();
    for Spec {
        name,
        group,
        urls,
        freeze,
        kinds,
    } in specs
    {
        if !keep(&name) {
            continue;
        }
        let mut cs = Vec::new();
        for kind in kinds {
            let mut c = clients::make(kind, &urls);
            // Connect and load scripts while every server is healthy.
            c.cycle("warmup")
                .unwrap_or_else(|e| panic!("{name} {}: warm-up failed: {e}", kind.name()));
            cs.push((kind, c));
        }
        scenarios.push(Scenario {
            name,
            group,

            freeze,
            clients: cs,
        });
    }
    eprintln!(
        "bench_table: {} scenarios ready after {:.1?}; {} rounds",
        scenarios.len(),
        started.elapsed(),
        opts.rounds
    );

    // results[scenario][kind] = one Run per round
    let mut results: Vec<BTreeMap<Kind, Vec<Run>>> =
        scenarios.iter().map(|_| BTreeMap::new()).collect();
    for round in 0..opts.rounds {
        for (si, sc) in scenarios.iter_mut().enumerate() {
            if let Some(i) = sc.freeze {
                servers[i].freeze();
            }
            let k = sc.clients.len();
            for j in 0..k {
                let (kind, client) = &mut sc.clients[(j + round) % k];
                let resource = format!("bench:{si}:{}:{round}", kind.name());
                let run = measure(client.as_mut(), &resource, &opts);
                results[si].entry(*kind).or_default().push(run);
            }
            if let Some(i) = sc.freeze {
                servers[i].resume();
            }
        }
        eprintln!(
            "bench_table: round {}/{} done at {:.1?}",
            round + 1,
            opts.rounds,
            started.elapsed()
        );
    }

    let mut md = String::new();
    let _ = writeln!(
        md,
        "#### Latency of one acquire + release cycle ({}; {} rounds, implementation order rotated each round)\n",
        opts.label, opts.rounds
    );
    md.push_str(
        "| scenario | implementation | p50 µs | p99 µs | cycles/s | p50 ÷ redlock-mux p50 (same round, median) | failed |\n\
         |---|---|--:|--:|--:|--:|--:|\n",
    );
    let ratios = |si: usize, kind: Kind, base_si: usize, base_kind: Kind| -> Option<f64> {
        let a = results[si].get(&kind)?;
        let b = results[base_si].get(&base_kind)?;
        let mut r: Vec<f64> = a
            .iter()
            .zip(b)
            .filter(|(x, y)| !x.samples.is_empty() && !y.samples.is_empty())
            .map(|(x, y)| p50(&x.samples).as_secs_f64() / p50(&y.samples).as_secs_f64())
            .collect();
        (!r.is_empty()).then(|| median(&mut r))
    };
    for (si, sc) in scenarios.iter().enumerate() {
        for (kind, _) in sorted_kinds(&sc.clients) {
            let runs = &results[si][&kind];
            let mut all: Vec<Duration> = runs.iter().flat_map(|r| r.samples.clone()).collect();
            all.sort();
            let total: Duration = all.iter().sum();
            let errors: usize = runs.iter().map(|r| r.errors).sum();
            let rate = all.len() as f64 / total.as_secs_f64().max(1e-9);
            let ratio = if kind == Kind::Mux {
                "1".to_owned()
            } else {
                ratios(si, kind, si, Kind::Mux).map_or("—".into(), |r| format!("{r:.2}"))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.0} | {} | {} |",
                sc.name,
                kind.name(),
                us(quantile(&all, 0.5)),
                us(quantile(&all, 0.99)),
                rate,
                ratio,
                errors
            );
        }
    }
    let healthy_si = scenarios.iter().position(|s| s.name == "loopback N=5");
    if let Some(h) = healthy_si
        && scenarios.iter().any(|s| s.group == Group::Fault)
    {
        md.push_str(
            "\n#### Faults: p50 against the same implementation's healthy loopback N=5 p50 (same round, median)\n\n\
             | scenario | implementation | p50 µs | acquire p50 µs | release p50 µs | healthy p50 µs | ratio |\n\
             |---|---|--:|--:|--:|--:|--:|\n",
        );
        for (si, sc) in scenarios.iter().enumerate() {
            if sc.group != Group::Fault {
                continue;
            }
            for (kind, _) in sorted_kinds(&sc.clients) {
                let runs = &results[si][&kind];
                let p = pooled_p50(runs);
                let hp = results[h].get(&kind).map(|r| pooled_p50(r));
                let acquire: Vec<Duration> = runs.iter().flat_map(|r| r.acquire.clone()).collect();
                let release: Vec<Duration> = runs
                    .iter()
                    .flat_map(|r| r.samples.iter().zip(&r.acquire).map(|(c, a)| *c - *a))
                    .collect();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    sc.name,
                    kind.name(),
                    us(p),
                    us(p50(&acquire)),
                    us(p50(&release)),
                    hp.map_or("—".into(), us),
                    ratios(si, kind, h, kind).map_or("—".into(), |r| format!("{r:.2}"))
                );
            }
        }
    }

    // Goals that this table decides.
    let mut goals = String::new();
    let find = |name: &str| scenarios.iter().position(|s| s.name == name);
    let mut goal =
        |what: &str, si: Option<usize>, kind: Kind, base: Option<(usize, Kind)>, limit: f64| {
            let Some(si) = si else { return };
            let (bsi, bkind) = base.unwrap_or((si, kind));
            // ours ÷ opponent = 1 / (opponent ÷ ours)
            let r = if base.is_some() {
                ratios(si, kind, bsi, bkind)
            } else {
                ratios(si, kind, si, Kind::Mux).map(|r| 1.0 / r)
            };
            let Some(r) = r else { return };
            // What the hand-rolled floor scores on the same goal: the physical reference.
            let reference = if base.is_none() {
                ratios(si, Kind::Floor, si, kind).map_or("—".into(), |f| format!("{f:.2}"))
            } else {
                "—".into()
            };
            let _ = writeln!(
                goals,
                "| {what} | ≤ {limit:.2} | {r:.2} | {} | {reference} |",
                if r <= limit { "met" } else { "**missed**" }
            );
        };
    let l5 = find("loopback N=5");
    goal("loopback N=5: p50 ÷ seq", l5, Kind::Seq, None, 0.40);
    goal("loopback N=5: p50 ÷ rslock", l5, Kind::Rslock, None, 0.80);
    goal("loopback N=5: p50 ÷ floor", l5, Kind::Floor, None, 1.00);
    let r5 = find("relay 250µs N=5");
    goal("relay 250µs N=5: p50 ÷ seq", r5, Kind::Seq, None, 0.25);
    goal("relay 250µs N=5: p50 ÷ floor", r5, Kind::Floor, None, 1.05);
    let r1 = find("relay 1ms N=5");
    goal("relay 1ms N=5: p50 ÷ seq", r1, Kind::Seq, None, 0.25);
    goal("relay 1ms N=5: p50 ÷ floor", r1, Kind::Floor, None, 1.05);
    for name in ["N=5, 1 frozen", "N=5, 1 slowed", "N=5, 1 frozen + 1 slowed"] {
        if let (Some(si), Some(h)) = (find(name), l5) {
            goal(
                &format!("{name}: p50 ÷ healthy p50"),
                Some(si),
                Kind::Mux,
                Some((h, Kind::Mux)),
                1.2,
            );
        }
    }
    // The slowed node sits behind a relay, whose threads cost CPU on a small machine: the same
    // comparison against the node relayed without delay isolates the effect of the slowness.
    let hop_si = find("N=5, 1 relayed, no delay");
    for name in ["N=5, 1 slowed", "N=5, 1 frozen + 1 slowed"] {
        if let (Some(si), Some(h)) = (find(name), hop_si) {
            goal(
                &format!("{name}: p50 ÷ p50 with that node relayed without delay"),
                Some(si),
                Kind::Mux,
                Some((h, Kind::Mux)),
                1.2,
            );
        }
    }

    if opts.contention_rounds > 0 && opts.only.as_ref().is_none_or(|f| f == "contention") {
        drop(scenarios);
        md.push_str(&contention(&direct, &opts));
    }

    if !goals.is_empty() {
        let _ = write!(
            md,
            "\n#### Goals decided by this run ({}; same-round ratios, median over rounds)\n\n\
             | goal | limit | redlock-mux | | floor on the same measure |\n|---|--:|--:|---|--:|\n{goals}",
            opts.label
        );
    }
    let _ = writeln!(
        md,
        "\n_{} rounds × ≤{} ms or ≤{} cycles per implementation and scenario; total {:.0?}._",
        opts.rounds,
        opts.cap.as_millis(),
        opts.max_cycles,
        started.elapsed()
    );
    print!("{md}");
    if let Some(path) = &opts.out {
        std::fs::write(path, &md).unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    drop(servers);
}

fn sorted_kinds(clients: &[(Kind, Box<dyn Cycle>)]) -> Vec<(Kind, ())> {
    let mut k: Vec<(Kind, ())> = clients.iter().map(|(k, _)| (*k, ())).collect();
    k.sort();
    k
}

fn p50(samples: &[Duration]) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    quantile(&s, 0.5)
}

fn pooled_p50(runs: &[Run]) -> Duration {
    let v: Vec<Duration> = runs.iter().flat_map(|r| r.samples.clone()).collect();
    p50(&v)
}

/// Warms up (5 % of the time cap, at least one cycle), then records cycles until the cap (or
/// the cycle limit), with at least `min_cycles`.
fn measure(client: &mut dyn Cycle, resource: &str, opts: &Opts) -> Run {
    let mut run = Run::default();
    let warm_until = Instant::now() + opts.cap / 20;
    loop {
        let _ = client.cycle(resource);
        if Instant::now() >= warm_until {
            break;
        }
    }
    run.samples.reserve(opts.max_cycles);
    run.acquire.reserve(opts.max_cycles);
    let start = Instant::now();
    while run.samples.len() + run.errors < opts.max_cycles
        && (start.elapsed() < opts.cap || run.samples.len() + run.errors < opts.min_cycles)
    {
        let t = Instant::now();
        let ok = client.cycle_timed(resource);
        let d = t.elapsed();
        match ok {
            Ok(a) => {
                run.samples.push(d);
                run.acquire.push(a);
            }
            Err(_) => run.errors += 1,
        }
    }
    run
}

/// Scenario 4: K threads, each with its own client, compete for one resource on N = 5.
fn contention(urls: &[String], opts: &Opts) -> String {
    let kinds = [Kind::Mux, Kind::Rslock];
    let ks = [2usize, 4, 8];
    let mut acc: BTreeMap<(usize, Kind), Tally> = BTreeMap::new();
    for round in 0..opts.contention_rounds {
        for &k in &ks {
            for j in 0..kinds.len() {
                let kind = kinds[(j + round) % kinds.len()];
                let resource = format!("contended:{k}:{}:{round}", kind.name());
                let t = contend(kind, urls, k, &resource, opts.contention_time);
                let e = acc.entry((k, kind)).or_default();
                e.sections += t.sections;
                e.elapsed += t.elapsed;
                e.acquire.extend(t.acquire);
                e.violations += t.violations;
                e.gave_up += t.gave_up;
            }
        }
        eprintln!(
            "bench_table: contention round {}/{} done",
            round + 1,
            opts.contention_rounds
        );
    }
    let mut md = format!(
        "\n#### Contention: K threads, own client each, one resource, N = 5 loopback ({}; {} × {:?} per K and implementation)\n\n\
         | K | implementation | critical sections/s | p50 acquire µs | p99 acquire µs | exclusion violations | gave up |\n\
         |--:|---|--:|--:|--:|--:|--:|\n",
        opts.label, opts.contention_rounds, opts.contention_time
    );
    for ((k, kind), mut t) in acc {
        t.acquire.sort();
        let _ = writeln!(
            md,
            "| {k} | {} | {:.0} | {} | {} | {} | {} |",
            kind.name(),
            t.sections as f64 / t.elapsed.as_secs_f64(),
            us(quantile(&t.acquire, 0.5)),
            us(quantile(&t.acquire, 0.99)),
            t.violations,
            t.gave_up,
        );
    }
    md
}

fn contend(kind: Kind, urls: &[String], k: usize, resource: &str, time: Duration) -> Tally {
    let inside = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(k + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..k {
        let mut c = clients::contender(kind, urls);
        // Connect first, on a resource of its own.
        c.acquire(&format!("{resource}:warm:{t}")).expect("warm-up");
        c.release().expect("warm-up release");
        let (inside, violations, barrier, stop) = (
            inside.clone(),
            violations.clone(),
            barrier.clone(),
            stop.clone(),
        );
        let resource = resource.to_owned();
        handles.push(std::thread::spawn(move || {
            let mut lat = Vec::with_capacity(1 << 14);
            let mut errors = 0u64;
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                if c.acquire(&resource).is_err() {
                    errors += 1;
                    continue;
                }
                lat.push(t0.elapsed());
                if inside.swap(true, Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                inside.store(false, Ordering::SeqCst);
                let _ = c.release();
            }
            (lat, errors)
        }));
    }
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.join().expect("contender thread");
        lat.extend(l);
        errors += e;
    }
    Tally {
        sections: lat.len() as u64,
        elapsed: start.elapsed(),
        acquire: lat,
        violations: violations.load(Ordering::SeqCst),
        gave_up: errors,
    }
}

/// Contention results of one implementation at one K.
#[derive(Default)]
struct Tally {
    /// Critical sections entered.
    sections: u64,
    elapsed: Duration,
    /// Time from the start of `lock` to success, per critical section.
    acquire: Vec<Duration>,
    /// Times a thread entered while another was inside (must be 0).
    violations: u64,
    /// `lock` calls that gave up.
    gave_up: u64,
}
