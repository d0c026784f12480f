//! A status read: `GET`, `PTTL`, `ZSCORE` of the read lock's marker and `ZCARD` (the readers of
//! a read-locked resource) and `HMGET redlock:fence run n` of a resource on every node, each node's answers gathered until
//! all came or the deadline passed.

use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome};
use crate::model::addr::NodeAddr;
use crate::model::error::NodeFault;
use crate::model::eviction::Eviction;
use crate::model::node_status::{NodeFence, NodeStatus};
use crate::model::round::deadline_after;
use crate::proto::fencing::FENCE_KEY;
use crate::proto::quarantine::NodeWatch;
use crate::proto::resp::{Arg, Frame};
use crate::proto::session::{Delivery, Kind};

use super::{Engine, OpKind};

/// Replies to `GET`, `PTTL` and `HMGET redlock:fence run n` per node.
#[derive(Debug, Default)]
pub(super) struct StatusReplies {
    /// Per node: its uptime and restart quarantine left, as of its first reply.
    restart: Vec<(Option<Duration>, Option<Duration>)>,
    /// Per node: its `INFO memory` on the connection of its first reply.
    eviction: Vec<Eviction>,
    values: Vec<Option<Result<Option<Vec<u8>>, NodeFault>>>,
    ttls: Vec<Option<(Result<i64, NodeFault>, Instant)>>,
    /// `ZSCORE` of [`READERS_MARKER`](crate::model::keys::READERS_MARKER): whether a sorted set
    /// under the name is our read lock.
    marked: Vec<Option<bool>>,
    /// `ZCARD`: the readers of a read-locked key (`None`: not read-locked).
    readers: Vec<Option<Option<usize>>>,
    fences: Vec<Option<Option<NodeFence>>>,
}

impl StatusReplies {
    fn reset(&mut self, n: usize) {
        self.values.clear();
        self.values.resize(n, None);
        self.ttls.clear();
        self.ttls.resize(n, None);
        self.marked.clear();
        self.marked.resize(n, None);
        self.readers.clear();
        self.readers.resize(n, None);
        self.fences.clear();
        self.fences.resize(n, None);
        self.restart.clear();
        self.restart.resize(n, (None, None));
        self.eviction.clear();
        self.eviction.resize(n, Eviction::Unknown);
    }

    /// Every answer still missing from `node` is `fault`.
    pub fn fail(&mut self, node: usize, fault: NodeFault, now: Instant) {
        self.values[node].get_or_insert(Err(fault.clone()));
        self.ttls[node].get_or_insert((Err(fault), now));
        self.marked[node].get_or_insert(false);
        self.readers[node].get_or_insert(None);
        self.fences[node].get_or_insert(None);
    }

    /// `node`'s answers were taken back (surplus frames or garbage): all are `fault`.
    pub fn withdraw(&mut self, node: usize, fault: &NodeFault, now: Instant) {
        self.values[node] = Some(Err(fault.clone()));
        self.ttls[node] = Some((Err(fault.clone()), now));
        self.marked[node] = Some(false);
        self.readers[node] = Some(None);
        self.fences[node] = Some(None);
    }

    /// `node`'s next answer, in the order asked: the value, its TTL, the fence counter. The
    /// first also tells the node's uptime and restart quarantine (from `watch`, if the
    /// quarantine is on: `window`).
    pub fn on_reply(
        &mut self,
        node: usize,
        d: &Delivery<'_>,
        restart: (Option<Duration>, &mut NodeWatch),
        now: Instant,
    ) {
        if self.values[node].is_none() {
            self.on_value(node, d, restart, now);
        } else if self.ttls[node].is_none() {
            let pttl = match &d.reply {
                Ok(Frame::Integer(ms)) => Ok(*ms),
                Ok(other) => Err(NodeFault::unexpected(other)),
                Err(f) => Err((*f).clone()),
            };
            self.ttls[node] = Some((pttl, now));
        } else if self.marked[node].is_none() {
            self.marked[node] = Some(matches!(d.reply, Ok(Frame::Bulk(_) | Frame::Double(_))));
        } else if self.readers[node].is_none() {
            self.readers[node] = Some(self.readers_of(node, &d.reply));
        } else if self.fences[node].is_none() {
            self.fences[node] = Some(fence_of(d));
        }
    }

