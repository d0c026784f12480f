//! The public API: configuration, [`Client`] (one thread's connections), [`Redlock`] (a handle
//! shared by many threads), [`Lock`] and [`LockGuard`].

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use rand::{RngExt, TryRng};

use crate::addr::NodeAddr;
use crate::conn::{ConnConfig, Delivery, IoStats, Kind, scripts};
use crate::driver::Driver;
use crate::error::{Error, NodeFault, Report};
use crate::keep::Cmd;
use crate::resp::{Arg, Frame, Limits, SetNxPx};
use crate::round::{Decision, Loss, Round, RoundConfig, Vote, deadline_after};

/// Most nodes a client may use (node sets are 64-bit masks).
pub const MAX_NODES: usize = 64;
/// Longest TTL accepted: 2³¹ − 1 ms (about 24.8 days).
pub const MAX_TTL: Duration = Duration::from_millis(i32::MAX as u64);
/// Length of a token made by this crate: 20 random bytes in unpadded base64url.
pub const TOKEN_LEN: usize = 27;
/// Longest token accepted from elsewhere ([`Lock::from_parts`]).
pub const MAX_TOKEN_LEN: usize = 64;

/// Client settings. The defaults are those of the Redlock reference (see the README's table).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Lock time to live (`PX`). Default 30 s.
    pub ttl: Duration,
    /// Retries after the first attempt in [`Client::lock`]. Default 10.
    pub retry_count: u32,
    /// Wait between attempts. Default 200 ms.
    pub retry_delay: Duration,
    /// Up to this much random time is added to each wait. Default 200 ms.
    pub retry_jitter: Duration,
    /// Wait for each node per attempt; `None`: 5 % of the TTL, at most 50 ms.
    pub node_timeout: Option<Duration>,
    /// Clock drift factor: `ttl × factor + 2 ms` is taken off the validity. Default 0.01.
    pub drift_factor: f64,
    /// A lock with less validity than this left at acquisition counts as not acquired. Default 0.
    pub min_validity: Duration,
    /// Most extensions of one lock. Default 1000.
    pub max_extensions: u32,
    /// Kept locks ([`Redlock::keep`]) are extended when this fraction of the TTL is left.
    /// Default 1/3.
    pub renew_fraction: f64,
    /// Longest resource name, in bytes. Default 1024.
    pub max_resource_len: usize,
    /// TCP connect plus handshake timeout. Default 1 s.
    pub connect_timeout: Duration,
    /// Reconnect backoff: first wait. Default 25 ms.
    pub backoff_min: Duration,
    /// Reconnect backoff: longest wait. Default 2 s.
    pub backoff_max: Duration,
    /// A request unanswered this long resets its connection. Default 5 s.
    pub reply_timeout: Duration,
    /// Most requests awaiting replies on one connection before it is reset. Default 1024.
    pub max_pending: usize,
    /// Decoder limits; `max_frame_len` bounds each connection's input buffer. Default
    /// [`Limits::CLIENT`].
    pub limits: Limits,
    /// Sent with `CLIENT SETNAME` in the handshake. Default none.
    pub client_name: Option<String>,
    /// Longest TTL any lock of this client may have: every [`Client::extend`] and kept lock is
    /// bounded by it, and [`Quarantine::Ttl`] makes it the restart-quarantine window. `None`:
    /// the TTL. Default `None`.
    pub max_ttl: Option<Duration>,
    /// Restart quarantine: a node that restarted less than a window ago (its `run_id` changed,
    /// or its uptime is shorter) does not count towards a quorum. Default [`Quarantine::Ttl`]:
    /// the window is the longest TTL this client can set ([`Config::max_ttl`]).
    pub quarantine: Quarantine,
}

/// The restart-quarantine setting: a node that may have restarted (and lost its keys) less than
/// a window ago does not count towards a quorum.
///
/// Safety needs the window to cover the longest TTL that *any* client of the same servers sets:
/// a node that forgot a key must stay out of quorums until that key would have expired anyway.
/// The window is resolved when the handle is built, so the order of builder calls never matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quarantine {
    /// No quarantine: a node counts as soon as it answers. Right for fresh servers, or servers
    /// with `appendfsync always` persistence; unsafe for servers that restart without their data.
    Off,
    /// The window is the longest TTL this client can set: [`Config::max_ttl`], or the TTL.
    #[default]
    Ttl,
    /// A fixed window. It must be at least the longest TTL this client can set ([`Config::max_ttl`]);
    /// a longer one covers other clients of the same servers that use longer TTLs.
    Fixed(Duration),
}

impl From<Option<Duration>> for Quarantine {
    /// `None`: [`Quarantine::Off`]; `Some(window)`: [`Quarantine::Fixed`].
    fn from(window: Option<Duration>) -> Quarantine {
        match window {
            None => Quarantine::Off,
            Some(window) => Quarantine::Fixed(window),
        }
    }
}

impl From<Duration> for Quarantine {
    /// [`Quarantine::Fixed`].
    fn from(window: Duration) -> Quarantine {
        Quarantine::Fixed(window)
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ttl: Duration::from_secs(30),
            retry_count: 10,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(200),
            node_timeout: None,
            drift_factor: 0.01,
            min_validity: Duration::ZERO,
            max_extensions: 1000,
            renew_fraction: 1.0 / 3.0,
            max_resource_len: 1024,
            connect_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(25),
            backoff_max: Duration::from_secs(2),
            reply_timeout: Duration::from_secs(5),
            max_pending: 1024,
            limits: Limits::CLIENT,
            client_name: None,
            max_ttl: None,
            quarantine: Quarantine::Ttl,
        }
    }
}

