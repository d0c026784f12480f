//! Node addresses: parsing `redis://` and `redis+unix://` URLs. Passwords never appear in `Debug`
//! or `Display` output, nor in error messages.
//!
//! Accepted forms:
//!
//! ```text
//! redis://[[username]:password@]host[:port][/db][?protocol=3]
//! rediss://[[username]:password@]host[:port][/db][?protocol=3&tls_ca=F&tls_cert=F&tls_key=F&tls_server_name=N]
//! redis+unix:///path/to.sock[?db=N&username=U&password=P&protocol=3]
//! unix:///path/to.sock[?...]
//! ```
//!
//! IPv6 hosts go in brackets (`redis://[::1]:6379`), and only they: a host with a `:` outside
//! brackets, or brackets around anything but an IPv6 address, is refused; user name and password may be
//! percent-encoded; the port defaults to 6379 and the database to 0.
//!
//! `rediss://` is TLS (it needs the crate's `tls` feature, checked when a client is built). Its
//! options ([`TlsParams`]): `tls_ca` a PEM file of the CA certificates to trust instead of the
//! system's; `tls_cert` and `tls_key` PEM files of a client certificate and its key, for
//! servers that ask for one (mutual TLS, `tls-auth-clients yes`); `tls_server_name` the name
//! the server's certificate must carry when it is not the host of the address (connecting by
//! IP address to a certificate made out to a name).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};

/// Where a node listens.
#[derive(Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// TCP: host name or IP literal (IPv6 without brackets), and port.
    Tcp {
        /// Host name or IP address.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// A Unix domain socket.
    Unix(PathBuf),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Endpoint::Tcp { host, port } => write!(f, "{host}:{port}"),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What tells two endpoints apart as servers, as far as can be told without DNS or any I/O
/// besides resolving a socket path that exists ([`Endpoint::server_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ServerKey {
    /// `localhost`, `127.0.0.1` or `::1`: this host's loopback, one server per port.
    Loopback(u16),
    /// Any other IP address (canonical form), and port.
    Ip(IpAddr, u16),
    /// A host name (lower case, without a trailing dot), and port.
    Name(String, u16),
    /// A Unix socket path (resolved when it exists, else normalised lexically).
    Unix(PathBuf),
}

impl Endpoint {
    /// What identifies the server behind this endpoint, so that two spellings of one server
    /// compare equal: host names compare without case and without a trailing dot; IP addresses
    /// in their canonical form (`::ffff:10.0.0.1` is `10.0.0.1`); `localhost`, `127.0.0.1` and
    /// `::1` are one loopback; a socket path is resolved (`std::fs::canonicalize`) when it
    /// exists, else normalised lexically (`/run//redis/./r.sock` is `/run/redis/r.sock`).
    ///
    /// Never asks DNS, so it cannot tell two names of one host apart (nor a TCP endpoint from a
    /// socket of the same server): the handshake's `run_id` check catches those.
    pub(crate) fn server_key(&self) -> ServerKey {
        match self {
            Endpoint::Tcp { host, port } => {
                let port = *port;
                let host = host.to_ascii_lowercase();
                let host = host.strip_suffix('.').unwrap_or(&host);
                match host.parse::<IpAddr>() {
                    Ok(ip) => match ip.to_canonical() {
                        IpAddr::V4(Ipv4Addr::LOCALHOST) | IpAddr::V6(Ipv6Addr::LOCALHOST) => {
                            ServerKey::Loopback(port)
                        }
                        ip => ServerKey::Ip(ip, port),
                    },
                    Err(_) if host == "localhost" => ServerKey::Loopback(port),
                    Err(_) => ServerKey::Name(host.to_owned(), port),
                }
            }
            Endpoint::Unix(path) => ServerKey::Unix(
                std::fs::canonicalize(path).unwrap_or_else(|_| lexically_normal(path)),
            ),
        }
    }
}

