//! A simulated Redis node: the semantics the lock relies on, and nothing more.
//!
//! `SET key value NX PX ms` with expiry on the node's own clock, the release, extend and
//! waiting-mark scripts by `EVALSHA` (answered `NOSCRIPT` until the script was sent by `EVAL`)
//! and by `EVAL`, `SCRIPT FLUSH`, `HELLO`, `INFO server` (`run_id`, uptime), and the fencing
//! scripts over the counter hash `redlock:fence` (`run`, `n`; see `fence.rs`) with the
//! repair's `HMGET` and script (`repair.rs`). Replies are RESP3, in order per connection. A
//! *lying* node answers every `SET NX` with `OK` and overwrites the key: the fault that breaks
//! the "no lying nodes" assumption.

use crate::session::{SCRIPT_COUNT, scripts};

use super::rng::Rng;

/// What a restart keeps of the fence counter: nothing (no persistence), all of it (an
/// append-only file), or an older value (a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persist {
    Nothing,
    All,
    Snapshot(u64),
}

/// A read-locked key: (key, readers as (token, expiry ns), the key's expiry ns).
type ReadLocked = (Vec<u8>, Vec<(Vec<u8>, u64)>, u64);

/// A key: (key, value, expiry ns).
type Key = (Vec<u8>, Vec<u8>, u64);

/// A node's state: the keyspace, the scripts it has cached, who it is.
pub(crate) struct Node {
    /// The keys: (key, value, expiry on this node's clock, in ns). A handful (the runs' few
    /// resources and their waiting keys): a list searched in order is cheaper than hashing.
    keys: Vec<(Vec<u8>, Vec<u8>, u64)>,
    /// Read-locked keys (sorted sets): (key, readers as (token, expiry ns), key's expiry ns).
    readers: Vec<ReadLocked>,
    /// The keys and read-locked keys that earlier incarnations held when they crashed, for
    /// the cover check only ([`Node::holds_until`]): the restart quarantine is what makes a
    /// restarted node safe, by not counting it for as long as the keys it lost would have
    /// lived — the keys are counted as living on for that check, not for the node.
    ghosts: (Vec<Key>, Vec<ReadLocked>),
    /// The fence counter: (`run`, `n`), if the hash exists.
    fence: Option<(Vec<u8>, u64)>,
    loaded: [bool; SCRIPT_COUNT],
    pub run_id: [u8; 40],
    /// When this incarnation started, on the node's clock (ns).
    pub started: u64,
    /// Where the node's wall-clock seconds begin on its ns clock (0 to 1 s): Redis counts
    /// `uptime_in_seconds` as whole seconds of the wall clock now less those at the start
    /// (`server.unixtime - server.stat_starttime`), so it reads up to a second high — a node
    /// started at x.95 s says 1 at x + 1.02 s. The same across restarts (one machine's
    /// clock); taken from the first `run_id`, so that no schedule draws another number.
    wall: u64,
    pub lying: bool,
    /// Runs a set's acquire as a `SET NX` of each member on its own, answering as the first
    /// member did: the wrong variant of `Break::SetNotAllOrNone`.
    pub set_first_only: bool,
    /// Runs a reader's acquire without looking for a writer (the key a string, or a writer's
    /// mark): the wrong variant of `Break::ReaderIgnoresWriter`.
    pub reader_ignores_writer: bool,
    /// Admits at most this many readers per key (the per-node counter of the wrong
    /// semaphore, `Break::CounterSemaphore`).
    pub reader_cap: Option<usize>,
    /// Pub/sub: `SUBSCRIBE`, `UNSUBSCRIBE` and the release script's notice (else those
    /// commands are unknown, and the release publishes nothing: clients fall back to polling).
    pub pubsub: bool,
    /// Configured to evict keys under memory pressure (`maxmemory` with `volatile-ttl`, as
    /// its `INFO memory` says): [`Node::evict`] drops the key closest to expiring.
    pub evicting: bool,
    /// The connection whose commands run now (set by the world before `execute`).
    pub conn: u64,
    /// (connection, channel) subscriptions.
    subs: Vec<(u64, Vec<u8>)>,
    /// Messages published, for the world to deliver: (connection, RESP3 push).
    pub outbox: Vec<(u64, Vec<u8>)>,
}

