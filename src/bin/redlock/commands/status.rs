//! `redlock status`: what each node holds for a resource, and whether a quorum holds it.

use std::time::Duration;

use clap::Args;
use redlock_mux::{Eviction, NodeStatus, Redlock};
use serde_json::{Value, json};

use crate::fail::{Fail, check_reachable, exit};
use crate::json::round_ms;
use crate::options::CallOptions;
use crate::text::{NAME_SHOWN, columns, shorten};

pub const HELP: &str = "\
Of the lock options, status uses the servers, the TLS options, --node-timeout (how long it waits
for the answers, default 1s) and --quarantine (the window the lock holders use: by default the one
run and acquire use, 30s, or --ttl if longer), and ignores the others.

With --permits P, RESOURCE is a counting semaphore: every permit RESOURCE#i is shown, then how
many are held; 0 means every permit is held by a quorum (an acquire would wait), 1 that one at
least is not, 69 that it is unknown: too few nodes answered, or, with no permit surely free, the
nodes that did not answer could complete a quorum with those that hold a permit (as for one lock).

Exit codes: 0 held by a quorum; 1 not held by a quorum (free, or split between tokens);
69 fewer than a quorum of nodes answered (the state is unknown); 64 usage; 77 authentication
refused. With -q it prints nothing: `redlock status -q RESOURCE && echo held`.";

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The name of the lock; several names (or a `redlock:set:…` name): each member in turn,
    /// exit 0 only if a quorum holds every one (a JSON object per line with --json)
    #[arg(required = true, num_args = 1.., value_name = "RESOURCE")]
    pub resources: Vec<String>,
    // (status uses the servers, the TLS options, --node-timeout as how long it waits for the
    // answers, default 1s, and --quarantine, the window the lock holders use; it ignores the
    // others)
    #[command(flatten)]
    pub call: CallOptions,
}

/// What a quorum of the nodes says.
enum Verdict {
    /// A quorum holds this value (a token, or `<token> <owner>`), for this long at most
    /// (`None`: no expiry).
    Held {
        value: Vec<u8>,
        nodes: usize,
        left_ms: Option<i64>,
    },
    /// Read-locked (shared) on a quorum: readers hold it, at most this many on one node.
    Read { nodes: usize, readers: usize },
    /// Some nodes hold it, no value has a quorum: at most `nodes` hold `value`.
    Split { value: Vec<u8>, nodes: usize },
    /// No reachable node holds it, and a quorum answered.
    Free,
    /// No reachable node holds it, but too few answered to say.
    Unknown,
    /// Fewer than a quorum of the nodes that answered hold it (a token, or readers), but with
    /// those that did not answer they would make one: it may be held.
    Maybe { nodes: usize, unreachable: usize },
}

pub fn status(a: &StatusArgs) -> Result<u8, Fail> {
    // The quarantine window only says which nodes are in it (status takes no lock).
    let opts = &a.call.opts;
    // The holders' window: theirs is the default one, or their --ttl if longer (as `run` and
    // `acquire` compute it), and the TTL they use is --ttl's if given.
    let window = opts.tuning.window(opts.ttl.unwrap_or(Duration::ZERO));
    let timeout = opts.answer_timeout();
    let r = opts.probe(window)?;
    if let Some(permits) = opts.permits {
        let [name] = a.resources.as_slice() else {
            return Err(Fail::new(
                exit::USAGE,
                "--permits takes one RESOURCE (the semaphore's name)",
            ));
        };
        return permits_status(a, &r, name, permits, timeout);
    }
    // Each name, a set's members each.
    let mut names: Vec<String> = Vec::new();
    for name in &a.resources {
        match redlock_mux::keys::set_members(name.as_bytes()) {
            Some(members) => {
                names.extend(members.map(|m| String::from_utf8_lossy(m).into_owned()));
            }
            None => match redlock_mux::keys::shared_name(name.as_bytes()) {
                // A shared lock's name (`run --shared`'s REDLOCK_RESOURCE): its resource.
                Some(of) => names.push(String::from_utf8_lossy(of).into_owned()),
                None => names.push(name.clone()),
            },
        }
    }
    // An empty name is no key (acquire refuses it too), not a free lock (exit 1). So is a
    // set's empty member, or a shared lock's empty name.
    if names.iter().any(String::is_empty) {
        return Err(Fail::new(
            exit::USAGE,
            "status: empty resource name: give the name of the lock",
        ));
    }
    let mut worst = exit::OK;
    for name in &names {
        let code = status_of(a, &r, name, timeout)?;
        if worst == exit::OK || (worst == exit::NOT_HELD && code != exit::OK) {
            worst = code;
        }
    }
    Ok(worst)
}

