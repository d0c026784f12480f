//! What the subcommands share: exit codes, the one-line failure, the option groups (servers,
//! waiting, output), acquiring with the user's waiting rules, and message formatting.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
// A flag's variable takes 1/0, yes/no, true/false, on/off.
use clap::builder::BoolishValueParser;
use redlock_mux::addr::redact;
use redlock_mux::{
    Builder, Error, Lock, LockVote, NodeFault, NodeStatus, NodeVote, Redlock, Report, Resource,
};
use serde_json::{Value, json};

/// The exit codes: stable, documented in `--help`, the README and `docs/cli.md`. They follow
/// `sysexits.h` where it has a meaning for the case.
pub mod exit {
    /// Success (for `run`: COMMAND's own exit code).
    pub const OK: u8 = 0;
    /// `status`: the lock is not held by a quorum (free, or split between tokens).
    pub const NOT_HELD: u8 = 1;
    /// Usage error: bad flag, bad address, bad duration, no servers.
    pub const USAGE: u8 = 64;
    /// No quorum of servers reachable (or they answered too slowly to leave any validity).
    pub const UNAVAILABLE: u8 = 69;
    /// Protocol or internal error.
    pub const INTERNAL: u8 = 70;
    /// `man --dir`: the pages could not be written (`EX_CANTCREAT`).
    pub const CANNOT_WRITE: u8 = 73;
    /// Not acquired: the lock is held elsewhere (after the wait); `-E` changes it.
    pub const HELD: u8 = 75;
    /// A server refused our credentials.
    pub const AUTH: u8 = 77;
    /// The servers do not match the configuration: a database they do not have, or one server
    /// listed twice under two names.
    pub const CONFIG: u8 = 78;
    /// The lock was lost while `run` ran COMMAND (`release` / `extend`: no longer held).
    pub const LOST: u8 = 79;
    /// Not acquired: the servers restarted moments ago and are in their restart quarantine.
    pub const QUARANTINED: u8 = 80;
    /// `run`: COMMAND was found but could not be started.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `run`: COMMAND was not found.
    pub const NOT_FOUND: u8 = 127;
    /// Interrupted by SIGINT (128 + 2), for `demo` and `bench`.
    pub const INTERRUPTED: u8 = 130;
}

/// What kind of failure, for the decisions that depend on it (`--quiet`, whether waiting can
/// help) and for `--json`'s `error` field. The exit code does not tell it: `-E` changes the one
/// for a lock held elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Usage,
    Config,
    Held,
    NoQuorum,
    Quarantined,
    Auth,
    Lost,
    Internal,
}

impl Kind {
    /// The name in `--json` (documented in docs/cli.md).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Usage => "usage",
            Kind::Config => "config",
            Kind::Held => "held",
            Kind::NoQuorum => "no_quorum",
            Kind::Quarantined => "quarantined",
            Kind::Auth => "auth",
            Kind::Lost => "lost",
            Kind::Internal => "internal",
        }
    }
}

/// A failure: the exit code and the one-line message (printed as `redlock: MESSAGE`).
#[derive(Debug)]
pub struct Fail {
    /// The exit code.
    pub code: u8,
    /// What happened, on one line.
    pub message: String,
    /// What kind of failure (named in `--json`).
    pub kind: Kind,
    /// The node-by-node report, when the library gave one.
    pub report: Option<Box<Report>>,
}

impl Fail {
    /// A failure with its code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Fail {
        let kind = match code {
            exit::USAGE => Kind::Usage,
            exit::CONFIG => Kind::Config,
            exit::UNAVAILABLE => Kind::NoQuorum,
            exit::AUTH => Kind::Auth,
            exit::LOST => Kind::Lost,
            _ => Kind::Internal,
        };
        Fail {
            code,
            message: message.into(),
            kind,
            report: None,
        }
    }

    /// A library error, with what was being done.
    pub fn lib(context: &str, e: &Error) -> Fail {
        let (code, kind) = classify(e);
        Fail {
            code,
            message: format!("{context}: {e}"),
            kind,
            report: e.report().cloned().map(Box::new),
        }
    }

    /// "Held elsewhere": the failure `--quiet` does not print (the exit code says it).
    pub fn is_held(&self) -> bool {
        self.kind == Kind::Held
    }

    /// The failure as one JSON object, for `--json`.
    pub fn to_json(&self, command: &str, resource: Option<&str>) -> Value {
        json!({
            "ok": false,
            "command": command,
            "resource": resource,
            "exit_code": self.code,
            "error": self.kind.name(),
            "message": self.message,
            "nodes": self.report.as_deref().map(votes_json),
        })
    }
}

/// The exit code for a library error.
pub fn code_of(e: &Error) -> u8 {
    classify(e).0
}

