//! The lock token: unique per acquisition, stored on the nodes as the lock's value.

use std::fmt;

use rand::TryRng;

use crate::model::error::Error;

/// Length of a token made by this crate: 20 random bytes in unpadded base64url.
pub const TOKEN_LEN: usize = 27;
/// Longest token accepted from elsewhere ([`Lock::from_parts`](crate::Lock::from_parts)).
pub const MAX_TOKEN_LEN: usize = 64;
/// Random bytes in a generated token: 160 bits, unguessable and unique in practice; they
/// encode to [`TOKEN_LEN`] characters.
pub(crate) const RANDOM_BYTES: usize = 20;

/// The bytes that all variants of one token share ([`Token::variant`] changes the last four):
/// a set's release by [`Token::family`] deletes every member its acquisition set. 23: the
/// scripts compare this length (`SET_RELEASE_BODY`, `SET_STEP_BODY`).
pub(crate) const FAMILY_LEN: usize = TOKEN_LEN - 4;

/// The first character of an all-or-none lock's token ([`Token::for_resource`]): not in the
/// base64url alphabet of the others, so no other token this crate makes starts with it.
const SET_MARK: u8 = b'.';
/// Characters of the set's digest in its token: 48 bits, which tells sets apart by accident
/// one time in 2⁴⁸.
const SET_DIGEST_LEN: usize = 8;

/// The first 6 bytes of the SHA-1 of a set's encoding, in base64url.
fn set_digest(resource: &[u8]) -> [u8; SET_DIGEST_LEN] {
    use sha1::{Digest, Sha1};
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let digest = Sha1::digest(resource);
    let mut out = [0u8; SET_DIGEST_LEN];
    for (i, chunk) in digest[..6].chunks(3).enumerate() {
        let n = u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]);
        for k in 0..4 {
            out[4 * i + k] = ALPHABET[((n >> (18 - 6 * k)) & 63) as usize];
        }
    }
    out
}

/// The byte between a lock's token and its owner in the value a node holds
/// ([`Config::owner`](crate::Config::owner)): `<token> <owner>`. Never in a token this crate
/// makes (base64url, or `.` for a set's), so a release or extend by a token, which deletes or
/// extends the key only when its value is the token or starts with the token and this byte,
/// can never match another acquisition's lock.
pub const OWNER_SEPARATOR: u8 = b' ';
/// Longest owner ([`Config::owner`](crate::Config::owner)), in bytes.
pub const MAX_OWNER_LEN: usize = 128;
/// Longest value a lock key holds: a token, the separator, an owner.
pub(crate) const MAX_VALUE_LEN: usize = MAX_TOKEN_LEN + 1 + MAX_OWNER_LEN;

/// The value an acquire writes: the token alone, or `<token> <owner>` in `buf`.
pub(crate) fn lock_value<'a>(
    token: &'a [u8],
    owner: Option<&[u8]>,
    buf: &'a mut [u8; MAX_VALUE_LEN],
) -> &'a [u8] {
    let Some(owner) = owner else { return token };
    let n = token.len();
    let owner = &owner[..owner.len().min(MAX_OWNER_LEN)];
    buf[..n].copy_from_slice(token);
    buf[n] = OWNER_SEPARATOR;
    buf[n + 1..n + 1 + owner.len()].copy_from_slice(owner);
    &buf[..n + 1 + owner.len()]
}

/// Whether `b` is in the base64url alphabet of the tokens this crate makes.
fn is_base64url(b: &u8) -> bool {
    b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_'
}

/// Whether a lock key's `value` is `token`'s: the token itself, or the token, the separator
/// and an owner — as the scripts test it (`holds_token!` in `proto/scripts.rs`).
#[cfg(any(test, feature = "sim"))]
pub(crate) fn holds_token(value: &[u8], token: &[u8]) -> bool {
    value == token
        || (value.len() > token.len()
            && value.starts_with(token)
            && value[token.len()] == OWNER_SEPARATOR)
}

