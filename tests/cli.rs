//! The `redlock` binary, run as a process against real redis-servers: `run` (environment,
//! exit-code passthrough, contention, a lost lock, signal forwarding), `acquire` / `extend` /
//! `release`, `status`, usage and authentication errors, `demo` and `bench`.

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{RedisServer, Servers};

const BIN: &str = env!("CARGO_BIN_EXE_redlock");
/// Longest any single redlock invocation may take in these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// `redlock --server URL... --quarantine off` (fresh servers), with no inherited server list.
fn redlock(urls: &[String]) -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("REDLOCK_SERVERS").stdin(Stdio::null());
    for url in urls {
        c.arg("--server").arg(url);
    }
    c.args(["--quarantine", "off"]);
    c
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start redlock")
}

/// Waits (at most `limit`) for the process to exit and collects its output.
fn finish(mut child: Child, limit: Duration) -> Output {
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for redlock") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redlock did not exit within {limit:?}");
        }
        // Waiting for another process to exit.
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

fn output(cmd: &mut Command) -> Output {
    finish(spawn(cmd), LIMIT)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the exit code, showing what redlock said otherwise.
#[track_caller]
fn assert_code(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

/// Asserts that stderr is exactly one `redlock: ...` line containing `needle`.
#[track_caller]
fn assert_one_line_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("redlock: "), "{err:?}");
    assert!(err.contains(needle), "{needle:?} not in {err:?}");
}

/// Waits (at most 10 s) until `path` exists: the child writes it when it has reached a point.
#[track_caller]
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn acquire(urls: &[String], resource: &str, ttl: &str) -> String {
    let o = output(redlock(urls).args(["acquire", "--ttl", ttl, resource]));
    assert_code(&o, 0);
    let token = stdout(&o).trim_end().to_owned();
    assert_eq!(token.len(), 27, "token {token:?}");
    token
}

#[test]
fn run_passes_environment_and_exit_code_and_releases() {
    let servers = Servers::start(3);
    // The servers come from REDLOCK_SERVERS here; the child inherits it and runs `status`
    // (`$0` is the redlock binary) while it holds the lock.
    let script = r#"printf '%s %s %s\n' "$REDLOCK_RESOURCE" "$REDLOCK_TOKEN" "$REDLOCK_VALIDITY_MS"
"$0" status "$REDLOCK_RESOURCE" || exit 99
exit 7"#;
    let o = output(
        Command::new(BIN)
            .env("REDLOCK_SERVERS", servers.urls().join(","))
            .stdin(Stdio::null())
            .args(["--quarantine", "off", "run", "--ttl", "5s", "job", "--"])
            .args(["sh", "-c", script, BIN]),
    );
    assert_code(&o, 7);
    let out = stdout(&o);
    let first: Vec<&str> = out.lines().next().unwrap().split(' ').collect();
    assert_eq!(first[0], "job");
    let token = first[1];
    assert_eq!(token.len(), 27, "{out}");
    let validity: u64 = first[2].parse().unwrap();
    assert!(validity > 4000 && validity <= 5000, "{validity}");
    assert!(
        out.contains(&format!(
            "held by a quorum: 3 of 3 nodes hold token {}",
            &token[..10]
        )),
        "{out}"
    );
    for s in servers.iter() {
        assert_eq!(s.get("job"), None, "released on {}", s.addr());
    }
    let o = output(redlock(&servers.urls()).args(["run", "job", "--", "true"]));
    assert_code(&o, 0);
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}

