//! Hostile servers: a fake TCP "Redis" that does what a real one never does — garbage, replies
//! trickled a byte at a time, absurd lengths, endless nesting, unsolicited replies, silence,
//! slammed doors, endless lines — against a client with one node (the fake) and with three (the
//! fake between two real servers that carry the quorum).
//!
//! Every case asserts a typed error naming the node within the configured timeouts (or success
//! where the bytes are valid), no panic, no hang (each test runs under a watchdog), and that each
//! connection's undecoded input stays below `Limits::CLIENT.max_frame_len` plus one read chunk.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_local::fake::WAIT;
use redis_local::{Event, FakeServer, Peer};
use redlock_mux::resp::{Limits, ParseError};
use redlock_mux::{Builder, Client, Error, Lock, NodeFault};

/// Most undecoded input a connection may hold: one frame at the limit plus one read chunk.
const IN_LIMIT: usize = Limits::CLIENT.max_frame_len + 8192;
/// Unsent output is a handful of tiny commands here; anything near this means it piles up.
const OUT_LIMIT: usize = 64 << 10;
/// A test that runs longer than this is hung.
const WATCHDOG: Duration = Duration::from_secs(30);
/// Scheduling slack allowed on top of a configured timeout (shared 2-core VMs are slow).
const SLACK: Duration = Duration::from_millis(400);

fn verb(cmd: &[Vec<u8>]) -> &[u8] {
    cmd.first().map_or(&[][..], Vec::as_slice)
}

fn is_script(cmd: &[Vec<u8>]) -> bool {
    matches!(verb(cmd), b"EVAL" | b"EVALSHA")
}

// ---------------------------------------------------------------------------
// The hostile behaviours
// ---------------------------------------------------------------------------

/// The eight misbehaviours, each a connection handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hostile {
    /// 1. Answers the first command with bytes that are not RESP.
    Garbage,
    /// 2. Valid replies (`+OK` to SET, `:1` to scripts) one byte every 10 ms.
    Trickle,
    /// 3. `$999999999\r\n`, then closes.
    HugeBulk,
    /// 4. `*1\r\n` nested a million deep, in chunks.
    Deep,
    /// 5. Two `+OK` for the first SET; `$-1` (held) for every later SET, `:0` for scripts.
    Extra,
    /// 6. Reads everything, answers nothing.
    Silent,
    /// 7. Closes each connection right after accepting it.
    SlamShut,
    /// 8. `+aaaa…` with no CRLF, up to 4 MiB.
    EndlessLine,
}

const ALL: [Hostile; 8] = [
    Hostile::Garbage,
    Hostile::Trickle,
    Hostile::HugeBulk,
    Hostile::Deep,
    Hostile::Extra,
    Hostile::Silent,
    Hostile::SlamShut,
    Hostile::EndlessLine,
];

const TRICKLE_GAP: Duration = Duration::from_millis(10);
/// Levels of `*1` the deep flood offers: 32 MiB, more than loopback buffers take while the
/// client reads nothing (a send buffer grows to `tcp_wmem`'s 4 MiB here): with 4 MiB on offer,
/// a client slow to close on a loaded machine let the fake send it all, and "cut off" was not
/// seen although the client read no more than before.
const DEEP_LEVELS: usize = 8 << 20;
const ENDLESS_BYTES: usize = 4 << 20;

/// Sends `unit` `count` times in chunks of about 16 KiB; returns the bytes written before the
/// client went away.
fn flood(p: &mut Peer, first: &[u8], unit: &[u8], count: usize) -> usize {
    if !p.send(first) {
        return 0;
    }
    let per_chunk = (16 << 10) / unit.len();
    let chunk = unit.repeat(per_chunk);
    let mut sent = first.len();
    let mut left = count;
    while left > 0 {
        let k = left.min(per_chunk);
        if !p.send(&chunk[..k * unit.len()]) {
            return sent;
        }
        sent += k * unit.len();
        left -= k;
    }
    sent
}