/// The exit code and the `--json` kind of a library error.
fn classify(e: &Error) -> (u8, Kind) {
    let config = e
        .report()
        .is_some_and(|r| r.failed().any(|(_, f)| is_config_fault(f)));
    match e {
        Error::Config(_)
        | Error::ReservedName { .. }
        | Error::AlreadyHeld { .. }
        | Error::PermitCount { .. } => (exit::USAGE, Kind::Usage),
        _ if config => (exit::CONFIG, Kind::Config),
        Error::Held(_) => (exit::HELD, Kind::Held),
        Error::NoQuorum(_) | Error::TooSlow(_) | Error::Fence(_) => {
            (exit::UNAVAILABLE, Kind::NoQuorum)
        }
        Error::Auth { .. } | Error::Permission { .. } => (exit::AUTH, Kind::Auth),
        Error::Expired { .. } | Error::ExtensionLimit(_) | Error::Lost(_) => {
            (exit::LOST, Kind::Lost)
        }
        _ => (exit::INTERNAL, Kind::Internal),
    }
}

/// A node fault that no retry mends: the servers do not match the configuration (a database
/// they do not have, one server listed twice under two names, a certificate the TLS options
/// do not accept, a server that may evict keys).
pub fn is_config_fault(f: &NodeFault) -> bool {
    matches!(
        f.root(),
        NodeFault::Database { .. }
            | NodeFault::Duplicate { .. }
            | NodeFault::Tls(_)
            | NodeFault::Evicting(_)
    )
}

/// The TTL given to the handles of `release` and `status`, which set none: it only bounds the
/// configuration checks.
pub const HANDLE_TTL: Duration = Duration::from_secs(30);

/// Fails with 69 (or 77 if credentials were refused) when fewer than a quorum of nodes answered.
pub fn check_reachable(statuses: &[NodeStatus], context: &str) -> Result<(), Fail> {
    let quorum = statuses.len() / 2 + 1;
    let up = statuses.iter().filter(|s| s.state.is_ok()).count();
    if up >= quorum {
        return Ok(());
    }
    let mut why = String::new();
    let mut auth = false;
    for s in statuses {
        if let Err(f) = &s.state {
            auth |= matches!(f.root(), NodeFault::Auth(_));
            why.push_str(&format!("; {}: {f}", s.node));
        }
    }
    let code = if auth { exit::AUTH } else { exit::UNAVAILABLE };
    Err(Fail::new(
        code,
        format!(
            "{context}: only {up} of {} nodes reachable, {quorum} needed{why}",
            statuses.len()
        ),
    ))
}

/// On stderr: the lock was taken while nodes were unreachable (see [`unreachable_warning`]).
pub fn warn_unreachable(lock: &Lock) {
    if let Some(warning) = unreachable_warning(lock) {
        say!("redlock: warning: {warning}");
    }
}

/// Every node of a report with its vote, for `--json`.
pub fn votes_json(report: &Report) -> Value {
    report
        .votes()
        .map(|(node, vote)| {
            let (vote, fault) = match vote {
                NodeVote::Yes => ("yes", None),
                NodeVote::Refused => ("refused", None),
                NodeVote::Failed(f) => ("failed", Some(f.to_string())),
                _ => ("not_waited_for", None),
            };
            json!({"node": node.to_string(), "vote": vote, "fault": fault})
        })
        .collect()
}

/// Every node of a lock just acquired with its vote, for `--json`: the same objects as
/// [`votes_json`] (`fault` is null), `vote` one of `yes`, `refused`, `unreachable`, `failed`,
/// `not_waited_for`.
pub fn lock_votes_json(lock: &Lock) -> Value {
    lock.nodes()
        .map(|(node, vote)| {
            let vote = match vote {
                LockVote::Yes => "yes",
                LockVote::Refused => "refused",
                LockVote::Unreachable => "unreachable",
                LockVote::Failed => "failed",
                _ => "not_waited_for",
            };
            json!({"node": node.to_string(), "vote": vote, "fault": Value::Null})
        })
        .collect()
}

/// The warning for a lock taken while some nodes were unreachable (down, backing off, timed
/// out); `None` when every node was reachable, including those not waited for because the
/// quorum came first.
pub fn unreachable_warning(lock: &Lock) -> Option<String> {
    let votes = lock.votes();
    if votes.unreachable() == 0 {
        return None;
    }
    let names: Vec<String> = lock.unreachable().map(|n| n.to_string()).collect();
    Some(format!(
        "acquired with {} of {} nodes unreachable ({}): one more node failure may cost the \
         quorum",
        votes.unreachable(),
        votes.nodes(),
        names.join(", ")
    ))
}

/// Prints one JSON object on stdout (write errors ignored, as with `out!`).
pub fn print_json(value: &Value) {
    out!("{value}");
}

/// The servers to use: `-s` / `--server`, or `$REDLOCK_SERVERS`.
#[derive(Args, Debug, Clone)]
pub struct Servers {
    /// A Redis master; repeat the option for each (default: $REDLOCK_SERVERS, comma separated)
    #[arg(long = "server", short = 's', value_name = "URL")]
    pub servers: Vec<String>,
    /// rediss:// servers: trust the CA certificates of this PEM file instead of the system's
    #[arg(long, value_name = "FILE", env = "REDLOCK_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// rediss:// servers that ask for a client certificate (mutual TLS): this PEM chain
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        env = "REDLOCK_TLS_CERT"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_cert",
        env = "REDLOCK_TLS_KEY"
    )]
    pub tls_key: Option<PathBuf>,
    /// rediss:// servers: the name their certificates carry, when the URL's host is not it
    #[arg(long, value_name = "NAME", env = "REDLOCK_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

