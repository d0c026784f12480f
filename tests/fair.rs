//! Fair locks (`Config::fair`) against real servers: waiters on separate handles (each its own
//! engine and connections, as separate processes are) are granted in the order they began to
//! wait, and callers queued behind another caller of their handle keep their places among
//! them; a waiter that gives up leaves the queue at once; a dead waiter's place expires;
//! `try_lock` passes nobody; a key under the queue's name that is not ours is left alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Error, Redlock, ResourceSet};

const QUEUE: &str = "redlock:queue:report";

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(300))
}

fn fair(servers: &Cluster) -> Redlock {
    builder(servers).fair(true).build().unwrap()
}

/// Members of `queue` on each server, the marker included (0: no queue).
fn queued(servers: &Cluster, queue: &str) -> Vec<i64> {
    servers
        .iter()
        .map(|s| match s.cmd(&["ZCARD", queue]) {
            redis::Value::Int(n) => n,
            other => panic!("ZCARD answered {other:?}"),
        })
        .collect()
}

/// Waits (up to 10 s) until `done` holds of the sizes of [`QUEUE`] on every server.
fn wait_queue(servers: &Cluster, what: &str, done: impl Fn(&[i64]) -> bool) {
    wait_queue_in(servers, QUEUE, what, done)
}

/// [`wait_queue`] of `queue`.
fn wait_queue_in(servers: &Cluster, queue: &str, what: &str, done: impl Fn(&[i64]) -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let sizes = queued(servers, queue);
        if done(&sizes) {
            return;
        }
        assert!(Instant::now() < until, "{what}: queues {sizes:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waiters on `handles`, started one after the other (each once the one before is in the queue
/// on every server), while another handle holds the lock; then released. The order in which
/// they were granted.
fn grant_order(servers: &Cluster, handles: Vec<Redlock>) -> Vec<usize> {
    let handles = handles.into_iter().map(|h| (h, false)).collect();
    grant_order_of(servers, handles)
}

/// [`grant_order`] of writers and readers (`true`: the waiter is a reader of the resource).
fn grant_order_of(servers: &Cluster, handles: Vec<(Redlock, bool)>) -> Vec<usize> {
    let holder = builder(servers).build().unwrap();
    let held = holder.try_lock("report").unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    let n = handles.len();
    for (i, (redlock, reader)) in handles.into_iter().enumerate() {
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let lock = match reader {
                true => redlock.lock_shared_until("report", deadline),
                false => redlock.lock_until("report", deadline),
            }
            .unwrap();
            tx.send(i).unwrap();
            // A short critical section, so that the next grant follows a release.
            thread::sleep(Duration::from_millis(20));
            redlock.unlock(lock).unwrap();
        }));
        if redlock_is_fair() {
            // The marker and one entry per waiter so far.
            wait_queue(servers, "waiter joined", |q| {
                q.iter().all(|&c| c == i as i64 + 2)
            });
        } else {
            // Plain waiters leave no trace but their mark: give each its first attempt.
            thread::sleep(Duration::from_millis(50));
        }
    }
    holder.unlock(held).unwrap();
    let order: Vec<usize> = (0..n).map(|_| rx.recv().unwrap()).collect();
    for t in threads {
        t.join().unwrap();
    }
    order
}

/// A fair handle whose fallback poll (5 s) is longer than a test's waits: only a notice or a
/// first attempt can let its waiters in sooner.
fn slow_poll(servers: &Cluster) -> Redlock {
    builder(servers)
        .fair(true)
        .retry_delay(Duration::from_secs(5), Duration::ZERO)
        .build()
        .unwrap()
}

fn redlock_is_fair() -> bool {
    std::env::var("FAIR_TEST_PLAIN").is_err()
}

#[test]
fn fair_waiters_in_separate_clients_are_granted_in_the_order_they_began_to_wait() {
    let servers = Cluster::start(3);
    for round in 0..3 {
        let handles: Vec<Redlock> = (0..6)
            .map(|_| builder(&servers).fair(redlock_is_fair()).build().unwrap())
            .collect();
        let order = grant_order(&servers, handles);
        assert_eq!(order, (0..6).collect::<Vec<_>>(), "round {round}");
        // Every waiter left: no queue is left behind.
        wait_queue(&servers, "queue gone", |q| q.iter().all(|&c| c == 0));
    }
}

