//! The error types: [`Error`] for callers, [`NodeFault`] for what went wrong with one node, and
//! the node-by-node accounts errors carry ([`Report`]; [`FenceRepair`], which a successful
//! repair returns too). Every message names the node by `host:port` and says what it answered.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::model::addr::NodeAddr;
use crate::model::wire::{ErrorKind, ParseError};

/// Why one node could not take part in an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeFault {
    /// Connecting, reading or writing failed.
    Io(io::ErrorKind),
    /// The address did not resolve.
    Resolve(String),
    /// TCP connect plus handshake did not finish within the connect timeout.
    ConnectTimeout,
    /// No reply within the per-node timeout of the attempt.
    Timeout,
    /// Not waited for: the node let an earlier attempt's node timeout pass in silence and has
    /// not answered anything since (a frozen or hung server), so an acquire decides without it
    /// once the other nodes cannot make a quorum. Waited for again as soon as it answers.
    Silent,
    /// The server closed the connection.
    Closed,
    /// The TLS handshake failed, or the server broke the TLS protocol (`rediss://`): an
    /// untrusted or expired certificate, a certificate for another name, a client
    /// certificate the server refused, a plain-TCP port.
    Tls(String),
    /// The server sent bytes that are not valid RESP.
    Protocol(ParseError),
    /// The server sent a valid reply of the wrong kind, or refused the handshake's `HELLO 3`
    /// other than for the credentials (it does not speak RESP3).
    Unexpected(String),
    /// The server answered with an error.
    Server(ErrorKind, String),
    /// The server refused our credentials (`NOAUTH`, `WRONGPASS`, `NOPERM` to `HELLO`, or any
    /// error answering `AUTH`).
    Auth(String),
    /// Logged in, but the ACL user may not run a command the client needs (`NOPERM`).
    Permission {
        /// The command refused, e.g. `INFO server`.
        command: &'static str,
        /// What the server answered.
        message: String,
    },
    /// The handshake's `SELECT` was refused: the database of the address does not exist on the
    /// server (`-ERR DB index is out of range`), or the server has no databases to select
    /// (cluster mode, some proxies). A configuration mistake, not an outage.
    Database {
        /// The database number of the address.
        db: u32,
        /// What the server answered.
        message: String,
    },
    /// The node leads to the same server process (the same `run_id`) as another entry of the
    /// server list: listed twice, it would count twice towards a quorum, so it does not count.
    /// Of two such entries, the one listed first counts.
    Duplicate {
        /// The other entry (`host:port`).
        of: String,
        /// The server's `run_id`, as `INFO server` gave it.
        run_id: String,
    },
    /// The node is down and the client waits before reconnecting; the last fault is attached.
    Backoff(Box<NodeFault>),
    /// Too many requests are waiting for replies: the node stopped answering.
    Overloaded,
    /// The node restarted recently and may have lost keys; it does not count towards a quorum
    /// until the quarantine ends.
    Quarantined(Duration),
    /// The server may evict keys under memory pressure — a lock key among them — by its
    /// `maxmemory` and `maxmemory-policy` (`None`: it did not say, its `INFO memory` refused or
    /// without them): its yes does not count towards a quorum
    /// ([`EvictingServers`](crate::EvictingServers)).
    Evicting(Option<crate::EvictionPolicy>),
    /// (Fenced acquire) the node's fence counter is not known to be complete: its server
    /// process restarted (or the counter was flushed or evicted) since it was last seeded. It
    /// is seeded again by a fenced acquire once it has been up for a restart window, if a
    /// quorum of the counters is seeded; with fewer, only a repair
    /// ([`Redlock::repair_fences`](crate::Redlock::repair_fences)) seeds it, as the
    /// [`Error::Fence`]'s text then says.
    FenceBlank,
    /// (Fence repair) the node's fence counter is blank and its server process has not been up
    /// for the whole seed window before the repair began: a fenced acquire that started before
    /// the restart may still hand out a fence written to the previous process, which the
    /// repair cannot see. It may be repaired once up for the window: this much later.
    SeedWindow(Duration),
    /// (Clock check, [`Builder::clock_check`](crate::Builder::clock_check)) the node's clock,
    /// read with `TIME` in the same write as the request, was not within the tolerance of the
    /// clocks of a quorum of nodes read in the same round: a clock that runs fast or jumped
    /// drops keys early, so its yes does not count. Holds how many milliseconds it read ahead
    /// of (positive) or behind the round's median clock; `None` when it gave no reading.
    Clock(Option<i64>),
}

/// What mends a TLS failure, where its text says: an unknown CA, or a certificate made out to
/// another name.
fn tls_hint(why: &str) -> &'static str {
    if why.contains("UnknownIssuer") {
        " (the server's certificate is not signed by a trusted CA: give its CA with \
         tls_ca=FILE in the address, Builder::tls_ca_file, or --tls-ca)"
    } else if why.contains("not valid for name") {
        " (the certificate is made out to another name: connect by that name, or give it with \
         tls_server_name=NAME or --tls-server-name)"
    } else {
        ""
    }
}

