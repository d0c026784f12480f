//! What every async operation does when its future is dropped — before its first poll, midway,
//! after it completed — checked on real servers: whether each node holds the key, whose token,
//! and for how long. One test per row of the table in `docs/cancellation.md` (its last column
//! names them); the operations that behave alike share a test, one case per operation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use futures::FutureExt;
use redis_local::{Cluster, Relay};
use redlock_mux::{
    AsyncKeepAlive, AsyncLockGuard, AsyncRedlock, Builder, Error, Lock, LockWatch, Redlock,
};

/// The TTL of the locks: long enough that a key's PTTL tells a fresh lock (close to this) from
/// an extended one (`SHORT`), and that no lock expires while a test looks at it.
const TTL: Duration = Duration::from_secs(10);

/// What the extends set: well below `TTL`, so that a node that ran one is told apart.
const SHORT: Duration = Duration::from_secs(2);

/// How long a waiting acquire may wait: longer than any test.
const WAIT: Duration = Duration::from_secs(30);

/// A bound on the waits below (each ends at an event well before).
const BOUND: Duration = Duration::from_secs(10);

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .ttl(TTL)
        // Timing is not what these tests check: room for a loaded machine.
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(5))
}

fn handle(servers: &Cluster) -> AsyncRedlock {
    builder(servers).build_async().unwrap()
}

/// Another handle: its own engine and connections.
fn rival(servers: &Cluster) -> Redlock {
    builder(servers).build().unwrap()
}

/// Connected to every node, so that a count of writes taken now moves only for requests.
fn connected(redlock: &AsyncRedlock) -> u64 {
    assert_eq!(redlock.blocking().connect(BOUND).unwrap(), 3);
    redlock.stats().io.writes
}

/// Each node's copy of `key`: its value, and its PTTL in ms (-2: no key).
fn copies(servers: &Cluster, key: &str) -> Vec<(Option<String>, i64)> {
    servers.iter().map(|s| (s.get(key), s.pttl(key))).collect()
}

/// Every node holds `token` under `key`, expiring within `ttl` (and not yet).
fn assert_held(servers: &Cluster, key: &str, token: &str, ttl: Duration) {
    for (node, (value, pttl)) in copies(servers, key).into_iter().enumerate() {
        assert_eq!(value.as_deref(), Some(token), "node {node}: {key}");
        let ms = i64::try_from(ttl.as_millis()).unwrap();
        assert!(
            0 < pttl && pttl <= ms,
            "node {node}: PTTL {pttl} ms of {key}"
        );
    }
}

/// Flushes every release of `redlock` (waiting for the replies) and checks that no node holds
/// `key`.
fn assert_released(redlock: &AsyncRedlock, servers: &Cluster, key: &str) {
    let report = redlock.blocking().shutdown(BOUND);
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    let left = copies(servers, key);
    assert!(
        left.iter().all(|(value, _)| value.is_none()),
        "{key} left behind (value, PTTL ms, per node): {left:?}"
    );
}

/// A waker that records that it was woken and unparks the thread that made it.
struct Probe {
    woken: AtomicBool,
    thread: Thread,
}

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn probe() -> (Arc<Probe>, Waker) {
    let probe = Arc::new(Probe {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    (probe.clone(), Waker::from(probe))
}

impl Probe {
    /// Parks until woken (true) or `timeout` (false); clears the mark.
    fn wait(&self, timeout: Duration) -> bool {
        let give_up = Instant::now() + timeout;
        while !self.woken.swap(false, Ordering::SeqCst) {
            let now = Instant::now();
            if now >= give_up {
                return false;
            }
            std::thread::park_timeout(give_up - now);
        }
        true
    }
}

/// Polls on this thread, parks between wake-ups.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let (probe, waker) = probe();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        // A bound, not the mechanism: the engine wakes it.
        probe.wait(BOUND);
    }
}

