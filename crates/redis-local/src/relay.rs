//! A TCP relay in front of one server: it delays every byte by a fixed one-way delay, in both
//! directions, and injects the faults of a real network on demand.
//!
//! `tc netem` is not available on every kernel, and loopback never loses a packet, so a test or
//! a benchmark puts one of these in front of a server. Per accepted connection it opens one
//! upstream connection and runs, per direction, a reader thread (which timestamps each chunk as
//! it is read) and a writer thread (which sleeps until the chunk is due and writes it). Bytes are
//! therefore delayed by the one-way delay measured from the moment they are read, whatever else
//! is in flight: pipelined requests are not held back behind earlier ones.
//!
//! Writer threads set their timer slack to 1 ns so that a 250 µs delay is not rounded up by the
//! kernel's default 50 µs slack. The relay adds no delay to the TCP handshake itself (only bytes
//! are delayed), which favours clients that connect per operation.
//!
//! # Faults
//!
//! Switched on and off at run time, for every connection through the relay (each direction has
//! its [`Flow`]), and [`Relay::heal`] ends them all:
//!
//! | fault | switched by | what the client sees |
//! |---|---|---|
//! | a black hole | [`Relay::black_hole`]: both directions [`Flow::Drop`], connects [`Connects::Hang`] | no byte, FIN or RST ever again on its open connections; new connects never complete |
//! | a partition that heals | [`Relay::partition`]: both directions [`Flow::Hold`], connects hang | nothing until the heal; then every byte sent meanwhile, in order, as TCP's retransmissions deliver it |
//! | a one-way partition | [`Relay::set_flow`]: one direction [`Flow::Drop`] or [`Flow::Hold`] | requests lost while replies pass; or requests run and their replies lost |
//! | a half-open connection | [`Relay::sever`] | the server's side of every open connection closed (the server ran what it got, no more); the client's side left open, and silent until the client closes it |
//! | a slow drip | [`Flow::Drip`] | one byte per interval |
//! | a connect that never completes | [`Relay::set_connects`] with [`Connects::Hang`] | `connect` stays in progress: the SYNs are dropped |
//!
//! A direction that dropped a byte of a connection never forwards anything of it again, not even
//! its FIN, whatever its flow later: TCP never resumes a stream past a hole, and a relay that did
//! would hand the server the next request in place of the lost one (and the client a reply to
//! another request), a fault no network makes. A partition during which nothing was sent leaves
//! the connections whole.
//!
//! Connects hang as on a host whose SYNs are lost: Linux drops a SYN that arrives at a listening
//! socket whose accept queue is full (`tcp_conn_request`, counted as `ListenOverflows`), so the
//! relay stops accepting, sets its backlog to 0 with a second `listen` (a queue of one) and fills
//! the queue with a connection of its own. The client's `connect` stays in progress, its kernel
//! sending the SYN again after 1 s, 3 s, 7 s, …; once the backlog is restored and the queue
//! accepted, the next SYN completes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// Which way bytes go through a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server: requests.
    ToServer,
    /// From the server to the client: replies.
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ToServer => 0,
            Direction::ToClient => 1,
        }
    }
}

/// What one direction of a relay does with the bytes it reads, on every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Forwarded after the relay's one-way delay.
    Pass,
    /// Kept in the relay, in order, and forwarded once the direction passes again (the end of
    /// the stream too): a partition that TCP's retransmissions outlive, which deliver everything
    /// late.
    Hold,
    /// Thrown away: lost. The connection's direction never forwards again (see the module docs).
    Drop,
    /// Forwarded one byte at a time, this far apart.
    Drip(Duration),
}

/// Whether new connections to a relay complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connects {
    /// Accepted, each with its own upstream connection.
    Complete,
    /// Never completed: the SYNs are dropped (see the module docs).
    Hang,
}

/// Bytes that went one way through a relay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Read from the sending side.
    pub read: u64,
    /// Written to the receiving side.
    pub forwarded: u64,
    /// Thrown away ([`Flow::Drop`], a severed connection).
    pub dropped: u64,
}