/// What mends an ACL refusal of `command`: the step or script it is, and what needs it.
fn permission_hint(command: &str) -> &'static str {
    if command == "INFO server" {
        "; the restart quarantine needs it: grant +info (ACL SETUSER <user> +info), or switch \
         the quarantine off"
    } else if command == "INFO memory" {
        "; the eviction check needs it: grant +info (ACL SETUSER <user> +info), or count \
         servers that may evict keys (EvictingServers::CountUnsafely)"
    } else if command.ends_with(')') {
        "; the user needs every command the script calls (docs/production.md gives an ACL rule \
         that grants them all)"
    } else {
        ""
    }
}

/// Why a node's fence counter does not count: it is blank.
const FENCE_BLANK: &str = "its fence counter is blank (the server restarted, or the counter was \
     flushed); a fenced lock seeds it once the server is up for a restart window, if a quorum of \
     the counters is seeded";

/// Why the yes of a server that did not say whether it evicts keys does not count.
const EVICTION_UNKNOWN: &str = "did not say whether it evicts keys (its INFO memory was refused, \
     or named no maxmemory and maxmemory_policy), so its yes does not count: grant +info, or \
     count it knowing that an evicted lock key gives a second holder \
     (EvictingServers::CountUnsafely, --count-evicting-servers-unsafely)";

impl fmt::Display for NodeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use NodeFault::*;
        match self {
            Io(kind) => write!(f, "{}", io::Error::from(*kind)),
            Resolve(why) => write!(f, "cannot resolve: {why}"),
            ConnectTimeout => f.write_str("connect timed out"),
            Timeout => f.write_str("no reply in time"),
            Silent => f.write_str(SILENT),
            Closed => f.write_str("connection closed by the server"),
            Tls(why) => write!(f, "TLS: {why}{}", tls_hint(why)),
            Protocol(e) => write!(f, "protocol error: {e}"),
            Unexpected(what) => write!(f, "unexpected reply {what}"),
            Server(_, message) => write!(f, "answered -{message}"),
            Auth(message) => write!(f, "authentication refused: {message}"),
            Permission { command, message } => write!(
                f,
                "the ACL user may not run {command} (-{message}){}",
                permission_hint(command)
            ),
            Database { db, message } => write!(
                f,
                "database {db} refused: -{message}{}",
                match message.contains("out of range") {
                    true => " (the server has fewer databases)",
                    false => "",
                }
            ),
            Duplicate { of, run_id } => write!(
                f,
                "the same server as {of} (run_id {}…): listed twice, it does not count",
                run_id.get(..8).unwrap_or(run_id)
            ),
            Backoff(last) => write!(f, "unreachable ({last})"),
            Overloaded => f.write_str("too many requests without a reply"),
            FenceBlank => f.write_str(FENCE_BLANK),
            SeedWindow(left) => write!(
                f,
                "{SEED_WINDOW}: it may be repaired in {} ms",
                left.as_millis()
            ),
            Quarantined(left) => write!(
                f,
                "restarted recently, quarantined for {} ms more",
                left.as_millis()
            ),
            Evicting(Some(policy)) => write!(f, "{EVICTING_BEFORE}{policy}{EVICTING_AFTER}"),
            Evicting(None) => f.write_str(EVICTION_UNKNOWN),
            Clock(Some(off)) if *off >= 0 => write!(
                f,
                "its clock reads {off} ms ahead of the other nodes' (clock check): its yes does \
                 not count"
            ),
            Clock(Some(off)) => write!(
                f,
                "its clock reads {} ms behind the other nodes' (clock check): its yes does not \
                 count",
                off.unsigned_abs()
            ),
            Clock(None) => f.write_str(
                "its clock was not read in the same round (clock check): its yes does not count",
            ),
        }
    }
}

/// A node not waited for since it missed a node timeout.
const SILENT: &str =
    "silent since it missed a node timeout (not waited for until it answers again)";

/// Why a blank counter cannot be repaired yet (the time left follows).
const SEED_WINDOW: &str =
    "its fence counter is blank and its server restarted less than a seed window ago";

/// Why the yes of a server that may evict keys does not count, around its policy's name.
const EVICTING_BEFORE: &str = "may evict lock keys under memory pressure (maxmemory-policy ";
const EVICTING_AFTER: &str = " with a maxmemory limit), so its yes does not count: configure \
     `maxmemory-policy noeviction` (or `maxmemory 0`) on it, or count it knowing that an \
     evicted lock key gives a second holder (EvictingServers::CountUnsafely, \
     --count-evicting-servers-unsafely)";

