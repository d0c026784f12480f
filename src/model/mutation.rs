//! Deliberate defects, brought back on request so that the simulator shows its checks catch
//! them: wrong fencing constructions and liveness defects once fixed (the seeds in
//! `tests/sim.rs` fail with the defect and pass without it).
//!
//! Only the simulator (feature `sim`) and this crate's unit tests have them: in the default
//! build [`Mutation`] has the one value [`Mutation::None`], every query below is the constant
//! `false`, and the branches they guard are compiled out.

/// A defect the code runs with (the simulator's; never set otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mutation {
    /// The code as it is.
    #[default]
    None,
    /// Fencing: every node increments its own counter when its `SET NX` succeeds, the fence
    /// is the largest of the winners' counters, nothing is written back (`INCR_BODY`).
    #[cfg(any(test, feature = "sim"))]
    FenceNoWriteBack,
    /// Fencing: blank nodes are read as seeded (their counter, or 0) — "the quarantine alone",
    /// which lets a node restarted empty bring a quorum's maximum down.
    #[cfg(any(test, feature = "sim"))]
    FenceBlankAsZero,
    /// The ledger's releases sent up to `max_pending` at once on a fresh connection (not paced
    /// within half of it), and a full connection failed (as [`Mutation::FailWhenFull`]): the
    /// connection fails as overloaded, the releases go back into the ledger, and it reconnects
    /// again and again.
    #[cfg(any(test, feature = "sim"))]
    LedgerUnpaced,
    /// A connection at `max_pending` failed rather than the next request refused
    /// (`Session::admit`): several callers of one engine keep more requests outstanding than
    /// that, and it reconnects again and again with no fault at all.
    #[cfg(any(test, feature = "sim"))]
    FailWhenFull,
    /// Acquires wait for every node, also one that let a node timeout pass in silence and has
    /// answered nothing since (`Core::silent` ignored): with one node frozen, attempts that
    /// split the live votes each wait out the node timeout holding their keys, and contention
    /// collapses.
    #[cfg(any(test, feature = "sim"))]
    WaitForSilent,
    /// A waiting acquire whose attempt lost at the head of its queue does not put its deadline
    /// back into the queue's earliest (it was left out while the attempt was in flight): the
    /// wait ends at its next attempt, after a split vote's pause or the poll, not at its
    /// deadline (found by the long run of the kinds, seed 541,056).
    #[cfg(any(test, feature = "sim"))]
    DeadlineNotRearmed,
    /// Release notices' counts ignored: every waiter that hears one attempts at once, and the
    /// clients woken by one release split its votes.
    #[cfg(any(test, feature = "sim"))]
    NoticeHerd,
    /// A node's `uptime_in_seconds` read as it stands (not a second short): Redis's uptime is
    /// whole seconds of the clock now less those at the start, up to a second more than the
    /// process has been up, so a client that sees a node for the first time counts it up to a
    /// second before it has been up a window (the safety defect fixed in 6614cb1).
    #[cfg(any(test, feature = "sim"))]
    UptimeAtItsWord,
    /// The restart tracking learns which process a node is only from a counted yes (and
    /// notices and status reads), not from a refusal: a client whose answers from a node were
    /// all refusals takes a later process at that address by its uptime, and one that has
    /// been up long but lacks the keys (a failover, a moved address) counts at once.
    #[cfg(any(test, feature = "sim"))]
    RunIdOnYesOnly,
    /// Silent connections that a lost round needed are not hurried (`Session::hurry`): a
    /// half-open connection is reset only by `reply_timeout`, which with the default settings
    /// comes after a `lock`'s whole wait.
    #[cfg(any(test, feature = "sim"))]
    NoHurry,
    /// A set that waits tries all of its members at once every time, as before the ordered
    /// acquisition (`wait.rs`): it waits for a moment when every member is free together,
    /// which callers of each member alone need never leave.
    #[cfg(any(test, feature = "sim"))]
    SetsAllAtOnce,
    /// With ordered sets, a waiting writer or reader steps back for a set's mark for its whole
    /// wait, not only during `Config::set_precedence` (`wait.rs`): a steady stream of sets keeps
    /// the writers and readers of a set's first member out for as long as it lasts.
    #[cfg(any(test, feature = "sim"))]
    SetMarksUnbounded,
}

