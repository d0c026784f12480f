//! Counting semaphores: at most P holders of a name at once, each holding one of P permits, and
//! every permit a plain Redlock of its own on `<name>#<i>` (i in 0..P).
//!
//! An acquire attempts one permit first, alone (`SET … NX PX` on one key per node): the next in
//! turn, the semaphore counting its acquires (permit 0 for the first acquire of a fresh
//! semaphore, then 1, 2, …, P − 1, 0, …). Only if that permit is not won (held, or its votes
//! split) are all the others attempted in one go (their `SET`s go out in one write per node); of
//! those, the first permit won (the lowest index when several are decided together) is kept,
//! and every other permit won is released at once, without waiting for the replies.
//! Uncontended, a permit cycle is therefore what a plain lock's is: one `SET` and one release
//! per node; with every permit held it costs one more round trip than attempting all at once,
//! and the same P `SET`s per node.
//!
//! **P is part of the name**: nothing on the servers records it, so every caller of a semaphore
//! must use the same P (callers with P = 3 and P = 5 of one name admit five holders together).
//!
//! So the semaphore is safe by construction — a permit is a plain lock, held by one holder at
//! most, so there are at most P holders — and available while a majority of the masters is up,
//! as a plain lock is. A permit *is* a [`Lock`] (on `<name>#<i>`): unlock, extend, keep-alive,
//! guards, fencing work on it unchanged.
//!
//! Why one permit first: attempting all P at once wins all P when nobody holds them, and every
//! node then runs P `SET`s and P release scripts for one holder. With five servers on two cores
//! that made a permit cycle 1.6–1.75× a plain cycle (P = 3); one permit first brings it to a
//! plain cycle's cost (docs/benchmarks.md, "Semaphores"). In turn rather than always the same
//! permit, so that concurrent acquires of one semaphore start on different permits; rather than
//! at random, so that a fresh semaphore hands out permit 0 first, as the CLI shows.
//!
//! Why not a counter per node (a set of holders per node, admitted while it has fewer than P,
//! and a majority of nodes to admit): P + 1 holders fit on majorities of M nodes as soon as
//! (P + 1)·⌊M/2 + 1⌋ ≤ P·M (M = 5, P = 3: four holders on three nodes each use 12 of the 15
//! places). A larger quorum would fix that, at the cost of availability with a bare majority.
//!
//! Waiting ([`Semaphore::acquire_until`], [`AsyncSemaphore::acquire_until`]): after the attempt
//! on one permit, the waiting acquires of all P permits are handed to the engine together, each
//! queued behind this handle's other callers waiting for that permit and woken by its release
//! (release notices, then the fallback poll); the first to win is kept and the others are
//! cancelled, which releases whatever they win meanwhile. So a waiter wakes on the release of
//! any permit. Once the deadline has passed (a deadline of now, a zero
//! [`Config::lock_wait`]), the second step is the non-waiting one of `try_acquire`: every
//! other permit attempted once — an acquire answers [`Error::Held`] only when no permit was
//! won, never for the one permit in turn. [`Client::acquire_permit_until`] has no wait queues of its own to share: it
//! waits on one permit chosen at random for a slice of a retry pause, then tries them again.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use rand::RngExt;

use crate::api::async_redlock::AsyncRedlock;
use crate::api::guard::{AsyncLockGuard, LockGuard, guard};
use crate::api::keep_alive::KeepAlive;
use crate::api::keep_alive::LockWatch;
use crate::api::redlock::Redlock;
use crate::engine::request::ReqKind;
use crate::model::config::Config;
use crate::model::error::{Error, WithLockError};
use crate::model::lock::Lock;
use crate::model::round::deadline_after;
use crate::model::token::Token;
use crate::runtime::call::Call;
use crate::runtime::client::{Client, lock_of};

/// The most permits a semaphore may have. An acquire that finds its first permit taken attempts
/// all the others (P `SET`s per node), and a waiting acquire queues on all of them: beyond a
/// few dozen a counter would be the better tool, and its safety costs what is explained in the
/// module docs.
pub const MAX_PERMITS: u32 = 64;

/// A blocked thread waiting for a future re-polls it at least this seldom (it is unparked when
/// an outcome is in: the re-poll only bounds a lost wake-up).
const RECHECK: Duration = Duration::from_millis(100);

