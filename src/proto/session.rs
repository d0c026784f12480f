//! One node's protocol state, without I/O: the output buffer, the input buffer with its
//! resumable decoder, the pipelined handshake (and the requests held back until it succeeded),
//! FIFO matching of replies to requests, the `NOSCRIPT` → `EVAL` fallback, the replay of
//! idempotent scripts on a fresh connection, reply and connect deadlines, and the reconnect
//! backoff.
//!
//! A [`Session`] never touches a socket, the clock or the OS: it takes `now`, the bytes read
//! and what happened to the socket (opened, connected, failed), and it gives the bytes to write,
//! the replies (through a sink), and whether the socket must be closed or opened. `conn.rs` is
//! the thin half that owns the socket and calls it; a simulator can drive it with bytes of its
//! own (the split of `quinn-proto`'s `Connection` from `quinn`'s endpoint driver).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use sha1::{Digest, Sha1};

use crate::model::addr::NodeAddr;
use crate::model::config::{ConnConfig, InfoNeed};
use crate::model::error::NodeFault;
use crate::model::event::event;
use crate::model::eviction::Eviction;
use crate::model::keys::readers_marker;
use crate::model::stats::NodeCounters;
use crate::proto::resp::{self, AggregateKind, Arg, Decoder, ErrorKind, Frame, Status};

/// A Lua script sent by hash.
#[derive(Debug)]
pub(crate) struct Script {
    pub index: usize,
    pub body: &'static str,
    /// `EVALSHA <sha>` as two RESP bulk strings: what every call after the first on a
    /// connection starts with, encoded once (callgrind: a third of a release's encoding was
    /// these two bulk strings, every time, for every node).
    pub evalsha: [u8; EVALSHA_HEAD_LEN],
}

impl Script {
    /// The script's SHA1 in hex: taken from its `EVALSHA` head (kept once).
    #[cfg(any(test, feature = "sim"))]
    pub fn sha(&self) -> &[u8] {
        &self.evalsha[18..58]
    }
}

/// `$7\r\nEVALSHA\r\n$40\r\n` + 40 hex digits + `\r\n`.
const EVALSHA_HEAD_LEN: usize = 18 + 40 + 2;

fn evalsha_head(sha: &[u8; 40]) -> [u8; EVALSHA_HEAD_LEN] {
    let mut head = [0u8; EVALSHA_HEAD_LEN];
    head[..18].copy_from_slice(b"$7\r\nEVALSHA\r\n$40\r\n");
    head[18..58].copy_from_slice(sha);
    head[58..].copy_from_slice(b"\r\n");
    head
}

/// One script call: the script, the request's tag, and its arguments after the script's hash
/// (`numkeys`, the keys, the values): `argc` RESP bulk strings, encoded in `tail`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScriptCall<'a> {
    pub script: &'a Script,
    pub tag: u64,
    pub tail: &'a [u8],
    pub argc: usize,
}

/// Compare-and-delete: release the lock only if it still holds our token; then, if the
/// resource's waiting key ([`WAITING_KEY_PREFIX`](crate::model::keys::WAITING_KEY_PREFIX)) holds a mark
/// ([`MARK_VALUE`](crate::model::keys::MARK_VALUE)), delete the mark and publish a notice on
/// `redlock:released:<resource>` for the clients waiting for it. Answers 0 (not ours), or
/// 1 + 2 × the clients the notice reached (1 when nobody was marked waiting).
///
/// The notice's payload is how many clients listen (`PUBSUB NUMSUB`, read just before the
/// `PUBLISH`, in a `pcall`: `0` for a user who may not run it), less the releaser itself when
/// `ARGV[2]` is `1` (it is subscribed too: a queue of its own for the resource lingers, and it
/// is no waiter — counted, it made a lone waiter pause as if in a crowd of two): each waiter
/// that hears it spreads its attempt over a span that grows with the others
/// (`wait::crowd_pause`) instead of all of them attempting at once and splitting the votes.
/// Only releases that publish pay the lookup (a hash lookup on the server).
///
/// Why the mark: a `PUBLISH` from a script costs the server about as much as the rest of the
/// release (one `redis-benchmark` run, a `SET` and this script per call, 3 rounds: plain
/// check-and-delete 3.16 µs, publishing every time 3.73 µs, reading the mark with a `GET`
/// 3.45 µs). Every waiter marks before every attempt it makes, behind its `SUBSCRIBE` on the
/// same connection, so a release that comes after a refused attempt finds the mark and
/// publishes: taking the mark away loses no waiter.
///
/// Why the mark is read before it is deleted (an earlier version deleted lock and mark in one
/// two-key `DEL`, 0.16 µs cheaper): the waiting key of `x` may be another client's lock (a
/// Redlock client that knows nothing of this crate's namespace may lock
/// `redlock:waiting:x`); only a key that holds the mark value is ours to delete.
///
/// The lock's `GET` is a `pcall`: a key of another type (a read lock's sorted set, another
/// application's data) answers `WRONGTYPE` and is not ours (0); any other refusal (`NOPERM`:
/// the ACL user may not read its own lock keys) is the answer, so that the caller reads which
/// command the server refused instead of "not held". The mark's `GET` is a `pcall` too: a user
/// whose ACL does not reach `redlock:*` keys (or a foreign key of another type) gets an error,
/// and then a notice every time, as before the mark; so is the mark's `DEL` (an ACL that may
/// read `redlock:*` but not write it: the lock is released all the same). The publish is in a
/// `pcall` too: a user who may not publish still releases (waiters then notice by polling).
pub(crate) const RELEASE_BODY: &str = "local v = redis.pcall(\"get\", KEYS[1]) if v == ARGV[1] then redis.call(\"del\", KEYS[1]) local w = \"redlock:waiting:\" .. KEYS[1] local m = redis.pcall(\"get\", w) if m == \"redlock-mux waiting mark\" or m == \"redlock-mux reader waiting\" then redis.pcall(\"del\", w) elseif type(m) ~= \"table\" then return 1 end local ch = \"redlock:released:\" .. KEYS[1] local s = redis.pcall(\"pubsub\", \"numsub\", ch) local c = (type(s) == \"table\" and s[2] or 0) - (ARGV[2] == \"1\" and 1 or 0) local ok, n = pcall(redis.call, \"publish\", ch, tostring(c < 0 and 0 or c)) if ok and type(n) == \"number\" then return 1 + 2 * n end return 1 elseif type(v) == \"table\" and not string.find(v.err, \"WRONGTYPE\", 1, true) then return v else return 0 end";
/// Compare-and-delete without the notice ([`Config::release_notices`](crate::Config::release_notices)
/// off): answers 0 (not ours) or 1; a refusal other than `WRONGTYPE` is the answer, as in
/// [`RELEASE_BODY`].
pub(crate) const QUIET_RELEASE_BODY: &str = "local v = redis.pcall(\"get\", KEYS[1]) if v == ARGV[1] then redis.call(\"del\", KEYS[1]) return 1 elseif type(v) == \"table\" and not string.find(v.err, \"WRONGTYPE\", 1, true) then return v else return 0 end";
/// Compare-and-pexpire: extend the lock only if it still holds our token, and never shorten
/// it: the key's TTL becomes `max(its TTL left, ARGV[2])`. Answers 1 (ours: it lives at least
/// `ARGV[2]` ms more) or 0.
///
/// Why never shorten: one lock can be extended through two handles (a `Lock` is `Clone`, or
/// rebuilt with `Lock::from_parts`), each with its own connection per node. A short extend
/// delayed on its way can then run on a node after a long one that was sent later: a plain
/// `PEXPIRE` would cut the key to `t_late + short` while the long extend's caller relies on
/// `start + long − drift`. With the maximum, every extend that answered 1 is backed by the key
/// for its whole TTL, in whatever order the extends run (tests/safety.rs).
///
/// How: `PEXPIRE … GT` (Redis 7), which needs no permission beyond `PEXPIRE` — an ACL rule
/// written for the plain `PEXPIRE` keeps working. Before Redis 7 (`GT` is a syntax error
/// there) `PTTL` and a `PEXPIRE` if it is shorter; a Redis 6 user without `+pttl` gets the
/// plain `PEXPIRE`, which may shorten (tests/namespace.rs runs an ACL user without `+pttl`).
/// A refusal of the `GET` other than `WRONGTYPE` is the answer, as in [`RELEASE_BODY`].
pub(crate) const EXTEND_BODY: &str = "local v = redis.pcall(\"get\", KEYS[1]) if v == ARGV[1] then if not pcall(redis.call, \"pexpire\", KEYS[1], ARGV[2], \"GT\") then local t = redis.pcall(\"pttl\", KEYS[1]) if type(t) ~= \"number\" or t < tonumber(ARGV[2]) then redis.call(\"pexpire\", KEYS[1], ARGV[2]) end end return 1 elseif type(v) == \"table\" and not string.find(v.err, \"WRONGTYPE\", 1, true) then return v else return 0 end";

/// An all-or-none lock of a set of resources (`keys.rs`, [`SET_PREFIX`](crate::model::keys::SET_PREFIX)):
/// every key `KEYS[i]` is set to the token `ARGV[1]` with a TTL of `ARGV[2]` ms if none of them
/// exists, else none is. Answers 1 (all set) or 0. Each member is a plain string lock, so a
/// `SET NX` of any member by any client fails while the set is held, and the set is refused
/// while any member is held (by a plain lock, a reader, another set).
pub(crate) const SET_ACQUIRE_BODY: &str = "if redis.call(\"exists\", unpack(KEYS)) > 0 then return 0 end for i = 1, #KEYS do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end return 1";
/// [`SET_ACQUIRE_BODY`] with the fence counter's read, as the fenced acquire of one resource
/// (`fence.rs`): the last key is the counter, read first (a foreign hash there: an error,
/// nothing set). Answers `{1 or 0, run, n}`.
pub(crate) const SET_FENCED_ACQUIRE_BODY: &str = concat!(
    "local h = redis.call(\"hmget\", KEYS[#KEYS], \"run\", \"n\") ",
    crate::proto::fencing::foreign_fence!("KEYS[#KEYS]"),
    "local n = #KEYS - 1 local ok = 1 if redis.call(\"exists\", unpack(KEYS, 1, n)) > 0 then ok = 0 else for i = 1, n do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end end return {ok, h[1] or \"\", h[2] or \"\"}"
);
/// [`RELEASE_BODY`] over every key of a set: each member that holds the token `ARGV[1]` is
/// deleted, and with `ARGV[2]` = `1` (or `2`: the releaser is subscribed too, and not
/// counted) its waiters are told as a single lock's are. Answers 0 (no member was ours) or
/// 1 + 2 × the clients the notices reached. One `MGET` of the members
/// and one of their waiting keys rather than a `GET` each: a set of 8 is one call per
/// purpose, not 8 (the servers share the CPU with the client on a small machine, and
/// their time is the cycle's). A member of another type reads as not ours (`MGET` answers
/// nil for it); an ACL that refuses the waiting keys gets the notices every time, as
/// [`RELEASE_BODY`]'s users do.
pub(crate) const SET_RELEASE_BODY: &str = "local v = redis.call(\"mget\", unpack(KEYS)) local ours = {} for i = 1, #KEYS do if v[i] == ARGV[1] then ours[#ours + 1] = KEYS[i] end end if #ours == 0 then return 0 end redis.call(\"del\", unpack(ours)) local n = 0 if ARGV[2] == \"1\" or ARGV[2] == \"2\" then local w = {} for i = 1, #ours do w[i] = \"redlock:waiting:\" .. ours[i] end local m = redis.pcall(\"mget\", unpack(w)) local denied = m.err ~= nil for i = 1, #ours do local tell = denied if not denied and (m[i] == \"redlock-mux waiting mark\" or m[i] == \"redlock-mux reader waiting\") then redis.pcall(\"del\", w[i]) tell = true end if tell then local ch = \"redlock:released:\" .. ours[i] local s = redis.pcall(\"pubsub\", \"numsub\", ch) local k = (type(s) == \"table\" and s[2] or 0) - (ARGV[2] == \"2\" and 1 or 0) local ok, c = pcall(redis.call, \"publish\", ch, tostring(k < 0 and 0 or k)) if ok and type(c) == \"number\" then n = n + c end end end end return 1 + 2 * n";
/// [`EXTEND_BODY`] over every key of a set: only if every member still holds the token
/// `ARGV[1]`, each member's TTL becomes `max(its TTL left, ARGV[2])`. Answers 1 or 0.
pub(crate) const SET_EXTEND_BODY: &str = "local v = redis.call(\"mget\", unpack(KEYS)) for i = 1, #KEYS do if v[i] ~= ARGV[1] then return 0 end end for i = 1, #KEYS do if not pcall(redis.call, \"pexpire\", KEYS[i], ARGV[2], \"GT\") then local t = redis.pcall(\"pttl\", KEYS[i]) if type(t) ~= \"number\" or t < tonumber(ARGV[2]) then redis.call(\"pexpire\", KEYS[i], ARGV[2]) end end end return 1";

