//! The reentrant lock's basic contract, against a real redis-server.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::HashesInterface;
use lockkit::Error;
use lockkit_suite::{client, eval, ints, lock_key, raw, redis, unique, until_waiting, within};

const HANG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn twenty_tasks_racing_try_lock_zero_exactly_one_wins() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("race");
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let lock = client.lock(&name);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            lock.try_lock(Duration::ZERO, None).await
        }));
    }
    let mut guards = Vec::new();
    for task in tasks {
        if let Some(guard) = task.await.unwrap().unwrap() {
            guards.push(guard);
        }
    }
    assert_eq!(guards.len(), 1, "exactly one task wins");
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    assert!(!client.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn a_holder_reenters_in_its_scope_and_must_release_as_often() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let name = unique("reentrant");
    let lock = client.lock(&name);

    let first = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
    let second = first
        .scope(lock.try_lock(Duration::ZERO, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(lock.is_held_by_current_task().await.unwrap());

    // Another task of the same client, and another client, do not hold it and cannot take it.
    let lock2 = lock.clone();
    let (count, held, got) = tokio::spawn(async move {
        (
            lock2.hold_count().await.unwrap(),
            lock2.is_held_by_current_task().await.unwrap(),
            lock2
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .is_some(),
        )
    })
    .await
    .unwrap();
    assert_eq!((count, held, got), (0, false, false));
    assert!(other
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());

    second.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap(), "one hold left");
    first.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    assert!(!lock.is_locked().await.unwrap());
    assert!(other
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_guard_moved_to_another_task_unlocks_there() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("moved");
    let guard = client.lock(&name).lock().await.unwrap();
    tokio::spawn(async move { guard.unlock().await })
        .await
        .unwrap()
        .unwrap();
    assert!(!client.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn a_dropped_guard_is_released_in_the_background() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = lockkit_suite::client(&redis.url()).await;
    let name = unique("dropped");
    let guard = holder
        .lock(&name)
        .try_lock(Duration::ZERO, Some(Duration::from_secs(60)))
        .await
        .unwrap()
        .unwrap();
    drop(guard);
    // The 60 s lease would outlast this wait: only the background release can free it in time.
    let got = within(
        HANG,
        "acquire after drop",
        waiter.lock(&name).try_lock(Duration::from_secs(20), None),
    )
    .await
    .unwrap();
    assert!(got.is_some());
}

#[tokio::test]
async fn unlock_after_the_lease_ran_out_is_not_held() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("expired");
    let guard = client
        .lock(&name)
        .try_lock(Duration::ZERO, Some(Duration::from_millis(100)))
        .await
        .unwrap()
        .unwrap();
    within(HANG, "lease end", guard.lost()).await;
    assert!(guard.is_lost());
    // The local deadline precedes Redis's expiry; wait until Redis has dropped the key too.
    let lock = client.lock(&name);
    while let Some(ttl) = lock.remaining_ttl().await.unwrap() {
        tokio::time::sleep(ttl).await;
    }
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn inspection_reports_what_redis_holds() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("inspect");
    let lock = client.lock(&name);
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(lock.remaining_ttl().await.unwrap(), None);

    let lease = Duration::from_secs(60);
    let guard = lock
        .try_lock(Duration::ZERO, Some(lease))
        .await
        .unwrap()
        .unwrap();
    assert!(!guard.is_watchdog());
    assert_eq!(guard.name(), name);
    assert_eq!(guard.fencing_token(), None);
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(ttl <= lease && ttl > Duration::ZERO, "{ttl:?}");

    // The hash: one owner field with count 1 and one hold marker.
    let fields: std::collections::HashMap<String, String> = raw(&redis.url())
        .await
        .hgetall(lock_key(&name))
        .await
        .unwrap();
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert_eq!(
        fields.values().filter(|v| *v == "1").count(),
        1,
        "{fields:?}"
    );
    assert_eq!(
        fields.keys().filter(|k| k.starts_with('#')).count(),
        1,
        "{fields:?}"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn force_unlock_frees_the_lock_and_the_guard_learns_it() {
    let redis = redis().await;
    let holder = lockkit_suite::client_with(&redis.url(), Duration::from_millis(300)).await;
    let admin = client(&redis.url()).await;
    let name = unique("force");
    let guard = holder.lock(&name).lock().await.unwrap();
    assert!(admin.lock(&name).force_unlock().await.unwrap());
    assert!(
        !admin.lock(&name).force_unlock().await.unwrap(),
        "already free"
    );
    // The next renewal finds the hold gone.
    within(HANG, "lost signal after force_unlock", guard.lost()).await;
    assert!(guard.is_lost());
    let taken = admin
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    assert!(taken.is_some(), "free after force_unlock");
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn shutdown_releases_every_hold_and_refuses_later_calls() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    let names: Vec<String> = (0..5).map(|_| unique("shutdown")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(
            client
                .lock(name)
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(client.held_count(), 5);
    client.shutdown().await.unwrap();
    for name in &names {
        assert!(
            !other.lock(name).is_locked().await.unwrap(),
            "{name} released"
        );
    }
    assert!(guards.iter().all(|g| g.is_lost()));
    assert!(matches!(
        guards.pop().unwrap().unlock().await,
        Err(Error::Shutdown)
    ));
    assert!(matches!(
        client.lock(&names[0]).lock().await,
        Err(Error::Shutdown)
    ));
    assert!(matches!(
        client.lock(&names[0]).is_locked().await,
        Err(Error::Shutdown)
    ));
    client.shutdown().await.unwrap(); // again: nothing to do
}

#[tokio::test]
async fn shutdown_wakes_waiting_tasks_with_an_error() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiting = lockkit_suite::client(&redis.url()).await;
    let name = unique("shutdown-wait");
    let _guard = holder.lock(&name).lock().await.unwrap();
    let lock = waiting.lock(&name);
    let task = tokio::spawn(async move { lock.lock().await });
    until_waiting(&waiting, 1).await;
    waiting.shutdown().await.unwrap();
    let result = within(HANG, "waiter after shutdown", task).await.unwrap();
    assert!(matches!(result, Err(Error::Shutdown)), "{result:?}");
}

/// Subscribes one connection to `channels` (each then counts as a client that listens: a grant
/// published there is heard) and returns it with its message stream.
async fn listen(
    url: &str,
    channels: &[&str],
) -> (
    fred::clients::Client,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    use fred::interfaces::{EventInterface, PubsubInterface};
    let listener = raw(url).await;
    let messages = listener.message_rx();
    for channel in channels {
        listener.subscribe(*channel).await.unwrap();
    }
    (listener, messages)
}

/// What each of `channels` carried up to an `end` published on each now (so a message that
/// should not be there shows up before it).
async fn record(
    addr: std::net::SocketAddr,
    messages: &mut tokio::sync::broadcast::Receiver<fred::types::Message>,
    channels: &[&str],
) -> std::collections::HashMap<String, Vec<String>> {
    let ends: Vec<Vec<&str>> = channels
        .iter()
        .map(|channel| vec!["PUBLISH", *channel, "end"])
        .collect();
    lockkit_testkit::send_commands(addr, &ends).await.unwrap();
    let mut record: std::collections::HashMap<String, Vec<String>> = channels
        .iter()
        .map(|channel| ((*channel).to_owned(), Vec::new()))
        .collect();
    within(HANG, "the channels' messages", async {
        while record
            .values()
            .any(|got| got.last().map(String::as_str) != Some("end"))
        {
            let message = messages.recv().await.unwrap();
            record
                .entry(message.channel.to_string())
                .or_default()
                .push(message.value.as_string().unwrap_or_default());
        }
    })
    .await;
    for got in record.values_mut() {
        got.pop();
    }
    record
}

/// The grant a message carries, to `marker`.
fn grant_to(message: &str, marker: &str) -> lockkit::protocol::wake::Grant {
    use lockkit::protocol::wake::Wake;
    match Wake::decode(message) {
        Wake::Grant { waiter, grant } if waiter == marker => grant,
        other => panic!("not a grant to {marker}: {message:?} ({other:?})"),
    }
}

/// The direct grant, checked inside Redis for the lock and the fenced lock: the release and the
/// tries run in one `MULTI`, so no time passes between them and the outcome does not depend on
/// the machine's speed. Nobody waiting: the owner that releases may take the lock back at once.
/// Requests waiting: the release grants the lock to the longest-waiting request whose client
/// listens (a grant nobody hears is undone at once, and the next request gets it); the grantee's
/// try with its marker reports the hold; the others stay waiting in order, a try with keep-alive
/// 0 never joins; and of the listening clients only the grantee hears anything: one message, the
/// grant, on its own channel (nothing on the object's channel either).
#[tokio::test]
async fn a_release_grants_the_lock_to_the_longest_waiting_request_whose_client_listens() {
    use lockkit::protocol::keys::{Kind, Namespace};
    use lockkit::protocol::lock::HoldEntry;
    use lockkit::protocol::{fenced_lock, lock};
    use lockkit_testkit::send_commands;

    let server = lockkit_suite::spawned().await;
    for (kind, acquire, release) in [
        (Kind::Lock, &lock::ACQUIRE, &lock::RELEASE),
        (
            Kind::FencedLock,
            &fenced_lock::ACQUIRE,
            &fenced_lock::RELEASE,
        ),
    ] {
        let keys = Namespace::default()
            .object(kind, &unique("handoff"))
            .unwrap();
        let (acquire, release) = (acquire.source(), release.source());
        let k = &keys.keys;
        let waiting = keys.aux("waiting").expect("a waiting key");
        let lease = "30000";
        // Waiters keep their request alive for a minute (the keep-alive), far longer than the test.
        let wait = "60000";
        let channel = |owner: &str| keys.client_channel(owner);
        let (a, b, c, d, t) = (
            channel("A"),
            channel("B"),
            channel("C"),
            channel("D"),
            channel("T"),
        );
        let member = |marker: &str, owner: &str, channel: &str| {
            format!("{marker} {lease} {owner} {channel}")
        };

        // Nobody waits: the owner that releases may take the lock back at once.
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:1", lease, wait, &a, "0"]),
                vec!["MULTI"],
                eval(release, k, &["#A:1", &keys.channel, "0"]),
                eval(acquire, k, &["A", "#A:2", lease, wait, &a, "0"]),
                vec!["EXEC"],
                eval(release, k, &["#A:2", &keys.channel, "0"]),
            ],
        )
        .await
        .unwrap();
        let exec = replies[4].as_array().expect("an EXEC reply");
        assert_eq!(ints(&exec[0]), vec![1, 0], "{kind:?}: released");
        assert_eq!(ints(&exec[1])[..2], [1, 1], "{kind:?}: taken back");

        // B (its client gone: nobody listens on its channel), then C and D (listening) find the
        // lock taken and wait; C tries again and keeps its place. T tries once. A's release
        // grants the lock to B, whom nobody hears, so it is undone and C gets it.
        let listened = [keys.channel.as_str(), &a, &c, &d, &t];
        let (_listener, mut messages) = listen(&server.url(), &listened).await;
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:3", lease, wait, &a, "0"]),
                eval(acquire, k, &["T", "#T:1", lease, "0", &t, "0"]),
                eval(acquire, k, &["B", "#B:1", lease, wait, &b, "0"]),
                eval(acquire, k, &["C", "#C:1", lease, wait, &c, "0"]),
                eval(acquire, k, &["D", "#D:1", lease, wait, &d, "0"]),
                eval(acquire, k, &["C", "#C:1", lease, wait, &c, "0"]),
                vec!["ZRANGE", waiting, "0", "-1"],
                vec!["MULTI"],
                eval(release, k, &["#A:3", &keys.channel, "0"]),
                vec!["HGETALL", &keys.key],
                eval(acquire, k, &["A", "#A:4", lease, wait, &a, "0"]),
                eval(acquire, k, &["D", "#D:1", lease, wait, &d, "0"]),
                eval(acquire, k, &["C", "#C:1", lease, wait, &c, "0"]),
                vec!["ZRANGE", waiting, "0", "-1"],
                vec!["HGET", &keys.key, "C"],
                vec!["EXEC"],
            ],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[0])[..2], [1, 1], "{kind:?}: A holds");
        for busy in &replies[1..6] {
            assert_eq!(ints(busy)[0], 0, "{kind:?}: T, B, C and D find it taken");
        }
        let strings = |reply: &lockkit_testkit::RespValue| -> Vec<String> {
            reply
                .as_array()
                .expect("an array")
                .iter()
                .map(|item| item.as_str().expect("a string").to_owned())
                .collect()
        };
        assert_eq!(
            strings(&replies[6]),
            [
                member("#B:1", "B", &b),
                member("#C:1", "C", &c),
                member("#D:1", "D", &d)
            ],
            "{kind:?}: B, C, D wait in order; T never joined"
        );
        let exec = replies[15].as_array().expect("an EXEC reply");
        assert_eq!(ints(&exec[0]), vec![1, 0], "{kind:?}: released");
        let fields = strings(&exec[1]);
        let holds: Vec<(String, HoldEntry)> = fields
            .chunks(2)
            .filter_map(|pair| HoldEntry::parse(&pair[0], &pair[1]).map(|h| (pair[0].clone(), h)))
            .collect();
        assert_eq!(holds.len(), 1, "{kind:?}: one hold: {fields:?}");
        assert_eq!(
            (holds[0].0.as_str(), holds[0].1.owner.as_str()),
            ("#C:1", "C"),
            "{kind:?}: granted to C, B's unheard grant undone: {fields:?}"
        );
        assert!(
            !fields.iter().any(|field| field.starts_with("#B:1")),
            "{kind:?}: nothing of B's grant is left: {fields:?}"
        );
        assert_eq!(ints(&exec[2])[0], 0, "{kind:?}: A is refused");
        assert_eq!(ints(&exec[3])[0], 0, "{kind:?}: D is refused");
        let claimed = ints(&exec[4]);
        assert_eq!(
            claimed[..2],
            [1, 1],
            "{kind:?}: C's try with its marker reports the hold, counted once"
        );
        assert_eq!(
            strings(&exec[5]),
            [member("#D:1", "D", &d), member("#A:4", "A", &a)],
            "{kind:?}: D, then A wait; B and C left the set"
        );
        assert_eq!(exec[6].as_str(), Some("1"), "{kind:?}: C holds once");

        let record = record(server.addr(), &mut messages, &listened).await;
        assert_eq!(
            record[&c].len(),
            1,
            "{kind:?}: one message to C: {record:?}"
        );
        let granted = grant_to(&record[&c][0], "#C:1");
        assert_eq!(granted.hold_count, 1, "{kind:?}");
        assert_eq!(granted.expiry_ms, holds[0].1.expiry_ms, "{kind:?}");
        for quiet in [&keys.channel, &a, &d, &t] {
            assert!(record[quiet].is_empty(), "{kind:?}: {record:?}");
        }
        if kind == Kind::FencedLock {
            let token = granted.token.expect("a fenced grant's token");
            assert_eq!(claimed.get(2), Some(&i64::try_from(token).unwrap()));
            assert!(
                i64::try_from(token).unwrap() > ints(&replies[0])[2],
                "{kind:?}: C's token is greater than A's"
            );
        }
    }
}

