//! Every Lua script the client sends, beside the keys it touches (`model/keys.rs`): the release,
//! extend and acquire scripts of each kind of lock, the waiting marks, the fencing scripts, and
//! their table — each sent by hash (`EVALSHA`), its SHA-1 computed once per process, with what
//! it calls named for ACL refusals. No I/O.

use std::sync::OnceLock;

use sha1::{Digest, Sha1};

use crate::model::keys::readers_marker;

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
pub(crate) const EVALSHA_HEAD_LEN: usize = 18 + 40 + 2;

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

/// The Lua test that a lock key's value `$v` is ours: the token `ARGV[1]`, or the token then
/// [`OWNER_SEPARATOR`](crate::OWNER_SEPARATOR) and an owner ([`Config::owner`](crate::Config::owner)).
/// No token this crate makes holds the separator, so the test never matches another
/// acquisition's value. The plain comparison comes first: a lock without an owner costs the
/// script what it cost before.
macro_rules! holds_token {
    ($v:literal) => {
        concat!(
            "(",
            $v,
            " == ARGV[1] or (type(",
            $v,
            ") == \"string\" and string.sub(",
            $v,
            ", 1, #ARGV[1] + 1) == ARGV[1] .. \" \"))"
        )
    };
}

/// Compare-and-delete: release the lock only if it still holds our token; then, if the
/// resource's waiting key ([`WAITING_KEY_PREFIX`](crate::model::keys::WAITING_KEY_PREFIX)) holds a mark
/// ([`MARK_VALUE`](crate::keys::MARK_VALUE)(crate::model::keys::MARK_VALUE)), delete the mark and publish a notice on
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
pub(crate) const RELEASE_BODY: &str = concat!(
    "local v = redis.pcall(\"get\", KEYS[1]) if ",
    holds_token!("v"),
    " then redis.call(\"del\", KEYS[1]) local w = \"redlock:waiting:\" .. KEYS[1] local m = redis.pcall(\"get\", w) if m == \"redlock-mux waiting mark\" or m == \"redlock-mux reader waiting\" then redis.pcall(\"del\", w) elseif m ~= \"redlock-mux set waiting\" and type(m) ~= \"table\" then return 1 end local ch = \"redlock:released:\" .. KEYS[1] local s = redis.pcall(\"pubsub\", \"numsub\", ch) local c = (type(s) == \"table\" and s[2] or 0) - (ARGV[2] == \"1\" and 1 or 0) local ok, n = pcall(redis.call, \"publish\", ch, tostring(c < 0 and 0 or c)) if ok and type(n) == \"number\" then return 1 + 2 * n end return 1 elseif type(v) == \"table\" and not string.find(v.err, \"WRONGTYPE\", 1, true) then return v else return 0 end"
);
/// Compare-and-delete without the notice ([`Config::release_notices`](crate::Config::release_notices)
/// off): answers 0 (not ours) or 1; a refusal other than `WRONGTYPE` is the answer, as in
/// [`RELEASE_BODY`].
pub(crate) const QUIET_RELEASE_BODY: &str = concat!(
    "local v = redis.pcall(\"get\", KEYS[1]) if ",
    holds_token!("v"),
    " then redis.call(\"del\", KEYS[1]) return 1 elseif type(v) == \"table\" and not string.find(v.err, \"WRONGTYPE\", 1, true) then return v else return 0 end"
);
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
pub(crate) const EXTEND_BODY: &str = concat!(
    "local v = redis.pcall(\"get\", KEYS[1]) if ",
    holds_token!("v"),
    " then if not pcall(redis.call, \"pexpire\", KEYS[1], ARGV[2], \"GT\") then local t = redis.pcall(\"pttl\", KEYS[1]) if type(t) ~= \"number\" or t < tonumber(ARGV[2]) then redis.call(\"pexpire\", KEYS[1], ARGV[2]) end end return 1 elseif type(v) == \"table\" and not string.find(v.err, \"WRONGTYPE\", 1, true) then return v else return 0 end"
);

/// The test of [`SET_STEP_BODY`]: each of the first `n` keys is absent (`own[i] = 0`), ours
/// (`1`: its value starts with the first `ARGV[3]` bytes of `ARGV[1]`) or another's (`2`: a
/// value of another acquisition, a key of another type, a read refused); `free` if none is
/// another's.
///
/// A key of ours set by a *later* attempt of the wait counts as another's: its variant
/// (`Token::variant`, the number `ARGV[4]` for this attempt's token, read back from the last
/// four bytes: each is the base token's shifted by a base-64 digit of the number) is higher.
/// So an attempt that runs late (sent on a connection the client gave up, delivered after the
/// next connection's requests) never rewrites the keys of the step after it, and the cleanup
/// of its own key, which deletes exactly its token, can never delete a key a later step counts
/// on.
macro_rules! set_step {
    () => {
        "local f = tonumber(ARGV[3]) local fam = string.sub(ARGV[1], 1, f) local cur = tonumber(ARGV[4]) local A = \"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_\" local function later(v) local n = 0 for k = 0, 3 do local a = string.find(A, string.sub(v, f + 4 - k, f + 4 - k), 1, true) local c = string.find(A, string.sub(ARGV[1], f + 4 - k, f + 4 - k), 1, true) if not a or not c then return true end n = n + ((math.floor(cur / 64 ^ k) % 64 + a - c) % 64) * 64 ^ k end return n > cur end local own = {} local free = true for i = 1, n do local v = redis.pcall(\"get\", KEYS[i]) if v == false then own[i] = 0 elseif type(v) == \"string\" and string.sub(v, 1, f) == fam and not later(v) then own[i] = 1 else own[i] = 2 free = false end end "
    };
}
/// What [`SET_STEP_BODY`] does when it takes its last key: a set's mark on it
/// ([`SET_MARK_VALUE`](crate::model::keys::SET_MARK_VALUE)) goes — the member is held now, and
/// left there it would keep waiters out after the set's release.
macro_rules! set_step_unmark {
    () => {
        "local w = \"redlock:waiting:\" .. KEYS[n] if redis.pcall(\"get\", w) == \"redlock-mux set waiting\" then redis.pcall(\"del\", w) end "
    };
}
/// What [`SET_STEP_BODY`] does when it refuses: the held members that are ours (all keys but
/// the last of the `n`) live at least `ARGV[2]` ms more, never shortened.
macro_rules! set_step_keep {
    () => {
        "for i = 1, n - 1 do if own[i] == 1 and not pcall(redis.call, \"pexpire\", KEYS[i], ARGV[2], \"GT\") then local t = redis.pcall(\"pttl\", KEYS[i]) if type(t) ~= \"number\" or t < tonumber(ARGV[2]) then redis.call(\"pexpire\", KEYS[i], ARGV[2]) end end end "
    };
}