/// A shared (read) lock's acquire (`keys.rs`, [`SHARED_PREFIX`](crate::model::keys::SHARED_PREFIX)):
/// `KEYS[1]` is the resource; its readers are a sorted set of their tokens scored by their
/// expiry (ms on this node's clock, `TIME`), beside the member
/// [`READERS_MARKER`](crate::model::keys::READERS_MARKER) scored `+inf`, which makes the set ours.
/// The reader `ARGV[1]` is added with a TTL of `ARGV[2]` ms where no key exists (the set is
/// made, marker and reader in one `ZADD`) or where the key is our read lock: a sorted set that
/// holds the marker and has a TTL. It is refused, the key untouched, where the key is anything
/// else — a writer's string (the marker's `ZSCORE` answers `WRONGTYPE`), a key of another type,
/// a sorted set without the marker (another application's leaderboard, rate limiter or queue
/// under the same name, with or without a TTL: joined, its TTL was raised, and the release's
/// sweep of expired scores deleted its members), a key without a TTL — and where a writer waits
/// (the waiting mark holds [`MARK_VALUE`](crate::model::keys::MARK_VALUE): so that readers that keep
/// coming do not starve it). A refusal of the `ZSCORE` other than `WRONGTYPE` (`NOPERM`) is the
/// answer, so that the caller reads which command was refused. The key lives at least `ARGV[2]`
/// ms more, set from the argument's text: Redis 7.2.0–7.2.4 turn a Lua number such as 100000000
/// into `1e+08`, which `PEXPIRE` refuses (after the `ZADD`: a reader left without a TTL).
/// Answers 1 or 0. Five calls for the first reader (`GET` of the mark, `PTTL`, `TIME`, `ZADD`,
/// `PEXPIRE`), six for one that joins (the marker's `ZSCORE`): expired readers are dropped by
/// releases, not here, since the servers' time is the cycle's on a small machine.
pub(crate) const SHARED_ACQUIRE_BODY: &str = concat!(
    "local m = redis.pcall(\"get\", \"redlock:waiting:\" .. KEYS[1]) ",
    "if m == \"redlock-mux waiting mark\" then return 0 end ",
    "local p = redis.call(\"pttl\", KEYS[1]) if p == -1 then return 0 end ",
    "if p ~= -2 then local s = redis.pcall(\"zscore\", KEYS[1], \"",
    readers_marker!(),
    "\") if type(s) == \"table\" then if string.find(s.err, \"WRONGTYPE\", 1, true) then return 0 end return s end ",
    "if not s then return 0 end end ",
    "local t = redis.call(\"time\") local now = t[1] * 1000 + math.floor(t[2] / 1000) ",
    "local ttl = tonumber(ARGV[2]) ",
    "if p == -2 then redis.call(\"zadd\", KEYS[1], \"+inf\", \"",
    readers_marker!(),
    "\", now + ttl, ARGV[1]) else redis.call(\"zadd\", KEYS[1], now + ttl, ARGV[1]) end ",
    "if p < ttl then redis.call(\"pexpire\", KEYS[1], ARGV[2]) end return 1"
);
/// A reader's release: its token leaves the set. Then, on our read lock only (the marker is
/// there; see [`SHARED_ACQUIRE_BODY`]): if other readers remain, the expired ones among them
/// (crashed readers) go too — only members shaped as this crate's tokens (27 characters of
/// base64url), at most 1,000 a release, so that nothing another client put into the key is
/// removed; if no reader is left, the key is deleted and, with `ARGV[2]` = `1` (or `2`, the
/// releaser not counted), the waiters are told as [`RELEASE_BODY`] tells them — but a waiting
/// writer's mark is left in place (a reader's mark goes): the writer's own release deletes it.
/// Deleted here, it let the readers queued behind it in while the woken writer's attempt was on
/// its way, and a writer could wait for ever behind readers that kept coming (found by review).
/// Answers 0 (not a reader), or 1 + 2 × the clients told. The key's TTL is left as it is:
/// readers that remain and crash block writers until the longest TTL any reader set (at most
/// one TTL after the last acquire), as a crashed plain holder does. A refusal of the `ZREM`
/// other than `WRONGTYPE` is the answer.
pub(crate) const SHARED_RELEASE_BODY: &str = concat!(
    "local r = redis.pcall(\"zrem\", KEYS[1], ARGV[1]) ",
    "if type(r) == \"table\" and not string.find(r.err, \"WRONGTYPE\", 1, true) then return r end ",
    "if r ~= 1 then return 0 end ",
    "if not redis.call(\"zscore\", KEYS[1], \"",
    readers_marker!(),
    "\") then return 1 end ",
    "if redis.call(\"zcard\", KEYS[1]) > 1 then ",
    "local t = redis.call(\"time\") local now = t[1] * 1000 + math.floor(t[2] / 1000) ",
    "local old = redis.call(\"zrangebyscore\", KEYS[1], \"-inf\", now, \"LIMIT\", \"0\", \"1000\") ",
    "local gone = {} for i = 1, #old do ",
    "if #old[i] == 27 and not string.find(old[i], \"[^%w_%-]\") then gone[#gone + 1] = old[i] end end ",
    "if #gone > 0 then redis.call(\"zrem\", KEYS[1], unpack(gone)) end ",
    "if redis.call(\"zcard\", KEYS[1]) > 1 then return 1 end end ",
    "redis.call(\"del\", KEYS[1]) ",
    "if ARGV[2] ~= \"1\" and ARGV[2] ~= \"2\" then return 1 end ",
    "local w = \"redlock:waiting:\" .. KEYS[1] local m = redis.pcall(\"get\", w) ",
    "if m == \"redlock-mux reader waiting\" then redis.pcall(\"del\", w) ",
    "elseif m ~= \"redlock-mux waiting mark\" and type(m) ~= \"table\" then return 1 end ",
    "local ch = \"redlock:released:\" .. KEYS[1] local s = redis.pcall(\"pubsub\", \"numsub\", ch) ",
    "local c = (type(s) == \"table\" and s[2] or 0) - (ARGV[2] == \"2\" and 1 or 0) ",
    "local ok, n = pcall(redis.call, \"publish\", ch, tostring(c < 0 and 0 or c)) ",
    "if ok and type(n) == \"number\" then return 1 + 2 * n end return 1"
);
/// A reader's extend: only a reader whose expiry has not passed; its expiry becomes
/// `max(its expiry, now + ARGV[2])`, and the key lives at least `ARGV[2]` ms more (set from
/// the argument's text, as in [`SHARED_ACQUIRE_BODY`]). Answers 1 or 0; a refusal of the
/// `ZSCORE` other than `WRONGTYPE` is the answer.
pub(crate) const SHARED_EXTEND_BODY: &str = "local s = redis.pcall(\"zscore\", KEYS[1], ARGV[1]) if type(s) == \"table\" and not string.find(s.err, \"WRONGTYPE\", 1, true) then return s end if type(s) ~= \"string\" then return 0 end local t = redis.call(\"time\") local now = t[1] * 1000 + math.floor(t[2] / 1000) if tonumber(s) <= now then return 0 end local ttl = tonumber(ARGV[2]) if now + ttl > tonumber(s) then redis.call(\"zadd\", KEYS[1], now + ttl, ARGV[1]) end if redis.call(\"pttl\", KEYS[1]) < ttl then redis.call(\"pexpire\", KEYS[1], ARGV[2]) end return 1";

fn sha_hex(body: &str) -> [u8; 40] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha1::digest(body.as_bytes());
    let mut out = [0u8; 40];
    for (i, byte) in digest.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 15)];
    }
    out
}

/// Each connection's input and output buffers start this large: a burst of pipelined
/// requests or replies (a shared engine under load) fits without growing on the hot path.
const IO_BUFFER: usize = 8 << 10;
/// Replies matched in one read before they are handed on: more than a read usually holds.
const ANSWERED_CAPACITY: usize = 64;
/// Requests awaiting replies on one connection: room for a deep pipeline before growing
/// (`max_pending` bounds it).
const PENDING_CAPACITY: usize = 256;
/// The arguments of scripts that may be replayed on a fresh connection: a few hundred
/// releases and extends in flight.
const SCRIPT_TAILS_CAPACITY: usize = 16 << 10;
/// Room reserved for a command's array header (`*<argc>\r\n`, at most 23 bytes) and slack.
const ARRAY_HEADER_MAX: usize = 32;

/// How many scripts there are (see [`scripts`]).
pub(crate) const SCRIPT_COUNT: usize = 16;

/// The index of the release (compare-and-delete, then the notice) in [`scripts`].
pub(crate) const RELEASE_SCRIPT: usize = 0;

/// The index of the extend (compare-and-pexpire) in [`scripts`].
pub(crate) const EXTEND_SCRIPT: usize = 1;

/// The index of the fenced acquire (`SET NX` and the counter's read) in [`scripts`].
pub(crate) const FENCED_ACQUIRE_SCRIPT: usize = 2;

/// The index of the fence write-back in [`scripts`].
pub(crate) const FENCE_WRITE_SCRIPT: usize = 3;

/// The index of the simulator's flawed fenced acquire (no write-back) in [`scripts`].
pub(crate) const FLAWED_ACQUIRE_SCRIPT: usize = 4;

/// The index of the release without the notice in [`scripts`].
pub(crate) const QUIET_RELEASE_SCRIPT: usize = 5;

/// The index of the waiting mark's script in [`scripts`].
pub(crate) const MARK_SCRIPT: usize = 6;

/// The index of the fence repair's script in [`scripts`].
pub(crate) const REPAIR_SCRIPT: usize = 7;

/// The index of the all-or-none acquire of a set in [`scripts`].
pub(crate) const SET_ACQUIRE_SCRIPT: usize = 8;

/// The index of the fenced all-or-none acquire of a set in [`scripts`].
pub(crate) const SET_FENCED_ACQUIRE_SCRIPT: usize = 9;

/// The index of a set's release (with or without notices: its last argument) in [`scripts`].
pub(crate) const SET_RELEASE_SCRIPT: usize = 10;

/// The index of a set's extend in [`scripts`].
pub(crate) const SET_EXTEND_SCRIPT: usize = 11;

/// The index of a shared (read) lock's acquire in [`scripts`].
pub(crate) const SHARED_ACQUIRE_SCRIPT: usize = 12;

/// The index of a shared lock's release (notices on or off by its last argument).
pub(crate) const SHARED_RELEASE_SCRIPT: usize = 13;

