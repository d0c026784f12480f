//! Counting semaphores against real servers: at most P holders among K > P contending threads
//! (and tasks), a released permit handed to a waiter, a frozen node, a restarted node, a bad
//! count, the key layout shared with plain locks (`<name>#<i>`), and what an acquire costs the
//! servers (one `SET` per node uncontended, P when every permit is held).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis_local::{Cluster, Server};
use redlock_mux::{AsyncRedlock, Builder, Error, Lock, MAX_PERMITS, Redlock, Semaphore};

/// A bound on every wait of these tests (never reached when things work).
const BOUND: Duration = Duration::from_secs(20);

/// Fresh test servers have a short uptime: quarantine is tested elsewhere, off here.
fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        // Timing is not what these tests check: room for a loaded machine.
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(20), Duration::from_millis(20))
}

fn handle(servers: &Cluster) -> Redlock {
    builder(servers).build().unwrap()
}

fn deadline() -> Instant {
    Instant::now() + BOUND
}

/// Holders counted inside the critical section: the most seen at once.
#[derive(Default)]
struct Count {
    now: AtomicUsize,
    max: AtomicUsize,
    /// P holders were seen at once.
    full: AtomicBool,
}

impl Count {
    /// Enters; then, in the first rounds, stays (bounded) until P holders were seen at once, so
    /// that reaching P does not depend on the timing of the threads.
    fn enter(&self, permits: usize) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        if n == permits {
            self.full.store(true, Ordering::SeqCst);
        }
        let until = Instant::now() + Duration::from_secs(5);
        while !self.full.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::yield_now();
        }
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn check(&self, permits: usize) {
        let max = self.max.load(Ordering::SeqCst);
        assert!(max <= permits, "{max} holders of {permits} permits");
        assert_eq!(max, permits, "never {permits} holders at once");
    }
}

