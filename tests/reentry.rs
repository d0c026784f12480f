//! Re-locking a resource the caller itself holds, against real servers.
//!
//! From inside the work of `with_lock(R)` (blocking: the same thread; async: polled inside the
//! work, the same task) an acquire of R through the same handle fails at once with
//! `Error::AlreadyHeld`; before, it waited until its deadline and returned `Held` (the lock it
//! waited for is released only when the work returns). Callers that may legitimately wait — a
//! thread or task spawned from the work, a lock handed to another thread — still wait.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use redis_local::Cluster;
use redlock_mux::{Builder, Error, Redlock, ResourceSet, Shared};

/// Long enough that a wait for it would be seen (every assertion on `AlreadyHeld` would have
/// got `Held` after it before the fix).
const WAIT: Duration = Duration::from_secs(2);

fn build(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(200))
}

/// Waits (bounded) until `n` callers of `redlock` wait in the queue of `resource`.
fn until_waiting(redlock: &Redlock, resource: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while redlock
        .with_client(|c| redlock_mux::testing::waiters(c, resource.as_bytes()))
        .unwrap()
        != n
    {
        assert!(
            Instant::now() < deadline,
            "never {n} waiting for {resource}"
        );
        std::thread::yield_now();
    }
}

fn already_held<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    match result {
        Err(e @ Error::AlreadyHeld { .. }) => {
            assert!(e.to_string().contains("already held by this caller"), "{e}");
        }
        other => panic!("{what}: expected AlreadyHeld, got {other:?}"),
    }
}

#[test]
fn inside_with_lock_every_acquire_of_the_same_resource_fails_at_once() {
    let servers = Cluster::start(3);
    let redlock: Redlock = build(&servers).build().unwrap();
    let other_handle = build(&servers).build().unwrap();
    let value = redlock.with_lock("r", |_| {
        let deadline = Instant::now() + WAIT;
        already_held("try_lock", redlock.try_lock("r"));
        already_held("lock_until", redlock.lock_until("r", deadline));
        already_held("lock", redlock.lock("r"));
        already_held("guard", redlock.guard("r").map(|_| ()));
        let nested = redlock.with_lock("r", |_| ()).map_err(Error::from);
        already_held("nested with_lock", nested);
        // A clone is the same handle.
        already_held("clone", redlock.clone().try_lock("r"));
        // Another resource is locked as usual, and the same one through another handle
        // (another client, as far as the servers know) is simply held.
        let other = redlock.try_lock("s").unwrap();
        redlock.unlock(other).unwrap();
        assert!(matches!(other_handle.try_lock("r"), Err(Error::Held(_))));
        7
    });
    assert_eq!(value.unwrap(), 7);
    // Outside the work the resource is free again, and locks as usual.
    let lock = redlock.try_lock("r").unwrap();
    redlock.unlock(lock).unwrap();
}

/// The same resource in another shape is the same resource: inside a read lock's work a writer
/// of its name, a set with it as a member, inside a set's work a plain lock or a reader of a
/// member or an overlapping set — each fails at once (before: a writer inside a reader waited
/// for itself until its deadline). A reader inside a reader of the same name fails too: a
/// writer waiting meanwhile would keep it out while waiting for the outer reader. A reader of
/// another name is granted.
#[test]
fn inside_with_lock_every_shape_that_the_held_lock_excludes_fails_at_once() {
    let servers = Cluster::start(3);
    let redlock: Redlock = build(&servers).build().unwrap();
    let deadline = || Instant::now() + WAIT;
    let shared = Shared::new("r").unwrap();
    let value = redlock.with_lock(&shared, |_| {
        already_held("writer", redlock.lock_until("r", deadline()));
        let set = ResourceSet::new(["q", "r"]).unwrap();
        already_held("set", redlock.lock_until(&set, deadline()));
        already_held("reader", redlock.lock_shared_until("r", deadline()));
        let reader = redlock.try_lock_shared("q").unwrap();
        redlock.unlock(reader).unwrap();
        let other = redlock.try_lock("s").unwrap();
        redlock.unlock(other).unwrap();
        1
    });
    assert_eq!(value.unwrap(), 1);
    let set = ResourceSet::new(["a", "b"]).unwrap();
    let value = redlock.with_lock(&set, |_| {
        already_held("member", redlock.lock_until("b", deadline()));
        already_held("reader", redlock.lock_shared_until("a", deadline()));
        let overlapping = ResourceSet::new(["b", "c"]).unwrap();
        already_held(
            "overlapping set",
            redlock.lock_until(&overlapping, deadline()),
        );
        let apart = ResourceSet::new(["c", "d"]).unwrap();
        let lock = redlock.try_lock(&apart).unwrap();
        redlock.unlock(lock).unwrap();
        2
    });
    assert_eq!(value.unwrap(), 2);
}

