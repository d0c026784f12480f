//! The checks of the `decode` fuzz target (feature `fuzzing`, hidden: not part of the API),
//! shared with `tests/fuzz_corpus.rs`, so that every corpus and regression input is replayed by
//! `cargo test`. They live in the crate, behind a feature, so that the fuzz target and the test
//! share them as code of a crate both depend on, not as a file included twice.
//!
//! Input layout (so that the fuzzer controls the limits and the chunking as well as the bytes):
//!
//! ```text
//! byte 0      bits 0-1: limits profile (DEFAULT, CLIENT, SMALL, TINY)
//!             bits 2-4: n, the number of chunk-size bytes that follow (0 = feed byte by byte)
//! bytes 1..=n chunk sizes, each `b + 1`, used in a cycle
//! the rest    the RESP byte stream
//! ```
//!
//! Checks, for every input:
//! - nothing panics;
//! - decoding the stream whole (a fresh decode per frame, until `Partial` or an error) and in
//!   chunks (ONE resumable `Decoder` fed a growing buffer, consumed bytes dropped after each
//!   frame) give the same frames (`to_value()`, compared by `Debug` because NaN != NaN), the same
//!   consumed lengths and the same final outcome (`Partial` or the same error);
//! - every consumed length is non-zero and within the buffer;
//! - every aggregate yields exactly `len()` elements when iterated (the lazy iterator would
//!   otherwise end early silently);
//! - `Value::encode` of each frame decodes back to the same value, consuming all of it;
//! - under a tighter profile, decoding with `Limits::DEFAULT` gives the same answer unless a
//!   limit was exceeded.
#![allow(missing_docs)]

use crate::proto::resp::{self, Decoder, Frame, Limits, MAX_DEPTH_CAP, ParseError, Status};

/// Small limits, so that every limit check is reachable with fuzzer-sized inputs.
pub const SMALL: Limits = Limits {
    max_bulk_len: 64,
    max_elements: 16,
    max_depth: 8,
    max_frame_len: 512,
    max_line_len: 32,
};

/// Tiny limits: almost everything is over one of them.
pub const TINY: Limits = Limits {
    max_bulk_len: 4,
    max_elements: 2,
    max_depth: 2,
    max_frame_len: 24,
    max_line_len: 4,
};

/// Limits for re-decoding an encoded value (attributes were dropped and nulls shortened, so it
/// never exceeds the original; depth is the only limit that could bind, so it is maxed out).
const REENCODED: Limits = Limits {
    max_depth: MAX_DEPTH_CAP,
    ..Limits::DEFAULT
};

/// A fuzz input split into its parts.
pub struct Input<'a> {
    /// Limits for both decodes.
    pub limits: Limits,
    /// Chunk sizes (cycled); empty means one byte at a time.
    pub chunks: Vec<usize>,
    /// The RESP stream.
    pub wire: &'a [u8],
}

