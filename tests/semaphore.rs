//! The semaphores — `Semaphore` (leased permits) and `PermitExpirableSemaphore` (permits with ids)
//! — against a real redis-server, with several clients.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::LuaInterface;
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::{Error, ExpirablePermit, SemaphorePermit};
use lockkit_suite::{
    client, client_with, client_woken_only, raw, redis, spawned, unique, until_waiting, within,
};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(30);
const LONG: Duration = Duration::from_secs(60);
/// Longer than any waiter's patience (`LONG`), which is longer than the hang guard (`HANG`): a
/// waiter that is not woken by a message sleeps past the guard.
const LEASE: Duration = Duration::from_secs(120);

fn keys(kind: Kind, name: &str) -> Vec<String> {
    Namespace::default().object(kind, name).unwrap().keys
}

/// What Redis holds for one hold: the permits recorded under its marker and its remaining lease
/// (server clock), or `None` when the hold is not there.
async fn hold_in_redis(url: &str, kind: Kind, name: &str, id: &str) -> Option<(i64, i64)> {
    let script = "local s = redis.call('ZSCORE', KEYS[2], ARGV[1]) \
                  if not s then return {} end \
                  local t = redis.call('TIME') \
                  return {tonumber(redis.call('HGET', KEYS[1], ARGV[1])), \
                          tonumber(s) - (t[1] * 1000 + math.floor(t[2] / 1000))}";
    let reply: Vec<i64> = raw(url)
        .await
        .eval(script, keys(kind, name), vec![id.to_owned()])
        .await
        .unwrap();
    match reply.as_slice() {
        [] => None,
        [permits, remaining] => Some((*permits, *remaining)),
        other => panic!("unexpected {other:?}"),
    }
}

fn refused<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::Refused { reason, .. }) => reason,
        other => panic!("expected Refused, got {other:?}"),
    }
}

fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(why)) => why,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

// === Semaphore ===

#[tokio::test]
async fn k_permit_acquisitions_take_and_give_back_k() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let sem = client.semaphore(unique("k-permits"));
    assert!(sem.try_set_permits(5).await.unwrap());
    assert_eq!(sem.available_permits().await.unwrap(), 5);

    let three = sem
        .try_acquire(3, Duration::ZERO, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(three.permits(), 3);
    assert_eq!(sem.available_permits().await.unwrap(), 2);
    assert!(
        sem.try_acquire(3, Duration::ZERO, None)
            .await
            .unwrap()
            .is_none(),
        "3 of the 2 free"
    );
    let two = sem
        .try_acquire(2, Duration::ZERO, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    assert!(sem
        .try_acquire(1, Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());

    three.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 3);
    two.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 5);
    assert_eq!(client.held_count(), 0);
}

/// 12 tasks on 3 clients take one of 3 permits, 5 times each. The first 3 holders wait for each
/// other while holding (so 3 at once must be possible, or the test hangs); at no point may a 4th
/// be inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_holders_than_permits_across_three_clients() {
    const PERMITS: u64 = 3;
    let redis = redis().await;
    let name = unique("contention");
    let clients = [
        client(&redis.url()).await,
        client(&redis.url()).await,
        client(&redis.url()).await,
    ];
    assert!(clients[0]
        .semaphore(&name)
        .try_set_permits(PERMITS)
        .await
        .unwrap());
    let inside = Arc::new(AtomicU64::new(0));
    let max = Arc::new(AtomicU64::new(0));
    let first_holders = Arc::new(AtomicU64::new(0));
    let all_in = Arc::new(tokio::sync::Barrier::new(PERMITS as usize));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..4 {
            let sem = client.semaphore(&name);
            let (inside, max) = (Arc::clone(&inside), Arc::clone(&max));
            let (first_holders, all_in) = (Arc::clone(&first_holders), Arc::clone(&all_in));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let permit = sem.acquire(1).await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(now, Ordering::SeqCst);
                    if first_holders.fetch_add(1, Ordering::SeqCst) < PERMITS {
                        all_in.wait().await;
                    }
                    for _ in 0..10 {
                        tokio::task::yield_now().await;
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        within(HANG, "contending holders", task).await.unwrap();
    }
    assert_eq!(
        max.load(Ordering::SeqCst),
        PERMITS,
        "never more than {PERMITS} inside, and {PERMITS} at once reached"
    );
    assert_eq!(
        clients[0]
            .semaphore(&name)
            .available_permits()
            .await
            .unwrap(),
        PERMITS
    );
}