/// A thread spawned from the work is another caller: it waits for the work's lock and gets it
/// once the work returns.
#[test]
fn a_thread_spawned_from_the_work_waits_and_gets_the_lock() {
    let servers = Cluster::start(3);
    let redlock = build(&servers).build().unwrap();
    let waiter = redlock
        .with_lock("r", |_| {
            let r = redlock.clone();
            let waiter = std::thread::spawn(move || {
                r.lock_until("r", Instant::now() + Duration::from_secs(10))
            });
            // It waits while the work runs (queued, not refused).
            until_waiting(&redlock, "r", 1);
            waiter
        })
        .unwrap();
    let lock = waiter
        .join()
        .unwrap()
        .expect("the spawned thread waited and got the lock");
    redlock.unlock(lock).unwrap();
}

/// A lock handed to another thread, which releases it later: the thread that locked it locks
/// the same resource again and waits for that release (no `AlreadyHeld`).
#[test]
fn a_lock_handed_to_another_thread_is_waited_for_not_refused() {
    let servers = Cluster::start(3);
    let redlock = build(&servers).build().unwrap();
    let lock = redlock.lock("job").unwrap();
    let (go, wait_go) = mpsc::channel::<()>();
    let worker = {
        let r = redlock.clone();
        std::thread::spawn(move || {
            wait_go.recv().unwrap();
            r.unlock(lock).unwrap();
        })
    };
    let again = {
        let r = redlock.clone();
        std::thread::spawn(move || r.lock_until("job", Instant::now() + Duration::from_secs(10)))
    };
    // The thread that locked waits (queued, not refused) until the worker releases.
    until_waiting(&redlock, "job", 1);
    go.send(()).unwrap();
    worker.join().unwrap();
    let again = again.join().unwrap().unwrap();
    redlock.unlock(again).unwrap();
}

#[test]
fn async_inside_with_lock_acquires_of_the_same_resource_fail_at_once_and_spawned_tasks_wait() {
    let servers = Cluster::start(3);
    let redlock = build(&servers).build_async().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = redlock.clone();
        let spawned = redlock
            .with_lock("r", async |_| {
                let deadline = Instant::now() + WAIT;
                already_held("try_lock", r.try_lock("r").await);
                already_held("lock_until", r.lock_until("r", deadline).await);
                already_held("lock", r.lock("r").await);
                already_held("guard", r.guard("r").await.map(|_| ()));
                let nested = r.with_lock("r", async |_| ()).await.map_err(Error::from);
                already_held("nested with_lock", nested);
                // The blocking face of the same handle, called from the task: the same caller.
                already_held("blocking face", r.blocking().try_lock("r"));
                // A task spawned from the work is another caller: it waits for the lock.
                let r2 = r.clone();
                let task = tokio::spawn(async move {
                    r2.lock_until("r", Instant::now() + Duration::from_secs(10))
                        .await
                });
                // It waits while the work runs (queued, not refused).
                let blocking = r.blocking().clone();
                tokio::task::spawn_blocking(move || until_waiting(&blocking, "r", 1))
                    .await
                    .unwrap();
                // (In a tuple: clippy would read a bare `JoinHandle` as a forgotten `.await`.)
                (task,)
            })
            .await
            .unwrap();
        let lock = spawned
            .0
            .await
            .unwrap()
            .expect("the spawned task waited and got the lock");
        redlock.unlock(lock).await.unwrap();
    });
}

