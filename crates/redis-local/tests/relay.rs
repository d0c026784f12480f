//! The relay's faults, each checked on the wire: what reaches each side, what is held, lost or
//! dripped, and which connections stay open.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use redis_local::{Connects, Direction, Event, FakeServer, Flow, Peer, Relay, Server, resp_encode};

/// How long a side waits to be sure that nothing comes: bytes through a healthy loopback relay
/// take well under a millisecond, so this is silence, not slowness.
const QUIET: Duration = Duration::from_millis(300);
/// Bound on every wait for something that must come.
const LONG: Duration = Duration::from_secs(5);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(5);

/// An echo server on a fresh loopback port: every byte read is written back.
fn echo() -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            thread::spawn(move || {
                let _ = std::io::copy(&mut &conn, &mut &conn);
            });
        }
    });
    addr
}

/// A connection through `relay`, once the relay has accepted it (a connection still in the
/// accept queue when connects are made to hang would wait there, unserved, until the heal).
fn connect(relay: &Relay) -> TcpStream {
    let before = relay.stats().accepted;
    let s = TcpStream::connect(relay.addr()).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    wait_until("the relay accepted the connection", || {
        relay.stats().accepted > before
    });
    s
}

fn read_exactly(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).unwrap();
    buf
}

/// Nothing arrives on `s` for [`QUIET`], not even the end of the stream.
fn assert_silent(s: &mut TcpStream) {
    s.set_read_timeout(Some(QUIET)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        Ok(0) => panic!("the connection was closed"),
        other => panic!("expected silence, got {other:?}"),
    }
    s.set_read_timeout(Some(LONG)).unwrap();
}

/// Waits until `what` holds, at most [`LONG`].
fn wait_until(label: &str, mut what: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !what() {
        assert!(Instant::now() < deadline, "never: {label}");
        thread::sleep(POLL);
    }
}

#[test]
fn a_healthy_relay_forwards_both_ways() {
    let relay = Relay::start(echo(), Duration::ZERO);
    let mut s = connect(&relay);
    s.write_all(b"ping").unwrap();
    assert_eq!(read_exactly(&mut s, 4), b"ping");
    // Counted once written: the client may have read the echo a moment before.
    wait_until("both ways counted", || {
        let stats = relay.stats();
        stats.to_server.forwarded == 4 && stats.to_client.forwarded == 4
    });
    assert_eq!(relay.stats().accepted, 1);
}

#[test]
fn a_partition_holds_every_byte_and_delivers_them_in_order_at_the_heal() {
    let relay = Relay::start(echo(), Duration::ZERO);
    let mut s = connect(&relay);
    s.write_all(b"before").unwrap();
    assert_eq!(read_exactly(&mut s, 6), b"before");
    relay.partition();
    s.write_all(b"one ").unwrap();
    s.write_all(b"two").unwrap();
    assert_silent(&mut s);
    wait_until("the relay read the bytes sent into the partition", || {
        relay.stats().to_server.read == 13
    });
    relay.heal();
    assert_eq!(read_exactly(&mut s, 7), b"one two");
    assert_eq!(relay.stats().to_server.dropped, 0);
}

#[test]
fn a_black_hole_loses_bytes_and_a_connection_that_lost_some_stays_dead_after_the_heal() {
    let relay = Relay::start(echo(), Duration::ZERO);
    let mut s = connect(&relay);
    relay.black_hole();
    s.write_all(b"lost").unwrap();
    assert_silent(&mut s);
    wait_until("the bytes counted lost", || {
        relay.stats().to_server.dropped == 4
    });
    relay.heal();
    // The lost bytes would have come first: nothing of this connection passes again, and it is
    // not closed either.
    s.write_all(b"later").unwrap();
    assert_silent(&mut s);
    // A new connection is whole.
    let mut fresh = connect(&relay);
    fresh.write_all(b"fresh").unwrap();
    assert_eq!(read_exactly(&mut fresh, 5), b"fresh");
}

#[test]
fn a_partition_during_which_nothing_was_sent_leaves_the_connection_whole() {
    let relay = Relay::start(echo(), Duration::ZERO);
    let mut s = connect(&relay);
    relay.black_hole();
    relay.heal();
    s.write_all(b"still").unwrap();
    assert_eq!(read_exactly(&mut s, 5), b"still");
}

