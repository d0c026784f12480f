//! TLS (`rediss://`, the `tls` feature) against real `redis-server` processes listening with
//! `--tls-port` and certificates each test makes (`redis_local::pki`): a lock cycle, session
//! resumption and the handshake's round trips, a wrong CA, mutual TLS, a node frozen in the
//! middle of the handshake, and TLS options given without a `rediss://` server.
#![cfg(feature = "tls")]

use std::time::{Duration, Instant};

use redis_local::Pki;
use redis_local::{ClientAuth, Cluster, Server};
use redlock_mux::{Builder, Client, Error, NodeFault};

/// Waits longer than any timeout configured here; a wait that reaches it is a hang.
const HANG: Duration = Duration::from_secs(10);

fn tls_servers(pki: &Pki, n: usize, auth: ClientAuth) -> Cluster {
    Cluster::start_with(n, Server::builder().tls(pki, auth))
}

fn urls(servers: &Cluster) -> Vec<String> {
    servers.iter().map(Server::tls_url).collect()
}

fn client(builder: Builder) -> Client {
    builder
        .quarantine(None)
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(800))
        .build_client()
        .expect("client")
}

/// The single node's fault in a `NoQuorum`, looking through `Backoff`.
fn only_fault(e: &Error) -> NodeFault {
    let report = e.report().unwrap_or_else(|| panic!("no report in {e}"));
    let failed: Vec<_> = report.failed().collect();
    let [(_, fault)] = failed[..] else {
        panic!("expected one failed node in {e}");
    };
    fault.root().clone()
}

#[test]
fn a_lock_cycle_over_tls_and_resumed_reconnects() {
    let pki = Pki::generate();
    let servers = tls_servers(&pki, 3, ClientAuth::No);
    let mut c = client(Builder::new(urls(&servers)).tls_ca_file(pki.ca()));
    let mut lock = c.try_lock("tls:res").expect("lock over TLS");
    // Seen through the plain port: the key the TLS connections set (on a quorum at least: the
    // lock is granted at the second yes).
    let token = lock.token().to_string();
    let holding = servers
        .iter()
        .filter(|s| s.get("tls:res") == Some(token.clone()));
    assert!(holding.count() >= 2);
    c.extend(&mut lock, Duration::from_secs(20))
        .expect("extend over TLS");
    // The third handshake and its requests done (a status read waits for every node).
    c.status("tls:res", HANG);
    assert_eq!(c.unlock(lock).expect("unlock over TLS"), 3);
    let first = c.stats().io;
    assert_eq!(first.tls_handshakes, 3, "{first:?}");
    assert_eq!(first.tls_resumed, 0, "{first:?}");
    // TLS 1.3: one round trip per handshake (after TCP's own).
    assert_eq!(first.tls_round_trips, 3, "{first:?}");

    // Every server drops our connections: the next cycle reconnects, resuming the sessions.
    for s in servers.iter() {
        s.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    }
    let deadline = Instant::now() + HANG;
    let lock = loop {
        // The first attempt after the kill may see the closed connections before reconnecting.
        match c.try_lock("tls:res") {
            Ok(lock) => break lock,
            Err(e) if Instant::now() < deadline => eprintln!("after CLIENT KILL: {e}"),
            Err(e) => panic!("no lock after the reconnects: {e}"),
        }
    };
    c.unlock(lock).expect("unlock");
    // The lock was decided at two nodes: the third resumption may still be under way.
    c.status("tls:res", HANG);
    let after = c.stats().io;
    assert_eq!(after.tls_handshakes, 6, "{after:?}");
    assert_eq!(after.tls_resumed, 3, "every reconnect resumed: {after:?}");
    assert_eq!(after.tls_round_trips, 6, "{after:?}");
}

#[test]
fn a_certificate_from_an_unknown_ca_is_refused_naming_the_node() {
    let pki = Pki::generate();
    let servers = tls_servers(&pki, 1, ClientAuth::No);
    let mut c = client(Builder::new(urls(&servers)).tls_ca_file(pki.other_ca()));
    let e = c.try_lock("res").expect_err("an untrusted certificate");
    let fault = only_fault(&e);
    assert!(
        matches!(&fault, NodeFault::Tls(why) if why.contains("UnknownIssuer")),
        "{fault:?}"
    );
    let message = e.to_string();
    assert!(message.contains(&servers[0].tls_url()[9..]), "{message}");
    assert!(message.contains("tls_ca"), "the hint is missing: {message}");
    assert_eq!(servers[0].dbsize(), 0, "nothing reached the server");
}

