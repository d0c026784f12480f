//! Connections against real servers: handshakes (password, ACL user, db, Unix socket, RESP3,
//! client name), a frozen node resumed later, refused connections and backoff, syscall counts.

use std::time::Duration;

use redis_local::{Cluster, Server, Version};
use redlock_mux::{Builder, Client, Error, NodeFault};

fn client(urls: Vec<String>) -> Client {
    Builder::new(urls)
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
        .build_client()
        .unwrap()
}

fn text(v: redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        redis::Value::VerbatimString { text, .. } => text,
        redis::Value::SimpleString(s) => s,
        other => panic!("not text: {other:?}"),
    }
}

fn cycle(c: &mut Client, resource: &str) -> usize {
    let lock = c.try_lock(resource).unwrap();
    c.unlock(lock).unwrap()
}

#[test]
fn password_acl_user_db_and_client_name() {
    let s = Server::builder()
        .requirepass("pw")
        .acl_user("alice on >s3cret ~* +@all")
        .start();
    let port = s.port();
    // requirepass = the default user's password.
    let mut c = client(vec![format!("redis://:pw@127.0.0.1:{port}")]);
    assert_eq!(cycle(&mut c, "a"), 1);
    // An ACL user, percent-encoded, database 3, and a client name.
    let mut c = Builder::new([format!("redis://alice:s%33cret@127.0.0.1:{port}/3")])
        .quarantine(None)
        .client_name("redlock-test")
        .build_client()
        .unwrap();
    let lock = c.try_lock("b").unwrap();
    let list = text(s.cmd(&["CLIENT", "LIST"]));
    let ours = list
        .lines()
        .find(|l| l.contains("name=redlock-test"))
        .unwrap_or_else(|| panic!("no named client in {list}"));
    assert!(ours.contains(" db=3 "), "{ours}");
    assert!(ours.contains(" user=alice "), "{ours}");
    assert_eq!(s.get("b"), None, "the key went to db 3, not db 0");
    assert_eq!(c.unlock(lock).unwrap(), 1);
}

#[test]
fn wrong_or_missing_credentials_are_an_auth_error_naming_the_node() {
    let s = Server::builder()
        .requirepass("pw")
        .acl_user("alice on >s3cret ~* +@all")
        .start();
    let port = s.port();
    for url in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://alice:wrong@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
        format!("redis://:wrong@127.0.0.1:{port}?protocol=3"),
    ] {
        let mut c = client(vec![url.clone()]);
        match c.try_lock("a") {
            Err(Error::Auth { node, message }) => {
                assert_eq!(node, format!("127.0.0.1:{port}"));
                assert!(
                    message.starts_with("WRONGPASS") || message.starts_with("NOAUTH"),
                    "{message}"
                );
                assert!(!message.contains("wrong"), "{message}");
            }
            other => panic!("{url}: {other:?}"),
        }
        // lock() does not retry an authentication error.
        assert!(matches!(c.lock("a"), Err(Error::Auth { .. })));
    }
}

/// A server over its `maxclients` answers a new connection's first request — here the AUTH —
/// with `-ERR max number of clients reached` and closes it. That was read as bad credentials
/// (`Error::Auth`, final: `lock` gave up at once); it passes by itself, so `lock` waits it out.
#[test]
fn a_server_over_maxclients_is_waited_for_not_an_auth_error() {
    use std::io::{Read, Write};
    let s = Server::builder()
        .requirepass("pw")
        .arg("--maxclients")
        .arg("4")
        .start();
    // Fill every slot with connections that are accepted (answered NOAUTH), keeping them.
    let mut held = Vec::new();
    loop {
        let mut c = std::net::TcpStream::connect(s.socket_addr()).unwrap();
        c.write_all(b"PING\r\n").unwrap();
        let mut buf = [0u8; 128];
        let n = c.read(&mut buf).unwrap();
        let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
        if reply.contains("max number of clients") {
            break;
        }
        assert!(reply.starts_with("-NOAUTH"), "{reply}");
        held.push(c);
        assert!(held.len() <= 4, "maxclients not reached");
    }
    let mut c = Builder::new([format!("redis://:pw@127.0.0.1:{}", s.port())])
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
        .build_client()
        .unwrap();
    match c.try_lock("a") {
        Err(e @ Error::NoQuorum(_)) => {
            assert!(!e.is_permanent(), "{e}");
            assert!(e.to_string().contains("max number of clients"), "{e}");
        }
        other => panic!("expected a passing refusal, got {other:?}"),
    }
    // A slot frees: `lock` gets it (it used to return the Auth error at once).
    drop(held.pop());
    let lock = c.lock("a").unwrap();
    assert_eq!(c.unlock(lock).unwrap(), 1);
}

