//! `redlock extend`: give a lock `redlock acquire` took a full TTL from now.

use std::time::Duration;

use clap::Args;
use redlock_mux::{Error, Lock};
use serde_json::json;

use crate::common::{self, Fail, Kind, LockOptions, NAME_SHOWN, Output, exit, print_json, shorten};

pub const HELP: &str = "\
Of the lock options, extend uses all but --fence and the waiting options (-w, -n, -E), which it
ignores; --ttl is the new time to live, from now (default 30s); with --permits, RESOURCE is a
semaphore and the permit TOKEN holds is extended (RESOURCE#i without --permits works too).

Exit codes: 0 extended; 79 RESOURCE is no longer held with TOKEN (it expired, or was taken over);
69 no quorum reachable; 64 usage; 70 internal; 77 authentication refused.";

#[derive(Args, Debug)]
pub struct ExtendArgs {
    /// The name of the lock
    pub resource: String,
    /// The token `redlock acquire` printed (it may start with '-')
    #[arg(allow_hyphen_values = true)]
    pub token: String,
    /// Several resources, the lock that `acquire` or `run` took of all of them:
    /// `RESOURCE RESOURCE... TOKEN` (or the one `redlock:set:…` name they exported)
    #[arg(allow_hyphen_values = true, value_name = "RESOURCE... TOKEN")]
    pub more: Vec<String>,
    #[command(flatten)]
    pub output: Output,
    // (--ttl: the new time to live, from now; the waiting options and --fence are ignored)
    #[command(flatten)]
    pub opts: LockOptions,
}

/// extend's TTL when --ttl is not given: acquire's.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

pub fn extend(a: &ExtendArgs) -> Result<u8, Fail> {
    let (resource, token) =
        crate::common::lock_and_token(&a.resource, &a.token, &a.more, a.opts.shared)?;
    let ttl = a.opts.ttl_or(DEFAULT_TTL);
    let r = common::build(a.opts.tuned(DEFAULT_TTL)?)?;
    let resource = &common::permit_held_by(
        &r,
        &resource,
        a.opts.permits,
        token,
        a.opts.answer_timeout(),
    )?;
    let mut lock = Lock::from_parts(resource.as_bytes(), token.as_bytes(), ttl)
        .map_err(|e| Fail::lib("bad arguments", &e))?;
    let name = shorten(resource, NAME_SHOWN);
    match r.extend(&mut lock, ttl) {
        Ok(()) => {
            let validity_ms = lock.validity().as_millis() as u64;
            if a.output.json {
                print_json(&json!({
                    "ok": true,
                    "command": "extend",
                    "resource": resource,
                    "validity_ms": validity_ms,
                    "ttl_ms": ttl.as_millis() as u64,
                }));
            }
            if !a.output.quiet {
                say!("redlock: extended {name}, valid for {validity_ms} ms");
            }
            Ok(exit::OK)
        }
        Err(e @ Error::Held(_)) => {
            let mut fail = Fail::lib(&format!("{name} is no longer held with this token"), &e);
            fail.code = exit::LOST;
            fail.kind = Kind::Lost;
            Err(fail)
        }
        Err(e) => Err(Fail::lib(&format!("cannot extend {name}"), &e)),
    }
}