impl NodeFault {
    /// [`NodeFault::Unexpected`] of a reply, as [`clipped_debug`] text: a reply can be as long
    /// as a frame may be (a megabyte), and a fault is kept and copied into every error while
    /// its node backs off. Give it the reply `Frame` itself, not an owned copy:
    /// only what fits in the text is looked at.
    pub(crate) fn unexpected(reply: impl std::fmt::Debug) -> NodeFault {
        NodeFault::Unexpected(clipped_debug(&reply))
    }

    /// The underlying fault, looking through [`NodeFault::Backoff`].
    pub fn root(&self) -> &NodeFault {
        match self {
            NodeFault::Backoff(last) => last.root(),
            other => other,
        }
    }

    /// True for a fault that waiting does not mend — the node's configuration or ours is wrong:
    /// TLS (an untrusted certificate, another name, a plain-TCP port), a port that does not
    /// speak RESP, an unexpected answer, credentials or permissions refused, a database that
    /// does not exist, the same server listed twice, a server that may evict keys. A refused or dropped connection, a
    /// timeout, a name that does not resolve (yet), an overloaded or quarantined node may all
    /// mend by themselves.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self.root(),
            NodeFault::Tls(_)
                | NodeFault::Protocol(_)
                | NodeFault::Unexpected(_)
                | NodeFault::Auth(_)
                | NodeFault::Permission { .. }
                | NodeFault::Database { .. }
                | NodeFault::Duplicate { .. }
                | NodeFault::Evicting(_)
        )
    }
}

/// The node-by-node outcome of an operation that did not succeed.
#[derive(Clone)]
pub struct Report {
    pub(crate) nodes: Arc<[NodeAddr]>,
    pub(crate) quorum: usize,
    pub(crate) yes: usize,
    /// The nodes that said yes, as a bit set (`yes` may count fewer: a fenced acquire counts
    /// only the seeded ones).
    pub(crate) said_yes: u64,
    pub(crate) refused: u64,
    pub(crate) failed: Vec<(usize, NodeFault)>,
    pub(crate) refusal: Refusal,
    /// (A fenced acquire's) what stands in the way of a fence beyond the nodes' faults.
    pub(crate) note: Option<FenceNote>,
}

/// Why a fenced acquire got no fence, where its nodes' faults alone do not say it (appended to
/// its [`Report`]'s text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceNote {
    /// Every counter is blank, but some still name the process that seeded them: seeded
    /// before, so no new deployment (a snapshot restored after fences above it were handed
    /// out). Only a repair with a floor mends it.
    SeededBefore,
    /// So many counters are blank that the others cannot make a quorum of seeded ones (a
    /// majority of the servers restarted, or a new deployment's first write-back reached a
    /// minority): no fenced acquire seeds them, only a repair. Not final: a new deployment's
    /// first write-back may still be on its way.
    MajorityBlank,
    /// A counter read is at `u64::MAX`: no greater fence exists.
    Exhausted,
}

impl fmt::Display for FenceNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceNote::SeededBefore => f.write_str(
                "every fence counter is blank, and some were seeded by an earlier server process \
                 (restored from a snapshot?): not a new deployment, and fences above every value \
                 read may have been handed out; no fence until a repair: run `redlock \
                 repair-fences --at-least <a floor above every fence handed out>` (docs/fencing.md, \
                 Repair)",
            ),
            FenceNote::MajorityBlank => f.write_str(
                "too many fence counters are blank for a quorum of seeded ones (a majority of \
                 the servers restarted, or a new deployment's first fence reached a minority): \
                 no fenced acquire seeds them, unless a new deployment's first fence is still \
                 being written back; run `redlock repair-fences` (docs/fencing.md, Repair)",
            ),
            FenceNote::Exhausted => write!(
                f,
                "the fence counter is exhausted: a counter read is at {}, the largest fence \
                 there is, so no greater one can be handed out (fences go on only if the \
                 counters, and the protected resources' highest fences, are reset)",
                u64::MAX
            ),
        }
    }
}

/// What a node's refusal means in the round a [`Report`] is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An acquisition: the key is held by another token.
    HeldElsewhere,
    /// An extension (or a fenced acquire's second round trip): our token is gone, not
    /// necessarily held by someone else.
    TokenGone,
}

impl Report {
    /// Votes needed.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The report of a refusal (our token gone) from the nodes in `refused` that came after
    /// a lost renewal was decided.
    pub(crate) fn late_refusal(nodes: &Arc<[NodeAddr]>, quorum: usize, refused: u64) -> Report {
        Report {
            nodes: nodes.clone(),
            quorum,
            yes: 0,
            said_yes: 0,
            refused,
            failed: Vec::new(),
            refusal: Refusal::TokenGone,
            note: None,
        }
    }

