//! Tests of the servers themselves, against real redis-server processes.

use std::collections::HashSet;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use redis::Value;
use redis_local::server::START_DEADLINE;
use redis_local::{
    Cluster, Server, find_redis_binary, is_timeout, pid_is_dead, raw_ping, raw_ping_on, read_line,
};

const SHORT: Duration = Duration::from_millis(200);
const LONG: Duration = Duration::from_secs(5);

fn config_get(server: &Server, name: &str) -> String {
    match server.cmd(&["CONFIG", "GET", name]) {
        Value::Array(items) => match items.as_slice() {
            [_, Value::BulkString(v)] => String::from_utf8(v.clone()).unwrap(),
            other => panic!("unexpected CONFIG GET {name}: {other:?}"),
        },
        other => panic!("unexpected CONFIG GET {name}: {other:?}"),
    }
}

#[test]
fn start_and_ping() {
    let server = Server::start();
    assert_eq!(raw_ping(&server.addr(), LONG).unwrap(), "+PONG\r\n");
    assert_eq!(
        server.cmd(&["PING"]),
        Value::SimpleString("PONG".to_owned())
    );
    assert_eq!(server.addr(), format!("127.0.0.1:{}", server.port()));
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert!(server.unix_path().is_none());

    // Configuration the harness promises.
    assert_eq!(config_get(&server, "save"), "");
    assert_eq!(config_get(&server, "appendonly"), "no");
    assert_eq!(config_get(&server, "port"), server.port().to_string());
    assert_eq!(
        std::fs::canonicalize(config_get(&server, "dir")).unwrap(),
        std::fs::canonicalize(server.dir()).unwrap()
    );
    assert!(server.log().contains("Ready to accept connections"));

    // Admin helpers.
    assert_eq!(server.get("k"), None);
    assert_eq!(server.pttl("k"), -2);
    server.cmd(&["SET", "k", "v", "PX", "60000"]);
    assert_eq!(server.get("k").as_deref(), Some("v"));
    let pttl = server.pttl("k");
    assert!((1..=60000).contains(&pttl), "pttl {pttl}");
    server.flushall();
    assert_eq!(server.get("k"), None);
    assert_eq!(server.dbsize(), 0);
}

#[test]
fn two_servers_are_independent() {
    let a = Server::start();
    let b = Server::start();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    assert_ne!(a.dir(), b.dir());
    a.set("only-on-a", "1");
    assert_eq!(a.get("only-on-a").as_deref(), Some("1"));
    assert_eq!(b.get("only-on-a"), None);
}

#[test]
fn freeze_blocks_replies_and_resume_delivers_them() {
    let mut server = Server::start();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    assert_eq!(raw_ping_on(&mut s, LONG).unwrap(), "+PONG\r\n");

    server.freeze();
    assert!(server.is_running(), "a frozen server is still running");
    assert!(server.is_frozen());
    // Negative check with a bounded wait: no reply within 200 ms.
    let err = raw_ping_on(&mut s, SHORT).expect_err("frozen server replied");
    assert!(is_timeout(&err), "expected a read timeout, got {err:?}");
    // A brand-new connection is accepted by the kernel but not answered.
    let err = raw_ping(&server.addr(), SHORT).expect_err("frozen server replied");
    assert!(is_timeout(&err), "expected a read timeout, got {err:?}");

    server.resume();
    assert!(!server.is_frozen());
    s.set_read_timeout(Some(LONG)).unwrap();
    assert_eq!(read_line(&mut s).unwrap(), "+PONG\r\n");
    assert_eq!(raw_ping(&server.addr(), LONG).unwrap(), "+PONG\r\n");
}

#[test]
fn kill_then_restart_on_same_port_loses_data() {
    let mut server = Server::start();
    let port = server.port();
    let old_pid = server.pid();
    server.set("key", "value");
    assert_eq!(server.get("key").as_deref(), Some("value"));

    server.kill();
    assert!(!server.is_running());
    assert!(pid_is_dead(old_pid));
    let err = TcpStream::connect(server.addr()).expect_err("connected to a killed server");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    server.kill(); // idempotent

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert_eq!(raw_ping(&server.addr(), LONG).unwrap(), "+PONG\r\n");
    assert_eq!(server.get("key"), None, "data survived a restart");

    // restart() of a running server kills it first.
    server.set("key2", "x");
    let pid = server.pid();
    server.restart();
    assert!(pid_is_dead(pid));
    assert_eq!(server.port(), port);
    assert_eq!(server.get("key2"), None);
}

