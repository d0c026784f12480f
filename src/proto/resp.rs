//! The RESP2/RESP3 codec: command encoding and an incremental frame decoder. No I/O, no clock.
//!
//! # Encoding
//!
//! Commands go out as an array of bulk strings, written straight into the caller's buffer with the
//! exact length reserved once and integers formatted on the stack:
//!
//! ```text
//! *<argc>\r\n $<len>\r\n<arg>\r\n ...
//! ```
//!
//! # Decoding
//!
//! [`Decoder::decode`] works on a byte slice the caller owns and never mutates it. Like `httparse`
//! it answers [`Status::Partial`] (not an error) while a frame is incomplete, and a complete frame
//! comes back with the number of bytes it consumed; the bytes after it are left for the next call.
//!
//! The decoder is *resumable*: when a frame is partial it remembers how far it has validated (and
//! which aggregates are still open, on a fixed stack), so calling it again with the same buffer
//! grown at the end continues where it stopped. A large reply trickling in byte by byte therefore
//! costs O(n), not O(n²).
//!
//! Frames borrow from the input: decoding a scalar allocates nothing, and aggregates are
//! validated whole before they are returned as an [`Aggregate`] whose elements are decoded lazily
//! when iterated — so aggregates allocate nothing either.
//!
//! Every number read off the wire is checked against a named limit in [`Limits`], with checked
//! arithmetic: a length header is never trusted for anything before its bytes have arrived.
//!
//! RESP3 attributes (`|`) are validated and skipped: the frame that follows them is returned, and
//! the consumed count covers both. Streamed strings and aggregates (`$?`, `*?`) are refused with
//! [`ParseError::Streamed`].

use std::fmt;

pub use super::encode::{
    Arg, SetNxPx, bulk_len, command_len, encode_array_header, encode_bulk, encode_command,
};
use super::encode::{CRLF_LEN, INT_TEXT_MAX};
pub use crate::model::wire::{ErrorKind, Limits, MAX_DEPTH_CAP, ParseError};

/// A verbatim string's data starts with its format, three bytes, and `:` (`txt:`, `mkd:`).
const VERBATIM_FORMAT_LEN: usize = 3;
/// The longest length or count a header line (`$`, `=`, `!`, `*`, `%`, `~`, `>`, `|`) may carry,
/// CRLF excluded: a sign and the digits, whatever `max_line_len` allows. Every legitimate
/// length (`-1`, any `i64` or `usize` in normal form) fits; a header padded with leading zeros
/// does not. Without it, a bulk header padded to `max_line_len` was parsed again on every
/// read while its payload trickled in (the header is where a partial bulk resumes).
const HEADER_LINE_MAX: usize = INT_TEXT_MAX;

/// The outcome of a decode call that did not fail.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Status<T> {
    /// A whole frame was decoded.
    Complete(T),
    /// The input ends before the frame does: call again when more bytes have arrived.
    Partial,
}

/// A server error reply (`-` simple error or `!` blob error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerError<'a> {
    /// The first word, classified.
    pub kind: ErrorKind,
    /// The whole message, first word included (`NOSCRIPT No matching script...`).
    pub message: &'a str,
}

impl fmt::Display for ServerError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

/// The kind of an aggregate frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateKind {
    /// `*` array.
    Array,
    /// `%` map: elements alternate key, value.
    Map,
    /// `~` set.
    Set,
    /// `>` push (out-of-band data, not a reply).
    Push,
}

/// A validated aggregate, borrowed from the input. Its elements are decoded when iterated.
#[derive(Clone, Copy, PartialEq)]
pub struct Aggregate<'a> {
    kind: AggregateKind,
    len: usize,
    body: &'a [u8],
}

impl<'a> Aggregate<'a> {
    /// Array, map, set or push.
    pub fn kind(&self) -> AggregateKind {
        self.kind
    }

