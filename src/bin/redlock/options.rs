//! The option groups the subcommands flatten into their own: the servers and TLS, the tuning
//! (`--quarantine`, `--node-timeout`), the waiting rule (flock's `-w`, `-n`, `-E`), the lock
//! options that hold them all, and `--json` / `--quiet`.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
// A flag's variable takes 1/0, yes/no, true/false, on/off.
use clap::builder::BoolishValueParser;
use redlock_mux::{Builder, Redlock};
use serde_json::Value;

use crate::fail::{Fail, exit};
use crate::json::print_json;
use crate::parse::{
    Quarantine, Wait, parse_conflict_code, parse_duration, parse_quarantine, parse_wait,
};

/// The TTL given to the handles of `release` and `status`, which set none: it only bounds the
/// configuration checks.
pub const HANDLE_TTL: Duration = Duration::from_secs(30);

/// The servers to use: `-s` / `--server`, or `$REDLOCK_SERVERS`.
#[derive(Args, Debug, Clone)]
pub struct Servers {
    /// A Redis master (once for each; default: $REDLOCK_SERVERS)
    ///
    /// Repeat the option for each master; without it, $REDLOCK_SERVERS, comma separated
    #[arg(long = "server", short = 's', value_name = "URL")]
    pub servers: Vec<String>,
    /// rediss://: the CA certificates to trust (PEM)
    ///
    /// rediss:// servers: trust the CA certificates of this PEM file instead of the system's
    #[arg(long, value_name = "FILE", env = "REDLOCK_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// rediss://: the client certificate chain (PEM)
    ///
    /// rediss:// servers that ask for a client certificate (mutual TLS): this PEM chain
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        env = "REDLOCK_TLS_CERT"
    )]
    pub tls_cert: Option<PathBuf>,
    /// rediss://: the private key of --tls-cert (PEM)
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_cert",
        env = "REDLOCK_TLS_KEY"
    )]
    pub tls_key: Option<PathBuf>,
    /// rediss://: the name the certificates carry
    ///
    /// rediss:// servers: the name their certificates carry, when the URL's host is not it
    #[arg(long, value_name = "NAME", env = "REDLOCK_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

/// The handle `b` describes; a mistake in it is a usage error, said as the library says it.
pub fn build(b: Builder) -> Result<Redlock, Fail> {
    b.build().map_err(|e| Fail::of(&e))
}

/// The restart quarantine of every subcommand without `--quarantine` (or the TTL, if longer:
/// [`Tuning::window`]). The window keeps a restarted node, which may have lost the keys of
/// locks still valid, from counting until they have expired: the locks of every holder of the
/// name, not only this one's, so it must outlast the longest TTL any of them uses. With the
/// defaults that is `acquire`'s and `extend`'s 30 s (a script's step between two extends);
/// `run`'s and `bench`'s 10 s locks are covered too. One window for all, so that `status`
/// shows the quarantine `run` and `acquire` apply.
pub const DEFAULT_QUARANTINE: Duration = Duration::from_secs(30);

/// `--quarantine` and `--node-timeout`.
#[derive(Args, Debug, Clone)]
pub struct Tuning {
    /// Restart quarantine window (default: 30s, or --ttl if longer)
    ///
    /// Restart quarantine: a node up for less than this does not count towards a quorum
    /// (default: 30s, or --ttl if longer; `off` for servers started just now that never held a
    /// lock). status and repair-fences: the window the lock holders use, the same default
    #[arg(
        long,
        value_name = "DURATION|off",
        value_parser = parse_quarantine,
        env = "REDLOCK_QUARANTINE"
    )]
    pub quarantine: Option<Quarantine>,
    /// How long each attempt waits for each node
    ///
    /// How long each attempt waits for each node (default: 5% of the TTL, at most 50ms;
    /// release: 50ms; status: how long it waits for the answers, default 1s)
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "REDLOCK_NODE_TIMEOUT"
    )]
    pub node_timeout: Option<Duration>,
    /// Count servers that may evict keys (unsafe)
    ///
    /// Count servers that may evict keys under memory pressure (a `maxmemory` limit with a
    /// policy other than noeviction) as any other. Unsafe: a lock key evicted while held gives
    /// a second holder. Without it such a server's yes does not count
    #[arg(long, env = "REDLOCK_COUNT_EVICTING_SERVERS_UNSAFELY")]
    pub count_evicting_servers_unsafely: bool,
    /// Leave out nodes whose clocks disagree by more than this
    ///
    /// The clock check: each acquire and extend also reads every node's clock (`TIME`), and a
    /// node's yes counts only if its clock is within this tolerance of a quorum's (a server
    /// whose clock runs fast or jumps drops keys early). Three times the tolerance comes off
    /// the validity. For servers NTP keeps in step; e.g. 20ms. Default: off
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "REDLOCK_CLOCK_CHECK"
    )]
    pub clock_check: Option<Duration>,
    /// Sets wait for their members one at a time, in order
    ///
    /// Ordered sets: a set of several names refused at its first attempt takes its members one
    /// at a time, in order of name, keeping those it has while it waits for the next, and marks
    /// the one it waits for, so that other waiting callers of that member (with this option)
    /// step back during the first --set-precedence of their wait. Without it a set waits for a
    /// moment when every member is free at once, which busy members may never leave. Give it to
    /// every redlock and handle that locks these names. Default: off
    #[arg(
        long,
        env = "REDLOCK_ORDERED_SETS",
        value_parser = BoolishValueParser::new()
    )]
    pub ordered_sets: bool,
    /// With --ordered-sets, how long into its wait a caller steps back for a waiting set
    ///
    /// With --ordered-sets, a waiting lock or reader of a name an ordered set waits for steps
    /// back for the set during this much of its wait, then competes with the sets as with any
    /// caller, so that a steady stream of sets cannot keep it out. Longer gives sets more, 0
    /// gives them no precedence; at most an hour. Default: 250ms
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "REDLOCK_SET_PRECEDENCE",
        hide_short_help = true
    )]
    pub set_precedence: Option<Duration>,
    /// First come, first served among --fair callers of a name
    ///
    /// A fair lock: waiting callers of a name (with this option, in any process) are granted it
    /// in the order they began to wait, through a queue on each server (redlock:queue:NAME).
    /// Several names (all or none) wait in every name's queue and get them all once first in
    /// each. One that gives up leaves it; one that dies keeps its place for two fallback polls
    /// (at least a second). Readers (--shared) queue too, and those between two writers are
    /// granted together. Callers without it do not queue; -n joins no queue and is refused
    /// while anyone waits (a reader's, while a writer waits). Not with --fence or
    /// --ordered-sets. Default: off
    #[arg(
        long,
        env = "REDLOCK_FAIR",
        value_parser = BoolishValueParser::new(),
        hide_short_help = true
    )]
    pub fair: bool,
}

