//! All-or-none locks of a set of resources, against real
//! servers: one script per node sets every member or none; a set excludes plain locks of its
//! members, other sets sharing a member and other clients' `SET NX`; release and extend take
//! every member; overlapping sets in contention all finish (no livelock) without two holders
//! of any resource; a frozen node does not stop them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Error, Lock, MAX_SET_LEN, ResourceSet};

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(300))
}

fn set(names: &[&str]) -> ResourceSet {
    ResourceSet::new(names).unwrap()
}

/// `key`'s value on every server.
fn values(servers: &Cluster, key: &str) -> Vec<Option<String>> {
    servers.iter().map(|s| s.get(key)).collect()
}

#[test]
fn a_set_holds_every_member_with_its_token_and_its_release_takes_them_all() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers).build().unwrap();
    let accounts = set(&["account:bob", "account:alice", "account:bob"]);
    assert_eq!(accounts.len(), 2, "duplicates dropped");
    let lock = redlock.try_lock(&accounts).unwrap();
    let token = String::from_utf8(lock.token().as_bytes().to_vec()).unwrap();
    for member in ["account:alice", "account:bob"] {
        assert_eq!(values(&servers, member), vec![Some(token.clone()); 3]);
    }
    let members: Vec<&[u8]> = lock.resource().members().unwrap().collect();
    assert_eq!(members, [&b"account:alice"[..], b"account:bob"]);
    assert_eq!(lock.resource().to_string(), "{account:alice, account:bob}");
    // Nothing else was written: the set's encoding is never a key.
    let keys: i64 = servers.iter().map(|s| s.dbsize()).sum();
    assert_eq!(keys, 6);

    // Each member excludes a plain lock, and a set sharing one member.
    assert!(matches!(
        redlock.try_lock("account:bob"),
        Err(Error::Held(_))
    ));
    assert!(matches!(
        redlock.try_lock(set(&["account:carol", "account:alice"])),
        Err(Error::Held(_))
    ));
    // The refused set left nothing behind: carol is free everywhere.
    assert_eq!(values(&servers, "account:carol"), vec![None; 3]);

    assert_eq!(redlock.unlock(lock).unwrap(), 3);
    for member in ["account:alice", "account:bob"] {
        assert_eq!(values(&servers, member), vec![None; 3]);
    }
    // Free again for a plain lock of a member.
    let plain = redlock.try_lock("account:bob").unwrap();
    redlock.unlock(plain).unwrap();
}

#[test]
fn a_member_held_by_another_client_refuses_the_whole_set_on_every_node() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers).build().unwrap();
    // What every other Redlock client does.
    for s in servers.iter() {
        s.cmd(&["SET", "b", "foreign", "NX", "PX", "60000"]);
    }
    match redlock.try_lock(set(&["a", "b", "c"])) {
        Err(Error::Held(report)) => assert!(report.refused().count() >= 2, "{report}"),
        other => panic!("expected Held, got {other:?}"),
    }
    for member in ["a", "c"] {
        assert_eq!(
            values(&servers, member),
            vec![None; 3],
            "{member} set alone"
        );
    }
    assert_eq!(values(&servers, "b"), vec![Some("foreign".into()); 3]);
    // And a set held by us makes the foreign client's SET NX fail.
    let lock = redlock.try_lock(set(&["x", "y"])).unwrap();
    for s in servers.iter() {
        let v = s.cmd(&["SET", "y", "foreign", "NX", "PX", "60000"]);
        assert_eq!(v, redis::Value::Nil);
    }
    redlock.unlock(lock).unwrap();
}