/// An all-or-none lock of a set of resources (`model/keys.rs`, [`SET_PREFIX`](crate::model::keys::SET_PREFIX)):
/// every key `KEYS[i]` is set to the token `ARGV[1]` with a TTL of `ARGV[2]` ms if none of them
/// exists, else none is. Answers 1 (all set) or 0. Each member is a plain string lock, so a
/// `SET NX` of any member by any client fails while the set is held, and the set is refused
/// while any member is held (by a plain lock, a reader, another set).
pub(crate) const SET_ACQUIRE_BODY: &str = "if redis.call(\"exists\", unpack(KEYS)) > 0 then return 0 end for i = 1, #KEYS do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end return 1";
/// [`SET_ACQUIRE_BODY`] with the fence counter's read, as the fenced acquire of one resource
/// (`fencing.rs`): the last key is the counter, read first (a foreign hash there: an error,
/// nothing set). Answers `{1 or 0, run, n}`.
pub(crate) const SET_FENCED_ACQUIRE_BODY: &str = concat!(
    "local h = redis.call(\"hmget\", KEYS[#KEYS], \"run\", \"n\") ",
    crate::proto::scripts::foreign_fence!("KEYS[#KEYS]"),
    "local n = #KEYS - 1 local ok = 1 if redis.call(\"exists\", unpack(KEYS, 1, n)) > 0 then ok = 0 else for i = 1, n do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end end return {ok, h[1] or \"\", h[2] or \"\"}"
);
/// [`RELEASE_BODY`] over every key of a set: each member that holds the token `ARGV[1]` is
/// deleted — and where `ARGV[1]` is a set token's family (its first 23 bytes,
/// `Token::family`), each member whose value starts with it: every key of the acquisition,
/// whichever attempt of its wait set it ([`SET_STEP_BODY`]; sent for the release of a lock,
/// never for the cleanup of a lost attempt, which must not delete a later attempt's keys) — and with `ARGV[2]` = `1` (or `2`: the releaser is subscribed too, and not
/// counted) its waiters are told as a single lock's are. Answers 0 (no member was ours) or
/// 1 + 2 × the clients the notices reached. One `MGET` of the members
/// and one of their waiting keys rather than a `GET` each: a set of 8 is one call per
/// purpose, not 8 (the servers share the CPU with the client on a small machine, and
/// their time is the cycle's). A member of another type reads as not ours (`MGET` answers
/// nil for it); an ACL that refuses the waiting keys gets the notices every time, as
/// [`RELEASE_BODY`]'s users do.
pub(crate) const SET_RELEASE_BODY: &str = concat!(
    "local v = redis.call(\"mget\", unpack(KEYS)) local ours = {} for i = 1, #KEYS do if ",
    holds_token!("v[i]"),
    " or (#ARGV[1] == 23 and type(v[i]) == \"string\" and string.sub(v[i], 1, 23) == ARGV[1]) then ours[#ours + 1] = KEYS[i] end end if #ours == 0 then return 0 end redis.call(\"del\", unpack(ours)) local n = 0 if ARGV[2] == \"1\" or ARGV[2] == \"2\" then local w = {} for i = 1, #ours do w[i] = \"redlock:waiting:\" .. ours[i] end local m = redis.pcall(\"mget\", unpack(w)) local denied = m.err ~= nil for i = 1, #ours do local tell = denied if not denied and (m[i] == \"redlock-mux waiting mark\" or m[i] == \"redlock-mux reader waiting\") then redis.pcall(\"del\", w[i]) tell = true elseif m[i] == \"redlock-mux set waiting\" then tell = true end if tell then local ch = \"redlock:released:\" .. ours[i] local s = redis.pcall(\"pubsub\", \"numsub\", ch) local k = (type(s) == \"table\" and s[2] or 0) - (ARGV[2] == \"2\" and 1 or 0) local ok, c = pcall(redis.call, \"publish\", ch, tostring(k < 0 and 0 or k)) if ok and type(c) == \"number\" then n = n + c end end end end return 1 + 2 * n"
);
/// [`EXTEND_BODY`] over every key of a set: only if every member still holds the token
/// `ARGV[1]`, each member's TTL becomes `max(its TTL left, ARGV[2])`. Answers 1 or 0.
pub(crate) const SET_EXTEND_BODY: &str = concat!(
    "local v = redis.call(\"mget\", unpack(KEYS)) for i = 1, #KEYS do if not ",
    holds_token!("v[i]"),
    " then return 0 end end for i = 1, #KEYS do if not pcall(redis.call, \"pexpire\", KEYS[i], ARGV[2], \"GT\") then local t = redis.pcall(\"pttl\", KEYS[i]) if type(t) ~= \"number\" or t < tonumber(ARGV[2]) then redis.call(\"pexpire\", KEYS[i], ARGV[2]) end end end return 1"
);

/// One step of a set's ordered acquisition (`engine/wait.rs`): a set that waits takes its
/// members one at a time, in their order, and keeps those it has while it waits for the next
/// (so callers of one member cannot starve it, and two sets cannot wait for each other: each
/// waits only for a member after every one it holds). `KEYS` are the members held so far and
/// the next one; a key is *ours* if its value starts with the first `ARGV[3]` bytes of the
/// value `ARGV[1]` — the same acquisition, set by an earlier attempt of its wait (each attempt
/// carries a token of its own: `Token::variant`). If every key is absent or ours, every key is
/// set to `ARGV[1]` with a TTL of `ARGV[2]` ms — rewritten, so that the cleanup of an earlier
/// attempt, which deletes only its own exact token, can never delete a key this attempt now
/// counts on — and the answer is 1. Otherwise nothing is set, the held members that are ours
/// live at least `ARGV[2]` ms more (never shortened, as [`EXTEND_BODY`] does it: a set that
/// waits longer than its TTL keeps what it holds), and the answer is 0. A key of another type
/// or another client's value refuses it, untouched.
pub(crate) const SET_STEP_BODY: &str = concat!(
    "local n = #KEYS ",
    set_step!(),
    "if free then for i = 1, n do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end ",
    set_step_unmark!(),
    "return 1 end ",
    set_step_keep!(),
    "return 0"
);
/// [`SET_STEP_BODY`] with the fence counter's read, as [`SET_FENCED_ACQUIRE_BODY`]: the last
/// key is the counter, read first. Sent for the step that takes the last member. Answers
/// `{1 or 0, run, n}`.
pub(crate) const SET_STEP_FENCED_BODY: &str = concat!(
    "local h = redis.call(\"hmget\", KEYS[#KEYS], \"run\", \"n\") ",
    crate::proto::scripts::foreign_fence!("KEYS[#KEYS]"),
    "local n = #KEYS - 1 ",
    set_step!(),
    "if free then for i = 1, n do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end ",
    set_step_unmark!(),
    "return {1, h[1] or \"\", h[2] or \"\"} end ",
    set_step_keep!(),
    "return {0, h[1] or \"\", h[2] or \"\"}"
);