/// Polls `future` once with `waker`.
fn poll<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// Waits (bounded) until `done` holds, looking every millisecond: for what the servers do after
/// a future is gone, which has no event to wait on.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + BOUND;
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// ---------------------------------------------------------------------------------------------
// Acquires: try_lock, lock, lock_until, guard, with_lock (while it acquires)
// ---------------------------------------------------------------------------------------------

/// The acquiring operations, one case each in the tests below.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Acquire {
    TryLock,
    Lock,
    LockUntil,
    Guard,
    WithLock,
}

const ACQUIRES: [Acquire; 5] = [
    Acquire::TryLock,
    Acquire::Lock,
    Acquire::LockUntil,
    Acquire::Guard,
    Acquire::WithLock,
];

/// What an acquire gave.
enum Got {
    Lock(Lock),
    Guard(AsyncLockGuard),
    /// `with_lock` ran its work, which returned the token it held, and released the lock.
    Ran(String),
}

impl Got {
    /// Releases what is held.
    fn let_go(self, redlock: &AsyncRedlock) {
        match self {
            Got::Lock(lock) => drop(block_on(redlock.unlock(lock))),
            Got::Guard(guard) => drop(guard),
            Got::Ran(_) => {}
        }
    }
}

/// The future of `how` on `key`; `ran` is set if `with_lock`'s work runs. The future is the
/// method's own (mapped, which polls nothing more): not wrapped in an `async` block, which
/// would call the method only at the first poll.
fn acquire<'a>(
    redlock: &'a AsyncRedlock,
    how: Acquire,
    key: &'a str,
    ran: &Arc<AtomicBool>,
) -> Boxed<'a, Result<Got, Error>> {
    match how {
        Acquire::TryLock => redlock.try_lock(key).map(|r| r.map(Got::Lock)).boxed(),
        Acquire::Lock => redlock.lock(key).map(|r| r.map(Got::Lock)).boxed(),
        Acquire::LockUntil => redlock
            .lock_until(key, Instant::now() + WAIT)
            .map(|r| r.map(Got::Lock))
            .boxed(),
        Acquire::Guard => redlock.guard(key).map(|r| r.map(Got::Guard)).boxed(),
        Acquire::WithLock => {
            let ran = ran.clone();
            redlock
                .with_lock(key, async move |watch: LockWatch| {
                    ran.store(true, Ordering::SeqCst);
                    watch.lock().token().to_string()
                })
                .map(|r| r.map(Got::Ran).map_err(Error::from))
                .boxed()
        }
    }
}

/// `how` on `key`, polled once and still pending in its acquire: its request is out, no
/// outcome taken. (On a loaded machine the engine's thread can decide it before the first poll
/// returns — and `with_lock` can then have run its work and be waiting for its release; what it
/// won is let go and the acquire made again.)
fn pending<'a>(
    redlock: &'a AsyncRedlock,
    how: Acquire,
    key: &'a str,
    ran: &Arc<AtomicBool>,
    probe: &Arc<Probe>,
) -> Boxed<'a, Result<Got, Error>> {
    let waker = Waker::from(probe.clone());
    for _ in 0..100 {
        let mut attempt = acquire(redlock, how, key, ran);
        let got = match poll(&mut attempt, &waker) {
            Poll::Pending if !ran.load(Ordering::SeqCst) => return attempt,
            Poll::Pending => block_on(attempt),
            Poll::Ready(got) => got,
        };
        got.unwrap().let_go(redlock);
        ran.store(false, Ordering::SeqCst);
        probe.woken.store(false, Ordering::SeqCst);
    }
    panic!("{how:?}: every acquire was decided before its first poll returned");
}

/// Row "try_lock, lock, lock_until, guard, with_lock: dropped unpolled": nothing is sent.
#[test]
fn acquires_dropped_unpolled_send_nothing() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let writes = connected(&redlock);
    let ran = Arc::new(AtomicBool::new(false));
    for how in ACQUIRES {
        let key = format!("unpolled:{how:?}");
        drop(acquire(&redlock, how, &key, &ran));
        assert_eq!(redlock.stats().io.writes, writes, "{how:?}");
        assert_eq!(copies(&servers, &key), vec![(None, -2); 3], "{how:?}");
    }
    assert!(!ran.load(Ordering::SeqCst), "with_lock's work ran");
}