/// A release of 3 permits wakes 3 waiters. Every lease outlasts the waiters' patience, which
/// outlasts the hang guard, and the waiters do not look again on their own: only the release
/// message can let all three in in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_k_permits_wakes_k_waiters() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiters = client_woken_only(&redis.url()).await;
    let name = unique("wake-k");
    let sem = holder.semaphore(&name);
    sem.try_set_permits(3).await.unwrap();
    let all = sem.acquire_with_lease(3, LEASE).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let sem = waiters.semaphore(&name);
        tasks.push(tokio::spawn(
            async move { sem.try_acquire(1, LONG, None).await },
        ));
    }
    until_waiting(&waiters, 3).await;
    all.release().await.unwrap();
    let mut permits: Vec<SemaphorePermit> = Vec::new();
    for task in tasks {
        let got = within(HANG, "woken waiter", task).await.unwrap().unwrap();
        permits.push(got.expect("woken by the release of 3 permits"));
    }
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    for permit in permits {
        permit.release().await.unwrap();
    }
}

/// A holder process dies (its runtime is dropped: no release, no renewal). While it lived, the
/// watchdog kept its permits past their lease; once it is gone, they come back when the lease ends.
#[tokio::test]
async fn a_crashed_holders_permits_come_back_when_its_lease_ends() {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("crash");
    let survivor = client(&url).await;
    let sem = survivor.semaphore(&name);
    sem.try_set_permits(2).await.unwrap();

    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let (url, name) = (url.clone(), name.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let client = client_with(&url, Duration::from_millis(900)).await;
                let permit = client.semaphore(&name).acquire(2).await.unwrap();
                held_tx.send(()).unwrap();
                let _ = kill_rx.await;
                std::mem::forget(permit); // the process dies holding it
            });
            drop(runtime); // kills the watchdog and the connections
        })
    };
    within(HANG, "holder start", held_rx).await.unwrap();
    // 2 s is more than two leases: only renewal keeps the permits taken that long.
    assert!(
        sem.try_acquire(1, Duration::from_secs(2), None)
            .await
            .unwrap()
            .is_none(),
        "the live holder's watchdog keeps its permits"
    );
    kill_tx.send(()).unwrap();
    holder.join().unwrap();

    let back = within(HANG, "acquire after the crash", sem.acquire(2))
        .await
        .unwrap();
    back.release().await.unwrap();
}

#[tokio::test]
async fn a_lease_that_ran_out_gives_the_permits_back_and_its_release_is_not_held() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let other = client(&redis.url()).await;
    let name = unique("expired");
    let sem = holder.semaphore(&name);
    sem.try_set_permits(1).await.unwrap();
    let permit = sem
        .acquire_with_lease(1, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(!permit.is_watchdog());
    within(HANG, "lease end", permit.lost()).await;
    assert!(permit.is_lost());
    let taken = within(
        HANG,
        "acquire after expiry",
        other.semaphore(&name).acquire(1),
    )
    .await
    .unwrap();
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        sem.available_permits().await.unwrap(),
        0,
        "the late release took nothing from the new holder"
    );
    taken.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
}

