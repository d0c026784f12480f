//! Observability against real servers: the counters of `stats()` after known sequences (exact
//! counts), a frozen node's timeouts, a killed node's downs and reconnects, NOSCRIPT fallbacks;
//! which nodes a `Lock` says granted it; and (feature `log`) the events.

use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Client, LockVote, Stats};

/// How long a test waits for something the servers do before it gives up.
const PATIENCE: Duration = Duration::from_secs(10);

fn client(servers: &Cluster) -> Client {
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .build_client()
        .unwrap();
    assert_eq!(c.connect(Duration::from_secs(2)), servers.len());
    c
}

/// Per node, `after − before` of one counter.
fn delta(before: &Stats, after: &Stats, field: fn(&redlock_mux::NodeStats) -> u64) -> Vec<u64> {
    before
        .nodes
        .iter()
        .zip(&after.nodes)
        .map(|(b, a)| field(a) - field(b))
        .collect()
}

#[test]
fn a_known_sequence_of_cycles_gives_exact_counts() {
    const CYCLES: u64 = 20;
    let servers = Cluster::start(3);
    let mut c = client(&servers);
    let before = c.stats();
    for i in 0..CYCLES {
        let lock = c.try_lock(format!("stats:{i}")).unwrap();
        // Every node answered the release, so every SET reply (queued before it) is in too.
        assert_eq!(c.unlock(lock).unwrap(), 3);
    }
    let after = c.stats();
    // One SET and one release script per node per cycle; all said yes.
    assert_eq!(delta(&before, &after, |n| n.requests), [2 * CYCLES; 3]);
    assert_eq!(delta(&before, &after, |n| n.ok), [2 * CYCLES; 3]);
    assert_eq!(
        delta(&before, &after, |n| n.latency.count()),
        [2 * CYCLES; 3]
    );
    let fields: [fn(&redlock_mux::NodeStats) -> u64; 3] =
        [|n| n.refused, |n| n.errors, |n| n.failures];
    for field in fields {
        assert_eq!(delta(&before, &after, field), [0; 3]);
    }
    assert_eq!(delta(&before, &after, |n| n.timeouts), [0; 3]);
    assert_eq!(after.acquire.ok - before.acquire.ok, CYCLES);
    assert_eq!(after.acquire.count() - before.acquire.count(), CYCLES);
    assert_eq!(after.release.ok - before.release.ok, CYCLES);
    assert_eq!(
        after.acquire.latency.count() - before.acquire.latency.count(),
        CYCLES
    );
    assert!(after.acquire.latency.max() >= after.acquire.latency.percentile(50.0));
    assert_eq!(after.extend.count(), 0);
    // The connections: one each, made by `connect`.
    for n in &after.nodes {
        assert_eq!((n.connects, n.reconnects, n.downs), (1, 0, 0), "{n:?}");
    }
    // Syscalls: at least one write per node per request round, and one read per node per cycle
    // (a reply of the acquire not waited for may come in the read of the release's); a
    // client's caller drives its loop (no wakes) and it keeps no locks.
    assert_eq!(after.io.connects, 3);
    assert!(
        after.io.writes - before.io.writes >= 2 * CYCLES * 3,
        "{:?}",
        after.io
    );
    assert!(
        after.io.reads - before.io.reads >= CYCLES * 3,
        "{:?}",
        after.io
    );
    assert_eq!(after.io.wakes, 0);
    assert_eq!(after.keep, redlock_mux::KeepStats::default());

    // Held elsewhere: every node refuses.
    for s in servers.iter() {
        s.set("taken", "someone-else");
    }
    let before = c.stats();
    assert!(matches!(
        c.try_lock("taken"),
        Err(redlock_mux::Error::Held(_))
    ));
    let after = c.stats();
    assert_eq!(after.acquire.refused - before.acquire.refused, 1);
    // The refusal's cleanup release (nobody waits for it) is not counted as a release.
    assert_eq!(after.release.count(), before.release.count());
    assert_eq!(
        after
            .nodes
            .iter()
            .map(|n| n.node.clone())
            .collect::<Vec<_>>(),
        { servers.iter().map(|s| s.addr()).collect::<Vec<_>>() }
    );
}

