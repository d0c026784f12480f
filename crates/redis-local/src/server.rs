//! One real `redis-server` process: its options ([`ServerBuilder`]), start-up on a free loopback
//! port, readiness, faults (freeze, resume, kill, restart on the same port) and its log.
//!
//! Each server gets its own temporary directory (removed on drop), no persistence (`--save ''
//! --appendonly no`) and a log file (`redis.log`: the server's stdout and stderr) there.

use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::Error;
use crate::binary::{Version, redis_binary, redis_version, redis_version_number};
use crate::clock::{self, FakeClock};
use crate::process::{self, die_with_parent};
use crate::raw::probe;

/// How long a server gets to start accepting commands.
pub const START_DEADLINE: Duration = Duration::from_secs(10);
/// How many fresh ports a start tries when the chosen port turns out to be taken by the time
/// redis binds it.
const PORT_ATTEMPTS: usize = 8;
/// Ports are picked at random from this range. It lies below Linux's default ephemeral range
/// (32768..=60999), so neither outgoing connections nor other processes binding port 0 can grab a
/// server's port, in particular while the server is down between `kill()` and `restart()`.
const PORT_RANGE: std::ops::Range<u16> = 20000..32000;
/// How many random ports [`pick_port`] tries before it gives up: the range is large, so failing
/// this often means the range is full.
const PORT_PICKS: usize = 1000;
/// How often start-up polls the process: we wait for another process, there is no event.
const POLL: Duration = Duration::from_millis(5);
/// The pause before re-binding a port that something else holds during a restart.
const REBIND_PAUSE: Duration = Duration::from_millis(100);
/// How many log lines error messages quote.
const LOG_TAIL_LINES: usize = 40;
const LOG_FILE: &str = "redis.log";
/// The option that allows `DEBUG` (and its value follows it); servers before
/// [`DEBUG_COMMAND_SINCE`] do not know it and always allow `DEBUG`.
const DEBUG_COMMAND_OPTION: &str = "--enable-debug-command";
/// The first version with [`DEBUG_COMMAND_OPTION`].
const DEBUG_COMMAND_SINCE: Version = Version::new(7, 0, 0);
const SOCKET_FILE: &str = "redis.sock";
/// `sun_path` holds 108 bytes; a socket path longer than this moves the directory to `/tmp`.
const MAX_SOCKET_PATH: usize = 100;

/// Whether a TLS port asks clients for a certificate (`--tls-auth-clients`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// Any client that trusts the server's certificate may connect.
    No,
    /// Mutual TLS: a client certificate signed by the CA is required.
    Required,
}

/// A TLS port's certificate files.
#[derive(Clone, Debug)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    auth: ClientAuth,
}

/// `(user, password)` for the readiness check and the admin client; user `None` = `default`.
pub(crate) type Credentials = Option<(Option<String>, String)>;

/// Options for a [`Server`]; see [`Server::builder`].
#[derive(Clone, Debug, Default)]
pub struct ServerBuilder {
    requirepass: Option<String>,
    acl_users: Vec<String>,
    unix_socket: bool,
    extra_args: Vec<String>,
    admin: Credentials,
    preferred_port: Option<u16>,
    tls: Option<TlsFiles>,
    fake_clock: bool,
    binary: Option<PathBuf>,
}

impl ServerBuilder {
    /// `--requirepass PASS`. The readiness check and the admin client authenticate with it.
    pub fn requirepass(mut self, pass: &str) -> Self {
        self.requirepass = Some(pass.to_owned());
        self
    }

    /// A raw ACL rule line, e.g. `"alice on >secret ~* +@all"`, passed as
    /// `--user alice on >secret ~* +@all` (split on whitespace, so rules must not contain
    /// spaces). May be called several times.
    pub fn acl_user(mut self, rule: &str) -> Self {
        self.acl_users.push(rule.to_owned());
        self
    }

    /// Also listen on a unix socket `redis.sock` inside the server's directory.
    pub fn unix_socket(mut self, on: bool) -> Self {
        self.unix_socket = on;
        self
    }

