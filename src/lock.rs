//! [`Lock`]: a held lock as plain data (resource, token, validity, extensions).

use std::fmt;
use std::time::{Duration, Instant};

use crate::config::MAX_TTL;
use crate::error::Error;
use crate::request::Grant;
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
    fence: Option<u64>,
}

impl Lock {
    /// A lock known by its parts, e.g. a token printed by `redlock acquire` in another process.
    /// `validity` is how long it is believed valid from now.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty resource or a bad token.
    pub fn from_parts(
        resource: impl AsRef<[u8]>,
        token: impl AsRef<[u8]>,
        validity: Duration,
    ) -> Result<Lock, Error> {
        let (resource, token) = (resource.as_ref(), token.as_ref());
        if resource.is_empty() {
            return Err(Error::Config("empty resource name".into()));
        }
        Ok(Lock {
            resource: Bytes::new(resource),
            token: Token::from_bytes(token)?,
            valid_until: Instant::now() + validity.min(MAX_TTL),
            extensions: 0,
            fence: None,
        })
    }

    /// The same lock with its fence, e.g. `REDLOCK_FENCE` as `redlock run` exported it: for a
    /// lock rebuilt from its parts in another process.
    pub fn with_fence(mut self, fence: u64) -> Lock {
        self.fence = Some(fence);
        self
    }

    /// A lock just acquired.
    pub(crate) fn new(resource: &[u8], token: Token, valid_until: Instant) -> Lock {
        Lock {
            resource: Bytes::new(resource),
            token,
            valid_until,
            extensions: 0,
            fence: None,
        }
    }

    /// A lock just acquired, as its grant says.
    pub(crate) fn granted(resource: &[u8], token: Token, grant: Grant) -> Lock {
        Lock {
            fence: grant.fence,
            ..Lock::new(resource, token, grant.valid_until)
        }
    }

    /// The locked resource (the Redis key): bytes (it derefs to `[u8]`) with a readable
    /// `Debug`.
    pub fn resource(&self) -> &Resource {
        Resource::new(self.resource.as_slice())
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
    /// The fencing token of this acquisition ([`Config::fencing`](crate::Config::fencing)):
    /// greater than the fence of every acquisition that completed before this one began, on
    /// any resource, by any client of this crate on the same servers. Pass it to the resource
    /// the lock protects, which refuses anything with a fence lower than the highest it has
    /// seen. `None` for a lock acquired without fencing.
    pub fn fence(&self) -> Option<u64> {
        self.fence
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
            .field("resource", &self.resource())
            .field("token", &self.token)
            .field("validity", &self.validity())
            .field("extensions", &self.extensions)
            .field("fence", &self.fence)
            .finish()
    }
}

/// A resource name: the bytes of a Redis key. Derefs to `[u8]`; `Debug` shows it as a string,
/// with bytes that are not printable ASCII escaped (`"orders:42"`, `"blob\\xff"`), and `Display`
/// as text (invalid UTF-8 replaced).
#[repr(transparent)]
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource([u8]);

impl Resource {
    /// The name as a `Resource`.
    pub fn new(bytes: &[u8]) -> &Resource {
        // SAFETY: `Resource` is `repr(transparent)` over `[u8]`: same layout, same metadata
        // (the length), so the pointer cast keeps both (as `std::path::Path` does over
        // `OsStr`).
        unsafe { &*(bytes as *const [u8] as *const Resource) }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for Resource {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Resource {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl PartialEq<[u8]> for Resource {
    fn eq(&self, other: &[u8]) -> bool {
        &self.0 == other
    }
}

impl PartialEq<&[u8]> for Resource {
    fn eq(&self, other: &&[u8]) -> bool {
        &self.0 == *other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Resource {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.0 == other[..]
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for Resource {
    fn eq(&self, other: &&[u8; N]) -> bool {
        self.0 == other[..]
    }
}

impl PartialEq<str> for Resource {
    fn eq(&self, other: &str) -> bool {
        &self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for Resource {
    fn eq(&self, other: &&str) -> bool {
        &self.0 == other.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_reads_as_text_and_compares_as_bytes() {
        let lock = Lock::from_parts("orders:42", [b'a'; 16], Duration::from_secs(1)).unwrap();
        assert_eq!(format!("{:?}", lock.resource()), "\"orders:42\"");
        assert_eq!(lock.resource().to_string(), "orders:42");
        assert!(lock.resource() == b"orders:42");
        assert!(*lock.resource() == *"orders:42");
        let odd = Resource::new(b"a\"b\xff\n");
        assert_eq!(format!("{odd:?}"), "\"a\\\"b\\xff\\n\"");
        assert!(format!("{lock:?}").contains("resource: \"orders:42\""));
        let bytes: &[u8] = lock.resource();
        assert_eq!(bytes, b"orders:42");
    }
}
