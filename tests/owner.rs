//! An owner on every lock (`Config::owner`), against real servers: stored with the lock on
//! each node (`<token> <owner>`), read back by `status`, seen past by every release and extend
//! of every kind that writes a string (plain, fenced, a set's members, a semaphore's permits),
//! also from a handle that only has the token; a foreign client refused exactly as before, and
//! a value that merely starts with our token never taken for ours.

use std::time::Duration;

use redis_local::{Cluster, Server};
use redlock_mux::{Builder, Error, Lock, MAX_OWNER_LEN, Redlock, ResourceSet, Shared, split_value};

const OWNER: &str = "billing-7:4242:nightly import";
const STATUS: Duration = Duration::from_secs(2);

fn builder(servers: &Cluster) -> Builder {
    Builder::new(servers.urls())
        .quarantine(None)
        .node_timeout(Duration::from_millis(300))
        .max_ttl(Duration::from_secs(120))
}

fn owned(servers: &Cluster) -> Redlock {
    builder(servers).owner(OWNER).build().unwrap()
}

fn token_of(lock: &Lock) -> String {
    String::from_utf8(lock.token().as_bytes().to_vec()).unwrap()
}

/// `key`'s value on every server.
fn values(servers: &Cluster, key: &str) -> Vec<Option<String>> {
    servers.iter().map(|s| s.get(key)).collect()
}

/// Waits until every node has answered (a status read waits for all of them): the acquire
/// returned at its quorum, and the last node's `SET` may still be on its way.
fn settle(r: &Redlock, resource: &str) {
    let statuses = r.status(resource, STATUS);
    assert!(statuses.iter().all(|s| s.state.is_ok()), "{statuses:?}");
}

#[test]
fn the_owner_is_stored_with_the_lock_shown_by_status_and_seen_past_by_extend_and_release() {
    let servers = Cluster::start(3);
    let r = owned(&servers);
    let mut lock = r.try_lock("job").unwrap();
    settle(&r, "job");
    let token = token_of(&lock);
    let value = format!("{token} {OWNER}");
    assert_eq!(values(&servers, "job"), vec![Some(value.clone()); 3]);
    assert_eq!(
        split_value(value.as_bytes()),
        (token.as_bytes(), Some(OWNER.as_bytes()))
    );
    for s in r.status("job", STATUS) {
        assert_eq!(s.token(), Some(token.as_bytes()), "{s:?}");
        assert_eq!(s.owner(), Some(OWNER.as_bytes()), "{s:?}");
    }
    // Extend and release compare the token alone: from the handle that took it…
    r.extend(&mut lock, Duration::from_secs(60)).unwrap();
    settle(&r, "job");
    assert!(servers.iter().all(|s| s.pttl("job") > 30_000));
    // …and from another process's handle, which has the token and no owner (or another).
    let other = builder(&servers).build().unwrap();
    let mut rebuilt = Lock::from_parts("job", &token, Duration::from_secs(10)).unwrap();
    other.extend(&mut rebuilt, Duration::from_secs(90)).unwrap();
    settle(&other, "job");
    assert!(servers.iter().all(|s| s.pttl("job") > 60_000));
    assert_eq!(other.unlock(rebuilt).unwrap(), 3);
    assert_eq!(values(&servers, "job"), vec![None; 3]);
    // The lock's own handle now finds nothing to release.
    assert_eq!(r.unlock(lock).unwrap(), 0);
}

#[test]
fn every_kind_that_writes_a_string_records_the_owner_and_releases_it() {
    let servers = Cluster::start(3);
    let r = owned(&servers);
    // A set: every member holds `<token> <owner>`.
    let set = r.try_lock(ResourceSet::new(["a", "b"]).unwrap()).unwrap();
    settle(&r, "a");
    settle(&r, "b");
    let value = format!("{} {OWNER}", token_of(&set));
    for member in ["a", "b"] {
        assert_eq!(values(&servers, member), vec![Some(value.clone()); 3]);
    }
    let mut set = set;
    r.extend(&mut set, Duration::from_secs(60)).unwrap();
    assert_eq!(r.unlock(set).unwrap(), 3);
    assert_eq!(values(&servers, "a"), vec![None; 3]);
    assert_eq!(values(&servers, "b"), vec![None; 3]);

    // A semaphore's permit: a plain lock of `<name>#<i>`.
    let permit = r.semaphore("pool", 2).unwrap().try_acquire().unwrap();
    let key = String::from_utf8(permit.resource().to_vec()).unwrap();
    settle(&r, &key);
    let value = format!("{} {OWNER}", token_of(&permit));
    assert_eq!(values(&servers, &key), vec![Some(value); 3]);
    assert_eq!(r.unlock(permit).unwrap(), 3);
    assert_eq!(values(&servers, &key), vec![None; 3]);

    // Fenced: the acquire script writes the value, the write-back sees past the owner (the
    // fence is only handed out once it is written back on a quorum that still holds the lock).
    let fenced = builder(&servers)
        .owner(OWNER)
        .fencing(true)
        .build()
        .unwrap();
    let lock = fenced.try_lock("fenced").unwrap();
    assert!(lock.fence().is_some());
    settle(&fenced, "fenced");
    let value = format!("{} {OWNER}", token_of(&lock));
    assert_eq!(values(&servers, "fenced"), vec![Some(value); 3]);
    assert_eq!(fenced.unlock(lock).unwrap(), 3);
    assert_eq!(values(&servers, "fenced"), vec![None; 3]);

    // A reader's member is its token alone (readers record no owner), and it works as before.
    let reader = r.try_lock(Shared::new("doc").unwrap()).unwrap();
    settle(&r, "doc");
    let token = token_of(&reader);
    for s in servers.iter() {
        let score = s.cmd(&["ZSCORE", "doc", &token]);
        assert!(
            !matches!(score, redis::Value::Nil),
            "no reader on {}",
            s.addr()
        );
    }
    assert_eq!(r.unlock(reader).unwrap(), 3);

    // The release without notices (`release_notices(false)`) sees past the owner too.
    let quiet = builder(&servers)
        .owner(OWNER)
        .release_notices(false)
        .build()
        .unwrap();
    let lock = quiet.try_lock("quiet").unwrap();
    settle(&quiet, "quiet");
    let value = format!("{} {OWNER}", token_of(&lock));
    assert_eq!(values(&servers, "quiet"), vec![Some(value); 3]);
    assert_eq!(quiet.unlock(lock).unwrap(), 3);
    assert_eq!(values(&servers, "quiet"), vec![None; 3]);
}

