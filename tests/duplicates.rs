//! One server listed twice: refused when the builder can tell (two spellings of one endpoint),
//! and at the handshake when only the server can (its `run_id`: TCP and a Unix socket of one
//! server); a duplicate never counts towards a quorum, and stands in no fencing new
//! deployment's way.

use std::time::Duration;

use redis_local::Server;
use redlock_mux::{Builder, Error, NodeFault, Report};

#[test]
fn two_spellings_of_one_endpoint_are_refused_when_building() {
    let server = Server::start();
    let port = server.port();
    let cases = [
        (
            format!("redis://localhost:{port}"),
            format!("redis://127.0.0.1:{port}"),
        ),
        (
            format!("redis://127.0.0.1:{port}"),
            format!("redis://:topsecret@LOCALHOST.:{port}/2"),
        ),
        (
            format!("redis://[::1]:{port}"),
            format!("redis://localhost:{port}"),
        ),
    ];
    for (first, second) in cases {
        // Another server between them: the message names the two that are the same.
        let servers = [
            first.clone(),
            "redis://10.0.0.1:6379".into(),
            second.clone(),
        ];
        let message = match Builder::new(&servers).build_client() {
            Err(Error::Config(message)) => message,
            other => panic!("{servers:?}: {other:?}"),
        };
        let second_shown = second.replace("topsecret", "***");
        assert!(
            message.contains(&format!(
                "{first} and {second_shown} are the same server (listed twice, it would \
                 count twice towards a quorum)"
            )),
            "{message}"
        );
        assert!(!message.contains("topsecret"), "{message}");
    }
}

/// Client settings of these tests: fresh servers, so no quarantine (the duplicate check reads
/// `INFO server` for any list of two nodes or more); one attempt.
fn builder(urls: &[String]) -> Builder {
    Builder::new(urls)
        .quarantine(None)
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
}

/// The server's `run_id`, from `INFO server`.
fn run_id(server: &Server) -> String {
    server
        .info("server")
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .expect("run_id in INFO server")
        .trim()
        .to_owned()
}

/// The report's fault for `node` (as `host:port` or `unix:/path`).
fn fault_of(report: &Report, node: &str) -> Option<NodeFault> {
    report
        .failed()
        .find(|(addr, _)| addr.to_string() == node)
        .map(|(_, fault)| fault.root().clone())
}

#[test]
fn tcp_and_unix_socket_of_one_server_count_once() {
    let a = Server::builder().unix_socket(true).start();
    let b = Server::start();
    let path = a.unix_path().expect("unix socket");
    let tcp = a.url();
    let unix = format!("redis+unix://{}", path.display());
    let (tcp_node, unix_node) = (a.addr(), format!("unix:{}", path.display()));
    let expected = NodeFault::Duplicate {
        of: tcp_node.clone(),
        run_id: run_id(&a),
    };
    let message = format!(
        "{unix_node}: the same server as {tcp_node} (run_id {}…): listed twice, it does not count",
        &run_id(&a)[..8]
    );

    // Both entries of A and B: a free lock is won (A once, B).
    let mut c = builder(&[tcp.clone(), unix.clone(), b.url()])
        .build_client()
        .unwrap();
    let mut lock = c.try_lock("res").unwrap();
    let token = lock.token().to_string();
    assert_eq!(a.get("res").as_deref(), Some(token.as_str()));
    assert_eq!(b.get("res").as_deref(), Some(token.as_str()));
    // B's key now belongs to someone else: only A still holds ours, one server of the two a
    // quorum needs. Counted once, A's two entries do not extend the lock.
    b.set("res", "someone-else");
    let report = match c.extend(&mut lock, Duration::from_secs(30)) {
        Err(Error::Held(report)) => report,
        other => panic!("extended with only A's key (counted twice?): {other:?}"),
    };
    // Decided as soon as a quorum was out of reach: A's yes may not be in yet.
    assert!(report.yes() <= 1 && report.quorum() == 2, "{report}");
    assert_eq!(
        fault_of(&report, &unix_node),
        Some(expected.clone()),
        "{report}"
    );
    assert!(report.to_string().contains(&message), "{report}");

    // The two entries of A alone: one server of the two needed. Once both connections said
    // which process they lead to (here: after a status query, which waits for every node), the
    // second entry is asked nothing; a free lock is not won, and the report says why.
    let mut c = builder(&[tcp, unix]).build_client().unwrap();
    let status = c.status(b"res", Duration::from_secs(5));
    assert!(status[0].state.is_ok(), "{status:?}");
    let status = c.status(b"res", Duration::from_secs(5));
    assert_eq!(status[1].state, Err(expected.clone()), "{status:?}");
    for attempt in 0..3 {
        let resource = format!("free-{attempt}");
        let report = match c.try_lock(&resource) {
            Err(Error::NoQuorum(report)) => report,
            other => panic!("attempt {attempt}: {other:?}"),
        };
        assert!(report.yes() <= 1, "{report}");
        assert_eq!(report.refused().count(), 0, "not held elsewhere: {report}");
        assert_eq!(
            fault_of(&report, &unix_node),
            Some(expected.clone()),
            "{report}"
        );
        assert!(report.to_string().contains(&message), "{report}");
    }
}