/// The index of a shared lock's extend.
pub(crate) const SHARED_EXTEND_SCRIPT: usize = 14;

/// The index of a waiting reader's mark (`keys.rs`).
pub(crate) const READER_MARK_SCRIPT: usize = 15;

/// What each script is and the commands it calls, by index, as an ACL refusal of one of them
/// names it ([`NodeFault::Permission`]): the user needs every one (docs/production.md gives a
/// rule that grants them). A unit test holds each against its body.
pub(crate) const SCRIPT_CALLS: [&str; SCRIPT_COUNT] = [
    "the release script (GET, DEL, PUBSUB NUMSUB, PUBLISH)",
    "the extend script (GET, PEXPIRE, PTTL)",
    "the fenced acquire script (HMGET, HLEN, SET)",
    "the fence write-back script (HMGET, HLEN, GET, HSET)",
    "the simulator's flawed fenced acquire (SET, HINCRBY)",
    "the release script (GET, DEL)",
    "the waiting mark's script (GET, SET)",
    "the fence repair script (HMGET, HLEN, HSET)",
    "a set's acquire script (EXISTS, SET)",
    "a set's fenced acquire script (HMGET, HLEN, EXISTS, SET)",
    "a set's release script (MGET, DEL, PUBSUB NUMSUB, PUBLISH)",
    "a set's extend script (MGET, PEXPIRE, PTTL)",
    "a read lock's acquire script (GET, PTTL, ZSCORE, TIME, ZADD, PEXPIRE)",
    "a read lock's release script (ZREM, ZSCORE, ZCARD, TIME, ZRANGEBYSCORE, DEL, GET, PUBSUB NUMSUB, PUBLISH)",
    "a read lock's extend script (ZSCORE, TIME, ZADD, PTTL, PEXPIRE)",
    "a waiting reader's mark script (GET, SET)",
];

/// The scripts, their SHA-1 computed once per process: 0 release, 1 extend, 2 fenced acquire,
/// 3 fence write-back, 4 the simulator's flawed fenced acquire (see `fence.rs`), 5 release
/// without the notice, 6 the waiting mark (`keys.rs`), 7 the fence repair (`fence.rs`), 8–11
/// a set's acquire, fenced acquire, release and extend, 12–15 a shared lock's acquire, release
/// and extend, and a waiting reader's mark.
pub(crate) fn scripts() -> &'static [Script; SCRIPT_COUNT] {
    static SCRIPTS: OnceLock<[Script; SCRIPT_COUNT]> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        let bodies = [
            RELEASE_BODY,
            EXTEND_BODY,
            crate::proto::fencing::ACQUIRE_BODY,
            crate::proto::fencing::WRITE_BODY,
            crate::proto::fencing::INCR_BODY,
            QUIET_RELEASE_BODY,
            crate::model::keys::MARK_BODY,
            crate::proto::fencing::REPAIR_BODY,
            SET_ACQUIRE_BODY,
            SET_FENCED_ACQUIRE_BODY,
            SET_RELEASE_BODY,
            SET_EXTEND_BODY,
            SHARED_ACQUIRE_BODY,
            SHARED_RELEASE_BODY,
            SHARED_EXTEND_BODY,
            crate::model::keys::READER_MARK_BODY,
        ];
        let mut index = 0;
        bodies.map(|body| {
            index += 1;
            let sha = sha_hex(body);
            Script {
                index: index - 1,
                body,
                evalsha: evalsha_head(&sha),
            }
        })
    })
}

/// A server's refusal that passes by itself: busy (a script, loading, a replica's master
/// down) or, `ERR`, over its `maxclients`.
pub(crate) fn is_transient(kind: ErrorKind, message: &str) -> bool {
    match kind {
        ErrorKind::Busy | ErrorKind::Loading | ErrorKind::MasterDown => true,
        ErrorKind::Err => message.contains("max number of clients reached"),
        _ => false,
    }
}

/// Scripts that write a new hold (an acquire's): not sent again after a `NOSCRIPT` once other
/// requests are behind them on the connection (`State::on_frame`).
fn writes_a_hold(index: usize) -> bool {
    matches!(
        index,
        FENCED_ACQUIRE_SCRIPT
            | FLAWED_ACQUIRE_SCRIPT
            | SET_ACQUIRE_SCRIPT
            | SET_FENCED_ACQUIRE_SCRIPT
            | SHARED_ACQUIRE_SCRIPT
    )
}

/// Scripts that may be sent again on a fresh connection: releases and extend (compare-and-
/// delete, compare-and-pexpire). Not the fenced ones: the acquire holds a `SET NX`, and a
/// write-back or a repair carries the `run_id` of the connection it was meant for.
fn replayable(index: usize) -> bool {
    matches!(
        index,
        RELEASE_SCRIPT
            | EXTEND_SCRIPT
            | QUIET_RELEASE_SCRIPT
            | SET_RELEASE_SCRIPT
            | SET_EXTEND_SCRIPT
            | SHARED_RELEASE_SCRIPT
            | SHARED_EXTEND_SCRIPT
    )
}

/// What a request was, so its reply can be interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Part of the handshake; handled here, never delivered.
    Handshake(Step),
    /// `SET key token NX PX ttl`.
    Set,
    /// `EVALSHA`/`EVAL` of a script (index into [`scripts`]).
    Script(usize),
    /// Anything else (status queries).
    Command,
    /// `SUBSCRIBE` / `UNSUBSCRIBE` of one channel: answered by a push confirmation (RESP3),
    /// which is consumed here, or by an error, which is delivered.
    Subscribe,
    /// A `message` push (a release notice): delivered as it comes, answering no request.
    Notice,
    /// `HELLO 3` on a connection opened with RESP2, before its first `SUBSCRIBE` (in RESP2 a
    /// subscribed connection could run nothing else).
    Upgrade,
}

/// Handshake steps, in the order they are pipelined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `HELLO 3 [AUTH user pass]`: answered with a RESP3 map.
    Hello,
    /// `AUTH [user] pass`: answered `+OK`.
    Auth,
    /// `SELECT db`: answered `+OK`.
    Select,
    /// `CLIENT SETNAME name`: answered `+OK`.
    SetName,
    /// `INFO server`: answered with a bulk (or verbatim) string.
    Info,
    /// `INFO memory` (the eviction policy): the same, asked and needed as `INFO server` is.
    Memory,
}

impl Step {
    /// The command, as error messages name it.
    fn command(self) -> &'static str {
        match self {
            Step::Hello => "HELLO",
            Step::Auth => "AUTH",
            Step::Select => "SELECT",
            Step::SetName => "CLIENT SETNAME",
            Step::Info => "INFO server",
            Step::Memory => "INFO memory",
        }
    }

    /// True when `frame` is the kind of answer this step gets from a real server. Anything else
    /// (an `INFO` answered `+OK`, a `HELLO` answered `:1`) is a server that does not speak the
    /// protocol, and fails the handshake.
    fn accepts(self, frame: &Frame<'_>) -> bool {
        match self {
            // A RESP3 map, the proof that the connection speaks RESP3 from here on (the engine
            // subscribes on it for that). A RESP2 array is `HELLO 2`'s answer: a server (or a
            // proxy) that answers `HELLO 3` so stays in RESP2, where a subscribed connection's
            // messages are arrays that FIFO matching would take for replies (found by review).
            Step::Hello => {
                matches!(frame, Frame::Aggregate(a) if a.kind() == AggregateKind::Map)
            }
            Step::Auth | Step::Select | Step::SetName => matches!(frame, Frame::Simple("OK")),
            Step::Info | Step::Memory => matches!(frame, Frame::Bulk(_) | Frame::Verbatim { .. }),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    kind: Kind,
    tag: u64,
    sent: Instant,
    /// For scripts: bytes of the command after the script argument, kept in `script_tails`.
    tail: usize,
    /// For scripts: how many arguments that tail holds.
    argc: usize,
    /// First sent, or sent once more on a fresh connection after its first connection dropped.
    sending: Sending,
    /// For scripts: sent as `EVAL` (the script itself), so a `NOSCRIPT` reply to it is the
    /// server's fault, not ours to answer again.
    eval: bool,
}

/// Whether a request is on its first connection or was sent again after that one dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sending {
    First,
    Again,
}

/// A reply (or a fault) for one request, handed to the driver.
pub(crate) struct Delivery<'a> {
    pub tag: u64,
    pub kind: Kind,
    pub reply: Result<Frame<'a>, &'a NodeFault>,
    /// The connection the reply came on, and what its node said in `INFO server` there.
    pub generation: u64,
    /// What the node's `INFO memory` said on that connection about evicting keys.
    pub eviction: Eviction,
    /// (A reference: a `ServerInfo` inline made a `Delivery` too large to be moved without a
    /// `memcpy` call, two per reply.)
    pub info: Option<&'a ServerInfo>,
    /// This request was answered earlier (that answer was delivered), but the same read then
    /// turned out to carry surplus frames or garbage: the node does not speak the protocol, and
    /// its answer is taken back. `reply` holds the fault.
    pub withdrawn: bool,
}

/// What the node said about itself in `INFO server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub run_id: [u8; 40],
    /// `uptime_in_seconds`; `None` when missing or not a whole number of seconds (Redis prints
    /// a signed `time_t`: negative after the server's clock stepped back). The restart tracking
    /// counts `None` as 0 the first time it meets the `run_id`, and as no news after that.
    pub uptime: Option<Duration>,
    /// When the reply arrived: the node started at about `seen - uptime`.
    pub seen: Instant,
    /// How many times this session's handshakes have met another process at this address
    /// than the one before (a restart, a failover, and back): the restart tracking treats a
    /// count that grew as a new process even when the `run_id` is one it knew, and a count
    /// above zero as one when it knew none — a connection can come up and go down without
    /// carrying one answer to the engine.
    pub changes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No socket: a working connection was closed (by the server's idle `timeout`, a proxy,
    /// `CLIENT KILL`, a restart). The next request reconnects at once, within its operation.
    Closed,
    /// No socket: connecting failed. No connect attempt before `retry_at`.
    Down { retry_at: Instant },
    /// TCP connect in progress.
    Connecting { deadline: Instant },
    /// Connected; handshake replies outstanding.
    Handshaking { deadline: Instant },
    /// Ready for requests.
    Ready,
}

/// Session state that reply handling mutates (split from the buffers the frames borrow).
struct State {
    phase: Phase,
    out: BytesMut,
    /// Requests queued while the handshake is under way: written only once every handshake
    /// reply has come back right, so that a failed `AUTH` or `SELECT` can never let a `SET` run
    /// as the wrong user or in the wrong database.
    held: BytesMut,
    /// Requests answered in the current read (tag, kind), so that a read that turns out to
    /// carry surplus frames or garbage can take their answers back.
    answered: Vec<(u64, Kind)>,
    pending: VecDeque<Pending>,
    script_tails: BytesMut,
    loaded: [bool; SCRIPT_COUNT],
    handshake_left: usize,
    /// This connection's connect deadline was moved once already ([`Session::unwatched_grace`]).
    graced: bool,
    backoff: Duration,
    last_fault: Option<NodeFault>,
    failure: Option<NodeFault>,
    info: Option<ServerInfo>,
    /// This connection's `INFO memory`, read.
    eviction: Eviction,
    generation: u64,
    /// The address's database (named when `SELECT` is refused).
    db: u32,
    /// Whether an error answer to `INFO server` fails the handshake.
    info_need: InfoNeed,
    /// The simulator's defect, if any (`ConnConfig::mutation`).
    mutation: crate::model::mutation::Mutation,
    /// The `run_id` its last handshake met, and how often it changed (`ServerInfo::changes`).
    last_run_id: Option<[u8; 40]>,
    run_id_changes: u32,
    /// The handshake succeeded (or a request was answered): the connection has proven itself,
    /// so losing it reconnects at once.
    replied: bool,
    /// What this node's connections count (read by the engine's handles), and the node's
    /// `host:port` for events.
    counters: Arc<NodeCounters>,
    #[cfg_attr(not(feature = "log"), allow(dead_code))]
    name: String,
    /// Whether a connection of this node was ever ready, and whether the last one was lost (or
    /// failed to come up) since: the next one up is a reconnect.
    ever_up: bool,
    down: bool,
}

