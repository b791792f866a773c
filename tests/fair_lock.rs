//! The fair lock: grants in request order across clients, re-entry past the queue, waiters that
//! die or give up, leases, bad input — against a real redis-server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{ClientLike, HashesInterface};
use fred::types::{ClusterHash, CustomCommand, FromValue};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::{Error, FairLock, MAX_LEASE};
use lockkit_suite::{client, raw, redis, spawned, unique, until_waiting, within};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(30);

/// The lock's keys: `[hash, queue, timeouts]`.
fn keys(name: &str) -> Vec<String> {
    Namespace::default()
        .object(Kind::FairLock, name)
        .unwrap()
        .keys
}

async fn command<R: FromValue>(raw: &fred::clients::Client, cmd: &'static str, args: &[&str]) -> R {
    let owned: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    raw.custom(
        CustomCommand::new_static(cmd, ClusterHash::FirstKey, false),
        owned,
    )
    .await
    .unwrap_or_else(|err| panic!("{cmd} {args:?}: {err}"))
}

/// The waiter ids in the queue, head first.
async fn queue(raw: &fred::clients::Client, name: &str) -> Vec<String> {
    command(raw, "LRANGE", &[&keys(name)[1], "0", "-1"]).await
}

/// The waiter ids that have a deadline.
async fn deadlines(raw: &fred::clients::Client, name: &str) -> Vec<String> {
    command(raw, "ZRANGE", &[&keys(name)[2], "0", "-1"]).await
}