#[test]
fn a_frozen_node_shows_timeouts_and_is_not_waited_for_not_unreachable() {
    const CYCLES: u64 = 5;
    let mut servers = Cluster::start(3);
    let mut c = client(&servers);
    servers[2].freeze();
    let before = c.stats();
    for i in 0..CYCLES {
        let lock = c.try_lock(format!("frozen:{i}")).unwrap();
        // Decided at the quorum, before the frozen node could answer: its connection is not
        // known to be down, so it was not waited for — it is not unreachable.
        assert_eq!(lock.votes().unreachable(), 0, "{lock:?}");
        assert_eq!(lock.votes().vote(2), Some(LockVote::NotWaitedFor));
        assert_eq!(lock.votes().yes(), 2);
        c.unlock(lock).unwrap();
    }
    // A status read waits 200 ms: every acquire's node timeout (50 ms) has passed by its end.
    let _ = c.status(b"frozen:0", Duration::from_millis(200));
    let after = c.stats();
    assert_eq!(delta(&before, &after, |n| n.timeouts), [0, 0, CYCLES]);
    assert_eq!(delta(&before, &after, |n| n.ok)[2], 0);
    servers[2].resume();
}

/// A status read is no lock operation: its answers count as neither yeses nor errors (`ZCARD`
/// of a held key answers WRONGTYPE by design). Each read added 4 yeses per node, and an error
/// per node while the key was held. And a key of another type (a hash) is
/// not reported free: it refuses every lock of the name.
#[test]
fn status_reads_are_not_counted_as_lock_replies_and_a_foreign_key_is_not_free() {
    let servers = Cluster::start(3);
    let mut c = client(&servers);
    let lock = c.try_lock("held").unwrap();
    // The acquire's last yes may come after its decision: let it in before counting.
    let _ = c.status(b"held", Duration::from_secs(2));
    let before = c.stats();
    for resource in [&b"free"[..], b"held"] {
        let status = c.status(resource, Duration::from_secs(2));
        assert!(status.iter().all(|n| n.state.is_ok()), "{status:?}");
    }
    let after = c.stats();
    assert_eq!(delta(&before, &after, |n| n.ok), [0, 0, 0]);
    assert_eq!(delta(&before, &after, |n| n.errors), [0, 0, 0]);
    c.unlock(lock).unwrap();
    for s in servers.iter() {
        s.cmd(&["HSET", "hash", "f", "v"]);
    }
    let status = c.status(b"hash", Duration::from_secs(2));
    for n in &status {
        assert!(
            !matches!(n.state, Ok((None, _))),
            "a hash reported free: {status:?}"
        );
    }
    assert!(c.try_lock("hash").is_err());
}

#[test]
fn a_killed_node_is_unreachable_counted_down_then_reconnected() {
    let mut servers = Cluster::start(3);
    let mut c = client(&servers);
    servers[2].kill();
    // The first cycle after the kill finds the connection dead (maybe only after its
    // decision); from the next on the node is known down.
    if let Ok(lock) = c.try_lock("warm") {
        let _ = c.unlock(lock);
    }
    let lock = c.try_lock("killed").unwrap();
    assert_eq!(lock.votes().yes(), 2);
    assert_eq!(lock.votes().unreachable(), 1, "{lock:?}");
    let unreachable: Vec<String> = lock.unreachable().map(|n| n.to_string()).collect();
    assert_eq!(unreachable, [servers[2].addr()]);
    let votes: Vec<LockVote> = lock.nodes().map(|(_, v)| v).collect();
    assert_eq!(votes, [LockVote::Yes, LockVote::Yes, LockVote::Unreachable]);
    c.unlock(lock).unwrap();
    let stats = c.stats();
    assert!(stats.nodes[2].downs >= 1, "{:?}", stats.nodes[2]);
    assert!(stats.nodes[2].failures >= 1, "{:?}", stats.nodes[2]);
    assert_eq!(stats.nodes[2].reconnects, 0);
    assert_eq!((stats.nodes[0].downs, stats.nodes[1].downs), (0, 0));

    servers[2].restart();
    let deadline = Instant::now() + PATIENCE;
    let lock = loop {
        // Each cycle reconnects the node once its backoff is over.
        let lock = c.try_lock("back").unwrap();
        if lock.votes().yes() == 3 {
            break lock;
        }
        c.unlock(lock).unwrap();
        assert!(Instant::now() < deadline, "the node never came back");
    };
    assert_eq!(lock.votes().unreachable(), 0);
    c.unlock(lock).unwrap();
    let stats = c.stats();
    assert_eq!(stats.nodes[2].reconnects, 1, "{:?}", stats.nodes[2]);
    assert!(stats.nodes[2].connects >= 2);
}