/// One node's protocol state; see the module docs.
pub(crate) struct Session {
    addr: NodeAddr,
    config: ConnConfig,
    inp: BytesMut,
    decoder: Decoder,
    st: State,
    /// Scripts to send again on the next connection (a working one dropped under them).
    replay: Vec<(Pending, Vec<u8>)>,
    /// The session failed the connection: the socket must be closed.
    close: bool,
    /// The last connection failed before it proved itself (its address refused, say): the
    /// next connect tries the name's next address (`crate::runtime::resolve`).
    last_unproven: bool,
}

pub(crate) type Sink<'s> = dyn for<'a> FnMut(Delivery<'a>) + 's;

impl Session {
    pub fn new(addr: NodeAddr, config: ConnConfig, now: Instant) -> Session {
        let decoder = Decoder::new(config.settings.limits);
        let backoff = config.settings.backoff_min;
        let db = addr.db;
        let info_need = config.info;
        // Built once per node (the name of its events): not on the hot path.
        let name = addr.to_string();
        Session {
            addr,
            inp: BytesMut::with_capacity(IO_BUFFER),
            decoder,
            st: State {
                phase: Phase::Down { retry_at: now },
                // Sized for a burst of pipelined requests (a shared engine under load, or
                // releases lingering on a slow machine): growing them later allocates on the
                // hot path.
                out: BytesMut::with_capacity(IO_BUFFER),
                held: BytesMut::new(),
                answered: Vec::with_capacity(ANSWERED_CAPACITY),
                pending: VecDeque::with_capacity(PENDING_CAPACITY),
                script_tails: BytesMut::with_capacity(SCRIPT_TAILS_CAPACITY),
                loaded: [false; SCRIPT_COUNT],
                handshake_left: 0,
                graced: false,
                backoff,
                last_fault: None,
                failure: None,
                info: None,
                eviction: Eviction::Unknown,
                generation: 0,
                db,
                info_need,
                mutation: config.mutation,
                last_run_id: None,
                run_id_changes: 0,
                replied: false,
                counters: Arc::default(),
                name,
                ever_up: false,
                down: false,
            },
            config,
            replay: Vec::new(),
            close: false,
            last_unproven: false,
        }
    }

    /// What this node's connections count; the engine reads it (and counts into it).
    pub fn counters(&self) -> &Arc<NodeCounters> {
        &self.st.counters
    }

    /// True while the node is known to be down: its last connection was lost or failed to come
    /// up, and no new one is ready yet.
    pub fn is_down(&self) -> bool {
        self.st.down
    }

    /// True once the handshake is done.
    pub fn is_ready(&self) -> bool {
        self.st.phase == Phase::Ready
    }

    /// When a node that is down may be connected again (its backoff ends); `None` unless down.
    pub fn retry_at(&self) -> Option<Instant> {
        match self.st.phase {
            Phase::Down { retry_at } => Some(retry_at),
            _ => None,
        }
    }

    /// True while a connect or handshake is under way.
    pub fn is_connecting(&self) -> bool {
        matches!(
            self.st.phase,
            Phase::Connecting { .. } | Phase::Handshaking { .. }
        )
    }

    /// Which connection this is: it changes with every connect (subscriptions do not survive
    /// it).
    /// What the node said about itself in `INFO server` on the current connection.
    pub fn info(&self) -> Option<ServerInfo> {
        self.st.info
    }

    /// The last connection failed before it proved itself (see [`crate::runtime::resolve`]).
    pub fn last_unproven(&self) -> bool {
        self.last_unproven
    }

    pub fn generation(&self) -> u64 {
        self.st.generation
    }

    /// Requests sent and not answered yet (handshake included).
    pub fn pending(&self) -> usize {
        self.st.pending.len()
    }

    /// Bytes buffered: unsent output and undecoded input.
    pub fn buffered(&self) -> (usize, usize) {
        (self.st.out.len(), self.inp.len())
    }

    /// The earliest instant at which [`Session::on_timer`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let phase = match self.st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline } => Some(deadline),
            _ => None,
        };
        let stale = self
            .st
            .pending
            .front()
            .map(|p| p.sent + self.config.settings.reply_timeout);
        match (phase, stale) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a socket must be opened now: there is none (closed, or down with its backoff
    /// over). Fails at once while backing off.
    pub fn connect_due(&self, now: Instant) -> Result<bool, NodeFault> {
        match self.st.phase {
            Phase::Down { retry_at } if now < retry_at => Err(NodeFault::Backoff(Box::new(
                self.st.last_fault.clone().unwrap_or(NodeFault::Closed),
            ))),
            Phase::Down { .. } | Phase::Closed => Ok(true),
            _ => Ok(false),
        }
    }

    /// A socket was opened and its connect is under way: a fresh state, the handshake queued
    /// first, then the scripts to send again.
    pub fn connecting(&mut self, now: Instant) {
        self.decoder.reset();
        self.inp.clear();
        self.close = false;
        let st = &mut self.st;
        st.out.clear();
        st.held.clear();
        st.pending.clear();
        st.script_tails.clear();
        st.loaded = [false; SCRIPT_COUNT];
        st.info = None;
        st.eviction = Eviction::Unknown;
        st.failure = None;
        st.replied = false;
        st.generation += 1;
        st.counters.connects.bump();
        st.graced = false;
        st.phase = Phase::Connecting {
            deadline: now + self.config.settings.connect_timeout,
        };
        self.queue_handshake(now);
        for (p, tail) in std::mem::take(&mut self.replay) {
            let Kind::Script(index) = p.kind else {
                continue;
            };
            self.st
                .queue_script(&scripts()[index], p.tag, &tail, p.argc, now, Sending::Again);
        }
    }

    /// Opening a socket failed: the scripts waiting to be sent again get the fault, and the
    /// next attempt waits for the backoff.
    pub fn connect_failed(&mut self, fault: NodeFault, now: Instant, sink: &mut Sink<'_>) {
        for (p, _) in std::mem::take(&mut self.replay) {
            sink(Delivery {
                tag: p.tag,
                kind: p.kind,
                reply: Err(&fault),
                generation: self.st.generation,
                eviction: self.st.eviction,
                info: None,
                withdrawn: false,
            });
        }
        self.fail(fault, now, sink);
    }

    /// The socket's connect finished: the handshake (or the requests) may be written.
    pub fn connected(&mut self) {
        if let Phase::Connecting { deadline } = self.st.phase {
            self.st.phase = if self.st.handshake_left > 0 {
                Phase::Handshaking { deadline }
            } else {
                self.st.came_up();
                Phase::Ready
            };
        }
    }

    /// True while the socket's connect is still under way.
    pub fn awaits_connect(&self) -> bool {
        matches!(self.st.phase, Phase::Connecting { .. })
    }

    /// Room for one more request: at `max_pending` the request is refused (`Overloaded`: the
    /// node fails for that operation) and the connection is kept.
    ///
    /// Not failed: a full connection is most often a live node with many callers (K callers of
    /// one engine keep up to ~3K requests outstanding), and failing it failed every request on
    /// it, sent their releases to the ledger and reconnected — under steady load, again and
    /// again, with no fault at all (issue 36; the simulator's reconnect check found it with 4
    /// callers and `max_pending` 8). A node that has stopped answering is reset by
    /// `reply_timeout` instead; meanwhile its requests are refused at once, which is as fast as
    /// a reconnect's failures were.
    pub fn admit(&mut self, now: Instant, sink: &mut Sink<'_>) -> Result<(), NodeFault> {
        if self.st.pending.len() >= self.config.settings.max_pending {
            if self.config.mutation.fail_when_full() {
                self.fail(NodeFault::Overloaded, now, sink);
            }
            return Err(NodeFault::Overloaded);
        }
        Ok(())
    }

    /// How long a connect (TCP, TLS and the handshake) may take.
    pub fn connect_timeout(&self) -> Duration {
        self.config.settings.connect_timeout
    }

    /// Queues an encoded command.
    pub fn request(&mut self, kind: Kind, tag: u64, encoded: &[u8], now: Instant) {
        self.st.queue_buffer().extend_from_slice(encoded);
        self.st.pending.push_back(Pending {
            kind,
            tag,
            sent: now,
            tail: 0,
            argc: 0,
            sending: Sending::First,
            eval: false,
        });
    }

    /// Queues a script call: `EVALSHA` once the script is known on this connection, `EVAL`
    /// (which loads it) before. `tail` is the encoded `numkeys key... arg...` (`argc` bulk
    /// strings), the same for every node, so it is encoded once per operation.
    pub fn script(&mut self, call: ScriptCall<'_>, now: Instant) {
        let ScriptCall {
            script,
            tag,
            tail,
            argc,
        } = call;
        self.st
            .queue_script(script, tag, tail, argc, now, Sending::First);
    }

    /// The bytes to write now: none before the socket is connected.
    pub fn output(&self) -> &[u8] {
        if matches!(self.st.phase, Phase::Handshaking { .. } | Phase::Ready) {
            &self.st.out
        } else {
            &[]
        }
    }

    /// `n` bytes of [`Session::output`] were written.
    pub fn written(&mut self, n: usize) {
        self.st.out.advance(n);
    }

    /// A readiness event starts a read (of one or more chunks): answers delivered from here on
    /// are the ones a protocol failure in it takes back.
    pub fn read_begin(&mut self) {
        self.st.answered.clear();
    }

    /// Bytes read from the socket: every complete frame is matched to its request and
    /// delivered; a partial one is kept. Garbage, an unexpected frame or a failed handshake
    /// fails the connection (answers of this read taken back first).
    pub fn on_bytes(&mut self, bytes: &[u8], now: Instant, sink: &mut Sink<'_>) {
        let Session {
            inp, decoder, st, ..
        } = self;
        if inp.is_empty() {
            // The common case: decode straight from the bytes read, keep only a partial tail.
            let used = decode_frames(decoder, bytes, st, now, sink);
            inp.extend_from_slice(&bytes[used..]);
        } else {
            inp.extend_from_slice(bytes);
            let used = decode_frames(decoder, inp, st, now, sink);
            inp.advance(used);
        }
        if let Some(fault) = self.st.failure.take() {
            self.st.withdraw_answered(&fault, sink);
            self.fail(fault, now, sink);
        }
    }

    /// The connect (or handshake) deadline passed while nobody watched the socket — the turn
    /// that sees it began its `poll` after the deadline — and the socket made progress in that
    /// turn: the deadline moves to `now + connect_timeout`, once per connection; true if it
    /// moved. An operation returns at its quorum and leaves a slower node's connect or TLS
    /// handshake half done; with nothing polling until the next operation (a `Client`; a
    /// handle's idle engine thread), that node's answer was read only after the deadline, in a
    /// turn whose timers then failed it: a healthy node behind TLS (several round trips) or a
    /// farther network, whose idle connections the server closes (`timeout`), was found down at
    /// every operation spaced more than the connect timeout apart (found by review). A node
    /// that does not answer is still failed at its deadline: no progress, no grace; nor a second
    /// time on one connection.
    pub fn unwatched_grace(&mut self, now: Instant, watched_from: Instant) -> bool {
        let st = &mut self.st;
        match &mut st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline }
                if !st.graced && *deadline < watched_from && now >= *deadline =>
            {
                *deadline = now + self.config.settings.connect_timeout;
                st.graced = true;
                true
            }
            _ => false,
        }
    }

    /// Deadlines: connect/handshake timeout, and requests unanswered for `reply_timeout`.
    pub fn on_timer(&mut self, now: Instant, sink: &mut Sink<'_>) {
        match self.st.phase {
            Phase::Connecting { deadline } | Phase::Handshaking { deadline } if now >= deadline => {
                self.fail(NodeFault::ConnectTimeout, now, sink);
                return;
            }
            _ => {}
        }
        if let Some(p) = self.st.pending.front()
            && now >= p.sent + self.config.settings.reply_timeout
        {
            self.fail(NodeFault::Timeout, now, sink);
        }
    }

    /// The session failed the connection: the socket is to be closed.
    pub fn closing(&self) -> bool {
        self.close
    }

    /// True once after the session failed the connection: the socket must be closed.
    pub fn take_close(&mut self) -> bool {
        std::mem::take(&mut self.close)
    }

    /// Scripts wait for a fresh connection: open one at once.
    pub fn wants_replay(&self) -> bool {
        !self.replay.is_empty()
    }

    /// Fails the connection: every request still waiting gets the fault, the socket is to be
    /// closed, and the next use reconnects — at once if the connection had been working, after
    /// a growing backoff if it never came up.
    ///
    /// Extend and release scripts are idempotent (compare-and-pexpire, compare-and-delete), so
    /// when a working connection drops under them (the server closed it: idle `timeout`, a
    /// proxy, `CLIENT KILL`) they are kept to be sent once more on a fresh connection
    /// ([`Session::wants_replay`]); their operation's own node deadline still bounds the wait.
    /// A `SET NX` is not replayed: a second `SET` would find our own key and answer "held".
    pub fn fail(&mut self, fault: NodeFault, now: Instant, sink: &mut Sink<'_>) {
        self.close = true;
        let st = &mut self.st;
        // Taken, not read: a connect that fails before a new connection answers anything must
        // back off, whatever the previous connection did.
        let proven = std::mem::take(&mut st.replied);
        self.last_unproven = !proven;
        let replay = proven && matches!(fault, NodeFault::Closed | NodeFault::Io(_));
        // A proven connection the server closed with nothing asked of it: its `timeout`, a
        // proxy's idle limit, `CLIENT KILL`. Routine, and mended by the next request's
        // reconnect: not a node down (no warning, not unreachable, not in `downs`).
        let idle = proven && fault == NodeFault::Closed && st.pending.is_empty();
        while let Some(p) = st.pending.pop_front() {
            match p.kind {
                Kind::Handshake(_) => {}
                // Rare path: the request to send again, with its script arguments.
                Kind::Script(index)
                    if replay && p.sending == Sending::First && replayable(index) =>
                {
                    self.replay.push((p, st.script_tails[..p.tail].to_vec()));
                }
                _ => sink(Delivery {
                    tag: p.tag,
                    kind: p.kind,
                    reply: Err(&fault),
                    generation: st.generation,
                    eviction: st.eviction,
                    info: st.info.as_ref(),
                    withdrawn: false,
                }),
            }
            st.script_tails.advance(p.tail);
        }
        st.out.clear();
        st.held.clear();
        st.script_tails.clear();
        self.inp.clear();
        self.decoder.reset();
        if idle {
            st.counters.idle_closes.bump();
            event!(Debug, event = "idle_close", node = st.name.as_str();
                "{}: the server closed the idle connection; reconnecting at the next request",
                st.name);
        } else if st.down {
            st.counters.downs.bump();
            event!(Debug, event = "node_down", node = st.name.as_str(), fault:% = fault;
                "{}: still down ({fault})", st.name);
        } else {
            st.counters.downs.bump();
            event!(Warn, event = "node_down", node = st.name.as_str(), fault:% = fault;
                "{}: node down ({fault})", st.name);
        }
        st.down |= !idle;
        st.last_fault = Some(fault);
        if proven {
            st.backoff = self.config.settings.backoff_min;
            st.phase = Phase::Closed;
        } else {
            // No connect attempt for the current backoff, which doubles for the next failure.
            let wait = st.backoff;
            st.backoff = (st.backoff * 2).min(self.config.settings.backoff_max);
            st.phase = Phase::Down {
                retry_at: now + wait,
            };
        }
    }

    /// The handshake, pipelined in the first write: one round trip, whatever it contains.
    fn queue_handshake(&mut self, now: Instant) {
        let addr = &self.addr;
        let st = &mut self.st;
        let mut steps = 0;
        let mut push = |st: &mut State, step: Step, args: &[Arg<'_>]| {
            resp::encode_command(&mut st.out, args);
            st.pending.push_back(Pending {
                kind: Kind::Handshake(step),
                tag: 0,
                sent: now,
                tail: 0,
                argc: 0,
                sending: Sending::First,
                eval: false,
            });
            steps += 1;
        };
        let user = addr.username.as_deref();
        let pass = addr.password();
        if addr.protocol == 3 {
            match pass {
                Some(p) => push(
                    st,
                    Step::Hello,
                    &[
                        "HELLO".into(),
                        "3".into(),
                        "AUTH".into(),
                        user.unwrap_or("default").into(),
                        p.into(),
                    ],
                ),
                None => push(st, Step::Hello, &["HELLO".into(), "3".into()]),
            }
        } else if let Some(p) = pass {
            match user {
                Some(u) => push(st, Step::Auth, &["AUTH".into(), u.into(), p.into()]),
                None => push(st, Step::Auth, &["AUTH".into(), p.into()]),
            }
        }
        if addr.db != 0 {
            push(
                st,
                Step::Select,
                &["SELECT".into(), u64::from(addr.db).into()],
            );
        }
        if let Some(name) = &self.config.settings.client_name {
            push(
                st,
                Step::SetName,
                &["CLIENT".into(), "SETNAME".into(), name.as_str().into()],
            );
        }
        if self.config.info != InfoNeed::Off {
            push(st, Step::Info, &["INFO".into(), "server".into()]);
            if self.config.memory {
                push(st, Step::Memory, &["INFO".into(), "memory".into()]);
            }
            if self.config.info == InfoNeed::Wanted {
                // Not a gate: the requests follow them in the same write, without waiting for
                // their answers, which come before theirs.
                steps -= 1 + usize::from(self.config.memory);
            }
        }
        st.handshake_left = steps;
    }
}