/// Polls Redis until the queue is `len` long.
async fn queue_reaches(raw: &fred::clients::Client, name: &str, len: usize) {
    while queue(raw, name).await.len() != len {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The server's clock in milliseconds.
async fn server_ms(raw: &fred::clients::Client) -> i64 {
    let time: Vec<String> = raw
        .custom(
            CustomCommand::new_static("TIME", ClusterHash::Random, false),
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// Queues a waiter by hand, as another process would, with the given deadline (server ms).
async fn queue_by_hand(raw: &fred::clients::Client, name: &str, waiter: &str, deadline: i64) {
    let keys = keys(name);
    let _: i64 = command(raw, "RPUSH", &[&keys[1], waiter]).await;
    let _: i64 = command(raw, "ZADD", &[&keys[2], &deadline.to_string(), waiter]).await;
}

/// Nothing of the lock is left in Redis.
async fn assert_clean(raw: &fred::clients::Client, name: &str) {
    for key in keys(name) {
        let exists: i64 = command(raw, "EXISTS", &[&key]).await;
        assert_eq!(exists, 0, "{key} is left behind");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_follow_request_order_across_clients() {
    let redis = redis().await;
    let url = redis.url();
    let raw = raw(&url).await;
    let holder = client(&url).await;
    let name = unique("fair-order");
    let guard = holder.fair_lock(&name).lock().await.unwrap();

    // Three clients, two waiting tasks each, queued in an interleaved, known order: waiter i
    // starts only once waiter i-1 is in the queue.
    let clients = [client(&url).await, client(&url).await, client(&url).await];
    // Waiters retry only every 40 s: each handoff within the hang guard is the work of the
    // release message naming the next waiter.
    let inside = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let lock = clients[i % 3]
            .fair_lock(&name)
            .with_waiter_timeout(Duration::from_secs(120))
            .unwrap();
        let tx = tx.clone();
        let inside = Arc::clone(&inside);
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let overlapping = inside.fetch_add(1, Ordering::SeqCst);
            let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
            tx.send((i, overlapping, release_tx)).unwrap();
            release_rx.await.unwrap();
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.unlock().await.unwrap();
        }));
        within(HANG, "waiter queued", queue_reaches(&raw, &name, i + 1)).await;
    }
    let queued = queue(&raw, &name).await;
    for (i, waiter) in queued.iter().enumerate() {
        assert!(waiter.starts_with(clients[i % 3].id()), "{queued:?}");
    }

    guard.unlock().await.unwrap();
    let mut served = Vec::new();
    for _ in 0..6 {
        let (i, overlapping, release) = within(HANG, "next waiter", rx.recv()).await.unwrap();
        assert_eq!(
            overlapping, 0,
            "waiter {i} got in while another held the lock"
        );
        served.push(i);
        release.send(()).unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(served, [0, 1, 2, 3, 4, 5], "served in request order");
    assert_clean(&raw, &name).await;
}

#[tokio::test]
async fn a_newcomer_never_jumps_the_queue_even_when_the_lock_is_free() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let client = client(&redis.url()).await;
    let name = unique("fair-barge");
    let lock = client.fair_lock(&name);

    // Another process's waiter is first in line (alive: its deadline is a minute away).
    let ghost = "other-process:w1";
    queue_by_hand(&raw, &name, ghost, server_ms(&raw).await + 60_000).await;
    assert!(!lock.is_locked().await.unwrap());
    assert!(
        lock.try_lock(Duration::ZERO, None).await.unwrap().is_none(),
        "a free lock with a queue belongs to the queue's head"
    );
    assert_eq!(
        queue(&raw, &name).await,
        [ghost],
        "a single attempt never queues"
    );

    // A waiting newcomer queues behind it, gives up, and leaves the queue.
    assert!(lock
        .try_lock(Duration::from_millis(200), None)
        .await
        .unwrap()
        .is_none());
    within(
        HANG,
        "timed-out waiter leaves",
        queue_reaches(&raw, &name, 1),
    )
    .await;
    assert_eq!(queue(&raw, &name).await, [ghost]);
    assert_eq!(deadlines(&raw, &name).await, [ghost]);

    // Once the ghost's deadline is past, the next script drops it, and every stale waiter
    // behind it.
    queue_by_hand(&raw, &name, "gone-too:w2", 0).await;
    let _: i64 = command(&raw, "ZADD", &[&keys(&name)[2], "1", ghost]).await;
    let guard = lock.try_lock(Duration::ZERO, None).await.unwrap();
    assert!(guard.is_some(), "stale waiters at the head are dropped");
    assert!(queue(&raw, &name).await.is_empty());
    assert!(deadlines(&raw, &name).await.is_empty());
    drop(guard);
    assert_eq!(client.waiting_count(), 0);
    assert_eq!(client.held_count(), 0);
}

/// A waiter that died right after its last retry keeps its place until its deadline, and not
/// beyond: the live waiter behind it gets the free lock then.
#[tokio::test]
async fn a_waiter_that_stops_retrying_is_dropped_at_its_deadline() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let client = client(&redis.url()).await;
    let name = unique("fair-dead");
    let deadline = server_ms(&raw).await + 1_000;
    queue_by_hand(&raw, &name, "crashed-process:w7", deadline).await;

    let guard = within(
        HANG,
        "acquire behind a dead waiter",
        client.fair_lock(&name).lock(),
    )
    .await
    .unwrap();
    assert!(
        server_ms(&raw).await >= deadline,
        "the dead waiter's place was kept until its deadline"
    );
    assert!(queue(&raw, &name).await.is_empty());
    assert!(deadlines(&raw, &name).await.is_empty());
    guard.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

/// Live waiters retry well within their timeout, so they keep their places however long the
/// holder holds the lock (here: five times their 600 ms timeout, without a release message).
#[tokio::test]
async fn live_waiters_keep_their_places_while_the_holder_holds_long() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let holder = client(&redis.url()).await;
    let waiting = client(&redis.url()).await;
    let name = unique("fair-keep");
    let guard = holder.fair_lock(&name).lock().await.unwrap();
    let timeout = Duration::from_millis(600);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..2 {
        let lock = waiting
            .fair_lock(&name)
            .with_waiter_timeout(timeout)
            .unwrap();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            tx.send(i).unwrap();
            guard.unlock().await.unwrap();
        }));
        within(HANG, "waiter queued", queue_reaches(&raw, &name, i + 1)).await;
    }
    let queued = queue(&raw, &name).await;

    // Let the server clock run past five waiter timeouts.
    let until = server_ms(&raw).await + 5 * 600;
    while server_ms(&raw).await < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(queue(&raw, &name).await, queued, "same waiters, same order");

    guard.unlock().await.unwrap();
    for expected in 0..2 {
        assert_eq!(within(HANG, "next waiter", rx.recv()).await, Some(expected));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_clean(&raw, &name).await;
}

