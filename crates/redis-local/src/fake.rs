//! Misbehaving fake servers: a listener on 127.0.0.1 whose every accepted connection runs a
//! handler on its own thread. The handler gets a [`Peer`] that reads the client's RESP commands
//! (`*<n>\r\n$<len>\r\n<arg>\r\n…`), sends bytes, trickles them one at a time, or reads without
//! answering; the test gets [`Event`]s (accepted, command, note, done). Behind TLS with the
//! feature `tls`.

use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::raw::is_timeout;

/// Bound on every [`FakeServer::wait_for`].
pub const WAIT: Duration = Duration::from_secs(5);
/// How often the accept loop and blocked reads and writes look at the stop flag.
const POLL: Duration = Duration::from_millis(5);
/// One read from the client takes up to this much.
const READ_CHUNK: usize = 16 << 10;
/// Most arguments a command may have: clients send a handful.
const MAX_ARGS: usize = 1024;
/// Longest argument: keys, tokens and Lua scripts are far shorter.
const MAX_ARG_LEN: usize = 1 << 20;

/// What a fake server reports to the test.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Connection `id` (0, 1, …) was accepted.
    Accepted(usize),
    /// Connection `id` received a whole command.
    Command(usize, Vec<Vec<u8>>),
    /// Connection `id` reached a milestone of its script ([`Peer::note`]).
    Note(usize, &'static str),
    /// Connection `id`'s handler finished (the socket is closed right after).
    Done(usize),
}

/// A fake's side of a connection: plain TCP, or TLS over it.
trait Duplex: Read + Write + Send {}
impl<T: Read + Write + Send> Duplex for T {}

/// One accepted connection, as the handler sees it. Reads and writes give up when the client
/// closes or the [`FakeServer`] is dropped.
pub struct Peer {
    /// Which connection this is: 0 for the first accepted, then 1, …
    pub id: usize,
    stream: Box<dyn Duplex>,
    buf: Vec<u8>,
    stop: Arc<AtomicBool>,
    events: Sender<Event>,
}

impl Peer {
    /// True once the fake server is being dropped.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Reports [`Event::Note`] to the test.
    pub fn note(&self, what: &'static str) {
        let _ = self.events.send(Event::Note(self.id, what));
    }

    /// Reads more bytes into the buffer [`command`](Self::command) decodes; false on EOF, error
    /// or stop.
    pub fn fill(&mut self) -> bool {
        let mut chunk = [0u8; READ_CHUNK];
        match self.read_some(&mut chunk) {
            Some(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            None => false,
        }
    }

    /// Reads whatever the client sent next and throws it away; false on EOF, error or stop.
    pub fn skip_input(&mut self) -> bool {
        let mut chunk = [0u8; READ_CHUNK];
        self.read_some(&mut chunk).is_some()
    }

    fn read_some(&mut self, chunk: &mut [u8]) -> Option<usize> {
        loop {
            if self.stopped() {
                return None;
            }
            match self.stream.read(chunk) {
                Ok(0) => return None,
                Ok(n) => return Some(n),
                Err(e) if is_timeout(&e) => continue,
                Err(_) => return None,
            }
        }
    }

    /// The next command (an array of bulk strings), reported as [`Event::Command`]; `None` once
    /// the client closed the connection (or the test ended).
    ///
    /// # Panics
    ///
    /// If the client sent something that is not a command.
    pub fn command(&mut self) -> Option<Vec<Vec<u8>>> {
        loop {
            match decode_command(&self.buf) {
                Ok(Some((args, used))) => {
                    self.buf.drain(..used);
                    let _ = self.events.send(Event::Command(self.id, args.clone()));
                    return Some(args);
                }
                Ok(None) => {}
                Err(e) => panic!("the client sent invalid RESP ({e}): {:?}", self.buf),
            }
            if !self.fill() {
                return None;
            }
        }
    }

    /// Writes all of `bytes`; false when the client is gone (or the test ended).
    pub fn send(&mut self, bytes: &[u8]) -> bool {
        let mut off = 0;
        while off < bytes.len() {
            if self.stopped() {
                return false;
            }
            match self.stream.write(&bytes[off..]) {
                Ok(0) => return false,
                Ok(n) => off += n,
                Err(e) if is_timeout(&e) => continue,
                Err(_) => return false,
            }
        }
        true
    }

    /// Writes `bytes` one byte per write, `gap` apart (pacing, not synchronisation).
    pub fn trickle(&mut self, bytes: &[u8], gap: Duration) -> bool {
        for (i, b) in bytes.iter().enumerate() {
            if i > 0 {
                thread::sleep(gap);
            }
            if !self.send(std::slice::from_ref(b)) {
                return false;
            }
        }
        true
    }

    /// Reads (and reports) commands without ever answering, until the client closes.
    pub fn drain(&mut self) {
        while self.command().is_some() {}
    }
}

/// A decoded command's arguments, and how many bytes of the buffer it took.
type Decoded = (Vec<Vec<u8>>, usize);

/// Decodes one command, `*<n>\r\n` then `$<len>\r\n<arg>\r\n` n times, from the front of `buf`;
/// `None` while incomplete.
fn decode_command(buf: &[u8]) -> Result<Option<Decoded>, String> {
    let Some((count, mut at)) = header(buf, b'*', MAX_ARGS)? else {
        return Ok(None);
    };
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let Some((len, start)) = header(&buf[at..], b'$', MAX_ARG_LEN)? else {
            return Ok(None);
        };
        let start = at + start;
        // Both bounded by the buffer's length plus MAX_ARG_LEN + 2: no overflow.
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err("a bulk string does not end with CRLF".into());
        }
        args.push(buf[start..end].to_vec());
        at = end + 2;
    }
    Ok(Some((args, at)))
}

