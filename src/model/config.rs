//! Configuration: the settings ([`Config`], [`Quarantine`]), the [`Builder`] that checks them,
//! and `Shared`, what every engine of one handle reads (node addresses, settings, connection
//! settings, keep-alive counters).
//!
//! `Builder::build` and `Builder::build_client` live beside what they build (`api/redlock.rs`,
//! `runtime/client.rs`), so that this file depends on neither.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::model::addr::{NodeAddr, ServerKey, redact};
use crate::model::error::Error;
use crate::model::mutation::Mutation;
use crate::model::round::RoundConfig;
use crate::model::tls::{self, TlsDefaults};
use crate::model::wire::Limits;

/// A duration as a person writes it, for messages: `0 ms`, `250 ms`, `1.5 s`, `2 min 5 s`,
/// `3 h 20 min`, `24 days 20 h` (not `Debug`'s `0ns` or `2147483.647s`).
pub(crate) struct Human(pub Duration);

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        /// A number with up to three decimals, trailing zeros dropped.
        fn decimal(
            f: &mut std::fmt::Formatter<'_>,
            whole: u128,
            thousandths: u128,
            unit: &str,
        ) -> std::fmt::Result {
            if thousandths == 0 {
                return write!(f, "{whole} {unit}");
            }
            let frac = format!("{thousandths:03}");
            write!(f, "{whole}.{} {unit}", frac.trim_end_matches('0'))
        }
        let d = self.0;
        let (secs, nanos) = (u128::from(d.as_secs()), d.as_nanos());
        let pair = |f: &mut std::fmt::Formatter<'_>,
                    big: u128,
                    big_unit: &str,
                    small: u128,
                    small_unit: &str| {
            if small == 0 {
                write!(f, "{big} {big_unit}")
            } else {
                write!(f, "{big} {big_unit} {small} {small_unit}")
            }
        };
        match secs {
            _ if nanos == 0 => f.write_str("0 ms"),
            0 if nanos < 1_000 => write!(f, "{nanos} ns"),
            0 if nanos < 1_000_000 => decimal(f, nanos / 1_000, 0, "µs"),
            0 => decimal(f, nanos / 1_000_000, nanos / 1_000 % 1_000, "ms"),
            1..60 => decimal(f, secs, nanos / 1_000_000 % 1_000, "s"),
            60..3_600 => pair(f, secs / 60, "min", secs % 60, "s"),
            3_600..86_400 => pair(f, secs / 3_600, "h", secs / 60 % 60, "min"),
            86_400..172_800 => pair(f, 1, "day", secs / 3_600 % 24, "h"),
            _ => pair(f, secs / 86_400, "days", secs / 3_600 % 24, "h"),
        }
    }
}

/// Most nodes a client may use (node sets are 64-bit masks).
pub const MAX_NODES: usize = 64;
/// Longest TTL accepted: 2³¹ − 1 ms (about 24.8 days).
pub const MAX_TTL: Duration = Duration::from_millis(i32::MAX as u64);

