//! The deterministic simulator (issue 16): the crate's real engine, rounds and sessions in a
//! simulated world with virtual time. A fixed batch of schedules within the README's
//! assumptions must find no violation; for each safety assumption, fixed seeds that break it
//! must find one, and the same seeds with the assumption kept must not; a majority down stalls
//! instead of violating. Any failing seed replays with `scripts/sim --trace SEED`.

use redlock_mux::sim::{self, Break, Report, Setup};

fn setup(breaks: Break, control: bool) -> Setup {
    Setup {
        breaks,
        control,
        ..Setup::default()
    }
}

/// The schedules of seeds `range` under `setup`, with the trace of the first violation (if
/// any) in the panic message when `none_expected`.
fn batch(range: std::ops::Range<u64>, setup: Setup) -> Vec<Report> {
    range.map(|seed| sim::run(seed, setup, None)).collect()
}

fn explain(seed: u64, setup: Setup) -> String {
    let mut trace = String::new();
    let report = sim::run(seed, setup, Some(&mut trace));
    let tail: Vec<&str> = trace.lines().rev().take(60).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "seed {seed} ({setup:?}): {:?}\nlast events:\n{}",
        report.violation,
        tail.join("\n")
    )
}

/// Schedules run by `scripts/test` within the assumptions (about 1 s in a release build,
/// 10–20 s in a debug one); `scripts/sim` runs millions.
const BATCH: u64 = 1_000;

#[test]
fn a_batch_of_schedules_within_the_assumptions_finds_no_violation() {
    let setup = setup(Break::Nothing, false);
    let reports = batch(0..BATCH, setup);
    for r in &reports {
        assert!(r.violation.is_none(), "{}", explain(r.seed, setup));
        assert!(!r.stalled, "seed {} stalled: {r:?}", r.seed);
        // A schedule is at least 100 lock operations.
        assert!(r.ops >= 100, "seed {}: {r:?}", r.seed);
    }
    let acquired: u64 = reports.iter().map(|r| r.acquired).sum();
    let faults: u64 = reports.iter().flat_map(|r| r.faults).sum();
    // The batch exercises something: locks are taken, and faults happen.
    assert!(
        acquired > 5 * BATCH,
        "{acquired} acquisitions in {BATCH} schedules"
    );
    assert!(faults > BATCH, "{faults} faults in {BATCH} schedules");
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    for seed in [3, 1_000_003] {
        let setup = setup(Break::Nothing, false);
        let (mut a, mut b) = (String::new(), String::new());
        let ra = sim::run(seed, setup, Some(&mut a));
        let rb = sim::run(seed, setup, Some(&mut b));
        assert!(a.lines().count() > 100, "a trace with content:\n{a}");
        assert_eq!(a, b, "seed {seed} replays byte for byte");
        assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
    }
    // And different seeds differ.
    let (mut a, mut b) = (String::new(), String::new());
    sim::run(1, setup(Break::Nothing, false), Some(&mut a));
    sim::run(2, setup(Break::Nothing, false), Some(&mut b));
    assert_ne!(a, b);
}

/// Seeds that break `breaks` and find a violation; with the assumption kept (`control`), the
/// same fault plans find none.
fn assumption_is_needed(breaks: Break, seeds: &[u64]) {
    for &seed in seeds {
        let control = setup(breaks, true);
        let r = sim::run(seed, setup(breaks, false), None);
        assert!(
            r.violation.is_some(),
            "seed {seed} breaks {breaks:?} and should find two holders: {r:?}"
        );
        let r = sim::run(seed, control, None);
        assert!(r.violation.is_none(), "{}", explain(seed, control));
    }
}

#[test]
fn without_restart_quarantine_a_restarted_node_gives_two_holders() {
    assumption_is_needed(Break::Quarantine, &[3, 5, 13]);
}

#[test]
fn clocks_drifting_beyond_the_factor_give_two_holders() {
    assumption_is_needed(Break::ClockDrift, &[0, 12, 19]);
}

#[test]
fn work_past_the_validity_gives_two_holders() {
    assumption_is_needed(Break::WorkPastValidity, &[0, 1, 2]);
}

#[test]
fn a_lying_node_gives_two_holders() {
    assumption_is_needed(Break::LyingNode, &[1, 2, 4]);
}

#[test]
fn with_a_majority_down_runs_stall_and_never_violate() {
    for r in batch(0..100, setup(Break::MajorityDown, false)) {
        assert!(r.violation.is_none(), "seed {}: {r:?}", r.seed);
        assert_eq!(r.acquired, 0, "seed {}: no quorum, no lock: {r:?}", r.seed);
        assert!(r.ops >= 100, "the clients kept trying: {r:?}");
    }
}