#[test]
fn extend_and_keep_renew_every_member() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers)
        .ttl(Duration::from_millis(2_000))
        .max_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut lock = redlock.try_lock(set(&["e1", "e2", "e3"])).unwrap();
    redlock
        .extend(&mut lock, Duration::from_secs(30))
        .expect("extended");
    for member in ["e1", "e2", "e3"] {
        for s in servers.iter() {
            assert!(s.pttl(member) > 20_000, "{member}: {}", s.pttl(member));
        }
    }
    // A member lost (deleted by hand on every node): the next extend of the set fails.
    for s in servers.iter() {
        s.cmd(&["DEL", "e2"]);
    }
    assert!(redlock.extend(&mut lock, Duration::from_secs(30)).is_err());
    redlock.unlock(lock).ok();

    // Kept: renewed in the background past its TTL.
    let kept = redlock
        .keep(redlock.try_lock(set(&["k1", "k2"])).unwrap())
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while kept.lock().extensions() < 2 {
        assert!(Instant::now() < until, "no renewal in 10 s");
        assert!(kept.is_held());
        std::thread::sleep(Duration::from_millis(50));
    }
    for member in ["k1", "k2"] {
        assert!(values(&servers, member).iter().all(Option::is_some));
    }
    kept.release().unwrap();
    assert_eq!(values(&servers, "k1"), vec![None; 3]);
}

/// Overlapping sets (a ring: each takes its resource and the next) and plain locks, contended
/// by threads that wait (`lock`): nobody ever sees another holder of a resource it holds, and
/// every thread finishes its cycles (no livelock, no deadlock).
#[test]
fn overlapping_sets_in_contention_never_share_a_resource_and_all_finish() {
    let servers = Cluster::start(5);
    let redlock = builder(&servers)
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    const RING: usize = 4;
    const THREADS: usize = 8;
    const CYCLES: usize = 25;
    let holders: Arc<Vec<AtomicUsize>> = Arc::new((0..RING).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (redlock, holders, overlaps, start) = (
                redlock.clone(),
                holders.clone(),
                overlaps.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                let first = t % RING;
                // Half the threads lock two neighbours, the others one resource alone.
                let mine: Vec<usize> = match t % 2 {
                    0 => vec![first, (first + 1) % RING],
                    _ => vec![first],
                };
                let names: Vec<String> = mine.iter().map(|i| format!("ring:{i}")).collect();
                let resources = ResourceSet::new(&names).unwrap();
                start.wait();
                for _ in 0..CYCLES {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let lock: Lock = if mine.len() == 1 {
                        redlock.lock_until(&names[0], deadline)
                    } else {
                        redlock.lock_until(&resources, deadline)
                    }
                    .expect("acquired within the wait");
                    for &i in &mine {
                        if holders[i].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    std::thread::yield_now();
                    for &i in &mine {
                        holders[i].fetch_sub(1, Ordering::SeqCst);
                    }
                    redlock.unlock(lock).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread did not finish its cycles");
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders of one resource"
    );
}

/// A waiter for a set is woken by the release of a member held by a plain lock (the set
/// listens on every member's notices), and acquires the whole set.
#[test]
fn a_waiting_set_acquires_once_the_member_held_alone_is_released() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers).build().unwrap();
    let plain = redlock.try_lock("w2").unwrap();
    let waiter = {
        let redlock = redlock.clone();
        std::thread::spawn(move || {
            redlock.lock_until(set(&["w1", "w2"]), Instant::now() + Duration::from_secs(20))
        })
    };
    // The waiter is waiting when its mark is on a member's waiting key.
    let until = Instant::now() + Duration::from_secs(10);
    while servers[0].get("redlock:waiting:w2").is_none() {
        assert!(Instant::now() < until, "the set's waiter never marked w2");
        std::thread::sleep(Duration::from_millis(5));
    }
    redlock.unlock(plain).unwrap();
    let lock = waiter.join().unwrap().expect("the set after w2's release");
    assert_eq!(values(&servers, "w1"), values(&servers, "w2"));
    redlock.unlock(lock).unwrap();
}

#[test]
fn a_set_is_locked_with_one_node_of_five_frozen_and_with_fencing() {
    let mut servers = Cluster::start(5);
    let redlock = builder(&servers).fencing(true).build().unwrap();
    let first = redlock.try_lock(set(&["f1", "f2"])).unwrap();
    let fence1 = first.fence().expect("a fenced set has a fence");
    redlock.unlock(first).unwrap();
    servers[2].freeze();
    let mut fences = vec![fence1];
    for _ in 0..5 {
        let lock = redlock.try_lock(set(&["f1", "f2", "f3"])).unwrap();
        fences.push(lock.fence().unwrap());
        redlock.unlock(lock).unwrap();
    }
    servers[2].resume();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences rise: {fences:?}"
    );
}

