//! One node's protocol state, without I/O: the output buffer, the input buffer with its
//! resumable decoder, the pipelined handshake (and the requests held back until it succeeded),
//! FIFO matching of replies to requests, the `NOSCRIPT` → `EVAL` fallback, the replay of
//! idempotent scripts on a fresh connection, reply and connect deadlines, and the reconnect
//! backoff.
//!
//! A [`Session`] never touches a socket, the clock or the OS: it takes `now`, the bytes read
//! and what happened to the socket (opened, connected, failed), and it gives the bytes to write,
//! the replies (through a sink), and whether the socket must be closed or opened. `runtime/conn.rs` is
//! the thin half that owns the socket and calls it; a simulator can drive it with bytes of its
//! own (the split of `quinn-proto`'s `Connection` from `quinn`'s endpoint driver).

mod handshake;

use handshake::Step;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};

use crate::model::addr::NodeAddr;
use crate::model::clock::{self, ClockSample};
use crate::model::config::{ConnConfig, InfoNeed};
use crate::model::error::NodeFault;
use crate::model::event::event;
use crate::model::eviction::Eviction;
use crate::model::stats::NodeCounters;
use crate::proto::info::ServerInfo;
use crate::proto::resp::{self, AggregateKind, Arg, Decoder, ErrorKind, Frame, Status};
use crate::proto::scripts::{
    EVALSHA_HEAD_LEN, SCRIPT_COUNT, Script, ScriptCall, replayable, scripts, writes_a_hold,
};

/// Each connection's input and output buffers start this large: a burst of pipelined
/// requests or replies (a shared engine under load) fits without growing on the hot path.
const IO_BUFFER: usize = 8 << 10;
/// Replies matched in one read before they are handed on: more than a read usually holds.
const ANSWERED_CAPACITY: usize = 64;
/// Requests awaiting replies on one connection: room for a deep pipeline before growing
/// (`max_pending` bounds it).
const PENDING_CAPACITY: usize = 256;
/// The arguments of scripts that may be replayed on a fresh connection: a few hundred
/// releases and extends in flight.
const SCRIPT_TAILS_CAPACITY: usize = 16 << 10;
/// Room reserved for a command's array header (`*<argc>\r\n`, at most 23 bytes) and slack.
const ARRAY_HEADER_MAX: usize = 32;

/// A server's refusal that passes by itself: busy (a script, loading, a replica's master
/// down) or, `ERR`, over its `maxclients`.
pub(crate) fn is_transient(kind: ErrorKind, message: &str) -> bool {
    match kind {
        ErrorKind::Busy | ErrorKind::Loading | ErrorKind::MasterDown => true,
        ErrorKind::Err => message.contains("max number of clients reached"),
        _ => false,
    }
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
    /// `SUBSCRIBE` / `UNSUBSCRIBE` of one channel: answered by a push confirmation (RESP3),
    /// which is consumed here, or by an error, which is delivered.
    Subscribe,
    /// A `message` push (a release notice): delivered as it comes, answering no request.
    Notice,
    /// `HELLO 3` on a connection opened with RESP2, before its first `SUBSCRIBE` (in RESP2 a
    /// subscribed connection could run nothing else).
    Upgrade,
    /// `TIME`, sent before an acquire's or extend's own command by the clock check
    /// (`crate::model::clock`): its answer is kept as the node's clock sample
    /// ([`Session::clock`]), never delivered; a fault fails the command behind it.
    Time,
}

/// `TIME`, encoded.
pub(crate) const TIME_COMMAND: &[u8] = b"*1\r\n$4\r\nTIME\r\n";

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
    /// For scripts: sent as `EVAL` (the script itself), so a `NOSCRIPT` reply to it is the
    /// server's fault, not ours to answer again.
    eval: bool,
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
    /// What the node's `INFO memory` said on that connection about evicting keys.
    pub eviction: Eviction,
    /// (A reference: a `ServerInfo` inline made a `Delivery` too large to be moved without a
    /// `memcpy` call, two per reply.)
    pub info: Option<&'a ServerInfo>,
    /// The node's clock as the connection last read it (`TIME`, the clock check): for a vote,
    /// the reading sent just before its request.
    pub clock: Option<&'a ClockSample>,
    /// This request was answered earlier (that answer was delivered), but the same read then
    /// turned out to carry surplus frames or garbage: the node does not speak the protocol, and
    /// its answer is taken back. `reply` holds the fault.
    pub withdrawn: bool,
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

/// Session state that reply handling mutates (split from the buffers the frames borrow).
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
    loaded: [bool; SCRIPT_COUNT],
    handshake_left: usize,
    /// This connection's connect deadline was moved once already ([`Session::unwatched_grace`]).
    graced: bool,
    /// A caller needs this silent connection ([`Session::hurry`]): a request unanswered for
    /// the connect timeout fails it. Cleared by any answer and by a new connection.
    hurried: bool,
    backoff: Duration,
    last_fault: Option<NodeFault>,
    failure: Option<NodeFault>,
    info: Option<ServerInfo>,
    /// The node's clock as this connection's last `TIME` read it (the clock check), and the
    /// connection on which a `TIME` refused was last reported.
    clock: Option<ClockSample>,
    time_told: u64,
    /// This connection's `INFO memory`, read.
    eviction: Eviction,
    generation: u64,
    /// The address's database (named when `SELECT` is refused).
    db: u32,
    /// Whether an error answer to `INFO server` fails the handshake.
    info_need: InfoNeed,
    /// The simulator's defect, if any (`ConnConfig::mutation`).
    mutation: crate::model::mutation::Mutation,
    /// The `run_id` its last handshake met, and how often it changed (`ServerInfo::changes`).
    last_run_id: Option<[u8; 40]>,
    run_id_changes: u32,
    /// The handshake succeeded (or a request was answered): the connection has proven itself,
    /// so losing it reconnects at once.
    replied: bool,
    /// What this node's connections count (read by the engine's handles), and the node's
    /// `host:port` for events.
    counters: Arc<NodeCounters>,
    #[cfg_attr(not(feature = "log"), allow(dead_code))]
    name: String,
    /// Whether a connection of this node was ever ready, and whether the last one was lost (or
    /// failed to come up) since: the next one up is a reconnect.
    ever_up: bool,
    down: bool,
}

/// One node's protocol state; see the module docs.
pub(crate) struct Session {
    addr: NodeAddr,
    config: ConnConfig,
    inp: BytesMut,
    decoder: Decoder,
    st: State,
    /// Scripts to send again on the next connection (a working one dropped under them).
    replay: Vec<(Pending, Vec<u8>)>,
    /// The session failed the connection: the socket must be closed.
    close: bool,
    /// The last connection failed before it proved itself (its address refused, say): the
    /// next connect tries the name's next address (`crate::runtime::resolve`).
    last_unproven: bool,
}

