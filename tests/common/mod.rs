#![allow(dead_code)]
//! Test harness that runs REAL `redis-server` processes.
//!
//! Every [`RedisServer`] gets its own loopback TCP port on 127.0.0.1, its own
//! temporary directory (removed on drop), no persistence (`--save ''
//! --appendonly no`) and a log file (`redis.log`, stdout + stderr of the
//! server) in that directory. Servers are SIGKILLed and reaped on drop, and the
//! child additionally has `PR_SET_PDEATHSIG = SIGKILL`, so a test process that
//! is killed does not leave servers behind.
//!
//! Caveat of `PR_SET_PDEATHSIG`: Linux delivers it when the *thread* that
//! spawned the child exits, not the process. Start a server on the thread that
//! owns it (the test's own thread); do not start servers from short-lived
//! helper threads or share one server across tests through a `static`.
//!
//! The binary is `$REDIS_SERVER` if set, else `redis-server` on `PATH`. If it is
//! missing the harness panics with install instructions; it never skips.

#[path = "../../src/bin/redlock/child.rs"]
pub mod child;
pub mod pki;

use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a server gets to start accepting commands.
pub const START_DEADLINE: Duration = Duration::from_secs(10);
/// Read/write timeout of the admin client ([`RedisServer::cmd`]).
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports [`RedisServerBuilder::start`] tries when the chosen
/// port turns out to be taken by the time redis binds it.
const PORT_ATTEMPTS: usize = 8;
/// Ports are picked at random from this range. It lies below Linux's default
/// ephemeral range (32768..=60999), so neither outgoing connections nor other
/// processes binding port 0 can grab a server's port, in particular while the
/// server is down between `kill()` and `restart()`.
const PORT_RANGE: std::ops::Range<u16> = 20000..32000;
const LOG_FILE: &str = "redis.log";
const SOCKET_FILE: &str = "redis.sock";
const INSTALL_HINT: &str = "install it with `apt-get update && apt-get install -y redis-server` \
     (as root), or set REDIS_SERVER=/path/to/redis-server";

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------

/// Options for a [`RedisServer`]; see [`RedisServer::builder`].
#[derive(Clone, Debug, Default)]
pub struct RedisServerBuilder {
    requirepass: Option<String>,
    acl_users: Vec<String>,
    unix_socket: bool,
    extra_args: Vec<String>,
    admin: Option<(Option<String>, String)>,
    preferred_port: Option<u16>,
    tls: Option<TlsListener>,
}

/// Whether a TLS port asks clients for a certificate (`--tls-auth-clients`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// Any client that trusts the server's certificate may connect.
    No,
    /// Mutual TLS: a client certificate signed by the test CA is required.
    Required,
}

/// A TLS port's certificate files (from a [`pki::Pki`]).
#[derive(Clone, Debug)]
struct TlsListener {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    auth: ClientAuth,
}

impl RedisServerBuilder {
    /// `--requirepass PASS`. The admin client then authenticates with it.
    pub fn requirepass(mut self, pass: &str) -> Self {
        self.requirepass = Some(pass.to_owned());
        self
    }

    /// A raw ACL rule line, e.g. `"alice on >secret ~* +@all"`, passed as
    /// `--user alice on >secret ~* +@all` (split on whitespace, so rules must
    /// not contain spaces). May be called several times.
    pub fn acl_user(mut self, rule: &str) -> Self {
        self.acl_users.push(rule.to_owned());
        self
    }

    /// Also listen on a unix socket `redis.sock` inside the server's dir.
    pub fn unix_socket(mut self, on: bool) -> Self {
        self.unix_socket = on;
        self
    }