/// A real client, first in line, goes silent (its connections stall, as a crashed or partitioned
/// process): it can neither retry nor leave. The waiter behind it gets the lock once the silent
/// waiter's timeout runs out.
#[tokio::test]
async fn a_queued_client_that_goes_silent_loses_its_place_after_its_timeout() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let raw = raw(&server.url()).await;
    let holder = client(&server.url()).await;
    let silent = client(&proxy.url()).await;
    let live = client(&server.url()).await;
    let name = unique("fair-silent");
    let guard = holder.fair_lock(&name).lock().await.unwrap();

    let silent_lock = silent
        .fair_lock(&name)
        .with_waiter_timeout(Duration::from_secs(1))
        .unwrap();
    let silent_task = tokio::spawn(async move { silent_lock.lock().await });
    within(HANG, "silent waiter queued", queue_reaches(&raw, &name, 1)).await;
    let live_lock = live.fair_lock(&name);
    let live_task = tokio::spawn(async move { live_lock.lock().await });
    within(HANG, "live waiter queued", queue_reaches(&raw, &name, 2)).await;
    let queued = queue(&raw, &name).await;
    assert!(queued[0].starts_with(silent.id()) && queued[1].starts_with(live.id()));

    proxy.pause();
    guard.unlock().await.unwrap(); // names the silent waiter, who cannot answer
    let got = within(HANG, "live waiter after the silent one", live_task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        !queue(&raw, &name)
            .await
            .iter()
            .any(|w| w.starts_with(silent.id())),
        "the silent waiter was dropped"
    );
    got.unlock().await.unwrap();
    silent_task.abort();
}

/// The dropped waiter's timeout (60 s) outlasts the hang guard: only the background cancel can
/// take it out of the queue in time.
#[tokio::test]
async fn a_dropped_acquire_leaves_the_queue_at_once() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let holder = client(&redis.url()).await;
    let dropped = client(&redis.url()).await;
    let next = client(&redis.url()).await;
    let name = unique("fair-drop");
    let guard = holder.fair_lock(&name).lock().await.unwrap();

    let lock = dropped
        .fair_lock(&name)
        .with_waiter_timeout(Duration::from_secs(60))
        .unwrap();
    let dropped_task = tokio::spawn(async move { lock.lock().await });
    within(HANG, "first waiter queued", queue_reaches(&raw, &name, 1)).await;
    let lock = next.fair_lock(&name);
    let next_task = tokio::spawn(async move { lock.lock().await });
    within(HANG, "second waiter queued", queue_reaches(&raw, &name, 2)).await;

    dropped_task.abort();
    within(
        HANG,
        "cancelled waiter leaves",
        queue_reaches(&raw, &name, 1),
    )
    .await;
    let queued = queue(&raw, &name).await;
    assert!(queued[0].starts_with(next.id()), "{queued:?}");
    assert_eq!(deadlines(&raw, &name).await, queued);
    assert_eq!(dropped.waiting_count(), 0);
    assert_eq!(dropped.held_count(), 0);

    guard.unlock().await.unwrap();
    let got = within(HANG, "next waiter", next_task)
        .await
        .unwrap()
        .unwrap();
    got.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

/// A wait that runs out leaves the queue in its last try, in the same script, as a lock's wait
/// leaves its line: with the waiter's client cut off from Redis right after the call returned (no
/// cancel can follow), nothing of it is left in the queue, and a newcomer's zero-wait try gets the
/// lock as soon as the holder releases it. (Before, the entry left in a cancel sent after the
/// call returned; with the client cut off it stayed for its waiter timeout, 60 s here, and the
/// newcomer was refused: "nobody waits" was false.)
#[tokio::test]
async fn a_wait_that_runs_out_leaves_the_queue_before_it_returns() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let raw = raw(&server.url()).await;
    let holder = client(&server.url()).await;
    let gave_up = client(&proxy.url()).await;
    let name = unique("fair-gave-up");
    let guard = holder.fair_lock(&name).lock().await.unwrap();

    let refused = gave_up
        .fair_lock(&name)
        .with_waiter_timeout(Duration::from_secs(60))
        .unwrap()
        .try_lock(Duration::from_millis(200), None)
        .await
        .unwrap();
    assert!(refused.is_none(), "held all along");
    // The client vanishes: whatever it would send now never arrives.
    proxy.block();
    assert_eq!(
        queue(&raw, &name).await,
        Vec::<String>::new(),
        "left in the queue"
    );
    assert_eq!(deadlines(&raw, &name).await, Vec::<String>::new());

    guard.unlock().await.unwrap();
    let newcomer = holder
        .fair_lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("free, and nobody waits");
    newcomer.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

