//! Connection faults: replies lost after the server ran a script, the server gone at connect and
//! while waiting.

use std::collections::HashMap;
use std::time::Duration;

use fred::interfaces::HashesInterface;
use lockkit::{ConnectFailure, Error};
use lockkit_suite::{client, client_with, lock_key, raw, spawned, unique, until_waiting, within};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(60);

async fn lock_hash(url: &str, name: &str) -> HashMap<String, String> {
    raw(url).await.hgetall(lock_key(name)).await.unwrap()
}

/// Takes and gives back another lock, so the scripts are cached on the server and the request
/// whose reply gets lost is the script itself, not a `NOSCRIPT` answer.
async fn warm_up(client: &lockkit::Client) {
    let guard = client.lock(unique("warm-up")).lock().await.unwrap();
    guard.unlock().await.unwrap();
}

/// The server runs the acquire, the reply never arrives and the connection drops; fred re-sends
/// the same request after reconnecting. The hold must be counted once.
#[tokio::test]
async fn an_acquire_replayed_after_a_lost_reply_counts_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    let name = unique("replay-acquire");
    warm_up(&holder).await;

    proxy.cut_after_request_containing(lock_key(&name));
    let guard = within(HANG, "acquire across a cut", holder.lock(&name).lock())
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(guard.hold_count(), 1);
    let fields = lock_hash(&server.url(), &name).await;
    assert_eq!(
        fields.len(),
        2,
        "one owner count and one marker: {fields:?}"
    );
    assert!(fields.values().any(|v| v == "1"), "{fields:?}");

    guard.unlock().await.unwrap();
    assert!(
        lock_hash(&server.url(), &name).await.is_empty(),
        "one release frees it"
    );
}

/// The server runs the release of one of two reentrant holds, the reply is lost. The retry must
/// not take away the other hold, and `unlock` must report success.
#[tokio::test]
async fn a_release_retried_after_a_lost_reply_releases_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    let name = unique("replay-release");
    warm_up(&holder).await;
    let lock = holder.lock(&name);
    let first = lock.lock().await.unwrap();
    let second = first.scope(lock.lock()).await.unwrap();
    assert_eq!(second.hold_count(), 2);

    proxy.cut_after_request_containing(lock_key(&name));
    within(HANG, "release across a cut", second.unlock())
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(
        lock.hold_count().await.unwrap(),
        1,
        "exactly one hold given back"
    );

    proxy.cut_after_request_containing(lock_key(&name));
    within(HANG, "last release across a cut", first.unlock())
        .await
        .unwrap();
    assert!(proxy.triggered());
    assert!(!lock.is_locked().await.unwrap());
}

/// The exact message of a refused connection (the README's quick start with no Redis running):
/// one sentence with the address and a hint, and no source that a reporter would print again.
fn assert_refused(result: Result<lockkit::Client, Error>, port: u16) {
    let err = match result {
        Err(err) => err,
        Ok(client) => panic!("connected to the closed port {port}: {client:?}"),
    };
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to 127.0.0.1:{port}: connection refused (is Redis running at that \
             address? it is the one in the URL this program gave lockkit)"
        )
    );
    assert!(
        matches!(
            &err,
            Error::Connect { addr, reason: ConnectFailure::Refused, .. } if *addr == format!("127.0.0.1:{port}")
        ),
        "{err:?}"
    );
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
}

#[tokio::test]
async fn connecting_to_a_closed_port_says_so_in_one_sentence() {
    // A free loopback port: bound, then released, so nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let result = within(
        HANG,
        "connect to a closed port",
        lockkit::Client::connect(url),
    )
    .await;
    assert_refused(result, port);
}

