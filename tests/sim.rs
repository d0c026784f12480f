//! The deterministic simulator: the crate's real engine, rounds and sessions in a
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

/// Runs `seed` again with a trace: its report, and the trace's last 60 events.
fn replay(seed: u64, setup: Setup) -> (Report, String) {
    let mut trace = String::new();
    let report = sim::run(seed, setup, Some(&mut trace));
    let tail: Vec<&str> = trace.lines().rev().take(60).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    (report, tail.join("\n"))
}

fn explain(seed: u64, setup: Setup) -> String {
    let (report, tail) = replay(seed, setup);
    format!(
        "seed {seed} ({setup:?}): {:?}\nlast events:\n{tail}",
        report.violation
    )
}

fn explain_cover(seed: u64, setup: Setup) -> String {
    let (report, tail) = replay(seed, setup);
    format!(
        "seed {seed} ({setup:?}): {:?}\nlast events:\n{tail}",
        report.cover
    )
}

fn explain_liveness(seed: u64, setup: Setup) -> String {
    let (report, tail) = replay(seed, setup);
    format!(
        "seed {seed} ({setup:?}): {:?} {:?} {:?} {:?}\nlast events:\n{tail}",
        report.liveness, report.connect_violation, report.progress, report.late
    )
}

/// No overlap, no validity the nodes do not back, and [`assert_live`]: what a schedule within
/// the assumptions must show.
fn assert_safe_and_live(r: &Report, setup: Setup) {
    assert!(r.violation.is_none(), "{}", explain(r.seed, setup));
    assert!(r.cover.is_none(), "{}", explain_cover(r.seed, setup));
    assert_live(r, setup);
}

/// No stall, no wait past its bound or its deadline, no reconnects beyond what the faults
/// explain.
fn assert_live(r: &Report, setup: Setup) {
    assert!(!r.stalled, "seed {} stalled: {r:?}", r.seed);
    assert!(r.liveness.is_none(), "{}", explain_liveness(r.seed, setup));
    assert!(r.late.is_none(), "{}", explain_liveness(r.seed, setup));
    assert!(
        r.connect_violation.is_none(),
        "{}",
        explain_liveness(r.seed, setup)
    );
}

/// Schedules run by `scripts/test` within the assumptions (about 1 s in a release build,
/// 10–20 s in a debug one); `scripts/sim` runs millions.
const BATCH: u64 = 1_000;

