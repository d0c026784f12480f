//! Redlock against 1, 3 and 5 real local servers: acquire, contention, release, extend, scripts
//! flushed or forgotten, many threads.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Client, Error, Lock, LockOptions};

/// Fresh test servers have a short uptime: quarantine is tested on its own, off elsewhere.
fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        // Timing is not what these tests check: room for a loaded machine.
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(5))
}

fn client(servers: &Cluster) -> Client {
    builder(servers).build_client().unwrap()
}

fn holders(servers: &Cluster, key: &str) -> Vec<Option<String>> {
    servers.iter().map(|s| s.get(key)).collect()
}

#[test]
fn lock_and_unlock_on_1_3_and_5_nodes() {
    for n in [1, 3, 5] {
        let servers = Cluster::start(n);
        let mut c = client(&servers);
        assert_eq!(c.quorum(), n / 2 + 1);
        let lock = c.try_lock("res").unwrap();
        let token = lock.token().to_string();
        assert_eq!(token.len(), 27);
        assert!(lock.validity() > Duration::from_millis(29_000), "{lock:?}");
        assert!(lock.validity() <= Duration::from_millis(30_000 - 302));
        for s in servers.iter() {
            assert_eq!(s.get("res").as_deref(), Some(token.as_str()));
            let pttl = s.pttl("res");
            assert!((29_000..=30_000).contains(&pttl), "pttl {pttl}");
        }
        assert_eq!(c.unlock(lock).unwrap(), n);
        assert_eq!(holders(&servers, "res"), vec![None; n]);
    }
}

#[test]
fn a_held_lock_is_refused_and_free_again_after_unlock() {
    let servers = Cluster::start(3);
    let mut a = client(&servers);
    let mut b = client(&servers);
    let lock = a.try_lock("res").unwrap();
    match b.try_lock("res") {
        Err(Error::Held(report)) => {
            assert_eq!(report.yes(), 0);
            // Decided at the second refusal (quorum out of reach); the third is counted only if
            // it arrived in the same wakeup.
            assert!(report.refused().count() >= 2);
            let refused: Vec<String> = report.refused().map(|n| n.to_string()).collect();
            let message = Error::Held(report).to_string();
            for node in refused {
                assert!(servers.addrs().contains(&node));
                assert!(message.contains(&node), "{message}");
            }
        }
        other => panic!("{other:?}"),
    }
    // The loser released nothing of ours.
    let token = lock.token().to_string();
    assert_eq!(holders(&servers, "res"), vec![Some(token); 3]);
    assert_eq!(a.unlock(lock).unwrap(), 3);
    let again = b.try_lock("res").unwrap();
    assert_eq!(b.unlock(again).unwrap(), 3);
}

#[test]
fn tokens_are_unique_per_acquisition() {
    let servers = Cluster::start(1);
    let mut c = client(&servers);
    let mut seen = HashSet::new();
    for _ in 0..200 {
        let lock = c.try_lock("res").unwrap();
        assert!(seen.insert(lock.token().to_string()));
        assert!(
            lock.token()
                .as_bytes()
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        );
        c.unlock(lock).unwrap();
    }
}

#[test]
fn a_lost_attempt_releases_the_minority_it_got() {
    let servers = Cluster::start(3);
    // Someone else holds the key on two of three nodes.
    servers[1].set("res", "other");
    servers[2].set("res", "other");
    let mut c = client(&servers);
    assert!(matches!(c.try_lock("res"), Err(Error::Held(_))));
    // Our SET succeeded on node 0 and must have been released; wait for that by asking the node
    // after the client has processed another operation on its connections.
    let probe = c.try_lock("probe").unwrap();
    c.unlock(probe).unwrap();
    assert_eq!(servers[0].get("res"), None);
    assert_eq!(servers[1].get("res").as_deref(), Some("other"));
}

#[test]
fn extend_renews_on_all_nodes_and_counts() {
    let servers = Cluster::start(3);
    let mut c = builder(&servers)
        .ttl(Duration::from_millis(2_000))
        .max_ttl(Duration::from_secs(60))
        .max_extensions(2)
        .build_client()
        .unwrap();
    let mut lock = c.try_lock("res").unwrap();
    c.extend(&mut lock, Duration::from_secs(60)).unwrap();
    assert!(lock.validity() > Duration::from_secs(58));
    for s in servers.iter() {
        assert!(s.pttl("res") > 59_000);
    }
    c.extend(&mut lock, Duration::from_secs(60)).unwrap();
    assert_eq!(lock.extensions(), 2);
    assert!(matches!(
        c.extend(&mut lock, Duration::from_secs(60)),
        Err(Error::ExtensionLimit(2))
    ));
    assert_eq!(c.unlock(lock).unwrap(), 3);
}