impl Config {
    /// The per-node timeout for a given TTL: the configured one, or 5 % of the TTL capped at
    /// 50 ms.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 20).min(Duration::from_millis(50)))
    }

    /// The longest TTL a lock of this client may have: [`Config::max_ttl`], or the TTL.
    pub fn longest_ttl(&self) -> Duration {
        self.max_ttl.unwrap_or(self.ttl)
    }

    /// The restart-quarantine window in force, `None` when it is off.
    pub fn quarantine_window(&self) -> Option<Duration> {
        match self.quarantine {
            Quarantine::Off => None,
            Quarantine::Ttl => Some(self.longest_ttl()),
            Quarantine::Fixed(window) => Some(window),
        }
    }

    /// A TTL for extending or keeping a lock: valid, and not above [`Config::longest_ttl`] (a
    /// longer one would outlive the restart quarantine that protects it).
    fn check_extend_ttl(&self, ttl: Duration) -> Result<(), Error> {
        self.check_ttl(ttl)?;
        let longest = self.longest_ttl();
        if ttl > longest {
            return Err(Error::Config(format!(
                "extend ttl {ttl:?} is longer than the longest ttl this client allows \
                 ({longest:?}, the max_ttl setting): the restart quarantine could end while \
                 the lock still lives; raise max_ttl (and the quarantine of every client of \
                 these servers) to at least {ttl:?}"
            )));
        }
        Ok(())
    }

    fn check_ttl(&self, ttl: Duration) -> Result<(), Error> {
        if ttl.as_millis() == 0 || ttl > MAX_TTL {
            return Err(Error::Config(format!(
                "ttl {ttl:?} must be from 1 ms to {MAX_TTL:?}"
            )));
        }
        let drift = RoundConfig::new(ttl, self.drift_factor, Duration::ZERO).drift();
        if ttl <= drift {
            return Err(Error::Config(format!(
                "ttl {ttl:?} leaves no validity after the drift allowance of {drift:?}"
            )));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Config(what));
        if !(self.drift_factor.is_finite() && (0.0..1.0).contains(&self.drift_factor)) {
            return bad(format!(
                "drift factor {} must be at least 0 and below 1",
                self.drift_factor
            ));
        }
        self.check_ttl(self.ttl)?;
        if !(self.renew_fraction > 0.0 && self.renew_fraction < 1.0) {
            return bad(format!(
                "renew fraction {} must be above 0 and below 1",
                self.renew_fraction
            ));
        }
        let hour = Duration::from_secs(3600);
        for (name, value) in [
            ("retry delay", self.retry_delay),
            ("retry jitter", self.retry_jitter),
            ("connect timeout", self.connect_timeout),
            ("backoff", self.backoff_max),
            ("reply timeout", self.reply_timeout),
            ("minimum validity", self.min_validity),
        ] {
            if value > hour {
                return bad(format!("{name} {value:?} is longer than an hour"));
            }
        }
        if let Some(t) = self.node_timeout
            && (t.is_zero() || t > hour)
        {
            return bad(format!(
                "node timeout {t:?} must be above 0 and at most an hour"
            ));
        }
        if self.connect_timeout.is_zero() || self.reply_timeout.is_zero() {
            return bad("connect and reply timeouts must be above 0".into());
        }
        if self.backoff_min > self.backoff_max {
            return bad("backoff minimum is above its maximum".into());
        }
        if self.max_pending == 0 || self.max_resource_len == 0 {
            return bad("max_pending and max_resource_len must be at least 1".into());
        }
        if let Some(max) = self.max_ttl {
            self.check_ttl(max)?;
            if max < self.ttl {
                return bad(format!(
                    "max_ttl {max:?} is shorter than the ttl {:?}",
                    self.ttl
                ));
            }
        }
        if let Quarantine::Fixed(window) = self.quarantine {
            let longest = self.longest_ttl();
            if window < longest {
                return bad(format!(
                    "quarantine window {window:?} is shorter than the longest ttl {longest:?} \
                     (ttl or max_ttl): a node that restarted without its keys could rejoin a \
                     quorum while a lock it forgot still lives; use Quarantine::Ttl, a window \
                     of at least {longest:?}, or Quarantine::Off for servers that never lose \
                     keys"
                ));
            }
            if window > Duration::from_secs(86_400 * 30) {
                return bad("quarantine longer than 30 days".into());
            }
        }
        Ok(())
    }
}

/// Builds a [`Redlock`] handle or a [`Client`] from server addresses and settings.
///
/// ```no_run
/// use std::time::Duration;
/// let redlock = redlock_mux::Builder::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
///     .ttl(Duration::from_secs(10))
///     .retry_count(3)
///     .build()?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    servers: Vec<String>,
    config: Config,
}

impl Builder {
    /// Starts from the given addresses (see [`NodeAddr`] for the forms) and the defaults.
    pub fn new<I, S>(servers: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder {
            servers: servers.into_iter().map(|s| s.as_ref().to_owned()).collect(),
            config: Config::default(),
        }
    }

    /// Replaces every setting at once.
    pub fn config(mut self, config: Config) -> Builder {
        self.config = config;
        self
    }
    /// Lock time to live.
    pub fn ttl(mut self, ttl: Duration) -> Builder {
        self.config.ttl = ttl;
        self
    }
    /// Retries after the first attempt.
    pub fn retry_count(mut self, n: u32) -> Builder {
        self.config.retry_count = n;
        self
    }
    /// Wait between attempts, and the most random time added to it.
    pub fn retry_delay(mut self, delay: Duration, jitter: Duration) -> Builder {
        self.config.retry_delay = delay;
        self.config.retry_jitter = jitter;
        self
    }
    /// Per-node timeout of each attempt.
    pub fn node_timeout(mut self, timeout: Duration) -> Builder {
        self.config.node_timeout = Some(timeout);
        self
    }
    /// Clock drift factor.
    pub fn drift_factor(mut self, factor: f64) -> Builder {
        self.config.drift_factor = factor;
        self
    }
    /// Least validity a successful acquisition must leave.
    pub fn min_validity(mut self, v: Duration) -> Builder {
        self.config.min_validity = v;
        self
    }
    /// Most extensions per lock.
    pub fn max_extensions(mut self, n: u32) -> Builder {
        self.config.max_extensions = n;
        self
    }
    /// Kept locks are extended when this fraction of the TTL is left (default 1/3).
    pub fn renew_fraction(mut self, fraction: f64) -> Builder {
        self.config.renew_fraction = fraction;
        self
    }
    /// Connect (plus handshake) timeout.
    pub fn connect_timeout(mut self, t: Duration) -> Builder {
        self.config.connect_timeout = t;
        self
    }
    /// Reconnect backoff bounds.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Builder {
        self.config.backoff_min = min;
        self.config.backoff_max = max;
        self
    }
    /// `CLIENT SETNAME` sent in the handshake.
    pub fn client_name(mut self, name: impl Into<String>) -> Builder {
        self.config.client_name = Some(name.into());
        self
    }
    /// Longest TTL a lock may be extended (or kept) to; default: the TTL. With the default
    /// [`Quarantine::Ttl`] it is also the restart-quarantine window.
    pub fn max_ttl(mut self, ttl: Duration) -> Builder {
        self.config.max_ttl = Some(ttl);
        self
    }
    /// Restart quarantine: a [`Quarantine`], or `None` (off) / `Some(window)` (fixed) /
    /// a `Duration` (fixed). Default [`Quarantine::Ttl`].
    pub fn quarantine(mut self, quarantine: impl Into<Quarantine>) -> Builder {
        self.config.quarantine = quarantine.into();
        self
    }

    fn shared(self) -> Result<Arc<Shared>, Error> {
        self.config.validate()?;
        if self.servers.is_empty() {
            return Err(Error::Config("no servers given".into()));
        }
        if self.servers.len() > MAX_NODES {
            return Err(Error::Config(format!(
                "{} servers given, at most {MAX_NODES} are supported",
                self.servers.len()
            )));
        }
        let mut nodes: Vec<NodeAddr> = Vec::with_capacity(self.servers.len());
        for s in &self.servers {
            let addr = NodeAddr::parse(s)?;
            if nodes.iter().any(|n| n.endpoint == addr.endpoint) {
                return Err(Error::Config(format!("duplicate server {addr}")));
            }
            nodes.push(addr);
        }
        let c = &self.config;
        let conn = ConnConfig {
            connect_timeout: c.connect_timeout,
            backoff_min: c.backoff_min,
            backoff_max: c.backoff_max,
            reply_timeout: c.reply_timeout,
            max_pending: c.max_pending,
            limits: c.limits,
            client_name: c.client_name.clone(),
            info: c.quarantine_window().is_some(),
        };
        Ok(Arc::new(Shared {
            nodes: nodes.into(),
            config: self.config,
            conn,
            closed: AtomicBool::new(false),
            keeper: Mutex::new(None),
            keep_ids: AtomicU64::new(0),
            keeper_ticks: AtomicU64::new(0),
            keeper_writes: AtomicU64::new(0),
            keeper_extended: AtomicU64::new(0),
        }))
    }

    /// A handle for many threads.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty or duplicate server list, an unparsable address or a bad
    /// setting.
    pub fn build(self) -> Result<Redlock, Error> {
        Ok(Redlock {
            handle: Arc::new(Handle {
                shared: self.shared()?,
            }),
        })
    }

    /// A client owned by one thread.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`].
    pub fn build_client(self) -> Result<Client, Error> {
        Client::from_shared(self.shared()?)
    }
}