#[test]
fn all_nodes_up_never_reports_unreachable() {
    let servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .build()
        .unwrap();
    for i in 0..50 {
        let lock = redlock.try_lock(format!("up:{i}")).unwrap();
        let votes = lock.votes();
        assert_eq!(votes.nodes(), 3);
        assert_eq!(votes.unreachable(), 0, "{lock:?}");
        // At least a quorum said yes; the rest were not waited for (or said yes in time).
        assert!(votes.yes() >= 2);
        assert!(
            lock.nodes()
                .all(|(_, v)| matches!(v, LockVote::Yes | LockVote::NotWaitedFor))
        );
        redlock.unlock(lock).unwrap();
    }
    let stats = redlock.stats();
    assert_eq!(stats.acquire.ok, 50);
    assert_eq!(stats.release.ok, 50);
    // Every SET went out; the yeses that came after a decision are late yeses, not failures.
    assert!(stats.nodes.iter().all(|n| n.requests >= 100));
    assert!(
        stats
            .nodes
            .iter()
            .all(|n| n.failures == 0 && n.timeouts == 0)
    );
}

/// A handle's `stats()` carries its engine's syscalls (`io`) and its kept locks' renewals
/// (`keep`), and reads them without waiting for the loop: it answers while a caller holds it.
#[test]
fn a_handles_stats_carry_syscalls_and_renewals_without_waiting_for_the_loop() {
    let servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .ttl(Duration::from_millis(600))
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    assert_eq!(redlock.connect(PATIENCE).unwrap(), 3);
    let before = redlock.stats();
    assert_eq!(before.keep.batches, 0);
    let kept = redlock.keep(redlock.lock("kept").unwrap()).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while kept.lock().extensions() < 2 {
        assert!(Instant::now() < deadline, "renewal too slow");
        kept.wait_lost(Duration::from_millis(20));
    }
    assert_eq!(kept.release().unwrap(), 3);
    let after = redlock.stats();
    assert!(after.keep.batches >= 2, "{:?}", after.keep);
    assert!(after.keep.extended >= 2, "{:?}", after.keep);
    assert!(after.keep.writes >= 3 * 2, "{:?}", after.keep);
    assert!(after.extend.ok >= after.keep.extended, "{after:?}");
    let io = |s: &Stats| (s.io.writes, s.io.reads, s.io.polls);
    let (w0, r0, p0) = io(&before);
    let (w1, r1, p1) = io(&after);
    // An acquire, two renewals and a release: four writes per node at least; replies may
    // share reads, but the release's were read from every node.
    assert!(w1 - w0 >= 4 * 3 && r1 - r0 >= 3 && p1 > p0, "{after:?}");
    assert!(w1 - w0 >= after.keep.writes);

    redlock
        .with_client(|_| {
            let other = redlock.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(other.stats()).unwrap());
            let held = rx
                .recv_timeout(PATIENCE)
                .expect("stats() waited for the loop");
            assert_eq!(held.keep, redlock.stats().keep);
        })
        .unwrap();
}

