//! Network faults against real servers, through fault relays (`redis_local::Relay`; this kernel
//! has no netem): a black hole, a partition that heals, one-way loss, half-open connections, a
//! slow drip and connects that never complete — on one node, then on a majority.
//!
//! Each scenario runs two clients contending for one resource (one blocking handle, one async)
//! and checks, from their records on the monotonic clock:
//! - no two holders at once: the interval from each acquire's return to the earlier of its
//!   validity's end and its unlock never meets another's;
//! - no hang: every call returns within a bound derived from the settings below;
//! - recovery: once the fault heals, the node answers again (or, after a majority fault, a lock
//!   is granted) within a bound derived from the same settings;
//! - no reconnect storm: connects to a faulty node bounded by its connect timeout and backoff;
//!   no event loop spinning (its `poll` calls per second);
//! - nothing left: once every release is confirmed, no key of ours on any server.
//!
//! Tests of their own follow the scenarios: a kept lock whose renewals the servers run but whose
//! answers are lost, an acquire run by servers whose connections then went half open, a dripped
//! reply's validity, a kept lock across half-open connections (with the test's timeouts and with
//! the defaults' proportions), a `lock` begun on half-open connections to every node, the rest of
//! the API in a black hole.
//!
//! Bounds are for hangs — a connect or reply timeout waited for where it should not be, or
//! forever — not speed: each carries [`SLACK`] for a loaded 2-core machine. The figures in
//! docs/guarantees.md come from `cargo test --test network -- --nocapture --test-threads 1`,
//! which prints each test's measurements.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use futures::executor::block_on;
use redis_local::{Cluster, Connects, Direction, Flow, Relay};
use redlock_mux::{AsyncRedlock, Builder, Error, Lock, Redlock, Stats};

// The client's settings. Every bound below is derived from them.

/// Lock TTL: a holder caught by a fault keeps its resource at most this long, which the tests
/// wait out; long against the node timeout, so that a grant leaves most of it as validity.
const TTL: Duration = Duration::from_secs(2);
/// Each attempt's wait for each node: four times the default 50 ms, room for a loaded 2-core
/// machine (a healthy node on loopback answers within a millisecond).
const NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// TCP connect plus the Redis handshake: the default.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Reconnect backoff after a failed connect: the first wait, the default.
const BACKOFF_MIN: Duration = Duration::from_millis(25);
/// The wait it doubles up to: the default.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A request unanswered this long resets its connection: shorter than the default 5 s, so that
/// a fault of a few seconds outlasts it and every run goes through the reset and the reconnects
/// after it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// A waiting caller's fallback poll: the default.
const RETRY_DELAY: Duration = Duration::from_millis(200);
/// Up to this much random time added to each poll: the default.
const RETRY_JITTER: Duration = Duration::from_millis(200);

// The workload.

/// How long a contender's waiting acquire waits (`lock_until`): a few polls, so that waits end
/// both ways during a fault.
const WAIT: Duration = Duration::from_millis(600);
/// How long a contender holds the lock: short, so that the resource changes hands often.
const HOLD: Duration = Duration::from_millis(20);
/// A contender's pause after a refused `try_lock`, so that it does not loop on the wire.
const PAUSE: Duration = Duration::from_millis(20);
/// How long a fault lasts: past the reply timeout and two connect timeouts more, so that the
/// dead connection is reset and the reconnects after it are tried and fail.
const FAULT: Duration = REPLY_TIMEOUT.saturating_add(CONNECT_TIMEOUT.saturating_mul(2));

/// A fault shorter than the connect timeout (and the reply timeout): the connections outlive
/// it, though callers need them (a connection silent while they do is failed after a connect
/// timeout: `Session::hurry`).
const BLIP: Duration = Duration::from_millis(400);

// The bounds.

/// Scheduling slack of every bound: a thread of a loaded 2-core VM (five servers, their relays'
/// threads, two clients and the other tests' builds) may wait this long for a core. Less than
/// the connect timeout less the node timeout, so that a call that waited for a connect timeout
/// it should not have waited for still fails its bound.
const SLACK: Duration = Duration::from_millis(750);
/// `try_lock`: one attempt, which waits for each node at most the node timeout (a node that is
/// connecting or silent included).
const TRY_BOUND: Duration = NODE_TIMEOUT.saturating_add(SLACK);
/// `lock_until(now + WAIT)`: no waiting acquire outlives its deadline by more than two node
/// timeouts (docs/guarantees.md).
const WAIT_BOUND: Duration = WAIT
    .saturating_add(NODE_TIMEOUT.saturating_mul(2))
    .saturating_add(SLACK);
/// `unlock`: waits for the replies at most the node timeout.
const UNLOCK_BOUND: Duration = NODE_TIMEOUT.saturating_add(SLACK);
/// A contender's next request after any instant: it polls at most this far apart while it waits
/// (a refused `try_lock` pauses less).
const NEXT_REQUEST: Duration = RETRY_DELAY.saturating_add(RETRY_JITTER);
/// From a heal to the node's next answer when its connects hung: the connect under way when
/// the fault healed may still time out (its SYN was dropped; Linux sends it again only after
/// 1 s), then the backoff (at most its maximum), then a contender's next request, answered
/// within a node timeout.
const RECOVERY_AFTER_HUNG_CONNECTS: Duration = CONNECT_TIMEOUT
    .saturating_add(BACKOFF_MAX)
    .saturating_add(NEXT_REQUEST)
    .saturating_add(NODE_TIMEOUT)
    .saturating_add(SLACK);
/// From a heal to the next grant when the connections outlived the fault: the bytes held
/// meanwhile are delivered, and a contender's next request is answered within a node timeout.
const RECOVERY_AFTER_BLIP: Duration = NEXT_REQUEST
    .saturating_add(NODE_TIMEOUT)
    .saturating_add(SLACK);
/// From the first request into a dead connection (half open, or one that lost bytes) to the
/// node's next answer: the reply timeout resets the connection, a connection that had worked is
/// made again at once, and the next request is answered within a node timeout.
const RECOVERY_AFTER_DEAD_CONNECTION: Duration = REPLY_TIMEOUT
    .saturating_add(NEXT_REQUEST)
    .saturating_add(NODE_TIMEOUT)
    .saturating_add(SLACK);

