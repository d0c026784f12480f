//! Fencing tokens in action: a tiny store that refuses writes whose fence is lower
//! than the highest it has seen, and a lock holder frozen with SIGSTOP past its lock's validity
//! whose late write is refused, while the next holder's write goes through.
//!
//! ```text
//! cargo run --example fenced_store
//! ```
//!
//! It starts three local `redis-server`s (`$REDIS_SERVER`, or the one on `PATH`; or it uses
//! `$REDLOCK_SERVERS`, comma separated), the
//! store (a TCP server in this process, one line per write: `WRITE <fence> <text>`, answered
//! `OK` or `REFUSED <highest>`), and holder A in a child process. A locks, reports its fence,
//! and is frozen before it writes. B (this process) waits for the lock, which A can no longer
//! extend, gets a greater fence and writes. Then A is thawed and writes: refused. Exits 0 when
//! all of that happened, 1 otherwise.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_mux::{Builder, Redlock};

const RESOURCE: &str = "fenced-store:demo";
const TTL: Duration = Duration::from_secs(1);

fn main() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--holder") {
        let store = args.next().expect("--holder STORE");
        holder(&store);
        return;
    }
    let (urls, mut servers) = servers();
    let store = Store::start();
    println!("store on {}; servers {}", store.addr, urls.join(" "));

    // Holder A, in a process of its own so that it can be frozen whole.
    let mut a = Command::new(std::env::current_exe().expect("own path"))
        .args(["--holder", &store.addr])
        .env("REDLOCK_SERVERS", urls.join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder A");
    let mut a_out = BufReader::new(a.stdout.take().expect("piped"));
    let fence_a: u64 = read_line(&mut a_out)
        .strip_prefix("fence ")
        .and_then(|f| f.parse().ok())
        .expect("A reports its fence");
    signal(&a, libc::SIGSTOP);
    println!("A holds {RESOURCE:?} with fence {fence_a}, and is frozen (SIGSTOP) before it writes");

    // B waits for the lock: A cannot extend it, so it expires.
    let b = handle(&urls);
    let t0 = Instant::now();
    let lock = b
        .lock_until(RESOURCE, Instant::now() + TTL * 10)
        .expect("B gets the lock once A's expires");
    let fence_b = lock.fence().expect("fenced");
    println!(
        "B got the lock after {} ms, with fence {fence_b}",
        t0.elapsed().as_millis()
    );
    let b_answer = Store::write(&store.addr, fence_b, "from B");
    println!("B writes with fence {fence_b}: {b_answer}");

    // A thaws, believing it still holds the lock, and writes.
    a.stdin
        .as_mut()
        .expect("piped")
        .write_all(b"go\n")
        .expect("tell A to write");
    signal(&a, libc::SIGCONT);
    let a_answer = read_line(&mut a_out);
    println!("A thaws and writes with fence {fence_a}: {a_answer}");
    let _ = a.wait();
    b.unlock(lock).expect("B releases");

    let ok = fence_b > fence_a && b_answer == "OK" && a_answer.starts_with("REFUSED");
    println!(
        "{}: the store holds {:?}",
        if ok {
            "fenced: the late write was refused"
        } else {
            "NOT FENCED"
        },
        store.value.lock().expect("store").clone()
    );
    for server in &mut servers {
        let _ = server.kill();
        let _ = server.wait();
    }
    std::process::exit(if ok { 0 } else { 1 });
}

/// Holder A: lock, report the fence, wait for the word, write.
fn holder(store: &str) {
    let urls: Vec<String> = std::env::var("REDLOCK_SERVERS")
        .expect("REDLOCK_SERVERS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let r = handle(&urls);
    let lock = r
        .lock_until(RESOURCE, Instant::now() + TTL * 10)
        .expect("A locks");
    let fence = lock.fence().expect("fenced");
    println!("fence {fence}");
    std::io::stdout().flush().expect("stdout");
    // Frozen here. Then it goes on as if nothing happened: it still believes it holds the lock.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("stdin");
    println!("{}", Store::write(store, fence, "from A"));
}

fn handle(urls: &[String]) -> Redlock {
    Builder::new(urls)
        .ttl(TTL)
        .fencing(true)
        // Fresh servers (or ones this demo does not know): no restart quarantine.
        .quarantine(None)
        .build()
        .expect("a fenced handle")
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut line = String::new();
    r.read_line(&mut line).expect("read a line");
    line.trim_end().to_owned()
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// The protected resource: it keeps the highest fence it has seen and refuses lower ones.
struct Store {
    addr: String,
    value: Arc<Mutex<(u64, String)>>,
}

impl Store {
    fn start() -> Store {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the store");
        let addr = listener.local_addr().expect("address").to_string();
        let value = Arc::new(Mutex::new((0u64, String::new())));
        let shared = value.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut parts = line.trim_end().splitn(3, ' ');
                let answer = match (parts.next(), parts.next().and_then(|f| f.parse().ok())) {
                    (Some("WRITE"), Some(fence)) => {
                        let mut v = shared.lock().expect("store");
                        if fence >= v.0 {
                            *v = (fence, parts.next().unwrap_or("").to_owned());
                            "OK".to_owned()
                        } else {
                            format!("REFUSED (fence {fence} < {})", v.0)
                        }
                    }
                    _ => "ERR".to_owned(),
                };
                let _ = (&conn).write_all(format!("{answer}\n").as_bytes());
            }
        });
        Store { addr, value }
    }

    fn write(addr: &str, fence: u64, text: &str) -> String {
        let mut conn = TcpStream::connect(addr).expect("connect to the store");
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        writeln!(conn, "WRITE {fence} {text}").expect("write");
        read_line(&mut BufReader::new(conn))
    }
}

/// `$REDLOCK_SERVERS`, or three local servers started here (killed before exiting).
fn servers() -> (Vec<String>, Vec<Child>) {
    if let Ok(list) = std::env::var("REDLOCK_SERVERS") {
        return (list.split(',').map(str::to_owned).collect(), Vec::new());
    }
    let mut urls = Vec::new();
    let mut children = Vec::new();
    for _ in 0..3 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                eprintln!(
                    "cannot start redis-server ({e}): install it (apt-get install redis-server) \
                     or set REDLOCK_SERVERS"
                );
                std::process::exit(2)
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        urls.push(format!("redis://127.0.0.1:{port}"));
        children.push(child);
    }
    (urls, children)
}