/// K = 8 threads, half on one shared handle (its wait queues), half on handles of their own
/// (split votes between engines), for P = 3 permits over 5 servers.
#[test]
fn at_most_p_holders_among_k_contending_threads() {
    const P: u32 = 3;
    const K: usize = 8;
    const ROUNDS: usize = 15;
    let servers = Cluster::start(5);
    let shared = handle(&servers);
    let count = Arc::new(Count::default());
    let start = Arc::new(Barrier::new(K));
    let workers: Vec<_> = (0..K)
        .map(|k| {
            let redlock = if k % 2 == 0 {
                shared.clone()
            } else {
                handle(&servers)
            };
            let (count, start) = (count.clone(), start.clone());
            std::thread::spawn(move || {
                let sem = redlock.semaphore("deploy", P).unwrap();
                start.wait();
                for _ in 0..ROUNDS {
                    let permit = sem.acquire_until(deadline()).unwrap();
                    assert!(sem.permit_of(&permit).is_some(), "{permit:?}");
                    count.enter(P as usize);
                    assert!(permit.is_valid());
                    count.leave();
                    redlock.unlock(permit).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    count.check(P as usize);
    // Every permit released.
    for i in 0..P {
        for s in servers.iter() {
            assert_eq!(s.get(&format!("deploy#{i}")), None);
        }
    }
}

#[test]
fn p_permits_are_taken_then_the_next_acquire_is_refused_and_a_release_frees_one() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("jobs", 3).unwrap();
    let held: Vec<Lock> = (0..3).map(|_| sem.try_acquire().unwrap()).collect();
    let mut got: Vec<u32> = held.iter().map(|l| sem.permit_of(l).unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2]);
    // Permits are plain locks on `<name>#<i>`, holding the permit's token.
    for l in &held {
        for s in servers.iter() {
            let key = String::from_utf8(l.resource().to_vec()).unwrap();
            assert_eq!(s.get(&key).as_deref(), Some(l.token().to_string().as_str()));
        }
    }
    assert!(matches!(sem.try_acquire(), Err(Error::Held(_))));
    let mut held = held.into_iter();
    let first = held.next().unwrap();
    let index = sem.permit_of(&first).unwrap();
    redlock.unlock(first).unwrap();
    let again = sem.try_acquire().unwrap();
    assert_eq!(sem.permit_of(&again), Some(index));
    // Extend works on a permit as on any lock.
    let mut again = again;
    redlock.extend(&mut again, Duration::from_secs(10)).unwrap();
    redlock.unlock(again).unwrap();
    for l in held {
        redlock.unlock(l).unwrap();
    }
}

/// A waiter wakes on the release of whichever permit is released, through the same engine (the
/// queue hands it over) and through another client's release (its notice).
#[test]
fn a_released_permit_goes_to_a_waiter() {
    let servers = Cluster::start(3);
    let shared = handle(&servers);
    let other = handle(&servers);
    for releaser in [&shared, &other] {
        let sem = releaser.semaphore("pool", 2).unwrap();
        let a = sem.try_acquire().unwrap();
        let b = sem.try_acquire().unwrap();
        let waiter = {
            let sem = shared.semaphore("pool", 2).unwrap();
            std::thread::spawn(move || sem.acquire_until(deadline()))
        };
        // The waiter waits on both permits: each is marked.
        until_marked(&servers, "pool#0");
        until_marked(&servers, "pool#1");
        let released = sem.permit_of(&b).unwrap();
        releaser.unlock(b).unwrap();
        let got = waiter.join().unwrap().unwrap();
        assert_eq!(sem.permit_of(&got), Some(released));
        shared.unlock(got).unwrap();
        releaser.unlock(a).unwrap();
    }
}

/// Waits (bounded) until every server holds `resource`'s waiting mark.
fn until_marked(servers: &Cluster, resource: &str) {
    let mark = format!("redlock:waiting:{resource}");
    for s in servers.iter() {
        let deadline = deadline();
        while s.get(&mark).is_none() {
            assert!(
                Instant::now() < deadline,
                "{mark} never set on {}",
                s.addr()
            );
            std::thread::yield_now();
        }
    }
}

#[test]
fn a_wait_ends_at_its_deadline_with_held() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("full", 1).unwrap();
    let held = sem.try_acquire().unwrap();
    let e = sem
        .acquire_until(Instant::now() + Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(e, Error::Held(_)), "{e}");
    redlock.unlock(held).unwrap();
    // Nothing left behind by the waits: the permit is free again for anyone.
    let mut client = builder(&servers).build_client().unwrap();
    let permit = client.try_acquire_permit("full", 1).unwrap();
    client.unlock(permit).unwrap();
}

#[test]
fn one_of_five_nodes_frozen() {
    let mut servers = Cluster::start(5);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("frozen", 3).unwrap();
    servers[2].freeze();
    let held: Vec<Lock> = (0..3).map(|_| sem.try_acquire().unwrap()).collect();
    assert!(matches!(sem.try_acquire(), Err(Error::Held(_))));
    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire_until(deadline()))
    };
    until_marked_on(&servers, "frozen#0", &[0, 1, 3, 4]);
    let mut held = held.into_iter();
    redlock.unlock(held.next().unwrap()).unwrap();
    let got = waiter.join().unwrap().unwrap();
    redlock.unlock(got).unwrap();
    for l in held {
        redlock.unlock(l).unwrap();
    }
    servers[2].resume();
}

fn until_marked_on(servers: &Cluster, resource: &str, nodes: &[usize]) {
    let mark = format!("redlock:waiting:{resource}");
    for &i in nodes {
        let deadline = deadline();
        while servers[i].get(&mark).is_none() {
            assert!(Instant::now() < deadline, "{mark} never set on node {i}");
            std::thread::yield_now();
        }
    }
}

#[test]
fn a_node_restarted_between_acquires() {
    let mut servers = Cluster::start(5);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("restart", 2).unwrap();
    let a = sem.try_acquire().unwrap();
    servers[1].restart(); // forgets its keys; a majority still holds permit a
    let b = sem.try_acquire().unwrap();
    assert_ne!(sem.permit_of(&a), sem.permit_of(&b));
    assert!(matches!(sem.try_acquire(), Err(Error::Held(_))));
    redlock.unlock(a).unwrap();
    redlock.unlock(b).unwrap();
    let c = sem.try_acquire().unwrap();
    redlock.unlock(c).unwrap();
}

