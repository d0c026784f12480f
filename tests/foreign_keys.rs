//! Keys that are not ours, against real servers: every kind of lock (plain, shared, a set's
//! member, a semaphore's permit, a waiter's mark, the fence counter, a fair handle's plain
//! lock, reader and set) tried against a foreign key of every type under the name it uses,
//! with every operation (acquire, wait, extend, release, status, and for fencing the repair).
//! The key must come out exactly as it went in: the same type and value (`DUMP`), and its TTL
//! neither raised nor cut.
//!
//! The case that started it: a read lock joined an application's sorted set that had a TTL
//! (`ZADD board 10 alice 20 bob`, `PEXPIRE board 5000`), raised its TTL to the lock's, and its
//! release swept `alice` and `bob` away as expired readers; once the application deleted its
//! set, a writer was granted the name while the reader still held it.

use std::time::{Duration, Instant};

use redis::Value;
use redis_local::{Cluster, Server};
use redlock_mux::{Builder, Error, FenceFloor, Lock, Redlock, ResourceSet, Shared};

/// A wait that must end in a refusal: long enough for a mark and a poll or two.
const SHORT: Duration = Duration::from_millis(150);
/// The TTL of foreign keys that have one: any key found with much less was cut by us, any
/// with more was raised.
const FOREIGN_TTL_MS: i64 = 60_000;
/// How much a key's TTL may run down between the two looks (the test's own pace on a loaded
/// machine): a TTL raised or cut by a lock's (a few seconds) is far outside it.
const TTL_SLACK_MS: i64 = 20_000;

/// A foreign key's type and how it is written: each as an application would have it.
#[derive(Debug, Clone, Copy)]
enum Foreign {
    String,
    /// A string whose value is `1` (a counter, a flag).
    One,
    List,
    Set,
    /// An application's sorted set without a TTL (a leaderboard).
    SortedSet,
    /// With a TTL (a rate limiter's window, a timestamp-scored queue): the case a read lock
    /// used to join.
    SortedSetTtl,
    Hash,
    Stream,
}

const FOREIGN: [Foreign; 8] = [
    Foreign::String,
    Foreign::One,
    Foreign::List,
    Foreign::Set,
    Foreign::SortedSet,
    Foreign::SortedSetTtl,
    Foreign::Hash,
    Foreign::Stream,
];

impl Foreign {
    fn write(self, s: &Server, key: &str) {
        let ttl = FOREIGN_TTL_MS.to_string();
        match self {
            Foreign::String => drop(s.cmd(&["SET", key, "application data", "PX", &ttl])),
            Foreign::One => drop(s.cmd(&["SET", key, "1"])),
            Foreign::List => drop(s.cmd(&["RPUSH", key, "a", "b"])),
            Foreign::Set => drop(s.cmd(&["SADD", key, "a", "b"])),
            Foreign::SortedSet => drop(s.cmd(&["ZADD", key, "10", "alice", "20", "bob"])),
            Foreign::SortedSetTtl => {
                s.cmd(&["ZADD", key, "10", "alice", "20", "bob"]);
                s.cmd(&["PEXPIRE", key, &ttl]);
            }
            // A hash with `run` and `n` among its fields: named like the fence counter, it
            // must still not be taken for ours.
            Foreign::Hash => drop(s.cmd(&["HSET", key, "run", "x", "n", "5", "owner", "app"])),
            Foreign::Stream => drop(s.cmd(&["XADD", key, "1-1", "field", "value"])),
        }
    }
}

/// What a key is on one server: its type, its serialized value, its TTL (ms; -1 none).
#[derive(Debug, PartialEq)]
struct Snapshot {
    kind: Value,
    dump: Value,
    pttl: i64,
}

fn snapshot(s: &Server, key: &str) -> Snapshot {
    Snapshot {
        kind: s.cmd(&["TYPE", key]),
        dump: s.cmd(&["DUMP", key]),
        pttl: s.pttl(key),
    }
}

fn assert_unchanged(servers: &Cluster, key: &str, before: &[Snapshot], what: &str) {
    for (s, was) in servers.iter().zip(before) {
        let now = snapshot(s, key);
        assert_eq!(
            (&now.kind, &now.dump),
            (&was.kind, &was.dump),
            "{what}: {key} changed on {}",
            s.addr()
        );
        let kept = match was.pttl {
            -1 => now.pttl == -1,
            ttl => now.pttl <= ttl && now.pttl > ttl - TTL_SLACK_MS,
        };
        assert!(
            kept,
            "{what}: {key}'s TTL went from {} to {} ms on {}",
            was.pttl,
            now.pttl,
            s.addr()
        );
    }
}

