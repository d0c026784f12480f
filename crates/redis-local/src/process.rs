//! Child processes that die with their parent, signals, and telling whether a pid is gone.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Arranges for the child that `cmd` spawns to get SIGKILL when the spawning thread exits
/// (`PR_SET_PDEATHSIG`, which Linux ties to the thread, not the process), and to exit at once if
/// the parent was already gone before that took effect.
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Sends `signal` to `pid`.
///
/// # Errors
///
/// What kill(2) said (the process is gone, or not ours).
pub(crate) fn signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) takes plain integers; callers pass their own, not yet reaped, child.
    let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True if `pid` no longer exists or is a zombie (dead, not yet reaped by whoever is its parent
/// now).
pub fn pid_is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // Format: "pid (comm) STATE ..."; comm may contain spaces and parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(true),
    }
}