/// Row "try_lock, lock, lock_until, guard, with_lock: dropped midway", on a free resource: with
/// the replies pending, and once decided but not looked at. No key stays behind.
#[test]
fn acquires_dropped_midway_leave_no_key() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let ran = Arc::new(AtomicBool::new(false));
    for how in ACQUIRES {
        // Sent, the OKs come back after the future is gone: the engine releases.
        let key = format!("midway:sent:{how:?}");
        drop(pending(&redlock, how, &key, &ran, &probe().0));
        assert_released(&redlock, &servers, &key);
        // Woken: the outcome (a lock) is in, and nobody looks at it: the drop releases. (A
        // probe of its own: the one above may have been woken after the future was gone.)
        let (probe, _) = probe();
        let key = format!("midway:decided:{how:?}");
        let attempt = pending(&redlock, how, &key, &ran, &probe);
        assert!(probe.wait(BOUND), "{how:?}: never woken");
        let held = copies(&servers, &key);
        assert!(
            held.iter().filter(|(value, _)| value.is_some()).count() >= 2,
            "{how:?}: {held:?}"
        );
        drop(attempt);
        assert_released(&redlock, &servers, &key);
    }
    assert!(!ran.load(Ordering::SeqCst), "with_lock's work ran");
}

/// Row "lock, lock_until, guard, with_lock: dropped midway", waiting for a resource another
/// handle holds: the waiter leaves the queue and takes nothing once the holder lets go.
#[test]
fn waiting_acquires_dropped_midway_leave_the_queue() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let rival = rival(&servers);
    let ran = Arc::new(AtomicBool::new(false));
    for how in ACQUIRES.into_iter().filter(|&h| h != Acquire::TryLock) {
        let key = format!("waiting:{how:?}");
        let held = rival.lock(&key).unwrap();
        let refused = redlock.stats().acquire.refused;
        let (_, waker) = probe();
        let mut waiter = acquire(&redlock, how, &key, &ran);
        assert!(poll(&mut waiter, &waker).is_pending(), "{how:?}");
        let waiters = || {
            redlock
                .blocking()
                .with_client(|c| redlock_mux::testing::waiters(c, key.as_bytes()))
                .unwrap()
        };
        // Refused, and in the engine's queue of the resource.
        wait_until("the waiter's first attempt to be refused", || {
            redlock.stats().acquire.refused > refused && waiters() == 1
        });
        drop(waiter);
        // Out of the queue once no attempt of it is in flight (one that were would stay at
        // its head until decided, and a lock it won would be released).
        wait_until("the dropped waiter to leave the queue", || waiters() == 0);
        assert_eq!(rival.unlock(held).unwrap(), 3, "{how:?}");
        // A waiter still queued would take the resource at the release's notice: the rival's
        // next attempt would be refused somewhere.
        let again = rival.try_lock(&key).unwrap();
        assert_eq!(again.votes().refused(), 0, "{how:?}: {again:?}");
        assert_eq!(rival.unlock(again).unwrap(), 3, "{how:?}");
        assert_released(&redlock, &servers, &key);
    }
    assert!(!ran.load(Ordering::SeqCst), "with_lock's work ran");
}