/// A new process's `run_id`: 40 hex digits drawn from the schedule's generator.
pub(super) fn run_id(rng: &mut Rng) -> [u8; 40] {
    let mut id = [0u8; 40];
    for b in id.iter_mut() {
        *b = b"0123456789abcdef"[(rng.next() % 16) as usize];
    }
    id
}

/// Parses one command (an array of bulk strings) off the front of `buf`: the arguments'
/// ranges and the bytes used, or `None` if incomplete. Malformed input is a bug of the
/// client's encoder: it panics, so a simulation shows it at once.
pub(crate) fn parse_command(buf: &[u8], args: &mut Vec<(usize, usize)>) -> Option<usize> {
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

impl Node {
    pub fn new(run_id: [u8; 40], started: u64) -> Node {
        Node {
            keys: Vec::new(),
            readers: Vec::new(),
            ghosts: (Vec::new(), Vec::new()),
            fence: None,
            loaded: [false; SCRIPT_COUNT],
            wall: run_id.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            }) % 1_000_000_000,
            run_id,
            started,
            lying: false,
            set_first_only: false,
            reader_ignores_writer: false,
            reader_cap: None,
            pubsub: false,
            evicting: false,
            conn: 0,
            subs: Vec::new(),
            outbox: Vec::new(),
        }
    }

    /// A connection is gone: its subscriptions with it.
    pub fn forget(&mut self, conn: u64) {
        self.subs.retain(|(c, _)| *c != conn);
    }

    /// Publishes a release notice on `channel`, whose payload is the number of subscribers (as
    /// the release scripts' `PUBSUB NUMSUB` gives it); returns that number.
    fn publish(&mut self, channel: &[u8], releaser: bool) -> u64 {
        let listeners = self
            .subs
            .iter()
            .filter(|(_, ch)| ch.as_slice() == channel)
            .count();
        let payload = listeners.saturating_sub(usize::from(releaser)).to_string();
        let mut n = 0;
        for (conn, ch) in &self.subs {
            if ch.as_slice() == channel {
                let head = b">3\r\n$7\r\nmessage\r\n";
                let mut msg = Vec::with_capacity(head.len() + channel.len() + 32);
                msg.extend_from_slice(head);
                bulk(&mut msg, channel);
                bulk(&mut msg, payload.as_bytes());
                self.outbox.push((*conn, msg));
                n += 1;
            }
        }
        n
    }

    /// Forgets every key (a crash: the lock keys are not persisted; the fence counter as
    /// `persist` says) and starts as a new incarnation.
    pub fn restart(&mut self, run_id: [u8; 40], started: u64, persist: Persist) {
        self.ghosts.0.retain(|e| e.2 > started);
        self.ghosts.1.retain(|e| e.2 > started);
        self.ghosts.0.append(&mut self.keys);
        self.ghosts.1.append(&mut self.readers);
        self.subs.clear();
        self.fence = match (persist, self.fence.take()) {
            (Persist::Nothing, _) | (_, None) => None,
            (Persist::All, kept) => kept,
            (Persist::Snapshot(back), Some((run, n))) => Some((run, n.saturating_sub(back))),
        };
        self.loaded = [false; SCRIPT_COUNT];
        self.run_id = run_id;
        self.started = started;
    }

    /// Until when (ns, this node's clock) `key` holds `token` — as its value, or with
    /// `reader` as one of its readers (until the earlier of the reader's expiry and the
    /// key's) — counting the keys that a crash took ([`Node::ghosts`](Node)); `None` if it
    /// does not. The expiry may have passed: the caller compares.
    pub fn holds_until(&self, key: &[u8], token: &[u8], reader: bool) -> Option<u64> {
        if reader {
            let of = |e: &ReadLocked| {
                let r = e.1.iter().find(|(t, _)| t.as_slice() == token)?;
                Some(r.1.min(e.2))
            };
            (self.readers.iter().chain(&self.ghosts.1))
                .filter(|e| e.0 == key)
                .filter_map(of)
                .max()
        } else {
            (self.keys.iter().chain(&self.ghosts.0))
                .filter(|e| e.0 == key && e.1 == token)
                .map(|e| e.2)
                .max()
        }
    }

    /// True when the fence counter is seeded for this incarnation.
    pub fn fence_seeded(&self) -> bool {
        self.fence
            .as_ref()
            .is_some_and(|(run, _)| run.as_slice() == self.run_id)
    }

    /// `SCRIPT FLUSH`.
    /// Memory pressure on an evicting node (`volatile-ttl`): the live key closest to expiring
    /// goes — a lock, a read lock, a mark — as if it had never been set. Answers whether one
    /// went.
    pub fn evict(&mut self, now: u64) -> bool {
        let key = (self
            .keys
            .iter()
            .filter(|e| now < e.2)
            .map(|e| (e.2, 0, e.0.clone())))
        .chain(
            (self.readers.iter())
                .filter(|e| now < e.2)
                .map(|e| (e.2, 1, e.0.clone())),
        )
        .min();
        match key {
            Some((_, 0, key)) => self.remove(&key),
            Some((_, _, key)) => self.readers.retain(|e| e.0 != key),
            None => return false,
        }
        true
    }

    pub fn flush_scripts(&mut self) {
        self.loaded = [false; SCRIPT_COUNT];
    }

    /// The fence counter's `run` and `n` as the scripts read them (empty strings if absent).
    fn fence_fields(&self) -> (Vec<u8>, Vec<u8>) {
        match &self.fence {
            Some((run, n)) => (run.clone(), n.to_string().into_bytes()),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// `SET key token NX PX ms` (alone, or in the fenced scripts): true if set. A lying node
    /// always sets.
    fn set_nx(&mut self, key: &[u8], token: &[u8], ms: u64, now: u64) -> bool {
        if (self.live(key, now).is_some() || self.read_locked(key, now)) && !self.lying {
            return false;
        }
        self.insert(key, token, now + ms * 1_000_000);
        true
    }

    /// True while readers' sorted set `key` lives.
    fn read_locked(&self, key: &[u8], now: u64) -> bool {
        self.readers.iter().any(|e| e.0 == key && now < e.2)
    }

    fn live(&self, key: &[u8], now: u64) -> Option<&[u8]> {
        match self.keys.iter().find(|e| e.0 == key) {
            Some((_, v, exp)) if now < *exp => Some(v),
            _ => None,
        }
    }

    /// Sets `key` to `value` until `expiry` (ns, node clock), whatever it was.
    fn insert(&mut self, key: &[u8], value: &[u8], expiry: u64) {
        match self.keys.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.1.clear();
                e.1.extend_from_slice(value);
                e.2 = expiry;
            }
            None => self.keys.push((key.to_vec(), value.to_vec(), expiry)),
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(i) = self.keys.iter().position(|e| e.0 == key) {
            self.keys.swap_remove(i);
        }
    }

    /// Runs one command at `now` (node clock, ns) and appends its reply to `out`.
    pub fn execute(&mut self, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        // Upper case without allocating (commands are short).
        let mut upper = [0u8; 16];
        let len = cmd[0].len().min(upper.len());
        upper[..len].copy_from_slice(&cmd[0][..len]);
        upper[..len].make_ascii_uppercase();
        let name = &upper[..len];
        match name {
            b"HELLO" => out.extend_from_slice(b"%1\r\n+server\r\n+redis\r\n"),
            b"INFO"
                if cmd
                    .get(1)
                    .is_some_and(|s| s.eq_ignore_ascii_case(b"memory")) =>
            {
                let text = match self.evicting {
                    true => "# Memory\r\nmaxmemory:4194304\r\nmaxmemory_policy:volatile-ttl\r\n",
                    false => "# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n",
                };
                out.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
            }
            b"INFO" => {
                let second = |t: u64| (t + self.wall) / 1_000_000_000;
                let uptime = second(now).saturating_sub(second(self.started));
                let text = format!(
                    "# Server\r\nrun_id:{}\r\nuptime_in_seconds:{uptime}\r\n",
                    std::str::from_utf8(&self.run_id).expect("hex")
                );
                out.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
            }
            b"SET" => {
                // SET key value NX PX ms: the lock's. Nil in RESP2, the client's default
                // protocol. Anything else is a change of the client's command that this model
                // would hide (a SET without NX overwrites a holder's key on a real server):
                // it panics, so a simulation shows it at once.
                assert!(
                    cmd.len() == 6
                        && cmd[3].eq_ignore_ascii_case(b"NX")
                        && cmd[4].eq_ignore_ascii_case(b"PX"),
                    "the client sent a SET this node does not model: {:?}",
                    cmd.iter()
                        .map(|a| String::from_utf8_lossy(a))
                        .collect::<Vec<_>>()
                );
                let set = self.set_nx(cmd[1], cmd[2], number(cmd[5]), now);
                out.extend_from_slice(if set { b"+OK\r\n" } else { b"$-1\r\n" });
            }
            b"EVALSHA" | b"EVAL" => {
                let index = scripts().iter().position(|s| {
                    if name == b"EVAL" {
                        s.body.as_bytes() == cmd[1]
                    } else {
                        *s.sha() == *cmd[1]
                    }
                });
                let Some(index) = index else {
                    out.extend_from_slice(b"-ERR unknown script\r\n");
                    return;
                };
                if name == b"EVALSHA" && !self.loaded[index] {
                    out.extend_from_slice(b"-NOSCRIPT No matching script. Please use EVAL.\r\n");
                    return;
                }
                self.loaded[index] = true;
                if index == crate::session::REPAIR_SCRIPT {
                    // numkeys 1, the counter hash, V, run: `n = max(n, V)`, seeded for `run`.
                    let (value, run) = (number(cmd[4]), cmd[5]);
                    let n = self.fence.as_ref().map_or(0, |(_, n)| *n).max(value);
                    self.fence = Some((run.to_vec(), n));
                    bulk(out, n.to_string().as_bytes());
                    return;
                }
                if matches!(index, 2..=4) {
                    self.fenced(index, cmd, now, out);
                    return;
                }
                if index >= crate::session::SHARED_ACQUIRE_SCRIPT {
                    self.shared_script(index, cmd, now, out);
                    return;
                }
                if index >= crate::session::SET_ACQUIRE_SCRIPT {
                    self.set_script(index, cmd, now, out);
                    return;
                }
                if index == crate::session::MARK_SCRIPT {
                    // numkeys 1, the waiting key, ms: marked only where no key or a mark is
                    // (a reader's mark gives way to a writer's).
                    let mark = crate::keys::MARK_VALUE.as_bytes();
                    let reader = crate::keys::READER_MARK_VALUE.as_bytes();
                    let free = self
                        .live(cmd[3], now)
                        .is_none_or(|v| v == mark || v == reader);
                    if free {
                        let expiry = now + number(cmd[4]) * 1_000_000;
                        self.insert(cmd[3], mark, expiry);
                    }
                    out.extend_from_slice(if free { b":1\r\n" } else { b":0\r\n" });
                    return;
                }
                // numkeys 1, key, token[, ms — or, releasing, 1 if the releaser is subscribed]
                let (key, token) = (cmd[3], cmd[4]);
                let ours = self.live(key, now) == Some(token);
                let done = match (ours, index) {
                    (false, _) => 0,
                    (true, 0) => {
                        self.remove(key);
                        // The releaser subscribed too (`ARGV[2]`): the notice counts it out.
                        1 + 2 * self.notify(key, now, cmd.get(5) == Some(&&b"1"[..]))
                    }
                    (true, 5) => {
                        self.remove(key);
                        1
                    }
                    (true, _) => {
                        // Extend: never shorter than the TTL left.
                        let ms: u64 = number(cmd[5]);
                        if let Some(entry) = self.keys.iter_mut().find(|e| e.0 == key) {
                            entry.2 = entry.2.max(now + ms * 1_000_000);
                        }
                        1
                    }
                };
                match done {
                    0 => out.extend_from_slice(b":0\r\n"),
                    1 => out.extend_from_slice(b":1\r\n"),
                    n => line(out, b':', n),
                }
            }
            b"SUBSCRIBE" | b"UNSUBSCRIBE" if self.pubsub => {
                let sub = name == b"SUBSCRIBE";
                for &channel in &cmd[1..] {
                    let conn = self.conn;
                    let at = self
                        .subs
                        .iter()
                        .position(|(c, ch)| *c == conn && ch.as_slice() == channel);
                    match (sub, at) {
                        (true, None) => self.subs.push((conn, channel.to_vec())),
                        (false, Some(i)) => {
                            self.subs.swap_remove(i);
                        }
                        _ => {}
                    }
                    let count = self.subs.iter().filter(|(c, _)| *c == conn).count();
                    out.extend_from_slice(b">3\r\n");
                    bulk(out, if sub { b"subscribe" } else { b"unsubscribe" });
                    bulk(out, channel);
                    line(out, b':', count as u64);
                }
            }
            b"HMGET" => {
                // The fence repair's read: `HMGET redlock:fence run n`.
                out.extend_from_slice(b"*2\r\n");
                match &self.fence {
                    Some((run, n)) => {
                        bulk(out, run);
                        bulk(out, n.to_string().as_bytes());
                    }
                    None => out.extend_from_slice(b"$-1\r\n$-1\r\n"),
                }
            }
            b"SCRIPT" => {
                self.flush_scripts();
                out.extend_from_slice(b"+OK\r\n");
            }
            _ => out.extend_from_slice(b"-ERR unknown command\r\n"),
        }
    }
}