/// The permits' names of the semaphore `name` with `permits` permits, checked as lock names.
fn permit_names(config: &Config, name: &[u8], permits: u32) -> Result<Arc<[Vec<u8>]>, Error> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::PermitCount {
            permits,
            max: MAX_PERMITS,
        });
    }
    // The name itself first (empty, reserved prefix), then every permit's key (its length).
    // Each as one plain key, not by its shape as a lock's resource is: a permit that read as a
    // shared lock's name (`redlock:shared:x#0`) would be a read lock, which any number of
    // callers hold at once — so a set's or a shared lock's encoding, in the reserved
    // namespace, is refused as a semaphore's name.
    config.check_name(name)?;
    (0..permits)
        .map(|i| {
            let key = crate::model::keys::permit_key(name, i);
            // Said of the permit's key, with the name's length: the caller gave the name, and
            // "a name of 1025 bytes" for a name of 1023 would not say which limit it meets.
            if key.len() > config.max_resource_len {
                return Err(Error::Config(format!(
                    "semaphore name of {} bytes: its permit key `<name>{}{i}` would be {} bytes, \
                     longer than the limit of {}",
                    name.len(),
                    crate::model::keys::PERMIT_SEPARATOR,
                    key.len(),
                    config.max_resource_len
                )));
            }
            config.check_name(&key)?;
            Ok(key)
        })
        .collect()
}

/// The outcome of an attempt on one permit, with the permit's index.
type Attempt = (usize, Result<Lock, Error>);

/// The permit an acquire attempts first, alone: its turn (a count of the semaphore's or the
/// client's acquires) modulo the permits, so that consecutive or concurrent acquires of one
/// semaphore start on different permits, and the first acquire of a fresh one on permit 0.
fn first_pick(permits: usize, turn: u32) -> usize {
    usize::try_from(turn).unwrap_or(0) % permits.max(1)
}

/// Every permit but `first`, in permit order: the second step of an acquire.
fn others(permits: usize, first: usize) -> Vec<usize> {
    (0..permits).filter(|&i| i != first).collect()
}

/// Whether an acquire whose first permit failed with `e` goes on (to the other permits, or to
/// waiting): unless `e` would fail them all (a final error: too few nodes left, refused
/// credentials). A permit this caller keeps already ([`Error::AlreadyHeld`]) is final for that
/// permit only, so for the semaphore only if it has no other.
fn try_others(e: &Error, permits: usize) -> bool {
    !e.is_permanent() || (permits > 1 && matches!(e, Error::AlreadyHeld { .. }))
}

/// Of the outcomes of attempts on permits (index, outcome), the permit of lowest index won;
/// every other permit won is returned in `extra`, for the caller to release without waiting.
/// With no permit won: as [`report`].
fn first_won(
    attempts: impl IntoIterator<Item = Attempt>,
    extra: &mut Vec<Lock>,
) -> Result<Lock, Error> {
    let mut won: Vec<(usize, Lock)> = Vec::new();
    let mut errors = Vec::new();
    for (i, result) in attempts {
        match result {
            Ok(lock) => won.push((i, lock)),
            Err(e) => errors.push((i, e)),
        }
    }
    won.sort_by_key(|&(i, _)| i);
    let mut won = won.into_iter().map(|(_, lock)| lock);
    match won.next() {
        Some(lock) => {
            extra.extend(won);
            Ok(lock)
        }
        None => Err(report(errors)),
    }
}

/// Of the errors of the permits attempted (index, error; none won), the one to report: the
/// error of the lowest permit that is not simply held (too few nodes, …), or, when every one
/// is held, [`Error::Held`] with the report of the lowest permit held by another holder —
/// [`Error::AlreadyHeld`] only when this caller holds every permit.
fn report(mut errors: Vec<(usize, Error)>) -> Error {
    errors.sort_by_key(|&(i, _)| i);
    let held = |e: &Error| matches!(e, Error::Held(_) | Error::AlreadyHeld { .. });
    let other = errors.iter().position(|(_, e)| !held(e));
    let by_another = errors.iter().position(|(_, e)| matches!(e, Error::Held(_)));
    match other.or(by_another).or((!errors.is_empty()).then_some(0)) {
        Some(at) => errors.swap_remove(at).1,
        None => Error::Internal("a semaphore without permits"),
    }
}

/// The index of the permit `lock` is of, if it is one of the semaphore `names`.
fn index_of(names: &[Vec<u8>], lock: &Lock) -> Option<u32> {
    let key: &[u8] = lock.resource();
    names
        .iter()
        .position(|n| n.as_slice() == key)
        .and_then(|i| u32::try_from(i).ok())
}

