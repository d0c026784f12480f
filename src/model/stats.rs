//! Counters and latency histograms, per node and per operation kind, syscalls and kept locks'
//! renewals: what the engine counts as it works ([`Metrics`], [`IoCounters`], atomics) and what
//! [`Redlock::stats`](crate::Redlock::stats) hands out ([`Stats`], a plain snapshot).
//!
//! One writer: an engine runs on one thread at a time (a [`Client`](crate::Client) is `&mut
//! self`, a [`Redlock`](crate::Redlock)'s engine sits behind its mutex), so a counter is bumped
//! with a relaxed load and store — plain moves, no locked instruction — and read by anyone at
//! any time with a relaxed load. No allocation, no syscall: cheap enough to stay on.
//!
//! Histograms have fixed log-scale buckets of microseconds: four per power of two (each bucket
//! at most 25 % wider than its lower bound), from 1 µs to about 2 min; longer samples go into
//! the last bucket, and the exact maximum is kept beside.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::model::addr::NodeAddr;

/// Sub-buckets per power of two: the histogram's resolution (a bucket's upper bound is at most
/// 5/4 of its lower bound).
const SUB: usize = 4;
/// log2 of [`SUB`].
const SUB_BITS: u32 = 2;
/// Buckets: 1 µs steps below [`SUB`] µs, then [`SUB`] per power of two up to 2^27 µs (134 s),
/// far beyond any sensible node timeout or lock wait.
pub const BUCKETS: usize = 26 * SUB;

/// The bucket of a sample of `us` microseconds.
fn bucket_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros(); // ≥ SUB_BITS
    let sub = (us >> (exp - SUB_BITS)) as usize & (SUB - 1);
    ((exp - SUB_BITS + 1) as usize * SUB + sub).min(BUCKETS - 1)
}

/// The smallest sample of `bucket` and the first one above it, in microseconds.
fn bucket_bounds(bucket: usize) -> (u64, u64) {
    if bucket < SUB {
        return (bucket as u64, bucket as u64 + 1);
    }
    let shift = (bucket / SUB - 1) as u32;
    let sub = (bucket % SUB) as u64;
    ((SUB as u64 + sub) << shift, (SUB as u64 + sub + 1) << shift)
}

/// A counter with one writer: see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    #[inline]
    pub(crate) fn bump(&self) {
        self.add(1);
    }
    /// Adds `n`: a load and a store, not a read-modify-write (one writer at a time).
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A latency histogram being filled (one writer).
#[derive(Debug)]
pub(crate) struct LiveHistogram {
    buckets: [Counter; BUCKETS],
    sum_us: Counter,
    max_us: Counter,
}

impl Default for LiveHistogram {
    fn default() -> LiveHistogram {
        LiveHistogram {
            buckets: std::array::from_fn(|_| Counter::default()),
            sum_us: Counter::default(),
            max_us: Counter::default(),
        }
    }
}

impl LiveHistogram {
    /// Records one sample.
    #[inline]
    pub(crate) fn record(&self, d: Duration) {
        // Not `as_micros`: its u128 division costs more than the rest of the recording.
        let us = d
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(d.subsec_micros()));
        self.buckets[bucket_of(us)].bump();
        self.sum_us.add(us);
        if us > self.max_us.get() {
            self.max_us.0.store(us, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|i| self.buckets[i].get()),
            sum_us: self.sum_us.get(),
            max_us: self.max_us.get(),
        }
    }
}

/// A latency histogram: fixed log-scale buckets (four per power of two, from 1 µs to about
/// 2 min), its sum and exact maximum. Percentiles are read off the buckets: within 25 % above
/// the true value, never above the maximum.
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    buckets: [u64; BUCKETS],
    sum_us: u64,
    max_us: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: [0; BUCKETS],
            sum_us: 0,
            max_us: 0,
        }
    }
}

impl Histogram {
    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
    /// The largest sample (to the microsecond); zero when empty.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }
    /// The mean sample (to the microsecond); zero when empty.
    pub fn mean(&self) -> Duration {
        Duration::from_micros(self.sum_us.checked_div(self.count()).unwrap_or(0))
    }
    /// The sample at percentile `p` (0–100; 50 is the median, 100 the maximum), as the upper
    /// bound of its bucket capped at the maximum; zero when empty.
    pub fn percentile(&self, p: f64) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        let p = if p.is_nan() {
            100.0
        } else {
            p.clamp(0.0, 100.0)
        };
        // The rank of the sample wanted, 1-based: at least the first.
        let rank = ((p / 100.0 * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                if bucket == BUCKETS - 1 {
                    // The last bucket also holds everything beyond it.
                    return self.max();
                }
                let (_, above) = bucket_bounds(bucket);
                return Duration::from_micros((above - 1).min(self.max_us));
            }
        }
        self.max()
    }
    /// The non-empty buckets: (smallest sample, first sample above it, samples), in order.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, Duration, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, &n)| {
                let (low, high) = bucket_bounds(i);
                (Duration::from_micros(low), Duration::from_micros(high), n)
            })
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("mean", &self.mean())
            .field("p50", &self.percentile(50.0))
            .field("p99", &self.percentile(99.0))
            .field("max", &self.max())
            .finish()
    }
}