#[test]
fn restart_after_freeze() {
    let mut server = Server::start();
    server.freeze();
    server.restart();
    assert!(!server.is_frozen());
    assert_eq!(raw_ping(&server.addr(), LONG).unwrap(), "+PONG\r\n");
}

#[test]
fn requirepass_rejects_unauthenticated_commands() {
    let server = Server::builder().requirepass("s3cret").start();
    let err = server
        .try_cmd_unauthenticated(&["GET", "x"])
        .expect_err("unauthenticated GET succeeded");
    assert_eq!(err.code(), Some("NOAUTH"), "{err}");
    assert!(
        raw_ping(&server.addr(), LONG)
            .unwrap()
            .starts_with("-NOAUTH")
    );
    let err = server
        .try_cmd_as("default", "wrong", &["PING"])
        .expect_err("wrong password accepted");
    assert_eq!(err.kind(), redis::ErrorKind::AuthenticationFailed, "{err}");
    // The admin client authenticates with the requirepass password.
    server.set("x", "1");
    assert_eq!(server.get("x").as_deref(), Some("1"));
}

#[test]
fn acl_user_can_authenticate() {
    let server = Server::builder()
        .acl_user("alice on >secret ~* +@all")
        .acl_user("bob on >pw ~bob:* +get")
        .start();
    assert_eq!(
        server.cmd_as("alice", "secret", &["ACL", "WHOAMI"]),
        Value::BulkString(b"alice".to_vec())
    );
    server.cmd_as("alice", "secret", &["SET", "bob:k", "v"]);
    assert_eq!(
        server.cmd_as("bob", "pw", &["GET", "bob:k"]),
        Value::BulkString(b"v".to_vec())
    );
    let err = server
        .try_cmd_as("bob", "pw", &["SET", "bob:k", "w"])
        .expect_err("bob may not SET");
    assert_eq!(err.code(), Some("NOPERM"), "{err}");
    let err = server
        .try_cmd_as("alice", "nope", &["PING"])
        .expect_err("wrong password accepted");
    assert_eq!(err.kind(), redis::ErrorKind::AuthenticationFailed, "{err}");
}

#[test]
fn admin_credentials_for_acl_only_server() {
    let server = Server::builder()
        .acl_user("default off")
        .acl_user("admin on >adminpw ~* &* +@all")
        .admin_credentials("admin", "adminpw")
        .start();
    server.set("a", "b");
    assert_eq!(server.get("a").as_deref(), Some("b"));
    assert!(server.try_cmd_unauthenticated(&["GET", "a"]).is_err());
}

#[test]
fn unix_socket_accepts_ping() {
    let server = Server::builder().unix_socket(true).start();
    let path = server.unix_path().expect("unix path");
    assert!(path.starts_with(server.dir()));
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(b"PING\r\n").unwrap();
    let mut buf = [0u8; 7];
    std::io::Read::read_exact(&mut s, &mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
    // TCP still works too.
    assert_eq!(raw_ping(&server.addr(), LONG).unwrap(), "+PONG\r\n");
}

#[test]
fn extra_args_are_passed() {
    let server = Server::builder().arg("--maxmemory").arg("12mb").start();
    assert_eq!(
        config_get(&server, "maxmemory"),
        (12 * 1024 * 1024).to_string()
    );
}

#[test]
fn port_clash_is_retried_on_a_new_port() {
    let a = Server::start();
    // First attempt binds a's port: redis exits with "Address already in
    // use" and the harness must move on to another port.
    let b = Server::builder().preferred_port(a.port()).start();
    assert_ne!(b.port(), a.port());
    assert!(
        b.log().contains("Address already in use"),
        "{}",
        b.log_tail()
    );
    assert_eq!(raw_ping(&b.addr(), LONG).unwrap(), "+PONG\r\n");
    b.set("k", "b");
    assert_eq!(a.get("k"), None);
}

#[test]
fn servers_start_gives_distinct_live_servers() {
    let servers = Cluster::start(5);
    assert_eq!(servers.len(), 5);
    let ports: HashSet<u16> = servers.iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 5, "ports not distinct: {:?}", servers.ports());
    let pids: HashSet<u32> = servers.iter().map(|s| s.pid()).collect();
    assert_eq!(pids.len(), 5);
    let urls = servers.urls();
    assert_eq!(urls.len(), 5);
    assert_eq!(urls.iter().collect::<HashSet<_>>().len(), 5);
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(urls[i], s.url());
        assert_eq!(raw_ping(&s.addr(), LONG).unwrap(), "+PONG\r\n");
        s.set("me", &i.to_string());
    }
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s.get("me"), Some(i.to_string()));
    }
    assert_eq!(servers[2].get("me").as_deref(), Some("2"));
}

