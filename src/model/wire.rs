//! The wire's vocabulary that settings and errors name: the decoder's [`Limits`], why bytes
//! are not valid RESP ([`ParseError`]), and a server error's first word ([`ErrorKind`]). Plain
//! data; the codec that uses them is `proto/resp.rs`, whose public face re-exports them.

/// The deepest nesting any [`Limits`] can allow: the decoder keeps one counter per open aggregate
/// on a fixed stack of this size, so that resuming needs no allocation.
pub const MAX_DEPTH_CAP: usize = 128;

/// Limits on what the decoder accepts. Every quantity read off the wire is checked against one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string, verbatim string or blob error payload, in bytes.
    pub max_bulk_len: usize,
    /// Most elements in one aggregate (a map or attribute of `n` entries counts `2n`).
    pub max_elements: usize,
    /// Deepest nesting of aggregates; at most [`MAX_DEPTH_CAP`].
    pub max_depth: usize,
    /// Largest whole frame, in bytes, including every header and nested element. Also bounds the
    /// bytes buffered for a frame that is still incomplete.
    pub max_frame_len: usize,
    /// Longest line (simple string, error, integer, double, big number, header), CRLF excluded.
    /// A length or count header is refused past a sign and 20 digits whatever this allows.
    pub max_line_len: usize,
}

impl Limits {
    /// Defaults for a general RESP decoder: Redis' own `proto-max-bulk-len` (512 MiB) for bulk
    /// strings and frames, 2²⁰ elements per aggregate, depth 64, lines up to 64 KiB.
    pub const DEFAULT: Limits = Limits {
        max_bulk_len: 512 << 20,
        max_elements: 1 << 20,
        max_depth: 64,
        max_frame_len: 512 << 20,
        max_line_len: 64 << 10,
    };

    /// Tight limits for a lock client, whose largest reply is `INFO server` (a few KiB): 1 MiB per
    /// frame and per bulk string, 4096 elements, depth 32, lines up to 16 KiB.
    pub const CLIENT: Limits = Limits {
        max_bulk_len: 1 << 20,
        max_elements: 4096,
        max_depth: 32,
        max_frame_len: 1 << 20,
        max_line_len: 16 << 10,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Why a byte sequence is not valid RESP (or exceeds a [`Limits`] value). Small, `Copy`, static
/// messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The first byte of a frame is not a RESP2/RESP3 type byte.
    #[error("unknown RESP type byte {0:#04x}")]
    UnknownType(u8),
    /// A `\r` was followed by something other than `\n`.
    #[error("CR not followed by LF")]
    MissingLf,
    /// An integer or length is empty or contains a non-digit.
    #[error("integer is not a decimal number")]
    InvalidInteger,
    /// An integer or length does not fit in 64 bits.
    #[error("integer does not fit in 64 bits")]
    IntegerOverflow,
    /// A length is negative and not the null marker -1.
    #[error("negative length other than -1")]
    NegativeLength,
    /// A bulk length exceeds [`Limits::max_bulk_len`].
    #[error("bulk string longer than the limit")]
    BulkTooLong,
    /// An aggregate count exceeds [`Limits::max_elements`].
    #[error("aggregate has more elements than the limit")]
    TooManyElements,
    /// Aggregates are nested deeper than [`Limits::max_depth`].
    #[error("aggregates nested deeper than the limit")]
    TooDeep,
    /// The frame (or the incomplete frame buffered so far) exceeds [`Limits::max_frame_len`].
    #[error("frame larger than the limit")]
    FrameTooLarge,
    /// A line has no CRLF within [`Limits::max_line_len`] bytes, or a length or count header
    /// within a sign and 20 digits.
    #[error("line longer than the limit")]
    LineTooLong,
    /// A bulk payload is not followed by CRLF: its length header lied.
    #[error("bulk string not terminated by CRLF")]
    BadBulkTerminator,
    /// Text was expected (simple string, error, big number, verbatim format) but it is not UTF-8.
    #[error("text is not valid UTF-8")]
    NotUtf8,
    /// A `,` double is not a number, `inf`, `-inf` or `nan`.
    #[error("invalid double")]
    InvalidDouble,
    /// A `#` boolean is not `t` or `f`.
    #[error("invalid boolean")]
    InvalidBoolean,
    /// A `_` null carries data.
    #[error("invalid null")]
    InvalidNull,
    /// A `=` verbatim string lacks its `xxx:` format prefix.
    #[error("invalid verbatim string")]
    InvalidVerbatim,
    /// A `(` big number is not an optionally signed run of digits.
    #[error("invalid big number")]
    InvalidBigNumber,
    /// Streamed RESP3 strings and aggregates (`$?`, `*?`, `;`) are not supported.
    #[error("streamed RESP3 strings and aggregates are not supported")]
    Streamed,
}

/// The first word of a server error, classified, because the lock logic reacts to some of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `ERR`: generic error.
    Err,
    /// `NOSCRIPT`: `EVALSHA` of a script the server does not know.
    NoScript,
    /// `WRONGTYPE`: the key holds another type.
    WrongType,
    /// `NOAUTH`: authentication required.
    NoAuth,
    /// `WRONGPASS`: bad user name or password.
    WrongPass,
    /// `NOPERM`: the ACL user may not run this command or touch this key.
    NoPerm,
    /// `BUSY`: a script is running.
    Busy,
    /// `LOADING`: the server is loading its dataset.
    Loading,
    /// `READONLY`: the node is a replica.
    ReadOnly,
    /// `MASTERDOWN`: a replica lost its master.
    MasterDown,
    /// Any other first word.
    Other,
}

impl ErrorKind {
    /// Classifies an error message by its first word (case-sensitive, as Redis sends it).
    pub fn classify(message: &[u8]) -> ErrorKind {
        let word_end = message
            .iter()
            .position(|&b| b == b' ')
            .unwrap_or(message.len());
        match &message[..word_end] {
            b"ERR" => ErrorKind::Err,
            b"NOSCRIPT" => ErrorKind::NoScript,
            b"WRONGTYPE" => ErrorKind::WrongType,
            b"NOAUTH" => ErrorKind::NoAuth,
            b"WRONGPASS" => ErrorKind::WrongPass,
            b"NOPERM" => ErrorKind::NoPerm,
            b"BUSY" => ErrorKind::Busy,
            b"LOADING" => ErrorKind::Loading,
            b"READONLY" => ErrorKind::ReadOnly,
            b"MASTERDOWN" => ErrorKind::MasterDown,
            _ => ErrorKind::Other,
        }
    }

    /// True for the errors that mean "these credentials are not accepted".
    pub fn is_auth(self) -> bool {
        matches!(
            self,
            ErrorKind::NoAuth | ErrorKind::WrongPass | ErrorKind::NoPerm
        )
    }
}
