//! The line between the engine and the outside world: whatever moves bytes between the
//! engine's sessions and the nodes, and tells the time.
//!
//! The engine (`engine/`) decides; a [`Net`] carries out. [`Driver`](crate::runtime::driver::Driver)
//! is the real one (`mio` sockets, the monotonic clock); the simulator (`sim`) is
//! another, with in-memory links and virtual time, so the same decision code runs against a
//! simulated world and a seed replays a run exactly. This is the split of `quinn-proto`'s
//! `Connection` (no I/O) from `quinn`'s endpoint driver, one level up: each node's protocol
//! state is a [`Session`] (no I/O) that every `Net` holds and feeds.

use std::time::Instant;

use crate::model::error::NodeFault;
use crate::proto::scripts::ScriptCall;
use crate::proto::session::{Delivery, Kind, Session};

/// Receives every reply (or fault): the node's index, when it arrived (the `Net`'s clock) and
/// the delivery.
pub(crate) type NodeSink<'s> = dyn for<'a> FnMut(usize, Instant, Delivery<'a>) + 's;

/// What the engine needs from the world. Every method returns at once except
/// [`Net::turn`], which may wait for input until `until`.
pub(crate) trait Net {
    /// The time, on this process's clock. The engine reads no other.
    fn now(&self) -> Instant;

    /// Node `node`'s protocol state.
    fn session(&self, node: usize) -> &Session;

    /// Node `node`'s protocol state, to change: a change may move its deadline.
    fn session_mut(&mut self, node: usize) -> &mut Session;

    /// Queues an encoded command for node `node` (connecting first if needed).
    fn request(
        &mut self,
        node: usize,
        kind: Kind,
        tag: u64,
        encoded: &[u8],
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault>;

    /// Queues a script call for node `node`; `tail` holds its `argc` encoded arguments.
    #[allow(clippy::too_many_arguments)]
    fn script(
        &mut self,
        node: usize,
        call: ScriptCall<'_>,
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault>;

    /// Starts a connection to node `node` if it has none and is not backing off.
    fn ensure_connected(
        &mut self,
        node: usize,
        now: Instant,
        sink: &mut NodeSink<'_>,
    ) -> Result<(), NodeFault>;

    /// Writes what every connection has queued: one write per node.
    fn flush(&mut self, now: Instant, sink: &mut NodeSink<'_>);

    /// Takes in what arrived, waiting for it until `until` at most (a simulated network never
    /// waits: its time moves between calls), and handles connection deadlines that passed.
    fn turn(&mut self, until: Instant, sink: &mut NodeSink<'_>);

    /// How many nodes there are.
    fn nodes(&self) -> usize;

    /// Writes made so far (one per node per flush with something to send).
    fn writes(&self) -> u64;

    /// The earliest connection deadline (connect, handshake, a reply overdue).
    fn next_deadline(&self) -> Option<Instant> {
        (0..self.nodes())
            .filter_map(|i| self.session(i).next_deadline())
            .min()
    }

    /// Starts a connection to every node that has none (nodes backing off are left alone).
    /// Returns how many are ready now.
    fn connect_all(&mut self, now: Instant, sink: &mut NodeSink<'_>) -> usize {
        for i in 0..self.nodes() {
            let _ = self.ensure_connected(i, now, sink);
        }
        (0..self.nodes())
            .filter(|&i| self.session(i).is_ready())
            .count()
    }
}
