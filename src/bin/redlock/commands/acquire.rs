//! `redlock acquire`: take the lock for a script, print its token (and fence).

use std::io::Write;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::common::{
    self, Fail, NAME_SHOWN, Output, Servers, Tuning, Waiting, exit, parse_duration, shorten,
};

pub const HELP: &str = "\
Waits until the lock is free, as flock does: -n for one attempt, -w for a limit. The token goes
to stdout (--json: one object with token, fence, validity_ms); pass it to `redlock release` or
`redlock extend`. Without them the lock expires after --ttl.

Exit codes: 0 acquired; 75 held elsewhere (or -E's code); 80 the servers restarted moments ago
(restart quarantine); 69 no quorum reachable; 64 usage; 70 internal; 77 authentication refused;
78 the servers do not match the configuration.";

#[derive(Args, Debug)]
pub struct AcquireArgs {
    /// The name of the lock (the Redis key)
    pub resource: String,
    #[command(flatten)]
    pub servers: Servers,
    /// Lock time to live: without `extend` or `release` it expires after this
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    #[command(flatten)]
    pub waiting: Waiting,
    /// Fencing tokens: the acquisition also gets a fence, a number greater than that of every
    /// acquisition completed before it (one more round trip)
    #[arg(long)]
    pub fence: bool,
    #[command(flatten)]
    pub tuning: Tuning,
    #[command(flatten)]
    pub output: Output,
}

pub fn acquire(a: &AcquireArgs) -> Result<u8, Fail> {
    let r = common::build(a.servers.tuned(&a.tuning, a.ttl)?.fencing(a.fence))?;
    let lock = common::acquire(&r, &a.resource, &a.waiting, a.output.quiet)?;
    let token = lock.token().to_string();
    let validity_ms = lock.validity().as_millis() as u64;
    let line = if a.output.json {
        json!({
            "ok": true,
            "command": "acquire",
            "resource": a.resource,
            "token": token,
            "fence": lock.fence(),
            "validity_ms": validity_ms,
            "ttl_ms": a.ttl.as_millis() as u64,
            "nodes": common::lock_votes_json(&lock),
            "warning": common::unreachable_warning(&lock),
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
    if !a.output.quiet {
        let fence = lock
            .fence()
            .map_or(String::new(), |f| format!(", fence {f}"));
        say!(
            "redlock: acquired {}{fence}, valid for {validity_ms} ms",
            shorten(&a.resource, NAME_SHOWN)
        );
        common::warn_unreachable(&lock);
    }
    Ok(exit::OK)
}
