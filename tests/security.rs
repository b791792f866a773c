//! Security basics: TLS (`rediss://`) with certificates made at test time, AUTH with a password
//! and with an ACL user, key prefixes that isolate applications (down to an ACL user confined to
//! its prefix), and owner ids that no other client can guess.

use std::collections::HashSet;
use std::time::Duration;

use lockkit::{Client, ConnectFailure, Error};
use lockkit_suite::{unique, until_waiting, within};
use lockkit_testkit::{RedisServer, RespValue, ServerOptions, TestCertificates};

const HANG: Duration = Duration::from_secs(60);
/// A short watchdog timeout, so renewals run (and would be refused) within the tests.
const WATCHDOG: Duration = Duration::from_millis(300);

/// The smallest ACL that lets a user run every lockkit primitive, as documented in
/// `docs/security.md`: the script commands, the commands the scripts call, the inspection
/// commands, and pub/sub for waiting. Keys and channels are confined to the prefix.
///
/// Minimal: with any one rule left out, the test that uses it fails (checked by hand, one rule at
/// a time, when the list was written: each left-out command shows up as a refused script, a
/// refused subscription, a lost renewal, or an entry in `ACL LOG`).
const MINIMAL_ACL: &[&str] = &[
    "resetkeys",
    "~app1:*",
    "resetchannels",
    "&app1:*",
    "-@all",
    // lockkit itself: scripts, inspection, waiting.
    "+evalsha",
    "+eval",
    "+exists",
    "+hget",
    "+pttl",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    // called by the scripts.
    "+time",
    "+type",
    "+get",
    "+set",
    "+del",
    "+incr",
    "+decr",
    "+pexpire",
    "+pexpireat",
    "+hset",
    "+hsetnx",
    "+hdel",
    "+hexists",
    "+hgetall",
    "+hincrby",
    "+zadd",
    "+zrem",
    "+zscore",
    "+zrange",
    "+zrangebyscore",
    "+zremrangebyscore",
    "+rpush",
    "+lpop",
    "+lindex",
    "+lrem",
    "+publish",
];

async fn start(options: ServerOptions) -> RedisServer {
    match RedisServer::start_with(options).await {
        Ok(server) => server,
        Err(err) => panic!("cannot start redis-server: {err}"),
    }
}

async fn command(server: &RedisServer, args: &[&str]) -> RespValue {
    let reply = server.command(args).await.unwrap();
    assert!(!reply.is_error(), "{args:?}: {reply:?}");
    reply
}

/// The keys of the server matching `pattern`.
async fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let reply = command(server, &["KEYS", pattern]).await;
    reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|key| key.as_str().map(str::to_owned))
        .collect()
}

async fn build(builder: lockkit::ClientBuilder) -> Client {
    within(HANG, "connect", builder.build()).await.unwrap()
}

/// The refusal `result` must be, and its message with its sources (as a reporter shows it).
fn connect_error(result: Result<Client, Error>, expected: ConnectFailure) -> String {
    match result {
        Err(err @ Error::Connect { reason, .. }) if reason == expected => chain(&err),
        other => panic!("expected a connect error ({expected:?}), got {other:?}"),
    }
}

/// `err` and its sources, joined by `: `.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        line = format!("{line}: {cause}");
        source = cause.source();
    }
    line
}

// === TLS ===

fn tls_client(server: &RedisServer, certs: &TestCertificates) -> lockkit::ClientBuilder {
    Client::builder()
        .url(server.url())
        .tls_root_certificates_pem(certs.ca_pem().unwrap())
        .watchdog_timeout(WATCHDOG)
}