pub(crate) struct Shared {
    nodes: Arc<[NodeAddr]>,
    config: Config,
    conn: ConnConfig,
    /// Set when the last [`Redlock`] handle is dropped: per-thread clients are then discarded.
    closed: AtomicBool,
    /// The keep-alive thread's inbox, once started.
    keeper: Mutex<Option<Sender<Cmd>>>,
    keep_ids: AtomicU64,
    /// Keep-alive counters: ticks that extended something, their writes, locks extended.
    keeper_ticks: AtomicU64,
    keeper_writes: AtomicU64,
    keeper_extended: AtomicU64,
}

impl Shared {
    /// The keep-alive thread's inbox, starting the thread on first use.
    pub(crate) fn keeper(self: &Arc<Self>) -> Result<Sender<Cmd>, Error> {
        let mut keeper = self.keeper.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = keeper.as_ref() {
            return Ok(tx.clone());
        }
        let tx = crate::keep::spawn(self.clone())?;
        *keeper = Some(tx.clone());
        Ok(tx)
    }

    pub(crate) fn record_tick(&self, writes: u64, extended: u64) {
        self.keeper_ticks.fetch_add(1, Ordering::Relaxed);
        self.keeper_writes.fetch_add(writes, Ordering::Relaxed);
        self.keeper_extended.fetch_add(extended, Ordering::Relaxed);
    }

    pub(crate) fn next_keep_id(&self) -> u64 {
        self.keep_ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// Bytes stored inline when short (no allocation for the usual resource names).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Bytes {
    Inline(u8, [u8; 46]),
    Heap(Box<[u8]>),
}

impl Bytes {
    fn new(b: &[u8]) -> Bytes {
        if b.len() <= 46 {
            let mut buf = [0; 46];
            buf[..b.len()].copy_from_slice(b);
            Bytes::Inline(b.len() as u8, buf)
        } else {
            Bytes::Heap(b.into())
        }
    }
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Inline(len, buf) => &buf[..usize::from(*len)],
            Bytes::Heap(b) => b,
        }
    }
}

/// A lock token: unique per acquisition, the lock's signature on every node.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    len: u8,
    bytes: [u8; MAX_TOKEN_LEN],
}