impl Node {
    /// After `key`'s release: the waiting mark goes with the lock if it is one, and then the
    /// release's notice is published. How many subscribers it reached.
    fn notify(&mut self, key: &[u8], now: u64, releaser: bool) -> u64 {
        self.notify_keeping(key, now, releaser, false)
    }

    /// [`Node::notify`]; with `writer_mark_stays` (a reader's release) a writer's mark is
    /// left in place, a reader's mark deleted, and the notice published either way.
    fn notify_keeping(
        &mut self,
        key: &[u8],
        now: u64,
        releaser: bool,
        writer_mark_stays: bool,
    ) -> u64 {
        let waiting = crate::keys::waiting_key(key);
        let value = self.live(&waiting, now);
        let reader_mark = crate::keys::READER_MARK_VALUE.as_bytes();
        let writer = value == Some(crate::keys::MARK_VALUE.as_bytes());
        if !writer && value != Some(reader_mark) {
            return 0;
        }
        if !(writer && writer_mark_stays) {
            self.remove(&waiting);
        }
        if !self.pubsub {
            return 0;
        }
        let mut channel = crate::keys::RELEASE_CHANNEL_PREFIX.as_bytes().to_vec();
        channel.extend_from_slice(key);
        self.publish(&channel, releaser)
    }

