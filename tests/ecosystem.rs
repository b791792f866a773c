//! lockkit against the crates around it: the `serde` feature's JSON of an inspection, and the
//! protocol crate's cluster key slots against fred's, so the two cannot drift apart.

use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit::protocol::slot::key_slot;
use lockkit_suite::{client, redis, unique};
use serde_json::{json, Value};

/// The inspection of a held, re-entered lock serializes to the shape `lockkit inspect --json`
/// prints: the kind as its key segment, times as whole milliseconds, every field present.
#[tokio::test]
async fn an_inspection_of_a_held_lock_serializes_as_the_cli_prints_it() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("serde");
    let lock = client.lock(&name);
    let lease = Duration::from_secs(60);
    let guard = lock.lock_with_lease(lease).await.unwrap();
    let again = guard.scope(lock.lock_with_lease(lease)).await.unwrap();

    let found = client.inspect(Some(Kind::Lock), &name).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let value = serde_json::to_value(&found[0]).unwrap();
    let object = value.as_object().unwrap();

    let mut fields: Vec<&str> = object.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "available",
            "count",
            "evictions",
            "fencing_token",
            "holders",
            "key",
            "kind",
            "leader",
            "mode",
            "name",
            "permits",
            "rate_limit",
            "ttl_ms",
            "used_permits",
            "waiters",
            "waiters_listed",
            "waiting_clients",
            "warnings",
        ],
        "{value}"
    );
    assert_eq!(value["kind"], "lock");
    assert_eq!(value["name"], name.as_str());
    assert_eq!(value["key"], found[0].key.as_str());
    assert!(found[0].key.contains(&format!("{{{name}}}")), "{value}");
    let ttl = value["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{value}");
    for absent in ["fencing_token", "mode", "permits", "used_permits", "count"] {
        assert_eq!(value[absent], Value::Null, "{absent} of a lock: {value}");
    }
    assert_eq!(value["waiters"], json!([]));
    // A lock's waiting set is read from Redis: listed, and no subscriber count is needed.
    assert_eq!(value["waiters_listed"], json!(true));
    assert_eq!(value["waiting_clients"], Value::Null);
    assert_eq!(value["warnings"], json!([]));

    let holders = value["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{value}");
    let holder = holders[0].as_object().unwrap();
    let mut holder_fields: Vec<&str> = holder.keys().map(String::as_str).collect();
    holder_fields.sort_unstable();
    assert_eq!(holder_fields, ["access", "holds", "lease_ms", "owner"]);
    assert_eq!(holder["holds"], 2, "one owner, re-entered once: {value}");
    assert!(
        holder["owner"].as_str().unwrap().starts_with(client.id()),
        "{value}"
    );
    assert_eq!(holder["access"], Value::Null);
    let lease_ms = holder["lease_ms"].as_u64().unwrap();
    assert!(lease_ms > 0 && lease_ms <= 60_000, "{value}");

    // A listed object: its kind and name.
    let listed = client.list(Some(&name)).await.unwrap();
    assert_eq!(
        serde_json::to_value(&listed).unwrap(),
        json!([{"kind": "lock", "name": name}])
    );

    again.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// Every key of length 0 to 6 over an alphabet with the hash-tag braces: the protocol crate's
/// slot (CRC16/XMODEM of the hash tag) agrees with the one fred routes by.
#[test]
fn key_slots_agree_with_freds_for_every_short_key_with_braces() {
    // The braces, two letters, the separator lockkit's keys use, and a byte >= 0x80.
    const ALPHABET: [u8; 6] = [b'a', b'b', b'{', b'}', b':', 0xFF];
    const MAX_LEN: u32 = 6;
    let mut checked = 0usize;
    let mut key = Vec::with_capacity(MAX_LEN as usize);
    for len in 0..=MAX_LEN {
        // Every key of `len` symbols: the base-6 digits of 0..6^len.
        for mut index in 0..ALPHABET.len().pow(len) {
            key.clear();
            for _ in 0..len {
                key.push(ALPHABET[index % ALPHABET.len()]);
                index /= ALPHABET.len();
            }
            assert_eq!(
                key_slot(&key),
                fred::util::redis_keyslot(&key),
                "key {:?}",
                String::from_utf8_lossy(&key)
            );
            checked += 1;
        }
    }
    // 1 + 6 + 36 + ... + 6^6 = (6^7 - 1) / 5.
    assert_eq!(checked, 55_987);
}
