//! Node addresses: parsing `redis://` and `redis+unix://` URLs. Passwords never appear in `Debug`
//! or `Display` output, nor in error messages.
//!
//! Accepted forms:
//!
//! ```text
//! redis://[[username]:password@]host[:port][/db][?protocol=3]
//! redis+unix:///path/to.sock[?db=N&username=U&password=P&protocol=3]
//! unix:///path/to.sock[?...]
//! ```
//!
//! IPv6 hosts go in brackets (`redis://[::1]:6379`); user name and password may be
//! percent-encoded; the port defaults to 6379 and the database to 0.

use std::fmt;
use std::path::PathBuf;

/// Where a node listens.
#[derive(Clone, PartialEq, Eq, Hash)]
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

/// A parsed node address: endpoint, credentials, database and protocol version.
#[derive(Clone, PartialEq, Eq, Hash)]
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
}

/// An address that cannot be parsed: which one (password masked) and what is wrong with it.
/// Its own type so that this module depends on nothing else of the crate; a `?` turns it into
/// [`Error::Config`](crate::Error::Config).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {0}")]
pub struct AddrError(String);

impl NodeAddr {
    /// Parses an address; see the [module docs](self) for the forms.
    ///
    /// # Errors
    ///
    /// [`AddrError`] quoting the address (password masked) and saying what is wrong; it
    /// converts into [`Error::Config`](crate::Error::Config).
    pub fn parse(address: &str) -> Result<NodeAddr, AddrError> {
        parse(address).map_err(|why| AddrError(format!("\"{}\": {why}", redact(address))))
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
            .finish()
    }
}

/// Masks the password part of an address for messages.
fn redact(address: &str) -> String {
    let Some(scheme_end) = address.find("://") else {
        return address.to_owned();
    };
    let rest = &address[scheme_end + 3..];
    let mut out = address[..scheme_end + 3].to_owned();
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str("***"),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    // Query parameters may carry a password too.
    match tail.find('?') {
        Some(q) => {
            out.push_str(&tail[..=q]);
            let params: Vec<String> = tail[q + 1..]
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some(("password", _)) => "password=***".to_owned(),
                    _ => p.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(tail),
    }
    out
}

fn percent_decode(s: &str, what: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in the {what}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the {what} is not UTF-8 after percent-decoding"))
}

fn parse_db(s: &str) -> Result<u32, String> {
    s.parse()
        .map_err(|_| format!("database \"{s}\" is not a number from 0 to 4294967295"))
}

fn parse(address: &str) -> Result<NodeAddr, String> {
    let (scheme, rest) = address
        .split_once("://")
        .ok_or("expected redis://host[:port] or redis+unix:///path")?;
    let (body, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut addr = match scheme {
        "redis" => parse_tcp(body)?,
        "redis+unix" | "unix" => {
            if body.is_empty() || !body.starts_with('/') {
                return Err("a Unix socket address needs an absolute path".into());
            }
            NodeAddr {
                endpoint: Endpoint::Unix(PathBuf::from(percent_decode(body, "path")?)),
                username: None,
                password: None,
                db: 0,
                protocol: 2,
            }
        }
        "rediss" => return Err("TLS (rediss://) is not supported".into()),
        other => return Err(format!("unknown scheme \"{other}\"")),
    };
    for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match key {
            "db" => addr.db = parse_db(value)?,
            "password" => addr.password = Some(percent_decode(value, "password")?),
            "username" | "user" => addr.username = Some(percent_decode(value, "user name")?),
            "protocol" => {
                addr.protocol = match value {
                    "2" | "resp2" => 2,
                    "3" | "resp3" => 3,
                    _ => return Err(format!("protocol \"{value}\" is not 2 or 3")),
                }
            }
            other => return Err(format!("unknown parameter \"{other}\"")),
        }
    }
    Ok(addr)
}

fn parse_tcp(body: &str) -> Result<NodeAddr, String> {
    let (authority, path) = match body.find('/') {
        Some(slash) => (&body[..slash], &body[slash + 1..]),
        None => (body, ""),
    };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => match info.split_once(':') {
            Some((user, pass)) => (
                (!user.is_empty())
                    .then(|| percent_decode(user, "user name"))
                    .transpose()?,
                Some(percent_decode(pass, "password")?),
            ),
            // redis://secret@host: a lone userinfo is the password, as redis-cli reads it.
            None => (None, Some(percent_decode(info, "password")?)),
        },
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("unclosed '[' in IPv6 host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected ':' after ']'")?),
        };
        (host, port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("missing host".into());
    }
    let port = match port {
        None => 6379,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("port \"{p}\" is not a number from 1 to 65535"))?,
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
    })
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
        let a = NodeAddr::parse("redis://pw@h").unwrap();
        assert_eq!(a.password(), Some("pw"));
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
        let cases = [
            ("localhost:6379", "expected redis://"),
            ("http://x", "unknown scheme \"http\""),
            ("rediss://x", "TLS"),
            ("redis://", "missing host"),
            ("redis://u:topsecret@h:notaport", "port \"notaport\""),
            ("redis://h:0", "port \"0\""),
            ("redis://h:70000", "port \"70000\""),
            ("redis://h/abc", "database \"abc\""),
            ("redis://[::1", "unclosed"),
            ("redis://h?protocol=4", "protocol \"4\""),
            ("redis://h?colour=red", "unknown parameter"),
            ("redis+unix://relative", "absolute path"),
            ("redis://u:top%zzsecret@h", "percent-encoding"),
            ("unix:///s?password=topsecret&db=x", "database \"x\""),
        ];
        for (input, needle) in cases {
            let message = NodeAddr::parse(input).unwrap_err().to_string();
            assert!(message.contains(needle), "{input}: {message}");
            assert!(message.contains("invalid address"), "{message}");
            assert!(!message.contains("topsecret"), "{message}");
        }
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let a = NodeAddr::parse("redis://u:topsecret@h:1").unwrap();
        assert!(!format!("{a:?}").contains("topsecret"));
        assert!(!format!("{a}").contains("topsecret"));
        assert!(format!("{a:?}").contains("<redacted>"));
    }
}
