//! Structured events through the [`log`](https://docs.rs/log) facade (cargo feature `log`).
//!
//! Every event has the target [`TARGET`] (`redlock_mux`), a readable message, and key-values
//! (`log`'s `kv`): `event` (its name: `acquired`, `refused`, `waiting`, `no_quorum`, `extended`,
//! `extend_failed`, `renewal_lost`, `lost`, `released`, `node_down`, `node_up`, `quarantined`, `noscript`,
//! `waker_panicked`),
//! `resource` and `node` where they apply, and the figures of the event.
//!
//! Levels: `debug` for routine success (acquired, refused, extended, released, a first
//! connection, NOSCRIPT fallbacks), `info` for a node that came back and a wait that goes on
//! (`waiting`: why, once and when the reason changes), `warn` for what an
//! operator must look at (no quorum, a kept lock's renewal lost or the lock lost, a node down,
//! a node quarantined, a task's waker that panicked).
//!
//! `log` rather than `tracing`: one small crate with no proc-macros, and `tracing`
//! subscribers read `log` records through `tracing-log`'s `LogTracer`. `log`'s macros check
//! the level before formatting anything, so a disabled event costs one comparison; with the
//! feature off, [`event!`] expands to nothing at all.

/// The `log` target of every event of this crate (cargo feature `log`): filter on it, e.g.
/// `RUST_LOG=redlock_mux=debug` with `env_logger`.
///
/// Each event has a readable message and key-values (`log`'s `kv`): `event`, its name —
/// `acquired`, `refused`, `waiting`, `no_quorum`, `extended`, `extend_failed`, `renewal_lost`, `lost`,
/// `released`,
/// `node_down`, `node_up`, `noscript`, `waker_panicked` — and `resource` or `node` with the event's figures.
/// Levels: `debug` for routine success and refusals, `info` for a node that came back, `warn`
/// for no quorum, a kept lock's renewal lost (tried again) or the lock lost, a node down (its first failure; `debug` while it stays
/// down) and quarantined yeses.
#[cfg_attr(not(feature = "log"), allow(dead_code))]
pub const TARGET: &str = "redlock_mux";

/// `event!(Level, key = value, …; "message {}", args)`: a `log` record with target
/// [`TARGET`] when the feature `log` is on; nothing (not even the arguments' evaluation) when
/// it is off.
macro_rules! event {
    ($level:ident, $($rest:tt)+) => {
        #[cfg(feature = "log")]
        {
            ::log::log!(target: $crate::model::event::TARGET, ::log::Level::$level, $($rest)+);
        }
    };
}

pub(crate) use event;

/// The nodes of `.0` whose vote in `.1` is `.2`, comma-separated (formatted only when an event
/// is logged: no allocation).
#[cfg(feature = "log")]
pub(crate) struct NodeList<'a>(
    pub &'a [crate::model::addr::NodeAddr],
    pub crate::model::lock::Votes,
    pub crate::model::lock::LockVote,
);

#[cfg(feature = "log")]
impl std::fmt::Display for NodeList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (i, node) in self.0.iter().enumerate() {
            if self.1.vote(i) == Some(self.2) {
                f.write_str(if first { "" } else { ", " })?;
                write!(f, "{node}")?;
                first = false;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// "; unreachable: a, b" when some nodes were unreachable, nothing otherwise.
#[cfg(feature = "log")]
pub(crate) struct Unreachable<'a>(
    pub &'a [crate::model::addr::NodeAddr],
    pub crate::model::lock::Votes,
);

#[cfg(feature = "log")]
impl std::fmt::Display for Unreachable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.1.unreachable() == 0 {
            return Ok(());
        }
        let list = NodeList(self.0, self.1, crate::model::lock::LockVote::Unreachable);
        write!(f, "; unreachable: {list}")
    }
}
