//! Network faults against real servers, through fault relays (`redis_local::Relay`; this kernel
//! has no netem): a black hole, a partition that heals, one-way loss, half-open connections, a
//! slow drip and connects that never complete — on one node, then on a majority.
//!
//! Every test runs two clients contending for one resource (one blocking handle, one async) and
//! checks, from their records on the monotonic clock:
//! - no two holders at once: the interval from each acquire's return to the earlier of its
//!   validity's end and its unlock never meets another's;
//! - no hang: every call returns within a bound derived from the settings below;
//! - recovery: once the fault heals, the node answers again (or, after a majority fault, a lock
//!   is granted) within a bound derived from the same settings;
//! - no reconnect storm: connects to a faulty node bounded by its connect timeout and backoff.
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
use redis_local::{Cluster, Relay};
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
/// Reconnect backoff after a failed connect, doubling from the first to the last: the default.
const BACKOFF_MIN: Duration = Duration::from_millis(25);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A request unanswered this long resets its connection: shorter than the default 5 s, so that
/// a fault of a few seconds outlasts it and every run goes through the reset and the reconnects
/// after it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// A waiting caller's fallback poll and its jitter: the defaults.
const RETRY_DELAY: Duration = Duration::from_millis(200);
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
/// Connects to a faulty node during `d`: one at once when the reply timeout resets the dead
/// connection (it had worked: no backoff), one under way when the fault began, and then every
/// connect waits its connect timeout (a hung SYN, or a handshake never answered) before the
/// backoff and the next. A storm would be a connect per request, hundreds a second.
fn connects_bound(d: Duration) -> u64 {
    2 + (d.as_millis() / CONNECT_TIMEOUT.as_millis()) as u64
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

/// The settings above, for `urls`.
fn builder(urls: Vec<String>) -> Builder {
    Builder::new(urls)
        .quarantine(None)
        .ttl(TTL)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .backoff(BACKOFF_MIN, BACKOFF_MAX)
        .reply_timeout(REPLY_TIMEOUT)
        .retry_delay(RETRY_DELAY, RETRY_JITTER)
}

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
    /// Holds that began during the fault.
    holds_during: usize,
    /// The kept lock: whether it was lost, and renewals won during the fault.
    kept_lost: Option<bool>,
    renewed_during: u64,
    /// `poll` calls of the busier client's event loop per second of the fault.
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
        let during: Vec<Stats> = clients.iter().map(Handle::stats).collect();
        let answered: Vec<Vec<u64>> = clients
            .iter()
            .map(|c| self.faulty.iter().map(|&i| c.answers(i)).collect())
            .collect();
        let heal_at = Instant::now();
        net.each(self.faulty, Relay::heal);
        let back = wait_until(
            "the faulty nodes answer again",
            heal_at + self.recovery_bound,
            || {
                if majority {
                    contest.holds_between(heal_at, heal_at + LONG) > 0
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
        // A healthy stretch after the recovery.
        contest.wait_holds(2, back);
        let after: Vec<Stats> = clients.iter().map(Handle::stats).collect();
        let (kept_lost, renewed_during, kept_hold) = match kept {
            Some((from, kept)) => {
                let lost = kept.lost_at();
                let to = lost
                    .unwrap_or_else(Instant::now)
                    .min(kept.lock().valid_until());
                let _ = kept.release();
                let renewed = during[0].keep.extended - before[0].keep.extended;
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
        // Nothing of ours left on any server once every release is confirmed.
        for c in &clients {
            let shutdown = c.redlock().shutdown(LONG);
            assert_eq!(shutdown.unconfirmed, 0, "{shutdown:?}");
        }
        for (i, s) in net.servers.iter().enumerate() {
            for key in ["r", "k"] {
                assert_eq!(s.get(key), None, "{key} left on node {i}");
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
        let fault_s = (heal_at - fault_at).as_secs_f64().max(1e-3);
        let polls_per_s = before
            .iter()
            .zip(&during)
            .map(|(b, d)| ((d.io.polls - b.io.polls) as f64 / fault_s) as u64)
            .max()
            .unwrap_or(0);
        Outcome {
            holds_during: log.holds_between(fault_at + TRY_BOUND, heal_at),
            log,
            recovered: back - heal_at,
            moved: most,
            kept_lost,
            renewed_during,
            polls_per_s,
        }
    }
}

/// Most `poll` calls per second of a client's event loop during a fault. Each turn of the loop
/// is a reply, a request handed over or a timer (a node timeout, a retry pause, a connect or
/// reply deadline): two contenders make at most a few hundred a second. A loop that spun on a
/// dead socket or a past deadline would make tens of thousands.
const POLLS_PER_S_BOUND: u64 = 5_000;

impl Outcome {
    /// Prints the figures and asserts what every scenario owes: bounded connects (the connects
    /// during the fault, and one more after the heal) and no spinning loop.
    fn check(&self, name: &str, scenario: &Scenario) {
        eprintln!(
            "{name}: {}; {} holds during the fault; worst faulty node: {} connects, {} downs, \
             {} reconnects (bound {} connects); {} polls/s; answered again {:?} after the heal \
             (bound {:?}){}",
            self.log.summary(),
            self.holds_during,
            self.moved.connects,
            self.moved.downs,
            self.moved.reconnects,
            connects_bound(scenario.lasting) + 1,
            self.polls_per_s,
            self.recovered,
            scenario.recovery_bound,
            match self.kept_lost {
                Some(true) => "; the kept lock lost".to_string(),
                Some(false) => format!(
                    "; the kept lock renewed {} times during the fault",
                    self.renewed_during
                ),
                None => String::new(),
            }
        );
        assert!(
            self.moved.connects <= connects_bound(scenario.lasting) + 1,
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
    assert!(out.renewed_during > 0, "the kept lock was not renewed");
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
