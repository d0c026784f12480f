//! Commands to a server through redis-rs (feature `admin`): a fresh connection per command,
//! authenticated with the server's admin credentials, with bounded timeouts.

use std::time::{Duration, Instant};

use redis::{Connection, RedisResult, Value};

use crate::Server;

/// Connect, read and write timeout of the admin client.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often [`Server::wait_uptime`] asks: uptime counts seconds, there is no event to wait for.
const UPTIME_POLL: Duration = Duration::from_millis(100);
/// What [`Server::wait_uptime`] allows beyond the uptime it waits for.
const UPTIME_SLACK: Duration = Duration::from_secs(10);

impl Server {
    /// A fresh redis-rs connection, authenticated with the admin credentials.
    ///
    /// # Errors
    ///
    /// Connecting or authenticating failed.
    pub fn try_connection(&self) -> RedisResult<Connection> {
        match &self.admin {
            Some((user, pass)) => self.try_connection_as(user.as_deref(), Some(pass)),
            None => self.try_connection_as(None, None),
        }
    }

    /// [`try_connection`](Self::try_connection), panicking on failure.
    ///
    /// # Panics
    ///
    /// If connecting or authenticating failed.
    pub fn connection(&self) -> Connection {
        self.try_connection()
            .unwrap_or_else(|e| panic!("connect to redis at {}: {e}", self.addr()))
    }

    /// A fresh connection with explicit credentials (`None` = don't `AUTH`).
    ///
    /// # Errors
    ///
    /// Connecting or authenticating failed.
    pub fn try_connection_as(
        &self,
        user: Option<&str>,
        pass: Option<&str>,
    ) -> RedisResult<Connection> {
        use redis::IntoConnectionInfo;
        let mut settings = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = user {
            settings = settings.set_username(user);
        }
        if let Some(pass) = pass {
            settings = settings.set_password(pass);
        }
        let info = redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), self.port())
            .into_connection_info()?
            .set_redis_settings(settings);
        let client = redis::Client::open(info)?;
        let con = client.get_connection_with_timeout(ADMIN_TIMEOUT)?;
        con.set_read_timeout(Some(ADMIN_TIMEOUT))?;
        con.set_write_timeout(Some(ADMIN_TIMEOUT))?;
        Ok(con)
    }

    /// Runs one command on a fresh admin connection.
    ///
    /// # Errors
    ///
    /// Connecting failed, or the server answered with an error.
    pub fn try_cmd(&self, args: &[&str]) -> RedisResult<Value> {
        run(&mut self.try_connection()?, args)
    }

    /// Runs one command on a fresh admin connection.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn cmd(&self, args: &[&str]) -> Value {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis {} {args:?}: {e}", self.addr()))
    }

    /// Runs one command as `user`/`pass` (`AUTH user pass`).
    ///
    /// # Errors
    ///
    /// As [`try_cmd`](Self::try_cmd).
    pub fn try_cmd_as(&self, user: &str, pass: &str, args: &[&str]) -> RedisResult<Value> {
        run(&mut self.try_connection_as(Some(user), Some(pass))?, args)
    }

    /// Runs one command as `user`/`pass`.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn cmd_as(&self, user: &str, pass: &str, args: &[&str]) -> Value {
        self.try_cmd_as(user, pass, args)
            .unwrap_or_else(|e| panic!("redis {} as {user} {args:?}: {e}", self.addr()))
    }

    /// Runs one command WITHOUT authenticating.
    ///
    /// # Errors
    ///
    /// As [`try_cmd`](Self::try_cmd).
    pub fn try_cmd_unauthenticated(&self, args: &[&str]) -> RedisResult<Value> {
        run(&mut self.try_connection_as(None, None)?, args)
    }

    /// `GET key` as a UTF-8 string.
    ///
    /// # Panics
    ///
    /// On any error, or a value that is not UTF-8.
    pub fn get(&self, key: &str) -> Option<String> {
        match self.cmd(&["GET", key]) {
            Value::Nil => None,
            Value::BulkString(b) => {
                Some(String::from_utf8(b).expect("GET returned non-UTF-8 data"))
            }
            other => panic!("unexpected GET reply: {other:?}"),
        }
    }

    /// `SET key value`.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn set(&self, key: &str, value: &str) {
        self.cmd(&["SET", key, value]);
    }

    /// `PTTL key`: -2 if missing, -1 if no expiry, else milliseconds left.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn pttl(&self, key: &str) -> i64 {
        self.int(&["PTTL", key])
    }

    /// Clients subscribed to `channel` (`PUBSUB NUMSUB channel`).
    ///
    /// # Panics
    ///
    /// On any error, or a reply of another shape.
    pub fn subscribers(&self, channel: &str) -> i64 {
        match self.cmd(&["PUBSUB", "NUMSUB", channel]) {
            Value::Array(v) => match v.get(1) {
                Some(&Value::Int(n)) => n,
                other => panic!("PUBSUB NUMSUB {channel} counted {other:?}"),
            },
            other => panic!("PUBSUB NUMSUB {channel} answered {other:?}"),
        }
    }

    /// `DBSIZE`.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn dbsize(&self) -> i64 {
        self.int(&["DBSIZE"])
    }

    /// `INFO <section>`, as text.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn info(&self, section: &str) -> String {
        match self.cmd(&["INFO", section]) {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            other => panic!("INFO {section} answered {other:?}"),
        }
    }

    /// `uptime_in_seconds` from `INFO server`.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn uptime_secs(&self) -> u64 {
        self.info("server")
            .lines()
            .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("uptime_in_seconds in INFO server")
    }

    /// Waits (bounded) until the server reports at least `secs` of uptime: a client's restart
    /// quarantine counts uptime, so fresh servers are quarantined for a while.
    ///
    /// # Panics
    ///
    /// If that takes 10 s longer than it should.
    pub fn wait_uptime(&self, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs) + UPTIME_SLACK;
        while self.uptime_secs() < secs {
            assert!(Instant::now() < deadline, "uptime never reached {secs} s");
            std::thread::sleep(UPTIME_POLL);
        }
    }

    /// `FLUSHALL`.
    ///
    /// # Panics
    ///
    /// On any error.
    pub fn flushall(&self) {
        self.cmd(&["FLUSHALL"]);
    }

    fn int(&self, args: &[&str]) -> i64 {
        match self.cmd(args) {
            Value::Int(n) => n,
            other => panic!("unexpected {} reply: {other:?}", args[0]),
        }
    }
}

fn run(con: &mut Connection, args: &[&str]) -> RedisResult<Value> {
    let (name, rest) = args.split_first().expect("empty command");
    let mut c = redis::cmd(name);
    for a in rest {
        c.arg(*a);
    }
    c.query(con)
}
