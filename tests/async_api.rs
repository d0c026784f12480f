//! The async API against real servers: the same futures under tokio (multi-thread and
//! current-thread), `futures`' executors and a minimal `block_on` on a plain thread; owned
//! guards moved across tasks and threads; and cancellation at every point of an operation —
//! before it is sent, with replies pending, after the quorum was reached but before the caller
//! looked, with a frozen node, with a connection killed — leaving no key behind.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::testing::background_found_loop_taken;
use redlock_mux::{
    AsyncKeepAlive, AsyncLockGuard, AsyncRedlock, Builder, Error, Lock, LockGuard, LockOptions,
    LockWatch,
};

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        // Timing is not what these tests check: room for a loaded machine.
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(5))
}

fn handle(servers: &Cluster) -> AsyncRedlock {
    builder(servers).build_async().unwrap()
}

fn holders(servers: &Cluster, key: &str) -> Vec<Option<String>> {
    servers.iter().map(|s| s.get(key)).collect()
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

/// The smallest executor there is: polls on this thread, parks between wake-ups.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let (probe, waker) = probe();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        // A bound, not the mechanism: the engine wakes it.
        probe.wait(Duration::from_secs(10));
    }
}

/// An acquire of `key`, polled once and still pending: its request is out, no outcome taken. (On
/// a loaded machine the engine's thread can decide it before the first poll returns; such a
/// lock is released and the acquire tried again.)
fn pending_acquire<'a>(
    redlock: &'a AsyncRedlock,
    key: &'a str,
    probe: &Arc<Probe>,
) -> Pin<Box<impl Future<Output = Result<Lock, Error>> + 'a>> {
    let waker = Waker::from(probe.clone());
    for _ in 0..100 {
        let mut attempt = Box::pin(redlock.try_lock(key));
        match attempt.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Pending => return attempt,
            Poll::Ready(r) => {
                block_on(redlock.unlock(r.unwrap())).unwrap();
                probe.woken.store(false, Ordering::SeqCst);
            }
        }
    }
    panic!("every acquire was decided before its first poll returned");
}

/// Polls `future` once with `waker`; true if it is still pending. (Whether it is depends on
/// how fast the engine's thread is, unless this thread holds the engine.)
fn poll_once<F: Future + Unpin>(future: &mut F, waker: &Waker) -> bool {
    let mut cx = Context::from_waker(waker);
    Pin::new(future).poll(&mut cx).is_pending()
}

/// Waits (bounded) until `done` holds, looking every millisecond: for engine states that have no
/// event of their own to wait on.
fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Flushes every release and checks that no node holds `key`.
fn assert_released(redlock: &AsyncRedlock, servers: &Cluster, key: &str) {
    let report = redlock.blocking().shutdown(Duration::from_secs(10));
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    assert_eq!(
        holders(servers, key),
        vec![None; servers.len()],
        "a key was left behind"
    );
}