impl Servers {
    /// A builder for the servers given ([`list`](Servers::list)) with the TLS options, this TTL
    /// and the [`Tuning`] options: where `run`, `acquire` and `extend` start.
    pub fn tuned(&self, tuning: &Tuning, ttl: Duration) -> Result<Builder, Fail> {
        Ok(tuning.builder(self.builder(&self.list()?), ttl))
    }

    /// A builder for these URLs with the TLS options.
    pub fn builder(&self, urls: &[String]) -> Builder {
        let mut b = Builder::new(urls);
        if let Some(ca) = &self.tls_ca {
            b = b.tls_ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            b = b.tls_client_cert(cert, key);
        }
        if let Some(name) = &self.tls_server_name {
            b = b.tls_server_name(name);
        }
        b
    }

    /// The server URLs: `--server`, else `$REDLOCK_SERVERS`; a list written the wrong way
    /// (`-s a,b`, space-separated) is recognised and the right way shown.
    pub fn list(&self) -> Result<Vec<String>, Fail> {
        if !self.servers.is_empty() {
            for s in &self.servers {
                let parts = split_urls(s, |c| c == ',' || c.is_whitespace());
                if parts.len() > 1 {
                    return Err(Fail::new(
                        exit::USAGE,
                        format!(
                            "--server takes one URL, and {} holds {}: write {}",
                            shorten(&redact(s), URL_SHOWN),
                            parts.len(),
                            each_on_its_own(&parts, "--server ", " ")
                        ),
                    ));
                }
            }
            return Ok(self.servers.clone());
        }
        let env = std::env::var("REDLOCK_SERVERS").unwrap_or_default();
        let spaced = split_urls(&env, char::is_whitespace);
        if spaced.len() > 1 && !env.contains(',') {
            return Err(Fail::new(
                exit::USAGE,
                format!(
                    "REDLOCK_SERVERS is comma separated: write REDLOCK_SERVERS={}",
                    each_on_its_own(&spaced, "", ",")
                ),
            ));
        }
        let list: Vec<String> = env
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if list.is_empty() {
            return Err(Fail::new(
                exit::USAGE,
                "no servers given: use --server URL (once per Redis master) or set \
                 REDLOCK_SERVERS=URL,URL,...",
            ));
        }
        Ok(list)
    }
}

/// The pieces of a server list written the wrong way, as they should be written, each masked —
/// or, when a piece is no address (a password holding the separator was cut in two, and half
/// of it would show), words saying how.
fn each_on_its_own(parts: &[String], before: &str, sep: &str) -> String {
    if parts
        .iter()
        .all(|p| redlock_mux::NodeAddr::parse(p).is_ok())
    {
        parts
            .iter()
            .map(|p| format!("{before}{}", redact(p)))
            .collect::<Vec<_>>()
            .join(sep)
    } else {
        "each URL on its own (percent-encode a , or space in a password: %2C, %20)".into()
    }
}

/// The pieces of `s` split at `sep`, when at least two of them are URLs (`scheme://…`).
fn split_urls(s: &str, sep: impl Fn(char) -> bool) -> Vec<String> {
    let parts: Vec<String> = s
        .split(sep)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    if parts.iter().filter(|p| p.contains("://")).count() >= 2 {
        parts
    } else {
        Vec::new()
    }
}

/// The handle `b` describes; a mistake in it is a usage error (or a configuration one).
pub fn build(b: Builder) -> Result<Redlock, Fail> {
    b.build().map_err(|e| Fail::lib("bad configuration", &e))
}

/// `--quarantine` and `--node-timeout`.
#[derive(Args, Debug, Clone)]
pub struct Tuning {
    /// Restart quarantine: a node up for less than this does not count towards a quorum
    /// (default: one TTL; `off` for servers started just now that never held a lock). status:
    /// the window the lock holders use (default: --ttl, else 30s)
    #[arg(
        long,
        value_name = "DURATION|off",
        value_parser = parse_quarantine,
        env = "REDLOCK_QUARANTINE"
    )]
    pub quarantine: Option<Quarantine>,
    /// How long each attempt waits for each node (default: 5% of the TTL, at most 50ms;
    /// release: 50ms; status: how long it waits for the answers, default 1s)
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "REDLOCK_NODE_TIMEOUT"
    )]
    pub node_timeout: Option<Duration>,
    /// Count servers that may evict keys under memory pressure (a `maxmemory` limit with a
    /// policy other than noeviction) as any other. Unsafe: a lock key evicted while held gives
    /// a second holder. Without it such a server's yes does not count
    #[arg(long, env = "REDLOCK_COUNT_EVICTING_SERVERS_UNSAFELY")]
    pub count_evicting_servers_unsafely: bool,
}

impl Tuning {
    /// `base` (the servers' builder) with this TTL and these options.
    pub fn builder(&self, base: Builder, ttl: Duration) -> Builder {
        let mut b = base.ttl(ttl);
        if self.count_evicting_servers_unsafely {
            b = b.evicting_servers(redlock_mux::EvictingServers::CountUnsafely);
        }
        if let Some(Quarantine(q)) = self.quarantine {
            b = b.quarantine(q);
        }
        if let Some(t) = self.node_timeout {
            b = b.node_timeout(t);
        }
        b
    }
}

