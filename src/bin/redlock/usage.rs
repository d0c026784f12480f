//! The command line around clap: options written before the subcommand moved behind it,
//! flock(1)'s habits recognised and answered in this tool's terms, and clap's errors said on
//! one line that points to the right `--help`.

use std::ffi::OsString;

use clap::CommandFactory;
use clap::error::ErrorKind;

use crate::Cli;
use crate::fail::{Fail, exit};

/// The options that came before the subcommand in versions where they were global
/// (`redlock --server URL --quarantine off run …`) are moved behind it, so that those command
/// lines keep working; so are the other lock options ([`LockOptions`](crate::options::LockOptions)), which every
/// subcommand that talks to servers takes.
pub fn hoist_leading_options(args: Vec<OsString>) -> Vec<OsString> {
    const WITH_VALUE: [&str; 16] = [
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
        "--clock-check",
        "--set-precedence",
    ];
    const FLAGS: [&str; 7] = [
        "--fence",
        "--fair",
        "-n",
        "--nonblock",
        "--nb",
        "--ordered-sets",
        "--count-evicting-servers-unsafely",
    ];
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
pub fn usage_error(e: &clap::Error, args: &[OsString]) -> u8 {
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

/// What every server address has (`redis://`, `rediss://`, `redis+unix://`), and flock's lock
/// names do not.
const URL_SCHEME: &str = "://";

/// flock's `-s` (a shared lock) is `--server` here: `redlock run -s job -- make` takes `job` for
/// a server. Recognised when a value given with the short `-s` (before any `--`: COMMAND's own
/// `-s` is COMMAND's) has no URL scheme: no server address is written without one (a URL
/// that does not parse is said as such),
/// and clap found a required argument missing (`job` was taken from the positionals: clap's
/// own message names COMMAND or RESOURCE, not the cause), or parsed it all (`redlock run -s
/// job make all`: the address error would not say it either; the value must then be one clap
/// took for `--server`, as a `-s` of COMMAND's written without `--` is not). `parsed`: the
/// server values clap parsed, or clap's error.
pub fn flock_shared_habit(args: &[OsString], parsed: Result<&[String], ErrorKind>) -> Option<Fail> {
    if parsed.is_err_and(|k| k != ErrorKind::MissingRequiredArgument) {
        return None;
    }
    let mut words = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--");
    while let Some(word) = words.next() {
        let value = match word.strip_prefix("-s") {
            Some("") => words.next().map(|v| v.into_owned()),
            Some(attached) if !word.starts_with("--") => Some(attached.to_owned()),
            _ => None,
        };
        if let Some(value) = value
            && !value.contains(URL_SCHEME)
            && parsed.map_or(true, |servers| servers.contains(&value))
        {
            return Some(Fail::new(
                exit::USAGE,
                format!(
                    "-s is --server here; a shared lock is --shared (-r) ({} is no server \
                     address)",
                    crate::text::shorten(&value, crate::text::NAME_SHOWN)
                ),
            ));
        }
    }
    None
}
