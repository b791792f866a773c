//! Bad input gets a clear error: never a panic, a hang, or a hold left behind.

use std::time::Duration;

use fred::interfaces::KeysInterface;
use lockkit::{Client, Error, MAX_LEASE, MIN_LEASE};
use lockkit_suite::{client, lock_key, raw, redis, unique};

fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn zero_and_absurd_leases_are_rejected() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("lease"));
    assert!(invalid(lock.try_lock(Duration::ZERO, Some(Duration::ZERO)).await).contains("lease"));
    assert!(invalid(lock.lock_with_lease(Duration::MAX).await).contains("lease"));
    invalid(
        lock.try_lock(Duration::ZERO, Some(MAX_LEASE + Duration::from_secs(1)))
            .await,
    );
    assert!(!lock.is_locked().await.unwrap(), "nothing was taken");
}

#[tokio::test]
async fn a_huge_wait_means_no_bound_not_an_overflow() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let guard = client
        .lock(unique("wait"))
        .try_lock(Duration::MAX, None)
        .await
        .unwrap();
    assert!(guard.is_some());
}

#[tokio::test]
async fn empty_and_overlong_names_are_rejected() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    assert!(invalid(client.lock("").lock().await).contains("empty"));
    let long = "x".repeat(lockkit::protocol::keys::MAX_NAME_LEN + 1);
    invalid(client.lock(long).try_lock(Duration::ZERO, None).await);
    invalid(client.lock("").is_locked().await);
    invalid(client.lock("").force_unlock().await);
}

#[tokio::test]
async fn names_with_braces_and_binary_bytes_work() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let other = lockkit_suite::client(&redis.url()).await;
    for base in ["{", "}", "a{}b", "cart:{user42}", "nul\0byte", "ünïcødé 🔒"] {
        let name = format!("{base}{}", unique(""));
        let guard = client
            .lock(&name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        assert!(other
            .lock(&name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        guard.unlock().await.unwrap();
        assert!(!other.lock(&name).is_locked().await.unwrap(), "{name:?}");
    }
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_reported_not_clobbered() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("wrongtype");
    let store = raw(&redis.url()).await;
    let _: () = store
        .set(lock_key(&name), "not a lock", None, None, false)
        .await
        .unwrap();
    let lock = client.lock(&name);
    let err = lock.try_lock(Duration::ZERO, None).await.unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key, .. } if *key == lock_key(&name)),
        "{err:?}"
    );
    assert!(matches!(
        lock.hold_count().await,
        Err(Error::WrongType { .. })
    ));
    let value: String = store.get(lock_key(&name)).await.unwrap();
    assert_eq!(value, "not a lock", "the foreign value is untouched");
    assert_eq!(client.held_count(), 0);
}

#[tokio::test]
async fn bad_client_settings_are_rejected_before_connecting() {
    for builder in [
        Client::builder().watchdog_timeout(Duration::ZERO),
        Client::builder().watchdog_timeout(Duration::from_millis(10)),
        Client::builder().watchdog_timeout(Duration::MAX),
        Client::builder().command_timeout(Duration::ZERO),
        Client::builder().renew_batch_size(0),
        Client::builder().key_prefix(""),
        Client::builder().key_prefix("a{b}"),
        Client::builder().url("not a url"),
        Client::builder().url("http://127.0.0.1:6379"),
    ] {
        let shown = format!("{builder:?}");
        match builder.build().await {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("{shown}: expected InvalidArgument, got {other:?}"),
        }
    }
}

// === Every primitive ===
//
// The tests below go through the bad-input list of the reliability issue for every primitive at
// once: durations, names, foreign values, releasing what is gone, shutdown. Each checks the error
// and that nothing is left held (in Redis and in the client).

use std::collections::HashSet;

use lockkit::protocol::keys::{Kind as KeyKind, Namespace, MAX_NAME_LEN};
use lockkit::{ExpirablePermit, LockGuard, MultiLockGuard, SemaphorePermit};
use lockkit_suite::{client_with, spawned, until_waiting, within};
use lockkit_testkit::FaultProxy;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, FromValue};

const HANG: Duration = Duration::from_secs(60);

/// The primitives that hand out guards, as one enum so every test covers each of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Lock,
    Fenced,
    Fair,
    Read,
    Write,
    Spin,
    Multi,
    Semaphore,
    Expirable,
}