/// How `run` and `acquire` wait for a lock held elsewhere: flock(1)'s `-w`, `-n` and `-E`.
#[derive(Args, Debug, Clone)]
pub struct Waiting {
    /// Wait at most this long while the lock is held elsewhere: SECONDS as flock takes them
    /// (0.5, 10), a DURATION (250ms, 2m) or `inf` (default: wait until acquired, as flock does)
    #[arg(
        short = 'w',
        long = "wait",
        alias = "timeout",
        value_name = "SECONDS|DURATION|inf",
        value_parser = parse_wait,
        env = "REDLOCK_WAIT"
    )]
    pub wait: Option<Wait>,
    /// Do not wait: one attempt, and if the lock is held elsewhere exit with 75 (or -E's code)
    #[arg(
        short = 'n',
        long = "nonblock",
        alias = "nb",
        env = "REDLOCK_NONBLOCK",
        value_parser = BoolishValueParser::new()
    )]
    pub nonblock: bool,
    /// The exit code when the lock stays held elsewhere (default: 75); for run, one that
    /// COMMAND's own exit codes do not use
    #[arg(
        short = 'E',
        long = "conflict-exit-code",
        value_name = "N",
        value_parser = parse_conflict_code,
        env = "REDLOCK_CONFLICT_EXIT_CODE"
    )]
    pub conflict_exit_code: Option<u8>,
}

/// The options that shape a lock, one set for every subcommand that talks to servers (`run`,
/// `acquire`, `extend`, `release`, `status`, `bench`): each takes them all and ignores those it
/// has no use for, so that a script can pass the same options to `acquire`, `extend` and
/// `release`. Each is also read from an environment variable (`--server` from
/// `REDLOCK_SERVERS`, [`Servers::list`]); an option on the command line wins.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Lock options (taken by every subcommand that talks to servers)")]
pub struct LockOptions {
    #[command(flatten)]
    pub servers: Servers,
    /// The lock's time to live: without extend or release it expires after this (default: 10s
    /// for run and bench, which keep it alive, 30s for acquire and extend)
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "REDLOCK_TTL"
    )]
    pub ttl: Option<Duration>,
    /// Fencing tokens: each acquisition also gets a fence, a number greater than that of every
    /// acquisition completed before it (one more round trip); run passes it to COMMAND as
    /// REDLOCK_FENCE, acquire prints it after the token
    #[arg(long, env = "REDLOCK_FENCING", value_parser = BoolishValueParser::new())]
    pub fence: bool,
    /// RESOURCE is a counting semaphore of P permits (1 to 64): at most P holders at once,
    /// permit i being the lock RESOURCE#i. run and acquire take a free permit; release and
    /// extend find the permit TOKEN holds; status shows every permit. Every caller of RESOURCE
    /// must give the same P (the servers do not record it)
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u32).range(1..=i64::from(redlock_mux::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// A shared (read) lock of RESOURCE: many readers at once, never with a writer (the
    /// default, exclusive lock), and none while a writer waits. flock's -s is --server here:
    /// the short form is -r (read)
    #[arg(short = 'r', long, conflicts_with = "permits")]
    pub shared: bool,
    /// The exclusive (write) lock, the default; accepted for flock's -x
    #[arg(short = 'x', long, conflicts_with = "shared")]
    pub exclusive: bool,
    #[command(flatten)]
    pub tuning: Tuning,
    #[command(flatten)]
    pub waiting: Waiting,
}

/// How long `status` and `repair-fences` wait for the nodes' answers without
/// `--node-timeout`: a probe, not a lock attempt, so longer than an attempt's node timeout.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

impl LockOptions {
    /// How long a probe that takes no lock (`status`, `repair-fences`) waits for the answers:
    /// `--node-timeout`, or [`ANSWER_TIMEOUT`].
    pub fn answer_timeout(&self) -> Duration {
        self.tuning.node_timeout.unwrap_or(ANSWER_TIMEOUT)
    }

    /// A handle for a probe that takes no lock (`status`, `repair-fences`): fencing on, so
    /// that the handshake asks each node's run_id (a seeded counter from a blank one), and
    /// `window` as its restart quarantine. Its TTL only bounds the configuration checks (a
    /// window shorter than it would be refused).
    pub fn probe(&self, window: Option<Duration>) -> Result<Redlock, Fail> {
        let servers = self.servers.list()?;
        build(
            self.servers
                .builder(&servers)
                .ttl(window.map_or(HANDLE_TTL, |w| w.min(HANDLE_TTL)))
                .quarantine(window)
                .fencing(true),
        )
    }

    /// The lock that RESOURCES name ([`lock_name`]) for `run` and `acquire`; with `--permits`
    /// there must be one (the semaphore's name); none may be in the reserved namespace (an
    /// encoding given back, such as `run --shared`'s `REDLOCK_RESOURCE`, is for `extend`,
    /// `release` and `status`, not for taking a lock).
    pub fn lock_name(&self, resources: &[String]) -> Result<String, Fail> {
        // A semaphore has one name: several would become a set's (`redlock:set:…`), which the
        // semaphore then refused as a reserved name (found by review: a misleading message).
        if self.permits.is_some() && resources.len() > 1 {
            return Err(Fail::new(
                exit::USAGE,
                "--permits takes one RESOURCE (the semaphore's name)",
            ));
        }
        // A name is the user's name, never an encoding: `acquire redlock:shared:job` run twice
        // took two read locks — two holders of what the user believed exclusive. A read lock
        // is `--shared`; several names are one all-or-none lock.
        if let Some(reserved) = resources
            .iter()
            .find(|r| r.starts_with(redlock_mux::RESERVED_PREFIX))
        {
            return Err(Fail::new(
                exit::USAGE,
                format!(
                    "{}: names starting with {:?} are this tool's own keys, not a lock's; a read \
                     lock is --shared (-r) NAME, and several names are one all-or-none lock",
                    shorten(reserved, NAME_SHOWN),
                    redlock_mux::RESERVED_PREFIX
                ),
            ));
        }
        lock_name(resources, self.shared)
    }

    /// `--ttl`, or the subcommand's default.
    pub fn ttl_or(&self, default: Duration) -> Duration {
        self.ttl.unwrap_or(default)
    }

    /// A builder for the servers with the TLS options, `--ttl` (or `default_ttl`),
    /// `--quarantine` and `--node-timeout`: where `run`, `acquire` and `extend` start.
    pub fn tuned(&self, default_ttl: Duration) -> Result<Builder, Fail> {
        self.servers.tuned(&self.tuning, self.ttl_or(default_ttl))
    }
}

/// How long to wait for a lock held elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One attempt.
    Once,
    /// Retry for this long.
    For(Duration),
    /// Retry until acquired.
    Forever,
}