/// What every executor runs: each part of the surface once.
async fn tour(redlock: AsyncRedlock, tag: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let key = |s: &str| format!("{tag}:{s}");

    // try_lock, extend, unlock.
    let mut lock = redlock.try_lock(key("a")).await.unwrap();
    let before = lock.valid_until();
    redlock
        .extend(&mut lock, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(lock.valid_until() > before);
    assert_eq!(lock.extensions(), 1);
    let contended = redlock.try_lock(key("a")).await;
    assert!(matches!(contended, Err(Error::Held(_))), "{contended:?}");
    let status = redlock.status(key("a"), Duration::from_secs(2)).await;
    assert!(status.iter().all(|s| matches!(
        &s.state,
        Ok((Some(v), _)) if *v == lock.token().to_string().into_bytes()
    )));
    assert_eq!(redlock.unlock(lock).await.unwrap(), 3);
    seen.push("try_lock/extend/status/unlock".to_string());

    // A guard, released by dropping it; the next acquire follows the release on every
    // connection.
    let guard = redlock.guard(key("g")).await.unwrap();
    drop(guard);
    let mut guard = redlock.guard(key("g")).await.unwrap();
    guard.extend(Duration::from_secs(30)).await.unwrap();
    assert_eq!(guard.unlock().await.unwrap(), 3);
    seen.push("guard".to_string());

    // lock() retries on the engine's alarms until the holder (another thread) lets go.
    let held = redlock.blocking().lock(key("r")).unwrap();
    let sync = redlock.blocking().clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        sync.unlock(held).unwrap()
    });
    let t0 = Instant::now();
    let got = redlock.lock(key("r")).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(20));
    assert_eq!(releaser.join().unwrap(), 3);
    redlock.unlock(got).await.unwrap();
    // lock_until gives up at its deadline.
    let held = redlock.lock(key("u")).await.unwrap();
    let t0 = Instant::now();
    let r = redlock
        .lock_until(key("u"), t0 + Duration::from_millis(60))
        .await;
    assert!(matches!(r, Err(Error::Held(_))), "{r:?}");
    assert!(t0.elapsed() >= Duration::from_millis(40));
    redlock.unlock(held).await.unwrap();
    seen.push("lock/lock_until".to_string());

    // keep: held, a wait for the loss that times out, then released.
    let kept = redlock.keep(redlock.lock(key("k")).await.unwrap()).unwrap();
    assert!(kept.is_held());
    let t0 = Instant::now();
    assert!(kept.wait_lost(Duration::from_millis(30)).await.is_none());
    assert!(t0.elapsed() >= Duration::from_millis(25));
    assert_eq!(kept.release().await.unwrap(), 3);
    // with_lock hands the work a watch.
    let out = redlock
        .with_lock(key("w"), async |watch: LockWatch| {
            assert!(watch.is_held());
            watch.lock().resource().to_vec()
        })
        .await
        .unwrap();
    assert_eq!(out, key("w").into_bytes());
    seen.push("keep/with_lock".to_string());
    seen
}

fn tour_ok(seen: Vec<String>) {
    assert_eq!(seen.len(), 4, "{seen:?}");
}

#[test]
fn the_same_futures_run_under_tokio_multi_thread() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    // Spawned: the futures are Send.
    let seen = rt.block_on(rt.spawn(tour(redlock.clone(), "mt"))).unwrap();
    tour_ok(seen);
}

#[test]
fn the_same_futures_run_under_tokio_current_thread() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    tour_ok(rt.block_on(tour(redlock, "ct")));
}

#[test]
fn the_same_futures_run_under_the_futures_executors() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    tour_ok(futures::executor::block_on(tour(redlock.clone(), "fx")));
    let pool = futures::executor::ThreadPool::builder()
        .pool_size(2)
        .create()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    pool.spawn_ok(async move {
        let _ = tx.send(tour(redlock, "pool").await);
    });
    tour_ok(rx.recv_timeout(Duration::from_secs(30)).unwrap());
}

#[test]
fn the_same_futures_run_from_a_plain_thread_with_a_minimal_block_on() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    tour_ok(block_on(tour(redlock, "plain")));
}

#[test]
fn guards_are_owned_send_and_static() {
    fn owned<T: Send + Sync + 'static>() {}
    owned::<LockGuard>();
    owned::<AsyncLockGuard>();
    owned::<AsyncKeepAlive>();
    owned::<LockWatch>();
    owned::<AsyncRedlock>();
    fn send<T: Send>(_: &T) {}
    let servers = Cluster::start(1);
    let redlock = handle(&servers);
    // The futures are Send (they borrow the handle; a task takes a clone of it).
    send(&redlock.lock("x"));
    send(&redlock.try_lock("x"));
    send(&redlock.guard("x"));
    send(&redlock.shutdown(Duration::ZERO));
    send(&redlock.with_lock("x", async |_| ()));

    // A blocking guard taken on one thread, dropped on another: released without waiting.
    let guard = redlock.blocking().guard("sync").unwrap();
    let token = guard.token().to_string();
    assert_eq!(servers[0].get("sync"), Some(token));
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert_released(&redlock, &servers, "sync");

    // An async guard returned from a task and dropped in another.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let r = redlock.clone();
    let guard = rt
        .block_on(rt.spawn(async move { r.guard("async").await.unwrap() }))
        .unwrap();
    assert!(servers[0].get("async").is_some());
    rt.block_on(rt.spawn(async move { drop(guard) })).unwrap();
    assert_released(&redlock, &servers, "async");
}