impl Hostile {
    fn handler(self) -> impl Fn(&mut Peer) + Send + Sync + 'static {
        let sets = Arc::new(AtomicUsize::new(0));
        move |p: &mut Peer| match self {
            Hostile::Garbage => {
                while p.command().is_some() {
                    if !p.send(b"@@@@ not resp\r\n") {
                        return;
                    }
                }
            }
            Hostile::Trickle => {
                while let Some(cmd) = p.command() {
                    let reply: &[u8] = if is_script(&cmd) {
                        b":1\r\n"
                    } else {
                        b"+OK\r\n"
                    };
                    if !p.trickle(reply, TRICKLE_GAP) {
                        return;
                    }
                    p.note("trickled");
                }
            }
            Hostile::HugeBulk => {
                if p.command().is_some() {
                    p.send(b"$999999999\r\n");
                }
            }
            Hostile::Deep => {
                if p.command().is_some() {
                    let sent = flood(p, b"", b"*1\r\n", DEEP_LEVELS);
                    p.note(if sent < DEEP_LEVELS * 4 {
                        "cut off"
                    } else {
                        "all sent"
                    });
                    p.drain();
                }
            }
            Hostile::Extra => {
                while let Some(cmd) = p.command() {
                    let reply: &[u8] = if is_script(&cmd) {
                        b":0\r\n"
                    } else if sets.fetch_add(1, Ordering::SeqCst) == 0 {
                        b"+OK\r\n+OK\r\n"
                    } else {
                        b"$-1\r\n"
                    };
                    if !p.send(reply) {
                        return;
                    }
                }
            }
            Hostile::Silent => p.drain(),
            Hostile::SlamShut => {}
            Hostile::EndlessLine => {
                if p.command().is_some() {
                    let sent = flood(p, b"+", b"aaaaaaaaaaaaaaaa", ENDLESS_BYTES / 16);
                    p.note(if sent < ENDLESS_BYTES {
                        "cut off"
                    } else {
                        "all sent"
                    });
                    p.drain();
                }
            }
        }
    }

    /// Whether `fault` is what this behaviour must produce when it is the only node.
    fn expected(self, fault: &NodeFault) -> bool {
        match self {
            Hostile::Garbage => *fault == NodeFault::Protocol(ParseError::UnknownType(b'@')),
            Hostile::HugeBulk => *fault == NodeFault::Protocol(ParseError::BulkTooLong),
            Hostile::Deep => *fault == NodeFault::Protocol(ParseError::TooDeep),
            // The first attempt waits its node timeout; the next do not wait for a node silent
            // since, and say so.
            Hostile::Silent => matches!(fault, NodeFault::Timeout | NodeFault::Silent),
            // The FIN, or an RST when the server closed with our SET unread.
            // Over TLS, a door slammed during the handshake is a TLS fault.
            Hostile::SlamShut => matches!(
                fault,
                NodeFault::Closed
                    | NodeFault::Tls(_)
                    | NodeFault::Io(
                        io::ErrorKind::ConnectionReset
                            | io::ErrorKind::BrokenPipe
                            | io::ErrorKind::ConnectionAborted
                    )
            ),
            Hostile::EndlessLine => *fault == NodeFault::Protocol(ParseError::LineTooLong),
            Hostile::Trickle | Hostile::Extra => false,
        }
    }
}

// ---------------------------------------------------------------------------
// Client-side helpers
// ---------------------------------------------------------------------------

/// Runs `body` on its own thread and fails the test if it does not finish within [`WATCHDOG`]
/// (panics inside are passed on as they are).
fn bounded(body: impl FnOnce() + Send + 'static) {
    let (done_tx, done) = mpsc::channel::<()>();
    let worker = thread::spawn(move || {
        body();
        let _ = done_tx.send(());
    });
    match done.recv_timeout(WATCHDOG) {
        // Disconnected: the body panicked; join to pass the panic on.
        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(RecvTimeoutError::Timeout) => panic!("the test hung for {WATCHDOG:?}"),
    }
}

fn client(urls: Vec<String>, node_timeout: Duration) -> Client {
    Builder::new(urls)
        // No INFO memory asked, as before the eviction check: the fake answers none.
        .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
        .quarantine(None)
        .node_timeout(node_timeout)
        .connect_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build_client()
        .expect("client")
}

/// Asserts every connection's buffers are within their limits.
fn assert_bounded(c: &Client, when: &str) {
    for (node, (out, inp)) in c.nodes().iter().zip(redlock_mux::testing::buffered(c)) {
        assert!(
            inp < IN_LIMIT,
            "{when}: {node} holds {inp} undecoded input bytes (limit {IN_LIMIT})"
        );
        assert!(
            out < OUT_LIMIT,
            "{when}: {node} holds {out} unsent output bytes"
        );
    }
}

/// Asserts that `result` is a failure of the one node `node`, with a fault `expected` accepts,
/// (looking through `Backoff`), that its message names the node, and that it came within
/// `within`. Returns the fault as reported (`Backoff` included).
fn assert_fault(
    result: Result<Lock, Error>,
    node: &str,
    started: Instant,
    within: Duration,
    expected: impl Fn(&NodeFault) -> bool,
) -> NodeFault {
    let elapsed = started.elapsed();
    let error = match result {
        Ok(lock) => panic!("acquired {lock:?} from a hostile node {node}"),
        Err(e) => e,
    };
    assert!(
        elapsed < within,
        "{error} came after {elapsed:?}, not within {within:?}"
    );
    let Error::NoQuorum(report) = &error else {
        panic!("expected NoQuorum from {node}, got {error:?}");
    };
    let failed: Vec<(String, NodeFault)> = report
        .failed()
        .map(|(addr, fault)| (addr.to_string(), fault.clone()))
        .collect();
    let [(who, fault)] = &failed[..] else {
        panic!("expected one failed node in {error}");
    };
    assert_eq!(who, node, "{error}");
    assert!(
        expected(fault.root()),
        "unexpected fault {fault:?} in: {error}"
    );
    let message = error.to_string();
    assert!(message.contains(node), "{message:?} does not name {node}");
    eprintln!("{node}: {message} [{fault:?}] after {elapsed:?}");
    fault.clone()
}