#[test]
fn a_bad_permit_count_is_a_typed_error_in_every_face() {
    let servers = Cluster::start(1);
    let redlock = handle(&servers);
    for permits in [0, MAX_PERMITS + 1] {
        let e = redlock.semaphore("x", permits).unwrap_err();
        assert!(
            matches!(e, Error::PermitCount { permits: p, max: MAX_PERMITS } if p == permits),
            "{e}"
        );
        assert!(e.is_permanent());
        let async_face = redlock_mux::AsyncRedlock::from(redlock.clone());
        assert!(matches!(
            async_face.semaphore("x", permits),
            Err(Error::PermitCount { .. })
        ));
        let mut client = builder(&servers).build_client().unwrap();
        assert!(matches!(
            client.try_acquire_permit("x", permits),
            Err(Error::PermitCount { .. })
        ));
    }
    assert!(matches!(
        redlock.semaphore("redlock:x", 2),
        Err(Error::ReservedName { .. })
    ));
    assert!(redlock.semaphore("x", MAX_PERMITS).is_ok());
    // A shared lock's encoding is no semaphore's name: its permits would be read locks, which
    // any number of callers hold at once (before, one permit of `redlock:shared:x` admitted
    // every caller); nor is a set's.
    let shared = redlock_mux::Shared::new("x").unwrap();
    let set = redlock_mux::ResourceSet::new(["a", "b"]).unwrap();
    let async_face = redlock_mux::AsyncRedlock::from(redlock.clone());
    let mut client = builder(&servers).build_client().unwrap();
    for name in [shared.as_ref(), set.as_ref()] {
        let e = redlock.semaphore(name, 1).unwrap_err();
        assert!(matches!(e, Error::ReservedName { .. }), "{e}");
        assert!(matches!(
            async_face.semaphore(name, 1),
            Err(Error::ReservedName { .. })
        ));
        assert!(matches!(
            client.try_acquire_permit(name, 1),
            Err(Error::ReservedName { .. })
        ));
    }
    // Nothing was written on the way.
    assert_eq!(servers[0].dbsize(), 0);
}

/// The key layout is the plain lock's: another client's `SET <name>#0 … NX PX` takes permit 0,
/// a plain lock on `<name>` takes none.
#[test]
fn a_plain_set_nx_on_a_permit_key_takes_that_permit() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    for s in servers.iter() {
        s.cmd(&["SET", "printers#0", "foreign", "NX", "PX", "30000"]);
    }
    let plain = redlock.lock("printers").unwrap();
    let sem = redlock.semaphore("printers", 2).unwrap();
    let permit = sem.try_acquire().unwrap();
    assert_eq!(sem.permit_of(&permit), Some(1));
    assert!(matches!(sem.try_acquire(), Err(Error::Held(_))));
    // And a plain lock of this crate on a permit's key is refused while the permit is held.
    assert!(matches!(
        redlock.try_lock("printers#1"),
        Err(Error::Held(_))
    ));
    redlock.unlock(permit).unwrap();
    redlock.unlock(plain).unwrap();
    for s in servers.iter() {
        assert_eq!(s.get("printers#0").as_deref(), Some("foreign"));
    }
}

#[test]
fn guard_and_with_permit_reuse_the_lock_machinery() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let sem: Semaphore = redlock.semaphore("g", 1).unwrap();
    {
        let guard = sem.guard().unwrap();
        assert_eq!(&**guard.resource(), b"g#0");
        assert!(matches!(sem.try_acquire(), Err(Error::Held(_))));
    }
    // The guard's release is not waited for: the permit comes back through a wait.
    let permit = sem.acquire_until(deadline()).unwrap();
    redlock.unlock(permit).unwrap();
    let n = sem
        .with_permit(|kept| {
            assert!(kept.is_held());
            // Inside, the permit's key is held by this caller: a plain lock of it fails at once.
            assert!(matches!(
                redlock.try_lock("g#0"),
                Err(Error::AlreadyHeld { .. })
            ));
            7
        })
        .unwrap();
    assert_eq!(n, 7);
}