    /// Number of elements (for a map, twice the number of entries).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the aggregate has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements in order (for a map: key, value, key, value, ...).
    pub fn iter(&self) -> Elements<'a> {
        Elements {
            rest: self.body,
            left: self.len,
        }
    }
}

impl fmt::Debug for Aggregate<'_> {
    /// `Array[Integer(1), Null]`. Each element is decoded as it is written, and a writer's
    /// error ends the walk (`debug_list` would go on decoding every element of a megabyte
    /// frame into a writer that refuses them: `error::clipped_debug`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}[", self.kind)?;
        for (i, element) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            fmt::Debug::fmt(&element, f)?;
        }
        f.write_str("]")
    }
}

impl<'a> IntoIterator for Aggregate<'a> {
    type Item = Frame<'a>;
    type IntoIter = Elements<'a>;
    fn into_iter(self) -> Elements<'a> {
        self.iter()
    }
}

/// Iterator over the elements of an [`Aggregate`].
#[derive(Debug, Clone)]
pub struct Elements<'a> {
    rest: &'a [u8],
    left: usize,
}

/// Limits for re-reading bytes that were already validated under stricter ones.
const REVALIDATE: Limits = Limits {
    max_bulk_len: usize::MAX,
    max_elements: usize::MAX,
    max_depth: MAX_DEPTH_CAP,
    max_frame_len: usize::MAX,
    max_line_len: usize::MAX,
};

