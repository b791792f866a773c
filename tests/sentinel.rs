//! Sentinel-managed Redis: connecting through sentinels, failover while locks are held, and the
//! replica acknowledgement policy. Real processes: one primary, one replica, three sentinels per
//! test.

use std::time::{Duration, Instant};

use lockkit::{Client, ConnectFailure, Error, ReplicaAck};
use lockkit_suite::{lock_key, unique, until_waiting, within};
use lockkit_testkit::{RedisSentinelGroup, RespValue};

/// Hang guard of one step (a failover takes a few seconds here); never a performance claim.
const HANG: Duration = Duration::from_secs(60);
/// Long enough that no watchdog-mode lease runs out during a failover (which would lose the lock
/// for a reason other than replication), short enough to be renewed several times per test.
const WATCHDOG: Duration = Duration::from_secs(20);

async fn group() -> RedisSentinelGroup {
    match RedisSentinelGroup::start(1, 3).await {
        Ok(group) => group,
        Err(err) => panic!("cannot start a sentinel group: {err}"),
    }
}

async fn client(url: &str, ack: ReplicaAck) -> Client {
    match Client::builder()
        .url(url)
        .watchdog_timeout(WATCHDOG)
        .replica_ack(ack, Duration::from_secs(2))
        .build()
        .await
    {
        Ok(client) => client,
        Err(err) => panic!("cannot connect to {url}: {err}"),
    }
}

/// Whether `key` exists on `server`.
async fn exists(server: &lockkit_testkit::RedisServer, key: &str) -> bool {
    match server.command(&["EXISTS", key]).await {
        Ok(RespValue::Int(n)) => n == 1,
        other => panic!("EXISTS {key}: {other:?}"),
    }
}

