//! `redlock extend`: give a lock `redlock acquire` took a full TTL from now.

use std::time::Duration;

use redlock_mux::Error;
use serde_json::json;

use crate::fail::{Fail, Kind, exit};
use crate::json::unreported_votes_json;
use crate::options::{HeldLock, build};
use crate::text::{NAME_SHOWN, shorten};

pub const HELP: &str = "\
Of the lock options, extend uses all but --fence and the waiting options (-w, -n, -E), which it
ignores; --ttl is the new time to live, from now (default 30s); with --permits, RESOURCE is a
semaphore and the permit TOKEN holds is extended (RESOURCE#i without --permits works too).

Exit codes: 0 extended; 79 RESOURCE is no longer held with TOKEN (it expired, or was taken over);
69 no quorum reachable; 64 usage; 70 internal; 77 authentication refused.";

/// extend's TTL when --ttl is not given: acquire's.
const DEFAULT_TTL: Duration = super::acquire::DEFAULT_TTL;

// (--ttl: the new time to live, from now; the waiting options and --fence are ignored)
pub fn extend(a: &HeldLock) -> Result<u8, Fail> {
    let opts = &a.call.opts;
    let ttl = opts.ttl_or(DEFAULT_TTL);
    let handle = |opts: &crate::options::LockOptions| build(opts.tuned(DEFAULT_TTL)?);
    let (r, resource, mut lock) = a.resolve(handle, opts.answer_timeout(), ttl)?;
    let name = shorten(&resource, NAME_SHOWN);
    match r.extend(&mut lock, ttl) {
        Ok(()) => {
            let validity_ms = lock.validity().as_millis() as u64;
            a.call.output.success(
                || {
                    json!({
                        "ok": true,
                        "command": "extend",
                        "resource": resource,
                        "validity_ms": validity_ms,
                        "ttl_ms": ttl.as_millis() as u64,
                        "nodes": unreported_votes_json(r.nodes().iter()),
                    })
                },
                || format!("extended {name}, valid for {validity_ms} ms"),
            );
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
