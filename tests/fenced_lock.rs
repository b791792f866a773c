//! Fenced lock: tokens strictly increase across clients, re-entries and data loss; a stale
//! holder's write is rejected by the storage's token check.

use std::sync::Arc;
use std::time::Duration;

use lockkit_suite::{client, raw, spawned, unique, within};
use tokio::sync::Mutex;

const HANG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_clients_and_reentries() {
    let redis = spawned().await;
    let name = unique("fenced");
    // Tokens in the order the critical sections ran (the lock serialises them).
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&redis.url()).await;
        for _ in 0..4 {
            let (lock, seen) = (client.fenced_lock(&name), Arc::clone(&seen));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let outer = lock.lock().await.unwrap();
                    let inner = outer.scope(lock.lock()).await.unwrap(); // re-entry
                    assert_eq!(inner.hold_count(), 2);
                    let mut seen = seen.lock().await;
                    seen.push(outer.fencing_token());
                    seen.push(inner.fencing_token());
                    drop(seen);
                    inner.unlock().await.unwrap();
                    outer.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        within(HANG, "fenced workers", task).await.unwrap();
    }
    let seen = seen.lock().await;
    assert_eq!(seen.len(), 3 * 4 * 5 * 2);
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens must strictly increase in critical-section order: {seen:?}"
    );
}

#[tokio::test]
async fn tokens_keep_growing_after_redis_loses_its_data() {
    let mut redis = spawned().await;
    let client = client(&redis.url()).await;
    let name = unique("fenced-restart");
    let before = client.fenced_lock(&name).lock().await.unwrap();
    let token_before = before.fencing_token();
    redis.restart_empty().await.unwrap();
    let after = within(
        HANG,
        "acquire after restart",
        client.fenced_lock(&name).lock(),
    )
    .await
    .unwrap();
    assert!(after.fencing_token() > token_before);
}

/// The seed's order service: a holder pauses past its lease, another takes the lock and writes;
/// the first one's late write carries an older token and the storage rejects it.
#[tokio::test]
async fn a_stale_holders_write_is_rejected_by_the_token_check() {
    use fred::interfaces::LuaInterface;
    // UPDATE record SET value = :value, last_fence = :fence WHERE last_fence <= :fence
    const FENCED_WRITE: &str = r"
        local last = tonumber(redis.call('HGET', KEYS[1], 'last_fence') or '0')
        if tonumber(ARGV[2]) < last then return 0 end
        redis.call('HSET', KEYS[1], 'value', ARGV[1], 'last_fence', ARGV[2])
        return 1";
    let redis = spawned().await;
    let (slow, fast) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("fenced-order");
    let record = unique("record");
    let store = raw(&redis.url()).await;

    let stale = slow
        .fenced_lock(&name)
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    within(HANG, "the slow holder's lease ends", stale.lost()).await; // it "paused" too long
    let fresh = within(HANG, "the next holder", fast.fenced_lock(&name).lock())
        .await
        .unwrap();
    assert!(fresh.fencing_token() > stale.fencing_token());

    let write = |value: &'static str, fence: u64| {
        let (store, record) = (store.clone(), record.clone());
        async move {
            let accepted: i64 = store
                .eval(
                    FENCED_WRITE,
                    vec![record],
                    vec![value.to_owned(), fence.to_string()],
                )
                .await
                .unwrap();
            accepted == 1
        }
    };
    assert!(write("fresh", fresh.fencing_token()).await);
    assert!(
        !write("stale", stale.fencing_token()).await,
        "stale write rejected"
    );
    let value: String = fred::interfaces::HashesInterface::hget(&store, &record, "value")
        .await
        .unwrap();
    assert_eq!(value, "fresh");
    fresh.unlock().await.unwrap();
}

#[tokio::test]
async fn plain_locks_have_no_token_and_fenced_locks_are_separate_objects() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let name = unique("separate");
    let plain = client.lock(&name).lock().await.unwrap();
    assert_eq!(plain.fencing_token(), None);
    // Same name, other kind: no conflict.
    let fenced = client
        .fenced_lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    let fenced = fenced.expect("a separate object, free");
    assert!(fenced.fencing_token() > 0);
    assert_eq!(
        fenced.into_lock_guard().fencing_token().map(|t| t > 0),
        Some(true)
    );
}