    /// Any extra redis-server argument, appended verbatim, e.g.
    /// `.arg("--maxmemory").arg("10mb")`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_owned());
        self
    }

    /// Credentials the admin client ([`RedisServer::cmd`]) and the readiness
    /// check use. Default: the `requirepass` password (user `default`), or
    /// none.
    pub fn admin_credentials(mut self, user: &str, pass: &str) -> Self {
        self.admin = Some((Some(user.to_owned()), pass.to_owned()));
        self
    }

    /// Also listen for TLS (`--tls-port`, a second free port) with the certificates of `pki`;
    /// the plain port stays, for the admin client.
    pub fn tls(mut self, pki: &pki::Pki, auth: ClientAuth) -> Self {
        self.tls = Some(TlsListener {
            cert: pki.server_cert(),
            key: pki.server_key(),
            ca: pki.ca(),
            auth,
        });
        self
    }

    /// Try this port first; if redis cannot bind it, fall back to random
    /// free ports like a server without a preference.
    pub fn preferred_port(mut self, port: u16) -> Self {
        self.preferred_port = Some(port);
        self
    }

    /// Starts the server and waits (at most 10 s) until it answers `PING`.
    pub fn start(self) -> RedisServer {
        let mut server = self.spawn();
        server.wait_ready_or_retry();
        server
    }

    /// Spawns the process on a fresh port without waiting for it.
    fn spawn(self) -> RedisServer {
        let bin = redis_binary();
        let dir = make_temp_dir(self.unix_socket);
        let unix_path = self.unix_socket.then(|| dir.path().join(SOCKET_FILE));
        let admin = self
            .admin
            .clone()
            .or_else(|| self.requirepass.clone().map(|p| (None, p)));
        let port = self.preferred_port.unwrap_or_else(pick_port);
        let tls_port = self.tls.as_ref().map(|_| pick_port());
        let mut server = RedisServer {
            bin,
            port,
            tls_port,
            dir,
            unix_path,
            opts: self,
            admin,
            child: None,
            log_offset: 0,
            frozen: false,
        };
        server.spawn_process();
        server
    }
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// One real `redis-server` process, killed on drop.
pub struct RedisServer {
    bin: PathBuf,
    port: u16,
    /// The TLS port, for a server built with [`RedisServerBuilder::tls`].
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
    unix_path: Option<PathBuf>,
    opts: RedisServerBuilder,
    /// `(user, password)` for the admin client; user `None` = `default`.
    admin: Option<(Option<String>, String)>,
    child: Option<Child>,
    /// Length of the log file when the current process was spawned.
    log_offset: u64,
    frozen: bool,
}

struct Probe {
    /// Some reply was `+PONG`.
    pong: bool,
    /// `process_id` from `INFO server`.
    pid: Option<u32>,
    first_line: String,
}

enum StartError {
    /// The process exited because its port was taken.
    AddrInUse,
}

