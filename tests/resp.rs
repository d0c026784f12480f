//! The RESP codec against fixtures, hostile input and arbitrary frames split at arbitrary points.

use bytes::BytesMut;
use proptest::prelude::*;
use redlock_mux::resp::{
    self, AggregateKind as K, Arg, Decoder, ErrorKind, Frame, Limits, ParseError, Status, Value,
};

fn decode_all(input: &[u8]) -> Result<Status<(Value, usize)>, ParseError> {
    resp::decode(input, &Limits::DEFAULT).map(|s| match s {
        Status::Complete((f, n)) => Status::Complete((f.to_value(), n)),
        Status::Partial => Status::Partial,
    })
}

fn bulk(s: &str) -> Value {
    Value::Bulk(s.as_bytes().to_vec())
}

/// `fixtures! { name: b"wire" => expected_value, ... }`: each decodes whole to the value, every
/// strict prefix is partial, and trailing bytes are left unconsumed.
macro_rules! fixtures {
    ($($name:ident: $wire:expr => $value:expr,)*) => {
        $(
            #[test]
            fn $name() {
                let wire: &[u8] = $wire;
                let expected: Value = $value;
                assert_eq!(decode_all(wire), Ok(Status::Complete((expected.clone(), wire.len()))));
                for cut in 0..wire.len() {
                    assert_eq!(decode_all(&wire[..cut]), Ok(Status::Partial), "prefix of {cut} bytes");
                }
                let mut trailing = wire.to_vec();
                trailing.extend_from_slice(b"+NEXT\r\n");
                assert_eq!(decode_all(&trailing), Ok(Status::Complete((expected, wire.len()))));
            }
        )*
    };
}

fixtures! {
    simple_ok: b"+OK\r\n" => Value::Simple("OK".into()),
    simple_empty: b"+\r\n" => Value::Simple(String::new()),
    error_err: b"-ERR unknown command\r\n" => Value::Error("ERR unknown command".into()),
    integer_one: b":1\r\n" => Value::Integer(1),
    integer_zero: b":0\r\n" => Value::Integer(0),
    integer_negative: b":-42\r\n" => Value::Integer(-42),
    integer_plus: b":+7\r\n" => Value::Integer(7),
    integer_max: b":9223372036854775807\r\n" => Value::Integer(i64::MAX),
    integer_min: b":-9223372036854775808\r\n" => Value::Integer(i64::MIN),
    bulk_hello: b"$5\r\nhello\r\n" => bulk("hello"),
    bulk_empty: b"$0\r\n\r\n" => bulk(""),
    bulk_binary: b"$4\r\n\r\n\x00\xff\r\n" => Value::Bulk(vec![b'\r', b'\n', 0, 0xff]),
    null_bulk: b"$-1\r\n" => Value::Null,
    null_array: b"*-1\r\n" => Value::Null,
    null_resp3: b"_\r\n" => Value::Null,
    array_empty: b"*0\r\n" => Value::Aggregate(K::Array, vec![]),
    array_mixed: b"*3\r\n:1\r\n$2\r\nhi\r\n+OK\r\n" =>
        Value::Aggregate(K::Array, vec![Value::Integer(1), bulk("hi"), Value::Simple("OK".into())]),
    array_nested: b"*2\r\n*1\r\n:1\r\n*0\r\n" => Value::Aggregate(K::Array, vec![
        Value::Aggregate(K::Array, vec![Value::Integer(1)]),
        Value::Aggregate(K::Array, vec![]),
    ]),
    array_with_nulls: b"*2\r\n$-1\r\n_\r\n" => Value::Aggregate(K::Array, vec![Value::Null, Value::Null]),
    double: b",3.25\r\n" => Value::Double(3.25),
    double_exponent: b",1.5e3\r\n" => Value::Double(1500.0),
    double_inf: b",inf\r\n" => Value::Double(f64::INFINITY),
    double_neg_inf: b",-inf\r\n" => Value::Double(f64::NEG_INFINITY),
    boolean_true: b"#t\r\n" => Value::Boolean(true),
    boolean_false: b"#f\r\n" => Value::Boolean(false),
    big_number: b"(3492890328409238509324850943850943825024385\r\n" =>
        Value::BigNumber("3492890328409238509324850943850943825024385".into()),
    big_number_negative: b"(-1\r\n" => Value::BigNumber("-1".into()),
    verbatim: b"=15\r\ntxt:Some string\r\n" => Value::Verbatim("txt".into(), b"Some string".to_vec()),
    blob_error: b"!21\r\nSYNTAX invalid syntax\r\n" => Value::Error("SYNTAX invalid syntax".into()),
    map: b"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n" => Value::Aggregate(K::Map, vec![
        Value::Simple("first".into()), Value::Integer(1),
        Value::Simple("second".into()), Value::Integer(2),
    ]),
    set: b"~2\r\n+a\r\n+b\r\n" =>
        Value::Aggregate(K::Set, vec![Value::Simple("a".into()), Value::Simple("b".into())]),
    push: b">2\r\n+invalidate\r\n*1\r\n$3\r\nkey\r\n" => Value::Aggregate(K::Push, vec![
        Value::Simple("invalidate".into()),
        Value::Aggregate(K::Array, vec![bulk("key")]),
    ]),
    attribute_then_value: b"|1\r\n+ttl\r\n:3\r\n:42\r\n" => Value::Integer(42),
    attribute_nested_in_array: b"*2\r\n|1\r\n+a\r\n*1\r\n:0\r\n:1\r\n:2\r\n" =>
        Value::Aggregate(K::Array, vec![Value::Integer(1), Value::Integer(2)]),
    attribute_empty: b"|0\r\n+OK\r\n" => Value::Simple("OK".into()),
}