/// The permits of `which` to attempt, and those this caller holds already (inside
/// `with_permit`), each with its [`Error::AlreadyHeld`]: not attempted, nor waited for. One
/// split for both faces' attempts (`race`, `Semaphore::attempt`).
fn not_held(
    engine: usize,
    names: &[Vec<u8>],
    which: &[usize],
) -> (Vec<usize>, Vec<(usize, Error)>) {
    let mut held = Vec::new();
    let free = (which.iter().copied())
        .filter(|&i| match crate::api::reentry::check(engine, &names[i]) {
            Ok(()) => true,
            Err(e) => {
                held.push((i, e));
                false
            }
        })
        .collect();
    (free, held)
}

/// Handed to the engine together, the acquires of the permits `which`, as futures; resolves
/// to the first won (the others are dropped: cancelled, so the engine releases what they win,
/// or released at once if already won), or, when every one failed, their errors (index, error).
async fn race(
    redlock: &AsyncRedlock,
    names: &[Vec<u8>],
    which: &[usize],
    kind: ReqKind,
) -> Result<Lock, Vec<(usize, Error)>> {
    // A permit this caller holds (inside `with_permit`) is not waited for: it would be
    // released only when the work returns.
    let (which, mut already) = not_held(redlock.blocking().engine_id(), names, which);
    if which.is_empty() {
        return Err(already);
    }
    let which = &which[..];
    let mut tokens = Vec::with_capacity(which.len());
    for &i in which {
        match Token::generate() {
            Ok(token) => tokens.push(token),
            Err(e) => return Err(vec![(i, e)]),
        }
    }
    let hub = redlock.hub();
    let mut calls: Vec<Call<'_>> = which
        .iter()
        .zip(&tokens)
        .map(|(&i, &token)| Call::new(hub, kind, &names[i], token))
        .collect();
    let mut errors: Vec<Option<Error>> = which.iter().map(|_| None).collect();
    let mut submitted = false;
    std::future::poll_fn(|cx: &mut Context<'_>| {
        if !submitted {
            Call::submit_together(&mut calls, cx.waker());
            submitted = true;
        }
        for (at, call) in calls.iter_mut().enumerate() {
            if errors[at].is_some() {
                continue;
            }
            if let Poll::Ready(outcome) = Pin::new(call).poll(cx) {
                match lock_of(&names[which[at]], tokens[at], outcome) {
                    Ok(lock) => return Poll::Ready(Ok(lock)),
                    Err(e) => errors[at] = Some(e),
                }
            }
        }
        if errors.iter().all(Option::is_some) {
            let errors = std::mem::take(&mut errors).into_iter().zip(which);
            let mut errors: Vec<(usize, Error)> = errors
                .map(|(e, &i)| (i, e.unwrap_or(Error::Internal("operation lost"))))
                .collect();
            errors.append(&mut already);
            return Poll::Ready(Err(errors));
        }
        Poll::Pending
    })
    .await
}

/// An acquire of the async face in its two steps (module docs): the permit `first` alone,
/// then, if it was not won, the others together.
async fn race_in_two(
    redlock: &AsyncRedlock,
    names: &[Vec<u8>],
    first: usize,
    kind: ReqKind,
) -> Result<Lock, Vec<(usize, Error)>> {
    match race(redlock, names, &[first], kind).await {
        Ok(lock) => Ok(lock),
        Err(errors) => race_others(redlock, names, first, errors, kind).await,
    }
}

/// The second step of an acquire of the async face whose permit `first` failed with `errors`:
/// the others together, unless those errors would fail them too (see [`try_others`]); the
/// errors of every permit attempted when none is won.
async fn race_others(
    redlock: &AsyncRedlock,
    names: &[Vec<u8>],
    first: usize,
    mut errors: Vec<(usize, Error)>,
    kind: ReqKind,
) -> Result<Lock, Vec<(usize, Error)>> {
    if names.len() == 1 || !errors.iter().all(|(_, e)| try_others(e, names.len())) {
        return Err(errors);
    }
    match race(redlock, names, &others(names.len(), first), kind).await {
        Ok(lock) => Ok(lock),
        Err(more) => {
            errors.extend(more);
            Err(errors)
        }
    }
}

