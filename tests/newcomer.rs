//! What a new user tripped over (issue 21, section 4): error lines that carry their cause,
//! wrong settings refused, `inspect` telling about every kind's waiters and the eviction policy.

use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit::{Client, ConnectFailure, Error, Inspection};
use lockkit_suite::{spawned, unique, until_waiting, within};
use lockkit_testkit::{RedisServer, ServerOptions};

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
    let result = within(
        HANG,
        "connect with a needless password",
        Client::connect(url),
    )
    .await;
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
    assert!(
        !shown.contains("wrongpass"),
        "no password in errors: {shown}"
    );
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
    assert!(
        operation.starts_with("redis error during try_acquire of `outage:"),
        "{shown}"
    );
    // Killed: nothing listens at its port, and the text says so before the bound that ran out.
    let addr = server.url().trim_start_matches("redis://").to_owned();
    assert!(
        cause.starts_with(&format!(
            "connection refused by {addr} (reconnecting); no answer from Redis within "
        )),
        "{shown}"
    );
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
    let lost: Vec<&String> = seen
        .iter()
        .filter(|event| event.contains("lease lost"))
        .collect();
    assert_eq!(lost.len(), 1, "{seen:?}");
    assert!(lost[0].contains("its fixed lease ran out"), "{seen:?}");
    assert!(!lost[0].contains("renewed before"), "{seen:?}");
    assert!(!lost[0].contains("could not be renewed"), "{seen:?}");
}