/// What a relay has done since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Connections accepted (and connected upstream).
    pub accepted: u64,
    /// Connections [`Relay::sever`] left half open.
    pub severed: u64,
    /// Client to server.
    pub to_server: FlowStats,
    /// Server to client.
    pub to_client: FlowStats,
}

/// A listening relay in front of one upstream server. Dropping it stops accepting and closes
/// every connection through it (both sides).
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    listener: Arc<TcpListener>,
    /// Wakes the acceptor from its `poll`: a fault changed, or the relay is dropped.
    wake: UnixStream,
    acceptor: Option<thread::JoinHandle<()>>,
}

/// The faults in force, under [`Shared::faults`].
struct Faults {
    flows: [Flow; 2],
    connects: Connects,
    /// The relay's own connection filling the accept queue while connects hang: the client end,
    /// kept until the heal, and its address, by which the acceptor knows it then.
    filler: Option<(TcpStream, SocketAddr)>,
    /// Set when the relay is dropped: every thread ends.
    stop: bool,
}

/// Byte counters of one direction.
#[derive(Default)]
struct Counters {
    read: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
}

/// What the relay's threads share.
struct Shared {
    faults: Mutex<Faults>,
    /// Notified at every change of the faults: writers holding bytes or dripping wait on it.
    changed: Condvar,
    /// Per direction, whether its flow is [`Flow::Pass`]: read by the writers for every chunk
    /// without taking the lock, so that a relay without faults costs a benchmark one atomic load
    /// per chunk.
    passing: [AtomicBool; 2],
    conns: Mutex<Vec<Weak<Conn>>>,
    accepted: AtomicU64,
    severed: AtomicU64,
    counters: [Counters; 2],
}

/// One connection through the relay: the client's socket and the server's. Closed when the
/// last of its four threads ends.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    /// [`Relay::sever`]: the server's side is closed, the client's is left silent.
    severed: AtomicBool,
}

/// Locks `m`; a thread that panicked holding it left nothing half done that matters here.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The listen backlog restored when connects complete again: the one `TcpListener::bind` gives
/// on Linux (128), far above the handful of connections a relay takes at a time.
const BACKLOG: libc::c_int = 128;
/// How long the relay waits for its own connection to fill the accept queue when connects are
/// made to hang. On loopback it completes at once; it times out only when a client's connection
/// reached the queue first, and then the queue is full already.
const FILL_WAIT: Duration = Duration::from_millis(200);