#[tokio::test]
async fn a_dropped_permit_and_a_cancelled_acquire_leave_nothing_taken() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let sem = client.semaphore(unique("dropped"));
    sem.try_set_permits(1).await.unwrap();
    let permit = sem.acquire_with_lease(1, LONG).await.unwrap();

    // A waiter given up on.
    let cancelled = tokio::time::timeout(Duration::from_millis(200), sem.acquire(1)).await;
    assert!(cancelled.is_err(), "still waiting when cancelled");
    assert_eq!(client.waiting_count(), 0);

    drop(permit);
    // The 60 s lease would outlast this wait: only the background release frees it in time.
    let again = within(
        HANG,
        "acquire after drop",
        sem.try_acquire(1, Duration::from_secs(20), None),
    )
    .await
    .unwrap();
    again
        .expect("released in the background")
        .release()
        .await
        .unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_set_once_and_added_or_removed_later() {
    let redis = redis().await;
    let admin = client(&redis.url()).await;
    // Looks again only when woken: a missing announcement would hang to the guard.
    let waiters = client_woken_only(&redis.url()).await;
    let name = unique("admin");
    let sem = admin.semaphore(&name);
    assert_eq!(sem.available_permits().await.unwrap(), 0, "never set");
    assert!(sem.try_set_permits(2).await.unwrap());
    assert!(!sem.try_set_permits(5).await.unwrap(), "set only once");
    assert_eq!(sem.available_permits().await.unwrap(), 2);

    let two = sem.acquire_with_lease(2, LEASE).await.unwrap();
    let waiting = {
        let sem = waiters.semaphore(&name);
        tokio::spawn(async move { sem.try_acquire(1, LONG, Some(LEASE)).await })
    };
    until_waiting(&waiters, 1).await;
    // Only the announcement of the added permit can wake the waiter before the hang guard.
    assert_eq!(sem.add_permits(1).await.unwrap(), 3);
    let one = within(HANG, "woken by an added permit", waiting)
        .await
        .unwrap()
        .unwrap()
        .expect("added permits are announced");
    assert_eq!(sem.available_permits().await.unwrap(), 0);

    // Removing permits takes none from holders: none is free until enough come back.
    assert_eq!(sem.add_permits(-2).await.unwrap(), 1);
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    one.release().await.unwrap();
    assert_eq!(
        sem.available_permits().await.unwrap(),
        0,
        "1 in total, 2 held"
    );
    two.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);

    let reason = refused(sem.add_permits(-2).await);
    assert!(reason.contains("total is 1"), "{reason}");
    let reason = refused(sem.add_permits(i64::from(u32::MAX)).await);
    assert!(reason.contains("most"), "{reason}");
    assert_eq!(
        sem.available_permits().await.unwrap(),
        1,
        "refusals change nothing"
    );

    // On a semaphore never set, adding sets the total.
    let fresh = admin.semaphore(unique("added"));
    assert_eq!(fresh.add_permits(2).await.unwrap(), 2);
    assert!(!fresh.try_set_permits(9).await.unwrap());
    assert_eq!(fresh.available_permits().await.unwrap(), 2);
}

#[tokio::test]
async fn bad_input_is_refused_clearly_and_at_once() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let sem = client.semaphore(unique("bad-input"));

    let reason = refused(sem.try_acquire(1, Duration::ZERO, None).await);
    assert!(reason.contains("never set"), "{reason}");
    sem.try_set_permits(2).await.unwrap();

    let why = invalid(sem.try_acquire(0, Duration::ZERO, None).await);
    assert!(why.contains("zero permits"), "{why}");
    invalid(sem.try_acquire(u64::MAX, Duration::ZERO, None).await);
    invalid(sem.try_set_permits(u64::MAX).await);
    invalid(sem.add_permits(i64::MIN).await);
    invalid(
        sem.try_acquire(1, Duration::ZERO, Some(Duration::ZERO))
            .await,
    );
    invalid(client.semaphore("").available_permits().await);

    // More than the total would never be granted: refused now, not after waiting forever.
    let reason = refused(within(HANG, "acquire 3 of 2", sem.acquire(3)).await);
    assert!(
        reason.contains("3 permits") && reason.contains("only 2"),
        "{reason}"
    );
    assert_eq!(client.waiting_count(), 0);

    // Total reduced below a waiter's request while it waits: the waiter is refused too. (With the
    // holder still holding, and refused at once: tests/total_changes.rs.)
    let held = sem.acquire_with_lease(2, LONG).await.unwrap();
    let waiting = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(2).await })
    };
    until_waiting(&client, 1).await;
    sem.add_permits(-1).await.unwrap();
    held.release().await.unwrap(); // wakes the waiter, which finds 1 in total
    let reason = refused(within(HANG, "waiter refused", waiting).await.unwrap());
    assert!(reason.contains("only 1"), "{reason}");
    assert_eq!(sem.available_permits().await.unwrap(), 1);
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_reported_not_clobbered() {
    use fred::interfaces::KeysInterface;
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("wrongtype");
    let main = keys(Kind::Semaphore, &name).remove(0);
    let store = raw(&redis.url()).await;
    let _: () = store.set(&main, "mine", None, None, false).await.unwrap();
    let sem = client.semaphore(&name);
    for result in [
        sem.try_acquire(1, Duration::ZERO, None).await.map(|_| ()),
        sem.available_permits().await.map(|_| ()),
        sem.add_permits(1).await.map(|_| ()),
    ] {
        assert!(
            matches!(&result, Err(Error::WrongType { key, .. }) if *key == main),
            "{result:?}"
        );
    }
    let value: String = store.get(&main).await.unwrap();
    assert_eq!(value, "mine");
}

