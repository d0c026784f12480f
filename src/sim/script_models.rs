//! The simulated node's models of the client's Lua scripts, run by `EVAL` or `EVALSHA`: for
//! each script, in Rust, what Redis does running its text (the hashes in the test below pin
//! the texts these models follow). The plain lock's release, quiet release and extend; the
//! waiting marks; the fencing scripts over the counter hash `redlock:fence` (`run`, `n`; see
//! `proto/fencing.rs`) and the repair's (`engine/repair.rs`); a set's all-or-none scripts; a shared (read)
//! lock's. A node with a defect of a break (lying, a set's members taken one by one, readers
//! that ignore writers, a cap on readers) runs the wrong variant here.

use crate::proto::scripts::{
    FAIR_ACQUIRE_SCRIPT, FAIR_LEAVE_SCRIPT, FAIR_SET_ACQUIRE_SCRIPT, FAIR_SET_LEAVE_SCRIPT,
    FAIR_SHARED_ACQUIRE_SCRIPT, MARK_SCRIPT, READER_MARK_SCRIPT, REPAIR_SCRIPT, SET_ACQUIRE_SCRIPT,
    SET_FENCED_ACQUIRE_SCRIPT, SET_MARK_SCRIPT, SET_RELEASE_SCRIPT, SET_STEP_FENCED_SCRIPT,
    SET_STEP_SCRIPT, SHARED_ACQUIRE_PAST_SETS_SCRIPT, SHARED_ACQUIRE_SCRIPT, SHARED_RELEASE_SCRIPT,
    WAITING_ACQUIRE_SCRIPT, WAITING_FENCED_ACQUIRE_SCRIPT, scripts,
};

use super::clock::MS;
use super::node::{Node, Queue};
use super::node_io::{bulk, line, number};

impl Node {
    /// `EVAL` (`by_body`) or `EVALSHA`: the script the client sent, found by its body or its
    /// hash, run by its model — `NOSCRIPT` for a hash not loaded since the last flush.
    pub(super) fn eval(&mut self, by_body: bool, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let index = scripts().iter().position(|s| {
            if by_body {
                s.body.as_bytes() == cmd[1]
            } else {
                *s.sha() == *cmd[1]
            }
        });
        let Some(index) = index else {
            out.extend_from_slice(b"-ERR unknown script\r\n");
            return;
        };
        if !by_body && !self.loaded[index] {
            out.extend_from_slice(b"-NOSCRIPT No matching script. Please use EVAL.\r\n");
            return;
        }
        self.loaded[index] = true;
        match index {
            WAITING_ACQUIRE_SCRIPT | SHARED_ACQUIRE_SCRIPT => self.deferring.push(cmd[4].to_vec()),
            WAITING_FENCED_ACQUIRE_SCRIPT => self.deferring.push(cmd[5].to_vec()),
            _ => {}
        }
        if index == REPAIR_SCRIPT {
            self.repair(cmd, out);
        } else if index == FAIR_ACQUIRE_SCRIPT {
            let won = self.fair_acquire(cmd, now);
            out.extend_from_slice(if won { b":1\r\n" } else { b":0\r\n" });
        } else if index == FAIR_SHARED_ACQUIRE_SCRIPT {
            let won = self.fair_shared_acquire(cmd, now);
            out.extend_from_slice(if won { b":1\r\n" } else { b":0\r\n" });
        } else if index == FAIR_LEAVE_SCRIPT {
            self.fair_leave(cmd[3], (cmd[4], cmd[5]), now);
            out.extend_from_slice(b":1\r\n");
        } else if index == FAIR_SET_ACQUIRE_SCRIPT {
            let won = self.fair_set_acquire(cmd, now);
            out.extend_from_slice(if won { b":1\r\n" } else { b":0\r\n" });
        } else if index == FAIR_SET_LEAVE_SCRIPT {
            let n = number(cmd[2]) as usize;
            let (keys, args) = cmd[3..].split_at(n);
            for key in keys {
                self.fair_leave(key, (args[0], args[1]), now);
            }
            out.extend_from_slice(b":1\r\n");
        } else if matches!(index, 2..=4 | WAITING_FENCED_ACQUIRE_SCRIPT) {
            self.fenced(index, cmd, now, out);
        } else if index == WAITING_ACQUIRE_SCRIPT {
            let set =
                !self.set_waits(cmd[3], now) && self.set_nx(cmd[3], cmd[4], number(cmd[5]), now);
            out.extend_from_slice(if set { b":1\r\n" } else { b":0\r\n" });
        } else if index == SET_MARK_SCRIPT {
            self.set_mark(cmd, now, out);
        } else if matches!(index, SET_STEP_SCRIPT | SET_STEP_FENCED_SCRIPT) {
            self.set_script(index, cmd, now, out);
        } else if index >= SHARED_ACQUIRE_SCRIPT {
            self.shared_script(index, cmd, now, out);
        } else if index >= SET_ACQUIRE_SCRIPT {
            self.set_script(index, cmd, now, out);
        } else if index == MARK_SCRIPT {
            self.writer_mark(cmd, now, out);
        } else {
            self.plain_script(index, cmd, now, out);
        }
    }

