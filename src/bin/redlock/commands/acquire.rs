//! `redlock acquire`: take the lock for a script, print its token (and fence).

use std::io::Write;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::fail::{Fail, exit};
use crate::json::lock_votes_json;
use crate::options::{CallOptions, build};
use crate::text::{NAME_SHOWN, shorten};
use crate::waiting::{self, unreachable_warning, warn_unreachable};

pub const HELP: &str = "\
Waits until the lock is free, as flock does: -n for one attempt, -w for a limit. The token goes
to stdout (--json: one object with token, fence, validity_ms); pass it to `redlock release` or
`redlock extend`. Without them the lock expires after --ttl.

With --permits P, RESOURCE is a counting semaphore (at most P holders): the lock taken is a free
permit, RESOURCE#i, named on stderr (--json: \"lock\"); release and extend take RESOURCE#i, or
RESOURCE with the same --permits.

Exit codes: 0 acquired; 75 held elsewhere (or -E's code); 80 the servers restarted moments ago
(restart quarantine); 69 no quorum reachable; 64 usage; 70 internal; 77 authentication refused;
78 the servers do not match the configuration.";

#[derive(Args, Debug)]
pub struct AcquireArgs {
    /// The name of the lock (the Redis key); several names: all of them or none, as one lock
    #[arg(required = true, num_args = 1.., value_name = "RESOURCE")]
    pub resources: Vec<String>,
    #[command(flatten)]
    pub call: CallOptions,
}

/// acquire's TTL when --ttl is not given: nothing keeps the lock alive, so long enough for a
/// script's step between two `extend`s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

pub fn acquire(a: &AcquireArgs) -> Result<u8, Fail> {
    let CallOptions { output, opts } = &a.call;
    let ttl = opts.ttl_or(DEFAULT_TTL);
    // The owner: the process that called acquire holds the lock once it has exited.
    let caller = u32::try_from(nix::unistd::getppid().as_raw()).unwrap_or(0);
    let tuned = opts.owned(opts.tuned(DEFAULT_TTL)?, caller, "redlock acquire");
    let r = build(tuned.fencing(opts.fence))?;
    let resource = opts.lock_name(&a.resources)?;
    let mut told = Vec::new();
    let waited = |told: &[waiting::Said]| told.iter().map(waiting::Said::to_json).collect();
    let lock = waiting::acquire_telling(
        &r,
        &resource,
        opts.permits,
        &opts.waiting,
        output.quiet,
        &mut told,
    )
    .map_err(|mut fail| {
        fail.waited = Some(waited(&told));
        fail
    })?;
    // RESOURCE, or with --permits the permit's key, RESOURCE#i.
    let held = String::from_utf8_lossy(lock.resource()).into_owned();
    let token = lock.token().to_string();
    let validity_ms = lock.validity().as_millis() as u64;
    let line = if output.json {
        json!({
            "ok": true,
            "command": "acquire",
            "resource": resource,
            "lock": held,
            "token": token,
            "fence": lock.fence(),
            "validity_ms": validity_ms,
            "ttl_ms": ttl.as_millis() as u64,
            "nodes": lock_votes_json(&lock),
            "warning": unreachable_warning(&lock),
            "waited": waited(&told),
        })
        .to_string()
    } else {
        match lock.fence() {
            Some(fence) => format!("{token} {fence}"),
            None => token,
        }
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
    if !output.quiet {
        let fence = lock
            .fence()
            .map_or(String::new(), |f| format!(", fence {f}"));
        say!(
            "redlock: acquired {}{fence}, valid for {validity_ms} ms",
            shorten(&held, NAME_SHOWN)
        );
        warn_unreachable(&lock);
    }
    Ok(exit::OK)
}