/// Decodes and dispatches every complete frame in `buf`; returns the bytes consumed.
fn decode_frames(
    decoder: &mut Decoder,
    buf: &[u8],
    st: &mut State,
    now: Instant,
    sink: &mut Sink<'_>,
) -> usize {
    let mut used = 0;
    while st.failure.is_none() {
        match decoder.decode(&buf[used..]) {
            Ok(Status::Complete((frame, n))) => {
                used += n;
                st.on_frame(frame, now, sink);
            }
            Ok(Status::Partial) => break,
            Err(e) => st.failure = Some(NodeFault::Protocol(e)),
        }
    }
    used
}

impl State {
    /// Where a new request's bytes go: straight out, or held until the handshake is done.
    fn queue_buffer(&mut self) -> &mut BytesMut {
        if self.handshake_left > 0 {
            &mut self.held
        } else {
            &mut self.out
        }
    }

    /// Queues a script call: `EVALSHA` once the script is known on this connection, `EVAL`
    /// (which loads it) before.
    fn queue_script(
        &mut self,
        script: &Script,
        tag: u64,
        tail: &[u8],
        argc: usize,
        now: Instant,
        sending: Sending,
    ) {
        let loaded = self.loaded[script.index];
        let out = self.queue_buffer();
        if loaded {
            out.reserve(ARRAY_HEADER_MAX + EVALSHA_HEAD_LEN + tail.len());
            resp::encode_array_header(out, 2 + argc);
            out.extend_from_slice(&script.evalsha);
        } else {
            let (verb, head) = (Arg::Bytes(b"EVAL"), Arg::Bytes(script.body.as_bytes()));
            out.reserve(
                ARRAY_HEADER_MAX + resp::bulk_len(&verb) + resp::bulk_len(&head) + tail.len(),
            );
            resp::encode_array_header(out, 2 + argc);
            resp::encode_bulk(out, &verb);
            resp::encode_bulk(out, &head);
        }
        out.extend_from_slice(tail);
        // Keep the arguments so a NOSCRIPT reply can be answered with EVAL, transparently.
        self.script_tails.extend_from_slice(tail);
        self.pending.push_back(Pending {
            kind: Kind::Script(script.index),
            tag,
            sent: now,
            tail: tail.len(),
            argc,
            sending,
            eval: !loaded,
        });
    }

    /// Takes back the answers delivered in the read that `fault` spoiled.
    fn withdraw_answered(&mut self, fault: &NodeFault, sink: &mut Sink<'_>) {
        for &(tag, kind) in &self.answered {
            sink(Delivery {
                tag,
                kind,
                reply: Err(fault),
                generation: self.generation,
                eviction: self.eviction,
                info: self.info.as_ref(),
                withdrawn: true,
            });
        }
        self.answered.clear();
    }

    fn on_frame(&mut self, frame: Frame<'_>, now: Instant, sink: &mut Sink<'_>) {
        if let Frame::Aggregate(agg) = frame
            && agg.kind() == AggregateKind::Push
        {
            // RESP3 out-of-band data is not a reply to anything, except the confirmation of a
            // (un)subscription, which takes the place of its reply.
            match agg.iter().next() {
                Some(Frame::Bulk(b"message")) => sink(Delivery {
                    tag: 0,
                    kind: Kind::Notice,
                    reply: Ok(frame),
                    generation: self.generation,
                    eviction: self.eviction,
                    info: self.info.as_ref(),
                    withdrawn: false,
                }),
                Some(Frame::Bulk(b"subscribe" | b"unsubscribe"))
                    if self
                        .pending
                        .front()
                        .is_some_and(|p| p.kind == Kind::Subscribe) =>
                {
                    self.pending.pop_front();
                }
                _ => {}
            }
            return;
        }
        let Some(p) = self.pending.pop_front() else {
            self.failure = Some(NodeFault::Unexpected("with no request outstanding".into()));
            return;
        };
        if !matches!(p.kind, Kind::Handshake(_)) {
            self.replied = true;
        }
        match p.kind {
            Kind::Handshake(step) => self.on_handshake(step, frame, now),
            Kind::Script(index) => {
                if let Frame::Error(e) = frame
                    && e.kind == crate::proto::resp::ErrorKind::NoScript
                    && !p.eval
                {
                    return self.on_noscript(index, p, frame, now, sink);
                }
                // Advancing (not split_to) keeps the buffer unshared: no allocation per reply.
                self.script_tails.advance(p.tail);
                if !matches!(frame, Frame::Error(_)) {
                    self.loaded[index] = true;
                }
                self.deliver(p, Ok(frame), now, sink);
            }
            _ => self.deliver(p, Ok(frame), now, sink),
        }
    }