    /// The scripts of a shared (read) lock and the reader's mark (`session.rs`:
    /// `SHARED_ACQUIRE_BODY` and the others): numkeys 1, the resource (the waiting key for the
    /// mark), then the token and the TTL (or the notices' switch; the mark: its TTL).
    fn shared_script(&mut self, index: usize, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        use crate::session::{READER_MARK_SCRIPT, SHARED_ACQUIRE_SCRIPT, SHARED_RELEASE_SCRIPT};
        let key = cmd[3];
        let reply = match index {
            READER_MARK_SCRIPT => {
                let (mark, reader) = (
                    crate::keys::MARK_VALUE.as_bytes(),
                    crate::keys::READER_MARK_VALUE.as_bytes(),
                );
                // Marked where no key or a reader's mark is; a writer's mark stays (and
                // answers 1); anything else is someone else's key (0).
                let value = self.live(key, now);
                let free = value.is_none_or(|v| v == reader);
                let writer_waits = value == Some(mark);
                if free {
                    self.insert(key, reader, now + number(cmd[4]) * 1_000_000);
                }
                u64::from(free || writer_waits)
            }
            SHARED_ACQUIRE_SCRIPT => {
                let (token, ms) = (cmd[4], number(cmd[5]));
                let writer = self.live(key, now).is_some();
                let mark = self.live(&crate::keys::waiting_key(key), now);
                let writer_waits = mark == Some(crate::keys::MARK_VALUE.as_bytes());
                let full = self.reader_cap.is_some_and(|cap| {
                    (self.readers.iter()).any(|e| {
                        e.0 == key
                            && now < e.2
                            && e.1
                                .iter()
                                .filter(|(t, d)| now < *d && t.as_slice() != token)
                                .count()
                                >= cap
                    })
                });
                if ((writer || writer_waits) && !self.reader_ignores_writer && !self.lying) || full
                {
                    0
                } else {
                    if writer {
                        // The wrong variant (or a lying node): the writer's key is overwritten.
                        self.remove(key);
                    }
                    let until = now + ms * 1_000_000;
                    self.readers.retain(|e| now < e.2 || e.0 != key);
                    match self.readers.iter_mut().find(|e| e.0 == key) {
                        Some(entry) => {
                            entry.1.retain(|(t, _)| t.as_slice() != token);
                            entry.1.push((token.to_vec(), until));
                            entry.2 = entry.2.max(until);
                        }
                        None => {
                            self.readers
                                .push((key.to_vec(), vec![(token.to_vec(), until)], until))
                        }
                    }
                    1
                }
            }
            SHARED_RELEASE_SCRIPT => {
                let token = cmd[4];
                let Some(at) = (self.readers.iter()).position(|e| e.0 == key && now < e.2) else {
                    out.extend_from_slice(b":0\r\n");
                    return;
                };
                let entry = &mut self.readers[at];
                let before = entry.1.len();
                entry.1.retain(|(t, _)| t.as_slice() != token);
                if entry.1.len() == before {
                    out.extend_from_slice(b":0\r\n");
                    return;
                }
                // The key's TTL stays; the expired readers shaped as tokens go if others
                // remain; an empty set goes (with the notice).
                if !entry.1.is_empty() {
                    entry
                        .1
                        .retain(|(t, d)| now < *d || !crate::token::Token::is_shaped(t));
                }
                if !entry.1.is_empty() {
                    1
                } else {
                    self.readers.swap_remove(at);
                    let told = if cmd[5] == b"1" || cmd[5] == b"2" {
                        self.notify_keeping(key, now, cmd[5] == b"2", true)
                    } else {
                        0
                    };
                    1 + 2 * told
                }
            }
            _ => {
                // Extend: a reader whose expiry has not passed, never shorter.
                let (token, ms) = (cmd[4], number(cmd[5]));
                let until = now + ms * 1_000_000;
                let entry = (self.readers.iter_mut()).find(|e| e.0 == key && now < e.2);
                let reader = entry.and_then(|e| {
                    let r =
                        e.1.iter_mut()
                            .find(|(t, d)| t.as_slice() == token && now < *d)?;
                    r.1 = r.1.max(until);
                    e.2 = e.2.max(until);
                    Some(())
                });
                u64::from(reader.is_some())
            }
        };
        line(out, b':', reply);
    }

