//! Acquiring under the user's waiting rule (flock's `-w`, `-n`, `-E`), with what it says on the
//! way: the first attempt's trouble, the restart quarantine and what to do about it, nodes that
//! were unreachable, and an acquire that the enclosing `redlock run` excludes.

use std::time::{Duration, Instant};

use redlock_mux::{Error, Lock, NodeFault, NodeStatus, NodeVote, Redlock, Resource, Semaphore};

use crate::fail::{Fail, Kind, classify, exit};
use crate::options::Waiting;
use crate::parse::Wait;
use crate::text::{NAME_SHOWN, fmt_duration, shorten};

/// On stderr: the lock was taken while nodes were unreachable (see [`unreachable_warning`]).
pub fn warn_unreachable(lock: &Lock) {
    if let Some(warning) = unreachable_warning(lock) {
        say!("redlock: warning: {warning}");
    }
}

/// The warning for a lock taken while some nodes were unreachable (down, backing off, timed
/// out); `None` when every node was reachable, including those not waited for because the
/// quorum came first.
pub fn unreachable_warning(lock: &Lock) -> Option<String> {
    let votes = lock.votes();
    if votes.unreachable() == 0 {
        return None;
    }
    let names: Vec<String> = lock.unreachable().map(|n| n.to_string()).collect();
    Some(format!(
        "acquired with {} of {} nodes unreachable ({}): one more node failure may cost the \
         quorum",
        votes.unreachable(),
        votes.nodes(),
        names.join(", ")
    ))
}

/// A far-away deadline for "wait until acquired" (a century: `Instant` arithmetic stays sound).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The servers a lock is held on, as `redlock run` tells its command (`REDLOCK_HELD_ON`): the
/// list in its order, `host:port` each, no credentials.
pub fn held_on<'a>(nodes: impl Iterator<Item = &'a redlock_mux::NodeAddr>) -> String {
    let nodes: Vec<String> = nodes.map(ToString::to_string).collect();
    nodes.join(",")
}

/// How long a wait without a limit (no `-w`) goes on while no quorum of servers can be
/// reached, before it gives up with 69: long enough to ride out a server's restart — the
/// reconnect backoff's ceiling, plus the restart quarantine (a restarted node counts again
/// only after it), plus a connect timeout.
pub fn unreachable_grace(config: &redlock_mux::Config) -> Duration {
    config.backoff_max
        + config.quarantine_window().unwrap_or(Duration::ZERO)
        + config.connect_timeout
}

/// Acquires `resource` under the user's waiting rule. The first attempt goes out alone, so that
/// a wait that starts on servers in their restart quarantine (or unreachable ones) can say so
/// before it waits; a lock held elsewhere is said once the wait has lasted a second.
///
/// What waiting cannot mend ends at once ([`Error::is_permanent`]: a certificate that does not
/// verify, a port that speaks another protocol, credentials refused). Without a limit (no
/// `-w`), no quorum of reachable servers is waited for at most [`unreachable_grace`], then 69.
///
/// Why it waits is said on stderr, and again when that changes ([`Notes`]), unless `quiet`. The caller warns about nodes that were unreachable ([`warn_unreachable`]) once it
/// has said what it acquired.
pub fn acquire(
    r: &Redlock,
    resource: &str,
    permits: Option<u32>,
    waiting: &Waiting,
    quiet: bool,
) -> Result<Lock, Fail> {
    acquire_telling(r, resource, permits, waiting, quiet, &mut Vec::new())
}

/// [`acquire`], with every reason the wait gave pushed onto `told` (for `--json`).
pub fn acquire_telling(
    r: &Redlock,
    resource: &str,
    permits: Option<u32>,
    waiting: &Waiting,
    quiet: bool,
    told: &mut Vec<Said>,
) -> Result<Lock, Fail> {
    // With --permits: a permit of the semaphore RESOURCE, a lock on RESOURCE#i.
    let semaphore = permits
        .map(|p| r.semaphore(resource, p))
        .transpose()
        .map_err(|e| Fail::of(&e))?;
    let target = Target {
        r,
        resource,
        semaphore,
        waiting,
    };
    target.refuse_if_nested()?;
    // Connect (and handshake) first, so the first attempt's per-node timeout is spent on the
    // SET alone: a one-shot command against distant masters must not fail on a cold start.
    r.connect(r.config().connect_timeout)
        .map_err(|e| Fail::lib("cannot start", &e))?;
    let rule = waiting.rule();
    let started = Instant::now();
    let first = match target.try_lock() {
        Ok(lock) => return Ok(lock),
        Err(e) => e,
    };
    let deadline = match rule {
        Wait::Once => None,
        Wait::For(d) => Some(started + d),
        Wait::Forever => Some(started + FOREVER),
    };
    let retryable =
        !first.is_permanent() && matches!(classify(&first).1, Kind::Held | Kind::NoQuorum);
    let Some(deadline) = deadline.filter(|_| retryable) else {
        return Err(target.failure(&first));
    };
    let mut notes = Notes {
        quiet,
        started,
        said: None,
        told: std::mem::take(told),
    };
    notes.look(&target, &first);
    let result = if matches!(rule, Wait::Forever) {
        let unreachable_since = (!matches!(first, Error::Held(_))).then_some(started);
        target.wait_without_limit(&mut notes, unreachable_since, deadline)
    } else {
        target.wait_with_limit(&mut notes, deadline)
    };
    *told = notes.told;
    result
}

