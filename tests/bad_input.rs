//! Bad input gets a clear error: never a panic, a hang, or a hold left behind.

use std::time::Duration;

use fred::interfaces::KeysInterface;
use lockkit::{Client, Error, MAX_LEASE};
use lockkit_suite::{client, lock_key, raw, redis, unique};

fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn zero_and_absurd_leases_are_rejected() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("lease"));
    assert!(invalid(lock.try_lock(Duration::ZERO, Some(Duration::ZERO)).await).contains("lease"));
    assert!(invalid(lock.lock_with_lease(Duration::MAX).await).contains("lease"));
    invalid(
        lock.try_lock(Duration::ZERO, Some(MAX_LEASE + Duration::from_secs(1)))
            .await,
    );
    assert!(!lock.is_locked().await.unwrap(), "nothing was taken");
}

#[tokio::test]
async fn a_huge_wait_means_no_bound_not_an_overflow() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let guard = client
        .lock(unique("wait"))
        .try_lock(Duration::MAX, None)
        .await
        .unwrap();
    assert!(guard.is_some());
}

#[tokio::test]
async fn empty_and_overlong_names_are_rejected() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    assert!(invalid(client.lock("").lock().await).contains("empty"));
    let long = "x".repeat(lockkit::protocol::keys::MAX_NAME_LEN + 1);
    invalid(client.lock(long).try_lock(Duration::ZERO, None).await);
    invalid(client.lock("").is_locked().await);
    invalid(client.lock("").force_unlock().await);
}

#[tokio::test]
async fn names_with_braces_and_binary_bytes_work() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    for base in ["{", "}", "a{}b", "cart:{user42}", "nul\0byte", "ünïcødé 🔒"] {
        let name = format!("{base}{}", unique(""));
        let guard = client
            .lock(&name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        assert!(other
            .lock(&name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        guard.unlock().await.unwrap();
        assert!(!other.lock(&name).is_locked().await.unwrap(), "{name:?}");
    }
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_reported_not_clobbered() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("wrongtype");
    let store = raw(&redis.url()).await;
    let _: () = store
        .set(lock_key(&name), "not a lock", None, None, false)
        .await
        .unwrap();
    let lock = client.lock(&name);
    let err = lock.try_lock(Duration::ZERO, None).await.unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key, .. } if *key == lock_key(&name)),
        "{err:?}"
    );
    assert!(matches!(
        lock.hold_count().await,
        Err(Error::WrongType { .. })
    ));
    let value: String = store.get(lock_key(&name)).await.unwrap();
    assert_eq!(value, "not a lock", "the foreign value is untouched");
    assert_eq!(client.held_count(), 0);
}

#[tokio::test]
async fn bad_client_settings_are_rejected_before_connecting() {
    for builder in [
        Client::builder().watchdog_timeout(Duration::ZERO),
        Client::builder().watchdog_timeout(Duration::from_millis(10)),
        Client::builder().watchdog_timeout(Duration::MAX),
        Client::builder().command_timeout(Duration::ZERO),
        Client::builder().renew_batch_size(0),
        Client::builder().key_prefix(""),
        Client::builder().key_prefix("a{b}"),
        Client::builder().url("not a url"),
        Client::builder().url("http://127.0.0.1:6379"),
    ] {
        let shown = format!("{builder:?}");
        match builder.build().await {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("{shown}: expected InvalidArgument, got {other:?}"),
        }
    }
}
