//! A simulated Redis node: the semantics the lock relies on, and nothing more.
//!
//! `SET key value NX PX ms` with expiry on the node's own clock, `SCRIPT FLUSH`, `HELLO`,
//! `INFO server` (`run_id`, uptime) and `INFO memory`, `SUBSCRIBE` for the release notices,
//! the fence repair's `HMGET` of the counter hash `redlock:fence` (`run`, `n`; see `proto/fencing.rs`
//! and `engine/repair.rs`), and the scripts by `EVALSHA` (answered `NOSCRIPT` until the script was
//! sent by `EVAL`) and by `EVAL`, whose models are `script_models.rs`. A crash loses the keys and
//! starts a new incarnation with a new `run_id`. Replies are RESP3 (`node_io.rs`), in order per
//! connection. A *lying* node answers every `SET NX` with `OK` and overwrites the key: the
//! fault that breaks the "no lying nodes" assumption.

use crate::proto::scripts::SCRIPT_COUNT;

use super::clock::{MS, SECOND};
use super::node_io::{bulk, line, number};
use super::rng::Rng;

/// Command names are compared upper-cased in a buffer of this many bytes (the client's are
/// shorter).
const NAME_ROOM: usize = 16;

/// Room for a release notice's payload (the count of subscribers, as a bulk string) beyond
/// its header and channel.
const NOTICE_ROOM: usize = 32;

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

/// A fair lock's queue: (resource, entries as (entry, expiry ns), the key's expiry ns).
pub(super) type Queue = (Vec<u8>, Vec<(Vec<u8>, u64)>, u64);

/// A key: (key, value, expiry ns).
type Key = (Vec<u8>, Vec<u8>, u64);

/// A node's state: the keyspace, the scripts it has cached, who it is.
pub(crate) struct Node {
    /// The keys: (key, value, expiry on this node's clock, in ns). A handful (the runs' few
    /// resources and their waiting keys): a list searched in order is cheaper than hashing.
    pub(super) keys: Vec<(Vec<u8>, Vec<u8>, u64)>,
    /// Read-locked keys (sorted sets): (key, readers as (token, expiry ns), key's expiry ns).
    pub(super) readers: Vec<ReadLocked>,
    /// Fair locks' queues (`redlock:queue:<resource>`): (resource, entries as (entry, expiry
    /// ns), the queue key's expiry ns).
    pub(super) queues: Vec<Queue>,
    /// The keys and read-locked keys that earlier incarnations held when they crashed, for
    /// the cover check only ([`Node::holds_until`]): the restart quarantine is what makes a
    /// restarted node safe, by not counting it for as long as the keys it lost would have
    /// lived — the keys are counted as living on for that check, not for the node.
    ghosts: (Vec<Key>, Vec<ReadLocked>),
    /// The fence counter: (`run`, `n`), if the hash exists.
    pub(super) fence: Option<(Vec<u8>, u64)>,
    pub(super) loaded: [bool; SCRIPT_COUNT],
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
    /// The values (tokens first) of the acquires run with a script that steps back for a
    /// set's mark (a plain lock's waiting attempt, a reader's acquire within its precedence),
    /// for the world to place (the precedence clause: `Record::deferences`).
    pub deferring: Vec<Vec<u8>>,
}

/// A new process's `run_id`: 40 hex digits drawn from the schedule's generator.
pub(super) fn run_id(rng: &mut Rng) -> [u8; 40] {
    let mut id = [0u8; 40];
    for b in id.iter_mut() {
        *b = b"0123456789abcdef"[(rng.next() % 16) as usize];
    }
    id
}