#[tokio::test]
async fn locks_renewals_and_waiting_work_over_tls() {
    let certs = TestCertificates::generate().unwrap();
    let server = start(ServerOptions::new().tls(&certs)).await;
    assert!(server.url().starts_with("rediss://"));
    let holder = build(tls_client(&server, &certs)).await;
    let waiter = build(tls_client(&server, &certs)).await;
    let name = unique("tls");

    let guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiter.lock(&name);
    let task = tokio::spawn(async move { lock.try_lock(HANG, None).await });
    until_waiting(&waiter, 1).await;
    // Several leases long: only renewals over TLS keep the hold.
    tokio::time::sleep(WATCHDOG * 4).await;
    assert!(!guard.is_lost());
    let key = format!("lockkit:lock:{{{name}}}");
    assert_eq!(
        command(&server, &["EXISTS", &key]).await,
        RespValue::Int(1),
        "the lock is in Redis, under its usual key"
    );
    guard.unlock().await.unwrap();
    // The release message reaches the waiter's subscriber connection, over TLS too.
    let next = within(HANG, "waiter after the release", task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    next.unlock().await.unwrap();
    assert_eq!(command(&server, &["EXISTS", &key]).await, RespValue::Int(0));
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_servers_certificate_is_refused_clearly() {
    let certs = TestCertificates::generate().unwrap();
    let other_ca = TestCertificates::generate().unwrap();
    let server = start(ServerOptions::new().tls(&certs)).await;
    let short = |builder: lockkit::ClientBuilder| {
        builder
            .url(server.url())
            .connect_timeout(Duration::from_secs(2))
    };

    // The system's roots (the default) do not include the test CA.
    let system = within(HANG, "connect", short(Client::builder()).build()).await;
    let shown = connect_error(system, ConnectFailure::Tls);
    assert!(shown.contains("certificate"), "{shown}");

    // Another CA does not vouch for this server either.
    let wrong = within(
        HANG,
        "connect",
        short(Client::builder())
            .tls_root_certificates_pem(other_ca.ca_pem().unwrap())
            .build(),
    )
    .await;
    let shown = connect_error(wrong, ConnectFailure::Tls);
    assert!(shown.contains("certificate"), "{shown}");

    // Plain text to a TLS port is refused, never answered in clear.
    let plain = within(
        HANG,
        "connect",
        Client::builder()
            .url(server.url().replacen("rediss", "redis", 1))
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await;
    connect_error(plain, ConnectFailure::Handshake);

    // The CA's own client is let in.
    let client = build(tls_client(&server, &certs)).await;
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_that_asks_for_client_certificates_admits_only_clients_with_one() {
    let certs = TestCertificates::generate().unwrap();
    let server = start(
        ServerOptions::new()
            .tls(&certs)
            .require_client_certificates(),
    )
    .await;
    let without = within(
        HANG,
        "connect",
        tls_client(&server, &certs)
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await;
    connect_error(without, ConnectFailure::Tls);

    let (chain, key) = certs.client_pem().unwrap();
    let client = build(tls_client(&server, &certs).tls_client_certificate_pem(chain, key)).await;
    let guard = client.lock(unique("mtls")).lock().await.unwrap();
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn bad_tls_settings_are_rejected_before_connecting() {
    let certs = TestCertificates::generate().unwrap();
    let ca = certs.ca_pem().unwrap();
    let (chain, key) = certs.client_pem().unwrap();
    // Nothing listens on port 1: each of these must fail before trying to connect.
    let url = "rediss://127.0.0.1:1";
    for (what, builder) in [
        (
            "TLS settings with a plain URL",
            Client::builder()
                .url("redis://127.0.0.1:1")
                .tls_root_certificates_pem(&ca),
        ),
        (
            "roots that are no certificate",
            Client::builder()
                .url(url)
                .tls_root_certificates_pem("not a certificate"),
        ),
        (
            "a truncated root",
            Client::builder()
                .url(url)
                .tls_root_certificates_pem(&ca[..ca.len() / 2]),
        ),
        (
            "a client certificate without a key",
            Client::builder()
                .url(url)
                .tls_root_certificates_pem(&ca)
                .tls_client_certificate_pem(&chain, ""),
        ),
        (
            "a client key that is a certificate",
            Client::builder()
                .url(url)
                .tls_root_certificates_pem(&ca)
                .tls_client_certificate_pem(&chain, &chain),
        ),
        (
            "a client certificate that is a key",
            Client::builder()
                .url(url)
                .tls_root_certificates_pem(&ca)
                .tls_client_certificate_pem(&key, &key),
        ),
    ] {
        match within(HANG, what, builder.build()).await {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("TLS"), "{what}: {msg}"),
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
    }
}

// === AUTH and ACL users ===

/// A server whose `default` user needs `admin-pw`, with the user `app1` (password `pw`) confined
/// to the `app1` prefix by [`MINIMAL_ACL`].
async fn acl_server() -> RedisServer {
    let server = start(ServerOptions::new().args(["--requirepass", "admin-pw"])).await;
    let mut setuser = vec!["ACL", "SETUSER", "app1", "reset", "on", ">pw"];
    setuser.extend_from_slice(MINIMAL_ACL);
    command(&server, &setuser).await;
    server
}

fn app1_url(server: &RedisServer) -> String {
    format!("redis://app1:pw@{}", server.addr())
}

async fn app1(server: &RedisServer, prefix: &str) -> Client {
    build(
        Client::builder()
            .url(app1_url(server))
            .key_prefix(prefix)
            .watchdog_timeout(WATCHDOG),
    )
    .await
}

/// The commands the ACL refused since the log was last reset, as `ACL LOG` shows them.
async fn acl_denials(server: &RedisServer) -> Vec<String> {
    let reply = command(server, &["ACL", "LOG"]).await;
    reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .map(|entry| format!("{entry:?}"))
        .collect()
}

#[tokio::test]
async fn passwords_and_acl_users_are_checked_at_connect() {
    let server = acl_server().await;
    let addr = server.addr();
    for url in [
        format!("redis://:wrong@{addr}"),
        format!("redis://{addr}"),
        format!("redis://app1:wrong@{addr}"),
        format!("redis://nobody:pw@{addr}"),
    ] {
        let result = within(
            HANG,
            "connect with bad credentials",
            Client::connect(url.clone()),
        )
        .await;
        let shown = connect_error(result, ConnectFailure::Auth);
        assert!(!shown.contains("wrong"), "no password in errors: {shown}");
    }
    // The password user (`default`) and the ACL user both get in.
    for url in [format!("redis://:admin-pw@{addr}"), app1_url(&server)] {
        let client = build(Client::builder().url(url).key_prefix("app1")).await;
        let guard = client.lock(unique("auth")).lock().await.unwrap();
        guard.unlock().await.unwrap();
    }
}

/// Runs every primitive through its whole life with `a` and `b` (clients of one application,
/// with the short watchdog timeout): holds in watchdog mode renewed for several leases, a waiter
/// in `b` for each (subscribed to its channel, woken by the release), inspection and
/// administration.
async fn exercise_every_primitive(a: &Client, b: &Client) {
    let n = unique("every");
    let name = |kind: &str| format!("{n}:{kind}");
    let sem = a.semaphore(name("sem"));
    sem.try_set_permits(1).await.unwrap();
    let psem = a.permit_expirable_semaphore(name("psem"));
    psem.try_set_permits(1).await.unwrap();
    let latch = a.count_down_latch(name("latch"));
    assert!(latch.try_set_count(1).await.unwrap());

    // `a` holds one of everything.
    let lock = a.lock(name("lock")).lock().await.unwrap();
    let fenced = a.fenced_lock(name("fenced")).lock().await.unwrap();
    assert!(fenced.fencing_token() > 0);
    let fair = a.fair_lock(name("fair")).lock().await.unwrap();
    let write = a.read_write_lock(name("rw")).write_lock().await.unwrap();
    let spin = a.spin_lock(name("spin")).lock().await.unwrap();
    let multi = a
        .multi_lock([a.lock(name("m1")), a.lock(name("m2"))])
        .lock()
        .await
        .unwrap();
    let permit = sem.acquire(1).await.unwrap();
    let expirable = psem.acquire(Duration::from_secs(30)).await.unwrap();

    // A waiter that gives up leaves the fair lock's queue (`fair_lock_cancel`).
    let gave_up = b
        .fair_lock(name("fair"))
        .try_lock(WATCHDOG, None)
        .await
        .unwrap();
    assert!(gave_up.is_none());

    // `b` waits for each; all but the spin lock wait on the object's channel.
    let mut waiters: Vec<tokio::task::JoinHandle<Result<(), Error>>> = Vec::new();
    let (bl, bf, bfair, brw) = (
        b.lock(name("lock")),
        b.fenced_lock(name("fenced")),
        b.fair_lock(name("fair")),
        b.read_write_lock(name("rw")),
    );
    let bmulti = b.multi_lock([b.lock(name("m1")), b.lock(name("m2"))]);
    let (bsem, bpsem, blatch) = (
        b.semaphore(name("sem")),
        b.permit_expirable_semaphore(name("psem")),
        b.count_down_latch(name("latch")),
    );
    let bspin = b.spin_lock(name("spin"));
    waiters.push(tokio::spawn(async move {
        bl.try_lock(HANG, None).await?.unwrap().unlock().await
    }));
    waiters.push(tokio::spawn(async move {
        bf.try_lock(HANG, None).await?.unwrap().unlock().await
    }));
    waiters.push(tokio::spawn(async move {
        bfair.try_lock(HANG, None).await?.unwrap().unlock().await
    }));
    waiters.push(tokio::spawn(async move {
        brw.try_read_lock(HANG, None).await?.unwrap().unlock().await
    }));
    waiters.push(tokio::spawn(async move {
        bmulti.try_lock(HANG, None).await?.unwrap().unlock().await
    }));
    waiters.push(tokio::spawn(async move {
        bsem.try_acquire(1, HANG, None)
            .await?
            .unwrap()
            .release()
            .await
    }));
    waiters.push(tokio::spawn(async move {
        bpsem
            .try_acquire(HANG, Duration::from_secs(30))
            .await?
            .unwrap()
            .release()
            .await
    }));
    waiters.push(tokio::spawn(async move {
        assert!(blatch.wait(HANG).await?, "the latch opened");
        Ok(())
    }));
    until_waiting(b, waiters.len()).await;
    waiters.push(tokio::spawn(async move {
        bspin.try_lock(HANG, None).await?.unwrap().unlock().await
    }));

    // Several leases long: only renewals keep the holds.
    tokio::time::sleep(WATCHDOG * 4).await;
    for guard in [&lock, &fenced, &fair, &write, &spin] {
        assert!(!guard.is_lost(), "{} renewed", guard.name());
    }
    assert!(!multi.is_lost() && !permit.is_lost() && !expirable.is_lost());

    // Inspection, while held.
    let a_lock = a.lock(name("lock"));
    assert!(a_lock.is_locked().await.unwrap());
    assert!(a_lock.remaining_ttl().await.unwrap().is_some());
    assert_eq!(a.fenced_lock(name("fenced")).hold_count().await.unwrap(), 1);
    assert!(a_lock.is_held_by_current_task().await.unwrap());
    assert!(!b
        .lock(name("lock"))
        .is_held_by_current_task()
        .await
        .unwrap());
    assert!(a.fair_lock(name("fair")).is_locked().await.unwrap());
    assert!(a
        .read_write_lock(name("rw"))
        .is_write_locked()
        .await
        .unwrap());
    assert!(a.spin_lock(name("spin")).is_locked().await.unwrap());
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    assert_eq!(latch.count().await.unwrap(), 1);

    // Releases hand every object over to its waiter in `b`.
    for guard in [lock, fenced.into(), fair, write, spin] {
        guard.unlock().await.unwrap();
    }
    multi.unlock().await.unwrap();
    permit.release().await.unwrap();
    expirable.release().await.unwrap();
    assert_eq!(latch.count_down().await.unwrap(), 0);
    for waiter in waiters {
        within(HANG, "a waiter after the release", waiter)
            .await
            .unwrap()
            .unwrap();
    }

    // Administration.
    let held = a.lock(name("lock")).lock().await.unwrap();
    assert!(a.lock(name("lock")).force_unlock().await.unwrap());
    assert!(matches!(held.unlock().await, Err(Error::NotHeld { .. })));
    for (force, what) in [
        (a.fenced_lock(name("fenced")).force_unlock().await, "fenced"),
        (a.fair_lock(name("fair")).force_unlock().await, "fair"),
        (a.read_write_lock(name("rw")).force_unlock().await, "rw"),
        (a.spin_lock(name("spin")).force_unlock().await, "spin"),
    ] {
        assert!(!force.unwrap(), "{what} was free");
    }
    assert_eq!(sem.add_permits(1).await.unwrap(), 2);
    let id = psem
        .acquire(Duration::from_secs(30))
        .await
        .unwrap()
        .into_id();
    assert!(psem
        .update_lease(&id, Duration::from_secs(60))
        .await
        .unwrap());
    psem.release(&id).await.unwrap();
    assert_eq!(psem.available_permits().await.unwrap(), 1);
}

#[tokio::test]
async fn an_acl_user_confined_to_its_prefix_runs_every_primitive_with_the_minimal_acl() {
    let server = acl_server().await;
    let a = app1(&server, "app1").await;
    let b = app1(&server, "app1").await;
    command(&server, &["ACL", "LOG", "RESET"]).await;
    exercise_every_primitive(&a, &b).await;
    assert_eq!(
        acl_denials(&server).await,
        Vec::<String>::new(),
        "nothing was refused"
    );
    assert!(
        keys(&server, "*")
            .await
            .iter()
            .all(|key| key.starts_with("app1:")),
        "every key is under the prefix"
    );
}

/// `result` is the refusal of a command on keys outside the user's patterns: `Error::Redis`
/// naming `operation`, with Redis' `NOPERM` text.
fn refused<T: std::fmt::Debug>(result: Result<T, Error>, operation: &str) {
    match result {
        Err(Error::Redis(err)) => {
            assert_eq!(err.operation(), operation, "{err}");
            assert!(chain(&err).contains("NOPERM"), "{err:?}");
        }
        other => panic!("{operation}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn an_acl_user_is_refused_outside_its_prefix_and_holds_nothing() {
    let server = acl_server().await;
    let intruder = app1(&server, "app2").await;
    let n = unique("outside");
    let name = |kind: &str| format!("{n}:{kind}");
    let (zero, long) = (Duration::ZERO, Duration::from_secs(5));
    for wait in [zero, long] {
        let lock = intruder.lock(name("lock"));
        refused(lock.try_lock(wait, None).await, "try_lock");
        let fenced = intruder.fenced_lock(name("fenced"));
        refused(fenced.try_lock(wait, None).await, "try_lock");
        let fair = intruder.fair_lock(name("fair"));
        refused(fair.try_lock(wait, None).await, "try_lock");
        let rw = intruder.read_write_lock(name("rw"));
        refused(rw.try_read_lock(wait, None).await, "try_read_lock");
        refused(rw.try_write_lock(wait, None).await, "try_write_lock");
        let spin = intruder.spin_lock(name("spin"));
        refused(spin.try_lock(wait, None).await, "try_lock");
        let multi = intruder.multi_lock([intruder.lock(name("m1")), intruder.lock(name("m2"))]);
        refused(multi.try_lock(wait, None).await, "try_lock");
        let sem = intruder.semaphore(name("sem"));
        refused(sem.try_acquire(1, wait, None).await, "try_acquire");
        let psem = intruder.permit_expirable_semaphore(name("psem"));
        refused(psem.try_acquire(wait, long).await, "try_acquire");
        let latch = intruder.count_down_latch(name("latch"));
        refused(latch.wait(wait).await, "wait");
    }
    let lock = intruder.lock(name("lock"));
    refused(lock.is_locked().await, "is_locked");
    refused(lock.hold_count().await, "hold_count");
    refused(lock.remaining_ttl().await, "remaining_ttl");
    refused(lock.force_unlock().await, "force_unlock");
    let sem = intruder.semaphore(name("sem"));
    refused(sem.try_set_permits(3).await, "try_set_permits");
    refused(sem.add_permits(3).await, "add_permits");
    refused(sem.available_permits().await, "available_permits");
    let latch = intruder.count_down_latch(name("latch"));
    refused(latch.try_set_count(3).await, "try_set_count");
    refused(latch.count_down().await, "count_down");

    assert_eq!(intruder.held_count(), 0);
    assert_eq!(intruder.waiting_count(), 0);
    assert_eq!(
        keys(&server, "*").await,
        Vec::<String>::new(),
        "nothing written"
    );
}

#[tokio::test]
async fn applications_with_different_prefixes_never_collide() {
    let server = start(ServerOptions::new()).await;
    let url = server.url();
    let app = |prefix: &'static str| {
        let url = url.clone();
        async move { build(Client::builder().url(url).key_prefix(prefix)).await }
    };
    let (one, two) = (app("app1").await, app("app2").await);
    let n = unique("shared-name");
    // Each application takes every primitive under the same name, at the same time.
    let mut guards = Vec::new();
    let mut permits = Vec::new();
    for client in [&one, &two] {
        let zero = Duration::ZERO;
        guards.push(client.lock(&n).try_lock(zero, None).await.unwrap().unwrap());
        let fenced = client.fenced_lock(&n).try_lock(zero, None).await.unwrap();
        guards.push(fenced.unwrap().into());
        guards.push(
            client
                .fair_lock(&n)
                .try_lock(zero, None)
                .await
                .unwrap()
                .unwrap(),
        );
        let rw = client.read_write_lock(&n);
        guards.push(rw.try_write_lock(zero, None).await.unwrap().unwrap());
        guards.push(
            client
                .spin_lock(&n)
                .try_lock(zero, None)
                .await
                .unwrap()
                .unwrap(),
        );
        let sem = client.semaphore(&n);
        assert!(
            sem.try_set_permits(1).await.unwrap(),
            "a semaphore of its own"
        );
        permits.push(sem.try_acquire(1, zero, None).await.unwrap().unwrap());
        let latch = client.count_down_latch(&n);
        assert!(latch.try_set_count(1).await.unwrap(), "a latch of its own");
    }
    assert_eq!(guards.len(), 10);
    for prefix in ["app1", "app2"] {
        let under = keys(&server, &format!("{prefix}:*")).await;
        // lock, fenced (+ token), fair, rwlock (+ expiries), spin, semaphore (+ leases), latch
        // (+ requests); the fair lock's queue keys exist only while someone waits.
        assert_eq!(under.len(), 11, "{prefix}: {under:?}");
        assert!(under.iter().all(|key| key.contains(&n)), "{under:?}");
    }
    assert_eq!(
        keys(&server, "*").await.len(),
        22,
        "nothing outside the prefixes"
    );
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    for permit in permits {
        permit.release().await.unwrap();
    }
}

// === Owner ids ===

#[tokio::test]
async fn client_ids_are_random_uuids_and_every_owner_id_carries_one() {
    let server = start(ServerOptions::new()).await;
    let clients: Vec<Client> =
        futures::future::join_all((0..16).map(|_| Client::connect(server.url())))
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
    let ids: HashSet<&str> = clients.iter().map(Client::id).collect();
    assert_eq!(
        ids.len(),
        clients.len(),
        "every client has an id of its own"
    );
    for id in &ids {
        // A UUID v4 in simple form: 32 lowercase hex digits, version 4, RFC 4122 variant; 122
        // of its 128 bits are random.
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        assert_eq!(&id[12..13], "4", "version 4: {id}");
        assert!(
            matches!(&id[16..17], "8" | "9" | "a" | "b"),
            "variant: {id}"
        );
    }

    // Every field of a held lock names its owner through the client id.
    let name = unique("owner");
    let holder = &clients[0];
    let guard = holder.lock(&name).lock().await.unwrap();
    let key = format!("lockkit:lock:{{{name}}}");
    let fields = command(&server, &["HKEYS", &key]).await;
    let fields: Vec<&str> = fields
        .as_array()
        .unwrap()
        .iter()
        .filter_map(RespValue::as_str)
        .collect();
    assert_eq!(
        fields.len(),
        2,
        "an owner count and a hold marker: {fields:?}"
    );
    for field in &fields {
        let id = field.trim_start_matches('#');
        assert!(id.starts_with(&format!("{}:", holder.id())), "{field}");
    }
    // Another client can neither count itself as an owner nor take it.
    let other = &clients[1];
    assert_eq!(other.lock(&name).hold_count().await.unwrap(), 0);
    assert!(other
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    guard.unlock().await.unwrap();
}

/// Redis 7 users get no channels unless given some (`acl-pubsub-default resetchannels`). A user
/// set up with keys but no channels never waits forever: its wait fails with the refused
/// subscription — or, when the client library loses Redis' refusal (fred does, now and then: the
/// subscription then looks confirmed), it re-checks at the end of the holder's lease, as after
/// any lost message. Its releases report the refused announcement.
#[tokio::test]
async fn a_user_without_channels_is_told_so_and_never_waits_forever() {
    let server = start(ServerOptions::new()).await;
    let setuser = [
        "ACL",
        "SETUSER",
        "app3",
        "on",
        ">pw",
        "~app3:*",
        "resetchannels",
        "+@all",
    ];
    command(&server, &setuser).await;
    let url = format!("redis://app3:pw@{}", server.addr());
    let holder = build(Client::builder().url(&url).key_prefix("app3")).await;
    let waiter = build(Client::builder().url(&url).key_prefix("app3")).await;
    let name = unique("no-channels");

    // A fixed lease: the one bound on a wait whose release message can never come.
    let lease = Duration::from_millis(500);
    let held = holder.lock(&name).lock_with_lease(lease).await.unwrap();
    let lock = waiter.lock(&name);
    let wait = within(
        HANG,
        "a wait that cannot subscribe",
        lock.try_lock(HANG, None),
    )
    .await;
    let late = match wait {
        Err(Error::Redis(err)) => {
            // The method called; the text says the subscription was refused (NOPERM).
            assert_eq!(err.operation(), "try_lock", "{err}");
            assert!(chain(&err).contains("NOPERM"), "{err:?}");
            None
        }
        Ok(Some(guard)) => {
            assert!(
                held.is_lost(),
                "acquired only after the holder's lease ran out"
            );
            Some(guard)
        }
        other => panic!("expected a refused subscription or a late acquire, got {other:?}"),
    };
    assert_eq!(waiter.waiting_count(), 0);

    // The release script announces the release on the channel and Redis refuses that PUBLISH:
    // the announcement is best effort (`redis.pcall`), so the release itself succeeds and the
    // lock is free; the misconfiguration shows where it bites, at the waiter's subscription.
    let release = match late {
        Some(guard) => {
            let stale = held.unlock().await;
            assert!(matches!(stale, Err(Error::NotHeld { .. })), "{stale:?}");
            guard.unlock().await
        }
        None => held.unlock().await,
    };
    assert!(release.is_ok(), "{release:?}");
    assert_eq!(holder.held_count() + waiter.held_count(), 0);
    assert_eq!(keys(&server, "*").await, Vec::<String>::new());
}

// === force_unlock ===

/// `force_unlock` ignores ownership: every primitive that has it says, in its docs, that it is an
/// administrative operation.
#[test]
fn every_force_unlock_is_documented_as_administrative() {
    let root = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/crates/lockkit/src"));
    // Every source file, in subdirectories (modules split into folders) too.
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    let mut found = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            if !line.contains("pub async fn force_unlock") {
                continue;
            }
            found += 1;
            let docs: Vec<&str> = lines[..at]
                .iter()
                .rev()
                .take_while(|l| l.trim_start().starts_with("///"))
                .copied()
                .collect();
            let docs = docs.join(" ");
            assert!(
                docs.contains("administrative operation"),
                "{}:{}: force_unlock's docs do not say it is administrative",
                path.display(),
                at + 1
            );
        }
    }
    assert!(found >= 5, "found {found} force_unlock methods");
}
