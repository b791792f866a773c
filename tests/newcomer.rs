//! What a new user tripped over (issue 21, section 4): error lines that carry their cause,
//! wrong settings refused, `inspect` telling about every kind's waiters and the eviction policy.

use std::time::Duration;

use lockkit::{Client, ConnectFailure, Error};
use lockkit_suite::{spawned, unique, within};

/// Bound on any step that must not hang.
const HANG: Duration = Duration::from_secs(30);

/// `redis://…/99` names a database the server does not have: the top line carries Redis' own
/// reply, and no source repeats it.
#[tokio::test]
async fn a_missing_database_is_named_on_the_error_s_top_line() {
    let server = spawned().await;
    let url = format!("{}/99", server.url());
    let result = within(HANG, "connect to DB 99", Client::connect(url)).await;
    let err = match result {
        Err(err) => err,
        Ok(client) => panic!("connected to DB 99: {client:?}"),
    };
    let shown = err.to_string();
    assert!(shown.contains("ERR DB index is out of range"), "{shown}");
    assert!(
        matches!(
            err,
            Error::Connect {
                reason: ConnectFailure::Handshake,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
}

/// A password in the URL for a server that has none is a configuration error, refused when the
/// client is built.
#[tokio::test]
async fn a_password_for_a_server_without_one_is_refused() {
    let server = spawned().await;
    assert!(server.password().is_none());
    let url = format!("redis://:wrongpass@{}", server.addr());
    let result = within(HANG, "connect with a needless password", Client::connect(url)).await;
    let err = match result {
        Err(err) => err,
        Ok(client) => panic!("connected with a password the server does not have: {client:?}"),
    };
    let shown = err.to_string();
    assert!(
        matches!(
            err,
            Error::Connect {
                reason: ConnectFailure::Auth,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(shown.contains("the server asks for none"), "{shown}");
    assert!(!shown.contains("wrongpass"), "no password in errors: {shown}");
}

/// During an outage the error's top line says why (the connection refused or broken, or no
/// answer in time), not only which operation failed.
#[tokio::test]
async fn an_outage_s_error_carries_its_cause_on_its_top_line() {
    let mut server = spawned().await;
    let client = lockkit_suite::client(&server.url()).await;
    let semaphore = client.semaphore(unique("outage"));
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let _held = semaphore.acquire(1).await.unwrap();
    server.kill();
    let wait = Duration::from_secs(1);
    let attempt = semaphore.try_acquire(1, wait, None);
    let result = within(HANG, "an acquire during the outage", attempt).await;
    let err = match result {
        Err(err) => err,
        Ok(permit) => panic!("acquired during an outage: {permit:?}"),
    };
    let shown = err.to_string();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
    let (operation, cause) = shown
        .split_once(": ")
        .unwrap_or_else(|| panic!("no cause: {shown}"));
    assert!(operation.starts_with("redis error during acquire of `outage:"), "{shown}");
    assert!(cause.starts_with("no answer from Redis within 1.0s"), "{shown}");
}

/// A fixed lease that runs out is reported lost with a message of its own: fixed leases are
/// never renewed, so "could not be renewed" would send the reader looking at the watchdog.
#[tokio::test]
async fn a_fixed_lease_that_ran_out_is_not_said_to_be_unrenewed() {
    let warnings = lockkit_suite::Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    let server = spawned().await;
    let client = lockkit_suite::client(&server.url()).await;
    let guard = client
        .lock(unique("fixed-lease"))
        .lock_with_lease(Duration::from_millis(100))
        .await
        .unwrap();
    within(HANG, "the fixed lease to run out", guard.lost()).await;
    let seen = warnings.take();
    let lost: Vec<&String> = seen.iter().filter(|event| event.contains("lease lost")).collect();
    assert_eq!(lost.len(), 1, "{seen:?}");
    assert!(lost[0].contains("its fixed lease ran out"), "{seen:?}");
    assert!(!lost[0].contains("renewed before"), "{seen:?}");
    assert!(!lost[0].contains("could not be renewed"), "{seen:?}");
}
