//! RESP decode and encode: our codec vs redis-rs (`redis::parse_redis_value`, `Cmd`) vs the
//! `redis-protocol` crate (RESP2 decoder and encoder), on the replies and the command a lock
//! client actually sees.
//!
//! Decode variants per input (one group per input):
//! - `ours`: one `Decoder` reused across iterations, as a connection keeps one; the frame borrows
//!   from the input (no copy);
//! - `ours_to_value`: the same plus `Frame::to_value()`, an owned copy like the others return;
//! - `ours_fresh`: the free function `resp::decode` (a new `Decoder` per call);
//! - `redis_rs`: `redis::parse_redis_value` (owned `redis::Value`);
//! - `redis_protocol`: `redis_protocol::resp2::decode::decode` (owned `OwnedFrame`).
//!
//! Encode of `SET lock:resource <27-char token> NX PX 30000`:
//! - `ours`: `encode_command` into a `BytesMut` cleared each iteration;
//! - `redis_rs`: `redis::cmd("SET").arg(..)...get_packed_command()` (a new `Cmd` and `Vec`);
//! - `redis_rs_reused`: a prebuilt `Cmd`, `write_packed_command` into a cleared `Vec`;
//! - `redis_protocol`: `resp2::encode::encode_borrowed` of a borrowed array frame into a reused
//!   buffer (the TTL as an integer encoded as a bulk string).
//!
//! Run: `cargo bench --bench resp -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redis_protocol::resp2::types::{BorrowedFrame, OwnedFrame};
use redlock_mux::resp::{self, Arg, Decoder, Frame, Limits, Status, Value};

const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
const TOKEN: &str = "q3kT9vQm2xZp7Lr4Wn8Yb1Hc6Df";
const SET_WIRE: &[u8] = b"*6\r\n$3\r\nSET\r\n$13\r\nlock:resource\r\n$27\r\nq3kT9vQm2xZp7Lr4Wn8Yb1Hc6Df\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n";