impl<'a> Iterator for Elements<'a> {
    type Item = Frame<'a>;
    fn next(&mut self) -> Option<Frame<'a>> {
        if self.left == 0 {
            return None;
        }
        // The body was validated whole before the Aggregate was made, so this cannot fail; if it
        // somehow did, ending the iteration is the safe answer.
        match Decoder::new(REVALIDATE).decode(self.rest) {
            Ok(Status::Complete((frame, used))) => {
                self.rest = &self.rest[used..];
                self.left -= 1;
                Some(frame)
            }
            _ => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// One decoded frame, borrowing from the input buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Frame<'a> {
    /// `+<text>\r\n`
    Simple(&'a str),
    /// `-<message>\r\n` or `!<len>\r\n<message>\r\n`
    Error(ServerError<'a>),
    /// `:<i64>\r\n`
    Integer(i64),
    /// `$<len>\r\n<bytes>\r\n`
    Bulk(&'a [u8]),
    /// `$-1\r\n`, `*-1\r\n` (RESP2) or `_\r\n` (RESP3).
    Null,
    /// `,<double>\r\n`
    Double(f64),
    /// `#t\r\n` / `#f\r\n`
    Boolean(bool),
    /// `(<digits>\r\n`
    BigNumber(&'a str),
    /// `=<len>\r\n<fmt>:<text>\r\n`
    Verbatim {
        /// The three-byte format, e.g. `txt` or `mkd`.
        format: &'a str,
        /// The text after the `fmt:` prefix.
        text: &'a [u8],
    },
    /// `*`, `%`, `~` or `>` followed by `<count>\r\n` and the elements.
    Aggregate(Aggregate<'a>),
}

/// What one element header turned out to be.
enum Elem<'a> {
    /// Incomplete; `scanned` is how far a line search got without finding CR.
    Partial { scanned: usize },
    /// A whole scalar (or empty aggregate) ending at `end`.
    Scalar(Frame<'a>, usize),
    /// An aggregate header: `count` elements follow from `body`.
    Open {
        kind: AggregateKind,
        count: usize,
        body: usize,
    },
    /// An attribute header: `count` elements (2 × entries) follow from `body`.
    Attribute { count: usize, body: usize },
}

/// What an open level of the decoder's stack is.
#[derive(Clone, Copy)]
enum Level {
    /// An aggregate: its completion is an element of the level around it.
    Aggregate,
    /// An attribute: it annotates the element after it and is not an element itself.
    Attribute,
}

/// A resumable RESP decoder. Keep one per connection; see the [module docs](self).
#[derive(Clone)]
pub struct Decoder {
    limits: Limits,
    /// Bytes of the frame in progress validated so far.
    pos: usize,
    /// Where the line search of the element at `pos` may resume (no CR before it).
    scan: usize,
    /// Number of open aggregates.
    depth: usize,
    /// Elements still expected at each open level.
    left: [usize; MAX_DEPTH_CAP],
    /// Bit i set: level i is an attribute (its completion does not count as an element).
    attr: u128,
    /// The outermost aggregate of the frame in progress: kind, element count, body start.
    top: Option<(AggregateKind, usize, usize)>,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("limits", &self.limits)
            .field("pos", &self.pos)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new(Limits::DEFAULT)
    }
}

/// Decodes one frame from `buf` with fresh state (a convenience for whole buffers).
///
/// # Errors
///
/// A [`ParseError`] when `buf` does not start with valid RESP within `limits`.
pub fn decode<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Status<(Frame<'a>, usize)>, ParseError> {
    Decoder::new(*limits).decode(buf)
}

impl Decoder {
    /// A decoder with the given limits (`max_depth` is capped at [`MAX_DEPTH_CAP`]).
    pub fn new(mut limits: Limits) -> Decoder {
        limits.max_depth = limits.max_depth.min(MAX_DEPTH_CAP);
        Decoder {
            limits,
            pos: 0,
            scan: 0,
            depth: 0,
            left: [0; MAX_DEPTH_CAP],
            attr: 0,
            top: None,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Forgets the frame in progress (e.g. after the caller dropped the bytes it was reading).
    pub fn reset(&mut self) {
        self.pos = 0;
        self.scan = 0;
        self.depth = 0;
        self.attr = 0;
        self.top = None;
    }

    /// Bytes of the frame in progress that are already validated. Zero between frames.
    pub fn progress(&self) -> usize {
        self.pos
    }

    /// Decodes the frame at the start of `buf`.
    ///
    /// Returns `Complete((frame, consumed))`, or `Partial` when `buf` ends before the frame does.
    /// After `Partial`, call again with the same bytes plus whatever arrived since: the decoder
    /// resumes where it stopped. (Given a shorter buffer, it starts over.)
    ///
    /// # Errors
    ///
    /// A [`ParseError`] for invalid RESP or a [`Limits`] value exceeded; the state is reset and
    /// the connection that produced the bytes should be dropped, since framing is lost.
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<Status<(Frame<'a>, usize)>, ParseError> {
        if self.pos == 0
            && self.depth == 0
            && let Some(done) = common_reply(buf, &self.limits)
        {
            self.scan = 0;
            return Ok(Status::Complete(done));
        }
        if buf.len() < self.pos || buf.len() < self.scan {
            self.reset();
        }
        let result = self.run(buf);
        if !matches!(result, Ok(Status::Partial)) {
            self.reset();
        }
        result
    }

    fn run<'a>(&mut self, buf: &'a [u8]) -> Result<Status<(Frame<'a>, usize)>, ParseError> {
        loop {
            let scan = self.scan.max(self.pos);
            match element(buf, self.pos, scan, &self.limits)? {
                Elem::Partial { scanned } => {
                    self.scan = scanned;
                    if buf.len() > self.limits.max_frame_len {
                        return Err(ParseError::FrameTooLarge);
                    }
                    return Ok(Status::Partial);
                }
                Elem::Scalar(frame, end) => {
                    self.advance(end)?;
                    if self.depth == 0 {
                        return Ok(Status::Complete((frame, end)));
                    }
                    if let Some(done) = self.close_element(buf) {
                        return Ok(Status::Complete(done));
                    }
                }
                Elem::Open { kind, count, body } => {
                    if self.depth == 0 {
                        self.top = Some((kind, count, body));
                    }
                    self.push(count, Level::Aggregate)?;
                    self.advance(body)?;
                }
                Elem::Attribute { count, body } => {
                    // An empty attribute (`|0`) annotates nothing: skip it as if it were absent.
                    if count > 0 {
                        self.push(count, Level::Attribute)?;
                    }
                    self.advance(body)?;
                }
            }
        }
    }

    fn advance(&mut self, to: usize) -> Result<(), ParseError> {
        if to > self.limits.max_frame_len {
            return Err(ParseError::FrameTooLarge);
        }
        self.pos = to;
        self.scan = to;
        Ok(())
    }

    /// Opens a level of `count` elements.
    fn push(&mut self, count: usize, level: Level) -> Result<(), ParseError> {
        if self.depth >= self.limits.max_depth {
            return Err(ParseError::TooDeep);
        }
        self.left[self.depth] = count;
        match level {
            Level::Attribute => self.attr |= 1 << self.depth,
            Level::Aggregate => self.attr &= !(1 << self.depth),
        }
        self.depth += 1;
        Ok(())
    }

    /// One element of the innermost open aggregate is complete: count it, closing every
    /// aggregate it completes. Returns the whole frame when the outermost one closes.
    fn close_element<'a>(&mut self, buf: &'a [u8]) -> Option<(Frame<'a>, usize)> {
        while self.depth > 0 {
            let level = self.depth - 1;
            self.left[level] -= 1;
            if self.left[level] > 0 {
                return None;
            }
            self.depth = level;
            if self.attr & (1 << level) != 0 {
                // An attribute annotates the element after it; it is not an element itself.
                return None;
            }
            if level == 0 {
                let (kind, len, body) = self.top.take()?;
                let frame = Frame::Aggregate(Aggregate {
                    kind,
                    len,
                    body: &buf[body..self.pos],
                });
                return Some((frame, self.pos));
            }
        }
        None
    }
}

/// Reads the line starting at `start`, at most `max_line` bytes long; `scan` is where the CR
/// search may resume. Returns the line's end (index of CR) or None when no CR has arrived yet.
fn line(
    buf: &[u8],
    start: usize,
    scan: usize,
    max_line: usize,
    limits: &Limits,
) -> Result<Result<usize, usize>, ParseError> {
    let from = scan.max(start);
    let limit_end = start.saturating_add(max_line);
    let search_end = buf.len().min(limit_end.saturating_add(1));
    match buf[from.min(search_end)..search_end]
        .iter()
        .position(|&b| b == b'\r')
    {
        Some(offset) => {
            let cr = from + offset;
            if cr > limit_end {
                return Err(ParseError::LineTooLong);
            }
            // Past the frame limit, the frame is refused before its line is looked at: the same
            // answer a caller feeding the bytes in pieces gets when its buffer crosses the limit.
            if cr.saturating_add(CRLF_LEN) > limits.max_frame_len {
                return Err(ParseError::FrameTooLarge);
            }
            match buf.get(cr + 1) {
                None => Ok(Err(cr)),
                Some(b'\n') => Ok(Ok(cr)),
                Some(_) => Err(ParseError::MissingLf),
            }
        }
        // Whichever limit is crossed at the earlier byte wins, as it does for a caller feeding
        // the bytes in pieces (whose partial frame hits `max_frame_len` first when it is lower).
        None if buf.len() > limit_end && limit_end > limits.max_frame_len => {
            Err(ParseError::FrameTooLarge)
        }
        None if buf.len() > limit_end => Err(ParseError::LineTooLong),
        None => Ok(Err(search_end)),
    }
}

/// Parses a decimal `i64` with optional sign, checked.
fn parse_int(digits: &[u8]) -> Result<i64, ParseError> {
    let (negative, digits) = match digits.first() {
        Some(b'-') => (true, &digits[1..]),
        Some(b'+') => (false, &digits[1..]),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return Err(ParseError::InvalidInteger);
    }
    let mut value: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(ParseError::InvalidInteger);
        }
        let digit = i64::from(b - b'0');
        // Accumulate negatively so that i64::MIN is representable.
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_sub(digit))
            .ok_or(ParseError::IntegerOverflow)?;
    }
    if negative {
        Ok(value)
    } else {
        value.checked_neg().ok_or(ParseError::IntegerOverflow)
    }
}

/// A length header: `Ok(None)` for the null marker -1.
fn parse_len(digits: &[u8]) -> Result<Option<usize>, ParseError> {
    if digits == b"?" {
        return Err(ParseError::Streamed);
    }
    match parse_int(digits)? {
        -1 => Ok(None),
        n if n < 0 => Err(ParseError::NegativeLength),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| ParseError::IntegerOverflow),
    }
}

fn text(bytes: &[u8]) -> Result<&str, ParseError> {
    std::str::from_utf8(bytes).map_err(|_| ParseError::NotUtf8)
}

fn parse_double(line: &[u8]) -> Result<f64, ParseError> {
    let s = text(line).map_err(|_| ParseError::InvalidDouble)?;
    match s {
        "inf" | "+inf" => return Ok(f64::INFINITY),
        "-inf" => return Ok(f64::NEG_INFINITY),
        "nan" => return Ok(f64::NAN),
        _ => {}
    }
    // Rust's parser also takes "infinity", "NaN" and the like; RESP does not.
    if s.is_empty()
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'))
    {
        return Err(ParseError::InvalidDouble);
    }
    s.parse().map_err(|_| ParseError::InvalidDouble)
}

fn parse_big_number(line: &[u8]) -> Result<&str, ParseError> {
    let digits = match line.first() {
        Some(b'-' | b'+') => &line[1..],
        _ => line,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ParseError::InvalidBigNumber);
    }
    text(line)
}