impl Waiting {
    /// `-w` with `-n`: a usage error when both come from the command line (or both from the
    /// environment); when one comes from each, the command line's wins, so that a script can
    /// override `REDLOCK_NONBLOCK` or `REDLOCK_WAIT` for one call. `matches` are the
    /// subcommand's.
    pub fn settle(&mut self, matches: &clap::ArgMatches) -> Result<(), Fail> {
        use clap::parser::ValueSource::{CommandLine, EnvVariable};
        if !self.nonblock || self.wait.is_none() {
            return Ok(());
        }
        match (
            matches.value_source("wait"),
            matches.value_source("nonblock"),
        ) {
            (Some(CommandLine), Some(EnvVariable)) => self.nonblock = false,
            (Some(EnvVariable), Some(CommandLine)) => self.wait = None,
            (Some(EnvVariable), Some(EnvVariable)) => {
                return Err(Fail::new(
                    exit::USAGE,
                    "REDLOCK_WAIT and REDLOCK_NONBLOCK contradict each other: set one of them",
                ));
            }
            _ => {
                return Err(Fail::new(
                    exit::USAGE,
                    "-w/--wait and -n/--nonblock contradict each other: give one of them",
                ));
            }
        }
        Ok(())
    }

    /// The waiting rule these options give.
    pub fn rule(&self) -> Wait {
        match (self.nonblock, self.wait) {
            (true, _) | (false, Some(Wait::For(Duration::ZERO))) => Wait::Once,
            (false, Some(w)) => w,
            (false, None) => Wait::Forever,
        }
    }
}

/// `--wait`: flock's seconds (`10`, `0.5`), a duration with a unit, or `inf`.
fn parse_wait(s: &str) -> Result<Wait, String> {
    let t = s.trim();
    match t {
        "inf" | "infinity" | "forever" => return Ok(Wait::Forever),
        _ => {}
    }
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{t} is not a number of seconds from 0 up"))
            .and_then(bounded)
            .map(Wait::For);
    }
    parse_duration(t).map(Wait::For)
}

/// The longest duration an option takes: longer ones overflowed the clock when added to now
/// (`--grace 300000000000y` panicked at a loss; found by review). `--wait inf` waits forever.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn bounded(d: Duration) -> Result<Duration, String> {
    match d > LONGEST {
        true => Err("longer than 100 years (for no limit, --wait takes inf)".into()),
        false => Ok(d),
    }
}

/// `--json` and `--quiet`.
#[derive(Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print one JSON object on stdout (on failure too: `"ok": false` with the exit code and
    /// each node's vote)
    #[arg(long)]
    pub json: bool,
    /// Print nothing on success (the exit code says it), nor when an acquire finds the lock held
    /// elsewhere; other failures are still reported on stderr
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// `--quarantine`: a window, or `None` for off.
#[derive(Debug, Clone, Copy)]
pub struct Quarantine(pub Option<Duration>);

/// A duration with a unit: `250ms`, `10s`, `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("no time unit: use e.g. {t}s or {t}ms"));
    }
    humantime::parse_duration(t)
        .map_err(|e| e.to_string())
        .and_then(bounded)
}

/// `--quarantine`: `off` (or `none`, `no`, `0`), or a window. A zero duration (`0s`, `0ms`) is
/// refused, not taken for `off`: the library refuses any fixed window shorter than the TTL, and
/// a window of nothing reads as a mistake (it silently switched the quarantine off).
pub fn parse_quarantine(s: &str) -> Result<Quarantine, String> {
    match s.trim() {
        "off" | "none" | "no" | "0" => Ok(Quarantine(None)),
        other => match parse_duration(other)? {
            d if d.is_zero() => Err(format!(
                "a window of {other} is no window: write `off` to switch the restart \
                 quarantine off"
            )),
            d => Ok(Quarantine(Some(d))),
        },
    }
}

