//! The implementations compared by the benchmarks, behind one interface: a *cycle* is one
//! uncontended acquisition of a resource on N nodes followed by its release.
//!
//! - `mux`: this crate ([`redlock_mux::Client`]); `mux, fenced` with fencing tokens on.
//! - `floor`: a hand-rolled multiplexed client on `std::net::TcpStream` with pre-encoded RESP:
//!   write to all N, then read one reply from each. No timeouts, no parsing beyond the first
//!   byte: the reference for what is physically possible.
//! - `seq`: redis-rs synchronous connections kept open, Redlock done node after node (`SET NX
//!   PX` on each, then `EVALSHA` release on each), as the `redlock` crate does, with
//!   `TCP_NODELAY` and a per-node read/write timeout.
//! - `rslock`: the `rslock` crate as shipped (tokio, `join_all` over redis-rs multiplexed
//!   connections), on a current-thread runtime.
//! - `redlock`: the `redlock` crate as shipped (redis-rs 0.23, a new connection per node per
//!   operation, no timeouts).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use redlock_mux::{Builder, Client};

/// Lock TTL used everywhere.
pub const TTL: Duration = Duration::from_secs(10);
/// Per-node timeout given to every implementation that has one (ours: `node_timeout`).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// The release script of the floors, `seq` and rslock: the plain check-and-delete. This crate's
/// own release also publishes a release notice for waiters, which costs the servers
/// more: in one run (2026-11-23, 4 rounds, 5 loopback servers) a pipelined floor with this
/// crate's script made 0.82–0.91 × the cycles/s of one with this script at K = 64, 0.80–0.82 ×
/// at K = 256, 0.85–1.01 × at K = 1. The floors keep this script, as do the figures before.
pub const RELEASE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// Which implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Mux,
    /// This crate with fencing tokens on (one more round trip per acquisition).
    MuxFenced,
    /// This crate, releasing with `unlock_nowait` (the `scale` scenario only).
    MuxNowait,
    /// This crate's async API on tokio (the `scale` scenario only).
    MuxAsync,
    /// The same with `release_notices(false)`: the plain check-and-delete release, like the
    /// floor's (the `scale` scenario only).
    MuxAsyncQuiet,
    /// This crate over TLS, to the same servers' TLS ports ([`TLS`] must be set).
    MuxTls,
    Floor,
    Seq,
    Rslock,
    Redlock,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Mux,
        Kind::Floor,
        Kind::Seq,
        Kind::Rslock,
        Kind::Redlock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Mux => "redlock-mux",
            Kind::MuxFenced => "redlock-mux, fenced",
            Kind::Floor => "floor",
            Kind::Seq => "seq",
            Kind::Rslock => "rslock",
            Kind::Redlock => "redlock",
            Kind::MuxNowait => "redlock-mux, unlock_nowait",
            Kind::MuxAsync => "redlock-mux async (tokio)",
            Kind::MuxAsyncQuiet => "redlock-mux async, no release notices",
            Kind::MuxTls => "redlock-mux, TLS",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s || (s == "mux" && *k == Kind::Mux))
    }
}

/// One acquire + release cycle.
pub trait Cycle {
    /// Acquires `resource` once (no retry) and releases it. `Err` if it was not acquired.
    fn cycle(&mut self, resource: &str) -> Result<(), String>;
    /// The same, also returning how long the acquisition took (from the call to the decision).
    fn cycle_timed(&mut self, resource: &str) -> Result<Duration, String>;
}

/// Implements [`Cycle`] from `fn run<const TIMED: bool>(&mut self, &str) -> Result<Duration,
/// String>`: the untimed variant reads no clock for the split.
macro_rules! impl_cycle {
    ($t:ty) => {
        impl Cycle for $t {
            #[inline]
            fn cycle(&mut self, resource: &str) -> Result<(), String> {
                self.run::<false>(resource).map(|_| ())
            }
            #[inline]
            fn cycle_timed(&mut self, resource: &str) -> Result<Duration, String> {
                self.run::<true>(resource)
            }
        }
    };
}

/// `Instant::now()` when timing, else nothing.
#[inline]
fn clock<const TIMED: bool>() -> Option<Instant> {
    if TIMED { Some(Instant::now()) } else { None }
}

#[inline]
fn since(t: Option<Instant>) -> Duration {
    t.map_or(Duration::ZERO, |t| t.elapsed())
}