/// Client settings. The defaults (given with each field, and set by [`Config::default`]) are
/// those of the Redlock reference; [`Builder`] sets them one by one and checks them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Lock time to live (`PX`), in whole milliseconds (a fraction of one is dropped, from the
    /// validity too). Default 30 s.
    pub ttl: Duration,
    /// How many retry pauses [`Client::lock`](crate::Client::lock) waits at most: its budget is
    /// [`Config::lock_wait`]. Default 10.
    pub retry_count: u32,
    /// Wait between attempts of a waiting caller that no release notice wakes (a lock held by a
    /// client that does not publish, or one that expires): the fallback poll. Default 200 ms;
    /// at least [`MIN_RETRY_DELAY`] (1 ms).
    pub retry_delay: Duration,
    /// Up to this much random time is added to each wait. Default 200 ms.
    pub retry_jitter: Duration,
    /// Wait for each node per attempt; `None`: 5 % of the TTL, at most 50 ms.
    pub node_timeout: Option<Duration>,
    /// Clock drift factor: `ttl × factor + 2 ms` is taken off the validity. Default 0.01.
    pub drift_factor: f64,
    /// A lock with less validity than this left at acquisition (or extend) counts as not
    /// acquired; an extend TTL that cannot leave more is refused up front. Default 0.
    pub min_validity: Duration,
    /// Most extensions of one lock. Default 1000.
    pub max_extensions: u32,
    /// Kept locks ([`Redlock::keep`](crate::Redlock::keep)) are extended when this fraction of the TTL is left.
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
    /// A request unanswered this long resets its connection. Default 5 s. A connection whose
    /// vote a lost round needed is reset sooner: after `connect_timeout`, if shorter.
    pub reply_timeout: Duration,
    /// Most requests awaiting replies on one connection; more are refused (that node fails
    /// for the operation) until replies make room. Default 1024.
    pub max_pending: usize,
    /// Decoder limits; `max_frame_len` bounds each connection's input buffer. Default
    /// [`Limits::CLIENT`].
    pub limits: Limits,
    /// Sent with `CLIENT SETNAME` in the handshake. Default none.
    pub client_name: Option<String>,
    /// Who holds the locks this handle takes, stored with each lock on every node: the value
    /// is `<token> <owner>` ([`split_value`](crate::split_value) reads it back), so that
    /// [`Client::status`](crate::Client::status), `redlock status` and a `GET` in `redis-cli`
    /// say who holds a lock — a host, a process, a job. It rides in the acquire's one command
    /// per node (no round trip more); releases and extends compare the token alone, so a lock
    /// rebuilt from its token ([`Lock::from_parts`](crate::Lock::from_parts)) in another
    /// process releases as before. Read locks ([`Shared`](crate::Shared)) do not record it
    /// (their readers are members of a sorted set). 1 to [`MAX_OWNER_LEN`](crate::MAX_OWNER_LEN)
    /// bytes, no control characters. Default none: the value is the token alone.
    pub owner: Option<String>,
    /// Longest TTL any lock of this client may have: every [`Client::extend`](crate::Client::extend) and kept lock is
    /// bounded by it, and [`Quarantine::Ttl`] makes it the restart-quarantine window. `None`:
    /// the TTL. Default `None`.
    pub max_ttl: Option<Duration>,
    /// Restart quarantine: a node that restarted less than a window ago (its `run_id` changed,
    /// or its uptime is shorter) does not count towards a quorum. Default [`Quarantine::Ttl`]:
    /// the window is the longest TTL this client can set ([`Config::max_ttl`]).
    pub quarantine: Quarantine,
    /// Fencing tokens: every acquisition also returns a fence ([`Lock::fence`](crate::Lock::fence)),
    /// a number greater than that of every acquisition that completed before it began, at the
    /// cost of one more round trip per acquisition. The resource the lock protects refuses
    /// anything with a fence lower than the highest it has seen, so a holder that paused past
    /// its validity cannot overwrite the next holder's work. Default off.
    pub fencing: bool,
    /// Release notices: a release publishes `redlock:released:<resource>` when a client waits
    /// for that lock (`lock`, `lock_until`, in any process: a waiter marks itself with the key
    /// `redlock:waiting:<resource>` before each attempt), which wakes it at once. The mark is
    /// deleted with the lock in the same `DEL`, so a release nobody waits for costs the servers
    /// one key lookup more than the plain check-and-delete, not a `PUBLISH`. Off, a release is
    /// the plain check-and-delete, and a waiter in another process (or on another handle)
    /// notices the release at its next fallback poll ([`Config::retry_delay`]) instead. Waiters
    /// on the same handle are still woken at once. Off, this handle's waiting writers mark
    /// themselves as readers do (a writer's mark would outlive their quiet releases and keep
    /// readers out of a free resource): they get no preference over readers. Default on.
    pub release_notices: bool,
    /// Sets that wait take their members one at a time, and have priority over this crate's
    /// waiting writers and readers of the member they wait for, during the first
    /// [`Config::set_precedence`] of those waits. Off (the default), a waiting
    /// [`ResourceSet`](crate::ResourceSet) tries all its members at once at every attempt, so
    /// it waits for a moment when every member is free together, which callers that keep one
    /// member busy (plain locks, readers that overlap) need never leave. On, refused at its
    /// first attempt, it takes its members in order of name, each step won on a quorum and
    /// kept (alive whatever the TTL) while it waits for the next, and marks the member it
    /// waits for (`redlock-mux set waiting`); this handle's waiting writers and readers of a
    /// member marked so step back during the first [`Config::set_precedence`] of their wait,
    /// then compete with the sets (a first attempt, `try_lock` and other clients' `SET NX` do
    /// not look: turn it on in every handle of the deployment). Ordered, no two sets wait for
    /// each other; a set that gives up releases what it holds. The cost: members held while a
    /// set waits for the others, and writers and readers held back. What it buys depends on
    /// the load: in the contention benchmark's mix of writers, plain locks, sets and readers a
    /// set's caller gets about seven times the sections; under the real-server soak's
    /// overload (every resource busy, ~30 callers waiting for each) sets gain little with the
    /// default precedence, and a precedence as long as the waits gives them a quarter to a
    /// third of their waits at the others' expense (docs/waiting.md has the figures). A limit: a set that believes it holds a member which a node lost (a
    /// restart without persistence, a partition longer than the TTL, a TTL shorter than the
    /// fallback poll between its attempts) may find it taken there and wait until its
    /// deadline. Not with [`Config::fair`], whose sets queue for their members instead.
    /// Default off.
    pub ordered_sets: bool,
    /// With [`Config::ordered_sets`], how long into its wait this handle's waiting writer or
    /// reader steps back for a waiting set's mark on its resource. Past it, a writer's attempt
    /// is the plain `SET NX` and a reader's may start a read lock of a free resource (but
    /// still not join readers who hold it while a set waits, nor pass a waiting writer), so
    /// that a steady stream of sets delays a writer or reader of a member by at most this much
    /// of its wait before it competes with them as with any caller; without the bound such a
    /// stream kept them out for as long as it lasted. Longer gives sets more of their members
    /// under contention, shorter keeps writers and readers closer to their turn; zero: no
    /// precedence for sets. Default 250 ms (a few critical sections; about the default pause
    /// between attempts); at most an hour.
    pub set_precedence: Duration,
    /// A fair lock: this handle's plain locks, sets and readers are granted first come,
    /// first served among the fair callers of a resource, in every process, over all the
    /// nodes. A waiter joins the resource's queue on each node (`redlock:queue:<resource>`,
    /// a sorted set: its entry is its wait's start on its own clock and its token's first
    /// bytes) and a node grants the lock only to the first live entry; every node orders
    /// the entries the same way, so the oldest waiter is first on every node it reached and
    /// wins at quorum — no two waiters can each be first on half of them. Entries live two
    /// fallback polls past the waiter's last attempt ([`Config::retry_delay`] and jitter,
    /// at least a second): a waiter that dies keeps its place that long, and one that gives
    /// up or is granted leaves at once. A wait's first attempt joins nothing: it takes the
    /// resource if it is free and nobody waits (the plain `SET NX`, in one script: an
    /// uncontended fair lock costs one script call per node instead of the command), and
    /// its next attempt, at once, joins. A set waits in the queue of every member and is
    /// granted, all members at once, when it is first in each and they are free: the
    /// members it waits for are kept from younger fair waiters and new readers meanwhile
    /// (it marks them as a waiting writer does), so a set gets them once the holders and
    /// older waiters it waits behind are done, however busy each one is (with
    /// [`Config::release_notices`] off it marks as a reader does, and overlapping readers
    /// can keep it waiting). A reader waits in the same queue and joins the readers once no
    /// writer's or set's entry is older than its own: the readers between two writers are
    /// granted together. Fairness is among fair callers: a plain handle's callers and other
    /// clients' `SET NX` do not queue (turn it on in every handle that locks the resource);
    /// `try_lock` joins no queue and is refused while anyone waits in it (a reader's, while a
    /// writer or set waits in it). Order follows the
    /// clients' clocks: a waiter whose clock runs behind by more than the others' waits
    /// goes first. Not with [`Config::fencing`], nor with [`Config::ordered_sets`] (the
    /// other way to give sets their members). Default off.
    pub fair: bool,
    /// Whether a server that may evict keys under memory pressure counts towards a quorum.
    /// Default [`EvictingServers::Refuse`]: such a server's yes does not count, as a restarted
    /// server's does not during its quarantine.
    pub evicting_servers: EvictingServers,
    /// The clock check: with `Some(tolerance)`, every acquire and extend reads each node's
    /// clock (`TIME`, in the same write as its command), and a node's yes counts only if its
    /// clock reads within `tolerance` of the clocks of a quorum of nodes read in the same
    /// round — a server whose clock runs fast or jumps (and so drops keys early) stops
    /// counting. Three times the tolerance is taken off every validity. For servers whose clocks
    /// NTP keeps within the tolerance of each other; see
    /// [`Builder::clock_check`]. Default `None` (off).
    pub clock_check: Option<Duration>,
}

/// What to do with a server that may evict lock keys: one with a `maxmemory` limit and a
/// `maxmemory-policy` other than `noeviction`, as its `INFO memory` says at each connection.
///
/// Every lock key has a TTL, so every `volatile-*` policy may evict it (`volatile-ttl` first of
/// all: the shortest TTL goes first), and every `allkeys-*` policy may too. A key evicted while
/// its lock is held lets another client take the lock there: on a majority of the servers, two
/// holders. An evicting server is as unsafe as one that restarted without its keys, and is
/// treated like one in its restart quarantine — but for good, since the configuration does not
/// pass. `maxmemory 0` (no limit) is safe whatever the policy; so is `noeviction` (a full
/// server refuses writes instead: a `SET` answered `-OOM` is a refusal, not a yes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictingServers {
    /// Its yes does not count towards a quorum ([`NodeFault::Evicting`](crate::NodeFault::Evicting)
    /// in the refusal report, `status` and the `evicting` event); nor does a server that does
    /// not say whether it evicts (`INFO` refused).
    #[default]
    Refuse,
    /// Count it as any other: a lock key evicted under memory pressure can give a second
    /// holder. For servers whose memory you watch yourself, knowing the risk.
    CountUnsafely,
}

