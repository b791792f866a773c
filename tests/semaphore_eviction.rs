//! A semaphore under a `maxmemory-policy` of `allkeys-*` (issue 11, item 7): its main HASH and
//! its leases ZSET are separate keys without a TTL, so Redis may evict one without the other.
//! The scripts notice the orphaned half, drop the holds it strands (their holders learn it) and
//! record the repair; `Client::inspect` reports the risky policy, the missing key and the repair.
//!
//! An eviction is simulated by deleting one of the two keys on a server whose policy was set to
//! `allkeys-lru` with `CONFIG SET`.

use std::time::Duration;

use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::{Client, Error, Inspection, SemaphorePermit};
use lockkit_suite::{client, spawned, unique};
use lockkit_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(120);

/// A server under `allkeys-lru`; a semaphore of `permits` permits, all held by one hold in the
/// first client; a second client. Returns (server, holder, other, name, the hold).
async fn all_permits_held_under_allkeys_lru(
    permits: u64,
) -> (RedisServer, Client, Client, String, SemaphorePermit) {
    let redis = spawned().await;
    assert_eq!(
        redis
            .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
            .await
            .unwrap(),
        lockkit_testkit::RespValue::Simple("OK".into())
    );
    let url = redis.url();
    let (holder, other) = (client(&url).await, client(&url).await);
    let name = unique("evicted");
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(permits).await.unwrap());
    let held = semaphore
        .try_acquire(permits, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .expect("free permits");
    (redis, holder, other, name, held)
}

/// Simulates the eviction of one of the semaphore's keys (0: the main HASH, 1: the leases ZSET).
async fn evict(redis: &RedisServer, name: &str, key: usize) {
    let keys = Namespace::default()
        .object(Kind::Semaphore, name)
        .unwrap()
        .keys;
    assert_eq!(
        redis.command(&["DEL", &keys[key]]).await.unwrap(),
        lockkit_testkit::RespValue::Int(1)
    );
}

async fn inspect(client: &Client, name: &str) -> Inspection {
    let mut found = client.inspect(Some(Kind::Semaphore), name).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

fn mentions(inspection: &Inspection, words: &str) -> bool {
    inspection.warnings.iter().any(|w| w.contains(words))
}

/// The leases key evicted while both permits are held: without the repair no hold could ever end
/// and both permits were lost for good.
#[tokio::test]
async fn an_evicted_leases_key_gives_the_stranded_permits_back_and_is_reported() {
    let (redis, _holder, other, name, held) = all_permits_held_under_allkeys_lru(2).await;
    evict(&redis, &name, 1).await;
    let before = inspect(&other, &name).await;
    assert!(
        mentions(&before, "maxmemory-policy is allkeys-lru"),
        "{before:?}"
    );
    assert!(mentions(&before, "leases key is missing"), "{before:?}");
    assert_eq!(before.evictions, None);

    let permit = other
        .semaphore(&name)
        .try_acquire(1, Duration::ZERO, Some(LEASE))
        .await
        .unwrap();
    assert!(
        permit.is_some(),
        "the permits stranded by the evicted leases key came back"
    );
    assert!(
        matches!(held.release().await, Err(Error::NotHeld { .. })),
        "the dropped hold is reported as gone"
    );
    let after = inspect(&other, &name).await;
    assert_eq!(after.evictions, Some(1), "{after:?}");
    assert_eq!(after.used_permits, Some(1));
    assert!(mentions(&after, "found evicted 1 time"), "{after:?}");
}

/// The main HASH evicted while a hold is live: the total and the hold's permit count are gone.
/// Setting the total again must not count from zero while the orphaned hold still holds a permit
/// (more holders than permits); the hold is dropped instead, and its holder told.
#[tokio::test]
async fn an_evicted_main_key_drops_the_orphaned_holds_before_the_total_is_set_again() {
    let (redis, _holder, other, name, held) = all_permits_held_under_allkeys_lru(1).await;
    evict(&redis, &name, 0).await;
    let before = inspect(&other, &name).await;
    assert_eq!(before.permits, None);
    assert!(mentions(&before, "total is missing"), "{before:?}");

    // Every instance sets the total at start-up.
    assert!(other.semaphore(&name).try_set_permits(1).await.unwrap());
    assert!(
        matches!(held.release().await, Err(Error::NotHeld { .. })),
        "the orphaned hold is dropped, not left holding a permit the new total does not count"
    );
    let after = inspect(&other, &name).await;
    assert_eq!(after.evictions, Some(1), "{after:?}");
    assert!(after.holders.is_empty(), "{after:?}");
}

/// Under `noeviction` (the default) and with both keys present, nothing is reported.
#[tokio::test]
async fn a_whole_semaphore_under_noeviction_has_no_warnings() {
    let redis = spawned().await;
    let url = redis.url();
    let holder = client(&url).await;
    let name = unique("no-eviction");
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(2).await.unwrap());
    let _held = semaphore
        .try_acquire(1, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .expect("a free permit");
    let found = inspect(&holder, &name).await;
    assert!(found.warnings.is_empty(), "{found:?}");
    assert_eq!(found.evictions, None);
}