/// Runs a future on the calling thread, parked while it waits (it is woken by the engine's
/// loop, which the handle's background thread drives meanwhile).
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        std::thread::park_timeout(RECHECK);
    }
}

/// A counting semaphore over the servers of a [`Redlock`] handle: at most
/// [`permits`](Semaphore::permits) holders at once. Made by [`Redlock::semaphore`]; a cheap
/// value (`Clone`, `Send + Sync`) that holds a clone of the handle.
///
/// A permit is a [`Lock`] on `<name>#<i>`: release it with [`Redlock::unlock`] (or
/// [`Redlock::unlock_nowait`]), extend it with [`Redlock::extend`], keep it with
/// [`Redlock::keep`]; [`Semaphore::guard`] and [`Semaphore::with_permit`] are the semaphore's
/// [`Redlock::guard`] and [`Redlock::with_lock`]. See the module docs (`semaphore.rs`) and the
/// README's section "At most N at once" for the design.
///
/// A semaphore and a plain lock of the same name do not exclude each other (the keys differ):
/// `redlock.lock("deploy")` takes nothing from `redlock.semaphore("deploy", 3)`. A plain lock on
/// `deploy#1` — by this crate or by any client that runs `SET deploy#1 … NX PX` on the same
/// servers — does take permit 1.
///
/// # Examples
///
/// ```no_run
/// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build()?;
/// // At most three deploys at once.
/// let deploys = redlock.semaphore("deploy", 3)?;
/// let permit = deploys.acquire()?; // waits for a free permit, at most Config::lock_wait
/// println!("deploying under {}", permit.resource()); // deploy#0, deploy#1 or deploy#2
/// // ... deploy, within permit.validity() ...
/// redlock.unlock(permit)?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
///
/// Its async face is the same type over an [`AsyncRedlock`]: [`AsyncSemaphore`].
#[derive(Clone)]
pub struct Semaphore<R = Redlock> {
    redlock: R,
    permits: Permits,
}

/// What both faces of a semaphore know: its name, its permits' keys, and whose turn it is.
#[derive(Clone)]
struct Permits {
    name: Arc<[u8]>,
    names: Arc<[Vec<u8>]>,
    /// Acquires so far (of this value and its clones): which permit the next attempts first.
    turn: Arc<AtomicU32>,
}

impl Permits {
    /// The permits of the semaphore `name` of `permits` permits, checked.
    fn new(config: &Config, name: &[u8], permits: u32) -> Result<Permits, Error> {
        Ok(Permits {
            names: permit_names(config, name, permits)?,
            name: name.into(),
            turn: Arc::new(AtomicU32::new(0)),
        })
    }

    /// The permit this acquire attempts first (its turn moved on).
    fn first(&self) -> usize {
        first_pick(self.names.len(), self.turn.fetch_add(1, Ordering::Relaxed))
    }

    /// The key of permit `i` (`None` past the last permit).
    fn key(&self, i: u32) -> Option<&[u8]> {
        self.names.get(i as usize).map(Vec::as_slice)
    }

    /// `Debug` of the face named `face`.
    fn fmt(&self, face: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(face)
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("permits", &self.names.len())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.permits.fmt("Semaphore", f)
    }
}

impl<R> Semaphore<R> {
    /// The semaphore's name.
    pub fn name(&self) -> &[u8] {
        &self.permits.name
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits.names.len() as u32
    }

    /// The key of permit `i`, `<name>#<i>` (`None` past the last permit).
    pub fn permit_key(&self, i: u32) -> Option<&[u8]> {
        self.permits.key(i)
    }

    /// Which permit `lock` is, if it is one of this semaphore's.
    pub fn permit_of(&self, lock: &Lock) -> Option<u32> {
        index_of(&self.permits.names, lock)
    }

    /// The handle it uses.
    pub fn redlock(&self) -> &R {
        &self.redlock
    }
}

impl Redlock {
    /// A counting semaphore of `permits` permits named `name`: at most `permits` holders at
    /// once, each permit a lock of its own on `<name>#<i>`; see [`Semaphore`]. Checks the
    /// arguments; sends nothing.
    ///
    /// # Errors
    ///
    /// [`Error::PermitCount`] for 0 permits or more than [`MAX_PERMITS`];
    /// [`Error::ReservedName`] for a name starting with `redlock:`; [`Error::Config`] for an
    /// empty name, or one whose permits' keys (`<name>#<i>`) are longer than
    /// [`Config::max_resource_len`] (the message names the permit key and the name's length).
    pub fn semaphore(&self, name: impl AsRef<[u8]>, permits: u32) -> Result<Semaphore, Error> {
        Ok(Semaphore {
            permits: Permits::new(self.config(), name.as_ref(), permits)?,
            redlock: self.clone(),
        })
    }
}