#[test]
fn a_client_acquires_and_waits_for_permits() {
    let servers = Cluster::start(3);
    let mut a = builder(&servers).build_client().unwrap();
    let mut b = builder(&servers).build_client().unwrap();
    let first = a.try_acquire_permit("c", 2).unwrap();
    let second = a.try_acquire_permit("c", 2).unwrap();
    assert_ne!(first.resource(), second.resource());
    assert!(matches!(b.try_acquire_permit("c", 2), Err(Error::Held(_))));
    let waiter = std::thread::spawn(move || {
        let got = b.acquire_permit_until("c", 2, deadline());
        (b, got)
    });
    until_marked_any(&servers, &["c#0", "c#1"]);
    a.unlock(second).unwrap();
    let (mut b, got) = waiter.join().unwrap();
    let got = got.unwrap();
    b.unlock(got).unwrap();
    a.unlock(first).unwrap();
}

/// Waits (bounded) until a server holds one of the resources' waiting marks.
fn until_marked_any(servers: &Cluster, resources: &[&str]) {
    let deadline = deadline();
    loop {
        let marked = resources.iter().any(|r| {
            let mark = format!("redlock:waiting:{r}");
            servers.iter().any(|s| s.get(&mark).is_some())
        });
        if marked {
            return;
        }
        assert!(Instant::now() < deadline, "no mark set");
        std::thread::yield_now();
    }
}

