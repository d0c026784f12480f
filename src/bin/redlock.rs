//! `redlock`: a distributed `flock(1)` over N independent Redis masters, built on `redlock_mux`.
//!
//! Subcommands: `run` (a command under a kept lock), `acquire` / `release` / `extend` (for
//! scripts), `status` (what each node holds), `demo` (local servers, competing clients, a frozen
//! node) and `bench` (latency percentiles). Built only with the `cli` feature:
//! `cargo build --release --features cli`. User documentation: `docs/cli.md`.
//!
//! Every failure is one line on stderr, `redlock: what happened (and on which node)`, and a stable
//! exit code (see [`exit`]). No panic reaches the user: one is reported as an internal error (70).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use redlock_mux::{Builder, Error, Lock, NodeFault, NodeStatus, Redlock};

/// `println!` that ignores write errors: a closed pipe or a hung-up terminal must not turn into a
/// panic that skips the cleanup (releasing a lock, stopping local servers).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` that ignores write errors.
macro_rules! out_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout();
        let _ = write!(stdout, $($arg)*).and_then(|()| stdout.flush());
    }};
}

/// `eprintln!` that ignores write errors.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

#[path = "redlock/child.rs"]
mod child;
#[path = "redlock/demo.rs"]
mod demo;
#[path = "redlock/group.rs"]
mod group;
#[path = "redlock/run.rs"]
mod run;
#[path = "redlock/servers.rs"]
mod servers;

/// The exit codes: stable, documented in `--help` and `docs/cli.md`. They follow `sysexits.h`.
pub mod exit {
    /// Success (for `run`: COMMAND's own exit code).
    pub const OK: u8 = 0;
    /// Usage error: bad flag, bad address, bad duration, no servers.
    pub const USAGE: u8 = 64;
    /// No quorum of servers reachable (or they answered too slowly to leave any validity).
    pub const UNAVAILABLE: u8 = 69;
    /// Protocol or internal error.
    pub const INTERNAL: u8 = 70;
    /// Not acquired: the lock is held elsewhere (after `--wait`).
    pub const HELD: u8 = 75;
    /// A server refused our credentials.
    pub const AUTH: u8 = 77;
    /// The lock was lost while `run` ran COMMAND (`release` / `extend`: no longer held).
    pub const LOST: u8 = 79;
    /// `run`: COMMAND was found but could not be started.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `run`: COMMAND was not found.
    pub const NOT_FOUND: u8 = 127;
    /// Interrupted by SIGINT (128 + 2), for `demo` and `bench`.
    pub const INTERRUPTED: u8 = 130;
}

const EXIT_CODES_HELP: &str = "\
Servers:
  --server URL (repeatable) or REDLOCK_SERVERS=URL,URL,... (comma separated; --server wins).
  redis://[[user]:password@]host[:port][/db][?protocol=3]
  redis+unix:///path/to/redis.sock[?db=N&username=U&password=P]
  Use an odd number of independent masters (3 or 5); a lock needs a majority of them.

