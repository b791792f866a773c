//! The count-down latch against a real redis-server, with several clients.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{KeysInterface, PubsubInterface};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::Error;
use lockkit_suite::{
    client, client_with, client_woken_only, raw, redis, spawned, unique, until_waiting, within,
};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(30);
const LONG: Duration = Duration::from_secs(60);

fn latch_keys(name: &str) -> lockkit::protocol::keys::ObjectKeys {
    Namespace::default()
        .object(Kind::CountDownLatch, name)
        .unwrap()
}

/// Two waiters on each of three clients. At count 1 — even when made to re-check by a stray
/// message — none of them returns; the last count-down releases all six, each after the flag that
/// the test raises just before it. Without a message, these clients' waiters would re-check only
/// after an hour (their recheck interval), after the test's 30 s hang guard: only the message
/// that the count reached zero can release them in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_clients_are_released_exactly_when_the_count_reaches_zero() {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("release-all");
    let counter = client(&url).await;
    let clients = [
        client_woken_only(&url).await,
        client_woken_only(&url).await,
        client_woken_only(&url).await,
    ];
    let latch = counter.count_down_latch(&name);
    assert!(latch.try_set_count(3).await.unwrap());

    let last_count_down_sent = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..2 {
            let latch = client.count_down_latch(&name);
            let sent = Arc::clone(&last_count_down_sent);
            tasks.push(tokio::spawn(async move {
                let opened = latch.wait(LONG).await.unwrap();
                (opened, sent.load(Ordering::SeqCst))
            }));
        }
    }
    for client in &clients {
        until_waiting(client, 2).await;
    }

    assert_eq!(latch.count_down().await.unwrap(), 2);
    assert_eq!(latch.count_down().await.unwrap(), 1);
    // A stray message makes every waiter re-check: at count 1 they must go back to waiting.
    let _: i64 = raw(&url)
        .await
        .publish(latch_keys(&name).channel, "all")
        .await
        .unwrap();
    let name = name.as_str();
    let short_waits = clients
        .iter()
        .map(|client| async move {
            client
                .count_down_latch(name)
                .wait(Duration::from_millis(300))
                .await
                .unwrap()
        })
        .collect::<Vec<_>>();
    for opened in futures::future::join_all(short_waits).await {
        assert!(!opened, "count 1 is not zero");
    }
    for client in &clients {
        assert_eq!(client.waiting_count(), 2, "still waiting at count 1");
    }
    assert!(tasks.iter().all(|task| !task.is_finished()));

    last_count_down_sent.store(true, Ordering::SeqCst);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    for task in tasks {
        let (opened, after_last) = within(HANG, "released waiter", task).await.unwrap();
        assert!(opened, "the latch opened within the wait");
        assert!(after_last, "released only by the last count-down");
    }
    assert_eq!(latch.count().await.unwrap(), 0);
    for client in &clients {
        assert_eq!(client.waiting_count(), 0);
    }
}

#[tokio::test]
async fn count_down_reports_each_new_count_and_refuses_below_zero() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let latch = client.count_down_latch(unique("counting"));
    assert_eq!(latch.count().await.unwrap(), 0);
    let reason = match latch.count_down().await {
        Err(Error::Refused { reason, .. }) => reason,
        other => panic!("expected Refused, got {other:?}"),
    };
    assert!(reason.contains("already zero"), "{reason}");

    assert!(latch.try_set_count(3).await.unwrap());
    assert_eq!(latch.count().await.unwrap(), 3);
    for expected in [2, 1, 0] {
        assert_eq!(latch.count_down().await.unwrap(), expected);
        assert_eq!(latch.count().await.unwrap(), expected);
    }
    assert!(matches!(
        latch.count_down().await,
        Err(Error::Refused { .. })
    ));
    assert_eq!(latch.count().await.unwrap(), 0, "not below zero");
}

#[tokio::test]
async fn try_set_count_only_sets_an_open_latch() {
    let redis = redis().await;
    let first = client(&redis.url()).await;
    let second = client(&redis.url()).await;
    let name = unique("set-once");
    assert!(first
        .count_down_latch(&name)
        .try_set_count(2)
        .await
        .unwrap());
    assert!(
        !second
            .count_down_latch(&name)
            .try_set_count(5)
            .await
            .unwrap(),
        "already counting"
    );
    assert_eq!(second.count_down_latch(&name).count().await.unwrap(), 2);
    second.count_down_latch(&name).count_down().await.unwrap();
    second.count_down_latch(&name).count_down().await.unwrap();
    assert!(
        second
            .count_down_latch(&name)
            .try_set_count(1)
            .await
            .unwrap(),
        "an open latch starts a new round"
    );
    assert_eq!(first.count_down_latch(&name).count().await.unwrap(), 1);
}

