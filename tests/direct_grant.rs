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
                    holder.fenced_lock(&name).lock().await.unwrap().into(),
                    tokio::spawn({
                        let lock = waiter.fenced_lock(&name);
                        async move { lock.lock().await.map(lockkit::LockGuard::from) }
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

// ================================================================================================
// Issue 27 §2, item 7: a granted fixed lease lasts the lease asked for, counted from the grant.
//
// A fixed lease longer than the probation is granted on probation and confirmed at half of it.
// The confirmation used to renew the hold to `confirmation + lease`, so a granted
// `try_lock(wait, Some(8 s))` held the lock 10.5 s after its grant (uncontended: 8 s). Measured
// on the server: the grant instant is bracketed by the server's clock read just before and just
// after the release that made it, and the hold's own expiry (its marker in the lock hash) is read
// right after the grant and after the confirmation.
// ================================================================================================

/// The fixed lease of these tests: longer than the probation, so the grant is confirmed.
const FIXED: Duration = Duration::from_secs(8);

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).expect("fits")
}

/// The server's clock (ms).
async fn server_clock(server: &RedisServer) -> u64 {
    let time = lockkit_testkit::send_command(server.addr(), &["TIME"])
        .await
        .unwrap();
    lockkit_suite::server_ms(&time)
}

/// The expiries (server ms) of the holds in the lock hash `key`, from their markers.
async fn hold_expiries(server: &RedisServer, key: &str) -> Vec<u64> {
    let fields = lockkit_testkit::send_command(server.addr(), &["HGETALL", key])
        .await
        .unwrap();
    let fields: Vec<String> = fields
        .as_array()
        .expect("HGETALL is an array")
        .iter()
        .map(|v| v.as_str().expect("a bulk string").to_owned())
        .collect();
    fields
        .chunks(2)
        .filter_map(|pair| lockkit::protocol::lock::HoldEntry::parse(&pair[0], &pair[1]))
        .map(|hold| hold.expiry_ms)
        .collect()
}

/// The key's remaining time to live in ms (`-2`: gone).
async fn pttl(server: &RedisServer, key: &str) -> i64 {
    lockkit_testkit::send_command(server.addr(), &["PTTL", key])
        .await
        .unwrap()
        .as_int()
        .expect("PTTL is an integer")
}

/// When the key expires (server ms), read with the server's clock in one script: `TIME` and
/// `PTTL` of the same instant, however long the round trips around it take (two separate
/// commands measured a loaded machine's scheduling, not the key).
async fn key_end(server: &RedisServer, key: &str) -> i64 {
    let script = "local t = redis.call('TIME') \
                  return {t[1], t[2], redis.call('PTTL', KEYS[1])}";
    let reply = lockkit_testkit::send_command(server.addr(), &["EVAL", script, "1", key])
        .await
        .unwrap();
    let parts = reply.as_array().expect("an array");
    let number = |i: usize| -> i64 {
        let part = &parts[i];
        part.as_int()
            .or_else(|| part.as_str().and_then(|s| s.parse().ok()))
            .expect("a number")
    };
    number(0) * 1000 + number(1) / 1000 + number(2)
}

/// Runs the release that grants the waiting call, bracketed by the server's clock: the grant was
/// made at a server instant in the returned range.
async fn bracket_grant(
    server: &RedisServer,
    release: impl std::future::Future<Output = ()>,
) -> std::ops::RangeInclusive<u64> {
    let before = server_clock(server).await;
    release.await;
    let after = server_clock(server).await;
    before..=after
}

