//! TLS for `rediss://` nodes (the `tls` feature): the client configurations, made once when a
//! client is built, and the TLS half of a connection's socket.
//!
//! rustls is sans-IO like the rest of this crate: it never touches the socket. [`TlsStream`]
//! moves bytes between the non-blocking `mio` socket and rustls (`read_tls` →
//! `process_new_packets` → plaintext, and plaintext → `write_tls`), the way rustls's own
//! `tlsclient-mio` example does, so a TLS node lives in the same event loop as a plain one.
//!
//! Files are read once, when the client is built. Each node gets a session cache of its own:
//! a reconnect resumes the session (no certificate chain sent or checked again), counted in
//! [`IoStats::tls_resumed`](crate::IoStats::tls_resumed). One cache for all nodes would not do:
//! rustls keys it by server name, and nodes reached by IP address with one `tls_server_name`
//! share a name, so each would offer the others' tickets and fall back to full handshakes.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, HandshakeKind, RootCertStore};

/// Sessions each node's cache keeps (a TLS 1.3 server hands out a few tickets per handshake,
/// each good for one resumption).
const SESSIONS_PER_NODE: usize = 8;

use crate::model::addr::{Endpoint, NodeAddr, TlsParams};
use crate::model::error::{Error, NodeFault};
use crate::model::stats::Counter;

/// What one TLS node connects with: the shared configuration and the name its certificate must
/// carry.
#[derive(Debug, Clone)]
pub(crate) struct Connector {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl Connector {
    /// A new client session, its ClientHello queued.
    pub fn start(&self) -> Result<ClientConnection, NodeFault> {
        ClientConnection::new(self.config.clone(), self.name.clone())
            .map_err(|e| NodeFault::Tls(e.to_string()))
    }
}

/// The [`Builder`](crate::Builder)'s TLS settings: the defaults of every `rediss://` address,
/// which the address's own options override.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsDefaults {
    pub params: TlsParams,
    /// A complete configuration given by the caller (`Builder::tls_config`): used as it is for
    /// the nodes without options of their own.
    pub config: Option<Arc<ClientConfig>>,
}

impl TlsDefaults {
    /// Whether the builder was given any TLS setting.
    pub fn is_set(&self) -> bool {
        self.params != TlsParams::default() || self.config.is_some()
    }
}

/// One connector per node (`None` for the plain ones). Files are read here, once, so that a
/// missing or unreadable one is a configuration error when the client is built, not a node
/// fault later.
pub(crate) fn connectors(
    nodes: &[NodeAddr],
    defaults: &TlsDefaults,
) -> Result<Vec<Option<Connector>>, Error> {
    // Nodes with the same files share what was read from them.
    let mut made: Vec<(TlsParams, Arc<ClientConfig>)> = Vec::new();
    let mut out = Vec::with_capacity(nodes.len());
    for node in nodes {
        let (Some(own), Endpoint::Tcp { host, .. }) = (&node.tls, &node.endpoint) else {
            out.push(None);
            continue;
        };
        let params = merged(own, &defaults.params);
        let files = TlsParams {
            server_name: None,
            ..params.clone()
        };
        let config = match (&defaults.config, own == &TlsParams::default()) {
            // The caller's configuration, session cache included, as it is.
            (Some(config), true) => config.clone(),
            _ => {
                let shared = match made.iter().find(|(p, _)| *p == files) {
                    Some((_, config)) => config.clone(),
                    None => {
                        let config = Arc::new(client_config(&files)?);
                        made.push((files, config.clone()));
                        config
                    }
                };
                let mut own = (*shared).clone();
                own.resumption = Resumption::in_memory_sessions(SESSIONS_PER_NODE);
                Arc::new(own)
            }
        };
        let name = params.server_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_owned()).map_err(|_| {
            Error::Config(format!(
                "{node}: \"{name}\" is not a valid TLS server name (give one with tls_server_name)"
            ))
        })?;
        out.push(Some(Connector { config, name }));
    }
    Ok(out)
}

fn merged(own: &TlsParams, defaults: &TlsParams) -> TlsParams {
    let (cert_file, key_file) = match (&own.cert_file, &own.key_file) {
        (Some(c), Some(k)) => (Some(c.clone()), Some(k.clone())),
        _ => (defaults.cert_file.clone(), defaults.key_file.clone()),
    };
    TlsParams {
        ca_file: own.ca_file.clone().or_else(|| defaults.ca_file.clone()),
        cert_file,
        key_file,
        server_name: own
            .server_name
            .clone()
            .or_else(|| defaults.server_name.clone()),
    }
}

fn file_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("TLS {what} {}: {e}", path.display()))
}

/// A rustls configuration: ring's crypto, TLS 1.2 and 1.3, the given CA file's certificates (or
/// the system's), a client certificate if given, and session resumption (rustls's default
/// in-memory cache).
fn client_config(files: &TlsParams) -> Result<ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots(files.ca_file.as_deref())?);
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "client certificate")?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("client key", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::Config(format!("TLS client certificate: {e}")))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certificates(path, "CA file")? {
                roots
                    .add(cert)
                    .map_err(|e| file_error("CA file", path, e))?;
            }
        }
        None => {
            // Unreadable entries of the system store are skipped, as browsers do; an empty
            // store is an error, or every handshake would fail with a less helpful message.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(Error::Config(
                    "TLS: no trusted CA certificates found in the system's store; give the \
                     servers' CA with tls_ca=FILE (or Builder::tls_ca_file, --tls-ca)"
                        .into(),
                ));
            }
        }
    }
    Ok(roots)
}

