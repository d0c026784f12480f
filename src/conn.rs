//! One connection to one node: the socket, an output buffer written with as few syscalls as
//! possible, an input buffer with a resumable decoder, the pipelined handshake, FIFO matching of
//! replies to requests, the `NOSCRIPT` → `EVAL` fallback, and lazy reconnects with backoff.
//!
//! Nothing here blocks: connects are non-blocking, and every method returns at once. The driver
//! (`driver.rs`) calls [`Conn::on_ready`] when `mio` reports readiness and [`Conn::on_timer`] when
//! a deadline may have passed.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::ToSocketAddrs;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use sha1::{Digest, Sha1};

use crate::addr::{Endpoint, NodeAddr};
use crate::error::NodeFault;
use crate::resp::{self, AggregateKind, Arg, Decoder, ErrorKind, Frame, Limits, Status};

/// How connections behave; shared by all connections of a client.
#[derive(Debug, Clone)]
pub(crate) struct ConnConfig {
    /// TCP connect plus handshake must finish within this.
    pub connect_timeout: Duration,
    /// First wait after a failed connect; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest wait between reconnect attempts.
    pub backoff_max: Duration,
    /// A request unanswered for this long means the node is hung: the connection is reset.
    pub reply_timeout: Duration,
    /// Most requests waiting for a reply on one connection before it is reset.
    pub max_pending: usize,
    /// Decoder limits; `max_frame_len` also bounds the input buffer.
    pub limits: Limits,
    /// `CLIENT SETNAME` in the handshake.
    pub client_name: Option<String>,
    /// Ask `INFO server` in the handshake (for restart quarantine).
    pub info: bool,
}

/// A Lua script sent by hash.
#[derive(Debug)]
pub(crate) struct Script {
    pub index: usize,
    pub body: &'static str,
    pub sha: [u8; 40],
}

/// Compare-and-delete: release the lock only if it still holds our token.
pub(crate) const RELEASE_BODY: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";
/// Compare-and-pexpire: extend the lock only if it still holds our token.
pub(crate) const EXTEND_BODY: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"pexpire\",KEYS[1],ARGV[2]) else return 0 end";

fn sha_hex(body: &str) -> [u8; 40] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha1::digest(body.as_bytes());
    let mut out = [0u8; 40];
    for (i, byte) in digest.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 15)];
    }
    out
}

/// The release and extend scripts, their SHA-1 computed once per process.
pub(crate) fn scripts() -> &'static [Script; 2] {
    static SCRIPTS: OnceLock<[Script; 2]> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        [
            Script {
                index: 0,
                body: RELEASE_BODY,
                sha: sha_hex(RELEASE_BODY),
            },
            Script {
                index: 1,
                body: EXTEND_BODY,
                sha: sha_hex(EXTEND_BODY),
            },
        ]
    })
}

/// What a request was, so its reply can be interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Part of the handshake; handled here, never delivered.
    Handshake(Step),
    /// `SET key token NX PX ttl`.
    Set,
    /// `EVALSHA`/`EVAL` of a script (index into [`scripts`]).
    Script(usize),
    /// Anything else (status queries).
    Command,
}

/// Handshake steps, in the order they are pipelined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `HELLO 3 [AUTH user pass]`: answered with a map.
    Hello,
    /// `AUTH [user] pass`: answered `+OK`.
    Auth,
    /// `SELECT db`: answered `+OK`.
    Select,
    /// `CLIENT SETNAME name`: answered `+OK`.
    SetName,
    /// `INFO server`: answered with a bulk (or verbatim) string.
    Info,
}