#[test]
fn dropping_guards_then_shutdown_flushes_their_releases() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let report = rt.block_on(async {
        let guards: Vec<_> =
            futures::future::join_all((0..20).map(|i| redlock.guard(format!("s:{i}"))))
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
        drop(guards);
        redlock.shutdown(Duration::from_secs(10)).await
    });
    assert_eq!(report.unconfirmed, 0, "{report:?}");
    for i in 0..20 {
        assert_eq!(holders(&servers, &format!("s:{i}")), vec![None; 3]);
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

#[test]
fn an_acquire_dropped_before_it_was_polled_sends_nothing() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    assert_eq!(
        redlock.blocking().connect(Duration::from_secs(5)).unwrap(),
        3
    );
    let writes = redlock.stats().io.writes;
    drop(redlock.try_lock("never"));
    drop(redlock.lock("never"));
    assert_eq!(redlock.stats().io.writes, writes);
    assert_released(&redlock, &servers, "never");
}

#[test]
fn an_acquire_dropped_with_replies_pending_is_released() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, _) = probe();
    for i in 0..20 {
        let key = format!("pending:{i}");
        let attempt = pending_acquire(&redlock, &key, &probe);
        // Sent; the OKs come back after the future is gone.
        drop(attempt);
        assert_released(&redlock, &servers, &key);
    }
}

#[test]
fn an_acquire_dropped_after_its_quorum_but_before_it_was_polled_is_released() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, _) = probe();
    let attempt = pending_acquire(&redlock, "won", &probe);
    // Woken: the outcome (a lock) is in, and nobody looks at it.
    assert!(probe.wait(Duration::from_secs(5)), "never woken");
    assert_eq!(holders(&servers, "won").iter().flatten().count(), 3);
    drop(attempt);
    assert_released(&redlock, &servers, "won");
}

#[test]
fn an_acquire_dropped_with_a_frozen_node_is_released_there_when_it_wakes() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    assert_eq!(
        redlock.blocking().connect(Duration::from_secs(5)).unwrap(),
        3
    );
    servers[2].freeze();
    let (probe, _) = probe();
    let attempt = pending_acquire(&redlock, "frozen", &probe);
    // Two live nodes make the quorum; the frozen one has the SET in its socket.
    assert!(probe.wait(Duration::from_secs(5)), "never woken");
    drop(attempt);
    // The release is out on every connection: the live nodes run it, the frozen node's stays
    // unconfirmed, queued behind its SET... (Not waited for by counting unconfirmed releases:
    // an earlier attempt that `pending_acquire` unlocked left one of its own on the frozen
    // node.)
    wait_until(
        "the live nodes to run the release",
        Duration::from_secs(5),
        || servers[0].get("frozen").is_none() && servers[1].get("frozen").is_none(),
    );
    let (in_flight, ledger) = redlock
        .blocking()
        .with_client(|c| redlock_mux::testing::unconfirmed(c))
        .unwrap();
    assert!(in_flight + ledger > 0, "nothing left for the frozen node");
    // ... and runs after the SET once the node wakes.
    servers[2].resume();
    assert_released(&redlock, &servers, "frozen");
}

#[test]
fn an_acquire_dropped_while_a_connection_is_cut_is_released_when_the_node_is_back() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, _) = probe();
    let attempt = pending_acquire(&redlock, "cut", &probe);
    assert!(probe.wait(Duration::from_secs(5)), "never woken");
    // Node 0 drops our connection: the release cannot go out on it; the engine keeps it and
    // sends it on the next connection.
    servers[0].cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    drop(attempt);
    assert_released(&redlock, &servers, "cut");
}