#[test]
fn servers_support_faults_through_index() {
    let mut servers = Cluster::start(3);
    servers[1].kill();
    assert!(!servers[1].is_running());
    assert!(servers[0].is_running() && servers[2].is_running());
    servers[1].restart();
    assert_eq!(raw_ping(&servers[1].addr(), LONG).unwrap(), "+PONG\r\n");
}

#[test]
fn drop_kills_the_server() {
    let server = Server::start();
    let pid = server.pid();
    drop(server);
    assert!(pid_is_dead(pid));

    let mut frozen = Server::start();
    let pid = frozen.pid();
    frozen.freeze();
    drop(frozen);
    assert!(pid_is_dead(pid), "a frozen server survived drop");
}

#[test]
fn panicking_test_kills_its_server() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let server = Server::start();
        tx.send(server.pid()).unwrap();
        panic!("simulated test failure");
    });
    assert!(result.is_err());
    let pid = rx.recv().unwrap();
    assert!(pid_is_dead(pid));
}

/// Helper for `killed_test_process_does_not_leave_servers_behind`: only does
/// something when run as that test's child process.
#[test]
#[ignore = "helper, run by killed_test_process_does_not_leave_servers_behind"]
fn pdeathsig_helper() {
    if std::env::var_os("HARNESS_PDEATHSIG_HELPER").is_none() {
        return;
    }
    let server = Server::start();
    println!("REDIS_PID={}", server.pid());
    std::io::stdout().flush().unwrap();
    // Wait to be SIGKILLed (bounded, in case the parent is gone).
    std::thread::sleep(Duration::from_secs(30));
    drop(server);
}

#[test]
fn killed_test_process_does_not_leave_servers_behind() {
    use std::io::BufRead;
    // Orphans of our descendants get re-parented to this process (instead of
    // PID 1), so the test can reap the server and see how it died.
    // SAFETY: prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "pdeathsig_helper",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HARNESS_PDEATHSIG_HELPER", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut redis_pid = None;
    for line in stdout.lines() {
        let line = line.unwrap();
        // libtest prints "test pdeathsig_helper ... " on the same line.
        if let Some((_, pid)) = line.trim().split_once("REDIS_PID=") {
            redis_pid = Some(pid.parse::<u32>().unwrap());
            break;
        }
    }
    let Some(redis_pid) = redis_pid else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("helper did not report a redis pid");
    };
    assert!(
        !pid_is_dead(redis_pid),
        "redis died before the test process"
    );
    child.kill().unwrap(); // SIGKILL: no destructors run in the helper
    child.wait().unwrap();
    // We are a subreaper, so the orphaned redis-server is now our child:
    // reap it (bounded wait) and check that SIGKILL is what ended it.
    let deadline = Instant::now() + LONG;
    let mut status = 0;
    loop {
        // SAFETY: waitpid on a specific pid with a valid out-pointer.
        let rc = unsafe { libc::waitpid(redis_pid as libc::pid_t, &mut status, libc::WNOHANG) };
        if rc == redis_pid as libc::pid_t {
            break;
        }
        assert!(rc == 0, "waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() >= deadline {
            // SAFETY: plain kill(2) of the leftover server.
            unsafe { libc::kill(redis_pid as libc::pid_t, libc::SIGKILL) };
            panic!("redis-server {redis_pid} outlived its killed test process");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
        "redis-server ended with status {status:#x}, expected SIGKILL"
    );
}