#[test]
fn a_batch_of_schedules_within_the_assumptions_finds_no_violation() {
    let setup = setup(Break::Nothing, false);
    let reports = batch(0..BATCH, setup);
    for r in &reports {
        assert_safe_and_live(r, setup);
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
    // Waits reach their deadlines (the deadline check has something to look at).
    let overruns = reports.iter().filter(|r| !r.longest_overrun.is_zero());
    assert!(overruns.count() > 0, "no wait ended after its deadline");
}

/// Fair locks (`Setup::fair`, `Config::fair`): every client's plain locks go through each
/// node's queue; no overlap, no validity the nodes do not back, no stall, every wait within the
/// bounds, alone and beside readers and sets. Seed 45 found two holders in the first fair runs:
/// the fair acquire was missing from the scripts whose yes a restarted node's quarantine doubts.
#[test]
fn fair_locks_find_no_violation() {
    let fair = Setup {
        fair: true,
        ..Setup::default()
    };
    let kinds = Setup {
        shared: true,
        sets: true,
        ..fair
    };
    let r = sim::run(45, fair, None);
    assert!(r.violation.is_none(), "{}", explain(45, fair));
    for setup in [fair, kinds] {
        let reports = batch(0..300, setup);
        for r in &reports {
            assert_safe_and_live(r, setup);
        }
        let acquired: u64 = reports.iter().map(|r| r.acquired).sum();
        assert!(
            acquired > 5 * 300,
            "{acquired} acquisitions in 300 schedules"
        );
    }
}

/// Async callers that drop their waits (`Setup::cancel`): a lock won for a caller that is gone
/// is released by the engine, the waiters behind it go on, and nothing else changes — no
/// overlap, no validity the nodes do not back, no stall, every wait within the bounds, with
/// plain locks, readers and sets.
#[test]
fn dropped_async_waits_find_no_violation() {
    for (shared, sets) in [(false, false), (true, true)] {
        let setup = Setup {
            cancel: true,
            shared,
            sets,
            ..Setup::default()
        };
        let reports = batch(0..200, setup);
        for r in &reports {
            assert!(r.violation.is_none(), "{}", explain(r.seed, setup));
            assert!(r.cover.is_none(), "{}", explain_cover(r.seed, setup));
            assert!(!r.stalled, "seed {} stalled: {r:?}", r.seed);
            assert!(
                r.liveness.is_none() && r.late.is_none() && r.connect_violation.is_none(),
                "{}",
                explain_liveness(r.seed, setup)
            );
        }
        let dropped: u64 = reports.iter().map(|r| r.dropped).sum();
        assert!(dropped > 1_000, "{dropped} waits dropped in 200 schedules");
    }
}

/// An owner on every lock (`Config::owner`: each value is `<token> <owner>`) changes nothing
/// but the values: the same schedules, traced byte for byte, with plain locks, readers and
/// sets, fenced or not, their releases, extends and fence write-backs recognising the token alone (compared whole, every
/// schedule here fails the cover check), and a batch finds no violation.
#[test]
fn an_owner_on_every_lock_changes_nothing_but_the_values() {
    let plain = Setup {
        shared: true,
        sets: true,
        ..Setup::default()
    };
    let owned = Setup {
        owner: true,
        ..plain
    };
    // Fenced too: the fence's write-back finds the lock by its token.
    let fenced = |s: Setup| Setup { fencing: true, ..s };
    for (seed, fence) in (0..20)
        .map(|s| (s, false))
        .chain((20..30).map(|s| (s, true)))
    {
        let (plain, owned) = match fence {
            true => (fenced(plain), fenced(owned)),
            false => (plain, owned),
        };
        let (mut a, mut b) = (String::new(), String::new());
        sim::run(seed, plain, Some(&mut a));
        let r = sim::run(seed, owned, Some(&mut b));
        assert!(r.acquired > 0, "seed {seed}: {r:?}");
        assert!(!fence || r.fenced > 0, "seed {seed}: {r:?}");
        assert_eq!(a, b, "seed {seed}: the owner changed the schedule");
    }
    for r in &batch(1_000..1_200, owned) {
        assert!(r.violation.is_none(), "{}", explain(r.seed, owned));
        assert!(r.cover.is_none(), "{}", explain_cover(r.seed, owned));
        assert!(!r.stalled, "seed {} stalled: {r:?}", r.seed);
    }
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
    // With sets and readers too (a member's notice wakes several queues: once in the hash
    // map's order, which made two runs of one seed differ).
    let kinds = kinds();
    for seed in [18_472, 7] {
        let (mut a, mut b) = (String::new(), String::new());
        sim::run(seed, kinds, Some(&mut a));
        sim::run(seed, kinds, Some(&mut b));
        assert_eq!(
            a, b,
            "seed {seed} with sets and readers replays byte for byte"
        );
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

/// The schedules of `seeds` in `breaks`'s family with the assumption kept: no violation, no
/// stall, every caller granted within the liveness bound, no reconnect beyond its faults.
fn control_is_safe_and_live(breaks: Break, seeds: std::ops::Range<u64>) {
    let control = setup(breaks, true);
    for r in batch(seeds, control) {
        assert!(r.violation.is_none(), "{}", explain(r.seed, control));
        assert!(!r.stalled, "seed {} stalled: {r:?}", r.seed);
        assert!(
            r.liveness.is_none() && r.connect_violation.is_none(),
            "{}",
            explain_liveness(r.seed, control)
        );
    }
}

#[test]
fn without_restart_quarantine_a_restarted_node_gives_two_holders() {
    // Seeds re-found whenever the schedules change (last: waiters leave at their deadline,
    // seed 541,056's fix; before, several callers per client and persistent wants, release
    // notices by pub/sub): other schedules, not a weaker check.
    // Seeds 7 and 9 gave way to 10 and 15, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
    assumption_is_needed(Break::Quarantine, &[1, 10, 15]);
}

#[test]
fn a_new_client_that_reads_a_young_nodes_uptime_at_its_word_gives_two_holders() {
    // Redis's uptime is whole seconds of the clock now less those at the start, up to a second
    // high; the simulated nodes count it so. A client that sees a node for the first time
    // soon after a rolling restart and takes "1" at its word counts the node up to a second
    // early, while a lock the node forgot is still held (the defect fixed in 6614cb1; with
    // the nodes rounding down, as they did before, these seeds find nothing). Seed 36 gave
    // way to 450 when an extend refused where the lock needs its keys began to end its
    // validity: there the holder's extend was refused by the three restarted nodes, and it
    // believed on until its old validity, into the rival's hold; it stops at the refusal now.
    let breaks = Break::UptimeAtItsWord;
    // Seeds 206 and 450 gave way to 10 and 35, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
    assumption_is_needed(breaks, &[10, 35, 39]);
    // With the uptime read a second short, the family's schedules find no violation, and
    // every caller is granted within the liveness bound.
    control_is_safe_and_live(breaks, 0..200);
}

#[test]
fn a_replacement_taken_by_its_uptime_after_refusals_gives_two_holders() {
    // Nodes come back as processes up for an hour without the keys (a failover, a moved
    // address); the restart tracking brought back to learning which process a node is from
    // counted yeses only: a client that heard only refusals takes the replacement by its
    // uptime and counts it at once (both the engine's answers and the
    // session's handshakes now tell it). Seed 5 gave way to seed 1 when kept locks began to
    // try a lost renewal again (415 of 3,000 seeds find two holders since, 383 before), and
    // seed 1 to seed 9 when lost kept locks began to be left to their holders (412 of 3,000);
    // seed 8 to 17 when a lost round's cleanup went quiet (its notices no longer bring the next
    // attempts: different schedules).
    let breaks = Break::RunIdOnYesOnly;
    assumption_is_needed(breaks, &[9, 15, 17]);
    control_is_safe_and_live(breaks, 0..200);
}

#[test]
fn clocks_drifting_beyond_the_factor_give_two_holders() {
    // Seed 25 replaced by 11 when waiters began to leave at their deadline (seed 541,056's
    // fix): a different schedule, not a weaker check. Seeds 6 and 9 by 5 and 24 when a lost
    // round's cleanup went quiet.
    // Seeds 5 and 24 gave way to 1 and 15, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
    // Seed 1 gave way to 16 when a lost round began to hurry the silent connections it needed.
    assumption_is_needed(Break::ClockDrift, &[8, 15, 16]);
}

/// The cover check: a holder is told a validity that a quorum of nodes' keys outlive. Clocks
/// beyond the factor break it in most schedules (an overlap needs a rival to win in the gap,
/// and is found in far fewer); so does a validity computed without the drift allowance (no
/// drift factor, clocks within it), which no overlap shows in these seeds; with the allowance
/// (the control) none. A restart without its quarantine does not break it (the keys a crash
/// took count as living on: the quarantine is the argument there, and the overlap check
/// catches its absence).
#[test]
fn a_validity_that_the_nodes_keys_do_not_back_is_caught_by_the_cover_check() {
    let covers = |breaks: Break, control: bool| {
        batch(0..200, setup(breaks, control))
            .iter()
            .filter(|r| r.cover.is_some())
            .count()
    };
    let drift = covers(Break::ClockDrift, false);
    assert!(drift >= 100, "clocks beyond the factor: {drift} of 200");
    let none = covers(Break::NoDriftAllowance, false);
    assert!(none >= 20, "no drift allowance: {none} of 200");
    for breaks in [Break::ClockDrift, Break::NoDriftAllowance] {
        for r in batch(0..200, setup(breaks, true)) {
            let control = setup(breaks, true);
            assert!(r.cover.is_none(), "{}", explain_cover(r.seed, control));
        }
    }
    assert_eq!(covers(Break::Quarantine, false), 0);
}

#[test]
fn work_past_the_validity_gives_two_holders() {
    // Seed 2 gave way to 3, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
    assumption_is_needed(Break::WorkPastValidity, &[0, 1, 3]);
}

/// Servers that evict keys under memory pressure counted as any other: three of five nodes
/// drop the key closest to expiring now and then, a held lock's among them, and a second
/// client takes it there (0, 1, 2: nearly every seed). With the client's default, their yeses
/// refused (two of them evicting: the others make a quorum), none; every caller granted within
/// the liveness bound.
#[test]
fn servers_that_evict_counted_give_two_holders() {
    assumption_is_needed(Break::EvictionCounted, &[0, 1, 2]);
    control_is_safe_and_live(Break::EvictionCounted, 0..200);
}

#[test]
fn a_lying_node_gives_two_holders() {
    // Seeds re-found after the ledger change, again after the liveness fixes, and when waiters
    // began to leave at their deadline (seed 2 replaced by 6): different schedules, not a
    // weaker check.
    // Seed 4 gave way to 7, re-found when the handshake began to ask `INFO memory` and the
    // simulated tokens took the client's shape (other schedules, not a weaker check).
    assumption_is_needed(Break::LyingNode, &[1, 6, 7]);
}

/// Sets locked all or none beside plain locks of their members: a set's holder
/// holds every member, so no member may have two holders, and waiters for sets are owed the
/// same bound as others.
#[test]
fn sets_locked_all_or_none_beside_plain_locks_find_no_violation() {
    let setup = Setup {
        sets: true,
        ..setup(Break::Nothing, false)
    };
    let reports = batch(0..80, setup);
    for r in &reports {
        assert!(r.violation.is_none(), "{}", explain(r.seed, setup));
        assert_live(r, setup);
    }
    let fenced = Setup {
        fencing: true,
        ..setup
    };
    for r in batch(0..30, fenced) {
        assert!(r.violation.is_none(), "{}", explain(r.seed, fenced));
        assert!(
            r.fence_violation.is_none(),
            "{}",
            explain_fence(r.seed, fenced)
        );
    }
}

#[test]
fn a_set_acquire_that_is_not_all_or_none_gives_two_holders() {
    // Each member `SET NX` on its own, the node's answer its first member's: a set holds
    // members that another holder holds too (180 of seeds 0..200 find it).
    assumption_is_needed(Break::SetNotAllOrNone, &[2, 3, 4]);
}

/// Shared (read) locks beside the ordinary (write) locks of the same resources:
/// readers may overlap each other, never a writer.
#[test]
fn readers_and_writers_find_no_violation() {
    let setup = Setup {
        shared: true,
        ..setup(Break::Nothing, false)
    };
    for r in batch(0..80, setup) {
        assert!(r.violation.is_none(), "{}", explain(r.seed, setup));
        assert_live(&r, setup);
    }
}

/// Found by a 20,000-schedule soak of `--sets --shared`: a set waiting for a held member
/// marked its free members as a waiting writer does, so readers of a member that nobody held
/// were refused for as long as the set waited (5.66 s, bound 4.25 s). A set now marks as a
/// reader does (no preference over readers).
/// Found by the 1 M-schedule soak of `--shared --sets` (seed 541,056 of it): a reader's
/// `lock_until` with a 960 ms deadline was granted 8 s later. Its client was paused for 473 ms
/// while an attempt was in flight; that round (473 ms) set the next split vote's pause, which
/// doubles per split: 7 s. And the head of a queue, its attempt lost, was not looked at at its
/// deadline (its deadline was left out of the queue's earliest while the attempt was in
/// flight), so nothing ended the wait before that pause. Either fix alone passes this seed;
/// both are kept: a split pause's round is capped at the node timeout, and a lost attempt puts
/// the head's deadline back.
#[test]
fn a_stalled_round_neither_stretches_the_split_pause_nor_outlives_the_deadline() {
    let setup = kinds();
    let r = sim::run(541_056, setup, None);
    assert!(r.liveness.is_none(), "{}", explain_liveness(541_056, setup));
    assert!(r.late.is_none(), "{}", explain_liveness(541_056, setup));
    assert!(r.longest_wait < std::time::Duration::from_secs(1), "{r:?}");
}

#[test]
fn a_waiting_set_does_not_keep_readers_of_a_free_member_out() {
    let setup = kinds();
    for seed in [18_472, 7_880, 17_695, 19_662] {
        let r = sim::run(seed, setup, None);
        assert!(r.liveness.is_none(), "{}", explain_liveness(seed, setup));
        assert!(r.late.is_none(), "{}", explain_liveness(seed, setup));
        assert!(r.violation.is_none(), "{}", explain(seed, setup));
    }
}

#[test]
fn a_reader_that_ignores_the_writer_gives_a_writer_with_a_reader() {
    // Every node adds the reader over the writer's key (164 of seeds 0..200 find it).
    // Seed 2 gave way to 3, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
    assumption_is_needed(Break::ReaderIgnoresWriter, &[0, 1, 3]);
}

/// The semaphore this crate does not build: a set of holders per node admitted while
/// it holds fewer than P = 2, won on majorities. Three holders fit on 3 × 3 = 9 ≤ 2 × 5 slots:
/// the check (more than P at once) finds them (62 of seeds 0..200). The crate's semaphore is a
/// plain lock per permit, which every plain schedule checks.
#[test]
fn a_semaphore_of_per_node_counters_admits_p_plus_one_holders() {
    // Seeds 1, 6 and 10 gave way to 2, 5 and 9, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
    // Seeds 5 and 9 gave way to 11 and 12 when a lost round began to hurry the silent
    // connections it needed, 11 to 17 when a full connection began to count as silent.
    for seed in [2, 12, 17] {
        let r = sim::run(seed, setup(Break::CounterSemaphore, false), None);
        let v = r.violation.expect("P + 1 holders");
        assert!(v.first.0 != v.second.0 || v.first.1 != v.second.1, "{v:?}");
    }
}

/// No quorum, no lock — and no hang: every waiting acquire still ends at its deadline
/// (waiting for servers that are not there).
#[test]
fn with_a_majority_down_runs_stall_and_never_violate() {
    let setup = setup(Break::MajorityDown, false);
    for r in batch(0..100, setup) {
        assert!(r.violation.is_none(), "seed {}: {r:?}", r.seed);
        assert_eq!(r.acquired, 0, "seed {}: no quorum, no lock: {r:?}", r.seed);
        assert!(r.ops >= 100, "the clients kept trying: {r:?}");
        assert!(r.late.is_none(), "{}", explain_liveness(r.seed, setup));
    }
}

/// Sets and readers beside the plain locks, every assumption kept (`sim --shared --sets`).
fn kinds() -> Setup {
    Setup {
        sets: true,
        shared: true,
        ..setup(Break::Nothing, false)
    }
}

fn fenced(breaks: Break, control: bool) -> Setup {
    Setup {
        fencing: true,
        ..setup(breaks, control)
    }
}

fn explain_fence(seed: u64, setup: Setup) -> String {
    let mut trace = String::new();
    let report = sim::run(seed, setup, Some(&mut trace));
    let fences: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("fence") || l.contains("crash") || l.contains("restart"))
        .collect();
    format!(
        "seed {seed} ({setup:?}): {:?}\n{}",
        report.fence_violation,
        fences.join("\n")
    )
}

/// Fenced schedules within the assumptions (docs/fencing.md): no two holders, and every
/// fence greater than those of the acquisitions completed before it began (any resource), and
/// than those of the earlier holders of the same resource.
#[test]
fn fenced_schedules_keep_their_fences_in_order() {
    let setup = fenced(Break::Nothing, false);
    let reports = batch(0..BATCH / 2, setup);
    for r in &reports {
        assert!(r.violation.is_none(), "{}", explain(r.seed, setup));
        assert!(
            r.fence_violation.is_none(),
            "{}",
            explain_fence(r.seed, setup)
        );
        assert_live(r, setup);
    }
    let fenced: u64 = reports.iter().map(|r| r.fenced).sum();
    let acquired: u64 = reports.iter().map(|r| r.acquired).sum();
    assert_eq!(fenced, acquired, "every acquisition has a fence");
    assert!(fenced > 5 * BATCH / 2, "{fenced} fenced acquisitions");
}

/// What fencing is for: when the lock's own assumptions break (a holder working past its
/// validity, clocks beyond the drift factor, a lying node) and two clients hold it at once, the
/// fences still order them.
#[test]
fn fences_stay_in_order_when_the_lock_does_not() {
    for breaks in [Break::WorkPastValidity, Break::ClockDrift, Break::LyingNode] {
        let setup = fenced(breaks, false);
        let reports = batch(0..60, setup);
        assert!(
            reports.iter().any(|r| r.violation.is_some()),
            "{breaks:?} gives two holders somewhere"
        );
        for r in &reports {
            assert!(
                r.fence_violation.is_none(),
                "{}",
                explain_fence(r.seed, setup)
            );
        }
    }
}

/// Two plausible but wrong constructions are caught: the maximum of per-node increments with
/// no write-back, and blank counters (restarted empty, or from an old snapshot) read as if
/// they were complete — "the quarantine alone". The same fault plans with the construction of
/// `fence.rs` find nothing.
#[test]
fn wrong_fence_constructions_are_caught() {
    for (breaks, seeds) in [
        // Seed 0 gave way to 2, re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
        (Break::FenceNoWriteBack, &[1u64, 2, 4][..]),
        // The schedules changed with the ledger, twice with the liveness fixes, when waiters
        // began to leave at their deadline, when release notices began to say how many heard
        // them and when they stopped counting the releaser: earlier seeds no longer hit this
        // rare case; these do (8 of 4,000 seeds at the last change, and again when kept locks
        // began to try a lost renewal again, with 2914 for 2266; 9 of 5,000 with 1283 for 2914
        // when lost kept locks began to be left to their holders; 120, 1218, 1801 of 1,802 when
        // a lost round's cleanup went quiet; 148, 305, 399 of 400 when the handshake began to
        // ask `INFO memory` and the simulated tokens took the client's shape; 148, 305, 326 of
        // 1,200 when a lost round began to hurry the silent connections it needed).
        (Break::FenceBlankAsZero, &[148, 305, 326][..]),
    ] {
        for &seed in seeds {
            let r = sim::run(seed, setup(breaks, false), None);
            assert!(
                r.fence_violation.is_some(),
                "seed {seed}: {breaks:?} should hand out a fence out of order: {r:?}"
            );
            let control = setup(breaks, true);
            let r = sim::run(seed, control, None);
            assert!(
                r.fence_violation.is_none(),
                "{}",
                explain_fence(seed, control)
            );
            assert!(r.fenced > 0, "the control run is fenced: {r:?}");
        }
    }
}

/// Every client's connections to a majority of the nodes go half open at once (a middlebox
/// dropped the flows), with the default `reply_timeout` (5 s). Without hurrying the silent
/// connections that a lost round needed, callers wait on dead connections past the liveness
/// bound although a new connection would work; with it (the control), none does over 300
/// schedules. Seed 218's control also waited too long while a connection at `max_pending`
/// refused new requests (`Overloaded`) and was not counted as silent.
#[test]
fn half_open_connections_to_a_majority_are_reset_once_a_lost_round_needs_them() {
    for seed in [0, 2, 3] {
        let r = sim::run(seed, setup(Break::HalfOpen, false), None);
        assert!(
            r.liveness.is_some(),
            "seed {seed}: callers should wait on half-open connections: {r:?}"
        );
    }
    let control = setup(Break::HalfOpen, true);
    let r = sim::run(218, control, None);
    assert!(r.liveness.is_none(), "{}", explain_liveness(218, control));
    control_is_safe_and_live(Break::HalfOpen, 0..300);
}

/// Issue 36's liveness defects, brought back, are caught by the liveness checks; the same
/// fault plans with the code as it is pass them.
///
/// - `LedgerUnpaced` (item 1): the ledger's releases all sent at once on a fresh connection,
///   which overflowed `max_pending`, was failed, and put them back: a reconnect loop (seed
///   10: 1,551 connects to one node against 13 allowed) and callers waiting far past the bound
///   while nobody held their resource. Also with fencing.
/// - `FailWhenFull` (found by the reconnect check): a connection at `max_pending` was failed
///   with every request on it, though the node was fine and merely had several callers.
#[test]
fn liveness_defects_brought_back_are_caught() {
    let cases: [(Break, bool, &[u64]); 3] = [
        // Seeds re-found when the handshake began to ask `INFO memory` and the simulated tokens took the client's shape (other schedules, not a weaker check).
        (Break::LedgerUnpaced, false, &[10, 22, 47]),
        (Break::LedgerUnpaced, true, &[10, 24, 47]),
        (Break::FailWhenFull, false, &[1, 3, 5]),
    ];
    for (breaks, fencing, seeds) in cases {
        for &seed in seeds {
            let broken = Setup {
                fencing,
                ..setup(breaks, false)
            };
            let r = sim::run(seed, broken, None);
            assert!(
                r.connect_violation.is_some(),
                "seed {seed}: {breaks:?} should reconnect in a loop: {r:?}"
            );
            if breaks == Break::LedgerUnpaced {
                assert!(
                    r.liveness.is_some(),
                    "seed {seed}: {breaks:?} should keep a caller waiting: {r:?}"
                );
            }
            let control = Setup {
                control: true,
                ..broken
            };
            let r = sim::run(seed, control, None);
            assert!(r.liveness.is_none(), "{}", explain_liveness(seed, control));
            assert!(r.late.is_none(), "{}", explain_liveness(seed, control));
            assert!(
                r.connect_violation.is_none(),
                "{}",
                explain_liveness(seed, control)
            );
            assert!(
                r.violation.is_none() && r.fence_violation.is_none(),
                "{r:?}"
            );
        }
    }
}

/// Issue 36's third defect, brought back, is caught by the progress check: acquires that
/// waited for a node silent since it missed a node timeout. With one of five nodes frozen and
/// eight clients contending for one resource, attempts that split the live votes each waited
/// out the node timeout holding their keys, and their releases woke every waiter into the
/// next split: `redlock demo` fell to 0.01× its healthy rate. The check compares a run's
/// grants per second with the same schedule's with every node up ([`sim::PROGRESS_FLOOR`]);
/// the code as it is passes it on the same seeds.
#[test]
fn waiting_for_a_silent_node_brought_back_is_caught_by_the_progress_check() {
    // Seeds 0 and 17 gave way to 6 and 34 when a lost round's cleanup went quiet, and those to
    // 53 and 63 when the handshake began to ask `INFO memory` and the simulated tokens took the
    // client's shape.
    for seed in [53, 63] {
        let broken = setup(Break::WaitForSilent, false);
        let r = sim::run(seed, broken, None);
        let v = r.progress.as_ref().unwrap_or_else(|| {
            panic!("seed {seed}: contention should collapse with the frozen node waited for: {r:?}")
        });
        let rate = |(n, t): (u64, std::time::Duration)| n as f64 / t.as_secs_f64();
        let control = Setup {
            control: true,
            ..broken
        };
        let c = sim::run(seed, control, None);
        assert!(
            c.progress.is_none()
                && c.liveness.is_none()
                && c.late.is_none()
                && c.connect_violation.is_none(),
            "seed {seed}: the code as it is keeps its rate (flawed: {:.1}/s of {:.1}/s): {}",
            rate(v.frozen),
            rate(v.healthy),
            explain_liveness(seed, control)
        );
        assert!(c.violation.is_none() && !c.stalled, "{c:?}");
    }
}

/// Release notices once woke every waiting client at the same moment: all attempted at once,
/// their votes split, all paused and tried again, and with one node frozen contention kept
/// less than half its healthy rate (17 of seeds 0..300 of `Break::WaitForSilent`'s control
/// below [`sim::PROGRESS_FLOOR`] before the fix; the worst of 1,000 at 0.38). Then a notice
/// said how many clients heard it and each spread its attempt over a span that grows with
/// them (`wait::crowd_pause`); `Break::NoticeHerd`, which ignores the count, was caught by the
/// progress check on seeds 63, 82 and 91 (0.41–0.44 of the healthy rate).
///
/// Since a lost round's cleanup is quiet (a split's cleanups no longer publish notices that
/// wake the herd into the next split), `Break::NoticeHerd` no longer falls below the floor: none
/// of seeds 0..4,000 (over seeds 0..300 its rate is 0.58 of the healthy one at worst, mean 0.77,
/// against 0.65 and 0.79 with the crowd pause). The pause stays, a margin; this test keeps the
/// code as it is above the floor on the seeds that caught the herd.
#[test]
fn waiters_woken_by_one_notice_keep_the_rate() {
    for seed in [63, 82, 91] {
        let control = Setup {
            control: true,
            ..setup(Break::NoticeHerd, false)
        };
        let r = sim::run(seed, control, None);
        assert!(
            r.progress.is_none() && r.liveness.is_none() && r.late.is_none() && !r.stalled,
            "seed {seed}: {}",
            explain_liveness(seed, control)
        );
        assert!(r.violation.is_none(), "{r:?}");
    }
}

/// A defect the long run of the kinds found (seed 541,056 of `--shared --sets`), half of it
/// brought back: a waiting acquire whose attempt lost at the head of its queue left its
/// deadline out of the queue's earliest, so the wait ended at its next attempt — after a split
/// vote's pause or the poll — not at its deadline. The liveness check sees it only when the
/// resource is free for longer than its bound (none of 1,000 schedules); the deadline check,
/// every waiting acquire's outcome within [`sim::DEADLINE_SLACK`] of its deadline, in 65 of
/// 1,000. The code as it is: none, on the same seeds and in every batch above.
#[test]
fn a_wait_that_outlives_its_deadline_is_caught_by_the_deadline_check() {
    // Seeds 15, 53, 56 gave way to 19, 62, 76 when a lost round's cleanup went quiet, and those
    // to 8, 27, 53 when the handshake began to ask `INFO memory` and the simulated tokens took
    // the client's shape.
    for seed in [8, 27, 53] {
        let broken = setup(Break::DeadlineNotRearmed, false);
        let r = sim::run(seed, broken, None);
        let late = r.late.as_ref().unwrap_or_else(|| {
            panic!("seed {seed}: a wait should end after its deadline and the slack: {r:?}")
        });
        assert!(
            late.end - late.deadline > sim::DEADLINE_SLACK.as_nanos() as u64,
            "{late:?}"
        );
        let control = Setup {
            control: true,
            ..broken
        };
        let r = sim::run(seed, control, None);
        assert!(
            r.late.is_none() && r.liveness.is_none(),
            "{}",
            explain_liveness(seed, control)
        );
        assert!(r.violation.is_none() && !r.stalled, "{r:?}");
    }
}

/// Issue 36's second item: a majority of the nodes restarts at once with its fence counters
/// lost (fencing's assumption broken). With nobody to seed them, no fenced lock is granted
/// again while every server is up — the code before `repair_fences` (1,000 schedules of 1,000,
/// waits of 28 s median while nobody held). The simulated operator's repair, with the floor
/// at the highest fence handed out, brings the locks back, and the fences stay in order
/// (1,000 schedules, 0 fence violations).
#[test]
fn a_majority_restarted_blank_grants_no_fenced_lock_until_the_repair() {
    for seed in [0, 1, 2] {
        let broken = setup(Break::FenceMajorityBlank, false);
        let r = sim::run(seed, broken, None);
        assert!(
            r.stuck_blank,
            "seed {seed}: no fenced lock without a repair: {r:?}"
        );
        assert!(r.liveness.is_some(), "seed {seed}: {r:?}");
        let control = Setup {
            control: true,
            ..broken
        };
        let r = sim::run(seed, control, None);
        assert!(
            !r.stuck_blank && r.liveness.is_none() && r.late.is_none(),
            "{}",
            explain_liveness(seed, control)
        );
        assert!(
            r.fence_violation.is_none(),
            "{}",
            explain_fence(seed, control)
        );
        assert!(r.violation.is_none(), "{r:?}");
        assert!(
            r.repaired && r.fenced_after_heal > 0,
            "seed {seed}: the repair worked and fenced locks came back: {r:?}"
        );
    }
}

/// Issue 36's fourth report, in the simulator's shape: one engine, 32 callers, one resource,
/// one of five nodes frozen for the whole run (`Setup::crowd`), on servers older than the
/// quarantine's window; 2,000 schedules: no stall, no wait past the bound or a deadline, and
/// the rate against the same schedule with every node up above the progress floor (longest
/// wait while nobody held 628 ms). A few of them here; what the report was, below.
#[test]
fn thirty_two_callers_of_one_engine_with_a_node_frozen_keep_going() {
    let crowd = Setup {
        crowd: true,
        ..setup(Break::WaitForSilent, true)
    };
    for seed in 0..4 {
        let r = sim::run(seed, crowd, None);
        assert!(!r.stalled && r.acquired > 100, "seed {seed}: {r:?}");
        assert!(
            r.liveness.is_none() && r.late.is_none() && r.progress.is_none(),
            "{}",
            explain_liveness(seed, crowd)
        );
        assert!(r.violation.is_none(), "{}", explain(seed, crowd));
    }
}

/// A stall explained: one reported once was the restart quarantine on servers younger than
/// its window. Its shape here — one client of 32 callers,
/// one resource, node 0 frozen, the servers just started (`Setup::young`): no grant before a
/// window of the client's clock (which may run 0.49 % fast) has passed since the run began, and
/// then the callers go on as on older servers — no stall, no wait past the liveness bound, no
/// outcome past a deadline, the rate above the progress floor.
#[test]
fn thirty_two_callers_on_servers_younger_than_the_quarantine_wait_for_it_and_no_longer() {
    let young = Setup {
        crowd: true,
        young: true,
        ..setup(Break::WaitForSilent, true)
    };
    for seed in 0..3 {
        let r = sim::run(seed, young, None);
        let first = r.first_grant.expect("a grant");
        assert!(
            first >= sim::TTL * 995 / 1000,
            "seed {seed}: a grant at {first:?}, inside the quarantine's {:?}",
            sim::TTL
        );
        assert!(!r.stalled && r.acquired > 100, "seed {seed}: {r:?}");
        assert!(
            r.liveness.is_none() && r.late.is_none() && r.progress.is_none(),
            "{}",
            explain_liveness(seed, young)
        );
        assert!(r.violation.is_none(), "{}", explain(seed, young));
    }
}

#[test]
fn a_set_that_waits_for_all_its_members_free_at_once_starves_and_is_caught() {
    // Sets beside plain locks and readers of their members, eight clients, long runs. A set
    // that waited for a moment when every member was free together (`Break::SetsAllAtOnce`,
    // as before the ordered acquisition) waits past the liveness bound while the member it
    // needs first is free (the starvation clause of the liveness check); the set that takes
    // its members one at a time, marking the next, gets each in time on the same seeds.
    for seed in [55, 140, 185, 241] {
        let broken = setup(Break::SetsAllAtOnce, false);
        let r = sim::run(seed, broken, None);
        assert!(
            r.liveness.is_some(),
            "seed {seed}: a set waiting for all at once should starve: {r:?}"
        );
        assert!(r.violation.is_none() && r.cover.is_none(), "{r:?}");
    }
    control_is_safe_and_live(Break::SetsAllAtOnce, 0..40);
}

#[test]
fn a_writer_or_reader_that_steps_back_for_sets_past_its_precedence_is_caught() {
    // The runs of the sets' starvation: ordered sets beside plain locks and readers of their
    // members. A waiting writer or reader that stepped back for a set's mark for its whole wait
    // (`Break::SetMarksUnbounded`, as before `Config::set_precedence`) is kept out of a set's
    // first member for as long as sets keep coming; the precedence clause of the liveness
    // check catches an attempt that still stepped back once the precedence was over. With
    // the bound, the same seeds keep to it.
    for seed in [0, 1, 2, 3] {
        let broken = setup(Break::SetMarksUnbounded, false);
        let r = sim::run(seed, broken, None);
        let v = r.liveness.clone().unwrap_or_else(|| {
            panic!("seed {seed}: a waiter stepping back for sets for ever should be caught: {r:?}")
        });
        assert!(v.free.1 > v.free.0, "seed {seed}: {v:?}");
        assert!(r.violation.is_none() && r.cover.is_none(), "{r:?}");
    }
    control_is_safe_and_live(Break::SetMarksUnbounded, 0..40);
}