/// Builds a client of `kind` over `urls` (`redis://127.0.0.1:PORT`).
pub fn make(kind: Kind, urls: &[String]) -> Box<dyn Cycle> {
    match kind {
        Kind::Mux => Box::new(Mux::new(urls)),
        Kind::MuxFenced => Box::new(Mux::with(Mux::builder(urls).fencing(true))),
        Kind::Floor => Box::new(Floor::new(urls)),
        Kind::Seq => Box::new(Seq::new(urls)),
        Kind::Rslock => Box::new(Rslock::new(urls)),
        Kind::Redlock => Box::new(Redlock::new(urls)),
        Kind::MuxTls => Box::new(Mux::with(tls_builder(urls))),
        Kind::MuxNowait | Kind::MuxAsync | Kind::MuxAsyncQuiet => {
            unreachable!("the scale scenario's own runners")
        }
    }
}

/// The TLS ports of the servers (plain port → TLS port) and the CA that signed their
/// certificates, when the benchmark started them with TLS.
pub struct TlsServers {
    pub ports: Vec<(u16, u16)>,
    pub ca: std::path::PathBuf,
}

pub static TLS: std::sync::OnceLock<TlsServers> = std::sync::OnceLock::new();

/// A builder for the TLS ports of the servers behind `urls`.
pub fn tls_builder(urls: &[String]) -> Builder {
    let tls = TLS.get().expect("the servers were started without TLS");
    let urls: Vec<String> = urls
        .iter()
        .map(|u| {
            let port = socket_addr(u).port();
            let (_, tls_port) = tls
                .ports
                .iter()
                .find(|(p, _)| *p == port)
                .expect("TLS port");
            format!("rediss://127.0.0.1:{tls_port}")
        })
        .collect();
    Mux::builder(&urls).tls_ca_file(&tls.ca)
}