    /// A fair lock's acquire (`FAIR_ACQUIRE_BODY`): numkeys 1, the resource, value, ms, the
    /// waiter's entry (empty: `try_lock`, a wait's first attempt), the entry's life in ms. With
    /// no live queue, `SET NX`, joining the queue if refused; with one, expired entries swept,
    /// the entry written, and the lock taken only by the first live entry (or, without an
    /// entry, when none lives), which then leaves.
    fn fair_acquire(&mut self, cmd: &[&[u8]], now: u64) -> bool {
        let (key, value, ms, entry) = (cmd[3], cmd[4], number(cmd[5]), cmd[6]);
        let life = number(cmd[7]) * MS;
        let Some(at) = self.live_queue(key, now) else {
            let won = self.set_nx(key, value, ms, now);
            return won || self.start_queue(key, entry, now, life);
        };
        let q = &mut self.queues[at];
        sweep_and_join(q, entry, now, life);
        let head = q.1.iter().map(|e| e.0.clone()).min();
        if head.as_deref().is_some_and(|h| h != entry) || !self.set_nx(key, value, ms, now) {
            return false;
        }
        // The head is the entry here (or there is none).
        self.drop_entry(at, entry);
        true
    }

    /// The index of `key`'s live queue; none, an expired one is dropped (its key expired).
    fn live_queue(&mut self, key: &[u8], now: u64) -> Option<usize> {
        let at = self.queues.iter().position(|q| q.0 == key && now < q.2);
        if at.is_none() {
            self.queues.retain(|q| q.0 != key);
        }
        at
    }

    /// `entry` leaves queue `at` (`ZREM`), and the queue goes once empty (only the marker left:
    /// `DEL`); true if it went.
    fn drop_entry(&mut self, at: usize, entry: &[u8]) -> bool {
        self.queues[at].1.retain(|e| e.0 != entry);
        let gone = self.queues[at].1.is_empty();
        if gone {
            self.queues.swap_remove(at);
        }
        gone
    }

    /// Where no queue lives and a fair acquire was refused: with an entry, it makes the queue
    /// with its entry (`FAIR_ACQUIRE_BODY`, `FAIR_SHARED_ACQUIRE_BODY`). False: not won.
    fn start_queue(&mut self, key: &[u8], entry: &[u8], now: u64, life: u64) -> bool {
        if !entry.is_empty() {
            let entries = vec![(entry.to_vec(), now + life)];
            self.queues.push((key.to_vec(), entries, now + life));
        }
        false
    }

    /// A fair reader's acquire (`FAIR_SHARED_ACQUIRE_BODY`): numkeys 1, the resource, then as
    /// [`Node::fair_acquire`]'s arguments (the token for the value). With no live queue, the
    /// reader's acquire that steps back for a writer's or set's mark, joining the queue if
    /// refused; with one, expired entries swept, the entry written, and the reader joins the
    /// readers (the marks not looked at) only if no live writer's entry (its separator a space,
    /// not `r`) is older than its own (without an entry: none lives), then its entry leaves.
    fn fair_shared_acquire(&mut self, cmd: &[&[u8]], now: u64) -> bool {
        let (key, entry) = (cmd[3], cmd[6]);
        let life = number(cmd[7]) * MS;
        let Some(at) = self.live_queue(key, now) else {
            let won = self.shared_acquire(key, cmd, now, (false, true)) == 1;
            return won || self.start_queue(key, entry, now, life);
        };
        let q = &mut self.queues[at];
        sweep_and_join(q, entry, now, life);
        let writer_ahead = (q.1.iter())
            .any(|e| e.0.get(15) != Some(&b'r') && (entry.is_empty() || e.0.as_slice() < entry));
        if writer_ahead || self.shared_acquire(key, cmd, now, (false, false)) == 0 {
            return false;
        }
        self.drop_entry(at, entry);
        true
    }

