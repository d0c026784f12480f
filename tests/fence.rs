//! Fencing tokens against real servers: fences grow across clients and resources,
//! and a node restarted empty between two holders never brings a fence down. The repair of
//! blank counters: a majority restarted empty refuses fences until it is
//! repaired, the repair's refusals (no floor, inside the seed window, short of a quorum), and
//! repairs racing fenced acquires. Every counter blank but seeded before is no new deployment;
//! a fake server's negative uptime leaves its process known.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_local::{Cluster, Event, FakeServer, Peer};
use redlock_mux::{Builder, Client, Error, FENCE_KEY, FenceFloor, NodeFault, Report};

fn fenced(servers: &Cluster, ttl: Duration) -> Client {
    let mut client = Builder::new(servers.urls())
        .ttl(ttl)
        .fencing(true)
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .retry_count(0)
        .build_client()
        .unwrap();
    // Connected before the first lock: its 50 ms node timeout is for the round, not for
    // connecting and the handshake on a loaded machine (it once timed out on all three).
    client.connect(Duration::from_secs(5));
    client
}

/// The counter a node holds (0 when absent).
/// The nodes a refused fence's report names blank (`NodeFault::FenceBlank`), as `host:port`.
fn blank_nodes(report: &Report) -> Vec<String> {
    (report.failed())
        .filter(|(_, f)| matches!(f, NodeFault::FenceBlank))
        .map(|(node, _)| node.to_string())
        .collect()
}

fn counter(servers: &Cluster, i: usize) -> u64 {
    match servers[i].cmd(&["HGET", FENCE_KEY, "n"]) {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse().unwrap(),
        redis::Value::Nil => 0,
        other => panic!("HGET {FENCE_KEY} n: {other:?}"),
    }
}

#[test]
fn fences_grow_across_clients_and_resources_and_ride_on_the_lock() {
    let servers = Cluster::start(3);
    let mut a = fenced(&servers, Duration::from_secs(10));
    let mut b = fenced(&servers, Duration::from_secs(10));
    let mut last = 0;
    for i in 0..12 {
        let c = if i % 2 == 0 { &mut a } else { &mut b };
        let mut lock = c.try_lock(format!("fenced:{}", i % 3)).unwrap();
        let fence = lock.fence().expect("a fenced lock has a fence");
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        // Written back to a quorum before it was handed out (the third node's write-back may
        // still be on its way).
        let holding = (0..3).filter(|&i| counter(&servers, i) == fence).count();
        assert!(holding >= 2, "fence {fence} on {holding} nodes");
        // An extend keeps the acquisition's fence; a release leaves the counter alone.
        c.extend(&mut lock, Duration::from_secs(10)).unwrap();
        assert_eq!(lock.fence(), Some(fence));
        c.unlock(lock).unwrap();
        let top = (0..3).map(|i| counter(&servers, i)).max();
        assert_eq!(top, Some(fence));
    }
    // The counter is one key per node, whatever the resources.
    for node in 0..3 {
        match servers[node].cmd(&["KEYS", "redlock:*"]) {
            redis::Value::Array(keys) => assert_eq!(keys.len(), 1, "node {node}: {keys:?}"),
            other => panic!("KEYS: {other:?}"),
        }
    }
    // Status reads it, seeded for the process that answers; the last fence is on a quorum (a
    // node whose release of the previous holder's key was still on its way when the next one
    // locked did not grant that lock, and missed its write-back).
    let status = a.status(b"fenced:0", Duration::from_secs(1));
    let mut on_last = 0;
    for s in &status {
        let f = s.fence.expect("status reads the counter");
        assert!(f.seeded && f.counter <= last, "{s:?}");
        on_last += usize::from(f.counter == last);
    }
    assert!(on_last >= 2, "{status:?}");
    // The counter's key is no resource name.
    assert!(matches!(
        a.try_lock(FENCE_KEY),
        Err(Error::ReservedName { .. })
    ));
    // Without fencing: no fence, no counter touched (fenced locks' write-backs are all
    // answered: the status above came after them on every connection).
    let before: Vec<u64> = (0..3).map(|i| counter(&servers, i)).collect();
    let mut plain = Builder::new(servers.urls())
        .quarantine(None)
        .build_client()
        .unwrap();
    let lock = plain.try_lock("plain").unwrap();
    assert_eq!(lock.fence(), None);
    plain.unlock(lock).unwrap();
    let after: Vec<u64> = (0..3).map(|i| counter(&servers, i)).collect();
    assert_eq!(before, after);
}

