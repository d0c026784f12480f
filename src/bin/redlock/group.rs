//! COMMAND's process group for `redlock run`: the watchdog that kills the whole group when redlock
//! can no longer vouch for the lock, and the terminal's foreground process group.
//!
//! The watchdog is redlock itself, re-executed from `/proc/self/exe` with [`WATCHDOG_ARG`]. It is
//! the leader of a new process group, and COMMAND is started in that group, so everything COMMAND
//! starts (unless it leaves the group on purpose) is in it too. The watchdog reads a pipe whose
//! write end only redlock holds (close-on-exec, so neither the watchdog nor COMMAND inherits it).
//! redlock writes the lock's validity deadline to it whenever the lock is extended, and a final
//! "done" when COMMAND has finished under the lock and what it left in its group is gone. The
//! watchdog sends SIGKILL to its whole process group (itself included) when
//!
//! - the pipe reaches end-of-file without "done": redlock died (SIGKILL, a crash, the OOM killer);
//! - the last deadline passes without a newer one: redlock was stopped (SIGSTOP, Ctrl-Z) or hung,
//!   and the lock it no longer extends runs out;
//! - the pipe carries anything it does not understand.
//!
//! It ignores every signal that can be ignored (set between fork and exec, so from before anything
//! can signal its group), so neither a Ctrl-C nor a SIGTERM to the group (redlock forwards those)
//! ends it before it has done its job.
//! It keeps nothing busy: its stdin is the pipe, stdout and stderr are `/dev/null`, its working
//! directory is `/`, its environment is empty, and every other descriptor it might inherit is
//! closed at exec. It exits by itself on "done".

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll, ppoll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, pthread_sigmask};
use nix::sys::stat::{SFlag, fstat};
use nix::sys::time::TimeSpec;
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, getpgid, getpgrp, getpid, getsid, isatty, read, tcgetpgrp, tcsetpgrp};

/// The hidden first argument that turns `redlock` into the watchdog.
pub const WATCHDOG_ARG: &str = "__run-watchdog";

/// A new deadline follows: 8 bytes, CLOCK_MONOTONIC nanoseconds, little-endian.
const MSG_DEADLINE: u8 = b'D';
/// A deadline message: [`MSG_DEADLINE`] and its 8 bytes.
const DEADLINE_MSG_LEN: usize = 1 + 8;
/// COMMAND finished under the lock: exit without killing anything.
const MSG_DONE: u8 = b'X';

/// The watchdog's input buffer: room for several messages of [`DEADLINE_MSG_LEN`] bytes, since a
/// read may find a few queued up while the watchdog was not scheduled.
const INBOX_LEN: usize = 64;

/// How long [`Watchdog::done`] waits for the watchdog to exit, in milliseconds: far more than it
/// needs to read "done" and exit, and short enough not to hold up redlock's own exit.
const REAP_WAIT_MS: u16 = 1000;

/// How long [`survivors`] gives SIGKILL to take effect on the members of COMMAND's group, in
/// milliseconds: a killed process exits in microseconds, unless it is stuck in the kernel (an
/// unreachable NFS server), and then it is not gone either.
const KILL_WAIT_MS: u64 = 1000;

/// How many ancestors [`Job::has_job_control`] follows up through redlock's own process group
/// before it gives up (and answers as for an orphaned group): real chains are a process or two (a
/// script that runs redlock); the bound only keeps the walk finite.
const MAX_ANCESTORS: usize = 64;

/// Nanoseconds in a second, for a `timespec`.
const NANOS_PER_SEC: u64 = 1_000_000_000;

fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC is always there: the zero of a failure would only be an early deadline.
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap_or_else(|_| TimeSpec::new(0, 0));
    (ts.tv_sec() as u64)
        .saturating_mul(NANOS_PER_SEC)
        .saturating_add(ts.tv_nsec() as u64)
}