/// The replies a lock client gets by the thousand, recognised whole without the general
/// decoder: `+OK` (a `SET` won), `:0` to `:9` (a script's answer), `$-1` and `_` (a `SET`
/// refused). The same frame the general path makes of them (a unit test compares the two), at
/// a few compares instead of a line scan, a UTF-8 check and a number parse (measured with
/// callgrind: about 190 instructions per reply on the general path).
#[inline]
fn common_reply<'a>(buf: &'a [u8], limits: &Limits) -> Option<(Frame<'a>, usize)> {
    // Within any limits the general path would accept them under (lines of 2 bytes at most,
    // frames of 5).
    if limits.max_line_len < 2 || limits.max_frame_len < 5 {
        return None;
    }
    match buf {
        [b'+', b'O', b'K', b'\r', b'\n', ..] => Some((Frame::Simple("OK"), 5)),
        [b':', d @ b'0'..=b'9', b'\r', b'\n', ..] => Some((Frame::Integer(i64::from(d - b'0')), 4)),
        [b'$', b'-', b'1', b'\r', b'\n', ..] => Some((Frame::Null, 5)),
        [b'_', b'\r', b'\n', ..] => Some((Frame::Null, 3)),
        _ => None,
    }
}

/// Decodes the element header at `at` (and the whole element, when it is a scalar).
fn element<'a>(
    buf: &'a [u8],
    at: usize,
    scan: usize,
    limits: &Limits,
) -> Result<Elem<'a>, ParseError> {
    let Some(&ty) = buf.get(at) else {
        return Ok(Elem::Partial { scanned: at });
    };
    // The type byte first, so that an unknown one is reported the same however the input is
    // split (and at once, not after its line arrives).
    check_type(ty)?;
    let start = at + 1;
    let max_line = match ty {
        b'$' | b'=' | b'!' | b'*' | b'%' | b'~' | b'>' | b'|' => {
            limits.max_line_len.min(HEADER_LINE_MAX)
        }
        _ => limits.max_line_len,
    };
    let cr = match line(buf, start, scan, max_line, limits)? {
        Ok(cr) => cr,
        Err(scanned) => return Ok(Elem::Partial { scanned }),
    };
    let content = &buf[start..cr];
    let after = cr + CRLF_LEN;
    let scalar = |frame| Ok(Elem::Scalar(frame, after));
    match ty {
        b'+' => scalar(Frame::Simple(text(content)?)),
        b'-' => scalar(Frame::Error(ServerError {
            kind: ErrorKind::classify(content),
            message: text(content)?,
        })),
        b':' => scalar(Frame::Integer(parse_int(content)?)),
        b'_' if content.is_empty() => scalar(Frame::Null),
        b'_' => Err(ParseError::InvalidNull),
        b',' => scalar(Frame::Double(parse_double(content)?)),
        b'#' => match content {
            b"t" => scalar(Frame::Boolean(true)),
            b"f" => scalar(Frame::Boolean(false)),
            _ => Err(ParseError::InvalidBoolean),
        },
        b'(' => scalar(Frame::BigNumber(parse_big_number(content)?)),
        b'$' | b'=' | b'!' => blob(buf, at, ty, content, after, limits),
        b'*' | b'%' | b'~' | b'>' | b'|' => aggregate_header(ty, content, after, limits),
        other => Err(ParseError::UnknownType(other)),
    }
}

