//! Lock names and this crate's own keys, against real servers: a name in the
//! reserved namespace (`redlock:`) is refused by every entry point before anything is sent,
//! and a key another client wrote under one of our internal names (a Redlock client that knows
//! nothing of our namespace may lock `redlock:waiting:x`) survives our releases, our waiting
//! marks and our fence counter, value and TTL intact.
//!
//! Before the fix, `try_lock("redlock:waiting:foo")` succeeded, a release of `foo` deleted
//! that key (`DEL foo redlock:waiting:foo`), and a waiter for `foo` overwrote it with its mark
//! (`SET redlock:waiting:foo 1 PX …`): two holders of `redlock:waiting:foo` within a second.

use std::time::{Duration, Instant};

use redis_local::{Cluster, Server, Version};
use redlock_mux::{
    Builder, Error, FenceFloor, Lock, RESERVED_PREFIX, Redlock, ResourceSet, Shared,
};

/// The first version with `PEXPIRE … GT`.
const PEXPIRE_GT_SINCE: Version = Version::new(7, 0, 0);
/// Bound on waiting for something the engine does by itself.
const SOON: Duration = Duration::from_secs(10);
/// The TTL of the foreign locks: any key found with much less was touched by us.
const FOREIGN_TTL_MS: i64 = 60_000;

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
}