/// The async face under tokio: K = 16 tasks on a 2-worker runtime for P = 3, then a dropped
/// acquire leaves no permit behind.
#[test]
fn async_tasks_hold_at_most_p_permits() {
    const P: u32 = 3;
    const K: usize = 16;
    let servers = Cluster::start(5);
    let redlock = builder(&servers).build_async().unwrap();
    let count = Arc::new(Count::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..K)
            .map(|_| {
                let (redlock, count) = (redlock.clone(), count.clone());
                tokio::spawn(async move {
                    let sem = redlock.semaphore("tasks", P).unwrap();
                    for _ in 0..5 {
                        let permit = sem.acquire_until(deadline()).await.unwrap();
                        let n = count.now.fetch_add(1, Ordering::SeqCst) + 1;
                        count.max.fetch_max(n, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        count.now.fetch_sub(1, Ordering::SeqCst);
                        redlock.unlock(permit).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let max = count.max.load(Ordering::SeqCst);
        assert!(max <= P as usize, "{max} holders of {P} permits");
        let sem = redlock.semaphore("tasks", P).unwrap();
        // A try_acquire, and a wait dropped while it waits: nothing left held.
        let held: Vec<Lock> = {
            let mut v = Vec::new();
            for _ in 0..P {
                v.push(sem.try_acquire().await.unwrap());
            }
            v
        };
        assert!(matches!(sem.try_acquire().await, Err(Error::Held(_))));
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), sem.acquire_until(deadline()));
        assert!(
            dropped.await.is_err(),
            "acquired while every permit was held"
        );
        for l in held {
            redlock.unlock(l).await.unwrap();
        }
        let mut again = Vec::new();
        for _ in 0..P {
            again.push(sem.acquire_until(deadline()).await.unwrap());
        }
        for l in again {
            redlock.unlock(l).await.unwrap();
        }
    });
}

/// Calls of `commands` a server ran since its last `CONFIG RESETSTAT` (`INFO commandstats`).
fn calls(server: &Server, commands: &[&str]) -> u64 {
    let info = server.info("commandstats");
    commands
        .iter()
        .map(|c| {
            let prefix = format!("cmdstat_{c}:calls=");
            info.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .map_or(0, |rest| {
                    rest.split(',').next().unwrap().parse::<u64>().unwrap()
                })
        })
        .sum()
}

fn reset_stats(servers: &Cluster) {
    for s in servers.iter() {
        s.cmd(&["CONFIG", "RESETSTAT"]);
    }
}

/// `SET`s and release scripts each server ran since the last reset: (sets, scripts).
fn costs(servers: &Cluster) -> Vec<(u64, u64)> {
    servers
        .iter()
        .map(|s| (calls(s, &["set"]), calls(s, &["eval", "evalsha"])))
        .collect()
}

/// Uncontended, an acquire attempts one permit: a permit cycle costs every node one `SET` and
/// one release script, as a plain lock's does — in every face, waiting or not. (Every count
/// is read after an unlock that all the nodes answered: each node ran everything before it on
/// the engine's connection.)
#[test]
fn an_uncontended_permit_cycle_is_one_set_and_one_release_per_node() {
    const N: usize = 5;
    const P: u32 = 3;
    const CYCLES: u64 = 12;
    let servers = Cluster::start(N);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("cost", P).unwrap();
    let mut client = builder(&servers).build_client().unwrap();
    let async_face = builder(&servers).build_async().unwrap();
    let async_sem = async_face.semaphore("cost", P).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    type Cycle<'a> = Box<dyn FnMut() + 'a>;
    let faces: [(&str, Cycle<'_>); 5] = [
        (
            "Semaphore::try_acquire",
            Box::new(|| assert_eq!(redlock.unlock(sem.try_acquire().unwrap()).unwrap(), N)),
        ),
        (
            "Semaphore::acquire",
            Box::new(|| assert_eq!(redlock.unlock(sem.acquire().unwrap()).unwrap(), N)),
        ),
        (
            "AsyncSemaphore::try_acquire",
            Box::new(|| {
                rt.block_on(async {
                    let permit = async_sem.try_acquire().await.unwrap();
                    assert_eq!(async_face.unlock(permit).await.unwrap(), N);
                })
            }),
        ),
        (
            "AsyncSemaphore::acquire",
            Box::new(|| {
                rt.block_on(async {
                    let permit = async_sem.acquire().await.unwrap();
                    assert_eq!(async_face.unlock(permit).await.unwrap(), N);
                })
            }),
        ),
        (
            "Client::try_acquire_permit",
            Box::new(|| {
                let permit = client.try_acquire_permit("cost", P).unwrap();
                assert_eq!(client.unlock(permit).unwrap(), N);
            }),
        ),
    ];
    for (face, mut cycle) in faces {
        // Connections made and scripts loaded before counting.
        cycle();
        reset_stats(&servers);
        for _ in 0..CYCLES {
            cycle();
        }
        for (node, cost) in costs(&servers).into_iter().enumerate() {
            assert_eq!(
                cost,
                (CYCLES, CYCLES),
                "{face}: (SETs, scripts) on node {node}"
            );
        }
    }
}

/// With every permit held, an acquire attempts each permit once: the first alone, then the
/// others together — P `SET`s per node, as many as attempting them all at once.
#[test]
fn with_every_permit_held_an_acquire_attempts_each_permit_once() {
    const N: usize = 5;
    const P: u32 = 3;
    let servers = Cluster::start(N);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("full", P).unwrap();
    let held: Vec<Lock> = (0..P).map(|_| sem.try_acquire().unwrap()).collect();
    let mut client = builder(&servers).build_client().unwrap();
    for round in 0..8 {
        reset_stats(&servers);
        let e = if round % 2 == 0 {
            sem.try_acquire().unwrap_err()
        } else {
            client.try_acquire_permit("full", P).unwrap_err()
        };
        assert!(matches!(e, Error::Held(_)), "{e}");
        // One plain cycle answered by every node, so that each ran the refused SETs before.
        let mark = redlock.try_lock("full:mark").unwrap();
        assert_eq!(redlock.unlock(mark).unwrap(), N);
        let mark = client.try_lock("full:mark").unwrap();
        assert_eq!(client.unlock(mark).unwrap(), N);
        for (node, (sets, _)) in costs(&servers).into_iter().enumerate() {
            assert_eq!(sets, u64::from(P) + 2, "round {round}, node {node}");
        }
    }
    for l in held {
        assert_eq!(redlock.unlock(l).unwrap(), N);
    }
}

/// An acquire tries the permits in turn: a fresh semaphore hands out permit 0 first, and
/// uncontended cycles go round the permits (each acquire's first pick, won at once).
#[test]
fn uncontended_acquires_take_the_permits_in_turn_from_permit_0() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let sem = redlock.semaphore("turns", 3).unwrap();
    let mut client = builder(&servers).build_client().unwrap();
    let mut got = Vec::new();
    let mut by_client = Vec::new();
    for _ in 0..4 {
        let permit = sem.try_acquire().unwrap();
        got.push(sem.permit_of(&permit).unwrap());
        redlock.unlock(permit).unwrap();
        let permit = client.try_acquire_permit("turns", 3).unwrap();
        by_client.push(String::from_utf8(permit.resource().to_vec()).unwrap());
        client.unlock(permit).unwrap();
    }
    assert_eq!(got, [0, 1, 2, 0]);
    assert_eq!(by_client, ["turns#0", "turns#1", "turns#2", "turns#0"]);
}

/// Whichever permit an acquire picks first (the rounds go through every first pick), it finds
/// the one permit left free.
#[test]
fn the_one_free_permit_is_found_whichever_is_tried_first() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    // Permits 0 and 2 taken by another client's plain SET NX.
    for s in servers.iter() {
        s.cmd(&["SET", "one#0", "foreign", "NX", "PX", "60000"]);
        s.cmd(&["SET", "one#2", "foreign", "NX", "PX", "60000"]);
    }
    let sem = redlock.semaphore("one", 3).unwrap();
    let mut client = builder(&servers).build_client().unwrap();
    for _ in 0..20 {
        let permit = sem.try_acquire().unwrap();
        assert_eq!(sem.permit_of(&permit), Some(1));
        redlock.unlock(permit).unwrap();
        let permit = sem.acquire_until(deadline()).unwrap();
        assert_eq!(sem.permit_of(&permit), Some(1));
        redlock.unlock(permit).unwrap();
        let permit = client.try_acquire_permit("one", 3).unwrap();
        assert_eq!(&**permit.resource(), b"one#1");
        client.unlock(permit).unwrap();
    }
}

/// Waits (bounded) until no node holds `key`: an unlock returns at a quorum of releases, and a
/// permit still held on the third node can make the next acquire's attempt on it lose its
/// quorum (it did, under CI's load: permit 2 instead of 1).
fn until_free(servers: &Cluster, key: &str) {
    for s in servers.iter() {
        let deadline = deadline();
        while s.get(key).is_some() {
            assert!(
                Instant::now() < deadline,
                "{key} never released on {}",
                s.addr()
            );
            std::thread::yield_now();
        }
    }
}

/// A deadline already passed ends the waiting, not the acquire: the other permits are still
/// attempted once, without waiting, as `try_acquire` does (past the deadline
/// the one permit attempted first answered for the semaphore, so with `pool#0` held
/// `acquire_until(now)` — and `acquire` with `retry_count(0)`, whose wait is zero — said `Held`
/// though permits 1 and 2 were free). In both faces; `Held` still when every permit is held.
#[test]
fn past_its_deadline_an_acquire_still_attempts_every_permit() {
    let servers = Cluster::start(3);
    let holder = handle(&servers);
    let taken = holder.lock("pool#0").unwrap();
    let redlock = handle(&servers);
    let no_wait = builder(&servers).retry_count(0).build().unwrap();
    assert_eq!(no_wait.config().lock_wait(), Duration::ZERO);
    // Each a fresh semaphore, whose first pick is permit 0.
    let sem = redlock.semaphore("pool", 3).unwrap();
    let permit = sem.acquire_until(Instant::now()).unwrap();
    assert_eq!(sem.permit_of(&permit), Some(1));
    redlock.unlock(permit).unwrap();
    until_free(&servers, "pool#1");
    let sem = no_wait.semaphore("pool", 3).unwrap();
    let permit = sem.acquire().unwrap();
    assert_eq!(sem.permit_of(&permit), Some(1));
    no_wait.unlock(permit).unwrap();
    until_free(&servers, "pool#1");
    let sem = no_wait.semaphore("pool", 3).unwrap();
    let got = sem.with_permit(|kept| sem.permit_of(&kept.lock())).unwrap();
    assert_eq!(got, Some(1));
    until_free(&servers, "pool#1");
    let async_face = AsyncRedlock::from(redlock.clone());
    let async_no_wait = AsyncRedlock::from(no_wait.clone());
    // The async face's race of the other permits resolves to the first won, which may be
    // permit 2 (its outcome can come first: 4 runs in 12 here under load).
    futures::executor::block_on(async {
        let sem = async_face.semaphore("pool", 3).unwrap();
        let permit = sem.acquire_until(Instant::now()).await.unwrap();
        let key = String::from_utf8(permit.resource().to_vec()).unwrap();
        assert!(matches!(sem.permit_of(&permit), Some(1 | 2)), "{key}");
        async_face.unlock(permit).await.unwrap();
        until_free(&servers, &key);
        let sem = async_no_wait.semaphore("pool", 3).unwrap();
        let permit = sem.acquire().await.unwrap();
        assert!(matches!(sem.permit_of(&permit), Some(1 | 2)));
        async_no_wait.unlock(permit).await.unwrap();
    });
    // Every permit held: `Held`, at once.
    let more = [
        holder.lock("pool#1").unwrap(),
        holder.lock("pool#2").unwrap(),
    ];
    let sem = redlock.semaphore("pool", 3).unwrap();
    let e = sem.acquire_until(Instant::now()).unwrap_err();
    assert!(matches!(e, Error::Held(_)), "{e}");
    let sem = async_face.semaphore("pool", 3).unwrap();
    let e = futures::executor::block_on(sem.acquire_until(Instant::now())).unwrap_err();
    assert!(matches!(e, Error::Held(_)), "{e}");
    for lock in more.into_iter().chain([taken]) {
        holder.unlock(lock).unwrap();
    }
}

/// Waits (bounded) until a client is subscribed to `channel` on `server`.
fn until_subscribed(server: &Server, channel: &str) {
    let deadline = deadline();
    while server.subscribers(channel) == 0 {
        assert!(
            Instant::now() < deadline,
            "nobody subscribed to {channel} on {}",
            server.addr()
        );
        std::thread::yield_now();
    }
}

/// A client's wait for a permit that reaches its deadline while it waits on one permit
/// answers with what that wait saw last, not with the attempt on every permit before it
/// (the newer error was dropped). `last#0` is held elsewhere on all three
/// nodes, then freed on node 2 while the client waits: `Held`, refused by two nodes, not three.
#[test]
fn a_client_wait_ending_at_its_deadline_reports_its_last_attempt() {
    let servers = Cluster::start(3);
    for s in servers.iter() {
        s.cmd(&["SET", "last#0", "foreign", "NX", "PX", "60000"]);
    }
    // A retry pause longer than the wait: one attempt on every permit, then one wait.
    let mut client = builder(&servers)
        .retry_delay(Duration::from_secs(30), Duration::ZERO)
        .build_client()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    let waiter = std::thread::spawn(move || client.acquire_permit_until("last", 1, until));
    until_marked(&servers, "last#0");
    until_subscribed(&servers[2], "redlock:released:last#0");
    servers[2].cmd(&["DEL", "last#0"]);
    servers[2].cmd(&["PUBLISH", "redlock:released:last#0", "0"]);
    match waiter.join().unwrap() {
        Err(Error::Held(report)) => assert_eq!(report.refused().count(), 2, "{report}"),
        other => panic!("expected Held, got {other:?}"),
    }
}