/// An extend whose TTL leaves less validity than `min_validity` could only lose: it used to be
/// sent, lose `TooSlow` (its quorum of yeses reported as "not acquired"), and cut the lock's
/// validity (and its keys) to that TTL. It is refused up front now, nothing sent.
#[test]
fn an_extend_too_short_for_the_minimum_validity_is_refused_before_anything_is_sent() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers)
        .ttl(Duration::from_secs(30))
        .min_validity(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut lock = redlock.try_lock("res").unwrap();
    let until = lock.valid_until();
    for s in servers.iter() {
        s.cmd(&["CONFIG", "RESETSTAT"]);
    }
    match redlock.extend(&mut lock, Duration::from_secs(1)) {
        Err(Error::Config(m)) => assert!(m.contains("minimum validity of 5 s"), "{m}"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
    assert_eq!(lock.valid_until(), until, "the validity is untouched");
    assert_eq!(lock.extensions(), 0);
    for s in servers.iter() {
        let stats = s.info("commandstats");
        assert!(
            !stats.contains("cmdstat_eval"),
            "{}: an extend script ran:\n{stats}",
            s.addr()
        );
        assert!(s.pttl("res") > 20_000, "{}: the key was cut", s.addr());
    }
    // A TTL that leaves more than the minimum goes through.
    redlock.extend(&mut lock, Duration::from_secs(10)).unwrap();
    assert_eq!(lock.extensions(), 1);
    assert_eq!(redlock.unlock(lock).unwrap(), 3);
}

#[test]
fn extend_of_a_lock_taken_over_fails() {
    let servers = Cluster::start(3);
    let mut c = client(&servers);
    let mut lock = c.try_lock("res").unwrap();
    for s in servers.iter() {
        s.set("res", "thief");
    }
    match c.extend(&mut lock, Duration::from_secs(10)) {
        Err(Error::Held(report)) => assert!(report.refused().count() >= 2),
        other => panic!("{other:?}"),
    }
    // A majority said our token is gone: the lock is no longer valid (it kept its whole
    // validity before, while the thief held the lock).
    assert!(!lock.is_valid(), "{:?} left", lock.validity());
    // Unlock must not delete the thief's key, and says the lock had expired.
    assert!(matches!(
        c.unlock(lock),
        Err(Error::Expired { released: 0 })
    ));
    assert_eq!(holders(&servers, "res"), vec![Some("thief".into()); 3]);
}

/// The nodes that back a lock are those that said yes to its acquire (or to its last extend
/// that won): an extend refused by one of them, with the others down, leaves fewer than a
/// quorum of nodes that may hold our token — a rival can win on the refusing node and the two
/// that never had it. Once extended, the lock counted every node as backing it (review).
#[test]
fn an_extend_refused_where_the_lock_needs_its_keys_ends_its_validity() {
    for extended_first in [false, true] {
        extend_refused_by_a_backing_node(extended_first);
    }
}

fn extend_refused_by_a_backing_node(extended_first: bool) {
    let mut servers = Cluster::start(5);
    let mut c = client(&servers);
    servers[3].kill();
    servers[4].kill();
    let mut lock = c.try_lock("res").unwrap();
    if extended_first {
        c.extend(&mut lock, Duration::from_secs(30)).unwrap();
    }
    // Backed by nodes 0, 1 and 2; node 0 loses our key (evicted, a failover).
    servers[0].cmd(&["DEL", "res"]);
    match c.extend(&mut lock, Duration::from_secs(10)) {
        Err(Error::Held(report) | Error::NoQuorum(report)) => {
            assert_eq!(report.refused().count(), 1, "{report:?}")
        }
        other => panic!("{other:?}"),
    }
    // Four nodes did not refuse, but only two of them had our token.
    assert!(
        !lock.is_valid(),
        "{:?} left ({extended_first})",
        lock.validity()
    );
    servers[3].restart();
    servers[4].restart();
    // A rival wins on nodes 0, 3 and 4.
    let mut rival = client(&servers);
    let theirs = rival.try_lock("res").unwrap();
    assert!(theirs.votes().yes() >= 3);
    assert!(matches!(c.unlock(lock), Err(Error::Expired { .. })));
}

/// The backing follows the lock's extends: refusals from nodes outside it (restarted empty
/// after the acquire) while a backing node is silent leave the validity as it was — the
/// nodes that said yes to the last extend hold our token until then.
#[test]
fn an_extend_refused_only_outside_the_backing_keeps_the_validity() {
    let mut servers = Cluster::start(5);
    let mut c = client(&servers);
    servers[3].kill();
    servers[4].kill();
    let mut lock = c.try_lock("res").unwrap();
    c.extend(&mut lock, Duration::from_secs(30)).unwrap();
    servers[3].restart();
    servers[4].restart();
    // Connected again to all five (past the backoff of the failed connects).
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while c.connect(Duration::from_secs(1)) < 5 {
        assert!(
            std::time::Instant::now() < give_up,
            "nodes 3 and 4 never connected"
        );
    }
    servers[1].freeze();
    servers[2].freeze();
    match c.extend(&mut lock, Duration::from_secs(30)) {
        Err(Error::NoQuorum(report) | Error::Held(report)) => {
            assert_eq!(report.refused().count(), 2, "{report:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(lock.is_valid(), "cut though nodes 1 and 2 back it");
    servers[1].resume();
    servers[2].resume();
    assert_eq!(c.unlock(lock).unwrap(), 3);
}

/// A lock whose backing is not known (rebuilt from its parts): any refusal of a lost extend
/// ends its validity — counting every node that did not refuse, two that are silent here
/// would stand for the one that lost our token.
#[test]
fn an_extend_of_a_lock_of_unknown_backing_refused_anywhere_ends_its_validity() {
    let mut servers = Cluster::start(5);
    let mut c = client(&servers);
    let lock = c.try_lock("res").unwrap();
    let mut parts = Lock::from_parts("res", lock.token().as_bytes(), lock.validity()).unwrap();
    servers[0].cmd(&["DEL", "res"]);
    servers[1].freeze();
    servers[2].freeze();
    match c.extend(&mut parts, Duration::from_secs(10)) {
        Err(Error::NoQuorum(report) | Error::Held(report)) => {
            assert_eq!(report.refused().count(), 1, "{report:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!parts.is_valid(), "{:?} left", parts.validity());
    servers[1].resume();
    servers[2].resume();
}

#[test]
fn unlock_after_expiry_says_so() {
    let servers = Cluster::start(1);
    let mut c = builder(&servers)
        .ttl(Duration::from_millis(50))
        .max_ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(25))
        .build_client()
        .unwrap();
    let lock = c.try_lock("res").unwrap();
    c.idle_until(lock.valid_until() + Duration::from_millis(60));
    match c.unlock(lock) {
        Err(Error::Expired { released }) => assert_eq!(released, 0),
        other => panic!("{other:?}"),
    }
    let lock = c.try_lock("res2").unwrap();
    let mut stale = lock.clone();
    c.idle_until(lock.valid_until());
    assert!(matches!(
        c.extend(&mut stale, Duration::from_secs(1)),
        Err(Error::Expired { .. })
    ));
}

#[test]
fn script_flush_between_calls_is_invisible() {
    let servers = Cluster::start(3);
    let mut c = client(&servers);
    // Load the scripts on every connection, then flush them behind the client's back.
    let lock = c.try_lock("a").unwrap();
    assert_eq!(c.unlock(lock).unwrap(), 3);
    let mut lock = c.try_lock("a").unwrap();
    for s in servers.iter() {
        s.cmd(&["SCRIPT", "FLUSH"]);
    }
    c.extend(&mut lock, Duration::from_secs(20)).unwrap();
    for s in servers.iter() {
        s.cmd(&["SCRIPT", "FLUSH"]);
    }
    assert_eq!(c.unlock(lock).unwrap(), 3);
    assert_eq!(holders(&servers, "a"), vec![None; 3]);
    // And again, now that EVALSHA is in use after the fallback.
    let lock = c.try_lock("a").unwrap();
    assert_eq!(c.unlock(lock).unwrap(), 3);
}

#[test]
fn a_server_restart_between_lock_and_unlock_is_transparent() {
    let mut servers = Cluster::start(3);
    let mut c = client(&servers);
    let lock = c.try_lock("a").unwrap();
    assert_eq!(c.unlock(lock).unwrap(), 3); // scripts now known on each connection
    let lock = c.try_lock("a").unwrap();
    servers[1].restart(); // forgets its keys and scripts; our connection breaks
    // The broken connection is noticed on use: nodes 0 and 2 still release.
    let released = c.unlock(lock).unwrap();
    assert!(released >= 2, "released {released}");
    // The next operations reconnect transparently and use node 1 again.
    let mut ok = false;
    for _ in 0..50 {
        let lock = c.lock("b").unwrap();
        if c.unlock(lock).unwrap() == 3 {
            ok = true;
            break;
        }
    }
    assert!(ok, "node 1 never came back");
    assert_eq!(servers[1].get("b"), None);
}

#[test]
fn even_number_of_nodes_needs_more_than_half() {
    let servers = Cluster::start(4);
    let mut c = client(&servers);
    assert_eq!(c.quorum(), 3);
    servers[0].set("res", "x");
    servers[1].set("res", "y");
    assert!(matches!(c.try_lock("res"), Err(Error::Held(_))));
    servers[1].cmd(&["DEL", "res"]);
    let lock = c.try_lock("res").unwrap();
    assert_eq!(c.unlock(lock).unwrap(), 3);
}

#[test]
fn configuration_errors_are_reported_before_anything_is_sent() {
    let servers = Cluster::start(1);
    let url = servers[0].url();
    let cases: Vec<(Builder, &str)> = vec![
        (Builder::new(Vec::<String>::new()), "no servers"),
        (Builder::new([url.clone(), url.clone()]), "duplicate server"),
        (Builder::new(["redis://h:notaport"]), "invalid address"),
        (Builder::new([url.clone()]).ttl(Duration::ZERO), "ttl"),
        (
            Builder::new([url.clone()]).ttl(Duration::from_millis(2)),
            "drift",
        ),
        (
            Builder::new([url.clone()]).ttl(Duration::from_secs(u64::MAX / 4)),
            "ttl",
        ),
        (
            Builder::new([url.clone()]).drift_factor(f64::NAN),
            "drift factor",
        ),
        (
            Builder::new([url.clone()]).drift_factor(1.5),
            "drift factor",
        ),
        (
            Builder::new([url.clone()]).backoff(Duration::ZERO, Duration::from_secs(1)),
            "backoff minimum is zero",
        ),
        (
            Builder::new([url.clone()]).clock_check(Duration::from_micros(500)),
            "clock check tolerance",
        ),
        // The clock check's margin (3 × 20 ms) counts with the drift allowance.
        (
            Builder::new([url.clone()])
                .ttl(Duration::from_millis(60))
                .clock_check(Duration::from_millis(20)),
            "drift",
        ),
    ];
    for (b, needle) in cases {
        match b.build() {
            Err(Error::Config(m)) => assert!(m.contains(needle), "{m} lacks {needle}"),
            other => panic!("{needle}: {other:?}"),
        }
    }
    let mut c = client(&servers);
    assert!(matches!(c.try_lock(""), Err(Error::Config(_))));
    assert!(matches!(
        c.try_lock(vec![b'x'; 1025]),
        Err(Error::Config(_))
    ));
    let mut lock = c.try_lock(vec![b'x'; 1024]).unwrap();
    assert!(matches!(
        c.extend(&mut lock, Duration::ZERO),
        Err(Error::Config(_))
    ));
    assert_eq!(c.unlock(lock).unwrap(), 1);
    assert_eq!(servers[0].dbsize(), 0);
}

#[test]
fn lock_retries_until_the_holder_releases() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers)
        .retry_count(1000)
        .retry_delay(Duration::from_millis(2), Duration::from_millis(2))
        .build()
        .unwrap();
    let first = redlock.try_lock("res").unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let r2 = redlock.clone();
    let flag = released.clone();
    let waiter = std::thread::spawn(move || {
        let lock = r2.lock("res").unwrap();
        assert!(flag.load(Ordering::SeqCst), "acquired before the release");
        r2.unlock(lock).unwrap()
    });
    std::thread::sleep(Duration::from_millis(30));
    released.store(true, Ordering::SeqCst);
    redlock.unlock(first).unwrap();
    assert_eq!(waiter.join().unwrap(), 3);
}

#[test]
fn lock_until_gives_up_at_the_deadline() {
    let servers = Cluster::start(1);
    let redlock = builder(&servers).build().unwrap();
    let held = redlock.try_lock("res").unwrap();
    let t0 = Instant::now();
    let r = redlock.lock_until("res", t0 + Duration::from_millis(100));
    assert!(matches!(r, Err(Error::Held(_))), "{r:?}");
    assert!(t0.elapsed() >= Duration::from_millis(80));
    redlock.unlock(held).unwrap();
}

#[test]
fn guard_releases_on_drop() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers).build().unwrap();
    {
        let guard = redlock.guard("res").unwrap();
        assert_eq!(
            servers[0].get("res").as_deref(),
            Some(&*guard.token().to_string())
        );
    }
    // Dropping queued the release without waiting; a shutdown waits for its confirmation.
    assert_eq!(redlock.shutdown(Duration::from_secs(10)).unconfirmed, 0);
    assert_eq!(holders(&servers, "res"), vec![None; 3]);
    let guard = redlock.guard("res").unwrap();
    assert_eq!(guard.unlock().unwrap(), 3);
}

#[test]
fn eight_threads_contend_with_mutual_exclusion() {
    let servers = Cluster::start(5);
    let redlock = builder(&servers)
        .retry_count(10_000)
        .retry_delay(Duration::from_millis(1), Duration::from_millis(3))
        .build()
        .unwrap();
    let inside = Arc::new(AtomicU64::new(0));
    let counter = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (redlock, inside, counter) = (redlock.clone(), inside.clone(), counter.clone());
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let lock = redlock.lock("shared").unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    // A non-atomic read-modify-write, safe only under the lock.
                    let v = counter.load(Ordering::SeqCst);
                    std::thread::yield_now();
                    counter.store(v + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(lock.is_valid());
                    redlock.unlock(lock).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 200);
}

#[test]
fn one_client_holds_many_locks() {
    let servers = Cluster::start(3);
    let mut c = client(&servers);
    let locks: Vec<_> = (0..50)
        .map(|i| c.try_lock(format!("r{i}")).unwrap())
        .collect();
    assert_eq!(servers[0].dbsize(), 50);
    for lock in locks {
        assert_eq!(c.unlock(lock).unwrap(), 3);
    }
    assert_eq!(servers[2].dbsize(), 0);
}

/// A TTL per call: `lock_with` sets its own on every node (the handle's stays the default for
/// other calls); one past the longest TTL is refused before anything is sent; a zero wait is
/// one attempt; `try_lock_for` gives up when its wait runs out and is granted a release that
/// comes within it.
#[test]
fn lock_with_sets_its_own_ttl_and_try_lock_for_waits_as_long_as_told() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers)
        .ttl(Duration::from_secs(30))
        .max_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let short = LockOptions::new().ttl(Duration::from_secs(2));
    let lock = redlock.lock_with("short", short).unwrap();
    assert!(
        lock.validity() <= Duration::from_secs(2),
        "{:?}",
        lock.validity()
    );
    for s in servers.iter() {
        let pttl = s.pttl("short");
        assert!((1..=2_000).contains(&pttl), "PTTL {pttl}");
    }
    let long = redlock.try_lock("long").unwrap();
    for s in servers.iter() {
        assert!(s.pttl("long") > 2_000, "the handle's TTL changed");
    }
    redlock.unlock(long).unwrap();
    // Longer than max_ttl: refused, nothing sent.
    let r = redlock.lock_with("x", LockOptions::new().ttl(Duration::from_secs(61)));
    assert!(
        matches!(r, Err(Error::Config(ref m)) if m.contains("lock ttl 1 min 1 s is longer")),
        "{r:?}"
    );
    assert!(holders(&servers, "x").iter().all(Option::is_none));
    // A zero wait: one attempt.
    let r = redlock.lock_with("short", LockOptions::new().wait(Duration::ZERO));
    assert!(matches!(r, Err(Error::Held(_))), "{r:?}");
    // A wait that runs out while the lock is held.
    let r = redlock.try_lock_for("short", Duration::from_millis(100));
    assert!(matches!(r, Err(Error::Held(_))), "{r:?}");
    // A wait that a release ends.
    let released = Arc::new(AtomicBool::new(false));
    let (r2, flag) = (redlock.clone(), released.clone());
    let waiter = std::thread::spawn(move || {
        let lock = r2.try_lock_for("short", Duration::from_secs(20)).unwrap();
        assert!(flag.load(Ordering::SeqCst), "granted before the release");
        r2.unlock(lock).unwrap()
    });
    released.store(true, Ordering::SeqCst);
    redlock.unlock(lock).unwrap();
    assert_eq!(waiter.join().unwrap(), 3);
}