/// The longest a "held elsewhere" message waits for the nodes to say who holds the lock.
const OWNER_LOOK: Duration = Duration::from_millis(250);

/// How often a wait looks again at why it is still refused, to say so when the reason changes:
/// a reason is on stderr within this of the first refusal (a lock held elsewhere is said once
/// the wait has lasted this long; anything else at once).
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// What a wait has said on stderr of why it waits: once, then again each time the reason
/// changes (held elsewhere, the restart quarantine, no quorum reachable). A lock held
/// elsewhere only once the wait has lasted [`LOOK_AGAIN`], as flock waits in silence for a
/// moment; the others at once.
struct Notes {
    quiet: bool,
    started: Instant,
    /// The kind of the reason said last.
    said: Option<Kind>,
    /// Every reason said, for `--json` (`waited`).
    told: Vec<Said>,
}

/// One reason a wait gave (on stderr, and in `acquire --json`'s `waited`).
#[derive(Debug, Clone)]
pub struct Said {
    /// How long the wait had lasted.
    pub after: Duration,
    /// `held`, `quarantined`, `no_quorum`, … (the names of `--json`'s `error`).
    pub reason: &'static str,
    /// What was said.
    pub message: String,
}

impl Said {
    /// The object in `waited`: `{after_ms, reason, message}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "after_ms": self.after.as_millis() as u64,
            "reason": self.reason,
            "message": self.message,
        })
    }
}

impl Notes {
    /// Says why the wait goes on after `e`, if that is new.
    fn look(&mut self, target: &Target<'_>, e: &Error) {
        let (kind, mut why) = match quarantine_hint(target.r, e) {
            Some(hint) => (Kind::Quarantined, hint),
            None => (classify(e).1, e.to_string()),
        };
        if self.said == Some(kind)
            || (self.said.is_none() && kind == Kind::Held && self.started.elapsed() < LOOK_AGAIN)
        {
            return;
        }
        if kind == Kind::Held {
            why.push_str(&target.held_by());
        }
        let resource = shorten(target.resource, NAME_SHOWN);
        if !self.quiet {
            match self.said {
                None => say!(
                    "redlock: waiting{} for {resource}: {why}",
                    target.how_long()
                ),
                Some(_) => say!("redlock: still waiting for {resource}: {why}"),
            }
        }
        self.said = Some(kind);
        self.told.push(Said {
            after: self.started.elapsed(),
            reason: kind.name(),
            message: why,
        });
    }
}

/// What one acquire is after, and how long it may wait for it.
struct Target<'a> {
    r: &'a Redlock,
    resource: &'a str,
    /// With `--permits`: the semaphore RESOURCE, whose permit is taken.
    semaphore: Option<Semaphore>,
    waiting: &'a Waiting,
}