#[test]
fn unix_socket_and_resp3() {
    let s = Server::builder().unix_socket(true).start();
    let path = s.unix_path().unwrap();
    let mut c = client(vec![format!("redis+unix://{}", path.display())]);
    assert_eq!(cycle(&mut c, "a"), 1);
    let mut c = client(vec![format!("unix://{}?protocol=3", path.display())]);
    assert_eq!(cycle(&mut c, "a"), 1);

    // RESP3 over TCP: nil is `_`, and a held lock is still recognised as held.
    let mut a = client(vec![format!("{}?protocol=3", s.url())]);
    let mut b = client(vec![format!("{}?protocol=3", s.url())]);
    let lock = a.try_lock("r").unwrap();
    assert!(matches!(b.try_lock("r"), Err(Error::Held(_))));
    // `CLIENT LIST` names each connection's protocol from Redis 7.0 on (`resp=`); before, it
    // does not say, and the locks above are what ran over RESP3.
    let list = text(s.cmd(&["CLIENT", "LIST"]));
    if s.version_number() >= Some(Version::new(7, 0, 0)) {
        assert!(
            list.lines().filter(|l| l.contains("resp=3")).count() >= 2,
            "{list}"
        );
    } else {
        assert!(!list.contains("resp="), "{list}");
    }
    assert_eq!(a.unlock(lock).unwrap(), 1);
}

#[test]
fn a_frozen_node_resumed_later_does_not_mix_up_replies() {
    let mut servers = Cluster::start(1);
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(30))
        .build_client()
        .unwrap();
    assert_eq!(cycle(&mut c, "warm"), 1);
    servers[0].freeze();
    // The SET and the release that follows it stay unanswered on the wire.
    match c.try_lock("r") {
        Err(Error::NoQuorum(report)) => {
            let faults: Vec<_> = report.failed().map(|(_, f)| f.clone()).collect();
            assert_eq!(faults, vec![NodeFault::Timeout]);
        }
        other => panic!("{other:?}"),
    }
    servers[0].resume();
    // Now the late "+OK" for r arrives. If it were taken as the answer to the next SET, this
    // attempt on a key someone else holds would "succeed".
    servers[0].set("x", "other");
    match c.try_lock("x") {
        Err(Error::Held(_)) => {}
        other => panic!("a late reply was taken for a new one: {other:?}"),
    }
    // The release pipelined behind the late SET removed our orphan key.
    assert_eq!(servers[0].get("r"), None);
    assert_eq!(servers[0].get("x").as_deref(), Some("other"));
    assert_eq!(cycle(&mut c, "y"), 1);
}