#[test]
fn a_flushed_script_is_counted_as_a_noscript_fallback() {
    let servers = Cluster::start(3);
    let mut c = client(&servers);
    let mut lock = c.try_lock("noscript").unwrap();
    // The first extend loads the script (EVAL); then node 0 forgets it. The extend is decided at
    // the quorum of nodes 1 and 2, and node 0 may not have run its EVAL yet: a flush read before
    // it would be followed by the load, and nothing would be missing (seen once under CI's load).
    // A status read waits for every node, and node 0 answers in order: its EVAL has run.
    c.extend(&mut lock, Duration::from_secs(30)).unwrap();
    c.status(b"noscript", PATIENCE);
    servers[0].cmd(&["SCRIPT", "FLUSH"]);
    c.extend(&mut lock, Duration::from_secs(30)).unwrap();
    c.unlock(lock).unwrap();
    // The extend and the release are decided at the quorum of nodes 1 and 2: node 0's NOSCRIPT
    // may still be unread (it was once, under CI's load). A status read waits for every node,
    // and node 0's replies come in order. The release's script was flushed too: if its EVALSHA
    // went out before the extend's NOSCRIPT was read, it falls back as well.
    c.status(b"noscript", PATIENCE);
    let stats = c.stats();
    let noscript: Vec<u64> = stats.nodes.iter().map(|n| n.noscript).collect();
    assert!(matches!(noscript[..], [1 | 2, 0, 0]), "{noscript:?}");
    assert_eq!(stats.extend.ok, 2);
}

#[test]
fn a_lock_from_parts_has_no_votes() {
    let lock = redlock_mux::Lock::from_parts("r", [b'a'; 20], Duration::from_secs(1)).unwrap();
    assert_eq!(lock.votes().nodes(), 0);
    assert_eq!(lock.nodes().count(), 0);
    assert_eq!(lock.votes().vote(0), None);
}

/// The events, captured by a logger of the test's own.
#[cfg(feature = "log")]
mod events {
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use super::client;
    use redis_local::Cluster;
    use redlock_mux::Builder;

    /// One captured record: level, message, key-values.
    #[derive(Debug, Clone)]
    struct Event {
        level: log::Level,
        message: String,
        kv: Vec<(String, String)>,
    }

    impl Event {
        fn get(&self, key: &str) -> Option<&str> {
            self.kv
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        }
    }

    struct Capture(Mutex<Vec<Event>>);

    impl log::Log for Capture {
        fn enabled(&self, m: &log::Metadata<'_>) -> bool {
            m.target() == redlock_mux::LOG_TARGET
        }
        fn log(&self, record: &log::Record<'_>) {
            if !self.enabled(record.metadata()) {
                return;
            }
            struct Collect(Vec<(String, String)>);
            impl<'kvs> log::kv::VisitSource<'kvs> for Collect {
                fn visit_pair(
                    &mut self,
                    key: log::kv::Key<'kvs>,
                    value: log::kv::Value<'kvs>,
                ) -> Result<(), log::kv::Error> {
                    self.0.push((key.to_string(), value.to_string()));
                    Ok(())
                }
            }
            let mut kv = Collect(Vec::new());
            let _ = record.key_values().visit(&mut kv);
            self.0.lock().unwrap().push(Event {
                level: record.level(),
                message: record.args().to_string(),
                kv: kv.0,
            });
        }
        fn flush(&self) {}
    }