/// Runs the client's event loop for `d`, sampling the buffers every few milliseconds; returns the
/// largest undecoded input seen.
fn idle_sampling(c: &mut Client, d: Duration, mut until: impl FnMut() -> bool) -> usize {
    let end = Instant::now() + d;
    let mut most = 0;
    while Instant::now() < end && !until() {
        c.idle_until(Instant::now() + Duration::from_millis(2));
        assert_bounded(c, "while idle");
        most = most.max(
            redlock_mux::testing::buffered(c)
                .iter()
                .map(|b| b.1)
                .max()
                .unwrap_or(0),
        );
    }
    most
}

/// The N = 1 flow for the behaviours that must fail: one attempt, the exact fault, bounded
/// buffers, a bounded time; then a second attempt fails the same way — on a new connection, or
/// at once while the client backs off from a node that never answered properly.
fn single_node_fails(hostile: Hostile, node_timeout: Duration) -> (FakeServer, Client) {
    fails_alone(FakeServer::start(hostile.handler()), hostile, node_timeout)
}

/// [`single_node_fails`] on a given fake (plain or TLS).
fn fails_alone(fake: FakeServer, hostile: Hostile, node_timeout: Duration) -> (FakeServer, Client) {
    let mut c = client(vec![fake.url()], node_timeout);
    let mut first = None;
    for attempt in ["first", "second"] {
        let started = Instant::now();
        let result = c.try_lock("res");
        assert_bounded(&c, attempt);
        let fault = assert_fault(result, &fake.node(), started, node_timeout + SLACK, |f| {
            hostile.expected(f)
        });
        match first.take() {
            None => {
                assert!(
                    !matches!(fault, NodeFault::Backoff(_)),
                    "a fresh client backs off: {fault:?}"
                );
                first = Some(fault);
            }
            Some(first) => {
                // The same fault again (a fresh connection), or the first one behind Backoff;
                // after a timeout, the node is silent (not waited for).
                assert!(
                    fault == first
                        || fault == NodeFault::Backoff(Box::new(first.clone()))
                        || (first == NodeFault::Timeout && fault == NodeFault::Silent),
                    "first {first:?}, then {fault:?}"
                );
                let backed_off = matches!(fault, NodeFault::Backoff(_));
                let accepted = fake.accepted();
                assert!(
                    (1..=3).contains(&accepted),
                    "{accepted} connections for two attempts (backed off: {backed_off})"
                );
            }
        }
    }
    (fake, c)
}

// ---------------------------------------------------------------------------
// N = 1: the fake is the only node
// ---------------------------------------------------------------------------

#[test]
fn garbage_in_answer_to_set_is_an_unknown_type_byte() {
    bounded(|| {
        let (_fake, c) = single_node_fails(Hostile::Garbage, Duration::from_millis(100));
        assert_bounded(&c, "after");
    });
}

#[test]
fn reply_trickled_one_byte_at_a_time_is_reassembled() {
    bounded(|| {
        let fake = FakeServer::start(Hostile::Trickle.handler());
        let mut c = client(vec![fake.url()], Duration::from_millis(500));
        let started = Instant::now();
        let lock = c.try_lock("res").expect("a trickled +OK is still +OK");
        // 5 bytes, one write each, 10 ms apart: the reply arrived in pieces.
        assert!(started.elapsed() >= 4 * TRICKLE_GAP);
        assert_bounded(&c, "after the trickled +OK");
        let Event::Command(0, set) = fake.wait_for("SET", |e| matches!(e, Event::Command(..)))
        else {
            unreachable!()
        };
        assert_eq!(verb(&set), b"SET");
        assert_eq!(set[1], b"res");
        assert_eq!(set[2], lock.token().as_bytes());
        assert_eq!(&set[3..5], [b"NX".to_vec(), b"PX".to_vec()]);
        let token = lock.token().as_bytes().to_vec();
        match c.unlock(lock) {
            Ok(1) => {}
            other => panic!("a trickled :1 is still 1, got {other:?}"),
        }
        assert_bounded(&c, "after the trickled :1");
        let Event::Command(0, script) = fake.wait_for("EVAL", |e| matches!(e, Event::Command(..)))
        else {
            unreachable!()
        };
        // First use of the script on this connection: the body itself, not its hash.
        assert_eq!(verb(&script), b"EVAL");
        assert_eq!(&script[2..], [b"1".to_vec(), b"res".to_vec(), token]);
        assert_eq!(fake.accepted(), 1, "one connection throughout");
    });
}

#[test]
fn huge_bulk_length_then_close_is_bulk_too_long() {
    bounded(|| {
        let (_fake, c) = single_node_fails(Hostile::HugeBulk, Duration::from_millis(100));
        assert_bounded(&c, "after");
    });
}

#[test]
fn a_million_nested_arrays_are_refused_early_not_buffered() {
    bounded(|| {
        let (fake, c) = single_node_fails(Hostile::Deep, Duration::from_millis(200));
        // 32 MiB were on offer; reading them all would take 4,000+ reads of 8 KiB.
        let reads = c.stats().io.reads;
        assert!(
            reads < 100,
            "{reads} reads: the client kept reading the flood"
        );
        // The client closed the connection before the fake had sent everything.
        let outcome = fake.wait_for("the end of the flood", |e| matches!(e, Event::Note(0, _)));
        assert_eq!(outcome, Event::Note(0, "cut off"));
        assert_bounded(&c, "after");
    });
}