/// Refuses a type byte that starts no RESP2 or RESP3 element.
#[inline]
fn check_type(ty: u8) -> Result<(), ParseError> {
    if matches!(
        ty,
        b'+' | b'-'
            | b':'
            | b'$'
            | b'*'
            | b'_'
            | b','
            | b'#'
            | b'('
            | b'='
            | b'!'
            | b'%'
            | b'~'
            | b'>'
            | b'|'
    ) {
        Ok(())
    } else if ty == b';' {
        Err(ParseError::Streamed)
    } else {
        Err(ParseError::UnknownType(ty))
    }
}

/// The length or count on the header line `content` of a `ty` element: `None` for RESP2's
/// null (`$-1`, `*-1`), which only `null_type` may stand for.
#[inline]
fn header_len(content: &[u8], ty: u8, null_type: u8) -> Result<Option<usize>, ParseError> {
    match parse_len(content)? {
        None if ty != null_type => Err(ParseError::NegativeLength),
        len => Ok(len),
    }
}

/// A length-prefixed element, `$`, `=` or `!` (`<len>\r\n<data>\r\n`), whose header line
/// `content` ends at `after`: the whole element once its data has arrived.
#[inline]
fn blob<'a>(
    buf: &'a [u8],
    at: usize,
    ty: u8,
    content: &[u8],
    after: usize,
    limits: &Limits,
) -> Result<Elem<'a>, ParseError> {
    let Some(len) = header_len(content, ty, b'$')? else {
        return Ok(Elem::Scalar(Frame::Null, after));
    };
    if len > limits.max_bulk_len {
        return Err(ParseError::BulkTooLong);
    }
    let end = after
        .checked_add(len)
        .and_then(|e| e.checked_add(CRLF_LEN))
        .ok_or(ParseError::FrameTooLarge)?;
    if end > limits.max_frame_len {
        return Err(ParseError::FrameTooLarge);
    }
    if buf.len() < end {
        return Ok(Elem::Partial { scanned: at });
    }
    if &buf[end - CRLF_LEN..end] != b"\r\n" {
        return Err(ParseError::BadBulkTerminator);
    }
    let data = &buf[after..end - CRLF_LEN];
    let frame = match ty {
        b'$' => Frame::Bulk(data),
        b'!' => Frame::Error(ServerError {
            kind: ErrorKind::classify(data),
            message: text(data)?,
        }),
        _ => {
            if data.len() <= VERBATIM_FORMAT_LEN || data[VERBATIM_FORMAT_LEN] != b':' {
                return Err(ParseError::InvalidVerbatim);
            }
            Frame::Verbatim {
                format: text(&data[..VERBATIM_FORMAT_LEN])
                    .map_err(|_| ParseError::InvalidVerbatim)?,
                text: &data[VERBATIM_FORMAT_LEN + 1..],
            }
        }
    };
    Ok(Elem::Scalar(frame, end))
}

