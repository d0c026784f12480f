//! A mock service on tokio: many tasks take per-entity locks through one `AsyncRedlock`.
//!
//! The service keeps stock counts for 32 products in memory (standing in for a database that
//! has no transactions). 256 request tasks each run 20 orders; an order locks its product,
//! reads the count, yields (as a real handler awaits its database), and writes the count back
//! minus one. Without the lock, concurrent orders of one product would lose updates; with it,
//! the counts add up exactly. An in-process flag per product also catches any two holders at
//! once. Then a lock is held across a spawned task (an owned guard), a kept lock runs a long
//! job, and `shutdown` flushes the releases of dropped guards before exit.
//!
//! ```text
//! cargo run --example tokio_service                       # starts 3 local redis-servers
//! cargo run --example tokio_service -- redis://127.0.0.1:7001 redis://127.0.0.1:7002 redis://127.0.0.1:7003
//! ```
//!
//! Exits non-zero if a count is off or two holders were ever seen.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{AsyncRedlock, Builder, LockWatch};

// Local servers when none are given: the test suite's harness (free loopback ports, no
// persistence, killed on exit; it says how to install redis-server if it is missing).

const PRODUCTS: usize = 32;
const TASKS: usize = 256;
const ORDERS_PER_TASK: usize = 20;
const STOCK: i64 = 10_000;

/// The in-memory "database": a stock count and an occupancy flag per product.
struct Store {
    stock: Vec<AtomicI64>,
    busy: Vec<AtomicBool>,
    overlaps: AtomicU64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _servers;
    let urls = if args.is_empty() {
        let local = Cluster::start(3);
        let urls = local.urls();
        _servers = Some(local);
        urls
    } else {
        _servers = None;
        args
    };

    let mut builder = Builder::new(&urls);
    if _servers.is_some() {
        // Servers this example just started: brand new, so the restart quarantine (which keeps
        // a node that restarted less than a TTL ago out of quorums) would refuse every lock
        // for the first TTL. Keep it for servers of your own.
        builder = builder.quarantine(None);
    }
    let redlock: AsyncRedlock = builder
        .ttl(Duration::from_secs(5))
        // Contended: short pauses between attempts, and enough of them.
        .retry_delay(Duration::from_millis(1), Duration::from_millis(4))
        .retry_count(10_000)
        .build_async()
        .expect("a valid configuration");

    let store = Arc::new(Store {
        stock: (0..PRODUCTS).map(|_| AtomicI64::new(STOCK)).collect(),
        busy: (0..PRODUCTS).map(|_| AtomicBool::new(false)).collect(),
        overlaps: AtomicU64::new(0),
    });
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (redlock, store) = (redlock.clone(), store.clone());
            tokio::spawn(async move {
                let mut waits = Vec::with_capacity(ORDERS_PER_TASK);
                for n in 0..ORDERS_PER_TASK {
                    let product = (t * 7 + n * 13) % PRODUCTS;
                    let asked = Instant::now();
                    let guard = redlock
                        .guard(format!("product:{product}"))
                        .await
                        .expect("the lock, within the retries");
                    waits.push(asked.elapsed());
                    if store.busy[product].swap(true, Ordering::SeqCst) {
                        store.overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // Read, await something, write: a lost update without the lock.
                    let count = store.stock[product].load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    store.stock[product].store(count - 1, Ordering::SeqCst);
                    store.busy[product].store(false, Ordering::SeqCst);
                    drop(guard); // released through the engine; never waits
                }
                waits
            })
        })
        .collect();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await.expect("a request task"));
    }
    let elapsed = t0.elapsed();
    waits.sort_unstable();
    let orders = TASKS * ORDERS_PER_TASK;
    let sold: i64 = store
        .stock
        .iter()
        .map(|s| STOCK - s.load(Ordering::SeqCst))
        .sum();
    let q = |p: f64| waits[((waits.len() - 1) as f64 * p) as usize];
    println!(
        "{orders} orders by {TASKS} tasks on {PRODUCTS} products in {elapsed:.2?}: {:.0} orders/s; \
         wait for the lock p50 {:.2?}, p99 {:.2?}",
        orders as f64 / elapsed.as_secs_f64(),
        q(0.5),
        q(0.99)
    );
    println!(
        "stock sold {sold} of {orders} ordered; two holders seen {} times",
        store.overlaps.load(Ordering::SeqCst)
    );

    // An owned guard moves into a spawned task and is released there.
    let guard = redlock.guard("report:daily").await.expect("the lock");
    let validity = tokio::spawn(async move {
        let validity = guard.validity();
        guard.unlock().await.map(|released| (validity, released))
    })
    .await
    .expect("the task")
    .expect("released");
    println!(
        "a guard moved into a task: {:.1?} valid, released on {} nodes",
        validity.0, validity.1
    );

    // A long job under a kept lock: renewed by the engine, the job checks it between steps.
    let steps = redlock
        .with_lock("job:reindex", async |watch: LockWatch| {
            let mut steps = 0;
            while steps < 5 && watch.is_held() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                steps += 1;
            }
            steps
        })
        .await
        .expect("the lock, held until the job returned");
    println!("a kept job ran {steps} steps under its lock");

    // Releases of dropped guards are queued; flush them before the process exits.
    let flushed = redlock.shutdown(Duration::from_secs(5)).await;
    println!(
        "shutdown: {} releases confirmed, {} unconfirmed",
        flushed.confirmed, flushed.unconfirmed
    );

    let overlaps = store.overlaps.load(Ordering::SeqCst);
    if sold != orders as i64 || overlaps != 0 || flushed.unconfirmed != 0 {
        eprintln!("tokio_service: FAILED (lost updates, two holders, or unflushed releases)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