impl Node {
    /// A node with no keys, started at `started` (its clock, ns), as process `run_id`.
    pub fn new(run_id: [u8; 40], started: u64) -> Node {
        Node {
            keys: Vec::new(),
            readers: Vec::new(),
            queues: Vec::new(),
            ghosts: (Vec::new(), Vec::new()),
            fence: None,
            loaded: [false; SCRIPT_COUNT],
            wall: run_id.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            }) % SECOND,
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
            deferring: Vec::new(),
        }
    }

    /// A connection is gone: its subscriptions with it.
    pub fn forget(&mut self, conn: u64) {
        self.subs.retain(|(c, _)| *c != conn);
    }

    /// Publishes a release notice on `channel`, whose payload is the number of subscribers (as
    /// the release scripts' `PUBSUB NUMSUB` gives it); returns that number.
    pub(super) fn publish(&mut self, channel: &[u8], releaser: bool) -> u64 {
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
                let mut msg = Vec::with_capacity(head.len() + channel.len() + NOTICE_ROOM);
                msg.extend_from_slice(head);
                bulk(&mut msg, channel);
                bulk(&mut msg, payload.as_bytes());
                self.outbox.push((*conn, msg));
                n += 1;
            }
        }
        n
    }

    /// After `key`'s release: the waiting mark goes with the lock if it is one, and then the
    /// release's notice is published. How many subscribers it reached.
    pub(super) fn notify(&mut self, key: &[u8], now: u64, releaser: bool) -> u64 {
        self.notify_keeping(key, now, releaser, false)
    }

    /// [`Node::notify`]; with `writer_mark_stays` (a reader's release) a writer's mark is
    /// left in place, a reader's mark deleted, and the notice published either way.
    pub(super) fn notify_keeping(
        &mut self,
        key: &[u8],
        now: u64,
        releaser: bool,
        writer_mark_stays: bool,
    ) -> u64 {
        let waiting = crate::model::keys::waiting_key(key);
        let value = self.live(&waiting, now);
        let reader_mark = crate::model::keys::READER_MARK_VALUE.as_bytes();
        let writer = value == Some(crate::model::keys::MARK_VALUE.as_bytes());
        // A set's mark stays: the set deletes it when it takes the member.
        let set = value == Some(crate::model::keys::SET_MARK_VALUE.as_bytes());
        if !writer && !set && value != Some(reader_mark) {
            return 0;
        }
        if !(set || (writer && writer_mark_stays)) {
            self.remove(&waiting);
        }
        if !self.pubsub {
            return 0;
        }
        let mut channel = crate::model::keys::RELEASE_CHANNEL_PREFIX
            .as_bytes()
            .to_vec();
        channel.extend_from_slice(key);
        self.publish(&channel, releaser)
    }

    /// Forgets every key (a crash: the lock keys are not persisted; the fence counter as
    /// `persist` says) and starts as a new incarnation.
    pub fn restart(&mut self, run_id: [u8; 40], started: u64, persist: Persist) {
        self.ghosts.0.retain(|e| e.2 > started);
        self.ghosts.1.retain(|e| e.2 > started);
        self.ghosts.0.append(&mut self.keys);
        self.ghosts.1.append(&mut self.readers);
        self.queues.clear();
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
                .filter(|e| e.0 == key && crate::model::token::holds_token(&e.1, token))
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

    /// `SCRIPT FLUSH`.
    pub fn flush_scripts(&mut self) {
        self.loaded = [false; SCRIPT_COUNT];
    }

    /// The fence counter's `run` and `n` as the scripts read them (empty strings if absent).
    pub(super) fn fence_fields(&self) -> (Vec<u8>, Vec<u8>) {
        match &self.fence {
            Some((run, n)) => (run.clone(), n.to_string().into_bytes()),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// `SET key token NX PX ms` (alone, or in the fenced scripts): true if set. A lying node
    /// always sets.
    pub(super) fn set_nx(&mut self, key: &[u8], token: &[u8], ms: u64, now: u64) -> bool {
        if (self.live(key, now).is_some() || self.read_locked(key, now)) && !self.lying {
            return false;
        }
        self.insert(key, token, now + ms * MS);
        true
    }

    /// True while readers' sorted set `key` lives.
    pub(super) fn read_locked(&self, key: &[u8], now: u64) -> bool {
        self.readers.iter().any(|e| e.0 == key && now < e.2)
    }

    pub(super) fn live(&self, key: &[u8], now: u64) -> Option<&[u8]> {
        match self.keys.iter().find(|e| e.0 == key) {
            Some((_, v, exp)) if now < *exp => Some(v),
            _ => None,
        }
    }

    /// Whether `key` is live and ours: its value is `token`, or `token` then the owner's
    /// separator and an owner (`holds_token!` in `proto/scripts.rs`).
    pub(super) fn holds(&self, key: &[u8], token: &[u8], now: u64) -> bool {
        (self.live(key, now)).is_some_and(|v| crate::model::token::holds_token(v, token))
    }

    /// Sets `key` to `value` until `expiry` (ns, node clock), whatever it was.
    pub(super) fn insert(&mut self, key: &[u8], value: &[u8], expiry: u64) {
        match self.keys.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.1.clear();
                e.1.extend_from_slice(value);
                e.2 = expiry;
            }
            None => self.keys.push((key.to_vec(), value.to_vec(), expiry)),
        }
    }

    pub(super) fn remove(&mut self, key: &[u8]) {
        if let Some(i) = self.keys.iter().position(|e| e.0 == key) {
            self.keys.swap_remove(i);
        }
    }

    /// Runs one command at `now` (node clock, ns) and appends its reply to `out`.
    pub fn execute(&mut self, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        // Upper case without allocating (commands are short).
        let mut upper = [0u8; NAME_ROOM];
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
                self.info_memory(out)
            }
            b"INFO" => self.info_server(now, out),
            b"SET" => self.set(cmd, now, out),
            b"EVALSHA" | b"EVAL" => self.eval(name == b"EVAL", cmd, now, out),
            b"SUBSCRIBE" | b"UNSUBSCRIBE" if self.pubsub => {
                self.subscribe(name == b"SUBSCRIBE", cmd, out)
            }
            b"HMGET" => self.hmget(out),
            b"SCRIPT" => {
                self.flush_scripts();
                out.extend_from_slice(b"+OK\r\n");
            }
            _ => out.extend_from_slice(b"-ERR unknown command\r\n"),
        }
    }

    /// `INFO memory`: an evicting node's limit and policy, or no limit.
    fn info_memory(&self, out: &mut Vec<u8>) {
        let text = match self.evicting {
            true => "# Memory\r\nmaxmemory:4194304\r\nmaxmemory_policy:volatile-ttl\r\n",
            false => "# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n",
        };
        out.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
    }

    /// `INFO server`: the `run_id`, and the uptime counted as Redis counts it (see `wall`).
    fn info_server(&self, now: u64, out: &mut Vec<u8>) {
        let second = |t: u64| (t + self.wall) / SECOND;
        let uptime = second(now).saturating_sub(second(self.started));
        let text = format!(
            "# Server\r\nrun_id:{}\r\nuptime_in_seconds:{uptime}\r\n",
            std::str::from_utf8(&self.run_id).expect("hex")
        );
        out.extend_from_slice(format!("${}\r\n{text}\r\n", text.len()).as_bytes());
    }

    /// `SET key value NX PX ms`, the lock's. Nil in RESP2, the client's default protocol.
    /// Anything else is a change of the client's command that this model would hide (a SET
    /// without NX overwrites a holder's key on a real server): it panics, so a simulation
    /// shows it at once.
    fn set(&mut self, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
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

    /// `SUBSCRIBE` (`sub`) or `UNSUBSCRIBE` of the connection whose commands run now, to the
    /// channels given.
    fn subscribe(&mut self, sub: bool, cmd: &[&[u8]], out: &mut Vec<u8>) {
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

    /// The fence repair's read: `HMGET redlock:fence run n`.
    fn hmget(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"*2\r\n");
        match &self.fence {
            Some((run, n)) => {
                bulk(out, run);
                bulk(out, n.to_string().as_bytes());
            }
            None => out.extend_from_slice(b"$-1\r\n$-1\r\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::scripts::scripts;

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
        let body = scripts()[crate::proto::scripts::REPAIR_SCRIPT]
            .body
            .as_bytes();
        let repair = |v: &'static [u8]| -> Vec<&'static [u8]> {
            vec![b"EVAL", body, b"1", b"redlock:fence", v, b"r1"]
        };
        assert_eq!(run(&mut n, &repair(b"7"), 1), "$1\r\n7\r\n");
        assert_eq!(run(&mut n, read, 2), "*2\r\n$2\r\nr1\r\n$1\r\n7\r\n");
        // Never lowered.
        assert_eq!(run(&mut n, &repair(b"3"), 3), "$1\r\n7\r\n");
        assert_eq!(run(&mut n, &repair(b"12"), 4), "$2\r\n12\r\n");
    }
}
