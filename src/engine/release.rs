//! A release: the compare-and-delete script on every node (with the notice for waiters:
//! `RELEASE_BODY`; without it: `QUIET_RELEASE_BODY`). Every node gets it; a caller waiting for
//! it waits for each node at most its grace. A release whose connection failed or refused it
//! goes into the ledger (`ledger.rs`). The releases of lost acquires go out here too
//! ([`Engine::release_lost`]).

use std::time::{Duration, Instant};

use crate::engine::net::Net;
use crate::engine::request::{OpId, Outcome, ReqKind};
use crate::model::error::NodeFault;
use crate::model::round::deadline_after;
use crate::model::token::Token;
use crate::proto::resp::{Arg, Frame};
use crate::proto::scripts::{
    QUIET_RELEASE_SCRIPT, RELEASE_SCRIPT, SET_RELEASE_SCRIPT, SHARED_RELEASE_SCRIPT, ScriptCall,
};
use bytes::BytesMut;

use super::{Engine, OpKind, Waiter, node_bit, nodes_in, shaped_call};

/// A release waits for a node still answering earlier requests this many of the last round's
/// durations (at least a tenth of the node timeout, at most all of it, and never under
/// `MIN_RELEASE_GRACE`): a healthy straggler makes it.
const RELEASE_GRACE_ROUNDS: u32 = 4;
const RELEASE_GRACE_FLOOR_SHARE: u32 = 10;
const MIN_RELEASE_GRACE: Duration = Duration::from_millis(1);

/// Per node, for a release: until when its answer is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Answered, failed, or not waited for.
    No,
    /// Waited for until then; `behind` if it still owed earlier replies when the release was
    /// sent (so missing the deadline marks it slow).
    Until(Instant, bool),
}

/// A release's state.
#[derive(Debug)]
pub(super) struct Release {
    pub wait: Vec<Wait>,
    /// The nodes that deleted our key, as a set and a count.
    pub counted: u64,
    pub released: usize,
}

impl Release {
    pub fn new(n: usize) -> Release {
        Release::build(Vec::new(), n)
    }

    /// A release's state as [`Release::new`] makes it, in `self`'s buffer.
    pub fn rebuilt(self, n: usize) -> Release {
        Release::build(self.wait, n)
    }

    fn build(mut wait: Vec<Wait>, n: usize) -> Release {
        wait.clear();
        wait.resize(n, Wait::No);
        Release {
            wait,
            counted: 0,
            released: 0,
        }
    }

    pub fn reset(&mut self) {
        self.counted = 0;
        self.released = 0;
        self.wait.fill(Wait::No);
    }

    /// The earliest grace still running.
    pub fn deadline(&self) -> Option<Instant> {
        (self.wait.iter())
            .filter_map(|w| match w {
                Wait::Until(t, _) => Some(*t),
                Wait::No => None,
            })
            .min()
    }

    /// Ends the graces that have passed at `now` (a node that was behind and missed its grace
    /// is marked in `slow`); the outcome once none is left.
    pub fn graces(&mut self, slow: &mut [bool], now: Instant) -> Option<Outcome> {
        let mut open = false;
        for (node, wait) in self.wait.iter_mut().enumerate() {
            if let Wait::Until(t, behind) = *wait {
                if t <= now {
                    *wait = Wait::No;
                    if behind {
                        slow[node] = true;
                    }
                } else {
                    open = true;
                }
            }
        }
        (!open).then_some(Outcome::Released(self.released))
    }

    /// Node `node`'s answer was taken back (it came with surplus frames or garbage).
    pub fn withdraw(&mut self, node: usize) {
        if self.counted & node_bit(node) != 0 {
            self.counted &= !node_bit(node);
            self.released -= 1;
        }
    }

    /// Node `node` answered `frame`: it deleted our key if the answer is odd (1 + 2 × the
    /// clients our release notice reached: see `RELEASE_BODY`). Returns those clients, if our
    /// key was deleted there.
    pub fn answered(&mut self, node: usize, frame: &Frame<'_>) -> Option<u64> {
        self.wait[node] = Wait::No;
        match frame {
            Frame::Integer(answer) if answer & 1 == 1 && self.counted & node_bit(node) == 0 => {
                self.counted |= node_bit(node);
                self.released += 1;
                Some((answer >> 1) as u64)
            }
            _ => None,
        }
    }
}

