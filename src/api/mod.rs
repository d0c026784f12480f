//! The API: what users call. [`Redlock`] (the blocking handle many threads share) and
//! [`AsyncRedlock`] (its async face, the same engine), guards that release on drop
//! (`guard.rs`), locks kept alive by the engine (`keep_alive.rs`), counting semaphores
//! (`semaphore.rs`), and what a re-entrant `with_lock` knows (`reentry.rs`). Read-write and
//! set locks are kinds of one lock (`model::lock::Shared`, `ResourceSet`), taken through the
//! same handles.
//!
//! Each kind is one file, and its blocking and async faces one type: `LockGuard<R>`,
//! `KeepAlive<R>` and `Semaphore<R>` hold what both share, with `R = Redlock` by default and
//! `AsyncLockGuard`, `AsyncKeepAlive`, `AsyncSemaphore` naming the `R = AsyncRedlock` face;
//! only the methods that wait are written twice, once blocking and once `async`.
//!
//! What it may not touch: sockets, the mio loop and the engine's internals — it asks the
//! runtime (a handle's hub) for operations and gets their outcomes; every layer below is
//! free of it.
//!
//! [`Redlock`]: redlock::Redlock
//! [`AsyncRedlock`]: async_redlock::AsyncRedlock

pub(crate) mod async_redlock;
pub(crate) mod guard;
pub(crate) mod keep_alive;
pub(crate) mod redlock;
pub(crate) mod reentry;
pub(crate) mod semaphore;
