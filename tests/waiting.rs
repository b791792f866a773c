//! Event-driven waiting: handoff by pub/sub, the TTL bound when no message comes, one wake-up
//! per release.

use std::time::Duration;

use lockkit_suite::{client, redis, unique, until_waiting, within};

const HANG: Duration = Duration::from_secs(60);

/// The holder's fixed lease (60 s) outlasts the waiter's patience (30 s): the waiter can only
/// get the lock in time through the release message.
#[tokio::test]
async fn a_release_hands_the_lock_over_long_before_the_holders_lease_ends() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let name = unique("handoff");
    let guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let lock = waiter.lock(&name);
    let task = tokio::spawn(async move { lock.try_lock(Duration::from_secs(30), None).await });
    until_waiting(&waiter, 1).await;
    guard.unlock().await.unwrap();
    let got = within(HANG, "handoff", task).await.unwrap().unwrap();
    assert!(got.is_some(), "woken by the release, not by the 60 s lease");
}

/// A lease that runs out publishes nothing: the waiter must still get the lock, bounded by the
/// holder's remaining TTL.
#[tokio::test]
async fn a_waiter_that_gets_no_message_is_bounded_by_the_holders_ttl() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let name = unique("no-message");
    let _guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    let got = within(
        HANG,
        "acquire after a silent expiry",
        waiter.lock(&name).lock(),
    )
    .await
    .unwrap();
    got.unlock().await.unwrap();
}

/// Several waiters of one client: each release lets exactly one of them in, and all of them are
/// served in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_lets_one_waiter_in_until_all_are_served() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiters = client(&redis.url()).await;
    let name = unique("queue");
    let guard = holder.lock(&name).lock().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let lock = waiters.lock(&name);
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
            tx.send((i, release_tx)).unwrap();
            release_rx.await.unwrap();
            guard.unlock().await.unwrap();
        }));
    }
    until_waiting(&waiters, 5).await;
    guard.unlock().await.unwrap();
    let mut served = Vec::new();
    for _ in 0..5 {
        let (i, release) = within(HANG, "next waiter", rx.recv()).await.unwrap();
        // While this waiter holds the lock, nobody else is inside.
        assert!(rx.try_recv().is_err(), "two waiters inside at once");
        served.push(i);
        release.send(()).unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    served.sort_unstable();
    assert_eq!(served, vec![0, 1, 2, 3, 4]);
    assert_eq!(waiters.waiting_count(), 0, "every subscription is given up");
}

/// A release names the owner that has waited longest (`p:<owner>`), and that owner's client wakes
/// that very waiter, even when the client registered another waiter before it. Here A waited
/// first, stopped waiting (its place in Redis stays), then waited again behind B: the release
/// wakes A, not B. (Waking B would get it refused: the lock is reserved for A.)
#[tokio::test]
async fn a_release_wakes_the_waiter_it_reserved_the_lock_for() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiting = client(&redis.url()).await;
    let name = unique("prefer");
    let guard = holder.lock(&name).lock().await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (again_tx, again_rx) = tokio::sync::oneshot::channel::<()>();

    let lock = waiting.lock(&name);
    let order = order_tx.clone();
    let a = tokio::spawn(async move {
        // First wait, given up on request: A leaves the client's waiters, not Redis's set.
        tokio::select! {
            _ = lock.lock() => panic!("A got the lock while it was held"),
            _ = stop_rx => {}
        }
        again_rx.await.unwrap();
        let guard = lock.lock().await.unwrap();
        order.send("A").unwrap();
        guard.unlock().await.unwrap();
    });
    until_waiting(&waiting, 1).await;

    let lock = waiting.lock(&name);
    let order = order_tx.clone();
    let b = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        order.send("B").unwrap();
        guard.unlock().await.unwrap();
    });
    until_waiting(&waiting, 2).await;
    stop_tx.send(()).unwrap();
    within(HANG, "A to stop waiting", async {
        while waiting.waiting_count() > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    again_tx.send(()).unwrap();
    until_waiting(&waiting, 2).await;

    guard.unlock().await.unwrap();
    let first = within(HANG, "the first handoff", order_rx.recv()).await;
    let second = within(HANG, "the second handoff", order_rx.recv()).await;
    assert_eq!((first, second), (Some("A"), Some("B")));
    within(HANG, "A", a).await.unwrap();
    within(HANG, "B", b).await.unwrap();
}
