//! What the engine counts and tells of each decided operation: into the metrics (`model/stats.rs`)
//! and as an event (`model/event.rs`). (Each reply's count is `op.rs`'s, where replies arrive.)

use std::time::{Duration, Instant};

use crate::engine::queue::WaitReason;
use crate::engine::request::Outcome;
use crate::model::addr::NodeAddr;
use crate::model::error::Error;
use crate::model::event::event;
use crate::model::lock::Votes;
use crate::model::stats::{self, Ending, Metrics};

use super::op::Op;
use super::{OpKind, Waiter};

/// Counts a decided operation (acquire, extend, a release somebody waits for) and tells its
/// event.
pub(super) fn observe(
    metrics: &Metrics,
    nodes: &[NodeAddr],
    op: &Op,
    outcome: &Outcome,
    now: Instant,
) {
    let latency = now.saturating_duration_since(op.start);
    let ending = |e: &Error| match e {
        Error::Held(_) => Ending::Refused,
        Error::NoQuorum(_) => Ending::NoQuorum,
        _ => Ending::Failed,
    };
    match (op.kind, outcome) {
        (OpKind::Acquire, Outcome::Acquired(Ok(grant))) => {
            metrics.op(stats::OpKind::Acquire, Ending::Ok, latency);
            if !matches!(op.waiter, Waiter::Attempt(_)) {
                // A waiting acquire's is told when its attempt is applied, with its attempts.
                acquired_event(nodes, &op.resource, 1, latency, grant.votes);
            }
        }
        (OpKind::Acquire, Outcome::Acquired(Err(e))) => {
            metrics.op(stats::OpKind::Acquire, ending(e), latency);
            failed_event(&op.resource, "acquire", e);
        }
        (OpKind::Extend, Outcome::Extended(_, Ok(_))) => {
            metrics.op(stats::OpKind::Extend, Ending::Ok, latency);
            event!(Debug, event = "extended", resource:% = op.resource.escape_ascii(),
                latency_us = latency.as_micros() as u64;
                "{}: extended in {latency:?}", op.resource.escape_ascii());
        }
        (OpKind::Extend, Outcome::Extended(_, Err(e))) => {
            metrics.op(stats::OpKind::Extend, ending(e), latency);
            failed_event(&op.resource, "extend", e);
        }
        (OpKind::Release, Outcome::Released(released)) if !matches!(op.waiter, Waiter::None) => {
            let ending = if *released > 0 {
                Ending::Ok
            } else {
                Ending::Refused
            };
            metrics.op(stats::OpKind::Release, ending, latency);
            event!(Debug, event = "released", resource:% = op.resource.escape_ascii(),
                released = *released, latency_us = latency.as_micros() as u64;
                "{}: released on {released} node(s) in {latency:?}", op.resource.escape_ascii());
        }
        _ => {}
    }
}

/// The event of an acquire that won: after how many attempts and how long, and which nodes
/// said yes, refused, or were unreachable.
#[cfg_attr(not(feature = "log"), allow(unused_variables))]
pub(super) fn acquired_event(
    nodes: &[NodeAddr],
    resource: &[u8],
    attempts: u32,
    latency: Duration,
    votes: Votes,
) {
    event!(Debug, event = "acquired", resource:% = resource.escape_ascii(), attempts = attempts,
        latency_us = latency.as_micros() as u64, yes = votes.yes(), nodes = votes.nodes(),
        unreachable = votes.unreachable();
        "{}: acquired after {attempts} attempt(s) in {latency:?}; yes from {}{}",
        resource.escape_ascii(), crate::model::event::NodeList(nodes, votes, crate::LockVote::Yes),
        crate::model::event::Unreachable(nodes, votes));
}

/// The event of a wait that goes on, and why (`reason`), said once and again when the reason
/// changes (`engine/wait.rs`).
#[cfg_attr(not(feature = "log"), allow(unused_variables))]
pub(super) fn waiting_event(resource: &[u8], reason: WaitReason, waited: Duration, e: &Error) {
    let resource = resource.escape_ascii();
    event!(Info, event = "waiting", resource:% = resource, reason = reason.name(),
        waited_ms = waited.as_millis() as u64;
        "{resource}: still waiting after {} ms: {e}", waited.as_millis());
}

/// The event of an acquire or extend that failed: held elsewhere (`debug`: routine under
/// contention), no quorum (`warn`, each node's fault), anything else (`info`).
#[cfg_attr(not(feature = "log"), allow(unused_variables))]
fn failed_event(resource: &[u8], what: &'static str, e: &Error) {
    let resource = resource.escape_ascii();
    match (what, e) {
        ("acquire", Error::Held(_)) => {
            event!(Debug, event = "refused", resource:% = resource; "{resource}: {e}");
        }
        (_, Error::NoQuorum(_)) => {
            event!(Warn, event = "no_quorum", resource:% = resource, operation = what;
                "{resource}: {what}: {e}");
        }
        ("acquire", _) => {
            event!(Info, event = "acquire_failed", resource:% = resource; "{resource}: {e}");
        }
        _ => {
            event!(Info, event = "extend_failed", resource:% = resource; "{resource}: {e}");
        }
    }
}