    /// The capturing logger (installed once for the whole test binary).
    fn capture() -> &'static Capture {
        static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
        CAPTURE.get_or_init(|| {
            let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
            log::set_logger(c).unwrap();
            log::set_max_level(log::LevelFilter::Debug);
            c
        })
    }

    /// The events named `name` that `pick` accepts (tests run in parallel: each looks for its
    /// own resources and nodes).
    fn events(name: &str, pick: impl Fn(&Event) -> bool) -> Vec<Event> {
        capture()
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.get("event") == Some(name) && pick(e))
            .cloned()
            .collect()
    }

    /// The `waiting` event: a lock held elsewhere is said once the wait has lasted a second,
    /// then again each time the reason changes — no quorum while two nodes are frozen (the
    /// holder's key gone from the third), held again once they answer — and not at every
    /// attempt in between.
    #[test]
    fn a_wait_says_why_it_waits_once_and_again_when_the_reason_changes() {
        capture();
        let mut servers = Cluster::start(3);
        let holder = Builder::new(servers.urls())
            .quarantine(None)
            .ttl(Duration::from_secs(30))
            .build()
            .unwrap();
        let _held = holder.try_lock("ev:waiting").unwrap();
        let waiter = Builder::new(servers.urls())
            .quarantine(None)
            .node_timeout(Duration::from_millis(200))
            .retry_delay(Duration::from_millis(100), Duration::ZERO)
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let deadline = started + Duration::from_secs(5);
        let wait = std::thread::spawn(move || waiter.lock_until("ev:waiting", deadline));
        let said = || {
            let mine = |e: &Event| e.get("resource") == Some("ev:waiting");
            events("waiting", mine)
        };
        let until = |n: usize| {
            while said().len() < n {
                assert!(std::time::Instant::now() < deadline, "{:?}", said());
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        until(1);
        assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", said());
        servers[0].freeze();
        servers[1].freeze();
        servers[2].cmd(&["DEL", "ev:waiting"]);
        until(2);
        servers[0].resume();
        servers[1].resume();
        until(3);
        let result = wait.join().unwrap();
        assert!(
            matches!(result, Err(redlock_mux::Error::Held(_))),
            "{result:?}"
        );
        let said = said();
        let reasons: Vec<&str> = said.iter().map(|e| e.get("reason").unwrap()).collect();
        assert_eq!(reasons, ["held", "no_quorum", "held"], "{said:?}");
        let first: u64 = said[0].get("waited_ms").unwrap().parse().unwrap();
        assert!(first >= 1_000, "{said:?}");
        assert!(said.iter().all(|e| e.level == log::Level::Info));
        assert!(said[0].message.contains("held elsewhere"), "{said:?}");
    }

    /// Short waits one after the other (a loop of `lock_until` with near deadlines, as the
    /// CLI makes to look again at why it waits) are one wait: the lock held elsewhere is said
    /// once they have lasted a second together, once.
    #[test]
    fn short_waits_one_after_the_other_are_one_wait() {
        capture();
        let servers = Cluster::start(3);
        let holder = Builder::new(servers.urls())
            .quarantine(None)
            .build()
            .unwrap();
        let _held = holder.try_lock("ev:slices").unwrap();
        let waiter = Builder::new(servers.urls())
            .quarantine(None)
            .retry_delay(Duration::from_millis(50), Duration::ZERO)
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let mine = |e: &Event| e.get("resource") == Some("ev:slices");
        while started.elapsed() < Duration::from_millis(2_500) {
            let slice = std::time::Instant::now() + Duration::from_millis(300);
            assert!(waiter.lock_until("ev:slices", slice).is_err());
        }
        let said = events("waiting", mine);
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(said[0].get("reason"), Some("held"));
        let waited: u64 = said[0].get("waited_ms").unwrap().parse().unwrap();
        assert!(waited >= 1_000, "{said:?}");
    }

    #[test]
    fn acquired_no_quorum_and_node_down_are_told() {
        capture();
        let mut servers = Cluster::start(3);
        let mut c = client(&servers);
        let lock = c.try_lock("ev:acquired").unwrap();
        c.unlock(lock).unwrap();
        let acquired = events("acquired", |e| e.get("resource") == Some("ev:acquired"));
        assert_eq!(acquired.len(), 1, "{acquired:?}");
        let e = &acquired[0];
        assert_eq!(e.level, log::Level::Debug);
        assert_eq!(e.get("attempts"), Some("1"));
        assert_eq!(e.get("nodes"), Some("3"));
        assert!(e.get("yes").unwrap().parse::<u32>().unwrap() >= 2);
        assert!(e.get("latency_us").is_some());
        assert!(e.message.contains("yes from 127.0.0.1:"), "{}", e.message);

        servers[1].kill();
        servers[2].kill();
        let err = c.try_lock("ev:noquorum").unwrap_err();
        assert!(matches!(err, redlock_mux::Error::NoQuorum(_)), "{err}");
        let no_quorum = events("no_quorum", |e| e.get("resource") == Some("ev:noquorum"));
        assert_eq!(no_quorum.len(), 1, "{no_quorum:?}");
        assert_eq!(no_quorum[0].level, log::Level::Warn);
        // Each node's fault is in the message.
        for s in [&servers[1], &servers[2]] {
            assert!(
                no_quorum[0].message.contains(&s.addr()),
                "{}",
                no_quorum[0].message
            );
        }
        for s in [&servers[1], &servers[2]] {
            let down = events("node_down", |e| e.get("node") == Some(s.addr().as_str()));
            assert!(!down.is_empty());
            assert_eq!(down[0].level, log::Level::Warn);
            assert!(down[0].get("fault").is_some());
        }
    }

    #[test]
    fn a_lost_kept_lock_and_a_noscript_fallback_are_told() {
        capture();
        let servers = Cluster::start(3);
        let mut c = client(&servers);
        let mut lock = c.try_lock("ev:noscript").unwrap();
        c.extend(&mut lock, Duration::from_secs(30)).unwrap();
        // Node 0's EVAL has run before the flush (as in `a_flushed_script_is_counted_as_a_noscript_fallback`).
        c.status(b"ev:noscript", crate::PATIENCE);
        servers[0].cmd(&["SCRIPT", "FLUSH"]);
        c.extend(&mut lock, Duration::from_secs(30)).unwrap();
        c.unlock(lock).unwrap();
        // Node 0's replies all read, and a release that fell back too (as in
        // `a_flushed_script_is_counted_as_a_noscript_fallback`).
        c.status(b"ev:noscript", crate::PATIENCE);
        let noscript = events("noscript", |e| {
            e.get("node") == Some(servers[0].addr().as_str())
        });
        assert!(matches!(noscript.len(), 1 | 2), "{noscript:?}");
        let extended = events("extended", |e| e.get("resource") == Some("ev:noscript"));
        assert_eq!(extended.len(), 2);
        let released = events("released", |e| e.get("resource") == Some("ev:noscript"));
        assert_eq!(released.len(), 1);

        // A kept lock whose keys vanish is lost at its next renewal.
        let redlock = Builder::new(servers.urls())
            .quarantine(None)
            .ttl(Duration::from_millis(600))
            .build()
            .unwrap();
        let kept = redlock.keep(redlock.try_lock("ev:lost").unwrap()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        kept.on_lost(move |_| {
            let _ = tx.send(());
        });
        for s in servers.iter() {
            s.cmd(&["DEL", "ev:lost"]);
        }
        rx.recv_timeout(super::PATIENCE)
            .expect("the kept lock was never lost");
        let lost = events("lost", |e| e.get("resource") == Some("ev:lost"));
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert_eq!(lost[0].level, log::Level::Warn);
        assert!(lost[0].get("why").is_some());
        assert_eq!(redlock.stats().extend.refused, 1);
    }
}

/// Servers configured as production ones often are (`timeout 1`: idle connections closed)
/// close ours between locks: routine, not a node down — counted as idle closes, no `downs`,
/// and the next lock, which reconnects, reports no node unreachable.
#[test]
fn idle_connections_closed_by_the_server_are_routine_not_nodes_down() {
    let servers = Cluster::start_with(3, redis_local::Server::builder().arg("--timeout").arg("1"));
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .build()
        .unwrap();
    let lock = redlock.try_lock("idle:res").unwrap();
    redlock.unlock(lock).unwrap();
    let deadline = Instant::now() + PATIENCE;
    // Until the client has seen every connection closed, however it counts it.
    while redlock
        .stats()
        .nodes
        .iter()
        .any(|n| n.idle_closes + n.downs == 0)
    {
        assert!(Instant::now() < deadline, "{:?}", redlock.stats().nodes);
        // Waiting for the servers' idle timeout: nothing to wait on but the counter.
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..3 {
        let lock = redlock.try_lock("idle:res").unwrap();
        let unreachable: Vec<_> = lock.unreachable().collect();
        assert!(unreachable.is_empty(), "{unreachable:?}");
        redlock.unlock(lock).unwrap();
    }
    let stats = redlock.stats();
    for n in &stats.nodes {
        assert_eq!((n.downs, n.failures), (0, 0), "{n:?}");
        assert!(n.idle_closes >= 1, "{n:?}");
    }
}
