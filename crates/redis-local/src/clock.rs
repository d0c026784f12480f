//! A server whose wall clock is not the machine's: `redis-server` run under libfaketime
//! (`LD_PRELOAD`), which reads the clock's offset and rate from a file at every clock call; the
//! file is rewritten while the server runs, so the clock can be made to run fast or slow, or to
//! step forward or back, at any moment ([`ServerBuilder::fake_clock`]).
//!
//! Only the wall clock (`gettimeofday`, `CLOCK_REALTIME`) is faked
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`): key expiry, `TIME`, `INFO`'s `server_time_usec` and, on
//! Redis 6, `uptime_in_seconds` follow it; the event loop's timers keep the machine's monotonic
//! clock, as they would on a machine whose wall clock was stepped or slewed.
//!
//! libfaketime clashes with some jemalloc builds: Debian's 7.0.15 stops at start ("Unexpected
//! recursive calls to clock_gettime() … Cannot recover") and never answers; starting it fails at
//! once with [`Error::Unsupported`]. The 6.2.14 (libc malloc) and 8.2.3 (jemalloc) that
//! `scripts/servers` fetches both run under it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::Error;

/// Where Debian and a source install put the library; `$FAKETIME_LIB` comes first.
pub const FAKETIME_LIBRARIES: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];
/// How to get libfaketime; every "not found" message about it ends with this.
pub const FAKETIME_HINT: &str = "install it with `apt-get update && apt-get install -y faketime` \
     (as root), or set FAKETIME_LIB=/path/to/libfaketime.so.1";
/// The file libfaketime reads the clock's offset and rate from, in the server's directory.
const CLOCK_FILE: &str = "faketime.rc";
/// What libfaketime prints when it cannot run in a process (some jemalloc builds), which then
/// hangs instead of exiting.
const CLASH: &str = "recursive calls to clock_gettime";

/// Why a server under libfaketime will not come up, if its log says.
pub(crate) fn clash(log: &str) -> Option<&'static str> {
    log.contains(CLASH).then_some(
        "libfaketime clashes with this binary's allocator (\"recursive calls to \
         clock_gettime\"); a fake clock needs another build (scripts/servers path 6.2 or 8.2)",
    )
}

/// `$FAKETIME_LIB`, else the first of [`FAKETIME_LIBRARIES`] that exists.
///
/// # Errors
///
/// [`Error::Unsupported`] (saying how to install it) if none does.
pub fn faketime_library() -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os("FAKETIME_LIB").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return match p.is_file() {
            true => Ok(p),
            false => Err(Error::Unsupported(format!(
                "FAKETIME_LIB={} does not exist: {FAKETIME_HINT}",
                p.display()
            ))),
        };
    }
    FAKETIME_LIBRARIES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Unsupported(format!("libfaketime not found: {FAKETIME_HINT}")))
}

/// A `redis-server` that runs under libfaketime, for a test that needs one whatever server the
/// rest runs: `$REDIS_FAKE_CLOCK_SERVER` (`scripts/test` sets it to `scripts/servers path
/// 6.2`), else `$REDIS_SERVER` (`scripts/servers test 6.2` sets it).
///
/// # Errors
///
/// [`Error::NotInstalled`], saying how to get one, if neither is set.
pub fn fake_clock_server() -> Result<PathBuf, Error> {
    ["REDIS_FAKE_CLOCK_SERVER", "REDIS_SERVER"]
        .iter()
        .filter_map(std::env::var_os)
        .find(|p| !p.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            Error::NotInstalled(
                "a fake clock needs a redis-server that runs under libfaketime (not Debian's \
                 7.0.15): set REDIS_FAKE_CLOCK_SERVER=$(scripts/servers path 6.2)"
                    .into(),
            )
        })
}

/// The faked clock of one server process: `fake(t) = t0 + offset + rate × (t − t0)`, `t` the
/// machine's wall clock and `t0` when libfaketime started in the process (about when it was
/// spawned), as libfaketime computes it.
#[derive(Debug, Clone)]
pub(crate) struct FakeClock {
    file: PathBuf,
    offset: f64,
    rate: f64,
    spawned: f64,
}

impl FakeClock {
    /// A clock that runs as the machine's, its file written in `dir`.
    pub(crate) fn new(dir: &Path) -> FakeClock {
        FakeClock {
            file: dir.join(CLOCK_FILE),
            offset: 0.0,
            rate: 1.0,
            spawned: now(),
        }
    }

    /// Before each spawn: the machine's clock again (a new process starts its own), the file
    /// written, and the environment that loads libfaketime on `cmd`.
    pub(crate) fn prepare(&mut self, cmd: &mut Command) -> Result<(), Error> {
        let lib = faketime_library()?;
        self.offset = 0.0;
        self.rate = 1.0;
        self.write()?;
        self.spawned = now();
        cmd.env("LD_PRELOAD", lib)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        Ok(())
    }