/// A value pasted whole as a token (`redis-cli GET`'s answer), or cut at a space of its owner,
/// is refused: taken as a token, it would match as one of its own — and an all-or-none set's
/// value would pass for a plain lock's token, releasing one member alone.
#[test]
fn a_value_with_its_owner_is_not_a_token() {
    let servers = Cluster::start(3);
    let r = owned(&servers);
    let set = r.try_lock(ResourceSet::new(["m1", "m2"]).unwrap()).unwrap();
    settle(&r, "m1");
    let value = servers[0].get("m1").unwrap();
    let cut = &value[..value.rfind(' ').unwrap()];
    for token in [value.as_str(), cut] {
        let e = Lock::from_parts("m1", token, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{token:?}: {e:?}");
    }
    // The value's first word is the token: as such, the single member is refused as before.
    let token = split_value(value.as_bytes()).0;
    assert!(Lock::from_parts("m1", token, Duration::from_secs(10)).is_err());
    assert!(values(&servers, "m1").iter().all(Option::is_some));
    assert_eq!(r.unlock(set).unwrap(), 3);
}

/// What a foreign client sees is unchanged: `SET NX` on our lock fails, and our acquire of its
/// key is refused, the key untouched. A value that starts with our token but goes on with
/// anything but the separator is not ours: a release or extend by the token leaves it.
#[test]
fn a_foreign_client_is_refused_as_before_and_a_near_match_is_not_ours() {
    let servers = Cluster::start(3);
    let r = owned(&servers);
    let lock = r.try_lock("ours").unwrap();
    settle(&r, "ours");
    for s in servers.iter() {
        let v = s.cmd(&["SET", "ours", "foreign", "NX", "PX", "10000"]);
        assert!(matches!(v, redis::Value::Nil), "{v:?} on {}", s.addr());
    }
    for s in servers.iter() {
        s.cmd(&["SET", "theirs", "foreign value", "PX", "60000"]);
    }
    assert!(matches!(r.try_lock("theirs"), Err(Error::Held(_))));
    assert_eq!(
        values(&servers, "theirs"),
        vec![Some("foreign value".into()); 3]
    );
    assert!(servers.iter().all(|s| s.pttl("theirs") > 50_000));

    // `<token>X…` and `<token>-…`: our token, then something else than ` `.
    let token = token_of(&lock);
    r.unlock(lock).unwrap();
    let near = |s: &Server, tail: &str| s.cmd(&["SET", "near", &format!("{token}{tail}")]);
    for (i, s) in servers.iter().enumerate() {
        near(s, if i == 0 { "X someone" } else { "-else" });
    }
    let mut rebuilt = Lock::from_parts("near", &token, Duration::from_secs(10)).unwrap();
    assert!(r.extend(&mut rebuilt, Duration::from_secs(30)).is_err());
    let rebuilt = Lock::from_parts("near", &token, Duration::from_secs(10)).unwrap();
    assert_eq!(r.unlock(rebuilt).unwrap(), 0);
    assert!(values(&servers, "near").iter().all(Option::is_some));
    assert!(servers.iter().all(|s| s.pttl("near") == -1), "TTL set");
}

#[test]
fn an_owner_must_be_short_and_printable() {
    let servers = Cluster::start(1);
    let b = || builder(&servers);
    for bad in [String::new(), "x".repeat(MAX_OWNER_LEN + 1), "a\nb".into()] {
        let e = b().owner(bad.clone()).build().unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{bad:?}: {e:?}");
    }
    let longest = "é".repeat(MAX_OWNER_LEN / 2);
    let r = b().owner(longest.clone()).build().unwrap();
    let lock = r.try_lock("long").unwrap();
    let owner = r.status("long", STATUS)[0].owner().map(<[u8]>::to_vec);
    assert_eq!(owner, Some(longest.into_bytes()));
    r.unlock(lock).unwrap();
}