#[test]
fn a_certificate_for_another_name_is_refused_and_tls_server_name_fixes_it() {
    let pki = Pki::generate();
    let servers = tls_servers(&pki, 1, ClientAuth::No);
    let port = servers[0].tls_port();
    let wrong = format!("rediss://127.0.0.1:{port}?tls_server_name=redis.example");
    let mut c = client(Builder::new([wrong]).tls_ca_file(pki.ca()));
    let fault = only_fault(
        &c.try_lock("res")
            .expect_err("a certificate for another name"),
    );
    assert!(
        matches!(&fault, NodeFault::Tls(why) if why.contains("not valid for name")),
        "{fault:?}"
    );
    // The certificate names localhost: connecting by IP with that name works.
    let ca = pki.ca();
    let right = format!(
        "rediss://127.0.0.1:{port}?tls_server_name=localhost&tls_ca={}",
        ca.display()
    );
    let mut c = client(Builder::new([right]));
    let lock = c.try_lock("res").expect("the right name");
    c.unlock(lock).unwrap();
}

#[test]
fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::generate();
    let servers = tls_servers(&pki, 1, ClientAuth::Required);
    let mut c = client(Builder::new(urls(&servers)).tls_ca_file(pki.ca()));
    let fault = only_fault(&c.try_lock("res").expect_err("no client certificate"));
    assert!(
        matches!(
            &fault,
            NodeFault::Tls(_) | NodeFault::Closed | NodeFault::Io(_)
        ),
        "{fault:?}"
    );
    eprintln!("without a client certificate: {fault}");
    assert_eq!(servers[0].dbsize(), 0, "nothing reached the server");

    let mut c = client(
        Builder::new(urls(&servers))
            .tls_ca_file(pki.ca())
            .tls_client_cert(pki.client_cert(), pki.client_key()),
    );
    let lock = c.try_lock("res").expect("with the client certificate");
    assert_eq!(c.unlock(lock).unwrap(), 1);
    // The same through the address's own options.
    let url = format!(
        "{}?tls_ca={}&tls_cert={}&tls_key={}",
        servers[0].tls_url(),
        pki.ca().display(),
        pki.client_cert().display(),
        pki.client_key().display()
    );
    let mut c = client(Builder::new([url]));
    let lock = c
        .try_lock("res")
        .expect("with the address's client certificate");
    assert_eq!(c.unlock(lock).unwrap(), 1);
}

#[test]
fn a_node_frozen_mid_handshake_times_out_and_the_others_carry_the_quorum() {
    let pki = Pki::generate();
    let mut servers = tls_servers(&pki, 3, ClientAuth::No);
    // Frozen before we connect: the kernel completes TCP's handshake, the server never
    // answers the ClientHello.
    servers[2].freeze();
    let mut c = client(Builder::new(urls(&servers)).tls_ca_file(pki.ca()));
    let started = Instant::now();
    let lock = c.try_lock("res").expect("two of three carry the quorum");
    assert!(started.elapsed() < HANG);
    c.unlock(lock).unwrap();
    // Alone, the frozen node is a typed failure, not a hang.
    let frozen = servers[2].tls_url();
    let mut alone = client(Builder::new([frozen]).tls_ca_file(pki.ca()));
    let e = alone.try_lock("res").expect_err("a frozen node");
    let fault = only_fault(&e);
    assert!(
        matches!(fault, NodeFault::ConnectTimeout | NodeFault::Timeout),
        "{fault:?}: {e}"
    );
    servers[2].resume();
    let deadline = Instant::now() + HANG;
    loop {
        match alone.try_lock("res2") {
            Ok(lock) => break drop(alone.unlock(lock)),
            Err(e) if Instant::now() < deadline => {
                alone.idle_until(Instant::now() + Duration::from_millis(20));
                eprintln!("after the thaw: {e}");
            }
            Err(e) => panic!("the thawed node never came back: {e}"),
        }
    }
}

#[test]
fn a_tls_address_on_a_plain_port_is_a_typed_failure() {
    let pki = Pki::generate();
    let s = Server::start();
    let url = format!("rediss://127.0.0.1:{}", s.port());
    let mut c = client(Builder::new([url]).tls_ca_file(pki.ca()));
    // Redis reads the ClientHello as the start of an inline command and waits for its end.
    let fault = only_fault(&c.try_lock("res").expect_err("plain port"));
    assert!(
        matches!(fault, NodeFault::Timeout | NodeFault::ConnectTimeout),
        "{fault:?}"
    );
}