/// The example: A's fence reaches nodes 0 and 1 only (node 2 frozen), node 1 then
/// restarts empty. With node 0 silent, B's quorum {1, 2} would see at most node 2's older
/// counter — the fence would not grow. B gets no fence instead; once node 0 answers, a greater
/// one; and node 1 is seeded again once up for a window.
#[test]
fn a_node_restarted_empty_between_holders_never_brings_the_fence_down() {
    let mut servers = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let mut a = fenced(&servers, ttl);
    let mut b = fenced(&servers, ttl);
    let warm = a.try_lock("warm").unwrap();
    let first = warm.fence().unwrap();
    a.unlock(warm).unwrap();

    servers[2].freeze();
    let lock = a.try_lock("x").unwrap();
    let fence_a = lock.fence().unwrap();
    a.unlock(lock).unwrap();
    servers[2].resume();
    assert_eq!(counter(&servers, 0), fence_a);
    assert!(
        counter(&servers, 2) < fence_a,
        "node 2 missed A's fence: the dangerous case"
    );

    servers[1].restart();
    servers[0].freeze();
    match b.try_lock("x") {
        Err(Error::Fence(report)) => {
            assert_eq!(blank_nodes(&report), [servers[1].addr()], "{report}");
            // One blank of three, one silent: no repair needed, node 1 is seeded again.
            assert!(!report.to_string().contains("repair-fences"), "{report}");
        }
        other => panic!("expected no fence rather than one ≤ {fence_a}: {other:?}"),
    }
    // The lock was released: with node 0 back, B gets it, with a greater fence.
    servers[0].resume();
    let lock = b.try_lock("x").unwrap();
    let fence_b = lock.fence().unwrap();
    assert!(
        fence_b > fence_a && fence_a > first,
        "{first} {fence_a} {fence_b}"
    );
    b.unlock(lock).unwrap();
    let fresh = b.status(b"x", Duration::from_secs(1));
    assert!(!fresh[1].fence.unwrap().seeded, "{fresh:?}");

    // Up for the window (1 s; the uptime, rounded up by up to a second, is read a second
    // short): an acquire whose first round trip it answers before the decision seeds it (on a
    // loaded machine it may answer after the quorum: the next acquire then). Bounded: it must
    // happen within a few.
    servers[1].wait_uptime(3);
    let mut last = fence_b;
    for attempt in 0.. {
        let lock = b.try_lock("x").unwrap();
        let fence = lock.fence().unwrap();
        assert!(fence > last);
        last = fence;
        b.unlock(lock).unwrap();
        let status = b.status(b"x", Duration::from_secs(1));
        let f = status[1].fence.unwrap();
        if f.seeded {
            assert!(f.counter >= fence_b && f.counter <= last, "{status:?}");
            break;
        }
        assert!(attempt < 20, "node 1 never re-seeded: {status:?}");
    }
}

/// Every node restarted (without persistence) is a new deployment to the client: fences begin
/// again at 1 — which is why the README's assumption says that a majority keeps its counter.
/// With one restarted, the others carry the count.
#[test]
fn one_restarted_node_is_carried_by_the_others() {
    let mut servers = Cluster::start(3);
    let mut a = fenced(&servers, Duration::from_secs(1));
    let lock = a.try_lock("y").unwrap();
    let before = lock.fence().unwrap();
    a.unlock(lock).unwrap();
    servers[0].restart();
    let lock = a.try_lock("y").unwrap();
    assert!(lock.fence().unwrap() > before);
    a.unlock(lock).unwrap();
}

