//! `redlock release`: release a lock `redlock acquire` took.

use std::time::Duration;

use clap::Args;
use redlock_mux::Lock;
use serde_json::json;

use crate::common::{
    self, Fail, HANDLE_TTL, LockOptions, NAME_SHOWN, Output, build, check_reachable, exit,
    print_json, shorten,
};

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

#[derive(Args, Debug)]
pub struct ReleaseArgs {
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
    // (release uses the servers, the TLS options and --node-timeout, default 50ms; it ignores
    // the others)
    #[command(flatten)]
    pub opts: LockOptions,
}

pub fn release(a: &ReleaseArgs) -> Result<u8, Fail> {
    let (resource, token) =
        crate::common::lock_and_token(&a.resource, &a.token, &a.more, a.opts.shared)?;
    let servers = a.opts.servers.list()?;
    let mut b = a
        .opts
        .servers
        .builder(&servers)
        .ttl(HANDLE_TTL)
        .quarantine(None);
    if let Some(t) = a.opts.tuning.node_timeout {
        b = b.node_timeout(t);
    }
    let r = build(b)?;
    let resource = &common::permit_held_by(&r, &resource, a.opts.permits, token, STATUS_TIMEOUT)?;
    let lock = Lock::from_parts(resource.as_bytes(), token.as_bytes(), RELEASED_VALIDITY)
        .map_err(|e| Fail::lib("bad arguments", &e))?;
    let n = r.nodes().len();
    let name = shorten(resource, NAME_SHOWN);
    let released = r
        .unlock(lock)
        .map_err(|e| Fail::lib(&format!("cannot release {name}"), &e))?;
    if released > 0 {
        if a.output.json {
            print_json(&json!({
                "ok": true,
                "command": "release",
                "resource": resource,
                "released": released,
                "nodes": n,
            }));
        }
        if !a.output.quiet {
            say!("redlock: released {name} on {released} of {n} nodes");
        }
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
