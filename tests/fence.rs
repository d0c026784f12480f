//! Fencing tokens (issue 17) against real servers: fences grow across clients and resources,
//! and a node restarted empty between two holders never brings a fence down.

use std::time::Duration;

use redis_local::Cluster;
use redlock_mux::{Builder, Client, Error, FENCE_KEY, NodeFault};

fn fenced(servers: &Cluster, ttl: Duration) -> Client {
    Builder::new(servers.urls())
        .ttl(ttl)
        .fencing(true)
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .retry_count(0)
        .build_client()
        .unwrap()
}

/// The counter a node holds (0 when absent).
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
            let blank: Vec<_> = report
                .failed()
                .filter(|(_, f)| matches!(f, NodeFault::FenceBlank))
                .collect();
            assert_eq!(blank.len(), 1, "{report}");
            assert_eq!(blank[0].0.to_string(), servers[1].addr(), "{report}");
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

    // Up for the window (1 s; uptime is counted in whole seconds): an acquire whose first round
    // trip it answers before the decision seeds it (on a loaded machine it may answer after the
    // quorum: the next acquire then). Bounded: it must happen within a few.
    servers[1].wait_uptime(2);
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