/// Outside assumption A2, but detectable: every counter blank while its hash still names the
/// process that seeded it — a snapshot restored after fences above its value were handed out
/// (N = 1, or every server, restarted from RDB/AOF). That is no new deployment: the client
/// handed out 1 + the stale value (here 3, after fences up to 4 or more) and seeded every
/// node with it. It refuses with `Error::Fence`, pointing at the repair with
/// a floor, writes nothing, and fences go on above the floor once repaired.
#[test]
fn every_counter_blank_but_seeded_before_is_no_new_deployment() {
    let servers = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let mut a = fenced(&servers, ttl);
    let mut last = 0;
    for i in 0..4 {
        let lock = a.try_lock(format!("s{i}")).unwrap();
        last = lock.fence().unwrap();
        a.unlock(lock).unwrap();
    }
    assert!(last >= 4, "{last}");
    // Each counter as an old snapshot left it: an earlier process's run_id, a value below
    // fences handed out since.
    let old_run = "0".repeat(40);
    for i in 0..3 {
        servers[i].cmd(&["HSET", FENCE_KEY, "run", &old_run, "n", "2"]);
    }
    match a.try_lock("s0") {
        Err(Error::Fence(report)) => {
            assert_eq!(blank_nodes(&report).len(), 3, "{report}");
            let text = report.to_string();
            assert!(
                text.contains("seeded by an earlier server process"),
                "{text}"
            );
            assert!(text.contains("redlock repair-fences --at-least"), "{text}");
        }
        Ok(lock) => panic!("handed out fence {:?} after {last}", lock.fence()),
        Err(other) => panic!("expected Error::Fence: {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(
            raw_counter(&servers, i),
            Some((old_run.clone(), "2".into())),
            "node {i} written"
        );
    }
    // The repair the message names: a floor above every fence handed out (the servers up for
    // the 1 s seed window, read a second short).
    for i in 0..3 {
        servers[i].wait_uptime(3);
    }
    let floor = last + 100;
    let done = repairer(&servers, ttl)
        .repair_fences(FenceFloor::AtLeast(floor), Duration::from_secs(2))
        .expect("repaired with a floor");
    assert_eq!((done.seeded_read, done.repaired, done.value), (0, 3, floor));
    let lock = a.try_lock("s0").expect("fenced again");
    assert!(lock.fence().unwrap() > floor, "{:?}", lock.fence());
}

/// A counter at `u64::MAX` (raised by a repair's floor, or by hand): no greater fence exists.
/// `Error::Fence` said only "3 of 3 nodes said yes, 2 needed", nothing about why (found by
/// review); it says the counter is exhausted.
#[test]
fn an_exhausted_counter_says_so() {
    let servers = Cluster::start(3);
    let mut a = fenced(&servers, Duration::from_secs(1));
    let lock = a.try_lock("e").unwrap();
    a.unlock(lock).unwrap();
    let max = u64::MAX.to_string();
    for i in 0..3 {
        servers[i].cmd(&["HSET", FENCE_KEY, "n", &max]);
    }
    match a.try_lock("e") {
        Err(Error::Fence(report)) => {
            assert!(
                report
                    .to_string()
                    .contains("the fence counter is exhausted"),
                "{report}"
            );
        }
        other => panic!("expected Error::Fence: {other:?}"),
    }
}

/// A client for repairs: fencing on (the repair learns the run_ids as fenced acquires do), a
/// seed window of `window` (the fenced clients' longest TTL, or more).
fn repairer(servers: &Cluster, window: Duration) -> Client {
    Builder::new(servers.urls())
        .ttl(window)
        .fencing(true)
        .quarantine(Some(window))
        .build_client()
        .unwrap()
}