/// The kinds, each with the key its name puts the foreign key under.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Plain,
    Shared,
    SetMember,
    Permit,
    Mark,
    Fence,
    /// A fair handle's plain lock, reader and set (`Builder::fair`), each through its queue.
    Fair,
}

const KINDS: [Kind; 7] = [
    Kind::Plain,
    Kind::Shared,
    Kind::SetMember,
    Kind::Permit,
    Kind::Mark,
    Kind::Fence,
    Kind::Fair,
];

/// A random token no lock holds: for releases and extends of a lock rebuilt from its parts.
/// For an all-or-none lock it has the shape `Lock::from_parts` takes for that set alone: `.`,
/// the first 6 bytes of the SHA-1 of the set's resource in base64url (8 characters), then 18
/// random characters.
fn stranger_token(resource: &[u8]) -> String {
    let random = redlock_mux::Token::generate().unwrap().to_string();
    if !resource.starts_with(redlock_mux::keys::SET_PREFIX.as_bytes()) {
        return random;
    }
    use sha1::{Digest, Sha1};
    const BASE64URL: &[u8; 64] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let digest = Sha1::digest(resource);
    let mut token = String::from(".");
    for chunk in digest[..6].chunks(3) {
        let n = u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]);
        token.extend((0..4).map(|k| char::from(BASE64URL[((n >> (18 - 6 * k)) & 63) as usize])));
    }
    token.push_str(&random[random.len() - 18..]);
    token
}

fn handle(servers: &Cluster, (fencing, fair): (bool, bool)) -> Redlock {
    Builder::new(servers.urls())
        .quarantine(None)
        .fencing(fencing)
        .fair(fair)
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap()
}

/// Every operation on the lock `resource` that touches the key: an attempt, a wait, an extend
/// and a release of a lock rebuilt with a token nobody holds, a status read.
fn every_operation(redlock: &Redlock, resource: &[u8]) {
    // Granted where the foreign key is not under the lock's own name (a mark's, the fence
    // counter's): released at once, as a holder would, before the next.
    if let Ok(lock) = redlock.try_lock(resource) {
        redlock.unlock(lock).unwrap();
    }
    if let Ok(lock) = redlock.lock_until(resource, Instant::now() + SHORT) {
        redlock.unlock(lock).unwrap();
    }
    let mut stranger =
        Lock::from_parts(resource, stranger_token(resource), Duration::from_secs(1)).unwrap();
    let _ = redlock.extend(&mut stranger, Duration::from_secs(2));
    let _ = redlock.unlock(stranger);
    let _ = redlock.status(resource, Duration::from_secs(1));
}

/// A holder of `name` of ours and a waiter for it that marks (a writer, then a reader, then
/// a set that has it as a member), the holder's release reading the marks; and the same with
/// readers holding and a writer waiting.
fn marks_of(redlock: &Redlock, name: &str) {
    let waiter = redlock.clone();
    let shared = Shared::new(name).unwrap();
    let set = ResourceSet::new([name, "other-member"]).unwrap();
    for waits in [
        name.as_bytes().to_vec(),
        shared.as_ref().to_vec(),
        set.as_ref().to_vec(),
    ] {
        let held = redlock
            .try_lock(name)
            .unwrap_or_else(|e| panic!("{name} before a waiter for {waits:?}: {e}"));
        let w = waiter.clone();
        let t = std::thread::spawn(move || w.lock_until(&waits, Instant::now() + SHORT));
        let got = t.join().unwrap();
        assert!(
            matches!(got, Err(Error::Held(_) | Error::NoQuorum(_))),
            "{got:?}"
        );
        assert_eq!(redlock.unlock(held).unwrap(), 3);
    }
    let reader = redlock.try_lock_shared(name).unwrap();
    let got = waiter.lock_until(name, Instant::now() + SHORT);
    assert!(
        matches!(got, Err(Error::Held(_) | Error::NoQuorum(_))),
        "{got:?}"
    );
    redlock.unlock(reader).unwrap();
}