/// An aggregate header, `*`, `%`, `~`, `>` or `|` (`<count>\r\n`), whose line `content` ends
/// at `after`: its elements follow from there (an empty aggregate is whole at once).
#[inline]
fn aggregate_header<'a>(
    ty: u8,
    content: &[u8],
    after: usize,
    limits: &Limits,
) -> Result<Elem<'a>, ParseError> {
    let Some(count) = header_len(content, ty, b'*')? else {
        return Ok(Elem::Scalar(Frame::Null, after));
    };
    let pairs = matches!(ty, b'%' | b'|');
    let count = if pairs {
        count.checked_mul(2).ok_or(ParseError::TooManyElements)?
    } else {
        count
    };
    if count > limits.max_elements {
        return Err(ParseError::TooManyElements);
    }
    let kind = match ty {
        b'*' => AggregateKind::Array,
        b'%' => AggregateKind::Map,
        b'~' => AggregateKind::Set,
        b'>' => AggregateKind::Push,
        _ => return Ok(Elem::Attribute { count, body: after }),
    };
    if count == 0 {
        let empty = Aggregate {
            kind,
            len: 0,
            body: &[],
        };
        return Ok(Elem::Scalar(Frame::Aggregate(empty), after));
    }
    Ok(Elem::Open {
        kind,
        count,
        body: after,
    })
}