/// The counter's hash on node `i`: `(run, n)` as stored, `None` when the key is absent.
fn raw_counter(servers: &Cluster, i: usize) -> Option<(String, String)> {
    match servers[i].cmd(&["HMGET", FENCE_KEY, "run", "n"]) {
        redis::Value::Array(v) => match v.as_slice() {
            [redis::Value::BulkString(r), redis::Value::BulkString(n)] => Some((
                String::from_utf8(r.clone()).unwrap(),
                String::from_utf8(n.clone()).unwrap(),
            )),
            [redis::Value::Nil, redis::Value::Nil] => None,
            other => panic!("HMGET {FENCE_KEY}: {other:?}"),
        },
        other => panic!("HMGET {FENCE_KEY}: {other:?}"),
    }
}

/// Issue 36, item 2: a majority of 5 restarted empty (SIGKILL, same port). Fenced acquires
/// refuse with `Error::Fence` — and before the repair existed they kept refusing after the
/// restarted servers had been up for the seed window (nothing seeds a blank counter but a
/// quorum of seeded ones). The repair refuses without a floor and inside the window, then with
/// a floor re-seeds all five, and fences continue above the floor and every earlier fence.
#[test]
fn a_majority_restarted_empty_is_repaired_with_a_floor() {
    let mut servers = Cluster::start(5);
    let ttl = Duration::from_secs(1);
    let mut a = fenced(&servers, ttl);
    let mut last = 0;
    for i in 0..6 {
        let lock = a.try_lock(format!("r{}", i % 3)).unwrap();
        last = last.max(lock.fence().unwrap());
        a.unlock(lock).unwrap();
    }
    // The two servers that will not restart hold the highest fence their write-backs reached:
    // `last`, or less for one that answered an acquire after its quorum had (it is not
    // written to; on a loaded machine both once held 1 of 6).
    let seeded_max = (3..5).map(|i| counter(&servers, i)).max().unwrap();
    assert!((1..=last).contains(&seeded_max), "{seeded_max} of {last}");
    for i in 0..3 {
        servers[i].restart();
    }
    // A client that never saw the old processes (a fresh process after the incident).
    let mut b = fenced(&servers, ttl);
    match b.try_lock("r0") {
        Err(Error::Fence(report)) => {
            assert_eq!(blank_nodes(&report).len(), 3, "{report}");
            // Nothing but a repair seeds them: the text says so (it said each would be seeded
            // again once up for a restart window).
            let text = report.to_string();
            assert!(text.contains("too many fence counters are blank"), "{text}");
            assert!(text.contains("run `redlock repair-fences`"), "{text}");
        }
        other => panic!("expected Error::Fence with 3 blank counters: {other:?}"),
    }

    // Inside the seed window (a 30 s window, servers restarted just now): the blank counters
    // may still take the write-back of an acquire that began before the restart. Refused,
    // nothing written.
    let floor = last + 1_000;
    let mut early = repairer(&servers, Duration::from_secs(30));
    match early.repair_fences(FenceFloor::AtLeast(floor), Duration::from_secs(2)) {
        Err(Error::FenceRepair(r)) => {
            assert_eq!(r.repaired, 0, "{r}");
            for (i, node) in r.nodes.iter().enumerate() {
                if i < 3 {
                    assert!(
                        matches!(node.fault, Some(NodeFault::SeedWindow(left)) if left > Duration::from_secs(20)),
                        "{r}"
                    );
                    assert_eq!((node.before, node.seeded), (Some(0), false));
                } else {
                    assert_eq!(node.fault, None, "{r}");
                    assert!(node.seeded && node.before.is_some_and(|n| n <= last));
                }
                assert_eq!(node.after, None, "{r}");
            }
        }
        other => panic!("expected a refusal inside the seed window: {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(raw_counter(&servers, i), None, "node {i} written");
    }

    for i in 0..3 {
        servers[i].wait_uptime(3);
    }
    // Up for the window, and still refused: the lasting refusal of the issue.
    assert!(matches!(b.try_lock("r0"), Err(Error::Fence(_))));

    let mut repair = repairer(&servers, ttl);
    // Without a floor, only 2 of 5 counters are seeded: their maximum need not cover every
    // fence handed out. Refused, nothing written.
    match repair.repair_fences(FenceFloor::SeededQuorum, Duration::from_secs(2)) {
        Err(Error::FenceRepair(r)) => {
            assert!(r.needs_floor, "{r}");
            assert_eq!((r.seeded_read, r.repaired, r.quorum), (2, 0, 3), "{r}");
            assert_eq!(r.highest_read, seeded_max, "{r}");
        }
        other => panic!("expected a refusal without a floor: {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(raw_counter(&servers, i), None, "node {i} written");
    }

    let done = repair
        .repair_fences(FenceFloor::AtLeast(floor), Duration::from_secs(2))
        .expect("repaired");
    assert_eq!(
        (done.repaired, done.value, done.highest_read),
        (5, floor, seeded_max)
    );
    assert_eq!(done.seeded_read, 2);
    for (i, node) in done.nodes.iter().enumerate() {
        assert_eq!(node.after, Some(floor), "{done:?}");
        assert_eq!(node.fault, None, "{done:?}");
        assert_eq!(node.seeded, i >= 3, "{done:?}");
    }
    // Every counter is seeded (for the process answering) at the floor.
    for s in b.status(b"r0", Duration::from_secs(1)) {
        let f = s.fence.expect("status reads the counter");
        assert!(f.seeded && f.counter == floor, "{s:?}");
    }
    // Fences go on above the floor and above every fence handed out before.
    let mut previous = floor;
    for i in 0..4 {
        let lock = b.try_lock(format!("r{}", i % 3)).expect("fenced again");
        let fence = lock.fence().unwrap();
        assert!(fence > previous && fence > last, "{fence} after {previous}");
        previous = fence;
        b.unlock(lock).unwrap();
    }
    // A repair never lowers a counter: again with a lower floor, the counters keep theirs.
    let again = repair
        .repair_fences(FenceFloor::AtLeast(1), Duration::from_secs(2))
        .unwrap();
    assert!(again.value >= previous && again.nodes.iter().all(|n| n.after >= Some(previous)));
}

/// The first case: a minority restarted and up for the window, but no fenced acquire
/// re-seeded it. Without a floor the repair reads a quorum of seeded counters — their maximum
/// covers every fence handed out — and seeds the blank one at once.
#[test]
fn a_minority_left_blank_is_repaired_without_a_floor() {
    let mut servers = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let mut a = fenced(&servers, ttl);
    let lock = a.try_lock("m").unwrap();
    let last = lock.fence().unwrap();
    a.unlock(lock).unwrap();
    servers[2].restart();
    servers[2].wait_uptime(3);
    let done = repairer(&servers, ttl)
        .repair_fences(FenceFloor::SeededQuorum, Duration::from_secs(2))
        .expect("repaired without a floor");
    assert_eq!((done.seeded_read, done.repaired, done.value), (2, 3, last));
    assert_eq!(
        (done.nodes[2].before, done.nodes[2].seeded),
        (Some(0), false)
    );
    assert_eq!(done.nodes[2].after, Some(last));
    let (run, n) = raw_counter(&servers, 2).expect("seeded");
    assert_eq!((run.len(), n), (40, last.to_string()));
    let lock = a.try_lock("m").unwrap();
    assert!(lock.fence().unwrap() > last);
}

/// A repair that goes ahead on the others leaves a blank counter inside its seed window blank:
/// an acquire that began before that server's restart may still be writing its fence back to
/// the others, and a counter seeded below it would let a later acquire hand the same fence out
/// again. It was written (seeded at the value) while its report said "held back" (found by
/// review).
#[test]
fn a_repair_leaves_a_counter_in_its_seed_window_blank() {
    let mut servers = Cluster::start(5);
    let ttl = Duration::from_secs(1);
    let mut a = fenced(&servers, ttl);
    let lock = a.try_lock("w").unwrap();
    let last = lock.fence().unwrap();
    a.unlock(lock).unwrap();
    servers[4].restart();
    // A 30 s window: node 4, just restarted, is inside it.
    let done = repairer(&servers, Duration::from_secs(30))
        .repair_fences(FenceFloor::SeededQuorum, Duration::from_secs(2))
        .expect("repaired on the four others");
    assert!(
        matches!(done.nodes[4].fault, Some(NodeFault::SeedWindow(_))),
        "{done}"
    );
    assert_eq!(done.nodes[4].after, None, "{done}");
    assert!(done.repaired >= 3, "{done}");
    assert!(done.value <= last, "{done}");
    assert_eq!(
        raw_counter(&servers, 4),
        None,
        "node 4 seeded inside its window"
    );
}

/// Fewer than a quorum reachable (two killed, one frozen past the timeout): a typed error
/// naming every node that failed, and nothing written on the two that answered. A handle
/// without fencing cannot repair at all.
#[test]
fn a_repair_short_of_a_quorum_fails_and_writes_nothing() {
    let mut servers = Cluster::start(5);
    let mut a = fenced(&servers, Duration::from_secs(1));
    let lock = a.try_lock("q").unwrap();
    a.unlock(lock).unwrap();
    let before: Vec<_> = (3..5).map(|i| raw_counter(&servers, i)).collect();
    servers[0].kill();
    servers[1].kill();
    servers[2].freeze();
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let result = repairer(&servers, Duration::from_secs(1))
        .repair_fences(FenceFloor::AtLeast(1_000_000), timeout);
    let took = started.elapsed();
    servers[2].resume();
    match result {
        Err(e @ Error::FenceRepair(_)) => {
            let Error::FenceRepair(r) = &e else {
                unreachable!()
            };
            assert_eq!(r.repaired, 0, "{r}");
            assert!(!r.needs_floor, "{r}");
            for (i, node) in r.nodes.iter().enumerate() {
                match i {
                    0 | 1 => assert!(
                        matches!(
                            node.fault.as_ref().map(NodeFault::root),
                            Some(NodeFault::Io(_))
                        ),
                        "{r}"
                    ),
                    2 => assert_eq!(node.fault, Some(NodeFault::Timeout), "{r}"),
                    _ => assert!(node.fault.is_none() && node.before.is_some(), "{r}"),
                }
                assert_eq!(node.after, None, "{r}");
            }
            let message = e.to_string();
            for i in 0..3 {
                assert!(message.contains(&servers[i].addr()), "{message}");
            }
            // Servers that are down may come back: worth trying again.
            assert!(!e.is_permanent(), "{e}");
        }
        other => panic!("expected Error::FenceRepair: {other:?}"),
    }
    // The frozen node was waited for the timeout, not longer (generously bounded: a loaded
    // machine).
    assert!(took >= timeout && took < timeout * 10, "{took:?}");
    let after: Vec<_> = (3..5).map(|i| raw_counter(&servers, i)).collect();
    assert_eq!(before, after, "nothing written short of a quorum");

    let mut plain = Builder::new(servers.urls())
        .quarantine(None)
        .build_client()
        .unwrap();
    assert!(matches!(
        plain.repair_fences(FenceFloor::SeededQuorum, timeout),
        Err(Error::Config(_))
    ));
}

/// Repairs racing fenced acquires on a shared handle: every pair of acquisitions where one
/// returned before the other began has its fences in that order (G1), and an acquisition that
/// began after a repair returned has a fence above the repair's value.
#[test]
fn repairs_racing_fenced_acquires_keep_fences_in_order() {
    let servers = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let handle = Builder::new(servers.urls())
        .ttl(ttl)
        .fencing(true)
        .quarantine(None)
        .build()
        .unwrap();
    let lock = handle.try_lock("warm").unwrap();
    handle.unlock(lock).unwrap();
    let t0 = Instant::now();
    // (began, returned, fence) per acquisition; (returned, value) per repair.
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let repaired = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for t in 0..2 {
            let (handle, acquired) = (handle.clone(), acquired.clone());
            scope.spawn(move || {
                for i in 0..40 {
                    let began = t0.elapsed();
                    if let Ok(lock) = handle.try_lock(format!("race:{t}:{}", i % 4)) {
                        let returned = t0.elapsed();
                        acquired
                            .lock()
                            .unwrap()
                            .push((began, returned, lock.fence().unwrap()));
                        handle.unlock(lock).unwrap();
                    }
                }
            });
        }
        let (handle, repaired) = (handle.clone(), repaired.clone());
        scope.spawn(move || {
            for i in 0..12u64 {
                // Without a floor (every counter seeded), and with floors that jump ahead.
                let floor = if i % 3 == 2 {
                    FenceFloor::AtLeast(1_000 * i)
                } else {
                    FenceFloor::SeededQuorum
                };
                let done = handle.repair_fences(floor, Duration::from_secs(2)).unwrap();
                repaired.lock().unwrap().push((t0.elapsed(), done.value));
            }
        });
    });
    let acquired = acquired.lock().unwrap();
    let repaired = repaired.lock().unwrap();
    assert!(
        acquired.len() >= 40,
        "too few acquisitions: {}",
        acquired.len()
    );
    for a in acquired.iter() {
        for b in acquired.iter().filter(|b| b.0 > a.1) {
            assert!(b.2 > a.2, "{a:?} then {b:?}");
        }
        for r in repaired.iter().filter(|r| a.0 > r.0) {
            assert!(a.2 > r.1, "repair {r:?} then {a:?}");
        }
    }
}