/// `path` without `.` components, repeated or trailing separators, and with each `..` taking
/// the component before it off (`..` at the root stays at the root).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A parsed node address: endpoint, credentials, database and protocol version.
#[derive(Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct NodeAddr {
    /// Where the node listens.
    pub endpoint: Endpoint,
    /// ACL user name, if any.
    pub username: Option<String>,
    password: Option<String>,
    /// Database number for `SELECT` (0: no `SELECT` is sent).
    pub db: u32,
    /// 2 (default) or 3 (`?protocol=3`: the handshake sends `HELLO 3`).
    pub protocol: u8,
    /// `Some` for `rediss://` (TLS), with the options of the address.
    pub tls: Option<TlsParams>,
}

/// The TLS options of one `rediss://` address (see the [module docs](self)). A `None` here takes
/// the [`Builder`](crate::Builder)'s setting, if any: `tls_ca` the system's trusted roots,
/// `tls_server_name` the address's host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TlsParams {
    /// PEM file of the CA certificates to trust (`tls_ca=`).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate chain (`tls_cert=`), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (`tls_key=`).
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must be valid for (`tls_server_name=`).
    pub server_name: Option<String>,
}

/// What is wrong with an address that cannot be parsed. Small, `Copy`, static messages; the
/// address itself (password masked) is quoted by whoever reports it: [`AddrError::quoting`]
/// (as [`Error::Config`](crate::Error::Config) does when a client is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddrError {
    /// No `scheme://` at the start.
    #[error("expected redis://host[:port] or redis+unix:///path")]
    NoScheme,
    /// A scheme other than `redis`, `rediss`, `redis+unix` and `unix`.
    #[error("unknown scheme (expected redis://, rediss://, redis+unix:// or unix://)")]
    UnknownScheme,
    /// A Unix socket address whose path does not start with `/`.
    #[error("a Unix socket address needs an absolute path")]
    RelativePath,
    /// Nothing between `://` and the port, database or query.
    #[error("missing host")]
    MissingHost,
    /// `[` of an IPv6 host without its `]`.
    #[error("unclosed '[' in IPv6 host")]
    UnclosedBracket,
    /// Something other than `:port` after an IPv6 host's `]`.
    #[error("expected ':' after ']'")]
    AfterBracket,
    /// A host with a `:` outside brackets (`redis://2001:db8::1`, `redis://::1`): which `:`
    /// starts the port cannot be told.
    #[error(
        "an IPv6 host goes in brackets (redis://[2001:db8::1]:6379), and a host name has no ':'"
    )]
    UnbracketedIpv6,
    /// Brackets around something that is not an IPv6 address (`redis://[example.com]:1`).
    #[error("the host in brackets is not an IPv6 address (brackets are for IPv6 hosts only)")]
    NotIpv6,
    /// The port is not a number from 1 to 65535.
    #[error("the port is not a number from 1 to 65535")]
    Port,
    /// The database is not a number from 0 to 2³² − 1.
    #[error("the database is not a number from 0 to 4294967295")]
    Database,
    /// `protocol=` is not `2`, `3`, `resp2` or `resp3`.
    #[error("the protocol is not 2 or 3")]
    Protocol,
    /// A `%` not followed by two hex digits, in this part.
    #[error("bad percent-encoding in the {0}")]
    PercentEncoding(AddrPart),
    /// This part is not UTF-8 once percent-decoded.
    #[error("the {0} is not UTF-8 after percent-decoding")]
    NotUtf8(AddrPart),
    /// A TLS option in a `redis://` (not `rediss://`) address.
    #[error("\"{0}\" is for rediss:// (TLS) addresses")]
    TlsOnly(AddrPart),
    /// A TLS option with an empty value.
    #[error("\"{0}\" needs a value")]
    Empty(AddrPart),
    /// `tls_cert` without `tls_key`, or the other way round.
    #[error("tls_cert and tls_key go together (a client certificate and its key)")]
    CertWithoutKey,
    /// A query parameter this crate does not know.
    #[error("unknown parameter")]
    UnknownParameter,
}

