//! RESP command encoding: a command is an array of bulk strings, written straight into the
//! caller's buffer with the exact length reserved once and integers formatted on the stack:
//!
//! ```text
//! *<argc>\r\n $<len>\r\n<arg>\r\n ...
//! ```
//!
//! Re-exported by [`resp`](crate::proto::resp), the codec's public face. No I/O.

use bytes::BytesMut;

/// `\r\n`, which ends every line and every bulk payload.
pub(crate) const CRLF_LEN: usize = 2;
/// The most decimal digits a `u64` has (`18446744073709551615`): the scratch for one number.
pub(crate) const U64_DIGITS: usize = 20;
/// A sign and the digits: the scratch for an `i64` or a `u64` as text.
pub(crate) const INT_TEXT_MAX: usize = 1 + U64_DIGITS;
/// The longest `$<len>\r\n` or `*<n>\r\n` header.
pub(crate) const HEADER_MAX: usize = 1 + U64_DIGITS + CRLF_LEN;

/// One command argument: bytes, or an integer formatted without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// Sent as is.
    Bytes(&'a [u8]),
    /// Sent in decimal.
    Int(i64),
    /// Sent in decimal.
    UInt(u64),
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(b: &'a [u8]) -> Self {
        Arg::Bytes(b)
    }
}
impl<'a, const N: usize> From<&'a [u8; N]> for Arg<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        Arg::Bytes(b)
    }
}
impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Bytes(s.as_bytes())
    }
}
impl From<i64> for Arg<'_> {
    fn from(n: i64) -> Self {
        Arg::Int(n)
    }
}
impl From<u64> for Arg<'_> {
    fn from(n: u64) -> Self {
        Arg::UInt(n)
    }
}

/// Formats `n` in decimal at the end of `scratch`, returning the digits.
fn format_u64(mut n: u64, scratch: &mut [u8; U64_DIGITS]) -> &[u8] {
    let mut i = scratch.len();
    loop {
        i -= 1;
        scratch[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &scratch[i..];
        }
    }
}

fn decimal_len(n: u64) -> usize {
    let mut len = 1;
    let mut n = n / 10;
    while n > 0 {
        len += 1;
        n /= 10;
    }
    len
}

impl Arg<'_> {
    fn len(&self) -> usize {
        match *self {
            Arg::Bytes(b) => b.len(),
            Arg::Int(n) => decimal_len(n.unsigned_abs()) + usize::from(n < 0),
            Arg::UInt(n) => decimal_len(n),
        }
    }
}