#[test]
fn requests_lost_one_way_never_run_and_replies_lost_one_way_leave_them_run() {
    let server = Server::start();
    let relay = Relay::start(server.socket_addr(), Duration::ZERO);
    let mut s = connect(&relay);
    // Client to server lost: the server runs nothing.
    relay.set_flow(Direction::ToServer, Flow::Drop);
    s.write_all(&resp_encode(&["SET", "a", "1"])).unwrap();
    wait_until("the relay read the request", || {
        relay.stats().to_server.dropped > 0
    });
    assert_silent(&mut s);
    assert_eq!(server.get("a"), None);
    relay.heal();
    // Server to client lost, on a new connection (the old one lost a request): the server runs
    // it, the client never hears.
    let mut s = connect(&relay);
    relay.set_flow(Direction::ToClient, Flow::Drop);
    s.write_all(&resp_encode(&["SET", "b", "2"])).unwrap();
    wait_until("the server ran the request", || {
        server.get("b").as_deref() == Some("2")
    });
    assert_silent(&mut s);
    // `+OK\r\n` lost.
    wait_until("the reply counted lost", || {
        relay.stats().to_client.dropped == 5
    });
}

#[test]
fn a_severed_connection_is_closed_on_the_server_and_left_open_and_silent_for_the_client() {
    let fake = FakeServer::start(|p: &mut Peer| {
        while let Some(_cmd) = p.command() {
            if !p.send(b"+OK\r\n") {
                return;
            }
        }
    });
    let relay = Relay::start(fake.node().parse().unwrap(), Duration::ZERO);
    let mut s = connect(&relay);
    s.write_all(&resp_encode(&["PING"])).unwrap();
    assert_eq!(read_exactly(&mut s, 5), b"+OK\r\n");
    assert_eq!(relay.sever(), 1);
    // The server sees its client go.
    fake.wait_for("the server's side closed", |e| matches!(e, Event::Done(0)));
    // The client gets nothing: no reply, no FIN, no RST.
    s.write_all(&resp_encode(&["PING"])).unwrap();
    assert_silent(&mut s);
    assert_eq!(relay.stats().severed, 1);
    // New connections are served.
    let mut fresh = connect(&relay);
    fresh.write_all(&resp_encode(&["PING"])).unwrap();
    assert_eq!(read_exactly(&mut fresh, 5), b"+OK\r\n");
    drop(s);
    wait_until(
        "the severed connection closed once the client closed it",
        || relay.open_connections() == 1,
    );
}

/// The drip's interval: long enough that eight bytes cannot pass in less than 70 ms whatever
/// the scheduler does, short enough to keep the test quick.
const DRIP: Duration = Duration::from_millis(10);

#[test]
fn a_drip_forwards_one_byte_per_interval() {
    let relay = Relay::start(echo(), Duration::ZERO);
    let mut s = connect(&relay);
    relay.set_flow(Direction::ToClient, Flow::Drip(DRIP));
    let t0 = Instant::now();
    s.write_all(b"12345678").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8];
    while got.len() < 8 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"12345678");
    // Seven gaps between eight bytes: a lower bound, which load can only lengthen.
    assert!(t0.elapsed() >= DRIP * 7, "{:?}", t0.elapsed());
    relay.heal();
    s.write_all(b"whole").unwrap();
    assert_eq!(read_exactly(&mut s, 5), b"whole");
}

/// How long a connect is given to show that it does not complete. Linux sends the first SYN
/// again after 1 s; a connect that completes does so within a millisecond on loopback.
const HUNG: Duration = Duration::from_millis(500);

#[test]
fn connects_hang_until_the_heal_and_the_relay_s_own_filler_is_never_served() {
    let fake = FakeServer::start(|p: &mut Peer| while p.skip_input() {});
    let relay = Relay::start(fake.node().parse().unwrap(), Duration::ZERO);
    let open = connect(&relay);
    relay.set_connects(Connects::Hang);
    for _ in 0..3 {
        match TcpStream::connect_timeout(&relay.addr(), HUNG) {
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
                "{e}"
            ),
            Ok(_) => panic!("a connect completed while connects hang"),
        }
    }
    relay.set_connects(Connects::Complete);
    let _fresh = connect(&relay);
    wait_until("the fresh connection reached the server", || {
        fake.accepted() == 2
    });
    assert_eq!(relay.stats().accepted, 2, "the filler was served");
    drop(open);
}
