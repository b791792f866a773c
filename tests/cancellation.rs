//! Dropping futures at any point leaves nothing held.

use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit_suite::{client, redis, spawned, unique, within};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_cancelled_waiter_leaves_no_registration_and_no_hold() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let name = unique("cancel-wait");
    let guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiter.lock(&name);
    let result = tokio::time::timeout(Duration::from_millis(200), lock.lock()).await;
    assert!(result.is_err(), "still waiting when cancelled");
    assert_eq!(waiter.waiting_count(), 0);
    // The request leaves the waiting set in the background.
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 0).await;
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "granted to nobody");
    assert_eq!(waiter.held_count(), 0);
}

/// A release that comes before the cancelled waiter's request has left grants the lock to that
/// request (its client still listens); the request's leaving then gives the grant back at once,
/// long before the grant's probation (5 s) or the lease (30 s) would end it.
#[tokio::test]
async fn a_grant_to_a_cancelled_waiter_is_given_back_at_once() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let next = client(&redis.url()).await;
    let name = unique("cancel-granted");
    let guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiter.lock(&name);
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    lockkit_suite::until_waiting(&waiter, 1).await;
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 1).await;
    // Cancel the wait and release at once: the release may reach Redis before the cancel does.
    waiting.abort();
    let (unlocked, _) = tokio::join!(guard.unlock(), async { waiting.await.ok() });
    unlocked.unwrap();
    // Whichever came first, the lock ends up free: `next` takes it with a zero wait once it is.
    let got = within(HANG, "the lock to be free again", async {
        loop {
            if let Some(guard) = next
                .lock(&name)
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
            {
                return guard;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(waiter.held_count(), 0);
    got.unlock().await.unwrap();
}

/// The acquire script is on its way (held back by a paused proxy) when the future is dropped.
/// Once the proxy lets it through, the script takes the lock; the drop guard must give it back.
#[tokio::test]
async fn an_acquire_dropped_in_flight_gives_back_what_the_script_took() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let cancelled = client(&proxy.url()).await;
    let observer = client(&server.url()).await;
    let name = unique("cancel-acquire");

    proxy.pause();
    let lock = cancelled.lock(&name);
    let attempt = tokio::time::timeout(
        Duration::from_millis(200),
        lock.try_lock(Duration::ZERO, Some(Duration::from_secs(60))),
    )
    .await;
    assert!(
        attempt.is_err(),
        "the acquire could not complete through a paused proxy"
    );
    proxy.resume();

    // The 60 s lease would outlast this wait: only the background release frees it in time.
    let got = within(
        HANG,
        "acquire after the cancelled one",
        observer.lock(&name).try_lock(Duration::from_secs(30), None),
    )
    .await
    .unwrap();
    assert!(got.is_some(), "the cancelled acquire's hold was given back");
}

#[tokio::test]
async fn an_unlock_dropped_in_flight_still_releases() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    let observer = client(&server.url()).await;
    let name = unique("cancel-unlock");
    let guard = holder
        .lock(&name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    proxy.pause();
    let unlock = tokio::time::timeout(Duration::from_millis(200), guard.unlock()).await;
    assert!(
        unlock.is_err(),
        "the unlock could not complete through a paused proxy"
    );
    proxy.resume();
    let got = within(
        HANG,
        "acquire after the cancelled unlock",
        observer.lock(&name).try_lock(Duration::from_secs(30), None),
    )
    .await
    .unwrap();
    assert!(got.is_some());
}

// ================================================================================================
// Issue 27 §2, item 8: an acquire future dropped outside any tokio runtime (on a plain thread)
// leaves its place in line at once, as one dropped on the runtime does. Its entry used to stay
// until its keep-alive ran out: a lock's next waiter then waited for the probation of a grant
// made to the dropped call, a fair lock's up to its own timeout.
//
// Each test polls the acquire future on the runtime until its entry is in Redis, moves it to a
// plain thread and drops it there. The ordering checked, on the server's clock: the entry is
// gone, and the next waiter holds the lock, before the dropped call's keep-alive deadline (the
// earliest the entry would have gone on its own).
// ================================================================================================

/// The server's clock (ms).
async fn server_clock(server: &lockkit_testkit::RedisServer) -> u64 {
    let time = lockkit_testkit::send_command(server.addr(), &["TIME"])
        .await
        .unwrap();
    lockkit_suite::server_ms(&time)
}

/// The members of the waiting structure `key` (a ZSET or, for a fair lock's queue, a LIST).
async fn members(server: &lockkit_testkit::RedisServer, key: &str) -> Vec<String> {
    let kind = lockkit_testkit::send_command(server.addr(), &["TYPE", key])
        .await
        .unwrap();
    let range = match kind.as_str() {
        Some("list") => "LRANGE",
        _ => "ZRANGE",
    };
    let items = lockkit_testkit::send_command(server.addr(), &[range, key, "0", "-1"])
        .await
        .unwrap();
    items
        .as_array()
        .unwrap_or_default()
        .iter()
        .map(|item| item.as_str().expect("a member").to_owned())
        .collect()
}

/// The keep-alive deadline (server ms) of the one entry of client `id` in the ZSET `timeouts`.
async fn deadline_of(server: &lockkit_testkit::RedisServer, timeouts: &str, id: &str) -> u64 {
    let entry = members(server, timeouts)
        .await
        .into_iter()
        .find(|member| member.contains(id))
        .expect("the dropped call's entry is in line");
    let score = lockkit_testkit::send_command(server.addr(), &["ZSCORE", timeouts, &entry])
        .await
        .unwrap();
    score.as_str().expect("a score").parse().expect("ms")
}

/// Polls `future` on this task until `queued` resolves; it must not finish first.
async fn poll_until_queued<F>(future: &mut F, queued: impl std::future::Future<Output = ()>)
where
    F: std::future::Future + Unpin,
    F::Output: std::fmt::Debug,
{
    within(HANG, "the acquire to join the line", async {
        tokio::select! {
            out = future => panic!("finished before it was in line: {out:?}"),
            () = queued => {}
        }
    })
    .await;
}

/// Drops `value` on a plain thread, outside any tokio runtime.
fn drop_outside_any_runtime<T: Send + 'static>(value: T) {
    std::thread::spawn(move || {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "no runtime on this thread"
        );
        drop(value);
    })
    .join()
    .expect("the drop did not panic");
}