impl Target<'_> {
    fn try_lock(&self) -> Result<Lock, Error> {
        match &self.semaphore {
            Some(s) => s.try_acquire(),
            None => self.r.try_lock(self.resource),
        }
    }

    fn lock_until(&self, deadline: Instant) -> Result<Lock, Error> {
        match &self.semaphore {
            Some(s) => s.acquire_until(deadline),
            None => self.r.lock_until(self.resource, deadline),
        }
    }

    /// The failure of this acquire ([`lock_failure`]), naming the holder's owner when the lock
    /// is held elsewhere.
    fn failure(&self, e: &Error) -> Fail {
        let mut fail = lock_failure(self.r, self.resource, self.waiting.rule(), e, self.waiting);
        if fail.is_held() {
            fail.message.push_str(&self.held_by());
        }
        fail
    }

    /// Who holds the lock, for a "held elsewhere" message: "; owner HOST:PID:COMMAND" as the
    /// most nodes that hold it record it (`--owner`; for a set, the first member found held
    /// with one), from status reads of at most [`OWNER_LOOK`] in all; empty when no owner is recorded (a lock
    /// taken without one, a foreign client's key, readers), no node answers in time, or with
    /// `--permits` (every permit is held, each by its own holder).
    fn held_by(&self) -> String {
        if self.semaphore.is_some() {
            return String::new();
        }
        let resource = Resource::new(self.resource.as_bytes());
        let keys: Vec<&[u8]> = match resource.members() {
            Some(members) => members.collect(),
            None => vec![self.resource.as_bytes()],
        };
        // Member after member until one names an owner, all within `OWNER_LOOK`.
        let deadline = Instant::now() + OWNER_LOOK;
        let mut statuses: Vec<NodeStatus> = Vec::new();
        for key in keys {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || statuses.iter().any(|s| s.owner().is_some()) {
                break;
            }
            statuses.extend(self.r.status(key, left));
        }
        let mut owners: Vec<(&[u8], usize)> = Vec::new();
        for owner in statuses.iter().filter_map(NodeStatus::owner) {
            match owners.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, n)) => *n += 1,
                None => owners.push((owner, 1)),
            }
        }
        match owners.iter().max_by_key(|(_, n)| *n) {
            Some((owner, _)) => format!("; owner {}", crate::text::owner_text(owner)),
            None => String::new(),
        }
    }

    /// Whether the lock `held` excludes every lock this acquire could take. The rule is the
    /// library's (`Resource::excludes`, as `with_lock` refuses a nested acquire): the same
    /// name, a shared lock and a writer of one name, a set and a lock of one of its members,
    /// sets with a member in common, two shared locks of one name (a writer waiting meanwhile
    /// keeps the inner reader out). With `--permits`, only when `held` excludes every permit:
    /// the one permit of a semaphore of 1, say (a plain lock of the name is another key, and a
    /// semaphore of more has other permits).
    fn excluded_by(&self, held: &std::ffi::OsStr) -> bool {
        let held = Resource::new(held.as_encoded_bytes());
        match &self.semaphore {
            Some(s) => (0..s.permits()).all(|i| {
                s.permit_key(i)
                    .is_some_and(|k| held.excludes(Resource::new(k)))
            }),
            None => held.excludes(Resource::new(self.resource.as_bytes())),
        }
    }

    /// Inside `redlock run HELD -- …` on the same servers, which holds HELD until the command
    /// ends, an acquire that HELD excludes ([`Target::excluded_by`]) could only wait for the
    /// command it runs in: it would wait for ever, so it is refused at once (64). `-n` still
    /// answers "held" at once.
    fn refuse_if_nested(&self) -> Result<(), Fail> {
        let resource = self.resource;
        if matches!(self.waiting.rule(), Wait::Once) {
            return Ok(());
        }
        let Some(held) = std::env::var_os("REDLOCK_RESOURCE").filter(|h| self.excluded_by(h))
        else {
            return Ok(());
        };
        if !std::env::var("REDLOCK_HELD_ON").is_ok_and(|on| on == held_on(self.r.nodes().iter())) {
            return Ok(());
        }
        let held = held.to_string_lossy();
        let message = if held == resource {
            format!(
                "{} is already held by the enclosing `redlock run` (REDLOCK_RESOURCE): waiting \
                 for it would never end; extend it with `redlock extend \"$REDLOCK_RESOURCE\" \
                 \"$REDLOCK_TOKEN\"`",
                shorten(resource, NAME_SHOWN)
            )
        } else {
            format!(
                "{} conflicts with {}, which the enclosing `redlock run` holds \
                 (REDLOCK_RESOURCE): waiting for it would never end",
                shorten(resource, NAME_SHOWN),
                shorten(&held, NAME_SHOWN)
            )
        };
        Err(Fail::new(exit::USAGE, message))
    }

    /// How long the wait may last, for the first note: " up to 10s", or how long it goes on
    /// while no quorum is reachable.
    fn how_long(&self) -> String {
        match self.waiting.rule() {
            Wait::For(d) => format!(" up to {}", fmt_duration(d)),
            _ => format!(
                " (at most {} while no quorum is reachable)",
                fmt_duration(unreachable_grace(self.r.config()))
            ),
        }
    }

    /// With a limit: attempts until `deadline`, in turns of [`LOOK_AGAIN`] to say why it waits
    /// when that changes.
    fn wait_with_limit(&self, notes: &mut Notes, deadline: Instant) -> Result<Lock, Fail> {
        loop {
            let e = match self.lock_until((Instant::now() + LOOK_AGAIN).min(deadline)) {
                Ok(lock) => return Ok(lock),
                Err(e) => e,
            };
            if e.is_permanent() || Instant::now() >= deadline {
                return Err(self.failure(&e));
            }
            notes.look(self, &e);
        }
    }

    /// Without a limit: a lock held elsewhere is waited for as long as it takes (as flock
    /// does), servers that cannot make a quorum for the grace ([`unreachable_grace`], in turns
    /// of half of it, at most [`LOOK_AGAIN`]) are not: 69. `unreachable_since`: since when no quorum was reachable.
    fn wait_without_limit(
        &self,
        notes: &mut Notes,
        mut unreachable_since: Option<Instant>,
        deadline: Instant,
    ) -> Result<Lock, Fail> {
        let grace = unreachable_grace(self.r.config());
        loop {
            let turn = Instant::now();
            let e = match self.lock_until((turn + (grace / 2).min(LOOK_AGAIN)).min(deadline)) {
                Ok(lock) => return Ok(lock),
                Err(e) => e,
            };
            if e.is_permanent() || Instant::now() >= deadline {
                return Err(self.failure(&e));
            }
            notes.look(self, &e);
            if matches!(e, Error::Held(_)) {
                unreachable_since = None;
                continue;
            }
            let since = *unreachable_since.get_or_insert(turn);
            if since.elapsed() >= grace {
                let mut fail = Fail::lib(
                    &format!(
                        "gave up waiting for {} after {} without a quorum of servers",
                        shorten(self.resource, NAME_SHOWN),
                        fmt_duration(since.elapsed())
                    ),
                    &e,
                );
                fail.code = exit::UNAVAILABLE;
                fail.kind = Kind::NoQuorum;
                return Err(fail);
            }
        }
    }
}

