//! `redlock run`: COMMAND under a lock kept alive by `Redlock::keep`, in a process group of its
//! own that a watchdog kills if redlock dies (see `group.rs`); signal forwarding to that group;
//! the terminal handed to it; the lost-lock path (SIGTERM, SIGKILL after a grace period that
//! never outlasts the lock, exit 79).

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::Args;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, raise};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{Pid, getpgid};
use redlock_mux::{Error, KeepAlive, Lock, Redlock};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;

use crate::fail::{Fail, exit};
use crate::group::{self, Job, Watchdog};
use crate::options::{LockOptions, build};
use crate::parse::{parse_duration, parse_exit_code};
use crate::text::{NAME_SHOWN, fmt_duration, shorten};
use crate::waiting::{self, held_on, warn_unreachable};

pub const HELP: &str = "\
Waiting: like flock, run waits until the lock is free. It says why it waits on stderr (a lock
held elsewhere after a second, servers in their restart quarantine or unreachable at once) and
again when the reason changes. Servers in quarantine or unreachable are waited for at most a grace (the reconnect backoff's ceiling + the quarantine + the connect timeout), then
it exits 69; what no wait mends (a certificate that does not verify, credentials refused, a port
that speaks another protocol) ends at once. -n makes one attempt; -w SECONDS (or 250ms, 2m, inf) sets a limit; -E N sets the exit code
when the lock stays held elsewhere. -c 'COMMAND' runs COMMAND through sh -c, as flock -c does.

Lock options: --ttl (default 10s) bounds how long the lock outlives a redlock that was killed;
while redlock runs, the lock is extended.

--permits P: RESOURCE is a counting semaphore, at most P runs at once (`redlock run --permits 3
deploy -- ./deploy.sh`); the lock held is a free permit, RESOURCE#i, and REDLOCK_RESOURCE names it.

COMMAND gets REDLOCK_RESOURCE, REDLOCK_TOKEN, REDLOCK_VALIDITY_MS and REDLOCK_HELD_ON (the
servers, host:port,...) in its environment, and REDLOCK_FENCE with --fence (pass it to what the lock protects, to refuse stale writers). The lock
is extended in the background when a third of its TTL is left; it is released when COMMAND exits.

COMMAND runs in a process group of its own, with everything it starts. A watchdog process
(redlock-watch) sends SIGKILL to that whole group if redlock dies (SIGKILL included), and if
redlock is stopped or hangs until the lock's validity runs out. So no process of the group runs on
past the lock's validity once redlock can no longer keep the lock. A process that leaves the group
(setsid, as daemons do) is not covered. Processes COMMAND leaves running in its group when it
exits (`worker &` without a `wait`) get SIGTERM, then SIGKILL after --grace (or before the lock's
validity ends); the lock is kept meanwhile and released once they are gone, and redlock exits
with COMMAND's code. A process that survives SIGKILL (another user's, under sudo) keeps the lock
from being released: its keys are left to expire, and redlock says so.

A renewal that fails is tried again after a backoff while one can be decided with a sixth of the
TTL left. If the lock is lost (the servers stopped answering, or the key vanished), the group gets
SIGTERM, then SIGKILL after --grace, or earlier so that SIGKILL goes out before the lock's validity
ends (at the default 10 s TTL a loss is told with 1.7 s or more left: a command that needs longer
to stop needs a longer --ttl), and redlock exits with 79 (or --lost-exit-code). SIGINT, SIGQUIT, SIGTERM, SIGHUP and SIGTSTP sent to
redlock are forwarded to the group.

Terminal: when redlock's stdin and stdout are its terminal and it runs in the foreground, COMMAND's
group is made the terminal's foreground group (and redlock's own restored afterwards), so Ctrl-C,
Ctrl-\\ and Ctrl-Z reach it directly, once. Otherwise (in a pipeline, with a redirection) the
terminal stays with redlock's group, redlock forwards what it gets, and COMMAND is given the
terminal only if it stops to read from it (or to set it up). Ctrl-Z stops COMMAND and redlock
together; a job stopped for longer than the lock's validity loses the lock.

