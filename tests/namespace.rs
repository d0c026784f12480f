//! Lock names and this crate's own keys (issue 35, item 1), against real servers: a name in the
//! reserved namespace (`redlock:`) is refused by every entry point before anything is sent,
//! and a key another client wrote under one of our internal names (a Redlock client that knows
//! nothing of our namespace may lock `redlock:waiting:x`) survives our releases, our waiting
//! marks and our fence counter, value and TTL intact.
//!
//! Before the fix, `try_lock("redlock:waiting:foo")` succeeded, a release of `foo` deleted
//! that key (`DEL foo redlock:waiting:foo`), and a waiter for `foo` overwrote it with its mark
//! (`SET redlock:waiting:foo 1 PX …`): two holders of `redlock:waiting:foo` within a second.

use std::time::{Duration, Instant};

use redis_local::{Cluster, Server};
use redlock_mux::{Builder, Error, Lock, RESERVED_PREFIX, Redlock};

/// Bound on waiting for something the engine does by itself.
const SOON: Duration = Duration::from_secs(10);
/// The TTL of the foreign locks: any key found with much less was touched by us.
const FOREIGN_TTL_MS: i64 = 60_000;

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
}

/// What node-redlock, redsync and the others do: `SET name token NX PX ttl` on every node.
fn foreign_lock(servers: &Cluster, name: &str, token: &str) {
    for s in servers.iter() {
        let ttl = FOREIGN_TTL_MS.to_string();
        let ok = s.cmd(&["SET", name, token, "NX", "PX", &ttl]);
        assert_eq!(ok, redis::Value::Okay, "{}", s.addr());
    }
}

/// The foreign lock is still there on every node, with its token and (nearly) all its TTL.
fn assert_foreign_intact(servers: &Cluster, name: &str, token: &str) {
    for s in servers.iter() {
        assert_eq!(
            s.get(name).as_deref(),
            Some(token),
            "{name} changed on {}",
            s.addr()
        );
        let pttl = s.pttl(name);
        assert!(
            pttl > FOREIGN_TTL_MS - 20_000,
            "{name}'s TTL was cut to {pttl} ms on {}",
            s.addr()
        );
    }
}

fn assert_reserved(result: Result<impl std::fmt::Debug, Error>, name: &str) {
    match result {
        Err(e @ Error::ReservedName { .. }) => {
            let message = e.to_string();
            assert!(message.contains(RESERVED_PREFIX), "{message}");
            assert!(message.contains(name), "{message}");
            let Error::ReservedName { prefix, .. } = e else {
                unreachable!()
            };
            assert_eq!(prefix, "redlock:");
        }
        other => panic!("{name}: expected ReservedName, got {other:?}"),
    }
}

fn dbsize_total(servers: &Cluster) -> i64 {
    servers.iter().map(Server::dbsize).sum()
}

#[test]
fn reserved_names_are_refused_by_every_entry_point_before_anything_is_sent() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers).build().unwrap();
    let soon = Instant::now() + Duration::from_secs(1);
    for name in [
        "redlock:waiting:foo",
        "redlock:fence",
        "redlock:released:foo",
        "redlock:anything",
        "redlock:",
    ] {
        assert_reserved(redlock.try_lock(name), name);
        assert_reserved(redlock.lock(name), name);
        assert_reserved(redlock.lock_until(name, soon), name);
        assert_reserved(redlock.guard(name).map(|_| ()), name);
        assert_reserved(
            Lock::from_parts(name, "token", Duration::from_secs(1)),
            name,
        );
        let mut client = builder(&servers).build_client().unwrap();
        assert_reserved(client.try_lock(name), name);
        let aredlock = builder(&servers).build_async().unwrap();
        futures::executor::block_on(async {
            assert_reserved(aredlock.try_lock(name).await, name);
            assert_reserved(aredlock.lock(name).await, name);
            assert_reserved(aredlock.lock_until(name, soon).await, name);
            assert_reserved(aredlock.guard(name).await.map(|_| ()), name);
            let work = aredlock.with_lock(name, async |_| ()).await;
            assert_reserved(work.map_err(Error::from), name);
        });
    }
    // Names that only look alike are lock names as any other.
    for name in [
        "redlock",
        "Redlock:x",
        "x:redlock:waiting:foo",
        "redlockwaiting:foo",
    ] {
        let lock = redlock.try_lock(name).unwrap();
        redlock.unlock(lock).unwrap();
    }
    assert_eq!(dbsize_total(&servers), 0);
}