/// The exact number of bytes [`encode_command`] writes for `args`.
pub fn command_len(args: &[Arg<'_>]) -> usize {
    // `*<n>\r\n`
    let header = 1 + decimal_len(args.len() as u64) + CRLF_LEN;
    args.iter()
        .map(bulk_len)
        .fold(header, |total, len| total + len)
}

/// Appends `args` to `out` as a RESP array of bulk strings, reserving the exact length once:
///
/// ```text
/// *3\r\n$3\r\nGET\r\n...
/// ```
///
/// ```
/// use redlock_mux::resp::{encode_command, Arg};
/// let mut out = bytes::BytesMut::new();
/// encode_command(&mut out, &[Arg::from("SET"), "k".into(), "v".into(), "PX".into(), 30_000u64.into()]);
/// assert_eq!(&out[..], b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$5\r\n30000\r\n");
/// ```
pub fn encode_command(out: &mut BytesMut, args: &[Arg<'_>]) {
    out.reserve(command_len(args));
    encode_array_header(out, args.len());
    for arg in args {
        encode_bulk(out, arg);
    }
}

/// Appends an array header `*<n>\r\n`: the start of a command whose arguments follow as
/// [`encode_bulk`] calls.
pub fn encode_array_header(out: &mut BytesMut, n: usize) {
    // Every command the client sends has fewer than ten parts.
    if n < 10 {
        out.extend_from_slice(&[b'*', b'0' + n as u8, b'\r', b'\n']);
        return;
    }
    let mut scratch = [0u8; U64_DIGITS];
    let digits = format_u64(n as u64, &mut scratch);
    let mut head = [0u8; HEADER_MAX];
    let len = compose(&mut head, &[b"*", digits, b"\r\n"]);
    out.extend_from_slice(&head[..len]);
}

/// Copies `parts` one after another into `buf`, returning the length written. Small pieces are
/// gathered on the stack so that each bulk string costs one append to the output buffer, not
/// five (measured: the appends, not the copies, dominated encoding).
fn compose(buf: &mut [u8], parts: &[&[u8]]) -> usize {
    let mut at = 0;
    for part in parts {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    at
}

/// Payloads up to this size are encoded in one append, header and trailer included.
const INLINE_BULK: usize = 64;

/// Appends one bulk string `$<len>\r\n<arg>\r\n`.
pub fn encode_bulk(out: &mut BytesMut, arg: &Arg<'_>) {
    let mut len_scratch = [0u8; U64_DIGITS];
    let mut int_scratch = [0u8; INT_TEXT_MAX];
    let payload: &[u8] = match *arg {
        Arg::Bytes(b) => b,
        Arg::Int(n) => {
            let digits_len = format_u64(n.unsigned_abs(), &mut len_scratch).len();
            let start = INT_TEXT_MAX - digits_len - usize::from(n < 0);
            int_scratch[INT_TEXT_MAX - digits_len..]
                .copy_from_slice(&len_scratch[U64_DIGITS - digits_len..]);
            if n < 0 {
                int_scratch[start] = b'-';
            }
            &int_scratch[start..]
        }
        Arg::UInt(n) => {
            let digits_len = format_u64(n, &mut len_scratch).len();
            int_scratch[INT_TEXT_MAX - digits_len..]
                .copy_from_slice(&len_scratch[U64_DIGITS - digits_len..]);
            &int_scratch[INT_TEXT_MAX - digits_len..]
        }
    };
    let mut scratch = [0u8; U64_DIGITS];
    let len_digits = format_u64(payload.len() as u64, &mut scratch);
    if payload.len() <= INLINE_BULK {
        let mut whole = [0u8; HEADER_MAX + INLINE_BULK + CRLF_LEN];
        let n = compose(&mut whole, &[b"$", len_digits, b"\r\n", payload, b"\r\n"]);
        out.extend_from_slice(&whole[..n]);
    } else {
        let mut head = [0u8; HEADER_MAX];
        let n = compose(&mut head, &[b"$", len_digits, b"\r\n"]);
        out.extend_from_slice(&head[..n]);
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
    }
}

/// `SET <key> <token> NX PX <ttl>` with the TTL encoded once: what stays the same from one
/// acquisition to the next (the verb, `NX PX` and the TTL) is kept pre-encoded, and only the key
/// and the token are written per command, from the stack in one append. This is the lock's hot
/// path; [`encode_command`] is the general form and writes the same bytes.
///
/// ```
/// use redlock_mux::resp::{encode_command, Arg, SetNxPx};
/// let mut fast = bytes::BytesMut::new();
/// SetNxPx::new(30_000).encode(&mut fast, b"lock:1", b"tok");
/// let mut general = bytes::BytesMut::new();
/// let args: [Arg; 6] = ["SET".into(), "lock:1".into(), "tok".into(), "NX".into(), "PX".into(), 30_000u64.into()];
/// encode_command(&mut general, &args);
/// assert_eq!(fast, general);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetNxPx {
    /// `\r\n$2\r\nNX\r\n$2\r\nPX\r\n$<n>\r\n<ttl>\r\n`, the bytes after the token.
    tail: [u8; SET_TAIL_MAX],
    tail_len: u8,
}

/// The longest tail of a `SET … NX PX <ttl>` command: `\r\n$2\r\nNX\r\n$2\r\nPX\r\n` (18 bytes),
/// then the TTL as a bulk string of up to 20 digits (`$20\r\n<digits>\r\n`).
const SET_TAIL_MAX: usize = 18 + (1 + 2 + CRLF_LEN) + U64_DIGITS + CRLF_LEN;
/// Key plus token up to this size are composed on the stack and appended at once.
const SET_INLINE: usize = 192;
/// What a `SET` command has before its tail besides the key and the token:
/// `*6\r\n$3\r\nSET\r\n$` (14 bytes), the key's length and CRLF, the CRLF after the key, and the
/// token's `$<len>\r\n`.
const SET_HEAD_MAX: usize = 14 + U64_DIGITS + CRLF_LEN + CRLF_LEN + HEADER_MAX;

impl SetNxPx {
    /// The template for a TTL of `ttl_ms` milliseconds.
    pub fn new(ttl_ms: u64) -> SetNxPx {
        let mut digits_scratch = [0u8; U64_DIGITS];
        let digits = format_u64(ttl_ms, &mut digits_scratch);
        let mut len_scratch = [0u8; U64_DIGITS];
        let len = format_u64(digits.len() as u64, &mut len_scratch);
        let mut tail = [0u8; SET_TAIL_MAX];
        let n = compose(
            &mut tail,
            &[
                b"\r\n$2\r\nNX\r\n$2\r\nPX\r\n$",
                len,
                b"\r\n",
                digits,
                b"\r\n",
            ],
        );
        SetNxPx {
            tail,
            tail_len: n as u8,
        }
    }

    /// Appends `SET <key> <token> NX PX <ttl>` to `out`.
    pub fn encode(&self, out: &mut BytesMut, key: &[u8], token: &[u8]) {
        const HEAD: &[u8] = b"*6\r\n$3\r\nSET\r\n$";
        let tail = &self.tail[..usize::from(self.tail_len)];
        let mut key_scratch = [0u8; U64_DIGITS];
        let key_len = format_u64(key.len() as u64, &mut key_scratch);
        let mut token_scratch = [0u8; U64_DIGITS];
        let token_len = format_u64(token.len() as u64, &mut token_scratch);
        let parts: [&[u8]; 8] = [
            HEAD, key_len, b"\r\n", key, b"\r\n$", token_len, b"\r\n", token,
        ];
        if key.len() + token.len() <= SET_INLINE {
            let mut whole = [0u8; SET_HEAD_MAX + SET_INLINE + SET_TAIL_MAX];
            let n = compose(&mut whole, &parts);
            let m = compose(&mut whole[n..], &[tail]);
            out.extend_from_slice(&whole[..n + m]);
        } else {
            out.reserve(parts.iter().map(|p| p.len()).sum::<usize>() + tail.len());
            for part in parts {
                out.extend_from_slice(part);
            }
            out.extend_from_slice(tail);
        }
    }
}

/// The exact number of bytes [`encode_bulk`] writes for `arg`.
pub fn bulk_len(arg: &Arg<'_>) -> usize {
    let len = arg.len();
    // `$<len>\r\n<data>\r\n`
    1 + decimal_len(len as u64) + CRLF_LEN + len + CRLF_LEN
}