/// The part of an address an [`AddrError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddrPart {
    /// The ACL user name (`user:` or `username=`).
    UserName,
    /// The password (`:password@` or `password=`).
    Password,
    /// A Unix socket path.
    Path,
    /// `tls_ca=`.
    TlsCa,
    /// `tls_cert=`.
    TlsCert,
    /// `tls_key=`.
    TlsKey,
    /// `tls_server_name=`.
    TlsServerName,
}

impl fmt::Display for AddrPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddrPart::UserName => "user name",
            AddrPart::Password => "password",
            AddrPart::Path => "path",
            AddrPart::TlsCa => "tls_ca",
            AddrPart::TlsCert => "tls_cert",
            AddrPart::TlsKey => "tls_key",
            AddrPart::TlsServerName => "tls_server_name",
        })
    }
}

impl AddrError {
    /// The error with the address it is about, for a message: `invalid address "<address>":
    /// <what is wrong>`, the password masked.
    pub fn quoting(self, address: &str) -> impl fmt::Display + '_ {
        Quoting(self, address)
    }
}

struct Quoting<'a>(AddrError, &'a str);

impl fmt::Display for Quoting<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid address \"{}\": {}", redact(self.1), self.0)
    }
}

impl NodeAddr {
    /// Parses an address; see the [module docs](self) for the forms.
    ///
    /// # Errors
    ///
    /// [`AddrError`] saying what is wrong; [`AddrError::quoting`] quotes the address with it.
    ///
    /// # Examples
    ///
    /// ```
    /// use redlock_mux::NodeAddr;
    ///
    /// let node = NodeAddr::parse("redis://locker:secret@10.0.0.1:6380/2?protocol=3")?;
    /// assert_eq!(node.to_string(), "10.0.0.1:6380"); // never the password
    /// assert_eq!((node.username.as_deref(), node.db, node.protocol), (Some("locker"), 2, 3));
    /// assert!(NodeAddr::parse("redis://10.0.0.1:99999").is_err());
    /// # Ok::<(), redlock_mux::addr::AddrError>(())
    /// ```
    pub fn parse(address: &str) -> Result<NodeAddr, AddrError> {
        parse(address)
    }

    /// The password, if any (never printed by this crate).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// Sets or clears the password.
    pub fn set_password(&mut self, password: Option<String>) {
        self.password = password;
    }
}

impl std::str::FromStr for NodeAddr {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<NodeAddr, AddrError> {
        NodeAddr::parse(s)
    }
}

/// `host:port` (or `unix:/path`): how nodes are named in messages.
impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.endpoint, f)
    }
}

impl fmt::Debug for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeAddr")
            .field("endpoint", &self.endpoint)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("protocol", &self.protocol)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Masks the password part of an address for messages. An address is quoted because it is
