//! What the model tests (`tests/model_locks.rs`, `tests/model_election.rs`) share to read a real
//! server: its clock, every key of an object at one instant (type, content, `PEXPIRETIME`), keys
//! dumped for a snapshot, the fixed client ids, and the case budget.
//!
//! `PEXPIRETIME` needs Redis 7.0 (or Valkey): the model tests do not run on Redis 6.2.

use fred::clients::Client as Fred;
use fred::interfaces::ClientLike;
use fred::types::scripts::Script as FredScript;
use fred::types::{ClusterHash, CustomCommand, Value};
use std::collections::BTreeMap;

use lockkit_model::lock::{HashLock, Now};

/// An expiry that is not compared (the auxiliary keys': their contents are).
pub const ANY: i64 = -3;

/// Cases per model test unless `LOCKKIT_MODEL_CASES` says otherwise.
pub const DEFAULT_CASES: u32 = 100;

/// The number of cases: `LOCKKIT_MODEL_CASES`, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("LOCKKIT_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// The server's clock.
pub async fn time(redis: &Fred) -> Now {
    let reply: Vec<u64> = redis
        .custom(
            CustomCommand::new_static("TIME", ClusterHash::Random, false),
            Vec::<String>::new(),
        )
        .await
        .expect("TIME");
    Now::from_us(reply[0] * 1_000_000 + reply[1])
}

/// Reads every key of the object at one instant: per key its type, content and `PEXPIRETIME`;
/// then the server's `TIME`.
pub const READ_STATE: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local ty = redis.call('TYPE', key)['ok']
  local content = {}
  if ty == 'hash' then content = redis.call('HGETALL', key)
  elseif ty == 'zset' then content = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  elseif ty == 'list' then content = redis.call('LRANGE', key, 0, -1)
  elseif ty == 'string' then content = {redis.call('GET', key)}
  end
  out[i] = {ty, content, redis.call('PEXPIRETIME', key)}
end
local t = redis.call('TIME')
out[#KEYS + 1] = {t[1], t[2]}
return out
";

/// `DUMP` and `PEXPIRETIME` of every key, at one instant.
pub const DUMP_KEYS: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = {redis.call('DUMP', key), redis.call('PEXPIRETIME', key)}
end
return out
";

/// One key's `DUMP` (`None`: it did not exist) and `PEXPIRETIME`.
pub type Dump = (String, Option<Vec<u8>>, i64);

/// One key as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawKey {
    /// `TYPE` (`none` when absent).
    pub ty: String,
    /// The content, flattened (hash fields and values, zset members and scores, ...).
    pub items: Vec<String>,
    /// `PEXPIRETIME` (-1: no expiry, -2: absent).
    pub expire_at: i64,
}

/// Every key of an object (`keys`, as the scripts take them) at one instant, and the server's
/// clock then (ms).
pub async fn read_state(redis: &Fred, keys: &[String]) -> (Vec<RawKey>, u64) {
    let reply: Value = FredScript::from_lua(READ_STATE)
        .evalsha_with_reload(redis, keys.to_vec(), Vec::<String>::new())
        .await
        .expect("reading the keys");
    let mut entries = reply.into_array();
    let time = entries.pop().expect("TIME").into_array();
    let part = |i: usize| {
        time[i]
            .as_string()
            .and_then(|s| s.parse::<u64>().ok())
            .expect("TIME")
    };
    let now = part(0) * 1000 + part(1) / 1000;
    let keys = entries
        .into_iter()
        .map(|entry| {
            let mut entry = entry.into_array().into_iter();
            let ty = entry.next().and_then(|v| v.as_string()).expect("TYPE");
            let items = entry
                .next()
                .expect("content")
                .into_array()
                .iter()
                .map(|v| v.as_string().unwrap_or_default())
                .collect();
            let expire_at = entry.next().and_then(|v| v.as_i64()).expect("PEXPIRETIME");
            RawKey {
                ty,
                items,
                expire_at,
            }
        })
        .collect();
    (keys, now)
}