    /// `node`'s first answer (`GET`): the value, and what the connection's handshake told of
    /// the node (its uptime, its restart quarantine, whether it may evict keys).
    fn on_value(
        &mut self,
        node: usize,
        d: &Delivery<'_>,
        (window, watch): (Option<Duration>, &mut NodeWatch),
        now: Instant,
    ) {
        if d.reply.is_ok() {
            self.eviction[node] = d.eviction;
        }
        if let Some(info) = d.info.filter(|_| d.reply.is_ok()) {
            // Saturating: `uptime_in_seconds` is whatever the server says (u64::MAX included),
            // and `Duration + Duration` panics on overflow. Missing or not a whole number of
            // seconds: counted from the handshake.
            let uptime = info
                .uptime
                .unwrap_or_default()
                .saturating_add(now.saturating_duration_since(info.seen));
            let left =
                window.and_then(|window| watch.quarantine_left(window, d.generation, d.info, now));
            self.restart[node] = (Some(uptime), left);
        }
        self.values[node] = Some(match &d.reply {
            Ok(Frame::Bulk(b)) => Ok(Some(b.to_vec())),
            Ok(Frame::Null) => Ok(None),
            // Read-locked (a sorted set): no writer's value; its readers come next.
            Ok(Frame::Error(e)) if e.kind == crate::proto::resp::ErrorKind::WrongType => Ok(None),
            Ok(other) => Err(NodeFault::unexpected(other)),
            Err(f) => Err((*f).clone()),
        });
    }

    /// `node`'s `ZCARD` answer: the readers of our read lock (the marker not counted). A key
    /// that refuses every lock of the name without being ours — another application's sorted
    /// set, a key of another type — turns the node's value into a fault that says so (what
    /// holds it, status cannot say).
    fn readers_of(&mut self, node: usize, reply: &Result<Frame<'_>, &NodeFault>) -> Option<usize> {
        let marked = self.marked[node] == Some(true);
        let foreign = match reply {
            Ok(Frame::Integer(n)) if *n > 1 && marked => return Some(*n as usize - 1),
            // A sorted set without the marker: another application's data under the name,
            // which refuses every lock of it (readers too) and is never changed.
            Ok(Frame::Integer(n)) if *n > 0 && !marked => {
                "the key is another application's sorted set (not a read lock): it refuses every \
                 lock of the name"
            }
            // Neither a string (`GET` said WRONGTYPE) nor a sorted set: a key of another type
            // holds the name (a hash, a list), which refuses every lock of it — not free.
            Ok(Frame::Error(e))
                if e.kind == crate::proto::resp::ErrorKind::WrongType
                    && matches!(self.values[node], Some(Ok(None))) =>
            {
                "the key is of another type (neither a lock nor read-locked): it refuses every \
                 lock of the name"
            }
            _ => return None,
        };
        self.values[node] = Some(Err(NodeFault::Unexpected(foreign.into())));
        None
    }

    /// The status, once every node answered everything or `until` has passed (`start`: when
    /// the questions went out).
    pub fn outcome(
        &mut self,
        nodes: &[NodeAddr],
        (start, until): (Instant, Instant),
        now: Instant,
    ) -> Option<Outcome> {
        if !self.fences.iter().all(Option::is_some) && until > now {
            return None;
        }
        let status = (0..nodes.len())
            .map(|node| {
                let (pttl, at) = self.ttls[node]
                    .take()
                    .unwrap_or((Err(NodeFault::Timeout), until));
                let value = self.values[node].take().unwrap_or(Err(NodeFault::Timeout));
                let (uptime, quarantine) = self.restart[node];
                NodeStatus {
                    node: nodes[node].to_string(),
                    state: value.and_then(|v| pttl.map(|t| (v, t))),
                    rtt: at.saturating_duration_since(start),
                    fence: self.fences[node].take().flatten(),
                    readers: self.readers[node].take().flatten(),
                    uptime,
                    quarantine,
                    eviction: self.eviction[node],
                }
            })
            .collect();
        Some(Outcome::Status(status))
    }
}

