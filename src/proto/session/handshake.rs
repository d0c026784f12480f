//! The handshake of a connection, pipelined in its first write: `HELLO 3` (or `AUTH`), `SELECT`,
//! `CLIENT SETNAME`, `INFO server` and `INFO memory` — only those the address and the settings
//! call for — and what each answer means: the requests wait for the steps that gate them, and a
//! refusal fails the connection with a fault that says which step and why.

use std::time::Instant;

use crate::model::addr::NodeAddr;
use crate::model::config::InfoNeed;
use crate::model::error::NodeFault;
use crate::model::wire::ErrorKind;
use crate::proto::info::{parse_info, parse_memory};
use crate::proto::resp::{self, AggregateKind, Arg, Frame, ServerError};

use super::{Kind, Pending, Phase, Sending, Session, State, is_transient};

/// Handshake steps, in the order they are pipelined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `HELLO 3 [AUTH user pass]`: answered with a RESP3 map.
    Hello,
    /// `AUTH [user] pass`: answered `+OK`.
    Auth,
    /// `SELECT db`: answered `+OK`.
    Select,
    /// `CLIENT SETNAME name`: answered `+OK`.
    SetName,
    /// `INFO server`: answered with a bulk (or verbatim) string.
    Info,
    /// `INFO memory` (the eviction policy): the same, asked and needed as `INFO server` is.
    Memory,
}

impl Step {
    /// The command, as error messages name it.
    fn command(self) -> &'static str {
        match self {
            Step::Hello => "HELLO",
            Step::Auth => "AUTH",
            Step::Select => "SELECT",
            Step::SetName => "CLIENT SETNAME",
            Step::Info => "INFO server",
            Step::Memory => "INFO memory",
        }
    }

    /// True when `frame` is the kind of answer this step gets from a real server. Anything else
    /// (an `INFO` answered `+OK`, a `HELLO` answered `:1`) is a server that does not speak the
    /// protocol, and fails the handshake.
    fn accepts(self, frame: &Frame<'_>) -> bool {
        match self {
            // A RESP3 map, the proof that the connection speaks RESP3 from here on (the engine
            // subscribes on it for that). A RESP2 array is `HELLO 2`'s answer: a server (or a
            // proxy) that answers `HELLO 3` so stays in RESP2, where a subscribed connection's
            // messages are arrays that FIFO matching would take for replies.
            Step::Hello => {
                matches!(frame, Frame::Aggregate(a) if a.kind() == AggregateKind::Map)
            }
            Step::Auth | Step::Select | Step::SetName => matches!(frame, Frame::Simple("OK")),
            Step::Info | Step::Memory => matches!(frame, Frame::Bulk(_) | Frame::Verbatim { .. }),
        }
    }
}

impl Session {
    /// The handshake, pipelined in the first write: one round trip, whatever it contains.
    pub(super) fn queue_handshake(&mut self, now: Instant) {
        let addr = &self.addr;
        let st = &mut self.st;
        let mut steps = 0;
        let mut push = |step: Step, args: &[Arg<'_>]| {
            resp::encode_command(&mut st.out, args);
            st.pending.push_back(Pending {
                kind: Kind::Handshake(step),
                tag: 0,
                sent: now,
                tail: 0,
                argc: 0,
                sending: Sending::First,
                eval: false,
            });
            steps += 1;
        };
        login(addr, &mut push);
        if addr.db != 0 {
            push(Step::Select, &["SELECT".into(), u64::from(addr.db).into()]);
        }
        if let Some(name) = &self.config.settings.client_name {
            let args = ["CLIENT".into(), "SETNAME".into(), name.as_str().into()];
            push(Step::SetName, &args);
        }
        if self.config.info != InfoNeed::Off {
            push(Step::Info, &["INFO".into(), "server".into()]);
            if self.config.memory {
                push(Step::Memory, &["INFO".into(), "memory".into()]);
            }
            if self.config.info == InfoNeed::Wanted {
                // Not a gate: the requests follow them in the same write, without waiting for
                // their answers, which come before theirs.
                steps -= 1 + usize::from(self.config.memory);
            }
        }
        self.st.handshake_left = steps;
    }
}

impl State {
    pub(super) fn on_handshake(&mut self, step: Step, frame: Frame<'_>, now: Instant) {
        // `INFO server` or `INFO memory` refused while not needed: carry on without (the node's
        // process, or its eviction policy, unknown).
        let tolerated = matches!(step, Step::Info | Step::Memory)
            && self.info_need == InfoNeed::Wanted
            && matches!(frame, Frame::Error(_));
        if let Frame::Error(e) = frame
            && !tolerated
        {
            self.failure = Some(self.refused(step, e));
            return;
        }
        if !tolerated && !step.accepts(&frame) {
            self.failure = Some(unexpected_answer(step, &frame));
            return;
        }
        // A tolerated error leaves the process, or the eviction policy, unknown.
        let text = match frame {
            Frame::Bulk(b) | Frame::Verbatim { text: b, .. } => b,
            _ => &[],
        };
        match step {
            Step::Info => self.read_info(text, now),
            Step::Memory => self.eviction = parse_memory(text),
            _ => {}
        }
        // Wanted only, `INFO` is not one of the steps the requests wait for.
        let gates =
            !matches!(step, Step::Info | Step::Memory) || self.info_need != InfoNeed::Wanted;
        if gates {
            self.step_done();
        }
    }