/// The syscall counters of one engine's connections and poll loop (see [`IoStats`] for what
/// each counts): shared (`Arc`) by its driver and every connection, one writer at a time like
/// the rest (whoever drives the loop), read by the handles without waiting for the loop.
#[derive(Debug, Default)]
pub(crate) struct IoCounters {
    pub writes: Counter,
    pub reads: Counter,
    pub polls: Counter,
    pub connects: Counter,
    pub tls_handshakes: Counter,
    pub tls_resumed: Counter,
    pub tls_round_trips: Counter,
}

impl IoCounters {
    /// A snapshot; `wakes` is counted elsewhere (by the callers that wake the loop).
    pub(crate) fn snapshot(&self, wakes: u64) -> IoStats {
        IoStats {
            writes: self.writes.get(),
            reads: self.reads.get(),
            polls: self.polls.get(),
            connects: self.connects.get(),
            wakes,
            tls_handshakes: self.tls_handshakes.get(),
            tls_resumed: self.tls_resumed.get(),
            tls_round_trips: self.tls_round_trips.get(),
        }
    }
}

/// One node's counters (see [`NodeStats`] for what each counts).
#[derive(Debug, Default)]
pub(crate) struct NodeCounters {
    pub requests: Counter,
    pub ok: Counter,
    pub refused: Counter,
    pub errors: Counter,
    pub failures: Counter,
    pub timeouts: Counter,
    pub late_yes: Counter,
    pub connects: Counter,
    pub reconnects: Counter,
    pub downs: Counter,
    pub idle_closes: Counter,
    pub noscript: Counter,
    pub quarantined: Counter,
    pub evicting: Counter,
    pub latency: LiveHistogram,
}

impl NodeCounters {
    fn snapshot(&self, node: &NodeAddr) -> NodeStats {
        NodeStats {
            node: node.to_string(),
            requests: self.requests.get(),
            ok: self.ok.get(),
            refused: self.refused.get(),
            errors: self.errors.get(),
            failures: self.failures.get(),
            timeouts: self.timeouts.get(),
            late_yes: self.late_yes.get(),
            connects: self.connects.get(),
            reconnects: self.reconnects.get(),
            downs: self.downs.get(),
            idle_closes: self.idle_closes.get(),
            noscript: self.noscript.get(),
            quarantined: self.quarantined.get(),
            evicting: self.evicting.get(),
            latency: self.latency.snapshot(),
        }
    }
}

/// The kinds of operation counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Acquire = 0,
    Extend = 1,
    Release = 2,
}

/// How an operation ended, for its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Ok,
    Refused,
    NoQuorum,
    Failed,
}

/// One operation kind's counters (see [`OpStats`]).
#[derive(Debug, Default)]
pub(crate) struct OpCounters {
    ok: Counter,
    refused: Counter,
    no_quorum: Counter,
    failed: Counter,
    latency: LiveHistogram,
}

impl OpCounters {
    fn snapshot(&self) -> OpStats {
        OpStats {
            ok: self.ok.get(),
            refused: self.refused.get(),
            no_quorum: self.no_quorum.get(),
            failed: self.failed.get(),
            latency: self.latency.snapshot(),
        }
    }
}

/// Everything one engine counts. Shared (`Arc`) between the engine, its sessions and the
/// handles that read it.
#[derive(Debug)]
pub(crate) struct Metrics {
    nodes: Box<[std::sync::Arc<NodeCounters>]>,
    ops: [OpCounters; 3],
}

impl Metrics {
    /// The metrics of an engine whose sessions count into `nodes`.
    pub(crate) fn new(nodes: Box<[std::sync::Arc<NodeCounters>]>) -> Metrics {
        Metrics {
            nodes,
            ops: Default::default(),
        }
    }
    /// Node `node`'s counters.
    #[inline]
    pub(crate) fn node(&self, node: usize) -> &NodeCounters {
        &self.nodes[node]
    }
    /// An operation decided after `latency`.
    #[inline]
    pub(crate) fn op(&self, kind: OpKind, ending: Ending, latency: Duration) {
        let c = &self.ops[kind as usize];
        match ending {
            Ending::Ok => c.ok.bump(),
            Ending::Refused => c.refused.bump(),
            Ending::NoQuorum => c.no_quorum.bump(),
            Ending::Failed => c.failed.bump(),
        }
        c.latency.record(latency);
    }
    /// A snapshot, naming the nodes by `addrs`, with the engine's syscalls and renewals (counted
    /// elsewhere).
    pub(crate) fn snapshot(&self, addrs: &[NodeAddr], io: IoStats, keep: KeepStats) -> Stats {
        Stats {
            nodes: self
                .nodes
                .iter()
                .zip(addrs)
                .map(|(c, a)| c.snapshot(a))
                .collect(),
            acquire: self.ops[OpKind::Acquire as usize].snapshot(),
            extend: self.ops[OpKind::Extend as usize].snapshot(),
            release: self.ops[OpKind::Release as usize].snapshot(),
            io,
            keep,
        }
    }
}