impl Semaphore {
    /// One attempt at a permit, no waiting: the next permit in turn alone, then, if it was not
    /// won (held, split votes), every other permit at once, keeping the lowest won of those
    /// (the others won are released at once, without waiting). Uncontended, one `SET` per
    /// node.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when every permit is held (the report is the lowest permit's), or, when
    /// no permit was won and one failed otherwise, that permit's error ([`Error::NoQuorum`],
    /// …), as [`Redlock::try_lock`].
    pub fn try_acquire(&self) -> Result<Lock, Error> {
        let (first, permits) = (self.permits.first(), self.permits.names.len());
        let refused = match self.attempt_one(first) {
            Err(e) if permits > 1 && try_others(&e, permits) => e,
            done => return done,
        };
        self.attempt_others(first, refused)
    }

    /// The second step of an acquire whose permit `first` was refused with `refused` (one that
    /// lets the others be tried): one attempt on each other permit, together, keeping the
    /// lowest won and releasing the rest without waiting.
    fn attempt_others(&self, first: usize, refused: Error) -> Result<Lock, Error> {
        let permits = self.permits.names.len();
        if permits == 1 {
            return Err(refused);
        }
        let mut outcomes = self.attempt(&others(permits, first))?;
        outcomes.push((first, Err(refused)));
        let mut extra = Vec::new();
        let result = first_won(outcomes, &mut extra);
        self.release_nowait(&extra);
        result
    }

    /// One attempt on permit `i` (as [`Redlock::try_lock`], through the same path).
    fn attempt_one(&self, i: usize) -> Result<Lock, Error> {
        let name = self.permits.names[i].as_slice();
        let (kind, token) = ReqKind::acquire(self.redlock.config(), name)?;
        crate::api::reentry::check(self.redlock.engine_id(), name)?;
        lock_of(name, token, self.redlock.hub().call(kind, name, &token)?)
    }

    /// One attempt on each of the permits `which`, together (one write per node).
    fn attempt(&self, which: &[usize]) -> Result<Vec<Attempt>, Error> {
        let config = self.redlock.config();
        let (sent, held) = not_held(self.redlock.engine_id(), &self.permits.names, which);
        let mut attempts: Vec<Attempt> = Vec::with_capacity(which.len());
        attempts.extend(held.into_iter().map(|(i, e)| (i, Err(e))));
        if sent.is_empty() {
            return Ok(attempts);
        }
        let mut requests = Vec::with_capacity(sent.len());
        for &i in &sent {
            let name = self.permits.names[i].as_slice();
            let (kind, token) = ReqKind::acquire(config, name)?;
            requests.push((kind, name, token));
        }
        let outcomes = self.redlock.hub().call_many(&requests)?;
        attempts.extend(sent.into_iter().zip(requests.iter().zip(outcomes)).map(
            |(i, (&(_, name, token), o))| {
                let result = match o {
                    Some(outcome) => lock_of(name, token, outcome),
                    None => Err(Error::Internal("operation lost")),
                };
                (i, result)
            },
        ));
        Ok(attempts)
    }

    fn release_nowait(&self, locks: &[Lock]) {
        if locks.is_empty() {
            return;
        }
        let releases: Vec<(ReqKind, &[u8], Token)> = locks
            .iter()
            .map(|l| (ReqKind::Release, &**l.resource(), *l.token()))
            .collect();
        self.redlock.hub().send_many(&releases);
    }