/// Readers and writers of fair handles, in the order they began to wait: reader 0, writer 1,
/// readers 2 and 3, writer 4, reader 5. Each is granted after every waiter ahead of it of the
/// other kind, and the readers between two writers are granted together, before the writer
/// after them (which waits for them to be done). Readers that did not queue (plain handles:
/// `FAIR_TEST_PLAIN=1`, the control) step back for the waiting writers' marks, whatever their
/// age, and pass no one in order.
#[test]
fn fair_readers_queue_with_the_writers_and_are_granted_in_runs_in_their_order() {
    let servers = Cluster::start(3);
    let kinds = [true, false, true, true, false, true];
    for round in 0..3 {
        let handles: Vec<(Redlock, bool)> = (kinds.iter())
            .map(|&r| {
                (
                    builder(&servers).fair(redlock_is_fair()).build().unwrap(),
                    r,
                )
            })
            .collect();
        let order = grant_order_of(&servers, handles);
        // The runs: {0}, {1}, {2, 3}, {4}, {5}.
        let runs: Vec<usize> = order.iter().map(|&i| [0, 1, 2, 2, 3, 4][i]).collect();
        assert_eq!(runs, [0, 1, 2, 2, 3, 4], "round {round}: order {order:?}");
        wait_queue(&servers, "queue gone", |q| q.iter().all(|&c| c == 0));
    }
}

/// A fair writer gives up while readers hold the resource: the fair reader that queued behind
/// it joins them at once, told by the writer's leave (`FAIR_LEAVE_BODY` publishes where the
/// resource is read-locked too). The fallback poll (5 s) is longer than the reader's budget, so
/// only that notice lets it in: before the leave told readers, it reached its deadline.
#[test]
fn a_reader_behind_a_writer_that_gives_up_joins_the_readers_at_once() {
    let servers = Cluster::start(3);
    let slow = || slow_poll(&servers);
    let holder = slow();
    let held = holder.try_lock_shared("report").unwrap();
    let writer = slow();
    let w = thread::spawn(move || {
        writer.lock_until("report", Instant::now() + Duration::from_millis(800))
    });
    wait_queue(&servers, "writer joined", |q| q.iter().all(|&c| c == 2));
    let reader = slow();
    let r = thread::spawn(move || {
        reader
            .lock_shared_until("report", Instant::now() + Duration::from_secs(3))
            .map(|lock| reader.unlock(lock))
    });
    wait_queue(&servers, "reader joined", |q| q.iter().all(|&c| c == 3));
    let gave_up = w.join().unwrap();
    assert!(matches!(gave_up, Err(Error::Held(_))), "{gave_up:?}");
    let got = r.join().unwrap();
    assert!(got.is_ok(), "the reader behind the writer: {got:?}");
    holder.unlock(held).unwrap();
    wait_queue(&servers, "queue gone", |q| q.iter().all(|&c| c == 0));
}

/// Callers of `redlock`'s engine waiting in its queue of `resource` (its head included).
fn local_waiters(redlock: &Redlock, resource: &str) -> usize {
    (redlock.with_client(|c| redlock_mux::testing::waiters(c, resource.as_bytes()))).unwrap()
}

/// Waits (up to 10 s) until `redlock` has `n` callers waiting for `resource`.
fn wait_local(redlock: &Redlock, resource: &str, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while local_waiters(redlock, resource) != n {
        assert!(Instant::now() < until, "{n} callers never waited");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Returns once the wall clock has passed the next millisecond: queue entries order waits by
/// their start in ms, so two waits begun in one millisecond may go either way (a writer's
/// first).
fn a_millisecond_later() {
    let ms = || {
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
            .unwrap()
            .as_millis()
    };
    let start = ms();
    while ms() < start + 2 {
        thread::yield_now();
    }
}

/// Callers that line up behind another caller of their handle keep their places against a
/// younger waiter of another handle: promoted to the head of its handle's queue, each attempts
/// behind the release with its entry, and goes first where that entry is the oldest. Before, that
/// first attempt carried no entry (as a new caller's does) and was refused where the younger
/// waiter's entry lived, which then went first; and after eight local hand-offs in a row the
/// next stepped back for a pause (the streak's yield, for locks that do not queue), which let
/// the younger waiter pass. Ten callers of one handle, then one of another.
#[test]
fn callers_queued_behind_another_of_their_handle_keep_their_places_in_the_fair_queue() {
    let servers = Cluster::start(3);
    const LOCAL: usize = 10;
    for round in 0..3 {
        let holder = builder(&servers).build().unwrap();
        let held = holder.try_lock("report").unwrap();
        let (a, b) = (fair(&servers), fair(&servers));
        let (tx, rx) = mpsc::channel();
        let waiter = |redlock: &Redlock, name: usize| {
            let (redlock, tx) = (redlock.clone(), tx.clone());
            thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(30);
                let lock = redlock.lock_until("report", deadline).unwrap();
                tx.send(name).unwrap();
                thread::sleep(Duration::from_millis(5));
                redlock.unlock(lock).unwrap();
            })
        };
        let mut threads = vec![waiter(&a, 0)];
        wait_queue(&servers, "a's first caller joined", |q| {
            q.iter().all(|&c| c == 2)
        });
        for i in 1..LOCAL {
            threads.push(waiter(&a, i));
            wait_local(&a, "report", i + 1);
        }
        a_millisecond_later();
        threads.push(waiter(&b, LOCAL));
        wait_queue(&servers, "b joined", |q| q.iter().all(|&c| c == 3));
        holder.unlock(held).unwrap();
        let order: Vec<usize> = (0..=LOCAL).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, (0..=LOCAL).collect::<Vec<_>>(), "round {round}");
        for t in threads {
            t.join().unwrap();
        }
        wait_queue(&servers, "queue gone", |q| q.iter().all(|&c| c == 0));
    }
}