/// Runs every operation of `kind` against a foreign key of type `foreign`; answers the key the
/// foreign key was put under.
fn try_kind(servers: &Cluster, kind: Kind, foreign: Foreign) {
    let name = "job";
    let key: String = match kind {
        Kind::Plain | Kind::Shared | Kind::SetMember | Kind::Fair => name.into(),
        Kind::Permit => format!("{name}#0"),
        Kind::Mark => format!("redlock:waiting:{name}"),
        Kind::Fence => redlock_mux::FENCE_KEY.into(),
    };
    for s in servers.iter() {
        s.flushall();
        foreign.write(s, &key);
        if let Kind::Permit = kind {
            // Every permit foreign: no acquire can win one.
            foreign.write(s, &format!("{name}#1"));
        }
    }
    let before: Vec<Snapshot> = servers.iter().map(|s| snapshot(s, &key)).collect();
    let what = format!("{kind:?} against {foreign:?}");
    let redlock = handle(
        servers,
        (matches!(kind, Kind::Fence), matches!(kind, Kind::Fair)),
    );
    match kind {
        Kind::Plain => every_operation(&redlock, name.as_bytes()),
        Kind::Shared => {
            let shared = Shared::new(name).unwrap();
            let got = redlock.try_lock_shared(name);
            assert!(got.is_err(), "{what}: a reader was granted: {got:?}");
            every_operation(&redlock, shared.as_ref());
            let _ = redlock.lock_shared_until(name, Instant::now() + SHORT);
        }
        Kind::SetMember => {
            let set = ResourceSet::new([name, "other-member"]).unwrap();
            every_operation(&redlock, set.as_ref());
        }
        Kind::Permit => {
            let permits = redlock.semaphore(name, 2).unwrap();
            let got = permits.try_acquire();
            assert!(got.is_err(), "{what}: a permit was granted: {got:?}");
            let _ = permits.acquire_until(Instant::now() + SHORT);
            every_operation(&redlock, key.as_bytes());
        }
        Kind::Mark => {
            every_operation(&redlock, name.as_bytes());
            marks_of(&redlock, name);
        }
        Kind::Fair => {
            let got = redlock.try_lock_shared(name);
            assert!(got.is_err(), "{what}: a fair reader was granted: {got:?}");
            let shared = Shared::new(name).unwrap();
            let set = ResourceSet::new([name, "other-member"]).unwrap();
            for resource in [name.as_bytes(), shared.as_ref(), set.as_ref()] {
                every_operation(&redlock, resource);
            }
        }
        Kind::Fence => {
            every_operation(&redlock, name.as_bytes());
            if let Ok(lock) = redlock.try_lock(name) {
                redlock.unlock(lock).unwrap();
            }
            let _ = redlock.repair_fences(FenceFloor::AtLeast(100), Duration::from_secs(1));
        }
    }
    redlock.shutdown(Duration::from_secs(2));
    assert_unchanged(servers, &key, &before, &what);
}

/// Every kind × every foreign key type × every operation: the foreign key is never modified,
/// never deleted, and its TTL never changed.
#[test]
fn no_kind_of_lock_changes_a_key_that_is_not_ours() {
    let servers = Cluster::start(3);
    let mut failed = Vec::new();
    for kind in KINDS {
        for foreign in FOREIGN {
            // Every combination is tried, and every failure named at the end.
            let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                try_kind(&servers, kind, foreign)
            }));
            if let Err(panic) = tried {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("{kind:?} × {foreign:?}: {why}"));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The case as it was found: an application's sorted set with a TTL under the name of a read
/// lock. The reader is refused as if a writer held the name (the set is not a read lock of
/// ours), the set keeps its members and its TTL; and once the application deletes its set,
/// nobody holds the name — the writer granted then is the only holder.
#[test]
fn a_read_lock_is_refused_on_an_applications_sorted_set() {
    let servers = Cluster::start(3);
    for s in servers.iter() {
        Foreign::SortedSetTtl.write(s, "board");
    }
    let redlock = handle(&servers, (false, false));
    let got = redlock.try_lock_shared("board");
    assert!(matches!(got, Err(Error::Held(_))), "{got:?}");
    for s in servers.iter() {
        let members = s.cmd(&["ZRANGE", "board", "0", "-1"]);
        assert_eq!(
            members,
            Value::Array(vec![
                Value::BulkString(b"alice".to_vec()),
                Value::BulkString(b"bob".to_vec())
            ]),
            "{}",
            s.addr()
        );
        assert!(s.pttl("board") <= FOREIGN_TTL_MS, "{}", s.addr());
        s.cmd(&["DEL", "board"]);
    }
    let writer = redlock.try_lock("board").unwrap();
    redlock.unlock(writer).unwrap();
}