/// What one engine has counted since it was built: per node and per operation kind, its
/// syscalls and its renewals of kept locks. A plain snapshot, from [`Redlock::stats`](crate::Redlock::stats),
/// [`AsyncRedlock::stats`](crate::AsyncRedlock::stats) or [`Client::stats`](crate::Client::stats).
///
/// Counters only grow: for rates, take two snapshots and subtract. Each counter is read on its
/// own while the engine works, so two counters of one snapshot may be a few operations apart.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Per node, in the order of the server list.
    pub nodes: Vec<NodeStats>,
    /// Acquire attempts (each attempt of a waiting `lock` counts once): `ok` won, `refused`
    /// held elsewhere, `no_quorum` too few nodes, `failed` anything else (too slow, no fence,
    /// credentials); latency from sending to the decision.
    pub acquire: OpStats,
    /// Extensions, including those of kept locks: `ok` extended, `refused` our token gone on
    /// too many nodes, `no_quorum` too few nodes answered, `failed` anything else (the validity
    /// ran out first).
    pub extend: OpStats,
    /// Releases a caller waited for ([`Redlock::unlock`](crate::Redlock::unlock) and the like;
    /// not the ones nobody waits for, such as a dropped guard's or a lost attempt's cleanup):
    /// `ok` deleted on at least one node, `refused` on none (expired, or not ours).
    pub release: OpStats,
    /// Syscalls of the engine's connections and event loop, and wake-ups of its loop: divided
    /// by the operations between two snapshots, the syscalls per lock cycle.
    pub io: IoStats,
    /// Renewals of kept locks, batch by batch.
    pub keep: KeepStats,
}

/// How often one kind of operation ended which way, and how long it took to decide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpStats {
    /// Succeeded.
    pub ok: u64,
    /// Refused: held elsewhere (acquire), our token gone (extend), nothing to delete (release).
    pub refused: u64,
    /// Too few nodes could take part.
    pub no_quorum: u64,
    /// Failed otherwise.
    pub failed: u64,
    /// From sending to the decision.
    pub latency: Histogram,
}

impl OpStats {
    /// Operations decided: the sum of the four outcomes.
    pub fn count(&self) -> u64 {
        self.ok + self.refused + self.no_quorum + self.failed
    }
}

/// Syscalls made by one engine's connections and event loop ([`Stats::io`]). An acquire and
/// release cycle on N idle nodes takes about N `write`s, N `read`s and a few `poll`s in all.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoStats {
    /// `write` calls on the nodes' sockets (TLS handshakes' included).
    pub writes: u64,
    /// `read` calls on the nodes' sockets (TLS handshakes' included).
    pub reads: u64,
    /// `poll` (`epoll_wait`) calls of the event loop.
    pub polls: u64,
    /// Connect attempts (sockets opened), all nodes together; per node in
    /// [`NodeStats::connects`].
    pub connects: u64,
    /// Wake-ups of a shared engine's loop by callers that handed a request over while it
    /// slept in `poll` (one `write` to an eventfd each, not counted in `writes`); zero for a
    /// [`Client`](crate::Client).
    pub wakes: u64,
    /// TLS handshakes completed (`rediss://` nodes).
    pub tls_handshakes: u64,
    /// Of those, the ones that resumed an earlier session (no certificate sent or checked).
    pub tls_resumed: u64,
    /// Round trips of TLS handshakes: the server's flights a handshake waited for (TCP's own
    /// connect not included). TLS 1.3 needs one per handshake, resumed or not.
    pub tls_round_trips: u64,
}

/// Renewals of kept locks ([`Redlock::keep`](crate::Redlock::keep), `with_lock` and the like;
/// [`Stats::keep`]). The engine renews every kept lock due within a tenth of the TTL of the
/// first in one batch, so that many kept locks cost one `write` per node per batch, not one per
/// lock. Zero for a [`Client`](crate::Client), which keeps no locks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeepStats {
    /// Batches of renewals sent.
    pub batches: u64,
    /// `write` calls that sent those batches (requests queued meanwhile go out in the same
    /// writes); also counted in [`IoStats::writes`]. One per node per batch when nothing is
    /// held back.
    pub writes: u64,
    /// Kept locks extended: renewals that succeeded (also counted in [`Stats::extend`]).
    pub extended: u64,
    /// Renewals lost and tried again after a backoff, the lock still valid (the lost ones are
    /// counted in [`Stats::extend`] too). A lock is lost only when a renewal can no longer win
    /// within its validity.
    pub retried: u64,
}