/// A time in ms as Redis reports expiries.
pub fn as_i64(v: u64) -> i64 {
    i64::try_from(v).expect("a time in range")
}

/// A key as read back.
pub fn key(ty: &str, items: Vec<String>, expire_at: i64) -> RawKey {
    RawKey {
        ty: ty.to_owned(),
        items,
        expire_at,
    }
}

/// An absent key.
pub fn absent() -> RawKey {
    key("none", Vec::new(), -2)
}

/// The client ids of the sequence's owners (owner `i` belongs to client `i % 2`).
pub const CLIENTS: [&str; 2] = [
    "6f1c2a9e-0d4b-4e0a-9b1e-3c5d7f9a1b2c",
    "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d",
];

/// One key of a hash lock (a lock's, fenced lock's, fair lock's or election's `role` key) as the
/// model has it, in the form the tests normalise Redis' keys to (`view` is already expired to the
/// instant).
pub fn hash_lock_key(view: &HashLock, role: &str) -> RawKey {
    match role {
        "main" if view.foreign => key("string", vec!["foreign".to_owned()], -1),
        "main" if view.holds.is_empty() => absent(),
        "main" => {
            let mut fields = BTreeMap::new();
            for (marker, hold) in &view.holds {
                fields.insert(marker.clone(), format!("{} {}", hold.expiry, hold.owner));
                *fields
                    .entry(hold.owner.clone())
                    .or_insert_with(|| "0".to_owned()) = view.count(&hold.owner).to_string();
                if let Some(token) = hold.token {
                    fields.insert(format!("{marker}:token"), token.to_string());
                }
            }
            let mut items: Vec<String> = fields
                .into_iter()
                .map(|(f, v)| format!("{f}={v}"))
                .collect();
            items.sort();
            key("hash", items, view.key_expiry().map_or(-1, as_i64))
        }
        "token" => match view.counter {
            Some(counter) => key(
                "string",
                vec![counter.to_string()],
                view.counter_expiry.map_or(-1, as_i64),
            ),
            None => absent(),
        },
        "handoff" => match &view.handoff {
            Some((owner, _)) => key("string", vec![owner.clone()], ANY),
            None => absent(),
        },
        "waiting" if view.waiting.items.is_empty() => absent(),
        "waiting" => key("zset", view.waiting_order(), ANY),
        "timeouts" if view.timeouts.items.is_empty() => absent(),
        "timeouts" => {
            let mut items: Vec<String> = view
                .timeouts
                .items
                .iter()
                .map(|(w, d)| format!("{w}={d}"))
                .collect();
            items.sort();
            key("zset", items, ANY)
        }
        "queue" if view.queue.items.is_empty() => absent(),
        "queue" => key("list", view.queue.items.clone(), ANY),
        other => panic!("no such key role: {other}"),
    }
}

/// The number of cases of a model test whose default is `default`: scaled by
/// `LOCKKIT_MODEL_CASES` / [`DEFAULT_CASES`] (at least 1), so one variable raises every model
/// test's budget, the expensive ones (real waits, restarts, client-level programs) in proportion.
pub fn cases_scaled(default: u32) -> u32 {
    let scaled = u64::from(default) * u64::from(cases()) / u64::from(DEFAULT_CASES);
    u32::try_from(scaled).unwrap_or(u32::MAX).max(1)
}

/// A hold's value in a lock's main hash, `<expiry> <owner>` (normalized keys: `marker=<value>`):
/// its expiry.
fn hold_expiry(value: &str) -> Option<i64> {
    value.split_once(' ').and_then(|(n, _)| n.parse().ok())
}