/// Once the lock of the `with_lock` is lost, the resource is not the caller's any more: an
/// acquire from inside the work is an ordinary one (here refused by the new holder, `Held`).
#[test]
fn after_the_lock_is_lost_the_work_may_try_again() {
    let servers = Cluster::start(3);
    let redlock = build(&servers)
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let result = redlock.with_lock("r", |held| {
        // Another client takes the key over on every node: the renewal fails.
        for s in servers.iter() {
            s.cmd(&["SET", "r", "someone-else", "PX", "60000"]);
        }
        assert!(held.wait_lost(Duration::from_secs(10)).is_some());
        match redlock.try_lock("r") {
            Err(Error::Held(_)) => {}
            other => panic!("expected Held from the new holder, got {other:?}"),
        }
    });
    assert!(result.is_err());
}

/// Inside `with_permit`, an acquire of the same semaphore does not wait for the permit the work
/// holds (the semaphore's paths skipped the check, and with one permit
/// `acquire` waited out its deadline for itself, then said `Held`). With one permit:
/// `AlreadyHeld` at once; with two, the other permit is taken.
#[test]
fn inside_with_permit_the_semaphore_does_not_wait_for_itself() {
    let servers = Cluster::start(3);
    let redlock: Redlock = build(&servers).build().unwrap();
    let one = redlock.semaphore("one", 1).unwrap();
    let value = one.with_permit(|_| {
        let deadline = Instant::now() + WAIT;
        already_held("try_acquire", one.try_acquire());
        already_held("acquire_until", one.acquire_until(deadline));
        assert!(Instant::now() < deadline, "waited for itself");
        let mut c = build(&servers).build_client().unwrap();
        assert!(matches!(
            c.try_acquire_permit("one", 1),
            Err(Error::Held(_))
        ));
        1
    });
    assert_eq!(value.unwrap(), 1);
    let two = redlock.semaphore("two", 2).unwrap();
    let value = two.with_permit(|held| {
        let other = two.acquire().unwrap();
        assert_ne!(other.resource(), held.lock().resource());
        redlock.unlock(other).unwrap();
        2
    });
    assert_eq!(value.unwrap(), 2);
    let async_one = redlock_mux::AsyncRedlock::from(redlock.clone())
        .semaphore("one", 1)
        .unwrap();
    let got = futures::executor::block_on(async_one.with_permit(async |_| {
        let deadline = Instant::now() + WAIT;
        already_held(
            "async acquire_until",
            async_one.acquire_until(deadline).await,
        );
        assert!(Instant::now() < deadline, "waited for itself");
        3
    }));
    assert_eq!(got.unwrap(), 3);
}

/// Inside `with_permit` of a semaphore of two, an acquire whose turn is the permit held takes
/// the other one even with its deadline passed (past the deadline only the
/// permit in turn was attempted, and the answer was `AlreadyHeld`, which is for a caller that
/// holds every permit). In both faces.
#[test]
fn inside_with_permit_an_acquire_past_its_deadline_takes_the_other_permit() {
    let servers = Cluster::start(3);
    let redlock: Redlock = build(&servers).build().unwrap();
    let two = redlock.semaphore("two", 2).unwrap();
    let value = two.with_permit(|held| {
        assert_eq!(two.permit_of(&held.lock()), Some(0));
        // Permit 1, in turn; then the turn is permit 0's, the one held.
        let next = two.try_acquire().unwrap();
        assert_eq!(two.permit_of(&next), Some(1));
        redlock.unlock(next).unwrap();
        let other = two.acquire_until(Instant::now()).unwrap();
        assert_eq!(two.permit_of(&other), Some(1));
        redlock.unlock(other).unwrap();
        2
    });
    assert_eq!(value.unwrap(), 2);
    let async_face = redlock_mux::AsyncRedlock::from(redlock.clone());
    let async_two = async_face.semaphore("async-two", 2).unwrap();
    let got = futures::executor::block_on(async_two.with_permit(async |held| {
        assert_eq!(async_two.permit_of(&held.lock()), Some(0));
        let next = async_two.try_acquire().await.unwrap();
        assert_eq!(async_two.permit_of(&next), Some(1));
        async_face.unlock(next).await.unwrap();
        let other = async_two.acquire_until(Instant::now()).await.unwrap();
        assert_eq!(async_two.permit_of(&other), Some(1));
        async_face.unlock(other).await.unwrap();
        3
    }));
    assert_eq!(got.unwrap(), 3);
}

