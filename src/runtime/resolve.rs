//! A node's host name, resolved off the engine's thread.
//!
//! `getaddrinfo` blocks, for as long as the system's resolver takes: seconds per try, times
//! tries, times name servers when one is slow or down. Run on the engine's loop it stalled
//! every node — replies, renewals, timeouts — for that long. So each node's
//! host is looked up on a thread of its own, from the moment the client is built (all nodes at
//! once), and a connection connects to an address of the last list found. Only the first connect of a
//! node may wait for it, [`FIRST_WAIT`] at most, once in the client's life; without an answer
//! by then it fails as a refused connect does, and the session's backoff brings the next try,
//! which never waits. Every later connect uses the address at once while a fresh lookup runs
//! behind it for the connect after (a node that moved is found again one reconnect later, as
//! a connect to its old address fails).
//!
//! A name may have several addresses (`localhost`: `::1` and `127.0.0.1`, a dual-stack host),
//! of which some refuse (a server bound to IPv4 only). A connection that failed before it
//! proved itself moves the next connect on to the address after the one it used, at once while
//! the list has addresses this round of failures has not tried (as `TcpStream::connect` tries
//! each in turn), then after the backoff; one that worked keeps its address.
//!
//! IP literals (`127.0.0.1`, `::1`) need no lookup.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::model::error::NodeFault;

/// How long the first connect of a host name waits for its lookup on the engine's thread.
pub(crate) const FIRST_WAIT: Duration = Duration::from_millis(100);

/// Resolves a host and port to its addresses, at least one (blocking: run off the loop).
pub(crate) type ResolveFn = fn(&str, u16) -> Result<Vec<SocketAddr>, String>;

/// At most this many addresses of one name are kept.
const MAX_ADDRESSES: usize = 16;

/// The system's resolver: the addresses of `host:port`, in its order of preference.
pub(crate) fn system(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .take(MAX_ADDRESSES)
        .collect();
    if found.is_empty() {
        return Err("no address".to_owned());
    }
    Ok(found)
}

#[derive(Default)]
struct State {
    /// The last addresses found (empty: none yet).
    addrs: Vec<SocketAddr>,
    /// The one connected to last, in `addrs`.
    at: usize,
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
    /// Connections in a row that failed before they proved themselves, each on the address
    /// it was given (see [`Lookup::round_left`]).
    failed_in_row: usize,
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
            failed_in_row: 0,
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

    /// The address to connect to now: the one connected to last, or with `failed` (the last
    /// connection, on that address, failed before it proved itself) the one after it in the
    /// list (the first, if the list no longer has it). Waits `first_wait` at most, and only at
    /// the first call while no address has been found yet.
    pub fn address(
        &mut self,
        first_wait: Duration,
        failed: Option<SocketAddr>,
    ) -> Result<SocketAddr, NodeFault> {
        if let Some(ip) = self.ip {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let waited = std::mem::replace(&mut self.waited, true);
        let known = self.lock().addrs.len();
        // A failure within the round counts; one that ends the round (every address tried,
        // the backoff waited) starts the next round: its first failure is followed at once
        // again (a server restarting behind `localhost`'s refusing `::1` is found as soon as
        // it is back, not one backoff per address later).
        self.failed_in_row = match failed {
            Some(_) if self.failed_in_row + 1 < known => self.failed_in_row + 1,
            _ => 0,
        };
        let mut state = self.lock();
        if let Some(failed) = failed {
            let len = state.addrs.len();
            state.at =
                (state.addrs.iter().position(|&a| a == failed)).map_or(0, |i| (i + 1) % len.max(1));
        }
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
        if let Some(&addr) = state.addrs.get(state.at) {
            return Ok(addr);
        }
        if waited {
            return Err(NodeFault::Resolve("no answer from the resolver yet".into()));
        }
        let give_up = Instant::now() + first_wait;
        while state.addrs.is_empty() && state.error.is_none() {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NodeFault::Resolve("no answer from the resolver yet".into()));
            }
            state = (self.state.1)
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        match state.addrs.get(state.at) {
            Some(&addr) => Ok(addr),
            None => Err(NodeFault::Resolve(state.error.take().unwrap_or_default())),
        }
    }

    /// Whether a connection that just failed before it proved itself should be followed at
    /// once by one to the next address: the list has addresses this row of failures has not
    /// tried yet. (An IP literal has one.)
    pub fn round_left(&self) -> bool {
        self.ip.is_none() && self.failed_in_row + 1 < self.lock().addrs.len()
    }

    /// Starts a lookup on a thread of its own; false if no thread could be started.
    fn start(&self) -> bool {
        let (host, port, resolve) = (self.host.clone(), self.port, self.resolve);
        let state = self.state.clone();
        std::thread::Builder::new()
            .name("redlock-resolve".into())
            .spawn(move || {
                // A panicking resolver must not leave the lookup marked running for good.
                let found = crate::engine::foreign::catch(|| resolve(&host, port))
                    .unwrap_or_else(|| Err("the resolver panicked".to_owned()));
                let (lock, changed) = &*state;
                let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
                state.running = false;
                match found {
                    Ok(addrs) if !addrs.is_empty() => state.found(addrs),
                    // A failed refresh keeps the addresses found before.
                    Ok(_) if state.addrs.is_empty() => state.error = Some("no address".into()),
                    Err(why) if state.addrs.is_empty() => state.error = Some(why),
                    Ok(_) | Err(_) => {}
                }
                changed.notify_all();
            })
            .is_ok()
    }

