//! Every key and channel this crate writes besides the lock keys themselves, and the rule that
//! keeps them apart from lock names.
//!
//! | name | type | written by | holds |
//! |---|---|---|---|
//! | `<resource>` | string | acquire (`SET NX PX`) | the lock's token |
//! | `<name>#<i>` | string | a semaphore's acquire (`SET NX PX`), i in 0..P | the token of permit i's holder |
//! | `redlock:fence` | hash | fenced acquire's write-back, the fence repair | `run` (a `run_id`), `n` (the counter) |
//! | `redlock:waiting:<resource>` | string | a waiter's mark | exactly [`MARK_VALUE`] |
//! | channel `redlock:released:<resource>` | pub/sub | a release that found a mark | how many clients were subscribed to it, the releaser not counted (decimal, `PUBSUB NUMSUB`) |
//! | `<resource>` read-locked | sorted set | a shared acquire (`SHARED_ACQUIRE_BODY`; a fair reader's, `FAIR_SHARED_ACQUIRE_BODY`) | [`READERS_MARKER`] scored `+inf`, and each reader's token scored by its expiry (ms, the node's clock); the key lives as long as the longest |
//! | `redlock:queue:<resource>` | sorted set | a fair waiting acquire (`FAIR_ACQUIRE_BODY`, `FAIR_SET_ACQUIRE_BODY` on each member, `FAIR_SHARED_ACQUIRE_BODY`) | [`QUEUE_MARKER`] scored `+inf`, and each waiter's entry scored by its expiry (ms, the node's clock) |
//! | `redlock:waiting:<resource>` (a reader's) | string | a waiting reader's mark, or a waiting set's on each member | exactly [`READER_MARK_VALUE`] |
//! | each `<resource>` of an all-or-none lock | string | the set scripts (`SET_ACQUIRE_BODY`) | the lock's token, the same in every member |
//!
//! **The namespace rule.** Lock names must not start with [`RESERVED_PREFIX`]: every entry
//! point refuses them ([`Error::ReservedName`]), so no lock of this crate can be one of its
//! internal keys.
//!
//! **Foreign keys are never changed.** Other clients on the same servers (node-redlock,
//! redsync, an application's own data) know nothing of this crate, so every write is safe
//! against a key it did not write — no script modifies, deletes or changes the TTL of a key
//! unless the key is recognisably ours, and the refusal leaves it as it was
//! (tests/namespace.rs tries every kind against every key type):
//! - a lock key (plain, a semaphore's permit, a set's member) is taken only where no key
//!   exists (`SET NX`, `EXISTS`), and released or extended only where it holds our token;
//! - a read lock is a sorted set that holds [`READERS_MARKER`]: a reader joins only such a set
//!   (or makes a new one), and a reader's release removes its own token, expired members shaped
//!   as this crate's tokens, and the key once only the marker is left;
//! - a mark is created only where no key exists and refreshed only where the key holds a mark
//!   value ([`MARK_VALUE`], [`READER_MARK_VALUE`]: a lock's token is random and never equals
//!   one) (the script `MARK_BODY`);
//! - a release deletes the mark only if it holds [`MARK_VALUE`] (`RELEASE_BODY` in
//!   `proto/scripts.rs`) or [`READER_MARK_VALUE`]; a reader's release deletes only the latter (a
//!   waiting writer's mark outlives the readers it waits for: `SHARED_RELEASE_BODY`);
//! - the fence counter is a hash with the fields `run` and `n` and no other: a hash named
//!   `redlock:fence` with any other field is another application's, and the fencing scripts
//!   answer an error on that node before writing anything (`proto/fencing.rs`); a key of another type
//!   there makes them fail with `WRONGTYPE`, unchanged.

use crate::model::error::Error;

/// The prefix of every key and channel this crate uses for itself; lock names must not start
/// with it.
pub const RESERVED_PREFIX: &str = "redlock:";

/// The fence counter's key on every node: a hash with the fields `run` and `n` (`proto/fencing.rs`).
pub const FENCE_KEY: &str = "redlock:fence";

/// The key a waiting client sets to say that it listens for the resource's release notice:
/// this prefix, then the resource name.
pub const WAITING_KEY_PREFIX: &str = "redlock:waiting:";

/// The channel a release notice is published on: this prefix, then the resource name.
pub const RELEASE_CHANNEL_PREFIX: &str = "redlock:released:";