Exit codes:
  0    success (run: COMMAND's own exit code, or 128+N if a signal N killed it)
  64   usage error: bad flag, bad address, bad duration, no servers given
  69   no quorum of servers reachable (or too slow to leave any validity)
  70   protocol or internal error
  75   lock not acquired: it is held elsewhere (after --wait)
  77   authentication refused by a server
  79   lock lost while run was running COMMAND (release, extend: not held any more)
  126  run: COMMAND could not be started;  127: COMMAND not found
  130  demo, bench: interrupted

Durations: 250ms, 10s, 1m, 1h30m, ... (a unit is required).";

/// A distributed flock(1): run a command while holding a Redlock over N Redis masters.
#[derive(Parser, Debug)]
#[command(
    name = "redlock",
    version,
    after_help = EXIT_CODES_HELP,
    max_term_width = 100,
    disable_help_subcommand = true
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand takes.
#[derive(Args, Debug, Clone)]
struct Global {
    /// A Redis master, repeatable; default: $REDLOCK_SERVERS (comma separated)
    #[arg(long = "server", short = 's', value_name = "URL", global = true)]
    servers: Vec<String>,
    /// Restart quarantine: a node up for less than this does not count towards a quorum
    /// (default: one TTL; `off` for freshly started servers)
    #[arg(long, value_name = "DURATION|off", global = true, value_parser = parse_quarantine)]
    quarantine: Option<Quarantine>,
    /// How long each attempt waits for each node (default: 5% of the TTL, at most 50ms)
    #[arg(long, value_name = "DURATION", global = true, value_parser = parse_duration)]
    node_timeout: Option<Duration>,
    /// Fencing tokens: each acquisition also gets a fence, a number greater than that of every
    /// acquisition completed before it (one more round trip)
    #[arg(long, global = true)]
    fence: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire RESOURCE, run COMMAND while keeping the lock alive, release it, exit with
    /// COMMAND's code
    #[command(after_help = RUN_HELP)]
    Run(run::RunArgs),
    /// Acquire RESOURCE; print the token on stdout (with --fence: the token, a space, the
    /// fence), and the validity on stderr
    Acquire(AcquireArgs),
    /// Release RESOURCE held with TOKEN
    Release(ReleaseArgs),
    /// Extend RESOURCE held with TOKEN to a full TTL from now
    Extend(ExtendArgs),
    /// Show what each node holds for RESOURCE, and whether a quorum holds it
    Status(StatusArgs),
    /// Start local redis-servers and show competing clients staying mutually exclusive
    Demo(demo::DemoArgs),
    /// Latency percentiles of lock cycles (acquire + release)
    Bench(demo::BenchArgs),
}

const RUN_HELP: &str = "\
COMMAND gets REDLOCK_RESOURCE, REDLOCK_TOKEN and REDLOCK_VALIDITY_MS in its environment, and
REDLOCK_FENCE with --fence (pass it to what the lock protects, to refuse stale writers). The lock
is extended in the background when a third of its TTL is left; it is released when COMMAND exits.

COMMAND runs in a process group of its own, with everything it starts. A watchdog process
(redlock-watch) sends SIGKILL to that whole group if redlock dies (SIGKILL included), and if
redlock is stopped or hangs until the lock's validity runs out. So no process of the group runs on
past the lock's validity once redlock can no longer keep the lock. A process that leaves the group
(setsid, as daemons do) is not covered. Processes COMMAND leaves running when it exits are left
alone, unless the lock was lost (then they get SIGKILL).

If the lock is lost (the servers stopped answering, or the key vanished), the group gets SIGTERM,
then SIGKILL after --grace, or earlier so that SIGKILL goes out before the lock's validity ends, and
redlock exits with 79. SIGINT, SIGQUIT, SIGTERM, SIGHUP and SIGTSTP sent to redlock are forwarded
to the group.

Terminal: when redlock's stdin and stdout are its terminal and it runs in the foreground, COMMAND's
group is made the terminal's foreground group (and redlock's own restored afterwards), so Ctrl-C,
Ctrl-\\ and Ctrl-Z reach it directly, once. Otherwise (in a pipeline, with a redirection) the
terminal stays with redlock's group, redlock forwards what it gets, and COMMAND is given the
terminal only if it stops to read from it (or to set it up). Ctrl-Z stops COMMAND and redlock
together; a job stopped for longer than the lock's validity loses the lock.

Exit codes: COMMAND's own (128+N if signal N killed it); 64 usage error; 69 no quorum reachable;
70 internal error; 75 held elsewhere (after --wait); 77 authentication refused; 79 lock lost
while COMMAND ran; 126 COMMAND could not be started; 127 COMMAND not found.";

#[derive(Args, Debug)]
struct AcquireArgs {
    /// The name of the lock (the Redis key)
    resource: String,
    /// Lock time to live: without `extend` or `release` it expires after this
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Keep retrying this long while the lock is held elsewhere (default: one attempt)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    wait: Option<Duration>,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    /// The name of the lock
    resource: String,
    /// The token `redlock acquire` printed (it may start with '-')
    #[arg(allow_hyphen_values = true)]
    token: String,
}

#[derive(Args, Debug)]
struct ExtendArgs {
    /// The name of the lock
    resource: String,
    /// The token `redlock acquire` printed (it may start with '-')
    #[arg(allow_hyphen_values = true)]
    token: String,
    /// New time to live, from now
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// The name of the lock
    resource: String,
    /// How long to wait for the nodes' answers
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    timeout: Duration,
}

/// `--quarantine`: a window, or `None` for off.
#[derive(Debug, Clone, Copy)]
struct Quarantine(Option<Duration>);

fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("no time unit: use e.g. {t}s or {t}ms"));
    }
    humantime::parse_duration(t).map_err(|e| e.to_string())
}

fn parse_quarantine(s: &str) -> Result<Quarantine, String> {
    match s.trim() {
        "off" | "none" | "no" | "0" => Ok(Quarantine(None)),
        other => parse_duration(other).map(|d| Quarantine((!d.is_zero()).then_some(d))),
    }
}