/// The counter may be ahead of the server's clock in microseconds: after a failover to a server
/// whose clock is behind the old primary's, or after more than a million acquisitions in a
/// second. Every token is then the counter plus one: still strictly increasing, never a repeat.
#[tokio::test]
async fn tokens_keep_increasing_when_the_counter_is_ahead_of_the_server_clock() {
    use fred::interfaces::KeysInterface;
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let store = raw(&redis.url()).await;
    let name = unique("fenced-ahead");
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::FencedLock, &name)
        .unwrap();
    let counter = keys.aux("token").unwrap().to_owned();
    // A century of microseconds ahead of any clock.
    let ahead: u64 = 5_000_000_000_000_000;
    let _: () = store.set(&counter, ahead, None, None, false).await.unwrap();
    let lock = client.fenced_lock(&name);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = lock.lock().await.unwrap();
        tokens.push(guard.fencing_token());
        guard.unlock().await.unwrap();
    }
    assert_eq!(tokens, vec![ahead + 1, ahead + 2, ahead + 3]);
}

/// The token counter of the fenced lock `name` (default prefix).
fn counter_key(name: &str) -> String {
    lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::FencedLock, name)
        .unwrap()
        .aux("token")
        .expect("a token counter")
        .to_owned()
}

/// A client whose fenced locks give their token counter `ttl`.
async fn client_with_counter_ttl(url: &str, ttl: Duration) -> lockkit::Client {
    lockkit::Client::builder()
        .url(url)
        .token_counter_ttl(ttl)
        .build()
        .await
        .unwrap()
}

/// The counter's PTTL in ms (-1: no expiry, -2: no key).
async fn counter_pttl(store: &fred::clients::Client, counter: &str) -> i64 {
    fred::interfaces::KeysInterface::pttl(store, counter)
        .await
        .unwrap()
}

/// Asserts that a counter whose last token was minted from the server clock (not ahead of it)
/// has `ttl` to live: at most `ttl` + 1 ms (`PEXPIREAT <token in ms> + 1 + TTL`), and more than
/// `ttl` less the hang guard (the time this test may have taken since the mint).
fn assert_counter_ttl(pttl: i64, ttl: Duration, what: &str) {
    let ttl = i64::try_from(ttl.as_millis()).unwrap();
    let guard = i64::try_from(HANG.as_millis()).unwrap();
    assert!(
        ttl - guard < pttl && pttl <= ttl + 1,
        "{what}: the counter has {pttl} ms to live, not its TTL of {ttl} ms"
    );
}