/// `new(servers)` of a handle type (`Client`, `Redlock`, `AsyncRedlock`): one with default
/// settings, `Builder::new(servers)` then `$build`. The type's own docs come first.
macro_rules! default_handle {
    ($ty:ty, $build:ident, $(#[$doc:meta])*) => {
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// As [`Builder::build`](crate::Builder::build).
        pub fn new<I, S>(servers: I) -> Result<$ty, crate::Error>
        where
            I: IntoIterator<Item = S>,
            S: AsRef<str>,
        {
            crate::Builder::new(servers).$build()
        }
    };
}
pub(crate) use default_handle;

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

/// The per-node timeout with none configured: this share of the TTL (5 %, the reference's
/// "small compared to the TTL")…
const NODE_TIMEOUT_SHARE: u32 = 20;
/// A kept lock is renewed at most this many times per TTL ([`Config::check_renewals`]).
const RENEWALS_PER_TTL_MAX: u32 = 20;
/// …but at most this: a healthy node on a LAN answers in well under a millisecond, and a
/// timeout is paid in full by every attempt that needs the slow node's vote.
const MAX_DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Longest retry delay, jitter, connect, backoff or reply timeout accepted: longer ones are
/// mistakes (a unit slip), and would stall a caller for longer than any lock is useful.
const MAX_TIMEOUT_SETTING: Duration = Duration::from_secs(3600);
/// Shortest retry delay accepted: no retry without backoff. With none, a waiting caller that
/// no release notice wakes would send its `SET NX` to every node again at once after each
/// attempt, a storm on the servers for as long as the lock is held.
pub const MIN_RETRY_DELAY: Duration = Duration::from_millis(1);
/// Longest fixed quarantine window accepted: a month covers any TTL a client may set
/// ([`MAX_TTL`] is about 24.8 days); longer ones are unit slips.
const MAX_QUARANTINE: Duration = Duration::from_secs(86_400 * 30);

impl Default for Config {
    fn default() -> Config {
        // The Redlock reference's values where it has one (TTL, retries, drift); the others
        // are sized for a LAN, and each field's doc says what it bounds.
        Config {
            // Long enough for most critical sections, short enough that a crashed holder's
            // lock frees itself soon.
            ttl: Duration::from_secs(30),
            retry_count: 10,
            // The reference's retry delay and jitter: far above a round trip, so competing
            // clients spread out.
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(200),
            node_timeout: None,
            // The reference's drift factor: 1 % of the TTL (+ 2 ms).
            drift_factor: 0.01,
            min_validity: Duration::ZERO,
            // A runaway renewal loop stops within a day at the default TTL.
            max_extensions: 1000,
            // Renewed with a third of the TTL left: two more tries fit before it runs out.
            renew_fraction: 1.0 / 3.0,
            // Redis keys may be longer, but lock names are short; longer ones are mistakes.
            max_resource_len: 1024,
            // A TCP connect plus handshake on a LAN takes well under this; a dead host's
            // SYNs time out much later.
            connect_timeout: Duration::from_secs(1),
            // First reconnect soon (a restart), then back off to a retry every 2 s (a host
            // that is down).
            backoff_min: Duration::from_millis(25),
            backoff_max: Duration::from_secs(2),
            // Far above any healthy reply (a blocked server, a swapped-out host).
            reply_timeout: Duration::from_secs(5),
            // Far above a healthy pipeline's depth, low enough to bound a hung node's memory.
            max_pending: 1024,
            limits: Limits::CLIENT,
            client_name: None,
            owner: None,
            max_ttl: None,
            quarantine: Quarantine::Ttl,
            fencing: false,
            release_notices: true,
            ordered_sets: false,
            // A few critical sections: enough for a set to take a member at its next release.
            set_precedence: Duration::from_millis(250),
            fair: false,
            evicting_servers: EvictingServers::Refuse,
            clock_check: None,
        }
    }
}

impl Config {
    /// The per-node timeout for a given TTL: the configured one, or 5 % of the TTL capped at
    /// 50 ms.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / NODE_TIMEOUT_SHARE).min(MAX_DEFAULT_NODE_TIMEOUT))
    }

    /// What a round of `ttl` is given, for its drift allowance and validity
    /// ([`RoundConfig::drift`], [`RoundConfig::validity`]) where no round runs: the checks of
    /// the configuration and a dropped async extend's worst case (no node timeout: not for a
    /// round that is sent).
    pub(crate) fn ttl_round(&self, ttl: Duration) -> RoundConfig {
        self.round(ttl, Duration::ZERO)
    }

    /// The round of an acquire or extend of `ttl` waiting `node_timeout` for each node: the
    /// drift factor, the clock check's margin ([`Config::clock_margin`]), the minimum validity.
    pub(crate) fn round(&self, ttl: Duration, node_timeout: Duration) -> RoundConfig {
        RoundConfig {
            min_validity: self.min_validity,
            clock_margin: self.clock_margin(),
            ..RoundConfig::new(ttl, self.drift_factor, node_timeout)
        }
    }

    /// What the clock check takes off every validity: three times its tolerance (a key on a
    /// node whose clock agreed with a healthy one's within the tolerance when the key was set
    /// and when a rival found it gone expired at most that much early: `crate::model::clock`);
    /// zero without the check.
    pub fn clock_margin(&self) -> Duration {
        self.clock_check
            .map_or(Duration::ZERO, |x| x.saturating_mul(3))
    }

    /// How long [`Redlock::lock`](crate::Redlock::lock) waits for a resource:
    /// `retry_count × (retry_delay + retry_jitter)` (4 s by default), at least `retry_count`
    /// node timeouts (so a short retry delay still waits for a few attempts). Zero retries: one
    /// attempt, no wait. Saturates at `Duration::MAX` (settings a handle would refuse, in a
    /// `Config` made by hand, never panic here).
    pub fn lock_wait(&self) -> Duration {
        // Saturating: a hand-made Config is not checked until a handle is built from it.
        let per_try = (self.retry_delay.saturating_add(self.retry_jitter))
            .max(self.node_timeout_for(self.ttl));
        per_try.saturating_mul(self.retry_count)
    }

    /// The longest TTL a lock of this client may have: [`Config::max_ttl`], or the TTL.
    pub fn longest_ttl(&self) -> Duration {
        self.max_ttl.unwrap_or(self.ttl)
    }

    /// How long a node must have been up before a fenced acquire may seed its blank counter:
    /// the restart-quarantine window, or the longest TTL when the quarantine is off (a fence
    /// written to the node's previous process is then surely handed out or given up).
    pub(crate) fn seed_window(&self) -> Duration {
        self.quarantine_window()
            .unwrap_or(self.longest_ttl())
            .max(self.longest_ttl())
    }

    /// The restart-quarantine window in force, `None` when it is off.
    pub fn quarantine_window(&self) -> Option<Duration> {
        match self.quarantine {
            Quarantine::Off => None,
            Quarantine::Ttl => Some(self.longest_ttl()),
            Quarantine::Fixed(window) => Some(window),
        }
    }

    /// A resource (a name, or a set of names): each name as [`Config::check_name`] wants it.
    pub(crate) fn check_resource(&self, resource: &[u8]) -> Result<(), Error> {
        crate::model::keys::check_resource(resource, |r| self.check_name(r))
    }

    /// One resource name: not empty, not too long, not in the reserved namespace.
    pub(crate) fn check_name(&self, resource: &[u8]) -> Result<(), Error> {
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
        crate::model::keys::check_name(resource)
    }

    /// Whether kept locks can be renewed: the renew fraction and the drift factor together
    /// leave at least a twentieth of the TTL between a renewal and the next. With less —
    /// `renew_fraction` 0.99 with the default drift, 0.6 with a drift factor of 0.4 — each
    /// renewal falls due as soon as the one before it is decided: extends back to back, a
    /// round trip apart, until `max_extensions` ends the lock. (The fractions alone, not the
    /// TTL: a handle with a TTL of a few ms that never keeps a lock, the CLI's `status` probe
    /// among them, is not refused for it.)
    fn check_renewals(&self) -> Result<(), Error> {
        let left = 1.0 - self.renew_fraction - self.drift_factor;
        // With a hair of slack: 0.9 + 0.05 is 0.95 written, not in binary.
        if left < 1.0 / f64::from(RENEWALS_PER_TTL_MAX) - 1e-9 {
            return Err(Error::Config(format!(
                "renew fraction {} with drift factor {} leaves {:.3} of the ttl between a kept \
                 lock's renewals, under a {RENEWALS_PER_TTL_MAX}th: lower the renew fraction \
                 (or the drift factor)",
                self.renew_fraction, self.drift_factor, left
            )));
        }
        Ok(())
    }

    /// Whether a lock can be kept with this client's TTL: [`Config::check_renewals`] with the
    /// TTL's fixed 2 ms of drift allowance counted too (a TTL of a few ms leaves its renewal
    /// point behind its validity: renewed back to back). Checked by `keep`, not at build: a
    /// handle with such a TTL that never keeps a lock is fine.
    pub(crate) fn check_keep(&self) -> Result<(), Error> {
        let drift = self.ttl_round(self.ttl).drift();
        let renew_left = self.ttl.mul_f64(self.renew_fraction);
        let between = self.ttl.saturating_sub(drift).saturating_sub(renew_left);
        if between < self.ttl / RENEWALS_PER_TTL_MAX {
            return Err(Error::Config(format!(
                "a lock of ttl {} cannot be kept: after the drift allowance ({}) and the renewal \
                 margin ({}), {} is left between renewals, under a {RENEWALS_PER_TTL_MAX}th of \
                 the ttl; raise the ttl",
                Human(self.ttl),
                Human(drift),
                Human(renew_left),
                Human(between)
            )));
        }
        Ok(())
    }

    /// A TTL for extending or keeping a lock: valid, leaving more validity than
    /// [`Config::min_validity`] (else the extend could only lose), and not above
    /// [`Config::longest_ttl`] (a longer one would outlive the restart quarantine that
    /// protects it).
    pub(crate) fn check_extend_ttl(&self, ttl: Duration) -> Result<(), Error> {
        self.check_held_ttl("extend ttl", ttl)
    }

    /// A TTL given for one call (`what`: "extend ttl", "lock ttl"), checked as
    /// [`Config::check_extend_ttl`] says.
    pub(crate) fn check_held_ttl(&self, what: &str, ttl: Duration) -> Result<(), Error> {
        self.check_ttl(ttl)?;
        // The most validity an extend to `ttl` can give: it wins only with at least
        // `min_validity` left, so a shorter one would be sent, lose `TooSlow` with its quorum
        // of yeses, and cut the lock's validity to `ttl` less the drift.
        let rc = self.ttl_round(ttl);
        let (drift, most) = (rc.drift(), rc.validity().unwrap_or_default());
        if self.min_validity >= most {
            return Err(Error::Config(format!(
                "{what} {} can give at most {} of validity (the ttl less the drift \
                 allowance of {}), not above the minimum validity of {}: such a call \
                 could never succeed; raise the ttl (or lower min_validity)",
                Human(ttl),
                Human(most),
                Human(drift),
                Human(self.min_validity)
            )));
        }
        let longest = self.longest_ttl();
        if ttl > longest {
            return Err(Error::Config(format!(
                "{what} {} is longer than the longest ttl this client allows \
                 ({}, the max_ttl setting): the restart quarantine could end while \
                 the lock still lives; raise max_ttl (and the quarantine of every client of \
                 these servers) to at least {}",
                Human(ttl),
                Human(longest),
                Human(ttl)
            )));
        }
        Ok(())
    }

    fn check_ttl(&self, ttl: Duration) -> Result<(), Error> {
        if ttl.as_millis() == 0 || ttl > MAX_TTL {
            return Err(Error::Config(format!(
                "ttl {} must be from 1 ms to {} ms (about 24.8 days)",
                Human(ttl),
                MAX_TTL.as_millis()
            )));
        }
        let rc = self.ttl_round(ttl);
        let drift = rc.drift();
        // Counted from the whole milliseconds `PX` carries (`RoundConfig::validity`).
        if rc.validity().unwrap_or_default().is_zero() {
            return Err(Error::Config(format!(
                "ttl {} leaves no validity after the drift allowance of {} (the ttl counts in \
                 whole milliseconds, as PX takes it)",
                Human(ttl),
                Human(drift)
            )));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), Error> {
        self.check_rates()?;
        self.check_timeouts()?;
        self.check_limits()?;
        if self.fair && self.fencing {
            return Err(Error::Config(
                "a fair lock is not fenced: turn off one of fair and fencing".into(),
            ));
        }
        if self.fair && self.ordered_sets {
            return Err(Error::Config(
                "a fair handle's sets queue for their members: turn off one of fair and \
                 ordered_sets"
                    .into(),
            ));
        }
        self.check_windows()
    }

    /// The drift factor, the TTL, the renewal fraction and the renewals it allows.
    fn check_rates(&self) -> Result<(), Error> {
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
        self.check_renewals()?;
        Ok(())
    }

    /// The retry delay, every timeout and the backoff: within an hour, none zero.
    fn check_timeouts(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Config(what));
        if self.retry_delay < MIN_RETRY_DELAY {
            return bad(format!(
                "retry delay {} is below {}: a waiting caller would resend its lock attempt to \
                 every node in a tight loop; give at least {}",
                Human(self.retry_delay),
                Human(MIN_RETRY_DELAY),
                Human(MIN_RETRY_DELAY)
            ));
        }
        let hour = MAX_TIMEOUT_SETTING;
        for (name, value) in [
            ("retry delay", self.retry_delay),
            ("retry jitter", self.retry_jitter),
            ("connect timeout", self.connect_timeout),
            ("backoff", self.backoff_max),
            ("reply timeout", self.reply_timeout),
            ("minimum validity", self.min_validity),
            ("set precedence", self.set_precedence),
        ] {
            if value > hour {
                return bad(format!("{name} {} is longer than an hour", Human(value)));
            }
        }
        if let Some(t) = self.node_timeout
            && (t.is_zero() || t > hour)
        {
            return bad(format!(
                "node timeout {} must be above 0 and at most an hour",
                Human(t)
            ));
        }
        if self.connect_timeout.is_zero() || self.reply_timeout.is_zero() {
            return bad("connect and reply timeouts must be above 0".into());
        }
        if let Some(x) = self.clock_check
            && x < Duration::from_millis(1)
        {
            return bad(format!(
                "clock check tolerance {} is below 1 ms: no two servers' clocks read over a \
                 network agree that closely",
                Human(x)
            ));
        }
        if self.backoff_min.is_zero() {
            // Doubling from zero stays zero: a node refusing connections would be dialled
            // again at every request.
            return bad("backoff minimum is zero".into());
        }
        if self.backoff_min > self.backoff_max {
            return bad("backoff minimum is above its maximum".into());
        }
        Ok(())
    }

    /// The limits on requests and names, the minimum validity, the client's name.
    fn check_limits(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Config(what));
        if self.max_pending == 0 || self.max_resource_len == 0 {
            return bad("max_pending and max_resource_len must be at least 1".into());
        }
        let validity = self.ttl_round(self.ttl).validity().unwrap_or_default();
        if self.min_validity >= validity {
            // Every acquire and extend at the TTL would end `TooSlow`, and `lock` wait its
            // whole budget for nothing.
            return bad(format!(
                "minimum validity {} is not below the validity a lock of ttl {} can have ({}, \
                 the ttl less the drift allowance): no lock could ever be acquired",
                Human(self.min_validity),
                Human(self.ttl),
                Human(validity)
            ));
        }
        if let Some(owner) = &self.owner
            && (owner.is_empty()
                || owner.len() > crate::MAX_OWNER_LEN
                || owner.chars().any(char::is_control))
        {
            return bad(format!(
                "owner {owner:?} must be 1 to {} bytes without control characters",
                crate::MAX_OWNER_LEN
            ));
        }
        if let Some(name) = &self.client_name
            && !name.bytes().all(|b| (b'!'..=b'~').contains(&b))
        {
            // The server refuses such a name, and with it every handshake: no node would
            // ever connect.
            return bad(format!(
                "client name {name:?} must be printable ASCII without spaces (redis-server \
                 refuses others in CLIENT SETNAME)"
            ));
        }
        Ok(())
    }

    /// The longest TTL and the restart quarantine's window.
    fn check_windows(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Config(what));
        if let Some(max) = self.max_ttl {
            self.check_ttl(max)?;
            if max < self.ttl {
                return bad(format!(
                    "max_ttl {} is shorter than the ttl {}",
                    Human(max),
                    Human(self.ttl)
                ));
            }
        }
        if let Quarantine::Fixed(window) = self.quarantine {
            let longest = self.longest_ttl();
            if window < longest {
                return bad(format!(
                    "quarantine window {} is shorter than the longest ttl {} \
                     (ttl or max_ttl): a node that restarted without its keys could rejoin a \
                     quorum while a lock it forgot still lives; use Quarantine::Ttl, a window \
                     of at least {}, or Quarantine::Off for servers that never lose \
                     keys",
                    Human(window),
                    Human(longest),
                    Human(longest)
                ));
            }
            if window > MAX_QUARANTINE {
                return bad("quarantine longer than 30 days".into());
            }
        }
        Ok(())
    }
}