/// Connects by a client to a faulty node during a fault of `d` and the recovery after it: one
/// at once when the reply timeout resets the dead connection (it had worked: no backoff), one
/// under way when the fault began, then one per connect timeout (each waits its timeout — a
/// hung SYN, or a handshake never answered — before the backoff and the next), and the one
/// that succeeds after the heal. A storm would be a connect per request, hundreds a second.
fn connects_bound(d: Duration) -> u64 {
    3 + (d.as_millis() / CONNECT_TIMEOUT.as_millis()) as u64
}

/// Bound on waits for something that must happen (a warm-up, a node's keys), never reached by
/// a passing run.
const LONG: Duration = Duration::from_secs(10);
/// How often a wait for an event looks again.
const POLL: Duration = Duration::from_millis(5);

/// N servers, each behind a relay of its own; the clients see the relays. The relays drop
/// first (fields drop in order).
struct Net {
    relays: Vec<Relay>,
    servers: Cluster,
}

impl Net {
    fn start(n: usize) -> Net {
        let servers = Cluster::start(n);
        let relays = servers
            .iter()
            .map(|s| Relay::start(s.socket_addr(), Duration::ZERO))
            .collect();
        Net { relays, servers }
    }

    fn urls(&self) -> Vec<String> {
        self.relays.iter().map(Relay::url).collect()
    }

    fn each(&self, nodes: &[usize], fault: impl Fn(&Relay)) {
        for &i in nodes {
            fault(&self.relays[i]);
        }
    }
}

/// The settings above, for `urls`. The servers are fresh, so the restart quarantine is off;
/// the client's name stands in for the `INFO` it would have gated the handshake on: a node
/// counts as connected only once the server answered through the relay, and the connect
/// timeout covers that answer. (Without a step that gates it, a connection is up as soon as
/// TCP is, which a relay completes whatever lies behind it.)
///
/// Kept locks are renewed with [`KEEP_FRACTION`] of the TTL left: with the default third, a
/// 2 s TTL and a 200 ms node timeout leave no room to try a lost renewal again (a retry needs
/// a node timeout and half the margin after its backoff), so one healthy node answering a
/// renewal late on a loaded machine, beside a faulty one, lost the lock. The defaults' own
/// proportions (a 30 s TTL, a 50 ms node timeout) leave room for many retries.
fn builder(urls: Vec<String>) -> Builder {
    Builder::new(urls)
        .quarantine(None)
        .client_name("network-faults")
        .ttl(TTL)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .backoff(BACKOFF_MIN, BACKOFF_MAX)
        .reply_timeout(REPLY_TIMEOUT)
        .retry_delay(RETRY_DELAY, RETRY_JITTER)
        .renew_fraction(KEEP_FRACTION)
}

/// The fraction of the TTL left when a kept lock is renewed: room for one retry of a lost
/// renewal (see [`builder`]).
const KEEP_FRACTION: f64 = 0.75;

/// A client: the blocking handle or the async one (its futures run by `block_on`).
#[derive(Clone)]
enum Handle {
    Blocking(Redlock),
    Async(AsyncRedlock),
}

impl Handle {
    fn blocking(urls: Vec<String>) -> Handle {
        Handle::Blocking(builder(urls).build().unwrap())
    }
    fn async_(urls: Vec<String>) -> Handle {
        Handle::Async(builder(urls).build_async().unwrap())
    }
    fn redlock(&self) -> &Redlock {
        match self {
            Handle::Blocking(r) => r,
            Handle::Async(r) => r.blocking(),
        }
    }
    fn try_lock(&self, resource: &str) -> Result<Lock, Error> {
        match self {
            Handle::Blocking(r) => r.try_lock(resource),
            Handle::Async(r) => block_on(r.try_lock(resource)),
        }
    }
    fn lock_until(&self, resource: &str, deadline: Instant) -> Result<Lock, Error> {
        match self {
            Handle::Blocking(r) => r.lock_until(resource, deadline),
            Handle::Async(r) => block_on(r.lock_until(resource, deadline)),
        }
    }
    fn unlock(&self, lock: Lock) -> Result<usize, Error> {
        match self {
            Handle::Blocking(r) => r.unlock(lock),
            Handle::Async(r) => block_on(r.unlock(lock)),
        }
    }
    fn stats(&self) -> Stats {
        self.redlock().stats()
    }
    /// Lock replies node `i` gave: yeses and refusals.
    fn answers(&self, i: usize) -> u64 {
        let n = &self.stats().nodes[i];
        n.ok + n.refused
    }
}

/// A call that took longer than its bound.
struct Overrun {
    what: &'static str,
    client: usize,
    took: Duration,
    bound: Duration,
}

/// A holder's belief: from its acquire's return to the earliest of its validity's end, its
/// unlock and (for a kept lock) its `lost_at`.
#[derive(Clone, Copy, Debug)]
struct Hold {
    client: usize,
    resource: &'static str,
    from: Instant,
    to: Instant,
}

/// What the contenders did.
#[derive(Default)]
struct Log {
    holds: Vec<Hold>,
    overruns: Vec<Overrun>,
    /// The longest call of each kind.
    longest: Vec<(&'static str, Duration)>,
    /// Acquires refused, by kind of error: `held`, `no quorum`, `too slow`.
    refused: Vec<&'static str>,
}

impl Log {
    fn call(&mut self, what: &'static str, client: usize, took: Duration, bound: Duration) {
        if took > bound {
            self.overruns.push(Overrun {
                what,
                client,
                took,
                bound,
            });
        }
        match self.longest.iter_mut().find(|(w, _)| *w == what) {
            Some((_, longest)) => *longest = (*longest).max(took),
            None => self.longest.push((what, took)),
        }
    }

    fn longest(&self, what: &str) -> Duration {
        self.longest
            .iter()
            .find(|(w, _)| *w == what)
            .map(|(_, d)| *d)
            .unwrap_or_default()
    }

    fn holds_between(&self, from: Instant, to: Instant) -> usize {
        self.holds
            .iter()
            .filter(|h| h.from >= from && h.from < to)
            .count()
    }

    /// Every call within its bound.
    fn assert_bounds(&self) {
        if let Some(o) = self.overruns.first() {
            panic!(
                "client {}: {} took {:?}, bound {:?} ({} calls over their bounds)",
                o.client,
                o.what,
                o.took,
                o.bound,
                self.overruns.len()
            );
        }
    }

