//! No key lives forever (issue 21, §3; `docs/design.md`, "When each key goes away"): after every
//! primitive was used, every key lockkit left in Redis has an expiry, except the state that
//! persists by design (a semaphore's permits, a counting latch's count); and a waiter that died in
//! line leaves entries that go away on their own after its keep-alive, with nothing else running.

use std::time::Duration;

use fred::interfaces::{KeysInterface, LuaInterface};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::protocol::{fair_lock, fenced_lock, lock};
use lockkit_suite::{client, raw, spawned, unique, within};
use lockkit_testkit::RespValue;

const HANG: Duration = Duration::from_secs(60);

/// Every key in the server (each test has a server of its own).
async fn all_keys(server: &lockkit_testkit::RedisServer) -> Vec<String> {
    let reply = server.command(&["KEYS", "*"]).await.unwrap();
    reply
        .as_array()
        .expect("a KEYS reply")
        .iter()
        .map(|key| RespValue::as_str(key).expect("a key").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_left_after_use_expires_but_the_documented_state() {
    let server = spawned().await;
    let client = client(&server.url()).await;
    let store = raw(&server.url()).await;
    let name = unique("lifetimes");
    let short = Duration::from_millis(50);

    // The lock kinds: taken, waited for by a call that gives up, released; one lock stays held.
    let held = client
        .lock(format!("{name}:held"))
        .lock_with_lease(Duration::from_secs(600))
        .await
        .unwrap();
    let other = client.lock(format!("{name}:held"));
    assert!(within(HANG, "a lock waiter", other.try_lock(short, None))
        .await
        .unwrap()
        .is_none());
    let fenced = client.fenced_lock(&name).lock().await.unwrap();
    let other = client.fenced_lock(&name);
    assert!(within(HANG, "a fenced waiter", other.try_lock(short, None))
        .await
        .unwrap()
        .is_none());
    fenced.unlock().await.unwrap();
    let fair = client.fair_lock(&name).lock().await.unwrap();
    let other = client.fair_lock(&name);
    assert!(within(HANG, "a fair waiter", other.try_lock(short, None))
        .await
        .unwrap()
        .is_none());
    fair.unlock().await.unwrap();
    let rw = client.read_write_lock(&name);
    rw.read_lock().await.unwrap().unlock().await.unwrap();
    rw.write_lock().await.unwrap().unlock().await.unwrap();
    let spin = client.spin_lock(&name).lock().await.unwrap();
    spin.unlock().await.unwrap();
    let multi = client.multi_lock([
        client.lock(format!("{name}:m1")),
        client.lock(format!("{name}:m2")),
    ]);
    multi.lock().await.unwrap().unlock().await.unwrap();

    // An election: led, a candidate that gives up, a proclaim, a resign; another one still led.
    let election = client.election(&name);
    let leading = election.campaign("pod-a").await.unwrap();
    let candidate = client.election(&name);
    assert!(within(
        HANG,
        "a candidate",
        candidate.try_campaign("pod-b", short, None)
    )
    .await
    .unwrap()
    .is_none());
    leading.proclaim("pod-a, draining").await.unwrap();
    leading.resign().await.unwrap();
    let led = client
        .election(format!("{name}:led"))
        .campaign("pod-c")
        .await
        .unwrap();

    // The counting kinds, whose permits and count are state.
    let semaphore = client.semaphore(&name);
    assert!(semaphore.try_set_permits(2).await.unwrap());
    semaphore.acquire(1).await.unwrap().release().await.unwrap();
    let slots = client.permit_expirable_semaphore(&name);
    assert!(slots.try_set_permits(2).await.unwrap());
    slots
        .acquire(Duration::from_secs(60))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let latch = client.count_down_latch(&name);
    assert!(latch.try_set_count(2).await.unwrap());
    assert_eq!(latch.count_down().await.unwrap(), 1);
    let ran = client
        .once_per(&name, Duration::from_secs(3600), || async {})
        .await
        .unwrap();
    assert!(matches!(ran, lockkit::JobOutcome::Ran(())));
    let ran = client
        .run_exclusive(format!("{name}:job"), |_| async {})
        .await
        .unwrap();
    assert!(matches!(ran, lockkit::JobOutcome::Ran(())));

    // A rate limiter: the overall mode with a reservation still to come, and the per-client mode.
    let overall = lockkit::RateLimit::new(1, Duration::from_secs(3600)).unwrap();
    let limiter = client.rate_limiter(&name).with_limit(overall);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    let reserved = limiter.clone();
    let reserved = tokio::spawn(async move { reserved.acquire(1).await });
    while limiter.waiting().await.unwrap() == 0 {
        tokio::task::yield_now().await;
    }
    let per_client = client
        .rate_limiter(format!("{name}:per-client"))
        .with_limit(overall.with_mode(lockkit::RateMode::PerClient));
    assert!(per_client.try_acquire(1, Duration::ZERO).await.unwrap());

    let ns = Namespace::default();
    let mut forever = Vec::new();
    let mut expiring = Vec::new();
    for key in all_keys(&server).await {
        let parsed = ns
            .parse(&key)
            .unwrap_or_else(|| panic!("not a key of lockkit: {key}"));
        let pttl: i64 = store.pttl(&key).await.unwrap();
        match pttl {
            -1 => forever.push((parsed.kind, parsed.suffix)),
            // Gone since it was listed (a waiter that gave up leaves in the background).
            -2 => {}
            _ => expiring.push((parsed.kind, parsed.suffix)),
        }
    }
    forever.sort_by_key(|(kind, suffix)| (kind.segment(), *suffix));
    assert_eq!(
        forever,
        [
            (Kind::CountDownLatch, None),
            (Kind::PermitExpirableSemaphore, None),
            (Kind::RateLimiter, None),
            (Kind::RateLimiter, None),
            (Kind::Semaphore, None),
        ],
        "only the permits, the count and the rate limits are kept without an expiry"
    );
    // Among those left with an expiry: the held lock, the fenced lock's and the elections'
    // counters, the led election's hold and leader record, the latch's recent requests and the
    // once-per-window mark.
    for key in [
        (Kind::Lock, None),
        (Kind::FencedLock, Some("token")),
        (Kind::Election, None),
        (Kind::Election, Some("token")),
        (Kind::Election, Some("leader")),
        (Kind::CountDownLatch, Some("requests")),
        (Kind::OnceMark, None),
        (Kind::RateLimiter, Some("waiting")),
        (Kind::RateLimiter, Some("client")),
    ] {
        assert!(expiring.contains(&key), "{key:?} in {expiring:?}");
    }
    held.unlock().await.unwrap();
    led.resign().await.unwrap();
    reserved.abort();
}

/// A waiter that died in line (its client gone without a word: no cancel, no retry) leaves its
/// entries, which the next script would drop; with no later activity at all, they still go away
/// once its keep-alive has passed: they expire with it.
#[tokio::test]
async fn a_dead_waiters_entries_go_away_on_their_own() {
    let server = spawned().await;
    let client = client(&server.url()).await;
    let store = raw(&server.url()).await;
    let name = unique("dead-waiter");
    let ns = Namespace::default();
    // Held for the whole test, so the waiter's request stays in line.
    let lock = client
        .lock(&name)
        .lock_with_lease(Duration::from_secs(600))
        .await
        .unwrap();
    let fenced = client
        .fenced_lock(&name)
        .lock_with_lease(Duration::from_secs(600))
        .await
        .unwrap();
    let fair = client
        .fair_lock(&name)
        .lock_with_lease(Duration::from_secs(600))
        .await
        .unwrap();

    // One busy try each, with a keep-alive of 200 ms, as a waiter's last before it died.
    let keepalive = "200";
    let mut left = Vec::new();
    for (kind, script) in [
        (Kind::Lock, &lock::ACQUIRE),
        (Kind::FencedLock, &fenced_lock::ACQUIRE),
    ] {
        let keys = ns.object(kind, &name).unwrap();
        let channel = keys.client_channel("dead");
        let reply: Vec<i64> = store
            .eval(
                script.source(),
                keys.keys.clone(),
                vec!["dead:1", "#dead:1", "30000", keepalive, &channel, "0"],
            )
            .await
            .unwrap();
        assert_eq!(reply[0], 0, "{kind:?}: busy");
        left.extend(["waiting", "timeouts"].map(|s| keys.aux(s).unwrap().to_owned()));
    }
    let keys = ns.object(Kind::FairLock, &name).unwrap();
    let reply: Vec<i64> = store
        .eval(
            fair_lock::ACQUIRE.source(),
            keys.keys.clone(),
            vec![
                "dead:1",
                "#dead:1",
                "30000",
                "dead:w1",
                keepalive,
                &keys.channel,
                "0",
            ],
        )
        .await
        .unwrap();
    assert_eq!(reply[0], 0, "fair lock: busy");
    left.extend(["queue", "timeouts"].map(|s| keys.aux(s).unwrap().to_owned()));

    for key in &left {
        let pttl: i64 = store.pttl(key).await.unwrap();
        assert!(
            (1..=200).contains(&pttl),
            "{key}: {pttl} ms to live, not the keep-alive"
        );
    }
    within(HANG, "the dead waiter's entries to expire", async {
        loop {
            let exists: i64 = store.exists(left.clone()).await.unwrap();
            if exists == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    for guard in [lock, fenced.into(), fair] {
        guard.unlock().await.unwrap();
    }
}