#[test]
fn async_sets_and_a_client_s_sets() {
    let servers = Cluster::start(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redlock = builder(&servers).build_async().unwrap();
    rt.block_on(async {
        let lock = redlock.lock(set(&["as1", "as2"])).await.unwrap();
        assert!(matches!(redlock.try_lock("as2").await, Err(Error::Held(_))));
        assert_eq!(redlock.unlock(lock).await.unwrap(), 3);
    });
    let mut client = builder(&servers).build_client().unwrap();
    let lock = client.try_lock(set(&["c1", "c2"])).unwrap();
    assert!(matches!(client.try_lock("c1"), Err(Error::Held(_))));
    assert_eq!(client.unlock(lock).unwrap(), 3);
    assert_eq!(values(&servers, "c1"), vec![None; 3]);
}

#[test]
fn bad_sets_are_typed_errors_and_a_lock_rebuilt_from_its_parts_releases_the_set() {
    assert!(matches!(
        ResourceSet::new(Vec::<&str>::new()),
        Err(Error::Config(_))
    ));
    assert!(matches!(ResourceSet::new(["a", ""]), Err(Error::Config(_))));
    assert!(matches!(
        ResourceSet::new(["a", "redlock:fence"]),
        Err(Error::ReservedName { .. })
    ));
    let many: Vec<String> = (0..=MAX_SET_LEN).map(|i| format!("r{i}")).collect();
    assert!(matches!(ResourceSet::new(&many), Err(Error::Config(_))));
    // A hand-made encoding that is not canonical is refused, not taken for a name.
    let servers = Cluster::start(3);
    let redlock = builder(&servers).build().unwrap();
    assert!(redlock.try_lock("redlock:set:1:b1:a").is_err());
    let long = "x".repeat(2_000);
    assert!(matches!(
        redlock.try_lock(set(&["a", &long])),
        Err(Error::Config(_))
    ));

    let lock = redlock.try_lock(set(&["p1", "p2"])).unwrap();
    let rebuilt = Lock::from_parts(
        lock.resource(),
        lock.token().as_bytes(),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(redlock.unlock(rebuilt).unwrap(), 3);
    let left: HashMap<&str, Vec<Option<String>>> = ["p1", "p2"]
        .iter()
        .map(|m| (*m, values(&servers, m)))
        .collect();
    assert!(
        left.values().all(|v| v.iter().all(Option::is_none)),
        "{left:?}"
    );
}

/// The other way round: a plain waiter for a member is told by the set's release (the set's
/// script deletes the member's waiting mark and publishes its notice).
#[test]
fn a_plain_waiter_for_a_member_acquires_once_the_set_is_released() {
    let servers = Cluster::start(3);
    // The fallback poll comes after the waiter's deadline: only the notice can bring it.
    let redlock = builder(&servers)
        .retry_delay(Duration::from_secs(60), Duration::ZERO)
        .build()
        .unwrap();
    let held = redlock.try_lock(set(&["v1", "v2", "v3"])).unwrap();
    let waiter = {
        let redlock = redlock.clone();
        std::thread::spawn(move || {
            redlock.lock_until("v2", Instant::now() + Duration::from_secs(20))
        })
    };
    let until = Instant::now() + Duration::from_secs(10);
    while servers
        .iter()
        .any(|s| s.get("redlock:waiting:v2").is_none())
    {
        assert!(Instant::now() < until, "the waiter never marked v2");
        std::thread::sleep(Duration::from_millis(5));
    }
    redlock.unlock(held).unwrap();
    let lock = waiter.join().unwrap().expect("v2 after the set's release");
    redlock.unlock(lock).unwrap();
}

/// Two of five nodes restart (their keys gone) while a set is held: with the restart quarantine
/// their yeses do not count, so neither an overlapping set nor a plain lock of a member gets
/// in; once the set is released, a new set is granted.
#[test]
fn a_held_set_survives_a_minority_of_nodes_restarting() {
    let mut servers = Cluster::start(5);
    let redlock = builder(&servers)
        .ttl(Duration::from_secs(5))
        .quarantine(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    for s in servers.iter() {
        s.wait_uptime(6);
    }
    let held = redlock.try_lock(set(&["r1", "r2"])).unwrap();
    servers[0].restart();
    servers[3].restart();
    let other = builder(&servers)
        .ttl(Duration::from_secs(5))
        .quarantine(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    for attempt in [other.try_lock(set(&["r2", "r3"])), other.try_lock("r1")] {
        match attempt {
            Err(Error::Held(_) | Error::NoQuorum(_)) => {}
            other => panic!("a second holder of a member after restarts: {other:?}"),
        }
    }
    redlock.unlock(held).unwrap();
    // The three that kept the set released it; the restarted two never had it.
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s.get("r1"), None, "node {i}");
    }
}

/// A set's release notices count the clients that wait for its members, not the releaser
/// (its own callers' queue for the set listens on every member's channel): with the other
/// client and this test's subscription on node 0, "2" — "3" before the releaser was left out.
#[test]
fn a_sets_release_notice_does_not_count_the_releaser() {
    let servers = Cluster::start(3);
    let soon = Duration::from_secs(10);
    let make = || {
        builder(&servers)
            .retry_delay(Duration::from_secs(30), Duration::ZERO)
            .build()
            .unwrap()
    };
    let (releaser, other) = (make(), make());
    let pair = set(&["n:x", "n:y"]);
    let lock = releaser.lock(&pair).unwrap();
    // Each caller lets go of the set it gets, whichever gets it first.
    let wait = |redlock: &redlock_mux::Redlock| {
        let (redlock, pair) = (redlock.clone(), pair.clone());
        std::thread::spawn(move || {
            let lock = redlock.lock_until(&pair, Instant::now() + soon)?;
            redlock.unlock(lock).map(|_| ())
        })
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + soon;
        while !done() {
            assert!(Instant::now() < deadline, "never {what}");
            std::thread::yield_now();
        }
    };
    let waiting = |redlock: &redlock_mux::Redlock| {
        (redlock.with_client(|c| redlock_mux::testing::waiters(c, pair.as_ref()))).unwrap()
    };
    let mine = wait(&releaser);
    until("a second caller of the releaser waits", &|| {
        waiting(&releaser) == 1
    });
    let theirs = wait(&other);
    until("the other client waits", &|| waiting(&other) == 1);
    until("marked", &|| {
        (servers.iter()).all(|s| s.get("redlock:waiting:n:x").is_some())
    });
    let channel = "redlock:released:n:x";
    let mut raw = servers[0].connection();
    let mut listener = raw.as_pubsub();
    listener.subscribe(channel).unwrap();
    listener.set_read_timeout(Some(soon)).unwrap();
    until("subscribed", &|| {
        (servers.iter().enumerate())
            .all(|(i, s)| s.subscribers(channel) == if i == 0 { 3 } else { 2 })
    });
    releaser.unlock(lock).unwrap();
    let message = listener
        .get_message()
        .expect("the release published its notice");
    assert_eq!(message.get_payload::<String>().unwrap(), "2");
    mine.join().unwrap().expect("the releaser's second caller");
    theirs.join().unwrap().expect("the other client's caller");
    for member in ["n:x", "n:y"] {
        assert_eq!(values(&servers, member), vec![None; 3]);
    }
}

/// Readers of one resource, three threads of `readers`' client, each holding 150 ms and
/// coming back at once: between them the resource is never free.
fn readers_keep_busy(
    readers: &redlock_mux::Redlock,
    name: &'static str,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..3)
        .map(|i| {
            let (readers, stop) = (readers.clone(), stop.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50 * i));
                while !stop.load(Ordering::SeqCst) {
                    match readers.try_lock_shared(name) {
                        Ok(read) => {
                            std::thread::sleep(Duration::from_millis(150));
                            readers.unlock(read).unwrap();
                        }
                        Err(Error::Held(_)) => std::thread::sleep(Duration::from_millis(5)),
                        Err(e) => panic!("reader of {name}: {e}"),
                    }
                }
            })
        })
        .collect()
}