/// `t` on the system-wide CLOCK_MONOTONIC (which `Instant` reads on Linux), in nanoseconds.
fn monotonic_ns_at(t: Instant) -> u64 {
    let (now, ns) = (Instant::now(), monotonic_ns());
    match t.checked_duration_since(now) {
        Some(ahead) => ns.saturating_add(ahead.as_nanos() as u64),
        None => ns.saturating_sub(now.duration_since(t).as_nanos() as u64),
    }
}

/// Sets every signal that can be ignored to SIG_IGN, except those that report faults or whose
/// default action is already to do nothing. Async-signal-safe (it runs between fork and exec).
fn ignore_signals() {
    const KEEP: [libc::c_int; 13] = [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGABRT,
        libc::SIGSYS,
        libc::SIGCHLD,
        libc::SIGCONT,
        libc::SIGURG,
        libc::SIGWINCH,
    ];
    for sig in 1..=libc::SIGRTMAX() {
        if !KEEP.contains(&sig) {
            // SAFETY: signal(2) with SIG_IGN installs no handler; failures (the C library's
            // reserved real-time signals) are harmless. No safe form exists: nix's signal is
            // unsafe for every disposition, and names no real-time signal.
            unsafe {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
    }
    // The mask of this thread, the only one between fork and exec: nothing blocked.
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// The watchdog as seen from redlock.
pub struct Watchdog {
    child: Child,
    pipe: File,
    /// The last deadline sent.
    deadline: Instant,
    /// The watchdog is gone (its end of the pipe is closed).
    pub gone: bool,
}

impl Watchdog {
    /// Starts the watchdog as the leader of a new process group, watching `deadline` (the lock's
    /// current validity).
    pub fn spawn(deadline: Instant) -> io::Result<Watchdog> {
        let (reader, writer) = io::pipe()?;
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0("redlock")
            .arg(WATCHDOG_ARG)
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_clear()
            .current_dir("/")
            .process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec (signal, sigemptyset,
        // pthread_sigmask, syscall). No safe form exists: a closure that runs in the forked
        // child is unsafe by nature.
        unsafe {
            cmd.pre_exec(|| {
                ignore_signals();
                // Descriptors redlock inherited without close-on-exec (a lock file, a job
                // server's pipe) must not be kept open by the watchdog. Failure (a kernel older
                // than 5.11) leaves them as they are.
                libc::syscall(
                    libc::SYS_close_range,
                    3u32,
                    u32::MAX,
                    libc::CLOSE_RANGE_CLOEXEC,
                );
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(cmd); // our copy of the read end: only the watchdog may hold it
        let pipe = File::from(OwnedFd::from(writer));
        // Never block on the watchdog: should it stop reading, it keeps an older (earlier)
        // deadline, which errs on the safe side.
        if let Ok(flags) = fcntl(&pipe, FcntlArg::F_GETFL) {
            let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
            let _ = fcntl(&pipe, FcntlArg::F_SETFL(flags));
        }
        let mut w = Watchdog {
            child,
            pipe,
            deadline,
            gone: false,
        };
        w.send_deadline(deadline);
        Ok(w)
    }

    /// The process group COMMAND is to join (the watchdog's pid).
    pub fn pgid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// The last deadline the watchdog was given.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline to `deadline` if it changed (the lock was extended).
    pub fn extend(&mut self, deadline: Instant) {
        if deadline != self.deadline {
            self.send_deadline(deadline);
        }
    }

    fn send_deadline(&mut self, deadline: Instant) {
        let mut msg = [MSG_DEADLINE; DEADLINE_MSG_LEN];
        msg[1..].copy_from_slice(&monotonic_ns_at(deadline).to_le_bytes());
        // One write of less than PIPE_BUF bytes: all or nothing. If it fails the watchdog keeps
        // the earlier deadline, or is already gone (killed with the group).
        match self.pipe.write(&msg) {
            Ok(n) if n == msg.len() => self.deadline = deadline,
            Ok(_) => {} // cannot happen (atomic), and would only keep the earlier deadline
            Err(e) => self.gone |= e.kind() == io::ErrorKind::BrokenPipe,
        }
    }

    /// COMMAND finished under the lock: lets the watchdog exit without killing anything, and
    /// reaps it (waiting a little at most: not every init reaps orphans promptly). Returns the
    /// members of the group that survived the SIGKILL it sends them last ([`survivors`]).
    pub fn done(mut self) -> Vec<libc::pid_t> {
        let _ = self.pipe.write(&[MSG_DONE]);
        self.wait_exit(REAP_WAIT_MS);
        // Whatever is still in the group — a process the scan of /proc missed (one forked
        // behind the scan's position by a member that exited before the scan reached it: found
        // by review) — dies before the lock is released. The group's ID is still the unreaped
        // watchdog's, so it names no other group.
        self.kill_group_and_reap()
    }

    /// Sends SIGKILL to the whole group (the watchdog with it) and returns its members that
    /// survived it ([`survivors`], then [`hidden_members`] once the watchdog is reaped; a
    /// watchdog not reaped within [`REAP_WAIT_MS`] counts as a survivor): the lock must not be
    /// released while any of them runs.
    pub fn kill_group_and_reap(&mut self) -> Vec<libc::pid_t> {
        let pgid = self.pgid();
        signal_group(pgid, libc::SIGKILL);
        // Before the watchdog is reaped: its pid names the group until then.
        let mut left = survivors(pgid, pgid);
        // The watchdog was killed with the group: reaped, it no longer counts as a member.
        self.wait_exit(REAP_WAIT_MS);
        let reaped = matches!(self.child.try_wait(), Ok(Some(_)));
        if left.is_empty() && (!reaped || hidden_members(pgid)) {
            left.push(pgid);
        }
        left
    }

    /// Waits at most `ms` for the watchdog to exit (its pidfd turns readable).
    fn wait_exit(&self, ms: u16) {
        // Our own unreaped child: its pid names it until it is reaped.
        if let Some(fd) = pidfd(self.child.id() as libc::pid_t) {
            let _ = poll(
                &mut [PollFd::new(fd.as_fd(), PollFlags::POLLIN)],
                PollTimeout::from(ms),
            );
        }
    }
}

/// True if group `pgid` (its leader reaped) has members of which redlock may signal none
/// (`kill(-pgid, 0)` says EPERM): another user's processes, which `/proc` may not show at all
/// (mounted `hidepid=2`), so that `survivors`, which sees only what `/proc` shows, misses them.
/// A success proves nothing either way — a zombie whose parent does not
/// reap it (an orphan under a container's init) is a member that `kill` reaches — and what
/// `/proc` shows of such a group `survivors` has judged. Not tested: it needs `/proc` mounted
/// `hidepid=2`; the EPERM of a visible process is `survivors`' test's.
fn hidden_members(pgid: libc::pid_t) -> bool {
    // Signal 0 only checks for members and permission.
    killpg(Pid::from_raw(pgid), None) == Err(Errno::EPERM)
}

/// A pidfd of process `pid` (Linux 5.3 on), which turns readable when the process exits;
/// `None` if it is gone or the kernel has none.
fn pidfd(pid: libc::pid_t) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// `redlock __run-watchdog`: the watchdog process itself. Returns only on "done" or on misuse.
pub fn watchdog_main() -> u8 {
    if !set_up_by_run() {
        // Run by hand, it could kill a process group it does not own.
        say!("redlock: {WATCHDOG_ARG} is internal to `redlock run`");
        return crate::fail::exit::USAGE;
    }
    ignore_signals();
    let _ = nix::sys::prctl::set_name(c"redlock-watch");
    let mut deadline: Option<u64> = None;
    let mut inbox = Inbox {
        buf: [0; INBOX_LEN],
        have: 0,
    };
    loop {
        if !wait_for_input(deadline) || !inbox.fill() {
            continue;
        }
        while let Some(msg) = inbox.next_message() {
            match msg {
                Message::Done => return crate::fail::exit::OK,
                Message::Deadline(ns) => deadline = Some(ns),
            }
        }
    }
}

/// Whether this process was started the way `redlock run` starts the watchdog: the leader of
/// its own process group, reading a pipe.
fn set_up_by_run() -> bool {
    getpgrp() == getpid()
        && fstat(io::stdin()).is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFIFO
        })
}

/// Waits until the pipe (stdin) is readable or `deadline` (CLOCK_MONOTONIC nanoseconds) comes;
/// false when the wait is to start over (the deadline came, or a signal interrupted it). Kills
/// the group once the deadline has passed, or if the wait fails.
fn wait_for_input(deadline: Option<u64>) -> bool {
    let mut timeout = None;
    if let Some(d) = deadline {
        let now = monotonic_ns();
        if now >= d {
            // Stopped together with COMMAND's group (`kill -STOP`) for longer than the pipe's
            // few messages a read takes cover, the watchdog may hold an old deadline while
            // newer ones wait in the pipe: it reads them first, rather than kill a group whose
            // lock is still held.
            if poll_input(Some(Duration::ZERO)).is_ok_and(|n| n > 0) {
                return true;
            }
            kill_group();
        }
        timeout = Some(Duration::from_nanos(d - now));
    }
    match poll_input(timeout) {
        Ok(0) => false, // the deadline: checked on the next call
        Ok(_) => true,
        Err(Errno::EINTR) => false,
        Err(_) => kill_group(),
    }
}

/// `ppoll` of the pipe (stdin) for input, at most `timeout` (`None`: no limit).
fn poll_input(timeout: Option<Duration>) -> nix::Result<libc::c_int> {
    let stdin = io::stdin();
    ppoll(
        &mut [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)],
        timeout.map(TimeSpec::from_duration),
        None,
    )
}

/// A message from redlock on the pipe.
enum Message {
    /// The lock's validity now ends at this CLOCK_MONOTONIC time, in nanoseconds.
    Deadline(u64),
    /// COMMAND finished under the lock.
    Done,
}

/// What the watchdog has read from the pipe and not acted on yet.
struct Inbox {
    buf: [u8; INBOX_LEN],
    /// Bytes read into `buf`.
    have: usize,
}

impl Inbox {
    /// Reads what the pipe holds (one read(2)); false if a signal interrupted it. Kills the group
    /// at end of file (redlock is gone) or if the read fails.
    fn fill(&mut self) -> bool {
        // A plain read(2): a buffered reader could keep a message poll(2) no longer sees.
        match read(io::stdin(), &mut self.buf[self.have..]) {
            Ok(0) => kill_group(), // redlock is gone
            Ok(n) => self.have += n,
            Err(Errno::EINTR) => return false,
            Err(_) => kill_group(),
        }
        true
    }

    /// Takes the first whole message off the buffer; None when it holds none (a message cut
    /// short stays for the next read). Kills the group on a byte that starts no message.
    fn next_message(&mut self) -> Option<Message> {
        let (msg, len) = match self.buf[..self.have] {
            [] => return None,
            [MSG_DONE, ..] => (Message::Done, 1),
            [MSG_DEADLINE, ref rest @ ..] => match rest.first_chunk() {
                Some(&ns) => (Message::Deadline(u64::from_le_bytes(ns)), DEADLINE_MSG_LEN),
                None => return None, // the rest is still in the pipe
            },
            _ => kill_group(),
        };
        self.buf.copy_within(len..self.have, 0);
        self.have -= len;
        Some(msg)
    }
}

/// SIGKILL to the watchdog's own process group: COMMAND, everything it started, and the watchdog.
fn kill_group() -> ! {
    // The group is ours: we are its leader, so its id cannot have been reused. The SIGKILL ends
    // this process too; the exit is for a kill that failed.
    let _ = kill(Pid::from_raw(0), Signal::SIGKILL);
    std::process::exit(1)
}

/// Runs `f` with SIGTTOU blocked in this thread: a process outside the terminal's foreground
/// group may then change the foreground group (tcsetpgrp) or write to the terminal (with `stty
/// tostop`) instead of being stopped.
pub fn without_sigttou<R>(f: impl FnOnce() -> R) -> R {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    // This thread's mask only, restored below.
    let mut old = SigSet::empty();
    let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old)).is_ok();
    let r = f();
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    r
}

/// COMMAND's process group and redlock's controlling terminal.
pub struct Job {
    /// `/dev/tty`, if redlock has a controlling terminal.
    tty: Option<File>,
    /// COMMAND's process group.
    pub pgid: libc::pid_t,
    /// redlock's own process group.
    ours: libc::pid_t,
    /// COMMAND is to have the terminal whenever redlock's group is in the foreground: its stdin
    /// is the terminal, or it has stopped trying to use the terminal.
    pub wants_terminal: Cell<bool>,
}

impl Job {
    /// COMMAND's group `pgid`. It wants the terminal from the start if redlock's stdin and stdout
    /// are its controlling terminal and redlock is in the foreground. (Not when one of them is a
    /// pipe: the other commands of the pipeline, in redlock's group, may need the terminal, as
    /// `less` does. COMMAND then gets it only if it stops for terminal I/O.)
    pub fn new(pgid: libc::pid_t) -> Job {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open("/dev/tty")
            .ok();
        let ours = getpgrp().as_raw();
        // The terminal a descriptor is, if it is one.
        let rdev = |fd: std::os::fd::BorrowedFd<'_>| {
            isatty(fd)
                .unwrap_or(false)
                .then(|| fstat(fd).ok().map(|st| st.st_rdev))
                .flatten()
        };
        let (stdin, stdout) = (io::stdin(), io::stdout());
        let terminal = rdev(stdin.as_fd());
        let interactive = terminal.is_some()
            && terminal == rdev(stdout.as_fd())
            && tcgetpgrp(stdin.as_fd()).is_ok_and(|pg| pg.as_raw() == ours);
        Job {
            wants_terminal: Cell::new(tty.is_some() && interactive),
            tty,
            pgid,
            ours,
        }
    }

    fn foreground(&self) -> Option<libc::pid_t> {
        let pg = tcgetpgrp(self.tty.as_ref()?).ok()?.as_raw();
        (pg > 0).then_some(pg)
    }

    /// COMMAND's group is the terminal's foreground group.
    pub fn command_has_terminal(&self) -> bool {
        self.foreground() == Some(self.pgid)
    }

    /// redlock's group is the terminal's foreground group.
    pub fn redlock_has_terminal(&self) -> bool {
        self.foreground() == Some(self.ours)
    }

    fn set_foreground(&self, pgid: libc::pid_t) {
        if let Some(tty) = &self.tty {
            // SIGTTOU is blocked so that it cannot stop us when our group is not (any more) in
            // the foreground.
            let _ = without_sigttou(|| tcsetpgrp(tty, Pid::from_raw(pgid)));
        }
    }

    /// Gives the terminal to COMMAND's group if COMMAND wants it and redlock's group has it.
    pub fn hand_over(&self) {
        if self.wants_terminal.get() && self.redlock_has_terminal() {
            self.set_foreground(self.pgid);
        }
    }

    /// Takes the terminal back if COMMAND's group has it.
    pub fn take_back(&self) {
        if self.command_has_terminal() {
            self.set_foreground(self.ours);
        }
    }

    /// Whether someone could continue redlock's group after it stops: it is not orphaned, that
    /// is an ancestor in the group has its parent in another group of the same session (a shell
    /// with job control). Without one, a stop from the terminal would be for good; the kernel
    /// discards those for orphaned groups, and so does redlock.
    pub fn has_job_control(&self) -> bool {
        if self.tty.is_none() {
            return false;
        }
        let (Ok(sid), mut pid) = (getsid(None), getpid().as_raw()) else {
            return false;
        };
        for _ in 0..MAX_ANCESTORS {
            let Some(parent) = parent_of(pid) else {
                return false;
            };
            if parent <= 1 {
                return false;
            }
            let parent_pid = Some(Pid::from_raw(parent));
            let (Ok(pg), psid) = (getpgid(parent_pid), getsid(parent_pid)) else {
                return false;
            };
            if pg.as_raw() != self.ours {
                return psid == Ok(sid);
            }
            pid = parent;
        }
        false
    }
}

impl Drop for Job {
    /// Gives the terminal back to redlock's group if COMMAND's still has it.
    fn drop(&mut self) {
        self.take_back();
    }
}

/// True if `signal` has its default action in redlock (for a stop signal: it stops us).
pub fn stops_us(signal: libc::c_int) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one into `old`. No safe
    // form exists: nix's sigaction always installs one.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
    }
}