/// A blank counter is seeded by the next fenced lock's write-back, also on a node that refused
/// that lock — there the resource's key may be another kind's: readers' sorted set. The
/// write-back's read of the key failed with WRONGTYPE there, so a node whose
/// fenced traffic is all for read-locked names stayed blank; now it reads "not ours".
#[test]
fn a_blank_counter_is_seeded_where_the_resource_is_read_locked() {
    let servers = Cluster::start(3);
    // A blank counter is seeded once its node has surely been up a window (here the TTL).
    let mut a = fenced(&servers, Duration::from_secs(1));
    let lock = a.try_lock("first").unwrap();
    a.unlock(lock).unwrap();
    servers[2].wait_uptime(3);
    servers[2].cmd(&["DEL", FENCE_KEY]);
    servers[2].cmd(&["ZADD", "x", "1", "a reader"]);
    // Seeded by the write-back of an acquire whose counter read found node 2 blank. On a
    // loaded machine node 2's read may come after the acquire was decided on the other two
    // (then that acquire seeds nothing there), or its write-back after the release returned
    // (a release waits for a slow node only its grace): CI failed once so. A few acquires,
    // then a bounded wait for the write-back.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    let (run, n) = loop {
        let lock = a.try_lock("x").unwrap();
        a.unlock(lock).unwrap();
        let answered = std::time::Instant::now() + Duration::from_millis(200);
        while std::time::Instant::now() < answered && raw_counter(&servers, 2).is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(seeded) = raw_counter(&servers, 2) {
            break seeded;
        }
        assert!(std::time::Instant::now() < give_up, "node 2 never seeded");
    };
    assert_eq!((run.len(), n), (40, counter(&servers, 0).to_string()));
}

