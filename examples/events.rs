//! The events of the `log` feature, printed by a tiny logger written inline (any `log` logger
//! works: `env_logger`, `simplelog`, or `tracing` through `tracing-log`).
//!
//! ```text
//! cargo run --example events --features log                # starts 3 local redis-servers
//! cargo run --example events --features log -- redis://127.0.0.1:7001 redis://127.0.0.1:7002 redis://127.0.0.1:7003
//! ```
//!
//! It takes a lock, extends and releases it, meets a lock held elsewhere, then (on the servers
//! it started) kills one node and takes a lock without it: the `node_down` warning, then an
//! `acquired` event that names the unreachable node.

use std::time::Duration;

use redis_local::Cluster;
use redlock_mux::{Builder, LOG_TARGET};

/// Prints every event of this crate on stderr: level, message, then the key-values.
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target() == LOG_TARGET
    }
    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        struct Pairs(String);
        impl<'kvs> log::kv::VisitSource<'kvs> for Pairs {
            fn visit_pair(
                &mut self,
                key: log::kv::Key<'kvs>,
                value: log::kv::Value<'kvs>,
            ) -> Result<(), log::kv::Error> {
                self.0.push_str(&format!(" {key}={value}"));
                Ok(())
            }
        }
        let mut pairs = Pairs(String::new());
        let _ = record.key_values().visit(&mut pairs);
        eprintln!(
            "{:5} {}  [{}]",
            record.level(),
            record.args(),
            pairs.0.trim()
        );
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

fn main() -> Result<(), redlock_mux::Error> {
    log::set_logger(&LOGGER).expect("no other logger");
    log::set_max_level(log::LevelFilter::Debug);

    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut local = args.is_empty().then(|| Cluster::start(3));
    let urls = local.as_ref().map_or(args, |s| s.urls());
    let mut builder = Builder::new(&urls);
    if local.is_some() {
        // Servers this example just started: never held a lock (keep the quarantine on yours).
        builder = builder.quarantine(None);
    }
    let redlock = builder.build()?;

    let mut lock = redlock.lock("events:demo")?;
    redlock.extend(&mut lock, Duration::from_secs(30))?;
    let other = redlock.try_lock("events:demo"); // refused: held (by us)
    assert!(other.is_err());
    redlock.unlock(lock)?;

    if let Some(servers) = local.as_mut() {
        servers[2].kill();
        for _ in 0..2 {
            // The first finds the connection dead; the second knows the node is down.
            let lock = redlock.try_lock("events:degraded")?;
            let unreachable: Vec<String> = lock.unreachable().map(|n| n.to_string()).collect();
            println!("acquired; unreachable nodes: {unreachable:?}");
            redlock.unlock(lock)?;
        }
    }
    Ok(())
}