/// A failure: the exit code and the one-line message (printed as `redlock: MESSAGE`).
#[derive(Debug)]
pub struct Fail {
    /// The exit code.
    pub code: u8,
    /// What happened, on one line.
    pub message: String,
}

impl Fail {
    /// A failure with its code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    /// A library error, with what was being done.
    pub fn lib(context: &str, e: &Error) -> Fail {
        Fail::new(code_of(e), format!("{context}: {e}"))
    }
}

/// The exit code for a library error.
pub fn code_of(e: &Error) -> u8 {
    match e {
        Error::Config(_) => exit::USAGE,
        Error::Held(_) => exit::HELD,
        Error::NoQuorum(_) | Error::TooSlow(_) | Error::Fence(_) => exit::UNAVAILABLE,
        Error::Auth { .. } | Error::Permission { .. } => exit::AUTH,
        Error::Expired { .. } | Error::ExtensionLimit(_) => exit::LOST,
        Error::Protocol { .. } | Error::Internal(_) => exit::INTERNAL,
        _ => exit::INTERNAL,
    }
}

impl Global {
    /// The servers: `--server`, else `$REDLOCK_SERVERS`.
    fn server_list(&self) -> Result<Vec<String>, Fail> {
        if !self.servers.is_empty() {
            return Ok(self.servers.clone());
        }
        let from_env: Vec<String> = std::env::var("REDLOCK_SERVERS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if from_env.is_empty() {
            return Err(Fail::new(
                exit::USAGE,
                "no servers given: use --server URL (once per Redis master) or set \
                 REDLOCK_SERVERS=URL,URL,...",
            ));
        }
        Ok(from_env)
    }

    /// A builder for these servers with this TTL and the global options.
    fn builder_for(&self, servers: &[String], ttl: Duration) -> Builder {
        let mut b = Builder::new(servers).ttl(ttl);
        if let Some(Quarantine(q)) = self.quarantine {
            b = b.quarantine(q);
        }
        if let Some(t) = self.node_timeout {
            b = b.node_timeout(t);
        }
        b.fencing(self.fence)
    }

    /// A handle on the given servers with this TTL.
    fn redlock(&self, ttl: Duration) -> Result<Redlock, Fail> {
        let servers = self.server_list()?;
        self.builder_for(&servers, ttl)
            .build()
            .map_err(|e| Fail::new(code_of(&e), e.to_string()))
    }
}

/// Acquires `resource`: one attempt, or retries until `wait` runs out.
fn acquire(r: &Redlock, resource: &str, wait: Option<Duration>) -> Result<Lock, Fail> {
    // Connect (and handshake) first, so the one attempt's per-node timeout is spent on the
    // SET alone: a one-shot command against distant masters must not fail on a cold start.
    r.connect(r.config().connect_timeout)
        .map_err(|e| Fail::lib("cannot start", &e))?;
    match wait.filter(|w| !w.is_zero()) {
        None => r
            .try_lock(resource)
            .map_err(|e| Fail::lib(&format!("cannot lock {resource:?}"), &e)),
        Some(w) => r.lock_until(resource, Instant::now() + w).map_err(|e| {
            Fail::lib(
                &format!("cannot lock {resource:?} within {}", fmt_duration(w)),
                &e,
            )
        }),
    }
}

