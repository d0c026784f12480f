//! Makes a `redis-server` child die with the process that started it. Shared by the `redlock`
//! command (`servers.rs`) and the test harness (`tests/common`, through `#[path]`).

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