/// Waits until client `id` has no entry in `key` any more, and checks that this happened before
/// `deadline` (server ms): the entry was taken out, it did not run out.
async fn left_before(
    server: &lockkit_testkit::RedisServer,
    key: &str,
    id: &str,
    deadline: u64,
    what: &str,
) {
    within(HANG, "the dropped call to leave the line", async {
        while members(server, key).await.iter().any(|m| m.contains(id)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let now = server_clock(server).await;
    assert!(
        now < deadline,
        "{what}: the dropped call's entry only went when its keep-alive ran out ({now} >= \
         {deadline})"
    );
}

/// A `Lock`'s waiter dropped off the runtime leaves; the release grants the next waiter at once.
#[tokio::test]
async fn a_lock_wait_dropped_outside_a_runtime_leaves_the_line() {
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let dropped = client(&server.url()).await;
    let next = client(&server.url()).await;
    let name = unique("drop-off-runtime-lock");
    let keys = lockkit::protocol::keys::Namespace::default()
        .lock(&name)
        .unwrap();
    let (waiting, timeouts) = (keys.aux("waiting").unwrap(), keys.aux("timeouts").unwrap());
    let held = holder.lock(&name).lock().await.unwrap();
    let mut wait = Box::pin({
        let lock = dropped.lock(&name);
        async move { lock.lock().await }
    });
    poll_until_queued(
        &mut wait,
        lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 1),
    )
    .await;
    let next_wait = tokio::spawn({
        let lock = next.lock(&name);
        async move { lock.lock().await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 2).await;
    let deadline = deadline_of(&server, timeouts, dropped.id()).await;

    drop_outside_any_runtime(wait);
    left_before(&server, waiting, dropped.id(), deadline, "Lock").await;
    // The release grants the lock to the next waiter, in the same script.
    held.unlock().await.unwrap();
    let holders = holder.inspect(Some(Kind::Lock), &name).await.unwrap();
    assert!(
        holders[0].holders[0]
            .owner
            .starts_with(&format!("{}:", next.id())),
        "granted to the next waiter, not to the dropped call: {holders:?}"
    );
    let got = within(HANG, "the next waiter", next_wait)
        .await
        .unwrap()
        .unwrap();
    assert!(server_clock(&server).await < deadline);
    got.unlock().await.unwrap();
}

/// A `FairLock`'s waiter dropped off the runtime leaves its queue; the next waiter is named next
/// and takes the lock before the dropped one's keep-alive would have run out.
#[tokio::test]
async fn a_fair_lock_wait_dropped_outside_a_runtime_leaves_the_queue() {
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let dropped = client(&server.url()).await;
    let next = client(&server.url()).await;
    let name = unique("drop-off-runtime-fair");
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(Kind::FairLock, &name)
        .unwrap();
    let (queue, timeouts) = (
        keys.aux("queue").unwrap().to_owned(),
        keys.aux("timeouts").unwrap().to_owned(),
    );
    let held = holder.fair_lock(&name).lock().await.unwrap();
    let mut wait = Box::pin({
        let lock = dropped.fair_lock(&name);
        async move { lock.lock().await }
    });
    poll_until_queued(
        &mut wait,
        lockkit_suite::until_waiters_in_redis(&holder, Kind::FairLock, &name, 1),
    )
    .await;
    let next_wait = tokio::spawn({
        let lock = next.fair_lock(&name);
        async move { lock.lock().await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, Kind::FairLock, &name, 2).await;
    let deadline = deadline_of(&server, &timeouts, dropped.id()).await;

    drop_outside_any_runtime(wait);
    left_before(&server, &queue, dropped.id(), deadline, "FairLock").await;
    held.unlock().await.unwrap();
    let got = within(HANG, "the next waiter", next_wait)
        .await
        .unwrap()
        .unwrap();
    let now = server_clock(&server).await;
    assert!(
        now < deadline,
        "FairLock: the next waiter got the lock only once the dropped call's keep-alive ran out"
    );
    got.unlock().await.unwrap();
}

/// An election's campaign dropped off the runtime while it waits leaves the line: the leader's
/// resignation makes the next candidate the leader at once.
#[tokio::test]
async fn a_campaign_dropped_outside_a_runtime_leaves_the_line() {
    let server = spawned().await;
    let leader = client(&server.url()).await;
    let dropped = client(&server.url()).await;
    let next = client(&server.url()).await;
    let name = unique("drop-off-runtime-election");
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(Kind::Election, &name)
        .unwrap();
    let (waiting, timeouts) = (
        keys.aux("waiting").unwrap().to_owned(),
        keys.aux("timeouts").unwrap().to_owned(),
    );
    let leading = leader.election(&name).campaign("a").await.unwrap();
    let mut campaign = Box::pin({
        let election = dropped.election(&name);
        async move { election.campaign("dropped").await }
    });
    poll_until_queued(
        &mut campaign,
        lockkit_suite::until_waiters_in_redis(&leader, Kind::Election, &name, 1),
    )
    .await;
    let next_campaign = tokio::spawn({
        let election = next.election(&name);
        async move { election.campaign("next").await }
    });
    lockkit_suite::until_waiters_in_redis(&leader, Kind::Election, &name, 2).await;
    let deadline = deadline_of(&server, &timeouts, dropped.id()).await;

    drop_outside_any_runtime(campaign);
    left_before(&server, &waiting, dropped.id(), deadline, "Election").await;
    leading.resign().await.unwrap();
    let leads = within(HANG, "the next candidate", next_campaign)
        .await
        .unwrap()
        .unwrap();
    assert!(
        server_clock(&server).await < deadline,
        "Election: the next candidate led only once the dropped campaign's keep-alive ran out"
    );
    assert_eq!(leads.value(), "next");
    leads.resign().await.unwrap();
}

/// A leadership dropped off the runtime (as a campaign future dropped during its announcement
/// drops the one it just built) resigns: its record goes, as when it is dropped on the runtime.
#[tokio::test]
async fn a_leadership_dropped_outside_a_runtime_resigns() {
    let server = spawned().await;
    let leader = client(&server.url()).await;
    let name = unique("drop-off-runtime-leadership");
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(Kind::Election, &name)
        .unwrap();
    let record = keys.aux("leader").unwrap().to_owned();
    let leading = leader.election(&name).campaign("a").await.unwrap();
    let exists = |server: &lockkit_testkit::RedisServer| {
        let addr = server.addr();
        let record = record.clone();
        async move {
            lockkit_testkit::send_command(addr, &["EXISTS", &record])
                .await
                .unwrap()
                .as_int()
                == Some(1)
        }
    };
    assert!(exists(&server).await, "the leader's record");
    drop_outside_any_runtime(leading);
    within(HANG, "the resignation", async {
        while exists(&server).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(leader.election(&name).leader().await.unwrap().is_none());
}

/// A waiting call whose client shuts down is out of its object's line when it returns
/// `Error::Shutdown`, for every kind whose waiters stand in a line in Redis: the leave is part of
/// the call, not work left in the background. The waiting client runs on a runtime of its own,
/// dropped as soon as the call has returned (as a program ends after its shutdown): work left for
/// later never runs, and an entry it was to remove stays listed.
#[test]
fn a_call_cut_short_by_shutdown_has_left_the_line_when_it_returns() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = main.block_on(spawned());
    let url = server.url();
    let observer = main.block_on(client(&url));
    for kind in [
        Kind::Lock,
        Kind::FairLock,
        Kind::ReadWriteLock,
        Kind::Semaphore,
    ] {
        let name = unique("shutdown-leaves");
        // The object is taken, by a client that stays.
        let held = main.block_on(async {
            match kind {
                Kind::Lock => Held::Lock(observer.lock(&name).lock().await.unwrap()),
                Kind::FairLock => Held::Lock(observer.fair_lock(&name).lock().await.unwrap()),
                Kind::ReadWriteLock => {
                    Held::Lock(observer.read_write_lock(&name).write_lock().await.unwrap())
                }
                _ => {
                    let semaphore = observer.semaphore(&name);
                    assert!(semaphore.try_set_permits(1).await.unwrap());
                    Held::Permit(semaphore.acquire(1).await.unwrap())
                }
            }
        });
        let (waiter_url, waiter_name) = (url.clone(), name.clone());
        let returned = std::thread::spawn(move || {
            let own = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let returned = own.block_on(async {
                let waiter = client(&waiter_url).await;
                let call = async {
                    match kind {
                        Kind::Lock => waiter.lock(&waiter_name).lock().await.map(drop),
                        Kind::FairLock => waiter.fair_lock(&waiter_name).lock().await.map(drop),
                        Kind::ReadWriteLock => waiter
                            .read_write_lock(&waiter_name)
                            .read_lock()
                            .await
                            .map(drop),
                        _ => waiter.semaphore(&waiter_name).acquire(1).await.map(drop),
                    }
                };
                let shut_down = async {
                    within(HANG, "the call to wait", async {
                        while waiter.waiting_count() < 1 {
                            tokio::task::yield_now().await;
                        }
                    })
                    .await;
                    waiter.shutdown().await
                };
                let (call, shut_down) = tokio::join!(call, shut_down);
                shut_down.unwrap();
                call
            });
            // The program ends: nothing left on this runtime runs any more.
            drop(own);
            returned
        })
        .join()
        .unwrap();
        assert!(
            matches!(returned, Err(lockkit::Error::Shutdown)),
            "{kind:?}: {returned:?}"
        );
        let listed = main.block_on(observer.inspect(Some(kind), &name)).unwrap();
        assert!(
            listed[0].waiters.is_empty(),
            "{kind:?}: the shut-down call is still in line: {:?}",
            listed[0].waiters
        );
        main.block_on(async {
            match held {
                Held::Lock(guard) => guard.unlock().await.unwrap(),
                Held::Permit(permit) => permit.release().await.unwrap(),
            }
        });
    }
}

/// What the observer holds while a call of another client waits.
enum Held {
    Lock(lockkit::LockGuard),
    Permit(lockkit::SemaphorePermit),
}

/// As [`a_call_cut_short_by_shutdown_has_left_the_line_when_it_returns`], for a multi-lock
/// waiting in its busy member's line: that member's line is empty when the call returns
/// `Error::Shutdown`.
#[test]
fn a_multi_lock_cut_short_by_shutdown_has_left_its_members_lines_when_it_returns() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = main.block_on(spawned());
    let url = server.url();
    let observer = main.block_on(client(&url));
    let (busy, free) = (unique("shutdown-multi-busy"), unique("shutdown-multi-free"));
    let held = main.block_on(observer.lock(&busy).lock()).unwrap();
    let (waiter_url, names) = (url.clone(), (busy.clone(), free.clone()));
    let returned = std::thread::spawn(move || {
        let own = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let returned = own.block_on(async {
            let waiter = client(&waiter_url).await;
            let multi = waiter.multi_lock([waiter.lock(&names.0), waiter.lock(&names.1)]);
            let call = async { multi.lock().await.map(drop) };
            let shut_down = async {
                within(HANG, "the call to wait", async {
                    while waiter.waiting_count() < 1 {
                        tokio::task::yield_now().await;
                    }
                })
                .await;
                waiter.shutdown().await
            };
            let (call, shut_down) = tokio::join!(call, shut_down);
            shut_down.unwrap();
            call
        });
        drop(own);
        returned
    })
    .join()
    .unwrap();
    assert!(
        matches!(returned, Err(lockkit::Error::Shutdown)),
        "{returned:?}"
    );
    let listed = main
        .block_on(observer.inspect(Some(Kind::Lock), &busy))
        .unwrap();
    assert!(
        listed[0].waiters.is_empty(),
        "the shut-down multi-lock is still in line: {:?}",
        listed[0].waiters
    );
    main.block_on(held.unlock()).unwrap();
}