/// An owned RESP value: for tests, fuzzing and callers that want to keep a reply. Not used on
/// the lock client's hot path.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `+`
    Simple(String),
    /// `-` / `!`
    Error(String),
    /// `:`
    Integer(i64),
    /// `$`
    Bulk(Vec<u8>),
    /// `$-1`, `*-1`, `_`
    Null,
    /// `,`
    Double(f64),
    /// `#`
    Boolean(bool),
    /// `(`
    BigNumber(String),
    /// `=`
    Verbatim(String, Vec<u8>),
    /// `*`, `%`, `~`, `>`
    Aggregate(AggregateKind, Vec<Value>),
}

impl Frame<'_> {
    /// Copies the frame into an owned [`Value`].
    pub fn to_value(&self) -> Value {
        match *self {
            Frame::Simple(s) => Value::Simple(s.to_owned()),
            Frame::Error(e) => Value::Error(e.message.to_owned()),
            Frame::Integer(n) => Value::Integer(n),
            Frame::Bulk(b) => Value::Bulk(b.to_vec()),
            Frame::Null => Value::Null,
            Frame::Double(d) => Value::Double(d),
            Frame::Boolean(b) => Value::Boolean(b),
            Frame::BigNumber(s) => Value::BigNumber(s.to_owned()),
            Frame::Verbatim { format, text } => Value::Verbatim(format.to_owned(), text.to_vec()),
            Frame::Aggregate(agg) => {
                Value::Aggregate(agg.kind, agg.iter().map(|f| f.to_value()).collect())
            }
        }
    }
}