/// Fields of `/proc/PID/stat` after the command name: state, ppid, ...
fn stat_fields(pid: libc::pid_t) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// True if `pid` is stopped by a signal (state `T`) right now.
pub fn is_stopped(pid: libc::pid_t) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "T"))
}

/// The processes of group `pgid` other than `except` that have not exited (zombies left out),
/// as `/proc` lists them now.
pub fn members_besides(pgid: libc::pid_t, except: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        entry
            .ok()?
            .file_name()
            .to_str()?
            .parse::<libc::pid_t>()
            .ok()
    })
    .filter(|&pid| pid != except && is_member(pid, pgid))
    .collect()
}

/// True if `pid` is a process of group `pgid` that has not exited, as `/proc` says now.
fn is_member(pid: libc::pid_t, pgid: libc::pid_t) -> bool {
    // state, ppid, pgrp, ...: a process that has exited (Z, X) is no member any more.
    stat_fields(pid).is_some_and(|f| {
        f.first().is_some_and(|s| s != "Z" && s != "X")
            && f.get(2).and_then(|g| g.parse().ok()) == Some(pgid)
    })
}

/// The members of group `pgid` other than `except` that are still alive after a SIGKILL to the
/// group: those redlock may not signal (`kill(-pgid, SIGKILL)` succeeds when it reached any
/// member, and a process of another user — one under sudo — is left running: EPERM), and those
/// that have not exited within [`KILL_WAIT_MS`] (each watched through a pidfd). Found by review:
/// the lock was released beside such a process. Without pidfd_open (Linux before 5.3), a member
/// redlock may signal is taken for gone, as SIGKILL cannot be caught or ignored.
pub fn survivors(pgid: libc::pid_t, except: libc::pid_t) -> Vec<libc::pid_t> {
    let deadline = Instant::now() + Duration::from_millis(KILL_WAIT_MS);
    let mut left = Vec::new();
    let mut watched: Vec<(libc::pid_t, OwnedFd)> = Vec::new();
    for pid in members_besides(pgid, except) {
        // Signal 0 only checks that the process exists and that we may signal it.
        if kill(Pid::from_raw(pid), None) == Err(Errno::EPERM) {
            left.push(pid);
            continue;
        }
        let Some(fd) = pidfd(pid) else {
            continue; // gone (ESRCH), or no pidfd: SIGKILL is trusted
        };
        // The pid may have been reused since the scan by a process of another group.
        if is_member(pid, pgid) {
            watched.push((pid, fd));
        }
    }
    while !watched.is_empty() {
        // A pidfd turns readable when its process exits.
        let mut fds: Vec<PollFd<'_>> = watched
            .iter()
            .map(|(_, fd)| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        let wait = deadline.saturating_duration_since(Instant::now());
        let n = poll(
            &mut fds,
            PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX),
        );
        match n {
            Err(Errno::EINTR) => continue,
            Ok(0) | Err(_) => break, // the wait is over (or poll failed): what is left survived
            Ok(_) => {}
        }
        let exited: Vec<bool> = fds
            .iter()
            .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        let mut exited = exited.into_iter();
        watched.retain(|_| !exited.next().unwrap_or(false));
    }
    left.extend(watched.into_iter().map(|(pid, _)| pid));
    left
}

/// Sends `signal` to process group `pgid`.
pub fn signal_group(pgid: libc::pid_t, signal: libc::c_int) {
    // The group's id cannot have been reused: its leader, the watchdog, is our child and is not
    // reaped before redlock stops signalling the group.
    if let Ok(signal) = Signal::try_from(signal) {
        let _ = killpg(Pid::from_raw(pgid), signal);
    }
}