/// The run_id a fake server's `INFO server` gives.
const FAKE_RUN_ID: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// A fake server (N = 1) with no fence counter yet: a new deployment. Its `INFO server` says
/// `uptime_in_seconds:<uptime>`; it answers a fenced acquire's script (7 arguments, the
/// counter's key 5th) with a free lock and no counter, the fence's write-back (9 arguments)
/// with `write_back`, and any other script (the release) with 1.
fn new_deployment(
    uptime: &'static str,
    write_back: &'static [u8],
) -> impl Fn(&mut Peer) + Send + Sync + 'static {
    move |p: &mut Peer| {
        let info = format!("# Server\r\nrun_id:{FAKE_RUN_ID}\r\nuptime_in_seconds:{uptime}\r\n");
        while let Some(cmd) = p.command() {
            let verb = cmd.first().map_or(&[][..], Vec::as_slice);
            let script = matches!(verb, b"EVAL" | b"EVALSHA");
            let fence = cmd.get(4).is_some_and(|k| k == FENCE_KEY.as_bytes());
            let reply = match verb {
                b"INFO" => format!("${}\r\n{info}\r\n", info.len()).into_bytes(),
                _ if script && fence && cmd.len() == 7 => {
                    b"*3\r\n:1\r\n$0\r\n\r\n$0\r\n\r\n".to_vec()
                }
                _ if script && fence && cmd.len() == 9 => write_back.to_vec(),
                _ if script => b":1\r\n".to_vec(),
                _ => b"-ERR unknown command\r\n".to_vec(),
            };
            if !p.send(&reply) {
                return;
            }
        }
    }
}