/// Builds a [`Redlock`](crate::Redlock) handle or a [`Client`](crate::Client) from server addresses and settings.
///
/// ```no_run
/// use std::time::Duration;
/// let redlock = redlock_mux::Builder::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
///     .ttl(Duration::from_secs(10))
///     .retry_count(3)
///     .build()?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Clone)]
pub struct Builder {
    servers: Vec<String>,
    config: Config,
    tls: TlsDefaults,
}

/// The servers' passwords masked ([`redact`]), as [`NodeAddr`]'s own `Debug` does: a builder
/// is what a service logs when its configuration is wrong.
impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let servers: Vec<String> = self.servers.iter().map(|s| redact(s)).collect();
        f.debug_struct("Builder")
            .field("servers", &servers)
            .field("config", &self.config)
            .field("tls", &self.tls)
            .finish()
    }
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
            tls: TlsDefaults::default(),
        }
    }

    /// A request unanswered for this long means its node hangs: the connection is reset and
    /// the node reconnected. Default 5 s; above 0, at most an hour.
    ///
    /// Sooner while callers need the node: once a round (an acquire, an extend, a renewal) is
    /// lost for want of the votes of nodes that stopped answering — whose yeses would have
    /// made its quorum — each of those connections is reset when its oldest request has gone
    /// unanswered for the connect timeout, if that is shorter, as a connect that hung would be.
    /// That is what finds a half-open connection (the server's side gone without a FIN or a
    /// RST: a NAT or a load balancer that dropped an idle flow) in time for a `lock` waiting
    /// its default 4 s, or for a kept lock's renewal. A node frozen in a minority is never
    /// needed for a quorum, and is left to this timeout.
    pub fn reply_timeout(mut self, t: Duration) -> Builder {
        self.config.reply_timeout = t;
        self
    }

    /// Replaces every setting at once (settings made before are lost; later calls change the
    /// new ones). Default [`Config::default()`], whose values each method here states.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::{Builder, Config};
    ///
    /// let mut config = Config::default();
    /// config.ttl = Duration::from_secs(10);
    /// let builder = Builder::new(["redis://127.0.0.1:7001"]).config(config);
    /// # let _ = builder;
    /// ```
    pub fn config(mut self, config: Config) -> Builder {
        self.config = config;
        self
    }
    /// Lock time to live (`PX`): how long the nodes keep a lock, and the start of its validity.
    /// Default 30 s; from 1 ms to [`MAX_TTL`], and above the drift allowance
    /// (`ttl × drift_factor + 2 ms`). `PX` takes whole milliseconds: a fraction of one is not
    /// sent, and not counted in the validity either (10.999 ms is a TTL of 10 ms).
    pub fn ttl(mut self, ttl: Duration) -> Builder {
        self.config.ttl = ttl;
        self
    }
    /// How many retry pauses [`Redlock::lock`](crate::Redlock::lock) waits at most (its budget
    /// is [`Config::lock_wait`]: 4 s with the defaults); 0: one attempt. Default 10.
    pub fn retry_count(mut self, n: u32) -> Builder {
        self.config.retry_count = n;
        self
    }
    /// Wait between attempts of a waiting caller that no release notice wakes, and the most
    /// random time added to it. Default 200 ms and 200 ms; each at most an hour, and the delay
    /// at least [`MIN_RETRY_DELAY`] (1 ms): a zero delay would resend the attempt to every
    /// node in a tight loop, and is refused with [`Error::Config`] when the handle is built.
    pub fn retry_delay(mut self, delay: Duration, jitter: Duration) -> Builder {
        self.config.retry_delay = delay;
        self.config.retry_jitter = jitter;
        self
    }
    /// How long each attempt waits for each node. Default: 5 % of the TTL, at most 50 ms
    /// ([`Config::node_timeout_for`]); above 0, at most an hour.
    pub fn node_timeout(mut self, timeout: Duration) -> Builder {
        self.config.node_timeout = Some(timeout);
        self
    }
    /// Clock drift factor: `ttl × factor + 2 ms` is taken off each lock's validity. Default
    /// 0.01; at least 0 and below 1.
    pub fn drift_factor(mut self, factor: f64) -> Builder {
        self.config.drift_factor = factor;
        self
    }
    /// Least validity a successful acquisition (or extend) must leave; an attempt that leaves
    /// less counts as not acquired ([`Error::TooSlow`]). Default 0; at most an hour, and below
    /// the TTL less its drift allowance (else no lock could be acquired). An extend whose TTL
    /// less its drift allowance is not above it could never succeed: it is refused with
    /// [`Error::Config`] before anything is sent, and the lock keeps its validity.
    pub fn min_validity(mut self, v: Duration) -> Builder {
        self.config.min_validity = v;
        self
    }
    /// Most extensions per lock, by [`Redlock::extend`](crate::Redlock::extend) or a kept lock's
    /// renewal; past it an extend fails with [`Error::ExtensionLimit`] and a kept lock is
    /// reported lost. Default 1000.
    pub fn max_extensions(mut self, n: u32) -> Builder {
        self.config.max_extensions = n;
        self
    }
    /// Kept locks ([`Redlock::keep`](crate::Redlock::keep)) are extended when this fraction of
    /// the TTL is left. Default 1/3; above 0 and below 1, and leaving at least a twentieth of
    /// the TTL between one renewal and the next (`fraction + drift_factor ≤ 0.95`), or a kept
    /// lock would be renewed back to back.
    pub fn renew_fraction(mut self, fraction: f64) -> Builder {
        self.config.renew_fraction = fraction;
        self
    }
    /// TCP connect plus handshake timeout. Default 1 s; above 0, at most an hour. Counted while
    /// something polls the connection: a deadline that passed while nothing did (an operation
    /// returned at its quorum, leaving a slower node's connect or TLS handshake half done, and the
    /// next came later), on a socket that answered meanwhile, is moved once by this much.
    pub fn connect_timeout(mut self, t: Duration) -> Builder {
        self.config.connect_timeout = t;
        self
    }
    /// Reconnect backoff after a node failed: the first wait and the longest. Default 25 ms and
    /// 2 s; `min` at most `max`, `max` at most an hour.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Builder {
        self.config.backoff_min = min;
        self.config.backoff_max = max;
        self
    }
    /// Who holds this handle's locks, stored with each lock on every node ([`Config::owner`]):
    /// e.g. `"billing-7:4242:nightly-import"`. Default none.
    pub fn owner(mut self, owner: impl Into<String>) -> Builder {
        self.config.owner = Some(owner.into());
        self
    }
    /// A name sent with `CLIENT SETNAME` in the handshake (shown by `CLIENT LIST`). Default
    /// none; printable ASCII without spaces, as redis-server requires (it refuses the whole
    /// handshake otherwise).
    pub fn client_name(mut self, name: impl Into<String>) -> Builder {
        self.config.client_name = Some(name.into());
        self
    }
    /// Longest TTL a lock may be extended (or kept) to. Default: the TTL; at least the TTL,
    /// at most [`MAX_TTL`]. With the default [`Quarantine::Ttl`] it is also the
    /// restart-quarantine window.
    pub fn max_ttl(mut self, ttl: Duration) -> Builder {
        self.config.max_ttl = Some(ttl);
        self
    }
    /// Restart quarantine: a node that restarted (and may have lost its keys) less than a
    /// window ago does not count towards a quorum, so that it cannot grant a lock that is still
    /// held. Takes a [`Quarantine`], or `None` (off), `Some(window)` or a `Duration` (a fixed
    /// window, at least the longest TTL, at most 30 days). Default [`Quarantine::Ttl`]: the
    /// window is [`Config::longest_ttl`].
    ///
    /// Servers started less than a window ago are quarantined too: on them every lock is
    /// refused ([`Error::NoQuorum`]) until the window has passed. Switch it off for fresh
    /// servers that never held a lock (tests, demos), or for servers that never lose keys
    /// (`appendfsync always`); keep the default in production.
    ///
    /// ```no_run
    /// let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .quarantine(None) // servers just started, never held a lock
    ///     .build()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn quarantine(mut self, quarantine: impl Into<Quarantine>) -> Builder {
        self.config.quarantine = quarantine.into();
        self
    }

    /// Fencing tokens on or off: with them every acquisition also returns a fence
    /// ([`Lock::fence`](crate::Lock::fence)), at the cost of one more round trip per
    /// acquisition; see [`Config::fencing`]. Default off.
    pub fn fencing(mut self, on: bool) -> Builder {
        self.config.fencing = on;
        self
    }

    /// The clock check ([`Config::clock_check`]), with the tolerance `tolerance` (at least
    /// 1 ms). Every acquire and extend then sends `TIME` to each node just before its own
    /// command, in the same write; a node's yes counts only if the clock it read is within
    /// the tolerance of the clocks of a quorum of nodes read in the same round, round trips
    /// counted against it. A server whose clock runs fast or jumps forward drops keys early,
    /// and the lock with them; with the check, such a node stops counting as soon as it
    /// disagrees, so a minority of clocks that run fast or jump forward cannot give two holders (a
    /// forward jump stepped back within a TTL can: docs/guarantees.md). Three times the
    /// tolerance is taken off every validity ([`Config::clock_margin`]).
    ///
    /// For servers whose wall clocks are kept within the tolerance of each other (NTP on a
    /// LAN keeps them within a few milliseconds): 20 ms is a good start for a TTL of a second
    /// or more. A node whose clock disagrees fails with
    /// [`NodeFault::Clock`](crate::NodeFault::Clock). Costs a 14-byte command and its reply per
    /// node per acquire and extend; off by default. See docs/guarantees.md, "Server clocks".
    pub fn clock_check(mut self, tolerance: Duration) -> Builder {
        self.config.clock_check = Some(tolerance);
        self
    }

    /// Whether a server that may evict keys under memory pressure counts; see
    /// [`EvictingServers`]. Default [`EvictingServers::Refuse`].
    ///
    /// ```no_run
    /// use redlock_mux::{Builder, EvictingServers};
    ///
    /// // Servers configured `maxmemory-policy allkeys-lru`, whose memory is watched elsewhere:
    /// // an evicted lock key can give a second holder.
    /// let redlock = Builder::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    ///     .evicting_servers(EvictingServers::CountUnsafely)
    ///     .build()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn evicting_servers(mut self, evicting: EvictingServers) -> Builder {
        self.config.evicting_servers = evicting;
        self
    }

    /// Ordered sets on or off; see [`Config::ordered_sets`]. Default off.
    ///
    /// ```no_run
    /// use redlock_mux::{Builder, ResourceSet};
    ///
    /// // Transfers (sets of two accounts) beside single-account locks, every handle the same:
    /// // a transfer waiting for an account has it before the next single-account waiter.
    /// let redlock = Builder::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    ///     .ordered_sets(true)
    ///     .build()?;
    /// let lock = redlock.lock(ResourceSet::new(["account:alice", "account:bob"])?)?;
    /// redlock.unlock(lock)?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn ordered_sets(mut self, on: bool) -> Builder {
        self.config.ordered_sets = on;
        self
    }

    /// How long into its wait a waiting writer or reader steps back for a waiting set's mark;
    /// see [`Config::set_precedence`]. Default 250 ms; at most an hour.
    pub fn set_precedence(mut self, d: Duration) -> Builder {
        self.config.set_precedence = d;
        self
    }

    /// Fair locks on or off; see [`Config::fair`]. Default off.
    ///
    /// ```no_run
    /// use redlock_mux::Builder;
    ///
    /// // Every process that locks "report" with a handle built so: first come, first served.
    /// let redlock = Builder::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    ///     .fair(true)
    ///     .build()?;
    /// let lock = redlock.lock("report")?;
    /// redlock.unlock(lock)?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn fair(mut self, on: bool) -> Builder {
        self.config.fair = on;
        self
    }

    /// Release notices on or off; see [`Config::release_notices`]. Off spares the servers the
    /// waiting mark's lookup in every release, and waiters in other processes poll instead.
    /// Default on.
    pub fn release_notices(mut self, on: bool) -> Builder {
        self.config.release_notices = on;
        self
    }

    /// Trust the CA certificates of this PEM file, instead of the system's, for every
    /// `rediss://` server that does not give its own `tls_ca`. Read when the client is built.
    /// Default: the system's trusted roots.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.tls.params.ca_file = Some(path.into());
        self
    }

    /// Present this client certificate (PEM chain, and its PEM private key) to `rediss://`
    /// servers that ask for one (mutual TLS: `tls-auth-clients yes`), unless the address gives
    /// its own `tls_cert`/`tls_key`. Read when the client is built. Default: none.
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Builder {
        self.tls.params.cert_file = Some(cert.into());
        self.tls.params.key_file = Some(key.into());
        self
    }

    /// The name every `rediss://` server's certificate must carry, for servers reached by an
    /// address their certificate does not name (an IP address, a tunnel), unless the address
    /// gives its own `tls_server_name`. Default: each address's host.
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Builder {
        self.tls.params.server_name = Some(name.into());
        self
    }

    /// A complete rustls configuration for the `rediss://` servers whose addresses give no TLS
    /// option of their own (its roots, client certificate, protocol versions, session cache);
    /// [`tls_ca_file`](Builder::tls_ca_file) and [`tls_client_cert`](Builder::tls_client_cert)
    /// then do not apply to them. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_config(mut self, config: Arc<rustls::ClientConfig>) -> Builder {
        self.tls.config = Some(config);
        self
    }

    pub(crate) fn shared(self) -> Result<Arc<Shared>, Error> {
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
        let nodes = self.nodes()?;
        if self.tls.is_set() && nodes.iter().all(|n| n.tls.is_none()) {
            // Most likely redis:// where rediss:// was meant: the lock would go out in clear.
            return Err(Error::Config(
                "TLS options given, but no server address is rediss:// (TLS): write \
                 rediss://host:port"
                    .into(),
            ));
        }
        let tls = tls::connectors(&nodes, &self.tls)?;
        let conn = ConnConfig::new(&self.config, nodes.len(), tls.into());
        Ok(Arc::new(Shared {
            nodes: nodes.into(),
            config: self.config,
            conn,
            keep_ticks: AtomicU64::new(0),
            keep_writes: AtomicU64::new(0),
            keep_extended: AtomicU64::new(0),
            keep_retried: AtomicU64::new(0),
            mutation: Mutation::None,
        }))
    }

    /// The server list parsed, each server once: another database or user on the same
    /// endpoint is the same master, which would count twice towards every quorum.
    fn nodes(&self) -> Result<Vec<NodeAddr>, Error> {
        let mut nodes: Vec<NodeAddr> = Vec::with_capacity(self.servers.len());
        let mut keys: Vec<ServerKey> = Vec::with_capacity(self.servers.len());
        for s in &self.servers {
            let addr = NodeAddr::parse(s).map_err(|e| Error::Config(e.quoting(s).to_string()))?;
            let key = addr.endpoint.server_key();
            // Only the endpoint counts: another database or user on it is the same master,
            // which would count twice towards every quorum.
            if let Some(first) = keys.iter().position(|k| *k == key) {
                return Err(Error::Config(format!(
                    "duplicate server: {} and {} are the same server (listed twice, it would \
                     count twice towards a quorum)",
                    redact(&self.servers[first]),
                    redact(s)
                )));
            }
            keys.push(key);
            nodes.push(addr);
        }
        Ok(nodes)
    }
}