impl Value {
    /// Encodes the value in RESP3 (RESP2 for the RESP2 types; `Null` as `_`).
    pub fn encode(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        // Writing to a Vec cannot fail.
        let _ = match self {
            Value::Simple(s) => write!(out, "+{s}\r\n"),
            // A `-` line cannot hold CR or LF; a `!` blob error can.
            Value::Error(s) if s.contains(['\r', '\n']) => write!(out, "!{}\r\n{s}\r\n", s.len()),
            Value::Error(s) => write!(out, "-{s}\r\n"),
            Value::Integer(n) => write!(out, ":{n}\r\n"),
            Value::Bulk(b) => {
                let _ = write!(out, "${}\r\n", b.len());
                out.extend_from_slice(b);
                write!(out, "\r\n")
            }
            Value::Null => write!(out, "_\r\n"),
            Value::Double(d) if d.is_nan() => write!(out, ",nan\r\n"),
            Value::Double(d) if d.is_infinite() && *d > 0.0 => write!(out, ",inf\r\n"),
            Value::Double(d) if d.is_infinite() => write!(out, ",-inf\r\n"),
            Value::Double(d) => write!(out, ",{d:e}\r\n"),
            Value::Boolean(b) => write!(out, "#{}\r\n", if *b { 't' } else { 'f' }),
            Value::BigNumber(s) => write!(out, "({s}\r\n"),
            Value::Verbatim(format, text) => {
                let _ = write!(
                    out,
                    "={}\r\n{format}:",
                    VERBATIM_FORMAT_LEN + 1 + text.len()
                );
                out.extend_from_slice(text);
                write!(out, "\r\n")
            }
            Value::Aggregate(kind, items) => {
                let (ty, count) = match kind {
                    AggregateKind::Array => ('*', items.len()),
                    AggregateKind::Map => ('%', items.len() / 2),
                    AggregateKind::Set => ('~', items.len()),
                    AggregateKind::Push => ('>', items.len()),
                };
                let _ = write!(out, "{ty}{count}\r\n");
                for item in items {
                    item.encode(out);
                }
                Ok(())
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general path alone, as before the shortcut.
    fn general(buf: &[u8], limits: Limits) -> Result<Status<(Frame<'_>, usize)>, ParseError> {
        Decoder::new(limits).run(buf)
    }

    #[test]
    fn common_replies_decode_as_the_general_path_decodes_them() {
        let mut replies: Vec<Vec<u8>> = vec![b"+OK\r\n".to_vec(), b"$-1\r\n".to_vec()];
        replies.push(b"_\r\n".to_vec());
        replies.extend((0..10).map(|d| format!(":{d}\r\n").into_bytes()));
        for reply in &replies {
            // Alone, followed by the next reply, and cut short (then not taken by the shortcut).
            let mut followed = reply.clone();
            followed.extend_from_slice(b":1\r\n");
            for buf in [&reply[..], &followed[..]] {
                let fast = common_reply(buf, &Limits::DEFAULT).expect("a common reply");
                assert_eq!(
                    general(buf, Limits::DEFAULT).unwrap(),
                    Status::Complete(fast),
                    "{buf:?}"
                );
                assert_eq!(
                    Decoder::default().decode(buf).unwrap(),
                    Status::Complete(fast)
                );
            }
            for cut in 0..reply.len() {
                assert_eq!(common_reply(&reply[..cut], &Limits::DEFAULT), None);
                assert_eq!(
                    Decoder::default().decode(&reply[..cut]).unwrap(),
                    Status::Partial
                );
            }
        }
        // Look-alikes go the general way.
        for other in [
            &b"+OKAY\r\n"[..],
            b":10\r\n",
            b":-1\r\n",
            b"$-10\r\n",
            b"+OK\n",
        ] {
            assert_eq!(common_reply(other, &Limits::DEFAULT), None, "{other:?}");
        }
        // Limits too tight for them leave them to the general path, which refuses them.
        let tight = Limits {
            max_line_len: 1,
            ..Limits::DEFAULT
        };
        assert_eq!(common_reply(b"+OK\r\n", &tight), None);
        assert_eq!(
            Decoder::new(tight).decode(b"+OK\r\n"),
            general(b"+OK\r\n", tight)
        );
        assert!(general(b"+OK\r\n", tight).is_err());
    }

    #[test]
    fn a_common_reply_after_a_partial_one_starts_clean() {
        let mut decoder = Decoder::default();
        assert_eq!(decoder.decode(b"+O").unwrap(), Status::Partial);
        // The bytes were dropped (a new connection): a shorter, complete buffer.
        assert_eq!(
            decoder.decode(b":1\r\n").unwrap(),
            Status::Complete((Frame::Integer(1), 4))
        );
        assert_eq!(decoder.progress(), 0);
        assert!(matches!(
            decoder.decode(b"*1\r\n:2\r\n"),
            Ok(Status::Complete((Frame::Aggregate(_), 8)))
        ));
    }
}