/// A shared (read) lock's acquire (`model/keys.rs`, [`SHARED_PREFIX`](crate::model::keys::SHARED_PREFIX)):
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
/// (the waiting mark holds [`MARK_VALUE`](crate::keys::MARK_VALUE)(crate::model::keys::MARK_VALUE): so that readers that keep
/// coming do not starve it). A refusal of the `ZSCORE` other than `WRONGTYPE` (`NOPERM`) is the
/// answer, so that the caller reads which command was refused. The key lives at least `ARGV[2]`
/// ms more, set from the argument's text: Redis 7.2.0–7.2.4 turn a Lua number such as 100000000
/// into `1e+08`, which `PEXPIRE` refuses (after the `ZADD`: a reader left without a TTL).
/// Answers 1 or 0. Five calls for the first reader (`GET` of the mark, `PTTL`, `TIME`, `ZADD`,
/// `PEXPIRE`), six for one that joins (the marker's `ZSCORE`): expired readers are dropped by
/// releases, not here, since the servers' time is the cycle's on a small machine.
pub(crate) const SHARED_ACQUIRE_BODY: &str = shared_acquire!(
    "if m == \"redlock-mux waiting mark\" or m == \"redlock-mux set waiting\" then return 0 end ",
    ""
);
/// [`SHARED_ACQUIRE_BODY`] for a reader that has waited past
/// [`Config::set_precedence`](crate::Config::set_precedence) (`engine/wait.rs`): where a set waits for the resource it may start a read lock of a free
/// key (as a writer's `SET NX` may take it), but not join readers who hold it — joining, a
/// stream of readers past their precedence would overlap for ever and keep out the set and
/// the writers (a set's mark takes a waiting writer's place: one mark a key). A writer's
/// mark refuses it as before.
pub(crate) const SHARED_ACQUIRE_PAST_SETS_BODY: &str = shared_acquire!(
    "if m == \"redlock-mux waiting mark\" then return 0 end ",
    "if p ~= -2 and m == \"redlock-mux set waiting\" then return 0 end "
);

/// A reader's acquire ([`SHARED_ACQUIRE_BODY`]): `$marks` tests the waiting key's mark `m`
/// before anything else, `$held` after the key's `PTTL` `p` is read (-2: no key).
macro_rules! shared_acquire {
    ($marks:literal, $held:literal) => { concat!(
    "local m = redis.pcall(\"get\", \"redlock:waiting:\" .. KEYS[1]) ",
    $marks,
    "local p = redis.call(\"pttl\", KEYS[1]) if p == -1 then return 0 end ",
    $held,
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
    ) };
}
use shared_acquire;
/// A reader's release: its token leaves the set. Then, on our read lock only (the marker is
/// there; see [`SHARED_ACQUIRE_BODY`]): if other readers remain, the expired ones among them
/// (crashed readers) go too — only members shaped as this crate's tokens (27 characters of
/// base64url), at most 1,000 a release, so that nothing another client put into the key is
/// removed; if no reader is left, the key is deleted and, with `ARGV[2]` = `1` (or `2`, the
/// releaser not counted), the waiters are told as [`RELEASE_BODY`] tells them — but a waiting
/// writer's mark is left in place (a reader's mark goes): the writer's own release deletes it.
/// Deleted here, it let the readers queued behind it in while the woken writer's attempt was on
/// its way, and a writer could wait for ever behind readers that kept coming.
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
    "elseif m ~= \"redlock-mux waiting mark\" and m ~= \"redlock-mux set waiting\" and type(m) ~= \"table\" then return 1 end ",
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

/// Mark: set `KEYS[1]` (a waiting key) to [`MARK_VALUE`](crate::keys::MARK_VALUE) with a TTL of `ARGV[1]` ms, but only
/// where no key exists or the key already is a mark of ours ([`MARK_VALUE`](crate::keys::MARK_VALUE) or
/// [`READER_MARK_VALUE`](crate::keys::READER_MARK_VALUE)). Answers 1 if marked, 0 if the key is someone else's (or not
/// readable: an ACL without `redlock:*`, another type).
pub(crate) const MARK_BODY: &str = "local v = redis.pcall(\"get\", KEYS[1]) if v == false or v == \"redlock-mux waiting mark\" or v == \"redlock-mux reader waiting\" then redis.call(\"set\", KEYS[1], \"redlock-mux waiting mark\", \"PX\", ARGV[1]) return 1 end if v == \"redlock-mux set waiting\" then return 1 end return 0";

/// A reader's mark (`READER_MARK_BODY`): like [`MARK_BODY`], with [`READER_MARK_VALUE`](crate::keys::READER_MARK_VALUE) where
/// no key or a reader's mark is; a writer's mark is left as it is (it keeps new readers out,
/// and it makes the release publish all the same). Answers 1, or 0 where the key is someone
/// else's.
pub(crate) const READER_MARK_BODY: &str = "local v = redis.pcall(\"get\", KEYS[1]) if v == false or v == \"redlock-mux reader waiting\" then redis.call(\"set\", KEYS[1], \"redlock-mux reader waiting\", \"PX\", ARGV[1]) return 1 end if v == \"redlock-mux waiting mark\" or v == \"redlock-mux set waiting\" then return 1 end return 0";