impl Tuning {
    /// The restart quarantine of locks with this TTL: `--quarantine` (`None`: off), else
    /// [`DEFAULT_QUARANTINE`], or the TTL if it is longer (a window shorter than the TTL would
    /// not cover the lock's own keys, and the library refuses it).
    pub fn window(&self, ttl: Duration) -> Option<Duration> {
        match self.quarantine {
            Some(Quarantine(q)) => q,
            None => Some(DEFAULT_QUARANTINE.max(ttl)),
        }
    }

    /// `base` (the servers' builder) with this TTL and these options.
    pub fn builder(&self, base: Builder, ttl: Duration) -> Builder {
        let mut b = base.ttl(ttl);
        if self.count_evicting_servers_unsafely {
            b = b.evicting_servers(redlock_mux::EvictingServers::CountUnsafely);
        }
        b = b.quarantine(self.window(ttl));
        if let Some(t) = self.node_timeout {
            b = b.node_timeout(t);
        }
        if let Some(x) = self.clock_check {
            b = b.clock_check(x);
        }
        if self.ordered_sets {
            b = b.ordered_sets(true);
        }
        if let Some(d) = self.set_precedence {
            b = b.set_precedence(d);
        }
        if self.fair {
            b = b.fair(true);
        }
        b
    }
}

