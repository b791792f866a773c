//! The reentrant lock's basic contract, against a real redis-server.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::HashesInterface;
use lockkit::Error;
use lockkit_suite::{client, lock_key, raw, redis, unique, until_waiting, within};

const HANG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn twenty_tasks_racing_try_lock_zero_exactly_one_wins() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("race");
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let lock = client.lock(&name);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            lock.try_lock(Duration::ZERO, None).await
        }));
    }
    let mut guards = Vec::new();
    for task in tasks {
        if let Some(guard) = task.await.unwrap().unwrap() {
            guards.push(guard);
        }
    }
    assert_eq!(guards.len(), 1, "exactly one task wins");
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    assert!(!client.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn the_same_task_reenters_and_must_release_as_often() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("reentrant");
    let lock = client.lock(&name);

    let first = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
    let second = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(lock.is_held_by_current_task().await.unwrap());

    // Another task of the same client, and another client, do not hold it and cannot take it.
    let lock2 = lock.clone();
    let (count, held, got) = tokio::spawn(async move {
        (
            lock2.hold_count().await.unwrap(),
            lock2.is_held_by_current_task().await.unwrap(),
            lock2
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .is_some(),
        )
    })
    .await
    .unwrap();
    assert_eq!((count, held, got), (0, false, false));
    assert!(other
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());

    second.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap(), "one hold left");
    first.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    assert!(!lock.is_locked().await.unwrap());
    assert!(other
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_guard_moved_to_another_task_unlocks_there() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("moved");
    let guard = client.lock(&name).lock().await.unwrap();
    tokio::spawn(async move { guard.unlock().await })
        .await
        .unwrap()
        .unwrap();
    assert!(!client.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn a_dropped_guard_is_released_in_the_background() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = lockkit_suite::client(&redis.url()).await;
    let name = unique("dropped");
    let guard = holder
        .lock(&name)
        .try_lock(Duration::ZERO, Some(Duration::from_secs(60)))
        .await
        .unwrap()
        .unwrap();
    drop(guard);
    // The 60 s lease would outlast this wait: only the background release can free it in time.
    let got = within(
        HANG,
        "acquire after drop",
        waiter.lock(&name).try_lock(Duration::from_secs(20), None),
    )
    .await
    .unwrap();
    assert!(got.is_some());
}

#[tokio::test]
async fn unlock_after_the_lease_ran_out_is_not_held() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("expired");
    let guard = client
        .lock(&name)
        .try_lock(Duration::ZERO, Some(Duration::from_millis(100)))
        .await
        .unwrap()
        .unwrap();
    within(HANG, "lease end", guard.lost()).await;
    assert!(guard.is_lost());
    // The local deadline precedes Redis's expiry; wait until Redis has dropped the key too.
    let lock = client.lock(&name);
    while let Some(ttl) = lock.remaining_ttl().await.unwrap() {
        tokio::time::sleep(ttl).await;
    }
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn inspection_reports_what_redis_holds() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("inspect");
    let lock = client.lock(&name);
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(lock.remaining_ttl().await.unwrap(), None);

    let lease = Duration::from_secs(60);
    let guard = lock
        .try_lock(Duration::ZERO, Some(lease))
        .await
        .unwrap()
        .unwrap();
    assert!(!guard.is_watchdog());
    assert_eq!(guard.name(), name);
    assert_eq!(guard.fencing_token(), None);
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(ttl <= lease && ttl > Duration::ZERO, "{ttl:?}");

    // The hash: one owner field with count 1 and one hold marker.
    let fields: std::collections::HashMap<String, String> = raw(&redis.url())
        .await
        .hgetall(lock_key(&name))
        .await
        .unwrap();
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert_eq!(
        fields.values().filter(|v| *v == "1").count(),
        1,
        "{fields:?}"
    );
    assert_eq!(
        fields.keys().filter(|k| k.starts_with('#')).count(),
        1,
        "{fields:?}"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn force_unlock_frees_the_lock_and_the_guard_learns_it() {
    let redis = redis().await;
    let holder = lockkit_suite::client_with(&redis.url(), Duration::from_millis(300)).await;
    let admin = client(&redis.url()).await;
    let name = unique("force");
    let guard = holder.lock(&name).lock().await.unwrap();
    assert!(admin.lock(&name).force_unlock().await.unwrap());
    assert!(
        !admin.lock(&name).force_unlock().await.unwrap(),
        "already free"
    );
    // The next renewal finds the hold gone.
    within(HANG, "lost signal after force_unlock", guard.lost()).await;
    assert!(guard.is_lost());
    let taken = admin
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    assert!(taken.is_some(), "free after force_unlock");
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn shutdown_releases_every_hold_and_refuses_later_calls() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let names: Vec<String> = (0..5).map(|_| unique("shutdown")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(
            client
                .lock(name)
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(client.held_count(), 5);
    client.shutdown().await.unwrap();
    for name in &names {
        assert!(
            !other.lock(name).is_locked().await.unwrap(),
            "{name} released"
        );
    }
    assert!(guards.iter().all(|g| g.is_lost()));
    assert!(matches!(
        guards.pop().unwrap().unlock().await,
        Err(Error::Shutdown)
    ));
    assert!(matches!(
        client.lock(&names[0]).lock().await,
        Err(Error::Shutdown)
    ));
    assert!(matches!(
        client.lock(&names[0]).is_locked().await,
        Err(Error::Shutdown)
    ));
    client.shutdown().await.unwrap(); // again: nothing to do
}

#[tokio::test]
async fn shutdown_wakes_waiting_tasks_with_an_error() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiting = lockkit_suite::client(&redis.url()).await;
    let name = unique("shutdown-wait");
    let _guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiting.lock(&name);
    let task = tokio::spawn(async move { lock.lock().await });
    until_waiting(&waiting, 1).await;
    waiting.shutdown().await.unwrap();
    let result = within(HANG, "waiter after shutdown", task).await.unwrap();
    assert!(matches!(result, Err(Error::Shutdown)), "{result:?}");
}