const KINDS: [Kind; 9] = [
    Kind::Lock,
    Kind::Fenced,
    Kind::Fair,
    Kind::Read,
    Kind::Write,
    Kind::Spin,
    Kind::Multi,
    Kind::Semaphore,
    Kind::Expirable,
];

/// A hold of any primitive.
#[derive(Debug)]
enum Held {
    Guard(LockGuard),
    Multi(MultiLockGuard),
    Permit(SemaphorePermit),
    Expirable(ExpirablePermit),
}

impl Held {
    async fn release(self) -> Result<(), Error> {
        match self {
            Held::Guard(guard) => guard.unlock().await,
            Held::Multi(guard) => guard.unlock().await,
            Held::Permit(permit) => permit.release().await,
            Held::Expirable(permit) => permit.release().await,
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Held::Guard(guard) => guard.is_lost(),
            Held::Multi(guard) => guard.is_lost(),
            Held::Permit(permit) => permit.is_lost(),
            Held::Expirable(permit) => permit.is_lost(),
        }
    }

    /// The hold count of a reentrant hold (1 for everything else).
    fn hold_count(&self) -> u32 {
        match self {
            Held::Guard(guard) => guard.hold_count(),
            _ => 1,
        }
    }
}

/// The second member of a kind's multi-lock (the first is the name under test).
fn multi_partner(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    format!("multi-partner:{:x}", hasher.finish())
}

/// Sets a semaphore's total to one permit (nothing to do for the other kinds).
async fn prepare(client: &Client, kind: Kind, name: &str) -> Result<(), Error> {
    match kind {
        Kind::Semaphore => client.semaphore(name).try_set_permits(1).await.map(drop),
        Kind::Expirable => client
            .permit_expirable_semaphore(name)
            .try_set_permits(1)
            .await
            .map(drop),
        _ => Ok(()),
    }
}

/// `try_*` of the kind: one hold (one permit), waiting at most `wait`. The permit-expirable
/// semaphore has no watchdog mode: `None` stands for a 30 s lease there.
async fn take(
    client: &Client,
    kind: Kind,
    name: &str,
    wait: Duration,
    lease: Option<Duration>,
) -> Result<Option<Held>, Error> {
    Ok(match kind {
        Kind::Lock => client
            .lock(name)
            .try_lock(wait, lease)
            .await?
            .map(Held::Guard),
        Kind::Fenced => client
            .fenced_lock(name)
            .try_lock(wait, lease)
            .await?
            .map(|guard| Held::Guard(guard.into())),
        Kind::Fair => client
            .fair_lock(name)
            .try_lock(wait, lease)
            .await?
            .map(Held::Guard),
        Kind::Read => client
            .read_write_lock(name)
            .try_read_lock(wait, lease)
            .await?
            .map(Held::Guard),
        Kind::Write => client
            .read_write_lock(name)
            .try_write_lock(wait, lease)
            .await?
            .map(Held::Guard),
        Kind::Spin => client
            .spin_lock(name)
            .try_lock(wait, lease)
            .await?
            .map(Held::Guard),
        Kind::Multi => client
            .multi_lock([client.lock(name), client.lock(multi_partner(name))])
            .try_lock(wait, lease)
            .await?
            .map(Held::Multi),
        Kind::Semaphore => client
            .semaphore(name)
            .try_acquire(1, wait, lease)
            .await?
            .map(Held::Permit),
        Kind::Expirable => client
            .permit_expirable_semaphore(name)
            .try_acquire(wait, lease.unwrap_or(Duration::from_secs(30)))
            .await?
            .map(Held::Expirable),
    })
}

/// The unbounded acquire of the kind with a fixed lease (`lock_with_lease` and its kin).
async fn take_with_lease(
    client: &Client,
    kind: Kind,
    name: &str,
    lease: Duration,
) -> Result<Held, Error> {
    Ok(match kind {
        Kind::Lock => Held::Guard(client.lock(name).lock_with_lease(lease).await?),
        Kind::Fenced => Held::Guard(
            client
                .fenced_lock(name)
                .lock_with_lease(lease)
                .await?
                .into(),
        ),
        Kind::Fair => Held::Guard(client.fair_lock(name).lock_with_lease(lease).await?),
        Kind::Read => Held::Guard(
            client
                .read_write_lock(name)
                .read_lock_with_lease(lease)
                .await?,
        ),
        Kind::Write => Held::Guard(
            client
                .read_write_lock(name)
                .write_lock_with_lease(lease)
                .await?,
        ),
        Kind::Spin => Held::Guard(client.spin_lock(name).lock_with_lease(lease).await?),
        Kind::Multi => Held::Multi(
            client
                .multi_lock([client.lock(name), client.lock(multi_partner(name))])
                .lock_with_lease(lease)
                .await?,
        ),
        Kind::Semaphore => Held::Permit(client.semaphore(name).acquire_with_lease(1, lease).await?),
        Kind::Expirable => Held::Expirable(
            client
                .permit_expirable_semaphore(name)
                .acquire(lease)
                .await?,
        ),
    })
}