#[test]
fn an_extend_dropped_in_flight_cuts_the_validity_to_the_worst_it_could_set() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let mut lock = futures::executor::block_on(redlock.try_lock("ext")).unwrap();
    assert!(lock.validity() > Duration::from_secs(29));
    let (_, waker) = probe();
    {
        // Sent (and, on a loaded machine, perhaps even decided: then it set 2 s too).
        let mut extend = Box::pin(redlock.extend(&mut lock, Duration::from_secs(2)));
        poll_once(&mut extend, &waker);
    }
    // It may have reached the nodes and set 2 s there: the lock must not believe in 30.
    assert!(lock.validity() <= Duration::from_secs(2), "{lock:?}");
    assert!(lock.is_valid());
    // Dropped before it was polled, it sent nothing and changes nothing.
    let valid_until = lock.valid_until();
    drop(redlock.extend(&mut lock, Duration::from_secs(1)));
    assert_eq!(lock.valid_until(), valid_until);
    futures::executor::block_on(redlock.unlock(lock)).unwrap();
    assert_released(&redlock, &servers, "ext");
}

#[test]
fn an_unlock_dropped_in_flight_still_releases() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let lock = futures::executor::block_on(redlock.try_lock("unl")).unwrap();
    let (_, waker) = probe();
    let mut unlock = Box::pin(redlock.unlock(lock));
    poll_once(&mut unlock, &waker);
    drop(unlock);
    assert_released(&redlock, &servers, "unl");
}

/// Requests queued while woken tasks have not taken their outcomes yet wait for theirs, so that
/// they all go out together — for a bounded time: an outcome nobody ever takes (its future
/// neither polled again nor dropped) holds nobody up for good.
#[test]
fn an_outcome_nobody_takes_holds_up_no_other_request() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, _) = probe();
    let untaken = pending_acquire(&redlock, "untaken", &probe);
    assert!(probe.wait(Duration::from_secs(5)), "never woken");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks = (0..8).map(|t| {
            let redlock = redlock.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    let lock = redlock.try_lock(format!("other:{t}")).await.unwrap();
                    redlock.unlock(lock).await.unwrap();
                }
            })
        });
        let all = futures::future::join_all(tasks);
        for done in tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .expect("held up behind an outcome nobody takes")
        {
            done.unwrap();
        }
    });
    drop(untaken);
    assert_released(&redlock, &servers, "untaken");
}

#[test]
fn an_outcome_nobody_takes_holds_up_no_request_while_a_waiter_sleeps_in_poll() {
    // As above, but a blocking caller waits for a held resource meanwhile, so the driver
    // sleeps in `poll` until its next deadline rather than parking: a request queued behind
    // the outcome nobody takes must still wake it (before, each waited for the waiter's
    // fallback poll, 0.2–0.4 s: 200 cycles took a minute).
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let held = block_on(redlock.try_lock("busy")).unwrap();
    let waiter = {
        let blocking = redlock.blocking().clone();
        std::thread::spawn(move || {
            blocking.lock_until("busy", Instant::now() + Duration::from_secs(60))
        })
    };
    let (probe, _) = probe();
    let untaken = pending_acquire(&redlock, "untaken", &probe);
    assert!(probe.wait(Duration::from_secs(5)), "never woken");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let cycles = async {
            for _ in 0..200 {
                let lock = redlock.try_lock("other").await.unwrap();
                redlock.unlock(lock).await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(30), cycles)
            .await
            .expect("held up behind an outcome nobody takes");
    });
    drop(untaken);
    block_on(redlock.unlock(held)).unwrap();
    let got = waiter
        .join()
        .unwrap()
        .expect("the waiter gets the lock once released");
    redlock.blocking().unlock(got).unwrap();
    assert_released(&redlock, &servers, "untaken");
}

