//! The benchmark table: every implementation, every scenario, in rounds with the order of the
//! implementations rotated from round to round, on the same `redis-server` processes.
//!
//! ```text
//! cargo bench --bench bench_table -- [--quick] [--rounds R] [--out FILE] [--label TEXT]
//!     [--only NAME] [--contention-rounds R] [--contention-ms MS] [--contention-k K[,K...]]
//!     [--scale-rounds R] [--scale-ms MS] [--scale-k K[,K...]]
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
//! 4. contention: K callers through one shared handle compete for ONE resource and hold it
//!    200 µs each time (spinning), N = 5 loopback, with this crate's default retry delay and
//!    with 1 ms; K = 2, 8, 32, 128 in one process (this crate: K OS threads, one `Redlock`;
//!    rslock: K tokio tasks on 2 worker threads, one `LockManager`), and 4 child processes × 8
//!    callers started together (the binary runs itself with a hidden `--contend-child` flag;
//!    each child prints its critical sections' intervals, the parent merges them). Sections/s
//!    against the ideal 1 ÷ (uncontended cycle + hold), time to acquire, hand-off gap,
//!    fairness, overlapping sections, give-ups, and the contention goals. Then the same
//!    4 × 8 callers of this crate by kind of lock (`contention::Shape`): all on one set of two
//!    resources, writers and readers of one resource, and a mix of writers, plain locks, sets
//!    and readers on two resources (also with ordered sets) — per role, sections, fairness
//!    among its callers and among
//!    the processes, time to acquire, and conflicting sections that overlapped.
//!    `--only contention` runs only this one;
//! 5. scale: K = 1, 8, 64, 256 concurrent callers, each on a resource of its own, through one
//!    shared handle (this crate: K OS threads, one `Redlock`; rslock: K tokio tasks on 2 worker
//!    threads, one `LockManager`; the floor: one thread pipelining K cycles per batch), N = 5
//!    loopback, healthy and (K = 64) with one server frozen. `--only scale` runs only this one.
//!
//! Scenarios 4 and 5 print their own tables and goals.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use redis_local::{Cluster, Relay};
use support::clients::{self, Cycle, Kind};
use support::contention::{self, Fig, Retry, RoleFig, Shape};
use support::scale;
use support::{median, quantile, us};

