//! Differential fuzzing of our decoder (`resp::decode`, `Limits::DEFAULT`) against the
//! `redis-protocol` crate: its RESP3 decoder (`resp3::decode::complete::decode`) on every input,
//! and its RESP2 decoder (`resp2::decode::decode`) too when the first byte is a RESP2 type byte.
//! The input is raw RESP; only the first frame is compared.
//!
//! - Both accept: the consumed length must be equal and the values equal (maps and sets compared
//!   as sorted entries; attributes ignored, since we skip them).
//! - One accepts, the other does not: allowed only for the intentional differences below, each
//!   checked against a witness (a feature of the frame we accepted, or the kind of our error and
//!   a feature of the input); anything else fails. A partial frame on one side while the other
//!   completes always fails.
//!
//! INTENTIONAL DIFFERENCES (also listed in `fuzz/README.md`):
//!
//! We accept, redis-protocol rejects:
//! 1. RESP2 nulls `$-1` / `*-1` anywhere (our decoder speaks RESP2 and RESP3 on one connection;
//!    its RESP3 decoder reads `-1` as a streamed `?` header and refuses it), and RESP3 types in
//!    a RESP2-looking frame (its RESP2 decoder knows only `+ - : $ *`).
//! 2. `-0` (any signed zero) as the length of `>`, `|`, `!`, `=` (it parses those as `usize`).
//! 3. An attribute followed by another attribute or by a null (it attaches attributes to the next
//!    frame and cannot attach them to a null or an attribute; we skip attributes).
//! 4. Verbatim formats other than `txt` / `mkd` (any three UTF-8 bytes for us).
//! 5. Aggregates as map keys or set members, in maps, sets and attributes (it hashes keys).
//!
//! redis-protocol accepts, we reject (strictness and limits):
//! 6. `HELLO ...` lines (`H`), streamed frames (`$?`, `*?`, `%?`, `~?`, `;` chunks, `.` end):
//!    `UnknownType` / `Streamed`.
//! 7. A bulk, blob error or verbatim payload not followed by CRLF (it skips any two bytes):
//!    `BadBulkTerminator`.
//! 8. A CR not followed by LF inside a line (it reads up to the first CRLF): `MissingLf`.
//! 9. Non-UTF-8 simple strings, blob errors and verbatim formats (it keeps bytes): `NotUtf8`,
//!    `InvalidVerbatim`.
//! 10. Doubles that Rust's `f64` parser takes but RESP does not (`infinity`, `NaN`, `-nan`,
//!     `+infinity`, ...): `InvalidDouble`. Nulls with data (`_x`): `InvalidNull`. Big numbers
//!     that are not digits: `InvalidBigNumber`. Verbatim strings whose 4th byte is not `:`:
//!     `InvalidVerbatim`.
//! 11. Limits (`Limits::DEFAULT`): depth > 64, more than 2^20 elements, 512 MiB bulk or frame,
//!     64 KiB line.
//!
//! Values are not compared (the consumed length still is) when a map or set has duplicate keys:
//! redis-protocol keeps one entry per key in a `HashMap` (which value survives depends on hashing),
//! we keep every entry in wire order.
//!
//! redis-protocol recurses once per nesting level, so inputs with more than 256 aggregate type
//! bytes are decoded by us alone (we reject them as too deep or decode them without recursion).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_protocol::resp2::types::OwnedFrame as Frame2;
use redis_protocol::resp3::types::{OwnedFrame as Frame3, VerbatimStringFormat};
use redis_protocol::{resp2, resp3};
use redlock_mux::resp::{self, AggregateKind, Limits, ParseError, Status, Value};
use std::fmt::Write;

fuzz_target!(|data: &[u8]| {
    check(data);
});

/// One decoder's verdict on the first frame: canonical text and consumed length, or not accepted.
#[derive(Debug)]
enum Verdict<E> {
    Complete(String, usize),
    Partial,
    Rejected(E),
}