#[test]
fn shutdown_sends_the_releases_still_queued_behind_an_outcome_nobody_takes() {
    // A release handed over while the engine was busy waits in the mailbox; with an outcome
    // nobody has taken, the engine holds queued requests back a moment for the woken tasks'.
    // `shutdown` must send it all the same (before, it could find nothing in flight and
    // return at once: the key stayed until its TTL, and the report said all was confirmed).
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let (probe, _) = probe();
    let untaken = pending_acquire(&redlock, "untaken", &probe);
    assert!(probe.wait(Duration::from_secs(5)), "never woken");
    for round in 0..20 {
        let key = format!("left:{round}");
        let lock = block_on(redlock.try_lock(key.as_str())).unwrap();
        redlock
            .blocking()
            .with_client(|_| redlock.unlock_nowait(lock))
            .unwrap();
        let report = redlock.blocking().shutdown(Duration::from_secs(10));
        assert_eq!(report.unconfirmed, 0, "{report:?}");
        assert_eq!(
            holders(&servers, &key),
            vec![None; servers.len()],
            "round {round}: the queued release was not sent ({report:?})"
        );
    }
    drop(untaken);
}

#[test]
fn requests_dropped_while_queued_for_a_busy_engine() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let lock = futures::executor::block_on(redlock.try_lock("queued")).unwrap();
    let (_, waker) = probe();
    // While another thread holds the engine, requests wait in its mailbox: dropped there, an
    // acquire is never sent, a release still is. (Another thread: from this thread's own
    // `with_client` closure they are refused with `Reentrant`, `tests/reentry.rs`.)
    let (held, hold) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    std::thread::scope(|scope| {
        let blocking = redlock.blocking();
        scope.spawn(move || {
            blocking
                .with_client(|_| {
                    held.0.send(()).unwrap();
                    let _ = hold.1.recv_timeout(Duration::from_secs(30));
                })
                .unwrap()
        });
        held.1.recv_timeout(Duration::from_secs(30)).unwrap();
        let mut acquire = Box::pin(redlock.try_lock("queued:new"));
        assert!(poll_once(&mut acquire, &waker));
        drop(acquire);
        let mut unlock = Box::pin(redlock.unlock(lock));
        assert!(poll_once(&mut unlock, &waker));
        drop(unlock);
        hold.0.send(()).unwrap();
    });
    assert_released(&redlock, &servers, "queued");
    assert_released(&redlock, &servers, "queued:new");
    // One SET per node: the first acquire's. The dropped one never went out.
    for server in servers.iter() {
        let info = server.info("commandstats");
        assert!(info.contains("cmdstat_set:calls=1,"), "{info}");
    }
}

#[test]
fn a_lock_held_by_a_dropped_with_lock_future_is_released() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = redlock.with_lock("wl", move |_| async move {
            let _ = tx.send(());
            std::future::pending::<()>().await
        });
        tokio::select! {
            _ = work => unreachable!(),
            _ = rx => {}
        }
    });
    assert_released(&redlock, &servers, "wl");
}

#[test]
fn a_kept_lock_that_is_lost_wakes_its_async_waiters() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers)
        .ttl(Duration::from_millis(600))
        .build_async()
        .unwrap();
    let kept = block_on(async { redlock.keep(redlock.lock("lost").await.unwrap()).unwrap() });
    let watch = kept.watch();
    // Somebody else's key now: the next renewal finds it gone.
    for s in servers.iter() {
        s.cmd(&["SET", "lost", "thief"]);
    }
    let why = block_on(watch.wait_lost(Duration::MAX));
    assert!(why.is_some());
    assert!(!kept.is_held());
    assert!(kept.lost().is_some());
    // Released by the engine (our token only): the thief's key stays.
    assert!(matches!(
        block_on(kept.release()),
        Err(Error::Expired { .. })
    ));
    assert_eq!(servers[0].get("lost").as_deref(), Some("thief"));
}

