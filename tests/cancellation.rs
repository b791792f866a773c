//! Dropping futures at any point leaves nothing held.

use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit_suite::{client, redis, spawned, unique, within};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_cancelled_waiter_leaves_no_registration_and_no_hold() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let name = unique("cancel-wait");
    let guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiter.lock(&name);
    let result = tokio::time::timeout(Duration::from_millis(200), lock.lock()).await;
    assert!(result.is_err(), "still waiting when cancelled");
    assert_eq!(waiter.waiting_count(), 0);
    // The request leaves the waiting set in the background.
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 0).await;
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "granted to nobody");
    assert_eq!(waiter.held_count(), 0);
}

/// A release that comes before the cancelled waiter's request has left grants the lock to that
/// request (its client still listens); the request's leaving then gives the grant back at once,
/// long before the grant's probation (5 s) or the lease (30 s) would end it.
#[tokio::test]
async fn a_grant_to_a_cancelled_waiter_is_given_back_at_once() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let next = client(&redis.url()).await;
    let name = unique("cancel-granted");
    let guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiter.lock(&name);
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    lockkit_suite::until_waiting(&waiter, 1).await;
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 1).await;
    // Cancel the wait and release at once: the release may reach Redis before the cancel does.
    waiting.abort();
    let (unlocked, _) = tokio::join!(guard.unlock(), async { waiting.await.ok() });
    unlocked.unwrap();
    // Whichever came first, the lock ends up free: `next` takes it with a zero wait once it is.
    let got = within(HANG, "the lock to be free again", async {
        loop {
            if let Some(guard) = next
                .lock(&name)
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
            {
                return guard;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(waiter.held_count(), 0);
    got.unlock().await.unwrap();
}

/// The acquire script is on its way (held back by a paused proxy) when the future is dropped.
/// Once the proxy lets it through, the script takes the lock; the drop guard must give it back.
#[tokio::test]
async fn an_acquire_dropped_in_flight_gives_back_what_the_script_took() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let cancelled = client(&proxy.url()).await;
    let observer = client(&server.url()).await;
    let name = unique("cancel-acquire");

    proxy.pause();
    let lock = cancelled.lock(&name);
    let attempt = tokio::time::timeout(
        Duration::from_millis(200),
        lock.try_lock(Duration::ZERO, Some(Duration::from_secs(60))),
    )
    .await;
    assert!(
        attempt.is_err(),
        "the acquire could not complete through a paused proxy"
    );
    proxy.resume();

    // The 60 s lease would outlast this wait: only the background release frees it in time.
    let got = within(
        HANG,
        "acquire after the cancelled one",
        observer.lock(&name).try_lock(Duration::from_secs(30), None),
    )
    .await
    .unwrap();
    assert!(got.is_some(), "the cancelled acquire's hold was given back");
}

#[tokio::test]
async fn an_unlock_dropped_in_flight_still_releases() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    let observer = client(&server.url()).await;
    let name = unique("cancel-unlock");
    let guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    proxy.pause();
    let unlock = tokio::time::timeout(Duration::from_millis(200), guard.unlock()).await;
    assert!(
        unlock.is_err(),
        "the unlock could not complete through a paused proxy"
    );
    proxy.resume();
    let got = within(
        HANG,
        "acquire after the cancelled unlock",
        observer.lock(&name).try_lock(Duration::from_secs(30), None),
    )
    .await
    .unwrap();
    assert!(got.is_some());
}