/// The key of a fair lock's queue of waiters ([`Config::fair`](crate::Config::fair)): this
/// prefix, then the resource name. A sorted set of this crate's: [`QUEUE_MARKER`] scored
/// `+inf`, and each waiter's entry (its wait's start in ms on its client's clock, 15 digits,
/// a space — a reader's: `r` — its token's first 23 bytes) scored by the entry's expiry in ms
/// on the node's clock.
pub const QUEUE_KEY_PREFIX: &str = "redlock:queue:";

/// The text of [`QUEUE_MARKER`], as a macro so that the scripts can `concat!` it in.
macro_rules! queue_marker {
    () => {
        "redlock-mux queue: every other member is a waiter, scored by its expiry in ms"
    };
}
pub(crate) use queue_marker;

/// The member that makes a sorted set a fair lock's queue of this crate's, scored `+inf`
/// (no sweep of expired waiters reaches it): a key under [`QUEUE_KEY_PREFIX`] without it is
/// another application's, and a fair acquire answers an error on that node instead of
/// touching it. Longer than any waiter's entry, and holds spaces no entry has after its 16th
/// byte, so no entry can be it.
pub const QUEUE_MARKER: &str = queue_marker!();

/// How long a fair lock's queue entry is: the wait's start (ms, 15 digits), a space (a
/// reader's: `r`), the token's family (`FAMILY_LEN` bytes).
pub(crate) const QUEUE_ENTRY_LEN: usize = 15 + 1 + crate::model::token::FAMILY_LEN;

/// The value of every waiting mark, and only of marks: a lock's token is 20 random bytes
/// encoded (or another client's random value), never this text. Written into `MARK_BODY` and
/// `RELEASE_BODY` as a literal: keep the three the same (a unit test checks).
pub const MARK_VALUE: &str = "redlock-mux waiting mark";

/// The value of a waiting mark set by a *reader* (a waiting shared lock, [`SHARED_PREFIX`]):
/// like [`MARK_VALUE`] it makes a release publish its notice, but it does not stop new
/// readers — a mark of [`MARK_VALUE`] is set only by waiters for the exclusive lock,
/// and stops them: a waiting writer is not starved by readers that keep coming.
pub const READER_MARK_VALUE: &str = "redlock-mux reader waiting";

/// The value of a waiting mark set by a *set* ([`ResourceSet`](crate::ResourceSet)) on the
/// member it waits for (it takes its members one at a time, in order): while it is there, this
/// crate's waiting writers and readers of that member step back during the first
/// [`Config::set_precedence`](crate::Config::set_precedence) of their wait (a first attempt,
/// `try_lock` and other clients' `SET NX` do not look), so that callers of one member do not
/// starve a set, nor a stream of sets them. A release publishes and leaves it; the set deletes
/// it when it takes the member, and it expires two fallback polls after the set's last
/// attempt.
pub const SET_MARK_VALUE: &str = "redlock-mux set waiting";

/// The text of [`READERS_MARKER`], as a macro so that the scripts can `concat!` it in.
macro_rules! readers_marker {
    () => {
        "redlock-mux read lock: every other member is a reader's token, scored by its expiry in ms"
    };
}
pub(crate) use readers_marker;

/// The member that makes a sorted set a read lock of this crate's: every read-locked key holds
/// it, scored `+inf` (so no sweep of expired readers reaches it), beside the readers' tokens.
/// A sorted set without it is someone else's data — an application's leaderboard, rate limiter
/// or queue under the same name — and a reader is refused there as if a writer held it,
/// leaving the key as it was. Longer than [`MAX_TOKEN_LEN`](crate::MAX_TOKEN_LEN), so no
/// reader's token can be it.
pub const READERS_MARKER: &str = readers_marker!();

/// The prefix of a shared (read) lock of a resource: this prefix, then the resource's name.
/// Never a key on a server: on each node the readers of `<name>` are the sorted set `<name>`
/// (each reader's token, scored by its expiry on the node's clock), so a plain `SET NX` of
/// `<name>` — a writer, any Redlock client — fails while readers hold it, and a reader is
/// refused while `<name>` is a string (a writer holds it) or a writer waits (its mark).
pub const SHARED_PREFIX: &str = "redlock:shared:";

/// The resource a shared lock is of, `None` for another resource.
pub fn shared_name(resource: &[u8]) -> Option<&[u8]> {
    resource.strip_prefix(SHARED_PREFIX.as_bytes())
}

