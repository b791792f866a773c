//! The read-write lock against a real redis-server: readers share, writers exclude, both modes
//! re-enter, a writer downgrades, a reader cannot upgrade, and every read hold expires on its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface, LuaInterface};
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::read_write_lock::{ACQUIRE, RELEASE};
use lockkit::{Error, MAX_LEASE};
use lockkit_suite::{client, client_with, raw, redis, spawned, unique, until_waiting, within};
use lockkit_testkit::FaultProxy;
use tokio::sync::Barrier;

/// Hang guard; kept below the 30 s watchdog lease and the 60 s fixed leases used below, so a
/// waiter that was not woken by a release message fails the test instead of passing late.
const HANG: Duration = Duration::from_secs(20);
/// Longer than any test: a wait that only a release can end.
const FOREVER: Duration = Duration::from_secs(3600);
const LONG_LEASE: Duration = Duration::from_secs(60);

fn rw_keys(name: &str) -> ObjectKeys {
    Namespace::default()
        .object(Kind::ReadWriteLock, name)
        .unwrap()
}

/// The number of holds in a lock's expiries ZSET.
async fn holds_in_redis(url: &str, name: &str) -> i64 {
    raw(url)
        .await
        .eval(
            "return redis.call('ZCARD', KEYS[1])",
            rw_keys(name).keys[1].clone(),
            (),
        )
        .await
        .unwrap()
}

fn refused<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::Refused { reason, .. }) => reason,
        other => panic!("expected Refused, got {other:?}"),
    }
}

fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_three_clients_are_inside_at_once() {
    const READERS: usize = 6;
    let redis = redis().await;
    let clients = [
        client(&redis.url()).await,
        client(&redis.url()).await,
        client(&redis.url()).await,
    ];
    let name = unique("readers");
    // Opens only when every reader holds its read hold at the same time (the test task is the
    // last party).
    let inside = Arc::new(Barrier::new(READERS + 1));
    let leave = Arc::new(Barrier::new(READERS + 1));
    let mut tasks = Vec::new();
    for i in 0..READERS {
        let lock = clients[i % 3].read_write_lock(&name);
        let (inside, leave) = (Arc::clone(&inside), Arc::clone(&leave));
        tasks.push(tokio::spawn(async move {
            let guard = lock.read_lock().await.unwrap();
            inside.wait().await;
            leave.wait().await;
            guard.unlock().await.unwrap();
        }));
    }
    within(HANG, "all readers inside at once", inside.wait()).await;

    let lock = clients[0].read_write_lock(&name);
    assert!(lock.is_locked().await.unwrap());
    assert!(!lock.is_write_locked().await.unwrap());
    assert_eq!(lock.read_hold_count().await.unwrap(), 0, "not this task's");
    assert!(
        lock.try_write_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none(),
        "readers keep writers out"
    );
    assert_eq!(
        holds_in_redis(&redis.url(), &name).await,
        READERS as i64,
        "one expiry per read hold"
    );

    leave.wait().await;
    for task in tasks {
        task.await.unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
    let left: i64 = raw(&redis.url())
        .await
        .exists(rw_keys(&name).keys.clone())
        .await
        .unwrap();
    assert_eq!(left, 0, "both keys are gone with the last hold");
}

/// Mixed readers and writers of three clients hammer one lock; an in-process census of who is
/// inside (every client lives in this process) must never see a writer with anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_exclude_readers_and_each_other_under_contention() {
    const WRITERS: usize = 2;
    const READERS: usize = 3;
    const ROUNDS: usize = 8;

    #[derive(Default)]
    struct Census {
        readers: AtomicUsize,
        writers: AtomicUsize,
        overlaps: AtomicUsize,
        reads: AtomicUsize,
        writes: AtomicUsize,
    }

    let redis = redis().await;
    let name = unique("contention");
    let census = Arc::new(Census::default());
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&redis.url()).await;
        for role in 0..WRITERS + READERS {
            let lock = client.read_write_lock(&name);
            let census = Arc::clone(&census);
            let writer = role < WRITERS;
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    if writer {
                        let guard = lock.write_lock().await.unwrap();
                        let others = census.writers.fetch_add(1, Ordering::SeqCst);
                        for _ in 0..2 {
                            if others > 0 || census.readers.load(Ordering::SeqCst) > 0 {
                                census.overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        census.writers.fetch_sub(1, Ordering::SeqCst);
                        census.writes.fetch_add(1, Ordering::SeqCst);
                        guard.unlock().await.unwrap();
                    } else {
                        let guard = lock.read_lock().await.unwrap();
                        census.readers.fetch_add(1, Ordering::SeqCst);
                        for _ in 0..2 {
                            if census.writers.load(Ordering::SeqCst) > 0 {
                                census.overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        census.readers.fetch_sub(1, Ordering::SeqCst);
                        census.reads.fetch_add(1, Ordering::SeqCst);
                        guard.unlock().await.unwrap();
                    }
                }
            }));
        }
    }
    within(HANG, "contention rounds", async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
    assert_eq!(census.overlaps.load(Ordering::SeqCst), 0, "a writer shared");
    assert_eq!(census.writes.load(Ordering::SeqCst), 3 * WRITERS * ROUNDS);
    assert_eq!(census.reads.load(Ordering::SeqCst), 3 * READERS * ROUNDS);
    let probe = client(&redis.url()).await;
    assert!(!probe.read_write_lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn read_holds_reenter_per_owner() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("reenter-read");
    let lock = client.read_write_lock(&name);

    let first = lock.read_lock().await.unwrap();
    let second = first.scope(lock.read_lock()).await.unwrap();
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    assert_eq!(lock.read_hold_count().await.unwrap(), 2);
    assert_eq!(lock.write_hold_count().await.unwrap(), 0);

    // Another task of this client is another owner: it shares the read lock, it holds nothing.
    let lock2 = lock.clone();
    let (count, read) = tokio::spawn(async move {
        let count = lock2.read_hold_count().await.unwrap();
        let read = lock2.try_read_lock(Duration::ZERO, None).await.unwrap();
        (count, read.map(|guard| guard.hold_count()))
    })
    .await
    .unwrap();
    assert_eq!((count, read), (0, Some(1)));
    assert!(other
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());

    second.unlock().await.unwrap();
    assert_eq!(lock.read_hold_count().await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap(), "one hold left");
    first.unlock().await.unwrap();
    assert_eq!(lock.read_hold_count().await.unwrap(), 0);
    assert!(!lock.is_locked().await.unwrap());
    assert!(other
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn write_holds_reenter_and_exclude_everyone_else() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("reenter-write");
    let lock = client.read_write_lock(&name);

    let first = lock.write_lock().await.unwrap();
    let second = first
        .scope(lock.try_write_lock(Duration::ZERO, Some(LONG_LEASE)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    assert_eq!(lock.write_hold_count().await.unwrap(), 2);
    assert!(lock.is_write_locked().await.unwrap());

    // Neither another task of this client nor another client gets in, in either mode.
    let lock2 = lock.clone();
    let (read, write) = tokio::spawn(async move {
        let read = lock2.try_read_lock(Duration::ZERO, None).await.unwrap();
        let write = lock2.try_write_lock(Duration::ZERO, None).await.unwrap();
        (read.is_some(), write.is_some())
    })
    .await
    .unwrap();
    assert_eq!((read, write), (false, false));
    let foreign = other.read_write_lock(&name);
    assert!(foreign
        .try_read_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    assert!(foreign
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());

    first.unlock().await.unwrap();
    assert_eq!(lock.write_hold_count().await.unwrap(), 1);
    assert!(lock.is_write_locked().await.unwrap(), "one write hold left");
    second.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert!(foreign
        .try_read_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_some());
}

/// Write, then read as the same owner, then give back the write: the owner keeps reading, and a
/// reader that was waiting on the write is let in by the release message (its fallback, the
/// write hold's 60 s lease, is beyond the hang guard).
#[tokio::test]
async fn a_writer_downgrades_and_the_release_lets_waiting_readers_in() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let readers = lockkit_suite::client(&redis.url()).await;
    let writers = lockkit_suite::client(&redis.url()).await;
    let name = unique("downgrade");
    let lock = holder.read_write_lock(&name);

    let write = lock.write_lock_with_lease(LONG_LEASE).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let lock = readers.read_write_lock(&name);
        waiting.push(tokio::spawn(async move {
            lock.try_read_lock(FOREVER, None).await
        }));
    }
    until_waiting(&readers, 2).await;

    let read = write
        .scope(lock.try_read_lock(Duration::ZERO, None))
        .await
        .unwrap()
        .expect("the writer may read in its scope");
    assert_eq!(
        (
            lock.read_hold_count().await.unwrap(),
            lock.write_hold_count().await.unwrap()
        ),
        (1, 1)
    );

    write.unlock().await.unwrap();
    assert!(!lock.is_write_locked().await.unwrap());
    assert!(lock.is_locked().await.unwrap(), "the read hold stays");
    assert_eq!(lock.read_hold_count().await.unwrap(), 1);
    let mut admitted = Vec::new();
    for task in waiting {
        let guard = within(HANG, "waiting reader after the downgrade", task)
            .await
            .unwrap()
            .unwrap();
        admitted.push(guard.expect("let in"));
    }
    assert!(writers
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());

    read.unlock().await.unwrap();
    for guard in admitted {
        guard.unlock().await.unwrap();
    }
    assert!(writers
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_some());
}

/// Readers with 60 s fixed leases; the waiting writer can only get in by the message that the
/// last reader's release publishes.
#[tokio::test]
async fn the_last_reader_leaving_lets_a_waiting_writer_in() {
    let redis = redis().await;
    let readers = [client(&redis.url()).await, client(&redis.url()).await];
    let writer = client(&redis.url()).await;
    let name = unique("last-reader");
    let mut guards = Vec::new();
    for reader in &readers {
        guards.push(
            reader
                .read_write_lock(&name)
                .read_lock_with_lease(LONG_LEASE)
                .await
                .unwrap(),
        );
    }
    let lock = writer.read_write_lock(&name);
    let task = tokio::spawn(async move { lock.try_write_lock(FOREVER, None).await });
    until_waiting(&writer, 1).await;
    guards.pop().unwrap().unlock().await.unwrap();
    assert!(
        !writer
            .read_write_lock(&name)
            .is_write_locked()
            .await
            .unwrap(),
        "one reader is still inside"
    );
    guards.pop().unwrap().unlock().await.unwrap();
    let got = within(HANG, "writer after the last reader", task)
        .await
        .unwrap()
        .unwrap();
    let guard = got.expect("let in");
    assert!(writer
        .read_write_lock(&name)
        .is_write_locked()
        .await
        .unwrap());
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_reader_cannot_upgrade_and_the_refusal_takes_nothing() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("upgrade");
    let lock = client.read_write_lock(&name);
    let read = lock.read_lock().await.unwrap();
    // Another reader too: still an upgrade (refused), not a busy lock to wait for.
    let other_read = other
        .read_write_lock(&name)
        .read_lock_with_lease(LONG_LEASE)
        .await
        .unwrap();

    // An unbounded wait would hang forever if the refusal did not come at once.
    // (Inside the read hold's scope: outside it, a write request is another owner's and waits.)
    let reason = refused(
        within(
            HANG,
            "write_lock by a reader",
            read.scope(lock.write_lock()),
        )
        .await,
    );
    assert!(reason.contains("upgrade"), "{reason}");
    refused(
        within(
            HANG,
            "try_write_lock by a reader",
            read.scope(lock.try_write_lock(FOREVER, None)),
        )
        .await,
    );
    refused(
        read.scope(lock.try_write_lock(Duration::ZERO, Some(LONG_LEASE)))
            .await,
    );

    assert_eq!(lock.write_hold_count().await.unwrap(), 0);
    assert_eq!(lock.read_hold_count().await.unwrap(), 1);
    assert_eq!(client.held_count(), 1, "only the read hold is registered");
    assert_eq!(client.waiting_count(), 0);
    let keys = rw_keys(&name);
    let raw = raw(&redis.url()).await;
    assert_eq!(
        holds_in_redis(&redis.url(), &name).await,
        2,
        "the two read holds, nothing else"
    );
    let fields: std::collections::HashMap<String, String> = raw.hgetall(&keys.key).await.unwrap();
    assert_eq!(fields.get("mode").map(String::as_str), Some("read"));
    assert!(!fields.keys().any(|f| f.starts_with("w:")), "{fields:?}");

    // Once its reads are given back, the same task may write.
    read.unlock().await.unwrap();
    other_read.unlock().await.unwrap();
    let write = lock
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("free");
    write.unlock().await.unwrap();
}

/// A reader with a 1 s fixed lease and a reader renewed every 100 ms share the lock. The first
/// hold runs out on schedule although the other reader keeps renewing, and only it is lost.
#[tokio::test]
async fn each_read_hold_expires_on_its_own_while_another_is_renewed() {
    let redis = redis().await;
    let short = client(&redis.url()).await;
    let renewed = client_with(&redis.url(), Duration::from_millis(300)).await;
    let writer = client(&redis.url()).await;
    let name = unique("own-expiry");
    let lock = short.read_write_lock(&name);

    let expiring = lock
        .read_lock_with_lease(Duration::from_secs(1))
        .await
        .unwrap();
    let kept = renewed.read_write_lock(&name).read_lock().await.unwrap();
    assert!(kept.is_watchdog() && !expiring.is_watchdog());

    within(HANG, "the fixed lease ends", expiring.lost()).await;
    // The guard's clock runs ahead of Redis's by the request's travel time: wait for Redis.
    within(HANG, "Redis drops the expired read hold", async {
        while lock.read_hold_count().await.unwrap() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // By now (over three watchdog leases later) the other reader lives only through renewal.
    assert!(!kept.is_lost());
    assert!(lock.is_locked().await.unwrap());
    assert!(writer
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    assert!(matches!(
        expiring.unlock().await,
        Err(Error::NotHeld { .. })
    ));
    kept.unlock().await.unwrap();
    assert!(writer
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn force_unlock_frees_every_holder_and_wakes_waiters() {
    let redis = redis().await;
    let holder = client_with(&redis.url(), Duration::from_millis(300)).await;
    let waiter = client(&redis.url()).await;
    let admin = client(&redis.url()).await;
    let name = unique("force");
    let first = holder.read_write_lock(&name).read_lock().await.unwrap();
    let holder_lock = holder.read_write_lock(&name);
    let second = tokio::spawn(async move { holder_lock.read_lock().await })
        .await
        .unwrap()
        .unwrap();
    let lock = waiter.read_write_lock(&name);
    let task = tokio::spawn(async move { lock.try_write_lock(FOREVER, None).await });
    until_waiting(&waiter, 1).await;

    assert!(admin.read_write_lock(&name).force_unlock().await.unwrap());
    let got = within(HANG, "writer after force_unlock", task)
        .await
        .unwrap()
        .unwrap();
    let write = got.expect("let in");
    for guard in [first, second] {
        within(HANG, "lost signal after force_unlock", guard.lost()).await;
        assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    }
    assert!(admin.read_write_lock(&name).force_unlock().await.unwrap());
    assert!(matches!(write.unlock().await, Err(Error::NotHeld { .. })));
    assert!(!admin.read_write_lock(&name).force_unlock().await.unwrap());
}

/// fred re-sends a request whose connection dropped; the script must count it once, and a
/// release must give back exactly the hold it names.
#[tokio::test]
async fn a_replayed_acquire_counts_once_and_a_replayed_release_frees_once() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let keys = rw_keys(&unique("replay"));
    let acquire = |marker: &'static str| {
        raw.eval::<Vec<i64>, _, _, _>(
            ACQUIRE.source(),
            keys.keys.clone(),
            vec!["owner", marker, "60000", "r", "rw-test-channel", "0", "0"],
        )
    };
    assert_eq!(acquire("#c:1").await.unwrap(), vec![1, 1]);
    assert_eq!(acquire("#c:1").await.unwrap(), vec![1, 1], "replayed");
    assert_eq!(acquire("#c:2").await.unwrap(), vec![1, 2], "a new request");
    let count: i64 = raw.hget(&keys.key, "r:owner").await.unwrap();
    assert_eq!(count, 2);

    let release = |marker: &'static str| {
        raw.eval::<Vec<i64>, _, _, _>(
            RELEASE.source(),
            keys.keys.clone(),
            vec![marker, keys.channel.as_str(), "0"],
        )
    };
    assert_eq!(release("#c:1").await.unwrap(), vec![2, 1]);
    assert_eq!(release("#c:1").await.unwrap(), vec![0, 0], "replayed");
    assert_eq!(release("#c:2").await.unwrap(), vec![1, 0]);
    let left: i64 = raw.exists(keys.keys.clone()).await.unwrap();
    assert_eq!(left, 0);
}

/// The same through a real connection cut: the server runs the script, the proxy drops the reply
/// and the connection. fred re-sends the acquire (counted once); `hold.rs` re-sends the release
/// (one hold given back, and `unlock` reports success).
#[tokio::test]
async fn an_acquire_and_a_release_across_a_cut_connection_count_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    // Cache the scripts, so the request whose reply is lost is the script, not a NOSCRIPT.
    let warm_up = holder.read_write_lock(unique("warm-up"));
    warm_up.read_lock().await.unwrap().unlock().await.unwrap();
    let name = unique("cut");
    let key = rw_keys(&name).key;
    let lock = holder.read_write_lock(&name);

    proxy.cut_after_request_containing(key.clone());
    let first = within(HANG, "acquire across a cut", lock.read_lock())
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(first.hold_count(), 1);
    assert_eq!(lock.read_hold_count().await.unwrap(), 1);
    assert_eq!(holds_in_redis(&server.url(), &name).await, 1);

    let second = lock.read_lock().await.unwrap();
    proxy.cut_after_request_containing(key);
    within(HANG, "release across a cut", second.unlock())
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(
        lock.read_hold_count().await.unwrap(),
        1,
        "exactly one hold given back"
    );
    first.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn bad_input_gets_clear_errors_and_takes_nothing() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.read_write_lock(unique("bad-input"));
    assert!(invalid(
        lock.try_read_lock(Duration::ZERO, Some(Duration::ZERO))
            .await
    )
    .contains("lease"));
    assert!(invalid(lock.write_lock_with_lease(Duration::MAX).await).contains("lease"));
    invalid(
        lock.try_write_lock(Duration::ZERO, Some(MAX_LEASE + Duration::from_secs(1)))
            .await,
    );
    assert!(!lock.is_locked().await.unwrap(), "nothing was taken");

    let nameless = client.read_write_lock("");
    assert!(invalid(nameless.read_lock().await).contains("empty"));
    invalid(nameless.try_write_lock(Duration::ZERO, None).await);
    invalid(nameless.is_locked().await);
    invalid(nameless.read_hold_count().await);
    invalid(nameless.force_unlock().await);
    let long = "x".repeat(lockkit::protocol::keys::MAX_NAME_LEN + 1);
    invalid(client.read_write_lock(long).read_lock().await);

    // A key that something else wrote is reported, never overwritten.
    let name = unique("foreign");
    let keys = rw_keys(&name);
    let raw = raw(&redis.url()).await;
    let _: () = raw
        .set(&keys.key, "not a lock", None, None, false)
        .await
        .unwrap();
    let lock = client.read_write_lock(&name);
    assert!(matches!(
        lock.try_read_lock(Duration::ZERO, None).await,
        Err(Error::WrongType { .. })
    ));
    assert!(matches!(
        lock.is_locked().await,
        Err(Error::WrongType { .. })
    ));
    let value: String = raw.get(&keys.key).await.unwrap();
    assert_eq!(value, "not a lock");
    assert_eq!(client.held_count(), 0);
}

/// Read holds a release granted (direct grant, on probation) are confirmed to their full lease:
/// a fixed 60 s lease and a watchdog-mode hold both outlive the probation while held, and a
/// writer still finds the lock taken after it.
#[tokio::test]
async fn granted_read_holds_outlive_their_probation_while_held() {
    use lockkit::protocol::lock::GRANT_PROBATION;
    let redis = spawned().await;
    let url = redis.url();
    let (holder, waiter, other) = (client(&url).await, client(&url).await, client(&url).await);
    let name = unique("rw-probation");
    let write = holder
        .read_write_lock(&name)
        .write_lock_with_lease(LONG_LEASE)
        .await
        .unwrap();
    let fixed = {
        let lock = waiter.read_write_lock(&name);
        tokio::spawn(async move { lock.read_lock_with_lease(LONG_LEASE).await })
    };
    let watchdog = {
        let lock = waiter.read_write_lock(&name);
        tokio::spawn(async move { lock.read_lock().await })
    };
    // Both requests stand in the line in Redis, so the release grants them (not their tries).
    let line = raw(&url).await;
    let waiting = rw_keys(&name).keys[2].clone();
    within(HANG, "both readers in the line", async {
        loop {
            let queued: i64 = line
                .eval("return redis.call('ZCARD', KEYS[1])", waiting.clone(), ())
                .await
                .unwrap();
            if queued == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    write.unlock().await.unwrap();
    let fixed = within(HANG, "the fixed-lease reader", fixed)
        .await
        .unwrap()
        .unwrap();
    let watchdog = within(HANG, "the watchdog reader", watchdog)
        .await
        .unwrap()
        .unwrap();
    // Time passing is the scenario: past the probation, both grants must have been confirmed.
    tokio::time::sleep(GRANT_PROBATION + Duration::from_secs(1)).await;
    assert!(!fixed.is_lost() && !watchdog.is_lost());
    assert_eq!(holds_in_redis(&url, &name).await, 2, "both still held");
    assert!(other
        .read_write_lock(&name)
        .try_write_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    fixed.unlock().await.unwrap();
    watchdog.unlock().await.unwrap();
}