struct Opts {
    rounds: usize,
    /// Time spent measuring one implementation in one scenario in one round.
    cap: Duration,
    /// At most this many measured cycles per implementation, scenario and round.
    max_cycles: usize,
    /// At least this many (slow implementations in the fault scenarios).
    min_cycles: usize,
    /// Contention scenario: rounds, time per (configuration, K, implementation, round), the K
    /// values in one process.
    contention_rounds: usize,
    contention_time: Duration,
    contention_ks: Vec<usize>,
    /// Scale scenario: rounds, time per (implementation, K, round), the K values.
    scale_rounds: usize,
    scale_time: Duration,
    scale_ks: Vec<usize>,
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
            contention_time: Duration::from_secs(2),
            contention_ks: vec![2, 8, 32, 128],
            scale_rounds: 3,
            scale_time: Duration::from_secs(2),
            scale_ks: vec![1, 8, 64, 256],
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
                    o.scale_rounds = 1;
                    o.scale_time = Duration::from_millis(500);
                }
                "--rounds" => o.rounds = val().parse().expect("--rounds N"),
                "--cap-ms" => o.cap = Duration::from_millis(val().parse().expect("--cap-ms MS")),
                "--max-cycles" => o.max_cycles = val().parse().expect("--max-cycles N"),
                "--contention-rounds" => {
                    o.contention_rounds = val().parse().expect("--contention-rounds N")
                }
                "--contention-ms" => {
                    o.contention_time =
                        Duration::from_millis(val().parse().expect("--contention-ms MS"))
                }
                "--contention-k" => {
                    o.contention_ks = val()
                        .split(',')
                        .map(|k| k.parse().expect("--contention-k K[,K...]"))
                        .collect()
                }
                "--scale-rounds" => o.scale_rounds = val().parse().expect("--scale-rounds N"),
                "--scale-ms" => {
                    o.scale_time = Duration::from_millis(val().parse().expect("--scale-ms MS"))
                }
                "--scale-k" => {
                    o.scale_ks = val()
                        .split(',')
                        .map(|k| k.parse().expect("--scale-k K[,K...]"))
                        .collect()
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
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 1 {
        // `cargo test --all-targets` runs bench targets without arguments (`cargo bench` passes
        // `--bench`): a whole table is not a test.
        eprintln!(
            "bench_table: no arguments, nothing run (cargo bench --bench bench_table runs it)"
        );
        return;
    }
    if args.get(1).map(String::as_str) == Some(contention::CHILD_FLAG) {
        // A child process of the contention scenario's multi-process case.
        contention::child_main(&args[2..]);
        return;
    }
    let opts = Opts::parse();
    let started = Instant::now();
    eprintln!("bench_table: starting 5 redis-server processes");
    let (mut servers, _pki) = start_servers();
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
    // N = 5 also measures the cost of fencing tokens.
    let fencing_only = opts.only.as_deref() == Some("fencing");
    let with_fenced = |n: usize| {
        let mut kinds = if fencing_only {
            vec![Kind::Mux, Kind::Floor]
        } else {
            healthy.clone()
        };
        if n == 5 {
            kinds.insert(1, Kind::MuxFenced);
        }
        kinds
    };
    let tls_only = opts.only.as_deref() == Some("tls");
    for n in [1, 3, 5] {
        let mut kinds = if tls_only {
            vec![Kind::Mux, Kind::Floor]
        } else {
            with_fenced(n)
        };
        // The same servers' TLS ports: what encryption costs per cycle.
        if clients::TLS.get().is_some() {
            kinds.insert(1, Kind::MuxTls);
        }
        specs.push(Spec {
            name: format!("loopback N={n}"),
            group: Group::Loopback,
            urls: direct[..n].to_vec(),
            freeze: None,
            kinds,
        });
    }
    for n in [1, 3, 5] {
        specs.push(Spec {
            name: format!("relay 250µs N={n}"),
            group: Group::Relay,
            urls: urls_250[..n].to_vec(),
            freeze: None,
            kinds: with_fenced(n),
        });
    }
    specs.push(Spec {
        name: "relay 1ms N=5".into(),
        group: Group::Relay,
        urls: urls_1ms.clone(),
        freeze: None,
        kinds: with_fenced(5),
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
        opts.only.as_ref().is_none_or(|f| match f.as_str() {
            "scale" | "contention" => false,
            "tls" => name.starts_with("loopback"),
            "fencing" => matches!(name, "loopback N=5" | "relay 250µs N=5" | "relay 1ms N=5"),
            f => name.contains(f) || name == "loopback N=5",
        })
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
    let rounds = if scenarios.is_empty() { 0 } else { opts.rounds };
    eprintln!(
        "bench_table: {} scenarios ready after {:.1?}; {rounds} rounds",
        scenarios.len(),
        started.elapsed(),
    );

    // results[scenario][kind] = one Run per round
    let mut results: Vec<BTreeMap<Kind, Vec<Run>>> =
        scenarios.iter().map(|_| BTreeMap::new()).collect();
    for round in 0..rounds {
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
    if !scenarios.is_empty() {
        let _ = writeln!(
            md,
            "#### Latency of one acquire + release cycle ({}; {} rounds, implementation order rotated each round)\n",
            opts.label, opts.rounds
        );
        md.push_str(
            "| scenario | implementation | p50 µs | p99 µs | cycles/s | p50 ÷ redlock-mux p50 (same round, median) | failed |\n\
             |---|---|--:|--:|--:|--:|--:|\n",
        );
    }
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
    // Fencing: what the second round trip costs, against the same round's unfenced cycles.
    let fenced: Vec<usize> = (0..scenarios.len())
        .filter(|&si| results[si].contains_key(&Kind::MuxFenced))
        .collect();
    if !fenced.is_empty() {
        md.push_str(
            "\n#### Fencing tokens: cost per cycle (N = 5; p50, same round, median over rounds)\n\n\
             | scenario | acquire p50 µs, unfenced | acquire p50 µs, fenced | extra round trips per acquisition (goal ≤ 1) | release p50 µs, unfenced | release p50 µs, fenced | cycle p50 fenced ÷ unfenced |\n\
             |---|--:|--:|--:|--:|--:|--:|\n",
        );
        for si in fenced {
            let (am, rm) = split_p50(&results[si][&Kind::Mux]);
            let (af, rf) = split_p50(&results[si][&Kind::MuxFenced]);
            // One unfenced acquisition is one round trip (plus the client's own work): the
            // extra time of a fenced one, in those.
            let extra = (af.as_secs_f64() - am.as_secs_f64()) / am.as_secs_f64().max(1e-9);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {extra:.2} | {} | {} | {} |",
                scenarios[si].name,
                us(am),
                us(af),
                us(rm),
                us(rf),
                ratios(si, Kind::MuxFenced, si, Kind::Mux)
                    .map_or("—".into(), |r| format!("{r:.2}"))
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
                let (acquire, release) = split_p50(runs);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    sc.name,
                    kind.name(),
                    us(p),
                    us(acquire),
                    us(release),
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

    let tls_rows: Vec<String> = (0..scenarios.len())
        .filter(|&si| results[si].contains_key(&Kind::MuxTls))
        .map(|si| {
            let r =
                ratios(si, Kind::MuxTls, si, Kind::Mux).map_or("—".into(), |r| format!("{r:.2}"));
            format!(
                "| {} | {} | {} | {r} |",
                scenarios[si].name,
                us(pooled_p50(&results[si][&Kind::Mux])),
                us(pooled_p50(&results[si][&Kind::MuxTls])),
            )
        })
        .collect();
    if !tls_rows.is_empty() {
        let _ = writeln!(
            md,
            "\n#### TLS: cost per cycle (the same servers' TLS ports; p50, same round, median over rounds)\n\n\
             | scenario | p50 µs, TCP | p50 µs, TLS | TLS ÷ TCP |\n|---|--:|--:|--:|\n{}",
            tls_rows.join("\n")
        );
        md.push_str(&tls_handshakes(&direct[0], &opts));
    }

    let ran_scenarios = !scenarios.is_empty();
    drop(scenarios);
    if opts.contention_rounds > 0 && opts.only.as_ref().is_none_or(|f| f == "contention") {
        md.push_str(&contention(&direct, &opts));
        md.push_str(&contention_kinds(&direct, &opts));
    }

    if !goals.is_empty() {
        let _ = write!(
            md,
            "\n#### Goals decided by this run ({}; same-round ratios, median over rounds)\n\n\
             | goal | limit | redlock-mux | | floor on the same measure |\n|---|--:|--:|---|--:|\n{goals}",
            opts.label
        );
    }
    if opts.scale_rounds > 0 && opts.only.as_ref().is_none_or(|f| f == "scale") {
        md.push_str(&scale(&mut servers, &opts));
    }
    if ran_scenarios {
        let _ = writeln!(
            md,
            "\n_{} rounds × ≤{} ms or ≤{} cycles per implementation and scenario; total {:.0?}._",
            opts.rounds,
            opts.cap.as_millis(),
            opts.max_cycles,
            started.elapsed()
        );
    } else {
        let _ = writeln!(md, "\n_Total {:.0?}._", started.elapsed());
    }
    print!("{md}");
    if let Some(path) = &opts.out {
        std::fs::write(path, &md).unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    drop(servers);
}

/// The 5 servers; with the `tls` feature they also listen for TLS, with certificates made for
/// this run (kept alive by the returned value).
#[cfg(feature = "tls")]
fn start_servers() -> (Cluster, Option<redis_local::Pki>) {
    let pki = redis_local::Pki::generate();
    let builder = redis_local::Server::builder().tls(&pki, redis_local::ClientAuth::No);
    let servers = Cluster::start_with(5, builder);
    let ports = servers.iter().map(|s| (s.port(), s.tls_port())).collect();
    let tls = clients::TlsServers {
        ports,
        ca: pki.ca(),
    };
    assert!(clients::TLS.set(tls).is_ok(), "servers started twice");
    (servers, Some(pki))
}

#[cfg(not(feature = "tls"))]
fn start_servers() -> (Cluster, Option<()>) {
    (Cluster::start(5), None)
}

/// What connecting costs (N = 1): the first cycle of a new client, which connects first — plain
/// TCP, TLS with a full handshake, TLS resuming a session an earlier client got (one rustls
/// configuration, so one session cache, shared by the clients) — and the handshakes' round
/// trips as the client counted them. Order rotated each repetition; medians.
#[cfg(feature = "tls")]
fn tls_handshakes(url: &str, opts: &Opts) -> String {
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let tls = clients::TLS.get().expect("TLS servers");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&tls.ca).expect("CA file") {
        roots.add(cert.expect("CA certificate")).expect("CA");
    }
    let config = |roots: rustls::RootCertStore| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    };
    let urls = [url.to_owned()];
    let reps = (opts.rounds * 10).max(10);
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mut stats: [(u64, u64, u64); 3] = Default::default();
    let shared = config(roots.clone());
    // A first client fills the shared cache.
    clients::Mux::with(clients::tls_builder(&urls).tls_config(shared.clone()))
        .cycle("bench:hs")
        .expect("first TLS cycle");
    for rep in 0..reps {
        for j in 0..3 {
            let which = (j + rep) % 3;
            let builder = match which {
                0 => clients::Mux::builder(&urls),
                1 => clients::tls_builder(&urls).tls_config(config(roots.clone())),
                _ => clients::tls_builder(&urls).tls_config(shared.clone()),
            };
            let mut c = clients::Mux::with(builder);
            let t = Instant::now();
            c.cycle("bench:hs").expect("a first cycle");
            times[which].push(t.elapsed());
            let io = c.client.stats().io;
            let s = &mut stats[which];
            (s.0, s.1, s.2) = (
                s.0 + io.tls_handshakes,
                s.1 + io.tls_resumed,
                s.2 + io.tls_round_trips,
            );
        }
    }
    let mut md = String::from(
        "\n#### Connecting: the first cycle of a new client (N = 1, medians; TLS 1.3)\n\n\
         | connection | first cycle p50 µs | ÷ TCP | handshakes | resumed | round trips per handshake |\n\
         |---|--:|--:|--:|--:|--:|\n",
    );
    let tcp = median_duration(&mut times[0]);
    for (which, name) in ["TCP", "TLS, full handshake", "TLS, resumed session"]
        .iter()
        .enumerate()
    {
        let p50 = median_duration(&mut times[which]);
        let (hs, resumed, rtt) = stats[which];
        let per = if hs == 0 {
            "—".to_owned()
        } else {
            format!("{:.2}", rtt as f64 / hs as f64)
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {:.2} | {hs} | {resumed} | {per} |",
            us(p50),
            p50.as_secs_f64() / tcp.as_secs_f64().max(1e-9)
        );
    }
    md
}

#[cfg(not(feature = "tls"))]
fn tls_handshakes(_: &str, _: &Opts) -> String {
    String::new()
}

#[cfg(feature = "tls")]
fn median_duration(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
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

/// The p50 of the acquisition part and of the release part (cycle − acquisition), all rounds
/// pooled.
fn split_p50(runs: &[Run]) -> (Duration, Duration) {
    let acquire: Vec<Duration> = runs.iter().flat_map(|r| r.acquire.clone()).collect();
    let release: Vec<Duration> = runs
        .iter()
        .flat_map(|r| r.samples.iter().zip(&r.acquire).map(|(c, a)| *c - *a))
        .collect();
    (p50(&acquire), p50(&release))
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

// ---------------------------------------------------------------------------------------------
// Scenario 4: contention
// ---------------------------------------------------------------------------------------------

/// Case of one contention run: K in this process, or P child processes × K.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    One(usize),
    Procs(usize, usize),
}

impl Case {
    fn label(self) -> String {
        match self {
            Case::One(k) => k.to_string(),
            Case::Procs(p, k) => format!("{p}×{k}"),
        }
    }

    fn total(self) -> usize {
        match self {
            Case::One(k) => k,
            Case::Procs(p, k) => p * k,
        }
    }
}

/// The multi-process case: processes × callers each.
const PROCS: (usize, usize) = (4, 8);
/// The implementations of the contention scenario.
const CONTENTION_KINDS: [Kind; 2] = [Kind::Mux, Kind::Rslock];

/// Scenario 4, by kind of lock: 4 processes × 8 callers of this crate, every caller holding its
/// lock for `contention::HOLD`, on one resource (plain), on one set of two resources, as writers
/// and readers of one resource, and as a mix of every kind on two resources (`Shape::role`):
/// per role, sections, fewest ÷ most sections among its callers, time to acquire; and conflicting
/// sections that overlapped (must be 0).
fn contention_kinds(urls: &[String], opts: &Opts) -> String {
    let (time, rounds) = (opts.contention_time, opts.contention_rounds);
    let (p, k) = PROCS;
    let started = Instant::now();
    type Run = (Vec<(&'static str, RoleFig)>, usize, u64, bool);
    let mut runs: BTreeMap<(Retry, Shape), Vec<Run>> = BTreeMap::new();
    for round in 0..rounds {
        for retry in Retry::ALL {
            for j in 0..Shape::ALL.len() {
                let shape = Shape::ALL[(j + round) % Shape::ALL.len()];
                let resource = shape.resource(&format!("{}:{round}", retry.arg()));
                let (procs, start) = contention::run_processes(
                    redis_local::die_with_parent,
                    Kind::Mux,
                    retry,
                    urls,
                    &resource,
                    p,
                    k,
                    time,
                );
                let roles: Vec<(&'static str, RoleFig)> = shape
                    .roles()
                    .into_iter()
                    .map(|role| (role, RoleFig::of(&procs, shape, role, k, start, time)))
                    .collect();
                let conflicts = contention::conflicts(&procs, shape);
                let gave_up = procs.iter().map(|c| c.gave_up).sum::<u64>();
                let finished = procs.iter().all(|c| c.finished);
                let line: Vec<String> = roles
                    .iter()
                    .map(|(role, f)| {
                        format!(
                            "{role} {:.0}/s, fairness {:.2} / {:.2}, acquire p99 {} ms",
                            f.rate,
                            f.fairness,
                            f.fairness_procs,
                            ms(f.acquire_p99)
                        )
                    })
                    .collect();
                eprintln!(
                    "bench_table: contention by kind, round {} {} {}: {}; conflicts {conflicts}, gave up {gave_up}{}",
                    round + 1,
                    retry.name(),
                    shape.name(),
                    line.join("; "),
                    if finished { "" } else { ", DID NOT FINISH" }
                );
                runs.entry((retry, shape))
                    .or_default()
                    .push((roles, conflicts, gave_up, finished));
            }
        }
    }
    eprintln!(
        "bench_table: contention by kind done at {:.1?}",
        started.elapsed()
    );
    let mut md = format!(
        "\n#### Contention by kind of lock: {p} processes × {k} callers of redlock-mux, each holding its lock {:?}, N = 5 loopback ({}; {rounds} round{} × {time:?} per configuration and shape, order rotated each round)\n\n\
         Shapes (callers numbered across the processes, every process has every role): *plain* — all lock one resource; \
         *set* — all lock the same set of two resources; *writers + readers* — half lock one resource, half read it (`Shared`); \
         *mixed* — a quarter each: a writer of resource a, a plain lock of b, the set a + b, a reader of a; \
         *mixed, ordered sets* — the same with `Builder::ordered_sets(true)` in every process; \
         *plain, fair* — all lock one resource with `Builder::fair(true)` in every process; \
         *writers + readers, fair* — as *writers + readers*, with `Builder::fair(true)` in every process (writers and readers queue); \
         *mixed, fair* — the mix with `Builder::fair(true)` in every process (every kind queues: writers, plain locks, sets and readers). \
         Each caller loops `lock_until` (30 s) → hold → `unlock`. Fairness: fewest ÷ most sections among the callers of a role (all processes) / among the processes (the sections of its callers in each process together, as in the rows above). \
         Per caller: median sections of a caller of the role in the run. Conflicts: sections that must exclude each other and overlapped (must be 0). \
         Figures are medians over rounds; conflicts and give-ups are totals.\n\n\
         | configuration | shape | role | sections/s | per caller | fairness: callers / processes | acquire p99 ms | max ms | conflicts | gave up |\n\
         |---|---|---|--:|--:|--:|--:|--:|--:|--:|\n",
        contention::HOLD,
        opts.label,
        if rounds == 1 { "" } else { "s" },
    );
    for retry in Retry::ALL {
        for shape in Shape::ALL {
            let Some(rs) = runs.get(&(retry, shape)) else {
                continue;
            };
            let conflicts: usize = rs.iter().map(|r| r.1).sum();
            let gave_up: u64 = rs.iter().map(|r| r.2).sum();
            let unfinished = rs.iter().filter(|r| !r.3).count();
            for (i, role) in shape.roles().into_iter().enumerate() {
                let med = |f: &dyn Fn(&RoleFig) -> f64| -> f64 {
                    let mut v: Vec<f64> = rs.iter().map(|r| f(&r.0[i].1)).collect();
                    median(&mut v)
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {role} | {:.0} | {:.0} | {:.2} / {:.2} | {} | {} | {} | {}{} |",
                    retry.name(),
                    shape.name(),
                    med(&|f| f.rate),
                    med(&|f| f.per_caller),
                    med(&|f| f.fairness),
                    med(&|f| f.fairness_procs),
                    ms(Duration::from_secs_f64(med(&|f| f
                        .acquire_p99
                        .as_secs_f64()))),
                    ms(Duration::from_secs_f64(med(&|f| f
                        .acquire_max
                        .as_secs_f64()))),
                    if i == 0 {
                        conflicts.to_string()
                    } else {
                        String::new()
                    },
                    if i == 0 {
                        gave_up.to_string()
                    } else {
                        String::new()
                    },
                    if i == 0 && unfinished > 0 {
                        format!(" ({unfinished} runs did not finish)")
                    } else {
                        String::new()
                    },
                );
            }
        }
    }
    md
}

/// Scenario 4: K callers through one shared handle compete for ONE resource, each holding it
/// for `contention::HOLD`; in one process (K = `--contention-k`), and in 4 processes × 8.
fn contention(urls: &[String], opts: &Opts) -> String {
    let time = opts.contention_time;
    let rounds = opts.contention_rounds;
    let mut cases: Vec<Case> = opts.contention_ks.iter().map(|&k| Case::One(k)).collect();
    cases.push(Case::Procs(PROCS.0, PROCS.1));
    let started = Instant::now();
    let mut figs: BTreeMap<(Retry, Case, Kind), Vec<Fig>> = BTreeMap::new();
    for round in 0..rounds {
        for retry in Retry::ALL {
            for &case in &cases {
                for j in 0..CONTENTION_KINDS.len() {
                    let kind = CONTENTION_KINDS[(j + round) % CONTENTION_KINDS.len()];
                    // A fresh resource per run: no run inherits another's keys or waiters.
                    let resource = format!(
                        "contention:{}:{}:{}:{round}",
                        retry.arg(),
                        case.label(),
                        kind.name()
                    );
                    let fig = match case {
                        Case::One(k) => {
                            let c = contention::run(&contention::Spec {
                                kind,
                                retry,
                                urls,
                                resource: &resource,
                                k,
                                time,
                                caller_base: 0,
                                start: None,
                                solo_at: None,
                            });
                            Fig::of(std::slice::from_ref(&c), k, c.start, time)
                        }
                        Case::Procs(p, k) => {
                            let (procs, start) = contention::run_processes(
                                redis_local::die_with_parent,
                                kind,
                                retry,
                                urls,
                                &resource,
                                p,
                                k,
                                time,
                            );
                            Fig::of(&procs, k, start, time)
                        }
                    };
                    eprintln!(
                        "bench_table: contention round {} {} K={} {}: {:.0} sections/s (ideal {:.0}), acquire p99 {} ms, max {} ms, hand-off p50 {} µs, fairness {:.2}, overlaps {}, gave up {}{}{}{}",
                        round + 1,
                        retry.name(),
                        case.label(),
                        kind.name(),
                        fig.rate,
                        fig.ideal,
                        ms(fig.acquire_p99),
                        ms(fig.acquire_max),
                        us(fig.gap_p50),
                        fig.fairness,
                        fig.overlaps,
                        fig.gave_up,
                        if fig.cut > 0 {
                            format!(", {} waits cut at the end", fig.cut)
                        } else {
                            String::new()
                        },
                        if fig.finished { "" } else { ", DID NOT FINISH" },
                        if fig.late > Duration::from_millis(1) {
                            format!(", a process was {} ms late for the start", ms(fig.late))
                        } else {
                            String::new()
                        },
                    );
                    figs.entry((retry, case, kind)).or_default().push(fig);
                }
            }
        }
        eprintln!(
            "bench_table: contention round {}/{rounds} done at {:.1?}",
            round + 1,
            started.elapsed()
        );
    }

    let get = |retry: Retry, case: Case, kind: Kind| -> &[Fig] {
        figs.get(&(retry, case, kind)).map_or(&[], |v| v.as_slice())
    };
    // Median over rounds of a figure.
    let med = |retry: Retry, case: Case, kind: Kind, f: &dyn Fn(&Fig) -> f64| -> Option<f64> {
        let mut v: Vec<f64> = get(retry, case, kind).iter().map(f).collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let secs = |d: Duration| d.as_secs_f64();
    let dur = |x: Option<f64>| x.map_or("—".into(), |x| ms(Duration::from_secs_f64(x)));
    let fmt = |x: Option<f64>, digits: usize| x.map_or("—".into(), |x| format!("{x:.digits$}"));

    let mut md = format!(
        "\n#### Contention: K callers, one shared handle, ONE resource, each holding it {:?}, N = 5 loopback ({}; {rounds} round{} × {time:?} per configuration, K and implementation, order rotated each round)\n\n\
         redlock-mux: K OS threads sharing one `Redlock`, each looping `lock_until` (30 s) → hold → `unlock`; \
         rslock: K tokio tasks sharing one `LockManager` on a 2-worker runtime, each looping `lock` (unbounded retries, 30 s timeout) → hold → `unlock`. \
         {}×{}: {} processes of {} callers each (one handle per process), started together. \
         Configurations: *defaults* — ours: 200 ms + up to 200 ms jitter; rslock: its default, a random 0–199 ms; \
         *1 ms* — ours: 1 ms + up to 1 ms; rslock: 0 or 1 ms. \
         Ideal = 1 ÷ (uncontended cycle + hold), the cycle measured in the same run on the same handle (median of {} cycles). \
         Acquire: from calling `lock` to getting it, every call made during the run (a wait still unfinished {:?} after the end counts as what it had waited: ≥). \
         Hand-off gap: from the holder's `unlock` call to the next acquisition. Fairness: fewest ÷ most sections among callers \
         ({}×{}: among processes / within the worst process). Overlaps: sections that overlapped another (must be 0). \
         Figures are medians over rounds; overlaps and give-ups are totals.\n\n\
         | configuration | K | implementation | sections/s | ideal/s | ÷ ideal | acquire p50 ms | p99 ms | max ms | hand-off gap p50 µs | p99 µs | fairness | overlaps | gave up |\n\
         |---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        contention::HOLD,
        opts.label,
        if rounds == 1 { "" } else { "s" },
        PROCS.0,
        PROCS.1,
        PROCS.0,
        PROCS.1,
        contention::SOLO_CYCLES,
        contention::DRAIN,
        PROCS.0,
        PROCS.1,
    );
    for retry in Retry::ALL {
        for &case in &cases {
            for kind in CONTENTION_KINDS {
                let runs = get(retry, case, kind);
                if runs.is_empty() {
                    continue;
                }
                let m = |f: &dyn Fn(&Fig) -> f64| med(retry, case, kind, f);
                let cut: usize = runs.iter().map(|f| f.cut).sum();
                let at_least = if cut > 0 { "≥ " } else { "" };
                let fairness = match case {
                    Case::One(_) => fmt(m(&|f| f.fairness), 2),
                    Case::Procs(..) => format!(
                        "{} / {}",
                        fmt(m(&|f| f.fairness), 2),
                        fmt(m(&|f| f.fairness_within.unwrap_or(f64::NAN)), 2)
                    ),
                };
                let unfinished = runs.iter().filter(|f| !f.finished).count();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {at_least}{} | {} | {} | {fairness} | {} | {}{}{} |",
                    retry.name(),
                    case.label(),
                    kind.name(),
                    fmt(m(&|f| f.rate), 0),
                    fmt(m(&|f| f.ideal), 0),
                    fmt(m(&|f| f.rate / f.ideal), 3),
                    dur(m(&|f| secs(f.acquire_p50))),
                    dur(m(&|f| secs(f.acquire_p99))),
                    dur(m(&|f| secs(f.acquire_max))),
                    fmt(m(&|f| secs(f.gap_p50) * 1e6), 0),
                    fmt(m(&|f| secs(f.gap_p99) * 1e6), 0),
                    runs.iter().map(|f| f.overlaps).sum::<u64>(),
                    runs.iter().map(|f| f.gave_up).sum::<u64>(),
                    if cut > 0 {
                        format!(" ({cut} cut)")
                    } else {
                        String::new()
                    },
                    if unfinished > 0 {
                        format!(" (did not finish: {unfinished} run(s))")
                    } else {
                        String::new()
                    },
                );
            }
        }
    }

    // Goals, decided on redlock-mux; rslock's figure on the same measure beside.
    let mut goals = String::new();
    let mut goal = |what: String,
                    retry: &str,
                    case: Case,
                    limit: String,
                    ok: Option<bool>,
                    got: String,
                    rslock: String| {
        let verdict = match ok {
            None => "not measured",
            Some(true) => "met",
            Some(false) => "**missed**",
        };
        let _ = writeln!(
            goals,
            "| {what} | {retry} | {} | {limit} | {got} | {verdict} | {rslock} |",
            case.label()
        );
    };
    // p99 limit: max(2 × K × (cycle + hold), 5 ms) in one process; 4 × that (K = all callers)
    // across processes. The cycle is the median over rounds of the run's uncontended cycle.
    let p99_limit = |retry: Retry, case: Case, kind: Kind| -> Option<f64> {
        let cycle = med(retry, case, kind, &|f| secs(f.solo))?;
        let one = (2.0 * case.total() as f64 * (cycle + secs(contention::HOLD))).max(0.005);
        Some(match case {
            Case::One(_) => one,
            Case::Procs(..) => 4.0 * one,
        })
    };
    for retry in Retry::ALL {
        for &case in &cases {
            let (min_ideal, procs) = match case {
                Case::One(_) => (0.8, false),
                Case::Procs(..) => (0.5, true),
            };
            let r = |kind: Kind| med(retry, case, kind, &|f| f.rate / f.ideal);
            goal(
                "sections/s ÷ ideal".into(),
                retry.name(),
                case,
                format!("≥ {min_ideal}"),
                r(Kind::Mux).map(|x| x >= min_ideal),
                fmt(r(Kind::Mux), 3),
                fmt(r(Kind::Rslock), 3),
            );
            let p99 = |kind: Kind| med(retry, case, kind, &|f| secs(f.acquire_p99));
            let limit = p99_limit(retry, case, Kind::Mux);
            goal(
                format!(
                    "acquire p99 ≤ {}max(2 × K × (cycle + hold), 5 ms)",
                    if procs { "4 × " } else { "" }
                ),
                retry.name(),
                case,
                format!("≤ {} ms", dur(limit)),
                p99(Kind::Mux).zip(limit).map(|(p, l)| p <= l),
                format!("{} ms", dur(p99(Kind::Mux))),
                format!(
                    "{} ms (limit {} ms)",
                    dur(p99(Kind::Rslock)),
                    dur(p99_limit(retry, case, Kind::Rslock))
                ),
            );
            let fair = |kind: Kind| med(retry, case, kind, &|f| f.fairness);
            goal(
                if procs {
                    "fairness across processes (fewest ÷ most sections per process)".into()
                } else {
                    "fairness (fewest ÷ most sections per caller)".into()
                },
                retry.name(),
                case,
                "≥ 0.5".into(),
                fair(Kind::Mux).map(|x| x >= 0.5),
                fmt(fair(Kind::Mux), 2),
                fmt(fair(Kind::Rslock), 2),
            );
            if procs {
                let within = |kind: Kind| {
                    med(retry, case, kind, &|f| {
                        f.fairness_within.unwrap_or(f64::NAN)
                    })
                };
                goal(
                    "fairness within processes (the worst process's fewest ÷ most per caller)"
                        .into(),
                    retry.name(),
                    case,
                    "≥ 0.5".into(),
                    within(Kind::Mux).map(|x| x >= 0.5),
                    fmt(within(Kind::Mux), 2),
                    fmt(within(Kind::Rslock), 2),
                );
            }
        }
    }
    // No collapse with a 1 ms delay: its sections/s ÷ the defaults' at the same K, same round.
    for &case in &cases {
        let ratio = |kind: Kind| -> Option<f64> {
            let mut v: Vec<f64> = get(Retry::OneMs, case, kind)
                .iter()
                .zip(get(Retry::Defaults, case, kind))
                .filter(|(_, d)| d.rate > 0.0)
                .map(|(a, d)| a.rate / d.rate)
                .collect();
            (!v.is_empty()).then(|| median(&mut v))
        };
        goal(
            "no collapse: 1 ms sections/s ÷ defaults sections/s (same K, same round)".into(),
            "1 ms vs defaults",
            case,
            "≥ 0.5".into(),
            ratio(Kind::Mux).map(|x| x >= 0.5),
            fmt(ratio(Kind::Mux), 2),
            fmt(ratio(Kind::Rslock), 2),
        );
    }
    let overlaps = |kind: Kind| -> u64 {
        figs.iter()
            .filter(|((_, _, k), _)| *k == kind)
            .flat_map(|(_, v)| v)
            .map(|f| f.overlaps)
            .sum()
    };
    let total_overlaps = overlaps(Kind::Mux);
    let _ = writeln!(
        goals,
        "| zero overlaps (every run) | all | all | = 0 | {total_overlaps} | {} | {} |",
        if figs.is_empty() {
            "not measured"
        } else if total_overlaps == 0 {
            "met"
        } else {
            "**missed**"
        },
        overlaps(Kind::Rslock)
    );
    let _ = write!(
        md,
        "\n#### Contention goals ({}; medians over rounds)\n\n\
         | goal | configuration | K | limit | redlock-mux | | rslock on the same measure |\n\
         |---|---|--:|--:|--:|---|--:|\n{goals}",
        opts.label
    );
    let _ = writeln!(
        md,
        "\n_Contention: {rounds} round(s) × {time:?} per configuration, K and implementation; {:.0?} in all._",
        started.elapsed()
    );
    md
}

// ---------------------------------------------------------------------------------------------
// Scenario 5: scale
// ---------------------------------------------------------------------------------------------

/// Summary of one scale run (the latencies themselves are not kept).
struct ScaleFig {
    rate: f64,
    p50: Duration,
    p99: Duration,
    cpu_per_1000: f64,
    /// The servers' CPU (user + sys of the five `redis-server` processes) per 1,000 cycles,
    /// from the start signal to the run's return.
    servers_per_1000: f64,
    failed: u64,
    finished: bool,
    /// Cycles completed by the hard deadline (for runs that did not finish).
    completed: u64,
}

impl ScaleFig {
    fn of(run: &scale::ScaleRun, servers: Duration) -> ScaleFig {
        ScaleFig {
            rate: run.rate(),
            p50: quantile(&run.latencies, 0.5),
            p99: quantile(&run.latencies, 0.99),
            cpu_per_1000: run.cpu_per_1000(),
            servers_per_1000: servers.as_secs_f64() * 1000.0 / (run.cycles.max(1) as f64),
            failed: run.failed,
            finished: run.finished,
            completed: run.completed_by_deadline,
        }
    }
}

/// One round's lateness figure: the ticker's lateness, and the locking tasks' polls.
struct LateFig {
    p50: Duration,
    p99: Duration,
    max: Duration,
    polls: scale::PollTimes,
}

/// Who runs beside the 1 ms ticker in the lateness figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum LateImp {
    Idle,
    MuxAsync,
    Rslock,
}

impl LateImp {
    fn name(self) -> &'static str {
        match self {
            LateImp::Idle => "nothing else (baseline)",
            LateImp::MuxAsync => "redlock-mux async",
            LateImp::Rslock => "rslock",
        }
    }
}

/// Tasks locking beside the ticker.
const LATE_K: usize = 256;

const SCALE_KINDS: [Kind; 6] = [
    Kind::Mux,
    Kind::MuxNowait,
    Kind::MuxAsync,
    Kind::MuxAsyncQuiet,
    Kind::Rslock,
    Kind::Floor,
];
/// The K of the frozen-node run.
const FROZEN_K: usize = 64;
/// The server frozen in the frozen-node run.
const FROZEN: usize = 4;

/// Milliseconds: two decimals under 10 ms, one above.
fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

/// Scenario 5: K callers through one shared handle, each on a resource of its own.
fn scale(servers: &mut Cluster, opts: &Opts) -> String {
    let urls = servers.urls();
    let max_k = opts
        .scale_ks
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(FROZEN_K);
    // This crate today: one client per thread, N connections + one epoll fd each.
    let need = (max_k * (urls.len() + 2) + 1024) as u64;
    let raised = scale::ensure_nofile(need);
    if let Some((old, new)) = raised {
        eprintln!(
            "bench_table: scale: raised the soft RLIMIT_NOFILE of this process {old} → {new}"
        );
    }
    let time = opts.scale_time;
    let stop = scale::Stop::Time(time);
    // Only reached if something hangs (rslock with a frozen node does).
    let hard = |kind: Kind, frozen: bool| -> Duration {
        if kind == Kind::Rslock && frozen {
            time * 2 + Duration::from_secs(2)
        } else {
            time + Duration::from_secs(30)
        }
    };
    let mut figs: BTreeMap<(bool, usize, Kind), Vec<Option<ScaleFig>>> = BTreeMap::new();
    let mut late: BTreeMap<LateImp, Vec<LateFig>> = BTreeMap::new();
    let started = Instant::now();
    for round in 0..opts.scale_rounds {
        let mut runs: Vec<(bool, usize)> = opts.scale_ks.iter().map(|&k| (false, k)).collect();
        runs.push((true, FROZEN_K));
        for (frozen, k) in runs {
            for j in 0..SCALE_KINDS.len() {
                let kind = SCALE_KINDS[(j + round) % SCALE_KINDS.len()];
                let tag = format!(
                    "scale:{}:{k}:{}:{round}",
                    kind.name(),
                    if frozen { "frozen" } else { "healthy" }
                );
                let pids: Vec<u32> = servers.iter().map(|s| s.pid()).collect();
                let mut servers0 = Duration::ZERO;
                let server = &mut servers[FROZEN];
                let mut on_ready = || {
                    if frozen {
                        server.freeze();
                    }
                    servers0 = scale::processes_cpu(&pids);
                };
                let run = match kind {
                    Kind::Mux | Kind::MuxNowait => scale::run_mux(
                        &urls,
                        k,
                        stop,
                        &tag,
                        hard(kind, frozen),
                        kind == Kind::MuxNowait,
                        &mut on_ready,
                    ),
                    Kind::MuxAsync | Kind::MuxAsyncQuiet => scale::run_mux_async(
                        &urls,
                        k,
                        stop,
                        &tag,
                        hard(kind, frozen),
                        kind == Kind::MuxAsync,
                        &mut on_ready,
                    ),
                    Kind::Rslock => {
                        scale::run_rslock(&urls, k, stop, &tag, hard(kind, frozen), &mut on_ready)
                    }
                    Kind::Floor => scale::run_floor(&urls, k, stop, &tag, &mut on_ready),
                    other => unreachable!("{other:?}"),
                };
                let servers_cpu = scale::processes_cpu(&pids).saturating_sub(servers0);
                if frozen {
                    servers[FROZEN].resume();
                    // Let it work off what queued up while it was stopped.
                    servers[FROZEN].cmd(&["PING"]);
                }
                let fig = ScaleFig::of(&run, servers_cpu);
                let per_cycle = run.io.map_or(String::new(), |io| {
                    let c = run.cycles.max(1) as f64;
                    format!(
                        ", per cycle: {:.2} writes, {:.2} reads, {:.2} polls, {:.2} wakes",
                        io.writes as f64 / c,
                        io.reads as f64 / c,
                        io.polls as f64 / c,
                        io.wakes as f64 / c
                    )
                });
                eprintln!(
                    "bench_table: scale round {} K={k}{} {}: {:.0} cycles/s, p99 {} ms{per_cycle}{}",
                    round + 1,
                    if frozen { " (1 frozen)" } else { "" },
                    kind.name(),
                    fig.rate,
                    ms(fig.p99),
                    if fig.finished {
                        String::new()
                    } else {
                        format!(", did not finish ({} cycles completed)", fig.completed)
                    }
                );
                figs.entry((frozen, k, kind)).or_default().push(Some(fig));
            }
        }
        // The executor's lateness while 256 tasks lock with a frozen node: idle baseline (no
        // lockers), this crate's async API, rslock; order rotated.
        let imps = [LateImp::Idle, LateImp::MuxAsync, LateImp::Rslock];
        for j in 0..imps.len() {
            let imp = imps[(j + round) % imps.len()];
            let tag = format!("late:{}:{round}", imp.name());
            let server = &mut servers[FROZEN];
            let mut on_ready = || server.freeze();
            let k = if imp == LateImp::Idle { 0 } else { LATE_K };
            let seen =
                scale::ticker_lateness(&urls, k, time, &tag, imp == LateImp::Rslock, &mut on_ready);
            servers[FROZEN].resume();
            servers[FROZEN].cmd(&["PING"]);
            let ticks = &seen.ticks;
            let fig = LateFig {
                p50: quantile(ticks, 0.5),
                p99: quantile(ticks, 0.99),
                max: ticks.last().copied().unwrap_or_default(),
                polls: seen.polls,
            };
            eprintln!(
                "bench_table: scale round {} lateness {}: p50 {} ms, p99 {} ms, max {} ms; {} polls, p99 {:?}, max {:?}",
                round + 1,
                imp.name(),
                ms(fig.p50),
                ms(fig.p99),
                ms(fig.max),
                fig.polls.count(),
                fig.polls.quantile(0.99),
                fig.polls.max,
            );
            late.entry(imp).or_default().push(fig);
        }
        eprintln!(
            "bench_table: scale round {}/{} done at {:.1?}",
            round + 1,
            opts.scale_rounds,
            started.elapsed()
        );
    }

    let get = |frozen: bool, k: usize, kind: Kind| -> &[Option<ScaleFig>] {
        figs.get(&(frozen, k, kind)).map_or(&[], |v| v.as_slice())
    };
    // Median over rounds of a figure of finished runs.
    let med = |frozen: bool, k: usize, kind: Kind, f: &dyn Fn(&ScaleFig) -> f64| -> Option<f64> {
        let mut v: Vec<f64> = get(frozen, k, kind)
            .iter()
            .flatten()
            .filter(|x| x.finished)
            .map(f)
            .collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    // Median over rounds of same-round ratios f(a) ÷ f(b) (finished runs only).
    let ratio = |a: (bool, usize, Kind),
                 b: (bool, usize, Kind),
                 f: &dyn Fn(&ScaleFig) -> f64|
     -> Option<f64> {
        let mut v: Vec<f64> = get(a.0, a.1, a.2)
            .iter()
            .zip(get(b.0, b.1, b.2))
            .filter_map(|(x, y)| match (x, y) {
                (Some(x), Some(y)) if x.finished && y.finished && f(y) > 0.0 => Some(f(x) / f(y)),
                _ => None,
            })
            .collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let rate = |f: &ScaleFig| f.rate;
    let p50 = |f: &ScaleFig| f.p50.as_secs_f64();
    let p99 = |f: &ScaleFig| f.p99.as_secs_f64();
    let cpu = |f: &ScaleFig| f.cpu_per_1000;
    let srv = |f: &ScaleFig| f.servers_per_1000;
    let fmt = |x: Option<f64>, digits: usize| x.map_or("—".into(), |x| format!("{x:.digits$}"));
    let dur = |x: Option<f64>| x.map_or("—".into(), |x| ms(Duration::from_secs_f64(x)));

    let mut md = format!(
        "\n#### Scale: K callers, a resource of their own each, one shared handle, N = 5 loopback ({}; {} round{} × {:?} per implementation and K, order rotated each round)\n\n\
         redlock-mux: K OS threads sharing one `Redlock` (one engine: one connection per node, one loop; `unlock_nowait` does not wait for the release replies); \
         redlock-mux async (tokio): K tokio tasks sharing one `AsyncRedlock` (the same engine, futures woken through wakers), multi-thread runtime with 2 workers; \
         no release notices: the same with `release_notices(false)`, whose release is the floor's plain check-and-delete (the default also deletes the waiting mark and publishes a notice when a waiter set one); \
         rslock: K tokio tasks sharing one `LockManager`, multi-thread runtime with 2 workers; \
         floor: one thread, K cycles pipelined per batch (a cycle's latency is its batch's). \
         Figures are medians over rounds; ratios are medians of same-round ratios. \
         Servers' CPU: the five `redis-server` processes' user + sys time over the run (the client and the servers share the machine's CPUs).\n\n\
         | K | implementation | cycles/s | p50 ms | p99 ms | client CPU s per 1,000 cycles | servers' CPU s per 1,000 cycles | cycles/s ÷ floor | cycles/s ÷ rslock | p99 ÷ floor's | p99 ÷ rslock's | failed |\n\
         |--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        opts.label,
        opts.scale_rounds,
        if opts.scale_rounds == 1 { "" } else { "s" },
        time
    );
    let failed = |frozen: bool, k: usize, kind: Kind| -> u64 {
        get(frozen, k, kind)
            .iter()
            .flatten()
            .map(|f| f.failed)
            .sum()
    };
    for &k in &opts.scale_ks {
        for kind in SCALE_KINDS {
            let me = (false, k, kind);
            let vs = |other: Kind, f: &dyn Fn(&ScaleFig) -> f64| {
                if other == kind {
                    "1".to_owned()
                } else {
                    fmt(ratio(me, (false, k, other), f), 2)
                }
            };
            let _ = writeln!(
                md,
                "| {k} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                kind.name(),
                fmt(med(false, k, kind, &rate), 0),
                dur(med(false, k, kind, &p50)),
                dur(med(false, k, kind, &p99)),
                fmt(med(false, k, kind, &cpu), 3),
                fmt(med(false, k, kind, &srv), 3),
                vs(Kind::Floor, &rate),
                vs(Kind::Rslock, &rate),
                vs(Kind::Floor, &p99),
                vs(Kind::Rslock, &p99),
                failed(false, k, kind),
            );
        }
    }

    let _ = write!(
        md,
        "\n#### Scale: K = {FROZEN_K} with 1 of the 5 servers frozen (SIGSTOP) for the whole run ({})\n\n\
         | K | implementation | cycles/s | p50 ms | p99 ms | client CPU s per 1,000 cycles | cycles/s ÷ healthy K={FROZEN_K} (same round) | p99 ÷ healthy p99 | failed | note |\n\
         |--:|---|--:|--:|--:|--:|--:|--:|--:|---|\n",
        opts.label
    );
    for kind in SCALE_KINDS {
        let runs = get(true, FROZEN_K, kind);
        let unfinished: Vec<&ScaleFig> = runs.iter().flatten().filter(|f| !f.finished).collect();
        let note = if unfinished.is_empty() {
            String::new()
        } else {
            format!(
                "did not finish in {}/{} round(s): some callers had not returned {:?} after the start (cycles completed by then: {})",
                unfinished.len(),
                runs.len(),
                hard(kind, true),
                unfinished
                    .iter()
                    .map(|f| f.completed.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let healthy = (false, FROZEN_K, kind);
        let _ = writeln!(
            md,
            "| {FROZEN_K} | {} | {} | {} | {} | {} | {} | {} | {} | {note} |",
            kind.name(),
            fmt(med(true, FROZEN_K, kind, &rate), 0),
            dur(med(true, FROZEN_K, kind, &p50)),
            dur(med(true, FROZEN_K, kind, &p99)),
            fmt(med(true, FROZEN_K, kind, &cpu), 3),
            fmt(ratio((true, FROZEN_K, kind), healthy, &rate), 2),
            fmt(ratio((true, FROZEN_K, kind), healthy, &p99), 2),
            failed(true, FROZEN_K, kind),
        );
    }

    let _ = write!(
        md,
        "\n#### Scale: executor lateness — a tokio task ticking every 1 ms on the 2-worker runtime while {LATE_K} tasks lock on it, 1 of the 5 servers frozen ({})\n\n\
         How late each tick runs (tokio's timer has 1 ms granularity: the baseline is the runtime alone), \
         and how long each single poll of a locking task's future held a worker thread (the library's own share: \
         a busy executor makes the ticker late without any long poll). Medians over rounds; polls: all rounds' polls together.\n\n\
         | beside the ticker | p50 ms | p99 ms | max ms | polls of the locking tasks | poll p50 µs | poll p99 µs | poll p99.9 µs | longest poll µs |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        opts.label
    );
    for (imp, figs) in &late {
        let mut p50: Vec<f64> = figs.iter().map(|f| f.p50.as_secs_f64()).collect();
        let mut p99: Vec<f64> = figs.iter().map(|f| f.p99.as_secs_f64()).collect();
        let mut max: Vec<f64> = figs.iter().map(|f| f.max.as_secs_f64()).collect();
        let mut polls = scale::PollTimes::new();
        for f in figs {
            polls.merge(&f.polls);
        }
        let us = |d: Duration| format!("{}", d.as_micros());
        let (count, q50, q99, q999, longest) = if polls.count() == 0 {
            (
                "—".to_owned(),
                "—".to_owned(),
                "—".to_owned(),
                "—".to_owned(),
                "—".to_owned(),
            )
        } else {
            (
                polls.count().to_string(),
                us(polls.quantile(0.5)),
                us(polls.quantile(0.99)),
                us(polls.quantile(0.999)),
                us(polls.max),
            )
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {count} | {q50} | {q99} | {q999} | {longest} |",
            imp.name(),
            dur(Some(median(&mut p50))),
            dur(Some(median(&mut p99))),
            dur(Some(median(&mut max)))
        );
    }

    // Goals (issue "One engine for all callers"): blocking API, K OS threads, same-run ratios.
    let mut goals = String::new();
    let mux = |k: usize| (false, k, Kind::Mux);
    let mut goal = |what: String, min: bool, limit: f64, got: Option<f64>, floor: Option<f64>| {
        let verdict = match got {
            None => "not measured".to_owned(),
            Some(r) if (min && r >= limit) || (!min && r <= limit) => "met".to_owned(),
            Some(_) => "**missed**".to_owned(),
        };
        let _ = writeln!(
            goals,
            "| {what} | {} {limit:.2} | {} | {verdict} | {} |",
            if min { "≥" } else { "≤" },
            fmt(got, 2),
            fmt(floor, 2)
        );
    };
    let targets: [(usize, f64, f64, Kind, f64); 4] = [
        (1, 0.95, 1.3, Kind::Floor, 1.2),
        (8, 0.6, 1.5, Kind::Rslock, 1.0),
        (64, 0.65, 2.5, Kind::Rslock, 0.5),
        (256, 0.5, 2.0, Kind::Rslock, 0.5),
    ];
    for (k, vs_floor, vs_rslock, p99_base, p99_limit) in targets {
        if !opts.scale_ks.contains(&k) {
            continue;
        }
        goal(
            format!("K={k}: cycles/s ÷ floor"),
            true,
            vs_floor,
            ratio(mux(k), (false, k, Kind::Floor), &rate),
            None,
        );
        goal(
            format!("K={k}: cycles/s ÷ rslock"),
            true,
            vs_rslock,
            ratio(mux(k), (false, k, Kind::Rslock), &rate),
            ratio((false, k, Kind::Floor), (false, k, Kind::Rslock), &rate),
        );
        goal(
            format!("K={k}: p99 ÷ {}'s p99", p99_base.name()),
            false,
            p99_limit,
            ratio(mux(k), (false, k, p99_base), &p99),
            (p99_base != Kind::Floor)
                .then(|| ratio((false, k, Kind::Floor), (false, k, p99_base), &p99))
                .flatten(),
        );
    }
    if opts.scale_ks.contains(&256) && opts.scale_ks.contains(&64) {
        goal(
            "K=256 cycles/s ÷ K=64 cycles/s".into(),
            true,
            0.85,
            ratio(mux(256), mux(64), &rate),
            ratio((false, 256, Kind::Floor), (false, 64, Kind::Floor), &rate),
        );
    }
    goal(
        format!("K={FROZEN_K}, 1 frozen: cycles/s ÷ healthy K={FROZEN_K}"),
        true,
        0.8,
        ratio((true, FROZEN_K, Kind::Mux), mux(FROZEN_K), &rate),
        ratio(
            (true, FROZEN_K, Kind::Floor),
            (false, FROZEN_K, Kind::Floor),
            &rate,
        ),
    );
    for k in [64, 256] {
        if opts.scale_ks.contains(&k) {
            goal(
                format!("K={k}: client CPU per 1,000 cycles ÷ rslock's"),
                false,
                0.5,
                ratio(mux(k), (false, k, Kind::Rslock), &cpu),
                ratio((false, k, Kind::Floor), (false, k, Kind::Rslock), &cpu),
            );
        }
    }
    // Goals of the async API (issue "Async API on the engine"): K tokio tasks, 2 workers.
    let aio = |k: usize| (false, k, Kind::MuxAsync);
    if opts.scale_ks.contains(&1) {
        goal(
            "async K=1: cycles/s ÷ blocking API's".into(),
            true,
            0.85,
            ratio(aio(1), mux(1), &rate),
            None,
        );
    }
    for k in [64, 256] {
        if !opts.scale_ks.contains(&k) {
            continue;
        }
        goal(
            format!("async K={k}: cycles/s ÷ floor"),
            true,
            0.8,
            ratio(aio(k), (false, k, Kind::Floor), &rate),
            None,
        );
        // Not the goal's measure (that is the default, notices on): the same work as the floor.
        goal(
            format!("async K={k}, no release notices (the floor's release): cycles/s ÷ floor"),
            true,
            0.8,
            ratio(
                (false, k, Kind::MuxAsyncQuiet),
                (false, k, Kind::Floor),
                &rate,
            ),
            None,
        );
        goal(
            format!("async K={k}: cycles/s ÷ rslock"),
            true,
            3.0,
            ratio(aio(k), (false, k, Kind::Rslock), &rate),
            ratio((false, k, Kind::Floor), (false, k, Kind::Rslock), &rate),
        );
        goal(
            format!("async K={k}: p99 ÷ rslock's p99"),
            false,
            0.5,
            ratio(aio(k), (false, k, Kind::Rslock), &p99),
            ratio((false, k, Kind::Floor), (false, k, Kind::Rslock), &p99),
        );
    }
    let _ = write!(
        md,
        "\n#### Scale goals ({}; same-round ratios, median over rounds)\n\n\
         | goal | limit | redlock-mux | | floor on the same measure |\n|---|--:|--:|---|--:|\n{goals}",
        opts.label
    );
    // Where a cycle's CPU goes, the whole machine's: the client's and the servers' share, and
    // how many of the CPUs a run kept busy. The servers' part is work the client only changes
    // by what it sends (the notice's `PUBLISH`, the number of reads and writes); the rest of
    // 0.8 × the floor's rate is what the client may spend.
    let mut budget = String::new();
    let per_cycle = |f: &ScaleFig| f.cpu_per_1000 + f.servers_per_1000;
    let busy = |f: &ScaleFig| f.rate * per_cycle(f) / 1000.0;
    let us = |x: Option<f64>| x.map_or("—".into(), |x| format!("{:.1}", x * 1000.0));
    for k in [64, 256] {
        if !opts.scale_ks.contains(&k) {
            continue;
        }
        for kind in [Kind::Floor, Kind::MuxAsync, Kind::MuxAsyncQuiet] {
            // Same round: the floor's CPU per cycle ÷ 0.8, less this run's servers' share.
            let left = if kind == Kind::Floor {
                None
            } else {
                let mut v: Vec<f64> = get(false, k, kind)
                    .iter()
                    .zip(get(false, k, Kind::Floor))
                    .filter_map(|(x, y)| match (x, y) {
                        (Some(x), Some(y)) if x.finished && y.finished => {
                            Some(per_cycle(y) / 0.8 - x.servers_per_1000)
                        }
                        _ => None,
                    })
                    .collect();
                (!v.is_empty()).then(|| median(&mut v))
            };
            let _ = writeln!(
                budget,
                "| {k} | {} | {} | {} | {} | {} | {} |",
                kind.name(),
                us(med(false, k, kind, &cpu)),
                us(med(false, k, kind, &srv)),
                us(med(false, k, kind, &per_cycle)),
                fmt(med(false, k, kind, &busy), 2),
                us(left),
            );
        }
    }
    if !budget.is_empty() {
        let _ = write!(
            md,
            "\n#### Scale: the machine's CPU per cycle ({}; medians over rounds)\n\n\
             Client: this process; servers: the five `redis-server` processes. Last column: the client CPU per cycle \
             at which the run would reach 0.8 × the floor's cycles/s if it kept as many CPUs busy as the floor does \
             (same round: the floor's CPU per cycle ÷ 0.8, less this run's servers' CPU per cycle).\n\n\
             | K | implementation | client µs per cycle | servers' µs per cycle | together | CPUs busy | client µs per cycle that 0.8 × the floor leaves |\n\
             |--:|---|--:|--:|--:|--:|--:|\n{budget}",
            opts.label
        );
    }
    let _ = writeln!(
        md,
        "\n_Scale: {} round(s) × {:?} per implementation and K; {:.0?} in all{}._",
        opts.scale_rounds,
        time,
        started.elapsed(),
        raised.map_or(String::new(), |(old, new)| format!(
            "; soft RLIMIT_NOFILE raised {old} → {new} in the bench process"
        ))
    );
    md
}