    /// No two holds of one resource meet.
    fn assert_no_overlap(&self) {
        let mut holds = self.holds.clone();
        holds.sort_by_key(|h| (h.resource, h.from));
        for pair in holds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                a.resource != b.resource || b.from >= a.to,
                "two holders of {}: client {} until {:?} after client {} began",
                a.resource,
                a.client,
                a.to - b.from,
                b.client,
            );
        }
    }

    fn summary(&self) -> String {
        let refused = |kind: &str| self.refused.iter().filter(|k| **k == kind).count();
        format!(
            "{} holds, 0 overlaps; longest try_lock {:?} (bound {TRY_BOUND:?}), lock_until {:?} \
             (bound {WAIT_BOUND:?}), unlock {:?} (bound {UNLOCK_BOUND:?}); refused: {} held, {} \
             no quorum, {} too slow",
            self.holds.len(),
            self.longest("try_lock"),
            self.longest("lock_until"),
            self.longest("unlock"),
            refused("held"),
            refused("no quorum"),
            refused("too slow"),
        )
    }
}

/// Contenders, one thread each, until stopped.
struct Contest {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    threads: Vec<JoinHandle<()>>,
}

impl Contest {
    /// Client `id` (of `clients`) contends for `resource`, for each pair of `who`.
    fn start(clients: &[Handle], who: &[(usize, &'static str)]) -> Contest {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let threads = who
            .iter()
            .map(|&(id, resource)| {
                let (h, stop, log) = (clients[id].clone(), stop.clone(), log.clone());
                thread::spawn(move || contend(id, &h, resource, &stop, &log))
            })
            .collect();
        Contest { stop, log, threads }
    }

    fn holds_between(&self, from: Instant, to: Instant) -> usize {
        self.log.lock().unwrap().holds_between(from, to)
    }

    /// When the first hold since `since` began.
    fn first_hold(&self, since: Instant) -> Option<Instant> {
        let log = self.log.lock().unwrap();
        log.holds
            .iter()
            .map(|h| h.from)
            .filter(|&t| t >= since)
            .min()
    }

    /// Waits until `n` holds have begun since `since`.
    fn wait_holds(&self, n: usize, since: Instant) -> Instant {
        wait_until(&format!("{n} holds"), Instant::now() + LONG, || {
            self.holds_between(since, since + LONG) >= n
        })
    }

    fn stop(self) -> Log {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.log)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// One contender: waiting acquires and single attempts in turn, each hold released.
fn contend(id: usize, h: &Handle, resource: &'static str, stop: &AtomicBool, log: &Mutex<Log>) {
    let mut waiting = false;
    while !stop.load(Ordering::SeqCst) {
        waiting = !waiting;
        let at = Instant::now();
        let got = if waiting {
            let got = h.lock_until(resource, at + WAIT);
            log.lock()
                .unwrap()
                .call("lock_until", id, at.elapsed(), WAIT_BOUND);
            got
        } else {
            let got = h.try_lock(resource);
            log.lock()
                .unwrap()
                .call("try_lock", id, at.elapsed(), TRY_BOUND);
            got
        };
        match got {
            Ok(lock) => {
                let from = Instant::now();
                thread::sleep(HOLD.min(lock.validity()));
                let to = Instant::now().min(lock.valid_until());
                let at = Instant::now();
                let _ = h.unlock(lock);
                let mut log = log.lock().unwrap();
                log.call("unlock", id, at.elapsed(), UNLOCK_BOUND);
                log.holds.push(Hold {
                    client: id,
                    resource,
                    from,
                    to,
                });
            }
            Err(e) => {
                let kind = match e {
                    Error::Held(_) => "held",
                    Error::NoQuorum(_) => "no quorum",
                    Error::TooSlow(_) => "too slow",
                    other => panic!("client {id}: {other}"),
                };
                log.lock().unwrap().refused.push(kind);
                if !waiting {
                    thread::sleep(PAUSE);
                }
            }
        }
    }
}

/// Waits until `what` holds, at most until `deadline`; returns when it did.
fn wait_until(label: &str, deadline: Instant, mut what: impl FnMut() -> bool) -> Instant {
    loop {
        if what() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "not within the bound: {label}");
        thread::sleep(POLL);
    }
}

/// How one client's counters of node `i` moved between two snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Moved {
    connects: u64,
    downs: u64,
    reconnects: u64,
}

fn moved(before: &Stats, after: &Stats, i: usize) -> Moved {
    let (b, a) = (&before.nodes[i], &after.nodes[i]);
    Moved {
        connects: a.connects - b.connects,
        downs: a.downs - b.downs,
        reconnects: a.reconnects - b.reconnects,
    }
}

/// A fault on some nodes for a while, with two clients contending, then healed.
struct Scenario {
    nodes: usize,
    faulty: &'static [usize],
    fault: fn(&Relay),
    /// How long the fault lasts before the heal.
    lasting: Duration,
    /// From the heal to the faulty nodes' next answers (one node), or to the next grant (a
    /// majority).
    recovery_bound: Duration,
    /// The fault is on before the clients first connect.
    fresh: bool,
    /// The faulty nodes' connections do not survive it: recovery needs every client to
    /// reconnect to each of them (an answer or a grant alone may come from a reply that was on
    /// its way when the fault began).
    reconnect: bool,
    /// Client 0 keeps a lock of its own from before the fault, which client 1 waits for.
    keep: bool,
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            nodes: 3,
            faulty: &[0],
            fault: Relay::black_hole,
            lasting: FAULT,
            recovery_bound: RECOVERY_AFTER_HUNG_CONNECTS,
            fresh: false,
            reconnect: true,
            keep: false,
        }
    }
}

/// What a scenario measured.
struct Outcome {
    log: Log,
    /// From the heal to the faulty nodes' next answers, or to the next grant.
    recovered: Duration,
    /// The most that one client's counters of one faulty node moved from the fault to the end.
    moved: Moved,
    /// Holds that began during the fault (an attempt's node timeout after it began, so that
    /// none decided before it counts).
    holds_during: usize,
    /// Holds that began from then until the recovery.
    holds_to_recovery: usize,
    /// The kept lock: whether it was lost, and renewals won from the fault to the end.
    kept_lost: Option<bool>,
    renewed: u64,
    /// Why the kept lock was lost, and when (from the start of the fault).
    kept_why: Option<(Duration, String)>,
    /// `poll` calls of the busier client's event loop per second, from the fault to the end.
    polls_per_s: u64,
}