impl<N: Net> Engine<N> {
    /// Queues release `id` to the nodes in `targets`. It waits for each node for a while only
    /// if somebody waits for it: every node gets the release, but a node still answering
    /// earlier requests gets a short grace, and one that missed it before is not waited for
    /// until it has caught up.
    pub(super) fn start_release(&mut self, id: OpId, targets: u64, now: Instant) {
        let Engine {
            net,
            core,
            scratch,
            shared,
            last_round,
            quiet_release,
            exact_release,
            replay_until,
            waits,
            ..
        } = self;
        let config = &shared.config;
        let op = &mut core.ops[id.index as usize];
        op.kind = OpKind::Release;
        op.until =
            (replay_until.take()).unwrap_or_else(|| deadline_after(now, config.longest_ttl()));
        // With the notice for waiters, or without it (see `Config::release_notices`, and
        // `Engine::quiet_release`).
        let quiet = std::mem::take(quiet_release) || !config.release_notices;
        // A set's lock is released by its token's family: every member its acquisition set,
        // whichever attempt of a wait set it (a member held since an earlier step of the
        // ordered acquisition, `wait.rs`, holds that step's variant of the token). Not a lost
        // attempt's cleanup: a later attempt of the same wait may hold the keys by now. The
        // family is the token kept for the release, so that a release sent again after a
        // reconnect (the ledger's) deletes what the first one would have.
        if !std::mem::take(exact_release) && crate::model::keys::set_members(&op.resource).is_some()
        {
            op.token = op.token.family();
        }
        let me = super::notice::subscribed_to(waits, &op.resource);
        let call = release_call(scratch, id.tag(), &op.resource, &op.token, quiet, me);
        let timeout = config.node_timeout_for(config.ttl);
        // At least a tenth of the node timeout (5 ms by default): a healthy straggler on a
        // loaded machine makes it; a slow node pays it once, then is not waited for.
        let floor = (timeout / RELEASE_GRACE_FLOOR_SHARE).max(MIN_RELEASE_GRACE);
        let grace = (*last_round * RELEASE_GRACE_ROUNDS).clamp(floor, timeout);
        let waited = !matches!(op.waiter, Waiter::None);
        for node in nodes_in(targets) {
            let behind = net.session(node).pending() > 0;
            if !behind {
                core.slow[node] = false;
            }
            let sent = net.script(node, call, now, &mut core.sink());
            let ok = sent.is_ok();
            core.sent(id, node, sent, now);
            if ok && waited && !core.slow[node] {
                let until = if behind { now + grace } else { now + timeout };
                core.ops[id.index as usize].release.wait[node] = Wait::Until(until, behind);
            }
        }
    }