/// One small reply: wire bytes and checks of each decoder's answer.
struct Reply {
    name: &'static str,
    wire: &'static [u8],
    ours: fn(&Frame<'_>) -> bool,
    redis_rs: fn(&redis::Value) -> bool,
    redis_protocol: fn(&OwnedFrame) -> bool,
}

fn replies() -> [Reply; 5] {
    [
        Reply {
            name: "simple_ok",
            wire: b"+OK\r\n",
            ours: |f| matches!(f, Frame::Simple("OK")),
            redis_rs: |v| matches!(v, redis::Value::Okay),
            redis_protocol: |f| matches!(f, OwnedFrame::SimpleString(s) if s == b"OK"),
        },
        Reply {
            name: "null_bulk",
            wire: b"$-1\r\n",
            ours: |f| matches!(f, Frame::Null),
            redis_rs: |v| matches!(v, redis::Value::Nil),
            redis_protocol: |f| matches!(f, OwnedFrame::Null),
        },
        Reply {
            name: "integer_1",
            wire: b":1\r\n",
            ours: |f| matches!(f, Frame::Integer(1)),
            redis_rs: |v| matches!(v, redis::Value::Int(1)),
            redis_protocol: |f| matches!(f, OwnedFrame::Integer(1)),
        },
        Reply {
            name: "integer_0",
            wire: b":0\r\n",
            ours: |f| matches!(f, Frame::Integer(0)),
            redis_rs: |v| matches!(v, redis::Value::Int(0)),
            redis_protocol: |f| matches!(f, OwnedFrame::Integer(0)),
        },
        Reply {
            name: "error_noscript",
            wire: b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            ours: |f| matches!(f, Frame::Error(e) if e.message == NOSCRIPT),
            redis_rs: |v| matches!(v, redis::Value::ServerError(e) if e.code() == "NOSCRIPT"),
            redis_protocol: |f| matches!(f, OwnedFrame::Error(e) if e == NOSCRIPT),
        },
    ]
}

fn decode_small(c: &mut Criterion) {
    for reply in replies() {
        let wire = reply.wire;
        let len = wire.len();
        let mut group = c.benchmark_group(format!("decode/{}", reply.name));
        let mut decoder = Decoder::new(Limits::CLIENT);
        group.bench_function("ours", |b| {
            b.iter(|| match decoder.decode(black_box(wire)) {
                Ok(Status::Complete((frame, used))) => {
                    assert!(used == len && (reply.ours)(&frame));
                    black_box(frame);
                }
                other => panic!("{other:?}"),
            })
        });
        group.bench_function("ours_to_value", |b| {
            b.iter(|| match decoder.decode(black_box(wire)) {
                Ok(Status::Complete((frame, used))) => {
                    assert!(used == len && (reply.ours)(&frame));
                    black_box(frame.to_value());
                }
                other => panic!("{other:?}"),
            })
        });
        group.bench_function("ours_fresh", |b| {
            b.iter(|| match resp::decode(black_box(wire), &Limits::CLIENT) {
                Ok(Status::Complete((frame, used))) => {
                    assert!(used == len && (reply.ours)(&frame));
                    black_box(frame);
                }
                other => panic!("{other:?}"),
            })
        });
        group.bench_function("redis_rs", |b| {
            b.iter(|| {
                let value = redis::parse_redis_value(black_box(wire)).expect("redis-rs parses");
                assert!((reply.redis_rs)(&value), "{value:?}");
                black_box(value);
            })
        });
        group.bench_function("redis_protocol", |b| {
            b.iter(|| {
                let (frame, used) = redis_protocol::resp2::decode::decode(black_box(wire))
                    .expect("redis-protocol parses")
                    .expect("complete");
                assert!(used == len && (reply.redis_protocol)(&frame), "{frame:?}");
                black_box(frame);
            })
        });
        group.finish();
    }
}

fn decode_large_array(c: &mut Criterion) {
    const N: usize = 10_000;
    let mut wire = format!("*{N}\r\n").into_bytes();
    for i in 0..N {
        let item = format!("value-{i:06}");
        wire.extend_from_slice(format!("${}\r\n{item}\r\n", item.len()).as_bytes());
    }
    let wire = &wire[..];
    let len = wire.len();
    let mut group = c.benchmark_group("decode/array_10k_bulk");
    group.throughput(Throughput::Bytes(len as u64));
    let mut decoder = Decoder::new(Limits::DEFAULT);
    group.bench_function("ours", |b| {
        b.iter(|| match decoder.decode(black_box(wire)) {
            Ok(Status::Complete((Frame::Aggregate(agg), used))) => {
                assert!(used == len && agg.len() == N);
                black_box(agg);
            }
            other => panic!("{other:?}"),
        })
    });
    group.bench_function("ours_to_value", |b| {
        b.iter(|| match decoder.decode(black_box(wire)) {
            Ok(Status::Complete((frame, used))) => {
                let value = frame.to_value();
                assert!(used == len && matches!(&value, Value::Aggregate(_, v) if v.len() == N));
                black_box(value);
            }
            other => panic!("{other:?}"),
        })
    });
    group.bench_function("redis_rs", |b| {
        b.iter(|| {
            let value = redis::parse_redis_value(black_box(wire)).expect("redis-rs parses");
            assert!(matches!(&value, redis::Value::Array(v) if v.len() == N));
            black_box(value);
        })
    });
    group.bench_function("redis_protocol", |b| {
        b.iter(|| {
            let (frame, used) = redis_protocol::resp2::decode::decode(black_box(wire))
                .expect("redis-protocol parses")
                .expect("complete");
            assert!(used == len && matches!(&frame, OwnedFrame::Array(v) if v.len() == N));
            black_box(frame);
        })
    });
    group.finish();
}

fn encode_set(c: &mut Criterion) {
    let len = SET_WIRE.len();
    let mut group = c.benchmark_group("encode/set_nx_px");

    // Each encoder must produce exactly the same bytes; checked once here, lengths in the loop.
    let mut out = BytesMut::new();
    let args = |token: &'static str| -> [Arg<'static>; 6] {
        [
            "SET".into(),
            "lock:resource".into(),
            token.into(),
            "NX".into(),
            "PX".into(),
            30_000u64.into(),
        ]
    };
    resp::encode_command(&mut out, &args(TOKEN));
    assert_eq!(&out[..], SET_WIRE);
    let redis_cmd = || {
        let mut cmd = redis::cmd("SET");
        cmd.arg("lock:resource")
            .arg(TOKEN)
            .arg("NX")
            .arg("PX")
            .arg(30_000u64);
        cmd
    };
    assert_eq!(redis_cmd().get_packed_command(), SET_WIRE);
    let frames = [
        BorrowedFrame::BulkString(b"SET"),
        BorrowedFrame::BulkString(b"lock:resource"),
        BorrowedFrame::BulkString(TOKEN.as_bytes()),
        BorrowedFrame::BulkString(b"NX"),
        BorrowedFrame::BulkString(b"PX"),
        BorrowedFrame::Integer(30_000),
    ];
    let mut protocol_buf = vec![0u8; len];
    let n = redis_protocol::resp2::encode::encode_borrowed(
        &mut protocol_buf,
        &BorrowedFrame::Array(&frames),
        true,
    )
    .expect("redis-protocol encodes");
    assert_eq!(&protocol_buf[..n], SET_WIRE);

    group.bench_function("ours", |b| {
        b.iter(|| {
            out.clear();
            resp::encode_command(&mut out, black_box(&args(black_box(TOKEN))));
            assert_eq!(out.len(), len);
        })
    });
    let template = resp::SetNxPx::new(30_000);
    out.clear();
    template.encode(&mut out, b"lock:resource", TOKEN.as_bytes());
    assert_eq!(&out[..], SET_WIRE);
    group.bench_function("ours_template", |b| {
        b.iter(|| {
            out.clear();
            black_box(&template).encode(
                &mut out,
                black_box(b"lock:resource"),
                black_box(TOKEN.as_bytes()),
            );
            assert_eq!(out.len(), len);
        })
    });
    group.bench_function("redis_rs", |b| {
        b.iter(|| {
            let packed = redis::cmd("SET")
                .arg("lock:resource")
                .arg(black_box(TOKEN))
                .arg("NX")
                .arg("PX")
                .arg(black_box(30_000u64))
                .get_packed_command();
            assert_eq!(packed.len(), len);
            black_box(packed);
        })
    });
    let prebuilt = redis_cmd();
    let mut vec_out = Vec::new();
    group.bench_function("redis_rs_reused", |b| {
        b.iter(|| {
            vec_out.clear();
            black_box(&prebuilt).write_packed_command(&mut vec_out);
            assert_eq!(vec_out.len(), len);
        })
    });
    group.bench_function("redis_protocol", |b| {
        b.iter(|| {
            let n = redis_protocol::resp2::encode::encode_borrowed(
                &mut protocol_buf,
                &BorrowedFrame::Array(black_box(&frames)),
                true,
            )
            .expect("redis-protocol encodes");
            assert_eq!(n, len);
        })
    });
    group.finish();
}

criterion_group!(benches, decode_small, decode_large_array, encode_set);
criterion_main!(benches);