impl Token {
    /// 20 bytes from the operating system's random source, in unpadded base64url (27 bytes).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the operating system's random source fails.
    pub fn generate() -> Result<Token, Error> {
        let mut raw = [0u8; 20];
        rand::rngs::SysRng
            .try_fill_bytes(&mut raw)
            .map_err(|e| Error::Config(format!("the OS random source failed: {e}")))?;
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut bytes = [0u8; MAX_TOKEN_LEN];
        let mut o = 0;
        for chunk in raw.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for k in 0..=chunk.len() {
                bytes[o] = ALPHABET[((n >> (18 - 6 * k)) & 63) as usize];
                o += 1;
            }
        }
        Ok(Token {
            len: o as u8,
            bytes,
        })
    }

    /// A token given by someone else (e.g. printed by `redlock acquire`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if empty or longer than [`MAX_TOKEN_LEN`].
    pub fn from_bytes(b: &[u8]) -> Result<Token, Error> {
        if b.is_empty() || b.len() > MAX_TOKEN_LEN {
            return Err(Error::Config(format!(
                "a token must be 1 to {MAX_TOKEN_LEN} bytes, got {}",
                b.len()
            )));
        }
        let mut bytes = [0u8; MAX_TOKEN_LEN];
        bytes[..b.len()].copy_from_slice(b);
        Ok(Token {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The token's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

/// A held lock: what was locked, with which token, and until when it is safe.
///
/// Plain data: it can be released or extended through any [`Client`] or [`Redlock`] on the same
/// servers. Dropping it does *not* release it (use [`LockGuard`] for that).
#[derive(Clone, PartialEq, Eq)]
pub struct Lock {
    resource: Bytes,
    token: Token,
    valid_until: Instant,
    extensions: u32,
}

impl Lock {
    /// A lock known by its parts, e.g. a token printed by `redlock acquire` in another process.
    /// `validity` is how long it is believed valid from now.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty resource or a bad token.
    pub fn from_parts(resource: &[u8], token: &[u8], validity: Duration) -> Result<Lock, Error> {
        if resource.is_empty() {
            return Err(Error::Config("empty resource name".into()));
        }
        Ok(Lock {
            resource: Bytes::new(resource),
            token: Token::from_bytes(token)?,
            valid_until: Instant::now() + validity.min(MAX_TTL),
            extensions: 0,
        })
    }

    /// The locked resource (the Redis key).
    pub fn resource(&self) -> &[u8] {
        self.resource.as_slice()
    }
    /// The token stored on the nodes.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// When the validity runs out.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
    /// The validity left now (zero once expired).
    pub fn validity(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
    /// True while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
    /// How often the lock was extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }

    pub(crate) fn set_state(&mut self, valid_until: Instant, extensions: u32) {
        self.valid_until = valid_until;
        self.extensions = extensions;
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &String::from_utf8_lossy(self.resource()))
            .field("token", &self.token)
            .field("validity", &self.validity())
            .field("extensions", &self.extensions)
            .finish()
    }
}

/// What one node says about a resource ([`Client::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// `host:port`.
    pub node: String,
    /// `Ok((value, pttl))` — the key's value (None: absent) and its remaining TTL in ms — or why
    /// the node could not be asked.
    pub state: Result<(Option<Vec<u8>>, i64), NodeFault>,
    /// Time from sending to the reply.
    pub rtt: Duration,
}

/// Per-node restart tracking for the quarantine.
#[derive(Debug, Clone, Copy, Default)]
struct NodeWatch {
    generation: u64,
    run_id: Option<[u8; 40]>,
    quarantined_until: Option<Instant>,
    /// Since when the node's restart state has been unknown (its `INFO server` reply had no
    /// `run_id` or uptime), across reconnects; `None` while it is known.
    unknown_since: Option<Instant>,
}

impl NodeWatch {
    /// Updates restart tracking from what the handshake's `INFO server` said on connection
    /// `generation`, and answers how long the node is still quarantined.
    fn quarantine_left(
        &mut self,
        window: Duration,
        generation: u64,
        info: Option<crate::conn::ServerInfo>,
        now: Instant,
    ) -> Option<Duration> {
        if generation != self.generation {
            self.generation = generation;
            let until = match info {
                Some(info) => {
                    self.unknown_since = None;
                    // A new run_id means a new process — a restart, a failover, a promoted
                    // replica, or an address that now leads to another server — whatever its
                    // uptime says: when it lost (or never had) our keys is unknown, so the whole
                    // window counts from the moment we noticed.
                    let restarted = self.run_id.is_some_and(|id| id != info.run_id);
                    self.run_id = Some(info.run_id);
                    if restarted {
                        Some(deadline_after(info.seen, window))
                    } else {
                        window.checked_sub(info.uptime).map(|left| info.seen + left)
                    }
                }
                // Restart state unknown: out of quorums until a whole window has passed since
                // this client first saw the node in that state (kept across reconnects, so a
                // server that closes idle connections is not quarantined forever).
                None => Some(deadline_after(
                    *self.unknown_since.get_or_insert(now),
                    window,
                )),
            };
            self.quarantined_until = until.max(self.quarantined_until);
        }
        self.quarantined_until
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}

/// One thread's connections to all nodes, and the state of its attempts. Not shareable between
/// threads (`&mut self`), but `Send`: see [`Redlock`] for a handle many threads can use.
pub struct Client {
    shared: Arc<Shared>,
    driver: Driver,
    round: Round,
    faults: Vec<Option<NodeFault>>,
    watch: Vec<NodeWatch>,
    /// Per node: missed the grace of an unlock and has not caught up since (not waited for).
    slow: Vec<bool>,
    /// How long the last round took to decide.
    last_round: Duration,
    /// Reused for encoding each operation's command once, for all nodes.
    scratch: bytes::BytesMut,
    /// `SET … NX PX <ttl>` pre-encoded for the configured TTL.
    set_nx_px: SetNxPx,
    tag: u64,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.shared.nodes)
            .finish_non_exhaustive()
    }
}

fn io_error(e: std::io::Error) -> Error {
    Error::Internal(format!("cannot create the event loop: {e}"))
}

/// Queues one node's request of a round: `(driver, node, sink)`.
type SendFn<'s> =
    dyn FnMut(&mut Driver, usize, &mut crate::driver::NodeSink<'_>) -> Result<(), NodeFault> + 's;

/// Encodes `args` as bulk strings (no array header): the tail of a script call.
fn encode_tail(buf: &mut bytes::BytesMut, args: &[Arg<'_>]) {
    buf.clear();
    buf.reserve(args.iter().map(crate::resp::bulk_len).sum());
    for arg in args {
        crate::resp::encode_bulk(buf, arg);
    }
}

/// What a reply means for a vote, per request kind.
fn vote_of(kind: Kind, reply: &Result<Frame<'_>, &NodeFault>) -> Result<Vote, NodeFault> {
    match (kind, reply) {
        (_, Err(fault)) => Err((*fault).clone()),
        (Kind::Set, Ok(Frame::Simple("OK"))) => Ok(Vote::Yes),
        (Kind::Set, Ok(Frame::Null)) => Ok(Vote::Refused),
        (Kind::Script(_), Ok(Frame::Integer(1))) => Ok(Vote::Yes),
        (Kind::Script(_), Ok(Frame::Integer(0))) => Ok(Vote::Refused),
        (_, Ok(Frame::Error(e))) if e.kind.is_auth() => Err(NodeFault::Auth(e.message.to_owned())),
        (_, Ok(Frame::Error(e))) => Err(NodeFault::Server(e.kind, e.message.to_owned())),
        (_, Ok(other)) => Err(NodeFault::Unexpected(format!("{:?}", other.to_value()))),
    }
}

impl Client {
    /// A client with default settings.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`].
    pub fn new<I, S>(servers: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder::new(servers).build_client()
    }

    /// The client's shared state (configuration, keeper).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Result<Client, Error> {
        let n = shared.nodes.len();
        Ok(Client {
            driver: Driver::new(&shared.nodes, &shared.conn).map_err(io_error)?,
            round: Round::new(n),
            faults: vec![None; n],
            watch: vec![NodeWatch::default(); n],
            slow: vec![false; n],
            last_round: Duration::ZERO,
            scratch: bytes::BytesMut::with_capacity(256),
            set_nx_px: SetNxPx::new(shared.config.ttl.as_millis() as u64),
            tag: 0,
            shared,
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.shared.nodes
    }

    /// Votes needed: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.round.quorum()
    }

    /// Connects to every node now, instead of on first use, and waits until each handshake is
    /// done, has failed, or `timeout` has passed; returns how many nodes are ready.
    ///
    /// Connections are otherwise made lazily inside the first attempt, whose per-node timeout
    /// (at most 50 ms by default) must then also cover connect and handshake: against distant
    /// masters, call this once before the first attempt.
    pub fn connect(&mut self, timeout: Duration) -> usize {
        let now = Instant::now();
        let deadline = deadline_after(now, timeout);
        let n = self.shared.nodes.len();
        let mut ready = self.driver.connect_all(now);
        self.driver.flush(now, &mut |_, _| {});
        // Until every node is ready or down: a refused node does not hold the others up.
        while ready < n
            && self.driver.conns.iter().any(|c| c.is_connecting())
            && Instant::now() < deadline
        {
            self.driver.turn(deadline, &mut |_, _| {});
            ready = self.driver.conns.iter().filter(|c| c.is_ready()).count();
        }
        ready
    }

    /// Bytes buffered per node: (unsent output, undecoded input). For tests of the buffer
    /// limits.
    #[doc(hidden)]
    pub fn buffered(&self) -> Vec<(usize, usize)> {
        self.driver.conns.iter().map(|c| c.buffered()).collect()
    }

    /// Syscalls made so far by this client's connections and poll loop.
    pub fn io_stats(&self) -> IoStats {
        self.driver.stats()
    }

    fn next_tag(&mut self) -> u64 {
        self.tag += 1;
        self.tag
    }

    fn check_resource(&self, resource: &[u8]) -> Result<(), Error> {
        if resource.is_empty() {
            return Err(Error::Config("empty resource name".into()));
        }
        let max = self.shared.config.max_resource_len;
        if resource.len() > max {
            return Err(Error::Config(format!(
                "resource name of {} bytes is longer than the limit of {max}",
                resource.len()
            )));
        }
        Ok(())
    }

    /// One attempt to acquire `resource` with the configured TTL.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when another holder has it, [`Error::NoQuorum`] when too few nodes
    /// answered, [`Error::TooSlow`] when the attempt ate the validity, [`Error::Auth`] when a
    /// node refused our credentials, [`Error::Config`] for a bad resource name.
    pub fn try_lock(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.attempt(resource.as_ref(), self.shared.config.ttl)
    }

    /// Acquires `resource`, retrying after a random delay up to the configured retry count.
    ///
    /// # Errors
    ///
    /// The last attempt's error, as [`Client::try_lock`].
    pub fn lock(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.retry(resource.as_ref(), None)
    }

    /// Acquires `resource`, retrying until `deadline` (whatever the retry count).
    ///
    /// # Errors
    ///
    /// The last attempt's error, as [`Client::try_lock`].
    pub fn lock_until(
        &mut self,
        resource: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<Lock, Error> {
        self.retry(resource.as_ref(), Some(deadline))
    }

    fn retry(&mut self, resource: &[u8], deadline: Option<Instant>) -> Result<Lock, Error> {
        let config = &self.shared.config;
        let (delay, jitter, tries) = (config.retry_delay, config.retry_jitter, config.retry_count);
        let mut attempt = 0u32;
        loop {
            let error = match self.try_lock(resource) {
                Ok(lock) => return Ok(lock),
                Err(e @ (Error::Config(_) | Error::Auth { .. } | Error::Permission { .. })) => {
                    return Err(e);
                }
                Err(e) => e,
            };
            attempt += 1;
            let pause = delay + rand::rng().random_range(Duration::ZERO..=jitter);
            let wake = Instant::now() + pause;
            match deadline {
                Some(d) if wake >= d => return Err(error),
                None if attempt > tries => return Err(error),
                _ => {}
            }
            self.idle_until(wake);
        }
    }

    /// Waits until `until` while consuming late replies (instead of sleeping blind).
    pub fn idle_until(&mut self, until: Instant) {
        while Instant::now() < until {
            self.driver.turn(until, &mut |_, _| {});
        }
    }

    /// Takes in whatever arrived while idle, before anything new is queued: stragglers are
    /// consumed, and an unsolicited reply (which RESP cannot tell from an answer once a request
    /// is outstanding) meets an empty queue and resets its connection. One `epoll_wait` with a
    /// zero timeout.
    fn drain_idle(&mut self, now: Instant) {
        self.driver.turn(now, &mut |_, _| {});
    }

    /// Sends the operation to every node, then runs the poll loop until the round decides.
    fn run_round(
        &mut self,
        tag: u64,
        start: Instant,
        config: &RoundConfig,
        send: &mut SendFn<'_>,
    ) -> Decision {
        self.drain_idle(start);
        self.round.start(start, config);
        self.faults.fill(None);
        let n = self.shared.nodes.len();
        let Client {
            driver,
            round,
            faults,
            watch,
            shared,
            ..
        } = self;
        let mut votes = Votes {
            round,
            faults,
            watch,
            window: shared.config.quarantine_window(),
            tag,
        };
        for node in 0..n {
            let sent = send(driver, node, &mut |i, d| on_vote(&mut votes, i, d));
            if let Err(fault) = sent {
                let failed = Delivery {
                    tag,
                    kind: Kind::Command,
                    reply: Err(&fault),
                    generation: 0,
                    info: None,
                    withdrawn: false,
                };
                on_vote(&mut votes, node, failed);
            }
        }
        driver.flush(start, &mut |i, d| on_vote(&mut votes, i, d));
        let decision = loop {
            let Votes { round, faults, .. } = &mut votes;
            if let Some(decision) = round.poll_decision() {
                break decision;
            }
            let Some(until) = round.poll_timeout() else {
                unreachable_decision();
                return Decision::Lost {
                    loss: Loss::NoQuorum,
                    yes: 0,
                };
            };
            let now = Instant::now();
            if now >= until {
                for (node, fault) in faults.iter_mut().enumerate() {
                    if round.is_pending(node) {
                        *fault = Some(NodeFault::Timeout);
                    }
                }
                round.handle_timeout(now);
                continue;
            }
            driver.turn(until, &mut |i, d| on_vote(&mut votes, i, d));
        };
        self.last_round = start.elapsed();
        decision
    }

    fn loss_error(&self, loss: Loss, extend: bool) -> Error {
        loss_error(&self.shared.nodes, &self.round, &self.faults, loss, extend)
    }

    fn attempt(&mut self, resource: &[u8], ttl: Duration) -> Result<Lock, Error> {
        self.check_resource(resource)?;
        let token = Token::generate()?;
        let config = &self.shared.config;
        let round_config = RoundConfig {
            min_validity: config.min_validity,
            ..RoundConfig::new(ttl, config.drift_factor, config.node_timeout_for(ttl))
        };
        let ttl_ms = ttl.as_millis() as u64;
        let tag = self.next_tag();
        let start = Instant::now();
        // Encoded once, copied to every node.
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        if ttl == self.shared.config.ttl {
            self.set_nx_px.encode(&mut buf, resource, token.as_bytes());
        } else {
            SetNxPx::new(ttl_ms).encode(&mut buf, resource, token.as_bytes());
        }
        let decision = self.run_round(tag, start, &round_config, &mut |driver, node, sink| {
            driver.request(node, Kind::Set, tag, &buf, start, sink)
        });
        self.scratch = buf;
        match decision {
            Decision::Won { valid_until, .. } => Ok(Lock {
                resource: Bytes::new(resource),
                token,
                valid_until,
                extensions: 0,
            }),
            Decision::Lost { loss, .. } => {
                // Release everywhere at once — refused and silent nodes too, since a late OK may
                // still come — without waiting for the replies.
                self.send_release(resource, &token);
                Err(self.loss_error(loss, false))
            }
        }
    }

    /// Queues the release script to every node and writes it; returns the operation's tag.
    fn send_release(&mut self, resource: &[u8], token: &Token) -> u64 {
        let tag = self.next_tag();
        let now = Instant::now();
        let script = &scripts()[0];
        let args = [
            Arg::Int(1),
            Arg::Bytes(resource),
            Arg::Bytes(token.as_bytes()),
        ];
        encode_tail(&mut self.scratch, &args);
        let mut ignore = |_: usize, _: Delivery<'_>| {};
        for node in 0..self.shared.nodes.len() {
            let tail = &self.scratch;
            let _ = self
                .driver
                .script(node, script, tag, tail, args.len(), now, &mut ignore);
        }
        self.driver.flush(now, &mut ignore);
        tag
    }

    /// Releases the lock on every node and reports how many still held it.
    ///
    /// Waits for the replies at most the per-node timeout. A node still answering earlier
    /// requests gets a short grace (four times what the last round took, at least a tenth of the
    /// node timeout); one that
    /// missed it is slow or frozen and is not waited for again until it has caught up (it still
    /// gets the release; its reply is consumed later). The count is of the nodes that answered
    /// in time.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] when the lock's validity had run out before the call (the release is
    /// still sent, and the error says how many nodes still held it).
    pub fn unlock(&mut self, lock: Lock) -> Result<usize, Error> {
        let expired = !lock.is_valid();
        let timeout = self.shared.config.node_timeout_for(self.shared.config.ttl);
        let now = Instant::now();
        self.drain_idle(now);
        let n = self.shared.nodes.len();
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        // Every node gets the release, but not every node is waited for:
        // - a node that still owes replies (the acquire's stragglers are usually a few µs
        //   behind the quorum) gets a short grace, a few times what the last round took;
        // - a node that missed that grace last time is slow or frozen, and nobody waits for it
        //   until it has caught up, so one slow node does not slow every cycle down.
        let mut answered = 0u64;
        let mut behind = 0u64;
        for (node, conn) in self.driver.conns.iter().enumerate() {
            if conn.pending() == 0 {
                self.slow[node] = false;
            } else if self.slow[node] {
                answered |= 1 << node;
            } else {
                behind |= 1 << node;
            }
        }
        let tag = self.send_release(lock.resource(), &lock.token);
        let sent = Instant::now();
        // Nodes whose request failed at once (down, backing off) have nothing pending.
        for (node, conn) in self.driver.conns.iter().enumerate() {
            if conn.pending() == 0 {
                answered |= 1 << node;
            }
        }
        let deadline = sent + timeout;
        // At least a tenth of the node timeout (5 ms by default): a healthy straggler on a
        // loaded machine makes it; a slow node pays it once, then is not waited for.
        let floor = (timeout / 10).max(Duration::from_millis(1));
        let grace = sent + (self.last_round * 4).clamp(floor, timeout);
        let mut released = 0;
        // Nodes whose "released" was counted, so that an answer taken back is uncounted.
        let mut counted = 0u64;
        loop {
            let now = Instant::now();
            if now >= grace && behind & !answered != 0 {
                for node in (0..n).filter(|&i| behind & !answered & (1 << i) != 0) {
                    self.slow[node] = true;
                }
                answered |= behind;
            }
            if answered == all || now >= deadline {
                break;
            }
            let until = if behind & !answered != 0 {
                grace.min(deadline)
            } else {
                deadline
            };
            let slow = &mut self.slow;
            self.driver.turn(until, &mut |node, d| {
                if d.tag == tag {
                    answered |= 1 << node;
                    // Keeping up after all: wait for it again next time.
                    slow[node] = false;
                    if d.withdrawn && counted & (1 << node) != 0 {
                        counted &= !(1 << node);
                        released -= 1;
                    } else if matches!(d.reply, Ok(Frame::Integer(1))) {
                        counted |= 1 << node;
                        released += 1;
                    }
                }
            });
        }
        if expired {
            Err(Error::Expired { released })
        } else {
            Ok(released)
        }
    }

    /// Extends the lock to `ttl` from now, on a quorum, within its current validity.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] if its validity ran out first, [`Error::ExtensionLimit`] past the
    /// configured number of extensions, [`Error::Held`] when nodes no longer hold our token,
    /// [`Error::NoQuorum`] / [`Error::TooSlow`] as for acquiring.
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let config = &self.shared.config;
        config.check_extend_ttl(ttl)?;
        if lock.extensions >= config.max_extensions {
            return Err(Error::ExtensionLimit(config.max_extensions));
        }
        let start = Instant::now();
        if start >= lock.valid_until {
            return Err(Error::Expired { released: 0 });
        }
        let round_config = RoundConfig {
            min_validity: config.min_validity,
            not_after: Some(lock.valid_until),
            ..RoundConfig::new(ttl, config.drift_factor, config.node_timeout_for(ttl))
        };
        let tag = self.next_tag();
        let ttl_ms = ttl.as_millis() as u64;
        let resource = lock.resource.clone();
        let script = &scripts()[1];
        let args = [
            Arg::Int(1),
            Arg::Bytes(resource.as_slice()),
            Arg::Bytes(lock.token.as_bytes()),
            Arg::UInt(ttl_ms),
        ];
        let mut tail = std::mem::take(&mut self.scratch);
        encode_tail(&mut tail, &args);
        let decision = self.run_round(tag, start, &round_config, &mut |driver, node, sink| {
            driver.script(node, script, tag, &tail, args.len(), start, sink)
        });
        self.scratch = tail;
        match decision {
            Decision::Won { valid_until, .. } => {
                lock.valid_until = valid_until;
                lock.extensions += 1;
                Ok(())
            }
            Decision::Lost { loss, .. } => {
                lock.valid_until = validity_after_lost_extend(lock.valid_until, &self.round);
                Err(self.loss_error(loss, true))
            }
        }
    }

    /// Extends several locks at once to `ttl`: each node gets every lock's extend script in one
    /// write, and the rounds run side by side in one poll loop. Used by the keep-alive thread.
    pub(crate) fn extend_batch(
        &mut self,
        locks: &mut [&mut Lock],
        ttl: Duration,
    ) -> Vec<Result<(), Error>> {
        let start = Instant::now();
        // As before any operation: notice connections the servers closed while idle (their
        // `timeout`), so that they are re-established within this operation.
        self.drain_idle(start);
        let config = &self.shared.config;
        let n = self.shared.nodes.len();
        let k = locks.len();
        let mut results: Vec<Option<Result<(), Error>>> = (0..k)
            .map(|i| {
                if let Err(e) = config.check_extend_ttl(ttl) {
                    Some(Err(e))
                } else if locks[i].extensions >= config.max_extensions {
                    Some(Err(Error::ExtensionLimit(config.max_extensions)))
                } else if start >= locks[i].valid_until {
                    Some(Err(Error::Expired { released: 0 }))
                } else {
                    None
                }
            })
            .collect();
        let base = self.tag + 1;
        self.tag += k as u64;
        let mut rounds: Vec<Round> = (0..k).map(|_| Round::new(n)).collect();
        let mut faults: Vec<Vec<Option<NodeFault>>> = vec![vec![None; n]; k];
        for (i, round) in rounds.iter_mut().enumerate() {
            let round_config = RoundConfig {
                min_validity: config.min_validity,
                not_after: Some(locks[i].valid_until),
                ..RoundConfig::new(ttl, config.drift_factor, config.node_timeout_for(ttl))
            };
            round.start(start, &round_config);
        }
        let window = config.quarantine_window();
        let ttl_ms = ttl.as_millis() as u64;
        let script = &scripts()[1];
        let Client { driver, watch, .. } = self;
        let mut batch = Batch {
            rounds: &mut rounds,
            faults: &mut faults,
            watch,
            window,
            base,
        };
        let mut sink = |node: usize, d: Delivery<'_>| batch.on_reply(node, d);
        // Each lock's arguments encoded once, for all nodes (a background path: the Vec is fine).
        let tails: Vec<bytes::BytesMut> = locks
            .iter()
            .map(|lock| {
                let mut tail = bytes::BytesMut::new();
                encode_tail(
                    &mut tail,
                    &[
                        Arg::Int(1),
                        Arg::Bytes(lock.resource()),
                        Arg::Bytes(lock.token.as_bytes()),
                        Arg::UInt(ttl_ms),
                    ],
                );
                tail
            })
            .collect();
        for node in 0..n {
            for (i, tail) in tails.iter().enumerate() {
                if results[i].is_some() {
                    continue;
                }
                let tag = base + i as u64;
                if let Err(fault) = driver.script(node, script, tag, tail, 4, start, &mut sink) {
                    sink(
                        node,
                        Delivery {
                            tag,
                            kind: Kind::Command,
                            reply: Err(&fault),
                            generation: 0,
                            info: None,
                            withdrawn: false,
                        },
                    );
                }
            }
        }
        driver.flush(start, &mut sink);
        loop {
            let undecided: Vec<usize> = (0..k)
                .filter(|&i| results[i].is_none() && batch.rounds[i].poll_decision().is_none())
                .collect();
            let Some(until) = undecided
                .iter()
                .filter_map(|&i| batch.rounds[i].poll_timeout())
                .min()
            else {
                break;
            };
            let now = Instant::now();
            if now < until {
                driver.turn(until, &mut |node, d| batch.on_reply(node, d));
                continue;
            }
            for i in undecided {
                if batch.rounds[i].poll_timeout().is_some_and(|t| t <= now) {
                    for node in 0..n {
                        if batch.rounds[i].is_pending(node) {
                            batch.faults[i][node] = Some(NodeFault::Timeout);
                        }
                    }
                    batch.rounds[i].handle_timeout(now);
                }
            }
        }
        (0..k)
            .map(|i| match results[i].take() {
                Some(r) => r,
                None => match rounds[i].poll_decision() {
                    Some(Decision::Won { valid_until, .. }) => {
                        locks[i].valid_until = valid_until;
                        locks[i].extensions += 1;
                        Ok(())
                    }
                    Some(Decision::Lost { loss, .. }) => {
                        locks[i].valid_until =
                            validity_after_lost_extend(locks[i].valid_until, &rounds[i]);
                        Err(loss_error(
                            &self.shared.nodes,
                            &rounds[i],
                            &faults[i],
                            loss,
                            true,
                        ))
                    }
                    None => Err(Error::Expired { released: 0 }),
                },
            })
            .collect()
    }

    /// Asks every node for the resource's value and remaining TTL (`GET` and `PTTL`), waiting at
    /// most `timeout`. For inspection (`redlock status`); not a lock operation.
    pub fn status(&mut self, resource: &[u8], timeout: Duration) -> Vec<NodeStatus> {
        let tag = self.next_tag();
        let start = Instant::now();
        self.drain_idle(start);
        let n = self.shared.nodes.len();
        let mut acc = StatusReplies {
            tag,
            values: vec![None; n],
            ttls: vec![None; n],
        };
        let mut get = bytes::BytesMut::new();
        crate::resp::encode_command(&mut get, &[Arg::Bytes(b"GET"), Arg::Bytes(resource)]);
        let mut pttl = bytes::BytesMut::new();
        crate::resp::encode_command(&mut pttl, &[Arg::Bytes(b"PTTL"), Arg::Bytes(resource)]);
        for node in 0..n {
            for cmd in [&get, &pttl] {
                let sent =
                    self.driver
                        .request(node, Kind::Command, tag, cmd, start, &mut |i, d| {
                            acc.on_reply(i, d)
                        });
                if let Err(f) = sent {
                    acc.values[node].get_or_insert(Err(f.clone()));
                    acc.ttls[node].get_or_insert((Err(f), start));
                }
            }
        }
        self.driver.flush(start, &mut |i, d| acc.on_reply(i, d));
        let deadline = deadline_after(start, timeout);
        while acc.ttls.iter().any(Option::is_none) && Instant::now() < deadline {
            self.driver.turn(deadline, &mut |i, d| acc.on_reply(i, d));
        }
        let StatusReplies {
            mut values,
            mut ttls,
            ..
        } = acc;
        (0..n)
            .map(|node| {
                let (pttl, at) = ttls[node]
                    .take()
                    .unwrap_or((Err(NodeFault::Timeout), deadline));
                let value = values[node].take().unwrap_or(Err(NodeFault::Timeout));
                NodeStatus {
                    node: self.shared.nodes[node].to_string(),
                    state: value.and_then(|v| pttl.map(|t| (v, t))),
                    rtt: at.saturating_duration_since(start),
                }
            })
            .collect()
    }
}

/// The validity a lock keeps after an extend that was sent and did not win.
///
/// Nodes that ran the compare-and-pexpire — in time, late, or after resuming from a freeze with
/// the command still queued — now expire the key `ttl` after they ran it, which may be sooner
/// than before. All of them ran it after the round's start, so the key lives on each of them at
/// least until `start + ttl − drift` (the round's `valid_until`), and on the others until the
/// old deadline: the lock is safe until the smaller of the two, never longer.
fn validity_after_lost_extend(old: Instant, round: &Round) -> Instant {
    round.valid_until().map_or(old, |backed| old.min(backed))
}

/// The node-by-node report of a round.
fn report(
    nodes: &Arc<[NodeAddr]>,
    round: &Round,
    faults: &[Option<NodeFault>],
    extend: bool,
) -> Report {
    let mut refused = 0u64;
    let mut failed = Vec::new();
    let mut yes = 0;
    for (node, fault) in faults.iter().enumerate().take(nodes.len()) {
        match round.vote(node) {
            Some(Vote::Yes) => yes += 1,
            Some(Vote::Refused) => refused |= 1 << node,
            Some(Vote::Failed) => failed.push((node, fault.clone().unwrap_or(NodeFault::Timeout))),
            None => {}
        }
    }
    Report {
        nodes: nodes.clone(),
        quorum: round.quorum(),
        yes,
        refused,
        failed,
        extend,
    }
}

/// The error for a lost round; an authentication failure on any node takes precedence.
fn loss_error(
    nodes: &Arc<[NodeAddr]>,
    round: &Round,
    faults: &[Option<NodeFault>],
    loss: Loss,
    extend: bool,
) -> Error {
    let report = report(nodes, round, faults, extend);
    for (node, fault) in report.failed.iter().map(|(i, f)| (*i, f.root())) {
        match fault {
            NodeFault::Auth(message) => {
                return Error::Auth {
                    node: nodes[node].to_string(),
                    message: message.clone(),
                };
            }
            NodeFault::Permission { .. } => {
                return Error::Permission {
                    node: nodes[node].to_string(),
                    message: fault.to_string(),
                };
            }
            _ => {}
        }
    }
    match loss {
        Loss::Held => Error::Held(report),
        Loss::NoQuorum => Error::NoQuorum(report),
        Loss::TooSlow => Error::TooSlow(report),
        Loss::Expired => Error::Expired { released: 0 },
    }
}

/// What [`on_vote`] updates while a round runs.
struct Votes<'a> {
    round: &'a mut Round,
    faults: &'a mut [Option<NodeFault>],
    watch: &'a mut [NodeWatch],
    window: Option<Duration>,
    tag: u64,
}

/// Feeds one reply to the round. Replies of earlier operations (stragglers) are dropped here,
/// and a yes from a node in restart quarantine counts as a failure.
fn on_vote(v: &mut Votes<'_>, node: usize, d: Delivery<'_>) {
    if d.tag != v.tag {
        return;
    }
    let now = Instant::now();
    if d.withdrawn {
        // The node's answer came with surplus frames or garbage: it does not count.
        if let Err(fault) = d.reply {
            v.faults[node] = Some(fault.clone());
        }
        v.round.handle_withdraw(node, now);
        return;
    }
    let mut vote = vote_of(d.kind, &d.reply);
    // Only a SET NX yes is doubtful: a node that lost its keys in a restart may grant a lock
    // that is held. An extend yes proves the node still holds our token, so it is refusing
    // everyone else and counts.
    if vote == Ok(Vote::Yes)
        && d.kind == Kind::Set
        && let (Some(window), Some(watch)) = (v.window, v.watch.get_mut(node))
        && let Some(left) = watch.quarantine_left(window, d.generation, d.info, now)
    {
        vote = Err(NodeFault::Quarantined(left));
    }
    match vote {
        Ok(vote) => v.round.handle_vote(node, vote, now),
        Err(fault) => {
            v.faults[node] = Some(fault);
            v.round.handle_vote(node, Vote::Failed, now);
        }
    }
}

/// Rounds of a batch of extensions, told apart by tag (`base + index`).
struct Batch<'a> {
    rounds: &'a mut [Round],
    faults: &'a mut [Vec<Option<NodeFault>>],
    watch: &'a mut [NodeWatch],
    window: Option<Duration>,
    base: u64,
}

impl Batch<'_> {
    fn on_reply(&mut self, node: usize, d: Delivery<'_>) {
        let Some(i) = d
            .tag
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < self.rounds.len())
        else {
            return; // a straggler of an earlier operation
        };
        let tag = d.tag;
        let mut votes = Votes {
            round: &mut self.rounds[i],
            faults: &mut self.faults[i],
            watch: self.watch,
            window: self.window,
            tag,
        };
        on_vote(&mut votes, node, d);
    }
}