#[test]
fn missing_binary_message_says_how_to_install() {
    let err = find_redis_binary(None, Some("/nonexistent-dir".into()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("apt-get update && apt-get install -y redis-server"),
        "{err}"
    );
    assert!(err.contains("REDIS_SERVER"), "{err}");
    let err = find_redis_binary(Some("/nonexistent/redis-server".into()), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("apt-get update && apt-get install -y redis-server"),
        "{err}"
    );
    let found = find_redis_binary(None, Some("/nonexistent:/usr/bin:/bin".into()));
    if std::path::Path::new("/usr/bin/redis-server").is_file() {
        assert_eq!(
            found.unwrap(),
            std::path::Path::new("/usr/bin/redis-server")
        );
    }
}

/// `--enable-debug-command yes` starts a server of any version (left out before 7.0, which has
/// no such option and always allows `DEBUG`), and `DEBUG` then runs; the version read from the
/// binary is the one the server reports.
#[test]
fn debug_is_allowed_on_every_version_and_the_version_is_the_servers() {
    let server = Server::builder()
        .arg("--enable-debug-command")
        .arg("yes")
        .start();
    assert_eq!(server.cmd(&["DEBUG", "SLEEP", "0"]), Value::Okay);
    let version = server.version_number().expect("the binary's --version");
    let info = server.info("server");
    let reported = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or_else(|| panic!("no redis_version in INFO server: {info}"));
    assert_eq!(version.to_string(), reported.trim());
}

/// How far a fake clock may be from where it should be right after a change, in seconds:
/// the harness corrects to within 2 ms, plus a few loopback round trips on a loaded machine.
const CLOCK_SLACK: f64 = 0.1;
/// The fast rate tried, and how long it is watched.
const FAST: f64 = 10.0;
const WATCHED: Duration = Duration::from_millis(500);
/// How often the key's expiry is looked for: expiry sends no event.
const EXPIRY_POLL: Duration = Duration::from_millis(10);

/// A fake clock (libfaketime): it starts as the machine's, runs ten times as fast without a
/// jump, expires a key of 10 s within about a second, steps forward past a key's TTL and back,
/// and `INFO` follows it. A binary that hangs under libfaketime (Debian's 7.0.15) is refused at
/// once, with the reason, instead of timing out.
#[test]
fn a_fake_clock_runs_fast_and_steps_or_is_refused_at_once() {
    let t0 = Instant::now();
    let mut server = match Server::builder().fake_clock(true).try_start() {
        Ok(server) => server,
        Err(redis_local::Error::Unsupported(why)) => {
            assert!(why.contains("recursive calls to clock_gettime"), "{why}");
            assert!(
                t0.elapsed() < START_DEADLINE / 2,
                "refused after {:?}",
                t0.elapsed()
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(
        server.clock_skew().abs() < CLOCK_SLACK,
        "{}",
        server.clock_skew()
    );

    server.cmd(&["SET", "k", "v", "PX", "10000"]);
    server.set_clock_rate(FAST);
    let skew = server.clock_skew();
    assert!(
        skew.abs() < CLOCK_SLACK,
        "a jump of {skew} s at the rate change"
    );
    let t0 = Instant::now();
    let deadline = t0 + LONG;
    while server.pttl("k") != -2 {
        assert!(
            Instant::now() < deadline,
            "a 10 s key lived {LONG:?} at ×{FAST}"
        );
        std::thread::sleep(EXPIRY_POLL);
    }
    let lived = t0.elapsed();
    assert!(
        lived > Duration::from_millis(700) && lived < Duration::from_millis(2_000),
        "a 10 s key lived {lived:?} at ×{FAST}"
    );
    let (a, at_a) = server.clock_reading();
    std::thread::sleep(WATCHED);
    let (b, at_b) = server.clock_reading();
    let rate = (b - a) / (at_b - at_a);
    assert!((rate - FAST).abs() < 1.0, "the clock ran at ×{rate}");

    server.set_clock_rate(1.0);
    let skew = server.clock_skew();
    server.cmd(&["SET", "k", "v", "PX", "10000"]);
    server.step_clock(30.0);
    assert_eq!(server.pttl("k"), -2, "a 10 s key after a 30 s step");
    let stepped = server.clock_skew() - skew;
    assert!((stepped - 30.0).abs() < CLOCK_SLACK, "stepped {stepped} s");
    let info: f64 = server
        .info("server")
        .lines()
        .find_map(|l| l.strip_prefix("server_time_usec:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("server_time_usec in INFO server");
    let (now, at) = server.clock_reading();
    assert!(
        (info / 1e6 - now).abs() < 1.0,
        "INFO {info} against TIME {now} at {at}"
    );

    server.cmd(&["SET", "k", "v", "PX", "1000"]);
    server.step_clock(-60.0);
    let pttl = server.pttl("k");
    assert!(pttl > 60_000, "a 1 s key after a 60 s step back: {pttl} ms");
}