impl Relay {
    /// Listens on a fresh loopback port and forwards to `upstream`, delaying each direction by
    /// `one_way`; no fault.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("relay: bind");
        let addr = listener.local_addr().expect("relay: local addr");
        // Accepted only under the faults' lock (see `accept_all`): never blocked in `accept`
        // while connects are switched to hang.
        listener.set_nonblocking(true).expect("relay: nonblocking");
        let listener = Arc::new(listener);
        let shared = Arc::new(Shared {
            faults: Mutex::new(Faults {
                flows: [Flow::Pass; 2],
                connects: Connects::Complete,
                filler: None,
                stop: false,
            }),
            changed: Condvar::new(),
            passing: [AtomicBool::new(true), AtomicBool::new(true)],
            conns: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            severed: AtomicU64::new(0),
            counters: Default::default(),
        });
        let (wake, woken) = UnixStream::pair().expect("relay: wake pair");
        woken.set_nonblocking(true).expect("relay: nonblocking");
        let acceptor = {
            let (shared, listener) = (shared.clone(), listener.clone());
            thread::Builder::new()
                .name("relay-accept".into())
                .spawn(move || accept_loop(&shared, &listener, &woken, upstream, one_way))
                .expect("relay: spawn acceptor")
        };
        Relay {
            addr,
            shared,
            listener,
            wake,
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

    /// Sets what `direction` does with the bytes it reads from now on, on every connection
    /// (bytes read earlier and not yet written included).
    pub fn set_flow(&self, direction: Direction, flow: Flow) {
        let mut faults = lock(&self.shared.faults);
        faults.flows[direction.index()] = flow;
        self.shared.passing[direction.index()].store(flow == Flow::Pass, Ordering::SeqCst);
        drop(faults);
        self.shared.changed.notify_all();
    }

    /// The flow of `direction`.
    pub fn flow(&self, direction: Direction) -> Flow {
        lock(&self.shared.faults).flows[direction.index()]
    }

    /// Whether new connections complete. When this returns [`Connects::Hang`] is in force: a
    /// connect made after it never completes, until [`Connects::Complete`] (a connect made just
    /// before may complete and wait, unserved, until then).
    pub fn set_connects(&self, connects: Connects) {
        let mut faults = lock(&self.shared.faults);
        if faults.connects == connects || faults.stop {
            return;
        }
        faults.connects = connects;
        let fd = self.listener.as_raw_fd();
        match connects {
            Connects::Hang => {
                // The acceptor accepts only under this lock and only while connects complete:
                // from here on the queue fills and stays full.
                listen(fd, 0);
                if let Ok(filler) = TcpStream::connect_timeout(&self.addr, FILL_WAIT) {
                    let at = filler.local_addr().expect("relay: filler addr");
                    faults.filler = Some((filler, at));
                }
            }
            Connects::Complete => listen(fd, BACKLOG),
        }
        drop(faults);
        self.wake_acceptor();
    }

    /// A black hole: every byte either way is lost, on the open connections (which the relay
    /// never closes) and on new ones, whose connects never complete. [`Relay::heal`] lets new
    /// connections through; a connection that lost bytes stays dead.
    pub fn black_hole(&self) {
        self.set_connects(Connects::Hang);
        self.set_flow(Direction::ToServer, Flow::Drop);
        self.set_flow(Direction::ToClient, Flow::Drop);
    }

    /// A partition that heals: nothing passes and new connects never complete, and at
    /// [`Relay::heal`] every byte sent meanwhile is delivered, in order, as TCP's retransmissions
    /// would after a partition shorter than their timeout (minutes).
    pub fn partition(&self) {
        self.set_connects(Connects::Hang);
        self.set_flow(Direction::ToServer, Flow::Hold);
        self.set_flow(Direction::ToClient, Flow::Hold);
    }

    /// Every fault off: both directions pass, connects complete. Held bytes go out; connections
    /// that lost bytes or were severed stay dead.
    pub fn heal(&self) {
        self.set_flow(Direction::ToServer, Flow::Pass);
        self.set_flow(Direction::ToClient, Flow::Pass);
        self.set_connects(Connects::Complete);
    }

    /// Half-opens every connection open now, as a server host that vanished or a middlebox
    /// that forgot the connection does: the server's side is closed (the server sees the client
    /// go, having run whatever reached it), the client's side gets nothing more, no FIN and no
    /// RST, and stays open until the client closes it. New connections are not affected. Returns
    /// how many connections it severed.
    pub fn sever(&self) -> usize {
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut n = 0;
        for conn in conns {
            if !conn.severed.swap(true, Ordering::SeqCst) {
                let _ = conn.server.shutdown(Shutdown::Both);
                n += 1;
            }
        }
        self.shared.severed.fetch_add(n as u64, Ordering::SeqCst);
        // Writers holding bytes for a severed connection drop them.
        self.shared.changed.notify_all();
        n
    }

    /// Connections through the relay that are still open on the client's side or the server's.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.conns)
            .iter()
            .filter(|c| c.strong_count() > 0)
            .count()
    }

    /// What the relay has done so far.
    pub fn stats(&self) -> RelayStats {
        let s = &self.shared;
        let flow = |c: &Counters| FlowStats {
            read: c.read.load(Ordering::SeqCst),
            forwarded: c.forwarded.load(Ordering::SeqCst),
            dropped: c.dropped.load(Ordering::SeqCst),
        };
        RelayStats {
            accepted: s.accepted.load(Ordering::SeqCst),
            severed: s.severed.load(Ordering::SeqCst),
            to_server: flow(&s.counters[0]),
            to_client: flow(&s.counters[1]),
        }
    }

    fn wake_acceptor(&self) {
        let _ = (&self.wake).write(&[1]);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        lock(&self.shared.faults).stop = true;
        self.shared.changed.notify_all();
        self.wake_acceptor();
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        // Readers see the end of their streams, writers the stop: every thread ends, and the
        // sockets close with the last of them.
        for conn in lock(&self.shared.conns).iter().filter_map(Weak::upgrade) {
            let _ = conn.client.shutdown(Shutdown::Both);
            let _ = conn.server.shutdown(Shutdown::Both);
        }
    }
}