fn check(data: &[u8]) {
    let ours = match resp::decode(data, &Limits::DEFAULT) {
        Ok(Status::Complete((frame, used))) => {
            let mut text = String::new();
            let dups = canon_ours(&frame.to_value(), &mut text);
            Ok(Some((text, used, dups)))
        }
        Ok(Status::Partial) => Ok(None),
        Err(e) => Err(e),
    };
    if data.iter().filter(|b| b"*%~>|".contains(b)).count() > 256 {
        return;
    }

    let theirs3 = match resp3::decode::complete::decode(data) {
        Ok(Some((frame, used))) => {
            let mut text = String::new();
            canon3(&frame, &mut text);
            Verdict::Complete(text, used)
        }
        Ok(None) => Verdict::Partial,
        Err(e) => Verdict::Rejected(e),
    };
    let resp2_first = matches!(data.first(), Some(b'+' | b'-' | b':' | b'$' | b'*'));
    let theirs2 = resp2_first.then(|| match resp2::decode::decode(data) {
        Ok(Some((frame, used))) => {
            let mut text = String::new();
            canon2(&frame, &mut text);
            Verdict::Complete(text, used)
        }
        Ok(None) => Verdict::Partial,
        Err(e) => Verdict::Rejected(e),
    });
    let context = || {
        format!(
            "input {:?}\n ours:  {ours:?}\n resp3: {theirs3:?}\n resp2: {theirs2:?}",
            data.escape_ascii().to_string()
        )
    };

    match &ours {
        Ok(Some((text, used, dups))) => {
            let mut matched = false;
            for theirs in std::iter::once(&theirs3).chain(theirs2.as_ref()) {
                if let Verdict::Complete(their_text, their_used) = theirs {
                    matched = true;
                    assert_eq!(used, their_used, "consumed length differs: {}", context());
                    if !dups {
                        assert_eq!(text, their_text, "value differs: {}", context());
                    }
                }
            }
            if !matched {
                // Both of theirs refused or want more bytes: a partial answer for a frame we
                // completed is always a bug; a rejection needs one of the documented reasons.
                assert!(
                    !std::iter::once(&theirs3)
                        .chain(theirs2.as_ref())
                        .any(|v| matches!(v, Verdict::Partial)),
                    "redis-protocol partial on a frame we completed: {}",
                    context()
                );
                let features = Features::scan(&data[..*used]);
                let resp3_explained = features.resp2_null
                    || features.minus_zero_unsigned_len
                    || features.attribute_before_unattributable
                    || features.other_verbatim_format
                    || features.unhashable_key;
                let resp2_explained = !resp2_first || features.resp3_only;
                assert!(
                    resp3_explained && resp2_explained,
                    "we accept, redis-protocol rejects, no documented reason ({features:?}): {}",
                    context()
                );
            }
        }
        ours => {
            for theirs in std::iter::once(&theirs3).chain(theirs2.as_ref()) {
                if let Verdict::Complete(..) = theirs {
                    let explained = match ours {
                        Ok(_) => false,
                        Err(e) => intentional_rejection(*e, data),
                    };
                    assert!(
                        explained,
                        "redis-protocol accepts, we do not, no documented reason: {}",
                        context()
                    );
                }
            }
        }
    }
}

/// Whether our error is one of the documented strict rejections (6-11), with a witness in `data`.
fn intentional_rejection(error: ParseError, data: &[u8]) -> bool {
    let has = |b: u8| data.contains(&b);
    match error {
        ParseError::UnknownType(t) => t == b'H' || t == b'.',
        ParseError::Streamed => has(b'?') || has(b';'),
        ParseError::BadBulkTerminator => has(b'$') || has(b'!') || has(b'='),
        ParseError::MissingLf => data.windows(2).any(|w| w[0] == b'\r' && w[1] != b'\n'),
        ParseError::NotUtf8 => std::str::from_utf8(data).is_err(),
        ParseError::InvalidVerbatim => has(b'='),
        ParseError::InvalidDouble => line_with(data, b',', |l| {
            !matches!(l, b"inf" | b"+inf" | b"-inf" | b"nan")
                && l.iter().any(|b| !b"0123456789+-.eE".contains(b))
        }),
        ParseError::InvalidNull => line_with(data, b'_', |l| !l.is_empty()),
        ParseError::InvalidBigNumber => line_with(data, b'(', |l| {
            let digits = l.strip_prefix(b"-").or(l.strip_prefix(b"+")).unwrap_or(l);
            digits.is_empty() || !digits.iter().all(u8::is_ascii_digit)
        }),
        ParseError::BulkTooLong
        | ParseError::TooManyElements
        | ParseError::TooDeep
        | ParseError::FrameTooLarge
        | ParseError::LineTooLong => true,
        _ => false,
    }
}

/// Whether some CRLF-separated piece of `data` starts with `ty` and the rest of it satisfies `bad`
/// (a loose witness: pieces of bulk payloads count too).
fn line_with(data: &[u8], ty: u8, bad: impl Fn(&[u8]) -> bool) -> bool {
    let mut rest = data;
    loop {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .unwrap_or(rest.len());
        if let Some((&first, line)) = rest[..end].split_first()
            && first == ty
            && bad(line)
        {
            return true;
        }
        if end + 2 > rest.len() {
            return false;
        }
        rest = &rest[end + 2..];
    }
}