    /// The scripts of a set (`session.rs`: `SET_ACQUIRE_BODY` and the others): numkeys, the
    /// members (and for the fenced acquire the counter last), then the token and the TTL (or
    /// the notices' switch).
    fn set_script(&mut self, index: usize, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        use crate::session::{SET_ACQUIRE_SCRIPT, SET_FENCED_ACQUIRE_SCRIPT, SET_RELEASE_SCRIPT};
        let n = number(cmd[2]) as usize;
        let (keys, args) = cmd[3..].split_at(n);
        let token = args[0];
        let members = match index {
            SET_FENCED_ACQUIRE_SCRIPT => &keys[..n - 1],
            _ => keys,
        };
        let reply = match index {
            SET_ACQUIRE_SCRIPT | SET_FENCED_ACQUIRE_SCRIPT => {
                let ms = number(args[1]);
                let ok = if self.set_first_only {
                    // The wrong variant (`Break::SetNotAllOrNone`): each member `SET NX` on
                    // its own, the answer the first member's.
                    let mut first = false;
                    for (i, key) in members.iter().enumerate() {
                        let set = self.set_nx(key, token, ms, now);
                        first |= i == 0 && set;
                    }
                    first
                } else if self.lying
                    || members
                        .iter()
                        .all(|k| self.live(k, now).is_none() && !self.read_locked(k, now))
                {
                    for key in members {
                        self.insert(key, token, now + ms * 1_000_000);
                    }
                    true
                } else {
                    false
                };
                if index == SET_FENCED_ACQUIRE_SCRIPT {
                    let (run, n) = self.fence_fields();
                    out.extend_from_slice(if ok { b"*3\r\n:1\r\n" } else { b"*3\r\n:0\r\n" });
                    bulk(out, &run);
                    bulk(out, &n);
                    return;
                }
                u64::from(ok)
            }
            SET_RELEASE_SCRIPT => {
                let (mut ours, mut heard) = (false, 0);
                for key in members {
                    if self.live(key, now) == Some(token) {
                        self.remove(key);
                        ours = true;
                        if args[1] == b"1" || args[1] == b"2" {
                            heard += self.notify(key, now, args[1] == b"2");
                        }
                    }
                }
                if ours { 1 + 2 * heard } else { 0 }
            }
            _ => {
                // Extend: only if every member is ours, each never shorter than its TTL left.
                if !members.iter().all(|k| self.live(k, now) == Some(token)) {
                    out.extend_from_slice(b":0\r\n");
                    return;
                }
                let until = now + number(args[1]) * 1_000_000;
                for entry in (self.keys.iter_mut()).filter(|e| members.contains(&e.0.as_slice())) {
                    entry.2 = entry.2.max(until);
                }
                1
            }
        };
        line(out, b':', reply);
    }