/// `<kind><number>\r\n` at the front of `buf`: the number (at most `max`) and the bytes it took.
fn header(buf: &[u8], kind: u8, max: usize) -> Result<Option<(usize, usize)>, String> {
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if buf[0] != kind {
        return Err(format!(
            "expected {:?}, got {:?}",
            kind as char, buf[0] as char
        ));
    }
    let n: usize = std::str::from_utf8(&buf[1..eol])
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n <= max)
        .ok_or_else(|| format!("bad length {:?}", String::from_utf8_lossy(&buf[1..eol])))?;
    Ok(Some((n, eol + 2)))
}

type Handler = Arc<dyn Fn(&mut Peer) + Send + Sync>;

/// A misbehaving server on 127.0.0.1: each accepted connection runs the handler on its own
/// thread. Dropping it stops the accept loop and every connection thread, and joins them (and
/// passes a handler's panic on).
pub struct FakeServer {
    port: u16,
    /// `Some`: the fake speaks TLS, clients trust this CA file.
    tls_ca: Option<std::path::PathBuf>,
    accepted: Arc<AtomicUsize>,
    events: Receiver<Event>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<Vec<JoinHandle<()>>>>,
}

impl FakeServer {
    /// Listens on a fresh loopback port; every connection runs `handler`.
    pub fn start(handler: impl Fn(&mut Peer) + Send + Sync + 'static) -> FakeServer {
        FakeServer::serve(Arc::new(handler), None)
    }

    /// The same fake behind TLS (`rediss://`), with the server certificate of `pki`: what the
    /// handler does to the RESP stream, it now does inside TLS records.
    #[cfg(feature = "tls")]
    pub fn start_tls(
        handler: impl Fn(&mut Peer) + Send + Sync + 'static,
        pki: &crate::Pki,
    ) -> FakeServer {
        let front = tls::config(pki);
        FakeServer::serve(Arc::new(handler), Some((front, pki.ca())))
    }