/// Features of a frame that our decoder accepted, found by walking its bytes.
#[derive(Debug, Default)]
struct Features {
    /// `$-1` or `*-1` somewhere.
    resp2_null: bool,
    /// A type byte other than `+ - : $ *`.
    resp3_only: bool,
    /// A `>`, `|`, `!` or `=` length written with a minus sign (`-0`).
    minus_zero_unsigned_len: bool,
    /// An attribute directly followed by an attribute or a null.
    attribute_before_unattributable: bool,
    /// A verbatim format other than `txt` / `mkd`.
    other_verbatim_format: bool,
    /// An aggregate as a map or attribute key or as a set member.
    unhashable_key: bool,
}

impl Features {
    fn scan(frame: &[u8]) -> Features {
        let mut features = Features::default();
        let mut pos = 0;
        features.element(frame, &mut pos);
        features
    }

    /// Reads the header line at `pos`: type byte and line content; moves `pos` past the CRLF.
    fn header<'a>(bytes: &'a [u8], pos: &mut usize) -> (u8, &'a [u8]) {
        let ty = bytes[*pos];
        let start = *pos + 1;
        let cr = start
            + bytes[start..]
                .iter()
                .position(|&b| b == b'\r')
                .expect("validated frame has a CRLF");
        *pos = cr + 2;
        (ty, &bytes[start..cr])
    }

    fn length(line: &[u8]) -> i64 {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("validated length")
    }

    /// The type byte of the element at `pos`, after any attributes in front of it.
    fn real_type(bytes: &[u8], pos: usize) -> u8 {
        let mut probe = Features::default();
        let mut at = pos;
        while bytes[at] == b'|' {
            let (_, line) = Features::header(bytes, &mut at);
            for _ in 0..Features::length(line) * 2 {
                probe.element(bytes, &mut at);
            }
        }
        bytes[at]
    }

    /// Walks one element (an attribute together with the element it annotates).
    fn element(&mut self, bytes: &[u8], pos: &mut usize) {
        let (ty, line) = Features::header(bytes, pos);
        if !matches!(ty, b'+' | b'-' | b':' | b'$' | b'*') {
            self.resp3_only = true;
        }
        match ty {
            b'$' | b'=' | b'!' => {
                let len = Features::length(line);
                if len == -1 {
                    self.resp2_null = true;
                    return;
                }
                if ty != b'$' && line.first() == Some(&b'-') {
                    self.minus_zero_unsigned_len = true;
                }
                let len = usize::try_from(len).expect("validated length");
                if ty == b'=' && !matches!(&bytes[*pos..*pos + 3], b"txt" | b"mkd") {
                    self.other_verbatim_format = true;
                }
                *pos += len + 2;
            }
            b'*' | b'%' | b'~' | b'>' | b'|' => {
                let count = Features::length(line);
                if count == -1 {
                    self.resp2_null = true;
                    return;
                }
                if matches!(ty, b'>' | b'|') && line.first() == Some(&b'-') {
                    self.minus_zero_unsigned_len = true;
                }
                let pairs = matches!(ty, b'%' | b'|');
                let elements = if pairs { count * 2 } else { count };
                for i in 0..elements {
                    let key = (pairs && i % 2 == 0) || ty == b'~';
                    if key && matches!(Features::real_type(bytes, *pos), b'*' | b'%' | b'~' | b'>')
                    {
                        self.unhashable_key = true;
                    }
                    self.element(bytes, pos);
                }
                if ty == b'|' {
                    let next = bytes[*pos];
                    let null = next == b'_' || bytes[*pos..].starts_with(b"$-1\r\n");
                    let null = null || bytes[*pos..].starts_with(b"*-1\r\n");
                    if next == b'|' || null {
                        self.attribute_before_unattributable = true;
                    }
                    self.element(bytes, pos);
                }
            }
            _ => {}
        }
    }
}