/// How connections behave; shared by all connections of a client.
#[derive(Debug, Clone)]
pub(crate) struct ConnConfig {
    /// The client's settings; a connection reads `connect_timeout`, `backoff_min`,
    /// `backoff_max`, `reply_timeout`, `max_pending`, `limits` (`max_frame_len` also bounds the
    /// input buffer) and `client_name` (`CLIENT SETNAME` in the handshake).
    pub settings: Config,
    /// Whether the handshake asks `INFO server` (and `INFO memory`), and whether it must be
    /// answered.
    pub info: InfoNeed,
    /// Whether the handshake asks `INFO memory` (the eviction policy), as it asks `INFO
    /// server` (`info`): when servers that may evict are refused.
    pub memory: bool,
    /// Each node's TLS connector, by node index (`None`, or no entry: plain TCP).
    pub tls: Arc<[Option<tls::Connector>]>,
    /// A defect brought back for the simulator (see `mutation.rs`; never set otherwise).
    pub mutation: Mutation,
}

impl ConnConfig {
    /// How the connections of `nodes` nodes behave with settings `c`.
    fn new(c: &Config, nodes: usize, tls: Arc<[Option<tls::Connector>]>) -> ConnConfig {
        ConnConfig {
            settings: c.clone(),
            // The quarantine and fencing need every node's run_id; with two nodes or more the
            // duplicate check wants it (one server listed twice, under names the builder
            // cannot tell apart, would count twice).
            info: if c.quarantine_window().is_some() || c.fencing {
                InfoNeed::Needed
            } else if nodes > 1 || c.evicting_servers == EvictingServers::Refuse {
                InfoNeed::Wanted
            } else {
                InfoNeed::Off
            },
            memory: c.evicting_servers == EvictingServers::Refuse,
            tls,
            mutation: Mutation::None,
        }
    }
}

