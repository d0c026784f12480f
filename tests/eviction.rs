//! Servers that evict keys under memory pressure, for real: three redis-servers with
//! `--maxmemory 4mb` and each eviction policy. Counted as any other, an evicting server lets a
//! second client take a lock while its holder still has most of its validity — another
//! application's cache writes push the lock's key out. By default such a server's yes does not
//! count ([`NodeFault::Evicting`], naming its policy), so no lock is granted on it at all;
//! with `noeviction`, or no `maxmemory` limit, locks work as before.

use std::time::Duration;

use redis_local::{Cluster, Server};
use redlock_mux::{Builder, Error, EvictingServers, Eviction, EvictionPolicy, NodeFault, Redlock};

const POLICIES: [(&str, EvictionPolicy); 7] = [
    ("allkeys-lru", EvictionPolicy::AllkeysLru),
    ("allkeys-lfu", EvictionPolicy::AllkeysLfu),
    ("allkeys-random", EvictionPolicy::AllkeysRandom),
    ("volatile-lru", EvictionPolicy::VolatileLru),
    ("volatile-lfu", EvictionPolicy::VolatileLfu),
    ("volatile-random", EvictionPolicy::VolatileRandom),
    ("volatile-ttl", EvictionPolicy::VolatileTtl),
];

/// The memory limit: a few thousand cache entries of a kilobyte overflow it.
const MAXMEMORY: &str = "4mb";
/// Cache entries written per batch, and the most written in all before giving up on an
/// eviction (the limit is 4 MB: a few thousand entries overflow it many times over).
const BATCH: usize = 500;
const MOST_ENTRIES: usize = 200_000;

fn servers(maxmemory: &str, policy: &str) -> Cluster {
    Cluster::start_with(
        3,
        Server::builder()
            .arg("--maxmemory")
            .arg(maxmemory)
            .arg("--maxmemory-policy")
            .arg(policy),
    )
}

fn handle(servers: &Cluster, evicting: EvictingServers) -> Redlock {
    Builder::new(servers.urls())
        .quarantine(None)
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_millis(200))
        .evicting_servers(evicting)
        .build()
        .unwrap()
}

/// Another application's cache: entries of a kilobyte with a TTL (so that the `volatile-*`
/// policies may evict them too), written until `key` is gone from a majority of the servers.
fn fill_until_evicted(servers: &Cluster, key: &str, policy: &str) {
    let value = "x".repeat(1024);
    let mut written = 0;
    // `EXISTS`, not `GET`: a read would count as a use, which LRU and LFU keep.
    let present = |s: &Server| s.cmd(&["EXISTS", key]) == redis::Value::Int(1);
    while servers.iter().filter(|s| present(s)).count() >= 2 {
        assert!(written < MOST_ENTRIES, "{policy}: {key} was never evicted");
        for s in servers.iter() {
            let mut conn = s.connection();
            let mut pipe = redis::pipe();
            for i in written..written + BATCH {
                pipe.cmd("SET")
                    .arg(format!("cache:{i}"))
                    .arg(&value)
                    .arg("EX")
                    .arg(3600)
                    .ignore();
            }
            let _: redis::RedisResult<()> = pipe.query(&mut conn);
        }
        written += BATCH;
    }
}

/// Counted as any other (what the client did before): an evicted key gives a second holder.
/// Refused (the default): no lock at all, every node's refusal naming its policy — a
/// configuration mistake, reported at once, not waited out.
#[test]
fn evicting_servers_give_two_holders_unless_refused() {
    for (name, policy) in POLICIES {
        let servers = servers(MAXMEMORY, name);
        let counted = handle(&servers, EvictingServers::CountUnsafely);
        let first = counted.try_lock("ev").unwrap();
        fill_until_evicted(&servers, "ev", name);
        let second = counted.try_lock("ev");
        assert!(
            second.is_ok(),
            "{name}: the key evicted on a majority, a second holder ({second:?})"
        );
        assert!(first.validity() > Duration::from_secs(30), "{name}");

        let refusing = handle(&servers, EvictingServers::Refuse);
        let err = refusing.try_lock("fresh").unwrap_err();
        assert!(matches!(err, Error::NoQuorum(_)), "{name}: {err:?}");
        let report = err.report().unwrap();
        // Decided once two had refused: the third is not waited for.
        let faults: Vec<&NodeFault> = report.failed().map(|(_, f)| f).collect();
        assert!(faults.len() >= 2, "{name}: {err}");
        for f in faults {
            assert_eq!(f, &NodeFault::Evicting(Some(policy)), "{name}: {err}");
        }
        assert!(err.is_permanent(), "{name}: {err:?}");
        let message = err.to_string();
        assert!(message.contains(name), "{message}");
        assert!(message.contains("noeviction"), "{message}");
        // The lost round's keys are released (in the background: waited for, bounded), and
        // status says why.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while servers.iter().any(|s| s.get("fresh").is_some()) {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: fresh never released"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = refusing.status(b"fresh", Duration::from_secs(1));
        for n in &status {
            assert_eq!(n.eviction, Eviction::May(policy), "{name}: {n:?}");
        }
        let stats = refusing.stats();
        let counted = stats.nodes.iter().filter(|n| n.evicting >= 1).count();
        assert!(counted >= 2, "{stats:?}");
    }
}

/// `noeviction` with a limit (a full server refuses writes instead), and any policy without a
/// limit: nothing is ever evicted, and locks work as before.
#[test]
fn servers_that_never_evict_count() {
    for (maxmemory, policy) in [(MAXMEMORY, "noeviction"), ("0", "allkeys-lru")] {
        let servers = servers(maxmemory, policy);
        let redlock = handle(&servers, EvictingServers::Refuse);
        let lock = redlock.try_lock("kept").unwrap();
        assert!(matches!(redlock.try_lock("kept"), Err(Error::Held(_))));
        let status = redlock.status(b"kept", Duration::from_secs(1));
        for n in &status {
            assert_eq!(n.eviction, Eviction::Never, "{maxmemory} {policy}: {n:?}");
        }
        assert_eq!(redlock.unlock(lock).unwrap(), 3);
    }
}