    /// (A lost extend) whether the nodes in `backed` (a bit set: those that said yes to the
    /// round that set the lock's validity; 0 if not known) that did not refuse here still make
    /// a quorum. Not known: whether no node refused.
    pub(crate) fn still_backed(&self, backed: u64) -> bool {
        if backed == 0 {
            return self.refused == 0;
        }
        (backed & !self.refused).count_ones() as usize >= self.quorum
    }
    fn held_verdict(&self) -> &'static str {
        match self.refusal {
            Refusal::TokenGone => "not extended",
            Refusal::HeldElsewhere => "not acquired: the lock is held elsewhere",
        }
    }

    /// Nodes that said yes.
    pub fn yes(&self) -> usize {
        self.yes
    }
    /// The nodes that answered no (the key is held by another token).
    pub fn refused(&self) -> impl Iterator<Item = &NodeAddr> + '_ {
        (0..self.nodes.len())
            .filter(|i| self.refused & (1 << i) != 0)
            .map(|i| &self.nodes[i])
    }
    /// Whether the nodes in their restart quarantine ([`NodeFault::Quarantined`]) are all that
    /// kept the quorum from being reached: at least as many of them as yeses were missing. A
    /// wait then ends when the quarantine does (or sooner, if other nodes come back), which is
    /// what the `waiting` event and `redlock` say instead of "no quorum".
    pub fn short_by_quarantine(&self) -> bool {
        let quarantined = (self.failed())
            .filter(|(_, f)| matches!(f.root(), NodeFault::Quarantined(_)))
            .count();
        let need = self.quorum().saturating_sub(self.yes());
        need > 0 && quarantined >= need
    }
    /// The nodes that failed, and why.
    pub fn failed(&self) -> impl Iterator<Item = (&NodeAddr, &NodeFault)> + '_ {
        self.failed.iter().map(|(i, f)| (&self.nodes[*i], f))
    }
    /// Every node, in the order of the server list, with what it contributed.
    pub fn votes(&self) -> impl Iterator<Item = (&NodeAddr, NodeVote<'_>)> + '_ {
        self.nodes.iter().enumerate().map(|(i, node)| {
            let bit = 1u64 << i;
            let vote = if self.said_yes & bit != 0 {
                NodeVote::Yes
            } else if self.refused & bit != 0 {
                NodeVote::Refused
            } else if let Some((_, fault)) = self.failed.iter().find(|(n, _)| *n == i) {
                NodeVote::Failed(fault)
            } else {
                NodeVote::NotWaitedFor
            };
            (node, vote)
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} nodes said yes, {} needed",
            self.yes,
            self.nodes.len(),
            self.quorum
        )?;
        // Every node once, in the order of the server list: its vote, its fault, or that the
        // round was decided without it.
        let list = |f: &mut fmt::Formatter<'_>, label: &str, want: NodeVote<'_>| -> fmt::Result {
            let mut first = true;
            for (node, vote) in self.votes() {
                if std::mem::discriminant(&vote) == std::mem::discriminant(&want) {
                    f.write_str(if first { label } else { ", " })?;
                    write!(f, "{node}")?;
                    first = false;
                }
            }
            Ok(())
        };
        list(f, "; yes from ", NodeVote::Yes)?;
        let refused = match self.refusal {
            Refusal::TokenGone => "; our token is gone (expired or taken) on ",
            Refusal::HeldElsewhere => "; held elsewhere on ",
        };
        list(f, refused, NodeVote::Refused)?;
        for (node, fault) in self.failed() {
            write!(f, "; {node}: {fault}")?;
        }
        list(
            f,
            "; not waited for (decided without them): ",
            NodeVote::NotWaitedFor,
        )?;
        if let Some(note) = self.note {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

/// What one node contributed to an operation that did not succeed: see [`Report::votes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeVote<'a> {
    /// It said yes.
    Yes,
    /// It refused: the key is held by another token (for an extension: our token is gone).
    Refused,
    /// It could not take part, for this reason.
    Failed(&'a NodeFault),
    /// The outcome was decided before its answer came (a quorum could no longer be reached, or
    /// was reached without it); it was not waited for.
    NotWaitedFor,
}

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Report({self})")
    }
}

/// Everything that can go wrong for a caller of this crate.
///
/// # Examples
///
/// Telling "held elsewhere" (try again later) from a failure of the servers or of the
/// configuration:
///
/// ```no_run
/// use redlock_mux::{Error, Redlock};
///
/// let redlock = Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
/// match redlock.try_lock("invoice:42") {
///     Ok(lock) => { /* ... */ redlock.unlock(lock)?; }
///     Err(Error::Held(_)) => println!("someone else has it"),
///     Err(e) if e.is_permanent() => return Err(e), // configuration, credentials: no retry mends it
///     Err(e) => eprintln!("not now: {e}"),          // the message names every node and its fault
/// }
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad configuration or input from the caller, found before anything was sent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The lock name starts with the prefix this crate reserves for its own keys (the fence
    /// counter, waiting marks, release notices): such a name could be one of them. Nothing was
    /// sent. Choose a name outside the prefix.
    #[error(
        "{name:?} is not a lock name: names starting with {prefix:?} are reserved for this \
         crate's own keys (fence counter, waiting marks, release notices)"
    )]
    ReservedName {
        /// The name refused (lossily as UTF-8).
        name: String,
        /// The reserved prefix it starts with.
        prefix: &'static str,
    },
    /// A semaphore was asked for with a number of permits outside `1..=`[`MAX_PERMITS`](crate::MAX_PERMITS)
    /// ([`Redlock::semaphore`](crate::Redlock::semaphore)). Nothing was sent.
    #[error("a semaphore of {permits} permits: the count must be from 1 to {max}")]
    PermitCount {
        /// The count asked for.
        permits: u32,
        /// The largest count allowed.
        max: u32,
    },
    /// Not acquired: the lock is held by someone else. For an extension: too many nodes no
    /// longer hold our token (it expired, or someone else has the lock now).
    #[error("{} ({})", .0.held_verdict(), .0)]
    Held(Report),
    /// Not enough nodes could be reached to form a quorum.
    #[error("no quorum: {0}")]
    NoQuorum(Report),
    /// (Fenced acquire) a quorum granted the lock, but no fence could be made safe: fewer than
    /// a quorum of nodes answered with a seeded fence counter, or fewer than a quorum took the
    /// fence. The lock was released.
    #[error("not acquired: no fence ({0})")]
    Fence(Report),
    /// A fence repair ([`Redlock::repair_fences`](crate::Redlock::repair_fences)) did not
    /// leave a quorum of counters seeded: too few nodes could be read or written (unreachable,
    /// blank inside their seed window, a duplicate entry), or no floor was given and fewer
    /// than a quorum of the counters read were seeded ([`FenceRepair::needs_floor`]: then
    /// nothing was written). No counter was lowered; those repaired keep their raised value,
    /// which is harmless. What each node read, and why it was not repaired, are in the value.
    #[error("fence counters not repaired: {0}")]
    FenceRepair(Box<FenceRepair>),
    /// A quorum said yes, but the attempt took so long that no validity was left.
    #[error("not acquired: a quorum said yes but no validity was left ({0})")]
    TooSlow(Report),
    /// The lock's validity had already run out when `unlock` or `extend` was called (the release
    /// was still sent; `released` nodes still held our token).
    #[error("the lock had already expired ({released} node(s) still held it and released it)")]
    Expired {
        /// Nodes that still held our token and deleted it.
        released: usize,
    },
    /// The lock was extended as often as the configuration allows.
    #[error("the lock was extended {0} times, the configured maximum")]
    ExtensionLimit(u32),
    /// The lock was lost while work done under it ran: what a
    /// [`WithLockError::Lost`] becomes through `?` (or `Error::from`) in a function that
    /// returns this error. The work's value is dropped then; match on the
    /// [`WithLockError`] to keep it.
    #[error("the lock was lost while the work ran: {0}")]
    Lost(Box<Error>),
    /// An acquire of a resource made from inside the work of a `with_lock` of the same
    /// resource, through the same handle: it could only have waited until its deadline, since
    /// the lock it would wait for is released when that work returns. Nothing was sent. (A
    /// bare [`Lock`](crate::Lock) can be moved and released elsewhere, so re-locking what one
    /// holds waits like any other caller, bounded by its deadline.)
    #[error(
        "{resource:?} is already held by this caller (the with_lock whose work this runs in): \
         waiting for it could only end at the deadline"
    )]
    AlreadyHeld {
        /// The resource (lossily as UTF-8).
        resource: String,
    },
    /// A node refused our credentials.
    #[error("authentication refused by {node}: {message}")]
    Auth {
        /// `host:port` of the node.
        node: String,
        /// What the node answered.
        message: String,
    },
    /// A node refused a command the client needs: the ACL user lacks a permission.
    #[error("permission refused by {node}: {message}")]
    Permission {
        /// `host:port` of the node.
        node: String,
        /// Which command, what the node answered, and what to grant.
        message: String,
    },
    /// The operating system refused something the client needs to run: its event loop, the
    /// loop's waker, a thread, random bytes for a token. Not a configuration mistake; a retry
    /// may succeed once the resource is free again.
    #[error("cannot {what}: {cause}")]
    System {
        /// What the client tried, e.g. `start the engine thread`.
        what: &'static str,
        /// What the operating system answered.
        cause: String,
    },
    /// A bug in this crate: an operation's outcome was lost or of the wrong kind.
    #[error("internal error: {0}")]
    Internal(&'static str),

    /// A call into a handle from the closure of its own
    /// [`Redlock::with_client`](crate::Redlock::with_client), or from a closure nested in it
    /// (another handle's `with_client`): the engine is this thread's until the closure returns,
    /// so the call could only wait for itself. Use the `Client` the closure is given.
    #[error("a call into the handle from its own with_client closure: use the Client it gives")]
    Reentrant,
}