impl Scenario {
    fn run(&self) -> Outcome {
        let net = Net::start(self.nodes);
        let majority = self.faulty.len() * 2 > self.nodes;
        if self.fresh {
            net.each(self.faulty, self.fault);
        }
        let clients = [Handle::blocking(net.urls()), Handle::async_(net.urls())];
        let healthy = self.nodes - if self.fresh { self.faulty.len() } else { 0 };
        for c in &clients {
            let at = Instant::now();
            assert_eq!(c.redlock().connect(LONG).unwrap(), healthy, "connected");
            if self.fresh {
                // A connect that never completes is given up at its timeout.
                assert!(
                    at.elapsed() <= CONNECT_TIMEOUT + SLACK,
                    "{:?}",
                    at.elapsed()
                );
            }
        }
        let kept = self.keep.then(|| {
            let redlock = clients[0].redlock();
            let lock = redlock.lock("k").unwrap();
            // Held on every reachable node before the rival starts: `lock` returns at a quorum, and its
            // last `SET` lands a moment later (nothing else wants `k` yet). Without the wait, a
            // rival's `SET` that overtook it in a loaded relay took that node, and a lock backed
            // by two nodes, one of them the faulty one, could not be renewed: not the fault of
            // one node of three this scenario is about.
            let token = lock.token().to_string();
            let until = Instant::now() + LONG;
            let reachable = |i: &usize| !(self.fresh && self.faulty.contains(i));
            let missing = || {
                (0..self.nodes)
                    .filter(reachable)
                    .any(|i| net.servers[i].get("k").as_deref() != Some(token.as_str()))
            };
            while missing() {
                assert!(
                    Instant::now() < until,
                    "the kept lock never reached every node"
                );
                std::thread::sleep(POLL);
            }
            (Instant::now(), redlock.keep(lock).unwrap())
        });
        let mut who = vec![(0, "r"), (1, "r")];
        if self.keep {
            who.push((1, "k"));
        }
        let contest = Contest::start(&clients, &who);
        if !(self.fresh && majority) {
            contest.wait_holds(2, Instant::now());
        }
        let before: Vec<Stats> = clients.iter().map(Handle::stats).collect();
        let fault_at = Instant::now();
        if !self.fresh {
            net.each(self.faulty, self.fault);
        }
        // The fault lasts its time: wall-clock time is what it is made of.
        thread::sleep(self.lasting);
        let answered: Vec<Vec<u64>> = clients
            .iter()
            .map(|c| self.faulty.iter().map(|&i| c.answers(i)).collect())
            .collect();
        let heal_at = Instant::now();
        net.each(self.faulty, Relay::heal);
        // After a majority fault, a grant means recovery once no attempt begun before the fault
        // can still be deciding.
        let grants_from = heal_at.max(fault_at + TRY_BOUND);
        let back = wait_until(
            "the faulty nodes answer again",
            heal_at + self.recovery_bound,
            || {
                let reconnected = !self.reconnect
                    || clients.iter().zip(&before).all(|(c, before)| {
                        let now = c.stats();
                        self.faulty
                            .iter()
                            .all(|&i| moved(before, &now, i).reconnects > 0)
                    });
                reconnected
                    && if majority {
                        contest.holds_between(grants_from, heal_at + LONG) > 0
                    } else {
                        clients.iter().zip(&answered).all(|(c, before)| {
                            self.faulty
                                .iter()
                                .zip(before)
                                .all(|(&i, &n)| c.answers(i) > n)
                        })
                    }
            },
        );
        // The first grant, not when it was seen.
        let back = if majority {
            contest.first_hold(grants_from).unwrap_or(back)
        } else {
            back
        };
        // A healthy stretch after the recovery.
        contest.wait_holds(2, back);
        let after: Vec<Stats> = clients.iter().map(Handle::stats).collect();
        let after_at = Instant::now();
        let kept_why = kept.as_ref().and_then(|(_, kept)| {
            let at = kept.lost_at()?;
            let why = kept.lost().map(|e| e.to_string()).unwrap_or_default();
            Some((at.saturating_duration_since(fault_at), why))
        });
        let (kept_lost, renewed, kept_hold) = match kept {
            Some((from, kept)) => {
                let lost = kept.lost_at();
                let to = lost
                    .unwrap_or_else(Instant::now)
                    .min(kept.lock().valid_until());
                let _ = kept.release();
                let renewed = after[0].keep.extended - before[0].keep.extended;
                let hold = Hold {
                    client: 0,
                    resource: "k",
                    from,
                    to,
                };
                (Some(lost.is_some()), renewed, Some(hold))
            }
            None => (None, 0, None),
        };
        let mut log = contest.stop();
        log.holds.extend(kept_hold);
        log.assert_bounds();
        log.assert_no_overlap();
        // Nothing of ours left on any server once every release is confirmed, but for one
        // kind of key: a request written on a connection the client gave up may still be in
        // the network (TCP delivers what was sent before the close; the relay too) and land
        // after the release that went out on the next connection. Such a key is no one's
        // lock and lasts at most a TTL; only a node a client opened a second socket to can
        // have one.
        let sockets: Vec<u64> = (0..self.nodes)
            .map(|i| {
                clients
                    .iter()
                    .map(|c| c.stats().nodes[i].connects)
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for c in &clients {
            let shutdown = c.redlock().shutdown(LONG);
            assert_eq!(shutdown.unconfirmed, 0, "{shutdown:?}");
        }
        for (i, s) in net.servers.iter().enumerate() {
            for key in ["r", "k"] {
                // -2: no such key.
                let pttl = s.pttl(key);
                if pttl != -2 {
                    assert!(
                        sockets[i] > 1 && pttl > 0 && pttl <= TTL.as_millis() as i64,
                        "{key} left on node {i} (PTTL {pttl} ms; sockets per node {sockets:?})"
                    );
                }
            }
        }
        let mut most = Moved::default();
        for (c, (b, a)) in before.iter().zip(&after).enumerate() {
            for i in 0..self.nodes {
                let m = moved(b, a, i);
                if self.faulty.contains(&i) {
                    most = most.max(m);
                } else {
                    assert_eq!(m, Moved::default(), "client {c}, healthy node {i}");
                }
            }
        }
        // From the fault to the end: the fault, the recovery and a healthy stretch.
        let span = (after_at - fault_at).as_secs_f64();
        let polls_per_s = before
            .iter()
            .zip(&after)
            .map(|(b, a)| ((a.io.polls - b.io.polls) as f64 / span) as u64)
            .max()
            .unwrap_or(0);
        Outcome {
            holds_during: log.holds_between(fault_at + TRY_BOUND, heal_at),
            holds_to_recovery: log.holds_between(fault_at + TRY_BOUND, back),
            log,
            recovered: back - heal_at,
            moved: most,
            kept_lost,
            kept_why,
            renewed,
            polls_per_s,
        }
    }
}

/// Most `poll` calls per second of a client's event loop from a fault to the end of a run. Each turn of the loop
/// is a reply, a request handed over or a timer (a node timeout, a retry pause, a connect or
/// reply deadline): two contenders make at most a few hundred a second. A loop that spun on a
/// dead socket or a past deadline would make tens of thousands.
const POLLS_PER_S_BOUND: u64 = 5_000;

impl Outcome {
    /// Prints the figures and asserts what every scenario owes: bounded connects (the connects
    /// during the fault, and one more after the heal) and no spinning loop.
    fn check(&self, name: &str, scenario: &Scenario) {
        eprintln!(
            "{name}: {}; {} holds during the fault, {} until the recovery; worst faulty node: {} connects, {} downs, \
             {} reconnects (bound {} connects); {} polls/s; answered again {:?} after the heal \
             (bound {:?}){}",
            self.log.summary(),
            self.holds_during,
            self.holds_to_recovery,
            self.moved.connects,
            self.moved.downs,
            self.moved.reconnects,
            connects_bound(scenario.lasting),
            self.polls_per_s,
            self.recovered,
            scenario.recovery_bound,
            match self.kept_lost {
                Some(true) => match &self.kept_why {
                    Some((at, why)) =>
                        format!("; the kept lock lost {at:?} after the fault: {why}"),
                    None => "; the kept lock lost".to_string(),
                },
                Some(false) => format!(
                    "; the kept lock renewed {} times from the fault to the end",
                    self.renewed
                ),
                None => String::new(),
            }
        );
        assert!(
            self.moved.connects <= connects_bound(scenario.lasting),
            "{} connects to a faulty node",
            self.moved.connects
        );
        assert!(
            self.polls_per_s <= POLLS_PER_S_BOUND,
            "{} polls/s",
            self.polls_per_s
        );
    }
}

#[test]
fn a_black_hole_on_one_node_of_three_costs_no_lock_and_heals_within_a_connect_and_a_backoff() {
    let scenario = Scenario {
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("black hole, 1 of 3", &scenario);
    assert!(
        out.holds_during > 0,
        "no lock granted by the two live nodes"
    );
    assert_eq!(out.kept_lost, Some(false), "the kept lock was lost");
    assert!(out.renewed > 0, "the kept lock was not renewed");
}

#[test]
fn a_black_hole_on_three_nodes_of_five_grants_nothing_hangs_nothing_and_heals() {
    let scenario = Scenario {
        nodes: 5,
        faulty: &[0, 1, 2],
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("black hole, 3 of 5", &scenario);
    assert_eq!(out.holds_during, 0);
    assert_eq!(
        out.kept_lost,
        Some(true),
        "the kept lock outlived its validity"
    );
}

/// Both directions held: the partition TCP outlives, whose bytes arrive late at the heal.
fn partition(relay: &Relay) {
    relay.set_flow(Direction::ToServer, Flow::Hold);
    relay.set_flow(Direction::ToClient, Flow::Hold);
}

#[test]
fn a_partition_of_two_nodes_of_three_shorter_than_the_connect_timeout_is_outlived_by_the_connections()
 {
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: partition,
        lasting: BLIP,
        recovery_bound: RECOVERY_AFTER_BLIP,
        reconnect: false,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("partition of 2 of 3 for 0.4 s", &scenario);
    assert_eq!(out.holds_during, 0);
    // The late replies were matched to their own requests: no reconnect at all.
    assert_eq!(out.moved, Moved::default());
}

#[test]
fn a_partition_of_two_nodes_of_three_longer_than_the_reply_timeout_heals_and_its_late_sets_are_released()
 {
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: Relay::partition,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("partition of 2 of 3 for 4 s", &scenario);
    assert_eq!(out.holds_during, 0);
    assert_eq!(
        out.kept_lost,
        Some(true),
        "the kept lock outlived its validity"
    );
}

/// Requests dropped: nothing runs; what the server sends still arrives.
fn requests_lost(relay: &Relay) {
    relay.set_flow(Direction::ToServer, Flow::Drop);
}

/// Replies dropped: requests run, their answers are lost.
fn replies_lost(relay: &Relay) {
    relay.set_flow(Direction::ToClient, Flow::Drop);
}

#[test]
fn requests_lost_one_way_on_two_nodes_of_three_grant_nothing_and_heal() {
    // New connections complete (the relay takes them) but their handshakes are lost: each
    // connect ends at its connect timeout, as a hung one does.
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: requests_lost,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("requests lost, 2 of 3", &scenario);
    assert_eq!(out.holds_during, 0);
    assert_eq!(
        out.kept_lost,
        Some(true),
        "the kept lock outlived its validity"
    );
}

#[test]
fn replies_lost_one_way_on_two_nodes_of_three_grant_nothing_and_leave_nothing() {
    // The servers run every request and the clients hear nothing: the keys they set are
    // deleted by the releases, which pass.
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: replies_lost,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("replies lost, 2 of 3", &scenario);
    assert_eq!(out.holds_during, 0);
    assert_eq!(
        out.kept_lost,
        Some(true),
        "the kept lock outlived its validity"
    );
}

#[test]
fn replies_lost_one_way_on_one_node_of_three_cost_no_lock() {
    let scenario = Scenario {
        fault: replies_lost,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("replies lost, 1 of 3", &scenario);
    assert!(
        out.holds_during > 0,
        "no lock granted by the two live nodes"
    );
    assert_eq!(out.kept_lost, Some(false), "the kept lock was lost");
    assert!(out.renewed > 0, "the kept lock was not renewed");
}

/// Half-opens the connections: the servers' sides closed, the clients' left silent.
fn sever(relay: &Relay) {
    relay.sever();
}

#[test]
fn a_half_open_connection_to_one_node_of_three_is_reset_by_the_reply_timeout_and_made_once_again() {
    // The fault is the instant of the sever: the connection is dead from then on, and the
    // recovery is counted from it.
    let scenario = Scenario {
        fault: sever,
        lasting: Duration::ZERO,
        recovery_bound: RECOVERY_AFTER_DEAD_CONNECTION,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("half open, 1 of 3", &scenario);
    assert!(
        out.holds_to_recovery > 0,
        "no lock granted by the two live nodes"
    );
    assert_eq!(out.kept_lost, Some(false), "the kept lock was lost");
    // One connect per client, at once after the reset: no backoff, no second attempt.
    assert_eq!(
        out.moved,
        Moved {
            connects: 1,
            downs: 1,
            reconnects: 1
        }
    );
}

#[test]
fn half_open_connections_to_two_nodes_of_three_grant_nothing_until_a_lost_round_has_them_reset() {
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: sever,
        lasting: Duration::ZERO,
        recovery_bound: RECOVERY_AFTER_DEAD_CONNECTION,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("half open, 2 of 3", &scenario);
    assert_eq!(
        out.moved,
        Moved {
            connects: 1,
            downs: 1,
            reconnects: 1
        }
    );
}

/// The slow drip's interval: one byte per 10 ms, a 5-byte reply in 40 ms, a handshake's
/// replies (a few kB of `INFO`) in tens of seconds.
const DRIP: Duration = Duration::from_millis(10);

fn replies_dripped(relay: &Relay) {
    relay.set_flow(Direction::ToClient, Flow::Drip(DRIP));
}

fn requests_dripped(relay: &Relay) {
    relay.set_flow(Direction::ToServer, Flow::Drip(DRIP));
}

#[test]
fn replies_dripped_by_one_node_of_three_cost_no_lock() {
    let scenario = Scenario {
        fault: replies_dripped,
        reconnect: false,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("replies dripped, 1 of 3", &scenario);
    assert!(
        out.holds_during > 0,
        "no lock granted by the two live nodes"
    );
    assert_eq!(out.kept_lost, Some(false), "the kept lock was lost");
}

#[test]
fn replies_dripped_by_two_nodes_of_three_grant_no_lock_that_outlives_its_validity() {
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: replies_dripped,
        reconnect: false,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("replies dripped, 2 of 3", &scenario);
}

#[test]
fn requests_dripped_to_two_nodes_of_three_grant_no_lock_that_outlives_its_validity() {
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: requests_dripped,
        reconnect: false,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("requests dripped, 2 of 3", &scenario);
}

fn connects_hang(relay: &Relay) {
    relay.set_connects(Connects::Hang);
}

#[test]
fn a_node_whose_connects_never_complete_is_not_waited_for_and_joins_once_they_do() {
    let scenario = Scenario {
        fault: connects_hang,
        fresh: true,
        keep: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("connects hang, 1 of 3, from the start", &scenario);
    assert!(
        out.holds_during > 0,
        "no lock granted by the two live nodes"
    );
    assert_eq!(out.kept_lost, Some(false), "the kept lock was lost");
}

#[test]
fn connects_to_two_nodes_of_three_that_never_complete_grant_nothing_until_they_do() {
    let scenario = Scenario {
        faulty: &[0, 1],
        fault: connects_hang,
        fresh: true,
        ..Scenario::default()
    };
    let out = scenario.run();
    out.check("connects hang, 2 of 3, from the start", &scenario);
    assert_eq!(out.holds_during, 0);
}

/// Renewals that the servers run but whose answers are lost: a partition between one client and
/// a majority of the servers, replies only. The holder cannot know that its keys were extended;
/// its rival, which reaches the servers, waits for them to expire.
#[test]
fn renewals_run_but_unanswered_lose_the_kept_lock_in_time_and_its_rival_waits_out_the_keys() {
    let net = Net::start(3);
    let a = Handle::blocking(net.urls());
    let b = Handle::blocking(net.servers.urls());
    for c in [&a, &b] {
        assert_eq!(c.redlock().connect(LONG).unwrap(), 3, "connected");
    }
    let lock = a.redlock().lock("k").unwrap();
    let from = Instant::now();
    let kept = a.redlock().keep(lock).unwrap();
    let contest = Contest::start(&[a.clone(), b.clone()], &[(1, "k")]);
    wait_until("a renewal", Instant::now() + LONG, || {
        a.stats().keep.extended > 0
    });
    let fault_at = Instant::now();
    net.each(&[0, 1], replies_lost);
    // Lost by the end of its validity, which the last renewal that won set at most a TTL ahead.
    assert!(
        kept.wait_lost(TTL + SLACK).is_some(),
        "the kept lock outlived its validity"
    );
    let lost_at = kept.lost_at().unwrap();
    let valid_until = kept.lock().valid_until();
    assert!(lost_at <= valid_until);
    // The renewals that ran last were sent no later than the loss: the keys expire within a
    // TTL of it; the rival's next attempt comes within a poll and is decided within a node
    // timeout.
    let bound = TTL
        .saturating_add(NEXT_REQUEST)
        .saturating_add(NODE_TIMEOUT)
        .saturating_add(SLACK);
    wait_until("the rival holds the lock", lost_at + bound, || {
        contest.first_hold(fault_at).is_some()
    });
    let granted = contest.first_hold(fault_at).unwrap();
    // The holder ends its lost lock only now: its release leaves the rival's key alone.
    let _ = kept.release();
    net.each(&[0, 1], Relay::heal);
    let mut log = contest.stop();
    log.holds.push(Hold {
        client: 0,
        resource: "k",
        from,
        to: lost_at.min(valid_until),
    });
    log.assert_bounds();
    log.assert_no_overlap();
    eprintln!(
        "renewals unanswered by 2 of 3: the kept lock lost {:?} after the fault began; the rival \
         granted {:?} after the loss (bound {bound:?}); {}",
        lost_at - fault_at,
        granted - lost_at,
        log.summary()
    );
}

/// A TTL far longer than the wait for the release below: the key must be seen released, not
/// expired.
const KEY_TTL: Duration = Duration::from_secs(30);
/// A node timeout long enough for the test to see the servers run the acquire and to sever
/// their connections before the lost attempt sends its release.
const SLOW_NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// The server ran the command whose connection then went half open: the acquire's `SET` ran on
/// two nodes, its replies were lost, and the servers' sides were closed before its release
/// arrived. The release is kept for those nodes and sent once the reply timeout has reset the
/// dead connections, long before the key's TTL.
#[test]
fn an_acquire_run_by_servers_whose_connections_then_went_half_open_is_released_after_the_reset() {
    let net = Net::start(3);
    let redlock = builder(net.urls())
        .ttl(KEY_TTL)
        .node_timeout(SLOW_NODE_TIMEOUT)
        .build()
        .unwrap();
    assert_eq!(redlock.connect(LONG).unwrap(), 3, "connected");
    let ran = |i: usize| net.servers[i].get("ran").is_some();
    net.each(&[0, 1], replies_lost);
    let sent = Instant::now();
    let attempt = {
        let redlock = redlock.clone();
        thread::spawn(move || redlock.try_lock("ran"))
    };
    wait_until(
        "nodes 0 and 1 ran the SET",
        sent + SLOW_NODE_TIMEOUT,
        || ran(0) && ran(1),
    );
    net.each(&[0, 1], sever);
    // New connections are whole again; the severed ones stay dead.
    net.each(&[0, 1], Relay::heal);
    match attempt.join().unwrap() {
        Err(Error::NoQuorum(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(ran(0) && ran(1), "the release reached a severed node");
    // The SET unanswered for the reply timeout resets its connection; the new one comes up at
    // once and carries the release.
    let bound = REPLY_TIMEOUT
        .saturating_add(NODE_TIMEOUT)
        .saturating_add(SLACK);
    let released = wait_until("the keys released", sent + bound, || !ran(0) && !ran(1));
    let shutdown = redlock.shutdown(LONG);
    assert_eq!(shutdown.unconfirmed, 0, "{shutdown:?}");
    eprintln!(
        "acquire run, then half open, 2 of 3: released {:?} after it was sent (bound {bound:?}), \
         its TTL {KEY_TTL:?}",
        released - sent
    );
}

/// The drift allowance the client takes off every validity: 1 % of the TTL and 2 ms.
const DRIFT: Duration = Duration::from_millis(TTL.as_millis() as u64 / 100 + 2);
/// How long a dripped `+OK\r\n` takes at least: five bytes, four gaps.
const DRIP_OK: Duration = DRIP.saturating_mul(4);
/// Acquires through a drip: enough to see a few, few enough to stay quick (each takes 40 ms).
const DRIPPED_ACQUIRES: usize = 10;

#[test]
fn replies_dripped_byte_by_byte_are_reassembled_and_the_validity_counts_from_before_the_request() {
    let net = Net::start(3);
    let redlock = builder(net.urls()).build().unwrap();
    assert_eq!(redlock.connect(LONG).unwrap(), 3, "connected");
    net.each(&[0, 1, 2], replies_dripped);
    let mut slowest = Duration::ZERO;
    for _ in 0..DRIPPED_ACQUIRES {
        let sent = Instant::now();
        let lock = redlock.try_lock("drip").unwrap();
        let returned = Instant::now();
        let took = returned - sent;
        slowest = slowest.max(took);
        // `+OK\r\n`: five bytes, four gaps. A lower bound, which load only lengthens.
        assert!(took >= DRIP_OK, "{took:?}");
        assert!(took <= TRY_BOUND, "{took:?}");
        // The requests went out at least a dripped reply before the return: a validity counted
        // from them, less the drift allowance, ends that much before one counted from the
        // replies would.
        assert!(
            lock.valid_until() + DRIP_OK <= returned + TTL - DRIFT,
            "the validity counted from the replies: it ends {:?} after the return",
            lock.valid_until() - returned
        );
        assert!(redlock.unlock(lock).unwrap() >= 2);
    }
    eprintln!("replies dripped by 3 of 3: every acquire granted, the slowest in {slowest:?}");
}

/// The TTL of the kept lock below, and the fraction of it left when it is renewed: a renewal
/// lost is tried again after a backoff doubling from the node timeout up to a tenth of the TTL
/// (0.2, 0.4, 0.8, 1 s), while half the renewal margin (10 s × 0.9 / 2 = 4.5 s) is left; the
/// reply timeout resets the dead connections 2 s after the first renewal went unanswered, and
/// a retry comes after that within the margin.
const KEPT_TTL: Duration = Duration::from_secs(10);
/// See [`KEPT_TTL`]: renewed early, so that the renewal comes 1 s after the acquire.
const RENEW_FRACTION: f64 = 0.9;

/// A kept lock's renewals sent into half-open connections to a majority go unanswered until the
/// reply timeout resets those connections; a renewal tried again after that, within half the
/// renewal margin, reconnects and wins.
#[test]
fn a_kept_lock_outlives_half_open_connections_to_a_majority_when_a_retry_follows_the_reset() {
    let net = Net::start(3);
    let redlock = builder(net.urls())
        .ttl(KEPT_TTL)
        .renew_fraction(RENEW_FRACTION)
        .build()
        .unwrap();
    assert_eq!(redlock.connect(LONG).unwrap(), 3, "connected");
    let kept = redlock.keep(redlock.lock("k").unwrap()).unwrap();
    wait_until("a renewal", Instant::now() + LONG, || {
        redlock.stats().keep.extended > 0
    });
    let before = redlock.stats();
    let severed_at = Instant::now();
    net.each(&[0, 1], sever);
    let renewed = wait_until(
        "a renewal won on new connections",
        severed_at + KEPT_TTL,
        || {
            let now = redlock.stats();
            (0..2).all(|i| moved(&before, &now, i).reconnects > 0)
                && now.keep.extended > before.keep.extended
        },
    );
    assert!(kept.is_held(), "lost: {:?}", kept.lost());
    let retried = redlock.stats().keep.retried - before.keep.retried;
    assert_eq!(kept.release().unwrap(), 3);
    eprintln!(
        "kept lock, half open to 2 of 3: renewed on new connections {:?} after the sever, \
         {retried} renewals tried again; held throughout",
        renewed - severed_at
    );
}

/// The default settings with the TTL, the reply timeout and the connect timeout scaled down
/// together (30 s, 5 s and 1 s by a fifth), so that a renewal comes within seconds: renewed
/// with a third of the TTL left (2 s), tried again while half of that is left (1 s), the reply
/// timeout as long as that.
const DEFAULTS_TTL: Duration = Duration::from_secs(6);
/// See [`DEFAULTS_TTL`]: the default 5 s scaled as the TTL is.
const DEFAULTS_REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// See [`DEFAULTS_TTL`]: the default 1 s scaled as the TTL is.
const DEFAULTS_CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// With the defaults' proportions, a kept lock survives half-open connections to a majority
/// (the servers reachable on new connections all along). The reply timeout alone would reset
/// those connections no earlier than the end of the window in which a renewal may still be
/// tried (`reply_timeout` 5 s, half the renewal margin of a 30 s TTL 5 s), and the lock was
/// lost so; now the first renewal lost for want of their votes hurries them: each is failed a
/// connect timeout after its oldest unanswered request and made again, and the renewal tried
/// again on the new connections wins, with most of the window left.
#[test]
fn a_kept_lock_outlives_half_open_connections_to_a_majority_with_the_default_proportions() {
    let net = Net::start(3);
    let redlock = Builder::new(net.urls())
        .quarantine(None)
        .client_name("network-faults")
        .ttl(DEFAULTS_TTL)
        .reply_timeout(DEFAULTS_REPLY_TIMEOUT)
        .connect_timeout(DEFAULTS_CONNECT_TIMEOUT)
        .build()
        .unwrap();
    assert_eq!(redlock.connect(LONG).unwrap(), 3, "connected");
    let kept = redlock.keep(redlock.lock("k").unwrap()).unwrap();
    let before = redlock.stats();
    net.each(&[0, 1], sever);
    // Past the renewal (two thirds of the TTL in) and the window for its retries.
    let lost = kept.wait_lost(DEFAULTS_TTL);
    let after = redlock.stats();
    assert!(
        lost.is_none(),
        "lost: {lost:?}; renewals won {}, tried again {}; reconnects to nodes 0 and 1: {}, {}",
        after.keep.extended - before.keep.extended,
        after.keep.retried - before.keep.retried,
        moved(&before, &after, 0).reconnects,
        moved(&before, &after, 1).reconnects,
    );
}

/// With the default settings, a `lock` that begins on half-open connections to every node —
/// an idle client behind a NAT or a load balancer that dropped its flows without a FIN or a
/// RST — is granted within its wait (4 s), every server being reachable on a new connection.
/// The reply timeout (5 s) alone came too late, and such a `lock` failed after its whole wait;
/// now its first attempt, lost for want of the silent nodes' votes, hurries their
/// connections: failed a connect timeout (1 s) after the attempt and made again, and an attempt
/// after that is granted. Bound: the connect timeout, then a retry pause (at most 400 ms), a
/// reconnect and one round: 1.5 s with loopback's round trips.
#[test]
fn a_lock_begun_on_half_open_connections_to_every_node_is_granted_within_its_wait() {
    let net = Net::start(3);
    let redlock = Builder::new(net.urls())
        .quarantine(None)
        .client_name("network-faults")
        .build()
        .unwrap();
    assert_eq!(redlock.connect(LONG).unwrap(), 3, "connected");
    let lock = redlock.lock("idle").unwrap();
    redlock.unlock(lock).unwrap();
    net.each(&[0, 1, 2], sever);
    let began = Instant::now();
    let got = redlock.lock("idle");
    let took = began.elapsed();
    assert!(
        got.is_ok(),
        "{:?} after {took:?}, every server reachable on a new connection",
        got.err(),
    );
    eprintln!("lock begun on half-open connections to every node: granted after {took:?}");
}

/// How long `status` and `shutdown` are given below: their own bounds are what they are given.
const GIVEN: Duration = Duration::from_millis(500);

/// Runs `f`, asserting that it returns within `bound`; returns its value and how long it took.
fn timed<R>(what: &str, bound: Duration, f: impl FnOnce() -> R) -> (R, Duration) {
    let at = Instant::now();
    let r = f();
    let took = at.elapsed();
    assert!(took <= bound, "{what} took {took:?}, bound {bound:?}");
    (r, took)
}

/// The rest of the API in a black hole on a majority: nothing hangs, nothing claims what it
/// did not get.
#[test]
fn extend_status_release_shutdown_and_drop_return_within_their_bounds_in_a_black_hole() {
    let net = Net::start(3);
    let redlock = builder(net.urls()).build().unwrap();
    assert_eq!(redlock.connect(LONG).unwrap(), 3, "connected");
    let mut lock = redlock.lock("x").unwrap();
    let guard = redlock.guard("g").unwrap();
    let kept = redlock.keep(redlock.lock("k").unwrap()).unwrap();
    net.each(&[0, 1], Relay::black_hole);
    let valid_until = lock.valid_until();
    let (extended, extend_took) = timed("extend", TRY_BOUND, || redlock.extend(&mut lock, TTL));
    assert!(matches!(extended, Err(Error::NoQuorum(_))), "{extended:?}");
    assert!(
        lock.valid_until() <= valid_until,
        "a failed extend added validity"
    );
    let (status, status_took) = timed("status", GIVEN + SLACK, || redlock.status(b"x", GIVEN));
    assert!(status[0].state.is_err() && status[1].state.is_err());
    assert!(status[2].state.is_ok());
    // A guard's release is queued, never waited for.
    let (_, guard_took) = timed("dropping a guard", SLACK, || drop(guard));
    let (unlocked, unlock_took) = timed("unlock", UNLOCK_BOUND, || redlock.unlock(lock));
    assert!(matches!(unlocked, Ok(1) | Err(_)), "{unlocked:?}");
    let (released, release_took) = timed("releasing a kept lock", UNLOCK_BOUND, || kept.release());
    assert!(matches!(released, Ok(1) | Err(_)), "{released:?}");
    let (shutdown, shutdown_took) = timed("shutdown", GIVEN + SLACK, || redlock.shutdown(GIVEN));
    assert!(shutdown.unconfirmed > 0, "{shutdown:?}");
    // The last handle's drop flushes in the background.
    let (_, drop_took) = timed("dropping the handle", SLACK, || drop(redlock));
    eprintln!(
        "black hole, 2 of 3: extend {extend_took:?}, status {status_took:?} (given {GIVEN:?}), \
         guard drop {guard_took:?}, unlock {unlock_took:?}, kept release {release_took:?}, \
         shutdown {shutdown_took:?} (given {GIVEN:?}, {} unconfirmed), handle drop {drop_took:?}",
        shutdown.unconfirmed
    );
}
