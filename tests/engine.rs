//! The shared engine: coalescing (many operations, one write per node), one connection per node
//! for all threads of a handle, and releases a node could not confirm (the ledger of keys of
//! unknown fate) sent again when it is back.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Redlock};

/// Polls `cond` every few ms until it holds; panics with `what` after `within`.
fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sixty_four_acquires_queued_together_go_out_in_one_write_per_node() {
    let servers = Cluster::start(5);
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .build_client()
        .unwrap();
    assert_eq!(c.connect(Duration::from_secs(2)), 5);
    let resources: Vec<String> = (0..64).map(|i| format!("coalesce:{i}")).collect();
    let before = c.stats().io;
    let locks = c.try_lock_many(&resources);
    let after = c.stats().io;
    assert_eq!(
        after.writes - before.writes,
        5,
        "64 acquires over 5 nodes: one write per node, not one per acquire"
    );
    assert_eq!(locks.iter().filter(|l| l.is_ok()).count(), 64, "{locks:?}");
    for (server, _) in servers.iter().zip(0..) {
        assert_eq!(server.dbsize(), 64, "{} holds every key", server.addr());
    }
    for lock in locks {
        assert_eq!(c.unlock(lock.unwrap()).unwrap(), 5);
    }
}

#[test]
fn threads_sharing_a_handle_share_one_connection_per_node() {
    let servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .client_name("engine-test")
        .build()
        .unwrap();
    let k = 32;
    let go = Arc::new(Barrier::new(k));
    let threads: Vec<_> = (0..k)
        .map(|t| {
            let (redlock, go) = (redlock.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                for _ in 0..50 {
                    let lock = redlock.try_lock(format!("shared:{t}")).unwrap();
                    assert!(lock.validity() > Duration::from_secs(29));
                    // The count is of nodes that answered in time: under load a busy node
                    // may miss the grace (its release is still sent and confirmed later).
                    redlock.unlock(lock).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("caller thread");
    }
    let report = redlock.shutdown(Duration::from_secs(5));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    for server in servers.iter() {
        let ours = connections_named(server, "engine-test");
        assert_eq!(ours, 1, "{} sees {ours} connections", server.addr());
        assert_eq!(server.dbsize(), 0, "every lock was released");
    }
}

/// The server's view of a handle's connections: how many carry `name`.
fn connections_named(server: &redis_local::Server, name: &str) -> usize {
    let list = match server.cmd(&["CLIENT", "LIST"]) {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("CLIENT LIST answered {other:?}"),
    };
    list.lines()
        .filter(|l| l.contains(&format!("name={name} ")))
        .count()
}

/// Kept locks are timers of the engine: their extends go over the same connection as every
/// caller's operations (before, a keeper thread had connections of its own: two per node).
#[test]
fn kept_locks_are_renewed_on_the_connections_the_callers_use() {
    let servers = Cluster::start(3);
    let ttl = Duration::from_millis(600);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .ttl(ttl)
        .node_timeout(ttl / 6)
        .client_name("keep-engine-test")
        .build()
        .unwrap();
    let kept: Vec<_> = (0..4)
        .map(|i| {
            redlock
                .keep(redlock.lock(format!("kept:{i}")).unwrap())
                .unwrap()
        })
        .collect();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let redlock = redlock.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + ttl * 3;
                while Instant::now() < until {
                    let lock = redlock.try_lock(format!("busy:{t}")).unwrap();
                    redlock.unlock(lock).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("caller thread");
    }
    for k in &kept {
        assert!(k.is_held(), "lost: {:?}", k.lost());
        assert!(k.lock().extensions() >= 2, "{:?}", k.lock());
    }
    for server in servers.iter() {
        assert_eq!(
            connections_named(server, "keep-engine-test"),
            1,
            "{}: one connection for callers and renewals",
            server.addr()
        );
    }
    for k in kept {
        assert_eq!(k.release().unwrap(), 3);
    }
    let report = redlock.shutdown(Duration::from_secs(5));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    for server in servers.iter() {
        assert_eq!(server.dbsize(), 0, "every lock was released");
    }
}

#[test]
fn a_release_a_frozen_node_never_got_is_sent_when_it_is_back() {
    let mut servers = Cluster::start(3);
    let redlock: Redlock = Builder::new(servers.urls())
        .quarantine(None)
        .reply_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    assert_eq!(redlock.connect(Duration::from_secs(2)).unwrap(), 3);
    servers[2].freeze();
    // Won on the two others; the SET to the frozen node sits unread in its socket.
    let lock = redlock.try_lock("ledger:x").unwrap();
    // The frozen node's connection is given up (reply timeout, noticed by the engine thread).
    wait_for(
        "the frozen node's connection given up",
        Duration::from_secs(5),
        || {
            redlock
                .with_client(|c| redlock_mux::testing::pending(c)[2] == 0)
                .unwrap()
        },
    );
    // Its release cannot go out: a fresh connection's handshake is never answered.
    assert_eq!(redlock.unlock(lock).unwrap(), 2);
    wait_for(
        "the release to the frozen node in the ledger",
        Duration::from_secs(5),
        || {
            redlock
                .with_client(|c| redlock_mux::testing::unconfirmed(c) == (0, 1))
                .unwrap()
        },
    );
    let report = redlock.shutdown(Duration::from_millis(100));
    assert_eq!(report.unconfirmed, 1, "{report:?}");
    // Resumed, the node runs the SET it had read nothing of: the key now exists there, for the
    // whole TTL unless somebody releases it.
    servers[2].resume();
    let report = redlock.shutdown(Duration::from_secs(5));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    assert!(report.confirmed >= 1, "{report:?}");
    assert_eq!(
        servers[2].get("ledger:x"),
        None,
        "the late key was released"
    );
    for server in servers.iter() {
        assert_eq!(server.dbsize(), 0, "{}", server.addr());
    }
}

#[test]
fn a_release_not_waited_for_is_not_overtaken_by_a_later_acquire() {
    let servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .build()
        .unwrap();
    assert_eq!(redlock.connect(Duration::from_secs(2)).unwrap(), 3);
    for round in 0..20 {
        let lock = redlock.try_lock("nowait:x").unwrap();
        // Another thread holds the engine, so the release goes through the mailbox; as soon
        // as it is queued, that thread lets go of the engine and acquires the same resource
        // itself, on the fast path.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let other = {
            let redlock = redlock.clone();
            std::thread::spawn(move || {
                redlock
                    .with_client(|_| {
                        held_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                    })
                    .unwrap();
                redlock.try_lock("nowait:x")
            })
        };
        held_rx.recv().unwrap();
        redlock.unlock_nowait(lock);
        go_tx.send(()).unwrap();
        let again = other.join().unwrap();
        assert!(again.is_ok(), "round {round}: {again:?}");
        redlock.unlock(again.unwrap()).unwrap();
    }
}

/// Many acquires lost at once (every node is fresh, so quarantined: each OK counts as no) are
/// each released with their own token: no key is left to live out its TTL. The releases of
/// acquires lost in the same turn once overwrote each other's slots: one token was released
/// twice, another never, and its keys blocked the resource for a whole TTL.
#[test]
fn acquires_lost_together_leave_no_key_behind() {
    let servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let start = Arc::new(Barrier::new(32));
    let threads: Vec<_> = (0..32)
        .map(|t| {
            let (redlock, start) = (redlock.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..20 {
                    let r = redlock.try_lock(format!("lost:{}", (t + i) % 8));
                    // Refused by the quarantine, or held by another lost attempt's keys for now.
                    assert!(
                        matches!(
                            r,
                            Err(redlock_mux::Error::NoQuorum(_) | redlock_mux::Error::Held(_))
                        ),
                        "fresh servers are quarantined: {r:?}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = redlock.shutdown(Duration::from_secs(10));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    for server in servers.iter() {
        assert_eq!(server.dbsize(), 0, "keys left behind on {}", server.addr());
    }
}

/// A thread waiting for the loop itself (`with_client`) while a blocking caller drives it
/// toward a deadline: the driver sleeps as usual. It spun in zero-timeout polls until its
/// operation ended (a core burnt for the status's whole timeout).
#[test]
fn a_thread_waiting_for_the_loop_does_not_make_its_driver_spin() {
    let mut servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .build()
        .unwrap();
    assert_eq!(redlock.connect(Duration::from_secs(10)).unwrap(), 3);
    servers[2].freeze();
    let polls = |r: &Redlock| r.stats().io.polls;
    let before = polls(&redlock);
    let status = {
        let redlock = redlock.clone();
        std::thread::spawn(move || redlock.status(b"r", Duration::from_secs(1)))
    };
    std::thread::sleep(Duration::from_millis(100));
    redlock.with_client(|_| ()).unwrap();
    status.join().unwrap();
    let made = polls(&redlock) - before;
    servers[2].resume();
    assert!(
        made < 1_000,
        "{made} polls for one status and one with_client"
    );
}