/// `listen(fd, backlog)` on a socket already listening: Linux keeps its queue and sets the
/// backlog.
fn listen(fd: std::os::fd::RawFd, backlog: libc::c_int) {
    // SAFETY: `fd` is the relay's listening socket, open for the relay's whole life; `listen`
    // only changes its backlog.
    let rc = unsafe { libc::listen(fd, backlog) };
    assert_eq!(rc, 0, "relay: listen: {}", std::io::Error::last_os_error());
}

/// The acceptor: waits for connections (only while they complete) or a wake-up, and starts
/// each accepted connection's threads.
fn accept_loop(
    shared: &Arc<Shared>,
    listener: &TcpListener,
    woken: &UnixStream,
    upstream: SocketAddr,
    one_way: Duration,
) {
    loop {
        let accepting = {
            let faults = lock(&shared.faults);
            if faults.stop {
                return;
            }
            faults.connects == Connects::Complete
        };
        let mut fds = [
            libc::pollfd {
                fd: woken.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Without the listener while connects hang: its full queue would wake us at once.
        let count: libc::nfds_t = if accepting { 2 } else { 1 };
        // SAFETY: `fds` is an array of `count` valid pollfd entries for the call's duration.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, -1) };
        if rc < 0 {
            continue; // EINTR
        }
        let mut sink = [0u8; 64];
        while matches!((&*woken).read(&mut sink), Ok(n) if n > 0) {}
        for client in accept_all(shared, listener) {
            let Ok(server) = TcpStream::connect(upstream) else {
                continue; // the server is down: the client's connection closes
            };
            start_conn(shared, client, server, one_way);
        }
    }
}

/// Every connection waiting in the queue, accepted under the faults' lock and only while
/// connects complete; the relay's own filler connection is closed, not served.
fn accept_all(shared: &Shared, listener: &TcpListener) -> Vec<TcpStream> {
    let mut faults = lock(&shared.faults);
    let mut accepted = Vec::new();
    if faults.connects != Connects::Complete || faults.stop {
        return accepted;
    }
    let filler = faults.filler.take().map(|(_, at)| at);
    while let Ok((client, peer)) = listener.accept() {
        if Some(peer) == filler {
            continue;
        }
        let _ = client.set_nonblocking(false);
        accepted.push(client);
    }
    accepted
}

/// Registers a connection and starts its four threads.
fn start_conn(shared: &Arc<Shared>, client: TcpStream, server: TcpStream, one_way: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let conn = Arc::new(Conn {
        client,
        server,
        severed: AtomicBool::new(false),
    });
    {
        let mut conns = lock(&shared.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(&conn));
    }
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    pipe(shared, &conn, Direction::ToServer, one_way);
    pipe(shared, &conn, Direction::ToClient, one_way);
}

/// Buffer of each reader thread: a read takes whatever arrived, up to this.
const READ_CHUNK: usize = 64 << 10;

/// Forwards one direction of `conn` with the delay and the faults: a reader thread and a writer
/// thread.
fn pipe(shared: &Arc<Shared>, conn: &Arc<Conn>, direction: Direction, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let (shared_r, conn_r) = (shared.clone(), conn.clone());
    thread::Builder::new()
        .name("relay-read".into())
        .spawn(move || {
            let from = match direction {
                Direction::ToServer => &conn_r.client,
                Direction::ToClient => &conn_r.server,
            };
            let counters = &shared_r.counters[direction.index()];
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                match (&*from).read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        counters.read.fetch_add(n as u64, Ordering::SeqCst);
                        let due = Instant::now() + delay;
                        // A writer that ended (its side failed, or the bytes are lost for good)
                        // takes nothing more; the reader goes on reading until its side closes,
                        // so that the relay never closes a socket its peer still holds open.
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            counters.dropped.fetch_add(n as u64, Ordering::SeqCst);
                        }
                    }
                }
            }
            // Dropping `tx` tells the writer that the stream ended.
        })
        .expect("relay: spawn reader");
    let (shared, conn) = (shared.clone(), conn.clone());
    thread::Builder::new()
        .name("relay-write".into())
        .spawn(move || {
            precise_timers();
            Writer {
                shared: &shared,
                conn: &conn,
                direction,
                lost: false,
                next_byte: None,
            }
            .run(&rx);
        })
        .expect("relay: spawn writer");
}