/// The fence counter of an `HMGET redlock:fence run n` answer: seeded when `run` is the
/// answering connection's process.
fn fence_of(d: &Delivery<'_>) -> Option<NodeFence> {
    let Ok(Frame::Aggregate(a)) = &d.reply else {
        return None;
    };
    let mut it = a.iter();
    let run = it.next();
    let counter = match it.next() {
        Some(Frame::Bulk(b)) => crate::proto::fencing::parse_u64(b),
        Some(Frame::Null) => Some(0),
        _ => None,
    };
    counter.map(|counter| NodeFence {
        counter,
        seeded: matches!(
            (run, d.info),
            (Some(Frame::Bulk(r)), Some(info)) if *r == info.run_id
        ),
    })
}

impl<N: Net> Engine<N> {
    /// Starts status read `id`, answered within `timeout`, on the nodes in `targets`.
    pub(super) fn start_status(&mut self, id: OpId, timeout: Duration, targets: u64, now: Instant) {
        let n = self.shared.nodes.len();
        let Engine { net, core, .. } = self;
        let op = &mut core.ops[id.index as usize];
        op.kind = OpKind::Status;
        op.until = deadline_after(now, timeout);
        op.status.get_or_insert_with(Default::default).reset(n);
        // A shared lock's name is asked as its resource's (where its readers are).
        let resource = crate::model::keys::shared_name(&op.resource).unwrap_or(&op.resource);
        let fence = [
            Arg::Bytes(b"HMGET"),
            Arg::Bytes(FENCE_KEY.as_bytes()),
            Arg::Bytes(b"run"),
            Arg::Bytes(b"n"),
        ];
        let get = [Arg::Bytes(b"GET"), Arg::Bytes(resource)];
        let pttl = [Arg::Bytes(b"PTTL"), Arg::Bytes(resource)];
        let marker = [
            Arg::Bytes(b"ZSCORE"),
            Arg::Bytes(resource),
            Arg::Bytes(crate::model::keys::READERS_MARKER.as_bytes()),
        ];
        let zcard = [Arg::Bytes(b"ZCARD"), Arg::Bytes(resource)];
        let commands = [&get[..], &pttl[..], &marker[..], &zcard[..], &fence[..]].map(|args| {
            let mut cmd = bytes::BytesMut::new();
            crate::proto::resp::encode_command(&mut cmd, args);
            cmd
        });
        for cmd in &commands {
            core.send_command(net, (id, Kind::Command, cmd), targets, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::info::ServerInfo;

    fn delivery<'a>(reply: Frame<'a>, info: Option<&'a ServerInfo>) -> Delivery<'a> {
        Delivery {
            tag: 1,
            kind: Kind::Command,
            reply: Ok(reply),
            generation: 1,
            eviction: crate::model::eviction::Eviction::Never,
            info,
            clock: None,
            withdrawn: false,
        }
    }

    #[test]
    fn a_status_gathers_value_ttl_and_fence_per_node_and_times_out_the_rest() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let nodes: Vec<NodeAddr> = ["redis://a:1", "redis://b:1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let info = ServerInfo {
            run_id: [b'r'; 40],
            uptime: Some(Duration::from_secs(100)),
            seen: now,
            changes: 0,
        };
        let mut replies = StatusReplies::default();
        replies.reset(2);
        let mut watch = NodeWatch::default();
        let fence = format!("*2\r\n$40\r\n{}\r\n$1\r\n7\r\n", "r".repeat(40));
        let wrongtype = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
        for (bytes, at) in [
            ("$5\r\ntoken\r\n", 1),
            (":900\r\n", 2),
            (wrongtype, 2),
            (wrongtype, 2),
            (fence.as_str(), 3),
        ] {
            let limits = crate::proto::resp::Limits::default();
            let Ok(crate::proto::resp::Status::Complete((reply, _))) =
                crate::proto::resp::decode(bytes.as_bytes(), &limits)
            else {
                panic!("{bytes:?} decodes");
            };
            let d = delivery(reply, Some(&info));
            replies.on_reply(0, &d, (None, &mut watch), now + ms(at));
        }
        // Node 1 never answers: nothing until the deadline.
        assert!(
            replies
                .outcome(&nodes, (now, now + ms(10)), now + ms(5))
                .is_none()
        );
        let Some(Outcome::Status(status)) =
            replies.outcome(&nodes, (now, now + ms(10)), now + ms(10))
        else {
            panic!("a status once the deadline passed");
        };
        assert_eq!(status[0].state, Ok((Some(b"token".to_vec()), 900)));
        assert_eq!(status[0].rtt, ms(2));
        assert_eq!(
            status[0].fence,
            Some(NodeFence {
                counter: 7,
                seeded: true
            })
        );
        assert_eq!(status[0].uptime, Some(Duration::from_secs(100) + ms(1)));
        assert_eq!(status[0].readers, None, "a string: no readers");
        assert!(
            matches!(status[1].state, Err(NodeFault::Timeout)),
            "{:?}",
            status[1]
        );
        assert_eq!(status[1].rtt, ms(10));
    }

    /// A sorted set under the name: readers of ours when it holds the marker (the marker not
    /// counted), another application's data when it does not.
    #[test]
    fn a_sorted_set_is_read_locked_only_with_the_marker() {
        let now = Instant::now();
        let nodes: Vec<NodeAddr> = ["redis://a:1", "redis://b:1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let mut replies = StatusReplies::default();
        replies.reset(2);
        let mut watch = NodeWatch::default();
        let wrongtype = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
        for (node, marker) in [(0, "$3\r\ninf\r\n"), (1, "$-1\r\n")] {
            for bytes in [
                wrongtype,
                ":900\r\n",
                marker,
                ":3\r\n",
                "*2\r\n$-1\r\n$-1\r\n",
            ] {
                let limits = crate::proto::resp::Limits::default();
                let Ok(crate::proto::resp::Status::Complete((reply, _))) =
                    crate::proto::resp::decode(bytes.as_bytes(), &limits)
                else {
                    panic!("{bytes:?} decodes");
                };
                replies.on_reply(node, &delivery(reply, None), (None, &mut watch), now);
            }
        }
        let Some(Outcome::Status(status)) = replies.outcome(&nodes, (now, now), now) else {
            panic!("every node answered");
        };
        assert_eq!(status[0].readers, Some(2));
        assert_eq!(status[0].state, Ok((None, 900)));
        assert_eq!(status[1].readers, None);
        assert!(
            matches!(&status[1].state, Err(NodeFault::Unexpected(m)) if m.contains("sorted set")),
            "{:?}",
            status[1].state
        );
    }

    #[test]
    fn an_uptime_at_the_end_of_the_range_does_not_overflow() {
        // A server (or whatever answers on its port) may say any u64: the status adds the
        // time since the handshake to it.
        let now = Instant::now();
        let text = format!(
            "run_id:{}\r\nuptime_in_seconds:{}\r\n",
            "r".repeat(40),
            u64::MAX
        );
        let info = crate::proto::info::parse_info(text.as_bytes(), now);
        assert_eq!(
            info.and_then(|i| i.uptime),
            Some(Duration::from_secs(u64::MAX))
        );
        let mut replies = StatusReplies::default();
        replies.reset(1);
        let d = delivery(Frame::Null, info.as_ref());
        let later = now + Duration::from_secs(1);
        replies.on_reply(0, &d, (None, &mut NodeWatch::default()), later);
        assert_eq!(replies.restart[0].0, Some(Duration::MAX));
    }
}
