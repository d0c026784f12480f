//! The TLS half of a `rediss://` connection's socket (the `tls` feature).
//!
//! rustls is sans-IO like the rest of this crate: it never touches the socket. [`TlsStream`]
//! moves bytes between the non-blocking `mio` socket and rustls (`read_tls` →
//! `process_new_packets` → plaintext, and plaintext → `write_tls`), the way rustls's own
//! `tlsclient-mio` example does, so a TLS node lives in the same event loop as a plain one.
//! Its settings, one [`Connector`](crate::model::tls::Connector) per node, are `model/tls.rs`.

use std::io::{self, Read, Write};

use mio::net::TcpStream;
use rustls::{ClientConnection, HandshakeKind};

use crate::model::error::NodeFault;
use crate::model::stats::Counter;

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
                // failure (permanent), it made `lock` give up at once; a
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