#[test]
fn server_errors_keep_their_first_word() {
    let cases: &[(&[u8], ErrorKind)] = &[
        (b"-ERR syntax error\r\n", ErrorKind::Err),
        (
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            ErrorKind::NoScript,
        ),
        (
            b"-WRONGTYPE Operation against a key\r\n",
            ErrorKind::WrongType,
        ),
        (b"-NOAUTH Authentication required.\r\n", ErrorKind::NoAuth),
        (
            b"-WRONGPASS invalid username-password pair\r\n",
            ErrorKind::WrongPass,
        ),
        (
            b"-NOPERM this user has no permissions\r\n",
            ErrorKind::NoPerm,
        ),
        (b"-BUSY Redis is busy running a script\r\n", ErrorKind::Busy),
        (
            b"-LOADING Redis is loading the dataset\r\n",
            ErrorKind::Loading,
        ),
        (
            b"-READONLY You can't write against a read only replica.\r\n",
            ErrorKind::ReadOnly,
        ),
        (
            b"-MASTERDOWN Link with MASTER is down\r\n",
            ErrorKind::MasterDown,
        ),
        (
            b"-BUSYKEY Target key name already exists.\r\n",
            ErrorKind::Other,
        ),
        (b"-\r\n", ErrorKind::Other),
        (b"!8\r\nNOSCRIPT\r\n", ErrorKind::NoScript),
    ];
    for (wire, kind) in cases {
        match resp::decode(wire, &Limits::DEFAULT) {
            Ok(Status::Complete((Frame::Error(e), n))) => {
                assert_eq!(e.kind, *kind, "{}", String::from_utf8_lossy(wire));
                assert_eq!(n, wire.len());
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(ErrorKind::WrongPass.is_auth() && !ErrorKind::NoScript.is_auth());
}

#[test]
fn hostile_inputs_give_exact_errors() {
    let cases: &[(&[u8], ParseError)] = &[
        (b"*2147483647\r\n", ParseError::TooManyElements),
        (b"$9223372036854775807\r\n", ParseError::BulkTooLong),
        (b":99999999999999999999\r\n", ParseError::IntegerOverflow),
        (b":9223372036854775808\r\n", ParseError::IntegerOverflow),
        (b"$99999999999999999999\r\n", ParseError::IntegerOverflow),
        (b"+OK\rX", ParseError::MissingLf),
        (b"$3\r\nabc\rX", ParseError::BadBulkTerminator),
        (b"$3\r\nabcde\r\n", ParseError::BadBulkTerminator),
        (b"$-2\r\n", ParseError::NegativeLength),
        (b"*-5\r\n", ParseError::NegativeLength),
        (b"%-1\r\n", ParseError::NegativeLength),
        (b"=-1\r\n", ParseError::NegativeLength),
        (b"@foo\r\n", ParseError::UnknownType(b'@')),
        (b"@", ParseError::UnknownType(b'@')),
        (b"\r\n", ParseError::UnknownType(b'\r')),
        (b"+\xff\xfe\r\n", ParseError::NotUtf8),
        (b"-\xc3\x28\r\n", ParseError::NotUtf8),
        (b":12a\r\n", ParseError::InvalidInteger),
        (b":\r\n", ParseError::InvalidInteger),
        (b":-\r\n", ParseError::InvalidInteger),
        (b"$\r\n", ParseError::InvalidInteger),
        (b",abc\r\n", ParseError::InvalidDouble),
        (b",infinity\r\n", ParseError::InvalidDouble),
        (b",\r\n", ParseError::InvalidDouble),
        (b"#x\r\n", ParseError::InvalidBoolean),
        (b"_x\r\n", ParseError::InvalidNull),
        (b"(12x\r\n", ParseError::InvalidBigNumber),
        (b"(\r\n", ParseError::InvalidBigNumber),
        (b"=2\r\nab\r\n", ParseError::InvalidVerbatim),
        (b"=5\r\ntxtxy\r\n", ParseError::InvalidVerbatim),
        (b"$?\r\n", ParseError::Streamed),
        (b"*?\r\n", ParseError::Streamed),
        (b";4\r\nabcd\r\n", ParseError::Streamed),
    ];
    for (wire, error) in cases {
        assert_eq!(
            resp::decode(wire, &Limits::DEFAULT),
            Err(*error),
            "input {:?}",
            String::from_utf8_lossy(wire)
        );
    }
}

#[test]
fn a_million_nested_arrays_hit_the_depth_limit() {
    let wire = b"*1\r\n".repeat(1_000_000);
    assert_eq!(
        resp::decode(&wire, &Limits::DEFAULT),
        Err(ParseError::TooDeep)
    );
    // Exactly at the limit is fine.
    let mut ok = b"*1\r\n".repeat(Limits::DEFAULT.max_depth);
    ok.extend_from_slice(b":1\r\n");
    assert!(matches!(
        resp::decode(&ok, &Limits::DEFAULT),
        Ok(Status::Complete((_, n))) if n == ok.len()
    ));
    let mut deeper = b"*1\r\n".repeat(Limits::DEFAULT.max_depth + 1);
    deeper.extend_from_slice(b":1\r\n");
    assert_eq!(
        resp::decode(&deeper, &Limits::DEFAULT),
        Err(ParseError::TooDeep)
    );
}

#[test]
fn limits_are_enforced_and_configurable() {
    let limits = Limits {
        max_bulk_len: 4,
        max_elements: 2,
        max_depth: 2,
        max_frame_len: 32,
        max_line_len: 8,
    };
    let d = |w: &[u8]| resp::decode(w, &limits).map(|s| matches!(s, Status::Complete(_)));
    assert_eq!(d(b"$4\r\nabcd\r\n"), Ok(true));
    assert_eq!(d(b"$5\r\n"), Err(ParseError::BulkTooLong));
    assert_eq!(d(b"*2\r\n:1\r\n:2\r\n"), Ok(true));
    assert_eq!(d(b"*3\r\n"), Err(ParseError::TooManyElements));
    assert_eq!(d(b"%2\r\n"), Err(ParseError::TooManyElements));
    assert_eq!(d(b"*1\r\n*1\r\n:1\r\n"), Ok(true));
    assert_eq!(d(b"*1\r\n*1\r\n*1\r\n"), Err(ParseError::TooDeep));
    assert_eq!(d(b"+12345678\r\n"), Ok(true));
    assert_eq!(d(b"+123456789\r\n"), Err(ParseError::LineTooLong));
    assert_eq!(d(b"+123456789"), Err(ParseError::LineTooLong));
    // A frame that is still incomplete but already longer than the limit is refused.
    let small = Limits {
        max_frame_len: 16,
        ..limits
    };
    let d16 = |w: &[u8]| resp::decode(w, &small).map(|s| matches!(s, Status::Complete(_)));
    assert_eq!(d16(b"*2\r\n$4\r\nabcd\r\n+1"), Ok(false));
    assert_eq!(
        d16(b"*2\r\n$4\r\nabcd\r\n+12345"),
        Err(ParseError::FrameTooLarge)
    );
    assert_eq!(
        d16(b"*2\r\n$4\r\nabcd\r\n+12345\r\n"),
        Err(ParseError::FrameTooLarge)
    );
    assert_eq!(
        Decoder::new(Limits {
            max_depth: 10_000,
            ..limits
        })
        .limits()
        .max_depth,
        128
    );
}

#[test]
fn decoding_resumes_instead_of_rescanning() {
    // A 1 MiB bulk string fed one byte at a time: the decoder must keep its place.
    let payload = vec![b'x'; 1 << 20];
    let mut wire = format!("${}\r\n", payload.len()).into_bytes();
    wire.extend_from_slice(&payload);
    wire.extend_from_slice(b"\r\n");
    let mut decoder = Decoder::new(Limits::DEFAULT);
    for end in 0..wire.len() {
        assert_eq!(decoder.decode(&wire[..end]), Ok(Status::Partial));
    }
    match decoder.decode(&wire) {
        Ok(Status::Complete((Frame::Bulk(b), n))) => {
            assert_eq!((b.len(), n), (payload.len(), wire.len()))
        }
        other => panic!("{other:?}"),
    }

    // A long array of small elements: progress grows as bytes arrive, never restarting at 0.
    let mut wire = b"*100000\r\n".to_vec();
    for _ in 0..100_000 {
        wire.extend_from_slice(b":7\r\n");
    }
    let mut decoder = Decoder::new(Limits::DEFAULT);
    let mut last = 0;
    for end in (0..wire.len()).step_by(3) {
        assert_eq!(decoder.decode(&wire[..end]), Ok(Status::Partial));
        assert!(decoder.progress() >= last);
        last = decoder.progress();
    }
    assert!(last > wire.len() - 8);
    assert!(matches!(
        decoder.decode(&wire),
        Ok(Status::Complete((Frame::Aggregate(a), n))) if a.len() == 100_000 && n == wire.len()
    ));
}

#[test]
fn length_and_count_headers_are_a_sign_and_20_digits_at_most() {
    // Padded with leading zeros, a bulk header was taken up to `max_line_len` (16 KiB under
    // `Limits::CLIENT`) and parsed again on every read while its payload trickled in.
    let zeros = "0".repeat(30);
    for ty in ["$", "=", "!", "*", "%", "~", ">", "|"] {
        let wire = format!("{ty}{zeros}5\r\n");
        for limits in [Limits::CLIENT, Limits::DEFAULT] {
            assert_eq!(
                resp::decode(wire.as_bytes(), &limits),
                Err(ParseError::LineTooLong),
                "{wire:?}"
            );
            // Refused as soon as the header is too long, not when its CRLF arrives.
            let mut decoder = Decoder::new(limits);
            let cut = wire.len() - 4;
            assert_eq!(
                decoder.decode(&wire.as_bytes()[..cut]),
                Err(ParseError::LineTooLong)
            );
        }
    }
    let mut big = format!("${zeros}1000000\r\n").into_bytes();
    big.extend_from_slice(&[b'x'; 100]);
    assert_eq!(
        Decoder::new(Limits::CLIENT).decode(&big),
        Err(ParseError::LineTooLong)
    );
    // Every length in normal form is still read as before.
    let ok: &[(&[u8], Result<bool, ParseError>)] = &[
        (b"$-1\r\n", Ok(true)),
        (b"*-1\r\n", Ok(true)),
        (b"$0\r\n\r\n", Ok(true)),
        (b"$05\r\nhello\r\n", Ok(true)),
        (b"*+1\r\n:1\r\n", Ok(true)),
        (b"$9223372036854775807\r\n", Err(ParseError::BulkTooLong)),
        (
            b"*9223372036854775807\r\n",
            Err(ParseError::TooManyElements),
        ),
        (
            b"$-9223372036854775808\r\n",
            Err(ParseError::NegativeLength),
        ),
        (
            b"$18446744073709551615\r\n",
            Err(ParseError::IntegerOverflow),
        ),
        (
            b"$+18446744073709551615\r\n",
            Err(ParseError::IntegerOverflow),
        ),
        (
            b"$99999999999999999999\r\n",
            Err(ParseError::IntegerOverflow),
        ),
        (b"$+000000000000000000005\r\n", Err(ParseError::LineTooLong)),
    ];
    for (wire, expected) in ok {
        assert_eq!(
            resp::decode(wire, &Limits::DEFAULT).map(|s| matches!(s, Status::Complete(_))),
            *expected,
            "{:?}",
            String::from_utf8_lossy(wire)
        );
    }
    // A plain integer is no header: its line may be padded up to `max_line_len`.
    let padded = format!(":{zeros}7\r\n");
    assert_eq!(
        resp::decode(padded.as_bytes(), &Limits::CLIENT),
        Ok(Status::Complete((Frame::Integer(7), padded.len())))
    );
}

#[test]
fn a_long_line_trickled_in_is_scanned_once() {
    let mut wire = b"+".to_vec();
    wire.extend(std::iter::repeat_n(b'a', 60_000));
    wire.extend_from_slice(b"\r\n");
    let mut decoder = Decoder::new(Limits::DEFAULT);
    for end in 0..wire.len() {
        assert_eq!(decoder.decode(&wire[..end]), Ok(Status::Partial));
    }
    assert!(
        matches!(decoder.decode(&wire), Ok(Status::Complete((Frame::Simple(s), _))) if s.len() == 60_000)
    );
}

#[test]
fn encoder_writes_exact_bytes_and_length() {
    let cases: Vec<(Vec<Arg>, &[u8])> = vec![
        (
            vec!["SET".into(), "lock".into(), "tok".into(), "NX".into(), "PX".into(), 30_000u64.into()],
            b"*6\r\n$3\r\nSET\r\n$4\r\nlock\r\n$3\r\ntok\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n",
        ),
        (vec![Arg::Int(-5), Arg::Int(0), Arg::UInt(u64::MAX), Arg::Int(i64::MIN)],
         b"*4\r\n$2\r\n-5\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n$20\r\n-9223372036854775808\r\n"),
        (vec![Arg::Bytes(b"")], b"*1\r\n$0\r\n\r\n"),
        (vec![], b"*0\r\n"),
    ];
    for (args, wire) in cases {
        let mut out = BytesMut::new();
        encode_and_check(&mut out, &args);
        assert_eq!(&out[..], wire);
    }
}

fn encode_and_check(out: &mut BytesMut, args: &[Arg]) {
    let before = out.len();
    resp::encode_command(out, args);
    assert_eq!(out.len() - before, resp::command_len(args));
}

#[test]
fn encoded_commands_decode_as_arrays_of_bulk_strings() {
    let mut out = BytesMut::new();
    let args: Vec<Arg> = vec!["EVALSHA".into(), "abc".into(), 1i64.into(), "key".into()];
    encode_and_check(&mut out, &args);
    assert_eq!(
        decode_all(&out),
        Ok(Status::Complete((
            Value::Aggregate(
                K::Array,
                vec![bulk("EVALSHA"), bulk("abc"), bulk("1"), bulk("key")]
            ),
            out.len()
        )))
    );
}

fn arb_text() -> impl Strategy<Value = String> {
    "[^\r\n]{0,20}"
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        arb_text().prop_map(Value::Simple),
        arb_text().prop_map(Value::Error),
        any::<i64>().prop_map(Value::Integer),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bulk),
        Just(Value::Null),
        any::<f64>()
            .prop_filter("nan is not equal to itself", |d| !d.is_nan())
            .prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
        "-?[0-9]{1,40}".prop_map(Value::BigNumber),
        ("[a-z]{3}", proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(f, t)| Value::Verbatim(f, t)),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8)
                .prop_map(|v| Value::Aggregate(K::Array, v)),
            proptest::collection::vec((inner.clone(), inner.clone()), 0..4).prop_map(|v| {
                Value::Aggregate(K::Map, v.into_iter().flat_map(|(k, v)| [k, v]).collect())
            }),
            proptest::collection::vec(inner.clone(), 0..8)
                .prop_map(|v| Value::Aggregate(K::Set, v)),
            proptest::collection::vec(inner, 0..8).prop_map(|v| Value::Aggregate(K::Push, v)),
        ]
    })
}