    /// A fair set's acquire (`FAIR_SET_ACQUIRE_BODY`): numkeys n, the members, then as
    /// [`Node::fair_acquire`]'s arguments. On each member: the live queue's expired entries
    /// swept and, with an entry, the entry written (the queue made where none lives); the set
    /// taken, all or none, only if its entry is the first live one of every queue with one (or,
    /// without an entry, none lives), then its entry leaves each queue and an empty queue goes.
    fn fair_set_acquire(&mut self, cmd: &[&[u8]], now: u64) -> bool {
        let n = number(cmd[2]) as usize;
        let (keys, args) = cmd[3..].split_at(n);
        let (value, ms, entry) = (args[0], number(args[1]), args[2]);
        let life = number(args[3]) * MS;
        let mut first = true;
        for key in keys {
            let at = match self.live_queue(key, now) {
                Some(at) => Some(at),
                None => (!entry.is_empty()).then(|| {
                    self.queues.push((key.to_vec(), Vec::new(), now + life));
                    self.queues.len() - 1
                }),
            };
            let Some(at) = at else { continue };
            let q = &mut self.queues[at];
            sweep_and_join(q, entry, now, life);
            if q.1.iter().map(|e| &e.0).min().is_some_and(|h| h != entry) {
                first = false;
            }
        }
        if !first || !self.set_acquire(keys, value, ms, now) {
            return false;
        }
        for key in keys {
            if let Some(at) = self.live_queue(key, now) {
                self.drop_entry(at, entry);
            }
        }
        true
    }

    /// A fair lock's waiter leaves (`FAIR_LEAVE_BODY`; a set's, `FAIR_SET_LEAVE_BODY`, each
    /// member's queue): the resource `key`, the entry, the notice (`0` none; `1` counting the
    /// leaver out; `2` not). If waiters remain and no writer holds the resource (free or
    /// read-locked), the release notice is published.
    fn fair_leave(&mut self, key: &[u8], (entry, notice): (&[u8], &[u8]), now: u64) {
        let Some(at) = self.live_queue(key, now) else {
            return;
        };
        if self.drop_entry(at, entry) {
            return;
        }
        // Free or read-locked: no writer holds it (the readers behind the leaver may join).
        let open = self.live(key, now).is_none();
        if notice != b"0" && open && self.pubsub {
            let mut channel = crate::model::keys::RELEASE_CHANNEL_PREFIX
                .as_bytes()
                .to_vec();
            channel.extend_from_slice(key);
            self.publish(&channel, notice == b"1");
        }
    }

    /// The fence repair: numkeys 1, the counter hash, V, run: `n = max(n, V)`, seeded for
    /// `run`.
    fn repair(&mut self, cmd: &[&[u8]], out: &mut Vec<u8>) {
        let (value, run) = (number(cmd[4]), cmd[5]);
        let n = self.fence.as_ref().map_or(0, |(_, n)| *n).max(value);
        self.fence = Some((run.to_vec(), n));
        bulk(out, n.to_string().as_bytes());
    }

    /// The writer's waiting mark: numkeys 1, the waiting key, ms. Marked only where no key or
    /// a mark is (a reader's mark gives way to a writer's); a set's mark stays (answers 1).
    fn writer_mark(&mut self, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let mark = crate::model::keys::MARK_VALUE.as_bytes();
        let reader = crate::model::keys::READER_MARK_VALUE.as_bytes();
        let value = self.live(cmd[3], now);
        let free = value.is_none_or(|v| v == mark || v == reader);
        let set = value == Some(crate::model::keys::SET_MARK_VALUE.as_bytes());
        if free {
            let expiry = now + number(cmd[4]) * MS;
            self.insert(cmd[3], mark, expiry);
        }
        out.extend_from_slice(if free || set { b":1\r\n" } else { b":0\r\n" });
    }

