//! The world's side of the network: a link per (client, node) with its delay, partition and
//! slowness, the connections as the world sees them, and delivery — each message after a
//! delay drawn for it, FIFO per connection as over TCP — of what clients send to nodes and
//! what nodes answer. (The clients' side, a `Net` over these links, is `client_net.rs`.)

use std::ops::Range;

use super::client_net::{Action, Inbound, recycle};
use super::clock::MS;
use super::events::{Ev, EvKind};
use super::links::{JITTER, Link, SPIKE, WConn};
use super::node::Node;
use super::node_io::parse_command;
use super::setup::NODES;
use super::world::World;

/// On a slow link (`EvKind::SlowLink`), each message's delay is this much more (see `links.rs`
/// for the others).
const SLOW_DELAY: Range<u64> = 10 * MS..300 * MS;

/// Room a node's reply buffer starts with when none is spare: most replies are a few short
/// RESP lines.
const REPLY_ROOM: usize = 64;

/// Commands of up to this many arguments are run from an array on the stack (longer ones,
/// from a vector).
const ARGS_ON_STACK: usize = 16;

impl World {
    /// The link between `client` and `node`.
    pub(super) fn link(&mut self, client: usize, node: usize) -> &mut Link {
        &mut self.links[client * NODES + node]
    }

    /// When a message sent now on (client, node) arrives, after `last` (FIFO).
    fn delivery(&mut self, client: usize, node: usize, last: u64) -> u64 {
        let g = self.g;
        let jitter = self.rng.within(JITTER);
        let spike = if self.rng.chance(1) {
            self.rng.within(SPIKE)
        } else {
            0
        };
        let link = *self.link(client, node);
        let slow = if link.slow_until > g {
            self.rng.within(SLOW_DELAY)
        } else {
            0
        };
        let t = g.max(link.blocked_until) + link.base + jitter + spike + slow;
        t.max(last + 1)
    }

    /// Sends `what` to the client's side of `conn` after a link delay, behind `last` (FIFO);
    /// returns when it arrives.
    fn send_client(
        &mut self,
        client: usize,
        node: usize,
        conn: u64,
        what: Inbound,
        last: u64,
    ) -> u64 {
        let t = self.delivery(client, node, last);
        let kind = EvKind::ToClient {
            client,
            node,
            conn,
            what,
        };
        self.at(t, kind);
        t
    }

    /// The node's side of a connection was reset: the client learns after a link delay.
    pub(super) fn reset(&mut self, conn: u64, client: usize, node: usize) {
        self.send_client(client, node, conn, Inbound::Closed, 0);
    }

    /// A node takes a message: commands run on its clock, replies go back in order.
    pub(super) fn at_node(&mut self, ev: Ev) {
        let (conn_id, bytes) = match ev.kind {
            EvKind::ToNode { conn, bytes } => (conn, Some(bytes)),
            EvKind::NodeClose { conn } => (conn, None),
            _ => unreachable!("only node-bound events"),
        };
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let node = conn.node;
        if !conn.alive || conn.incarnation != self.nodes[node].incarnation {
            return;
        }
        let Some(bytes) = bytes else {
            self.conns.remove(&conn_id);
            self.nodes[node].node.forget(conn_id);
            return;
        };
        let (client, last) = (conn.client, conn.down);
        let state = &mut self.nodes[node];
        let now = state.clock.local_ns(self.g);
        state.node.conn = conn_id;
        let mut reply = (self.spare.pop()).unwrap_or_else(|| Vec::with_capacity(REPLY_ROOM));
        let inbuf = &mut conn.inbuf;
        run_commands(
            &mut state.node,
            inbuf,
            &bytes,
            &mut self.args,
            now,
            &mut reply,
        );
        recycle(&mut self.spare, bytes);
        self.place_deferring(client, node);
        if reply.is_empty() {
            recycle(&mut self.spare, reply);
        } else {
            let t = self.send_client(client, node, conn_id, Inbound::Data(reply), last);
            if let Some(c) = self.conns.get_mut(&conn_id) {
                c.down = t;
            }
        }
        self.send_notices(node);
    }

    /// The acquires node `node` just ran for `client` with a script that steps back for a
    /// set's mark, placed by wait: with ordered sets, how long each one's wait had lasted when
    /// it was sent (`Record::deferences`). An attempt no longer in flight (a late node) cannot
    /// be placed and is left out.
    fn place_deferring(&mut self, client: usize, node: usize) {
        let values = std::mem::take(&mut self.nodes[node].node.deferring);
        if !self.shared.config.ordered_sets {
            return;
        }
        for value in values {
            let Some((w, waited)) = self.clients[client].engine.attempt_of(&value) else {
                continue;
            };
            let (caller, res) = self
                .record
                .wait_of(client, w)
                .unwrap_or((usize::MAX, usize::MAX));
            let waited = waited.as_nanos() as u64;
            self.record.deferences.push((client, caller, res, waited));
        }
    }