    fn here(&self) -> Result<SocketAddr, NodeFault> {
        let addrs = (self.resolve)(&self.host, self.port).map_err(NodeFault::Resolve)?;
        let mut state = self.lock();
        if addrs.is_empty() {
            return Err(NodeFault::Resolve("no address".into()));
        }
        state.found(addrs);
        Ok(state.addrs[state.at])
    }
}

impl State {
    /// A lookup's answer (not empty): the address connected to last stays current if the new
    /// list still has it, else the list's first.
    fn found(&mut self, mut addrs: Vec<SocketAddr>) {
        addrs.truncate(MAX_ADDRESSES);
        let current = self.addrs.get(self.at).copied();
        self.at = current
            .and_then(|c| addrs.iter().position(|&a| a == c))
            .unwrap_or(0);
        self.addrs = addrs;
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

    fn gated(_host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let gate = GATE
            .lock()
            .unwrap()
            .take()
            .expect("one gated lookup at a time");
        gate.recv().map_err(|_| "gate closed".to_owned())?;
        let n = ANSWERS.fetch_add(1, Ordering::SeqCst) + 1;
        *GATE.lock().unwrap() = Some(gate);
        Ok(vec![SocketAddr::new(
            IpAddr::from([10, 0, 0, n as u8]),
            port,
        )])
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
        let first = lookup.address(Duration::from_millis(20), None);
        assert!(matches!(first, Err(NodeFault::Resolve(_))), "{first:?}");
        let second = lookup.address(Duration::from_secs(3600), None);
        assert!(matches!(second, Err(NodeFault::Resolve(_))), "{second:?}");
        open.send(()).unwrap();
        until("resolved", || lookup.address(Duration::ZERO, None).is_ok());
        let at = |n: u8| SocketAddr::new(IpAddr::from([10, 0, 0, n]), 6379);
        until("refreshed", || {
            lookup.state.0.lock().unwrap().running && GATE.lock().unwrap().is_none()
        });
        // The next connects use the address at once while the refresh waits at the gate.
        assert_eq!(lookup.address(Duration::ZERO, None).unwrap(), at(1));
        open.send(()).unwrap();
        until("the address moved", || {
            lookup.address(Duration::ZERO, None).unwrap() == at(2)
        });
        assert_eq!(
            Lookup::new("::1", 7, gated)
                .address(Duration::ZERO, Some(SocketAddr::from(([9, 9, 9, 9], 7))))
                .unwrap()
                .port(),
            7
        );
    }

    /// `localhost` as glibc often orders it, and a dual-stack host.
    fn two(_host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        Ok(vec![
            SocketAddr::new(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]), port),
            SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port),
        ])
    }

    #[test]
    fn a_connect_that_failed_moves_on_to_the_next_address_and_one_that_worked_stays() {
        let mut lookup = Lookup::new("localhost", 6379, two);
        let wait = Duration::from_secs(10);
        let v6 = lookup.address(wait, None).unwrap();
        assert!(v6.is_ipv6(), "{v6}");
        // A round of failures has one more address to try: at once.
        assert!(lookup.round_left());
        // ::1 refused (a server bound to IPv4 only): the next connect tries 127.0.0.1 ...
        let v4 = lookup.address(wait, Some(v6)).unwrap();
        assert!(v4.is_ipv4(), "{v4}");
        // ... and if that failed too, the round is over (the backoff comes first) ...
        assert!(!lookup.round_left());
        // ... after which a new round begins: ::1 again, and 127.0.0.1 at once if it fails.
        assert_eq!(lookup.address(wait, Some(v4)).unwrap(), v6);
        assert!(lookup.round_left());
        assert_eq!(lookup.address(wait, Some(v6)).unwrap(), v4);
        assert!(!lookup.round_left());
        // ... but it worked: the connects after it stay there, refreshes or not.
        assert_eq!(lookup.address(wait, None).unwrap(), v4);
        assert!(lookup.round_left(), "a new round");
        until("refreshed", || !lookup.state.0.lock().unwrap().running);
        assert_eq!(lookup.address(wait, None).unwrap(), v4);
        // Round the list, from the address that failed.
        assert_eq!(lookup.address(wait, Some(v4)).unwrap(), v6);
        // A failure on an address the list no longer has (or none: the lookup had not
        // answered) starts from the first.
        assert_eq!(
            lookup
                .address(wait, Some(SocketAddr::from(([10, 0, 0, 9], 1))))
                .unwrap(),
            v6
        );
        let mut state = State::default();
        state.found(two("", 1).unwrap());
        state.at = 1;
        state.found(vec![SocketAddr::from(([10, 0, 0, 9], 1))]);
        assert_eq!(state.addrs[state.at], SocketAddr::from(([10, 0, 0, 9], 1)));
    }
}