/// A TCP socket with a TLS client session on it.
pub(crate) struct TlsStream {
    pub tcp: TcpStream,
    tls: ClientConnection,
    /// The last socket read returned fewer bytes than asked: the socket is drained, and an
    /// edge-triggered poll reports the next bytes.
    drained: bool,
    /// The readable event said the server closed its side: read on past a short read, to the
    /// end (the close has no edge of its own).
    peer_closed: bool,
    /// The handshake sent a flight that no server bytes answered yet: the next bytes read end
    /// a round trip.
    awaiting: bool,
}

/// What the handshake did on one readiness event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The handshake finished on this event.
    pub done: bool,
    /// Round trips: server bytes that answered a flight of ours (a server flight split over
    /// several reads counts once).
    pub flights: u64,
    /// Syscalls made (reads and writes).
    pub reads: u64,
    pub writes: u64,
}

/// A rustls error as an `io::Error` that [`fault`] turns back into [`NodeFault::Tls`].
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The fault an I/O error of a TLS stream stands for.
pub(crate) fn fault(e: &io::Error) -> Option<NodeFault> {
    let inner = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(NodeFault::Tls(inner.to_string()))
}

/// A reader that notes a short read.
struct NoteShort<'a> {
    inner: &'a mut TcpStream,
    short: &'a mut bool,
}

impl Read for NoteShort<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        *self.short = n < buf.len();
        Ok(n)
    }
}

impl TlsStream {
    pub fn new(tcp: TcpStream, tls: ClientConnection) -> TlsStream {
        TlsStream {
            tcp,
            tls,
            drained: false,
            peer_closed: false,
            awaiting: false,
        }
    }

    /// A readable event begins: the socket may have bytes again (`closed`: and its end).
    pub fn read_begin(&mut self, closed: bool) {
        self.drained = false;
        self.peer_closed = closed;
    }

    /// Whether the last handshake was a resumption.
    pub fn resumed(&self) -> bool {
        self.tls.handshake_kind() == Some(HandshakeKind::Resumed)
    }

    /// Sends what rustls has queued; returns the number of `write` calls. A full socket leaves
    /// the rest queued for the next writable event.
    pub fn push(&mut self) -> io::Result<u64> {
        let mut writes = 0;
        while self.tls.wants_write() {
            writes += 1;
            match self.tls.write_tls(&mut self.tcp) {
                Ok(n) => self.awaiting |= n > 0 && self.tls.is_handshaking(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(writes)
    }

    /// Reads and answers handshake messages until the socket is drained or the handshake is
    /// done. An error is the handshake's failure (an untrusted certificate, say).
    pub fn handshake(&mut self) -> Result<Progress, NodeFault> {
        let io_fault = |e: io::Error| NodeFault::Io(e.kind());
        let mut p = Progress::default();
        loop {
            p.writes += self.push().map_err(io_fault)?;
            if !self.tls.is_handshaking() {
                p.done = true;
                return Ok(p);
            }
            p.reads += 1;
            match self.tls.read_tls(&mut self.tcp) {
                // A passing fault, as over plain TCP: a TLS Redis over its `maxclients` closes a
                // new connection before any handshake (Redis's `acceptCommonHandler`), as does
                // one shutting down or a TLS proxy whose backend is down. Taken for a TLS
                // failure (permanent), it made `lock` give up at once (found by review); a
                // server that wants a client certificate refuses with an alert, not this.
                Ok(0) => return Err(NodeFault::Closed),
                Ok(_) => {
                    p.flights += u64::from(std::mem::take(&mut self.awaiting));
                    if let Err(e) = self.tls.process_new_packets() {
                        // Tell the server why (the alert rustls queued), then fail.
                        let _ = self.push();
                        return Err(NodeFault::Tls(e.to_string()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(p),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_fault(e)),
            }
        }
    }

    /// Encrypts `buf` and sends it. Accepts what rustls's buffer takes (all of it in practice);
    /// `WouldBlock` only when the buffer is full and the socket too.
    pub fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.tls.writer().write(buf)?;
        self.push()?;
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    /// Decrypted bytes into `buf`, reading the socket when rustls has none: `Ok(0)` the server
    /// closed, `WouldBlock` nothing more until the next readable event.
    pub fn read(&mut self, buf: &mut [u8], reads: &Counter) -> io::Result<usize> {
        loop {
            match self.tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.drained && !self.peer_closed {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            reads.bump();
            let mut source = NoteShort {
                inner: &mut self.tcp,
                short: &mut self.drained,
            };
            match self.tls.read_tls(&mut source) {
                Ok(0) => return Ok(0),
                Ok(_) => {
                    let state = self.tls.process_new_packets();
                    // Key updates and alerts rustls wants to answer.
                    self.push()?;
                    state.map_err(tls_error)?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