/// A negative uptime in `INFO server` threw the run_id away with it: the node was unknown, and
/// a fenced acquire failed with "no run_id from INFO server: fencing needs it (grant +info)" —
/// wrong advice. The run_id counts; the uptime is taken as 0. Here N = 1 and
/// the counter is blank with no `run`: a new deployment, fence 1, written back with that run_id.
#[test]
fn a_negative_uptime_leaves_the_process_known_to_fencing() {
    // `-3`, as Redis says (a signed `time_t`) once the server's clock stepped back.
    let fake = FakeServer::start(new_deployment("-3", b":1\r\n"));
    let mut c = Builder::new([fake.url()])
        // No INFO memory asked, as before the eviction check: the fake answers none.
        .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
        .ttl(Duration::from_secs(1))
        .fencing(true)
        .quarantine(None)
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build_client()
        .unwrap();
    let lock = match c.try_lock("res") {
        Ok(lock) => lock,
        Err(e) => panic!("not fenced: {e}"),
    };
    assert_eq!(lock.fence(), Some(1));
    let write_back = fake
        .seen()
        .into_iter()
        .find_map(|ev| match ev {
            Event::Command(_, cmd) if cmd.len() == 9 && cmd[4] == FENCE_KEY.as_bytes() => Some(cmd),
            _ => None,
        })
        .expect("the fence written back");
    assert_eq!(write_back[7], FAKE_RUN_ID.as_bytes());
    assert_eq!(write_back[8], b"1", "seeded: a new deployment");
}

