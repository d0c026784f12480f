//! The simulated links between clients and nodes (delays, partitions, slowness) and the
//! connections over them. Data only; `network.rs` moves messages over them.

use std::ops::Range;

use super::client_net::CONN_ID_BITS;
use super::clock::MS;
use super::rng::Rng;

/// A link's base delay, each way (ns): 50 µs to 2 ms, drawn once per (client, node).
pub(super) const LINK_BASE: Range<u64> = 50_000..2 * MS;
/// Each message's delay beyond the base: a jitter of up to 0.2 ms…
pub(super) const JITTER: Range<u64> = 0..200_000;
/// …and, one message in 100, a spike (and on a slow link, more: see `network.rs`).
pub(super) const SPIKE: Range<u64> = 5 * MS..60 * MS;

/// One connection, as the world sees it.
pub(super) struct WConn {
    pub(super) client: usize,
    pub(super) node: usize,
    pub(super) alive: bool,
    pub(super) incarnation: u64,
    /// What arrived of a command not yet whole.
    pub(super) inbuf: Vec<u8>,
    /// Last delivery time each way (FIFO).
    pub(super) up: u64,
    pub(super) down: u64,
}

/// The connections, by id: per client, by the client's count of them (ids are never reused).
/// Iterated in the order of their ids.
#[derive(Default)]
pub(super) struct Conns {
    by_client: Vec<Vec<Option<WConn>>>,
}

impl Conns {
    fn split(id: u64) -> (usize, usize) {
        let client = (id >> CONN_ID_BITS) as usize;
        let n = (id & ((1 << CONN_ID_BITS) - 1)) as usize;
        (client, n)
    }

    pub(super) fn get(&self, id: &u64) -> Option<&WConn> {
        let (client, n) = Conns::split(*id);
        self.by_client.get(client)?.get(n)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut WConn> {
        let (client, n) = Conns::split(*id);
        self.by_client.get_mut(client)?.get_mut(n)?.as_mut()
    }

    pub(super) fn insert(&mut self, id: u64, conn: WConn) {
        let (client, n) = Conns::split(id);
        if self.by_client.len() <= client {
            self.by_client.resize_with(client + 1, Vec::new);
        }
        let list = &mut self.by_client[client];
        if list.len() <= n {
            list.resize_with(n + 1, || None);
        }
        list[n] = Some(conn);
    }

    pub(super) fn remove(&mut self, id: &u64) {
        if let Some(slot) = self.get_slot(*id) {
            *slot = None;
        }
    }

    fn get_slot(&mut self, id: u64) -> Option<&mut Option<WConn>> {
        let (client, n) = Conns::split(id);
        self.by_client.get_mut(client)?.get_mut(n)
    }

    /// Every connection, in the order of the ids.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut WConn)> {
        self.by_client
            .iter_mut()
            .enumerate()
            .flat_map(|(client, list)| {
                (list.iter_mut().enumerate()).filter_map(move |(n, c)| {
                    let id = ((client as u64) << CONN_ID_BITS) | n as u64;
                    c.as_mut().map(|c| (id, c))
                })
            })
    }
}

/// Per (client, node) link: base delay, and until when it is partitioned or slow.
#[derive(Clone, Copy)]
pub(super) struct Link {
    pub(super) base: u64,
    pub(super) blocked_until: u64,
    pub(super) slow_until: u64,
}

impl Link {
    /// A link whose base delay is drawn.
    pub(super) fn drawn(rng: &mut Rng) -> Link {
        Link {
            base: rng.within(LINK_BASE),
            blocked_until: 0,
            slow_until: 0,
        }
    }
}