/// `with_lock` must not report a clean run when the lock was lost while the work ran. TTL
/// 600 ms; the work freezes two of three nodes for 900 ms (longer than the TTL: the fault of the
/// issue), so the renewal fails; it waits for the loss on its watch, wakes the nodes and waits
/// until another handle has taken the resource, then returns. The caller must get an error that
/// carries the work's value.
#[test]
fn with_lock_reports_a_lock_lost_while_the_work_ran() {
    const FREEZE: Duration = Duration::from_millis(900);
    let mut servers = Cluster::start(3);
    let ttl = Duration::from_millis(600);
    let make = |servers: &Cluster| {
        builder(servers)
            .ttl(ttl)
            .node_timeout(ttl / 6)
            .build_async()
            .unwrap()
    };
    let (redlock, rival) = (make(&servers), make(&servers));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let clean = redlock
            .with_lock("clean", async |watch: LockWatch| watch.is_held())
            .await;
        assert!(matches!(clean, Ok(true)), "{clean:?}");

        let servers = &mut servers;
        let out = redlock
            .with_lock("job", async |watch: LockWatch| {
                let frozen_at = Instant::now();
                servers[0].freeze();
                servers[1].freeze();
                let why = watch
                    .wait_lost(Duration::from_secs(5))
                    .await
                    .expect("the renewal fails with two of three nodes frozen");
                tokio::time::sleep(FREEZE.saturating_sub(frozen_at.elapsed())).await;
                servers[0].resume();
                servers[1].resume();
                let theirs = rival
                    .lock_until("job", Instant::now() + Duration::from_secs(5))
                    .await
                    .expect("another handle takes the resource while the work still runs");
                (7, why, theirs)
            })
            .await;
        let err = match out {
            Ok(value) => panic!("with_lock returned Ok after the lock was lost: {value:?}"),
            Err(err) => err,
        };
        assert!(matches!(err.error(), Error::NoQuorum(_)), "{err:?}");
        let Some((n, seen, theirs)) = err.into_value() else {
            panic!("not reported as lost, or without the work's value");
        };
        // The work's value, intact; the reason is the one the work saw.
        assert_eq!(n, 7);
        assert!(matches!(seen, Error::NoQuorum(_)), "{seen}");
        // Our releases (the loss's, and the one after the work) left the new holder's key
        // alone: every node that granted it still has it.
        let granted = theirs.votes().yes();
        assert!(granted >= 2, "{theirs:?}");
        assert!(rival.unlock(theirs).await.unwrap() >= granted);
    });
}

/// While a caller holds the loop (here `with_client`; in service, a thread driving its own
/// operation), the background thread, woken because requests were queued, waits for that caller
/// to let go instead of trying the lock again at once. Spinning there took a CPU from the
/// holder whenever the holder was preempted: on two CPUs shared with the servers, half the
/// machine (found under callgrind, where it was a quarter of all instructions).
#[test]
fn the_background_thread_waits_for_a_caller_holding_the_loop_rather_than_spin() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    block_on(async {
        let lock = redlock.try_lock("spin:warm").await.unwrap();
        redlock.unlock(lock).await.unwrap();
    });
    // An acquire under way, its outcome not taken: later ones are not alone.
    let (probe, waker) = probe();
    let c = pending_acquire(&redlock, "spin:c", &probe);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let blocking = redlock.blocking().clone();
    let holder = std::thread::spawn(move || {
        blocking
            .with_client(|_| {
                held_tx.send(()).unwrap();
                let _ = go_rx.recv_timeout(Duration::from_secs(10));
            })
            .unwrap();
    });
    held_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // Not alone, this acquire queues its request and wakes the background thread, which
    // finds the loop taken.
    let mut a = Box::pin(redlock.try_lock("spin:a"));
    assert!(poll_once(&mut a, &waker));
    let before = background_found_loop_taken(redlock.blocking());
    // Not a synchronisation: the window in which the looks are counted.
    std::thread::sleep(Duration::from_millis(200));
    let looks = background_found_loop_taken(redlock.blocking()) - before;
    go_tx.send(()).unwrap();
    holder.join().unwrap();
    // The request goes out once the holder lets go.
    let (la, lc) = (block_on(a).unwrap(), block_on(c).unwrap());
    block_on(redlock.unlock(la)).unwrap();
    block_on(redlock.unlock(lc)).unwrap();
    // A few hundred looks in a row, then parked between looks: at most about once a
    // millisecond while the loop stays taken (its bound), some 200 times in the window;
    // spinning, it looked without pause.
    assert!(
        looks <= 1000,
        "the background thread looked {looks} times in 200 ms at a loop a caller held"
    );
}