#[tokio::test]
async fn wait_is_true_at_once_on_an_open_latch_and_false_when_it_times_out() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let latch = client.count_down_latch(unique("wait"));
    assert!(latch.wait(Duration::ZERO).await.unwrap(), "never set: open");
    assert!(within(HANG, "wait on an open latch", latch.wait(LONG))
        .await
        .unwrap());
    latch.try_set_count(1).await.unwrap();
    assert!(!latch.wait(Duration::ZERO).await.unwrap());
    assert!(!latch.wait(Duration::from_millis(200)).await.unwrap());
    assert_eq!(client.waiting_count(), 0, "a timed-out wait unsubscribes");
    let cancelled = tokio::time::timeout(Duration::from_millis(200), latch.wait(LONG)).await;
    assert!(cancelled.is_err());
    assert_eq!(client.waiting_count(), 0, "a cancelled wait unsubscribes");
}

/// The count vanishes without any message (here: deleted by hand). The waiter re-checks on its
/// own — at its recheck interval, ≈ 1.7 s by default — instead of hanging. Its watchdog timeout
/// (an hour) plays no part: before issue 27 a latch's waiter re-checked every third of it.
#[tokio::test]
async fn a_waiter_that_gets_no_message_still_sees_zero() {
    let redis = redis().await;
    let waiter = client_with(&redis.url(), Duration::from_secs(3600)).await;
    let name = unique("no-message");
    let latch = waiter.count_down_latch(&name);
    latch.try_set_count(1).await.unwrap();
    let task = {
        let latch = latch.clone();
        tokio::spawn(async move { latch.wait(LONG).await })
    };
    until_waiting(&waiter, 1).await;
    let deleted: i64 = raw(&redis.url())
        .await
        .del(latch_keys(&name).key)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(within(HANG, "wait without a message", task)
        .await
        .unwrap()
        .unwrap());
}

#[tokio::test]
async fn bad_input_and_foreign_values_are_reported_clearly() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let latch = client.count_down_latch(unique("bad-input"));
    for count in [0, u64::MAX, u64::from(u32::MAX) + 1] {
        assert!(
            matches!(
                latch.try_set_count(count).await,
                Err(Error::InvalidArgument(_))
            ),
            "{count}"
        );
    }
    assert!(matches!(
        client.count_down_latch("").count().await,
        Err(Error::InvalidArgument(_))
    ));

    let name = unique("foreign");
    let key = latch_keys(&name).key;
    let store = raw(&redis.url()).await;
    let latch = client.count_down_latch(&name);
    for value in ["not a count", "1.5"] {
        let _: () = store.set(&key, value, None, None, false).await.unwrap();
        for result in [latch.count().await, latch.count_down().await] {
            assert!(
                matches!(&result, Err(Error::WrongType { key: k, .. }) if *k == key),
                "{value:?}: {result:?}"
            );
        }
        let kept: String = store.get(&key).await.unwrap();
        assert_eq!(kept, value, "the foreign value is untouched");
    }
}

/// The server runs the count-down, the reply is lost and the connection drops; fred re-sends the
/// same request. It must count once.
#[tokio::test]
async fn a_count_down_replayed_after_a_lost_reply_counts_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    // Cache the scripts, so the request whose reply is lost is the script itself.
    let warm = client.count_down_latch(unique("warm-up"));
    warm.try_set_count(1).await.unwrap();
    warm.count_down().await.unwrap();

    let name = unique("replay");
    let latch = client.count_down_latch(&name);
    latch.try_set_count(2).await.unwrap();
    proxy.cut_after_request_containing(latch_keys(&name).key);
    let count = within(HANG, "count down across a cut", latch.count_down())
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(count, 1);
    assert_eq!(latch.count().await.unwrap(), 1, "counted once");

    proxy.cut_after_request_containing(latch_keys(&name).key);
    assert_eq!(
        within(HANG, "last count down across a cut", latch.count_down())
            .await
            .unwrap(),
        0,
        "a re-send after the latch opened is still recognised"
    );
    assert!(proxy.triggered());
    assert!(matches!(
        latch.count_down().await,
        Err(Error::Refused { .. })
    ));
}