/// The release's reply is lost on every send: it is sent three times in all (each resend is safe,
/// the marker names the hold), then `unlock` reports the connection error rather than retrying
/// without bound. The first send ran, so the lock is free.
#[tokio::test]
async fn a_release_whose_reply_is_lost_on_every_send_gives_up_after_three_sends() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    // No watchdog round during the test (rounds every 20 minutes): only the release sends the
    // lock's key through the proxy.
    let holder = client_with(&proxy.url(), Duration::from_secs(3600)).await;
    let observer = client(&server.url()).await;
    let name = unique("release-gives-up");
    warm_up(&holder).await;
    let guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();

    proxy.cut_after_requests_containing(lock_key(&name), 3);
    let result = within(HANG, "a release across three cuts", guard.unlock()).await;
    assert!(matches!(result, Err(Error::Redis(_))), "{result:?}");
    assert_eq!(
        proxy.times_triggered(),
        3,
        "the release was sent three times"
    );
    assert!(!observer.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn connecting_to_a_server_that_is_down_fails_clearly() {
    let mut server = spawned().await;
    let url = server.url();
    let port = server.addr().port();
    server.kill();
    let result = within(
        HANG,
        "connect to a dead server",
        lockkit::Client::builder()
            .url(&url)
            .connect_timeout(Duration::from_millis(500))
            .build(),
    )
    .await;
    assert_refused(result, port);
}

#[tokio::test]
async fn a_server_that_dies_mid_wait_ends_the_wait_with_an_error() {
    let mut server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = lockkit::Client::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let name = unique("dies-mid-wait");
    let _guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_millis(800))
        .await
        .unwrap();
    let lock = waiter.lock(&name);
    let task = tokio::spawn(async move { lock.lock().await });
    until_waiting(&waiter, 1).await;
    server.kill();
    let result = within(HANG, "waiter on a dead server", task).await.unwrap();
    assert!(matches!(result, Err(Error::Redis(_))), "{result:?}");
}

#[tokio::test]
async fn a_wrong_password_is_refused_clearly() {
    let server = lockkit_testkit::RedisServer::start_with(
        lockkit_testkit::ServerOptions::new().args(["--requirepass", "s3cret"]),
    )
    .await
    .unwrap();
    let bad = format!("redis://:wrong@{}", server.addr());
    let result = within(
        HANG,
        "connect with a bad password",
        lockkit::Client::connect(bad),
    )
    .await;
    match &result {
        Err(
            err @ Error::Connect {
                reason: ConnectFailure::Auth,
                ..
            },
        ) => {
            let shown = err.to_string();
            assert!(shown.starts_with("cannot connect to 127.0.0.1:"), "{shown}");
            assert!(shown.contains("authentication failed"), "{shown}");
            assert!(!shown.contains("wrong"), "no password in errors: {shown}");
            // Redis' own reply is on the top line, and in no source (reporters show it once).
            assert!(shown.contains("WRONGPASS"), "{shown}");
            assert!(std::error::Error::source(err).is_none(), "{err:?}");
        }
        other => panic!("expected an authentication failure, got {other:?}"),
    }
    let good = format!("redis://:s3cret@{}", server.addr());
    let client = lockkit::Client::connect(good).await.unwrap();
    let name = unique("auth");
    let guard = client.lock(&name).lock().await.unwrap();
    guard.unlock().await.unwrap();
}

/// An unlock issued while Redis is unreachable and the client keeps failing to reconnect is not
/// lost: it completes once Redis is back, reports success, and frees the lock.
#[tokio::test]
async fn an_unlock_issued_while_redis_is_unreachable_completes_once_it_is_back() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    let observer = client(&server.url()).await;
    let name = unique("unlock-reconnect");
    let guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let accepted = proxy.total_connections();
    proxy.block(); // cut every connection and refuse new ones
                   // Wait until the client has tried to reconnect and been refused: it now has no connection.
    within(HANG, "a refused reconnect", async {
        while proxy.total_connections() <= accepted {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let unlock = tokio::spawn(guard.unlock());
    let refused = proxy.total_connections();
    within(HANG, "another refused reconnect", async {
        while proxy.total_connections() <= refused {
            tokio::task::yield_now().await;
        }
    })
    .await;
    proxy.unblock();
    within(HANG, "unlock across a reconnect", unlock)
        .await
        .unwrap()
        .unwrap();
    assert!(!observer.lock(&name).is_locked().await.unwrap());
}