    /// A `NOSCRIPT` answer to `p`, a script sent by hash (`EVALSHA`). Rare: kept out of the
    /// reply path.
    #[cold]
    #[inline(never)]
    fn on_noscript(
        &mut self,
        index: usize,
        p: Pending,
        frame: Frame<'_>,
        now: Instant,
        sink: &mut Sink<'_>,
    ) {
        // Flushed behind our back (`SCRIPT FLUSH`, a proxy that switched servers): the script
        // is unknown here from now on.
        self.counters.noscript.bump();
        self.loaded[index] = false;
        if !self.pending.is_empty() && writes_a_hold(index) {
            // Sent again it would run after the requests already written behind it — among
            // them perhaps this very lock's release (a round decided lost meanwhile) — and
            // leave a hold for nobody until its TTL (found by review). It ran nothing: the
            // node fails this request.
            event!(Debug, event = "noscript", node = self.name.as_str(), script = index;
                "{}: NOSCRIPT with requests behind it: the acquire fails here", self.name);
            self.script_tails.advance(p.tail);
            self.deliver(p, Ok(frame), now, sink);
            return;
        }
        // Send the script itself, which also loads it. Its reply comes after those of the
        // requests already written behind it (FIFO), and it runs after them on the server:
        // harmless for what is sent again (a release or an extend finds only its own token; a
        // mark is a hint). (Rare: the copy may allocate.)
        event!(Debug, event = "noscript", node = self.name.as_str(), script = index;
            "{}: NOSCRIPT, script sent again with EVAL", self.name);
        let tail = self.script_tails[..p.tail].to_vec();
        self.script_tails.advance(p.tail);
        let script = &scripts()[index];
        resp::encode_array_header(&mut self.out, 2 + p.argc);
        resp::encode_bulk(&mut self.out, &Arg::Bytes(b"EVAL"));
        resp::encode_bulk(&mut self.out, &Arg::Bytes(script.body.as_bytes()));
        self.out.extend_from_slice(&tail);
        self.script_tails.extend_from_slice(&tail);
        // A new request on the wire, at the back of `pending`: its `sent` is now, which keeps
        // `pending` in the order of its reply deadlines — `next_deadline` and `on_timer` look
        // at the front only. With its first `sent` kept, its deadline hid behind the later
        // requests in front of it: not timed out when due, then at once when they were
        // answered, however recent its `EVAL` (found by review). Its operation's own node
        // deadline bounds the wait as before. The `NOSCRIPT` was a reply: its round trip is
        // counted, as the `EVAL`'s will be.
        self.counters
            .latency
            .record(now.saturating_duration_since(p.sent));
        self.pending.push_back(Pending {
            eval: true,
            sent: now,
            ..p
        });
    }

    fn deliver(
        &mut self,
        p: Pending,
        reply: Result<Frame<'_>, &NodeFault>,
        now: Instant,
        sink: &mut Sink<'_>,
    ) {
        self.counters
            .latency
            .record(now.saturating_duration_since(p.sent));
        self.answered.push((p.tag, p.kind));
        sink(Delivery {
            tag: p.tag,
            kind: p.kind,
            reply,
            generation: self.generation,
            eviction: self.eviction,
            info: self.info.as_ref(),
            withdrawn: false,
        });
    }

    /// A connection is ready: a reconnect if the node was down.
    fn came_up(&mut self) {
        if self.down {
            self.counters.reconnects.bump();
            event!(Info, event = "node_up", node = self.name.as_str(), generation = self.generation;
                "{}: node reconnected", self.name);
        } else if !self.ever_up {
            event!(Debug, event = "node_up", node = self.name.as_str(), generation = self.generation;
                "{}: connected", self.name);
        }
        self.ever_up = true;
        self.down = false;
    }

    fn on_handshake(&mut self, step: Step, frame: Frame<'_>, now: Instant) {
        // `INFO server` or `INFO memory` refused while not needed: carry on without (the node's
        // process, or its eviction policy, unknown).
        let tolerated = matches!(step, Step::Info | Step::Memory)
            && self.info_need == InfoNeed::Wanted
            && matches!(frame, Frame::Error(_));
        if let Frame::Error(e) = frame
            && !tolerated
        {
            let message = crate::model::error::clipped(e.message);
            self.failure = Some(match (step, e.kind) {
                // A server too busy to take us yet, whatever the step: its first answer (a
                // connection over `maxclients` gets this one line, then is closed), or a
                // step refused while it loads or runs a script. Not the address's fault, so
                // not final: a caller that waits keeps waiting (found by review: it was read
                // as bad credentials, or a bad database, and `lock` gave up).
                (_, kind) if is_transient(kind, e.message) => NodeFault::Server(kind, message),
                // Any refusal of `AUTH` is of the credentials (Redis before 6 says
                // `-ERR invalid password`).
                (Step::Auth, _) => NodeFault::Auth(message),
                (Step::Hello, kind) if kind.is_auth() => NodeFault::Auth(message),
                // `HELLO` unknown (Redis before 6), `-NOPROTO`: the server does not speak
                // RESP3, which no credentials mend (found by review: it was reported as
                // credentials refused).
                (Step::Hello, _) => NodeFault::Unexpected(format!(
                    "-{message} in answer to HELLO 3 (protocol=3: the server does not speak \
                     RESP3; use protocol 2)"
                )),
                // Logged in, but the ACL user may not run this step.
                (_, ErrorKind::NoPerm) => NodeFault::Permission {
                    command: step.command(),
                    message,
                },
                (_, kind) if kind.is_auth() => NodeFault::Auth(message),
                // No such database (or none to select): the address is wrong, not the node.
                (Step::Select, _) => NodeFault::Database {
                    db: self.db,
                    message,
                },
                (_, kind) => NodeFault::Server(kind, message),
            });
            return;
        }
        if !tolerated && !step.accepts(&frame) {
            // Described from the frame, a bounded prefix of it: a megabyte of `_` nested in
            // arrays was made into ~350K owned values (~20 MB) and their whole text on every
            // reconnect before it was cut to a line (found by review).
            let why = match step {
                Step::Hello => {
                    " 3 (not a RESP3 map: the server does not speak RESP3; use protocol 2)"
                }
                _ => "",
            };
            self.failure = Some(NodeFault::Unexpected(format!(
                "{} in answer to {}{why}",
                crate::model::error::clipped_debug(&frame),
                step.command()
            )));
            return;
        }
        if step == Step::Info {
            // A tolerated error: the process stays unknown.
            let text = match frame {
                Frame::Bulk(b) | Frame::Verbatim { text: b, .. } => b,
                _ => &[],
            };
            self.info = parse_info(text, now);
            if let Some(info) = self.info.as_mut() {
                if self.last_run_id.is_some_and(|last| last != info.run_id) {
                    self.run_id_changes = self.run_id_changes.saturating_add(1);
                }
                self.last_run_id = Some(info.run_id);
                if !self.mutation.run_id_on_yes_only() {
                    info.changes = self.run_id_changes;
                }
                if self.mutation.uptime_at_its_word() {
                    // The defect brought back: the second the quarantine takes off, put back.
                    info.uptime = info
                        .uptime
                        .map(|up| up.saturating_add(crate::proto::quarantine::UPTIME_ROUNDING));
                }
            }
            if self.info_need == InfoNeed::Wanted {
                // Not one of the steps the requests wait for.
                return;
            }
        }
        if step == Step::Memory {
            // A tolerated error: unknown.
            self.eviction = match frame {
                Frame::Bulk(b) | Frame::Verbatim { text: b, .. } => Eviction::parse(b),
                _ => Eviction::Unknown,
            };
            if self.info_need == InfoNeed::Wanted {
                return;
            }
        }
        self.handshake_left = self.handshake_left.saturating_sub(1);
        if self.handshake_left == 0 {
            self.phase = Phase::Ready;
            self.came_up();
            // Only now has the connection proven itself: a node that refuses the handshake is
            // retried after the backoff, not at once by every operation.
            self.replied = true;
            // The handshake went through: the requests held back may go now.
            if self.out.is_empty() {
                std::mem::swap(&mut self.out, &mut self.held);
            } else {
                self.out.extend_from_slice(&self.held);
                self.held.clear();
            }
        }
    }
}