/// Replies to `GET` and `PTTL` per node, for [`Client::status`].
struct StatusReplies {
    tag: u64,
    values: Vec<Option<Result<Option<Vec<u8>>, NodeFault>>>,
    ttls: Vec<Option<(Result<i64, NodeFault>, Instant)>>,
}

impl StatusReplies {
    fn on_reply(&mut self, node: usize, d: Delivery<'_>) {
        if d.tag != self.tag {
            return;
        }
        if d.withdrawn {
            // The node's answers came with surplus frames or garbage: none of them stands.
            if let Err(fault) = d.reply {
                self.values[node] = Some(Err(fault.clone()));
                self.ttls[node] = Some((Err(fault.clone()), Instant::now()));
            }
            return;
        }
        let unexpected = |f: &Frame<'_>| NodeFault::Unexpected(format!("{:?}", f.to_value()));
        if self.values[node].is_none() {
            self.values[node] = Some(match d.reply {
                Ok(Frame::Bulk(b)) => Ok(Some(b.to_vec())),
                Ok(Frame::Null) => Ok(None),
                Ok(other) => Err(unexpected(&other)),
                Err(f) => Err(f.clone()),
            });
        } else if self.ttls[node].is_none() {
            let pttl = match d.reply {
                Ok(Frame::Integer(ms)) => Ok(ms),
                Ok(other) => Err(unexpected(&other)),
                Err(f) => Err(f.clone()),
            };
            self.ttls[node] = Some((pttl, Instant::now()));
        }
    }
}