fn escaped(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// Writes `items` sorted (for maps and sets); returns whether two were equal.
fn write_sorted(mut items: Vec<String>, open: &str, out: &mut String) -> bool {
    items.sort();
    let dups = items.windows(2).any(|w| w[0] == w[1]);
    let _ = write!(out, "{open}{{{}}}", items.join(", "));
    dups
}

/// Canonical text of our value; returns whether some map or set had duplicate keys.
fn canon_ours(value: &Value, out: &mut String) -> bool {
    let _ = match value {
        Value::Simple(s) => write!(out, "Simple({})", escaped(s.as_bytes())),
        Value::Error(s) => write!(out, "Error({})", escaped(s.as_bytes())),
        Value::Integer(n) => write!(out, "Integer({n})"),
        Value::Bulk(b) => write!(out, "Bulk({})", escaped(b)),
        Value::Null => write!(out, "Null"),
        Value::Double(d) => write!(out, "Double({d:?})"),
        Value::Boolean(b) => write!(out, "Boolean({b})"),
        Value::BigNumber(s) => write!(out, "Big({})", escaped(s.as_bytes())),
        Value::Verbatim(format, text) => write!(out, "Verbatim({format}:{})", escaped(text)),
        Value::Aggregate(kind, items) => {
            let mut dups = false;
            let mut texts: Vec<String> = items
                .iter()
                .map(|item| {
                    let mut text = String::new();
                    dups |= canon_ours(item, &mut text);
                    text
                })
                .collect();
            return match kind {
                AggregateKind::Array | AggregateKind::Push => {
                    let open = if *kind == AggregateKind::Array {
                        "Array"
                    } else {
                        "Push"
                    };
                    let _ = write!(out, "{open}[{}]", texts.join(", "));
                    dups
                }
                AggregateKind::Set => write_sorted(texts, "Set", out) | dups,
                AggregateKind::Map => {
                    let keys: Vec<String> = texts.iter().step_by(2).cloned().collect();
                    let mut sorted_keys = keys.clone();
                    sorted_keys.sort();
                    dups |= sorted_keys.windows(2).any(|w| w[0] == w[1]);
                    let values = texts.split_off(0).into_iter().skip(1).step_by(2);
                    let entries = keys
                        .into_iter()
                        .zip(values)
                        .map(|(k, v)| format!("{k} => {v}"))
                        .collect();
                    write_sorted(entries, "Map", out) | dups
                }
            };
        }
    };
    false
}

/// Canonical text of a redis-protocol RESP3 frame (attributes ignored).
fn canon3(frame: &Frame3, out: &mut String) {
    let text = |f: &Frame3| {
        let mut s = String::new();
        canon3(f, &mut s);
        s
    };
    let _ = match frame {
        Frame3::BlobString { data, .. } => write!(out, "Bulk({})", escaped(data)),
        Frame3::BlobError { data, .. } => write!(out, "Error({})", escaped(data)),
        Frame3::SimpleString { data, .. } => write!(out, "Simple({})", escaped(data)),
        Frame3::SimpleError { data, .. } => write!(out, "Error({})", escaped(data.as_bytes())),
        Frame3::Boolean { data, .. } => write!(out, "Boolean({data})"),
        Frame3::Null => write!(out, "Null"),
        Frame3::Number { data, .. } => write!(out, "Integer({data})"),
        Frame3::Double { data, .. } => write!(out, "Double({data:?})"),
        Frame3::BigNumber { data, .. } => write!(out, "Big({})", escaped(data)),
        Frame3::VerbatimString { data, format, .. } => {
            let format = match format {
                VerbatimStringFormat::Text => "txt",
                VerbatimStringFormat::Markdown => "mkd",
            };
            write!(out, "Verbatim({format}:{})", escaped(data))
        }
        Frame3::Array { data, .. } => {
            let items: Vec<String> = data.iter().map(text).collect();
            write!(out, "Array[{}]", items.join(", "))
        }
        Frame3::Push { data, .. } => {
            let items: Vec<String> = data.iter().map(text).collect();
            write!(out, "Push[{}]", items.join(", "))
        }
        Frame3::Set { data, .. } => {
            write_sorted(data.iter().map(text).collect(), "Set", out);
            Ok(())
        }
        Frame3::Map { data, .. } => {
            let entries = data
                .iter()
                .map(|(k, v)| format!("{} => {}", text(k), text(v)))
                .collect();
            write_sorted(entries, "Map", out);
            Ok(())
        }
        Frame3::Hello { .. } => write!(out, "Hello"),
        Frame3::ChunkedString(data) => write!(out, "Chunked({})", escaped(data)),
    };
}

/// Canonical text of a redis-protocol RESP2 frame.
fn canon2(frame: &Frame2, out: &mut String) {
    let _ = match frame {
        Frame2::SimpleString(data) => write!(out, "Simple({})", escaped(data)),
        Frame2::Error(data) => write!(out, "Error({})", escaped(data.as_bytes())),
        Frame2::Integer(n) => write!(out, "Integer({n})"),
        Frame2::BulkString(data) => write!(out, "Bulk({})", escaped(data)),
        Frame2::Null => write!(out, "Null"),
        Frame2::Array(items) => {
            let items: Vec<String> = items
                .iter()
                .map(|f| {
                    let mut s = String::new();
                    canon2(f, &mut s);
                    s
                })
                .collect();
            write!(out, "Array[{}]", items.join(", "))
        }
    };
}