/// A release the rule lets through: confirmed by a quorum of the 3 nodes at least (the third may
/// answer after the release's node timeout on a loaded machine: it still releases, and a
/// refusal by the rule would be an error here and in the stats `no_errors` reads).
fn released_on_a_quorum(released: Result<usize, redlock_mux::Error>) {
    let released = released.unwrap();
    assert!(released >= 2, "released on {released} of 3 nodes");
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

/// The ACL rule docs/production.md gives, read from that file itself.
fn documented_acl_rule() -> String {
    include_str!("../docs/production.md")
        .lines()
        .find_map(|l| l.strip_prefix("ACL SETUSER "))
        .expect("docs/production.md gives an ACL rule")
        .replace(">PASSWORD", ">pw")
}

/// The commands a Lua body calls (`redis.call("x"`, `redis.pcall("x"`, `pcall(redis.call, "x"`),
/// as an ACL rule names them (`pubsub|numsub`).
fn commands_called(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    for head in ["redis.call(\"", "redis.pcall(\"", "pcall(redis.call, \""] {
        for (at, _) in body.match_indices(head) {
            let rest = &body[at + head.len()..];
            let name = &rest[..rest.find('"').unwrap()];
            let name = match name {
                "pubsub" => "pubsub|numsub".to_string(),
                other => other.to_lowercase(),
            };
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// Every command any script of any kind calls is granted by the documented rule: the rule and
/// the scripts cannot drift apart without this failing (a read lock's and a set's scripts
/// once needed seven commands the rule did not give, and failed with "no quorum").
#[test]
fn the_documented_acl_rule_grants_every_command_every_script_calls() {
    let rule = documented_acl_rule();
    let granted: Vec<&str> = rule
        .split(' ')
        .filter_map(|w| w.strip_prefix('+'))
        .collect();
    let mut seen = 0;
    for body in redlock_mux::testing::script_bodies() {
        for command in commands_called(body) {
            assert!(
                granted.contains(&command.as_str()),
                "the documented rule does not grant +{command}, which this script calls: {body}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 40, "only {seen} calls found: the scan misses them");
}

/// The documented rule: every script of every kind runs under it — plain, fenced, shared,
/// all-or-none sets (fenced too), semaphores, fair locks, sets and readers (joining, leaving); acquire, extend, release with and without
/// notices, waiters' marks of writers, readers and sets woken by a notice, status reads of
/// each kind, the fence repair — fencing and the quarantine on, and no node answers an error.
#[test]
fn the_documented_acl_rule_runs_every_script_of_every_kind() {
    acl_rule_runs(&documented_acl_rule(), Coverage::EveryKind);
}

/// A rule without `+pttl` (as an earlier one was): plain and fenced locks, their waiters and
/// the extend, which then never shortens a key all the same from Redis 7.0 on (`PEXPIRE …
/// GT`), and does before (a plain `PEXPIRE`, as documented).
#[test]
fn a_rule_without_pttl_runs_plain_locks() {
    let rule = documented_acl_rule();
    assert!(rule.contains(" +pttl"), "{rule}");
    acl_rule_runs(&rule.replace(" +pttl", ""), Coverage::Plain);
}

/// What [`acl_rule_runs`] tries.
#[derive(PartialEq)]
enum Coverage {
    /// Plain and fenced locks, extends, a waiting writer.
    Plain,
    /// Every kind and every script.
    EveryKind,
}

fn acl_rule_runs(rule: &str, coverage: Coverage) {
    let servers = Cluster::start_with(3, Server::builder().acl_user(rule));
    let urls: Vec<String> = servers
        .ports()
        .into_iter()
        .map(|p| format!("redis://locker:pw@127.0.0.1:{p}"))
        .collect();
    let build = |notices: bool| {
        Builder::new(urls.clone())
            .ttl(Duration::from_secs(2))
            .max_ttl(Duration::from_secs(4))
            .fencing(true)
            .release_notices(notices)
            .node_timeout(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    // The quarantine (its window: the longest TTL) needs `INFO`: the servers must surely be up
    // that long (their uptime, rounded up by up to a second, is read a second short).
    for s in servers.iter() {
        s.wait_uptime(5);
    }
    let (holder, waiter, quiet) = (build(true), build(true), build(false));
    // Every handshake done (AUTH, INFO), so that no request of the lock's waits behind one
    // when the keys' TTLs are read below on every node.
    assert_eq!(
        holder.connect(Duration::from_secs(5)).unwrap(),
        servers.len()
    );
    let mut lock = holder.lock("acl").unwrap();
    assert!(lock.fence().is_some());
    holder.extend(&mut lock, Duration::from_secs(4)).unwrap();
    // A shorter extend leaves the keys as long as they were: by `PEXPIRE … GT` from Redis 7.0
    // on, by `PTTL` first before. Without either (Redis 6, no `+pttl`) the script runs a plain
    // `PEXPIRE`, which shortens them (docs/library.md), and the lock claims no more than that.
    let short = Duration::from_secs(1);
    holder.extend(&mut lock, short).unwrap();
    let never_shortens =
        servers[0].version_number() >= Some(PEXPIRE_GT_SINCE) || rule.contains(" +pttl");
    for s in servers.iter() {
        if never_shortens {
            assert!(s.pttl("acl") > 2_500, "{rule}: {}", s.pttl("acl"));
        } else {
            assert!(s.pttl("acl") <= 1_000, "{rule}: {}", s.pttl("acl"));
        }
    }
    assert!(lock.validity() <= short, "{:?}", lock.validity());
    // A writer, a reader and a set that has it as a member wait for it, marked, and are woken
    // by the notice of its release, in turn.
    let shared = Shared::new("acl").unwrap();
    let set = ResourceSet::new(["acl", "acl-2"]).unwrap();
    let waiters = match coverage {
        Coverage::Plain => vec![b"acl".to_vec()],
        Coverage::EveryKind => vec![
            b"acl".to_vec(),
            shared.as_ref().to_vec(),
            set.as_ref().to_vec(),
        ],
    };
    for waits in waiters {
        let t = {
            let waiter = waiter.clone();
            std::thread::spawn(move || waiter.lock_until(&waits, Instant::now() + SOON))
        };
        until_marked_by(&servers, "acl");
        released_on_a_quorum(holder.unlock(lock));
        let mut got = t.join().unwrap().unwrap();
        waiter.extend(&mut got, Duration::from_secs(3)).unwrap();
        if coverage == Coverage::EveryKind {
            let status = waiter.status(got.resource(), SOON);
            assert!(status.iter().all(|n| n.state.is_ok()), "{rule}: {status:?}");
        }
        waiter.unlock(got).unwrap();
        lock = holder.lock("acl").unwrap();
    }
    holder.unlock(lock).unwrap();
    if coverage == Coverage::Plain {
        return no_errors(rule, [&holder, &waiter]);
    }
    // Readers hold it while a writer waits (a writer's mark: the readers' releases keep it and
    // tell); the last reader's release wakes the writer.
    let readers = [
        holder.lock_shared("acl").unwrap(),
        quiet.lock_shared("acl").unwrap(),
    ];
    let t = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.lock_until("acl", Instant::now() + SOON))
    };
    until_marked(&servers, "acl");
    for reader in readers {
        holder.unlock(reader).unwrap();
    }
    let writer = t.join().unwrap().unwrap();
    waiter.unlock(writer).unwrap();
    // A fenced set, released without notices; a semaphore's permit.
    let mut both = quiet.lock(&set).unwrap();
    assert!(both.fence().is_some());
    quiet.extend(&mut both, Duration::from_secs(3)).unwrap();
    released_on_a_quorum(quiet.unlock(both));
    let permits = quiet.semaphore("acl-deploys", 2).unwrap();
    let permit = permits.acquire().unwrap();
    quiet.unlock(permit).unwrap();
    holder
        .repair_fences(FenceFloor::SeededQuorum, SOON)
        .unwrap();
    // A fair lock (not fenced): a waiter that gives up leaves the queue; the next joins it,
    // marked, and is granted at the release.
    let fair = Builder::new(urls.clone())
        .ttl(Duration::from_secs(2))
        .max_ttl(Duration::from_secs(4))
        .fair(true)
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    queued_then_granted(rule, &servers, (&holder, &fair), "acl-fair", "acl-fair");
    // A fair set: it joins both members' queues and leaves them, marks them, and is granted.
    let both = ResourceSet::new(["acl-fair", "acl-fair-b"]).unwrap();
    queued_then_granted(rule, &servers, (&holder, &fair), "acl-fair-b", both);
    // A fair reader: it joins the queue, is granted at the release, and leaves it.
    let reader = Shared::new("acl-fair").unwrap();
    queued_then_granted(rule, &servers, (&holder, &fair), "acl-fair", reader);
    no_errors(rule, [&holder, &waiter, &quiet, &fair]);
}

/// While `holder` holds `held`, a wait of `fair` for `resource` (a name, a set or a reader)
/// that gives up is refused; the next one, once it marked `held`,
/// is granted at the release, and unlocks.
fn queued_then_granted(
    rule: &str,
    servers: &Cluster,
    (holder, fair): (&Redlock, &Redlock),
    held: &str,
    resource: impl AsRef<[u8]> + Send + 'static,
) {
    let lock = holder.lock(held).unwrap();
    let refused = fair.lock_until(&resource, Instant::now() + Duration::from_millis(300));
    assert!(
        matches!(refused, Err(Error::Held(_))),
        "{rule}: {refused:?}"
    );
    let t = {
        let fair = fair.clone();
        std::thread::spawn(move || fair.lock_until(&resource, Instant::now() + SOON))
    };
    until_marked_by(servers, held);
    released_on_a_quorum(holder.unlock(lock));
    let got = t.join().unwrap().unwrap();
    fair.unlock(got).unwrap();
}

/// No node answered an error to any of `handles`.
fn no_errors<'a>(rule: &str, handles: impl IntoIterator<Item = &'a Redlock>) {
    for handle in handles {
        assert_eq!(
            handle.stats().nodes.iter().map(|n| n.errors).sum::<u64>(),
            0,
            "{rule}"
        );
    }
}

/// Waits (bounded) until every server holds a mark of any waiter for `resource`.
fn until_marked_by(servers: &Cluster, resource: &str) {
    let key = format!("redlock:waiting:{resource}");
    for s in servers.iter() {
        let deadline = Instant::now() + SOON;
        while s.get(&key).is_none() {
            assert!(
                Instant::now() < deadline,
                "{key} never marked on {}",
                s.addr()
            );
            std::thread::yield_now();
        }
    }
}

/// A rule that lacks a command a script calls: the refusal says which command the server
/// refused (its `NOPERM` text, node by node), not only that no quorum was reached.
#[test]
fn a_refused_command_is_named_in_the_refusal() {
    let rule = documented_acl_rule().replace(" +zadd", "");
    let servers = Cluster::start_with(3, Server::builder().acl_user(&rule));
    let urls: Vec<String> = servers
        .ports()
        .into_iter()
        .map(|p| format!("redis://locker:pw@127.0.0.1:{p}"))
        .collect();
    let redlock = Builder::new(urls)
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let err = redlock.try_lock_shared("acl").unwrap_err();
    let message = err.to_string();
    // The server's own words (7.0's name no command), then what the script calls.
    assert!(message.contains("ACL user may not run"), "{message}");
    assert!(message.contains("ZADD"), "{message}");
    assert!(message.contains("docs/production.md"), "{message}");
    // A configuration mistake that waiting does not mend.
    assert!(err.is_permanent(), "{err:?}");
}