#[test]
fn contention_gives_75_after_wait() {
    let servers = Servers::start(3);
    let urls = servers.urls();
    let token = acquire(&urls, "job", "20s");
    let t0 = Instant::now();
    let o = output(redlock(&urls).args(["run", "--wait", "400ms", "job", "--", "true"]));
    assert_code(&o, 75);
    // No attempt after the deadline: it gives up when the next retry would come too late.
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_one_line_error(&o, "within 400ms: not acquired: the lock is held elsewhere");
    // One attempt by default: no waiting.
    let o = output(redlock(&urls).args(["acquire", "job"]));
    assert_code(&o, 75);
    assert_one_line_error(&o, "held elsewhere");
    for s in servers.iter() {
        assert_eq!(s.get("job").as_deref(), Some(token.as_str()));
    }
    // --wait outlasts a holder whose lock expires.
    acquire(&urls, "short", "800ms");
    let t0 = Instant::now();
    let o = output(redlock(&urls).args(["run", "--wait", "5s", "short", "--", "true"]));
    assert_code(&o, 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn lost_lock_gives_79_and_command_gets_sigterm_then_sigkill() {
    let mut servers = Servers::start(5);
    let dir = tempfile::tempdir().unwrap();
    // Traps SIGTERM (writes a file) and keeps running, so that redlock must also SIGKILL it.
    let script = r#"trap 'echo term >> "$1/termed"' TERM
touch "$1/started"
while :; do sleep 0.05; done"#;
    let child = spawn(
        redlock(&servers.urls())
            .args(["run", "--ttl", "1s", "--grace", "300ms", "job", "--"])
            .args(["sh", "-c", script, "sh"])
            .arg(dir.path()),
    );
    wait_for_file(&dir.path().join("started"));
    for s in servers.iter_mut().take(3) {
        s.freeze();
    }
    let o = finish(child, Duration::from_secs(15));
    for s in servers.iter_mut().take(3) {
        s.resume();
    }
    assert_code(&o, 79);
    let termed = fs::read_to_string(dir.path().join("termed")).unwrap_or_default();
    assert!(termed.contains("term"), "COMMAND got no SIGTERM");
    let err = stderr(&o);
    assert!(err.contains("lost the lock on \"job\""), "{err}");
    assert!(err.contains("SIGKILL"), "{err}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let servers = Servers::start(3);
    let dir = tempfile::tempdir().unwrap();
    let script = r#"trap 'echo term >> "$1/termed"; exit 42' TERM
touch "$1/started"
while :; do sleep 0.05; done"#;
    let child = spawn(
        redlock(&servers.urls())
            .args(["run", "job", "--", "sh", "-c", script, "sh"])
            .arg(dir.path()),
    );
    wait_for_file(&dir.path().join("started"));
    for s in servers.iter() {
        assert!(s.get("job").is_some(), "not held on {}", s.addr());
    }
    // SAFETY: kill(2) on our own child, which has not been reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let o = finish(child, LIMIT);
    assert_code(&o, 42);
    let termed = fs::read_to_string(dir.path().join("termed")).unwrap_or_default();
    assert_eq!(
        termed.lines().count(),
        1,
        "SIGTERM reached COMMAND once: {termed:?}"
    );
    for s in servers.iter() {
        assert_eq!(s.get("job"), None, "still held on {}", s.addr());
    }
}

#[test]
fn bad_address_duration_or_flag_gives_64() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--server", "redis://127.0.0.1:99999", "status", "job"],
            "invalid address",
        ),
        (
            &["--server", "http://127.0.0.1", "acquire", "job"],
            "invalid address",
        ),
        (
            &[
                "--server",
                "redis://127.0.0.1:1",
                "acquire",
                "--ttl",
                "10x",
                "job",
            ],
            "--ttl",
        ),
        (
            &[
                "--server",
                "redis://127.0.0.1:1",
                "run",
                "--wait",
                "5",
                "j",
                "--",
                "true",
            ],
            "--wait",
        ),
        (
            &["--server", "redis://127.0.0.1:1", "--bogus", "status", "j"],
            "--bogus",
        ),
        (&["status", "job"], "no servers given"),
        (
            &["--server", "redis://127.0.0.1:1", "run", "job"],
            "COMMAND",
        ),
    ];
    for (args, needle) in cases {
        let o = output(
            Command::new(BIN)
                .env_remove("REDLOCK_SERVERS")
                .stdin(Stdio::null())
                .args(*args),
        );
        assert_code(&o, 64);
        assert_one_line_error(&o, needle);
    }
}