/// What [`Redlock::with_lock`](crate::Redlock::with_lock) and
/// [`AsyncRedlock::with_lock`](crate::AsyncRedlock::with_lock) return when the run was not
/// clean: the work did not run, or it ran and the lock was lost before it returned — then the
/// work's value is here, for the caller to decide what it is worth.
///
/// It converts into [`Error`] (`?` in a function that returns `redlock_mux::Error`): a loss
/// becomes [`Error::Lost`] and the value is dropped.
///
/// ```no_run
/// use redlock_mux::WithLockError;
///
/// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
/// match redlock.with_lock("report:weekly", |held| held.lock().resource().len()) {
///     Ok(n) => println!("{n}, under the lock throughout"),
///     Err(WithLockError::Lost { value, why }) => eprintln!("{value}, but the lock was lost: {why}"),
///     Err(e) => return Err(e.into()), // not acquired: the work did not run
/// }
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[non_exhaustive]
pub enum WithLockError<R> {
    /// The lock could not be acquired (as `lock` fails): the work did not run.
    NotAcquired(Error),
    /// The work ran and returned `value`, but the lock was lost before it returned: the
    /// renewal failed (`why` is the reason the renewal reported), or its validity ran out
    /// first (`why` is [`Error::Expired`]). For part of the work the resource may have been
    /// someone else's.
    Lost {
        /// What the work returned.
        value: R,
        /// Why the lock was lost.
        why: Error,
    },
}