/// The status of one resource: prints it, answers its exit code.
fn status_of(a: &StatusArgs, r: &Redlock, resource: &str, timeout: Duration) -> Result<u8, Fail> {
    let statuses = r
        .with_client(|c| c.status(resource.as_bytes(), timeout))
        .map_err(|e| Fail::lib("cannot ask the servers", &e))?;
    let verdict = verdict(&statuses);
    let reachable = check_reachable(&statuses, "status");
    let code = match (&reachable, &verdict) {
        (Err(fail), _) => fail.code,
        (Ok(()), Verdict::Held { .. } | Verdict::Read { .. }) => exit::OK,
        // Nobody can say, as when too few answered.
        (Ok(()), Verdict::Maybe { .. }) => exit::UNAVAILABLE,
        (Ok(()), _) => exit::NOT_HELD,
    };
    let output = &a.call.output;
    output.report(
        || {
            let mut object = to_json(resource, &statuses, &verdict);
            object["exit_code"] = code.into();
            let maybe = match &verdict {
                Verdict::Maybe { nodes, unreachable } => {
                    Some(maybe_held(resource, *nodes, *unreachable, statuses.len()))
                }
                _ => None,
            };
            object["message"] = reachable
                .as_ref()
                .err()
                .map(|f| f.message.clone())
                .or(maybe)
                .into();
            object
        },
        || table(resource, &statuses) + &summary(resource, &statuses, &verdict),
    );
    // The one JSON object is printed: the failure goes to stderr only, and with -q nowhere (the
    // exit code says it).
    if let Err(fail) = reachable
        && !output.quiet
    {
        say!("redlock: {}", fail.message);
    }
    Ok(code)
}

/// `status --permits P RESOURCE`: every permit's table and verdict, then how many are held.
/// Exit 0 when every permit is held by a quorum (an acquire would have to wait), 1 when one at
/// least is not, 69 when a permit's nodes could not make a quorum of answers, or when no permit
/// is surely free but one may be held ([`Verdict::Maybe`]: nobody can say, as `status_of`
/// answers for one lock; counted as not held, exit 1, a script would take it for a free
/// permit).
fn permits_status(
    a: &StatusArgs,
    r: &Redlock,
    name: &str,
    permits: u32,
    timeout: Duration,
) -> Result<u8, Fail> {
    let semaphore = r.semaphore(name, permits).map_err(|e| Fail::of(&e))?;
    let mut seen = Permits::default();
    for i in 0..permits {
        let key = String::from_utf8_lossy(semaphore.permit_key(i).unwrap_or_default()).into_owned();
        let statuses = r
            .with_client(|c| c.status(key.as_bytes(), timeout))
            .map_err(|e| Fail::lib("cannot ask the servers", &e))?;
        seen.add(i, &key, &statuses, a.call.output.json);
    }
    let code = seen.code(permits);
    let Permits {
        objects,
        text,
        held,
        unknown,
        maybe,
        unreachable,
    } = seen;
    let output = &a.call.output;
    output.report(
        || {
            json!({
                "ok": code == exit::OK,
                "command": "status",
                "resource": name,
                "permits": permits,
                "held": held,
                "unknown": unknown,
                "permit": objects,
                "exit_code": code,
                "message": unreachable.as_ref().map(|f| f.message.clone()).or(maybe),
            })
        },
        || {
            text + &format!(
                "{held} of {permits} permits of {} held{}\n",
                shorten(name, NAME_SHOWN),
                match unknown {
                    0 => String::new(),
                    n => format!(", {n} unknown (may be held)"),
                }
            )
        },
    );
    if let Some(fail) = unreachable
        && !output.quiet
    {
        say!("redlock: {}", fail.message);
    }
    Ok(code)
}