/// A new deployment (every fence counter blank) over a server list with one server twice: its
/// first fenced lock gets fence 1, and both servers are seeded. The duplicate entry's reading
/// is not counted, so "every node blank" never held: every fenced acquire failed with
/// `Error::Fence`, for ever. Both ways of knowing the duplicate: from the
/// answers (the first acquire), and before sending (once both connections said their
/// `run_id`, the second entry is asked nothing).
#[test]
fn a_new_deployment_with_one_server_listed_twice_gets_its_first_fence() {
    for known in [false, true] {
        let a = Server::builder().unix_socket(true).start();
        let b = Server::start();
        let unix = format!(
            "redis+unix://{}",
            a.unix_path().expect("unix socket").display()
        );
        let mut c = builder(&[a.url(), unix, b.url()])
            .fencing(true)
            .build_client()
            .unwrap();
        if known {
            c.status(b"res", Duration::from_secs(5));
            let status = c.status(b"res", Duration::from_secs(5));
            assert!(
                matches!(status[1].state, Err(NodeFault::Duplicate { .. })),
                "{status:?}"
            );
        }
        let lock = match c.try_lock("res") {
            Ok(lock) => lock,
            Err(e) => panic!("known before sending: {known}: {e}"),
        };
        assert_eq!(lock.fence(), Some(1), "known before sending: {known}");
        c.unlock(lock).unwrap();
        for server in [&a, &b] {
            let n = server.cmd(&["HGET", redlock_mux::FENCE_KEY, "n"]);
            assert_eq!(n, redis::Value::BulkString(b"1".to_vec()), "{known}");
        }
        // Seeded on both: the next fence from a quorum of seeded counters.
        let lock = c.try_lock("res").unwrap();
        assert_eq!(lock.fence(), Some(2), "known before sending: {known}");
    }
}

#[test]
fn an_acl_user_without_info_is_not_checked_but_still_served() {
    // Neither the quarantine nor fencing needs INFO: its refusal leaves the nodes unchecked,
    // and locks work — where servers that may evict are counted, since without `INFO memory`
    // whether a server evicts is not known (and by default such a server does not count).
    let servers: Vec<Server> = (0..3)
        .map(|_| {
            Server::builder()
                .acl_user("locker on >pw ~* +@all -info")
                .start()
        })
        .collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://locker:pw@127.0.0.1:{}", s.port()))
        .collect();
    let mut refusing = builder(&urls).build_client().unwrap();
    let err = refusing.try_lock("res").unwrap_err();
    let faults: Vec<_> = err
        .report()
        .unwrap()
        .failed()
        .map(|(_, f)| f.clone())
        .collect();
    assert!(faults.len() >= 2, "{err}");
    assert!(
        faults.iter().all(|f| *f == NodeFault::Evicting(None)),
        "{err}"
    );
    assert!(err.to_string().contains("+info"), "{err}");
    let mut c = builder(&urls)
        .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
        .build_client()
        .unwrap();
    let lock = c.try_lock("res").unwrap();
    assert_eq!(c.unlock(lock).unwrap(), 3);
}