/// A whole number from `lo` to `hi`, said in words when it is not (not clap's `1..=15`).
pub fn count(s: &str, lo: u16, hi: u16) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from {lo} to {hi}")),
    }
}

/// `-E`: an exit code from 0 to 255 (0: a lock held elsewhere is not a failure, as for a cron job
/// that skips its turn).
fn parse_conflict_code(s: &str) -> Result<u8, String> {
    s.trim()
        .parse::<u8>()
        .map_err(|_| "must be an exit code from 0 to 255".to_owned())
}

/// `--lost-exit-code`: an exit code from 1 to 255 (a lost lock is never success).
pub fn parse_exit_code(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u8>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("must be an exit code from 1 to 255".to_owned()),
    }
}

/// A far-away deadline for "wait until acquired" (a century: `Instant` arithmetic stays sound).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The servers a lock is held on, as `redlock run` tells its command (`REDLOCK_HELD_ON`): the
/// list in its order, `host:port` each, no credentials.
pub fn held_on<'a>(nodes: impl Iterator<Item = &'a redlock_mux::NodeAddr>) -> String {
    let nodes: Vec<String> = nodes.map(ToString::to_string).collect();
    nodes.join(",")
}

/// How long a wait without a limit (no `-w`) goes on while no quorum of servers can be
/// reached, before it gives up with 69: long enough to ride out a server's restart — the
/// reconnect backoff's ceiling, plus the restart quarantine (a restarted node counts again
/// only after it), plus a connect timeout.
pub fn unreachable_grace(config: &redlock_mux::Config) -> Duration {
    config.backoff_max
        + config.quarantine_window().unwrap_or(Duration::ZERO)
        + config.connect_timeout
}

