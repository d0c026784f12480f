//! The client side of the simulated network: a [`Net`] whose links are in-memory pipes to the
//! world. It holds one real [`Session`] per node and does for it what `runtime/conn.rs` does for a
//! socket — open, write the session's output, feed it what arrives, close when it says so —
//! except that nothing waits: the world moves time between calls and hands in what arrived.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::time::Instant;

use crate::engine::net::{Net, NodeSink};
use crate::model::addr::NodeAddr;
use crate::model::config::ConnConfig;
use crate::model::error::NodeFault;
use crate::proto::scripts::ScriptCall;
use crate::proto::session::{Kind, Session, Sink};

/// A connection id is the client's index above these bits and the client's count of its
/// connections (from 1) in them.
pub(crate) const CONN_ID_BITS: u32 = 40;

/// What the client asks of the world (drained by the world after each call into the engine).
#[derive(Debug)]
pub(crate) enum Action {
    Connect {
        node: usize,
        conn: u64,
    },
    Send {
        node: usize,
        conn: u64,
        bytes: Vec<u8>,
    },
    Close {
        node: usize,
        conn: u64,
    },
}

/// What the world hands a link.
#[derive(Debug)]
pub(crate) enum Inbound {
    Connected,
    Refused,
    Data(Vec<u8>),
    /// The peer closed or reset the connection.
    Closed,
}

/// A node's session, and its next deadline kept until the session changes: asked of every
/// node at every turn and every wake, it changes in few of them. (Changes go through
/// [`Watched::get_mut`], which forgets it.)
struct Watched {
    session: Session,
    deadline: Cell<Option<Option<Instant>>>,
}

impl Watched {
    fn new(session: Session) -> Watched {
        Watched {
            session,
            deadline: Cell::new(None),
        }
    }

    fn get(&self) -> &Session {
        &self.session
    }

    fn get_mut(&mut self) -> &mut Session {
        *self.deadline.get_mut() = None;
        &mut self.session
    }

    /// [`Session::next_deadline`].
    fn next_deadline(&self) -> Option<Instant> {
        if let Some(deadline) = self.deadline.get() {
            return deadline;
        }
        let deadline = self.session.next_deadline();
        self.deadline.set(Some(deadline));
        deadline
    }
}

struct Link {
    session: Watched,
    /// The world's id of the connection, while one is open or opening.
    conn: Option<u64>,
    inbox: VecDeque<(u64, Inbound)>,
}

/// One simulated client process's network and clock.
pub(crate) struct SimNet {
    links: Vec<Link>,
    /// This process's clock: set by the world before every call.
    pub now: Instant,
    pub actions: Vec<Action>,
    next_conn: u64,
    /// High bits of this client's connection ids (ids are unique in the world).
    id_base: u64,
    writes: u64,
    /// Buffers of messages read, for the next writes: a message each way per request, and
    /// each a `malloc` and a `free` otherwise.
    spare: Vec<Vec<u8>>,
}

/// Message buffers kept for reuse, at most (by a client, and by the world): more than are
/// free at once in the usual runs; the rest are freed.
pub(crate) const SPARE_BUFFERS: usize = 32;

/// Keeps `buf` in `spare` for another message, unless enough are kept.
pub(crate) fn recycle(spare: &mut Vec<Vec<u8>>, mut buf: Vec<u8>) {
    if spare.len() < SPARE_BUFFERS {
        buf.clear();
        spare.push(buf);
    }
}

impl SimNet {
    pub fn new(client: usize, nodes: &[NodeAddr], config: &ConnConfig, now: Instant) -> SimNet {
        SimNet {
            links: nodes
                .iter()
                .map(|a| Link {
                    session: Watched::new(Session::new(a.clone(), config.clone(), now)),
                    conn: None,
                    inbox: VecDeque::new(),
                })
                .collect(),
            now,
            actions: Vec::new(),
            next_conn: 0,
            id_base: (client as u64) << CONN_ID_BITS,
            writes: 0,
            spare: Vec::new(),
        }
    }

