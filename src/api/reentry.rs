//! Re-locking a resource the caller itself holds: what `with_lock` knows, and a bare [`Lock`]
//! cannot tell.
//!
//! While the work of `with_lock(R)` runs — on the calling thread (blocking), or polled inside
//! the `with_lock` future, so within the task that holds the lock (async) — this thread has
//! (engine, R) in a thread-local list. An acquire of R — or of any shape of lock that R
//! excludes: a writer inside a reader of the same name, a set with a member in common — through
//! the same engine from inside the work (`try_lock`, `lock`, `lock_until`, `guard`, a nested
//! `with_lock`, in either face) could only end at its deadline: the lock it waits for is
//! released when the work returns.
//! It fails at once with [`Error::AlreadyHeld`] instead. A task spawned from the work is polled
//! elsewhere, not inside the work: it waits like any other caller, as it should (the work may
//! end meanwhile).
//!
//! Why not every held lock: a [`Lock`] is a value that can be moved to another thread or task
//! and released there (a producer that locks and hands each lock to a worker, then locks the
//! same resource again, must wait, not fail), and callers of one handle waiting for each
//! other's locks is what the wait queues are for. Only `with_lock` knows that the lock stays
//! with the caller until the work returns. Everywhere else re-locking waits, as with
//! `std::sync::Mutex` — bounded by the deadline here.
//!
//! Limits, known and left: a work that drives an executor of its own on this thread (a
//! current-thread runtime's `block_on`, a `LocalSet`) polls other tasks "inside" it, and their
//! acquires of the same resource fail too; an acquire first polled outside the work and awaited
//! inside it is not recognised (it waits).
//!
//! [`Lock`]: crate::Lock

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::engine::kept::Kept;
use crate::model::error::Error;

/// One `with_lock` whose work runs on this thread now.
struct Inside {
    engine: usize,
    /// Its lock: once lost (or past its validity), the resource is not the caller's any more
    /// and may be locked again from inside the work.
    kept: Arc<Kept>,
}

thread_local! {
    /// Every `with_lock` whose work runs on this thread now, innermost last.
    static HELD: RefCell<Vec<Inside>> = const { RefCell::new(Vec::new()) };
}

/// Refuses an acquire of `resource` through `engine` from inside the work of a `with_lock`
/// through the same engine whose lock excludes it ([`crate::model::keys::excludes`]: the same name, a
/// shared lock and a writer of it, sets with a member in common, a reader of the name held for
/// reading). Costs a thread-local look when no work runs.
pub(crate) fn check(engine: usize, resource: &[u8]) -> Result<(), Error> {
    let inside = HELD
        .try_with(|held| {
            let held = held.borrow();
            !held.is_empty()
                && held.iter().any(|i| {
                    i.engine == engine
                        && crate::model::keys::excludes(i.kept.base().resource(), resource)
                        && i.kept.is_held()
                })
        })
        .unwrap_or(false);
    if inside {
        return Err(Error::AlreadyHeld {
            resource: String::from_utf8_lossy(resource).into_owned(),
        });
    }
    Ok(())
}

/// The work of a `with_lock` running on this thread: (engine, resource) listed until dropped.
pub(crate) struct Scope {
    entered: bool,
}

impl Scope {
    pub(crate) fn enter(engine: usize, kept: &Arc<Kept>) -> Scope {
        let inside = Inside {
            engine,
            kept: kept.clone(),
        };
        let entered = HELD.try_with(|held| held.borrow_mut().push(inside)).is_ok();
        Scope { entered }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.entered {
            // Scopes nest (a work inside a work, a poll inside a poll): the last is ours.
            let _ = HELD.try_with(|held| held.borrow_mut().pop());
        }
    }
}

/// An async `with_lock`'s work: polled with its (engine, resource) listed, so that an acquire
/// first polled inside it — in the same task — is recognised.
pub(crate) struct Scoped<F> {
    /// Boxed: `F` need not be `Unpin`, and this crate has no unsafe pin projection.
    work: Pin<Box<F>>,
    engine: usize,
    kept: Arc<Kept>,
}

impl<F: Future> Scoped<F> {
    pub(crate) fn new(work: F, engine: usize, kept: &Arc<Kept>) -> Scoped<F> {
        Scoped {
            work: Box::pin(work),
            engine,
            kept: kept.clone(),
        }
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let _scope = Scope::enter(this.engine, &this.kept);
        this.work.as_mut().poll(cx)
    }
}