/// Whether nobody holds the kind's object called `name` (asked through `observer`).
async fn is_free(observer: &Client, kind: Kind, name: &str) -> bool {
    match kind {
        Kind::Lock => !observer.lock(name).is_locked().await.unwrap(),
        Kind::Fenced => !observer.fenced_lock(name).is_locked().await.unwrap(),
        Kind::Fair => !observer.fair_lock(name).is_locked().await.unwrap(),
        Kind::Read | Kind::Write => !observer.read_write_lock(name).is_locked().await.unwrap(),
        Kind::Spin => !observer.spin_lock(name).is_locked().await.unwrap(),
        Kind::Multi => {
            !observer.lock(name).is_locked().await.unwrap()
                && !observer
                    .lock(multi_partner(name))
                    .is_locked()
                    .await
                    .unwrap()
        }
        Kind::Semaphore => observer.semaphore(name).available_permits().await.unwrap() == 1,
        Kind::Expirable => {
            observer
                .permit_expirable_semaphore(name)
                .available_permits()
                .await
                .unwrap()
                == 1
        }
    }
}

/// Every inspection and administration call of the kind, each mapped to `()`.
async fn inspect(
    client: &Client,
    kind: Kind,
    name: &str,
) -> Vec<(&'static str, Result<(), Error>)> {
    fn done<T>(result: Result<T, Error>) -> Result<(), Error> {
        result.map(drop)
    }
    match kind {
        Kind::Lock | Kind::Multi => {
            let lock = client.lock(name);
            vec![
                ("is_locked", done(lock.is_locked().await)),
                ("hold_count", done(lock.hold_count().await)),
                ("remaining_ttl", done(lock.remaining_ttl().await)),
                ("force_unlock", done(lock.force_unlock().await)),
            ]
        }
        Kind::Fenced => {
            let lock = client.fenced_lock(name);
            vec![
                ("is_locked", done(lock.is_locked().await)),
                ("hold_count", done(lock.hold_count().await)),
                ("remaining_ttl", done(lock.remaining_ttl().await)),
                ("force_unlock", done(lock.force_unlock().await)),
            ]
        }
        Kind::Fair => {
            let lock = client.fair_lock(name);
            vec![
                ("is_locked", done(lock.is_locked().await)),
                ("hold_count", done(lock.hold_count().await)),
                ("remaining_ttl", done(lock.remaining_ttl().await)),
                ("force_unlock", done(lock.force_unlock().await)),
            ]
        }
        Kind::Read | Kind::Write => {
            let lock = client.read_write_lock(name);
            vec![
                ("is_locked", done(lock.is_locked().await)),
                ("is_write_locked", done(lock.is_write_locked().await)),
                ("read_hold_count", done(lock.read_hold_count().await)),
                ("write_hold_count", done(lock.write_hold_count().await)),
                ("force_unlock", done(lock.force_unlock().await)),
            ]
        }
        Kind::Spin => {
            let lock = client.spin_lock(name);
            vec![
                ("is_locked", done(lock.is_locked().await)),
                ("remaining_ttl", done(lock.remaining_ttl().await)),
                ("force_unlock", done(lock.force_unlock().await)),
            ]
        }
        Kind::Semaphore => {
            let sem = client.semaphore(name);
            vec![
                ("try_set_permits", done(sem.try_set_permits(1).await)),
                ("add_permits", done(sem.add_permits(1).await)),
                ("available_permits", done(sem.available_permits().await)),
            ]
        }
        Kind::Expirable => {
            let sem = client.permit_expirable_semaphore(name);
            vec![
                ("try_set_permits", done(sem.try_set_permits(1).await)),
                ("add_permits", done(sem.add_permits(1).await)),
                ("available_permits", done(sem.available_permits().await)),
            ]
        }
    }
}

