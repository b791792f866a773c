//! Multi-lock: all or nothing, never a strict subset, no deadlock between overlapping sets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockkit::Error;
use lockkit_suite::{client, spawned, unique, until_waiting, within};

const HANG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_busy_member_means_nothing_is_held() {
    let redis = spawned().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let names: Vec<String> = (0..3).map(|_| unique("multi")).collect();
    let blocker = b.lock(&names[1]).lock().await.unwrap();
    let multi = a.multi_lock(names.iter().map(|n| a.lock(n)));
    assert!(multi
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    assert!(multi
        .try_lock(Duration::from_millis(100), None)
        .await
        .unwrap()
        .is_none());
    for name in [&names[0], &names[2]] {
        assert!(
            !b.lock(name).is_locked().await.unwrap(),
            "{name} must not stay held"
        );
    }
    // Once the blocker goes, the multi-lock gets all three.
    let waiting = tokio::spawn({
        let multi = multi.clone();
        async move { multi.try_lock(Duration::from_secs(30), None).await }
    });
    until_waiting(&a, 1).await;
    blocker.unlock().await.unwrap();
    let guard = within(HANG, "multi after release", waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(guard.guards().len(), 3);
    for name in &names {
        assert!(b
            .lock(name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
    }
    guard.unlock().await.unwrap();
    for name in &names {
        assert!(!b.lock(name).is_locked().await.unwrap());
    }
}

/// Two multi-locks over the same two locks, listed in opposite orders, contend from two clients:
/// neither deadlocks, and whenever one holds its guard it holds both locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_multi_locks_neither_deadlock_nor_overlap() {
    let redis = spawned().await;
    let (x, y) = (unique("acct"), unique("acct"));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for order in [[&x, &y], [&y, &x]] {
        let client = client(&redis.url()).await;
        let multi = client.multi_lock(order.iter().map(|n| client.lock(n.as_str())));
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let guard = multi.lock().await.unwrap();
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().await.unwrap();
            }
        }));
    }
    for task in tasks {
        within(HANG, "overlapping multi-locks", task).await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_empty_multi_lock_is_rejected() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let multi = client.multi_lock(Vec::new());
    assert!(matches!(
        multi.try_lock(Duration::ZERO, None).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(multi.lock().await, Err(Error::InvalidArgument(_))));
}

#[tokio::test]
async fn a_bad_member_name_fails_without_holding_the_others() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let good = unique("multi-good");
    // Taken in name order: the good lock first, then the overlong name fails.
    let bad = "z".repeat(lockkit::protocol::keys::MAX_NAME_LEN + 1);
    let multi = client.multi_lock([client.lock(bad), client.lock(&good)]);
    assert!(matches!(
        multi.try_lock(Duration::ZERO, None).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(!client.lock(&good).is_locked().await.unwrap());
}