/// `250ms`, `1.5s`, `2m 5s`: a duration as a person writes it.
fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) && d.subsec_millis() != 0 {
        let decimal = format!("{}.{:03}", d.as_secs(), d.subsec_millis());
        format!("{}s", decimal.trim_end_matches('0'))
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

fn cmd_acquire(g: &Global, a: &AcquireArgs) -> Result<u8, Fail> {
    let r = g.redlock(a.ttl)?;
    let lock = acquire(&r, &a.resource, a.wait)?;
    let token = lock.token().to_string();
    let line = match lock.fence() {
        Some(fence) => format!("{token} {fence}"),
        None => token,
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        // Nobody will know the token: do not leave the lock behind.
        let _ = r.unlock(lock);
        return Err(Fail::new(
            exit::INTERNAL,
            "cannot write the token to stdout; released the lock",
        ));
    }
    let fence = lock
        .fence()
        .map_or(String::new(), |f| format!(", fence {f}"));
    say!(
        "redlock: acquired {:?}{fence}, valid for {} ms",
        a.resource,
        lock.validity().as_millis()
    );
    Ok(exit::OK)
}

fn cmd_release(g: &Global, a: &ReleaseArgs) -> Result<u8, Fail> {
    let r = g.redlock(Duration::from_secs(30))?;
    let lock = Lock::from_parts(
        a.resource.as_bytes(),
        a.token.as_bytes(),
        Duration::from_secs(3600),
    )
    .map_err(|e| Fail::new(code_of(&e), e.to_string()))?;
    let n = r.nodes().len();
    let released = r
        .unlock(lock)
        .map_err(|e| Fail::lib(&format!("cannot release {:?}", a.resource), &e))?;
    if released > 0 {
        say!(
            "redlock: released {:?} on {released} of {n} nodes",
            a.resource
        );
        return Ok(exit::OK);
    }
    // Nothing released: tell "not held" apart from "servers not reachable".
    let statuses = r
        .with_client(|c| c.status(a.resource.as_bytes(), Duration::from_secs(1)))
        .map_err(|e| Fail::lib("cannot ask the servers", &e))?;
    check_reachable(&statuses, &format!("cannot release {:?}", a.resource))?;
    Err(Fail::new(
        exit::LOST,
        format!(
            "not released: no node held {:?} with this token (it had expired, or was released \
             or taken over)",
            a.resource
        ),
    ))
}

fn cmd_extend(g: &Global, a: &ExtendArgs) -> Result<u8, Fail> {
    let r = g.redlock(a.ttl)?;
    let mut lock = Lock::from_parts(a.resource.as_bytes(), a.token.as_bytes(), a.ttl)
        .map_err(|e| Fail::new(code_of(&e), e.to_string()))?;
    match r.extend(&mut lock, a.ttl) {
        Ok(()) => {
            say!(
                "redlock: extended {:?}, valid for {} ms",
                a.resource,
                lock.validity().as_millis()
            );
            Ok(exit::OK)
        }
        Err(Error::Held(report)) => Err(Fail::new(
            exit::LOST,
            format!(
                "not extended: {:?} is no longer held with this token ({report})",
                a.resource
            ),
        )),
        Err(e) => Err(Fail::lib(&format!("cannot extend {:?}", a.resource), &e)),
    }
}

/// Fails with 69 (or 77 if credentials were refused) when fewer than a quorum of nodes answered.
fn check_reachable(statuses: &[NodeStatus], context: &str) -> Result<(), Fail> {
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

/// The first characters of a token, for display.
fn token_prefix(value: &[u8]) -> String {
    let s = String::from_utf8_lossy(value);
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(10).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// A node's fence counter for `status`: the number, "(blank)" when it is not seeded for the
/// node's current process, "-" when there is none.
fn fmt_fence(s: &NodeStatus) -> String {
    match s.fence {
        Some(f) if f.counter == 0 && !f.seeded => "-".into(),
        Some(f) if f.seeded => f.counter.to_string(),
        Some(f) => format!("{} (blank)", f.counter),
        None => "?".into(),
    }
}

fn fmt_rtt(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn cmd_status(g: &Global, a: &StatusArgs) -> Result<u8, Fail> {
    // With fencing on, the handshake asks each node's run_id, which tells a seeded counter
    // from a blank one.
    let servers = g.server_list()?;
    let r = g
        .builder_for(&servers, Duration::from_secs(30))
        .fencing(true)
        .build()
        .map_err(|e| Fail::new(code_of(&e), e.to_string()))?;
    let statuses = r
        .with_client(|c| c.status(a.resource.as_bytes(), a.timeout))
        .map_err(|e| Fail::lib("cannot ask the servers", &e))?;
    let n = statuses.len();
    let quorum = n / 2 + 1;
    let mut rows = vec![[
        "NODE".to_owned(),
        "REACHABLE".to_owned(),
        "KEY".to_owned(),
        "TOKEN".to_owned(),
        "PTTL".to_owned(),
        "RTT".to_owned(),
        "FENCE".to_owned(),
    ]];
    // Distinct values held, with the PTTLs of the nodes holding each.
    let mut holders: Vec<(Vec<u8>, Vec<i64>)> = Vec::new();
    for s in &statuses {
        let row = match &s.state {
            Ok((Some(value), pttl)) => {
                match holders.iter_mut().find(|(v, _)| v == value) {
                    Some((_, ttls)) => ttls.push(*pttl),
                    None => holders.push((value.clone(), vec![*pttl])),
                }
                let pttl = match *pttl {
                    -1 => "no expiry".to_owned(),
                    ms if ms < 0 => "-".to_owned(),
                    ms => format!("{ms} ms"),
                };
                [
                    s.node.clone(),
                    "yes".into(),
                    "held".into(),
                    token_prefix(value),
                    pttl,
                    fmt_rtt(s.rtt),
                    fmt_fence(s),
                ]
            }
            Ok((None, _)) => [
                s.node.clone(),
                "yes".into(),
                "free".into(),
                "-".into(),
                "-".into(),
                fmt_rtt(s.rtt),
                fmt_fence(s),
            ],
            Err(f) => [
                s.node.clone(),
                format!("no: {f}"),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ],
        };
        rows.push(row);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            // An unreachable node's reason runs to the end of its line.
            if !cell.starts_with("no:") {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    out.push_str(&format!(
        "{:?} on {n} node{} (quorum {quorum}):\n",
        a.resource,
        if n == 1 { "" } else { "s" }
    ));
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            line.push_str("  ");
            if i == 1 && cell.starts_with("no:") {
                // An unreachable node: the reason takes the rest of the line.
                line.push_str(cell);
                break;
            }
            line.push_str(cell);
            for _ in cell.chars().count()..w {
                line.push(' ');
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let up = statuses.iter().filter(|s| s.state.is_ok()).count();
    holders.sort_by_key(|(_, ttls)| std::cmp::Reverse(ttls.len()));
    match holders.first() {
        Some((value, ttls)) if ttls.len() >= quorum => {
            // The quorum lasts as long as the quorum-th longest PTTL among the holders.
            let mut sorted = ttls.clone();
            sorted.sort_by_key(|&t| std::cmp::Reverse(if t == -1 { i64::MAX } else { t }));
            let left = match sorted[quorum - 1] {
                -1 => "with no expiry".to_owned(),
                ms => format!("for {ms} ms more at most"),
            };
            out.push_str(&format!(
                "held by a quorum: {} of {n} nodes hold token {} (quorum {quorum}), {left}\n",
                ttls.len(),
                token_prefix(value),
            ));
        }
        Some((value, ttls)) => out.push_str(&format!(
            "not held by a quorum: at most {} of {n} nodes agree (token {}), {quorum} needed\n",
            ttls.len(),
            token_prefix(value)
        )),
        None if up >= quorum => out.push_str(&format!("free: no node holds {:?}\n", a.resource)),
        None => out.push_str(&format!(
            "unknown: no reachable node holds {:?}, but only {up} of {n} answered\n",
            a.resource
        )),
    }
    // The fence counters: every fence handed out so far went to a quorum, so the largest
    // counter of any quorum of seeded nodes is at least the last one.
    let seeded: Vec<u64> = statuses
        .iter()
        .filter_map(|s| s.fence.filter(|f| f.seeded).map(|f| f.counter))
        .collect();
    let top = statuses
        .iter()
        .filter_map(|s| s.fence.map(|f| f.counter))
        .max();
    match top {
        Some(0) | None => {}
        Some(top) => out.push_str(&format!(
            "fences: counter {top} at most; {} of {n} counters seeded ({quorum} needed for fenced \
             locks)\n",
            seeded.len()
        )),
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush());
    check_reachable(&statuses, "status")?;
    Ok(exit::OK)
}

/// Prints a clap error as one line (help and version go to stdout in full).
fn usage_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            exit::OK
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            exit::USAGE
        }
        _ => {
            // The first paragraph of clap's message, on one line.
            let rendered = e.render().to_string();
            let first: Vec<&str> = rendered
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            say!("redlock: {first} (see 'redlock --help')");
            exit::USAGE
        }
    }
}

fn real_main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let g = &cli.global;
    let result = match &cli.command {
        Command::Run(a) => run::run(g, a),
        Command::Acquire(a) => cmd_acquire(g, a),
        Command::Release(a) => cmd_release(g, a),
        Command::Extend(a) => cmd_extend(g, a),
        Command::Status(a) => cmd_status(g, a),
        Command::Demo(a) => demo::demo(g, a),
        Command::Bench(a) => demo::bench(g, a),
    };
    match result {
        Ok(code) => code,
        Err(fail) => {
            say!("redlock: {}", fail.message);
            fail.code
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if let (Some(arg), None) = (args.next(), args.next())
        && arg == group::WATCHDOG_ARG
    {
        // `redlock run`'s watchdog process (src/bin/redlock/group.rs), not a subcommand.
        return ExitCode::from(group::watchdog_main());
    }
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_owned());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = what.lines().next().unwrap_or_default().to_owned();
        say!("redlock: internal error: {what}{at}");
    }));
    // Unwinding runs the destructors (local redis-servers are stopped) before we exit.
    let code = std::panic::catch_unwind(real_main).unwrap_or(exit::INTERNAL);
    ExitCode::from(code)
}