/// The first reproduction: A held `redlock:waiting:foo`, B locked and unlocked `foo` (its
/// release deleted A's key), then B's `try_lock("redlock:waiting:foo")` succeeded while A's
/// lock still had 29 s of validity. Now A cannot take that name at all.
#[test]
fn a_lock_named_like_a_waiting_key_cannot_be_taken_so_no_release_can_take_it_away() {
    let servers = Cluster::start(3);
    let a = builder(&servers)
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let b = builder(&servers).build().unwrap();
    assert_reserved(a.try_lock("redlock:waiting:foo"), "redlock:waiting:foo");
    let lock = b.lock("foo").unwrap();
    b.unlock(lock).unwrap();
    assert_reserved(b.try_lock("redlock:waiting:foo"), "redlock:waiting:foo");
    assert_eq!(dbsize_total(&servers), 0);
}

/// The same name locked by a client that knows nothing of our namespace survives every release
/// of `foo` (with and without the notice), value and TTL intact.
#[test]
fn a_foreign_lock_on_a_waiting_key_survives_releases_of_its_resource() {
    let servers = Cluster::start(3);
    foreign_lock(&servers, "redlock:waiting:foo", "node-redlock-token");
    for notices in [true, false] {
        let redlock = builder(&servers).release_notices(notices).build().unwrap();
        for _ in 0..3 {
            let lock = redlock.lock("foo").unwrap();
            assert_eq!(redlock.unlock(lock).unwrap(), 3);
        }
        let guard = redlock.guard("foo").unwrap();
        drop(guard);
        redlock.shutdown(SOON);
    }
    assert_foreign_intact(&servers, "redlock:waiting:foo", "node-redlock-token");
    for s in servers.iter() {
        assert_eq!(s.get("foo"), None, "{}", s.addr());
    }
}

/// Waits (bounded) until every server holds `resource`'s waiting mark, and returns.
fn until_marked(servers: &Cluster, resource: &str) {
    let key = format!("redlock:waiting:{resource}");
    for s in servers.iter() {
        let deadline = Instant::now() + SOON;
        while s.get(&key).as_deref() != Some(redlock_mux::keys::MARK_VALUE) {
            assert!(
                Instant::now() < deadline,
                "{key} never marked on {}",
                s.addr()
            );
            std::thread::yield_now();
        }
    }
}

/// The second reproduction: while C waited for `foo`, its marks overwrote the foreign lock
/// `redlock:waiting:foo` with `1` and a TTL of about a second on every node. Now a mark goes
/// only where no key or a mark is. `bar`, waited for in the same way at the same time by the
/// same handle, shows that the waiter does mark.
#[test]
fn a_foreign_lock_on_a_waiting_key_survives_the_marks_of_waiters() {
    let servers = Cluster::start(3);
    foreign_lock(&servers, "redlock:waiting:foo", "redsync-token");
    let holder = builder(&servers).build().unwrap();
    let waiter: Redlock = builder(&servers)
        .retry_delay(Duration::from_millis(100), Duration::ZERO)
        .build()
        .unwrap();
    let held = [holder.lock("foo").unwrap(), holder.lock("bar").unwrap()];
    let waits: Vec<_> = ["foo", "bar"]
        .into_iter()
        .map(|name| {
            let waiter = waiter.clone();
            std::thread::spawn(move || {
                waiter.lock_until(name, Instant::now() + Duration::from_millis(1500))
            })
        })
        .collect();
    until_marked(&servers, "bar");
    for w in waits {
        // Held throughout: both give up at their deadline, after several marked attempts.
        assert!(matches!(w.join().unwrap(), Err(Error::Held(_))));
    }
    assert_foreign_intact(&servers, "redlock:waiting:foo", "redsync-token");
    for lock in held {
        holder.unlock(lock).unwrap();
    }
    // The releases found a mark for `bar` and took it; for `foo` they left the foreign key.
    for s in servers.iter() {
        assert_eq!(s.get("redlock:waiting:bar"), None, "{}", s.addr());
    }
    assert_foreign_intact(&servers, "redlock:waiting:foo", "redsync-token");
}