/// The waiters' timeouts (120 s, so the live one retries only every 40 s) outlast the hang guard:
/// only the message naming the next waiter can get it in in time.
#[tokio::test]
async fn a_cancelled_head_passes_a_free_lock_on_by_name() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let client = client(&redis.url()).await;
    let name = unique("fair-pass");
    // Another process's waiter is first in line and the lock is free (it was about to take it).
    let ghost = "other-process:w9";
    queue_by_hand(&raw, &name, ghost, server_ms(&raw).await + 120_000).await;
    let lock = client
        .fair_lock(&name)
        .with_waiter_timeout(Duration::from_secs(120))
        .unwrap();
    let task = tokio::spawn(async move { lock.lock().await });
    within(HANG, "waiter queued", queue_reaches(&raw, &name, 2)).await;
    until_waiting(&client, 1).await;

    // The ghost gives up: its cancel script (run here by hand) names the waiter behind it.
    let keys = keys(&name);
    let channel = Namespace::default()
        .object(Kind::FairLock, &name)
        .unwrap()
        .channel;
    let cancel = &lockkit::protocol::fair_lock::CANCEL;
    let removed: Vec<i64> = command(
        &raw,
        "EVAL",
        &[
            cancel.source(),
            "3",
            &keys[0],
            &keys[1],
            &keys[2],
            ghost,
            &channel,
            "0",
        ],
    )
    .await;
    assert_eq!(removed, [1]);
    let guard = within(HANG, "woken by name", task).await.unwrap().unwrap();
    guard.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

#[tokio::test]
async fn a_waiter_whose_client_shuts_down_leaves_the_queue() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let holder = client(&redis.url()).await;
    let waiting = client(&redis.url()).await;
    let name = unique("fair-shutdown");
    let guard = holder.fair_lock(&name).lock().await.unwrap();
    let lock = waiting
        .fair_lock(&name)
        .with_waiter_timeout(Duration::from_secs(60))
        .unwrap();
    let task = tokio::spawn(async move { lock.lock().await });
    within(HANG, "waiter queued", queue_reaches(&raw, &name, 1)).await;
    waiting.shutdown().await.unwrap();
    let result = within(HANG, "waiter after shutdown", task).await.unwrap();
    assert!(matches!(result, Err(Error::Shutdown)), "{result:?}");
    within(
        HANG,
        "shut-down waiter leaves",
        queue_reaches(&raw, &name, 0),
    )
    .await;
    guard.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

#[tokio::test]
async fn the_owner_reenters_past_the_queue_and_the_next_waiter_follows_its_last_release() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("fair-reentrant");
    let lock = client.fair_lock(&name);
    let first = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();

    let waiting = other.fair_lock(&name);
    let waiter = tokio::spawn(async move { waiting.lock().await });
    within(HANG, "waiter queued", queue_reaches(&raw, &name, 1)).await;

    let second = first
        .scope(lock.try_lock(Duration::ZERO, None))
        .await
        .unwrap();
    let second = second.expect("the owner re-enters in its scope although someone waits");
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(lock.is_held_by_current_task().await.unwrap());
    assert_eq!(
        queue(&raw, &name).await.len(),
        1,
        "re-entry leaves the queue alone"
    );

    // Another task of the same client is not the owner: it does not jump the queue.
    let same_client = lock.clone();
    let got = tokio::spawn(async move { same_client.try_lock(Duration::ZERO, None).await })
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_none());

    second.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1, "one hold left");
    first.unlock().await.unwrap();
    let got = within(HANG, "waiter after the last release", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.hold_count(), 1);
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    got.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