/// Calls into a handle from its own `with_client` closure fail at once with `Reentrant`: the
/// engine is the closure's thread's, and such a call (a `try_lock`, a nested `with_client`)
/// waited for itself forever, and every other caller of the handle with it.
/// The `Client` the closure is given works; an `unlock` from the closure is queued and goes out
/// when it returns; the handle works after.
#[test]
fn calls_from_the_handles_own_with_client_closure_fail_at_once() {
    let servers = Cluster::start(3);
    let redlock = build(&servers).build().unwrap();
    let held = redlock.try_lock("held").unwrap();
    let (tx, rx) = mpsc::channel();
    let r = redlock.clone();
    std::thread::spawn(move || {
        let inner = r.clone();
        let got = r.with_client(move |c| {
            let r = inner;
            let reentrant = |what: &str, e: Option<Error>| match e {
                Some(Error::Reentrant) => String::new(),
                other => format!("{what}: {other:?}; "),
            };
            let mut wrong = String::new();
            wrong += &reentrant("try_lock", r.try_lock("x").err());
            let until = Instant::now() + WAIT;
            wrong += &reentrant("lock_until", r.lock_until("x", until).err());
            wrong += &reentrant("with_client", r.with_client(|_| ()).err());
            wrong += &reentrant("connect", r.connect(WAIT).err());
            let semaphore = r.semaphore("s", 2).unwrap();
            wrong += &reentrant("semaphore", semaphore.try_acquire().err());
            wrong += &reentrant("unlock", r.unlock(held).err());
            let status = r.status(b"x", WAIT).len();
            let shutdown = r.shutdown(WAIT);
            let direct = c.try_lock("direct").and_then(|l| c.unlock(l));
            (
                wrong,
                status,
                shutdown.confirmed,
                direct.map_err(|e| e.to_string()),
            )
        });
        let _ = tx.send(got);
    });
    let got = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a call from the with_client closure waited for itself")
        .unwrap();
    assert_eq!(got, (String::new(), 0, 0, Ok(3)));
    // The queued release went out once the closure returned.
    let lock = redlock.lock_until("held", Instant::now() + WAIT).unwrap();
    assert_eq!(redlock.unlock(lock).unwrap(), 3);
}

