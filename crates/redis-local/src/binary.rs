//! Where the `redis-server` binary is, and what to say when it is not there.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

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
