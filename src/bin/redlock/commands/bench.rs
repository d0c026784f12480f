//! `redlock bench`: latency percentiles of lock cycles (acquire + release), on given servers or
//! on local ones it starts.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mux::{Error, Redlock};

use super::demo::{Tally, interrupt_flag, latency_table, local_servers, progress, version};
use crate::fail::{Fail, code_of, exit};
use crate::options::LockOptions;
use crate::parse::count;
use crate::text::fmt_duration;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// How many lock cycles (acquire + release) in all, at least 1
    #[arg(long, default_value_t = 10_000, value_parser = parse_cycles)]
    cycles: u64,
    /// Start this many local redis-servers (1 to 15) instead of using --server; they are fresh,
    /// so the restart quarantine is off (--quarantine is ignored)
    #[arg(long, value_parser = |s: &str| count(s, 1, 15), conflicts_with = "servers")]
    nodes: Option<u16>,
    /// Concurrent clients (1 to 64), each locking its own resource
    #[arg(long, default_value_t = 1, value_parser = |s: &str| count(s, 1, 64))]
    clients: u16,
    // (each cycle is one attempt: the waiting options are ignored)
    #[command(flatten)]
    pub opts: LockOptions,
}

/// bench's TTL when --ttl is not given.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// `--cycles`: a whole number, at least 1.
fn parse_cycles(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// A bench client: `cycles` times try_lock + unlock of its own resource. If its first attempt
/// fails, it stops every client and leaves the error in `aborted`.
fn bench_client(
    r: &Redlock,
    resource: &str,
    cycles: u64,
    done: &AtomicU64,
    stop: &AtomicBool,
    aborted: &OnceLock<Error>,
) -> Tally {
    let mut t = Tally::new();
    for _ in 0..cycles {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t0 = Instant::now();
        let lock = match r.try_lock(resource) {
            Ok(lock) => lock,
            Err(e) => {
                t.failed += 1;
                if t.cycles == 0 && t.failed == 1 {
                    // Misconfigured (quarantine, credentials, no quorum): no point going on, and
                    // the bench fails with it.
                    let _ = aborted.set(e.clone());
                    t.last_error = Some(e);
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
                t.last_error = Some(e);
                done.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let t1 = Instant::now();
        let released = r.unlock(lock);
        let t2 = Instant::now();
        t.cycle(t1 - t0, t2 - t1, t2 - t0, released);
        done.fetch_add(1, Ordering::Relaxed);
    }
    t
}

/// The handles, one per client; local servers are fresh, so their quarantine is off.
fn bench_clients(a: &BenchArgs, urls: &[String], local: bool) -> Result<Vec<Redlock>, Fail> {
    (0..a.clients)
        .map(|_| {
            let b = a
                .opts
                .tuning
                .builder(a.opts.servers.builder(urls), a.opts.ttl_or(DEFAULT_TTL))
                .fencing(a.opts.fence);
            if local {
                b.quarantine(None).build()
            } else {
                b.build()
            }
        })
        .collect::<Result<Vec<Redlock>, Error>>()
        .map_err(|e| Fail::new(code_of(&e), e.to_string()))
}

/// Runs the clients, `a.cycles` in all, with a progress bar; their tallies merged, and the error
/// that stopped them all if a client's first attempt failed.
fn run_clients(
    a: &BenchArgs,
    handles: &[Redlock],
    interrupted: &AtomicBool,
) -> Result<(Tally, Option<Error>), Fail> {
    let clients = handles.len() as u64;
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let aborted = OnceLock::new();
    let pid = std::process::id();
    std::thread::scope(|s| {
        let workers: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let share = a.cycles / clients + u64::from((i as u64) < a.cycles % clients);
                let resource = format!("redlock-bench:{pid}:{i}");
                let (done, stop, aborted) = (&done, &stop, &aborted);
                s.spawn(move || bench_client(r, &resource, share, done, stop, aborted))
            })
            .collect();
        let bar = progress(a.cycles);
        while !workers.iter().all(|w| w.is_finished()) {
            if interrupted.load(Ordering::Relaxed) {
                stop.store(true, Ordering::Relaxed);
            }
            let n = done.load(Ordering::Relaxed);
            bar.set_position(n);
            bar.set_message(format!("{n} / {} cycles", a.cycles));
            // Screen refresh, not synchronisation: joining below waits for the clients.
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
        Tally::join(workers, "a bench client panicked")
    })
    .map(|t| (t, aborted.into_inner()))
}

/// The throughput line and the latency table.
fn report(t: &Tally, elapsed: Duration) {
    out!(
        "  {} cycles in {:.2} s: {:.0} cycles/s, {} failed{}",
        t.cycles,
        elapsed.as_secs_f64(),
        t.cycles as f64 / elapsed.as_secs_f64().max(1e-9),
        t.failed,
        t.last_error
            .as_ref()
            .map(|e| format!(" (last: {e})"))
            .unwrap_or_default()
    );
    out_part!(
        "{}",
        latency_table(&[
            ("acquire", &t.acquire),
            ("release", &t.release),
            ("cycle", &t.cycle)
        ])
    );
}

pub fn bench(a: &BenchArgs) -> Result<u8, Fail> {
    let interrupted = interrupt_flag()?;
    let local = match a.nodes {
        Some(n) => Some(local_servers(usize::from(n))?),
        None => None,
    };
    let urls = match &local {
        Some(l) => l.urls(),
        None => a.opts.servers.list()?,
    };
    let handles = bench_clients(a, &urls, local.is_some())?;
    let where_ = match &local {
        Some(l) => format!("{} local {} (quarantine off)", urls.len(), version(l)),
        None => format!("{} servers", urls.len()),
    };
    let clients = handles.len();
    out!(
        "redlock bench: {} lock cycles (acquire + release), {clients} client{}, {where_}, ttl {}",
        a.cycles,
        if clients == 1 { "" } else { "s" },
        fmt_duration(a.opts.ttl_or(DEFAULT_TTL))
    );
    let started = Instant::now();
    let (t, aborted) = run_clients(a, &handles, &interrupted)?;
    let elapsed = started.elapsed();
    if interrupted.load(Ordering::Relaxed) {
        out!("interrupted after {} cycles", t.cycles);
        return Ok(exit::INTERRUPTED);
    }
    // A client's first attempt failed and stopped them all: fewer cycles ran than asked, and
    // their figures are no bench (not printed, and no exit 0).
    if let Some(e) = &aborted {
        let context = match t.cycles {
            0 => "bench: no lock acquired".to_owned(),
            n => format!(
                "bench: stopped after {n} of {} cycles: a client's first attempt failed",
                a.cycles
            ),
        };
        return Err(Fail::lib(&context, e));
    }
    if t.cycles == 0 {
        return Err(match &t.last_error {
            Some(e) => Fail::lib("bench: no lock acquired", e),
            None => Fail::new(exit::INTERNAL, "bench: no lock cycle ran"),
        });
    }
    report(&t, elapsed);
    drop(handles);
    drop(local);
    Ok(exit::OK)
}