/// A set's mark on the member it waits for (`engine/wait.rs`): `KEYS[1]` (the member's waiting
/// key) set to [`SET_MARK_VALUE`](crate::model::keys::SET_MARK_VALUE) for `ARGV[1]` ms where no
/// key or a mark of ours is (it takes a writer's or reader's place: it makes the release publish
/// as they do). Answers 1, or 0 where the key is someone else's. While it is there, this crate's
/// waiting writers ([`WAITING_ACQUIRE_BODY`]) and readers step back from the member during the
/// first [`Config::set_precedence`](crate::Config::set_precedence) of their wait (then a reader
/// still does not join readers who hold it: [`SHARED_ACQUIRE_PAST_SETS_BODY`]); releases
/// publish and leave it; the set's step that takes the member deletes it.
pub(crate) const SET_MARK_BODY: &str = "local v = redis.pcall(\"get\", KEYS[1]) if v == false or v == \"redlock-mux waiting mark\" or v == \"redlock-mux reader waiting\" or v == \"redlock-mux set waiting\" then redis.call(\"set\", KEYS[1], \"redlock-mux set waiting\", \"PX\", ARGV[1]) return 1 end return 0";

/// The attempt of a plain lock's wait after its first (`engine/wait.rs`): `SET KEYS[1] ARGV[1]
/// NX PX ARGV[2]`, unless a set waits for the resource (its waiting key holds
/// [`SET_MARK_VALUE`](crate::model::keys::SET_MARK_VALUE)): then it steps back, as a reader
/// steps back for a waiting writer, so that callers of one member do not starve a set. Answers
/// 1 or 0. A first attempt (and `try_lock`) is the plain `SET NX`, as any client's: it does not
/// look; nor does an attempt past the wait's
/// [`Config::set_precedence`](crate::Config::set_precedence), so that a stream of sets does
/// not starve the writer.
pub(crate) const WAITING_ACQUIRE_BODY: &str = "if redis.pcall(\"get\", \"redlock:waiting:\" .. KEYS[1]) == \"redlock-mux set waiting\" then return 0 end if redis.call(\"set\", KEYS[1], ARGV[1], \"NX\", \"PX\", ARGV[2]) then return 1 end return 0";

/// [`WAITING_ACQUIRE_BODY`] with fencing, as [`ACQUIRE_BODY`]: the counter `KEYS[2]` read
/// first. Answers `{1 or 0, run, n}`.
pub(crate) const WAITING_FENCED_ACQUIRE_BODY: &str = concat!(
    "local h = redis.call(\"hmget\", KEYS[2], \"run\", \"n\") ",
    foreign_fence!("KEYS[2]"),
    "local ok = false if redis.pcall(\"get\", \"redlock:waiting:\" .. KEYS[1]) ~= \"redlock-mux set waiting\" then ok = redis.call(\"set\", KEYS[1], ARGV[1], \"NX\", \"PX\", ARGV[2]) end ",
    "return {ok and 1 or 0, h[1] or \"\", h[2] or \"\"}"
);

/// The error a fencing script answers where `redlock:fence` is a hash with fields other than
/// `run` and `n`: another application's, never written here. Checked before anything is
/// written (the acquire's `SET NX` included), so that node takes no part in the fenced lock.
macro_rules! foreign_fence {
    ($key:literal) => {
        concat!(
            "if redis.call(\"hlen\", ",
            $key,
            ") > (h[1] and 1 or 0) + (h[2] and 1 or 0) then return redis.error_reply(\"ERR ",
            "redlock:fence holds fields other than run and n: another application's hash, ",
            "left as it is; fencing cannot use this node\") end "
        )
    };
}
pub(crate) use foreign_fence;

/// Acquire and read: the counter `KEYS[2]`'s `run` and `n` (a foreign hash there: an error,
/// see [`foreign_fence`]), then `SET KEYS[1] ARGV[1] NX PX ARGV[2]`. Answers `{1 or 0, run,
/// n}` (empty strings for missing fields).
pub(crate) const ACQUIRE_BODY: &str = concat!(
    "local h = redis.call(\"hmget\", KEYS[2], \"run\", \"n\") ",
    foreign_fence!("KEYS[2]"),
    "local ok = redis.call(\"set\", KEYS[1], ARGV[1], \"NX\", \"PX\", ARGV[2]) ",
    "return {ok and 1 or 0, h[1] or \"\", h[2] or \"\"}"
);

/// Write back: raise the counter `KEYS[2]` to the fence `ARGV[2]` if it is seeded for this
/// process (`run` = `ARGV[3]`) and the lock `KEYS[1]` still holds our token `ARGV[1]`; seed it
/// (set `run`, and `n` to at least the fence) if it is blank and `ARGV[4]` is `1`. Answers 1
/// when the node is seeded, holds at least the fence, and still holds our key; else 0. Numbers
/// compare as canonical decimal strings: exact over all of `u64` (Lua's numbers are doubles).
/// A foreign hash there: an error, see [`foreign_fence`].
pub(crate) const WRITE_BODY: &str = concat!(
    "local function less(a, b) return #a < #b or (#a == #b and a < b) end local h = redis.call(\"hmget\", KEYS[2], \"run\", \"n\") ",
    foreign_fence!("KEYS[2]"),
    "local n = h[2] or \"0\" if not string.match(n, \"^%d+$\") then n = \"0\" end local g = redis.pcall(\"get\", KEYS[1]) local ours = ",
    holds_token!("g"),
    " if h[1] ~= ARGV[3] then if ARGV[4] ~= \"1\" then return 0 end if less(n, ARGV[2]) then n = ARGV[2] end redis.call(\"hset\", KEYS[2], \"run\", ARGV[3], \"n\", n) elseif less(n, ARGV[2]) then if not ours then return 0 end redis.call(\"hset\", KEYS[2], \"n\", ARGV[2]) end if ours then return 1 end return 0"
);

/// Repair (`engine/repair.rs`, docs/fencing.md "Repair"): raise the counter `KEYS[1]` to at least
/// `ARGV[1]` and mark it complete for the process whose `run_id` is `ARGV[2]` — the process
/// answering on the connection it is sent on (the client learnt it from `INFO server` there).
/// Answers the counter after the repair. Only ever raises `n`: a counter above `ARGV[1]`
/// keeps its value. Numbers compare as canonical decimal strings, as in [`WRITE_BODY`]. Needs
/// no ACL permission beyond the other fencing scripts' (`+hmget +hset +hlen`). A foreign hash
/// there: an error, see [`foreign_fence`].
pub(crate) const REPAIR_BODY: &str = concat!(
    "local function less(a, b) return #a < #b or (#a == #b and a < b) end local h = redis.call(\"hmget\", KEYS[1], \"run\", \"n\") ",
    foreign_fence!("KEYS[1]"),
    "local n = h[2] or \"0\" if not string.match(n, \"^%d+$\") then n = \"0\" end if less(n, ARGV[1]) then n = ARGV[1] end redis.call(\"hset\", KEYS[1], \"run\", ARGV[2], \"n\", n) return n"
);