/// Row "try_lock, lock, lock_until, guard, with_lock: after completion": a `Lock` is plain
/// data — the future's drop releases nothing, the key stays for its TTL; a guard releases when
/// it is dropped; `with_lock` has released before it completes.
#[test]
fn acquires_completed_hold_until_let_go() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let ran = Arc::new(AtomicBool::new(false));
    for how in ACQUIRES {
        let key = format!("done:{how:?}");
        let got = block_on(acquire(&redlock, how, &key, &ran)).unwrap();
        match got {
            Got::Lock(lock) => {
                let token = lock.token().to_string();
                assert_held(&servers, &key, &token, TTL);
                // Nothing of the future's is left to release it: flushed, it is still there.
                assert_eq!(redlock.blocking().shutdown(BOUND).unconfirmed, 0);
                assert_held(&servers, &key, &token, TTL);
                assert_eq!(block_on(redlock.unlock(lock)).unwrap(), 3);
                assert_eq!(copies(&servers, &key), vec![(None, -2); 3], "{how:?}");
            }
            Got::Guard(guard) => {
                assert_held(&servers, &key, &guard.token().to_string(), TTL);
                drop(guard);
                assert_released(&redlock, &servers, &key);
            }
            Got::Ran(token) => {
                assert!(ran.load(Ordering::SeqCst));
                assert!(!token.is_empty());
                // Released before it completed: the replies were waited for.
                assert_eq!(copies(&servers, &key), vec![(None, -2); 3], "{how:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// with_lock past its acquire: in the work, in the final release
// ---------------------------------------------------------------------------------------------

/// Row "with_lock: dropped midway", in the work: the work is dropped, the lock released.
#[test]
fn with_lock_dropped_in_the_work_releases() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, waker) = probe();
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    let mut run = redlock
        .with_lock("in-work", async move |watch: LockWatch| {
            flag.store(true, Ordering::SeqCst);
            let _ = watch;
            std::future::pending::<()>().await
        })
        .boxed();
    while !started.load(Ordering::SeqCst) {
        assert!(poll(&mut run, &waker).is_pending());
        assert!(
            started.load(Ordering::SeqCst) || probe.wait(BOUND),
            "never woken"
        );
    }
    let token = servers[0].get("in-work").expect("held during the work");
    assert_held(&servers, "in-work", &token, TTL);
    drop(run);
    assert_released(&redlock, &servers, "in-work");
}

/// Row "with_lock: dropped midway", in its final release: the release completes. The work
/// freezes a node before it returns, so the release cannot be over when the future is dropped.
#[test]
fn with_lock_dropped_in_its_release_still_releases() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, waker) = probe();
    let returned = Arc::new(AtomicBool::new(false));
    let flag = returned.clone();
    {
        let servers = &mut servers;
        let mut run = redlock
            .with_lock("in-release", async move |_| {
                servers[2].freeze();
                flag.store(true, Ordering::SeqCst);
            })
            .boxed();
        while !returned.load(Ordering::SeqCst) {
            assert!(poll(&mut run, &waker).is_pending());
            assert!(
                returned.load(Ordering::SeqCst) || probe.wait(BOUND),
                "never woken"
            );
        }
        // The work returned in the last poll, and the release went out in it; node 2 cannot
        // answer.
        drop(run);
    }
    wait_until("the live nodes to run the release", || {
        servers[0].get("in-release").is_none() && servers[1].get("in-release").is_none()
    });
    servers[2].resume();
    assert_released(&redlock, &servers, "in-release");
}

// ---------------------------------------------------------------------------------------------
// Releases: AsyncRedlock::unlock, AsyncLockGuard::unlock, AsyncKeepAlive::release
// ---------------------------------------------------------------------------------------------

/// The releasing operations, one case each in the tests below: `AsyncRedlock::unlock`,
/// `AsyncLockGuard::unlock`, `AsyncKeepAlive::release`.
#[derive(Debug, Clone, Copy)]
enum Release {
    Handle,
    Guard,
    Kept,
}

const RELEASES: [Release; 3] = [Release::Handle, Release::Guard, Release::Kept];

/// What a release consumes.
enum Holder {
    Lock(Lock),
    Guard(AsyncLockGuard),
    Kept(AsyncKeepAlive),
}