    /// Acquires a permit, waiting for one at most [`Config::lock_wait`] (4 s by default); see
    /// [`Semaphore::acquire_until`].
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_until`].
    pub fn acquire(&self) -> Result<Lock, Error> {
        let deadline = deadline_after(Instant::now(), self.redlock.config().lock_wait());
        self.acquire_until(deadline)
    }

    /// Acquires a permit, waiting for one until `deadline`: one attempt on the next permit in
    /// turn, then, if it was not won, a waiting acquire of every permit (as
    /// [`Redlock::lock_until`]: each makes its first attempt at once), handed to the engine
    /// together; the first to win is kept, the others are cancelled (and whatever they win
    /// meanwhile released). So the release of any permit wakes the waiter.
    ///
    /// A deadline passed (already, or during the first attempt; and so with
    /// [`Builder::retry_count`](crate::Builder::retry_count) 0 for [`Semaphore::acquire`],
    /// [`Semaphore::guard`] and [`Semaphore::with_permit`]) skips the waiting only: the other
    /// permits are still attempted once, together, as [`Semaphore::try_acquire`] does.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::try_acquire`], for the last attempts: [`Error::Held`] if every permit
    /// was still held at the deadline.
    pub fn acquire_until(&self, deadline: Instant) -> Result<Lock, Error> {
        let first = self.permits.first();
        let refused = match self.attempt_one(first) {
            Err(e) if try_others(&e, self.permits.names.len()) => e,
            done => return done,
        };
        if Instant::now() >= deadline {
            // No time to wait, but the other permits are still attempted: the one in turn is
            // not the semaphore's answer.
            return self.attempt_others(first, refused);
        }
        let redlock = AsyncRedlock::from(self.redlock.clone());
        let kind = ReqKind::Wait {
            ttl: redlock.config().ttl,
            deadline,
        };
        let all: Vec<usize> = (0..self.permits.names.len()).collect();
        block_on(race(&redlock, &self.permits.names, &all, kind)).map_err(report)
    }

    /// Acquires a permit (waiting, as [`Semaphore::acquire`]) and returns a guard that releases
    /// it when dropped, without waiting; see [`Redlock::guard`].
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`].
    pub fn guard(&self) -> Result<LockGuard, Error> {
        Ok(guard(self.redlock.clone(), self.acquire()?))
    }

    /// Acquires a permit (waiting, as [`Semaphore::acquire`]), keeps it alive while `work`
    /// runs, then releases it; see [`Redlock::with_lock`], whose rules it follows.
    ///
    /// # Errors
    ///
    /// As [`Redlock::with_lock`].
    pub fn with_permit<R>(
        &self,
        work: impl FnOnce(&KeepAlive) -> R,
    ) -> Result<R, WithLockError<R>> {
        let permit = self.acquire().map_err(WithLockError::NotAcquired)?;
        self.redlock.with_held(permit, work)
    }
}

/// A counting semaphore for async code: [`Semaphore`] through futures. Made by
/// [`AsyncRedlock::semaphore`]. Dropping an acquire's future at any point leaves no permit held
/// for nobody (see [`AsyncRedlock`]'s cancellation rules: a permit won for a dropped future is
/// released).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), redlock_mux::Error> {
/// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]).quarantine(None).build_async()?;
/// let deploys = redlock.semaphore("deploy", 3)?;
/// let permit = deploys.acquire().await?;
/// // ... deploy, within permit.validity() ...
/// redlock.unlock(permit).await?;
/// # Ok(()) }
/// ```
pub type AsyncSemaphore = Semaphore<AsyncRedlock>;

impl fmt::Debug for Semaphore<AsyncRedlock> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.permits.fmt("AsyncSemaphore", f)
    }
}

impl AsyncRedlock {
    /// A counting semaphore of `permits` permits named `name`; see [`Redlock::semaphore`].
    ///
    /// # Errors
    ///
    /// As [`Redlock::semaphore`].
    pub fn semaphore(&self, name: impl AsRef<[u8]>, permits: u32) -> Result<AsyncSemaphore, Error> {
        Ok(AsyncSemaphore {
            permits: Permits::new(self.config(), name.as_ref(), permits)?,
            redlock: self.clone(),
        })
    }
}

impl Semaphore<AsyncRedlock> {
    /// One attempt at a permit, no waiting; see [`Semaphore::try_acquire`]: the next permit in
    /// turn alone, then the others at once, of which the first decided won is kept (the
    /// others won are released at once).
    ///
    /// # Errors
    ///
    /// As [`Semaphore::try_acquire`].
    pub async fn try_acquire(&self) -> Result<Lock, Error> {
        let kind = ReqKind::Acquire {
            ttl: self.redlock.config().ttl,
        };
        let first = self.permits.first();
        race_in_two(&self.redlock, &self.permits.names, first, kind)
            .await
            .map_err(report)
    }

    /// Acquires a permit, waiting at most [`Config::lock_wait`]; see
    /// [`Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_until`].
    pub async fn acquire(&self) -> Result<Lock, Error> {
        let deadline = deadline_after(Instant::now(), self.redlock.config().lock_wait());
        self.acquire_until(deadline).await
    }

