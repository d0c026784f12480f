//! The `mio` poll loop: one `Poll` for all N connections, `Token(i)` for node i. It moves bytes
//! between the connections and whoever drives an operation, one [`Driver::turn`] at a time, so
//! the caller returns as soon as its own condition is met (e.g. "quorum decided") without waiting
//! for stragglers, whose replies are consumed by a later turn.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use mio::{Events, Poll, Token};

use crate::engine::net::{Net, NodeSink};
use crate::model::addr::NodeAddr;
use crate::model::config::ConnConfig;
use crate::model::error::NodeFault;
use crate::model::stats::IoCounters;
use crate::proto::scripts::ScriptCall;
use crate::proto::session::{Kind, Session};
use crate::runtime::conn::Conn;

/// The token of the [`Driver::waker`]: beyond any node index.
const WAKER: Token = Token(usize::MAX - 1);

pub(crate) struct Driver {
    poll: Poll,
    events: Events,
    pub conns: Vec<Conn>,
    /// Syscall counters of the loop and every connection (shared with them, and with the
    /// handles that read them).
    io: Arc<IoCounters>,
}

impl Driver {
    pub fn new(nodes: &[NodeAddr], config: &ConnConfig) -> io::Result<Driver> {
        let now = Instant::now();
        let io = Arc::new(IoCounters::default());
        Ok(Driver {
            poll: Poll::new()?,
            events: Events::with_capacity(nodes.len().max(1) * 2),
            conns: nodes
                .iter()
                .enumerate()
                .map(|(i, addr)| Conn::new(addr.clone(), Token(i), config.clone(), io.clone(), now))
                .collect(),
            io,
        })
    }

    /// A waker that makes the current or next `poll` return (its events are ignored).
    pub fn waker(&self) -> io::Result<mio::Waker> {
        mio::Waker::new(self.poll.registry(), WAKER)
    }

    /// The syscall counters of the loop and all connections: readable without the loop.
    pub fn io(&self) -> &Arc<IoCounters> {
        &self.io
    }
}

impl Net for Driver {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn session(&self, node: usize) -> &Session {
        &self.conns[node].session
    }

    fn session_mut(&mut self, node: usize) -> &mut Session {
        &mut self.conns[node].session
    }

    fn nodes(&self) -> usize {
        self.conns.len()
    }

    fn writes(&self) -> u64 {
        self.io.writes.get()
    }

    /// Queues an encoded command for node `node` (connecting first if needed).
    fn request(
        &mut self,
        node: usize,
        kind: Kind,
        tag: u64,
        encoded: &[u8],
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault> {
        let registry = self.poll.registry();
        self.conns[node].request(kind, tag, encoded, now, registry, &mut |d| {
            sink(node, now, d)
        })
    }

    /// Queues a script call for node `node`; `tail` holds its `argc` encoded arguments.
    fn script(
        &mut self,
        node: usize,
        call: ScriptCall<'_>,
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault> {
        let registry = self.poll.registry();
        self.conns[node].script(call, now, registry, &mut |d| sink(node, now, d))
    }

    /// Starts a connection to node `node` if it has none and is not backing off.
    fn ensure_connected(
        &mut self,
        node: usize,
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault> {
        let registry = self.poll.registry();
        self.conns[node].ensure_connected(now, registry, &mut |d| sink(node, now, d))
    }

    /// Writes what every connection has queued: all requests of a round go out before any reply
    /// is read.
    fn flush(&mut self, now: Instant, sink: &mut NodeSink<'_>) {
        let registry = self.poll.registry();
        for (i, conn) in self.conns.iter_mut().enumerate() {
            conn.flush(now, registry, &mut |d| sink(i, now, d));
        }
    }

    /// Waits for readiness until `until` at the latest (one `poll` call), then handles every
    /// event and every connection deadline that has passed.
    fn turn(&mut self, until: Instant, sink: &mut NodeSink<'_>) {
        let Driver {
            poll,
            events,
            conns,
            io,
        } = self;
        let now = Instant::now();
        let wake = conns
            .iter()
            .filter_map(Conn::next_deadline)
            .fold(until, Instant::min);
        io.polls.bump();
        if let Err(e) = poll.poll(events, Some(wake.saturating_duration_since(now))) {
            // EINTR: return and let the caller re-check its deadline. Anything else cannot be
            // fixed here; the caller's deadline still bounds the wait.
            if e.kind() != io::ErrorKind::Interrupted {
                events.clear();
            }
            return;
        }
        let began = now;
        let now = Instant::now();
        let registry = poll.registry();
        // The connections that had an event in this turn (at most 64 nodes: a bit each).
        let mut ready = 0u64;
        for event in events.iter() {
            let i = event.token().0;
            if let Some(conn) = conns.get_mut(i) {
                ready |= 1u64 << (i % 64);
                let closed = event.is_read_closed() || event.is_error();
                conn.on_ready(now, registry, &mut |d| sink(i, now, d), closed);
            }
        }
        for (i, conn) in conns.iter_mut().enumerate() {
            if conn.next_deadline().is_some_and(|d| d <= now) {
                let unwatched = (ready & (1u64 << (i % 64)) != 0).then_some(began);
                conn.on_timer(now, unwatched, registry, &mut |d| sink(i, now, d));
            }
        }
    }
}
