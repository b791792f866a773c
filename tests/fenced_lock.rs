//! Fenced lock: tokens strictly increase across clients, re-entries and data loss; a stale
//! holder's write is rejected by the storage's token check.

use std::sync::Arc;
use std::time::Duration;

use lockkit_suite::{client, raw, spawned, unique, within};
use tokio::sync::Mutex;

const HANG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_clients_and_reentries() {
    let redis = spawned().await;
    let name = unique("fenced");
    // Tokens in the order the critical sections ran (the lock serialises them).
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&redis.url()).await;
        for _ in 0..4 {
            let (lock, seen) = (client.fenced_lock(&name), Arc::clone(&seen));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let outer = lock.lock().await.unwrap();
                    let inner = outer.scope(lock.lock()).await.unwrap(); // re-entry
                    assert_eq!(inner.hold_count(), 2);
                    let mut seen = seen.lock().await;
                    seen.push(outer.fencing_token().unwrap());
                    seen.push(inner.fencing_token().unwrap());
                    drop(seen);
                    inner.unlock().await.unwrap();
                    outer.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        within(HANG, "fenced workers", task).await.unwrap();
    }
    let seen = seen.lock().await;
    assert_eq!(seen.len(), 3 * 4 * 5 * 2);
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens must strictly increase in critical-section order: {seen:?}"
    );
}

#[tokio::test]
async fn tokens_keep_growing_after_redis_loses_its_data() {
    let mut redis = spawned().await;
    let client = client(&redis.url()).await;
    let name = unique("fenced-restart");
    let before = client.fenced_lock(&name).lock().await.unwrap();
    let token_before = before.fencing_token().unwrap();
    redis.restart_empty().await.unwrap();
    let after = within(
        HANG,
        "acquire after restart",
        client.fenced_lock(&name).lock(),
    )
    .await
    .unwrap();
    assert!(after.fencing_token().unwrap() > token_before);
}

/// The seed's order service: a holder pauses past its lease, another takes the lock and writes;
/// the first one's late write carries an older token and the storage rejects it.
#[tokio::test]
async fn a_stale_holders_write_is_rejected_by_the_token_check() {
    use fred::interfaces::LuaInterface;
    // UPDATE record SET value = :value, last_fence = :fence WHERE last_fence <= :fence
    const FENCED_WRITE: &str = r"
        local last = tonumber(redis.call('HGET', KEYS[1], 'last_fence') or '0')
        if tonumber(ARGV[2]) < last then return 0 end
        redis.call('HSET', KEYS[1], 'value', ARGV[1], 'last_fence', ARGV[2])
        return 1";
    let redis = spawned().await;
    let (slow, fast) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("fenced-order");
    let record = unique("record");
    let store = raw(&redis.url()).await;

    let stale = slow
        .fenced_lock(&name)
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    within(HANG, "the slow holder's lease ends", stale.lost()).await; // it "paused" too long
    let fresh = within(HANG, "the next holder", fast.fenced_lock(&name).lock())
        .await
        .unwrap();
    assert!(fresh.fencing_token() > stale.fencing_token());

    let write = |value: &'static str, fence: u64| {
        let (store, record) = (store.clone(), record.clone());
        async move {
            let accepted: i64 = store
                .eval(
                    FENCED_WRITE,
                    vec![record],
                    vec![value.to_owned(), fence.to_string()],
                )
                .await
                .unwrap();
            accepted == 1
        }
    };
    assert!(write("fresh", fresh.fencing_token().unwrap()).await);
    assert!(
        !write("stale", stale.fencing_token().unwrap()).await,
        "stale write rejected"
    );
    let value: String = fred::interfaces::HashesInterface::hget(&store, &record, "value")
        .await
        .unwrap();
    assert_eq!(value, "fresh");
    fresh.unlock().await.unwrap();
}

#[tokio::test]
async fn plain_locks_have_no_token_and_fenced_locks_are_separate_objects() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let name = unique("separate");
    let plain = client.lock(&name).lock().await.unwrap();
    assert_eq!(plain.fencing_token(), None);
    // Same name, other kind: no conflict.
    let fenced = client
        .fenced_lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    assert!(fenced.unwrap().fencing_token().is_some());
}

/// The counter may be ahead of the server's clock in microseconds: after a failover to a server
/// whose clock is behind the old primary's, or after more than a million acquisitions in a
/// second. Every token is then the counter plus one: still strictly increasing, never a repeat.
#[tokio::test]
async fn tokens_keep_increasing_when_the_counter_is_ahead_of_the_server_clock() {
    use fred::interfaces::KeysInterface;
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let store = raw(&redis.url()).await;
    let name = unique("fenced-ahead");
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::FencedLock, &name)
        .unwrap();
    let counter = keys.aux("token").unwrap().to_owned();
    // A century of microseconds ahead of any clock.
    let ahead: u64 = 5_000_000_000_000_000;
    let _: () = store.set(&counter, ahead, None, None, false).await.unwrap();
    let lock = client.fenced_lock(&name);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = lock.lock().await.unwrap();
        tokens.push(guard.fencing_token().unwrap());
        guard.unlock().await.unwrap();
    }
    assert_eq!(tokens, vec![ahead + 1, ahead + 2, ahead + 3]);
}