impl<R> WithLockError<R> {
    /// The error: why the lock was not acquired, or why it was lost.
    pub fn error(&self) -> &Error {
        match self {
            WithLockError::NotAcquired(e) | WithLockError::Lost { why: e, .. } => e,
        }
    }

    /// The work's value, if the work ran (the lock was lost).
    pub fn value(&self) -> Option<&R> {
        match self {
            WithLockError::Lost { value, .. } => Some(value),
            WithLockError::NotAcquired(_) => None,
        }
    }

    /// The work's value, if the work ran (the lock was lost); the error is dropped.
    pub fn into_value(self) -> Option<R> {
        match self {
            WithLockError::Lost { value, .. } => Some(value),
            WithLockError::NotAcquired(_) => None,
        }
    }
}

impl<R> From<WithLockError<R>> for Error {
    /// The error as an [`Error`]: why the lock was not acquired, or [`Error::Lost`] (the
    /// work's value is dropped).
    fn from(e: WithLockError<R>) -> Error {
        match e {
            WithLockError::NotAcquired(e) => e,
            WithLockError::Lost { why, .. } => Error::Lost(Box::new(why)),
        }
    }
}

/// Prints the error; the value is shown as `<R>` (it need not be `Debug`).
impl<R> fmt::Debug for WithLockError<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WithLockError::NotAcquired(e) => f.debug_tuple("NotAcquired").field(e).finish(),
            WithLockError::Lost { why, .. } => f
                .debug_struct("Lost")
                .field("value", &format_args!("<{}>", std::any::type_name::<R>()))
                .field("why", why)
                .finish(),
        }
    }
}

impl<R> fmt::Display for WithLockError<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WithLockError::NotAcquired(e) => write!(f, "{e}"),
            WithLockError::Lost { why, .. } => {
                write!(f, "the lock was lost while the work ran: {why}")
            }
        }
    }
}

impl<R> std::error::Error for WithLockError<R> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The message already says what the inner error says: its own cause comes next.
        std::error::Error::source(self.error())
    }
}

impl Error {
    /// An [`Error::System`] for `what`, failed with `cause`.
    pub(crate) fn system(what: &'static str, cause: impl fmt::Display) -> Error {
        Error::System {
            what,
            cause: cause.to_string(),
        }
    }
}

