//! Leases: the watchdog keeps a lock alive; a fixed lease ends; a lost lease is reported.

use std::time::Duration;

use lockkit::Error;
use lockkit_suite::{client, client_with, spawned, unique, within};

const HANG: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_millis(300);

#[tokio::test]
async fn the_watchdog_keeps_a_lock_well_past_its_timeout() {
    let redis = spawned().await;
    let holder = client_with(&redis.url(), TIMEOUT).await;
    let other = client(&redis.url()).await;
    let name = unique("watchdog");
    let guard = holder.lock(&name).lock().await.unwrap();
    assert!(guard.is_watchdog());
    // Hold for ten lease lengths: without renewal the key would be gone after the first.
    tokio::time::sleep(TIMEOUT * 10).await;
    assert!(!guard.is_lost());
    assert!(other
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    let ttl = other.lock(&name).remaining_ttl().await.unwrap().unwrap();
    assert!(
        ttl <= TIMEOUT,
        "renewed to the watchdog timeout, not beyond: {ttl:?}"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_fixed_lease_is_not_renewed_and_ends() {
    let redis = spawned().await;
    let holder = client_with(&redis.url(), TIMEOUT).await;
    let waiter = client(&redis.url()).await;
    let name = unique("fixed");
    let lease = Duration::from_millis(400);
    let guard = holder.lock(&name).lock_with_lease(lease).await.unwrap();
    assert!(!guard.is_watchdog());
    // The holder keeps its guard; only the end of the lease can let the waiter in.
    let got = within(HANG, "acquire after the lease", waiter.lock(&name).lock())
        .await
        .unwrap();
    assert!(guard.is_lost(), "the holder knows its lease ended");
    got.unlock().await.unwrap();
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn a_restart_that_loses_every_lock_is_reported_and_the_client_recovers() {
    let mut redis = spawned().await;
    let holder = client_with(&redis.url(), TIMEOUT).await;
    let names: Vec<String> = (0..3).map(|_| unique("restart")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(holder.lock(name).lock().await.unwrap());
    }
    redis.restart_empty().await.unwrap();
    for guard in &guards {
        within(HANG, "lost signal after a restart", guard.lost()).await;
        assert!(guard.is_lost());
    }
    // The same client, without a restart of its own, takes locks again.
    let again = within(HANG, "acquire after restart", holder.lock(&names[0]).lock())
        .await
        .unwrap();
    assert!(!again.is_lost());
    again.unlock().await.unwrap();
    for guard in guards {
        assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    }
}