impl<'a> Input<'a> {
    /// Splits raw fuzzer bytes; an empty input is an empty stream with default limits.
    pub fn parse(data: &'a [u8]) -> Input<'a> {
        let Some((&control, rest)) = data.split_first() else {
            return Input {
                limits: Limits::DEFAULT,
                chunks: Vec::new(),
                wire: data,
            };
        };
        let limits = match control & 3 {
            0 => Limits::DEFAULT,
            1 => Limits::CLIENT,
            2 => SMALL,
            _ => TINY,
        };
        let n = usize::from((control >> 2) & 7).min(rest.len());
        let (sizes, wire) = rest.split_at(n);
        Input {
            limits,
            chunks: sizes.iter().map(|&b| usize::from(b) + 1).collect(),
            wire,
        }
    }
}

/// One decoded frame: its value's `Debug` text and the bytes it consumed.
pub type Decoded = (String, usize);

/// How a stream ends: partial (including empty) or an error.
pub type End = Result<(), ParseError>;

/// Checks one complete frame on its own: aggregate lengths and the encode/decode round trip.
fn check_frame(frame: &Frame<'_>, consumed: usize, available: usize) -> String {
    assert!(consumed > 0, "a complete frame consumed nothing");
    assert!(
        consumed <= available,
        "consumed {consumed} of {available} bytes"
    );
    check_aggregate_lengths(frame);
    let value = frame.to_value();
    let text = format!("{value:?}");
    let mut encoded = Vec::new();
    value.encode(&mut encoded);
    match resp::decode(&encoded, &REENCODED) {
        Ok(Status::Complete((again, used))) => {
            assert_eq!(used, encoded.len(), "re-encoded {text} not consumed whole");
            assert_eq!(
                format!("{:?}", again.to_value()),
                text,
                "re-encoded value differs: {:?}",
                String::from_utf8_lossy(&encoded)
            );
        }
        other => panic!(
            "re-encoded {text} does not decode: {other:?} from {:?}",
            String::from_utf8_lossy(&encoded)
        ),
    }
    text
}

fn check_aggregate_lengths(frame: &Frame<'_>) {
    if let Frame::Aggregate(agg) = frame {
        let mut n = 0;
        for element in agg.iter() {
            check_aggregate_lengths(&element);
            n += 1;
        }
        assert_eq!(n, agg.len(), "aggregate iterated fewer elements than len()");
    }
}

/// Decodes `wire` frame by frame with a fresh decode each time, until partial or an error.
pub fn decode_whole(wire: &[u8], limits: &Limits) -> (Vec<Decoded>, End) {
    let mut frames = Vec::new();
    let mut rest = wire;
    loop {
        let result = resp::decode(rest, limits);
        if *limits != Limits::DEFAULT {
            check_looser_limits(rest, &result);
        }
        match result {
            Ok(Status::Complete((frame, used))) => {
                frames.push((check_frame(&frame, used, rest.len()), used));
                rest = &rest[used..];
            }
            Ok(Status::Partial) => return (frames, Ok(())),
            Err(e) => return (frames, Err(e)),
        }
    }
}

/// Every profile's limits are within `Limits::DEFAULT`, so decoding the same bytes with the
/// defaults must give the same frame, the same `Partial`, or the same error, unless the tighter
/// limits were exceeded.
fn check_looser_limits(buf: &[u8], tight: &Result<Status<(Frame<'_>, usize)>, ParseError>) {
    let loose = resp::decode(buf, &Limits::DEFAULT);
    let summary = |r: &Result<Status<(Frame<'_>, usize)>, ParseError>| match r {
        Ok(Status::Complete((frame, used))) => Ok(Some((format!("{:?}", frame.to_value()), *used))),
        Ok(Status::Partial) => Ok(None),
        Err(e) => Err(*e),
    };
    let over_limit = matches!(
        tight,
        Err(ParseError::BulkTooLong
            | ParseError::TooManyElements
            | ParseError::TooDeep
            | ParseError::FrameTooLarge
            | ParseError::LineTooLong)
    );
    if !over_limit {
        assert_eq!(
            summary(tight),
            summary(&loose),
            "tight limits vs Limits::DEFAULT on {:?}",
            buf.escape_ascii().to_string()
        );
    }
}

/// Feeds `wire` to one resumable decoder in chunks, dropping consumed bytes after each frame.
pub fn decode_chunked(wire: &[u8], limits: &Limits, chunks: &[usize]) -> (Vec<Decoded>, End) {
    let mut decoder = Decoder::new(*limits);
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut next_chunk = 0;
    let mut frames = Vec::new();
    loop {
        match decoder.decode(&buf) {
            Ok(Status::Complete((frame, used))) => {
                frames.push((check_frame(&frame, used, buf.len()), used));
                assert_eq!(decoder.progress(), 0, "state left after a complete frame");
                buf.drain(..used);
            }
            Ok(Status::Partial) => {
                assert!(decoder.progress() <= buf.len(), "progress past the buffer");
                if fed == wire.len() {
                    return (frames, Ok(()));
                }
                let size = if chunks.is_empty() {
                    1
                } else {
                    let size = chunks[next_chunk % chunks.len()];
                    next_chunk += 1;
                    size
                };
                let end = wire.len().min(fed + size);
                buf.extend_from_slice(&wire[fed..end]);
                fed = end;
            }
            Err(e) => return (frames, Err(e)),
        }
    }
}

/// The whole check of the `decode` target for one raw fuzzer input.
pub fn check_decode(data: &[u8]) {
    let input = Input::parse(data);
    let whole = decode_whole(input.wire, &input.limits);
    let chunked = decode_chunked(input.wire, &input.limits, &input.chunks);
    // The same frames and the same final error or partial, however the input is split.
    assert!(
        whole == chunked,
        "whole vs chunked (chunks {:?}, limits {:?}):\n whole:   {whole:?}\n chunked: {chunked:?}",
        input.chunks,
        input.limits
    );
}