/// The same for readers: a reader queued behind another reader of its handle joins it as soon
/// as that one is in, ahead of a younger writer of another handle. The fallback poll (5 s) is
/// longer than the first reader holds, so only its first attempt as the head lets it in then.
#[test]
fn a_reader_queued_behind_another_of_its_handle_joins_it_ahead_of_a_younger_writer() {
    let servers = Cluster::start(3);
    let slow = || slow_poll(&servers);
    let holder = builder(&servers).build().unwrap();
    let held = holder.try_lock("report").unwrap();
    let (a, b) = (slow(), slow());
    let (tx, rx) = mpsc::channel();
    let reader = |n: usize| {
        let (a, tx) = (a.clone(), tx.clone());
        thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            let lock = a.lock_shared_until("report", deadline).unwrap();
            tx.send(n).unwrap();
            lock
        })
    };
    let first = reader(0);
    wait_queue(&servers, "a's first reader joined", |q| {
        q.iter().all(|&c| c == 2)
    });
    let second = reader(1);
    wait_local(&a, "redlock:shared:report", 2);
    a_millisecond_later();
    let writer = thread::spawn(move || {
        let lock = b.lock_until("report", Instant::now() + Duration::from_secs(20));
        lock.map(|lock| b.unlock(lock))
    });
    wait_queue(&servers, "the writer joined", |q| q.iter().all(|&c| c == 3));
    holder.unlock(held).unwrap();
    // Neither reader lets go before both are in (or 2 s have passed).
    let got: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(2)))
        .collect();
    let lock = first.join().unwrap();
    a.unlock(lock).unwrap();
    let lock = second.join().unwrap();
    a.unlock(lock).unwrap();
    assert!(
        got.iter().all(Result::is_ok),
        "the second reader was not let in beside the first: {got:?}"
    );
    assert!(matches!(writer.join().unwrap(), Ok(Ok(_))));
    wait_queue(&servers, "queue gone", |q| q.iter().all(|&c| c == 0));
}

/// A reader of `a` while three fair handles of two callers each lock `a` in a loop: each of
/// five waits is granted, after at most the writers that were ahead of it.
#[test]
fn a_fair_reader_gets_its_turn_while_fair_writers_keep_the_resource_busy() {
    let servers = Cluster::start(3);
    let on = redlock_is_fair();
    let handle = || builder(&servers).fair(on).build().unwrap();
    let busy = Busy::start(["a", "a", "a"].map(|m| (handle(), m)));
    let sections = busy.sections.clone();
    let reader = handle();
    // Per wait: the writers' sections that began while it waited (`None`: not granted).
    let mut passed = Vec::new();
    for _ in 0..5 {
        let before = sections.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(2);
        let lock = reader.lock_shared_until("a", deadline);
        passed.push(
            lock.is_ok()
                .then(|| sections.load(Ordering::Relaxed) - before),
        );
        if let Ok(lock) = lock {
            reader.unlock(lock).unwrap();
        }
    }
    busy.stop();
    // First come, first served: a writer's caller that began to wait after the reader is
    // behind it, so each of the six passes it at most once — twice where its next wait began
    // in the same millisecond as the reader's (entries order by their start in ms, a writer's
    // first). Readers that did not queue slipped in between writers, or waited for a gap.
    eprintln!("writers' sections during each reader's wait: {passed:?}");
    assert!(
        passed.iter().all(|p| p.is_some_and(|n| n <= 12)),
        "writers' sections during each reader's wait (None: not granted): {passed:?}"
    );
    wait_queue_in(&servers, "redlock:queue:a", "queue gone", |q| {
        q.iter().all(|&c| c == 0)
    });
}