/// A *wrong* construction, kept for the simulator to catch (its checks must tell it from the right one): every
/// node increments its own counter when its `SET NX` succeeds, the fence is the largest of the
/// winners' counters, nothing is written back. Counters drift apart, and a later quorum that
/// misses the node with the highest one hands out a smaller fence. Never sent unless the
/// simulator asks for [`Mutation::FenceNoWriteBack`](crate::model::mutation::Mutation::FenceNoWriteBack).
#[cfg(any(test, feature = "sim"))]
pub(crate) const INCR_BODY: &str = "local ok = redis.call(\"set\", KEYS[1], ARGV[1], \"NX\", \"PX\", ARGV[2]) if not ok then return {0, \"\", \"\"} end return {1, \"\", tostring(redis.call(\"hincrby\", KEYS[2], \"n\", 1))}";
/// In the default build the wrong construction is not carried: its slot in the scripts' table
/// holds this, which is never sent.
#[cfg(not(any(test, feature = "sim")))]
pub(crate) const INCR_BODY: &str = "return 0";

/// The error a fair lock's scripts answer where `redlock:queue:<resource>` is a key that is
/// not this crate's queue (another type, or a sorted set without the queue's marker): left as
/// it is, and that node takes no part in the fair lock of `<resource>`.
macro_rules! foreign_queue {
    () => {
        "return redis.error_reply(\"ERR \" .. q .. \" is not a redlock-mux queue: another application's key, left as it is; the fair lock cannot use this node\") "
    };
}

/// The start of a fair acquire of one resource: the queue `q` of `KEYS[1]` and its marker's
/// score `m` (`false`: no marker — no queue, or one that is not ours), the refusal of a key of
/// another type there ([`foreign_queue`]) and of the `ZSCORE` (`NOPERM`) answered.
macro_rules! queue_marker_read {
    () => {
        concat!(
            "local q = \"redlock:queue:\" .. KEYS[1] local m = redis.pcall(\"zscore\", q, \"",
            crate::model::keys::queue_marker!(),
            "\") if type(m) == \"table\" then if string.find(m.err, \"WRONGTYPE\", 1, true) then ",
            foreign_queue!(),
            "end return m end "
        )
    };
}

/// The order of a fair queue's entries, `less(a, b)`: byte by byte (Lua's `<` on strings
/// follows the server's locale), the same in every fair script, so that every queue on every
/// node puts the same waiter first.
macro_rules! entry_order {
    () => {
        "local function less(a, b) for i = 1, math.min(#a, #b) do local x, y = string.byte(a, i), string.byte(b, i) if x ~= y then return x < y end end return #a < #b end "
    };
}

/// A fair lock's acquire ([`Config::fair`](crate::Config::fair), `engine/acquire.rs`):
/// `KEYS[1]` the resource, `ARGV[1]` the value, `ARGV[2]` the TTL (ms), `ARGV[3]` the waiter's
/// entry in the queue `redlock:queue:<resource>` (its wait's start in ms on its client's
/// clock, 15 digits, a space, its token's family; empty for `try_lock` and a wait's first
/// attempt, which join nothing),
/// `ARGV[4]` how long an entry lives after the attempt that wrote it (ms). Answers 1 or 0.
///
/// With no queue (nobody waits), the plain `SET NX`; refused, a waiter with an entry joins.
/// With a queue, the expired entries are swept, the waiter's own entry written (or refreshed)
/// with its expiry on the node's clock, and the lock taken only if the waiter's entry is the
/// first of the live ones — or no entry lives and it has none — and the key is free; won, its
/// entry leaves (the queue with it, once only the marker is left). Entries compare byte by
/// byte (`less`: Lua's `<` follows the server's locale), so every node orders the same waiters
/// the same way, and the oldest waiter is first wherever its entry is: no two waiters can each
/// be first on half the nodes.
///
/// A key under the queue's name that is not ours ([`QUEUE_MARKER`](crate::model::keys::QUEUE_MARKER)
/// missing, or another type): an error on that node, nothing written ([`foreign_queue`]).
pub(crate) const FAIR_ACQUIRE_BODY: &str = concat!(
    queue_marker_read!(),
    "if m == false then if redis.call(\"exists\", q) == 1 then ",
    foreign_queue!(),
    "end if redis.call(\"set\", KEYS[1], ARGV[1], \"NX\", \"PX\", ARGV[2]) then return 1 end if ARGV[3] == \"\" then return 0 end local t = redis.call(\"time\") redis.call(\"zadd\", q, \"+inf\", \"",
    crate::model::keys::queue_marker!(),
    "\", t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[4]), ARGV[3]) redis.call(\"pexpire\", q, ARGV[4]) return 0 end ",
    entry_order!(),
    "local t = redis.call(\"time\") local now = t[1] * 1000 + math.floor(t[2] / 1000) redis.call(\"zremrangebyscore\", q, \"-inf\", now) ",
    "if ARGV[3] ~= \"\" then redis.call(\"zadd\", q, now + tonumber(ARGV[4]), ARGV[3]) if redis.call(\"pttl\", q) < tonumber(ARGV[4]) then redis.call(\"pexpire\", q, ARGV[4]) end end ",
    "local head = false for _, e in ipairs(redis.call(\"zrangebyscore\", q, \"(\" .. now, \"(+inf\")) do if head == false or less(e, head) then head = e end end ",
    "if head ~= false and head ~= ARGV[3] then return 0 end if not redis.call(\"set\", KEYS[1], ARGV[1], \"NX\", \"PX\", ARGV[2]) then return 0 end ",
    "if head ~= false then redis.call(\"zrem\", q, head) end if redis.call(\"zcard\", q) == 1 then redis.call(\"del\", q) end return 1"
);