/// How `run` and `acquire` wait for a lock held elsewhere: flock(1)'s `-w`, `-n` and `-E`.
#[derive(Args, Debug, Clone)]
pub struct Waiting {
    /// Wait at most this long for a lock held elsewhere
    ///
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
    /// Do not wait: one attempt
    ///
    /// Do not wait: one attempt, and if the lock is held elsewhere exit with 75 (or -E's code)
    #[arg(
        short = 'n',
        long = "nonblock",
        alias = "nb",
        env = "REDLOCK_NONBLOCK",
        value_parser = BoolishValueParser::new()
    )]
    pub nonblock: bool,
    /// The exit code when the lock stays held elsewhere (default: 75)
    ///
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
    /// The lock's time to live
    ///
    /// Without extend or release the lock expires after this (default: 10s for run and bench,
    /// which keep it alive, 30s for acquire and extend)
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "REDLOCK_TTL"
    )]
    pub ttl: Option<Duration>,
    /// Fencing tokens: a fence number with each lock
    ///
    /// Each acquisition also gets a fence, a number greater than that of every
    /// acquisition completed before it (one more round trip); run passes it to COMMAND as
    /// REDLOCK_FENCE, acquire prints it after the token
    #[arg(long, env = "REDLOCK_FENCING", value_parser = BoolishValueParser::new())]
    pub fence: bool,
    /// RESOURCE is a semaphore of P permits (1 to 64)
    ///
    /// RESOURCE is a counting semaphore of P permits (1 to 64): at most P holders at once,
    /// permit i being the lock RESOURCE#i. run and acquire take a free permit; release and
    /// extend find the permit TOKEN holds; status shows every permit. Every caller of RESOURCE
    /// must give the same P (the servers do not record it)
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u32).range(1..=i64::from(redlock_mux::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// A shared (read) lock; flock's -s is --server here
    ///
    /// A shared (read) lock of RESOURCE: many readers at once, never with a writer (the
    /// default, exclusive lock), and none while a writer waits. flock's -s is --server here:
    /// the short form is -r (read)
    #[arg(short = 'r', long, conflicts_with = "permits")]
    pub shared: bool,
    /// The exclusive (write) lock, the default; accepted for flock's -x
    #[arg(short = 'x', long, conflicts_with = "shared")]
    pub exclusive: bool,
    /// Who holds the lock, stored with it on every node ('' for none)
    ///
    /// Who holds the lock, stored with it on every node and shown by status and by the refusal
    /// of another acquire (default for run: HOST:PID:COMMAND, PID being run's own; for
    /// acquire: HOST:PPID:redlock acquire, PPID being the process that called it, which holds
    /// the lock). At most 128 bytes; '' records none
    #[arg(long, value_name = "TEXT", env = "REDLOCK_OWNER")]
    pub owner: Option<String>,
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

    /// `--ttl`, or the subcommand's default.
    pub fn ttl_or(&self, default: Duration) -> Duration {
        self.ttl.unwrap_or(default)
    }

    /// `b` with `--owner`, or the default: `HOST:PID:COMMAND` with `command` given, shortened
    /// to [`MAX_OWNER_LEN`](redlock_mux::MAX_OWNER_LEN) bytes, control characters as spaces;
    /// `--owner ''` records none.
    pub fn owned(&self, b: Builder, pid: u32, command: &str) -> Builder {
        let owner = match &self.owner {
            Some(o) if o.is_empty() => return b,
            Some(o) => o.clone(),
            None => default_owner(pid, command),
        };
        b.owner(owner)
    }

    /// A builder for the servers with the TLS options, `--ttl` (or `default_ttl`),
    /// `--quarantine` and `--node-timeout`: where `run`, `acquire` and `extend` start.
    pub fn tuned(&self, default_ttl: Duration) -> Result<Builder, Fail> {
        self.servers.tuned(&self.tuning, self.ttl_or(default_ttl))
    }
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

/// `--json` and `--quiet`.
#[derive(Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print one JSON object on stdout
    ///
    /// Print one JSON object on stdout (on failure too: `"ok": false` with the exit code and
    /// each node's vote)
    #[arg(long)]
    pub json: bool,
    /// Print nothing on success, nor "held elsewhere"
    ///
    /// Print nothing on success (the exit code says it), nor when an acquire finds the lock held
    /// elsewhere; other failures are still reported on stderr
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

impl Output {
    /// A success said both ways: with `--json` the object on stdout, and unless `--quiet` the
    /// line on stderr (`redlock: …`).
    pub fn success(&self, object: impl FnOnce() -> Value, line: impl FnOnce() -> String) {
        if self.json {
            print_json(&object());
        }
        if !self.quiet {
            say!("redlock: {}", line());
        }
    }

    /// A report on stdout (`status`, `repair-fences`): with `--json` the object, else the text
    /// unless `--quiet`.
    pub fn report(&self, object: impl FnOnce() -> Value, text: impl FnOnce() -> String) {
        if self.json {
            print_json(&object());
        } else if !self.quiet {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout
                .write_all(text().as_bytes())
                .and_then(|()| stdout.flush());
        }
    }
}

/// `--json`, `--quiet` and the lock options: what the subcommands that talk to servers and
/// print a result take (`acquire`, `release`, `extend`, `status`, `repair-fences`).
#[derive(Args, Debug, Clone)]
pub struct CallOptions {
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub opts: LockOptions,
}

/// A lock given back by name and token, as `acquire` printed it (`release`, `extend`):
/// `RESOURCE TOKEN`, or `RESOURCE RESOURCE... TOKEN` for a set.
#[derive(Args, Debug)]
pub struct HeldLock {
    /// The name of the lock
    pub resource: String,
    /// The token `redlock acquire` printed (it may start with '-')
    #[arg(allow_hyphen_values = true)]
    pub token: String,
    /// The other resources of a set, then its TOKEN
    ///
    /// Several resources, the lock that `acquire` or `run` took of all of them:
    /// `RESOURCE RESOURCE... TOKEN` (or the one `redlock:set:…` name they exported)
    #[arg(allow_hyphen_values = true, value_name = "RESOURCE... TOKEN")]
    pub more: Vec<String>,
    #[command(flatten)]
    pub call: CallOptions,
}

/// `HOST:PID:COMMAND`, at most [`MAX_OWNER_LEN`](redlock_mux::MAX_OWNER_LEN) bytes (the
/// command cut at a character's boundary), control characters as spaces.
pub fn default_owner(pid: u32, command: &str) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let mut owner = format!("{host}:{pid}:");
    for c in command.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if owner.len() + c.len_utf8() > redlock_mux::MAX_OWNER_LEN {
            break;
        }
        owner.push(c);
    }
    owner
}