/// wrong, so nothing here trusts its shape — a password may hold an unencoded `/`, `?`, `@`,
/// `&` or `,`, a parameter may be misspelt (`Password=`), a server list may be pasted into one
/// address, the scheme may be missing — and every reading is masked at once (masking too much
/// is harmless; a byte too few is a leaked password):
///
/// - everything between the scheme (or the start, when what precedes the first `://` is no
///   scheme) and the **last** `@` of the whole address, but a user name before the first `:`;
/// - after the first `?`, the value of every parameter, but those of `db` and `protocol` when
///   they are digits, and of `user`, `username` and `tls_*` when they hold no `@`, `,` or
///   white space; a piece without `=` (a value cut at an unencoded `&`) whole.
///
/// A run of masked bytes is written `***`.
///
/// ```
/// use redlock_mux::addr::redact;
///
/// assert_eq!(redact("redis://u:pass/word@h:1"), "redis://u:***@h:1");
/// assert_eq!(redact("rediss://h:1?password=pw&db=2"), "rediss://h:1?password=***&db=2");
/// ```
pub fn redact(address: &str) -> String {
    let bytes = address.as_bytes();
    let mut hidden = vec![false; bytes.len()];
    let scheme_end = address
        .find("://")
        .filter(|&i| {
            let scheme = &address[..i];
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
        })
        .map_or(0, |i| i + 3);
    // The user info, by the last `@`.
    if let Some(at) = address.rfind('@').filter(|&at| at >= scheme_end) {
        let from = address[scheme_end..at]
            .find(':')
            .map_or(scheme_end, |colon| scheme_end + colon + 1);
        hidden[from..at].iter_mut().for_each(|h| *h = true);
    }
    // The query's values, from the first `?`.
    if let Some(q) = address[scheme_end..].find('?').map(|q| scheme_end + q) {
        let mut start = q + 1;
        for param in address[q + 1..].split('&') {
            let end = start + param.len();
            let clean = |v: &str| !v.contains(|c: char| c == '@' || c == ',' || c.is_whitespace());
            let shown = match param.split_once('=') {
                Some(("db" | "protocol", v)) => {
                    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())
                }
                Some((
                    "user" | "username" | "tls_ca" | "tls_cert" | "tls_key" | "tls_server_name",
                    v,
                )) => clean(v),
                Some(_) => false,
                None => param.is_empty(),
            };
            if !shown {
                // The key stays readable (it names what is wrong); its value goes.
                let value = param.find('=').map_or(start, |e| start + e + 1);
                hidden[value..end].iter_mut().for_each(|h| *h = true);
            }
            start = end + 1;
        }
    }
    let mut out = String::with_capacity(address.len());
    let mut i = 0;
    while i < bytes.len() {
        let run = hidden[i..].iter().take_while(|&&h| h == hidden[i]).count();
        if hidden[i] {
            out.push_str("***");
        } else {
            out.push_str(&address[i..i + run]);
        }
        i += run;
    }
    out
}

fn percent_decode(s: &str, what: AddrPart) -> Result<String, AddrError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            // Two hex digits, not a sign: `from_str_radix` takes `%+f`.
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(AddrError::PercentEncoding(what))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| AddrError::NotUtf8(what))
}