/// The notice of a fair waiter's leave, on the resource `$key` (a Lua expression), after
/// `if`/`elseif`: with `ARGV[2]` not `0`, where no writer holds the resource — free, or our read
/// lock (the readers queued behind the leaver may join) — the release notice as a release's,
/// its count the channel's subscribers less the leaver when `ARGV[2]` is `1`. One text for
/// [`FAIR_LEAVE_BODY`] and [`FAIR_SET_LEAVE_BODY`] (each member), so that they tell alike.
macro_rules! leave_notice {
    ($key:literal) => {
        concat!(
            "ARGV[2] ~= \"0\" and (redis.call(\"exists\", ", $key, ") == 0 or type(redis.pcall(\"zscore\", ", $key, ", \"",
            readers_marker!(),
            "\")) == \"string\") then local ch = \"redlock:released:\" .. ", $key, " local s = redis.pcall(\"pubsub\", \"numsub\", ch) local c = (type(s) == \"table\" and s[2] or 0) - (ARGV[2] == \"1\" and 1 or 0) pcall(redis.call, \"publish\", ch, tostring(c < 0 and 0 or c)) end "
        )
    };
}

/// A fair lock's waiter leaves its queue (its wait, having joined, ended: won — the nodes that
/// refused it still hold its entry — or not):
/// `KEYS[1]` the resource, `ARGV[1]` the entry, `ARGV[2]` the notice: `0` none (a waiter that
/// won), else — if waiters remain and the resource is free or read-locked (our read lock: the
/// readers behind the leaver may join them) — a release notice as a release's, so that the
/// next in line attempts now and not at its next poll, its count the channel's
/// subscribers less the leaver when `ARGV[2]` is `1` (it listens there itself). Only in a queue
/// of ours (the marker there: anything else is left alone); the queue goes once only the
/// marker is left. Answers 1 (nobody reads it: a 0 would count as a refusal in the node's
/// statistics).
pub(crate) const FAIR_LEAVE_BODY: &str = concat!(
    "local q = \"redlock:queue:\" .. KEYS[1] if type(redis.pcall(\"zscore\", q, \"",
    crate::model::keys::queue_marker!(),
    "\")) ~= \"string\" then return 1 end redis.call(\"zrem\", q, ARGV[1]) if redis.call(\"zcard\", q) == 1 then redis.call(\"del\", q) return 1 end ",
    "if ",
    leave_notice!("KEYS[1]"),
    "return 1"
);

/// A fair set's acquire ([`Config::fair`](crate::Config::fair)): [`FAIR_ACQUIRE_BODY`] over
/// every member at once, all or none. `KEYS` the members, `ARGV` as there. Every member's queue
/// is checked first (one that is not ours: an error, nothing written); then on each, the
/// expired entries swept and, with an entry, the waiter's written or refreshed (the queue made
/// where none was: a member the set waits for keeps its younger fair waiters out while the set
/// waits for another — the reservation that gives a set its members); the set is taken only if
/// its entry is the first live one of every member's queue that has any (or, without an entry,
/// no entry lives in any) and no member exists ([`SET_ACQUIRE_BODY`]); won, its entry leaves
/// every queue, and a queue left with only its marker goes. Entries are ordered as in
/// [`FAIR_ACQUIRE_BODY`], the same text on every queue and node: the oldest waiter is first in
/// every queue it is in, so no two waiters — sets or plain locks — can each hold the other's
/// member back. Answers 1 or 0.
pub(crate) const FAIR_SET_ACQUIRE_BODY: &str = concat!(
    "local qs = {} for i = 1, #KEYS do local q = \"redlock:queue:\" .. KEYS[i] local m = redis.pcall(\"zscore\", q, \"",
    crate::model::keys::queue_marker!(),
    "\") if type(m) == \"table\" then if string.find(m.err, \"WRONGTYPE\", 1, true) then ",
    foreign_queue!(),
    "end return m end if m == false and redis.call(\"exists\", q) == 1 then ",
    foreign_queue!(),
    "end qs[i] = m ~= false end ",
    entry_order!(),
    "local t = redis.call(\"time\") local now = t[1] * 1000 + math.floor(t[2] / 1000) local life = tonumber(ARGV[4]) local first = true ",
    "for i = 1, #KEYS do local q = \"redlock:queue:\" .. KEYS[i] ",
    "if qs[i] then redis.call(\"zremrangebyscore\", q, \"-inf\", now) end ",
    "if ARGV[3] ~= \"\" then if qs[i] then redis.call(\"zadd\", q, now + life, ARGV[3]) else redis.call(\"zadd\", q, \"+inf\", \"",
    crate::model::keys::queue_marker!(),
    "\", now + life, ARGV[3]) qs[i] = true end if redis.call(\"pttl\", q) < life then redis.call(\"pexpire\", q, ARGV[4]) end end ",
    "if qs[i] then local head = false for _, e in ipairs(redis.call(\"zrangebyscore\", q, \"(\" .. now, \"(+inf\")) do if head == false or less(e, head) then head = e end end ",
    "if head ~= false and head ~= ARGV[3] then first = false end end end ",
    "if not first or redis.call(\"exists\", unpack(KEYS)) > 0 then return 0 end ",
    "for i = 1, #KEYS do redis.call(\"set\", KEYS[i], ARGV[1], \"PX\", ARGV[2]) end ",
    "for i = 1, #KEYS do if qs[i] then local q = \"redlock:queue:\" .. KEYS[i] if ARGV[3] ~= \"\" then redis.call(\"zrem\", q, ARGV[3]) end if redis.call(\"zcard\", q) == 1 then redis.call(\"del\", q) end end end return 1"
);

/// A fair set's waiter leaves the queues of its members: [`FAIR_LEAVE_BODY`] on each member
/// (`KEYS`), the notice (if any) on that member's channel where waiters remain and the member
/// is free or read-locked. Answers 1.
pub(crate) const FAIR_SET_LEAVE_BODY: &str = concat!(
    "for i = 1, #KEYS do local q = \"redlock:queue:\" .. KEYS[i] if type(redis.pcall(\"zscore\", q, \"",
    crate::model::keys::queue_marker!(),
    "\")) == \"string\" then redis.call(\"zrem\", q, ARGV[1]) if redis.call(\"zcard\", q) == 1 then redis.call(\"del\", q) ",
    "elseif ",
    leave_notice!("KEYS[i]"),
    "end end return 1"
);