/// A server that closes the connection before the handshake — a TLS Redis over its
/// `maxclients` does, before any TLS byte — is a passing fault that a wait outlasts, as over
/// plain TCP; it was a TLS failure, final (`lock` gave up at once, the CLI said "configuration").
#[test]
fn a_tls_server_closing_before_the_handshake_is_a_passing_fault() {
    use std::io::Read;
    let pki = Pki::generate();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // Reads the ClientHello, then closes (a FIN, nothing written).
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = conn.read(&mut [0u8; 4096]);
        }
    });
    let mut c = client(Builder::new([format!("rediss://127.0.0.1:{port}")]).tls_ca_file(pki.ca()));
    let e = c.try_lock("res").expect_err("closed");
    assert!(!e.is_permanent(), "{e}");
    assert!(matches!(only_fault(&e), NodeFault::Closed), "{e}");
    // A wait goes on trying (after the reconnect backoff) until its deadline.
    let e = c
        .lock_until("res", Instant::now() + Duration::from_millis(1_500))
        .expect_err("still closed");
    assert!(!e.is_permanent(), "{e}");
    assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) >= 3);
}

#[test]
fn tls_options_without_a_tls_server_and_unreadable_files_are_configuration_errors() {
    let pki = Pki::generate();
    let e = Builder::new(["redis://127.0.0.1:6379"])
        .tls_ca_file(pki.ca())
        .build_client()
        .expect_err("TLS options, plain address");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("rediss://")),
        "{e}"
    );
    let missing = pki.dir().join("nope.pem");
    let e = Builder::new(["rediss://127.0.0.1:6379"])
        .tls_ca_file(&missing)
        .build_client()
        .expect_err("missing CA file");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("nope.pem")),
        "{e}"
    );
    let e = Builder::new(["rediss://127.0.0.1:6379"])
        .tls_client_cert(pki.client_cert(), &missing)
        .tls_ca_file(pki.ca())
        .build_client()
        .expect_err("missing key file");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("client key")),
        "{e}"
    );
}

/// Issue 36, item 5: a wait (`lock_until`) against servers whose certificates do not verify
/// ends at the first attempt with a final error: no retry mends a wrong CA. Before, it made an
/// attempt every retry pause until its deadline (about 30 in 10 s).
#[test]
fn waiting_ends_at_once_when_no_certificate_verifies() {
    let pki = Pki::generate();
    let servers = tls_servers(&pki, 3, ClientAuth::No);
    let redlock = Builder::new(urls(&servers))
        .tls_ca_file(pki.other_ca())
        .quarantine(None)
        .build()
        .unwrap();
    let e = redlock
        .lock_until("res", std::time::Instant::now() + Duration::from_secs(10))
        .expect_err("an untrusted certificate");
    assert!(e.is_permanent(), "{e}");
    let attempts = redlock.stats().acquire.count();
    assert!(attempts <= 2, "{attempts} attempts for a wrong CA");
    for s in servers.iter() {
        assert_eq!(s.dbsize(), 0, "nothing reached {}", s.addr());
    }
}

/// A node behind TLS and a slower link: an operation that connects it (the first, or one after
/// the server closed the idle connection) returns at the quorum of the other two, the TLS
/// handshake half done; nothing polls until the operation after (a `Client`), which read the
/// server's answer only past the connect deadline — and its timers then failed the connection as timed out,
/// the healthy node backing off and counted down at every operation spaced more than the
/// connect timeout apart. A deadline that passed while nobody watched, on a
/// socket that made progress since, is moved once.
#[test]
fn a_tls_handshake_nobody_polled_past_its_deadline_is_not_failed_for_it() {
    let pki = Pki::generate();
    let servers = tls_servers(&pki, 3, ClientAuth::No);
    let far = std::net::SocketAddr::from(([127, 0, 0, 1], servers[2].tls_port()));
    let relay = redis_local::Relay::start(far, Duration::from_millis(50));
    let urls = [
        servers[0].tls_url(),
        servers[1].tls_url(),
        format!("rediss://{}", relay.addr()),
    ];
    let connect_timeout = Duration::from_millis(300);
    let mut c = Builder::new(urls)
        .tls_ca_file(pki.ca())
        .client_name("slow-node-test")
        .quarantine(None)
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(connect_timeout)
        .build_client()
        .unwrap();
    // The first operation connects: it returns at the quorum of the nearer two.
    let a = c.try_lock("a").unwrap();
    let downs = c.stats().nodes[2].downs;
    // Not a synchronisation: the idle gap between two operations, longer than the connect
    // timeout, in which nothing polls.
    std::thread::sleep(2 * connect_timeout);
    let b = c.try_lock("b").unwrap();
    let vote = b.votes().vote(2);
    assert_ne!(vote, Some(redlock_mux::LockVote::Unreachable), "{b:?}");
    assert_eq!(c.stats().nodes[2].downs, downs, "{:?}", c.stats().nodes[2]);
    c.unlock(a).unwrap();
    c.unlock(b).unwrap();
}