impl RedisServer {
    /// Starts a server with default options.
    pub fn start() -> RedisServer {
        RedisServer::builder().start()
    }

    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    // --- accessors ---------------------------------------------------------

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pid of the current process. Panics if it is not running (after `kill`).
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

    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `"redis://127.0.0.1:PORT"` (no credentials).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TLS port. Panics for a server without TLS.
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("the server was built without .tls(…)")
    }

    /// `"rediss://127.0.0.1:TLS_PORT"` (no options).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port())
    }

    pub fn unix_path(&self) -> Option<PathBuf> {
        self.unix_path.clone()
    }

    /// The server's own temporary directory (working dir, log, socket).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// The whole log (all runs of this server, including restarts).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    // --- faults ------------------------------------------------------------

    /// SIGSTOP: the server keeps its sockets open but stops answering.
    pub fn freeze(&mut self) {
        self.signal(libc::SIGSTOP);
        self.frozen = true;
    }

    /// SIGCONT: undo [`freeze`](Self::freeze).
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.frozen = false;
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen && self.child.is_some()
    }

    /// SIGKILL and reap. No-op if not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) on our own, not yet reaped, child.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
            }
            let _ = child.wait();
        }
        self.frozen = false;
    }

    /// Starts the server again on the SAME port, with the same args and dir
    /// (kills it first if it is still running) and waits until it accepts.
    pub fn restart(&mut self) {
        self.kill();
        if let Some(path) = &self.unix_path {
            let _ = fs::remove_file(path);
        }
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            self.spawn_process();
            match self.wait_ready(deadline) {
                Ok(()) => return,
                // The port can only be taken by something outside our port
                // range logic; give it a moment, bounded by the deadline.
                Err(StartError::AddrInUse) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(StartError::AddrInUse) => panic!(
                    "redis-server could not re-bind port {} within {:?}\n{}",
                    self.port,
                    START_DEADLINE,
                    self.log_tail()
                ),
            }
        }
    }

    /// True while the process exists (also when frozen); reaps it if it died.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            None => false,
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                self.frozen = false;
                false
            }
        }
    }

    // --- admin client ------------------------------------------------------

    /// A fresh redis-rs connection, authenticated with the admin credentials,
    /// with 5 s connect/read/write timeouts.
    pub fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        match &self.admin {
            Some((user, pass)) => self.try_connection_as(user.as_deref(), Some(pass)),
            None => self.try_connection_as(None, None),
        }
    }

    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .unwrap_or_else(|e| panic!("connect to redis at {}: {e}", self.addr()))
    }

    /// A fresh connection with explicit credentials (`None` = don't AUTH).
    pub fn try_connection_as(
        &self,
        user: Option<&str>,
        pass: Option<&str>,
    ) -> redis::RedisResult<redis::Connection> {
        use redis::IntoConnectionInfo;
        let mut settings = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = user {
            settings = settings.set_username(user);
        }
        if let Some(pass) = pass {
            settings = settings.set_password(pass);
        }
        let info = redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), self.port)
            .into_connection_info()?
            .set_redis_settings(settings);
        let client = redis::Client::open(info)?;
        let con = client.get_connection_with_timeout(ADMIN_TIMEOUT)?;
        con.set_read_timeout(Some(ADMIN_TIMEOUT))?;
        con.set_write_timeout(Some(ADMIN_TIMEOUT))?;
        Ok(con)
    }

    /// Runs one command on a fresh admin connection; errors are returned.
    pub fn try_cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        run(&mut self.try_connection()?, args)
    }

    /// Runs one command on a fresh admin connection; panics on any error.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis {} {args:?}: {e}", self.addr()))
    }

    /// Runs one command as `user`/`pass` (AUTH user pass); errors returned.
    pub fn try_cmd_as(
        &self,
        user: &str,
        pass: &str,
        args: &[&str],
    ) -> redis::RedisResult<redis::Value> {
        run(&mut self.try_connection_as(Some(user), Some(pass))?, args)
    }

    /// Runs one command as `user`/`pass`; panics on any error.
    pub fn cmd_as(&self, user: &str, pass: &str, args: &[&str]) -> redis::Value {
        self.try_cmd_as(user, pass, args)
            .unwrap_or_else(|e| panic!("redis {} as {user} {args:?}: {e}", self.addr()))
    }

    /// Runs one command WITHOUT authenticating; errors returned.
    pub fn try_cmd_unauthenticated(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        run(&mut self.try_connection_as(None, None)?, args)
    }

    /// `GET key` as a UTF-8 string.
    pub fn get(&self, key: &str) -> Option<String> {
        match self.cmd(&["GET", key]) {
            redis::Value::Nil => None,
            redis::Value::BulkString(b) => {
                Some(String::from_utf8(b).expect("GET returned non-UTF-8 data"))
            }
            other => panic!("unexpected GET reply: {other:?}"),
        }
    }

    /// `SET key value`.
    pub fn set(&self, key: &str, value: &str) {
        self.cmd(&["SET", key, value]);
    }

    /// `PTTL key`: -2 if missing, -1 if no expiry, else milliseconds left.
    pub fn pttl(&self, key: &str) -> i64 {
        match self.cmd(&["PTTL", key]) {
            redis::Value::Int(n) => n,
            other => panic!("unexpected PTTL reply: {other:?}"),
        }
    }

    /// `DBSIZE`.
    pub fn dbsize(&self) -> i64 {
        match self.cmd(&["DBSIZE"]) {
            redis::Value::Int(n) => n,
            other => panic!("unexpected DBSIZE reply: {other:?}"),
        }
    }

    /// `INFO <section>`, as text.
    pub fn info(&self, section: &str) -> String {
        match self.cmd(&["INFO", section]) {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("INFO {section} answered {other:?}"),
        }
    }

    /// `uptime_in_seconds` from `INFO server`.
    pub fn uptime_secs(&self) -> u64 {
        self.info("server")
            .lines()
            .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("uptime_in_seconds in INFO server")
    }

    /// Waits (bounded) until the server reports at least `secs` of uptime: the client's restart
    /// quarantine counts uptime, so fresh servers are quarantined for a while.
    pub fn wait_uptime(&self, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs + 10);
        while self.uptime_secs() < secs {
            assert!(Instant::now() < deadline, "uptime never reached {secs} s");
            // Waiting for the clock itself: there is no event to wait for.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn flushall(&self) {
        self.cmd(&["FLUSHALL"]);
    }

    // --- internals ---------------------------------------------------------

    fn signal(&self, sig: libc::c_int) {
        let pid = self.pid();
        // SAFETY: plain kill(2) on our own, not yet reaped, child.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}): {}", io::Error::last_os_error());
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
            args.push("--unixsocket".into());
            args.push(path.to_str().expect("non-UTF-8 socket path").into());
            args.push("--unixsocketperm".into());
            args.push("700".into());
        }
        if let Some(pass) = &self.opts.requirepass {
            args.push("--requirepass".into());
            args.push(pass.clone());
        }
        for rule in &self.opts.acl_users {
            args.push("--user".into());
            args.extend(rule.split_whitespace().map(str::to_owned));
        }
        if let (Some(tls), Some(port)) = (&self.opts.tls, self.tls_port) {
            let path = |p: &PathBuf| p.to_str().expect("non-UTF-8 certificate path").to_owned();
            let auth = match tls.auth {
                ClientAuth::No => "no",
                ClientAuth::Required => "yes",
            };
            args.extend([
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
            ]);
        }
        args.extend(self.opts.extra_args.iter().cloned());
        args
    }

    /// Spawns redis-server on `self.port`; stdout+stderr go to `redis.log`.
    fn spawn_process(&mut self) {
        assert!(self.child.is_none(), "spawn_process with a live child");
        let log_path = self.log_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("open {}: {e}", log_path.display()));
        let args = self.args();
        let _ = writeln!(
            log,
            "=== harness: starting {} {}",
            self.bin.display(),
            args.iter()
                .map(|a| format!("{a:?}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        self.log_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let err = log.try_clone().expect("dup log fd");
        let mut cmd = Command::new(&self.bin);
        cmd.args(&args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        child::die_with_parent(&mut cmd);
        let child = cmd.spawn().unwrap_or_else(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                panic!(
                    "redis-server binary {} not found: {INSTALL_HINT}",
                    self.bin.display()
                )
            }
            panic!("failed to spawn {}: {e}", self.bin.display())
        });
        self.child = Some(child);
        self.frozen = false;
    }

    /// Waits for readiness; on "address in use" moves to a new port and
    /// retries a few times.
    fn wait_ready_or_retry(&mut self) {
        for attempt in 1..=PORT_ATTEMPTS {
            let deadline = Instant::now() + START_DEADLINE;
            match self.wait_ready(deadline) {
                Ok(()) => return,
                Err(StartError::AddrInUse) if attempt < PORT_ATTEMPTS => {
                    self.port = pick_port();
                    self.tls_port = self.tls_port.map(|_| pick_port());
                    if let Some(path) = &self.unix_path {
                        let _ = fs::remove_file(path);
                    }
                    self.spawn_process();
                }
                Err(StartError::AddrInUse) => panic!(
                    "redis-server: no free port after {PORT_ATTEMPTS} attempts\n{}",
                    self.log_tail()
                ),
            }
        }
    }

    /// Polls until the server answers PING with +PONG (after AUTH if admin
    /// credentials are set). Panics with the log tail if it exits for any
    /// reason other than its port being taken, or on the deadline.
    fn wait_ready(&mut self, deadline: Instant) -> Result<(), StartError> {
        let addr = self.socket_addr();
        let mut last_reply = String::new();
        loop {
            let exited = match self.child.as_mut().expect("no child").try_wait() {
                Ok(status) => status,
                Err(e) => panic!("waitpid on redis-server: {e}"),
            };
            if let Some(status) = exited {
                self.child = None;
                let log = self.current_log();
                if log.contains("Address already in use") {
                    return Err(StartError::AddrInUse);
                }
                panic!(
                    "redis-server exited during startup ({status}) on port {}\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            let our_pid = self.child.as_ref().map(Child::id);
            match self.probe(addr) {
                Ok(p) if p.pong && p.pid.is_some() && p.pid == our_pid => return Ok(()),
                Ok(p) if p.pong => {
                    last_reply = format!("+PONG from another process (pid {:?})", p.pid)
                }
                Ok(p) => last_reply = p.first_line,
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "redis-server on {addr} did not answer PING within {START_DEADLINE:?} \
                     (last reply {last_reply:?})\n{}",
                    self.log_tail()
                );
            }
            // Polling is fine here: we wait for an external process.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One readiness probe over raw TCP: `[AUTH ...] PING` plus
    /// `INFO server`, whose `process_id` tells whether the server answering
    /// on our port is really our process (and not another server that holds
    /// the port while ours is about to fail with "address in use").
    fn probe(&self, addr: SocketAddr) -> io::Result<Probe> {
        let timeout = Duration::from_millis(500);
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let mut req = Vec::new();
        let mut expected = 2;
        if let Some((user, pass)) = &self.admin {
            let mut auth = vec!["AUTH"];
            if let Some(user) = user {
                auth.push(user);
            }
            auth.push(pass);
            req.extend(resp_encode(&auth));
            expected += 1;
        }
        req.extend(resp_encode(&["PING"]));
        req.extend(resp_encode(&["INFO", "server"]));
        s.write_all(&req)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while count_replies(&buf) < expected {
            let n = s.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let _ = s.shutdown(Shutdown::Both);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let pid = text
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok());
        let pong = text.contains("+PONG\r\n");
        let first_line = text.lines().next().unwrap_or_default().to_owned();
        Ok(Probe {
            pong,
            pid,
            first_line,
        })
    }

    /// Log written since the current/last process was spawned.
    fn current_log(&self) -> String {
        let mut out = String::new();
        if let Ok(mut f) = File::open(self.log_path()) {
            let _ = f.seek(SeekFrom::Start(self.log_offset));
            let _ = f.read_to_string(&mut out);
        }
        out
    }

    /// Last 40 lines of the log, for panic messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        format!(
            "--- tail of {} ---\n{tail}\n--- end of log ---",
            self.log_path().display()
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("dir", &self.dir.path())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------

/// A group of independent servers (e.g. the N masters of a Redlock).
#[derive(Debug)]
pub struct Servers(pub Vec<RedisServer>);

impl Servers {
    /// Starts `n` servers with default options.
    pub fn start(n: usize) -> Servers {
        Servers::start_with(n, RedisServer::builder())
    }

    /// Starts `n` servers with the same options. All processes are spawned
    /// first, then awaited, so startup overlaps. (Spawned from the calling
    /// thread on purpose; see the `PR_SET_PDEATHSIG` caveat above.)
    pub fn start_with(n: usize, builder: RedisServerBuilder) -> Servers {
        let mut servers: Vec<RedisServer> = (0..n).map(|_| builder.clone().spawn()).collect();
        for s in &mut servers {
            s.wait_ready_or_retry();
        }
        Servers(servers)
    }

    pub fn urls(&self) -> Vec<String> {
        self.0.iter().map(RedisServer::url).collect()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.0.iter().map(RedisServer::addr).collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.0.iter().map(RedisServer::port).collect()
    }
}

impl Deref for Servers {
    type Target = [RedisServer];
    fn deref(&self) -> &[RedisServer] {
        &self.0
    }
}

impl DerefMut for Servers {
    fn deref_mut(&mut self) -> &mut [RedisServer] {
        &mut self.0
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Sends `PING` over a fresh raw TCP connection and returns whatever arrives
/// within `timeout` (an `Err` of kind `WouldBlock`/`TimedOut` if nothing does).
pub fn raw_ping(addr: &str, timeout: Duration) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().expect("bad addr"), timeout)?;
    raw_ping_on(&mut s, timeout)
}

/// Sends `PING` on an existing stream and reads one reply line within
/// `timeout`.
pub fn raw_ping_on(s: &mut TcpStream, timeout: Duration) -> io::Result<String> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(b"PING\r\n")?;
    read_line(s)
}

/// Reads until `\n` (or EOF) from a stream whose read timeout is set.
pub fn read_line(s: &mut TcpStream) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\n") {
        match s.read(&mut byte)? {
            0 => break,
            _ => buf.push(byte[0]),
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// True if the error is a read timeout (`WouldBlock` on Linux).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// RESP array encoding of a command.
pub fn resp_encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend(a.as_bytes());
        out.extend(b"\r\n");
    }
    out
}

/// How many complete RESP2 replies (simple/error/integer lines and bulk
/// strings; what PING, AUTH and INFO return) `buf` holds.
fn count_replies(buf: &[u8]) -> usize {
    let mut count = 0;
    let mut rest = buf;
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return count;
        };
        let header = &rest[..eol];
        rest = &rest[eol + 2..];
        if header.first() == Some(&b'$') {
            let len: i64 = std::str::from_utf8(&header[1..])
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(-1);
            if len >= 0 {
                let need = len as usize + 2;
                if rest.len() < need {
                    return count;
                }
                rest = &rest[need..];
            }
        }
        count += 1;
    }
}