pub fn socket_addr(url: &str) -> SocketAddr {
    url.trim_start_matches("redis://")
        .parse()
        .unwrap_or_else(|e| panic!("bad url {url}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// this crate
// ---------------------------------------------------------------------------------------------

/// This crate's [`Client`].
pub struct Mux {
    pub client: Client,
}

impl Mux {
    /// The benchmarks' settings; `BENCH_OWNER=TEXT` in the environment gives every lock that
    /// owner (`Builder::owner`), `BENCH_CLOCK_CHECK_MS=20` turns the clock check on
    /// (`Builder::clock_check`), to measure what each costs.
    pub fn builder(urls: &[String]) -> Builder {
        let mut b = Builder::new(urls)
            .quarantine(None)
            .ttl(TTL)
            .node_timeout(NODE_TIMEOUT)
            .retry_count(0);
        if let Ok(owner) = std::env::var("BENCH_OWNER")
            && !owner.is_empty()
        {
            b = b.owner(owner);
        }
        if let Some(ms) = std::env::var("BENCH_CLOCK_CHECK_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            b = b.clock_check(Duration::from_millis(ms));
        }
        b
    }

    pub fn new(urls: &[String]) -> Mux {
        Mux::with(Mux::builder(urls))
    }

    pub fn with(builder: Builder) -> Mux {
        Mux {
            client: builder.build_client().expect("redlock-mux client"),
        }
    }
}

impl Mux {
    #[inline]
    fn run<const TIMED: bool>(&mut self, resource: &str) -> Result<Duration, String> {
        let t = clock::<TIMED>();
        let lock = self.client.try_lock(resource).map_err(|e| e.to_string())?;
        let acquired = since(t);
        self.client.unlock(lock).map_err(|e| e.to_string())?;
        Ok(acquired)
    }
}

impl_cycle!(Mux);

// ---------------------------------------------------------------------------------------------
// floor
// ---------------------------------------------------------------------------------------------

/// Hand-rolled multiplexed client: pre-encoded commands, blocking sockets, write to all N then
/// read one reply from each.
pub struct Floor {
    socks: Vec<TcpStream>,
    sha: String,
    resource: String,
    set: Vec<u8>,
    set_token: usize,
    release: Vec<u8>,
    release_token: usize,
    rbuf: [u8; 512],
    rng: u64,
}

/// Length of the floor's random token.
pub const FLOOR_TOKEN_LEN: usize = 27;

impl Floor {
    pub fn new(urls: &[String]) -> Floor {
        let mut socks = Vec::new();
        let mut sha = String::new();
        for url in urls {
            let mut s = TcpStream::connect(socket_addr(url)).expect("floor: connect");
            s.set_nodelay(true).expect("nodelay");
            s.write_all(&encode(&[b"SCRIPT", b"LOAD", RELEASE.as_bytes()]))
                .expect("floor: script load");
            let mut buf = [0u8; 128];
            let mut got = Vec::new();
            while got.len() < 47 {
                let n = s.read(&mut buf).expect("floor: read sha");
                assert!(n > 0, "floor: closed");
                got.extend_from_slice(&buf[..n]);
            }
            // "$40\r\n<sha>\r\n"
            sha = String::from_utf8_lossy(&got[5..45]).into_owned();
            socks.push(s);
        }
        Floor {
            socks,
            sha,
            resource: String::new(),
            set: Vec::new(),
            set_token: 0,
            release: Vec::new(),
            release_token: 0,
            rbuf: [0; 512],
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn prepare(&mut self, resource: &str) {
        let cycle = FloorCycle::new(resource, &self.sha);
        (self.set, self.set_token) = (cycle.set, cycle.set_token);
        (self.release, self.release_token) = (cycle.release, cycle.release_token);
        self.resource = resource.to_owned();
    }

    /// Writes `msg` to every node, then reads one reply from each; returns how many replies
    /// started with `want`.
    fn round(&mut self, release: bool, want: u8) -> usize {
        let msg = if release { &self.release } else { &self.set };
        for s in &mut self.socks {
            s.write_all(msg).expect("floor: write");
        }
        let mut yes = 0;
        for s in &mut self.socks {
            let mut len = 0;
            loop {
                let n = s.read(&mut self.rbuf[len..]).expect("floor: read");
                assert!(n > 0, "floor: closed");
                len += n;
                if self.rbuf[..len].ends_with(b"\r\n") {
                    break;
                }
            }
            if self.rbuf[0] == want {
                yes += 1;
            }
        }
        yes
    }
}

impl_cycle!(Floor);

impl Floor {
    #[inline]
    fn run<const TIMED: bool>(&mut self, resource: &str) -> Result<Duration, String> {
        let t = clock::<TIMED>();
        if resource != self.resource {
            self.prepare(resource);
        }
        // A fresh token per cycle (xorshift, printable).
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        for i in 0..FLOOR_TOKEN_LEN {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let c = ALPHABET[(self.rng & 63) as usize];
            self.set[self.set_token + i] = c;
            self.release[self.release_token + i] = c;
        }
        let quorum = self.socks.len() / 2 + 1;
        let ok = self.round(false, b'+');
        let acquired = since(t);
        let released = self.round(true, b':');
        if ok < quorum {
            return Err(format!("floor: {ok} OKs"));
        }
        let _ = released;
        Ok(acquired)
    }
}

/// The floor's pre-encoded commands for one resource: `SET resource TOKEN NX PX ttl` and the
/// release `EVALSHA`, with the offset of the token placeholder in each (overwritten with a
/// fresh token before every cycle).
pub struct FloorCycle {
    pub set: Vec<u8>,
    pub set_token: usize,
    pub release: Vec<u8>,
    pub release_token: usize,
}

impl FloorCycle {
    pub fn new(resource: &str, release_sha: &str) -> FloorCycle {
        let token = [b'x'; FLOOR_TOKEN_LEN];
        let ttl = TTL.as_millis().to_string();
        let set = encode(&[
            b"SET",
            resource.as_bytes(),
            &token,
            b"NX",
            b"PX",
            ttl.as_bytes(),
        ]);
        let release = encode(&[
            b"EVALSHA",
            release_sha.as_bytes(),
            b"1",
            resource.as_bytes(),
            &token,
        ]);
        FloorCycle {
            set_token: find_token(&set, &token),
            release_token: find_token(&release, &token),
            set,
            release,
        }
    }
}

pub fn find_token(buf: &[u8], token: &[u8]) -> usize {
    buf.windows(token.len())
        .position(|w| w == token)
        .expect("token placeholder")
}

/// RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

// ---------------------------------------------------------------------------------------------
// seq: redis-rs, node after node
// ---------------------------------------------------------------------------------------------

struct SeqNode {
    client: redis::Client,
    con: Option<redis::Connection>,
}

/// redis-rs synchronous connections, Redlock node after node.
pub struct Seq {
    nodes: Vec<SeqNode>,
    sha: String,
}

/// redis-rs connection info with `TCP_NODELAY` and no `CLIENT SETINFO` on connect.
pub fn redis_rs_info(url: &str) -> redis::ConnectionInfo {
    use redis::IntoConnectionInfo;
    let addr = socket_addr(url);
    redis::ConnectionAddr::Tcp(addr.ip().to_string(), addr.port())
        .into_connection_info()
        .expect("connection info")
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .set_redis_settings(redis::RedisConnectionInfo::default().set_skip_set_lib_name())
}

impl SeqNode {
    fn con(&mut self) -> redis::RedisResult<&mut redis::Connection> {
        if self.con.is_none() {
            let con = self.client.get_connection_with_timeout(NODE_TIMEOUT)?;
            con.set_read_timeout(Some(NODE_TIMEOUT))?;
            con.set_write_timeout(Some(NODE_TIMEOUT))?;
            self.con = Some(con);
        }
        Ok(self.con.as_mut().expect("just set"))
    }

    fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let result = self.con().and_then(|c| cmd.query(c));
        if let Err(e) = &result
            && e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        {
            // Timeouts and I/O errors leave the connection in an unknown state: reconnect.
            self.con = None;
        }
        result
    }
}

impl Seq {
    pub fn new(urls: &[String]) -> Seq {
        let mut nodes: Vec<SeqNode> = urls
            .iter()
            .map(|u| SeqNode {
                client: redis::Client::open(redis_rs_info(u)).expect("redis client"),
                con: None,
            })
            .collect();
        let mut sha = String::new();
        for node in &mut nodes {
            sha = node
                .query(redis::cmd("SCRIPT").arg("LOAD").arg(RELEASE))
                .expect("script load");
        }
        Seq { nodes, sha }
    }
}

impl_cycle!(Seq);

impl Seq {
    #[inline]
    fn run<const TIMED: bool>(&mut self, resource: &str) -> Result<Duration, String> {
        let t = clock::<TIMED>();
        let token: [u8; 20] = rand::random();
        let ttl_ms = TTL.as_millis() as u64;
        let start = Instant::now();
        let mut yes = 0;
        for node in &mut self.nodes {
            let mut set = redis::cmd("SET");
            set.arg(resource)
                .arg(&token[..])
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
            if let Ok(redis::Value::Okay) = node.query::<redis::Value>(&set) {
                yes += 1;
            }
        }
        let drift = TTL / 100 + Duration::from_millis(2);
        let won = yes > self.nodes.len() / 2 && start.elapsed() + drift < TTL;
        let acquired = since(t);
        // Release on every node (also after a lost attempt).
        for node in &mut self.nodes {
            let mut evalsha = redis::cmd("EVALSHA");
            evalsha.arg(&self.sha).arg(1).arg(resource).arg(&token[..]);
            match node.query::<i64>(&evalsha) {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let mut eval = redis::cmd("EVAL");
                    eval.arg(RELEASE).arg(1).arg(resource).arg(&token[..]);
                    let _ = node.query::<i64>(&eval);
                }
                _ => {}
            }
        }
        if won {
            Ok(acquired)
        } else {
            Err(format!("seq: {yes} OKs"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rslock
// ---------------------------------------------------------------------------------------------

/// The `rslock` crate on a current-thread tokio runtime (its best case for latency).
pub struct Rslock {
    rt: tokio::runtime::Runtime,
    mgr: rslock::LockManager,
}

impl Rslock {
    pub fn new(urls: &[String]) -> Rslock {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let clients = urls
            .iter()
            .map(|u| redis::Client::open(redis_rs_info(u)).expect("redis client"))
            .collect();
        let mut mgr = rslock::LockManager::from_clients(clients);
        // One attempt per `lock` call: the benchmark measures attempts.
        mgr.set_retry(1, Duration::from_millis(1));
        Rslock { rt, mgr }
    }
}

impl_cycle!(Rslock);

impl Rslock {
    #[inline]
    fn run<const TIMED: bool>(&mut self, resource: &str) -> Result<Duration, String> {
        let mgr = &self.mgr;
        self.rt.block_on(async {
            let t = clock::<TIMED>();
            let lock = mgr
                .lock(resource.as_bytes(), TTL)
                .await
                .map_err(|e| e.to_string())?;
            let acquired = since(t);
            mgr.unlock(&lock).await;
            Ok(acquired)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// redlock
// ---------------------------------------------------------------------------------------------

/// The `redlock` crate as shipped.
pub struct Redlock {
    rl: redlock::RedLock,
}

impl Redlock {
    pub fn new(urls: &[String]) -> Redlock {
        let mut rl = redlock::RedLock::new(urls.to_vec());
        // One attempt per call (its retry pause is random in 0..1 ms = 0).
        rl.set_retry(1, 1);
        Redlock { rl }
    }
}

impl_cycle!(Redlock);

impl Redlock {
    #[inline]
    fn run<const TIMED: bool>(&mut self, resource: &str) -> Result<Duration, String> {
        let t = clock::<TIMED>();
        let lock = self
            .rl
            .lock(resource.as_bytes(), TTL.as_millis() as usize)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "redlock: not acquired".to_owned())?;
        let acquired = since(t);
        self.rl.unlock(&lock);
        Ok(acquired)
    }
}