Exit codes: COMMAND's own (128+N if signal N killed it); 64 usage error; 69 no quorum reachable;
70 internal error; 75 held elsewhere (or -E's code); 77 authentication refused; 78 the servers do
not match the configuration; 79 lock lost while COMMAND ran (or --lost-exit-code); 80 the servers
restarted moments ago (restart quarantine); 126 COMMAND could not be started; 127 COMMAND not
found. A COMMAND that exits with 75 or 79 itself cannot be told from these without -E and
--lost-exit-code.";

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The name of the lock (several: one lock of them all)
    ///
    /// The name of the lock (the Redis key); several names before `--`
    /// (`redlock run a b c -- COMMAND`): all of them or none, as one lock
    pub resource: String,
    /// Between SIGTERM and SIGKILL to COMMAND's group
    ///
    /// After the lock is lost, or after COMMAND exits leaving processes in its group, how long
    /// they get between SIGTERM and SIGKILL
    // (cut short so that SIGKILL goes out before the lock's validity ends)
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// The exit code when the lock is lost while COMMAND runs (default: 79)
    #[arg(long, value_name = "N", value_parser = parse_exit_code)]
    pub lost_exit_code: Option<u8>,
    /// Print nothing when the lock is held elsewhere
    ///
    /// Print nothing when the lock is held elsewhere, nor notes while waiting (the exit code
    /// says it); other failures are still reported
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Run this command line through `sh -c`
    ///
    /// Run this command line through `sh -c`, as flock -c does (instead of COMMAND...)
    #[arg(
        short = 'c',
        long = "command",
        value_name = "COMMAND",
        conflicts_with = "command"
    )]
    pub shell: Option<OsString>,
    /// The command and its arguments (after `--`)
    #[arg(
        value_name = "COMMAND",
        required_unless_present = "shell",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
    // (--ttl: the lock is extended while COMMAND runs, so the TTL bounds how long the lock
    // outlives a redlock that was killed)
    #[command(flatten)]
    pub opts: LockOptions,
}

/// run's TTL when --ttl is not given: how long the lock outlives a redlock killed with SIGKILL
/// (while redlock runs, the lock is kept alive).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

impl RunArgs {
    /// Several resources (`redlock run a b c -- COMMAND`): clap gives the first as RESOURCE
    /// and keeps the rest, `--` and COMMAND as COMMAND; they become one set locked all or none
    /// (`names::lock_name`), and COMMAND what follows the `--`. With one resource, a `--`
    /// right after it is clap's (it is not in COMMAND: `raw`, the command line, has one more)
    /// and COMMAND keeps any later `--` of its own.
    pub fn resolve(&mut self, raw: &[OsString]) -> Result<(), Fail> {
        let dashes = |args: &[OsString]| args.iter().filter(|a| *a == "--").count();
        let mut resources = vec![self.resource.clone()];
        let split = (self.shell.is_none() && dashes(raw) <= dashes(&self.command))
            .then(|| self.command.iter().position(|a| a == "--"))
            .flatten();
        if let Some(at) = split {
            for name in &self.command[..at] {
                let name = name
                    .to_str()
                    .ok_or_else(|| Fail::new(exit::USAGE, "a resource name is not valid UTF-8"))?;
                resources.push(name.to_owned());
            }
            if self.command.len() == at + 1 {
                return Err(Fail::new(exit::USAGE, "no COMMAND after '--'"));
            }
            self.command.drain(..=at);
        }
        self.resource = self.opts.lock_name(&resources)?;
        Ok(())
    }

    /// The program and its arguments: COMMAND..., or `sh -c COMMAND` for `-c`.
    fn argv(&self) -> Vec<OsString> {
        match &self.shell {
            Some(line) => vec!["sh".into(), "-c".into(), line.clone()],
            None => self.command.clone(),
        }
    }

    fn lost_code(&self) -> u8 {
        self.lost_exit_code.unwrap_or(exit::LOST)
    }

    fn ttl(&self) -> Duration {
        self.opts.ttl_or(DEFAULT_TTL)
    }
}

/// What the main loop waits for.
enum Event {
    /// COMMAND exited (not reaped yet: its pid stays ours until `Child::wait`).
    Exited,
    /// COMMAND was stopped by this signal.
    Stopped(i32),
    /// A signal to redlock; `from_self`: redlock sent it to its own process group.
    Signal { signal: i32, from_self: bool },
    /// The engine reported the kept lock lost.
    Lost(Error),
}

/// The shell's exit status for a process killed by signal N is this plus N.
const SIGNAL_EXIT_BASE: i32 = 128;

/// `128 + N` for a signal, or the exit code.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (SIGNAL_EXIT_BASE + sig).clamp(0, 255) as u8,
        (None, None) => exit::INTERNAL,
    }
}