    /// Acquires a permit, waiting for one until `deadline`; see [`Semaphore::acquire_until`]:
    /// the next permit in turn first, then the waiting acquires of every permit, handed to the
    /// engine together (past the deadline, one attempt on each other permit instead).
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_until`].
    pub async fn acquire_until(&self, deadline: Instant) -> Result<Lock, Error> {
        let first = self.permits.first();
        let kind = ReqKind::Acquire {
            ttl: self.redlock.config().ttl,
        };
        let names = &self.permits.names;
        let errors = match race(&self.redlock, names, &[first], kind).await {
            Ok(lock) => return Ok(lock),
            Err(errors) => errors,
        };
        if errors.iter().any(|(_, e)| !try_others(e, names.len())) {
            return Err(report(errors));
        }
        if Instant::now() >= deadline {
            // No time to wait, but the other permits are still attempted (as `try_acquire`).
            return race_others(&self.redlock, names, first, errors, kind)
                .await
                .map_err(report);
        }
        let kind = ReqKind::Wait {
            ttl: self.redlock.config().ttl,
            deadline,
        };
        let all: Vec<usize> = (0..self.permits.names.len()).collect();
        race(&self.redlock, &self.permits.names, &all, kind)
            .await
            .map_err(report)
    }

    /// Acquires a permit (waiting, as [`AsyncSemaphore::acquire`]) and returns a guard that
    /// releases it when dropped; see [`AsyncRedlock::guard`].
    ///
    /// # Errors
    ///
    /// As [`AsyncSemaphore::acquire`].
    pub async fn guard(&self) -> Result<AsyncLockGuard, Error> {
        let permit = self.acquire().await?;
        Ok(guard(self.redlock.clone(), permit))
    }

    /// Acquires a permit (waiting), keeps it alive while the work's future runs, then releases
    /// it; see [`AsyncRedlock::with_lock`], whose rules it follows.
    ///
    /// # Errors
    ///
    /// As [`AsyncRedlock::with_lock`].
    pub async fn with_permit<F, Fut, R>(&self, work: F) -> Result<R, WithLockError<R>>
    where
        F: FnOnce(LockWatch) -> Fut,
        Fut: Future<Output = R>,
    {
        let permit = self.acquire().await.map_err(WithLockError::NotAcquired)?;
        self.redlock.with_held(permit, work).await
    }
}

impl Client {
    /// One attempt at a permit of the semaphore `name` of `permits` permits, no waiting: one
    /// permit alone (the next in turn: the client counts its semaphore acquires), then, if it
    /// was not won, every other at once (one write per node); see [`Semaphore::try_acquire`].
    /// Permits won and not kept are released without waiting for the replies (consumed by the
    /// client's next operations).
    ///
    /// # Errors
    ///
    /// As [`Redlock::semaphore`] for bad arguments, then as [`Semaphore::try_acquire`].
    pub fn try_acquire_permit(
        &mut self,
        name: impl AsRef<[u8]>,
        permits: u32,
    ) -> Result<Lock, Error> {
        let names = permit_names(self.config(), name.as_ref(), permits)?;
        self.try_permits(&names)
    }

    fn try_permits(&mut self, names: &[Vec<u8>]) -> Result<Lock, Error> {
        let first = first_pick(names.len(), self.next_permit_turn());
        let refused = match self.try_lock(&names[first]) {
            Err(e) if names.len() > 1 && try_others(&e, names.len()) => e,
            done => return done,
        };
        let rest = others(names.len(), first);
        let keys: Vec<&[u8]> = rest.iter().map(|&i| names[i].as_slice()).collect();
        let results = self.try_lock_many(&keys);
        let attempts = std::iter::once((first, Err(refused))).chain(rest.into_iter().zip(results));
        let mut extra = Vec::new();
        let result = first_won(attempts, &mut extra);
        if !extra.is_empty() {
            let engine = self.engine();
            let now = Instant::now();
            for lock in &extra {
                engine.submit(
                    ReqKind::Release,
                    lock.resource(),
                    lock.token(),
                    crate::engine::Waiter::None,
                    now,
                );
            }
            engine.flush(now);
        }
        result
    }

    /// Acquires a permit of the semaphore `name` of `permits` permits, waiting for one until
    /// `deadline`. A client has no wait queues shared with other callers: after an attempt at a
    /// permit (as [`Client::try_acquire_permit`]), it waits on one permit chosen at random (as
    /// [`Client::lock_until`]: woken by its release) for a retry pause at most, then tries
    /// again.
    ///
    /// # Errors
    ///
    /// As [`Client::try_acquire_permit`]: [`Error::Held`] if every permit was still held at
    /// the deadline. The error is that of the last attempt: when the deadline comes during the
    /// wait on one permit, that wait's.
    pub fn acquire_permit_until(
        &mut self,
        name: impl AsRef<[u8]>,
        permits: u32,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        let names = permit_names(self.config(), name.as_ref(), permits)?;
        let mut rng = rand::rng();
        loop {
            match self.try_permits(&names) {
                Err(e) if !e.is_permanent() && Instant::now() < deadline => {}
                done => return done,
            }
            // One permit, for a pause like a retry's: long enough for its release notice or
            // its fallback poll, short enough that the release of another permit is not
            // missed for long.
            let config = self.config();
            let jitter = config.retry_jitter.as_micros() as u64;
            let slice = config.retry_delay + Duration::from_micros(rng.random_range(0..=jitter));
            let slice = slice.max(config.node_timeout_for(config.ttl));
            let until = deadline.min(deadline_after(Instant::now(), slice));
            let i = rng.random_range(0..names.len());
            // Past the deadline, what the wait saw last is the answer (newer than the attempt
            // on every permit before it).
            match self.lock_until(&names[i], until) {
                Ok(lock) => return Ok(lock),
                Err(e) if e.is_permanent() || Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_count_or_name_is_refused_before_anything_is_sent() {
        let config = Config::default();
        for permits in [0, MAX_PERMITS + 1, u32::MAX] {
            assert!(matches!(
                permit_names(&config, b"deploy", permits),
                Err(Error::PermitCount {
                    max: MAX_PERMITS,
                    ..
                })
            ));
        }
        assert!(matches!(
            permit_names(&config, b"redlock:x", 3),
            Err(Error::ReservedName { .. })
        ));
        assert!(matches!(
            permit_names(&config, b"", 3),
            Err(Error::Config(_))
        ));
        // A shared lock's or a set's encoding is not a semaphore's name: its permits would be
        // read locks (any number of holders) or sets. (Before, `redlock:shared:x` was taken,
        // and P = 1 admitted every caller.)
        let shared = crate::Shared::new("x").unwrap();
        let set = crate::ResourceSet::new(["a", "b"]).unwrap();
        for name in [shared.as_ref(), set.as_ref()] {
            assert!(matches!(
                permit_names(&config, name, 1),
                Err(Error::ReservedName { .. })
            ));
        }
        // The name fits, its permits' keys do not.
        let long = vec![b'a'; config.max_resource_len - 1];
        assert!(matches!(
            permit_names(&config, &long, 3),
            Err(Error::Config(_))
        ));
        let names = permit_names(&config, b"deploy", MAX_PERMITS).unwrap();
        assert_eq!(names.len(), MAX_PERMITS as usize);
        assert!(Error::PermitCount { permits: 0, max: 1 }.is_permanent());
    }

    /// A name that fits but whose permit keys do not: the message says so, with the name's
    /// length (it said "resource name of 1025 bytes is longer than the limit
    /// of 1024" of a name of 1023 bytes).
    #[test]
    fn a_permit_key_too_long_is_reported_as_the_permit_key() {
        let config = Config::default();
        let max = config.max_resource_len;
        let long = vec![b'a'; max - 1];
        let Err(Error::Config(message)) = permit_names(&config, &long, 3) else {
            panic!("a permit key longer than the limit was taken");
        };
        let expected = format!(
            "semaphore name of {} bytes: its permit key `<name>#0` would be {} bytes, longer \
             than the limit of {max}",
            max - 1,
            max + 1
        );
        assert_eq!(message, expected);
    }

    #[test]
    fn no_permit_won_reports_a_failure_before_held() {
        let mut extra = Vec::new();
        // Decided out of permit order (the first pick, then the others): reported by index.
        let attempts = vec![
            (1, Err(Error::Internal("second"))),
            (0, Err(Error::Internal("first"))),
        ];
        let e = first_won(attempts, &mut extra).unwrap_err();
        assert!(matches!(e, Error::Internal("first")));
        assert!(extra.is_empty());
    }
}
