//! Talking to a server over raw TCP, without a client library: `PING`, one reply line, RESP
//! command encoding (`*<n>\r\n$<len>\r\n<arg>\r\n…`), and the readiness probe.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// How long the readiness probe waits to connect and for each read.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Sends `PING` over a fresh raw TCP connection to `addr` (`host:port`) and returns whatever
/// arrives within `timeout`.
///
/// # Errors
///
/// Connecting or reading failed; of kind `WouldBlock`/`TimedOut` (see [`is_timeout`]) if
/// nothing arrived in time.
///
/// # Panics
///
/// If `addr` is not a socket address.
pub fn raw_ping(addr: &str, timeout: Duration) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().expect("bad addr"), timeout)?;
    raw_ping_on(&mut s, timeout)
}

/// Sends `PING` on an existing stream and reads one reply line within `timeout`.
///
/// # Errors
///
/// As [`raw_ping`].
pub fn raw_ping_on(s: &mut TcpStream, timeout: Duration) -> io::Result<String> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(b"PING\r\n")?;
    read_line(s)
}

/// Reads until `\n` (or EOF) from a stream whose read timeout is set.
///
/// # Errors
///
/// What the read said.
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

/// True if the error is a read or write timeout (`WouldBlock` on Linux), or an interrupted call.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// The RESP array of bulk strings that sends a command: `*<n>\r\n` then `$<len>\r\n<arg>\r\n`
/// for each argument.
pub fn resp_encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend(a.as_bytes());
        out.extend(b"\r\n");
    }
    out
}

/// What one readiness probe saw.
pub(crate) struct Probe {
    /// Some reply was `+PONG`.
    pub pong: bool,
    /// `process_id` from `INFO server`.
    pub pid: Option<u32>,
    /// The first line of the replies, for error messages.
    pub first_line: String,
}

/// One readiness probe: `[AUTH …] PING` plus `INFO server`, whose `process_id` tells whether the
/// server answering on `addr` is really the one we started (and not another that holds the port
/// while ours is about to fail with "address in use").
pub(crate) fn probe(addr: SocketAddr, auth: Option<&[&str]>) -> io::Result<Probe> {
    let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    s.set_read_timeout(Some(PROBE_TIMEOUT))?;
    s.set_write_timeout(Some(PROBE_TIMEOUT))?;
    let mut req = Vec::new();
    let mut expected = 2;
    if let Some(auth) = auth {
        req.extend(resp_encode(auth));
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
    let text = String::from_utf8_lossy(&buf);
    Ok(Probe {
        pong: text.contains("+PONG\r\n"),
        pid: text
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok()),
        first_line: text.lines().next().unwrap_or_default().to_owned(),
    })
}

/// How many complete RESP2 replies (simple, error and integer lines, and bulk strings: what
/// `PING`, `AUTH` and `INFO` return) `buf` holds.
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
            let len: Option<usize> = std::str::from_utf8(&header[1..])
                .ok()
                .and_then(|n| n.parse().ok());
            // `$-1` (null) has no body; a length too large to add to is never complete.
            if let Some(len) = len {
                match len.checked_add(2) {
                    Some(need) if rest.len() >= need => rest = &rest[need..],
                    _ => return count,
                }
            }
        }
        count += 1;
    }
}