/// The prefix of a set of resources locked all or none ([`ResourceSet`](crate::ResourceSet)): this prefix, then
/// each member as `<length>:<name>` (decimal length), sorted and without duplicates. Never a
/// key on a server: the engine sends a set's members as the keys of the set scripts
/// (`proto/scripts.rs`), and keys its local wait queue by the whole encoding.
pub const SET_PREFIX: &str = "redlock:set:";

/// The most resources one all-or-none lock may hold.
pub const MAX_SET_LEN: usize = 64;

/// Encodes `names` as one set resource ([`SET_PREFIX`]): sorted, duplicates dropped, so that
/// `[b, a, a]` and `[a, b]` are the same lock and the same wait queue. Each name is checked
/// by `check` first (length, reserved prefix).
pub(crate) fn encode_set<R: AsRef<[u8]>>(
    names: &[R],
    check: impl Fn(&[u8]) -> Result<(), Error>,
) -> Result<Vec<u8>, Error> {
    if names.is_empty() || names.len() > MAX_SET_LEN {
        return Err(Error::Config(format!(
            "an all-or-none lock takes 1 to {MAX_SET_LEN} resources, not {}",
            names.len()
        )));
    }
    let mut sorted: Vec<&[u8]> = names.iter().map(AsRef::as_ref).collect();
    for name in &sorted {
        check(name)?;
    }
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = SET_PREFIX.as_bytes().to_vec();
    for name in sorted {
        out.extend_from_slice(name.len().to_string().as_bytes());
        out.push(b':');
        out.extend_from_slice(name);
    }
    Ok(out)
}

/// The members of a set resource ([`SET_PREFIX`]), `None` for a plain resource name. A
/// malformed encoding (which no entry point makes) ends the iteration early.
pub fn set_members(resource: &[u8]) -> Option<Members<'_>> {
    resource
        .strip_prefix(SET_PREFIX.as_bytes())
        .map(|rest| Members { rest })
}

/// The encoding of the set made of the first `k` members of the set resource `resource`
/// (members are sorted, so it is a byte prefix of `resource`), and its last member: what a
/// step of a set's ordered acquisition takes (`engine/wait.rs`). `None` if `resource` is not
/// a set or has fewer than `k` members, or `k` is 0.
pub(crate) fn set_prefix(resource: &[u8], k: usize) -> Option<(&[u8], &[u8])> {
    let mut members = set_members(resource)?;
    let mut last = None;
    for _ in 0..k {
        last = Some(members.next()?);
    }
    Some((&resource[..resource.len() - members.rest.len()], last?))
}

/// Checks a set resource: `None` if `resource` is a plain name; else whether it is a set as
/// [`encode_set`] makes it (members sorted, no duplicates, nothing after the last) with
/// every member accepted by `check`.
pub(crate) fn check_set(
    resource: &[u8],
    check: impl Fn(&[u8]) -> Result<(), Error>,
) -> Option<Result<(), Error>> {
    let mut members = set_members(resource)?;
    // Without a copy (a set is checked on every acquire of it): each member accepted, in
    // strictly increasing order, each length written as `encode_set` writes it, nothing left.
    let mut count = 0;
    let mut last: Option<&[u8]> = None;
    let mut canonical = true;
    for member in members.by_ref() {
        if let Err(e) = check(member) {
            return Some(Err(e));
        }
        canonical &= last.is_none_or(|l| l < member);
        last = Some(member);
        count += 1;
    }
    canonical &= members.rest.is_empty() && count > 0 && count <= MAX_SET_LEN;
    // A length with a leading zero decodes but is not how `encode_set` writes it.
    canonical &= set_members(resource).is_some_and(|m| m.lengths_canonical());
    Some(match canonical {
        true => Ok(()),
        false => Err(Error::Config(
            "not a resource set as ResourceSet makes it (a name starting with \"redlock:set:\")"
                .into(),
        )),
    })
}

/// True if `resource` is one plain name: neither a set nor a shared lock.
pub(crate) fn is_one_key(resource: &[u8]) -> bool {
    set_members(resource).is_none() && shared_name(resource).is_none()
}

/// The key of `resource` that stands for it on a node: the name itself, or a set's first
/// member (all members are set and deleted together).
pub(crate) fn first_key(resource: &[u8]) -> &[u8] {
    match set_members(resource) {
        Some(mut members) => members.next().unwrap_or(resource),
        None => resource,
    }
}