fn run(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let (name, rest) = args.split_first().expect("empty command");
    let mut c = redis::cmd(name);
    for a in rest {
        c.arg(*a);
    }
    c.query(con)
}

/// `$REDIS_SERVER`, else `redis-server` on `PATH`; panics with install
/// instructions if neither exists.
pub fn redis_binary() -> PathBuf {
    find_redis_binary(std::env::var_os("REDIS_SERVER"), std::env::var_os("PATH"))
        .unwrap_or_else(|msg| panic!("{msg}"))
}

/// The lookup behind [`redis_binary`], with the environment passed in (so it
/// can be tested without touching the process environment).
pub fn find_redis_binary(
    redis_server: Option<std::ffi::OsString>,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf, String> {
    if let Some(p) = redis_server.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(format!(
            "REDIS_SERVER={} does not exist: {INSTALL_HINT}",
            p.display()
        ));
    }
    for dir in std::env::split_paths(&path.unwrap_or_default()) {
        let candidate = dir.join("redis-server");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!("redis-server not found on PATH: {INSTALL_HINT}"))
}

/// True if `pid` no longer exists or is a zombie (dead, not yet reaped by
/// whoever is its parent now).
pub fn pid_is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // Format: "pid (comm) STATE ..."; comm may contain spaces/parens.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(true),
    }
}

fn make_temp_dir(unix_socket: bool) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("redis-test-")
        .tempdir()
        .expect("create temp dir");
    // sun_path is 108 bytes; fall back to /tmp if $TMPDIR is too deep.
    if unix_socket && dir.path().join(SOCKET_FILE).as_os_str().len() > 100 {
        return tempfile::Builder::new()
            .prefix("redis-test-")
            .tempdir_in("/tmp")
            .expect("create temp dir in /tmp");
    }
    dir
}

/// A random port from `PORT_RANGE` that is free right now (we can bind it).
/// Redis may still lose a race for it; callers retry on "address in use".
fn pick_port() -> u16 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let span = (PORT_RANGE.end - PORT_RANGE.start) as u64;
    for _ in 0..1000 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        let port = PORT_RANGE.start + (h.finish() % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port found in {PORT_RANGE:?}");
}
