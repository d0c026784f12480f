//! Node faults against real servers: killed, frozen, restarted, connections killed, scripts
//! flushed, a node sleeping past the TTL, and the restart quarantine that keeps a restarted node
//! out of quorums.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis_local::{Cluster, FakeServer, Peer, Server};
use redlock_mux::{Builder, Client, Error, NodeFault};

fn client(servers: &Cluster) -> Client {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(5))
        .build_client()
        .unwrap()
}

/// Keys of ours left on the live nodes, after the client has finished one more operation (its
/// releases are written before that operation's requests on each connection).
fn leftovers(c: &mut Client, servers: &Cluster, live: &[usize], key: &str) -> usize {
    if let Ok(lock) = c.try_lock("barrier") {
        let _ = c.unlock(lock);
    }
    live.iter()
        .filter(|&&i| servers[i].get(key).is_some())
        .count()
}

#[test]
fn one_of_five_killed_still_locks_without_connect_waits() {
    let mut servers = Cluster::start(5);
    let mut c = client(&servers);
    let lock = c.try_lock("warm").unwrap();
    c.unlock(lock).unwrap();
    servers[4].kill();
    let before = c.stats().io.connects;
    for _ in 0..100 {
        let lock = c.try_lock("r").unwrap();
        assert_eq!(c.unlock(lock).unwrap(), 4);
    }
    // Backoff: the dead node is retried a handful of times, not on each of 200 operations.
    let connects = c.stats().io.connects - before;
    assert!(connects <= 12, "{connects} connects");
}

#[test]
fn two_of_five_frozen_lock_at_quorum_and_their_late_replies_confuse_nothing() {
    let mut servers = Cluster::start(5);
    let mut c = client(&servers);
    let lock = c.try_lock("warm").unwrap();
    c.unlock(lock).unwrap();
    servers[3].freeze();
    servers[4].freeze();
    for i in 0..20 {
        let lock = c.try_lock(format!("r{i}")).unwrap();
        assert_eq!(c.unlock(lock).unwrap(), 3);
    }
    servers[3].resume();
    servers[4].resume();
    // Someone else now holds "x" on nodes 0-2. Late "+OK"s from the frozen nodes must not be
    // taken as answers to our SET of "x".
    for s in servers.iter().take(3) {
        s.set("x", "other");
    }
    assert!(matches!(c.try_lock("x"), Err(Error::Held(_))));
    // Once the resumed nodes have answered their backlog, they vote again, and every orphan key
    // they set late was released by the release pipelined behind it.
    let mut all_five = false;
    for _ in 0..200 {
        let lock = c.lock("y").unwrap();
        if c.unlock(lock).unwrap() == 5 {
            all_five = true;
            break;
        }
    }
    assert!(all_five);
    for i in 0..20 {
        assert_eq!(servers[3].get(&format!("r{i}")), None);
        assert_eq!(servers[4].get(&format!("r{i}")), None);
    }
}