    /// A waiting set's mark on the member it waits for: numkeys 1, the waiting key, ms.
    /// Marked where no key or any mark of ours is.
    fn set_mark(&mut self, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        use crate::model::keys::{MARK_VALUE, READER_MARK_VALUE, SET_MARK_VALUE};
        let marks = [MARK_VALUE, READER_MARK_VALUE, SET_MARK_VALUE].map(str::as_bytes);
        let free = (self.live(cmd[3], now)).is_none_or(|v| marks.contains(&v));
        if free {
            let expiry = now + number(cmd[4]) * MS;
            self.insert(cmd[3], SET_MARK_VALUE.as_bytes(), expiry);
        }
        out.extend_from_slice(if free { b":1\r\n" } else { b":0\r\n" });
    }

    /// True while a set waits for `key` (its waiting key holds a set's mark).
    pub(super) fn set_waits(&self, key: &[u8], now: u64) -> bool {
        let mark = self.live(&crate::model::keys::waiting_key(key), now);
        mark == Some(crate::model::keys::SET_MARK_VALUE.as_bytes())
    }

    /// The plain lock's scripts: 0 the release (with its notice), 5 the quiet release, 1 the
    /// extend. numkeys 1, key, token[, ms — or, releasing, 1 if the releaser is subscribed].
    fn plain_script(&mut self, index: usize, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let (key, token) = (cmd[3], cmd[4]);
        let ours = self.holds(key, token, now);
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
                    entry.2 = entry.2.max(now + ms * MS);
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

    /// The scripts of a shared (read) lock and the reader's mark (`proto/scripts.rs`:
    /// `SHARED_ACQUIRE_BODY` and the others): numkeys 1, the resource (the waiting key for the
    /// mark), then the token and the TTL (or the notices' switch; the mark: its TTL).
    fn shared_script(&mut self, index: usize, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let key = cmd[3];
        let reply = match index {
            READER_MARK_SCRIPT => self.reader_mark(key, cmd, now),
            SHARED_ACQUIRE_SCRIPT => self.shared_acquire(key, cmd, now, (false, true)),
            SHARED_ACQUIRE_PAST_SETS_SCRIPT => self.shared_acquire(key, cmd, now, (true, true)),
            SHARED_RELEASE_SCRIPT => self.shared_release(key, cmd, now),
            _ => self.shared_extend(key, cmd, now),
        };
        line(out, b':', reply);
    }

    /// The reader's waiting mark on `key`.
    fn reader_mark(&mut self, key: &[u8], cmd: &[&[u8]], now: u64) -> u64 {
        let (mark, reader) = (
            crate::model::keys::MARK_VALUE.as_bytes(),
            crate::model::keys::READER_MARK_VALUE.as_bytes(),
        );
        // Marked where no key or a reader's mark is; a writer's mark stays (and
        // answers 1); anything else is someone else's key (0).
        let value = self.live(key, now);
        let free = value.is_none_or(|v| v == reader);
        let writer_waits =
            value == Some(mark) || value == Some(crate::model::keys::SET_MARK_VALUE.as_bytes());
        if free {
            self.insert(key, reader, now + number(cmd[4]) * MS);
        }
        u64::from(free || writer_waits)
    }

    /// A reader joins `key`'s readers: not while a writer holds it or waits for it, or a set
    /// waits for it — unless `past_sets` (`SHARED_ACQUIRE_PAST_SETS_BODY`) and no reader holds
    /// it (the wrong variant, and a lying node, overwrite the writer) — nor while the readers
    /// are at the node's cap. Without `marks` (a fair reader in a queue,
    /// `FAIR_SHARED_ACQUIRE_BODY`), no mark is looked at.
    fn shared_acquire(
        &mut self,
        key: &[u8],
        cmd: &[&[u8]],
        now: u64,
        (past_sets, marks): (bool, bool),
    ) -> u64 {
        let (token, ms) = (cmd[4], number(cmd[5]));
        let writer = self.live(key, now).is_some();
        let mark = match marks {
            true => self.live(&crate::model::keys::waiting_key(key), now),
            false => None,
        };
        let read = (self.readers.iter()).any(|e| e.0 == key && now < e.2);
        let set_waits = mark == Some(crate::model::keys::SET_MARK_VALUE.as_bytes());
        let writer_waits = mark == Some(crate::model::keys::MARK_VALUE.as_bytes())
            || (set_waits && (!past_sets || read));
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
        if ((writer || writer_waits) && !self.reader_ignores_writer && !self.lying) || full {
            return 0;
        }
        if writer {
            // The wrong variant (or a lying node): the writer's key is overwritten.
            self.remove(key);
        }
        let until = now + ms * MS;
        self.readers.retain(|e| now < e.2 || e.0 != key);
        match self.readers.iter_mut().find(|e| e.0 == key) {
            Some(entry) => {
                entry.1.retain(|(t, _)| t.as_slice() != token);
                entry.1.push((token.to_vec(), until));
                entry.2 = entry.2.max(until);
            }
            None => self
                .readers
                .push((key.to_vec(), vec![(token.to_vec(), until)], until)),
        }
        1
    }

    /// A reader leaves `key`'s readers (the last one's release deletes the set and notifies).
    fn shared_release(&mut self, key: &[u8], cmd: &[&[u8]], now: u64) -> u64 {
        let token = cmd[4];
        let Some(at) = (self.readers.iter()).position(|e| e.0 == key && now < e.2) else {
            return 0;
        };
        let entry = &mut self.readers[at];
        let before = entry.1.len();
        entry.1.retain(|(t, _)| t.as_slice() != token);
        if entry.1.len() == before {
            return 0;
        }
        // The key's TTL stays; the expired readers shaped as tokens go if others
        // remain; an empty set goes (with the notice).
        if !entry.1.is_empty() {
            entry
                .1
                .retain(|(t, d)| now < *d || !crate::model::token::Token::is_shaped(t));
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

    /// Extend: a reader whose expiry has not passed, never shorter.
    fn shared_extend(&mut self, key: &[u8], cmd: &[&[u8]], now: u64) -> u64 {
        let (token, ms) = (cmd[4], number(cmd[5]));
        let until = now + ms * MS;
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

    /// The scripts of a set (`proto/scripts.rs`: `SET_ACQUIRE_BODY` and the others): numkeys, the
    /// members (and for the fenced acquire the counter last), then the token and the TTL (or
    /// the notices' switch).
    fn set_script(&mut self, index: usize, cmd: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let n = number(cmd[2]) as usize;
        let (keys, args) = cmd[3..].split_at(n);
        let token = args[0];
        let members = match index {
            SET_FENCED_ACQUIRE_SCRIPT | SET_STEP_FENCED_SCRIPT => &keys[..n - 1],
            _ => keys,
        };
        let reply = match index {
            SET_ACQUIRE_SCRIPT
            | SET_FENCED_ACQUIRE_SCRIPT
            | SET_STEP_SCRIPT
            | SET_STEP_FENCED_SCRIPT => {
                let ok = match index {
                    SET_STEP_SCRIPT | SET_STEP_FENCED_SCRIPT => {
                        let (family, variant) = (number(args[2]) as usize, number(args[3]));
                        self.set_step(members, token, (number(args[1]), family, variant), now)
                    }
                    _ => self.set_acquire(members, token, number(args[1]), now),
                };
                if matches!(index, SET_FENCED_ACQUIRE_SCRIPT | SET_STEP_FENCED_SCRIPT) {
                    let (run, n) = self.fence_fields();
                    out.extend_from_slice(if ok { b"*3\r\n:1\r\n" } else { b"*3\r\n:0\r\n" });
                    bulk(out, &run);
                    bulk(out, &n);
                    return;
                }
                u64::from(ok)
            }
            SET_RELEASE_SCRIPT => self.set_release(members, token, args[1], now),
            _ => self.set_extend(members, token, args[1], now),
        };
        line(out, b':', reply);
    }

    /// A set's acquire: every member or none, for `ms`.
    fn set_acquire(&mut self, members: &[&[u8]], token: &[u8], ms: u64, now: u64) -> bool {
        if self.set_first_only {
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
                self.insert(key, token, now + ms * MS);
            }
            true
        } else {
            false
        }
    }

    /// A step of a set's ordered acquisition (`SET_STEP_BODY`): if every key is free or ours
    /// (its value starts with the first `family` bytes of `value`, and was set by an attempt
    /// no later than this one, `variant`), all are set to `value` for `ms`; else nothing is
    /// set, and the held ones that are ours (all but the last key) live at least `ms` more.
    fn set_step(
        &mut self,
        keys: &[&[u8]],
        value: &[u8],
        (ms, family, variant): (u64, usize, u64),
        now: u64,
    ) -> bool {
        let fam = &value[..family.min(value.len())];
        let ours = |n: &Node, k: &[u8]| {
            (n.live(k, now))
                .is_some_and(|v| v.starts_with(fam) && !later_variant(v, value, family, variant))
        };
        let free = |n: &Node, k: &[u8]| n.live(k, now).is_none() && !n.read_locked(k, now);
        if self.lying || keys.iter().all(|k| free(self, k) || ours(self, k)) {
            for key in keys {
                self.insert(key, value, now + ms * MS);
            }
            // A set's mark on the member taken goes.
            let last = keys[keys.len() - 1];
            if self.set_waits(last, now) {
                self.remove(&crate::model::keys::waiting_key(last));
            }
            return true;
        }
        let until = now + ms * MS;
        let held: Vec<Vec<u8>> = (keys[..keys.len() - 1].iter())
            .filter(|k| ours(self, k))
            .map(|k| k.to_vec())
            .collect();
        for entry in (self.keys.iter_mut()).filter(|e| held.contains(&e.0)) {
            entry.2 = entry.2.max(until);
        }
        false
    }

    /// A set's release: the members still ours go, each with its notice if `notices` asks —
    /// ours: holding the token, or, for a set token's family (23 bytes, `Token::family`),
    /// a value that starts with it.
    fn set_release(&mut self, members: &[&[u8]], token: &[u8], notices: &[u8], now: u64) -> u64 {
        let (mut ours, mut heard) = (false, 0);
        let family = token.len() == crate::model::token::FAMILY_LEN;
        for key in members {
            let of_family = family && self.live(key, now).is_some_and(|v| v.starts_with(token));
            if self.holds(key, token, now) || of_family {
                self.remove(key);
                ours = true;
                if notices == b"1" || notices == b"2" {
                    heard += self.notify(key, now, notices == b"2");
                }
            }
        }
        if ours { 1 + 2 * heard } else { 0 }
    }

    /// A set's extend: only if every member is ours, each never shorter than its TTL left.
    fn set_extend(&mut self, members: &[&[u8]], token: &[u8], ms: &[u8], now: u64) -> u64 {
        if !members.iter().all(|k| self.holds(k, token, now)) {
            return 0;
        }
        let until = now + number(ms) * MS;
        for entry in (self.keys.iter_mut()).filter(|e| members.contains(&e.0.as_slice())) {
            entry.2 = entry.2.max(until);
        }
        1
    }
    /// The fencing scripts (`proto/fencing.rs`): 2 acquire and read, 3 write back, 4 the flawed
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
            2 | WAITING_FENCED_ACQUIRE_SCRIPT => {
                let waits = index == WAITING_FENCED_ACQUIRE_SCRIPT && self.set_waits(key, now);
                let ok = !waits && self.set_nx(key, token, number(cmd[6]), now);
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
                let ours = self.holds(key, token, now);
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

/// A live fair queue's expired entries swept, then `entry` (unless empty: it joins nothing)
/// written with its expiry, or refreshed, and the queue kept at least as long
/// (`FAIR_ACQUIRE_BODY`, `FAIR_SET_ACQUIRE_BODY`: `ZREMRANGEBYSCORE`, `ZADD`, `PEXPIRE` if
/// shorter).
fn sweep_and_join(q: &mut Queue, entry: &[u8], now: u64, life: u64) {
    q.1.retain(|e| now < e.1);
    if !entry.is_empty() {
        match q.1.iter_mut().find(|e| e.0 == entry) {
            Some(e) => e.1 = now + life,
            None => q.1.push((entry.to_vec(), now + life)),
        }
        q.2 = q.2.max(now + life);
    }
}

/// Whether the lock value `v` of a set's acquisition holds a later variant of its token than
/// `value`, whose variant is `cur` (`SET_STEP_BODY`'s `later`): the last four bytes of the
/// token (after `family`) are the base token's, each shifted by a base-64 digit of the
/// variant. Bytes outside the alphabet: later (not ours).
fn later_variant(v: &[u8], value: &[u8], family: usize, cur: u64) -> bool {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let index = |b: Option<&u8>| b.and_then(|b| ALPHABET.iter().position(|a| a == b));
    let mut n = 0u64;
    for k in 0..4u32 {
        let at = family + 3 - k as usize;
        let (Some(a), Some(c)) = (index(v.get(at)), index(value.get(at))) else {
            return true;
        };
        let digit = (cur / 64u64.pow(k)) % 64;
        n += ((digit + a as u64 + 64 - c as u64) % 64) * 64u64.pow(k);
    }
    n > cur
}

#[cfg(test)]
mod tests {
    use crate::proto::scripts::SCRIPT_COUNT;

    use super::*;

    #[test]
    fn a_later_variant_of_a_sets_token_is_told_from_an_earlier_one() {
        let base = crate::model::token::Token::for_resource(b"redlock:set:1:a1:b").unwrap();
        let family = crate::model::token::FAMILY_LEN;
        for cur in [0u32, 1, 5, 63, 64, 65, 4095, 4096, 100_000] {
            let value = base.variant(cur);
            for other in [0u32, 1, 2, 63, 64, 65, 4096, 100_001] {
                let v = base.variant(other);
                assert_eq!(
                    later_variant(v.as_bytes(), value.as_bytes(), family, u64::from(cur)),
                    other > cur,
                    "variant {other} against {cur}"
                );
            }
        }
    }

    /// The node runs a Rust model of each script, not its Lua: a change of a script's text
    /// that this model does not follow would pass every simulation while a real server ran
    /// the new text. The hashes pin the texts the model was written for: whoever changes a
    /// script changes its model in this file (and the node's tests), then the hash here.
    #[test]
    fn the_modelled_scripts_are_the_scripts_the_client_sends() {
        const MODELLED: [&str; SCRIPT_COUNT] = [
            "c87667fc9ac8c2c40d14eca925e70cdcab09e7b0", // release
            "ed25f922bb9a4b31be5255d7e1c093156f098814", // extend
            "e5ca76d4832e04ca0b753d0871386bc52d7b81c6", // fenced acquire
            "a1ec1544386096f97ead7c3d925f5efae04fff5b", // fence write-back
            "5f72df6b02788b62ee307a3df1dd316d0c1b0f66", // flawed fenced acquire (no write-back)
            "cd844e93f8fd97a49d3c9f41b9c1b8267bfdd66e", // quiet release
            "972c8f0780c5be1cef67460f4865ea4fa4a0dd87", // writer's mark
            "7dd71a0e1e865bcb4f0ae4e6147afedc965e5542", // fence repair
            "7af3a285038ba44f1cc6db01d10f8a620e231571", // set acquire
            "ff35feae84f4d825fee14b9459c8218f34d07589", // set fenced acquire
            "6114439b0373adf032ec0ef7b756f5d6a44f42b8", // set release
            "e4bbf099dcd3a18e2a539296c15dd5994d29fede", // set extend
            "fdcbfce178ec3f0997a20c942639e27311424ce2", // shared acquire
            "dc321595438f69b503f9de432c36389cd7387dee", // shared release
            "faaceeedc54b084118e33e2a59639f41538f59aa", // shared extend
            "4cafb3029689aec4a11404dd979cfb9cf3fe5774", // reader's mark
            "f2ef59a36dfe20bb28a812f233606aada8443e9f", // set step
            "36a36c329ec9aca75fd882e2a39f46f83ea3d0ff", // set fenced step
            "dbaf8a77e1019f84c7241b04bbf2583f9ffab14b", // set's mark
            "29cca77116f14e5ef942406fcb300737387c418f", // waiting acquire
            "db0186e5b3354b3f43c71281180e75b552b4a858", // fenced waiting acquire
            "d7885a1893c11385aa562ed917252c3b01853808", // shared acquire past sets
            "e33cf12317a60542f77e1b90c2c3e2c3e6641cdf", // fair acquire
            "4131135c2b0a18a00f9fc0a730fb0e4fa43f016c", // fair leave
            "1d57d5e8dfbe82a60591f25a3af0a012dc3291f5", // fair set acquire
            "cf3fd187a61f19a708772279d8ed09a81a015e9f", // fair set leave
            "7b1eb7dc7148c1f36c053083c30a5241d31e59db", // fair shared acquire
        ];
        let sent: Vec<String> = scripts()
            .iter()
            .map(|s| String::from_utf8(s.sha().to_vec()).unwrap())
            .collect();
        assert_eq!(
            sent, MODELLED,
            "a script changed: change its model in sim/script_models.rs"
        );
    }
}
