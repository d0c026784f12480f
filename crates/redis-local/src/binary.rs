//! Where the `redis-server` binary is, and what to say when it is not there.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::Error;

/// How to get a `redis-server`; every "not found" message ends with it.
pub const INSTALL_HINT: &str = "install it with `apt-get update && apt-get install -y redis-server` \
     (as root), or set REDIS_SERVER=/path/to/redis-server";

/// `$REDIS_SERVER`, else `redis-server` on `PATH`.
///
/// # Errors
///
/// [`Error::NotInstalled`] (saying how to install it) if neither exists.
pub fn redis_binary() -> Result<PathBuf, Error> {
    find_redis_binary(std::env::var_os("REDIS_SERVER"), std::env::var_os("PATH"))
}

/// The lookup behind [`redis_binary`], with the environment passed in (so that it can be tested
/// without touching the process environment).
///
/// # Errors
///
/// [`Error::NotInstalled`] if `redis_server` names no file, or (when it is unset or empty) no
/// directory of `path` holds a `redis-server`.
pub fn find_redis_binary(
    redis_server: Option<OsString>,
    path: Option<OsString>,
) -> Result<PathBuf, Error> {
    if let Some(p) = redis_server.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(Error::NotInstalled(format!(
            "REDIS_SERVER={} does not exist",
            p.display()
        )));
    }
    std::env::split_paths(&path.unwrap_or_default())
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| Error::NotInstalled("redis-server not found on PATH".into()))
}

/// `redis-server 7.0.15`, from `BIN --version`, if it says.
pub fn redis_version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .map(|v| format!("redis-server {v}"))
}

/// A server's version, ordered (`Version::new(7, 0, 0) > Version::new(6, 2, 14)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// `7` in 7.0.15.
    pub major: u32,
    /// `0` in 7.0.15.
    pub minor: u32,
    /// `15` in 7.0.15.
    pub patch: u32,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// `7.0.15` (more parts, or a suffix on the last, are ignored); `None` if it is not
    /// three numbers.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.split('.');
        let mut next = || -> Option<u32> {
            let part = parts.next()?;
            let digits = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            part[..digits].parse().ok()
        };
        Some(Version::new(next()?, next()?, next()?))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version `BIN --version` prints (`v=7.0.15`), asked once per binary and remembered.
pub fn redis_version_number(bin: &Path) -> Option<Version> {
    static KNOWN: OnceLock<Mutex<HashMap<PathBuf, Option<Version>>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Mutex::default);
    if let Some(v) = known.lock().unwrap_or_else(|e| e.into_inner()).get(bin) {
        return *v;
    }
    let v = redis_version(bin).and_then(|s| Version::parse(s.strip_prefix("redis-server ")?));
    known
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(bin.to_owned(), v);
    v
}

#[cfg(test)]
mod tests {
    use super::Version;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("7.0.15"), Some(Version::new(7, 0, 15)));
        assert_eq!(Version::parse("8.2.3-rc1"), Some(Version::new(8, 2, 3)));
        assert_eq!(Version::parse("7.0"), None);
        assert_eq!(Version::parse("x.1.2"), None);
        assert!(Version::new(6, 2, 14) < Version::new(7, 0, 0));
        assert!(Version::new(7, 2, 4) < Version::new(7, 10, 0));
        assert_eq!(Version::new(8, 2, 3).to_string(), "8.2.3");
    }
}