proptest! {
    #[test]
    fn round_trip_with_arbitrary_splits(
        values in proptest::collection::vec(arb_value(), 1..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut wire = Vec::new();
        for v in &values {
            v.encode(&mut wire);
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        cuts.push(wire.len());
        cuts.sort_unstable();

        // Feed the bytes in chunks, as a socket would, into one growing buffer.
        let mut decoder = Decoder::new(Limits::DEFAULT);
        let mut buf: Vec<u8> = Vec::new();
        let mut fed = 0;
        let mut got = Vec::new();
        for cut in cuts {
            buf.extend_from_slice(&wire[fed..cut]);
            fed = cut;
            loop {
                match decoder.decode(&buf) {
                    Ok(Status::Complete((frame, used))) => {
                        got.push(frame.to_value());
                        buf.drain(..used);
                    }
                    Ok(Status::Partial) => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, values);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_chunking_agrees(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        cut in any::<prop::sample::Index>(),
    ) {
        let whole = decode_all(&bytes);
        let cut = cut.index(bytes.len() + 1);
        let mut decoder = Decoder::new(Limits::DEFAULT);
        let first = decoder.decode(&bytes[..cut]).map(|s| matches!(s, Status::Partial));
        if first == Ok(true) {
            let resumed = decoder.decode(&bytes).map(|s| match s {
                Status::Complete((f, n)) => Status::Complete((f.to_value(), n)),
                Status::Partial => Status::Partial,
            });
            match (&whole, &resumed) {
                // NaN doubles are the one value not equal to themselves.
                (Ok(Status::Complete((a, n))), Ok(Status::Complete((b, m)))) => {
                    prop_assert_eq!(n, m);
                    prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
                }
                _ => prop_assert_eq!(whole, resumed),
            }
        }
    }
}

proptest! {
    /// The pre-encoded `SET … NX PX` writes exactly what the general encoder writes, for any key,
    /// token and TTL (keys longer than the on-stack limit included).
    #[test]
    fn set_nx_px_template_matches_the_general_encoder(
        key in proptest::collection::vec(any::<u8>(), 1..400),
        token in proptest::collection::vec(any::<u8>(), 1..70),
        ttl in any::<u64>(),
    ) {
        let mut fast = BytesMut::new();
        resp::SetNxPx::new(ttl).encode(&mut fast, &key, &token);
        let mut general = BytesMut::new();
        let args: [Arg; 6] = [
            "SET".into(),
            key.as_slice().into(),
            token.as_slice().into(),
            "NX".into(),
            "PX".into(),
            ttl.into(),
        ];
        resp::encode_command(&mut general, &args);
        prop_assert_eq!(fast, general);
    }
}