/// A decimal number: digits only (`str::parse` takes a leading `+`).
fn digits<T: std::str::FromStr>(s: &str) -> Option<T> {
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_db(s: &str) -> Result<u32, AddrError> {
    digits(s).ok_or(AddrError::Database)
}

fn parse(address: &str) -> Result<NodeAddr, AddrError> {
    let (scheme, rest) = address.split_once("://").ok_or(AddrError::NoScheme)?;
    let (body, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut addr = match scheme {
        "redis" => parse_tcp(body)?,
        "rediss" => NodeAddr {
            tls: Some(TlsParams::default()),
            ..parse_tcp(body)?
        },
        "redis+unix" | "unix" => parse_unix(body)?,
        _ => return Err(AddrError::UnknownScheme),
    };
    for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        apply_parameter(&mut addr, key, value)?;
    }
    if let Some(tls) = &addr.tls
        && tls.cert_file.is_some() != tls.key_file.is_some()
    {
        return Err(AddrError::CertWithoutKey);
    }
    Ok(addr)
}

/// `redis+unix:///path/to/socket`: an absolute path.
fn parse_unix(body: &str) -> Result<NodeAddr, AddrError> {
    if body.is_empty() || !body.starts_with('/') {
        return Err(AddrError::RelativePath);
    }
    Ok(NodeAddr {
        endpoint: Endpoint::Unix(PathBuf::from(percent_decode(body, AddrPart::Path)?)),
        username: None,
        password: None,
        db: 0,
        protocol: 2,
        tls: None,
    })
}

/// One `key=value` of an address's query.
fn apply_parameter(addr: &mut NodeAddr, key: &str, value: &str) -> Result<(), AddrError> {
    match key {
        "db" => addr.db = parse_db(value)?,
        "password" => addr.password = Some(percent_decode(value, AddrPart::Password)?),
        "username" | "user" => addr.username = Some(percent_decode(value, AddrPart::UserName)?),
        "protocol" => {
            addr.protocol = match value {
                "2" | "resp2" => 2,
                "3" | "resp3" => 3,
                _ => return Err(AddrError::Protocol),
            }
        }
        "tls_ca" => tls_parameter(addr, AddrPart::TlsCa, value)?,
        "tls_cert" => tls_parameter(addr, AddrPart::TlsCert, value)?,
        "tls_key" => tls_parameter(addr, AddrPart::TlsKey, value)?,
        "tls_server_name" => tls_parameter(addr, AddrPart::TlsServerName, value)?,
        _ => return Err(AddrError::UnknownParameter),
    }
    Ok(())
}

/// A TLS option of a `rediss://` address (refused on any other), not empty.
fn tls_parameter(addr: &mut NodeAddr, part: AddrPart, value: &str) -> Result<(), AddrError> {
    let Some(tls) = addr.tls.as_mut() else {
        return Err(AddrError::TlsOnly(part));
    };
    let value = percent_decode(value, part)?;
    if value.is_empty() {
        return Err(AddrError::Empty(part));
    }
    match part {
        AddrPart::TlsCa => tls.ca_file = Some(value.into()),
        AddrPart::TlsCert => tls.cert_file = Some(value.into()),
        AddrPart::TlsKey => tls.key_file = Some(value.into()),
        _ => tls.server_name = Some(value),
    }
    Ok(())
}

/// The port of an address that gives none: Redis's own default.
const DEFAULT_PORT: u16 = 6379;

fn parse_tcp(body: &str) -> Result<NodeAddr, AddrError> {
    let (authority, path) = match body.find('/') {
        Some(slash) => (&body[..slash], &body[slash + 1..]),
        None => (body, ""),
    };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (username, password) = parse_userinfo(userinfo)?;
    let (host, port) = split_host_port(hostport)?;
    if host.is_empty() {
        return Err(AddrError::MissingHost);
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => digits::<u16>(p)
            .filter(|&p| p != 0)
            .ok_or(AddrError::Port)?,
    };
    let db = match path {
        "" => 0,
        p => parse_db(p)?,
    };
    Ok(NodeAddr {
        endpoint: Endpoint::Tcp {
            host: host.to_owned(),
            port,
        },
        username,
        password,
        db,
        protocol: 2,
        tls: None,
    })
}

/// `user:password`, `:password` or a lone `password` (as redis-cli reads it) before the `@`.
fn parse_userinfo(userinfo: Option<&str>) -> Result<(Option<String>, Option<String>), AddrError> {
    Ok(match userinfo {
        None => (None, None),
        Some(info) => match info.split_once(':') {
            Some((user, pass)) => (
                (!user.is_empty())
                    .then(|| percent_decode(user, AddrPart::UserName))
                    .transpose()?,
                Some(percent_decode(pass, AddrPart::Password)?),
            ),
            None => (None, Some(percent_decode(info, AddrPart::Password)?)),
        },
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`: the host and the port's text, if any.
fn split_host_port(hostport: &str) -> Result<(&str, Option<&str>), AddrError> {
    if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or(AddrError::UnclosedBracket)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(AddrError::AfterBracket)?),
        };
        if !host.is_empty() && host.parse::<Ipv6Addr>().is_err() {
            return Err(AddrError::NotIpv6);
        }
        return Ok((host, port));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (hostport, None),
    };
    // `2001:db8::1` would split into host `2001:db8:` and port 1.
    if host.contains(':') {
        return Err(AddrError::UnbracketedIpv6);
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn tcp_forms() {
        let a = NodeAddr::parse("redis://127.0.0.1").unwrap();
        assert_eq!(
            (a.endpoint.clone(), a.db, a.protocol),
            (tcp("127.0.0.1", 6379), 0, 2)
        );
        assert_eq!(a.to_string(), "127.0.0.1:6379");

        let a = NodeAddr::parse("redis://alice:s%40cret@example.com:7000/3?protocol=3").unwrap();
        assert_eq!(a.endpoint, tcp("example.com", 7000));
        assert_eq!(a.username.as_deref(), Some("alice"));
        assert_eq!(a.password(), Some("s@cret"));
        assert_eq!((a.db, a.protocol), (3, 3));

        let a = NodeAddr::parse("redis://:pw@[::1]:6380").unwrap();
        assert_eq!(a.endpoint, tcp("::1", 6380));
        assert_eq!(a.to_string(), "[::1]:6380");
        assert_eq!((a.username.as_deref(), a.password()), (None, Some("pw")));

        let a = NodeAddr::parse("redis://[::1]").unwrap();
        assert_eq!(a.endpoint, tcp("::1", 6379));
        let a = NodeAddr::parse("redis://[2001:db8::1]:7000/1").unwrap();
        assert_eq!((a.endpoint.clone(), a.db), (tcp("2001:db8::1", 7000), 1));
        assert_eq!(a.to_string(), "[2001:db8::1]:7000");
        let a = NodeAddr::parse("redis://[::ffff:10.0.0.1]").unwrap();
        assert_eq!(a.endpoint, tcp("::ffff:10.0.0.1", 6379));
        let a = NodeAddr::parse("redis://pw@h").unwrap();
        assert_eq!(a.password(), Some("pw"));
    }

    #[test]
    fn tls_forms() {
        let a = NodeAddr::parse("redis://h").unwrap();
        assert_eq!(a.tls, None);
        let a = NodeAddr::parse("rediss://u:pw@h:6380/2").unwrap();
        assert_eq!(a.endpoint, tcp("h", 6380));
        assert_eq!((a.db, a.password()), (2, Some("pw")));
        assert_eq!(a.tls, Some(TlsParams::default()));
        let a = NodeAddr::parse(
            "rediss://10.0.0.1?tls_ca=/etc/ca%20dir/ca.pem&tls_cert=/c.pem&tls_key=/k.pem\
             &tls_server_name=redis.internal",
        )
        .unwrap();
        let tls = a.tls.unwrap();
        assert_eq!(
            tls.ca_file.as_deref(),
            Some(Path::new("/etc/ca dir/ca.pem"))
        );
        assert_eq!(tls.cert_file.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(tls.key_file.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(tls.server_name.as_deref(), Some("redis.internal"));
    }

    #[test]
    fn unix_forms() {
        for s in [
            "redis+unix:///tmp/r.sock?db=2&password=x",
            "unix:///tmp/r.sock?db=2&password=x",
        ] {
            let a = NodeAddr::parse(s).unwrap();
            assert_eq!(a.endpoint, Endpoint::Unix("/tmp/r.sock".into()));
            assert_eq!((a.db, a.password()), (2, Some("x")));
            assert_eq!(a.to_string(), "unix:/tmp/r.sock");
        }
    }

    #[test]
    fn errors_quote_the_address_without_its_password() {
        use AddrError as E;
        let cases = [
            ("localhost:6379", E::NoScheme, "expected redis://"),
            ("http://x", E::UnknownScheme, "unknown scheme"),
            (
                "redis://h?tls_ca=/x.pem",
                E::TlsOnly(AddrPart::TlsCa),
                "for rediss://",
            ),
            (
                "rediss://h?tls_cert=/c.pem",
                E::CertWithoutKey,
                "go together",
            ),
            (
                "rediss://h?tls_ca=",
                E::Empty(AddrPart::TlsCa),
                "needs a value",
            ),
            ("redis://", E::MissingHost, "missing host"),
            (
                "redis://u:topsecret@h:notaport",
                E::Port,
                "h:notaport\": the port",
            ),
            ("redis://h:0", E::Port, "port is not"),
            ("redis://h:70000", E::Port, "h:70000\": the port"),
            ("redis://h/abc", E::Database, "h/abc\": the database"),
            // Digits only: no sign.
            ("redis://h:+6379", E::Port, "the port"),
            ("redis://h/+3", E::Database, "the database"),
            ("redis://h?db=+3", E::Database, "the database"),
            (
                "redis://u:a%+fb@h",
                E::PercentEncoding(AddrPart::Password),
                "percent-encoding",
            ),
            ("redis://[::1", E::UnclosedBracket, "unclosed"),
            ("redis://[::1]x", E::AfterBracket, "after ']'"),
            // IPv6 without brackets: the last ':' is not the port's.
            (
                "redis://2001:db8::1",
                E::UnbracketedIpv6,
                "goes in brackets",
            ),
            ("redis://::1", E::UnbracketedIpv6, "goes in brackets"),
            (
                "redis://u:topsecret@::1:6379",
                E::UnbracketedIpv6,
                "brackets",
            ),
            ("rediss://fe80::1:7000/2", E::UnbracketedIpv6, "brackets"),
            ("redis://h:1:2", E::UnbracketedIpv6, "no ':'"),
            // Brackets hold an IPv6 address, nothing else.
            ("redis://[example.com]:1", E::NotIpv6, "not an IPv6 address"),
            ("redis://[10.0.0.1]", E::NotIpv6, "not an IPv6 address"),
            ("redis://[::1::2]:1", E::NotIpv6, "not an IPv6 address"),
            ("redis://[:]:1", E::NotIpv6, "not an IPv6 address"),
            ("redis://[]:1", E::MissingHost, "missing host"),
            (
                "redis://h?protocol=4",
                E::Protocol,
                "protocol=4\": the protocol",
            ),
            (
                "redis://h?colour=red",
                E::UnknownParameter,
                "colour=***\": unknown parameter",
            ),
            ("redis+unix://relative", E::RelativePath, "absolute path"),
            (
                "redis://u:top%zzsecret@h",
                E::PercentEncoding(AddrPart::Password),
                "percent-encoding in the password",
            ),
            ("redis://%ff@h", E::NotUtf8(AddrPart::Password), "not UTF-8"),
            (
                "unix:///s?password=topsecret&db=x",
                E::Database,
                "db=***\": the database",
            ),
        ];
        for (input, error, needle) in cases {
            let e = NodeAddr::parse(input).unwrap_err();
            assert_eq!(e, error, "{input}");
            let message = e.quoting(input).to_string();
            assert!(message.contains(needle), "{input}: {message}");
            assert!(message.starts_with("invalid address \""), "{message}");
            assert!(!message.contains("topsecret"), "{message}");
        }
    }

    fn key(address: &str) -> ServerKey {
        NodeAddr::parse(address).unwrap().endpoint.server_key()
    }

    #[test]
    fn spellings_of_one_server_have_one_key() {
        let loopback = [
            "redis://127.0.0.1:7701",
            "redis://localhost:7701",
            "redis://LocalHost.:7701",
            "redis://[::1]:7701",
            "redis://[0:0:0:0:0:0:0:1]:7701",
            "redis://[::ffff:127.0.0.1]:7701",
            // The same endpoint with another database, user or protocol: the same server.
            "redis://alice:pw@localhost:7701/3?protocol=3",
        ];
        for address in loopback {
            assert_eq!(key(address), ServerKey::Loopback(7701), "{address}");
        }
        assert_eq!(
            key("redis://Redis-1.Example.COM."),
            key("redis://redis-1.example.com:6379")
        );
        assert_eq!(key("redis://[::ffff:10.0.0.1]"), key("redis://10.0.0.1"));
        assert_eq!(key("redis://[2001:DB8::1]"), key("redis://[2001:db8:0::1]"));
        assert_eq!(
            key("unix:///nonexistent//redis/./sub/../r.sock/?db=1"),
            key("redis+unix:///nonexistent/redis/r.sock")
        );
        assert_eq!(
            key("unix:///../nonexistent/r.sock"),
            key("unix:///nonexistent/r.sock")
        );
    }

    #[test]
    fn different_servers_have_different_keys() {
        let distinct = [
            "redis://127.0.0.1:7701",
            "redis://127.0.0.1:7702",
            "redis://127.0.0.2:7701",
            "redis://10.0.0.1:7701",
            "redis://localhost2:7701",
            "redis://example.com:7701",
            "redis://[2001:db8::1]:7701",
            "unix:///nonexistent/a.sock",
            "unix:///nonexistent/b.sock",
        ];
        for (i, a) in distinct.iter().enumerate() {
            for b in &distinct[i + 1..] {
                assert_ne!(key(a), key(b), "{a} and {b}");
            }
        }
    }

    #[test]
    fn an_existing_socket_path_is_resolved() {
        let dir = std::env::temp_dir().join(format!("redlock-addr-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("real")).unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(dir.join("real"), &link).unwrap();
        std::fs::write(dir.join("real/r.sock"), b"").unwrap();
        let via_link = format!("unix://{}", link.join("r.sock").display());
        let direct = format!("unix://{}", dir.join("real/r.sock").display());
        let same = key(&via_link) == key(&direct);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(same, "{via_link} and {direct}");
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let a = NodeAddr::parse("redis://u:topsecret@h:1").unwrap();
        assert!(!format!("{a:?}").contains("topsecret"));
        assert!(!format!("{a}").contains("topsecret"));
        assert!(format!("{a:?}").contains("<redacted>"));
    }

    #[test]
    fn a_quoted_address_never_shows_its_password_whatever_it_holds() {
        // Each is wrong (that is why it is quoted), and its password holds a byte the
        // parser splits at, or the scheme is missing.
        for (address, secret) in [
            ("redis://:Zm9v/YmFy@10.0.0.1:6379", "Zm9v/YmFy"),
            ("u:s3cret@h:6379", "s3cret"),
            ("redis://u:se?cret@h", "se?cret"),
            ("redis://u:a@b@h:99999", "a@b"),
            ("redis://h:99999?password=x@y&db=1", "x@y"),
            ("redis://h?db=x&password=hunter2", "hunter2"),
            ("redis://h:1?password=ab&cd", "cd"),
            ("redis://h:1?Password=hunter2", "hunter2"),
            ("u:pw1@h:1?tls_ca=file:///ca", "pw1"),
            ("u:ab://cd@h", "ab"),
            ("redis://h:99999?password=x@y&db=1", "y"),
            ("redis://h1:6379?db=0,redis://:s3cret@h2:6379", "s3cret"),
            ("redis://:p?db=1@h", "p?db"),
            ("redis://u:a?b@h:1?password=hunter2", "hunter2"),
            ("redis://:aB3?kd=Q9@h:1", "aB3"),
            ("redis://u:p@zq?w@h", "zq"),
        ] {
            let e = NodeAddr::parse(address).expect_err(address);
            let text = e.quoting(address).to_string();
            assert!(!text.contains(secret), "{text}");
            assert!(text.contains("***"), "{text}");
        }
        // What is not a secret stays readable.
        assert_eq!(
            redact("redis://u:pw@h:1/2?db=3"),
            "redis://u:***@h:1/2?db=3"
        );
        assert_eq!(
            redact("redis://h:1?password=pw&db=3"),
            "redis://h:1?password=***&db=3"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("h:1"), "h:1");
    }
}