/// A fenced acquire that won its quorum and whose fence write-back then lost holds the lock on
/// that quorum until its cleanup, a release of a lock won for nobody: with its notice, as
/// waiters of other clients refused by it wait for one. The cleanup judged the round by the
/// votes in the ballot — the write-back's by then (its round restarts the ballot's), lost — and
/// went quiet: such a waiter slept until its fallback poll. The release is
/// the script that publishes (its first use on the connection: `EVAL` with its body).
#[test]
fn a_fenced_lock_whose_write_back_lost_is_released_with_its_notice() {
    // Up for an hour; the write-back refused (`0`: our key gone there, as after a failover
    // between the two round trips).
    let fake = FakeServer::start(new_deployment("3600", b":0\r\n"));
    let redlock = Builder::new([fake.url()])
        // No INFO memory asked, as before the eviction check: the fake answers none.
        .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
        .ttl(Duration::from_secs(10))
        .fencing(true)
        .quarantine(None)
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .unwrap();
    match redlock.try_lock("res") {
        Err(Error::Fence(_)) => {}
        other => panic!("the write-back was refused: {other:?}"),
    }
    let release = fake.wait_for("the lock's release", |ev| {
        matches!(ev, Event::Command(_, cmd)
            if cmd[0] == b"EVAL" && cmd.len() <= 6 && cmd[3] == b"res")
    });
    let Event::Command(_, cmd) = release else {
        unreachable!()
    };
    let body = String::from_utf8_lossy(&cmd[1]);
    assert!(
        body.contains("publish"),
        "released without its notice: {body}"
    );
}