    /// The fencing scripts (`fence.rs`): 2 acquire and read, 3 write back, 4 the flawed
    /// per-node increment. Arguments: numkeys 2, lock key, counter key, then the script's.
    fn fenced(&mut self, index: usize, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let (key, token) = (cmd[3], cmd[5]);
        let array3 = |out: &mut Vec<u8>, ok: bool, run: &[u8], n: &[u8]| {
            out.extend_from_slice(if ok { b"*3\r\n:1\r\n" } else { b"*3\r\n:0\r\n" });
            for field in [run, n] {
                bulk(out, field);
            }
        };
        match index {
            2 => {
                let ok = self.set_nx(key, token, number(cmd[6]), now);
                let (run, n) = self.fence_fields();
                array3(out, ok, &run, &n);
            }
            4 => {
                if !self.set_nx(key, token, number(cmd[6]), now) {
                    array3(out, false, b"", b"");
                    return;
                }
                let entry = self.fence.get_or_insert_with(|| (Vec::new(), 0));
                entry.1 += 1;
                let n = entry.1.to_string();
                array3(out, true, b"", n.as_bytes());
            }
            _ => {
                let (fence, run, seed) = (number(cmd[6]), cmd[7], cmd[8] == b"1");
                let ours = self.live(key, now) == Some(token);
                match &mut self.fence {
                    Some((r, n)) if r.as_slice() == run => {
                        if *n < fence {
                            if !ours {
                                out.extend_from_slice(b":0\r\n");
                                return;
                            }
                            *n = fence;
                        }
                    }
                    _ if !seed => {
                        out.extend_from_slice(b":0\r\n");
                        return;
                    }
                    slot => {
                        let n = slot.as_ref().map_or(0, |(_, n)| *n).max(fence);
                        *slot = Some((run.to_vec(), n));
                    }
                }
                out.extend_from_slice(if ours { b":1\r\n" } else { b":0\r\n" });
            }
        }
    }
}

