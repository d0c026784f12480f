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
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
const REAP_WAIT_MS: libc::c_int = 1000;

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
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives in this frame.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .saturating_mul(NANOS_PER_SEC)
        .saturating_add(ts.tv_nsec as u64)
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
            // reserved real-time signals) are harmless.
            unsafe {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
    }
    // SAFETY: an empty set, then the mask of this thread (the only one between fork and exec).
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
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
        // pthread_sigmask, syscall).
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
        let pipe = File::from(std::os::fd::OwnedFd::from(writer));
        // Never block on the watchdog: should it stop reading, it keeps an older (earlier)
        // deadline, which errs on the safe side.
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let fd = pipe.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
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
    fn wait_exit(&self, ms: libc::c_int) {
        // SAFETY: pidfd_open(2) on our own unreaped child; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.child.id(), 0) };
        if fd >= 0 {
            // SAFETY: the descriptor was just returned to us.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) };
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd in this frame. The pidfd turns readable when the watchdog exits.
            unsafe {
                libc::poll(&mut pfd, 1, ms);
            }
        }
    }
}

/// True if group `pgid` (its leader reaped) has members of which redlock may signal none
/// (`kill(-pgid, 0)` says EPERM): another user's processes, which `/proc` may not show at all
/// (mounted `hidepid=2`), so that `survivors`, which sees only what `/proc` shows, missed them
/// (found by review). A success proves nothing either way — a zombie whose parent does not
/// reap it (an orphan under a container's init) is a member that `kill` reaches — and what
/// `/proc` shows of such a group `survivors` has judged. Not tested: it needs `/proc` mounted
/// `hidepid=2`; the EPERM of a visible process is `survivors`' test's.
fn hidden_members(pgid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for members and permission.
    let r = unsafe { libc::kill(-pgid, 0) };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// `redlock __run-watchdog`: the watchdog process itself. Returns only on "done" or on misuse.
pub fn watchdog_main() -> u8 {
    if !set_up_by_run() {
        // Run by hand, it could kill a process group it does not own.
        say!("redlock: {WATCHDOG_ARG} is internal to `redlock run`");
        return crate::fail::exit::USAGE;
    }
    ignore_signals();
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"redlock-watch".as_ptr());
    }
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
    // SAFETY: getpgrp, getpid and fstat have no preconditions; fstat writes into `st`.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::getpgrp() == libc::getpid()
            && libc::fstat(0, &mut st) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    }
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
            // newer ones wait in the pipe: it read them first (it killed a group whose lock was
            // still held: found by review).
            if poll_input(Some(libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            })) > 0
            {
                return true;
            }
            kill_group();
        }
        timeout = Some(Duration::from_nanos(d - now));
    }
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    match poll_input(ts) {
        0 => false, // the deadline: checked on the next call
        n if n < 0 => {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                return false;
            }
            kill_group();
        }
        _ => true,
    }
}