/// A waker that panics (an executor's bug) was called on the engine's thread in the middle of
/// a turn: the panic unwound through the engine and ended the thread that drives the loop for
/// async callers, so later async acquires were never woken. Now a wake that
/// panics is caught where it is called: the engine's thread goes on.
#[test]
fn a_panicking_waker_takes_nothing_down() {
    a_panicking_waker_case(false);
}

/// The same with a panic whose payload panics again when dropped: the payload was dropped
/// outside the guard, and that second panic ended the engine's thread after all (found by
/// review). Now it is dropped under a guard too.
#[test]
fn a_waker_panicking_with_a_payload_that_panics_when_dropped_takes_nothing_down() {
    a_panicking_waker_case(true);
}

/// A payload whose `Drop` panics.
pub struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a panic payload that panics when dropped (expected by this test)");
    }
}

fn a_panicking_waker_case(bomb: bool) {
    struct Panics(AtomicBool, bool);
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
            if self.1 {
                std::panic::panic_any(Bomb);
            }
            panic!("a waker that panics");
        }
    }
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let other = builder(&servers).build().unwrap();
    let held = other.try_lock("c").unwrap();
    // Pending, with the panicking waker: the engine's thread decides it and wakes it.
    let panics = Arc::new(Panics(AtomicBool::new(false), bomb));
    let waker = Waker::from(panics.clone());
    let mut first = loop {
        let mut attempt = Box::pin(redlock.try_lock("a"));
        match attempt.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Pending => break attempt,
            Poll::Ready(r) => block_on(redlock.unlock(r.unwrap())).map(drop).unwrap(),
        }
    };
    wait_until("the panicking wake", Duration::from_secs(10), || {
        panics.0.load(Ordering::SeqCst)
    });
    // A waiting acquire, woken only by the engine's thread once the holder releases.
    let (probe, probe_waker) = probe();
    let mut waiting = Box::pin(redlock.lock("c"));
    assert!(poll_once(&mut waiting, &probe_waker), "c is held");
    other.unlock(held).unwrap();
    assert!(
        probe.wait(Duration::from_secs(10)),
        "never woken: the engine's thread is gone"
    );
    let lock = block_on(waiting).unwrap();
    block_on(redlock.unlock(lock)).unwrap();
    // The first acquire's outcome waits for its caller.
    let lock = block_on(first.as_mut()).unwrap();
    block_on(redlock.unlock(lock)).unwrap();
}