/// The token and the owner in a lock key's value as a node holds it
/// ([`NodeStatus::state`](crate::NodeStatus::state)): `<token> <owner>` when an acquire of a
/// handle with an owner ([`Config::owner`](crate::Config::owner)) wrote it — a token shaped as
/// this crate makes them ([`TOKEN_LEN`] characters of base64url, a set's starting with `.`),
/// [`OWNER_SEPARATOR`], an owner of 1 to [`MAX_OWNER_LEN`] bytes — else the whole value and
/// `None` (no owner, or a value of another shape: another client's).
///
/// ```
/// use redlock_mux::split_value;
/// let (token, owner) = split_value(b"kP3v7o0fZQm1nB2cD4eF6gH8iJ0 billing-7:4242:nightly");
/// assert_eq!(token, b"kP3v7o0fZQm1nB2cD4eF6gH8iJ0");
/// assert_eq!(owner, Some(&b"billing-7:4242:nightly"[..]));
/// assert_eq!(split_value(b"someone else's value"), (&b"someone else's value"[..], None));
/// ```
pub fn split_value(value: &[u8]) -> (&[u8], Option<&[u8]>) {
    let owner_len = value.len().saturating_sub(TOKEN_LEN + 1);
    match value.split_at_checked(TOKEN_LEN) {
        Some((token, rest))
            if rest.first() == Some(&OWNER_SEPARATOR)
                && (1..=MAX_OWNER_LEN).contains(&owner_len)
                && (token[0] == SET_MARK || is_base64url(&token[0]))
                && token[1..].iter().all(is_base64url) =>
        {
            (token, Some(&rest[1..]))
        }
        _ => (value, None),
    }
}

/// A lock token: unique per acquisition, the lock's signature on every node.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    len: u8,
    bytes: [u8; MAX_TOKEN_LEN],
}

impl Token {
    /// No token (status reads carry none).
    pub(crate) const EMPTY: Token = Token {
        len: 0,
        bytes: [0; MAX_TOKEN_LEN],
    };

    /// 20 bytes from the operating system's random source, in unpadded base64url (27 bytes).
    ///
    /// # Errors
    ///
    /// [`Error::System`] if the operating system's random source fails.
    pub fn generate() -> Result<Token, Error> {
        let mut raw = [0u8; RANDOM_BYTES];
        rand::rngs::SysRng
            .try_fill_bytes(&mut raw)
            .map_err(|e| Error::system("read the OS random source", e))?;
        Ok(Token::encode(&raw))
    }

    /// A fresh token for a lock of `resource` ([`Token::generate`]); an all-or-none lock's
    /// ([`ResourceSet`](crate::ResourceSet)) carries the digest of its names: `.`, 8
    /// characters of the names' SHA-1, then 18 random ones (108 bits), [`TOKEN_LEN`] in all.
    /// So a token handed around (`redlock acquire a b` prints it) says it holds a set, and
    /// which: [`Lock::from_parts`](crate::Lock::from_parts) refuses it with a part of the set,
    /// or with other names, whose release or extend would leave the set's other members held
    /// while its holder believes them released — or extended while they run out.
    pub(crate) fn for_resource(resource: &[u8]) -> Result<Token, Error> {
        let mut token = Token::generate()?;
        if crate::model::keys::set_members(resource).is_some() {
            token.bytes[0] = SET_MARK;
            token.bytes[1..1 + SET_DIGEST_LEN].copy_from_slice(&set_digest(resource));
        }
        Ok(token)
    }

    /// `Ok` if this token may be a lock of `resource`: a set's token ([`Token::for_resource`])
    /// with that set, any other token with anything but a set.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] saying what does not match.
    pub(crate) fn check_for(&self, resource: &[u8]) -> Result<(), Error> {
        let b = self.as_bytes();
        let of_set = b.len() == TOKEN_LEN && b[0] == SET_MARK;
        match (crate::model::keys::set_members(resource).is_some(), of_set) {
            (false, false) => Ok(()),
            (true, true) if b[1..1 + SET_DIGEST_LEN] == set_digest(resource) => Ok(()),
            (true, true) => Err(Error::Config(
                "this token holds an all-or-none lock of other names: release or extend it \
                 as it was taken, with every name it was taken with"
                    .into(),
            )),
            (true, false) => Err(Error::Config(
                "this token is not an all-or-none lock's: release or extend the lock it holds \
                 as it was taken, with its one name"
                    .into(),
            )),
            (false, true) => Err(Error::Config(
                "this token holds an all-or-none lock of several names: release or extend it \
                 as it was taken, with every name (a part of it released alone leaves the \
                 others held, and another client takes the part while the holder believes it \
                 holds them all)"
                    .into(),
            )),
        }
    }

