//! [`Lock`]: a held lock as plain data (resource, token, validity, extensions).

use std::fmt;
use std::time::{Duration, Instant};

use crate::config::MAX_TTL;
use crate::error::Error;
use crate::token::Token;

/// Bytes stored inline when short (no allocation for the usual resource names).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Bytes {
    Inline(u8, [u8; 46]),
    Heap(Box<[u8]>),
}

impl Bytes {
    fn new(b: &[u8]) -> Bytes {
        if b.len() <= 46 {
            let mut buf = [0; 46];
            buf[..b.len()].copy_from_slice(b);
            Bytes::Inline(b.len() as u8, buf)
        } else {
            Bytes::Heap(b.into())
        }
    }
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Inline(len, buf) => &buf[..usize::from(*len)],
            Bytes::Heap(b) => b,
        }
    }
}

/// A held lock: what was locked, with which token, and until when it is safe.
///
/// Plain data: it can be released or extended through any [`Client`](crate::Client) or [`Redlock`](crate::Redlock) on the same
/// servers. Dropping it does *not* release it (use [`LockGuard`](crate::LockGuard) for that).
#[derive(Clone, PartialEq, Eq)]
pub struct Lock {
    resource: Bytes,
    token: Token,
    valid_until: Instant,
    extensions: u32,
}

impl Lock {
    /// A lock known by its parts, e.g. a token printed by `redlock acquire` in another process.
    /// `validity` is how long it is believed valid from now.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty resource or a bad token.
    pub fn from_parts(resource: &[u8], token: &[u8], validity: Duration) -> Result<Lock, Error> {
        if resource.is_empty() {
            return Err(Error::Config("empty resource name".into()));
        }
        Ok(Lock {
            resource: Bytes::new(resource),
            token: Token::from_bytes(token)?,
            valid_until: Instant::now() + validity.min(MAX_TTL),
            extensions: 0,
        })
    }

    /// A lock just acquired.
    pub(crate) fn new(resource: &[u8], token: Token, valid_until: Instant) -> Lock {
        Lock {
            resource: Bytes::new(resource),
            token,
            valid_until,
            extensions: 0,
        }
    }

    /// The locked resource (the Redis key).
    pub fn resource(&self) -> &[u8] {
        self.resource.as_slice()
    }
    /// The token stored on the nodes.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// When the validity runs out.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
    /// The validity left now (zero once expired).
    pub fn validity(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
    /// True while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
    /// How often the lock was extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }

    pub(crate) fn set_state(&mut self, valid_until: Instant, extensions: u32) {
        self.valid_until = valid_until;
        self.extensions = extensions;
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &String::from_utf8_lossy(self.resource()))
            .field("token", &self.token)
            .field("validity", &self.validity())
            .field("extensions", &self.extensions)
            .finish()
    }
}