/// A fair reader's acquire ([`Config::fair`](crate::Config::fair), a shared lock): readers
/// queue with the fair lock's writers and sets (`KEYS[1]` the resource, `ARGV` as in
/// [`FAIR_ACQUIRE_BODY`], the entry's separator `r` instead of a space: a reader's). With a
/// queue, the expired entries are swept, the reader's own entry written or refreshed, and the
/// reader joins the resource's readers ([`SHARED_ACQUIRE_BODY`] without its test of the marks)
/// only if no live writer's or set's entry is older than its own (without an entry: none lives)
/// — the readers of a run between two writers are admitted together, and a waiting writer
/// keeps out only the readers that came after it, so that neither kind starves the other; won,
/// its entry leaves (the queue with it, once only the marker is left). With no queue, as
/// [`SHARED_ACQUIRE_BODY`] (a waiting writer's or set's mark refuses it: a writer of a handle
/// that is not fair); refused, a reader with an entry makes the queue. A queue that is not
/// ours: the error of [`foreign_queue`], nothing written. Answers 1 or 0.
pub(crate) const FAIR_SHARED_ACQUIRE_BODY: &str = concat!(
    queue_marker_read!(),
    "if m == false and redis.call(\"exists\", q) == 1 then ",
    foreign_queue!(),
    "end ",
    "local life = tonumber(ARGV[4]) local t = redis.call(\"time\") local now = t[1] * 1000 + math.floor(t[2] / 1000) local ahead = false ",
    "if m ~= false then ",
    entry_order!(),
    "redis.call(\"zremrangebyscore\", q, \"-inf\", now) ",
    "if ARGV[3] ~= \"\" then redis.call(\"zadd\", q, now + life, ARGV[3]) if redis.call(\"pttl\", q) < life then redis.call(\"pexpire\", q, ARGV[4]) end end ",
    "for _, e in ipairs(redis.call(\"zrangebyscore\", q, \"(\" .. now, \"(+inf\")) do if string.byte(e, 16) ~= 114 and (ARGV[3] == \"\" or less(e, ARGV[3])) then ahead = true break end end ",
    "else local w = redis.pcall(\"get\", \"redlock:waiting:\" .. KEYS[1]) ahead = w == \"redlock-mux waiting mark\" or w == \"redlock-mux set waiting\" end ",
    "local p = redis.call(\"pttl\", KEYS[1]) local ok = not ahead and p ~= -1 ",
    "if ok and p ~= -2 then local s = redis.pcall(\"zscore\", KEYS[1], \"",
    readers_marker!(),
    "\") if type(s) == \"table\" then if not string.find(s.err, \"WRONGTYPE\", 1, true) then return s end ok = false elseif not s then ok = false end end ",
    "if not ok then if m == false and ARGV[3] ~= \"\" then redis.call(\"zadd\", q, \"+inf\", \"",
    crate::model::keys::queue_marker!(),
    "\", now + life, ARGV[3]) redis.call(\"pexpire\", q, ARGV[4]) end return 0 end ",
    "local ttl = tonumber(ARGV[2]) ",
    "if p == -2 then redis.call(\"zadd\", KEYS[1], \"+inf\", \"",
    readers_marker!(),
    "\", now + ttl, ARGV[1]) else redis.call(\"zadd\", KEYS[1], now + ttl, ARGV[1]) end ",
    "if p < ttl then redis.call(\"pexpire\", KEYS[1], ARGV[2]) end ",
    "if m ~= false then if ARGV[3] ~= \"\" then redis.call(\"zrem\", q, ARGV[3]) end if redis.call(\"zcard\", q) == 1 then redis.call(\"del\", q) end end return 1"
);

/// How many scripts there are (see [`scripts`]).
pub(crate) const SCRIPT_COUNT: usize = 27;

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

/// The index of a waiting reader's mark (`model/keys.rs`).
pub(crate) const READER_MARK_SCRIPT: usize = 15;

/// The index of a step of a set's ordered acquisition in [`scripts`].
pub(crate) const SET_STEP_SCRIPT: usize = 16;

/// The index of the last step of a set's ordered acquisition with fencing in [`scripts`].
pub(crate) const SET_STEP_FENCED_SCRIPT: usize = 17;

/// The index of a set's mark on the member it waits for in [`scripts`].
pub(crate) const SET_MARK_SCRIPT: usize = 18;

/// The index of a plain lock's waiting attempt (steps back for a set) in [`scripts`].
pub(crate) const WAITING_ACQUIRE_SCRIPT: usize = 19;

/// The index of a plain lock's fenced waiting attempt in [`scripts`].
pub(crate) const WAITING_FENCED_ACQUIRE_SCRIPT: usize = 20;

/// The index of a reader's acquire past its set precedence (joins no readers while a set waits).
pub(crate) const SHARED_ACQUIRE_PAST_SETS_SCRIPT: usize = 21;

/// The index of a fair lock's acquire ([`FAIR_ACQUIRE_BODY`]).
pub(crate) const FAIR_ACQUIRE_SCRIPT: usize = 22;

/// The index of a fair lock's waiter leaving its queue ([`FAIR_LEAVE_BODY`]).
pub(crate) const FAIR_LEAVE_SCRIPT: usize = 23;

/// The index of a fair set's acquire ([`FAIR_SET_ACQUIRE_BODY`]).
pub(crate) const FAIR_SET_ACQUIRE_SCRIPT: usize = 24;

/// The index of a fair set's waiter leaving its members' queues ([`FAIR_SET_LEAVE_BODY`]).
pub(crate) const FAIR_SET_LEAVE_SCRIPT: usize = 25;

/// The index of a fair reader's acquire ([`FAIR_SHARED_ACQUIRE_BODY`]).
pub(crate) const FAIR_SHARED_ACQUIRE_SCRIPT: usize = 26;