/// An async request queued while a blocking caller drives the loop asleep until its own
/// deadline, and an outcome of another task lies delivered but never taken: the request was
/// left unsent until that deadline (the mailbox held async requests back for the unclaimed
/// outcome's task, whose request never came). Found by review.
#[test]
fn an_async_request_is_not_left_behind_a_driver_asleep_until_its_deadline() {
    let mut servers = Cluster::start(3);
    let redlock = handle(&servers);
    assert_eq!(
        redlock.blocking().connect(Duration::from_secs(10)).unwrap(),
        3
    );
    // An outcome delivered and never taken: an acquire polled once, then kept unpolled.
    let (probe, _) = probe();
    let kept = pending_acquire(&redlock, "x", &probe);
    assert!(
        probe.wait(Duration::from_secs(10)),
        "the acquire was never decided"
    );
    // A blocking status drives the loop, asleep until the frozen node's deadline (5 s).
    servers[2].freeze();
    let blocking = redlock.blocking().clone();
    let status = std::thread::spawn(move || blocking.status(b"r", Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(100));
    let got = block_on(redlock.try_lock("y"));
    // Decided while the status still waits: not held up until its deadline.
    assert!(
        !status.is_finished(),
        "the acquire waited for the status's deadline"
    );
    let got = got.expect("acquired on two of three nodes");
    servers[2].resume();
    status.join().unwrap();
    block_on(redlock.unlock(got)).unwrap();
    drop(kept);
}

/// `wait_lost` futures made and dropped again and again (a `select!` loop's pattern): each left
/// its alarm, waker and all, in the engine until its time — a TTL away, an hour here. Now a
/// dropped wait's alarm goes at the engine's next turn.
#[test]
fn dropped_waits_for_a_loss_leave_no_alarm_behind() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let kept = redlock
        .keep(block_on(redlock.lock("kept")).unwrap())
        .unwrap();
    let (_, waker) = probe();
    for _ in 0..1_000 {
        let mut wait = Box::pin(kept.wait_lost(Duration::from_secs(3_600)));
        assert!(
            poll_once(&mut wait, &waker),
            "pending while the lock is kept"
        );
    }
    // A turn of the engine, then a look at what it holds.
    block_on(redlock.unlock(block_on(redlock.lock("turn")).unwrap())).unwrap();
    let alarms = redlock
        .blocking()
        .with_client(|c| redlock_mux::testing::alarms(c))
        .unwrap();
    assert!(alarms < 10, "{alarms} alarms left by 1,000 dropped waits");
    block_on(kept.release()).unwrap();
}

/// Waits dropped behind a live head leave their queue within a bound (a sweep every 50 ms and a
/// turn), not at their deadlines: a task that timed its waits out in a loop behind a long head
/// piled up one waiting operation per drop — per permit, for a semaphore — for as long as their
/// deadlines.
#[test]
fn waits_dropped_behind_a_waiting_head_leave_the_queue_soon() {
    let servers = Cluster::start(3);
    let redlock = handle(&servers);
    let other = builder(&servers)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = other.try_lock("x").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (_probe, waker) = probe();
    let mut head = Box::pin(redlock.lock_until("x", deadline));
    assert!(poll_once(&mut head, &waker), "x is held");
    let waiters = || {
        (redlock.blocking())
            .with_client(|c| redlock_mux::testing::waiters(c, b"x"))
            .unwrap()
    };
    wait_until("the head in its queue", Duration::from_secs(10), || {
        waiters() == 1
    });
    let mut dropped = Vec::new();
    for _ in 0..100 {
        let mut wait = Box::pin(redlock.lock_until("x", deadline));
        assert!(poll_once(&mut wait, &waker), "x is held");
        dropped.push(wait);
    }
    // In the queue, behind the head, before they are dropped.
    wait_until("the waits in the queue", Duration::from_secs(10), || {
        waiters() == 101
    });
    drop(dropped);
    wait_until(
        "the dropped waits to leave",
        Duration::from_secs(10),
        || waiters() == 1,
    );
    other.unlock(held).unwrap();
    let lock = block_on(head).unwrap();
    block_on(redlock.unlock(lock)).unwrap();
}

/// The async face's TTL per call and wait as a duration: as the blocking one's.
#[test]
fn lock_with_and_try_lock_for_as_the_blocking_face_does() {
    let servers = Cluster::start(3);
    let redlock = builder(&servers)
        .ttl(Duration::from_secs(30))
        .build_async()
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(2));
    let lock = block_on(redlock.lock_with("short", options)).unwrap();
    for s in servers.iter() {
        let pttl = s.pttl("short");
        assert!((1..=2_000).contains(&pttl), "PTTL {pttl}");
    }
    let r = block_on(redlock.try_lock_for("short", Duration::from_millis(100)));
    assert!(matches!(r, Err(Error::Held(_))), "{r:?}");
    let r = block_on(redlock.lock_with("x", LockOptions::new().ttl(Duration::from_secs(31))));
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    block_on(redlock.unlock(lock)).unwrap();
    let lock = block_on(redlock.try_lock_for("short", Duration::from_secs(5))).unwrap();
    block_on(redlock.unlock(lock)).unwrap();
}