/// Handles that keep resources busy: two callers of each handle lock its resource in a loop,
/// 30 ms each time. `sections` counts the sections begun.
struct Busy {
    stop: Arc<AtomicBool>,
    sections: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Busy {
    /// Starts the callers, and returns once they have begun 10 sections.
    fn start(handles: impl IntoIterator<Item = (Redlock, &'static str)>) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let sections = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for (handle, resource) in handles {
            let handle = Arc::new(handle);
            for _ in 0..2 {
                let (handle, stop, sections) = (handle.clone(), stop.clone(), sections.clone());
                threads.push(thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let deadline = Instant::now() + Duration::from_secs(10);
                        if let Ok(lock) = handle.lock_until(resource, deadline) {
                            sections.fetch_add(1, Ordering::Relaxed);
                            thread::sleep(Duration::from_millis(30));
                            handle.unlock(lock).unwrap();
                        }
                    }
                }));
            }
        }
        while sections.load(Ordering::Relaxed) < 10 {
            thread::sleep(Duration::from_millis(1));
        }
        Busy {
            stop,
            sections,
            threads,
        }
    }

    /// Stops the callers and waits for them.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn a_fair_waiter_that_gives_up_leaves_the_queue_at_once() {
    let servers = Cluster::start(3);
    // Long polls: an entry left behind would live 2 × (5 s + 5 s).
    let redlock = builder(&servers)
        .fair(true)
        .retry_delay(Duration::from_secs(5), Duration::from_secs(5))
        .build()
        .unwrap();
    let holder = builder(&servers).build().unwrap();
    let held = holder.try_lock("report").unwrap();
    let start = Instant::now();
    let refused = redlock.lock_until("report", Instant::now() + Duration::from_millis(300));
    assert!(matches!(refused, Err(Error::Held(_))), "{refused:?}");
    // The queue went with the waiter, well before its entry would have expired.
    wait_queue(&servers, "waiter left", |q| q.iter().all(|&c| c == 0));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    holder.unlock(held).unwrap();
}