    /// The world delivers `what` on connection `conn` of node `node`'s link.
    pub fn deliver(&mut self, node: usize, conn: u64, what: Inbound) {
        self.links[node].inbox.push_back((conn, what));
    }

    fn open(&mut self, node: usize, now: Instant) {
        self.next_conn += 1;
        let conn = self.id_base | self.next_conn;
        let link = &mut self.links[node];
        link.conn = Some(conn);
        link.session.get_mut().connecting(now);
        self.actions.push(Action::Connect { node, conn });
    }

    /// What `Conn::sync` does: close when the session failed the connection, reopen for a
    /// replay.
    fn sync(&mut self, node: usize, now: Instant) {
        let link = &mut self.links[node];
        if link.session.get_mut().take_close()
            && let Some(conn) = link.conn.take()
        {
            self.actions.push(Action::Close { node, conn });
        }
        if self.links[node].session.get().wants_replay() {
            self.open(node, now);
        }
    }

    fn fail(&mut self, node: usize, fault: NodeFault, now: Instant, sink: &mut Sink<'_>) {
        self.links[node].session.get_mut().fail(fault, now, sink);
        self.sync(node, now);
    }

    /// Writes what node `node`'s session has to send, if anything. (Every turn asks of every
    /// node, most often with nothing to send: that test is inlined, the write is not.)
    #[inline]
    fn flush_node(&mut self, node: usize) {
        let link = &self.links[node];
        let Some(conn) = link.conn else { return };
        if link.session.get().awaits_connect() || link.session.get().output().is_empty() {
            return;
        }
        self.write(node, conn);
    }

    /// Hands node `node`'s output to the world, on connection `conn`.
    #[inline(never)]
    fn write(&mut self, node: usize, conn: u64) {
        let link = &mut self.links[node];
        let session = link.session.get_mut();
        let out = session.output();
        let mut bytes = self.spare.pop().unwrap_or_default();
        bytes.extend_from_slice(out);
        session.written(bytes.len());
        self.writes += 1;
        self.actions.push(Action::Send { node, conn, bytes });
    }

    fn admit(&mut self, node: usize, now: Instant, sink: &mut Sink<'_>) -> Result<(), NodeFault> {
        self.connect_node(node, now)?;
        let admitted = self.links[node].session.get_mut().admit(now, sink);
        self.sync(node, now);
        admitted
    }

    fn connect_node(&mut self, node: usize, now: Instant) -> Result<(), NodeFault> {
        if self.links[node].session.get().connect_due(now)? {
            self.open(node, now);
        }
        Ok(())
    }
}

impl Net for SimNet {
    fn now(&self) -> Instant {
        self.now
    }

    fn session(&self, node: usize) -> &Session {
        self.links[node].session.get()
    }

    fn session_mut(&mut self, node: usize) -> &mut Session {
        self.links[node].session.get_mut()
    }

    fn nodes(&self) -> usize {
        self.links.len()
    }

    fn writes(&self) -> u64 {
        self.writes
    }

    fn next_deadline(&self) -> Option<Instant> {
        (self.links.iter())
            .filter_map(|link| link.session.next_deadline())
            .min()
    }