    // Used by the server's clock controls, which need `TIME` (feature `admin`).
    #[cfg(feature = "admin")]
    /// The offset that makes a clock of `rate` read `fake` at the machine's wall time `at`.
    pub(crate) fn offset_for(&self, rate: f64, fake: f64, at: f64) -> f64 {
        fake - self.spawned - rate * (at - self.spawned)
    }

    // Used by the server's clock controls, which need `TIME` (feature `admin`).
    #[cfg(feature = "admin")]
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    // Used by the server's clock controls, which need `TIME` (feature `admin`).
    #[cfg(feature = "admin")]
    pub(crate) fn offset(&self) -> f64 {
        self.offset
    }

    // Used by the server's clock controls, which need `TIME` (feature `admin`).
    #[cfg(feature = "admin")]
    /// Makes libfaketime read `offset` and `rate` from now on.
    pub(crate) fn set(&mut self, offset: f64, rate: f64) -> Result<(), Error> {
        self.offset = offset;
        self.rate = rate;
        self.write()
    }

    /// Writes the spec whole and renames it into place, so that no read sees half of it.
    fn write(&self) -> Result<(), Error> {
        let spec = format!("{:+.6} x{}\n", self.offset, self.rate);
        let tmp = self.file.with_extension("tmp");
        let io_error = |source| Error::Io {
            what: format!("write {}", self.file.display()),
            source,
        };
        fs::write(&tmp, spec).map_err(io_error)?;
        fs::rename(&tmp, &self.file).map_err(io_error)
    }
}

/// The machine's wall clock, in seconds since the epoch.
pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// How far the server's clock may be from where a rate change meant to leave it (a few round
/// trips on loopback) before [`Server::set_clock_rate`](crate::Server::set_clock_rate) corrects
/// the offset once more.
#[cfg(feature = "admin")]
const CONTINUITY: f64 = 0.002;

#[cfg(feature = "admin")]
impl crate::Server {
    /// The server's wall clock (`TIME`) and the machine's at the middle of the request, in
    /// seconds since the epoch.
    ///
    /// # Panics
    ///
    /// If `TIME` fails or answers something else than two numbers.
    pub fn clock_reading(&self) -> (f64, f64) {
        use redis::Value;
        let before = now();
        let reply = self.cmd(&["TIME"]);
        let at = (before + now()) / 2.0;
        let number = |v: &Value| match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<f64>().ok(),
            _ => None,
        };
        match &reply {
            Value::Array(parts) if parts.len() == 2 => match (number(&parts[0]), number(&parts[1]))
            {
                (Some(secs), Some(micros)) => (secs + micros / 1e6, at),
                _ => panic!("TIME answered {reply:?}"),
            },
            _ => panic!("TIME answered {reply:?}"),
        }
    }

    /// The server's wall clock less the machine's, in seconds.
    pub fn clock_skew(&self) -> f64 {
        let (fake, at) = self.clock_reading();
        fake - at
    }

    /// From now on, the server's wall clock runs `rate` times as fast as the machine's (1 again
    /// for a healthy clock), going on from where it is: no jump beyond a few milliseconds
    /// ([`CONTINUITY`], checked with `TIME` and corrected once).
    ///
    /// # Panics
    ///
    /// For a server built without [`fake_clock`](crate::ServerBuilder::fake_clock), or if the
    /// clock file cannot be written.
    pub fn set_clock_rate(&mut self, rate: f64) {
        assert!(rate > 0.0, "a clock rate of {rate}");
        let (fake, at) = self.clock_reading();
        let clock = self.fake_clock_mut();
        let old = clock.rate();
        let written = now();
        // Where the clock is as the new rate begins.
        let here = fake + old * (written - at);
        let offset = clock.offset_for(rate, here, written);
        clock.set(offset, rate).unwrap_or_else(|e| panic!("{e}"));
        let (fake, at) = self.clock_reading();
        let off = fake - (here + rate * (at - written));
        if off.abs() > CONTINUITY {
            let clock = self.fake_clock_mut();
            clock
                .set(offset - off, rate)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Steps the server's wall clock by `seconds` (negative: back) at once; its rate stays.
    ///
    /// # Panics
    ///
    /// As [`set_clock_rate`](Self::set_clock_rate).
    pub fn step_clock(&mut self, seconds: f64) {
        let clock = self.fake_clock_mut();
        let (offset, rate) = (clock.offset(), clock.rate());
        clock
            .set(offset + seconds, rate)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