/// `key` acquired, held the way `how` releases it; and its token.
fn hold(redlock: &AsyncRedlock, how: Release, key: &str) -> (Holder, String) {
    if let Release::Guard = how {
        let guard = block_on(redlock.guard(key)).unwrap();
        let token = guard.token().to_string();
        return (Holder::Guard(guard), token);
    }
    let lock = block_on(redlock.lock(key)).unwrap();
    let token = lock.token().to_string();
    match how {
        Release::Handle => (Holder::Lock(lock), token),
        _ => (Holder::Kept(redlock.keep(lock).unwrap()), token),
    }
}

/// The release's future, made from the call (not at the first poll).
fn release(redlock: &AsyncRedlock, holder: Holder) -> Boxed<'_, Result<usize, Error>> {
    match holder {
        Holder::Lock(lock) => redlock.unlock(lock).boxed(),
        Holder::Guard(guard) => guard.unlock().boxed(),
        Holder::Kept(kept) => kept.release().boxed(),
    }
}

/// Row "unlock, AsyncLockGuard::unlock, AsyncKeepAlive::release: dropped unpolled": the lock
/// is released all the same (without waiting), as the guard's drop does.
#[test]
fn releases_dropped_unpolled_still_release() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    for how in RELEASES {
        let key = format!("unpolled:{how:?}");
        let (holder, token) = hold(&redlock, how, &key);
        assert_held(&servers, &key, &token, TTL);
        drop(release(&redlock, holder));
        assert_released(&redlock, &servers, &key);
    }
}

/// Row "unlock, AsyncLockGuard::unlock, AsyncKeepAlive::release: dropped midway": the release
/// completes. A frozen node keeps it from being over when the future is dropped; the live
/// nodes run it, the frozen one when it wakes.
#[test]
fn releases_dropped_midway_complete() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (_, waker) = probe();
    for how in RELEASES {
        let key = format!("midway:{how:?}");
        let (holder, token) = hold(&redlock, how, &key);
        assert_held(&servers, &key, &token, TTL);
        servers[2].freeze();
        let mut unlock = release(&redlock, holder);
        assert!(poll(&mut unlock, &waker).is_pending(), "{how:?}");
        drop(unlock);
        wait_until("the live nodes to run the release", || {
            servers[0].get(&key).is_none() && servers[1].get(&key).is_none()
        });
        servers[2].resume();
        assert_released(&redlock, &servers, &key);
    }
}

/// Row "unlock, AsyncLockGuard::unlock, AsyncKeepAlive::release: after completion": released
/// on every node by the time it completes.
#[test]
fn releases_completed_are_over() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    for how in RELEASES {
        let key = format!("done:{how:?}");
        let (holder, token) = hold(&redlock, how, &key);
        assert_held(&servers, &key, &token, TTL);
        assert_eq!(block_on(release(&redlock, holder)).unwrap(), 3, "{how:?}");
        assert_eq!(copies(&servers, &key), vec![(None, -2); 3], "{how:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Extends: AsyncRedlock::extend, AsyncLockGuard::extend
// ---------------------------------------------------------------------------------------------

/// A lock extended through the handle or through its guard.
enum Extendable {
    Lock(Lock),
    Guard(AsyncLockGuard),
}

impl Extendable {
    fn new(redlock: &AsyncRedlock, guard: bool, key: &str) -> Extendable {
        if guard {
            Extendable::Guard(block_on(redlock.guard(key)).unwrap())
        } else {
            Extendable::Lock(block_on(redlock.lock(key)).unwrap())
        }
    }

    fn extend<'a>(
        &'a mut self,
        redlock: &'a AsyncRedlock,
        ttl: Duration,
    ) -> Boxed<'a, Result<(), Error>> {
        match self {
            Extendable::Lock(lock) => redlock.extend(lock, ttl).boxed(),
            Extendable::Guard(guard) => guard.extend(ttl).boxed(),
        }
    }

    fn lock(&self) -> &Lock {
        match self {
            Extendable::Lock(lock) => lock,
            Extendable::Guard(guard) => guard,
        }
    }

    fn release(self, redlock: &AsyncRedlock) {
        let released = match self {
            Extendable::Lock(lock) => block_on(redlock.unlock(lock)),
            Extendable::Guard(guard) => block_on(guard.unlock()),
        };
        assert_eq!(released.unwrap(), 3);
    }
}