/// The grant's hold, measured on the server: right after the grant it lives until the end of
/// its probation (grant + 5 s); once confirmed, until grant + `FIXED`, not confirmation +
/// `FIXED`. Returns the confirmed expiry.
async fn granted_for_the_lease_asked(
    server: &RedisServer,
    key: &str,
    granted: std::ops::RangeInclusive<u64>,
    what: &str,
) -> u64 {
    let probation = millis(GRANT_PROBATION);
    let [on_probation] = hold_expiries(server, key).await[..] else {
        panic!("{what}: one hold, the grant's");
    };
    let grant = on_probation - probation;
    assert!(
        granted.contains(&grant),
        "{what}: on probation until the grant + {probation} ms: granted at {grant}, the release \
         ran in {granted:?}"
    );
    // The confirmation moves the hold's expiry, once.
    let confirmed = within(HANG, "the confirmation", async {
        loop {
            match hold_expiries(server, key).await[..] {
                [expiry] if expiry != on_probation => return expiry,
                [_] => tokio::time::sleep(Duration::from_millis(20)).await,
                ref other => panic!("{what}: the grant's hold went away: {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(
        confirmed,
        grant + millis(FIXED),
        "{what}: confirmed to the grant + the lease asked for (the grant was at {grant}); \
         {} ms longer than asked",
        confirmed as i64 - (grant + millis(FIXED)) as i64
    );
    // The key lives exactly as long as its one hold (PTTL is read on Redis' cached clock: ±2 ms).
    let key_end = key_end(server, key).await;
    assert!(
        (key_end - confirmed as i64).abs() <= 2,
        "{what}: the key expires with the hold: {key_end} vs {confirmed}"
    );
    confirmed
}

/// The guard's own (local) deadline follows the lease counted from the grant: while Redis still
/// holds the lock for another second the guard is not lost, and once Redis has dropped it the
/// guard knows.
async fn the_guard_knows_when_it_ends(
    server: &RedisServer,
    key: &str,
    is_lost: impl Fn() -> bool,
    what: &str,
) {
    within(HANG, "the lease to end", async {
        loop {
            let left = pttl(server, key).await;
            if left == -2 {
                assert!(
                    is_lost(),
                    "{what}: Redis dropped the hold at the end of its lease, the guard still \
                     reports it held"
                );
                return;
            }
            if left > 1_000 {
                assert!(
                    !is_lost(),
                    "{what}: lost while Redis holds it for {left} ms more"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// `Lock::try_lock(wait, Some(8 s))` granted by a release holds the lock 8 s from the grant.
#[tokio::test]
async fn a_granted_fixed_lease_of_a_lock_lasts_the_lease_asked_from_the_grant() {
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let name = unique("granted-fixed-lease");
    let key = lockkit_suite::lock_key(&name);
    let held = holder.lock(&name).lock().await.unwrap();
    let wait = tokio::spawn({
        let lock = waiter.lock(&name);
        async move { lock.try_lock(HANG, Some(FIXED)).await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 1).await;
    let granted_at = bracket_grant(&server, async { held.unlock().await.unwrap() }).await;
    let granted = within(HANG, "the grant", wait)
        .await
        .unwrap()
        .unwrap()
        .expect("granted");
    granted_for_the_lease_asked(&server, &key, granted_at, "Lock").await;
    the_guard_knows_when_it_ends(&server, &key, || granted.is_lost(), "Lock").await;
}

/// The same for a `FencedLock`.
#[tokio::test]
async fn a_granted_fixed_lease_of_a_fenced_lock_lasts_the_lease_asked_from_the_grant() {
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let name = unique("granted-fixed-fenced");
    let key = lockkit::protocol::keys::Namespace::default()
        .object(Kind::FencedLock, &name)
        .unwrap()
        .key;
    let held = holder.fenced_lock(&name).lock().await.unwrap();
    let wait = tokio::spawn({
        let lock = waiter.fenced_lock(&name);
        async move { lock.try_lock(HANG, Some(FIXED)).await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, Kind::FencedLock, &name, 1).await;
    let granted_at = bracket_grant(&server, async { held.unlock().await.unwrap() }).await;
    let granted = within(HANG, "the grant", wait)
        .await
        .unwrap()
        .unwrap()
        .expect("granted");
    granted_for_the_lease_asked(&server, &key, granted_at, "FencedLock").await;
    the_guard_knows_when_it_ends(&server, &key, || granted.is_lost(), "FencedLock").await;
}

/// The same for an election's `campaign_with_lease`: a candidate that becomes leader when the
/// leader resigns leads for the lease asked, from that moment.
#[tokio::test]
async fn a_granted_fixed_lease_of_an_election_lasts_the_lease_asked_from_the_grant() {
    let server = spawned().await;
    let leader = client(&server.url()).await;
    let candidate = client(&server.url()).await;
    let name = unique("granted-fixed-election");
    let key = lockkit::protocol::keys::Namespace::default()
        .object(Kind::Election, &name)
        .unwrap()
        .key;
    let leading = leader.election(&name).campaign("a").await.unwrap();
    let campaign = tokio::spawn({
        let election = candidate.election(&name);
        async move { election.campaign_with_lease("b", FIXED).await }
    });
    lockkit_suite::until_waiters_in_redis(&leader, Kind::Election, &name, 1).await;
    let granted_at = bracket_grant(&server, async { leading.resign().await.unwrap() }).await;
    let leads = within(HANG, "the grant", campaign).await.unwrap().unwrap();
    granted_for_the_lease_asked(&server, &key, granted_at, "Election").await;
    the_guard_knows_when_it_ends(&server, &key, || leads.is_lost(), "Election").await;
}

/// `#[locked(lease = "8s")]` takes the lock with `try_lock(wait, Some(lease))`: granted by a
/// release, its body holds the lock for 8 s from the grant.
#[tokio::test]
async fn a_granted_fixed_lease_of_a_locked_fn_lasts_the_lease_asked_from_the_grant() {
    #[lockkit::locked(client = client, key = "{name}", wait = "60s", lease = "8s")]
    async fn under_the_lock(
        client: &lockkit::Client,
        name: &str,
        entered: tokio::sync::oneshot::Sender<()>,
        leave: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<(), lockkit::Error> {
        let _ = (client, name);
        entered.send(()).unwrap();
        leave.await.unwrap();
        Ok(())
    }

    let server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let name = unique("granted-fixed-locked");
    let key = lockkit_suite::lock_key(&name);
    assert_eq!(millis(FIXED), 8_000, "the macro's lease");
    let held = holder.lock(&name).lock().await.unwrap();
    let (entered, inside) = tokio::sync::oneshot::channel();
    let (leave, left) = tokio::sync::oneshot::channel();
    let body = tokio::spawn({
        let name = name.clone();
        async move { under_the_lock(&waiter, &name, entered, left).await }
    });
    lockkit_suite::until_waiters_in_redis(&holder, Kind::Lock, &name, 1).await;
    let granted_at = bracket_grant(&server, async { held.unlock().await.unwrap() }).await;
    within(HANG, "the body to run", inside).await.unwrap();
    granted_for_the_lease_asked(&server, &key, granted_at, "#[locked]").await;
    leave.send(()).unwrap();
    within(HANG, "the body", body).await.unwrap().unwrap();
}