/// The main Redis key of the kind's object called `name` (default prefix).
fn main_key(kind: Kind, name: &str) -> String {
    let kind = match kind {
        Kind::Lock | Kind::Multi => KeyKind::Lock,
        Kind::Fenced => KeyKind::FencedLock,
        Kind::Fair => KeyKind::FairLock,
        Kind::Read | Kind::Write => KeyKind::ReadWriteLock,
        Kind::Spin => KeyKind::SpinLock,
        Kind::Semaphore => KeyKind::Semaphore,
        Kind::Expirable => KeyKind::PermitExpirableSemaphore,
    };
    Namespace::default().object(kind, name).unwrap().key
}

/// A raw command, for what the suite's fred features leave out.
async fn command<R: FromValue>(raw: &fred::clients::Client, cmd: &'static str, args: &[&str]) -> R {
    let owned: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    raw.custom(
        CustomCommand::new_static(cmd, ClusterHash::FirstKey, false),
        owned,
    )
    .await
    .unwrap_or_else(|err| panic!("{cmd} {args:?}: {err}"))
}

fn lease_error(what: String, result: Result<impl std::fmt::Debug, Error>) {
    match result {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("lease"), "{what}: {msg}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn every_primitive_rejects_zero_and_overflowing_leases_before_taking_anything() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let bad_leases = [
        Duration::ZERO,
        // Below the 1 ms floor (`MIN_LEASE`): gone before the call returned.
        Duration::from_nanos(1),
        MIN_LEASE - Duration::from_nanos(1),
        MAX_LEASE + Duration::from_millis(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ];
    for kind in KINDS {
        let name = unique(&format!("bad-lease-{kind:?}"));
        prepare(&client, kind, &name).await.unwrap();
        for lease in bad_leases {
            for wait in [Duration::ZERO, Duration::from_secs(5), Duration::MAX] {
                let what = format!("{kind:?} try(wait {wait:?}, lease {lease:?})");
                let attempt = take(&client, kind, &name, wait, Some(lease));
                lease_error(what.clone(), within(HANG, &what, attempt).await);
            }
            let what = format!("{kind:?} with lease {lease:?}, no wait bound");
            let attempt = take_with_lease(&client, kind, &name, lease);
            lease_error(what.clone(), within(HANG, &what, attempt).await);
        }
        assert!(is_free(&client, kind, &name).await, "{kind:?}");
    }
    assert_eq!(client.held_count(), 0);
    assert_eq!(client.waiting_count(), 0);

    // The other durations of the API.
    let slots = client.permit_expirable_semaphore(unique("update-lease"));
    slots.try_set_permits(1).await.unwrap();
    let id = slots
        .acquire(Duration::from_secs(30))
        .await
        .unwrap()
        .into_id();
    for lease in bad_leases {
        let what = format!("update_lease({lease:?})");
        lease_error(what, slots.update_lease(&id, lease).await);
    }
    slots.release(&id).await.unwrap();
    for timeout in [Duration::ZERO, Duration::from_secs(u64::MAX), Duration::MAX] {
        let fair = client.fair_lock(unique("waiter-timeout"));
        assert!(
            matches!(
                fair.with_waiter_timeout(timeout),
                Err(Error::InvalidArgument(_))
            ),
            "waiter timeout {timeout:?}"
        );
    }
}

#[tokio::test]
async fn every_primitive_takes_a_huge_wait_as_no_bound_and_the_longest_lease_as_is() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    for kind in KINDS {
        let name = unique(&format!("huge-{kind:?}"));
        prepare(&client, kind, &name).await.unwrap();
        for wait in [Duration::MAX, Duration::from_secs(u64::MAX)] {
            for lease in [None, Some(MAX_LEASE)] {
                let what = format!("{kind:?} try(wait {wait:?}, lease {lease:?})");
                let held = within(HANG, &what, take(&client, kind, &name, wait, lease))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: not acquired"));
                held.release().await.unwrap();
            }
        }
        assert!(is_free(&client, kind, &name).await, "{kind:?}");
    }
    let latch = client.count_down_latch(unique("huge-latch"));
    assert!(within(
        HANG,
        "wait(MAX) on an open latch",
        latch.wait(Duration::MAX)
    )
    .await
    .unwrap());
    assert_eq!(client.held_count(), 0);
}

