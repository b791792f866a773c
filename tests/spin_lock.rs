//! Spin lock: mutual exclusion by polling, not reentrant, compare-and-delete release.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use lockkit::Error;
use lockkit_suite::{client, client_with, raw, spawned, unique, within};

const HANG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_locks_exclude_across_clients() {
    let redis = spawned().await;
    let name = unique("spin");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&redis.url()).await;
        for _ in 0..3 {
            let lock = client.spin_lock(&name);
            let (inside, overlaps, entries) = (inside.clone(), overlaps.clone(), entries.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = lock.lock().await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    entries.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        within(HANG, "spin workers", task).await.unwrap();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 45);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_spin_lock_is_not_reentrant() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let lock = client.spin_lock(unique("spin-reentry"));
    let guard = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
    assert_eq!(guard.hold_count(), 1);
    assert!(lock.try_lock(Duration::ZERO, None).await.unwrap().is_none());
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

/// A holder whose lease ran out must not delete the lock of the holder after it.
#[tokio::test]
async fn a_stale_guard_cannot_release_the_next_holders_lock() {
    let redis = spawned().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("spin-stale");
    let stale = a
        .spin_lock(&name)
        .lock_with_lease(Duration::from_millis(150))
        .await
        .unwrap();
    let next = within(HANG, "next holder", b.spin_lock(&name).lock())
        .await
        .unwrap();
    assert!(stale.is_lost());
    assert!(matches!(stale.unlock().await, Err(Error::NotHeld { .. })));
    assert!(
        b.spin_lock(&name).is_locked().await.unwrap(),
        "still held by the next holder"
    );
    assert!(!next.is_lost());
    next.unlock().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_renews_spin_locks_too() {
    let redis = spawned().await;
    let holder = client_with(&redis.url(), Duration::from_millis(300)).await;
    let other = client(&redis.url()).await;
    let name = unique("spin-watchdog");
    let guard = holder.spin_lock(&name).lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // five leases
    assert!(!guard.is_lost());
    assert!(other
        .spin_lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    other.spin_lock(&name).force_unlock().await.unwrap();
    within(HANG, "lost after force_unlock", guard.lost()).await;
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// Code that still uses the classic `SET key token NX PX` pattern on the same key excludes and
/// is excluded.
#[tokio::test]
async fn it_interoperates_with_plain_set_nx_px() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let name = unique("spin-interop");
    let key = lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::SpinLock, &name)
        .unwrap()
        .key;
    let store = raw(&redis.url()).await;
    let set: Option<String> = store
        .set(
            &key,
            "legacy-token",
            Some(fred::types::Expiration::PX(300)),
            Some(fred::types::SetOptions::NX),
            false,
        )
        .await
        .unwrap();
    assert!(set.is_some());
    let lock = client.spin_lock(&name);
    assert!(lock.try_lock(Duration::ZERO, None).await.unwrap().is_none());
    let guard = within(HANG, "after the legacy lease", lock.lock())
        .await
        .unwrap();
    let set: Option<String> = store
        .set(
            &key,
            "legacy-token",
            None,
            Some(fred::types::SetOptions::NX),
            false,
        )
        .await
        .unwrap();
    assert!(set.is_none(), "the legacy code is kept out");
    guard.unlock().await.unwrap();
}
