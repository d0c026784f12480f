//! `redlock servers [N]`: local redis-servers to try the other subcommands on, until Ctrl-C.
//! It prints the `export REDLOCK_SERVERS=…` line to paste into another shell, and stops the
//! servers (their directories removed) on SIGINT, SIGTERM or SIGHUP, or when one of them exits.

use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use clap::Args;
use redis_local::Cluster;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::demo::{local_servers, version};
use crate::fail::{Fail, exit};
use crate::options::DEFAULT_QUARANTINE;
use crate::parse::count;
use crate::text::fmt_duration;

pub const HELP: &str = "\
Starts N redis-servers (default 3) on free ports of 127.0.0.1, each in a temporary directory,
without persistence, and prints on stdout the line that points the other subcommands at them:

  export REDLOCK_SERVERS=redis://127.0.0.1:PORT,redis://127.0.0.1:PORT,...

Paste it into another shell and try `redlock run`, `acquire`, `status` there. The servers are
fresh: for their first 30s a lock is refused (the restart quarantine, exit 80), unless
--quarantine off is given, which is safe for servers that never held a lock (not for servers
that may have restarted: see --help of run).

Ctrl-C (SIGINT), SIGTERM or SIGHUP stops the servers and removes their directories; so does
the exit of any of them. Needs redis-server on the PATH (or $REDIS_SERVER).

Exit codes: 0 stopped by a signal; 64 usage; 69 the servers could not be started, or one of
them exited; 70 internal.";

#[derive(Args, Debug)]
pub struct ServersArgs {
    /// How many redis-servers to start (1 to 15)
    #[arg(value_name = "N", default_value_t = 3, value_parser = |s: &str| count(s, 1, 15))]
    count: u16,
}

/// How often the servers are looked at between signals: a server that exited (killed, out of
/// memory) is noticed within this, and the others stopped with it.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

pub fn servers(a: &ServersArgs) -> Result<u8, Fail> {
    // Before the servers start: a signal from then on stops them, it does not kill us.
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| {
        Fail::new(
            exit::INTERNAL,
            format!("cannot install signal handlers: {e}"),
        )
    })?;
    // Started on this thread, which they die with (redis-local ties them to it).
    let mut local = local_servers(usize::from(a.count))?;
    announce(&local);
    let (tx, rx) = mpsc::channel();
    let handle = signals.handle();
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let _ = tx.send(signal);
        }
    });
    let outcome = loop {
        match rx.recv_timeout(HEALTH_CHECK) {
            Ok(_) | Err(RecvTimeoutError::Disconnected) => break Ok(exit::OK),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(gone) = local.iter_mut().position(|s| !s.is_running()) {
            break Err(Fail::new(
                exit::UNAVAILABLE,
                format!(
                    "the server on {} exited; stopped the others",
                    local[gone].addr()
                ),
            ));
        }
    };
    handle.close();
    let n = local.len();
    drop(local);
    if outcome.is_ok() {
        say!("redlock: stopped the {n} servers and removed their directories");
    }
    outcome
}

/// The export line on stdout (flushed: a script reads it while the servers run), and on
/// stderr each server, where its files are, and what to do next.
fn announce(local: &Cluster) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "export REDLOCK_SERVERS={}", local.urls().join(","))
        .and_then(|()| stdout.flush());
    say!("redlock: started {} {}:", local.len(), version(local));
    for s in local.iter() {
        say!("  {} (pid {}) in {}", s.addr(), s.pid(), s.dir().display());
    }
    say!(
        "redlock: paste the export line into another shell; fresh servers refuse a lock for \
         their first {} (the restart quarantine) unless --quarantine off is given. Ctrl-C stops \
         them",
        fmt_duration(DEFAULT_QUARANTINE)
    );
}