/// Waits until `key` is read-locked (a sorted set) on the first server.
fn read_locked(servers: &Cluster, key: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while servers[0].cmd(&["TYPE", key]) != redis::Value::SimpleString("zset".into()) {
        assert!(Instant::now() < until, "no reader of {key} came");
        std::thread::yield_now();
    }
}

#[test]
fn a_waiting_set_gets_its_members_while_readers_keep_each_of_them_busy() {
    // Readers of each member overlap, so the members are never free together (nor alone):
    // a set that tries all of them at once waits for a moment that never comes. With ordered
    // sets a waiting set takes its members one at a time, marking the one it waits for, so the
    // readers of that member drain, and it keeps what it has.
    let servers = Cluster::start(3);
    let readers = builder(&servers).ordered_sets(true).build().unwrap();
    let sets = builder(&servers)
        .ordered_sets(true)
        .fencing(true)
        .build()
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut threads = readers_keep_busy(&readers, "busy:a", &stop);
    threads.extend(readers_keep_busy(&readers, "busy:b", &stop));
    let mut waits = Vec::new();
    for _ in 0..10 {
        read_locked(&servers, "busy:a");
        read_locked(&servers, "busy:b");
        let t0 = Instant::now();
        let lock = sets
            .lock_until(
                set(&["busy:b", "busy:a"]),
                Instant::now() + Duration::from_secs(10),
            )
            .expect("the set gets both members while their readers keep coming");
        waits.push(t0.elapsed());
        let token = String::from_utf8(lock.token().as_bytes().to_vec()).unwrap();
        for member in ["busy:a", "busy:b"] {
            let holding = values(&servers, member)
                .into_iter()
                .filter(|v| v.as_deref() == Some(token.as_str()))
                .count();
            assert!(holding >= 2, "{member} holds the lock's token on a quorum");
        }
        sets.unlock(lock).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    waits.sort();
    eprintln!(
        "a set under readers of both members, 10 waits: median {:?}, longest {:?}",
        waits[5], waits[9]
    );
}

#[test]
fn a_waiting_set_keeps_the_members_it_holds_past_its_ttl_and_releases_them_when_it_gives_up() {
    let servers = Cluster::start(3);
    let holder = builder(&servers).build().unwrap();
    let rival = builder(&servers).build().unwrap();
    // A TTL of 2 s: the member the set holds while it waits outlives it only if the set's
    // attempts keep it.
    let sets = builder(&servers)
        .ordered_sets(true)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    // kept:b held throughout: the set's first attempt (all at once) is refused, then it takes
    // kept:a, the free member before it, and waits for kept:b.
    let held = holder.try_lock("kept:b").unwrap();
    let waiter = {
        let sets = sets.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = sets.lock_until(
                set(&["kept:a", "kept:b"]),
                Instant::now() + Duration::from_secs(5),
            );
            (r, t0.elapsed())
        })
    };
    // The set holds kept:a once its value is a set's token (`.`) on every server.
    let until = Instant::now() + Duration::from_secs(10);
    while !values(&servers, "kept:a")
        .iter()
        .all(|v| v.as_deref().is_some_and(|v| v.starts_with('.')))
    {
        assert!(Instant::now() < until, "the set never took kept:a");
        std::thread::sleep(Duration::from_millis(5));
    }
    // For twice the set's TTL, nobody else gets kept:a: the set keeps it while it waits.
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(4) {
        match rival.try_lock("kept:a") {
            Err(Error::Held(_)) => {}
            other => panic!("kept:a while the set holds it and waits: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (result, waited) = waiter.join().unwrap();
    assert!(
        matches!(result, Err(Error::Held(_))),
        "kept:b stayed held: {result:?}"
    );
    assert!(waited >= Duration::from_secs(5), "waited {waited:?}");
    // Giving up, the set released what it held: kept:a is free well before the TTL its last
    // attempt gave it would have run out (its attempts come at least every 400 ms: 1.6 s).
    let until = Instant::now() + Duration::from_secs(1);
    while values(&servers, "kept:a").iter().any(Option::is_some) {
        assert!(
            Instant::now() < until,
            "kept:a still held after the set gave up: {:?}",
            values(&servers, "kept:a")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let a = rival.try_lock("kept:a").expect("kept:a is free");
    rival.unlock(a).unwrap();
    holder.unlock(held).unwrap();
}

/// `key` on the server at `port` as this test reads it: a string's value, else its type
/// (`none`, `zset`), or `?` if the server does not answer (restarting).
fn value_at(port: u16, key: &str) -> String {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return "?".into();
    };
    let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return "?".into();
    };
    match redis::cmd("TYPE").arg(key).query::<String>(&mut c) {
        Ok(t) if t == "string" => (redis::cmd("GET").arg(key))
            .query::<Option<String>>(&mut c)
            .ok()
            .flatten()
            .unwrap_or_default(),
        Ok(t) => t,
        Err(_) => "?".into(),
    }
}

#[test]
fn every_set_granted_beside_readers_and_writers_of_its_members_holds_them_through_restarts() {
    // Sets that take their members one step at a time, in one handle with readers and
    // writers of the same members, while servers restart (the quarantine on): each set's
    // grant must find its token on a quorum of every member. A set's next step went out in
    // the turn that decided its last one, and could take the slot of an attempt lost in that
    // turn whose cleanup was still to come: the cleanup then deleted the new step's last
    // member (found by the soak; two sets of ~1,150 in 20 s granted without it).
    let cluster = Cluster::start(5);
    let (ports, urls) = (cluster.ports(), cluster.urls());
    let cluster = Arc::new(std::sync::Mutex::new(cluster));
    let redlock = Builder::new(urls)
        .ordered_sets(true)
        .fencing(true)
        .ttl(Duration::from_millis(1500))
        .build()
        .unwrap();
    let names = ["r:0", "r:1", "r:2"];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut threads = Vec::new();
    for i in 0..10usize {
        let (redlock, stop) = (redlock.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let name = names[i % 3];
            while !stop.load(Ordering::SeqCst) {
                let lock = match i < 6 {
                    true => redlock.lock_shared(name),
                    false => redlock.lock(name),
                };
                if let Ok(lock) = lock {
                    std::thread::sleep(Duration::from_millis(3 + 2 * (i as u64 % 6)));
                    let _ = redlock.unlock(lock);
                }
            }
        }));
    }
    {
        let (cluster, stop) = (cluster.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(600));
                i += 1;
                let mut servers = cluster.lock().unwrap();
                let node = (i * 28 % 5) as usize;
                servers[node].kill();
                std::thread::sleep(Duration::from_millis(100 + i * 148 % 500));
                servers[node].restart();
            }
        }));
    }
    let shapes: [&[&str]; 4] = [
        &["r:0", "r:1"],
        &["r:1", "r:2"],
        &["r:0", "r:2"],
        &["r:0", "r:1", "r:2"],
    ];
    let setters: Vec<_> = (0..6usize)
        .map(|s| {
            let members: Vec<&'static str> = shapes[s % 4].to_vec();
            let (redlock, stop, ports) = (redlock.clone(), stop.clone(), ports.clone());
            std::thread::spawn(move || {
                let (mut granted, mut unbacked) = (0, Vec::new());
                let mut tries = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    // Every third wait short: a set that gives up releases what it holds.
                    tries += 1;
                    let lock = match tries % 3 {
                        0 => redlock
                            .lock_until(set(&members), Instant::now() + Duration::from_millis(300)),
                        _ => redlock.lock(set(&members)),
                    };
                    let Ok(lock) = lock else { continue };
                    granted += 1;
                    let token = String::from_utf8(lock.token().as_bytes().to_vec()).unwrap();
                    for m in &members {
                        let on: Vec<String> = ports.iter().map(|&p| value_at(p, m)).collect();
                        if on.iter().filter(|v| **v == token).count() < 3 {
                            unbacked.push(format!("{m}: {token} not on a quorum: {on:?}"));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    let _ = redlock.unlock(lock);
                }
                (granted, unbacked)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(20));
    stop.store(true, Ordering::SeqCst);
    let (mut granted, mut unbacked) = (0, Vec::new());
    for s in setters {
        let (g, u) = s.join().unwrap();
        granted += g;
        unbacked.extend(u);
    }
    for t in threads {
        t.join().unwrap();
    }
    eprintln!("sets granted beside readers and writers, servers restarting: {granted}");
    assert!(granted > 100, "{granted} sets granted in 20 s");
    assert!(unbacked.is_empty(), "{unbacked:#?}");
}

/// A stream of ordered sets over `stream:a` + `stream:b` (three clients of two threads, each
/// set held 20 ms) while two plain clients keep `stream:b` busy, so the sets hold `stream:a`
/// while they wait for `stream:b`, and one set or another always waits for `stream:a` and
/// marks it. Then a writer and a reader of `stream:a` (a client of their own, whose waiters
/// step back for a set's mark during `precedence` of their wait) each try `tries` times with
/// a 4 s budget: how many of each were granted, and the longest wait of a granted one.
fn writer_and_reader_beside_a_stream_of_sets(
    precedence: Duration,
    tries: usize,
) -> (usize, usize, Duration) {
    let servers = Cluster::start(3);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hold = |redlock: redlock_mux::Redlock, what: Vec<u8>| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let deadline = Instant::now() + Duration::from_secs(5);
                if let Ok(lock) = redlock.lock_until(what.clone(), deadline) {
                    std::thread::sleep(Duration::from_millis(20));
                    redlock.unlock(lock).unwrap();
                }
            }
        })
    };
    let mut threads = Vec::new();
    for _ in 0..3 {
        let sets = builder(&servers).ordered_sets(true).build().unwrap();
        for _ in 0..2 {
            threads.push(hold(
                sets.clone(),
                set(&["stream:a", "stream:b"]).as_ref().to_vec(),
            ));
        }
    }
    for _ in 0..2 {
        let plain = builder(&servers).ordered_sets(true).build().unwrap();
        threads.push(hold(plain, b"stream:b".to_vec()));
    }
    // The stream is on: a set holds `stream:a` or waits for it, marking it.
    let until = Instant::now() + Duration::from_secs(10);
    while servers[0].get("redlock:waiting:stream:a").as_deref() != Some("redlock-mux set waiting") {
        assert!(Instant::now() < until, "no set came to wait for stream:a");
        std::thread::yield_now();
    }
    let single = builder(&servers)
        .ordered_sets(true)
        .set_precedence(precedence)
        .build()
        .unwrap();
    let (mut writes, mut reads, mut longest) = (0, 0, Duration::ZERO);
    for _ in 0..tries {
        let t0 = Instant::now();
        if let Ok(lock) = single.lock_until("stream:a", t0 + Duration::from_secs(4)) {
            writes += 1;
            longest = longest.max(t0.elapsed());
            single.unlock(lock).unwrap();
        }
        let t0 = Instant::now();
        if let Ok(lock) = single.lock_shared_until("stream:a", t0 + Duration::from_secs(4)) {
            reads += 1;
            longest = longest.max(t0.elapsed());
            single.unlock(lock).unwrap();
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    (writes, reads, longest)
}

#[test]
fn a_writer_and_a_reader_of_a_set_s_first_member_are_granted_beside_a_stream_of_ordered_sets() {
    // Past its set precedence (250 ms by default) a waiting writer or reader no longer steps
    // back for the sets' mark, and competes with them as with any caller: it wins the member
    // at one of its releases, though not at a bounded one (the sets' steps race it). Without
    // the bound (a precedence of an hour: the code before it) it stepped back for as long as
    // the stream lasted: 0 of 5 writes and 0 of 5 reads granted.
    let (writes, reads, longest) =
        writer_and_reader_beside_a_stream_of_sets(Duration::from_millis(250), 10);
    eprintln!(
        "beside a stream of ordered sets: writer granted {writes} of 10, reader {reads} of 10, \
         longest wait {longest:?}"
    );
    assert!(
        writes >= 4 && reads >= 4,
        "{writes} writes, {reads} reads of 10"
    );
}