impl Error {
    /// True when trying the same call again, as it is, cannot succeed: a configuration or
    /// input mistake ([`Error::Config`], [`Error::ReservedName`], [`Error::AlreadyHeld`],
    /// [`Error::Reentrant`]), credentials or permissions refused, a lock whose validity ran out
    /// ([`Error::Expired`]: an extend of it fails again, a release of it was sent already) or
    /// that was extended as often as allowed ([`Error::ExtensionLimit`]), or no quorum because
    /// so many nodes failed with a [permanent](NodeFault::is_permanent) fault that the others
    /// cannot make one (for a lock or a [fence repair](Error::FenceRepair); `Held` too, then).
    /// `lock` and
    /// `lock_until` stop waiting at such an error; `Held` otherwise, and a quorum that
    /// unreachable nodes may still make once they are back, are worth waiting for.
    ///
    /// A loop that retries an extend unless the error is permanent therefore ends: at
    /// `ExtensionLimit`, or at `Expired` once the validity is gone.
    ///
    /// The same idea as [`NodeFault::is_permanent`], for a whole call: waiting does not mend
    /// it.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Config(_)
            | Error::ReservedName { .. }
            | Error::PermitCount { .. }
            | Error::AlreadyHeld { .. }
            | Error::Reentrant
            | Error::Auth { .. }
            | Error::Permission { .. }
            | Error::Expired { .. }
            | Error::ExtensionLimit(_) => true,
            Error::NoQuorum(r) | Error::TooSlow(r) | Error::Fence(r) | Error::Held(r) => {
                let lost = r.failed.iter().filter(|(_, f)| f.is_permanent()).count();
                r.nodes.len().saturating_sub(lost) < r.quorum
            }
            Error::FenceRepair(r) => {
                let lost = (r.nodes.iter())
                    .filter(|n| n.fault.as_ref().is_some_and(NodeFault::is_permanent))
                    .count();
                r.nodes.len().saturating_sub(lost) < r.quorum
            }
            _ => false,
        }
    }

    /// The former name of [`Error::is_permanent`].
    #[deprecated(
        since = "0.1.0",
        note = "renamed `is_permanent`, the name `NodeFault` uses"
    )]
    pub fn is_final(&self) -> bool {
        self.is_permanent()
    }

    /// The per-node report, for errors that have one.
    pub fn report(&self) -> Option<&Report> {
        match self {
            Error::Held(r) | Error::NoQuorum(r) | Error::TooSlow(r) | Error::Fence(r) => Some(r),
            _ => None,
        }
    }
}

/// What a fence repair ([`Redlock::repair_fences`](crate::Redlock::repair_fences)) did, node
/// by node: its result, and the payload of [`Error::FenceRepair`] when it fell short.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceRepair {
    /// The floor given ([`FenceFloor::AtLeast`](crate::FenceFloor::AtLeast)), if any.
    pub floor: Option<u64>,
    /// True when the repair was given no floor
    /// ([`FenceFloor::SeededQuorum`](crate::FenceFloor::SeededQuorum)) and read fewer than a
    /// quorum of seeded counters, though enough nodes could have been repaired: it wrote
    /// nothing. A floor, or the acknowledgement that earlier holders have stopped, is needed.
    pub needs_floor: bool,
    /// The largest counter read, seeded or blank (0 when none was read).
    pub highest_read: u64,
    /// The value every repaired counter holds at least: the larger of the floor and
    /// `highest_read`. A fenced acquire that begins after a successful repair gets a greater
    /// fence (as long as no other repair with a lower floor runs in between).
    pub value: u64,
    /// Counters needed: `nodes.len() / 2 + 1`.
    pub quorum: usize,
    /// Server processes whose counter was read seeded (two entries of the server list that
    /// lead to one process count once).
    pub seeded_read: usize,
    /// Server processes whose counter the repair left seeded and at least `value`.
    pub repaired: usize,
    /// Every node, in the order of the server list.
    pub nodes: Vec<NodeRepair>,
}

/// What a fence repair did on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeRepair {
    /// `host:port`.
    pub node: String,
    /// The counter before the repair (0 when the node had none); `None` if it could not be
    /// read.
    pub before: Option<u64>,
    /// Whether that counter was seeded: complete for the node's current server process.
    pub seeded: bool,
    /// The counter after the repair, seeded for the node's process: at least
    /// [`FenceRepair::value`]. `None` when the node was not repaired.
    pub after: Option<u64>,
    /// Why the node could not be read or was not repaired (a blank counter inside its seed
    /// window, a duplicate entry, a connection lost between the round trips, …). `None` when
    /// it was repaired, or when the repair stopped before its writes
    /// ([`FenceRepair::needs_floor`], or too few nodes to repair).
    pub fault: Option<NodeFault>,
}