fn number(arg: &[u8]) -> u64 {
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
fn line(out: &mut Vec<u8>, prefix: u8, n: u64) {
    out.push(prefix);
    decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends a RESP bulk string.
fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    line(out, b'$', b.len() as u64);
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node runs a Rust model of each script, not its Lua: a change of a script's text
    /// that this model does not follow would pass every simulation while a real server ran
    /// the new text. The hashes pin the texts the model was written for: whoever changes a
    /// script changes its model in `execute` (and the node's tests), then the hash here.
    #[test]
    fn the_modelled_scripts_are_the_scripts_the_client_sends() {
        const MODELLED: [&str; SCRIPT_COUNT] = [
            "9689099bfb5e59e9e9a72f05e5bc6e89cb200d7e", // release
            "747a75b97c390e45ff99d4927eb9cb862e261071", // extend
            "e5ca76d4832e04ca0b753d0871386bc52d7b81c6", // fenced acquire
            "4fac54814ecffb260f15621b586184e91d8db5c4", // fence write-back
            "5f72df6b02788b62ee307a3df1dd316d0c1b0f66", // flawed fenced acquire (no write-back)
            "7ec850b84056aad589cab4986543db1f5a578fad", // quiet release
            "70a0015bbf47573617a12515076ab9ad87fec651", // writer's mark
            "7dd71a0e1e865bcb4f0ae4e6147afedc965e5542", // fence repair
            "7af3a285038ba44f1cc6db01d10f8a620e231571", // set acquire
            "ff35feae84f4d825fee14b9459c8218f34d07589", // set fenced acquire
            "4e3645c172d9f67282f27903457a664e39f4f51d", // set release
            "3e4c32260be05a012d03a02383c303b73678f431", // set extend
            "39b563cbb0e19140bd8cd9b5867b73bb901be36e", // shared acquire
            "aa35b117e6bea960b43bb7a7c8537de0dc10074e", // shared release
            "faaceeedc54b084118e33e2a59639f41538f59aa", // shared extend
            "f0613051a95a974bab779140de6c65236917cac7", // reader's mark
        ];
        let sent: Vec<String> = scripts()
            .iter()
            .map(|s| String::from_utf8(s.sha().to_vec()).unwrap())
            .collect();
        assert_eq!(
            sent, MODELLED,
            "a script changed: change its model in Node::execute"
        );
    }

    fn run(node: &mut Node, args: &[&[u8]], now: u64) -> String {
        let mut out = Vec::new();
        node.execute(args, now, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn uptime_counts_whole_seconds_of_the_wall_clock_as_redis_does() {
        const S: u64 = 1_000_000_000;
        let mut n = Node::new([b'a'; 40], 0);
        let uptime = |n: &mut Node, now: u64| {
            let text = run(n, &[b"INFO", b"server"], now);
            let line = text.lines().find(|l| l.starts_with("uptime_in_seconds:"));
            line.expect("an uptime line")[18..].parse::<u64>().unwrap()
        };
        // Started at x.95 s of its wall clock: 1 at x + 1.02 s, 70 ms after the start.
        n.wall = 0;
        n.started = 10 * S + 950_000_000;
        assert_eq!(uptime(&mut n, 10 * S + 990_000_000), 0);
        assert_eq!(uptime(&mut n, 11 * S + 20_000_000), 1);
        assert_eq!(uptime(&mut n, 12 * S + 940_000_000), 2);
        // The wall clock's seconds begin 60 ms later on the node's clock: still 0 there.
        n.wall = S - 60_000_000;
        assert_eq!(uptime(&mut n, 11 * S + 20_000_000), 0);
        assert_eq!(uptime(&mut n, 11 * S + 20_000_000 + 60_000_000), 1);
        // Kept across a restart (one machine's clock), whatever the new run_id.
        n.restart([b'b'; 40], 20 * S, Persist::Nothing);
        assert_eq!(n.wall, S - 60_000_000);
    }

    #[test]
    fn set_nx_px_expires_on_the_node_clock_and_scripts_need_eval_first() {
        let mut n = Node::new([b'a'; 40], 0);
        let set: &[&[u8]] = &[b"SET", b"k", b"t1", b"NX", b"PX", b"10"];
        assert_eq!(run(&mut n, set, 0), "+OK\r\n");
        assert_eq!(
            run(&mut n, &[b"SET", b"k", b"t2", b"NX", b"PX", b"10"], 1),
            "$-1\r\n"
        );
        let sha = scripts()[0].sha();
        let release: &[&[u8]] = &[b"EVALSHA", sha, b"1", b"k", b"t1"];
        assert!(run(&mut n, release, 2).starts_with("-NOSCRIPT"));
        let body = scripts()[0].body.as_bytes();
        assert_eq!(
            run(&mut n, &[b"EVAL", body, b"1", b"k", b"t2"], 3),
            ":0\r\n"
        );
        assert_eq!(run(&mut n, release, 4), ":1\r\n");
        assert_eq!(run(&mut n, set, 5), "+OK\r\n");
        // Expired after 10 ms on the node's clock.
        assert_eq!(
            run(
                &mut n,
                &[b"SET", b"k", b"t2", b"NX", b"PX", b"10"],
                10_000_005
            ),
            "+OK\r\n"
        );
    }

    /// The repair's read and script as `REPAIR_BODY` and Redis answer them: a blank node reads
    /// two nils; the script raises `n` to at least V (never lowers it), seeds it for the run
    /// given, and returns `n`.
    #[test]
    fn the_fence_repair_reads_and_raises_the_counter() {
        let mut n = Node::new([b'a'; 40], 0);
        let read: &[&[u8]] = &[b"HMGET", b"redlock:fence", b"run", b"n"];
        assert_eq!(run(&mut n, read, 0), "*2\r\n$-1\r\n$-1\r\n");
        let body = scripts()[crate::session::REPAIR_SCRIPT].body.as_bytes();
        let repair = |v: &'static [u8]| -> Vec<&'static [u8]> {
            vec![b"EVAL", body, b"1", b"redlock:fence", v, b"r1"]
        };
        assert_eq!(run(&mut n, &repair(b"7"), 1), "$1\r\n7\r\n");
        assert_eq!(run(&mut n, read, 2), "*2\r\n$2\r\nr1\r\n$1\r\n7\r\n");
        // Never lowered.
        assert_eq!(run(&mut n, &repair(b"3"), 3), "$1\r\n7\r\n");
        assert_eq!(run(&mut n, &repair(b"12"), 4), "$2\r\n12\r\n");
    }

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