/// True if a caller holding `held` must not wait for `wanted` (re-entry, `crate::api::reentry`):
/// they name a resource in common and are not read locks of different names. A plain name, a
/// shared lock of it and every set that has it as a member all lock the one resource; readers
/// exclude writers. A reader of the very name held for reading counts too: readers share, but a
/// waiting writer's mark refuses new readers, and that writer waits for the held read lock —
/// which is released only when the work returns.
pub(crate) fn excludes(held: &[u8], wanted: &[u8]) -> bool {
    if shared_name(held).is_some() && shared_name(wanted).is_some() {
        return held == wanted;
    }
    fn names(r: &[u8]) -> (Option<Members<'_>>, &[u8]) {
        let plain = shared_name(r).unwrap_or(r);
        (set_members(plain), plain)
    }
    let (held_set, held_one) = names(held);
    let (wanted_set, wanted_one) = names(wanted);
    match (held_set, wanted_set) {
        (None, None) => held_one == wanted_one,
        (Some(mut members), None) => members.any(|m| m == wanted_one),
        (None, Some(mut members)) => members.any(|m| m == held_one),
        (Some(mut a), Some(b)) => a.any(|m| b.clone().any(|n| n == m)),
    }
}

/// The members of a set resource, in order (see [`set_members`]).
#[derive(Debug, Clone)]
pub struct Members<'a> {
    rest: &'a [u8],
}

impl Members<'_> {
    /// True if every member's length is written without a leading zero.
    fn lengths_canonical(mut self) -> bool {
        loop {
            let Some(colon) = self.rest.iter().position(|&b| b == b':') else {
                return true;
            };
            if self.rest[0] == b'0' && colon > 1 {
                return false;
            }
            if self.next().is_none() {
                return true;
            }
        }
    }
}

impl<'a> Iterator for Members<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let colon = self.rest.iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&self.rest[..colon])
            .ok()?
            .parse()
            .ok()?;
        // Checked: the length is whatever the name says (a length near
        // usize::MAX overflowed, a panic in debug builds).
        let end = (colon + 1).checked_add(len)?;
        let name = self.rest.get(colon + 1..end)?;
        self.rest = &self.rest[end..];
        Some(name)
    }
}

/// What separates a semaphore's name from a permit's index in the permit's key: permit `i`
/// of the semaphore `name` is the plain lock `<name>#<i>` (`i` in decimal, from 0). So a plain
/// lock on `<name>#<i>` — this crate's, or any client's `SET … NX PX` — takes permit `i`, and
/// a plain lock on `<name>` takes none.
pub const PERMIT_SEPARATOR: char = '#';

/// The key of permit `i` of the semaphore `name`: `<name>#<i>`.
pub(crate) fn permit_key(name: &[u8], i: u32) -> Vec<u8> {
    let index = i.to_string();
    let mut key = Vec::with_capacity(name.len() + 1 + index.len());
    key.extend_from_slice(name);
    key.push(PERMIT_SEPARATOR as u8);
    key.extend_from_slice(index.as_bytes());
    key
}

/// Checks a shared resource: `None` if `resource` is not one; else whether its name is
/// accepted by `check`.
pub(crate) fn check_shared(
    resource: &[u8],
    check: impl Fn(&[u8]) -> Result<(), Error>,
) -> Option<Result<(), Error>> {
    shared_name(resource).map(check)
}