#[test]
fn acquire_extend_release_round_trip() {
    let servers = Servers::start(3);
    let urls = servers.urls();
    let o = output(redlock(&urls).args(["acquire", "--ttl", "10s", "job"]));
    assert_code(&o, 0);
    let token = stdout(&o).trim_end().to_owned();
    assert_eq!(
        stdout(&o),
        format!("{token}\n"),
        "stdout is the token alone"
    );
    assert!(stderr(&o).contains("valid for"), "{}", stderr(&o));
    for s in servers.iter() {
        assert_eq!(s.get("job").as_deref(), Some(token.as_str()));
        assert!(s.pttl("job") <= 10_000);
    }
    let o = output(redlock(&urls).args(["extend", "--ttl", "60s", "job", &token]));
    assert_code(&o, 0);
    for s in servers.iter() {
        assert!(s.pttl("job") > 50_000, "not extended on {}", s.addr());
    }
    let o = output(redlock(&urls).args(["release", "job", &token]));
    assert_code(&o, 0);
    assert!(stderr(&o).contains("3 of 3"), "{}", stderr(&o));
    for s in servers.iter() {
        assert_eq!(s.get("job"), None);
    }
    // Not held any more.
    let o = output(redlock(&urls).args(["release", "job", &token]));
    assert_code(&o, 79);
    assert_one_line_error(&o, "not released");
    let o = output(redlock(&urls).args(["extend", "job", &token]));
    assert_code(&o, 79);
    assert_one_line_error(&o, "no longer held");
    // Tokens are base64url: one may start with '-'.
    let o = output(redlock(&urls).args(["release", "job", "-not-a-flag"]));
    assert_code(&o, 79);
}

#[test]
fn status_shows_the_holder_and_unreachable_nodes() {
    let mut servers = Servers::start(3);
    let urls = servers.urls();
    let token = acquire(&urls, "job", "30s");
    let down = servers[2].addr();
    servers[2].kill();
    let o = output(redlock(&urls).args(["status", "job"]));
    assert_code(&o, 0);
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "held by a quorum: 2 of 3 nodes hold token {}",
            &token[..10]
        )),
        "{out}"
    );
    let holders = out
        .lines()
        .filter(|l| l.contains(" held ") && l.contains(&token[..10]) && l.contains(" ms"))
        .count();
    assert_eq!(holders, 2, "{out}");
    let line = out
        .lines()
        .find(|l| l.contains(&down))
        .expect("the dead node");
    assert!(line.contains("no:"), "{line}");
    let o = output(redlock(&urls).args(["status", "other"]));
    assert_code(&o, 0);
    assert!(
        stdout(&o).contains("free: no node holds \"other\""),
        "{}",
        stdout(&o)
    );
    // Without a quorum of reachable nodes: 69.
    servers[1].kill();
    let o = output(redlock(&urls).args(["status", "job"]));
    assert_code(&o, 69);
    assert_one_line_error(&o, "only 1 of 3 nodes reachable");
}

#[test]
fn refused_credentials_give_77() {
    let servers = Servers::start_with(3, RedisServer::builder().requirepass("secret"));
    let with = |pass: &str| -> Vec<String> {
        servers
            .addrs()
            .iter()
            .map(|a| format!("redis://:{pass}@{a}"))
            .collect()
    };
    let o = output(redlock(&with("wrong")).args(["acquire", "job"]));
    assert_code(&o, 77);
    assert_one_line_error(&o, "authentication refused by 127.0.0.1:");
    assert!(
        !stderr(&o).contains("wrong"),
        "password printed: {}",
        stderr(&o)
    );
    let o = output(redlock(&with("secret")).args(["run", "job", "--", "true"]));
    assert_code(&o, 0);
}

#[test]
fn demo_verifies_mutual_exclusion() {
    let o = output(Command::new(BIN).stdin(Stdio::null()).args([
        "demo",
        "--nodes",
        "3",
        "--clients",
        "3",
        "--duration",
        "1s",
    ]));
    assert_code(&o, 0);
    let out = stdout(&o);
    assert_eq!(
        out.matches("overlapping critical sections: 0 (ok)").count(),
        2,
        "{out}"
    );
    assert!(out.contains("frozen with SIGSTOP"), "{out}");
    assert!(out.contains("p99"), "{out}");
    assert!(out.contains("ok: no two clients"), "{out}");
}

#[test]
fn bench_prints_percentiles() {
    let o = output(
        Command::new(BIN)
            .env_remove("REDLOCK_SERVERS")
            .stdin(Stdio::null())
            .args(["bench", "--nodes", "3", "--cycles", "200", "--clients", "2"]),
    );
    assert_code(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("200 cycles in"), "{out}");
    for row in ["acquire", "release", "cycle"] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(row)),
            "{out}"
        );
    }
}

#[test]
fn help_documents_exit_codes_and_environment() {
    let o = output(Command::new(BIN).arg("--help"));
    assert_code(&o, 0);
    let out = stdout(&o);
    for needle in ["REDLOCK_SERVERS", "64", "69", "70", "75", "77", "79"] {
        assert!(out.contains(needle), "{needle} missing from --help");
    }
}