#[test]
fn a_dead_waiter_keeps_its_place_until_its_entry_expires_and_try_lock_passes_nobody() {
    let servers = Cluster::start(3);
    let redlock = fair(&servers);
    // An uncontended fair lock writes nothing but its key.
    let lock = redlock.try_lock("report").unwrap();
    assert!(servers.iter().all(|s| s.dbsize() == 1));
    redlock.unlock(lock).unwrap();
    // A waiter that died: its entry, older than anyone, lives 1.5 s more on every server.
    for s in servers.iter() {
        let now = match s.cmd(&["TIME"]) {
            redis::Value::Array(t) => match (&t[0], &t[1]) {
                (redis::Value::BulkString(a), redis::Value::BulkString(b)) => {
                    let a: u64 = String::from_utf8_lossy(a).parse().unwrap();
                    let b: u64 = String::from_utf8_lossy(b).parse().unwrap();
                    a * 1000 + b / 1000
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        let expiry = (now + 1500).to_string();
        let marker = redlock_mux::keys::QUEUE_MARKER;
        s.cmd(&[
            "ZADD",
            QUEUE,
            "+inf",
            marker,
            &expiry,
            "000000000000001 deadwaiterdeadwaiterdea",
        ]);
        s.cmd(&["PEXPIRE", QUEUE, "1500"]);
    }
    let placed = Instant::now();
    // `try_lock` does not pass it; a plain handle's does (it does not queue).
    assert!(matches!(redlock.try_lock("report"), Err(Error::Held(_))));
    let plain = builder(&servers).build().unwrap();
    let lock = plain.try_lock("report").unwrap();
    plain.unlock(lock).unwrap();
    // A fair waiter is granted once the dead waiter's entry expired, not before.
    let lock = redlock
        .lock_until("report", Instant::now() + Duration::from_secs(10))
        .unwrap();
    assert!(
        placed.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        placed.elapsed()
    );
    redlock.unlock(lock).unwrap();
    wait_queue(&servers, "queue gone", |q| q.iter().all(|&c| c == 0));
}

#[test]
fn a_lock_won_at_its_first_attempt_leaves_no_entry_where_it_was_refused() {
    let servers = Cluster::start(3);
    let redlock = fair(&servers);
    // Held on one node only (a lock's key that node kept): the first attempt wins on the other
    // two. Had that attempt joined the queue where it was refused, its entry — older than any
    // later waiter's — would make that node refuse everybody until it expired.
    servers[2].cmd(&["SET", "report", "elsewhere", "PX", "30000"]);
    let lock = redlock
        .lock_until("report", Instant::now() + Duration::from_secs(5))
        .unwrap();
    // The third node's answer is in (a refusal), so its script has run.
    let until = Instant::now() + Duration::from_secs(5);
    while redlock.stats().nodes.iter().map(|n| n.refused).sum::<u64>() < 1 {
        assert!(Instant::now() < until, "no refusal seen");
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(queued(&servers, QUEUE), vec![0, 0, 0]);
    redlock.unlock(lock).unwrap();
}

#[test]
fn a_key_under_the_queue_s_name_that_is_not_ours_is_left_as_it_is() {
    let servers = Cluster::start(3);
    let redlock = fair(&servers);
    for (kind, write) in [
        ("string", vec!["SET", QUEUE, "theirs"]),
        ("sorted set", vec!["ZADD", QUEUE, "1", "theirs"]),
    ] {
        for s in servers.iter() {
            s.cmd(&write);
        }
        // The resource is free, but the node may not use a queue that is not its own: for
        // a writer nor for a reader.
        for refused in [
            redlock.try_lock("report"),
            redlock.try_lock_shared("report"),
        ] {
            let text = format!("{refused:?}");
            assert!(
                refused.is_err() && text.contains("not a redlock-mux queue"),
                "{kind}: {text}"
            );
        }
        assert!(
            servers
                .iter()
                .all(|s| s.cmd(&["EXISTS", "report"]) == redis::Value::Int(0))
        );
        for s in servers.iter() {
            let kept = match kind {
                "string" => s.get(QUEUE) == Some("theirs".into()),
                _ => s.cmd(&["ZSCORE", QUEUE, "theirs"]) == redis::Value::BulkString(b"1".to_vec()),
            };
            assert!(kept, "{kind} changed");
            assert_eq!(s.pttl(QUEUE), -1, "{kind}: TTL set");
            s.cmd(&["DEL", QUEUE]);
        }
    }
}

#[test]
fn a_fair_lock_is_not_fenced() {
    let servers = Cluster::start(1);
    let built = builder(&servers).fair(true).fencing(true).build();
    assert!(
        matches!(built, Err(Error::Config(ref m)) if m.contains("fair")),
        "{built:?}"
    );
}

#[test]
fn a_fair_lock_is_not_also_ordered_sets() {
    let servers = Cluster::start(1);
    let built = builder(&servers).fair(true).ordered_sets(true).build();
    assert!(
        matches!(built, Err(Error::Config(ref m)) if m.contains("ordered_sets")),
        "{built:?}"
    );
}

/// A set whose members `a` and `b` are each locked and unlocked in a loop by three handles of
/// two callers each (a member is free only between a release and the next attempt, and hardly
/// ever both at once). Fair, the set joins
/// both queues: the callers' waits that begin after it step back on each member, which stays
/// free for the set once its holder is done, and each of five waits is granted. Sets that do
/// not queue (plain handles: `FAIR_TEST_PLAIN=1`, the control) wait for a moment when both
/// are free, and some reach their deadline.
#[test]
fn a_fair_set_gets_its_members_while_fair_callers_keep_each_of_them_busy() {
    let servers = Cluster::start(3);
    let on = redlock_is_fair();
    let handle = || builder(&servers).fair(on).build().unwrap();
    let busy = Busy::start(["a", "a", "a", "b", "b", "b"].map(|m| (handle(), m)));
    let sections = busy.sections.clone();
    let before = sections.load(Ordering::Relaxed);
    let waiter = handle();
    let both = ResourceSet::new(["a", "b"]).unwrap();
    // Five waits of 2 s each, one after the other.
    let mut granted = 0;
    for _ in 0..5 {
        if let Ok(lock) = waiter.lock_until(&both, Instant::now() + Duration::from_secs(2)) {
            granted += 1;
            waiter.unlock(lock).unwrap();
        }
    }
    let meanwhile = sections.load(Ordering::Relaxed) - before;
    busy.stop();
    assert_eq!(
        granted, 5,
        "set waits granted ({meanwhile} sections of its members meanwhile)"
    );
    // Everybody left: no queue is left behind.
    for queue in ["redlock:queue:a", "redlock:queue:b"] {
        wait_queue_in(&servers, queue, "queue left", |q| q.iter().all(|&c| c == 0));
    }
}
