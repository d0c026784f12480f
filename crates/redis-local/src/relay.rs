//! A TCP relay that delays every byte by a fixed one-way delay, in both directions.
//!
//! `tc netem` is not available on every kernel, so a benchmark puts one of these in front of a
//! server to emulate a network with a given round-trip time. Per accepted connection
//! it opens one upstream connection and runs, per direction, a reader thread (which timestamps
//! each chunk as it is read) and a writer thread (which sleeps until the chunk is due and writes
//! it). Bytes are therefore delayed by the one-way delay measured from the moment they are read,
//! whatever else is in flight: pipelined requests are not held back behind earlier ones.
//!
//! Writer threads set their timer slack to 1 ns so that a 250 µs delay is not rounded up by the
//! kernel's default 50 µs slack. The relay adds no delay to the TCP handshake itself (only bytes
//! are delayed), which favours clients that connect per operation.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A listening relay in front of one upstream server; stops accepting when dropped (open
/// connections end when either side closes).
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl Relay {
    /// Listens on a fresh loopback port and forwards to `upstream`, delaying each direction by
    /// `one_way`.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("relay: bind");
        let addr = listener.local_addr().expect("relay: local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let acceptor = thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    pipe(&client, &server, one_way);
                    pipe(&server, &client, one_way);
                }
            })
            .expect("relay: spawn acceptor");
        Relay {
            addr,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// `redis://127.0.0.1:PORT` of the relay.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The relay's own address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor up so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

/// Buffer of each reader thread: a read takes whatever arrived, up to this.
const READ_CHUNK: usize = 64 << 10;

/// Forwards `from` → `to` with the delay: a reader thread and a writer thread.
fn pipe(from: &TcpStream, to: &TcpStream, delay: Duration) {
    let (mut from, mut to) = (
        from.try_clone().expect("relay: clone"),
        to.try_clone().expect("relay: clone"),
    );
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::Builder::new()
        .name("relay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let due = Instant::now() + delay;
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                }
            }
            // Dropping `tx` tells the writer to close its side.
        })
        .expect("relay: spawn reader");
    thread::Builder::new()
        .name("relay-write".into())
        .spawn(move || {
            precise_timers();
            while let Ok((due, chunk)) = rx.recv() {
                loop {
                    let now = Instant::now();
                    if now >= due {
                        break;
                    }
                    thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })
        .expect("relay: spawn writer");
}

/// Timer slack of 1 ns for the calling thread (default 50 µs).
fn precise_timers() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes a property of the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}