/// A message on stderr that cannot stop redlock: with `stty tostop`, a write to the terminal from
/// outside its foreground group (COMMAND's group has it) would otherwise raise SIGTTOU.
fn note(msg: std::fmt::Arguments<'_>) {
    group::without_sigttou(|| say!("{msg}"));
}

/// Blocks until COMMAND exits (without reaping it), reporting its stops on the way.
fn watch_child(pid: libc::pid_t, tx: &mpsc::Sender<Event>) {
    let pid = Pid::from_raw(pid);
    loop {
        // WNOWAIT: `Child::wait` reaps COMMAND, so its pid stays ours until then.
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WSTOPPED | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Err(Errno::EINTR) => continue,
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => break,
            // A stop (or a tracer's): looked at below.
            Ok(_) => {}
        }
        // A stop: consume its report (WNOWAIT left it), so that the next wait blocks until
        // something new happens. If COMMAND was continued meanwhile there is nothing to report.
        let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG;
        if let Ok(WaitStatus::Stopped(who, signal)) = waitid(Id::Pid(pid), flags)
            && who == pid
            && tx.send(Event::Stopped(signal as i32)).is_err()
        {
            return;
        }
    }
    let _ = tx.send(Event::Exited);
}

pub fn run(a: &RunArgs) -> Result<u8, Fail> {
    default_sigchld();
    // A kept lock may run for days: no limit on the number of extensions.
    let command = (a.command.iter().map(|c| c.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let tuned = (a.opts).owned(a.opts.tuned(DEFAULT_TTL)?, std::process::id(), &command);
    let r = build(tuned.max_extensions(u32::MAX).fencing(a.opts.fence))?;
    let lock = waiting::acquire(&r, &a.resource, a.opts.permits, &a.opts.waiting, a.quiet)?;
    if !a.quiet {
        warn_unreachable(&lock);
    }
    // From here on a signal must not kill us while we hold the lock: catch and forward them.
    let signals = match catch_signals() {
        Ok(s) => s,
        Err(fail) => {
            let _ = r.unlock(lock);
            return Err(fail);
        }
    };
    let kept = keep(&r, lock)?;
    let (tx, rx) = mpsc::channel::<Event>();
    {
        let tx = tx.clone();
        kept.on_lost(move |e| {
            let _ = tx.send(Event::Lost(e.clone()));
        });
    }
    let running = start(a, kept, signals, tx)?;
    supervise_and_finish(a, running, &rx)
}

/// Sets SIGCHLD back to its default action. Ignored from the start (inherited through exec, as
/// `trap '' CHLD` in a shell script leaves it), it makes the kernel reap every child as it exits:
/// `waitid` on COMMAND then fails (ECHILD), redlock could not tell its exit code (it would exit
/// 70), and a later signal to COMMAND's pid could hit another process that reused it. Before any child is started, so that the watchdog and COMMAND inherit the default too.
fn default_sigchld() {
    // SAFETY: signal(2) with SIG_DFL installs no handler; it cannot fail for SIGCHLD. No safe
    // form exists: nix's signal is unsafe for every disposition.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
    }
}

/// Catches the signals redlock forwards to COMMAND's group.
fn catch_signals() -> Result<SignalsInfo<WithOrigin>, Fail> {
    SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP]).map_err(|e| {
        Fail::new(
            exit::INTERNAL,
            format!("cannot install signal handlers: {e}"),
        )
    })
}

/// Hands the lock to the engine's keep-alive.
fn keep(r: &Redlock, lock: Lock) -> Result<KeepAlive, Fail> {
    match r.keep(lock.clone()) {
        Ok(k) => Ok(k),
        Err(e) => {
            let _ = r.unlock(lock);
            Err(Fail::lib("cannot keep the lock", &e))
        }
    }
}

/// COMMAND running under the kept lock, in the watchdog's process group.
struct Running {
    kept: KeepAlive,
    child: Child,
    job: Job,
    watchdog: Watchdog,
    /// Closes the thread that receives signals.
    signal_handle: signal_hook::iterator::Handle,
}