/// A waiting request whose client listens but never claims its grant (a subscriber on its
/// channel that is not a lockkit waiter) does not keep the lock from its former owner. The grant
/// starts on probation: it lasts `min(lease, GRANT_PROBATION)` unless confirmed; so a request
/// asking for a long lease is granted the probation, and one asking for less is granted its
/// lease, after which the owner's `lock()` gets the lock back.
#[tokio::test]
async fn a_grant_nobody_claims_does_not_keep_the_lock_from_its_owner() {
    use lockkit::protocol::keys::Namespace;
    use lockkit::protocol::lock::{HoldEntry, ACQUIRE, GRANT_PROBATION};
    use lockkit_testkit::send_commands;

    let server = lockkit_suite::spawned().await;
    let client = client(&server.url()).await;
    let raw = raw(&server.url()).await;
    let probation = u64::try_from(GRANT_PROBATION.as_millis()).unwrap();
    for (lease, granted_for) in [(30_000, probation), (200, 200)] {
        let name = unique("grant-nobody-claims");
        let keys = Namespace::default().lock(&name).unwrap();
        let lock = client.lock(&name);
        let guard = within(HANG, "lock", lock.lock()).await.unwrap();
        let channel = keys.client_channel("B");
        let (_listener, mut messages) = listen(&server.url(), &[&channel]).await;
        let lease_arg = lease.to_string();
        let replies = send_commands(
            server.addr(),
            &[eval(
                ACQUIRE.source(),
                &keys.keys,
                &["B", "#B:1", &lease_arg, "60000", &channel, "0"],
            )],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[0])[0], 0, "B waits");
        guard.unlock().await.unwrap();
        let message = within(HANG, "the grant", messages.recv()).await.unwrap();
        let granted = grant_to(&message.value.as_string().unwrap_or_default(), "#B:1");
        assert_eq!(
            granted.expiry_ms - granted.now_ms,
            granted_for,
            "a lease of {lease} ms is granted for {granted_for} ms: {granted:?}"
        );
        let value: Option<String> = raw.hget(&keys.key, "#B:1").await.unwrap();
        let hold = HoldEntry::parse("#B:1", value.as_deref().expect("B holds the lock"));
        assert_eq!(hold.map(|h| h.expiry_ms), Some(granted.expiry_ms));
        if lease > probation {
            // Not waiting out the probation here: give the grant back as a waiter that left.
            let member = format!("#B:1 {lease} B {channel}");
            let cancel_keys: Vec<String> = ["handoff", "waiting", "timeouts"].iter().fold(
                vec![keys.key.clone()],
                |mut all, suffix| {
                    all.push(keys.aux(suffix).unwrap().to_owned());
                    all
                },
            );
            let replies = send_commands(
                server.addr(),
                &[eval(
                    lockkit::protocol::lock::CANCEL.source(),
                    &cancel_keys,
                    &[&member, &keys.channel, "0"],
                )],
            )
            .await
            .unwrap();
            assert_eq!(ints(&replies[0]), [1], "B's grant given back");
            continue;
        }
        // B never claims: once its grant ends, the former owner gets the lock back.
        let guard = within(HANG, "lock after the unclaimed grant", lock.lock())
            .await
            .unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 1);
        let value: Option<String> = raw.hget(&keys.key, "#B:1").await.unwrap();
        assert_eq!(value, None, "B's grant ended");
        guard.unlock().await.unwrap();
    }
}