#[tokio::test]
async fn connects_through_sentinels_and_keeps_working_after_a_forced_failover() {
    let mut group = group().await;
    let client = client(&group.url(), ReplicaAck::None).await;
    let name = unique("sentinel-basic");
    let lock = client.lock(&name);

    let guard = lock.lock().await.unwrap();
    assert!(exists(group.primary(), &lock_key(&name)).await);
    guard.unlock().await.unwrap();

    let old = group.primary().port();
    let started = Instant::now();
    let new = within(HANG, "failover", group.failover()).await.unwrap();
    println!(
        "forced failover (SENTINEL FAILOVER until the old primary is a replica): {:?}",
        started.elapsed()
    );
    assert_ne!(old, new);

    // The same client, without a restart, now locks on the new primary.
    let guard = within(HANG, "lock after the failover", lock.lock())
        .await
        .unwrap();
    assert_eq!(group.primary().port(), new);
    assert!(exists(group.primary(), &lock_key(&name)).await);
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn failover_loses_unreplicated_locks_and_keeps_acknowledged_ones() {
    let mut group = group().await;
    let url = group.url();
    let acked = client(&url, ReplicaAck::AtLeast(1)).await;
    let plain = client(&url, ReplicaAck::None).await;
    let waiter = client(&url, ReplicaAck::None).await;

    // Acknowledged by the replica before anything goes wrong.
    let survivor_name = unique("survivor");
    let survivor = acked.lock(&survivor_name).lock().await.unwrap();
    // A fixed lease far longer than the test: the waiter below can only get it early through a
    // release notification, not by the lease running out.
    let handoff_name = unique("handoff");
    let handoff = acked
        .lock(&handoff_name)
        .lock_with_lease(Duration::from_secs(300))
        .await
        .unwrap();
    let waiting = {
        let lock = waiter.lock(&handoff_name);
        tokio::spawn(async move { lock.lock().await })
    };
    until_waiting(&waiter, 1).await;

    // Hold replication back, then take a lock the replica never sees.
    let link = group.replication_link(0).unwrap();
    link.pause();
    let doomed_name = unique("doomed");
    let doomed = plain.lock(&doomed_name).lock().await.unwrap();
    assert!(exists(group.primary(), &lock_key(&doomed_name)).await);
    link.block();

    let started = Instant::now();
    let new = within(HANG, "failover", group.kill_primary())
        .await
        .unwrap();
    println!(
        "primary killed until a replica was promoted: {:?}",
        started.elapsed()
    );
    let primary = group.primary();
    assert_eq!(primary.port(), new);
    assert!(!exists(primary, &lock_key(&doomed_name)).await);
    assert!(exists(primary, &lock_key(&survivor_name)).await);

    // The lock that did not survive is reported lost, and giving it back says so.
    within(HANG, "the doomed guard to be marked lost", doomed.lost()).await;
    assert!(doomed.is_lost());
    assert!(matches!(doomed.unlock().await, Err(Error::NotHeld { .. })));

    // The clients recover without a restart: the lost lock is free for someone else.
    let retaken = within(
        HANG,
        "a new acquisition",
        waiter.lock(&doomed_name).try_lock(Duration::ZERO, None),
    )
    .await
    .unwrap();
    assert!(
        retaken.is_some(),
        "the lost lock is free on the new primary"
    );
    retaken.unwrap().unlock().await.unwrap();

    // A waiter registered before the failover is woken by a release after it.
    handoff.unlock().await.unwrap();
    let handed = within(HANG, "the waiter to be woken", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(exists(primary, &lock_key(&handoff_name)).await);
    handed.unlock().await.unwrap();

    // The acknowledged lock is still this client's: not lost, renewable, releasable.
    assert!(!survivor.is_lost());
    assert!(acked
        .lock(&survivor_name)
        .is_held_by_current_task()
        .await
        .unwrap());
    survivor.unlock().await.unwrap();
    assert!(!exists(primary, &lock_key(&survivor_name)).await);

    for client in [acked, plain, waiter] {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_policy_that_cannot_be_met_gives_the_lock_back() {
    let group = group().await;
    let url = group.url();
    let client = match Client::builder()
        .url(&url)
        .replica_ack(ReplicaAck::AtLeast(2), Duration::from_millis(200))
        .build()
        .await
    {
        Ok(client) => client,
        Err(err) => panic!("cannot connect: {err}"),
    };
    let name = unique("unreplicated");
    match client.lock(&name).try_lock(Duration::ZERO, None).await {
        Err(Error::NotReplicated {
            name: reported,
            acknowledged,
            required,
        }) => {
            assert_eq!(reported, name);
            assert_eq!((acknowledged, required), (1, 2));
        }
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(!exists(group.primary(), &lock_key(&name)).await);
    assert_eq!(client.held_count(), 0);

    // Every primitive goes through the same check.
    let semaphore = client.semaphore(unique("unreplicated-sem"));
    semaphore.try_set_permits(1).await.unwrap();
    assert!(matches!(
        semaphore.try_acquire(1, Duration::ZERO, None).await,
        Err(Error::NotReplicated { .. })
    ));
    assert_eq!(semaphore.available_permits().await.unwrap(), 1);

    // `All` waits for the one connected replica and is met.
    let all = Client::builder()
        .url(&url)
        .replica_ack(ReplicaAck::All, Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let guard = all.lock(&name).lock().await.unwrap();
    let replica = group.replicas()[0];
    assert!(exists(replica, &lock_key(&name)).await);
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
    all.shutdown().await.unwrap();
}

/// Measures (never asserts) what `ReplicaAck::AtLeast(1)` adds to acquire + release on loopback,
/// same run, medians; printed for docs/topologies.md (`--nocapture`).
#[tokio::test]
async fn replica_ack_latency_is_measured() {
    const ROUNDS: usize = 300;
    let group = group().await;
    let url = group.url();
    let plain = client(&url, ReplicaAck::None).await;
    let acked = client(&url, ReplicaAck::AtLeast(1)).await;
    let name = unique("latency");
    let mut medians = Vec::new();
    for (label, client) in [("none", &plain), ("at_least_1", &acked)] {
        let lock = client.lock(&name);
        // Warm-up: scripts cached, connections open.
        for _ in 0..20 {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }
        let mut samples = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            lock.lock().await.unwrap().unlock().await.unwrap();
            samples.push(start.elapsed());
        }
        samples.sort();
        let median = samples[ROUNDS / 2];
        let p99 = samples[ROUNDS * 99 / 100];
        println!(
            "replica_ack={label}: acquire+release median {median:?}, p99 {p99:?} ({ROUNDS} rounds)"
        );
        medians.push(median);
    }
    println!(
        "replica_ack=at_least_1 adds {:?} to the median acquire+release",
        medians[1].saturating_sub(medians[0])
    );
    plain.shutdown().await.unwrap();
    acked.shutdown().await.unwrap();
}

#[tokio::test]
async fn replica_ack_timeout_must_fit_in_the_command_timeout() {
    for timeout in [
        Duration::ZERO,
        Duration::from_secs(5),
        Duration::from_secs(60),
    ] {
        let built = Client::builder()
            .url("redis://127.0.0.1:1")
            .replica_ack(ReplicaAck::AtLeast(1), timeout)
            .build()
            .await;
        assert!(
            matches!(built, Err(Error::InvalidArgument(_))),
            "{timeout:?}: {built:?}"
        );
    }
    // No policy: the timeout is not looked at (and the unreachable server is what fails).
    let built = Client::builder()
        .url("redis://127.0.0.1:1")
        .connect_timeout(Duration::from_millis(200))
        .replica_ack(ReplicaAck::None, Duration::ZERO)
        .build()
        .await;
    assert!(
        matches!(
            built,
            Err(Error::Connect {
                reason: ConnectFailure::Refused,
                ..
            })
        ),
        "{built:?}"
    );
}