    fn serve(handler: Handler, tls: Option<(Front, std::path::PathBuf)>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("local address").port();
        let (tx, events) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (front, tls_ca) = tls.unzip();
        let accept = Accept {
            listener,
            handler,
            front,
            events: tx,
            stop: stop.clone(),
            accepted: accepted.clone(),
        };
        let acceptor = thread::Builder::new()
            .name(format!("fake-{port}"))
            .spawn(move || accept.run())
            .expect("spawn the accept loop");
        FakeServer {
            port,
            tls_ca,
            accepted,
            events,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:PORT?tls_ca=CA_FILE` behind TLS.
    pub fn url(&self) -> String {
        match &self.tls_ca {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(ca) => format!("rediss://127.0.0.1:{}?tls_ca={}", self.port, ca.display()),
        }
    }

    /// `127.0.0.1:PORT`, as errors name the node.
    pub fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits (at most [`WAIT`]) for the first event matching `what`, discarding the others.
    ///
    /// # Panics
    ///
    /// If none comes; `label` names what was awaited.
    pub fn wait_for(&self, label: &str, mut what: impl FnMut(&Event) -> bool) -> Event {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(ev) if what(&ev) => return ev,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("fake server: no {label} within {WAIT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("fake server gone before {label}"),
            }
        }
    }

    /// Every event reported so far, without waiting.
    pub fn seen(&self) -> Vec<Event> {
        self.events.try_iter().collect()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        let mut panicked = false;
        match acceptor.join() {
            Ok(conns) => {
                for conn in conns {
                    panicked |= conn.join().is_err();
                }
            }
            Err(_) => panicked = true,
        }
        if panicked && !thread::panicking() {
            panic!("a fake server thread panicked (see above)");
        }
    }
}

/// The accept loop's state.
struct Accept {
    listener: TcpListener,
    handler: Handler,
    front: Option<Front>,
    events: Sender<Event>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
}

impl Accept {
    /// Accepts until stopped; returns the connection threads.
    fn run(self) -> Vec<JoinHandle<()>> {
        let mut conns = Vec::new();
        while !self.stop.load(Ordering::SeqCst) {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if is_timeout(&e) => {
                    thread::sleep(POLL);
                    continue;
                }
                Err(e) => panic!("accept: {e}"),
            };
            let id = self.accepted.fetch_add(1, Ordering::SeqCst);
            let _ = self.events.send(Event::Accepted(id));
            let stream = self.prepare(stream).expect("set up an accepted socket");
            let mut peer = Peer {
                id,
                stream,
                buf: Vec::new(),
                stop: self.stop.clone(),
                events: self.events.clone(),
            };
            let handler = self.handler.clone();
            conns.push(thread::spawn(move || {
                handler(&mut peer);
                let _ = peer.events.send(Event::Done(peer.id));
            }));
        }
        conns
    }

    /// Blocking with short timeouts, so that every loop looks at the stop flag often; TLS over
    /// it when the fake has a front.
    fn prepare(&self, stream: std::net::TcpStream) -> io::Result<Box<dyn Duplex>> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(POLL))?;
        stream.set_write_timeout(Some(POLL))?;
        stream.set_nodelay(true)?;
        Ok(match &self.front {
            None => Box::new(stream),
            Some(front) => front.wrap(stream),
        })
    }
}

#[cfg(feature = "tls")]
use tls::Front;

/// Without the `tls` feature, no fake speaks TLS.
#[cfg(not(feature = "tls"))]
enum Front {}

#[cfg(not(feature = "tls"))]
impl Front {
    fn wrap(&self, _: std::net::TcpStream) -> Box<dyn Duplex> {
        match *self {}
    }
}

/// The TLS side of a fake (feature `tls`): rustls's server over the fake's blocking socket with
/// short timeouts, so that the handlers run unchanged.
#[cfg(feature = "tls")]
mod tls {
    use std::io::{self, Read, Write};
    use std::net::TcpStream;
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::{ServerConfig, ServerConnection};

    use super::Duplex;
    use crate::raw::is_timeout;

    /// The server configuration every connection of one fake shares.
    pub(super) struct Front(Arc<ServerConfig>);

    /// A TLS server configuration with the server certificate of `pki`.
    pub(super) fn config(pki: &crate::Pki) -> Front {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = CertificateDer::pem_file_iter(pki.server_cert())
            .expect("read the server certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("parse the server certificate");
        let key = PrivateKeyDer::from_pem_file(pki.server_key()).expect("read the server key");
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        Front(Arc::new(config))
    }

    impl Front {
        pub(super) fn wrap(&self, sock: TcpStream) -> Box<dyn Duplex> {
            let conn = ServerConnection::new(self.0.clone()).expect("TLS server connection");
            Box::new(Tls { conn, sock })
        }
    }

    struct Tls {
        conn: ServerConnection,
        sock: TcpStream,
    }

    impl Tls {
        /// Sends queued records; a socket timeout leaves the rest for the next call.
        fn push(&mut self) -> io::Result<()> {
            while self.conn.wants_write() {
                match self.conn.write_tls(&mut self.sock) {
                    Ok(_) => {}
                    Err(e) if is_timeout(&e) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        }
    }

    impl Read for Tls {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            rustls::Stream::new(&mut self.conn, &mut self.sock).read(buf)
        }
    }

    impl Write for Tls {
        /// Takes what rustls's buffer has room for, so that a flood waits for a slow reader as
        /// on plain TCP (a timeout when the buffer and the socket are full).
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.push()?;
            let n = self.conn.writer().write(buf)?;
            self.push()?;
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            self.push()
        }
    }
}
