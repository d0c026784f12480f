//! The nodes' side of RESP: commands parsed off what a connection delivered, and replies
//! written. Only what the client sends and the nodes answer: arrays of bulk strings in,
//! integers, bulk strings and arrays out.

/// Parses one command (an array of bulk strings) off the front of `buf`: the arguments'
/// ranges and the bytes used, or `None` if incomplete. Malformed input is a bug of the
/// client's encoder: it panics, so a simulation shows it at once.
pub(super) fn parse_command(buf: &[u8], args: &mut Vec<(usize, usize)>) -> Option<usize> {
    args.clear();
    let (n, mut at) = line_number(buf, 0, b'*')?;
    for _ in 0..n {
        let (len, body) = line_number(buf, at, b'$')?;
        if buf.len() < body + len + 2 {
            return None;
        }
        args.push((body, body + len));
        at = body + len + 2;
    }
    Some(at)
}

/// The number of a length line (`prefix`, digits, CRLF) at `at`, and where the line after it
/// begins; `None` if the line is not there whole.
#[inline(always)]
fn line_number(buf: &[u8], at: usize, prefix: u8) -> Option<(usize, usize)> {
    // Most lengths have one or two digits: read at once when the line is there whole (what
    // the loop below reads of it, and anything else, is left to the loop).
    if let Some(&[first, a, b, c, d]) = buf.get(at..at + 5)
        && first == prefix
        && a.is_ascii_digit()
    {
        let a = usize::from(a - b'0');
        if b == b'\r' && c == b'\n' {
            return Some((a, at + 4));
        }
        if b.is_ascii_digit() && c == b'\r' && d == b'\n' {
            return Some((a * 10 + usize::from(b - b'0'), at + 5));
        }
    }
    let (&first, digits) = buf.get(at..)?.split_first()?;
    assert_eq!(first, prefix, "the client sent a malformed command");
    // Digits up to the CR (a hot loop of the simulator: no UTF-8 check, no search for CRLF
    // across the rest of the buffer, no bounds checks).
    let mut n: usize = 0;
    for (i, &d) in digits.iter().enumerate() {
        match d {
            b'0'..=b'9' => n = n * 10 + usize::from(d - b'0'),
            b'\r' => {
                assert!(i > 0, "the client sent an empty length");
                return match digits.get(i + 1)? {
                    b'\n' => Some((n, at + 1 + i + 2)),
                    _ => panic!("the client sent a malformed line end"),
                };
            }
            _ => panic!("the client sent a malformed length"),
        }
    }
    None
}

/// A decimal argument (a TTL, a count, a fence).
pub(super) fn number(arg: &[u8]) -> u64 {
    // Digits only, short enough not to overflow: the client's (a hot path of the simulator);
    // anything else as `str::parse` reads it.
    if !arg.is_empty() && arg.len() <= 19 && arg.iter().all(u8::is_ascii_digit) {
        return arg.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0'));
    }
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("the client sent a malformed number")
}

/// Appends `n` in decimal.
fn decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends a RESP line: `prefix`, `n` in decimal, CRLF.
pub(super) fn line(out: &mut Vec<u8>, prefix: u8, n: u64) {
    out.push(prefix);
    decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends a RESP bulk string.
pub(super) fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    line(out, b'$', b.len() as u64);
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_parsed_only_when_whole() {
        let mut args = Vec::new();
        let cmd = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        for cut in 0..cmd.len() {
            assert_eq!(parse_command(&cmd[..cut], &mut args), None);
        }
        assert_eq!(parse_command(cmd, &mut args), Some(cmd.len()));
        assert_eq!(args, [(8, 11), (17, 18)]);
    }

    /// Lengths of one or two digits are read at once, longer ones by the digit loop: the same
    /// commands, whole or cut anywhere.
    #[test]
    fn lengths_of_any_number_of_digits_are_read_alike() {
        let mut args = Vec::new();
        for len in [0, 1, 9, 10, 40, 99, 100, 1234] {
            let mut cmd = format!("*1\r\n${len}\r\n").into_bytes();
            cmd.extend(std::iter::repeat_n(b'x', len));
            cmd.extend_from_slice(b"\r\n");
            for cut in 0..cmd.len() {
                assert_eq!(parse_command(&cmd[..cut], &mut args), None);
            }
            assert_eq!(parse_command(&cmd, &mut args), Some(cmd.len()));
            assert_eq!(args, [(cmd.len() - 2 - len, cmd.len() - 2)]);
        }
    }
}
