//! `redlock`: a distributed `flock(1)` over N independent Redis masters, built on `redlock_mux`.
//!
//! This file parses the arguments and dispatches; each subcommand has a file of its own under
//! `commands/` (the way mini-redis keeps one file per command), and the files beside this one
//! hold what they share, each one thing: the option groups (`options.rs`) and their value
//! parsers (`parse.rs`), the server list (`server_list.rs`), failures and exit codes
//! (`fail.rs`), acquiring under the waiting rule (`waiting.rs`), what RESOURCE arguments name
//! (`names.rs`), the JSON shapes (`json.rs`), text for people (`text.rs`), and COMMAND's
//! process group with its watchdog (`group.rs`). Built only with the `cli` feature: `cargo build --release --features cli`. User
//! documentation: `docs/cli.md`.
//!
//! Every failure is one line on stderr, `redlock: what happened (and on which node)`, and a stable
//! exit code (see [`fail::exit`]). No panic reaches the user: one is reported as an internal
//! error (70).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Subcommand};

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

mod commands;
mod fail;
mod group;
mod json;
mod names;
mod options;
mod parse;
mod server_list;
mod text;
mod usage;
mod waiting;

use commands::{
    acquire, bench, completions, demo, extend, man, release, repair_fences, run, servers, status,
};
use fail::exit;

const MAIN_HELP: &str = "\
Servers:
  --server URL, once per master, or REDLOCK_SERVERS=URL,URL,... (comma separated; --server wins).
  redis://[[user]:password@]host[:port][/db][?protocol=3]
  redis+unix:///path/to/redis.sock[?db=N&username=U&password=P]
  Use an odd number of independent masters (3 or 5); a lock needs a majority of them.
  No servers yet: `redlock servers` starts local ones and prints the REDLOCK_SERVERS line.

Lock options: every subcommand that talks to servers (run, acquire, extend, release, status,
bench) takes the same set (--server, --tls-*, --ttl, --fence, --quarantine, --node-timeout,
--clock-check, --ordered-sets, --set-precedence, --fair, -w, -n, -E) and ignores those it has no use
for, so a script can pass one set to acquire, extend and release. Each is also read from the
environment: REDLOCK_SERVERS, REDLOCK_TLS_CA, REDLOCK_TLS_CERT, REDLOCK_TLS_KEY,
REDLOCK_TLS_SERVER_NAME, REDLOCK_TTL, REDLOCK_FENCING, REDLOCK_QUARANTINE, REDLOCK_NODE_TIMEOUT,
REDLOCK_CLOCK_CHECK, REDLOCK_ORDERED_SETS, REDLOCK_SET_PRECEDENCE, REDLOCK_FAIR,
REDLOCK_WAIT, REDLOCK_NONBLOCK, REDLOCK_CONFLICT_EXIT_CODE; the command line wins.

Waiting (run, acquire): like flock, they wait until the lock is free; -n for one attempt,
-w SECONDS (or 250ms, 2m, inf) for a limit, -E N for the exit code when it stays held.

