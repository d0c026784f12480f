//! One connection to one node, the I/O half: the socket (TCP or Unix), non-blocking connect,
//! reads and writes with as few syscalls as possible. Everything the protocol decides — what to
//! write, what a reply means, when to give up, when to reconnect — is the [`Session`]'s
//! (`proto/session/`, no I/O); this file only moves bytes and socket events between the socket and
//! it.
//!
//! Nothing here blocks: connects are non-blocking, and every method returns at once. The driver
//! (`driver.rs`) calls [`Conn::on_ready`] when `mio` reports readiness and [`Conn::on_timer`] when
//! a deadline may have passed.

use std::io::{self, Read, Write};

use std::sync::Arc;
use std::time::Instant;

use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};

use crate::model::addr::{Endpoint, NodeAddr};
use crate::model::config::ConnConfig;
use crate::model::error::NodeFault;
use crate::model::stats::{Counter, IoCounters};
use crate::proto::scripts::ScriptCall;
use crate::proto::session::{Kind, Session, Sink};
use crate::runtime::resolve::Lookup;
#[cfg(feature = "tls")]
use crate::runtime::tls_stream::TlsStream;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    #[cfg(feature = "tls")]
    Tls(Box<TlsStream>),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => &mut s.tcp,
        }
    }
    /// Reads into `buf`, counting the `read` calls made (TLS may make none, or several).
    fn read(&mut self, buf: &mut [u8], reads: &Counter) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => {
                reads.bump();
                s.read(buf)
            }
            Stream::Unix(s) => {
                reads.bump();
                s.read(buf)
            }
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(buf, reads),
        }
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(buf),
        }
    }
    /// Whether a read shorter than its buffer means the socket is drained. Not for TLS: a
    /// short read of plaintext says nothing of the socket ([`TlsStream`] keeps track itself).
    fn short_read_drains(&self) -> bool {
        match self {
            Stream::Tcp(_) | Stream::Unix(_) => true,
            #[cfg(feature = "tls")]
            Stream::Tls(_) => false,
        }
    }
    /// Finishes a non-blocking connect: `Ok(true)` connected, `Ok(false)` still in progress.
    fn connected(&mut self) -> io::Result<bool> {
        let (error, peer) = match self {
            Stream::Tcp(s) => (s.take_error(), s.peer_addr().map(|_| ())),
            Stream::Unix(s) => (s.take_error(), s.peer_addr().map(|_| ())),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => (s.tcp.take_error(), s.tcp.peer_addr().map(|_| ())),
        };
        if let Some(e) = error? {
            return Err(e);
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The fault an I/O error stands for: a TLS error keeps its message.
fn fault_of(e: &io::Error) -> NodeFault {
    #[cfg(feature = "tls")]
    if let Some(fault) = crate::runtime::tls_stream::fault(e) {
        return fault;
    }
    NodeFault::Io(e.kind())
}

/// One node's connection: the socket and its session.
pub(crate) struct Conn {
    pub addr: NodeAddr,
    token: Token,
    stream: Option<Stream>,
    rbuf: Box<[u8]>,
    pub session: Session,
    /// The engine's syscall counters, shared by its driver and every connection.
    io: Arc<IoCounters>,
    /// How to start TLS on this node's sockets (`rediss://`), else `None`.
    tls: Option<crate::model::tls::Connector>,
    /// The last write stopped short (`WouldBlock`): the rest goes out on writable readiness.
    write_blocked: bool,
    /// The node's host name and its address, looked up off the loop (`None`: a Unix socket).
    lookup: Option<Lookup>,
    /// The address the last connection was opened to (`None`: none was, the lookup had not
    /// answered), told to the lookup when that connection failed before it proved itself.
    addr_used: Option<std::net::SocketAddr>,
}

const READ_CHUNK: usize = 8 << 10;

impl Conn {
    pub fn new(
        addr: NodeAddr,
        token: Token,
        config: ConnConfig,
        io: Arc<IoCounters>,
        now: Instant,
    ) -> Conn {
        let lookup = match &addr.endpoint {
            Endpoint::Tcp { host, port } => {
                Some(Lookup::new(host, *port, crate::runtime::resolve::system))
            }
            Endpoint::Unix(_) => None,
        };
        Conn {
            lookup,
            addr_used: None,
            tls: config.tls.get(token.0).cloned().flatten(),
            session: Session::new(addr.clone(), config, now),
            addr,
            token,
            stream: None,
            write_blocked: false,
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            io,
        }
    }

    /// Requests sent and not answered yet (handshake included).
    pub fn pending(&self) -> usize {
        self.session.pending()
    }

    /// Bytes buffered: unsent output and undecoded input.
    pub fn buffered(&self) -> (usize, usize) {
        self.session.buffered()
    }

    /// The earliest instant at which [`Conn::on_timer`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.session.next_deadline()
    }

    /// Makes sure a connection exists or is under way (starting one now if needed); fails at
    /// once while backing off.
    pub fn ensure_connected(
        &mut self,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        if self.session.connect_due(now)? {
            self.open(now, registry, sink)?;
        }
        Ok(())
    }

    /// Opens a socket and starts its connect; the session learns either way. A connect that
    /// fails at once is followed by one to the name's next address while the round has one.
    fn open(
        &mut self,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        loop {
            match self.socket(registry) {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.write_blocked = false;
                    self.session.connecting(now);
                    return Ok(());
                }
                Err(fault) => {
                    self.session.connect_failed(fault.clone(), now, sink);
                    self.session.take_close();
                    if !self.next_address_now() {
                        return Err(fault);
                    }
                }
            }
        }
    }

    /// The connection just failed before it proved itself, on an address of a name that has
    /// others this round has not tried: the next is tried at once, not after the backoff (a
    /// fresh handle's `connect`, then `try_lock`, would find the node down). Each failure
    /// counts in the round, so this ends.
    fn next_address_now(&self) -> bool {
        self.session.last_unproven()
            && self.addr_used.is_some()
            && self.lookup.as_ref().is_some_and(Lookup::round_left)
    }

    fn socket(&mut self, registry: &Registry) -> Result<Stream, NodeFault> {
        self.io.connects.bump();
        let mut stream = match &self.addr.endpoint {
            Endpoint::Tcp { .. } => {
                // Looked up off the loop (`crate::runtime::resolve`): a slow resolver holds the loop
                // 100 ms at most, once per node; looked up again behind each (re)connect, so a
                // moved node is found again.
                let lookup = self.lookup.as_mut().expect("a TCP node has a lookup");
                let wait = crate::runtime::resolve::FIRST_WAIT.min(self.session.connect_timeout());
                // A connection that failed before it proved itself: the name's next address
                // after the one it used (one of `localhost`'s may refuse).
                let failed = self
                    .addr_used
                    .take()
                    .filter(|_| self.session.last_unproven());
                let addr = lookup.address(wait, failed)?;
                self.addr_used = Some(addr);
                let tcp = TcpStream::connect(addr).map_err(|e| NodeFault::Io(e.kind()))?;
                match &self.tls {
                    None => Stream::Tcp(tcp),
                    #[cfg(feature = "tls")]
                    Some(tls) => Stream::Tls(Box::new(TlsStream::new(tcp, tls.start()?))),
                    #[cfg(not(feature = "tls"))]
                    Some(never) => match *never {},
                }
            }
            Endpoint::Unix(path) => {
                Stream::Unix(UnixStream::connect(path).map_err(|e| NodeFault::Io(e.kind()))?)
            }
        };
        // Registered once for both directions, edge-triggered: no re-registration syscalls later.
        registry
            .register(
                stream.source(),
                self.token,
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| NodeFault::Io(e.kind()))?;
        Ok(stream)
    }

    /// Carries out what the session decided about the socket: closes it when the session
    /// failed the connection, and opens a new one at once for scripts to send again.
    fn sync(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) {
        if self.session.take_close()
            && let Some(mut stream) = self.stream.take()
        {
            let _ = registry.deregister(stream.source());
            if self.next_address_now() {
                let _ = self.open(now, registry, sink);
                return;
            }
        }
        if self.session.wants_replay() {
            let _ = self.open(now, registry, sink);
        }
    }

    /// Fails the connection (see [`Session::fail`]) and closes the socket.
    pub fn fail(
        &mut self,
        fault: NodeFault,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) {
        self.session.fail(fault, now, sink);
        self.sync(now, registry, sink);
    }

    fn admit(
        &mut self,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        self.ensure_connected(now, registry, sink)?;
        let admitted = self.session.admit(now, sink);
        self.sync(now, registry, sink);
        admitted
    }

    /// Queues an encoded command. Nothing is written until [`Conn::flush`].
    pub fn request(
        &mut self,
        kind: Kind,
        tag: u64,
        encoded: &[u8],
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        self.admit(now, registry, sink)?;
        self.session.request(kind, tag, encoded, now);
        Ok(())
    }

    /// Queues a script call (see [`Session::script`]).
    pub fn script(
        &mut self,
        call: ScriptCall<'_>,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        self.admit(now, registry, sink)?;
        self.session.script(call, now);
        Ok(())
    }

    /// Writes buffered output: one `write` per call in the common case. A short write waits for
    /// writable readiness.
    pub fn flush(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        // TLS records a full socket held back go out first.
        #[cfg(feature = "tls")]
        if let Stream::Tls(s) = stream {
            match s.push() {
                Ok(writes) => self.io.writes.add(writes),
                Err(e) => return self.fail(fault_of(&e), now, registry, sink),
            }
        }
        loop {
            let out = self.session.output();
            if out.is_empty() {
                self.write_blocked = false;
                return;
            }
            self.io.writes.bump();
            match stream.write(out) {
                Ok(n) => self.session.written(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.write_blocked = true;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(fault_of(&e), now, registry, sink);
                    return;
                }
            }
        }
    }

    /// Drives a TLS handshake on a readiness event: `true` when it is done (the session may
    /// write), `false` while it goes on. A failure fails the connection.
    #[cfg(feature = "tls")]
    fn tls_handshake(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) -> bool {
        let Some(Stream::Tls(s)) = self.stream.as_mut() else {
            return true;
        };
        match s.handshake() {
            Ok(p) => {
                self.io.reads.add(p.reads);
                self.io.writes.add(p.writes);
                self.io.tls_round_trips.add(p.flights);
                if p.done {
                    self.io.tls_handshakes.bump();
                    self.io.tls_resumed.add(u64::from(s.resumed()));
                }
                p.done
            }
            Err(fault) => {
                self.fail(fault, now, registry, sink);
                false
            }
        }
    }

    /// Readiness reported by `mio` (a hint: spurious events are harmless).
    ///
    /// `#[inline]` here and on [`Conn::read`]: one call site each, in `Driver::turn`. Without
    /// them the compiler stopped inlining them once the counters moved to shared atomics: a call
    /// more per readiness, about 60 more instructions per lock cycle (callgrind, N = 1).
    ///
    /// `closed`: the event says the peer closed its side (or the socket has an error): the
    /// reads go on to the end, past a short one.
    #[inline]
    pub fn on_ready(
        &mut self,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
        closed: bool,
    ) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        // Output is written by the engine's turn that follows a readiness event; here only what
        // waits for this readiness: the first write of a connection, the rest of a write that
        // stopped short, TLS records held back. (Writing here too, at every readable event,
        // split the turn's batch into more writes.)
        let mut flush = self.write_blocked;
        #[cfg(feature = "tls")]
        if let Stream::Tls(_) = stream {
            flush = true;
        }
        if self.session.awaits_connect() {
            flush = true;
            match stream.connected() {
                Ok(false) => return,
                Ok(true) => {
                    // Without it, Nagle holds back the second small write of a cycle.
                    match stream {
                        Stream::Tcp(s) => drop(s.set_nodelay(true)),
                        #[cfg(feature = "tls")]
                        Stream::Tls(s) => drop(s.tcp.set_nodelay(true)),
                        Stream::Unix(_) => {}
                    }
                }
                Err(e) => {
                    self.fail(NodeFault::Io(e.kind()), now, registry, sink);
                    return;
                }
            }
            // A TLS node counts as connected once its handshake is done: the connect timeout
            // covers both, and the session writes nothing before.
            #[cfg(feature = "tls")]
            if !self.tls_handshake(now, registry, sink) {
                return;
            }
            self.session.connected();
        }
        if flush {
            self.flush(now, registry, sink);
        }
        self.read(now, registry, sink, closed);
    }

    #[inline]
    fn read(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>, closed: bool) {
        self.session.read_begin();
        #[cfg(feature = "tls")]
        if let Some(Stream::Tls(s)) = self.stream.as_mut() {
            s.read_begin(closed);
        }
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return;
            };
            let n = match stream.read(&mut self.rbuf, &self.io.reads) {
                Ok(0) => {
                    self.fail(NodeFault::Closed, now, registry, sink);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.fail(fault_of(&e), now, registry, sink);
                    return;
                }
            };
            // Not when the peer closed: the close came with the data in one edge, and no other
            // edge would come for it (the session stayed ready on a dead
            // socket, and the next request failed there).
            let drained = !closed && n < self.rbuf.len() && stream.short_read_drains();
            self.session.on_bytes(&self.rbuf[..n], now, sink);
            if self.session.closing() {
                self.sync(now, registry, sink);
                return;
            }
            if !self.session.output().is_empty() {
                // A NOSCRIPT reply queued its EVAL fallback.
                self.flush(now, registry, sink);
            }
            // A short read means the socket is drained: a new edge comes with new data, so the
            // read that would only say WouldBlock is skipped (tokio does the same).
            if drained {
                return;
            }
        }
    }

    /// Deadlines: connect/handshake timeout, and requests unanswered for `reply_timeout`.
    /// `unwatched`: the turn's `poll` began at that instant and the socket made progress in it
    /// (see [`Session::unwatched_grace`]).
    pub fn on_timer(
        &mut self,
        now: Instant,
        unwatched: Option<Instant>,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) {
        if let Some(watched_from) = unwatched
            && self.session.unwatched_grace(now, watched_from)
        {
            return;
        }
        self.session.on_timer(now, sink);
        self.sync(now, registry, sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Config, InfoNeed};
    use std::net::{SocketAddr, TcpListener};
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::time::Duration;

    static REFUSING: AtomicU16 = AtomicU16::new(0);
    static LISTENING: AtomicU16 = AtomicU16::new(0);

    /// A name with two addresses, the first refusing (nothing listens there).
    fn two(_host: &str, _port: u16) -> Result<Vec<SocketAddr>, String> {
        let at = |p: &AtomicU16| SocketAddr::from(([127, 0, 0, 1], p.load(Ordering::SeqCst)));
        Ok(vec![at(&REFUSING), at(&LISTENING)])
    }

    /// `localhost` whose resolver gives `::1` first, a server bound to IPv4 only: the refused
    /// first address is followed at once by the next, without the backoff in between — a fresh
    /// handle's `connect` and then `try_lock` found the node down.
    #[test]
    fn a_refused_first_address_is_followed_at_once_by_the_next() {
        let refusing = TcpListener::bind("127.0.0.1:0").unwrap();
        REFUSING.store(refusing.local_addr().unwrap().port(), Ordering::SeqCst);
        drop(refusing);
        let listening = TcpListener::bind("127.0.0.1:0").unwrap();
        listening.set_nonblocking(true).unwrap();
        LISTENING.store(listening.local_addr().unwrap().port(), Ordering::SeqCst);
        let config = ConnConfig {
            settings: Config::default(),
            info: InfoNeed::Off,
            memory: false,
            tls: Arc::from([]),
            mutation: crate::model::mutation::Mutation::None,
        };
        let now = Instant::now();
        let addr = NodeAddr::parse("redis://two.test:1").unwrap();
        let io = Arc::new(IoCounters::default());
        let mut conn = Conn::new(addr, Token(0), config, io, now);
        conn.lookup = Some(Lookup::new("two.test", 1, two));
        let mut poll = mio::Poll::new().unwrap();
        let mut events = mio::Events::with_capacity(8);
        let sink: &mut Sink<'_> = &mut |_| {};
        conn.ensure_connected(now, poll.registry(), sink).unwrap();
        // The refusal comes, then the next address's connect: no more calls to connect, and
        // the same `now` throughout (the backoff would have the node down until now + 25 ms).
        let give_up = Instant::now() + Duration::from_secs(10);
        while listening.accept().is_err() {
            assert!(
                Instant::now() < give_up,
                "the second address was never tried"
            );
            poll.poll(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            if !events.is_empty() {
                conn.on_ready(now, poll.registry(), sink, false);
            }
        }
        assert_eq!(
            conn.addr_used.map(|a| a.port()),
            Some(LISTENING.load(Ordering::SeqCst))
        );
    }
}