/// A fixed lease that runs out publishes nothing: the head of the queue still gets the lock,
/// bounded by the holder's remaining lease.
#[tokio::test]
async fn a_fixed_lease_runs_out_and_the_head_takes_over() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let waiting = lockkit_suite::client(&redis.url()).await;
    let name = unique("fair-lease");
    let lease = Duration::from_millis(500);
    let guard = client
        .fair_lock(&name)
        .lock_with_lease(lease)
        .await
        .unwrap();
    assert!(!guard.is_watchdog());
    let ttl = client
        .fair_lock(&name)
        .remaining_ttl()
        .await
        .unwrap()
        .unwrap();
    assert!(ttl <= lease && ttl > Duration::ZERO, "{ttl:?}");

    let got = within(
        HANG,
        "acquire after the lease ran out",
        waiting.fair_lock(&name).lock(),
    )
    .await
    .unwrap();
    assert!(guard.is_lost());
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    got.unlock().await.unwrap();
}

/// The watchdog renews fair-lock holds (three keys each) in the same rounds as other kinds' holds
/// (one or two keys each): every lease outlives three times its length.
#[tokio::test]
async fn watchdog_holds_of_every_kind_are_renewed_together() {
    let redis = redis().await;
    let timeout = Duration::from_millis(300);
    let client = lockkit_suite::client_with(&redis.url(), timeout).await;
    let fair = client.fair_lock(unique("fair-renew")).lock().await.unwrap();
    let plain = client.lock(unique("plain-renew")).lock().await.unwrap();
    let fenced = client
        .fenced_lock(unique("fenced-renew"))
        .lock()
        .await
        .unwrap();
    // The subject is time passing: three leases' worth, renewed every 100 ms.
    tokio::time::sleep(timeout * 3).await;
    assert!(!fair.is_lost(), "fair hold renewed");
    assert!(!plain.is_lost(), "plain hold renewed");
    assert!(!fenced.is_lost(), "fenced hold renewed");
    fair.unlock().await.unwrap();
    plain.unlock().await.unwrap();
    fenced.unlock().await.unwrap();
}

/// The waiter's timeout (120 s: it retries every 40 s) and the holder's lease (60 s) outlast the
/// hang guard: only the force-unlock's message can hand the lock over in time.
#[tokio::test]
async fn force_unlock_hands_the_lock_to_the_head_of_the_queue() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let holder = client(&redis.url()).await;
    let waiting = client(&redis.url()).await;
    let admin = client(&redis.url()).await;
    let name = unique("fair-force");
    let guard = holder
        .fair_lock(&name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let lock = waiting
        .fair_lock(&name)
        .with_waiter_timeout(Duration::from_secs(120))
        .unwrap();
    let task = tokio::spawn(async move { lock.lock().await });
    within(HANG, "waiter queued", queue_reaches(&raw, &name, 1)).await;
    until_waiting(&waiting, 1).await;

    assert!(admin.fair_lock(&name).force_unlock().await.unwrap());
    let got = within(HANG, "head after force_unlock", task)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    got.unlock().await.unwrap();
    assert!(
        !admin.fair_lock(&name).force_unlock().await.unwrap(),
        "free"
    );
    assert_clean(&raw, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_across_clients_never_overlaps_and_serves_everyone() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let name = unique("fair-contention");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&redis.url()).await;
        for _ in 0..3 {
            let lock = client.fair_lock(&name);
            let inside = Arc::clone(&inside);
            let overlaps = Arc::clone(&overlaps);
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = lock.lock().await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().await.unwrap();
                }
            }));
        }
        clients.push(client);
    }
    for task in tasks {
        within(HANG, "contending task", task).await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_clean(&raw, &name).await;
}