    /// Releases everywhere at once the acquires lost in this turn (`lost`: each with whether
    /// it had won the lock, for nobody, or lost its round) — refused and
    /// silent nodes too, since a late yes may still come — without anybody waiting for the
    /// replies; quietly (no notice) on the nodes in their restart quarantine
    /// (see `Engine::quiet_release`).
    ///
    /// Every lost acquire's resource and token are copied out before the first release is
    /// submitted: the acquires' slots may already be free, and a release may get the slot of a
    /// lost acquire whose own release is still to come (it once did, and released the first
    /// token twice and the second never: its keys lived out their TTL).
    pub(super) fn release_lost(&mut self, now: Instant) {
        let mut resources = std::mem::take(&mut self.resource);
        let mut releases = std::mem::take(&mut self.releases);
        resources.clear();
        releases.clear();
        let n = self.shared.nodes.len();
        for &(index, won) in &self.lost {
            let op = &self.core.ops[index as usize];
            let start = resources.len();
            // A lock won for nobody by a waiting acquire is released as a lock is, by its
            // family (`start_release`); the attempt of a step of a set's ordered acquisition
            // (`wait.rs`) deletes only the member it waited for, holding exactly its token: the
            // members before it are the wait's, held for its next attempt; every other lost
            // attempt, its own keys.
            let exact = op.kind != OpKind::Wait;
            match crate::model::keys::set_prefix(&op.resource, usize::from(op.step)) {
                Some((_, member)) if exact => resources.extend_from_slice(member),
                _ => resources.extend_from_slice(&op.resource),
            }
            let quiet = quiet_nodes(&op.vote.faults, won, n);
            releases.push((start, resources.len(), op.token, quiet, exact));
            // Copied: its slot may go now (`Engine::settle` kept it), once nothing holds it.
            let op = &mut self.core.ops[index as usize];
            if op.done && op.outstanding == 0 && op.outcome.is_none() {
                op.renewing = None;
                self.core.free_slot(index as usize);
            }
        }
        let all = self.all_nodes();
        for &(start, end, token, quiet, exact) in &releases {
            // Not `submit`: a lost attempt's release does not hand the resource to a waiter.
            for (targets, silently) in [(all & !quiet, false), (quiet, true)] {
                if targets == 0 {
                    continue;
                }
                self.quiet_release = silently;
                self.exact_release = exact;
                let resource = &resources[start..end];
                self.submit_to(
                    ReqKind::Release,
                    resource,
                    &token,
                    Waiter::None,
                    targets,
                    now,
                );
                self.quiet_release = false;
                self.exact_release = false;
            }
        }
        self.resource = resources;
        self.releases = releases;
    }
}

/// A release's script call for `resource`, with the notice for waiters unless `quiet` (see
/// `Config::release_notices` and `Engine::quiet_release`). A plain lock's notice is its
/// script's (two scripts); a set's or a reader's, its last argument.
///
/// `me`: the engine is subscribed to the resource's notices itself (a queue of our callers for
/// it, waiting or lingering, or one on the same channel), so the notice counts the clients that
/// wait without us. Only then does a plain release with notices carry the argument that says so
/// (its uncontended bytes stay the same). What the engine believes, not what each connection
/// has: on a node where a subscription is still on its way (a connection just made, a RESP2 one
/// being switched) the count is one short — at worst 0, and two waiters that then attempt at
/// once split the votes and pause as after any split.
fn release_call<'a>(
    scratch: &'a mut BytesMut,
    tag: u64,
    resource: &[u8],
    token: &Token,
    quiet: bool,
    me: bool,
) -> ScriptCall<'a> {
    let plain = if quiet {
        QUIET_RELEASE_SCRIPT
    } else {
        RELEASE_SCRIPT
    };
    let scripts = [plain, SET_RELEASE_SCRIPT, SHARED_RELEASE_SCRIPT];
    let token = Arg::Bytes(token.as_bytes());
    if crate::model::keys::is_one_key(resource) {
        if me && !quiet {
            return shaped_call(scratch, tag, resource, scripts, &[token, Arg::Bytes(b"1")]);
        }
        return shaped_call(scratch, tag, resource, scripts, &[token]);
    }
    let notices = Arg::Bytes(match (quiet, me) {
        (true, _) => b"0",
        (false, false) => b"1",
        (false, true) => b"2",
    });
    shaped_call(scratch, tag, resource, scripts, &[token, notices])
}