/// The lock never claims more than a node keeps its key: every node holds its token, and the
/// lock's validity (read first) is within every node's PTTL (read after).
fn assert_within_the_nodes(servers: &Cluster, key: &str, lock: &Lock) {
    let validity = lock.validity();
    assert!(lock.is_valid(), "{lock:?}");
    for (node, (value, pttl)) in copies(servers, key).into_iter().enumerate() {
        assert_eq!(value, Some(lock.token().to_string()), "node {node}");
        // PTTL is rounded down to the millisecond.
        let pttl = Duration::from_millis(u64::try_from(pttl).unwrap() + 1);
        assert!(
            validity <= pttl,
            "node {node}: the lock believes in {validity:?}, the node keeps it {pttl:?}"
        );
    }
}

/// Row "extend, AsyncLockGuard::extend": dropped unpolled, nothing is sent and the lock is
/// unchanged; dropped midway (a quorum out of reach while it is polled), the lock stays the
/// caller's with its validity cut to what the extend could have set; completed, every node
/// keeps at least the new TTL (an extend never shortens a key). In every case the lock is still
/// held, on every node.
#[test]
fn extends_dropped_at_every_point_keep_the_lock() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (_, waker) = probe();
    for guard in [false, true] {
        let key = format!("extend:{}", if guard { "guard" } else { "handle" });
        let mut held = Extendable::new(&redlock, guard, &key);
        let writes = connected(&redlock);

        // Unpolled.
        let before = held.lock().valid_until();
        drop(held.extend(&redlock, SHORT));
        assert_eq!(redlock.stats().io.writes, writes, "{key}");
        assert_eq!(held.lock().valid_until(), before, "{key}");
        assert_held(&servers, &key, &held.lock().token().to_string(), TTL);
        assert!(servers.iter().all(|s| s.pttl(&key) > 5_000), "{key}");

        // Midway: nodes 1 and 2 cannot answer, so no quorum while it is polled.
        servers[1].freeze();
        servers[2].freeze();
        {
            let mut extend = held.extend(&redlock, SHORT);
            assert!(poll(&mut extend, &waker).is_pending(), "{key}");
        }
        assert!(held.lock().validity() <= SHORT, "{key}: {:?}", held.lock());
        servers[1].resume();
        servers[2].resume();
        // Replies come in order on each connection: once a later request is answered by every
        // node, the dropped extend has run everywhere.
        let _ = block_on(redlock.status(&key, BOUND));
        assert_within_the_nodes(&servers, &key, held.lock());

        // Completed.
        block_on(held.extend(&redlock, SHORT)).unwrap();
        // An extend never shortens a key (see docs/keys.md): the keys
        // keep what they had left, the lock's validity is the extend's.
        assert_held(&servers, &key, &held.lock().token().to_string(), TTL);
        assert!(held.lock().validity() <= SHORT, "{key}: {:?}", held.lock());
        assert_within_the_nodes(&servers, &key, held.lock());
        held.release(&redlock);
        assert_eq!(copies(&servers, &key), vec![(None, -2); 3], "{key}");
    }
}

// ---------------------------------------------------------------------------------------------
// status, shutdown
// ---------------------------------------------------------------------------------------------