/// A call into a handle from a `with_client` closure of another handle nested in its own
/// (`a.with_client(|_| b.with_client(|_| a.try_lock(..)))`) fails at once with `Reentrant` too:
/// only the innermost handle was marked as this thread's, so the call queued for `a`'s engine —
/// held by this very thread — and parked for ever, and every other caller of `a` with it (found
/// by review). The calls run on a thread of their own, waited for with a bound. The marks are
/// taken off again when the closures return, and when they panic.
#[test]
fn calls_into_an_outer_handle_from_a_nested_with_client_fail_at_once() {
    let servers = Cluster::start(3);
    let a = build(&servers).build().unwrap();
    let b = build(&servers).build().unwrap();
    let (tx, rx) = mpsc::channel();
    let (a2, b2) = (a.clone(), b.clone());
    std::thread::spawn(move || {
        let (a, b) = (a2, b2);
        let reentrant = |what: &str, e: Option<Error>| match e {
            Some(Error::Reentrant) => String::new(),
            other => format!("{what}: {other:?}; "),
        };
        let nested = a.with_client(|_| {
            b.with_client(|_| {
                let mut wrong = String::new();
                wrong += &reentrant("outer try_lock", a.try_lock("x").err());
                let until = Instant::now() + WAIT;
                wrong += &reentrant("outer lock_until", a.lock_until("x", until).err());
                wrong += &reentrant("outer with_client", a.with_client(|_| ()).err());
                wrong += &reentrant("inner try_lock", b.try_lock("x").err());
                wrong
            })
        });
        // A panic in the nested closures takes both marks off on its way out.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.with_client(|_| b.with_client(|_| panic!("inside both closures")))
        }));
        // (`with_client` looks at the marks first; a mark left behind refuses it.)
        let marks_gone = (a.with_client(|_| ()), b.with_client(|_| ()));
        let after = (a.try_lock("y"), b.try_lock("z"));
        let _ = tx.send((nested, panicked.is_err(), marks_gone, after));
    });
    let (nested, panicked, marks_gone, (after_a, after_b)) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a call into the outer handle from the nested closure waited for itself");
    assert_eq!(nested.unwrap().unwrap(), "");
    assert!(panicked);
    assert!(matches!(marks_gone, (Ok(()), Ok(()))), "{marks_gone:?}");
    // Both handles work on that thread after, and here.
    assert_eq!(a.unlock(after_a.unwrap()).unwrap(), 3);
    assert_eq!(b.unlock(after_b.unwrap()).unwrap(), 3);
    let lock = a.try_lock("x").unwrap();
    assert_eq!(a.unlock(lock).unwrap(), 3);
}

/// The async face from a `with_client` closure of its own handle (a `block_on` inside the
/// closure, say) is refused at the call's first poll as the blocking face is: the request went
/// to the mailbox of an engine held by this very thread and the future stayed pending for ever
/// — with it every other caller of the handle. Each future here is polled
/// once: `Ready` with `Reentrant` (a status read with no node), not `Pending`. The release is
/// queued and goes out once the closure returns.
#[test]
fn the_async_face_from_its_handles_with_client_closure_is_refused_at_once() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    fn once<F: Future>(f: F) -> Option<F::Output> {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }
    let servers = Cluster::start(3);
    let redlock = build(&servers).build().unwrap();
    let mut held = redlock.try_lock("held").unwrap();
    let r = redlock_mux::AsyncRedlock::from(redlock.clone());
    let got = redlock
        .with_client(|_| {
            let reentrant = |what: &str, e: Option<Result<(), Error>>| match e {
                Some(Err(Error::Reentrant)) => String::new(),
                other => format!("{what}: {other:?}; "),
            };
            let mut wrong = String::new();
            let drop_lock = |r: Option<Result<redlock_mux::Lock, Error>>| r.map(|r| r.map(drop));
            wrong += &reentrant("try_lock", drop_lock(once(r.try_lock("x"))));
            let until = Instant::now() + WAIT;
            wrong += &reentrant("lock_until", drop_lock(once(r.lock_until("x", until))));
            let ttl = Duration::from_secs(5);
            wrong += &reentrant("extend", once(r.extend(&mut held, ttl)));
            let semaphore = r.semaphore("s", 2).unwrap();
            wrong += &reentrant("semaphore", drop_lock(once(semaphore.try_acquire())));
            wrong += &reentrant("unlock", once(r.unlock(held)).map(|r| r.map(drop)));
            let status = once(r.status(b"x", WAIT)).map(|s| s.len());
            (wrong, status)
        })
        .unwrap();
    assert_eq!(got, (String::new(), Some(0)));
    // The queued release went out once the closure returned.
    let lock = redlock.lock_until("held", Instant::now() + WAIT).unwrap();
    assert_eq!(redlock.unlock(lock).unwrap(), 3);
}