#[test]
fn three_of_five_frozen_or_killed_is_no_quorum_in_bounded_time_and_leaves_nothing() {
    let mut servers = Cluster::start(5);
    let node_timeout = Duration::from_millis(30);
    let (delay, jitter, retries) = (Duration::from_millis(10), Duration::from_millis(10), 3);
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(node_timeout)
        .retry_count(retries)
        .retry_delay(delay, jitter)
        .build_client()
        .unwrap();
    let lock = c.try_lock("warm").unwrap();
    c.unlock(lock).unwrap();
    servers[0].freeze();
    servers[1].freeze();
    servers[2].kill();
    let t0 = Instant::now();
    let result = c.lock("r");
    let took = t0.elapsed();
    match &result {
        Err(Error::NoQuorum(report)) => {
            // The two live nodes at most: once the frozen ones are known silent, an attempt
            // is lost as soon as the rest cannot make a quorum, maybe before both answered.
            assert!(report.yes() <= 2, "{report}");
            let faults: Vec<String> = report.failed().map(|(n, f)| format!("{n}: {f}")).collect();
            assert_eq!(faults.len(), 3, "{faults:?}");
            let message = result.as_ref().unwrap_err().to_string();
            assert!(message.contains(&servers[2].addr()), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Bounded by the configuration (4 attempts × node timeout + 3 × (delay + jitter)); the slack
    // only proves it does not hang or wait for a connect timeout, it is not a speed claim.
    let bound = node_timeout * (retries + 1) + (delay + jitter) * retries;
    assert!(
        took < bound + Duration::from_secs(2),
        "{took:?} vs {bound:?}"
    );
    // Every attempt got OK from the two live nodes and released them.
    assert_eq!(leftovers(&mut c, &servers, &[3, 4], "r"), 0);
    servers[0].resume();
    servers[1].resume();
}

#[test]
fn client_kill_mid_use_is_survived() {
    let servers = Cluster::start(3);
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .client_name("victim")
        .build_client()
        .unwrap();
    // Every connection up first: a lock won by two nodes while node 0's handshake is still
    // under way would have its connection killed before it ever answered, which is a failed
    // connect (it backs off), not the working connection dropped that this test is about.
    assert_eq!(c.connect(Duration::from_secs(5)), 3);
    let lock = c.try_lock("a").unwrap();
    // Kill our connection on node 0 while we hold a lock.
    servers[0].cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    // The release notices the closed connection on node 0 and still releases on 1 and 2.
    let released = c.unlock(lock).unwrap();
    assert!(released >= 2, "{released}");
    // The key on node 0 stays until its TTL (its connection was gone); the next operations
    // reconnect transparently.
    // (Bounded by time, not by a count of cycles: a cycle takes well under a millisecond.)
    let mut three = false;
    let give_up = Instant::now() + Duration::from_secs(10);
    while Instant::now() < give_up {
        let lock = c.lock("b").unwrap();
        if c.unlock(lock).unwrap() == 3 {
            three = true;
            break;
        }
    }
    assert!(three, "node 0 never came back");
}

#[test]
fn a_node_sleeping_past_the_ttl_while_acquiring_means_not_acquired_and_released() {
    let s = Server::builder()
        .arg("--enable-debug-command")
        .arg("yes")
        .start();
    let mut c = Builder::new([s.url()])
        .quarantine(None)
        .ttl(Duration::from_millis(200))
        .node_timeout(Duration::from_secs(2))
        .build_client()
        .unwrap();
    let lock = c.try_lock("warm").unwrap();
    c.unlock(lock).unwrap();
    let mut admin = TcpStream::connect(s.socket_addr()).unwrap();
    admin
        .write_all(&redis_local::resp_encode(&["DEBUG", "SLEEP", "0.5"]))
        .unwrap();
    // Wait until the server is really asleep: a PING goes unanswered.
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis_local::raw_ping(&s.addr(), Duration::from_millis(50)).is_ok() {
        assert!(Instant::now() < deadline, "DEBUG SLEEP never started");
    }
    match c.try_lock("r") {
        Err(Error::TooSlow(report)) => assert_eq!(report.yes(), 0),
        other => panic!("{other:?}"),
    }
    // After the sleep the SET is executed, then the release behind it: nothing is left.
    let mut reply = [0u8; 5];
    std::io::Read::read_exact(&mut admin, &mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
    let lock = c.lock("barrier").unwrap();
    c.unlock(lock).unwrap();
    assert_eq!(s.get("r"), None);
}

#[test]
fn a_node_in_backoff_is_reported_with_its_last_fault() {
    let mut servers = Cluster::start(3);
    let mut c = client(&servers);
    let lock = c.try_lock("a").unwrap();
    c.unlock(lock).unwrap();
    servers[1].kill();
    servers[2].kill();
    let mut seen_backoff = false;
    for _ in 0..5 {
        match c.try_lock("a") {
            Err(Error::NoQuorum(report)) => {
                for (_, fault) in report.failed() {
                    if let NodeFault::Backoff(last) = fault {
                        seen_backoff = true;
                        assert!(
                            matches!(**last, NodeFault::Io(_) | NodeFault::Closed),
                            "{last}"
                        );
                    }
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(seen_backoff);
}

#[test]
fn restart_quarantine_prevents_the_double_grant_that_happens_without_it() {
    let mut servers = Cluster::start(5);
    let ttl = Duration::from_millis(1_500);
    let window = Some(ttl);
    // Room for a loaded machine: the default node timeout (50 ms here) once failed every node
    // of an attempt with "no reply in time" at a load average of 8.7 on 2 cores. Connections
    // are warmed before each client's first attempt for the same reason.
    let node_timeout = Duration::from_millis(500);
    let warm = |c: &mut redlock_mux::Client| {
        assert_eq!(
            c.connect(Duration::from_secs(10)),
            5,
            "every node connected"
        );
    };
    for s in servers.iter() {
        s.wait_uptime(3);
    }
    // Client A gets exactly 3 of 5: a stale holder still sits on nodes 3 and 4.
    servers[3].set("res", "stale");
    servers[4].set("res", "stale");
    let mut a = Builder::new(servers.urls())
        .ttl(ttl)
        .node_timeout(node_timeout)
        .quarantine(window)
        .build_client()
        .unwrap();
    warm(&mut a);
    let lock = a.try_lock("res").unwrap();
    let token = lock.token().to_string();
    for i in 0..3 {
        assert_eq!(servers[i].get("res").as_deref(), Some(token.as_str()));
    }
    // Node 0 restarts without persistence and forgets A's key; the stale keys on 3 and 4 expire.
    servers[0].restart();
    servers[3].cmd(&["DEL", "res"]);
    servers[4].cmd(&["DEL", "res"]);

    // B with quarantine on: node 0 says yes but does not count; nodes 1 and 2 refuse. Not until
    // A's validity has run out.
    let mut b = Builder::new(servers.urls())
        .ttl(ttl)
        .node_timeout(node_timeout)
        .quarantine(window)
        .build_client()
        .unwrap();
    warm(&mut b);
    let mut attempts = 0;
    while lock.is_valid() {
        match b.try_lock("res") {
            Ok(stolen) => panic!("B acquired while A still held it: {stolen:?}"),
            Err(Error::Held(report)) => {
                attempts += 1;
                assert!(
                    report
                        .failed()
                        .any(|(n, f)| n.to_string() == servers[0].addr()
                            && matches!(f, NodeFault::Quarantined(_))),
                    "{report}"
                );
            }
            Err(other) => panic!("{other}"),
        }
        b.idle_until(Instant::now() + Duration::from_millis(20));
    }
    assert!(attempts > 0);

    // The same situation without quarantine: the safety violation the Redis docs describe.
    let mut a2 = Builder::new(servers.urls())
        .ttl(ttl)
        .node_timeout(node_timeout)
        .quarantine(None)
        .build_client()
        .unwrap();
    warm(&mut a2);
    servers[3].set("res2", "stale");
    servers[4].set("res2", "stale");
    let held = a2.try_lock("res2").unwrap();
    servers[0].restart();
    servers[3].cmd(&["DEL", "res2"]);
    servers[4].cmd(&["DEL", "res2"]);
    let mut c = Builder::new(servers.urls())
        .ttl(ttl)
        .node_timeout(node_timeout)
        .quarantine(None)
        .build_client()
        .unwrap();
    warm(&mut c);
    let stolen = c
        .try_lock("res2")
        .expect("without quarantine the lock is granted twice");
    assert!(held.is_valid(), "both hold it at once");
    drop(stolen);
}

/// A server's `uptime_in_seconds` is the whole seconds of the clock now less those at its start
/// (Redis: `server.unixtime - server.stat_starttime`), up to a second more than it has been up:
/// started at x.7 s, it says 1 at x + 1.0 s. A client that sees such a node for the first time
/// must keep it out until it has surely been up a window. Read as it stood, the quarantine took
/// the 1 at its word and let the node count a second early — for a node that restarted empty,
/// a second in which keys it forgot could still be held elsewhere (before the fix this test's
/// first lock came ~1.3 s after the servers started, inside their 2 s window).
#[test]
fn a_node_seen_first_is_quarantined_until_it_has_surely_been_up_a_window() {
    use std::time::{SystemTime, UNIX_EPOCH};
    const WINDOW: Duration = Duration::from_secs(2);
    // Servers started at about x.7 s of the wall clock, whose uptime says 1 from x + 1.0 s,
    // and a client that sees them first while they have been up less than a second.
    let (servers, before, mut careful) = (0..5)
        .find_map(|_| {
            let sub = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .subsec_millis();
            std::thread::sleep(Duration::from_millis(u64::from((1_700 - sub) % 1_000)));
            let before = Instant::now();
            let servers = Cluster::start(3);
            while servers.iter().any(|s| s.uptime_secs() < 1) {
                assert!(
                    before.elapsed() < Duration::from_secs(3),
                    "uptime never said 1"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut careful = Builder::new(servers.urls())
                .ttl(WINDOW)
                .build_client()
                .unwrap();
            careful.connect(Duration::from_secs(1));
            // The handshakes read uptime 1 or more within a second of the start: the case.
            (before.elapsed() < Duration::from_millis(900)).then_some((servers, before, careful))
        })
        .expect("five tries to start servers and connect within 0.9 s of a second's turn");
    let first = loop {
        match careful.try_lock("young") {
            Ok(lock) => {
                let at = Instant::now();
                careful.unlock(lock).unwrap();
                break at;
            }
            Err(Error::NoQuorum(report)) => assert!(
                report
                    .failed()
                    .all(|(_, f)| matches!(f, NodeFault::Quarantined(_))),
                "{report}"
            ),
            Err(e) => panic!("{e}"),
        }
        assert!(
            before.elapsed() < WINDOW * 3,
            "no lock long after the window"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        first >= before + WINDOW,
        "a lock {:?} after the servers started, inside their {WINDOW:?} window",
        first.duration_since(before)
    );
    drop(servers);
}

#[test]
fn quarantine_doubts_set_votes_but_not_extend_votes() {
    let servers = Cluster::start(3);
    let ttl = Duration::from_secs(30);
    // Fresh servers: uptime < 30 s, so every node is in quarantine for this client.
    let mut careful = Builder::new(servers.urls())
        .ttl(ttl)
        .build_client()
        .unwrap();
    match careful.try_lock("res") {
        Err(Error::NoQuorum(report)) => {
            assert!(
                report.failed().count() >= 2,
                "decided once quorum was out of reach"
            );
            assert!(
                report
                    .failed()
                    .all(|(_, f)| matches!(f, NodeFault::Quarantined(_))),
                "{report}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A lock taken without quarantine can still be extended through the careful client: a yes
    // to extend proves the node holds our token, whatever its uptime.
    let mut relaxed = Builder::new(servers.urls())
        .ttl(ttl)
        .quarantine(None)
        .build_client()
        .unwrap();
    let mut lock = relaxed.try_lock("res").unwrap();
    careful.extend(&mut lock, ttl).unwrap();
    assert_eq!(lock.extensions(), 1);
    assert!(careful.unlock(lock).unwrap() >= 2);
}

/// A node that answers every command correctly, but 50 ms late: a slow link or an overloaded
/// server. (A fake, because a real server cannot be made consistently slow.)
fn slow_node(delay: Duration) -> FakeServer {
    FakeServer::start(move |p: &mut Peer| {
        while let Some(cmd) = p.command() {
            std::thread::sleep(delay);
            let reply: &[u8] = if cmd[0].eq_ignore_ascii_case(b"SET") {
                b"+OK\r\n"
            } else {
                b":1\r\n"
            };
            if !p.send(reply) {
                return;
            }
        }
    })
}

#[test]
fn unlock_does_not_wait_for_a_slow_node_every_cycle() {
    let servers = Cluster::start(2);
    let fake = slow_node(Duration::from_millis(50));
    let mut urls = servers.urls();
    urls.push(fake.url());
    let mut c = Builder::new(urls)
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
        .build_client()
        .unwrap();
    // Decided at quorum by the two fast nodes; the release does not wait for the slow one
    // (it would answer within the 200 ms node timeout, so waiting would count 3).
    for i in 0..20 {
        let lock = c.try_lock(format!("r{i}")).unwrap();
        assert_eq!(
            c.unlock(lock).unwrap(),
            2,
            "cycle {i} waited for the slow node"
        );
    }
    // The fast nodes are always waited for: nothing of ours is left on them.
    for s in servers.iter() {
        assert_eq!(s.dbsize(), 0);
    }
    drop(c);
    drop(fake);

    // A healthy cluster still reports every node.
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .build_client()
        .unwrap();
    for i in 0..50 {
        let lock = c.try_lock(format!("h{i}")).unwrap();
        assert_eq!(c.unlock(lock).unwrap(), 2);
    }
}

/// `expired_keys` of `INFO stats`: keys the server deleted because their TTL ran out.
fn expired_keys(server: &Server) -> u64 {
    server
        .info("stats")
        .lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("expired_keys in INFO stats")
}

/// Issue 35, item 4: a lost attempt's `SET NX` sits in the socket buffers of two nodes frozen
/// for longer than the TTL, but its release does not: the connection was failed before the
/// release could be queued behind the `SET` (here a reply timeout shorter than the node
/// timeout; a connection failed as overloaded does the same), so the release went to the
/// ledger. When the nodes resume they run the `SET`, and the key would block the resource
/// there (a majority) for a whole TTL. Before the fix the ledger had dropped the release when
/// the TTL passed (3 runs of 3: "no release kept for the frozen nodes"; with the check below
/// left out, the stale key stayed with nothing unconfirmed). Now the release stays in the
/// ledger while its node is unreachable and is sent once it is back (5 of 5 runs).
#[test]
fn a_stale_set_run_by_nodes_frozen_past_the_ttl_is_released_when_they_resume() {
    let mut servers = Cluster::start(3);
    let ttl = Duration::from_secs(2);
    let mut config = redlock_mux::Config::default();
    config.reply_timeout = Duration::from_millis(20);
    // Back within a tenth of the TTL once the nodes resume: the release must come before the
    // stale key's TTL ends, or the key expires either way.
    config.backoff_max = Duration::from_millis(100);
    let redlock = Builder::new(servers.urls())
        .config(config)
        .ttl(ttl)
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let lock = redlock.try_lock("warm").unwrap();
    redlock.unlock(lock).unwrap();
    servers[1].freeze();
    servers[2].freeze();
    for i in 0..4 {
        assert!(matches!(
            redlock.try_lock(format!("stale{i}")),
            Err(Error::NoQuorum(_))
        ));
    }
    // The fault under test: frozen for longer than the TTL.
    std::thread::sleep(ttl + Duration::from_millis(500));
    // Past the TTL the releases are still kept for the frozen nodes (before the fix they had
    // been dropped: 0).
    let (_, kept) = redlock
        .with_client(|c| redlock_mux::testing::unconfirmed(c))
        .unwrap();
    assert!(kept > 0, "no release kept for the frozen nodes");
    servers[1].resume();
    servers[2].resume();
    // Every kept release confirmed: each went out behind a new connection's handshake, which
    // the node answered after running what its old socket held (the stale `SET`s).
    let deadline = Instant::now() + Duration::from_secs(15);
    while redlock
        .with_client(|c| redlock_mux::testing::unconfirmed(c))
        .unwrap()
        != (0, 0)
    {
        assert!(Instant::now() < deadline, "releases still unconfirmed");
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 1..3 {
        for k in 0..4 {
            let key = format!("stale{k}");
            assert_eq!(servers[i].get(&key), None, "{key} stayed on node {i}");
        }
        assert_eq!(
            expired_keys(&servers[i]),
            0,
            "node {i}: a stale key expired instead of being released"
        );
    }
}

/// Issue 36, item 1: releases kept for a node while it was frozen are sent, once it is back,
/// paced within the connection's room (half of `max_pending` outstanding at a time). Before,
/// all of them went out at once on the fresh connection, which overflowed `max_pending`, was
/// failed as overloaded, and put them back: a reconnect loop that never drained (here: the
/// releases never confirmed, connects climbing).
#[test]
fn releases_kept_for_a_frozen_node_drain_without_overloading_its_new_connection() {
    let mut servers = Cluster::start(3);
    let mut config = redlock_mux::Config::default();
    config.max_pending = 16;
    config.backoff_max = Duration::from_millis(100);
    let redlock = Builder::new(servers.urls())
        .config(config)
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = redlock.try_lock("warm").unwrap();
    redlock.unlock(lock).unwrap();
    servers[2].freeze();
    // Locks on the two live nodes; every release to the frozen one goes unconfirmed.
    for i in 0..40 {
        let lock = redlock.try_lock(format!("k{i}")).unwrap();
        redlock.unlock_nowait(lock);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while redlock
        .with_client(|c| redlock_mux::testing::unconfirmed(c))
        .unwrap()
        .1
        < 16
    {
        assert!(
            Instant::now() < deadline,
            "the releases never reached the ledger"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    servers[2].resume();
    let connects = |r: &redlock_mux::Redlock| r.stats().nodes[2].connects;
    let before = connects(&redlock);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redlock
        .with_client(|c| redlock_mux::testing::unconfirmed(c))
        .unwrap()
        != (0, 0)
    {
        assert!(
            Instant::now() < deadline,
            "still unconfirmed: {:?}, {} connects since the resume",
            redlock
                .with_client(|c| redlock_mux::testing::unconfirmed(c))
                .unwrap(),
            connects(&redlock) - before
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let made = connects(&redlock) - before;
    assert!(made <= 3, "{made} connects to drain the ledger");
}

/// Issue 36, item 3: a node that let an attempt's node timeout pass in silence (frozen) is not
/// waited for by the next attempts until it answers again: an attempt whose live votes can no
/// longer make a quorum loses at once instead of holding its keys for a whole node timeout.
/// With one of five nodes frozen, competing clients splitting the four live votes 2–2 each
/// waited 50 ms for the frozen node, again and again: `redlock demo` fell from 923 to 6 locks/s
/// (610/s with the fix, against 1,003/s healthy in the same run). Here the split is made by
/// another client's key on two live nodes: the second attempt no longer waits for the frozen
/// node (before the fix: "no reply in time" on every attempt, each after the node timeout).
#[test]
fn a_silent_node_is_not_waited_for_once_it_has_missed_a_node_timeout() {
    let mut servers = Cluster::start(5);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let lock = redlock.try_lock("warm").unwrap();
    assert_eq!(redlock.unlock(lock).unwrap(), 5);
    servers[2].freeze();
    for s in [&servers[0], &servers[1]] {
        s.cmd(&["SET", "x", "someone-else", "PX", "60000"]);
    }
    let frozen_vote = |attempt: usize| -> String {
        let Err(e) = redlock.try_lock("x") else {
            panic!("attempt {attempt}: acquired against a holder on two nodes");
        };
        let report = e.report().expect("a report").clone();
        let (_, vote) = report.votes().nth(2).unwrap();
        format!("{vote:?}")
    };
    // The first attempt waits for it (it was answering until now) and finds it silent.
    assert_eq!(frozen_vote(1), "Failed(Timeout)");
    // The next ones do not wait: 2 yes + 2 refused + a silent node cannot make 3; the report
    // says why it was not waited for.
    for attempt in 2..5 {
        assert_eq!(frozen_vote(attempt), "Failed(Silent)");
    }
    // Answering again, it is waited for again.
    servers[2].resume();
    let deadline = Instant::now() + Duration::from_secs(10);
    while redlock.status(b"x", Duration::from_secs(1))[2]
        .state
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "node 2 never answered after resuming"
        );
    }
    let lock = redlock.try_lock("y").unwrap();
    redlock.unlock(lock).unwrap();
}

/// A connection with `max_pending` requests outstanding refuses the next request (that node
/// fails for that operation) and stays up. Before, it was failed with every request on it, so
/// that 16 callers sharing one engine with `max_pending` 8 against healthy servers reconnected
/// again and again with no fault at all — found by the simulator's reconnect check
/// (`tests/sim.rs`, `Break::FailWhenFull`). Counted, not timed: connects per node.
#[test]
fn a_full_connection_refuses_requests_instead_of_reconnecting() {
    let servers = Cluster::start(3);
    let mut config = redlock_mux::Config::default();
    config.max_pending = 8;
    let redlock = Builder::new(servers.urls())
        .config(config)
        .quarantine(None)
        .build()
        .unwrap();
    assert_eq!(redlock.connect(Duration::from_secs(5)).unwrap(), 3);
    let refused = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..16 {
            let (redlock, refused) = (&redlock, &refused);
            s.spawn(move || {
                for i in 0..100 {
                    match redlock.try_lock(format!("full:{t}:{i}")) {
                        Ok(lock) => redlock.unlock_nowait(lock),
                        Err(Error::NoQuorum(report)) => {
                            assert!(
                                report
                                    .failed()
                                    .all(|(_, f)| matches!(f.root(), NodeFault::Overloaded)),
                                "{report}"
                            );
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    let stats = redlock.stats();
    let connects: Vec<u64> = stats.nodes.iter().map(|n| n.connects).collect();
    assert_eq!(
        connects,
        vec![1, 1, 1],
        "connects per node ({} attempts refused for want of room)",
        refused.into_inner()
    );
}

/// A release answered `-BUSY` (the node runs another client's script past its busy threshold)
/// was counted as confirmed, and the key left on that node until its TTL. Now it waits in the
/// ledger and goes again once the node answers.
#[test]
fn a_release_answered_busy_is_sent_again_once_the_node_is_free() {
    let servers = Cluster::start(3);
    let redlock = Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = redlock.try_lock("busy").unwrap();
    servers[0].cmd(&["CONFIG", "SET", "lua-time-limit", "10"]);
    // Another client's script that runs until killed.
    let script_addr = servers[0].socket_addr();
    let script = std::thread::spawn(move || {
        let mut s = TcpStream::connect(script_addr).unwrap();
        let body = "while 1 do end";
        let eval = format!(
            "*3\r\n$4\r\nEVAL\r\n${}\r\n{body}\r\n$1\r\n0\r\n",
            body.len()
        );
        s.write_all(eval.as_bytes()).unwrap();
        let mut reply = [0u8; 256];
        // Its answer once killed (an error), or the connection closed.
        let _ = std::io::Read::read(&mut s, &mut reply);
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(servers[0].try_cmd(&["GET", "busy"]), Err(e) if e.to_string().contains("BUSY"))
    {
        assert!(
            Instant::now() < deadline,
            "the script never made node 0 busy"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Confirmed by nodes 1 and 2; node 0 answered BUSY.
    assert_eq!(redlock.unlock(lock).unwrap(), 2);
    let unconfirmed = || {
        redlock
            .with_client(|c| redlock_mux::testing::unconfirmed(c))
            .unwrap()
    };
    assert_ne!(
        unconfirmed(),
        (0, 0),
        "the BUSY release counted as confirmed"
    );
    servers[0].cmd(&["SCRIPT", "KILL"]);
    script.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers[0].get("busy").is_some() || unconfirmed() != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "node 0 still holds the key: {:?}",
            unconfirmed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `shutdown` waits for a release kept for a node whose connection failed before it ever
/// answered a request (so the node is down for a backoff): the engine connects again when the
/// backoff ends and sends the release. `shutdown` drove the loop only to the operations' and
/// the connections' deadlines, not to the kept releases' next try: it slept to its own
/// deadline and reported the release unconfirmed (1 run in 20 of `async_api`'s
/// `an_acquire_dropped_while_a_connection_is_cut…`, where the server closed a connection whose
/// first `SET` was still unanswered).
#[test]
fn shutdown_resends_a_release_kept_for_a_node_in_its_backoff() {
    let servers = Cluster::start(3);
    let relay = redis_local::Relay::start(servers[0].socket_addr(), Duration::ZERO);
    let urls = [relay.url(), servers[1].url(), servers[2].url()];
    let redlock = Builder::new(urls)
        .quarantine(None)
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_millis(100))
        .reply_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert_eq!(redlock.connect(Duration::from_secs(5)).unwrap(), 3);
    // Node 0's answers on this connection are lost: its SET and the release behind it go
    // unanswered until the reply timeout fails the connection, which never answered a request.
    relay.set_flow(redis_local::Direction::ToClient, redis_local::Flow::Drop);
    let lock = redlock.try_lock("sd").unwrap();
    let token = lock.token().to_string();
    redlock.unlock_nowait(lock);
    // New connections pass (the one that lost bytes stays dead).
    relay.heal();
    let report = redlock.shutdown(Duration::from_secs(10));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    assert_ne!(servers[0].get("sd"), Some(token));
}