/// Row "status": it only reads. Dropped unpolled it sends nothing; dropped midway its replies
/// are dropped when they come and the connections stay in step; completed, it says who holds
/// the key. The lock it looks at is untouched throughout.
#[test]
fn status_dropped_at_every_point_changes_nothing() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (_, waker) = probe();
    let lock = block_on(redlock.lock("status")).unwrap();
    let token = lock.token().to_string();
    let writes = connected(&redlock);

    drop(redlock.status("status", BOUND));
    assert_eq!(redlock.stats().io.writes, writes);
    assert_held(&servers, "status", &token, TTL);

    servers[2].freeze();
    {
        let mut status = redlock.status("status", BOUND).boxed();
        assert!(poll(&mut status, &waker).is_pending());
    }
    servers[2].resume();

    let seen = block_on(redlock.status("status", BOUND));
    assert_eq!(seen.len(), 3);
    for node in &seen {
        let (value, pttl) = node.state.clone().unwrap();
        assert_eq!(value, Some(token.clone().into_bytes()), "{}", node.node);
        assert!(0 < pttl && pttl <= 10_000, "{}: {pttl}", node.node);
    }
    assert_held(&servers, "status", &token, TTL);
    assert_eq!(block_on(redlock.unlock(lock)).unwrap(), 3);
}

/// Row "shutdown": dropped unpolled it flushes nothing itself, and the releases queued before
/// go out all the same; dropped midway the flush goes on; completed, every release is
/// confirmed. The handle works on after each.
#[test]
fn shutdown_dropped_at_every_point_loses_no_release() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (_, waker) = probe();

    // Unpolled: a dropped guard's release is queued; the shutdown is dropped unpolled.
    let guard = block_on(redlock.guard("shutdown:unpolled")).unwrap();
    drop(guard);
    drop(redlock.shutdown(BOUND));
    wait_until("the guard's release", || {
        servers.iter().all(|s| s.get("shutdown:unpolled").is_none())
    });

    // Midway: node 2 frozen, so the release stays unconfirmed while the flush waits.
    let guard = block_on(redlock.guard("shutdown:midway")).unwrap();
    servers[2].freeze();
    drop(guard);
    {
        let mut shutdown = redlock.shutdown(BOUND).boxed();
        assert!(poll(&mut shutdown, &waker).is_pending());
    }
    wait_until("the live nodes to run the release", || {
        servers[0].get("shutdown:midway").is_none() && servers[1].get("shutdown:midway").is_none()
    });
    servers[2].resume();
    wait_until("the frozen node to run it once awake", || {
        servers[2].get("shutdown:midway").is_none()
    });

    // Completed.
    let guard = block_on(redlock.guard("shutdown:done")).unwrap();
    drop(guard);
    let report = block_on(redlock.shutdown(BOUND));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    assert_eq!(copies(&servers, "shutdown:done"), vec![(None, -2); 3]);

    // And the handle goes on.
    let lock = block_on(redlock.try_lock("shutdown:after")).unwrap();
    assert_eq!(block_on(redlock.unlock(lock)).unwrap(), 3);
}

// ---------------------------------------------------------------------------------------------
// wait_lost: AsyncKeepAlive::wait_lost, LockWatch::wait_lost
// ---------------------------------------------------------------------------------------------

/// Row "AsyncKeepAlive::wait_lost, LockWatch::wait_lost": a wait dropped at any point ends
/// only the wait; the lock is still kept, renewed, on every node.
#[test]
fn waits_for_the_loss_dropped_at_every_point_keep_the_lock() {
    let servers = Cluster::start(3);
    let ttl = Duration::from_millis(600);
    let redlock = builder(&servers)
        .ttl(ttl)
        .node_timeout(ttl / 6)
        .build_async()
        .unwrap();
    let (_, waker) = probe();
    for through_watch in [false, true] {
        let key = format!("wait:{through_watch}");
        let kept = redlock.keep(block_on(redlock.lock(&key)).unwrap()).unwrap();
        let watch = kept.watch();
        let wait = |timeout| -> Boxed<'_, Option<Error>> {
            if through_watch {
                watch.wait_lost(timeout).boxed()
            } else {
                kept.wait_lost(timeout).boxed()
            }
        };
        // Unpolled, midway, completed (a timeout: not lost).
        drop(wait(Duration::MAX));
        {
            let mut waiting = wait(Duration::MAX);
            assert!(poll(&mut waiting, &waker).is_pending(), "{key}");
        }
        assert!(block_on(wait(Duration::from_millis(10))).is_none(), "{key}");
        // Two renewals later it is still held and on every node.
        let extensions = kept.lock().extensions();
        while kept.lock().extensions() < extensions + 2 {
            assert!(
                block_on(kept.wait_lost(ttl / 4)).is_none(),
                "{key}: lost: {:?}",
                kept.lost()
            );
        }
        assert!(kept.is_held(), "{key}");
        assert_held(&servers, &key, &kept.lock().token().to_string(), ttl);
        assert_eq!(block_on(kept.release()).unwrap(), 3);
        assert_eq!(copies(&servers, &key), vec![(None, -2); 3], "{key}");
    }
}