#[test]
fn a_refused_connection_backs_off_instead_of_reconnecting_on_every_attempt() {
    let mut servers = Cluster::start(3);
    let mut c = client(servers.urls());
    assert_eq!(cycle(&mut c, "a"), 3);
    servers[2].kill();
    let before = c.stats().io.connects;
    let mut refused = 0;
    for _ in 0..100 {
        // Quorum is 2 of 3: still acquired without the dead node.
        let lock = c.try_lock("a").unwrap();
        assert_eq!(c.unlock(lock).unwrap(), 2);
        refused += 1;
    }
    let connects = c.stats().io.connects - before;
    assert_eq!(refused, 100);
    // 200 operations; the backoff (25 ms doubling to 2 s) allows a handful of reconnects.
    assert!(connects <= 12, "{connects} connects in 200 operations");

    // Only the dead node: a clear error, quickly, naming why.
    let mut alone = client(vec![servers[2].url()]);
    match alone.try_lock("a") {
        Err(Error::NoQuorum(report)) => {
            let (node, fault) = report.failed().next().unwrap();
            assert_eq!(node.to_string(), servers[2].addr());
            assert!(
                matches!(
                    fault.root(),
                    NodeFault::Io(std::io::ErrorKind::ConnectionRefused)
                ),
                "{fault}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The node comes back on the same port: used again without the caller doing anything.
    servers[2].restart();
    let mut back = false;
    for _ in 0..400 {
        let lock = c.try_lock("a").unwrap();
        if c.unlock(lock).unwrap() == 3 {
            back = true;
            break;
        }
        c.idle_until(std::time::Instant::now() + Duration::from_millis(10));
    }
    assert!(back, "the restarted node was never used again");
}

#[test]
fn one_round_costs_one_write_per_node() {
    let servers = Cluster::start(5);
    let mut c = client(servers.urls());
    for _ in 0..20 {
        cycle(&mut c, "warm");
    }
    let before = c.stats().io;
    let cycles = 200u64;
    for _ in 0..cycles {
        cycle(&mut c, "r");
    }
    let after = c.stats().io;
    let (writes, reads, polls) = (
        after.writes - before.writes,
        after.reads - before.reads,
        after.polls - before.polls,
    );
    let rounds = 2 * cycles; // acquire + release
    assert_eq!(
        after.connects, before.connects,
        "no reconnects in steady state"
    );
    assert_eq!(writes, rounds * 5, "one write per node per round");
    assert!(reads <= rounds * 5 * 2, "{reads} reads in {rounds} rounds");
    assert!(polls <= rounds * 6, "{polls} polls in {rounds} rounds");
    eprintln!(
        "per round to 5 nodes: {:.2} writes, {:.2} reads, {:.2} polls",
        writes as f64 / rounds as f64,
        reads as f64 / rounds as f64,
        polls as f64 / rounds as f64
    );
}

#[test]
fn buffers_stay_bounded_when_a_node_keeps_quiet() {
    let mut servers = Cluster::start(3);
    let mut c = Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(5))
        .build_client()
        .unwrap();
    // With a 5 ms node timeout on a shared machine an attempt may fail: only the buffers and
    // the recovery matter here.
    let try_cycle = |c: &mut Client, r: &str| match c.try_lock(r) {
        Ok(lock) => c.unlock(lock).unwrap_or(0),
        Err(_) => 0,
    };
    servers[0].freeze();
    for _ in 0..300 {
        try_cycle(&mut c, "r");
    }
    // Requests pile up unanswered on node 0 until max_pending (1024) resets the connection; the
    // output buffer never holds more than what the kernel would not take.
    let (out, inp) = redlock_mux::testing::buffered(&c)[0];
    assert!(out < 1 << 20 && inp < 1 << 20, "out {out}, in {inp}");
    servers[0].resume();
    // The node first works through its backlog; then it takes part again.
    assert!(
        (0..500).any(|_| try_cycle(&mut c, "after") == 3),
        "node 0 never recovered"
    );
}

#[test]
fn connect_warms_every_node_before_the_first_attempt() {
    let mut servers = Cluster::start(3);
    let mut c = client(servers.urls());
    assert_eq!(c.connect(Duration::from_secs(5)), 3);
    let connects = c.stats().io.connects;
    assert_eq!(connects, 3);
    assert_eq!(cycle(&mut c, "a"), 3);
    assert_eq!(
        c.stats().io.connects,
        connects,
        "the attempt found its connections ready"
    );

    // A refused node is reported as not ready; the others do not wait for it.
    servers[2].kill();
    let mut c = client(servers.urls());
    assert_eq!(c.connect(Duration::from_secs(5)), 2);
    assert_eq!(cycle(&mut c, "a"), 2);
}

#[test]
fn a_database_the_server_does_not_have_is_a_configuration_fault() {
    let servers = Cluster::start(3);
    // 16 databases (0 to 15), redis-server's default: 99 does not exist on the first node.
    let mut urls = servers.urls();
    urls[0] = format!("{}/99", urls[0]);
    let mut c = client(urls);
    // The other two carry the quorum; the report names the refused database.
    let lock = c.try_lock("res").unwrap();
    c.unlock(lock).unwrap();
    let mut c = client(vec![format!("{}/99", servers[1].url())]);
    let report = match c.try_lock("res") {
        Err(Error::NoQuorum(report)) => report,
        other => panic!("{other:?}"),
    };
    let faults: Vec<_> = report.failed().map(|(_, f)| f.root().clone()).collect();
    assert!(
        matches!(&faults[..], [NodeFault::Database { db: 99, message }]
            if message.contains("DB index is out of range")),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains(
            "database 99 refused: -ERR DB index is out of range (the server has fewer databases)"
        ),
        "{text}"
    );
    assert_eq!(servers[1].dbsize(), 0, "nothing was written anywhere");
}

/// The ACL rule of docs/production.md (the README's "Running in production" until it moved
/// there) is enough for everything: the restart
/// quarantine (INFO), fencing (the fence key's hash), extend, release, a waiter woken by the
/// release's notice (SUBSCRIBE / PUBLISH on `redlock:released:*`) and the client name.
#[test]
fn the_production_acl_rule_of_the_readme_is_enough() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/production.md"))
            .unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER locker "))
        .expect("the ACL rule in docs/production.md");
    let rule = line["ACL SETUSER ".len()..].replace(">PASSWORD", ">pw");
    let servers = Cluster::start_with(
        3,
        Server::builder()
            .acl_user(&rule)
            .acl_user("admin on >adminpw ~* &* +@all")
            .acl_user("default off")
            .admin_credentials("admin", "adminpw"),
    );
    for s in servers.iter() {
        s.wait_uptime(2);
    }
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://locker:pw@127.0.0.1:{}", s.port()))
        .collect();
    let redlock = Builder::new(&urls)
        .ttl(Duration::from_secs(1))
        .quarantine(Duration::from_secs(1))
        .fencing(true)
        .client_name("locker-test")
        .build()
        .unwrap();
    let mut lock = redlock.try_lock("acl:res").expect("lock as the ACL user");
    assert!(lock.fence().is_some());
    redlock
        .extend(&mut lock, Duration::from_secs(1))
        .expect("extend");
    let waiter = {
        let redlock = redlock.clone();
        std::thread::spawn(move || redlock.lock("acl:res"))
    };
    // The waiter subscribes, then is woken by the release's notice (or its poll).
    while redlock
        .with_client(|c| redlock_mux::testing::waiters(c, b"acl:res"))
        .unwrap()
        == 0
        && !waiter.is_finished()
    {
        std::thread::yield_now();
    }
    // The notice's count (`PUBSUB NUMSUB` in the release script) is allowed too: heard here,
    // beside the handle's own subscription (the releaser's, which it leaves out), it says 1 —
    // not the 0 of a refused `PUBSUB`.
    let mut admin = servers[0].connection();
    let mut listener = admin.as_pubsub();
    listener.subscribe("redlock:released:acl:res").unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // Marked as waiting on node 0 (the mark makes the release publish there).
    while servers[0].get("redlock:waiting:acl:res").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never marked"
        );
        std::thread::yield_now();
    }
    while servers[0].subscribers("redlock:released:acl:res") != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the handle never subscribed"
        );
        std::thread::yield_now();
    }
    assert_eq!(redlock.unlock(lock).expect("release"), 3);
    let notice = listener.get_message().expect("the release's notice");
    assert_eq!(notice.get_payload::<String>().unwrap(), "1");
    let next = waiter.join().unwrap().expect("the waiter got it");
    redlock.unlock(next).expect("release");
}