/// Issue 21, §3: the token counter no longer lives forever. Every acquisition gives it the TTL
/// (here a client setting of 10 minutes), counted from its last token; once it is gone, the next
/// token is minted from the server clock, which is past every earlier token: the order holds
/// across the expiry, and the new counter has its TTL again.
#[tokio::test]
async fn the_token_counter_expires_and_tokens_keep_growing_across_its_expiry() {
    use fred::interfaces::KeysInterface;
    let redis = spawned().await;
    let ttl = Duration::from_secs(600);
    let client = client_with_counter_ttl(&redis.url(), ttl).await;
    let store = raw(&redis.url()).await;
    let name = unique("fenced-expiry");
    let counter = counter_key(&name);
    let lock = client.fenced_lock(&name);
    let acquire = || async {
        let guard = within(HANG, "acquire", lock.lock()).await.unwrap();
        let token = guard.fencing_token();
        guard.unlock().await.unwrap();
        token
    };
    let mut seen = vec![acquire().await, acquire().await];
    assert_counter_ttl(counter_pttl(&store, &counter).await, ttl, "after acquiring");

    // The counter expires for real: Redis deletes it at the end of its (shortened) life.
    let _: bool = store.pexpire(&counter, 1, None).await.unwrap();
    within(HANG, "the counter to expire", async {
        while store.exists::<i64, _>(&counter).await.unwrap() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;

    let after = acquire().await;
    let before = *seen.iter().max().expect("tokens");
    assert!(
        after > before,
        "token {after} after the counter expired is not above {before}: {seen:?}"
    );
    seen.push(after);
    seen.push(acquire().await);
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens strictly increase: {seen:?}"
    );
    assert_counter_ttl(counter_pttl(&store, &counter).await, ttl, "the new counter");
}

/// Every path that mints a token gives the counter its TTL again, with the setting of the client
/// that runs it: an acquisition and a re-entry (client A, 10 minutes), a release that grants the
/// lock to a waiter (A's release, though B's client says 20 minutes: the grantee runs no script)
/// and a force-unlock that grants it (client C, 30 minutes). Before each, the counter's life is
/// cut to a few seconds.
#[tokio::test]
async fn every_acquisition_and_every_grant_gives_the_counter_its_ttl_again() {
    use fred::interfaces::KeysInterface;
    use lockkit::protocol::keys::Kind;
    let redis = spawned().await;
    let minutes = |m: u64| Duration::from_secs(60 * m);
    let a = client_with_counter_ttl(&redis.url(), minutes(10)).await;
    let b = client_with_counter_ttl(&redis.url(), minutes(20)).await;
    let c = client_with_counter_ttl(&redis.url(), minutes(30)).await;
    let store = raw(&redis.url()).await;
    let name = unique("fenced-refresh");
    let counter = counter_key(&name);
    let cut = || async {
        let _: bool = store.pexpire(&counter, 5_000, None).await.unwrap();
        assert!(counter_pttl(&store, &counter).await <= 5_000);
    };

    let outer = within(HANG, "A acquires", a.fenced_lock(&name).lock())
        .await
        .unwrap();
    assert_counter_ttl(counter_pttl(&store, &counter).await, minutes(10), "acquire");
    cut().await;
    let inner = within(
        HANG,
        "A re-enters",
        outer.scope(a.fenced_lock(&name).lock()),
    )
    .await
    .unwrap();
    assert_eq!(inner.hold_count(), 2);
    assert_counter_ttl(
        counter_pttl(&store, &counter).await,
        minutes(10),
        "re-entry",
    );

    // B waits; A's last release grants B the lock, minting B's token.
    let waiting = tokio::spawn({
        let lock = b.fenced_lock(&name);
        async move { lock.lock().await }
    });
    lockkit_suite::until_waiting(&b, 1).await;
    lockkit_suite::until_waiters_in_redis(&a, Kind::FencedLock, &name, 1).await;
    let released_token = outer.fencing_token();
    inner.unlock().await.unwrap();
    cut().await;
    outer.unlock().await.unwrap();
    let granted = within(HANG, "B's grant", waiting).await.unwrap().unwrap();
    assert!(granted.fencing_token() > released_token);
    assert_counter_ttl(
        counter_pttl(&store, &counter).await,
        minutes(10),
        "a release's grant",
    );

    // A waits; C force-unlocks B's hold, which grants A the lock.
    let waiting = tokio::spawn({
        let lock = a.fenced_lock(&name);
        async move { lock.lock().await }
    });
    lockkit_suite::until_waiting(&a, 1).await;
    lockkit_suite::until_waiters_in_redis(&c, Kind::FencedLock, &name, 1).await;
    cut().await;
    assert!(c.fenced_lock(&name).force_unlock().await.unwrap());
    let regranted = within(HANG, "A's grant", waiting).await.unwrap().unwrap();
    assert!(regranted.fencing_token() > granted.fencing_token());
    assert_counter_ttl(
        counter_pttl(&store, &counter).await,
        minutes(30),
        "a force-unlock's grant",
    );
    regranted.unlock().await.unwrap();
}

/// A counter ahead of the server clock (after a failover to a server whose clock is behind the
/// old primary's) must not expire before the clock has caught up with it: the next token would
/// be minted from the clock, below the tokens already handed out. Its expiry is counted from its
/// last token, not from now: two days ahead, with a one-day TTL, it lives three days.
#[tokio::test]
async fn a_counter_ahead_of_the_clock_lives_until_the_clock_has_passed_it() {
    use fred::interfaces::KeysInterface;
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let store = raw(&redis.url()).await;
    let name = unique("fenced-ahead-ttl");
    let counter = counter_key(&name);
    let day_ms: i64 = 24 * 3600 * 1000;
    let now_ms = lockkit_suite::server_ms(&redis.command(&["TIME"]).await.unwrap());
    let ahead = i64::try_from(now_ms).unwrap() * 1000 + 2 * day_ms * 1000;
    let _: () = store.set(&counter, ahead, None, None, false).await.unwrap();
    let guard = within(HANG, "acquire", client.fenced_lock(&name).lock())
        .await
        .unwrap();
    assert_eq!(Some(guard.fencing_token()), u64::try_from(ahead + 1).ok());
    let pttl = counter_pttl(&store, &counter).await;
    let guard_ms = i64::try_from(HANG.as_millis()).unwrap();
    assert!(
        3 * day_ms - guard_ms < pttl && pttl <= 3 * day_ms + 1,
        "the counter two days ahead has {pttl} ms to live, not three days"
    );
    guard.unlock().await.unwrap();
}

/// The counter TTL setting: zero, below a minute (too small a margin against the server clock
/// stepping back) and beyond a year are refused when the client is built, with the range named.
#[tokio::test]
async fn a_token_counter_ttl_out_of_range_is_refused_when_the_client_is_built() {
    let redis = spawned().await;
    for ttl in [
        Duration::ZERO,
        Duration::from_secs(59),
        Duration::from_secs(365 * 24 * 3600 + 1),
        Duration::MAX,
    ] {
        let built = lockkit::Client::builder()
            .url(redis.url())
            .token_counter_ttl(ttl)
            .build()
            .await;
        match built {
            Err(lockkit::Error::InvalidArgument(message)) => assert!(
                message.contains("token counter TTL") && message.contains("60s"),
                "{ttl:?}: {message}"
            ),
            other => panic!("{ttl:?}: expected InvalidArgument, got {other:?}"),
        }
    }
    let one_minute = client_with_counter_ttl(&redis.url(), Duration::from_secs(60)).await;
    one_minute.shutdown().await.unwrap();
}

/// The fourth path that mints, driven through the scripts: a waiter that gives up (`lock_cancel`)
/// gives back a grant it had not claimed, and the lock is handed on to the next request, minting
/// its token: the counter gets the TTL the cancel was given (`ARGV[4]`, here 20 minutes).
#[tokio::test]
async fn a_grant_handed_on_by_a_waiter_that_gave_up_gives_the_counter_its_ttl_again() {
    use fred::interfaces::{KeysInterface, PubsubInterface};
    use lockkit::protocol::{fenced_lock, lock};
    use lockkit_suite::{eval, ints};
    let server = spawned().await;
    let store = raw(&server.url()).await;
    let name = unique("fenced-cancel-ttl");
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::FencedLock, &name)
        .unwrap();
    let counter = keys.aux("token").unwrap().to_owned();
    let (w_channel, x_channel) = (keys.client_channel("W"), keys.client_channel("X"));
    // W's client listens, so the release's grant to W is heard (and stands, unclaimed).
    let listener = raw(&server.url()).await;
    listener.subscribe(w_channel.as_str()).await.unwrap();
    let acquire = |[owner, marker]: [&'static str; 2], channel| {
        let mut command = eval(
            fenced_lock::ACQUIRE.source(),
            &keys.keys,
            &[owner, marker, "30000", "60000"],
        );
        command.extend([channel, "0"]);
        command
    };
    let replies = lockkit_testkit::send_commands(
        server.addr(),
        &[
            acquire(["H", "#H:1"], "-"),
            acquire(["W", "#W:1"], &w_channel),
            acquire(["X", "#X:1"], &x_channel),
            eval(
                fenced_lock::RELEASE.source(),
                &keys.keys,
                &["#H:1", &keys.channel, "0"],
            ),
        ],
    )
    .await
    .unwrap();
    assert_eq!(ints(&replies[0])[0], 1, "H holds");
    assert_eq!(ints(&replies[1])[0], 0, "W waits");
    assert_eq!(ints(&replies[2])[0], 0, "X waits");
    assert_eq!(ints(&replies[3]), [1, 0], "H's release grants W");

    let _: bool = store.pexpire(&counter, 5_000, None).await.unwrap();
    let cancel_keys = vec![
        keys.key.clone(),
        keys.aux("handoff").unwrap().to_owned(),
        keys.aux("waiting").unwrap().to_owned(),
        keys.aux("timeouts").unwrap().to_owned(),
        counter.clone(),
    ];
    let w_member = format!("#W:1 30000 W {w_channel}");
    let replies = lockkit_testkit::send_commands(
        server.addr(),
        &[eval(
            lock::CANCEL.source(),
            &cancel_keys,
            &[&w_member, &keys.channel, "0", "1200000"],
        )],
    )
    .await
    .unwrap();
    assert_eq!(ints(&replies[0]), [1], "W's grant is given back");
    assert_counter_ttl(
        counter_pttl(&store, &counter).await,
        Duration::from_secs(1200),
        "a grant handed on by a cancel",
    );
}