/// The nodes where the cleanup of a lost acquire goes without its notice. A round that did not
/// win a quorum of yes votes (refused, split, no quorum) held the resource nowhere a waiter
/// could win it: its cleanup is quiet on every node. Heard by our own subscription, such a
/// notice brought our next attempt at once — with a yes that came after the round was lost (a
/// node where the holder's key had gone), one attempt per round trip for as long as the holder
/// held it, no backoff (`tests/contention.rs`). Other clients' waiters lose nothing they could
/// have won; in a split, the contenders' own pauses bring their next attempts. A lock won for
/// nobody (its caller gone, or won too late) is released with its notice, since others wait for
/// it — but quietly on nodes in their restart quarantine, whose yes counted for nobody. Which
/// of the two it is was decided with the outcome (`won`): the ballot's votes do not tell it — a
/// waiting operation runs no round of its own (its slot holds what its last occupant left), and
/// a fenced acquire's write-back restarts the round — and read from them, a lock held on a
/// quorum was released quietly, and another client's waiter slept until its poll.
fn quiet_nodes(faults: &[Option<NodeFault>], won: bool, n: usize) -> u64 {
    match won {
        false => crate::model::round::all_nodes(n),
        true => (0..n)
            .filter(|&i| {
                matches!(
                    faults[i].as_ref().map(NodeFault::root),
                    Some(NodeFault::Quarantined(_))
                )
            })
            .fold(0, |m, i| m | node_bit(i)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_waits_for_each_node_until_its_grace_and_marks_a_straggler_slow() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut release = Release::new(3);
        release.wait[0] = Wait::Until(now + ms(5), false);
        release.wait[1] = Wait::Until(now + ms(1), true);
        let mut slow = [false; 3];
        // Node 2 is not waited for; node 0 answers (deleted: 1 + 2 × 2 listeners).
        assert_eq!(release.answered(0, &Frame::Integer(5)), Some(2));
        assert_eq!(release.deadline(), Some(now + ms(1)));
        assert!(
            release.graces(&mut slow, now).is_none(),
            "node 1 still has its grace"
        );
        // Node 1 misses its grace: behind when the release went out, so now slow.
        let outcome = release.graces(&mut slow, now + ms(1));
        assert!(matches!(outcome, Some(Outcome::Released(1))), "{outcome:?}");
        assert_eq!(slow, [false, true, false]);
        // The same answer twice counts once; a withdrawn one not at all; 0 is "not ours".
        assert_eq!(release.answered(0, &Frame::Integer(1)), None);
        assert_eq!(release.answered(2, &Frame::Integer(0)), None);
        release.withdraw(0);
        assert_eq!((release.counted, release.released), (0, 0));
    }

    #[test]
    fn a_release_call_carries_the_notice_and_says_when_the_releaser_listens() {
        let token = Token::from_bytes(&[7; 20]).unwrap();
        let mut buf = BytesMut::new();
        let all = crate::proto::scripts::scripts();
        // (script, the call's last argument) for a resource, quiet or not, subscribed or not.
        let mut call = |resource: &[u8], quiet: bool, me: bool| {
            let call = release_call(&mut buf, 1, resource, &token, quiet, me);
            let script = (0..all.len()).find(|&i| std::ptr::eq(call.script, &all[i]));
            let last = call
                .tail
                .rsplit(|&b| b == b'\n')
                .nth(1)
                .unwrap_or(&[])
                .to_vec();
            (
                script.unwrap(),
                String::from_utf8_lossy(&last).trim_end().to_owned(),
            )
        };
        let token = String::from_utf8_lossy(token.as_bytes()).into_owned();
        // A plain lock: the quiet script, or the one with the notice; "1" only when we listen
        // too and the notice goes (an uncontended release's bytes are unchanged).
        assert_eq!(
            call(b"r", true, true),
            (QUIET_RELEASE_SCRIPT, token.clone())
        );
        assert_eq!(call(b"r", false, false), (RELEASE_SCRIPT, token.clone()));
        assert_eq!(call(b"r", false, true), (RELEASE_SCRIPT, "1".into()));
        // A set and a reader: their own scripts, the notice switch last: 0 quiet, 1 with the
        // notice, 2 with it and the releaser counted out.
        let set = crate::model::keys::encode_set(&["a", "b"], |_| Ok(())).unwrap();
        let reader = format!("{}r", crate::model::keys::SHARED_PREFIX).into_bytes();
        for (resource, script) in [(&set, SET_RELEASE_SCRIPT), (&reader, SHARED_RELEASE_SCRIPT)] {
            assert_eq!(call(resource, true, true), (script, "0".into()));
            assert_eq!(call(resource, false, false), (script, "1".into()));
            assert_eq!(call(resource, false, true), (script, "2".into()));
        }
    }
}