pub(crate) type Sink<'s> = dyn for<'a> FnMut(Delivery<'a>) + 's;

impl Session {
    pub fn new(addr: NodeAddr, config: ConnConfig, now: Instant) -> Session {
        let decoder = Decoder::new(config.settings.limits);
        let backoff = config.settings.backoff_min;
        let db = addr.db;
        let info_need = config.info;
        // Built once per node (the name of its events): not on the hot path.
        let name = addr.to_string();
        Session {
            addr,
            inp: BytesMut::with_capacity(IO_BUFFER),
            decoder,
            st: State {
                phase: Phase::Down { retry_at: now },
                // Sized for a burst of pipelined requests (a shared engine under load, or
                // releases lingering on a slow machine): growing them later allocates on the
                // hot path.
                out: BytesMut::with_capacity(IO_BUFFER),
                held: BytesMut::new(),
                answered: Vec::with_capacity(ANSWERED_CAPACITY),
                pending: VecDeque::with_capacity(PENDING_CAPACITY),
                script_tails: BytesMut::with_capacity(SCRIPT_TAILS_CAPACITY),
                loaded: [false; SCRIPT_COUNT],
                handshake_left: 0,
                graced: false,
                hurried: false,
                backoff,
                last_fault: None,
                failure: None,
                info: None,
                clock: None,
                time_told: 0,
                eviction: Eviction::Unknown,
                generation: 0,
                db,
                info_need,
                mutation: config.mutation,
                last_run_id: None,
                run_id_changes: 0,
                replied: false,
                counters: Arc::default(),
                name,
                ever_up: false,
                down: false,
            },
            config,
            replay: Vec::new(),
            close: false,
            last_unproven: false,
        }
    }

    /// What this node's connections count; the engine reads it (and counts into it).
    pub fn counters(&self) -> &Arc<NodeCounters> {
        &self.st.counters
    }

    /// True while the node is known to be down: its last connection was lost or failed to come
    /// up, and no new one is ready yet.
    pub fn is_down(&self) -> bool {
        self.st.down
    }

    /// True once the handshake is done.
    pub fn is_ready(&self) -> bool {
        self.st.phase == Phase::Ready
    }

    /// When a node that is down may be connected again (its backoff ends); `None` unless down.
    pub fn retry_at(&self) -> Option<Instant> {
        match self.st.phase {
            Phase::Down { retry_at } => Some(retry_at),
            _ => None,
        }
    }

    /// True while a connect or handshake is under way.
    pub fn is_connecting(&self) -> bool {
        matches!(
            self.st.phase,
            Phase::Connecting { .. } | Phase::Handshaking { .. }
        )
    }

    /// Which connection this is: it changes with every connect (subscriptions do not survive
    /// it).
    /// What the node said about itself in `INFO server` on the current connection.
    pub fn info(&self) -> Option<ServerInfo> {
        self.st.info
    }

    /// The node's clock as this connection last read it (`TIME`, sent by the clock check);
    /// none on a new connection until it does.
    pub fn clock(&self) -> Option<ClockSample> {
        self.st.clock
    }

    /// The last connection failed before it proved itself (see [`crate::runtime::resolve`]).
    pub fn last_unproven(&self) -> bool {
        self.last_unproven
    }

    pub fn generation(&self) -> u64 {
        self.st.generation
    }

    /// Requests sent and not answered yet (handshake included).
    pub fn pending(&self) -> usize {
        self.st.pending.len()
    }

    /// Bytes buffered: unsent output and undecoded input.
    pub fn buffered(&self) -> (usize, usize) {
        (self.st.out.len(), self.inp.len())
    }

    /// The earliest instant at which [`Session::on_timer`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let phase = match self.st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline } => Some(deadline),
            _ => None,
        };
        let stale = self.st.pending.front().map(|p| p.sent + self.reply_limit());
        match (phase, stale) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a socket must be opened now: there is none (closed, or down with its backoff
    /// over). Fails at once while backing off.
    pub fn connect_due(&self, now: Instant) -> Result<bool, NodeFault> {
        match self.st.phase {
            Phase::Down { retry_at } if now < retry_at => Err(NodeFault::Backoff(Box::new(
                self.st.last_fault.clone().unwrap_or(NodeFault::Closed),
            ))),
            Phase::Down { .. } | Phase::Closed => Ok(true),
            _ => Ok(false),
        }
    }

    /// A socket was opened and its connect is under way: a fresh state, the handshake queued
    /// first, then the scripts to send again.
    pub fn connecting(&mut self, now: Instant) {
        self.decoder.reset();
        self.inp.clear();
        self.close = false;
        let st = &mut self.st;
        st.out.clear();
        st.held.clear();
        st.pending.clear();
        st.script_tails.clear();
        st.loaded = [false; SCRIPT_COUNT];
        st.info = None;
        // A request sent again on this connection runs later than the `TIME` read before it
        // on the last one: that reading no longer vouches for it.
        st.clock = None;
        st.eviction = Eviction::Unknown;
        st.failure = None;
        st.replied = false;
        st.generation += 1;
        st.counters.connects.bump();
        st.graced = false;
        st.hurried = false;
        st.phase = Phase::Connecting {
            deadline: now + self.config.settings.connect_timeout,
        };
        self.queue_handshake(now);
        for (p, tail) in std::mem::take(&mut self.replay) {
            let Kind::Script(index) = p.kind else {
                continue;
            };
            self.st
                .queue_script(&scripts()[index], p.tag, &tail, p.argc, now, Sending::Again);
        }
    }

    /// Opening a socket failed: the scripts waiting to be sent again get the fault, and the
    /// next attempt waits for the backoff.
    pub fn connect_failed(&mut self, fault: NodeFault, now: Instant, sink: &mut Sink<'_>) {
        for (p, _) in std::mem::take(&mut self.replay) {
            sink(Delivery {
                tag: p.tag,
                kind: p.kind,
                reply: Err(&fault),
                generation: self.st.generation,
                eviction: self.st.eviction,
                info: None,
                clock: None,
                withdrawn: false,
            });
        }
        self.fail(fault, now, sink);
    }

    /// The socket's connect finished: the handshake (or the requests) may be written.
    pub fn connected(&mut self) {
        if let Phase::Connecting { deadline } = self.st.phase {
            self.st.phase = if self.st.handshake_left > 0 {
                Phase::Handshaking { deadline }
            } else {
                self.st.came_up();
                Phase::Ready
            };
        }
    }

    /// True while the socket's connect is still under way.
    pub fn awaits_connect(&self) -> bool {
        matches!(self.st.phase, Phase::Connecting { .. })
    }

    /// Room for one more request: at `max_pending` the request is refused (`Overloaded`: the
    /// node fails for that operation) and the connection is kept.
    ///
    /// Not failed: a full connection is most often a live node with many callers (K callers of
    /// one engine keep up to ~3K requests outstanding), and failing it failed every request on
    /// it, sent their releases to the ledger and reconnected — under steady load, again and
    /// again, with no fault at all (the simulator's reconnect check shows it with 4
    /// callers and `max_pending` 8). A node that has stopped answering is reset by
    /// `reply_timeout` instead; meanwhile its requests are refused at once, which is as fast as
    /// a reconnect's failures were.
    pub fn admit(&mut self, now: Instant, sink: &mut Sink<'_>) -> Result<(), NodeFault> {
        if self.st.pending.len() >= self.config.settings.max_pending {
            if self.config.mutation.fail_when_full() {
                self.fail(NodeFault::Overloaded, now, sink);
            }
            return Err(NodeFault::Overloaded);
        }
        Ok(())
    }

    /// How long a connect (TCP, TLS and the handshake) may take.
    pub fn connect_timeout(&self) -> Duration {
        self.config.settings.connect_timeout
    }

    /// Queues an encoded command.
    pub fn request(&mut self, kind: Kind, tag: u64, encoded: &[u8], now: Instant) {
        self.st.queue_buffer().extend_from_slice(encoded);
        self.st.pending.push_back(Pending {
            kind,
            tag,
            sent: now,
            tail: 0,
            argc: 0,
            sending: Sending::First,
            eval: false,
        });
    }

    /// Queues a script call: `EVALSHA` once the script is known on this connection, `EVAL`
    /// (which loads it) before. `tail` is the encoded `numkeys key... arg...` (`argc` bulk
    /// strings), the same for every node, so it is encoded once per operation.
    pub fn script(&mut self, call: ScriptCall<'_>, now: Instant) {
        let ScriptCall {
            script,
            tag,
            tail,
            argc,
        } = call;
        self.st
            .queue_script(script, tag, tail, argc, now, Sending::First);
    }

    /// The bytes to write now: none before the socket is connected.
    pub fn output(&self) -> &[u8] {
        if matches!(self.st.phase, Phase::Handshaking { .. } | Phase::Ready) {
            &self.st.out
        } else {
            &[]
        }
    }

    /// `n` bytes of [`Session::output`] were written.
    pub fn written(&mut self, n: usize) {
        self.st.out.advance(n);
    }

    /// A readiness event starts a read (of one or more chunks): answers delivered from here on
    /// are the ones a protocol failure in it takes back.
    pub fn read_begin(&mut self) {
        self.st.answered.clear();
    }

    /// Bytes read from the socket: every complete frame is matched to its request and
    /// delivered; a partial one is kept. Garbage, an unexpected frame or a failed handshake
    /// fails the connection (answers of this read taken back first).
    pub fn on_bytes(&mut self, bytes: &[u8], now: Instant, sink: &mut Sink<'_>) {
        let Session {
            inp, decoder, st, ..
        } = self;
        if inp.is_empty() {
            // The common case: decode straight from the bytes read, keep only a partial tail.
            let used = decode_frames(decoder, bytes, st, now, sink);
            inp.extend_from_slice(&bytes[used..]);
        } else {
            inp.extend_from_slice(bytes);
            let used = decode_frames(decoder, inp, st, now, sink);
            inp.advance(used);
        }
        if let Some(fault) = self.st.failure.take() {
            // A `TIME` read in the spoiled read vouches for nothing either.
            self.st.clock = None;
            self.st.withdraw_answered(&fault, sink);
            self.fail(fault, now, sink);
        }
    }

    /// The connect (or handshake) deadline passed while nobody watched the socket — the turn
    /// that sees it began its `poll` after the deadline — and the socket made progress in that
    /// turn: the deadline moves to `now + connect_timeout`, once per connection; true if it
    /// moved. An operation returns at its quorum and leaves a slower node's connect or TLS
    /// handshake half done; with nothing polling until the next operation (a `Client`; a
    /// handle's idle engine thread), that node's answer was read only after the deadline, in a
    /// turn whose timers then failed it: a healthy node behind TLS (several round trips) or a
    /// farther network, whose idle connections the server closes (`timeout`), was found down at
    /// every operation spaced more than the connect timeout apart. A node
    /// that does not answer is still failed at its deadline: no progress, no grace; nor a second
    /// time on one connection.
    pub fn unwatched_grace(&mut self, now: Instant, watched_from: Instant) -> bool {
        let st = &mut self.st;
        match &mut st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline }
                if !st.graced && *deadline < watched_from && now >= *deadline =>
            {
                *deadline = now + self.config.settings.connect_timeout;
                st.graced = true;
                true
            }
            _ => false,
        }
    }

    /// Deadlines: connect/handshake timeout, and requests unanswered for `reply_timeout`.
    pub fn on_timer(&mut self, now: Instant, sink: &mut Sink<'_>) {
        match self.st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline } if now >= deadline => {
                self.fail(NodeFault::ConnectTimeout, now, sink);
                return;
            }
            _ => {}
        }
        if let Some(p) = self.st.pending.front()
            && now >= p.sent + self.reply_limit()
        {
            self.fail(NodeFault::Timeout, now, sink);
        }
    }

    /// How long the oldest request may go unanswered before the connection is failed:
    /// `reply_timeout`, or the connect timeout if shorter once the connection is hurried.
    fn reply_limit(&self) -> Duration {
        let settings = &self.config.settings;
        match self.st.hurried {
            false => settings.reply_timeout,
            true => settings.reply_timeout.min(settings.connect_timeout),
        }
    }

    /// A caller needs this connection's answer and it has gone silent: a round was just lost
    /// for want of this node's vote (it missed a node timeout, or was not waited for because it
    /// had), and its yes could have made the quorum. Until it answers, a request unanswered for
    /// the connect timeout fails the connection (and the next request reconnects at once), as
    /// a connect that hung would: the patience given to a new connection, given to one that
    /// stopped answering while it is needed.
    ///
    /// A half-open connection — the server's side gone without a FIN or a RST: a NAT or a load
    /// balancer that dropped an idle flow, a host that vanished — answers nothing, ever, and
    /// nothing but a timeout tells it from a slow server. `reply_timeout` (5 s) alone comes too
    /// late for a `lock` waiting its default 4 s, and for a kept lock whose renewals are tried
    /// again only while half its renewal margin is left. A server that is merely slow answers
    /// within the connect timeout and is left alone; a node frozen in a minority is never
    /// needed for a quorum, so never hurried.
    pub fn hurry(&mut self) {
        let st = &mut self.st;
        if st.phase == Phase::Ready && !st.pending.is_empty() {
            st.hurried = true;
        }
    }

    /// The session failed the connection: the socket is to be closed.
    pub fn closing(&self) -> bool {
        self.close
    }

    /// True once after the session failed the connection: the socket must be closed.
    pub fn take_close(&mut self) -> bool {
        std::mem::take(&mut self.close)
    }

    /// Scripts wait for a fresh connection: open one at once.
    pub fn wants_replay(&self) -> bool {
        !self.replay.is_empty()
    }

    /// Fails the connection: every request still waiting gets the fault, the socket is to be
    /// closed, and the next use reconnects — at once if the connection had been working, after
    /// a growing backoff if it never came up.
    ///
    /// Extend and release scripts are idempotent (compare-and-pexpire, compare-and-delete), so
    /// when a working connection drops under them (the server closed it: idle `timeout`, a
    /// proxy, `CLIENT KILL`) they are kept to be sent once more on a fresh connection
    /// ([`Session::wants_replay`]); their operation's own node deadline still bounds the wait.
    /// A `SET NX` is not replayed: a second `SET` would find our own key and answer "held".
    pub fn fail(&mut self, fault: NodeFault, now: Instant, sink: &mut Sink<'_>) {
        self.close = true;
        let st = &mut self.st;
        // Taken, not read: a connect that fails before a new connection answers anything must
        // back off, whatever the previous connection did.
        let proven = std::mem::take(&mut st.replied);
        self.last_unproven = !proven;
        let replay = proven && matches!(fault, NodeFault::Closed | NodeFault::Io(_));
        // A proven connection the server closed with nothing asked of it: its `timeout`, a
        // proxy's idle limit, `CLIENT KILL`. Routine, and mended by the next request's
        // reconnect: not a node down (no warning, not unreachable, not in `downs`).
        let idle = proven && fault == NodeFault::Closed && st.pending.is_empty();
        self.fail_pending(&fault, replay, sink);
        let st = &mut self.st;
        st.out.clear();
        st.held.clear();
        st.script_tails.clear();
        self.inp.clear();
        self.decoder.reset();
        st.count_down(idle, &fault);
        st.last_fault = Some(fault);
        if proven {
            st.backoff = self.config.settings.backoff_min;
            st.phase = Phase::Closed;
        } else {
            // No connect attempt for the current backoff, which doubles for the next failure.
            let wait = st.backoff;
            st.backoff = (st.backoff * 2).min(self.config.settings.backoff_max);
            st.phase = Phase::Down {
                retry_at: now + wait,
            };
        }
    }

    /// Every request still waiting on the failed connection gets `fault`, but the scripts that
    /// are sent again on the next one (`replay`: the connection had worked and was lost).
    fn fail_pending(&mut self, fault: &NodeFault, replay: bool, sink: &mut Sink<'_>) {
        let st = &mut self.st;
        while let Some(p) = st.pending.pop_front() {
            match p.kind {
                Kind::Handshake(_) | Kind::Time => {}
                // Rare path: the request to send again, with its script arguments.
                Kind::Script(index)
                    if replay && p.sending == Sending::First && replayable(index) =>
                {
                    self.replay.push((p, st.script_tails[..p.tail].to_vec()));
                }
                _ => sink(Delivery {
                    tag: p.tag,
                    kind: p.kind,
                    reply: Err(fault),
                    generation: st.generation,
                    eviction: st.eviction,
                    info: st.info.as_ref(),
                    clock: None,
                    withdrawn: false,
                }),
            }
            st.script_tails.advance(p.tail);
        }
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
        let loaded = self.loaded[script.index];
        let out = self.queue_buffer();
        if loaded {
            out.reserve(ARRAY_HEADER_MAX + EVALSHA_HEAD_LEN + tail.len());
            resp::encode_array_header(out, 2 + argc);
            out.extend_from_slice(&script.evalsha);
        } else {
            let (verb, head) = (Arg::Bytes(b"EVAL"), Arg::Bytes(script.body.as_bytes()));
            out.reserve(
                ARRAY_HEADER_MAX + resp::bulk_len(&verb) + resp::bulk_len(&head) + tail.len(),
            );
            resp::encode_array_header(out, 2 + argc);
            resp::encode_bulk(out, &verb);
            resp::encode_bulk(out, &head);
        }
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
            eval: !loaded,
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
                eviction: self.eviction,
                info: self.info.as_ref(),
                clock: None,
                withdrawn: true,
            });
        }
        self.answered.clear();
    }

    fn on_frame(&mut self, frame: Frame<'_>, now: Instant, sink: &mut Sink<'_>) {
        if let Frame::Aggregate(agg) = frame
            && agg.kind() == AggregateKind::Push
        {
            // RESP3 out-of-band data is not a reply to anything, except the confirmation of a
            // (un)subscription, which takes the place of its reply.
            match agg.iter().next() {
                Some(Frame::Bulk(b"message")) => sink(Delivery {
                    tag: 0,
                    kind: Kind::Notice,
                    reply: Ok(frame),
                    generation: self.generation,
                    eviction: self.eviction,
                    info: self.info.as_ref(),
                    clock: None,
                    withdrawn: false,
                }),
                Some(Frame::Bulk(b"subscribe" | b"unsubscribe"))
                    if self
                        .pending
                        .front()
                        .is_some_and(|p| p.kind == Kind::Subscribe) =>
                {
                    self.pending.pop_front();
                }
                _ => {}
            }
            return;
        }
        let Some(p) = self.pending.pop_front() else {
            self.failure = Some(NodeFault::Unexpected("with no request outstanding".into()));
            return;
        };
        if !matches!(p.kind, Kind::Handshake(_)) {
            self.replied = true;
            self.hurried = false;
        }
        match p.kind {
            Kind::Handshake(step) => self.on_handshake(step, frame, now),
            Kind::Time => self.on_time(p.sent, frame, now),
            Kind::Script(index) => {
                if let Frame::Error(e) = frame
                    && e.kind == crate::proto::resp::ErrorKind::NoScript
                    && !p.eval
                {
                    return self.on_noscript(index, p, frame, now, sink);
                }
                // Advancing (not split_to) keeps the buffer unshared: no allocation per reply.
                self.script_tails.advance(p.tail);
                if !matches!(frame, Frame::Error(_)) {
                    self.loaded[index] = true;
                }
                self.deliver(p, Ok(frame), now, sink);
            }
            _ => self.deliver(p, Ok(frame), now, sink),
        }
    }

    /// `TIME`'s answer: the node's clock sample. Anything else leaves none, and the node's
    /// vote behind it does not count (`crate::model::clock::agrees`).
    fn on_time(&mut self, sent: Instant, frame: Frame<'_>, now: Instant) {
        let mut parts = match frame {
            Frame::Aggregate(agg) if agg.len() == 2 => agg.iter(),
            _ => {
                self.clock = None;
                self.time_refused(&frame);
                return;
            }
        };
        let server_us = match (parts.next(), parts.next()) {
            (Some(Frame::Bulk(s)), Some(Frame::Bulk(us))) => clock::parse_time(s, us),
            _ => None,
        };
        self.clock = server_us.map(|server_us| ClockSample {
            sent,
            received: now,
            server_us,
        });
    }

    /// `TIME` answered otherwise than with the time (an ACL user without `+time`, a proxy
    /// without it): no vote of this node can count with the clock check; said once per
    /// connection.
    #[cold]
    #[cfg_attr(not(feature = "log"), allow(unused_variables))]
    fn time_refused(&mut self, frame: &Frame<'_>) {
        if self.time_told == self.generation {
            return;
        }
        self.time_told = self.generation;
        event!(Warn, event = "clock", node = self.name.as_str();
            "{}: TIME answered {frame:?}: the clock check cannot read this node's clock, and \
             none of its yeses counts (grant +time to the ACL user)", self.name);
    }

    /// A `NOSCRIPT` answer to `p`, a script sent by hash (`EVALSHA`). Rare: kept out of the
    /// reply path.
    #[cold]
    #[inline(never)]
    fn on_noscript(
        &mut self,
        index: usize,
        p: Pending,
        frame: Frame<'_>,
        now: Instant,
        sink: &mut Sink<'_>,
    ) {
        // Flushed behind our back (`SCRIPT FLUSH`, a proxy that switched servers): the script
        // is unknown here from now on.
        self.counters.noscript.bump();
        self.loaded[index] = false;
        if !self.pending.is_empty() && writes_a_hold(index) {
            // Sent again it would run after the requests already written behind it — among
            // them perhaps this very lock's release (a round decided lost meanwhile) — and
            // leave a hold for nobody until its TTL. It ran nothing: the
            // node fails this request.
            event!(Debug, event = "noscript", node = self.name.as_str(), script = index;
                "{}: NOSCRIPT with requests behind it: the acquire fails here", self.name);
            self.script_tails.advance(p.tail);
            self.deliver(p, Ok(frame), now, sink);
            return;
        }
        // Send the script itself, which also loads it. Its reply comes after those of the
        // requests already written behind it (FIFO), and it runs after them on the server:
        // harmless for what is sent again (a release or an extend finds only its own token; a
        // mark is a hint). (Rare: the copy may allocate.)
        event!(Debug, event = "noscript", node = self.name.as_str(), script = index;
            "{}: NOSCRIPT, script sent again with EVAL", self.name);
        let tail = self.script_tails[..p.tail].to_vec();
        self.script_tails.advance(p.tail);
        let script = &scripts()[index];
        resp::encode_array_header(&mut self.out, 2 + p.argc);
        resp::encode_bulk(&mut self.out, &Arg::Bytes(b"EVAL"));
        resp::encode_bulk(&mut self.out, &Arg::Bytes(script.body.as_bytes()));
        self.out.extend_from_slice(&tail);
        self.script_tails.extend_from_slice(&tail);
        // A new request on the wire, at the back of `pending`: its `sent` is now, which keeps
        // `pending` in the order of its reply deadlines — `next_deadline` and `on_timer` look
        // at the front only. With its first `sent` kept, its deadline hid behind the later
        // requests in front of it: not timed out when due, then at once when they were
        // answered, however recent its `EVAL`. Its operation's own node
        // deadline bounds the wait as before. The `NOSCRIPT` was a reply: its round trip is
        // counted, as the `EVAL`'s will be.
        self.counters
            .latency
            .record(now.saturating_duration_since(p.sent));
        self.pending.push_back(Pending {
            eval: true,
            sent: now,
            ..p
        });
    }

    fn deliver(
        &mut self,
        p: Pending,
        reply: Result<Frame<'_>, &NodeFault>,
        now: Instant,
        sink: &mut Sink<'_>,
    ) {
        self.counters
            .latency
            .record(now.saturating_duration_since(p.sent));
        self.answered.push((p.tag, p.kind));
        sink(Delivery {
            tag: p.tag,
            kind: p.kind,
            reply,
            generation: self.generation,
            eviction: self.eviction,
            info: self.info.as_ref(),
            clock: self.clock.as_ref(),
            withdrawn: false,
        });
    }

    /// A lost connection counted and told: an idle one closed by the server (routine), a node
    /// still down, or a node down (warned). The node is down from now on unless idle.
    #[cfg_attr(not(feature = "log"), allow(unused_variables))]
    fn count_down(&mut self, idle: bool, fault: &NodeFault) {
        if idle {
            self.counters.idle_closes.bump();
            event!(Debug, event = "idle_close", node = self.name.as_str();
                "{}: the server closed the idle connection; reconnecting at the next request",
                self.name);
        } else if self.down {
            self.counters.downs.bump();
            event!(Debug, event = "node_down", node = self.name.as_str(), fault:% = fault;
                "{}: still down ({fault})", self.name);
        } else {
            self.counters.downs.bump();
            event!(Warn, event = "node_down", node = self.name.as_str(), fault:% = fault;
                "{}: node down ({fault})", self.name);
        }
        self.down |= !idle;
    }

    /// A connection is ready: a reconnect if the node was down.
    fn came_up(&mut self) {
        if self.down {
            self.counters.reconnects.bump();
            event!(Info, event = "node_up", node = self.name.as_str(), generation = self.generation;
                "{}: node reconnected", self.name);
        } else if !self.ever_up {
            event!(Debug, event = "node_up", node = self.name.as_str(), generation = self.generation;
                "{}: connected", self.name);
        }
        self.ever_up = true;
        self.down = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::scripts::{RELEASE_SCRIPT, SHARED_ACQUIRE_SCRIPT, SHARED_RELEASE_SCRIPT};

    use crate::model::config::Config;

    /// What a session delivered, owned (frames borrow the read buffer).
    #[derive(Debug, PartialEq)]
    enum Got {
        Reply(u64, String),
        Fault(u64, String, bool),
    }

    fn config() -> ConnConfig {
        ConnConfig {
            // The defaults: connect 1 s, backoff 25 ms to 2 s, replies 5 s, `Limits::CLIENT`.
            settings: Config {
                max_pending: 4,
                ..Config::default()
            },
            info: InfoNeed::Off,
            memory: false,
            tls: std::sync::Arc::from([]),
            mutation: crate::model::mutation::Mutation::None,
        }
    }

    /// A session with a connected (simulated) socket: no I/O anywhere.
    fn connected(url: &str, now: Instant) -> Session {
        let mut s = Session::new(NodeAddr::parse(url).unwrap(), config(), now);
        assert_eq!(s.connect_due(now), Ok(true));
        s.connecting(now);
        assert!(
            s.output().is_empty(),
            "nothing is written before the connect finishes"
        );
        s.connected();
        s
    }

    fn feed(s: &mut Session, bytes: &[u8], now: Instant) -> Vec<Got> {
        let mut got = Vec::new();
        s.read_begin();
        s.on_bytes(bytes, now, &mut |d| {
            got.push(match d.reply {
                Ok(frame) => Got::Reply(d.tag, format!("{:?}", frame.to_value())),
                Err(fault) => Got::Fault(d.tag, fault.to_string(), d.withdrawn),
            })
        });
        got
    }

    fn take_output(s: &mut Session) -> String {
        let out = String::from_utf8_lossy(s.output()).into_owned();
        s.written(out.len());
        out
    }

    #[test]
    fn requests_are_held_until_the_handshake_succeeded() {
        let now = Instant::now();
        let mut s = connected("redis://:secret@127.0.0.1:1", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        assert_eq!(take_output(&mut s), "*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n");
        assert!(!s.is_ready());
        // AUTH answered: the held request goes out, and its reply is delivered by tag.
        assert_eq!(feed(&mut s, b"+OK\r\n", now), vec![]);
        assert!(s.is_ready());
        assert_eq!(take_output(&mut s), "*1\r\n$3\r\nSET\r\n");
        assert_eq!(
            feed(&mut s, b"+OK\r\n", now),
            vec![Got::Reply(7, "Simple(\"OK\")".into())]
        );
    }

    #[test]
    fn a_refused_handshake_never_lets_a_held_request_out() {
        let now = Instant::now();
        let mut s = connected("redis://:wrong@127.0.0.1:1", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let got = feed(&mut s, b"-WRONGPASS invalid password\r\n", now);
        assert!(
            matches!(&got[..], [Got::Fault(7, why, false)] if why.contains("WRONGPASS")),
            "{got:?}"
        );
        assert!(s.closing());
        assert!(s.output().is_empty());
        // Never answered anything: the next connect waits for the backoff.
        assert!(s.connect_due(now).is_err());
        assert_eq!(s.connect_due(now + Duration::from_millis(25)), Ok(true));
    }

    #[test]
    fn noscript_is_answered_with_eval_behind_the_requests_already_written() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        let tail = b"$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n";
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 1,
                tail,
                argc: 3,
            },
            now,
        );
        assert!(
            take_output(&mut s).contains("$4\r\nEVAL\r\n"),
            "not loaded yet: EVAL"
        );
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(1, "Integer(1)".into())]
        );
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 2,
                tail,
                argc: 3,
            },
            now,
        );
        s.request(Kind::Set, 3, b"*1\r\n$3\r\nSET\r\n", now);
        // Loaded: by hash, byte for byte what the general encoder makes of it.
        let mut by_hash = BytesMut::new();
        resp::encode_command(
            &mut by_hash,
            &[
                Arg::Bytes(b"EVALSHA"),
                Arg::Bytes(scripts()[0].sha()),
                Arg::Bytes(b"1"),
                Arg::Bytes(b"k"),
                Arg::Bytes(b"t"),
            ],
        );
        by_hash.extend_from_slice(b"*1\r\n$3\r\nSET\r\n");
        assert_eq!(take_output(&mut s), std::str::from_utf8(&by_hash).unwrap());
        // Flushed behind our back: the fallback EVAL goes out, the SET's reply is not taken
        // for the script's.
        let got = feed(&mut s, b"-NOSCRIPT No matching script\r\n+OK\r\n", now);
        assert_eq!(got, vec![Got::Reply(3, "Simple(\"OK\")".into())]);
        let out = take_output(&mut s);
        assert!(out.starts_with("*5\r\n$4\r\nEVAL\r\n"), "{out}");
        assert!(out.ends_with(std::str::from_utf8(tail).unwrap()), "{out}");
        assert_eq!(
            feed(&mut s, b":0\r\n", now),
            vec![Got::Reply(2, "Integer(0)".into())]
        );
        // A NOSCRIPT to the EVAL itself (no real server says that): delivered, not sent again
        // and again.
        let mut s = connected("redis://127.0.0.1:1", now);
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 4,
                tail,
                argc: 3,
            },
            now,
        );
        assert!(take_output(&mut s).contains("$4\r\nEVAL\r\n"));
        let got = feed(&mut s, b"-NOSCRIPT No matching script\r\n", now);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            matches!(&got[0], Got::Reply(4, r) if r.contains("NOSCRIPT")),
            "{got:?}"
        );
        assert_eq!(take_output(&mut s), "");
    }

    /// An acquire's script that meets NOSCRIPT with requests written behind it is not sent
    /// again (it would run after them — perhaps after this lock's own release — and leave a
    /// hold for nobody): the node fails that request. Alone on the connection, it is sent again.
    #[test]
    fn noscript_to_an_acquire_with_requests_behind_it_fails_it_there() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        let tail = b"$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n$3\r\n100\r\n";
        let call = |tag| ScriptCall {
            script: &scripts()[SHARED_ACQUIRE_SCRIPT],
            tag,
            tail,
            argc: 4,
        };
        s.script(call(1), now);
        take_output(&mut s);
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(1, "Integer(1)".into())]
        );
        // Loaded; flushed behind our back; a release follows on the same connection.
        s.script(call(2), now);
        s.script(
            ScriptCall {
                script: &scripts()[SHARED_RELEASE_SCRIPT],
                tag: 3,
                tail,
                argc: 4,
            },
            now,
        );
        take_output(&mut s);
        let got = feed(&mut s, b"-NOSCRIPT No matching script\r\n", now);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            matches!(&got[0], Got::Reply(2, r) if r.contains("NOSCRIPT")),
            "{got:?}"
        );
        assert_eq!(take_output(&mut s), "", "not sent again");
        assert_eq!(
            feed(&mut s, b":0\r\n", now),
            vec![Got::Reply(3, "Integer(0)".into())]
        );
        // The next one goes as EVAL; alone, a NOSCRIPT to an EVALSHA of it is answered again.
        s.script(call(4), now);
        assert!(take_output(&mut s).contains("$4\r\nEVAL\r\n"));
        feed(&mut s, b":1\r\n", now);
        s.script(call(5), now);
        assert!(take_output(&mut s).contains("EVALSHA"));
        assert_eq!(
            feed(&mut s, b"-NOSCRIPT No matching script\r\n", now),
            vec![]
        );
        assert!(take_output(&mut s).starts_with("*6\r\n$4\r\nEVAL\r\n"));
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(5, "Integer(1)".into())]
        );
    }

    #[test]
    fn garbage_after_an_answer_takes_the_answer_back() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        s.request(Kind::Set, 5, b"x", now);
        take_output(&mut s);
        let got = feed(&mut s, b"+OK\r\n?garbage\r\n", now);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Got::Reply(5, "Simple(\"OK\")".into()));
        assert!(matches!(got[1], Got::Fault(5, _, true)), "{got:?}");
        assert!(s.closing());
    }

    #[test]
    fn a_working_connection_that_drops_sends_scripts_again_but_not_sets() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        s.request(Kind::Set, 1, b"*1\r\n$3\r\nSET\r\n", now);
        assert_eq!(feed(&mut s, b"+OK\r\n", now).len(), 1);
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 2,
                tail: b"$1\r\n1\r\n",
                argc: 1,
            },
            now,
        );
        s.request(Kind::Set, 3, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut got = Vec::new();
        s.fail(NodeFault::Closed, now, &mut |d| got.push(d.tag));
        assert_eq!(
            got,
            vec![3],
            "the SET fails; the script waits for a new connection"
        );
        assert!(s.take_close() && s.wants_replay());
        assert_eq!(s.connect_due(now), Ok(true), "proven: reconnect at once");
        s.connecting(now);
        s.connected();
        let out = take_output(&mut s);
        assert!(out.contains("EVAL") && !out.contains("SET"), "{out}");
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(2, "Integer(1)".into())]
        );
    }

    #[test]
    fn deadlines_come_from_now_not_the_clock() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        s.request(Kind::Set, 9, b"x", now);
        assert_eq!(s.next_deadline(), Some(now + Duration::from_secs(5)));
        assert_eq!(feed(&mut s, b"", now), vec![]);
        let mut got = Vec::new();
        s.on_timer(now + Duration::from_millis(4_999), &mut |d| got.push(d.tag));
        assert!(got.is_empty() && !s.closing());
        s.on_timer(now + Duration::from_secs(5), &mut |d| got.push(d.tag));
        assert_eq!(got, vec![9], "the reply timeout fails the waiting request");
        assert!(s.closing());
    }

    /// A hurried connection (a lost round needed its silent node's vote) is failed once its
    /// oldest request has gone unanswered for the connect timeout (1 s), not the reply timeout
    /// (5 s); an answer makes it patient again, and a connection with nothing outstanding is
    /// not hurried at all.
    #[test]
    fn a_hurried_connection_fails_after_the_connect_timeout_until_it_answers() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = connected("redis://127.0.0.1:1", t0);
        s.hurry();
        s.request(Kind::Set, 1, b"x", t0);
        assert_eq!(
            s.next_deadline(),
            Some(t0 + ms(5_000)),
            "hurried with nothing pending"
        );
        s.hurry();
        assert_eq!(s.next_deadline(), Some(t0 + ms(1_000)));
        s.request(Kind::Set, 2, b"x", t0 + ms(100));
        take_output(&mut s);
        // The node answers the first: patient again, the second's deadline its reply timeout.
        assert_eq!(
            feed(&mut s, b"+OK\r\n", t0 + ms(900)),
            vec![Got::Reply(1, "Simple(\"OK\")".into())]
        );
        assert_eq!(s.next_deadline(), Some(t0 + ms(5_100)));
        let mut got = Vec::new();
        s.on_timer(t0 + ms(1_100), &mut |d| got.push(d.tag));
        assert!(got.is_empty() && !s.closing());
        // Hurried again: failed a connect timeout after the second was sent.
        s.hurry();
        s.on_timer(t0 + ms(1_099), &mut |d| got.push(d.tag));
        assert!(got.is_empty() && !s.closing());
        s.on_timer(t0 + ms(1_100), &mut |d| got.push(d.tag));
        assert_eq!(
            got,
            vec![2],
            "the hurried connection fails its waiting request"
        );
        assert!(s.closing());
    }

    /// A script sent again with `EVAL` after a `NOSCRIPT` goes to the back of `pending`, behind
    /// requests sent after it: its reply deadline counts from the `EVAL`, like theirs, so the
    /// front entry still has the earliest deadline.
    #[test]
    fn a_script_sent_again_after_noscript_has_the_deadline_of_its_eval() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut s = connected("redis://127.0.0.1:1", t0);
        let tail = b"$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n";
        let call = |tag| ScriptCall {
            script: &scripts()[RELEASE_SCRIPT],
            tag,
            tail,
            argc: 3,
        };
        // Loaded by a first call; A goes by hash at t0.
        s.script(call(1), t0);
        take_output(&mut s);
        feed(&mut s, b":1\r\n", t0);
        s.script(call(2), t0);
        assert!(take_output(&mut s).contains("EVALSHA"));
        // B at t0 + 4 s; A's NOSCRIPT comes then, and its EVAL goes out behind B.
        let t4 = t0 + secs(4);
        s.request(Kind::Set, 3, b"*1\r\n$3\r\nSET\r\n", t4);
        take_output(&mut s);
        assert_eq!(
            feed(&mut s, b"-NOSCRIPT No matching script\r\n", t4),
            vec![]
        );
        assert!(take_output(&mut s).starts_with("*5\r\n$4\r\nEVAL\r\n"));
        let due = t4 + secs(5);
        assert_eq!(s.next_deadline(), Some(due));
        // B answered at t0 + 8 s: A's EVAL, 4 s old, is not timed out yet, and its deadline is
        // the one the session announces.
        let t8 = t0 + secs(8);
        assert_eq!(
            feed(&mut s, b"+OK\r\n", t8),
            vec![Got::Reply(3, "Simple(\"OK\")".into())]
        );
        let mut got = Vec::new();
        s.on_timer(t8, &mut |d| got.push((d.tag, d.reply.err().cloned())));
        assert!(got.is_empty() && !s.closing(), "{got:?}");
        assert_eq!(s.next_deadline(), Some(due));
        // At its deadline it fails: never left without one.
        s.on_timer(due, &mut |d| got.push((d.tag, d.reply.err().cloned())));
        assert_eq!(got, vec![(2, Some(NodeFault::Timeout))]);
        assert!(s.closing());
    }

    #[test]
    fn max_pending_refuses_requests_and_keeps_the_connection() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        for tag in 1..=4 {
            assert!(s.admit(now, &mut |_| {}).is_ok());
            s.request(Kind::Set, tag, b"x", now);
        }
        let mut got = Vec::new();
        assert_eq!(
            s.admit(now, &mut |d| got.push(d.tag)),
            Err(NodeFault::Overloaded)
        );
        // Nothing outstanding failed, and the connection stays up.
        assert!(got.is_empty());
        assert!(!s.closing());
        assert_eq!(s.pending(), 4);
    }

    #[test]
    fn a_refused_info_fails_the_handshake_only_when_needed() {
        let now = Instant::now();
        let info = "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n";
        let set = "*1\r\n$3\r\nSET\r\n";
        let refused = b"-NOPERM no permissions to run 'info'\r\n";
        for need in [InfoNeed::Wanted, InfoNeed::Needed] {
            let config = ConnConfig {
                info: need,
                memory: false,
                ..config()
            };
            let mut s = Session::new(NodeAddr::parse("redis://127.0.0.1:1").unwrap(), config, now);
            assert_eq!(s.connect_due(now), Ok(true));
            s.connecting(now);
            s.connected();
            s.request(Kind::Set, 7, set.as_bytes(), now);
            match need {
                // Only wanted (the duplicate check): the request follows in the same write, and
                // a refusal leaves the node's run_id unknown.
                InfoNeed::Wanted => {
                    assert_eq!(take_output(&mut s), format!("{info}{set}"));
                    let mut answers = refused.to_vec();
                    answers.extend_from_slice(b"+OK\r\n");
                    let got = feed(&mut s, &answers, now);
                    assert_eq!(got, vec![Got::Reply(7, "Simple(\"OK\")".into())]);
                    assert!(s.is_ready() && s.info().is_none() && !s.closing());
                }
                // Needed (quarantine, fencing): the request waits for it, and never goes out
                // after a refusal.
                _ => {
                    assert_eq!(take_output(&mut s), info);
                    let got = feed(&mut s, refused, now);
                    assert!(
                        matches!(&got[..], [Got::Fault(7, why, false)] if why.contains("+info")),
                        "{got:?}"
                    );
                    assert!(s.closing() && s.output().is_empty());
                }
            }
        }
    }

    /// `INFO memory` follows `INFO server` in the handshake when evicting servers are refused:
    /// each reply carries what it said about the connection's node, from its first on; a
    /// refusal of it fails the handshake only when `INFO` is needed, and else leaves it unknown.
    #[test]
    fn the_handshake_reads_the_eviction_policy() {
        let now = Instant::now();
        let asked = "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n";
        let set = "*1\r\n$3\r\nSET\r\n";
        let server = format!("run_id:{}\r\nuptime_in_seconds:100\r\n", "r".repeat(40));
        let server = format!("${}\r\n{server}\r\n", server.len());
        let memory = "maxmemory:4194304\r\nmaxmemory_policy:allkeys-lru\r\n";
        let memory = format!("${}\r\n{memory}\r\n", memory.len());
        let refused = "-NOPERM no permissions to run 'info'\r\n";
        for need in [InfoNeed::Wanted, InfoNeed::Needed] {
            for memory_answer in [memory.as_str(), refused] {
                let config = ConnConfig {
                    info: need,
                    memory: true,
                    ..config()
                };
                let addr = NodeAddr::parse("redis://127.0.0.1:1").unwrap();
                let mut s = Session::new(addr, config, now);
                s.connecting(now);
                s.connected();
                s.request(Kind::Set, 7, set.as_bytes(), now);
                let wanted = need == InfoNeed::Wanted;
                let sent = take_output(&mut s);
                assert_eq!(
                    sent,
                    if wanted {
                        format!("{asked}{set}")
                    } else {
                        asked.into()
                    }
                );
                let mut got = Vec::new();
                let mut sink = |d: Delivery<'_>| got.push((d.tag, d.reply.is_ok(), d.eviction));
                s.read_begin();
                s.on_bytes(
                    format!("{server}{memory_answer}").as_bytes(),
                    now,
                    &mut sink,
                );
                if !wanted && memory_answer == refused {
                    // Needed, and refused: the request never goes out.
                    assert_eq!(got, vec![(7, false, Eviction::Unknown)]);
                    assert!(s.closing());
                    continue;
                }
                if !wanted {
                    assert_eq!(take_output(&mut s), set);
                }
                s.on_bytes(b"+OK\r\n", now, &mut sink);
                let eviction = match memory_answer == refused {
                    true => Eviction::Unknown,
                    false => Eviction::May(crate::EvictionPolicy::AllkeysLru),
                };
                assert_eq!(got, vec![(7, true, eviction)], "{need:?}");
            }
        }
    }

    #[test]
    fn a_hello_refused_by_an_old_server_is_no_credentials_refused() {
        let now = Instant::now();
        for refusal in [
            &b"-ERR unknown command 'HELLO', with args beginning with: '3' \r\n"[..],
            b"-NOPROTO unsupported protocol version\r\n",
        ] {
            let mut s = connected("redis://127.0.0.1:1?protocol=3", now);
            s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
            assert_eq!(take_output(&mut s), "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n");
            let mut faults = Vec::new();
            s.read_begin();
            s.on_bytes(refusal, now, &mut |d| faults.push(d.reply.err().cloned()));
            let [Some(fault)] = &faults[..] else {
                panic!("{faults:?}");
            };
            assert!(!matches!(fault, NodeFault::Auth(_)), "{fault:?}");
            assert!(fault.is_permanent(), "{fault:?}");
            let text = fault.to_string();
            assert!(text.contains("HELLO 3") && text.contains("RESP3"), "{text}");
            assert!(s.closing() && s.output().is_empty());
        }
        // Credentials refused in HELLO are still credentials refused.
        for refusal in [
            &b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"[..],
            b"-NOAUTH HELLO must be called with the client already authenticated\r\n",
        ] {
            let mut s = connected("redis://:secret@127.0.0.1:1?protocol=3", now);
            s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
            take_output(&mut s);
            let mut faults = Vec::new();
            s.read_begin();
            s.on_bytes(refusal, now, &mut |d| faults.push(d.reply.err().cloned()));
            assert!(
                matches!(&faults[..], [Some(NodeFault::Auth(_))]),
                "{faults:?}"
            );
        }
    }

    /// `HELLO 3` answered with a RESP2 array (a proxy that does not speak RESP3): the connection
    /// is not taken for a RESP3 one (the engine would subscribe on it); the handshake fails as
    /// for a refused `HELLO`. A map is the answer that passes.
    #[test]
    fn a_hello_3_answered_in_resp2_fails_the_handshake() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1?protocol=3", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut faults = Vec::new();
        s.read_begin();
        s.on_bytes(
            b"*4\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:2\r\n",
            now,
            &mut |d| faults.push(d.reply.err().cloned()),
        );
        let [Some(fault @ NodeFault::Unexpected(_))] = &faults[..] else {
            panic!("{faults:?}");
        };
        let text = fault.to_string();
        assert!(text.contains("HELLO 3") && text.contains("RESP3"), "{text}");
        assert!(!s.is_ready() && s.closing() && s.output().is_empty());

        let mut s = connected("redis://127.0.0.1:1?protocol=3", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        assert_eq!(feed(&mut s, b"%1\r\n$5\r\nproto\r\n:3\r\n", now), vec![]);
        assert!(s.is_ready());
        assert_eq!(take_output(&mut s), "*1\r\n$3\r\nSET\r\n");
    }

    /// A megabyte of RESP3 nulls nested in arrays (within `Limits::CLIENT`: 4096 arrays of 80)
    /// in answer to `AUTH`: the fault says what came in a line, from a bounded prefix of it.
    #[test]
    fn a_huge_unexpected_handshake_reply_is_described_in_a_line() {
        let now = Instant::now();
        let mut s = connected("redis://:secret@127.0.0.1:1", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut reply = b"*4096\r\n".to_vec();
        for _ in 0..4096 {
            reply.extend_from_slice(b"*80\r\n");
            reply.extend_from_slice(&b"_\r\n".repeat(80));
        }
        assert!(reply.len() <= resp::Limits::CLIENT.max_frame_len);
        let mut faults = Vec::new();
        s.read_begin();
        s.on_bytes(&reply, now, &mut |d| faults.push(d.reply.err().cloned()));
        let [Some(fault @ NodeFault::Unexpected(_))] = &faults[..] else {
            panic!("{faults:?}");
        };
        let text = fault.to_string();
        assert!(text.len() < 400, "{} bytes: {text}", text.len());
        assert!(
            text.starts_with("unexpected reply Aggregate(Array[Aggregate(Array[Null, Null")
                && text.ends_with("… (longer) in answer to AUTH"),
            "{text}"
        );
        assert!(s.closing());
    }

    #[test]
    fn a_refused_select_names_the_database() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1/99", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut faults = Vec::new();
        s.read_begin();
        s.on_bytes(b"-ERR DB index is out of range\r\n", now, &mut |d| {
            faults.push(d.reply.err().cloned())
        });
        assert_eq!(
            faults,
            vec![Some(NodeFault::Database {
                db: 99,
                message: "ERR DB index is out of range".into()
            })]
        );
    }

    /// A connect deadline passed while nothing polled (the turn's `poll` began after it) moves
    /// once per connection; one passed while a poll watched stands.
    #[test]
    fn a_connect_deadline_that_passed_unwatched_moves_once() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Session::new(NodeAddr::parse("redis://h:1").unwrap(), config(), now);
        s.connecting(now);
        let deadline = s.next_deadline().unwrap();
        assert_eq!(deadline, now + ms(1_000));
        // Watched at the deadline (the turn's poll began before it): no grace.
        assert!(!s.unwatched_grace(deadline + ms(1), deadline - ms(1)));
        // Unwatched (the poll began after it): the deadline moves, once.
        let late = deadline + ms(500);
        assert!(s.unwatched_grace(late, late));
        assert_eq!(s.next_deadline(), Some(late + ms(1_000)));
        let later = late + ms(2_000);
        assert!(!s.unwatched_grace(later, later));
        // A new connection may have its own.
        s.connecting(later);
        let deadline = s.next_deadline().unwrap();
        assert!(s.unwatched_grace(deadline + ms(1), deadline + ms(1)));
    }
}