/// Whether nothing in an object's normalized keys `before` (roles as the model tests name them:
/// `main`, `timeouts`, ...) ended by `at` (server ms, with 2 ms for Redis' clocks): no key's
/// expiry, no hold's lease, no waiter's deadline. A request delivered again at `at` may rightly
/// differ from its first delivery when something lapsed in between.
pub fn lapsed_nothing(roles: &[&str], before: &[RawKey], at: u64) -> bool {
    let lapsed = |n: i64| n > 0 && u64::try_from(n).is_ok_and(|n| n <= at + 2);
    before.iter().zip(roles).all(|(k, role)| {
        let mut times = vec![k.expire_at];
        match *role {
            "main" => times.extend(
                k.items
                    .iter()
                    .filter_map(|item| item.split_once('=').and_then(|(_, v)| hold_expiry(v))),
            ),
            "timeouts" => times.extend(k.items.iter().filter_map(|item| {
                item.rsplit_once('=')
                    .and_then(|(_, v)| v.parse::<i64>().ok())
            })),
            _ => {}
        }
        !times.into_iter().any(lapsed)
    })
}

/// Compares an object's normalized keys before and after a second delivery of a request: `Err`
/// names the first change beyond what time alone makes (a hold's expiry or the main key's, a
/// waiter's deadline, moved on by at most `slack` ms, as a renewal or a waiter's keep-alive does).
pub fn unchanged_keys(
    roles: &[&str],
    before: &[RawKey],
    after: &[RawKey],
    slack: u64,
) -> Result<(), String> {
    let slack = i64::try_from(slack).unwrap_or(i64::MAX);
    let number = |s: &str| s.split(' ').next().and_then(|n| n.parse::<i64>().ok());
    let moved = |a: &str, b: &str| {
        let (Some(x), Some(y)) = (number(a), number(b)) else {
            return false;
        };
        a.split_once(' ').map(|(_, r)| r) == b.split_once(' ').map(|(_, r)| r)
            && y >= x
            && y - x <= slack
    };
    for ((before, after), role) in before.iter().zip(after).zip(roles) {
        let same_items = before.items.len() == after.items.len()
            && before.items.iter().zip(&after.items).all(|(a, b)| {
                a == b
                    || match *role {
                        "main" => match (a.split_once('='), b.split_once('=')) {
                            (Some((fa, va)), Some((fb, vb))) => fa == fb && moved(va, vb),
                            _ => false,
                        },
                        "timeouts" => match (a.rsplit_once('='), b.rsplit_once('=')) {
                            (Some((fa, va)), Some((fb, vb))) => fa == fb && moved(va, vb),
                            _ => false,
                        },
                        _ => false,
                    }
            });
        // The main key's expiry moves with a renewal, and so does an election's leader record,
        // which expires with its hold.
        let same_expiry = before.expire_at == after.expire_at
            || (matches!(*role, "main" | "leader")
                && moved(&before.expire_at.to_string(), &after.expire_at.to_string()));
        if before.ty != after.ty || !same_items || !same_expiry {
            return Err(format!("the {role} key: {before:?} became {after:?}"));
        }
    }
    Ok(())
}

/// One command the server executed, as `MONITOR` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monitored {
    /// The server's clock when it executed the command (µs).
    pub us: u64,
    /// The client's address (`127.0.0.1:<port>`), or `lua` for a command a script ran.
    pub source: String,
    /// The command and its arguments (the command's name as the client sent it).
    pub args: Vec<String>,
}

impl Monitored {
    /// Whether the command is `name` (case-insensitive).
    pub fn is(&self, name: &str) -> bool {
        self.args
            .first()
            .is_some_and(|c| c.eq_ignore_ascii_case(name))
    }

