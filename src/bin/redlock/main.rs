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
mod waiting;

use commands::{
    acquire, bench, completions, demo, extend, man, release, repair_fences, run, status,
};
use fail::exit;

const MAIN_HELP: &str = "\
Servers:
  --server URL, once per master, or REDLOCK_SERVERS=URL,URL,... (comma separated; --server wins).
  redis://[[user]:password@]host[:port][/db][?protocol=3]
  redis+unix:///path/to/redis.sock[?db=N&username=U&password=P]
  Use an odd number of independent masters (3 or 5); a lock needs a majority of them.

Lock options: every subcommand that talks to servers (run, acquire, extend, release, status,
bench) takes the same set (--server, --tls-*, --ttl, --fence, --quarantine, --node-timeout, -w,
-n, -E) and ignores those it has no use for, so a script can pass one set to acquire, extend and
release. Each is also read from the environment: REDLOCK_SERVERS, REDLOCK_TLS_CA,
REDLOCK_TLS_CERT, REDLOCK_TLS_KEY, REDLOCK_TLS_SERVER_NAME, REDLOCK_TTL, REDLOCK_FENCING,
REDLOCK_QUARANTINE, REDLOCK_NODE_TIMEOUT, REDLOCK_WAIT, REDLOCK_NONBLOCK,
REDLOCK_CONFLICT_EXIT_CODE; the command line wins.

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

/// `--help` is wrapped to the terminal's width, but no wider: longer lines are hard to read.
const HELP_WIDTH: usize = 100;

/// A distributed flock(1): run a command while holding a Redlock over N Redis masters.
#[derive(clap::Parser, Debug)]
#[command(
    name = "redlock",
    version,
    after_help = MAIN_HELP,
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
        after_help = run::HELP,
        override_usage = "redlock run [OPTIONS] RESOURCE -- COMMAND [ARGS]...\n       \
                          redlock run [OPTIONS] RESOURCE... -- COMMAND [ARGS]...\n       \
                          redlock run [OPTIONS] RESOURCE -c 'COMMAND LINE'"
    )]
    Run(run::RunArgs),
    /// Acquire RESOURCE (waiting for it); print the token on stdout (with --fence: the token, a
    /// space, the fence), and the validity on stderr
    #[command(after_help = acquire::HELP)]
    Acquire(acquire::AcquireArgs),
    /// Release RESOURCE held with TOKEN
    #[command(after_help = release::HELP)]
    Release(options::HeldLock),
    /// Extend RESOURCE held with TOKEN to a full TTL from now
    #[command(after_help = extend::HELP)]
    Extend(options::HeldLock),
    /// Show what each node holds for RESOURCE; exit 0 if a quorum holds it, 1 if not
    #[command(after_help = status::HELP)]
    Status(status::StatusArgs),
    /// Raise and re-seed blank fence counters, so that fenced locks work again after a
    /// majority of the servers restarted; give --at-least N (every fence handed out is at most
    /// N) or --no-floor, unless a quorum of counters is still seeded
    #[command(after_help = repair_fences::HELP)]
    RepairFences(repair_fences::RepairFencesArgs),
    /// Start local redis-servers and show competing clients staying mutually exclusive
    Demo(demo::DemoArgs),
    /// Latency percentiles of lock cycles (acquire + release)
    Bench(bench::BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_help = completions::HELP)]
    Completions(completions::CompletionsArgs),
    /// Print the man page, or write one per subcommand into a directory
    #[command(after_help = man::HELP)]
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
            Command::Demo(_) | Command::Completions(_) | Command::Man(_) => None,
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
            Command::Demo(_) | Command::Bench(_) | Command::Completions(_) | Command::Man(_) => {
                false
            }
        }
    }
}

/// The options that came before the subcommand in versions where they were global
/// (`redlock --server URL --quarantine off run …`) are moved behind it, so that those command
/// lines keep working; so are the other lock options ([`options::LockOptions`]), which every
/// subcommand that talks to servers takes.
fn hoist_leading_options(args: Vec<OsString>) -> Vec<OsString> {
    const WITH_VALUE: [&str; 14] = [
        "-s",
        "--server",
        "--quarantine",
        "--node-timeout",
        "--ttl",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
        "--tls-server-name",
        "-w",
        "--wait",
        "--timeout",
        "-E",
        "--conflict-exit-code",
    ];
    const FLAGS: [&str; 4] = ["--fence", "-n", "--nonblock", "--nb"];
    let mut lead = Vec::new();
    let mut i = 1;
    while let Some(arg) = args.get(i).and_then(|a| a.to_str()) {
        // `--ttl=20s`, `-s URL` written `-sURL`, `-w5`, `-E3`.
        let attached = WITH_VALUE.iter().any(|o| {
            arg.strip_prefix(o).is_some_and(|rest| {
                if o.starts_with("--") {
                    rest.starts_with('=')
                } else {
                    !rest.is_empty()
                }
            })
        });
        if WITH_VALUE.contains(&arg) {
            lead.extend(args.get(i..i + 2).into_iter().flatten().cloned());
            i += 2;
        } else if attached || FLAGS.contains(&arg) {
            lead.push(args[i].clone());
            i += 1;
        } else {
            break;
        }
    }
    if lead.is_empty() || i >= args.len() {
        return args;
    }
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend(lead);
    out.extend(args[i + 1..].iter().cloned());
    out
}

/// Prints a clap error as one line (help and version go to stdout in full), pointing to the
/// help of the subcommand it is about.
fn usage_error(e: &clap::Error, args: &[OsString]) -> u8 {
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
            let rendered = e.render().to_string();
            // The first paragraph of clap's message, on one line.
            let first: Vec<&str> = rendered
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            // "Usage: redlock run [OPTIONS] …": the help to point to is that subcommand's.
            let help = rendered
                .lines()
                .find_map(|l| l.trim().strip_prefix("Usage: "))
                .map(|usage| {
                    usage
                        .split_whitespace()
                        .take_while(|w| !w.starts_with(['[', '<', '-']))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .filter(|cmd| cmd.starts_with("redlock "))
                .or_else(|| {
                    // No usage line (an invalid value): the subcommand named on the command line.
                    let names = Cli::command();
                    let names: Vec<&str> = names.get_subcommands().map(|c| c.get_name()).collect();
                    args.iter()
                        .filter_map(|a| a.to_str())
                        .find(|a| names.contains(a))
                        .map(|name| format!("redlock {name}"))
                })
                .unwrap_or_else(|| "redlock".to_owned());
            say!("redlock: {first} (see '{help} --help')");
            exit::USAGE
        }
    }
}

fn real_main() -> u8 {
    let args = hoist_leading_options(std::env::args_os().collect());
    let parsed = Cli::command()
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (mut cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return usage_error(&e, &args),
    };
    // -w and -n from the command line and the environment (see `Waiting::settle`).
    if let (Some(opts), Some((_, sub))) = (cli.command.lock_options_mut(), matches.subcommand())
        && let Err(fail) = opts.waiting.settle(sub)
    {
        say!("redlock: {}", fail.message);
        return fail.code;
    }
    if let Command::Run(a) = &mut cli.command
        && let Err(fail) = a.resolve(&args)
    {
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
