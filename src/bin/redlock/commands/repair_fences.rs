//! `redlock repair-fences`: raise and re-seed blank fence counters, so that
//! fenced locks work again after a majority of the servers lost their counters. The argument
//! and its assumptions: docs/fencing.md, "Repair".

use std::time::Duration;

use clap::Args;
use redlock_mux::{Error, FenceFloor, FenceRepair, NodeFault, NodeRepair};
use serde_json::{Value, json};

use crate::fail::{Fail, Kind, exit, is_config_fault};
use crate::options::{CallOptions, LockOptions};
use crate::text::{columns, fmt_duration};

pub const HELP: &str = "\
Fenced locks need a quorum of seeded fence counters. A restarted server's counter is blank until a
fenced lock re-seeds it, and that needs a seeded quorum: once a majority is blank, every fenced
lock fails until the counters are repaired. The repair reads every counter, then raises each
one (never lowers it) to the larger of the floor and every counter read, and marks it complete
for the server's current process -- on servers up for at least the fenced clients' seed window
(the larger of --quarantine and --ttl, as theirs is; --ttl defaults to 30s).

Each of the two round trips waits --node-timeout (default 1s) for the answers; the other lock
options are taken and ignored.

Which floor (see docs/fencing.md, \"Repair\"):
  (neither)     repair only if a quorum of the counters read is seeded (a minority was blank):
                safe without a floor; otherwise nothing is written and it exits 64
  --at-least N  N is at least every fence ever handed out: the highest fence the protected
                resources accepted, plus a margin for fences handed out and not yet presented
  --no-floor    no fence handed out before the repair will be presented after it (every such
                holder has stopped); later fences may be lower than earlier ones

Exit codes: 0 repaired on a quorum; 64 usage, or no floor given and fewer than a quorum of
counters seeded; 69 fewer than a quorum of servers could be repaired; 77 authentication refused;
78 the servers do not match the configuration; 80 too many restarted servers are still inside
the seed window: retry later.";

#[derive(Args, Debug)]
pub struct RepairFencesArgs {
    /// Every fence ever handed out is at most N (the highest fence the protected resources
    /// accepted, plus a margin): counters are raised to at least N
    #[arg(long, value_name = "N", conflicts_with = "no_floor")]
    pub at_least: Option<u64>,
    /// No floor: asserts that no holder of a fence handed out before the repair will present
    /// it after the repair (fences after it may be lower than earlier ones)
    #[arg(long)]
    pub no_floor: bool,
    // (repair-fences uses the servers, the TLS options, --node-timeout as how long each of its
    // two round trips waits for the answers, default 1s, and --quarantine and --ttl for the
    // seed window the fenced clients use: the larger of the two, as theirs is; it ignores the
    // others)
    #[command(flatten)]
    pub call: CallOptions,
}

/// The fenced clients' TTL when `--ttl` is not given: `acquire`'s default.
const DEFAULT_TTL: Duration = super::acquire::DEFAULT_TTL;

/// The seed window the fenced clients use with these options (`Config::seed_window`): their
/// quarantine window, and at least their TTL; with the quarantine off, their TTL.
fn seed_window(opts: &LockOptions) -> Duration {
    let ttl = opts.ttl_or(DEFAULT_TTL);
    opts.tuning
        .window(ttl)
        .map_or(ttl, |window| window.max(ttl))
}

pub fn repair_fences(a: &RepairFencesArgs) -> Result<u8, Fail> {
    let floor = match (a.at_least, a.no_floor) {
        (Some(n), _) => FenceFloor::AtLeast(n),
        (None, true) => FenceFloor::EarlierHoldersStopped,
        (None, false) => FenceFloor::SeededQuorum,
    };
    // The window is the seed window, as the handle's quarantine.
    let opts = &a.call.opts;
    let r = opts.probe(Some(seed_window(opts)))?;
    let timeout = opts.answer_timeout();
    let (repair, error) = match r.repair_fences(floor, timeout) {
        Ok(repair) => (repair, None),
        Err(Error::FenceRepair(repair)) => {
            let repair = *repair;
            let fail = failure(&repair);
            (repair, Some(fail))
        }
        Err(e) => return Err(Fail::lib("cannot repair the fence counters", &e)),
    };
    let code = error.as_ref().map_or(exit::OK, |f| f.code);
    a.call.output.report(
        || {
            let mut object = to_json(&repair, floor);
            object["exit_code"] = code.into();
            object["message"] = error.as_ref().map(|f| f.message.clone()).into();
            object["error"] = error.as_ref().map(|f| f.kind.name()).into();
            object
        },
        || table(&repair, floor) + &summary(&repair),
    );
    if let Some(fail) = error {
        say!("redlock: {}", fail.message);
    }
    Ok(code)
}

/// The exit code and message of a repair that did not reach a quorum.
fn failure(repair: &FenceRepair) -> Fail {
    if repair.needs_floor {
        return Fail::new(
            exit::USAGE,
            format!(
                "not repaired: only {} of {} counters are seeded, {} needed to trust their \
                 maximum ({}); fences handed out before may be higher. Give --at-least N, N at \
                 least every fence ever handed out (the highest your resources accepted, plus a \
                 margin), or --no-floor if no holder of an earlier fence can still present it",
                repair.seeded_read,
                repair.nodes.len(),
                repair.quorum,
                repair.highest_read
            ),
        );
    }
    let message = format!("cannot repair the fence counters: {repair}");
    let faults = || repair.nodes.iter().filter_map(|n| n.fault.as_ref());
    if faults().any(|f| matches!(f.root(), NodeFault::Auth(_))) {
        return Fail::new(exit::AUTH, message);
    }
    if faults().any(is_config_fault) {
        return Fail::new(exit::CONFIG, message);
    }
    // Short of a quorum only because restarted servers are inside their window: retry then.
    let waiting: Vec<Duration> = faults()
        .filter_map(|f| match f {
            NodeFault::SeedWindow(left) => Some(*left),
            _ => None,
        })
        .collect();
    let need = repair.quorum.saturating_sub(repair.repaired);
    if need > 0 && waiting.len() >= need {
        let mut waiting = waiting;
        waiting.sort();
        let mut fail = Fail::new(
            exit::QUARANTINED,
            format!(
                "{message}; restarted servers are inside the seed window (--quarantine, \
                 --ttl): retry in {}",
                fmt_duration(round_up_secs(waiting[need - 1]))
            ),
        );
        fail.kind = Kind::Quarantined;
        return fail;
    }
    Fail::new(exit::UNAVAILABLE, message)
}

/// Whole seconds, rounded up (server uptimes count whole seconds).
fn round_up_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// A counter as read: the number, "(blank)" when not seeded for the node's process, "-" when
/// there is none.
fn fmt_before(n: &NodeRepair) -> String {
    match n.before {
        Some(counter) if n.seeded => counter.to_string(),
        Some(0) => "- (blank)".to_owned(),
        Some(counter) => format!("{counter} (blank)"),
        None => "?".to_owned(),
    }
}

/// One row: the node, its counter before and after, or why it was not repaired.
fn row(n: &NodeRepair) -> [String; 4] {
    let after = match n.after {
        Some(v) => v.to_string(),
        None => "-".to_owned(),
    };
    let why = match &n.fault {
        Some(f) => format!("not repaired: {f}"),
        None if n.after.is_some() => String::new(),
        None => "not written".to_owned(),
    };
    [n.node.clone(), fmt_before(n), after, why]
}

/// The heading and one aligned row per node.
fn table(repair: &FenceRepair, floor: FenceFloor) -> String {
    let n = repair.nodes.len();
    let mut rows = vec![["NODE", "BEFORE", "AFTER", ""].map(str::to_owned).to_vec()];
    rows.extend(repair.nodes.iter().map(|node| row(node).to_vec()));
    format!(
        "fence counters on {n} node{} (quorum {}), floor {}:\n{}",
        if n == 1 { "" } else { "s" },
        repair.quorum,
        floor,
        columns(&rows)
    )
}

/// What the repair came to, on one line.
fn summary(repair: &FenceRepair) -> String {
    let n = repair.nodes.len();
    if repair.needs_floor {
        return format!(
            "nothing written: {} of {n} counters seeded, {} needed without a floor\n",
            repair.seeded_read, repair.quorum
        );
    }
    if repair.repaired < repair.quorum {
        return format!(
            "repaired {} of {n} counters, {} needed: fenced locks still refuse\n",
            repair.repaired, repair.quorum
        );
    }
    format!(
        "repaired {} of {n} counters ({} needed): each holds at least {}; a fenced lock taken \
         from now on gets a fence above it\n",
        repair.repaired, repair.quorum, repair.value
    )
}

/// The `--json` object.
fn to_json(repair: &FenceRepair, floor: FenceFloor) -> Value {
    let nodes: Vec<Value> = repair
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node": n.node,
                "before": n.before.map(|counter| json!({"counter": counter, "seeded": n.seeded})),
                "after": n.after,
                "error": n.fault.as_ref().map(ToString::to_string),
            })
        })
        .collect();
    json!({
        "ok": repair.repaired >= repair.quorum,
        "command": "repair-fences",
        "quorum": repair.quorum,
        "floor": repair.floor,
        "mode": match floor {
            FenceFloor::AtLeast(_) => "at_least",
            FenceFloor::EarlierHoldersStopped => "no_floor",
            _ => "seeded_quorum",
        },
        "highest_read": repair.highest_read,
        "value": repair.value,
        "seeded_read": repair.seeded_read,
        "repaired": repair.repaired,
        "nodes": nodes,
    })
}