#[tokio::test]
async fn every_primitive_rejects_empty_and_overlong_names_and_takes_one_at_the_limit() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let too_long = "x".repeat(MAX_NAME_LEN + 1);
    for kind in KINDS {
        for name in ["", too_long.as_str()] {
            let shown = &name[..name.len().min(8)];
            let what = format!("{kind:?} {shown:?}…");
            if matches!(kind, Kind::Semaphore | Kind::Expirable) {
                invalid(prepare(&client, kind, name).await);
            }
            invalid(within(HANG, &what, take(&client, kind, name, Duration::MAX, None)).await);
            let attempt = take_with_lease(&client, kind, name, Duration::from_secs(1));
            invalid(within(HANG, &what, attempt).await);
            for (call, result) in inspect(&client, kind, name).await {
                match result {
                    Err(Error::InvalidArgument(_)) => {}
                    other => panic!("{what} {call}: expected InvalidArgument, got {other:?}"),
                }
            }
        }
        // Exactly the limit is a name like any other.
        let seed = format!("{kind:?}{}", unique(""));
        let at_limit: String = seed.chars().cycle().take(MAX_NAME_LEN).collect();
        prepare(&client, kind, &at_limit).await.unwrap();
        let held = take(&client, kind, &at_limit, Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        held.release().await.unwrap();
    }
    let latch = client.count_down_latch("");
    invalid(latch.try_set_count(1).await);
    invalid(latch.count_down().await);
    invalid(latch.count().await);
    invalid(latch.wait(Duration::MAX).await);
    invalid(client.count_down_latch(too_long).wait(Duration::ZERO).await);
    assert_eq!(client.held_count(), 0);
    assert_eq!(client.waiting_count(), 0);
}

/// Names with braces (some shaped like other names' keys), control bytes and Unicode: each is an
/// object of its own, distinct from every other name of the list.
#[tokio::test]
async fn brace_and_binary_names_are_objects_of_their_own_for_every_primitive() {
    let redis = redis().await;
    let one = client(&redis.url()).await;
    let two = lockkit_suite::client(&redis.url()).await;
    let run = unique("");
    let bases = [
        "a",
        "{a}",
        "}x",
        "{_x}}x",
        "{",
        "}",
        "{}",
        "}{",
        "{{}}",
        "a{}b",
        "cart:{user42}",
        "{user42}:cart",
        "nul\0byte",
        "\r\n\t",
        "\u{1b}[31m",
        "ünïcødé 🔒",
        "*?[]",
    ];
    // The run's suffix goes in front, so the shapes at the end of each name stay as they are.
    let names: Vec<String> = bases.iter().map(|base| format!("{run}{base}")).collect();
    let unprefixed: Vec<&str> = bases.to_vec();
    for kind in KINDS {
        let mut held = Vec::new();
        // One client takes every name: a collision would show as a re-entry (hold count 2) or a
        // refusal.
        for name in names
            .iter()
            .map(String::as_str)
            .chain(unprefixed.iter().copied())
        {
            prepare(&one, kind, name).await.unwrap();
            let hold = take(&one, kind, name, Duration::ZERO, None)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{kind:?} {name:?} collided with another name"));
            assert_eq!(hold.hold_count(), 1, "{kind:?} {name:?} collided");
            held.push((name, hold));
        }
        // The other client is shut out of each (readers share, so ask for the write lock).
        let exclusive = if kind == Kind::Read {
            Kind::Write
        } else {
            kind
        };
        for (name, _) in &held {
            let other = take(&two, exclusive, name, Duration::ZERO, None).await;
            assert!(other.unwrap().is_none(), "{kind:?} {name:?} is held");
        }
        for (name, hold) in held {
            hold.release().await.unwrap();
            assert!(is_free(&two, kind, name).await, "{kind:?} {name:?}");
        }
    }
    // SCAN, not KEYS: managed services (and the suite's imitation of one) refuse KEYS.
    let raw = raw(&redis.url()).await;
    let (mut cursor, mut keys) = ("0".to_owned(), Vec::<String>::new());
    loop {
        let (next, batch): (String, Vec<String>) =
            command(&raw, "SCAN", &[&cursor, "COUNT", "1000"]).await;
        keys.extend(batch);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    let distinct: HashSet<&String> = keys.iter().collect();
    assert_eq!(distinct.len(), keys.len());
}

#[tokio::test]
async fn a_foreign_value_at_each_primitives_key_is_reported_and_left_alone() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let store = raw(&redis.url()).await;
    for kind in KINDS {
        let name = unique(&format!("foreign-{kind:?}"));
        let key = main_key(kind, &name);
        // Something of another type than the kind keeps there: a list.
        let _: i64 = command(&store, "RPUSH", &[&key, "not lockkit's"]).await;
        let what = format!("{kind:?}");
        let attempt = async {
            prepare(&client, kind, &name).await?;
            take(&client, kind, &name, Duration::from_secs(5), None).await
        };
        match within(HANG, &what, attempt).await {
            Err(Error::WrongType { key: reported, .. }) => assert_eq!(reported, key, "{what}"),
            other => panic!("{what}: expected WrongType, got {other:?}"),
        }
        for (call, result) in inspect(&client, kind, &name).await {
            match result {
                Err(Error::WrongType { .. }) => {}
                // Existence and TTL do not depend on the type: something is there.
                Ok(()) if ["is_locked", "remaining_ttl"].contains(&call) => {}
                // Deleting whatever is there is what force_unlock is for.
                Ok(()) if call == "force_unlock" => {
                    let _: i64 = command(&store, "RPUSH", &[&key, "not lockkit's"]).await;
                }
                other => panic!("{what} {call}: expected WrongType, got {other:?}"),
            }
        }
        let kept: Vec<String> = command(&store, "LRANGE", &[&key, "0", "-1"]).await;
        assert_eq!(kept, vec!["not lockkit's".to_owned()], "{what}: untouched");
    }
    let latch = client.count_down_latch(unique("foreign-latch"));
    let key = Namespace::default()
        .object(KeyKind::CountDownLatch, latch.name())
        .unwrap()
        .key;
    // A list (another type), then a string that is no count.
    let _: i64 = command(&store, "RPUSH", &[&key, "not lockkit's"]).await;
    for foreign in 0..2 {
        if foreign == 1 {
            let _: () = store
                .set(&key, "not a count", None, None, false)
                .await
                .unwrap();
        }
        for result in [
            latch.try_set_count(1).await.map(drop),
            latch.count_down().await.map(drop),
            latch.count().await.map(drop),
            within(HANG, "latch wait", latch.wait(Duration::from_secs(5)))
                .await
                .map(drop),
        ] {
            assert!(
                matches!(&result, Err(Error::WrongType { key: k, .. }) if *k == key),
                "{foreign}: {result:?}"
            );
        }
    }
    let kept: String = store.get(&key).await.unwrap();
    assert_eq!(kept, "not a count", "untouched");
    assert_eq!(client.held_count(), 0);
    assert_eq!(client.waiting_count(), 0);
}

