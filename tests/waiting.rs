//! Event-driven waiting: handoff by pub/sub, the TTL bound when no message comes, one wake-up
//! per release.

use std::time::Duration;

use lockkit::protocol::keys::Namespace;
use lockkit::{Client, PubSubMode};
use lockkit_suite::{client, redis, spawned, unique, until_waiting, within};

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
/// that very waiter, even when the client registered another waiter before it. Here A waits
/// first and B second, in the client and in Redis; then B's place in Redis's waiting set is moved
/// ahead of A's. The release reserves the lock for B and wakes B, not A, who registered first in
/// the client. (Waking A would get it refused: the lock is reserved for B.)
#[tokio::test]
async fn a_release_wakes_the_waiter_it_reserved_the_lock_for() {
    use fred::interfaces::ClientLike;
    use fred::types::{ClusterHash, CustomCommand};

    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiting = client(&redis.url()).await;
    let name = unique("prefer");
    let guard = holder.lock(&name).lock().await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();

    let mut tasks = Vec::new();
    for (waiter, registered) in [("A", 1), ("B", 2)] {
        let lock = waiting.lock(&name);
        let order = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.send(waiter).unwrap();
            guard.unlock().await.unwrap();
        }));
        // Registered in the client only after its first attempt joined Redis's waiting set.
        until_waiting(&waiting, registered).await;
    }

    // B (the later entry) moves ahead of A in Redis.
    let raw = lockkit_suite::raw(&redis.url()).await;
    let set = lockkit::protocol::keys::Namespace::default()
        .lock(&name)
        .unwrap()
        .aux("waiting")
        .expect("a waiting set")
        .to_owned();
    let command = |name| CustomCommand::new_static(name, ClusterHash::FirstKey, false);
    let members: Vec<String> = raw
        .custom(command("ZRANGE"), vec![set.as_str(), "0", "-1"])
        .await
        .unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    let _: i64 = raw
        .custom(
            command("ZADD"),
            vec![set.as_str(), "0", members[1].as_str()],
        )
        .await
        .unwrap();

    guard.unlock().await.unwrap();
    let first = within(HANG, "the first handoff", order_rx.recv()).await;
    let second = within(HANG, "the second handoff", order_rx.recv()).await;
    assert_eq!((first, second), (Some("B"), Some("A")));
    for task in tasks {
        within(HANG, "a waiter", task).await.unwrap();
    }
}

/// The server's subscriber count of `channel`, sharded (`PUBSUB SHARDNUMSUB`).
async fn shard_subscribers(server: &lockkit_testkit::RedisServer, channel: &str) -> Option<i64> {
    let reply = lockkit_testkit::send_command(server.addr(), &["PUBSUB", "SHARDNUMSUB", channel])
        .await
        .unwrap();
    reply
        .as_array()
        .and_then(|a| a.get(1))
        .and_then(|n| n.as_int())
}

/// In sharded mode the hub restores the shard subscriptions itself after its subscriber
/// connection is re-established (fred does not): a waiter parked across the reconnect is still
/// woken by the release message, long before the holder's lease (300 s) would let it in.
#[tokio::test]
async fn a_sharded_waiter_parked_across_a_reconnect_is_woken_by_the_release() {
    let server = spawned().await;
    let sharded = |url: String| async move {
        Client::builder()
            .url(url)
            .pubsub(PubSubMode::Sharded)
            .build()
            .await
            .unwrap()
    };
    let holder = sharded(server.url()).await;
    let waiter = sharded(server.url()).await;
    let name = unique("sharded-reconnect");
    // A lock's waiter listens on its client's own channel for the lock.
    let channel = Namespace::default()
        .lock(&name)
        .unwrap()
        .client_channel(waiter.id());
    let guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_secs(300))
        .await
        .unwrap();
    let lock = waiter.lock(&name);
    let parked = tokio::spawn(async move { lock.lock().await });
    within(HANG, "the waiter's shard subscription", async {
        while shard_subscribers(&server, &channel).await != Some(1) {
            tokio::task::yield_now().await;
        }
    })
    .await;

    // Closes the waiter's subscriber connection (the only client with a subscription); the
    // server drops its shard subscriptions with it. The client reconnects by itself.
    lockkit_testkit::send_command(server.addr(), &["CLIENT", "KILL", "TYPE", "pubsub"])
        .await
        .unwrap();
    // CLIENT KILL frees the connection before it replies: a subscriber counted from here on is
    // a new subscription.
    within(HANG, "the shard subscription to be restored", async {
        while shard_subscribers(&server, &channel).await != Some(1) {
            tokio::task::yield_now().await;
        }
    })
    .await;

    guard.unlock().await.unwrap();
    within(HANG, "the parked waiter", parked)
        .await
        .unwrap()
        .unwrap()
        .unlock()
        .await
        .unwrap();
}

/// A waiter whose task stops being polled while its channel's subscription is under way (user
/// code blocks the task: `block_in_place` in another branch of the same `join!`) does not hold up
/// another waiter of that channel: the other one's wait ends as a wait does, `Ok(None)` when the
/// lock stays held, not in an error once its bound runs out. (Found by `tests/model_scopes.rs`;
/// the subscription used to run inside the first registrant's future.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_registrant_does_not_hold_up_the_other_waiters_of_its_channel() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiting = client(&redis.url()).await;
    let name = unique("frozen-registrant");
    let held = holder
        .lock(&name)
        .try_lock(Duration::ZERO, Some(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let first = waiting.lock(&name);
    let second = waiting.lock(&name);
    let (frozen, blocked) = tokio::join!(first.try_lock(Duration::from_millis(300), None), async {
        // The first waiter has registered: its subscription is under way, in its own future.
        until_waiting(&waiting, 1).await;
        // Freeze this task (and with it the first waiter's future) while a second waiter of the
        // same channel waits on this thread.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(second.try_lock(Duration::from_millis(100), None))
        })
    });
    assert!(
        matches!(blocked, Ok(None)),
        "the second wait timed out as a wait does: {blocked:?}"
    );
    assert!(matches!(frozen, Ok(None)), "{frozen:?}");
    held.unlock().await.unwrap();
}