/// Starts the watchdog, COMMAND in the watchdog's process group, and the threads that watch
/// COMMAND and receive signals. On failure the lock is released.
fn start(
    a: &RunArgs,
    kept: KeepAlive,
    signals: SignalsInfo<WithOrigin>,
    tx: mpsc::Sender<Event>,
) -> Result<Running, Fail> {
    // The watchdog first: COMMAND joins its process group, so no process of COMMAND's ever runs
    // unwatched.
    let mut watchdog = match Watchdog::spawn(kept.lock().valid_until()) {
        Ok(w) => w,
        Err(e) => {
            let _ = kept.release();
            return Err(Fail::new(
                exit::INTERNAL,
                format!("cannot start the watchdog process: {e}"),
            ));
        }
    };
    let job = Job::new(watchdog.pgid());
    // Before COMMAND starts, so that it never finds itself in the background by our doing.
    job.hand_over();
    let child = match spawn_command(a, &kept, &job) {
        Ok(child) => child,
        Err(fail) => {
            drop(job);
            // COMMAND did not start: its group holds nothing but the watchdog.
            let _ = watchdog.done();
            let _ = kept.release();
            return Err(fail);
        }
    };
    match start_threads(child, &job, signals, tx) {
        Ok((child, signal_handle)) => Ok(Running {
            kept,
            child,
            job,
            watchdog,
            signal_handle,
        }),
        Err(fail) => {
            drop(job);
            // COMMAND was killed with its group: released only if nothing of it survived (as
            // when COMMAND ends).
            kill_group_then_release(a, kept, &mut watchdog);
            Err(fail)
        }
    }
}

/// Starts COMMAND in the job's process group, with the lock in its environment.
fn spawn_command(a: &RunArgs, kept: &KeepAlive, job: &Job) -> Result<Child, Fail> {
    let argv = a.argv();
    let program = &argv[0];
    // The lock's validity may have run out before this point (redlock stopped, or blocked on
    // a full stderr): COMMAND does not start without the lock.
    if let Some(e) = kept.lost() {
        return Err(Fail::new(
            a.lost_code(),
            format!(
                "lost the lock on {} before COMMAND could start: {e}",
                shorten(&a.resource, NAME_SHOWN)
            ),
        ));
    }
    let mut command = Command::new(program);
    match kept.lock().fence() {
        Some(fence) => command.env("REDLOCK_FENCE", fence.to_string()),
        // Not one inherited from an outer `redlock run --fence`: another lock's fence.
        None => command.env_remove("REDLOCK_FENCE"),
    };
    command
        .args(&argv[1..])
        // The lock held: RESOURCE, or with --permits the permit's, RESOURCE#i.
        .env(
            "REDLOCK_RESOURCE",
            OsString::from_vec(kept.lock().resource().to_vec()),
        )
        .env(
            "REDLOCK_HELD_ON",
            held_on(kept.lock().nodes().map(|(node, _)| node)),
        )
        .env("REDLOCK_TOKEN", kept.lock().token().to_string())
        .env(
            "REDLOCK_VALIDITY_MS",
            kept.validity().as_millis().to_string(),
        )
        .process_group(job.pgid)
        .spawn()
        .map_err(|e| {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            Fail::new(
                code,
                format!("cannot run {}: {e}", program.to_string_lossy()),
            )
        })
}