/// Whether the handshake asks `INFO server` (the node's `run_id` and uptime), and what a
/// refusal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InfoNeed {
    /// Not asked: one node, and neither the restart quarantine nor fencing.
    Off,
    /// Asked for the duplicate check only (one server listed twice), in front of the requests,
    /// which do not wait for its answer: an error answer (an ACL user without `+info`) leaves
    /// the node's process unknown, and the node unchecked.
    Wanted,
    /// Asked and needed (the restart quarantine, fencing): requests wait for its answer, and
    /// an error answer fails the handshake.
    Needed,
}

pub(crate) struct Shared {
    pub(crate) nodes: Arc<[NodeAddr]>,
    pub(crate) config: Config,
    pub(crate) conn: ConnConfig,
    /// Keep-alive counters: ticks that extended kept locks, the writes of those ticks, locks
    /// extended (the handle's `Stats::keep`).
    pub(crate) keep_ticks: AtomicU64,
    pub(crate) keep_writes: AtomicU64,
    pub(crate) keep_extended: AtomicU64,
    pub(crate) keep_retried: AtomicU64,
    /// A defect brought back for the simulator (see `mutation.rs`; never set otherwise).
    pub(crate) mutation: Mutation,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let cases = [
            (Duration::ZERO, "0 ms"),
            (Duration::from_nanos(500), "500 ns"),
            (Duration::from_micros(250), "250 µs"),
            (Duration::from_micros(1_500), "1.5 ms"),
            (Duration::from_millis(250), "250 ms"),
            (Duration::from_millis(1_500), "1.5 s"),
            (Duration::from_secs(10), "10 s"),
            (Duration::from_secs(125), "2 min 5 s"),
            (Duration::from_secs(3_600), "1 h"),
            (Duration::from_secs(12_000), "3 h 20 min"),
            (Duration::from_secs(90_000), "1 day 1 h"),
            (MAX_TTL, "24 days 20 h"),
        ];
        for (d, want) in cases {
            assert_eq!(Human(d).to_string(), want, "{d:?}");
        }
    }

    /// `Config`'s fields are public and checked only when a handle is built: `lock_wait` on
    /// one made by hand added the delay and the jitter unchecked and panicked on overflow.
    #[test]
    fn lock_wait_saturates_instead_of_panicking() {
        let mut c = Config::default();
        assert_eq!(c.lock_wait(), Duration::from_secs(4));
        c.retry_delay = Duration::MAX;
        c.retry_jitter = Duration::from_millis(1);
        assert_eq!(c.lock_wait(), Duration::MAX);
        c.retry_count = 0;
        assert_eq!(c.lock_wait(), Duration::ZERO);
        c.retry_count = 1;
        c.retry_delay = Duration::from_millis(1);
        c.retry_jitter = Duration::MAX;
        assert_eq!(c.lock_wait(), Duration::MAX);
    }

    #[test]
    fn a_bad_ttl_is_reported_in_human_units() {
        let e = Builder::new(["redis://127.0.0.1:1"])
            .ttl(Duration::ZERO)
            .build()
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("ttl 0 ms must be from 1 ms to 2147483647 ms"),
            "{text}"
        );
    }

    #[test]
    fn settings_under_which_nothing_could_work_are_refused_at_build() {
        let b = || Builder::new(["redis://127.0.0.1:1"]);
        // Every acquire would end TooSlow: validity at most 30 s - 302 ms.
        let e = b()
            .min_validity(Duration::from_secs(30))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("minimum validity 30 s"), "{e}");
        assert!(b().min_validity(Duration::from_secs(29)).build().is_ok());
        // 2.5 ms is 2 ms on the wire (PX takes whole ms), no more than the 2 ms drift floor:
        // every acquire would end TooSlow.
        let e = b()
            .drift_factor(0.0)
            .ttl(Duration::from_micros(2_500))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("leaves no validity"), "{e}");
        assert!(
            b().drift_factor(0.0)
                .ttl(Duration::from_millis(3))
                .build()
                .is_ok()
        );
        // redis-server refuses these in CLIENT SETNAME, and so every handshake.
        for name in ["billing worker", "a\nb", "caf\u{e9}"] {
            let e = b().client_name(name).build().unwrap_err();
            assert!(e.to_string().contains("client name"), "{name:?}: {e}");
        }
        assert!(b().client_name("billing-worker:7").build().is_ok());
        // An empty name clears it: the server takes that.
        assert!(b().client_name("").build().is_ok());
    }

    /// No retry without backoff: a zero delay made a waiting acquire that no notice wakes send
    /// `SET NX` to every node again as soon as each attempt was decided.
    #[test]
    fn a_retry_delay_below_a_millisecond_is_refused() {
        let b = || Builder::new(["redis://127.0.0.1:1"]);
        for (delay, jitter) in [
            (Duration::ZERO, Duration::ZERO),
            (Duration::ZERO, Duration::from_millis(200)),
            (Duration::from_micros(999), Duration::ZERO),
        ] {
            let e = b().retry_delay(delay, jitter).build().unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            let text = e.to_string();
            assert!(
                text.contains("retry delay") && text.contains("at least 1 ms"),
                "{text}"
            );
            // A hand-made Config is checked alike, by every face.
            let config = Config {
                retry_delay: delay,
                ..Config::default()
            };
            assert!(b().config(config.clone()).build_client().is_err());
            assert!(b().config(config).build_async().is_err());
        }
        assert!(
            b().retry_delay(MIN_RETRY_DELAY, Duration::ZERO)
                .build()
                .is_ok()
        );
    }

    #[test]
    fn a_renewal_schedule_that_would_renew_back_to_back_is_refused() {
        let b = || Builder::new(["redis://127.0.0.1:1"]);
        // Due at once after each renewal: 1 - 0.99 - 0.01 = 0.
        let e = b().renew_fraction(0.99).build().unwrap_err();
        assert!(
            e.to_string().contains("between a kept lock's renewals"),
            "{e}"
        );
        assert!(b().drift_factor(0.4).renew_fraction(0.6).build().is_err());
        // Room enough: 1 - 0.9 - 0.01 = 0.09; a TTL of a few ms is not refused for it.
        assert!(b().renew_fraction(0.9).build().is_ok());
        assert!(b().renew_fraction(0.9).drift_factor(0.05).build().is_ok());
        assert!(b().ttl(Duration::from_millis(50)).build().is_ok());
        // A TTL of a few ms builds (a handle that never keeps a lock), and cannot keep one.
        let tiny = b().ttl(Duration::from_millis(3));
        assert!(tiny.clone().build().is_ok());
        let e = tiny.config.check_keep().unwrap_err();
        assert!(e.to_string().contains("cannot be kept"), "{e}");
        assert!(b().config.check_keep().is_ok());
    }

    #[test]
    fn a_builder_never_prints_a_password() {
        let b = Builder::new(["redis://u:topsecret@h:1", "redis://:pa/ss@h:2"]);
        let text = format!("{b:?}");
        assert!(
            !text.contains("topsecret") && !text.contains("pa/ss"),
            "{text}"
        );
        assert!(text.contains("redis://u:***@h:1"), "{text}");
    }
}
