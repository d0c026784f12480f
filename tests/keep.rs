//! Keeping a lock alive against real servers: renewal, loss notification, bounds, batching.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Servers;
use redlock_mux::{Builder, Error, Redlock};

fn redlock(servers: &Servers, ttl: Duration) -> Redlock {
    Builder::new(servers.urls())
        .quarantine(None)
        .ttl(ttl)
        // Generous for a loaded machine: renewal starts with a third of the TTL left.
        .node_timeout(ttl / 6)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(5))
        .build()
        .unwrap()
}

/// Waits on the keeper's own channel: commands are handled in order, so once a later release
/// has been answered every earlier one has been carried out.
fn barrier(r: &Redlock, resource: &str) {
    let kept = r.keep(r.try_lock(resource).unwrap()).unwrap();
    kept.release().unwrap();
}

#[test]
fn work_longer_than_five_ttls_keeps_the_lock() {
    let servers = Servers::start(3);
    let ttl = Duration::from_millis(600);
    let r = redlock(&servers, ttl);
    let rival = redlock(&servers, ttl);
    let kept = r.keep(r.lock("job").unwrap()).unwrap();
    let token = kept.lock().token().to_string();
    let t0 = Instant::now();
    let mut refused = 0;
    while t0.elapsed() < ttl * 6 {
        assert!(kept.is_held(), "lost: {:?}", kept.lost());
        match rival.try_lock("job") {
            Err(Error::Held(_)) => refused += 1,
            other => panic!("rival got {other:?}"),
        }
        assert_eq!(servers[0].get("job").as_deref(), Some(token.as_str()));
        rival
            .with_client(|c| c.idle_until(Instant::now() + Duration::from_millis(20)))
            .unwrap();
    }
    assert!(refused > 10);
    assert!(kept.lock().extensions() >= 5, "{:?}", kept.lock());
    assert_eq!(kept.release().unwrap(), 3);
    assert_eq!(servers[1].get("job"), None);
}

#[test]
fn freezing_three_of_five_reports_the_loss_before_the_deadline() {
    let mut servers = Servers::start(5);
    let r = redlock(&servers, Duration::from_millis(1_000));
    let kept = r.keep(r.lock("job").unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    kept.on_lost(move |why| {
        let _ = tx.send((Instant::now(), why.to_string()));
    });
    for s in servers.iter_mut().take(3) {
        s.freeze();
    }
    let deadline = kept.lock().valid_until();
    let why = kept
        .wait_lost(Duration::from_secs(5))
        .expect("loss reported");
    let noticed = Instant::now();
    assert!(
        noticed < deadline,
        "noticed {:?} after the deadline",
        noticed - deadline
    );
    assert!(!kept.is_held());
    assert!(matches!(why, Error::NoQuorum(_)), "{why}");
    let (called_at, message) = rx.recv_timeout(Duration::from_secs(1)).unwrap();
    assert!(called_at < deadline);
    assert!(message.contains("no quorum"), "{message}");
    for s in servers.iter_mut().take(3) {
        s.resume();
    }
}

#[test]
fn the_extension_bound_ends_the_lock() {
    let servers = Servers::start(1);
    let r = Builder::new(servers.urls())
        .quarantine(None)
        .ttl(Duration::from_millis(600))
        .node_timeout(Duration::from_millis(100))
        .max_extensions(2)
        .build()
        .unwrap();
    let kept = r.keep(r.lock("job").unwrap()).unwrap();
    let why = kept
        .wait_lost(Duration::from_secs(5))
        .expect("the bound ends it");
    assert!(matches!(why, Error::ExtensionLimit(2)), "{why}");
    assert_eq!(kept.lock().extensions(), 2);
    assert!(!kept.is_held());
}

#[test]
fn a_hundred_kept_locks_renew_with_one_write_per_node_per_tick() {
    let servers = Servers::start(3);
    let r = redlock(&servers, Duration::from_millis(1_000));
    let kept: Vec<_> = {
        let mut c = r.client().unwrap();
        (0..100)
            .map(|i| r.keep(c.try_lock(format!("job{i}")).unwrap()).unwrap())
            .collect()
    };
    // Wait for two rounds of renewal of all hundred.
    let deadline = Instant::now() + Duration::from_secs(10);
    while kept.iter().any(|k| k.lock().extensions() < 2) {
        assert!(Instant::now() < deadline, "renewal too slow");
        kept[0].wait_lost(Duration::from_millis(50));
    }
    let (ticks, writes, extended) = r.keeper_stats();
    assert!(ticks >= 2);
    assert_eq!(
        writes,
        3 * ticks,
        "{ticks} ticks made {writes} writes to 3 nodes"
    );
    assert!(extended >= 200);
    assert!(
        extended >= 50 * ticks,
        "{extended} extensions over {ticks} ticks: not batched"
    );
    for k in &kept {
        assert!(k.is_held());
    }
}

#[test]
fn dropping_the_handle_releases_on_all_nodes() {
    let servers = Servers::start(5);
    let r = redlock(&servers, Duration::from_secs(10));
    let kept = r.keep(r.lock("job").unwrap()).unwrap();
    assert!(servers.iter().all(|s| s.get("job").is_some()));
    drop(kept);
    barrier(&r, "other");
    assert!(servers.iter().all(|s| s.get("job").is_none()));
}

#[test]
fn with_lock_holds_during_the_work_and_releases_after() {
    let servers = Servers::start(3);
    let r = redlock(&servers, Duration::from_millis(600));
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let out = r
        .with_lock("job", |held| {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(1_500) {
                assert!(held.is_held());
                held.wait_lost(Duration::from_millis(25));
            }
            flag.store(true, Ordering::SeqCst);
            7
        })
        .unwrap();
    assert_eq!(out, 7);
    assert!(ran.load(Ordering::SeqCst));
    assert!(servers.iter().all(|s| s.get("job").is_none()));
}

#[test]
fn a_lock_taken_over_is_reported_lost() {
    let servers = Servers::start(3);
    let r = redlock(&servers, Duration::from_millis(600));
    let kept = r.keep(r.lock("job").unwrap()).unwrap();
    for s in servers.iter() {
        s.set("job", "thief");
    }
    let why = kept
        .wait_lost(Duration::from_secs(5))
        .expect("loss reported");
    assert!(matches!(why, Error::Held(_)), "{why}");
    // Our release must not delete the thief's key.
    barrier(&r, "other");
    assert!(
        servers
            .iter()
            .all(|s| s.get("job").as_deref() == Some("thief"))
    );
}