/// The server runs the acquire, the reply is lost and the connection drops; fred re-sends the same
/// request. The permits must be taken once.
#[tokio::test]
async fn an_acquire_replayed_after_a_lost_reply_takes_the_permits_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    // Cache the scripts, so the request whose reply is lost is the script itself.
    let warm = client.semaphore(unique("warm-up"));
    warm.try_set_permits(1).await.unwrap();
    warm.acquire(1).await.unwrap().release().await.unwrap();

    let name = unique("replay");
    let sem = client.semaphore(&name);
    sem.try_set_permits(3).await.unwrap();
    proxy.cut_after_request_containing(keys(Kind::Semaphore, &name).remove(0));
    let permit = within(HANG, "acquire across a cut", sem.acquire(1))
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(
        sem.available_permits().await.unwrap(),
        2,
        "1 of 3 taken, once"
    );
    permit.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 3);
}

// === PermitExpirableSemaphore ===

/// A permit taken by one client is released by id by another; a third client waiting for it is
/// woken by the release (its lease would outlast the waiter's patience and the hang guard, and
/// the waiter does not look again on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_released_by_id_from_another_client() {
    let redis = redis().await;
    let taker = client(&redis.url()).await;
    let releaser = client(&redis.url()).await;
    let waiter = client_woken_only(&redis.url()).await;
    let name = unique("by-id");
    let sem = taker.permit_expirable_semaphore(&name);
    sem.try_set_permits(1).await.unwrap();
    let id = sem.acquire(LEASE).await.unwrap().into_id();
    assert_eq!(taker.held_count(), 0, "into_id lets go of the guard");
    assert_eq!(
        sem.available_permits().await.unwrap(),
        0,
        "the permit stays taken"
    );

    let waiting = {
        let sem = waiter.permit_expirable_semaphore(&name);
        tokio::spawn(async move { sem.try_acquire(LONG, LEASE).await })
    };
    until_waiting(&waiter, 1).await;
    let remote = releaser.permit_expirable_semaphore(&name);
    remote.release(&id).await.unwrap();
    let next = within(HANG, "woken by the release by id", waiting)
        .await
        .unwrap()
        .unwrap()
        .expect("the release by id wakes a waiter");
    assert_ne!(next.id(), id, "every acquisition has its own id");
    assert!(matches!(
        remote.release(&id).await,
        Err(Error::NotHeld { .. })
    ));
    next.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
}