    /// Release notices, to every subscribed connection of this node still up (FIFO after
    /// what each was sent before).
    fn send_notices(&mut self, node: usize) {
        // (The outbox goes back empty, its room kept.)
        let mut outbox = std::mem::take(&mut self.nodes[node].node.outbox);
        for (to, msg) in outbox.drain(..) {
            let Some(c) = self.conns.get(&to) else {
                continue;
            };
            if !c.alive || c.incarnation != self.nodes[node].incarnation {
                continue;
            }
            let (client, last) = (c.client, c.down);
            let t = self.send_client(client, node, to, Inbound::Data(msg), last);
            if let Some(c) = self.conns.get_mut(&to) {
                c.down = t;
            }
        }
        self.nodes[node].node.outbox = outbox;
    }

    /// Carries one thing a client asked of the world to the node, after a link delay: a
    /// connect, bytes (behind the connect, FIFO), a close.
    fn send(&mut self, client: usize, action: Action) {
        match action {
            Action::Connect { node, conn } => {
                self.record.connects[client * NODES + node] += 1;
                self.log(|| format!("client {client} connects to node {node} (conn {conn})"));
                let t = self.delivery(client, node, 0);
                self.at(t, EvKind::ConnArrive { conn, client, node });
            }
            Action::Send { node, conn, bytes } => {
                // Before the node accepted, the bytes wait behind the connect (FIFO).
                let last = self.conns.get(&conn).map_or(0, |c| c.up);
                let t = self.delivery(client, node, last);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.up = t;
                }
                self.at(t, EvKind::ToNode { conn, bytes });
            }
            Action::Close { node, conn } => {
                self.log(|| format!("client {client} closes conn {conn} to node {node}"));
                let last = self.conns.get(&conn).map_or(0, |c| c.up);
                let t = self.delivery(client, node, last);
                self.at(t, EvKind::NodeClose { conn });
            }
        }
    }

    /// A connect reaches the node: accepted (the connection recorded, as the node's
    /// incarnation has it) or, the node down, refused.
    pub(super) fn accept(&mut self, conn: u64, client: usize, node: usize) {
        if self.nodes[node].down {
            self.send_client(client, node, conn, Inbound::Refused, 0);
        } else {
            let incarnation = self.nodes[node].incarnation;
            let t = self.send_client(client, node, conn, Inbound::Connected, 0);
            self.conns.insert(
                conn,
                WConn {
                    client,
                    node,
                    alive: true,
                    incarnation,
                    inbuf: Vec::new(),
                    up: 0,
                    down: t,
                },
            );
        }
    }

    /// A client's bytes or close reach the node's side of `conn`: taken now, or after its
    /// pause.
    pub(super) fn reach_node(&mut self, conn: u64, ev: Ev) {
        let Some(node) = self.conns.get(&conn).map(|c| c.node) else {
            return;
        };
        if self.nodes[node].paused {
            self.nodes[node].deferred.push(ev);
        } else {
            self.at_node(ev);
        }
    }

    /// What a node sent reaches the client, which runs at once.
    pub(super) fn reach_client(&mut self, client: usize, node: usize, conn: u64, what: Inbound) {
        self.clients[client].engine.net.deliver(node, conn, what);
        self.poke(client);
    }

    /// Carries what client `c` wrote in its last turn to the nodes.
    pub(super) fn send_actions(&mut self, c: usize) {
        // The list goes back empty: its room is kept for the next turn's actions.
        let mut actions = std::mem::take(&mut self.clients[c].engine.net.actions);
        for action in actions.drain(..) {
            self.send(c, action);
        }
        self.clients[c].engine.net.actions = actions;
    }
}

/// Runs the commands of a message that reached `node` at `now` (its clock), appending their
/// replies to `reply`. Commands run from the message itself unless part of one came before
/// (then from the connection's buffer `inbuf`); what is left of an incomplete one waits there.
fn run_commands(
    node: &mut Node,
    inbuf: &mut Vec<u8>,
    bytes: &[u8],
    args: &mut Vec<(usize, usize)>,
    now: u64,
    reply: &mut Vec<u8>,
) {
    let pending = !inbuf.is_empty();
    if pending {
        inbuf.extend_from_slice(bytes);
    }
    let input: &[u8] = if pending { inbuf } else { bytes };
    let mut used = 0;
    let mut cmd: [&[u8]; ARGS_ON_STACK] = [&[]; ARGS_ON_STACK];
    while let Some(n) = parse_command(&input[used..], args) {
        let argc = args.len();
        if argc <= cmd.len() {
            for (arg, &(a, b)) in cmd.iter_mut().zip(args.iter()) {
                *arg = &input[used + a..used + b];
            }
            node.execute(&cmd[..argc], now, reply);
        } else {
            let long: Vec<&[u8]> = (args.iter())
                .map(|&(a, b)| &input[used + a..used + b])
                .collect();
            node.execute(&long, now, reply);
        }
        used += n;
    }
    if pending {
        inbuf.drain(..used);
    } else if used < bytes.len() {
        inbuf.extend_from_slice(&bytes[used..]);
    }
}
