//! The options' value parsers: durations with a unit, flock's seconds for `--wait`, the
//! quarantine window or `off`, counts and exit codes, each refusal said in words.

use std::time::Duration;

/// How long to wait for a lock held elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One attempt.
    Once,
    /// Retry for this long.
    For(Duration),
    /// Retry until acquired.
    Forever,
}

/// `--quarantine`: a window, or `None` for off.
#[derive(Debug, Clone, Copy)]
pub struct Quarantine(pub Option<Duration>);

/// `--wait`: flock's seconds (`10`, `0.5`), a duration with a unit, or `inf`.
pub fn parse_wait(s: &str) -> Result<Wait, String> {
    let t = s.trim();
    match t {
        "inf" | "infinity" | "forever" => return Ok(Wait::Forever),
        _ => {}
    }
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{t} is not a number of seconds from 0 up"))
            .and_then(bounded)
            .map(Wait::For);
    }
    parse_duration(t).map(Wait::For)
}

/// The longest duration an option takes: longer ones overflowed the clock when added to now
/// (`--grace 300000000000y` panicked at a loss). `--wait inf` waits forever.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn bounded(d: Duration) -> Result<Duration, String> {
    match d > LONGEST {
        true => Err("longer than 100 years (for no limit, --wait takes inf)".into()),
        false => Ok(d),
    }
}

/// A duration with a unit: `250ms`, `10s`, `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("no time unit: use e.g. {t}s or {t}ms"));
    }
    humantime::parse_duration(t)
        .map_err(|e| e.to_string())
        .and_then(bounded)
}

/// `--quarantine`: `off` (or `none`, `no`, `0`), or a window. A zero duration (`0s`, `0ms`) is
/// refused, not taken for `off`: the library refuses any fixed window shorter than the TTL, and
/// a window of nothing reads as a mistake (it silently switched the quarantine off).
pub fn parse_quarantine(s: &str) -> Result<Quarantine, String> {
    match s.trim() {
        "off" | "none" | "no" | "0" => Ok(Quarantine(None)),
        other => match parse_duration(other)? {
            d if d.is_zero() => Err(format!(
                "a window of {other} is no window: write `off` to switch the restart \
                 quarantine off"
            )),
            d => Ok(Quarantine(Some(d))),
        },
    }
}

/// A whole number from `lo` to `hi`, said in words when it is not (not clap's `1..=15`).
pub fn count(s: &str, lo: u16, hi: u16) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from {lo} to {hi}")),
    }
}

/// `-E`: an exit code from 0 to 255 (0: a lock held elsewhere is not a failure, as for a cron job
/// that skips its turn).
pub fn parse_conflict_code(s: &str) -> Result<u8, String> {
    s.trim()
        .parse::<u8>()
        .map_err(|_| "must be an exit code from 0 to 255".to_owned())
}

/// `--lost-exit-code`: an exit code from 1 to 255 (a lost lock is never success).
pub fn parse_exit_code(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u8>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("must be an exit code from 1 to 255".to_owned()),
    }
}
