//! The server list: `--server` or `$REDLOCK_SERVERS`, a list written the wrong way recognised
//! (and the right way shown, passwords masked), and the builder it starts.

use redlock_mux::Builder;
use redlock_mux::addr::redact;

use crate::fail::{Fail, exit};
use crate::options::{Servers, Tuning};
use crate::text::shorten;
use std::time::Duration;

impl Servers {
    /// A builder for the servers given ([`list`](Servers::list)) with the TLS options, this TTL
    /// and the [`Tuning`] options: where `run`, `acquire` and `extend` start.
    pub fn tuned(&self, tuning: &Tuning, ttl: Duration) -> Result<Builder, Fail> {
        Ok(tuning.builder(self.builder(&self.list()?), ttl))
    }

    /// A builder for these URLs with the TLS options.
    pub fn builder(&self, urls: &[String]) -> Builder {
        let mut b = Builder::new(urls);
        if let Some(ca) = &self.tls_ca {
            b = b.tls_ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            b = b.tls_client_cert(cert, key);
        }
        if let Some(name) = &self.tls_server_name {
            b = b.tls_server_name(name);
        }
        b
    }

    /// The server URLs: `--server`, else `$REDLOCK_SERVERS`; a list written the wrong way
    /// (`-s a,b`, space-separated) is recognised and the right way shown.
    pub fn list(&self) -> Result<Vec<String>, Fail> {
        if !self.servers.is_empty() {
            for s in &self.servers {
                let parts = split_urls(s, |c| c == ',' || c.is_whitespace());
                if parts.len() > 1 {
                    return Err(Fail::new(
                        exit::USAGE,
                        format!(
                            "--server takes one URL, and {} holds {}: write {}",
                            shorten(&redact(s), URL_SHOWN),
                            parts.len(),
                            each_on_its_own(&parts, "--server ", " ")
                        ),
                    ));
                }
            }
            return Ok(self.servers.clone());
        }
        let env = std::env::var("REDLOCK_SERVERS").unwrap_or_default();
        let spaced = split_urls(&env, char::is_whitespace);
        if spaced.len() > 1 && !env.contains(',') {
            return Err(Fail::new(
                exit::USAGE,
                format!(
                    "REDLOCK_SERVERS is comma separated: write REDLOCK_SERVERS={}",
                    each_on_its_own(&spaced, "", ",")
                ),
            ));
        }
        let list: Vec<String> = env
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if list.is_empty() {
            return Err(Fail::new(
                exit::USAGE,
                "no servers given: use --server URL (once per Redis master) or set \
                 REDLOCK_SERVERS=URL,URL,...",
            ));
        }
        Ok(list)
    }
}

/// The pieces of a server list written the wrong way, as they should be written, each masked —
/// or, when a piece is no address (a password holding the separator was cut in two, and half
/// of it would show), words saying how.
fn each_on_its_own(parts: &[String], before: &str, sep: &str) -> String {
    if parts
        .iter()
        .all(|p| redlock_mux::NodeAddr::parse(p).is_ok())
    {
        parts
            .iter()
            .map(|p| format!("{before}{}", redact(p)))
            .collect::<Vec<_>>()
            .join(sep)
    } else {
        "each URL on its own (percent-encode a , or space in a password: %2C, %20)".into()
    }
}

/// The pieces of `s` split at `sep`, when at least two of them are URLs (`scheme://…`).
fn split_urls(s: &str, sep: impl Fn(char) -> bool) -> Vec<String> {
    let parts: Vec<String> = s
        .split(sep)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    if parts.iter().filter(|p| p.contains("://")).count() >= 2 {
        parts
    } else {
        Vec::new()
    }
}

/// How much of a `--server` value a message quotes: a URL with a user, password and options
/// fits; a whole list pasted into one `--server` is cut.
const URL_SHOWN: usize = 80;
