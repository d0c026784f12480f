//! Calls into code that is not the engine's — a task's waker, a lost lock's callback, a name
//! resolver — with its panic caught, so that it cannot unwind through the engine's turn and
//! end the thread that drives the loop for every caller.

use std::task::Waker;

/// Wakes a caller's task. A waker is the executor's code, and one that panics would unwind
/// through whatever called it — the engine in the middle of a turn, and its thread with it,
/// which drives the loop for every async caller: the panic stops here, and only that task's
/// wake is lost.
pub(crate) fn wake(waker: Waker) {
    if catch(|| waker.wake()).is_none() {
        crate::model::event::event!(Warn, event = "waker_panicked"; "a task's waker panicked; its wake-up is lost");
    }
}

/// Runs someone else's code (a waker, a loss callback, a resolver), catching a panic: `None`
/// if it panicked. The panic's payload is dropped under a guard too — a payload whose `Drop`
/// panics would otherwise unwind from here after all, through the engine's turn and out of its
/// thread — and leaked if dropping it panics.
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> Option<R> {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
            None
        }
    }
}
