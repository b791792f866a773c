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