/// What the permits of a semaphore said, gathered one permit after the other.
#[derive(Default)]
struct Permits {
    /// Each permit's `--json` object.
    objects: Vec<Value>,
    /// Each permit's table and verdict.
    text: String,
    /// Permits held by a quorum.
    held: usize,
    /// Permits that may be held (`Verdict::Maybe`), and what the first of them says.
    unknown: usize,
    maybe: Option<String>,
    /// The first permit whose nodes could not make a quorum of answers.
    unreachable: Option<Fail>,
}

impl Permits {
    /// Permit `i`, the lock `key`, as its nodes answered.
    fn add(&mut self, i: u32, key: &str, statuses: &[NodeStatus], json: bool) {
        let verdict = verdict(statuses);
        self.held += usize::from(matches!(verdict, Verdict::Held { .. }));
        if let Verdict::Maybe { nodes, unreachable } = verdict {
            self.unknown += 1;
            self.maybe
                .get_or_insert_with(|| maybe_held(key, nodes, unreachable, statuses.len()));
        }
        if let Err(fail) = check_reachable(statuses, "status") {
            self.unreachable.get_or_insert(fail);
        }
        if json {
            self.objects.push(to_json(key, statuses, &verdict));
        } else {
            self.text += &format!("permit {i} ({}):\n", shorten(key, NAME_SHOWN));
            self.text += &(table(key, statuses) + &summary(key, statuses, &verdict));
        }
    }

    /// A permit that is surely not held settles it (an acquire would get one), whatever the
    /// others are; without one, a permit that may be held leaves it unknown.
    fn code(&self, permits: u32) -> u8 {
        match (
            &self.unreachable,
            self.held + self.unknown == permits as usize,
            self.unknown,
        ) {
            (Some(fail), ..) => fail.code,
            (None, false, _) => exit::NOT_HELD,
            (None, true, 0) => exit::OK,
            (None, true, _) => exit::UNAVAILABLE,
        }
    }
}

fn verdict(statuses: &[NodeStatus]) -> Verdict {
    let quorum = statuses.len() / 2 + 1;
    // Distinct values held, with the PTTLs of the nodes holding each.
    let mut holders: Vec<(Vec<u8>, Vec<i64>)> = Vec::new();
    for s in statuses {
        if let Ok((Some(value), pttl)) = &s.state {
            match holders.iter_mut().find(|(v, _)| v == value) {
                Some((_, ttls)) => ttls.push(*pttl),
                None => holders.push((value.clone(), vec![*pttl])),
            }
        }
    }
    holders.sort_by_key(|(_, ttls)| std::cmp::Reverse(ttls.len()));
    let read: Vec<usize> = statuses.iter().filter_map(|s| s.readers).collect();
    if read.len() >= quorum {
        return Verdict::Read {
            nodes: read.len(),
            readers: read.iter().copied().max().unwrap_or(0),
        };
    }
    let up = statuses.iter().filter(|s| s.state.is_ok()).count();
    // Not a quorum among the nodes that answered, but the silent ones could complete one: a
    // holder (or readers) may have it there. (Before, this said "not held", exit 1.)
    let most = holders
        .first()
        .map_or(0, |(_, ttls)| ttls.len())
        .max(read.len());
    let unreachable = statuses.len() - up;
    if most < quorum && most > 0 && most + unreachable >= quorum {
        return Verdict::Maybe {
            nodes: most,
            unreachable,
        };
    }
    match holders.into_iter().next() {
        Some((value, mut ttls)) if ttls.len() >= quorum => {
            // The quorum lasts as long as the quorum-th longest PTTL among the holders.
            ttls.sort_by_key(|&t| std::cmp::Reverse(if t == -1 { i64::MAX } else { t }));
            let left_ms = Some(ttls[quorum - 1]).filter(|&t| t != -1);
            Verdict::Held {
                value,
                nodes: ttls.len(),
                left_ms,
            }
        }
        Some((value, ttls)) => Verdict::Split {
            value,
            nodes: ttls.len(),
        },
        None if up >= quorum => Verdict::Free,
        None => Verdict::Unknown,
    }
}