Exit codes:
  0    success (run: COMMAND's own exit code, or 128+N if a signal N killed it)
  1    status: the lock is not held by a quorum (free, or split between tokens)
  64   usage error: bad flag, bad address, bad duration, no servers given
  69   no quorum of servers reachable (or too slow to leave any validity)
  70   protocol or internal error
  73   man --dir: the pages could not be written
  75   lock not acquired: it is held elsewhere (after the wait; -E changes it)
  77   authentication refused by a server
  78   the servers do not match the configuration (a database they lack)
  79   lock lost while run was running COMMAND (release, extend: not held any more)
  80   lock not acquired: the servers restarted moments ago (restart quarantine); retry later
       (repair-fences: restarted servers are inside the window; retry later)
  126  run: COMMAND could not be started;  127: COMMAND not found
  130  demo, bench: interrupted
A COMMAND that itself exits with 75 or 79 cannot be told from redlock's own codes: give run
-E N and --lost-exit-code N.

Durations: 250ms, 10s, 1m, 1h30m, ... (a unit is required, except for --wait's seconds).
Every subcommand has its own --help.";

/// The last line of `-h`, the short help (each option's first sentence): the long help has the
/// rest, as clap's convention has it.
const MORE_HELP: &str = "More (each option in full, the environment, exit codes): --help";

/// `--help` is wrapped to the terminal's width, but no wider: longer lines are hard to read.
const HELP_WIDTH: usize = 100;

/// A distributed flock(1): run a command while holding a Redlock over N Redis masters.
#[derive(clap::Parser, Debug)]
#[command(
    name = "redlock",
    version,
    after_help = MORE_HELP,
    after_long_help = MAIN_HELP,
    max_term_width = HELP_WIDTH,
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire RESOURCE (waiting for it, as flock does), run COMMAND while keeping the lock
    /// alive, release it, exit with COMMAND's code
    #[command(
        after_help = MORE_HELP,
        after_long_help = run::HELP,
        override_usage = "redlock run [OPTIONS] RESOURCE -- COMMAND [ARGS]...\n       \
                          redlock run [OPTIONS] RESOURCE... -- COMMAND [ARGS]...\n       \
                          redlock run [OPTIONS] RESOURCE -c 'COMMAND LINE'"
    )]
    Run(run::RunArgs),
    /// Acquire RESOURCE (waiting for it); print the token on stdout (with --fence: the token, a
    /// space, the fence), and the validity on stderr
    #[command(after_help = MORE_HELP, after_long_help = acquire::HELP)]
    Acquire(acquire::AcquireArgs),
    /// Release RESOURCE held with TOKEN
    #[command(after_help = MORE_HELP, after_long_help = release::HELP)]
    Release(options::HeldLock),
    /// Extend RESOURCE held with TOKEN to a full TTL from now
    #[command(after_help = MORE_HELP, after_long_help = extend::HELP)]
    Extend(options::HeldLock),
    /// Show what each node holds for RESOURCE; exit 0 if a quorum holds it, 1 if not
    #[command(after_help = MORE_HELP, after_long_help = status::HELP)]
    Status(status::StatusArgs),
    /// Raise and re-seed blank fence counters, so that fenced locks work again after a
    /// majority of the servers restarted; give --at-least N (every fence handed out is at most
    /// N) or --no-floor, unless a quorum of counters is still seeded
    #[command(after_help = MORE_HELP, after_long_help = repair_fences::HELP)]
    RepairFences(repair_fences::RepairFencesArgs),
    /// Start N local redis-servers to try redlock on, print the export line, stop them on Ctrl-C
    #[command(after_help = MORE_HELP, after_long_help = servers::HELP)]
    Servers(servers::ServersArgs),
    /// Start local redis-servers and show competing clients staying mutually exclusive
    Demo(demo::DemoArgs),
    /// Latency percentiles of lock cycles (acquire + release)
    Bench(bench::BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_help = MORE_HELP, after_long_help = completions::HELP)]
    Completions(completions::CompletionsArgs),
    /// Print the man page, or write one per subcommand into a directory
    #[command(after_help = MORE_HELP, after_long_help = man::HELP)]
    Man(man::ManArgs),
}

impl Command {
    /// The subcommand's name, whether it prints JSON, and the resource it is about.
    fn describe(&self) -> (&'static str, bool, Option<&str>) {
        match self {
            Command::Run(a) => ("run", false, Some(&a.resource)),
            Command::Acquire(a) => (
                "acquire",
                a.call.output.json,
                a.resources.first().map(String::as_str),
            ),
            Command::Release(a) => ("release", a.call.output.json, Some(a.resource.as_str())),
            Command::Extend(a) => ("extend", a.call.output.json, Some(a.resource.as_str())),
            Command::Status(a) => (
                "status",
                a.call.output.json,
                a.resources.first().map(String::as_str),
            ),
            Command::RepairFences(a) => ("repair-fences", a.call.output.json, None),
            Command::Servers(_) => ("servers", false, None),
            Command::Demo(_) => ("demo", false, None),
            Command::Bench(_) => ("bench", false, None),
            Command::Completions(_) => ("completions", false, None),
            Command::Man(_) => ("man", false, None),
        }
    }