/// Polls `client.inspect` of `kind` `name` until `done` holds of the inspection, and returns it.
async fn inspected_until(
    client: &Client,
    kind: Kind,
    name: &str,
    what: &str,
    done: impl Fn(&Inspection) -> bool,
) -> Inspection {
    within(HANG, what, async {
        loop {
            let found = client.inspect(Some(kind), name).await.unwrap();
            if let Some(object) = found.into_iter().next().filter(|object| done(object)) {
                return object;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

/// `inspect` used to show no waiters for a semaphore with 28 waiting tasks. Every kind now says
/// what can be known: a lock and a semaphore list their waiters (issue 28: a semaphore's stand
/// in a line in Redis); a read-write lock and a latch, whose waiters Redis does not keep, say so
/// and count the clients waiting on their channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tells_of_the_waiters_of_every_kind() {
    let server = spawned().await;
    let url = server.url();
    let observer = lockkit_suite::client(&url).await;
    let pods = [
        lockkit_suite::client(&url).await,
        lockkit_suite::client(&url).await,
    ];

    // A semaphore whose one permit is held, and 28 tasks waiting in two clients.
    let name = unique("gpus");
    let semaphore = observer.semaphore(&name);
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let held = semaphore.acquire(1).await.unwrap();
    let mut waiting = Vec::new();
    for pod in &pods {
        for _ in 0..14 {
            let semaphore = pod.semaphore(&name);
            waiting.push(tokio::spawn(async move {
                let permit = semaphore.acquire(1).await?;
                permit.release().await
            }));
        }
        until_waiting(pod, 14).await;
    }
    // Issue 28: a semaphore's waiters stand in a line in Redis, listed head first.
    let gpus = inspected_until(&observer, Kind::Semaphore, &name, "28 waiting calls", |o| {
        o.waiters.len() == 28
    })
    .await;
    assert!(gpus.waiters_listed, "{gpus:?}");
    assert!(
        gpus.waiters.iter().all(|w| w.ends_with(" for 1")),
        "{gpus:?}"
    );
    assert_eq!(gpus.waiting_clients, None, "{gpus:?}");
    held.release().await.unwrap();
    for task in waiting {
        within(HANG, "the waiting tasks", task)
            .await
            .unwrap()
            .unwrap();
    }

    // A read-write lock held for writing, a reader waiting in another client.
    let name = unique("config");
    let writer = observer.read_write_lock(&name).write_lock().await.unwrap();
    let rw = pods[0].read_write_lock(&name);
    let reader = tokio::spawn(async move { rw.read_lock().await?.unlock().await });
    let config = inspected_until(
        &observer,
        Kind::ReadWriteLock,
        &name,
        "a waiting reader",
        |o| o.waiters.len() == 1,
    )
    .await;
    assert!(config.waiters_listed, "{config:?}");
    assert!(config.waiters[0].ends_with(" for read"), "{config:?}");
    assert_eq!(config.waiting_clients, None, "{config:?}");
    writer.unlock().await.unwrap();
    within(HANG, "the reader", reader).await.unwrap().unwrap();

    // A latch at 1, awaited in another client.
    let name = unique("boot");
    let latch = observer.count_down_latch(&name);
    assert!(latch.try_set_count(1).await.unwrap());
    let awaited = pods[1].count_down_latch(&name);
    let awaiting = tokio::spawn(async move { awaited.wait(HANG).await });
    let boot = inspected_until(
        &observer,
        Kind::CountDownLatch,
        &name,
        "a waiting task",
        |o| o.waiting_clients == Some(1),
    )
    .await;
    assert!(!boot.waiters_listed, "{boot:?}");
    latch.count_down().await.unwrap();
    assert!(within(HANG, "the latch", awaiting).await.unwrap().unwrap());

    // A lock lists its waiters, one entry per waiting call.
    let name = unique("order");
    let guard = observer.lock(&name).lock().await.unwrap();
    let lock = pods[0].lock(&name);
    let queued = tokio::spawn(async move { lock.lock().await?.unlock().await });
    let order = inspected_until(&observer, Kind::Lock, &name, "a listed waiter", |o| {
        o.waiters.len() == 1
    })
    .await;
    assert!(order.waiters_listed, "{order:?}");
    assert_eq!(order.waiting_clients, None, "{order:?}");
    guard.unlock().await.unwrap();
    within(HANG, "the queued lock", queued)
        .await
        .unwrap()
        .unwrap();
}

/// A semaphore on a server whose `maxmemory-policy` may evict its keys, where `CONFIG` is
/// renamed away (as managed services block it): the policy is read from `INFO memory`, and the
/// risk is still flagged. Where `INFO` is refused too, the inspection says that it could not read
/// the policy, naming both commands.
#[tokio::test]
async fn inspect_reads_the_eviction_policy_without_config_or_says_it_cannot() {
    let options = ServerOptions::new().args([
        "--rename-command",
        "CONFIG",
        "",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    let server = RedisServer::start_with(options).await.unwrap();
    let client = lockkit_suite::client(&server.url()).await;
    let name = unique("exports");
    assert!(client.semaphore(&name).try_set_permits(2).await.unwrap());
    let found = client.inspect(Some(Kind::Semaphore), &name).await.unwrap();
    let warnings = &found[0].warnings;
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("maxmemory-policy is allkeys-lru")),
        "{warnings:?}"
    );

    // Neither CONFIG nor INFO: the default user may run neither.
    let server = spawned().await;
    server
        .command(&["ACL", "SETUSER", "default", "-config", "-info"])
        .await
        .unwrap();
    let client = lockkit_suite::client(&server.url()).await;
    assert!(client.semaphore(&name).try_set_permits(2).await.unwrap());
    let found = client.inspect(Some(Kind::Semaphore), &name).await.unwrap();
    let unread: Vec<&String> = found[0]
        .warnings
        .iter()
        .filter(|w| w.starts_with("could not read the server's maxmemory-policy"))
        .collect();
    assert_eq!(unread.len(), 1, "{:?}", found[0].warnings);
    assert!(
        unread[0].contains("CONFIG GET maxmemory-policy failed (NOPERM"),
        "{unread:?}"
    );
    assert!(
        unread[0].contains("INFO memory failed (NOPERM"),
        "{unread:?}"
    );
}

/// The warnings that fred writes through the `log` crate (lockkit's own go through `tracing`).
#[derive(Clone, Default)]
struct LogWarnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl log::Log for LogWarnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = format!("{}: {}", record.target(), record.args());
            self.0
                .lock()
                .unwrap_or_else(|err| err.into_inner())
                .push(line);
        }
    }
    fn flush(&self) {}
}

/// A failed connect leaves nothing to log: with a subscriber installed (as the quick start
/// does, which also shows `log` records), the only word of a refused connection is the error
/// itself, not fred's warning about closing a connection that had already stopped.
#[tokio::test]
async fn a_refused_connect_logs_no_warning_beside_its_error() {
    let warnings = lockkit_suite::Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    // The logger is global; no other test of this binary sets one.
    let logged = LogWarnings::default();
    log::set_boxed_logger(Box::new(logged.clone())).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let result = within(HANG, "a refused connect", Client::connect(url)).await;
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::Refused,
                ..
            })
        ),
        "{result:?}"
    );
    // This runtime has one thread: yielding once runs every task the connect spawned that is
    // ready, as a background close of its connections would be.
    tokio::task::yield_now().await;
    assert_eq!(warnings.take(), Vec::<String>::new());
    // Only fred's close-after-stop warning: under `cargo test`, other tests of this binary share
    // the logger (and their outages make fred warn about reconnects).
    let closed_twice: Vec<String> = logged
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains("already stopped"))
        .cloned()
        .collect();
    assert_eq!(closed_twice, Vec::<String>::new());
}

/// On a cluster, a semaphore's waiting call is listed from its line (issue 28: the line is kept in
/// Redis, in the semaphore's slot), whatever the pub/sub mode; no subscribers are counted. (Until
/// issue 28 this counted the waiting clients on the shard of the semaphore's channel: waiters
/// subscribed to it then.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_a_semaphore_s_waiting_clients_on_a_cluster() {
    let cluster = lockkit_testkit::RedisCluster::start(3, 0)
        .await
        .unwrap_or_else(|err| panic!("cannot start a redis cluster: {err}"));
    let url = cluster.url();
    let observer = Client::connect(&url).await.unwrap();
    let pod = Client::connect(&url).await.unwrap();
    let name = unique("cluster-gpus");
    let semaphore = observer.semaphore(&name);
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let held = semaphore.acquire(1).await.unwrap();
    let waiting = pod.semaphore(&name);
    let waiter = tokio::spawn(async move { waiting.acquire(1).await?.release().await });
    until_waiting(&pod, 1).await;
    inspected_until(&observer, Kind::Semaphore, &name, "one waiting call", |o| {
        o.waiters.len() == 1 && o.waiting_clients.is_none()
    })
    .await;
    held.release().await.unwrap();
    within(HANG, "the waiter", waiter).await.unwrap().unwrap();
}
