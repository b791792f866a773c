//! Managed services: a server that blocks what ElastiCache, Memorystore and serverless offerings
//! block (`lockkit_testkit::Profile::ManagedService`: `CONFIG`, `DEBUG`, `SAVE`, `BGSAVE`, `WAIT`,
//! `SHUTDOWN`, `KEYS`, `REPLICAOF` renamed away, the `CLIENT` subcommands Memorystore lacks
//! denied), and a server that runs no Lua scripts.
//!
//! Every primitive works on the managed imitation (whole test files also run against it:
//! `scripts/test` sets `LOCKKIT_TEST_PROFILE=managed`); what needs a missing command is refused
//! when the client is built, in one line naming the command.

use std::time::Duration;

use lockkit::{Client, ConnectFailure, Error, ReplicaAck};
use lockkit_suite::{unique, within};
use lockkit_testkit::{Profile, RedisServer, ServerOptions};

const HANG: Duration = Duration::from_secs(30);

async fn server(profile: Profile) -> RedisServer {
    match RedisServer::start_with(ServerOptions::new().profile(profile)).await {
        Ok(server) => server,
        Err(err) => panic!("cannot start a {profile:?} server: {err}"),
    }
}

/// The imitation really blocks what it claims to: a test of the test server, so the others
/// cannot pass on a server that blocks nothing.
#[tokio::test]
async fn the_imitation_blocks_the_commands_a_managed_service_blocks() {
    let server = server(Profile::ManagedService).await;
    for args in [
        vec!["CONFIG", "GET", "maxmemory-policy"],
        vec!["WAIT", "0", "0"],
        vec!["KEYS", "*"],
        vec!["DEBUG", "SLEEP", "0"],
    ] {
        let reply = lockkit_testkit::send_command(server.addr(), &args)
            .await
            .unwrap();
        let refusal = reply.as_error().map(str::to_owned).unwrap_or_default();
        assert!(
            refusal.starts_with("ERR unknown command"),
            "{args:?} is blocked: {reply:?}"
        );
    }
    let reply = lockkit_testkit::send_command(server.addr(), &["CLIENT", "NO-EVICT", "on"])
        .await
        .unwrap();
    assert!(
        reply.as_error().is_some_and(|e| e.starts_with("NOPERM")),
        "CLIENT NO-EVICT is denied: {reply:?}"
    );
    // The kit keeps the operator's access.
    let reply = server
        .command(&["CONFIG", "GET", "maxmemory-policy"])
        .await
        .unwrap();
    assert!(reply.as_error().is_none(), "{reply:?}");
}

/// Every primitive, on a server with a managed service's restrictions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_works_on_a_managed_service_imitation() {
    let server = server(Profile::ManagedService).await;
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let name = unique("managed");
    within(HANG, "the primitives", async {
        // Lock: held, contended, handed over by the release message.
        let held = a.lock(&name).try_lock(Duration::ZERO, None).await.unwrap();
        let held = held.expect("a free lock is taken");
        let waiter = {
            let lock = b.lock(&name);
            tokio::spawn(async move { lock.try_lock(HANG, None).await })
        };
        lockkit_suite::until_waiting(&b, 1).await;
        held.unlock().await.unwrap();
        let got = waiter.await.unwrap().unwrap().expect("handed over");
        got.unlock().await.unwrap();

        // Fenced lock: tokens increase.
        let fenced = a.fenced_lock(&name);
        let first = fenced
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        let t1 = first.fencing_token();
        first.unlock().await.unwrap();
        let second = fenced
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        assert!(second.fencing_token() > t1);
        second.unlock().await.unwrap();

        // Fair lock, read-write lock, spin lock, multi-lock.
        let fair = a.fair_lock(&name).try_lock(Duration::ZERO, None).await;
        fair.unwrap().expect("free").unlock().await.unwrap();
        let rw = a.read_write_lock(&name);
        let r1 = rw
            .try_read_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        let r2 = b
            .read_write_lock(&name)
            .try_read_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .expect("readers share");
        r1.unlock().await.unwrap();
        r2.unlock().await.unwrap();
        let spin = a.spin_lock(&name).try_lock(Duration::ZERO, None).await;
        spin.unwrap().expect("free").unlock().await.unwrap();
        let multi = a
            .multi_lock([a.lock(format!("{name}-1")), a.lock(format!("{name}-2"))])
            .try_lock(Duration::ZERO, None)
            .await;
        multi.unwrap().expect("free").unlock().await.unwrap();

        // Semaphore, permit-expirable semaphore, latch.
        let semaphore = a.semaphore(&name);
        semaphore.try_set_permits(1).await.unwrap();
        let permit = semaphore
            .try_acquire(1, Duration::ZERO, None)
            .await
            .unwrap();
        let permit = permit.expect("one permit free");
        permit.release().await.unwrap();
        let expirable = a.permit_expirable_semaphore(&name);
        expirable.try_set_permits(1).await.unwrap();
        let permit = expirable
            .try_acquire(Duration::ZERO, Duration::from_secs(10))
            .await
            .unwrap()
            .expect("one permit free");
        permit.release().await.unwrap();
        let latch = a.count_down_latch(&name);
        latch.try_set_count(1).await.unwrap();
        latch.count_down().await.unwrap();
        assert!(latch.wait(Duration::ZERO).await.unwrap());
    })
    .await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The replica acknowledgement policy runs `WAIT` after every acquire: on a server without it,
/// building the client fails, naming `WAIT`; a client without the policy connects.
#[tokio::test]
async fn the_replica_policy_is_refused_when_the_client_is_built_without_wait() {
    let server = server(Profile::ManagedService).await;
    let refused = Client::builder()
        .url(server.url())
        .replica_ack(ReplicaAck::AtLeast(1), Duration::from_millis(100))
        .build()
        .await;
    match refused {
        Err(
            err @ Error::Connect {
                reason: ConnectFailure::NoWait,
                ..
            },
        ) => {
            let line = err.to_string();
            assert!(line.contains("`WAIT`"), "names the command: {line}");
            assert!(!line.contains('\n'), "one line: {line}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a client whose policy needs WAIT was built on a server without WAIT"),
    }
    let plain = Client::connect(&server.url()).await;
    plain.expect("without the policy the client connects");
}

/// A server that runs no Lua scripts: `connect` fails with one line saying so.
#[tokio::test]
async fn a_server_without_lua_is_refused_at_connect_in_one_line() {
    let server = server(Profile::NoScripting).await;
    match Client::connect(&server.url()).await {
        Err(
            err @ Error::Connect {
                reason: ConnectFailure::NoScripting,
                ..
            },
        ) => {
            let line = err.to_string();
            assert!(line.contains("runs no Lua scripts"), "{line}");
            assert!(!line.contains('\n'), "one line: {line}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("connected to a server that runs no Lua scripts"),
    }
}