fn unreachable_decision() {
    // An undecided round always has a deadline; reaching here would be a bug in round.rs.
    debug_assert!(false, "undecided round without a deadline");
}

thread_local! {
    static CLIENTS: RefCell<Vec<Client>> = const { RefCell::new(Vec::new()) };
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        // The keeper thread holds the Shared; tell it to finish so both go away.
        let keeper = self
            .shared
            .keeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(tx) = keeper {
            let _ = tx.send(Cmd::Shutdown);
        }
    }
}

/// A lock client for many threads: `Send + Sync + Clone`, methods take `&self`.
///
/// Each thread that uses it gets its own [`Client`] (its own connections and poll loop), kept in
/// thread-local storage: the hot path takes no lock shared between threads and makes no thread
/// hop. A thread's connections close when the thread ends, or at its next use after the last
/// handle is dropped.
///
/// ```no_run
/// let redlock = redlock_mux::Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = redlock.lock("orders:42")?;
/// // ... work, within lock.validity() ...
/// let released = redlock.unlock(lock)?;
/// assert_eq!(released, 3);
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Clone)]
pub struct Redlock {
    handle: Arc<Handle>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.handle.shared.nodes)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// A handle with default settings.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`].
    pub fn new<I, S>(servers: I) -> Result<Redlock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Builder::new(servers).build()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.handle.shared.config
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Keep-alive counters so far: (ticks that extended locks, `write` calls in them, locks
    /// extended). For tests of the batching.
    #[doc(hidden)]
    pub fn keeper_stats(&self) -> (u64, u64, u64) {
        let s = &self.handle.shared;
        (
            s.keeper_ticks.load(Ordering::Relaxed),
            s.keeper_writes.load(Ordering::Relaxed),
            s.keeper_extended.load(Ordering::Relaxed),
        )
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.handle.shared.nodes
    }

    /// A new client owned by the caller, sharing this handle's configuration.
    ///
    /// # Errors
    ///
    /// If the event loop cannot be created.
    pub fn client(&self) -> Result<Client, Error> {
        Client::from_shared(self.handle.shared.clone())
    }

    /// Runs `f` with this thread's client for this handle.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client) -> R) -> Result<R, Error> {
        let shared = &self.handle.shared;
        let cached = CLIENTS
            .try_with(|cell| {
                let mut clients = cell.try_borrow_mut().ok()?;
                clients.retain(|c| !c.shared.closed.load(Ordering::Acquire));
                let at = clients
                    .iter()
                    .position(|c| Arc::ptr_eq(&c.shared, shared))?;
                Some(clients.swap_remove(at))
            })
            .ok()
            .flatten();
        let mut client = match cached {
            Some(c) => c,
            None => Client::from_shared(shared.clone())?,
        };
        let result = f(&mut client);
        // During thread teardown the cache may be gone: the client is then simply dropped.
        let _ = CLIENTS.try_with(|cell| {
            if let Ok(mut clients) = cell.try_borrow_mut() {
                clients.push(client);
            }
        });
        Ok(result)
    }

    /// Connects this thread's client to every node now; see [`Client::connect`].
    ///
    /// # Errors
    ///
    /// If the event loop cannot be created.
    pub fn connect(&self, timeout: Duration) -> Result<usize, Error> {
        self.with_client(|c| c.connect(timeout))
    }

    /// One attempt; see [`Client::try_lock`].
    ///
    /// # Errors
    ///
    /// As [`Client::try_lock`].
    pub fn try_lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.with_client(|c| c.try_lock(resource))?
    }
    /// Acquire with retries; see [`Client::lock`].
    ///
    /// # Errors
    ///
    /// As [`Client::lock`].
    pub fn lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        self.with_client(|c| c.lock(resource))?
    }
    /// Acquire, retrying until `deadline`; see [`Client::lock_until`].
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`].
    pub fn lock_until(&self, resource: impl AsRef<[u8]>, deadline: Instant) -> Result<Lock, Error> {
        self.with_client(|c| c.lock_until(resource, deadline))?
    }
    /// Release; see [`Client::unlock`].
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`].
    pub fn unlock(&self, lock: Lock) -> Result<usize, Error> {
        self.with_client(|c| c.unlock(lock))?
    }
    /// Extend; see [`Client::extend`].
    ///
    /// # Errors
    ///
    /// As [`Client::extend`].
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        self.with_client(|c| c.extend(lock, ttl))?
    }
    /// Acquire with retries and return a guard that releases the lock when dropped.
    ///
    /// # Errors
    ///
    /// As [`Client::lock`].
    pub fn guard(&self, resource: impl AsRef<[u8]>) -> Result<LockGuard<'_>, Error> {
        Ok(LockGuard {
            redlock: self,
            lock: Some(self.lock(resource)?),
        })
    }
}

/// Releases its lock when dropped (waiting at most the per-node timeout; errors are ignored and
/// nothing panics). Derefs to the [`Lock`].
#[derive(Debug)]
pub struct LockGuard<'a> {
    redlock: &'a Redlock,
    lock: Option<Lock>,
}

impl LockGuard<'_> {
    /// Extends the guarded lock.
    ///
    /// # Errors
    ///
    /// As [`Client::extend`].
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        match self.lock.as_mut() {
            Some(lock) => self.redlock.extend(lock, ttl),
            None => Err(Error::Expired { released: 0 }),
        }
    }

    /// Releases now and reports how many nodes released.
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`].
    pub fn unlock(mut self) -> Result<usize, Error> {
        match self.lock.take() {
            Some(lock) => self.redlock.unlock(lock),
            None => Ok(0),
        }
    }

    /// Gives the lock up without releasing it.
    pub fn into_inner(mut self) -> Lock {
        self.lock
            .take()
            .expect("a guard holds its lock until consumed")
    }
}

impl std::ops::Deref for LockGuard<'_> {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a guard holds its lock until consumed")
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = self.redlock.unlock(lock);
        }
    }
}