    /// Reads one `MONITOR` line (`<s>.<µs> [<db> <source>] "<arg>" "<arg>" …`, each argument
    /// quoted as Redis' `sdscatrepr` quotes it).
    pub fn parse(line: &str) -> Option<Self> {
        let (time, rest) = line.split_once(' ')?;
        let (secs, micros) = time.split_once('.')?;
        let us = secs.parse::<u64>().ok()? * 1_000_000 + micros.parse::<u64>().ok()?;
        let rest = rest.strip_prefix('[')?;
        let (client, rest) = rest.split_once("] ")?;
        let source = client.split_once(' ')?.1.to_owned();
        let mut args = Vec::new();
        let mut chars = rest.chars().peekable();
        loop {
            while chars.peek() == Some(&' ') {
                chars.next();
            }
            match chars.next() {
                None => break,
                Some('"') => {}
                Some(_) => return None,
            }
            let mut bytes = Vec::new();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        'n' => bytes.push(b'\n'),
                        'r' => bytes.push(b'\r'),
                        't' => bytes.push(b'\t'),
                        'a' => bytes.push(7),
                        'b' => bytes.push(8),
                        'x' => {
                            let hex: String = [chars.next()?, chars.next()?].iter().collect();
                            bytes.push(u8::from_str_radix(&hex, 16).ok()?);
                        }
                        other => {
                            let mut buf = [0u8; 4];
                            bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                        }
                    },
                    other => {
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
            args.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        Some(Self { us, source, args })
    }
}

/// A connection in `MONITOR` mode: every command the server executes from then on, in the order
/// it executed them (a script's own commands follow the script's line, as source `lua`).
pub struct Monitor {
    conn: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Monitor {
    /// Connects to `addr` and starts monitoring (returns once the server confirmed).
    pub async fn start(addr: std::net::SocketAddr) -> Monitor {
        use tokio::io::AsyncWriteExt;
        let conn = tokio::net::TcpStream::connect(addr)
            .await
            .expect("a MONITOR connection");
        let mut monitor = Monitor {
            conn,
            buf: Vec::new(),
        };
        monitor
            .conn
            .write_all(&lockkit_testkit::encode_command(&["MONITOR"]))
            .await
            .expect("MONITOR");
        let ok = monitor.next_line().await;
        assert_eq!(ok, "OK", "MONITOR's confirmation");
        monitor
    }

    async fn next_line(&mut self) -> String {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some((value, used)) = lockkit_testkit::RespValue::parse(&self.buf).expect("RESP")
            {
                self.buf.drain(..used);
                return value
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| panic!("not a MONITOR line: {value:?}"));
            }
            let mut chunk = [0u8; 16384];
            let n = crate::within(
                std::time::Duration::from_secs(10),
                "the MONITOR connection",
                self.conn.read(&mut chunk),
            )
            .await
            .expect("reading the MONITOR connection");
            assert!(n > 0, "the MONITOR connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Every command executed up to and including an `ECHO <marker>`, which the caller has sent
    /// (or sends) on another connection after the commands it wants to see.
    pub async fn until_echo(&mut self, marker: &str) -> Vec<Monitored> {
        let mut seen = Vec::new();
        loop {
            let line = self.next_line().await;
            let Some(command) = Monitored::parse(&line) else {
                panic!("an unreadable MONITOR line: {line:?}");
            };
            let done = command.is("ECHO") && command.args.get(1).is_some_and(|m| m == marker);
            seen.push(command);
            if done {
                return seen;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Monitored;

    #[test]
    fn monitor_lines_are_read_back() {
        let line =
            r#"1796335536.972340 [0 127.0.0.1:33714] "EVALSHA" "ab" "2" "k:{a b}" "x\"y\\z\x00""#;
        let got = Monitored::parse(line).unwrap();
        assert_eq!(got.us, 1_796_335_536_972_340);
        assert_eq!(got.source, "127.0.0.1:33714");
        assert_eq!(got.args, ["EVALSHA", "ab", "2", "k:{a b}", "x\"y\\z\0"]);
        let lua = Monitored::parse(r#"1796335536.972420 [0 lua] "SET" "b" "x""#).unwrap();
        assert_eq!(lua.source, "lua");
        assert!(lua.is("set"));
        let empty = Monitored::parse(r#"1.000001 [0 unix:/tmp/r.sock] "PING" """#).unwrap();
        assert_eq!(empty.args, ["PING", ""]);
    }
}