/// Starts the thread that waits for COMMAND and the one that receives signals (if the first
/// cannot start, COMMAND is killed: it cannot be supervised).
fn start_threads(
    mut child: Child,
    job: &Job,
    signals: SignalsInfo<WithOrigin>,
    tx: mpsc::Sender<Event>,
) -> Result<(Child, signal_hook::iterator::Handle), Fail> {
    let pid = child.id() as libc::pid_t;
    let waiter = {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("redlock-wait".into())
            .spawn(move || watch_child(pid, &tx))
    };
    if let Err(e) = waiter {
        // Without a watcher COMMAND cannot be supervised: stop it rather than leave it unlocked.
        group::signal_group(job.pgid, libc::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
        return Err(Fail::new(
            exit::INTERNAL,
            format!("cannot start a thread: {e}; COMMAND was killed"),
        ));
    }
    let handle = signals.handle();
    let me = std::process::id() as libc::pid_t;
    let mut signals = signals;
    let _ = std::thread::Builder::new()
        .name("redlock-signals".into())
        .spawn(move || {
            for origin in signals.forever() {
                let event = Event::Signal {
                    signal: origin.signal,
                    from_self: origin.process.is_some_and(|p| p.pid == me),
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
    Ok((child, handle))
}

/// Supervises COMMAND until it exits, then releases the lock (or reports it lost) and returns
/// the exit code.
fn supervise_and_finish(
    a: &RunArgs,
    running: Running,
    rx: &mpsc::Receiver<Event>,
) -> Result<u8, Fail> {
    let Running {
        kept,
        mut child,
        job,
        watchdog,
        signal_handle,
    } = running;
    let mut sup = Supervisor::new(a, &kept, &child, &job, watchdog);
    sup.supervise(rx);
    let status = child.wait();
    let Supervisor {
        lost,
        killed,
        mut watchdog,
        ..
    } = sup;
    drop(job); // the terminal back to our group
    signal_handle.close();
    let lost = lost.or_else(|| kept.lost());
    // COMMAND was SIGKILLed, not by us, after the deadline the watchdog had: the watchdog did it,
    // because redlock could not tell it of an extension in time (redlock was stopped or starved).
    let by_watchdog = !killed
        && matches!(&status, Ok(s) if s.signal() == Some(libc::SIGKILL))
        && Instant::now() >= watchdog.deadline();
    if lost.is_some() || by_watchdog {
        if lost.is_none() {
            note(format_args!(
                "redlock: the lock on {} was not extended in time (was redlock stopped?); the \
                 watchdog killed COMMAND's process group",
                shorten(&a.resource, NAME_SHOWN)
            ));
        }
        // Whatever COMMAND left behind in its group runs without the lock: end it (and with it
        // the watchdog). Then the keys the engine left on the nodes for us (it does not release
        // a lost lock while its holder may be at work) go: COMMAND is gone — unless a process
        // of its group survived SIGKILL: then they are left to expire.
        kill_group_then_release(a, kept, &mut watchdog);
        return Ok(a.lost_code());
    }
    Ok(finish_under_lock(a, kept, watchdog, status))
}

/// COMMAND finished under the lock: lets the watchdog go, releases the lock, and returns
/// COMMAND's exit code.
fn finish_under_lock(
    a: &RunArgs,
    kept: KeepAlive,
    watchdog: Watchdog,
    status: io::Result<ExitStatus>,
) -> u8 {
    let pgid = watchdog.pgid();
    let survivors = watchdog.done();
    let code = match status {
        Ok(status) => exit_code(status),
        Err(e) => {
            note(format_args!(
                "redlock: cannot get COMMAND's exit status: {e}"
            ));
            exit::INTERNAL
        }
    };
    if !survivors.is_empty() {
        leave_to_expire(a, kept, &survivors, pgid);
        return code;
    }
    match kept.release() {
        // Expired: it ran out at the very moment COMMAND exited; COMMAND did finish under it.
        Ok(_) | Err(Error::Expired { .. }) => {}
        Err(e) => note(format_args!(
            "redlock: warning: cannot release {} (it expires by itself): {e}",
            shorten(&a.resource, NAME_SHOWN)
        )),
    }
    code
}

/// Kills COMMAND's whole group (the watchdog with it), then releases the lock — or, if a
/// process of the group survived SIGKILL, leaves its keys to expire ([`leave_to_expire`]).
fn kill_group_then_release(a: &RunArgs, kept: KeepAlive, watchdog: &mut Watchdog) {
    let pgid = watchdog.pgid();
    let survivors = watchdog.kill_group_and_reap();
    if survivors.is_empty() {
        let _ = kept.release();
    } else {
        leave_to_expire(a, kept, &survivors, pgid);
    }
}

/// Processes of COMMAND's group `pgid` survived SIGKILL (redlock may not signal them: another
/// user's, one under sudo, say): releasing the lock would let a rival in beside them. Says so,
/// and stops keeping the lock without releasing it: its keys expire by themselves, within a
/// TTL. (Keeping it while they live instead could hold it for good: a daemon.)
fn leave_to_expire(a: &RunArgs, kept: KeepAlive, survivors: &[libc::pid_t], pgid: libc::pid_t) {
    let pids: Vec<String> = survivors.iter().take(8).map(ToString::to_string).collect();
    note(format_args!(
        "redlock: warning: pid {}{} of COMMAND's process group {pgid} survived SIGKILL (redlock \
         may not signal it: another user's process?); the lock on {} is not released, its keys \
         expire by themselves within {} (the TTL), and that process may outlive them",
        pids.join(", "),
        if survivors.len() > 8 { ", ..." } else { "" },
        shorten(&a.resource, NAME_SHOWN),
        fmt_duration(a.ttl())
    ));
    let _ = kept.abandon();
}

/// How often the watchdog hears of extensions: a small part of the TTL ([`BEAT_PER_TTL`]), within
/// [`BEAT_MIN`] and [`BEAT_MAX`].
fn beat(ttl: Duration) -> Duration {
    (ttl / BEAT_PER_TTL).clamp(BEAT_MIN, BEAT_MAX)
}

/// The beat is a twentieth of the TTL: the engine extends the lock when a third of it is left,
/// so the watchdog hears of each extension long before its old deadline.
const BEAT_PER_TTL: u32 = 20;
/// The shortest beat: with a TTL of a few milliseconds the loop still sleeps between beats.
const BEAT_MIN: Duration = Duration::from_millis(5);
/// The longest beat: each beat is also the backstop for noticing a lost lock, so with a long TTL
/// a loss the engine did not report is still noticed within half a second.
const BEAT_MAX: Duration = Duration::from_millis(500);

/// After a loss, SIGKILL goes out a margin before the lock's validity ends, for redlock to wake
/// up late and for SIGKILL to take effect. The margin is at most this long: a late wake-up and a
/// kill take milliseconds, not tenths of a second, even on a busy machine.
const KILL_MARGIN_MAX: Duration = Duration::from_millis(100);
/// ... and at most this part (a quarter) of the validity left, so that a loss close to the end of
/// the validity still leaves COMMAND most of what is left as its grace period.
const KILL_MARGIN_SHARE: u32 = 4;

/// How often redlock looks whether the processes COMMAND left in its group have ended (a scan
/// of `/proc`, for the grace period at most): the lock is released this long after the last
/// of them at most.
const LEFTOVER_POLL: Duration = Duration::from_millis(50);

/// The main loop's state.
struct Supervisor<'a> {
    kept: &'a KeepAlive,
    a: &'a RunArgs,
    /// COMMAND.
    pid: libc::pid_t,
    job: &'a Job,
    watchdog: Watchdog,
    /// Why the lock was lost, once it was.
    lost: Option<Error>,
    /// When the group got SIGTERM for a lost lock.
    term_at: Option<Instant>,
    /// When the group gets SIGKILL after a lost lock.
    kill_at: Option<Instant>,
    /// We sent the group SIGKILL.
    killed: bool,
    /// COMMAND has exited (what it left in its group gets SIGTERM, then SIGKILL).
    exited: bool,
}

impl<'a> Supervisor<'a> {
    fn new(
        a: &'a RunArgs,
        kept: &'a KeepAlive,
        child: &Child,
        job: &'a Job,
        watchdog: Watchdog,
    ) -> Self {
        Supervisor {
            kept,
            a,
            pid: child.id() as libc::pid_t,
            job,
            watchdog,
            lost: None,
            term_at: None,
            kill_at: None,
            killed: false,
            exited: false,
        }
    }

    /// Waits for COMMAND to exit, forwarding signals, passing the lock's validity on to the
    /// watchdog, following COMMAND's stops, and reacting to the loss of the lock.
    fn supervise(&mut self, rx: &mpsc::Receiver<Event>) {
        let beat = beat(self.a.ttl());
        loop {
            let now = Instant::now();
            if self.lost.is_none() {
                self.pass_validity_on();
            }
            match self.next_event(rx, now, beat) {
                Ok(Event::Exited) if self.lost.is_none() => {
                    // What COMMAND left running in its group ends before the lock does.
                    self.exited = true;
                    let left = self.leftovers();
                    if left.is_empty() {
                        return;
                    }
                    self.end_leftovers(&left);
                }
                Ok(Event::Exited) | Err(RecvTimeoutError::Disconnected) => {
                    if self.lost.is_some() && !self.killed {
                        // COMMAND is gone; what it left in the group gets no more grace.
                        self.kill_group();
                    }
                    return;
                }
                Ok(Event::Stopped(signal)) => self.stopped(signal),
                Ok(Event::Signal {
                    from_self: true, ..
                }) => {}
                // A signal from the terminal reaches only its foreground group: COMMAND's when
                // it has the terminal (redlock then gets none), redlock's otherwise. Either way,
                // forwarding what redlock gets delivers it to COMMAND's group once.
                Ok(Event::Signal { signal, .. }) => self.signal(signal),
                Ok(Event::Lost(e)) => self.lose(e),
                Err(RecvTimeoutError::Timeout) => self.timed_out(),
            }
            if self.exited && (self.killed || self.leftovers().is_empty()) {
                return;
            }
        }
    }

    /// The processes other than the watchdog (the group's leader: its pid is the group's)
    /// still in COMMAND's group.
    fn leftovers(&self) -> Vec<libc::pid_t> {
        group::members_besides(self.job.pgid, self.job.pgid)
    }

    /// COMMAND exited and left `left` running in its group: they get SIGTERM now and SIGKILL
    /// after the grace period (or before the lock's validity ends), while the lock is kept; it
    /// is released once they are gone. Bounded, unlike waiting for them: a daemon started
    /// without `setsid` or a stopped job would keep the lock, and redlock, for good.
    fn end_leftovers(&mut self, left: &[libc::pid_t]) {
        let now = Instant::now();
        let kill_at = self.kill_deadline(now);
        let pids: Vec<String> = left.iter().take(8).map(ToString::to_string).collect();
        note(format_args!(
            "redlock: COMMAND exited, but left pid {}{} running in its process group {}: \
             SIGTERM now, SIGKILL in {} at the latest; the lock on {} is released once they \
             are gone",
            pids.join(", "),
            if left.len() > 8 { ", ..." } else { "" },
            self.job.pgid,
            fmt_duration(kill_at.saturating_duration_since(now)),
            shorten(&self.a.resource, NAME_SHOWN)
        ));
        self.signal(libc::SIGTERM);
        // A stopped process acts on SIGTERM only once continued.
        self.signal(libc::SIGCONT);
        self.term_at = Some(now);
        self.kill_at = Some(kill_at);
        if kill_at <= now {
            self.kill_group();
        }
    }

    /// When SIGKILL goes out after a SIGTERM sent `now`: after the grace period, or a margin
    /// before the lock's validity ends if that is sooner.
    fn kill_deadline(&self, now: Instant) -> Instant {
        let valid_until = self.kept.lock().valid_until();
        let left = valid_until.saturating_duration_since(now);
        // A margin for us to wake up late (and for the SIGKILL to take effect).
        let margin = (left / KILL_MARGIN_SHARE).min(KILL_MARGIN_MAX);
        (now + self.a.grace).min(now + (left - margin))
    }

    /// Gives the watchdog the lock's validity (which each extension moves on), and says so
    /// once if the watchdog is gone.
    fn pass_validity_on(&mut self) {
        let gone = self.watchdog.gone;
        self.watchdog.extend(self.kept.lock().valid_until());
        if self.watchdog.gone && !gone {
            note(format_args!(
                "redlock: warning: the watchdog process was killed: should redlock die now, \
                 COMMAND's process group would outlive the lock"
            ));
        }
    }

    /// The next event: waited for until the next beat while the lock is kept, until SIGKILL is
    /// due once it is lost, and for as long as it takes once SIGKILL went out.
    fn next_event(
        &self,
        rx: &mpsc::Receiver<Event>,
        now: Instant,
        beat: Duration,
    ) -> Result<Event, RecvTimeoutError> {
        let wake = match (&self.lost, self.kill_at) {
            // After COMMAND exited, whether what it left in its group is gone is looked at
            // this often, until SIGKILL is due.
            (_, Some(t)) if !self.killed && self.exited => Some(t.min(now + LEFTOVER_POLL)),
            // The engine tells us of a loss; each beat is also a backstop for it.
            (None, _) => Some(now + beat),
            (Some(_), Some(t)) if !self.killed => Some(t),
            _ => None,
        };
        match wake {
            Some(t) => rx.recv_timeout(t.saturating_duration_since(now)),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    }

    /// No event before the wake-up: while the lock is kept, ask whether it was lost (the
    /// backstop); once it is lost, send SIGKILL when it is due.
    fn timed_out(&mut self) {
        match (&self.lost, self.kill_at) {
            (None, Some(t)) if self.exited && !self.killed && Instant::now() >= t => {
                note(format_args!(
                    "redlock: what COMMAND left in process group {} still running {} after \
                     SIGTERM; sending SIGKILL",
                    self.job.pgid,
                    fmt_duration(self.term_at.map_or(Duration::ZERO, |at| t - at))
                ));
                self.kill_group();
            }
            (None, _) => {
                if let Some(e) = self.kept.lost() {
                    self.lose(e);
                }
            }
            (Some(_), Some(t)) if !self.killed && Instant::now() >= t => {
                note(format_args!(
                    "redlock: COMMAND's process group {} still running {} after SIGTERM; \
                     sending SIGKILL",
                    self.job.pgid,
                    fmt_duration(self.term_at.map_or(Duration::ZERO, |at| t - at))
                ));
                self.kill_group();
            }
            _ => {}
        }
    }

    /// Sends `signal` to COMMAND's process group, and to COMMAND itself if it left the group.
    fn signal(&self, signal: i32) {
        group::signal_group(self.job.pgid, signal);
        // Our own child, which is not reaped before this loop ends, so its pid cannot have
        // been reused.
        let pid = Pid::from_raw(self.pid);
        if getpgid(Some(pid)).is_ok_and(|pg| pg.as_raw() != self.job.pgid)
            && let Ok(signal) = Signal::try_from(signal)
        {
            let _ = kill(pid, signal);
        }
    }

    fn kill_group(&mut self) {
        self.signal(libc::SIGKILL);
        self.killed = true;
    }

    /// The lock is lost: SIGTERM to COMMAND's group, and SIGKILL after the grace period, but
    /// before the lock's validity ends.
    fn lose(&mut self, why: Error) {
        if self.lost.is_some() {
            return;
        }
        let now = Instant::now();
        let kill_at = self.kill_deadline(now);
        let left = self
            .kept
            .lock()
            .valid_until()
            .saturating_duration_since(now);
        // SIGKILL at once: the validity is over, or --grace 0s asks for it (each says so: not
        // "the lock's validity is over" while validity is left).
        let when = if kill_at <= now && left.is_zero() {
            "the lock's validity is over: SIGKILL at once".to_owned()
        } else if kill_at <= now {
            format!(
                "--grace {}: SIGKILL at once, {} before the lock's validity ends",
                fmt_duration(self.a.grace),
                fmt_duration(left)
            )
        } else if kill_at < now + self.a.grace {
            format!(
                "SIGKILL in {}, before the lock's validity ends",
                fmt_duration(kill_at - now)
            )
        } else {
            format!("SIGKILL in {}", fmt_duration(self.a.grace))
        };
        note(format_args!(
            "redlock: lost the lock on {} while COMMAND was running ({why}); sending SIGTERM to \
             its process group {} ({when})",
            shorten(&self.a.resource, NAME_SHOWN),
            self.job.pgid
        ));
        self.signal(libc::SIGTERM);
        // A stopped process acts on SIGTERM only once continued.
        self.signal(libc::SIGCONT);
        self.lost = Some(why);
        self.term_at = Some(now);
        self.kill_at = Some(kill_at);
        if kill_at <= now {
            self.kill_group();
        }
    }

    /// COMMAND was stopped by `signal`.
    fn stopped(&mut self, signal: i32) {
        let job = self.job;
        if self.lost.is_some() || !group::is_stopped(self.pid) {
            // SIGKILL is on its way, or COMMAND was continued meanwhile.
            return;
        }
        let tty_stop = matches!(signal, libc::SIGTTIN | libc::SIGTTOU);
        if tty_stop && !job.command_has_terminal() && job.redlock_has_terminal() {
            // COMMAND tried to use the terminal, which is ours to give: give it.
            self.give_terminal_and_continue();
            return;
        }
        if !(job.command_has_terminal() || tty_stop || signal == libc::SIGTSTP) {
            // Stopped by someone, not by the terminal: it stays stopped, the lock stays kept.
            return;
        }
        if !job.has_job_control() {
            // Nobody could continue us: ignore a Ctrl-Z, as the kernel does for an orphaned
            // process group. (COMMAND stopped for terminal I/O it cannot have stays stopped.)
            if signal == libc::SIGTSTP {
                self.signal(libc::SIGCONT);
            }
            return;
        }
        // Stop our own job, as the terminal would have if COMMAND were in it, so that the shell
        // sees it stopped and takes the terminal back; carry on once continued. redlock stops
        // with COMMAND's SIGTTIN or SIGTTOU if that stops it (so the shell can say "tty input"),
        // else with SIGSTOP; the rest of its process group with SIGTSTP (redlock ignores its own).
        job.take_back();
        let own = if tty_stop && group::stops_us(signal) {
            signal
        } else {
            libc::SIGSTOP
        };
        // Our own process group; raise(3) of a stop signal returns once we are continued.
        let _ = kill(Pid::from_raw(0), Signal::SIGTSTP);
        if let Ok(own) = Signal::try_from(own) {
            let _ = raise(own);
        }
        // Continued (`fg` or `bg`). The lock was not extended meanwhile.
        if let Some(e) = self.kept.lost() {
            self.lose(e);
            return;
        }
        if tty_stop {
            self.give_terminal_and_continue();
        } else {
            job.hand_over();
            self.signal(libc::SIGCONT);
        }
    }

    /// COMMAND stopped for terminal I/O: from now on it gets the terminal whenever we have it.
    fn give_terminal_and_continue(&self) {
        self.job.wants_terminal.set(true);
        self.job.hand_over();
        self.signal(libc::SIGCONT);
    }
}
