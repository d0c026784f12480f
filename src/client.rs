//! The public API: configuration, [`Client`] (one thread's connections), [`Redlock`] (a handle
//! shared by many threads), [`Lock`] and [`LockGuard`].

use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use rand::{RngExt, TryRng};

use crate::addr::NodeAddr;
use crate::conn::{ConnConfig, IoStats};
use crate::driver::Driver;
use crate::engine::{Engine, Outcome, ReqKind, Shutdown};
use crate::error::{Error, NodeFault};
use crate::hub::Hub;
use crate::keep::Cmd;
use crate::resp::Limits;
use crate::round::{RoundConfig, deadline_after};

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
    fn check_resource(&self, resource: &[u8]) -> Result<(), Error> {
        if resource.is_empty() {
            return Err(Error::Config("empty resource name".into()));
        }
        let max = self.max_resource_len;
        if resource.len() > max {
            return Err(Error::Config(format!(
                "resource name of {} bytes is longer than the limit of {max}",
                resource.len()
            )));
        }
        Ok(())
    }

    /// An acquire of `resource` with the configured TTL and a fresh token.
    pub(crate) fn acquire_request(&self, resource: &[u8]) -> Result<(ReqKind, Token), Error> {
        self.check_resource(resource)?;
        Ok((ReqKind::Acquire { ttl: self.ttl }, Token::generate()?))
    }

    /// An extend of `lock` to `ttl`, if the lock may still be extended at `now`.
    pub(crate) fn extend_request(
        &self,
        lock: &Lock,
        ttl: Duration,
        now: Instant,
    ) -> Result<ReqKind, Error> {
        self.check_extend_ttl(ttl)?;
        if lock.extensions >= self.max_extensions {
            return Err(Error::ExtensionLimit(self.max_extensions));
        }
        if now >= lock.valid_until {
            return Err(Error::Expired { released: 0 });
        }
        Ok(ReqKind::Extend {
            ttl,
            valid_until: lock.valid_until,
        })
    }

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

    /// A request unanswered for this long means its node hangs: the connection is reset and
    /// the node reconnected. Default 5 s.
    pub fn reply_timeout(mut self, t: Duration) -> Builder {
        self.config.reply_timeout = t;
        self
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
        let shared = self.shared()?;
        let hub = Hub::start(Client::from_shared(shared.clone())?)?;
        Ok(Redlock {
            handle: Arc::new(Handle { shared, hub }),
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
    pub(crate) nodes: Arc<[NodeAddr]>,
    pub(crate) config: Config,
    pub(crate) conn: ConnConfig,
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
    /// No token (status reads carry none).
    pub(crate) const EMPTY: Token = Token {
        len: 0,
        bytes: [0; MAX_TOKEN_LEN],
    };

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
pub(crate) struct NodeWatch {
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
    pub(crate) fn quarantine_left(
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

/// One engine owned by one thread: its own connections to all nodes, driven on the calling
/// thread (`&mut self`), one operation at a time. `Send`, not shareable: see [`Redlock`] for a
/// handle many threads share (one engine, one connection per node).
pub struct Client {
    engine: Engine,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.engine.shared.nodes)
            .finish_non_exhaustive()
    }
}

fn io_error(e: std::io::Error) -> Error {
    Error::Internal(format!("cannot create the event loop: {e}"))
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
        &self.engine.shared
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Result<Client, Error> {
        let driver = Driver::new(&shared.nodes, &shared.conn).map_err(io_error)?;
        Ok(Client {
            engine: Engine::new(shared, driver, Instant::now()),
        })
    }

    pub(crate) fn engine(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.engine.shared.config
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.engine.shared.nodes
    }

    /// Votes needed: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.engine.shared.nodes.len() / 2 + 1
    }

    /// Connects to every node now, instead of on first use, and waits until each handshake is
    /// done, has failed, or `timeout` has passed; returns how many nodes are ready.
    ///
    /// Connections are otherwise made lazily inside the first attempt, whose per-node timeout
    /// (at most 50 ms by default) must then also cover connect and handshake: against distant
    /// masters, call this once before the first attempt.
    pub fn connect(&mut self, timeout: Duration) -> usize {
        self.engine.connect(timeout)
    }

    /// Bytes buffered per node: (unsent output, undecoded input). For tests of the buffer
    /// limits.
    #[doc(hidden)]
    pub fn buffered(&self) -> Vec<(usize, usize)> {
        self.engine
            .driver
            .conns
            .iter()
            .map(|c| c.buffered())
            .collect()
    }

    /// Syscalls made so far by this client's connections and poll loop.
    pub fn io_stats(&self) -> IoStats {
        self.engine.driver.stats()
    }

    /// Requests waiting for a reply, per node. For tests of connection failures.
    #[doc(hidden)]
    pub fn pending(&self) -> Vec<usize> {
        self.engine
            .driver
            .conns
            .iter()
            .map(|c| c.pending())
            .collect()
    }

    /// Releases not confirmed yet: (in flight, waiting in the ledger for their node). For tests.
    #[doc(hidden)]
    pub fn unconfirmed(&self) -> (usize, usize) {
        self.engine.unconfirmed_parts()
    }

    /// One attempt to acquire `resource` with the configured TTL.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when another holder has it, [`Error::NoQuorum`] when too few nodes
    /// answered, [`Error::TooSlow`] when the attempt ate the validity, [`Error::Auth`] when a
    /// node refused our credentials, [`Error::Config`] for a bad resource name.
    pub fn try_lock(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = self.config().acquire_request(resource)?;
        let outcome = self.engine.run(kind, resource, &token);
        lock_of(resource, token, outcome)
    }

    /// One attempt on each of several resources at once: every node gets all the `SET`s in one
    /// write, and the rounds are decided side by side in one loop.
    ///
    /// # Errors
    ///
    /// Per resource, as [`Client::try_lock`].
    pub fn try_lock_many<R: AsRef<[u8]>>(&mut self, resources: &[R]) -> Vec<Result<Lock, Error>> {
        let config = self.engine.shared.config.clone();
        let prepared: Vec<Result<(ReqKind, Token), Error>> = resources
            .iter()
            .map(|r| config.acquire_request(r.as_ref()))
            .collect();
        let mut outcomes = self
            .engine
            .run_all(
                prepared
                    .iter()
                    .zip(resources)
                    .filter_map(|(p, r)| p.as_ref().ok().map(|&(k, t)| (k, r.as_ref(), t))),
            )
            .into_iter();
        prepared
            .into_iter()
            .zip(resources)
            .map(|(p, r)| {
                let (_, token) = p?;
                match outcomes.next().flatten() {
                    Some(outcome) => lock_of(r.as_ref(), token, outcome),
                    None => Err(Error::Internal("operation lost".into())),
                }
            })
            .collect()
    }

    /// Acquires `resource`, retrying after a random delay up to the configured retry count.
    ///
    /// # Errors
    ///
    /// The last attempt's error, as [`Client::try_lock`].
    pub fn lock(&mut self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let config = self.config().clone();
        let resource = resource.as_ref();
        retry(&config, None, |wake| {
            if let Some(until) = wake {
                self.idle_until(until);
            }
            self.try_lock(resource)
        })
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
        let config = self.config().clone();
        let resource = resource.as_ref();
        retry(&config, Some(deadline), |wake| {
            if let Some(until) = wake {
                self.idle_until(until);
            }
            self.try_lock(resource)
        })
    }

    /// Waits until `until` while consuming late replies (instead of sleeping blind).
    pub fn idle_until(&mut self, until: Instant) {
        self.engine.drive_until(until, |_| false);
    }

    /// Releases the lock on every node and reports how many still held it.
    ///
    /// Waits for the replies at most the per-node timeout. A node still answering earlier
    /// requests gets a short grace (four times what the last round took, at least a tenth of the
    /// node timeout); one that missed it is slow or frozen and is not waited for again until it
    /// has caught up (it still gets the release; its reply is consumed later). The count is of
    /// the nodes that answered in time. A release a node could not confirm (its connection
    /// failed, or it was down) is sent again when the node is reachable, while the key could
    /// still live.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] when the lock's validity had run out before the call (the release is
    /// still sent, and the error says how many nodes still held it).
    pub fn unlock(&mut self, lock: Lock) -> Result<usize, Error> {
        let expired = !lock.is_valid();
        let outcome = self
            .engine
            .run(ReqKind::Release, lock.resource(), &lock.token);
        released_of(expired, outcome)
    }

    /// Extends the lock to `ttl` from now, on a quorum, within its current validity.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] if its validity ran out first, [`Error::ExtensionLimit`] past the
    /// configured number of extensions, [`Error::Held`] when nodes no longer hold our token,
    /// [`Error::NoQuorum`] / [`Error::TooSlow`] as for acquiring.
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let kind = self.config().extend_request(lock, ttl, Instant::now())?;
        let outcome = self.engine.run(kind, lock.resource(), &lock.token);
        apply_extend(lock, outcome)
    }

    /// Extends several locks at once to `ttl`: each node gets every lock's extend script in one
    /// write, and the rounds run side by side in one poll loop. Used by the keep-alive thread.
    pub(crate) fn extend_batch(
        &mut self,
        locks: &mut [&mut Lock],
        ttl: Duration,
    ) -> Vec<Result<(), Error>> {
        // `run_all` drains first, as before any operation: connections the servers closed
        // while idle (their `timeout`) are noticed and re-established within this one.
        let start = Instant::now();
        let config = self.engine.shared.config.clone();
        let prepared: Vec<Result<ReqKind, Error>> = locks
            .iter()
            .map(|lock| config.extend_request(lock, ttl, start))
            .collect();
        let mut outcomes = self
            .engine
            .run_all(
                prepared
                    .iter()
                    .zip(locks.iter())
                    .filter_map(|(p, l)| p.as_ref().ok().map(|&k| (k, l.resource(), l.token))),
            )
            .into_iter();
        prepared
            .into_iter()
            .zip(locks.iter_mut())
            .map(|(p, lock)| {
                p?;
                match outcomes.next().flatten() {
                    Some(outcome) => apply_extend(lock, outcome),
                    None => Err(Error::Expired { released: 0 }),
                }
            })
            .collect()
    }

    /// Asks every node for the resource's value and remaining TTL (`GET` and `PTTL`), waiting at
    /// most `timeout`. For inspection (`redlock status`); not a lock operation.
    pub fn status(&mut self, resource: &[u8], timeout: Duration) -> Vec<NodeStatus> {
        status_of(
            self.engine
                .run(ReqKind::Status { timeout }, resource, &Token::EMPTY),
        )
    }
}

/// Retries `attempt` after a random delay, up to the configured count or until `deadline`.
/// `attempt` gets the instant to wait until before trying (none for the first try).
pub(crate) fn retry(
    config: &Config,
    deadline: Option<Instant>,
    mut attempt: impl FnMut(Option<Instant>) -> Result<Lock, Error>,
) -> Result<Lock, Error> {
    let (delay, jitter, tries) = (config.retry_delay, config.retry_jitter, config.retry_count);
    let mut wake = None;
    let mut n = 0u32;
    loop {
        let error = match attempt(wake) {
            Ok(lock) => return Ok(lock),
            Err(e @ (Error::Config(_) | Error::Auth { .. } | Error::Permission { .. })) => {
                return Err(e);
            }
            Err(e) => e,
        };
        n += 1;
        let pause = delay + rand::rng().random_range(Duration::ZERO..=jitter);
        let at = Instant::now() + pause;
        match deadline {
            Some(d) if at >= d => return Err(error),
            None if n > tries => return Err(error),
            _ => {}
        }
        wake = Some(at);
    }
}

/// The lock an acquire's outcome gives.
pub(crate) fn lock_of(resource: &[u8], token: Token, outcome: Outcome) -> Result<Lock, Error> {
    match outcome {
        Outcome::Acquired(Ok(valid_until)) => Ok(Lock {
            resource: Bytes::new(resource),
            token,
            valid_until,
            extensions: 0,
        }),
        Outcome::Acquired(Err(e)) => Err(e),
        _ => unreachable_outcome(Err(Error::Internal("unexpected outcome".into()))),
    }
}

/// What a status read returns.
fn status_of(outcome: Outcome) -> Vec<NodeStatus> {
    match outcome {
        Outcome::Status(s) => s,
        _ => unreachable_outcome(Vec::new()),
    }
}

/// What an unlock returns.
pub(crate) fn released_of(expired: bool, outcome: Outcome) -> Result<usize, Error> {
    let released = match outcome {
        Outcome::Released(n) => n,
        _ => unreachable_outcome(0),
    };
    if expired {
        Err(Error::Expired { released })
    } else {
        Ok(released)
    }
}

/// Applies an extend's outcome to the lock: the validity after it (cut short if it was lost).
pub(crate) fn apply_extend(lock: &mut Lock, outcome: Outcome) -> Result<(), Error> {
    match outcome {
        Outcome::Extended(valid_until, result) => {
            lock.valid_until = valid_until;
            if result.is_ok() {
                lock.extensions += 1;
            }
            result
        }
        _ => unreachable_outcome(Err(Error::Internal("unexpected outcome".into()))),
    }
}

fn unreachable_outcome<T>(fallback: T) -> T {
    // Each request kind has its outcome kind; reaching here would be a bug in engine.rs.
    debug_assert!(false, "outcome of the wrong kind");
    fallback
}

struct Handle {
    shared: Arc<Shared>,
    hub: Arc<Hub>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The engine thread flushes unconfirmed releases (bounded), then stops.
        self.hub.close();
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
/// All clones share one engine: one connection per node and one `mio` loop, with any number of
/// operations in flight from any number of threads. Every command queued for a node during a
/// turn of the loop goes out in one `write`; replies are matched to their operations in order.
/// A caller that finds the loop idle drives it itself (no thread hop); callers arriving while
/// it runs hand their request over and park until their outcome is in. A background thread
/// (`redlock-engine`) takes the loop over while callers wait and nobody else drives it.
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

    /// A new client owned by the caller, with connections of its own, sharing this handle's
    /// configuration.
    ///
    /// # Errors
    ///
    /// If the event loop cannot be created.
    pub fn client(&self) -> Result<Client, Error> {
        Client::from_shared(self.handle.shared.clone())
    }

    /// Runs `f` with the handle's engine, once the loop is free (requests other threads queue
    /// meanwhile are served by whatever `f` does, or wait until it returns). For inspection and
    /// tests; not for the hot path.
    ///
    /// # Errors
    ///
    /// None today; kept fallible for compatibility.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client) -> R) -> Result<R, Error> {
        let hub = &self.handle.hub;
        let mut guard = hub.engine();
        let result = f(&mut guard);
        hub.leave(guard);
        Ok(result)
    }

    /// Syscalls made so far by the shared engine's connections and poll loop, and how often a
    /// caller had to wake the loop (`wakes`).
    pub fn io_stats(&self) -> IoStats {
        let hub = &self.handle.hub;
        let mut stats = self.with_client(|c| c.io_stats()).unwrap_or_default();
        stats.wakes = hub.mailbox.wakes.load(Ordering::Relaxed) as u64;
        stats
    }

    /// Connects the shared engine to every node now; see [`Client::connect`].
    ///
    /// # Errors
    ///
    /// None today; kept fallible for compatibility.
    pub fn connect(&self, timeout: Duration) -> Result<usize, Error> {
        self.with_client(|c| c.connect(timeout))
    }

    /// One attempt; see [`Client::try_lock`].
    ///
    /// # Errors
    ///
    /// As [`Client::try_lock`].
    pub fn try_lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let (kind, token) = self.config().acquire_request(resource)?;
        let outcome = self.handle.hub.call(kind, resource, &token);
        lock_of(resource, token, outcome)
    }
    /// Acquire with retries; see [`Client::lock`].
    ///
    /// # Errors
    ///
    /// As [`Client::lock`].
    pub fn lock(&self, resource: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        retry(self.config(), None, |wake| {
            sleep_until(wake);
            self.try_lock(resource)
        })
    }
    /// Acquire, retrying until `deadline`; see [`Client::lock_until`].
    ///
    /// # Errors
    ///
    /// As [`Client::lock_until`].
    pub fn lock_until(&self, resource: impl AsRef<[u8]>, deadline: Instant) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        retry(self.config(), Some(deadline), |wake| {
            sleep_until(wake);
            self.try_lock(resource)
        })
    }
    /// Release; see [`Client::unlock`].
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`].
    pub fn unlock(&self, lock: Lock) -> Result<usize, Error> {
        let expired = !lock.is_valid();
        let outcome = self
            .handle
            .hub
            .call(ReqKind::Release, lock.resource(), &lock.token);
        released_of(expired, outcome)
    }
    /// Releases the lock without waiting for the nodes' replies: the release is queued on the
    /// shared engine and written within the current (or next) turn of its loop. Half the
    /// hand-offs of [`Redlock::unlock`] under load. A node that cannot confirm it (down, or its
    /// connection fails) gets it again when reachable, while the key could live;
    /// [`Redlock::shutdown`] waits for every release to be confirmed and says how many were.
    pub fn unlock_nowait(&self, lock: Lock) {
        self.handle
            .hub
            .send(ReqKind::Release, lock.resource(), &lock.token);
    }
    /// Extend; see [`Client::extend`].
    ///
    /// # Errors
    ///
    /// As [`Client::extend`].
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        let kind = self.config().extend_request(lock, ttl, Instant::now())?;
        let outcome = self.handle.hub.call(kind, lock.resource(), &lock.token);
        apply_extend(lock, outcome)
    }
    /// What every node says about `resource`; see [`Client::status`].
    pub fn status(&self, resource: &[u8], timeout: Duration) -> Vec<NodeStatus> {
        status_of(
            self.handle
                .hub
                .call(ReqKind::Status { timeout }, resource, &Token::EMPTY),
        )
    }
    /// Sends every release not confirmed yet (in flight, or waiting for its node to come back)
    /// and waits for their replies, at most `timeout`; says how many were confirmed. Dropping
    /// the last handle does the same in the background, bounded by the connect timeout.
    pub fn shutdown(&self, timeout: Duration) -> Shutdown {
        self.handle.hub.shutdown(timeout)
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

fn sleep_until(wake: Option<Instant>) {
    if let Some(until) = wake {
        let now = Instant::now();
        if until > now {
            std::thread::sleep(until - now);
        }
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