#[test]
fn unsolicited_extra_reply_is_never_taken_for_a_later_request() {
    bounded(|| {
        let fake = FakeServer::start(Hostile::Extra.handler());
        let node = fake.node();
        let mut c = client(vec![fake.url()], Duration::from_millis(100));
        // The first SET gets `+OK` twice in one read: the surplus takes the yes back, so the
        // acquire fails, and the connection is dropped.
        let started = Instant::now();
        let first = c.try_lock("res");
        assert_bounded(&c, "after the double +OK");
        assert_fault(
            first,
            &node,
            started,
            Duration::from_millis(100) + SLACK,
            |f| matches!(f, NodeFault::Unexpected(_)),
        );
        // The next SET is answered `$-1` (held). Taking the stale `+OK` for its reply would
        // hand out a lock that is held elsewhere.
        let started = Instant::now();
        match c.try_lock("res") {
            Err(Error::Held(report)) => {
                let refused: Vec<String> = report.refused().map(|a| a.to_string()).collect();
                assert_eq!(refused, std::slice::from_ref(&node), "{report}");
                let message = Error::Held(report).to_string();
                assert!(message.contains(&node), "{message:?} does not name {node}");
                eprintln!("{node}: {message}");
            }
            other => panic!("expected Held after the surplus reply, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(100) + SLACK);
        assert_bounded(&c, "after the held reply");
        assert_eq!(
            fake.accepted(),
            2,
            "the connection with the surplus reply must be replaced: {:?}",
            fake.seen()
        );
    });
}

#[test]
fn unsolicited_reply_arriving_between_requests_is_never_taken_for_the_next() {
    bounded(|| {
        // Like the previous test, but the surplus `+OK` arrives on its own, after the first
        // acquire returned and before the next request is sent.
        let (go_tx, go) = mpsc::channel::<()>();
        let go = Mutex::new(go);
        let fake = FakeServer::start(move |p: &mut Peer| {
            let mut sets = 0;
            while let Some(cmd) = p.command() {
                if is_script(&cmd) {
                    p.send(b":0\r\n");
                    continue;
                }
                sets += 1;
                if sets == 1 && p.id == 0 {
                    p.send(b"+OK\r\n");
                    let ok = go.lock().unwrap().recv_timeout(WAIT).is_ok();
                    if ok && p.send(b"+OK\r\n") {
                        p.note("surplus sent");
                    }
                } else {
                    p.send(b"$-1\r\n");
                }
            }
        });
        let node = fake.node();
        let mut c = client(vec![fake.url()], Duration::from_millis(100));
        let first = c.try_lock("res").expect("the first SET got a plain +OK");
        go_tx.send(()).unwrap();
        fake.wait_for("surplus", |e| matches!(e, Event::Note(0, "surplus sent")));
        // On loopback the surplus is in our socket buffer once the fake's write returned.
        match c.try_lock("res") {
            Err(Error::Held(report)) => {
                assert_eq!(
                    report.refused().map(|a| a.to_string()).collect::<Vec<_>>(),
                    std::slice::from_ref(&node)
                );
            }
            // Noticing the stray bytes and failing the node is acceptable too.
            Err(Error::NoQuorum(report)) => {
                let failed: Vec<_> = report.failed().map(|(a, _)| a.to_string()).collect();
                assert_eq!(failed, std::slice::from_ref(&node), "{report}");
            }
            Ok(second) => {
                // Show what the fake really answered to the SET that was "granted".
                fake.wait_for(
                    "the second SET",
                    |e| matches!(e, Event::Command(0, cmd) if verb(cmd) == b"SET"),
                );
                panic!(
                    "the stale +OK was taken for the second SET's reply: {second:?} granted \
                     while {first:?} holds it; the fake answered that SET with $-1 on the same \
                     connection ({} accepted)",
                    fake.accepted()
                )
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
        assert_bounded(&c, "after");
    });
}

#[test]
fn silent_server_is_a_timeout_after_the_node_timeout() {
    bounded(|| {
        let node_timeout = Duration::from_millis(100);
        let fake = FakeServer::start(Hostile::Silent.handler());
        let mut c = client(vec![fake.url()], node_timeout);
        let started = Instant::now();
        let result = c.try_lock("res");
        let elapsed = started.elapsed();
        assert_fault(result, &fake.node(), started, node_timeout + SLACK, |f| {
            *f == NodeFault::Timeout
        });
        assert!(elapsed >= node_timeout, "gave up after {elapsed:?}");
        assert_bounded(&c, "after the first timeout");
        // The node is not declared dead (the second attempt is queued on its connection too),
        // but it is not waited for (silent since the first), and the report says so.
        let started = Instant::now();
        let result = c.try_lock("res");
        assert_fault(result, &fake.node(), started, node_timeout + SLACK, |f| {
            *f == NodeFault::Silent
        });
        assert_bounded(&c, "after the second attempt");
        let sets = fake
            .seen()
            .iter()
            .filter(|e| matches!(e, Event::Command(_, cmd) if verb(cmd) == b"SET"))
            .count();
        assert!(sets >= 1, "the fake saw no SET");
    });
}

#[test]
fn server_closing_right_after_accept_is_closed_or_reset() {
    bounded(|| {
        let (_fake, c) = single_node_fails(Hostile::SlamShut, Duration::from_millis(100));
        assert_bounded(&c, "after");
    });
}

#[test]
fn endless_line_is_line_too_long_after_the_line_limit() {
    bounded(|| {
        let (fake, c) = single_node_fails(Hostile::EndlessLine, Duration::from_millis(200));
        // 16 KiB of line is two reads; 4 MiB would be 500.
        let reads = c.stats().io.reads;
        assert!(
            reads < 100,
            "{reads} reads: the client kept reading the line"
        );
        let outcome = fake.wait_for("the end of the line", |e| matches!(e, Event::Note(0, _)));
        assert_eq!(outcome, Event::Note(0, "cut off"));
        assert_bounded(&c, "after");
    });
}

/// Not one of the eight, but the only way to watch the input buffer *while* a frame grows: an
/// array of 4096 one-KiB strings (4 MiB, valid RESP, over the 1 MiB frame limit) streamed slowly,
/// sampled between short turns of the client's event loop.
#[test]
fn oversized_frame_streamed_slowly_is_cut_off_at_the_frame_limit() {
    bounded(|| {
        let fake = FakeServer::start(|p: &mut Peer| {
            if p.command().is_none() {
                return;
            }
            let element = [b"+".as_slice(), &[b'a'; 1000], b"\r\n"].concat();
            let chunk = element.repeat(32);
            let mut complete = p.send(b"*4096\r\n");
            for _ in 0..4096 / 32 {
                if !complete {
                    break;
                }
                complete = p.send(&chunk);
                thread::sleep(Duration::from_millis(3));
            }
            p.note(if complete { "all sent" } else { "cut off" });
            p.drain();
        });
        let node_timeout = Duration::from_millis(50);
        let mut c = client(vec![fake.url()], node_timeout);
        let started = Instant::now();
        let result = c.try_lock("res");
        assert_bounded(&c, "when the attempt ended");
        let fault = assert_fault(result, &fake.node(), started, node_timeout + SLACK, |f| {
            matches!(
                f,
                NodeFault::Timeout | NodeFault::Protocol(ParseError::FrameTooLarge)
            )
        });
        let mut outcome = None;
        let most = idle_sampling(&mut c, WAIT, || {
            outcome = outcome.take().or_else(|| {
                fake.seen()
                    .into_iter()
                    .find(|e| matches!(e, Event::Note(..)))
            });
            outcome.is_some()
        });
        assert_eq!(
            outcome,
            Some(Event::Note(0, "cut off")),
            "the client read the 4 MiB frame to the end (or the fake never finished)"
        );
        if fault == NodeFault::Timeout {
            // The attempt ended mid-frame, so part of it was seen buffered.
            assert!(most > 0, "no partial frame was ever buffered");
        }
        assert_bounded(&c, "after");
        eprintln!("largest undecoded input seen: {most} bytes");
    });
}

// ---------------------------------------------------------------------------
// Inside TLS: the same misbehaviours, in records
// ---------------------------------------------------------------------------

/// Each misbehaviour of a fake behind TLS gives the fault it gives on plain TCP (a door slammed
/// before the handshake ends is a TLS fault), within the same bounds; a reply trickled a byte
/// per record is reassembled.
#[cfg(feature = "tls")]
#[test]
fn every_hostile_behaviour_inside_tls_gives_the_same_typed_fault() {
    bounded(|| {
        let pki = redis_local::Pki::generate();
        for hostile in ALL {
            if matches!(hostile, Hostile::Trickle | Hostile::Extra) {
                continue;
            }
            eprintln!("--- {hostile:?} over TLS");
            let fake = FakeServer::start_tls(hostile.handler(), &pki);
            let (_fake, c) = fails_alone(fake, hostile, Duration::from_millis(300));
            assert_bounded(&c, "after");
        }
        let fake = FakeServer::start_tls(Hostile::Trickle.handler(), &pki);
        let mut c = client(vec![fake.url()], Duration::from_millis(500));
        let lock = c
            .try_lock("res")
            .expect("a trickled +OK inside TLS is still +OK");
        assert_eq!(c.unlock(lock).expect("a trickled :1"), 1);
        assert_eq!(c.stats().io.tls_handshakes, 1);
    });
}

/// A server that answers the ClientHello with bytes that are not TLS: a TLS fault naming the
/// node, at once, not a timeout.
#[cfg(feature = "tls")]
#[test]
fn a_server_answering_tls_with_garbage_is_a_tls_fault() {
    bounded(|| {
        let pki = redis_local::Pki::generate();
        let fake = FakeServer::start(|p: &mut Peer| {
            // Then waits for the client to close, so that the bytes are not lost to a reset.
            if p.send(b"-ERR this is not TLS\r\n") {
                while p.fill() {}
            }
        });
        let url = format!(
            "rediss://127.0.0.1:{}?tls_ca={}",
            fake.port(),
            pki.ca().display()
        );
        let mut c = client(vec![url], Duration::from_millis(300));
        let started = Instant::now();
        let result = c.try_lock("res");
        assert_fault(
            result,
            &fake.node(),
            started,
            Duration::from_millis(300),
            |f| matches!(f, NodeFault::Tls(_)),
        );
    });
}

// ---------------------------------------------------------------------------
// N = 3: the fake between two real servers
// ---------------------------------------------------------------------------

/// With two healthy nodes of three, every hostile third one is outvoted: the lock is granted
/// fast, released on both real nodes, and the hostile node's buffers stay bounded.
#[test]
fn two_real_nodes_carry_the_quorum_past_each_hostile_third() {
    bounded(|| {
        let servers = redis_local::Cluster::start(2);
        let urls = servers.urls();
        let node_timeout = Duration::from_millis(100);
        for hostile in ALL {
            let fake = FakeServer::start(hostile.handler());
            let mut c = client(
                vec![urls[0].clone(), fake.url(), urls[1].clone()],
                node_timeout,
            );
            let resource = format!("res-{hostile:?}");
            for cycle in 0..2 {
                let what = format!("{hostile:?}, cycle {cycle}");
                let started = Instant::now();
                let lock = c
                    .try_lock(&resource)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    started.elapsed() < node_timeout + SLACK,
                    "{what}: took {:?}",
                    started.elapsed()
                );
                assert!(lock.is_valid(), "{what}");
                assert_bounded(&c, &what);
                let token = String::from_utf8(lock.token().as_bytes().to_vec()).unwrap();
                for s in servers.iter() {
                    assert_eq!(s.get(&resource).as_deref(), Some(token.as_str()), "{what}");
                }
                let started = Instant::now();
                let released = c.unlock(lock).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    started.elapsed() < node_timeout + SLACK,
                    "{what}: unlock took {:?}",
                    started.elapsed()
                );
                // Only the trickling fake may also say it released (`:1`), if in time.
                let most = if hostile == Hostile::Trickle { 3 } else { 2 };
                assert!(
                    (2..=most).contains(&released),
                    "{what}: released on {released}"
                );
                for s in servers.iter() {
                    assert_eq!(s.get(&resource), None, "{what}");
                }
                assert_bounded(&c, &what);
            }
            // The client connected to the fake (its accept loop may lag the fast cycles).
            fake.wait_for(&format!("{hostile:?}: the fake was never used"), |e| {
                matches!(e, Event::Accepted(_))
            });
            drop(c);
            drop(fake);
        }
    });
}

// ---------------------------------------------------------------------------
// Surplus replies, unknown restart state, a connection closed under an extend
// ---------------------------------------------------------------------------

/// Answers every packet with fifty `+OK` and fifty `:1`, whatever it was.
fn yes_flood(p: &mut Peer) {
    let mut reply = b"+OK\r\n".repeat(50);
    reply.extend_from_slice(&b":1\r\n".repeat(50));
    while p.skip_input() {
        if !p.send(&reply) {
            return;
        }
    }
}

#[test]
fn a_server_answering_every_packet_with_yeses_never_grants_a_lock() {
    bounded(|| {
        let servers = redis_local::Cluster::start(2);
        // The resource is free on node 0 and held by someone else on node 1: only the fake's
        // "yes" could make a quorum of two.
        servers[1].set("res", "someone-else");
        // Past the 1 s window below, so that with quarantine on node 0's yes counts too.
        for s in servers.iter() {
            s.wait_uptime(3);
        }
        let urls = servers.urls();
        let fake = FakeServer::start(yes_flood);
        for quarantine in [None, Some(Duration::from_secs(1))] {
            let mut c = Builder::new(vec![urls[0].clone(), fake.url(), urls[1].clone()])
                .ttl(Duration::from_secs(1))
                .quarantine(quarantine)
                .node_timeout(Duration::from_millis(100))
                .connect_timeout(Duration::from_millis(500))
                .build_client()
                .unwrap();
            for attempt in 0..5 {
                match c.try_lock("res") {
                    Ok(lock) => panic!(
                        "granted by a node that answers everything with yes (quarantine \
                         {quarantine:?}, attempt {attempt}): {lock:?}"
                    ),
                    Err(Error::Held(report) | Error::NoQuorum(report)) => {
                        let fake_fault = report
                            .failed()
                            .find(|(a, _)| a.to_string() == fake.node())
                            .map(|(_, f)| f.root().clone());
                        assert!(
                            matches!(fake_fault, Some(NodeFault::Unexpected(_))),
                            "the fake must fail as a protocol breaker: {report}"
                        );
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
                assert_bounded(&c, "after the flood");
            }
            // A lost attempt's release is sent in the turn that decides it but not waited for:
            // wait for its replies before looking (the check raced it once in CI).
            assert!(
                redlock_mux::testing::settle_releases(
                    &mut c,
                    Instant::now() + Duration::from_secs(5)
                ),
                "the lost attempts' releases were never answered"
            );
            assert_eq!(
                servers[0].get("res"),
                None,
                "our key was released (releases unconfirmed: {:?}, pending per node: {:?})",
                redlock_mux::testing::unconfirmed(&c),
                redlock_mux::testing::pending(&c)
            );
        }
    });
}

/// A server that speaks the protocol but whose `INFO server` has no `run_id` or uptime; it
/// closes each connection after answering a `SET`, so every attempt reconnects.
fn no_run_id(p: &mut Peer) {
    while let Some(cmd) = p.command() {
        let reply: &[u8] = match verb(&cmd) {
            b"INFO" => b"$29\r\n# Server\r\nredis_version:7.0.0\r\n",
            b"SET" => {
                p.send(b"+OK\r\n");
                return;
            }
            _ if is_script(&cmd) => b":1\r\n",
            _ => b"-ERR unknown command\r\n",
        };
        if !p.send(reply) {
            return;
        }
    }
}

#[test]
fn a_node_whose_restart_state_is_unknown_waits_a_window_counted_across_reconnects() {
    bounded(|| {
        let fake = FakeServer::start(no_run_id);
        let window = Duration::from_secs(1);
        let mut c = Builder::new([fake.url()])
            // No INFO memory asked, as before the eviction check: the fake answers none.
            .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
            .ttl(window)
            .node_timeout(Duration::from_millis(100))
            .build_client()
            .unwrap();
        let first_seen = Instant::now();
        let mut attempts = 0;
        let granted = loop {
            attempts += 1;
            match c.try_lock("res") {
                Ok(lock) => break lock,
                Err(Error::NoQuorum(report)) => {
                    let quarantined = report
                        .failed()
                        .any(|(_, f)| matches!(f.root(), NodeFault::Quarantined(_)));
                    // Between attempts the fake closed the connection; an attempt may meet
                    // that close, every other one must meet the quarantine.
                    let closed = report
                        .failed()
                        .any(|(_, f)| matches!(f.root(), NodeFault::Closed | NodeFault::Io(_)));
                    assert!(quarantined || closed, "{report}");
                }
                Err(other) => panic!("unexpected {other:?}"),
            }
            c.idle_until(Instant::now() + Duration::from_millis(50));
        };
        assert!(
            first_seen.elapsed() >= window,
            "a node with an unknown restart state counted after {:?} ({attempts} attempts)",
            first_seen.elapsed()
        );
        assert!(
            fake.accepted() >= 3,
            "the window must hold across reconnects: {} connections",
            fake.accepted()
        );
        drop(granted);
    });
}

/// A server up for an hour (its first connection's `INFO server` says so) whose clock then
/// stepped back: every later connection says `uptime_in_seconds:-3`, with the same `run_id`. It
/// closes each connection after answering the release of the lock it granted on it, as a
/// server closing idle connections would between two locks. A release of a token it never
/// granted there (a lost attempt's cleanup, sent first on a fresh connection) is answered 0 and
/// the connection kept: closed after every script, each fresh connection closed under the
/// attempt queued behind that cleanup, whose own cleanup then led the next connection — a loop
/// of closes no server makes (the test failed so, 1 run in 6).
fn clock_stepped_back(p: &mut Peer) {
    let uptime = if p.id == 0 { "3600" } else { "-3" };
    let info = format!(
        "# Server\r\nrun_id:{}\r\nuptime_in_seconds:{uptime}\r\n",
        "7".repeat(40)
    );
    let mut granted: Option<Vec<u8>> = None;
    while let Some(cmd) = p.command() {
        let reply = match verb(&cmd) {
            b"INFO" => format!("${}\r\n{info}\r\n", info.len()).into_bytes(),
            b"SET" => {
                granted = cmd.get(2).cloned();
                b"+OK\r\n".to_vec()
            }
            // EVAL(SHA) body, numkeys, key, token: the release of the lock granted here.
            _ if is_script(&cmd) && cmd.get(4) == granted.as_ref() => {
                p.send(b":1\r\n");
                return;
            }
            _ if is_script(&cmd) => b":0\r\n".to_vec(),
            _ => b"-ERR unknown command\r\n".to_vec(),
        };
        if !p.send(&reply) {
            return;
        }
    }
}

/// A process the client knows (same `run_id`, no other met in between) whose uptime is not a
/// number any more (negative: its clock stepped back) was quarantined for a whole window again
/// at each reconnect: the bad uptime counted as 0, "just started". It is no
/// news: the process counts on every connection.
#[test]
fn a_known_process_whose_uptime_turns_negative_is_not_quarantined_at_each_reconnect() {
    bounded(|| {
        let fake = FakeServer::start(clock_stepped_back);
        // The quarantine on (its window the TTL, 10 s): far longer than this test takes.
        let mut c = Builder::new([fake.url()])
            // No INFO memory asked, as before the eviction check: the fake answers none.
            .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
            .ttl(Duration::from_secs(10))
            .node_timeout(Duration::from_millis(500))
            .retry_count(0)
            .build_client()
            .unwrap();
        for round in 0..3 {
            // Each release closes its connection: the next acquire reconnects. An attempt may
            // meet that close; none may meet the quarantine.
            let mut closes = 0;
            let lock = loop {
                match c.try_lock("res") {
                    Ok(lock) => break lock,
                    Err(Error::NoQuorum(report)) => {
                        let closed = report
                            .failed()
                            .all(|(_, f)| matches!(f.root(), NodeFault::Closed | NodeFault::Io(_)));
                        assert!(closed && closes < 3, "round {round}: {report}");
                        closes += 1;
                    }
                    Err(other) => panic!("round {round}: {other:?}"),
                }
            };
            assert_eq!(c.unlock(lock).unwrap(), 1, "round {round}");
        }
        assert_eq!(fake.accepted(), 3, "a connection per lock");
    });
}

#[test]
fn an_extend_whose_connection_closes_in_flight_is_sent_again_on_a_fresh_one() {
    bounded(|| {
        // The first script on the first connection is read and the connection closed without an
        // answer, as a server closing an idle connection at that moment would; the fresh
        // connection answers.
        let fake = FakeServer::start(|p: &mut Peer| {
            while let Some(cmd) = p.command() {
                if is_script(&cmd) && p.id == 0 {
                    p.note("closed under a script");
                    return;
                }
                let reply: &[u8] = if is_script(&cmd) {
                    b":1\r\n"
                } else {
                    b"+OK\r\n"
                };
                if !p.send(reply) {
                    return;
                }
            }
        });
        let mut c = Builder::new([fake.url()])
            .ttl(Duration::from_secs(2))
            // No INFO memory asked, as before the eviction check: the fake answers none.
            .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
            .quarantine(None)
            .node_timeout(Duration::from_millis(200))
            .build_client()
            .unwrap();
        let mut lock = c.try_lock("res").unwrap();
        c.extend(&mut lock, Duration::from_secs(2))
            .expect("the extend is sent again on a fresh connection");
        fake.wait_for("the close", |e| {
            matches!(e, Event::Note(0, "closed under a script"))
        });
        assert_eq!(fake.accepted(), 2);
        assert_eq!(c.unlock(lock).unwrap(), 1);
    });
}

/// A node that never stops sending (release notices for a name nobody waits for, as any client
/// allowed to `PUBLISH` could make a server send) and never answers the SET: the SET times out
/// on time and the buffers stay bounded. (The read loop returns at a short read; a sender that
/// kept every read full — faster than the parser, which loopback here is not — could hold one
/// turn longer: docs/design.md, "Limits of the design".)
#[test]
fn a_node_that_never_stops_sending_stalls_nothing() {
    bounded(|| {
        let fake = FakeServer::start(|p: &mut Peer| {
            // HELLO 3 (RESP3: pushes come out of band), then the SET, never answered.
            if p.command().is_none() || !p.send(b"%1\r\n+proto\r\n:3\r\n") || p.command().is_none()
            {
                return;
            }
            let unit = b">3\r\n$7\r\nmessage\r\n$18\r\nredlock:released:x\r\n$1\r\n1\r\n";
            let chunk = unit.repeat((64 << 10) / unit.len());
            let give_up = Instant::now() + 2 * WATCHDOG;
            while Instant::now() < give_up && p.send(&chunk) {}
        });
        let mut c = client(
            vec![format!("{}?protocol=3", fake.url())],
            Duration::from_millis(300),
        );
        let fault = match c.try_lock("res") {
            Err(Error::NoQuorum(report)) => report.failed().next().map(|(_, f)| f.clone()),
            other => panic!("{other:?}"),
        };
        assert_eq!(fault, Some(NodeFault::Timeout));
        assert_bounded(&c, "flooded");
    });
}

/// A server that answers the last request and closes at once: the answer and the close come
/// in one readable edge. The close was missed (a short read was taken to mean the socket was
/// drained), the connection stayed "ready" on a dead socket, and the next acquire failed on it.
/// Now the reads go on to the end when the event says the peer closed.
#[test]
fn a_close_right_behind_the_last_answer_is_noticed() {
    let fake = FakeServer::start(|p: &mut Peer| {
        while let Some(cmd) = p.command() {
            let script = is_script(&cmd);
            if !p.send(if script { b":1\r\n" } else { b"+OK\r\n" }) {
                return;
            }
            if script && p.id == 0 {
                // The first connection ends right behind its first release's answer.
                p.note("closing");
                return;
            }
        }
    });
    let redlock = Builder::new([fake.url()])
        // No INFO memory asked, as before the eviction check: the fake answers none.
        .evicting_servers(redlock_mux::EvictingServers::CountUnsafely)
        .quarantine(None)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("a handle");
    let lock = redlock.try_lock("a").expect("the fake grants it");
    redlock.unlock_nowait(lock);
    fake.wait_for("closing", |e| matches!(e, Event::Note(_, "closing")));
    // The answer and the close reach this side's socket; nothing reads them yet.
    std::thread::sleep(Duration::from_millis(100));
    let again = redlock.try_lock("b");
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(
        fake.accepted(),
        2,
        "a second connection for the second acquire"
    );
}