/// What each script is and the commands it calls, by index, as an ACL refusal of one of them
/// names it ([`NodeFault::Permission`](crate::NodeFault::Permission)): the user needs every one (docs/production.md gives a
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
    "a set's step script (GET, SET, DEL, PEXPIRE, PTTL)",
    "a set's fenced step script (HMGET, HLEN, GET, SET, DEL, PEXPIRE, PTTL)",
    "a waiting set's mark script (GET, SET)",
    "the waiting acquire script (GET, SET)",
    "the fenced waiting acquire script (HMGET, HLEN, GET, SET)",
    "a read lock's acquire script past its set precedence (GET, PTTL, ZSCORE, TIME, ZADD, PEXPIRE)",
    "a fair lock's acquire script (ZSCORE, EXISTS, SET, TIME, ZADD, PEXPIRE, ZREMRANGEBYSCORE, PTTL, ZRANGEBYSCORE, ZREM, ZCARD, DEL)",
    "a fair lock's leave script (ZSCORE, ZREM, ZCARD, DEL, EXISTS, PUBSUB NUMSUB, PUBLISH)",
    "a fair set's acquire script (ZSCORE, EXISTS, TIME, ZREMRANGEBYSCORE, ZADD, PTTL, PEXPIRE, ZRANGEBYSCORE, SET, ZREM, ZCARD, DEL)",
    "a fair set's leave script (ZSCORE, ZREM, ZCARD, DEL, EXISTS, PUBSUB NUMSUB, PUBLISH)",
    "a fair reader's acquire script (ZSCORE, EXISTS, TIME, ZREMRANGEBYSCORE, ZADD, PTTL, PEXPIRE, ZRANGEBYSCORE, GET, ZREM, ZCARD, DEL)",
];

/// The scripts, their SHA-1 computed once per process: 0 release, 1 extend, 2 fenced acquire,
/// 3 fence write-back, 4 the simulator's flawed fenced acquire (see `fencing.rs`), 5 release
/// without the notice, 6 the waiting mark (`model/keys.rs`), 7 the fence repair (`fencing.rs`), 8–11
/// a set's acquire, fenced acquire, release and extend, 12–15 a shared lock's acquire, release
/// and extend, and a waiting reader's mark, 16–17 a set's step and fenced step, 18 a waiting
/// set's mark, 19–20 a plain lock's waiting attempt and its fenced twin, 21 a reader's acquire
/// past its set precedence, 22–23 a fair lock's acquire and its waiter's leave, 24–25 a fair
/// set's, 26 a fair reader's acquire.
pub(crate) fn scripts() -> &'static [Script; SCRIPT_COUNT] {
    static SCRIPTS: OnceLock<[Script; SCRIPT_COUNT]> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        let bodies = [
            RELEASE_BODY,
            EXTEND_BODY,
            crate::proto::scripts::ACQUIRE_BODY,
            crate::proto::scripts::WRITE_BODY,
            crate::proto::scripts::INCR_BODY,
            QUIET_RELEASE_BODY,
            crate::proto::scripts::MARK_BODY,
            crate::proto::scripts::REPAIR_BODY,
            SET_ACQUIRE_BODY,
            SET_FENCED_ACQUIRE_BODY,
            SET_RELEASE_BODY,
            SET_EXTEND_BODY,
            SHARED_ACQUIRE_BODY,
            SHARED_RELEASE_BODY,
            SHARED_EXTEND_BODY,
            crate::proto::scripts::READER_MARK_BODY,
            SET_STEP_BODY,
            SET_STEP_FENCED_BODY,
            SET_MARK_BODY,
            WAITING_ACQUIRE_BODY,
            WAITING_FENCED_ACQUIRE_BODY,
            SHARED_ACQUIRE_PAST_SETS_BODY,
            FAIR_ACQUIRE_BODY,
            FAIR_LEAVE_BODY,
            FAIR_SET_ACQUIRE_BODY,
            FAIR_SET_LEAVE_BODY,
            FAIR_SHARED_ACQUIRE_BODY,
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

/// Scripts that write a new hold (an acquire's): not sent again after a `NOSCRIPT` once other
/// requests are behind them on the connection (`State::on_frame`).
pub(crate) fn writes_a_hold(index: usize) -> bool {
    matches!(
        index,
        FENCED_ACQUIRE_SCRIPT
            | FLAWED_ACQUIRE_SCRIPT
            | SET_ACQUIRE_SCRIPT
            | SET_FENCED_ACQUIRE_SCRIPT
            | SHARED_ACQUIRE_SCRIPT
            | SET_STEP_SCRIPT
            | SET_STEP_FENCED_SCRIPT
            | WAITING_ACQUIRE_SCRIPT
            | WAITING_FENCED_ACQUIRE_SCRIPT
            | SHARED_ACQUIRE_PAST_SETS_SCRIPT
            | FAIR_ACQUIRE_SCRIPT
            | FAIR_SET_ACQUIRE_SCRIPT
            | FAIR_SHARED_ACQUIRE_SCRIPT
    )
}

/// Scripts that may be sent again on a fresh connection: releases and extend (compare-and-
/// delete, compare-and-pexpire). Not the fenced ones: the acquire holds a `SET NX`, and a
/// write-back or a repair carries the `run_id` of the connection it was meant for.
pub(crate) fn replayable(index: usize) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::keys::{MARK_VALUE, READERS_MARKER};

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
    fn every_script_that_takes_a_lock_writes_a_hold() {
        // A yes from an acquire script is doubtful as a `SET NX`'s is (a restarted node may
        // grant a held lock): left out of this list, the fair acquire's yes counted during a
        // restarted node's quarantine, and the simulator found two holders (`--fair`, seed 45
        // of its first 2,000 schedules).
        for script in scripts() {
            let named = SCRIPT_CALLS[script.index];
            let takes = named.contains("acquire") || named.contains("step script");
            assert_eq!(writes_a_hold(script.index), takes, "{named}");
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

    #[test]
    fn the_mark_value_is_the_one_the_scripts_compare() {
        let literal = format!("\"{MARK_VALUE}\"");
        assert_eq!(MARK_BODY.matches(&literal).count(), 2);
        assert_eq!(RELEASE_BODY.matches(&literal).count(), 1);
        // Not a token this crate could make: tokens are base64-like, without spaces.
        assert!(MARK_VALUE.contains(' '));
        let token = crate::model::token::Token::generate().unwrap();
        assert!(!token.as_bytes().contains(&b' '));
    }

    #[test]
    fn the_readers_marker_is_no_token_and_the_shared_scripts_name_it() {
        // Longer than any token a lock may carry: no reader can be the marker.
        assert!(READERS_MARKER.len() > crate::model::token::MAX_TOKEN_LEN);
        let literal = format!("\"{READERS_MARKER}\"");
        assert_eq!(SHARED_ACQUIRE_BODY.matches(&literal).count(), 2);
        assert_eq!(SHARED_RELEASE_BODY.matches(&literal).count(), 1);
        // Not shaped as a token either (the release's sweep removes only those).
        assert!(READERS_MARKER.contains(' '));
    }
}