impl Step {
    /// The command, as error messages name it.
    fn command(self) -> &'static str {
        match self {
            Step::Hello => "HELLO",
            Step::Auth => "AUTH",
            Step::Select => "SELECT",
            Step::SetName => "CLIENT SETNAME",
            Step::Info => "INFO server",
        }
    }

    /// True when `frame` is the kind of answer this step gets from a real server. Anything else
    /// (an `INFO` answered `+OK`, a `HELLO` answered `:1`) is a server that does not speak the
    /// protocol, and fails the handshake.
    fn accepts(self, frame: &Frame<'_>) -> bool {
        match self {
            Step::Hello => {
                matches!(frame, Frame::Aggregate(a) if matches!(a.kind(), AggregateKind::Map | AggregateKind::Array))
            }
            Step::Auth | Step::Select | Step::SetName => matches!(frame, Frame::Simple("OK")),
            Step::Info => matches!(frame, Frame::Bulk(_) | Frame::Verbatim { .. }),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    kind: Kind,
    tag: u64,
    sent: Instant,
    /// For scripts: bytes of the command after the script argument, kept in `script_tails`.
    tail: usize,
    /// For scripts: how many arguments that tail holds.
    argc: usize,
    /// First sent, or sent once more on a fresh connection after its first connection dropped.
    sending: Sending,
}

/// Whether a request is on its first connection or was sent again after that one dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sending {
    First,
    Again,
}

/// A reply (or a fault) for one request, handed to the driver.
pub(crate) struct Delivery<'a> {
    pub tag: u64,
    pub kind: Kind,
    pub reply: Result<Frame<'a>, &'a NodeFault>,
    /// The connection the reply came on, and what its node said in `INFO server` there.
    pub generation: u64,
    pub info: Option<ServerInfo>,
    /// This request was answered earlier (that answer was delivered), but the same read then
    /// turned out to carry surplus frames or garbage: the node does not speak the protocol, and
    /// its answer is taken back. `reply` holds the fault.
    pub withdrawn: bool,
}