/// A foreign string lock named like the fence counter: fenced acquires cannot use the node
/// (`WRONGTYPE` on the counter's hash commands), and never change the key.
#[test]
fn a_foreign_lock_named_like_the_fence_counter_is_never_changed() {
    let servers = Cluster::start(3);
    foreign_lock(&servers, "redlock:fence", "pottery-token");
    let redlock = builder(&servers).fencing(true).build().unwrap();
    for _ in 0..3 {
        match redlock.try_lock("fenced") {
            Ok(lock) => {
                redlock.unlock(lock).unwrap();
            }
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains("WRONGTYPE"), "{message}");
            }
        }
    }
    redlock.shutdown(SOON);
    assert_foreign_intact(&servers, "redlock:fence", "pottery-token");
    for s in servers.iter() {
        assert_eq!(s.get("fenced"), None, "{}", s.addr());
    }
}

/// The ACL rule docs/production.md gives (the README's "Running in production" until it moved
/// there), read from that file itself, and
/// the rule the previous version's README gave (no `+pttl`): enough for every script this
/// crate runs, the new reads included (`GET` of the waiting key in the mark and the release;
/// the extend's `PEXPIRE … GT`, which needs nothing beyond `+pexpire`), fencing and the
/// quarantine on, a waiter marking and woken by a notice, and an extend that never shortens.
#[test]
fn the_readme_acl_rule_and_the_previous_one_grant_everything_the_scripts_run() {
    let readme = include_str!("../docs/production.md");
    let rule = readme
        .lines()
        .find_map(|l| l.strip_prefix("ACL SETUSER "))
        .expect("docs/production.md gives an ACL rule")
        .replace(">PASSWORD", ">pw");
    assert!(rule.contains(" +pttl"), "{rule}");
    let previous = rule.replace(" +pttl", "");
    for rule in [rule, previous] {
        acl_rule_runs_everything(&rule);
    }
}

fn acl_rule_runs_everything(rule: &str) {
    let servers = Cluster::start_with(3, Server::builder().acl_user(rule));
    let urls: Vec<String> = servers
        .ports()
        .into_iter()
        .map(|p| format!("redis://locker:pw@127.0.0.1:{p}"))
        .collect();
    let build = || {
        Builder::new(urls.clone())
            .ttl(Duration::from_secs(2))
            .max_ttl(Duration::from_secs(4))
            .fencing(true)
            .node_timeout(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    // The quarantine (its window: the longest TTL) needs `INFO`: the servers must surely be up
    // that long (their uptime, rounded up by up to a second, is read a second short).
    for s in servers.iter() {
        s.wait_uptime(5);
    }
    let (holder, waiter) = (build(), build());
    let mut lock = holder.lock("acl").unwrap();
    assert!(lock.fence().is_some());
    holder.extend(&mut lock, Duration::from_secs(4)).unwrap();
    // A shorter extend leaves the keys as long as they were.
    holder.extend(&mut lock, Duration::from_secs(1)).unwrap();
    for s in servers.iter() {
        assert!(s.pttl("acl") > 2_500, "{rule}: {}", s.pttl("acl"));
    }
    let t = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.lock_until("acl", Instant::now() + SOON))
    };
    until_marked(&servers, "acl");
    assert_eq!(holder.unlock(lock).unwrap(), 3);
    let got = t.join().unwrap().unwrap();
    assert!(got.fence().is_some());
    waiter.unlock(got).unwrap();
    assert_eq!(
        waiter.stats().nodes.iter().map(|n| n.errors).sum::<u64>(),
        0,
        "{rule}"
    );
}

/// The previous version of this crate marked with the value `1`; during a rolling upgrade its
/// waiters still do. Such a mark is refreshed and taken like ours, and the release publishes.
#[test]
fn a_mark_of_the_previous_version_is_taken_and_announced() {
    let servers = Cluster::start(3);
    for s in servers.iter() {
        s.cmd(&["SET", "redlock:waiting:legacy", "1", "PX", "60000"]);
        s.cmd(&["CONFIG", "RESETSTAT"]);
    }
    let redlock = builder(&servers).build().unwrap();
    let lock = redlock.lock("legacy").unwrap();
    assert_eq!(redlock.unlock(lock).unwrap(), 3);
    for s in servers.iter() {
        assert_eq!(s.get("redlock:waiting:legacy"), None, "{}", s.addr());
        let published = s
            .info("commandstats")
            .lines()
            .any(|l| l.starts_with("cmdstat_publish:calls=1,"));
        assert!(published, "no notice from {}", s.addr());
    }
}