#[tokio::test]
async fn inspection_reports_what_redis_holds() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let client = client(&redis.url()).await;
    let name = unique("fair-inspect");
    let lock = client.fair_lock(&name);
    assert_eq!(lock.name(), name);
    assert_eq!(lock.waiter_timeout(), FairLock::DEFAULT_WAITER_TIMEOUT);
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(lock.remaining_ttl().await.unwrap(), None);
    assert_eq!(lock.hold_count().await.unwrap(), 0);

    let guard = lock.lock().await.unwrap();
    assert!(guard.is_watchdog());
    assert_eq!(guard.name(), name);
    assert_eq!(guard.fencing_token(), None);
    assert!(lock.is_locked().await.unwrap());
    assert!(lock.remaining_ttl().await.unwrap().is_some());
    // Same hash as the reentrant lock: one owner count and one hold marker; no queue.
    let fields: HashMap<String, String> = raw.hgetall(&keys(&name)[0]).await.unwrap();
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert_eq!(fields.keys().filter(|k| k.starts_with('#')).count(), 1);
    assert!(queue(&raw, &name).await.is_empty());
    guard.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_sent() {
    fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
        match result {
            Err(Error::InvalidArgument(msg)) => msg,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let client = client(&redis.url()).await;
    let name = unique("fair-bad");
    let lock = client.fair_lock(&name);
    assert!(invalid(lock.try_lock(Duration::ZERO, Some(Duration::ZERO)).await).contains("lease"));
    assert!(invalid(lock.lock_with_lease(Duration::MAX).await).contains("lease"));
    invalid(
        lock.try_lock(
            Duration::from_secs(1),
            Some(MAX_LEASE + Duration::from_secs(1)),
        )
        .await,
    );
    for timeout in [Duration::ZERO, Duration::from_millis(99), MAX_LEASE * 2] {
        assert!(invalid(lock.clone().with_waiter_timeout(timeout)).contains("waiter timeout"));
    }
    assert!(invalid(client.fair_lock("").lock().await).contains("empty"));
    let long = "x".repeat(lockkit::protocol::keys::MAX_NAME_LEN + 1);
    invalid(client.fair_lock(long).try_lock(Duration::ZERO, None).await);
    invalid(client.fair_lock("").is_locked().await);
    invalid(client.fair_lock("").force_unlock().await);
    assert_clean(&raw, &name).await;

    // A queue key written by someone else is reported, not clobbered.
    let _: String = command(&raw, "SET", &[&keys(&name)[1], "not a list"]).await;
    let result = lock.try_lock(Duration::from_secs(1), None).await;
    assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
    let value: String = command(&raw, "GET", &[&keys(&name)[1]]).await;
    assert_eq!(value, "not a list");
    assert!(!lock.is_locked().await.unwrap(), "nothing was taken");
}

/// Takes and gives back another fair lock, so the scripts are cached on the server and the
/// request whose reply gets lost is the script itself, not a `NOSCRIPT` answer.
async fn warm_up(client: &lockkit::Client) {
    let guard = client.fair_lock(unique("warm-up")).lock().await.unwrap();
    guard.unlock().await.unwrap();
}

/// The server queues the waiter, the reply is lost and the connection drops; fred re-sends the
/// same request. The waiter must be queued once, and later counted once.
#[tokio::test]
async fn an_acquire_replayed_after_a_lost_reply_queues_and_counts_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let raw = raw(&server.url()).await;
    let holder = client(&server.url()).await;
    let waiting = client(&proxy.url()).await;
    warm_up(&waiting).await;
    let name = unique("fair-replay");
    let guard = holder.fair_lock(&name).lock().await.unwrap();

    proxy.cut_after_request_containing(keys(&name)[0].clone());
    let lock = waiting.fair_lock(&name);
    let task = tokio::spawn(async move { lock.lock().await });
    within(HANG, "cut", proxy.wait_triggered()).await;
    until_waiting(&waiting, 1).await;
    assert_eq!(queue(&raw, &name).await.len(), 1, "queued once");

    guard.unlock().await.unwrap();
    let got = within(HANG, "waiter after the release", task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.hold_count(), 1);
    let fields: HashMap<String, String> = raw.hgetall(&keys(&name)[0]).await.unwrap();
    assert_eq!(
        fields.len(),
        2,
        "one owner count and one marker: {fields:?}"
    );
    got.unlock().await.unwrap();
    assert_clean(&raw, &name).await;
    let _ = raw.quit().await;
}