    fn request(
        &mut self,
        node: usize,
        kind: Kind,
        tag: u64,
        encoded: &[u8],
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault> {
        self.admit(node, now, &mut |d| sink(node, now, d))?;
        self.links[node]
            .session
            .get_mut()
            .request(kind, tag, encoded, now);
        Ok(())
    }

    fn script(
        &mut self,
        node: usize,
        call: ScriptCall<'_>,
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault> {
        self.admit(node, now, &mut |d| sink(node, now, d))?;
        self.links[node].session.get_mut().script(call, now);
        Ok(())
    }

    fn ensure_connected(
        &mut self,
        node: usize,
        now: Instant,
        _sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault> {
        self.connect_node(node, now)
    }

    fn flush(&mut self, _now: Instant, _sink: &mut NodeSink<'_>) {
        for node in 0..self.links.len() {
            self.flush_node(node);
        }
    }

    fn turn(&mut self, _until: Instant, sink: &mut NodeSink<'_>) {
        let now = self.now;
        for node in 0..self.links.len() {
            let sink: &mut Sink<'_> = &mut |d| sink(node, now, d);
            while let Some((conn, what)) = self.links[node].inbox.pop_front() {
                if self.links[node].conn != Some(conn) {
                    continue; // a connection this side already closed
                }
                match what {
                    Inbound::Connected => {
                        if self.links[node].session.get().awaits_connect() {
                            self.links[node].session.get_mut().connected();
                            self.flush_node(node);
                        }
                    }
                    Inbound::Refused => {
                        let fault = NodeFault::Io(io::ErrorKind::ConnectionRefused);
                        self.fail(node, fault, now, sink);
                    }
                    Inbound::Closed => self.fail(node, NodeFault::Closed, now, sink),
                    Inbound::Data(bytes) => {
                        let session = self.links[node].session.get_mut();
                        session.read_begin();
                        session.on_bytes(&bytes, now, sink);
                        if session.closing() {
                            self.sync(node, now);
                        } else if !session.output().is_empty() {
                            // A NOSCRIPT reply queued its EVAL fallback.
                            self.flush_node(node);
                        }
                        recycle(&mut self.spare, bytes);
                    }
                }
            }
            let link = &mut self.links[node];
            if link.session.next_deadline().is_some_and(|d| d <= now) {
                link.session.get_mut().on_timer(now, sink);
                self.sync(node, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::mailbox::Slot;
    use crate::engine::request::{OpId, Outcome, ReqKind};
    use crate::engine::{Engine, Waiter};
    use crate::model::config::Builder;
    use crate::model::token::Token;
    use crate::sim::clock::MS;
    use crate::sim::node::Node;
    use crate::sim::node_io::parse_command;
    use crate::sim::setup::{NODES, TTL};

    /// An engine over a simulated network to `NODES` fresh simulated nodes (default config).
    fn engine_and_nodes(now: Instant) -> (Engine<SimNet>, Vec<Node>) {
        let shared = Builder::new((0..NODES).map(|i| format!("redis://127.0.0.1:{}", 7000 + i)))
            .shared()
            .unwrap();
        let net = SimNet::new(0, &shared.nodes, &shared.conn, now);
        let engine = Engine::new(shared, net, now);
        // Distinct servers: one run_id each (entries with the same run_id count once).
        let nodes = (0..NODES)
            .map(|i| Node::new([b'a' + i as u8; 40], 0))
            .collect();
        (engine, nodes)
    }

    /// Runs what the client wrote on `nodes` and hands the replies back: the count of writes
    /// and of commands per node in this exchange.
    fn exchange(engine: &mut Engine<SimNet>, nodes: &mut [Node], now: Instant) -> Vec<(u32, u32)> {
        let mut counts = vec![(0, 0); nodes.len()];
        let mut args = Vec::new();
        for action in std::mem::take(&mut engine.net.actions) {
            match action {
                Action::Connect { node, conn } => {
                    engine.net.deliver(node, conn, Inbound::Connected);
                }
                Action::Send { node, conn, bytes } => {
                    counts[node].0 += 1;
                    let mut reply = Vec::new();
                    let mut at = 0;
                    while let Some(n) = parse_command(&bytes[at..], &mut args) {
                        let cmd: Vec<&[u8]> =
                            args.iter().map(|&(a, b)| &bytes[at + a..at + b]).collect();
                        // Up for an hour: not quarantined.
                        nodes[node].execute(&cmd, 3_600_000 * MS, &mut reply);
                        counts[node].1 += 1;
                        at += n;
                    }
                    engine.net.deliver(node, conn, Inbound::Data(reply));
                }
                Action::Close { .. } => {}
            }
        }
        engine.take_input(now);
        engine.step(now);
        counts
    }

    /// Two acquires lost in the same turn, every reply in: each is released with its own
    /// token. (Were the release of the first to take the freed slot of the second, it would
    /// overwrite its resource and token: the second's keys would be left to their TTL,
    /// blocking everyone.)
    #[test]
    fn acquires_lost_in_the_same_turn_are_each_released() {
        let now = Instant::now();
        let (mut engine, mut nodes) = engine_and_nodes(now);
        let up = 3_600_000 * MS;
        let mut out = Vec::new();
        // Held elsewhere on a majority: our acquires win only nodes 3 and 4, and lose.
        for node in &mut nodes[..3] {
            for key in ["x", "y", "z"] {
                node.execute(
                    &[b"SET", key.as_bytes(), b"other", b"NX", b"PX", b"60000"],
                    up,
                    &mut out,
                );
            }
        }
        // Waited for as callers of a shared handle wait: the slab slot is freed as soon as the
        // outcome is handed over.
        let slots: Vec<Arc<Slot>> = ["x", "y", "z"]
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let token = Token::from_bytes(format!("t{i}").as_bytes()).unwrap();
                let kind = ReqKind::Acquire { ttl: TTL };
                let slot = Arc::new(Slot::for_tasks());
                engine.submit(
                    kind,
                    key.as_bytes(),
                    &token,
                    Waiter::Slot(slot.clone()),
                    now,
                );
                slot
            })
            .collect();
        engine.step(now);
        exchange(&mut engine, &mut nodes, now); // connect
        exchange(&mut engine, &mut nodes, now); // handshake
        exchange(&mut engine, &mut nodes, now); // the SETs: all lost, all replies in
        for slot in slots {
            let outcome = slot.cell().outcome.take();
            assert!(
                matches!(outcome, Some(Outcome::Acquired(Err(_)))),
                "{outcome:?}"
            );
        }
        // The releases: after them, nodes 3 and 4 hold none of the keys.
        assert_eq!(exchange(&mut engine, &mut nodes, now), vec![(1, 3); NODES]);
        for node in &mut nodes[3..] {
            for key in ["x", "y", "z"] {
                out.clear();
                node.execute(
                    &[b"SET", key.as_bytes(), b"next", b"NX", b"PX", b"60000"],
                    up,
                    &mut out,
                );
                assert_eq!(out, b"+OK\r\n", "{key} was left behind");
            }
        }
    }

    #[test]
    fn sixty_four_queued_operations_go_out_in_one_write_per_node() {
        let now = Instant::now();
        let (mut engine, mut nodes) = engine_and_nodes(now);
        let token = Token::from_bytes(b"t").unwrap();
        let ids: Vec<OpId> = (0..64)
            .map(|i| {
                let kind = ReqKind::Acquire { ttl: TTL };
                let resource = format!("r{i}");
                engine.submit(kind, resource.as_bytes(), &token, Waiter::Local, now)
            })
            .collect();
        engine.step(now);
        // Connects; then the handshake (`INFO server` for the quarantine, `INFO memory` for the
        // eviction check) in one write per node, the 64 SETs held back until it succeeded; then
        // all 64 in one write per node.
        assert_eq!(exchange(&mut engine, &mut nodes, now), vec![(0, 0); NODES]);
        assert_eq!(exchange(&mut engine, &mut nodes, now), vec![(1, 2); NODES]);
        assert_eq!(exchange(&mut engine, &mut nodes, now), vec![(1, 64); NODES]);
        assert!(ids.iter().all(|&id| engine.is_done(id)));
        for id in ids {
            assert!(matches!(engine.take(id), Some(Outcome::Acquired(Ok(_)))));
        }
        // The next 64 (releases) go out in one write per node too.
        for i in 0..64 {
            let resource = format!("r{i}");
            engine.submit(
                ReqKind::Release,
                resource.as_bytes(),
                &token,
                Waiter::Local,
                now,
            );
        }
        engine.step(now);
        assert_eq!(exchange(&mut engine, &mut nodes, now), vec![(1, 64); NODES]);
    }
}
