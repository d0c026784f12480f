//! `redlock release`: release a lock `redlock acquire` took.

use std::time::Duration;

use serde_json::json;

use crate::fail::{Fail, check_reachable, exit};
use crate::json::unreported_votes_json;
use crate::options::{HANDLE_TTL, HeldLock, build};
use crate::text::{NAME_SHOWN, shorten};

pub const HELP: &str = "\
Of the lock options, release uses the servers, the TLS options, --node-timeout (default 50ms)
and --permits (RESOURCE is a semaphore: the permit TOKEN holds is released; RESOURCE#i without
--permits works too), and ignores the others.

Exit codes: 0 released (on at least one node); 79 no node held RESOURCE with TOKEN (it expired,
or was released or taken over); 69 fewer than a quorum of nodes reachable; 64 usage; 70 internal;
77 authentication refused.";

/// How long `release` waits for the nodes' answers when it asks whether anybody held the lock.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// The validity given to the lock rebuilt from RESOURCE and TOKEN, which `release` cannot know:
/// the library answers `Expired` for a lock whose validity ran out before the release was sent,
/// and an hour is far longer than any release takes.
const RELEASED_VALIDITY: Duration = Duration::from_secs(3600);

// (release uses the servers, the TLS options and --node-timeout, default 50ms; it ignores the
// others)
pub fn release(a: &HeldLock) -> Result<u8, Fail> {
    let handle = |opts: &crate::options::LockOptions| {
        let servers = opts.servers.list()?;
        let mut b = opts
            .servers
            .builder(&servers)
            .ttl(HANDLE_TTL)
            .quarantine(None);
        if let Some(t) = opts.tuning.node_timeout {
            b = b.node_timeout(t);
        }
        build(b)
    };
    let (r, resource, lock) = a.resolve(handle, STATUS_TIMEOUT, RELEASED_VALIDITY)?;
    let n = r.nodes().len();
    let name = shorten(&resource, NAME_SHOWN);
    let released = r
        .unlock(lock)
        .map_err(|e| Fail::lib(&format!("cannot release {name}"), &e))?;
    if released > 0 {
        a.call.output.success(
            || {
                json!({
                    "ok": true,
                    "command": "release",
                    "resource": resource,
                    "released": released,
                    "nodes": unreported_votes_json(r.nodes().iter()),
                })
            },
            || format!("released {name} on {released} of {n} nodes"),
        );
        return Ok(exit::OK);
    }
    // Nothing released: tell "not held" apart from "servers not reachable".
    let statuses = r
        .with_client(|c| c.status(resource.as_bytes(), STATUS_TIMEOUT))
        .map_err(|e| Fail::lib("cannot ask the servers", &e))?;
    check_reachable(&statuses, &format!("cannot release {name}"))?;
    Err(Fail::new(
        exit::LOST,
        format!(
            "not released: no node held {name} with this token (it had expired, or was released \
             or taken over)"
        ),
    ))
}