/// What the node said about itself in `INFO server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub run_id: [u8; 40],
    pub uptime: Duration,
    /// When the reply arrived: the node started at about `seen - uptime`.
    pub seen: Instant,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    /// Finishes a non-blocking connect: `Ok(true)` connected, `Ok(false)` still in progress.
    fn connected(&mut self) -> io::Result<bool> {
        let (error, peer) = match self {
            Stream::Tcp(s) => (s.take_error(), s.peer_addr().map(|_| ())),
            Stream::Unix(s) => (s.take_error(), s.peer_addr().map(|_| ())),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No socket: a working connection was closed (by the server's idle `timeout`, a proxy,
    /// `CLIENT KILL`, a restart). The next request reconnects at once, within its operation.
    Closed,
    /// No socket: connecting failed. No connect attempt before `retry_at`.
    Down { retry_at: Instant },
    /// TCP connect in progress.
    Connecting { deadline: Instant },
    /// Connected; handshake replies outstanding.
    Handshaking { deadline: Instant },
    /// Ready for requests.
    Ready,
}

/// Counters of syscalls made by connections (for tests and the benchmark's counts).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoStats {
    /// `write` calls.
    pub writes: u64,
    /// `read` calls.
    pub reads: u64,
    /// `poll` (epoll_wait) calls.
    pub polls: u64,
    /// Connect attempts.
    pub connects: u64,
    /// Wake-ups of a shared engine's loop by callers (`Waker::wake`: one `write` to an
    /// eventfd each); zero for a [`Client`](crate::Client).
    pub wakes: u64,
}

/// Connection state that reply handling mutates (split from the buffers the frames borrow).
struct State {
    phase: Phase,
    out: BytesMut,
    /// Requests queued while the handshake is under way: written only once every handshake
    /// reply has come back right, so that a failed `AUTH` or `SELECT` can never let a `SET` run
    /// as the wrong user or in the wrong database.
    held: BytesMut,
    /// Requests answered in the current read (tag, kind), so that a read that turns out to
    /// carry surplus frames or garbage can take their answers back.
    answered: Vec<(u64, Kind)>,
    pending: VecDeque<Pending>,
    script_tails: BytesMut,
    loaded: [bool; 2],
    handshake_left: usize,
    backoff: Duration,
    last_fault: Option<NodeFault>,
    failure: Option<NodeFault>,
    info: Option<ServerInfo>,
    generation: u64,
    /// A frame arrived on this connection: it has proven itself, so losing it reconnects at once.
    replied: bool,
}

/// One node's connection.
pub(crate) struct Conn {
    pub addr: NodeAddr,
    token: Token,
    config: ConnConfig,
    stream: Option<Stream>,
    rbuf: Box<[u8]>,
    inp: BytesMut,
    decoder: Decoder,
    st: State,
    pub stats: IoStats,
}

const READ_CHUNK: usize = 8 << 10;

type Sink<'s> = dyn for<'a> FnMut(Delivery<'a>) + 's;

impl Conn {
    pub fn new(addr: NodeAddr, token: Token, config: ConnConfig, now: Instant) -> Conn {
        let decoder = Decoder::new(config.limits);
        let backoff = config.backoff_min;
        Conn {
            addr,
            token,
            config,
            stream: None,
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            inp: BytesMut::with_capacity(READ_CHUNK),
            decoder,
            st: State {
                phase: Phase::Down { retry_at: now },
                // Sized for a burst of pipelined requests (a shared engine under load, or
                // releases lingering on a slow machine): growing them later allocates on the
                // hot path.
                out: BytesMut::with_capacity(8 << 10),
                held: BytesMut::new(),
                answered: Vec::with_capacity(64),
                pending: VecDeque::with_capacity(64),
                script_tails: BytesMut::with_capacity(4 << 10),
                loaded: [false; 2],
                handshake_left: 0,
                backoff,
                last_fault: None,
                failure: None,
                info: None,
                generation: 0,
                replied: false,
            },
            stats: IoStats::default(),
        }
    }

    /// True once the handshake is done.
    pub fn is_ready(&self) -> bool {
        self.st.phase == Phase::Ready
    }

    /// True while a connect or handshake is under way.
    pub fn is_connecting(&self) -> bool {
        matches!(
            self.st.phase,
            Phase::Connecting { .. } | Phase::Handshaking { .. }
        )
    }

    /// Requests sent and not answered yet (handshake included).
    pub fn pending(&self) -> usize {
        self.st.pending.len()
    }

    /// Bytes buffered: unsent output and undecoded input.
    pub fn buffered(&self) -> (usize, usize) {
        (self.st.out.len(), self.inp.len())
    }

    /// The earliest instant at which [`Conn::on_timer`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let phase = match self.st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline } => Some(deadline),
            _ => None,
        };
        let stale = self
            .st
            .pending
            .front()
            .map(|p| p.sent + self.config.reply_timeout);
        match (phase, stale) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Makes sure a connection exists or is under way (starting one now if needed); fails at
    /// once while backing off.
    pub fn ensure_connected(
        &mut self,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        match self.st.phase {
            Phase::Down { retry_at } if now < retry_at => Err(NodeFault::Backoff(Box::new(
                self.st.last_fault.clone().unwrap_or(NodeFault::Closed),
            ))),
            Phase::Down { .. } | Phase::Closed => {
                if let Err(fault) = self.connect(now, registry) {
                    self.fail(fault.clone(), now, registry, sink);
                    return Err(fault);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn connect(&mut self, now: Instant, registry: &Registry) -> Result<(), NodeFault> {
        self.stats.connects += 1;
        let mut stream = match &self.addr.endpoint {
            Endpoint::Tcp { host, port } => {
                // Resolution is immediate for IP literals; host names are resolved on each
                // (re)connect so a moved node is found again.
                let addr = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| NodeFault::Resolve(e.to_string()))?
                    .next()
                    .ok_or_else(|| NodeFault::Resolve("no address".into()))?;
                Stream::Tcp(TcpStream::connect(addr).map_err(|e| NodeFault::Io(e.kind()))?)
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
        self.stream = Some(stream);
        self.decoder.reset();
        self.inp.clear();
        let st = &mut self.st;
        st.out.clear();
        st.held.clear();
        st.pending.clear();
        st.script_tails.clear();
        st.loaded = [false; 2];
        st.info = None;
        st.failure = None;
        st.replied = false;
        st.generation += 1;
        st.phase = Phase::Connecting {
            deadline: now + self.config.connect_timeout,
        };
        self.queue_handshake(now);
        Ok(())
    }

    /// The handshake, pipelined in the first write: one round trip, whatever it contains.
    fn queue_handshake(&mut self, now: Instant) {
        let addr = &self.addr;
        let st = &mut self.st;
        let mut steps = 0;
        let mut push = |st: &mut State, step: Step, args: &[Arg<'_>]| {
            resp::encode_command(&mut st.out, args);
            st.pending.push_back(Pending {
                kind: Kind::Handshake(step),
                tag: 0,
                sent: now,
                tail: 0,
                argc: 0,
                sending: Sending::First,
            });
            steps += 1;
        };
        let user = addr.username.as_deref();
        let pass = addr.password();
        if addr.protocol == 3 {
            match pass {
                Some(p) => push(
                    st,
                    Step::Hello,
                    &[
                        "HELLO".into(),
                        "3".into(),
                        "AUTH".into(),
                        user.unwrap_or("default").into(),
                        p.into(),
                    ],
                ),
                None => push(st, Step::Hello, &["HELLO".into(), "3".into()]),
            }
        } else if let Some(p) = pass {
            match user {
                Some(u) => push(st, Step::Auth, &["AUTH".into(), u.into(), p.into()]),
                None => push(st, Step::Auth, &["AUTH".into(), p.into()]),
            }
        }
        if addr.db != 0 {
            push(
                st,
                Step::Select,
                &["SELECT".into(), u64::from(addr.db).into()],
            );
        }
        if let Some(name) = &self.config.client_name {
            push(
                st,
                Step::SetName,
                &["CLIENT".into(), "SETNAME".into(), name.as_str().into()],
            );
        }
        if self.config.info {
            push(st, Step::Info, &["INFO".into(), "server".into()]);
        }
        st.handshake_left = steps;
    }

    fn admit(
        &mut self,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        self.ensure_connected(now, registry, sink)?;
        if self.st.pending.len() >= self.config.max_pending {
            self.fail(NodeFault::Overloaded, now, registry, sink);
            return Err(NodeFault::Overloaded);
        }
        Ok(())
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
        self.st.queue_buffer().extend_from_slice(encoded);
        self.st.pending.push_back(Pending {
            kind,
            tag,
            sent: now,
            tail: 0,
            argc: 0,
            sending: Sending::First,
        });
        Ok(())
    }

    /// Queues a script call: `EVALSHA` once the script is known on this connection, `EVAL`
    /// (which loads it) before. `tail` is the encoded `numkeys key... arg...` (`argc` bulk
    /// strings), the same for every node, so it is encoded once per operation.
    #[allow(clippy::too_many_arguments)]
    pub fn script(
        &mut self,
        script: &Script,
        tag: u64,
        tail: &[u8],
        argc: usize,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) -> Result<(), NodeFault> {
        self.admit(now, registry, sink)?;
        self.st
            .queue_script(script, tag, tail, argc, now, Sending::First);
        Ok(())
    }

    /// Writes buffered output: one `write` per call in the common case. A short write waits for
    /// writable readiness.
    pub fn flush(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) {
        if !matches!(self.st.phase, Phase::Handshaking { .. } | Phase::Ready) {
            return;
        }
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        while !self.st.out.is_empty() {
            self.stats.writes += 1;
            match stream.write(&self.st.out) {
                Ok(n) => self.st.out.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(NodeFault::Io(e.kind()), now, registry, sink);
                    return;
                }
            }
        }
    }

    /// Readiness reported by `mio` (a hint: spurious events are harmless).
    pub fn on_ready(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        if let Phase::Connecting { deadline } = self.st.phase {
            match stream.connected() {
                Ok(false) => return,
                Ok(true) => {
                    if let Stream::Tcp(s) = stream {
                        // Without it, Nagle holds back the second small write of a cycle.
                        let _ = s.set_nodelay(true);
                    }
                    self.st.phase = if self.st.handshake_left > 0 {
                        Phase::Handshaking { deadline }
                    } else {
                        Phase::Ready
                    };
                }
                Err(e) => {
                    self.fail(NodeFault::Io(e.kind()), now, registry, sink);
                    return;
                }
            }
        }
        self.flush(now, registry, sink);
        self.read(now, registry, sink);
    }

    fn read(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) {
        self.st.answered.clear();
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return;
            };
            self.stats.reads += 1;
            let n = match stream.read(&mut self.rbuf) {
                Ok(0) => {
                    self.fail(NodeFault::Closed, now, registry, sink);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.fail(NodeFault::Io(e.kind()), now, registry, sink);
                    return;
                }
            };
            let Conn {
                rbuf,
                inp,
                decoder,
                st,
                ..
            } = self;
            if inp.is_empty() {
                // The common case: decode straight from the read buffer, keep only a partial tail.
                let used = decode_frames(decoder, &rbuf[..n], st, now, sink);
                inp.extend_from_slice(&rbuf[used..n]);
            } else {
                inp.extend_from_slice(&rbuf[..n]);
                let used = decode_frames(decoder, inp, st, now, sink);
                inp.advance(used);
            }
            if let Some(fault) = self.st.failure.take() {
                self.st.withdraw_answered(&fault, sink);
                self.fail(fault, now, registry, sink);
                return;
            }
            if !self.st.out.is_empty() {
                // A NOSCRIPT reply queued its EVAL fallback.
                self.flush(now, registry, sink);
            }
            // A short read means the socket is drained: a new edge comes with new data, so the
            // read that would only say WouldBlock is skipped (tokio does the same).
            if n < self.rbuf.len() {
                return;
            }
        }
    }

    /// Deadlines: connect/handshake timeout, and requests unanswered for `reply_timeout`.
    pub fn on_timer(&mut self, now: Instant, registry: &Registry, sink: &mut Sink<'_>) {
        match self.st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline } if now >= deadline => {
                self.fail(NodeFault::ConnectTimeout, now, registry, sink);
                return;
            }
            _ => {}
        }
        if let Some(p) = self.st.pending.front()
            && now >= p.sent + self.config.reply_timeout
        {
            self.fail(NodeFault::Timeout, now, registry, sink);
        }
    }

    /// Closes the connection: every request still waiting gets the fault, and the next use
    /// reconnects — at once if the connection had been working, after a growing backoff if it
    /// never came up.
    ///
    /// Extend and release scripts are idempotent (compare-and-pexpire, compare-and-delete), so
    /// when a working connection drops under them (the server closed it: idle `timeout`, a
    /// proxy, `CLIENT KILL`) they are sent once more on a fresh connection, started here; their
    /// operation's own node deadline still bounds the wait. A `SET NX` is not replayed: a second
    /// `SET` would find our own key and answer "held".
    pub fn fail(
        &mut self,
        fault: NodeFault,
        now: Instant,
        registry: &Registry,
        sink: &mut Sink<'_>,
    ) {
        if let Some(mut stream) = self.stream.take() {
            let _ = registry.deregister(stream.source());
        }
        let st = &mut self.st;
        // Taken, not read: a connect that fails before a new connection answers anything must
        // back off, whatever the previous connection did.
        let proven = std::mem::take(&mut st.replied);
        let replay = proven && matches!(fault, NodeFault::Closed | NodeFault::Io(_));
        // Rare path: the requests to send again, with their script arguments.
        let mut again: Vec<(Pending, Vec<u8>)> = Vec::new();
        while let Some(p) = st.pending.pop_front() {
            let tail = st.script_tails[..p.tail].to_vec();
            st.script_tails.advance(p.tail);
            match p.kind {
                Kind::Handshake(_) => {}
                Kind::Script(_) if replay && p.sending == Sending::First => again.push((p, tail)),
                _ => sink(Delivery {
                    tag: p.tag,
                    kind: p.kind,
                    reply: Err(&fault),
                    generation: st.generation,
                    info: st.info,
                    withdrawn: false,
                }),
            }
        }
        st.out.clear();
        st.held.clear();
        st.script_tails.clear();
        self.inp.clear();
        self.decoder.reset();
        st.last_fault = Some(fault);
        if proven {
            st.backoff = self.config.backoff_min;
            st.phase = Phase::Closed;
        } else {
            self.back_off(now);
        }
        if again.is_empty() {
            return;
        }
        match self.connect(now, registry) {
            Ok(()) => {
                for (p, tail) in again {
                    let Kind::Script(index) = p.kind else {
                        continue;
                    };
                    self.st.queue_script(
                        &scripts()[index],
                        p.tag,
                        &tail,
                        p.argc,
                        now,
                        Sending::Again,
                    );
                }
            }
            Err(fault) => {
                for (p, _) in again {
                    sink(Delivery {
                        tag: p.tag,
                        kind: p.kind,
                        reply: Err(&fault),
                        generation: self.st.generation,
                        info: None,
                        withdrawn: false,
                    });
                }
                self.st.last_fault = Some(fault);
                self.back_off(now);
            }
        }
    }

    /// No connect attempt for the current backoff, which doubles for the next failure.
    fn back_off(&mut self, now: Instant) {
        let st = &mut self.st;
        let wait = st.backoff;
        st.backoff = (st.backoff * 2).min(self.config.backoff_max);
        st.phase = Phase::Down {
            retry_at: now + wait,
        };
    }
}

/// Decodes and dispatches every complete frame in `buf`; returns the bytes consumed.
fn decode_frames(
    decoder: &mut Decoder,
    buf: &[u8],
    st: &mut State,
    now: Instant,
    sink: &mut Sink<'_>,
) -> usize {
    let mut used = 0;
    while st.failure.is_none() {
        match decoder.decode(&buf[used..]) {
            Ok(Status::Complete((frame, n))) => {
                used += n;
                st.on_frame(frame, now, sink);
            }
            Ok(Status::Partial) => break,
            Err(e) => st.failure = Some(NodeFault::Protocol(e)),
        }
    }
    used
}

impl State {
    /// Where a new request's bytes go: straight out, or held until the handshake is done.
    fn queue_buffer(&mut self) -> &mut BytesMut {
        if self.handshake_left > 0 {
            &mut self.held
        } else {
            &mut self.out
        }
    }

    /// Queues a script call: `EVALSHA` once the script is known on this connection, `EVAL`
    /// (which loads it) before.
    fn queue_script(
        &mut self,
        script: &Script,
        tag: u64,
        tail: &[u8],
        argc: usize,
        now: Instant,
        sending: Sending,
    ) {
        let (verb, head) = if self.loaded[script.index] {
            (Arg::Bytes(b"EVALSHA"), Arg::Bytes(&script.sha))
        } else {
            (Arg::Bytes(b"EVAL"), Arg::Bytes(script.body.as_bytes()))
        };
        let out = self.queue_buffer();
        out.reserve(32 + resp::bulk_len(&verb) + resp::bulk_len(&head) + tail.len());
        resp::encode_array_header(out, 2 + argc);
        resp::encode_bulk(out, &verb);
        resp::encode_bulk(out, &head);
        out.extend_from_slice(tail);
        // Keep the arguments so a NOSCRIPT reply can be answered with EVAL, transparently.
        self.script_tails.extend_from_slice(tail);
        self.pending.push_back(Pending {
            kind: Kind::Script(script.index),
            tag,
            sent: now,
            tail: tail.len(),
            argc,
            sending,
        });
    }

    /// Takes back the answers delivered in the read that `fault` spoiled.
    fn withdraw_answered(&mut self, fault: &NodeFault, sink: &mut Sink<'_>) {
        for &(tag, kind) in &self.answered {
            sink(Delivery {
                tag,
                kind,
                reply: Err(fault),
                generation: self.generation,
                info: self.info,
                withdrawn: true,
            });
        }
        self.answered.clear();
    }

    fn on_frame(&mut self, frame: Frame<'_>, now: Instant, sink: &mut Sink<'_>) {
        self.replied = true;
        if let Frame::Aggregate(agg) = frame
            && agg.kind() == AggregateKind::Push
        {
            // RESP3 out-of-band data (e.g. invalidations) is not a reply to anything.
            return;
        }
        let Some(p) = self.pending.pop_front() else {
            self.failure = Some(NodeFault::Unexpected("with no request outstanding".into()));
            return;
        };
        match p.kind {
            Kind::Handshake(step) => self.on_handshake(step, frame, now),
            Kind::Script(index) => {
                if let Frame::Error(e) = frame
                    && e.kind == crate::resp::ErrorKind::NoScript
                {
                    // Flushed or restarted behind our back: send the script itself, which also
                    // loads it. Its reply keeps the request's place among this connection's
                    // replies (FIFO), so nobody else notices. (Rare: the copy may allocate.)
                    let tail = self.script_tails[..p.tail].to_vec();
                    self.script_tails.advance(p.tail);
                    let script = &scripts()[index];
                    self.loaded[index] = false;
                    resp::encode_array_header(&mut self.out, 2 + p.argc);
                    resp::encode_bulk(&mut self.out, &Arg::Bytes(b"EVAL"));
                    resp::encode_bulk(&mut self.out, &Arg::Bytes(script.body.as_bytes()));
                    self.out.extend_from_slice(&tail);
                    self.script_tails.extend_from_slice(&tail);
                    self.pending.push_back(Pending { sent: now, ..p });
                    return;
                }
                // Advancing (not split_to) keeps the buffer unshared: no allocation per reply.
                self.script_tails.advance(p.tail);
                if !matches!(frame, Frame::Error(_)) {
                    self.loaded[index] = true;
                }
                self.deliver(p, Ok(frame), sink);
            }
            _ => self.deliver(p, Ok(frame), sink),
        }
    }

    fn deliver(&mut self, p: Pending, reply: Result<Frame<'_>, &NodeFault>, sink: &mut Sink<'_>) {
        self.answered.push((p.tag, p.kind));
        sink(Delivery {
            tag: p.tag,
            kind: p.kind,
            reply,
            generation: self.generation,
            info: self.info,
            withdrawn: false,
        });
    }

    fn on_handshake(&mut self, step: Step, frame: Frame<'_>, now: Instant) {
        if let Frame::Error(e) = frame {
            let message = e.message.to_owned();
            self.failure = Some(match (step, e.kind) {
                (Step::Hello | Step::Auth, _) => NodeFault::Auth(message),
                // Logged in, but the ACL user may not run this step.
                (_, ErrorKind::NoPerm) => NodeFault::Permission {
                    command: step.command(),
                    message,
                },
                (_, kind) if kind.is_auth() => NodeFault::Auth(message),
                (_, kind) => NodeFault::Server(kind, message),
            });
            return;
        }
        if !step.accepts(&frame) {
            self.failure = Some(NodeFault::Unexpected(format!(
                "{:?} in answer to {}",
                frame.to_value(),
                step.command()
            )));
            return;
        }
        if step == Step::Info {
            let text = match frame {
                Frame::Bulk(b) | Frame::Verbatim { text: b, .. } => b,
                _ => &[],
            };
            self.info = parse_info(text, now);
        }
        self.handshake_left = self.handshake_left.saturating_sub(1);
        if self.handshake_left == 0 {
            self.phase = Phase::Ready;
            // The handshake went through: the requests held back may go now.
            if self.out.is_empty() {
                std::mem::swap(&mut self.out, &mut self.held);
            } else {
                self.out.extend_from_slice(&self.held);
                self.held.clear();
            }
        }
    }
}

/// Extracts `run_id` and `uptime_in_seconds` from an `INFO server` reply.
pub(crate) fn parse_info(text: &[u8], now: Instant) -> Option<ServerInfo> {
    let mut run_id = None;
    let mut uptime = None;
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"run_id:") {
            run_id = <[u8; 40]>::try_from(v).ok();
        } else if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
            uptime = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
        }
    }
    Some(ServerInfo {
        run_id: run_id?,
        uptime: Duration::from_secs(uptime?),
        seen: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_hashes_match_redis() {
        // SHA-1 of the bodies, as `SCRIPT LOAD` would answer.
        let s = scripts();
        assert_eq!(s[0].sha, sha_hex(RELEASE_BODY));
        assert_eq!(
            std::str::from_utf8(&sha_hex("return 1")).unwrap(),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn info_parsing() {
        let now = Instant::now();
        let text = b"# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789012345678901234567890123456789\r\nuptime_in_seconds:42\r\n";
        let info = parse_info(text, now).unwrap();
        assert_eq!(info.uptime, Duration::from_secs(42));
        assert_eq!(&info.run_id, b"0123456789012345678901234567890123456789");
        assert_eq!(parse_info(b"garbage", now), None);
    }
}