/// A guard whose permit was released by id elsewhere learns it at its client's next check.
#[tokio::test]
async fn a_guard_whose_permit_was_released_elsewhere_is_lost() {
    let redis = redis().await;
    let taker = client_with(&redis.url(), Duration::from_millis(300)).await;
    let other = client(&redis.url()).await;
    let name = unique("released-elsewhere");
    let sem = taker.permit_expirable_semaphore(&name);
    sem.try_set_permits(1).await.unwrap();
    let permit: ExpirablePermit = sem.acquire(LONG).await.unwrap();
    assert!(!permit.is_lost());
    other
        .permit_expirable_semaphore(&name)
        .release(permit.id())
        .await
        .unwrap();
    within(HANG, "lost signal", permit.lost()).await;
    assert!(permit.is_lost());
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn a_permits_lease_is_updated_by_id() {
    let redis = redis().await;
    let url = redis.url();
    let holder = client(&url).await;
    let other = client(&url).await;
    let name = unique("update-lease");
    let sem = holder.permit_expirable_semaphore(&name);
    sem.try_set_permits(1).await.unwrap();
    let id = sem.acquire(Duration::from_secs(5)).await.unwrap().into_id();
    let kind = Kind::PermitExpirableSemaphore;
    let (permits, remaining) = hold_in_redis(&url, kind, &name, &id).await.unwrap();
    assert!(permits == 1 && remaining <= 5_000, "{permits} {remaining}");

    assert!(sem
        .update_lease(&id, Duration::from_secs(3600))
        .await
        .unwrap());
    let (_, remaining) = hold_in_redis(&url, kind, &name, &id).await.unwrap();
    assert!(remaining > 5_000, "lengthened: {remaining} ms left");

    // Shortened: it ends (almost) now, and another client gets the permit.
    assert!(sem
        .update_lease(&id, Duration::from_millis(1))
        .await
        .unwrap());
    let next = within(
        HANG,
        "acquire after the shortened lease",
        other.permit_expirable_semaphore(&name).acquire(LONG),
    )
    .await
    .unwrap();
    assert!(!sem.update_lease(&id, LONG).await.unwrap(), "gone");
    assert!(hold_in_redis(&url, kind, &name, &id).await.is_none());
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_permit_comes_back_when_its_lease_ends() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let other = client(&redis.url()).await;
    let name = unique("pes-expiry");
    let sem = holder.permit_expirable_semaphore(&name);
    sem.try_set_permits(1).await.unwrap();
    let permit = sem.acquire(Duration::from_millis(200)).await.unwrap();
    within(HANG, "lease end", permit.lost()).await;
    let next = within(
        HANG,
        "acquire after expiry",
        other.permit_expirable_semaphore(&name).acquire(LONG),
    )
    .await
    .unwrap();
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    next.release().await.unwrap();
}

#[tokio::test]
async fn permit_expirable_bad_input_is_refused_clearly() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let sem = client.permit_expirable_semaphore(unique("pes-bad"));
    let reason = refused(sem.try_acquire(Duration::ZERO, LONG).await);
    assert!(reason.contains("never set"), "{reason}");
    assert!(sem.try_set_permits(0).await.unwrap());
    let reason = refused(within(HANG, "acquire of 0 in total", sem.acquire(LONG)).await);
    assert!(reason.contains("only 0"), "{reason}");

    invalid(sem.try_acquire(Duration::ZERO, Duration::ZERO).await);
    invalid(sem.release("").await);
    invalid(sem.release("permits").await);
    invalid(sem.update_lease("used", LONG).await);
    invalid(sem.update_lease("#x:1", Duration::ZERO).await);
    assert!(matches!(
        sem.release("#nobody:1").await,
        Err(Error::NotHeld { .. })
    ));
    assert!(!sem.update_lease("#nobody:1", LONG).await.unwrap());
}

/// Permits of both kinds under contention: the same invariant, from 3 clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_expirable_permits_out_than_the_total() {
    const PERMITS: u64 = 2;
    let redis = redis().await;
    let name = unique("pes-contention");
    let clients = [
        client(&redis.url()).await,
        client(&redis.url()).await,
        client(&redis.url()).await,
    ];
    clients[0]
        .permit_expirable_semaphore(&name)
        .try_set_permits(PERMITS)
        .await
        .unwrap();
    let inside = Arc::new(AtomicU64::new(0));
    let overlap = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..3 {
            let sem = client.permit_expirable_semaphore(&name);
            let (inside, overlap) = (Arc::clone(&inside), Arc::clone(&overlap));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let permit = sem.acquire(LONG).await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) + 1 > PERMITS {
                        overlap.store(true, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        within(HANG, "contending permits", task).await.unwrap();
    }
    assert!(
        !overlap.load(Ordering::SeqCst),
        "more than {PERMITS} out at once"
    );
}