/// One node's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStats {
    /// `host:port`.
    pub node: String,
    /// Requests sent (or queued to be sent) for acquires, extends, releases and status reads;
    /// not the handshake.
    pub requests: u64,
    /// Lock replies that said yes: `OK` to `SET NX`, 1 to extend, a deletion to release.
    pub ok: u64,
    /// Lock replies that said no: the key held by another token, our token gone.
    pub refused: u64,
    /// Error replies and replies of the wrong kind (`-ERR`, `-NOPERM`, …).
    pub errors: u64,
    /// Requests that failed without a reply: the connection was down, backing off, dropped
    /// under them or refused the handshake.
    pub failures: u64,
    /// Acquires and extends this node did not answer within the round's node timeout (and
    /// requests unanswered for the reply timeout, which resets the connection).
    pub timeouts: u64,
    /// `OK`s to `SET NX` that came after their acquire was decided, within the node timeout:
    /// not failures (the round decides at quorum), counted here; the key is released.
    pub late_yes: u64,
    /// Connect attempts (sockets opened).
    pub connects: u64,
    /// Connections that came up (handshake done) after an earlier one of this node was lost
    /// or failed.
    pub reconnects: u64,
    /// Connections lost, or connects or handshakes that failed (not the idle closes).
    pub downs: u64,
    /// Connections the server closed while nothing was asked of them (its `timeout` setting,
    /// a proxy's idle limit, `CLIENT KILL`): routine, reconnected at the next request.
    pub idle_closes: u64,
    /// `NOSCRIPT` answers (`SCRIPT FLUSH`, a proxy that switched servers), each answered with
    /// `EVAL` — but an acquire's with requests already written behind it, which fails on that
    /// node instead (sent again, it would run after them: after its own release, perhaps).
    pub noscript: u64,
    /// `SET NX` yeses not counted because the node was in its restart quarantine.
    pub quarantined: u64,
    /// Yeses not counted because the server may evict keys ([`EvictingServers`](crate::EvictingServers)).
    pub evicting: u64,
    /// Request latency: from queuing a request to its reply, per reply.
    pub latency: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_their_samples() {
        let mut above_prev = 0;
        for b in 0..BUCKETS {
            let (low, high) = bucket_bounds(b);
            assert_eq!(
                low,
                above_prev,
                "bucket {b} starts where {} ended",
                b.max(1) - 1
            );
            assert!(high > low);
            // Four per power of two: a bucket is at most a quarter of its lower bound wide.
            assert!(
                b < SUB || (high - low) * 4 <= low,
                "bucket {b}: {low}..{high}"
            );
            assert_eq!(bucket_of(low), b);
            assert_eq!(bucket_of(high - 1), b);
            above_prev = high;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_bounds(4), (4, 5));
        assert_eq!(bucket_bounds(8), (8, 10));
        // 1 ms: 1000 µs lies in [896, 1024).
        assert_eq!(bucket_bounds(bucket_of(1000)), (896, 1024));
    }

    #[test]
    fn percentiles_mean_and_max() {
        let h = LiveHistogram::default();
        assert_eq!(h.snapshot().percentile(50.0), Duration::ZERO);
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_millis(10));
        let s = h.snapshot();
        assert_eq!(s.count(), 101);
        assert_eq!(s.max(), Duration::from_millis(10));
        assert_eq!(s.mean(), Duration::from_micros((5050 + 10_000) / 101));
        // The 51st sample is 51 µs, in bucket [48, 56): reported as its upper bound, 55 µs.
        assert_eq!(s.percentile(50.0), Duration::from_micros(55));
        // 100 % is the maximum exactly, not its bucket's bound.
        assert_eq!(s.percentile(100.0), Duration::from_millis(10));
        assert_eq!(s.percentile(0.0), Duration::from_micros(1));
        let p99 = s.percentile(99.0);
        assert!(p99 >= Duration::from_micros(100) && p99 <= Duration::from_micros(125));
        let total: u64 = s.buckets().map(|(_, _, n)| n).sum();
        assert_eq!(total, 101);
        // A sample beyond the last bucket is still the maximum.
        h.record(Duration::from_secs(1000));
        assert_eq!(h.snapshot().max(), Duration::from_secs(1000));
        assert_eq!(h.snapshot().percentile(100.0), Duration::from_secs(1000));
    }
}