    /// Any extra redis-server argument, appended verbatim, e.g. `.arg("--maxmemory").arg("10mb")`.
    ///
    /// One exception: `--enable-debug-command` and its value are left out for a server older
    /// than 7.0, which has no such option (it is a fatal configuration error there) and always
    /// accepts `DEBUG`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_owned());
        self
    }

    /// Credentials the readiness check and the admin client use. Default: the `requirepass`
    /// password (user `default`), or none.
    pub fn admin_credentials(mut self, user: &str, pass: &str) -> Self {
        self.admin = Some((Some(user.to_owned()), pass.to_owned()));
        self
    }

    /// Also listen for TLS (`--tls-port`, a second free port) with these PEM files; the plain
    /// port stays, for the readiness check and the admin client.
    pub fn tls_files(mut self, cert: &Path, key: &Path, ca: &Path, auth: ClientAuth) -> Self {
        self.tls = Some(TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            ca: ca.to_owned(),
            auth,
        });
        self
    }

    /// [`tls_files`](Self::tls_files) with the server certificate of `pki`.
    #[cfg(feature = "pki")]
    pub fn tls(self, pki: &crate::Pki, auth: ClientAuth) -> Self {
        self.tls_files(&pki.server_cert(), &pki.server_key(), &pki.ca(), auth)
    }

    /// Run the server under libfaketime, its wall clock at first the machine's, then as
    /// [`Server::set_clock_rate`] and [`Server::step_clock`] make it (see the `clock` module:
    /// needs libfaketime, and a binary that runs under it). A restart starts the new process on
    /// the machine's clock again.
    pub fn fake_clock(mut self, on: bool) -> Self {
        self.fake_clock = on;
        self
    }

    /// Runs this `redis-server` binary instead of [`redis_binary`](crate::redis_binary)'s.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Try this port first; if redis cannot bind it, fall back to random free ports.
    pub fn preferred_port(mut self, port: u16) -> Self {
        self.preferred_port = Some(port);
        self
    }

    /// Starts the server and waits (at most [`START_DEADLINE`]) until it answers `PING`.
    ///
    /// # Panics
    ///
    /// With the [`Error`] of [`try_start`](Self::try_start).
    pub fn start(self) -> Server {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the server and waits (at most [`START_DEADLINE`]) until it answers `PING`.
    ///
    /// # Errors
    ///
    /// No binary ([`Error::NotInstalled`], saying how to install it), or the server did not come
    /// up (the error quotes the end of its log).
    pub fn try_start(self) -> Result<Server, Error> {
        let mut server = self.spawn()?;
        server.wait_ready_or_retry()?;
        Ok(server)
    }

    /// Spawns the process on a fresh port without waiting for it.
    pub(crate) fn spawn(self) -> Result<Server, Error> {
        let bin = match self.binary.clone() {
            Some(bin) => bin,
            None => redis_binary()?,
        };
        let dir = make_temp_dir(self.unix_socket)?;
        let unix_path = self.unix_socket.then(|| dir.path().join(SOCKET_FILE));
        let admin = self
            .admin
            .clone()
            .or_else(|| self.requirepass.clone().map(|p| (None, p)));
        let port = match self.preferred_port {
            Some(port) => port,
            None => pick_port()?,
        };
        let tls_port = match self.tls {
            Some(_) => Some(pick_port()?),
            None => None,
        };
        let clock = self.fake_clock.then(|| FakeClock::new(dir.path()));
        let mut server = Server {
            bin,
            port,
            tls_port,
            clock,
            dir,
            unix_path,
            opts: self,
            admin,
            child: None,
            log_offset: 0,
            frozen: false,
        };
        server.spawn_process()?;
        Ok(server)
    }
}