/// Acquires `resource` under the user's waiting rule. The first attempt goes out alone, so that
/// a wait that starts on servers in their restart quarantine (or unreachable ones) can say so
/// before it waits; a lock held elsewhere is waited for in silence, as flock does.
///
/// What waiting cannot mend ends at once ([`Error::is_final`]: a certificate that does not
/// verify, a port that speaks another protocol, credentials refused). Without a limit (no
/// `-w`), no quorum of reachable servers is waited for at most [`unreachable_grace`], then 69.
///
/// A lock taken while some nodes were unreachable is said on stderr (unless `quiet`).
///
/// The caller warns about nodes that were unreachable ([`warn_unreachable`]) once it has said
/// what it acquired.
pub fn acquire(
    r: &Redlock,
    resource: &str,
    permits: Option<u32>,
    waiting: &Waiting,
    quiet: bool,
) -> Result<Lock, Fail> {
    // With --permits: a permit of the semaphore RESOURCE, a lock on RESOURCE#i.
    let semaphore = permits
        .map(|p| r.semaphore(resource, p))
        .transpose()
        .map_err(|e| Fail::lib("bad arguments", &e))?;
    let try_lock = || match &semaphore {
        Some(s) => s.try_acquire(),
        None => r.try_lock(resource),
    };
    let lock_until = |deadline| match &semaphore {
        Some(s) => s.acquire_until(deadline),
        None => r.lock_until(resource, deadline),
    };
    // Inside `redlock run HELD -- …` on the same servers, which holds HELD until the command
    // ends: an acquire that HELD excludes could only wait for the command it runs in (issue
    // 35: it waited forever), so it is refused at once. The rule is the library's
    // (`Resource::excludes`, as `with_lock` refuses a nested acquire): the same name, a shared
    // lock and a writer of one name, a set and a lock of one of its members, sets with a member
    // in common, two shared locks of one name (a writer waiting meanwhile keeps the inner
    // reader out; found by review: only the same name was refused, the others hung). With
    // --permits, only when HELD excludes every permit this acquire could take: the one permit
    // of a semaphore of 1, say (a plain lock of the name is another key, and a semaphore of
    // more has other permits; found by review: the first hung, the second was refused). `-n`
    // still answers "held" at once.
    let excluded_by = |held: &std::ffi::OsStr| {
        let held = Resource::new(held.as_encoded_bytes());
        match &semaphore {
            Some(s) => (0..s.permits()).all(|i| {
                s.permit_key(i)
                    .is_some_and(|k| held.excludes(Resource::new(k)))
            }),
            None => held.excludes(Resource::new(resource.as_bytes())),
        }
    };
    if !matches!(waiting.rule(), Wait::Once)
        && let Some(held) = std::env::var_os("REDLOCK_RESOURCE").filter(|h| excluded_by(h))
        && std::env::var("REDLOCK_HELD_ON").is_ok_and(|on| on == held_on(r.nodes().iter()))
    {
        let held = held.to_string_lossy();
        let message = if held == resource {
            format!(
                "{} is already held by the enclosing `redlock run` (REDLOCK_RESOURCE): waiting \
                 for it would never end; extend it with `redlock extend \"$REDLOCK_RESOURCE\" \
                 \"$REDLOCK_TOKEN\"`",
                shorten(resource, NAME_SHOWN)
            )
        } else {
            format!(
                "{} conflicts with {}, which the enclosing `redlock run` holds \
                 (REDLOCK_RESOURCE): waiting for it would never end",
                shorten(resource, NAME_SHOWN),
                shorten(&held, NAME_SHOWN)
            )
        };
        return Err(Fail::new(exit::USAGE, message));
    }
    // Connect (and handshake) first, so the first attempt's per-node timeout is spent on the
    // SET alone: a one-shot command against distant masters must not fail on a cold start.
    r.connect(r.config().connect_timeout)
        .map_err(|e| Fail::lib("cannot start", &e))?;
    let rule = waiting.rule();
    let started = Instant::now();
    let first = match try_lock() {
        Ok(lock) => return Ok(lock),
        Err(e) => e,
    };
    let deadline = match rule {
        Wait::Once => None,
        Wait::For(d) => Some(started + d),
        Wait::Forever => Some(started + FOREVER),
    };
    let retryable = !first.is_final() && matches!(classify(&first).1, Kind::Held | Kind::NoQuorum);
    let Some(deadline) = deadline.filter(|_| retryable) else {
        return Err(lock_failure(r, resource, rule, &first, waiting));
    };
    let grace = unreachable_grace(r.config());
    if !quiet && !matches!(first, Error::Held(_)) {
        let why = match quarantine_hint(r, &first) {
            Some(hint) => hint,
            None => first.to_string(),
        };
        say!(
            "redlock: waiting{} for {}: {why}",
            match rule {
                Wait::For(d) => format!(" up to {}", fmt_duration(d)),
                _ => format!(
                    " (at most {} while no quorum is reachable)",
                    fmt_duration(grace)
                ),
            },
            shorten(resource, NAME_SHOWN)
        );
    }
    if !matches!(rule, Wait::Forever) {
        return lock_until(deadline).map_err(|e| lock_failure(r, resource, rule, &e, waiting));
    }
    // Without a limit: a lock held elsewhere is waited for as long as it takes (as flock does),
    // servers that cannot make a quorum for `grace` (in turns of half of it) are not.
    let mut unreachable_since = (!matches!(first, Error::Held(_))).then_some(started);
    loop {
        let turn = Instant::now();
        let e = match lock_until((turn + grace / 2).min(deadline)) {
            Ok(lock) => return Ok(lock),
            Err(e) => e,
        };
        if e.is_final() || Instant::now() >= deadline {
            return Err(lock_failure(r, resource, rule, &e, waiting));
        }
        if matches!(e, Error::Held(_)) {
            unreachable_since = None;
            continue;
        }
        let since = *unreachable_since.get_or_insert(turn);
        if since.elapsed() >= grace {
            let mut fail = Fail::lib(
                &format!(
                    "gave up waiting for {} after {} without a quorum of servers",
                    shorten(resource, NAME_SHOWN),
                    fmt_duration(since.elapsed())
                ),
                &e,
            );
            fail.code = exit::UNAVAILABLE;
            fail.kind = Kind::NoQuorum;
            return Err(fail);
        }
    }
}

/// The failure of an acquire: held elsewhere gets `-E`'s code, a quorum missed only because of
/// the restart quarantine gets its own code and says what to do.
fn lock_failure(r: &Redlock, resource: &str, rule: Wait, e: &Error, waiting: &Waiting) -> Fail {
    let within = match rule {
        Wait::For(d) => format!(" within {}", fmt_duration(d)),
        _ => String::new(),
    };
    let context = format!("cannot lock {}{within}", shorten(resource, NAME_SHOWN));
    let mut fail = Fail::lib(&context, e);
    if fail.is_held() {
        fail.code = waiting.conflict_exit_code.unwrap_or(exit::HELD);
    } else if let Some(hint) = quarantine_hint(r, e) {
        fail.code = exit::QUARANTINED;
        fail.kind = Kind::Quarantined;
        fail.message = format!("{context}: {hint}");
    }
    fail
}