/// What a writer does next under the faults in force.
enum Step {
    /// Write what is left.
    All,
    /// Write one byte now (a drip), the next one this much later.
    Byte(Duration),
    /// Lose what is left, and everything after it.
    Lose,
    /// The relay is dropped.
    Stop,
}

/// The writing half of one direction of a connection.
struct Writer<'a> {
    shared: &'a Shared,
    conn: &'a Conn,
    direction: Direction,
    /// The direction lost bytes: it forwards nothing more, not even the end of the stream.
    lost: bool,
    /// When a drip may write its next byte.
    next_byte: Option<Instant>,
}

impl Writer<'_> {
    fn to(&self) -> &TcpStream {
        match self.direction {
            Direction::ToServer => &self.conn.server,
            Direction::ToClient => &self.conn.client,
        }
    }

    fn counters(&self) -> &Counters {
        &self.shared.counters[self.direction.index()]
    }

    fn run(&mut self, rx: &mpsc::Receiver<(Instant, Vec<u8>)>) {
        while let Ok((due, chunk)) = rx.recv() {
            loop {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                thread::sleep(due - now);
            }
            if self.forward(&chunk).is_err() {
                return;
            }
        }
        // The end of the stream goes the way its bytes went: held until the direction passes,
        // lost with them.
        if !self.lost && !matches!(self.next_step(), Step::Lose | Step::Stop) {
            let _ = self.to().shutdown(Shutdown::Write);
        }
    }

    /// Writes `chunk` as the faults say; an error ends the writer (its side failed, or the
    /// relay is dropped).
    fn forward(&mut self, chunk: &[u8]) -> Result<(), ()> {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.lost {
                self.counters()
                    .dropped
                    .fetch_add(rest.len() as u64, Ordering::SeqCst);
                return Ok(());
            }
            match self.next_step() {
                Step::All => {
                    self.to().write_all(rest).map_err(drop)?;
                    self.counters()
                        .forwarded
                        .fetch_add(rest.len() as u64, Ordering::SeqCst);
                    rest = &[];
                }
                Step::Byte(every) => {
                    self.to().write_all(&rest[..1]).map_err(drop)?;
                    self.counters().forwarded.fetch_add(1, Ordering::SeqCst);
                    rest = &rest[1..];
                    self.next_byte = Some(Instant::now() + every);
                }
                Step::Lose => self.lost = true,
                Step::Stop => return Err(()),
            }
        }
        Ok(())
    }

    /// Waits while the direction holds its bytes, or until a drip's next byte is due, and says
    /// what to do with the next byte.
    fn next_step(&self) -> Step {
        let d = self.direction.index();
        // A severed connection's client gets nothing more.
        let severed =
            || self.direction == Direction::ToClient && self.conn.severed.load(Ordering::SeqCst);
        if self.shared.passing[d].load(Ordering::SeqCst) && !severed() {
            return Step::All;
        }
        let mut faults = lock(&self.shared.faults);
        loop {
            if faults.stop {
                return Step::Stop;
            }
            if severed() {
                return Step::Lose;
            }
            match faults.flows[d] {
                Flow::Pass => return Step::All,
                Flow::Drop => return Step::Lose,
                Flow::Hold => {
                    faults = self
                        .shared
                        .changed
                        .wait(faults)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Flow::Drip(every) => {
                    let now = Instant::now();
                    match self.next_byte {
                        Some(at) if at > now => {
                            // Woken early by a change of the faults, or by the time.
                            faults = self
                                .shared
                                .changed
                                .wait_timeout(faults, at - now)
                                .unwrap_or_else(PoisonError::into_inner)
                                .0;
                        }
                        _ => return Step::Byte(every),
                    }
                }
            }
        }
    }
}

/// Timer slack of 1 ns for the calling thread (default 50 µs).
fn precise_timers() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes a property of the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}