/// What [`Verdict::Maybe`] says: the summary's last line (after `unknown: `) and the JSON
/// object's `message`.
fn maybe_held(resource: &str, nodes: usize, unreachable: usize, n: usize) -> String {
    format!(
        "{nodes} of {n} nodes hold {} and {unreachable} did not answer: with them a quorum \
         ({}) may hold it",
        shorten(resource, NAME_SHOWN),
        n / 2 + 1
    )
}

/// How much of a token the table and the verdict show, in characters: enough to tell two
/// tokens apart at a glance (they are random), and the TOKEN column stays narrow.
const TOKEN_SHOWN: usize = 10;

/// The table's columns.
const HEADER: [&str; 10] = [
    "NODE",
    "REACHABLE",
    "KEY",
    "TOKEN",
    "PTTL",
    "RTT",
    "FENCE",
    "QUARANTINE",
    "EVICTS",
    "OWNER",
];

/// The owner a lock's value records (`--owner`), for the terminal.
fn owner_of(value: &[u8]) -> Option<String> {
    redlock_mux::split_value(value)
        .1
        .map(crate::text::owner_text)
}

/// The token in a lock's value, without the owner.
fn token_of(value: &[u8]) -> &[u8] {
    redlock_mux::split_value(value).0
}

/// What a node's `INFO memory` said about evicting keys, as the table and `--json` show it:
/// `no`, the policy (its yes does not count unless the client counts evicting servers), or
/// `unknown`.
fn eviction(e: Eviction) -> &'static str {
    match e {
        Eviction::Never => "no",
        Eviction::May(policy) => policy.name(),
        _ => "unknown",
    }
}

