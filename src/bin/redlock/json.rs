//! The shapes of `--json`: each node's vote, as every subcommand prints it (docs/cli.md, "JSON").

use redlock_mux::{Lock, LockVote, NodeVote, Report};
use serde_json::{Value, json};

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