/// One real `redis-server` process, killed on drop.
pub struct Server {
    bin: PathBuf,
    port: u16,
    /// The TLS port, for a server built with [`ServerBuilder::tls_files`].
    tls_port: Option<u16>,
    /// Its faked wall clock, for a server built with [`ServerBuilder::fake_clock`].
    clock: Option<FakeClock>,
    dir: tempfile::TempDir,
    unix_path: Option<PathBuf>,
    opts: ServerBuilder,
    pub(crate) admin: Credentials,
    child: Option<Child>,
    /// Length of the log file when the current process was spawned.
    log_offset: u64,
    frozen: bool,
}

/// Why a start attempt did not finish.
enum StartError {
    /// The process exited because its port was taken.
    AddrInUse,
    /// Anything else.
    Failed(Error),
}

impl Server {
    /// Starts a server with default options.
    ///
    /// # Panics
    ///
    /// As [`ServerBuilder::start`].
    pub fn start() -> Server {
        Server::builder().start()
    }

    /// Options for a server.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The plain TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pid of the current process.
    ///
    /// # Panics
    ///
    /// If it is not running (after [`kill`](Self::kill)).
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("redis-server is not running")
            .id()
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT` as a socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `"redis://127.0.0.1:PORT"` (no credentials).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TLS port.
    ///
    /// # Panics
    ///
    /// For a server without TLS.
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("the server was built without TLS")
    }

    /// `"rediss://127.0.0.1:TLS_PORT"` (no options).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port())
    }

    /// The unix socket, for a server built with [`ServerBuilder::unix_socket`].
    pub fn unix_path(&self) -> Option<PathBuf> {
        self.unix_path.clone()
    }

    /// The server's own temporary directory (working directory, log, socket).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis-server 7.0.15`, from the binary's `--version`, if it says.
    pub fn version(&self) -> Option<String> {
        redis_version(&self.bin)
    }

    /// The binary's version as numbers (`--version`), for what differs between servers.
    pub fn version_number(&self) -> Option<Version> {
        redis_version_number(&self.bin)
    }