/// The first characters of a token, for display.
fn token_prefix(value: &[u8]) -> String {
    let s = String::from_utf8_lossy(value);
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(TOKEN_SHOWN).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// A node's fence counter: the number, "(blank)" when it is not seeded for the node's current
/// process, "-" when there is none.
fn fmt_fence(s: &NodeStatus) -> String {
    match s.fence {
        Some(f) if f.counter == 0 && !f.seeded => "-".into(),
        Some(f) if f.seeded => f.counter.to_string(),
        Some(f) => format!("{} (blank)", f.counter),
        None => "?".into(),
    }
}

fn fmt_rtt(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// One row of the table; an unreachable node's reason runs to the end of its line.
fn row(s: &NodeStatus) -> Vec<String> {
    match &s.state {
        Ok((value, pttl)) => {
            let (key, token, pttl) = match value {
                Some(_) => (
                    "held",
                    token_prefix(s.token().unwrap_or_default()),
                    match *pttl {
                        -1 => "no expiry".to_owned(),
                        ms if ms < 0 => "-".to_owned(),
                        ms => format!("{ms} ms"),
                    },
                ),
                None => match s.readers {
                    Some(n) => (
                        "read",
                        format!("{n} reader{}", if n == 1 { "" } else { "s" }),
                        format!("{pttl} ms"),
                    ),
                    None => ("free", "-".into(), "-".into()),
                },
            };
            vec![
                s.node.clone(),
                "yes".into(),
                key.into(),
                token,
                pttl,
                fmt_rtt(s.rtt),
                fmt_fence(s),
                match s.quarantine {
                    Some(left) => format!("{:.1} s left", left.as_secs_f64()),
                    None => "-".into(),
                },
                eviction(s.eviction).into(),
                s.owner()
                    .map_or_else(|| "-".into(), crate::text::owner_text),
            ]
        }
        Err(f) => vec![s.node.clone(), format!("no: {f}")],
    }
}

/// The heading and one aligned row per node.
fn table(resource: &str, statuses: &[NodeStatus]) -> String {
    let n = statuses.len();
    let mut rows = vec![HEADER.map(str::to_owned).to_vec()];
    rows.extend(statuses.iter().map(row));
    format!(
        "{} on {n} node{} (quorum {}):\n{}",
        shorten(resource, NAME_SHOWN),
        if n == 1 { "" } else { "s" },
        n / 2 + 1,
        columns(&rows)
    )
}

/// The verdict line, and the fence counters' line when there are any.
fn summary(resource: &str, statuses: &[NodeStatus], verdict: &Verdict) -> String {
    let n = statuses.len();
    let quorum = n / 2 + 1;
    let up = statuses.iter().filter(|s| s.state.is_ok()).count();
    let mut out = match verdict {
        Verdict::Held {
            value,
            nodes,
            left_ms,
        } => format!(
            "held by a quorum: {nodes} of {n} nodes hold token {}{} (quorum {quorum}), {}\n",
            token_prefix(token_of(value)),
            match owner_of(value) {
                Some(o) => format!(", owner {o}"),
                None => String::new(),
            },
            match left_ms {
                Some(ms) => format!("for {ms} ms more at most"),
                None => "with no expiry".to_owned(),
            }
        ),
        Verdict::Read { nodes, readers } => format!(
            "read-locked: readers hold it on {nodes} of {n} nodes (quorum {quorum}), at most \
             {readers} on one node (expired readers count until another reader's release \
             drops them)\n"
        ),
        Verdict::Split { value, nodes } => format!(
            "not held by a quorum: at most {nodes} of {n} nodes agree (token {}), {quorum} \
             needed\n",
            token_prefix(token_of(value))
        ),
        Verdict::Free => format!("free: no node holds {}\n", shorten(resource, NAME_SHOWN)),
        Verdict::Unknown => format!(
            "unknown: no reachable node holds {}, but only {up} of {n} answered\n",
            shorten(resource, NAME_SHOWN)
        ),
        Verdict::Maybe { nodes, unreachable } => {
            format!(
                "unknown: {}\n",
                maybe_held(resource, *nodes, *unreachable, n)
            )
        }
    };
    // Every fence handed out so far went to a quorum, so the largest counter of any quorum of
    // seeded nodes is at least the last one.
    let seeded = statuses
        .iter()
        .filter(|s| s.fence.is_some_and(|f| f.seeded))
        .count();
    let top = statuses
        .iter()
        .filter_map(|s| s.fence.map(|f| f.counter))
        .max();
    if let Some(top) = top.filter(|&t| t > 0) {
        out.push_str(&format!(
            "fences: counter {top} at most; {seeded} of {n} counters seeded ({quorum} needed for \
             fenced locks)\n"
        ));
    }
    out
}

/// The `--json` object: the verdict and every node.
fn to_json(resource: &str, statuses: &[NodeStatus], verdict: &Verdict) -> Value {
    let nodes: Vec<Value> = statuses
        .iter()
        .map(|s| {
            let (held, token, pttl_ms, error) = match &s.state {
                Ok((v, pttl)) => (
                    Some(v.is_some()),
                    v.as_ref()
                        .map(|v| String::from_utf8_lossy(token_of(v)).into_owned()),
                    v.as_ref().map(|_| *pttl),
                    None,
                ),
                Err(f) => (None, None, None, Some(f.to_string())),
            };
            json!({
                "node": s.node,
                "reachable": s.state.is_ok(),
                "held": held,
                "token": token,
                "owner": s.owner().map(String::from_utf8_lossy),
                "pttl_ms": pttl_ms,
                "readers": s.readers,
                "rtt_ms": s.state.is_ok().then_some(round_ms(s.rtt.as_secs_f64() * 1000.0)),
                "fence": s.fence.map(|f| json!({"counter": f.counter, "seeded": f.seeded})),
                "uptime_s": s.uptime.map(|u| u.as_secs()),
                "quarantine_ms": s.quarantine.map(|q| q.as_millis() as u64),
                "evicts": eviction(s.eviction),
                "error": error,
            })
        })
        .collect();
    let (state, holder) = match verdict {
        Verdict::Held {
            value,
            nodes,
            left_ms,
        } => (
            "held",
            json!({
                "token": String::from_utf8_lossy(token_of(value)),
                "owner": redlock_mux::split_value(value).1.map(String::from_utf8_lossy),
                "nodes": nodes,
                "left_ms": left_ms,
            }),
        ),
        Verdict::Read { nodes, readers } => ("read", json!({"nodes": nodes, "readers": readers})),
        Verdict::Split { .. } => ("split", Value::Null),
        Verdict::Free => ("free", Value::Null),
        Verdict::Unknown | Verdict::Maybe { .. } => ("unknown", Value::Null),
    };
    json!({
        "ok": matches!(verdict, Verdict::Held { .. } | Verdict::Read { .. }),
        "command": "status",
        "resource": resource,
        "quorum": statuses.len() / 2 + 1,
        "state": state,
        "holder": holder,
        "nodes": nodes,
    })
}