    /// The token of 20 random bytes, as [`Token::generate`] makes it (the simulator draws the
    /// bytes from its seeded generator).
    pub(crate) fn encode(raw: &[u8; RANDOM_BYTES]) -> Token {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut bytes = [0u8; MAX_TOKEN_LEN];
        let mut o = 0;
        for chunk in raw.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for k in 0..=chunk.len() {
                bytes[o] = ALPHABET[((n >> (18 - 6 * k)) & 63) as usize];
                o += 1;
            }
        }
        Token {
            len: o as u8,
            bytes,
        }
    }

    /// True if `member` is shaped as a token this crate makes ([`TOKEN_LEN`] characters of
    /// base64url): what a reader's release may sweep from a read lock as an expired reader
    /// (`SHARED_RELEASE_BODY` checks the same).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn is_shaped(member: &[u8]) -> bool {
        member.len() == TOKEN_LEN && member.iter().all(is_base64url)
    }

    /// A token given by someone else (e.g. printed by `redlock acquire`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if empty, longer than [`MAX_TOKEN_LEN`], or holding
    /// [`OWNER_SEPARATOR`]. Why no space: a key's value with an owner is `<token> <owner>`,
    /// and releases match a value by its token and the space. A value pasted whole (or cut at
    /// a space of its owner) taken as a token would match as a token of its own — and an
    /// all-or-none set's value, so taken, would pass for a plain token and release one member
    /// alone.
    pub fn from_bytes(b: &[u8]) -> Result<Token, Error> {
        if b.is_empty() || b.len() > MAX_TOKEN_LEN {
            return Err(Error::Config(format!(
                "a token must be 1 to {MAX_TOKEN_LEN} bytes, got {}",
                b.len()
            )));
        }
        if b.contains(&OWNER_SEPARATOR) {
            return Err(Error::Config(
                "a token holds no space: a lock's value with an owner is `<token> <owner>`, \
                 and its token is what comes before the first space"
                    .into(),
            ));
        }
        let mut bytes = [0u8; MAX_TOKEN_LEN];
        bytes[..b.len()].copy_from_slice(b);
        Ok(Token {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The `n`th variant of this token: its last four bytes shifted by the base-64 digits of
    /// `n` (so variants 0 to 64⁴ − 1 of one token all differ, and 0 is the token itself). The
    /// attempts of one waiting caller each need a token of their own — a release of an earlier
    /// attempt, sent again after a reconnect, must never delete a later attempt's key — and
    /// the engine cannot draw randomness for them (it is deterministic under the simulator).
    pub(crate) fn variant(&self, n: u32) -> Token {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = *self;
        if n == 0 {
            return out;
        }
        let len = usize::from(self.len);
        for k in 0..4.min(len) {
            let digit = ((n >> (6 * k)) & 63) as usize;
            let at = len - 1 - k;
            let byte = &mut out.bytes[at];
            // Bytes outside the alphabet (tokens from elsewhere) map through their low bits.
            let index = ALPHABET
                .iter()
                .position(|a| a == byte)
                .unwrap_or(usize::from(*byte) & 63);
            *byte = ALPHABET[(index + digit) & 63];
        }
        out
    }

    /// What every variant of this set token shares ([`Token::variant`] changes only the last
    /// four bytes): its first [`FAMILY_LEN`] bytes, the token of the whole acquisition. A set
    /// that waits takes its members one attempt at a time, each attempt with a variant of its
    /// own (`engine/wait.rs`), so a member may hold the variant of an earlier step; the
    /// release of the lock is sent with this, and deletes every member whose value starts
    /// with it (`SET_RELEASE_BODY`). Only a set's token ([`Token::for_resource`], the length
    /// of every token this crate makes) has one; other tokens are returned as they are.
    pub(crate) fn family(&self) -> Token {
        let mut out = *self;
        if usize::from(self.len) == TOKEN_LEN && self.bytes[0] == SET_MARK {
            out.bytes[FAMILY_LEN..].fill(0);
            out.len = FAMILY_LEN as u8;
        }
        out
    }

    /// The token's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sets_token_goes_with_that_set_only() {
        let ok = |_: &[u8]| Ok(());
        let ab = crate::model::keys::encode_set(&["a", "b"], ok).unwrap();
        let ac = crate::model::keys::encode_set(&["a", "c"], ok).unwrap();
        let set = Token::for_resource(&ab).unwrap();
        assert_eq!(set.as_bytes().len(), TOKEN_LEN);
        assert_eq!(set.as_bytes()[0], SET_MARK);
        assert!(set.check_for(&ab).is_ok());
        // Its waiting attempts' variants too.
        assert!(set.variant(77).check_for(&ab).is_ok());
        for other in [&b"a"[..], b"b", &ac, b"redlock:shared:a"] {
            let err = set.check_for(other).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{err:?}");
        }
        // A plain token: anything but a set.
        let plain = Token::for_resource(b"a").unwrap();
        assert_ne!(plain.as_bytes()[0], SET_MARK);
        assert!(plain.check_for(b"a").is_ok() && plain.check_for(b"z").is_ok());
        assert!(plain.check_for(&ab).is_err());
        // Two sets' digests differ; the same set's are the same.
        assert_eq!(set_digest(&ab), set_digest(&ab));
        assert_ne!(set_digest(&ab), set_digest(&ac));
    }

    #[test]
    fn a_value_splits_into_token_and_owner_only_when_this_crate_wrote_it() {
        let t = Token::generate().unwrap();
        let set =
            Token::for_resource(&crate::model::keys::encode_set(&["a", "b"], |_| Ok(())).unwrap())
                .unwrap();
        let mut buf = [0u8; MAX_VALUE_LEN];
        for token in [t, set] {
            let value = lock_value(token.as_bytes(), Some(b"host:1:job x"), &mut buf).to_vec();
            assert_eq!(
                split_value(&value),
                (token.as_bytes(), Some(&b"host:1:job x"[..]))
            );
            assert!(holds_token(&value, token.as_bytes()));
            // Without an owner the value is the token, which is its own token.
            let bare = lock_value(token.as_bytes(), None, &mut buf).to_vec();
            assert_eq!(split_value(&bare), (token.as_bytes(), None));
        }
        // Another client's values: a space at the token's length is not enough.
        let foreign: [&[u8]; 4] = [
            b"this value is someone else's and long",
            b"aaaaaaaaaaaaaaaaaaaaaaaaaa! owner",
            b"aaaaaaaaaaaaaaaaaaaaaaaaaaa ",
            b"",
        ];
        for v in foreign {
            assert_eq!(split_value(v), (v, None), "{v:?}");
        }
        let long = [t.as_bytes(), b" ", &[b'o'; MAX_OWNER_LEN + 1]].concat();
        assert_eq!(split_value(&long).1, None);
        // Our token then anything but the separator is not ours.
        let near = [t.as_bytes(), b"X owner"].concat();
        assert!(!holds_token(&near, t.as_bytes()));
        // No token holds the separator.
        assert!(Token::from_bytes(b"two words").is_err());
    }

    #[test]
    fn variants_of_a_token_all_differ() {
        let t = Token::generate().unwrap();
        assert_eq!(t.variant(0), t);
        let mut seen = std::collections::HashSet::new();
        for n in (0..5000).chain([64u32.pow(4) - 1, 100_000, 262_143]) {
            let v = t.variant(n);
            assert_eq!(v.as_bytes().len(), TOKEN_LEN);
            assert_eq!(v.as_bytes()[..TOKEN_LEN - 4], t.as_bytes()[..TOKEN_LEN - 4]);
            assert!(seen.insert(v), "variant {n} repeats an earlier one");
            assert!(Token::is_shaped(v.as_bytes()), "{v}");
        }
        // A short token from elsewhere, bytes outside the alphabet included.
        let odd = Token::from_bytes(b"\x01\xff").unwrap();
        assert_ne!(odd.variant(1), odd.variant(2));
    }
}