    /// The log file: stdout and stderr of every run of this server.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// The whole log (all runs of this server, including restarts).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last lines of the log, framed, for error messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!(
            "--- tail of {} ---\n{tail}\n--- end of log ---",
            self.log_path().display()
        )
    }

    /// SIGSTOP: the server keeps its sockets open but stops answering.
    ///
    /// # Panics
    ///
    /// If the process is gone.
    pub fn freeze(&mut self) {
        self.signal(libc::SIGSTOP);
        self.frozen = true;
    }

    /// SIGCONT: undo [`freeze`](Self::freeze).
    ///
    /// # Panics
    ///
    /// If the process is gone.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.frozen = false;
    }

    /// Frozen and still there.
    pub fn is_frozen(&self) -> bool {
        self.frozen && self.child.is_some()
    }

    /// SIGKILL and reap. No-op if not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.frozen = false;
    }

    /// Starts the server again on the SAME port, with the same arguments and directory (kills it
    /// first if it is still running) and waits until it accepts commands.
    ///
    /// # Panics
    ///
    /// If it does not come up within [`START_DEADLINE`].
    pub fn restart(&mut self) {
        self.kill();
        if let Some(path) = &self.unix_path {
            let _ = fs::remove_file(path);
        }
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let started = self
                .spawn_process()
                .map_err(StartError::Failed)
                .and_then(|()| self.wait_ready(deadline));
            match started {
                Ok(()) => return,
                // The port can only be taken by something outside our port range logic; give it
                // a moment, bounded by the deadline.
                Err(StartError::AddrInUse) if Instant::now() < deadline => {
                    std::thread::sleep(REBIND_PAUSE);
                }
                Err(StartError::AddrInUse) => panic!(
                    "redis-server could not re-bind port {} within {START_DEADLINE:?}\n{}",
                    self.port,
                    self.log_tail()
                ),
                Err(StartError::Failed(e)) => panic!("{e}"),
            }
        }
    }

    /// True while the process exists (also when frozen); reaps it if it died.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            None => false,
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                self.frozen = false;
                false
            }
        }
    }

    /// The faked clock.
    ///
    /// # Panics
    ///
    /// For a server built without [`ServerBuilder::fake_clock`].
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn fake_clock_mut(&mut self) -> &mut FakeClock {
        self.clock
            .as_mut()
            .expect("the server was built without fake_clock(true)")
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.pid();
        if let Err(e) = process::signal(pid, signal) {
            panic!("kill({pid}, {signal}): {e}");
        }
    }

    fn args(&self) -> Vec<String> {
        let dir = self.dir.path().to_str().expect("non-UTF-8 temp dir");
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            dir,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(path) = &self.unix_path {
            let path = path.to_str().expect("non-UTF-8 socket path");
            args.extend(["--unixsocket", path, "--unixsocketperm", "700"].map(String::from));
        }
        if let Some(pass) = &self.opts.requirepass {
            args.extend(["--requirepass".into(), pass.clone()]);
        }
        for rule in &self.opts.acl_users {
            args.push("--user".into());
            args.extend(rule.split_whitespace().map(str::to_owned));
        }
        if let (Some(tls), Some(port)) = (&self.opts.tls, self.tls_port) {
            args.extend(tls_args(tls, port));
        }
        let mut extra = self.opts.extra_args.iter();
        while let Some(arg) = extra.next() {
            let older = matches!(self.version_number(), Some(v) if v < DEBUG_COMMAND_SINCE);
            if arg == DEBUG_COMMAND_OPTION && older {
                extra.next();
                continue;
            }
            args.push(arg.clone());
        }
        args
    }

    /// Spawns redis-server on `self.port`; stdout and stderr go to `redis.log`.
    fn spawn_process(&mut self) -> Result<(), Error> {
        assert!(self.child.is_none(), "spawn_process with a live child");
        let log_path = self.log_path();
        let io_error = |source| Error::Io {
            what: format!("open {}", log_path.display()),
            source,
        };
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_error)?;
        let args = self.args();
        let quoted: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
        let _ = writeln!(
            log,
            "=== redis-local: starting {} {}",
            self.bin.display(),
            quoted.join(" ")
        );
        self.log_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let err = log.try_clone().map_err(io_error)?;
        let mut cmd = Command::new(&self.bin);
        if let Some(clock) = &mut self.clock {
            clock.prepare(&mut cmd)?;
        }
        cmd.args(&args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => {
                Error::NotInstalled(format!("{} not found", self.bin.display()))
            }
            _ => Error::Spawn {
                bin: self.bin.clone(),
                source,
            },
        })?;
        self.child = Some(child);
        self.frozen = false;
        Ok(())
    }

    /// Waits for readiness; on "address in use" moves to a new port and tries again, a few times.
    pub(crate) fn wait_ready_or_retry(&mut self) -> Result<(), Error> {
        for _ in 1..PORT_ATTEMPTS {
            match self.wait_ready(Instant::now() + START_DEADLINE) {
                Ok(()) => return Ok(()),
                Err(StartError::Failed(e)) => return Err(e),
                Err(StartError::AddrInUse) => {
                    self.port = pick_port()?;
                    if self.tls_port.is_some() {
                        self.tls_port = Some(pick_port()?);
                    }
                    if let Some(path) = &self.unix_path {
                        let _ = fs::remove_file(path);
                    }
                    self.spawn_process()?;
                }
            }
        }
        match self.wait_ready(Instant::now() + START_DEADLINE) {
            Ok(()) => Ok(()),
            Err(StartError::Failed(e)) => Err(e),
            Err(StartError::AddrInUse) => Err(Error::NoFreePort {
                attempts: PORT_ATTEMPTS,
                log_tail: self.log_tail(),
            }),
        }
    }

    /// Polls until the server answers `PING` with `+PONG` (after `AUTH` if admin credentials are
    /// set) and `INFO server` names our process. Fails with the log tail if it exits for any
    /// other reason than its port being taken, or at the deadline.
    fn wait_ready(&mut self, deadline: Instant) -> Result<(), StartError> {
        let auth: Option<Vec<&str>> = self.admin.as_ref().map(|(user, pass)| {
            let mut auth = vec!["AUTH"];
            auth.extend(user.as_deref());
            auth.push(pass);
            auth
        });
        let mut last_reply = String::new();
        loop {
            let child = self.child.as_mut().expect("no child");
            let exited = child.try_wait().map_err(|source| {
                StartError::Failed(Error::Io {
                    what: "waitpid on redis-server".into(),
                    source,
                })
            })?;
            if let Some(status) = exited {
                self.child = None;
                if self.current_log().contains("Address already in use") {
                    return Err(StartError::AddrInUse);
                }
                return Err(StartError::Failed(Error::Exited {
                    port: self.port,
                    status,
                    log_tail: self.log_tail(),
                }));
            }
            let our_pid = child.id();
            let clash = self
                .clock
                .as_ref()
                .and_then(|_| clock::clash(&self.current_log()));
            if let Some(why) = clash {
                self.kill();
                return Err(StartError::Failed(Error::Unsupported(format!(
                    "{} under libfaketime: {why}\n{}",
                    self.bin.display(),
                    self.log_tail()
                ))));
            }
            match probe(self.socket_addr(), auth.as_deref()) {
                Ok(p) if p.pong && p.pid == Some(our_pid) => return Ok(()),
                Ok(p) if p.pong => {
                    last_reply = format!("+PONG from another process (pid {:?})", p.pid)
                }
                Ok(p) => last_reply = p.first_line,
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(StartError::Failed(Error::NotReady {
                    port: self.port,
                    last_reply,
                    log_tail: self.log_tail(),
                }));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Log written since the current (or last) process was spawned.
    fn current_log(&self) -> String {
        let mut out = String::new();
        if let Ok(mut f) = File::open(self.log_path()) {
            let _ = f.seek(SeekFrom::Start(self.log_offset));
            let _ = f.read_to_string(&mut out);
        }
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("port", &self.port)
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("dir", &self.dir.path())
            .finish()
    }
}

/// `--tls-port PORT --tls-cert-file … --tls-key-file … --tls-ca-cert-file … --tls-auth-clients`.
fn tls_args(tls: &TlsFiles, port: u16) -> Vec<String> {
    let path = |p: &PathBuf| p.to_str().expect("non-UTF-8 certificate path").to_owned();
    let auth = match tls.auth {
        ClientAuth::No => "no",
        ClientAuth::Required => "yes",
    };
    vec![
        "--tls-port".into(),
        port.to_string(),
        "--tls-cert-file".into(),
        path(&tls.cert),
        "--tls-key-file".into(),
        path(&tls.key),
        "--tls-ca-cert-file".into(),
        path(&tls.ca),
        "--tls-auth-clients".into(),
        auth.into(),
    ]
}

fn make_temp_dir(unix_socket: bool) -> Result<tempfile::TempDir, Error> {
    let in_dir = |parent: &Path| {
        tempfile::Builder::new()
            .prefix("redis-local-")
            .tempdir_in(parent)
            .map_err(|source| Error::Io {
                what: format!("create a directory in {}", parent.display()),
                source,
            })
    };
    let dir = in_dir(&std::env::temp_dir())?;
    if unix_socket && dir.path().join(SOCKET_FILE).as_os_str().len() > MAX_SOCKET_PATH {
        return in_dir(Path::new("/tmp"));
    }
    Ok(dir)
}

/// A random port from [`PORT_RANGE`] that is free right now (we can bind it). Redis may still
/// lose a race for it; callers try again on "address in use".
fn pick_port() -> Result<u16, Error> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let span = u64::from(PORT_RANGE.end - PORT_RANGE.start);
    for _ in 0..PORT_PICKS {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        let port = PORT_RANGE.start + (h.finish() % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Io {
        what: format!("no free port in {PORT_RANGE:?}"),
        source: io::ErrorKind::AddrInUse.into(),
    })
}
