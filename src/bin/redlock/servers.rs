//! Local `redis-server` processes for `demo` and `bench`: free loopback ports, a temporary
//! directory each, no persistence, stopped when dropped (also during a panic's unwinding) and,
//! through `PR_SET_PDEATHSIG`, when redlock dies.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::child;
use crate::common::{Fail, exit};

/// How long a server gets to answer `PING` after it is started.
const START_DEADLINE: Duration = Duration::from_secs(10);
/// Ports tried per server when the chosen one is taken by the time redis binds it.
const PORT_ATTEMPTS: usize = 8;

/// The binary: `$REDIS_SERVER`, else `redis-server` on `PATH`.
pub fn redis_binary() -> Result<PathBuf, Fail> {
    let missing = |what: String| {
        Fail::new(
            exit::UNAVAILABLE,
            format!(
                "{what}: install it (`apt-get install redis-server`; scripts/demo does it for \
                 you) or set REDIS_SERVER=/path/to/redis-server"
            ),
        )
    };
    if let Some(p) = std::env::var_os("REDIS_SERVER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(missing(format!(
            "REDIS_SERVER={} does not exist",
            p.display()
        )));
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| missing("redis-server not found on PATH".into()))
}

/// `v=7.0.15` from `redis-server --version`, if it says.
pub fn redis_version(bin: &PathBuf) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .map(|v| format!("redis-server {v}"))
}

/// One local server.
pub struct LocalServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    frozen: bool,
}

impl LocalServer {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`, as the library names nodes.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on our own child, not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, signal);
            }
        }
    }

    /// SIGSTOP: the server keeps its connections but stops answering.
    pub fn freeze(&mut self) {
        self.signal(libc::SIGSTOP);
        self.frozen = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        if self.frozen {
            self.signal(libc::SIGCONT);
            self.frozen = false;
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        log.lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("(empty log)")
            .to_owned()
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL works on a stopped process too
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A group of local servers, stopped together when dropped.
pub struct LocalServers {
    pub servers: Vec<LocalServer>,
    pub version: Option<String>,
}

impl LocalServers {
    /// Starts `n` servers (spawned at once, then awaited). Call from the main thread: the
    /// death signal is tied to the thread that spawns them.
    pub fn start(n: usize) -> Result<LocalServers, Fail> {
        let bin = redis_binary()?;
        let version = redis_version(&bin);
        let mut group = LocalServers {
            servers: Vec::with_capacity(n),
            version,
        };
        for i in 0..n {
            let dir = temp_dir(i)?;
            let mut server = LocalServer {
                child: None,
                port: 0,
                dir,
                frozen: false,
            };
            spawn(&bin, &mut server)?;
            group.servers.push(server);
        }
        for server in &mut group.servers {
            let mut attempt = 1;
            loop {
                match wait_ready(server) {
                    Ok(()) => break,
                    Err(Start::PortTaken) if attempt < PORT_ATTEMPTS => {
                        attempt += 1;
                        spawn(&bin, server)?;
                    }
                    Err(Start::PortTaken) => {
                        return Err(Fail::new(
                            exit::UNAVAILABLE,
                            format!("redis-server found no free port in {PORT_ATTEMPTS} attempts"),
                        ));
                    }
                    Err(Start::Failed(why)) => return Err(Fail::new(exit::UNAVAILABLE, why)),
                }
            }
        }
        Ok(group)
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(LocalServer::url).collect()
    }
}

enum Start {
    PortTaken,
    Failed(String),
}

fn temp_dir(i: usize) -> Result<PathBuf, Fail> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let dir = base.join(format!(
            "redlock-{}-{i}-{attempt}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(Fail::new(
                    exit::INTERNAL,
                    format!("cannot create a directory in {}: {e}", base.display()),
                ));
            }
        }
    }
    Err(Fail::new(
        exit::INTERNAL,
        format!("cannot create a directory in {}", base.display()),
    ))
}

/// A loopback port nobody listens on right now (redis may still lose a race for it).
fn free_port() -> Result<u16, Fail> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Fail::new(exit::INTERNAL, format!("cannot find a free port: {e}")))
}

fn spawn(bin: &PathBuf, server: &mut LocalServer) -> Result<(), Fail> {
    if let Some(mut old) = server.child.take() {
        let _ = old.kill();
        let _ = old.wait();
    }
    server.port = free_port()?;
    let log_path = server.dir.join("redis.log");
    let cant = |e: io::Error| {
        Fail::new(
            exit::INTERNAL,
            format!("cannot open {}: {e}", log_path.display()),
        )
    };
    let log = File::create(&log_path).map_err(cant)?;
    let err = log.try_clone().map_err(cant)?;
    let mut cmd = Command::new(bin);
    cmd.arg("--port")
        .arg(server.port.to_string())
        .args(["--bind", "127.0.0.1", "--dir"])
        .arg(&server.dir)
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .current_dir(&server.dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    child::die_with_parent(&mut cmd);
    let child = cmd.spawn().map_err(|e| {
        Fail::new(
            exit::UNAVAILABLE,
            format!("cannot start {}: {e}", bin.display()),
        )
    })?;
    server.child = Some(child);
    Ok(())
}

/// Polls until the server answers `PING` (we are waiting for another process to start).
fn wait_ready(server: &mut LocalServer) -> Result<(), Start> {
    let deadline = Instant::now() + START_DEADLINE;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port));
    loop {
        let exited = server
            .child
            .as_mut()
            .map(|c| c.try_wait())
            .transpose()
            .map_err(|e| Start::Failed(format!("redis-server: {e}")))?
            .flatten();
        if let Some(status) = exited {
            server.child = None;
            let tail = server.log_tail();
            if tail.contains("Address already in use") {
                return Err(Start::PortTaken);
            }
            return Err(Start::Failed(format!(
                "redis-server on port {} exited at startup ({status}): {tail}",
                server.port
            )));
        }
        let pid = server.child.as_ref().map(Child::id);
        if pid.is_some() && ping(addr).ok().flatten() == pid {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Start::Failed(format!(
                "redis-server on port {} did not answer PING within {}s: {}",
                server.port,
                START_DEADLINE.as_secs(),
                server.log_tail()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `PING` and `INFO server`: the pid of the server that answers `+PONG` on `addr`, if one does
/// (so that a server of someone else on the same port is not taken for ours).
fn ping(addr: SocketAddr) -> io::Result<Option<u32>> {
    let timeout = Duration::from_millis(500);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"PING\r\nINFO server\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf);
        if let Some(rest) = text.split("process_id:").nth(1)
            && let Some((pid, _)) = rest.split_once("\r\n")
        {
            return Ok(text
                .starts_with("+PONG")
                .then(|| pid.trim().parse().ok())
                .flatten());
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
