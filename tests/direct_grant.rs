//! The direct grant of `Lock` and `FencedLock` (issue 20), through the client: a release hands the
//! lock to the longest-waiting call in the same script, tells only that call's client, and the call
//! returns holding it without a script call of its own. The grant's edges: a grantee whose client
//! froze costs the others the grant's probation, not its lease; a grantee that hears too late does
//! not return a lock it no longer holds; a claimed grant outlives its probation while it is held.

use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit::protocol::lock::GRANT_PROBATION;
use lockkit_suite::{client, spawned, unique, until_waiting, within};
use lockkit_testkit::{FaultProxy, RedisServer};

const HANG: Duration = Duration::from_secs(60);
/// Longer than any wait of these tests: only a grant, never a lease running out, hands it on.
const LONG_LEASE: Duration = Duration::from_secs(120);

/// Redis' own counts of script calls and of publishes so far (`INFO commandstats`).
async fn calls(server: &RedisServer) -> (u64, u64) {
    let info = lockkit_testkit::send_command(server.addr(), &["INFO", "commandstats"])
        .await
        .unwrap();
    let info = info.as_str().expect("INFO is a bulk string").to_owned();
    let (mut scripts, mut publishes) = (0, 0);
    for line in info.lines() {
        let Some((name, stats)) = line.split_once(':') else {
            continue;
        };
        let count: u64 = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|count| count.parse().ok())
            .unwrap_or(0);
        match name {
            "cmdstat_evalsha" | "cmdstat_eval" => scripts += count,
            "cmdstat_publish" | "cmdstat_spublish" => publishes += count,
            _ => {}
        }
    }
    (scripts, publishes)
}

/// The release is the only script call of a handoff, and it publishes once: the waiter that was
/// granted the lock returns holding it (a fenced lock's with a greater token) without trying.
/// Counted on the second of two rounds: the waiter's channel is then subscribed already, so its
/// wait is one busy try (on a channel not yet subscribed, it tries once more after subscribing,
/// which closes the lost-wakeup race, and the count could catch that try).
#[tokio::test]
async fn a_granted_waiter_returns_holding_the_lock_without_a_script_call() {
    use lockkit::protocol::keys::Kind;

    let server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    for kind in [Kind::Lock, Kind::FencedLock] {
        let name = unique("granted");
        for round in 0..2 {
            let (first, wait) = match kind {
                Kind::Lock => (
                    holder.lock(&name).lock().await.unwrap(),
                    tokio::spawn({
                        let lock = waiter.lock(&name);
                        async move { lock.lock().await }
                    }),
                ),
                _ => (
                    holder.fenced_lock(&name).lock().await.unwrap(),
                    tokio::spawn({
                        let lock = waiter.fenced_lock(&name);
                        async move { lock.lock().await }
                    }),
                ),
            };
            until_waiting(&waiter, 1).await;
            lockkit_suite::until_waiters_in_redis(&holder, kind, &name, 1).await;

            let before = calls(&server).await;
            let first_token = first.fencing_token();
            first.unlock().await.unwrap();
            let granted = within(HANG, "the grant", wait).await.unwrap().unwrap();
            let after = calls(&server).await;
            if round == 1 {
                assert_eq!(after.0 - before.0, 1, "{kind:?}: the release only");
                assert_eq!(after.1 - before.1, 1, "{kind:?}: one message");
            }
            assert_eq!(granted.hold_count(), 1);
            assert!(!granted.is_lost());
            if kind == Kind::FencedLock {
                assert!(
                    granted.fencing_token() > first_token,
                    "{kind:?}: a new token"
                );
            }
            let holders = holder.inspect(Some(kind), &name).await.unwrap();
            assert_eq!(holders[0].holders.len(), 1, "{kind:?}: held by the grantee");
            assert!(holders[0].waiters.is_empty(), "{kind:?}: nobody waits");
            granted.unlock().await.unwrap();
        }
    }
}

