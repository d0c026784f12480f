//! How a subcommand fails: the exit codes (stable, documented), the kind of failure `--json`
//! names, the one-line message, and how a library error maps onto them.

use redlock_mux::{Error, NodeFault, NodeStatus, Report};
use serde_json::{Value, json};

use crate::json::failure_nodes;

/// The exit codes: stable, documented in `--help`, the README and `docs/cli.md`. They follow
/// `sysexits.h` where it has a meaning for the case.
pub mod exit {
    /// Success (for `run`: COMMAND's own exit code).
    pub const OK: u8 = 0;
    /// `status`: the lock is not held by a quorum (free, or split between tokens).
    pub const NOT_HELD: u8 = 1;
    /// Usage error: bad flag, bad address, bad duration, no servers.
    pub const USAGE: u8 = 64;
    /// No quorum of servers reachable (or they answered too slowly to leave any validity).
    pub const UNAVAILABLE: u8 = 69;
    /// Protocol or internal error.
    pub const INTERNAL: u8 = 70;
    /// `man --dir`: the pages could not be written (`EX_CANTCREAT`).
    pub const CANNOT_WRITE: u8 = 73;
    /// Not acquired: the lock is held elsewhere (after the wait); `-E` changes it.
    pub const HELD: u8 = 75;
    /// A server refused our credentials.
    pub const AUTH: u8 = 77;
    /// The servers do not match the configuration: a database they do not have, or one server
    /// listed twice under two names.
    pub const CONFIG: u8 = 78;
    /// The lock was lost while `run` ran COMMAND (`release` / `extend`: no longer held).
    pub const LOST: u8 = 79;
    /// Not acquired: the servers restarted moments ago and are in their restart quarantine.
    pub const QUARANTINED: u8 = 80;
    /// `run`: COMMAND was found but could not be started.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `run`: COMMAND was not found.
    pub const NOT_FOUND: u8 = 127;
    /// Interrupted by SIGINT (128 + 2), for `demo` and `bench`.
    pub const INTERRUPTED: u8 = 130;
}

/// What kind of failure, for the decisions that depend on it (`--quiet`, whether waiting can
/// help) and for `--json`'s `error` field. The exit code does not tell it: `-E` changes the one
/// for a lock held elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Usage,
    Config,
    Held,
    NoQuorum,
    Quarantined,
    Auth,
    Lost,
    Internal,
}

impl Kind {
    /// The name in `--json` (documented in docs/cli.md).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Usage => "usage",
            Kind::Config => "config",
            Kind::Held => "held",
            Kind::NoQuorum => "no_quorum",
            Kind::Quarantined => "quarantined",
            Kind::Auth => "auth",
            Kind::Lost => "lost",
            Kind::Internal => "internal",
        }
    }
}

/// A failure: the exit code and the one-line message (printed as `redlock: MESSAGE`).
#[derive(Debug)]
pub struct Fail {
    /// The exit code.
    pub code: u8,
    /// What happened, on one line.
    pub message: String,
    /// What kind of failure (named in `--json`).
    pub kind: Kind,
    /// The node-by-node report, when the library gave one.
    pub report: Option<Box<Report>>,
    /// `acquire --json`: why the wait went on, each reason it gave (`waited`); `None` for
    /// the other commands, whose objects have no such field.
    pub waited: Option<Value>,
}

impl Fail {
    /// A failure with its code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Fail {
        let kind = match code {
            exit::USAGE => Kind::Usage,
            exit::CONFIG => Kind::Config,
            exit::UNAVAILABLE => Kind::NoQuorum,
            exit::AUTH => Kind::Auth,
            exit::LOST => Kind::Lost,
            _ => Kind::Internal,
        };
        Fail {
            code,
            message: message.into(),
            kind,
            report: None,
            waited: None,
        }
    }

    /// A library error, with what was being done.
    pub fn lib(context: &str, e: &Error) -> Fail {
        Fail {
            message: format!("{context}: {e}"),
            ..Fail::of(e)
        }
    }

    /// A library error that says what it is itself: a configuration error ("invalid
    /// configuration: …", found before anything was sent) found in the options or the names
    /// given, with no prefix of ours, so that one prefix says it wherever it comes from.
    pub fn of(e: &Error) -> Fail {
        let (code, kind) = classify(e);
        Fail {
            code,
            message: e.to_string(),
            kind,
            report: e.report().cloned().map(Box::new),
            waited: None,
        }
    }

    /// "Held elsewhere": the failure `--quiet` does not print (the exit code says it).
    pub fn is_held(&self) -> bool {
        self.kind == Kind::Held
    }

    /// The failure as one JSON object, for `--json`.
    pub fn to_json(&self, command: &str, resource: Option<&str>) -> Value {
        let mut object = json!({
            "ok": false,
            "command": command,
            "resource": resource,
            "exit_code": self.code,
            "error": self.kind.name(),
            "message": self.message,
            "nodes": failure_nodes(self.report.as_deref()),
        });
        if let Some(waited) = &self.waited {
            object["waited"] = waited.clone();
        }
        object
    }
}

/// The exit code for a library error.
pub fn code_of(e: &Error) -> u8 {
    classify(e).0
}

/// The exit code and the `--json` kind of a library error.
pub fn classify(e: &Error) -> (u8, Kind) {
    let config = e
        .report()
        .is_some_and(|r| r.failed().any(|(_, f)| is_config_fault(f)));
    match e {
        Error::Config(_)
        | Error::ReservedName { .. }
        | Error::AlreadyHeld { .. }
        | Error::PermitCount { .. } => (exit::USAGE, Kind::Usage),
        _ if config => (exit::CONFIG, Kind::Config),
        Error::Held(_) => (exit::HELD, Kind::Held),
        Error::NoQuorum(_) | Error::TooSlow(_) | Error::Fence(_) => {
            (exit::UNAVAILABLE, Kind::NoQuorum)
        }
        Error::Auth { .. } | Error::Permission { .. } => (exit::AUTH, Kind::Auth),
        Error::Expired { .. } | Error::ExtensionLimit(_) | Error::Lost(_) => {
            (exit::LOST, Kind::Lost)
        }
        _ => (exit::INTERNAL, Kind::Internal),
    }
}

/// A node fault that no retry mends: the servers do not match the configuration (a database
/// they do not have, one server listed twice under two names, a certificate the TLS options
/// do not accept, a server that may evict keys).
pub fn is_config_fault(f: &NodeFault) -> bool {
    matches!(
        f.root(),
        NodeFault::Database { .. }
            | NodeFault::Duplicate { .. }
            | NodeFault::Tls(_)
            | NodeFault::Evicting(_)
    )
}

/// Fails with 69 (or 77 if credentials were refused) when fewer than a quorum of nodes answered.
pub fn check_reachable(statuses: &[NodeStatus], context: &str) -> Result<(), Fail> {
    let quorum = statuses.len() / 2 + 1;
    let up = statuses.iter().filter(|s| s.state.is_ok()).count();
    if up >= quorum {
        return Ok(());
    }
    let mut why = String::new();
    let mut auth = false;
    for s in statuses {
        if let Err(f) = &s.state {
            auth |= matches!(f.root(), NodeFault::Auth(_));
            why.push_str(&format!("; {}: {f}", s.node));
        }
    }
    let code = if auth { exit::AUTH } else { exit::UNAVAILABLE };
    Err(Fail::new(
        code,
        format!(
            "{context}: only {up} of {} nodes reachable, {quorum} needed{why}",
            statuses.len()
        ),
    ))
}
