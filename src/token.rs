//! The lock token: unique per acquisition, stored on the nodes as the lock's value.

use std::fmt;

use rand::TryRng;

use crate::error::Error;

/// Length of a token made by this crate: 20 random bytes in unpadded base64url.
pub const TOKEN_LEN: usize = 27;
/// Longest token accepted from elsewhere ([`Lock::from_parts`](crate::Lock::from_parts)).
pub const MAX_TOKEN_LEN: usize = 64;
/// Random bytes in a generated token: 160 bits, unguessable and unique in practice; they
/// encode to [`TOKEN_LEN`] characters.
pub(crate) const RANDOM_BYTES: usize = 20;

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
        member.len() == TOKEN_LEN
            && (member.iter()).all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    }

    /// A token given by someone else (e.g. printed by `redlock acquire`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if empty or longer than [`MAX_TOKEN_LEN`].
    pub fn from_bytes(b: &[u8]) -> Result<Token, Error> {
        if b.is_empty() || b.len() > MAX_TOKEN_LEN {
            return Err(Error::Config(format!(
                "a token must be 1 to {MAX_TOKEN_LEN} bytes, got {}",
                b.len()
            )));
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
