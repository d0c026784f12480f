//! An extend: the compare-and-pexpire script (`EXTEND_BODY`) on every node, within the lock's
//! validity. Its round (`votes.rs`) is decided like an acquire's — at quorum, or when its node
//! timeout passes (`Engine::round_decision`: the nodes still silent then fail with a timeout);
//! its outcome is made here. A lost extend still cuts the lock's validity to what the nodes
//! that ran it back ([`validity_after_lost_extend`]).

use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome};
use crate::model::error::Refusal;
use crate::model::round::{Decision, Round, RoundConfig};
use crate::proto::resp::Arg;
use crate::proto::scripts::{EXTEND_SCRIPT, SET_EXTEND_SCRIPT, SHARED_EXTEND_SCRIPT};

use super::{Engine, OpKind, shaped_call};

impl<N: Net> Engine<N> {
    /// Starts the round of extend `id` (of a lock valid until `valid_until`, backed by the
    /// nodes in `backing`, for `ttl` more) and queues its requests to the nodes in `targets`.
    pub(super) fn start_extend(
        &mut self,
        id: OpId,
        (ttl, valid_until, backing): (Duration, Instant, u64),
        targets: u64,
        now: Instant,
    ) {
        let p = self.parts();
        let config = &p.shared.config;
        let op = &mut p.core.ops[id.index as usize];
        op.kind = OpKind::Extend;
        op.until = valid_until;
        op.backing = backing;
        let rc = RoundConfig {
            not_after: Some(valid_until),
            ..config.round(ttl, config.node_timeout_for(ttl))
        };
        op.vote.start(now, &rc);
        let args = [
            Arg::Bytes(op.token.as_bytes()),
            Arg::UInt(ttl.as_millis() as u64),
        ];
        let scripts = [EXTEND_SCRIPT, SET_EXTEND_SCRIPT, SHARED_EXTEND_SCRIPT];
        let call = shaped_call(p.scratch, id.tag(), &op.resource, scripts, &args);
        p.core.send_script(p.net, (id, call), targets, now);
    }

    /// The outcome of extend `index`'s decided round: the new validity, or the error with the
    /// validity the lock keeps.
    pub(super) fn extend_decided(&self, index: usize, decision: Decision) -> Outcome {
        let op = &self.core.ops[index];
        match decision {
            Decision::Won { valid_until, .. } => {
                Outcome::Extended(valid_until, Ok(op.vote.yes_bits()))
            }
            Decision::Lost { loss, .. } => {
                let refused = op.vote.refused_bits();
                // The nodes that said yes hold our token past the old validity.
                let backing = match op.backing {
                    0 => 0,
                    known => known | op.vote.yes_bits(),
                };
                let valid_until = if still_backed(backing, refused, &op.vote.round) {
                    validity_after_lost_extend(op.until, &op.vote.round)
                } else {
                    // Refused where the lock needs its keys: no longer held as believed.
                    op.start.min(op.until)
                };
                Outcome::Extended(
                    valid_until,
                    Err(op
                        .vote
                        .loss_error(&self.shared.nodes, loss, Refusal::TokenGone)),
                )
            }
        }
    }
}

/// Whether a lock backed by the nodes in `backing` still is after the nodes in `refused` said
/// our token is gone from them: while the backing nodes that did not refuse make a quorum,
/// every rival's quorum meets one of them, which holds our token until the validity ends.
/// When they do not, a rival may hold the lock now — on the nodes that refused and others —
/// and the lock's validity ends at the extend's start (the refusals came after it; when the
/// keys went, nobody can say). Without this, a caller told `Held` by its extend still had
/// `is_valid()` for the rest of the old validity while a rival held the lock (found by
/// review). With the backing not known (0: a lock rebuilt from its parts, or of another server
/// list), any refusal ends it — counting every node that did not refuse, a node that never had
/// our token (down at the acquire) would stand for one that lost it (as a kept lock's
/// renewals judge: `Report::still_backed`).
fn still_backed(backing: u64, refused: u64, round: &Round) -> bool {
    if backing == 0 {
        return refused == 0;
    }
    (backing & !refused).count_ones() as usize >= round.quorum()
}

/// The validity a lock keeps after an extend that was sent and did not win.
///
/// Nodes that ran the compare-and-pexpire — in time, late, or after resuming from a freeze with
/// the command still queued — now expire the key at least `ttl` after they ran it, and sooner
/// than before only where the script had to fall back to a plain `PEXPIRE` (before Redis 7,
/// an ACL user without `+pttl`: see `EXTEND_BODY`). All of them ran it after the round's start,
/// so the key lives on each of them at least until `start + ttl − drift` (the round's
/// `valid_until`), and on the others until the old deadline: the lock is safe until the smaller
/// of the two, never longer.
pub(super) fn validity_after_lost_extend(old: Instant, round: &Round) -> Instant {
    round.valid_until().map_or(old, |backed| old.min(backed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::round::Vote;

    #[test]
    fn a_lost_extend_keeps_the_smaller_of_the_old_validity_and_what_its_round_backs() {
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        let old = now + Duration::from_secs(3);
        let mut round = Round::new(3);
        let rc = RoundConfig {
            not_after: Some(old),
            ..RoundConfig::new(ttl, 0.01, Duration::from_millis(50))
        };
        round.start(now, &rc);
        // One yes, then the node timeout: lost, the round backs `start + ttl − drift` on the
        // node that ran it, beyond the old validity: the old one stays.
        round.handle_vote(0, Vote::Yes, now);
        round.handle_timeout(now + Duration::from_millis(50));
        assert!(matches!(round.poll_decision(), Some(Decision::Lost { .. })));
        assert_eq!(validity_after_lost_extend(old, &round), old);
        // A lock about to end anyway: its end is never moved later.
        let soon = now + Duration::from_millis(10);
        assert_eq!(validity_after_lost_extend(soon, &round), soon.min(old));
    }
}
