//! Closure helpers: `with_lock` / `try_with_lock` on `Lock`, `FencedLock` and `FairLock` run the
//! future under the lock and release it afterwards, whatever happens (return, lost lease, panic,
//! cancellation).

use std::time::Duration;

use lockkit::Error;
use lockkit_suite::{client, redis, unique, within};
use tokio::sync::oneshot;

const HANG: Duration = Duration::from_secs(60);
/// Far longer than any test takes: a lock that is not released in the background stays taken
/// for the whole wait below (watchdog mode keeps renewing it).
const LONG_WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn with_lock_runs_under_the_lock_and_releases_it() {
    let redis = redis().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("scoped-basic");
    let lock = a.lock(&name);
    let other = b.lock(&name);
    let out = lock
        .with_lock(|lease| {
            let other = other.clone();
            async move {
                assert!(!lease.is_lost());
                assert_eq!(lease.fencing_token(), None);
                // Exclusive while the closure runs: another client cannot take it.
                let taken = other.try_lock(Duration::ZERO, None).await.unwrap();
                assert!(taken.is_none(), "the lock must be held inside the closure");
                42
            }
        })
        .await
        .unwrap();
    assert_eq!(out, 42);
    assert!(
        !lock.is_locked().await.unwrap(),
        "released after the closure"
    );
}

#[tokio::test]
async fn try_with_lock_skips_the_closure_when_the_lock_is_taken() {
    let redis = redis().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("scoped-try");
    let held = b.lock(&name).lock().await.unwrap();
    let out = a
        .lock(&name)
        .try_with_lock(Duration::ZERO, None, |_| async { panic!("must not run") })
        .await
        .unwrap();
    assert_eq!(out, None::<()>);
    held.unlock().await.unwrap();
    let out = a
        .lock(&name)
        .try_with_lock(
            Duration::from_secs(5),
            Some(Duration::from_secs(30)),
            |_| async { "ran" },
        )
        .await
        .unwrap();
    assert_eq!(out, Some("ran"));
    assert!(!a.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn fenced_and_fair_locks_have_the_helpers_too() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("scoped-family");
    let fenced = client.fenced_lock(&name);
    let first = fenced
        .with_lock(|lease| async move { lease.fencing_token() })
        .await
        .unwrap()
        .expect("a fenced lock's lease carries a token");
    let second = fenced
        .try_with_lock(Duration::ZERO, None, |lease| async move {
            lease.fencing_token()
        })
        .await
        .unwrap()
        .flatten()
        .expect("a token");
    assert!(second > first, "{second} > {first}");
    assert!(!fenced.is_locked().await.unwrap());

    let fair = client.fair_lock(&name);
    let name_seen = fair
        .with_lock(|lease| async move { lease.name().to_owned() })
        .await
        .unwrap();
    assert_eq!(name_seen, name);
    assert!(!fair.is_locked().await.unwrap());
}

#[tokio::test]
async fn a_lease_lost_during_the_closure_is_an_error() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("scoped-lost");
    // A fixed lease that runs out while the closure waits for the lost-signal.
    let result = within(
        HANG,
        "closure waiting for its lease to end",
        client.lock(&name).try_with_lock(
            Duration::ZERO,
            Some(Duration::from_millis(50)),
            |lease| async move {
                lease.lost().await;
                assert!(lease.is_lost());
                "finished late"
            },
        ),
    )
    .await;
    assert!(
        matches!(&result, Err(Error::NotHeld { name: n }) if *n == name),
        "{result:?}"
    );

    // Force-unlocked by an administrator while the closure runs (watchdog mode).
    let name = unique("scoped-forced");
    let admin = client.lock(&name);
    let result = within(
        HANG,
        "closure of a force-unlocked lock",
        client.lock(&name).with_lock(|_lease| async move {
            assert!(admin.force_unlock().await.unwrap());
        }),
    )
    .await;
    assert!(matches!(result, Err(Error::NotHeld { .. })), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_closure_releases_the_lock() {
    let redis = redis().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("scoped-panic");
    let lock = a.lock(&name);
    let task = tokio::spawn(async move {
        lock.with_lock(|_| async { panic!("the critical section failed") })
            .await
    });
    let joined = within(HANG, "the panicking task", task).await;
    assert!(joined.is_err_and(|err| err.is_panic()));
    // The guard was dropped during the unwind: released in the background, so another client
    // gets the lock long before a watchdog-mode lease could run out.
    let guard = within(
        HANG,
        "acquire after the panic",
        b.lock(&name).try_lock(LONG_WAIT, None),
    )
    .await
    .unwrap();
    assert!(guard.is_some(), "the lock must be free after the panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_closure_releases_the_lock() {
    let redis = redis().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("scoped-cancel");
    let lock = a.lock(&name);
    let (inside_tx, inside_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        lock.with_lock(|_| async move {
            let _ = inside_tx.send(());
            std::future::pending::<()>().await;
        })
        .await
    });
    within(HANG, "the closure to start", inside_rx)
        .await
        .unwrap();
    assert!(b.lock(&name).is_locked().await.unwrap());
    task.abort();
    assert!(within(HANG, "the aborted task", task)
        .await
        .is_err_and(|err| err.is_cancelled()));
    let guard = within(
        HANG,
        "acquire after the cancellation",
        b.lock(&name).try_lock(LONG_WAIT, None),
    )
    .await
    .unwrap();
    assert!(
        guard.is_some(),
        "the lock must be free after the cancellation"
    );
}