impl Mutation {
    /// Fences without a write-back ([`Mutation::FenceNoWriteBack`]).
    #[inline]
    pub fn fence_no_write_back(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::FenceNoWriteBack;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Blank counters read as seeded ([`Mutation::FenceBlankAsZero`]).
    #[inline]
    pub fn fence_blank_as_zero(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::FenceBlankAsZero;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// The ledger replayed up to `max_pending` at once ([`Mutation::LedgerUnpaced`]).
    #[inline]
    pub fn ledger_unpaced(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::LedgerUnpaced;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// A connection at `max_pending` failed, not the next request refused
    /// ([`Mutation::FailWhenFull`], and [`Mutation::LedgerUnpaced`], whose replay it fails).
    #[inline]
    pub fn fail_when_full(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return matches!(self, Mutation::FailWhenFull | Mutation::LedgerUnpaced);
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// A lost head's deadline left out of its queue's earliest
    /// ([`Mutation::DeadlineNotRearmed`]).
    #[inline]
    pub fn deadline_not_rearmed(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::DeadlineNotRearmed;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Silent nodes waited for by acquires ([`Mutation::WaitForSilent`]).
    #[inline]
    pub fn wait_for_silent(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::WaitForSilent;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Sets that wait try all their members at once ([`Mutation::SetsAllAtOnce`]).
    #[inline]
    pub fn sets_all_at_once(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::SetsAllAtOnce;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Sets' marks stepped back for during a whole wait ([`Mutation::SetMarksUnbounded`]).
    #[inline]
    pub fn set_marks_unbounded(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::SetMarksUnbounded;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Notices' counts ignored ([`Mutation::NoticeHerd`]).
    #[inline]
    pub fn notice_herd(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::NoticeHerd;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Uptime read as it stands ([`Mutation::UptimeAtItsWord`]).
    #[inline]
    pub fn uptime_at_its_word(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::UptimeAtItsWord;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// The process learnt from yeses only ([`Mutation::RunIdOnYesOnly`]).
    #[inline]
    pub fn run_id_on_yes_only(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::RunIdOnYesOnly;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }

    /// Silent connections never hurried ([`Mutation::NoHurry`]).
    #[inline]
    pub fn no_hurry(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self == Mutation::NoHurry;
        #[cfg(not(any(test, feature = "sim")))]
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mutation_answers_its_own_query_and_none_answers_none() {
        let all = [
            Mutation::None,
            Mutation::FenceNoWriteBack,
            Mutation::FenceBlankAsZero,
            Mutation::LedgerUnpaced,
            Mutation::FailWhenFull,
            Mutation::WaitForSilent,
            Mutation::DeadlineNotRearmed,
            Mutation::NoticeHerd,
            Mutation::UptimeAtItsWord,
            Mutation::RunIdOnYesOnly,
            Mutation::NoHurry,
        ];
        let answers: Vec<[bool; 10]> = all
            .iter()
            .map(|m| {
                [
                    m.fence_no_write_back(),
                    m.fence_blank_as_zero(),
                    m.ledger_unpaced(),
                    m.fail_when_full(),
                    m.wait_for_silent(),
                    m.deadline_not_rearmed(),
                    m.notice_herd(),
                    m.uptime_at_its_word(),
                    m.run_id_on_yes_only(),
                    m.no_hurry(),
                ]
            })
            .collect();
        assert_eq!(
            answers,
            [
                [
                    false, false, false, false, false, false, false, false, false, false
                ],
                [
                    true, false, false, false, false, false, false, false, false, false
                ],
                [
                    false, true, false, false, false, false, false, false, false, false
                ],
                // The unpaced replay overflowed a connection that was then failed.
                [
                    false, false, true, true, false, false, false, false, false, false
                ],
                [
                    false, false, false, true, false, false, false, false, false, false
                ],
                [
                    false, false, false, false, true, false, false, false, false, false
                ],
                [
                    false, false, false, false, false, true, false, false, false, false
                ],
                [
                    false, false, false, false, false, false, true, false, false, false
                ],
                [
                    false, false, false, false, false, false, false, true, false, false
                ],
                [
                    false, false, false, false, false, false, false, false, true, false
                ],
                [
                    false, false, false, false, false, false, false, false, false, true
                ],
            ]
        );
    }
}