impl fmt::Display for FenceRepair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nodes.len();
        if self.needs_floor {
            write!(
                f,
                "no floor given, and only {} of {n} counters read are seeded ({} needed for \
                 their maximum, {}, to cover every fence handed out): nothing written; give a \
                 floor at least as high as every fence ever handed out, or acknowledge that \
                 every holder of an earlier fence has stopped",
                self.seeded_read, self.quorum, self.highest_read
            )?;
        } else {
            write!(
                f,
                "{} of {n} counters repaired (seeded, at least {}), {} needed",
                self.repaired, self.value, self.quorum
            )?;
        }
        for node in &self.nodes {
            match (&node.fault, node.after) {
                (Some(fault), _) => write!(f, "; {}: {fault}", node.node)?,
                (None, None) if !self.needs_floor => {
                    write!(f, "; {}: not written (too few nodes to repair)", node.node)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_every_node_once_including_those_not_waited_for() {
        let nodes: Arc<[NodeAddr]> = ["redis://a:1", "redis://b:2", "redis://c:3", "redis://d:4"]
            .iter()
            .map(|s| NodeAddr::parse(s).unwrap())
            .collect();
        let report = Report {
            nodes,
            quorum: 3,
            yes: 1,
            said_yes: 0b0001,
            refused: 0b0100,
            failed: vec![(1, NodeFault::Timeout)],
            refusal: Refusal::HeldElsewhere,
            note: None,
        };
        assert_eq!(
            report.to_string(),
            "1 of 4 nodes said yes, 3 needed; yes from a:1; held elsewhere on c:3; b:2: no reply \
             in time; not waited for (decided without them): d:4"
        );
        let votes: Vec<String> = report.votes().map(|(_, v)| format!("{v:?}")).collect();
        assert_eq!(votes, ["Yes", "Failed(Timeout)", "Refused", "NotWaitedFor"]);
    }

    /// No retry cures a lock that ran out or was extended as often as allowed: the documented
    /// pattern (retry unless `is_permanent`) looped on them.
    #[test]
    fn an_expired_lock_and_the_extension_limit_are_final() {
        assert!(Error::Expired { released: 0 }.is_permanent());
        assert!(Error::Expired { released: 2 }.is_permanent());
        assert!(Error::ExtensionLimit(1000).is_permanent());
    }

    /// `Held` is worth waiting for — unless so many nodes fail for good that the others can
    /// never make a quorum (since credentials refused by a minority no longer make a round's
    /// error `Auth`, such a round can be `Held`).
    #[test]
    fn held_is_permanent_only_when_the_nodes_failing_for_good_leave_no_quorum() {
        let nodes: Arc<[NodeAddr]> = (1..=5)
            .map(|i| NodeAddr::parse(&format!("redis://n:{i}")).unwrap())
            .collect();
        let held = |failed: Vec<(usize, NodeFault)>| {
            Error::Held(Report {
                nodes: nodes.clone(),
                quorum: 3,
                yes: 0,
                said_yes: 0,
                refused: 0b00011,
                failed,
                refusal: Refusal::HeldElsewhere,
                note: None,
            })
        };
        let auth = || NodeFault::Auth("WRONGPASS".into());
        assert!(!held(vec![(2, auth())]).is_permanent());
        assert!(!held(vec![(2, auth()), (3, NodeFault::Timeout)]).is_permanent());
        assert!(
            held(vec![
                (2, auth()),
                (3, auth()),
                (4, NodeFault::Unexpected("x".into()))
            ])
            .is_permanent()
        );
    }
}

/// The longest text of a server's reply or error kept in a fault.
const CLIP: usize = 256;

/// `text`, cut to [`CLIP`] bytes (at a character boundary) with how long it was.
pub(crate) fn clipped(text: &str) -> String {
    if text.len() <= CLIP {
        return text.to_owned();
    }
    let mut end = CLIP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// A `fmt::Write` that keeps the first [`CLIP`] bytes (cut at a character boundary) and then
/// refuses more, which stops the formatting that feeds it.
struct Clip {
    text: String,
    full: bool,
}

impl std::fmt::Write for Clip {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = CLIP - self.text.len();
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&s[..end]);
        self.full = true;
        Err(std::fmt::Error)
    }
}

/// The `Debug` text of `value`, cut to [`CLIP`] bytes as [`clipped`] cuts: formatted into a
/// bounded buffer, which stops the formatting once full, so that a megabyte reply costs a few
/// hundred bytes, not its whole text (nor, given a `Frame`, an owned copy of every element: a
/// frame's aggregates are formatted element by element as they are decoded, and stop there).
pub(crate) fn clipped_debug(value: &dyn std::fmt::Debug) -> String {
    let mut clip = Clip {
        text: String::new(),
        full: false,
    };
    // An error is the buffer full (a `Debug` impl fails only when its writer does).
    let _ = std::fmt::write(&mut clip, format_args!("{value:?}"));
    if clip.full {
        clip.text.push_str("… (longer)");
    }
    clip.text
}

#[cfg(test)]
mod clip_tests {
    use super::*;

    #[test]
    fn a_megabyte_reply_is_kept_as_a_line() {
        assert_eq!(clipped("short"), "short");
        let long = "é".repeat(1 << 19);
        let kept = clipped(&long);
        assert!(kept.len() < CLIP + 32, "{}", kept.len());
        assert!(kept.ends_with(&format!("… ({} bytes)", 1 << 20)), "{kept}");
        let fault = NodeFault::unexpected(vec![7u8; 1 << 20]);
        assert!(fault.to_string().len() < CLIP + 64, "{fault}");
        assert_eq!(clipped_debug(&"short"), "\"short\"");
        let kept = clipped_debug(&long);
        assert!(
            kept.len() <= CLIP + 16 && kept.ends_with("… (longer)"),
            "{kept}"
        );
    }
}