/// A waiting acquire dropped while its attempt was in flight, which then won: the lock is
/// released for nobody, and the next waiter of the same handle attempts right behind that
/// release. It waited for the won lock's whole validity (the queue believed a caller of ours
/// held it, and ignored the notices) and failed at its deadline with the resource free (found
/// by two reviews; a semaphore's race drops every permit's wait but one, so it met this often).
#[test]
fn a_dropped_waiters_late_win_does_not_hold_up_the_next_waiter() {
    let servers = Cluster::start(3);
    // Nodes 1 and 2 behind relays (500 ms each way): every attempt is in flight for a round
    // trip of theirs after node 0 has answered it.
    let relays: Vec<Relay> = (1..3)
        .map(|i| Relay::start(servers[i].socket_addr(), Duration::from_millis(500)))
        .collect();
    let urls = [servers[0].url(), relays[0].url(), relays[1].url()];
    let redlock = Builder::new(urls)
        .quarantine(None)
        .ttl(TTL)
        .node_timeout(Duration::from_secs(2))
        .retry_delay(Duration::from_millis(20), Duration::from_millis(5))
        .build_async()
        .unwrap();
    assert_eq!(redlock.blocking().connect(BOUND).unwrap(), 3);
    let key = "late-win";
    // Another client's lock.
    for s in servers.iter() {
        s.cmd(&["SET", key, "theirs", "PX", "30000"]);
    }
    let waiters = || {
        redlock
            .blocking()
            .with_client(|c| redlock_mux::testing::waiters(c, key.as_bytes()))
            .unwrap()
    };
    let (_, waker) = probe();
    let mut first = Box::pin(redlock.lock_until(key, Instant::now() + WAIT));
    assert!(poll(&mut first, &waker).is_pending());
    wait_until("the first waiter to queue", || waiters() == 1);
    // Its deadline well before the won lock's validity (TTL, 10 s) ends.
    let second = redlock.lock_until(key, Instant::now() + Duration::from_secs(7));
    let mut second = Box::pin(second);
    assert!(poll(&mut second, &waker).is_pending());
    wait_until("the second waiter to queue", || waiters() == 2);
    // The other lock goes from node 0: the first waiter's next attempt takes it; while that
    // attempt is on its way to nodes 1 and 2 (500 ms), the other lock leaves them too, and its caller
    // goes. The attempt wins there a second later, for nobody.
    servers[0].cmd(&["DEL", key]);
    wait_until("an attempt to reach node 0", || {
        servers[0].get(key).is_some()
    });
    servers[1].cmd(&["DEL", key]);
    servers[2].cmd(&["DEL", key]);
    drop(first);
    // Before its deadline (7 s), which the won lock's validity (10 s) outlasts.
    let lock = block_on(second).expect("the second waiter gets the lock its dropped head won");
    let token = lock.token().to_string();
    for (node, (value, _)) in copies(&servers, key).into_iter().enumerate() {
        assert_eq!(value.as_deref(), Some(token.as_str()), "node {node}");
    }
    assert_eq!(block_on(redlock.unlock(lock)).unwrap(), 3);
    assert_released(&redlock, &servers, key);
}