    /// The fault of a handshake step the server refused with `e`.
    fn refused(&self, step: Step, e: ServerError<'_>) -> NodeFault {
        let message = crate::model::error::clipped(e.message);
        match (step, e.kind) {
            // A server too busy to take us yet, whatever the step: its first answer (a
            // connection over `maxclients` gets this one line, then is closed), or a step
            // refused while it loads or runs a script. Not the address's fault, so not final: a
            // caller that waits keeps waiting (read as bad credentials or a bad database, `lock`
            // gave up).
            (_, kind) if is_transient(kind, e.message) => NodeFault::Server(kind, message),
            // Any refusal of `AUTH` is of the credentials (Redis before 6 says
            // `-ERR invalid password`).
            (Step::Auth, _) => NodeFault::Auth(message),
            (Step::Hello, kind) if kind.is_auth() => NodeFault::Auth(message),
            // `HELLO` unknown (Redis before 6), `-NOPROTO`: the server does not speak RESP3,
            // which no credentials mend.
            (Step::Hello, _) => NodeFault::Unexpected(format!(
                "-{message} in answer to HELLO 3 (protocol=3: the server does not speak \
                 RESP3; use protocol 2)"
            )),
            // Logged in, but the ACL user may not run this step.
            (_, ErrorKind::NoPerm) => NodeFault::Permission {
                command: step.command(),
                message,
            },
            (_, kind) if kind.is_auth() => NodeFault::Auth(message),
            // No such database (or none to select): the address is wrong, not the node.
            (Step::Select, _) => NodeFault::Database {
                db: self.db,
                message,
            },
            (_, kind) => NodeFault::Server(kind, message),
        }
    }

    /// What `INFO server` said: which process answers, how often that changed on this session,
    /// and how long it has been up.
    fn read_info(&mut self, text: &[u8], now: Instant) {
        self.info = parse_info(text, now);
        if let Some(info) = self.info.as_mut() {
            if self.last_run_id.is_some_and(|last| last != info.run_id) {
                self.run_id_changes = self.run_id_changes.saturating_add(1);
            }
            self.last_run_id = Some(info.run_id);
            if !self.mutation.run_id_on_yes_only() {
                info.changes = self.run_id_changes;
            }
            if self.mutation.uptime_at_its_word() {
                // The defect brought back: the second the quarantine takes off, put back.
                info.uptime = info
                    .uptime
                    .map(|up| up.saturating_add(crate::proto::quarantine::UPTIME_ROUNDING));
            }
        }
    }

    /// A step the requests wait for went through: the last one makes the connection ready.
    fn step_done(&mut self) {
        self.handshake_left = self.handshake_left.saturating_sub(1);
        if self.handshake_left == 0 {
            self.phase = Phase::Ready;
            self.came_up();
            // Only now has the connection proven itself: a node that refuses the handshake is
            // retried after the backoff, not at once by every operation.
            self.replied = true;
            // The handshake went through: the requests held back may go now.
            if self.out.is_empty() {
                std::mem::swap(&mut self.out, &mut self.held);
            } else {
                self.out.extend_from_slice(&self.held);
                self.held.clear();
            }
        }
    }
}

/// The fault of a handshake step answered with a frame of the wrong kind, described from a
/// bounded prefix of it (a megabyte of `_` nested in arrays would otherwise be made into
/// ~350K owned values and their whole text on every reconnect).
fn unexpected_answer(step: Step, frame: &Frame<'_>) -> NodeFault {
    let why = match step {
        Step::Hello => " 3 (not a RESP3 map: the server does not speak RESP3; use protocol 2)",
        _ => "",
    };
    NodeFault::Unexpected(format!(
        "{} in answer to {}{why}",
        crate::model::error::clipped_debug(frame),
        step.command()
    ))
}

/// The login step of `addr`, if any: `HELLO 3` (with `AUTH` when there is a password) for
/// RESP3, else `AUTH [user] password` when there is a password.
fn login(addr: &NodeAddr, push: &mut impl FnMut(Step, &[Arg<'_>])) {
    let user = addr.username.as_deref();
    match (addr.protocol, addr.password()) {
        (3, Some(p)) => push(
            Step::Hello,
            &[
                "HELLO".into(),
                "3".into(),
                "AUTH".into(),
                user.unwrap_or("default").into(),
                p.into(),
            ],
        ),
        (3, None) => push(Step::Hello, &["HELLO".into(), "3".into()]),
        (_, Some(p)) => match user {
            Some(u) => push(Step::Auth, &["AUTH".into(), u.into(), p.into()]),
            None => push(Step::Auth, &["AUTH".into(), p.into()]),
        },
        (_, None) => {}
    }
}