/// When a quorum was missed only because nodes are in their restart quarantine: what is
/// happening and what to do, e.g. "127.0.0.1:7701, 127.0.0.1:7702 started 3s ago; a lock is
/// refused for 7s more in case they lost keys in a restart: wait, or pass --quarantine off if
/// they are new".
pub fn quarantine_hint(r: &Redlock, e: &Error) -> Option<String> {
    let report = match e {
        Error::NoQuorum(report) => report,
        _ => return None,
    };
    let window = r.config().quarantine_window()?;
    // In the order of the server list.
    let mut quarantined: Vec<(String, Duration)> = report
        .votes()
        .filter_map(|(node, vote)| match vote {
            NodeVote::Failed(f) => match f.root() {
                NodeFault::Quarantined(left) => Some((node.to_string(), *left)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let need = report.quorum().saturating_sub(report.yes());
    if need == 0 || quarantined.len() < need {
        return None;
    }
    let names: Vec<&str> = quarantined.iter().map(|(n, _)| n.as_str()).collect();
    let names = names.join(", ");
    let youngest = window.saturating_sub(quarantined.iter().map(|&(_, left)| left).max()?);
    // A quorum is possible once `need` of them are out of quarantine.
    quarantined.sort_by_key(|&(_, left)| left);
    let refused_for = quarantined[need - 1].1;
    // Uptimes come in whole seconds.
    let ago = match youngest.as_secs() {
        0 => "just now".to_owned(),
        s => format!("{} ago", fmt_duration(Duration::from_secs(s))),
    };
    Some(format!(
        "{names} started {ago}; a lock is refused for {} more in case they lost keys in a \
         restart (the restart quarantine): wait, or pass --quarantine off if they are new",
        fmt_duration(round_up(refused_for))
    ))
}

/// Rounds up to whole seconds above 1 s, whole milliseconds below (for messages).
fn round_up(d: Duration) -> Duration {
    if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
    } else {
        Duration::from_millis(
            d.as_millis() as u64 + u64::from(!d.subsec_nanos().is_multiple_of(1_000_000)),
        )
    }
}

/// `250ms`, `1.5s`, `2m 5s`: a duration as a person writes it (and as the options take it).
pub fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) && d.subsec_millis() != 0 {
        let decimal = format!("{}.{:03}", d.as_secs(), d.subsec_millis());
        format!("{}s", decimal.trim_end_matches('0'))
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// How much of a resource name a message quotes, in characters: any name a person types fits,
/// and a generated 2,000-byte one still leaves the message on a line or two.
pub const NAME_SHOWN: usize = 64;

/// How much of a `--server` value a message quotes: a URL with a user, password and options
/// fits; a whole list pasted into one `--server` is cut.
const URL_SHOWN: usize = 80;

/// The lock that RESOURCES name: one resource is its own name; several are one set locked all
/// or none (`ResourceSet`), named by its encoding (`redlock:set:…`), which every subcommand
/// takes back as a RESOURCE (`REDLOCK_RESOURCE` of `run` holds it).
pub fn lock_name(resources: &[String], shared: bool) -> Result<String, Fail> {
    match resources {
        [one] if shared => {
            let lock = redlock_mux::Shared::new(one)
                .map_err(|e| Fail::new(exit::USAGE, format!("bad resource: {e}")))?;
            Ok(String::from_utf8_lossy(lock.as_ref()).into_owned())
        }
        _ if shared => Err(Fail::new(
            exit::USAGE,
            "--shared takes one RESOURCE (a shared lock of several is not supported)",
        )),
        [one] => Ok(one.clone()),
        _ => {
            let set = redlock_mux::ResourceSet::new(resources)
                .map_err(|e| Fail::new(exit::USAGE, format!("bad resources: {e}")))?;
            Ok(String::from_utf8_lossy(set.as_ref()).into_owned())
        }
    }
}

/// `RESOURCE TOKEN`, or `RESOURCE RESOURCE... TOKEN` (`more` non-empty: the token is its last
/// word): the lock's name (`lock_name`) and its token.
pub fn lock_and_token<'a>(
    resource: &str,
    token: &'a str,
    more: &'a [String],
    shared: bool,
) -> Result<(String, &'a str), Fail> {
    let Some((last, between)) = more.split_last() else {
        return Ok((lock_name(&[resource.to_owned()], shared)?, token));
    };
    let mut names = vec![resource.to_owned(), token.to_owned()];
    names.extend(between.iter().cloned());
    Ok((lock_name(&names, shared)?, last))
}

/// A name quoted for a message, cut to `max` characters: a 2,000-byte resource name is not
/// echoed whole (`"aaaa…" (2000 bytes)`). A set shows as its members: `"{a, b}"`.
pub fn shorten(name: &str, max: usize) -> String {
    let shown = redlock_mux::Resource::new(name.as_bytes()).to_string();
    let name = shown.as_str();
    let mut chars = name.chars();
    let head: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        format!("{head:?}… ({} bytes)", name.len())
    } else {
        format!("{head:?}")
    }
}

/// With `--permits`: the key of the permit of the semaphore `resource` that `token` holds on
/// most nodes (asked of every permit, each waiting at most `timeout`), for `release` and
/// `extend`; `resource#0` when no node holds it with `token` (the caller then reports it is
/// not held). Without: `resource`.
pub fn permit_held_by(
    r: &Redlock,
    resource: &str,
    permits: Option<u32>,
    token: &str,
    timeout: Duration,
) -> Result<String, Fail> {
    let Some(permits) = permits else {
        return Ok(resource.to_owned());
    };
    let semaphore = r
        .semaphore(resource, permits)
        .map_err(|e| Fail::lib("bad arguments", &e))?;
    let mut best: Option<(usize, String)> = None;
    for i in 0..permits {
        let key = String::from_utf8_lossy(semaphore.permit_key(i).unwrap_or_default()).into_owned();
        let holding = r
            .status(key.as_bytes(), timeout)
            .iter()
            .filter(|s| matches!(&s.state, Ok((Some(v), _)) if v == token.as_bytes()))
            .count();
        if holding > 0 && best.as_ref().is_none_or(|(n, _)| holding > *n) {
            best = Some((holding, key));
        }
    }
    Ok(best.map_or_else(|| format!("{resource}#0"), |(_, key)| key))
}
