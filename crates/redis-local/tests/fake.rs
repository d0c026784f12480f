//! The fake server: commands in, events out, replies (whole or trickled), TLS, and the relay in
//! front of a fake.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis_local::{Event, FakeServer, Peer, Relay, resp_encode};

const LONG: Duration = Duration::from_secs(5);

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s
}

fn read_exactly(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).unwrap();
    buf
}

/// Answers `+OK` to every command.
fn ok(p: &mut Peer) {
    while p.command().is_some() {
        if !p.send(b"+OK\r\n") {
            return;
        }
    }
}

#[test]
fn commands_split_anywhere_are_reported_whole() {
    let fake = FakeServer::start(ok);
    let mut s = connect(fake.port());
    let mut wire = resp_encode(&["SET", "k", "v"]);
    wire.extend(resp_encode(&["GET", "k"]));
    for piece in wire.chunks(3) {
        s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(read_exactly(&mut s, 10), b"+OK\r\n+OK\r\n");
    assert_eq!(
        fake.wait_for("accept", |e| matches!(e, Event::Accepted(_))),
        Event::Accepted(0)
    );
    let commands: Vec<Event> = [b"SET".as_slice(), b"GET"]
        .iter()
        .map(|verb| {
            fake.wait_for(
                "a command",
                |e| matches!(e, Event::Command(0, c) if c[0] == *verb),
            )
        })
        .collect();
    assert_eq!(
        commands[0],
        Event::Command(0, vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()])
    );
    drop(s);
    fake.wait_for("the end", |e| *e == Event::Done(0));
    assert_eq!(fake.accepted(), 1);
}

#[test]
fn trickled_replies_arrive_one_byte_at_a_time_and_notes_reach_the_test() {
    let fake = FakeServer::start(|p: &mut Peer| {
        if p.command().is_some() && p.trickle(b"+OK\r\n", Duration::from_millis(2)) {
            p.note("trickled");
        }
    });
    let mut s = connect(fake.port());
    s.write_all(&resp_encode(&["PING"])).unwrap();
    assert_eq!(read_exactly(&mut s, 5), b"+OK\r\n");
    fake.wait_for("the note", |e| *e == Event::Note(0, "trickled"));
}

#[test]
#[should_panic(expected = "a fake server thread panicked")]
fn a_client_sending_something_else_than_commands_fails_the_test() {
    let fake = FakeServer::start(ok);
    let mut s = connect(fake.port());
    s.write_all(b"+not a command\r\n").unwrap();
    // The handler's panic closes the connection; dropping the fake passes the panic on.
    assert_eq!(s.read(&mut [0u8; 16]).unwrap(), 0);
    drop(fake);
}

#[test]
fn a_relay_delays_each_direction() {
    let fake = FakeServer::start(ok);
    let one_way = Duration::from_millis(50);
    let relay = Relay::start(
        format!("127.0.0.1:{}", fake.port()).parse().unwrap(),
        one_way,
    );
    let mut s = TcpStream::connect(relay.addr()).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let started = Instant::now();
    s.write_all(&resp_encode(&["PING"])).unwrap();
    assert_eq!(read_exactly(&mut s, 5), b"+OK\r\n");
    assert!(started.elapsed() >= 2 * one_way, "{:?}", started.elapsed());
    assert_eq!(relay.url(), format!("redis://{}", relay.addr()));
}

#[test]
fn a_tls_fake_speaks_tls_and_names_its_ca_in_the_url() {
    let pki = redis_local::Pki::generate();
    let fake = FakeServer::start_tls(ok, &pki);
    assert_eq!(
        fake.url(),
        format!(
            "rediss://127.0.0.1:{}?tls_ca={}",
            fake.port(),
            pki.ca().display()
        )
    );
    // A plain client gets no RESP back: the fake waits for a TLS ClientHello.
    let mut s = connect(fake.port());
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(&resp_encode(&["PING"])).unwrap();
    let mut buf = [0u8; 5];
    assert!(!matches!(s.read(&mut buf), Ok(5) if &buf == b"+OK\r\n"));
}