/// A grantee whose client froze (its connections open, nothing read or answered: a paused VM)
/// keeps the lock only for the grant's probation; the next waiter then gets it, though the frozen
/// call asked for a lease longer than this whole test. When the frozen client wakes up and hears
/// of its grant too late, it does not return a lock it no longer holds: it waits on.
#[tokio::test]
async fn a_frozen_grantee_costs_the_others_its_probation_not_its_lease() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&server.url()).await;
    let frozen = client(&proxy.url()).await;
    let next = client(&server.url()).await;
    let name = unique("frozen-grantee");
    let held = holder
        .lock(&name)
        .try_lock(Duration::ZERO, Some(LONG_LEASE))
        .await
        .unwrap()
        .expect("free");
    let frozen_wait = tokio::spawn({
        let lock = frozen.lock(&name);
        async move { lock.try_lock(HANG, Some(LONG_LEASE)).await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, lockkit::protocol::keys::Kind::Lock, &name, 1)
        .await;
    let next_wait = tokio::spawn({
        let lock = next.lock(&name);
        async move { lock.try_lock(HANG, Some(LONG_LEASE)).await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, lockkit::protocol::keys::Kind::Lock, &name, 2)
        .await;

    proxy.pause();
    // Granted to the frozen call, which waited longest: Redis counts its subscriber, which the
    // proxy keeps open.
    held.unlock().await.unwrap();
    let got = within(HANG, "the next waiter", next_wait)
        .await
        .unwrap()
        .unwrap()
        .expect("handed on once the probation ran out, long before the lease");
    assert!(!got.is_lost());

    proxy.resume();
    // The frozen call hears of its grant now, after its probation: it must not return the lock.
    // It tries again as the same call and waits in line behind the next waiter; nothing it
    // returns before that next waiter lets go can be the lock.
    let mut frozen_wait = frozen_wait;
    tokio::select! {
        outcome = &mut frozen_wait => panic!(
            "a grant heard after its probation ended the call while another holds the lock: \
             {outcome:?}"
        ),
        () = lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 1) => {}
    }
    assert!(!got.is_lost(), "the next waiter still holds it");
    got.unlock().await.unwrap();
    // Now the lock is its own, by a fresh grant.
    let mine = within(HANG, "the frozen call's turn", frozen_wait)
        .await
        .unwrap()
        .unwrap()
        .expect("granted once the next waiter let go");
    assert!(!mine.is_lost(), "a live hold, not the grant that ran out");
    mine.unlock().await.unwrap();
}

/// A claimed grant with a lease longer than the probation is confirmed while held: past the
/// probation, it is still held, and nobody else gets it.
#[tokio::test]
async fn a_claimed_grant_outlives_its_probation_while_held() {
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let other = client(&server.url()).await;
    let name = unique("confirmed-grant");
    let held = holder.lock(&name).lock().await.unwrap();
    let wait = tokio::spawn({
        let lock = waiter.lock(&name);
        async move { lock.try_lock(HANG, Some(LONG_LEASE)).await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, lockkit::protocol::keys::Kind::Lock, &name, 1)
        .await;
    held.unlock().await.unwrap();
    let granted = within(HANG, "the grant", wait)
        .await
        .unwrap()
        .unwrap()
        .expect("granted");
    // Time passing is the scenario: past the probation, the grant must have been confirmed.
    tokio::time::sleep(GRANT_PROBATION + Duration::from_secs(1)).await;
    assert!(!granted.is_lost(), "confirmed, not lost");
    assert!(
        other
            .lock(&name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none(),
        "still held"
    );
    let ttl = other.lock(&name).remaining_ttl().await.unwrap().unwrap();
    assert!(ttl > GRANT_PROBATION, "renewed to its lease: {ttl:?}");
    granted.unlock().await.unwrap();
}

/// A wait that runs out leaves the line in its last try, in the same script: a release right
/// after the call returned finds nobody to grant to, and the lock is free. (Before, the entry
/// left in a cancel sent after the call returned: a release in between granted the lock to the
/// call that had given up, and it stayed held until that cancel came, here held back by a
/// paused proxy.)
#[tokio::test]
async fn a_wait_that_runs_out_leaves_the_line_before_it_returns() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&server.url()).await;
    let gave_up = client(&proxy.url()).await;
    let name = unique("gave-up");
    let held = holder.lock(&name).lock().await.unwrap();
    let refused = gave_up
        .lock(&name)
        .try_lock(Duration::from_millis(200), None)
        .await
        .unwrap();
    assert!(refused.is_none(), "held all along");
    proxy.pause();
    held.unlock().await.unwrap();
    assert!(
        !holder.lock(&name).is_locked().await.unwrap(),
        "granted to a call that had given up"
    );
    let objects = holder
        .inspect(Some(lockkit::protocol::keys::Kind::Lock), &name)
        .await
        .unwrap();
    assert!(objects.is_empty() || objects[0].waiters.is_empty());
    proxy.resume();
}