/// Extracts `run_id` and `uptime_in_seconds` from an `INFO server` reply: `None` without a
/// `run_id`. An uptime that is missing or not a whole number of seconds (Redis prints a signed
/// `time_t`: negative after the server's clock stepped back) is `None` and the `run_id` stands:
/// the restart tracking takes a process first met so as just started (a whole restart window
/// ahead: the safe direction), and one it knows by its `run_id` as no news. It used to throw
/// the `run_id` away with it, leaving the node unknown (fencing said "grant +info"); then it
/// counted as 0, which quarantined a known process again at every reconnect.
pub(crate) fn parse_info(text: &[u8], now: Instant) -> Option<ServerInfo> {
    let mut run_id = None;
    let mut uptime = None;
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"run_id:") {
            run_id = <[u8; 40]>::try_from(v).ok();
        } else if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
            uptime = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .map(Duration::from_secs);
        }
    }
    Some(ServerInfo {
        run_id: run_id?,
        uptime,
        seen: now,
        changes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ttl_a_script_sets_is_an_argument_as_the_client_wrote_it() {
        // Redis 7.2.0–7.2.4 turn Lua numbers such as 100000000 into `1e+08`, which `PEXPIRE`
        // and `SET … PX` refuse: a script that computed a TTL and passed the number failed
        // half-way (the shared acquire left a reader without a TTL). Every TTL argument is
        // `ARGV[…]`, the decimal text the client sent.
        let mut seen = 0;
        for script in scripts() {
            let body = script.body;
            for (at, _) in body
                .match_indices("\"pexpire\", ")
                .chain(body.match_indices("\"PX\", "))
            {
                let rest = &body[at..];
                let args = &rest[rest.find(", ").unwrap() + 2..rest.find(')').unwrap()];
                let ttl = if rest.starts_with("\"PX\"") {
                    args
                } else {
                    args.split(", ").nth(1).unwrap_or("")
                };
                assert!(ttl.starts_with("ARGV["), "{ttl:?} in {body}");
                seen += 1;
            }
        }
        assert!(seen >= 8, "only {seen} TTLs found: the scan misses them");
    }
    use crate::model::config::Config;

    /// The commands a script's body calls, upper case, in the order first called.
    fn calls(body: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut found: Vec<(usize, String)> = Vec::new();
        for head in ["redis.call(\"", "redis.pcall(\"", "pcall(redis.call, \""] {
            for (at, _) in body.match_indices(head) {
                let rest = &body[at + head.len()..];
                let name = rest[..rest.find('"').unwrap()].to_uppercase();
                found.push((
                    at,
                    if name == "PUBSUB" {
                        "PUBSUB NUMSUB".into()
                    } else {
                        name
                    },
                ));
            }
        }
        found.sort();
        for (_, name) in found {
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }

    #[test]
    fn each_script_names_the_commands_it_calls() {
        for script in scripts() {
            if script.index == FLAWED_ACQUIRE_SCRIPT && !cfg!(any(test, feature = "sim")) {
                continue;
            }
            let named = SCRIPT_CALLS[script.index];
            let list = &named[named.find('(').unwrap() + 1..named.len() - 1];
            let listed: Vec<&str> = list.split(", ").collect();
            assert_eq!(
                listed,
                calls(script.body),
                "script {}: {named}",
                script.index
            );
        }
    }

    #[test]
    fn script_hashes_match_redis() {
        // SHA-1 of the bodies, as `SCRIPT LOAD` would answer.
        let s = scripts();
        assert_eq!(s[0].sha(), &sha_hex(RELEASE_BODY)[..]);
        assert_eq!(
            std::str::from_utf8(&sha_hex("return 1")).unwrap(),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    /// What a session delivered, owned (frames borrow the read buffer).
    #[derive(Debug, PartialEq)]
    enum Got {
        Reply(u64, String),
        Fault(u64, String, bool),
    }

    fn config() -> ConnConfig {
        ConnConfig {
            // The defaults: connect 1 s, backoff 25 ms to 2 s, replies 5 s, `Limits::CLIENT`.
            settings: Config {
                max_pending: 4,
                ..Config::default()
            },
            info: InfoNeed::Off,
            memory: false,
            tls: std::sync::Arc::from([]),
            mutation: crate::model::mutation::Mutation::None,
        }
    }

    /// A session with a connected (simulated) socket: no I/O anywhere.
    fn connected(url: &str, now: Instant) -> Session {
        let mut s = Session::new(NodeAddr::parse(url).unwrap(), config(), now);
        assert_eq!(s.connect_due(now), Ok(true));
        s.connecting(now);
        assert!(
            s.output().is_empty(),
            "nothing is written before the connect finishes"
        );
        s.connected();
        s
    }

    fn feed(s: &mut Session, bytes: &[u8], now: Instant) -> Vec<Got> {
        let mut got = Vec::new();
        s.read_begin();
        s.on_bytes(bytes, now, &mut |d| {
            got.push(match d.reply {
                Ok(frame) => Got::Reply(d.tag, format!("{:?}", frame.to_value())),
                Err(fault) => Got::Fault(d.tag, fault.to_string(), d.withdrawn),
            })
        });
        got
    }

    fn take_output(s: &mut Session) -> String {
        let out = String::from_utf8_lossy(s.output()).into_owned();
        s.written(out.len());
        out
    }

    #[test]
    fn requests_are_held_until_the_handshake_succeeded() {
        let now = Instant::now();
        let mut s = connected("redis://:secret@127.0.0.1:1", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        assert_eq!(take_output(&mut s), "*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n");
        assert!(!s.is_ready());
        // AUTH answered: the held request goes out, and its reply is delivered by tag.
        assert_eq!(feed(&mut s, b"+OK\r\n", now), vec![]);
        assert!(s.is_ready());
        assert_eq!(take_output(&mut s), "*1\r\n$3\r\nSET\r\n");
        assert_eq!(
            feed(&mut s, b"+OK\r\n", now),
            vec![Got::Reply(7, "Simple(\"OK\")".into())]
        );
    }

    #[test]
    fn a_refused_handshake_never_lets_a_held_request_out() {
        let now = Instant::now();
        let mut s = connected("redis://:wrong@127.0.0.1:1", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let got = feed(&mut s, b"-WRONGPASS invalid password\r\n", now);
        assert!(
            matches!(&got[..], [Got::Fault(7, why, false)] if why.contains("WRONGPASS")),
            "{got:?}"
        );
        assert!(s.closing());
        assert!(s.output().is_empty());
        // Never answered anything: the next connect waits for the backoff.
        assert!(s.connect_due(now).is_err());
        assert_eq!(s.connect_due(now + Duration::from_millis(25)), Ok(true));
    }

    #[test]
    fn noscript_is_answered_with_eval_behind_the_requests_already_written() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        let tail = b"$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n";
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 1,
                tail,
                argc: 3,
            },
            now,
        );
        assert!(
            take_output(&mut s).contains("$4\r\nEVAL\r\n"),
            "not loaded yet: EVAL"
        );
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(1, "Integer(1)".into())]
        );
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 2,
                tail,
                argc: 3,
            },
            now,
        );
        s.request(Kind::Set, 3, b"*1\r\n$3\r\nSET\r\n", now);
        // Loaded: by hash, byte for byte what the general encoder makes of it.
        let mut by_hash = BytesMut::new();
        resp::encode_command(
            &mut by_hash,
            &[
                Arg::Bytes(b"EVALSHA"),
                Arg::Bytes(scripts()[0].sha()),
                Arg::Bytes(b"1"),
                Arg::Bytes(b"k"),
                Arg::Bytes(b"t"),
            ],
        );
        by_hash.extend_from_slice(b"*1\r\n$3\r\nSET\r\n");
        assert_eq!(take_output(&mut s), std::str::from_utf8(&by_hash).unwrap());
        // Flushed behind our back: the fallback EVAL goes out, the SET's reply is not taken
        // for the script's.
        let got = feed(&mut s, b"-NOSCRIPT No matching script\r\n+OK\r\n", now);
        assert_eq!(got, vec![Got::Reply(3, "Simple(\"OK\")".into())]);
        let out = take_output(&mut s);
        assert!(out.starts_with("*5\r\n$4\r\nEVAL\r\n"), "{out}");
        assert!(out.ends_with(std::str::from_utf8(tail).unwrap()), "{out}");
        assert_eq!(
            feed(&mut s, b":0\r\n", now),
            vec![Got::Reply(2, "Integer(0)".into())]
        );
        // A NOSCRIPT to the EVAL itself (no real server says that): delivered, not sent again
        // and again.
        let mut s = connected("redis://127.0.0.1:1", now);
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 4,
                tail,
                argc: 3,
            },
            now,
        );
        assert!(take_output(&mut s).contains("$4\r\nEVAL\r\n"));
        let got = feed(&mut s, b"-NOSCRIPT No matching script\r\n", now);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            matches!(&got[0], Got::Reply(4, r) if r.contains("NOSCRIPT")),
            "{got:?}"
        );
        assert_eq!(take_output(&mut s), "");
    }

    /// An acquire's script that meets NOSCRIPT with requests written behind it is not sent
    /// again (it would run after them — perhaps after this lock's own release — and leave a
    /// hold for nobody): the node fails that request. Alone on the connection, it is sent again.
    #[test]
    fn noscript_to_an_acquire_with_requests_behind_it_fails_it_there() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        let tail = b"$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n$3\r\n100\r\n";
        let call = |tag| ScriptCall {
            script: &scripts()[SHARED_ACQUIRE_SCRIPT],
            tag,
            tail,
            argc: 4,
        };
        s.script(call(1), now);
        take_output(&mut s);
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(1, "Integer(1)".into())]
        );
        // Loaded; flushed behind our back; a release follows on the same connection.
        s.script(call(2), now);
        s.script(
            ScriptCall {
                script: &scripts()[SHARED_RELEASE_SCRIPT],
                tag: 3,
                tail,
                argc: 4,
            },
            now,
        );
        take_output(&mut s);
        let got = feed(&mut s, b"-NOSCRIPT No matching script\r\n", now);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            matches!(&got[0], Got::Reply(2, r) if r.contains("NOSCRIPT")),
            "{got:?}"
        );
        assert_eq!(take_output(&mut s), "", "not sent again");
        assert_eq!(
            feed(&mut s, b":0\r\n", now),
            vec![Got::Reply(3, "Integer(0)".into())]
        );
        // The next one goes as EVAL; alone, a NOSCRIPT to an EVALSHA of it is answered again.
        s.script(call(4), now);
        assert!(take_output(&mut s).contains("$4\r\nEVAL\r\n"));
        feed(&mut s, b":1\r\n", now);
        s.script(call(5), now);
        assert!(take_output(&mut s).contains("EVALSHA"));
        assert_eq!(
            feed(&mut s, b"-NOSCRIPT No matching script\r\n", now),
            vec![]
        );
        assert!(take_output(&mut s).starts_with("*6\r\n$4\r\nEVAL\r\n"));
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(5, "Integer(1)".into())]
        );
    }

    #[test]
    fn garbage_after_an_answer_takes_the_answer_back() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        s.request(Kind::Set, 5, b"x", now);
        take_output(&mut s);
        let got = feed(&mut s, b"+OK\r\n?garbage\r\n", now);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Got::Reply(5, "Simple(\"OK\")".into()));
        assert!(matches!(got[1], Got::Fault(5, _, true)), "{got:?}");
        assert!(s.closing());
    }

    #[test]
    fn a_working_connection_that_drops_sends_scripts_again_but_not_sets() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        s.request(Kind::Set, 1, b"*1\r\n$3\r\nSET\r\n", now);
        assert_eq!(feed(&mut s, b"+OK\r\n", now).len(), 1);
        s.script(
            ScriptCall {
                script: &scripts()[0],
                tag: 2,
                tail: b"$1\r\n1\r\n",
                argc: 1,
            },
            now,
        );
        s.request(Kind::Set, 3, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut got = Vec::new();
        s.fail(NodeFault::Closed, now, &mut |d| got.push(d.tag));
        assert_eq!(
            got,
            vec![3],
            "the SET fails; the script waits for a new connection"
        );
        assert!(s.take_close() && s.wants_replay());
        assert_eq!(s.connect_due(now), Ok(true), "proven: reconnect at once");
        s.connecting(now);
        s.connected();
        let out = take_output(&mut s);
        assert!(out.contains("EVAL") && !out.contains("SET"), "{out}");
        assert_eq!(
            feed(&mut s, b":1\r\n", now),
            vec![Got::Reply(2, "Integer(1)".into())]
        );
    }

    #[test]
    fn deadlines_come_from_now_not_the_clock() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        s.request(Kind::Set, 9, b"x", now);
        assert_eq!(s.next_deadline(), Some(now + Duration::from_secs(5)));
        assert_eq!(feed(&mut s, b"", now), vec![]);
        let mut got = Vec::new();
        s.on_timer(now + Duration::from_millis(4_999), &mut |d| got.push(d.tag));
        assert!(got.is_empty() && !s.closing());
        s.on_timer(now + Duration::from_secs(5), &mut |d| got.push(d.tag));
        assert_eq!(got, vec![9], "the reply timeout fails the waiting request");
        assert!(s.closing());
    }

    /// A script sent again with `EVAL` after a `NOSCRIPT` goes to the back of `pending`, behind
    /// requests sent after it: its reply deadline counts from the `EVAL`, like theirs, so the
    /// front entry still has the earliest deadline.
    #[test]
    fn a_script_sent_again_after_noscript_has_the_deadline_of_its_eval() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut s = connected("redis://127.0.0.1:1", t0);
        let tail = b"$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n";
        let call = |tag| ScriptCall {
            script: &scripts()[RELEASE_SCRIPT],
            tag,
            tail,
            argc: 3,
        };
        // Loaded by a first call; A goes by hash at t0.
        s.script(call(1), t0);
        take_output(&mut s);
        feed(&mut s, b":1\r\n", t0);
        s.script(call(2), t0);
        assert!(take_output(&mut s).contains("EVALSHA"));
        // B at t0 + 4 s; A's NOSCRIPT comes then, and its EVAL goes out behind B.
        let t4 = t0 + secs(4);
        s.request(Kind::Set, 3, b"*1\r\n$3\r\nSET\r\n", t4);
        take_output(&mut s);
        assert_eq!(
            feed(&mut s, b"-NOSCRIPT No matching script\r\n", t4),
            vec![]
        );
        assert!(take_output(&mut s).starts_with("*5\r\n$4\r\nEVAL\r\n"));
        let due = t4 + secs(5);
        assert_eq!(s.next_deadline(), Some(due));
        // B answered at t0 + 8 s: A's EVAL, 4 s old, is not timed out yet, and its deadline is
        // the one the session announces.
        let t8 = t0 + secs(8);
        assert_eq!(
            feed(&mut s, b"+OK\r\n", t8),
            vec![Got::Reply(3, "Simple(\"OK\")".into())]
        );
        let mut got = Vec::new();
        s.on_timer(t8, &mut |d| got.push((d.tag, d.reply.err().cloned())));
        assert!(got.is_empty() && !s.closing(), "{got:?}");
        assert_eq!(s.next_deadline(), Some(due));
        // At its deadline it fails: never left without one.
        s.on_timer(due, &mut |d| got.push((d.tag, d.reply.err().cloned())));
        assert_eq!(got, vec![(2, Some(NodeFault::Timeout))]);
        assert!(s.closing());
    }

    #[test]
    fn max_pending_refuses_requests_and_keeps_the_connection() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1", now);
        for tag in 1..=4 {
            assert!(s.admit(now, &mut |_| {}).is_ok());
            s.request(Kind::Set, tag, b"x", now);
        }
        let mut got = Vec::new();
        assert_eq!(
            s.admit(now, &mut |d| got.push(d.tag)),
            Err(NodeFault::Overloaded)
        );
        // Nothing outstanding failed, and the connection stays up.
        assert!(got.is_empty());
        assert!(!s.closing());
        assert_eq!(s.pending(), 4);
    }

    #[test]
    fn a_refused_info_fails_the_handshake_only_when_needed() {
        let now = Instant::now();
        let info = "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n";
        let set = "*1\r\n$3\r\nSET\r\n";
        let refused = b"-NOPERM no permissions to run 'info'\r\n";
        for need in [InfoNeed::Wanted, InfoNeed::Needed] {
            let config = ConnConfig {
                info: need,
                memory: false,
                ..config()
            };
            let mut s = Session::new(NodeAddr::parse("redis://127.0.0.1:1").unwrap(), config, now);
            assert_eq!(s.connect_due(now), Ok(true));
            s.connecting(now);
            s.connected();
            s.request(Kind::Set, 7, set.as_bytes(), now);
            match need {
                // Only wanted (the duplicate check): the request follows in the same write, and
                // a refusal leaves the node's run_id unknown.
                InfoNeed::Wanted => {
                    assert_eq!(take_output(&mut s), format!("{info}{set}"));
                    let mut answers = refused.to_vec();
                    answers.extend_from_slice(b"+OK\r\n");
                    let got = feed(&mut s, &answers, now);
                    assert_eq!(got, vec![Got::Reply(7, "Simple(\"OK\")".into())]);
                    assert!(s.is_ready() && s.info().is_none() && !s.closing());
                }
                // Needed (quarantine, fencing): the request waits for it, and never goes out
                // after a refusal.
                _ => {
                    assert_eq!(take_output(&mut s), info);
                    let got = feed(&mut s, refused, now);
                    assert!(
                        matches!(&got[..], [Got::Fault(7, why, false)] if why.contains("+info")),
                        "{got:?}"
                    );
                    assert!(s.closing() && s.output().is_empty());
                }
            }
        }
    }

    /// `INFO memory` follows `INFO server` in the handshake when evicting servers are refused:
    /// each reply carries what it said about the connection's node, from its first on; a
    /// refusal of it fails the handshake only when `INFO` is needed, and else leaves it unknown.
    #[test]
    fn the_handshake_reads_the_eviction_policy() {
        let now = Instant::now();
        let asked = "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n";
        let set = "*1\r\n$3\r\nSET\r\n";
        let server = format!("run_id:{}\r\nuptime_in_seconds:100\r\n", "r".repeat(40));
        let server = format!("${}\r\n{server}\r\n", server.len());
        let memory = "maxmemory:4194304\r\nmaxmemory_policy:allkeys-lru\r\n";
        let memory = format!("${}\r\n{memory}\r\n", memory.len());
        let refused = "-NOPERM no permissions to run 'info'\r\n";
        for need in [InfoNeed::Wanted, InfoNeed::Needed] {
            for memory_answer in [memory.as_str(), refused] {
                let config = ConnConfig {
                    info: need,
                    memory: true,
                    ..config()
                };
                let addr = NodeAddr::parse("redis://127.0.0.1:1").unwrap();
                let mut s = Session::new(addr, config, now);
                s.connecting(now);
                s.connected();
                s.request(Kind::Set, 7, set.as_bytes(), now);
                let wanted = need == InfoNeed::Wanted;
                let sent = take_output(&mut s);
                assert_eq!(
                    sent,
                    if wanted {
                        format!("{asked}{set}")
                    } else {
                        asked.into()
                    }
                );
                let mut got = Vec::new();
                let mut sink = |d: Delivery<'_>| got.push((d.tag, d.reply.is_ok(), d.eviction));
                s.read_begin();
                s.on_bytes(
                    format!("{server}{memory_answer}").as_bytes(),
                    now,
                    &mut sink,
                );
                if !wanted && memory_answer == refused {
                    // Needed, and refused: the request never goes out.
                    assert_eq!(got, vec![(7, false, Eviction::Unknown)]);
                    assert!(s.closing());
                    continue;
                }
                if !wanted {
                    assert_eq!(take_output(&mut s), set);
                }
                s.on_bytes(b"+OK\r\n", now, &mut sink);
                let eviction = match memory_answer == refused {
                    true => Eviction::Unknown,
                    false => Eviction::May(crate::EvictionPolicy::AllkeysLru),
                };
                assert_eq!(got, vec![(7, true, eviction)], "{need:?}");
            }
        }
    }

    #[test]
    fn a_hello_refused_by_an_old_server_is_no_credentials_refused() {
        let now = Instant::now();
        for refusal in [
            &b"-ERR unknown command 'HELLO', with args beginning with: '3' \r\n"[..],
            b"-NOPROTO unsupported protocol version\r\n",
        ] {
            let mut s = connected("redis://127.0.0.1:1?protocol=3", now);
            s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
            assert_eq!(take_output(&mut s), "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n");
            let mut faults = Vec::new();
            s.read_begin();
            s.on_bytes(refusal, now, &mut |d| faults.push(d.reply.err().cloned()));
            let [Some(fault)] = &faults[..] else {
                panic!("{faults:?}");
            };
            assert!(!matches!(fault, NodeFault::Auth(_)), "{fault:?}");
            assert!(fault.is_permanent(), "{fault:?}");
            let text = fault.to_string();
            assert!(text.contains("HELLO 3") && text.contains("RESP3"), "{text}");
            assert!(s.closing() && s.output().is_empty());
        }
        // Credentials refused in HELLO are still credentials refused.
        for refusal in [
            &b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"[..],
            b"-NOAUTH HELLO must be called with the client already authenticated\r\n",
        ] {
            let mut s = connected("redis://:secret@127.0.0.1:1?protocol=3", now);
            s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
            take_output(&mut s);
            let mut faults = Vec::new();
            s.read_begin();
            s.on_bytes(refusal, now, &mut |d| faults.push(d.reply.err().cloned()));
            assert!(
                matches!(&faults[..], [Some(NodeFault::Auth(_))]),
                "{faults:?}"
            );
        }
    }

    /// `HELLO 3` answered with a RESP2 array (a proxy that does not speak RESP3): the connection
    /// is not taken for a RESP3 one (the engine would subscribe on it); the handshake fails as
    /// for a refused `HELLO`. A map is the answer that passes.
    #[test]
    fn a_hello_3_answered_in_resp2_fails_the_handshake() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1?protocol=3", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut faults = Vec::new();
        s.read_begin();
        s.on_bytes(
            b"*4\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:2\r\n",
            now,
            &mut |d| faults.push(d.reply.err().cloned()),
        );
        let [Some(fault @ NodeFault::Unexpected(_))] = &faults[..] else {
            panic!("{faults:?}");
        };
        let text = fault.to_string();
        assert!(text.contains("HELLO 3") && text.contains("RESP3"), "{text}");
        assert!(!s.is_ready() && s.closing() && s.output().is_empty());

        let mut s = connected("redis://127.0.0.1:1?protocol=3", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        assert_eq!(feed(&mut s, b"%1\r\n$5\r\nproto\r\n:3\r\n", now), vec![]);
        assert!(s.is_ready());
        assert_eq!(take_output(&mut s), "*1\r\n$3\r\nSET\r\n");
    }

    /// A megabyte of RESP3 nulls nested in arrays (within `Limits::CLIENT`: 4096 arrays of 80)
    /// in answer to `AUTH`: the fault says what came in a line, from a bounded prefix of it.
    #[test]
    fn a_huge_unexpected_handshake_reply_is_described_in_a_line() {
        let now = Instant::now();
        let mut s = connected("redis://:secret@127.0.0.1:1", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut reply = b"*4096\r\n".to_vec();
        for _ in 0..4096 {
            reply.extend_from_slice(b"*80\r\n");
            reply.extend_from_slice(&b"_\r\n".repeat(80));
        }
        assert!(reply.len() <= resp::Limits::CLIENT.max_frame_len);
        let mut faults = Vec::new();
        s.read_begin();
        s.on_bytes(&reply, now, &mut |d| faults.push(d.reply.err().cloned()));
        let [Some(fault @ NodeFault::Unexpected(_))] = &faults[..] else {
            panic!("{faults:?}");
        };
        let text = fault.to_string();
        assert!(text.len() < 400, "{} bytes: {text}", text.len());
        assert!(
            text.starts_with("unexpected reply Aggregate(Array[Aggregate(Array[Null, Null")
                && text.ends_with("… (longer) in answer to AUTH"),
            "{text}"
        );
        assert!(s.closing());
    }

    #[test]
    fn a_refused_select_names_the_database() {
        let now = Instant::now();
        let mut s = connected("redis://127.0.0.1:1/99", now);
        s.request(Kind::Set, 7, b"*1\r\n$3\r\nSET\r\n", now);
        take_output(&mut s);
        let mut faults = Vec::new();
        s.read_begin();
        s.on_bytes(b"-ERR DB index is out of range\r\n", now, &mut |d| {
            faults.push(d.reply.err().cloned())
        });
        assert_eq!(
            faults,
            vec![Some(NodeFault::Database {
                db: 99,
                message: "ERR DB index is out of range".into()
            })]
        );
    }

    #[test]
    fn info_parsing() {
        let now = Instant::now();
        let text = b"# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789012345678901234567890123456789\r\nuptime_in_seconds:42\r\n";
        let info = parse_info(text, now).unwrap();
        assert_eq!(info.uptime, Some(Duration::from_secs(42)));
        assert_eq!(&info.run_id, b"0123456789012345678901234567890123456789");
        assert_eq!(parse_info(b"garbage", now), None);
    }

    /// A connect deadline passed while nothing polled (the turn's `poll` began after it) moves
    /// once per connection; one passed while a poll watched stands.
    #[test]
    fn a_connect_deadline_that_passed_unwatched_moves_once() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Session::new(NodeAddr::parse("redis://h:1").unwrap(), config(), now);
        s.connecting(now);
        let deadline = s.next_deadline().unwrap();
        assert_eq!(deadline, now + ms(1_000));
        // Watched at the deadline (the turn's poll began before it): no grace.
        assert!(!s.unwatched_grace(deadline + ms(1), deadline - ms(1)));
        // Unwatched (the poll began after it): the deadline moves, once.
        let late = deadline + ms(500);
        assert!(s.unwatched_grace(late, late));
        assert_eq!(s.next_deadline(), Some(late + ms(1_000)));
        let later = late + ms(2_000);
        assert!(!s.unwatched_grace(later, later));
        // A new connection may have its own.
        s.connecting(later);
        let deadline = s.next_deadline().unwrap();
        assert!(s.unwatched_grace(deadline + ms(1), deadline + ms(1)));
    }

    /// The `run_id` is read whatever the uptime says: Redis prints `uptime_in_seconds` as a
    /// signed `time_t`, negative once the server's clock stepped back; missing or not a number,
    /// the uptime is unknown (`None`: the restart tracking decides what it means). Before, any
    /// of these made the node unknown (found by review).
    #[test]
    fn a_bad_uptime_is_unknown_and_keeps_the_run_id() {
        let now = Instant::now();
        let run_id = b"0123456789012345678901234567890123456789";
        for uptime in ["uptime_in_seconds:-3\r\n", "uptime_in_seconds:soon\r\n", ""] {
            let text = format!(
                "# Server\r\nrun_id:{}\r\n{uptime}",
                std::str::from_utf8(run_id).unwrap()
            );
            let info = parse_info(text.as_bytes(), now).expect(uptime);
            assert_eq!(&info.run_id, run_id, "{uptime}");
            assert_eq!(info.uptime, None, "{uptime}");
        }
        // No run_id, whatever the uptime: unknown.
        assert_eq!(parse_info(b"uptime_in_seconds:42\r\n", now), None);
    }
}