    /// The lock options, for the subcommands that talk to servers.
    fn lock_options_mut(&mut self) -> Option<&mut options::LockOptions> {
        match self {
            Command::Run(a) => Some(&mut a.opts),
            Command::Acquire(a) => Some(&mut a.call.opts),
            Command::Release(a) | Command::Extend(a) => Some(&mut a.call.opts),
            Command::Status(a) => Some(&mut a.call.opts),
            Command::Bench(a) => Some(&mut a.opts),
            Command::RepairFences(a) => Some(&mut a.call.opts),
            Command::Servers(_) | Command::Demo(_) | Command::Completions(_) | Command::Man(_) => {
                None
            }
        }
    }

    /// Whether `--quiet` was given.
    fn quiet(&self) -> bool {
        match self {
            Command::Run(a) => a.quiet,
            Command::Acquire(a) => a.call.output.quiet,
            Command::Release(a) | Command::Extend(a) => a.call.output.quiet,
            Command::Status(a) => a.call.output.quiet,
            Command::RepairFences(a) => a.call.output.quiet,
            Command::Servers(_)
            | Command::Demo(_)
            | Command::Bench(_)
            | Command::Completions(_)
            | Command::Man(_) => false,
        }
    }
}

/// What clap does not check: flock's `-s` taken for `--server`, `-w` with `-n` (from the command
/// line and the environment, [`options::Waiting::settle`]), and `run`'s resources and COMMAND.
fn settle(cli: &mut Cli, matches: &clap::ArgMatches, args: &[OsString]) -> Result<(), fail::Fail> {
    let servers = cli
        .command
        .lock_options_mut()
        .map(|o| o.servers.servers.clone())
        .unwrap_or_default();
    if let Some(fail) = usage::flock_shared_habit(args, Ok(&servers)) {
        return Err(fail);
    }
    if let (Some(opts), Some((_, sub))) = (cli.command.lock_options_mut(), matches.subcommand()) {
        opts.waiting.settle(sub)?;
    }
    if let Command::Run(a) = &mut cli.command {
        a.resolve(args)?;
    }
    Ok(())
}

fn real_main() -> u8 {
    let args = usage::hoist_leading_options(std::env::args_os().collect());
    let parsed = Cli::command()
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (mut cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            if let Some(fail) = usage::flock_shared_habit(&args, Err(e.kind())) {
                say!("redlock: {}", fail.message);
                return fail.code;
            }
            return usage::usage_error(&e, &args);
        }
    };
    if let Err(fail) = settle(&mut cli, &matches, &args) {
        say!("redlock: {}", fail.message);
        return fail.code;
    }
    let result = match &cli.command {
        Command::Run(a) => run::run(a),
        Command::Acquire(a) => acquire::acquire(a),
        Command::Release(a) => release::release(a),
        Command::Extend(a) => extend::extend(a),
        Command::Status(a) => status::status(a),
        Command::RepairFences(a) => repair_fences::repair_fences(a),
        Command::Servers(a) => servers::servers(a),
        Command::Demo(a) => demo::demo(a),
        Command::Bench(a) => bench::bench(a),
        Command::Completions(a) => completions::completions(a),
        Command::Man(a) => man::man(a),
    };
    match result {
        Ok(code) => code,
        Err(fail) => {
            let (name, json, resource) = cli.command.describe();
            if json {
                json::print_json(&fail.to_json(name, resource));
            }
            if !(cli.command.quiet() && fail.is_held()) {
                say!("redlock: {}", fail.message);
            }
            fail.code
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if let (Some(arg), None) = (args.next(), args.next())
        && arg == group::WATCHDOG_ARG
    {
        // `redlock run`'s watchdog process (group.rs), not a subcommand.
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

// The default window outlasts every subcommand's default TTL.
const _: () = assert!(
    options::DEFAULT_QUARANTINE.as_nanos() >= commands::acquire::DEFAULT_TTL.as_nanos()
        && options::DEFAULT_QUARANTINE.as_nanos() >= commands::run::DEFAULT_TTL.as_nanos()
        && options::DEFAULT_QUARANTINE.as_nanos() >= commands::bench::DEFAULT_TTL.as_nanos()
);
