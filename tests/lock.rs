//! The reentrant lock's basic contract, against a real redis-server.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::HashesInterface;
use lockkit::Error;
use lockkit_suite::{client, eval, ints, lock_key, raw, redis, unique, until_waiting, within};

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
async fn a_holder_reenters_in_its_scope_and_must_release_as_often() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("reentrant");
    let lock = client.lock(&name);

    let first = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
    let second = first
        .scope(lock.try_lock(Duration::ZERO, None))
        .await
        .unwrap()
        .unwrap();
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

/// The handoff reservation, checked inside Redis for the lock and the fenced lock: the release
/// and the acquires run in one `MULTI`, so no time passes between them and the outcome does not
/// depend on the machine's speed.
#[tokio::test]
async fn a_release_that_woke_waiters_reserves_the_lock_for_the_longest_waiting() {
    use lockkit::protocol::keys::{Kind, Namespace};
    use lockkit::protocol::lock::HANDOFF_WINDOW;
    use lockkit::protocol::{fenced_lock, lock};
    use lockkit_testkit::send_commands;

    let server = lockkit_suite::spawned().await;
    let window = i64::try_from(HANDOFF_WINDOW.as_millis()).unwrap();
    for (kind, acquire, release) in [
        (Kind::Lock, &lock::ACQUIRE, &lock::RELEASE),
        (
            Kind::FencedLock,
            &fenced_lock::ACQUIRE,
            &fenced_lock::RELEASE,
        ),
    ] {
        let keys = Namespace::default()
            .object(kind, &unique("handoff"))
            .unwrap();
        let (acquire, release) = (acquire.source(), release.source());
        let k = &keys.keys;
        let (handoff, waiting) = (
            keys.aux("handoff").expect("a handoff key"),
            keys.aux("waiting").expect("a waiting key"),
        );
        let lease = "30000";
        // Waiters keep their entry alive for a minute (the keep-alive), far longer than the test.
        let wait = "60000";

        // Nobody waits: the owner that releases may take the lock back at once.
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:1", lease, wait]),
                vec!["MULTI"],
                eval(release, k, &["#A:1", &keys.channel, "0"]),
                eval(acquire, k, &["A", "#A:2", lease, wait]),
                vec!["EXEC"],
                eval(release, k, &["#A:2", &keys.channel, "0"]),
            ],
        )
        .await
        .unwrap();
        let exec = replies[4].as_array().expect("an EXEC reply");
        assert_eq!(ints(&exec[0]), vec![1, 0], "{kind:?}: released");
        assert_eq!(ints(&exec[1])[..2], [1, 1], "{kind:?}: taken back");

        // B, then C find the lock taken and wait (subscribed to the release channel). A's release
        // reserves the lock for B, who waited longest: neither A nor C can take it, B can, and
        // taking it ends the reservation and B's place in the waiting set.
        let subscriber = raw(&server.url()).await;
        fred::interfaces::PubsubInterface::subscribe(&subscriber, keys.channel.as_str())
            .await
            .unwrap();
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:3", lease, wait]),
                // D tries once and does not wait (`try_lock(ZERO)`, keep-alive 0): it must not join the set.
                eval(acquire, k, &["D", "#D:1", lease, "0"]),
                eval(acquire, k, &["B", "#B:1", lease, wait]),
                eval(acquire, k, &["C", "#C:1", lease, wait]),
                eval(acquire, k, &["B", "#B:2", lease, wait]),
                vec!["MULTI"],
                eval(release, k, &["#A:3", &keys.channel, "0"]),
                eval(acquire, k, &["A", "#A:4", lease, wait]),
                eval(acquire, k, &["C", "#C:2", lease, wait]),
                eval(acquire, k, &["B", "#B:3", lease, wait]),
                vec!["EXISTS", handoff],
                vec!["ZRANGE", waiting, "0", "-1"],
                vec!["EXEC"],
            ],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[0])[..2], [1, 1], "{kind:?}: A holds");
        for busy in &replies[1..5] {
            assert_eq!(ints(busy)[0], 0, "{kind:?}: D, B and C find it taken");
        }
        let exec = replies[12].as_array().expect("an EXEC reply");
        assert_eq!(ints(&exec[0]), vec![1, 0], "{kind:?}: released");
        for refused in [ints(&exec[1]), ints(&exec[2])] {
            assert_eq!(refused[0], 0, "{kind:?}: A and C are refused: {refused:?}");
            assert!(
                (1..=window).contains(&refused[1]),
                "{kind:?}: and told to retry within the window: {refused:?}"
            );
        }
        assert_eq!(ints(&exec[3])[..2], [1, 1], "{kind:?}: B takes the lock");
        assert_eq!(
            exec[4].as_int(),
            Some(0),
            "{kind:?}: which ends the reservation"
        );
        let mut still_waiting: Vec<&str> = exec[5]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m.as_str().expect("a member"))
            .collect();
        still_waiting.sort_unstable();
        assert_eq!(
            still_waiting,
            ["A", "C"],
            "{kind:?}: A and C wait for their turn"
        );
    }
}

/// A woken waiter that never comes for the lock keeps it from its former owner for the handoff
/// window only: the owner's `lock()` returns.
#[tokio::test]
async fn a_woken_waiter_that_never_comes_does_not_keep_the_lock_from_its_owner() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("handoff-nobody-comes");
    // A subscriber on the release channel that is not a lockkit waiter: it never acquires.
    let subscriber = raw(&redis.url()).await;
    let channel = lockkit::protocol::keys::Namespace::default()
        .lock(&name)
        .unwrap()
        .channel;
    fred::interfaces::PubsubInterface::subscribe(&subscriber, channel.as_str())
        .await
        .unwrap();
    let lock = client.lock(&name);
    for _ in 0..3 {
        let guard = within(HANG, "lock", lock.lock()).await.unwrap();
        guard.unlock().await.unwrap();
    }
    let guard = within(HANG, "lock", lock.lock()).await.unwrap();
    assert!(lock.is_locked().await.unwrap());
    guard.unlock().await.unwrap();
}
