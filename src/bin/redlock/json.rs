//! The shapes of `--json` (docs/cli.md, "JSON"). Every object's `nodes` is an array with one
//! object per server, in the order of the server list, each naming its server (`node`,
//! `host:port`): `acquire`, `release`, `extend` and every failure give its vote and fault,
//! `status` and `repair-fences` what each server holds. An empty array: no server was asked
//! (a usage error).

use redlock_mux::{Lock, LockVote, NodeAddr, NodeVote, Report};
use serde_json::{Value, json};

/// The nodes of a failure: each with its vote when the library reported them, else none.
pub fn failure_nodes(report: Option<&Report>) -> Value {
    report.map_or_else(|| Value::Array(Vec::new()), votes_json)
}

/// Every node of an operation the library answers with a count alone (`release`, `extend`):
/// each named, its vote `null` (not reported).
pub fn unreported_votes_json<'a>(nodes: impl Iterator<Item = &'a NodeAddr>) -> Value {
    nodes
        .map(|node| json!({"node": node.to_string(), "vote": Value::Null, "fault": Value::Null}))
        .collect()
}

/// Milliseconds with two decimals (10 µs): finer is noise in a round trip, and a reader or a
/// script gets `5.42`, not `5.4248769999999995`.
pub fn round_ms(ms: f64) -> f64 {
    (ms * MS_DECIMALS).round() / MS_DECIMALS
}

/// 10², for [`round_ms`]'s two decimals.
const MS_DECIMALS: f64 = 100.0;

/// Every node of a report with its vote, for `--json`.
pub fn votes_json(report: &Report) -> Value {
    report
        .votes()
        .map(|(node, vote)| {
            let (vote, fault) = match vote {
                NodeVote::Yes => ("yes", None),
                NodeVote::Refused => ("refused", None),
                NodeVote::Failed(f) => ("failed", Some(f.to_string())),
                _ => ("not_waited_for", None),
            };
            json!({"node": node.to_string(), "vote": vote, "fault": fault})
        })
        .collect()
}

/// Every node of a lock just acquired with its vote, for `--json`: the same objects as
/// [`votes_json`] (`fault` is null), `vote` one of `yes`, `refused`, `unreachable`, `failed`,
/// `not_waited_for`.
pub fn lock_votes_json(lock: &Lock) -> Value {
    lock.nodes()
        .map(|(node, vote)| {
            let vote = match vote {
                LockVote::Yes => "yes",
                LockVote::Refused => "refused",
                LockVote::Unreachable => "unreachable",
                LockVote::Failed => "failed",
                _ => "not_waited_for",
            };
            json!({"node": node.to_string(), "vote": vote, "fault": Value::Null})
        })
        .collect()
}

/// Prints one JSON object on stdout (write errors ignored, as with `out!`).
pub fn print_json(value: &Value) {
    out!("{value}");
}
