//! A node's host name, resolved off the engine's thread.
//!
//! `getaddrinfo` blocks, for as long as the system's resolver takes: seconds per try, times
//! tries, times name servers when one is slow or down. Run on the engine's loop it stalled
//! every node — replies, renewals, timeouts — for that long (found by review). So each node's
//! host is looked up on a thread of its own, from the moment the client is built (all nodes at
//! once), and a connection connects to the last address found. Only the first connect of a
//! node may wait for it, [`FIRST_WAIT`] at most, once in the client's life; without an answer
//! by then it fails as a refused connect does, and the session's backoff brings the next try,
//! which never waits. Every later connect uses the address at once while a fresh lookup runs
//! behind it for the connect after (a node that moved is found again one reconnect later, as
//! a connect to its old address fails).
//!
//! IP literals (`127.0.0.1`, `::1`) need no lookup.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::NodeFault;

/// How long the first connect of a host name waits for its lookup on the engine's thread.
pub(crate) const FIRST_WAIT: Duration = Duration::from_millis(100);

/// Resolves a host and port to one address (blocking: run off the loop).
pub(crate) type ResolveFn = fn(&str, u16) -> Result<SocketAddr, String>;

/// The system's resolver: the first address of `host:port`.
pub(crate) fn system(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "no address".to_owned())
}

#[derive(Default)]
struct State {
    /// The last address found.
    addr: Option<SocketAddr>,
    /// Why the last lookup failed, while no address was ever found (told once, then the next
    /// connect looks again).
    error: Option<String>,
    /// A lookup is under way.
    running: bool,
}

/// One node's host name and what is known of its address.
pub(crate) struct Lookup {
    host: String,
    port: u16,
    /// The host is an IP literal: no lookup.
    ip: Option<IpAddr>,
    resolve: ResolveFn,
    state: Arc<(Mutex<State>, Condvar)>,
    /// The first connect's wait is over (it happens once).
    waited: bool,
}

impl Lookup {
    /// The node `host:port`; its lookup starts at once (unless `host` is an IP literal).
    pub fn new(host: &str, port: u16, resolve: ResolveFn) -> Lookup {
        let lookup = Lookup {
            host: host.to_owned(),
            port,
            ip: host.parse().ok(),
            resolve,
            state: Arc::default(),
            waited: false,
        };
        if lookup.ip.is_none() {
            let mut state = lookup.lock();
            state.running = lookup.start();
        }
        lookup
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The address to connect to now. Waits `first_wait` at most, and only at the first call
    /// while no address has been found yet.
    pub fn address(&mut self, first_wait: Duration) -> Result<SocketAddr, NodeFault> {
        if let Some(ip) = self.ip {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let waited = std::mem::replace(&mut self.waited, true);
        let mut state = self.lock();
        if let Some(why) = state.error.take() {
            return Err(NodeFault::Resolve(why));
        }
        if !state.running {
            state.running = true;
            if !self.start() {
                // No thread to be had: look up here (rare; bounded by the resolver alone).
                state.running = false;
                drop(state);
                return self.here();
            }
        }
        if let Some(addr) = state.addr {
            return Ok(addr);
        }
        if waited {
            return Err(NodeFault::Resolve("no answer from the resolver yet".into()));
        }
        let give_up = Instant::now() + first_wait;
        while state.addr.is_none() && state.error.is_none() {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NodeFault::Resolve("no answer from the resolver yet".into()));
            }
            state = (self.state.1)
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        match state.addr {
            Some(addr) => Ok(addr),
            None => Err(NodeFault::Resolve(state.error.take().unwrap_or_default())),
        }
    }

    /// Starts a lookup on a thread of its own; false if no thread could be started.
    fn start(&self) -> bool {
        let (host, port, resolve) = (self.host.clone(), self.port, self.resolve);
        let state = self.state.clone();
        std::thread::Builder::new()
            .name("redlock-resolve".into())
            .spawn(move || {
                // A panicking resolver must not leave the lookup marked running for good.
                let found = std::panic::catch_unwind(|| resolve(&host, port))
                    .unwrap_or_else(|_| Err("the resolver panicked".to_owned()));
                let (lock, changed) = &*state;
                let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
                state.running = false;
                match found {
                    Ok(addr) => state.addr = Some(addr),
                    // A failed refresh keeps the address found before.
                    Err(why) if state.addr.is_none() => state.error = Some(why),
                    Err(_) => {}
                }
                changed.notify_all();
            })
            .is_ok()
    }

    fn here(&self) -> Result<SocketAddr, NodeFault> {
        let addr = (self.resolve)(&self.host, self.port).map_err(NodeFault::Resolve)?;
        self.lock().addr = Some(addr);
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// Lookups that wait until the test lets them answer (one `()` each), then answer
    /// 10.0.0.N for the Nth.
    static GATE: Mutex<Option<mpsc::Receiver<()>>> = Mutex::new(None);
    static ANSWERS: AtomicUsize = AtomicUsize::new(0);

    fn gated(_host: &str, port: u16) -> Result<SocketAddr, String> {
        let gate = GATE
            .lock()
            .unwrap()
            .take()
            .expect("one gated lookup at a time");
        gate.recv().map_err(|_| "gate closed".to_owned())?;
        let n = ANSWERS.fetch_add(1, Ordering::SeqCst) + 1;
        *GATE.lock().unwrap() = Some(gate);
        Ok(SocketAddr::new(IpAddr::from([10, 0, 0, n as u8]), port))
    }

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < give_up, "never {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_slow_resolver_never_holds_the_caller() {
        let (open, gate) = mpsc::channel();
        *GATE.lock().unwrap() = Some(gate);
        // The lookup starts with the node, before any connect.
        let mut lookup = Lookup::new("redis.example", 6379, gated);
        until("looking up", || GATE.lock().unwrap().is_none());
        // The first connect: the resolver does not answer, the caller gets a fault (it would
        // wait forever if the lookup ran here: nothing opens the gate until it returns); the
        // next ones do not wait at all.
        let first = lookup.address(Duration::from_millis(20));
        assert!(matches!(first, Err(NodeFault::Resolve(_))), "{first:?}");
        let second = lookup.address(Duration::from_secs(3600));
        assert!(matches!(second, Err(NodeFault::Resolve(_))), "{second:?}");
        open.send(()).unwrap();
        until("resolved", || lookup.address(Duration::ZERO).is_ok());
        let at = |n: u8| SocketAddr::new(IpAddr::from([10, 0, 0, n]), 6379);
        until("refreshed", || {
            lookup.state.0.lock().unwrap().running && GATE.lock().unwrap().is_none()
        });
        // The next connects use the address at once while the refresh waits at the gate.
        assert_eq!(lookup.address(Duration::ZERO).unwrap(), at(1));
        open.send(()).unwrap();
        until("the address moved", || {
            lookup.address(Duration::ZERO).unwrap() == at(2)
        });
        assert_eq!(
            Lookup::new("::1", 7, gated)
                .address(Duration::ZERO)
                .unwrap()
                .port(),
            7
        );
    }
}