/// The failure of an acquire: held elsewhere gets `-E`'s code, a quorum missed only because of
/// the restart quarantine gets its own code and says what to do.
fn lock_failure(r: &Redlock, resource: &str, rule: Wait, e: &Error, waiting: &Waiting) -> Fail {
    let within = match rule {
        Wait::For(d) => format!(" within {}", fmt_duration(d)),
        _ => String::new(),
    };
    let context = format!("cannot lock {}{within}", shorten(resource, NAME_SHOWN));
    let mut fail = Fail::lib(&context, e);
    if fail.is_held() {
        fail.code = waiting.conflict_exit_code.unwrap_or(exit::HELD);
    } else if let Some(hint) = quarantine_hint(r, e) {
        fail.code = exit::QUARANTINED;
        fail.kind = Kind::Quarantined;
        fail.message = format!("{context}: {hint}");
    }
    fail
}

/// When a quorum was missed only because nodes are in their restart quarantine: what is
/// happening and what to do, e.g. "127.0.0.1:7701, 127.0.0.1:7702 started 3s ago; a lock is
/// refused for 7s more in case they lost keys in a restart: wait, or pass --quarantine off if
/// they are new".
pub fn quarantine_hint(r: &Redlock, e: &Error) -> Option<String> {
    let report = match e {
        Error::NoQuorum(report) => report,
        _ => return None,
    };
    let window = r.config().quarantine_window()?;
    // In the order of the server list.
    let mut quarantined: Vec<(String, Duration)> = report
        .votes()
        .filter_map(|(node, vote)| match vote {
            NodeVote::Failed(f) => match f.root() {
                NodeFault::Quarantined(left) => Some((node.to_string(), *left)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    if !report.short_by_quarantine() {
        return None;
    }
    let need = report.quorum() - report.yes();
    let names: Vec<&str> = quarantined.iter().map(|(n, _)| n.as_str()).collect();
    let names = names.join(", ");
    let youngest = window.saturating_sub(quarantined.iter().map(|&(_, left)| left).max()?);
    // A quorum is possible once `need` of them are out of quarantine.
    quarantined.sort_by_key(|&(_, left)| left);
    let refused_for = quarantined[need - 1].1;
    // Uptimes come in whole seconds.
    let ago = match youngest.as_secs() {
        0 => "just now".to_owned(),
        s => format!("{} ago", fmt_duration(Duration::from_secs(s))),
    };
    Some(format!(
        "{names} started {ago}; a lock is refused for {} more in case they lost keys in a \
         restart (the restart quarantine): wait, or pass --quarantine off if they are new",
        fmt_duration(round_up(refused_for))
    ))
}

/// Rounds up to whole seconds above 1 s, whole milliseconds below (for messages).
fn round_up(d: Duration) -> Duration {
    if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
    } else {
        Duration::from_millis(
            d.as_millis() as u64 + u64::from(!d.subsec_nanos().is_multiple_of(1_000_000)),
        )
    }
}