/// `ppoll` of the pipe (stdin) for input, at most `timeout` (`None`: no limit).
fn poll_input(timeout: Option<libc::timespec>) -> libc::c_int {
    let mut pfd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd and an optional timespec, both in this frame.
    unsafe {
        libc::ppoll(
            &mut pfd,
            1,
            timeout.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            std::ptr::null(),
        )
    }
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
        let free = &mut self.buf[self.have..];
        // SAFETY: read(2) into the free part of `buf`, at most its length.
        let n = unsafe { libc::read(0, free.as_mut_ptr().cast(), free.len()) };
        match n {
            0 => kill_group(), // redlock is gone
            n if n > 0 => self.have += n as usize,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => return false,
            _ => kill_group(),
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
    // SAFETY: kill(2) and _exit(2) with plain integers. The group is ours: we are its leader, so
    // its id cannot have been reused.
    unsafe {
        libc::kill(0, libc::SIGKILL);
        libc::_exit(1)
    }
}

/// Runs `f` with SIGTTOU blocked in this thread: a process outside the terminal's foreground
/// group may then change the foreground group (tcsetpgrp) or write to the terminal (with `stty
/// tostop`) instead of being stopped.
pub fn without_sigttou<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sigset operations on a set in this frame; pthread_sigmask changes only this
    // thread's mask, restored below.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
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
        // SAFETY: getpgrp, isatty and tcgetpgrp take plain integers; fstat writes into `st`.
        let (ours, interactive) = unsafe {
            let ours = libc::getpgrp();
            let rdev = |fd| {
                let mut st: libc::stat = std::mem::zeroed();
                (libc::isatty(fd) == 1 && libc::fstat(fd, &mut st) == 0).then_some(st.st_rdev)
            };
            let stdin = rdev(0);
            (
                ours,
                stdin.is_some() && stdin == rdev(1) && libc::tcgetpgrp(0) == ours,
            )
        };
        Job {
            wants_terminal: Cell::new(tty.is_some() && interactive),
            tty,
            pgid,
            ours,
        }
    }

    fn foreground(&self) -> Option<libc::pid_t> {
        let tty = self.tty.as_ref()?;
        // SAFETY: tcgetpgrp on a descriptor we own.
        let pg = unsafe { libc::tcgetpgrp(tty.as_raw_fd()) };
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
            // SAFETY: tcsetpgrp on a descriptor we own; SIGTTOU is blocked so that it cannot stop
            // us when our group is not (any more) in the foreground.
            without_sigttou(|| unsafe { libc::tcsetpgrp(tty.as_raw_fd(), pgid) });
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
        // SAFETY: getsid, getpgid and getpid take plain integers.
        let (sid, mut pid) = unsafe { (libc::getsid(0), libc::getpid()) };
        for _ in 0..MAX_ANCESTORS {
            let Some(parent) = parent_of(pid) else {
                return false;
            };
            if parent <= 1 {
                return false;
            }
            // SAFETY: as above.
            let (pg, psid) = unsafe { (libc::getpgid(parent), libc::getsid(parent)) };
            if pg != self.ours {
                return psid == sid;
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
    // SAFETY: sigaction(2) with no new action only reads the current one into `old`.
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
    let mut watched: Vec<(libc::pid_t, std::os::fd::OwnedFd)> = Vec::new();
    for pid in members_besides(pgid, except) {
        // SAFETY: kill(2) with signal 0 only checks that the process exists and that we may
        // signal it.
        let may_signal = unsafe { libc::kill(pid, 0) } == 0
            || io::Error::last_os_error().raw_os_error() != Some(libc::EPERM);
        if !may_signal {
            left.push(pid);
            continue;
        }
        // SAFETY: pidfd_open(2) with plain integers; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            continue; // gone (ESRCH), or no pidfd: SIGKILL is trusted
        }
        // SAFETY: the descriptor was just returned to us.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) };
        // The pid may have been reused since the scan by a process of another group.
        if is_member(pid, pgid) {
            watched.push((pid, fd));
        }
    }
    while !watched.is_empty() {
        let mut fds: Vec<libc::pollfd> = watched
            .iter()
            .map(|(_, fd)| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let wait = deadline.saturating_duration_since(Instant::now());
        // SAFETY: `fds` is a live array of `fds.len()` pollfds. A pidfd turns readable when its
        // process exits.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis() as libc::c_int,
            )
        };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break; // the wait is over (or poll failed): what is left survived
        }
        let mut exited = fds.iter().map(|p| p.revents != 0);
        watched.retain(|_| !exited.next().unwrap_or(false));
    }
    left.extend(watched.into_iter().map(|(pid, _)| pid));
    left
}

/// Sends `signal` to process group `pgid`.
pub fn signal_group(pgid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) with plain integers. The group's id cannot have been reused: its leader,
    // the watchdog, is our child and is not reaped before redlock stops signalling the group.
    unsafe {
        libc::kill(-pgid, signal);
    }
}