/// Checks a lock's resource by its shape: a set's members, a shared lock's name, or the name
/// itself, each by `check`.
pub(crate) fn check_resource(
    resource: &[u8],
    check: impl Fn(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    check_set(resource, &check)
        .or_else(|| check_shared(resource, &check))
        .unwrap_or_else(|| check(resource))
}

/// Refuses an empty lock name, and one in the reserved namespace ([`check_name`]).
pub(crate) fn check_lock_name(resource: &[u8]) -> Result<(), Error> {
    if resource.is_empty() {
        return Err(Error::Config("empty resource name".into()));
    }
    check_name(resource)
}

/// Refuses a lock name in the reserved namespace.
pub(crate) fn check_name(resource: &[u8]) -> Result<(), Error> {
    if resource.starts_with(RESERVED_PREFIX.as_bytes()) {
        return Err(Error::ReservedName {
            name: String::from_utf8_lossy(resource).into_owned(),
            prefix: RESERVED_PREFIX,
        });
    }
    Ok(())
}

/// `resource`'s waiting key, [`WAITING_KEY_PREFIX`] then the name, as a new vector (the
/// engine writes it into its command buffer without one: `Engine::mark_waiting`).
#[cfg(any(test, feature = "sim"))]
pub(crate) fn waiting_key(resource: &[u8]) -> Vec<u8> {
    [WAITING_KEY_PREFIX.as_bytes(), resource].concat()
}

/// The internal keys this crate may write for `resource` (besides `resource` itself).
#[cfg(test)]
pub(crate) fn internal_keys(resource: &[u8]) -> [Vec<u8>; 2] {
    [FENCE_KEY.as_bytes().to_vec(), waiting_key(resource)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_set_name_whose_member_length_overflows_is_refused() {
        let ok = |_: &[u8]| Ok(());
        for name in [
            format!("{SET_PREFIX}{}:x", usize::MAX),
            format!("{SET_PREFIX}1:a{}:x", usize::MAX),
        ] {
            let checked = check_set(name.as_bytes(), ok);
            assert!(matches!(checked, Some(Err(_))), "{name}: {checked:?}");
        }
    }

    #[test]
    fn every_internal_key_and_channel_is_in_the_reserved_namespace() {
        for key in [
            FENCE_KEY,
            WAITING_KEY_PREFIX,
            RELEASE_CHANNEL_PREFIX,
            SET_PREFIX,
        ] {
            assert!(key.starts_with(RESERVED_PREFIX), "{key}");
            assert!(check_name(key.as_bytes()).is_err(), "{key}");
        }
    }

    #[test]
    fn a_held_lock_excludes_every_shape_of_its_resource_but_readers_of_other_names() {
        let ok = |_: &[u8]| Ok(());
        let set_ab = encode_set(&["a", "b"], ok).unwrap();
        let set_bc = encode_set(&["b", "c"], ok).unwrap();
        let set_cd = encode_set(&["c", "d"], ok).unwrap();
        let shared = |n: &str| format!("{SHARED_PREFIX}{n}").into_bytes();
        let yes: [(&[u8], &[u8]); 10] = [
            (&shared("a"), &shared("a")),
            (b"a", b"a"),
            (b"a", &shared("a")),
            (&shared("a"), b"a"),
            (&set_ab, b"b"),
            (b"b", &set_ab),
            (&set_ab, &set_bc),
            (&set_ab, &shared("a")),
            (&shared("b"), &set_bc),
            (&set_ab, &set_ab),
        ];
        for (held, wanted) in yes {
            assert!(excludes(held, wanted), "{held:?} {wanted:?}");
        }
        let no: [(&[u8], &[u8]); 6] = [
            (b"a", b"b"),
            (&shared("a"), &shared("b")),
            (&set_ab, &set_cd),
            (&set_ab, b"c"),
            (&shared("c"), &set_ab),
            (b"ab", &set_ab),
        ];
        for (held, wanted) in no {
            assert!(!excludes(held, wanted), "{held:?} {wanted:?}");
        }
    }

    #[test]
    fn permit_keys_are_the_name_a_hash_and_the_index() {
        assert_eq!(permit_key(b"deploy", 0), b"deploy#0");
        assert_eq!(permit_key(b"deploy", 63), b"deploy#63");
    }

    #[test]
    fn a_sets_prefix_is_the_set_of_its_first_members() {
        let ok = |_: &[u8]| Ok(());
        let set = encode_set(&["b:2", "a", "cc"], ok).unwrap();
        let (one, last) = set_prefix(&set, 1).unwrap();
        assert_eq!(
            (one, last),
            (&encode_set(&["a"], ok).unwrap()[..], &b"a"[..])
        );
        let (two, last) = set_prefix(&set, 2).unwrap();
        assert_eq!(two, &encode_set(&["a", "b:2"], ok).unwrap()[..]);
        assert_eq!(last, b"b:2");
        assert_eq!(set_prefix(&set, 3), Some((&set[..], &b"cc"[..])));
        assert_eq!(set_prefix(&set, 4), None);
        assert_eq!(set_prefix(&set, 0), None);
        assert_eq!(set_prefix(b"plain", 1), None);
    }

    #[test]
    fn a_set_is_sorted_without_duplicates_and_decodes_to_its_members() {
        let ok = |_: &[u8]| Ok(());
        let set = encode_set(&["b:2", "a", "b:2", ""], ok).unwrap();
        assert_eq!(set, b"redlock:set:0:1:a3:b:2");
        let members: Vec<&[u8]> = set_members(&set).unwrap().collect();
        assert_eq!(members, [&b""[..], b"a", b"b:2"]);
        assert!(set_members(b"plain").is_none());
        assert!(encode_set::<&str>(&[], ok).is_err());
        let many: Vec<String> = (0..=MAX_SET_LEN).map(|i| i.to_string()).collect();
        assert!(encode_set(&many, ok).is_err());
        assert!(encode_set(&["x", "redlock:fence"], check_name).is_err());
        // Only the canonical encoding is a set a lock may have.
        let ok_set = |r: &[u8]| check_set(r, ok).map(|c| c.is_ok());
        assert_eq!(ok_set(b"redlock:set:1:a1:b"), Some(true));
        assert_eq!(ok_set(b"redlock:set:1:b1:a"), Some(false), "unsorted");
        assert_eq!(ok_set(b"redlock:set:1:a1:a"), Some(false), "duplicate");
        assert_eq!(
            ok_set(b"redlock:set:1:a1:bx"),
            Some(false),
            "trailing bytes"
        );
        assert_eq!(ok_set(b"redlock:set:01:a"), Some(false), "leading zero");
        assert_eq!(ok_set(b"redlock:set:"), Some(false), "empty");
        assert_eq!(ok_set(b"plain"), None);
        // Malformed (never made): the iteration ends early, no panic.
        assert_eq!(set_members(b"redlock:set:9:ab").unwrap().count(), 0);
        assert_eq!(set_members(b"redlock:set:x:ab").unwrap().count(), 0);
    }

    proptest! {
        /// Any list of names: the set's members are the names, sorted and deduplicated.
        #[test]
        fn sets_round_trip(names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 1..8)) {
            let set = encode_set(&names, |_| Ok(())).unwrap();
            let mut want = names.clone();
            want.sort();
            want.dedup();
            let got: Vec<Vec<u8>> = set_members(&set).unwrap().map(<[u8]>::to_vec).collect();
            prop_assert_eq!(got, want);
            prop_assert!(check_set(&set, |_| Ok(())).unwrap().is_ok());
        }

        /// Any bytes after the set prefix: checked without a panic, and accepted only as the
        /// encoding of their own members.
        #[test]
        fn any_set_name_is_checked_without_panic(tail in proptest::collection::vec(any::<u8>(), 0..24)) {
            let mut name = SET_PREFIX.as_bytes().to_vec();
            name.extend_from_slice(&tail);
            if check_set(&name, |_| Ok(())).unwrap().is_ok() {
                let members: Vec<&[u8]> = set_members(&name).unwrap().collect();
                prop_assert_eq!(encode_set(&members, |_| Ok(())).unwrap(), name.clone());
            }
        }

        /// No accepted lock name is an internal key of any resource (names from a small
        /// alphabet, so that prefixes and near-misses of the reserved ones come up often).
        #[test]
        fn no_accepted_name_is_an_internal_key(
            name in "(redlock|redlock:|redlock:waiting:|redlock:fence|r|:|e|d|x){0,6}",
            other in "(redlock:|redlock:waiting:|:|x|w){0,4}",
        ) {
            let name = name.into_bytes();
            if check_name(&name).is_ok() {
                for resource in [&name, other.as_bytes()] {
                    for key in internal_keys(resource) {
                        prop_assert_ne!(&key, &name);
                    }
                }
                let mut channel = RELEASE_CHANNEL_PREFIX.as_bytes().to_vec();
                channel.extend_from_slice(&name);
                prop_assert_ne!(&channel, &name);
            }
        }

        /// Any byte string: refused exactly when it starts with the prefix.
        #[test]
        fn names_are_refused_exactly_by_prefix(name in proptest::collection::vec(any::<u8>(), 0..24)) {
            let mut prefixed = RESERVED_PREFIX.as_bytes().to_vec();
            prefixed.extend_from_slice(&name);
            prop_assert!(check_name(&prefixed).is_err());
            prop_assert_eq!(check_name(&name).is_ok(), !name.starts_with(RESERVED_PREFIX.as_bytes()));
        }
    }
}