/// The guard API consumes the guard, so a hold cannot be released twice; the nearest real case
/// is releasing a hold that an administrator took away and someone else took since.
#[tokio::test]
async fn releasing_a_hold_that_was_force_unlocked_and_taken_again_is_not_held() {
    let redis = redis().await;
    let first = client(&redis.url()).await;
    let second = lockkit_suite::client(&redis.url()).await;
    for kind in [
        Kind::Lock,
        Kind::Fenced,
        Kind::Fair,
        Kind::Write,
        Kind::Spin,
    ] {
        let name = unique(&format!("twice-{kind:?}"));
        let stale = take(&first, kind, &name, Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        let forced = match kind {
            Kind::Lock => first.lock(&name).force_unlock().await,
            Kind::Fenced => first.fenced_lock(&name).force_unlock().await,
            Kind::Fair => first.fair_lock(&name).force_unlock().await,
            Kind::Write => first.read_write_lock(&name).force_unlock().await,
            Kind::Spin => first.spin_lock(&name).force_unlock().await,
            _ => unreachable!(),
        };
        assert!(forced.unwrap(), "{kind:?}");
        let current = take(&second, kind, &name, Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        match stale.release().await {
            Err(Error::NotHeld { name: reported }) => assert_eq!(reported, name),
            other => panic!("{kind:?}: expected NotHeld, got {other:?}"),
        }
        assert!(!current.is_lost(), "{kind:?}");
        assert!(!is_free(&first, kind, &name).await, "{kind:?}: still held");
        let intruder = take(&first, kind, &name, Duration::ZERO, None).await;
        assert!(intruder.unwrap().is_none(), "{kind:?}: not handed back");
        current.release().await.unwrap();
        assert!(is_free(&first, kind, &name).await, "{kind:?}");
    }
    // A permit released by id, then by id again, then by its guard.
    let slots = first.permit_expirable_semaphore(unique("twice-permit"));
    slots.try_set_permits(1).await.unwrap();
    let permit = slots.acquire(Duration::from_secs(30)).await.unwrap();
    let id = permit.id().to_owned();
    slots.release(&id).await.unwrap();
    assert!(matches!(
        slots.release(&id).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(slots.available_permits().await.unwrap(), 1);
}

#[tokio::test]
async fn unlocking_after_shutdown_is_refused_and_shutdown_left_nothing_held() {
    let redis = redis().await;
    let observer = client(&redis.url()).await;
    let doomed = lockkit_suite::client(&redis.url()).await;
    let mut held = Vec::new();
    for kind in KINDS {
        let name = unique(&format!("after-shutdown-{kind:?}"));
        prepare(&doomed, kind, &name).await.unwrap();
        let hold = take(&doomed, kind, &name, Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        held.push((kind, name, hold));
    }
    doomed.shutdown().await.unwrap();
    for (kind, name, hold) in held {
        assert!(
            is_free(&observer, kind, &name).await,
            "{kind:?}: released by shutdown"
        );
        assert!(hold.is_lost(), "{kind:?}");
        match hold.release().await {
            Err(Error::Shutdown) => {}
            other => panic!("{kind:?}: expected Shutdown, got {other:?}"),
        }
        let again = take(&doomed, kind, &name, Duration::ZERO, None).await;
        assert!(matches!(again, Err(Error::Shutdown)), "{kind:?}: {again:?}");
    }
    assert_eq!(doomed.held_count(), 0);
}

#[tokio::test]
async fn shutdown_ends_every_kind_of_wait_with_an_error_and_leaves_nothing_behind() {
    let redis = redis().await;
    let holder = client(&redis.url()).await;
    let waiter = lockkit_suite::client(&redis.url()).await;
    let mut blocking = Vec::new();
    let mut tasks = Vec::new();
    let mut registered = 0;
    for kind in KINDS {
        let name = unique(&format!("shutdown-wait-{kind:?}"));
        prepare(&holder, kind, &name).await.unwrap();
        // Readers wait for a writer; everything else for a holder of its own kind.
        let blocker = if kind == Kind::Read {
            Kind::Write
        } else {
            kind
        };
        let hold = take(&holder, blocker, &name, Duration::ZERO, None)
            .await
            .unwrap()
            .unwrap();
        blocking.push((kind, name.clone(), hold));
        let client = waiter.clone();
        tasks.push((
            kind,
            tokio::spawn(async move { take(&client, kind, &name, Duration::MAX, None).await }),
        ));
        // The spin lock polls instead of registering as a waiter.
        if kind != Kind::Spin {
            registered += 1;
            until_waiting(&waiter, registered).await;
        }
    }
    let latch = holder.count_down_latch(unique("shutdown-wait-latch"));
    latch.try_set_count(1).await.unwrap();
    let waiting_latch = waiter.count_down_latch(latch.name());
    let latch_task = tokio::spawn(async move { waiting_latch.wait(Duration::MAX).await });
    until_waiting(&waiter, registered + 1).await;

    waiter.shutdown().await.unwrap();
    for (kind, task) in tasks {
        match within(HANG, &format!("{kind:?} waiter"), task)
            .await
            .unwrap()
        {
            Err(Error::Shutdown) => {}
            other => panic!("{kind:?}: expected Shutdown, got {other:?}"),
        }
    }
    let latch_result = within(HANG, "latch waiter", latch_task).await.unwrap();
    assert!(
        matches!(latch_result, Err(Error::Shutdown)),
        "{latch_result:?}"
    );
    assert_eq!(waiter.waiting_count(), 0);

    // Nothing of the waiter is left: each object frees once its holder lets go.
    for (kind, name, hold) in blocking {
        hold.release().await.unwrap();
        assert!(is_free(&holder, kind, &name).await, "{kind:?}");
    }
    assert_eq!(latch.count().await.unwrap(), 1);
}

#[tokio::test]
async fn an_unreachable_server_fails_connects_waits_and_unlocks_clearly_and_holds_nothing() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let builder = || {
        Client::builder()
            .url(proxy.url())
            .watchdog_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500))
    };
    let cut_off = builder().build().await.unwrap();
    let direct = client_with(&server.url(), Duration::from_millis(300)).await;
    let (held, waited) = (unique("unreachable-held"), unique("unreachable-waited"));
    let guard = cut_off.lock(&held).lock().await.unwrap();
    let _blocker = direct.lock(&waited).lock().await.unwrap();
    let lock = cut_off.lock(&waited);
    let waiting = tokio::spawn(async move { lock.lock().await });
    until_waiting(&cut_off, 1).await;

    proxy.block();
    // Connecting now fails within the connect timeout.
    let connect = within(HANG, "connect while unreachable", builder().build()).await;
    match connect {
        // The blocking proxy accepts the TCP connection and closes it at once.
        Err(
            err @ Error::Connect {
                reason: lockkit::ConnectFailure::Handshake,
                ..
            },
        ) => assert!(err.to_string().starts_with("cannot connect to "), "{err}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
    // A waiting acquire ends with an error instead of waiting on.
    let wait = within(HANG, "a wait while unreachable", waiting)
        .await
        .unwrap();
    assert!(matches!(wait, Err(Error::Redis(_))), "{wait:?}");
    // So does an unlock; the hold is no longer renewed and runs out its lease. (`NotHeld`, at
    // once, when the 300 ms lease has already run out by the guard's clock.)
    let unlock = within(HANG, "unlock while unreachable", guard.unlock()).await;
    assert!(
        matches!(unlock, Err(Error::Redis(_) | Error::NotHeld { .. })),
        "{unlock:?}"
    );
    assert_eq!(cut_off.held_count(), 0);
    assert_eq!(cut_off.waiting_count(), 0);
    proxy.unblock();
    within(HANG, "the abandoned hold to run out its lease", async {
        while direct.lock(&held).is_locked().await.unwrap() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The same client works again once it has reconnected (commands sent before that time out).
    // A fixed lease longer than the reconnection: a 300 ms watchdog lease may have run out, by
    // the guard's conservative clock, before the reply of an acquire sent during the reconnect.
    let again = within(HANG, "lock after the outage", async {
        loop {
            match cut_off
                .lock(&held)
                .lock_with_lease(Duration::from_secs(10))
                .await
            {
                Ok(guard) => break guard,
                Err(Error::Redis(err)) if err.is_ambiguous() => continue,
                Err(err) => panic!("after the outage: {err}"),
            }
        }
    })
    .await;
    again.unlock().await.unwrap();
}

/// A lease under the floor is refused with a message that names the floor, for the leases of
/// locks, permits and `once_per` windows alike; the window's message names the window.
#[tokio::test]
async fn a_lease_or_window_below_the_floor_is_refused_naming_the_floor() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("nanosecond"));
    let why = invalid(lock.lock_with_lease(Duration::from_nanos(1)).await);
    assert!(
        why.starts_with("lease 1ns is shorter than the minimum of 1ms"),
        "{why}"
    );
    assert!(!lock.is_locked().await.unwrap(), "nothing was taken");
    let slots = client.permit_expirable_semaphore(unique("nanosecond-permit"));
    slots.try_set_permits(1).await.unwrap();
    let why = invalid(slots.acquire(Duration::from_nanos(1)).await);
    assert!(why.contains("minimum of 1ms"), "{why}");
    for window in [Duration::ZERO, Duration::from_nanos(1)] {
        let name = unique("zero-window");
        let outcome = client
            .once_per(name, window, || async { panic!("must not run") })
            .await;
        let why = invalid(outcome);
        assert!(why.starts_with("once_per window "), "{window:?}: {why}");
        assert!(why.contains("minimum of 1ms"), "{window:?}: {why}");
        assert!(
            !why.contains("lease"),
            "{window:?}: the window is no lease: {why}"
        );
    }
}

/// Releasing a permit by its id when it is gone says the hold is gone, without speaking of a
/// guard (there is none on that path).
#[tokio::test]
async fn releasing_a_gone_permit_by_id_speaks_of_no_guard() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("released-twice");
    let slots = client.permit_expirable_semaphore(&name);
    slots.try_set_permits(1).await.unwrap();
    let id = slots
        .acquire(Duration::from_secs(30))
        .await
        .unwrap()
        .into_id();
    slots.release(&id).await.unwrap();
    match slots.release(&id).await {
        Err(err @ Error::NotHeld { .. }) => {
            let shown = err.to_string();
            assert!(!shown.contains("guard"), "{shown}");
            assert!(
                shown.starts_with(&format!("the hold of `{name}` is gone")),
                "{shown}"
            );
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
}
